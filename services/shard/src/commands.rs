//! AHP commands: connection-level (`initialize`, `ping`, `reconnect`, `listSessions`, …) and channel-level
//! (`subscribe`, `createSession`, `createChat`, `fetchTurns`, …). Each handler validates its params, changes
//! state only through the sequencer and reducers, and answers with one JSON-RPC frame.

use ahp_types::actions::{
    SessionChatAddedAction, SessionChatRemovedAction, SessionDefaultChatChangedAction, SessionReadyAction,
    StateAction,
};
use ahp_types::commands::{
    AuthenticateParams, ChatSource, CompletionsParams, CompletionsResult, CreateChatParams,
    CreateSessionParams, DisposeChatParams, DisposeSessionParams, Implementation, InitializeParams,
    InitializeResult, ResolveSessionConfigParams, ResolveSessionConfigResult, SubscribeParams,
    SubscribeResult, UnsubscribeParams,
};
use ahp_types::errors::{ahp_error_codes, UnsupportedProtocolVersionErrorData};
use ahp_types::notifications::{SessionAddedParams, SessionRemovedParams};
use ahp_types::state::{
    ChatOrigin, ChatState, SessionConfigSchema, SessionLifecycle, SessionState, SessionStatus,
};
use ahp_types::{negotiate_protocol_version, PROTOCOL_VERSION, ROOT_RESOURCE_URI};
use relay_core::link::{CloseRequest, CommandReply, SubscriptionChange};
use relay_core::rpc::{self, InboundMessage, RpcError};
use relay_core::{ConnectionId, Role};
use serde::Serialize;

use crate::agent_context::{self, AgentContext};
use crate::host::HostCore;
use crate::model::{chat_summary_of, summary_of, ChannelKind, ChatRecord, SnapshotClock};
use relay_store::CatalogChange;

pub(crate) type CommandResult = Result<CommandReply, RpcError>;

/// WebSocket close code sent after `-32005`: the client must not retry unchanged.
const CLOSE_POLICY: u16 = 1008;

/// Longest channel URI a client may choose.
const MAX_URI_BYTES: usize = 512;

/// Characters a client-chosen channel URI may not contain: a fragment or query would name something other
/// than the channel, and white space cannot be written in a URI.
const RESERVED_URI_CHARS: &[char] = &['#', '?', ' ', '\\'];

/// The methods a host answers once the connection is initialized (besides `ping` and `initialize`, which
/// are answered before; `listSessions`, `reconnect` and `fetchTurns` are served by [`crate::host::Host`]).
const KNOWN_METHODS: &[&str] = &[
    "dispatchAction",
    "subscribe",
    "unsubscribe",
    "createSession",
    "disposeSession",
    "createChat",
    "disposeChat",
    "completions",
    "resolveSessionConfig",
    "authenticate",
];

/// The `InitializeResult._meta` key listing `initialSubscriptions` that name no channel of this host.
pub const UNAVAILABLE_SUBSCRIPTIONS: &str = "ahpRelay/unavailableSubscriptions";

/// The protocol version to speak, from the versions a client offers: this relay speaks AHP 1.0.0 (and so any
/// 1.x a client offers, which SemVer makes compatible with it). 0.x versions differ on the wire and are never
/// chosen, though the `ahp-types` crate would negotiate 0.9.0.
pub(crate) fn negotiate(offered: &[String]) -> Result<Option<String>, String> {
    let ours = PROTOCOL_VERSION.split('.').next().unwrap_or("1");
    let same_major: Vec<String> = offered
        .iter()
        .filter(|version| version.split('.').next() == Some(ours))
        .cloned()
        .collect();
    // Invalid offers are still reported as such.
    negotiate_protocol_version(offered)?;
    Ok(negotiate_protocol_version(&same_major)?.map(str::to_string))
}

pub(crate) fn reply<T: Serialize + ?Sized>(id: Option<u64>, result: &T) -> CommandResult {
    match id {
        Some(id) => rpc::result_frame(id, result)
            .map(CommandReply::frame)
            .map_err(|e| RpcError::internal(format!("could not serialize result: {e}"))),
        None => Ok(CommandReply::none()),
    }
}

/// The reply to send for a command's result: its frame, or the error as a JSON-RPC error frame.
pub(crate) fn answer(id: Option<u64>, result: CommandResult) -> CommandReply {
    result.unwrap_or_else(|error| CommandReply::frame(rpc::error_frame(id, &error)))
}

pub fn now() -> String {
    format!("{:.3}", jiff::Timestamp::now())
}

impl HostCore {
    pub(crate) fn route(&mut self, connection: ConnectionId, message: &InboundMessage) -> CommandResult {
        let id = message.id;
        match message.method.as_str() {
            "ping" => return reply(id, &()),
            "initialize" => return self.initialize(connection, message),
            _ => {}
        }
        if !KNOWN_METHODS.contains(&message.method.as_str()) {
            // Unknown whatever the connection's state: -32601, not "initialize first".
            return Err(RpcError::method_not_found(&message.method));
        }
        self.client_id(connection)?;
        match message.method.as_str() {
            "dispatchAction" => self.dispatch_client_action(connection, message),
            "subscribe" => self.subscribe(connection, message),
            "unsubscribe" => self.unsubscribe(connection, message),
            "createSession" => self.create_session(connection, message),
            "disposeSession" => self.dispose_session(connection, message),
            "createChat" => self.create_chat(connection, message),
            "disposeChat" => self.dispose_chat(connection, message),
            "completions" => self.completions(message),
            "resolveSessionConfig" => self.resolve_session_config(message),
            "authenticate" => {
                let params: AuthenticateParams = message.parse_params()?;
                Err(RpcError::invalid_params(format!(
                    "{} is not a protected resource of this host",
                    params.resource
                )))
            }
            other => Err(RpcError::method_not_found(other)),
        }
    }

    fn require_writer(&self, connection: ConnectionId) -> Result<(), RpcError> {
        if self.connection(connection)?.identity.role.can_write() {
            Ok(())
        } else {
            Err(RpcError::permission_denied(
                "viewers may not create or dispose sessions or chats",
            ))
        }
    }

    fn initialize(&mut self, connection: ConnectionId, message: &InboundMessage) -> CommandResult {
        if self.connection(connection)?.client_id.is_some() {
            return Err(RpcError::invalid_request("the connection is already initialized"));
        }
        let params: InitializeParams = message.parse_params()?;
        let version = match negotiate(&params.protocol_versions) {
            Ok(Some(version)) => version,
            Ok(None) => {
                let data = UnsupportedProtocolVersionErrorData {
                    supported_versions: vec![PROTOCOL_VERSION.to_string()],
                };
                let error = RpcError::new(
                    ahp_error_codes::UNSUPPORTED_PROTOCOL_VERSION,
                    "none of the offered protocol versions is supported",
                )
                .with_data(serde_json::to_value(data).unwrap_or_default());
                return Ok(CommandReply {
                    frame: Some(rpc::error_frame(message.id, &error)),
                    subscriptions: vec![],
                    session_started: false,
                    close: Some(CloseRequest {
                        code: CLOSE_POLICY,
                        reason: "unsupported protocol version".into(),
                    }),
                    deliver_first: None,
                });
            }
            Err(e) => return Err(RpcError::invalid_params(e)),
        };
        // Each channel once, and no more than one message may name: a small request never builds a huge
        // reply.
        let mut requested = params.initial_subscriptions.unwrap_or_default();
        let mut seen = std::collections::HashSet::new();
        requested.retain(|channel| seen.insert(channel.clone()));
        let limit = self.limits.max_channels_per_message;
        if requested.len() > limit {
            return Err(RpcError::invalid_params(format!(
                "initialSubscriptions may name at most {limit} distinct channels"
            )));
        }
        let from_seq = self.seq.current();
        let mut snapshots = Vec::new();
        let mut channels = Vec::new();
        let mut unavailable = Vec::new();
        let mut budget = crate::model::ReplyBudget::new(self.limits.max_reply_bytes);
        for channel in requested {
            match self
                .model
                .snapshot_within(&channel, from_seq, self.limits.retained_turns, &mut budget)
            {
                Ok(Some(snapshot)) => {
                    channels.push((channel, crate::model::first_turn_of(&snapshot)));
                    snapshots.push(snapshot);
                }
                Ok(None) => unavailable.push(channel),
                Err(crate::model::OverBudget) => return Err(self.initial_snapshots_too_big()),
            }
        }
        // Channels that do not exist (or are not this host's) are said so, not silently left out.
        let meta = (!unavailable.is_empty()).then(|| {
            let mut meta = ahp_types::common::JsonObject::new();
            meta.insert(UNAVAILABLE_SUBSCRIPTIONS.into(), serde_json::json!(unavailable));
            meta
        });
        let result = InitializeResult {
            protocol_version: version.clone(),
            server_seq: from_seq as i64,
            server_info: Some(Implementation {
                name: "ahp-relay".into(),
                version: Some(env!("CARGO_PKG_VERSION").into()),
                title: Some("AHP relay".into()),
            }),
            meta,
            snapshots,
            default_directory: None,
            completion_trigger_characters: Some(vec![crate::completions::TRIGGER.into()]),
            terminal_command_prefix: None,
            telemetry: None,
            automations: None,
        };
        let mut out = reply(message.id, &result)?;
        if out
            .frame
            .as_ref()
            .is_some_and(|f| f.len() > self.limits.max_reply_bytes)
        {
            return Err(self.initial_snapshots_too_big());
        }
        // Only now does the connection take its clientId and subscriptions: a refused initialize leaves it
        // as it was.
        self.bind_client(connection, &params.client_id)?;
        let mut subscriptions = Vec::with_capacity(channels.len());
        for (channel, first_turn) in channels {
            self.track_subscription(connection, &channel)?;
            self.open_window(connection, &channel, first_turn);
            subscriptions.push(SubscriptionChange::Add {
                channel,
                after_seq: from_seq,
            });
        }
        if let Some(state) = self.connections.get_mut(&connection) {
            state.protocol_version = Some(version);
        }
        out.subscriptions = subscriptions;
        out.session_started = true;
        Ok(out)
    }

    fn initial_snapshots_too_big(&self) -> RpcError {
        RpcError::invalid_params(format!(
            "the initial snapshots would exceed {} bytes: subscribe to fewer channels at once",
            self.limits.max_reply_bytes
        ))
    }

    pub(crate) fn track_subscription(
        &mut self,
        connection: ConnectionId,
        channel: &str,
    ) -> Result<(), RpcError> {
        let limit = self.limits.max_subscriptions_per_connection;
        let Some(state) = self.connections.get_mut(&connection) else {
            return Err(RpcError::internal("connection is not attached"));
        };
        if !state.subscriptions.contains(channel) && state.subscriptions.len() >= limit {
            return Err(RpcError::invalid_request(format!(
                "subscription limit reached ({limit} channels per connection)"
            )));
        }
        state.subscriptions.insert(channel.to_string());
        Ok(())
    }

    /// The connection got a snapshot of `channel` holding its turns from absolute index `first_turn` on.
    pub(crate) fn open_window(&mut self, connection: ConnectionId, channel: &str, first_turn: usize) {
        if self.model.kind(channel) != ChannelKind::Chat {
            return;
        }
        if let Some(state) = self.connections.get_mut(&connection) {
            state.turn_windows.insert(channel.to_string(), first_turn);
        }
    }

    fn subscribe(&mut self, connection: ConnectionId, message: &InboundMessage) -> CommandResult {
        let params: SubscribeParams = message.parse_params()?;
        let turns = match params.view.and_then(|v| v.turns) {
            Some(n) if n < 0 => return Err(RpcError::invalid_params("view.turns must not be negative")),
            Some(n) => n as usize,
            // "All retained turns" (see crate::archive).
            None => self.limits.retained_turns,
        };
        let from_seq = self.seq.current();
        // However many turns are asked for, the reply stays within its budget: a chat shows the newest that
        // fit, and its cursor pages in the rest.
        let mut budget = crate::model::ReplyBudget::new(self.limits.max_reply_bytes);
        let snapshot = self
            .model
            .snapshot_within(&params.channel, from_seq, turns, &mut budget)
            .map_err(|crate::model::OverBudget| {
                RpcError::invalid_params(format!(
                    "the snapshot of {} would exceed {} bytes",
                    params.channel, self.limits.max_reply_bytes
                ))
            })?;
        let Some(snapshot) = snapshot else {
            return Err(not_found(&params.channel));
        };
        self.track_subscription(connection, &params.channel)?;
        self.open_window(
            connection,
            &params.channel,
            crate::model::first_turn_of(&snapshot),
        );
        let mut out = reply(
            message.id,
            &SubscribeResult {
                snapshot: Some(snapshot),
            },
        )?;
        out.subscriptions = vec![SubscriptionChange::Add {
            channel: params.channel,
            after_seq: from_seq,
        }];
        Ok(out)
    }

    fn unsubscribe(&mut self, connection: ConnectionId, message: &InboundMessage) -> CommandResult {
        let params: UnsubscribeParams = message.parse_params()?;
        let client_id = self.client_id(connection)?;
        if let Some(state) = self.connections.get_mut(&connection) {
            state.subscriptions.remove(&params.channel);
            state.turn_windows.remove(&params.channel);
        }
        if self.model.kind(&params.channel) == ChannelKind::Session
            && !self.client_subscribed(&client_id, &params.channel)
        {
            self.remove_active_client(&params.channel, &client_id);
        }
        Ok(CommandReply {
            subscriptions: vec![SubscriptionChange::Remove {
                channel: params.channel,
            }],
            ..CommandReply::none()
        })
    }

    /// Whether any live connection of `client_id` is subscribed to `channel`.
    pub(crate) fn client_subscribed(&self, client_id: &str, channel: &str) -> bool {
        self.connections
            .values()
            .any(|c| c.client_id.as_deref() == Some(client_id) && c.subscriptions.contains(channel))
    }

    /// `reconnect` that omits a session releases the client's active slot there.
    pub(crate) fn release_sessions_not_resubscribed(&mut self, client_id: &str, live: &[String]) {
        let sessions: Vec<String> = self
            .model
            .sessions
            .iter()
            .filter(|(uri, s)| {
                !live.contains(uri) && s.state.active_clients.iter().any(|c| c.client_id == client_id)
            })
            .map(|(uri, _)| uri.clone())
            .collect();
        for session in sessions {
            if !self.client_subscribed(client_id, &session) {
                self.remove_active_client(&session, client_id);
            }
        }
    }

    /// A URI a client chose for a new channel: the right scheme, a bounded length, and not in use.
    fn check_new_uri(&self, uri: &str, scheme: &str, exists_code: i32) -> Result<(), RpcError> {
        if !uri.starts_with(scheme) || uri.len() > MAX_URI_BYTES {
            return Err(RpcError::invalid_params(format!(
                "the URI must be a {scheme} URI of at most {MAX_URI_BYTES} bytes"
            )));
        }
        if let Some(reserved) = uri
            .chars()
            .find(|c| RESERVED_URI_CHARS.contains(c) || c.is_control())
        {
            return Err(RpcError::invalid_params(format!(
                "the URI may not contain {reserved:?} (no fragments, queries, spaces or control characters)"
            )));
        }
        if self.model.kind(uri) != ChannelKind::Unknown {
            return Err(RpcError::new(exists_code, format!("already exists: {uri}")));
        }
        Ok(())
    }

    fn create_session(&mut self, connection: ConnectionId, message: &InboundMessage) -> CommandResult {
        self.require_writer(connection)?;
        let params: CreateSessionParams = message.parse_params()?;
        if let Some(refusal) = self.storage_refusal() {
            return Err(RpcError::invalid_request(refusal));
        }
        let uri = params.channel;
        self.check_new_uri(&uri, "ahp-session:", ahp_error_codes::SESSION_ALREADY_EXISTS)?;
        if self.session_count >= self.limits.max_sessions_per_host as u64 {
            return Err(RpcError::invalid_request(format!(
                "session limit reached ({} per host)",
                self.limits.max_sessions_per_host
            )));
        }
        // Without a provider: the host's configured `defaultProvider` (root config, which admins set), else
        // the first one configured.
        let configured = self
            .model
            .root
            .config
            .as_ref()
            .and_then(|config| config.values.get("defaultProvider"))
            .and_then(|value| value.as_str())
            .filter(|provider| self.providers.get(provider).is_some())
            .map(str::to_string);
        let provider = match params.provider.or(configured) {
            Some(p) => p,
            None => self
                .providers
                .default_provider()
                .ok_or_else(|| {
                    RpcError::new(ahp_error_codes::PROVIDER_NOT_FOUND, "no provider is configured")
                })?
                .to_string(),
        };
        let Some(agent) = self.providers.get(&provider).cloned() else {
            return Err(RpcError::new(
                ahp_error_codes::PROVIDER_NOT_FOUND,
                format!("provider not found: {provider}"),
            ));
        };
        let directories = params.working_directories.as_deref().unwrap_or_default();
        let multiple = self
            .model
            .root
            .agents
            .iter()
            .find(|agent| agent.provider == provider)
            .and_then(|agent| agent.capabilities.as_ref())
            .is_some_and(|capabilities| capabilities.multiple_working_directories.is_some());
        if directories.len() > 1 && !multiple {
            return Err(RpcError::invalid_params(format!(
                "the agent {provider} does not advertise multipleWorkingDirectories: name at most one working directory"
            )));
        }
        let client_id = self.client_id(connection)?;
        let active_clients = match params.active_client {
            Some(active) if active.client_id != client_id => {
                return Err(RpcError::invalid_params(
                    "activeClient.clientId must be this connection's clientId",
                ))
            }
            Some(active) => vec![active],
            None => vec![],
        };
        // The agent prepares the session (e.g. starts its process); it reports back on the session channel.
        let start = agent.create_session(
            relay_runner::SessionRequest {
                session: uri.clone(),
                tenant: self.key.tenant.clone(),
                host: self.key.host.clone(),
                working_directory: params
                    .working_directories
                    .as_ref()
                    .and_then(|d| d.first().cloned()),
            },
            self.sink.clone(),
        );
        if let relay_runner::SessionStart::Refused(message) = &start {
            return Err(RpcError::invalid_params(message.clone()));
        }
        let created_at = now();
        // The agent's settings, as the client chose them (checked against the schema; defaults for the rest).
        let config = agent
            .session_config_schema()
            .map(|schema| ahp_types::state::SessionConfigState {
                values: relay_runner::acp::options::resolve(&schema, params.config.as_ref()),
                schema,
            });
        // Every session starts with its default chat (AHP: clients open chats beyond it only where the agent
        // advertises `multipleChats`).
        let default_chat = self.default_chat_uri(&uri);
        let chat_state = new_chat_state(&default_chat, None, vec![], None);
        let state = SessionState {
            provider,
            title: String::new(),
            status: SessionStatus::Idle.bits(),
            activity: None,
            origin: None,
            project: None,
            working_directories: params.working_directories,
            annotations: None,
            lifecycle: SessionLifecycle::Creating,
            creation_error: None,
            server_tools: None,
            active_clients,
            chats: vec![chat_summary_of(&chat_state)],
            default_chat: Some(default_chat.clone()),
            config,
            customizations: None,
            changesets: None,
            input_needed: None,
            meta: None,
        };
        let summary = summary_of(&uri, &state, &created_at);
        let catalog_no = self
            .model
            .insert_new_session(uri.clone(), state, created_at.clone());
        self.session_count += 1;
        let creator = self.connection(connection)?.identity.subject.clone();
        if let Some(session) = self.model.sessions.get_mut(&uri) {
            session.created_by = Some(creator.clone());
        }
        self.insert_chat(&uri, chat_state, Some(creator), AgentContext::Current);
        self.store_session_summary(&uri, catalog_no, &created_at, &summary);
        self.store_snapshot(&uri);
        self.seq.notify(
            ROOT_RESOURCE_URI,
            "root/sessionAdded",
            &SessionAddedParams {
                channel: ROOT_RESOURCE_URI.into(),
                summary,
            },
        );
        if start == relay_runner::SessionStart::Ready {
            self.apply_server_action(&uri, StateAction::SessionReady(SessionReadyAction {}));
        }
        reply(message.id, &())
    }

    fn dispose_session(&mut self, connection: ConnectionId, message: &InboundMessage) -> CommandResult {
        self.require_writer(connection)?;
        let params: DisposeSessionParams = message.parse_params()?;
        let uri = params.channel;
        let Some(session) = self.model.sessions.get(&uri) else {
            return Err(RpcError::session_not_found(&uri));
        };
        let who = &self.connection(connection)?.identity;
        if who.role != Role::Admin && session.created_by.as_ref() != Some(&who.subject) {
            return Err(RpcError::permission_denied(
                "members may dispose only sessions they created (admins may dispose any)",
            ));
        }
        if let Some(agent) = self.providers.get(&session.state.provider) {
            agent.dispose_session(&self.key.tenant, &self.key.host, &uri);
        }
        let listed: Vec<String> = session.state.chats.iter().map(|c| c.resource.clone()).collect();
        for chat in &listed {
            self.apply_server_action(
                &uri,
                StateAction::SessionChatRemoved(SessionChatRemovedAction { chat: chat.clone() }),
            );
        }
        let chats = self.model.remove_session(&uri);
        self.session_count = self.session_count.saturating_sub(1);
        for chat in &chats {
            self.seq.dispose(chat);
            self.seq.forget(&crate::archive::key(chat));
            self.seq.forget(&crate::archive::legacy_key(chat));
        }
        self.seq.catalog(CatalogChange::Remove { uri: uri.clone() });
        self.seq.dispose(&uri);
        self.note_disposing(std::iter::once(uri.clone()).chain(chats.iter().cloned()));
        for state in self.connections.values_mut() {
            state.subscriptions.remove(&uri);
            for chat in &chats {
                state.subscriptions.remove(chat);
            }
        }
        self.sync_terminal_list();
        self.seq.notify(
            ROOT_RESOURCE_URI,
            "root/sessionRemoved",
            &SessionRemovedParams {
                channel: ROOT_RESOURCE_URI.into(),
                session: uri,
            },
        );
        reply(message.id, &())
    }

    fn create_chat(&mut self, connection: ConnectionId, message: &InboundMessage) -> CommandResult {
        self.require_writer(connection)?;
        let params: CreateChatParams = message.parse_params()?;
        let session = params.channel;
        let chat = params.chat;
        let Some(record) = self.model.sessions.get(&session) else {
            return Err(RpcError::session_not_found(&session));
        };
        if let Some(refusal) = self.storage_refusal() {
            return Err(RpcError::invalid_request(refusal));
        }
        self.check_new_uri(&chat, "ahp-chat:", ahp_error_codes::ALREADY_EXISTS)?;
        if record.state.chats.len() >= self.limits.max_chats_per_session {
            return Err(RpcError::invalid_request("chat limit reached for this session"));
        }
        self.check_chat_capability(&record.state, params.source.as_ref())?;
        if let Some(directories) = &params.working_directories {
            crate::validate::check_in_session_directories(Some(&record.state), directories)
                .map_err(RpcError::invalid_params)?;
        }
        // Clients send only user messages (as a turn's message, and so as the chat's first one).
        if params
            .initial_message
            .as_ref()
            .is_some_and(|message| message.origin.kind != ahp_types::state::MessageKind::User)
        {
            return Err(RpcError::invalid_params("initialMessage must be a user message"));
        }
        // A fork continues its source: it inherits the source chat's working directories (naming others is
        // refused).
        let mut working_directories = params.working_directories;
        if let Some(ChatSource::Fork(source)) = &params.source {
            let inherited = self
                .model
                .chats
                .get(&source.chat)
                .and_then(|source| source.state.working_directories.clone());
            if working_directories.is_some() && working_directories != inherited {
                return Err(RpcError::invalid_params(
                    "a fork inherits its source chat's working directories: omit workingDirectories",
                ));
            }
            working_directories = inherited;
        }
        let mut agent_context = AgentContext::Current;
        let (origin, turns) = match params.source {
            None => (None, vec![]),
            Some(ChatSource::Fork(source)) => {
                let turns = self.fork_turns(&session, &source.chat, &chat, &source.turn_id)?;
                agent_context = AgentContext::Owed { source: None };
                (
                    Some(ChatOrigin::Fork {
                        chat: source.chat,
                        turn_id: source.turn_id,
                    }),
                    turns,
                )
            }
            // A side chat takes its source's context without copying it into its own history: its origin
            // keeps the source turn and the selection exactly as given.
            Some(ChatSource::SideChat(source)) => {
                self.check_source_turn(&session, &source.chat, &chat, &source.turn_id, true)?;
                if source.selection.as_ref().is_some_and(|s| s.text.is_empty()) {
                    return Err(RpcError::invalid_params(
                        "a side chat's selection.text must not be empty",
                    ));
                }
                // What its agent is told of the source is taken now: later changes to it do not reach it.
                let told = self
                    .model
                    .chats
                    .get(&source.chat)
                    .and_then(|record| agent_context::side_chat_source(&record.state, &source));
                agent_context = AgentContext::Owed { source: told };
                (
                    Some(ChatOrigin::SideChat {
                        chat: source.chat,
                        turn_id: source.turn_id,
                        selection: source.selection,
                    }),
                    vec![],
                )
            }
            Some(ChatSource::Unknown(_)) => {
                return Err(RpcError::invalid_params("unsupported chat source kind"))
            }
        };
        let state = new_chat_state(&chat, origin, turns, working_directories);
        let created_by = Some(self.connection(connection)?.identity.subject.clone());
        let summary = self.insert_chat(&session, state, created_by, agent_context);
        let needs_default = self
            .model
            .sessions
            .get(&session)
            .is_some_and(|s| s.state.default_chat.is_none());
        self.apply_server_action(
            &session,
            StateAction::SessionChatAdded(SessionChatAddedAction { summary }),
        );
        if needs_default {
            self.apply_server_action(
                &session,
                StateAction::SessionDefaultChatChanged(SessionDefaultChatChangedAction {
                    default_chat: Some(chat.clone()),
                }),
            );
        }
        if let Some(message_to_send) = params.initial_message {
            self.start_server_turn(&chat, message_to_send, None);
        }
        reply(message.id, &())
    }

    /// Keep a new chat of `session` and store its first snapshot; returns its summary for the session's list.
    fn insert_chat(
        &mut self,
        session: &str,
        state: ChatState,
        created_by: Option<String>,
        agent_context: AgentContext,
    ) -> ahp_types::state::ChatSummary {
        let summary = chat_summary_of(&state);
        let chat = state.resource.clone();
        self.model.chats.insert(
            chat.clone(),
            ChatRecord {
                session: session.to_string(),
                state,
                running: None,
                clock: SnapshotClock::fresh(),
                archived: 0,
                created_by,
                agent_context,
            },
        );
        self.store_snapshot(&chat);
        summary
    }

    /// The URI of a new session's default chat: the session's own name as a chat (`ahp-session:/x` →
    /// `ahp-chat:/x`), or with a `-default-N` suffix when a chat of the host already has that URI.
    fn default_chat_uri(&self, session: &str) -> String {
        let name = session.strip_prefix("ahp-session:").unwrap_or(session);
        let base = format!("ahp-chat:{name}");
        std::iter::once(base.clone())
            .chain((2..).map(|n| format!("{base}-default-{n}")))
            .find(|uri| self.model.kind(uri) == ChannelKind::Unknown)
            .unwrap_or(base)
    }

    /// `createChat` beyond a session's first chat needs the agent's `multipleChats`, a fork its `fork`, a side
    /// chat its `sideChat` (AHP: clients MUST NOT use what is not advertised; the host refuses it).
    fn check_chat_capability(
        &self,
        session: &SessionState,
        source: Option<&ChatSource>,
    ) -> Result<(), RpcError> {
        let capability = self
            .model
            .root
            .agents
            .iter()
            .find(|agent| agent.provider == session.provider)
            .and_then(|agent| agent.capabilities.as_ref())
            .and_then(|capabilities| capabilities.multiple_chats.as_ref());
        let provider = &session.provider;
        match (capability, source) {
            (None, _) if !session.chats.is_empty() => Err(RpcError::invalid_request(format!(
                "the agent {provider} does not advertise multipleChats: the session has its one chat"
            ))),
            (None, Some(_)) => Err(RpcError::invalid_request(format!(
                "the agent {provider} does not advertise multipleChats: no forks or side chats"
            ))),
            (Some(chats), Some(ChatSource::Fork(_))) if chats.fork != Some(true) => {
                Err(RpcError::invalid_request(format!(
                    "the agent {provider} does not advertise multipleChats.fork"
                )))
            }
            (Some(chats), Some(ChatSource::SideChat(_))) if chats.side_chat != Some(true) => {
                Err(RpcError::invalid_request(format!(
                    "the agent {provider} does not advertise multipleChats.sideChat"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The turns of `source` up to and including `turn_id`, for a fork inside `session` (archived turns were
    /// loaded into the source's state before: [`crate::history`]).
    fn fork_turns(
        &self,
        session: &str,
        source: &str,
        target: &str,
        turn_id: &str,
    ) -> Result<Vec<ahp_types::state::Turn>, RpcError> {
        // Its archived turns were not loaded back: more than one operation brings (see `crate::history`).
        if let Some(archived) = self
            .model
            .chats
            .get(source)
            .map(|record| record.archived)
            .filter(|archived| *archived > 0)
        {
            return Err(RpcError::invalid_params(format!(
                "{source} has {archived} archived turns: a fork copies at most {} turns and {} bytes of them",
                crate::archive::MAX_LOADED_BACK,
                self.limits.max_reply_bytes
            )));
        }
        self.check_source_turn(session, source, target, turn_id, false)?;
        let record = self.model.chats.get(source).ok_or_else(|| not_found(source))?;
        let index = record
            .state
            .turns
            .iter()
            .position(|t| t.id == turn_id)
            .ok_or_else(|| RpcError::invalid_params(format!("unknown turn {turn_id} in {source}")))?;
        Ok(record.state.turns[..=index].to_vec())
    }

    /// A chat source must be another chat of the same session with the named turn (completed, or for a
    /// side chat also the active one).
    fn check_source_turn(
        &self,
        session: &str,
        source: &str,
        target: &str,
        turn_id: &str,
        active_allowed: bool,
    ) -> Result<(), RpcError> {
        if source == target {
            return Err(RpcError::invalid_params("a chat cannot be forked onto itself"));
        }
        let Some(record) = self.model.chats.get(source) else {
            return Err(RpcError::invalid_params(format!("unknown source chat {source}")));
        };
        if record.session != session {
            return Err(RpcError::invalid_params(
                "the source chat belongs to another session",
            ));
        }
        let completed = record.state.turns.iter().any(|t| t.id == turn_id);
        let active = record.state.active_turn.as_ref().is_some_and(|t| t.id == turn_id);
        if completed || (active_allowed && active) {
            Ok(())
        } else {
            Err(RpcError::invalid_params(format!(
                "unknown turn {turn_id} in {source}"
            )))
        }
    }

    fn dispose_chat(&mut self, connection: ConnectionId, message: &InboundMessage) -> CommandResult {
        self.require_writer(connection)?;
        let params: DisposeChatParams = message.parse_params()?;
        let chat = params.channel;
        let Some(record) = self.model.chats.get(&chat) else {
            return Err(not_found(&chat));
        };
        let who = &self.connection(connection)?.identity;
        let own = |creator: Option<&String>| creator == Some(&who.subject);
        let session_creator = self
            .model
            .sessions
            .get(&record.session)
            .and_then(|s| s.created_by.as_ref());
        if who.role != Role::Admin && !own(record.created_by.as_ref()) && !own(session_creator) {
            return Err(RpcError::permission_denied(
                "members may dispose only chats they created or chats of their sessions (admins may dispose any)",
            ));
        }
        let Some(record) = self.model.chats.remove(&chat) else {
            return Err(not_found(&chat));
        };
        drop(record.running);
        self.clear_input_needed(&record.session, &chat);
        self.apply_server_action(
            &record.session,
            StateAction::SessionChatRemoved(SessionChatRemovedAction { chat: chat.clone() }),
        );
        self.seq.dispose(&chat);
        self.seq.forget(&crate::archive::key(&chat));
        self.seq.forget(&crate::archive::legacy_key(&chat));
        self.note_disposing(std::iter::once(chat.clone()));
        for state in self.connections.values_mut() {
            state.subscriptions.remove(&chat);
        }
        reply(message.id, &())
    }

    fn completions(&mut self, message: &InboundMessage) -> CommandResult {
        let params: CompletionsParams = message.parse_params()?;
        let Some(chat) = self.model.chats.get(&params.channel) else {
            return Err(not_found(&params.channel));
        };
        let commands = self
            .model
            .sessions
            .get(&chat.session)
            .and_then(|session| session.state.meta.as_ref())
            .and_then(|meta| meta.get(relay_runner::AGENT_STATE_META))
            .and_then(|agent| agent.get("commands"))
            .and_then(serde_json::Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let items = crate::completions::slash_commands(&params.text, params.offset, commands);
        reply(message.id, &CompletionsResult { items })
    }

    fn resolve_session_config(&mut self, message: &InboundMessage) -> CommandResult {
        let params: ResolveSessionConfigParams = message.parse_params()?;
        let provider = match &params.provider {
            Some(provider) => Some(self.providers.get(provider).ok_or_else(|| {
                RpcError::new(
                    ahp_error_codes::PROVIDER_NOT_FOUND,
                    format!("provider not found: {provider}"),
                )
            })?),
            None => self
                .providers
                .default_provider()
                .and_then(|id| self.providers.get(id)),
        };
        // An agent's settings are known once it reported them (its first session since the relay started).
        let schema = provider
            .and_then(|provider| provider.session_config_schema())
            .unwrap_or_else(|| SessionConfigSchema {
                r#type: "object".into(),
                properties: Default::default(),
                required: None,
            });
        let values = relay_runner::acp::options::resolve(&schema, params.config.as_ref());
        reply(message.id, &ResolveSessionConfigResult { schema, values })
    }
}

/// The error for a channel that does not exist (or that this identity may not see: the same answer).
/// A new chat's state: idle, untitled, with the turns it starts with (a fork's copies).
fn new_chat_state(
    chat: &str,
    origin: Option<ChatOrigin>,
    turns: Vec<ahp_types::state::Turn>,
    working_directories: Option<Vec<String>>,
) -> ChatState {
    ChatState {
        resource: chat.to_string(),
        title: String::new(),
        status: SessionStatus::Idle.bits(),
        activity: None,
        modified_at: now(),
        changes: None,
        origin,
        movable: None,
        interactivity: None,
        working_directories,
        changesets: None,
        background_work: None,
        canvases: None,
        turns,
        turns_next_cursor: None,
        active_turn: None,
        steering_message: None,
        queued_messages: None,
        draft: None,
        meta: None,
    }
}

pub fn not_found(channel: &str) -> RpcError {
    // -32001 names a missing session; a session's sub-resources (e.g. `<session>/annotations`) and other
    // URIs are -32008.
    if channel.starts_with("ahp-session:") && !is_session_subresource(channel) {
        RpcError::session_not_found(channel)
    } else {
        RpcError::not_found(channel)
    }
}

/// Whether a URI under `ahp-session:` names something of a session other than the session itself.
fn is_session_subresource(uri: &str) -> bool {
    const SUBRESOURCES: &[&str] = &["/annotations", "/changesets", "/terminals"];
    SUBRESOURCES.iter().any(|suffix| uri.ends_with(suffix))
}
