//! The files an agent may read and write through ACP `fs/read_text_file` / `fs/write_text_file`: those inside
//! its session's working directory, after resolving `..` and symlinks, and no bigger than a limit.

use std::path::{Component, Path, PathBuf};

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
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FsError + '_ {
    move |source| FsError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// `requested` as a path inside `root` (both resolved), or why not. The file itself need not exist; its
/// deepest existing ancestor must resolve inside `root`.
pub fn confine(root: &Path, requested: &Path) -> Result<PathBuf, FsError> {
    let shown = || requested.display().to_string();
    if !requested.is_absolute() {
        return Err(FsError::NotAbsolute(shown()));
    }
    if requested.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(FsError::Outside(shown()));
    }
    let root = root.canonicalize().map_err(io(root))?;
    // The deepest part of the path that exists, resolved (symlinks followed), then the rest appended.
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

/// Read a text file inside `root`, from 1-based `line`, at most `limit` lines.
pub async fn read(
    root: &Path,
    requested: &Path,
    line: Option<u32>,
    limit: Option<u32>,
) -> Result<String, FsError> {
    let path = confine(root, requested)?;
    let size = tokio::fs::metadata(&path).await.map_err(io(&path))?.len();
    if size > MAX_FILE_BYTES as u64 {
        return Err(FsError::TooBig {
            path: requested.display().to_string(),
        });
    }
    let text = tokio::fs::read_to_string(&path).await.map_err(io(&path))?;
    if line.is_none() && limit.is_none() {
        return Ok(text);
    }
    let skip = line.map_or(0, |l| l.saturating_sub(1) as usize);
    let take = limit.map_or(usize::MAX, |l| l as usize);
    Ok(text.split_inclusive('\n').skip(skip).take(take).collect())
}

/// Write a text file inside `root`, creating its missing directories (inside `root`).
pub async fn write(root: &Path, requested: &Path, content: &str) -> Result<(), FsError> {
    if content.len() > MAX_FILE_BYTES {
        return Err(FsError::TooBig {
            path: requested.display().to_string(),
        });
    }
    let path = confine(root, requested)?;
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent).await.map_err(io(parent))?;
    }
    tokio::fs::write(&path, content).await.map_err(io(&path))
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

        write(&root, &root.join("sub/dir/a.txt"), "one\ntwo\nthree\n")
            .await
            .expect("write inside");
        assert_eq!(
            read(&root, &root.join("sub/dir/a.txt"), Some(2), Some(1))
                .await
                .expect("read inside"),
            "two\n"
        );
        for escape in [
            root.join("../outside/x.txt"),
            outside.join("x.txt"),
            root.join("link/x.txt"),
            PathBuf::from("relative.txt"),
        ] {
            assert!(write(&root, &escape, "x").await.is_err(), "{}", escape.display());
        }
        assert!(
            std::fs::read_dir(&outside).expect("outside").next().is_none(),
            "nothing written outside"
        );
        std::fs::write(outside.join("secret"), "s").expect("write");
        assert!(read(&root, &root.join("link/secret"), None, None).await.is_err());
    }
}
