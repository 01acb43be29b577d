//! What becomes of a pooled connection whose write transaction failed: it is closed, not given back.
//!
//! SQLite rolls a transaction back by itself when its COMMIT fails on a full disk; sqlx then fails to roll
//! it back again and goes on counting it open, so the connection's next transaction would begin with a
//! `SAVEPOINT` (which opens a transaction) and end, on any error, with `ROLLBACK TO` (which does not close
//! it): the connection would keep the database's write lock, and every other writer would wait on it for
//! good. A connection whose transaction failed, for whatever reason, is closed instead (a new one is opened
//! when needed); failed transactions are rare, so this costs nothing in the common case.

use sqlx::pool::PoolConnection;
use sqlx::Any;

/// After a transaction on `conn` ended with `outcome`: if it failed, `conn` is closed when dropped rather
/// than returned to the pool.
pub(crate) fn close_if_failed<T, E>(conn: &mut PoolConnection<Any>, outcome: &Result<T, E>) {
    if outcome.is_err() {
        conn.close_on_drop();
    }
}
