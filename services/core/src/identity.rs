//! Who is connected and to what: tenants, hosts, roles and connection ids.
//!
//! A [`HostKey`] is the unit of sharding and of `serverSeq` (design §3): every lookup in the relay is keyed by
//! it, which is what keeps tenants isolated (invariant 7).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// One AHP host inside one tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HostKey {
    pub tenant: String,
    pub host: String,
}

impl HostKey {
    pub fn new(tenant: impl Into<String>, host: impl Into<String>) -> Self {
        Self {
            tenant: tenant.into(),
            host: host.into(),
        }
    }
}

impl fmt::Display for HostKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.host)
    }
}

/// What an authenticated principal may do on a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// May read (initialize, subscribe, list) but every dispatch is rejected.
    Viewer,
    /// May read, dispatch and create or dispose sessions and chats.
    Member,
    /// Everything a member may, plus host administration.
    Admin,
}

impl Role {
    pub fn can_write(self) -> bool {
        self >= Role::Member
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Member => "member",
            Role::Admin => "admin",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "member" => Ok(Role::Member),
            "admin" => Ok(Role::Admin),
            other => Err(format!(
                "unknown role {other:?} (expected viewer, member or admin)"
            )),
        }
    }
}

/// The authenticated principal behind one connection, from its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The token's `sub`: the user.
    pub subject: String,
    pub tenant: String,
    pub role: Role,
    /// The token's `hosts`: the only hosts (and those hosts' directories of the tenant's workspace) it reaches;
    /// `None` for a token of the whole tenant.
    pub hosts: Option<Vec<String>>,
}

/// Process-unique id of one client connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionId(pub u64);

impl ConnectionId {
    /// A new id, unique among this process's connections and, with high probability, across the gateways of a
    /// deployment: the high 32 bits are a per-process prefix (process id mixed with the start time), the low
    /// 32 bits count connections.
    pub fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        ConnectionId((Self::process_prefix() << 32) | (NEXT.fetch_add(1, Ordering::Relaxed) & 0xFFFF_FFFF))
    }

    /// This process's prefix: the high 32 bits of every id [`ConnectionId::next`] gives out. A shard knows a
    /// gateway's connections by it (and detaches them all when that gateway is gone).
    pub fn process_prefix() -> u64 {
        static PREFIX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        *PREFIX.get_or_init(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            // Below 2^31 so ids stay far from the range relay-rpc reserves for internal attachments; never 0.
            (u64::from(std::process::id() ^ nanos.rotate_left(16)) & 0x7FFF_FFFF).max(1)
        })
    }

    /// The prefix of the process that gave out this id.
    pub fn prefix(self) -> u64 {
        self.0 >> 32
    }
}

impl fmt::Display for ConnectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}
