//! The `client_bindings` table: which user (token subject) each AHP clientId of a host belongs to — the first
//! subject that used it, kept across restarts so nobody else can claim it after one.

use sqlx::{AnyConnection, AnyPool};

use crate::sql::{Statement, ROWS_PER_INSERT};
use crate::{ClientBinding, StoreError};

/// Records `bindings` that are not recorded yet; an existing binding of a clientId is never changed.
pub(crate) async fn store(
    conn: &mut AnyConnection,
    tenant: &str,
    host: &str,
    bindings: &[ClientBinding],
) -> Result<(), StoreError> {
    for chunk in bindings.chunks(ROWS_PER_INSERT) {
        let mut insert = Statement::scoped(
            "INSERT INTO client_bindings (tenant, host, client_id, subject) VALUES ",
            tenant,
            host,
        )?;
        for (i, binding) in chunk.iter().enumerate() {
            insert.push(if i == 0 { "($1, $2, " } else { ", ($1, $2, " });
            insert.bind(binding.client_id.as_str())?.push(", ");
            insert.bind(binding.subject.as_str())?.push(")");
        }
        insert.push(" ON CONFLICT (tenant, host, client_id) DO NOTHING");
        insert.execute(conn).await?;
    }
    Ok(())
}

/// The subject `client_id` is bound to on the host, if any.
pub(crate) async fn subject_of(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    client_id: &str,
) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT subject FROM client_bindings WHERE tenant = $1 AND host = $2 AND client_id = $3",
    )
    .bind(tenant)
    .bind(host)
    .bind(client_id)
    .fetch_optional(pool)
    .await?)
}
