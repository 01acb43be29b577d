//! `listSessions`: the session catalogue, read from the store, most recently modified first (AHP's SHOULD).
//!
//! The cursor is the last listed session's (modifiedAt, catalogue number): a page lists what sorts after it,
//! so sessions created or modified while a client pages move ahead of the cursor and never shift later pages
//! (no duplicates; a session modified meanwhile is announced by `root/sessionSummaryChanged`).

use ahp_types::commands::{ListSessionsParams, ListSessionsResult};
use ahp_types::state::SessionSummary;
use relay_core::link::CommandReply;
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::ConnectionId;
use relay_store::CatalogCursor;

use crate::commands::{answer, reply};
use crate::host::Host;

pub fn encode_cursor(at: &CatalogCursor) -> String {
    format!("{}@{}", at.catalog_no, at.modified_at)
}

pub fn decode_cursor(cursor: &str) -> Option<CatalogCursor> {
    let (number, modified_at) = cursor.split_once('@')?;
    Some(CatalogCursor {
        modified_at: modified_at.to_string(),
        catalog_no: number.parse().ok()?,
    })
}

impl Host {
    pub(crate) async fn list_sessions(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> CommandReply {
        answer(message.id, self.list_sessions_result(connection, message).await)
    }

    async fn list_sessions_result(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> Result<CommandReply, RpcError> {
        let (page, barrier) = {
            let core = self.core.lock();
            core.client_id(connection)?;
            (core.limits.list_sessions_page, core.seq.barrier())
        };
        let params: ListSessionsParams = message.parse_params()?;
        let limit = match params.limit {
            Some(n) if n < 1 => return Err(RpcError::invalid_params("limit must be at least 1")),
            Some(n) => (n as usize).min(page),
            None => page,
        };
        let after = match params.cursor.as_deref() {
            None => None,
            Some(c) => Some(decode_cursor(c).ok_or_else(|| RpcError::invalid_params("unknown cursor"))?),
        };
        // Everything created before this request is in the catalogue once it is committed.
        self.wait_committed(barrier).await;
        let rows = self
            .store
            .list_sessions(&self.key.tenant, &self.key.host, after.as_ref(), limit + 1)
            .await
            .map_err(|error| {
                tracing::error!(host = %self.key, %error, "listing sessions failed");
                RpcError::internal("the store is unavailable; retry")
            })?;
        let more = rows.len() > limit;
        let mut items = Vec::with_capacity(limit);
        let mut last = None;
        for row in rows.into_iter().take(limit) {
            last = Some(row.cursor());
            match serde_json::from_str::<SessionSummary>(&row.summary) {
                Ok(summary) => items.push(summary),
                Err(error) => tracing::error!(uri = %row.uri, %error, "unreadable catalogue entry"),
            }
        }
        let next_cursor = if more {
            last.as_ref().map(encode_cursor)
        } else {
            None
        };
        reply(message.id, &ListSessionsResult { next_cursor, items })
    }
}
