//! Lazy restore: a session (with its chats) is loaded from the store the first time a message names it.
//!
//! A channel is restored from its latest snapshot plus the log rows after it, reduced with the `ahp`
//! reducers. Untouched sessions are never loaded, so they cost no memory. A turn that was running when the
//! process died is closed as a resumable `chat/error` (its partial content is kept).

use ahp::reducers::{apply_action_to_chat, apply_action_to_session, apply_action_to_terminal};
use ahp_types::actions::{ChatErrorAction, StateAction, TerminalExitedAction};
use ahp_types::state::{ErrorInfo, ErrorResponsePart, TerminalLifecycleState, Turn};
use relay_store::ChannelRecord;

use crate::error::ShardError;
use crate::host::preload::tail;
use serde::Deserialize;

use crate::host::{Host, HostCore};
use crate::model::{
    ChannelKind, ChatDocument, ChatRecord, SessionDocument, SnapshotClock, TerminalDocument, TerminalRecord,
    TERMINAL_SCHEME,
};

/// A session and its chats as read from the store, not yet reduced.
struct LoadedSession {
    uri: String,
    session: ChannelRecord,
    /// Each chat, with the single-row turn archive of an earlier release when it still has one (to move into
    /// rows; `None` also when that row is unreadable: it stays in the store for an operator to look at).
    chats: Vec<(String, ChannelRecord, Option<Vec<Turn>>)>,
    /// The agents' terminals of the session.
    terminals: Vec<(String, ChannelRecord)>,
    /// Its changesets that were open (their review marks).
    changesets: Vec<(String, ChannelRecord)>,
}

impl Host {
    /// Make sure every named session or chat that exists in the store is in memory; returns the sessions this
    /// call loaded.
    pub(crate) async fn ensure_loaded(&self, channels: &[String]) -> Result<Vec<String>, ShardError> {
        let mut loaded = Vec::new();
        for channel in channels {
            let disposing = {
                let core = self.core.lock();
                if core.model.kind(channel) != ChannelKind::Unknown {
                    continue;
                }
                core.disposing.get(channel).copied()
            };
            if let Some(barrier) = disposing {
                // Disposed, but the store may still hold it until that batch commits: read it only after.
                self.wait_committed(barrier).await;
            }
            let Some(session) = self.read_session_of(channel).await? else {
                continue;
            };
            let uri = session.uri.clone();
            if self.with_core(|core| core.install(session)) {
                loaded.push(uri);
            }
        }
        Ok(loaded)
    }

    /// Read the session that `channel` is (or belongs to), with all its chats.
    async fn read_session_of(&self, channel: &str) -> Result<Option<LoadedSession>, ShardError> {
        let (tenant, host) = (&self.key.tenant, &self.key.host);
        let Some(record) = self.store.load_channel(tenant, host, channel).await? else {
            return Ok(None);
        };
        let (uri, session) = if channel.starts_with("ahp-chat:")
            || channel.starts_with(TERMINAL_SCHEME)
            || channel.starts_with(crate::model::changeset_uris::CHANGESET_SCHEME)
        {
            #[derive(Deserialize)]
            struct Parent {
                session: String,
            }
            let parent: Parent = serde_json::from_str(&record.state).map_err(ShardError::corrupt)?;
            match self.store.load_channel(tenant, host, &parent.session).await? {
                Some(session) => (parent.session, session),
                None => return Ok(None),
            }
        } else {
            (channel.to_string(), record)
        };
        let mut chats = Vec::new();
        let mut terminals = Vec::new();
        let mut changesets = Vec::new();
        for chat in self.store.chats_of(tenant, host, &uri).await? {
            if chat.starts_with(crate::model::changeset_uris::CHANGESET_SCHEME) {
                if let Some(record) = self.store.load_channel(tenant, host, &chat).await? {
                    changesets.push((chat, record));
                }
                continue;
            }
            if chat.starts_with(TERMINAL_SCHEME) {
                if let Some(record) = self.store.load_channel(tenant, host, &chat).await? {
                    terminals.push((chat, record));
                }
                continue;
            }
            if let Some(record) = self.store.load_channel(tenant, host, &chat).await? {
                let legacy = match crate::model::archive::read_legacy(&self.store, &self.key, &chat).await {
                    Ok(legacy) => legacy,
                    // An unreadable archive costs the chat its old turns' paging, never the whole session.
                    Err(error @ ShardError::Corrupt(_)) => {
                        tracing::error!(%chat, %error, "unreadable turn archive; loading the chat without it");
                        None
                    }
                    Err(error) => return Err(error),
                };
                chats.push((chat, record, legacy));
            }
        }
        Ok(Some(LoadedSession {
            uri: uri.to_string(),
            session,
            chats,
            terminals,
            changesets,
        }))
    }
}

impl HostCore {
    /// Reduce a loaded session into memory (unless another call installed it meanwhile); whether it did.
    fn install(&mut self, loaded: LoadedSession) -> bool {
        if self.model.kind(&loaded.uri) != ChannelKind::Unknown {
            return false;
        }
        let doc: SessionDocument = match serde_json::from_str(&loaded.session.state) {
            Ok(doc) => doc,
            Err(error) => {
                tracing::error!(session = %loaded.uri, %error, "unreadable session snapshot");
                return false;
            }
        };
        let mut state = doc.state;
        for envelope in tail(&loaded.session) {
            apply_action_to_session(&mut state, &envelope.action);
        }
        self.model
            .insert_session(loaded.uri.clone(), state, doc.created_at, doc.catalog_no);
        if let Some(session) = self.model.sessions.get_mut(&loaded.uri) {
            session.created_by = doc.created_by;
        }
        self.install_terminals(loaded.terminals);
        self.install_changesets(loaded.changesets);
        let mut interrupted = Vec::new();
        for (uri, record, legacy) in loaded.chats {
            let doc: ChatDocument = match serde_json::from_str(&record.state) {
                Ok(doc) => doc,
                Err(error) => {
                    tracing::error!(chat = %uri, %error, "unreadable chat snapshot");
                    continue;
                }
            };
            let mut state = doc.state;
            for envelope in tail(&record) {
                apply_action_to_chat(&mut state, &envelope.action);
            }
            if let Some(turn) = state.active_turn.as_mut() {
                // A start time the reducers cannot read (stored before client timestamps were checked) would
                // make every end of the turn invalid, the chat in progress for good: the host's state takes its
                // own clock instead.
                if turn.started_at.parse::<jiff::Timestamp>().is_err() {
                    tracing::warn!(chat = %uri, started_at = %turn.started_at, "an unreadable turn start; using now");
                    turn.started_at = format!("{:.3}", jiff::Timestamp::now());
                }
                interrupted.push((uri.clone(), turn.id.clone(), turn.started_at.clone()));
            }
            let mut archived = crate::model::archive::first_held(&state);
            let mut rewritten = false;
            if let Some(legacy) = legacy {
                // An earlier release's single-row archive becomes rows (the row goes in the same batch). Only
                // its first `archived` turns count: the rest were loaded back into state.
                archived = archived.min(legacy.len());
                state.turns_next_cursor = crate::model::archive::cursor_before(archived);
                self.seq.forget(&crate::model::archive::key(&uri));
                self.seq.forget(&crate::model::archive::legacy_key(&uri));
                let moved = legacy.into_iter().take(archived).enumerate().collect();
                self.archive_turns(&uri, moved);
                rewritten = true;
            }
            // A restored chat holds exactly its retained turns (in count and in bytes).
            let mut turn_sizes = crate::model::TurnSizes::default();
            let sizes = turn_sizes.of(&state.turns);
            let keep = crate::model::archive::retained_count(
                &sizes,
                self.limits.retained_turns,
                self.limits.retained_turn_bytes,
            );
            let moved = crate::model::archive::age(&mut state, archived, keep, 0);
            if !moved.is_empty() {
                archived += moved.len();
                self.archive_turns(&uri, moved);
                rewritten = true;
            }
            let agent_context = crate::model::agent_context::AgentContext::at_restore(&state);
            self.model.chats.insert(
                uri.clone(),
                ChatRecord {
                    session: doc.session,
                    agent_context,
                    turn_sizes,
                    state,
                    running: None,
                    clock: SnapshotClock::fresh(),
                    archived,
                    created_by: doc.created_by,
                },
            );
            if rewritten {
                // The stored chat must stop carrying the turns that moved to the archive (same batch).
                self.store_snapshot(&uri);
            }
        }
        for (chat, turn_id, started_at) in interrupted {
            let duration = jiff::Timestamp::now()
                .as_millisecond()
                .saturating_sub(
                    started_at
                        .parse::<jiff::Timestamp>()
                        .map(|t| t.as_millisecond())
                        .unwrap_or(0),
                )
                .max(0);
            self.apply_server_action(
                &chat,
                StateAction::ChatError(ChatErrorAction {
                    turn_id,
                    duration,
                    part: ErrorResponsePart {
                        error: ErrorInfo {
                            error_type: "interrupted".into(),
                            message:
                                "The relay restarted while this turn was running; resume it to continue."
                                    .into(),
                            stack: None,
                            meta: None,
                        },
                        resumable: Some(true),
                    },
                    meta: None,
                }),
            );
        }
        // A session whose agent was still starting when the process stopped (or the host moved) will never
        // hear back from that start: it fails, saying why, instead of staying `creating` for good.
        let creating =
            self.model.sessions.get(&loaded.uri).is_some_and(|session| {
                session.state.lifecycle == ahp_types::state::SessionLifecycle::Creating
            });
        if creating {
            self.apply_server_action(
                &loaded.uri,
                StateAction::SessionCreationFailed(ahp_types::actions::SessionCreationFailedAction {
                    error: ErrorInfo {
                        error_type: "interrupted".into(),
                        message:
                            "The relay restarted (or the session's host moved) while its agent was starting; \
                                  create the session again."
                                .into(),
                        stack: None,
                        meta: None,
                    },
                }),
            );
        }
        true
    }
}

impl HostCore {
    /// Reduce a session's stored changesets into memory: their files and review marks as they were (computed
    /// again when a client next opens one).
    fn install_changesets(&mut self, changesets: Vec<(String, ChannelRecord)>) {
        let mut interrupted = Vec::new();
        for (uri, record) in changesets {
            let doc: crate::model::ChangesetDocument = match serde_json::from_str(&record.state) {
                Ok(doc) => doc,
                Err(error) => {
                    tracing::error!(changeset = %uri, %error, "unreadable changeset snapshot");
                    continue;
                }
            };
            let mut state = doc.state;
            for envelope in tail(&record) {
                ahp::reducers::apply_action_to_changeset(&mut state, &envelope.action);
            }
            // An operation running when the process stopped did not finish here.
            for operation in state.operations.iter().flatten() {
                if operation.status == ahp_types::state::ChangesetOperationStatus::Running {
                    interrupted.push((uri.clone(), operation.id.clone()));
                }
            }
            self.model.changesets.insert(
                uri,
                crate::model::ChangesetRecord {
                    session: doc.session,
                    scope: doc.scope,
                    state,
                    clock: SnapshotClock::fresh(),
                },
            );
        }
        for (uri, operation_id) in interrupted {
            self.apply_server_action(
                &uri,
                StateAction::ChangesetOperationStatusChanged(
                    ahp_types::actions::ChangesetOperationStatusChangedAction {
                        operation_id,
                        status: ahp_types::state::ChangesetOperationStatus::Error,
                        error: Some(ahp_types::state::ErrorInfo {
                            error_type: "interrupted".into(),
                            message: "The relay stopped while this ran; look at the files and run it again."
                                .into(),
                            stack: None,
                            meta: None,
                        }),
                    },
                ),
            );
        }
    }

    /// Reduce a session's stored terminals into memory. A device's terminal still running is taken over from the
    /// provider that runs it ([`HostCore::adopt_terminals`]); an agent's command running when the process died
    /// (its agent died with it, or with its runner's stream) is marked exited, without an exit code.
    fn install_terminals(&mut self, terminals: Vec<(String, ChannelRecord)>) {
        let mut interrupted = Vec::new();
        let mut adopting = Vec::new();
        for (uri, record) in terminals {
            let doc: TerminalDocument = match serde_json::from_str(&record.state) {
                Ok(doc) => doc,
                Err(error) => {
                    tracing::error!(terminal = %uri, %error, "unreadable terminal snapshot");
                    continue;
                }
            };
            let mut state = doc.state;
            for envelope in tail(&record) {
                apply_action_to_terminal(&mut state, &envelope.action);
            }
            if matches!(state.lifecycle, TerminalLifecycleState::Running(_)) {
                match &doc.device {
                    Some(device) => adopting.push((uri.clone(), doc.session.clone(), device.clone())),
                    None => interrupted.push(uri.clone()),
                }
            }
            self.model.terminals.insert(
                uri,
                TerminalRecord {
                    session: doc.session,
                    state,
                    clock: SnapshotClock::fresh(),
                    device: doc.device,
                },
            );
        }
        for uri in interrupted {
            self.apply_server_action(
                &uri,
                StateAction::TerminalExited(TerminalExitedAction { exit_code: None }),
            );
        }
        self.sync_terminal_list();
        // Terminals stored by a release that did not name them in their sessions are named now.
        self.sync_session_terminals();
        self.adopt_terminals(adopting);
    }
}
