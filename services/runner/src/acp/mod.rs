//! ACP agents as AHP providers: the relay is the ACP *client* and the AHP *host*.
//!
//! Each session gets its own agent subprocess ([`session`]), started by `createSession` in the session's
//! working directory under the tenant's part of the workspace ([`workspace`]), with exactly the environment
//! its configuration allows ([`config`]). Its turns are mapped both ways by [`turn`]; the files it reads and
//! writes through the relay stay inside its working directory ([`fs`]). Disposing the session (or the relay
//! stopping) kills the agent's process group.

pub mod config;
pub mod fs;
pub mod session;
pub mod turn;
pub mod workspace;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use ahp_types::state::{AgentInfo, SessionModelInfo};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::provider::{ChatSink, Provider, SessionRequest, SessionStart, TurnHandle, TurnRequest};
pub use config::{AgentConfig, AgentConfigError, AgentsFile};
use session::{Prompt, SessionWorker};

/// One configured ACP agent, serving every session created with its id.
pub struct AcpProvider {
    config: Arc<AgentConfig>,
    workspace_root: PathBuf,
    sessions: Arc<Mutex<HashMap<String, SessionWorker>>>,
}

impl AcpProvider {
    pub fn new(config: AgentConfig, workspace_root: PathBuf) -> Self {
        Self {
            config: Arc::new(config),
            workspace_root,
            sessions: Arc::default(),
        }
    }

    /// Every agent of an agents file.
    pub fn from_file(file: &AgentsFile) -> Vec<AcpProvider> {
        file.agents
            .iter()
            .map(|agent| AcpProvider::new(agent.clone(), file.workspace_root.clone()))
            .collect()
    }

    /// Start the agent process of a session (in the background); `announce` says whether the session waits
    /// for `session/ready` / `session/creationFailed`.
    fn start(
        &self,
        session: &str,
        tenant: &str,
        working_directory: Option<&str>,
        sink: Arc<dyn ChatSink>,
        announce: bool,
    ) -> Result<mpsc::UnboundedSender<Prompt>, String> {
        let cwd = workspace::session_directory(&self.workspace_root, tenant, session, working_directory)
            .map_err(|error| error.to_string())?;
        let worker = SessionWorker::spawn(self.config.clone(), cwd, session.to_string(), sink, announce);
        let prompts = worker.prompts();
        if let Some(old) = self.sessions.lock().insert(session.to_string(), worker) {
            old.stop();
        }
        Ok(prompts)
    }
}

impl Provider for AcpProvider {
    fn info(&self) -> AgentInfo {
        AgentInfo {
            provider: self.config.id.clone(),
            display_name: self.config.display_name.clone(),
            description: self.config.description.clone(),
            models: self
                .config
                .models
                .iter()
                .filter_map(|model| {
                    serde_json::from_value::<SessionModelInfo>(serde_json::json!({
                        "id": model, "name": model,
                    }))
                    .ok()
                })
                .collect(),
            protected_resources: None,
            customizations: None,
            capabilities: None,
        }
    }

    fn create_session(&self, request: SessionRequest, sink: Arc<dyn ChatSink>) -> SessionStart {
        match self.start(
            &request.session,
            &request.tenant,
            request.working_directory.as_deref(),
            sink,
            true,
        ) {
            Ok(_) => SessionStart::Pending,
            Err(message) => SessionStart::Refused(message),
        }
    }

    fn start_turn(&self, turn: TurnRequest, sink: Arc<dyn ChatSink>) -> TurnHandle {
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let handle = TurnHandle::new(control_tx);
        let live = self
            .sessions
            .lock()
            .get(&turn.session)
            .map(SessionWorker::prompts)
            .filter(|prompts| !prompts.is_closed());
        // After a restart (or the agent's exit) the session has no agent: start a fresh one.
        let prompts = match live {
            Some(prompts) => Ok(prompts),
            None => self.start(
                &turn.session,
                &turn.tenant,
                turn.working_directory.as_deref(),
                sink.clone(),
                false,
            ),
        };
        let prompt = Prompt {
            chat: turn.chat.clone(),
            turn_id: turn.turn_id.clone(),
            text: turn.prompt.clone(),
            control: control_rx,
            sink: sink.clone(),
        };
        match prompts {
            Ok(prompts) => {
                if let Err(mpsc::error::SendError(prompt)) = prompts.send(prompt) {
                    session::fail_turn(&prompt, "agentExited", "the agent process is not running");
                }
            }
            Err(message) => session::fail_turn(&prompt, "agentUnavailable", &message),
        }
        handle
    }

    fn dispose_session(&self, session: &str) {
        if let Some(worker) = self.sessions.lock().remove(session) {
            worker.stop();
        }
    }
}

impl Drop for AcpProvider {
    fn drop(&mut self) {
        for (_, worker) in self.sessions.lock().drain() {
            worker.stop();
        }
    }
}
