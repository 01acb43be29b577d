//! The `hosts` table: one row of durable counters per (tenant, host) — the highest serverSeq committed, the
//! log floor left by compaction, the next catalogue number. Every write transaction of a host touches its row
//! first (a fenced commit only checks its lease before that), so the row lock (Postgres) or the write lock
//! (SQLite) orders a host's commits and compactions.

use sqlx::{AnyConnection, AnyPool, Row};

use crate::sql::{from_db, greatest, to_db};
use crate::{Backend, HostRecord, StoreError};

/// Creates the host's row if missing, and returns its counters: the write half of
/// [`crate::Store::load_host`], which reads first ([`read`]), so that only a host's very first load writes
/// and resumes do not queue behind commits for SQLite's write lock.
pub(crate) async fn create(pool: &AnyPool, tenant: &str, host: &str) -> Result<HostRecord, StoreError> {
    sqlx::query("INSERT INTO hosts (tenant, host) VALUES ($1, $2) ON CONFLICT (tenant, host) DO NOTHING")
        .bind(tenant)
        .bind(host)
        .execute(pool)
        .await?;
    read(pool, tenant, host)
        .await?
        .ok_or(StoreError::Database(sqlx::Error::RowNotFound))
}

/// The host's counters, if it has a row.
pub(crate) async fn read(pool: &AnyPool, tenant: &str, host: &str) -> Result<Option<HostRecord>, StoreError> {
    let row =
        sqlx::query("SELECT last_seq, log_floor, next_catalog_no FROM hosts WHERE tenant = $1 AND host = $2")
            .bind(tenant)
            .bind(host)
            .fetch_optional(pool)
            .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(HostRecord {
        last_seq: from_db(row.try_get("last_seq")?, "last_seq")?,
        log_floor: from_db(row.try_get("log_floor")?, "log_floor")?,
        next_catalog_no: from_db(row.try_get("next_catalog_no")?, "next_catalog_no")?,
    }))
}

/// Raises the host's `last_seq` and `next_catalog_no` to at least the given values, creating its row if
/// missing. The first statement of every commit: it takes the host's lock for the rest of the transaction.
pub(crate) async fn raise_counters(
    conn: &mut AnyConnection,
    backend: Backend,
    tenant: &str,
    host: &str,
    last_seq: u64,
    next_catalog_no: u64,
) -> Result<(), StoreError> {
    let max = greatest(backend);
    let sql = format!(
        "INSERT INTO hosts (tenant, host, last_seq, next_catalog_no) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (tenant, host) DO UPDATE SET \
         last_seq = {max}(hosts.last_seq, excluded.last_seq), \
         next_catalog_no = {max}(hosts.next_catalog_no, excluded.next_catalog_no)"
    );
    sqlx::query(&sql)
        .bind(tenant)
        .bind(host)
        .bind(to_db(last_seq, "last_seq")?)
        .bind(to_db(next_catalog_no, "next_catalog_no")?)
        .execute(conn)
        .await?;
    Ok(())
}

/// Takes the host's lock for the rest of the transaction without changing anything.
pub(crate) async fn lock(conn: &mut AnyConnection, tenant: &str, host: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE hosts SET log_floor = log_floor WHERE tenant = $1 AND host = $2")
        .bind(tenant)
        .bind(host)
        .execute(conn)
        .await?;
    Ok(())
}

/// Raises the host's `log_floor` to at least `floor`.
pub(crate) async fn raise_log_floor(
    conn: &mut AnyConnection,
    backend: Backend,
    tenant: &str,
    host: &str,
    floor: u64,
) -> Result<(), StoreError> {
    let sql = format!(
        "UPDATE hosts SET log_floor = {}(log_floor, $3) WHERE tenant = $1 AND host = $2",
        greatest(backend)
    );
    sqlx::query(&sql)
        .bind(tenant)
        .bind(host)
        .bind(to_db(floor, "log_floor")?)
        .execute(conn)
        .await?;
    Ok(())
}
