//! The per-host in-memory replay buffer: the newest accepted envelopes, for exact `reconnect` replay.
//!
//! Rejections and per-connection envelopes (`chat/turnsLoaded` pages) consume a `serverSeq` but are not
//! stored, so the buffer may have holes in its numbering; what matters is the floor: every accepted
//! envelope with `serverSeq > floor` is in the buffer.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;

/// One accepted envelope, serialized once.
#[derive(Debug)]
pub struct StoredEnvelope {
    pub seq: u64,
    pub channel: Arc<str>,
    /// The `ActionEnvelope` JSON (the `params` of the `action` notification).
    pub envelope: Box<RawValue>,
    /// The complete `action` notification frame.
    pub frame: Bytes,
}

impl StoredEnvelope {
    /// The memory it holds, roughly: its JSON twice (the envelope and the frame around it).
    pub fn size(&self) -> usize {
        self.envelope.get().len() + self.frame.len() + self.channel.len()
    }
}

/// A FIFO of [`StoredEnvelope`]s bounded both in count and in bytes (so a few huge envelopes cannot hold
/// as much memory as the count allows).
#[derive(Debug)]
pub struct ReplayBuffer {
    capacity: usize,
    max_bytes: usize,
    bytes: usize,
    entries: VecDeque<Arc<StoredEnvelope>>,
    /// Highest `serverSeq` evicted from the buffer (0 when nothing was evicted).
    floor: u64,
}

impl ReplayBuffer {
    /// An empty buffer for a host whose envelopes up to `floor` are not held (they are in the store),
    /// holding at most `capacity` envelopes of at most `max_bytes` in all.
    pub fn new(capacity: usize, max_bytes: usize, floor: u64) -> Self {
        Self {
            capacity: capacity.max(1),
            max_bytes,
            bytes: 0,
            entries: VecDeque::new(),
            floor,
        }
    }

    pub fn push(&mut self, envelope: Arc<StoredEnvelope>) {
        self.bytes += envelope.size();
        self.entries.push_back(envelope);
        while self.entries.len() > self.capacity || (self.bytes > self.max_bytes && self.entries.len() > 1) {
            let Some(evicted) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= evicted.size();
            self.floor = evicted.seq;
        }
    }

    /// Drop the envelopes numbered `seqs` (their commit failed: they were never accepted after all).
    pub fn remove(&mut self, seqs: &std::collections::HashSet<u64>) {
        let before = self.entries.len();
        self.entries.retain(|entry| !seqs.contains(&entry.seq));
        if self.entries.len() != before {
            self.bytes = self.entries.iter().map(|entry| entry.size()).sum();
        }
    }

    /// Bytes of envelopes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether every accepted envelope after `last_seen` is still held.
    pub fn covers(&self, last_seen: u64) -> bool {
        last_seen >= self.floor
    }

    /// Envelopes after `last_seen` on channels accepted by `wanted`, oldest first.
    pub fn after<'a>(
        &'a self,
        last_seen: u64,
        wanted: impl Fn(&str) -> bool + 'a,
    ) -> impl Iterator<Item = &'a Arc<StoredEnvelope>> + 'a {
        let start = self.entries.partition_point(|e| e.seq <= last_seen);
        self.entries.range(start..).filter(move |e| wanted(&e.channel))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(seq: u64, channel: &str) -> Arc<StoredEnvelope> {
        Arc::new(StoredEnvelope {
            seq,
            channel: channel.into(),
            envelope: RawValue::from_string("{}".into()).expect("raw"),
            frame: Bytes::new(),
        })
    }

    #[test]
    fn replays_exactly_what_follows_last_seen_on_wanted_channels() {
        let mut buffer = ReplayBuffer::new(3, usize::MAX, 0);
        for (seq, ch) in [(1, "a"), (2, "b"), (4, "a"), (5, "a")] {
            buffer.push(env(seq, ch));
        }
        assert!(!buffer.covers(0), "seq 1 was evicted");
        assert!(buffer.covers(1));
        let seqs: Vec<u64> = buffer.after(1, |c| c == "a").map(|e| e.seq).collect();
        assert_eq!(seqs, vec![4, 5]);
        let seqs: Vec<u64> = buffer.after(4, |_| true).map(|e| e.seq).collect();
        assert_eq!(seqs, vec![5]);
    }

    #[test]
    fn the_oldest_envelopes_go_when_the_bytes_run_out() {
        let one = env(1, "a").size();
        let mut buffer = ReplayBuffer::new(100, one * 2, 0);
        for seq in 1..=5 {
            buffer.push(env(seq, "a"));
        }
        assert!(buffer.bytes() <= one * 2);
        assert!(buffer.covers(3) && !buffer.covers(2));
        let seqs: Vec<u64> = buffer.after(0, |_| true).map(|e| e.seq).collect();
        assert_eq!(seqs, vec![4, 5]);
    }
}
