//! Running git for the tenant's file server: in the shadow repository or the session's own repository, with the
//! configuration [`crate::git`] forces, the system's directories only, a deadline, and output bounded.

use std::path::Path;
use std::process::Command;

use relay_sandbox::confine::Narrowing;

use crate::git::ForcedConfig;

use super::protocol::FileError;

/// Who the relay's commits are by (checkpoints, and a repository's commit when it names nobody).
pub(crate) const AUTHOR: [(&str, &str); 4] = [
    ("GIT_AUTHOR_NAME", "ahp-relay"),
    ("GIT_AUTHOR_EMAIL", "ahp-relay@localhost"),
    ("GIT_COMMITTER_NAME", "ahp-relay"),
    ("GIT_COMMITTER_EMAIL", "ahp-relay@localhost"),
];

/// What git on a session's repository may see besides it: the system, read-only.
pub(crate) const SYSTEM: [&str; 7] = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc"];

/// Run git with `args` on the repository `workspace` with `forced` configuration, in a Landlock domain of
/// `workspace` alone (and the system, read-only).
pub(crate) fn repository_git(
    workspace: &Path,
    forced: &ForcedConfig,
    args: &[&str],
) -> Result<Vec<u8>, FileError> {
    let system: Vec<&Path> = SYSTEM.iter().map(Path::new).collect();
    let devices = ["/dev/null", "/dev/urandom", "/dev/random"].map(Path::new);
    let mut narrowing = Narrowing::new(&system, &[workspace], &devices)
        .map_err(|error| FileError::Unavailable(format!("cannot confine git: {error}")))?;
    let mut command = forced.command();
    command.arg("-C").arg(workspace);
    // SAFETY: entering a prepared Landlock domain makes only system calls (prctl, landlock_restrict_self).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || narrowing.enter());
    }
    run_git(command, args, false)
}

/// How long one git command may run (the runner gives up on an operation sooner, and cancels it).
pub(crate) const GIT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// Run a prepared git command (from [`ForcedConfig::command`]) with `args`; its stdout, or why it failed. On the
/// checkpoints' repository (`killable`) it is killed when the operation is cancelled ([`super::cancel`]) or runs
/// past [`GIT_DEADLINE`] (their stale locks are cleared before the next checkpoint); on the user's repository it
/// is never killed (its locks would stay there for the user's own git to trip over).
pub(crate) fn run_git(mut command: Command, args: &[&str], killable: bool) -> Result<Vec<u8>, FileError> {
    use std::io::Read;
    use std::process::Stdio;
    let name = args.first().copied().unwrap_or_default();
    // A cancelled operation runs no more git (not even the retry of what was killed).
    if killable && super::cancel::cancelled() {
        return Err(FileError::Unavailable("cancelled".into()));
    }
    command
        .args(args)
        .envs(AUTHOR)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|error| FileError::Unavailable(format!("cannot run git: {error}")))?;
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(FileError::Unavailable("cannot run git: no pipes".into()));
    };
    let deadline = std::time::Instant::now() + GIT_DEADLINE;
    let (stdout, stderr, status) = std::thread::scope(|scope| {
        let stdout = scope.spawn(move || {
            let mut bytes = Vec::new();
            let _ = out.read_to_end(&mut bytes);
            bytes
        });
        let stderr = scope.spawn(move || {
            let mut bytes = Vec::new();
            let _ = err.read_to_end(&mut bytes);
            bytes
        });
        let mut pause = std::time::Duration::from_millis(1);
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Ok(status),
                Ok(None) => {
                    let stop = if !killable {
                        None
                    } else if super::cancel::cancelled() {
                        Some("cancelled".to_string())
                    } else if std::time::Instant::now() >= deadline {
                        Some(format!(
                            "git {name} took longer than {} s",
                            GIT_DEADLINE.as_secs()
                        ))
                    } else {
                        None
                    };
                    if let Some(stop) = stop {
                        let _ = child.kill();
                        let _ = child.wait();
                        break Err(stop);
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(20));
                }
                Err(error) => break Err(format!("cannot wait for git: {error}")),
            }
        };
        (
            stdout.join().unwrap_or_default(),
            stderr.join().unwrap_or_default(),
            status,
        )
    });
    match status {
        Ok(status) if status.success() => Ok(stdout),
        Ok(_) => Err(FileError::Unavailable(format!(
            "git {name}: {}",
            String::from_utf8_lossy(&stderr).trim()
        ))),
        Err(stop) => Err(FileError::Unavailable(stop)),
    }
}

pub(crate) fn text(bytes: Vec<u8>) -> String {
    String::from_utf8_lossy(&bytes).trim().to_string()
}
