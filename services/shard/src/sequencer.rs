//! The host's single `serverSeq` counter and everything it publishes.
//!
//! Every envelope of every channel of a host takes the next number here (design §3), is serialized once,
//! kept in the [`ReplayBuffer`] when it is an accepted action, and published to the host's bus. Being the only
//! place that numbers and publishes, it is what keeps invariants 1 and 3 for a host.

use std::sync::Arc;

use ahp_types::actions::{ActionEnvelope, ActionOrigin, StateAction};
use bytes::{BufMut, Bytes, BytesMut};
use relay_core::bus::{Audience, BusEvent, BusEventKind, SharedBusEvent};
use relay_core::rpc;
use relay_core::ConnectionId;
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::broadcast;

use crate::replay::{ReplayBuffer, StoredEnvelope};

/// Numbers, stores and publishes a host's envelopes.
pub struct Sequencer {
    seq: u64,
    last_published: u64,
    replay: ReplayBuffer,
    bus: broadcast::Sender<SharedBusEvent>,
}

impl Sequencer {
    pub fn new(replay_capacity: usize, bus_capacity: usize) -> Self {
        let (bus, _) = broadcast::channel(bus_capacity.max(16));
        Self {
            seq: 0,
            last_published: 0,
            replay: ReplayBuffer::new(replay_capacity),
            bus,
        }
    }

    /// The last `serverSeq` assigned.
    pub fn current(&self) -> u64 {
        self.seq
    }

    pub fn replay(&self) -> &ReplayBuffer {
        &self.replay
    }

    pub fn subscribe(&self) -> broadcast::Receiver<SharedBusEvent> {
        self.bus.subscribe()
    }

    /// Sequence an accepted action: stored for replay and sent to the channel's subscribers.
    pub fn publish_accepted(
        &mut self,
        channel: &str,
        action: &StateAction,
        origin: Option<ActionOrigin>,
    ) -> u64 {
        let seq = self.next();
        let Some((envelope, frame)) = encode(channel, action, seq, origin, None) else {
            return seq;
        };
        let stored = Arc::new(StoredEnvelope {
            seq,
            channel: channel.into(),
            envelope,
            frame: frame.clone(),
        });
        self.replay.push(stored);
        self.send(BusEventKind::Action, channel, seq, Audience::Subscribers, frame);
        seq
    }

    /// Sequence an envelope for one connection only (a rejection, or a `chat/turnsLoaded` page). It is not
    /// stored: a replay never contains it.
    pub fn publish_private(
        &mut self,
        connection: ConnectionId,
        channel: &str,
        action: &StateAction,
        origin: Option<ActionOrigin>,
        rejection_reason: Option<String>,
    ) -> u64 {
        let seq = self.next();
        if let Some((_, frame)) = encode(channel, action, seq, origin, rejection_reason) {
            self.send(
                BusEventKind::Action,
                channel,
                seq,
                Audience::Connection(connection),
                frame,
            );
        }
        seq
    }

    /// Publish an unsequenced protocol notification to every connection of the host.
    pub fn publish_notification<P: Serialize>(&mut self, channel: &str, method: &str, params: &P) {
        match rpc::notification_frame(method, params) {
            Ok(frame) => {
                let seq = self.seq;
                self.send(
                    BusEventKind::Notification,
                    channel,
                    seq,
                    Audience::Everyone,
                    frame,
                )
            }
            Err(error) => tracing::error!(%error, method, "could not serialize notification"),
        }
    }

    /// Tell gateways that `channel` is gone, so they drop subscriptions to it.
    pub fn publish_disposed(&mut self, channel: &str) {
        let seq = self.seq;
        self.send(
            BusEventKind::ChannelDisposed,
            channel,
            seq,
            Audience::Subscribers,
            Bytes::new(),
        );
    }

    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn send(&mut self, kind: BusEventKind, channel: &str, seq: u64, audience: Audience, frame: Bytes) {
        let prev_seq = self.last_published;
        if kind == BusEventKind::Action {
            self.last_published = seq;
        }
        // No receivers simply means no connection is attached right now.
        let _ = self.bus.send(Arc::new(BusEvent {
            kind,
            channel: channel.into(),
            seq,
            prev_seq,
            audience,
            frame,
        }));
    }
}

/// Serialize an envelope once: its JSON and the `action` notification frame around it.
fn encode(
    channel: &str,
    action: &StateAction,
    seq: u64,
    origin: Option<ActionOrigin>,
    rejection_reason: Option<String>,
) -> Option<(Box<RawValue>, Bytes)> {
    let envelope = ActionEnvelope {
        channel: channel.to_string(),
        action: action.clone(),
        server_seq: seq,
        origin,
        rejection_reason,
    };
    let json = match serde_json::to_string(&envelope) {
        Ok(json) => json,
        Err(error) => {
            tracing::error!(%error, seq, "could not serialize envelope");
            return None;
        }
    };
    const HEAD: &[u8] = br#"{"jsonrpc":"2.0","method":"action","params":"#;
    let mut frame = BytesMut::with_capacity(HEAD.len() + json.len() + 1);
    frame.put_slice(HEAD);
    frame.put_slice(json.as_bytes());
    frame.put_u8(b'}');
    let raw = RawValue::from_string(json).ok()?;
    Some((raw, frame.freeze()))
}
