//! The agents a deployment offers (`--agents FILE`, TOML): what to run, with which environment and credentials,
//! in which sandbox, and the quotas that bound each tenant's agents where they run.
//!
//! Values for an agent's environment come only from the relay's side — variables of the relay's own
//! environment named in `env`, or secret files named in `env_files` — never from clients. The agent sees
//! exactly those variables (its environment is cleared first). Credentials are per tenant
//! (`[agent.tenants.NAME] env_files = {…}`): a deployment-wide secret (`env_files` on the agent itself, or a
//! variable of the relay's environment other than the locale and `PATH`) is refused unless the operator writes
//! `shared_credentials = true`. See `deploy/agents.example.toml`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use relay_sandbox::{Egress, ResourceLimits};
use serde::Deserialize;

/// Why the agents file or an agent's environment could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AgentConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentsFile {
    /// Where sessions' working directories live: `<workspace_root>/<tenant>/…` (and, apart from them, each
    /// session's private home and `/tmp` under `<workspace_root>/.sandbox/`).
    pub workspace_root: PathBuf,
    /// An agent process with no prompt for this long is stopped (its sandbox killed); the session's next
    /// prompt starts it again and continues its ACP session where the agent can load it.
    #[serde(default = "default_idle_timeout_seconds")]
    pub idle_timeout_seconds: u64,
    /// How long an agent may take to answer `initialize` and `session/new` (e.g. while `npx` downloads it):
    /// past it the session fails with `agentStartTimeout` instead of staying `creating`.
    #[serde(default = "default_start_timeout_seconds")]
    pub start_timeout_seconds: u64,
    /// How sandboxes are made.
    #[serde(default)]
    pub sandbox: SandboxConfig,
    /// What each tenant's agents may use on this runner.
    #[serde(default)]
    pub quotas: QuotaConfig,
    /// The agents, in the order clients see them.
    #[serde(default, rename = "agent")]
    pub agents: Vec<AgentConfig>,
}

/// `[sandbox]`: how agents' sandboxes are made.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// When the relay runs as root each tenant's agents run as a user of their own, from
    /// `first_uid ..= first_uid + uid_count - 1` (must be free on the machine and mapped in its container).
    pub first_uid: u32,
    pub uid_count: u32,
    /// Niceness of agents' processes (0–19): the relay's own work comes first.
    pub nice: i32,
    /// More system directories agents may read (e.g. `/nix/store`); `/usr`, `/etc` and `/opt` always are.
    pub system_paths: Vec<PathBuf>,
    /// Use the relay's cgroup v2 subtree, when it was delegated one, for memory, CPU and process limits per
    /// tenant and per session (`[quotas]` `*_per_session`, `*_per_tenant`). Elsewhere rlimits apply.
    pub cgroups: bool,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            first_uid: 200_000,
            uid_count: 100_000,
            nice: 10,
            system_paths: Vec::new(),
            cgroups: true,
        }
    }
}

/// `[quotas]`: what one tenant's agents may use on this runner (or `serve`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuotaConfig {
    /// Agent processes and terminal commands the relay runs for one tenant at once; more are refused.
    pub running_per_tenant: usize,
    /// Terminal commands one session runs at once (an agent's commands; devices' terminals count apart, the
    /// same number).
    pub terminals_per_session: usize,
    /// A device's terminal nothing was typed into and that printed nothing for this long is stopped (seconds).
    pub terminal_idle_seconds: u64,
    /// Processes and threads of one tenant (RLIMIT_NPROC of its user) when the relay runs as root; otherwise
    /// each sandbox is bounded by its agent's `limits.processes`.
    pub processes_per_tenant: u64,
    /// Agent output (messages, tool output, terminal output) read per second for one tenant; faster agents
    /// are slowed (their pipes fill and they wait).
    pub output_bytes_per_second: u64,
    /// Agent output one turn (or one terminal command) may produce; past it the turn is cut with a note.
    pub output_bytes_per_turn: u64,
    /// Bytes a tenant's workspace, homes and `/tmp`s may hold; at or over it, new turns and commands are
    /// refused and running ones are stopped until files are removed.
    pub workspace_bytes_per_tenant: u64,
    /// How often a tenant's workspace is measured, in seconds.
    pub workspace_check_seconds: u64,
    /// How long a disposed session's workspace, home and `/tmp` are kept before they are removed (0: at once).
    pub workspace_retention_seconds: u64,
    /// With a delegated cgroup v2 only: memory of one session's agent and commands together, and of all of a
    /// tenant's sessions here (bytes; 0: unlimited).
    pub memory_bytes_per_session: u64,
    pub memory_bytes_per_tenant: u64,
    /// With a delegated cgroup v2 only: CPUs' worth of time one session, and one tenant, may use (0: unlimited).
    pub cpus_per_session: f64,
    pub cpus_per_tenant: f64,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        Self {
            running_per_tenant: 256,
            terminals_per_session: 16,
            terminal_idle_seconds: 30 * 60,
            processes_per_tenant: 4096,
            output_bytes_per_second: 1024 * 1024,
            output_bytes_per_turn: 8 * 1024 * 1024,
            workspace_bytes_per_tenant: 20 * 1024 * 1024 * 1024,
            workspace_check_seconds: 30,
            workspace_retention_seconds: 0,
            memory_bytes_per_session: 4 * 1024 * 1024 * 1024,
            memory_bytes_per_tenant: 16 * 1024 * 1024 * 1024,
            cpus_per_session: 2.0,
            cpus_per_tenant: 4.0,
        }
    }
}

/// One agent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Its provider id in AHP (`createSession.provider`).
    pub id: String,
    pub display_name: String,
    #[serde(default)]
    pub description: String,
    /// The program to run (looked up on the `PATH` the agent gets) and its arguments.
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Variables passed through from the relay's own environment (when set there).
    #[serde(default)]
    pub env: Vec<String>,
    /// Deployment-wide variables whose values are read from files: `NAME = "/run/secrets/name"`. Every tenant's
    /// agent gets them, so they are refused unless `shared_credentials = true`.
    #[serde(default)]
    pub env_files: BTreeMap<String, PathBuf>,
    /// The operator's statement that `env_files` (and secret `env` variables) may be shared by every tenant.
    #[serde(default)]
    pub shared_credentials: bool,
    /// Each tenant's own credentials: `[agent.tenants.acme] env_files = { KEY = "/run/secrets/acme-key" }`.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantCredentials>,
    /// Models listed in the agent's `AgentInfo` (until the agent reports its own).
    #[serde(default)]
    pub models: Vec<String>,
    /// Limits of each of the agent's processes (rlimits, applied inside its sandbox).
    #[serde(default)]
    pub limits: ResourceLimits,
    /// The TCP connections it may open: `"any"`, `"none"` or a list of ports (default: `[443]`).
    #[serde(default)]
    pub egress: Egress,
    /// Ports of this machine's loopback (127.0.0.1) it may connect to with port egress — a local model server,
    /// a proxy (default: none; the agent's own 127.0.0.1 is its network namespace's).
    #[serde(default)]
    pub loopback_ports: Vec<u16>,
    /// Directories holding the agent's installation, shown read-only in its sandbox (the command's own
    /// directory, and the package holding it, are added when they lie outside the system directories).
    #[serde(default)]
    pub read_only_paths: Vec<PathBuf>,
    /// Whether a session may hold chats beyond its default one (AHP `multipleChats`, with forks and side
    /// chats): each chat is an ACP session of the one agent process, and a fork or side chat reaches the agent
    /// with its history as context. `false` for an agent that serves one ACP session per process.
    #[serde(default = "multiple_chats_by_default")]
    pub multiple_chats: bool,
}

fn multiple_chats_by_default() -> bool {
    true
}

/// One tenant's credentials for an agent.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantCredentials {
    #[serde(default)]
    pub env_files: BTreeMap<String, PathBuf>,
}

/// Variables of the relay's environment an agent may take without `shared_credentials`: not secrets.
const NON_SECRET_VARIABLES: &[&str] = &["PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TERM"];

fn default_start_timeout_seconds() -> u64 {
    120
}

fn default_idle_timeout_seconds() -> u64 {
    600
}

/// Whether `name` is a valid environment variable name (`[A-Za-z_][A-Za-z0-9_]*`): anything else (`=`, a
/// leading `-`, NUL) could be taken for something other than a variable by the programs that pass it on.
pub fn valid_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 256
}

impl AgentsFile {
    /// Read and check an agents file.
    pub fn load(path: &Path) -> Result<AgentsFile, AgentConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| AgentConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parse and check the text of an agents file (`path` only names it in errors).
    pub fn parse(path: &Path, text: &str) -> Result<AgentsFile, AgentConfigError> {
        let invalid = |message: String| AgentConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let file: AgentsFile = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        if file.idle_timeout_seconds == 0 || file.start_timeout_seconds == 0 {
            return Err(invalid(
                "idle_timeout_seconds and start_timeout_seconds must be at least 1".into(),
            ));
        }
        if !file.workspace_root.is_absolute() {
            return Err(invalid("workspace_root must be an absolute path".into()));
        }
        if file.sandbox.first_uid == 0 || file.sandbox.uid_count == 0 {
            return Err(invalid(
                "[sandbox] first_uid and uid_count must be at least 1".into(),
            ));
        }
        if !(0..=19).contains(&file.sandbox.nice) {
            return Err(invalid("[sandbox] nice must be between 0 and 19".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for agent in &file.agents {
            let valid_id = !agent.id.is_empty()
                && agent
                    .id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !valid_id {
                return Err(invalid(format!(
                    "agent id {:?} must be letters, digits, - or _",
                    agent.id
                )));
            }
            if !seen.insert(agent.id.as_str()) {
                return Err(invalid(format!("agent id {} is listed twice", agent.id)));
            }
            if agent.command.is_empty() {
                return Err(invalid(format!("agent {} has no command", agent.id)));
            }
            agent
                .check_variables()
                .map_err(|message| invalid(format!("agent {}: {message}", agent.id)))?;
        }
        Ok(file)
    }

    /// Every secret file the agents name (agents must never see each other's, nor the relay's).
    pub fn secret_files(&self) -> Vec<PathBuf> {
        self.agents
            .iter()
            .flat_map(|agent| {
                agent
                    .env_files
                    .values()
                    .chain(
                        agent
                            .tenants
                            .values()
                            .flat_map(|tenant| tenant.env_files.values()),
                    )
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

impl AgentConfig {
    /// Refuse invalid variable names and deployment-wide secrets the operator did not declare shared.
    fn check_variables(&self) -> Result<(), String> {
        let names = self
            .env
            .iter()
            .chain(self.env_files.keys())
            .chain(self.tenants.values().flat_map(|tenant| tenant.env_files.keys()));
        for name in names {
            if !valid_variable_name(name) {
                return Err(format!("{name:?} is not a valid environment variable name"));
            }
        }
        if self.shared_credentials {
            return Ok(());
        }
        if let Some(name) = self.env_files.keys().next() {
            return Err(format!(
                "env_files {name} would give every tenant's agent the same credential: put it under \
                 [agent.tenants.<tenant>] env_files, or write shared_credentials = true"
            ));
        }
        let secret = self
            .env
            .iter()
            .find(|name| !(NON_SECRET_VARIABLES.contains(&name.as_str()) || name.starts_with("LC_")));
        if let Some(name) = secret {
            return Err(format!(
                "env {name} passes a variable of the relay's environment to every tenant's agent: give each \
                 tenant its own in [agent.tenants.<tenant>] env_files, or write shared_credentials = true"
            ));
        }
        Ok(())
    }

    /// The environment `tenant`'s agent runs with: the allow-listed variables of `relay_env` (the relay's own
    /// environment), the shared secret files and the tenant's own, nothing else.
    pub fn environment(
        &self,
        tenant: &str,
        relay_env: impl Fn(&str) -> Option<String>,
    ) -> Result<BTreeMap<String, String>, AgentConfigError> {
        let mut env = BTreeMap::new();
        for name in &self.env {
            if let Some(value) = relay_env(name) {
                env.insert(name.clone(), value);
            }
        }
        let own = self.tenants.get(tenant).map(|tenant| &tenant.env_files);
        for (name, file) in self.env_files.iter().chain(own.into_iter().flatten()) {
            env.insert(name.clone(), read_secret(file)?);
        }
        Ok(env)
    }

    /// The directories of the agent's installation it must be able to read: those configured, plus — for a
    /// command given as a path outside the system directories — its directory and, when it sits in a
    /// `node_modules` tree, the package root above it.
    pub fn installation(&self) -> Vec<PathBuf> {
        let mut paths = self.read_only_paths.clone();
        let command = Path::new(&self.command);
        if command.is_absolute() {
            let resolved = command.canonicalize().unwrap_or_else(|_| command.to_path_buf());
            for path in [command.to_path_buf(), resolved] {
                let root = path
                    .ancestors()
                    .find(|ancestor| ancestor.file_name().is_some_and(|name| name == "node_modules"))
                    .and_then(Path::parent)
                    .or_else(|| path.parent())
                    .map(Path::to_path_buf);
                paths.extend(root);
            }
        }
        paths.sort();
        paths.dedup();
        paths
    }
}

/// A secret file's value: at most 64 KiB of text, without its trailing newline.
fn read_secret(file: &Path) -> Result<String, AgentConfigError> {
    use std::io::Read;
    let read = |source| AgentConfigError::Read {
        path: file.to_path_buf(),
        source,
    };
    let mut value = String::new();
    std::fs::File::open(file)
        .map_err(read)?
        .take(64 * 1024)
        .read_to_string(&mut value)
        .map_err(read)?;
    Ok(value.trim_end_matches(['\n', '\r']).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
workspace_root = "/srv/workspaces"

[[agent]]
id = "claude"
display_name = "Claude"
command = "claude-agent-acp"
env = ["PATH", "HOME"]
models = ["sonnet"]
[agent.tenants.acme]
env_files = { ANTHROPIC_API_KEY = "/run/secrets/acme-anthropic" }
"#;

    #[test]
    fn the_example_in_the_repository_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/agents.example.toml");
        let file = AgentsFile::load(&path).expect("the example is valid");
        let ids: Vec<&str> = file.agents.iter().map(|a| a.id.as_str()).collect();
        assert_eq!(ids, ["claude", "codex", "gemini"]);
    }

    #[test]
    fn parses_agents_and_refuses_bad_files() {
        let file = AgentsFile::parse(Path::new("a.toml"), EXAMPLE).expect("valid");
        assert_eq!(file.agents.len(), 1);
        assert_eq!(file.agents[0].tenants["acme"].env_files.len(), 1);
        assert_eq!(
            file.agents[0].egress,
            Egress::Ports(vec![443]),
            "HTTPS only by default"
        );
        let agent = "[[agent]]\nid = \"a\"\ndisplay_name = \"x\"\ncommand = \"c\"\n";
        for bad in [
            "workspace_root = \"relative\"".to_string(),
            "workspace_root = \"/w\"\n[[agent]]\nid = \"a b\"\ndisplay_name = \"x\"\ncommand = \"c\"".into(),
            format!("workspace_root = \"/w\"\n{agent}surprise = 1"),
            format!("workspace_root = \"/w\"\n{agent}{agent}"),
            // A deployment-wide credential nobody declared shared.
            format!("workspace_root = \"/w\"\n{agent}env_files = {{ KEY = \"/k\" }}"),
            format!("workspace_root = \"/w\"\n{agent}env = [\"OPENAI_API_KEY\"]"),
            // Names that are not variables.
            format!("workspace_root = \"/w\"\n{agent}env = [\"--chdir\"]"),
            format!("workspace_root = \"/w\"\n{agent}[agent.tenants.t]\nenv_files = {{ \"A=B\" = \"/k\" }}"),
            format!("workspace_root = \"/w\"\n{agent}egress = \"everything\""),
            "workspace_root = \"/w\"\n[sandbox]\nnice = 40".into(),
        ] {
            assert!(AgentsFile::parse(Path::new("bad.toml"), &bad).is_err(), "{bad}");
        }
        let shared = format!(
            "workspace_root = \"/w\"\n{agent}shared_credentials = true\nenv_files = {{ KEY = \"/k\" }}"
        );
        assert!(AgentsFile::parse(Path::new("shared.toml"), &shared).is_ok());
    }

    #[test]
    fn variable_names_are_posix_names() {
        for good in ["PATH", "_X", "a1", "LC_ALL"] {
            assert!(valid_variable_name(good), "{good}");
        }
        for bad in ["", "1A", "--chdir", "A=B", "A B", "Ä", "A\0"] {
            assert!(!valid_variable_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn each_tenant_gets_its_own_credentials_and_the_allowed_variables_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let acme = dir.path().join("acme-key");
        let shared = dir.path().join("shared");
        std::fs::write(&acme, "acme-s3cret\n").expect("write");
        std::fs::write(&shared, "everyone\n").expect("write");
        let agent = AgentConfig {
            id: "a".into(),
            display_name: "A".into(),
            description: String::new(),
            command: "a".into(),
            args: vec![],
            env: vec!["PATH".into(), "UNSET".into()],
            env_files: BTreeMap::from([("SHARED".into(), shared)]),
            shared_credentials: true,
            tenants: BTreeMap::from([(
                "acme".to_string(),
                TenantCredentials {
                    env_files: BTreeMap::from([("API_KEY".into(), acme)]),
                },
            )]),
            models: vec![],
            limits: ResourceLimits::default(),
            egress: Egress::default(),
            loopback_ports: Vec::new(),
            read_only_paths: vec![],
            multiple_chats: true,
        };
        let relay_env = |name: &str| match name {
            "PATH" => Some("/bin".to_string()),
            "SECRET_OF_THE_RELAY" => Some("no".to_string()),
            _ => None,
        };
        assert_eq!(
            agent.environment("acme", relay_env).expect("env"),
            BTreeMap::from([
                ("API_KEY".to_string(), "acme-s3cret".to_string()),
                ("PATH".to_string(), "/bin".to_string()),
                ("SHARED".to_string(), "everyone".to_string()),
            ])
        );
        assert_eq!(
            agent.environment("globex", relay_env).expect("env"),
            BTreeMap::from([
                ("PATH".to_string(), "/bin".to_string()),
                ("SHARED".to_string(), "everyone".to_string()),
            ]),
            "another tenant gets no part of acme's credentials"
        );
    }

    #[test]
    fn an_installation_in_node_modules_is_shown_from_its_package_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("prefix/node_modules/.bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        let agent = AgentConfig {
            command: bin.join("agent").display().to_string(),
            ..AgentConfig {
                id: "a".into(),
                display_name: "A".into(),
                description: String::new(),
                command: String::new(),
                args: vec![],
                env: vec![],
                env_files: BTreeMap::new(),
                shared_credentials: false,
                tenants: BTreeMap::new(),
                models: vec![],
                limits: ResourceLimits::default(),
                egress: Egress::default(),
                loopback_ports: Vec::new(),
                read_only_paths: vec![PathBuf::from("/opt/extra")],
                multiple_chats: true,
            }
        };
        assert_eq!(
            agent.installation(),
            [PathBuf::from("/opt/extra"), dir.path().join("prefix")]
        );
    }
}
