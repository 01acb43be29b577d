//! What a line typed into `ahp-relay chat` means, and the chat action it turns into.
//!
//! Everything here is pure: it reads the local [`ChatState`] and builds [`StateAction`]s; sending them is the
//! caller's business.

use std::collections::HashMap;

use ahp_types::actions::{
    ChatInputCompletedAction, ChatPendingMessageSetAction, ChatToolCallConfirmedAction,
    ChatTurnCancelledAction, ChatTurnStartedAction, StateAction,
};
use ahp_types::state::{
    ChatInputAnswer, ChatInputAnswerValue, ChatInputAnswered, ChatInputRequest, ChatInputResponseKind,
    ChatInputTextAnswerValue, ChatState, ConfirmationOptionKind, Message, MessageKind, MessageOrigin,
    PendingMessageKind, ResponsePart, ToolCallCancellationReason, ToolCallConfirmationReason,
    ToolCallPendingConfirmationState, ToolCallState,
};

/// One line of user input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Plain text: a prompt for the agent.
    Prompt(String),
    Approve,
    Deny,
    Answer(String),
    Cancel,
    Help,
    Quit,
    /// A blank line.
    Nothing,
    /// A `/word` we do not know.
    Unknown(String),
}

/// The commands, for `/help` and for the hint on an unknown command.
pub const HELP: &str =
    "commands: <text> prompt the agent, /approve, /deny, /answer <text>, /cancel, /help, /quit";

/// Parses one line of input.
pub fn parse(line: &str) -> Command {
    let line = line.trim();
    let Some(rest) = line.strip_prefix('/') else {
        return if line.is_empty() {
            Command::Nothing
        } else {
            Command::Prompt(line.to_string())
        };
    };
    let (word, arg) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let arg = arg.trim();
    match word {
        "approve" | "yes" => Command::Approve,
        "deny" | "no" => Command::Deny,
        "answer" if !arg.is_empty() => Command::Answer(arg.to_string()),
        "cancel" => Command::Cancel,
        "help" => Command::Help,
        "quit" | "exit" => Command::Quit,
        _ => Command::Unknown(line.to_string()),
    }
}

/// A message typed by the user.
pub fn user_message(text: &str) -> Message {
    Message {
        text: text.to_string(),
        origin: MessageOrigin {
            kind: MessageKind::User,
        },
        attachments: None,
        model: None,
        agent: None,
        meta: None,
    }
}

/// A prompt: starts a turn with id `id`, or, when the chat is `busy`, queues the message under that id.
pub fn prompt(text: &str, id: String, busy: bool, now: jiff::Timestamp) -> StateAction {
    let message = user_message(text);
    if busy {
        return StateAction::ChatPendingMessageSet(ChatPendingMessageSetAction {
            kind: PendingMessageKind::Queued,
            id,
            message,
        });
    }
    StateAction::ChatTurnStarted(ChatTurnStartedAction {
        turn_id: id,
        started_at: format!("{now:.3}"),
        message,
        queued_message_id: None,
        meta: None,
    })
}

/// Approves or denies the tool call of the active turn that waits for confirmation.
pub fn confirm_tool_call(state: &ChatState, approved: bool) -> Option<StateAction> {
    let turn = state.active_turn.as_ref()?;
    let pending = turn.response_parts.iter().find_map(|part| match part {
        ResponsePart::ToolCall(call) => match &call.tool_call {
            ToolCallState::PendingConfirmation(pending) => Some(pending),
            _ => None,
        },
        _ => None,
    })?;
    Some(StateAction::ChatToolCallConfirmed(ChatToolCallConfirmedAction {
        turn_id: turn.id.clone(),
        tool_call_id: pending.tool_call_id.clone(),
        meta: None,
        approved,
        confirmed: approved.then_some(ToolCallConfirmationReason::UserAction),
        reason: (!approved).then_some(ToolCallCancellationReason::Denied),
        edited_tool_input: None,
        user_suggestion: None,
        reason_message: None,
        selected_option_id: option_id(pending, approved),
    }))
}

/// The id of the server-offered option matching the decision, if the server offered options.
fn option_id(pending: &ToolCallPendingConfirmationState, approved: bool) -> Option<String> {
    let wanted = if approved {
        ConfirmationOptionKind::Approve
    } else {
        ConfirmationOptionKind::Deny
    };
    pending
        .options
        .as_ref()?
        .iter()
        .find(|option| option.kind == wanted)
        .map(|option| option.id.clone())
}

/// Answers the open input request of the active turn with `text` (as the answer to its first question).
pub fn answer_input(state: &ChatState, text: &str) -> Option<StateAction> {
    let request = pending_input(state)?;
    let answers = first_question_id(request).map(|question| {
        let answer = ChatInputAnswer::Submitted(ChatInputAnswered {
            value: ChatInputAnswerValue::Text(ChatInputTextAnswerValue {
                value: text.to_string(),
            }),
        });
        HashMap::from([(question, answer)])
    });
    Some(StateAction::ChatInputCompleted(ChatInputCompletedAction {
        request_id: request.id.clone(),
        response: ChatInputResponseKind::Accept,
        answers,
    }))
}

/// The input request of the active turn that has no response yet.
pub fn pending_input(state: &ChatState) -> Option<&ChatInputRequest> {
    let turn = state.active_turn.as_ref()?;
    turn.response_parts.iter().find_map(|part| match part {
        ResponsePart::InputRequest(input) if input.response.is_none() => Some(&input.request),
        _ => None,
    })
}

/// The id of the request's first question (every question kind carries an `id`).
fn first_question_id(request: &ChatInputRequest) -> Option<String> {
    let question = request.questions.as_ref()?.first()?;
    let value = serde_json::to_value(question).ok()?;
    value.get("id")?.as_str().map(str::to_string)
}

/// Cancels the active turn.
pub fn cancel_turn(state: &ChatState) -> Option<StateAction> {
    let turn = state.active_turn.as_ref()?;
    Some(StateAction::ChatTurnCancelled(ChatTurnCancelledAction {
        turn_id: turn.id.clone(),
        duration: 0,
        meta: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_state(parts: Vec<ResponsePart>) -> ChatState {
        serde_json::from_value(serde_json::json!({
            "resource": "ahp-chat:/c",
            "title": "t",
            "status": 0,
            "modifiedAt": "2025-01-01T00:00:00Z",
            "turns": [],
            "activeTurn": {
                "id": "turn-1",
                "startedAt": "2025-01-01T00:00:00Z",
                "message": {"text": "hi", "origin": {"kind": "user"}},
                "responseParts": parts,
            },
        }))
        .expect("chat state")
    }

    fn tool_call_pending() -> ResponsePart {
        serde_json::from_value(serde_json::json!({
            "kind": "toolCall",
            "toolCall": {
                "status": "pending-confirmation",
                "toolCallId": "tc-1",
                "toolName": "demo_echo",
                "displayName": "Echo",
                "invocationMessage": "Echo the prompt",
                "options": [
                    {"id": "allow", "label": "Allow", "kind": "approve"},
                    {"id": "deny", "label": "Deny", "kind": "deny"},
                ],
            },
        }))
        .expect("tool call part")
    }

    fn input_request() -> ResponsePart {
        serde_json::from_value(serde_json::json!({
            "kind": "inputRequest",
            "request": {
                "id": "req-1",
                "message": "What should I call you?",
                "questions": [{"kind": "text", "id": "who", "message": "Your name"}],
            },
        }))
        .expect("input part")
    }

    #[test]
    fn parses_prompts_and_commands() {
        assert_eq!(parse("  hello there "), Command::Prompt("hello there".into()));
        assert_eq!(parse(""), Command::Nothing);
        assert_eq!(parse("/approve"), Command::Approve);
        assert_eq!(parse("/deny"), Command::Deny);
        assert_eq!(
            parse("/answer  Ada Lovelace "),
            Command::Answer("Ada Lovelace".into())
        );
        assert_eq!(parse("/answer"), Command::Unknown("/answer".into()));
        assert_eq!(parse("/cancel"), Command::Cancel);
        assert_eq!(parse("/quit"), Command::Quit);
        assert_eq!(parse("/frobnicate x"), Command::Unknown("/frobnicate x".into()));
    }

    #[test]
    fn a_prompt_starts_a_turn_when_idle_and_is_queued_when_busy() {
        let now = jiff::Timestamp::from_second(1_700_000_000).expect("timestamp");
        match prompt("hi", "t1".into(), false, now) {
            StateAction::ChatTurnStarted(a) => {
                assert_eq!(a.turn_id, "t1");
                assert_eq!(a.started_at, "2023-11-14T22:13:20.000Z");
                assert_eq!(a.message.text, "hi");
            }
            other => panic!("unexpected {other:?}"),
        }
        match prompt("later", "m1".into(), true, now) {
            StateAction::ChatPendingMessageSet(a) => {
                assert_eq!(a.kind, PendingMessageKind::Queued);
                assert_eq!(a.id, "m1");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn approve_and_deny_target_the_pending_tool_call() {
        let state = chat_state(vec![tool_call_pending()]);
        let Some(StateAction::ChatToolCallConfirmed(a)) = confirm_tool_call(&state, true) else {
            panic!("no confirmation");
        };
        assert_eq!((a.turn_id.as_str(), a.tool_call_id.as_str()), ("turn-1", "tc-1"));
        assert!(a.approved);
        assert_eq!(a.selected_option_id.as_deref(), Some("allow"));
        let Some(StateAction::ChatToolCallConfirmed(d)) = confirm_tool_call(&state, false) else {
            panic!("no denial");
        };
        assert!(!d.approved);
        assert_eq!(d.selected_option_id.as_deref(), Some("deny"));
        assert!(confirm_tool_call(&chat_state(vec![]), true).is_none());
    }

    #[test]
    fn answer_uses_the_first_question_id() {
        let state = chat_state(vec![input_request()]);
        let Some(StateAction::ChatInputCompleted(a)) = answer_input(&state, "Ada") else {
            panic!("no answer");
        };
        assert_eq!(a.request_id, "req-1");
        assert_eq!(a.response, ChatInputResponseKind::Accept);
        let answers = a.answers.expect("answers");
        match answers.get("who") {
            Some(ChatInputAnswer::Submitted(ChatInputAnswered {
                value: ChatInputAnswerValue::Text(t),
            })) => assert_eq!(t.value, "Ada"),
            other => panic!("unexpected {other:?}"),
        }
        assert!(answer_input(&chat_state(vec![]), "Ada").is_none());
    }

    #[test]
    fn cancel_targets_the_active_turn() {
        let Some(StateAction::ChatTurnCancelled(a)) = cancel_turn(&chat_state(vec![])) else {
            panic!("no cancel");
        };
        assert_eq!(a.turn_id, "turn-1");
    }
}
