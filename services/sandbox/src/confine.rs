//! Applying a [`Confinement`] to the current process, from inside the sandbox: the last step before the agent
//! runs. Order matters: niceness first (the session's autogroup is writable only before the user switch); the
//! user switch needs the capabilities bubblewrap left for it; rlimits are set while they may still be; Landlock and seccomp come last (Landlock forbids the mounts bubblewrap did
//! before, seccomp forbids the `setrlimit`-free calls nothing needs after).
//!
//! Landlock (the `landlock` crate, best effort across kernel ABIs but refusing to run unconfined):
//! - the filesystem: every access right the kernel knows is handled, so only the listed hierarchies are
//!   reachable (read-only, read-write, devices, read-only files);
//! - the network: with [`Egress::Ports`], TCP `connect` only to those ports and no TCP `bind` at all (ABI 4;
//!   refused on older kernels);
//! - scopes (ABI 6): no signals to, and no abstract Unix sockets of, processes outside the sandbox.
//!
//! ptrace of processes outside the Landlock domain is always denied by Landlock itself.

use std::path::Path;

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use crate::policy::{Confinement, Egress, Rlimit, UserSwitch};

/// The newest Landlock ABI this code was written and tested against; newer kernels are used at this level.
const TARGET_ABI: ABI = ABI::V6;

/// Why the process could not confine itself (and so must not run the agent).
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("cannot become uid {uid} / gid {gid}: {source}")]
    User {
        uid: u32,
        gid: u32,
        source: std::io::Error,
    },
    #[error("cannot drop the capability bounding set: {0}")]
    Capabilities(std::io::Error),
    #[error("cannot set the {resource:?} limit to {value}: {source}")]
    Rlimit {
        resource: Rlimit,
        value: u64,
        source: std::io::Error,
    },
    #[error("Landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("Landlock is not enforced by this kernel (it needs Linux 5.13+ with Landlock enabled)")]
    LandlockUnavailable,
    #[error(
        "this kernel's Landlock cannot restrict TCP ports (ABI 4, Linux 6.7+): use egress = \"none\" or \"any\""
    )]
    PortRulesUnavailable,
    #[error("seccomp: {0}")]
    Seccomp(#[from] crate::seccomp::SeccompError),
}

/// What Landlock enforced, for the probe and the logs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Enforced {
    /// `full` or `partial` (some rights of newer ABIs are not known to this kernel).
    pub landlock: String,
    /// Whether TCP connections are restricted to the egress ports.
    pub port_rules: bool,
    /// Whether signals and abstract Unix sockets are scoped to the sandbox (ABI 6).
    pub scoped: bool,
}

/// Confine the calling process (which must be single-threaded: user switches and Landlock apply to the
/// calling thread's credentials).
pub fn apply(confinement: &Confinement) -> Result<Enforced, ConfineError> {
    // Before the user switch: the switch makes the process non-dumpable until it runs the agent, and
    // /proc/self/autogroup then belongs to root.
    lower_priority(confinement.nice);
    // The OOM killer takes an agent before anything of the relay's (raising needs no privilege).
    let _ = std::fs::write("/proc/self/oom_score_adj", AGENT_OOM_SCORE_ADJ.to_string());
    // No capability is passed on across exec: the inheritable and ambient sets are emptied, whoever we are.
    clear_inheritable()?;
    if let Some(user) = confinement.user {
        become_user(user)?;
    }
    for (resource, value) in confinement.limits.rlimits() {
        set_rlimit(resource, value)?;
    }
    // No core dumps: a crashing agent's memory (its credentials) does not land in its workspace.
    set_rlimit_raw(libc::RLIMIT_CORE, 0).map_err(|source| ConfineError::Rlimit {
        resource: Rlimit::FileSize,
        value: 0,
        source,
    })?;
    let enforced = restrict(confinement)?;
    crate::seccomp::apply()?;
    Ok(enforced)
}

/// Drop every capability bubblewrap left (the bounding set first, while CAP_SETPCAP allows it), then become
/// the tenant's user: once no uid is 0 the kernel clears the permitted and effective sets.
fn become_user(user: UserSwitch) -> Result<(), ConfineError> {
    let failed = |source| ConfineError::User {
        uid: user.uid,
        gid: user.gid,
        source,
    };
    let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|text| text.trim().parse::<libc::c_ulong>().ok())
        .unwrap_or(40);
    for cap in 0..=last_cap {
        // SAFETY: prctl(PR_CAPBSET_DROP) takes a capability number and touches no memory.
        let dropped = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if dropped != 0 {
            let error = std::io::Error::last_os_error();
            // EINVAL: a capability this kernel does not know; anything else is a real failure.
            if error.raw_os_error() != Some(libc::EINVAL) {
                return Err(ConfineError::Capabilities(error));
            }
        }
    }
    // SAFETY: setgroups with an empty list, setresgid and setresuid take plain integers.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(failed(std::io::Error::last_os_error()));
        }
        if libc::setresgid(user.gid, user.gid, user.gid) != 0 {
            return Err(failed(std::io::Error::last_os_error()));
        }
        if libc::setresuid(user.uid, user.uid, user.uid) != 0 {
            return Err(failed(std::io::Error::last_os_error()));
        }
    }
    // SAFETY: getuid/geteuid cannot fail.
    let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
    if uid != user.uid || euid != user.uid {
        return Err(failed(std::io::Error::other("the user did not change")));
    }
    // Once no uid is 0 the kernel clears the permitted, effective and ambient sets: make sure it did.
    let status = std::fs::read_to_string("/proc/self/status").map_err(failed)?;
    for set in ["CapPrm:", "CapEff:", "CapAmb:", "CapBnd:", "CapInh:"] {
        let value = status
            .lines()
            .find_map(|line| line.strip_prefix(set))
            .map(str::trim)
            .unwrap_or("?");
        if !value.trim_start_matches('0').is_empty() {
            return Err(failed(std::io::Error::other(format!(
                "capabilities remain after the user switch ({set} {value})"
            ))));
        }
    }
    Ok(())
}

/// The OOM score adjustment of every sandboxed process: the kernel kills agents first.
pub const AGENT_OOM_SCORE_ADJ: i32 = 500;

/// Empty the inheritable and ambient capability sets of the calling thread (capget/capset, version 3).
fn clear_inheritable() -> Result<(), ConfineError> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget/capset read the header and read or write two Data records, as the kernel's ABI says.
    unsafe {
        if libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()) != 0 {
            return Err(ConfineError::Capabilities(std::io::Error::last_os_error()));
        }
        for set in &mut data {
            set.inheritable = 0;
        }
        if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) != 0 {
            return Err(ConfineError::Capabilities(std::io::Error::last_os_error()));
        }
        // EINVAL on kernels without ambient capabilities: nothing to clear there.
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    }
    Ok(())
}

fn set_rlimit(resource: Rlimit, value: u64) -> Result<(), ConfineError> {
    let raw = match resource {
        Rlimit::Processes => libc::RLIMIT_NPROC,
        Rlimit::OpenFiles => libc::RLIMIT_NOFILE,
        Rlimit::FileSize => libc::RLIMIT_FSIZE,
        Rlimit::CpuSeconds => libc::RLIMIT_CPU,
        Rlimit::AddressSpace => libc::RLIMIT_AS,
        Rlimit::Data => libc::RLIMIT_DATA,
    };
    set_rlimit_raw(raw, value).map_err(|source| ConfineError::Rlimit {
        resource,
        value,
        source,
    })
}

fn set_rlimit_raw(resource: libc::__rlimit_resource_t, value: u64) -> std::io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    if unsafe { libc::setrlimit(resource, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Lower the process's priority, and its session's autogroup's (bubblewrap made the sandbox a session of its
/// own): with autogroups on, the scheduler shares CPU between sessions first, so the niceness of the group is
/// what keeps a busy sandbox behind the relay. Best effort: raising niceness needs no privilege.
fn lower_priority(nice: i32) {
    if nice <= 0 {
        return;
    }
    let nice = nice.min(19);
    // SAFETY: setpriority takes plain integers.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, nice);
    }
    let _ = std::fs::write("/proc/self/autogroup", nice.to_string());
}

/// The Landlock ruleset of a confinement, applied to the calling thread (and inherited across `execve`).
fn restrict(confinement: &Confinement) -> Result<Enforced, ConfineError> {
    let abi = TARGET_ABI;
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
    let file_read = AccessFs::ReadFile | AccessFs::ReadDir;
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)?;
    let port_rules = confinement.egress.needs_port_rules();
    if port_rules {
        // A kernel that cannot restrict ports must not run an agent that was promised it would. Binding is
        // handled with no port allowed: no listening TCP socket on a named port (the host's network is shared).
        ruleset = ruleset
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessNet::ConnectTcp | AccessNet::BindTcp)
            .map_err(|_| ConfineError::PortRulesUnavailable)?
            .set_compatibility(CompatLevel::BestEffort);
    }
    let ruleset = ruleset.scope(Scope::from_all(abi))?;
    let mut created = ruleset.create()?;
    let rules = [
        (&confinement.read_only, read),
        (&confinement.read_write, all),
        (&confinement.devices, device),
        (&confinement.readable, file_read),
    ];
    for (paths, access) in rules {
        created = grant(created, paths, access)?;
    }
    if let Egress::Ports(ports) = &confinement.egress {
        for port in ports {
            created = created.add_rule(NetPort::new(*port, AccessNet::ConnectTcp))?;
        }
    }
    let status = created.restrict_self()?;
    let landlock = match status.ruleset {
        RulesetStatus::FullyEnforced => "full",
        RulesetStatus::PartiallyEnforced => "partial",
        RulesetStatus::NotEnforced => return Err(ConfineError::LandlockUnavailable),
    };
    Ok(Enforced {
        landlock: landlock.into(),
        port_rules,
        scoped: landlock_abi() >= 6,
    })
}

/// `created` with `access` beneath each of `paths`: a path this system lacks (e.g. /opt) is simply not granted,
/// and a file gets file rights only.
fn grant<P: AsRef<Path>>(
    mut created: landlock::RulesetCreated,
    paths: &[P],
    access: landlock::BitFlags<AccessFs>,
) -> Result<landlock::RulesetCreated, ConfineError> {
    for path in paths {
        let path = path.as_ref();
        let Some(fd) = open_path(path) else { continue };
        let access = if is_directory(path) {
            access
        } else {
            access & AccessFs::from_file(TARGET_ABI)
        };
        created = created.add_rule(PathBeneath::new(fd, access))?;
    }
    Ok(created)
}

fn open_path(path: &Path) -> Option<PathFd> {
    PathFd::new(path).ok()
}

fn is_directory(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|meta| meta.is_dir())
}

/// The running kernel's Landlock ABI (0 without Landlock).
pub fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns the ABI version.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0_usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(version).unwrap_or(0).max(0)
}

/// A further Landlock domain for one child of an already sandboxed process (the tenant's file server running
/// git on one session's repository): built in the parent, entered between fork and exec
/// ([`Narrowing::enter`]), so the child and all it starts see only `read_only` (read and execute),
/// `read_write` and `devices`. Landlock domains stack: the child keeps every restriction it inherited.
#[derive(Debug)]
pub struct Narrowing {
    ruleset: Option<landlock::RulesetCreated>,
}

impl Narrowing {
    pub fn new(
        read_only: &[&Path],
        read_write: &[&Path],
        devices: &[&Path],
    ) -> Result<Narrowing, ConfineError> {
        let abi = TARGET_ABI;
        let mut created = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(abi))?
            .scope(Scope::from_all(abi))?
            .create()?;
        let rules = [
            (read_only, AccessFs::from_read(abi)),
            (read_write, AccessFs::from_all(abi)),
            (
                devices,
                AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev,
            ),
        ];
        for (paths, access) in rules {
            created = grant(created, paths, access)?;
        }
        Ok(Narrowing {
            ruleset: Some(created),
        })
    }

    /// Enter the domain (in the child, between fork and exec: only system calls happen here). Fails when
    /// Landlock enforced nothing, or when entered twice.
    pub fn enter(&mut self) -> std::io::Result<()> {
        let ruleset = self
            .ruleset
            .take()
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        match ruleset.restrict_self() {
            Ok(status) if status.ruleset != RulesetStatus::NotEnforced => Ok(()),
            Ok(_) => Err(std::io::Error::from_raw_os_error(libc::ENOSYS)),
            Err(_) => Err(std::io::Error::from_raw_os_error(libc::EPERM)),
        }
    }
}
