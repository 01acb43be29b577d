//! Opening the connection pool for a store URL: which backend it names, and the per-backend settings that
//! make the pool safe to use — SQLite gets its file (and directory) created, WAL journaling, `synchronous =
//! FULL` on every connection, and a single never-recycled connection when it lives in memory — and a SQLite
//! file's connection outside the pool, for its commits ([`crate::commits`]).

use std::path::Path;
use std::time::Duration;

use sqlx::any::AnyPoolOptions;
use sqlx::{AnyConnection, AnyPool, Connection, Executor};

use crate::{Backend, StoreError};

/// Connections to Postgres: enough for a shard's commits to overlap with reads (replay, listings).
const POSTGRES_CONNECTIONS: u32 = 10;
/// Connections of each commit thread's pool on Postgres ([`crate::commits`]): the hosts pinned to a thread
/// commit in parallel up to this many at a time.
const POSTGRES_COMMIT_LANE_CONNECTIONS: u32 = 2;
/// How long a commit thread's connection may stay unused before it is closed.
const COMMIT_LANE_IDLE: Duration = Duration::from_secs(60);
/// Connections to a SQLite file: SQLite has one writer at a time; a few readers can run beside it in WAL mode.
const SQLITE_CONNECTIONS: u32 = 4;
/// How long a SQLite statement waits for another connection's write lock before failing.
const BUSY_TIMEOUT: &str = "PRAGMA busy_timeout = 30000";
/// How long to wait for a free connection before failing the operation.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// Which backend `url` names.
pub(crate) fn backend_of(url: &str) -> Result<Backend, StoreError> {
    let scheme = url.split(':').next().unwrap_or_default();
    match scheme {
        "postgres" | "postgresql" => Ok(Backend::Postgres),
        "sqlite" => Ok(Backend::Sqlite),
        _ => Err(StoreError::UnsupportedUrl {
            scheme: scheme.to_owned(),
        }),
    }
}

/// Opens a pool for `url` on `backend`.
pub(crate) async fn open_pool(url: &str, backend: Backend) -> Result<AnyPool, StoreError> {
    sqlx::any::install_default_drivers();
    match backend {
        Backend::Postgres => Ok(AnyPoolOptions::new()
            .max_connections(POSTGRES_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect(url)
            .await?),
        Backend::Sqlite => open_sqlite(url).await,
    }
}

/// A pool for one commit thread's Postgres commits ([`crate::commits`]). No connection is opened now: each is
/// opened when a commit takes it, on the runtime of the thread that commits, and its socket is driven there.
pub(crate) fn open_commit_lane(url: &str) -> Result<AnyPool, StoreError> {
    sqlx::any::install_default_drivers();
    Ok(AnyPoolOptions::new()
        .max_connections(POSTGRES_COMMIT_LANE_CONNECTIONS)
        .min_connections(0)
        .idle_timeout(COMMIT_LANE_IDLE)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_lazy(&with_application_name(url, COMMIT_LANE_NAME))?)
}

/// What a commit thread's Postgres connections call themselves (`application_name`, in `pg_stat_activity`).
const COMMIT_LANE_NAME: &str = "ahp-relay-commits";

/// `url` (Postgres) with its `application_name` parameter set to `name` (added, or in place of one given).
fn with_application_name(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut parameters: Vec<&str> = query
        .split('&')
        .filter(|parameter| !parameter.is_empty() && !parameter.starts_with("application_name="))
        .collect();
    let named = format!("application_name={name}");
    parameters.push(&named);
    format!("{base}?{}", parameters.join("&"))
}

/// A SQLite file's URL as its connections open it (creating it if missing), or `None` for Postgres and an
/// in-memory database.
pub(crate) fn sqlite_file_url(url: &str, backend: Backend) -> Option<String> {
    match (backend, SqliteTarget::parse(url)) {
        (Backend::Sqlite, SqliteTarget::File { has_mode, .. }) => Some(file_url(url, has_mode)),
        _ => None,
    }
}

/// One connection to the SQLite file at `file_url` ([`sqlite_file_url`]), outside any pool, with the settings
/// every pooled connection gets.
pub(crate) async fn open_sqlite_connection(file_url: &str) -> Result<AnyConnection, StoreError> {
    let mut conn = AnyConnection::connect(file_url).await?;
    sqlite_settings(&mut conn).await?;
    Ok(conn)
}

/// Whether `url` names an in-memory SQLite database: its pool's one connection *is* the database, so it is
/// never closed ([`crate::transaction`]).
pub(crate) fn is_in_memory(url: &str, backend: Backend) -> bool {
    backend == Backend::Sqlite && matches!(SqliteTarget::parse(url), SqliteTarget::Memory)
}

/// The SQLite half of [`open_pool`].
async fn open_sqlite(url: &str) -> Result<AnyPool, StoreError> {
    let target = SqliteTarget::parse(url);
    let options = sqlite_options();
    let pool = match target {
        // Every connection to `:memory:` is a separate, empty database: keep exactly one, forever.
        SqliteTarget::Memory => {
            options
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .connect(url)
                .await?
        }
        SqliteTarget::File { path, has_mode } => {
            if let Some(dir) = Path::new(path).parent().filter(|dir| !dir.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                    path: dir.display().to_string(),
                    source,
                })?;
            }
            let pool = options
                .max_connections(SQLITE_CONNECTIONS)
                .connect(&file_url(url, has_mode))
                .await?;
            // WAL is a property of the file, set once; it lets readers run while a commit writes.
            pool.execute("PRAGMA journal_mode = WAL").await?;
            pool
        }
    };
    Ok(pool)
}

/// A SQLite pool's options: the settings every connection gets.
fn sqlite_options() -> AnyPoolOptions {
    AnyPoolOptions::new()
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .after_connect(|conn, _meta| Box::pin(sqlite_settings(conn)))
}

/// The settings of every connection to a SQLite file. Both are per connection. FULL makes every commit durable
/// through a power loss in WAL mode; the busy timeout (sqlx's default is 5 s) lets a write of another process
/// wait out a long compaction of the same file.
async fn sqlite_settings(conn: &mut AnyConnection) -> Result<(), sqlx::Error> {
    conn.execute("PRAGMA synchronous = FULL").await?;
    conn.execute(BUSY_TIMEOUT).await?;
    Ok(())
}

/// A SQLite file's URL, made to create the file if missing unless it already says how to open it.
fn file_url(url: &str, has_mode: bool) -> String {
    if has_mode {
        url.to_owned()
    } else if url.contains('?') {
        format!("{url}&mode=rwc")
    } else {
        format!("{url}?mode=rwc")
    }
}

/// Where a `sqlite:` URL points.
enum SqliteTarget<'u> {
    Memory,
    File {
        /// The file path as written in the URL.
        path: &'u str,
        /// Whether the URL already says how to open it (`mode=…`), which we then respect.
        has_mode: bool,
    },
}

impl<'u> SqliteTarget<'u> {
    fn parse(url: &'u str) -> Self {
        let rest = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .unwrap_or(url);
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let params = || query.split('&');
        if path == ":memory:" || params().any(|param| param == "mode=memory") {
            SqliteTarget::Memory
        } else {
            SqliteTarget::File {
                path,
                has_mode: params().any(|param| param.starts_with("mode=")),
            }
        }
    }
}

/// A connection's journal mode, `synchronous` level and busy timeout.
#[cfg(test)]
pub(crate) async fn settings_of(conn: &mut AnyConnection) -> (String, i64, i64) {
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    (mode, sync, busy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_lanes_url_names_its_connections_and_keeps_every_other_parameter() {
        assert_eq!(
            with_application_name("postgres://u@h/db", "x"),
            "postgres://u@h/db?application_name=x"
        );
        assert_eq!(
            with_application_name("postgres://u@h/db?sslmode=disable&application_name=old", "x"),
            "postgres://u@h/db?sslmode=disable&application_name=x"
        );
    }

    #[test]
    fn backends_are_told_apart_by_scheme() {
        assert_eq!(backend_of("postgres://u@h/db").ok(), Some(Backend::Postgres));
        assert_eq!(backend_of("postgresql://u@h/db").ok(), Some(Backend::Postgres));
        assert_eq!(backend_of("sqlite://data/relay.db").ok(), Some(Backend::Sqlite));
        assert_eq!(backend_of("sqlite::memory:").ok(), Some(Backend::Sqlite));
        assert!(matches!(
            backend_of("mysql://secret@h/db"),
            Err(StoreError::UnsupportedUrl { scheme }) if scheme == "mysql"
        ));
    }

    #[tokio::test]
    async fn sqlite_connections_use_wal_full_sync_and_a_long_busy_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("relay.db").display());
        let pool = open_pool(&url, Backend::Sqlite).await.unwrap();
        // Hold several connections at once so more than the first one is checked.
        let mut held = Vec::new();
        for _ in 0..SQLITE_CONNECTIONS {
            let mut conn = pool.acquire().await.unwrap();
            assert_eq!(settings_of(&mut conn).await, ("wal".into(), 2, 30_000));
            held.push(conn);
        }
        drop(held);
        pool.close().await;
    }

    #[test]
    fn sqlite_targets() {
        assert!(matches!(
            SqliteTarget::parse("sqlite::memory:"),
            SqliteTarget::Memory
        ));
        assert!(matches!(
            SqliteTarget::parse("sqlite://?mode=memory"),
            SqliteTarget::Memory
        ));
        assert!(matches!(
            SqliteTarget::parse("sqlite://dir/relay.db"),
            SqliteTarget::File {
                path: "dir/relay.db",
                has_mode: false
            }
        ));
        assert!(matches!(
            SqliteTarget::parse("sqlite:///abs/relay.db?mode=rw"),
            SqliteTarget::File {
                path: "/abs/relay.db",
                has_mode: true
            }
        ));
    }
}
