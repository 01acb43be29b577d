//! Shared set-up of the relay-rpc tests: a gateway in this process in front of a shard reached over gRPC,
//! and official `ahp` clients connected to it over real WebSockets.

use std::sync::Arc;
use std::time::Duration;

use ahp::{Client, ClientConfig};
use relay_core::{Limits, Role};
use relay_gateway::auth::{mint_hs256, Claims, TokenVerifier};
use relay_gateway::quotas::{QuotaLimits, TenantQuotas};
use relay_gateway::GatewayState;
use relay_rpc::RemoteShard;

/// A gateway in this process whose link is a [`RemoteShard`] at `shard_url`, verifying tokens signed with
/// `secret` and admitting up to `max_connections` per tenant; returns its address.
pub async fn start_gateway(shard_url: &str, secret: &[u8], max_connections: usize) -> String {
    let limits = Limits::default();
    let link =
        Arc::new(RemoteShard::connect_lazy(shard_url, limits.bus_capacity, credential()).expect("shard url"));
    let (shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
    let app = relay_gateway::router(Arc::new(GatewayState {
        link,
        verifier: TokenVerifier::hs256(secret),
        clock: relay_gateway::clock::ConnectionClock::start(limits.ping_interval, shutdown.clone()),
        fanout: Default::default(),
        limits: Arc::new(limits),
        shutdown,
        quotas: TenantQuotas::new(QuotaLimits {
            max_connections,
            messages_per_second: 10_000.0,
            message_burst: 20_000.0,
            connection_messages_per_second: 10_000.0,
            connection_message_burst: 20_000.0,
            bytes_per_second: 1e9,
            byte_burst: 1e9,
        }),
        allowed_origins: Default::default(),
        web_sign_in: Default::default(),
        trusted_proxies: Default::default(),
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        let _keep = shutdown_tx;
        axum::serve(listener, app).await.expect("gateway");
    });
    addr
}

/// An `ahp` client of tenant `dev`'s default host on `gateway`, as member `subject` (not yet initialized).
pub async fn connect(gateway: &str, secret: &[u8], subject: &str, patience: Duration) -> Client {
    let token = mint_hs256(
        secret,
        &Claims::new("dev", subject, Role::Member, None, Duration::from_secs(3600)),
    )
    .expect("mint");
    let url = format!("ws://{gateway}/v1/ws?access_token={token}");
    let transport = ahp_ws::WebSocketTransport::connect(&url).await.expect("connect");
    Client::connect(
        transport,
        ClientConfig {
            default_request_timeout: Some(patience),
            subscription_buffer: 65_536,
        },
    )
    .await
    .expect("client")
}

/// The internal credential the in-process shards and gateways of these tests share.
pub fn credential() -> relay_rpc::InternalCredential {
    relay_rpc::InternalCredential::new(b"rpc-tests-internal-secret-32-bytes!").expect("valid secret")
}
