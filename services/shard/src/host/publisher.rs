//! The host's bus: committed batches published in order to every attached connection (bounded in envelopes and
//! bytes; a slow consumer is dropped, never waited for).

use std::sync::Arc;

use relay_core::bus::{BusBatch, BusEvent, BusEventKind, BusReceiver, BusSender};

use super::pending_batch::Publication;

/// Turns committed publications into bus events, tracking `prev_seq` for gap detection.
///
/// The bus's ring (a broadcast channel of `bus_capacity` slots) exists only while someone listens: it is made
/// at the first subscribe and dropped at the first publish that finds no receiver, so a host nobody is
/// connected to holds no ring.
pub struct Publisher {
    last_published: u64,
    bus_capacity: usize,
    bus_bytes: usize,
    bus: Bus,
}

pub(crate) enum Bus {
    /// Nobody listens: no ring is allocated.
    Idle,
    Open(BusSender),
    /// Closed for good (the host was deposed): receivers see the bus end.
    Closed,
}

impl Publisher {
    /// A publisher whose ring holds `bus_capacity` batches and at most `bus_bytes` of them for its slowest
    /// reader (see [`BusSender`]).
    pub fn new(last_seq: u64, bus_capacity: usize, bus_bytes: usize) -> Self {
        Self {
            last_published: last_seq,
            bus_capacity: bus_capacity.max(16),
            bus_bytes,
            bus: Bus::Idle,
        }
    }

    /// A receiver of the bus; once the bus is closed, one that reports it closed.
    pub fn subscribe(&mut self) -> BusReceiver {
        match &self.bus {
            Bus::Open(bus) => bus.subscribe(),
            Bus::Idle => {
                let bus = BusSender::new(self.bus_capacity, self.bus_bytes);
                let receiver = bus.subscribe();
                self.bus = Bus::Open(bus);
                receiver
            }
            Bus::Closed => BusReceiver::closed(),
        }
    }

    /// Close the bus: every receiver sees it end after the events it already holds.
    pub fn close(&mut self) {
        self.bus = Bus::Closed;
    }

    /// The `serverSeq` of the last action published (what the next event's `prev_seq` will be).
    pub fn last_published(&self) -> u64 {
        self.last_published
    }

    /// Publish one commit's publications on the local bus as one batch; returns the batch, for other buses
    /// (Redis) to carry too. `None` when there is nothing to publish.
    pub fn publish(&mut self, publications: Vec<Publication>) -> Option<BusBatch> {
        if publications.is_empty() {
            return None;
        }
        let now = std::time::Instant::now();
        let batch: BusBatch = publications
            .into_iter()
            .map(|publication| {
                let prev_seq = self.last_published;
                if publication.kind == BusEventKind::Action {
                    self.last_published = publication.seq;
                }
                Arc::new(BusEvent {
                    kind: publication.kind,
                    channel: publication.channel,
                    seq: publication.seq,
                    prev_seq,
                    audience: publication.audience,
                    frame: publication.frame,
                    published_at: Some(now),
                })
            })
            .collect();
        // No receivers means no connection is attached right now: the ring is freed until the next one.
        if let Bus::Open(bus) = &self.bus {
            if bus.send(batch.clone()).is_err() {
                self.bus = Bus::Idle;
            }
        }
        Some(batch)
    }
}
