//! Operations on whole trees of the tenant's workspace: copying (staged, within the byte budget, never over the
//! root or what holds its source), renaming, deleting and making directories.

use std::fs;
use std::path::{Path, PathBuf};

use super::ops::*;
use super::protocol::{FileError, FileReply};

impl Files {
    pub(crate) fn copy(
        &self,
        source: &str,
        destination: &str,
        fail_if_exists: bool,
    ) -> Result<FileReply, FileError> {
        let from = self.confine(source, true)?;
        let to = self.confine(destination, false)?;
        let meta = fs::metadata(&from).map_err(|e| io_error(&from, e))?;
        let exists = fs::symlink_metadata(&to).is_ok();
        if exists && fail_if_exists {
            return Err(FileError::AlreadyExists(format!(
                "{} already exists",
                to.display()
            )));
        }
        // The root is never replaced, nor is anything the source lies in (or lies in the source).
        if to == self.root || from.starts_with(&to) {
            return Err(FileError::PermissionDenied(format!(
                "{} holds {}: copying onto it would remove what is copied",
                to.display(),
                from.display()
            )));
        }
        if to.starts_with(&from) && meta.is_dir() {
            return Err(FileError::Invalid(format!(
                "cannot copy {} into itself",
                from.display()
            )));
        }
        if meta.is_dir() {
            // Copied beside the destination first; only a complete copy replaces what was there.
            let parent = to
                .parent()
                .ok_or_else(|| FileError::Invalid(format!("{} has no directory", to.display())))?;
            let name = to
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let staging = parent.join(format!(
                ".{name}{TEMPORARY_MARK}{}.tmp",
                uuid::Uuid::new_v4().simple()
            ));
            let mut budget = CopyBudget {
                bytes: self.max_bytes,
                entries: self.max_entries,
            };
            if let Err(error) = copy_tree(&from, &staging, &mut budget) {
                let _ = fs::remove_dir_all(&staging);
                return Err(match error {
                    CopyError::Io(path, error) => io_error(&path, error),
                    CopyError::TooBig => self.too_big(&from),
                });
            }
            if exists {
                if let Err(error) = self.delete_path(&to, true) {
                    let _ = fs::remove_dir_all(&staging);
                    return Err(error);
                }
            }
            fs::rename(&staging, &to).map_err(|e| {
                let _ = fs::remove_dir_all(&staging);
                io_error(&to, e)
            })?;
            Ok(FileReply::Done)
        } else {
            let bytes = self.read_bounded(&from)?;
            self.replace(&to, &bytes, None, false)
        }
    }

    pub(crate) fn rename(
        &self,
        source: &str,
        destination: &str,
        fail_if_exists: bool,
    ) -> Result<FileReply, FileError> {
        let from = self.confine(source, false)?;
        let to = self.confine(destination, false)?;
        if from == self.root {
            return Err(FileError::PermissionDenied(
                "the workspace's root cannot be moved".into(),
            ));
        }
        fs::symlink_metadata(&from).map_err(|e| io_error(&from, e))?;
        if fail_if_exists && fs::symlink_metadata(&to).is_ok() {
            return Err(FileError::AlreadyExists(format!(
                "{} already exists",
                to.display()
            )));
        }
        fs::rename(&from, &to).map_err(|e| io_error(&to, e))?;
        Ok(FileReply::Done)
    }

    pub(crate) fn delete(&self, requested: &str, recursive: bool) -> Result<FileReply, FileError> {
        let path = self.confine(requested, false)?;
        if path == self.root {
            return Err(FileError::PermissionDenied(
                "the workspace's root cannot be deleted".into(),
            ));
        }
        self.delete_path(&path, recursive)?;
        Ok(FileReply::Done)
    }

    pub(crate) fn delete_path(&self, path: &Path, recursive: bool) -> Result<(), FileError> {
        let meta = fs::symlink_metadata(path).map_err(|e| io_error(path, e))?;
        let removed = if meta.is_dir() {
            if recursive {
                fs::remove_dir_all(path)
            } else {
                fs::remove_dir(path)
            }
        } else {
            fs::remove_file(path)
        };
        removed.map_err(|e| io_error(path, e))
    }
    pub(crate) fn mkdir(&self, requested: &str) -> Result<FileReply, FileError> {
        let path = self.confine(requested, true)?;
        match fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => return Ok(FileReply::Done),
            Ok(_) => {
                return Err(FileError::AlreadyExists(format!(
                    "{} exists and is not a directory",
                    path.display()
                )))
            }
            Err(_) => {}
        }
        fs::create_dir_all(&path).map_err(|error| match error.kind() {
            // A part of the path is a file.
            std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotADirectory => {
                FileError::AlreadyExists(format!(
                    "{}: a part of the path exists and is not a directory",
                    path.display()
                ))
            }
            _ => io_error(&path, error),
        })?;
        Ok(FileReply::Done)
    }
}

pub(crate) enum CopyError {
    Io(PathBuf, std::io::Error),
    TooBig,
}

/// What a tree copy may still create.
pub(crate) struct CopyBudget {
    bytes: u64,
    entries: usize,
}

/// Copy a directory tree (symlinks as symlinks), within `budget` (bytes of files, entries).
pub(crate) fn copy_tree(from: &Path, to: &Path, budget: &mut CopyBudget) -> Result<(), CopyError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| CopyError::Io(path, error)
    };
    fs::create_dir(to).map_err(io(to))?;
    for entry in fs::read_dir(from).map_err(io(from))? {
        let entry = entry.map_err(io(from))?;
        let source = entry.path();
        let target = to.join(entry.file_name());
        budget.entries = budget.entries.checked_sub(1).ok_or(CopyError::TooBig)?;
        let kind = entry.file_type().map_err(io(&source))?;
        if kind.is_dir() {
            copy_tree(&source, &target, budget)?;
        } else if kind.is_symlink() {
            let link = fs::read_link(&source).map_err(io(&source))?;
            std::os::unix::fs::symlink(link, &target).map_err(io(&target))?;
        } else if kind.is_file() {
            let size = entry.metadata().map_err(io(&source))?.len();
            budget.bytes = budget.bytes.checked_sub(size).ok_or(CopyError::TooBig)?;
            fs::copy(&source, &target).map_err(io(&target))?;
        }
    }
    Ok(())
}
