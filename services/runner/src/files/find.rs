//! Finding files for `@` completions: a working directory walked breadth-first (no symlinks followed, `.git`,
//! `node_modules` and the relay's own directory skipped, at most [`MAX_WALKED`] entries), its file paths ranked
//! against what the user typed by a fuzzy matcher made for paths (`nucleo-matcher`), the best [`MAX_FOUND`]
//! returned.

use nucleo_matcher::pattern::{CaseMatching, Normalization, Pattern};
use nucleo_matcher::{Config, Matcher};

use super::ops::Files;
use super::protocol::{FileError, FileReply};

/// Entries one search walks at most.
pub const MAX_WALKED: usize = 20_000;
/// Paths one search returns at most.
pub const MAX_FOUND: usize = 50;

const SKIPPED: &[&str] = &[".git", "node_modules", ".ahp-relay"];

impl Files {
    /// The files under `workspace` (relative paths) that best match `query`, best first (shortest first for
    /// an empty query).
    pub(crate) fn find(&self, workspace: &str, query: &str, limit: usize) -> Result<FileReply, FileError> {
        let workspace = self.confine(workspace, true)?;
        if !workspace.is_dir() {
            return Err(FileError::NotFound(format!(
                "{} is not a directory",
                workspace.display()
            )));
        }
        let walker = walkdir::WalkDir::new(&workspace)
            .follow_links(false)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|entry| {
                entry.depth() == 0 || !SKIPPED.iter().any(|skipped| entry.file_name() == *skipped)
            });
        let mut paths: Vec<String> = Vec::new();
        for entry in walker.take(MAX_WALKED).flatten() {
            if !entry.file_type().is_file() {
                continue;
            }
            if let Ok(relative) = entry.path().strip_prefix(&workspace) {
                paths.push(relative.to_string_lossy().into_owned());
            }
        }
        let limit = limit.clamp(1, MAX_FOUND);
        let found: Vec<String> = if query.is_empty() {
            paths.sort_by_key(|path| (path.matches('/').count(), path.len()));
            paths.into_iter().take(limit).collect()
        } else {
            let mut matcher = Matcher::new(Config::DEFAULT.match_paths());
            let pattern = Pattern::parse(query, CaseMatching::Ignore, Normalization::Smart);
            pattern
                .match_list(paths, &mut matcher)
                .into_iter()
                .take(limit)
                .map(|(path, _)| path)
                .collect()
        };
        Ok(FileReply::Found { paths: found })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_found_fuzzily_within_bounds_and_never_in_skipped_trees() {
        let root = tempfile::tempdir().expect("root");
        let files = Files::new(root.path(), 1024).expect("files");
        let dir = root.path().canonicalize().expect("real").join("w");
        for path in [
            "src/main.rs",
            "src/lib.rs",
            "docs/readme.md",
            "node_modules/x/main.rs",
            ".git/main",
        ] {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
            std::fs::write(&path, "").expect("file");
        }
        let found = |query: &str| match files.find(&dir.display().to_string(), query, 10).expect("find") {
            FileReply::Found { paths } => paths,
            other => panic!("{other:?}"),
        };
        assert_eq!(found("smain")[0], "src/main.rs");
        assert_eq!(found("READ"), vec!["docs/readme.md"]);
        assert!(found("main")
            .iter()
            .all(|path| !path.starts_with("node_modules") && !path.starts_with(".git")));
        assert_eq!(found("").len(), 3);
        assert!(found("zzz").is_empty());
        assert!(matches!(
            files.find("/etc", "", 10),
            Err(FileError::PermissionDenied(_))
        ));
    }
}
