//! Per-tenant users, when the relay runs as root: each tenant's sandboxes run as a user of their own, taken
//! from a configured range, so the kernel keeps tenants' files apart (a tenant's directories are `0700` and
//! its own) and counts each tenant's processes (RLIMIT_NPROC is per user). Root is exempt from RLIMIT_NPROC,
//! so without this a fork bomb would have no bound.
//!
//! The tenant's top directory records its user: it is owned by it. A new tenant gets the first user after a
//! hash of its name that no sibling directory has; later (and on every runner sharing the workspace volume)
//! the owner is read back. Directories made before per-tenant users existed (owned by root) are handed over.

use std::collections::HashSet;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;

use crate::beneath::{BeneathError, WorkspaceRoot};
use crate::policy::UserSwitch;

/// A range of user ids to give tenants.
#[derive(Debug)]
pub struct TenantUsers {
    first: u32,
    count: u32,
    /// Claims are serialized within this process (two new tenants must not pick the same user), and across
    /// processes sharing the workspace root by a lock on `<root>/.users.lock`.
    claiming: Mutex<()>,
}

/// Why a tenant's user could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("cannot prepare {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{0}")]
    Beneath(#[from] BeneathError),
    #[error("every user id of the range {first}..{last} is taken by another tenant's directory")]
    Exhausted { first: u32, last: u32 },
}

impl TenantUsers {
    /// Users `first ..= first + count - 1` (never root: `first` must be at least 1).
    pub fn new(first: u32, count: u32) -> TenantUsers {
        TenantUsers {
            first: first.max(1),
            count: count.max(1),
            claiming: Mutex::new(()),
        }
    }

    /// The user of the tenant whose top directory is `name` (a child of the workspace root `root`): its owner;
    /// for a directory that does not exist yet (or that root owns), a free user, which then owns it (mode 0700,
    /// recursively for a directory taken over from root, by descriptor: no link in it is followed).
    pub fn claim(&self, root: &WorkspaceRoot, name: &str, tenant: &str) -> Result<UserSwitch, UserError> {
        let dir = root.path().join(name);
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| UserError::Io { path, source }
        };
        let _claiming = self
            .claiming
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let _across_processes = lock_file(&root.path().join(LOCK_FILE)).map_err(io(root.path()))?;
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() && meta.uid() != 0 && self.contains(meta.uid()) => {
                return Ok(UserSwitch {
                    uid: meta.uid(),
                    gid: meta.gid(),
                })
            }
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                root.create_dirs(&dir, None, 0o700)?;
            }
            Err(error) => return Err(io(&dir)(error)),
        }
        let taken = owners_of_children(root.path());
        let start = fnv1a(tenant) % self.count;
        let uid = (0..self.count)
            .map(|offset| self.first + (start + offset) % self.count)
            .find(|uid| !taken.contains(uid))
            .ok_or(UserError::Exhausted {
                first: self.first,
                last: self.first + (self.count - 1),
            })?;
        let user = UserSwitch { uid, gid: uid };
        root.hand_over(&dir, user)?;
        Ok(user)
    }

    fn contains(&self, uid: u32) -> bool {
        uid >= self.first && uid - self.first < self.count
    }
}

/// The file whose lock serializes claims among processes sharing a workspace root (never a tenant's name: an
/// encoded name never starts with a dot).
const LOCK_FILE: &str = ".users.lock";

/// `path` opened (created if missing, root's) and locked exclusively until the returned file is dropped.
fn lock_file(path: &Path) -> std::io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
    Ok(file)
}

/// Make `path` (a trusted directory: the parent is not a tenant's) and everything beneath it `user`'s; the
/// top directory private (0700). By descriptor, as [`WorkspaceRoot::hand_over`].
pub fn hand_over(path: &Path, user: UserSwitch) -> Result<(), BeneathError> {
    let parent = path.parent().unwrap_or(path);
    WorkspaceRoot::open(parent)?.hand_over(path, user)
}

/// The owners of `root`'s entries (other tenants' directories).
fn owners_of_children(root: &Path) -> HashSet<u32> {
    std::fs::read_dir(root)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| entry.metadata().ok())
                .map(|meta| meta.uid())
                .collect()
        })
        .unwrap_or_default()
}

/// FNV-1a: a stable hash of a tenant's name (the same on every runner and release).
fn fnv1a(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running_as_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn each_tenant_gets_its_own_user_and_keeps_it() {
        if !running_as_root() {
            eprintln!("skipped: handing directories to other users needs root");
            return;
        }
        let top = tempfile::tempdir().expect("tempdir");
        let root = WorkspaceRoot::open(top.path()).expect("root");
        // A range of two users, for three claims: the third tenant finds none left.
        let users = TenantUsers::new(61_000, 2);
        let a = users.claim(&root, "a", "a").expect("a");
        let b = users.claim(&root, "b", "b").expect("b");
        assert_ne!(a.uid, b.uid);
        assert!((61_000..61_002).contains(&a.uid) && (61_000..61_002).contains(&b.uid));
        // Claimed again (another runner, a restart): the directory's owner.
        assert_eq!(users.claim(&root, "a", "a").expect("again"), a);
        let meta = std::fs::metadata(root.path().join("a")).expect("a");
        assert_eq!((meta.uid(), meta.mode() & 0o777), (a.uid, 0o700));
        assert!(matches!(
            users.claim(&root, "c", "c"),
            Err(UserError::Exhausted { .. })
        ));
    }

    #[test]
    fn a_directory_made_by_root_is_handed_over_whole() {
        if !running_as_root() {
            eprintln!("skipped: handing directories to other users needs root");
            return;
        }
        let top = tempfile::tempdir().expect("tempdir");
        let old = top.path().join("root/legacy");
        std::fs::create_dir_all(old.join("project/src")).expect("mkdir");
        std::fs::write(old.join("project/src/main.rs"), "fn main() {}").expect("write");
        // A link in the tree to a directory outside it: handed over itself, its target left alone.
        let outside = top.path().join("outside");
        std::fs::create_dir_all(&outside).expect("mkdir");
        std::fs::write(outside.join("precious"), "x").expect("write");
        std::os::unix::fs::symlink(&outside, old.join("project/out")).expect("ln");
        let root = WorkspaceRoot::open(&top.path().join("root")).expect("root");
        let user = TenantUsers::new(62_000, 10)
            .claim(&root, "legacy", "legacy")
            .expect("claim");
        for outside in [outside.clone(), outside.join("precious")] {
            assert_eq!(
                std::fs::metadata(&outside).expect("meta").uid(),
                0,
                "{}",
                outside.display()
            );
        }
        assert_eq!(
            std::fs::symlink_metadata(old.join("project/out"))
                .expect("link")
                .uid(),
            user.uid
        );
        for path in [
            old.clone(),
            old.join("project/src"),
            old.join("project/src/main.rs"),
        ] {
            assert_eq!(
                std::fs::metadata(&path).expect("meta").uid(),
                user.uid,
                "{}",
                path.display()
            );
        }
    }
}
