//! One user namespace per tenant, for relays that are not root: every sandbox of the tenant joins it
//! (bubblewrap's `--userns`), so the kernel counts the tenant's processes together there and RLIMIT_NPROC bounds
//! the tenant, not each sandbox alone. (As root, the tenant's own user does the same: see [`crate::users`].)
//!
//! A user namespace lives as long as a process in it: each is held by a `sleep infinity` that entered it
//! between fork and exec (`unshare(CLONE_NEWUSER)`, mapping only this process's own user and group), forked by
//! the spawner thread with a parent-death signal, so it dies with the relay.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use parking_lot::Mutex;

/// The tenants' user namespaces of this process.
#[derive(Default)]
pub struct TenantNamespaces {
    holders: Mutex<HashMap<String, Holder>>,
}

struct Holder {
    process: tokio::process::Child,
    namespace: Arc<OwnedFd>,
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
        let namespace = Arc::new(OwnedFd::from(std::fs::File::open(format!(
            "/proc/{pid}/ns/user"
        ))?));
        let mut holders = self.holders.lock();
        // Two starts at once: keep the first, drop (and so kill) the second.
        let holder = holders.entry(tenant.to_string()).or_insert(Holder {
            process,
            namespace: namespace.clone(),
        });
        Ok(holder.namespace.clone())
    }
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
