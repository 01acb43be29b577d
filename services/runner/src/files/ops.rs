//! The file operations of AHP's `resource*` commands on a tenant's directory, as the tenant's file server runs
//! them inside the tenant's sandbox ([`super::server`]): every path is resolved (symlinks followed, except a
//! final one where the operation acts on the link itself) and refused unless it lies inside the tenant's root,
//! before anything is touched. Reads and writes are bounded; a file being replaced is written to a temporary
//! file beside it and renamed over it, so no reader ever sees half of it.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use base64::Engine;

use super::protocol::{EntryKind, FileError, FileOp, FileReply, Resolved, WriteMode};

/// What names the temporary file of a write (`.<name>.ahp-<id>.tmp`), and whether a name is one (or a directory
/// the relay is making): the relay's own temporary names, which no watch reports.
pub use relay_sandbox::beneath::{is_temporary, TEMPORARY_MARK};

/// A tenant's files.
pub struct Files {
    /// The tenant's directory, resolved.
    pub(crate) root: PathBuf,
    /// Largest file read or written.
    pub(crate) max_bytes: u64,
    /// Most entries a directory listing returns, or a tree copy creates.
    pub(crate) max_entries: usize,
    /// The server's private directory (its sandbox's `$HOME`, outside the root): where checkpoints live.
    pub(crate) state_dir: Option<PathBuf>,
    /// This server's exclusive lock on its checkpoints (`flock`, held while it lives), once taken: only its
    /// holder may take the git locks it finds for stale ([`super::history`]).
    pub(crate) checkpoints_lock: std::sync::Mutex<Option<fs::File>>,
    /// Taken by every operation that runs git: they go one at a time (they share the checkpoints' repository,
    /// and a stale lock is cleared only while no git of this server runs), while reads go on beside them.
    pub(crate) git_lane: std::sync::Mutex<()>,
    /// Taken by every operation that changes files (after the git lane, for git's): changes go one at a time,
    /// so an `ifMatch` check and its rename, or an insert's read and rewrite, are not interleaved.
    pub(crate) change_lane: std::sync::Mutex<()>,
}

/// Most entries a listing returns (a bigger directory is refused, naming the limit).
pub const MAX_ENTRIES: usize = 10_000;

pub(crate) fn io_error(path: &Path, error: std::io::Error) -> FileError {
    let shown = path.display();
    match error.kind() {
        std::io::ErrorKind::NotFound => FileError::NotFound(format!("{shown} does not exist")),
        std::io::ErrorKind::AlreadyExists => FileError::AlreadyExists(format!("{shown} already exists")),
        std::io::ErrorKind::PermissionDenied => {
            FileError::PermissionDenied(format!("{shown}: permission denied"))
        }
        std::io::ErrorKind::DirectoryNotEmpty => {
            FileError::Invalid(format!("{shown} is a directory that is not empty"))
        }
        std::io::ErrorKind::NotADirectory => {
            FileError::NotFound(format!("{shown}: a part of the path is not a directory"))
        }
        std::io::ErrorKind::IsADirectory => FileError::Invalid(format!("{shown} is a directory")),
        _ => FileError::Unavailable(format!("{shown}: {error}")),
    }
}

/// The version of a file as `resourceResolve` reports it and `ifMatch` checks it.
pub(crate) fn etag(meta: &fs::Metadata) -> String {
    format!(
        "{:x}-{:x}-{:x}.{:x}",
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec()
    )
}

pub(crate) fn timestamp(seconds: i64, nanos: i64) -> Option<String> {
    jiff::Timestamp::new(seconds, i32::try_from(nanos).ok()?)
        .ok()
        .map(|t| format!("{t:.3}"))
}

pub(crate) fn kind_of(meta: &fs::Metadata) -> EntryKind {
    if meta.file_type().is_symlink() {
        EntryKind::Symlink
    } else if meta.is_dir() {
        EntryKind::Directory
    } else {
        EntryKind::File
    }
}

/// A content type from a file's first bytes (magic numbers), else its name, else whether it is text.
pub(crate) fn sniff(path: &Path, bytes: &[u8]) -> (String, bool) {
    let text = std::str::from_utf8(bytes).is_ok() && !bytes.contains(&0);
    if let Some(kind) = infer::get(bytes) {
        return (kind.mime_type().to_string(), false);
    }
    let guessed = mime_guess::from_path(path).first_raw();
    match guessed {
        Some(mime) if text || !mime.starts_with("text/") => (mime.to_string(), text),
        _ if text => ("text/plain".into(), true),
        _ => ("application/octet-stream".into(), false),
    }
}

impl Files {
    pub fn new(root: &Path, max_bytes: u64) -> Result<Files, FileError> {
        let root = root
            .canonicalize()
            .map_err(|error| FileError::Unavailable(format!("the workspace {}: {error}", root.display())))?;
        Ok(Files {
            root,
            max_bytes,
            max_entries: MAX_ENTRIES,
            state_dir: None,
            checkpoints_lock: std::sync::Mutex::new(None),
            git_lane: std::sync::Mutex::new(()),
            change_lane: std::sync::Mutex::new(()),
        })
    }

    /// Keep the server's own state (checkpoints) in `dir`, which must lie outside the root.
    pub fn with_state_dir(mut self, dir: PathBuf) -> Files {
        self.state_dir = (!dir.starts_with(&self.root)).then_some(dir);
        self
    }

    /// Where the server keeps its own state, if anywhere.
    pub(crate) fn state_dir(&self) -> Option<&Path> {
        self.state_dir.as_deref()
    }

    /// Largest file read or written.
    pub(crate) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// `requested` resolved inside the root: every existing part's symlinks followed (the last one's only when
    /// `follow_last`), or PermissionDenied when it leads outside. What does not exist yet is kept as named.
    pub(crate) fn confine(&self, requested: &str, follow_last: bool) -> Result<PathBuf, FileError> {
        let path = Path::new(requested);
        if !path.is_absolute() {
            return Err(FileError::Invalid(format!("{requested} is not an absolute path")));
        }
        if path.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(FileError::PermissionDenied(format!(
                "{requested}: '..' is not allowed"
            )));
        }
        let outside =
            || FileError::PermissionDenied(format!("{requested} is outside this tenant's workspace"));
        let (base, last) = match (follow_last, path.parent(), path.file_name()) {
            (false, Some(parent), Some(name)) => (parent.to_path_buf(), Some(name.to_owned())),
            _ => (path.to_path_buf(), None),
        };
        // The deepest existing ancestor, resolved; the rest appended as named.
        let mut existing = base.clone();
        let mut rest = Vec::new();
        let resolved = loop {
            match existing.canonicalize() {
                Ok(resolved) => break resolved,
                // A symlink whose target cannot be resolved (it does not exist, or not in this sandbox's view):
                // one that points out of the root is refused as such, not reported missing.
                Err(_) if self.points_outside(&existing) => return Err(outside()),
                Err(_) => match (existing.file_name().map(ToOwned::to_owned), existing.parent()) {
                    (Some(name), Some(parent)) => {
                        rest.push(name);
                        existing = parent.to_path_buf();
                    }
                    _ => return Err(outside()),
                },
            }
        };
        let mut full = resolved;
        for name in rest.into_iter().rev() {
            full.push(name);
        }
        if let Some(name) = last {
            full.push(name);
        }
        if full.starts_with(&self.root) {
            Ok(full)
        } else {
            Err(outside())
        }
    }

    /// Whether `path` is a symlink whose target (read, not resolved) lies outside the root.
    pub(crate) fn points_outside(&self, path: &Path) -> bool {
        let Ok(meta) = fs::symlink_metadata(path) else {
            return false;
        };
        if !meta.file_type().is_symlink() {
            return false;
        }
        let Ok(target) = fs::read_link(path) else {
            return true;
        };
        let target = match path.parent() {
            Some(parent) if target.is_relative() => parent.join(target),
            _ => target,
        };
        // Lexically: `..` steps back a component.
        let mut normal = PathBuf::new();
        for component in target.components() {
            match component {
                Component::ParentDir => {
                    normal.pop();
                }
                Component::CurDir => {}
                other => normal.push(other),
            }
        }
        !normal.starts_with(&self.root)
    }

    /// Run `op`; those that run git wait for the git lane, those that change files for the change lane
    /// (cancelled meanwhile: they do not start).
    pub fn run(&self, op: FileOp) -> Result<FileReply, FileError> {
        let _git = op.runs_git().then(|| lane(&self.git_lane));
        let _changes = op.changes_files().then(|| lane(&self.change_lane));
        if super::cancel::cancelled() {
            return Err(FileError::Unavailable("cancelled".into()));
        }
        match op {
            FileOp::Read { path } => self.read(&path),
            FileOp::Write {
                path,
                data,
                create_only,
                mode,
                position,
                if_match,
            } => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .map_err(|error| FileError::Invalid(format!("the data is not base64: {error}")))?;
                self.write(&path, &bytes, create_only, mode, position, if_match.as_deref())
            }
            FileOp::List { path } => self.list(&path),
            FileOp::Copy {
                source,
                destination,
                fail_if_exists,
            } => self.copy(&source, &destination, fail_if_exists),
            FileOp::Move {
                source,
                destination,
                fail_if_exists,
            } => self.rename(&source, &destination, fail_if_exists),
            FileOp::Delete { path, recursive } => self.delete(&path, recursive),
            FileOp::Resolve {
                path,
                follow_symlinks,
            } => self.resolve(&path, follow_symlinks),
            FileOp::Mkdir { path } => self.mkdir(&path),
            FileOp::Checkpoint {
                workspace,
                label,
                session,
            } => self.checkpoint(&workspace, &label, session.as_deref()),
            FileOp::Changes { from, to } => self.changes(&from, &to),
            FileOp::ReadVersion { object, path } => self.read_version(&object, &path),
            FileOp::ForgetCheckpoints { workspace, session } => {
                self.forget_checkpoints(&workspace, session.as_deref())
            }
            FileOp::Restore {
                workspace,
                commit,
                paths,
            } => self.restore(&workspace, &commit, &paths),
            FileOp::Repository { workspace, action } => self.repository(&workspace, action),
            FileOp::Find {
                workspace,
                query,
                limit,
            } => self.find(&workspace, &query, limit),
            FileOp::Watch { .. } | FileOp::Unwatch { .. } => Err(FileError::Invalid(
                "watches are the file server's, not a file operation".into(),
            )),
        }
    }

    pub(crate) fn too_big(&self, path: &Path) -> FileError {
        FileError::Invalid(format!(
            "{} is larger than this relay's limit of {} bytes",
            path.display(),
            self.max_bytes
        ))
    }

    /// The bytes of a regular file, at most the limit.
    pub(crate) fn read_bounded(&self, path: &Path) -> Result<Vec<u8>, FileError> {
        use std::io::Read;
        let meta = fs::metadata(path).map_err(|e| io_error(path, e))?;
        if meta.is_dir() {
            return Err(FileError::Invalid(format!("{} is a directory", path.display())));
        }
        if !meta.is_file() {
            return Err(FileError::Invalid(format!(
                "{} is not a regular file",
                path.display()
            )));
        }
        if meta.len() > self.max_bytes {
            return Err(self.too_big(path));
        }
        let mut bytes = Vec::new();
        // A file swapped for a FIFO or a symlink meanwhile is neither waited on nor followed.
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc_flags())
                .open(path)
        };
        file.map_err(|e| io_error(path, e))?
            .take(self.max_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error(path, e))?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(self.too_big(path));
        }
        Ok(bytes)
    }

    pub(crate) fn read(&self, requested: &str) -> Result<FileReply, FileError> {
        let path = self.confine(requested, true)?;
        let bytes = self.read_bounded(&path)?;
        let (content_type, text) = sniff(&path, &bytes);
        Ok(FileReply::Read {
            data: base64::engine::general_purpose::STANDARD.encode(&bytes),
            content_type,
            text,
        })
    }

    pub(crate) fn write(
        &self,
        requested: &str,
        data: &[u8],
        create_only: bool,
        mode: WriteMode,
        position: u64,
        if_match: Option<&str>,
    ) -> Result<FileReply, FileError> {
        let path = self.confine(requested, true)?;
        let current = match fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => {
                return Err(FileError::Invalid(format!("{} is a directory", path.display())))
            }
            Ok(meta) => Some(meta),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(io_error(&path, error)),
        };
        if create_only && current.is_some() {
            return Err(FileError::AlreadyExists(format!(
                "{} already exists",
                path.display()
            )));
        }
        if let Some(expected) = if_match {
            let now = current.as_ref().map(etag);
            if now.as_deref() != Some(expected) {
                return Err(FileError::Conflict(format!(
                    "{} changed since it was resolved (etag {} is not {expected})",
                    path.display(),
                    now.as_deref().unwrap_or("none: the file does not exist")
                )));
            }
        }
        // Appending at the end: `O_APPEND` on the file itself, so that concurrent appenders (another request, a
        // process writing through `>>`) never clobber each other, whatever the file's size.
        if mode == WriteMode::Append && position == 0 {
            if data.len() as u64 > self.max_bytes {
                return Err(self.too_big(&path));
            }
            let appended = (|| {
                use std::os::unix::fs::OpenOptionsExt;
                // Never waits on a FIFO the agent made: opened without blocking, and refused unless a file.
                let mut file = fs::OpenOptions::new()
                    .append(true)
                    .create(current.is_none())
                    .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
                    .open(&path)?;
                if !file.metadata()?.is_file() {
                    return Err(std::io::Error::other("not a regular file"));
                }
                file.write_all(data)
            })();
            return appended
                .map(|()| FileReply::Done)
                .map_err(|error| io_error(&path, error));
        }
        let existing = match &current {
            Some(_) => self.read_bounded(&path)?,
            None => Vec::new(),
        };
        let length = existing.len() as u64;
        let beyond = || {
            FileError::Invalid(format!(
                "position {position} is beyond the end of {} ({length} bytes)",
                path.display()
            ))
        };
        let at = match mode {
            WriteMode::Truncate | WriteMode::Insert => position,
            WriteMode::Append => length.checked_sub(position).ok_or_else(beyond)?,
        };
        if at > length {
            return Err(beyond());
        }
        let at = at as usize;
        let keep_after = !matches!(mode, WriteMode::Truncate);
        let total = at + data.len() + if keep_after { existing.len() - at } else { 0 };
        if total as u64 > self.max_bytes {
            return Err(self.too_big(&path));
        }
        let mut content = Vec::with_capacity(total);
        content.extend_from_slice(&existing[..at]);
        content.extend_from_slice(data);
        if keep_after {
            content.extend_from_slice(&existing[at..]);
        }
        self.replace(&path, &content, current.as_ref(), create_only)
    }

    /// Write `content` to a temporary file beside `path` and rename it over `path` (which keeps its mode).
    pub(crate) fn replace(
        &self,
        path: &Path,
        content: &[u8],
        current: Option<&fs::Metadata>,
        create_only: bool,
    ) -> Result<FileReply, FileError> {
        let parent = path
            .parent()
            .ok_or_else(|| FileError::Invalid(format!("{} has no directory", path.display())))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temporary = parent.join(format!(
            ".{name}{TEMPORARY_MARK}{}.tmp",
            uuid::Uuid::new_v4().simple()
        ));
        let written = (|| {
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temporary)?;
            file.write_all(content)?;
            if let Some(meta) = current {
                file.set_permissions(meta.permissions())?;
            }
            file.sync_all()
        })();
        if let Err(error) = written {
            let _ = fs::remove_file(&temporary);
            return Err(io_error(path, error));
        }
        // createOnly: the name must still be free (link fails if it was taken meanwhile); else replace.
        let placed = if create_only {
            fs::hard_link(&temporary, path).and_then(|()| fs::remove_file(&temporary))
        } else {
            fs::rename(&temporary, path)
        };
        if let Err(error) = placed {
            let _ = fs::remove_file(&temporary);
            return Err(io_error(path, error));
        }
        Ok(FileReply::Done)
    }

    pub(crate) fn list(&self, requested: &str) -> Result<FileReply, FileError> {
        let path = self.confine(requested, true)?;
        let meta = fs::metadata(&path).map_err(|e| io_error(&path, e))?;
        if !meta.is_dir() {
            return Err(FileError::Invalid(format!(
                "{} is not a directory",
                path.display()
            )));
        }
        let mut entries = Vec::new();
        for entry in fs::read_dir(&path).map_err(|e| io_error(&path, e))? {
            if entries.len() == self.max_entries {
                return Err(FileError::Invalid(format!(
                    "{} has more than {} entries, this relay's limit for a listing",
                    path.display(),
                    self.max_entries
                )));
            }
            let entry = entry.map_err(|e| io_error(&path, e))?;
            let kind = match entry.file_type() {
                Ok(kind) if kind.is_dir() => EntryKind::Directory,
                Ok(kind) if kind.is_symlink() => match fs::metadata(entry.path()) {
                    Ok(target) if target.is_dir() => EntryKind::Directory,
                    Ok(_) => EntryKind::File,
                    Err(_) => EntryKind::Symlink,
                },
                _ => EntryKind::File,
            };
            entries.push((entry.file_name().to_string_lossy().into_owned(), kind));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(FileReply::Listed { entries })
    }

    pub(crate) fn resolve(&self, requested: &str, follow_symlinks: bool) -> Result<FileReply, FileError> {
        let path = self.confine(requested, follow_symlinks)?;
        let meta = if follow_symlinks {
            fs::metadata(&path)
        } else {
            fs::symlink_metadata(&path)
        }
        .map_err(|e| io_error(&path, e))?;
        let kind = kind_of(&meta);
        // Only a regular file is opened (a FIFO would block), and without waiting on it.
        let content_type = meta
            .is_file()
            .then(|| {
                use std::io::Read;
                use std::os::unix::fs::OpenOptionsExt;
                let mut head = Vec::new();
                fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc_flags())
                    .open(&path)
                    .ok()?
                    .take(8192)
                    .read_to_end(&mut head)
                    .ok()?;
                Some(sniff(&path, &head).0)
            })
            .flatten();
        Ok(FileReply::Resolved(Resolved {
            path: path.display().to_string(),
            kind,
            size: (kind != EntryKind::Directory).then_some(meta.size()),
            mtime: timestamp(meta.mtime(), meta.mtime_nsec()),
            ctime: timestamp(meta.ctime(), meta.ctime_nsec()),
            content_type,
            etag: (kind == EntryKind::File).then(|| etag(&meta)),
        }))
    }
}

/// `O_NONBLOCK | O_NOFOLLOW`, for opening what may be a FIFO or a symlink without following or waiting.
pub(crate) fn libc_flags() -> i32 {
    (rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOFOLLOW).bits() as i32
}

/// A lane of operations that go one at a time (a panic of one does not close it).
pub(crate) fn lane(lane: &std::sync::Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    lane.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> (tempfile::TempDir, Files) {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = Files::new(dir.path(), 1024).expect("files");
        (dir, files)
    }

    fn path(dir: &tempfile::TempDir, name: &str) -> String {
        dir.path()
            .canonicalize()
            .expect("root")
            .join(name)
            .display()
            .to_string()
    }

    fn write(
        files: &Files,
        at: &str,
        data: &[u8],
        mode: WriteMode,
        position: u64,
    ) -> Result<FileReply, FileError> {
        files.run(FileOp::Write {
            path: at.into(),
            data: base64::engine::general_purpose::STANDARD.encode(data),
            create_only: false,
            mode,
            position,
            if_match: None,
        })
    }

    #[test]
    fn write_modes_place_the_data_where_the_spec_says() {
        let (dir, files) = files();
        let at = path(&dir, "f.txt");
        write(&files, &at, b"hello world", WriteMode::Truncate, 0).expect("create");
        write(&files, &at, b"there", WriteMode::Truncate, 6).expect("truncate at 6");
        assert_eq!(fs::read(&at).expect("read"), b"hello there");
        write(&files, &at, b"!", WriteMode::Append, 0).expect("append at the end");
        write(&files, &at, b",", WriteMode::Append, 7).expect("append 7 back from the end");
        assert_eq!(fs::read(&at).expect("read"), b"hello, there!");
        write(&files, &at, b">> ", WriteMode::Insert, 0).expect("insert at 0");
        assert_eq!(fs::read(&at).expect("read"), b">> hello, there!");
        assert!(matches!(
            write(&files, &at, b"x", WriteMode::Insert, 99),
            Err(FileError::Invalid(_))
        ));
        assert!(matches!(
            write(&files, &at, b"x", WriteMode::Append, 99),
            Err(FileError::Invalid(_))
        ));
        // No temporary file is left beside it.
        assert_eq!(fs::read_dir(dir.path()).expect("list").count(), 1);
    }

    /// Issue 33 (7): an append is written where the file ends, on the file itself: a process appending through
    /// its own `>>` descriptor between our appends loses nothing, and a file past the read limit takes appends.
    #[test]
    fn appends_never_clobber_another_appender_and_work_past_the_read_limit() {
        use std::io::Write;
        let (dir, files) = files();
        let at = path(&dir, "log.txt");
        fs::write(&at, vec![b'.'; 2000]).expect("a file past the 1024-byte limit");
        let mut theirs = fs::OpenOptions::new()
            .append(true)
            .open(&at)
            .expect("another appender");
        for i in 0..100 {
            write(
                &files,
                &at,
                format!("ours-{i}\n").as_bytes(),
                WriteMode::Append,
                0,
            )
            .expect("append");
            theirs
                .write_all(format!("theirs-{i}\n").as_bytes())
                .expect("theirs");
        }
        let text = fs::read_to_string(&at).expect("read");
        let lost: Vec<String> = (0..100)
            .flat_map(|i| [format!("ours-{i}\n"), format!("theirs-{i}\n")])
            .filter(|line| !text.contains(line.as_str()))
            .collect();
        assert!(lost.is_empty(), "lines lost: {lost:?}");
        assert!(text.starts_with(&".".repeat(2000)));
    }

    #[test]
    fn a_file_over_the_limit_is_refused_naming_the_limit_and_left_as_it_was() {
        let (dir, files) = files();
        let at = path(&dir, "big.bin");
        fs::write(&at, vec![7u8; 2000]).expect("seed");
        let error = files.run(FileOp::Read { path: at.clone() }).expect_err("too big");
        assert!(error.to_string().contains("1024 bytes"), "{error}");
        let small = path(&dir, "small.txt");
        write(&files, &small, b"ok", WriteMode::Truncate, 0).expect("small");
        let error = write(&files, &small, &[b'x'; 1100], WriteMode::Append, 0).expect_err("too big");
        assert!(error.to_string().contains("1024 bytes"), "{error}");
        assert_eq!(fs::read(&small).expect("read"), b"ok");
    }

    #[test]
    fn paths_out_of_the_root_are_refused() {
        let (dir, files) = files();
        let outside = tempfile::tempdir().expect("outside");
        std::os::unix::fs::symlink(outside.path(), dir.path().join("escape")).expect("symlink");
        for requested in [
            outside.path().join("x").display().to_string(),
            format!("{}/../x", dir.path().display()),
            path(&dir, "escape/x"),
            "relative/x".to_string(),
        ] {
            let refused = write(&files, &requested, b"x", WriteMode::Truncate, 0);
            assert!(
                matches!(
                    refused,
                    Err(FileError::PermissionDenied(_)) | Err(FileError::Invalid(_))
                ),
                "{requested}: {refused:?}"
            );
        }
        assert_eq!(
            fs::read_dir(outside.path()).expect("list").count(),
            0,
            "nothing written outside"
        );
        // A link to somewhere that does not exist (or that the sandbox does not show) out of the root.
        std::os::unix::fs::symlink("/nonexistent/elsewhere", dir.path().join("dangling")).expect("symlink");
        assert!(matches!(
            files.run(FileOp::Read {
                path: path(&dir, "dangling/x")
            }),
            Err(FileError::PermissionDenied(_))
        ));
        // The link itself (not its target) may be resolved, moved and deleted.
        let link = files
            .run(FileOp::Resolve {
                path: path(&dir, "escape"),
                follow_symlinks: false,
            })
            .expect("lstat");
        assert!(matches!(
            link,
            FileReply::Resolved(Resolved {
                kind: EntryKind::Symlink,
                ..
            })
        ));
        assert!(matches!(
            files.run(FileOp::Resolve {
                path: path(&dir, "escape"),
                follow_symlinks: true
            }),
            Err(FileError::PermissionDenied(_))
        ));
        files
            .run(FileOp::Delete {
                path: path(&dir, "escape"),
                recursive: false,
            })
            .expect("delete the link");
        assert!(outside.path().exists());
    }

    #[test]
    fn a_copy_never_replaces_the_root_or_what_holds_its_source() {
        let (dir, files) = files();
        files
            .run(FileOp::Mkdir {
                path: path(&dir, "a/b"),
            })
            .expect("mkdir");
        write(&files, &path(&dir, "a/b/f"), b"x", WriteMode::Truncate, 0).expect("file");
        write(&files, &path(&dir, "keep"), b"k", WriteMode::Truncate, 0).expect("file");
        for (source, destination) in [("a", ""), ("a/b", "a"), ("a/b/f", ""), ("a/b/f", "a")] {
            let copied = files.run(FileOp::Copy {
                source: path(&dir, source),
                destination: path(&dir, destination).trim_end_matches('/').to_string(),
                fail_if_exists: false,
            });
            assert!(
                matches!(copied, Err(FileError::PermissionDenied(_))),
                "{source} -> {destination}: {copied:?}"
            );
        }
        assert_eq!(fs::read(path(&dir, "a/b/f")).expect("kept"), b"x");
        assert_eq!(fs::read(path(&dir, "keep")).expect("kept"), b"k");
        // A tree over an existing one replaces it only once copied.
        files
            .run(FileOp::Mkdir {
                path: path(&dir, "c"),
            })
            .expect("mkdir");
        files
            .run(FileOp::Copy {
                source: path(&dir, "a"),
                destination: path(&dir, "c"),
                fail_if_exists: false,
            })
            .expect("copy over");
        assert_eq!(fs::read(path(&dir, "c/b/f")).expect("copied"), b"x");
        assert!(!fs::read_dir(dir.path()).expect("list").any(|e| e
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .ends_with(".tmp")));
    }

    #[test]
    fn a_fifo_is_resolved_without_being_opened_and_never_read() {
        let (dir, files) = files();
        let fifo = path(&dir, "pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        let resolved = files
            .run(FileOp::Resolve {
                path: fifo.clone(),
                follow_symlinks: true,
            })
            .expect("resolve");
        assert!(
            matches!(
                resolved,
                FileReply::Resolved(Resolved {
                    content_type: None,
                    ..
                })
            ),
            "{resolved:?}"
        );
        assert!(matches!(
            files.run(FileOp::Read { path: fifo }),
            Err(FileError::Invalid(_))
        ));
    }

    #[test]
    fn a_listing_is_bounded() {
        let (dir, mut files) = files();
        files.max_entries = 3;
        for name in ["a", "b", "c", "d"] {
            write(&files, &path(&dir, name), b"x", WriteMode::Truncate, 0).expect("file");
        }
        let listed = files.run(FileOp::List {
            path: dir.path().display().to_string(),
        });
        assert!(
            matches!(&listed, Err(FileError::Invalid(m)) if m.contains("more than 3 entries")),
            "{listed:?}"
        );
    }

    #[test]
    fn mkdir_is_mkdir_p_and_an_existing_file_is_already_exists() {
        let (dir, files) = files();
        files
            .run(FileOp::Mkdir {
                path: path(&dir, "a/b/c"),
            })
            .expect("mkdir -p");
        files
            .run(FileOp::Mkdir {
                path: path(&dir, "a/b/c"),
            })
            .expect("again: no-op");
        write(&files, &path(&dir, "a/f"), b"x", WriteMode::Truncate, 0).expect("file");
        assert!(matches!(
            files.run(FileOp::Mkdir {
                path: path(&dir, "a/f")
            }),
            Err(FileError::AlreadyExists(_))
        ));
        assert!(matches!(
            files.run(FileOp::Mkdir {
                path: path(&dir, "a/f/g")
            }),
            Err(FileError::AlreadyExists(_))
        ));
    }

    #[test]
    fn binary_is_sniffed_and_text_is_text() {
        let (dir, files) = files();
        let png = path(&dir, "pixel");
        fs::write(&png, b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").expect("png");
        let FileReply::Read {
            content_type, text, ..
        } = files.run(FileOp::Read { path: png }).expect("read")
        else {
            panic!("not a read")
        };
        assert_eq!((content_type.as_str(), text), ("image/png", false));
        let notes = path(&dir, "notes.md");
        fs::write(&notes, "# hi\n").expect("md");
        let FileReply::Read {
            content_type, text, ..
        } = files.run(FileOp::Read { path: notes }).expect("read")
        else {
            panic!("not a read")
        };
        assert_eq!((content_type.as_str(), text), ("text/markdown", true));
    }
}
