//! Checks of single fields clients send: timestamps, turn durations, message kinds, working directories, how
//! far back a truncation reaches.

use ahp_types::actions::StateAction;
use ahp_types::state::{MessageKind, MultipleWorkingDirectoriesCapability};

use crate::model::HostModel;

/// Largest client action accepted, serialized (a chat's state grows by what its actions carry).
pub const MAX_CLIENT_ACTION_BYTES: usize = 1024 * 1024;
/// Queued messages one chat may hold.
pub const MAX_QUEUED_MESSAGES: usize = 64;
/// Working directories one session may list.
pub const MAX_WORKING_DIRECTORIES: usize = 64;

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
/// than one operation loads (see `crate::replay::history`), or does not exist.
pub(super) fn check_truncation_reach(
    chat: &crate::model::ChatRecord,
    action: &StateAction,
) -> Result<(), String> {
    let StateAction::ChatTruncated(truncated) = action else {
        return Ok(());
    };
    match &truncated.turn_id {
        Some(turn_id) if chat.archived > 0 && !chat.state.turns.iter().any(|turn| &turn.id == turn_id) => {
            Err(format!(
                "turn {turn_id} is not among the chat's loaded turns: one truncation reaches back at most {} \
                 archived turns (and the reply budget in bytes)",
                crate::model::archive::MAX_LOADED_BACK
            ))
        }
        _ => Ok(()),
    }
}

/// Clients send only messages of kind `user` (turns, pending messages, drafts).
pub(super) fn check_message_kind(action: &StateAction) -> Result<(), String> {
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
pub(super) fn check_working_directories(
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
