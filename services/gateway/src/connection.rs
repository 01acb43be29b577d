//! One client WebSocket: reads frames, forwards them to the host, and writes replies and bus events.
//!
//! The read side and the bus are served by one task, so a reply's subscription changes are applied before any
//! later bus event is looked at (design §5). Writes go through a queue bounded in frames and in bytes to a
//! writer task; a connection that cannot keep up is closed with a resumable close code instead of slowing its
//! host (invariant 8).
//!
//! Each inbound message is handled inside an `ahp.call` span (method, host), which the gRPC link carries to
//! the shard as trace context. The writer records how long each bus event took from its stamp to the client's
//! socket (`ahp_relay_fanout_latency_seconds`, see [`relay_core::telemetry`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use relay_core::bus::{BusEvent, BusEventKind, SharedBusEvent};
use relay_core::link::{CommandReply, HostLink};
use relay_core::rpc;
use relay_core::{telemetry, ConnectionId, HostKey, Identity, Limits};
use tokio::sync::{broadcast, mpsc};
use tracing::Instrument;

use crate::filter::SubscriptionFilter;
use crate::quotas::{ConnectionPermit, TenantQuotas};

/// WebSocket close codes the relay uses.
pub mod close_code {
    /// The message was too big to process.
    pub const TOO_BIG: u16 = 1009;
    /// The relay is restarting or shutting down: reconnect and resume.
    pub const RESTARTING: u16 = 1012;
    /// The client fell behind (slow consumer): reconnect and resume.
    pub const TRY_AGAIN_LATER: u16 = 1013;
    /// The host is not available right now.
    pub const UNAVAILABLE: u16 = 1011;
    /// Nothing (not even a pong to the relay's pings) arrived within the idle timeout.
    pub const GOING_AWAY: u16 = 1001;
    /// The connection's access token expired: get a fresh token, reconnect and `reconnect`.
    pub const TOKEN_EXPIRED: u16 = 4001;
}

enum Outbound {
    /// A frame, and when it was stamped if it is a bus event (for the fan-out latency).
    Frame(Bytes, Option<Instant>),
    /// A WebSocket ping (liveness check).
    Ping,
    Close(u16, String),
}

/// Everything one connection needs.
pub struct Connection<L> {
    pub link: Arc<L>,
    pub host: HostKey,
    pub identity: Identity,
    pub limits: Limits,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
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
        let _open = telemetry::connection_opened();
        let (sink, mut stream) = socket.split();
        let (out_tx, out_rx) = mpsc::channel::<Outbound>(self.limits.outbound_queue_frames.max(1));
        let queued = Arc::new(AtomicUsize::new(0));
        let writer = tokio::spawn(write_loop(sink, out_rx, queued.clone()));

        let bus = match self.link.attach(&self.host, id, &self.identity).await {
            Ok(bus) => bus,
            Err(error) => {
                // A tenant over its host quota is the client's doing (and may repeat quickly): not a warning.
                if matches!(error, relay_core::link::LinkError::OverQuota(_)) {
                    tracing::debug!(%error, host = %self.host, "attach refused");
                } else {
                    tracing::warn!(%error, host = %self.host, "attach failed");
                }
                let _ = out_tx
                    .send(Outbound::Close(close_code::UNAVAILABLE, error.to_string()))
                    .await;
                drop(out_tx);
                let _ = writer.await;
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
            out: out_tx.clone(),
            queued,
            max_queued_bytes: self.limits.outbound_queue_bytes,
        };
        let mut shutdown = self.shutdown.clone();
        let mut rate = self.quotas.connection_bucket();
        // Liveness: a ping every interval; a connection silent for the idle timeout is closed (within the
        // timeout plus one interval), which frees its quota slot even when its peer vanished without a FIN.
        let ping_every = self.limits.ping_interval;
        let mut pings = tokio::time::interval_at(tokio::time::Instant::now() + ping_every, ping_every);
        pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_heard = Instant::now();
        let expiry = tokio::time::sleep(
            self.token_expires_at
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default(),
        );
        tokio::pin!(expiry);

        let close: Option<Close> = loop {
            // Deliver what the host published before taking more work from the client: a connection that
            // floods requests cannot starve its own deliveries.
            tokio::select! {
                biased;
                _ = shutdown.changed() => {
                    break Some((close_code::RESTARTING, "relay shutting down".to_string()));
                }
                () = &mut expiry => {
                    break Some((close_code::TOKEN_EXPIRED, "access token expired; reconnect with a fresh one".into()));
                }
                _ = pings.tick() => {
                    if last_heard.elapsed() >= self.limits.idle_timeout {
                        break Some((close_code::GOING_AWAY, "idle timeout: no pong".into()));
                    }
                    // A full queue already means a slow consumer; the next delivery closes it.
                    let _ = out_tx.try_send(Outbound::Ping);
                }
                event = delivery.next_event() => {
                    if let Err(close) = event.and_then(|event| delivery.deliver(&event)) {
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
                        let waited = delivery
                            .during(tokio::time::sleep(wait))
                            .await
                            .and_then(|()| delivery.flush_backlog());
                        if let Err(close) = waited {
                            break Some(close);
                        }
                    }
                    if let Err(close) = self.handle_frame(id, &text, &mut delivery).await {
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
        self.link.detach(&self.host, id).await;
        drop(delivery);
        if let Some((code, reason)) = close {
            // The queue may be full (slow consumer): closing must not wait behind it forever.
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(1),
                out_tx.send(Outbound::Close(code, reason)),
            )
            .await;
        }
        drop(out_tx);
        let _ = writer.await;
        tracing::debug!(connection = %id, "disconnected");
    }

    /// Handle one inbound frame: forward it, apply the reply's subscription changes, write the reply, then
    /// deliver what the bus brought meanwhile. `Err` closes the connection.
    async fn handle_frame(
        &self,
        id: ConnectionId,
        text: &[u8],
        delivery: &mut Delivery,
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
        let CommandReply {
            frame,
            subscriptions,
            session_started,
            close,
            deliver_first,
        } = delivery
            .during(self.link.call(&self.host, id, message).instrument(span))
            .await?;
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

/// A close code and reason.
type Close = (u16, String);

fn slow_consumer() -> Close {
    (close_code::TRY_AGAIN_LATER, "slow consumer".to_string())
}

/// One connection's outbound side: its delivery filter, its host's bus, and the events that arrived while a
/// call was in flight (held until the call's subscription changes are applied, so none is dropped early).
struct Delivery {
    filter: SubscriptionFilter,
    bus: broadcast::Receiver<SharedBusEvent>,
    backlog: VecDeque<SharedBusEvent>,
    /// Bytes of the frames in `backlog`.
    backlog_bytes: usize,
    backlog_limit: usize,
    out: mpsc::Sender<Outbound>,
    /// Bytes queued for the writer and not yet written (the writer subtracts what it wrote).
    queued: Arc<AtomicUsize>,
    /// More than this queued (or held in the backlog) closes the connection as a slow consumer.
    max_queued_bytes: usize,
}

impl Delivery {
    async fn next_event(&mut self) -> Result<SharedBusEvent, Close> {
        match self.bus.recv().await {
            Ok(event) => Ok(event),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::info!(missed, "connection fell behind its host's bus");
                Err(slow_consumer())
            }
            Err(broadcast::error::RecvError::Closed) => Err((close_code::RESTARTING, "host closed".into())),
        }
    }

    /// Run `call` while keeping the bus drained into the backlog.
    async fn during<F: std::future::Future>(&mut self, call: F) -> Result<F::Output, Close> {
        tokio::pin!(call);
        loop {
            tokio::select! {
                biased;
                output = &mut call => return Ok(output),
                event = self.next_event() => {
                    let event = event?;
                    self.backlog_bytes += event.frame.len();
                    if self.backlog.len() >= self.backlog_limit || self.backlog_bytes > self.max_queued_bytes {
                        return Err(slow_consumer());
                    }
                    self.backlog.push_back(event);
                }
            }
        }
    }

    /// Read the bus into the backlog until it holds the action numbered `seq` (or a later one: everything
    /// up to `seq` then arrived or was lost). Bounded: a lost event must not hold the reply forever.
    async fn await_event(&mut self, seq: u64) -> Result<(), Close> {
        const PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);
        let arrived = |event: &BusEvent| event.kind == BusEventKind::Action && event.seq >= seq;
        if self.backlog.iter().any(|event| arrived(event)) {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let event = match tokio::time::timeout_at(deadline, self.next_event()).await {
                Ok(event) => event?,
                Err(_) => {
                    tracing::warn!(
                        seq,
                        "an event a reply waits for did not arrive; replying without it"
                    );
                    return Ok(());
                }
            };
            let done = arrived(&event);
            self.backlog_bytes += event.frame.len();
            if self.backlog.len() >= self.backlog_limit || self.backlog_bytes > self.max_queued_bytes {
                return Err(slow_consumer());
            }
            self.backlog.push_back(event);
            if done {
                return Ok(());
            }
        }
    }

    fn flush_backlog(&mut self) -> Result<(), Close> {
        while let Some(event) = self.backlog.pop_front() {
            self.backlog_bytes = self.backlog_bytes.saturating_sub(event.frame.len());
            self.deliver(&event)?;
        }
        Ok(())
    }

    fn deliver(&mut self, event: &BusEvent) -> Result<(), Close> {
        if self.filter.admits(event) {
            self.send_stamped(event.frame.clone(), event.published_at)?;
        }
        Ok(())
    }

    fn send(&self, frame: Bytes) -> Result<(), Close> {
        self.send_stamped(frame, None)
    }

    /// Queue a frame without waiting; a slow consumer when the queue is full in frames or in bytes.
    fn send_stamped(&self, frame: Bytes, published_at: Option<Instant>) -> Result<(), Close> {
        let size = frame.len();
        if self.queued.fetch_add(size, Ordering::AcqRel) + size > self.max_queued_bytes {
            return Err(slow_consumer());
        }
        match self.out.try_send(Outbound::Frame(frame, published_at)) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => Err(slow_consumer()),
            // The writer is gone: the socket is closing anyway.
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(()),
        }
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

/// Writes queued frames to the socket. Frames already queued are written together and flushed once, so a
/// burst becomes few TCP segments even with `TCP_NODELAY`, while a lone frame leaves at once. Once a flush
/// has put bus events on the socket, their fan-out latencies are recorded.
async fn write_loop(
    mut sink: futures_util::stream::SplitSink<WebSocket, Message>,
    mut queue: mpsc::Receiver<Outbound>,
    queued: Arc<AtomicUsize>,
) {
    const MAX_COALESCED: usize = 256;
    let latency = telemetry::fanout_latency();
    let mut stamps: Vec<Instant> = Vec::new();
    while let Some(mut item) = queue.recv().await {
        let mut written = 0;
        loop {
            match item {
                Outbound::Frame(frame, published_at) => {
                    queued.fetch_sub(frame.len(), Ordering::AcqRel);
                    match Utf8Bytes::try_from(frame) {
                        Ok(text) => {
                            if sink.feed(Message::Text(text)).await.is_err() {
                                return;
                            }
                            stamps.extend(published_at);
                        }
                        Err(error) => tracing::error!(%error, "dropping a frame that is not UTF-8"),
                    }
                }
                Outbound::Ping => {
                    if sink.feed(Message::Ping(Bytes::new())).await.is_err() {
                        return;
                    }
                }
                Outbound::Close(code, reason) => {
                    let _ = sink
                        .send(Message::Close(Some(CloseFrame {
                            code,
                            reason: Utf8Bytes::from(reason),
                        })))
                        .await;
                    return;
                }
            }
            written += 1;
            match queue.try_recv() {
                Ok(next) if written < MAX_COALESCED => item = next,
                Ok(next) => {
                    if !flush(&mut sink, &mut stamps, &latency).await {
                        return;
                    }
                    written = 0;
                    item = next;
                }
                Err(_) => break,
            }
        }
        if !flush(&mut sink, &mut stamps, &latency).await {
            return;
        }
    }
    let _ = sink.close().await;
}

/// Flush the socket; then every bus event written since the last flush has reached the client's socket.
async fn flush(
    sink: &mut futures_util::stream::SplitSink<WebSocket, Message>,
    stamps: &mut Vec<Instant>,
    latency: &telemetry::FanoutLatency,
) -> bool {
    if sink.flush().await.is_err() {
        return false;
    }
    for stamp in stamps.drain(..) {
        latency.delivered(stamp);
    }
    true
}
