//! The summaries clients list: a session's `SessionSummary` (its status aggregated over its chats) and a
//! chat's `ChatSummary`.

use ahp_types::state::{
    ChatState, ChatSummary, SessionChatSummary, SessionState, SessionStatus, SessionSummary,
};

/// The `SessionSummary` projection of a session.
pub fn summary_of(uri: &str, state: &SessionState, created_at: &str) -> SessionSummary {
    let (status, lead_activity) = aggregate_status(state);
    SessionSummary {
        provider: state.provider.clone(),
        title: state.title.clone(),
        status,
        activity: lead_activity.or_else(|| state.activity.clone()),
        origin: state.origin.clone(),
        project: state.project.clone(),
        working_directories: state.working_directories.clone(),
        annotations: state.annotations.clone(),
        resource: uri.to_string(),
        created_at: created_at.to_string(),
        modified_at: state
            .chats
            .iter()
            .map(|c| c.modified_at.as_str())
            .max()
            .unwrap_or(created_at)
            .to_string(),
        changes: None,
        meta: None,
        chats: Some(state.chats.iter().map(session_chat_summary).collect()),
        default_chat: state.default_chat.clone(),
    }
}

/// The activity bits of a status (`Idle`, `Error`, `InProgress`, `InputNeeded`: bits 0–4).
const ACTIVITY_BITS: u32 = 0b1_1111;

/// A session summary's status and activity, aggregated over its chats as AHP's `SessionSummary` says: the
/// activity bits of the default chat (else the most recently modified one), `InputNeeded` promoted when any
/// chat (or the session's own input queue) needs input, `Error` promoted when any chat is in error; the flag
/// bits (`IsRead`, `IsArchived`) stay the session's own.
pub fn aggregate_status(state: &SessionState) -> (u32, Option<String>) {
    let flags = state.status & !ACTIVITY_BITS;
    let lead = state
        .default_chat
        .as_ref()
        .and_then(|default| state.chats.iter().find(|c| &c.resource == default))
        .or_else(|| {
            state
                .chats
                .iter()
                .max_by(|a, b| a.modified_at.cmp(&b.modified_at))
        });
    let mut activity = lead.map_or(state.status & ACTIVITY_BITS, |chat| chat.status & ACTIVITY_BITS);
    let mut activity_text = lead.and_then(|chat| chat.activity.clone());
    let input = SessionStatus::InputNeeded.bits();
    let error = SessionStatus::Error.bits();
    let idle = SessionStatus::Idle.bits();
    let needing = state.chats.iter().find(|c| c.status & input == input);
    if needing.is_some() || state.status & input == input {
        // The text of the chat that drives the promoted status (none when the session's own queue does).
        if activity & input != input {
            activity_text = needing.and_then(|chat| chat.activity.clone());
        }
        // Promoted, it overrides the lead chat's activity bits (they are one state, not flags to combine).
        activity = input;
    }
    if let Some(failed) = state.chats.iter().find(|c| c.status & error != 0) {
        if activity & error == 0 {
            activity_text = failed.activity.clone();
        }
        activity = error;
    }
    if activity == 0 {
        activity = idle;
    }
    (flags | activity, activity_text)
}

fn session_chat_summary(chat: &ChatSummary) -> SessionChatSummary {
    SessionChatSummary {
        resource: chat.resource.clone(),
        title: chat.title.clone(),
        origin: chat.origin.clone(),
        interactivity: chat.interactivity,
        status: Some(chat.status),
        changes: chat.changes.clone(),
    }
}

/// The `ChatSummary` projection of a chat, as kept in its session's catalogue.
pub fn chat_summary_of(chat: &ChatState) -> ChatSummary {
    ChatSummary {
        resource: chat.resource.clone(),
        title: chat.title.clone(),
        status: chat.status,
        activity: chat.activity.clone(),
        modified_at: chat.modified_at.clone(),
        changes: chat.changes.clone(),
        origin: chat.origin.clone(),
        movable: chat.movable,
        interactivity: chat.interactivity,
        working_directories: chat.working_directories.clone(),
    }
}
