//! The authoritative state of one host: root state, sessions, chats, agents' terminals and the session
//! catalogue.
//!
//! State changes only through the `ahp` reducers ([`HostModel::reduce`]); this module owns lookups by URI,
//! the newest-first catalogue behind `listSessions`, and the projections (summaries, snapshots) clients read.

use std::collections::HashMap;
use std::time::Instant;

use ahp::reducers::{
    apply_action_to_chat, apply_action_to_root, apply_action_to_session, apply_action_to_terminal,
    ReduceOutcome,
};
use ahp_types::actions::StateAction;
use ahp_types::state::{
    ChatState, ChatSummary, RootState, SessionChatSummary, SessionState, SessionStatus, SessionSummary,
    Snapshot, SnapshotState, TerminalInfo, TerminalState,
};
use ahp_types::ROOT_RESOURCE_URI;
use relay_runner::TurnHandle;
use serde::{Deserialize, Serialize};

/// When a channel last had its snapshot stored, to decide the next one.
#[derive(Debug, Clone)]
pub struct SnapshotClock {
    pub actions_since: u32,
    pub taken_at: Instant,
}

impl SnapshotClock {
    pub fn fresh() -> Self {
        Self {
            actions_since: 0,
            taken_at: Instant::now(),
        }
    }
}

/// A session and what the host keeps beside its protocol state.
pub struct SessionRecord {
    pub state: SessionState,
    pub created_at: String,
    /// Position in the catalogue (higher is newer).
    pub catalog_no: u64,
    /// The summary last announced with `root/sessionAdded` / `root/sessionSummaryChanged`.
    pub announced: SessionSummary,
    pub clock: SnapshotClock,
    /// The subject (of the host's tenant) that created the session: a member may dispose only its own.
    /// `None` for sessions stored before creators were recorded (only admins may dispose those).
    pub created_by: Option<String>,
}

/// A chat, its session, and the provider turn running in it.
pub struct ChatRecord {
    pub session: String,
    pub state: ChatState,
    pub running: Option<TurnHandle>,
    pub clock: SnapshotClock,
    /// Older turns kept only in the store's turn archive (`state.turns` starts at this absolute index).
    pub archived: usize,
    /// The subject that created the chat (see [`SessionRecord::created_by`]).
    pub created_by: Option<String>,
    /// What the chat's agent has yet to be told of its history before the next turn.
    pub agent_context: crate::agent_context::AgentContext,
    /// The JSON size of its held turns, measured once each ([`crate::aging`]).
    pub turn_sizes: TurnSizes,
}

/// The JSON size of a chat's held turns, by turn id: each measured once (an ended turn stays as it is; the
/// newest is measured again each time, as it may still change).
#[derive(Default)]
pub struct TurnSizes(HashMap<String, usize>);

impl TurnSizes {
    /// The sizes of `turns`, in their order; sizes of turns no longer held are forgotten.
    pub fn of(&mut self, turns: &[ahp_types::state::Turn]) -> Vec<usize> {
        let newest = turns.last().map(|turn| turn.id.as_str());
        let sizes: Vec<usize> = turns
            .iter()
            .map(|turn| match self.0.get(&turn.id) {
                Some(size) if Some(turn.id.as_str()) != newest => *size,
                _ => {
                    let size = json_len(turn);
                    self.0.insert(turn.id.clone(), size);
                    size
                }
            })
            .collect();
        if self.0.len() > turns.len() {
            let held: std::collections::HashSet<&str> = turns.iter().map(|turn| turn.id.as_str()).collect();
            self.0.retain(|id, _| held.contains(id.as_str()));
        }
        sizes
    }
}

/// A terminal an agent runs a command in (`ahp-terminal:/…`), owned by a session: any device of the host may
/// subscribe and watch it; it goes with its session.
pub struct TerminalRecord {
    pub session: String,
    pub state: TerminalState,
    pub clock: SnapshotClock,
    /// Set for a terminal a device opened (or a chat's `!command`): its process takes devices' input. `None`
    /// for an agent's command. Stored with the terminal: a host loaded again (another shard took it over)
    /// takes its running process over from the provider that runs it.
    pub device: Option<DeviceTerminal>,
}

impl TerminalRecord {
    /// Whether a process runs it that this host took (a device's terminal, a `!command`): the host must stay
    /// in memory for it, or the process loses where its output goes.
    pub fn runs_here(&self) -> bool {
        self.device.is_some()
            && matches!(
                self.state.lifecycle,
                ahp_types::state::TerminalLifecycleState::Running(_)
            )
    }
}

/// A terminal devices opened, run by the session's provider.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTerminal {
    /// The session's provider, which runs its process.
    pub provider: String,
    /// The chat turn a `!command` runs for (its tool call completes when the command exits).
    pub command_turn: Option<CommandTurn>,
    /// The client that opened it (none for a `!command`): it may dispose it whatever its claim.
    pub opened_by: Option<String>,
}

/// The turn of a chat's `!command`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandTurn {
    pub chat: String,
    pub turn_id: String,
    pub tool_call_id: String,
    pub command: String,
}

/// The URI scheme of terminal channels.
pub const TERMINAL_SCHEME: &str = "ahp-terminal:";

/// What the store keeps as a session's snapshot: its state and its place in the catalogue.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionDocument<S = SessionState, T = String> {
    pub state: S,
    pub created_at: T,
    pub catalog_no: u64,
    #[serde(default = "Option::default", skip_serializing_if = "Option::is_none")]
    pub created_by: Option<T>,
}

/// What the store keeps as a chat's snapshot: its state and its session.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatDocument<C = ChatState, T = String> {
    pub state: C,
    pub session: T,
    #[serde(default = "Option::default", skip_serializing_if = "Option::is_none")]
    pub created_by: Option<T>,
}

/// What the store keeps of a terminal: its state, its session (the parent it is restored with) and, for a
/// device's terminal, what the host needs to take its process over. Read as a chat's document was read before
/// `device` was kept.
#[derive(Serialize, Deserialize)]
pub struct TerminalDocument<S = TerminalState, T = String, D = DeviceTerminal> {
    pub state: S,
    pub session: T,
    #[serde(default = "Option::default", skip_serializing_if = "Option::is_none")]
    pub device: Option<D>,
}

/// What the store keeps of the root channel: what clients set and the host must not forget (its
/// configuration). The rest of root state is derived at start-up (`agents` from the configured providers).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RootDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ahp_types::state::RootConfigState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<ahp_types::common::JsonObject>,
}

/// The host configuration a new host starts with (root state `config`): what admins may change with
/// `root/configChanged`, persisted with the root's snapshot.
pub fn default_root_config(agents: &[ahp_types::state::AgentInfo]) -> ahp_types::state::RootConfigState {
    let providers: Vec<&str> = agents.iter().map(|a| a.provider.as_str()).collect();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "defaultProvider": {
                "type": "string",
                "title": "Default agent",
                "description": "The agent a new session gets when it names none.",
                "enum": providers,
                "default": providers.first(),
            },
            "notice": {
                "type": "string",
                "title": "Notice",
                "description": "A note for everyone on this host, shown by clients that support it.",
                "default": "",
            },
        },
    });
    let values = serde_json::json!({
        "defaultProvider": providers.first(),
        "notice": "",
    });
    let state = serde_json::json!({ "schema": schema, "values": values });
    serde_json::from_value(state).unwrap_or_else(|error| {
        tracing::error!(%error, "the default root configuration does not fit the AHP schema");
        ahp_types::state::RootConfigState {
            schema: ahp_types::state::ConfigSchema {
                r#type: "object".into(),
                properties: Default::default(),
                required: None,
            },
            values: Default::default(),
        }
    })
}

/// What a channel URI names on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    Root,
    Session,
    Chat,
    Terminal,
    /// A connection's resource watch ([`crate::watches`]).
    ResourceWatch,
    /// A session's changeset ([`crate::changesets`]).
    Changeset,
    /// A URI this host has no state for (unknown, disposed, or a kind the relay does not host).
    Unknown,
}

/// The state of one host.
pub struct HostModel {
    pub root: RootState,
    pub sessions: HashMap<String, SessionRecord>,
    pub chats: HashMap<String, ChatRecord>,
    pub terminals: HashMap<String, TerminalRecord>,
    /// Open changesets, by channel.
    pub changesets: HashMap<String, crate::changesets::ChangesetRecord>,
    /// Open resource watches, by channel (never stored).
    pub watches: HashMap<String, crate::watches::WatchRecord>,
    next_catalog_no: u64,
}

impl HostModel {
    /// An empty model; catalogue numbers continue from `next_catalog_no` (numbers are never reused).
    pub fn new(root: RootState, next_catalog_no: u64) -> Self {
        Self {
            root,
            sessions: HashMap::new(),
            chats: HashMap::new(),
            terminals: HashMap::new(),
            changesets: HashMap::new(),
            watches: HashMap::new(),
            next_catalog_no: next_catalog_no.max(1),
        }
    }

    pub fn kind(&self, channel: &str) -> ChannelKind {
        if channel == ROOT_RESOURCE_URI {
            ChannelKind::Root
        } else if self.sessions.contains_key(channel) {
            ChannelKind::Session
        } else if self.chats.contains_key(channel) {
            ChannelKind::Chat
        } else if self.terminals.contains_key(channel) {
            ChannelKind::Terminal
        } else if self.watches.contains_key(channel) {
            ChannelKind::ResourceWatch
        } else if self.changesets.contains_key(channel) {
            ChannelKind::Changeset
        } else {
            ChannelKind::Unknown
        }
    }

    /// Apply `action` to the state of `channel` with the `ahp` reducers.
    pub fn reduce(&mut self, channel: &str, action: &StateAction) -> ReduceOutcome {
        if channel == ROOT_RESOURCE_URI {
            return apply_action_to_root(&mut self.root, action);
        }
        if let Some(session) = self.sessions.get_mut(channel) {
            return apply_action_to_session(&mut session.state, action);
        }
        if let Some(chat) = self.chats.get_mut(channel) {
            return apply_action_to_chat(&mut chat.state, action);
        }
        if let Some(terminal) = self.terminals.get_mut(channel) {
            return apply_action_to_terminal(&mut terminal.state, action);
        }
        if let Some(changeset) = self.changesets.get_mut(channel) {
            return ahp::reducers::apply_action_to_changeset(&mut changeset.state, action);
        }
        ReduceOutcome::OutOfScope
    }

    /// Insert a new session at the head of the catalogue; returns its catalogue number.
    pub fn insert_new_session(&mut self, uri: String, state: SessionState, created_at: String) -> u64 {
        let catalog_no = self.next_catalog_no;
        self.next_catalog_no += 1;
        self.insert_session(uri, state, created_at, catalog_no);
        catalog_no
    }

    /// Insert a session (new, or restored from the store).
    pub fn insert_session(&mut self, uri: String, state: SessionState, created_at: String, catalog_no: u64) {
        self.next_catalog_no = self.next_catalog_no.max(catalog_no + 1);
        let announced = summary_of(&uri, &state, &created_at);
        self.sessions.insert(
            uri,
            SessionRecord {
                state,
                created_at,
                catalog_no,
                announced,
                clock: SnapshotClock::fresh(),
                created_by: None,
            },
        );
    }

    /// Remove a session and every chat and terminal that belongs to it (stopping their turns); returns the
    /// chats' and terminals' URIs.
    pub fn remove_session(&mut self, uri: &str) -> Vec<String> {
        if self.sessions.remove(uri).is_none() {
            return Vec::new();
        }
        let mut children: Vec<String> = self
            .chats
            .iter()
            .filter(|(_, chat)| chat.session == uri)
            .map(|(chat, _)| chat.clone())
            .collect();
        for chat in &children {
            self.chats.remove(chat);
        }
        let terminals: Vec<String> = self
            .terminals
            .iter()
            .filter(|(_, terminal)| terminal.session == uri)
            .map(|(terminal, _)| terminal.clone())
            .collect();
        for terminal in &terminals {
            self.terminals.remove(terminal);
        }
        children.extend(terminals);
        children
    }

    /// Whether `channel` is `session`, one of its chats or one of its terminals.
    pub fn belongs_to(&self, channel: &str, session: &str) -> bool {
        (channel == session && self.sessions.contains_key(session))
            || self
                .chats
                .get(channel)
                .is_some_and(|chat| chat.session == session)
            || self
                .terminals
                .get(channel)
                .is_some_and(|terminal| terminal.session == session)
    }

    /// Root state's `terminals` as the terminals held now say, oldest URI first.
    pub fn terminal_list(&self) -> Vec<TerminalInfo> {
        let mut list: Vec<TerminalInfo> = self
            .terminals
            .iter()
            .map(|(uri, terminal)| TerminalInfo {
                resource: uri.clone(),
                title: terminal.state.title.clone(),
                claim: terminal.state.claim.clone(),
                lifecycle: terminal.state.lifecycle.clone(),
            })
            .collect();
        list.sort_by(|a, b| a.resource.cmp(&b.resource));
        list
    }

    /// The snapshot clock of a session, chat or terminal.
    pub fn clock_mut(&mut self, channel: &str) -> Option<&mut SnapshotClock> {
        if let Some(record) = self.sessions.get_mut(channel) {
            return Some(&mut record.clock);
        }
        if let Some(record) = self.chats.get_mut(channel) {
            return Some(&mut record.clock);
        }
        if let Some(record) = self.changesets.get_mut(channel) {
            return Some(&mut record.clock);
        }
        self.terminals.get_mut(channel).map(|record| &mut record.clock)
    }

    /// The JSON the store keeps for a channel: the root's configuration, or a session or chat.
    pub fn document(&self, channel: &str) -> Option<(Option<String>, String)> {
        if channel == ROOT_RESOURCE_URI {
            let doc = RootDocument {
                config: self.root.config.clone(),
                meta: self.root.meta.clone(),
            };
            return serde_json::to_string(&doc).ok().map(|json| (None, json));
        }
        if let Some(s) = self.sessions.get(channel) {
            let doc = SessionDocument {
                state: &s.state,
                created_at: &s.created_at,
                catalog_no: s.catalog_no,
                created_by: s.created_by.as_ref(),
            };
            return serde_json::to_string(&doc).ok().map(|json| (None, json));
        }
        if let Some(terminal) = self.terminals.get(channel) {
            let doc = TerminalDocument {
                state: &terminal.state,
                session: &terminal.session,
                device: terminal.device.as_ref(),
            };
            return serde_json::to_string(&doc)
                .ok()
                .map(|json| (Some(terminal.session.clone()), json));
        }
        if let Some(changeset) = self.changesets.get(channel) {
            let doc = crate::changesets::ChangesetDocument {
                state: changeset.state.clone(),
                session: changeset.session.clone(),
                scope: changeset.scope.clone(),
            };
            return serde_json::to_string(&doc)
                .ok()
                .map(|json| (Some(changeset.session.clone()), json));
        }
        let chat = self.chats.get(channel)?;
        let doc = ChatDocument {
            state: &chat.state,
            session: &chat.session,
            created_by: chat.created_by.as_ref(),
        };
        serde_json::to_string(&doc)
            .ok()
            .map(|json| (Some(chat.session.clone()), json))
    }

    /// A snapshot of `channel` at `from_seq`; for chats, only the newest `turns` turns inline (with a cursor
    /// to the older ones).
    pub fn snapshot(&self, channel: &str, from_seq: u64, turns: usize) -> Option<Snapshot> {
        let state = match self.kind(channel) {
            ChannelKind::Root => SnapshotState::Root(Box::new(self.root.clone())),
            ChannelKind::Session => {
                SnapshotState::Session(Box::new(self.sessions.get(channel)?.state.clone()))
            }
            ChannelKind::Chat => {
                let chat = self.chats.get(channel)?;
                SnapshotState::Chat(Box::new(limit_turns(&chat.state, turns, chat.archived)))
            }
            ChannelKind::Terminal => {
                SnapshotState::Terminal(Box::new(self.terminals.get(channel)?.state.clone()))
            }
            ChannelKind::ResourceWatch => {
                SnapshotState::ResourceWatch(Box::new(self.watches.get(channel)?.state.clone()))
            }
            ChannelKind::Changeset => {
                SnapshotState::Changeset(Box::new(self.changesets.get(channel)?.state.clone()))
            }
            ChannelKind::Unknown => return None,
        };
        Some(Snapshot {
            resource: channel.to_string(),
            state,
            from_seq: from_seq as i64,
        })
    }
}

/// What the snapshots of one reply may still take, in serialized bytes: a reply is budgeted while it is built,
/// so an over-budget request is refused before the rest of its snapshots are made.
pub struct ReplyBudget {
    left: usize,
}

/// A snapshot does not fit what is left of its reply's budget, even with no turns inline.
#[derive(Debug)]
pub struct OverBudget;

/// Room a reply keeps for its JSON-RPC frame and result fields around the snapshots.
const REPLY_FRAME_BYTES: usize = 4 * 1024;

impl ReplyBudget {
    /// The budget of a reply of at most `max_reply_bytes`.
    pub fn new(max_reply_bytes: usize) -> Self {
        Self {
            left: max_reply_bytes.saturating_sub(REPLY_FRAME_BYTES),
        }
    }

    fn take(&mut self, bytes: usize) -> Result<(), OverBudget> {
        self.left = self.left.checked_sub(bytes).ok_or(OverBudget)?;
        Ok(())
    }
}

/// How many bytes `value` takes as JSON, without building the text.
pub fn json_len<T: Serialize>(value: &T) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing to a counter cannot fail; a value that cannot be serialized counts as nothing (it fails later,
    // where the reply is built, with its error).
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

impl HostModel {
    /// [`HostModel::snapshot`] within what is left of `budget`, which it takes from: a chat keeps the newest of
    /// its (at most `turns`) turns that fit inline, its cursor pointing before them (AHP lets a host return
    /// fewer turns than asked; `fetchTurns` pages in the rest). `Ok(None)` for a channel the host lacks.
    pub fn snapshot_within(
        &self,
        channel: &str,
        from_seq: u64,
        turns: usize,
        budget: &mut ReplyBudget,
    ) -> Result<Option<Snapshot>, OverBudget> {
        let turns = match (self.kind(channel), self.chats.get(channel)) {
            (ChannelKind::Chat, Some(chat)) => {
                let held = &chat.state.turns;
                let asked = turns.min(held.len());
                // The chat without the turns it may show, then its turns newest first while they fit.
                let base = json_len(&limit_turns(&chat.state, 0, chat.archived));
                // (A margin: the cursor that ends up in the snapshot may be a few digits longer.)
                let mut room = budget.left.saturating_sub(base + 64);
                let mut fitting = 0;
                for turn in held.iter().rev().take(asked) {
                    let size = json_len(turn) + 1;
                    if size > room {
                        break;
                    }
                    room -= size;
                    fitting += 1;
                }
                fitting
            }
            _ => turns,
        };
        let Some(snapshot) = self.snapshot(channel, from_seq, turns) else {
            return Ok(None);
        };
        budget.take(json_len(&snapshot))?;
        Ok(Some(snapshot))
    }
}

/// A chat state with only its newest `turns` turns inline, and a cursor to fetch the older ones. `archived` is
/// the absolute index of the first turn held in memory.
pub fn limit_turns(chat: &ChatState, turns: usize, archived: usize) -> ChatState {
    let mut limited = chat.clone();
    if chat.turns.len() > turns {
        let cut = chat.turns.len() - turns;
        limited.turns = chat.turns[cut..].to_vec();
        limited.turns_next_cursor = crate::archive::cursor_before(archived + cut);
    }
    limited
}

/// The absolute index of the first turn a chat snapshot carries (0 for other snapshots).
pub fn first_turn_of(snapshot: &Snapshot) -> usize {
    match &snapshot.state {
        SnapshotState::Chat(chat) => crate::archive::first_held(chat),
        _ => 0,
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn session(status: u32, default_chat: Option<&str>, chats: &[(&str, u32, &str)]) -> SessionState {
        let chats: Vec<serde_json::Value> = chats
            .iter()
            .map(|(uri, status, modified)| {
                serde_json::json!({"resource": uri, "title": "", "status": status, "modifiedAt": modified,
                    "activity": format!("{uri} activity")})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "provider": "demo", "title": "", "status": status, "lifecycle": "ready",
            "activeClients": [], "chats": chats, "defaultChat": default_chat
        }))
        .expect("session state")
    }

    const IDLE: u32 = SessionStatus::Idle.bits();
    const BUSY: u32 = SessionStatus::InProgress.bits();
    const INPUT: u32 = SessionStatus::InputNeeded.bits();
    const ERROR: u32 = SessionStatus::Error.bits();
    const READ: u32 = SessionStatus::IsRead.bits();

    #[test]
    fn the_default_chat_leads_and_input_and_errors_are_promoted() {
        // The default chat's activity, the session's own flags.
        let s = session(IDLE | READ, Some("b"), &[("a", BUSY, "2"), ("b", IDLE, "1")]);
        assert_eq!(aggregate_status(&s), (IDLE | READ, Some("b activity".into())));
        // Without a default chat, the most recently modified one.
        let s = session(IDLE, None, &[("a", BUSY, "2"), ("b", IDLE, "1")]);
        assert_eq!(aggregate_status(&s).0, BUSY);
        // Any chat needing input promotes InputNeeded, with that chat's activity.
        let s = session(IDLE, Some("b"), &[("a", INPUT, "1"), ("b", IDLE, "2")]);
        assert_eq!(aggregate_status(&s), (INPUT, Some("a activity".into())));
        // Any chat in error promotes Error, which overrides the lead chat's bits (they are one state).
        let s = session(IDLE, Some("b"), &[("a", ERROR, "1"), ("b", BUSY, "2")]);
        assert_eq!(aggregate_status(&s).0, ERROR);
        // So does a chat needing input, and Error wins over it.
        let s = session(IDLE, Some("b"), &[("a", INPUT, "1"), ("b", BUSY, "2")]);
        assert_eq!(aggregate_status(&s).0, INPUT);
        let s = session(
            IDLE,
            Some("b"),
            &[("a", INPUT, "1"), ("c", ERROR, "1"), ("b", BUSY, "2")],
        );
        assert_eq!(aggregate_status(&s).0, ERROR);
        // No chats: the session's own status.
        let s = session(INPUT, None, &[]);
        assert_eq!(aggregate_status(&s).0, INPUT);
        // The activity text is the driving chat's, never the lead chat's beside a promoted status.
        let mut s = session(IDLE, Some("b"), &[("a", ERROR, "1"), ("b", BUSY, "2")]);
        s.chats[0].activity = None;
        assert_eq!(aggregate_status(&s), (ERROR, None));
    }

    #[test]
    fn a_channel_belongs_to_its_session_only() {
        let root: RootState = serde_json::from_value(serde_json::json!({"agents": []})).expect("root");
        let mut model = HostModel::new(root, 1);
        for uri in ["ahp-session:/a", "ahp-session:/b"] {
            model.insert_new_session(uri.into(), session(IDLE, None, &[]), "now".into());
        }
        let chat: ChatState = serde_json::from_value(serde_json::json!({
            "resource": "ahp-chat:/a", "title": "", "status": IDLE, "turns": [], "modifiedAt": "now"
        }))
        .unwrap_or_else(|error| panic!("chat state: {error}"));
        model.chats.insert(
            "ahp-chat:/a".into(),
            ChatRecord {
                session: "ahp-session:/a".into(),
                state: chat,
                running: None,
                clock: SnapshotClock::fresh(),
                archived: 0,
                created_by: None,
                agent_context: Default::default(),
                turn_sizes: Default::default(),
            },
        );
        assert!(model.belongs_to("ahp-session:/a", "ahp-session:/a"));
        assert!(model.belongs_to("ahp-chat:/a", "ahp-session:/a"));
        assert!(!model.belongs_to("ahp-chat:/a", "ahp-session:/b"));
        assert!(!model.belongs_to("ahp-session:/b", "ahp-session:/a"));
        assert!(!model.belongs_to("ahp-session:/gone", "ahp-session:/gone"));
    }
}
