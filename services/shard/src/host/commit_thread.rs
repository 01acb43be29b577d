//! Where hosts' commit loops run: a small pool of single-threaded tokio runtimes, each on an OS thread of its
//! own, once a process installs it ([`install`]); otherwise the caller's runtime. A host is pinned to one
//! thread of the pool (by its key), so one busy host shares its thread with only some of the others.
//!
//! A commit is a handful of round trips to the store (begin, the batch's statements, commit), and each resumes
//! the commit loop. On the process's main runtime those resumptions wait in the same run queues as every
//! connection task; with thousands of connections being written to (one wake-up each per published batch), a
//! commit's median time grew from under 0.5 ms to 10–25 ms under load (`scripts/bench peers`, embedded
//! `serve`, 2,000 subscribers x 50 actions/s), and every action's delivery waited for it. On threads of their
//! own the commit loops are resumed as soon as the store answers, and the operating system shares the cores
//! between them and the runtime's workers. On Postgres the store answers on these threads too: each thread's
//! commits go through connections opened on it ([`relay_store::mark_commit_thread`]). Work that belongs with
//! the commits — the shard's Redis publisher, whose connection is driven by the runtime it was opened on — is
//! started there too ([`run_on_pool`]).
//!
//! Tests that build hosts inside their own runtimes do not install it, so the loops keep that runtime's
//! clock (paused time) and die with it.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

use tokio::runtime::Handle;

static COMMIT_RUNTIMES: OnceLock<Vec<Handle>> = OnceLock::new();

/// The environment variable that sets the pool's size (default: the number of cores, 2 to 4).
pub const THREADS_VAR: &str = "AHP_RELAY_COMMIT_THREADS";

/// Why the commit threads could not start.
#[derive(Debug, thiserror::Error)]
pub enum CommitThreadError {
    #[error("building a commit runtime: {0}")]
    Runtime(#[from] std::io::Error),
    #[error("AHP_RELAY_COMMIT_THREADS is a number of threads from 1 to 64, not {0:?}")]
    Threads(String),
}

/// How many commit threads this process runs: [`THREADS_VAR`], else the number of cores within 2 to 4.
pub fn pool_size() -> Result<usize, CommitThreadError> {
    match std::env::var(THREADS_VAR) {
        Ok(value) => match value.trim().parse::<usize>() {
            Ok(threads) if (1..=64).contains(&threads) => Ok(threads),
            _ => Err(CommitThreadError::Threads(value)),
        },
        Err(_) => Ok(std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(2)
            .clamp(2, 4)),
    }
}

/// Start this process's commit threads (idempotent), [`pool_size`] of them. Later hosts' commit loops run on
/// them.
pub fn install() -> Result<(), CommitThreadError> {
    install_threads(pool_size()?)
}

/// [`install`] with `threads` threads.
pub fn install_threads(threads: usize) -> Result<(), CommitThreadError> {
    if COMMIT_RUNTIMES.get().is_some() {
        return Ok(());
    }
    let mut handles = Vec::with_capacity(threads);
    let mut runtimes = Vec::with_capacity(threads);
    for index in 0..threads.max(1) {
        let name = format!("ahp-commit-{index}");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name(&name)
            .build()?;
        handles.push(runtime.handle().clone());
        runtimes.push((name, runtime));
    }
    if COMMIT_RUNTIMES.set(handles).is_err() {
        return Ok(()); // another caller won the race; these runtimes are dropped unused
    }
    for (name, runtime) in runtimes {
        std::thread::Builder::new()
            .name(name)
            // Drives the runtime (its tasks, timers and sockets) for the rest of the process's life; the store
            // opens this thread's Postgres commit connections on it.
            .spawn(move || {
                relay_store::mark_commit_thread();
                runtime.block_on(std::future::pending::<()>())
            })?;
    }
    Ok(())
}

/// The commit thread `key` is pinned to, if the pool is installed.
fn lane(key: &impl Hash) -> Option<&'static Handle> {
    let handles = COMMIT_RUNTIMES.get()?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    handles.get((hasher.finish() % handles.len() as u64) as usize)
}

/// Run `future` on the commit thread `key` is pinned to if the pool is installed, else on the current runtime.
pub fn spawn<F>(key: &impl Hash, future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match lane(key) {
        Some(handle) => {
            handle.spawn(future);
        }
        None => {
            tokio::spawn(future);
        }
    }
}

/// Run `future` to its end on the pool's first thread (on the current runtime if there is no pool) and return
/// its output: for what must be driven beside the commits, like a connection opened there.
pub async fn run_on_pool<F, T>(future: F) -> Option<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    match COMMIT_RUNTIMES.get().and_then(|handles| handles.first()) {
        Some(handle) => handle.spawn(future).await.ok(),
        None => Some(future.await),
    }
}
