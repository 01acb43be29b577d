//! Tenants' files through a shard (AHP `resource*`, `createResourceWatch`): the workspace is on the runners, so a
//! shard asks the runner that holds the tenant's workspace — one dedicated to the tenant, else a shared one with
//! a workspace — with `FileRequest`s on its stream and waits for the `FileAnswer`; a watch's changes come back as
//! `FileChanged` reports. When that runner goes, its pending operations are answered "unavailable" and its
//! watches end.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use relay_runner::files::access::await_answer;
use relay_runner::files::{
    ChangeSink, FileAccess, FileError, FileFuture, FileOp, FileReply, WatchHandle, WatchSpec,
};
use tokio::sync::oneshot;

use crate::file_requests::FileRequests;
use crate::pb;
use crate::pb::runner_work::Work;
use crate::placement::RunnerPool;

/// Tenants' files on the runners of `pool`.
pub struct RemoteFiles {
    pool: Arc<RunnerPool>,
    me: Weak<RemoteFiles>,
}

impl RemoteFiles {
    pub fn new(pool: Arc<RunnerPool>) -> Arc<RemoteFiles> {
        Arc::new_cyclic(|me| RemoteFiles { pool, me: me.clone() })
    }

    fn requests(&self) -> &FileRequests {
        self.pool.file_requests()
    }

    /// Send `op` to the runner holding `tenant`'s workspace; its answer.
    async fn run(
        &self,
        tenant: &str,
        scope: Option<&str>,
        op: FileOp,
        watch: Option<(u64, ChangeSink)>,
    ) -> Result<FileReply, FileError> {
        let body = serde_json::to_vec(&op)
            .map_err(|error| FileError::Unavailable(format!("cannot encode: {error}")))?;
        let Some(runner) = self.pool.workspace_runner(tenant) else {
            return Err(FileError::Unavailable(
                "no runner with a workspace is registered for this tenant (start `ahp-relay runner`)".into(),
            ));
        };
        let id = self.requests().next.fetch_add(1, Ordering::Relaxed) + 1;
        let (answer_tx, answer_rx) = oneshot::channel();
        self.requests().pending.lock().insert(id, (runner, answer_tx));
        if let Some((watch, sink)) = watch {
            self.requests().watches.lock().insert(watch, (runner, sink));
        }
        let work = Work::File(pb::FileRequest {
            id,
            tenant: tenant.to_string(),
            op: body,
            host_scope: scope.map(str::to_string),
        });
        if let Err(refused) = self.pool.send_to(runner, work) {
            self.requests().pending.lock().remove(&id);
            return Err(FileError::Unavailable(match refused {
                crate::work_queue::Refused::Gone => "the runner holding the workspace is gone; retry".into(),
                crate::work_queue::Refused::Busy => {
                    "the runner holding the workspace is not taking work (its queue is full); retry".into()
                }
            }));
        }
        await_answer(
            answer_rx,
            "the runner holding the workspace went away; retry",
            || {
                self.requests().pending.lock().remove(&id);
            },
        )
        .await
    }
}

/// Forget watch `watch` here and unwatch it on its runner (in the background).
fn unwatch(
    files: Weak<RemoteFiles>,
    tenant: &str,
    scope: Option<&str>,
    watch: u64,
) -> impl FnOnce() + Send + Sync + 'static {
    let (tenant, scope) = (tenant.to_string(), scope.map(str::to_string));
    move || {
        let Some(files) = files.upgrade() else { return };
        files.requests().watches.lock().remove(&watch);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = files
                    .run(&tenant, scope.as_deref(), FileOp::Unwatch { watch }, None)
                    .await;
            });
        }
    }
}

impl FileAccess for RemoteFiles {
    fn tenant_root(&self, tenant: &str) -> Option<PathBuf> {
        let runner = self.pool.workspace_runner(tenant)?;
        let root = self.pool.workspace_root_of(runner)?;
        let uri = relay_runner::acp::workspace::tenant_dir_uri(&root, tenant);
        uri.strip_prefix("file://").map(PathBuf::from)
    }

    fn call_within<'a>(
        &'a self,
        tenant: &'a str,
        scope: Option<&'a str>,
        op: FileOp,
    ) -> FileFuture<'a, FileReply> {
        Box::pin(self.run(tenant, scope, op, None))
    }

    fn watch_within<'a>(
        &'a self,
        tenant: &'a str,
        scope: Option<&'a str>,
        spec: WatchSpec,
        changes: ChangeSink,
    ) -> FileFuture<'a, WatchHandle> {
        Box::pin(async move {
            let watch = self.requests().next.fetch_add(1, Ordering::Relaxed) + 1;
            let op = FileOp::Watch {
                watch,
                path: spec.path,
                recursive: spec.recursive,
                includes: spec.includes,
                excludes: spec.excludes,
            };
            // Until the watch is handed over, it is unwatched on the runner if this fails, times out or is
            // dropped: the runner may have made it all the same.
            let handle = WatchHandle::new(unwatch(self.me.clone(), tenant, scope, watch));
            self.run(tenant, scope, op, Some((watch, changes))).await?;
            Ok(handle)
        })
    }
}
