//! What becomes of a pooled connection whose write transaction failed: it is closed, not given back.
//!
//! SQLite rolls a transaction back by itself when its COMMIT fails on a full disk; sqlx then fails to roll
//! it back again and goes on counting it open, so the connection's next transaction would begin with a
//! `SAVEPOINT` (which opens a transaction) and end, on any error, with `ROLLBACK TO` (which does not close
//! it): the connection would keep the database's write lock, and every other writer would wait on it for
//! good. A connection whose transaction failed, for whatever reason, is closed instead (a new one is opened
//! when needed); failed transactions are rare, so this costs nothing in the common case. The exception is an
//! in-memory SQLite database, whose one connection is the database itself (and which no disk can fill).

use sqlx::{AnyConnection, AnyPool, Connection};

use crate::StoreError;

/// What to do with a connection whose transaction failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailedConnections {
    /// Close it (a new one is opened when needed).
    Close,
    /// Keep it: an in-memory SQLite database lives and dies with its one connection.
    Keep,
}

impl FailedConnections {
    /// Runs `work` in one transaction on a connection of `pool`'s and commits it if `work` succeeds. If
    /// anything fails, the transaction is rolled back and its connection closed rather than returned to the
    /// pool (unless the policy is [`FailedConnections::Keep`]).
    pub(crate) async fn in_transaction<T>(
        self,
        pool: &AnyPool,
        work: impl AsyncFnOnce(&mut AnyConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = pool.acquire().await?;
        let outcome = run(&mut conn, work).await;
        if outcome.is_err() && self == FailedConnections::Close {
            conn.close_on_drop();
        }
        outcome
    }
}

/// Runs `work` in one transaction on `conn` and commits it if `work` succeeds; otherwise it is rolled back.
/// What becomes of `conn` after a failure is the caller's to decide (see above).
pub(crate) async fn run<T>(
    conn: &mut AnyConnection,
    work: impl AsyncFnOnce(&mut AnyConnection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut tx = conn.begin().await?;
    let value = work(&mut tx).await?;
    tx.commit().await?;
    Ok(value)
}
