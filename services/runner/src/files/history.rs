//! Checkpoints of sessions' working directories, for their changesets: one shadow git repository per tenant in
//! the file server's private directory (`$HOME/checkpoints.git` in its sandbox: outside the tenant's root, so no
//! agent and no `resource*` request can reach it), an index, an exclude list and a ref per working directory, a
//! commit of the whole directory at each turn's start and end (`git add -A`, `write-tree`, `commit-tree`; files
//! over the size limit left out, at most [`MAX_CHECKPOINT_ENTRIES`] entries); what changed between two
//! checkpoints (with each side's blob id), a file as a blob holds it (the `ahp-checkpoint:` content URIs
//! changesets' file edits name), files restored from one, and a directory's checkpoints forgotten (its session
//! is gone). Where the working directory is a git repository of its own, its files can be staged and committed
//! there and its branches listed. Runs in the tenant's file server with the git CLI, every run with the
//! configuration [`crate::git`] forces (hooks, filesystem monitors, every driver the repository defines, global
//! and system configuration off, pathspecs literal); git on a session's own repository runs in a Landlock domain
//! of that working directory alone ([`relay_sandbox::confine::Narrowing`]): not the rest of the tenant, not this
//! server's private directory (the shadow repository).

use std::path::{Component, Path, PathBuf};

use sha2::Digest;

use crate::git::ForcedConfig;

use super::git_run::*;
use super::ops::Files;
use super::protocol::{ChangeStatus, ChangedFile, FileError, FileReply, RepositoryOp};

/// Never part of a checkpoint: repositories' own data, dependency trees, the relay's own directory.
const EXCLUDES: &str = ".git\nnode_modules/\n.ahp-relay/\n";
/// No filter driver runs on a checkpoint's files, whatever the working tree's attributes say.
const ATTRIBUTES: &str = "* -filter\n";
/// Entries one checkpoint walks at most; a larger working directory has no checkpoints.
pub const MAX_CHECKPOINT_ENTRIES: usize = 100_000;
/// Where each session's checkpoints of a directory are: `<SESSION_REFS>/<directory key>/<session key>`.
const SESSION_REFS: &str = "refs/session-checkpoints";

/// Files one comparison lists at most.
pub const MAX_CHANGED_FILES: usize = 1000;

/// A full object id (SHA-1 or SHA-256), never an abbreviation.
fn is_object_id(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// git's id of "no object" (an added file's before, a deleted file's after).
fn is_null_id(text: &str) -> bool {
    text.bytes().all(|b| b == b'0')
}

/// A path relative to a working directory, without `..`.
fn relative(path: &str) -> Result<&str, FileError> {
    let plain = !path.is_empty()
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
    if plain {
        Ok(path)
    } else {
        Err(FileError::PermissionDenied(format!(
            "{path}: a path inside the working directory, without '..'"
        )))
    }
}

impl Files {
    /// The shadow repository, in the file server's private directory.
    fn shadow(&self) -> Result<PathBuf, FileError> {
        self.state_dir()
            .map(|dir| dir.join("checkpoints.git"))
            .ok_or_else(|| {
                FileError::Unavailable("checkpoints need the file server's private directory".into())
            })
    }

    /// The key of a working directory in the shadow repository (its index and ref are named by it).
    fn workspace_key(workspace: &Path) -> String {
        Self::checkpoints_key(workspace, None)
    }

    /// What names the checkpoints `session` keeps of `workspace` (ref, index, exclude list): two sessions
    /// sharing a directory never share them.
    fn checkpoints_key(workspace: &Path, session: Option<&str>) -> String {
        let mut digest = sha2::Sha256::new();
        digest.update(workspace.as_os_str().as_encoded_bytes());
        if let Some(session) = session {
            digest.update([0]);
            digest.update(session.as_bytes());
        }
        digest
            .finalize()
            .iter()
            .take(12)
            .map(|byte| format!("{byte:02x}"))
            .collect()
    }

    /// The working directory `requested`, an existing directory inside the root.
    fn working_directory(&self, requested: &str) -> Result<PathBuf, FileError> {
        let workspace = self.confine(requested, true)?;
        if !workspace.is_dir() {
            return Err(FileError::NotFound(format!(
                "{} is not a directory",
                workspace.display()
            )));
        }
        Ok(workspace)
    }

    /// Run git on the shadow repository (with `workspace` as its work tree and index, when given).
    fn shadow_git(&self, workspace: Option<&Path>, args: &[&str]) -> Result<Vec<u8>, FileError> {
        let shadow = self.shadow()?;
        let mut command = ForcedConfig::base().command();
        command.arg("--git-dir").arg(&shadow);
        if let Some(workspace) = workspace {
            let key = Self::workspace_key(workspace);
            command
                .arg("--work-tree")
                .arg(workspace)
                .arg("-c")
                .arg(format!(
                    "core.excludesFile={}",
                    shadow.join("excludes").join(&key).display()
                ))
                .current_dir(workspace)
                .env("GIT_INDEX_FILE", shadow.join("indexes").join(key));
        }
        run_git(command, args, true)
    }

    fn ensure_shadow(&self) -> Result<PathBuf, FileError> {
        let shadow = self.shadow()?;
        let unavailable = |error: std::io::Error| FileError::Unavailable(format!("checkpoints: {error}"));
        if !shadow.join("HEAD").exists() {
            std::fs::create_dir_all(&shadow).map_err(unavailable)?;
            let path = shadow.to_string_lossy();
            run_git(
                ForcedConfig::base().command(),
                &["init", "--bare", "-q", &path],
                true,
            )?;
        }
        for dir in ["indexes", "info", "excludes"] {
            std::fs::create_dir_all(shadow.join(dir)).map_err(unavailable)?;
        }
        std::fs::write(shadow.join("info").join("exclude"), EXCLUDES).map_err(unavailable)?;
        std::fs::write(shadow.join("info").join("attributes"), ATTRIBUTES).map_err(unavailable)?;
        Ok(shadow)
    }

    /// Write the working directory's own exclude list: its files over the size limit. Fails past
    /// [`MAX_CHECKPOINT_ENTRIES`] entries.
    fn exclude_large_files(&self, shadow: &Path, workspace: &Path) -> Result<(), FileError> {
        let mut excluded = String::new();
        let walker = walkdir::WalkDir::new(workspace)
            .follow_links(false)
            .into_iter()
            .filter_entry(|entry| {
                entry.depth() == 0
                    || ![".git", "node_modules", ".ahp-relay"]
                        .iter()
                        .any(|skipped| entry.file_name() == *skipped)
            });
        for (count, entry) in walker.flatten().enumerate() {
            if count >= MAX_CHECKPOINT_ENTRIES {
                return Err(FileError::Invalid(format!(
                    "{} holds more than {MAX_CHECKPOINT_ENTRIES} entries: too many to checkpoint",
                    workspace.display()
                )));
            }
            let large = entry.file_type().is_file()
                && entry.metadata().is_ok_and(|meta| meta.len() > self.max_bytes());
            if let (true, Ok(relative)) = (large, entry.path().strip_prefix(workspace)) {
                // Anchored, with glob characters escaped.
                let mut line = String::from("/");
                for c in relative.to_string_lossy().chars() {
                    if matches!(c, '*' | '?' | '[' | '\\' | '!' | '#') {
                        line.push('\\');
                    }
                    line.push(c);
                }
                excluded.push_str(&line);
                excluded.push('\n');
            }
        }
        std::fs::write(
            shadow.join("excludes").join(Self::workspace_key(workspace)),
            excluded,
        )
        .map_err(|error| FileError::Unavailable(format!("checkpoints: {error}")))
    }

    /// The ref holding `session`'s checkpoints of `workspace` (without a session: the directory's own, as
    /// before sessions had their own).
    fn checkpoints_ref(workspace: &Path, session: Option<&str>) -> String {
        let directory = Self::workspace_key(workspace);
        match session {
            Some(_) => format!(
                "{SESSION_REFS}/{directory}/{}",
                Self::checkpoints_key(workspace, session)
            ),
            None => format!("refs/checkpoints/{directory}"),
        }
    }

    /// Forget the checkpoints `session` keeps of working directory `workspace` (the session is gone): its ref;
    /// once no session keeps any of that directory, its index and exclude list too; then the loose objects
    /// nothing has named for an hour (`git prune --expire`): another session's checkpoints of the same
    /// directory are named by its own ref and stay whole.
    pub(crate) fn forget_checkpoints(
        &self,
        workspace: &str,
        session: Option<&str>,
    ) -> Result<FileReply, FileError> {
        let workspace = self.confine(workspace, true)?;
        let shadow = self.shadow()?;
        if !shadow.join("HEAD").exists() {
            return Ok(FileReply::Done);
        }
        self.clear_stale_locks(&shadow);
        let key = Self::workspace_key(&workspace);
        let reference = Self::checkpoints_ref(&workspace, session);
        let _ = self.shadow_git(None, &["update-ref", "-d", &reference]);
        let others = self
            .shadow_git(
                None,
                &[
                    "for-each-ref",
                    "--count=1",
                    "--format=%(refname)",
                    &format!("{SESSION_REFS}/{key}/"),
                ],
            )
            .map(text)
            .unwrap_or_default();
        if others.is_empty() {
            let _ = self.shadow_git(None, &["update-ref", "-d", &format!("refs/checkpoints/{key}")]);
            for dir in ["indexes", "excludes"] {
                let _ = std::fs::remove_file(shadow.join(dir).join(&key));
            }
        }
        // What nothing names any more goes: loose objects unreferenced for an hour (a checkpoint under way
        // names its objects within that). Another session's checkpoints are named by its own ref.
        self.shadow_git(None, &["prune", "--expire=1.hour.ago"])?;
        Ok(FileReply::Done)
    }

    /// Remove the lock files a git that was killed left in the shadow repository (index, refs, packed refs,
    /// HEAD, config): a file server runs one git at a time and none now, and holds an exclusive `flock` on
    /// the repository while it lives — so, holding it, every lock there is stale (one left behind would fail
    /// every later checkpoint). Without it (another server of the tenant still lives), nothing is touched.
    fn clear_stale_locks(&self, shadow: &Path) {
        let Ok(mut held) = self.checkpoints_lock.lock() else {
            return;
        };
        if held.is_none() {
            *held = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(shadow.join("relay.lock"))
                .ok()
                .filter(|file| {
                    rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
                });
        }
        if held.is_none() {
            return;
        }
        drop(held);
        let walker = walkdir::WalkDir::new(shadow)
            .follow_links(false)
            .into_iter()
            .filter_entry(|entry| entry.file_name() != "objects");
        for entry in walker.flatten() {
            let is_lock =
                entry.file_type().is_file() && entry.file_name().as_encoded_bytes().ends_with(b".lock");
            if is_lock {
                match std::fs::remove_file(entry.path()) {
                    Ok(()) => tracing::warn!(lock = %entry.path().display(), "removed a stale git lock"),
                    Err(error) => tracing::warn!(%error, "cannot remove a stale git lock"),
                }
            }
        }
    }

    /// Commit the whole working directory, as a checkpoint of `session`; the commit's id.
    pub(crate) fn checkpoint(
        &self,
        workspace: &str,
        label: &str,
        session: Option<&str>,
    ) -> Result<FileReply, FileError> {
        let workspace = self.working_directory(workspace)?;
        let shadow = self.ensure_shadow()?;
        self.clear_stale_locks(&shadow);
        self.exclude_large_files(&shadow, &workspace)?;
        let reference = Self::checkpoints_ref(&workspace, session);
        self.shadow_git(Some(&workspace), &["add", "-A", "--ignore-errors", "."])
            .or_else(|_| self.shadow_git(Some(&workspace), &["add", "-A", "."]))?;
        let tree = text(self.shadow_git(Some(&workspace), &["write-tree"])?);
        let parent = self
            .shadow_git(None, &["rev-parse", "--verify", "-q", &reference])
            .ok()
            .map(text)
            .filter(|parent| is_object_id(parent));
        let mut args = vec!["commit-tree", tree.as_str(), "-m", label];
        if let Some(parent) = &parent {
            args.extend(["-p", parent.as_str()]);
        }
        let commit = text(self.shadow_git(None, &args)?);
        self.shadow_git(None, &["update-ref", &reference, &commit])?;
        Ok(FileReply::Checkpoint { commit })
    }

    /// The files that differ between two checkpoints, each side's blob id with them.
    pub(crate) fn changes(&self, from: &str, to: &str) -> Result<FileReply, FileError> {
        for commit in [from, to] {
            if !is_object_id(commit) {
                return Err(FileError::Invalid(format!("{commit} is not a checkpoint")));
            }
        }
        // `:<mode> <mode> <blob> <blob> <status>\0<path>\0`, full ids.
        let raw = self.shadow_git(
            None,
            &["diff", "--no-renames", "--raw", "--no-abbrev", "-z", from, to],
        )?;
        let counts = self.shadow_git(None, &["diff", "--no-renames", "--numstat", "-z", from, to])?;
        let mut files: Vec<ChangedFile> = Vec::new();
        let mut fields = raw.split(|byte| *byte == 0).filter(|field| !field.is_empty());
        while let (Some(head), Some(path)) = (fields.next(), fields.next()) {
            let head = String::from_utf8_lossy(head);
            let parts: Vec<&str> = head.trim_start_matches(':').split(' ').collect();
            let [_, _, before, after, status] = parts.as_slice() else {
                continue;
            };
            let status = match status.chars().next() {
                Some('A') => ChangeStatus::Added,
                Some('D') => ChangeStatus::Deleted,
                _ => ChangeStatus::Modified,
            };
            let blob = |id: &&str| (!is_null_id(id)).then(|| id.to_string());
            files.push(ChangedFile {
                path: String::from_utf8_lossy(path).into_owned(),
                status,
                added: None,
                removed: None,
                before: blob(before),
                after: blob(after),
            });
            if files.len() >= MAX_CHANGED_FILES {
                break;
            }
        }
        // `added\tremoved\tpath\0`; `-\t-` for binary files.
        for record in counts
            .split(|byte| *byte == 0)
            .filter(|record| !record.is_empty())
        {
            let record = String::from_utf8_lossy(record);
            let mut parts = record.splitn(3, '\t');
            let (Some(added), Some(removed), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            if let Some(file) = files.iter_mut().find(|file| file.path == path) {
                file.added = added.parse().ok();
                file.removed = removed.parse().ok();
            }
        }
        Ok(FileReply::Changes { files })
    }

    /// A file's content as blob `object` holds it (`path` names it, for its content type).
    pub(crate) fn read_version(&self, object: &str, path: &str) -> Result<FileReply, FileError> {
        if !is_object_id(object) {
            return Err(FileError::Invalid(format!("{object} is not a checkpoint's file")));
        }
        let path = relative(path)?;
        let missing = || FileError::NotFound(format!("{path} is not in this tenant's checkpoints"));
        let kind = self
            .shadow_git(None, &["cat-file", "-t", object])
            .map_err(|_| missing())?;
        if text(kind) != "blob" {
            return Err(missing());
        }
        let size: u64 = text(self.shadow_git(None, &["cat-file", "-s", object])?)
            .parse()
            .unwrap_or(u64::MAX);
        if size > self.max_bytes() {
            return Err(FileError::Invalid(format!(
                "{path} is larger than this relay's limit of {} bytes",
                self.max_bytes()
            )));
        }
        let bytes = self.shadow_git(None, &["cat-file", "blob", object])?;
        let (content_type, text) = super::ops::sniff(Path::new(path), &bytes);
        Ok(FileReply::Read {
            data: base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &bytes),
            content_type,
            text,
        })
    }

    /// Put `paths` (relative to the working directory) back as checkpoint `commit` holds them: written where
    /// it has them, removed where it does not.
    pub(crate) fn restore(
        &self,
        workspace: &str,
        commit: &str,
        paths: &[String],
    ) -> Result<FileReply, FileError> {
        let workspace = self.working_directory(workspace)?;
        if !is_object_id(commit) {
            return Err(FileError::Invalid(format!("{commit} is not a checkpoint")));
        }
        for path in paths {
            let path = relative(path)?;
            // Resolved (symlinks on the way followed) inside the working directory, not only the tenant's root:
            // a link to another session's folder must not lead a revert there.
            let target = self.confine(&workspace.join(path).display().to_string(), false)?;
            if !target.starts_with(&workspace) {
                return Err(FileError::PermissionDenied(format!(
                    "{path} leads outside the working directory"
                )));
            }
            let object = format!("{commit}:{path}");
            if self.shadow_git(None, &["cat-file", "-e", &object]).is_ok() {
                self.shadow_git(Some(&workspace), &["checkout", commit, "--", path])?;
            } else {
                match std::fs::remove_file(&target) {
                    Ok(()) => {}
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                    Err(error) => {
                        return Err(FileError::Unavailable(format!("{}: {error}", target.display())))
                    }
                }
            }
        }
        Ok(FileReply::Done)
    }

    /// What a working directory that is a git repository of its own can do.
    pub(crate) fn repository(&self, workspace: &str, op: RepositoryOp) -> Result<FileReply, FileError> {
        let workspace = self.working_directory(workspace)?;
        let is_repository = workspace.join(".git").is_dir();
        match op {
            RepositoryOp::Inspect => return Ok(FileReply::Repository { is_repository }),
            _ if !is_repository => {
                return Err(FileError::Invalid(format!(
                    "{} is not a git repository",
                    workspace.display()
                )))
            }
            _ => {}
        }
        // The drivers the repository's configuration defines, as git reads it, each forced empty.
        let listed = repository_git(&workspace, &ForcedConfig::base(), crate::git::LIST_NAMES)?;
        if ForcedConfig::names_unforceable(&listed) {
            return Err(FileError::PermissionDenied(
                "this repository's configuration has names that are not UTF-8: use a terminal in the session"
                    .into(),
            ));
        }
        let forced = ForcedConfig::for_listed(&listed);
        let git = |args: &[&str]| repository_git(&workspace, &forced, args);
        match op {
            RepositoryOp::Inspect => Ok(FileReply::Repository { is_repository }),
            RepositoryOp::Stage { paths } => {
                let mut args = vec!["add", "--"];
                for path in &paths {
                    args.push(relative(path)?);
                }
                git(&args)?;
                Ok(FileReply::Done)
            }
            RepositoryOp::Branches => {
                let listed = git(&[
                    "for-each-ref",
                    "--format=%(refname:short)",
                    "--count=500",
                    "refs/heads",
                ])?;
                let branches = String::from_utf8_lossy(&listed)
                    .lines()
                    .map(str::to_string)
                    .filter(|line| !line.is_empty())
                    .collect();
                let current = git(&["symbolic-ref", "--short", "-q", "HEAD"]).ok().map(text);
                Ok(FileReply::Branches { current, branches })
            }
            RepositoryOp::Commit { message } => {
                git(&["add", "-A"])?;
                git(&["commit", "-q", "--no-verify", "-m", &message])?;
                let head = text(git(&["rev-parse", "HEAD"])?);
                Ok(FileReply::Checkpoint { commit: head })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(reply: Result<FileReply, FileError>) -> String {
        match reply.expect("checkpoint") {
            FileReply::Checkpoint { commit } => commit,
            other => panic!("{other:?}"),
        }
    }

    /// A tenant root and a file server's private directory apart from it.
    fn setup(max: u64) -> (tempfile::TempDir, tempfile::TempDir, Files, PathBuf) {
        let root = tempfile::tempdir().expect("root");
        let state = tempfile::tempdir().expect("state");
        let files = Files::new(root.path(), max)
            .expect("files")
            .with_state_dir(state.path().to_path_buf());
        let workspace = root.path().canonicalize().expect("real").join("project");
        std::fs::create_dir_all(&workspace).expect("dir");
        (root, state, files, workspace)
    }

    #[test]
    fn checkpoints_list_what_changed_and_restore_it() {
        let (_root, state, files, workspace) = setup(1024 * 1024);
        std::fs::create_dir_all(workspace.join("src")).expect("dir");
        std::fs::write(workspace.join("src/a.txt"), "one\ntwo\n").expect("a");
        std::fs::write(workspace.join("b.txt"), "b\n").expect("b");
        let dir = workspace.display().to_string();
        let start = commit(files.checkpoint(&dir, "t1 start", None));
        std::fs::write(workspace.join("src/a.txt"), "one\n2\nthree\n").expect("a");
        std::fs::remove_file(workspace.join("b.txt")).expect("b");
        std::fs::write(workspace.join("c.txt"), "new\n").expect("c");
        let end = commit(files.checkpoint(&dir, "t1 end", None));
        let FileReply::Changes { files: changed } = files.changes(&start, &end).expect("changes") else {
            panic!("changes");
        };
        let by_path = |path: &str| {
            changed
                .iter()
                .find(|file| file.path == path)
                .cloned()
                .expect(path)
        };
        assert_eq!(changed.len(), 3, "{changed:?}");
        let a = by_path("src/a.txt");
        assert_eq!(
            (a.status, a.added, a.removed),
            (ChangeStatus::Modified, Some(2), Some(1))
        );
        assert_eq!(by_path("b.txt").status, ChangeStatus::Deleted);
        assert!(by_path("b.txt").after.is_none() && by_path("c.txt").before.is_none());
        assert_eq!(by_path("c.txt").status, ChangeStatus::Added);
        let FileReply::Read { data, text, .. } = files
            .read_version(&a.before.clone().expect("blob"), "src/a.txt")
            .expect("read")
        else {
            panic!("read");
        };
        assert!(text);
        assert_eq!(
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, data).expect("b64"),
            b"one\ntwo\n"
        );
        assert!(
            matches!(files.read_version(&start, "x"), Err(FileError::NotFound(_))),
            "a commit is no file"
        );
        assert!(
            matches!(files.read_version(&start[..7], "x"), Err(FileError::Invalid(_))),
            "no abbreviations"
        );
        assert!(matches!(
            files.read_version(&a.after.clone().expect("blob"), "../x"),
            Err(FileError::PermissionDenied(_))
        ));

        // Reverting puts the start back: a changed file rewritten, a deleted one restored, a new one removed.
        files
            .restore(
                &dir,
                &start,
                &["src/a.txt".into(), "b.txt".into(), "c.txt".into()],
            )
            .expect("restore");
        assert_eq!(
            std::fs::read_to_string(workspace.join("src/a.txt")).expect("a"),
            "one\ntwo\n"
        );
        assert_eq!(
            std::fs::read_to_string(workspace.join("b.txt")).expect("b"),
            "b\n"
        );
        assert!(!workspace.join("c.txt").exists());
        assert!(matches!(
            files.restore(&dir, &start, &["../x".into()]),
            Err(FileError::PermissionDenied(_))
        ));
        let again = commit(files.checkpoint(&dir, "again", None));
        let FileReply::Changes { files: none } = files.changes(&start, &again).expect("changes") else {
            panic!("changes");
        };
        assert!(none.is_empty(), "{none:?}");
        // The shadow repository is the file server's own, not in the tenant's root.
        assert!(state.path().join("checkpoints.git/HEAD").exists());
        // Forgotten with its session: nothing names its checkpoints any more (their objects go with git's
        // housekeeping).
        files.forget_checkpoints(&dir, None).expect("forget");
        let named = files.shadow_git(None, &["for-each-ref"]).expect("refs");
        assert!(named.is_empty(), "{}", String::from_utf8_lossy(&named));
        let _ = a;
    }

    /// Issue 33 (10, 11): two sessions sharing a working directory keep checkpoints of their own: one forgotten
    /// (disposed), the other's survive git's pruning and still compare; and a lock a killed git left in the
    /// shadow repository does not fail the next checkpoint.
    #[test]
    fn sessions_sharing_a_directory_keep_their_checkpoints_and_stale_locks_are_cleared() {
        let (_root, state, files, workspace) = setup(1 << 20);
        let dir = workspace.display().to_string();
        std::fs::write(workspace.join("shared.txt"), "one\n").expect("write");
        let first = commit(files.checkpoint(&dir, "t1 start", Some("ahp-session:/first")));
        let second_start = commit(files.checkpoint(&dir, "t1 start", Some("ahp-session:/second")));
        std::fs::write(workspace.join("shared.txt"), "two\n").expect("write");
        let second_end = commit(files.checkpoint(&dir, "t1 end", Some("ahp-session:/second")));
        let _ = first;
        files
            .forget_checkpoints(&dir, Some("ahp-session:/first"))
            .expect("forget the first");
        // Whatever git's housekeeping later prunes, the second session's checkpoints are named still.
        files
            .shadow_git(None, &["gc", "--quiet", "--prune=now"])
            .expect("prune");
        let FileReply::Changes { files: changed } = files
            .changes(&second_start, &second_end)
            .expect("the second session's changes")
        else {
            panic!("changes");
        };
        assert_eq!(changed.len(), 1, "{changed:?}");
        // A git killed mid-checkpoint leaves its locks: the index's and the ref's.
        let shadow = state.path().join("checkpoints.git");
        let index = std::fs::read_dir(shadow.join("indexes"))
            .expect("indexes")
            .flatten()
            .next()
            .expect("an index")
            .path();
        let reference = Files::checkpoints_ref(&workspace, Some("ahp-session:/second"));
        let locks = [
            PathBuf::from(format!("{}.lock", index.display())),
            shadow.join("packed-refs.lock"),
            shadow.join(format!("{reference}.lock")),
        ];
        for lock in &locks {
            if let Some(parent) = lock.parent() {
                std::fs::create_dir_all(parent).expect("its directory");
            }
            std::fs::write(lock, "").expect("a stale lock");
        }
        std::fs::write(workspace.join("shared.txt"), "three\n").expect("write");
        let after = commit(files.checkpoint(&dir, "t2 end", Some("ahp-session:/second")));
        let FileReply::Changes { files: changed } = files.changes(&second_end, &after).expect("changes")
        else {
            panic!("changes");
        };
        assert_eq!(changed.len(), 1, "{changed:?}");
        assert!(
            locks.iter().all(|lock| !lock.exists()),
            "the stale locks are gone"
        );
    }

    #[test]
    fn checkpoints_leave_out_large_files_and_run_no_filters() {
        let (_root, _state, files, workspace) = setup(100);
        let dir = workspace.display().to_string();
        let start = commit(files.checkpoint(&dir, "start", None));
        std::fs::write(workspace.join("big[1].bin"), vec![b'x'; 1000]).expect("big");
        std::fs::write(workspace.join("small.txt"), "s\n").expect("small");
        // A filter the working tree asks for, which a checkpoint must not run.
        std::fs::write(workspace.join(".gitattributes"), "* filter=evil\n").expect("attributes");
        let end = commit(files.checkpoint(&dir, "end", None));
        let FileReply::Changes { files: changed } = files.changes(&start, &end).expect("changes") else {
            panic!("changes");
        };
        let paths: Vec<&str> = changed.iter().map(|file| file.path.as_str()).collect();
        assert_eq!(paths, [".gitattributes", "small.txt"]);
    }

    #[test]
    fn a_revert_never_leaves_the_working_directory_through_a_link() {
        let (root, _state, files, workspace) = setup(1024);
        let other = root.path().canonicalize().expect("real").join("other");
        std::fs::create_dir_all(&other).expect("other");
        std::fs::write(other.join("keep.txt"), "theirs\n").expect("theirs");
        let dir = workspace.display().to_string();
        let start = commit(files.checkpoint(&dir, "start", None));
        std::os::unix::fs::symlink(&other, workspace.join("link")).expect("link");
        assert!(matches!(
            files.restore(&dir, &start, &["link/keep.txt".into()]),
            Err(FileError::PermissionDenied(_))
        ));
        assert_eq!(
            std::fs::read_to_string(other.join("keep.txt")).expect("kept"),
            "theirs\n"
        );
    }

    #[test]
    fn a_repository_of_its_own_is_staged_and_committed_and_runs_none_of_its_commands() {
        let (_root, _state, files, workspace) = setup(1024 * 1024);
        let dir = workspace.display().to_string();
        assert!(matches!(
            files.repository(&dir, RepositoryOp::Inspect),
            Ok(FileReply::Repository { is_repository: false })
        ));
        let base = ForcedConfig::base();
        let mut init = base.command();
        init.arg("-C").arg(&workspace);
        run_git(init, &["init", "-q"], false).expect("git init");
        assert!(matches!(
            files.repository(&dir, RepositoryOp::Inspect),
            Ok(FileReply::Repository { is_repository: true })
        ));
        std::fs::write(workspace.join("notes.md"), "hello\n").expect("write");
        let head = commit(files.repository(
            &dir,
            RepositoryOp::Commit {
                message: "From the relay".into(),
            },
        ));
        let mut log = base.command();
        log.arg("-C").arg(&workspace);
        let subject = text(run_git(log, &["log", "-1", "--format=%H %s"], false).expect("log"));
        assert_eq!(subject, format!("{head} From the relay"));
        // A filter in a section header on the line of another, after a byte that is not UTF-8, a filesystem
        // monitor and hooks: staged, committed and listed, none of them run.
        let config = workspace.join(".git/config");
        let mut planted = std::fs::read(&config).expect("config");
        planted.extend_from_slice(
            b"# \xff\n[core] [filter \"evil\"]\n\tclean = touch ran-a-filter\n\trequired = true\n\
              [core]\n\tfsmonitor = touch ran-fsmonitor\n\thooksPath = planted-hooks\n",
        );
        std::fs::write(&config, planted).expect("config");
        std::fs::create_dir_all(workspace.join("planted-hooks")).expect("hooks");
        std::fs::write(workspace.join(".gitattributes"), "* filter=evil\n").expect("attributes");
        std::fs::write(workspace.join("notes.md"), "changed\n").expect("write");
        files
            .repository(
                &dir,
                RepositoryOp::Stage {
                    paths: vec!["notes.md".into()],
                },
            )
            .expect("staged");
        commit(files.repository(
            &dir,
            RepositoryOp::Commit {
                message: "planted".into(),
            },
        ));
        assert!(matches!(
            files.repository(&dir, RepositoryOp::Branches),
            Ok(FileReply::Branches { .. })
        ));
        assert!(!workspace.join("ran-a-filter").exists());
        assert!(!workspace.join("ran-fsmonitor").exists());
    }

    #[test]
    fn git_on_a_sessions_repository_sees_that_directory_alone() {
        let (root, state, _files, workspace) = setup(1024);
        let base = ForcedConfig::base();
        let inside = workspace.join("inside.cfg");
        std::fs::write(&inside, "[a]\n\tb = c\n").expect("inside");
        let neighbour = root.path().canonicalize().expect("real").join("other.cfg");
        std::fs::write(&neighbour, "[a]\n\tb = c\n").expect("neighbour");
        let shadow = state.path().join("checkpoints.cfg");
        std::fs::write(&shadow, "[a]\n\tb = c\n").expect("shadow");
        let read = |file: &Path| {
            let file = file.display().to_string();
            repository_git(&workspace, &base, &["config", "--file", &file, "--list"])
        };
        assert!(read(&inside).is_ok());
        for outside in [&neighbour, &shadow] {
            assert!(read(outside).is_err(), "{} was readable", outside.display());
        }
    }
}
