//! Where hosts' commit loops run: a single-threaded tokio runtime on an OS thread of its own, once a process
//! installs it ([`install`]); otherwise the caller's runtime.
//!
//! A commit is a handful of round trips to the store (begin, the batch's statements, commit), and each resumes
//! the commit loop. On the process's main runtime those resumptions wait in the same run queues as every
//! connection task; with thousands of connections being written to (one wake-up each per published batch), a
//! commit's median time grew from under 0.5 ms to 10–25 ms under load (`scripts/bench peers`, embedded
//! `serve`, 2,000 subscribers x 50 actions/s), and every action's delivery waited for it. On a thread of its
//! own the commit loop is resumed as soon as the store answers, and the operating system shares the cores
//! between it and the runtime's workers.
//!
//! Tests that build hosts inside their own runtimes do not install it, so the loops keep that runtime's
//! clock (paused time) and die with it.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Handle;

static COMMIT_RUNTIME: OnceLock<Handle> = OnceLock::new();

/// Why the commit thread could not start.
#[derive(Debug, thiserror::Error)]
pub enum CommitThreadError {
    #[error("building the commit runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Start the commit thread for this process (idempotent). Later hosts' commit loops run on it.
pub fn install() -> Result<(), CommitThreadError> {
    if COMMIT_RUNTIME.get().is_some() {
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("ahp-commit")
        .build()?;
    let handle = runtime.handle().clone();
    if COMMIT_RUNTIME.set(handle).is_err() {
        return Ok(()); // another caller won the race; this runtime is dropped unused
    }
    std::thread::Builder::new()
        .name("ahp-commit".into())
        // Drives the runtime (its tasks, timers and sockets) for the rest of the process's life.
        .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    Ok(())
}

/// Run `future` on the commit thread if one is installed, else on the current runtime.
pub fn spawn<F>(future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match COMMIT_RUNTIME.get() {
        Some(handle) => {
            handle.spawn(future);
        }
        None => {
            tokio::spawn(future);
        }
    }
}
