//! Per-tenant quotas shared by every gateway of a deployment through Redis, so N gateways (or an autoscaler)
//! do not give a tenant N times its budget, and a tenant reconnecting to another gateway brings its debt.
//!
//! - **Connection slots**: a sorted set per tenant (`ahp-relay:quota:{tenant}:slots`), one member per open
//!   connection, scored by its lease's expiry (unix ms). Taking a slot is one Lua script: drop expired
//!   members, refuse at the cap, add the new one. Each gateway renews its members every third of the lease
//!   (adding back any that lapsed while Redis was unreachable) and removes them when their connection closes
//!   (one task, up to [`RELEASES_PER_ROUND_TRIP`] per round trip); a gateway that dies leaves its slots for
//!   one lease at most. Connections admitted while Redis was unreachable hold no slot.
//! - **Rates**: each gateway keeps its own token buckets (no Redis round trip per message) and meters what it
//!   forwarded per tenant in a hash (`ahp-relay:quota:{tenant}:usage`, cumulative counters per gateway). Every
//!   exchange it adds what it forwarded since the last one, reads the other gateways' counters, and its
//!   buckets are charged with what they forwarded meanwhile ([`crate::quotas::TenantQuotas::charge_others`]).
//!   Each also records how much of the tenant's burst its buckets owe (debt included), so a gateway the tenant
//!   moves to starts from the largest of those, less what has refilled since, not from a full burst. A
//!   tenant's rate holds across gateways and reconnects, give or take one exchange interval of traffic.
//!
//! Redis being unreachable is logged and each gateway then holds tenants to its own limits: an outage of
//! Redis slows nobody down and refuses nobody that a single gateway would have let in.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::ConnectionManager;
use tokio::sync::{mpsc, oneshot};

/// How long a connection's slot holds without renewal (renewed every third of it).
pub const SLOT_LEASE: Duration = Duration::from_secs(30);
/// The most slots given back to Redis in one round trip. When thousands of connections close at once (a
/// gateway draining, a network partition healing), they go back in a few pipelines rather than one each,
/// which timed out by the thousand at the teardown of 100,000 connections (`scripts/bench idle`).
pub const RELEASES_PER_ROUND_TRIP: usize = 1_024;
/// The most slots waiting to be given back (about 100 bytes each). Beyond it, while Redis is slow or away and
/// connections keep closing, a slot is not queued and lapses with its lease, as a dead gateway's do.
const RELEASES_WAITING: usize = 131_072;
/// How often a gateway exchanges its rate usage with the others.
pub const EXCHANGE_EVERY: Duration = Duration::from_millis(100);
/// How long a tenant's usage counters outlive its last exchange.
const USAGE_TTL_MS: u64 = 3_600_000;
/// A gateway that has not reported a tenant for this long is gone (an autoscaler took it away): its fields
/// are removed from the tenant's hash, which would otherwise grow with every gateway ever seen.
pub const GATEWAY_GONE_MS: u64 = 60_000;

/// Why Redis could not be used.
#[derive(Debug, thiserror::Error)]
#[error("redis: {0}")]
pub struct SharedQuotaError(#[from] redis::RedisError);

/// One tenant's forwarded messages and bytes (cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forwarded {
    pub messages: u64,
    pub bytes: u64,
}

/// How much of a tenant's burst one gateway's buckets owed (burst minus tokens, debt included) when it last
/// exchanged, and how long ago that was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owed {
    pub messages: u64,
    pub bytes: u64,
    pub age_ms: u64,
}

/// What this gateway reports of a tenant.
#[derive(Debug, Clone, Copy, Default)]
pub struct Report {
    pub forwarded: Forwarded,
    /// (Its age is ignored: it is now.)
    pub owed: Owed,
}

/// What the other gateways reported of a tenant.
#[derive(Debug, Clone, Default)]
pub struct Theirs {
    /// The sum of what they forwarded (cumulative).
    pub forwarded: Forwarded,
    /// What each of them owed.
    pub owed: Vec<Owed>,
}

/// This gateway's handle on the shared quotas.
pub struct SharedQuotas {
    connection: ConnectionManager,
    /// This process, among the deployment's gateways.
    gateway: String,
    next_slot: AtomicU64,
    /// The slots this gateway holds, per tenant (renewed until released).
    slots: Mutex<HashMap<String, HashSet<String>>>,
    /// What this gateway last reported per tenant (its counters are cumulative).
    reported: Mutex<HashMap<String, Forwarded>>,
    /// Slots given back: one task removes them from Redis in batches ([`give_back`]).
    releases: mpsc::Sender<Release>,
    /// Slots that could not wait to be given back (too many waiting) and lapse with their lease instead.
    releases_dropped: AtomicU64,
}

const TAKE_SLOT: &str = r"
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
if ARGV[6] ~= '' then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
  if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[6]) then return 0 end
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
";

/// What a viewer's slot name holds after the gateway's id (its slots are also in the viewers' set).
const VIEWER_SLOT: &str = ":v";

/// Whether `slot` (`<gateway>:<n>` or `<gateway>:v<n>`) is a viewer's.
fn is_viewer_slot(slot: &str) -> bool {
    slot.rsplit_once(':')
        .is_some_and(|(_, number)| number.starts_with('v'))
}

fn slots_key(tenant: &str) -> String {
    format!("ahp-relay:quota:{{{tenant}}}:slots")
}

/// The viewers' slots of a tenant (a subset of [`slots_key`]'s, in the same hash slot).
fn viewer_slots_key(tenant: &str) -> String {
    format!("ahp-relay:quota:{{{tenant}}}:viewer-slots")
}

fn usage_key(tenant: &str) -> String {
    format!("ahp-relay:quota:{{{tenant}}}:usage")
}

/// What the releasing task is handed.
enum Release {
    /// A slot of a tenant, given back.
    Slot { tenant: String, slot: String },
    /// Answer once every slot handed over before this is removed from Redis (or could not be).
    Flush(oneshot::Sender<()>),
}

/// Removes the slots given back from Redis, up to [`RELEASES_PER_ROUND_TRIP`] at a time: one `ZREM` per
/// tenant's set in one pipeline. Ends when the quotas are dropped.
async fn give_back(mut released: mpsc::Receiver<Release>, connection: ConnectionManager) {
    let mut batch = Vec::with_capacity(RELEASES_PER_ROUND_TRIP);
    while released.recv_many(&mut batch, RELEASES_PER_ROUND_TRIP).await > 0 {
        let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
        let mut flushes = Vec::new();
        for release in batch.drain(..) {
            match release {
                Release::Slot { tenant, slot } => {
                    if is_viewer_slot(&slot) {
                        by_key
                            .entry(viewer_slots_key(&tenant))
                            .or_default()
                            .push(slot.clone());
                    }
                    by_key.entry(slots_key(&tenant)).or_default().push(slot);
                }
                Release::Flush(done) => flushes.push(done),
            }
        }
        if !by_key.is_empty() {
            let mut pipe = redis::pipe();
            for (key, slots) in &by_key {
                pipe.cmd("ZREM").arg(key).arg(slots).ignore();
            }
            if let Err(error) = pipe.query_async::<()>(&mut connection.clone()).await {
                let slots: usize = by_key.values().map(Vec::len).sum();
                tracing::warn!(%error, slots, "could not release connection slots in Redis; they lapse with their lease");
            }
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

impl SharedQuotas {
    /// Connect to the Redis at `url` (`redis://…` or `rediss://…`); the connection is remade by itself.
    pub async fn connect(url: &str) -> Result<Arc<Self>, SharedQuotaError> {
        crate::tls::ensure_provider();
        let client = redis::Client::open(url)?;
        let connection = client.get_connection_manager().await?;
        let (releases, released) = mpsc::channel(RELEASES_WAITING);
        tokio::spawn(give_back(released, connection.clone()));
        Ok(Arc::new(Self {
            connection,
            gateway: uuid::Uuid::new_v4().simple().to_string(),
            next_slot: AtomicU64::new(1),
            slots: Mutex::new(HashMap::new()),
            reported: Mutex::new(HashMap::new()),
            releases,
            releases_dropped: AtomicU64::new(0),
        }))
    }

    /// A connection slot of `tenant` among every gateway's, unless it holds `max` already or — for a viewer,
    /// `viewers_most` given — its viewers hold that many: `Some(slot)`, to release when the connection ends.
    pub async fn take_slot(
        &self,
        tenant: &str,
        max: usize,
        viewers_most: Option<usize>,
    ) -> Result<Option<String>, SharedQuotaError> {
        let slot = format!(
            "{}{}{}",
            self.gateway,
            if viewers_most.is_some() { VIEWER_SLOT } else { ":" },
            self.next_slot.fetch_add(1, Ordering::Relaxed)
        );
        let now = now_ms();
        let taken: i64 = redis::cmd("EVAL")
            .arg(TAKE_SLOT)
            .arg(2)
            .arg(slots_key(tenant))
            .arg(viewer_slots_key(tenant))
            .arg(now)
            .arg(max)
            .arg(now + SLOT_LEASE.as_millis() as u64)
            .arg(&slot)
            .arg(SLOT_LEASE.as_millis() as u64 * 2)
            .arg(viewers_most.map(|most| most.to_string()).unwrap_or_default())
            .query_async(&mut self.connection.clone())
            .await?;
        if taken == 0 {
            return Ok(None);
        }
        self.slots
            .lock()
            .entry(tenant.to_string())
            .or_default()
            .insert(slot.clone());
        Ok(Some(slot))
    }

    /// Give `slot` of `tenant` back (in the background, batched with others given back meanwhile).
    pub fn release_slot(&self, tenant: &str, slot: String) {
        {
            let mut slots = self.slots.lock();
            if let Some(held) = slots.get_mut(tenant) {
                held.remove(&slot);
                if held.is_empty() {
                    slots.remove(tenant);
                }
            }
        }
        // With too many waiting, or once the runtime that runs the releasing task is gone, the slot lapses with
        // its lease.
        let release = Release::Slot {
            tenant: tenant.to_owned(),
            slot,
        };
        if self.releases.try_send(release).is_err() {
            let dropped = self.releases_dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                tracing::warn!(
                    dropped,
                    "connection slots not given back to Redis (too many waiting, or shutting down); they lapse \
                     with their lease"
                );
            }
        }
    }

    /// Returns once every slot given back before this call is removed from Redis (or its removal failed):
    /// what a gateway shutting down waits for, so its tenants' slots are free on the other gateways at once
    /// rather than after their lease.
    pub async fn given_back(&self) {
        let (done, flushed) = oneshot::channel();
        if self.releases.send(Release::Flush(done)).await.is_ok() {
            let _ = flushed.await;
        }
    }

    /// Renew the lease of every slot this gateway holds.
    pub async fn renew_slots(&self) -> Result<(), SharedQuotaError> {
        let held: Vec<(String, Vec<String>)> = self
            .slots
            .lock()
            .iter()
            .map(|(tenant, slots)| (tenant.clone(), slots.iter().cloned().collect()))
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        let expiry = now_ms() + SLOT_LEASE.as_millis() as u64;
        let mut pipe = redis::pipe();
        for (tenant, slots) in held {
            let (key, viewers_key) = (slots_key(&tenant), viewer_slots_key(&tenant));
            let mut viewers = false;
            for slot in slots {
                // Without XX: a slot that lapsed during an outage is counted again.
                if is_viewer_slot(&slot) {
                    pipe.cmd("ZADD").arg(&viewers_key).arg(expiry).arg(&slot).ignore();
                    viewers = true;
                }
                pipe.cmd("ZADD").arg(&key).arg(expiry).arg(slot).ignore();
            }
            for key in std::iter::once(&key).chain(viewers.then_some(&viewers_key)) {
                pipe.cmd("PEXPIRE")
                    .arg(key)
                    .arg(SLOT_LEASE.as_millis() as u64 * 2)
                    .ignore();
            }
        }
        pipe.query_async::<()>(&mut self.connection.clone()).await?;
        Ok(())
    }

    /// Report what this gateway forwarded per tenant (cumulative, `own`) and learn what the other gateways
    /// forwarded (cumulative, per tenant of `own`).
    pub async fn exchange(
        &self,
        own: &[(String, Report)],
    ) -> Result<Vec<(String, Theirs)>, SharedQuotaError> {
        if own.is_empty() {
            return Ok(Vec::new());
        }
        let (messages_field, bytes_field) = (format!("{}:m", self.gateway), format!("{}:b", self.gateway));
        let now_ms = now_ms();
        let mut pipe = redis::pipe();
        let mut reporting = Vec::with_capacity(own.len());
        {
            let reported = self.reported.lock();
            for (tenant, report) in own {
                let now = &report.forwarded;
                let before = reported.get(tenant).copied().unwrap_or_default();
                // A tenant's local counters restart when its entry was forgotten: count them anew.
                let since = |now: u64, before: u64| if now >= before { now - before } else { now };
                let key = usage_key(tenant);
                pipe.cmd("HINCRBY")
                    .arg(&key)
                    .arg(&messages_field)
                    .arg(since(now.messages, before.messages))
                    .ignore();
                pipe.cmd("HINCRBY")
                    .arg(&key)
                    .arg(&bytes_field)
                    .arg(since(now.bytes, before.bytes))
                    .ignore();
                pipe.cmd("HSET")
                    .arg(&key)
                    .arg(format!("{}:om", self.gateway))
                    .arg(report.owed.messages)
                    .arg(format!("{}:ob", self.gateway))
                    .arg(report.owed.bytes)
                    .arg(format!("{}:ot", self.gateway))
                    .arg(now_ms)
                    .ignore();
                pipe.cmd("PEXPIRE").arg(&key).arg(USAGE_TTL_MS).ignore();
                pipe.cmd("HGETALL").arg(&key);
                reporting.push((tenant.clone(), *now));
            }
        }
        let counters: Vec<HashMap<String, u64>> = pipe.query_async(&mut self.connection.clone()).await?;
        let gone = gone_gateways_fields(&reporting, &counters, now_ms);
        if !gone.is_empty() {
            let mut prune = redis::pipe();
            for (tenant, fields) in &gone {
                prune.cmd("HDEL").arg(usage_key(tenant)).arg(fields).ignore();
            }
            prune.query_async::<()>(&mut self.connection.clone()).await?;
        }
        let mut reported = self.reported.lock();
        let mut others = Vec::with_capacity(counters.len());
        for ((tenant, now), fields) in reporting.into_iter().zip(counters) {
            reported.insert(tenant.clone(), now);
            let mut theirs = Theirs::default();
            let mut owed: HashMap<&str, Owed> = HashMap::new();
            for (field, value) in &fields {
                let Some((gateway, what)) = field.rsplit_once(':') else {
                    continue;
                };
                if gateway == self.gateway {
                    continue;
                }
                match what {
                    "m" => theirs.forwarded.messages += value,
                    "b" => theirs.forwarded.bytes += value,
                    "om" => owed.entry(gateway).or_default().messages = *value,
                    "ob" => owed.entry(gateway).or_default().bytes = *value,
                    "ot" => owed.entry(gateway).or_default().age_ms = now_ms.saturating_sub(*value),
                    _ => {}
                }
            }
            theirs.owed = owed.into_values().collect();
            others.push((tenant, theirs));
        }
        reported.retain(|tenant, _| own.iter().any(|(reporting, _)| reporting == tenant));
        Ok(others)
    }
}

/// Per tenant, the fields of gateways that last reported it more than [`GATEWAY_GONE_MS`] ago (or never said
/// when: a hash written before the time was kept).
fn gone_gateways_fields(
    reporting: &[(String, Forwarded)],
    counters: &[HashMap<String, u64>],
    now_ms: u64,
) -> Vec<(String, Vec<String>)> {
    let mut gone = Vec::new();
    for ((tenant, _), fields) in reporting.iter().zip(counters) {
        let mut last_seen: HashMap<&str, Option<u64>> = HashMap::new();
        for (field, value) in fields {
            let Some((gateway, what)) = field.rsplit_once(':') else {
                continue;
            };
            let seen = last_seen.entry(gateway).or_default();
            if what == "ot" {
                *seen = Some(*value);
            }
        }
        let stale: Vec<&str> = last_seen
            .into_iter()
            .filter(|(_, seen)| seen.is_none_or(|at| now_ms.saturating_sub(at) > GATEWAY_GONE_MS))
            .map(|(gateway, _)| gateway)
            .collect();
        if stale.is_empty() {
            continue;
        }
        let fields: Vec<String> = fields
            .keys()
            .filter(|field| {
                field
                    .rsplit_once(':')
                    .is_some_and(|(gateway, _)| stale.contains(&gateway))
            })
            .cloned()
            .collect();
        gone.push((tenant.clone(), fields));
    }
    gone
}
