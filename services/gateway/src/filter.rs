//! Which bus events one connection receives: its subscriptions and the `serverSeq` each starts after.
//!
//! The filter is what makes a connection's stream exact (invariant 3): a channel delivers only envelopes
//! numbered after the snapshot or replay that opened it, and nothing is ever delivered twice or out of order.
//! Every filter's subscriptions count in the gateway's `ahp_relay_subscriptions` gauge while it lives.

use relay_core::bus::{Audience, BusEvent, BusEventKind};
use relay_core::link::SubscriptionChange;
use relay_core::{telemetry, ConnectionId};

/// The delivery filter of one connection.
#[derive(Debug)]
pub struct SubscriptionFilter {
    connection: ConnectionId,
    /// Looked up for every bus event the connection sees: a fast seeded hash (foldhash), not SipHash.
    channels: foldhash::HashMap<String, u64>,
    notifications: bool,
    last_delivered: u64,
}

impl SubscriptionFilter {
    pub fn new(connection: ConnectionId) -> Self {
        Self {
            connection,
            channels: foldhash::HashMap::default(),
            notifications: false,
            last_delivered: 0,
        }
    }

    pub fn apply(&mut self, change: SubscriptionChange) {
        let before = self.channels.len();
        match change {
            SubscriptionChange::Add { channel, after_seq } => {
                self.channels.insert(channel, after_seq);
            }
            SubscriptionChange::Remove { channel } => {
                self.channels.remove(&channel);
            }
            SubscriptionChange::Clear => self.channels.clear(),
        }
        telemetry::subscriptions_changed(before, self.channels.len());
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
                if self.channels.remove(event.channel.as_ref()).is_some() {
                    telemetry::subscriptions_changed(1, 0);
                }
                false
            }
            // A channel's notifications (`root/session*` on the root channel) go to its subscribers.
            BusEventKind::Notification => match &event.audience {
                Audience::Everyone => self.notifications,
                Audience::Connection(id) => self.notifications && *id == self.connection,
                Audience::Subscribers | Audience::SubscribersAnd(_) => {
                    self.notifications && self.channels.contains_key(event.channel.as_ref())
                }
            },
            BusEventKind::Action => {
                let subscribed = || {
                    self.channels
                        .get(event.channel.as_ref())
                        .is_some_and(|&after| event.seq > after)
                };
                let addressed = match &event.audience {
                    Audience::Subscribers => subscribed(),
                    Audience::Connection(id) => *id == self.connection,
                    Audience::SubscribersAnd(id) => *id == self.connection || subscribed(),
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

impl Drop for SubscriptionFilter {
    fn drop(&mut self) {
        telemetry::subscriptions_changed(self.channels.len(), 0);
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
            published_at: None,
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

    #[test]
    fn a_dispatcher_gets_its_echo_and_channel_notifications_go_to_subscribers() {
        let me = ConnectionId(1);
        let mut f = SubscriptionFilter::new(me);
        f.enable_notifications();
        assert!(f.admits(&action(1, "c", Audience::SubscribersAnd(me))), "my echo");
        assert!(!f.admits(&action(2, "c", Audience::SubscribersAnd(ConnectionId(2)))));
        f.apply(SubscriptionChange::Add {
            channel: "c".into(),
            after_seq: 2,
        });
        assert!(f.admits(&action(3, "c", Audience::SubscribersAnd(ConnectionId(2)))));
        let mut note = action(3, "ahp-root://", Audience::Subscribers);
        note.kind = BusEventKind::Notification;
        assert!(!f.admits(&note), "not subscribed to root");
        f.apply(SubscriptionChange::Add {
            channel: "ahp-root://".into(),
            after_seq: 3,
        });
        assert!(f.admits(&note));
    }

    #[test]
    fn subscriptions_are_counted_while_the_filter_lives() {
        let gauge = |text: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix("ahp_relay_subscriptions "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        let mut kept = None;
        let text = telemetry::capture(|| {
            let mut f = SubscriptionFilter::new(ConnectionId(1));
            for channel in ["a", "b", "c"] {
                f.apply(SubscriptionChange::Add {
                    channel: channel.into(),
                    after_seq: 0,
                });
            }
            f.apply(SubscriptionChange::Add {
                channel: "a".into(),
                after_seq: 3,
            });
            f.apply(SubscriptionChange::Remove { channel: "b".into() });
            let mut disposed = action(0, "c", Audience::Subscribers);
            disposed.kind = BusEventKind::ChannelDisposed;
            f.admits(&disposed);
            let mut other = SubscriptionFilter::new(ConnectionId(2));
            other.apply(SubscriptionChange::Add {
                channel: "a".into(),
                after_seq: 0,
            });
            other.apply(SubscriptionChange::Add {
                channel: "d".into(),
                after_seq: 0,
            });
            drop(f);
            other.apply(SubscriptionChange::Clear);
            other.apply(SubscriptionChange::Add {
                channel: "e".into(),
                after_seq: 0,
            });
            kept = Some(other);
        })
        .expect("recorder");
        // `f` is gone; `other` (still alive) holds "e".
        assert_eq!(kept.map(|f| f.subscription_count()), Some(1));
        assert_eq!(gauge(&text), Some(1.0), "{text}");
    }
}
