//! The `leases` table: who owns each host (design §3, invariant 6 "one writer per host"). One row per
//! (tenant, host) that was ever leased: the owner (NULL once released), the fencing epoch, and when the lease
//! lapses. This module owns taking, renewing, releasing and reading leases, the placement scan for hosts
//! whose owner is gone, and the fencing check that [`crate::Store::commit_fenced`] runs first in its
//! transaction.
//!
//! **Semantics.** A lease is held while `now_ms < expires_at_ms` (times are unix ms, passed in by the
//! caller). Acquiring succeeds when the lease is free (never leased, or released), expired, or already held
//! by the same owner — the last case renews it and keeps its epoch; every change of owner increments the
//! epoch, so epochs only grow, also across release/acquire cycles (a released row keeps its epoch).
//!
//! **Fencing.** A fenced commit first locks the lease row and checks it is still at the writer's epoch and
//! held by the writer — expiry is deliberately not checked: a slow owner whose lease lapsed but was not yet
//! taken loses nothing by committing, and one whose lease was taken fails. Safety therefore never depends on
//! clocks agreeing; clocks only decide *when* another owner may take over.
//!
//! **Race safety.** Every lease change is one statement (acquire: `INSERT … ON CONFLICT DO UPDATE … WHERE …
//! RETURNING`; renew and release: `UPDATE … WHERE owner = … AND epoch = …`), so it is atomic by itself. On
//! Postgres, the upsert locks the conflicting row, waits for any transaction holding it and re-evaluates its
//! `WHERE` on the newest row version, and a concurrent first insert makes the other inserters wait and then
//! take the conflict path: of N concurrent acquirers of a free host exactly one gets it. The fencing check is
//! an `UPDATE` of the lease row whose row count is checked, so the row stays locked until the commit ends and
//! no acquire can slip in between the check and the batch's writes. On SQLite every write statement takes
//! the database's single write lock (the fencing `UPDATE` is the first statement of the commit, so the
//! transaction holds that lock from the start), which serializes all of it.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, AnyPool, Row};

use crate::sql::{from_db, limit_to_db, to_db};
use crate::{Lease, StoreError};

/// Takes the host's lease for `owner` until `now_ms + ttl_ms` if it is free, expired at `now_ms`, or already
/// `owner`'s (then it keeps its epoch); a new owner gets the next epoch (1 for a host never leased).
pub(crate) async fn acquire(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    owner: &str,
    ttl_ms: i64,
    now_ms: i64,
) -> Result<Option<Lease>, StoreError> {
    // In `SET`, `leases.*` is the row before the update; `excluded.*` the row this statement proposed.
    let row = sqlx::query(
        "INSERT INTO leases (tenant, host, owner, epoch, expires_at_ms) VALUES ($1, $2, $3, 1, $4) \
         ON CONFLICT (tenant, host) DO UPDATE SET \
         epoch = CASE WHEN leases.owner = excluded.owner THEN leases.epoch ELSE leases.epoch + 1 END, \
         owner = excluded.owner, \
         expires_at_ms = excluded.expires_at_ms \
         WHERE leases.owner IS NULL OR leases.owner = excluded.owner OR leases.expires_at_ms <= $5 \
         RETURNING owner, epoch, expires_at_ms",
    )
    .bind(tenant)
    .bind(host)
    .bind(owner)
    .bind(expiry(now_ms, ttl_ms)?)
    .bind(now_ms)
    .fetch_optional(pool)
    .await?;
    row.map(|row| lease_from(tenant, host, &row)).transpose()
}

/// Moves the expiry of a lease still held by (`lease.owner`, `lease.epoch`) to `now_ms + ttl_ms`.
pub(crate) async fn renew(
    pool: &AnyPool,
    lease: &Lease,
    ttl_ms: i64,
    now_ms: i64,
) -> Result<Option<Lease>, StoreError> {
    let row = sqlx::query(
        "UPDATE leases SET expires_at_ms = $5 \
         WHERE tenant = $1 AND host = $2 AND owner = $3 AND epoch = $4 \
         RETURNING owner, epoch, expires_at_ms",
    )
    .bind(lease.tenant.as_str())
    .bind(lease.host.as_str())
    .bind(lease.owner.as_str())
    .bind(to_db(lease.epoch, "epoch")?)
    .bind(expiry(now_ms, ttl_ms)?)
    .fetch_optional(pool)
    .await?;
    row.map(|row| lease_from(&lease.tenant, &lease.host, &row))
        .transpose()
}

/// Moves the expiry of every lease `owner` still holds to `now_ms + ttl_ms`, in one statement; returns the
/// leases renewed. A lease the owner lost (taken, or released) is not among them.
pub(crate) async fn renew_all(
    pool: &AnyPool,
    owner: &str,
    ttl_ms: i64,
    now_ms: i64,
) -> Result<Vec<Lease>, StoreError> {
    let rows = sqlx::query(
        "UPDATE leases SET expires_at_ms = $2 WHERE owner = $1 \
         RETURNING tenant, host, owner, epoch, expires_at_ms",
    )
    .bind(owner)
    .bind(expiry(now_ms, ttl_ms)?)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            let tenant: String = row.try_get("tenant")?;
            let host: String = row.try_get("host")?;
            lease_from(&tenant, &host, row)
        })
        .collect()
}

/// Frees a lease still held by (`lease.owner`, `lease.epoch`), keeping its epoch; does nothing otherwise
/// (a lease already lost is someone else's to keep).
pub(crate) async fn release(pool: &AnyPool, lease: &Lease) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE leases SET owner = NULL, expires_at_ms = 0 \
         WHERE tenant = $1 AND host = $2 AND owner = $3 AND epoch = $4",
    )
    .bind(lease.tenant.as_str())
    .bind(lease.host.as_str())
    .bind(lease.owner.as_str())
    .bind(to_db(lease.epoch, "epoch")?)
    .execute(pool)
    .await?;
    Ok(())
}

/// The host's lease if someone holds it or held it last without releasing it (possibly expired: compare
/// `expires_at_ms` with the clock); `None` if it is free.
pub(crate) async fn current(pool: &AnyPool, tenant: &str, host: &str) -> Result<Option<Lease>, StoreError> {
    let row = sqlx::query(
        "SELECT owner, epoch, expires_at_ms FROM leases \
         WHERE tenant = $1 AND host = $2 AND owner IS NOT NULL",
    )
    .bind(tenant)
    .bind(host)
    .fetch_optional(pool)
    .await?;
    row.map(|row| lease_from(tenant, host, &row)).transpose()
}

/// Up to `limit` hosts that were leased and whose lease is now released or expired at `now_ms`, most overdue
/// first. Hosts never leased are not listed: they have no owner to lose and get one when a client asks.
pub(crate) async fn orphaned(
    pool: &AnyPool,
    now_ms: i64,
    limit: usize,
) -> Result<Vec<(String, String)>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(
        "SELECT tenant, host FROM leases WHERE owner IS NULL OR expires_at_ms <= $1 \
         ORDER BY expires_at_ms, tenant, host LIMIT $2",
    )
    .bind(now_ms)
    .bind(limit_to_db(limit))
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| Ok((row.try_get("tenant")?, row.try_get("host")?)))
        .collect()
}

/// The fencing check, to run first in a commit's transaction: locks the host's lease row until the
/// transaction ends (Postgres: a row lock; SQLite: the write lock) if it is at `epoch` and held by `owner`,
/// and fails with [`StoreError::Fenced`] otherwise. Expiry is not checked.
pub(crate) async fn fence(
    conn: &mut AnyConnection,
    tenant: &str,
    host: &str,
    owner: &str,
    epoch: u64,
) -> Result<(), StoreError> {
    // A no-op write rather than a read: it locks the row on Postgres, and on SQLite it takes the write lock
    // at once (after a read, the transaction's first write fails if another writer committed in between).
    let locked = sqlx::query(
        "UPDATE leases SET epoch = epoch WHERE tenant = $1 AND host = $2 AND owner = $3 AND epoch = $4",
    )
    .bind(tenant)
    .bind(host)
    .bind(owner)
    .bind(to_db(epoch, "epoch")?)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if locked == 1 {
        return Ok(());
    }
    let row = sqlx::query("SELECT owner, epoch FROM leases WHERE tenant = $1 AND host = $2")
        .bind(tenant)
        .bind(host)
        .fetch_optional(&mut *conn)
        .await?;
    let (holder, found) = match row {
        Some(row) => (row.try_get("owner")?, from_db(row.try_get("epoch")?, "epoch")?),
        None => (None, 0),
    };
    Err(StoreError::Fenced {
        expected: epoch,
        found,
        holder,
    })
}

/// `now_ms + ttl_ms`, refused rather than wrapped if it overflows.
fn expiry(now_ms: i64, ttl_ms: i64) -> Result<i64, StoreError> {
    now_ms.checked_add(ttl_ms).ok_or(StoreError::OutOfRange {
        what: "expires_at_ms",
        value: i128::from(now_ms) + i128::from(ttl_ms),
    })
}

/// A lease row selected as `owner, epoch, expires_at_ms` (owner not NULL).
fn lease_from(tenant: &str, host: &str, row: &AnyRow) -> Result<Lease, StoreError> {
    Ok(Lease {
        tenant: tenant.to_owned(),
        host: host.to_owned(),
        owner: row.try_get("owner")?,
        epoch: from_db(row.try_get("epoch")?, "epoch")?,
        expires_at_ms: row.try_get("expires_at_ms")?,
    })
}

/// How many of `tenant`'s hosts other than `except` are leased (held, unexpired at `now_ms`) by any owner.
pub(crate) async fn held_of_tenant(
    pool: &AnyPool,
    tenant: &str,
    except: &str,
    now_ms: i64,
) -> Result<u64, StoreError> {
    let count: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM leases WHERE tenant = $1 AND host <> $2 AND owner IS NOT NULL \
         AND expires_at_ms > $3",
    )
    .bind(tenant)
    .bind(except)
    .bind(now_ms)
    .fetch_one(pool)
    .await?;
    Ok(u64::try_from(count).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_overflow_is_refused() {
        assert_eq!(expiry(1_000, 500).ok(), Some(1_500));
        assert!(matches!(
            expiry(i64::MAX, 1),
            Err(StoreError::OutOfRange {
                what: "expires_at_ms",
                ..
            })
        ));
    }
}
