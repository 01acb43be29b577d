//! The entry of validation: one client action against the host's state, sent to the check of its channel.

use ahp_types::actions::StateAction;

use super::channels::*;
use super::dispatcher::*;
use super::fields::*;
use super::terminal::*;
use crate::model::{ChannelKind, HostModel};

/// A viewer may say it is watching a session (itself as an active client, offering no tools, once: not while
/// it is listed already) and leave it: every device then lists who is watching. The host names it
/// (`<sub> (watching)`, see `commands::dispatch`), so it carries nothing of the viewer's own but its clientId.
/// Nothing else a viewer dispatches is accepted.
fn is_viewer_presence(model: &HostModel, channel: &str, action: &StateAction, who: &Dispatcher<'_>) -> bool {
    match action {
        StateAction::SessionActiveClientSet(a) => {
            let listed = model.sessions.get(channel).is_some_and(|session| {
                session
                    .state
                    .active_clients
                    .iter()
                    .any(|c| c.client_id == who.client_id)
            });
            a.active_client.client_id == who.client_id
                && !listed
                && a.active_client.tools.is_empty()
                && a.active_client
                    .customizations
                    .as_ref()
                    .is_none_or(|c| c.is_empty())
        }
        StateAction::SessionActiveClientRemoved(a) => a.client_id == who.client_id,
        _ => false,
    }
}

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
    if !who.role.can_write() && !is_viewer_presence(model, channel, action, who) {
        return Err("viewers may not dispatch actions".into());
    }
    if kind == ChannelKind::Terminal {
        return check_terminal_action(model, channel, action, who);
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
