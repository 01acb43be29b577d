//! Chat history: the newest turns in memory, older ones in the store's turn archive, paged with `fetchTurns`.
//!
//! When a chat is restored with more than `retained_turns` turns, the older ones move to an archive row beside
//! the chat's snapshot and the chat's `turnsNextCursor` points at them, so a long chat's snapshot stays small.
//! Cursors are absolute turn indexes (`turns:<end>` = the turns before `end`); a page is sent to the asking
//! connection alone as `chat/turnsLoaded`, dispatched before the `fetchTurns` response (digest §6).

use ahp_types::actions::{ChatTurnsLoadedAction, StateAction};
use ahp_types::commands::FetchTurnsParams;
use ahp_types::state::Turn;
use relay_core::link::CommandReply;
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::ConnectionId;

use crate::commands::{answer, not_found, reply};
use crate::error::ShardError;
use crate::host::Host;
use crate::model::{parse_turns_cursor, turns_cursor};

/// The store key of a chat's turn archive. Archives have a key space of their own: the `relay-archive:`
/// prefix is no channel scheme, and clients may only create `ahp-session:` and `ahp-chat:` URIs, so no
/// channel can ever share (and, disposed, delete) an archive's row.
pub fn archive_key(chat: &str) -> String {
    format!("relay-archive:{chat}")
}

/// Where releases before the archive had its own key space kept it (read if the new key has none, and
/// deleted with the chat).
pub fn legacy_archive_key(chat: &str) -> String {
    format!("{chat}#archived-turns")
}

/// Where the requested page lives.
enum PageSource {
    Memory(Vec<Turn>, usize),
    Archive { end: usize },
}

impl Host {
    pub(crate) async fn fetch_turns(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> CommandReply {
        answer(message.id, self.fetch_turns_result(connection, message).await)
    }

    async fn fetch_turns_result(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> Result<CommandReply, RpcError> {
        let params: FetchTurnsParams = message.parse_params()?;
        let chat = params.channel;
        // The archive may have been written by the restore that loaded this chat: make sure it is stored.
        self.flush().await;
        let (source, page_size) = {
            let core = self.core.lock();
            core.client_id(connection)?;
            let record = core.model.chats.get(&chat).ok_or_else(|| not_found(&chat))?;
            let total = record.archived + record.state.turns.len();
            let end = match params.cursor.as_deref() {
                None => total,
                Some(cursor) => match parse_turns_cursor(cursor) {
                    Some(end) if end <= total => end,
                    _ => return Err(RpcError::invalid_params("unknown turns cursor")),
                },
            };
            let page = core.limits.fetch_turns_page.max(1);
            let source = if end > record.archived {
                let start = end.saturating_sub(page).max(record.archived);
                let turns = record.state.turns[start - record.archived..end - record.archived].to_vec();
                PageSource::Memory(turns, start)
            } else {
                PageSource::Archive { end }
            };
            (source, page)
        };
        let (turns, start) = match source {
            PageSource::Memory(turns, start) => (turns, start),
            PageSource::Archive { end } => {
                let archive = self.read_archive(&chat).await.map_err(|error| {
                    tracing::error!(%chat, %error, "reading the turn archive failed");
                    RpcError::internal("the store is unavailable; retry")
                })?;
                let end = end.min(archive.len());
                let start = end.saturating_sub(page_size);
                (archive[start..end].to_vec(), start)
            }
        };
        let action = StateAction::ChatTurnsLoaded(ChatTurnsLoadedAction {
            turns,
            turns_next_cursor: (start > 0).then(|| turns_cursor(start)),
        });
        let barrier = self.with_core(|core| {
            // A page is part of this connection's view only: it goes to it alone and is not logged.
            core.seq.private(connection, &chat, &action, None, None);
            core.seq.barrier()
        });
        self.wait_committed(barrier).await;
        reply(message.id, &serde_json::json!({}))
    }

    /// The archived turns of a chat (empty when it has none).
    pub(crate) async fn read_archive(&self, chat: &str) -> Result<Vec<Turn>, ShardError> {
        let (tenant, host) = (&self.key.tenant, &self.key.host);
        let mut record = self.store.load_channel(tenant, host, &archive_key(chat)).await?;
        if record.is_none() {
            record = self
                .store
                .load_channel(tenant, host, &legacy_archive_key(chat))
                .await?;
        }
        match record {
            Some(record) => serde_json::from_str(&record.state).map_err(ShardError::corrupt),
            None => Ok(Vec::new()),
        }
    }
}
