//! The relay's one way to touch tenants' trees from outside any sandbox ([`WorkspaceRoot`]).
//!
//! Whatever the relay or a runner does to a tenant's directories with its own privileges (root, often) —
//! create, hand over (chown, chmod), measure, mark, sweep, delete — it does through descriptors: the workspace
//! root is opened once, and everything beneath it is reached with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` and the `*at` calls on the opened directory, never by a path
//! string. A symlink an agent planted anywhere on the way (not only at the last component) makes the call fail
//! with [`BeneathError::Link`] instead of leading the relay out of the tenant's tree; a directory swapped for a
//! symlink after it was looked at is never entered (every descent opens with `O_NOFOLLOW`), and a tree is
//! removed by `unlinkat` walking by descriptor.

use std::ffi::{CStr, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, ResolveFlags};
use rustix::io::Errno;

use crate::policy::UserSwitch;

/// Deepest tree the relay descends into (each level holds one descriptor while it is walked). A deeper tree
/// cannot be measured (it counts as over any quota) nor removed past this depth.
pub const MAX_DEPTH: usize = 256;

const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Why an operation beneath the workspace root failed.
#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    #[error("{0} is not beneath the workspace root")]
    Outside(String),
    #[error("{0} passes through a symbolic link (refused: it could lead out of the workspace)")]
    Link(String),
    #[error("{0} is nested deeper than {MAX_DEPTH} directories")]
    TooDeep(String),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

impl BeneathError {
    /// The operating system's error, where there is one.
    pub fn kind(&self) -> std::io::ErrorKind {
        match self {
            BeneathError::Io { source, .. } => source.kind(),
            _ => std::io::ErrorKind::PermissionDenied,
        }
    }

    pub fn not_found(&self) -> bool {
        self.kind() == std::io::ErrorKind::NotFound
    }
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

fn failed(path: &Path) -> impl FnOnce(Errno) -> BeneathError + '_ {
    move |errno| match errno {
        // RESOLVE_BENEATH refused to leave, RESOLVE_NO_SYMLINKS or O_NOFOLLOW met a link.
        Errno::XDEV => BeneathError::Outside(shown(path)),
        Errno::LOOP => BeneathError::Link(shown(path)),
        errno => BeneathError::Io {
            path: shown(path),
            source: errno.into(),
        },
    }
}

/// The workspace root, opened once; every tenant's tree lies beneath it.
#[derive(Debug)]
pub struct WorkspaceRoot {
    /// The root as the configuration names it, and resolved.
    configured: PathBuf,
    real: PathBuf,
    fd: OwnedFd,
}

impl WorkspaceRoot {
    /// Open the (trusted) workspace root `path`, creating it if missing.
    pub fn open(path: &Path) -> Result<WorkspaceRoot, BeneathError> {
        let io = |source| BeneathError::Io {
            path: shown(path),
            source,
        };
        std::fs::create_dir_all(path).map_err(io)?;
        let real = path.canonicalize().map_err(io)?;
        let fd = rustix::fs::open(
            &real,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(failed(&real))?;
        Ok(WorkspaceRoot {
            configured: path.to_path_buf(),
            real,
            fd,
        })
    }

    /// The root, resolved.
    pub fn path(&self) -> &Path {
        &self.real
    }

    /// `path` (written under the root as configured or as resolved) relative to the root: plain names only.
    pub fn relative<'a>(&self, path: &'a Path) -> Result<&'a Path, BeneathError> {
        let rest = path
            .strip_prefix(&self.real)
            .or_else(|_| path.strip_prefix(&self.configured))
            .map_err(|_| BeneathError::Outside(shown(path)))?;
        if rest.components().all(|c| matches!(c, Component::Normal(_))) {
            Ok(rest)
        } else {
            Err(BeneathError::Outside(shown(path)))
        }
    }

    /// The directory `path`, opened for reading without following any link on the way.
    pub fn open_dir(&self, path: &Path) -> Result<OwnedFd, BeneathError> {
        let rest = self.relative(path)?;
        open_child_dir(&self.fd, rest, path)
    }

    /// Create directory `path` and its missing parents beneath the root (never through a link); those made
    /// here belong to `owner` (when given) with `mode`. Returns the directory, opened.
    ///
    /// A directory made for `owner` is made under a temporary name ([`is_temporary`]), handed over, and only
    /// then renamed into place: under its own name it is never the relay's. A watch of the tenant's tree, whose
    /// file server runs as the tenant, must be able to watch a new directory the moment it appears; one that
    /// appeared as root's (mode `0700`) for a moment could not be watched, nor anything made in it later.
    pub fn create_dirs(
        &self,
        path: &Path,
        owner: Option<UserSwitch>,
        mode: u32,
    ) -> Result<OwnedFd, BeneathError> {
        let rest = self.relative(path)?;
        let mut dir = rustix::io::dup(&self.fd).map_err(failed(path))?;
        for name in rest.components() {
            let name = name.as_os_str();
            dir = match owner {
                Some(owner) => made_for(&dir, name, owner, mode, path)?,
                None => {
                    let made = match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o700)) {
                        Ok(()) => true,
                        Err(Errno::EXIST) => false,
                        Err(errno) => return Err(failed(path)(errno)),
                    };
                    let child = open_child_dir(&dir, Path::new(name), path)?;
                    if made {
                        rustix::fs::fchmod(&child, Mode::from_raw_mode(mode)).map_err(failed(path))?;
                    }
                    child
                }
            };
        }
        Ok(dir)
    }

    /// Give directory `path` and everything beneath it to `owner`; the directory itself private (`0700`).
    /// Links are changed themselves, never followed.
    pub fn hand_over(&self, path: &Path, owner: UserSwitch) -> Result<(), BeneathError> {
        let dir = self.open_dir(path)?;
        rustix::fs::fchown(&dir, Some(uid(owner)), Some(gid(owner))).map_err(failed(path))?;
        rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o700)).map_err(failed(path))?;
        walk(&dir, path, 0, &mut |parent, name, kind| {
            // A file with another name elsewhere (a hard link to a file outside) is not handed over.
            if kind != FileType::Directory
                && rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|stat| stat.st_nlink > 1)
            {
                return Ok(());
            }
            rustix::fs::chownat(
                parent,
                name,
                Some(uid(owner)),
                Some(gid(owner)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map(|_| ())
        })
    }

    /// The bytes the tree at `path` holds on disk (allocated blocks), its links not followed; 0 when it does
    /// not exist, `u64::MAX` when it cannot be measured whole (nested deeper than [`MAX_DEPTH`], or unreadable):
    /// what cannot be measured counts as over any quota.
    pub fn disk_usage(&self, path: &Path) -> u64 {
        let dir = match self.open_dir(path) {
            Ok(dir) => dir,
            Err(error) if error.not_found() => return 0,
            Err(_) => return u64::MAX,
        };
        let mut total = rustix::fs::fstat(&dir).map(|stat| blocks(&stat)).unwrap_or(0);
        let walked = walk(&dir, path, 0, &mut |parent, name, _| {
            if let Ok(stat) = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
                total = total.saturating_add(blocks(&stat));
            }
            Ok(())
        });
        match walked {
            Ok(()) => total,
            Err(error) => {
                tracing::warn!(%error, "a tree could not be measured whole: it counts as over its quota");
                u64::MAX
            }
        }
    }

    /// Remove `path` (a file, a link — itself — or a whole tree). Missing is not an error.
    pub fn remove(&self, path: &Path) -> Result<(), BeneathError> {
        let rest = self.relative(path)?;
        let (Some(name), Some(parent)) = (rest.file_name(), rest.parent()) else {
            return Err(BeneathError::Outside(shown(path)));
        };
        let parent = match open_child_dir(&self.fd, parent, path) {
            Ok(parent) => parent,
            Err(error) if error.not_found() => return Ok(()),
            Err(error) => return Err(error),
        };
        remove_entry(&parent, name, path, 0)
    }

    /// The content of regular file `path` (at most `limit` bytes), `None` when it does not exist.
    pub fn read_file(&self, path: &Path, limit: u64) -> Result<Option<Vec<u8>>, BeneathError> {
        use std::io::Read;
        let rest = self.relative(path)?;
        let fd = match rustix::fs::openat2(
            &self.fd,
            rest,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(errno) => return Err(failed(path)(errno)),
        };
        let stat = rustix::fs::fstat(&fd).map_err(failed(path))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(BeneathError::Io {
                path: shown(path),
                source: std::io::Error::other("not a regular file"),
            });
        }
        let mut bytes = Vec::new();
        std::fs::File::from(fd)
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(|source| BeneathError::Io {
                path: shown(path),
                source,
            })?;
        Ok(Some(bytes))
    }

    /// Write regular file `path` whole (created root's, `0600`, or truncated), never through a link.
    pub fn write_file(&self, path: &Path, content: &[u8]) -> Result<(), BeneathError> {
        use std::io::Write;
        let rest = self.relative(path)?;
        let fd = rustix::fs::openat2(
            &self.fd,
            rest,
            OFlags::WRONLY
                | OFlags::CREATE
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::NOCTTY
                | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
            BENEATH,
        )
        .map_err(failed(path))?;
        let stat = rustix::fs::fstat(&fd).map_err(failed(path))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(BeneathError::Io {
                path: shown(path),
                source: std::io::Error::other("not a regular file"),
            });
        }
        rustix::fs::ftruncate(&fd, 0).map_err(failed(path))?;
        std::fs::File::from(fd)
            .write_all(content)
            .map_err(|source| BeneathError::Io {
                path: shown(path),
                source,
            })
    }

    /// The names in directory `path` that are directories themselves (links are not).
    pub fn subdirectories(&self, path: &Path) -> Vec<String> {
        let Ok(dir) = self.open_dir(path) else {
            return Vec::new();
        };
        let Ok(entries) = rustix::fs::Dir::read_from(&dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|entry| entry.file_type() == FileType::Directory)
            .filter_map(|entry| entry.file_name().to_str().ok().map(str::to_string))
            .filter(|name| name != "." && name != "..")
            .collect()
    }
}

fn uid(owner: UserSwitch) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(owner.uid)
}

fn gid(owner: UserSwitch) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(owner.gid)
}

fn blocks(stat: &rustix::fs::Stat) -> u64 {
    u64::try_from(stat.st_blocks).unwrap_or(0).saturating_mul(512)
}

/// What names a temporary file or directory the relay makes in a tenant's tree (`.<name>.ahp-<id>.tmp` for a
/// file being written, `.ahp-dir-<pid>-<n>-<nanos>.tmp` for a directory being made).
pub const TEMPORARY_MARK: &str = ".ahp-";

/// Whether `name` is a temporary file or directory of the relay's, under way (not worth a watch's report).
pub fn is_temporary(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp") && name.contains(TEMPORARY_MARK)
}

/// Directory `name` in `parent`, opened: the one there, or one made for `owner` with `mode` under a temporary
/// name and renamed into place (not over one made meanwhile by someone else: then that one is opened).
fn made_for(
    parent: &OwnedFd,
    name: &OsStr,
    owner: UserSwitch,
    mode: u32,
    shown_as: &Path,
) -> Result<OwnedFd, BeneathError> {
    match open_child_dir(parent, Path::new(name), shown_as) {
        Err(error) if error.not_found() => {}
        opened => return opened,
    }
    let temporary = make_temporary_dir(parent, shown_as)?;
    let placed = (|| {
        let made = open_child_dir(parent, Path::new(&temporary), shown_as)?;
        // Ours, unless the tenant swapped another directory of this parent in under the temporary name (it can
        // move only its own): that one is not handed over, nor put in place.
        let stat = rustix::fs::fstat(&made).map_err(failed(shown_as))?;
        if stat.st_uid != rustix::process::geteuid().as_raw() {
            return Err(failed(shown_as)(Errno::PERM));
        }
        rustix::fs::fchown(&made, Some(uid(owner)), Some(gid(owner))).map_err(failed(shown_as))?;
        rustix::fs::fchmod(&made, Mode::from_raw_mode(mode)).map_err(failed(shown_as))?;
        let renamed =
            match rustix::fs::renameat_with(parent, temporary.as_str(), parent, name, RenameFlags::NOREPLACE)
            {
                // A filesystem without RENAME_NOREPLACE (NFS, some FUSE): a plain rename can replace only an
                // empty directory made meanwhile, and fails over anything else.
                Err(Errno::INVAL) => rustix::fs::renameat(parent, temporary.as_str(), parent, name),
                renamed => renamed,
            };
        match renamed {
            Ok(()) => Ok(Some(made)),
            Err(Errno::EXIST | Errno::NOTEMPTY | Errno::NOTDIR | Errno::ISDIR) => Ok(None),
            Err(errno) => Err(failed(shown_as)(errno)),
        }
    })();
    match placed {
        Ok(Some(made)) => Ok(made),
        // Made meanwhile by someone else: theirs stays, ours goes.
        Ok(None) => {
            let _ = rustix::fs::unlinkat(parent, temporary.as_str(), AtFlags::REMOVEDIR);
            open_child_dir(parent, Path::new(name), shown_as)
        }
        Err(error) => {
            let _ = rustix::fs::unlinkat(parent, temporary.as_str(), AtFlags::REMOVEDIR);
            Err(error)
        }
    }
}

/// A new empty directory (`0700`) in `parent` under a temporary name no one else holds ([`is_temporary`]);
/// its name. The name is not guessable in advance (it holds the clock's nanoseconds), and one taken is passed
/// over.
fn make_temporary_dir(parent: &OwnedFd, shown_as: &Path) -> Result<String, BeneathError> {
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut tries = 0;
    loop {
        let number = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.subsec_nanos())
            .unwrap_or_default();
        let temporary = format!(".ahp-dir-{}-{number}-{nanos}.tmp", std::process::id());
        match rustix::fs::mkdirat(parent, temporary.as_str(), Mode::from_raw_mode(0o700)) {
            Ok(()) => return Ok(temporary),
            Err(Errno::EXIST) if tries < 16 => tries += 1,
            Err(errno) => return Err(failed(shown_as)(errno)),
        }
    }
}

/// Directory `rest` beneath `dir`, opened for reading; no link anywhere on the way.
fn open_child_dir(dir: &impl AsFd, rest: &Path, shown_as: &Path) -> Result<OwnedFd, BeneathError> {
    let rest = if rest.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rest
    };
    rustix::fs::openat2(
        dir,
        rest,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH,
    )
    .map_err(|errno| match errno {
        // O_DIRECTORY on a link (O_NOFOLLOW) says ENOTDIR on some kernels.
        Errno::NOTDIR if is_link(dir, rest) => BeneathError::Link(shown(shown_as)),
        errno => failed(shown_as)(errno),
    })
}

fn is_link(dir: &impl AsFd, rest: &Path) -> bool {
    rustix::fs::statat(dir, rest, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|stat| FileType::from_raw_mode(stat.st_mode) == FileType::Symlink)
}

/// The entries of `dir` but `.` and `..`, with their kinds, read whole (the listing's descriptor is closed
/// before the caller descends: one descriptor per level).
fn entries(dir: &OwnedFd, shown_as: &Path) -> Result<Vec<(std::ffi::CString, FileType)>, BeneathError> {
    let mut listed = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir).map_err(failed(shown_as))? {
        let entry = entry.map_err(failed(shown_as))?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            listed.push((name.to_owned(), entry.file_type()));
        }
    }
    Ok(listed)
}

/// Call `visit(parent, name, kind)` for every entry beneath `dir` (depth first, a directory after its
/// entries), descending into directories only (by descriptor, `O_NOFOLLOW`). A part that cannot be walked
/// (deeper than [`MAX_DEPTH`]) does not stop its siblings'; the first such error is returned at the end.
fn walk(
    dir: &OwnedFd,
    shown_as: &Path,
    depth: usize,
    visit: &mut dyn FnMut(&OwnedFd, &CStr, FileType) -> Result<(), Errno>,
) -> Result<(), BeneathError> {
    if depth >= MAX_DEPTH {
        return Err(BeneathError::TooDeep(shown(shown_as)));
    }
    let mut first_error = None;
    for (name, kind) in entries(dir, shown_as)? {
        if kind == FileType::Directory {
            if let Ok(child) = rustix::fs::openat2(
                dir,
                name.as_c_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
                BENEATH,
            ) {
                if let Err(error) = walk(&child, shown_as, depth + 1, visit) {
                    first_error.get_or_insert(error);
                }
            }
        }
        if let Err(errno) = visit(dir, name.as_c_str(), kind) {
            first_error.get_or_insert(failed(shown_as)(errno));
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Remove entry `name` of `parent`: unlinked, or (a directory) emptied by descriptor and removed.
fn remove_entry(parent: &OwnedFd, name: &OsStr, shown_as: &Path, depth: usize) -> Result<(), BeneathError> {
    match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => return Ok(()),
        Err(Errno::ISDIR) | Err(Errno::PERM) => {}
        Err(errno) => return Err(failed(shown_as)(errno)),
    }
    if depth >= MAX_DEPTH {
        return Err(BeneathError::TooDeep(shown(shown_as)));
    }
    let dir = match rustix::fs::openat2(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH,
    ) {
        Ok(dir) => dir,
        Err(Errno::NOENT) => return Ok(()),
        // Swapped for a link or a file meanwhile: unlink that (the link itself).
        Err(Errno::LOOP) | Err(Errno::NOTDIR) => {
            return rustix::fs::unlinkat(parent, name, AtFlags::empty()).map_err(failed(shown_as))
        }
        Err(errno) => return Err(failed(shown_as)(errno)),
    };
    let mut first_error = None;
    for (child, _) in entries(&dir, shown_as)? {
        use std::os::unix::ffi::OsStrExt;
        let child = OsStr::from_bytes(child.to_bytes());
        if let Err(error) = remove_entry(&dir, child, shown_as, depth + 1) {
            first_error.get_or_insert(error);
        }
    }
    drop(dir);
    if let Some(error) = first_error {
        return Err(error);
    }
    match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(errno) => Err(failed(shown_as)(errno)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workspace root with a tenant tree, and a directory outside it holding a file.
    fn setup() -> (tempfile::TempDir, WorkspaceRoot, PathBuf) {
        let top = tempfile::tempdir().expect("tempdir");
        let root = top.path().join("root");
        std::fs::create_dir_all(root.join("acme/default/s1")).expect("mkdir");
        std::fs::write(root.join("acme/default/s1/f"), "x").expect("write");
        let outside = top.path().join("outside");
        std::fs::create_dir_all(outside.join("sub")).expect("mkdir");
        std::fs::write(outside.join("sub/precious"), "keep").expect("write");
        let workspace = WorkspaceRoot::open(&root).expect("open");
        (top, workspace, outside)
    }

    #[test]
    fn removing_through_a_link_anywhere_on_the_path_leaves_the_target_alone() {
        let (top, ws, outside) = setup();
        let root = top.path().join("root");
        // The host directory replaced by a link out of the tree.
        std::fs::rename(root.join("acme/default"), root.join("acme/default-old")).expect("mv");
        std::os::unix::fs::symlink(&outside, root.join("acme/default")).expect("ln");
        let error = ws.remove(&root.join("acme/default/sub")).expect_err("refused");
        assert!(matches!(error, BeneathError::Link(_)), "{error}");
        assert_eq!(
            std::fs::read_to_string(outside.join("sub/precious")).expect("kept"),
            "keep"
        );
        // The link at the last component is removed itself, its target kept.
        ws.remove(&root.join("acme/default")).expect("removes the link");
        assert!(outside.join("sub/precious").exists());
        assert!(root.join("acme/default").symlink_metadata().is_err());
        // A link inside a tree being removed goes, its target stays.
        std::os::unix::fs::symlink(&outside, root.join("acme/default-old/s1/out")).expect("ln");
        ws.remove(&root.join("acme/default-old")).expect("tree");
        assert!(!root.join("acme/default-old").exists());
        assert!(outside.join("sub/precious").exists());
        // Missing is fine; outside the root is refused.
        ws.remove(&root.join("acme/nothing/here")).expect("missing");
        assert!(ws.remove(&outside).is_err());
    }

    #[test]
    fn a_tree_deeper_than_the_walk_counts_as_over_quota_and_its_siblings_are_still_removed() {
        let (top, ws, _outside) = setup();
        let root = top.path().join("root");
        // Made level by level: the whole path is longer than one system call takes.
        let mut dir = std::fs::File::open(&root).expect("root");
        for name in ["acme", "deep"]
            .into_iter()
            .chain(std::iter::repeat_n("d", MAX_DEPTH + 2))
        {
            let _ = rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755));
            dir = std::fs::File::from(
                rustix::fs::openat(&dir, name, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                    .expect("open"),
            );
        }
        assert_eq!(
            ws.disk_usage(&root.join("acme")),
            u64::MAX,
            "unmeasurable counts as over"
        );
        std::fs::write(root.join("acme/sibling"), "x").expect("write");
        assert!(ws.remove(&root.join("acme")).is_err(), "the deep part stays");
        assert!(!root.join("acme/sibling").exists(), "its siblings went");
        assert!(!root.join("acme/default").exists());
    }

    #[test]
    fn creating_never_goes_through_a_link_and_measuring_never_follows_one() {
        let (top, ws, outside) = setup();
        let root = top.path().join("root");
        std::os::unix::fs::symlink(&outside, root.join("acme/link")).expect("ln");
        let error = ws
            .create_dirs(&root.join("acme/link/.ssh"), None, 0o700)
            .expect_err("refused");
        assert!(matches!(error, BeneathError::Link(_)), "{error}");
        assert!(!outside.join(".ssh").exists());
        ws.create_dirs(&root.join("acme/new/deep"), None, 0o700)
            .expect("made");
        assert!(root.join("acme/new/deep").is_dir());
        let inside = ws.disk_usage(&root.join("acme"));
        std::fs::write(outside.join("big"), vec![1u8; 1 << 20]).expect("write");
        assert_eq!(
            ws.disk_usage(&root.join("acme")),
            inside,
            "the link is not followed"
        );
        assert!(inside > 0);
        // A tree measured through a link is not measured: it counts as over any quota.
        assert_eq!(ws.disk_usage(&root.join("acme/link")), u64::MAX);
        assert_eq!(ws.disk_usage(&root.join("acme/missing")), 0);
        // A file written beneath never lands through a link.
        assert!(ws.write_file(&root.join("acme/link/marker"), b"x").is_err());
        assert!(!outside.join("marker").exists());
        ws.write_file(&root.join("acme/marker"), b"x").expect("write");
        assert_eq!(
            ws.read_file(&root.join("acme/marker"), 10).expect("read"),
            Some(b"x".to_vec())
        );
        assert_eq!(ws.subdirectories(&root.join("acme")).len(), 2, "default, new");
    }

    /// A directory made for an owner appears under its name already handed over: inotify on its parent sees
    /// the name arrive by a rename and never sees its attributes change (made as root's `0700` and handed over
    /// afterwards, the name would be created and then changed twice — and a file server running as the
    /// tenant could not watch it in between). The temporary name is the relay's, and gone.
    #[test]
    fn a_directory_made_for_an_owner_appears_under_its_name_already_handed_over() {
        use rustix::fs::inotify;

        let (top, ws, _) = setup();
        let parent = top.path().join("root/acme/default");
        // The test's own user (no privilege needed): a hand-over still changes the mode, from 0700 to 0750.
        let owner = UserSwitch {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        };
        let watch =
            inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK).expect("inotify");
        inotify::add_watch(
            &watch,
            &parent,
            inotify::WatchFlags::CREATE | inotify::WatchFlags::MOVED_TO | inotify::WatchFlags::ATTRIB,
        )
        .expect("watch");
        ws.create_dirs(&parent.join("s2/deep"), Some(owner), 0o750)
            .expect("made");

        let mut buffer = [std::mem::MaybeUninit::uninit(); 4096];
        let mut events = inotify::Reader::new(&watch, &mut buffer);
        let mut seen = Vec::new();
        loop {
            match events.next() {
                Ok(event) => seen.push((
                    event
                        .file_name()
                        .map(|name| name.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    event.events(),
                )),
                Err(Errno::AGAIN) => break,
                Err(errno) => panic!("reading inotify: {errno}"),
            }
        }
        let under_its_name: Vec<_> = seen.iter().filter(|(name, _)| name == "s2").collect();
        assert_eq!(
            under_its_name,
            [&(
                "s2".to_string(),
                inotify::ReadFlags::MOVED_TO | inotify::ReadFlags::ISDIR
            )],
            "{seen:?}"
        );
        assert!(
            seen.iter().all(|(name, _)| name == "s2" || is_temporary(name)),
            "{seen:?}"
        );
        for dir in [parent.join("s2"), parent.join("s2/deep")] {
            let stat = rustix::fs::stat(&dir).expect("stat");
            assert_eq!(
                (stat.st_uid, stat.st_mode & 0o7777),
                (owner.uid, 0o750),
                "{}",
                dir.display()
            );
        }
        let left: Vec<_> = std::fs::read_dir(&parent)
            .expect("list")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(left.len(), 2, "s1 and s2, no temporary name: {left:?}");
    }
}
