//! Actions entering the host: client `dispatchAction`s and agent output, and the host's side effects.
//!
//! A client action is validated ([`crate::validate`]), reduced, sequenced and echoed with its origin; a refused
//! one is echoed to its dispatcher alone with `rejectionReason`. Accepted actions then drive the host's side
//! effects: starting and steering provider turns, draining queued messages, keeping chat and session summaries
//! in step, and releasing active clients.

use ahp::reducers::ReduceOutcome;
use ahp_types::actions::PartialChatSummary;
use ahp_types::actions::{
    ActionOrigin, ChatPendingMessageRemovedAction, ChatToolCallCompleteAction, ChatTurnStartedAction,
    SessionActiveClientRemovedAction, SessionChatUpdatedAction, SessionInputNeededRemovedAction,
    SessionInputNeededSetAction, StateAction,
};
use ahp_types::commands::DispatchActionParams;
use ahp_types::common::StringOrMarkdown;
use ahp_types::notifications::{PartialSessionSummary, SessionSummaryChangedParams};
use ahp_types::state::{
    ChatState, Message, PendingMessageKind, ResponsePart, SessionChatInputRequest, SessionInputRequest,
    SessionToolAuthenticationRequest, SessionToolClientExecutionRequest, SessionToolConfirmationRequest,
    ToolCallConfirmationState, ToolCallContributor, ToolCallResult, ToolCallState,
};
use ahp_types::ROOT_RESOURCE_URI;
use relay_core::bus::Audience;
use relay_core::link::CommandReply;
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::ConnectionId;
use relay_runner::{TurnControl, TurnRequest};

use crate::agent_context::{self, AgentContext};
use crate::commands::now;
use crate::host::HostCore;
use crate::model::{chat_summary_of, summary_of, ChannelKind, SnapshotClock};
use crate::validate::{self, Dispatcher};
use relay_store::CatalogChange;

impl HostCore {
    pub(crate) fn dispatch_client_action(
        &mut self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> Result<CommandReply, RpcError> {
        let mut params: DispatchActionParams = message.parse_params()?;
        let client_id = self.client_id(connection)?;
        let role = self.connection(connection)?.identity.role;
        let kind = self.model.kind(&params.channel);
        if kind == ChannelKind::Unknown {
            // Actions on channels the host does not have are ignored without an echo (digest §4).
            return crate::commands::reply(message.id, &());
        }
        let origin = ActionOrigin {
            client_id: client_id.clone(),
            client_seq: params.client_seq,
        };
        let who = Dispatcher {
            client_id: &client_id,
            role,
        };
        let over_quota = crate::storage::grows_storage(&params.action)
            .then(|| self.storage_refusal())
            .flatten();
        let over_turn_limit = self.turn_limit_refusal(&params.channel, &params.action);
        // A message's chat attachments are pinned now (the accepted action carries the pinned turn).
        let pinned = crate::attachments::pin_action(&self.model, &mut params.action);
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
        let verdict = checked.and_then(|()| match self.model.reduce(&params.channel, &params.action) {
            ReduceOutcome::Invalid(error) => Err(error.to_string()),
            ReduceOutcome::OutOfScope => Err("action does not apply to this channel".into()),
            ReduceOutcome::Applied | ReduceOutcome::NoOp => Ok(()),
        });
        if let Err(reason) = verdict {
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
            return crate::commands::reply(message.id, &());
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
        // A notification gets nothing; the same call sent as a request (with an id) gets an empty result.
        crate::commands::reply(message.id, &())
    }

    /// An agent's action. Returns `false` when it does not apply (its chat is gone or its turn ended), or when
    /// the tenant is over its storage quota and the action would add content: then the chat's running turn
    /// ends with a `chat/error` naming the quota (which stops the agent's turn).
    pub(crate) fn apply_agent_action(&mut self, channel: &str, action: StateAction) -> bool {
        let kind = self.model.kind(channel);
        if kind == ChannelKind::Unknown {
            return false;
        }
        if crate::storage::agent_grows_storage(&action) {
            if let Some(refusal) = self.storage_refusal() {
                if kind == ChannelKind::Chat {
                    self.end_turn_over_quota(channel, &refusal);
                }
                return false;
            }
        }
        self.apply_server_action(channel, action)
    }

    /// End `chat`'s running turn: its agent's output no longer fits the tenant's storage quota.
    fn end_turn_over_quota(&mut self, chat: &str, refusal: &str) {
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
        let kind = self.model.kind(channel);
        match self.model.reduce(channel, &action) {
            ReduceOutcome::Applied => {}
            outcome => {
                tracing::debug!(%channel, ?outcome, "server action dropped");
                return false;
            }
        }
        self.seq.accept(channel, &action, None);
        self.after_action(channel, kind, &action);
        true
    }

    /// Side effects of an accepted action.
    fn after_action(&mut self, channel: &str, kind: ChannelKind, action: &StateAction) {
        if kind == ChannelKind::Chat {
            self.sync_archived(channel);
            self.age_turns_after(channel, action);
        }
        self.maybe_snapshot(channel);
        match kind {
            ChannelKind::Chat => {
                self.chat_side_effects(channel, action);
                if affects_input_needed(action) {
                    self.sync_input_needed(channel);
                }
                self.sync_chat_summary(channel);
            }
            ChannelKind::Session => {
                if let StateAction::SessionWorkingDirectoryRemoved(removed) = action {
                    self.remove_chats_directory(channel, &removed.directory);
                }
                self.sync_session_summary(channel);
            }
            // Root actions are rare (configuration): each one stores the root's document, so a restart
            // restores it however long ago it changed (its log rows may be compacted away).
            ChannelKind::Root => self.store_snapshot(channel),
            // A terminal's lifecycle is listed in root state.
            ChannelKind::Terminal => self.sync_terminal_list(),
            ChannelKind::Unknown => {}
        }
    }

    /// A directory left the session: its chats that listed it lose it too (a chat's directories are a subset
    /// of its session's).
    fn remove_chats_directory(&mut self, session: &str, directory: &str) {
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
        for chat in chats {
            self.apply_server_action(
                &chat,
                StateAction::ChatWorkingDirectoryRemoved(
                    ahp_types::actions::ChatWorkingDirectoryRemovedAction {
                        directory: directory.to_string(),
                    },
                ),
            );
        }
    }

    fn chat_side_effects(&mut self, chat: &str, action: &StateAction) {
        match action {
            StateAction::ChatTurnStarted(a) => self.start_provider_turn(chat, &a.turn_id, &a.message.clone()),
            StateAction::ChatTurnResume(a) => {
                let message = self
                    .model
                    .chats
                    .get(chat)
                    .and_then(|c| c.state.active_turn.as_ref())
                    .map(|t| t.message.clone());
                if let Some(message) = message {
                    self.start_provider_turn(chat, &a.turn_id, &message);
                }
            }
            // A truncation drops the active turn (AHP): the agent's turn stops with it, so its session is free
            // for the next turn (of this chat or another).
            // The agent saw turns the chat no longer has: its next turn starts the chat afresh, told the kept
            // ones (a fork or side chat that never ran still owes its whole history, kept turns included).
            StateAction::ChatTruncated(_) => {
                let dropped = self
                    .model
                    .chats
                    .get(chat)
                    .is_some_and(|record| record.state.active_turn.is_none() && record.running.is_some());
                if dropped {
                    self.stop_provider_turn(chat);
                }
                if let Some(record) = self.model.chats.get_mut(chat) {
                    if !matches!(record.agent_context, AgentContext::Owed { .. }) {
                        record.agent_context = AgentContext::Reset;
                    }
                }
            }
            // However a turn ends, the chat is idle: the next pending message runs.
            StateAction::ChatTurnComplete(_)
            | StateAction::ChatTurnCancelled(_)
            | StateAction::ChatError(_) => {
                self.stop_provider_turn(chat);
                self.drain_queue(chat);
            }
            StateAction::ChatToolCallConfirmed(a) => self.control_turn(
                chat,
                TurnControl::ToolCallConfirmed {
                    tool_call_id: a.tool_call_id.clone(),
                    approved: a.approved,
                    selected_option_id: a.selected_option_id.clone(),
                },
            ),
            StateAction::ChatToolCallComplete(a) => self.control_turn(
                chat,
                TurnControl::ToolCallCompleted {
                    tool_call_id: a.tool_call_id.clone(),
                    success: a.result.success,
                },
            ),
            StateAction::ChatInputCompleted(a) => self.control_turn(
                chat,
                TurnControl::InputCompleted {
                    request_id: a.request_id.clone(),
                    response: a.response,
                    answers: a.answers.clone(),
                },
            ),
            StateAction::ChatPendingMessageSet(a) if a.kind == PendingMessageKind::Queued => {
                self.drain_queue(chat)
            }
            StateAction::ChatPendingMessageSet(_) => self.steer(chat),
            _ => {}
        }
    }

    fn start_provider_turn(&mut self, chat: &str, turn_id: &str, message: &Message) {
        let Some(record) = self.model.chats.get(chat) else {
            return;
        };
        let Some(session) = self.model.sessions.get(&record.session) else {
            return;
        };
        let Some(provider) = self.providers.get(&session.state.provider).cloned() else {
            tracing::warn!(provider = %session.state.provider, "session provider is not configured");
            return;
        };
        let first_turn = session.state.title.is_empty();
        let client_tools = session
            .state
            .active_clients
            .iter()
            .flat_map(|client| {
                client.tools.iter().map(|tool| relay_runner::ClientTool {
                    client_id: client.client_id.clone(),
                    name: tool.name.clone(),
                })
            })
            .collect();
        // What the agent has not seen of the chat goes with the turn (told once: see below).
        let chats = &self.model.chats;
        let owed = record.agent_context.clone();
        let (context, fresh) = agent_context::for_turn(owed, &record.state, |source, turn_id| {
            chats
                .get(source)
                .and_then(|source| agent_context::source_transcript(&source.state, turn_id))
        });
        let request = TurnRequest {
            session: record.session.clone(),
            tenant: self.key.tenant.clone(),
            host: self.key.host.clone(),
            working_directory: session
                .state
                .working_directories
                .as_ref()
                .and_then(|dirs| dirs.first().cloned()),
            agent_state: session
                .state
                .meta
                .as_ref()
                .and_then(|meta| meta.get(relay_runner::AGENT_STATE_META).cloned()),
            chat: chat.to_string(),
            turn_id: turn_id.to_string(),
            prompt: message.text.clone(),
            context,
            fresh,
            attachments: crate::attachments::resolve(&self.model, message),
            model: message.model.as_ref().map(|model| model.id.clone()),
            config: session.state.config.as_ref().map(|config| config.values.clone()),
            first_turn,
            client_tools,
        };
        let handle = provider.start_turn(request, self.sink.clone());
        if let Some(record) = self.model.chats.get_mut(chat) {
            // Replacing a previous handle cancels it.
            record.running = Some(handle);
            record.agent_context = AgentContext::Current;
        }
    }

    fn stop_provider_turn(&mut self, chat: &str) {
        if let Some(record) = self.model.chats.get_mut(chat) {
            record.running = None;
        }
    }

    fn control_turn(&mut self, chat: &str, control: TurnControl) {
        if let Some(handle) = self.model.chats.get(chat).and_then(|r| r.running.as_ref()) {
            handle.send(control);
        }
    }

    /// Hand the chat's steering message to its running turn: the agent takes it at its next step, and it
    /// stops being pending. An idle chat starts a turn with it; a turn whose agent cannot be steered (ACP v1
    /// has no steering) or that no agent runs (e.g. one restored after a restart) leaves it for the end of
    /// the turn.
    fn steer(&mut self, chat: &str) {
        let Some(record) = self.model.chats.get(chat) else {
            return;
        };
        let Some(steering) = record.state.steering_message.clone() else {
            return;
        };
        if record.state.active_turn.is_none() {
            self.drain_queue(chat);
            return;
        }
        let steerable = self
            .model
            .sessions
            .get(&record.session)
            .and_then(|session| self.providers.get(&session.state.provider))
            .is_some_and(|provider| provider.can_steer());
        let taken = steerable
            && record.running.as_ref().is_some_and(|turn| {
                turn.send(TurnControl::Steer {
                    text: steering.message.text.clone(),
                })
            });
        if taken {
            self.apply_server_action(
                chat,
                StateAction::ChatPendingMessageRemoved(ChatPendingMessageRemovedAction {
                    kind: PendingMessageKind::Steering,
                    id: steering.id,
                }),
            );
        }
    }

    /// Start the next pending message when the chat is idle (digest §6): a steering message no turn took
    /// first, then the queue in order.
    fn drain_queue(&mut self, chat: &str) {
        let Some(record) = self.model.chats.get(chat) else {
            return;
        };
        if record.state.active_turn.is_some() {
            return;
        }
        if let Some(steering) = record.state.steering_message.clone() {
            self.apply_server_action(
                chat,
                StateAction::ChatPendingMessageRemoved(ChatPendingMessageRemovedAction {
                    kind: PendingMessageKind::Steering,
                    id: steering.id,
                }),
            );
            self.start_server_turn(chat, steering.message, None);
            return;
        }
        let Some(next) = record
            .state
            .queued_messages
            .as_ref()
            .and_then(|q| q.first())
            .cloned()
        else {
            return;
        };
        self.apply_server_action(
            chat,
            StateAction::ChatPendingMessageRemoved(ChatPendingMessageRemovedAction {
                kind: PendingMessageKind::Queued,
                id: next.id.clone(),
            }),
        );
        self.start_server_turn(chat, next.message, Some(next.id));
    }

    /// Keep `archived` in step with the chat state's cursor (turns loaded back, or the chat truncated); once
    /// the state holds every turn, the archive row goes.
    fn sync_archived(&mut self, chat: &str) {
        let Some(record) = self.model.chats.get_mut(chat) else {
            return;
        };
        let first = crate::archive::first_held(&record.state);
        if first == record.archived {
            return;
        }
        record.archived = first;
        if first == 0 {
            self.seq.forget(&crate::archive::key(chat));
            self.seq.forget(&crate::archive::legacy_key(chat));
            self.store_snapshot(chat);
        }
    }

    /// A chat is gone: what it needed from the session's clients is no longer outstanding.
    pub(crate) fn clear_input_needed(&mut self, session: &str, chat: &str) {
        let ids: Vec<String> = self
            .model
            .sessions
            .get(session)
            .iter()
            .flat_map(|s| s.state.input_needed.iter().flatten())
            .filter(|request| input_chat(request) == Some(chat))
            .filter_map(|request| input_id(request).map(str::to_string))
            .collect();
        for id in ids {
            self.apply_server_action(
                session,
                StateAction::SessionInputNeededRemoved(SessionInputNeededRemovedAction { id }),
            );
        }
    }

    /// Mirror the chat's outstanding input (open input requests, tool calls awaiting confirmation or
    /// authentication, client tools running) into its session's `inputNeeded` with
    /// `session/inputNeededSet` / `session/inputNeededRemoved`, so a client of the session alone sees it.
    pub(crate) fn sync_input_needed(&mut self, chat: &str) {
        let (session, wanted) = match self.model.chats.get(chat) {
            Some(record) => (record.session.clone(), input_requests_of(chat, &record.state)),
            None => return,
        };
        let Some(listed) = self.model.sessions.get(&session) else {
            return;
        };
        let current: Vec<SessionInputRequest> = listed
            .state
            .input_needed
            .iter()
            .flatten()
            .filter(|request| input_chat(request) == Some(chat))
            .cloned()
            .collect();
        for gone in current
            .iter()
            .filter(|r| !wanted.iter().any(|w| input_id(w) == input_id(r)))
        {
            if let Some(id) = input_id(gone) {
                self.apply_server_action(
                    &session,
                    StateAction::SessionInputNeededRemoved(SessionInputNeededRemovedAction {
                        id: id.to_string(),
                    }),
                );
            }
        }
        for request in wanted.into_iter().filter(|w| !current.contains(w)) {
            self.apply_server_action(
                &session,
                StateAction::SessionInputNeededSet(Box::new(SessionInputNeededSetAction { request })),
            );
        }
    }

    /// Start a turn on the host's initiative (a queued message, or `createChat.initialMessage`).
    pub(crate) fn start_server_turn(
        &mut self,
        chat: &str,
        message: Message,
        queued_message_id: Option<String>,
    ) {
        let turn_id = format!("turn-{}", self.seq.current() + 1);
        self.apply_server_action(
            chat,
            StateAction::ChatTurnStarted(ChatTurnStartedAction {
                turn_id,
                started_at: now(),
                message,
                queued_message_id,
                meta: None,
            }),
        );
    }

    /// Keep the session's chat catalogue in step with the chat's own state (`session/chatUpdated`).
    fn sync_chat_summary(&mut self, chat: &str) {
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

    /// Announce a changed session summary with `root/sessionSummaryChanged`.
    fn sync_session_summary(&mut self, session: &str) {
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

    /// Store a channel's snapshot when enough actions or time went by since the last one.
    fn maybe_snapshot(&mut self, channel: &str) {
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

    /// Remove `client_id` from a session's active clients, failing the client tool calls it owns.
    pub(crate) fn remove_active_client(&mut self, session: &str, client_id: &str) {
        let Some(record) = self.model.sessions.get(session) else {
            return;
        };
        if !record
            .state
            .active_clients
            .iter()
            .any(|c| c.client_id == client_id)
        {
            return;
        }
        let chats: Vec<String> = record.state.chats.iter().map(|c| c.resource.clone()).collect();
        for chat in chats {
            for (turn_id, tool_call_id) in self.client_tool_calls(&chat, client_id) {
                self.apply_server_action(
                    &chat,
                    StateAction::ChatToolCallComplete(ChatToolCallCompleteAction {
                        turn_id,
                        tool_call_id,
                        meta: None,
                        result: ToolCallResult {
                            success: false,
                            past_tense_message: StringOrMarkdown::Plain(
                                "The client that owned this tool disconnected".into(),
                            ),
                            content: None,
                            structured_content: None,
                            error: None,
                        },
                        requires_result_confirmation: None,
                    }),
                );
            }
        }
        self.apply_server_action(
            session,
            StateAction::SessionActiveClientRemoved(SessionActiveClientRemovedAction {
                client_id: client_id.to_string(),
            }),
        );
    }

    /// Open tool calls of the active turn in `chat` that `client_id` executes.
    fn client_tool_calls(&self, chat: &str, client_id: &str) -> Vec<(String, String)> {
        let Some(turn) = self
            .model
            .chats
            .get(chat)
            .and_then(|c| c.state.active_turn.as_ref())
        else {
            return vec![];
        };
        turn.response_parts
            .iter()
            .filter_map(|part| match part {
                ResponsePart::ToolCall(tc) => {
                    let owned = matches!(
                        validate::tool_call_contributor(&tc.tool_call),
                        Some(ToolCallContributor::Client(c)) if c.client_id == client_id
                    );
                    let open = !matches!(
                        tc.tool_call,
                        ahp_types::state::ToolCallState::Completed(_)
                            | ahp_types::state::ToolCallState::Cancelled(_)
                    );
                    (owned && open)
                        .then(|| {
                            validate::tool_call_id_of(&tc.tool_call)
                                .map(|id| (turn.id.clone(), id.to_string()))
                        })
                        .flatten()
                }
                _ => None,
            })
            .collect()
    }

    /// The grace period of a disconnected client ran out: if it did not come back, release it everywhere.
    pub(crate) fn expire_client(&mut self, client_id: &str, epoch: u64) {
        let Some(binding) = self.clients.get(client_id) else {
            return;
        };
        if binding.live_connections > 0 || binding.grace_epoch != epoch {
            return;
        }
        let sessions: Vec<String> = self
            .model
            .sessions
            .iter()
            .filter(|(_, s)| s.state.active_clients.iter().any(|c| c.client_id == client_id))
            .map(|(uri, _)| uri.clone())
            .collect();
        for session in sessions {
            self.remove_active_client(&session, client_id);
        }
        // Its owner is in the store: memory keeps only bindings in use (or within their grace).
        self.clients.remove(client_id);
        self.owed.forget(client_id);
    }
}

/// Whether an action can change a chat's outstanding input.
fn affects_input_needed(action: &StateAction) -> bool {
    use StateAction::*;
    matches!(
        action,
        ChatInputRequested(_)
            | ChatInputCompleted(_)
            | ChatInputAnswerChanged(_)
            | ChatToolCallStart(_)
            | ChatToolCallReady(_)
            | ChatToolCallConfirmed(_)
            | ChatToolCallComplete(_)
            | ChatToolCallResultConfirmed(_)
            | ChatToolCallAuthRequired(_)
            | ChatToolCallAuthResolved(_)
            | ChatTurnComplete(_)
            | ChatTurnCancelled(_)
            | ChatError(_)
            | ChatTruncated(_)
    )
}

/// The session-level mirror of a chat's outstanding input, keyed `<chat>#<kind>/<id>`.
fn input_requests_of(chat: &str, state: &ChatState) -> Vec<SessionInputRequest> {
    let Some(turn) = state.active_turn.as_ref() else {
        return Vec::new();
    };
    let key = |kind: &str, id: &str| format!("{chat}#{kind}/{id}");
    turn.response_parts
        .iter()
        .filter_map(|part| match part {
            ResponsePart::InputRequest(input) if input.response.is_none() => {
                Some(SessionInputRequest::ChatInput(SessionChatInputRequest {
                    id: key("input", &input.request.id),
                    chat: chat.to_string(),
                    request: input.request.clone(),
                }))
            }
            ResponsePart::ToolCall(tc) => match &tc.tool_call {
                ToolCallState::PendingConfirmation(s) => Some(SessionInputRequest::ToolConfirmation(
                    SessionToolConfirmationRequest {
                        id: key("tool", &s.tool_call_id),
                        chat: chat.to_string(),
                        turn_id: turn.id.clone(),
                        tool_call: ToolCallConfirmationState::PendingConfirmation(s.clone()),
                    },
                )),
                ToolCallState::PendingResultConfirmation(s) => Some(SessionInputRequest::ToolConfirmation(
                    SessionToolConfirmationRequest {
                        id: key("tool", &s.tool_call_id),
                        chat: chat.to_string(),
                        turn_id: turn.id.clone(),
                        tool_call: ToolCallConfirmationState::PendingResultConfirmation(s.clone()),
                    },
                )),
                ToolCallState::Running(s) => match &s.contributor {
                    Some(ToolCallContributor::Client(client)) => Some(
                        SessionInputRequest::ToolClientExecution(SessionToolClientExecutionRequest {
                            id: key("tool", &s.tool_call_id),
                            chat: chat.to_string(),
                            turn_id: turn.id.clone(),
                            client_id: client.client_id.clone(),
                            tool_call: s.clone(),
                        }),
                    ),
                    _ => None,
                },
                ToolCallState::AuthRequired(s) => Some(SessionInputRequest::ToolAuthentication(Box::new(
                    SessionToolAuthenticationRequest {
                        id: key("tool", &s.tool_call_id),
                        chat: chat.to_string(),
                        turn_id: turn.id.clone(),
                        tool_call: (**s).clone(),
                    },
                ))),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn input_id(request: &SessionInputRequest) -> Option<&str> {
    Some(match request {
        SessionInputRequest::ChatInput(r) => &r.id,
        SessionInputRequest::ToolConfirmation(r) => &r.id,
        SessionInputRequest::ToolClientExecution(r) => &r.id,
        SessionInputRequest::ToolAuthentication(r) => &r.id,
        SessionInputRequest::Unknown(_) => return None,
    })
}

fn input_chat(request: &SessionInputRequest) -> Option<&str> {
    Some(match request {
        SessionInputRequest::ChatInput(r) => &r.chat,
        SessionInputRequest::ToolConfirmation(r) => &r.chat,
        SessionInputRequest::ToolClientExecution(r) => &r.chat,
        SessionInputRequest::ToolAuthentication(r) => &r.chat,
        SessionInputRequest::Unknown(_) => return None,
    })
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
