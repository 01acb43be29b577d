//! The work a shard queues for one runner's stream (prompts, file operations, terminal input, …), counted in
//! bytes. A runner that stops reading its stream (stuck, or its link stalled) would otherwise let that queue
//! grow with every client's input for as long as it lasts: past [`WORK_QUEUE_BYTES`] unsent, new work for it
//! (a session, a turn, a terminal, typed input, a file operation) is refused as [`Refused::Busy`] ("retry"),
//! and taken again once it reads. What ends or steers work already there (a turn's control and cancel, a
//! session's disposal, a terminal's kill and resize, an unwatch, a terminal's takeover) is small and always
//! queued: refusing it would leave turns running and processes behind.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{Stream, StreamExt};

use crate::pb;

/// Bytes of work one runner may have queued and not yet taken by its stream.
pub const WORK_QUEUE_BYTES: usize = 32 * 1024 * 1024;

/// Why work was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The runner's stream ended (or the runner is not registered).
    Gone,
    /// The runner has [`WORK_QUEUE_BYTES`] not yet taken.
    Busy,
}

/// The sending side of one runner's work queue.
#[derive(Clone)]
pub(crate) struct WorkQueue {
    sender: mpsc::UnboundedSender<pb::RunnerWork>,
    queued: Arc<AtomicUsize>,
    /// When the last refusal was logged (unix s): at most one warning every 10 s.
    warned_at: Arc<AtomicU64>,
}

impl WorkQueue {
    /// A queue, and the stream its runner's registration answers with (which counts out what it takes).
    pub(crate) fn new() -> (WorkQueue, impl Stream<Item = pb::RunnerWork> + Send + 'static) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let taken = queued.clone();
        let stream = UnboundedReceiverStream::new(receiver).map(move |work: pb::RunnerWork| {
            taken.fetch_sub(work.encoded_len(), Ordering::AcqRel);
            work
        });
        let queue = WorkQueue {
            sender,
            queued,
            warned_at: Arc::default(),
        };
        (queue, stream)
    }

    /// Queue `work`, unless the runner's stream is gone, or it is new work and [`WORK_QUEUE_BYTES`] wait not yet
    /// taken (one piece larger than that still goes to an empty queue). The budget is checked and then counted
    /// without one step for both: senders racing past it at once overshoot it by a piece each, no more.
    pub(crate) fn send(&self, work: pb::RunnerWork) -> Result<(), Refused> {
        let size = work.encoded_len();
        let queued = self.queued.load(Ordering::Acquire);
        if queued > 0 && queued + size > WORK_QUEUE_BYTES && !steers_existing_work(&work) {
            self.warn_refused(queued);
            return Err(Refused::Busy);
        }
        self.queued.fetch_add(size, Ordering::AcqRel);
        if self.sender.send(work).is_err() {
            self.queued.fetch_sub(size, Ordering::AcqRel);
            return Err(Refused::Gone);
        }
        Ok(())
    }

    fn warn_refused(&self, queued: usize) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        let last = self.warned_at.load(Ordering::Relaxed);
        if now >= last + 10
            && self
                .warned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                queued,
                "a runner is not taking its work; refusing new work until it does"
            );
        }
    }

    /// Bytes queued and not yet taken.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}

/// Work that ends or steers what the runner already has: always queued, however full the queue.
fn steers_existing_work(work: &pb::RunnerWork) -> bool {
    use crate::pb::runner_work::Work;
    use crate::pb::terminal_work::Work as TerminalWork;
    match &work.work {
        Some(Work::Control(_) | Work::DisposeSession(_) | Work::AdoptTerminal(_)) => true,
        Some(Work::Terminal(terminal)) => {
            matches!(
                terminal.work,
                Some(TerminalWork::Kill(_) | TerminalWork::Resize(_))
            )
        }
        Some(Work::File(request)) => matches!(
            serde_json::from_slice::<relay_runner::files::FileOp>(&request.op),
            Ok(relay_runner::files::FileOp::Unwatch { .. })
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::runner_work::Work;

    fn input(bytes: usize) -> pb::RunnerWork {
        pb::RunnerWork {
            work: Some(Work::File(pb::FileRequest {
                id: 1,
                tenant: "acme".into(),
                op: vec![b'x'; bytes],
                host_scope: None,
            })),
        }
    }

    /// A runner that does not read holds at most the budget: past it work is refused, and once its stream
    /// takes what waits, work is queued again — in order, none lost of what was accepted.
    #[tokio::test]
    async fn a_runner_that_does_not_read_holds_at_most_the_budget() {
        let (queue, stream) = WorkQueue::new();
        let mut stream = Box::pin(stream);
        let mut accepted = 0;
        while queue.send(input(1024 * 1024)).is_ok() {
            accepted += 1;
            assert!(accepted <= 64, "the queue took {accepted} MiB");
        }
        assert!(
            queue.queued() <= WORK_QUEUE_BYTES,
            "{} bytes queued",
            queue.queued()
        );
        assert!(accepted >= 30, "refused early, at {accepted} MiB");
        assert_eq!(queue.send(input(1024 * 1024)), Err(Refused::Busy));
        // Filled to the last few bytes: even the smallest new work is refused now ...
        let mut size = 512 * 1024;
        while size > 0 {
            while queue.send(input(size)).is_ok() {
                accepted += 1;
            }
            size /= 2;
        }
        assert_eq!(queue.send(input(0)), Err(Refused::Busy));
        // ... but what ends or steers work already there still goes.
        let unwatch = pb::RunnerWork {
            work: Some(Work::File(pb::FileRequest {
                id: 2,
                tenant: "acme".into(),
                op: serde_json::to_vec(&relay_runner::files::FileOp::Unwatch { watch: 7 }).expect("json"),
                host_scope: None,
            })),
        };
        let cancel = pb::RunnerWork {
            work: Some(Work::Control(pb::AgentTurnControl {
                turn: 1,
                control: b"\"cancelled\"".to_vec(),
            })),
        };
        assert_eq!(queue.send(unwatch), Ok(()));
        assert_eq!(queue.send(cancel), Ok(()));
        accepted += 2;
        for _ in 0..accepted {
            stream.next().await.expect("queued work");
        }
        assert_eq!(queue.queued(), 0, "everything taken is counted out");
        assert_eq!(
            queue.send(input(1024 * 1024)),
            Ok(()),
            "taken again once it reads"
        );
    }

    /// One piece of work over the budget still goes when nothing waits (a large file write is not refused for
    /// ever).
    #[test]
    fn one_large_piece_goes_to_an_empty_queue() {
        let (queue, _stream) = WorkQueue::new();
        assert_eq!(queue.send(input(WORK_QUEUE_BYTES + 1)), Ok(()));
        assert_eq!(queue.send(input(1)), Err(Refused::Busy));
    }
}
