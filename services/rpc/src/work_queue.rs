//! The work a shard queues for one runner's stream (prompts, file operations, terminal input, …), counted in
//! bytes. A runner that stops reading its stream (stuck, or its link stalled) would otherwise let that queue
//! grow with every client's input for as long as it lasts: past [`WORK_QUEUE_BYTES`] unsent, work for it is
//! refused the way work for a runner that went is ("unavailable; retry"), and taken again once it reads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{Stream, StreamExt};

use crate::pb;

/// Bytes of work one runner may have queued and not yet taken by its stream.
pub const WORK_QUEUE_BYTES: usize = 32 * 1024 * 1024;

/// The sending side of one runner's work queue.
#[derive(Clone)]
pub(crate) struct WorkQueue {
    sender: mpsc::UnboundedSender<pb::RunnerWork>,
    queued: Arc<AtomicUsize>,
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
        (WorkQueue { sender, queued }, stream)
    }

    /// Queue `work`; false when the runner's stream is gone, or has [`WORK_QUEUE_BYTES`] not yet taken (one
    /// piece of work larger than that still goes to an empty queue).
    pub(crate) fn send(&self, work: pb::RunnerWork) -> bool {
        let size = work.encoded_len();
        let queued = self.queued.load(Ordering::Acquire);
        if queued > 0 && queued + size > WORK_QUEUE_BYTES {
            tracing::warn!(
                queued,
                "a runner is not taking its work; refusing more until it does"
            );
            return false;
        }
        self.queued.fetch_add(size, Ordering::AcqRel);
        if self.sender.send(work).is_err() {
            self.queued.fetch_sub(size, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Bytes queued and not yet taken.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
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
        while queue.send(input(1024 * 1024)) {
            accepted += 1;
            assert!(accepted <= 64, "the queue took {accepted} MiB");
        }
        assert!(
            queue.queued() <= WORK_QUEUE_BYTES,
            "{} bytes queued",
            queue.queued()
        );
        assert!(accepted >= 30, "refused early, at {accepted} MiB");
        for _ in 0..accepted {
            stream.next().await.expect("queued work");
        }
        assert_eq!(queue.queued(), 0, "everything taken is counted out");
        assert!(queue.send(input(1024 * 1024)), "taken again once it reads");
    }

    /// One piece of work over the budget still goes when nothing waits (a large file write is not refused for
    /// ever).
    #[test]
    fn one_large_piece_goes_to_an_empty_queue() {
        let (queue, _stream) = WorkQueue::new();
        assert!(queue.send(input(WORK_QUEUE_BYTES + 1)));
        assert!(!queue.send(input(1)));
    }
}
