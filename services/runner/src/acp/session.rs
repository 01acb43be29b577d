//! The agent process of one session: spawned with exactly its allowed environment, initialized, given an ACP
//! session in the session's working directory, then prompted one turn at a time.
//!
//! ACP handlers only forward what arrives (updates, permission requests) into channels: nothing waits for a
//! user inside a handler. The worker task owns the connection; stopping it (dispose, relay shutdown) drops
//! the connection, which kills the agent's process group.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, FileSystemCapabilities, InitializeRequest,
    NewSessionRequest, PromptRequest, ReadTextFileRequest, ReadTextFileResponse, RequestPermissionRequest,
    RequestPermissionResponse, SessionId, SessionNotification, TextContent, WriteTextFileRequest,
    WriteTextFileResponse,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{AcpAgent, AcpAgentConfig, Agent, Client};
use ahp_types::actions::{SessionCreationFailedAction, SessionReadyAction, StateAction};
use ahp_types::state::ErrorInfo;
use tokio::sync::mpsc;

use super::config::AgentConfig;
use super::turn::TurnMapper;
use crate::provider::{ChatSink, TurnControl};

/// How often streamed text is flushed while the agent keeps sending chunks.
const COALESCE_EVERY: Duration = Duration::from_millis(40);
/// How long an agent may take to stop after `session/cancel` before the turn ends without it.
const CANCEL_PATIENCE: Duration = Duration::from_secs(10);

/// One turn to run.
pub struct Prompt {
    pub chat: String,
    pub turn_id: String,
    pub text: String,
    pub control: mpsc::UnboundedReceiver<TurnControl>,
    pub sink: Arc<dyn ChatSink>,
}

/// End a turn that could not reach its agent (emitted from a task: the host may hold its lock now).
pub fn fail_turn(prompt: &Prompt, error_type: &str, message: &str) {
    let mut mapper = TurnMapper::new(prompt.chat.clone(), prompt.turn_id.clone(), prompt.sink.clone());
    let (error_type, message) = (error_type.to_string(), message.to_string());
    tokio::spawn(async move { mapper.fail(&error_type, &message, true) });
}

/// The worker of one session's agent.
pub struct SessionWorker {
    prompts: mpsc::UnboundedSender<Prompt>,
    task: tokio::task::JoinHandle<()>,
}

impl SessionWorker {
    pub fn spawn(
        config: Arc<AgentConfig>,
        cwd: PathBuf,
        session: String,
        sink: Arc<dyn ChatSink>,
        announce: bool,
    ) -> SessionWorker {
        let (prompts, queue) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let announcer = Announcer {
                session: session.clone(),
                sink: sink.clone(),
                pending: announce,
            };
            run(config, cwd, announcer, queue).await;
        });
        SessionWorker { prompts, task }
    }

    pub fn prompts(&self) -> mpsc::UnboundedSender<Prompt> {
        self.prompts.clone()
    }

    /// Stop the agent: its connection is dropped, which kills its process group.
    pub fn stop(self) {
        self.task.abort();
    }
}

/// Says once whether the session could be created.
struct Announcer {
    session: String,
    sink: Arc<dyn ChatSink>,
    pending: bool,
}

impl Announcer {
    fn ready(&mut self) {
        if std::mem::take(&mut self.pending) {
            self.sink
                .emit(&self.session, StateAction::SessionReady(SessionReadyAction {}));
        }
    }

    fn failed(&mut self, error_type: &str, message: String) {
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

type Permission = (RequestPermissionRequest, Responder<RequestPermissionResponse>);

async fn run(
    config: Arc<AgentConfig>,
    cwd: PathBuf,
    mut announcer: Announcer,
    mut queue: mpsc::UnboundedReceiver<Prompt>,
) {
    let env = match config.environment(|name| std::env::var(name).ok()) {
        Ok(env) => env,
        Err(error) => return announcer.failed("agentConfiguration", error.to_string()),
    };
    // `env -i` gives the agent exactly its allowed environment (the ACP crate's spawner inherits ours);
    // `--chdir` starts it in the session's directory.
    let agent = AcpAgent::new(
        AcpAgentConfig::new("env")
            .arg("-i")
            .arg(format!("--chdir={}", cwd.display()))
            .args(env.iter().map(|(name, value)| format!("{name}={value}")))
            .arg(config.command.clone())
            .args(config.args.clone()),
    );
    let (read_root, write_root) = (cwd.clone(), cwd.clone());
    let (updates_tx, mut updates) = mpsc::unbounded_channel::<SessionNotification>();
    let (permissions_tx, mut permissions) = mpsc::unbounded_channel::<Permission>();
    let session_uri = announcer.session.clone();
    let connection = Client
        .v1()
        .name("ahp-relay")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                let _ = updates_tx.send(notification);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest,
                        responder: Responder<RequestPermissionResponse>,
                        _cx| {
                // Parked until a device answers; never awaited here.
                let _ = permissions_tx.send((request, responder));
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ReadTextFileRequest, responder: Responder<ReadTextFileResponse>, _cx| {
                match super::fs::read(&read_root, &request.path, request.line, request.limit).await {
                    Ok(content) => responder.respond(ReadTextFileResponse::new(content)),
                    Err(error) => responder.respond_with_error(refused(error)),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: WriteTextFileRequest, responder: Responder<WriteTextFileResponse>, _cx| {
                match super::fs::write(&write_root, &request.path, &request.content).await {
                    Ok(()) => responder.respond(WriteTextFileResponse::new()),
                    Err(error) => responder.respond_with_error(refused(error)),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(agent, async |cx: ConnectionTo<Agent>| {
            let initialized = cx
                .send_request(
                    InitializeRequest::new(ProtocolVersion::V1).client_capabilities(
                        ClientCapabilities::new().fs(FileSystemCapabilities::new()
                            .read_text_file(true)
                            .write_text_file(true)),
                    ),
                )
                .block_task()
                .await;
            if let Err(error) = initialized {
                announcer.failed("agentInitialize", error.to_string());
                return Ok(());
            }
            let created = cx
                .send_request(NewSessionRequest::new(cwd.clone()))
                .block_task()
                .await;
            let session_id = match created {
                Ok(created) => created.session_id,
                Err(error) => {
                    announcer.failed("agentSessionNew", error.to_string());
                    return Ok(());
                }
            };
            announcer.ready();
            while let Some(prompt) = queue.recv().await {
                run_turn(&cx, &session_id, prompt, &mut updates, &mut permissions).await;
            }
            Ok(())
        })
        .await;
    if let Err(error) = connection {
        announcer.failed("agentExited", error.to_string());
        tracing::warn!(session = %session_uri, %error, "the agent's connection ended");
    }
    // Turns queued for an agent that is gone end with an error (resumable: the next prompt starts one).
    queue.close();
    while let Some(prompt) = queue.recv().await {
        fail_turn(&prompt, "agentExited", "the agent process exited");
    }
}

/// Prompt the agent with one turn and map everything it sends until the prompt answers.
async fn run_turn(
    cx: &ConnectionTo<Agent>,
    session_id: &SessionId,
    mut prompt: Prompt,
    updates: &mut mpsc::UnboundedReceiver<SessionNotification>,
    permissions: &mut mpsc::UnboundedReceiver<Permission>,
) {
    let mut mapper = TurnMapper::new(prompt.chat.clone(), prompt.turn_id.clone(), prompt.sink.clone());
    let reply = cx
        .send_request(PromptRequest::new(
            session_id.clone(),
            vec![ContentBlock::Text(TextContent::new(prompt.text.clone()))],
        ))
        .block_task();
    tokio::pin!(reply);
    let mut flush = tokio::time::interval(COALESCE_EVERY);
    let mut cancelled: Option<tokio::time::Instant> = None;
    let mut control_open = true;
    loop {
        let cancel_deadline = cancelled.map(|at| at + CANCEL_PATIENCE);
        tokio::select! {
            biased;
            result = &mut reply => {
                // Updates sent before the answer are in the channel already: map them first.
                while let Ok(notification) = updates.try_recv() {
                    if &notification.session_id == session_id {
                        mapper.update(notification.update);
                    }
                }
                match result {
                    Ok(response) => mapper.finish(response.stop_reason),
                    Err(error) => mapper.fail("agentError", &error.to_string(), false),
                }
                return;
            }
            Some(notification) = updates.recv() => {
                if &notification.session_id == session_id {
                    mapper.update(notification.update);
                }
            }
            Some((request, responder)) = permissions.recv() => {
                if cancelled.is_some() {
                    mapper.permission(request, responder);
                    mapper.cancel_permissions();
                } else {
                    mapper.permission(request, responder);
                }
            }
            control = prompt.control.recv(), if control_open => match control {
                Some(TurnControl::ToolCallConfirmed { tool_call_id, approved, selected_option_id }) => {
                    mapper.confirmed(&tool_call_id, approved, selected_option_id.as_deref());
                }
                Some(TurnControl::Cancelled) | None => {
                    control_open = control.is_some();
                    if cancelled.is_none() {
                        cancelled = Some(tokio::time::Instant::now());
                        if let Err(error) = cx.send_notification(CancelNotification::new(session_id.clone())) {
                            tracing::warn!(%error, "could not send session/cancel");
                        }
                        mapper.cancel_permissions();
                    }
                }
                Some(_) => {}
            },
            () = sleep_until(cancel_deadline) => {
                mapper.fail("agentDidNotStop", "the agent did not stop after being cancelled", true);
                return;
            }
            _ = flush.tick(), if mapper.has_pending_text() => mapper.flush(),
        }
    }
}

/// Resolves at `deadline`, or never without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// A refused file operation, as the agent sees it.
fn refused(error: super::fs::FsError) -> agent_client_protocol::Error {
    tracing::info!(%error, "an agent's file operation was refused");
    agent_client_protocol::Error::invalid_params().data(error.to_string())
}
