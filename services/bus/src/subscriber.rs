//! The gateway side of the Redis bus: follows hosts on demand, decodes their events and forwards them in
//! `serverSeq` order to one local broadcast per host, repairing lost messages (invariant 10). A Redis message
//! is a commit's batch of events ([`codec::decode_batch`]); what it forwards of it goes on as one
//! [`BusBatch`](relay_core::bus::BusBatch).
//!
//! Redis pub/sub is at-most-once. Per host the subscriber remembers the last action `seq` it forwarded:
//! - an action whose `prev_seq` is above it reveals a gap: the missing range is fetched from a [`GapRepair`]
//!   source (the shard) and forwarded first, then the action itself;
//! - an action at or below it is a duplicate and is dropped;
//! - after the Redis connection is lost, the subscriber reconnects with backoff, re-subscribes every followed
//!   host, and at once fetches everything published after the last forwarded action of each host (a repair
//!   with `through = u64::MAX`, which the source answers up to what the host has published), so nothing is
//!   lost across a Redis restart even if the host publishes nothing more.
//!
//! A follower can wait until Redis has confirmed its subscription ([`RedisSubscriber::follow_subscribed`])
//! and set the point it follows from ([`RedisSubscriber::seed`]) before the first event arrives, so that an
//! event lost before the first one received is detected too.
//!
//! When a gap cannot be repaired the host's broadcast is closed: its receivers see
//! [`RecvError::Closed`](tokio::sync::broadcast::error::RecvError::Closed) and must follow again and resync
//! from a snapshot (as after [`RecvError::Lagged`](tokio::sync::broadcast::error::RecvError::Lagged)).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use parking_lot::Mutex;
use relay_core::bus::{BusEvent, BusEventKind, BusReceiver, BusSender, SharedBusEvent};
use relay_core::HostKey;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::{channel_name, codec};

/// A boxed, sendable future (keeps [`GapRepair`] usable as a trait object).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a gap could not be repaired.
#[derive(Debug, thiserror::Error)]
#[error("gap repair failed: {0}")]
pub struct RepairError(#[from] pub Box<dyn std::error::Error + Send + Sync>);

/// Where lost bus events are fetched from (implemented by the shard's client).
pub trait GapRepair: Send + Sync + 'static {
    /// The action events of `host` with `after < seq <= through`, in any order. Actions that were never
    /// stored (rejections) may be missing from the answer. `through` may be `u64::MAX`: everything the host
    /// has published after `after`.
    fn fetch<'a>(
        &'a self,
        host: &'a HostKey,
        after: u64,
        through: u64,
    ) -> BoxFuture<'a, Result<Vec<BusEvent>, RepairError>>;
}

/// Why the subscriber could not be created.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Tuning of a [`RedisSubscriber`].
#[derive(Debug, Clone)]
pub struct SubscriberOptions {
    /// Batches buffered per host for slow local receivers…
    pub capacity: usize,
    /// …and at most this many bytes of them (a receiver further behind lags and resyncs).
    pub bytes: usize,
    /// First delay before reconnecting to Redis; doubled after each failure up to `max_backoff`.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// Attempts at fetching one gap before the host's broadcast is closed.
    pub repair_attempts: u32,
}

impl Default for SubscriberOptions {
    fn default() -> Self {
        Self {
            capacity: 4096,
            bytes: relay_core::bus::DEFAULT_BUS_BYTES,
            min_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            repair_attempts: 5,
        }
    }
}

struct HostState {
    key: HostKey,
    tx: BusSender,
    /// The last action seq forwarded (`None` before the first one).
    last: Option<u64>,
    /// The connection was lost since the last event: repair up to the next event.
    resync: bool,
    /// Whether Redis has confirmed the subscription on the current connection.
    subscribed: watch::Sender<bool>,
}

enum Command {
    Subscribe(String),
    Unsubscribe(String),
}

struct Shared {
    /// Followed hosts by Redis channel name.
    hosts: Mutex<HashMap<String, HostState>>,
    repair: Arc<dyn GapRepair>,
    options: SubscriberOptions,
}

/// Receives the bus events of followed hosts from Redis.
pub struct RedisSubscriber {
    shared: Arc<Shared>,
    commands: mpsc::UnboundedSender<Command>,
    task: JoinHandle<()>,
}

impl RedisSubscriber {
    /// Starts a subscriber for the Redis server at `url`. The connection is made (and remade) in the
    /// background; only a malformed URL fails here.
    pub fn connect(
        url: &str,
        repair: Arc<dyn GapRepair>,
        options: SubscriberOptions,
    ) -> Result<Self, SubscribeError> {
        crate::tls::ensure_provider();
        let client = redis::Client::open(url)?;
        let shared = Arc::new(Shared {
            hosts: Mutex::new(HashMap::new()),
            repair,
            options,
        });
        let (commands, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(client, Arc::clone(&shared), rx));
        Ok(Self {
            shared,
            commands,
            task,
        })
    }

    /// Follows `host`: its events, from the moment Redis confirms the subscription, go to the returned
    /// receiver (and to every other receiver of the same host).
    pub fn follow(&self, host: &HostKey) -> BusReceiver {
        let name = channel_name(host);
        let mut hosts = self.shared.hosts.lock();
        if let Some(state) = hosts.get(&name) {
            return state.tx.subscribe();
        }
        let tx = BusSender::new(self.shared.options.capacity, self.shared.options.bytes);
        let rx = tx.subscribe();
        hosts.insert(
            name.clone(),
            HostState {
                key: host.clone(),
                tx,
                last: None,
                resync: false,
                subscribed: watch::Sender::new(false),
            },
        );
        // The task only ends when `self` is dropped, so sending cannot fail while `self` exists.
        let _ = self.commands.send(Command::Subscribe(name));
        rx
    }

    /// Like [`follow`](Self::follow), but returns only once Redis has confirmed the subscription: every
    /// event published afterwards reaches the receiver (or is repaired). Returns a closed receiver if the
    /// host is unfollowed meanwhile.
    pub async fn follow_subscribed(&self, host: &HostKey) -> BusReceiver {
        let receiver = self.follow(host);
        let subscribed = self
            .shared
            .hosts
            .lock()
            .get(&channel_name(host))
            .map(|state| state.subscribed.subscribe());
        if let Some(mut subscribed) = subscribed {
            let _ = subscribed.wait_for(|yes| *yes).await;
        }
        receiver
    }

    /// Follow `host` from action `seq` on: if no action was forwarded yet, an event whose `prev_seq` is
    /// above `seq` reveals a gap. Ignored once an action has been forwarded.
    pub fn seed(&self, host: &HostKey, seq: u64) {
        if let Some(state) = self.shared.hosts.lock().get_mut(&channel_name(host)) {
            if state.last.is_none() {
                state.last = Some(seq);
            }
        }
    }

    /// Stops following `host`; its receivers see the channel closed.
    pub fn unfollow(&self, host: &HostKey) {
        let name = channel_name(host);
        if self.shared.hosts.lock().remove(&name).is_some() {
            let _ = self.commands.send(Command::Unsubscribe(name));
        }
    }
}

impl Drop for RedisSubscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Connects, subscribes and forwards until the subscriber is dropped, reconnecting with backoff.
async fn run(client: redis::Client, shared: Arc<Shared>, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut backoff = shared.options.min_backoff;
    loop {
        match session(&client, &shared, &mut commands).await {
            Ok(Ended::Dropped) => return,
            Ok(Ended::Lost) => {
                tracing::warn!("redis bus connection lost; reconnecting");
                backoff = shared.options.min_backoff;
            }
            Err(error) => {
                tracing::warn!(%error, ?backoff, "redis bus connection failed; retrying");
            }
        }
        for state in shared.hosts.lock().values_mut() {
            state.subscribed.send_replace(false);
            if state.last.is_some() {
                state.resync = true;
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(shared.options.max_backoff);
    }
}

enum Ended {
    /// The subscriber was dropped.
    Dropped,
    /// The connection closed after it was established.
    Lost,
}

/// One connection's life: subscribe to every followed host, then serve commands and messages.
async fn session(
    client: &redis::Client,
    shared: &Shared,
    commands: &mut mpsc::UnboundedReceiver<Command>,
) -> Result<Ended, redis::RedisError> {
    let (mut sink, mut stream) = client.get_async_pubsub().await?.split();
    let names: Vec<String> = shared.hosts.lock().keys().cloned().collect();
    if !names.is_empty() {
        sink.subscribe(&names).await?;
        confirm(shared, &names);
        for name in &names {
            catch_up(shared, name).await;
        }
    }
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                None => return Ok(Ended::Dropped),
                Some(Command::Subscribe(name)) => {
                    sink.subscribe(&name).await?;
                    confirm(shared, std::slice::from_ref(&name));
                }
                Some(Command::Unsubscribe(name)) => sink.unsubscribe(&name).await?,
            },
            message = stream.next() => match message {
                None => return Ok(Ended::Lost),
                Some(message) => handle(shared, message.get_channel_name(), message.get_payload_bytes()).await,
            },
        }
    }
}

/// Redis confirmed the subscriptions of `names`.
fn confirm(shared: &Shared, names: &[String]) {
    let hosts = shared.hosts.lock();
    for name in names {
        if let Some(state) = hosts.get(name) {
            state.subscribed.send_replace(true);
        }
    }
}

/// After a reconnect: forward everything the host published after the last forwarded action.
async fn catch_up(shared: &Shared, channel: &str) {
    let (key, after) = {
        let hosts = shared.hosts.lock();
        match hosts.get(channel) {
            Some(HostState {
                key,
                last: Some(last),
                resync: true,
                ..
            }) => (key.clone(), *last),
            _ => return,
        }
    };
    let repaired = fetch(shared, &key, after, u64::MAX).await;
    let mut hosts = shared.hosts.lock();
    if let Some(state) = hosts.get_mut(channel) {
        if apply_repair(shared, state, after, u64::MAX, repaired) {
            state.resync = false;
        }
    }
}

/// Forward a fetched range after `after` and move `last` past it; on failure close the host's stream.
/// Returns whether the range was applied to `state` (it is not if `state` moved on while fetching).
fn apply_repair(
    shared: &Shared,
    state: &mut HostState,
    after: u64,
    through: u64,
    repaired: Option<Vec<BusEvent>>,
) -> bool {
    // The host may have been unfollowed and followed again while fetching: only apply to the same state.
    if state.last != Some(after) {
        return false;
    }
    match repaired {
        Some(mut events) => {
            events.retain(|e| e.kind == BusEventKind::Action && e.seq > after && e.seq <= through);
            events.sort_by_key(|e| e.seq);
            events.dedup_by_key(|e| e.seq);
            let newest = events.last().map_or(after, |e| e.seq);
            if !events.is_empty() {
                let _ = state.tx.send(events.into_iter().map(Arc::new).collect());
            }
            // A bounded range is complete up to `through` (missing numbers were never stored); an open one
            // ends at the newest event the host had published.
            state.last = Some(if through == u64::MAX { newest } else { through });
        }
        None => {
            tracing::error!(host = %state.key, after, through, "bus gap not repaired; closing the host's stream");
            // Dropping the old sender closes every receiver.
            state.tx = BusSender::new(shared.options.capacity, shared.options.bytes);
            state.last = None;
        }
    }
    true
}

/// What to do with one decoded event, decided under the lock.
enum Plan {
    Forward,
    Repair { key: HostKey, after: u64, through: u64 },
}

/// Forward what one Redis message (a batch) brings, in order, as one batch; a gap before any of its events is
/// repaired first (the repaired range goes out as its own batch, before the rest).
async fn handle(shared: &Shared, channel: &str, payload: &[u8]) {
    let events = match codec::decode_batch(payload) {
        Ok(events) => events,
        Err(error) => {
            tracing::warn!(%error, channel, "undecodable bus message dropped");
            return;
        }
    };
    let mut ready: Vec<SharedBusEvent> = Vec::with_capacity(events.len());
    let mut events = events.into_iter();
    loop {
        // Under the lock, up to the first event that reveals a gap (the lock is not held while fetching).
        let gap = {
            let mut hosts = shared.hosts.lock();
            let Some(state) = hosts.get_mut(channel) else {
                return; // unfollowed while the message was in flight
            };
            let mut gap = None;
            for event in events.by_ref() {
                if let Plan::Repair { key, after, through } = plan(state, &event) {
                    gap = Some((key, after, through, event));
                    break;
                }
                accept(state, event, &mut ready);
            }
            // The events before the gap go first.
            send(state, &mut ready);
            gap
        };
        let Some((key, after, through, event)) = gap else {
            return;
        };
        let repaired = fetch(shared, &key, after, through).await;
        let mut hosts = shared.hosts.lock();
        let Some(state) = hosts.get_mut(channel) else {
            return;
        };
        if !apply_repair(shared, state, after, through, repaired) {
            return;
        }
        accept(state, event, &mut ready);
    }
}

/// Take `event` into the batch being gathered, unless it is an action already forwarded.
fn accept(state: &mut HostState, event: BusEvent, ready: &mut Vec<SharedBusEvent>) {
    state.resync = false;
    if event.kind == BusEventKind::Action {
        if state.last.is_some_and(|last| event.seq <= last) {
            return; // a duplicate, or delivered by the repair
        }
        state.last = Some(event.seq);
    }
    ready.push(Arc::new(event));
}

/// Send the events gathered so far as one batch (none: nothing).
fn send(state: &HostState, ready: &mut Vec<SharedBusEvent>) {
    if !ready.is_empty() {
        // No receivers is fine: every connection may have gone since.
        let _ = state.tx.send(std::mem::take(ready).into());
    }
}

fn plan(state: &HostState, event: &BusEvent) -> Plan {
    let Some(last) = state.last else {
        return Plan::Forward;
    };
    let through = match event.kind {
        BusEventKind::Action if event.seq <= last => return Plan::Forward, // a duplicate: `accept` drops it
        BusEventKind::Action => event.prev_seq,
        _ if state.resync => event.seq,
        _ => last,
    };
    if through > last {
        Plan::Repair {
            key: state.key.clone(),
            after: last,
            through,
        }
    } else {
        Plan::Forward
    }
}

/// Fetches a gap, retrying with backoff; `None` when every attempt failed.
async fn fetch(shared: &Shared, host: &HostKey, after: u64, through: u64) -> Option<Vec<BusEvent>> {
    let mut delay = shared.options.min_backoff;
    for attempt in 1..=shared.options.repair_attempts.max(1) {
        match shared.repair.fetch(host, after, through).await {
            Ok(events) => return Some(events),
            Err(error) => {
                tracing::warn!(%error, %host, after, through, attempt, "bus gap repair failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(shared.options.max_backoff);
            }
        }
    }
    None
}
