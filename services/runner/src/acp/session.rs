//! The agent process of one session: started in the session's sandbox with exactly its allowed environment,
//! initialized, given an ACP session in the session's working directory, then prompted one turn at a time.
//!
//! ACP handlers only forward what arrives (updates, permission and elicitation requests) into channels:
//! nothing waits for a user inside a handler. What the agent says is bounded where it enters: its stdout is read
//! no faster than its tenant's output rate, in lines of at most [`MAX_LINE_BYTES`], and each turn keeps at most
//! its output budget ([`super::meter`]; past it the turn is cut with a note). The worker task owns the process;
//! stopping it (dispose, relay shutdown) kills the agent's whole sandbox.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ClientCapabilities, ContentBlock, CreateElicitationRequest, CreateElicitationResponse,
    CreateTerminalRequest, CreateTerminalResponse, ElicitationCapabilities, FileSystemCapabilities,
    InitializeRequest, KillTerminalRequest, KillTerminalResponse, LoadSessionRequest, NewSessionRequest,
    ReadTextFileRequest, ReadTextFileResponse, ReleaseTerminalRequest, ReleaseTerminalResponse,
    RequestPermissionRequest, RequestPermissionResponse, SessionConfigOption, SessionId, SessionModeState,
    SessionNotification, SessionUpdate, TerminalId, TerminalOutputRequest, TerminalOutputResponse,
    WaitForTerminalExitRequest, WaitForTerminalExitResponse, WriteTextFileRequest, WriteTextFileResponse,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, ByteStreams, Client};
use ahp_types::actions::{SessionCreationFailedAction, SessionReadyAction, StateAction};
use ahp_types::state::ErrorInfo;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::chat_sessions::{AgentMeta, ChatSessions, Opening};
use super::config::AgentConfig;
use super::prompt_turn::{run_turn, Bounds};
use super::turn::TurnMapper;
use crate::provider::{ChatSink, TurnControl};

/// The longest line (one ACP message) an agent may write.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// What is kept of an agent's stderr, for the message when it fails.
const STDERR_TAIL_BYTES: usize = 4096;

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
    fn start_message(&self, request: &str) -> String {
        format!(
            "the agent did not answer {request} within {}s (start_timeout_seconds)",
            self.start.as_secs()
        )
    }
}

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
        key: super::SessionKey,
        dirs: super::workspace::SessionDirs,
        sink: Arc<dyn ChatSink>,
        start: Start,
        listing: super::Listing,
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

/// Says once whether the session could be created.
pub(crate) struct Announcer {
    pub(crate) session: String,
    pub(crate) sink: Arc<dyn ChatSink>,
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
type Elicitation = (CreateElicitationRequest, Responder<CreateElicitationResponse>);

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
    /// [`SessionWorker::stop_and_wait`]); `None` once the session is being stopped.
    pub alive: mpsc::WeakSender<()>,
}

/// Switch the session's working directory (a git repository) to `branch`, in the session's own sandbox (the
/// agent's confinement), before its agent starts, with the configuration [`crate::git`] forces: nothing the
/// repository names runs.
async fn switch_branch(place: &Place, spec: &relay_sandbox::SandboxSpec, branch: &str) -> Result<(), String> {
    let valid = !branch.is_empty()
        && branch.len() <= 255
        && !branch.starts_with('-')
        && !branch.contains("..")
        && !branch
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c));
    if !valid {
        return Err(format!("{branch:?} is not a branch name"));
    }
    let failed = |why: String| format!("cannot switch to branch {branch}: {why}");
    // The drivers the repository defines, as git reads them (in the sandbox), each forced empty for the switch.
    let (listed, listing) = git_in_sandbox(
        place,
        spec,
        &crate::git::ForcedConfig::base(),
        crate::git::LIST_NAMES,
    )
    .await
    .map_err(failed)?;
    // A listing that failed or was cut could leave a driver unforced.
    listing.map_err(failed)?;
    if listed.len() >= LISTING_MAX {
        return Err(failed(
            "the repository's configuration is too large to check".into(),
        ));
    }
    if crate::git::ForcedConfig::names_unforceable(&listed) {
        return Err(failed(
            "the repository's configuration has names that are not UTF-8".into(),
        ));
    }
    let forced = crate::git::ForcedConfig::for_listed(&listed);
    let (_, status) = git_in_sandbox(place, spec, &forced, &["switch", branch])
        .await
        .map_err(failed)?;
    status.map_err(failed)
}

/// The most of a git's output read (a configuration's names); reaching it is an error for the listing.
const LISTING_MAX: usize = 1024 * 1024;
/// How long a git the session's start runs (listing the configuration, switching branch) may take.
const GIT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Run git with `args` and the `forced` configuration in the session's sandbox: its output (at most 1 MiB), and
/// whether it succeeded (else what it said).
async fn git_in_sandbox(
    place: &Place,
    spec: &relay_sandbox::SandboxSpec,
    forced: &crate::git::ForcedConfig,
    args: &[&str],
) -> Result<(Vec<u8>, Result<(), String>), String> {
    use tokio::io::AsyncReadExt;
    let mut env = forced.environment();
    env.insert("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into());
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    let (mut child, _slot) = place
        .sandboxes
        .start(&place.tenant, spec, "git", &args, &env)
        .await
        .map_err(|error| error.to_string())?;
    drop(child.stdin.take());
    let (mut out, mut said) = (Vec::new(), Vec::new());
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    // What is kept is bounded; the rest is read and dropped, so git never waits on a full pipe (a refused
    // switch lists every dirty file).
    let read_out = async {
        if let Some(mut stdout) = stdout {
            let _ = (&mut stdout).take(LISTING_MAX as u64).read_to_end(&mut out).await;
            let _ = tokio::io::copy(&mut stdout, &mut tokio::io::sink()).await;
        }
    };
    let read_err = async {
        if let Some(mut stderr) = stderr {
            let _ = (&mut stderr).take(8 * 1024).read_to_end(&mut said).await;
            let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
        }
    };
    let finished = tokio::time::timeout(GIT_PATIENCE, async {
        tokio::join!(read_out, read_err);
        child.wait().await
    })
    .await;
    let status = match finished {
        Ok(status) => status.map_err(|error| error.to_string())?,
        Err(_) => {
            let _ = child.start_kill();
            return Err(format!("git did not finish within {}s", GIT_PATIENCE.as_secs()));
        }
    };
    let said = String::from_utf8_lossy(&said);
    let outcome = if status.success() {
        Ok(())
    } else {
        Err(said.trim().to_string())
    };
    Ok((out, outcome))
}

async fn run(
    config: Arc<AgentConfig>,
    place: Place,
    mut announcer: Announcer,
    listing: super::Listing,
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

/// Why an agent did not start, in its own words: what the connection said, how the process ended, the tail of
/// its stderr, and any path it names that its sandbox does not show (with how to show it).
async fn start_failure(
    error: &str,
    mut exited: tokio::sync::watch::Receiver<Option<String>>,
    tail: &Mutex<std::collections::VecDeque<u8>>,
    unseen: &[PathBuf],
) -> String {
    // The process usually ended already; what it said is read by then.
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        exited.wait_for(Option::is_some),
    )
    .await;
    let status = exited
        .borrow()
        .clone()
        .unwrap_or_else(|| "still running".to_string());
    let said = {
        let tail = tail.lock();
        String::from_utf8_lossy(&tail.iter().copied().collect::<Vec<u8>>())
            .trim()
            .to_string()
    };
    let mut message = format!("the agent did not start: {error} (the agent: {status}");
    if !said.is_empty() {
        message.push_str(&format!("; it said: {said}"));
    }
    message.push(')');
    message.push_str(&unseen_hints(unseen));
    message
}

/// What to say of paths an agent's start names that its sandbox does not show, and how to show them.
fn unseen_hints(unseen: &[PathBuf]) -> String {
    unseen
        .iter()
        .map(|path| {
            let dir = path.parent().unwrap_or(path);
            format!(
                ". {} is not visible in the agent's sandbox: add {} to the agent's read_only_paths in the \
                 agents file",
                path.display(),
                dir.display()
            )
        })
        .collect()
}

/// End every turn still queued for an agent that is not running.
async fn fail_queued(mut queue: mpsc::UnboundedReceiver<Prompt>, error_type: &str, message: &str) {
    queue.close();
    while let Some(prompt) = queue.recv().await {
        fail_turn(&prompt, error_type, message);
    }
}

/// Keep the last [`STDERR_TAIL_BYTES`] of what the agent writes to stderr (and log it, at debug).
async fn keep_tail(
    mut stderr: super::quota::ThrottledReader<tokio::process::ChildStderr>,
    tail: Arc<Mutex<std::collections::VecDeque<u8>>>,
    session: String,
) {
    use tokio::io::AsyncReadExt;
    let mut buffer = vec![0_u8; 8192];
    while let Ok(read) = stderr.read(&mut buffer).await {
        if read == 0 {
            return;
        }
        tracing::debug!(%session, stderr = %String::from_utf8_lossy(&buffer[..read]), "agent stderr");
        let mut tail = tail.lock();
        tail.extend(&buffer[..read]);
        let excess = tail.len().saturating_sub(STDERR_TAIL_BYTES);
        tail.drain(..excess);
    }
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

/// A refused file operation, as the agent sees it.
/// An agent's ACP `authMethods`, for its operators: `name (id): description`, `; `-separated.
fn describe_auth_methods(methods: &[agent_client_protocol::v1::schema::AuthMethod]) -> String {
    use agent_client_protocol::v1::schema::AuthMethod;
    methods
        .iter()
        .map(|method| {
            let (id, name, description) = match method {
                AuthMethod::Terminal(m) => (m.id.to_string(), &m.name, m.description.as_deref()),
                AuthMethod::Agent(m) => (m.id.to_string(), &m.name, m.description.as_deref()),
                #[allow(unreachable_patterns)]
                _ => return String::from("(an unknown kind of method)"),
            };
            match description {
                Some(description) => format!("{name} ({id}): {description}"),
                None => format!("{name} ({id})"),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
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
