//! One connection's delivery, shared by the connection's task and its host's fan-out lane
//! ([`crate::fanout`]): its reader of the host's bus, its delivery filter, the batches held while a call of its
//! own is in flight, and its socket with the queue of frames being written.
//!
//! Whoever holds the lock reads the bus and writes. The lane, when the bus rings, reads the connection's bus
//! dry, filters, and writes what it admits straight into the socket — the connection's task is not woken. The
//! task reads the client, writes its replies and pings, and takes over the writing when the socket pushes
//! back. So a connection's task wakes only when its socket is full, when it has input, when something a call
//! waits for arrived, or when it must close.
//!
//! The stream stays exact (invariant 3): every batch is read from the connection's own bus reader, in order,
//! under the lock; while a call is in flight batches are held until the reply's subscription changes apply.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use axum::extract::ws::Message;
use futures_util::task::AtomicWaker;
use futures_util::Stream;
use parking_lot::Mutex;
use relay_core::bus::{BusBatch, BusEventKind, BusReceiver};
use relay_core::link::SubscriptionChange;
use tokio::sync::broadcast::error::TryRecvError;

use crate::closes::*;
use crate::filter::SubscriptionFilter;
use crate::outbox::{Outbound, Outbox, IDLE_QUEUE_CAPACITY};

/// A connection as its lane and its task share it. `None` once the task has taken it back to close. The lock
/// and the delivery's first fields share a cache line (`repr(C)`, see [`Delivery`]).
#[repr(C)]
pub(crate) struct Member {
    delivery: Mutex<Option<Delivery>>,
    task: AtomicWaker,
}

/// What the connection's task waits for between calls.
pub(crate) enum Next {
    /// A frame (or the end) from the client.
    Inbound(Option<Result<Message, axum::Error>>),
    /// The connection must close.
    Close(Close),
}

/// One connection's outbound side.
///
/// Laid out in this order (`repr(C)`): what a lane reads for every member at every batch — whether it closes,
/// holds or has handed its writing to the task, its bus reader, its filter, its queue — comes first, next to
/// the lock, and the socket last. A lane's turn touches each of thousands of members once, so each member's
/// memory is cold, and every cache line of it read costs a miss; left to the compiler, these fields lay
/// across the 760 bytes behind the socket's.
#[repr(C)]
pub(crate) struct Delivery {
    /// Why the connection must close, found by the lane. It stays set: the lane reads and writes no more (a
    /// batch after a gap must not reach a client that resumes from what it saw last).
    closing: Option<Close>,
    /// A call of the connection's own is in flight: batches are held until its reply's subscription changes
    /// are applied, so none is dropped early.
    holding: bool,
    /// The socket pushed back: the task writes, with its own waker, until its queue is empty.
    task_writes: bool,
    bus: BusReceiver,
    pub(crate) filter: SubscriptionFilter,
    pub(crate) outbox: Outbox,
    /// The task waits until the action numbered this (or a later one) is held.
    awaiting: Option<u64>,
    backlog: VecDeque<BusBatch>,
    /// Bytes of the frames in `backlog`.
    backlog_bytes: usize,
    backlog_limit: usize,
}

impl Member {
    pub(crate) fn new(
        filter: SubscriptionFilter,
        bus: BusReceiver,
        backlog_limit: usize,
        outbox: Outbox,
    ) -> Arc<Self> {
        Arc::new(Self {
            delivery: Mutex::new(Some(Delivery {
                filter,
                bus,
                backlog: VecDeque::new(),
                backlog_bytes: 0,
                backlog_limit,
                outbox,
                holding: false,
                awaiting: None,
                task_writes: false,
                closing: None,
            })),
            task: AtomicWaker::new(),
        })
    }

    /// Whether this member reads `bus`'s ring (the lane groups members by ring). `None` once gone.
    pub(crate) fn reads_same_bus(&self, bus: &BusReceiver) -> Option<bool> {
        self.delivery
            .lock()
            .as_ref()
            .map(|delivery| delivery.bus.same_bus(bus))
    }

    /// Another reader of this member's bus, from now on (the lane's doorbell). `None` once gone.
    pub(crate) fn doorbell(&self) -> Option<BusReceiver> {
        self.delivery
            .lock()
            .as_ref()
            .map(|delivery| delivery.bus.resubscribe())
    }

    /// The bus this connection reads, once it is attached to its host (until then it reads a closed one).
    pub(crate) fn attached(&self, bus: BusReceiver) {
        if let Some(delivery) = self.delivery.lock().as_mut() {
            delivery.bus = bus;
        }
    }

    /// The lane's turn: read what the bus brought — at most `batches` (what the lane's doorbell counted, so a
    /// member that read them all does not ask its bus once more only to find it empty), or all of it — and
    /// deliver and write it (or hold it during a call). The fan-out latencies of the frames written go in
    /// `latencies` (seconds), which the lane records at the end of its turn. `false` once the connection is gone.
    pub(crate) fn ring(&self, batches: Option<usize>, latencies: &mut Vec<f64>) -> bool {
        let mut guard = self.delivery.lock();
        let Some(delivery) = guard.as_mut() else {
            return false;
        };
        let wake = delivery.closing.is_none() && delivery.take_bus(batches, Some(latencies));
        drop(guard);
        if wake {
            self.task.wake();
        }
        true
    }

    /// The lane that rings this member has failed (a panic): nothing will write the bus's batches to this
    /// connection any more, so it must close (its client resumes from what it saw last). Whether it was still
    /// there to tell.
    pub(crate) fn abandon(&self) -> bool {
        let mut guard = self.delivery.lock();
        let Some(delivery) = guard.as_mut() else {
            return false;
        };
        delivery.closing.get_or_insert_with(lane_failed);
        drop(guard);
        self.task.wake();
        true
    }

    /// Run `f` on the delivery (the task's side). `Err` once the connection is closing.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Delivery) -> Result<R, Close>) -> Result<R, Close> {
        let mut guard = self.delivery.lock();
        let delivery = guard.as_mut().ok_or_else(write_failed)?;
        if let Some(close) = delivery.closing.clone() {
            return Err(close);
        }
        f(delivery)
    }

    /// Between calls: write what is queued (with the task's waker) and read the client.
    pub(crate) fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Next> {
        self.task.register(cx.waker());
        let mut guard = self.delivery.lock();
        let Some(delivery) = guard.as_mut() else {
            return Poll::Ready(Next::Close(write_failed()));
        };
        if let Some(close) = delivery.closing.clone() {
            return Poll::Ready(Next::Close(close));
        }
        if let Err(close) = delivery.write(cx) {
            return Poll::Ready(Next::Close(close));
        }
        std::pin::Pin::new(&mut delivery.outbox.socket)
            .poll_next(cx)
            .map(Next::Inbound)
    }

    /// During a call: write what is queued; `Ready` with a reason to close, or once the action numbered
    /// `awaiting` is held (if one is awaited).
    pub(crate) fn poll_during(&self, cx: &mut Context<'_>) -> Poll<Result<(), Close>> {
        self.task.register(cx.waker());
        let mut guard = self.delivery.lock();
        let Some(delivery) = guard.as_mut() else {
            return Poll::Ready(Err(write_failed()));
        };
        if let Some(close) = delivery.closing.clone() {
            return Poll::Ready(Err(close));
        }
        if let Err(close) = delivery.write(cx) {
            return Poll::Ready(Err(close));
        }
        if delivery.awaiting.is_some() {
            // The lane may not have rung yet for what the bus already holds.
            if delivery.take_bus(None, None) {
                if let Some(close) = delivery.closing.clone() {
                    return Poll::Ready(Err(close));
                }
            }
            if delivery.awaited_arrived() {
                return Poll::Ready(Ok(()));
            }
        }
        Poll::Pending
    }

    /// Whether the task has taken the delivery back (the connection is closing or closed).
    pub(crate) fn is_gone(&self) -> bool {
        self.delivery.lock().is_none()
    }

    /// The task takes the delivery back to close the connection; the lane drops the member at its next turn.
    pub(crate) fn leave(&self) -> Option<Delivery> {
        let delivery = self.delivery.lock().take();
        // The waker would keep the finished task's memory while the lane still holds this member.
        drop(self.task.take());
        delivery
    }
}

impl Delivery {
    /// Read the bus dry: hold what arrives during a call, otherwise deliver it and write it at once (the
    /// latencies of what is written go in `latencies` if given, else are recorded at once). Returns whether
    /// the task must be woken (to close, to write what the socket would not take, or because what it awaits
    /// arrived).
    fn take_bus(&mut self, batches: Option<usize>, mut latencies: Option<&mut Vec<f64>>) -> bool {
        let mut delivered = false;
        let mut wake = false;
        let mut read = 0;
        while batches.is_none_or(|most| read < most) {
            read += 1;
            let batch = match self.bus.try_recv() {
                Ok(batch) => batch,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Lagged(missed)) => {
                    tracing::info!(missed, "connection fell behind its host's bus");
                    self.closing = Some(slow_consumer());
                    return true;
                }
                Err(TryRecvError::Closed) => {
                    self.closing = Some((close_code::RESTARTING, "host closed".into()));
                    return true;
                }
            };
            let taken = if self.holding {
                self.hold(batch)
            } else {
                delivered = true;
                self.deliver(&batch)
            };
            // A long turn writes as it goes rather than filling the queue and closing a connection whose
            // socket could take more.
            if taken.is_ok() && !self.holding && self.outbox.pressing() {
                wake |= self.write_now(latencies.as_deref_mut());
            }
            if let Err(close) = taken {
                self.closing = Some(close);
                return true;
            }
        }
        if self.holding {
            return self.awaited_arrived();
        }
        (delivered && self.write_now(latencies)) || wake
    }

    /// Write what is queued without the task (with a no-op waker), its latencies gathered in `latencies` if
    /// given. Returns whether the task must take over: the socket pushed back (the task then writes with its
    /// own waker) or failed.
    fn write_now(&mut self, latencies: Option<&mut Vec<f64>>) -> bool {
        if self.task_writes {
            // The task is writing already and is woken when the socket can take more.
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        match self.outbox.poll_write_gathering(&mut cx, latencies) {
            Poll::Ready(Ok(())) => false,
            Poll::Ready(Err(_)) => {
                self.closing = Some(write_failed());
                true
            }
            Poll::Pending => {
                relay_core::telemetry::fanout_handed_off();
                self.task_writes = true;
                true
            }
        }
    }

    /// The task's write, with its waker.
    fn write(&mut self, cx: &mut Context<'_>) -> Result<(), Close> {
        if !self.outbox.has_work() {
            self.task_writes = false;
            return Ok(());
        }
        match self.outbox.poll_write(cx) {
            Poll::Ready(Ok(())) => {
                self.task_writes = false;
                Ok(())
            }
            Poll::Ready(Err(_)) => Err(write_failed()),
            Poll::Pending => {
                self.task_writes = true;
                Ok(())
            }
        }
    }

    fn awaited_arrived(&self) -> bool {
        let Some(seq) = self.awaiting else {
            return false;
        };
        self.backlog.iter().any(|batch| {
            batch
                .iter()
                .any(|event| event.kind == BusEventKind::Action && event.seq >= seq)
        })
    }

    /// A call is in flight: hold what arrives.
    pub(crate) fn begin_call(&mut self) {
        self.holding = true;
    }

    /// The call was answered: apply its subscription changes (what was held is filtered by them).
    pub(crate) fn apply(&mut self, subscriptions: Vec<SubscriptionChange>, session_started: bool) {
        for change in subscriptions {
            self.filter.apply(change);
        }
        if session_started {
            self.filter.enable_notifications();
        }
    }

    /// Wait (see [`Member::poll_during`]) until the action numbered `seq`, or a later one, is held.
    pub(crate) fn await_action(&mut self, seq: u64) {
        self.awaiting = Some(seq);
    }

    /// The call is over: deliver what was held, and take batches as they come again.
    pub(crate) fn end_call(&mut self) -> Result<(), Close> {
        self.awaiting = None;
        self.flush_backlog()?;
        self.holding = false;
        Ok(())
    }

    /// Keep `batch` until the call in flight has been answered. The backlog and the queue share one byte
    /// bound: together they are what the connection has not yet taken.
    fn hold(&mut self, batch: BusBatch) -> Result<(), Close> {
        self.backlog_bytes += relay_core::bus::batch_bytes(&batch);
        if self.backlog.len() >= self.backlog_limit
            || self.backlog_bytes + self.outbox.bytes > self.outbox.max_bytes
        {
            return Err(slow_consumer());
        }
        self.backlog.push_back(batch);
        Ok(())
    }

    pub(crate) fn flush_backlog(&mut self) -> Result<(), Close> {
        while let Some(batch) = self.backlog.pop_front() {
            self.backlog_bytes = self
                .backlog_bytes
                .saturating_sub(relay_core::bus::batch_bytes(&batch));
            self.deliver(&batch)?;
        }
        if self.backlog.capacity() > IDLE_QUEUE_CAPACITY {
            self.backlog = VecDeque::new();
        }
        Ok(())
    }

    /// Queue the frames of `batch` this connection admits, in order; they are written together.
    fn deliver(&mut self, batch: &BusBatch) -> Result<(), Close> {
        for event in batch.iter() {
            if self.filter.admits(event) {
                self.outbox
                    .push(Outbound::Frame(event.frame.clone(), event.published_at))?;
            }
        }
        Ok(())
    }

    pub(crate) fn send(&mut self, frame: bytes::Bytes) -> Result<(), Close> {
        self.outbox.push(Outbound::Frame(frame, None))
    }

    /// Give up what is queued and held (a slow consumer resumes from its last `serverSeq` instead).
    pub(crate) fn into_outbox(self) -> Outbox {
        self.outbox
    }
}
