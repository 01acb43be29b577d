//! What the gateway's Redis test binaries share: the quota limits they run under and a tenant of each test's
//! own.

use relay_gateway::quotas::QuotaLimits;

/// Two connections per tenant, ten messages a second; bytes and a connection's own rate never in the way.
pub fn limits() -> QuotaLimits {
    QuotaLimits {
        max_connections: 2,
        messages_per_second: 10.0,
        message_burst: 5.0,
        connection_messages_per_second: 1_000.0,
        connection_message_burst: 1_000.0,
        bytes_per_second: 1e9,
        byte_burst: 1e9,
    }
}

/// A tenant no other test uses (the Redis server is shared).
pub fn unique_tenant() -> String {
    format!("t{}", uuid::Uuid::new_v4().simple())
}
