//! Reading back a range of a host's published events for a gateway that saw a gap on its bus (Redis pub/sub
//! is at-most-once): from the replay buffer when it covers the range, else from the store's log.

use std::sync::Arc;

use relay_core::bus::{Audience, BusEvent, BusEventKind};

use crate::error::ShardError;
use crate::host::sequencer::frame_around;
use crate::host::Host;

impl Host {
    /// The published action events with `after < seq <= through`, oldest first, for a gateway repairing a
    /// gap in its bus: from the replay buffer when it still holds everything after `after`, else from the
    /// store's log. Only logged envelopes are returned (rejections and other per-connection envelopes are
    /// never logged); each event's `prev_seq` is the previous returned event's seq (`after` for the first).
    pub async fn fetch_range(&self, after: u64, through: u64) -> Result<Vec<BusEvent>, ShardError> {
        // Never hand out what is numbered but not yet committed and published.
        let through = through.min(self.published_seq());
        if through <= after {
            return Ok(Vec::new());
        }
        let buffered: Option<Vec<(u64, Arc<str>, bytes::Bytes)>> = {
            let core = self.core.lock();
            let replay = core.seq.replay();
            replay.covers(after).then(|| {
                replay
                    .after(after, |_| true)
                    .take_while(|e| e.seq <= through)
                    .map(|e| (e.seq, e.channel.clone(), e.frame.clone()))
                    .collect()
            })
        };
        let rows = match buffered {
            Some(rows) => rows,
            None => self.read_range(after, through).await?,
        };
        let mut prev_seq = after;
        Ok(rows
            .into_iter()
            .map(|(seq, channel, frame)| {
                let event = BusEvent {
                    kind: BusEventKind::Action,
                    channel,
                    seq,
                    prev_seq,
                    audience: Audience::Subscribers,
                    frame,
                    published_at: None,
                };
                prev_seq = seq;
                event
            })
            .collect())
    }

    /// Logged envelopes with `after < seq <= through` from the store, in bounded pages, as (seq, channel,
    /// frame); an error when part of the range was compacted away.
    async fn read_range(
        &self,
        after: u64,
        through: u64,
    ) -> Result<Vec<(u64, Arc<str>, bytes::Bytes)>, ShardError> {
        let (tenant, host) = (&self.key.tenant, &self.key.host);
        let page = self.core.lock().limits.replay_page.max(1);
        let complete = |floor: u64| {
            if floor > after {
                Err(ShardError::Compacted(after))
            } else {
                Ok(())
            }
        };
        complete(self.store.load_host(tenant, host).await?.log_floor)?;
        let mut out = Vec::new();
        let mut from = after;
        loop {
            let rows = self.store.log_range(tenant, host, from, through, page).await?;
            let full = rows.len() == page;
            for row in rows {
                from = row.seq;
                let (_, frame) = frame_around(row.envelope);
                out.push((row.seq, Arc::from(row.channel), frame));
            }
            if !full {
                break;
            }
        }
        // Compaction may have run while paging: only a range that is still complete is exact.
        complete(self.store.load_host(tenant, host).await?.log_floor)?;
        Ok(out)
    }
}
