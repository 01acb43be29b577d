//! Per-tenant quotas at the gateway: open connections, inbound messages per second — per tenant and per
//! connection, so one connection cannot use up its tenant's budget — and inbound bytes per second per tenant.
//!
//! A tenant over its connection quota is refused at the upgrade (HTTP 429). A sender faster than its message
//! rate is slowed down, not refused: the gateway waits for tokens (of the tenant's bucket and of the
//! connection's) before forwarding the next frame, so the connection reads more slowly and TCP pushes back
//! on the client (invariant 8). Deliveries to the connection go on while it waits.
//!
//! With Redis ([`crate::shared_quotas`]) the connection cap and the tenant's rates hold across every gateway
//! of the deployment; without it, per gateway.
//!
//! A tenant's buckets outlive its connections: one that closes every connection and reconnects finds its
//! debt where it left it. A tenant's entry goes only once it has no connection and its buckets have refilled
//! (then it is the same as a fresh one).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::shared_quotas::{Forwarded, Owed, Report, SharedQuotas, Theirs};

/// Quota settings.
#[derive(Debug, Clone, Copy)]
pub struct QuotaLimits {
    pub max_connections: usize,
    pub messages_per_second: f64,
    pub message_burst: f64,
    pub connection_messages_per_second: f64,
    pub connection_message_burst: f64,
    /// Inbound bytes per second per tenant, and the burst (at least one largest frame).
    pub bytes_per_second: f64,
    pub byte_burst: f64,
}

/// A token bucket: `rate` tokens a second, holding at most `burst`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    refilled: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: f64, burst: f64) -> Self {
        let rate = rate.max(f64::MIN_POSITIVE);
        let burst = burst.max(1.0);
        Self {
            rate,
            burst,
            tokens: burst,
            refilled: Instant::now(),
        }
    }

    /// How much of its burst the bucket owes now (burst minus tokens; more than the burst when in debt).
    pub fn deficit(&self) -> f64 {
        let elapsed = Instant::now().duration_since(self.refilled).as_secs_f64();
        self.burst - (self.tokens + elapsed * self.rate).min(self.burst)
    }

    /// Whether the bucket has refilled to its burst by now (it is then the same as a fresh one).
    pub fn is_full(&self) -> bool {
        let elapsed = Instant::now().duration_since(self.refilled).as_secs_f64();
        self.tokens + elapsed * self.rate >= self.burst
    }

    /// Take one token (going into debt if there is none); returns how long until the debt is paid: the wait
    /// before the message the token is for may go on (zero within the rate).
    pub fn take(&mut self) -> Duration {
        self.take_n(1.0)
    }

    /// Take `n` tokens (going into debt if there are fewer); how long until the debt is paid.
    pub fn take_n(&mut self, n: f64) -> Duration {
        let now = Instant::now();
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.refilled = now;
        self.tokens -= n;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            // (A debt too long to say waits an hour, then is asked again.)
            let hour = Duration::from_secs(3600);
            Duration::try_from_secs_f64(-self.tokens / self.rate).map_or(hour, |wait| wait.min(hour))
        }
    }
}

struct TenantUsage {
    connections: usize,
    /// Of those, viewers' (who may hold all but the members' share).
    viewers: usize,
    messages: TokenBucket,
    bytes: TokenBucket,
    /// What this gateway forwarded for the tenant (cumulative), reported to the other gateways.
    forwarded: Forwarded,
    /// What the other gateways had forwarded at the last exchange (cumulative), once known.
    others_seen: Option<Forwarded>,
}

impl TenantUsage {
    /// No connection, and nothing owed: forgetting it changes nothing.
    fn is_idle(&self) -> bool {
        self.connections == 0 && self.messages.is_full() && self.bytes.is_full()
    }
}

/// Tenants tracked before the idle ones are pruned at the next admission of a new one.
const PRUNE_AT: usize = 1024;

/// Usage of every tenant with an open connection.
pub struct TenantQuotas {
    limits: QuotaLimits,
    tenants: Mutex<HashMap<String, TenantUsage>>,
    /// The other gateways' usage, through Redis (set once connected).
    shared: std::sync::OnceLock<Arc<SharedQuotas>>,
    /// Signalled whenever a connection ends (graceful shutdown waits on it).
    closed: tokio::sync::Notify,
}

/// One admitted connection; dropping it frees the slot.
pub struct ConnectionPermit {
    quotas: Arc<TenantQuotas>,
    tenant: String,
    viewer: bool,
    /// Its slot among every gateway's, when shared.
    slot: Option<String>,
}

impl TenantQuotas {
    pub fn new(limits: QuotaLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            tenants: Mutex::new(HashMap::new()),
            shared: std::sync::OnceLock::new(),
            closed: tokio::sync::Notify::new(),
        })
    }

    /// Hold tenants to these quotas across every gateway sharing the Redis at `url` (see
    /// [`crate::shared_quotas`]): connects (waiting up to 5 s, then in the background; until then, and
    /// whenever Redis is unreachable, each gateway holds tenants to its own limits), then exchanges usage every
    /// [`crate::shared_quotas::EXCHANGE_EVERY`] and renews this gateway's connection slots, while the quotas
    /// live. Call it before taking connections.
    pub async fn share_through_redis(self: &Arc<Self>, url: String) {
        if let Ok(Ok(shared)) =
            tokio::time::timeout(Duration::from_secs(5), SharedQuotas::connect(&url)).await
        {
            self.share(shared);
            return;
        }
        let quotas = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            let shared = loop {
                match SharedQuotas::connect(&url).await {
                    Ok(shared) => break shared,
                    Err(error) => {
                        tracing::warn!(%error, "cannot reach Redis to share tenant quotas; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
                if quotas.strong_count() == 0 {
                    return;
                }
            };
            if let Some(quotas) = quotas.upgrade() {
                quotas.share(shared);
            }
        });
    }

    /// Hold tenants to these quotas across every gateway sharing `shared`.
    pub fn share(self: &Arc<Self>, shared: Arc<SharedQuotas>) {
        if self.shared.set(shared.clone()).is_err() {
            return;
        }
        let quotas = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut exchanges = tokio::time::interval(crate::shared_quotas::EXCHANGE_EVERY);
            exchanges.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let renew_every = crate::shared_quotas::SLOT_LEASE / 3;
            let mut renewed = Instant::now();
            let mut failing = false;
            loop {
                exchanges.tick().await;
                let Some(quotas) = quotas.upgrade() else {
                    return;
                };
                let mut result = quotas.exchange_usage(&shared).await;
                if result.is_ok() && renewed.elapsed() >= renew_every {
                    result = shared.renew_slots().await;
                    renewed = Instant::now();
                }
                match result {
                    Err(error) if !failing => {
                        tracing::warn!(%error, "cannot share tenant quotas through Redis; holding tenants to this gateway's own limits");
                        failing = true;
                    }
                    Ok(()) if failing => {
                        tracing::info!("sharing tenant quotas through Redis again");
                        failing = false;
                    }
                    _ => {}
                }
            }
        });
    }

    /// One exchange with the other gateways: report what this one forwarded, and charge each tenant's buckets
    /// with what the others forwarded since the last exchange.
    pub async fn exchange_usage(
        &self,
        shared: &SharedQuotas,
    ) -> Result<(), crate::shared_quotas::SharedQuotaError> {
        let own: Vec<(String, Report)> = self
            .tenants
            .lock()
            .iter()
            .map(|(tenant, usage)| {
                let report = Report {
                    forwarded: usage.forwarded,
                    owed: Owed {
                        messages: usage.messages.deficit().max(0.0).ceil() as u64,
                        bytes: usage.bytes.deficit().max(0.0).ceil() as u64,
                        age_ms: 0,
                    },
                };
                (tenant.clone(), report)
            })
            .collect();
        for (tenant, theirs) in shared.exchange(&own).await? {
            self.charge_others(&tenant, &theirs);
        }
        Ok(())
    }

    /// What the other gateways reported of `tenant`: charge its buckets with what they forwarded since the
    /// last exchange — or, the first time, with the most any of them owed of the tenant's burst, less what has
    /// refilled since (so a tenant that moves here brings its debt).
    pub fn charge_others(&self, tenant: &str, theirs: &Theirs) {
        let mut tenants = self.tenants.lock();
        let Some(usage) = tenants.get_mut(tenant) else {
            return;
        };
        let (messages, bytes) = match usage.others_seen {
            Some(seen) => (
                theirs.forwarded.messages.saturating_sub(seen.messages) as f64,
                theirs.forwarded.bytes.saturating_sub(seen.bytes) as f64,
            ),
            // First contact: the most any of them owed, less what has refilled since, beyond what these
            // buckets owe already.
            None => {
                let most_owed = |of: fn(&Owed) -> u64, rate: f64| {
                    theirs
                        .owed
                        .iter()
                        .map(|owed| of(owed) as f64 - owed.age_ms as f64 / 1000.0 * rate)
                        .fold(0.0, f64::max)
                };
                (
                    most_owed(|owed| owed.messages, self.limits.messages_per_second)
                        - usage.messages.deficit(),
                    most_owed(|owed| owed.bytes, self.limits.bytes_per_second) - usage.bytes.deficit(),
                )
            }
        };
        if messages >= 1.0 {
            usage.messages.take_n(messages);
        }
        if bytes >= 1.0 {
            usage.bytes.take_n(bytes);
        }
        usage.others_seen = Some(theirs.forwarded);
    }

    /// A connection slot for `tenant` on this gateway and, when shared, among every gateway's; `None` when
    /// the tenant has its maximum open (here, or across the deployment), or, for a `viewer`, when viewers hold
    /// all but the members' share of it (here, or across the deployment; [`TenantQuotas::admit`]).
    pub async fn admit_everywhere(self: &Arc<Self>, tenant: &str, viewer: bool) -> Option<ConnectionPermit> {
        let mut permit = self.admit(tenant, viewer)?;
        if let Some(shared) = self.shared.get() {
            let viewers_most = viewer.then(|| self.viewers_most());
            match shared
                .take_slot(tenant, self.limits.max_connections, viewers_most)
                .await
            {
                Ok(Some(slot)) => permit.slot = Some(slot),
                Ok(None) => return None,
                Err(error) => {
                    tracing::warn!(%error, "cannot count the tenant's connections across gateways; admitting by this gateway's count");
                }
            }
        }
        Some(permit)
    }

    /// The connections of a tenant kept for its members: a quarter of its maximum, at least one. Viewers (a
    /// read-only link shared widely) never fill the rest and lock the team out.
    pub fn members_share(&self) -> usize {
        (self.limits.max_connections / 4).max(1)
    }

    /// The most connections a tenant's viewers may hold: all but the members' share.
    pub fn viewers_most(&self) -> usize {
        self.limits.max_connections.saturating_sub(self.members_share())
    }

    /// A connection slot for `tenant`, or `None` when it has its maximum open, or — for a `viewer` — when
    /// viewers hold all but the members' share.
    pub fn admit(self: &Arc<Self>, tenant: &str, viewer: bool) -> Option<ConnectionPermit> {
        let viewers_most = self.viewers_most();
        let mut tenants = self.tenants.lock();
        // Tenants without connections are kept while in debt; the refilled ones go, now and then.
        if tenants.len() >= PRUNE_AT && !tenants.contains_key(tenant) {
            tenants.retain(|_, usage| !usage.is_idle());
        }
        let usage = tenants.entry(tenant.to_string()).or_insert_with(|| TenantUsage {
            connections: 0,
            viewers: 0,
            messages: TokenBucket::new(self.limits.messages_per_second, self.limits.message_burst),
            bytes: TokenBucket::new(self.limits.bytes_per_second, self.limits.byte_burst),
            forwarded: Forwarded::default(),
            others_seen: None,
        });
        if usage.connections >= self.limits.max_connections || (viewer && usage.viewers >= viewers_most) {
            return None;
        }
        usage.connections += 1;
        usage.viewers += usize::from(viewer);
        Some(ConnectionPermit {
            quotas: self.clone(),
            tenant: tenant.to_string(),
            viewer,
            slot: None,
        })
    }

    /// A fresh message bucket for one connection.
    pub fn connection_bucket(&self) -> TokenBucket {
        TokenBucket::new(
            self.limits.connection_messages_per_second,
            self.limits.connection_message_burst,
        )
    }

    /// Take one message token from `tenant` and one from the connection's `bucket`, and `bytes` byte tokens
    /// from `tenant`; returns how long to wait before forwarding the message (zero within every rate).
    pub fn message_delay(&self, tenant: &str, bucket: &mut TokenBucket, bytes: usize) -> Duration {
        let own = bucket.take();
        let shared = self
            .tenants
            .lock()
            .get_mut(tenant)
            .map_or(Duration::ZERO, |usage| {
                usage.forwarded.messages += 1;
                usage.forwarded.bytes += bytes as u64;
                usage.messages.take().max(usage.bytes.take_n(bytes as f64))
            });
        own.max(shared)
    }

    /// Open connections of every tenant.
    pub fn total_connections(&self) -> usize {
        self.tenants.lock().values().map(|u| u.connections).sum()
    }

    /// Wait until every connection has ended (they have sent their close frames) and, when quotas are shared,
    /// their slots are given back to Redis.
    pub async fn wait_idle(&self) {
        loop {
            let closed = self.closed.notified();
            if self.total_connections() == 0 {
                break;
            }
            closed.await;
        }
        if let Some(shared) = self.shared.get() {
            shared.given_back().await;
        }
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        if let (Some(shared), Some(slot)) = (self.quotas.shared.get(), self.slot.take()) {
            shared.release_slot(&self.tenant, slot);
        }
        {
            let mut tenants = self.quotas.tenants.lock();
            if let Some(usage) = tenants.get_mut(&self.tenant) {
                usage.connections = usage.connections.saturating_sub(1);
                usage.viewers = usage.viewers.saturating_sub(usize::from(self.viewer));
                // A tenant still in debt keeps its buckets: reconnecting does not reset them.
                if usage.is_idle() {
                    tenants.remove(&self.tenant);
                }
            }
        }
        self.quotas.closed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(max_connections: usize) -> Arc<TenantQuotas> {
        TenantQuotas::new(QuotaLimits {
            max_connections,
            messages_per_second: 10.0,
            message_burst: 5.0,
            connection_messages_per_second: 100.0,
            connection_message_burst: 100.0,
            bytes_per_second: 1000.0,
            byte_burst: 2000.0,
        })
    }

    #[test]
    fn connection_slots_are_per_tenant_and_freed_on_drop() {
        let q = quotas(2);
        let a1 = q.admit("a", false).expect("first");
        let _a2 = q.admit("a", false).expect("second");
        assert!(q.admit("a", false).is_none(), "third refused");
        assert!(q.admit("b", false).is_some(), "other tenants unaffected");
        drop(a1);
        assert!(q.admit("a", false).is_some(), "slot freed");
    }

    #[test]
    fn viewers_never_take_the_members_share() {
        let q = quotas(2);
        let v1 = q.admit("a", true).expect("a viewer");
        assert!(
            q.admit("a", true).is_none(),
            "a second viewer would leave no room for a member"
        );
        let m = q.admit("a", false).expect("a member still gets in");
        assert!(q.admit("a", false).is_none(), "the tenant's maximum holds");
        drop(v1);
        drop(m);
        let q = quotas(8);
        let viewers: Vec<_> = (0..6).map(|_| q.admit("a", true).expect("viewer")).collect();
        assert!(q.admit("a", true).is_none(), "viewers hold all but a quarter");
        let members: Vec<_> = (0..2).map(|_| q.admit("a", false).expect("member")).collect();
        assert_eq!((viewers.len(), members.len()), (6, 2));
    }

    #[test]
    fn messages_beyond_the_burst_wait_at_the_tenant_rate() {
        let q = quotas(1);
        let _permit = q.admit("a", false).expect("admit");
        let mut bucket = q.connection_bucket();
        for _ in 0..5 {
            assert_eq!(q.message_delay("a", &mut bucket, 1), Duration::ZERO);
        }
        let wait = q.message_delay("a", &mut bucket, 1);
        assert!(
            wait > Duration::from_millis(50) && wait <= Duration::from_millis(110),
            "{wait:?}"
        );
    }

    #[test]
    fn one_connection_waits_at_its_own_rate_below_the_tenants() {
        let q = TenantQuotas::new(QuotaLimits {
            max_connections: 2,
            messages_per_second: 1_000.0,
            message_burst: 1_000.0,
            connection_messages_per_second: 10.0,
            connection_message_burst: 2.0,
            bytes_per_second: 1e9,
            byte_burst: 1e9,
        });
        let _permit = q.admit("a", false).expect("admit");
        let (mut first, mut second) = (q.connection_bucket(), q.connection_bucket());
        assert_eq!(q.message_delay("a", &mut first, 1), Duration::ZERO);
        assert_eq!(q.message_delay("a", &mut first, 1), Duration::ZERO);
        assert!(q.message_delay("a", &mut first, 1) > Duration::from_millis(50));
        // another connection of the same tenant is not held back by the first one's debt
        assert_eq!(q.message_delay("a", &mut second, 1), Duration::ZERO);
    }

    #[test]
    fn bytes_beyond_the_burst_wait_at_the_tenant_byte_rate() {
        let q = quotas(2);
        let _permit = q.admit("a", false).expect("admit");
        let mut bucket = q.connection_bucket();
        // The burst (2,000 bytes) goes through; the next 500 bytes wait half a second at 1,000 bytes/s.
        assert_eq!(q.message_delay("a", &mut bucket, 2_000), Duration::ZERO);
        let wait = q.message_delay("a", &mut bucket, 500);
        assert!(
            wait >= Duration::from_millis(450) && wait <= Duration::from_millis(510),
            "{wait:?}"
        );
        // Another tenant's bytes are its own.
        let _other = q.admit("b", false).expect("admit");
        assert_eq!(
            q.message_delay("b", &mut q.connection_bucket(), 2_000),
            Duration::ZERO
        );
    }

    #[test]
    fn a_tenant_in_debt_keeps_it_across_reconnects() {
        let q = quotas(1);
        let permit = q.admit("a", false).expect("admit");
        let mut bucket = q.connection_bucket();
        for _ in 0..5 {
            q.message_delay("a", &mut bucket, 1);
        }
        assert!(q.message_delay("a", &mut bucket, 1) > Duration::ZERO);
        // Its only connection closes and it reconnects at once: the debt is still there.
        drop(permit);
        let _again = q.admit("a", false).expect("admit again");
        let wait = q.message_delay("a", &mut q.connection_bucket(), 1);
        assert!(wait > Duration::from_millis(100), "{wait:?}");
    }

    #[test]
    fn a_refilled_tenant_without_connections_is_forgotten() {
        let q = quotas(1);
        drop(q.admit("a", false).expect("admit"));
        assert!(q.tenants.lock().is_empty());
    }
}
