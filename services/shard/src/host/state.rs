//! One host: its single writer lock, its committer, its connections, and its agents' way back in.
//!
//! All of a host's state sits behind one mutex held only for synchronous work (never across an `.await`), so
//! the host is the single writer of its `serverSeq` space. What the locked work numbers and changes waits in
//! the sequencer's pending batch; the host's committer task writes each batch to the store in one transaction
//! (group commit: whatever accumulated while the previous commit ran) and only then publishes it, in order.
//! Replies that show state wait until everything they could reflect is committed.
//!
//! With a [`RedisPublisher`], the committer also publishes every event to Redis, in order, after the local
//! bus. Redis pub/sub is at-most-once, so a failed Redis publish is logged and skipped: gateways detect the
//! gap from the next event's `prev_seq` and read the missing range back with [`Host::fetch_range`]. Only
//! logged envelopes can be read back; rejections and other per-connection envelopes are not logged, so they
//! are lost with a lost Redis message (their numbers are skipped in the repaired range).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ahp_types::actions::StateAction;
use parking_lot::Mutex;
use relay_bus::RedisPublisher;
use relay_core::bus::BusReceiver;
use relay_core::{ConnectionId, HostKey, Identity, Limits};
use relay_runner::{ChatSink, ProviderRegistry};
use relay_store::{Lease, Store};
use tokio::sync::{watch, Notify};

use crate::host::sequencer::{CommitBarrier, Publisher, Sequencer};
use crate::model::HostModel;

/// Longest accepted AHP clientId.
pub const MAX_CLIENT_ID_BYTES: usize = 256;

/// Publications a host may hold uncommitted before dispatching connections wait for the store.
pub(crate) const MAX_PENDING_PUBLICATIONS: usize = 1024;
/// Bytes a host's pending batch may hold before everything that adds to it waits for the store: connections'
/// messages, agents' output, terminals' output (their producers stop reading, so the agent's pipe and the
/// terminal's pty fill, not this process's memory).
pub const MAX_PENDING_BYTES: usize = 16 * 1024 * 1024;

/// How long the committer waits for Redis to take one batch's events before skipping the rest of them.
pub(crate) const REDIS_PUBLISH_TIMEOUT: Duration = Duration::from_secs(2);

/// Protocol state of one connection, as the host sees it.
pub struct ConnectionState {
    pub identity: Identity,
    /// Set by `initialize` or `reconnect`.
    pub client_id: Option<String>,
    pub protocol_version: Option<String>,
    pub subscriptions: HashSet<String>,
    /// Per chat, the absolute index of the oldest turn the connection holds (its snapshot and fetched pages).
    pub turn_windows: crate::host::turn_windows::TurnWindows,
    /// When it was attached (a gateway's stream that ended before then does not detach it).
    pub attached_at: std::time::Instant,
}

/// A client id, the user it belongs to, and how many live connections use it.
pub struct ClientBinding {
    pub subject: String,
    pub live_connections: usize,
    /// Bumped on every disconnect, so a stale grace timer can tell it lost the race.
    pub grace_epoch: u64,
    /// The turn windows (chat → absolute index of the oldest turn held) its connections last had: a `reconnect`
    /// answered with a replay continues that state, so its new connection continues them too.
    pub turn_windows: crate::host::turn_windows::TurnWindows,
}

/// Everything behind the host lock.
pub struct HostCore {
    pub key: HostKey,
    pub limits: Limits,
    pub providers: ProviderRegistry,
    pub seq: Sequencer,
    pub model: HostModel,
    pub connections: HashMap<ConnectionId, ConnectionState>,
    pub clients: HashMap<String, ClientBinding>,
    /// A handle agents use to emit actions into this host.
    pub sink: Arc<dyn ChatSink>,
    /// The host itself, for work that finishes later (a checkpoint, a changeset's computation).
    pub host: Weak<Host>,
    /// Client ids whose grace period must be armed once the lock is released.
    pub pending_grace: Vec<(String, u64)>,
    /// When the host last did anything (a message, an agent action, a connection coming or going): an idle
    /// host is evicted from memory ([`Host::is_idle`]).
    pub last_activity: std::time::Instant,
    /// Channels disposed in memory whose disposal may not be committed yet, with the batch that commits it:
    /// until then the store still holds them, and loading them from it would bring them back.
    pub disposing: HashMap<String, CommitBarrier>,
    /// Rejections and unsubscribed echoes each client is owed on `reconnect`.
    pub owed: crate::host::owed::OwedEnvelopes,
    /// The tenant's storage quota, when one is configured.
    pub storage: Option<Arc<crate::host::storage::StorageQuota>>,
    /// Units the store refused (see [`crate::host::salvage`]), with why: a request waiting on one answers with an
    /// error instead of its reply.
    pub failed_units: crate::host::failed_units::FailedUnits,
    /// The host's sessions, loaded or not (its catalogue's size at open, then counted): what
    /// `max_sessions_per_host` holds to.
    pub session_count: u64,
    /// Sessions nothing used at the last idle sweep: unused at the next one too, they leave memory.
    pub unused_sessions: HashSet<String>,
}

impl HostCore {
    /// Why the host's tenant may not grow (new sessions, chats, content), if it is over its storage quota.
    pub fn storage_refusal(&self) -> Option<String> {
        self.storage
            .as_ref()
            .and_then(|quota| quota.refusal(&self.key.tenant))
    }
}

/// One AHP host.
pub struct Host {
    pub(crate) key: HostKey,
    pub(crate) core: Mutex<HostCore>,
    pub(crate) store: Store,
    /// Number of the last batch committed and published.
    pub(crate) durable: watch::Sender<CommitBarrier>,
    pub(crate) publisher: Mutex<Publisher>,
    /// Publishes every event to Redis too (the distributed deployment).
    pub(crate) redis: Option<RedisPublisher>,
    /// The lease this host is served under (the distributed deployment): every commit is fenced by it.
    /// `None` in the embedded relay, the only process on its store.
    pub(crate) lease: Option<Lease>,
    /// Set once this process stops serving the host (its lease was lost or released): nothing more is
    /// committed or published, the bus is closed, and replies become "reconnect".
    pub(crate) deposed: watch::Sender<bool>,
    pub(crate) wakeup: Arc<Notify>,
    pub(crate) me: Weak<Host>,
    /// How long the next write waits after the store was full (0: it was not): the refusals of a full store
    /// come at a falling pace, not as fast as salvage and reloads can go.
    pub(crate) full_backoff: parking_lot::Mutex<Duration>,
}

impl Drop for Host {
    fn drop(&mut self) {
        // Lets the committer see the host is gone and end.
        self.wakeup.notify_one();
    }
}

impl Host {
    /// Hold the host's tenant to `quota` (measured now, so it holds from the first message).
    pub async fn set_storage_quota(&self, quota: Arc<crate::host::storage::StorageQuota>) {
        quota.host_opened(&self.key.tenant).await;
        self.core.lock().storage = Some(quota);
    }

    /// Let the sessions nothing used since the last sweep leave memory (see
    /// [`HostCore::evict_unused_sessions`]). A sweep is not activity: it leaves the host's idle clock alone.
    pub(crate) fn evict_unused_sessions(&self) -> usize {
        self.core.lock().evict_unused_sessions()
    }

    /// Run locked work on the host (one unit of its own work), then wake the committer for whatever it queued
    /// and arm grace timers.
    pub(crate) fn with_core<R>(&self, work: impl FnOnce(&mut HostCore) -> R) -> R {
        self.with_core_as(None, work).0
    }

    /// [`Host::with_core`] for a message of `owner`: what it queues is one unit of `owner`'s, whose id is
    /// returned with the result (a request waits for it, and learns from it if the store refused it).
    pub(crate) fn with_core_as<R>(
        &self,
        owner: Option<ConnectionId>,
        work: impl FnOnce(&mut HostCore) -> R,
    ) -> (R, crate::host::sequencer::UnitId) {
        let (result, unit, pending, grace) = {
            let mut core = self.core.lock();
            core.last_activity = std::time::Instant::now();
            let unit = core.seq.begin_unit(owner);
            let result = work(&mut core);
            // Whatever is queued outside a unit of work is the host's own.
            core.seq.begin_unit(None);
            (
                result,
                unit,
                core.seq.has_pending(),
                std::mem::take(&mut core.pending_grace),
            )
        };
        if pending {
            self.wakeup.notify_one();
        }
        self.arm_grace_timers(grace);
        (result, unit)
    }

    /// Register a connection and hand it the host's bus.
    pub fn attach(&self, connection: ConnectionId, identity: Identity) -> BusReceiver {
        // Subscribe before registering: nothing published after this point is missed.
        let bus = self.publisher.lock().subscribe();
        self.with_core(|core| {
            core.connections.insert(
                connection,
                ConnectionState {
                    identity,
                    client_id: None,
                    protocol_version: None,
                    subscriptions: HashSet::new(),
                    turn_windows: Default::default(),
                    attached_at: std::time::Instant::now(),
                },
            );
        });
        bus
    }

    /// The connection is gone.
    pub fn detach(&self, connection: ConnectionId) {
        self.with_core(|core| core.disconnect(connection));
    }

    /// Detach every connection `gone` picks; returns how many.
    pub fn detach_where(&self, gone: impl Fn(ConnectionId, &ConnectionState) -> bool) -> usize {
        self.with_core(|core| {
            let picked: Vec<ConnectionId> = core
                .connections
                .iter()
                .filter(|(connection, state)| gone(**connection, state))
                .map(|(connection, _)| *connection)
                .collect();
            for connection in &picked {
                core.disconnect(*connection);
            }
            picked.len()
        })
    }

    /// Whether the host can be evicted from memory: no connection attached, no agent turn or terminal running,
    /// nothing waiting to be committed or in flight, and no activity for `idle_for`. Everything it holds is then in
    /// the store, and reopening it restores the same state.
    pub fn is_idle(&self, idle_for: std::time::Duration) -> bool {
        let core = self.core.lock();
        core.connections.is_empty()
            && core.last_activity.elapsed() >= idle_for
            && !core.seq.has_pending()
            && *self.durable.borrow() >= core.seq.barrier()
            && core.model.chats.values().all(|chat| chat.running.is_none())
            // A running terminal's process sends its output here.
            && !core.model.terminals.values().any(|terminal| terminal.runs_here())
            && core.clients.values().all(|binding| binding.live_connections == 0)
            // An agent still starting a session reports to this host (a reload would fail the session).
            && core
                .model
                .sessions
                .values()
                .all(|session| session.state.lifecycle != ahp_types::state::SessionLifecycle::Creating)
    }

    /// What this host holds in memory: its sessions and chats, and its pending batch's bytes (`hosts` is 1).
    pub fn loaded_counts(&self) -> relay_core::telemetry::Loaded {
        let core = self.core.lock();
        relay_core::telemetry::Loaded {
            hosts: 1,
            sessions: core.model.sessions.len(),
            chats: core.model.chats.len(),
            pending_batch_bytes: core.seq.pending_bytes(),
        }
    }

    /// The host's current `serverSeq` (committed or not).
    pub fn server_seq(&self) -> u64 {
        self.core.lock().seq.current()
    }

    /// The `serverSeq` of the last action this host published on its bus.
    pub fn published_seq(&self) -> u64 {
        self.publisher.lock().last_published()
    }

    /// Wait until everything queued so far is committed and published.
    pub async fn flush(&self) {
        let barrier = self.core.lock().seq.barrier();
        self.wait_committed(barrier).await;
    }

    /// Wait until batch `barrier` (and every batch before it) is committed and published, or the host is
    /// deposed (then it never will be: callers check [`Host::is_deposed`]).
    pub(crate) async fn wait_committed(&self, barrier: CommitBarrier) {
        let mut durable = self.durable.subscribe();
        let mut deposed = self.deposed.subscribe();
        tokio::select! {
            _ = durable.wait_for(|committed| *committed >= barrier) => {}
            _ = deposed.wait_for(|deposed| *deposed) => {}
        }
    }

    /// Resolves once the pending batch holds less than [`MAX_PENDING_BYTES`] (at once when it does; when the
    /// host stops being served here, too): what agents and terminals wait for before they read more output.
    pub(crate) async fn room(&self) {
        loop {
            let (bytes, barrier) = {
                let core = self.core.lock();
                (core.seq.pending_bytes(), core.seq.barrier())
            };
            if bytes < MAX_PENDING_BYTES || self.is_deposed() {
                return;
            }
            self.wait_committed(barrier).await;
        }
    }

    /// The lease this host is served under, if any.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// Whether this process has stopped serving the host.
    pub fn is_deposed(&self) -> bool {
        *self.deposed.borrow()
    }

    /// Resolves once this process stops serving the host.
    pub async fn deposed(&self) {
        let _ = self.deposed.subscribe().wait_for(|deposed| *deposed).await;
    }

    /// Stop serving the host: nothing more is committed or published, waiting replies turn into
    /// [`relay_core::link::CommandReply::moved`], and the bus closes, so gateways close their connections with a resumable code and
    /// the clients reconnect to the next owner. What was queued and not committed is dropped — no client saw
    /// it (durable before visible). Idempotent.
    pub fn depose(&self, why: &str) {
        if self.deposed.send_replace(true) {
            return;
        }
        tracing::info!(host = %self.key, why, "no longer serving the host");
        self.publisher.lock().close();
        self.wakeup.notify_one();
    }

    /// Emit a server action as an agent would (used by providers through [`crate::host::sink::HostSink`]).
    pub fn emit_agent_action(&self, channel: &str, action: StateAction) -> relay_runner::Emitted {
        self.with_core(|core| core.apply_agent_action(channel, action))
    }

    fn arm_grace_timers(&self, grace: Vec<(String, u64)>) {
        if grace.is_empty() {
            return;
        }
        let wait = self.core.lock().limits.active_client_grace;
        for (client_id, epoch) in grace {
            let host = self.me.clone();
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                if let Some(host) = host.upgrade() {
                    host.with_core(|core| core.expire_client(&client_id, epoch));
                }
            });
        }
    }
}
