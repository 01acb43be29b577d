//! The `catalog` table: the sessions a host lists in `listSessions`, most recently modified first (ties: newest
//! catalogue number first) — applying a batch's changes and reading pages. A page's cursor is the last entry's
//! (modified_at, catalog_no): sessions created or modified between two pages move ahead of the cursor, so
//! nothing after it shifts or repeats (a session modified while a client pages is announced to it by
//! `root/sessionSummaryChanged` instead).

use std::collections::HashMap;

use sqlx::{AnyConnection, AnyPool, Row};

use crate::sql::{from_db, limit_to_db, to_db, Statement, VALUES_PER_LIST, WIDE_ROWS_PER_INSERT};
use crate::{CatalogChange, CatalogCursor, CatalogEntry, StoreError};

/// The catalogue number following every number `changes` uses (1 if they use none).
pub(crate) fn next_number_after(changes: &[CatalogChange]) -> u64 {
    changes
        .iter()
        .filter_map(|change| match change {
            CatalogChange::Upsert { catalog_no, .. } => Some(catalog_no.saturating_add(1)),
            CatalogChange::Remove { .. } => None,
        })
        .max()
        .unwrap_or(1)
}

/// Applies `changes` as if one by one, in order. Each change replaces everything about its URI, so only the
/// last change of each URI matters: those are written as one multi-row upsert and one delete.
pub(crate) async fn apply(
    conn: &mut AnyConnection,
    tenant: &str,
    host: &str,
    changes: &[CatalogChange],
) -> Result<(), StoreError> {
    let mut upserts = Vec::new();
    let mut removes = Vec::new();
    for change in last_change_per_uri(changes) {
        match change {
            CatalogChange::Upsert {
                uri,
                catalog_no,
                created_at,
                modified_at,
                summary,
            } => upserts.push((
                uri.as_str(),
                *catalog_no,
                created_at.as_str(),
                modified_at.as_str(),
                summary.as_str(),
            )),
            CatalogChange::Remove { uri } => removes.push(uri.as_str()),
        }
    }
    for slice in removes.chunks(VALUES_PER_LIST) {
        let mut delete = Statement::scoped(
            "DELETE FROM catalog WHERE tenant = $1 AND host = $2 AND uri IN ",
            tenant,
            host,
        )?;
        delete.bind_list(slice.iter().copied())?;
        delete.execute(conn).await?;
    }
    for chunk in upserts.chunks(WIDE_ROWS_PER_INSERT) {
        let mut upsert = Statement::scoped(
            "INSERT INTO catalog (tenant, host, uri, catalog_no, created_at, modified_at, summary) VALUES ",
            tenant,
            host,
        )?;
        for (i, (uri, catalog_no, created_at, modified_at, summary)) in chunk.iter().enumerate() {
            upsert.push(if i == 0 { "($1, $2, " } else { ", ($1, $2, " });
            upsert.bind(*uri)?.push(", ");
            upsert.bind(to_db(*catalog_no, "catalog_no")?)?.push(", ");
            upsert.bind(*created_at)?.push(", ");
            upsert.bind(*modified_at)?.push(", ");
            upsert.bind(*summary)?.push(")");
        }
        upsert.push(
            " ON CONFLICT (tenant, host, uri) DO UPDATE SET \
             catalog_no = excluded.catalog_no, created_at = excluded.created_at, \
             modified_at = excluded.modified_at, summary = excluded.summary",
        );
        upsert.execute(conn).await?;
    }
    Ok(())
}

/// The last change of each URI, in the order the URIs first appear.
fn last_change_per_uri(changes: &[CatalogChange]) -> Vec<&CatalogChange> {
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(changes.len());
    let mut last: Vec<&CatalogChange> = Vec::with_capacity(changes.len());
    for change in changes {
        let uri = match change {
            CatalogChange::Upsert { uri, .. } | CatalogChange::Remove { uri } => uri.as_str(),
        };
        match index.get(uri) {
            Some(&at) => last[at] = change,
            None => {
                index.insert(uri, last.len());
                last.push(change);
            }
        }
    }
    last
}

/// Up to `limit` sessions after `after` (from the first if `None`), most recently modified first.
pub(crate) async fn page(
    pool: &AnyPool,
    tenant: &str,
    host: &str,
    after: Option<&CatalogCursor>,
    limit: usize,
) -> Result<Vec<CatalogEntry>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let mut select = Statement::scoped(
        "SELECT uri, catalog_no, created_at, modified_at, summary FROM catalog WHERE tenant = $1 AND host = $2",
        tenant,
        host,
    )?;
    if let Some(after) = after {
        // A number past the largest the store holds compares as the largest.
        let number = i64::try_from(after.catalog_no).unwrap_or(i64::MAX);
        select
            .push(" AND (modified_at < ")
            .bind(after.modified_at.clone())?
            .push(" OR (modified_at = ")
            .bind(after.modified_at.clone())?
            .push(" AND catalog_no < ")
            .bind(number)?
            .push("))");
    }
    select
        .push(" ORDER BY modified_at DESC, catalog_no DESC LIMIT ")
        .bind(limit_to_db(limit))?;
    let rows = select.fetch_all(pool).await?;
    rows.iter()
        .map(|row| {
            Ok(CatalogEntry {
                uri: row.try_get("uri")?,
                catalog_no: from_db(row.try_get("catalog_no")?, "catalog_no")?,
                created_at: row.try_get("created_at")?,
                modified_at: row.try_get("modified_at")?,
                summary: row.try_get("summary")?,
            })
        })
        .collect()
}

/// How many sessions the host's catalogue lists (every session not disposed).
pub(crate) async fn count(pool: &AnyPool, tenant: &str, host: &str) -> Result<u64, StoreError> {
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM catalog WHERE tenant = $1 AND host = $2")
        .bind(tenant)
        .bind(host)
        .fetch_one(pool)
        .await?;
    Ok(u64::try_from(count).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upsert(uri: &str, catalog_no: u64) -> CatalogChange {
        CatalogChange::Upsert {
            uri: uri.into(),
            catalog_no,
            created_at: "2025-01-01T00:00:00Z".into(),
            modified_at: "2025-01-01T00:00:00Z".into(),
            summary: "{}".into(),
        }
    }

    fn remove(uri: &str) -> CatalogChange {
        CatalogChange::Remove { uri: uri.into() }
    }

    #[test]
    fn only_the_last_change_of_a_uri_counts() {
        let changes = [
            upsert("a", 1),
            upsert("b", 2),
            remove("a"),
            upsert("b", 3),
            remove("c"),
        ];
        assert_eq!(
            last_change_per_uri(&changes),
            [&changes[2], &changes[3], &changes[4]]
        );
    }

    #[test]
    fn next_number_follows_the_highest_upsert() {
        assert_eq!(next_number_after(&[]), 1);
        assert_eq!(next_number_after(&[remove("a")]), 1);
        assert_eq!(
            next_number_after(&[upsert("a", 7), upsert("b", 3), remove("a")]),
            8
        );
    }
}
