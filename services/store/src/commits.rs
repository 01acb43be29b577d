//! Where a store's commits are written. For a SQLite file, one connection of the store's own, kept open outside
//! any pool: SQLite has one writer at a time anyway; a connection that alone writes keeps its page cache between
//! commits (commits taken by turns from the shared pool read 13 pages each and touched three connections' worker
//! threads, `perf trace`, 1 shard at 50 actions/s); and outside a pool a commit is only its own statements. sqlx
//! pings a pooled connection when it is taken (by default) and always when it is given back, each a round trip
//! to the connection's worker thread, as every statement is. The connection has the pool's settings; it is
//! dropped when a transaction on it fails (see [`crate::transaction`] for why) and opened again by the next
//! commit. On Postgres, which writes hosts in parallel, and for an in-memory SQLite database (its pool's one
//! connection is the database), commits go through the store's pool.

use std::sync::Arc;

use sqlx::{AnyConnection, AnyPool, Connection};
use tokio::sync::Mutex;

use crate::connect;
use crate::transaction::FailedConnections;
use crate::{Backend, StoreError};

/// Where commits are written. Cheap to clone: clones share the pool or the connection.
#[derive(Debug, Clone)]
pub(crate) enum Commits {
    /// Postgres, or an in-memory SQLite database: the store's pool, and what becomes of a connection of it
    /// whose transaction failed.
    Pool {
        pool: AnyPool,
        failed: FailedConnections,
    },
    /// A SQLite file (`url`, as opened): its own connection, `None` from a failed transaction until the next
    /// commit opens it again.
    Own {
        url: Arc<str>,
        connection: Arc<Mutex<Option<AnyConnection>>>,
    },
}

impl Commits {
    /// Where the commits of the store at `url` go, beside `pool` (what [`connect::open_pool`] opened for it).
    /// A SQLite file's own connection is opened now.
    pub(crate) async fn open(url: &str, backend: Backend, pool: &AnyPool) -> Result<Self, StoreError> {
        if let Some(file_url) = connect::sqlite_file_url(url, backend) {
            let connection = connect::open_sqlite_connection(&file_url).await?;
            return Ok(Commits::Own {
                url: file_url.into(),
                connection: Arc::new(Mutex::new(Some(connection))),
            });
        }
        let failed = if connect::is_in_memory(url, backend) {
            FailedConnections::Keep
        } else {
            FailedConnections::Close
        };
        Ok(Commits::Pool {
            pool: pool.clone(),
            failed,
        })
    }

    /// Runs `work` in one transaction and commits it if `work` succeeds; otherwise rolls it back, and the
    /// connection it ran on is not used again.
    pub(crate) async fn in_transaction<T>(
        &self,
        work: impl AsyncFnOnce(&mut AnyConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match self {
            Commits::Pool { pool, failed } => failed.in_transaction(pool, work).await,
            Commits::Own { url, connection } => {
                let mut own = connection.lock().await;
                let conn = match &mut *own {
                    Some(conn) => conn,
                    none => none.insert(connect::open_sqlite_connection(url).await?),
                };
                let outcome = async {
                    let mut tx = conn.begin().await?;
                    let value = work(&mut tx).await?;
                    tx.commit().await?;
                    Ok(value)
                }
                .await;
                if outcome.is_err() {
                    // Dropped, which ends its worker thread; the next commit opens another.
                    *own = None;
                }
                outcome
            }
        }
    }

    /// Closes the pool, or the own connection.
    pub(crate) async fn close(&self) {
        match self {
            Commits::Pool { pool, .. } => pool.close().await,
            Commits::Own { connection, .. } => {
                if let Some(conn) = connection.lock().await.take() {
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
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("relay.db").display());
        let pool = open_pool(&url, Backend::Sqlite).await.unwrap();
        let commits = Commits::open(&url, Backend::Sqlite, &pool).await.unwrap();
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

    /// An in-memory database's commits go through its pool's one connection: the database itself.
    #[tokio::test]
    async fn an_in_memory_databases_commits_go_through_its_pool() {
        let memory = open_pool("sqlite::memory:", Backend::Sqlite).await.unwrap();
        let commits = Commits::open("sqlite::memory:", Backend::Sqlite, &memory)
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
    }
}
