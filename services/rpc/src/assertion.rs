//! Identity assertions on the internal link: a gateway signs (Ed25519, as a 60-second EdDSA JWT) what an RPC
//! acts as — for `Attach`, the user, tenant and role of the connection it attaches to one host; for `Events`,
//! `Watch` and `FetchRange`, the host it reads — and a shard that holds only the public key checks it on each
//! of these RPCs. The internal secret alone (a leak, or a shard's configuration) then no longer lets anyone
//! act as a tenant's user or read a tenant's host: that takes the gateways' private key.
//!
//! An `Attach` assertion also carries the connection's key, a random value the gateway made for it: every
//! `Call` and `Detach` of that connection must present it (connection ids are no secret), so they too act
//! only for a connection a gateway vouched for.
//!
//! The assertion travels in the `ahp-relay-assertion` metadata entry, the key in `ahp-relay-connection-key`.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use relay_core::{ConnectionId, HostKey, Identity, Role};
use serde::{Deserialize, Serialize};
use tonic::metadata::MetadataMap;
use tonic::Status;

/// The gRPC metadata entry carrying the assertion.
pub const ASSERTION_METADATA: &str = "ahp-relay-assertion";
/// The gRPC metadata entry carrying a connection's key on `Call` and `Detach`.
pub const CONNECTION_KEY_METADATA: &str = "ahp-relay-connection-key";
/// How long an assertion is valid after it was signed.
pub const ASSERTION_LIFETIME_SECS: u64 = 60;
const AUDIENCE: &str = "ahp-relay-shard";

/// Why a key cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("identity assertion key: {0}")]
pub struct AssertionKeyError(#[from] jsonwebtoken::errors::Error);

/// What an assertion says.
#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    aud: String,
    iat: u64,
    exp: u64,
    /// The RPC it is for: `attach`, `events`, `watch` or `fetch_range`.
    rpc: String,
    tenant: String,
    host: String,
    /// For `attach`: the connection, and who it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    connection: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sub: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    role: Option<Role>,
    /// For `attach`: the connection's key, which its `Call`s and `Detach` present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    /// For `attach`: the hosts the user's token is scoped to, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hosts: Option<Vec<String>>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// A gateway's signing key.
pub struct AssertionSigner {
    key: EncodingKey,
}

impl AssertionSigner {
    /// From an Ed25519 private key in PEM (PKCS#8: `openssl genpkey -algorithm ed25519`).
    pub fn from_pem(pem: &[u8]) -> Result<Self, AssertionKeyError> {
        Ok(Self {
            key: EncodingKey::from_ed_pem(pem)?,
        })
    }

    fn sign(&self, claims: &Claims) -> Result<String, Status> {
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), claims, &self.key)
            .map_err(|error| Status::internal(format!("cannot sign an identity assertion: {error}")))
    }

    fn claims(rpc: &str, host: &HostKey) -> Claims {
        let iat = now_secs();
        Claims {
            aud: AUDIENCE.into(),
            iat,
            exp: iat + ASSERTION_LIFETIME_SECS,
            rpc: rpc.into(),
            tenant: host.tenant.clone(),
            host: host.host.clone(),
            connection: None,
            sub: None,
            role: None,
            key: None,
            hosts: None,
        }
    }

    /// Put an assertion that `connection` on `host` is `identity` (a user of the host's tenant), with the
    /// connection's `key`, into `metadata`.
    pub fn attach(
        &self,
        metadata: &mut MetadataMap,
        host: &HostKey,
        connection: ConnectionId,
        identity: &Identity,
        key: &str,
    ) -> Result<(), Status> {
        let claims = Claims {
            connection: Some(connection.0),
            sub: Some(identity.subject.clone()),
            role: Some(identity.role),
            key: Some(key.to_string()),
            hosts: identity.hosts.clone(),
            ..Self::claims("attach", host)
        };
        insert(metadata, &self.sign(&claims)?)
    }

    /// A fresh connection key (random, 122 bits).
    pub fn connection_key() -> String {
        uuid::Uuid::new_v4().simple().to_string()
    }

    /// Put `key` (a connection's) into a `Call`'s or `Detach`'s `metadata`.
    pub fn present_key(metadata: &mut MetadataMap, key: &str) -> Result<(), Status> {
        let value = key
            .parse()
            .map_err(|_| Status::internal("a connection key is not valid metadata"))?;
        metadata.insert(CONNECTION_KEY_METADATA, value);
        Ok(())
    }

    /// Put an assertion that this gateway reads `host` with `rpc` into `metadata`.
    pub fn host_rpc(&self, metadata: &mut MetadataMap, rpc: &str, host: &HostKey) -> Result<(), Status> {
        insert(metadata, &self.sign(&Self::claims(rpc, host))?)
    }
}

fn insert(metadata: &mut MetadataMap, token: &str) -> Result<(), Status> {
    let value = token
        .parse()
        .map_err(|_| Status::internal("an identity assertion is not valid metadata"))?;
    metadata.insert(ASSERTION_METADATA, value);
    Ok(())
}

/// A shard's verifying key.
pub struct AssertionVerifier {
    key: DecodingKey,
    validation: Validation,
}

impl AssertionVerifier {
    /// From an Ed25519 public key in PEM (`openssl pkey -in private.pem -pubout`).
    pub fn from_pem(pem: &[u8]) -> Result<Self, AssertionKeyError> {
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_audience(&[AUDIENCE]);
        validation.set_required_spec_claims(&["exp", "aud"]);
        validation.leeway = 5;
        Ok(Self {
            key: DecodingKey::from_ed_pem(pem)?,
            validation,
        })
    }

    fn verify(&self, metadata: &MetadataMap, rpc: &str, host: &HostKey) -> Result<Claims, Status> {
        let token = metadata
            .get(ASSERTION_METADATA)
            .and_then(|value| value.to_str().ok())
            .ok_or_else(|| Status::unauthenticated("an identity assertion is required"))?;
        let claims = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map_err(|error| Status::unauthenticated(format!("invalid identity assertion: {error}")))?
            .claims;
        if claims.rpc != rpc || claims.tenant != host.tenant || claims.host != host.host {
            return Err(Status::permission_denied(
                "the identity assertion is for another RPC or host",
            ));
        }
        Ok(claims)
    }

    /// The identity an `Attach` of `connection` to `host` acts as, and the connection's key, from its
    /// assertion.
    pub fn attach(
        &self,
        metadata: &MetadataMap,
        host: &HostKey,
        connection: ConnectionId,
    ) -> Result<(Identity, String), Status> {
        let claims = self.verify(metadata, "attach", host)?;
        match (claims.connection, claims.sub, claims.role, claims.key) {
            (Some(asserted), Some(subject), Some(role), Some(key))
                if asserted == connection.0 && !key.is_empty() =>
            {
                Ok((
                    Identity {
                        subject,
                        tenant: claims.tenant,
                        role,
                        hosts: claims.hosts,
                    },
                    key,
                ))
            }
            _ => Err(Status::permission_denied(
                "the identity assertion is for another connection",
            )),
        }
    }

    /// Check that a gateway's `rpc` may read `host`.
    pub fn host_rpc(&self, metadata: &MetadataMap, rpc: &str, host: &HostKey) -> Result<(), Status> {
        self.verify(metadata, rpc, host).map(|_| ())
    }
}
