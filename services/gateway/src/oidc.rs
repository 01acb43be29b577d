//! Tokens from an identity provider: signatures checked with its public keys (RS256, ES256 or EdDSA, from PEM
//! files or its JWKS URL, see [`crate::jwks`]), the algorithm pinned by configuration (never taken from the token: `none`, HS256 and anything not
//! configured are refused), `iss` and `aud` required when configured, `exp`/`nbf` with a bounded clock skew,
//! and the relay's identity read from configurable claims, so tokens of an existing OIDC provider work
//! without a custom issuer.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

pub use jsonwebtoken::Algorithm;
use jsonwebtoken::{DecodingKey, Validation};
use relay_core::Role;
use serde_json::Value;

use crate::claims::{AuthError, Claims};
use crate::jwks::{JwksKeys, SigningKey};

/// Longest clock skew accepted for `exp` and `nbf`.
pub const MAX_LEEWAY_SECONDS: u64 = 300;

/// Which claims hold the relay's identity.
#[derive(Debug, Clone)]
pub struct ClaimNames {
    /// The tenant (a string).
    pub tenant: String,
    /// The role: `viewer`, `member` or `admin`, or a list of roles (the highest known one counts). A token
    /// without it is a viewer.
    pub role: String,
    /// The host names the token may open (a list; absent: every host of the tenant).
    pub hosts: String,
}

impl Default for ClaimNames {
    fn default() -> Self {
        Self {
            tenant: "tid".into(),
            role: "role".into(),
            hosts: "hosts".into(),
        }
    }
}

/// How an identity provider's tokens are checked.
#[derive(Debug, Clone)]
pub struct ProviderSettings {
    /// The accepted signature algorithms (asymmetric only).
    pub algorithms: Vec<Algorithm>,
    /// Required `iss`, if any.
    pub issuer: Option<String>,
    /// Accepted `aud` values (one must match), if any.
    pub audience: Vec<String>,
    /// Clock skew accepted for `exp` / `nbf`, in seconds (at most [`MAX_LEEWAY_SECONDS`]).
    pub leeway_seconds: u64,
    pub claims: ClaimNames,
}

/// Why a provider cannot be configured.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("cannot read the public key {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} is not an RSA, EC (P-256) or Ed25519 public key in PEM")]
    NotAKey { path: String },
    #[error("no public key is configured for the configured algorithms")]
    NoKeys,
    #[error("algorithm {0:?} is not accepted for identity-provider tokens (use RS256, ES256 or EdDSA)")]
    Algorithm(Algorithm),
    #[error("the clock skew may be at most {MAX_LEEWAY_SECONDS}s")]
    Leeway,
}

/// An identity provider's public keys and the checks its tokens must pass.
pub struct IdentityProvider {
    keys: KeySource,
    /// The checks every token must pass; its algorithms are set per token (the token's, once it is known
    /// to be one of the configured ones).
    validation: Validation,
    algorithms: Vec<Algorithm>,
    claims: ClaimNames,
}

/// Where the provider's keys come from.
enum KeySource {
    /// Public keys from PEM files, fixed for the life of the process.
    Pem(Vec<SigningKey>),
    /// The provider's JWKS URL, fetched and refreshed ([`crate::jwks`]).
    Jwks(Arc<JwksKeys>),
}

impl std::fmt::Debug for IdentityProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = match &self.keys {
            KeySource::Pem(keys) => format!("{} PEM keys", keys.len()),
            KeySource::Jwks(jwks) => format!("{jwks:?}"),
        };
        f.debug_struct("IdentityProvider")
            .field("keys", &keys)
            .field("algorithms", &self.algorithms)
            .finish()
    }
}

/// The asymmetric algorithms a provider may use.
const ACCEPTED: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

impl IdentityProvider {
    /// A provider with the public keys in `pem_files`.
    pub fn from_pem_files(
        pem_files: &[impl AsRef<Path>],
        settings: ProviderSettings,
    ) -> Result<Self, ProviderError> {
        let keys = pem_files
            .iter()
            .map(|path| {
                let path = path.as_ref();
                let shown = path.display().to_string();
                let pem = std::fs::read(path).map_err(|source| ProviderError::Read {
                    path: shown.clone(),
                    source,
                })?;
                public_key(&pem).ok_or(ProviderError::NotAKey { path: shown })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(keys, settings)
    }

    /// A provider with `keys`.
    pub fn new(keys: Vec<DecodingKey>, settings: ProviderSettings) -> Result<Self, ProviderError> {
        if let Some(refused) = settings.algorithms.iter().find(|alg| !ACCEPTED.contains(alg)) {
            return Err(ProviderError::Algorithm(*refused));
        }
        let keys: Vec<SigningKey> = keys
            .into_iter()
            .filter(|key| settings.algorithms.iter().any(|alg| alg.family() == key.family()))
            .map(|key| SigningKey {
                kid: None,
                algorithm: None,
                key,
            })
            .collect();
        if keys.is_empty() {
            return Err(ProviderError::NoKeys);
        }
        Self::with_source(KeySource::Pem(keys), settings)
    }

    /// A provider whose keys are the JWKS `keys` keeps fresh.
    pub fn from_jwks(keys: Arc<JwksKeys>, settings: ProviderSettings) -> Result<Self, ProviderError> {
        Self::with_source(KeySource::Jwks(keys), settings)
    }

    fn with_source(keys: KeySource, settings: ProviderSettings) -> Result<Self, ProviderError> {
        if settings.algorithms.is_empty() {
            return Err(ProviderError::NoKeys);
        }
        if let Some(refused) = settings.algorithms.iter().find(|alg| !ACCEPTED.contains(alg)) {
            return Err(ProviderError::Algorithm(*refused));
        }
        if settings.leeway_seconds > MAX_LEEWAY_SECONDS {
            return Err(ProviderError::Leeway);
        }
        let mut validation = Validation::new(Algorithm::RS256);
        validation.leeway = settings.leeway_seconds;
        validation.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        if let Some(issuer) = &settings.issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        if settings.audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&settings.audience);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        Ok(Self {
            keys,
            validation,
            algorithms: settings.algorithms,
            claims: settings.claims,
        })
    }

    /// The relay claims of a token this provider signed, or why it is refused.
    pub async fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        use jsonwebtoken::errors::ErrorKind;
        let header = jsonwebtoken::decode_header(token)?;
        let alg = header.alg;
        if !self.algorithms.contains(&alg) {
            return Err(jsonwebtoken::errors::Error::from(ErrorKind::InvalidAlgorithm).into());
        }
        let keys = match &self.keys {
            KeySource::Pem(keys) => return self.check(token, alg, keys.iter()),
            KeySource::Jwks(jwks) => {
                let cached = jwks.keys();
                if header.kid.is_some() && !cached.iter().any(|key| key.kid == header.kid) {
                    // Perhaps a new key of a rotation: ask the provider (rate-limited).
                    jwks.refetch_for_unknown_kid().await;
                    jwks.keys()
                } else {
                    cached
                }
            }
        };
        let named = keys
            .iter()
            .filter(|key| header.kid.is_none() || key.kid == header.kid);
        self.check(token, alg, named)
    }

    /// Check `token` (whose header names `alg`) against each of `keys` that fits the algorithm.
    fn check<'k>(
        &self,
        token: &str,
        alg: Algorithm,
        keys: impl Iterator<Item = &'k SigningKey>,
    ) -> Result<Claims, AuthError> {
        use jsonwebtoken::errors::ErrorKind;
        let mut validation = self.validation.clone();
        validation.algorithms = vec![alg];
        let fitting = keys.filter(|key| {
            key.key.family() == alg.family() && key.algorithm.is_none_or(|pinned| pinned == alg)
        });
        let mut last = None;
        for key in fitting {
            match jsonwebtoken::decode::<HashMap<String, Value>>(token, &key.key, &validation) {
                Ok(data) => return self.relay_claims(&data.claims),
                // Signed by another key, or one of another type: try the next key.
                Err(error)
                    if matches!(
                        error.kind(),
                        ErrorKind::InvalidSignature | ErrorKind::InvalidKeyFormat
                    ) =>
                {
                    last = Some(error);
                }
                // Expired, wrong issuer or audience, malformed: final.
                Err(error) => return Err(error.into()),
            }
        }
        Err(last.map_or(AuthError::UnknownKey, AuthError::from))
    }

    fn relay_claims(&self, claims: &HashMap<String, Value>) -> Result<Claims, AuthError> {
        let text = |name: &str| claims.get(name).and_then(Value::as_str).map(str::to_string);
        let number = |name: &str| claims.get(name).and_then(Value::as_u64);
        let sub = text("sub")
            .filter(|s| !s.is_empty())
            .ok_or(AuthError::Claims("sub is empty"))?;
        let tid = text(&self.claims.tenant)
            .filter(|t| !t.is_empty())
            .ok_or(AuthError::Claims("the tenant claim is missing or empty"))?;
        let hosts = match claims.get(&self.claims.hosts) {
            None | Some(Value::Null) => None,
            Some(Value::Array(hosts)) => Some(
                hosts
                    .iter()
                    .map(|h| h.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or(AuthError::Claims("the hosts claim must be a list of names"))?,
            ),
            Some(_) => return Err(AuthError::Claims("the hosts claim must be a list of names")),
        };
        Ok(Claims {
            sub,
            tid,
            role: role_of(claims.get(&self.claims.role)),
            hosts,
            exp: number("exp").unwrap_or(0),
            iat: number("iat").unwrap_or(0),
            nbf: number("nbf"),
        })
    }
}

/// The role a claim grants: a role name, or the highest known one in a list; anything else is a viewer.
fn role_of(claim: Option<&Value>) -> Role {
    let named = |value: &Value| match value.as_str() {
        Some("admin") => Some(Role::Admin),
        Some("member") => Some(Role::Member),
        Some("viewer") => Some(Role::Viewer),
        _ => None,
    };
    let rank = |role: Role| match role {
        Role::Viewer => 0,
        Role::Member => 1,
        Role::Admin => 2,
    };
    match claim {
        Some(Value::Array(values)) => values
            .iter()
            .filter_map(named)
            .max_by_key(|role| rank(*role))
            .unwrap_or(Role::Viewer),
        Some(value) => named(value).unwrap_or(Role::Viewer),
        None => Role::Viewer,
    }
}

/// A public key in PEM, of whichever kind it is.
fn public_key(pem: &[u8]) -> Option<DecodingKey> {
    DecodingKey::from_rsa_pem(pem)
        .ok()
        .or_else(|| DecodingKey::from_ec_pem(pem).ok())
        .or_else(|| DecodingKey::from_ed_pem(pem).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};

    const KEYS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/keys");

    fn read(name: &str) -> Vec<u8> {
        std::fs::read(format!("{KEYS}/{name}")).expect("test key")
    }

    fn settings() -> ProviderSettings {
        ProviderSettings {
            algorithms: vec![Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA],
            issuer: Some("https://idp.example".into()),
            audience: vec!["ahp-relay".into()],
            leeway_seconds: 5,
            claims: ClaimNames {
                tenant: "org".into(),
                role: "roles".into(),
                hosts: "hosts".into(),
            },
        }
    }

    fn provider() -> IdentityProvider {
        let keys = ["rsa.pub", "ec.pub", "ed.pub"].map(|name| format!("{KEYS}/{name}"));
        IdentityProvider::from_pem_files(&keys, settings()).expect("provider")
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs()
    }

    fn claims() -> serde_json::Value {
        serde_json::json!({
            "sub": "ana", "org": "acme", "roles": ["member", "admin", "other"], "hosts": ["default"],
            "iss": "https://idp.example", "aud": "ahp-relay", "exp": now() + 600, "iat": now()
        })
    }

    /// Verify outside of a runtime (PEM keys never wait).
    fn provider_verify(provider: &IdentityProvider, token: &str) -> Result<Claims, AuthError> {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(provider.verify(token))
    }

    fn sign(alg: Algorithm, key: &EncodingKey, claims: &serde_json::Value) -> String {
        jsonwebtoken::encode(&Header::new(alg), claims, key).expect("sign")
    }

    fn rsa() -> EncodingKey {
        EncodingKey::from_rsa_pem(&read("rsa.key")).expect("rsa key")
    }

    #[test]
    fn tokens_signed_with_any_configured_key_map_to_relay_claims() {
        let provider = provider();
        let signers = [
            (Algorithm::RS256, rsa()),
            (
                Algorithm::ES256,
                EncodingKey::from_ec_pem(&read("ec.key")).expect("ec key"),
            ),
            (
                Algorithm::EdDSA,
                EncodingKey::from_ed_pem(&read("ed.key")).expect("ed key"),
            ),
        ];
        for (alg, key) in signers {
            let verified = provider_verify(&provider, &sign(alg, &key, &claims())).expect("verified");
            assert_eq!(
                (verified.sub.as_str(), verified.tid.as_str()),
                ("ana", "acme"),
                "{alg:?}"
            );
            assert_eq!(verified.role, Role::Admin, "the highest known role of the list");
            assert_eq!(verified.hosts, Some(vec!["default".to_string()]));
        }
        // Without a role claim, a viewer.
        let mut no_role = claims();
        no_role.as_object_mut().expect("object").remove("roles");
        assert_eq!(
            provider_verify(&provider, &sign(Algorithm::RS256, &rsa(), &no_role))
                .expect("ok")
                .role,
            Role::Viewer
        );
    }

    #[test]
    fn wrong_issuer_audience_expiry_tenant_or_key_are_refused() {
        let provider = provider();
        let refused = |changes: serde_json::Value| {
            let mut claims = claims();
            for (name, value) in changes.as_object().expect("object") {
                if value.is_null() {
                    claims.as_object_mut().expect("object").remove(name);
                } else {
                    claims[name] = value.clone();
                }
            }
            provider_verify(&provider, &sign(Algorithm::RS256, &rsa(), &claims)).is_err()
        };
        assert!(refused(serde_json::json!({"iss": "https://evil.example"})));
        assert!(refused(serde_json::json!({"iss": null})));
        assert!(refused(serde_json::json!({"aud": "someone-else"})));
        assert!(refused(serde_json::json!({"aud": null})));
        assert!(refused(serde_json::json!({"exp": now() - 60})));
        assert!(refused(serde_json::json!({"nbf": now() + 600})));
        assert!(refused(serde_json::json!({"org": null})));
        assert!(refused(serde_json::json!({"hosts": "default"})));
        assert!(!refused(serde_json::json!({})));
        // Signed by a key the provider does not know.
        let other = EncodingKey::from_rsa_pem(&read("other-rsa.key")).expect("key");
        assert!(provider_verify(&provider, &sign(Algorithm::RS256, &other, &claims())).is_err());
    }

    #[test]
    fn the_algorithm_is_never_taken_from_the_token() {
        let provider = provider();
        // `alg: none`, unsigned.
        use base64::Engine;
        let b64 = |json: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(json).expect("json"))
        };
        let unsigned = format!(
            "{}.{}.",
            b64(&serde_json::json!({"alg": "none", "typ": "JWT"})),
            b64(&claims())
        );
        assert!(provider_verify(&provider, &unsigned).is_err());
        // HS256 "signed" with the public key as the secret (algorithm confusion).
        let confused = sign(
            Algorithm::HS256,
            &EncodingKey::from_secret(&read("rsa.pub")),
            &claims(),
        );
        assert!(provider_verify(&provider, &confused).is_err());
        // An algorithm the configuration does not list, with the right key.
        let rs512 = sign(Algorithm::RS512, &rsa(), &claims());
        assert!(provider_verify(&provider, &rs512).is_err());
    }

    #[test]
    fn symmetric_algorithms_and_large_skews_are_not_configurable() {
        let keys = [format!("{KEYS}/rsa.pub")];
        let mut hs = settings();
        hs.algorithms = vec![Algorithm::HS256];
        assert!(matches!(
            IdentityProvider::from_pem_files(&keys, hs),
            Err(ProviderError::Algorithm(Algorithm::HS256))
        ));
        let mut skew = settings();
        skew.leeway_seconds = MAX_LEEWAY_SECONDS + 1;
        assert!(matches!(
            IdentityProvider::from_pem_files(&keys, skew),
            Err(ProviderError::Leeway)
        ));
        assert!(matches!(
            IdentityProvider::from_pem_files(&[format!("{KEYS}/README.md")], settings()),
            Err(ProviderError::NotAKey { .. })
        ));
    }
}
