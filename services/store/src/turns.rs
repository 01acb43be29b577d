//! The `turn_archive` table: a chat's turns that left its live state, one row per turn, keyed by the chat's
//! archive key and the turn's absolute index — written with the batch that moved them out of the chat,
//! read a page (or, for an operation naming an old turn, from that turn on) at a time, and deleted with the
//! archive key (a disposed or fully truncated chat).

use sqlx::{AnyConnection, AnyPool, Row};

use crate::sql::{from_db, to_db, Statement, VALUES_PER_LIST, WIDE_ROWS_PER_INSERT};
use crate::{ArchivedTurn, StoreError};

/// Stores `turns`; a turn index stored before (a turn loaded back into state and archived again, or after a
/// truncation) takes the new turn.
pub(crate) async fn store(
    conn: &mut AnyConnection,
    tenant: &str,
    host: &str,
    turns: &[ArchivedTurn],
) -> Result<(), StoreError> {
    // A multi-row upsert may not name a row twice (Postgres refuses): the later of two wins.
    let mut latest: Vec<&ArchivedTurn> = Vec::with_capacity(turns.len());
    let mut at: std::collections::HashMap<(&str, u64), usize> = std::collections::HashMap::new();
    for turn in turns {
        match at.get(&(turn.archive.as_str(), turn.turn_no)) {
            Some(&index) => latest[index] = turn,
            None => {
                at.insert((turn.archive.as_str(), turn.turn_no), latest.len());
                latest.push(turn);
            }
        }
    }
    for chunk in latest.chunks(WIDE_ROWS_PER_INSERT) {
        let mut upsert = Statement::scoped(
            "INSERT INTO turn_archive (tenant, host, archive, turn_no, turn_id, turn) VALUES ",
            tenant,
            host,
        )?;
        for (i, turn) in chunk.iter().enumerate() {
            upsert.push(if i == 0 { "($1, $2, " } else { ", ($1, $2, " });
            upsert.bind(turn.archive.as_str())?.push(", ");
            upsert.bind(to_db(turn.turn_no, "turn_no")?)?.push(", ");
            upsert.bind(turn.turn_id.as_str())?.push(", ");
            upsert.bind(turn.turn.as_str())?.push(")");
        }
        upsert.push(
            " ON CONFLICT (tenant, host, archive, turn_no) DO UPDATE SET \
             turn_id = excluded.turn_id, turn = excluded.turn",
        );
        upsert.execute(conn).await?;
    }
    Ok(())
}

/// Deletes every archived turn of the `archives` (keys; other names in the list match nothing).
pub(crate) async fn remove(
    conn: &mut AnyConnection,
    tenant: &str,
    host: &str,
    archives: &[String],
) -> Result<(), StoreError> {
    for slice in archives.chunks(VALUES_PER_LIST) {
        let mut delete = Statement::scoped(
            "DELETE FROM turn_archive WHERE tenant = $1 AND host = $2 AND archive IN ",
            tenant,
            host,
        )?;
        delete.bind_list(slice.iter().map(String::as_str))?;
        delete.execute(conn).await?;
    }
    Ok(())
}

/// The archived turns with indexes in `[start, end)`, ascending, as (index, turn JSON); a missing index is
/// missing from the answer.
pub(crate) async fn range(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    archive: &str,
    start: u64,
    end: u64,
) -> Result<Vec<(u64, String)>, StoreError> {
    let rows = sqlx::query(
        "SELECT turn_no, turn FROM turn_archive \
         WHERE tenant = $1 AND host = $2 AND archive = $3 AND turn_no >= $4 AND turn_no < $5 ORDER BY turn_no",
    )
    .bind(tenant)
    .bind(host)
    .bind(archive)
    .bind(to_db(start, "start")?)
    .bind(to_db(end, "end")?)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| Ok((from_db(row.try_get("turn_no")?, "turn_no")?, row.try_get("turn")?)))
        .collect()
}

/// The newest archived turns with indexes in `[start, end)` whose JSON adds up to at most `max_bytes` (as the
/// database counts a text's length), and always the newest one, ascending: the store reads and sends no more
/// than a page's budget, however large its turns.
pub(crate) async fn newest_within(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    archive: &str,
    start: u64,
    end: u64,
    max_bytes: u64,
) -> Result<Vec<(u64, String)>, StoreError> {
    let rows = sqlx::query(
        "SELECT turn_no, turn FROM ( \
           SELECT turn_no, turn, LENGTH(turn) AS own, \
                  SUM(LENGTH(turn)) OVER (ORDER BY turn_no DESC ROWS UNBOUNDED PRECEDING) AS upto \
           FROM turn_archive \
           WHERE tenant = $1 AND host = $2 AND archive = $3 AND turn_no >= $4 AND turn_no < $5 \
         ) AS page WHERE upto <= $6 OR upto = own ORDER BY turn_no",
    )
    .bind(tenant)
    .bind(host)
    .bind(archive)
    .bind(to_db(start, "start")?)
    .bind(to_db(end, "end")?)
    .bind(to_db(max_bytes, "max_bytes")?)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| Ok((from_db(row.try_get("turn_no")?, "turn_no")?, row.try_get("turn")?)))
        .collect()
}

/// Whether an archived turn of one of the `archives` holds `needle` (lowercase) in its JSON text, ignoring
/// ASCII case (`LOWER … LIKE`, the needle's `%`, `_` and `\` taken literally); the database reads no row out.
pub(crate) async fn any_contains(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    archives: &[String],
    needle: &str,
) -> Result<bool, StoreError> {
    let pattern = format!(
        "%{}%",
        needle
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    );
    for slice in archives.chunks(VALUES_PER_LIST) {
        let mut query = Statement::scoped(
            "SELECT 1 AS found FROM turn_archive WHERE tenant = $1 AND host = $2 AND archive IN ",
            tenant,
            host,
        )?;
        query.bind_list(slice.iter().map(String::as_str))?;
        query.push(" AND LOWER(turn) LIKE ");
        query.bind(pattern.as_str())?;
        query.push(" ESCAPE '\\' LIMIT 1");
        if !query.fetch_all(pool).await?.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// How long the archived turns with indexes in `[start, end)` are together (as the database counts a text's
/// length), read without reading them.
pub(crate) async fn length(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    archive: &str,
    start: u64,
    end: u64,
) -> Result<u64, StoreError> {
    let total: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(SUM(LENGTH(turn)) AS BIGINT) FROM turn_archive \
         WHERE tenant = $1 AND host = $2 AND archive = $3 AND turn_no >= $4 AND turn_no < $5",
    )
    .bind(tenant)
    .bind(host)
    .bind(archive)
    .bind(to_db(start, "start")?)
    .bind(to_db(end, "end")?)
    .fetch_one(pool)
    .await?;
    from_db(total.unwrap_or(0), "length")
}

/// The index of the archived turn `turn_id` below `before` (the newest, should ids repeat), if any.
pub(crate) async fn position(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    archive: &str,
    turn_id: &str,
    before: u64,
) -> Result<Option<u64>, StoreError> {
    let found: Option<i64> = sqlx::query_scalar(
        "SELECT MAX(turn_no) FROM turn_archive \
         WHERE tenant = $1 AND host = $2 AND archive = $3 AND turn_id = $4 AND turn_no < $5",
    )
    .bind(tenant)
    .bind(host)
    .bind(archive)
    .bind(turn_id)
    .bind(to_db(before, "before")?)
    .fetch_one(pool)
    .await?;
    found.map(|n| from_db(n, "turn_no")).transpose()
}
