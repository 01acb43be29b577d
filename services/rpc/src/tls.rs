//! TLS on the internal gRPC link (gateway → shard, runner → shard), with rustls through tonic: the shard's
//! certificate and key, and — for mutual TLS — the CA its callers' certificates must chain to; a caller's CA
//! to trust for the shard's certificate and — for mutual TLS — its own certificate and key. All PEM.
//!
//! Without any of it the link is plaintext (loopback, or a network the operator trusts); the internal secret
//! is then its only protection, so a deployment across machines should set it (see `THREAT_MODEL.md`).

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// Why a TLS setting cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("internal TLS: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("internal TLS: {url} is not an https:// URL, but a CA to trust for the shard is configured")]
    PlaintextUrl { url: String },
    #[error(
        "internal TLS: {url} is an https:// URL: name the CA its certificate chains to (--internal-tls-ca)"
    )]
    NoCa { url: String },
}

/// The TLS settings of one side of the internal link (empty: plaintext).
#[derive(Clone, Default)]
pub struct LinkTls {
    /// This side's certificate chain and key, PEM: the shard's server identity, or a caller's client identity
    /// for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// A CA certificate, PEM. On the shard: callers must present a certificate it signed (mutual TLS). On a
    /// caller: the shard's certificate must chain to it.
    pub ca: Option<Vec<u8>>,
}

impl LinkTls {
    /// Whether anything is configured.
    pub fn is_enabled(&self) -> bool {
        self.identity.is_some() || self.ca.is_some()
    }

    /// The shard's server configuration: `None` without a server identity (plaintext).
    pub fn server_config(&self) -> Option<ServerTlsConfig> {
        let (cert, key) = self.identity.as_ref()?;
        let mut config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
        if let Some(ca) = &self.ca {
            config = config.client_ca_root(Certificate::from_pem(ca));
        }
        Some(config)
    }

    /// `endpoint` (to `url`) set up to call over TLS when `url` is `https://` (trusting the configured CA,
    /// which it needs, and presenting the client identity if any). An `http://` URL with a CA configured is
    /// refused: the operator asked for TLS.
    pub fn apply(&self, url: &str, endpoint: Endpoint) -> Result<Endpoint, TlsError> {
        if !url.starts_with("https://") {
            if self.ca.is_some() {
                return Err(TlsError::PlaintextUrl { url: url.to_string() });
            }
            return Ok(endpoint);
        }
        let Some(ca) = &self.ca else {
            return Err(TlsError::NoCa { url: url.to_string() });
        };
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        Ok(endpoint.tls_config(config)?)
    }
}
