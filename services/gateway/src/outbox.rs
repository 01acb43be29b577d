//! A connection's socket and its queue of frames being written to it: bounded (a slow consumer is closed with 1013),
//! pings among them, shrunk back to an idle connection's size once drained, and its close written within
//! patience.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use bytes::Bytes;
use futures_util::Sink;
use relay_core::{telemetry, Limits};

use crate::closes::*;

/// Room (in frames or batches) a connection's queues keep once drained; beyond it they are freed, so a
/// connection that once took a burst goes back to an idle connection's size.
pub(crate) const IDLE_QUEUE_CAPACITY: usize = 16;

/// How long a closing connection may take to write what it still has queued and its close frame.
pub(crate) const CLOSE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// What is queued for the socket.
pub(crate) enum Outbound {
    /// A frame, and when it was stamped if it is a bus event (for the fan-out latency).
    Frame(Bytes, Option<Instant>),
    /// A WebSocket ping (liveness check).
    Ping,
}

/// The socket's write half and what is queued for it: frames are handed to the socket as the socket takes
/// them and flushed once when the queue is empty, so a batch leaves in as few TCP segments as it fits even with
/// `TCP_NODELAY`, while a lone frame leaves at once. Once a flush has put bus events on the socket, their
/// fan-out latencies are recorded.
///
/// Laid out in this order (`repr(C)`): the queue and its counts, which a lane reads at every write, first; the
/// socket, of which a write reads only a little, last (see [`crate::member::Delivery`]).
#[repr(C)]
pub(crate) struct Outbox {
    pub(crate) queue: VecDeque<Outbound>,
    /// Bytes of the frames in `queue`.
    pub(crate) bytes: usize,
    pub(crate) max_frames: usize,
    /// More than this queued (or held in the backlog) closes the connection as a slow consumer.
    pub(crate) max_bytes: usize,
    /// Frames handed to the socket since its last flush.
    pub(crate) unflushed: bool,
    /// Stamps of the bus events handed to the socket since its last flush.
    pub(crate) stamps: Vec<Instant>,
    /// Where their stamp → socket times go (the handle is looked up once, not per flush).
    pub(crate) latency: telemetry::FanoutLatency,
    /// The whole socket, not a split half: whoever holds the connection's lock reads or writes it, so no
    /// second lock is taken per read or write.
    pub(crate) socket: WebSocket,
}

impl Outbox {
    pub(crate) fn new(socket: WebSocket, limits: &Limits) -> Self {
        Self {
            socket,
            queue: VecDeque::new(),
            bytes: 0,
            unflushed: false,
            stamps: Vec::new(),
            latency: telemetry::fanout_latency(),
            max_frames: limits.outbound_queue_frames.max(1),
            max_bytes: limits.outbound_queue_bytes,
        }
    }

    /// Queue a frame; a slow consumer when the queue is full in frames or in bytes.
    pub(crate) fn push(&mut self, item: Outbound) -> Result<(), Close> {
        let size = match &item {
            Outbound::Frame(frame, _) => frame.len(),
            Outbound::Ping => 0,
        };
        if self.queue.len() >= self.max_frames || self.bytes + size > self.max_bytes {
            return Err(slow_consumer());
        }
        self.bytes += size;
        self.queue.push_back(item);
        Ok(())
    }

    /// Queue a ping unless the queue is full (a full queue is a slow consumer the next delivery closes).
    pub(crate) fn ping(&mut self) {
        if self.queue.len() < self.max_frames {
            self.queue.push_back(Outbound::Ping);
        }
    }

    pub(crate) fn has_work(&self) -> bool {
        !self.queue.is_empty() || self.unflushed
    }

    /// Past half its bound in frames or bytes: time to write before queueing more.
    pub(crate) fn pressing(&self) -> bool {
        self.queue.len() * 2 >= self.max_frames || self.bytes * 2 >= self.max_bytes
    }

    /// Completes once everything queued is written and flushed; an error closes the connection.
    pub(crate) async fn written(&mut self) -> Result<(), Close> {
        poll_fn(|cx| self.poll_write(cx))
            .await
            .map_err(|_| write_failed())
    }

    /// Hand queued frames to the socket as it takes them, then flush. Cancel-safe: a frame leaves the queue
    /// only when the socket has taken it.
    pub(crate) fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), axum::Error>> {
        self.poll_write_gathering(cx, None)
    }

    /// [`Outbox::poll_write`], putting the flushed frames' fan-out latencies (seconds) in `gathered` for the
    /// caller to record, if given, instead of recording them at once.
    pub(crate) fn poll_write_gathering(
        &mut self,
        cx: &mut Context<'_>,
        gathered: Option<&mut Vec<f64>>,
    ) -> Poll<Result<(), axum::Error>> {
        while !self.queue.is_empty() {
            ready!(std::pin::Pin::new(&mut self.socket).poll_ready(cx))?;
            let message = match self.queue.pop_front() {
                Some(Outbound::Frame(frame, stamp)) => {
                    self.bytes -= frame.len();
                    self.stamps.extend(stamp);
                    match Utf8Bytes::try_from(frame) {
                        Ok(text) => Message::Text(text),
                        Err(error) => {
                            tracing::error!(%error, "dropping a frame that is not UTF-8");
                            continue;
                        }
                    }
                }
                Some(Outbound::Ping) => Message::Ping(Bytes::new()),
                None => break,
            };
            std::pin::Pin::new(&mut self.socket).start_send(message)?;
            self.unflushed = true;
        }
        // A burst leaves the queue's room behind; an idle connection should not keep it.
        if self.queue.capacity() > IDLE_QUEUE_CAPACITY {
            self.queue = VecDeque::new();
        }
        if self.unflushed {
            ready!(std::pin::Pin::new(&mut self.socket).poll_flush(cx))?;
            self.unflushed = false;
            if !self.stamps.is_empty() {
                let flushed_at = Instant::now();
                match gathered {
                    Some(gathered) => gathered.extend(
                        self.stamps
                            .drain(..)
                            .map(|stamp| flushed_at.saturating_duration_since(stamp).as_secs_f64()),
                    ),
                    None => {
                        for stamp in self.stamps.drain(..) {
                            self.latency.delivered(stamp, flushed_at);
                        }
                    }
                }
                if self.stamps.capacity() > IDLE_QUEUE_CAPACITY {
                    self.stamps = Vec::new();
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    pub(crate) fn discard(&mut self) {
        self.queue.clear();
        self.bytes = 0;
    }

    /// Write what is queued, then the close frame; bounded by [`CLOSE_PATIENCE`].
    pub(crate) async fn close(mut self, code: u16, reason: String) {
        let _ = tokio::time::timeout(CLOSE_PATIENCE, async {
            if self.written().await.is_ok() {
                let frame = CloseFrame {
                    code,
                    reason: Utf8Bytes::from(reason),
                };
                let _ = self.socket.send(Message::Close(Some(frame))).await;
            }
        })
        .await;
    }

    /// The client closed: write what is queued and close our side; bounded by [`CLOSE_PATIENCE`].
    pub(crate) async fn finish(mut self) {
        let _ = tokio::time::timeout(CLOSE_PATIENCE, async {
            if self.written().await.is_ok() {
                use futures_util::SinkExt;
                let _ = SinkExt::close(&mut self.socket).await;
            }
        })
        .await;
    }
}
