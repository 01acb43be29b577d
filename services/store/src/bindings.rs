//! The `client_bindings` table: which user (token subject) each AHP clientId of a host belongs to — the first
//! subject that used it, kept across restarts so nobody else can claim it after one.

use sqlx::{AnyConnection, AnyPool};

use crate::sql::{Statement, ROWS_PER_INSERT};
use crate::{ClientBinding, StoreError};

/// Records `bindings` that are not recorded yet, and the use of those that are; an existing binding's subject
/// is never changed.
pub(crate) async fn store(
    conn: &mut AnyConnection,
    tenant: &str,
    host: &str,
    bindings: &[ClientBinding],
) -> Result<(), StoreError> {
    for chunk in bindings.chunks(ROWS_PER_INSERT) {
        let mut insert = Statement::scoped(
            "INSERT INTO client_bindings (tenant, host, client_id, subject, last_used_ms) VALUES ",
            tenant,
            host,
        )?;
        for (i, binding) in chunk.iter().enumerate() {
            insert.push(if i == 0 { "($1, $2, " } else { ", ($1, $2, " });
            insert.bind(binding.client_id.as_str())?.push(", ");
            insert.bind(binding.subject.as_str())?.push(", ");
            insert.bind(binding.used_at_ms)?.push(")");
        }
        insert.push(
            " ON CONFLICT (tenant, host, client_id) DO UPDATE SET last_used_ms = \
             CASE WHEN excluded.last_used_ms > client_bindings.last_used_ms THEN excluded.last_used_ms \
             ELSE client_bindings.last_used_ms END",
        );
        insert.execute(conn).await?;
    }
    Ok(())
}

/// The subject `client_id` is bound to on the host, if any.
pub(crate) async fn subject_of(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    client_id: &str,
) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT subject FROM client_bindings WHERE tenant = $1 AND host = $2 AND client_id = $3",
    )
    .bind(tenant)
    .bind(host)
    .bind(client_id)
    .fetch_optional(pool)
    .await?)
}

/// Rows one statement of the prune touches: a prune of a large table is many short transactions, never one
/// long lock on it ([`crate::Store::compact`] takes the writer's turn for each).
pub(crate) const PRUNE_BATCH: u64 = 5_000;

/// The time a prune stamps never-used bindings with (unix ms).
pub(crate) fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_millis())
            .unwrap_or_default(),
    )
    .unwrap_or(i64::MAX)
}

/// The first step of a prune, one batch of at most [`PRUNE_BATCH`] rows: a binding whose use was never noted
/// (`0`: written by a release before its use was kept, or by one still running during a rolling upgrade) is
/// stamped as used at `now_ms`, never taken for stale. Returns how many were stamped; fewer than a batch means
/// none is left.
pub(crate) async fn stamp_unused(pool: &AnyPool, now_ms: i64) -> Result<u64, StoreError> {
    let stamped = sqlx::query(
        "UPDATE client_bindings SET last_used_ms = $1 WHERE last_used_ms = 0 AND (tenant, host, client_id) IN \
         (SELECT tenant, host, client_id FROM client_bindings WHERE last_used_ms = 0 LIMIT $2)",
    )
    .bind(now_ms)
    .bind(PRUNE_BATCH as i64)
    .execute(pool)
    .await?;
    Ok(stamped.rows_affected())
}

/// The second step, one batch of at most [`PRUNE_BATCH`] rows: removes bindings last used before
/// `older_than_ms` (unix ms). Returns how many; fewer than a batch means none is left.
pub(crate) async fn remove_stale(pool: &AnyPool, older_than_ms: i64) -> Result<u64, StoreError> {
    let batch = sqlx::query(
        "DELETE FROM client_bindings WHERE last_used_ms > 0 AND last_used_ms < $1 \
         AND (tenant, host, client_id) IN (SELECT tenant, host, client_id FROM client_bindings \
          WHERE last_used_ms > 0 AND last_used_ms < $1 LIMIT $2)",
    )
    .bind(older_than_ms)
    .bind(PRUNE_BATCH as i64)
    .execute(pool)
    .await?;
    Ok(batch.rows_affected())
}
