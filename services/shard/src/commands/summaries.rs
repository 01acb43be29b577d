//! Chat and session summaries kept in step with their states: the session's chat list and the root
//! catalogue (`session/chatUpdated`, `root/sessionSummaryChanged`), and their stored copies.

use ahp_types::actions::PartialChatSummary;
use ahp_types::actions::{SessionChatUpdatedAction, StateAction};
use ahp_types::notifications::{PartialSessionSummary, SessionSummaryChangedParams};
use ahp_types::ROOT_RESOURCE_URI;

use crate::host::HostCore;
use crate::model::{chat_summary_of, summary_of};
use relay_store::CatalogChange;

impl HostCore {
    /// Keep the session's chat catalogue in step with the chat's own state (`session/chatUpdated`).
    pub(crate) fn sync_chat_summary(&mut self, chat: &str) {
        let Some(record) = self.model.chats.get(chat) else {
            return;
        };
        let current = chat_summary_of(&record.state);
        let session = record.session.clone();
        let Some(listed) = self
            .model
            .sessions
            .get(&session)
            .and_then(|s| s.state.chats.iter().find(|c| c.resource == chat))
        else {
            return;
        };
        if *listed == current {
            return;
        }
        let changes = PartialChatSummary {
            resource: None,
            title: (listed.title != current.title).then(|| current.title.clone()),
            status: (listed.status != current.status).then_some(current.status),
            activity: (listed.activity != current.activity)
                .then(|| current.activity.clone())
                .flatten(),
            modified_at: (listed.modified_at != current.modified_at).then(|| current.modified_at.clone()),
            changes: (listed.changes != current.changes)
                .then(|| current.changes.clone())
                .flatten(),
            origin: None,
            movable: (listed.movable != current.movable)
                .then_some(current.movable)
                .flatten(),
            interactivity: None,
            working_directories: (listed.working_directories != current.working_directories)
                .then(|| current.working_directories.clone())
                .flatten(),
        };
        // A partial summary cannot clear a field (omitted means unchanged): when one was cleared (an activity
        // ended, say), the whole summary replaces the listed one in place (`session/chatAdded` of a listed
        // chat), so both representations stay the same (AHP: producers MUST keep them consistent).
        let mut updated = listed.clone();
        apply_partial_summary(&mut updated, &changes);
        let action = if updated == current {
            StateAction::SessionChatUpdated(SessionChatUpdatedAction {
                chat: chat.to_string(),
                changes,
            })
        } else {
            StateAction::SessionChatAdded(ahp_types::actions::SessionChatAddedAction { summary: current })
        };
        self.apply_server_action(&session, action);
    }

    /// Announce a changed session summary with `root/sessionSummaryChanged` — or, when a field was cleared
    /// (an activity ended, say: a partial summary can only set fields), with `root/sessionAdded` of the whole
    /// summary, which replaces the listed one, so `listSessions` and every root subscriber agree.
    pub(crate) fn sync_session_summary(&mut self, session: &str) {
        let Some(record) = self.model.sessions.get_mut(session) else {
            return;
        };
        let current = summary_of(session, &record.state, &record.created_at);
        let before = std::mem::replace(&mut record.announced, current.clone());
        if before == current {
            return;
        }
        let (catalog_no, created_at) = (record.catalog_no, record.created_at.clone());
        self.store_session_summary(session, catalog_no, &created_at, &current);
        let cleared = (before.activity.is_some() && current.activity.is_none())
            || (before.working_directories.is_some() && current.working_directories.is_none())
            || (before.chats.is_some() && current.chats.is_none())
            || (before.default_chat.is_some() && current.default_chat.is_none());
        if cleared {
            self.seq.notify(
                ROOT_RESOURCE_URI,
                "root/sessionAdded",
                &ahp_types::notifications::SessionAddedParams {
                    channel: ROOT_RESOURCE_URI.into(),
                    summary: current,
                },
            );
            return;
        }
        let changes = PartialSessionSummary {
            provider: None,
            title: (before.title != current.title).then(|| current.title.clone()),
            status: (before.status != current.status).then_some(current.status),
            activity: (before.activity != current.activity)
                .then(|| current.activity.clone())
                .flatten(),
            origin: None,
            project: None,
            working_directories: (before.working_directories != current.working_directories)
                .then(|| current.working_directories.clone())
                .flatten(),
            annotations: None,
            resource: None,
            created_at: None,
            modified_at: (before.modified_at != current.modified_at).then(|| current.modified_at.clone()),
            changes: None,
            meta: None,
            chats: (before.chats != current.chats)
                .then(|| current.chats.clone())
                .flatten(),
            default_chat: (before.default_chat != current.default_chat)
                .then(|| current.default_chat.clone())
                .flatten(),
        };
        self.seq.notify(
            ROOT_RESOURCE_URI,
            "root/sessionSummaryChanged",
            &SessionSummaryChangedParams {
                channel: ROOT_RESOURCE_URI.into(),
                session: session.to_string(),
                changes,
            },
        );
    }

    /// Queue the catalogue entry of a session (its summary as `listSessions` returns it).
    pub(crate) fn store_session_summary(
        &mut self,
        uri: &str,
        catalog_no: u64,
        created_at: &str,
        summary: &ahp_types::state::SessionSummary,
    ) {
        match serde_json::to_string(summary) {
            Ok(json) => self.seq.catalog(CatalogChange::Upsert {
                uri: uri.to_string(),
                catalog_no,
                created_at: created_at.to_string(),
                modified_at: summary.modified_at.clone(),
                summary: json,
            }),
            Err(error) => tracing::error!(%uri, %error, "could not serialize a session summary"),
        }
    }
}

/// What `session/chatUpdated` with `changes` makes of `summary` — the fields the `ahp` reducer merges, as it
/// merges them (a field present replaces; none is ever cleared).
fn apply_partial_summary(summary: &mut ahp_types::state::ChatSummary, changes: &PartialChatSummary) {
    if let Some(title) = &changes.title {
        summary.title = title.clone();
    }
    if let Some(status) = changes.status {
        summary.status = status;
    }
    if let Some(activity) = &changes.activity {
        summary.activity = Some(activity.clone());
    }
    if let Some(modified_at) = &changes.modified_at {
        summary.modified_at = modified_at.clone();
    }
    if let Some(diff) = &changes.changes {
        summary.changes = Some(diff.clone());
    }
    if let Some(origin) = &changes.origin {
        summary.origin = Some(origin.clone());
    }
    if let Some(directories) = &changes.working_directories {
        summary.working_directories = Some(directories.clone());
    }
}
