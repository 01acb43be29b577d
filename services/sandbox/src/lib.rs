//! The sandbox every agent process runs in, and everything it starts (its tools, and the commands it runs
//! through the relay's terminals). Agents are untrusted code: a prompt, or a file an agent reads, can make it
//! run anything.
//!
//! Built from well-kept parts, in two layers:
//! - **bubblewrap** (`bwrap`, Debian's `bubblewrap`) makes the namespaces: a PID namespace (the sandbox sees and
//!   signals only its own processes, and dies with the relay: `--die-with-parent`), a mount namespace showing
//!   only the system read-only and the session's own workspace, home and `/tmp` ([`layout`]), IPC and UTS
//!   namespaces, a network namespace when the agent has no egress, and a user namespace when the relay is
//!   not root;
//! - inside, `ahp-relay sandbox-exec` ([`exec`]) confines the process itself before it runs the agent
//!   ([`confine`]): the tenant's own user when the relay runs as root ([`users`]), rlimits, niceness,
//!   **Landlock** (filesystem rules, TCP ports, signal and socket scoping) and a **seccomp** filter ([`seccomp`]).
//!
//! Where the relay was given a cgroup v2 subtree, each tenant and each session also get a cgroup with memory,
//! CPU and process limits ([`cgroups`]); elsewhere rlimits bound each process.
//!
//! [`Launcher`] is what the runner uses: it probes once whether this machine can sandbox ([`Sandbox::probe`]),
//! and then builds each sandbox's command. Without a working sandbox the relay refuses to run agents unless
//! the operator chose [`Launcher::Unconfined`] (`--unsafe-no-sandbox`), which is logged at every start.

pub mod cgroups;
pub mod confine;
pub mod exec;
pub mod layout;
pub mod policy;
pub mod seccomp;
pub mod spawner;
pub mod users;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use confine::Enforced;
pub use layout::{Layout, Privilege, SandboxSpec, SystemView, HOME_IN_SANDBOX};
pub use policy::{Confinement, Egress, ResourceLimits, UserSwitch};
pub use users::TenantUsers;

/// How long the start-up probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Why this machine cannot sandbox agents.
#[derive(Debug, thiserror::Error)]
pub enum SandboxUnavailable {
    #[error(
        "bubblewrap (bwrap) is not installed: install it (Debian/Ubuntu: apt-get install bubblewrap; Fedora: \
         dnf install bubblewrap) or name it with --bwrap"
    )]
    NoBubblewrap,
    #[error("this kernel has no Landlock (Linux 5.13+ with Landlock enabled in the LSM list is needed)")]
    NoLandlock,
    #[error("a test sandbox failed: {0}")]
    ProbeFailed(String),
    #[error("cannot prepare the test sandbox: {0}")]
    Io(#[from] std::io::Error),
}

/// What every sandbox of this process shares.
#[derive(Debug, Clone)]
pub struct SandboxSettings {
    /// The relay's own binary (its `sandbox-exec` confines each sandbox from inside).
    pub helper: PathBuf,
    /// bubblewrap; default: `bwrap` on the `PATH`.
    pub bwrap: Option<PathBuf>,
    /// Paths agents must never see: the relay's data directory, secret files, the workspace root.
    pub protected: Vec<PathBuf>,
    /// More system hierarchies to show read-only (e.g. `/nix/store`).
    pub extra_system: Vec<PathBuf>,
    /// Niceness of sandboxed processes.
    pub nice: i32,
    /// A user id the probe may switch to when the relay runs as root (one of the tenants' range).
    pub probe_user: u32,
}

/// A machine that can sandbox: bubblewrap works, Landlock is enforced.
#[derive(Debug)]
pub struct Sandbox {
    bwrap: PathBuf,
    layout: Layout,
    enforced: Enforced,
}

impl Sandbox {
    /// Check that a sandbox can be built here (one test sandbox, confined as agents will be), or say why not.
    pub async fn probe(settings: SandboxSettings) -> Result<Sandbox, SandboxUnavailable> {
        let bwrap = match &settings.bwrap {
            Some(path) => path.clone(),
            None => find_on_path("bwrap").ok_or(SandboxUnavailable::NoBubblewrap)?,
        };
        if confine::landlock_abi() < 1 {
            return Err(SandboxUnavailable::NoLandlock);
        }
        let privilege = if running_as_root() {
            Privilege::Root
        } else {
            Privilege::Unprivileged
        };
        let mut layout = Layout {
            system: SystemView::detect(&settings.extra_system),
            protected: settings.protected.clone(),
            helper: settings.helper.clone(),
            privilege,
            proc: true,
            nice: settings.nice,
        };
        let scratch = tempfile_dir()?;
        let spec = SandboxSpec {
            workspace: scratch.join("workspace"),
            home: scratch.join("home"),
            tmp: scratch.join("tmp"),
            shm: scratch.join("shm"),
            cwd: scratch.join("workspace"),
            install: Vec::new(),
            egress: if confine::landlock_abi() >= 4 {
                Egress::default()
            } else {
                Egress::None
            },
            limits: ResourceLimits::default(),
            cgroup: None,
            user: (privilege == Privilege::Root).then_some(UserSwitch {
                uid: settings.probe_user,
                gid: settings.probe_user,
            }),
        };
        for dir in [&spec.workspace, &spec.home, &spec.tmp, &spec.shm] {
            std::fs::create_dir_all(dir)?;
        }
        let mut outcome = run_probe(&bwrap, &layout, &spec).await;
        if let Err(message) = &outcome {
            if message.contains("proc") {
                // Some container runtimes forbid a fresh /proc: run without one (nothing outside is visible).
                tracing::warn!(%message, "the sandbox cannot mount its own /proc here; sandboxes run without /proc");
                layout.proc = false;
                outcome = run_probe(&bwrap, &layout, &spec).await;
            }
        }
        let _ = std::fs::remove_dir_all(&scratch);
        let enforced = outcome.map_err(SandboxUnavailable::ProbeFailed)?;
        Ok(Sandbox {
            bwrap,
            layout,
            enforced,
        })
    }

    /// What Landlock enforces on this kernel.
    pub fn enforced(&self) -> &Enforced {
        &self.enforced
    }

    /// How sandboxes are made here.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
}

/// Run the test sandbox: confined as agents are, it prints what was enforced.
async fn run_probe(bwrap: &PathBuf, layout: &Layout, spec: &SandboxSpec) -> Result<Enforced, String> {
    let mut command = tokio::process::Command::new(bwrap);
    command
        .args(layout.bwrap_args(spec, &[OsString::from("--probe")]))
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = spawner::spawn(command)
        .await
        .map_err(|error| format!("cannot start {}: {error}", bwrap.display()))?;
    let output = tokio::time::timeout(PROBE_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| format!("the test sandbox did not finish within {PROBE_TIMEOUT:?}"))?
        .map_err(|error| error.to_string())?;
    if !output.status.success() {
        return Err(format!(
            "{} ({})",
            String::from_utf8_lossy(&output.stderr).trim(),
            output.status
        ));
    }
    serde_json::from_slice(&output.stdout).map_err(|error| format!("unreadable probe answer: {error}"))
}

/// A fresh private directory for the probe.
fn tempfile_dir() -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "ahp-relay-sandbox-probe-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}

/// Give bubblewrap its arguments through a memory file (`--args FD`) rather than its command line: the
/// sandbox's init process (bubblewrap, visible in the sandbox's `/proc`) then shows no paths of the relay — not
/// the files it covers (whose names may name other tenants), not the confinement. The descriptor is inherited
/// by this child only (its close-on-exec flag is cleared after the fork). Without memory files, on the command
/// line.
fn pass_arguments(command: &mut tokio::process::Command, args: &[OsString]) {
    // bubblewrap takes options from the file; what it runs (`-- HELPER …`) stays on its command line.
    let split = args
        .windows(2)
        .position(|pair| pair[0] == "--" && pair[1] == layout::HELPER_IN_SANDBOX)
        .unwrap_or(args.len());
    let (options, run) = args.split_at(split);
    match arguments_file(options) {
        Ok(file) => {
            use std::os::fd::AsRawFd;
            let fd = file.as_raw_fd();
            command.arg("--args").arg(fd.to_string()).args(run);
            // SAFETY: the closure only calls fcntl(2), which is async-signal-safe; `file` stays open (owned by
            // the closure) until the command is spawned and dropped.
            unsafe {
                command.pre_exec(move || {
                    let _owned = &file;
                    if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        Err(error) => {
            tracing::warn!(%error, "no memory file for bubblewrap's arguments; passing them on its command line");
            command.args(args);
        }
    }
}

/// A sealed-size memory file holding `args`, each ended by NUL, read from its start.
fn arguments_file(args: &[OsString]) -> std::io::Result<std::fs::File> {
    use std::io::{Seek, Write};
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: memfd_create takes a NUL-terminated name and flags; the descriptor it returns is ours.
    let fd = unsafe { libc::memfd_create(c"ahp-relay-bwrap-args".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut bytes = Vec::new();
    for arg in args {
        bytes.extend_from_slice(arg.as_bytes());
        bytes.push(0);
    }
    file.write_all(&bytes)?;
    file.rewind()?;
    Ok(file)
}

/// Whether this process runs as root (then tenants get users of their own).
pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
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
    /// The command that runs `program args` as `spec` says, with exactly `env` (plus `HOME`, the private
    /// home), in its own process group, its stdio piped. Start it with [`Launcher::spawn`].
    pub fn command(
        &self,
        spec: &SandboxSpec,
        program: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
    ) -> tokio::process::Command {
        let mut command = match self {
            Launcher::Sandboxed(sandbox) => {
                let run: Vec<OsString> = ["--", program]
                    .into_iter()
                    .map(OsString::from)
                    .chain(args.iter().map(OsString::from))
                    .collect();
                let mut command = tokio::process::Command::new(&sandbox.bwrap);
                pass_arguments(&mut command, &sandbox.layout.bwrap_args(spec, &run));
                command
                    .env_clear()
                    .envs(env)
                    .env("HOME", HOME_IN_SANDBOX)
                    .env("TMPDIR", "/tmp");
                command
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
                command
            }
        };
        if let Some(procs) = spec
            .cgroup
            .as_ref()
            .and_then(|procs| std::ffi::CString::new(procs.as_os_str().as_encoded_bytes()).ok())
        {
            // SAFETY: join_in_child only opens, writes and closes (async-signal-safe).
            unsafe {
                command.pre_exec(move || cgroups::join_in_child(&procs));
            }
        }
        command
            .process_group(0)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Start a command from [`Launcher::command`] (from the one thread sandboxes are started from).
    pub async fn spawn(command: tokio::process::Command) -> std::io::Result<tokio::process::Child> {
        spawner::spawn(command).await
    }

    /// Whether sandboxes switch to per-tenant users (the relay runs as root and sandboxes).
    pub fn per_tenant_users(&self) -> bool {
        matches!(self, Launcher::Sandboxed(sandbox) if sandbox.layout.privilege == Privilege::Root)
    }
}
