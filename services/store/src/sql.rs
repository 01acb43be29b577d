//! The few pieces every query module shares: a statement builder that numbers its placeholders `$1, $2, …`
//! (the one style both Postgres and sqlx's SQLite driver accept — sqlx's `QueryBuilder<Any>` writes `?`,
//! which Postgres rejects), the u64 ↔ BIGINT conversions, and the one spelling that differs by backend.

use sqlx::any::{AnyArguments, AnyRow};
use sqlx::{Any, AnyConnection, Arguments, Encode, Executor, Type};

use crate::{Backend, StoreError};

/// Rows per multi-row INSERT for narrow rows: 1,000 rows × 4 arguments stays far below both Postgres'
/// 65,535 and SQLite's 32,766 bound-parameter limits.
pub(crate) const ROWS_PER_INSERT: usize = 1_000;
/// Rows per multi-row INSERT for rows carrying whole channel states (kept smaller to bound statement size).
pub(crate) const WIDE_ROWS_PER_INSERT: usize = 200;
/// Values per `IN (…)` list.
pub(crate) const VALUES_PER_LIST: usize = 500;

/// SQL text with its arguments, built together so each `$n` matches the n-th argument.
pub(crate) struct Statement<'q> {
    sql: String,
    args: AnyArguments<'q>,
    count: usize,
}

impl<'q> Statement<'q> {
    /// Starts a statement with `sql`, which must not contain placeholders.
    pub(crate) fn new(sql: &str) -> Self {
        Statement {
            sql: sql.to_owned(),
            args: AnyArguments::default(),
            count: 0,
        }
    }

    /// Starts a statement whose text refers to the tenant as `$1` and the host as `$2` (as often as it likes:
    /// both backends let one numbered placeholder appear several times).
    pub(crate) fn scoped(sql: &str, tenant: &'q str, host: &'q str) -> Result<Self, StoreError> {
        let mut statement = Statement::new(sql);
        statement.arg(tenant)?;
        statement.arg(host)?;
        Ok(statement)
    }

    /// Appends SQL text.
    pub(crate) fn push(&mut self, sql: &str) -> &mut Self {
        self.sql.push_str(sql);
        self
    }

    /// Appends the placeholder of a new argument.
    pub(crate) fn bind<T>(&mut self, value: T) -> Result<&mut Self, StoreError>
    where
        T: 'q + Encode<'q, Any> + Type<Any>,
    {
        let number = self.arg(value)?;
        self.sql.push('$');
        self.sql.push_str(&number.to_string());
        Ok(self)
    }

    /// Appends `(…)` holding one placeholder per value.
    pub(crate) fn bind_list<T>(
        &mut self,
        values: impl IntoIterator<Item = T>,
    ) -> Result<&mut Self, StoreError>
    where
        T: 'q + Encode<'q, Any> + Type<Any>,
    {
        self.push("(");
        for (i, value) in values.into_iter().enumerate() {
            if i > 0 {
                self.push(", ");
            }
            self.bind(value)?;
        }
        self.push(")");
        Ok(self)
    }

    /// Adds an argument without writing its placeholder; returns its number.
    fn arg<T>(&mut self, value: T) -> Result<usize, StoreError>
    where
        T: 'q + Encode<'q, Any> + Type<Any>,
    {
        self.args.add(value).map_err(StoreError::Bind)?;
        self.count += 1;
        Ok(self.count)
    }

    /// Runs the statement; returns the number of rows it affected.
    pub(crate) async fn execute(self, conn: &mut AnyConnection) -> Result<u64, StoreError> {
        let Statement { sql, args, .. } = self;
        Ok(sqlx::query_with(&sql, args).execute(conn).await?.rows_affected())
    }

    /// Runs the statement and collects its rows.
    pub(crate) async fn fetch_all<'c, E>(self, executor: E) -> Result<Vec<AnyRow>, StoreError>
    where
        E: Executor<'c, Database = Any>,
    {
        let Statement { sql, args, .. } = self;
        Ok(sqlx::query_with(&sql, args).fetch_all(executor).await?)
    }
}

/// A u64 counter as the BIGINT the database stores.
pub(crate) fn to_db(value: u64, what: &'static str) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange {
        what,
        value: i128::from(value),
    })
}

/// A BIGINT read back as the u64 counter it stores.
pub(crate) fn from_db(value: i64, what: &'static str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::OutOfRange {
        what,
        value: i128::from(value),
    })
}

/// A row count or page size as a BIGINT argument (saturating: no page is that large).
pub(crate) fn limit_to_db(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// The two-argument maximum: `GREATEST(a, b)` on Postgres, the scalar `MAX(a, b)` on SQLite.
pub(crate) fn greatest(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "GREATEST",
        Backend::Sqlite => "MAX",
    }
}
