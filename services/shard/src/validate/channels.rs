//! Client actions on root, session and chat channels against their state: tool calls, questions, queued
//! messages, and whose each is.

use ahp_types::actions::StateAction;
use ahp_types::state::{
    ChatInputQuestion, ChatInputResponseKind, ChatState, PendingMessageKind, ResponsePart,
    ToolCallContributor, ToolCallState, TurnState,
};
use relay_core::Role;

use super::dispatcher::*;
use super::fields::*;

pub(super) fn check_root(action: &StateAction, who: &Dispatcher<'_>) -> Result<(), String> {
    match action {
        StateAction::RootConfigChanged(_) if who.role != Role::Admin => {
            Err("only admins may change host configuration".into())
        }
        _ => Ok(()),
    }
}

pub(super) fn check_session(
    session: &ahp_types::state::SessionState,
    action: &StateAction,
    who: &Dispatcher<'_>,
) -> Result<(), String> {
    let chats = &session.chats;
    match action {
        StateAction::SessionWorkingDirectorySet(a)
            if session.working_directories.as_ref().is_some_and(|dirs| {
                dirs.len() >= MAX_WORKING_DIRECTORIES && !dirs.contains(&a.directory)
            }) =>
        {
            Err(format!(
                "a session may list at most {MAX_WORKING_DIRECTORIES} working directories"
            ))
        }
        StateAction::SessionDefaultChatChanged(a) => match &a.default_chat {
            Some(chat) if !chats.iter().any(|c| &c.resource == chat) => {
                Err(format!("{chat} is not a chat of this session"))
            }
            _ => Ok(()),
        },
        StateAction::SessionConfigChanged(a) => {
            let schema = session.config.as_ref().map(|config| &config.schema.properties);
            let current = session.config.as_ref().map(|config| &config.values);
            let mutable = |key: &str| {
                schema
                    .and_then(|properties| properties.get(key))
                    .is_some_and(|property| property.session_mutable == Some(true))
            };
            let unchanged = |key: &str, value: &serde_json::Value| {
                current.and_then(|values| values.get(key)) == Some(value)
            };
            if let Some(key) = a
                .config
                .iter()
                .find(|(key, value)| !mutable(key) && !unchanged(key, value))
                .map(|(key, _)| key)
            {
                return Err(format!(
                    "config property {key} is not sessionMutable: it cannot change after the session is created"
                ));
            }
            // A replacing change drops every value it does not name: it must carry the fixed ones as they are.
            if a.replace == Some(true) {
                if let Some(key) = current
                    .into_iter()
                    .flat_map(|values| values.keys())
                    .find(|key| !mutable(key) && !a.config.contains_key(*key))
                {
                    return Err(format!(
                        "config property {key} is not sessionMutable: a replacing session/configChanged must carry its value unchanged"
                    ));
                }
            }
            let allowed = |key: &str, value: &serde_json::Value| {
                schema
                    .and_then(|properties| properties.get(key))
                    .and_then(|property| property.r#enum.as_ref())
                    .is_none_or(|values| values.contains(value))
            };
            match a.config.iter().find(|(key, value)| !allowed(key, value)) {
                Some((key, value)) => Err(format!(
                    "{value} is not an allowed value of config property {key}"
                )),
                None => Ok(()),
            }
        }
        StateAction::SessionActiveClientSet(a) if a.active_client.client_id != who.client_id => {
            Err("a client may only set itself as active client".into())
        }
        StateAction::SessionActiveClientRemoved(a)
            if a.client_id != who.client_id && who.role != Role::Admin =>
        {
            Err("only admins may remove another client".into())
        }
        _ => Ok(()),
    }
}

pub(super) fn check_chat(chat: &ChatState, action: &StateAction, who: &Dispatcher<'_>) -> Result<(), String> {
    use StateAction::*;
    match action {
        ChatPendingMessageSet(a)
            if a.kind == PendingMessageKind::Queued
                && chat.queued_messages.as_ref().is_some_and(|queued| {
                    queued.len() >= MAX_QUEUED_MESSAGES && !queued.iter().any(|m| m.id == a.id)
                }) =>
        {
            Err(format!(
                "this chat already has {MAX_QUEUED_MESSAGES} queued messages; remove one or wait for them to start"
            ))
        }
        ChatTurnStarted(a) => {
            check_client_timestamp("startedAt", &a.started_at)?;
            if chat.active_turn.is_some() {
                return Err(
                    "a turn is already in progress; queue the message with chat/pendingMessageSet".into(),
                );
            }
            if chat.turns.iter().any(|t| t.id == a.turn_id) {
                return Err(format!("turn {} already exists", a.turn_id));
            }
            Ok(())
        }
        // Truncating removes turns for every device: a member removes only turns of their own (an admin any).
        // Turns with no author (written before the relay stamped them) count as nobody's.
        ChatTruncated(a) if who.role != Role::Admin => {
            let from = a
                .turn_id
                .as_ref()
                .and_then(|id| chat.turns.iter().position(|t| &t.id == id))
                .map_or(0, |at| at + 1);
            let other = chat.turns[from.min(chat.turns.len())..]
                .iter()
                .filter_map(|turn| crate::model::authors::author_of(&turn.message))
                .find(|author| *author != who.subject);
            match other {
                Some(author) => Err(format!(
                    "the turns this would remove include {author}'s: a member removes only their own turns \
                     (fork the chat instead)"
                )),
                None => Ok(()),
            }
        }
        ChatTurnCancelled(a) => match &chat.active_turn {
            Some(turn) if turn.id == a.turn_id => check_turn_duration(&turn.started_at, a.duration),
            Some(_) => Err(format!("turn {} is not the active turn", a.turn_id)),
            None => Err("there is no active turn to cancel".into()),
        },
        ChatTurnResume(a) => {
            if chat.active_turn.is_some() {
                return Err("a turn is in progress".into());
            }
            let Some(last) = chat.turns.last() else {
                return Err("there is no turn to resume".into());
            };
            if last.id != a.turn_id || last.state != TurnState::Error {
                return Err(format!("turn {} is not the latest errored turn", a.turn_id));
            }
            match last.response_parts.last() {
                Some(ResponsePart::Error(e)) if e.resumable == Some(true) => Ok(()),
                _ => Err(format!("the error of turn {} is not resumable", a.turn_id)),
            }
        }
        ChatToolCallConfirmed(a) => match tool_call(chat, &a.turn_id, &a.tool_call_id) {
            Some(ToolCallState::PendingConfirmation(_)) => Ok(()),
            Some(_) => Err(format!(
                "tool call {} is not pending confirmation",
                a.tool_call_id
            )),
            None => Err(format!("no tool call {} in the active turn", a.tool_call_id)),
        },
        ChatToolCallResultConfirmed(a) => match tool_call(chat, &a.turn_id, &a.tool_call_id) {
            Some(ToolCallState::PendingResultConfirmation(_)) => Ok(()),
            Some(_) => Err(format!(
                "tool call {} is not pending result confirmation",
                a.tool_call_id
            )),
            None => Err(format!("no tool call {} in the active turn", a.tool_call_id)),
        },
        ChatToolCallComplete(a) => check_tool_owner(chat, &a.turn_id, &a.tool_call_id, who),
        ChatToolCallContentChanged(a) => check_tool_owner(chat, &a.turn_id, &a.tool_call_id, who),
        ChatInputAnswerChanged(a) => pending_input(chat, &a.request_id).map(|_| ()),
        ChatInputCompleted(a) => {
            let request = pending_input(chat, &a.request_id)?;
            if a.response == ChatInputResponseKind::Accept {
                let answered = |id: &str| {
                    a.answers.as_ref().is_some_and(|m| m.contains_key(id))
                        || request.answers.as_ref().is_some_and(|m| m.contains_key(id))
                };
                for question in request.questions.iter().flatten() {
                    if let Some((id, true)) = required_question(question) {
                        if !answered(id) {
                            return Err(format!("required question {id} is not answered"));
                        }
                    }
                }
            }
            Ok(())
        }
        ChatPendingMessageRemoved(a) => {
            let exists = match a.kind {
                PendingMessageKind::Steering => chat.steering_message.as_ref().is_some_and(|m| m.id == a.id),
                PendingMessageKind::Queued => chat.queued_messages.iter().flatten().any(|m| m.id == a.id),
            };
            if exists {
                Ok(())
            } else {
                Err(format!("no pending message {}", a.id))
            }
        }
        _ => Ok(()),
    }
}

pub(super) fn tool_call<'a>(
    chat: &'a ChatState,
    turn_id: &str,
    tool_call_id: &str,
) -> Option<&'a ToolCallState> {
    let turn = chat.active_turn.as_ref().filter(|t| t.id == turn_id)?;
    turn.response_parts.iter().find_map(|part| match part {
        ResponsePart::ToolCall(tc) if tool_call_id_of(&tc.tool_call) == Some(tool_call_id) => {
            Some(&tc.tool_call)
        }
        _ => None,
    })
}

/// The id of a tool call in any state.
pub fn tool_call_id_of(state: &ToolCallState) -> Option<&str> {
    Some(match state {
        ToolCallState::Streaming(s) => &s.tool_call_id,
        ToolCallState::PendingConfirmation(s) => &s.tool_call_id,
        ToolCallState::Running(s) => &s.tool_call_id,
        ToolCallState::AuthRequired(s) => &s.tool_call_id,
        ToolCallState::PendingResultConfirmation(s) => &s.tool_call_id,
        ToolCallState::Completed(s) => &s.tool_call_id,
        ToolCallState::Cancelled(s) => &s.tool_call_id,
        ToolCallState::Unknown(_) => return None,
    })
}

/// The contributor of a tool call in any state.
pub fn tool_call_contributor(state: &ToolCallState) -> Option<&ToolCallContributor> {
    match state {
        ToolCallState::Streaming(s) => s.contributor.as_ref(),
        ToolCallState::PendingConfirmation(s) => s.contributor.as_ref(),
        ToolCallState::Running(s) => s.contributor.as_ref(),
        ToolCallState::AuthRequired(s) => s.contributor.as_ref(),
        ToolCallState::PendingResultConfirmation(s) => s.contributor.as_ref(),
        ToolCallState::Completed(s) => s.contributor.as_ref(),
        ToolCallState::Cancelled(s) => s.contributor.as_ref(),
        ToolCallState::Unknown(_) => None,
    }
}

pub(super) fn check_tool_owner(
    chat: &ChatState,
    turn_id: &str,
    tool_call_id: &str,
    who: &Dispatcher<'_>,
) -> Result<(), String> {
    let Some(tc) = tool_call(chat, turn_id, tool_call_id) else {
        return Err(format!("no tool call {tool_call_id} in the active turn"));
    };
    match tool_call_contributor(tc) {
        Some(ToolCallContributor::Client(owner)) if owner.client_id == who.client_id => Ok(()),
        Some(ToolCallContributor::Client(_)) => {
            Err(format!("tool call {tool_call_id} belongs to another client"))
        }
        _ => Err(format!("tool call {tool_call_id} is not executed by a client")),
    }
}

pub(super) fn pending_input<'a>(
    chat: &'a ChatState,
    request_id: &str,
) -> Result<&'a ahp_types::state::ChatInputRequest, String> {
    chat.active_turn
        .iter()
        .flat_map(|t| t.response_parts.iter())
        .find_map(|part| match part {
            ResponsePart::InputRequest(input)
                if input.response.is_none() && input.request.id == request_id =>
            {
                Some(&input.request)
            }
            _ => None,
        })
        .ok_or_else(|| format!("no pending input request {request_id}"))
}

pub(super) fn required_question(question: &ChatInputQuestion) -> Option<(&str, bool)> {
    Some(match question {
        ChatInputQuestion::Text(q) => (&q.id, q.required.unwrap_or(false)),
        ChatInputQuestion::Number(q) | ChatInputQuestion::Integer(q) => (&q.id, q.required.unwrap_or(false)),
        ChatInputQuestion::Boolean(q) => (&q.id, q.required.unwrap_or(false)),
        ChatInputQuestion::SingleSelect(q) => (&q.id, q.required.unwrap_or(false)),
        ChatInputQuestion::MultiSelect(q) => (&q.id, q.required.unwrap_or(false)),
        ChatInputQuestion::Unknown(_) => return None,
    })
}
