//! Which session an agent serves: session URIs are unique only within a host, so a tenant's and a host's name
//! go with it.

/// A session of one host of one tenant: session URIs are unique only within a host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub tenant: String,
    pub host: String,
    pub session: String,
}
