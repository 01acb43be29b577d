//! The relay's processes: `serve` (the embedded relay — gateway, host logic and demo agent in one process),
//! and the two halves of the distributed deployment, `shard` (host logic behind gRPC) and `gateway`
//! (WebSockets and auth, calling a shard over gRPC). Given `--redis-url`, the shard also publishes every
//! host's bus to Redis and gateways follow hosts there, repairing lost messages from the shard.
//!
//! Rooms: [`args`] (the command lines) below [`edge_config`] (what they become: limits, the token verifier) below
//! this module (the processes). Nothing here holds protocol logic: it wires the crates together.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use relay_bus::RedisPublisher;
use relay_core::link::HostLink;
use relay_core::telemetry::Side;
use relay_core::{Limits, Role};
use relay_gateway::auth::{mint_hs256, Claims};
use relay_gateway::GatewayState;
use relay_runner::{DemoPace, DemoProvider, ProviderRegistry};
use relay_shard::ShardLink;

use crate::secret;

mod args;
mod edge_config;

pub use args::*;

/// Where a host's ACP agents run.
enum AgentPlacement {
    /// In this process (the embedded relay), in sandboxes, never reaching what `protected` names.
    InProcess {
        sandbox: crate::agents::SandboxArgs,
        protected: crate::agents::Protected,
    },
    /// On the `ahp-relay runner` processes registered in this pool (a shard).
    Runners(Arc<relay_rpc::RunnerPool>),
}

/// The demo agent's workspace under `data_dir` (`workspaces/`), sandboxed as agents' are, and the tenants'
/// file servers there; or why this machine cannot give it one.
async fn demo_workspace(
    data_dir: &std::path::Path,
    host: &HostArgs,
    sandbox: &crate::agents::SandboxArgs,
    protected: crate::agents::Protected,
) -> anyhow::Result<(
    relay_runner::DemoWorkspace,
    Arc<dyn relay_runner::files::FileAccess>,
)> {
    // The data directory stays its owner's alone (it holds the store and the signing secret).
    crate::secret::create_private_dir(data_dir)?;
    let root = std::path::absolute(data_dir.join("workspaces"))?;
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let root = root.canonicalize()?;
    // No agents file: this text stands for one (its path names it in errors, and is never shown to agents).
    let path = data_dir.join("demo-workspace.toml");
    let text = format!("workspace_root = {:?}\n", root.display().to_string());
    let file = relay_runner::acp::AgentsFile::parse(&path, &text)?;
    let sandboxes = crate::agents::sandboxes(&file, &path, sandbox, protected).await?;
    let program = std::env::current_exe().context("finding this program's path (it serves files)")?;
    let files: Arc<dyn relay_runner::files::FileAccess> =
        relay_runner::files::FileService::new(sandboxes, program, host.max_file_bytes, host.file_server_idle);
    Ok((
        relay_runner::DemoWorkspace {
            root,
            files: files.clone(),
        },
        files,
    ))
}

/// The host logic on its store, with the demo provider and the retention job.
async fn open_hosts(
    data: &DataArgs,
    host: &HostArgs,
    limits: Limits,
    redis: Option<RedisPublisher>,
    ownership: Option<relay_shard::ownership::Ownership>,
    placement: AgentPlacement,
) -> anyhow::Result<Arc<ShardLink>> {
    let mut demo = DemoProvider::new(DemoPace {
        step: Duration::from_millis(host.demo_step_ms),
    });
    let mut demo_files = None;
    if let (None, true, AgentPlacement::InProcess { sandbox, protected }) =
        (&host.agents, host.demo_workspace, &placement)
    {
        if sandbox.unsafe_no_sandbox {
            tracing::warn!("--unsafe-no-sandbox: the demo agent gets no workspace (its file server would run unconfined)");
        } else {
            match demo_workspace(&data.data_dir, host, sandbox, protected.clone()).await {
                Ok((workspace, files)) => {
                    tracing::info!(root = %workspace.root.display(), "the demo agent works in a workspace under the data directory");
                    demo = demo.with_workspace(workspace);
                    demo_files = Some(files);
                }
                Err(error) => tracing::warn!(
                    "the demo agent runs without a workspace (no Files, Changes or Terminal panes): {error:#}"
                ),
            }
        }
    }
    let mut providers = ProviderRegistry::new().with(Arc::new(demo));
    if let Some(files) = demo_files {
        providers = providers.with_files(files);
    }
    if let Some(path) = &host.agents {
        let file = relay_runner::acp::AgentsFile::load(path)?;
        match placement {
            AgentPlacement::InProcess { sandbox, protected } => {
                let sandboxes = crate::agents::sandboxes(&file, path, &sandbox, protected).await?;
                for agent in relay_runner::acp::AcpProvider::from_file(
                    &file,
                    &sandboxes,
                    &relay_runner::acp::KeptShells::default(),
                ) {
                    providers = providers.with(Arc::new(agent));
                }
                // Tenants' files (resource*), served from a sandbox of each tenant by this program.
                let program =
                    std::env::current_exe().context("finding this program's path (it serves files)")?;
                providers = providers.with_files(relay_runner::files::FileService::new(
                    sandboxes.clone(),
                    program,
                    host.max_file_bytes,
                    host.file_server_idle,
                ));
            }
            AgentPlacement::Runners(pool) => {
                for agent in &file.agents {
                    let info = relay_runner::acp::agent_info(agent);
                    providers = providers.with(Arc::new(relay_rpc::RemoteAgent::new(info, pool.clone())));
                }
                // Tenants' files are on the runners: asked through them.
                providers = providers.with_files(relay_rpc::remote_files::RemoteFiles::new(pool.clone()));
            }
        }
        tracing::info!(agents = file.agents.len(), path = %path.display(), "ACP agents configured");
    }
    let store = open_store(host.database_url.as_deref(), &data.data_dir).await?;
    let quota = (host.max_stored_bytes_per_tenant > 0).then(|| {
        relay_shard::storage::StorageQuota::start(
            store.clone(),
            host.max_stored_bytes_per_tenant,
            host.storage_check_every,
        )
    });
    let mut link = ShardLink::new(limits, providers, store, redis);
    if let Some(quota) = quota {
        link = link.with_storage_quota(quota);
    }
    if let Some(ownership) = ownership {
        link = link.with_ownership(ownership);
    }
    let link = Arc::new(link);
    link.keep_leases();
    link.evict_idle_hosts();
    spawn_retention(link.clone(), host.compact_every);
    Ok(link)
}

/// Commit whatever agents produced after the last reply before the process exits.
async fn flush(link: &ShardLink) {
    if tokio::time::timeout(Duration::from_secs(10), link.flush_all())
        .await
        .is_err()
    {
        tracing::warn!("the store did not take the last batches within 10s");
    }
}

/// `ahp-relay serve`.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let _observability = crate::observe::init("serve", &[Side::Gateway, Side::Shard])?;
    let limits = args.edge.apply(args.host.apply(Limits::default()));
    let mut ports = vec![(args.edge.listen.port(), "this relay's own port".to_string())];
    if let Some(port) = args
        .host
        .database_url
        .as_deref()
        .and_then(crate::agents::url_port)
    {
        ports.push((port, "the store's (Postgres) port".into()));
    }
    let protected = crate::agents::Protected {
        paths: [
            Some(args.data.data_dir.clone()),
            args.edge.jwt_secret_file.clone(),
        ]
        .into_iter()
        .flatten()
        .collect(),
        ports,
    };
    let link = open_hosts(
        &args.data,
        &args.host,
        limits.clone(),
        None,
        None,
        AgentPlacement::InProcess {
            sandbox: args.sandbox.clone(),
            protected,
        },
    )
    .await?;
    let dev_token = if args.no_dev_token {
        DevToken::Omitted
    } else {
        DevToken::Print
    };
    serve_edge(&args.data, &args.edge, limits, link.clone(), dev_token, None).await?;
    flush(&link).await;
    Ok(())
}

/// `ahp-relay shard`.
pub async fn run_shard(args: ShardArgs) -> anyhow::Result<()> {
    let _observability = crate::observe::init("shard", &[Side::Shard])?;
    let limits = args.host.apply(Limits::default());
    let credential = args.internal.credential()?;
    let runner_credential = args.runner.credential()?;
    if let Some(runner) = &runner_credential {
        anyhow::ensure!(
            !runner.same_secret_as(&credential),
            "the runner secret must differ from the internal secret: runners must not be able to call what \
             gateways call"
        );
    }
    if args.host.agents.is_some() && runner_credential.is_none() {
        anyhow::bail!(
            "--agents places sessions on runners, which register with the runner secret: set \
             AHP_RELAY_RUNNER_SECRET (or --runner-secret-file) on the shards and the runners"
        );
    }
    // The publisher's connection is driven by the runtime it is opened on: the commit threads', beside the
    // commits whose batches it publishes.
    let redis = match args.redis_url.clone() {
        Some(url) => Some(
            relay_shard::commit_thread::run_on_pool(async move { RedisPublisher::connect(&url).await })
                .await
                .context("the commit thread stopped")?
                .context("connecting to Redis")?,
        ),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(args.grpc_listen)
        .await
        .with_context(|| format!("binding {}", args.grpc_listen))?;
    let addr = listener.local_addr()?;
    let tls = args.tls.load()?;
    let assertions = match &args.identity_verifying_key {
        Some(path) => {
            let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            Some(Arc::new(
                relay_rpc::AssertionVerifier::from_pem(&pem)
                    .with_context(|| format!("loading {}", path.display()))?,
            ))
        }
        None if args.insecure_internal_link => {
            tracing::warn!(
                "--insecure-internal-link: this shard takes the identity a holder of the internal secret names"
            );
            None
        }
        None => anyhow::bail!(
            "no --identity-verifying-key: a shard acts for a tenant's user only on what the gateways signed. Give \
             it the gateways' public key (AHP_RELAY_IDENTITY_VERIFYING_KEY; the gateways take the private key as \
             --identity-signing-key), or pass --insecure-internal-link to let any holder of the internal secret \
             name the tenant (a trusted network, or tests)"
        ),
    };
    let scheme = if tls.identity.is_some() { "https" } else { "http" };
    let advertise = args
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{addr}"));
    let ownership = relay_shard::ownership::Ownership::new(&advertise, args.lease_ttl);
    let runners = relay_rpc::RunnerPool::new();
    let link = open_hosts(
        &args.data,
        &args.host,
        limits,
        redis,
        Some(ownership),
        AgentPlacement::Runners(runners.clone()),
    )
    .await?;
    let grpc_serving = crate::ops::serve_shard_http(&args.http, link.clone()).await?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "ahp-relay {} shard listening on grpc {scheme}://{addr}",
            env!("CARGO_PKG_VERSION")
        )?;
        out.flush()?;
    }
    let shutdown = grpc_serving.until(wait_for_signal());
    let draining = link.clone();
    let runners_closing = runners.clone();
    relay_rpc::serve_secured(
        listener,
        link.clone(),
        runners,
        &credential,
        runner_credential.as_ref(),
        relay_rpc::ShardSecurity { tls, assertions },
        async move {
            shutdown.await;
            // Runners stop the agents they ran for this shard; their sessions go with the hosts to the next one.
            runners_closing.close();
            tracing::info!("shutting down: committing, releasing host leases");
            // Commits what is queued, closes every host's bus (gateways move their clients) and releases the
            // leases; the gRPC server then finishes the calls in flight.
            if tokio::time::timeout(Duration::from_secs(10), draining.drain())
                .await
                .is_err()
            {
                tracing::warn!("draining did not finish within 10s; unreleased leases will lapse");
            }
        },
    )
    .await?;
    Ok(())
}

/// `ahp-relay gateway`.
pub async fn run_gateway(args: GatewayArgs) -> anyhow::Result<()> {
    let _observability = crate::observe::init("gateway", &[Side::Gateway])?;
    let limits = args.edge.apply(Limits::default());
    let shards: Vec<String> = args
        .shard
        .iter()
        .map(|url| url.trim().to_string())
        .filter(|url| !url.is_empty())
        .collect();
    anyhow::ensure!(!shards.is_empty(), "--shard names no shard");
    let link = Arc::new(relay_rpc::ShardRouter::new(
        &shards,
        limits.bus_capacity,
        args.redis_url.as_deref(),
        args.internal.credential()?,
        args.tls.load()?,
        match &args.identity_signing_key {
            Some(path) => Some(Arc::new(
                relay_rpc::AssertionSigner::from_pem(&secret::read_private(path)?)
                    .with_context(|| format!("loading {}", path.display()))?,
            )),
            None => None,
        },
    )?);
    // Gateways sharing a Redis hold each tenant to its quotas together.
    serve_edge(
        &args.data,
        &args.edge,
        limits,
        link,
        DevToken::Silent,
        args.redis_url.as_deref(),
    )
    .await
}

/// Whether the edge prints a ready dev token at start: only the embedded relay, for its own local use, unless
/// told not to (`--no-dev-token`, as in the container image). A gateway never does (its output lands in a
/// deployment's logs).
#[derive(Clone, Copy, PartialEq, Eq)]
enum DevToken {
    Print,
    /// `serve --no-dev-token`: says how to mint one instead.
    Omitted,
    Silent,
}

/// The WebSocket side: auth, quotas, delivery, until SIGTERM / Ctrl-C closes every connection with 1012.
async fn serve_edge<L: HostLink>(
    data: &DataArgs,
    edge: &EdgeArgs,
    limits: Limits,
    link: Arc<L>,
    dev_token: DevToken,
    shared_quotas_redis: Option<&str>,
) -> anyhow::Result<()> {
    let secret = secret::load_or_create(secret::SecretSource {
        explicit: edge.jwt_secret.as_deref(),
        file: edge.jwt_secret_file.as_deref(),
        data_dir: &data.data_dir,
    })?;
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let quotas = relay_gateway::quotas::TenantQuotas::new(relay_gateway::quotas::QuotaLimits {
        max_connections: edge.max_connections_per_tenant.max(1),
        messages_per_second: edge.messages_per_second_per_tenant.max(1.0),
        message_burst: (edge.messages_per_second_per_tenant * 2.0).max(1.0),
        connection_messages_per_second: edge.messages_per_second_per_connection.max(1.0),
        connection_message_burst: (edge.messages_per_second_per_connection * 2.0).max(1.0),
        bytes_per_second: edge.bytes_per_second_per_tenant.max(1024.0),
        byte_burst: (edge.bytes_per_second_per_tenant * 2.0).max(edge.max_frame_bytes as f64),
    });
    if let Some(url) = shared_quotas_redis {
        quotas.share_through_redis(url.to_string()).await;
    }
    let verifier = edge.verifier(&secret).await?;
    let app = relay_gateway::router(Arc::new(GatewayState {
        link,
        verifier,
        clock: relay_gateway::clock::ConnectionClock::start(limits.ping_interval, shutdown_rx.clone()),
        fanout: Default::default(),
        limits: Arc::new(limits),
        shutdown: shutdown_rx,
        quotas: quotas.clone(),
        allowed_origins: relay_gateway::origin::AllowedOrigins::new(&edge.allowed_origins),
        web_sign_in: relay_gateway::sign_in::WebSignIn {
            sign_in_url: edge.sign_in_url.clone(),
        },
        trusted_proxies: relay_gateway::auth_throttle::TrustedProxies::parse(&edge.trusted_proxies)
            .context("--trusted-proxies")?,
    }));
    let listener = tokio::net::TcpListener::bind(edge.listen)
        .await
        .with_context(|| format!("binding {}", edge.listen))?;
    let addr = listener.local_addr()?;
    // Frames are small and latency matters more than packing: no Nagle delay on client sockets.
    let listener = axum::serve::ListenerExt::tap_io(listener, |stream: &mut tokio::net::TcpStream| {
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
    });
    let stop = stop_signal();
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "ahp-relay {} listening on ws://{addr}/v1/ws",
            env!("CARGO_PKG_VERSION")
        )?;
        if dev_token == DevToken::Print {
            let token = mint_hs256(
                &secret,
                &Claims::new(
                    "dev",
                    "dev-user",
                    Role::Admin,
                    None,
                    Duration::from_secs(24 * 3600),
                ),
            )?;
            writeln!(
                out,
                "dev token (tenant dev, user dev-user, role admin, valid 24h):"
            )?;
            writeln!(out, "{token}")?;
            // The token travels in the fragment: browsers never send it to the server, log it or put it in
            // a Referer.
            let page = if addr.ip().is_unspecified() {
                SocketAddr::from(([127, 0, 0, 1], addr.port()))
            } else {
                addr
            };
            writeln!(out, "open the web client: http://{page}/#token={token}")?;
            writeln!(out, "try it: ahp-relay chat --url ws://{addr}/v1/ws")?;
        } else if dev_token == DevToken::Omitted {
            writeln!(
                out,
                "no token printed: mint one with `ahp-relay token --tenant TENANT --sub USER --role admin` (same \
                 --data-dir or --jwt-secret-file)"
            )?;
        }
        out.flush()?;
    }

    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async move {
            stop.await;
            tracing::info!("shutting down: closing client connections");
            let _ = shutdown_tx.send(true);
        })
        .await
        .context("serving")?;
    // Upgraded WebSockets outlive the HTTP server: let each finish sending its close frame before exiting.
    if tokio::time::timeout(Duration::from_secs(5), quotas.wait_idle())
        .await
        .is_err()
    {
        tracing::warn!("some connections did not close within 5s");
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

pub async fn wait_for_signal() {
    stop_signal().await
}

/// SIGTERM or Ctrl-C, listened for from this call on (not from the first poll): a process told to stop while
/// it starts, once it has said it listens, drains instead of dying at SIGTERM's default action.
pub fn stop_signal() -> impl std::future::Future<Output = ()> + Send {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    async move {
        #[cfg(unix)]
        {
            let mut term = match term {
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
}
