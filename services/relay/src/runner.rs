//! `ahp-relay runner`: the process that runs a deployment's ACP agents, apart from the shards (agents execute
//! arbitrary code; the shard holds every tenant's state). It registers with every shard over gRPC
//! (`relay_rpc::runner`) and runs the sessions the shards place on it; on SIGTERM it stops every agent.
//!
//! Its HTTP endpoint (`--http-listen`) answers `GET /healthz` (the process is up) and `GET /readyz` (200 while
//! it is registered with at least one shard, 503 otherwise), for orchestrators.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use anyhow::Context;
use relay_runner::acp::{AcpProvider, AgentsFile};
use relay_runner::Provider;

/// Arguments of `ahp-relay runner`.
#[derive(clap::Args)]
pub struct RunnerArgs {
    /// The agents this runner can start (TOML; the same file the shards list them from).
    #[arg(long, env = "AHP_RELAY_AGENTS")]
    pub agents: PathBuf,
    /// The shards' gRPC endpoints, comma-separated (or the flag repeated): the runner serves them all.
    #[arg(
        long,
        env = "AHP_RELAY_SHARD_URL",
        default_value = "http://127.0.0.1:7879",
        value_delimiter = ','
    )]
    pub shard: Vec<String>,
    /// Dedicate this runner to these tenants (comma-separated): shards place only their sessions here, and
    /// theirs here first. Default: a shared runner, for any tenant without a dedicated one.
    #[arg(long, env = "AHP_RELAY_RUNNER_TENANTS", value_delimiter = ',')]
    pub tenants: Vec<String>,
    /// This runner's name in the shards' logs; default: the host name.
    #[arg(long, env = "AHP_RELAY_RUNNER_NAME")]
    pub name: Option<String>,
    /// Address of the HTTP endpoint serving /healthz and /readyz (port 0 picks a free port).
    #[arg(long, env = "AHP_RELAY_HTTP_LISTEN", default_value = "127.0.0.1:7881")]
    pub http_listen: SocketAddr,
    /// Largest file a client reads or writes in this runner's workspace (resourceRead/resourceWrite, bytes).
    #[arg(long, env = "AHP_RELAY_MAX_FILE_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_file_bytes: u64,
    /// A tenant's file server with nothing under way and no watch open stops after this long (e.g. 10m).
    #[arg(long, env = "AHP_RELAY_FILE_SERVER_IDLE", default_value = "10m", value_parser = crate::parse_ttl)]
    pub file_server_idle: std::time::Duration,
    #[command(flatten)]
    pub runner: crate::serve::RunnerSecretArgs,
    #[command(flatten)]
    pub tls: crate::serve::LinkTlsArgs,
    #[command(flatten)]
    pub sandbox: crate::agents::SandboxArgs,
}

/// `ahp-relay runner`.
pub async fn run(args: RunnerArgs) -> anyhow::Result<()> {
    let _observability = crate::observe::init("runner", &[])?;
    let file = AgentsFile::load(&args.agents)
        .with_context(|| format!("loading the agents file {}", args.agents.display()))?;
    let shards: Vec<String> = args
        .shard
        .iter()
        .map(|url| url.trim().to_string())
        .filter(|url| !url.is_empty())
        .collect();
    anyhow::ensure!(!shards.is_empty(), "--shard names no shard");
    let name = args.name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_string())
            .unwrap_or_else(|_| "runner".into())
    });
    let agents = file.agents.len();
    let mut ports = vec![(args.http_listen.port(), "this runner's HTTP port".to_string())];
    ports.extend(
        shards
            .iter()
            .filter_map(|url| crate::agents::url_port(url))
            .map(|port| (port, "a shard's gRPC port".to_string())),
    );
    let protected = crate::agents::Protected {
        paths: args
            .runner
            .runner_secret_file
            .iter()
            .cloned()
            .chain(args.tls.private_files())
            .collect(),
        ports,
    };
    let sandboxes = crate::agents::sandboxes(&file, &args.agents, &args.sandbox, protected).await?;
    let registrations = Arc::new(AtomicUsize::new(0));
    serve_http(args.http_listen, registrations.clone()).await?;
    // Tenants' files (resource*), served from a sandbox of each tenant by this program, for every shard.
    let program = std::env::current_exe().context("finding this program's path (it serves files)")?;
    let files: Arc<dyn relay_runner::files::FileAccess> = relay_runner::files::FileService::new(
        sandboxes.clone(),
        program,
        args.max_file_bytes,
        args.file_server_idle,
    );
    let shells = relay_runner::acp::KeptShells::default();
    let config = relay_rpc::runner::RunnerConfig {
        files: Some(files),
        tls: args.tls.load()?,
        registrations,
        tenants: args
            .tenants
            .iter()
            .map(|tenant| tenant.trim().to_string())
            .filter(|tenant| !tenant.is_empty())
            .collect(),
        name: format!("{name}/{}", std::process::id()),
        shards: shards.clone(),
        credential: args.runner.credential()?.context(
            "a runner secret is required: set AHP_RELAY_RUNNER_SECRET (or --runner-secret-file) to the value \
             the shards have",
        )?,
        // Devices' terminals are the process's: a registration that ends leaves them for the host's next owner.
        providers: Arc::new(move || {
            AcpProvider::from_file(&file, &sandboxes, &shells)
                .into_iter()
                .map(|agent| Arc::new(agent) as Arc<dyn Provider>)
                .collect()
        }),
    };
    println!(
        "ahp-relay {} runner serving {agents} agents for {}",
        env!("CARGO_PKG_VERSION"),
        shards.join(",")
    );
    tokio::select! {
        () = relay_rpc::runner::run(config) => {}
        () = crate::serve::wait_for_signal() => tracing::info!("shutting down: stopping every agent"),
    }
    // Returning drops the registrations and with them every agent (their process groups are killed).
    Ok(())
}

/// Bind the runner's HTTP endpoint, print `… runner http listening on http://ADDR`, and serve it in the
/// background.
async fn serve_http(listen: SocketAddr, registrations: Arc<AtomicUsize>) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(registrations);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "ahp-relay {} runner http listening on http://{addr}",
            env!("CARGO_PKG_VERSION")
        )?;
        out.flush()?;
    }
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "the runner's HTTP endpoint failed");
        }
    });
    Ok(())
}

async fn readyz(State(registrations): State<Arc<AtomicUsize>>) -> (StatusCode, &'static str) {
    match registrations.load(Ordering::SeqCst) {
        0 => (StatusCode::SERVICE_UNAVAILABLE, "not registered with any shard"),
        _ => (StatusCode::OK, "ready"),
    }
}
