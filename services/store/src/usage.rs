//! How much a tenant keeps in the store: the bytes of its log rows, snapshots, archived turns and contents (the text, which is
//! nearly all of a row) and of its client bindings (host, clientId and subject: a client can make many).
//! Read by the shards' storage quota; a scan of the tenant's rows, so it is run periodically, not per write.

use sqlx::AnyPool;

use crate::{Backend, StoreError};

/// The bytes of `tenant`'s log rows, snapshots, archived turns and client bindings.
pub(crate) async fn stored_bytes(pool: &AnyPool, backend: Backend, tenant: &str) -> Result<u64, StoreError> {
    let sql = match backend {
        Backend::Postgres => {
            "SELECT CAST(COALESCE((SELECT SUM(OCTET_LENGTH(envelope)) FROM log WHERE tenant = $1), 0)
                 + COALESCE((SELECT SUM(OCTET_LENGTH(state)) FROM snapshots WHERE tenant = $1), 0)
                 + COALESCE((SELECT SUM(OCTET_LENGTH(turn)) FROM turn_archive WHERE tenant = $1), 0)
                 + COALESCE((SELECT SUM(OCTET_LENGTH(data)) FROM contents WHERE tenant = $1), 0)
                 + COALESCE((SELECT SUM(OCTET_LENGTH(host) + OCTET_LENGTH(client_id) + OCTET_LENGTH(subject))
                             FROM client_bindings WHERE tenant = $1), 0) AS BIGINT)"
        }
        Backend::Sqlite => {
            "SELECT COALESCE((SELECT SUM(LENGTH(CAST(envelope AS BLOB))) FROM log WHERE tenant = $1), 0)
                 + COALESCE((SELECT SUM(LENGTH(CAST(state AS BLOB))) FROM snapshots WHERE tenant = $1), 0)
                 + COALESCE((SELECT SUM(LENGTH(CAST(turn AS BLOB))) FROM turn_archive WHERE tenant = $1), 0)
                 + COALESCE((SELECT SUM(LENGTH(CAST(data AS BLOB))) FROM contents WHERE tenant = $1), 0)
                 + COALESCE((SELECT SUM(LENGTH(CAST(host AS BLOB)) + LENGTH(CAST(client_id AS BLOB))
                                        + LENGTH(CAST(subject AS BLOB)))
                             FROM client_bindings WHERE tenant = $1), 0)"
        }
    };
    let bytes: i64 = sqlx::query_scalar(sql).bind(tenant).fetch_one(pool).await?;
    Ok(u64::try_from(bytes).unwrap_or(0))
}
