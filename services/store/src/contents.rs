//! The `contents` table: content an agent produced that the state tree names by reference (`ahp-content:/<id>`)
//! — file edits' sides, large tool outputs, images — written with the batch whose action names it, read by
//! `resourceRead`, and deleted with the session that owns it.

use sqlx::{AnyConnection, AnyPool, Row};

use crate::sql::{Statement, VALUES_PER_LIST, WIDE_ROWS_PER_INSERT};
use crate::{StoreError, StoredContent};

/// Stores `contents` (an id stored before keeps its first content: ids are never reused).
pub(crate) async fn store(
    conn: &mut AnyConnection,
    tenant: &str,
    host: &str,
    contents: &[StoredContent],
) -> Result<(), StoreError> {
    for chunk in contents.chunks(WIDE_ROWS_PER_INSERT) {
        let mut insert = Statement::scoped(
            "INSERT INTO contents (tenant, host, id, owner, content_type, data) VALUES ",
            tenant,
            host,
        )?;
        for (i, content) in chunk.iter().enumerate() {
            insert.push(if i == 0 { "($1, $2, " } else { ", ($1, $2, " });
            insert.bind(content.id.as_str())?.push(", ");
            insert.bind(content.owner.as_str())?.push(", ");
            insert.bind(content.content_type.as_str())?.push(", ");
            insert.bind(content.data.as_str())?.push(")");
        }
        insert.push(" ON CONFLICT (tenant, host, id) DO NOTHING");
        insert.execute(conn).await?;
    }
    Ok(())
}

/// Deletes every content owned by one of `owners` (sessions; other names match nothing).
pub(crate) async fn remove(
    conn: &mut AnyConnection,
    tenant: &str,
    host: &str,
    owners: &[String],
) -> Result<(), StoreError> {
    for slice in owners.chunks(VALUES_PER_LIST) {
        let mut delete = Statement::scoped(
            "DELETE FROM contents WHERE tenant = $1 AND host = $2 AND owner IN ",
            tenant,
            host,
        )?;
        delete.bind_list(slice.iter().map(String::as_str))?;
        delete.execute(conn).await?;
    }
    Ok(())
}

/// A content's type and data (base64), if it is stored.
pub(crate) async fn load(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    id: &str,
) -> Result<Option<(String, String)>, StoreError> {
    let row =
        sqlx::query("SELECT content_type, data FROM contents WHERE tenant = $1 AND host = $2 AND id = $3")
            .bind(tenant)
            .bind(host)
            .bind(id)
            .fetch_optional(pool)
            .await?;
    Ok(match row {
        Some(row) => Some((row.try_get("content_type")?, row.try_get("data")?)),
        None => None,
    })
}
