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
    /// Postgres URL (postgres://…) for the distributed store; default: SQLite in --data-dir.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
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
    /// Store a channel's snapshot after this many actions (or after --snapshot-every).
    #[arg(long, env = "AHP_RELAY_SNAPSHOT_EVERY_ACTIONS", default_value_t = 500)]
    pub snapshot_every_actions: u32,
    /// Store a channel's snapshot when an action arrives this long after its last one (e.g. 60s).
    #[arg(long, env = "AHP_RELAY_SNAPSHOT_EVERY", default_value = "60s", value_parser = crate::parse_ttl)]
    pub snapshot_every: Duration,
    /// How long the action log is kept: the resume window (e.g. 7d). Older rows are compacted into snapshots.
    #[arg(long, env = "AHP_RELAY_RETENTION", default_value = "7d", value_parser = crate::parse_ttl)]
    pub retention: Duration,
    /// Open WebSocket connections one tenant may have (more are refused with HTTP 429).
    #[arg(long, env = "AHP_RELAY_MAX_CONNECTIONS_PER_TENANT", default_value_t = 10_000)]
    pub max_connections_per_tenant: usize,
    /// Inbound messages per second per tenant (bursts of twice that); faster senders are slowed down.
    #[arg(
        long,
        env = "AHP_RELAY_MESSAGES_PER_SECOND_PER_TENANT",
        default_value_t = 50_000.0
    )]
    pub messages_per_second_per_tenant: f64,
    /// Turns of a chat kept in memory when it is restored; older ones are paged in from the store.
    #[arg(long, env = "AHP_RELAY_RETAINED_TURNS", default_value_t = 200)]
    pub retained_turns: usize,
    /// How often the retention job runs (e.g. 1h).
    #[arg(long, env = "AHP_RELAY_COMPACT_EVERY", default_value = "1h", value_parser = crate::parse_ttl)]
    pub compact_every: Duration,
}

/// Where the relay keeps its state.
#[derive(clap::Args)]
pub struct StoreArgs {
    /// Postgres URL (postgres://…); default: SQLite in --data-dir.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    #[arg(long, env = "AHP_RELAY_DATA_DIR", default_value = ".relay-data")]
    pub data_dir: PathBuf,
}

/// The store URL: the given database, or the SQLite file in the data dir.
pub fn store_url(database_url: Option<&str>, data_dir: &std::path::Path) -> anyhow::Result<String> {
    if let Some(url) = database_url {
        return Ok(url.to_string());
    }
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    Ok(format!("sqlite://{}", data_dir.join("relay.sqlite").display()))
}

/// Connect to the store and bring its schema up to date.
pub async fn open_store(
    database_url: Option<&str>,
    data_dir: &std::path::Path,
) -> anyhow::Result<relay_store::Store> {
    let url = store_url(database_url, data_dir)?;
    let store = relay_store::Store::connect(&url)
        .await
        .context("connecting to the store")?;
    store.migrate().await.context("running migrations")?;
    Ok(store)
}

impl ServeArgs {
    fn limits(&self) -> Limits {
        Limits {
            replay_buffer_envelopes: self.replay_buffer.max(1),
            active_client_grace: Duration::from_millis(self.active_client_grace_ms),
            max_frame_bytes: self.max_frame_bytes.max(1024),
            outbound_queue_frames: self.outbound_queue.max(16),
            snapshot_every_actions: self.snapshot_every_actions.max(1),
            snapshot_every: self.snapshot_every,
            retention: self.retention,
            retained_turns: self.retained_turns.max(1),
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
    let store = open_store(args.database_url.as_deref(), &args.data_dir).await?;
    let link = Arc::new(ShardLink::new(limits.clone(), providers, store));
    spawn_retention(link.clone(), args.compact_every);
    let serving_link = link.clone();
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let app = relay_gateway::router(Arc::new(GatewayState {
        link: serving_link,
        verifier: TokenVerifier::hs256(&secret),
        limits,
        shutdown: shutdown_rx,
        quotas: relay_gateway::quotas::TenantQuotas::new(relay_gateway::quotas::QuotaLimits {
            max_connections: args.max_connections_per_tenant.max(1),
            messages_per_second: args.messages_per_second_per_tenant.max(1.0),
            message_burst: (args.messages_per_second_per_tenant * 2.0).max(1.0),
        }),
    }));

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    // Frames are small and latency matters more than packing: no Nagle delay on client sockets.
    let listener = axum::serve::ListenerExt::tap_io(listener, |stream: &mut tokio::net::TcpStream| {
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
    });
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
    // Whatever agents produced after the last reply is committed before the process exits.
    if tokio::time::timeout(Duration::from_secs(10), link.flush_all())
        .await
        .is_err()
    {
        tracing::warn!("the store did not take the last batches within 10s");
    }
    Ok(())
}

/// The retention job: compacts old log rows into snapshots on a fixed period.
fn spawn_retention(link: Arc<ShardLink>, every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_secs(1)));
        loop {
            tick.tick().await;
            match link.compact().await {
                Ok(0) => {}
                Ok(rows) => tracing::info!(rows, "compacted old action log rows"),
                Err(error) => tracing::warn!(%error, "retention job failed"),
            }
        }
    });
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
