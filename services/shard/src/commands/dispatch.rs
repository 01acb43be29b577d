//! Actions entering the host: client `dispatchAction`s and agent output, and what follows an accepted one.
//!
//! A client action is validated ([`crate::validate`]), its attachments pinned ([`crate::commands::attachments`]),
//! reduced, sequenced and echoed with its origin; a refused one is echoed to its dispatcher alone with
//! `rejectionReason`. Accepted actions then drive the host's side effects, each in its module: the agent's
//! turns and queued messages ([`crate::commands::turns`]), the session's `inputNeeded` ([`crate::commands::input_needed`]), chat
//! and session summaries ([`crate::commands::summaries`]), and active clients ([`crate::host::active_clients`]).

use ahp::reducers::ReduceOutcome;
use ahp_types::actions::{ActionOrigin, StateAction};
use ahp_types::commands::DispatchActionParams;
use relay_core::bus::Audience;
use relay_core::link::CommandReply;
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::ConnectionId;
use relay_runner::Emitted;

use crate::host::HostCore;
use crate::model::{ChannelKind, SnapshotClock};
use crate::validate::{self, Dispatcher};

impl HostCore {
    pub(crate) fn dispatch_client_action(
        &mut self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> Result<CommandReply, RpcError> {
        let mut params: DispatchActionParams = message.parse_params()?;
        let client_id = self.client_id(connection)?;
        let role = self.connection(connection)?.identity.role;
        // A user's message names its author: the one who dispatched it, whatever the client claimed.
        let subject = self.connection(connection)?.identity.subject.clone();
        crate::commands::authorship::stamp(&mut params.action, &subject);
        // A viewer's presence is named by the host: its user, watching (no words of its own).
        if let (false, StateAction::SessionActiveClientSet(set)) = (role.can_write(), &mut params.action) {
            set.active_client.display_name = Some(format!("{subject} (watching)"));
        }
        let kind = self.model.kind(&params.channel);
        if kind == ChannelKind::Unknown {
            // Actions on channels the host does not have are ignored without an echo (digest §4).
            return crate::reply::reply(message.id, &());
        }
        let origin = ActionOrigin {
            client_id: client_id.clone(),
            client_seq: params.client_seq,
        };
        let who = Dispatcher {
            client_id: &client_id,
            role,
            subject: &subject,
        };
        let over_quota = crate::host::storage::grows_storage(&params.action)
            .then(|| self.storage_refusal())
            .flatten();
        let over_turn_limit = self.turn_limit_refusal(&params.channel, &params.action);
        // A message's chat attachments are pinned now (the accepted action carries the pinned turn).
        let pinned = crate::commands::attachments::pin_action(&self.model, &mut params.action);
        let checked = pinned
            .and_then(|()| {
                validate::check_client_action(&self.model, kind, &params.channel, &params.action, &who)
            })
            .and_then(|()| over_quota.map_or(Ok(()), Err))
            .and_then(|()| over_turn_limit.map_or(Ok(()), Err));
        // An operation that names a turn meets, on every subscriber, the turns the host has.
        if checked.is_ok() {
            match &params.action {
                StateAction::ChatTruncated(a) => {
                    if let Some(turn_id) = &a.turn_id {
                        self.fill_windows_to(&params.channel, turn_id);
                    }
                }
                StateAction::ChatTurnResume(a) => self.fill_windows_to(&params.channel, &a.turn_id),
                _ => {}
            }
        }
        let mut changed_state = false;
        let verdict = checked.and_then(|()| match self.model.reduce(&params.channel, &params.action) {
            ReduceOutcome::Invalid(error) => Err(error.to_string()),
            ReduceOutcome::OutOfScope => Err("action does not apply to this channel".into()),
            ReduceOutcome::Applied => {
                changed_state = true;
                Ok(())
            }
            ReduceOutcome::NoOp => Ok(()),
        });
        if let Err(reason) = verdict {
            let forbidden =
                crate::validate::refused_for_claim(&self.model, &params.channel, &params.action, &who)
                    .then(|| reason.clone());
            // The rejection goes to its dispatcher alone, and is owed to its clientId until a reconnect.
            if let Some(rejected) = self.seq.private(
                connection,
                &params.channel,
                &params.action,
                Some(origin),
                Some(reason),
            ) {
                self.owed.owe(&client_id, rejected);
            }
            // Sent as a request, a permission refusal is also answered as one.
            if let (Some(reason), Some(_)) = (forbidden, &message.id) {
                return Err(RpcError::permission_denied(reason));
            }
            return crate::reply::reply(message.id, &());
        }
        // A member's title is final (the agent's later naming is dropped): the mark is sequenced just before the
        // title itself, so the title stays the last word a client reads of the change.
        if let StateAction::SessionTitleChanged(_) = &params.action {
            self.mark_titled_by_user(&params.channel);
        }
        // What a device types into a terminal (passwords too) is echoed to it alone and never logged: the
        // terminal's output is what every device sees.
        if let StateAction::TerminalInput(_) = &params.action {
            if let Some(echo) =
                self.seq
                    .private(connection, &params.channel, &params.action, Some(origin), None)
            {
                self.owed.owe(&client_id, echo);
            }
            self.after_action(&params.channel, kind, &params.action);
            return crate::reply::reply(message.id, &());
        }
        // The dispatcher always gets its echo, subscribed to the channel or not (it may answer an input
        // request on a chat it never subscribed to).
        let subscribed = self
            .connections
            .get(&connection)
            .is_some_and(|state| state.subscriptions.contains(&params.channel));
        let audience = if subscribed {
            Audience::Subscribers
        } else {
            Audience::SubscribersAnd(connection)
        };
        let echo = self
            .seq
            .accept_for(&params.channel, &params.action, Some(origin), audience);
        if let (false, Some(echo)) = (subscribed, echo) {
            self.owed.owe(&client_id, echo);
        }
        self.after_action(&params.channel, kind, &params.action);
        // Who answered a question is said, after the answer.
        if let (StateAction::ChatInputCompleted(completed), true) = (&params.action, changed_state) {
            self.note_answer(&params.channel, completed, &subject);
        }
        // A notification gets nothing; the same call sent as a request (with an id) gets an empty result.
        crate::reply::reply(message.id, &())
    }

    /// An agent's action: [`Emitted::Gone`] when its channel is gone, [`Emitted::NotApplied`] when it does not
    /// apply (its turn ended, a clear took its command) or the tenant is over its storage quota and the action
    /// would add content: then the chat's running turn ends with a `chat/error` naming the quota (which stops
    /// the agent's turn).
    pub(crate) fn apply_agent_action(&mut self, channel: &str, mut action: StateAction) -> Emitted {
        let kind = self.model.kind(channel);
        // An agent replaces the `_meta` it keeps; what the host keeps there stays.
        if let StateAction::SessionMetaChanged(changed) = &mut action {
            crate::model::session_meta::keep_host_keys(&self.model, channel, changed);
        }
        // A title a user chose is final: the agent's naming is dropped.
        if matches!(action, StateAction::SessionTitleChanged(_))
            && crate::commands::titles::titled_by_user(&self.model, channel)
        {
            return Emitted::NotApplied;
        }
        // Large inline content goes to the store, named by reference ([`crate::workspace::content_refs`]) — stored only
        // with an action that is applied.
        let session = crate::workspace::content_refs::may_carry(&action)
            .then(|| self.model.chats.get(channel).map(|chat| chat.session.clone()))
            .flatten();
        let contents = match session {
            Some(session) => {
                crate::workspace::content_refs::extract(&mut action, &session, self.limits.content_ref_bytes)
            }
            None => Vec::new(),
        };
        if kind == ChannelKind::Unknown {
            return Emitted::Gone;
        }
        if crate::host::storage::agent_grows_storage(&action) {
            if let Some(refusal) = self.storage_refusal() {
                if kind == ChannelKind::Chat {
                    self.end_turn_over_quota(channel, &refusal);
                }
                return Emitted::NotApplied;
            }
        }
        let emitted = self.apply_server_action_as(channel, action);
        if emitted.applied() {
            for content in contents {
                self.seq.content(content);
            }
        }
        emitted
    }

    /// End `chat`'s running turn: its agent's output no longer fits the tenant's storage quota.
    pub(crate) fn end_turn_over_quota(&mut self, chat: &str, refusal: &str) {
        let Some((turn_id, started_at)) = self
            .model
            .chats
            .get(chat)
            .and_then(|record| record.state.active_turn.as_ref())
            .map(|turn| (turn.id.clone(), turn.started_at.clone()))
        else {
            return;
        };
        let duration = jiff::Timestamp::now()
            .as_millisecond()
            .saturating_sub(
                started_at
                    .parse::<jiff::Timestamp>()
                    .map(|t| t.as_millisecond())
                    .unwrap_or(0),
            )
            .max(0);
        tracing::warn!(host = %self.key, %chat, "a turn's output no longer fits the tenant's storage quota; ending it");
        let error = StateAction::ChatError(ahp_types::actions::ChatErrorAction {
            turn_id,
            duration,
            part: ahp_types::state::ErrorResponsePart {
                error: ahp_types::state::ErrorInfo {
                    error_type: "storageQuota".into(),
                    message: format!("The agent's output was stopped: {refusal}"),
                    stack: None,
                    meta: None,
                },
                resumable: Some(false),
            },
            meta: None,
        });
        self.apply_server_action(chat, error);
    }

    /// Reduce, sequence and publish a server action, then run its side effects. Actions that do not apply to
    /// the current state are dropped rather than sequenced.
    pub(crate) fn apply_server_action(&mut self, channel: &str, action: StateAction) -> bool {
        self.apply_server_action_as(channel, action).applied()
    }

    /// Set one key of `session`'s `_meta` (the others kept), as a server `session/metaChanged`.
    pub(crate) fn set_session_meta(&mut self, session: &str, key: &str, value: serde_json::Value) {
        let mut meta = self
            .model
            .sessions
            .get(session)
            .and_then(|record| record.state.meta.clone())
            .unwrap_or_default();
        meta.insert(key.into(), value);
        self.apply_server_action(
            session,
            StateAction::SessionMetaChanged(ahp_types::actions::SessionMetaChangedAction {
                meta: Some(meta),
            }),
        );
    }

    /// [`HostCore::apply_server_action`], saying whether the action did not apply or its channel is gone.
    pub(crate) fn apply_server_action_as(&mut self, channel: &str, action: StateAction) -> Emitted {
        let kind = self.model.kind(channel);
        match self.model.reduce(channel, &action) {
            ReduceOutcome::Applied => {}
            ReduceOutcome::OutOfScope => {
                tracing::debug!(%channel, "server action for a channel that is gone: dropped");
                return Emitted::Gone;
            }
            outcome => {
                tracing::debug!(%channel, ?outcome, "server action dropped");
                return Emitted::NotApplied;
            }
        }
        self.seq.accept(channel, &action, None);
        self.after_action(channel, kind, &action);
        Emitted::Applied
    }

    /// Side effects of an accepted action.
    pub(crate) fn after_action(&mut self, channel: &str, kind: ChannelKind, action: &StateAction) {
        if kind == ChannelKind::Chat {
            self.sync_archived(channel);
            self.age_turns_after(channel, action);
        }
        self.maybe_snapshot(channel);
        match kind {
            ChannelKind::Chat => {
                self.chat_side_effects(channel, action);
                if crate::commands::input_needed::affects_input_needed(action) {
                    self.sync_input_needed(channel);
                }
                self.sync_chat_summary(channel);
            }
            ChannelKind::Session => {
                match action {
                    StateAction::SessionWorkingDirectoryRemoved(removed) => {
                        self.remove_chats_directory(channel, &removed.directory);
                    }
                    // The replaced entry leaves the session: the chats that listed it take its replacement.
                    StateAction::SessionWorkingDirectoryReplaced(replaced)
                        if replaced.directory != replaced.replacement =>
                    {
                        let holders = self.remove_chats_directory(channel, &replaced.directory);
                        for chat in holders {
                            self.apply_server_action(
                                &chat,
                                StateAction::ChatWorkingDirectorySet(
                                    ahp_types::actions::ChatWorkingDirectorySetAction {
                                        directory: replaced.replacement.clone(),
                                    },
                                ),
                            );
                        }
                    }
                    _ => {}
                }
                self.sync_session_summary(channel);
            }
            // Root actions are rare (configuration): each one stores the root's document, so a restart
            // restores it however long ago it changed (its log rows may be compacted away).
            ChannelKind::Root => self.store_snapshot(channel),
            // A terminal's lifecycle is listed in root state.
            ChannelKind::Terminal => {
                self.terminal_side_effects(channel, action);
                self.sync_terminal_list();
            }
            // Changes are sent to the watch's connection alone ([`crate::workspace::watches`]), never sequenced here.
            ChannelKind::ResourceWatch | ChannelKind::Unknown => {}
            // Review marks are stored with the changeset at once (its channel may be closed any time).
            ChannelKind::Changeset => {
                if matches!(action, StateAction::ChangesetFilesReviewChanged(_)) {
                    self.store_snapshot(channel);
                }
            }
        }
    }

    /// A directory left the session: its chats that listed it lose it too (a chat's directories are a subset
    /// of its session's). Returns those chats.
    pub(crate) fn remove_chats_directory(&mut self, session: &str, directory: &str) -> Vec<String> {
        let chats: Vec<String> = self
            .model
            .chats
            .iter()
            .filter(|(_, chat)| {
                chat.session == session
                    && chat
                        .state
                        .working_directories
                        .as_ref()
                        .is_some_and(|directories| directories.iter().any(|d| d == directory))
            })
            .map(|(uri, _)| uri.clone())
            .collect();
        for chat in &chats {
            self.apply_server_action(
                chat,
                StateAction::ChatWorkingDirectoryRemoved(
                    ahp_types::actions::ChatWorkingDirectoryRemovedAction {
                        directory: directory.to_string(),
                    },
                ),
            );
        }
        chats
    }

    /// Keep `archived` in step with the chat state's cursor (turns loaded back, or the chat truncated); once
    /// the state holds every turn, the archive row goes.
    pub(crate) fn sync_archived(&mut self, chat: &str) {
        let Some(record) = self.model.chats.get_mut(chat) else {
            return;
        };
        let first = crate::model::archive::first_held(&record.state);
        if first == record.archived {
            return;
        }
        record.archived = first;
        if first == 0 {
            self.seq.forget(&crate::model::archive::key(chat));
            self.seq.forget(&crate::model::archive::legacy_key(chat));
            self.store_snapshot(chat);
        }
    }

    /// Store a channel's snapshot when enough actions or time went by since the last one.
    pub(crate) fn maybe_snapshot(&mut self, channel: &str) {
        let (every_actions, every) = (self.limits.snapshot_every_actions, self.limits.snapshot_every);
        let Some(clock) = self.model.clock_mut(channel) else {
            return;
        };
        clock.actions_since += 1;
        if clock.actions_since >= every_actions || clock.taken_at.elapsed() >= every {
            self.store_snapshot(channel);
        }
    }

    /// Queue a snapshot of `channel` at the current `serverSeq` for the next commit.
    pub(crate) fn store_snapshot(&mut self, channel: &str) {
        let Some((parent, document)) = self.model.document(channel) else {
            return;
        };
        self.seq.snapshot(channel, parent.as_deref(), document);
        if let Some(clock) = self.model.clock_mut(channel) {
            *clock = SnapshotClock::fresh();
        }
    }
}
