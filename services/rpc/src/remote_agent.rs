//! An agent hosted on runners, as the shard's providers see it ([`RemoteAgent`]): each call placed on a runner
//! through the pool, a turn that cannot be placed ended with why.

use std::sync::Arc;

use ahp_types::state::AgentInfo;
use relay_runner::acp::turn::TurnMapper;
use relay_runner::acp::SessionKey;
use relay_runner::{
    ChatSink, Provider, SessionRequest, SessionStart, TerminalKey, TerminalRequest, TerminalStarted,
    TurnControl, TurnHandle, TurnRequest,
};
use tokio::sync::{mpsc, oneshot};

use crate::pb;
use crate::placement::*;

/// An agent of the agents file, run by the registered runners.
pub struct RemoteAgent {
    info: AgentInfo,
    pool: Arc<RunnerPool>,
}

impl RemoteAgent {
    /// `info` is how the agent is listed until a runner reports more (e.g. its models).
    pub fn new(info: AgentInfo, pool: Arc<RunnerPool>) -> Self {
        Self { info, pool }
    }
}

/// End a turn that could not be placed (from a task: the host holds its lock while starting a turn).
pub(crate) fn fail_later(sink: Arc<dyn ChatSink>, request: &TurnRequest, error: PlacementError) {
    let mut mapper = TurnMapper::new(request.chat.clone(), request.turn_id.clone(), sink);
    tokio::spawn(async move { mapper.fail("agentUnavailable", &error.to_string(), true) });
}

impl Provider for RemoteAgent {
    fn info(&self) -> AgentInfo {
        self.pool
            .listings
            .lock()
            .get(&self.info.provider)
            .cloned()
            .unwrap_or_else(|| self.info.clone())
    }

    fn session_config_schema(&self) -> Option<ahp_types::state::SessionConfigSchema> {
        self.pool.settings.lock().get(&self.info.provider).cloned()
    }

    fn workspace_root(&self) -> Option<std::path::PathBuf> {
        self.pool.workspace_root(&self.info.provider)
    }

    fn create_session(&self, request: SessionRequest, sink: Arc<dyn ChatSink>) -> SessionStart {
        match self.pool.create_session(&self.info.provider, &request, &sink) {
            Ok(()) => SessionStart::Pending,
            Err(error) => SessionStart::Refused(error.to_string()),
        }
    }

    fn start_turn(&self, request: TurnRequest, sink: Arc<dyn ChatSink>) -> TurnHandle {
        let (control_tx, mut control_rx) = mpsc::unbounded_channel();
        let handle = TurnHandle::new(control_tx);
        match self.pool.start_turn(&self.info.provider, &request, &sink) {
            Ok(turn) => {
                let pool = self.pool.clone();
                tokio::spawn(async move {
                    while let Some(control) = control_rx.recv().await {
                        let ended = matches!(control, TurnControl::Cancelled);
                        pool.control(turn, &control);
                        if ended {
                            break;
                        }
                    }
                    pool.control(turn, &TurnControl::Cancelled);
                });
            }
            Err(error) => fail_later(sink, &request, error),
        }
        handle
    }

    fn runs_terminals(&self) -> bool {
        true
    }

    fn start_terminal(&self, request: TerminalRequest, sink: Arc<dyn ChatSink>) -> TerminalStarted {
        match self.pool.start_terminal(&self.info.provider, &request, &sink) {
            Ok(answered) => answered,
            Err(error) => relay_runner::provider::terminal_answer(Err(error.to_string())),
        }
    }

    fn terminal_input(&self, terminal: &TerminalKey, data: &str) {
        self.pool.terminal_work(
            &self.info.provider,
            terminal,
            pb::terminal_work::Work::Input(data.to_string()),
        );
    }

    fn terminal_resized(&self, terminal: &TerminalKey, cols: i64, rows: i64) {
        self.pool.terminal_work(
            &self.info.provider,
            terminal,
            pb::terminal_work::Work::Resize(pb::TerminalSize { cols, rows }),
        );
    }

    fn kill_terminal(&self, terminal: &TerminalKey) {
        self.pool
            .terminal_work(&self.info.provider, terminal, pb::terminal_work::Work::Kill(true));
    }

    fn runs_elsewhere(&self) -> bool {
        true
    }

    fn adopt_terminal(
        &self,
        terminal: &TerminalKey,
        session: &str,
        sink: Arc<dyn ChatSink>,
    ) -> TerminalStarted {
        let (answer, answered) = oneshot::channel();
        let adoption = self.pool.clone().adopt_terminal(
            self.info.provider.clone(),
            terminal.clone(),
            session.to_string(),
            sink,
        );
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move {
                let _ = answer.send(adoption.await);
            })),
            Err(_) => return relay_runner::provider::terminal_answer(Err("no runtime".into())),
        }
        answered
    }

    fn dispose_session(&self, tenant: &str, host: &str, session: &str) {
        self.pool.dispose_session(&SessionKey {
            tenant: tenant.to_string(),
            host: host.to_string(),
            session: session.to_string(),
        });
    }
}
