//! Per-tenant quotas at the gateway: open connections, and inbound messages per second.
//!
//! A tenant over its connection quota is refused at the upgrade (HTTP 429). A tenant sending faster than its
//! message rate is slowed down, not refused: the gateway waits for tokens before forwarding the next frame, so
//! its connections read more slowly and TCP pushes back on the client (invariant 8).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Quota settings.
#[derive(Debug, Clone, Copy)]
pub struct QuotaLimits {
    pub max_connections: usize,
    pub messages_per_second: f64,
    pub message_burst: f64,
}

struct TenantUsage {
    connections: usize,
    tokens: f64,
    refilled: Instant,
}

/// Usage of every tenant with an open connection.
pub struct TenantQuotas {
    limits: QuotaLimits,
    tenants: Mutex<HashMap<String, TenantUsage>>,
    /// Signalled whenever a connection ends (graceful shutdown waits on it).
    closed: tokio::sync::Notify,
}

/// One admitted connection; dropping it frees the slot.
pub struct ConnectionPermit {
    quotas: Arc<TenantQuotas>,
    tenant: String,
}

impl TenantQuotas {
    pub fn new(limits: QuotaLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            tenants: Mutex::new(HashMap::new()),
            closed: tokio::sync::Notify::new(),
        })
    }

    /// A connection slot for `tenant`, or `None` when it has its maximum open.
    pub fn admit(self: &Arc<Self>, tenant: &str) -> Option<ConnectionPermit> {
        let mut tenants = self.tenants.lock();
        let usage = tenants.entry(tenant.to_string()).or_insert_with(|| TenantUsage {
            connections: 0,
            tokens: self.limits.message_burst,
            refilled: Instant::now(),
        });
        if usage.connections >= self.limits.max_connections {
            return None;
        }
        usage.connections += 1;
        Some(ConnectionPermit {
            quotas: self.clone(),
            tenant: tenant.to_string(),
        })
    }

    /// Take one message token for `tenant`; returns how long to wait before forwarding it (zero within rate).
    pub fn message_delay(&self, tenant: &str) -> Duration {
        let mut tenants = self.tenants.lock();
        let Some(usage) = tenants.get_mut(tenant) else {
            return Duration::ZERO;
        };
        let now = Instant::now();
        let rate = self.limits.messages_per_second.max(1.0);
        let elapsed = now.duration_since(usage.refilled).as_secs_f64();
        usage.tokens = (usage.tokens + elapsed * rate).min(self.limits.message_burst);
        usage.refilled = now;
        usage.tokens -= 1.0;
        if usage.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-usage.tokens / rate)
        }
    }

    /// Open connections of every tenant.
    pub fn total_connections(&self) -> usize {
        self.tenants.lock().values().map(|u| u.connections).sum()
    }

    /// Wait until every connection has ended (they have sent their close frames).
    pub async fn wait_idle(&self) {
        loop {
            let closed = self.closed.notified();
            if self.total_connections() == 0 {
                return;
            }
            closed.await;
        }
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        {
            let mut tenants = self.quotas.tenants.lock();
            if let Some(usage) = tenants.get_mut(&self.tenant) {
                usage.connections = usage.connections.saturating_sub(1);
                if usage.connections == 0 {
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
        })
    }

    #[test]
    fn connection_slots_are_per_tenant_and_freed_on_drop() {
        let q = quotas(2);
        let a1 = q.admit("a").expect("first");
        let _a2 = q.admit("a").expect("second");
        assert!(q.admit("a").is_none(), "third refused");
        assert!(q.admit("b").is_some(), "other tenants unaffected");
        drop(a1);
        assert!(q.admit("a").is_some(), "slot freed");
    }

    #[test]
    fn messages_beyond_the_burst_wait_at_the_tenant_rate() {
        let q = quotas(1);
        let _permit = q.admit("a").expect("admit");
        for _ in 0..5 {
            assert_eq!(q.message_delay("a"), Duration::ZERO);
        }
        let wait = q.message_delay("a");
        assert!(
            wait > Duration::from_millis(50) && wait <= Duration::from_millis(110),
            "{wait:?}"
        );
    }
}
