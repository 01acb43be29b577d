//! Shared set-up of the relay-rpc tests: a gateway in this process in front of a shard reached over gRPC.

use std::sync::Arc;

use relay_core::Limits;
use relay_gateway::auth::TokenVerifier;
use relay_gateway::quotas::{QuotaLimits, TenantQuotas};
use relay_gateway::GatewayState;
use relay_rpc::RemoteShard;

/// A gateway in this process whose link is a [`RemoteShard`] at `shard_url`, verifying tokens signed with
/// `secret` and admitting up to `max_connections` per tenant; returns its address.
pub async fn start_gateway(shard_url: &str, secret: &[u8], max_connections: usize) -> String {
    let limits = Limits::default();
    let link = Arc::new(RemoteShard::connect_lazy(shard_url, limits.bus_capacity).expect("shard url"));
    let (shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
    let app = relay_gateway::router(Arc::new(GatewayState {
        link,
        verifier: TokenVerifier::hs256(secret),
        limits,
        shutdown,
        quotas: TenantQuotas::new(QuotaLimits {
            max_connections,
            messages_per_second: 10_000.0,
            message_burst: 20_000.0,
        }),
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        let _keep = shutdown_tx;
        axum::serve(listener, app).await.expect("gateway");
    });
    addr
}
