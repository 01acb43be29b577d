//! The agent process of one session: started in the session's sandbox with exactly its allowed environment,
//! initialized, given an ACP session in the session's working directory, then prompted one turn at a time.
//!
//! ACP handlers only forward what arrives (updates, permission and elicitation requests) into channels:
//! nothing waits for a user inside a handler. What the agent says is bounded where it enters: its stdout is read
//! no faster than its tenant's output rate, in lines of at most [`MAX_LINE_BYTES`], and each turn keeps at most
//! its output budget ([`super::meter`]; past it the turn is cut with a note). The worker task owns the process;
//! stopping it (dispose, relay shutdown) kills the agent's whole sandbox.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ClientCapabilities, CreateElicitationRequest, CreateElicitationResponse, CreateTerminalRequest,
    CreateTerminalResponse, ElicitationCapabilities, FileSystemCapabilities, InitializeRequest,
    KillTerminalRequest, KillTerminalResponse, ReadTextFileRequest, ReadTextFileResponse,
    ReleaseTerminalRequest, ReleaseTerminalResponse, RequestPermissionRequest, RequestPermissionResponse,
    SessionNotification, SessionUpdate, TerminalId, TerminalOutputRequest, TerminalOutputResponse,
    WaitForTerminalExitRequest, WaitForTerminalExitResponse, WriteTextFileRequest, WriteTextFileResponse,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, ByteStreams, Client};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::agent_link::{
    fail_turn, open, AgentAsks, Announcer, Elicitation, Permission, Place, Prompt, Start, Timeouts,
};
use super::chat_sessions::{AgentMeta, ChatSessions, Opening};
use super::config::AgentConfig;
use super::prompt_turn::{run_turn, Bounds};
use super::session_git::switch_branch;
use super::start_failure::{describe_auth_methods, keep_tail, start_failure, unseen_hints};
use crate::provider::ChatSink;

/// The longest line (one ACP message) an agent may write.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// The worker of one session's agent.
pub struct SessionWorker {
    prompts: mpsc::UnboundedSender<Prompt>,
    task: tokio::task::JoinHandle<()>,
    /// Closes once the worker and every task that owns one of the session's sandboxes ended (each holds a
    /// [`Place::alive`] sender until it reaped its sandbox).
    gone: mpsc::Receiver<()>,
}

impl SessionWorker {
    #[allow(clippy::too_many_arguments)]
    pub fn spawn(
        config: Arc<AgentConfig>,
        sandboxes: Arc<super::sandboxes::Sandboxes>,
        key: super::session_key::SessionKey,
        dirs: super::workspace::SessionDirs,
        sink: Arc<dyn ChatSink>,
        start: Start,
        listing: super::listing::Listing,
        timeouts: Timeouts,
    ) -> SessionWorker {
        let (prompts, queue) = mpsc::unbounded_channel();
        let (alive, gone) = mpsc::channel(1);
        let task = tokio::spawn(async move {
            let announcer = Announcer {
                session: key.session.clone(),
                sink: sink.clone(),
                pending: matches!(start, Start::New { .. }),
            };
            let place = Place {
                sandboxes,
                tenant: key.tenant,
                dirs,
                alive: alive.downgrade(),
            };
            run(config, place, announcer, listing, start, timeouts, queue).await;
            drop(alive);
        });
        SessionWorker { prompts, task, gone }
    }

    pub fn prompts(&self) -> mpsc::UnboundedSender<Prompt> {
        self.prompts.clone()
    }

    /// Stop the agent: its connection is dropped, which kills its process group.
    pub fn stop(self) {
        self.task.abort();
    }

    /// [`SessionWorker::stop`], then wait (at most `patience`) until the session's sandboxes were reaped (their
    /// processes are killed with them). Whether they were.
    pub async fn stop_and_wait(mut self, patience: Duration) -> bool {
        self.task.abort();
        tokio::time::timeout(patience, async { while self.gone.recv().await.is_some() {} })
            .await
            .is_ok()
    }
}

async fn run(
    config: Arc<AgentConfig>,
    place: Place,
    mut announcer: Announcer,
    listing: super::listing::Listing,
    start: Start,
    timeouts: Timeouts,
    mut queue: mpsc::UnboundedReceiver<Prompt>,
) {
    let idle_timeout = timeouts.idle;
    let cwd: PathBuf = place.dirs.workspace.clone();
    let env = match config.environment(&place.tenant, |name| std::env::var(name).ok()) {
        Ok(env) => env,
        Err(error) => {
            announcer.failed("agentConfiguration", error.to_string());
            return fail_queued(queue, "agentConfiguration", &error.to_string()).await;
        }
    };
    let spec = place.sandboxes.spec(&place.dirs, &cwd, &config);
    if let Start::New { branch: Some(branch) } = &start {
        if let Err(why) = switch_branch(&place, &spec, branch).await {
            announcer.failed("branchUnavailable", why.clone());
            return fail_queued(queue, "branchUnavailable", &why).await;
        }
    }
    let (mut child, slot) = match place
        .sandboxes
        .start(&place.tenant, &spec, &config.command, &config.args, &env)
        .await
    {
        Ok(started) => started,
        Err(error) => {
            let kind = match error {
                super::sandboxes::StartError::Quota(_) => "quotaExceeded",
                super::sandboxes::StartError::Spawn(_) => "agentStart",
            };
            announcer.failed(kind, error.to_string());
            return fail_queued(queue, kind, &error.to_string()).await;
        }
    };
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        announcer.failed("agentStart", "the agent's pipes were not opened".into());
        return fail_queued(queue, "agentStart", "the agent's pipes were not opened").await;
    };
    // The process is watched by a task of its own: its exit ends the session's worker (a dead agent must not
    // keep the session's prompts), and dropping `_kill` (the worker stopping) kills its sandbox.
    let (kill, killed) = tokio::sync::oneshot::channel::<()>();
    let (exit_tx, mut exited) = tokio::sync::watch::channel(None::<String>);
    let unseen = place.sandboxes.unseen_paths(&spec, &config, &env);
    let reaping = place.alive.upgrade();
    tokio::spawn(async move {
        let _reaping = reaping;
        let status = tokio::select! {
            status = child.wait() => status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()),
            _ = killed => {
                let _ = child.kill().await;
                "stopped".to_string()
            }
        };
        let _ = exit_tx.send(Some(status));
    });
    let _kill = kill;
    let stderr_tail = Arc::new(Mutex::new(std::collections::VecDeque::<u8>::new()));
    let (start_tail, start_exited) = (stderr_tail.clone(), exited.clone());
    tokio::spawn(keep_tail(
        super::quota::ThrottledReader::new(stderr, slot.output(), None),
        stderr_tail.clone(),
        announcer.session.clone(),
    ));
    let transport = {
        use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
        let stdout = super::quota::ThrottledReader::new(stdout, slot.output(), Some(MAX_LINE_BYTES))
            .waiting_for(announcer.sink.clone());
        ByteStreams::new(stdin.compat_write(), stdout.compat())
    };
    let meter = Arc::new(super::meter::OutputMeter::new(
        place.sandboxes.config().output_bytes_per_turn.max(1024),
    ));
    let owner = place.dirs.user;
    let (write_quotas, write_tenant) = (place.sandboxes.quotas().clone(), place.tenant.clone());
    let anchor = place.sandboxes.anchor().to_path_buf();
    let (read_anchor, write_anchor) = (anchor.clone(), anchor);
    let terminals = Arc::new(super::terminal::Terminals::new(
        place,
        announcer.session.clone(),
        announcer.sink.clone(),
        config.clone(),
        env.clone(),
        meter.clone(),
    ));
    let agent_meta = Arc::new(Mutex::new(AgentMeta::default()));
    let (commands_meta, commands_sink, commands_session) = (
        agent_meta.clone(),
        announcer.sink.clone(),
        announcer.session.clone(),
    );
    let room_sink = announcer.sink.clone();
    let (terminals_create, terminals_output, terminals_wait, terminals_kill, terminals_release) = (
        terminals.clone(),
        terminals.clone(),
        terminals.clone(),
        terminals.clone(),
        terminals.clone(),
    );
    let (read_root, write_root) = (cwd.clone(), cwd.clone());
    let (updates_tx, updates) = mpsc::unbounded_channel::<SessionNotification>();
    let (permissions_tx, permissions) = mpsc::unbounded_channel::<Permission>();
    let (elicitations_tx, elicitations) = mpsc::unbounded_channel::<Elicitation>();
    let mut asks = AgentAsks {
        updates,
        permissions,
        elicitations,
    };
    let session_uri = announcer.session.clone();
    let handler_meter = meter.clone();
    let (permission_meter, elicitation_meter) = (meter.clone(), meter.clone());
    let connection = Client
        .v1()
        .name("ahp-relay")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                // While the host's store is behind, the agent's next message waits in its pipe, not here.
                if let Some(room) = room_sink.room() {
                    room.await;
                }
                // Counted before it is kept: past the turn's budget (or between turns) it is dropped.
                if !handler_meter.admit(super::meter::update_bytes(&notification.update)) {
                    return Ok(());
                }
                // Slash commands belong to the session, whenever they come (often right after session/new).
                if let SessionUpdate::AvailableCommandsUpdate(update) = &notification.update {
                    commands_meta.lock().commands_changed(
                        &update.available_commands,
                        commands_sink.as_ref(),
                        &commands_session,
                    );
                    return Ok(());
                }
                let _ = updates_tx.send(notification);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest,
                        responder: Responder<RequestPermissionResponse>,
                        _cx| {
                // Counted like any output (a flood of questions is cut with the turn), then parked until a
                // device answers; never awaited here.
                if !permission_meter.admit(super::meter::update_bytes(&request)) {
                    return responder.respond_with_error(over_budget());
                }
                let _ = permissions_tx.send((request, responder));
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: CreateElicitationRequest,
                        responder: Responder<CreateElicitationResponse>,
                        _cx| {
                if !elicitation_meter.admit(super::meter::update_bytes(&request)) {
                    return responder.respond_with_error(over_budget());
                }
                let _ = elicitations_tx.send((request, responder));
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ReadTextFileRequest, responder: Responder<ReadTextFileResponse>, _cx| {
                match super::fs::read(&read_anchor, &read_root, &request.path, request.line, request.limit).await {
                    Ok(content) => responder.respond(ReadTextFileResponse::new(content)),
                    Err(error) => responder.respond_with_error(refused(error)),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: WriteTextFileRequest, responder: Responder<WriteTextFileResponse>, _cx| {
                // The relay's own writes count toward the tenant's workspace quota at once (they are not bound by
                // the sandbox's file-size limit).
                if let Some(refusal) = write_quotas.workspace_refusal(&write_tenant) {
                    return responder.respond_with_error(
                        agent_client_protocol::Error::invalid_request().data(refusal.to_string()),
                    );
                }
                write_quotas.written(&write_tenant, request.content.len() as u64);
                match super::fs::write(&write_anchor, &write_root, &request.path, &request.content, owner).await {
                    Ok(()) => responder.respond(WriteTextFileResponse::new()),
                    Err(error) => responder.respond_with_error(refused(error)),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: CreateTerminalRequest, responder: Responder<CreateTerminalResponse>, _cx| {
                match terminals_create.create(request).await {
                    Ok(uri) => responder.respond(CreateTerminalResponse::new(TerminalId::new(uri))),
                    Err(error) => responder.respond_with_error(terminal_refused(error)),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: TerminalOutputRequest, responder: Responder<TerminalOutputResponse>, _cx| {
                match terminals_output.get(&request.terminal_id.0) {
                    Ok(terminal) => {
                        let (output, truncated, exit) = terminal.output();
                        responder.respond(TerminalOutputResponse::new(output, truncated).exit_status(exit))
                    }
                    Err(error) => responder.respond_with_error(terminal_refused(error)),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: WaitForTerminalExitRequest,
                        responder: Responder<WaitForTerminalExitResponse>,
                        _cx| {
                match terminals_wait.get(&request.terminal_id.0) {
                    // Answered when the command exits; never awaited here.
                    Ok(terminal) => {
                        tokio::spawn(async move {
                            let status = terminal.wait().await;
                            let _ = responder.respond(WaitForTerminalExitResponse::new(status));
                        });
                        Ok(())
                    }
                    Err(error) => responder.respond_with_error(terminal_refused(error)),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: KillTerminalRequest, responder: Responder<KillTerminalResponse>, _cx| {
                match terminals_kill.get(&request.terminal_id.0) {
                    Ok(terminal) => {
                        terminal.kill();
                        responder.respond(KillTerminalResponse::new())
                    }
                    Err(error) => responder.respond_with_error(terminal_refused(error)),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ReleaseTerminalRequest,
                        responder: Responder<ReleaseTerminalResponse>,
                        _cx| {
                match terminals_release.release(&request.terminal_id.0) {
                    Ok(()) => responder.respond(ReleaseTerminalResponse::new()),
                    Err(error) => responder.respond_with_error(terminal_refused(error)),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async |cx: ConnectionTo<Agent>| {
            let initialized = cx
                .send_request(
                    InitializeRequest::new(ProtocolVersion::V1).client_capabilities(
                        ClientCapabilities::new()
                            .fs(FileSystemCapabilities::new()
                                .read_text_file(true)
                                .write_text_file(true))
                            .terminal(true)
                            .elicitation(elicitation_capabilities()),
                    ),
                )
                .block_task();
            let initialized = match tokio::time::timeout(timeouts.start, initialized).await {
                Ok(Ok(initialized)) => initialized,
                Ok(Err(error)) => {
                    let said =
                        start_failure(&error.to_string(), start_exited.clone(), &start_tail, &unseen).await;
                    announcer.failed("agentInitialize", said);
                    return Ok(());
                }
                Err(_) => {
                    announcer.failed("agentStartTimeout", timeouts.start_message("initialize"));
                    return Ok(());
                }
            };
            let can_load = initialized.agent_capabilities.load_session;
            let accepts = initialized.agent_capabilities.prompt_capabilities.clone();
            let auth_methods = describe_auth_methods(&initialized.auth_methods);
            if !auth_methods.is_empty() {
                tracing::info!(agent = %config.id, methods = %auth_methods, "the agent offers authentication");
            }
            // Each chat's ACP session: those an earlier process of the agent opened (to load again), and
            // those of this process.
            let (mut sessions, restarted) = match &start {
                Start::New { .. } => (ChatSessions::default(), false),
                Start::Continue(stored) => (ChatSessions::continuing(stored.clone()), true),
            };
            // A new AHP session opens its first ACP session now: creation reports the agent's success or
            // failure. The first chat that prompts takes it.
            if !restarted {
                let Ok(opened) = tokio::time::timeout(timeouts.start, open(&cx, &cwd)).await else {
                    announcer.failed("agentStartTimeout", timeouts.start_message("session/new"));
                    return Ok(());
                };
                match opened {
                    Ok((id, reported)) => {
                        sessions.observe(&reported, &config.id, &listing, announcer.sink.as_ref());
                        sessions.primary = Some(id);
                    }
                    Err(error) => {
                        let mut message = error.to_string();
                        if !auth_methods.is_empty() {
                            // Tell whoever sees the failure what the agent would accept.
                            message.push_str(&format!(
                                " (the agent's authentication methods: {auth_methods}; give it their credentials \
                                 with `env` / `env_files` in the agents file)"
                            ));
                        }
                        announcer.failed("agentSessionNew", message);
                        return Ok(());
                    }
                }
            }
            announcer.ready();
            let opening = Opening {
                cwd: &cwd,
                can_load,
                agent: &config.id,
                listing: &listing,
                announcer: &announcer,
                agent_meta: &agent_meta,
                terminals: &terminals,
            };
            // Idle for too long: the agent stops (returning drops the connection, which kills its process
            // group); the next prompt starts it again and loads the chats' sessions.
            loop {
                let mut prompt = tokio::select! {
                    next = tokio::time::timeout(idle_timeout, queue.recv()) => match next {
                        Ok(Some(prompt)) => prompt,
                        _ => break,
                    },
                    // The agent exited (or was killed from inside its sandbox): this worker ends; the session's
                    // next prompt starts a new agent.
                    _ = exited.wait_for(Option::is_some) => break,
                };
                // The relay let go of what the agent had for this chat (a truncation, a fork or side chat told
                // its history): a new ACP session, told the context. Done first, whatever becomes of this turn.
                if prompt.fresh {
                    sessions.forget(&prompt.chat);
                }
                // Cancelled while it waited behind another chat's turn (its host let go of it): the agent never
                // hears of it.
                if prompt.control.is_closed() {
                    tracing::debug!(chat = %prompt.chat, turn = %prompt.turn_id, "a turn cancelled while queued");
                    continue;
                }
                if let Some(refusal) = terminals.workspace_refusal() {
                    fail_turn(&prompt, "quotaExceeded", &refusal);
                    continue;
                }
                // An attachment the agent cannot take ends the turn, named, before the agent sees the rest.
                match super::attachments::blocks(&prompt.attachments, &accepts) {
                    Ok(blocks) => prompt.attached = blocks,
                    Err(message) => {
                        fail_turn(&prompt, "attachmentNotSupported", &message);
                        continue;
                    }
                }
                let (chat_session, note) = match sessions.session_for(&cx, &prompt.chat, &opening, &mut asks).await {
                    Ok(opened) => opened,
                    Err((error_type, message)) => {
                        fail_turn(&prompt, error_type, &message);
                        continue;
                    }
                };
                if let Err((error_type, message)) = sessions.prepare(&cx, &chat_session, &prompt).await {
                    fail_turn(&prompt, error_type, &message);
                    continue;
                }
                meter.begin_turn();
                run_turn(
                    &cx,
                    &chat_session,
                    &session_uri,
                    prompt,
                    note,
                    &mut asks,
                    &terminals,
                    Bounds {
                        meter: &meter,
                        slot: &slot,
                    },
                )
                .await;
                meter.end_turn();
            }
            Ok(())
        })
        .await;
    if let Err(error) = connection {
        let status = exited
            .borrow()
            .clone()
            .unwrap_or_else(|| "still running".to_string());
        let tail = {
            let tail = stderr_tail.lock();
            String::from_utf8_lossy(&tail.iter().copied().collect::<Vec<u8>>())
                .trim()
                .to_string()
        };
        let mut message = if tail.is_empty() {
            format!("{error} (the agent: {status})")
        } else {
            format!("{error} (the agent: {status}; it said: {tail})")
        };
        message.push_str(&unseen_hints(&unseen));
        announcer.failed("agentExited", message.clone());
        tracing::warn!(session = %session_uri, %message, "the agent's connection ended");
    }
    // Stop the sandbox (whatever is left of it) before the slot is given back.
    drop(_kill);
    let _ = exited.wait_for(Option::is_some).await;
    drop(slot);
    // Turns queued for an agent that is gone end with an error (resumable: the next prompt starts one).
    fail_queued(queue, "agentExited", "the agent process exited").await;
}

/// End every turn still queued for an agent that is not running.
async fn fail_queued(mut queue: mpsc::UnboundedReceiver<Prompt>, error_type: &str, message: &str) {
    queue.close();
    while let Some(prompt) = queue.recv().await {
        fail_turn(&prompt, error_type, message);
    }
}

/// The answer to a request past the turn's output budget.
fn over_budget() -> agent_client_protocol::Error {
    agent_client_protocol::Error::invalid_request().data("the turn's output budget is spent")
}

fn terminal_refused(error: super::terminal::TerminalError) -> agent_client_protocol::Error {
    tracing::info!(%error, "an agent's terminal request was refused");
    agent_client_protocol::Error::invalid_params().data(error.to_string())
}

fn refused(error: super::fs::FsError) -> agent_client_protocol::Error {
    tracing::info!(%error, "an agent's file operation was refused");
    agent_client_protocol::Error::invalid_params().data(error.to_string())
}

/// Forms and URLs: both become AHP input requests.
fn elicitation_capabilities() -> Option<ElicitationCapabilities> {
    serde_json::from_value(serde_json::json!({"form": {}, "url": {}})).ok()
}
