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

/// Where a watch's changes go (coalesced batches of (path, change)).
pub type ChangeSink = mpsc::UnboundedSender<Vec<(String, ChangeKind)>>;

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
