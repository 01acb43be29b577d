//! Resource limits (design invariant 8), parsed once and shared by the gateway and the shard.

use std::time::Duration;

/// Every bound the relay enforces. Defaults are safe for a public deployment.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest inbound WebSocket message, in bytes. Larger frames close the connection (1009).
    pub max_frame_bytes: usize,
    /// Deepest JSON nesting accepted in an inbound frame.
    pub max_json_depth: usize,
    /// Channels one connection may be subscribed to at once.
    pub max_subscriptions_per_connection: usize,
    /// Frames queued for one connection before it is closed as a slow consumer.
    pub outbound_queue_frames: usize,
    /// Commit batches the bus holds for one host before a lagging connection is closed (a connection's queue
    /// and backlog are bounded in frames and bytes besides).
    pub bus_capacity: usize,
    /// Bytes of those batches the bus keeps for its slowest reader: one further behind sees its bus lag and
    /// resyncs (see `bus::BusSender`).
    pub bus_bytes: usize,
    /// Envelopes per host kept in memory for exact `reconnect` replay.
    pub replay_buffer_envelopes: usize,
    /// Items per `listSessions` page when the client asks for more or gives no limit.
    pub list_sessions_page: usize,
    /// How long a disconnected active client stays active before it is removed and its tool calls failed.
    pub active_client_grace: Duration,
    /// Turns per `fetchTurns` page.
    pub fetch_turns_page: usize,
    /// A chat's retained turns: the newest this many, which a snapshot without `view.turns` carries (before
    /// and after a restart alike) and a restore keeps in memory; older ones stay in the store's turn archive
    /// and are paged in with `fetchTurns` (see `docs/protocol.md`).
    pub retained_turns: usize,
    /// …and at most this many bytes of them (as JSON): a chat's live turns are the newest that fit (at least its
    /// newest one), so memory, stored snapshots and restores are bounded by bytes whatever one turn holds.
    pub retained_turn_bytes: usize,
    /// Turns one chat may hold, archived ones included: a turn beyond it is refused (start a new chat, or
    /// truncate this one).
    pub max_turns_per_chat: usize,
    /// Sessions one host may hold.
    pub max_sessions_per_host: usize,
    /// Chats one session may hold.
    pub max_chats_per_session: usize,
    /// A channel's snapshot is stored after this many actions…
    pub snapshot_every_actions: u32,
    /// …or when an action arrives this long after the last snapshot.
    pub snapshot_every: Duration,
    /// Log rows older than this are compacted into snapshots; a client away longer gets snapshots.
    pub retention: Duration,
    /// Envelopes read from the store per page while answering `reconnect`.
    pub replay_page: usize,
    /// Distinct channels one message may name (subscriptions, `initialSubscriptions`, …): each may need a
    /// store read.
    pub max_channels_per_message: usize,
    /// Largest reply the shard builds for one request (a `reconnect` replay, the snapshots of an
    /// `initialize`), in bytes: a replay that would be larger is answered with snapshots instead, snapshots
    /// that would be larger are refused.
    pub max_reply_bytes: usize,
    /// Bytes of envelopes per host kept in memory for exact `reconnect` replay (besides the count bound).
    pub replay_buffer_bytes: usize,
    /// Bytes queued for one connection before it is closed as a slow consumer (besides the frame bound).
    pub outbound_queue_bytes: usize,
    /// Hosts of one tenant a shard holds open at once (opening one more is refused).
    pub max_hosts_per_tenant: usize,
    /// A host with no connection, no running turn and nothing to commit for this long is evicted from
    /// memory (its lease released); the next message reopens it from the store.
    pub idle_host_after: Duration,
    /// How often the gateway pings a client (WebSocket ping).
    pub ping_interval: Duration,
    /// A connection from which nothing arrived (not even a pong) for this long is closed.
    pub idle_timeout: Duration,
    /// How long a client's call may wait for its host (its commit, a stuck store): then it is answered with an
    /// error and the connection goes on.
    pub call_timeout: Duration,
    /// Whether devices may open terminals in their sessions (`createTerminal`, a chat's `!command`); off, they
    /// may still watch agents' terminals.
    pub device_terminals: bool,
    /// An agent's inline content (a file edit's side, an image, a text output) larger than this many bytes is
    /// kept in the store and named by reference (`ahp-content:/…`) instead of inline in the state.
    pub content_ref_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame_bytes: 4 * 1024 * 1024,
            max_json_depth: 64,
            max_subscriptions_per_connection: 1024,
            outbound_queue_frames: 4096,
            bus_capacity: 4_096,
            bus_bytes: crate::bus::DEFAULT_BUS_BYTES,
            replay_buffer_envelopes: 10_000,
            list_sessions_page: 100,
            active_client_grace: Duration::from_secs(30),
            fetch_turns_page: 50,
            retained_turns: 100,
            retained_turn_bytes: 8 * 1024 * 1024,
            max_turns_per_chat: 100_000,
            max_sessions_per_host: 100_000,
            max_chats_per_session: 256,
            snapshot_every_actions: 500,
            snapshot_every: Duration::from_secs(60),
            retention: Duration::from_secs(7 * 24 * 3600),
            replay_page: 2_000,
            max_channels_per_message: 256,
            max_hosts_per_tenant: 100,
            idle_host_after: Duration::from_secs(300),
            max_reply_bytes: 16 * 1024 * 1024,
            replay_buffer_bytes: 64 * 1024 * 1024,
            outbound_queue_bytes: 16 * 1024 * 1024,
            ping_interval: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(60),
            call_timeout: Duration::from_secs(30),
            device_terminals: true,
            content_ref_bytes: 8 * 1024,
        }
    }
}
