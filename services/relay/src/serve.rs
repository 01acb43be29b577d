//! `ahp-relay serve`: the embedded relay — gateway, host logic and demo agent in one process.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use relay_core::{Limits, Role};
use relay_gateway::auth::{mint_hs256, Claims, TokenVerifier};
use relay_gateway::GatewayState;
use relay_runner::{DemoPace, DemoProvider, ProviderRegistry};
use relay_shard::ShardLink;

use crate::secret;

/// Arguments of `ahp-relay serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "AHP_RELAY_LISTEN", default_value = "127.0.0.1:7878")]
    pub listen: SocketAddr,
    /// Where the relay keeps its files (the JWT secret).
    #[arg(long, env = "AHP_RELAY_DATA_DIR", default_value = ".relay-data")]
    pub data_dir: PathBuf,
    /// HS256 secret for access tokens; default: generated once and kept in --data-dir.
    #[arg(long, env = "AHP_RELAY_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// Pause between the demo agent's streamed actions, in milliseconds.
    #[arg(long, env = "AHP_RELAY_DEMO_STEP_MS", default_value_t = 40)]
    pub demo_step_ms: u64,
    /// Envelopes per host kept in memory for exact reconnect replay.
    #[arg(long, env = "AHP_RELAY_REPLAY_BUFFER", default_value_t = 10_000)]
    pub replay_buffer: usize,
    /// How long a disconnected active client keeps its slot, in milliseconds.
    #[arg(long, env = "AHP_RELAY_ACTIVE_CLIENT_GRACE_MS", default_value_t = 30_000)]
    pub active_client_grace_ms: u64,
    /// Largest accepted WebSocket message, in bytes.
    #[arg(long, env = "AHP_RELAY_MAX_FRAME_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_frame_bytes: usize,
    /// Frames queued per connection before it is closed as a slow consumer.
    #[arg(long, env = "AHP_RELAY_OUTBOUND_QUEUE", default_value_t = 4096)]
    pub outbound_queue: usize,
}

impl ServeArgs {
    fn limits(&self) -> Limits {
        Limits {
            replay_buffer_envelopes: self.replay_buffer.max(1),
            active_client_grace: Duration::from_millis(self.active_client_grace_ms),
            max_frame_bytes: self.max_frame_bytes.max(1024),
            outbound_queue_frames: self.outbound_queue.max(16),
            ..Limits::default()
        }
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();

    let secret = secret::load_or_create(args.jwt_secret.as_deref(), &args.data_dir)?;
    let limits = args.limits();
    let providers = ProviderRegistry::new().with(Arc::new(DemoProvider::new(DemoPace {
        step: Duration::from_millis(args.demo_step_ms),
    })));
    let link = Arc::new(ShardLink::new(limits.clone(), providers));
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let app = relay_gateway::router(Arc::new(GatewayState {
        link,
        verifier: TokenVerifier::hs256(&secret),
        limits,
        shutdown: shutdown_rx,
    }));

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let dev_token = mint_hs256(
        &secret,
        &Claims::new(
            "dev",
            "dev-user",
            Role::Admin,
            None,
            Duration::from_secs(24 * 3600),
        ),
    )?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "ahp-relay {} listening on ws://{addr}/v1/ws",
            env!("CARGO_PKG_VERSION")
        )?;
        writeln!(
            out,
            "dev token (tenant dev, user dev-user, role admin, valid 24h):"
        )?;
        writeln!(out, "{dev_token}")?;
        writeln!(out, "try it: ahp-relay chat --url ws://{addr}/v1/ws")?;
        out.flush()?;
    }

    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            wait_for_signal().await;
            tracing::info!("shutting down: closing client connections");
            let _ = shutdown_tx.send(true);
        })
        .await
        .context("serving")?;
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
