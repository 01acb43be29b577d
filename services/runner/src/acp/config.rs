//! The agents a deployment offers (`--agents FILE`, TOML): what to run, with which environment, and where.
//!
//! Values for an agent's environment come only from the relay's side — variables of the relay's own
//! environment named in `env`, or secret files named in `env_files` — never from clients. The agent sees
//! exactly those variables (its environment is cleared first). See `deploy/agents.example.toml`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    /// Where sessions' working directories live: `<workspace_root>/<tenant>/…`.
    pub workspace_root: PathBuf,
    /// An agent process with no prompt for this long is stopped (its process group killed); the session's
    /// next prompt starts it again and continues its ACP session where the agent can load it.
    #[serde(default = "default_idle_timeout_seconds")]
    pub idle_timeout_seconds: u64,
    /// How long an agent may take to answer `initialize` and `session/new` (e.g. while `npx` downloads it):
    /// past it the session fails with `agentStartTimeout` instead of staying `creating`.
    #[serde(default = "default_start_timeout_seconds")]
    pub start_timeout_seconds: u64,
    /// The agents, in the order clients see them.
    #[serde(default, rename = "agent")]
    pub agents: Vec<AgentConfig>,
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
    /// Variables whose values are read from files (e.g. mounted secrets): `NAME = "/run/secrets/name"`.
    #[serde(default)]
    pub env_files: BTreeMap<String, PathBuf>,
    /// Models listed in the agent's `AgentInfo` (until the agent reports its own).
    #[serde(default)]
    pub models: Vec<String>,
    /// Resource limits of the agent's processes (rlimits, set with util-linux `prlimit`).
    #[serde(default)]
    pub limits: ProcessLimits,
}

/// Resource limits for an agent's processes; unset ones are inherited from the relay.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ProcessLimits {
    /// Largest virtual memory of one process, in bytes (RLIMIT_AS).
    pub address_space_bytes: Option<u64>,
    /// CPU time of one process, in seconds (RLIMIT_CPU).
    pub cpu_seconds: Option<u64>,
    /// Open files of one process (RLIMIT_NOFILE).
    pub open_files: Option<u64>,
    /// Processes of the agent's user (RLIMIT_NPROC).
    pub processes: Option<u64>,
    /// Largest file one process may write, in bytes (RLIMIT_FSIZE).
    pub file_size_bytes: Option<u64>,
}

impl ProcessLimits {
    /// The `prlimit` options that set these limits (soft and hard), empty when none is set.
    pub fn prlimit_args(&self) -> Vec<String> {
        [
            ("--as", self.address_space_bytes),
            ("--cpu", self.cpu_seconds),
            ("--nofile", self.open_files),
            ("--nproc", self.processes),
            ("--fsize", self.file_size_bytes),
        ]
        .into_iter()
        .filter_map(|(option, value)| value.map(|v| format!("{option}={v}")))
        .collect()
    }
}

fn default_start_timeout_seconds() -> u64 {
    120
}

fn default_idle_timeout_seconds() -> u64 {
    600
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
        }
        Ok(file)
    }
}

impl AgentConfig {
    /// The program and arguments that run `program args` in `cwd` with exactly `env` (`env -i --chdir`) and
    /// this agent's rlimits (`prlimit`, which then runs `env`): for the agent itself and the commands it runs.
    pub fn wrapped_command(
        &self,
        cwd: &std::path::Path,
        env: &BTreeMap<String, String>,
        program: &str,
        args: &[String],
    ) -> (String, Vec<String>) {
        let env_args: Vec<String> = ["-i".to_string(), format!("--chdir={}", cwd.display())]
            .into_iter()
            .chain(env.iter().map(|(name, value)| format!("{name}={value}")))
            .chain(std::iter::once(program.to_string()))
            .chain(args.iter().cloned())
            .collect();
        let limits = self.limits.prlimit_args();
        if limits.is_empty() {
            return ("env".into(), env_args);
        }
        let mut wrapped = limits;
        wrapped.push("--".into());
        wrapped.push("env".into());
        wrapped.extend(env_args);
        ("prlimit".into(), wrapped)
    }

    /// The environment the agent runs with: the allow-listed variables of `relay_env` (the relay's own
    /// environment) and the contents of the secret files, nothing else.
    pub fn environment(
        &self,
        relay_env: impl Fn(&str) -> Option<String>,
    ) -> Result<BTreeMap<String, String>, AgentConfigError> {
        let mut env = BTreeMap::new();
        for name in &self.env {
            if let Some(value) = relay_env(name) {
                env.insert(name.clone(), value);
            }
        }
        for (name, file) in &self.env_files {
            let value = std::fs::read_to_string(file).map_err(|source| AgentConfigError::Read {
                path: file.clone(),
                source,
            })?;
            env.insert(name.clone(), value.trim_end_matches(['\n', '\r']).to_string());
        }
        Ok(env)
    }
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
env_files = { ANTHROPIC_API_KEY = "/run/secrets/anthropic" }
models = ["sonnet"]
"#;

    #[test]
    fn limits_become_prlimit_options() {
        let limits = ProcessLimits {
            open_files: Some(64),
            cpu_seconds: Some(600),
            ..ProcessLimits::default()
        };
        assert_eq!(limits.prlimit_args(), ["--cpu=600", "--nofile=64"]);
        assert!(ProcessLimits::default().prlimit_args().is_empty());
    }

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
        assert_eq!(file.agents[0].env_files.len(), 1);
        for bad in [
            "workspace_root = \"relative\"",
            "workspace_root = \"/w\"\n[[agent]]\nid = \"a b\"\ndisplay_name = \"x\"\ncommand = \"c\"",
            "workspace_root = \"/w\"\n[[agent]]\nid = \"a\"\ndisplay_name = \"x\"\ncommand = \"c\"\nsurprise = 1",
            "workspace_root = \"/w\"\n[[agent]]\nid = \"a\"\ndisplay_name = \"x\"\ncommand = \"c\"\n[[agent]]\nid = \"a\"\ndisplay_name = \"y\"\ncommand = \"c\"",
        ] {
            assert!(AgentsFile::parse(Path::new("bad.toml"), bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_environment_is_the_allow_list_and_the_secret_files_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("key");
        std::fs::write(&secret, "s3cret\n").expect("write");
        let agent = AgentConfig {
            id: "a".into(),
            display_name: "A".into(),
            description: String::new(),
            command: "a".into(),
            args: vec![],
            env: vec!["PATH".into(), "UNSET".into()],
            env_files: BTreeMap::from([("API_KEY".into(), secret)]),
            models: vec![],
            limits: ProcessLimits::default(),
        };
        let relay_env = |name: &str| match name {
            "PATH" => Some("/bin".to_string()),
            "SECRET_OF_THE_RELAY" => Some("no".to_string()),
            _ => None,
        };
        let env = agent.environment(relay_env).expect("env");
        assert_eq!(
            env,
            BTreeMap::from([
                ("API_KEY".to_string(), "s3cret".to_string()),
                ("PATH".to_string(), "/bin".to_string()),
            ])
        );
    }
}
