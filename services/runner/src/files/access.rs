//! Tenants' files as the host reaches them, wherever the workspace is: in this process ([`super::FileService`],
//! `serve`) or on a runner over gRPC (`relay_rpc`'s remote files, a shard). The host asks through
//! [`FileAccess`] and never knows which.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use tokio::sync::mpsc;

use super::protocol::{ChangeKind, FileError, FileOp, FileReply};

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
    /// Run `op` on `tenant`'s files.
    fn call<'a>(&'a self, tenant: &'a str, op: FileOp) -> FileFuture<'a, FileReply>;
    /// Watch a path of `tenant`'s files; changes go to `changes` until the handle is dropped.
    fn watch<'a>(
        &'a self,
        tenant: &'a str,
        spec: WatchSpec,
        changes: ChangeSink,
    ) -> FileFuture<'a, WatchHandle>;
}
