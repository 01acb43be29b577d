//! `ahp-relay`: the embedded relay (`serve`), token minting (`token`) and a terminal client (`chat`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

mod agents;
mod allocator;
mod chat;
mod identity_keys;
mod internal_tls;
mod observe;
mod ops;
mod runner;
mod secret;
mod serve;

#[derive(Parser)]
#[command(name = "ahp-relay", version, about = "Multi-tenant Agent Host Protocol relay")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole relay (gateway, host logic, demo agent) in one process.
    Serve(serve::ServeArgs),
    /// Run the host logic (sequencing, reducers, store, agents) behind an internal gRPC endpoint.
    Shard(serve::ShardArgs),
    /// Run a gateway (WebSockets, auth, fan-out) that forwards to a shard over gRPC.
    Gateway(serve::GatewayArgs),
    /// Run the ACP agents of a distributed deployment, for the shards that place sessions here.
    Runner(runner::RunnerArgs),
    /// Mint an access token signed with the relay's secret.
    Token(TokenArgs),
    /// A terminal client: create or join a session, prompt the agent, approve tool calls.
    Chat(chat::ChatArgs),
    /// Create or update the store's schema, then exit.
    Migrate(serve::StoreArgs),
    /// Run the retention job once: compact action log rows older than --retention into snapshots.
    Compact(CompactArgs),
    /// Make the identity-assertion key pair (Ed25519) in a directory, unless it is there already: `identity.pem`
    /// for the gateways (--identity-signing-key), `identity.pub.pem` for the shards (--identity-verifying-key).
    IdentityKeys(identity_keys::IdentityKeysArgs),
    /// Make a private CA and the shards' server certificate for TLS on the internal link (`tls.crt`, `tls.key`
    /// for the shards; `ca.crt` for gateways and runners), unless they are there already.
    InternalTls(internal_tls::InternalTlsArgs),
}

#[derive(clap::Args)]
struct CompactArgs {
    #[command(flatten)]
    store: serve::StoreArgs,
    /// Keep log rows younger than this (e.g. 7d; 0s compacts everything a snapshot covers).
    #[arg(long, env = "AHP_RELAY_RETENTION", default_value = "7d", value_parser = parse_ttl)]
    retention: Duration,
}

#[derive(clap::Args)]
struct TokenArgs {
    /// Tenant id (`tid` claim).
    #[arg(long)]
    tenant: String,
    /// User id (`sub` claim).
    #[arg(long)]
    sub: String,
    /// viewer, member or admin.
    #[arg(long, default_value = "member")]
    role: relay_core::Role,
    /// Restrict the token to these host names (repeatable). Default: every host of the tenant.
    #[arg(long = "host")]
    hosts: Vec<String>,
    /// Lifetime, e.g. 30m, 24h, 7d.
    #[arg(long, default_value = "24h", value_parser = parse_ttl)]
    ttl: Duration,
    /// HS256 secret; default: --jwt-secret-file, else the one kept in --data-dir.
    #[arg(long, env = "AHP_RELAY_JWT_SECRET", hide_env_values = true)]
    jwt_secret: Option<String>,
    /// A file holding the HS256 secret (mode 0600 or stricter).
    #[arg(long, env = "AHP_RELAY_JWT_SECRET_FILE")]
    jwt_secret_file: Option<PathBuf>,
    #[arg(long, env = "AHP_RELAY_DATA_DIR", default_value = ".relay-data")]
    data_dir: PathBuf,
}

/// Parses `90s`, `30m`, `24h`, `7d` (or plain seconds).
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("bad duration {text:?}"))?;
    let secs = match unit {
        "ms" => return Ok(Duration::from_millis(n)),
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(format!("bad duration unit in {text:?} (use ms, s, m, h or d)")),
    };
    Ok(Duration::from_secs(secs))
}

/// A one-shot command's log (`migrate`, `compact`: e.g. a migration giving way to writers) on stderr, at
/// `RUST_LOG`'s level (default: info, and warnings of the database driver).
fn log_to_stderr() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The relay's processes that run agents are the last the OOM killer picks (agents raise theirs to
/// [`relay_sandbox::confine::AGENT_OOM_SCORE_ADJ`]); lowering needs `CAP_SYS_RESOURCE`, so elsewhere nothing
/// changes.
fn protect_from_the_oom_killer() {
    match std::fs::write("/proc/self/oom_score_adj", RELAY_OOM_SCORE_ADJ.to_string()) {
        Ok(()) => tracing::debug!(adj = RELAY_OOM_SCORE_ADJ, "lowered this process's OOM score"),
        Err(error) => tracing::debug!(%error, "cannot lower this process's OOM score"),
    }
}

/// The OOM score adjustment of `serve` and runners, where allowed.
const RELAY_OOM_SCORE_ADJ: i32 = -500;

fn main() -> anyhow::Result<()> {
    // Inside an agent's sandbox, before anything else (no runtime, no threads): confine, then run the agent.
    if std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new(relay_sandbox::exec::SUBCOMMAND)) {
        std::process::exit(relay_sandbox::exec::main(std::env::args_os().skip(2).collect()));
    }
    // A tenant's file server, inside a sandbox of the tenant: std only, stdin/stdout.
    if std::env::args_os().nth(1).as_deref()
        == Some(std::ffi::OsStr::new(relay_runner::files::server::SUBCOMMAND))
    {
        std::process::exit(relay_runner::files::server::main(
            std::env::args_os().skip(2).collect(),
        ));
    }
    allocator::configure();
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_) | Command::Runner(_)) {
        protect_from_the_oom_killer();
    }
    match cli.command {
        Command::Token(args) => {
            let secret = secret::load_or_create(secret::SecretSource {
                explicit: args.jwt_secret.as_deref(),
                file: args.jwt_secret_file.as_deref(),
                data_dir: &args.data_dir,
            })?;
            let hosts = (!args.hosts.is_empty()).then_some(args.hosts);
            let claims =
                relay_gateway::auth::Claims::new(&args.tenant, &args.sub, args.role, hosts, args.ttl);
            println!("{}", relay_gateway::auth::mint_hs256(&secret, &claims)?);
            Ok(())
        }
        Command::Serve(args) => {
            // Hosts' commits run on a thread of their own, not behind the connection tasks.
            relay_shard::commit_thread::install()?;
            runtime()?.block_on(serve::run(args))
        }
        Command::Shard(args) => {
            relay_shard::commit_thread::install()?;
            runtime()?.block_on(serve::run_shard(args))
        }
        Command::Gateway(args) => runtime()?.block_on(serve::run_gateway(args)),
        Command::IdentityKeys(args) => identity_keys::run(&args),
        Command::InternalTls(args) => internal_tls::run(&args),
        Command::Runner(args) => runtime()?.block_on(runner::run(args)),
        Command::Chat(args) => runtime()?.block_on(chat::run(args)),
        Command::Compact(args) => runtime()?.block_on(async move {
            log_to_stderr();
            let store = serve::open_store(args.store.database_url.as_deref(), &args.store.data_dir).await?;
            let cutoff = jiff::Timestamp::now().as_millisecond()
                - i64::try_from(args.retention.as_millis()).unwrap_or(i64::MAX);
            println!("compacted {} log rows", store.compact(cutoff).await?);
            Ok(())
        }),
        Command::Migrate(args) => runtime()?.block_on(async move {
            log_to_stderr();
            serve::open_store(args.database_url.as_deref(), &args.data_dir).await?;
            println!("migrations applied");
            Ok(())
        }),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}
