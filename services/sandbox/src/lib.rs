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

pub mod beneath;
pub mod cgroups;
pub mod confine;
pub mod exec;
pub mod launch;
pub mod layout;
pub mod namespaces;
pub mod network;
pub mod policy;
pub mod seccomp;
pub mod spawner;
pub mod users;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

pub use confine::Enforced;
pub use launch::Launcher;
pub use layout::{Descriptors, Layout, Privilege, SandboxSpec, SystemView, HOME_IN_SANDBOX};
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
    #[error(
        "pasta is not installed: agents with port egress share this process's network namespace (they can reach \
         its loopback services on their ports); install it (Debian/Ubuntu: apt-get install passt; Fedora: dnf \
         install passt) or name it with --pasta"
    )]
    NoPasta,
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
    /// pasta (Debian's `passt`); default: `pasta` on the `PATH`.
    pub pasta: Option<PathBuf>,
    /// Paths agents must never see: the relay's data directory, secret files, the workspace root.
    pub protected: Vec<PathBuf>,
    /// More system hierarchies to show read-only (e.g. `/nix/store`).
    pub extra_system: Vec<PathBuf>,
    /// Niceness of sandboxed processes.
    pub nice: i32,
    /// A user id the probe may switch to when the relay runs as root (one of the tenants' range).
    pub probe_user: u32,
    /// A writable directory for the probe's throw-away sandbox (e.g. under the workspace root: `/tmp` may be
    /// read-only in a container).
    pub scratch: PathBuf,
}

/// A machine that can sandbox: bubblewrap works, Landlock is enforced.
#[derive(Debug)]
pub struct Sandbox {
    bwrap: PathBuf,
    layout: Layout,
    enforced: Enforced,
    /// The relay's binary, opened at start (what every sandbox runs as its helper).
    helper: std::os::fd::OwnedFd,
    /// Tenants' user namespaces (relays that are not root).
    namespaces: namespaces::TenantNamespaces,
    /// pasta, which connects the network namespace of a sandbox with port egress ([`network`]); `None` where
    /// it is missing or cannot work here (such sandboxes then share this process's network namespace).
    pasta: Option<PathBuf>,
    /// Why sandboxes with port egress cannot have a network namespace of their own here, if they cannot.
    no_own_network: Option<String>,
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
        let pasta = match &settings.pasta {
            Some(path) if path.components().count() == 1 => path.to_str().and_then(find_on_path),
            Some(path) => path.is_file().then(|| path.clone()),
            None => find_on_path("pasta"),
        };
        let no_own_network = pasta.is_none().then(|| SandboxUnavailable::NoPasta.to_string());
        let privilege = if running_as_root() {
            Privilege::Root
        } else {
            Privilege::Unprivileged
        };
        let layout = Layout {
            system: SystemView::detect(&settings.extra_system),
            protected: settings.protected.clone(),
            helper: settings.helper.clone(),
            privilege,
            proc: true,
            nice: settings.nice,
        };
        let helper = std::os::fd::OwnedFd::from(std::fs::File::open(&settings.helper)?);
        let scratch = scratch_dir(&settings.scratch)?;
        let spec = SandboxSpec {
            tenant: "probe".into(),
            anchor: scratch.clone(),
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
            loopback_ports: Vec::new(),
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
        let mut sandbox = Sandbox {
            bwrap,
            layout,
            enforced: Enforced {
                landlock: String::new(),
                port_rules: false,
                scoped: false,
            },
            helper,
            namespaces: namespaces::TenantNamespaces::default(),
            pasta,
            no_own_network,
        };
        let mut outcome = run_probe(&sandbox, &spec).await;
        if let Err(message) = &outcome {
            if message.contains(network::FAILED) {
                // A container without /dev/net/tun (or not for this user): no namespace of their own. Whether
                // agents may then share this process's is the operator's call ([`Sandbox::own_network`]).
                sandbox.no_own_network = Some(format!(
                    "pasta cannot connect a network namespace here (give it /dev/net/tun): {message}"
                ));
                sandbox.pasta = None;
                outcome = run_probe(&sandbox, &spec).await;
            }
        }
        if let Err(message) = &outcome {
            if message.contains("proc") {
                // Some container runtimes forbid a fresh /proc: run without one (nothing outside is visible).
                tracing::warn!(%message, "the sandbox cannot mount its own /proc here; sandboxes run without /proc");
                sandbox.layout.proc = false;
                outcome = run_probe(&sandbox, &spec).await;
            }
        }
        let _ = std::fs::remove_dir_all(&scratch);
        sandbox.enforced = outcome.map_err(SandboxUnavailable::ProbeFailed)?;
        Ok(sandbox)
    }

    /// Whether sandboxes with port egress get a network namespace of their own here, or why not (they would
    /// then share this process's: reach its loopback services on their ports, listen on its addresses).
    pub fn own_network(&self) -> Result<(), &str> {
        match &self.no_own_network {
            Some(why) => Err(why),
            None => Ok(()),
        }
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

/// Run the test sandbox: confined as agents are (in a tenant namespace when not root), it prints what was
/// enforced.
async fn run_probe(sandbox: &Sandbox, spec: &SandboxSpec) -> Result<Enforced, String> {
    let mut command = launch::bwrap_command(sandbox, spec, &[OsString::from("--probe")], None)
        .await
        .map_err(|error| format!("cannot prepare the test sandbox: {error}"))?;
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = Launcher::spawn(command)
        .await
        .map_err(|error| format!("cannot start {}: {error}", sandbox.bwrap.display()))?;
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

/// A fresh private directory for the probe, under `parent`.
fn scratch_dir(parent: &std::path::Path) -> std::io::Result<PathBuf> {
    let dir = parent.join(format!(
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

/// Whether this process runs as root (then tenants get users of their own).
pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
