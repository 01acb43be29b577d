//! `ahp-relay serve`: the embedded relay.

#[derive(clap::Args)]
pub struct ServeArgs {}

pub async fn run(_args: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
