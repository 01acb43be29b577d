//! Which paths one watch reports: beneath its root, to the depth it asked, named by its `includes` and not by its
//! `excludes` (`globset` patterns relative to the root), never the file server's own temporary files.

use std::path::{Path, PathBuf};

use globset::{Glob, GlobSet, GlobSetBuilder};

use super::super::protocol::FileError;

/// Which paths one watch reports.
pub(super) struct Filter {
    pub(super) root: PathBuf,
    pub(super) recursive: bool,
    pub(super) includes: Option<GlobSet>,
    pub(super) excludes: Option<GlobSet>,
}

impl Filter {
    /// Whether a change of `path` is this watch's to report (never the file server's own temporary files).
    pub(super) fn reports(&self, path: &Path) -> bool {
        let Ok(relative) = path.strip_prefix(&self.root) else {
            return false;
        };
        if is_the_servers_temporary_file(path) {
            return false;
        }
        let depth = relative.components().count();
        if !self.recursive && depth > 1 {
            return false;
        }
        if depth > 0 && self.excludes.as_ref().is_some_and(|set| set.is_match(relative)) {
            return false;
        }
        match &self.includes {
            Some(set) if depth > 0 => set.is_match(relative),
            _ => true,
        }
    }

    /// Whether `path`, made in a recursive watch and not reported itself, may be a directory holding what is
    /// (beneath the root, not excluded, not the file server's temporary file).
    pub(super) fn may_hold_reported(&self, path: &Path) -> bool {
        self.recursive
            && path
                .strip_prefix(&self.root)
                .is_ok_and(|relative| relative.components().count() > 0)
            && !is_the_servers_temporary_file(path)
            && !self.excludes_all_of(path)
    }

    /// Whether what is beneath `dir` is never reported (an excluded directory: not listed, not walked).
    pub(super) fn excludes_all_of(&self, dir: &Path) -> bool {
        dir.strip_prefix(&self.root).is_ok_and(|relative| {
            relative.components().count() > 0
                && self.excludes.as_ref().is_some_and(|set| set.is_match(relative))
        })
    }
}

/// Whether `path` names one of the file server's own temporary files (never reported).
fn is_the_servers_temporary_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(super::super::ops::is_temporary)
}

/// Whether `path` is a directory itself (a link to one is not).
pub(super) fn is_directory(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_dir())
}

/// The glob set of `patterns` (none for none); `dir` also covers what is inside it.
pub(super) fn globs(patterns: &[String]) -> Result<Option<GlobSet>, FileError> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        let glob =
            Glob::new(pattern).map_err(|error| FileError::Invalid(format!("glob {pattern:?}: {error}")))?;
        builder.add(glob);
        // `dir` also covers what is inside it.
        if let Ok(inside) = Glob::new(&format!("{}/**", pattern.trim_end_matches('/'))) {
            builder.add(inside);
        }
    }
    builder
        .build()
        .map(Some)
        .map_err(|error| FileError::Invalid(format!("globs: {error}")))
}
