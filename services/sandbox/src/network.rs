//! The network of a sandbox whose agent may reach some TCP ports ([`crate::Egress::Ports`]): a network namespace
//! of its own, connected to the outside by `pasta` (Debian's `passt`: user-mode networking that turns the
//! namespace's packets into ordinary sockets of the host).
//!
//! Sharing the host's network, as before, left three edges Landlock cannot close (its rules know TCP ports, not
//! addresses, and nothing of UDP or of listening): the host's loopback services on an allowed port (a TLS proxy
//! on `127.0.0.1:443`), UDP to any loopback port, and listening sockets reachable from the host's external
//! address. In a namespace of its own the agent's `127.0.0.1` is its own; `pasta` runs with `--no-map-gw` (the
//! gateway address does not lead to the host's loopback) and forwards no port inwards (`-t none -u none`) nor
//! from the namespace's loopback outwards (`-T none -U none`). Landlock still limits TCP to the egress ports.
//!
//! The order: bubblewrap makes the namespaces and waits (`--block-fd`) while it reports its child's pid
//! (`--info-fd`); the relay opens that child's network (and, unprivileged, user) namespace, starts `pasta` on
//! them in the foreground (it writes its pid, to a pipe of the relay's, once the namespace's interface,
//! address and routes are set up), then lets the sandbox go on. pasta is the relay's child: it is killed when
//! the sandbox's bubblewrap exits (watched by pidfd) and dies with the relay (parent-death signal). Nothing runs
//! in the sandbox before its network is ready; when `pasta` fails, the sandbox is killed.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where a sandbox's resolver is in its namespace when the host's resolver is on the host's loopback: pasta
/// forwards DNS sent there to the host's first resolver (`--dns-forward`), which it reaches from outside.
pub const FORWARDED_RESOLVER: &str = "169.254.1.53";

/// The resolver configuration of a sandbox with a namespace of its own, when the host's would not work there:
/// its first nameserver is on the host's loopback (systemd-resolved's `127.0.0.53`, Docker's `127.0.0.11`),
/// which in the sandbox is the namespace's own. The host's `search` and `options` lines are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardedResolver {
    /// Where the sandbox reads it: the host's `/etc/resolv.conf`, or the file that link names.
    pub mount_at: PathBuf,
    /// `nameserver` [`FORWARDED_RESOLVER`] and the host's other lines.
    pub text: String,
}

impl ForwardedResolver {
    /// What `resolv_conf` (the host's) needs in a sandbox's namespace; `None` when its first nameserver is not
    /// an IPv4 loopback address (the sandbox reaches it through pasta as it is) or it cannot be read. A file
    /// without a nameserver means 127.0.0.1 to the resolver: forwarded too.
    pub fn of(resolv_conf: &std::path::Path) -> Option<ForwardedResolver> {
        let text = std::fs::read_to_string(resolv_conf).ok()?;
        let first = text.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next())
                .flatten()
        });
        // Without a nameserver line the resolver asks 127.0.0.1: the host's loopback too.
        let loopback = first.is_none_or(|first| {
            first
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|address| address.is_loopback())
        });
        if !loopback {
            return None;
        }
        let mut forwarded = format!("nameserver {FORWARDED_RESOLVER}\n");
        for line in text.lines() {
            let keyword = line.split_whitespace().next().unwrap_or("");
            if matches!(keyword, "search" | "domain" | "options") {
                forwarded.push_str(line);
                forwarded.push('\n');
            }
        }
        Some(ForwardedResolver {
            mount_at: resolv_conf
                .canonicalize()
                .unwrap_or_else(|_| resolv_conf.to_path_buf()),
            text: forwarded,
        })
    }
}

/// What a set-up failure says first (the probe recognises it).
pub const FAILED: &str = "pasta could not connect the sandbox's network";

/// How long bubblewrap may take to report its child, and `pasta` to set the namespace up.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a sandbox's network could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("the sandbox did not report its process: {0}")]
    NoChild(String),
    #[error("cannot open the sandbox's namespace: {0}")]
    Namespace(std::io::Error),
    #[error("{FAILED}: {0}")]
    Pasta(String),
}

impl From<NetworkError> for std::io::Error {
    fn from(error: NetworkError) -> Self {
        std::io::Error::other(error.to_string())
    }
}

/// The parent's ends of a sandbox's set-up pipes, and how to connect it.
#[derive(Debug)]
pub struct SandboxNetwork {
    pasta: PathBuf,
    /// bubblewrap writes its child's pid here (`--info-fd`).
    info: OwnedFd,
    /// One byte written here lets the sandbox go on (`--block-fd`).
    release: OwnedFd,
    /// The tenant's user namespace, for a relay that is not root (pasta joins it to reach the network one).
    user_namespace: Option<Arc<OwnedFd>>,
    /// Ports of the host's loopback forwarded into the namespace (`-T`); none: `-T none`.
    loopback_ports: Vec<u16>,
    /// Whether DNS sent to [`FORWARDED_RESOLVER`] goes to the host's (loopback) resolver.
    forward_dns: bool,
}

/// The sandbox's ends of the pipes, inherited by bubblewrap.
pub struct SandboxEnds {
    pub info: OwnedFd,
    pub block: OwnedFd,
}

impl SandboxNetwork {
    /// The pipes for one sandbox: the parent's ends, and bubblewrap's.
    pub fn pipes(
        pasta: PathBuf,
        user_namespace: Option<Arc<OwnedFd>>,
        loopback_ports: Vec<u16>,
        forward_dns: bool,
    ) -> std::io::Result<(SandboxNetwork, SandboxEnds)> {
        let (info_read, info_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let (block_read, block_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        Ok((
            SandboxNetwork {
                pasta,
                info: info_read,
                release: block_write,
                user_namespace,
                loopback_ports,
                forward_dns,
            },
            SandboxEnds {
                info: info_write,
                block: block_read,
            },
        ))
    }

    /// Connect the sandbox's network (bubblewrap, process `sandbox`, was started with the other ends), then let
    /// it go on. pasta runs in the foreground as this process's child (started from the sandbox spawner thread,
    /// with the parent-death signal: it dies with the relay), and is killed when the sandbox's bubblewrap exits.
    pub async fn connect(self, sandbox: u32) -> Result<(), NetworkError> {
        let SandboxNetwork {
            pasta,
            info,
            release,
            user_namespace,
            loopback_ports,
            forward_dns,
        } = self;
        let pid = tokio::task::spawn_blocking(move || child_pid(info))
            .await
            .map_err(|error| NetworkError::NoChild(error.to_string()))??;
        // bubblewrap's child sets up its loopback interface before it blocks on the release pipe; pasta
        // configuring the namespace at the same time races it (`bwrap: loopback: Failed RTM_NEWADDR`). So pasta
        // starts once the child sleeps reading that pipe.
        tokio::task::spawn_blocking(move || blocked_on_a_pipe(pid))
            .await
            .map_err(|error| NetworkError::NoChild(error.to_string()))??;
        let network = rustix::fs::open(
            format!("/proc/{pid}/ns/net"),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|errno| NetworkError::Namespace(errno.into()))?;
        // pasta writes its pid here once the namespace is set up: the sign it is ready.
        let (ready_read, ready_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|errno| NetworkError::Pasta(errno.to_string()))?;
        let mut command = tokio::process::Command::new(&pasta);
        // As root, pasta keeps the privilege it needs to enter a namespace of the initial user namespace (it
        // confines itself); otherwise it joins the tenant's user namespace, which this user owns.
        if crate::running_as_root() {
            command.args(["--runas", "0"]);
        }
        let loopback = if loopback_ports.is_empty() {
            "none".to_string()
        } else {
            let ports: Vec<String> = loopback_ports.iter().map(u16::to_string).collect();
            ports.join(",")
        };
        command
            .args(["--foreground", "--quiet", "--config-net", "--no-map-gw"])
            .args(["-t", "none", "-u", "none", "-T", &loopback, "-U", "none"]);
        if forward_dns {
            command.args(["--dns-forward", FORWARDED_RESOLVER]);
        }
        command
            .arg("--pid")
            .arg(format!("/proc/self/fd/{}", ready_write.as_raw_fd()));
        let mut inherited = vec![network.as_raw_fd(), ready_write.as_raw_fd()];
        if let Some(user) = &user_namespace {
            command
                .arg("--userns")
                .arg(format!("/proc/self/fd/{}", user.as_raw_fd()));
            inherited.push(user.as_raw_fd());
        }
        command
            .arg("--netns")
            .arg(format!("/proc/self/fd/{}", network.as_raw_fd()))
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: the closure only calls fcntl(2) and prctl(2) (async-signal-safe) on descriptors that stay open
        // until the command has been spawned.
        unsafe {
            command.pre_exec(move || {
                for fd in &inherited {
                    if libc::fcntl(*fd, libc::F_SETFD, 0) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = crate::spawner::spawn(command)
            .await
            .map_err(|error| NetworkError::Pasta(format!("{}: {error}", pasta.display())))?;
        drop((network, ready_write, user_namespace));
        let ready = tokio::task::spawn_blocking(move || {
            // Its pid and a newline (pasta keeps the file open while it runs: read up to the line's end).
            let mut said = Vec::new();
            let mut file = std::fs::File::from(ready_read);
            let mut chunk = [0_u8; 32];
            while !said.ends_with(b"\n") && said.len() < 64 {
                match file.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => said.extend_from_slice(&chunk[..n]),
                }
            }
            said
        })
        .await
        .map_err(|error| NetworkError::Pasta(error.to_string()))?;
        if !ready.ends_with(b"\n") {
            // pasta ended (or closed its pid file) without saying it was ready.
            let _ = child.start_kill();
            let mut said = String::new();
            if let Some(stderr) = child.stderr.take() {
                use tokio::io::AsyncReadExt;
                let mut stderr = stderr.take(4096);
                let _ = stderr.read_to_string(&mut said).await;
            }
            return Err(NetworkError::Pasta(said.trim().to_string()));
        }
        rustix::io::write(&release, b"1")
            .map_err(|errno| NetworkError::Pasta(format!("cannot release the sandbox: {errno}")))?;
        tokio::spawn(outlive_not(sandbox, child));
        Ok(())
    }
}

/// Kill pasta (`child`) once the sandbox's bubblewrap (`sandbox`) has exited (its pidfd becomes readable).
async fn outlive_not(sandbox: u32, mut child: tokio::process::Child) {
    let watched = i32::try_from(sandbox)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .and_then(|pid| rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::NONBLOCK).ok())
        // SAFETY: the pidfd is owned by the AsyncFd and stays open (and registered) as long as it lives.
        .and_then(|pidfd| unsafe { tokio::io::unix::AsyncFd::register(pidfd) }.ok());
    if let Some(watched) = watched {
        tokio::select! {
            _ = watched.readable() => {}
            _ = child.wait() => return,
        }
    }
    let _ = child.kill().await;
}

/// Wait until process `pid` sleeps reading a pipe (its kernel wait channel is `[anon_]pipe_read`), polling every
/// millisecond; an error if it goes first. A kernel that does not show wait channels (always `0`) is waited on
/// for two seconds at most.
fn blocked_on_a_pipe(pid: i32) -> Result<(), NetworkError> {
    let path = format!("/proc/{pid}/wchan");
    for _ in 0..2000 {
        match std::fs::read_to_string(&path) {
            // `pipe_read`, or `anon_pipe_read` on newer kernels.
            Ok(channel) if channel.ends_with("pipe_read") => return Ok(()),
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
            Err(error) => {
                return Err(NetworkError::NoChild(format!(
                    "the sandbox's process ended while it was set up: {error}"
                )))
            }
        }
    }
    Ok(())
}

/// The pid bubblewrap reports on its info pipe (`{"child-pid": N, …}`).
fn child_pid(info: OwnedFd) -> Result<i32, NetworkError> {
    let mut report = Vec::new();
    let mut file = std::fs::File::from(info);
    let mut chunk = [0_u8; 512];
    while !report.ends_with(b"}") && !report.ends_with(b"}\n") && report.len() < 64 * 1024 {
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => report.extend_from_slice(&chunk[..n]),
            Err(error) => return Err(NetworkError::NoChild(error.to_string())),
        }
    }
    let value: serde_json::Value = serde_json::from_slice(&report)
        .map_err(|error| NetworkError::NoChild(format!("{error}: {}", String::from_utf8_lossy(&report))))?;
    value["child-pid"]
        .as_i64()
        .and_then(|pid| i32::try_from(pid).ok())
        .filter(|pid| *pid > 0)
        .ok_or_else(|| NetworkError::NoChild(String::from_utf8_lossy(&report).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_resolver_is_forwarded_and_the_hosts_search_and_options_kept() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("resolv.conf");
        std::fs::write(
            &file,
            "# comment\nsearch corp.example\nnameserver 127.0.0.53\nnameserver 10.0.0.2\noptions edns0 trust-ad\n",
        )
        .expect("write");
        let forwarded = ForwardedResolver::of(&file).expect("a loopback resolver is forwarded");
        assert_eq!(
            forwarded.text,
            format!("nameserver {FORWARDED_RESOLVER}\nsearch corp.example\noptions edns0 trust-ad\n")
        );
        assert_eq!(forwarded.mount_at, file.canonicalize().expect("real"));
        // A link (systemd's /etc/resolv.conf): mounted where it points.
        let link = dir.path().join("link.conf");
        std::os::unix::fs::symlink(&file, &link).expect("link");
        assert_eq!(
            ForwardedResolver::of(&link).expect("through a link").mount_at,
            file.canonicalize().expect("real")
        );
    }

    #[test]
    fn a_resolver_pasta_reaches_as_it_is_is_left_alone_and_none_is_the_loopback() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("resolv.conf");
        std::fs::write(&file, "nameserver 10.255.255.53\nnameserver 127.0.0.1\n").expect("write");
        assert_eq!(ForwardedResolver::of(&file), None);
        assert_eq!(ForwardedResolver::of(&dir.path().join("missing")), None);
        std::fs::write(&file, "search corp.example\n").expect("write");
        assert!(
            ForwardedResolver::of(&file).is_some(),
            "no nameserver: the resolver asks the loopback"
        );
    }
}
