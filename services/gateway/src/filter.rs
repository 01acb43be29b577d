//! Which bus events one connection receives: its subscriptions and the `serverSeq` each starts after.
//!
//! The filter is what makes a connection's stream exact (invariant 3): a channel delivers only envelopes
//! numbered after the snapshot or replay that opened it, and nothing is ever delivered twice or out of order.

use std::collections::HashMap;

use relay_core::bus::{Audience, BusEvent, BusEventKind};
use relay_core::link::SubscriptionChange;
use relay_core::ConnectionId;

/// The delivery filter of one connection.
#[derive(Debug)]
pub struct SubscriptionFilter {
    connection: ConnectionId,
    channels: HashMap<String, u64>,
    notifications: bool,
    last_delivered: u64,
}

impl SubscriptionFilter {
    pub fn new(connection: ConnectionId) -> Self {
        Self {
            connection,
            channels: HashMap::new(),
            notifications: false,
            last_delivered: 0,
        }
    }

    pub fn apply(&mut self, change: SubscriptionChange) {
        match change {
            SubscriptionChange::Add { channel, after_seq } => {
                self.channels.insert(channel, after_seq);
            }
            SubscriptionChange::Remove { channel } => {
                self.channels.remove(&channel);
            }
            SubscriptionChange::Clear => self.channels.clear(),
        }
    }

    /// Host-wide notifications start flowing once the connection is initialized.
    pub fn enable_notifications(&mut self) {
        self.notifications = true;
    }

    pub fn subscription_count(&self) -> usize {
        self.channels.len()
    }

    /// Whether `event` goes to this connection. Updates the filter for disposals.
    pub fn admits(&mut self, event: &BusEvent) -> bool {
        match event.kind {
            BusEventKind::ChannelDisposed => {
                self.channels.remove(event.channel.as_ref());
                false
            }
            BusEventKind::Notification => self.notifications && event.audience == Audience::Everyone,
            BusEventKind::Action => {
                let addressed = match &event.audience {
                    Audience::Subscribers => self
                        .channels
                        .get(event.channel.as_ref())
                        .is_some_and(|&after| event.seq > after),
                    Audience::Connection(id) => *id == self.connection,
                    Audience::Everyone => true,
                };
                if !addressed || event.seq <= self.last_delivered {
                    return false;
                }
                self.last_delivered = event.seq;
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn action(seq: u64, channel: &str, audience: Audience) -> BusEvent {
        BusEvent {
            kind: BusEventKind::Action,
            channel: channel.into(),
            seq,
            prev_seq: seq.saturating_sub(1),
            audience,
            frame: Bytes::new(),
        }
    }

    #[test]
    fn delivers_only_subscribed_channels_after_their_snapshot() {
        let me = ConnectionId(1);
        let mut f = SubscriptionFilter::new(me);
        f.apply(SubscriptionChange::Add {
            channel: "a".into(),
            after_seq: 5,
        });
        assert!(
            !f.admits(&action(5, "a", Audience::Subscribers)),
            "at the snapshot seq"
        );
        assert!(f.admits(&action(6, "a", Audience::Subscribers)));
        assert!(
            !f.admits(&action(7, "b", Audience::Subscribers)),
            "not subscribed"
        );
        assert!(!f.admits(&action(6, "a", Audience::Subscribers)), "never twice");
        assert!(
            f.admits(&action(8, "b", Audience::Connection(me))),
            "addressed to me"
        );
        assert!(
            !f.admits(&action(9, "a", Audience::Connection(ConnectionId(2)))),
            "addressed to another"
        );
    }

    #[test]
    fn disposal_ends_a_subscription_and_notifications_wait_for_initialize() {
        let mut f = SubscriptionFilter::new(ConnectionId(1));
        f.apply(SubscriptionChange::Add {
            channel: "a".into(),
            after_seq: 0,
        });
        let mut disposed = action(0, "a", Audience::Subscribers);
        disposed.kind = BusEventKind::ChannelDisposed;
        assert!(!f.admits(&disposed));
        assert!(!f.admits(&action(1, "a", Audience::Subscribers)));
        let mut note = action(1, "ahp-root://", Audience::Everyone);
        note.kind = BusEventKind::Notification;
        assert!(!f.admits(&note));
        f.enable_notifications();
        assert!(f.admits(&note));
    }
}
