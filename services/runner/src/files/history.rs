//! Checkpoints of sessions' working directories, for their changesets: one shadow git repository per tenant
//! (`<tenant root>/.ahp-relay/checkpoints.git`, outside every session's own view), an index and a ref per working
//! directory, a commit of the whole directory at each turn's start and end (`git add -A`, `write-tree`,
//! `commit-tree`); what changed between two checkpoints, a file as a checkpoint holds it (the `ahp-checkpoint:`
//! content URIs changesets' file edits name), and files restored from one. Where the working directory is a git
//! repository of its own, its files can be staged and committed there. Runs in the tenant's file server (its
//! sandbox) with the git CLI, hooks and filesystem monitors off.

use std::path::{Component, Path, PathBuf};
use std::process::Command;

use sha2::Digest;

use super::ops::Files;
use super::protocol::{ChangeStatus, ChangedFile, FileError, FileReply, RepositoryOp};

/// Never part of a checkpoint: repositories' own data, dependency trees, the relay's own directory.
const EXCLUDES: &str = ".git\nnode_modules/\n.ahp-relay/\n";
/// Files one comparison lists at most.
pub const MAX_CHANGED_FILES: usize = 1000;

/// Who the relay's commits are by (checkpoints, and a repository's commit when it names nobody).
const AUTHOR: [(&str, &str); 4] = [
    ("GIT_AUTHOR_NAME", "ahp-relay"),
    ("GIT_AUTHOR_EMAIL", "ahp-relay@localhost"),
    ("GIT_COMMITTER_NAME", "ahp-relay"),
    ("GIT_COMMITTER_EMAIL", "ahp-relay@localhost"),
];

fn is_commit_id(text: &str) -> bool {
    (7..=64).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_hexdigit())
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
    fn shadow(&self) -> PathBuf {
        self.root().join(".ahp-relay").join("checkpoints.git")
    }

    /// The key of a working directory in the shadow repository (its index and ref are named by it).
    fn workspace_key(workspace: &Path) -> String {
        let digest = sha2::Sha256::digest(workspace.as_os_str().as_encoded_bytes());
        digest.iter().take(12).map(|byte| format!("{byte:02x}")).collect()
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
        let shadow = self.shadow();
        let mut command = Command::new("git");
        command.arg("--git-dir").arg(&shadow);
        if let Some(workspace) = workspace {
            command
                .arg("--work-tree")
                .arg(workspace)
                .current_dir(workspace)
                .env(
                    "GIT_INDEX_FILE",
                    shadow.join("indexes").join(Self::workspace_key(workspace)),
                );
        }
        run_git(command, args)
    }

    fn ensure_shadow(&self) -> Result<(), FileError> {
        let shadow = self.shadow();
        if shadow.join("HEAD").exists() {
            return Ok(());
        }
        let unavailable = |error: std::io::Error| FileError::Unavailable(format!("checkpoints: {error}"));
        std::fs::create_dir_all(&shadow).map_err(unavailable)?;
        let path = shadow.to_string_lossy();
        run_git(Command::new("git"), &["init", "--bare", "-q", &path])?;
        std::fs::create_dir_all(shadow.join("indexes")).map_err(unavailable)?;
        std::fs::create_dir_all(shadow.join("info")).map_err(unavailable)?;
        std::fs::write(shadow.join("info").join("exclude"), EXCLUDES).map_err(unavailable)?;
        Ok(())
    }

    /// Commit the whole working directory; the commit's id.
    pub(crate) fn checkpoint(&self, workspace: &str, label: &str) -> Result<FileReply, FileError> {
        let workspace = self.working_directory(workspace)?;
        self.ensure_shadow()?;
        let reference = format!("refs/checkpoints/{}", Self::workspace_key(&workspace));
        self.shadow_git(Some(&workspace), &["add", "-A", "--ignore-errors", "."])
            .or_else(|_| self.shadow_git(Some(&workspace), &["add", "-A", "."]))?;
        let tree = text(self.shadow_git(Some(&workspace), &["write-tree"])?);
        let parent = self
            .shadow_git(None, &["rev-parse", "--verify", "-q", &reference])
            .ok()
            .map(text)
            .filter(|parent| is_commit_id(parent));
        let mut args = vec!["commit-tree", tree.as_str(), "-m", label];
        if let Some(parent) = &parent {
            args.extend(["-p", parent.as_str()]);
        }
        let commit = text(self.shadow_git(None, &args)?);
        self.shadow_git(None, &["update-ref", &reference, &commit])?;
        Ok(FileReply::Checkpoint { commit })
    }

    /// The files that differ between two checkpoints.
    pub(crate) fn changes(&self, from: &str, to: &str) -> Result<FileReply, FileError> {
        for commit in [from, to] {
            if !is_commit_id(commit) {
                return Err(FileError::Invalid(format!("{commit} is not a checkpoint")));
            }
        }
        let statuses = self.shadow_git(None, &["diff", "--no-renames", "--name-status", "-z", from, to])?;
        let counts = self.shadow_git(None, &["diff", "--no-renames", "--numstat", "-z", from, to])?;
        let mut files: Vec<ChangedFile> = Vec::new();
        let mut fields = statuses
            .split(|byte| *byte == 0)
            .filter(|field| !field.is_empty());
        while let (Some(status), Some(path)) = (fields.next(), fields.next()) {
            let status = match status.first() {
                Some(b'A') => ChangeStatus::Added,
                Some(b'D') => ChangeStatus::Deleted,
                _ => ChangeStatus::Modified,
            };
            files.push(ChangedFile {
                path: String::from_utf8_lossy(path).into_owned(),
                status,
                added: None,
                removed: None,
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

    /// A file as checkpoint `commit` holds it.
    pub(crate) fn read_version(&self, commit: &str, path: &str) -> Result<FileReply, FileError> {
        if !is_commit_id(commit) {
            return Err(FileError::Invalid(format!("{commit} is not a checkpoint")));
        }
        let object = format!("{commit}:{}", relative(path)?);
        let size = self
            .shadow_git(None, &["cat-file", "-s", &object])
            .map_err(|_| FileError::NotFound(format!("{path} is not in checkpoint {commit}")))?;
        let size: u64 = text(size).parse().unwrap_or(u64::MAX);
        if size > self.max_bytes() {
            return Err(FileError::Invalid(format!(
                "{path} is larger than this relay's limit of {} bytes",
                self.max_bytes()
            )));
        }
        let bytes = self.shadow_git(None, &["cat-file", "blob", &object])?;
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
        if !is_commit_id(commit) {
            return Err(FileError::Invalid(format!("{commit} is not a checkpoint")));
        }
        for path in paths {
            let path = relative(path)?;
            let object = format!("{commit}:{path}");
            if self.shadow_git(None, &["cat-file", "-e", &object]).is_ok() {
                // Checked inside the root like any write (a symlink on the way must not lead out).
                self.confine(&workspace.join(path).display().to_string(), false)?;
                self.shadow_git(Some(&workspace), &["checkout", commit, "--", path])?;
            } else {
                let target = self.confine(&workspace.join(path).display().to_string(), false)?;
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
        let is_repository = workspace.join(".git").exists();
        let git = |args: &[&str]| {
            let mut command = Command::new("git");
            command.arg("-C").arg(&workspace);
            run_git(command, args)
        };
        match op {
            RepositoryOp::Inspect => Ok(FileReply::Repository { is_repository }),
            _ if !is_repository => Err(FileError::Invalid(format!(
                "{} is not a git repository",
                workspace.display()
            ))),
            RepositoryOp::Stage { paths } => {
                let mut args = vec!["add", "--"];
                for path in &paths {
                    args.push(relative(path)?);
                }
                git(&args)?;
                Ok(FileReply::Done)
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

/// Run a prepared git command with `args`: a clean environment, no hooks, no filesystem monitor, no
/// automatic gc; its stdout, or why it failed.
fn run_git(mut command: Command, args: &[&str]) -> Result<Vec<u8>, FileError> {
    command
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
            "-c",
            "gc.auto=0",
            "-c",
            "core.autocrlf=false",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .env("PATH", "/usr/bin:/bin")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .envs(AUTHOR)
        .stdin(std::process::Stdio::null());
    let output = command
        .output()
        .map_err(|error| FileError::Unavailable(format!("cannot run git: {error}")))?;
    if output.status.success() {
        Ok(output.stdout)
    } else {
        Err(FileError::Unavailable(format!(
            "git {}: {}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8_lossy(&bytes).trim().to_string()
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

    #[test]
    fn checkpoints_list_what_changed_and_restore_it() {
        let root = tempfile::tempdir().expect("root");
        let files = Files::new(root.path(), 1024 * 1024).expect("files");
        let workspace = root.path().canonicalize().expect("real").join("project");
        std::fs::create_dir_all(workspace.join("src")).expect("dir");
        std::fs::write(workspace.join("src/a.txt"), "one\ntwo\n").expect("a");
        std::fs::write(workspace.join("b.txt"), "b\n").expect("b");
        let dir = workspace.display().to_string();
        let start = commit(files.checkpoint(&dir, "t1 start"));
        std::fs::write(workspace.join("src/a.txt"), "one\n2\nthree\n").expect("a");
        std::fs::remove_file(workspace.join("b.txt")).expect("b");
        std::fs::write(workspace.join("c.txt"), "new\n").expect("c");
        let end = commit(files.checkpoint(&dir, "t1 end"));
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
        assert_eq!(
            (
                by_path("src/a.txt").status,
                by_path("src/a.txt").added,
                by_path("src/a.txt").removed
            ),
            (ChangeStatus::Modified, Some(2), Some(1))
        );
        assert_eq!(by_path("b.txt").status, ChangeStatus::Deleted);
        assert_eq!(by_path("c.txt").status, ChangeStatus::Added);
        let FileReply::Read { data, text, .. } = files.read_version(&start, "src/a.txt").expect("read")
        else {
            panic!("read");
        };
        assert!(text);
        assert_eq!(
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, data).expect("b64"),
            b"one\ntwo\n"
        );
        assert!(matches!(
            files.read_version(&start, "../etc/passwd"),
            Err(FileError::PermissionDenied(_))
        ));
        assert!(matches!(
            files.read_version(&start, "c.txt"),
            Err(FileError::NotFound(_))
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
        // The relay's own repository is not part of the working directory's checkpoints.
        let again = commit(files.checkpoint(&dir, "again"));
        let FileReply::Changes { files: none } = files.changes(&start, &again).expect("changes") else {
            panic!("changes");
        };
        assert!(none.is_empty(), "{none:?}");
    }

    #[test]
    fn a_repository_of_its_own_is_staged_and_committed() {
        let root = tempfile::tempdir().expect("root");
        let files = Files::new(root.path(), 1024 * 1024).expect("files");
        let workspace = root.path().canonicalize().expect("real").join("repo");
        std::fs::create_dir_all(&workspace).expect("dir");
        let dir = workspace.display().to_string();
        assert!(matches!(
            files.repository(&dir, RepositoryOp::Inspect),
            Ok(FileReply::Repository { is_repository: false })
        ));
        let mut init = Command::new("git");
        init.arg("-C").arg(&workspace);
        run_git(init, &["init", "-q"]).expect("git init");
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
        let mut log = Command::new("git");
        log.arg("-C").arg(&workspace);
        let subject = text(run_git(log, &["log", "-1", "--format=%H %s"]).expect("log"));
        assert_eq!(subject, format!("{head} From the relay"));
    }
}
