//! Searching what was said in a session for `listSessions`' `_meta["ahpRelay/textContains"]`: whether any
//! turn of any of its chats — the prompt or the agent's reply (Markdown parts), the running turn too — holds the
//! text, ignoring case. A session in memory is searched as it is now; one that is not is read from the store
//! (each chat's snapshot and the log after it, reduced with the `ahp` reducers, nothing installed); the turns
//! archived out of a chat's live state are searched in the store (`turn_archive`, by the database).

use ahp::reducers::apply_action_to_chat;
use ahp_types::state::{ChatState, Message, ResponsePart};

use crate::error::ShardError;
use crate::host::preload::tail;
use crate::host::Host;
use crate::model::{ChatDocument, TERMINAL_SCHEME};

/// Whether `text` holds `needle` (lowercase), ignoring case.
fn holds(text: &str, needle: &str) -> bool {
    text.to_lowercase().contains(needle)
}

/// Whether a turn of `chat` (its message or its Markdown reply) holds `needle` (lowercase).
pub(crate) fn chat_holds(chat: &ChatState, needle: &str) -> bool {
    let said = |message: &Message, parts: &[ResponsePart]| {
        holds(&message.text, needle)
            || parts.iter().any(|part| match part {
                ResponsePart::Markdown(markdown) => holds(&markdown.content, needle),
                _ => false,
            })
    };
    chat.turns
        .iter()
        .any(|turn| said(&turn.message, &turn.response_parts))
        || chat
            .active_turn
            .as_ref()
            .is_some_and(|turn| said(&turn.message, &turn.response_parts))
}

impl Host {
    /// Whether a turn of `session` holds `needle` (lowercase), in memory, in the store or in its archive; and
    /// how many bytes it read from the store to say so (what bounds a search request, with the session count).
    pub(crate) async fn session_says(
        &self,
        session: &str,
        needle: &str,
    ) -> Result<(bool, usize), ShardError> {
        let mut read = 0;
        let (tenant, host) = (&self.key.tenant, &self.key.host);
        let in_memory = {
            let core = self.core.lock();
            core.model.sessions.contains_key(session).then(|| {
                let chats: Vec<(&String, &crate::model::ChatRecord)> = core
                    .model
                    .chats
                    .iter()
                    .filter(|(_, chat)| chat.session == session)
                    .collect();
                (
                    chats.iter().any(|(_, chat)| chat_holds(&chat.state, needle)),
                    chats
                        .iter()
                        .map(|(uri, _)| (*uri).clone())
                        .collect::<Vec<String>>(),
                )
            })
        };
        let chats = match in_memory {
            Some((true, _)) => return Ok((true, read)),
            Some((false, chats)) => chats,
            None => {
                let mut chats = Vec::new();
                for chat in self.store.chats_of(tenant, host, session).await? {
                    if !chat.starts_with("ahp-chat:") || chat.starts_with(TERMINAL_SCHEME) {
                        continue;
                    }
                    let Some(record) = self.store.load_channel(tenant, host, &chat).await? else {
                        continue;
                    };
                    read +=
                        record.state.len() + record.tail.iter().map(|row| row.envelope.len()).sum::<usize>();
                    let Ok(document) = serde_json::from_str::<ChatDocument>(&record.state) else {
                        tracing::error!(%chat, "unreadable chat snapshot; not searched");
                        continue;
                    };
                    let mut state = document.state;
                    for envelope in tail(&record) {
                        apply_action_to_chat(&mut state, &envelope.action);
                    }
                    if chat_holds(&state, needle) {
                        return Ok((true, read));
                    }
                    chats.push(chat);
                }
                chats
            }
        };
        let archives: Vec<String> = chats
            .iter()
            .map(|chat| crate::model::archive::key(chat))
            .collect();
        let archived = self
            .store
            .archived_turns_contain(tenant, host, &archives, needle)
            .await?;
        Ok((archived, read))
    }
}
