//! One user namespace per tenant, for relays that are not root: every sandbox of the tenant joins it
//! (bubblewrap's `--userns`), so the kernel counts the tenant's processes together there and RLIMIT_NPROC bounds
//! the tenant, not each sandbox alone. (As root, the tenant's own user does the same: see [`crate::users`].)
//!
//! A user namespace lives as long as a process in it: each is held by a `sleep infinity` that entered it
//! between fork and exec (`unshare(CLONE_NEWUSER)`, mapping only this process's own user and group), forked by
//! the spawner thread with a parent-death signal, so it dies with the relay.
//!
//! A holder is not kept for every tenant ever seen: once no process but the holder has been in its namespace
//! (and no sandbox is being started with it) for [`IDLE_BEFORE_REAP`], a reaper thread stops it
//! ([`TenantNamespaces::reap_idle`]); the tenant's next sandbox makes a new namespace. While any of its processes
//! runs, the holder stays, so the tenant's processes are never split across two namespaces.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long a namespace holds nobody but its holder before the holder is stopped.
pub const IDLE_BEFORE_REAP: Duration = Duration::from_secs(300);

/// How often the reaper looks.
const REAP_EVERY: Duration = Duration::from_secs(60);

type Holders = Arc<Mutex<HashMap<String, Holder>>>;

/// The tenants' user namespaces of this process.
#[derive(Default)]
pub struct TenantNamespaces {
    holders: Holders,
    /// Whether the reaper thread was started (with the first holder).
    reaper: std::sync::OnceLock<()>,
}

struct Holder {
    process: tokio::process::Child,
    namespace: Arc<OwnedFd>,
    /// The namespace's inode (what `/proc/PID/ns/user` of each process in it names).
    inode: u64,
    /// Since when nobody but the holder was seen in it.
    idle_since: Option<Instant>,
}

impl std::fmt::Debug for TenantNamespaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantNamespaces").finish_non_exhaustive()
    }
}

impl TenantNamespaces {
    /// The user namespace of `tenant` (its holder started if it has none, or if it died).
    pub async fn of(&self, tenant: &str) -> std::io::Result<Arc<OwnedFd>> {
        {
            let mut holders = self.holders.lock();
            if let Some(holder) = holders.get_mut(tenant) {
                if matches!(holder.process.try_wait(), Ok(None)) {
                    // Handed out: a sandbox joins it in a moment (after the handle is dropped, maybe), so the
                    // idle time starts again.
                    holder.idle_since = None;
                    return Ok(holder.namespace.clone());
                }
                holders.remove(tenant);
            }
        }
        let process = crate::spawner::spawn(holder_command()?).await?;
        let pid = process
            .id()
            .ok_or_else(|| std::io::Error::other("the namespace holder exited at once"))?;
        // spawn returned after exec, so the holder is in its namespace already.
        let file = std::fs::File::open(format!("/proc/{pid}/ns/user"))?;
        let inode = file.metadata()?.ino();
        let namespace = Arc::new(OwnedFd::from(file));
        self.start_reaper();
        let mut holders = self.holders.lock();
        // Two starts at once: keep the first, drop (and so kill) the second.
        let holder = holders.entry(tenant.to_string()).or_insert(Holder {
            process,
            namespace: namespace.clone(),
            inode,
            idle_since: None,
        });
        Ok(holder.namespace.clone())
    }

    /// Stop the holders whose namespace nobody else has been in for `idle_for`: no process but the holder (all
    /// of `/proc` is looked at) and no sandbox being started with it. Returns the tenants whose holder stopped.
    /// The look happens under the lock [`TenantNamespaces::of`] hands namespaces out under, so a sandbox is
    /// either being started (its namespace handed out and held) or already in `/proc`.
    pub fn reap_idle(&self, idle_for: Duration) -> Vec<String> {
        reap(&self.holders, idle_for)
    }

    /// The holder process of `tenant`'s namespace, if it has one.
    pub fn holder_pid(&self, tenant: &str) -> Option<u32> {
        self.holders
            .lock()
            .get(tenant)
            .and_then(|holder| holder.process.id())
    }

    fn start_reaper(&self) {
        let holders: Weak<Mutex<HashMap<String, Holder>>> = Arc::downgrade(&self.holders);
        self.reaper.get_or_init(|| {
            let started = std::thread::Builder::new()
                .name("ahp-namespace-reaper".into())
                .spawn(move || loop {
                    std::thread::sleep(REAP_EVERY);
                    let Some(holders) = holders.upgrade() else {
                        return;
                    };
                    let reaped = reap(&holders, IDLE_BEFORE_REAP);
                    if !reaped.is_empty() {
                        tracing::info!(tenants = ?reaped, "stopped idle tenants' namespace holders");
                    }
                });
            if let Err(error) = started {
                tracing::warn!(%error, "cannot start the namespace reaper: idle holders stay until the relay stops");
            }
        });
    }
}

fn reap(holders: &Holders, idle_for: Duration) -> Vec<String> {
    let mut holders = holders.lock();
    if holders.is_empty() {
        return Vec::new();
    }
    // Without a view of /proc nothing is known to be idle.
    let Some(occupants) = processes_by_user_namespace() else {
        return Vec::new();
    };
    let now = Instant::now();
    let mut reaped = Vec::new();
    holders.retain(|tenant, holder| {
        if !matches!(holder.process.try_wait(), Ok(None)) {
            reaped.push(tenant.clone());
            return false;
        }
        let others = occupants
            .get(&holder.inode)
            .copied()
            .unwrap_or(0)
            .saturating_sub(1);
        if others > 0 || Arc::strong_count(&holder.namespace) > 1 {
            holder.idle_since = None;
            return true;
        }
        let since = *holder.idle_since.get_or_insert(now);
        if now.duration_since(since) >= idle_for && holder.idle_since != Some(now) {
            // Dropped: the holder is killed (kill_on_drop) and the namespace goes with it.
            reaped.push(tenant.clone());
            return false;
        }
        true
    });
    reaped
}

/// How many processes are in each user namespace (by inode), from `/proc`; `None` when it cannot be read.
fn processes_by_user_namespace() -> Option<HashMap<u64, usize>> {
    let mut counts = HashMap::new();
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        if let Ok(namespace) = std::fs::metadata(entry.path().join("ns/user")) {
            *counts.entry(namespace.ino()).or_insert(0) += 1;
        }
    }
    Some(counts)
}

/// `sleep infinity` in a new user namespace that maps this process's user and group to themselves.
fn holder_command() -> std::io::Result<tokio::process::Command> {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let uid_map = format!("{uid} {uid} 1\n");
    let gid_map = format!("{gid} {gid} 1\n");
    let setgroups = CString::new("/proc/self/setgroups").map_err(std::io::Error::other)?;
    let uid_path = CString::new("/proc/self/uid_map").map_err(std::io::Error::other)?;
    let gid_path = CString::new("/proc/self/gid_map").map_err(std::io::Error::other)?;
    let mut command = tokio::process::Command::new("sleep");
    command
        .arg("infinity")
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    // SAFETY: between fork and exec only prctl, unshare, open, write and close (async-signal-safe), on buffers
    // made before the fork.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
                || libc::unshare(libc::CLONE_NEWUSER) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            write_file(&setgroups, b"deny")?;
            write_file(&uid_path, uid_map.as_bytes())?;
            write_file(&gid_path, gid_map.as_bytes())?;
            Ok(())
        });
    }
    Ok(command)
}

/// Write `bytes` to `path` with open/write/close only (usable between fork and exec).
fn write_file(path: &CString, bytes: &[u8]) -> std::io::Result<()> {
    // SAFETY: open/write/close with a NUL-terminated path and a buffer that outlives the calls.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        if written != bytes.len() as isize {
            return Err(error);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn inode(pid: u32) -> Option<u64> {
        std::fs::metadata(format!("/proc/{pid}/ns/user"))
            .ok()
            .map(|m| m.ino())
    }

    /// A process of the test's own, in `namespace` (joined between fork and exec), killed when dropped.
    fn join(namespace: &OwnedFd) -> tokio::process::Child {
        let fd = namespace.as_raw_fd();
        let mut command = tokio::process::Command::new("sleep");
        command.arg("60").kill_on_drop(true);
        // SAFETY: only setns (async-signal-safe) between fork and exec; the child is single-threaded there.
        unsafe {
            command.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWUSER) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        command.spawn().expect("a process in the namespace")
    }

    /// A holder whose namespace nobody else is in is stopped on the second look past the idle time, and the
    /// tenant's next sandbox gets a new namespace; while a process is in it, or a sandbox is being started
    /// with it, it stays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_tenants_holder_is_reaped_and_a_busy_ones_is_kept() {
        let namespaces = TenantNamespaces::default();
        let acme = namespaces.of("acme").await.expect("acme's namespace");
        let globex = namespaces.of("globex").await.expect("globex's namespace");
        let acme_holder = namespaces.holder_pid("acme").expect("holder");
        let first = inode(acme_holder).expect("its namespace");
        let mut inside = join(&globex);
        drop(globex);
        // acme's namespace is being handed to a sandbox (held): it stays.
        for _ in 0..2 {
            assert!(namespaces.reap_idle(Duration::ZERO).is_empty());
        }
        drop(acme);
        // Nobody in acme's: stopped on the second look. globex's has a process in it: kept.
        assert!(
            namespaces.reap_idle(Duration::ZERO).is_empty(),
            "reaped on the first look"
        );
        assert_eq!(namespaces.reap_idle(Duration::ZERO), vec!["acme".to_string()]);
        assert!(namespaces.holder_pid("acme").is_none());
        assert!(
            namespaces.reap_idle(Duration::ZERO).is_empty(),
            "globex's holder went while its process runs"
        );
        assert!(namespaces.holder_pid("globex").is_some());
        // acme's next sandbox gets a namespace again (a new one). Handed out, a namespace's idle time starts
        // again: a look before and one after the hand-out do not make it idle.
        let again = namespaces.of("acme").await.expect("acme's namespace again");
        drop(again);
        assert!(namespaces.reap_idle(Duration::ZERO).is_empty());
        drop(
            namespaces
                .of("acme")
                .await
                .expect("acme's namespace, handed out again"),
        );
        assert!(
            namespaces.reap_idle(Duration::ZERO).is_empty(),
            "reaped just as it was handed out"
        );
        let second = inode(namespaces.holder_pid("acme").expect("a new holder")).expect("namespace");
        assert_ne!(first, second);
        // Once its process ends, globex's goes too; with an idle time not yet passed, nothing goes.
        inside.kill().await.expect("kill");
        inside.wait().await.expect("wait");
        assert!(namespaces.reap_idle(Duration::from_secs(3600)).is_empty());
        assert!(namespaces.reap_idle(Duration::from_secs(3600)).is_empty());
        let mut reaped = namespaces.reap_idle(Duration::ZERO);
        reaped.sort();
        assert_eq!(reaped, vec!["acme".to_string(), "globex".to_string()]);
    }
}
