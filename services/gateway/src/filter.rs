//! Which bus events one connection receives: its subscriptions and the `serverSeq` each starts after.
//!
//! The filter is what makes a connection's stream exact (invariant 3): a channel delivers only envelopes
//! numbered after the snapshot or replay that opened it, and nothing is ever delivered twice or out of order.
//! Every filter's subscriptions count in the gateway's `ahp_relay_subscriptions` gauge while it lives.

use std::hash::BuildHasher;
use std::sync::Arc;

use relay_core::bus::{Audience, BusEvent, BusEventKind};
use relay_core::link::SubscriptionChange;
use relay_core::{channel_names, telemetry, ConnectionId};
use smallvec::SmallVec;

/// Subscriptions a filter keeps inline, looked up by a scan; a connection with more gets a hash map.
const INLINE_SUBSCRIPTIONS: usize = 3;

/// The delivery filter of one connection. Laid out in this order (`repr(C)`), so that what an action's
/// lookup reads — the last delivered seq, the first inline subscriptions — is in as few cache lines as it can
/// be (see [`Channels`]).
#[derive(Debug)]
#[repr(C)]
pub struct SubscriptionFilter {
    last_delivered: u64,
    connection: ConnectionId,
    notifications: bool,
    channels: Channels,
}

/// A connection's subscriptions: channel → the `serverSeq` its delivery starts after.
///
/// Looked up for every bus event the connection sees, by the lane that writes to thousands of connections in
/// turn, so each lookup touches memory no other connection does. A few subscriptions (the common case: the
/// root channel, a session, a chat) are kept inline in the filter, each with its channel's hash and the
/// process's shared name ([`relay_core::channel_names`]), which bus events carry too: a lookup reads the
/// filter and finds a subscribed channel by its pointer; otherwise (an event of a channel it does not hold,
/// or one whose name is not the shared one) it compares hashes, and the text only where a hash matches. A
/// hash map instead costs a read of its control bytes, one of its slot and one of the key's text, each a cache
/// miss (70% and 21% of `admits`' samples, and `memcmp` as much again, in `scripts/bench peers` at 2,000 ×
/// 50/s).
#[derive(Debug)]
enum Channels {
    Few(SmallVec<[Subscription; INLINE_SUBSCRIPTIONS]>),
    /// More than [`INLINE_SUBSCRIPTIONS`] at some point (until cleared): a fast seeded hash (foldhash).
    Many(foldhash::HashMap<Arc<str>, u64>),
}

/// One inline subscription.
#[derive(Debug)]
struct Subscription {
    /// [`channel_hash`] of `channel`.
    hash: u64,
    after_seq: u64,
    channel: Arc<str>,
}

/// The hash inline subscriptions are compared by (a fixed seed: there is no table to attack).
fn channel_hash(channel: &str) -> u64 {
    foldhash::fast::FixedState::default().hash_one(channel)
}

/// Where `channel` is among inline subscriptions, by its hash and then its text.
fn position_of(few: &[Subscription], channel: &str) -> Option<usize> {
    let hash = channel_hash(channel);
    few.iter()
        .position(|sub| sub.hash == hash && *sub.channel == *channel)
}

impl Channels {
    fn len(&self) -> usize {
        match self {
            Channels::Few(few) => few.len(),
            Channels::Many(many) => many.len(),
        }
    }

    fn get(&self, channel: &Arc<str>) -> Option<u64> {
        match self {
            Channels::Few(few) if few.is_empty() => None,
            Channels::Few(few) => {
                let at = few
                    .iter()
                    .position(|sub| Arc::ptr_eq(&sub.channel, channel))
                    .or_else(|| position_of(few, channel))?;
                Some(few[at].after_seq)
            }
            Channels::Many(many) => many.get(&**channel).copied(),
        }
    }

    fn insert(&mut self, channel: String, after_seq: u64) {
        match self {
            Channels::Few(few) => {
                if let Some(at) = position_of(few, &channel) {
                    few[at].after_seq = after_seq;
                } else if few.len() < INLINE_SUBSCRIPTIONS {
                    few.push(Subscription {
                        hash: channel_hash(&channel),
                        after_seq,
                        channel: channel_names::shared(&channel),
                    });
                } else {
                    let mut many: foldhash::HashMap<Arc<str>, u64> =
                        few.drain(..).map(|sub| (sub.channel, sub.after_seq)).collect();
                    many.insert(channel_names::shared(&channel), after_seq);
                    *self = Channels::Many(many);
                }
            }
            Channels::Many(many) => {
                many.insert(channel_names::shared(&channel), after_seq);
            }
        }
    }

    /// Whether `channel` was there.
    fn remove(&mut self, channel: &str) -> bool {
        match self {
            Channels::Few(few) => match position_of(few, channel) {
                Some(at) => {
                    few.remove(at);
                    true
                }
                None => false,
            },
            Channels::Many(many) => many.remove(channel).is_some(),
        }
    }

    fn clear(&mut self) {
        *self = Channels::Few(SmallVec::new());
    }
}

impl SubscriptionFilter {
    pub fn new(connection: ConnectionId) -> Self {
        Self {
            connection,
            channels: Channels::Few(SmallVec::new()),
            notifications: false,
            last_delivered: 0,
        }
    }

    pub fn apply(&mut self, change: SubscriptionChange) {
        let before = self.channels.len();
        match change {
            SubscriptionChange::Add { channel, after_seq } => self.channels.insert(channel, after_seq),
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
                if self.channels.remove(event.channel.as_ref()) {
                    telemetry::subscriptions_changed(1, 0);
                }
                false
            }
            // A channel's notifications (`root/session*` on the root channel) go to its subscribers.
            BusEventKind::Notification => match &event.audience {
                Audience::Everyone => self.notifications,
                Audience::Connection(id) => self.notifications && *id == self.connection,
                Audience::Subscribers | Audience::SubscribersAnd(_) => {
                    self.notifications && self.channels.get(&event.channel).is_some()
                }
            },
            BusEventKind::Action => {
                let subscribed = || {
                    self.channels
                        .get(&event.channel)
                        .is_some_and(|after| event.seq > after)
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

    /// The filter against a plain map of the same changes, through the switch from inline subscriptions to a
    /// hash map and back (a clear): every channel is looked up after every change, by actions (with the shared
    /// name or another), notifications and disposals alike.
    #[test]
    fn the_filter_answers_as_a_map_of_its_subscriptions_would_inline_and_beyond() {
        let channels: Vec<String> = (0..12).map(|i| format!("ahp-session:/s/{i}/chat")).collect();
        let mut f = SubscriptionFilter::new(ConnectionId(1));
        f.enable_notifications();
        let mut model: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        // A fixed walk (xorshift) over adds, re-adds, removes, clears and disposals.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        };
        let mut seq = 0;
        let mut went_beyond_inline = false;
        for _ in 0..2_000 {
            let channel = channels[next(channels.len() as u64) as usize].clone();
            match next(10) {
                0..=4 => {
                    // Sometimes ahead of the next actions (they are not delivered until it is passed), and a
                    // channel added again moves its start.
                    let after_seq = seq + next(4) * channels.len() as u64;
                    f.apply(SubscriptionChange::Add {
                        channel: channel.clone(),
                        after_seq,
                    });
                    model.insert(channel, after_seq);
                }
                5..=6 => {
                    f.apply(SubscriptionChange::Remove {
                        channel: channel.clone(),
                    });
                    model.remove(&channel);
                }
                7 => {
                    let mut disposed = action(seq, &channel, Audience::Subscribers);
                    disposed.kind = BusEventKind::ChannelDisposed;
                    assert!(!f.admits(&disposed));
                    model.remove(&channel);
                }
                8 if next(8) == 0 => {
                    f.apply(SubscriptionChange::Clear);
                    model.clear();
                }
                _ => {}
            }
            went_beyond_inline |= model.len() > INLINE_SUBSCRIPTIONS;
            assert_eq!(f.subscription_count(), model.len());
            for channel in &channels {
                // Events carry the process's shared name (as the bus does) or a name of their own.
                let mut note = action(seq, channel, Audience::Subscribers);
                note.kind = BusEventKind::Notification;
                if next(2) == 0 {
                    note.channel = channel_names::shared(channel);
                }
                assert_eq!(f.admits(&note), model.contains_key(channel), "{channel}");
                seq += 1;
                let expected = model.get(channel).is_some_and(|&after| seq > after);
                let mut event = action(seq, channel, Audience::Subscribers);
                if next(2) == 0 {
                    event.channel = channel_names::shared(channel);
                }
                assert_eq!(f.admits(&event), expected, "{channel} at {seq}");
            }
        }
        assert!(went_beyond_inline, "the walk never needed the hash map");
    }

    /// A subscription holds the process's shared name, so an event from the bus is recognised by its pointer.
    #[test]
    fn subscriptions_hold_the_shared_channel_name() {
        let mut f = SubscriptionFilter::new(ConnectionId(1));
        f.apply(SubscriptionChange::Add {
            channel: "ahp-chat:/filter-shared".into(),
            after_seq: 0,
        });
        let Channels::Few(few) = &f.channels else {
            panic!("one subscription is kept inline");
        };
        assert!(Arc::ptr_eq(
            &few[0].channel,
            &channel_names::shared("ahp-chat:/filter-shared")
        ));
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
            for channel in ["a", "b", "c", "f", "g"] {
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
