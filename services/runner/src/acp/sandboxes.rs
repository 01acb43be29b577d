//! Every agent process this runner (or `serve`) starts, and every command an agent runs through a terminal,
//! starts here: in a sandbox of its session ([`relay_sandbox`]), counted against its tenant's quotas
//! ([`super::quota`]), in the session's directories ([`super::workspace`]). A background task measures active
//! tenants' workspaces and removes disposed sessions' directories once their retention passed.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

use relay_sandbox::cgroups::{CgroupLimits, Cgroups};
use relay_sandbox::{Launcher, SandboxSpec, TenantUsers};

use super::config::{AgentConfig, AgentsFile, QuotaConfig};
use super::quota::{QuotaLimits, QuotaRefusal, RunningSlot, TenantQuotas};
use super::workspace::{SessionDirs, Workspaces};

/// Why a sandboxed process did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Quota(#[from] QuotaRefusal),
    #[error("cannot start the sandbox: {0}")]
    Spawn(#[from] std::io::Error),
}

/// The sandboxes of this process.
pub struct Sandboxes {
    launcher: Launcher,
    workspaces: Arc<Workspaces>,
    /// The workspace root, resolved: every session's directory is opened beneath it without symlinks.
    anchor: std::path::PathBuf,
    quotas: Arc<TenantQuotas>,
    config: QuotaConfig,
    /// Per-tenant and per-session cgroups, where this process has a delegated cgroup v2.
    cgroups: Option<Cgroups>,
}

impl Sandboxes {
    /// Sandboxes started by `launcher` for the agents of `file`; starts the background maintenance (needs a
    /// Tokio runtime).
    pub fn new(
        launcher: Launcher,
        file: &AgentsFile,
    ) -> Result<Arc<Sandboxes>, super::workspace::WorkspaceError> {
        let users = launcher
            .per_tenant_users()
            .then(|| TenantUsers::new(file.sandbox.first_uid, file.sandbox.uid_count));
        let config = file.quotas.clone();
        let quotas = TenantQuotas::new(QuotaLimits {
            running_per_tenant: config.running_per_tenant.max(1),
            output_bytes_per_second: config.output_bytes_per_second.max(1024),
            // One second's worth: a burst, then the rate.
            output_burst_bytes: config.output_bytes_per_second.max(64 * 1024),
            workspace_bytes_per_tenant: config.workspace_bytes_per_tenant.max(1),
        });
        let cgroups = if file.sandbox.cgroups && matches!(launcher, Launcher::Sandboxed(_)) {
            let membership = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
            match Cgroups::prepare(std::path::Path::new("/sys/fs/cgroup"), &membership) {
                Ok(cgroups) => {
                    tracing::info!(
                        "agents' memory, CPU and processes: a cgroup v2 per tenant and per session"
                    );
                    Some(cgroups)
                }
                Err(error) => {
                    tracing::info!(%error, "agents' memory, CPU and processes: rlimits per process (no delegated cgroup v2)");
                    None
                }
            }
        } else {
            None
        };
        let anchor = file
            .workspace_root
            .canonicalize()
            .unwrap_or_else(|_| file.workspace_root.clone());
        let sandboxes = Arc::new(Sandboxes {
            launcher,
            anchor,
            workspaces: Arc::new(Workspaces::new(file.workspace_root.clone(), users)?),
            quotas,
            config,
            cgroups,
        });
        tokio::spawn(maintain(Arc::downgrade(&sandboxes)));
        Ok(sandboxes)
    }

    pub fn workspaces(&self) -> &Workspaces {
        &self.workspaces
    }

    /// The resolved workspace root, beneath which sessions' directories are opened.
    pub fn anchor(&self) -> &Path {
        &self.anchor
    }

    pub fn quotas(&self) -> &Arc<TenantQuotas> {
        &self.quotas
    }

    pub fn config(&self) -> &QuotaConfig {
        &self.config
    }

    /// The sandbox of a process of `agent` in a session with `dirs`, starting in `cwd`.
    pub fn spec(&self, dirs: &SessionDirs, cwd: &Path, agent: &AgentConfig) -> SandboxSpec {
        let mut limits = agent.limits.clone();
        let session_processes = limits.processes;
        if matches!(self.launcher, Launcher::Sandboxed(_)) {
            // The tenant's own user (root) or user namespace (not root): RLIMIT_NPROC counts all of the
            // tenant's processes.
            limits.processes = Some(self.config.processes_per_tenant);
        }
        let cgroup = self.cgroups.as_ref().and_then(|cgroups| {
            let config = &self.config;
            let nonzero = |value: u64| (value > 0).then_some(value);
            let cpu = |cpus: f64| (cpus > 0.0).then_some((cpus * 1000.0) as u64);
            let joined = cgroups.session(
                &dirs.tenant_key,
                &dirs.session_key,
                &CgroupLimits {
                    memory_bytes: nonzero(config.memory_bytes_per_tenant),
                    processes: nonzero(config.processes_per_tenant),
                    cpu_millis: cpu(config.cpus_per_tenant),
                },
                &CgroupLimits {
                    memory_bytes: nonzero(config.memory_bytes_per_session),
                    processes: session_processes,
                    cpu_millis: cpu(config.cpus_per_session),
                },
            );
            joined
                .map_err(|error| tracing::warn!(%error, "no cgroup for this session; its rlimits apply"))
                .ok()
        });
        SandboxSpec {
            tenant: dirs.tenant_key.clone(),
            anchor: self.anchor.clone(),
            cgroup,
            workspace: dirs.workspace.clone(),
            home: dirs.home.clone(),
            tmp: dirs.tmp.clone(),
            shm: dirs.shm.clone(),
            cwd: cwd.to_path_buf(),
            install: agent.installation(),
            egress: agent.egress.clone(),
            loopback_ports: agent.loopback_ports.clone(),
            limits,
            user: dirs.user,
        }
    }

    /// Start `program args` with exactly `env` in the sandbox `spec`, for `tenant` (counted until the returned
    /// slot is dropped). Its stdio is piped; dropping the child kills the whole sandbox.
    pub async fn start(
        &self,
        tenant: &str,
        spec: &SandboxSpec,
        program: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
    ) -> Result<(tokio::process::Child, RunningSlot), StartError> {
        let fresh = Duration::from_secs(self.config.workspace_check_seconds.max(1) * 2);
        if self.quotas.needs_measurement(tenant, fresh) {
            self.measure(tenant).await;
        }
        let slot = self.quotas.start(tenant)?;
        let command = self.launcher.command(spec, program, args, env).await?;
        let child = Launcher::spawn(command).await?;
        Ok((child, slot))
    }

    /// [`Sandboxes::start`] with `terminal` (one side of a pseudoterminal) as the process's stdin, stdout and
    /// stderr: the sandbox's first program makes it the controlling terminal.
    pub async fn start_on_terminal(
        &self,
        tenant: &str,
        spec: &SandboxSpec,
        program: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
        terminal: &std::os::fd::OwnedFd,
    ) -> Result<(tokio::process::Child, RunningSlot), StartError> {
        let slot = self.quotas.start(tenant)?;
        let mut command = self.launcher.command(spec, program, args, env).await?;
        let stdio = || terminal.try_clone().map(std::process::Stdio::from);
        command.stdin(stdio()?).stdout(stdio()?).stderr(stdio()?);
        let child = Launcher::spawn(command).await?;
        Ok((child, slot))
    }

    /// A session's home directory as its processes see it (`dirs.home` is where it is outside the sandbox).
    pub fn home_inside(&self, dirs: &SessionDirs) -> std::path::PathBuf {
        match self.launcher {
            Launcher::Sandboxed(_) => relay_sandbox::HOME_IN_SANDBOX.into(),
            Launcher::Unconfined => dirs.home.clone(),
        }
    }

    /// Start a relay service (`program args`, nothing of the agent's environment) in the sandbox `spec`: not an
    /// agent, so not counted against the tenant's running agents. Stdio is piped; dropping the child kills it.
    pub async fn start_service(
        &self,
        spec: &SandboxSpec,
        program: &str,
        args: &[String],
    ) -> std::io::Result<tokio::process::Child> {
        let env = BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
        let command = self.launcher.command(spec, program, args, &env).await?;
        Launcher::spawn(command).await
    }

    /// The paths an agent's start names that its sandbox of `spec` does not show — the command (found on the
    /// `PATH` it gets, as this machine sees it), arguments that are absolute paths, and what a script command
    /// runs — each resolved: why an agent that works outside may not start inside (a pyenv shim's interpreter, a
    /// tool under a home directory).
    pub fn unseen_paths(
        &self,
        spec: &SandboxSpec,
        agent: &AgentConfig,
        env: &BTreeMap<String, String>,
    ) -> Vec<std::path::PathBuf> {
        let Launcher::Sandboxed(sandbox) = &self.launcher else {
            return Vec::new();
        };
        let command = if agent.command.contains('/') {
            Some(std::path::PathBuf::from(&agent.command))
        } else {
            env.get("PATH").and_then(|path| {
                std::env::split_paths(path)
                    .map(|dir| dir.join(&agent.command))
                    .find(|candidate| candidate.is_file())
            })
        };
        let arguments = agent
            .args
            .iter()
            .map(std::path::PathBuf::from)
            .filter(|arg| arg.is_absolute() && arg.exists());
        // A script (a shim, as pyenv's) runs what it names: the absolute paths it holds. It is the operator's
        // file, not the agent's output.
        let named_by_script = command.as_deref().map(script_paths).unwrap_or_default();
        command
            .into_iter()
            .chain(arguments)
            .chain(named_by_script)
            .flat_map(|path| {
                // The path as named (a link) and where it leads: both must be seen.
                let resolved = path.canonicalize().ok();
                std::iter::once(path).chain(resolved)
            })
            .filter(|path| !sandbox.layout().shows(spec, path))
            .collect()
    }

    /// Measure `tenant`'s workspace, homes and `/tmp`s now.
    pub async fn measure(&self, tenant: &str) {
        let (workspaces, name) = (self.workspaces.clone(), tenant.to_string());
        let measured = tokio::task::spawn_blocking(move || workspaces.disk_usage(&name)).await;
        if let Ok(bytes) = measured {
            self.quotas.workspace_measured(tenant, bytes);
        }
    }

    /// The session is gone: remove its directories (now, or after the retention), and its cgroup.
    pub fn dispose(&self, tenant: &str, host: &str, session: &str) {
        if let Some(cgroups) = &self.cgroups {
            let (tenant_key, session_key) = super::workspace::cgroup_names(tenant, host, session);
            cgroups.remove_session(&tenant_key, &session_key);
        }
        self.workspaces.dispose(
            tenant,
            host,
            session,
            Duration::from_secs(self.config.workspace_retention_seconds),
        );
    }
}

/// The absolute paths that exist, named in `command` when it is a small script (`#!`): what a shim runs.
fn script_paths(command: &std::path::Path) -> Vec<std::path::PathBuf> {
    use std::io::Read;
    let mut text = Vec::new();
    let read = std::fs::File::open(command).and_then(|file| file.take(64 * 1024).read_to_end(&mut text));
    if read.is_err() || !text.starts_with(b"#!") {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&text);
    let mut paths: Vec<std::path::PathBuf> = Vec::new();
    for word in text.split(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ';' | '=' | ':')) {
        let path = std::path::Path::new(word);
        if path.is_absolute() && path.is_file() && !paths.iter().any(|seen| seen == path) && paths.len() < 8 {
            paths.push(path.to_path_buf());
        }
    }
    paths
}

/// Measure active tenants' workspaces and sweep disposed sessions' directories, until the sandboxes go.
async fn maintain(sandboxes: Weak<Sandboxes>) {
    let Some(every) = sandboxes
        .upgrade()
        .map(|s| Duration::from_secs(s.config.workspace_check_seconds.max(1)))
    else {
        return;
    };
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(strong) = sandboxes.upgrade() else { return };
        for tenant in strong.quotas.active_tenants(Duration::from_secs(600)) {
            strong.measure(&tenant).await;
        }
        if strong.config.workspace_retention_seconds > 0 {
            let swept = {
                let sandboxes = strong.clone();
                tokio::task::spawn_blocking(move || sandboxes.workspaces.sweep()).await
            };
            if let Ok(removed) = swept {
                if removed > 0 {
                    tracing::info!(removed, "removed disposed sessions' directories");
                }
            }
        }
    }
}
