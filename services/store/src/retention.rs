//! Retention: removing old log rows that no reader needs any more, one host per transaction, and recording
//! in the host's `log_floor` how far the log is no longer complete.

use sqlx::AnyPool;

use crate::transaction::FailedConnections;
use crate::{bindings, hosts, log, Backend, StoreError};

/// Removes every host's log rows older than `older_than_ms` that a snapshot covers (or whose channel has no
/// snapshot any more) and raises each host's `log_floor` to the highest seq removed, and every clientId
/// binding not used since `older_than_ms`. Returns rows removed (log rows and bindings).
pub(crate) async fn compact(
    pool: &AnyPool,
    backend: Backend,
    failed: FailedConnections,
    older_than_ms: i64,
) -> Result<u64, StoreError> {
    let mut removed = 0;
    for (tenant, host) in log::hosts_with_rows_older_than(pool, older_than_ms).await? {
        removed += failed
            .in_transaction(pool, async |tx| {
                // Under the host's lock no commit can move a snapshot between the two statements below, so the
                // floor recorded is exactly the highest seq deleted.
                hosts::lock(tx, &tenant, &host).await?;
                let highest = log::highest_compactable(tx, &tenant, &host, older_than_ms).await?;
                let mut rows = 0;
                if highest > 0 {
                    rows = log::remove_compactable(tx, &tenant, &host, older_than_ms).await?;
                    hosts::raise_log_floor(tx, backend, &tenant, &host, highest).await?;
                }
                Ok(rows)
            })
            .await?;
    }
    removed += bindings::prune(pool, older_than_ms).await?;
    Ok(removed)
}
