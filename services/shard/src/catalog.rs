//! `listSessions`: the session catalogue, read from the store, newest first.
//!
//! The cursor is a catalogue number: a page lists sessions numbered below it, so sessions created while a
//! client pages never shift later pages (no duplicates, no omissions).

use ahp_types::commands::{ListSessionsParams, ListSessionsResult};
use ahp_types::state::SessionSummary;
use relay_core::link::CommandReply;
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::ConnectionId;

use crate::commands::{answer, reply};
use crate::host::Host;

pub fn encode_cursor(catalog_no: u64) -> String {
    format!("s{catalog_no}")
}

pub fn decode_cursor(cursor: &str) -> Option<u64> {
    cursor.strip_prefix('s')?.parse().ok()
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
        let before = match params.cursor.as_deref() {
            None => None,
            Some(c) => Some(decode_cursor(c).ok_or_else(|| RpcError::invalid_params("unknown cursor"))?),
        };
        // Everything created before this request is in the catalogue once it is committed.
        self.wait_committed(barrier).await;
        let rows = self
            .store
            .list_sessions(&self.key.tenant, &self.key.host, before, limit + 1)
            .await
            .map_err(|error| {
                tracing::error!(host = %self.key, %error, "listing sessions failed");
                RpcError::internal("the store is unavailable; retry")
            })?;
        let more = rows.len() > limit;
        let mut items = Vec::with_capacity(limit);
        let mut last_no = None;
        for row in rows.into_iter().take(limit) {
            last_no = Some(row.catalog_no);
            match serde_json::from_str::<SessionSummary>(&row.summary) {
                Ok(summary) => items.push(summary),
                Err(error) => tracing::error!(uri = %row.uri, %error, "unreadable catalogue entry"),
            }
        }
        let next_cursor = if more { last_no.map(encode_cursor) } else { None };
        reply(message.id, &ListSessionsResult { next_cursor, items })
    }
}
