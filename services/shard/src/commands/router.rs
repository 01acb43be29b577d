//! AHP commands: routing every command to its handler, and the connection-level ones (`initialize`,
//! `subscribe`/`unsubscribe` with each connection's turn windows, `completions`, `resolveSessionConfig`).
//! Sessions' and chats' own commands live in [`crate::commands::sessions`] and [`crate::commands::chats`]. Each handler validates
//! its params, changes state only through the sequencer and reducers, and answers with one JSON-RPC frame.

use ahp_types::commands::{
    AuthenticateParams, CompletionsParams, CompletionsResult, Implementation, InitializeParams,
    InitializeResult, ResolveSessionConfigParams, ResolveSessionConfigResult, SubscribeParams,
    SubscribeResult, UnsubscribeParams,
};
use ahp_types::errors::{ahp_error_codes, UnsupportedProtocolVersionErrorData};
use ahp_types::state::SessionConfigSchema;
use ahp_types::PROTOCOL_VERSION;
use relay_core::link::{CloseRequest, CommandReply, SubscriptionChange};
use relay_core::rpc::{self, InboundMessage, RpcError};
use relay_core::ConnectionId;

use crate::host::HostCore;
use crate::model::ChannelKind;
use crate::reply::{not_found, reply, CommandResult};
use crate::versions::negotiate;

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
    "createTerminal",
    "disposeTerminal",
    "invokeChangesetOperation",
    "sessionConfigCompletions",
    "moveChat",
];

/// The `InitializeResult._meta` key listing `initialSubscriptions` that name no channel of this host.
pub const UNAVAILABLE_SUBSCRIPTIONS: &str = "ahpRelay/unavailableSubscriptions";
/// `initialize`'s `_meta` key listing the agents (provider ids) whose sessions hold a workspace.
pub const WORKSPACE_AGENTS: &str = "ahpRelay/workspaceAgents";
/// `initialize`'s `_meta` key saying that sessions name the terminals devices opened in them
/// (`_meta["ahpRelay/terminals"]` of a session; none opened when it is missing).
pub const SESSIONS_NAME_TERMINALS: &str = "ahpRelay/sessionsNameTerminals";

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
            "disposeTerminal" => self.dispose_terminal_command(connection, message),
            "sessionConfigCompletions" => self.session_config_completions(message),
            "moveChat" => {
                self.require_writer(connection)?;
                self.move_chat(message)
            }
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

    pub(crate) fn require_writer(&self, connection: ConnectionId) -> Result<(), RpcError> {
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
            // A resource watch is its connection's alone: to any other it does not exist.
            if self
                .model
                .watches
                .get(&channel)
                .is_some_and(|watch| watch.owner != connection)
            {
                unavailable.push(channel);
                continue;
            }
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
        // Channels that do not exist (or are not this host's) are said so, not silently left out; and which
        // agents' sessions have a workspace (files, terminals), so a client offers those panes only there.
        let mut meta = ahp_types::common::JsonObject::new();
        if !unavailable.is_empty() {
            meta.insert(UNAVAILABLE_SUBSCRIPTIONS.into(), serde_json::json!(unavailable));
        }
        meta.insert(
            WORKSPACE_AGENTS.into(),
            serde_json::json!(self.providers.with_workspace()),
        );
        meta.insert(SESSIONS_NAME_TERMINALS.into(), serde_json::Value::Bool(true));
        let meta = Some(meta);
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
            default_directory: self.providers.default_directory(&self.key.tenant),
            completion_trigger_characters: Some(
                std::iter::once(crate::commands::completions::TRIGGER)
                    .chain(
                        self.providers
                            .files()
                            .map(|_| crate::commands::completions::FILE_TRIGGER),
                    )
                    .map(str::to_string)
                    .collect(),
            ),
            terminal_command_prefix: self
                .limits
                .device_terminals
                .then(|| crate::workspace::command_turns::TERMINAL_COMMAND_PREFIX.to_string()),
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
        self.remember_window(connection, channel, first_turn);
    }

    /// Keep the connection's window of `chat` with its clientId, for a `reconnect` that replays.
    pub(crate) fn remember_window(&mut self, connection: ConnectionId, chat: &str, first_turn: usize) {
        let Some(client_id) = self
            .connections
            .get(&connection)
            .and_then(|state| state.client_id.as_ref())
        else {
            return;
        };
        if let Some(binding) = self.clients.get_mut(client_id) {
            binding.turn_windows.insert(chat.to_string(), first_turn);
        }
    }

    fn subscribe(&mut self, connection: ConnectionId, message: &InboundMessage) -> CommandResult {
        let params: SubscribeParams = message.parse_params()?;
        let turns = match params.view.and_then(|v| v.turns) {
            Some(n) if n < 0 => return Err(RpcError::invalid_params("view.turns must not be negative")),
            Some(n) => n as usize,
            // "All retained turns" (see crate::model::archive).
            None => self.limits.retained_turns,
        };
        // A resource watch is its connection's alone: to any other it does not exist.
        if self
            .model
            .watches
            .get(&params.channel)
            .is_some_and(|watch| watch.owner != connection)
        {
            return Err(not_found(&params.channel));
        }
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
        if let Some(binding) = self.clients.get_mut(&client_id) {
            binding.turn_windows.remove(&params.channel);
        }
        if self.model.kind(&params.channel) == ChannelKind::Session
            && !self.client_subscribed(&client_id, &params.channel)
        {
            self.remove_active_client(&params.channel, &client_id);
        }
        // A watch is released when its subscriber leaves (AHP: MUST).
        if self.model.kind(&params.channel) == ChannelKind::ResourceWatch {
            self.release_watch(connection, &params.channel);
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
    pub(crate) fn check_new_uri(&self, uri: &str, scheme: &str, exists_code: i32) -> Result<(), RpcError> {
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
        let items = crate::commands::completions::slash_commands(&params.text, params.offset, commands);
        reply(message.id, &CompletionsResult { items })
    }

    fn resolve_session_config(&mut self, message: &InboundMessage) -> CommandResult {
        let params: ResolveSessionConfigParams = message.parse_params()?;
        reply(message.id, &self.resolved_config(&params)?)
    }

    /// The agent's settings (schema and values with defaults) for `params` (the branch of a repository is added
    /// by [`crate::commands::branches`]).
    pub(crate) fn resolved_config(
        &self,
        params: &ResolveSessionConfigParams,
    ) -> Result<ResolveSessionConfigResult, RpcError> {
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
        Ok(ResolveSessionConfigResult { schema, values })
    }
}
