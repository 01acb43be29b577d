//! Which hosts this shard process may serve (design §3, invariant 6 "one writer per host"): its owner name,
//! the lease TTL, and the lease keeper that renews every held lease and deposes hosts whose lease is lost.
//!
//! A shard serves a host only under the host's lease in the store, taken before the host is opened (so the
//! host's counters include every commit of any earlier owner) and checked by every commit
//! ([`relay_store::Store::commit_fenced`]): a deposed owner cannot commit, whatever the clocks say. Leases
//! are renewed every third of their TTL; a shard that dies stops renewing, and once its leases lapse the next
//! shard a gateway asks takes the hosts over. The owner name is the shard's advertised gRPC URL plus a
//! per-process nonce (`http://shard-1:7879#5f0c…`): gateways read the URL part to follow a redirect, and a
//! restarted shard at the same URL is a different owner, so it fences out anything its previous incarnation
//! still had in flight.

use std::time::Duration;

/// How this process takes and keeps host leases.
#[derive(Debug, Clone)]
pub struct Ownership {
    owner: String,
    ttl: Duration,
}

impl Ownership {
    /// Leases named after `advertise_url` (how gateways reach this shard), lasting `ttl` unless renewed.
    pub fn new(advertise_url: &str, ttl: Duration) -> Self {
        static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_nanos())
            .unwrap_or_default();
        let count = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nonce = format!("{started:x}-{:x}-{count}", std::process::id());
        Self {
            owner: format!("{advertise_url}#{nonce}"),
            ttl: ttl.max(Duration::from_millis(300)),
        }
    }

    /// The owner name this process writes into leases.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// How long a lease lasts unless renewed.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The lease TTL in milliseconds, as the store takes it.
    pub fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// How often held leases are renewed: a third of the TTL, so two renewals may fail before one lapses.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }
}

/// The gRPC URL in an owner name (what a gateway should ask instead).
pub fn owner_url(owner: &str) -> &str {
    owner.rsplit_once('#').map_or(owner, |(url, _)| url)
}

/// Unix time in milliseconds, as leases count it.
pub fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_names_carry_the_url_and_differ_per_incarnation() {
        let first = Ownership::new("http://shard-1:7879", Duration::from_secs(3));
        let second = Ownership::new("http://shard-1:7879", Duration::from_secs(3));
        assert_eq!(owner_url(first.owner()), "http://shard-1:7879");
        assert_ne!(first.owner(), second.owner());
        assert_eq!(owner_url("http://no-nonce:1"), "http://no-nonce:1");
    }

    #[test]
    fn leases_renew_three_times_per_ttl() {
        let ownership = Ownership::new("http://s:1", Duration::from_secs(3));
        assert_eq!(ownership.renew_every(), Duration::from_secs(1));
        assert_eq!(ownership.ttl_ms(), 3000);
    }
}
