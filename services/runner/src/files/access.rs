//! Tenants' files as the host reaches them, wherever the workspace is: in this process ([`super::FileService`],
//! `serve`) or on a runner over gRPC (`relay_rpc`'s remote files, a shard). The host asks through
//! [`FileAccess`] and never knows which.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use tokio::sync::{mpsc, oneshot};

use super::protocol::{ChangeKind, FileError, FileOp, FileReply};

/// How long one operation may take before it is answered "unavailable".
pub const OPERATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The answer of an operation sent to whoever runs it (a file server, a runner).
pub type PendingAnswer = oneshot::Receiver<Result<FileReply, FileError>>;

/// Wait for `answer` for at most [`OPERATION_TIMEOUT`]: if its sender went, `gone` says why; if it took too
/// long, `forget` drops what waited for it.
pub async fn await_answer(
    answer: PendingAnswer,
    gone: &str,
    forget: impl FnOnce(),
) -> Result<FileReply, FileError> {
    match tokio::time::timeout(OPERATION_TIMEOUT, answer).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(FileError::Unavailable(gone.to_string())),
        Err(_) => {
            forget();
            Err(FileError::Unavailable(format!(
                "the file operation took longer than {} s",
                OPERATION_TIMEOUT.as_secs()
            )))
        }
    }
}

/// A file operation under way.
pub type FileFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, FileError>> + Send + 'a>>;

/// Where a watch's changes go (coalesced batches of (path, change), at most [`WATCH_BACKLOG`] of them untaken).
pub type ChangeSink = mpsc::Sender<Vec<(String, ChangeKind)>>;

/// What a watch's changes are read from.
pub type ChangeStream = mpsc::Receiver<Vec<(String, ChangeKind)>>;

/// Batches of a watch's changes (each at most [`super::watch::MAX_CHANGES_PER_REPORT`] paths, one every 100 ms at
/// most) that may wait for their reader. A reader further behind overflows the watch, as inotify's queue does:
/// the watch ends there ([`offer_changes`]), and whoever watched makes it again and says the root changed.
pub const WATCH_BACKLOG: usize = 64;

/// A watch's sink and the stream its changes are read from.
pub fn change_channel() -> (ChangeSink, ChangeStream) {
    mpsc::channel(WATCH_BACKLOG)
}

/// Hand `changes` to `sink` without waiting; false when the watch must end: its reader is
/// [`WATCH_BACKLOG`] batches behind, or gone. The caller then drops the sink, which ends the reader's stream.
pub fn offer_changes(sink: &ChangeSink, changes: Vec<(String, ChangeKind)>) -> bool {
    match sink.try_send(changes) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(_)) => {
            tracing::warn!(
                backlog = WATCH_BACKLOG,
                "a resource watch's reader fell behind; the watch ends and is made again"
            );
            false
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}

/// What to watch.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    pub path: String,
    pub recursive: bool,
    pub includes: Vec<String>,
    pub excludes: Vec<String>,
}

/// An open watch: dropped, it stops.
pub struct WatchHandle {
    release: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl WatchHandle {
    /// A watch that `release` stops.
    pub fn new(release: impl FnOnce() + Send + Sync + 'static) -> WatchHandle {
        WatchHandle {
            release: Some(Box::new(release)),
        }
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// Tenants' files.
pub trait FileAccess: Send + Sync + 'static {
    /// `tenant`'s part of the workspace (the root its file URIs must lie in), when known.
    fn tenant_root(&self, tenant: &str) -> Option<PathBuf>;
    /// Run `op` on `tenant`'s files; with a `scope` (a host of the tenant) on that host's directory alone,
    /// served where nothing else of the tenant is seen (a client whose token is scoped to hosts).
    fn call_within<'a>(
        &'a self,
        tenant: &'a str,
        scope: Option<&'a str>,
        op: FileOp,
    ) -> FileFuture<'a, FileReply>;
    /// Watch a path of `tenant`'s files (within `scope`, as [`FileAccess::call_within`]); changes go to
    /// `changes` until the handle is dropped.
    fn watch_within<'a>(
        &'a self,
        tenant: &'a str,
        scope: Option<&'a str>,
        spec: WatchSpec,
        changes: ChangeSink,
    ) -> FileFuture<'a, WatchHandle>;

    /// Run `op` on `tenant`'s files (the relay's own work: checkpoints, completions).
    fn call<'a>(&'a self, tenant: &'a str, op: FileOp) -> FileFuture<'a, FileReply> {
        self.call_within(tenant, None, op)
    }
}
