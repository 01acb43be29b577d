//! The files an agent may read and write through ACP `fs/read_text_file` / `fs/write_text_file`: regular files
//! inside its session's working directory, no bigger than a limit.
//!
//! The relay performs these outside the agent's sandbox, with its own privileges (root, in some deployments),
//! on paths the agent chose in a directory the agent can change at will. So paths are never resolved twice:
//! every file is opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` relative to the working
//! directory (the kernel refuses any `..`, absolute symlink or magic link that would leave it, however the tree
//! changes meanwhile), written files are opened without following a final symlink, and only regular files are
//! read or written: a FIFO or a device is refused instead of blocking the relay or feeding it without end.
//! Reads stop after the limit (plus one byte, to tell a larger file).

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use relay_sandbox::UserSwitch;
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};

/// Largest file an agent reads or writes through the relay.
pub const MAX_FILE_BYTES: usize = 8 * 1024 * 1024;

/// Why a file operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("{0} is outside the session's working directory")]
    Outside(String),
    #[error("{0} must be an absolute path")]
    NotAbsolute(String),
    #[error("{path} is larger than {MAX_FILE_BYTES} bytes")]
    TooBig { path: String },
    #[error("{0} is not a regular file")]
    NotARegularFile(String),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FsError + '_ {
    move |source| FsError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn errno(path: &Path) -> impl FnOnce(rustix::io::Errno) -> FsError + '_ {
    move |errno| match errno {
        // The kernel refused to leave the directory (RESOLVE_BENEATH), or a final symlink (O_NOFOLLOW).
        rustix::io::Errno::XDEV | rustix::io::Errno::LOOP => FsError::Outside(path.display().to_string()),
        errno => FsError::Io {
            path: path.display().to_string(),
            source: errno.into(),
        },
    }
}

/// `requested` as a path inside `root` (both resolved), or why not. The file itself need not exist; its
/// deepest existing ancestor must resolve inside `root`. Used to check a terminal's directory (the command then
/// runs in the session's sandbox, which shows nothing else).
pub fn confine(root: &Path, requested: &Path) -> Result<PathBuf, FsError> {
    let shown = || requested.display().to_string();
    if !requested.is_absolute() {
        return Err(FsError::NotAbsolute(shown()));
    }
    if requested.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(FsError::Outside(shown()));
    }
    let root = root.canonicalize().map_err(io(root))?;
    let mut existing = requested.to_path_buf();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name().map(ToOwned::to_owned), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => return Err(FsError::Outside(shown())),
        }
    }
    let mut resolved = existing.canonicalize().map_err(io(&existing))?;
    for name in rest.into_iter().rev() {
        resolved.push(name);
    }
    if resolved.starts_with(&root) {
        Ok(resolved)
    } else {
        Err(FsError::Outside(shown()))
    }
}

/// `requested` relative to `root`: it must be absolute and lie (as written) under `root`.
fn relative(root: &Path, requested: &Path) -> Result<PathBuf, FsError> {
    let shown = || requested.display().to_string();
    if !requested.is_absolute() {
        return Err(FsError::NotAbsolute(shown()));
    }
    let canonical_root = root.canonicalize().map_err(io(root))?;
    let rest = requested
        .strip_prefix(root)
        .or_else(|_| requested.strip_prefix(&canonical_root))
        .map_err(|_| FsError::Outside(shown()))?;
    if rest.as_os_str().is_empty() || rest.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(FsError::Outside(shown()));
    }
    Ok(rest.to_path_buf())
}

/// The session's working directory, opened beneath the (trusted) workspace root without following any
/// symlink on the way: an agent that swapped a directory of the path for a symlink gets a refusal.
fn open_root(anchor: &Path, root: &Path) -> Result<OwnedFd, FsError> {
    relay_sandbox::launch::open_beneath(anchor, root)
        .map_err(|error| FsError::Outside(format!("{} ({error})", root.display())))
}

const BENEATH: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// Read a text file inside `root` (a directory beneath the workspace root `anchor`), from 1-based `line`, at
/// most `limit` lines.
pub async fn read(
    anchor: &Path,
    root: &Path,
    requested: &Path,
    line: Option<u32>,
    limit: Option<u32>,
) -> Result<String, FsError> {
    let (anchor, root, requested) = (anchor.to_path_buf(), root.to_path_buf(), requested.to_path_buf());
    let text = tokio::task::spawn_blocking(move || read_blocking(&anchor, &root, &requested))
        .await
        .map_err(|error| FsError::Io {
            path: String::new(),
            source: std::io::Error::other(error),
        })??;
    if line.is_none() && limit.is_none() {
        return Ok(text);
    }
    let skip = line.map_or(0, |l| l.saturating_sub(1) as usize);
    let take = limit.map_or(usize::MAX, |l| l as usize);
    Ok(text.split_inclusive('\n').skip(skip).take(take).collect())
}

fn read_blocking(anchor: &Path, root: &Path, requested: &Path) -> Result<String, FsError> {
    let rest = relative(root, requested)?;
    let dir = open_root(anchor, root)?;
    let fd = rustix::fs::openat2(
        &dir,
        &rest,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH,
    )
    .map_err(errno(requested))?;
    let stat = rustix::fs::fstat(&fd).map_err(errno(requested))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(FsError::NotARegularFile(requested.display().to_string()));
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io(requested))?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err(FsError::TooBig {
            path: requested.display().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Write a text file inside `root` (beneath the workspace root `anchor`), creating its missing directories
/// (inside `root`); what the relay creates belongs to `owner` (the tenant's user, when there is one).
pub async fn write(
    anchor: &Path,
    root: &Path,
    requested: &Path,
    content: &str,
    owner: Option<UserSwitch>,
) -> Result<(), FsError> {
    if content.len() > MAX_FILE_BYTES {
        return Err(FsError::TooBig {
            path: requested.display().to_string(),
        });
    }
    let (anchor, root, requested, content) = (
        anchor.to_path_buf(),
        root.to_path_buf(),
        requested.to_path_buf(),
        content.to_string(),
    );
    tokio::task::spawn_blocking(move || write_blocking(&anchor, &root, &requested, &content, owner))
        .await
        .map_err(|error| FsError::Io {
            path: String::new(),
            source: std::io::Error::other(error),
        })?
}

fn write_blocking(
    anchor: &Path,
    root: &Path,
    requested: &Path,
    content: &str,
    owner: Option<UserSwitch>,
) -> Result<(), FsError> {
    let rest = relative(root, requested)?;
    let mut dir = open_root(anchor, root)?;
    let no_symlinks = BENEATH | ResolveFlags::NO_SYMLINKS;
    let components: Vec<_> = rest.components().collect();
    let Some((name, parents)) = components.split_last() else {
        return Err(FsError::Outside(requested.display().to_string()));
    };
    for parent in parents {
        match rustix::fs::mkdirat(&dir, parent.as_os_str(), Mode::from_raw_mode(0o755)) {
            Ok(()) => {
                if let Some(owner) = owner {
                    chown_at(&dir, parent.as_os_str(), owner).map_err(errno(requested))?;
                }
            }
            Err(rustix::io::Errno::EXIST) => {}
            Err(error) => return Err(errno(requested)(error)),
        }
        dir = rustix::fs::openat2(
            &dir,
            parent.as_os_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            no_symlinks,
        )
        .map_err(errno(requested))?;
    }
    let fd = rustix::fs::openat2(
        &dir,
        name.as_os_str(),
        OFlags::WRONLY
            | OFlags::CREATE
            | OFlags::NONBLOCK
            | OFlags::NOFOLLOW
            | OFlags::NOCTTY
            | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
        no_symlinks,
    )
    .map_err(errno(requested))?;
    let stat = rustix::fs::fstat(&fd).map_err(errno(requested))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(FsError::NotARegularFile(requested.display().to_string()));
    }
    rustix::fs::ftruncate(&fd, 0).map_err(errno(requested))?;
    if let Some(owner) = owner {
        if stat.st_uid == 0 {
            rustix::fs::fchown(
                &fd,
                Some(rustix::fs::Uid::from_raw(owner.uid)),
                Some(rustix::fs::Gid::from_raw(owner.gid)),
            )
            .map_err(errno(requested))?;
        }
    }
    let mut file = std::fs::File::from(fd);
    file.write_all(content.as_bytes()).map_err(io(requested))
}

fn chown_at(dir: &OwnedFd, name: &std::ffi::OsStr, owner: UserSwitch) -> Result<(), rustix::io::Errno> {
    rustix::fs::chownat(
        dir,
        name,
        Some(rustix::fs::Uid::from_raw(owner.uid)),
        Some(rustix::fs::Gid::from_raw(owner.gid)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_inside_the_working_directory_only() {
        let base = tempfile::tempdir().expect("tempdir");
        let root = base.path().join("session");
        let outside = base.path().join("outside");
        std::fs::create_dir_all(&root).expect("mkdir");
        std::fs::create_dir_all(&outside).expect("mkdir");
        std::os::unix::fs::symlink(&outside, root.join("link")).expect("symlink");
        std::os::unix::fs::symlink("../outside", root.join("relative-link")).expect("symlink");

        let anchor = base.path();
        write(
            anchor,
            &root,
            &root.join("sub/dir/a.txt"),
            "one\ntwo\nthree\n",
            None,
        )
        .await
        .expect("write inside");
        assert_eq!(
            read(anchor, &root, &root.join("sub/dir/a.txt"), Some(2), Some(1))
                .await
                .expect("read inside"),
            "two\n"
        );
        for escape in [
            root.join("../outside/x.txt"),
            outside.join("x.txt"),
            root.join("link/x.txt"),
            root.join("relative-link/x.txt"),
            PathBuf::from("relative.txt"),
        ] {
            assert!(
                write(anchor, &root, &escape, "x", None).await.is_err(),
                "{}",
                escape.display()
            );
        }
        assert!(
            std::fs::read_dir(&outside).expect("outside").next().is_none(),
            "nothing written outside"
        );
        std::fs::write(outside.join("secret"), "s").expect("write");
        assert!(read(anchor, &root, &root.join("link/secret"), None, None)
            .await
            .is_err());
        assert!(
            read(anchor, &root, &root.join("relative-link/secret"), None, None)
                .await
                .is_err()
        );
        // A final symlink is not written through, even to a file inside.
        std::os::unix::fs::symlink(root.join("sub/dir/a.txt"), root.join("alias")).expect("symlink");
        assert!(write(anchor, &root, &root.join("alias"), "x", None)
            .await
            .is_err());
        // The working directory itself swapped for a symlink (by another session of the tenant, say): refused.
        let moved = base.path().join("moved");
        std::fs::rename(&root, &moved).expect("move the session away");
        std::os::unix::fs::symlink(&outside, &root).expect("symlink in its place");
        assert!(read(anchor, &root, &root.join("secret"), None, None)
            .await
            .is_err());
        assert!(write(anchor, &root, &root.join("planted"), "x", None)
            .await
            .is_err());
        assert!(!outside.join("planted").exists());
    }

    #[tokio::test]
    async fn a_fifo_or_a_device_is_refused_at_once_and_a_big_file_by_its_size() {
        let base = tempfile::tempdir().expect("tempdir");
        let root = base.path();
        let anchor = root;
        let fifo = root.join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .expect("mkfifo");
        let refused = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            read(anchor, root, &fifo, None, None),
        )
        .await
        .expect("a FIFO must not block the read");
        assert!(matches!(refused, Err(FsError::NotARegularFile(_))), "{refused:?}");
        let written = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            write(anchor, root, &fifo, "x", None),
        )
        .await
        .expect("a FIFO must not block the write");
        assert!(written.is_err(), "{written:?}");
        let big = root.join("big");
        std::fs::File::create(&big)
            .and_then(|file| file.set_len(MAX_FILE_BYTES as u64 + 10))
            .expect("big file");
        assert!(matches!(
            read(anchor, root, &big, None, None).await,
            Err(FsError::TooBig { .. })
        ));
    }
}
