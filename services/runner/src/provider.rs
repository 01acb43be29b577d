//! The provider interface between the host and an agent.

use std::collections::BTreeMap;
use std::sync::Arc;

use ahp_types::actions::StateAction;
use ahp_types::state::{AgentInfo, ChatInputAnswer, ChatInputResponseKind};
use tokio::sync::mpsc;

/// Where a provider's actions go. Implemented by the host, which applies each action with the `ahp` reducers,
/// assigns it a `serverSeq` and publishes it.
pub trait ChatSink: Send + Sync + 'static {
    /// Emit one server action on `channel` (the turn's chat, its session, a terminal). Says whether it was
    /// applied, did not apply to the channel's state now (e.g. the turn ended; the channel goes on), or found
    /// the channel gone (the provider stops producing for it).
    fn emit(&self, channel: &str, action: StateAction) -> Emitted;
    /// [`ChatSink::emit`] for an agent of `session`: [`Emitted::Gone`] unless `channel` is that session, one of
    /// its chats or one of its terminals. How actions from a runner (another process) are applied.
    fn emit_in(&self, session: &str, channel: &str, action: StateAction) -> Emitted {
        let _ = session;
        self.emit(channel, action)
    }
    /// Open the terminal channel `uri` (`ahp-terminal:/…`) for a command an agent of `session` runs, in its
    /// initial `state`: the host lists it in root state `terminals` and any device may watch it; its output
    /// then arrives with [`ChatSink::emit`] on `uri`. Returns `false` when the host refused it (the session is
    /// gone, or holds too many running terminals).
    fn open_terminal(&self, _session: &str, _uri: &str, _state: ahp_types::state::TerminalState) -> bool {
        false
    }
    /// An agent reported the session settings it takes (`agent` is its provider id). Hosts need not act: a
    /// provider that runs elsewhere (a runner) uses it to keep its shard's [`Provider::session_config_schema`].
    fn agent_settings_reported(&self, _agent: &str, _schema: &ahp_types::state::SessionConfigSchema) {}
    /// What the host lists for an agent changed (e.g. the models its agent reported): the host updates root
    /// state `agents` with `root/agentsChanged`.
    fn agent_changed(&self, _info: AgentInfo) {}
    /// Whether what is emitted here can still reach the host's owner (false once the stream to its shard ended,
    /// or the host left the process): a producer that is quiet asks, one that emits learns it from
    /// [`Emitted::Unreachable`].
    fn reachable(&self) -> bool {
        true
    }
    /// Resolves once this sink has room for more (its host's pending batch is under its budget while the store
    /// is slow): a producer awaits it before it reads more of an agent's or a terminal's output, so a stuck
    /// store fills their pipes, not memory. `None`: always room.
    fn room(&self) -> Option<Room> {
        None
    }
}

/// A wait for a sink's room ([`ChatSink::room`]).
pub type Room = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

/// What became of an action a provider emitted ([`ChatSink::emit`]). A reducer's no-op is not the end of
/// a channel: a terminal whose open command a clear took goes on (review lesson 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emitted {
    /// Applied by the host (from a runner: sent to it, in order).
    Applied,
    /// The channel is there, but the action does not apply to its state now (a turn that ended, a command a
    /// clear took): nothing changed, and the channel goes on.
    NotApplied,
    /// The channel, its session or its host is gone: stop producing for it.
    Gone,
    /// Nobody heard it: the host's owner is out of reach from here (the stream to its shard ended, or the host
    /// left this process). The channel may live on with the host's next owner, which may take it over
    /// ([`Provider::adopt_terminal`]); what was emitted meanwhile is the producer's to hold or drop.
    Unreachable,
}

impl Emitted {
    /// Whether the host applied it.
    pub fn applied(self) -> bool {
        self == Emitted::Applied
    }

    /// Whether the channel is gone.
    pub fn gone(self) -> bool {
        self == Emitted::Gone
    }
}

/// The key of a session's `_meta` where its provider keeps what it needs to continue the session later.
pub const AGENT_STATE_META: &str = "ahpRelay/agent";

/// A turn the host asks a provider to run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TurnRequest {
    pub session: String,
    /// The tenant of the session (an agent restarted for this turn works in that tenant's workspace).
    pub tenant: String,
    /// The host of the session.
    pub host: String,
    /// The session's working directory as its client named it, if any.
    pub working_directory: Option<String>,
    /// What the provider stored about the session in its state (`_meta["ahpRelay/agent"]`, e.g. the ACP
    /// session id), to continue it after a restart.
    pub agent_state: Option<serde_json::Value>,
    pub chat: String,
    pub turn_id: String,
    pub prompt: String,
    /// The chat's history that the agent has not seen and this turn continues, as a transcript to give it
    /// before the prompt: a fork's copied turns, a side chat's source (that chat up to the source turn, and
    /// the selection), or the turns a truncation kept. `None` when the agent has the chat's context.
    #[serde(default)]
    pub context: Option<String>,
    /// The agent must not continue what it had for this chat (a truncation removed turns it saw): it starts
    /// the chat afresh, with [`TurnRequest::context`].
    #[serde(default)]
    pub fresh: bool,
    /// The message's attachments, as the host resolved them (a referenced chat becomes its transcript).
    #[serde(default)]
    pub attachments: Vec<TurnAttachment>,
    /// The model the user picked for this turn (`Message.model`), if any.
    pub model: Option<String>,
    /// The session's config values (`SessionState.config.values`): the agent's settings to apply first.
    #[serde(default)]
    pub config: Option<ahp_types::common::JsonObject>,
    /// Whether this is the first turn of the session (providers may set a title).
    pub first_turn: bool,
    /// Tools the session's active clients offer to run themselves (client tools), as (client id, tool name).
    pub client_tools: Vec<ClientTool>,
}

/// An attachment of a turn's message, resolved by the host into what an agent can take.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum TurnAttachment {
    /// Text for the model: a simple attachment's model representation, or a referenced chat's transcript.
    Text { label: String, text: String },
    /// A resource the agent reads itself, by URI.
    Link {
        label: String,
        uri: String,
        content_type: Option<String>,
    },
    /// Content the client embedded (base64), with its MIME type.
    Embedded {
        label: String,
        content_type: String,
        data: String,
    },
}

impl TurnAttachment {
    /// The label the user sees for it.
    pub fn label(&self) -> &str {
        match self {
            TurnAttachment::Text { label, .. }
            | TurnAttachment::Link { label, .. }
            | TurnAttachment::Embedded { label, .. } => label,
        }
    }
}

/// A tool an active client of the session runs itself.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClientTool {
    pub client_id: String,
    pub name: String,
}

/// A user decision the host forwards to the provider running a turn.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum TurnControl {
    /// A client confirmed or denied a tool call (already applied to state by the host), maybe naming the
    /// option it chose.
    ToolCallConfirmed {
        tool_call_id: String,
        approved: bool,
        selected_option_id: Option<String>,
    },
    /// A client answered an input request (already applied to state by the host).
    InputCompleted {
        request_id: String,
        response: ChatInputResponseKind,
        answers: Option<std::collections::HashMap<String, ChatInputAnswer>>,
    },
    /// A tool call of the turn completed (by the client that ran it, or failed by the host when that client
    /// went away).
    ToolCallCompleted { tool_call_id: String, success: bool },
    /// A steering message for the running turn: the agent takes it at its next step (the host has already
    /// removed it from the chat's pending steering message).
    Steer { text: String },
    /// The turn was cancelled: stop now and emit nothing more.
    Cancelled,
}

/// The host's handle on a running turn. Dropping it cancels the turn.
#[derive(Debug)]
pub struct TurnHandle {
    control: mpsc::UnboundedSender<TurnControl>,
}

impl TurnHandle {
    pub fn new(control: mpsc::UnboundedSender<TurnControl>) -> Self {
        Self { control }
    }

    /// Forward a decision; returns `false` if the turn already finished.
    pub fn send(&self, control: TurnControl) -> bool {
        self.control.send(control).is_ok()
    }
}

impl Drop for TurnHandle {
    fn drop(&mut self) {
        let _ = self.control.send(TurnControl::Cancelled);
    }
}

/// A session the host asks a provider to prepare.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SessionRequest {
    /// The session's URI (the channel `session/ready` or `session/creationFailed` goes to).
    pub session: String,
    /// The tenant the session belongs to (its agent works under that tenant's part of the workspace).
    pub tenant: String,
    /// The host (of that tenant) the session belongs to: session URIs are unique within a host only.
    pub host: String,
    /// The session's working directory as the client named it (`file://` URI or path), if any.
    pub working_directory: Option<String>,
    /// The git branch the session works on (its `branch` setting), switched to before its agent starts.
    #[serde(default)]
    pub branch: Option<String>,
}

/// A terminal of a host of a tenant: terminal URIs are chosen by clients, so they are unique within a host only.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct TerminalKey {
    pub tenant: String,
    pub host: String,
    pub uri: String,
}

/// A terminal a device opens in a session (`createTerminal`), or a chat's `!command`, as the host asks the
/// session's provider to start it. The host has opened the terminal's channel; the provider emits its output
/// there ([`ChatSink::emit_in`] with the session).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TerminalRequest {
    pub key: TerminalKey,
    /// The session the terminal runs in (its sandbox, directories and quotas).
    pub session: String,
    /// The session's working directory as its client named it, if any.
    pub working_directory: Option<String>,
    /// Where the shell starts (`file://` URI or path inside the session's working directory), if named.
    pub cwd: Option<String>,
    pub cols: i64,
    pub rows: i64,
    /// Run this command line (`sh -c`) instead of an interactive shell; the terminal exits with it.
    pub command: Option<String>,
}

/// The provider's answer to [`Provider::start_terminal`]: started, or why not.
pub type TerminalStarted = tokio::sync::oneshot::Receiver<Result<(), String>>;

/// An answer to [`Provider::start_terminal`] that is already known.
pub fn terminal_answer(answer: Result<(), String>) -> TerminalStarted {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let _ = tx.send(answer);
    rx
}

/// How a session's preparation goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionStart {
    /// Ready at once: the host dispatches `session/ready` itself.
    Ready,
    /// Under way: the provider emits `session/ready` or `session/creationFailed` on the session later.
    Pending,
    /// Refused before anything started (e.g. a working directory outside the workspace): the host refuses
    /// `createSession` with this message.
    Refused(String),
}

/// An agent backend.
pub trait Provider: Send + Sync + 'static {
    /// The `AgentInfo` listed in root state's `agents`.
    fn info(&self) -> AgentInfo;
    /// Prepare a new session. Must not block and must not emit synchronously (the host holds its lock).
    fn create_session(&self, _session: SessionRequest, _sink: Arc<dyn ChatSink>) -> SessionStart {
        SessionStart::Ready
    }
    /// The root under which its sessions' working directories live (`<root>/<tenant>/…`), if it has one.
    fn workspace_root(&self) -> Option<std::path::PathBuf> {
        None
    }
    /// The session config this provider's sessions take (`resolveSessionConfig`), if any.
    fn session_config_schema(&self) -> Option<ahp_types::state::SessionConfigSchema> {
        None
    }
    /// Whether a running turn takes steering messages ([`TurnControl::Steer`]). When it does not, the host
    /// keeps a steering message pending and starts it as the next turn.
    fn can_steer(&self) -> bool {
        false
    }
    /// Start running a turn; output goes to `sink`.
    fn start_turn(&self, turn: TurnRequest, sink: Arc<dyn ChatSink>) -> TurnHandle;
    /// The session (`session` on `host` of `tenant`) is gone: stop everything the provider runs for it.
    fn dispose_session(&self, _tenant: &str, _host: &str, _session: &str) {}
    /// Whether [`Provider::start_terminal`] can run a terminal (the provider has a workspace of the session's
    /// on a machine): a `!command` or `createTerminal` for a session of one that cannot is not offered a
    /// terminal that would only fail.
    fn runs_terminals(&self) -> bool {
        false
    }
    /// Start a device's terminal (a shell on a pseudoterminal in the session's sandbox). Must not block.
    /// Providers that run nothing on a machine of their own refuse.
    fn start_terminal(&self, _request: TerminalRequest, _sink: Arc<dyn ChatSink>) -> TerminalStarted {
        terminal_answer(Err(
            "this session's agent has no workspace to open a terminal in".into()
        ))
    }
    /// What a device typed into a terminal this provider started.
    fn terminal_input(&self, _terminal: &TerminalKey, _data: &str) {}
    /// A device resized a terminal this provider started.
    fn terminal_resized(&self, _terminal: &TerminalKey, _cols: i64, _rows: i64) {}
    /// Kill a terminal's processes (disposed, or its `!command`'s turn cancelled).
    fn kill_terminal(&self, _terminal: &TerminalKey) {}
    /// Whether its processes run in other processes (runners), which may register again later: a terminal it
    /// does not hold now may be held once its runner is back.
    fn runs_elsewhere(&self) -> bool {
        false
    }
    /// Take over a terminal of `session` this provider still runs for a host that moved (another shard owns it
    /// now) or was loaded again: its output goes to `sink` from now on. Answers an error when no such terminal
    /// runs here. Must not block.
    fn adopt_terminal(
        &self,
        _terminal: &TerminalKey,
        _session: &str,
        _sink: Arc<dyn ChatSink>,
    ) -> TerminalStarted {
        terminal_answer(Err("this session's agent runs no terminals".into()))
    }
}

/// The providers configured for a host, by provider id.
#[derive(Clone, Default)]
pub struct ProviderRegistry {
    providers: BTreeMap<String, Arc<dyn Provider>>,
    /// Tenants' files (AHP `resource*`), where this process holds the agents' workspace.
    files: Option<Arc<dyn crate::files::access::FileAccess>>,
    /// The first provider added: the default.
    first: Option<String>,
}

impl ProviderRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, provider: Arc<dyn Provider>) -> Self {
        let id = provider.info().provider;
        self.first.get_or_insert_with(|| id.clone());
        self.providers.insert(id, provider);
        self
    }

    /// Serve tenants' files from `files`.
    pub fn with_files(mut self, files: Arc<dyn crate::files::access::FileAccess>) -> Self {
        self.files = Some(files);
        self
    }

    /// Tenants' files, where this process serves them.
    pub fn files(&self) -> Option<&Arc<dyn crate::files::access::FileAccess>> {
        self.files.as_ref()
    }

    pub fn get(&self, id: &str) -> Option<&Arc<dyn Provider>> {
        self.providers.get(id)
    }

    /// The provider used when `createSession` names none.
    pub fn default_provider(&self) -> Option<&str> {
        self.first.as_deref()
    }

    /// Where `tenant`'s working directories may be (`initialize`'s `defaultDirectory`): its part of the workspace
    /// of the default provider, else of the first provider that has one; as a `file://` URI.
    pub fn default_directory(&self, tenant: &str) -> Option<String> {
        let first = self.first.as_ref().and_then(|id| self.providers.get(id));
        first
            .into_iter()
            .chain(self.providers.values())
            .find_map(|provider| provider.workspace_root())
            .map(|root| crate::acp::workspace::tenant_dir_uri(&root, tenant))
    }

    /// The providers whose sessions hold a workspace (files, terminals, `!commands`), by id.
    pub fn with_workspace(&self) -> Vec<String> {
        self.providers
            .iter()
            .filter(|(_, provider)| provider.runs_terminals())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Every provider's `AgentInfo`, the default first.
    pub fn agents(&self) -> Vec<AgentInfo> {
        let mut agents: Vec<AgentInfo> = self.providers.values().map(|p| p.info()).collect();
        if let Some(first) = &self.first {
            agents.sort_by_key(|agent| agent.provider != *first);
        }
        agents
    }
}
