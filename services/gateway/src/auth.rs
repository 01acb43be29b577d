//! Tenant authentication: JSON Web Tokens checked at the WebSocket upgrade.
//!
//! Claims are `sub` (user), `tid` (tenant), `role` (`viewer` | `member` | `admin`), optional `hosts` (host
//! names the token may open) and `exp`. The token arrives as `Authorization: Bearer …` or, for browsers,
//! `?access_token=…`. Without an identity provider the relay signs with an HS256 secret (the same secret mints
//! tokens: development, `ahp-relay token`); with one ([`crate::oidc`]) only the provider's tokens are
//! accepted.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};

pub use crate::claims::{AuthError, Claims};

/// Checks tokens; built once from configuration.
#[derive(Clone)]
pub struct TokenVerifier {
    scheme: Scheme,
}

#[derive(Clone)]
enum Scheme {
    Hs256(Box<(DecodingKey, Validation)>),
    Provider(std::sync::Arc<crate::oidc::IdentityProvider>),
}

impl TokenVerifier {
    /// An HS256 verifier for `secret`.
    pub fn hs256(secret: &[u8]) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 5;
        // A token is not valid before its `nbf` (when it has one), within the same leeway.
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Self {
            scheme: Scheme::Hs256(Box::new((DecodingKey::from_secret(secret), validation))),
        }
    }

    /// A verifier of an identity provider's tokens (and no others).
    pub fn provider(provider: crate::oidc::IdentityProvider) -> Self {
        Self {
            scheme: Scheme::Provider(std::sync::Arc::new(provider)),
        }
    }

    /// The claims of `token`, or why it is refused. With a JWKS, a token naming an unknown `kid` may wait
    /// for one (rate-limited, time-bounded) fetch of the key set.
    pub async fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        let (key, validation) = match &self.scheme {
            Scheme::Provider(provider) => return provider.verify(token).await,
            Scheme::Hs256(hs256) => (&hs256.0, &hs256.1),
        };
        let data = jsonwebtoken::decode::<Claims>(token, key, validation)?;
        let claims = data.claims;
        if claims.sub.is_empty() {
            return Err(AuthError::Claims("sub is empty"));
        }
        if claims.tid.is_empty() {
            return Err(AuthError::Claims("tid is empty"));
        }
        Ok(claims)
    }
}

/// Signs tokens with an HS256 secret (the embedded relay's dev tokens, `ahp-relay token`, tests).
pub fn mint_hs256(secret: &[u8], claims: &Claims) -> Result<String, AuthError> {
    Ok(jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_core::Role;
    use std::time::Duration;

    impl TokenVerifier {
        fn verify_now(&self, token: &str) -> Result<Claims, AuthError> {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime")
                .block_on(self.verify(token))
        }
    }

    #[test]
    fn minted_token_verifies_and_carries_its_claims() {
        let claims = Claims::new(
            "acme",
            "ana",
            Role::Member,
            Some(vec!["default".into()]),
            Duration::from_secs(60),
        );
        let token = mint_hs256(b"secret", &claims).expect("mint");
        let back = TokenVerifier::hs256(b"secret")
            .verify_now(&token)
            .expect("verify");
        assert_eq!(back, claims);
        assert!(back.allows_host("default"));
        assert!(!back.allows_host("other"));
    }

    #[test]
    fn wrong_secret_and_expired_tokens_are_refused() {
        let claims = Claims::new("acme", "ana", Role::Admin, None, Duration::from_secs(60));
        let token = mint_hs256(b"secret", &claims).expect("mint");
        assert!(TokenVerifier::hs256(b"other").verify_now(&token).is_err());
        let mut old = claims;
        old.exp = 1_000;
        let token = mint_hs256(b"secret", &old).expect("mint");
        assert!(TokenVerifier::hs256(b"secret").verify_now(&token).is_err());
    }

    #[test]
    fn tokens_are_refused_before_their_nbf() {
        let mut early = Claims::new("acme", "ana", Role::Member, None, Duration::from_secs(3600));
        early.nbf = Some(early.iat + 600);
        let token = mint_hs256(b"secret", &early).expect("mint");
        assert!(TokenVerifier::hs256(b"secret").verify_now(&token).is_err());
        early.nbf = Some(early.iat);
        let token = mint_hs256(b"secret", &early).expect("mint");
        assert!(TokenVerifier::hs256(b"secret").verify_now(&token).is_ok());
    }
}
