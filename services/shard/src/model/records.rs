//! What a host keeps of each channel beside its protocol state: sessions, chats, terminals, changesets and
//! resource watches, and when each last had its snapshot stored.

use std::collections::HashMap;
use std::time::Instant;

use ahp_types::state::{ChangesetState, ResourceWatchState};
use ahp_types::state::{ChatState, SessionState, SessionSummary, TerminalState};
use relay_core::ConnectionId;
use relay_runner::files::WatchHandle;
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
    pub agent_context: crate::model::agent_context::AgentContext,
    /// The JSON size of its held turns, measured once each ([`crate::replay::aging`]).
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
/// The `_meta` key naming the session of a terminal a client claims for itself.
pub const TERMINAL_SESSION_META: &str = "ahpRelay/session";

/// What a changeset channel compares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "scope", rename_all = "camelCase")]
pub enum ChangesetScope {
    /// One turn: its start checkpoint against its end.
    Turn { turn_id: String },
    /// The session's base checkpoint against the directory now.
    All,
}

/// A changeset channel a host holds.
#[derive(Debug, Clone)]
pub struct ChangesetRecord {
    pub session: String,
    pub scope: ChangesetScope,
    pub state: ChangesetState,
    pub clock: SnapshotClock,
}

/// One watch: what it watches (its channel's state), whose it is, and the file server's watch.
pub struct WatchRecord {
    pub state: ResourceWatchState,
    pub owner: ConnectionId,
    pub _handle: WatchHandle,
    /// Counted in `ahp_relay_resource_watches` while it lives.
    pub _counted: relay_core::telemetry::OpenWatch,
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
