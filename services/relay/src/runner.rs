//! `ahp-relay runner`: the process that runs a deployment's ACP agents, apart from the shards (agents execute
//! arbitrary code; the shard holds every tenant's state). It registers with every shard over gRPC
//! (`relay_rpc::runner`) and runs the sessions the shards place on it; on SIGTERM it stops every agent.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use relay_core::telemetry::Side;
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
    /// This runner's name in the shards' logs; default: the host name.
    #[arg(long, env = "AHP_RELAY_RUNNER_NAME")]
    pub name: Option<String>,
    #[command(flatten)]
    pub internal: crate::serve::InternalArgs,
}

/// `ahp-relay runner`.
pub async fn run(args: RunnerArgs) -> anyhow::Result<()> {
    let _observability = crate::observe::init("runner", &[Side::Shard])?;
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
    let config = relay_rpc::runner::RunnerConfig {
        name: format!("{name}/{}", std::process::id()),
        shards: shards.clone(),
        credential: args.internal.credential()?,
        providers: Arc::new(move || {
            AcpProvider::from_file(&file)
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
