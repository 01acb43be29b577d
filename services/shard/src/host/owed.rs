//! Envelopes a client is owed outside its subscriptions: the rejections of its actions, and the echoes of
//! actions it dispatched on channels it does not subscribe to.
//!
//! Neither reaches a replay through the channel log (rejections are never logged; an unsubscribed channel is
//! not replayed), so a client that dropped right after dispatching would never learn how its action ended.
//! The host keeps the newest few per clientId in memory and `reconnect` carries those after the client's
//! `lastSeenServerSeq` in its replay. They go with the client's binding when its grace period ends.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::host::replay_buffer::StoredEnvelope;

/// Envelopes kept per clientId (the oldest go first).
const OWED_PER_CLIENT: usize = 64;

/// The owed envelopes of every client of a host.
#[derive(Default)]
pub struct OwedEnvelopes {
    by_client: HashMap<String, VecDeque<Arc<StoredEnvelope>>>,
}

impl OwedEnvelopes {
    /// Remember that `client_id` is owed `envelope`.
    pub fn owe(&mut self, client_id: &str, envelope: Arc<StoredEnvelope>) {
        let owed = self.by_client.entry(client_id.to_string()).or_default();
        if owed.len() >= OWED_PER_CLIENT {
            owed.pop_front();
        }
        owed.push_back(envelope);
    }

    /// What `client_id` is owed with `after < seq <= through`, oldest first.
    pub fn after(&self, client_id: &str, after: u64, through: u64) -> Vec<Arc<StoredEnvelope>> {
        self.by_client
            .get(client_id)
            .map(|owed| {
                owed.iter()
                    .filter(|e| e.seq > after && e.seq <= through)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Drop the envelopes numbered `seqs` (their commit failed).
    pub fn remove(&mut self, seqs: &std::collections::HashSet<u64>) {
        for owed in self.by_client.values_mut() {
            owed.retain(|envelope| !seqs.contains(&envelope.seq));
        }
    }

    /// The client is gone for good.
    pub fn forget(&mut self, client_id: &str) {
        self.by_client.remove(client_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    fn env(seq: u64) -> Arc<StoredEnvelope> {
        Arc::new(StoredEnvelope {
            seq,
            channel: "ahp-chat:/c".into(),
            envelope: RawValue::from_string("{}".into()).expect("raw"),
            frame: bytes::Bytes::new(),
        })
    }

    #[test]
    fn keeps_the_newest_envelopes_of_each_client_in_range() {
        let mut owed = OwedEnvelopes::default();
        for seq in 1..=(OWED_PER_CLIENT as u64 + 5) {
            owed.owe("a", env(seq));
        }
        owed.owe("b", env(1000));
        let seqs: Vec<u64> = owed.after("a", 0, u64::MAX).iter().map(|e| e.seq).collect();
        assert_eq!(seqs.len(), OWED_PER_CLIENT);
        assert_eq!(seqs.first(), Some(&6));
        let seqs: Vec<u64> = owed.after("a", 10, 12).iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [11, 12]);
        owed.forget("a");
        assert!(owed.after("a", 0, u64::MAX).is_empty());
        assert_eq!(owed.after("b", 0, u64::MAX).len(), 1);
    }
}
