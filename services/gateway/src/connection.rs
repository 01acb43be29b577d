//! One client WebSocket: reads frames, forwards them to the host, and writes replies and bus events.
//!
//! The read side and the bus are served by one task, so a reply's subscription changes are applied before any
//! later bus event is looked at (design §5). Writes go through a bounded queue to a writer task; a connection
//! that cannot keep up is closed with a resumable close code instead of slowing its host (invariant 8).

use std::sync::Arc;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use relay_core::link::{CommandReply, HostLink};
use relay_core::rpc;
use relay_core::{ConnectionId, HostKey, Identity, Limits};
use tokio::sync::{broadcast, mpsc};

use crate::filter::SubscriptionFilter;

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
}

enum Outbound {
    Frame(Bytes),
    Close(u16, String),
}

/// Everything one connection needs.
pub struct Connection<L> {
    pub link: Arc<L>,
    pub host: HostKey,
    pub identity: Identity,
    pub limits: Limits,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

impl<L: HostLink> Connection<L> {
    /// Serve the socket until either side closes it.
    pub async fn run(self, socket: WebSocket) {
        let id = ConnectionId::next();
        let (sink, mut stream) = socket.split();
        let (out_tx, out_rx) = mpsc::channel::<Outbound>(self.limits.outbound_queue_frames.max(1));
        let writer = tokio::spawn(write_loop(sink, out_rx));

        let mut bus = match self.link.attach(&self.host, id, &self.identity).await {
            Ok(bus) => bus,
            Err(error) => {
                tracing::warn!(%error, host = %self.host, "attach failed");
                let _ = out_tx
                    .send(Outbound::Close(close_code::UNAVAILABLE, error.to_string()))
                    .await;
                drop(out_tx);
                let _ = writer.await;
                return;
            }
        };
        tracing::debug!(connection = %id, host = %self.host, user = %self.identity.subject, "connected");
        let mut filter = SubscriptionFilter::new(id);
        let mut shutdown = self.shutdown.clone();

        let close = loop {
            tokio::select! {
                inbound = stream.next() => {
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
                    match self.handle_frame(id, &text, &mut filter).await {
                        FrameOutcome::Send(frame) => {
                            if !enqueue(&out_tx, frame) {
                                break Some((close_code::TRY_AGAIN_LATER, "slow consumer".to_string()));
                            }
                        }
                        FrameOutcome::Nothing => {}
                        FrameOutcome::Close(frame, code, reason) => {
                            if let Some(frame) = frame {
                                enqueue(&out_tx, frame);
                            }
                            break Some((code, reason));
                        }
                    }
                }
                event = bus.recv() => match event {
                    Ok(event) => {
                        if filter.admits(&event) && !enqueue(&out_tx, event.frame.clone()) {
                            break Some((close_code::TRY_AGAIN_LATER, "slow consumer".to_string()));
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::info!(connection = %id, missed, "connection fell behind its host's bus");
                        break Some((close_code::TRY_AGAIN_LATER, "slow consumer".to_string()));
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        break Some((close_code::RESTARTING, "host closed".to_string()));
                    }
                },
                _ = shutdown.changed() => {
                    break Some((close_code::RESTARTING, "relay shutting down".to_string()));
                }
            }
        };

        self.link.detach(&self.host, id).await;
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

    /// Handle one inbound frame.
    async fn handle_frame(
        &self,
        id: ConnectionId,
        text: &[u8],
        filter: &mut SubscriptionFilter,
    ) -> FrameOutcome {
        if text.len() > self.limits.max_frame_bytes {
            return FrameOutcome::Close(None, close_code::TOO_BIG, "frame too large".into());
        }
        if rpc::is_response(text) {
            return FrameOutcome::Nothing;
        }
        let message = match rpc::read_frame(text, self.limits.max_json_depth) {
            Ok(message) => message,
            Err(rejection) => return FrameOutcome::Send(rpc::error_frame(rejection.id, &rejection.error)),
        };
        let CommandReply {
            frame,
            subscriptions,
            session_started,
            close,
        } = self.link.call(&self.host, id, message).await;
        for change in subscriptions {
            filter.apply(change);
        }
        if session_started {
            filter.enable_notifications();
        }
        match (close, frame) {
            (Some(close), frame) => FrameOutcome::Close(frame, close.code, close.reason),
            (None, Some(frame)) => FrameOutcome::Send(frame),
            (None, None) => FrameOutcome::Nothing,
        }
    }
}

/// What to do after one inbound frame.
enum FrameOutcome {
    Send(Bytes),
    Nothing,
    /// Send the frame (if any), then close.
    Close(Option<Bytes>, u16, String),
}

/// Queue a frame without waiting; `false` when the connection's queue is full.
fn enqueue(queue: &mpsc::Sender<Outbound>, frame: Bytes) -> bool {
    match queue.try_send(Outbound::Frame(frame)) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(_)) => false,
        // The writer is gone: the socket is closing anyway.
        Err(mpsc::error::TrySendError::Closed(_)) => true,
    }
}

fn classify_read_error(error: &axum::Error) -> Option<(u16, String)> {
    let text = error.to_string();
    if text.contains("too long") || text.contains("too big") || text.contains("Space limit") {
        Some((close_code::TOO_BIG, "frame too large".into()))
    } else {
        None
    }
}

async fn write_loop(
    mut sink: futures_util::stream::SplitSink<WebSocket, Message>,
    mut queue: mpsc::Receiver<Outbound>,
) {
    while let Some(item) = queue.recv().await {
        match item {
            Outbound::Frame(frame) => {
                let text = match Utf8Bytes::try_from(frame) {
                    Ok(text) => text,
                    Err(error) => {
                        tracing::error!(%error, "dropping a frame that is not UTF-8");
                        continue;
                    }
                };
                if sink.send(Message::Text(text)).await.is_err() {
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
    }
    let _ = sink.close().await;
}
