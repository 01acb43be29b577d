//! Where the processes that run agents (`serve` with `--agents`, `runner`) decide how agents are confined:
//! the sandbox probe at start, the paths agents must never see, and the refusal to run agents unconfined
//! unless the operator said `--unsafe-no-sandbox` (then logged at start and at every agent start).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use relay_runner::acp::{AgentsFile, Sandboxes};
use relay_sandbox::{Egress, Launcher, Sandbox, SandboxSettings};

/// How agents are sandboxed (`serve` and `runner`).
#[derive(clap::Args, Clone)]
pub struct SandboxArgs {
    /// Run agents as plain child processes, without a sandbox: they can then read this process's files and
    /// secrets, other tenants' workspaces, and signal this process. Only where the whole relay is isolated per
    /// tenant by other means.
    #[arg(long, env = "AHP_RELAY_UNSAFE_NO_SANDBOX")]
    pub unsafe_no_sandbox: bool,
    /// bubblewrap's path (default: `bwrap` on the PATH).
    #[arg(long, env = "AHP_RELAY_BWRAP")]
    pub bwrap: Option<PathBuf>,
    /// pasta's path (Debian's `passt`; default: `pasta` on the PATH): connects the network namespace of each
    /// agent with port egress.
    #[arg(long, env = "AHP_RELAY_PASTA")]
    pub pasta: Option<PathBuf>,
    /// Where pasta cannot give agents a network namespace of their own (not installed, or no `/dev/net/tun`),
    /// let agents with port egress share this process's network namespace instead of refusing to start: they
    /// can then reach its loopback services on their allowed ports and listen on its addresses.
    #[arg(long, env = "AHP_RELAY_UNSAFE_SHARED_NETWORK")]
    pub unsafe_shared_network: bool,
}

/// What the process knows agents must not reach.
#[derive(Clone)]
pub struct Protected {
    /// Files and directories never shown in a sandbox (data dir, secret files, the agents file).
    pub paths: Vec<PathBuf>,
    /// TCP ports of the relay itself, its store and its bus: no agent's egress may name one.
    pub ports: Vec<(u16, String)>,
}

/// The sandboxes agents of `file` run in, once this machine proved it can make them.
pub async fn sandboxes(
    file: &AgentsFile,
    agents_file: &Path,
    args: &SandboxArgs,
    mut protected: Protected,
) -> anyhow::Result<Arc<Sandboxes>> {
    for agent in &file.agents {
        if let Egress::Ports(ports) = &agent.egress {
            for (port, what) in &protected.ports {
                anyhow::ensure!(
                    !ports.contains(port) && !agent.loopback_ports.contains(port),
                    "agent {}: its egress allows port {port}, which is {what}: agents must never reach it",
                    agent.id
                );
            }
        }
    }
    if args.unsafe_no_sandbox {
        tracing::warn!(
            "--unsafe-no-sandbox: agents run WITHOUT a sandbox, as this process's user: they can read its \
             secrets and store, other tenants' workspaces, and kill it"
        );
        return Ok(Sandboxes::new(Launcher::Unconfined, file)?);
    }
    protected.paths.push(agents_file.to_path_buf());
    protected.paths.push(file.workspace_root.clone());
    // Secret files, and the directories holding them and the agents file (an orchestrator updates a mounted
    // secret or ConfigMap by pointing a symlink at a new directory beside the old one) — unless that directory
    // is a system root itself.
    let secrets = file.secret_files();
    for path in secrets.iter().chain(std::iter::once(&agents_file.to_path_buf())) {
        if let Some(parent) = std::path::absolute(path)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            if parent.components().count() > 2 {
                protected.paths.push(parent);
            }
        }
    }
    protected.paths.extend(secrets);
    // Absolute (a relative data dir not created yet must still be recognised), and resolved where it exists.
    let paths = protected
        .paths
        .into_iter()
        .filter_map(|path| std::path::absolute(&path).ok())
        .flat_map(|path| {
            let resolved = path.canonicalize().ok();
            std::iter::once(path).chain(resolved)
        })
        .collect();
    // The probe's throw-away sandbox lives under the workspace root (a container's /tmp may be read-only).
    let scratch = file.workspace_root.join(".sandbox");
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let helper = std::env::current_exe().context("finding this program's path (the sandbox runs it)")?;
    let sandbox = Sandbox::probe(SandboxSettings {
        helper,
        bwrap: args.bwrap.clone(),
        pasta: args.pasta.clone(),
        protected: paths,
        extra_system: file.sandbox.system_paths.clone(),
        nice: file.sandbox.nice,
        probe_user: file.sandbox.first_uid,
        scratch,
    })
    .await
    .map_err(|error| {
        anyhow::anyhow!(
            "agents cannot be sandboxed on this machine: {error}. Agents are untrusted code: the relay does not \
             run them unconfined unless started with --unsafe-no-sandbox"
        )
    })?;
    let enforced = sandbox.enforced().clone();
    if let Err(why) = sandbox.own_network() {
        let with_ports = file
            .agents
            .iter()
            .find(|agent| matches!(agent.egress, Egress::Ports(_)));
        if let Some(agent) = with_ports {
            anyhow::ensure!(
                args.unsafe_shared_network,
                "agent {}: its port egress needs a network namespace of its own, which this machine cannot make: \
                 {why}. Install passt and give this process /dev/net/tun, give every agent egress = \"none\", or \
                 start with --unsafe-shared-network to let agents share this process's network namespace (they \
                 can then reach its loopback services on their ports and listen on its addresses)",
                agent.id
            );
            tracing::warn!(
                %why,
                "--unsafe-shared-network: agents with port egress share this process's network namespace: they \
                 can reach its loopback services on their ports and listen on its addresses"
            );
        }
    }
    let needs_ports = file.agents.iter().any(|agent| agent.egress.needs_port_rules());
    anyhow::ensure!(
        !needs_ports || enforced.port_rules,
        "this kernel cannot restrict agents' TCP ports (Landlock ABI 4, Linux 6.7+): give every agent egress = \
         \"none\" or \"any\""
    );
    if !enforced.scoped {
        tracing::warn!(
            "this kernel's Landlock cannot scope signals and abstract Unix sockets (ABI 6, Linux 6.12+): agents \
             with network egress share the runner's abstract sockets"
        );
    }
    tracing::info!(
        landlock = %enforced.landlock,
        scoped = enforced.scoped,
        per_tenant_users = relay_sandbox::running_as_root(),
        proc = sandbox.layout().proc,
        "agents run sandboxed"
    );
    Ok(Sandboxes::new(Launcher::Sandboxed(Arc::new(sandbox)), file)?)
}

/// The port of a URL (`scheme://[user@]host:port/…`), with the scheme's default when none is written.
pub fn url_port(url: &str) -> Option<u16> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit('@').next()?;
    let explicit = host_port
        .rsplit_once(':')
        .filter(|(host, _)| !host.ends_with(']') || host_port.starts_with('['))
        .and_then(|(_, port)| port.parse().ok());
    explicit.or(match scheme {
        "postgres" | "postgresql" => Some(5432),
        "redis" | "rediss" => Some(6379),
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_urls_or_their_schemes() {
        assert_eq!(url_port("postgres://u:p@db:6543/relay"), Some(6543));
        assert_eq!(url_port("postgres://u:p@db/relay"), Some(5432));
        assert_eq!(url_port("redis://:secret@cache:6380"), Some(6380));
        assert_eq!(url_port("rediss://cache"), Some(6379));
        assert_eq!(url_port("http://shard-0:7879"), Some(7879));
        assert_eq!(url_port("not a url"), None);
    }
}
