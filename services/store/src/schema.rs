//! The schema: the SQL migrations in `migrations/postgres/` and `migrations/sqlite/`, embedded in the binary
//! with `include_str!` and run through sqlx's migrator (its `_sqlx_migrations` table records what ran, so
//! running them again is a no-op, and an applied migration that was later edited is refused).
//!
//! Embedding by hand instead of with `sqlx::migrate!` keeps sqlx's `macros` feature — a proc-macro crate
//! that compiles both database drivers, bundled SQLite included, a second time for the host — out of the
//! build. Checksums are computed the same way, so a switch to `migrate!` later sees the same history.
//! Adding a migration: add the file to both folders and a line to both lists below (a test checks that every
//! file in the folders is listed).

use std::future::Future;
use std::pin::Pin;

use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::AnyPool;

use crate::{Backend, StoreError};

/// One migration file, embedded.
#[derive(Debug)]
struct EmbeddedMigration {
    version: i64,
    description: &'static str,
    sql: &'static str,
}

const POSTGRES: &[EmbeddedMigration] = &[
    EmbeddedMigration {
        version: 1,
        description: "store",
        sql: include_str!("../../../migrations/postgres/0001_store.sql"),
    },
    EmbeddedMigration {
        version: 2,
        description: "leases",
        sql: include_str!("../../../migrations/postgres/0002_leases.sql"),
    },
    EmbeddedMigration {
        version: 3,
        description: "lease owner index",
        sql: include_str!("../../../migrations/postgres/0003_lease_owner_index.sql"),
    },
    EmbeddedMigration {
        version: 4,
        description: "client bindings",
        sql: include_str!("../../../migrations/postgres/0004_client_bindings.sql"),
    },
    EmbeddedMigration {
        version: 5,
        description: "catalog modified",
        sql: include_str!("../../../migrations/postgres/0005_catalog_modified.sql"),
    },
    EmbeddedMigration {
        version: 6,
        description: "binding use",
        sql: include_str!("../../../migrations/postgres/0006_binding_use.sql"),
    },
    EmbeddedMigration {
        version: 7,
        description: "turn archive",
        sql: include_str!("../../../migrations/postgres/0007_turn_archive.sql"),
    },
    EmbeddedMigration {
        version: 8,
        description: "contents",
        sql: include_str!("../../../migrations/postgres/0008_contents.sql"),
    },
    EmbeddedMigration {
        version: 9,
        description: "binding use default",
        sql: include_str!("../../../migrations/postgres/0009_binding_use_default.sql"),
    },
];

const SQLITE: &[EmbeddedMigration] = &[
    EmbeddedMigration {
        version: 1,
        description: "store",
        sql: include_str!("../../../migrations/sqlite/0001_store.sql"),
    },
    EmbeddedMigration {
        version: 2,
        description: "leases",
        sql: include_str!("../../../migrations/sqlite/0002_leases.sql"),
    },
    EmbeddedMigration {
        version: 3,
        description: "lease owner index",
        sql: include_str!("../../../migrations/sqlite/0003_lease_owner_index.sql"),
    },
    EmbeddedMigration {
        version: 4,
        description: "client bindings",
        sql: include_str!("../../../migrations/sqlite/0004_client_bindings.sql"),
    },
    EmbeddedMigration {
        version: 5,
        description: "catalog modified",
        sql: include_str!("../../../migrations/sqlite/0005_catalog_modified.sql"),
    },
    EmbeddedMigration {
        version: 6,
        description: "binding use",
        sql: include_str!("../../../migrations/sqlite/0006_binding_use.sql"),
    },
    EmbeddedMigration {
        version: 7,
        description: "turn archive",
        sql: include_str!("../../../migrations/sqlite/0007_turn_archive.sql"),
    },
    EmbeddedMigration {
        version: 8,
        description: "contents",
        sql: include_str!("../../../migrations/sqlite/0008_contents.sql"),
    },
    EmbeddedMigration {
        version: 9,
        description: "binding use default",
        sql: include_str!("../../../migrations/sqlite/0009_binding_use_default.sql"),
    },
];

/// The embedded migrations of one backend, as a source sqlx's migrator can resolve.
#[derive(Debug)]
struct EmbeddedMigrations(&'static [EmbeddedMigration]);

impl<'s> MigrationSource<'s> for EmbeddedMigrations {
    fn resolve(self) -> Pin<Box<dyn Future<Output = Result<Vec<Migration>, BoxDynError>> + Send + 's>> {
        let migrations = self
            .0
            .iter()
            .map(|m| {
                Migration::new(
                    m.version,
                    m.description.into(),
                    MigrationType::Simple,
                    m.sql.into(),
                    false,
                )
            })
            .collect();
        Box::pin(std::future::ready(Ok(migrations)))
    }
}

/// Brings the schema of `pool` (a `backend` database) up to date. A database a newer release migrated further
/// is left as it is: during a rolling upgrade (or a rollback) the previous release starts on it, since every
/// migration only expands the schema (docs/operations.md).
pub(crate) async fn migrate(pool: &AnyPool, backend: Backend) -> Result<(), StoreError> {
    let embedded = match backend {
        Backend::Postgres => POSTGRES,
        Backend::Sqlite => SQLITE,
    };
    let mut migrator = Migrator::new(EmbeddedMigrations(embedded)).await?;
    migrator.set_ignore_missing(true);
    if backend == Backend::Postgres {
        let deadline = std::time::Instant::now() + MIGRATION_PATIENCE;
        loop {
            match migrate_postgres(pool, &migrator).await {
                Err(error) if waited_too_long(&error) && std::time::Instant::now() < deadline => {
                    tracing::warn!(
                        "a migration waited {MIGRATION_LOCK_TIMEOUT:?} for a lock and gave way; trying again"
                    );
                    tokio::time::sleep(MIGRATION_PAUSE).await;
                }
                ran => return ran.map_err(StoreError::from),
            }
        }
    }
    migrator.run(pool).await?;
    Ok(())
}

/// One run of the Postgres migrations, on a connection of its own whose lock waits end after
/// [`MIGRATION_LOCK_TIMEOUT`]: queued behind a long transaction, a migration's table lock would hold up every
/// writer that comes after it, so it gives way instead (its transaction rolls back) and is tried again after a
/// pause in which the writers go on. The same limit holds for the lock migrators take against each other.
async fn migrate_postgres(pool: &AnyPool, migrator: &Migrator) -> Result<(), sqlx::migrate::MigrateError> {
    let mut connection = pool.acquire().await?.detach();
    sqlx::query(&format!(
        "SET lock_timeout = '{}ms'",
        MIGRATION_LOCK_TIMEOUT.as_millis()
    ))
    .execute(&mut connection)
    .await?;
    let ran = migrator.run(&mut connection).await;
    let _ = sqlx::Connection::close(connection).await;
    ran
}

/// Whether `error` is Postgres giving up a lock wait (`lock_timeout`, SQLSTATE 55P03).
fn waited_too_long(error: &sqlx::migrate::MigrateError) -> bool {
    use sqlx::migrate::MigrateError;
    match error {
        MigrateError::Execute(error) | MigrateError::ExecuteMigration(error, _) => error
            .as_database_error()
            .and_then(|database| database.code())
            .is_some_and(|code| code == "55P03"),
        _ => false,
    }
}

/// How long a Postgres migration waits for a lock at a time before it gives way.
pub const MIGRATION_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long migrating keeps trying before it fails.
const MIGRATION_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// The pause between two tries, in which the writers it held up go on.
const MIGRATION_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Every `NNNN_description.sql` in the folder, as (version, description), sorted.
    fn files_in(folder: &str) -> Vec<(i64, String)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../migrations")
            .join(folder);
        let mut found: Vec<(i64, String)> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter_map(|name| {
                let stem = name.strip_suffix(".sql")?;
                let (version, description) = stem.split_once('_')?;
                Some((version.parse().unwrap(), description.replace('_', " ")))
            })
            .collect();
        found.sort();
        found
    }

    fn listed(embedded: &[EmbeddedMigration]) -> Vec<(i64, String)> {
        embedded
            .iter()
            .map(|m| (m.version, m.description.to_owned()))
            .collect()
    }

    #[test]
    fn every_migration_file_is_embedded() {
        assert_eq!(files_in("postgres"), listed(POSTGRES));
        assert_eq!(files_in("sqlite"), listed(SQLITE));
    }

    #[test]
    fn both_backends_have_the_same_versions() {
        let versions = |list: &[EmbeddedMigration]| list.iter().map(|m| m.version).collect::<Vec<_>>();
        assert_eq!(versions(POSTGRES), versions(SQLITE));
    }
}
