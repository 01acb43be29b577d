//! `listSessions`: the session catalogue, read from the store, most recently modified first (AHP's SHOULD).
//!
//! The cursor is the last listed session's (modifiedAt, catalogue number): a page lists what sorts after it,
//! so sessions created or modified while a client pages move ahead of the cursor and never shift later pages
//! (no duplicates; a session modified meanwhile is announced by `root/sessionSummaryChanged`).
//!
//! Search: `_meta["ahpRelay/titleContains"]` (AHP lets hosts read namespaced `_meta` keys; others ignore it)
//! lists only sessions whose title contains the text, ignoring case. The catalogue is scanned in batches from
//! the cursor, at most [`SEARCH_SCAN_BUDGET`] entries a request: a page may then hold fewer items than asked,
//! with a cursor to scan on from.

use ahp_types::commands::{ListSessionsParams, ListSessionsResult};
use ahp_types::state::SessionSummary;
use relay_core::link::CommandReply;
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::ConnectionId;
use relay_store::CatalogCursor;

use crate::host::Host;
use crate::reply::{answer, reply};

/// The `listSessions` `_meta` key that filters by title.
pub const TITLE_CONTAINS: &str = "ahpRelay/titleContains";
/// The `listSessions` `_meta` key that filters by what was said: the title, or any turn's text.
pub const TEXT_CONTAINS: &str = "ahpRelay/textContains";

/// Most sessions one text search reads the turns of (beyond the title) before it answers with a cursor…
const TEXT_SCAN_BUDGET: usize = 100;

/// …and most bytes it reads from the store for them (chats' snapshots and logs; a session of large chats
/// counts for what it is, not as one).
const TEXT_SCAN_BYTES: usize = 32 * 1024 * 1024;

/// Entries a search reads from the store at a time.
const SEARCH_SCAN_BATCH: usize = 200;

/// Most entries one search request scans before it answers with what it found and a cursor.
const SEARCH_SCAN_BUDGET: usize = 5_000;

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
        let search = |key: &str| match params.meta.as_ref().and_then(|meta| meta.get(key)) {
            None => Ok(None),
            Some(serde_json::Value::String(text)) => {
                Ok(Some(text.to_lowercase()).filter(|text| !text.is_empty()))
            }
            Some(_) => Err(RpcError::invalid_params(format!("_meta.{key} must be a string"))),
        };
        let (by_title, by_text) = (search(TITLE_CONTAINS)?, search(TEXT_CONTAINS)?);
        // A text search finds titles too.
        let filter = by_text.clone().or(by_title);
        // Everything created before this request is in the catalogue once it is committed.
        self.wait_committed(barrier).await;
        let mut items = Vec::with_capacity(limit);
        let mut after = after;
        let mut scanned = 0;
        let mut read_turns_of = 0;
        let mut read_bytes = 0;
        let next_cursor = loop {
            let want = if filter.is_some() {
                SEARCH_SCAN_BATCH
            } else {
                limit + 1
            };
            let rows = self
                .store
                .list_sessions(&self.key.tenant, &self.key.host, after.as_ref(), want)
                .await
                .map_err(|error| {
                    tracing::error!(host = %self.key, %error, "listing sessions failed");
                    RpcError::internal("the store is unavailable; retry")
                })?;
            let full = rows.len() == want;
            let mut page_full = false;
            let mut turns_budget_spent = false;
            for row in rows {
                if items.len() == limit {
                    // Another entry follows the page.
                    page_full = true;
                    break;
                }
                if by_text.is_some() && (read_turns_of >= TEXT_SCAN_BUDGET || read_bytes >= TEXT_SCAN_BYTES) {
                    // Reading turns is the costly part: the next page goes on from here.
                    turns_budget_spent = true;
                    break;
                }
                scanned += 1;
                after = Some(row.cursor());
                match serde_json::from_str::<SessionSummary>(&row.summary) {
                    Ok(summary) if title_matches(&summary, filter.as_deref()) => items.push(summary),
                    Ok(summary) => {
                        if let Some(needle) = by_text.as_deref() {
                            read_turns_of += 1;
                            let (said, bytes) = self.session_says(&row.uri, needle).await.map_err(|error| {
                                tracing::error!(host = %self.key, %error, "searching a session's turns failed");
                                RpcError::internal("the store is unavailable; retry")
                            })?;
                            read_bytes += bytes;
                            if said {
                                items.push(summary);
                            }
                        }
                    }
                    Err(error) => tracing::error!(uri = %row.uri, %error, "unreadable catalogue entry"),
                }
            }
            if page_full || turns_budget_spent || (full && scanned >= SEARCH_SCAN_BUDGET) {
                break after.as_ref().map(encode_cursor);
            }
            if !full {
                break None;
            }
        };
        reply(message.id, &ListSessionsResult { next_cursor, items })
    }
}

/// Whether `summary` passes the search (`filter` is lowercase).
fn title_matches(summary: &SessionSummary, filter: Option<&str>) -> bool {
    filter.is_none_or(|text| summary.title.to_lowercase().contains(text))
}
