//! The internal credential: what a gateway proves to a shard on every gRPC call.
//!
//! A shard's gRPC port must only take calls from the deployment's gateways: anything else could attach as
//! any tenant, dispose sessions, or read a host's log with `FetchRange`. Every call carries
//! `authorization: Bearer <secret>` (a secret shared by the shards and gateways of one deployment,
//! `--internal-secret` / `--internal-secret-file`), added by [`InternalCredential`] on the client and checked
//! in constant time by [`CredentialCheck`] on the server before the call reaches the service: a call without
//! it, or with another, fails with UNAUTHENTICATED and changes nothing.
//!
//! Runners present a credential of their own (`--runner-secret`), which the shard accepts only on its
//! `Runners` service: a runner cannot call the client-facing `Shard` service, and a gateway cannot register
//! as a runner.
//!
//! Beyond the credential, the shard trusts the identity a gateway forwards (the gateway verified the
//! client's JWT), but never across tenants: `Attach` of an identity whose tenant is not the host's is
//! refused ([`crate::server`]).

use std::sync::Arc;

use subtle::ConstantTimeEq;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Shortest accepted internal secret, in bytes.
pub const MIN_SECRET_BYTES: usize = 32;

/// Why a secret cannot be used as the internal credential.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("the internal secret is {0} bytes; at least {MIN_SECRET_BYTES} are required")]
    TooShort(usize),
    #[error("the internal secret must be printable ASCII without spaces (e.g. `openssl rand -hex 32`)")]
    NotPrintable,
}

/// The deployment's internal secret, ready to send or to check.
#[derive(Clone)]
pub struct InternalCredential {
    /// `Bearer <secret>`, as sent.
    header: MetadataValue<Ascii>,
    secret: Arc<[u8]>,
}

impl std::fmt::Debug for InternalCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InternalCredential(…)")
    }
}

impl InternalCredential {
    pub fn new(secret: &[u8]) -> Result<Self, CredentialError> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(CredentialError::TooShort(secret.len()));
        }
        if !secret.iter().all(|b| b.is_ascii_graphic()) {
            return Err(CredentialError::NotPrintable);
        }
        let text = std::str::from_utf8(secret).map_err(|_| CredentialError::NotPrintable)?;
        let header =
            MetadataValue::try_from(format!("Bearer {text}")).map_err(|_| CredentialError::NotPrintable)?;
        Ok(Self {
            header,
            secret: Arc::from(secret),
        })
    }

    /// Whether `other` holds the same secret (a runner's secret must differ from the internal one).
    pub fn same_secret_as(&self, other: &InternalCredential) -> bool {
        self.secret.ct_eq(&other.secret).into()
    }

    /// The check a shard's server runs on every call.
    pub fn check(&self) -> CredentialCheck {
        CredentialCheck(self.clone())
    }

    fn accepts(&self, request_header: Option<&MetadataValue<Ascii>>) -> bool {
        let Some(presented) = request_header
            .map(MetadataValue::as_bytes)
            .and_then(|value| value.strip_prefix(b"Bearer "))
        else {
            return false;
        };
        presented.ct_eq(&self.secret).into()
    }
}

/// Client side: adds the credential to every call.
impl Interceptor for InternalCredential {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request
            .metadata_mut()
            .insert("authorization", self.header.clone());
        Ok(request)
    }
}

/// Server side: refuses every call that does not carry the credential.
#[derive(Clone)]
pub struct CredentialCheck(InternalCredential);

impl Interceptor for CredentialCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if self.0.accepts(request.metadata().get("authorization")) {
            Ok(request)
        } else {
            Err(Status::unauthenticated(
                "missing or wrong internal credential (--internal-secret)",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_secret_passes_the_check() {
        let secret = "a".repeat(32);
        let credential = InternalCredential::new(secret.as_bytes()).expect("valid");
        let mut sent = credential.clone();
        let request = sent.call(Request::new(())).expect("adds the header");
        assert!(credential.check().call(request).is_ok());
        assert!(credential.check().call(Request::new(())).is_err());
        let mut other = InternalCredential::new("b".repeat(32).as_bytes()).expect("valid");
        let request = other.call(Request::new(())).expect("adds the header");
        let refused = credential.check().call(request).expect_err("another secret");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn short_or_unprintable_secrets_are_refused() {
        assert!(InternalCredential::new(b"short").is_err());
        assert!(InternalCredential::new(format!("{} x", "a".repeat(32)).as_bytes()).is_err());
    }
}
