//! Tenants' files through a shard (AHP `resource*`, `createResourceWatch`): the workspace is on the runners, so a
//! shard asks the runner that holds the tenant's workspace — one dedicated to the tenant, else a shared one with
//! a workspace — with `FileRequest`s on its stream and waits for the `FileAnswer`; a watch's changes come back as
//! `FileChanged` reports. When that runner goes, its pending operations are answered "unavailable" and its
//! watches end.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use relay_runner::files::access::await_answer;
use relay_runner::files::{
    ChangeKind, ChangeSink, FileAccess, FileError, FileFuture, FileOp, FileReply, WatchHandle, WatchSpec,
};
use tokio::sync::oneshot;

use crate::pb;
use crate::pb::runner_work::Work;
use crate::placement::RunnerPool;

/// Where an operation's answer goes.
type Answer = oneshot::Sender<Result<FileReply, FileError>>;

/// What the shard waits for from runners.
#[derive(Default)]
pub(crate) struct FileRequests {
    next: AtomicU64,
    /// Operations under way: their runner, and where the answer goes.
    pending: Mutex<HashMap<u64, (u64, Answer)>>,
    /// Open watches: their runner, and where their changes go.
    watches: Mutex<HashMap<u64, (u64, ChangeSink)>>,
}

impl FileRequests {
    /// A runner's answer.
    pub(crate) fn answered(&self, runner: u64, answer: pb::FileAnswer) {
        // Only the runner that was asked answers (ids are sequential: another runner could guess them).
        let waiting = {
            let mut pending = self.pending.lock();
            match pending.get(&answer.id) {
                Some((asked, _)) if *asked == runner => {
                    pending.remove(&answer.id).map(|(_, waiting)| waiting)
                }
                _ => None,
            }
        };
        let Some(waiting) = waiting else {
            return;
        };
        let result = serde_json::from_slice(&answer.result).unwrap_or_else(|error| {
            Err(FileError::Unavailable(format!(
                "unreadable answer of the runner: {error}"
            )))
        });
        let _ = waiting.send(result);
    }

    /// A runner's watch saw changes — or, with no changes at all, ended there (its file server went): its
    /// sink goes, so whoever watched makes it again.
    pub(crate) fn changed(&self, runner: u64, changed: pb::FileChanged) {
        if changed.changes.is_empty() {
            let mut watches = self.watches.lock();
            if watches
                .get(&changed.watch)
                .is_some_and(|(placed, _)| *placed == runner)
            {
                watches.remove(&changed.watch);
            }
            return;
        }
        let Ok(changes) = serde_json::from_slice::<Vec<(String, ChangeKind)>>(&changed.changes) else {
            return;
        };
        let mut watches = self.watches.lock();
        if let Some((placed, sink)) = watches.get(&changed.watch) {
            // Its reader fell behind: the watch ends here, and whoever watched makes it again.
            if *placed == runner && !relay_runner::files::offer_changes(sink, changes) {
                watches.remove(&changed.watch);
            }
        }
    }

    /// The runner went: what waited on it is answered "unavailable"; its watches end.
    pub(crate) fn runner_lost(&self, runner: u64) {
        self.pending.lock().retain(|_, (placed, _)| *placed != runner);
        self.watches.lock().retain(|_, (placed, _)| *placed != runner);
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn changed(watch: u64, path: &str) -> pb::FileChanged {
        pb::FileChanged {
            watch,
            changes: serde_json::to_vec(&vec![(path.to_string(), ChangeKind::Updated)]).expect("json"),
        }
    }

    /// A watch whose reader does not keep up is bounded: past its backlog the watch ends (its reader gets what
    /// was queued, then the end, and makes the watch again) instead of queueing a runner's changes for ever.
    #[tokio::test]
    async fn a_watch_whose_reader_falls_behind_ends_after_its_backlog() {
        let requests = FileRequests::default();
        let (sink, mut stream) = relay_runner::files::change_channel();
        requests.watches.lock().insert(7, (1, sink));
        let backlog = relay_runner::files::WATCH_BACKLOG;
        for n in 0..backlog * 3 {
            requests.changed(1, changed(7, &format!("file-{n}")));
        }
        assert!(
            !requests.watches.lock().contains_key(&7),
            "the watch still queues"
        );
        let mut read = 0;
        while let Some(batch) = stream.recv().await {
            assert_eq!(batch[0].0, format!("file-{read}"), "in order");
            read += 1;
        }
        assert_eq!(read, backlog, "what was queued arrives, then the end");
    }

    /// Changes of another runner's watch with the same number are not taken.
    #[tokio::test]
    async fn only_the_runner_that_holds_a_watch_reports_its_changes() {
        let requests = FileRequests::default();
        let (sink, mut stream) = relay_runner::files::change_channel();
        requests.watches.lock().insert(7, (1, sink));
        requests.changed(2, changed(7, "forged"));
        requests.changed(1, changed(7, "real"));
        assert_eq!(stream.recv().await.expect("a batch")[0].0, "real");
    }
}
