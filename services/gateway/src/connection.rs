//! One client WebSocket: reads frames, forwards them to the host, and writes replies and bus events.
//!
//! One task serves the whole connection: the read side, the host's bus and the writes, so a reply's
//! subscription changes are applied before any later bus event is looked at (design §5), and a bus batch goes
//! from the host to the socket without another task hop. The bus brings a commit's events as one batch; the
//! connection filters it, queues the frames it admits (the shard's bytes, shared, never re-encoded) and writes
//! everything queued with one flush. The queue is bounded in frames and in bytes; a connection that cannot
//! keep up is closed with a resumable close code instead of slowing its host (invariant 8). Writes make
//! progress whenever the task waits — for the bus, the client, or a call to the host.
//!
//! A call to the host is bounded (`call_timeout`: then it is answered with an error and the connection goes
//! on), and while one is in flight the connection's clock keeps running: pings go out, and shutdown and
//! token expiry close it as they would between calls. The clock is the gateway's one timer wheel
//! ([`crate::clock`]): a connection holds no timer of its own.
//!
//! Each inbound message is handled inside an `ahp.call` span (method, host), which the gRPC link carries to
//! the shard as trace context. Once a flush has put bus events on the socket, their time from stamp to socket
//! is recorded (`ahp_relay_fanout_latency_seconds`, see [`relay_core::telemetry`]).

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use axum::extract::ws::{Message, WebSocket};
use bytes::Bytes;
use futures_util::StreamExt;
use relay_core::bus::{BusBatch, BusEventKind, BusReceiver};
use relay_core::link::{CommandReply, HostLink};
use relay_core::rpc;
use relay_core::{telemetry, ConnectionId, HostKey, Identity, Limits};
use tokio::sync::broadcast;
use tracing::Instrument;

use crate::clock::{Alarm, ConnectionAlarm, ConnectionClock};
pub use crate::closes::close_code;
use crate::closes::*;
use crate::filter::SubscriptionFilter;
use crate::outbox::*;
use crate::quotas::{ConnectionPermit, TenantQuotas};

/// Everything one connection needs.
pub struct Connection<L> {
    pub link: Arc<L>,
    pub host: HostKey,
    pub identity: Identity,
    pub limits: Arc<Limits>,
    /// The gateway's clock: this connection's pings, token expiry and the relay's shutdown.
    pub clock: ConnectionClock,
    pub quotas: Arc<TenantQuotas>,
    /// This connection's slot in its tenant's quota, held while it lives.
    pub permit: ConnectionPermit,
    /// When the token the connection was opened with expires: the connection is closed then
    /// ([`close_code::TOKEN_EXPIRED`]).
    pub token_expires_at: std::time::SystemTime,
}

impl<L: HostLink> Connection<L> {
    /// Serve the socket until either side closes it.
    pub async fn run(self, socket: WebSocket) {
        let id = ConnectionId::next();
        // On the clock from the start: a connection opened while the relay shuts down, or with a token that
        // has just expired, is closed as soon as it is attached.
        let clock = self.clock.register(self.token_expires_at);
        let _open = telemetry::connection_opened();
        let (sink, mut stream) = socket.split();
        let outbox = Outbox::new(sink, &self.limits);

        // Awaits that happen once (attach, detach, close) and calls are boxed: the future of a connection is
        // as big as its biggest await, and an idle connection should not carry their room.
        let bus = match Box::pin(self.link.attach(&self.host, id, &self.identity)).await {
            Ok(bus) => bus,
            Err(error) => {
                // A tenant over its host quota is the client's doing (and may repeat quickly): not a warning.
                if matches!(error, relay_core::link::LinkError::OverQuota(_)) {
                    tracing::debug!(%error, host = %self.host, "attach refused");
                } else {
                    tracing::warn!(%error, host = %self.host, "attach failed");
                }
                Box::pin(outbox.close(close_code::UNAVAILABLE, error.to_string())).await;
                return;
            }
        };
        tracing::debug!(connection = %id, host = %self.host, user = %self.identity.subject, "connected");
        let mut delivery = Delivery {
            filter: SubscriptionFilter::new(id),
            bus,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            backlog_limit: self.limits.bus_capacity,
            outbox,
        };
        let mut rate = self.quotas.connection_bucket();
        let mut last_heard = Instant::now();

        let close: Option<Close> = loop {
            // Deliver what the host published before taking more work from the client: a connection that
            // floods requests cannot starve its own deliveries.
            tokio::select! {
                biased;
                alarm = clock.next() => match alarm {
                    Alarm::Shutdown => break Some(shutting_down()),
                    Alarm::TokenExpired => break Some(token_expired()),
                    // Liveness: a ping every interval; a connection silent for the idle timeout is closed
                    // (within the timeout plus one interval), which frees its quota slot even when its peer
                    // vanished without a FIN.
                    Alarm::Ping => {
                        if last_heard.elapsed() >= self.limits.idle_timeout {
                            break Some((close_code::GOING_AWAY, "idle timeout: no pong".into()));
                        }
                        // A full queue already means a slow consumer; the next delivery closes it.
                        delivery.outbox.ping();
                    }
                },
                batch = delivery.next_batch() => {
                    if let Err(close) = batch.and_then(|batch| delivery.deliver(&batch)) {
                        break Some(close);
                    }
                }
                inbound = stream.next() => {
                    last_heard = Instant::now();
                    let text = match inbound {
                        Some(Ok(Message::Text(text))) => Bytes::from(text),
                        Some(Ok(Message::Binary(data))) => data,
                        Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                        Some(Ok(Message::Close(_))) | None => break None,
                        Some(Err(error)) => {
                            tracing::debug!(connection = %id, %error, "read failed");
                            break classify_read_error(&error);
                        }
                    };
                    let wait = self.quotas.message_delay(&self.identity.tenant, &mut rate, text.len());
                    if !wait.is_zero() {
                        let waited = Box::pin(delivery.during(&clock, tokio::time::sleep(wait)))
                            .await
                            .and_then(|()| delivery.flush_backlog());
                        if let Err(close) = waited {
                            break Some(close);
                        }
                    }
                    if let Err(close) = Box::pin(self.handle_frame(id, &text, &mut delivery, &clock)).await {
                        break Some(close);
                    }
                }
            }
        };

        if let Some((code, reason)) = &close {
            tracing::info!(connection = %id, code, %reason, "closing connection");
            if *code == close_code::TRY_AGAIN_LATER {
                telemetry::slow_consumer_closed();
            }
        }
        Box::pin(self.link.detach(&self.host, id)).await;
        let Delivery { mut outbox, .. } = delivery;
        match close {
            // A slow consumer's queue is what it could not take: it resumes from its last serverSeq instead.
            Some((code, reason)) if code == close_code::TRY_AGAIN_LATER => {
                outbox.discard();
                Box::pin(outbox.close(code, reason)).await;
            }
            Some((code, reason)) => Box::pin(outbox.close(code, reason)).await,
            None => Box::pin(outbox.finish()).await,
        }
        tracing::debug!(connection = %id, "disconnected");
    }

    /// Handle one inbound frame: forward it, apply the reply's subscription changes, write the reply, then
    /// deliver what the bus brought meanwhile. `Err` closes the connection.
    async fn handle_frame(
        &self,
        id: ConnectionId,
        text: &[u8],
        delivery: &mut Delivery,
        clock: &ConnectionAlarm,
    ) -> Result<(), Close> {
        if text.len() > self.limits.max_frame_bytes {
            return Err((close_code::TOO_BIG, "frame too large".into()));
        }
        if rpc::is_response(text) {
            return Ok(());
        }
        let depth = self.limits.max_json_depth;
        let parsed = relay_core::heavy::for_message(text.len(), || rpc::read_frame(text, depth));
        let message = match parsed {
            Ok(message) => message,
            Err(rejection) => return delivery.send(rpc::error_frame(rejection.id, &rejection.error)),
        };
        let span = tracing::info_span!("ahp.call", method = %message.method, host = %self.host);
        let request = message.id;
        let patience = self.limits.call_timeout;
        let call = tokio::time::timeout(patience, self.link.call(&self.host, id, message)).instrument(span);
        let Ok(reply) = delivery.during(clock, call).await? else {
            // What the host did with it (if anything) shows to every device once committed, and after a
            // reconnect; the connection goes on.
            telemetry::call_timed_out();
            return match request {
                Some(_) => delivery.send(rpc::error_frame(
                    request,
                    &rpc::RpcError::internal(format!(
                        "the host did not answer within {patience:?} (its store may be slow); what the call \
                         did, if anything, shows once it is stored"
                    )),
                )),
                None => Ok(()),
            };
        };
        let CommandReply {
            frame,
            subscriptions,
            session_started,
            close,
            deliver_first,
        } = reply;
        for change in subscriptions {
            delivery.filter.apply(change);
        }
        if session_started {
            delivery.filter.enable_notifications();
        }
        if let Some(seq) = deliver_first {
            // The reply comes after that event (e.g. `fetchTurns` after its `chat/turnsLoaded`): in the
            // distributed shape the event may still be on its way over Redis when the gRPC reply arrives.
            delivery.await_event(seq).await?;
            delivery.flush_backlog()?;
        }
        if let Some(frame) = frame {
            delivery.send(frame)?;
        }
        if let Some(close) = close {
            return Err((close.code, close.reason));
        }
        delivery.flush_backlog()
    }
}

/// One connection's outbound side: its delivery filter, its host's bus, the events that arrived while a call
/// was in flight (held until the call's subscription changes are applied, so none is dropped early), and the
/// queue of frames being written.
struct Delivery {
    filter: SubscriptionFilter,
    bus: BusReceiver,
    backlog: VecDeque<BusBatch>,
    /// Bytes of the frames in `backlog`.
    backlog_bytes: usize,
    backlog_limit: usize,
    outbox: Outbox,
}

impl Delivery {
    /// The next batch of the host's bus; meanwhile, what is queued is written. Cancel-safe: a batch is taken
    /// off the bus, and a frame off the queue, only when returned or written.
    ///
    /// The bus goes first, so a connection that wakes to several batches queues them all and writes them with
    /// one flush — unless its queue is past half its bound: then writing goes first, so a connection that wakes
    /// to a long backlog writes as it goes instead of filling its queue and being closed as a slow consumer
    /// while its socket could take more.
    async fn next_batch(&mut self) -> Result<BusBatch, Close> {
        let Self { bus, outbox, .. } = self;
        let received = bus.recv();
        tokio::pin!(received);
        poll_fn(|cx| {
            if outbox.pressing() {
                if let Poll::Ready(Err(_)) = outbox.poll_write(cx) {
                    return Poll::Ready(Err(write_failed()));
                }
            }
            if let Poll::Ready(received) = received.as_mut().poll(cx) {
                return Poll::Ready(received_batch(received));
            }
            if outbox.has_work() {
                if let Poll::Ready(Err(_)) = outbox.poll_write(cx) {
                    return Poll::Ready(Err(write_failed()));
                }
            }
            // Waiting for the bus (registered above) and, if anything is left, for the socket.
            Poll::Pending
        })
        .await
    }

    /// Run `call` while keeping the bus drained into the backlog, writing what is queued, pinging, and closing
    /// at shutdown or token expiry. (The idle check waits: the client's frames are not read meanwhile, and the
    /// call itself is bounded.)
    async fn during<F: Future>(&mut self, clock: &ConnectionAlarm, call: F) -> Result<F::Output, Close> {
        tokio::pin!(call);
        loop {
            let batch = tokio::select! {
                biased;
                alarm = clock.next() => match alarm {
                    Alarm::Shutdown => return Err(shutting_down()),
                    Alarm::TokenExpired => return Err(token_expired()),
                    Alarm::Ping => {
                        self.outbox.ping();
                        continue;
                    }
                },
                output = &mut call => return Ok(output),
                batch = self.next_batch() => batch?,
            };
            self.hold(batch)?;
        }
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

    /// Read the bus into the backlog until it holds the action numbered `seq` (or a later one: everything
    /// up to `seq` then arrived or was lost). Bounded: a lost event must not hold the reply forever.
    async fn await_event(&mut self, seq: u64) -> Result<(), Close> {
        const PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);
        let arrived = |batch: &BusBatch| {
            batch
                .iter()
                .any(|event| event.kind == BusEventKind::Action && event.seq >= seq)
        };
        if self.backlog.iter().any(arrived) {
            return Ok(());
        }
        let waited = tokio::time::timeout(PATIENCE, async {
            loop {
                let batch = self.next_batch().await?;
                let done = arrived(&batch);
                self.hold(batch)?;
                if done {
                    return Ok(());
                }
            }
        })
        .await;
        waited.unwrap_or_else(|_| {
            tracing::warn!(
                seq,
                "an event a reply waits for did not arrive; replying without it"
            );
            Ok(())
        })
    }

    fn flush_backlog(&mut self) -> Result<(), Close> {
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

    fn send(&mut self, frame: Bytes) -> Result<(), Close> {
        self.outbox.push(Outbound::Frame(frame, None))
    }
}

fn received_batch(received: Result<BusBatch, broadcast::error::RecvError>) -> Result<BusBatch, Close> {
    match received {
        Ok(batch) => Ok(batch),
        Err(broadcast::error::RecvError::Lagged(missed)) => {
            tracing::info!(missed, "connection fell behind its host's bus");
            Err(slow_consumer())
        }
        Err(broadcast::error::RecvError::Closed) => Err((close_code::RESTARTING, "host closed".into())),
    }
}

fn classify_read_error(error: &axum::Error) -> Option<Close> {
    let text = error.to_string();
    if text.contains("too long") || text.contains("too big") || text.contains("Space limit") {
        Some((close_code::TOO_BIG, "frame too large".into()))
    } else {
        None
    }
}
