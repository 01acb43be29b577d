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
    /// Whether the store had no room to write (SQLite `SQLITE_FULL`, Postgres `53100 disk_full`, or the OS's
    /// `ENOSPC`): not transient — a retry fails the same way until an operator frees space.
    pub fn is_storage_full(&self) -> bool {
        match self {
            StoreError::Database(sqlx::Error::Database(error)) => {
                let code = error.code().unwrap_or_default();
                code == "53100"
                    || code == "13"
                    || (code.len() > 2 && code.parse::<u32>().is_ok_and(|c| c & 0xff == 13))
            }
            StoreError::Database(sqlx::Error::Io(error)) => error.raw_os_error() == Some(28),
            _ => false,
        }
    }

    /// Whether writing the same thing again can never succeed: the database refused what it was given (a
    /// value too big for a field, a broken constraint, bad data) or has no room for it ([`Self::is_storage_full`]:
    /// the batch is refused, its senders told, and later batches succeed once space returns), as opposed to
    /// failing to take it (the database unreachable, restarting, timed out, a lost connection) — those are worth
    /// retrying.
    pub fn is_permanent(&self) -> bool {
        if self.is_storage_full() {
            return true;
        }
        match self {
            StoreError::Bind(_) | StoreError::OutOfRange { .. } => true,
            StoreError::Database(sqlx::Error::Database(error)) => {
                let code = error.code().unwrap_or_default();
                // Postgres: class 22 (data exception, e.g. 22001 string too long, 22021 bad encoding), class
                // 23 (integrity constraint), 54000 (program limit exceeded: a row or value too big), and XX000
                // for a value too big to allocate. SQLite:
                // SQLITE_TOOBIG (18), SQLITE_CONSTRAINT (19 and its extended codes), SQLITE_MISMATCH (20).
                // Postgres XX000 (internal error) is permanent when it says a value is too big to allocate
                // ("invalid memory alloc request size …", over the 1 GB a value may hold); other XX000 errors
                // may pass.
                code.starts_with("22")
                    || code.starts_with("23")
                    || code == "54000"
                    || (code == "XX000" && oversize(error.message()))
                    || matches!(code.as_ref(), "18" | "19" | "20")
                    || (code.len() > 2 && code.parse::<u32>().is_ok_and(|c| c & 0xff == 19))
            }
            StoreError::Database(sqlx::Error::Encode(_) | sqlx::Error::TypeNotFound { .. }) => true,
            _ => false,
        }
    }
}

/// Whether a Postgres internal error's message says a value was too big to hold.
fn oversize(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    [
        "invalid memory alloc request size",
        "exceeds the maximum",
        "too large",
        "too big",
    ]
    .iter()
    .any(|said| message.contains(said))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    /// A database's error as sqlx reports it: a code and a message.
    #[derive(Debug)]
    struct Refusal {
        code: &'static str,
        message: &'static str,
    }

    impl std::fmt::Display for Refusal {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.message)
        }
    }

    impl std::error::Error for Refusal {}

    impl sqlx::error::DatabaseError for Refusal {
        fn message(&self) -> &str {
            self.message
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.code))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn error(code: &'static str, message: &'static str) -> StoreError {
        StoreError::Database(sqlx::Error::Database(Box::new(Refusal { code, message })))
    }

    #[test]
    fn a_value_the_database_cannot_hold_is_permanent_and_an_outage_is_not() {
        assert!(error("XX000", "invalid memory alloc request size 1073741824").is_permanent());
        assert!(error("54000", "row is too big").is_permanent());
        assert!(error("22001", "value too long").is_permanent());
        assert!(
            error("1811", "refused by a trigger").is_permanent(),
            "SQLITE_CONSTRAINT_TRIGGER"
        );
        assert!(
            error("18", "string or blob too big").is_permanent(),
            "SQLITE_TOOBIG"
        );
        assert!(
            !error("XX000", "could not read block 0").is_permanent(),
            "another internal error may pass"
        );
        assert!(!error("57P01", "terminating connection due to administrator command").is_permanent());
        assert!(!error("40001", "could not serialize access").is_permanent());
        assert!(!error("5", "database is locked").is_permanent(), "SQLITE_BUSY");
    }
}
