//! Who wrote a message, who decided a tool call, who answered a question. The host stamps a user's message — a
//! turn's prompt, a queued or steering message, a draft, a new chat's first message — with the authenticated
//! user who dispatched it, under `_meta["ahpRelay/author"]` (`{"sub": …}`), replacing whatever the client put
//! there; a tool call's confirmation gets the user in its `ahp-relay/decidedBy` `_meta`; and an answered
//! input request is followed by a system note naming who answered (`_meta["ahpRelay/answeredBy"]`). Every
//! device can name who did what in a shared chat, and nobody can act in another member's name.

use ahp_types::actions::{ChatInputCompletedAction, ChatResponsePartAction, StateAction};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{ChatInputResponseKind, Message, ResponsePart, SystemNotificationResponsePart};
use serde_json::{json, Map, Value};

use crate::host::HostCore;

pub use crate::model::authors::{author_of, AUTHOR_META};
/// The key of a tool call confirmation's `_meta` naming who decided (and from which device).
pub const DECIDED_BY_META: &str = "ahp-relay/decidedBy";
/// The key of a system note's `_meta` naming who answered an input request.
pub const ANSWERED_BY_META: &str = "ahpRelay/answeredBy";

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
        StateAction::ChatToolCallConfirmed(confirmed) => {
            let meta = confirmed.meta.get_or_insert_with(Map::new);
            let decided = meta
                .entry(DECIDED_BY_META)
                .or_insert_with(|| Value::Object(Map::new()));
            match decided {
                Value::Object(decided) => {
                    decided.insert("sub".into(), json!(subject));
                }
                other => *other = json!({ "sub": subject }),
            }
        }
        _ => {}
    }
}

impl HostCore {
    /// A member answered (or declined) an input request of `chat`'s running turn: a system note in the turn
    /// says who, for every device.
    pub(crate) fn note_answer(&mut self, chat: &str, completed: &ChatInputCompletedAction, subject: &str) {
        let Some(turn_id) = self
            .model
            .chats
            .get(chat)
            .and_then(|record| record.state.active_turn.as_ref())
            .map(|turn| turn.id.clone())
        else {
            return;
        };
        let verb = match completed.response {
            ChatInputResponseKind::Accept => "Answered",
            ChatInputResponseKind::Decline => "Declined",
            ChatInputResponseKind::Cancel => "Withdrawn",
        };
        let mut meta = Map::new();
        meta.insert(
            ANSWERED_BY_META.into(),
            json!({ "sub": subject, "requestId": completed.request_id }),
        );
        self.apply_server_action(
            chat,
            StateAction::ChatResponsePart(ChatResponsePartAction {
                turn_id,
                part: ResponsePart::SystemNotification(SystemNotificationResponsePart {
                    content: StringOrMarkdown::Plain(format!("{verb} by {subject}")),
                    meta: Some(meta),
                }),
                meta: None,
            }),
        );
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

    #[test]
    fn a_tool_decision_names_the_dispatcher_whatever_the_client_claimed() {
        let mut action: StateAction = serde_json::from_value(json!({
            "type": "chat/toolCallConfirmed", "turnId": "t", "toolCallId": "c", "approved": true,
            "confirmed": "user-action",
            "_meta": {DECIDED_BY_META: {"displayName": "Web (desktop) · mallory", "sub": "mallory"}}
        }))
        .expect("action");
        stamp(&mut action, "alice");
        let StateAction::ChatToolCallConfirmed(confirmed) = action else {
            panic!("still a confirmation")
        };
        let decided = &confirmed.meta.expect("meta")[DECIDED_BY_META];
        assert_eq!(decided["sub"], json!("alice"));
        assert_eq!(
            decided["displayName"],
            json!("Web (desktop) · mallory"),
            "the device's words are kept"
        );
    }
}
