//! What the arguments become: a host's limits, a gateway's limits, and the token verifier (HS256 secret, or
//! JWKS and OIDC issuers).

use std::time::Duration;

use anyhow::Context;
use relay_core::Limits;
use relay_gateway::auth::TokenVerifier;

use super::args::*;

impl HostArgs {
    pub(crate) fn apply(&self, limits: Limits) -> Limits {
        Limits {
            replay_buffer_envelopes: self.replay_buffer.max(1),
            active_client_grace: Duration::from_millis(self.active_client_grace_ms),
            snapshot_every_actions: self.snapshot_every_actions.max(1),
            snapshot_every: self.snapshot_every,
            retention: self.retention,
            retained_turns: self.retained_turns.max(1),
            retained_turn_bytes: self.retained_turn_bytes.max(1),
            max_turns_per_chat: self.max_turns_per_chat.max(1),
            fetch_turns_page: self.fetch_turns_page.max(1),
            max_hosts_per_tenant: self.max_hosts_per_tenant.max(1),
            max_sessions_per_host: self.max_sessions_per_host.max(1),
            max_chats_per_session: self.max_chats_per_session.max(1),
            max_subscriptions_per_connection: self.max_subscriptions_per_connection.max(1),
            // Never before a disconnected client's grace ends: its expiry must still reach the host.
            idle_host_after: self
                .idle_host_timeout
                .max(Duration::from_millis(self.active_client_grace_ms) + Duration::from_secs(1)),
            max_reply_bytes: self.max_reply_bytes.max(64 * 1024),
            replay_buffer_bytes: self.replay_buffer_bytes,
            device_terminals: self.device_terminals,
            content_ref_bytes: self.content_ref_bytes.max(256),
            ..limits
        }
    }
}

impl EdgeArgs {
    /// How tokens are checked: the identity provider's keys when configured, else the HS256 secret.
    pub(crate) async fn verifier(&self, secret: &[u8]) -> anyhow::Result<TokenVerifier> {
        if self.jwt_public_key_file.is_empty() && self.jwks_url.is_none() {
            return Ok(TokenVerifier::hs256(secret));
        }
        anyhow::ensure!(
            self.jwt_public_key_file.is_empty() || self.jwks_url.is_none(),
            "give the identity provider's keys as --jwt-public-key-file or --jwks-url, not both"
        );
        // Without both, a token the provider issued for another application (or another issuer using the same
        // keys, e.g. a multi-tenant provider) would be accepted here.
        anyhow::ensure!(
            self.jwt_issuer.as_deref().is_some_and(|issuer| !issuer.trim().is_empty())
                && self.jwt_audience.iter().any(|audience| !audience.trim().is_empty()),
            "an identity provider needs --jwt-issuer and --jwt-audience (its tokens' `iss` and an `aud` meant for \
             this relay): without them tokens issued for other applications would be accepted"
        );
        let algorithms = self
            .jwt_algorithms
            .iter()
            .map(|name| {
                name.trim()
                    .parse::<relay_gateway::oidc::Algorithm>()
                    .with_context(|| format!("unknown JWT algorithm {name}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let settings = relay_gateway::oidc::ProviderSettings {
            algorithms,
            issuer: self.jwt_issuer.clone(),
            audience: self.jwt_audience.clone(),
            leeway_seconds: self.jwt_leeway.as_secs(),
            claims: relay_gateway::oidc::ClaimNames {
                tenant: self.jwt_claim_tenant.clone(),
                role: self.jwt_claim_role.clone(),
                hosts: self.jwt_claim_hosts.clone(),
            },
        };
        let provider = match &self.jwks_url {
            Some(url) => {
                let jwks = relay_gateway::jwks::JwksKeys::start(relay_gateway::jwks::JwksSettings {
                    url: url.clone(),
                    refresh_every: self.jwks_refresh.max(Duration::from_secs(1)),
                    min_refetch: self.jwks_min_refetch,
                    timeout: self.jwks_timeout.max(Duration::from_millis(100)),
                })
                .await?;
                tracing::info!(url, "tokens checked with the identity provider's JWKS");
                relay_gateway::oidc::IdentityProvider::from_jwks(jwks, settings)?
            }
            None => {
                tracing::info!(
                    keys = self.jwt_public_key_file.len(),
                    "tokens checked with the identity provider's keys"
                );
                relay_gateway::oidc::IdentityProvider::from_pem_files(&self.jwt_public_key_file, settings)?
            }
        };
        Ok(TokenVerifier::provider(provider))
    }

    pub(crate) fn apply(&self, limits: Limits) -> Limits {
        Limits {
            ping_interval: self.ping_interval.max(Duration::from_millis(10)),
            idle_timeout: self.idle_timeout.max(Duration::from_millis(10)),
            call_timeout: self.call_timeout.max(Duration::from_millis(10)),
            max_frame_bytes: self.max_frame_bytes.max(1024),
            max_json_depth: self.max_json_depth.clamp(8, 64),
            outbound_queue_frames: self.outbound_queue.max(16),
            outbound_queue_bytes: self.outbound_queue_bytes.max(64 * 1024),
            ..limits
        }
    }
}
