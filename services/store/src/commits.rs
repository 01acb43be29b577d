//! Where a store's commits are written. For a SQLite file, one connection of the store's own, kept open outside
//! any pool: SQLite has one writer at a time anyway; a connection that alone writes keeps its page cache between
//! commits (commits taken by turns from the shared pool read 13 pages each and touched three connections' worker
//! threads, `perf trace`, 1 shard at 50 actions/s); and outside a pool a commit is only its own statements. sqlx
//! pings a pooled connection when it is taken (by default) and always when it is given back, each a round trip
//! to the connection's worker thread, as every statement is. The connection has the pool's settings; it is
//! dropped when a transaction on it fails (see [`crate::transaction`] for why) and opened again by the next
//! commit. An in-memory SQLite database's commits go through its pool (the pool's one connection is the
//! database).
//!
//! On Postgres, which writes hosts in parallel, a commit made on a **commit thread** (a thread that drives a
//! runtime of its own for the rest of the process's life and says so with [`mark_commit_thread`]) goes through
//! a small pool of that thread's own, opened on it: a connection's socket is driven by the runtime it was
//! opened on, so a commit through the store's pool (opened on the process's main runtime) waits at every
//! statement for a worker of that runtime — busy with thousands of connections under load — to notice the
//! answer and wake the commit thread. Commits made anywhere else go through the store's pool.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::thread::ThreadId;

use sqlx::{AnyConnection, AnyPool, Connection};
use tokio::sync::Mutex;

use crate::connect;
use crate::transaction::{self, FailedConnections};
use crate::{Backend, StoreError};

thread_local! {
    /// Whether this thread is a commit thread ([`mark_commit_thread`]).
    static COMMIT_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as a commit thread: one that drives a runtime of its own (a current-thread tokio
/// runtime) for the rest of the process's life, and runs commits on it. A Postgres store's commits made on
/// it then go through connections opened on it (see the module's documentation). A thread that ends, or
/// drives another runtime afterwards, must not be marked: connections opened on its runtime would outlive it.
pub fn mark_commit_thread() {
    COMMIT_THREAD.with(|marked| marked.set(true));
}

/// Whether the calling thread is a commit thread.
fn on_a_commit_thread() -> bool {
    COMMIT_THREAD.with(Cell::get)
}

/// Where commits are written. Cheap to clone: clones share the pools or the connection.
#[derive(Debug, Clone)]
pub(crate) enum Commits {
    /// An in-memory SQLite database: the store's pool, whose one connection is kept even after a failure.
    Pool {
        pool: AnyPool,
        failed: FailedConnections,
    },
    /// Postgres (`url`): each commit thread's pool, opened on it when it first commits; elsewhere the store's
    /// `pool`. A connection whose transaction failed is closed.
    Lanes {
        url: Arc<str>,
        pool: AnyPool,
        lanes: Arc<parking_lot::Mutex<HashMap<ThreadId, AnyPool>>>,
    },
    /// A SQLite file (`url`, as opened): its own connection.
    Own {
        url: Arc<str>,
        connection: Arc<Mutex<OwnConnection>>,
    },
}

/// A SQLite file's commit connection between commits.
#[derive(Debug)]
pub(crate) enum OwnConnection {
    /// Open, kept from the last commit.
    Kept(AnyConnection),
    /// None: the last transaction failed or was cancelled (its connection went with it), or none has run yet
    /// since; the next commit opens one.
    None,
    /// The store was closed: commits fail.
    Closed,
}

impl Commits {
    /// Where the commits of the store at `url` go, beside `pool` (what [`connect::open_pool`] opened for it);
    /// `failed` says what becomes of a pooled connection whose transaction failed. A SQLite file's own
    /// connection is opened now.
    pub(crate) async fn open(
        url: &str,
        backend: Backend,
        pool: &AnyPool,
        failed: FailedConnections,
    ) -> Result<Self, StoreError> {
        if let Some(file_url) = connect::sqlite_file_url(url, backend) {
            let connection = connect::open_sqlite_connection(&file_url).await?;
            return Ok(Commits::Own {
                url: file_url.into(),
                connection: Arc::new(Mutex::new(OwnConnection::Kept(connection))),
            });
        }
        if backend == Backend::Postgres {
            return Ok(Commits::Lanes {
                url: url.into(),
                pool: pool.clone(),
                lanes: Arc::default(),
            });
        }
        Ok(Commits::Pool {
            pool: pool.clone(),
            failed,
        })
    }

    /// The pool a Postgres commit made here goes through: the calling commit thread's (opened now if it has
    /// none yet; its connections are opened when taken, on this thread), else the store's.
    fn lane(
        url: &str,
        pool: &AnyPool,
        lanes: &parking_lot::Mutex<HashMap<ThreadId, AnyPool>>,
    ) -> Result<AnyPool, StoreError> {
        if !on_a_commit_thread() {
            return Ok(pool.clone());
        }
        let mut lanes = lanes.lock();
        let thread = std::thread::current().id();
        if let Some(lane) = lanes.get(&thread) {
            return Ok(lane.clone());
        }
        if pool.is_closed() {
            return Err(StoreError::Database(sqlx::Error::PoolClosed));
        }
        let lane = connect::open_commit_lane(url)?;
        lanes.insert(thread, lane.clone());
        Ok(lane)
    }

    /// Runs `work` in one transaction and commits it if `work` succeeds; otherwise rolls it back. A SQLite
    /// file's connection is not used again after a transaction that failed or was cancelled (the future
    /// dropped): it is held outside the store while the transaction runs, and put back only when it committed.
    pub(crate) async fn in_transaction<T>(
        &self,
        work: impl AsyncFnOnce(&mut AnyConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match self {
            Commits::Pool { pool, failed } => failed.in_transaction(pool, work).await,
            Commits::Lanes { url, pool, lanes } => {
                let pool = Self::lane(url, pool, lanes)?;
                FailedConnections::Close.in_transaction(&pool, work).await
            }
            Commits::Own { url, connection } => {
                let mut own = connection.lock().await;
                let mut conn = match std::mem::replace(&mut *own, OwnConnection::None) {
                    OwnConnection::Kept(conn) => conn,
                    OwnConnection::None => connect::open_sqlite_connection(url).await?,
                    OwnConnection::Closed => {
                        *own = OwnConnection::Closed;
                        return Err(StoreError::Database(sqlx::Error::PoolClosed));
                    }
                };
                let outcome = transaction::run(&mut conn, work).await;
                // On failure it is dropped here, which ends its worker thread; the next commit opens another.
                if outcome.is_ok() {
                    *own = OwnConnection::Kept(conn);
                }
                outcome
            }
        }
    }

    /// Closes the pools, or the own connection; commits fail from then on.
    pub(crate) async fn close(&self) {
        match self {
            Commits::Pool { pool, .. } => pool.close().await,
            Commits::Lanes { pool, lanes, .. } => {
                // The store's pool first: no new lane opens once it is closed.
                pool.close().await;
                let lanes: Vec<AnyPool> = lanes.lock().drain().map(|(_, lane)| lane).collect();
                for lane in lanes {
                    lane.close().await;
                }
            }
            Commits::Own { connection, .. } => {
                let own = std::mem::replace(&mut *connection.lock().await, OwnConnection::Closed);
                if let OwnConnection::Kept(conn) = own {
                    if let Err(error) = conn.close().await {
                        tracing::debug!(%error, "closing the store's commit connection");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::{open_pool, settings_of};

    /// A SQLite file in a temporary directory (kept while the first is), its pool, and its commits.
    async fn a_sqlite_files_commits() -> (tempfile::TempDir, AnyPool, Commits) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("relay.db").display());
        let pool = open_pool(&url, Backend::Sqlite).await.unwrap();
        let commits = Commits::open(&url, Backend::Sqlite, &pool, FailedConnections::Close)
            .await
            .unwrap();
        (dir, pool, commits)
    }

    /// Rows of the temporary table `marker`, which only the connection that made it has.
    async fn marker_rows(conn: &mut AnyConnection) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM temp.marker")
            .fetch_one(&mut *conn)
            .await?)
    }

    /// A SQLite file's commits go through one connection of their own, kept from one commit to the next (a
    /// temporary table lives as long as its connection), with every connection's settings; after a failed
    /// transaction, through a new one.
    #[tokio::test]
    async fn a_sqlite_files_commits_have_one_connection_of_their_own_until_one_fails() {
        let (_dir, pool, commits) = a_sqlite_files_commits().await;
        assert!(matches!(commits, Commits::Own { .. }));
        let settings = commits
            .in_transaction(async |conn| {
                sqlx::query("CREATE TEMP TABLE marker (x INTEGER)")
                    .execute(&mut *conn)
                    .await?;
                Ok(settings_of(conn).await)
            })
            .await
            .unwrap();
        assert_eq!(settings, ("wal".into(), 2, 30_000));
        assert_eq!(
            commits.in_transaction(marker_rows).await.unwrap(),
            0,
            "the same connection"
        );

        let failed: Result<(), StoreError> = commits
            .in_transaction(async |_| Err(StoreError::Database(sqlx::Error::RowNotFound)))
            .await;
        assert!(failed.is_err());
        assert!(
            commits.in_transaction(marker_rows).await.is_err(),
            "after a failure, a new connection (without the temporary table)"
        );
        let settings = commits
            .in_transaction(async |conn| Ok(settings_of(conn).await))
            .await
            .unwrap();
        assert_eq!(settings, ("wal".into(), 2, 30_000), "with the same settings");
        commits.close().await;
        pool.close().await;
    }

    /// A commit cancelled mid-transaction (its future dropped) takes its connection with it, as a failed one
    /// does; once the store is closed, commits fail.
    #[tokio::test]
    async fn a_cancelled_commit_leaves_no_connection_behind_and_a_closed_store_commits_nothing() {
        let (_dir, pool, commits) = a_sqlite_files_commits().await;
        commits
            .in_transaction(async |conn| {
                sqlx::query("CREATE TEMP TABLE marker (x INTEGER)")
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
            .await
            .unwrap();
        let (started, began) = tokio::sync::oneshot::channel::<()>();
        let stuck = commits.in_transaction(async |_| {
            let _ = started.send(());
            std::future::pending::<Result<(), StoreError>>().await
        });
        tokio::select! {
            _ = stuck => unreachable!("it never ends"),
            _ = began => {} // mid-transaction: then `stuck` is dropped
        }
        assert!(
            commits.in_transaction(marker_rows).await.is_err(),
            "after a cancelled transaction, a new connection (without the temporary table)"
        );

        commits.close().await;
        assert!(matches!(
            commits.in_transaction(marker_rows).await,
            Err(StoreError::Database(sqlx::Error::PoolClosed))
        ));
        pool.close().await;
    }

    /// An in-memory database's commits go through its pool's one connection: the database itself.
    #[tokio::test]
    async fn an_in_memory_databases_commits_go_through_its_pool() {
        let memory = open_pool("sqlite::memory:", Backend::Sqlite).await.unwrap();
        let commits = Commits::open(
            "sqlite::memory:",
            Backend::Sqlite,
            &memory,
            FailedConnections::Keep,
        )
        .await
        .unwrap();
        assert!(matches!(
            commits,
            Commits::Pool {
                failed: FailedConnections::Keep,
                ..
            }
        ));
        commits
            .in_transaction(async |conn| {
                sqlx::query("CREATE TABLE t (x INTEGER)")
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
            .await
            .unwrap();
        let seen: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t")
            .fetch_one(&memory)
            .await
            .unwrap();
        assert_eq!(seen, 0);
        memory.close().await;
    }
}
