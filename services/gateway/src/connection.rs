//! One client WebSocket: reads frames, forwards them to the host, and writes replies and bus events.
//!
//! The connection's task reads the client, calls the host and writes the replies; the host's batches are
//! written by the host's fan-out lane straight into the socket ([`crate::fanout`], [`crate::member`]), and the
//! task takes over writing only when the socket pushes back. A reply's subscription changes are applied before
//! any later bus event is looked at (design §5): while a call is in flight, batches are held. The bus brings a
//! commit's events as one batch; the lane filters it, queues the frames the connection admits (the shard's
//! bytes, shared, never re-encoded) and writes them with one flush. The queue is bounded in frames and in
//! bytes; a connection that cannot keep up is closed with a resumable close code instead of slowing its host
//! (invariant 8).
//!
//! A call to the host is bounded (`call_timeout`: then it is answered with an error and the connection goes
//! on), and while one is in flight the connection's clock keeps running: pings go out, and shutdown and
//! token expiry close it as they would between calls. The clock is the gateway's one timer wheel
//! ([`crate::clock`]): a connection holds no timer of its own.
//!
//! Each inbound message is handled inside an `ahp.call` span (method, host), which the gRPC link carries to
//! the shard as trace context. Once a flush has put bus events on the socket, their time from stamp to socket
//! is recorded (`ahp_relay_fanout_latency_seconds`, see [`relay_core::telemetry`]).

use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::ws::{Message, WebSocket};
use bytes::Bytes;
use relay_core::link::{CommandReply, HostLink};
use relay_core::rpc;
use relay_core::{telemetry, ConnectionId, HostKey, Identity, Limits};
use tracing::Instrument;

use crate::clock::{Alarm, ConnectionAlarm, ConnectionClock};
pub use crate::closes::close_code;
use crate::closes::*;
use crate::fanout::Fanout;
use crate::filter::SubscriptionFilter;
use crate::member::{Member, Next};
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
    /// The gateway's fan-out lanes, which write the host's batches to this connection.
    pub fanout: Fanout,
    pub quotas: Arc<TenantQuotas>,
    /// This connection's slot in its tenant's quota, held while it lives.
    pub permit: ConnectionPermit,
    /// When the token the connection was opened with expires: the connection is closed then
    /// ([`close_code::TOKEN_EXPIRED`]).
    pub token_expires_at: std::time::SystemTime,
}

impl<L: HostLink> Connection<L> {
    /// Serve the socket until either side closes it.
    ///
    /// Not an `async fn`: what it is given moves to the heap first (the socket into the connection's
    /// [`Member`], the connection into a box), so the task's future does not carry them. An `async fn` keeps its
    /// arguments in its future for its whole life, besides the locals they are moved into — for an idle
    /// connection that was 0.6 KiB of its 2.6 KiB.
    pub fn run(self, socket: WebSocket) -> impl Future<Output = ()> + Send {
        let id = ConnectionId::next();
        // On the clock from the start: a connection opened while the relay shuts down, or with a token that
        // has just expired, is closed as soon as it is attached.
        let clock = self.clock.register(self.token_expires_at);
        let open = telemetry::connection_opened();
        let member = Member::new(
            SubscriptionFilter::new(id),
            relay_core::bus::BusReceiver::closed(),
            self.limits.bus_capacity,
            Outbox::new(socket, &self.limits),
        );
        Box::new(self).serve(id, clock, open, member)
    }

    async fn serve(
        self: Box<Self>,
        id: ConnectionId,
        clock: ConnectionAlarm,
        _open: telemetry::OpenConnection,
        member: Arc<Member>,
    ) {
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
                // Made before the await, so no local holding the delivery lives across it (see `run`).
                let reason = error.to_string();
                let closing = member
                    .leave()
                    .map(|delivery| Box::pin(delivery.into_outbox().close(close_code::UNAVAILABLE, reason)));
                if let Some(closing) = closing {
                    closing.await;
                }
                return;
            }
        };
        tracing::debug!(connection = %id, host = %self.host, user = %self.identity.subject, "connected");
        member.attached(bus);
        let ticket = self.fanout.join(&self.host, id, member.clone());
        let mut rate = self.quotas.connection_bucket();
        let mut last_heard = Instant::now();

        let close: Option<Close> = loop {
            let next = tokio::select! {
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
                        if let Err(close) = member.with(|delivery| {
                            delivery.outbox.ping();
                            Ok(())
                        }) {
                            break Some(close);
                        }
                        continue;
                    }
                },
                next = poll_fn(|cx| member.poll_next(cx)) => next,
            };
            let inbound = match next {
                Next::Close(close) => break Some(close),
                Next::Inbound(inbound) => inbound,
            };
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
            let wait = self
                .quotas
                .message_delay(&self.identity.tenant, &mut rate, text.len());
            if !wait.is_zero() {
                let waited = Box::pin(during(&member, &clock, tokio::time::sleep(wait)))
                    .await
                    .and_then(|()| member.with(|delivery| delivery.end_call()));
                if let Err(close) = waited {
                    break Some(close);
                }
            }
            if let Err(close) = Box::pin(self.handle_frame(id, &text, &member, &clock)).await {
                break Some(close);
            }
        };

        if let Some((code, reason)) = &close {
            tracing::info!(connection = %id, code, %reason, "closing connection");
            if *code == close_code::TRY_AGAIN_LATER {
                telemetry::slow_consumer_closed();
            }
        }
        // Off the lane before the host forgets the connection: nothing is written to it after the close decision
        // but the close (boxed: a local that lives across an await stays in this task's future).
        let delivery = member.leave().map(Box::new);
        drop(ticket);
        Box::pin(self.link.detach(&self.host, id)).await;
        let Some(delivery) = delivery else {
            return;
        };
        let closing: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = {
            let mut outbox = delivery.into_outbox();
            match close {
                // A slow consumer's queue is what it could not take: it resumes from its last serverSeq instead.
                Some((code, reason)) if code == close_code::TRY_AGAIN_LATER => {
                    outbox.discard();
                    Box::pin(outbox.close(code, reason))
                }
                Some((code, reason)) => Box::pin(outbox.close(code, reason)),
                None => Box::pin(outbox.finish()),
            }
        };
        closing.await;
        tracing::debug!(connection = %id, "disconnected");
    }

    /// Handle one inbound frame: forward it, apply the reply's subscription changes, queue the reply, then
    /// deliver what the bus brought meanwhile. `Err` closes the connection.
    async fn handle_frame(
        &self,
        id: ConnectionId,
        text: &[u8],
        member: &Member,
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
            Err(rejection) => {
                let frame = rpc::error_frame(rejection.id, &rejection.error);
                return member.with(|delivery| delivery.send(frame));
            }
        };
        let span = tracing::info_span!("ahp.call", method = %message.method, host = %self.host);
        let request = message.id;
        let patience = self.limits.call_timeout;
        let call = tokio::time::timeout(patience, self.link.call(&self.host, id, message)).instrument(span);
        let Ok(reply) = during(member, clock, call).await? else {
            // What the host did with it (if anything) shows to every device once committed, and after a
            // reconnect; the connection goes on.
            telemetry::call_timed_out();
            let frame = request.map(|_| {
                rpc::error_frame(
                    request,
                    &rpc::RpcError::internal(format!(
                        "the host did not answer within {patience:?} (its store may be slow); what the call \
                         did, if anything, shows once it is stored"
                    )),
                )
            });
            return member.with(|delivery| {
                if let Some(frame) = frame {
                    delivery.send(frame)?;
                }
                delivery.end_call()
            });
        };
        let CommandReply {
            frame,
            subscriptions,
            session_started,
            close,
            deliver_first,
        } = reply;
        member.with(|delivery| {
            delivery.apply(subscriptions, session_started);
            Ok(())
        })?;
        if let Some(seq) = deliver_first {
            // The reply comes after that event (e.g. `fetchTurns` after its `chat/turnsLoaded`): in the
            // distributed shape the event may still be on its way over Redis when the gRPC reply arrives.
            await_action(member, clock, seq).await?;
            member.with(|delivery| delivery.flush_backlog())?;
        }
        member.with(|delivery| {
            if let Some(frame) = frame {
                delivery.send(frame)?;
            }
            if let Some(close) = close {
                return Err((close.code, close.reason));
            }
            delivery.end_call()
        })
    }
}

/// Run `call` while the lane holds the bus's batches for this connection (until [`Delivery::end_call`]),
/// writing what is queued, pinging, and closing at shutdown or token expiry. (The idle check waits: the
/// client's frames are not read meanwhile, and the call itself is bounded.)
///
/// [`Delivery::end_call`]: crate::member::Delivery::end_call
async fn during<F: Future>(member: &Member, clock: &ConnectionAlarm, call: F) -> Result<F::Output, Close> {
    member.with(|delivery| {
        delivery.begin_call();
        Ok(())
    })?;
    tokio::pin!(call);
    loop {
        tokio::select! {
            biased;
            alarm = clock.next() => ring_during_call(member, alarm)?,
            output = &mut call => return Ok(output),
            closed = poll_fn(|cx| member.poll_during(cx)) => closed?,
        }
    }
}

/// Hold the bus's batches until one holds the action numbered `seq` (or a later one: everything up to `seq`
/// then arrived or was lost). Bounded: a lost event must not hold the reply forever.
async fn await_action(member: &Member, clock: &ConnectionAlarm, seq: u64) -> Result<(), Close> {
    const PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);
    member.with(|delivery| {
        delivery.await_action(seq);
        Ok(())
    })?;
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            tokio::select! {
                biased;
                alarm = clock.next() => ring_during_call(member, alarm)?,
                arrived = poll_fn(|cx| member.poll_during(cx)) => return arrived,
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

/// An alarm that rings while a call is in flight: a ping is queued behind what the call holds back; a shutdown
/// or an expired token ends the connection (the call's reply is not awaited).
fn ring_during_call(member: &Member, alarm: Alarm) -> Result<(), Close> {
    match alarm {
        Alarm::Shutdown => Err(shutting_down()),
        Alarm::TokenExpired => Err(token_expired()),
        Alarm::Ping => member.with(|delivery| {
            delivery.outbox.ping();
            Ok(())
        }),
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
