//! A session's link to its agent, shared by the worker and its turns: the prompt of one turn ([`Prompt`]), how
//! the agent starts ([`Start`], [`Timeouts`]), where it runs ([`Place`]), what it asks back ([`AgentAsks`]),
//! whether the session could be created ([`Announcer`]), and the ACP session opened or loaded for a chat
//! ([`open`], [`load`], [`Reported`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::v1::schema::{
    ContentBlock, CreateElicitationRequest, CreateElicitationResponse, LoadSessionRequest, NewSessionRequest,
    RequestPermissionRequest, RequestPermissionResponse, SessionConfigOption, SessionId, SessionModeState,
    SessionNotification,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::Agent;
use ahp_types::actions::{SessionCreationFailedAction, SessionReadyAction, StateAction};
use ahp_types::state::ErrorInfo;
use tokio::sync::mpsc;

use super::turn::TurnMapper;
use crate::provider::{ChatSink, TurnControl};

/// How a session's agent starts.
#[derive(Debug, Clone)]
pub enum Start {
    /// For a new AHP session: `session/ready` or `session/creationFailed` tell how it went. Its working directory
    /// is switched to `branch` (a git repository's) before the agent starts.
    New { branch: Option<String> },
    /// For an existing session whose agent is gone (a restart, an idle stop): continue each chat's ACP session
    /// (chat → ACP session id) when the agent can load it (`session/load`, its replay suppressed: the relay
    /// has the history); otherwise start afresh and say so in the chat.
    Continue(HashMap<String, String>),
}

/// One turn to run.
pub struct Prompt {
    pub chat: String,
    pub turn_id: String,
    pub text: String,
    /// History to give the agent before the prompt ([`crate::TurnRequest::context`]).
    pub context: Option<String>,
    /// The chat's ACP session is not to be continued ([`crate::TurnRequest::fresh`]).
    pub fresh: bool,
    /// The message's attachments ([`crate::TurnRequest::attachments`])…
    pub attachments: Vec<crate::TurnAttachment>,
    /// …as the content blocks the agent takes (made by the worker, which knows what it accepts).
    pub attached: Vec<ContentBlock>,
    /// The model the user picked (`Message.model`): selected through the agent's model config option first.
    pub model: Option<String>,
    /// The session config's values (the agent's settings to apply first).
    pub config: Option<ahp_types::common::JsonObject>,
    pub control: mpsc::UnboundedReceiver<TurnControl>,
    pub sink: Arc<dyn ChatSink>,
}

/// End a turn that could not reach its agent (emitted from a task: the host may hold its lock now).
pub fn fail_turn(prompt: &Prompt, error_type: &str, message: &str) {
    let mut mapper = TurnMapper::new(prompt.chat.clone(), prompt.turn_id.clone(), prompt.sink.clone());
    let (error_type, message) = (error_type.to_string(), message.to_string());
    tokio::spawn(async move { mapper.fail(&error_type, &message, true) });
}

/// How long a session's agent may take.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Without a prompt for this long, the agent is stopped.
    pub idle: Duration,
    /// To answer `initialize`, then `session/new`.
    pub start: Duration,
}

impl Timeouts {
    pub(crate) fn start_message(&self, request: &str) -> String {
        format!(
            "the agent did not answer {request} within {}s (start_timeout_seconds)",
            self.start.as_secs()
        )
    }
}

/// Says once whether the session could be created.
pub(crate) struct Announcer {
    pub(crate) session: String,
    pub(crate) sink: Arc<dyn ChatSink>,
    pub(crate) pending: bool,
}

impl Announcer {
    pub(crate) fn ready(&mut self) {
        if std::mem::take(&mut self.pending) {
            self.sink
                .emit(&self.session, StateAction::SessionReady(SessionReadyAction {}));
        }
    }

    pub(crate) fn failed(&mut self, error_type: &str, message: String) {
        tracing::warn!(session = %self.session, error_type, %message, "the agent could not start the session");
        if std::mem::take(&mut self.pending) {
            self.sink.emit(
                &self.session,
                StateAction::SessionCreationFailed(SessionCreationFailedAction {
                    error: ErrorInfo {
                        error_type: error_type.into(),
                        message,
                        stack: None,
                        meta: None,
                    },
                }),
            );
        }
    }
}

pub(crate) type Permission = (RequestPermissionRequest, Responder<RequestPermissionResponse>);
pub(crate) type Elicitation = (CreateElicitationRequest, Responder<CreateElicitationResponse>);

/// What a turn receives from the agent besides its answer.
pub(crate) struct AgentAsks {
    pub(crate) updates: mpsc::UnboundedReceiver<SessionNotification>,
    pub(crate) permissions: mpsc::UnboundedReceiver<Permission>,
    pub(crate) elicitations: mpsc::UnboundedReceiver<Elicitation>,
}

/// Where a session's agent runs: its sandboxes, its tenant and its directories.
pub struct Place {
    pub sandboxes: Arc<super::sandboxes::Sandboxes>,
    pub tenant: String,
    pub dirs: super::workspace::SessionDirs,
    /// Upgraded and held by each task that owns one of the session's sandboxes until it reaped it (see
    /// [`super::session::SessionWorker::stop_and_wait`]); `None` once the session is being stopped.
    pub alive: mpsc::WeakSender<()>,
}

/// Said in the chat when an agent restarted without its earlier context.
pub(crate) const CONTEXT_RESET: &str =
    "The agent restarted and could not restore this chat's earlier context: it continues without it.";

/// Open a new ACP session in `cwd`: its id and config options.
pub(crate) async fn open(
    cx: &ConnectionTo<Agent>,
    cwd: &std::path::Path,
) -> Result<(SessionId, Reported), agent_client_protocol::Error> {
    let created = cx
        .send_request(NewSessionRequest::new(cwd.to_path_buf()))
        .block_task()
        .await?;
    let reported = Reported {
        options: created.config_options,
        modes: created.modes,
    };
    Ok((created.session_id, reported))
}

/// What an agent says about a session's settings when it opens or loads it.
pub struct Reported {
    pub(crate) options: Option<Vec<SessionConfigOption>>,
    pub(crate) modes: Option<SessionModeState>,
}

/// Load an earlier ACP session; the history the agent replays first is dropped (the relay has it).
pub(crate) async fn load(
    cx: &ConnectionTo<Agent>,
    id: &str,
    cwd: &std::path::Path,
    asks: &mut AgentAsks,
) -> Option<(SessionId, Reported)> {
    let loaded = cx
        .send_request(LoadSessionRequest::new(
            SessionId::new(id.to_string()),
            cwd.to_path_buf(),
        ))
        .block_task()
        .await;
    while asks.updates.try_recv().is_ok() {}
    match loaded {
        Ok(loaded) => Some((
            SessionId::new(id.to_string()),
            Reported {
                options: loaded.config_options,
                modes: loaded.modes,
            },
        )),
        Err(error) => {
            tracing::info!(%error, "the agent could not load its session; opening a new one");
            None
        }
    }
}
