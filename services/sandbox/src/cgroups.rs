//! Memory, CPU and process limits per tenant and per session, where the relay was given a cgroup v2 subtree of
//! its own (delegated: systemd's `Delegate=yes`, a container runtime's private cgroup namespace). Elsewhere the
//! sandbox's rlimits are what bounds an agent (see [`crate::policy::ResourceLimits`]). A cgroup counts as
//! delegated when it is the root of this process's cgroup namespace (a container's own), carries systemd's
//! `trusted.delegate` / `user.delegate` mark, or belongs to this (non-root) user; the relay never rearranges a
//! cgroup that is not its own, even when root could.
//!
//! Layout, under the relay's own cgroup `C`:
//!
//! ```text
//! C/                      controllers memory, pids, cpu enabled for its children
//! C/relay/                the relay's own processes (moved here: a cgroup with children holds no processes)
//! C/sandboxes/<tenant>/   the tenant's ceiling (memory.max, pids.max, cpu.max)
//! C/sandboxes/<tenant>/<session>/   one session: its agent and its commands (memory.max, pids.max, cpu.max)
//! ```
//!
//! A sandbox joins its session's cgroup before bubblewrap runs (the child writes `0` to `cgroup.procs` between
//! fork and exec), so everything it ever starts is counted. Any failure here leaves agents to their rlimits
//! (logged), never unstarted.

use std::path::{Path, PathBuf};

/// Controllers the sandboxes need.
const CONTROLLERS: &[&str] = &["memory", "pids", "cpu"];
/// `cpu.max`'s period, in microseconds.
const CPU_PERIOD_US: u64 = 100_000;

/// Why cgroups cannot be used (the sandboxes then rely on rlimits).
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("this process is not in a cgroup v2 hierarchy")]
    NotUnified,
    #[error(
        "the cgroup {0} was not delegated to this process (no cgroup namespace of its own, no delegate mark)"
    )]
    NotDelegated(PathBuf),
    #[error("the cgroup {path} lacks the {missing} controller (not delegated to this process)")]
    MissingController { path: PathBuf, missing: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Limits of one cgroup; `None` leaves a resource unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    pub memory_bytes: Option<u64>,
    pub processes: Option<u64>,
    /// CPUs' worth of time (e.g. 1.5), as thousandths.
    pub cpu_millis: Option<u64>,
}

/// The sandboxes' cgroup subtree.
#[derive(Debug)]
pub struct Cgroups {
    sandboxes: PathBuf,
}

impl Cgroups {
    /// The subtree of this process's cgroup, prepared (controllers enabled, the relay moved into `relay/`), if
    /// it is a delegated cgroup v2 with the memory, pids and cpu controllers. `root` is where cgroup v2 is
    /// mounted (`/sys/fs/cgroup`), `membership` the text of `/proc/self/cgroup`.
    pub fn prepare(root: &Path, membership: &str) -> Result<Cgroups, CgroupError> {
        let relative = membership
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .ok_or(CgroupError::NotUnified)?;
        let own = root.join(relative.trim_start_matches('/'));
        if !delegated(&own, relative) {
            return Err(CgroupError::NotDelegated(own));
        }
        let controllers = read(&own.join("cgroup.controllers"))?;
        for wanted in CONTROLLERS {
            if !controllers.split_whitespace().any(|c| c == *wanted) {
                return Err(CgroupError::MissingController {
                    path: own.clone(),
                    missing: (*wanted).into(),
                });
            }
        }
        // A cgroup whose children use controllers holds no processes itself: the relay moves into a leaf.
        let relay = own.join("relay");
        mkdir(&relay)?;
        for pid in read(&own.join("cgroup.procs"))?.split_whitespace() {
            // A process that exited meanwhile cannot be moved; that is fine.
            let _ = std::fs::write(relay.join("cgroup.procs"), pid);
        }
        enable_controllers(&own)?;
        let sandboxes = own.join("sandboxes");
        mkdir(&sandboxes)?;
        enable_controllers(&sandboxes)?;
        Ok(Cgroups { sandboxes })
    }

    /// The cgroup of `session` of `tenant` (names already safe as path segments), created with `session_limits`
    /// under the tenant's, created with `tenant_limits`; returns its `cgroup.procs`, which a sandbox joins.
    pub fn session(
        &self,
        tenant: &str,
        session: &str,
        tenant_limits: &CgroupLimits,
        session_limits: &CgroupLimits,
    ) -> Result<PathBuf, CgroupError> {
        let tenant_dir = self.sandboxes.join(tenant);
        if !tenant_dir.exists() {
            mkdir(&tenant_dir)?;
            enable_controllers(&tenant_dir)?;
        }
        // Written every time: the configuration may have changed since the tenant's cgroup was made.
        write_limits(&tenant_dir, tenant_limits)?;
        let session_dir = tenant_dir.join(session);
        mkdir(&session_dir)?;
        write_limits(&session_dir, session_limits)?;
        Ok(session_dir.join("cgroup.procs"))
    }

    /// Remove a session's cgroup (it must hold no process any more; a failure is only logged).
    pub fn remove_session(&self, tenant: &str, session: &str) {
        let dir = self.sandboxes.join(tenant).join(session);
        if let Err(error) = std::fs::remove_dir(&dir) {
            if error.kind() != std::io::ErrorKind::NotFound {
                tracing::debug!(%error, path = %dir.display(), "cannot remove a session's cgroup yet");
            }
        }
    }
}

/// Whether the cgroup `own` (at `relative` in the hierarchy this process sees) is this process's to arrange.
fn delegated(own: &Path, relative: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    if relative.trim() == "/" {
        return true;
    }
    if has_xattr(own, c"trusted.delegate") || has_xattr(own, c"user.delegate") {
        return true;
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    euid != 0 && std::fs::metadata(own).is_ok_and(|meta| meta.uid() == euid)
}

fn has_xattr(path: &Path, name: &std::ffi::CStr) -> bool {
    let Ok(path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: both strings are NUL-terminated and outlive the call; a zero-sized buffer only asks the size.
    unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
}

fn write_limits(dir: &Path, limits: &CgroupLimits) -> Result<(), CgroupError> {
    let value = |limit: Option<u64>| limit.map_or_else(|| "max".to_string(), |v| v.to_string());
    write(&dir.join("memory.max"), &value(limits.memory_bytes))?;
    write(&dir.join("pids.max"), &value(limits.processes))?;
    let cpu = limits.cpu_millis.map_or_else(
        || format!("max {CPU_PERIOD_US}"),
        |millis| format!("{} {CPU_PERIOD_US}", (millis * CPU_PERIOD_US / 1000).max(1000)),
    );
    write(&dir.join("cpu.max"), &cpu)
}

fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
    let enable: Vec<String> = CONTROLLERS.iter().map(|c| format!("+{c}")).collect();
    write(&dir.join("cgroup.subtree_control"), &enable.join(" "))
}

fn read(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(io(path))
}

fn write(path: &Path, text: &str) -> Result<(), CgroupError> {
    std::fs::write(path, text).map_err(io(path))
}

fn mkdir(path: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(io(path)(error)),
    }
}

/// Join the cgroup whose `cgroup.procs` is `procs` — in a child between fork and exec: only `open(2)`,
/// `write(2)` and `close(2)`, which are async-signal-safe. `procs` must be NUL-terminated.
pub fn join_in_child(procs: &std::ffi::CStr) -> std::io::Result<()> {
    // SAFETY: open/write/close on a path we own, with a two-byte buffer that outlives the call.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, b"0".as_ptr().cast(), 1);
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        if written != 1 {
            return Err(error);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory shaped like a delegated cgroup v2 (the kernel's files, as plain files).
    fn fake_cgroup(root: &Path, relative: &str, controllers: &str) -> PathBuf {
        let own = root.join(relative);
        std::fs::create_dir_all(&own).expect("mkdir");
        std::fs::write(own.join("cgroup.controllers"), controllers).expect("write");
        std::fs::write(own.join("cgroup.procs"), "4242\n4243\n").expect("write");
        own
    }

    #[test]
    fn a_delegated_cgroup_gets_a_relay_leaf_and_a_subtree_with_limits_per_tenant_and_session() {
        let root = tempfile::tempdir().expect("tempdir");
        // A container's own cgroup: the root of its cgroup namespace.
        let own = fake_cgroup(root.path(), "", "cpuset cpu io memory pids");
        let cgroups = Cgroups::prepare(root.path(), "0::/\n").expect("prepared");
        assert!(std::fs::read_to_string(own.join("relay/cgroup.procs"))
            .expect("moved")
            .contains("4243"));
        assert_eq!(
            std::fs::read_to_string(own.join("cgroup.subtree_control")).expect("enabled"),
            "+memory +pids +cpu"
        );
        let procs = cgroups
            .session(
                "acme",
                "s1",
                &CgroupLimits {
                    memory_bytes: Some(8 << 30),
                    processes: Some(4096),
                    cpu_millis: None,
                },
                &CgroupLimits {
                    memory_bytes: Some(2 << 30),
                    processes: Some(256),
                    cpu_millis: Some(1500),
                },
            )
            .expect("session cgroup");
        assert_eq!(procs, own.join("sandboxes/acme/s1/cgroup.procs"));
        let read = |path: &str| std::fs::read_to_string(own.join(path)).expect(path);
        assert_eq!(read("sandboxes/acme/memory.max"), (8_u64 << 30).to_string());
        assert_eq!(read("sandboxes/acme/cpu.max"), "max 100000");
        assert_eq!(read("sandboxes/acme/s1/pids.max"), "256");
        assert_eq!(read("sandboxes/acme/s1/cpu.max"), "150000 100000");
        assert_eq!(
            read("sandboxes/acme/cgroup.subtree_control"),
            "+memory +pids +cpu"
        );
    }

    #[test]
    fn a_cgroup_not_delegated_is_left_alone() {
        let root = tempfile::tempdir().expect("tempdir");
        let own = fake_cgroup(
            root.path(),
            "system.slice/relay.service",
            "cpuset cpu io memory pids",
        );
        let membership = "0::/system.slice/relay.service\n";
        // SAFETY: geteuid has no preconditions.
        let root_user = unsafe { libc::geteuid() } == 0;
        if root_user {
            // Root could write there, but nothing says the cgroup is the relay's: untouched.
            assert!(matches!(
                Cgroups::prepare(root.path(), membership),
                Err(CgroupError::NotDelegated(_))
            ));
            assert!(!own.join("relay").exists() && !own.join("cgroup.subtree_control").exists());
        }
        // systemd's mark of a delegated cgroup (Delegate=yes) makes it the relay's.
        let path = std::ffi::CString::new(own.as_os_str().as_encoded_bytes()).expect("path");
        let name = if root_user {
            c"trusted.delegate"
        } else {
            c"user.delegate"
        };
        // SAFETY: NUL-terminated strings and a one-byte value, all outliving the call.
        let marked = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), c"1".as_ptr().cast(), 1, 0) } == 0;
        if marked {
            assert!(Cgroups::prepare(root.path(), membership).is_ok());
            assert!(own.join("relay/cgroup.procs").exists());
        } else {
            eprintln!("this file system keeps no extended attributes: the delegate mark is not tested");
        }
    }

    #[test]
    fn without_delegated_controllers_there_are_no_cgroups() {
        let root = tempfile::tempdir().expect("tempdir");
        fake_cgroup(root.path(), "", "hugetlb");
        assert!(matches!(
            Cgroups::prepare(root.path(), "0::/\n"),
            Err(CgroupError::MissingController { .. })
        ));
        // A hybrid hierarchy (cgroup v1 controllers, as on this project's CI machines) has no `0::` line…
        assert!(matches!(
            Cgroups::prepare(root.path(), "4:memory:/x\n1:cpu:/\n"),
            Err(CgroupError::NotUnified)
        ));
    }

    #[test]
    fn a_child_joins_its_cgroup_before_it_runs_anything() {
        let root = tempfile::tempdir().expect("tempdir");
        let procs = root.path().join("cgroup.procs");
        std::fs::write(&procs, "").expect("write");
        let path = std::ffi::CString::new(procs.display().to_string()).expect("path");
        let mut command = std::process::Command::new("true");
        // SAFETY: join_in_child is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || join_in_child(&path));
        }
        assert!(command.status().expect("run").success());
        // The kernel's file takes "0" as "the writer"; this plain file shows what was written.
        assert_eq!(std::fs::read_to_string(&procs).expect("read"), "0");
    }
}
