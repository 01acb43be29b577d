//! `StoreError`: every way a store operation can fail, typed at the edge of the crate so callers can tell a
//! bad configuration from an unreachable database from a value the schema cannot hold.

use sqlx::error::BoxDynError;

/// An error from the durable store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL names neither Postgres (`postgres://…`) nor SQLite (`sqlite://PATH`, `sqlite::memory:`).
    #[error("unsupported store URL scheme {scheme:?}: expected postgres://… or sqlite://PATH")]
    UnsupportedUrl {
        /// The part of the URL before the first `:` (never the credentials).
        scheme: String,
    },
    /// The directory that should hold the SQLite file could not be created.
    #[error("cannot create the directory {path} for the SQLite store: {source}")]
    CreateDir {
        /// The directory.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The database refused or failed a statement, or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Running the embedded migrations failed (e.g. an applied migration was edited afterwards).
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A value could not be encoded as a statement argument.
    #[error("cannot bind a statement argument: {0}")]
    Bind(#[source] BoxDynError),
    /// A counter does not fit the signed 64-bit integers the database stores (u64 above i64::MAX going in,
    /// or a negative number coming out).
    #[error("{what} {value} is outside the range the store can hold (0..=i64::MAX)")]
    OutOfRange {
        /// Which value (`"seq"`, `"catalog_no"`, …).
        what: &'static str,
        /// The offending value, widened so both directions fit.
        value: i128,
    },
    /// A fenced commit was refused because its writer no longer owns the host: the host's lease is at
    /// another epoch, or at the same epoch but released or held by someone else. Nothing was written.
    #[error(
        "fenced: the commit carries lease epoch {expected} but the host's lease is at epoch {found}, \
         held by {holder:?}"
    )]
    Fenced {
        /// The epoch the writer committed under.
        expected: u64,
        /// The host's current lease epoch (0 if the host was never leased).
        found: u64,
        /// Who holds the lease now (`None`: nobody — released, or never leased).
        holder: Option<String>,
    },
}

impl StoreError {
    /// Whether writing the same thing again can never succeed: the database refused what it was given (a
    /// value too big for a field, a broken constraint, bad data), as opposed to failing to take it (the
    /// database unreachable, restarting, timed out, a lost connection) — those are worth retrying.
    pub fn is_permanent(&self) -> bool {
        match self {
            StoreError::Bind(_) | StoreError::OutOfRange { .. } => true,
            StoreError::Database(sqlx::Error::Database(error)) => {
                let code = error.code().unwrap_or_default();
                // Postgres: class 22 (data exception, e.g. 22001 string too long, 22021 bad encoding), class
                // 23 (integrity constraint), 54000 (program limit exceeded: a row or value too big). SQLite:
                // SQLITE_TOOBIG (18), SQLITE_CONSTRAINT (19 and its extended codes), SQLITE_MISMATCH (20).
                code.starts_with("22")
                    || code.starts_with("23")
                    || code == "54000"
                    || matches!(code.as_ref(), "18" | "19" | "20")
                    || (code.len() > 2 && code.parse::<u32>().is_ok_and(|c| c & 0xff == 19))
            }
            StoreError::Database(sqlx::Error::Encode(_) | sqlx::Error::TypeNotFound { .. }) => true,
            _ => false,
        }
    }
}
