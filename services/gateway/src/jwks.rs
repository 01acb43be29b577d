//! An identity provider's signing keys from its JWKS URL (the `jwks_uri` of its OpenID configuration), so its
//! keys rotate without a restart of the relay.
//!
//! The set is fetched with a timeout when the relay starts, again every `refresh_every`, and when a token
//! names a `kid` the cache does not hold — at most once per `min_refetch`, however many such tokens arrive, so
//! tokens with made-up `kid`s cannot make the relay flood the provider. A fetch that fails (unreachable,
//! timed out, not a key set) keeps the keys cached so far: the gateway stays up and keeps admitting tokens of
//! the keys it knows. Only signature keys of asymmetric types are taken (RSA, EC, OKP); a symmetric (`oct`)
//! key in the set is ignored, so no token can be checked with a secret an outsider could read.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use parking_lot::RwLock;
use serde::Deserialize;

/// Largest key set accepted (a real one is a few KiB).
const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// Where the key set is and how often it is fetched.
#[derive(Debug, Clone)]
pub struct JwksSettings {
    pub url: String,
    /// How often the set is fetched again.
    pub refresh_every: Duration,
    /// The shortest time between two fetches for an unknown `kid` (the rate limit).
    pub min_refetch: Duration,
    /// How long one fetch may take.
    pub timeout: Duration,
}

/// Why a fetch of the key set failed.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("cannot fetch the JWKS from {url}: {source}")]
    Fetch {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the JWKS endpoint {url} answered {status}")]
    Status { url: String, status: u16 },
    #[error("the JWKS at {url} is larger than {MAX_JWKS_BYTES} bytes")]
    TooLarge { url: String },
    #[error("the JWKS at {url} is not a JSON Web Key Set: {source}")]
    Parse {
        url: String,
        #[source]
        source: serde_json::Error,
    },
}

/// One signature key of the set.
pub struct SigningKey {
    pub kid: Option<String>,
    /// The algorithm the set pins for this key, if it does.
    pub algorithm: Option<Algorithm>,
    pub key: DecodingKey,
}

/// The cached key set of one JWKS URL and what keeps it fresh.
pub struct JwksKeys {
    settings: JwksSettings,
    client: reqwest::Client,
    keys: RwLock<Arc<Vec<SigningKey>>>,
    /// When a fetch was last started; held while fetching, so concurrent refetches wait for it.
    last_fetch: tokio::sync::Mutex<Option<Instant>>,
    fetches: AtomicU64,
}

impl std::fmt::Debug for JwksKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwksKeys")
            .field("url", &self.settings.url)
            .field("keys", &self.keys.read().len())
            .finish()
    }
}

#[derive(Deserialize)]
struct RawKeySet {
    keys: Vec<serde_json::Value>,
}

impl JwksKeys {
    /// Fetch the set once (a failure is logged and leaves the set empty until a later fetch succeeds) and
    /// keep it fresh from a background task, which ends when the returned value is dropped.
    pub async fn start(settings: JwksSettings) -> Result<Arc<Self>, JwksError> {
        crate::tls::ensure_provider();
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()
            .map_err(JwksError::Client)?;
        let keys = Arc::new(Self {
            settings,
            client,
            keys: RwLock::new(Arc::new(Vec::new())),
            last_fetch: tokio::sync::Mutex::new(None),
            fetches: AtomicU64::new(0),
        });
        keys.refresh().await;
        tokio::spawn(refresh_periodically(Arc::downgrade(&keys)));
        Ok(keys)
    }

    /// The keys cached now.
    pub fn keys(&self) -> Arc<Vec<SigningKey>> {
        self.keys.read().clone()
    }

    /// How many fetches were made (started) so far.
    pub fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }

    /// A token named a `kid` the cache does not hold: fetch the set again unless a fetch started less than
    /// `min_refetch` ago (then the caller sees the keys that fetch brought).
    pub async fn refetch_for_unknown_kid(&self) {
        let mut last = self.last_fetch.lock().await;
        if last.is_some_and(|at| at.elapsed() < self.settings.min_refetch) {
            return;
        }
        *last = Some(Instant::now());
        self.fetch_and_keep().await;
    }

    /// Fetch the set now (the periodic refresh).
    async fn refresh(&self) {
        let mut last = self.last_fetch.lock().await;
        *last = Some(Instant::now());
        self.fetch_and_keep().await;
    }

    async fn fetch_and_keep(&self) {
        self.fetches.fetch_add(1, Ordering::Relaxed);
        match self.fetch().await {
            Ok(keys) => {
                tracing::info!(url = %self.settings.url, keys = keys.len(), "identity provider keys fetched");
                *self.keys.write() = Arc::new(keys);
            }
            Err(error) => {
                let cached = self.keys.read().len();
                tracing::warn!(%error, cached, "cannot refresh the identity provider's keys; keeping the cached ones");
            }
        }
    }

    async fn fetch(&self) -> Result<Vec<SigningKey>, JwksError> {
        let url = &self.settings.url;
        let fetch_error = |source| JwksError::Fetch {
            url: url.clone(),
            source,
        };
        let mut response = self.client.get(url).send().await.map_err(fetch_error)?;
        if !response.status().is_success() {
            return Err(JwksError::Status {
                url: url.clone(),
                status: response.status().as_u16(),
            });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(fetch_error)? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(JwksError::TooLarge { url: url.clone() });
            }
            body.extend_from_slice(&chunk);
        }
        parse_key_set(&body).map_err(|source| JwksError::Parse {
            url: url.clone(),
            source,
        })
    }
}

/// The signature keys of a JWKS document; keys the relay cannot or must not use are skipped (and logged).
pub fn parse_key_set(body: &[u8]) -> Result<Vec<SigningKey>, serde_json::Error> {
    let raw: RawKeySet = serde_json::from_slice(body)?;
    Ok(raw.keys.into_iter().filter_map(signing_key).collect())
}

fn signing_key(value: serde_json::Value) -> Option<SigningKey> {
    let jwk: Jwk = match serde_json::from_value(value) {
        Ok(jwk) => jwk,
        Err(error) => {
            tracing::debug!(%error, "skipping a key of the JWKS the relay cannot read");
            return None;
        }
    };
    let kid = jwk.common.key_id.clone();
    if matches!(jwk.common.public_key_use, Some(ref used) if *used != PublicKeyUse::Signature) {
        return None;
    }
    if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
        tracing::warn!(?kid, "ignoring a symmetric key in the JWKS");
        return None;
    }
    let algorithm = match jwk.common.key_algorithm {
        None => None,
        Some(named) => match Algorithm::from_str(&named.to_string()) {
            Ok(algorithm) => Some(algorithm),
            Err(_) => return None,
        },
    };
    match DecodingKey::from_jwk(&jwk) {
        Ok(key) => Some(SigningKey { kid, algorithm, key }),
        Err(error) => {
            tracing::warn!(%error, ?kid, "skipping a key of the JWKS that does not parse");
            None
        }
    }
}

async fn refresh_periodically(keys: Weak<JwksKeys>) {
    let Some(every) = keys.upgrade().map(|keys| keys.settings.refresh_every) else {
        return;
    };
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(keys) = keys.upgrade() else { return };
        keys.refresh().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/keys");

    fn jwk(name: &str, extra: serde_json::Value) -> serde_json::Value {
        let text = std::fs::read_to_string(format!("{KEYS}/{name}.jwk.json")).expect("test key");
        let mut jwk: serde_json::Value = serde_json::from_str(&text).expect("jwk");
        if let (Some(jwk), Some(extra)) = (jwk.as_object_mut(), extra.as_object()) {
            jwk.extend(extra.clone());
        }
        jwk
    }

    #[test]
    fn takes_signature_keys_and_skips_symmetric_encryption_and_unknown_ones() {
        let set = serde_json::json!({ "keys": [
            jwk("rsa", serde_json::json!({"kid": "r", "alg": "RS256", "use": "sig"})),
            jwk("ec", serde_json::json!({"kid": "e"})),
            jwk("ed", serde_json::json!({"kid": "d", "alg": "EdDSA"})),
            {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac", "alg": "HS256"},
            jwk("other-rsa", serde_json::json!({"kid": "enc", "use": "enc"})),
            jwk("other-rsa", serde_json::json!({"kid": "oaep", "alg": "RSA-OAEP"})),
            {"kty": "XYZ", "kid": "strange"},
        ]});
        let keys = parse_key_set(set.to_string().as_bytes()).expect("parses");
        let kids: Vec<_> = keys.iter().map(|k| k.kid.as_deref()).collect();
        assert_eq!(kids, [Some("r"), Some("e"), Some("d")]);
        assert_eq!(keys[0].algorithm, Some(Algorithm::RS256));
        assert_eq!(keys[1].algorithm, None);
    }

    #[test]
    fn a_document_without_keys_is_an_error() {
        assert!(parse_key_set(b"{\"issuer\": \"x\"}").is_err());
        assert!(parse_key_set(b"<html>").is_err());
    }
}
