//! Turns leaving a chat's live state for its archive ([`crate::model::archive`] says how): when a turn ends in a
//! chat that holds more than its retained turns (plus the slack), and when a chat is restored. The moved turns
//! are written with the batch that moves them, beside the chat's snapshot without them, so memory, every
//! snapshot and every load hold a chat's retained turns however long it grows.
//!
//! Retained is bounded twice: at most `retained_turns` turns, and at most `retained_turn_bytes` of them as
//! JSON (the newest turn always stays). A chat of large turns (an agent printing a build log) ages by bytes;
//! a truncation or a fork, which may bring back archived turns, ages its chats at once.

use ahp_types::actions::StateAction;
use ahp_types::state::{PendingMessageKind, Turn};

use crate::host::HostCore;
use crate::model::archive;

impl HostCore {
    /// After `action` on `chat`: once a turn ended, the oldest turns beyond the retained ones (and the slack)
    /// move to the archive.
    pub(crate) fn age_turns_after(&mut self, chat: &str, action: &StateAction) {
        let retain = self.limits.retained_turns;
        if ends_turn(action) {
            self.age_turns(chat, retain, archive::aging_slack(retain));
        } else if matches!(action, StateAction::ChatTruncated(_)) {
            // The turns loaded back for it go back to the archive now, not when the next turn ends.
            self.age_turns(chat, retain, 0);
        }
    }

    /// Keep at most `retain + slack` turns of `chat` in state (down to `retain`), archiving the rest; the
    /// chat's snapshot is stored without them in the same batch.
    pub(crate) fn age_turns(&mut self, chat: &str, retain: usize, slack: usize) {
        let budget = self.limits.retained_turn_bytes;
        let Some(record) = self.model.chats.get_mut(chat) else {
            return;
        };
        let sizes = record.turn_sizes.of(&record.state.turns);
        // Over its bytes (and their slack): down to what fits, whatever the count.
        let (retain, slack) = match sizes.iter().sum::<usize>() > budget + budget / 4 {
            true => (crate::model::archive::retained_count(&sizes, retain, budget), 0),
            false => (retain, slack),
        };
        let moved = archive::age(&mut record.state, record.archived, retain, slack);
        if moved.is_empty() {
            return;
        }
        record.archived += moved.len();
        self.archive_turns(chat, moved);
        self.store_snapshot(chat);
    }

    /// Why `action` on `chat` is refused when it would start a turn (directly, or queued) in a chat that holds
    /// `max_turns_per_chat` turns already, counting archived, running and queued ones.
    pub(crate) fn turn_limit_refusal(&self, chat: &str, action: &StateAction) -> Option<String> {
        let starts_turn = match action {
            StateAction::ChatTurnStarted(_) => true,
            StateAction::ChatPendingMessageSet(set) => set.kind == PendingMessageKind::Queued,
            _ => false,
        };
        let record = self.model.chats.get(chat).filter(|_| starts_turn)?;
        let state = &record.state;
        let held = record.archived
            + state.turns.len()
            + usize::from(state.active_turn.is_some())
            + state.queued_messages.as_ref().map_or(0, Vec::len);
        let limit = self.limits.max_turns_per_chat;
        (held >= limit).then(|| {
            format!(
                "this chat holds its limit of {limit} turns: start a new chat, or truncate this one to make room"
            )
        })
    }

    /// Queue `turns` (each with its absolute index) into `chat`'s archive.
    pub(crate) fn archive_turns(&mut self, chat: &str, turns: Vec<(usize, Turn)>) {
        let key = archive::key(chat);
        for (index, turn) in turns {
            match serde_json::to_string(&turn) {
                Ok(json) => self.seq.archive_turn(key.clone(), index as u64, turn.id, json),
                Err(error) => tracing::error!(%chat, %error, "could not serialize a turn to archive"),
            }
        }
    }
}

/// Whether `action` ends a chat's turn (adding it to the chat's turns).
fn ends_turn(action: &StateAction) -> bool {
    matches!(
        action,
        StateAction::ChatTurnComplete(_) | StateAction::ChatTurnCancelled(_) | StateAction::ChatError(_)
    )
}
