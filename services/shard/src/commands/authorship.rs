//! Who wrote a message. The host stamps a user's message — a turn's prompt, a queued or steering message, a
//! draft, a new chat's first message — with the authenticated user who dispatched it, under
//! `_meta["ahpRelay/author"]` (`{"sub": …}`), replacing whatever the client put there: every device can name the
//! author of each message in a shared chat, and nobody can write in another member's name.

use ahp_types::actions::StateAction;
use ahp_types::state::Message;
use serde_json::{json, Map};

/// The key of a message's `_meta` naming its author.
pub const AUTHOR_META: &str = "ahpRelay/author";

/// Stamps `message` as written by `subject` (the token's `sub`).
pub(crate) fn stamp_message(message: &mut Message, subject: &str) {
    message
        .meta
        .get_or_insert_with(Map::new)
        .insert(AUTHOR_META.to_string(), json!({ "sub": subject }));
}

/// Stamps the message `action` carries, if it carries one a user writes.
pub(crate) fn stamp(action: &mut StateAction, subject: &str) {
    match action {
        StateAction::ChatTurnStarted(started) => stamp_message(&mut started.message, subject),
        StateAction::ChatPendingMessageSet(set) => stamp_message(&mut set.message, subject),
        StateAction::ChatDraftChanged(changed) => {
            if let Some(draft) = changed.draft.as_mut() {
                stamp_message(draft, subject);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ahp_types::actions::ChatTurnStartedAction;
    use ahp_types::state::{MessageKind, MessageOrigin};

    #[test]
    fn a_clients_claimed_author_is_replaced_by_the_dispatcher() {
        let mut claimed = Map::new();
        claimed.insert(AUTHOR_META.into(), json!({"sub": "someone-else"}));
        claimed.insert("kept".into(), json!(1));
        let mut action = StateAction::ChatTurnStarted(ChatTurnStartedAction {
            turn_id: "t".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            message: Message {
                text: "hi".into(),
                origin: MessageOrigin {
                    kind: MessageKind::User,
                },
                attachments: None,
                model: None,
                agent: None,
                meta: Some(claimed),
            },
            queued_message_id: None,
            meta: None,
        });
        stamp(&mut action, "alice");
        let StateAction::ChatTurnStarted(started) = action else {
            panic!("still a turn")
        };
        let meta = started.message.meta.expect("meta");
        assert_eq!(meta[AUTHOR_META], json!({"sub": "alice"}));
        assert_eq!(meta["kept"], json!(1), "the rest of _meta is the client's");
    }
}
