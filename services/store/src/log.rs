//! The `log` table: every committed envelope of a host, keyed by (tenant, host, seq) — appending a batch,
//! reading a set of channels after a resume point, and the retention rule that removes rows only where a
//! snapshot already covers them.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, AnyPool, Row};

use crate::sql::{from_db, limit_to_db, to_db, Statement, ROWS_PER_INSERT, VALUES_PER_LIST};
use crate::{LogEntry, StoreError};

/// Appends `entries` to the host's log with multi-row INSERTs.
pub(crate) async fn append(
    conn: &mut AnyConnection,
    tenant: &str,
    host: &str,
    entries: &[LogEntry],
) -> Result<(), StoreError> {
    for chunk in entries.chunks(ROWS_PER_INSERT) {
        let mut insert = Statement::scoped(
            "INSERT INTO log (tenant, host, seq, channel, envelope, at_ms) VALUES ",
            tenant,
            host,
        )?;
        for (i, entry) in chunk.iter().enumerate() {
            insert.push(if i == 0 { "($1, $2, " } else { ", ($1, $2, " });
            insert.bind(to_db(entry.seq, "seq")?)?.push(", ");
            insert.bind(entry.channel.as_str())?.push(", ");
            insert.bind(entry.envelope.as_str())?.push(", ");
            insert.bind(entry.at_ms)?.push(")");
        }
        insert.execute(conn).await?;
    }
    Ok(())
}

/// Up to `limit` rows with seq > `after_seq` on any of `channels`, ascending seq.
pub(crate) async fn after(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    after_seq: u64,
    channels: &[String],
    limit: usize,
) -> Result<Vec<LogEntry>, StoreError> {
    if channels.is_empty() || limit == 0 {
        return Ok(Vec::new());
    }
    let after_seq = to_db(after_seq, "after_seq")?;
    let mut entries = Vec::new();
    // Long channel lists are read in slices; the first `limit` rows of the union are among the first `limit`
    // rows of the slices.
    for slice in channels.chunks(VALUES_PER_LIST) {
        let mut select = Statement::scoped(
            "SELECT seq, channel, envelope, at_ms FROM log WHERE tenant = $1 AND host = $2 AND seq > ",
            tenant,
            host,
        )?;
        select.bind(after_seq)?.push(" AND channel IN ");
        select.bind_list(slice.iter().map(String::as_str))?;
        select.push(" ORDER BY seq LIMIT ").bind(limit_to_db(limit))?;
        for row in select.fetch_all(pool).await? {
            entries.push(entry_from(&row)?);
        }
    }
    if channels.len() > VALUES_PER_LIST {
        entries.sort_by_key(|entry| entry.seq);
        entries.truncate(limit);
    }
    Ok(entries)
}

/// Up to `limit` rows with `after_seq < seq <= through_seq` on any channel of the host, ascending seq.
pub(crate) async fn range(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    after_seq: u64,
    through_seq: u64,
    limit: usize,
) -> Result<Vec<LogEntry>, StoreError> {
    if limit == 0 || through_seq <= after_seq {
        return Ok(Vec::new());
    }
    let mut select = Statement::scoped(
        "SELECT seq, channel, envelope, at_ms FROM log WHERE tenant = $1 AND host = $2 AND seq > ",
        tenant,
        host,
    )?;
    select.bind(to_db(after_seq, "after_seq")?)?.push(" AND seq <= ");
    select.bind(to_db(through_seq, "through_seq")?)?;
    select.push(" ORDER BY seq LIMIT ").bind(limit_to_db(limit))?;
    select.fetch_all(pool).await?.iter().map(entry_from).collect()
}

/// A log row selected as `seq, channel, envelope, at_ms`.
pub(crate) fn entry_from(row: &AnyRow) -> Result<LogEntry, StoreError> {
    Ok(LogEntry {
        seq: from_db(row.try_get("seq")?, "seq")?,
        channel: row.try_get("channel")?,
        envelope: row.try_get("envelope")?,
        at_ms: row.try_get("at_ms")?,
    })
}

/// Every host that has log rows older than `older_than_ms`.
pub(crate) async fn hosts_with_rows_older_than(
    pool: &AnyPool,
    older_than_ms: i64,
) -> Result<Vec<(String, String)>, StoreError> {
    let rows = sqlx::query("SELECT DISTINCT tenant, host FROM log WHERE at_ms < $1")
        .bind(older_than_ms)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get("tenant")?, row.try_get("host")?)))
        .collect()
}

/// The rows retention may remove from the host ($1, $2) for the cut-off $3: older than the cut-off, and
/// either covered by their channel's snapshot (seq ≤ snapshot seq, so the channel stays restorable from
/// that snapshot and the rows after it) or of a channel with no snapshot at all (disposed, so nothing can
/// restore or replay it any more).
const COMPACTABLE: &str = "FROM log WHERE tenant = $1 AND host = $2 AND at_ms < $3 \
     AND seq <= COALESCE((SELECT s.seq FROM snapshots s \
         WHERE s.tenant = log.tenant AND s.host = log.host AND s.channel = log.channel), log.seq)";

/// The highest seq retention would remove from the host (0 if none).
pub(crate) async fn highest_compactable(
    conn: &mut AnyConnection,
    tenant: &str,
    host: &str,
    older_than_ms: i64,
) -> Result<u64, StoreError> {
    let highest: i64 = sqlx::query_scalar(&format!("SELECT COALESCE(MAX(seq), 0) {COMPACTABLE}"))
        .bind(tenant)
        .bind(host)
        .bind(older_than_ms)
        .fetch_one(conn)
        .await?;
    from_db(highest, "seq")
}

/// Removes the rows retention may remove from the host; returns how many.
pub(crate) async fn remove_compactable(
    conn: &mut AnyConnection,
    tenant: &str,
    host: &str,
    older_than_ms: i64,
) -> Result<u64, StoreError> {
    let done = sqlx::query(&format!("DELETE {COMPACTABLE}"))
        .bind(tenant)
        .bind(host)
        .bind(older_than_ms)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}
