//! Starting a process in a sandbox ([`Launcher`]): bubblewrap's command, and what it inherits.
//!
//! bubblewrap starts with an empty environment and four descriptors, nothing else reaches it:
//! - its options, in a memory file (`--args`), so no relay path shows on the sandbox's init's command line;
//! - the session's workspace, opened beneath the workspace root without following any symlink (`openat2`
//!   with `RESOLVE_NO_SYMLINKS`) and mounted from that descriptor: a directory swapped for a symlink after it
//!   was checked cannot turn the mount into another directory;
//! - the relay's binary (the helper), opened at start;
//! - the tenant's user namespace (relays that are not root);
//! - the agent's environment, in a memory file the helper reads only once it has confined itself: a
//!   `LD_PRELOAD` or the like never reaches bubblewrap or the helper's own start.
//!
//! Each is inherited by this child alone (its close-on-exec flag is cleared between fork and exec).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use crate::layout::{Descriptors, Privilege, SandboxSpec, HOME_IN_SANDBOX};
use crate::network::{ForwardedResolver, SandboxNetwork};
use crate::policy::Egress;
use crate::Sandbox;

/// A sandbox's command, ready to be adjusted (stdio, …) and started with [`Launcher::spawn`]; with port egress
/// it also holds what connects its network before anything runs in it ([`crate::network`]).
#[derive(Debug)]
pub struct SandboxCommand {
    command: tokio::process::Command,
    network: Option<SandboxNetwork>,
}

impl std::ops::Deref for SandboxCommand {
    type Target = tokio::process::Command;
    fn deref(&self) -> &Self::Target {
        &self.command
    }
}

impl std::ops::DerefMut for SandboxCommand {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.command
    }
}

/// How agent processes are started.
#[derive(Debug, Clone)]
pub enum Launcher {
    /// In a sandbox each (the default).
    Sandboxed(Arc<Sandbox>),
    /// As plain child processes of the relay, with only their environment and directory set
    /// (`--unsafe-no-sandbox`: the operator isolates the relay as a whole).
    Unconfined,
}

impl Launcher {
    /// The command that runs `program args` as `spec` says, with exactly `env` (plus `HOME` and `TMPDIR`, its
    /// private ones, and `PWD`), in its own process group, its stdio piped. Start it with [`Launcher::spawn`]. Fails
    /// when the workspace cannot be opened safely (e.g. a symlink on its path).
    pub async fn command(
        &self,
        spec: &SandboxSpec,
        program: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
    ) -> std::io::Result<SandboxCommand> {
        let mut command = match self {
            Launcher::Sandboxed(sandbox) => {
                let run: Vec<OsString> = ["--", program]
                    .into_iter()
                    .map(OsString::from)
                    .chain(args.iter().map(OsString::from))
                    .collect();
                let mut environment = env.clone();
                environment.insert("HOME".into(), HOME_IN_SANDBOX.into());
                environment.insert("TMPDIR".into(), "/tmp".into());
                // bubblewrap would say where it changed to; the environment is set after it, so say it here.
                if let Some(cwd) = spec.cwd.to_str() {
                    environment.insert("PWD".into(), cwd.into());
                }
                bwrap_command(sandbox, spec, &run, Some(&environment)).await?
            }
            Launcher::Unconfined => {
                tracing::warn!(
                    program,
                    "starting an agent process WITHOUT a sandbox (--unsafe-no-sandbox)"
                );
                let mut command = tokio::process::Command::new(program);
                command
                    .args(args)
                    .env_clear()
                    .envs(env)
                    .env("HOME", &spec.home)
                    .env("TMPDIR", &spec.tmp)
                    .current_dir(&spec.cwd);
                SandboxCommand {
                    command,
                    network: None,
                }
            }
        };
        if let Some(procs) = spec
            .cgroup
            .as_ref()
            .and_then(|procs| std::ffi::CString::new(procs.as_os_str().as_encoded_bytes()).ok())
        {
            // SAFETY: join_in_child only opens, writes and closes (async-signal-safe). Best effort: a cgroup
            // that cannot be joined leaves the process to its rlimits.
            unsafe {
                command.pre_exec(move || {
                    let _ = crate::cgroups::join_in_child(&procs);
                    Ok(())
                });
            }
        }
        command
            .process_group(0)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        Ok(command)
    }

    /// Start a command from [`Launcher::command`] (from the one thread sandboxes are started from); with port
    /// egress, connect its network before it goes on (a sandbox whose network fails is killed).
    pub async fn spawn(command: SandboxCommand) -> std::io::Result<tokio::process::Child> {
        let SandboxCommand { command, network } = command;
        let mut child = crate::spawner::spawn(command).await?;
        if let Some(network) = network {
            let pid = child.id().unwrap_or_default();
            let connected = tokio::time::timeout(crate::network::SETUP_TIMEOUT, network.connect(pid))
                .await
                .unwrap_or_else(|_| {
                    Err(crate::network::NetworkError::Pasta(format!(
                        "no network within {:?}",
                        crate::network::SETUP_TIMEOUT
                    )))
                });
            if let Err(error) = connected {
                let _ = child.start_kill();
                let _ = child.wait().await;
                // What bubblewrap said, if it failed first (its stderr is the sandbox's).
                let mut said = String::new();
                if let Some(stderr) = child.stderr.take() {
                    use tokio::io::AsyncReadExt;
                    let mut stderr = stderr.take(4096);
                    let read = stderr.read_to_string(&mut said);
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), read).await;
                }
                return Err(std::io::Error::other(format!("{error} {}", said.trim())));
            }
        }
        Ok(child)
    }

    /// Whether sandboxes switch to per-tenant users (the relay runs as root and sandboxes).
    pub fn per_tenant_users(&self) -> bool {
        matches!(self, Launcher::Sandboxed(sandbox) if sandbox.layout.privilege == Privilege::Root)
    }
}

/// bubblewrap's command for `spec`, doing `run` inside; `environment` is the agent's (none for a probe).
pub(crate) async fn bwrap_command(
    sandbox: &Sandbox,
    spec: &SandboxSpec,
    run: &[OsString],
    environment: Option<&BTreeMap<String, String>>,
) -> std::io::Result<SandboxCommand> {
    let mut inherited: Vec<Arc<OwnedFd>> = Vec::new();
    let mut keep = |fd: Arc<OwnedFd>| {
        let raw = fd.as_raw_fd();
        inherited.push(fd);
        raw
    };
    let workspace = keep(Arc::new(open_beneath(&spec.anchor, &spec.workspace)?));
    let helper = keep(Arc::new(sandbox.helper.try_clone()?));
    let user_namespace = match sandbox.layout.privilege {
        Privilege::Unprivileged => Some(keep(sandbox.namespaces.of(&spec.tenant).await?)),
        Privilege::Root => None,
    };
    let environment = match environment {
        Some(environment) => {
            let entries: Vec<OsString> = environment
                .iter()
                .map(|(name, value)| OsString::from(format!("{name}={value}")))
                .collect();
            Some(keep(Arc::new(OwnedFd::from(memory_file(
                c"ahp-relay-agent-env",
                &nul_separated(&entries),
            )?))))
        }
        None => None,
    };
    // Port egress: a network namespace of its own, connected by pasta once bubblewrap made it.
    let pasta = sandbox
        .pasta
        .clone()
        .filter(|_| matches!(spec.egress, Egress::Ports(_)));
    let (network, network_fds, resolver) = if let Some(pasta) = pasta {
        let tenant_namespace = match sandbox.layout.privilege {
            Privilege::Unprivileged => Some(sandbox.namespaces.of(&spec.tenant).await?),
            Privilege::Root => None,
        };
        let resolver = ForwardedResolver::of(std::path::Path::new("/etc/resolv.conf"));
        let (network, ends) = SandboxNetwork::pipes(
            pasta,
            tenant_namespace,
            spec.loopback_ports.clone(),
            resolver.is_some(),
        )?;
        let fds = (keep(Arc::new(ends.info)), keep(Arc::new(ends.block)));
        let resolver = match resolver {
            Some(resolver) => {
                let file = memory_file(c"ahp-relay-resolv-conf", resolver.text.as_bytes())?;
                Some((keep(Arc::new(OwnedFd::from(file))), resolver.mount_at))
            }
            None => None,
        };
        (Some(network), Some(fds), resolver)
    } else {
        (None, None, None)
    };
    let descriptors = Descriptors {
        workspace: Some(workspace),
        helper: Some(helper),
        user_namespace,
        environment,
        network: network_fds,
        resolver,
    };
    let args = sandbox.layout.bwrap_args(spec, &descriptors, run);
    // bubblewrap takes options from the file; what it runs (`-- HELPER …`) stays on its command line.
    let split = args
        .windows(2)
        .position(|pair| pair[0] == "--" && pair[1] == crate::layout::HELPER_IN_SANDBOX)
        .unwrap_or(args.len());
    let (options, rest) = args.split_at(split);
    let options_fd = keep(Arc::new(OwnedFd::from(memory_file(
        c"ahp-relay-bwrap-args",
        &nul_separated(options),
    )?)));
    let mut command = tokio::process::Command::new(&sandbox.bwrap);
    command
        .arg("--args")
        .arg(options_fd.to_string())
        .args(rest)
        .env_clear();
    let raw: Vec<i32> = inherited.iter().map(|fd| fd.as_raw_fd()).collect();
    // SAFETY: the closure only calls fcntl(2) (async-signal-safe); the descriptors stay open, owned by the
    // closure, until the command is spawned and dropped.
    unsafe {
        command.pre_exec(move || {
            let _owned = &inherited;
            for fd in &raw {
                if libc::fcntl(*fd, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(SandboxCommand { command, network })
}

/// `path` opened (as a directory, `O_PATH`) beneath `anchor` without following any symlink on the way, nor
/// `..` out of it.
pub fn open_beneath(anchor: &std::path::Path, path: &std::path::Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let relative = path.strip_prefix(anchor).map_err(|_| {
        std::io::Error::other(format!("{} is not beneath {}", path.display(), anchor.display()))
    })?;
    let root = rustix::fs::open(
        anchor,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if relative.as_os_str().is_empty() {
        return Ok(root);
    }
    let fd = rustix::fs::openat2(
        &root,
        relative,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|errno| {
        std::io::Error::other(format!(
            "{} cannot be opened without following a symlink: {errno}",
            path.display()
        ))
    })?;
    Ok(fd)
}

/// A memory file holding `bytes`, read from its start.
fn memory_file(name: &std::ffi::CStr, bytes: &[u8]) -> std::io::Result<std::fs::File> {
    use std::io::{Seek, Write};
    use std::os::fd::FromRawFd;
    // SAFETY: memfd_create takes a NUL-terminated name and flags; the descriptor it returns is ours.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(bytes)?;
    file.rewind()?;
    Ok(file)
}

/// `entries`, each ended by a NUL byte (bubblewrap's `--args`, the helper's environment).
fn nul_separated(entries: &[OsString]) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut bytes = Vec::new();
    for entry in entries {
        bytes.extend_from_slice(entry.as_bytes());
        bytes.push(0);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_is_opened_beneath_its_root_and_never_through_a_symlink() {
        let root = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("acme/default/s1")).expect("mkdir");
        assert!(open_beneath(root.path(), &root.path().join("acme/default/s1")).is_ok());
        // The session's directory swapped for a symlink (by another session of the tenant, say).
        std::fs::create_dir_all(root.path().join("acme/default/moved")).expect("mkdir");
        std::os::unix::fs::symlink(outside.path(), root.path().join("acme/default/s2")).expect("symlink");
        assert!(open_beneath(root.path(), &root.path().join("acme/default/s2")).is_err());
        // A symlinked ancestor too.
        std::os::unix::fs::symlink(outside.path(), root.path().join("globex")).expect("symlink");
        std::fs::create_dir_all(outside.path().join("x")).expect("mkdir");
        assert!(open_beneath(root.path(), &root.path().join("globex/x")).is_err());
        assert!(
            open_beneath(root.path(), outside.path()).is_err(),
            "not beneath the root"
        );
    }
}
