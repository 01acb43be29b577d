//! What a shard waits for from its runners' file servers: the operations under way (each answered by the
//! runner it was sent to, and only by it) and the watches open (their changes handed to their readers without
//! waiting; a reader that falls behind ends its watch). The floor under both the runner pool
//! ([`crate::placement`], which hands it what runners report) and [`crate::remote_files`] (which sends the
//! operations).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use relay_runner::files::{ChangeKind, ChangeSink, FileError, FileReply};
use tokio::sync::oneshot;

use crate::pb;

/// Where an operation's answer goes.
pub(crate) type Answer = oneshot::Sender<Result<FileReply, FileError>>;

/// What the shard waits for from runners.
#[derive(Default)]
pub(crate) struct FileRequests {
    pub(crate) next: AtomicU64,
    /// Operations under way: their runner, and where the answer goes.
    pub(crate) pending: Mutex<HashMap<u64, (u64, Answer)>>,
    /// Open watches: their runner, and where their changes go.
    pub(crate) watches: Mutex<HashMap<u64, (u64, ChangeSink)>>,
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
