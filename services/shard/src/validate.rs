//! Which client actions the host accepts (digest §4–§6).
//!
//! A client action is accepted only when it is client-dispatchable, targets a channel of the matching kind,
//! comes from a role that may write, and is valid in the current state. Everything refused here is echoed to
//! its dispatcher with the returned reason as `rejectionReason`, and changes nothing.

use ahp_types::actions::StateAction;
use ahp_types::state::{
    ChatInputQuestion, ChatInputResponseKind, ChatState, MessageKind, MultipleWorkingDirectoriesCapability,
    PendingMessageKind, ResponsePart, ToolCallContributor, ToolCallState, TurnState,
};
use relay_core::Role;

use crate::model::{ChannelKind, HostModel};

/// Who dispatched an action.
pub struct Dispatcher<'a> {
    pub client_id: &'a str,
    pub role: Role,
}

/// The channel kind an action belongs to, or `None` for action families the relay does not host.
fn family(action: &StateAction) -> Option<ChannelKind> {
    use StateAction::*;
    Some(match action {
        RootConfigChanged(_)
        | RootAgentsChanged(_)
        | RootActiveSessionsChanged(_)
        | RootTerminalsChanged(_) => ChannelKind::Root,
        SessionReady(_)
        | SessionCreationFailed(_)
        | SessionChatAdded(_)
        | SessionChatRemoved(_)
        | SessionChatUpdated(_)
        | SessionChatsReordered(_)
        | SessionDefaultChatChanged(_)
        | SessionTitleChanged(_)
        | SessionIsReadChanged(_)
        | SessionIsArchivedChanged(_)
        | SessionActivityChanged(_)
        | SessionChangesetsChanged(_)
        | SessionServerToolsChanged(_)
        | SessionActiveClientSet(_)
        | SessionActiveClientRemoved(_)
        | SessionWorkingDirectorySet(_)
        | SessionWorkingDirectoryRemoved(_)
        | SessionWorkingDirectoryReplaced(_)
        | SessionInputNeededSet(_)
        | SessionInputNeededRemoved(_)
        | SessionCustomizationsChanged(_)
        | SessionCustomizationToggled(_)
        | SessionCustomizationUpdated(_)
        | SessionCustomizationRemoved(_)
        | SessionMcpServerStateChanged(_)
        | SessionMcpServerStartRequested(_)
        | SessionMcpServerStopRequested(_)
        | SessionMcpServerBackgroundRequested(_)
        | SessionConfigChanged(_)
        | SessionMetaChanged(_) => ChannelKind::Session,
        ChatTurnStarted(_)
        | ChatDelta(_)
        | ChatResponsePart(_)
        | ChatToolCallStart(_)
        | ChatToolCallDelta(_)
        | ChatToolCallReady(_)
        | ChatToolCallConfirmed(_)
        | ChatToolCallComplete(_)
        | ChatToolCallResultConfirmed(_)
        | ChatToolCallContentChanged(_)
        | ChatToolCallAuthRequired(_)
        | ChatToolCallAuthResolved(_)
        | ChatTurnComplete(_)
        | ChatTurnCancelled(_)
        | ChatError(_)
        | ChatTurnResume(_)
        | ChatActivityChanged(_)
        | ChatBackgroundWorkSet(_)
        | ChatBackgroundWorkRemoved(_)
        | ChatMovableChanged(_)
        | ChatChangesetsChanged(_)
        | ChatCanvasesChanged(_)
        | ChatUsage(_)
        | ChatReasoning(_)
        | ChatWorkingDirectorySet(_)
        | ChatWorkingDirectoryRemoved(_)
        | ChatPendingMessageSet(_)
        | ChatPendingMessageRemoved(_)
        | ChatQueuedMessagesReordered(_)
        | ChatDraftChanged(_)
        | ChatIsReadChanged(_)
        | ChatIsArchivedChanged(_)
        | ChatInputRequested(_)
        | ChatInputAnswerChanged(_)
        | ChatInputCompleted(_)
        | ChatTruncated(_)
        | ChatTurnsLoaded(_) => ChannelKind::Chat,
        TerminalData(_)
        | TerminalInput(_)
        | TerminalResized(_)
        | TerminalClaimed(_)
        | TerminalTitleChanged(_)
        | TerminalCwdChanged(_)
        | TerminalExited(_)
        | TerminalCleared(_)
        | TerminalCommandDetectionAvailable(_)
        | TerminalCommandExecuted(_)
        | TerminalCommandFinished(_) => ChannelKind::Terminal,
        ChangesetStatusChanged(_)
        | ChangesetFileSet(_)
        | ChangesetFileRemoved(_)
        | ChangesetFilesReviewChanged(_)
        | ChangesetContentChanged(_)
        | ChangesetOperationsChanged(_)
        | ChangesetOperationStatusChanged(_)
        | ChangesetCleared(_) => ChannelKind::Changeset,
        _ => return None,
    })
}

/// Whether clients may dispatch this action at all (the spec's `IS_CLIENT_DISPATCHABLE`, restricted to the
/// channel kinds this relay hosts).
pub fn is_client_dispatchable(action: &StateAction) -> bool {
    use StateAction::*;
    matches!(
        action,
        RootConfigChanged(_)
            | SessionTitleChanged(_)
            | SessionIsReadChanged(_)
            | SessionIsArchivedChanged(_)
            | SessionActiveClientSet(_)
            | SessionActiveClientRemoved(_)
            | SessionWorkingDirectorySet(_)
            | SessionWorkingDirectoryRemoved(_)
            | SessionWorkingDirectoryReplaced(_)
            | SessionCustomizationToggled(_)
            | SessionMcpServerStartRequested(_)
            | SessionMcpServerStopRequested(_)
            | SessionMcpServerBackgroundRequested(_)
            | SessionConfigChanged(_)
            | SessionDefaultChatChanged(_)
            | ChatTurnStarted(_)
            | ChatTurnCancelled(_)
            | ChatTurnResume(_)
            | ChatTruncated(_)
            | ChatToolCallConfirmed(_)
            | ChatToolCallComplete(_)
            | ChatToolCallContentChanged(_)
            | ChatToolCallResultConfirmed(_)
            | ChatPendingMessageSet(_)
            | ChatPendingMessageRemoved(_)
            | ChatQueuedMessagesReordered(_)
            | ChatDraftChanged(_)
            | ChatInputAnswerChanged(_)
            | ChatInputCompleted(_)
            | ChatWorkingDirectorySet(_)
            | ChatWorkingDirectoryRemoved(_)
            | ChatIsReadChanged(_)
            | ChatIsArchivedChanged(_)
            | TerminalInput(_)
            | TerminalResized(_)
            | TerminalClaimed(_)
            | TerminalTitleChanged(_)
            | TerminalCleared(_)
            | ChangesetFilesReviewChanged(_)
    )
}

/// The action's `type` string, for messages.
pub fn action_type(action: &StateAction) -> String {
    serde_json::to_value(action)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// Largest client action accepted, serialized (a chat's state grows by what its actions carry).
pub const MAX_CLIENT_ACTION_BYTES: usize = 1024 * 1024;
/// Queued messages one chat may hold.
pub const MAX_QUEUED_MESSAGES: usize = 64;
/// Working directories one session may list.
pub const MAX_WORKING_DIRECTORIES: usize = 64;

/// Check a client action against the current state. `Err` carries the rejection reason.
pub fn check_client_action(
    model: &HostModel,
    kind: ChannelKind,
    channel: &str,
    action: &StateAction,
    who: &Dispatcher<'_>,
) -> Result<(), String> {
    if let StateAction::Unknown(_) = action {
        return Err("unknown action type or malformed action payload".into());
    }
    if !who.role.can_write() {
        return Err("viewers may not dispatch actions".into());
    }
    if kind == ChannelKind::Terminal {
        return crate::device_terminals::check_terminal_action(model, channel, action, who);
    }
    if !is_client_dispatchable(action) {
        return Err(format!(
            "{} is a server action and cannot be dispatched by clients",
            action_type(action)
        ));
    }
    if family(action) != Some(kind) {
        return Err(format!(
            "{} does not apply to channel {channel}",
            action_type(action)
        ));
    }
    let size = serde_json::to_vec(action).map_or(usize::MAX, |json| json.len());
    if size > MAX_CLIENT_ACTION_BYTES {
        return Err(format!(
            "the action is {size} bytes; at most {MAX_CLIENT_ACTION_BYTES} are accepted"
        ));
    }
    check_message_kind(action)?;
    match kind {
        ChannelKind::Root => check_root(action, who),
        ChannelKind::Session => match model.sessions.get(channel) {
            Some(session) => {
                check_working_directories(model, &session.state, action)?;
                check_session(&session.state, action, who)
            }
            None => Err("unknown session".into()),
        },
        ChannelKind::Chat => match model.chats.get(channel) {
            Some(chat) => {
                if let StateAction::ChatWorkingDirectorySet(a) = action {
                    let session = model.sessions.get(&chat.session).map(|s| &s.state);
                    check_in_session_directories(session, std::slice::from_ref(&a.directory))?;
                }
                check_truncation_reach(chat, action)?;
                check_chat(&chat.state, action, who)
            }
            None => Err("unknown chat".into()),
        },
        ChannelKind::ResourceWatch => Err("a resource watch's changes come from the host only".into()),
        ChannelKind::Changeset => match (model.changesets.get(channel), action) {
            // Ids the changeset no longer lists are ignored by the reducer, as the spec says: a mark racing another
            // device's revert must not be rolled back whole.
            (Some(_), StateAction::ChangesetFilesReviewChanged(review)) if review.files.is_empty() => {
                Err("name the files to mark".into())
            }
            (Some(_), StateAction::ChangesetFilesReviewChanged(_)) => Ok(()),
            (Some(_), _) => Err("only review marks come from clients".into()),
            (None, _) => Err("unknown changeset".into()),
        },
        ChannelKind::Terminal | ChannelKind::Unknown => Err("unknown channel".into()),
    }
}

/// How far a client's timestamp may be from the host's clock.
pub const MAX_CLOCK_SKEW: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// A client's timestamp: ISO 8601 (RFC 3339) and within [`MAX_CLOCK_SKEW`] of the host's clock — a bad one
/// would freeze its chat (the reducers end a turn from its start) or pin it atop `listSessions`.
pub fn check_client_timestamp(field: &str, value: &str) -> Result<(), String> {
    let at: jiff::Timestamp = value
        .parse()
        .map_err(|_| format!("{field} must be an ISO 8601 timestamp, e.g. 2026-01-01T12:00:00.000Z"))?;
    let skew = jiff::Timestamp::now().duration_since(at).unsigned_abs();
    if skew > MAX_CLOCK_SKEW {
        return Err(format!(
            "{field} is {}s away from the host's clock (at most {}s are accepted)",
            skew.as_secs(),
            MAX_CLOCK_SKEW.as_secs()
        ));
    }
    Ok(())
}

/// A client's duration for a turn that started at `started_at`: not negative, and not longer than the turn
/// has run (plus the clock skew).
pub fn check_turn_duration(started_at: &str, duration_ms: i64) -> Result<(), String> {
    if duration_ms < 0 {
        return Err("duration must not be negative".into());
    }
    let ran = started_at
        .parse::<jiff::Timestamp>()
        .map(|start| jiff::Timestamp::now().duration_since(start).as_millis())
        .unwrap_or(i128::MAX);
    if i128::from(duration_ms) > ran.saturating_add(MAX_CLOCK_SKEW.as_millis() as i128) {
        return Err(format!(
            "duration {duration_ms} ms is longer than the turn has run"
        ));
    }
    Ok(())
}

/// A truncation to a turn the chat's state does not hold while some are archived: the turn is further back
/// than one operation loads (see `crate::history`), or does not exist.
fn check_truncation_reach(chat: &crate::model::ChatRecord, action: &StateAction) -> Result<(), String> {
    let StateAction::ChatTruncated(truncated) = action else {
        return Ok(());
    };
    match &truncated.turn_id {
        Some(turn_id) if chat.archived > 0 && !chat.state.turns.iter().any(|turn| &turn.id == turn_id) => {
            Err(format!(
                "turn {turn_id} is not among the chat's loaded turns: one truncation reaches back at most {} \
                 archived turns (and the reply budget in bytes)",
                crate::archive::MAX_LOADED_BACK
            ))
        }
        _ => Ok(()),
    }
}

/// Clients send only messages of kind `user` (turns, pending messages, drafts).
fn check_message_kind(action: &StateAction) -> Result<(), String> {
    let message = match action {
        StateAction::ChatTurnStarted(a) => Some(&a.message),
        StateAction::ChatPendingMessageSet(a) => Some(&a.message),
        StateAction::ChatDraftChanged(a) => a.draft.as_ref(),
        _ => None,
    };
    match message.map(|m| &m.origin.kind) {
        None | Some(MessageKind::User) => Ok(()),
        Some(kind) => Err(format!(
            "clients may only send user messages, not {}",
            serde_json::to_string(kind).unwrap_or_default()
        )),
    }
}

/// The working-directory capability of the agent of a session (`None`: it has one working directory).
pub fn working_directories_capability<'a>(
    model: &'a HostModel,
    session: &ahp_types::state::SessionState,
) -> Option<&'a MultipleWorkingDirectoriesCapability> {
    model
        .root
        .agents
        .iter()
        .find(|agent| agent.provider == session.provider)
        .and_then(|agent| agent.capabilities.as_ref())
        .and_then(|capabilities| capabilities.multiple_working_directories.as_ref())
}

/// A session's working-directory set may change only when its agent advertises
/// `multipleWorkingDirectories`, and an immutable primary (the first) is never removed or replaced.
fn check_working_directories(
    model: &HostModel,
    session: &ahp_types::state::SessionState,
    action: &StateAction,
) -> Result<(), String> {
    let touched = match action {
        StateAction::SessionWorkingDirectorySet(a) => Some(&a.directory),
        StateAction::SessionWorkingDirectoryRemoved(a) => Some(&a.directory),
        StateAction::SessionWorkingDirectoryReplaced(a) => Some(&a.directory),
        _ => None,
    };
    let Some(directory) = touched else {
        return Ok(());
    };
    let Some(capability) = working_directories_capability(model, session) else {
        return Err(format!(
            "the agent {} does not advertise multipleWorkingDirectories: the session's working directories cannot change",
            session.provider
        ));
    };
    let primary = session.working_directories.as_ref().and_then(|dirs| dirs.first());
    let changes_primary = !matches!(action, StateAction::SessionWorkingDirectorySet(_));
    // A replaceable primary slot is replaced, never removed (AHP: the host MUST reject the removal).
    if capability.primary_replacement == Some(true)
        && matches!(action, StateAction::SessionWorkingDirectoryRemoved(_))
        && primary == Some(directory)
    {
        return Err(format!(
            "{directory} is the session's primary working directory: replace it (session/workingDirectoryReplaced), never remove it"
        ));
    }
    if capability.immutable_primary == Some(true)
        && capability.primary_replacement != Some(true)
        && changes_primary
        && primary == Some(directory)
    {
        return Err(format!(
            "{directory} is the session's immutable primary working directory"
        ));
    }
    Ok(())
}

/// Directories a chat names must be working directories of its session.
pub fn check_in_session_directories(
    session: Option<&ahp_types::state::SessionState>,
    directories: &[String],
) -> Result<(), String> {
    let listed = session.and_then(|s| s.working_directories.as_ref());
    match directories
        .iter()
        .find(|d| !listed.is_some_and(|listed| listed.contains(d)))
    {
        Some(outside) => Err(format!("{outside} is not a working directory of the session")),
        None => Ok(()),
    }
}

fn check_root(action: &StateAction, who: &Dispatcher<'_>) -> Result<(), String> {
    match action {
        StateAction::RootConfigChanged(_) if who.role != Role::Admin => {
            Err("only admins may change host configuration".into())
        }
        _ => Ok(()),
    }
}

fn check_session(
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

fn check_chat(chat: &ChatState, action: &StateAction, who: &Dispatcher<'_>) -> Result<(), String> {
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

fn tool_call<'a>(chat: &'a ChatState, turn_id: &str, tool_call_id: &str) -> Option<&'a ToolCallState> {
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

fn check_tool_owner(
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

fn pending_input<'a>(
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

fn required_question(question: &ChatInputQuestion) -> Option<(&str, bool)> {
    Some(match question {
        ChatInputQuestion::Text(q) => (&q.id, q.required.unwrap_or(false)),
        ChatInputQuestion::Number(q) | ChatInputQuestion::Integer(q) => (&q.id, q.required.unwrap_or(false)),
        ChatInputQuestion::Boolean(q) => (&q.id, q.required.unwrap_or(false)),
        ChatInputQuestion::SingleSelect(q) => (&q.id, q.required.unwrap_or(false)),
        ChatInputQuestion::MultiSelect(q) => (&q.id, q.required.unwrap_or(false)),
        ChatInputQuestion::Unknown(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ahp_types::actions::SessionWorkingDirectorySetAction;
    use ahp_types::state::{AgentCapabilities, AgentInfo, RootState, SessionLifecycle, SessionState};

    fn model_with_agent(capabilities: Option<AgentCapabilities>) -> HostModel {
        let agent = AgentInfo {
            provider: "solo".into(),
            display_name: "Solo".into(),
            description: String::new(),
            models: vec![],
            protected_resources: None,
            customizations: None,
            capabilities,
        };
        let root = RootState {
            agents: vec![agent],
            active_sessions: None,
            terminals: None,
            config: None,
            meta: None,
        };
        let mut model = HostModel::new(root, 1);
        let session: SessionState = serde_json::from_value(serde_json::json!({
            "provider": "solo", "title": "", "status": 1, "lifecycle": "ready",
            "workingDirectories": ["file:///a"], "activeClients": [], "chats": []
        }))
        .expect("session state");
        assert_eq!(session.lifecycle, SessionLifecycle::Ready);
        model.insert_new_session(
            "ahp-session:/s".into(),
            session,
            "2026-01-01T00:00:00.000Z".into(),
        );
        model
    }

    fn add_directory() -> StateAction {
        StateAction::SessionWorkingDirectorySet(SessionWorkingDirectorySetAction {
            directory: "file:///b".into(),
        })
    }

    fn member() -> Dispatcher<'static> {
        Dispatcher {
            client_id: "c",
            role: Role::Member,
        }
    }

    #[test]
    fn a_replaceable_primary_is_replaced_never_removed() {
        let model = model_with_agent(Some(AgentCapabilities {
            multiple_working_directories: Some(MultipleWorkingDirectoriesCapability {
                immutable_primary: None,
                primary_replacement: Some(true),
            }),
            ..Default::default()
        }));
        let check = |action: StateAction| {
            check_client_action(&model, ChannelKind::Session, "ahp-session:/s", &action, &member())
        };
        let removed = check(StateAction::SessionWorkingDirectoryRemoved(
            ahp_types::actions::SessionWorkingDirectoryRemovedAction {
                directory: "file:///a".into(),
            },
        ));
        assert!(removed.is_err_and(|reason| reason.contains("never remove it")));
        let replaced = check(StateAction::SessionWorkingDirectoryReplaced(
            ahp_types::actions::SessionWorkingDirectoryReplacedAction {
                directory: "file:///a".into(),
                replacement: "file:///c".into(),
            },
        ));
        assert_eq!(replaced, Ok(()));
    }

    #[test]
    fn a_replacing_config_change_keeps_the_values_that_are_not_session_mutable() {
        let mut model = model_with_agent(None);
        let config: ahp_types::state::SessionConfigState = serde_json::from_value(serde_json::json!({
            "schema": {"type": "object", "properties": {
                "sandbox": {"type": "string", "title": "Sandbox"},
                "effort": {"type": "string", "title": "Effort", "sessionMutable": true}
            }},
            "values": {"sandbox": "strict", "effort": "low"}
        }))
        .expect("config");
        if let Some(session) = model.sessions.get_mut("ahp-session:/s") {
            session.state.config = Some(config);
        }
        let check = |config: serde_json::Value, replace: Option<bool>| {
            let config = serde_json::from_value(config).expect("values");
            let action = StateAction::SessionConfigChanged(ahp_types::actions::SessionConfigChangedAction {
                config,
                replace,
            });
            check_client_action(&model, ChannelKind::Session, "ahp-session:/s", &action, &member())
        };
        // Merging a mutable value, or replacing with the fixed one carried as it is: accepted.
        assert_eq!(check(serde_json::json!({"effort": "high"}), None), Ok(()));
        assert_eq!(
            check(
                serde_json::json!({"effort": "high", "sandbox": "strict"}),
                Some(true)
            ),
            Ok(())
        );
        // Replacing without it would wipe it; changing it is refused either way.
        assert!(check(serde_json::json!({"effort": "high"}), Some(true))
            .is_err_and(|reason| reason.contains("sandbox") && reason.contains("replacing")));
        assert!(check(serde_json::json!({"sandbox": "off"}), None)
            .is_err_and(|reason| reason.contains("sandbox")));
    }

    #[test]
    fn working_directories_change_only_for_agents_that_advertise_it() {
        let who = Dispatcher {
            client_id: "c",
            role: Role::Member,
        };
        let check = |model: &HostModel| {
            check_client_action(
                model,
                ChannelKind::Session,
                "ahp-session:/s",
                &add_directory(),
                &who,
            )
        };
        let single = model_with_agent(None);
        assert!(check(&single).is_err_and(|reason| reason.contains("multipleWorkingDirectories")));
        let multiple = model_with_agent(Some(AgentCapabilities {
            multiple_working_directories: Some(MultipleWorkingDirectoriesCapability::default()),
            ..Default::default()
        }));
        assert_eq!(check(&multiple), Ok(()));
    }
}
