//! One configured ACP agent as an AHP provider ([`AcpProvider`]): a worker per session, started in its sandbox,
//! prompted turn by turn; its devices' terminals; how it is listed.

use std::collections::HashMap;
use std::sync::Arc;

use ahp_types::state::{AgentInfo, SessionConfigSchema, SessionModelInfo};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::agent_link::{self, Prompt};
use super::config::{AgentConfig, AgentsFile};
use super::listing::{agent_info, Listing};
use super::sandboxes::Sandboxes;
use super::session::SessionWorker;
use super::session_key::SessionKey;
use super::shell::{self, KeptShells};
use crate::provider::{
    ChatSink, Provider, SessionRequest, SessionStart, TerminalKey, TerminalRequest, TerminalStarted,
    TurnHandle, TurnRequest,
};

/// One configured ACP agent, serving every session created with its id.
pub struct AcpProvider {
    config: Arc<AgentConfig>,
    sandboxes: Arc<Sandboxes>,
    timeouts: agent_link::Timeouts,
    sessions: Arc<Mutex<HashMap<SessionKey, SessionWorker>>>,
    /// The models the agent itself reported (its `session/new` model selector), once known.
    reported_models: Arc<Mutex<Option<Vec<SessionModelInfo>>>>,
    /// The settings (session config) the agent reported, once known.
    reported_settings: Arc<Mutex<Option<SessionConfigSchema>>>,
    /// Devices' terminals in its sessions.
    shells: Arc<shell::ShellTerminals>,
}

impl AcpProvider {
    /// The agent `config` describes, run in `sandboxes`; its devices' terminals are kept in `shells` (they
    /// outlive this provider: see [`KeptShells`]).
    pub fn new(
        config: AgentConfig,
        sandboxes: Arc<Sandboxes>,
        timeouts: agent_link::Timeouts,
        shells: &KeptShells,
    ) -> Self {
        let config = Arc::new(config);
        Self {
            shells: shells.of(&sandboxes, &config),
            config,
            sandboxes,
            timeouts,
            sessions: Arc::default(),
            reported_models: Arc::default(),
            reported_settings: Arc::default(),
        }
    }

    /// Every agent of an agents file, run in `sandboxes`, their devices' terminals kept in `shells`.
    pub fn from_file(file: &AgentsFile, sandboxes: &Arc<Sandboxes>, shells: &KeptShells) -> Vec<AcpProvider> {
        file.agents
            .iter()
            .map(|agent| {
                AcpProvider::new(
                    agent.clone(),
                    sandboxes.clone(),
                    agent_link::Timeouts {
                        idle: std::time::Duration::from_secs(file.idle_timeout_seconds),
                        start: std::time::Duration::from_secs(file.start_timeout_seconds),
                    },
                    shells,
                )
            })
            .collect()
    }

    /// Start the agent process of a session (in the background); `announce` says whether the session waits
    /// for `session/ready` / `session/creationFailed`.
    fn start(
        &self,
        key: &SessionKey,
        working_directory: Option<&str>,
        sink: Arc<dyn ChatSink>,
        start: agent_link::Start,
    ) -> Result<mpsc::UnboundedSender<Prompt>, String> {
        let dirs = self
            .sandboxes
            .workspaces()
            .session(&key.tenant, &key.host, &key.session, working_directory)
            .map_err(|error| error.to_string())?;
        let listing = Listing {
            base: self.info_with(None),
            reported: self.reported_models.clone(),
            settings: self.reported_settings.clone(),
        };
        let worker = SessionWorker::spawn(
            self.config.clone(),
            self.sandboxes.clone(),
            key.clone(),
            dirs,
            sink,
            start,
            listing,
            self.timeouts,
        );
        let prompts = worker.prompts();
        if let Some(old) = self.sessions.lock().insert(key.clone(), worker) {
            old.stop();
        }
        Ok(prompts)
    }
}

impl AcpProvider {
    /// The agent as listed: the configured models, or those the agent reported.
    fn info_with(&self, reported: Option<Vec<SessionModelInfo>>) -> AgentInfo {
        let mut info = agent_info(&self.config);
        if let Some(reported) = reported {
            info.models = reported;
        }
        info
    }
}

impl Provider for AcpProvider {
    fn info(&self) -> AgentInfo {
        self.info_with(self.reported_models.lock().clone())
    }

    fn session_config_schema(&self) -> Option<SessionConfigSchema> {
        self.reported_settings.lock().clone()
    }

    fn workspace_root(&self) -> Option<std::path::PathBuf> {
        Some(self.sandboxes.workspaces().root().to_path_buf())
    }

    fn create_session(&self, request: SessionRequest, sink: Arc<dyn ChatSink>) -> SessionStart {
        let key = SessionKey {
            tenant: request.tenant.clone(),
            host: request.host.clone(),
            session: request.session.clone(),
        };
        match self.start(
            &key,
            request.working_directory.as_deref(),
            sink,
            agent_link::Start::New {
                branch: request.branch.clone(),
            },
        ) {
            Ok(_) => SessionStart::Pending,
            Err(message) => SessionStart::Refused(message),
        }
    }

    fn start_turn(&self, turn: TurnRequest, sink: Arc<dyn ChatSink>) -> TurnHandle {
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let handle = TurnHandle::new(control_tx);
        let key = SessionKey {
            tenant: turn.tenant.clone(),
            host: turn.host.clone(),
            session: turn.session.clone(),
        };
        let live = self
            .sessions
            .lock()
            .get(&key)
            .map(SessionWorker::prompts)
            .filter(|prompts| !prompts.is_closed());
        // After a restart (or the agent's exit) the session has no agent: start a fresh one.
        let prompts = match live {
            Some(prompts) => Ok(prompts),
            None => self.start(
                &key,
                turn.working_directory.as_deref(),
                sink.clone(),
                agent_link::Start::Continue(
                    turn.agent_state
                        .as_ref()
                        .and_then(|state| state.get("acpSessions"))
                        .and_then(|sessions| sessions.as_object())
                        .map(|sessions| {
                            sessions
                                .iter()
                                .filter_map(|(chat, id)| Some((chat.clone(), id.as_str()?.to_string())))
                                .collect()
                        })
                        .unwrap_or_default(),
                ),
            ),
        };
        let prompt = Prompt {
            chat: turn.chat.clone(),
            turn_id: turn.turn_id.clone(),
            text: turn.prompt.clone(),
            context: turn.context.clone(),
            fresh: turn.fresh,
            attachments: turn.attachments.clone(),
            attached: vec![],
            model: turn.model.clone(),
            config: turn.config.clone(),
            control: control_rx,
            sink: sink.clone(),
        };
        match prompts {
            Ok(prompts) => {
                if let Err(mpsc::error::SendError(prompt)) = prompts.send(prompt) {
                    agent_link::fail_turn(&prompt, "agentExited", "the agent process is not running");
                }
            }
            Err(message) => agent_link::fail_turn(&prompt, "agentUnavailable", &message),
        }
        handle
    }

    fn runs_terminals(&self) -> bool {
        true
    }

    fn start_terminal(&self, request: TerminalRequest, sink: Arc<dyn ChatSink>) -> TerminalStarted {
        self.start_shell(request, sink)
    }

    fn terminal_input(&self, terminal: &TerminalKey, data: &str) {
        self.shells.input(terminal, data);
    }

    fn terminal_resized(&self, terminal: &TerminalKey, cols: i64, rows: i64) {
        self.shells.resize(terminal, cols, rows);
    }

    fn kill_terminal(&self, terminal: &TerminalKey) {
        self.shells.kill(terminal);
    }

    fn adopt_terminal(
        &self,
        terminal: &TerminalKey,
        session: &str,
        sink: Arc<dyn ChatSink>,
    ) -> TerminalStarted {
        crate::provider::terminal_answer(
            self.shells
                .adopt(terminal, session, sink)
                .map_err(|error| error.to_string()),
        )
    }

    fn dispose_session(&self, tenant: &str, host: &str, session: &str) {
        let key = SessionKey {
            tenant: tenant.to_string(),
            host: host.to_string(),
            session: session.to_string(),
        };
        self.shells.dispose_session(&key);
        let worker = self.sessions.lock().remove(&key);
        let sandboxes = self.sandboxes.clone();
        let (tenant, host, session) = (tenant.to_string(), host.to_string(), session.to_string());
        // Its directories and cgroup go once its sandboxes were reaped (nothing writes there any more).
        let dispose = async move {
            if let Some(worker) = worker {
                if !worker.stop_and_wait(DISPOSE_PATIENCE).await {
                    tracing::warn!(%tenant, %session, "a disposed session's sandboxes outlived their kill");
                }
            }
            sandboxes.dispose(&tenant, &host, &session);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(dispose)),
            Err(_) => tracing::warn!("a session was disposed outside the runtime: its directories stay"),
        }
    }
}

impl AcpProvider {
    /// [`Provider::start_terminal`]: started in the background, answered when the shell runs.
    fn start_shell(&self, request: TerminalRequest, sink: Arc<dyn ChatSink>) -> TerminalStarted {
        let (answer, started) = tokio::sync::oneshot::channel();
        let shells = self.shells.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move {
                let _ = answer.send(
                    shells
                        .start(request, sink)
                        .await
                        .map_err(|error| error.to_string()),
                );
            })),
            Err(_) => {
                return crate::provider::terminal_answer(Err("no runtime to start a terminal in".into()))
            }
        }
        started
    }
}

/// How long a disposed session's directories wait for its sandboxes to be reaped.
const DISPOSE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

impl Drop for AcpProvider {
    fn drop(&mut self) {
        for (_, worker) in self.sessions.lock().drain() {
            worker.stop();
        }
    }
}
