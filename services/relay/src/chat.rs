//! `ahp-relay chat`: a terminal client built on the official `ahp` client crate.

use std::path::PathBuf;

/// Arguments of `ahp-relay chat`.
#[derive(clap::Args)]
pub struct ChatArgs {
    /// WebSocket URL of the relay.
    #[arg(long, env = "AHP_RELAY_URL", default_value = "ws://127.0.0.1:7878/v1/ws")]
    pub url: String,
    /// Access token; default: a dev token minted from the secret in --data-dir.
    #[arg(long, env = "AHP_RELAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Join this session instead of creating one.
    #[arg(long)]
    pub session: Option<String>,
    #[arg(long, env = "AHP_RELAY_DATA_DIR", default_value = ".relay-data")]
    pub data_dir: PathBuf,
}

pub async fn run(_args: ChatArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
