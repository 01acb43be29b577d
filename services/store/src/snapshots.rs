//! The `snapshots` table: the latest state of each live channel of a host, with the session a chat belongs
//! to — storing a batch's snapshots, dropping disposed channels, and restoring a channel as its snapshot
//! plus the log rows after it.

use std::collections::HashMap;

use sqlx::{AnyConnection, AnyPool, Row};

use crate::sql::{from_db, to_db, Statement, VALUES_PER_LIST, WIDE_ROWS_PER_INSERT};
use crate::{ChannelRecord, LogEntry, SnapshotEntry, StoreError};

/// Stores `snapshots`: per channel the one with the highest seq (the later on a tie), and never over a
/// stored snapshot with a higher seq.
pub(crate) async fn store(
    conn: &mut AnyConnection,
    tenant: &str,
    host: &str,
    snapshots: &[SnapshotEntry],
) -> Result<(), StoreError> {
    let latest = latest_per_channel(snapshots);
    for chunk in latest.chunks(WIDE_ROWS_PER_INSERT) {
        let mut upsert = Statement::scoped(
            "INSERT INTO snapshots (tenant, host, channel, parent, seq, state) VALUES ",
            tenant,
            host,
        )?;
        for (i, snapshot) in chunk.iter().enumerate() {
            upsert.push(if i == 0 { "($1, $2, " } else { ", ($1, $2, " });
            upsert.bind(snapshot.channel.as_str())?.push(", ");
            upsert.bind(snapshot.parent.as_deref())?.push(", ");
            upsert.bind(to_db(snapshot.seq, "seq")?)?.push(", ");
            upsert.bind(snapshot.state.as_str())?.push(")");
        }
        upsert.push(
            " ON CONFLICT (tenant, host, channel) DO UPDATE SET \
             parent = excluded.parent, seq = excluded.seq, state = excluded.state \
             WHERE excluded.seq >= snapshots.seq",
        );
        upsert.execute(conn).await?;
    }
    Ok(())
}

/// One snapshot per channel, the latest; a multi-row upsert may not name a row twice (Postgres refuses).
fn latest_per_channel(snapshots: &[SnapshotEntry]) -> Vec<&SnapshotEntry> {
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(snapshots.len());
    let mut latest: Vec<&SnapshotEntry> = Vec::with_capacity(snapshots.len());
    for snapshot in snapshots {
        match index.get(snapshot.channel.as_str()) {
            Some(&at) if latest[at].seq > snapshot.seq => {}
            Some(&at) => latest[at] = snapshot,
            None => {
                index.insert(&snapshot.channel, latest.len());
                latest.push(snapshot);
            }
        }
    }
    latest
}

/// Deletes the snapshots of `channels`.
pub(crate) async fn remove(
    conn: &mut AnyConnection,
    tenant: &str,
    host: &str,
    channels: &[String],
) -> Result<(), StoreError> {
    for slice in channels.chunks(VALUES_PER_LIST) {
        let mut delete = Statement::scoped(
            "DELETE FROM snapshots WHERE tenant = $1 AND host = $2 AND channel IN ",
            tenant,
            host,
        )?;
        delete.bind_list(slice.iter().map(String::as_str))?;
        delete.execute(conn).await?;
    }
    Ok(())
}

/// The channel's snapshot and the log rows after it, read by one statement so both come from the same
/// committed state (a compaction between two reads could otherwise remove rows the older snapshot needs).
pub(crate) async fn restore(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    channel: &str,
) -> Result<Option<ChannelRecord>, StoreError> {
    let rows = sqlx::query(
        "SELECT CAST(0 AS BIGINT) AS part, seq, state AS body, CAST(0 AS BIGINT) AS at_ms \
         FROM snapshots WHERE tenant = $1 AND host = $2 AND channel = $3 \
         UNION ALL \
         SELECT CAST(1 AS BIGINT), l.seq, l.envelope, l.at_ms \
         FROM snapshots s JOIN log l \
         ON l.tenant = s.tenant AND l.host = s.host AND l.channel = s.channel AND l.seq > s.seq \
         WHERE s.tenant = $1 AND s.host = $2 AND s.channel = $3 \
         ORDER BY part, seq",
    )
    .bind(tenant)
    .bind(host)
    .bind(channel)
    .fetch_all(pool)
    .await?;
    let mut rows = rows.into_iter();
    let Some(snapshot) = rows.next() else {
        return Ok(None);
    };
    let mut record = ChannelRecord {
        snapshot_seq: from_db(snapshot.try_get("seq")?, "seq")?,
        state: snapshot.try_get("body")?,
        tail: Vec::with_capacity(rows.len()),
    };
    for row in rows {
        record.tail.push(LogEntry {
            seq: from_db(row.try_get("seq")?, "seq")?,
            channel: channel.to_owned(),
            envelope: row.try_get("body")?,
            at_ms: row.try_get("at_ms")?,
        });
    }
    Ok(Some(record))
}

/// The chat channels whose snapshots name `session` as their parent, in URI order.
pub(crate) async fn chats_of(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    session: &str,
) -> Result<Vec<String>, StoreError> {
    let rows = sqlx::query(
        "SELECT channel FROM snapshots WHERE tenant = $1 AND host = $2 AND parent = $3 ORDER BY channel",
    )
    .bind(tenant)
    .bind(host)
    .bind(session)
    .fetch_all(pool)
    .await?;
    rows.iter().map(|row| Ok(row.try_get("channel")?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(channel: &str, seq: u64) -> SnapshotEntry {
        SnapshotEntry {
            channel: channel.into(),
            parent: None,
            seq,
            state: format!("{{\"at\":{seq}}}"),
        }
    }

    #[test]
    fn the_latest_snapshot_of_each_channel_is_kept_in_first_seen_order() {
        let batch = [
            snapshot("a", 3),
            snapshot("b", 1),
            snapshot("a", 5),
            snapshot("a", 4),
            snapshot("b", 1),
        ];
        let kept: Vec<(&str, u64)> = latest_per_channel(&batch)
            .iter()
            .map(|s| (s.channel.as_str(), s.seq))
            .collect();
        assert_eq!(kept, [("a", 5), ("b", 1)]);
        // on a tie the later entry wins
        assert!(std::ptr::eq(latest_per_channel(&batch)[1], &batch[4]));
    }
}
