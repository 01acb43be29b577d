//! The shard's HTTP endpoint (`--http-listen`), for orchestrators and Prometheus: `GET /healthz` (the process
//! is up), `GET /readyz` (its store answers and its gRPC server is serving; 503 otherwise, and from the moment
//! it starts draining), `GET /metrics` (the shard's Prometheus metrics, see `relay_core::telemetry`).
//!
//! Gateways and the embedded `serve` answer the same paths on their WebSocket listener (`relay_gateway`).

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use relay_core::link::HostLink;
use relay_shard::ShardLink;

/// Settings of the shard's HTTP endpoint.
#[derive(clap::Args)]
pub struct ShardHttpArgs {
    /// Address of the HTTP endpoint serving /healthz, /readyz and /metrics (port 0 picks a free port).
    #[arg(long, env = "AHP_RELAY_HTTP_LISTEN", default_value = "127.0.0.1:7880")]
    pub http_listen: SocketAddr,
}

/// What `/readyz` looks at.
struct ShardHealth {
    link: Arc<ShardLink>,
    /// Set while the gRPC server runs and has not started draining.
    grpc_serving: AtomicBool,
}

/// The gRPC server's state as `/readyz` sees it.
pub struct GrpcServing(Arc<ShardHealth>);

impl GrpcServing {
    /// Mark the gRPC server serving now, and draining once `shutdown` completes: pass the result as the gRPC
    /// server's shutdown signal.
    pub fn until(self, shutdown: impl Future<Output = ()>) -> impl Future<Output = ()> {
        self.0.grpc_serving.store(true, Ordering::SeqCst);
        async move {
            shutdown.await;
            self.0.grpc_serving.store(false, Ordering::SeqCst);
        }
    }
}

/// Bind the shard's HTTP endpoint, print `… http listening on http://ADDR`, and serve it in the background
/// for the rest of the process.
pub async fn serve_shard_http(args: &ShardHttpArgs, link: Arc<ShardLink>) -> anyhow::Result<GrpcServing> {
    let health = Arc::new(ShardHealth {
        link,
        grpc_serving: AtomicBool::new(false),
    });
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(health.clone());
    let listener = tokio::net::TcpListener::bind(args.http_listen)
        .await
        .with_context(|| format!("binding {}", args.http_listen))?;
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "ahp-relay {} shard http listening on http://{addr}",
            env!("CARGO_PKG_VERSION")
        )?;
        out.flush()?;
    }
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "the shard's HTTP endpoint failed");
        }
    });
    Ok(GrpcServing(health))
}

async fn readyz(State(health): State<Arc<ShardHealth>>) -> Response {
    if !health.grpc_serving.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "the gRPC server is not serving").into_response();
    }
    match health.link.ready().await {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why.to_string()).into_response(),
    }
}

async fn metrics(State(health): State<Arc<ShardHealth>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        health.link.metrics().await,
    )
        .into_response()
}
