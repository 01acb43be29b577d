//! What a checked token says (its [`Claims`]) and why a token is refused ([`AuthError`]): the floor both
//! token checkers stand on, the relay's own HS256 ([`crate::auth`]) and an identity provider's
//! ([`crate::oidc`]). Nothing here checks a token.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use relay_core::{Identity, Role};
use serde::{Deserialize, Serialize};

/// The claims of a relay token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub tid: String,
    pub role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    pub exp: u64,
    #[serde(default)]
    pub iat: u64,
    /// Not valid before (unix seconds), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
}

impl Claims {
    /// Claims valid for `ttl` from now.
    pub fn new(tenant: &str, subject: &str, role: Role, hosts: Option<Vec<String>>, ttl: Duration) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Self {
            sub: subject.into(),
            tid: tenant.into(),
            role,
            hosts,
            exp: now.saturating_add(ttl.as_secs()),
            iat: now,
            nbf: None,
        }
    }

    pub fn identity(&self) -> Identity {
        Identity {
            subject: self.sub.clone(),
            tenant: self.tid.clone(),
            role: self.role,
            hosts: self.hosts.clone(),
        }
    }

    /// Whether the token may open `host` of its tenant.
    pub fn allows_host(&self, host: &str) -> bool {
        self.hosts
            .as_ref()
            .is_none_or(|hosts| hosts.iter().any(|h| h == host))
    }
}

/// Why a token was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("no access token (send Authorization: Bearer … or ?access_token=…)")]
    Missing,
    #[error("invalid access token: {0}")]
    Invalid(#[from] jsonwebtoken::errors::Error),
    #[error("no key of the identity provider verifies the token")]
    UnknownKey,
    #[error("token claims are incomplete: {0}")]
    Claims(&'static str),
}
