//! A scripted ACP agent for the relay's tests (and an example of an agent the relay can host), built on the
//! agent side of the `agent-client-protocol` crate. Deterministic, offline, no model.
//!
//! Every prompt gets a thought and a reply streamed in small chunks. A prompt containing:
//! - "permission": a tool call that asks for permission to write `notes.txt` in the session's directory
//!   (allow → the file is written through the relay's `fs/write_text_file`, the call completes with the diff,
//!   and a second tool call runs `cat notes.txt` in a relay terminal (`terminal/create`), reporting
//!   `TERMINAL: <output> (exit <code>)`; deny → it fails);
//! - (every new session) slash commands `/review` and `/reset`, announced right after `session/new`;
//! - "settings": its effort setting (config option `effort`: low/high) and mode (legacy modes `ask`/`code`) as
//!   the relay set them;
//! - "plan": a plan (one entry done, one in progress, one pending) and a context-window usage update;
//! - "run a command": a tool call that runs a shell in a relay terminal: it prints `hello-from-terminal`,
//!   waits until a file `go` exists in its directory, prints `bye` and exits with 3;
//! - "escape": attempts to write outside the working directory through `fs/write_text_file` (`../`, an
//!   absolute path, a symlink named `link`), reporting each as `refused:` or `WRITTEN:`, then to run a
//!   command in those directories through `terminal/create` (`refused-cwd:` or `RAN:`);
//! - "slow": a long reply, one chunk every 20 ms, that stops at `session/cancel` with `cancelled`;
//! - "chunks N": N one-character chunks as fast as possible (the coalescing benchmark);
//! - "fail": a JSON-RPC error instead of an answer;
//! - "big output": a completed tool call carrying a large edit of `big.txt` (45 KB before, 63 KB after), 60 KB of
//!   text output and a 30 KB image (the host keeps them by reference);
//! - "environment": the names of the variables it runs with;
//! - "limits": its open-files limit (RLIMIT_NOFILE);
//! - "ask me": an `elicitation/create` form (a required name, a colour from a list), whose answer it repeats;
//! - "ask later": the turn ends at once, but once a file `go` exists in its directory the agent asks a
//!   permission of that session (a tool call that outlived its turn) and writes what the relay answered
//!   (`cancelled`, `selected <option>`) to `late-outcome` there;
//! - "ask overlapping": two forms at once, then (once the first is answered) a third while the second waits;
//!   it repeats the three names in order;
//! - "sh: COMMAND" (the whole prompt): runs `sh -c COMMAND` itself, in its working directory with its own
//!   environment (as coding agents run their shell tools), streams what it prints as the reply and ends with
//!   `EXIT <code>` (or `EXIT signal <n>`); a cancel kills the command's process group. What the sandbox
//!   escape suite drives. It keeps at most 64 KiB of output unread by the relay (after each 64 KiB it waits
//!   for a round trip, an `fs/read_text_file` the relay answers in order), so a relay that reads slowly slows
//!   the command down instead of growing this agent's memory;
//! - "term: COMMAND" (the whole prompt): runs `sh -c COMMAND` in a relay terminal (`terminal/create`) and
//!   reports its output and exit code;
//! - "term-env NAME: COMMAND" or "term-env NAME VALUE: COMMAND" (the whole prompt): runs `sh -c COMMAND` in a
//!   relay terminal with the variable NAME set to VALUE (else `x`), reporting its output, or `REFUSED: <why>`
//!   when the relay refuses the terminal;
//! - "terminals N: COMMAND" (the whole prompt): opens N relay terminals at once, each running `sh -c COMMAND`,
//!   reports `OPENED <n> REFUSED <m>` (and the first refusal), then waits for and releases those opened.
//!
//! With `--require-key` it lists an "API key" authentication method and refuses `session/new` (auth required)
//! unless `TEST_AGENT_KEY` is in its environment.
//!
//! With `--hang-on-new-session` it never answers `session/new`.
//!
//! A prompt of several text blocks is taken as context (all but the last) and a message (the last): the reply
//! then ends with "CONTEXT GIVEN: <the context, its lines joined with ` | `>", where blocks other than text
//! appear as `LINK: <uri>` (resource links), `IMAGE: <mime>` or `OTHER BLOCK`. It accepts no images, audio
//! or embedded context (ACP's baseline `promptCapabilities`).
//!
//! Sessions are kept in `<cwd>/.test-agent/<id>` (the number of prompts seen), so a new process of the agent
//! can `session/load` them (replaying a line of history first, as ACP agents do); every reply ends with
//! "This session has seen N prompts." With `--no-load` it does not advertise `loadSession`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, ContentChunk, CreateElicitationRequest,
    InitializeRequest, InitializeResponse, LoadSessionRequest, LoadSessionResponse, NewSessionRequest,
    NewSessionResponse, PermissionOption, PermissionOptionKind, PromptRequest, PromptResponse,
    ReadTextFileRequest, RequestPermissionOutcome, RequestPermissionRequest, SessionId, SessionInfoUpdate,
    SessionNotification, SessionUpdate, SetSessionConfigOptionRequest, SetSessionConfigOptionResponse,
    StopReason, ToolCall, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
    WriteTextFileRequest,
};
use agent_client_protocol::v1::schema::{
    AuthMethod, AuthMethodAgent, AvailableCommand, AvailableCommandsUpdate, CreateTerminalRequest, Diff,
    Plan, PlanEntry, PlanEntryPriority, PlanEntryStatus, ReleaseTerminalRequest, SetSessionModeRequest,
    SetSessionModeResponse, Terminal, TerminalOutputRequest, ToolCallContent, UsageUpdate,
    WaitForTerminalExitRequest,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{Agent, Client, Stdio};
use parking_lot::Mutex;

#[derive(Default)]
struct Sessions {
    /// Working directory and cancel flag of each session.
    by_id: Mutex<HashMap<String, (PathBuf, Arc<AtomicBool>)>>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> agent_client_protocol::Result<()> {
    eprintln!("ahp-relay-test-agent pid {}", std::process::id());
    let can_load = !std::env::args().any(|arg| arg == "--no-load");
    // With --require-key it offers an "API key" authentication method and opens sessions only when
    // TEST_AGENT_KEY is set (as real agents answer `session/new` without credentials).
    let require_key = std::env::args().any(|arg| arg == "--require-key");
    // With --hang-on-new-session it never answers `session/new` (an agent stuck starting).
    let hang_on_new = std::env::args().any(|arg| arg == "--hang-on-new-session");
    let models: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let for_models = models.clone();
    // Each session's other settings ("<session>/effort", "<session>/mode").
    let settings: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let for_settings = settings.clone();
    let for_modes = settings.clone();
    let sessions = Arc::new(Sessions::default());
    let for_load = sessions.clone();
    let for_new = sessions.clone();
    let for_prompt = sessions.clone();
    let for_cancel = sessions;
    Agent
        .v1()
        .name("ahp-relay-test-agent")
        .on_receive_request(
            async move |initialize: InitializeRequest, responder, _cx| {
                let mut initialized = InitializeResponse::new(initialize.protocol_version)
                    .agent_capabilities(AgentCapabilities::new().load_session(can_load));
                if require_key {
                    initialized = initialized.auth_methods(vec![AuthMethod::Agent(
                        AuthMethodAgent::new("api-key", "API key")
                            .description("set TEST_AGENT_KEY".to_string()),
                    )]);
                }
                responder.respond(initialized)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |new: NewSessionRequest, responder, cx: ConnectionTo<Client>| {
                if require_key && std::env::var_os("TEST_AGENT_KEY").is_none() {
                    return responder.respond_with_error(agent_client_protocol::Error::auth_required());
                }
                if hang_on_new {
                    return cx.spawn(async move {
                        std::future::pending::<()>().await;
                        responder.respond_with_error(agent_client_protocol::Error::internal_error())
                    });
                }
                let id = format!(
                    "test-session-{}-{}",
                    std::process::id(),
                    for_new.by_id.lock().len() + 1
                );
                if let Err(error) = store_count(&new.cwd, &id, 0) {
                    return responder.respond_with_error(error);
                }
                for_new
                    .by_id
                    .lock()
                    .insert(id.clone(), (new.cwd.clone(), Arc::new(AtomicBool::new(false))));
                // Two models to choose from, as a config option of category `model`; an effort setting; and
                // two (legacy) modes.
                let created: NewSessionResponse = match serde_json::from_value(serde_json::json!({
                    "sessionId": id,
                    "configOptions": [{
                        "id": "model", "name": "Model", "category": "model", "type": "select",
                        "currentValue": "fast",
                        "options": [{"value": "fast", "name": "Fast"}, {"value": "smart", "name": "Smart"}]
                    }, {
                        "id": "effort", "name": "Effort", "category": "thought_level", "type": "select",
                        "currentValue": "low",
                        "options": [{"value": "low", "name": "Low"}, {"value": "high", "name": "High"}]
                    }],
                    "modes": {
                        "currentModeId": "ask",
                        "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]
                    }
                })) {
                    Ok(created) => created,
                    Err(error) => {
                        return responder
                            .respond_with_error(agent_client_protocol::Error::into_internal_error(error))
                    }
                };
                responder.respond(created)?;
                // Its slash commands, right after the session opened (as Claude's adapter does).
                let commands = vec![
                    AvailableCommand::new("review", "Review the changes"),
                    AvailableCommand::new("reset", "Start over"),
                ];
                say(
                    &cx,
                    &SessionId::new(id),
                    SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(commands)),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |load: LoadSessionRequest, responder, cx: ConnectionTo<Client>| {
                let id = load.session_id.to_string();
                if load_count(&load.cwd, &id).is_none() {
                    return responder.respond_with_error(agent_client_protocol::Error::invalid_params());
                }
                for_load
                    .by_id
                    .lock()
                    .insert(id, (load.cwd.clone(), Arc::new(AtomicBool::new(false))));
                // ACP agents replay the session's history before they answer.
                say(
                    &cx,
                    &load.session_id,
                    SessionUpdate::AgentMessageChunk(chunk("replayed history")),
                )?;
                responder.respond(LoadSessionResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |set: SetSessionModeRequest, responder, _cx| {
                let mode = set.mode_id.to_string();
                if mode != "ask" && mode != "code" {
                    return responder.respond_with_error(agent_client_protocol::Error::invalid_params());
                }
                for_modes.lock().insert(format!("{}/mode", set.session_id), mode);
                responder.respond(SetSessionModeResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |set: SetSessionConfigOptionRequest, responder, _cx| {
                let Some(model) = set.value.as_value_id().map(|v| v.to_string()) else {
                    return responder.respond_with_error(agent_client_protocol::Error::invalid_params());
                };
                if set.config_id.to_string() == "effort" {
                    if model != "low" && model != "high" {
                        return responder.respond_with_error(agent_client_protocol::Error::invalid_params());
                    }
                    for_settings
                        .lock()
                        .insert(format!("{}/effort", set.session_id), model);
                    return responder.respond(SetSessionConfigOptionResponse::new(vec![]));
                }
                if model != "fast" && model != "smart" {
                    return responder.respond_with_error(
                        agent_client_protocol::Error::invalid_params().data(format!("no model {model}")),
                    );
                }
                for_models.lock().insert(set.session_id.to_string(), model);
                responder.respond(SetSessionConfigOptionResponse::new(vec![]))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |cancel: CancelNotification, _cx| {
                if let Some((_, flag)) = for_cancel.by_id.lock().get(&cancel.session_id.to_string()) {
                    flag.store(true, Ordering::SeqCst);
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |prompt: PromptRequest, responder, cx: ConnectionTo<Client>| {
                let Some((cwd, cancelled)) = for_prompt
                    .by_id
                    .lock()
                    .get(&prompt.session_id.to_string())
                    .cloned()
                else {
                    return responder.respond_with_error(agent_client_protocol::Error::invalid_params());
                };
                cancelled.store(false, Ordering::SeqCst);
                // The last text block is the user's message; any before it is context the client gave.
                let mut blocks: Vec<String> = prompt
                    .prompt
                    .iter()
                    .filter_map(|block| match block {
                        ContentBlock::Text(t) => Some(t.text.clone()),
                        _ => None,
                    })
                    .collect();
                let text = blocks.pop().unwrap_or_default();
                // Blocks other than text, named (links by URI).
                blocks.extend(prompt.prompt.iter().filter_map(|block| match block {
                    ContentBlock::Text(_) => None,
                    ContentBlock::ResourceLink(link) => Some(format!("LINK: {}", link.uri)),
                    ContentBlock::Image(image) => Some(format!("IMAGE: {}", image.mime_type)),
                    _ => Some("OTHER BLOCK".to_string()),
                }));
                let context = (!blocks.is_empty()).then(|| blocks.join("\n"));
                // The script runs in its own task: a handler never waits (for permissions, or time).
                let model = models.lock().get(&prompt.session_id.to_string()).cloned();
                let chosen = |name: &str, default: &str| {
                    settings
                        .lock()
                        .get(&format!("{}/{name}", prompt.session_id))
                        .cloned()
                        .unwrap_or_else(|| default.to_string())
                };
                let set = format!(
                    "effort={}, mode={}",
                    chosen("effort", "low"),
                    chosen("mode", "ask")
                );
                let runner = cx.clone();
                cx.spawn(async move {
                    match script(
                        &runner,
                        &prompt.session_id,
                        &text,
                        context,
                        &cwd,
                        &cancelled,
                        Chosen { model, settings: set },
                    )
                    .await
                    {
                        Ok(stop) => responder.respond(PromptResponse::new(stop)),
                        Err(error) => responder.respond_with_error(error),
                    }
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_to(Stdio::new())
        .await
}

fn say(
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    update: SessionUpdate,
) -> agent_client_protocol::Result<()> {
    cx.send_notification(SessionNotification::new(session.clone(), update))
}

/// Run `command args` in a relay terminal as tool call `tool_id` (linked to the terminal), wait for it, and
/// say what it printed and how it exited.
async fn run_in_terminal(
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    tool_id: &str,
    command: &str,
    args: &[&str],
    directory: Option<PathBuf>,
) -> agent_client_protocol::Result<String> {
    say(
        cx,
        session,
        SessionUpdate::ToolCall(
            ToolCall::new(tool_id.to_string(), format!("Run {command}"))
                .kind(ToolKind::Execute)
                .status(ToolCallStatus::Pending),
        ),
    )?;
    let mut request = CreateTerminalRequest::new(session.clone(), command)
        .args(args.iter().map(|arg| arg.to_string()).collect::<Vec<_>>())
        .output_byte_limit(4096_u64);
    if let Some(directory) = directory {
        request = request.cwd(directory);
    }
    let terminal = cx.send_request(request).block_task().await?.terminal_id;
    say(
        cx,
        session,
        SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
            tool_id.to_string(),
            ToolCallUpdateFields::new()
                .status(ToolCallStatus::InProgress)
                .content(vec![ToolCallContent::Terminal(Terminal::new(terminal.clone()))]),
        )),
    )?;
    let exit = cx
        .send_request(WaitForTerminalExitRequest::new(session.clone(), terminal.clone()))
        .block_task()
        .await?
        .exit_status;
    let output = cx
        .send_request(TerminalOutputRequest::new(session.clone(), terminal.clone()))
        .block_task()
        .await?
        .output;
    cx.send_request(ReleaseTerminalRequest::new(session.clone(), terminal.clone()))
        .block_task()
        .await?;
    let code = exit.exit_code.map_or("none".to_string(), |code| code.to_string());
    say(
        cx,
        session,
        SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
            tool_id.to_string(),
            ToolCallUpdateFields::new()
                .status(ToolCallStatus::Completed)
                .content(vec![ToolCallContent::Terminal(Terminal::new(terminal))]),
        )),
    )?;
    Ok(format!(" TERMINAL: {} (exit {code}).", output.trim()))
}

fn chunk(text: &str) -> ContentChunk {
    ContentChunk::new(ContentBlock::from(text.to_string()))
}

/// The model and settings the relay chose for the session, as the agent reports them.
struct Chosen {
    model: Option<String>,
    settings: String,
}

async fn script(
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    prompt: &str,
    context: Option<String>,
    cwd: &std::path::Path,
    cancelled: &AtomicBool,
    chosen: Chosen,
) -> agent_client_protocol::Result<StopReason> {
    let Chosen { model, settings } = chosen;
    if let Some(command) = prompt.strip_prefix("sh: ") {
        return run_shell(cx, session, command, cwd, cancelled).await;
    }
    if let Some((count, command)) = prompt
        .strip_prefix("terminals ")
        .and_then(|rest| rest.split_once(": "))
        .and_then(|(count, command)| Some((count.parse::<usize>().ok()?, command)))
    {
        return many_terminals(cx, session, count, command).await;
    }
    if let Some((name, command)) = prompt
        .strip_prefix("term-env ")
        .and_then(|rest| rest.split_once(": "))
    {
        let request = CreateTerminalRequest::new(session.clone(), "sh")
            .args(vec!["-c".to_string(), command.to_string()])
            .env(vec![{
                let (name, value) = name.split_once(' ').unwrap_or((name, "x"));
                agent_client_protocol::v1::schema::EnvVariable::new(name, value)
            }])
            .output_byte_limit(4096_u64);
        let said = match cx.send_request(request).block_task().await {
            Ok(created) => {
                let terminal = created.terminal_id;
                cx.send_request(WaitForTerminalExitRequest::new(session.clone(), terminal.clone()))
                    .block_task()
                    .await?;
                let output = cx
                    .send_request(TerminalOutputRequest::new(session.clone(), terminal.clone()))
                    .block_task()
                    .await?
                    .output;
                cx.send_request(ReleaseTerminalRequest::new(session.clone(), terminal))
                    .block_task()
                    .await?;
                format!("RAN: {output}")
            }
            Err(error) => format!("REFUSED: {error}"),
        };
        say(cx, session, SessionUpdate::AgentMessageChunk(chunk(&said)))?;
        return Ok(StopReason::EndTurn);
    }
    if let Some(command) = prompt.strip_prefix("term: ") {
        let said = run_in_terminal(cx, session, "term", "sh", &["-c", command], None).await?;
        say(cx, session, SessionUpdate::AgentMessageChunk(chunk(&said)))?;
        return Ok(StopReason::EndTurn);
    }
    if prompt.contains("fail") {
        return Err(agent_client_protocol::Error::internal_error().data("the test agent was asked to fail"));
    }
    if let Some(count) = prompt
        .split_whitespace()
        .skip_while(|w| *w != "chunks")
        .nth(1)
        .and_then(|n| n.parse::<usize>().ok())
    {
        for _ in 0..count {
            say(cx, session, SessionUpdate::AgentMessageChunk(chunk("x")))?;
        }
        return Ok(StopReason::EndTurn);
    }
    if prompt.contains("big output") {
        // 30,000 zero bytes, base64.
        let image = "AAAA".repeat(10_000);
        let contents = vec![
            ToolCallContent::Diff(
                Diff::new(cwd.join("big.txt"), "new line\n".repeat(7_000))
                    .old_text("old line\n".repeat(5_000)),
            ),
            ToolCallContent::Content(agent_client_protocol::v1::schema::Content::new(
                ContentBlock::Text(agent_client_protocol::v1::schema::TextContent::new(
                    "output line\n".repeat(5_000),
                )),
            )),
            ToolCallContent::Content(agent_client_protocol::v1::schema::Content::new(
                ContentBlock::Image(agent_client_protocol::v1::schema::ImageContent::new(
                    image,
                    "image/png",
                )),
            )),
        ];
        let tool = ToolCall::new("big", "Produce big output")
            .kind(ToolKind::Edit)
            .status(ToolCallStatus::Completed)
            .content(contents);
        say(cx, session, SessionUpdate::ToolCall(tool))?;
    }
    if prompt.contains("limits") {
        // Its open-files limit, as the kernel applies it.
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let open_files = limits
            .lines()
            .find(|line| line.starts_with("Max open files"))
            .and_then(|line| line.split_whitespace().nth(3))
            .unwrap_or("unknown")
            .to_string();
        say(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(chunk(&format!("NOFILE: {open_files}."))),
        )?;
        return Ok(StopReason::EndTurn);
    }
    if prompt.contains("environment") {
        let mut names: Vec<String> = std::env::vars().map(|(name, _)| name).collect();
        names.sort();
        say(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(chunk(&format!("ENV: {}.", names.join(",")))),
        )?;
        return Ok(StopReason::EndTurn);
    }
    say(
        cx,
        session,
        SessionUpdate::AgentThoughtChunk(chunk("Thinking about it.")),
    )?;
    for word in format!("The test agent heard: {prompt}.").split_inclusive(' ') {
        say(cx, session, SessionUpdate::AgentMessageChunk(chunk(word)))?;
    }
    if prompt.contains("ask later") {
        // A tool call that outlives its turn: once a file `go` exists in its directory, a permission request of
        // this session, whatever the relay runs by then; the answer goes to `late-outcome` in the directory.
        let late = cx.clone();
        let session = session.clone();
        let cwd = cwd.to_path_buf();
        cx.spawn(async move {
            while !cwd.join("go").exists() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            let asked = RequestPermissionRequest::new(
                session,
                ToolCallUpdate::new(
                    "late-call",
                    ToolCallUpdateFields::new().title("A question asked late".to_string()),
                ),
                vec![PermissionOption::new(
                    "allow",
                    "Allow",
                    PermissionOptionKind::AllowOnce,
                )],
            );
            let outcome = match late.send_request(asked).block_task().await {
                Ok(answer) => match answer.outcome {
                    RequestPermissionOutcome::Cancelled => "cancelled".to_string(),
                    RequestPermissionOutcome::Selected(chosen) => format!("selected {}", chosen.option_id),
                    _ => "unknown".to_string(),
                },
                Err(error) => format!("error {error}"),
            };
            std::fs::write(cwd.join("late-outcome"), outcome)
                .map_err(agent_client_protocol::Error::into_internal_error)
        })?;
    }
    if prompt.contains("permission") {
        let tool = ToolCall::new("write-notes", "Write notes.txt")
            .kind(ToolKind::Edit)
            .status(ToolCallStatus::Pending);
        say(cx, session, SessionUpdate::ToolCall(tool))?;
        let options = vec![
            PermissionOption::new("allow", "Allow once", PermissionOptionKind::AllowOnce),
            PermissionOption::new("allow-always", "Always allow", PermissionOptionKind::AllowAlways),
            PermissionOption::new("reject", "Reject", PermissionOptionKind::RejectOnce),
        ];
        let asked = RequestPermissionRequest::new(
            session.clone(),
            ToolCallUpdate::new(
                "write-notes",
                ToolCallUpdateFields::new().title("Write notes.txt".to_string()),
            ),
            options,
        );
        let answer = cx.send_request(asked).block_task().await?;
        let allowed = matches!(&answer.outcome, RequestPermissionOutcome::Selected(s) if s.option_id.to_string() == "allow");
        if matches!(answer.outcome, RequestPermissionOutcome::Cancelled) || cancelled.load(Ordering::SeqCst) {
            return Ok(StopReason::Cancelled);
        }
        if allowed {
            // Through the client (the relay), which keeps it inside the session's directory.
            cx.send_request(WriteTextFileRequest::new(
                session.clone(),
                cwd.join("notes.txt"),
                "written by the test agent\n",
            ))
            .block_task()
            .await?;
        }
        let status = if allowed {
            ToolCallStatus::Completed
        } else {
            ToolCallStatus::Failed
        };
        let mut fields = ToolCallUpdateFields::new().status(status);
        if allowed {
            fields = fields.content(vec![ToolCallContent::Diff(Diff::new(
                cwd.join("notes.txt"),
                "written by the test agent\n",
            ))]);
        }
        say(
            cx,
            session,
            SessionUpdate::ToolCallUpdate(ToolCallUpdate::new("write-notes", fields)),
        )?;
        let outcome = if allowed {
            " Wrote notes.txt."
        } else {
            " Did not write notes.txt."
        };
        say(cx, session, SessionUpdate::AgentMessageChunk(chunk(outcome)))?;
        if allowed {
            let said = run_in_terminal(cx, session, "cat-notes", "cat", &["notes.txt"], None).await?;
            say(cx, session, SessionUpdate::AgentMessageChunk(chunk(&said)))?;
        }
    }
    if prompt.contains("settings") {
        say(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(chunk(&format!(" SETTINGS: {settings}."))),
        )?;
    }
    if prompt.contains("plan") {
        let plan = Plan::new(vec![
            PlanEntry::new(
                "Read the code",
                PlanEntryPriority::High,
                PlanEntryStatus::Completed,
            ),
            PlanEntry::new(
                "Write the fix",
                PlanEntryPriority::High,
                PlanEntryStatus::InProgress,
            ),
            PlanEntry::new(
                "Run the tests",
                PlanEntryPriority::Medium,
                PlanEntryStatus::Pending,
            ),
        ]);
        say(cx, session, SessionUpdate::Plan(plan))?;
        say(
            cx,
            session,
            SessionUpdate::UsageUpdate(UsageUpdate::new(1200, 200_000)),
        )?;
    }
    if prompt.contains("run a command") {
        // Waits for a file named `go` in its directory (a test creates it while watching) before it ends.
        let args = [
            "-c",
            "echo hello-from-terminal; while [ ! -e go ]; do sleep 0.05; done; echo bye; exit 3",
        ];
        let said = run_in_terminal(cx, session, "run-shell", "sh", &args, None).await?;
        say(cx, session, SessionUpdate::AgentMessageChunk(chunk(&said)))?;
    }
    if let Some(model) = model {
        say(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(chunk(&format!(" MODEL: {model}."))),
        )?;
    }
    if prompt.contains("ask me") {
        // A form: a required name and a colour from a list; the answer is echoed.
        let asked: CreateElicitationRequest = serde_json::from_value(serde_json::json!({
            "mode": "form",
            "sessionId": session.to_string(),
            "message": "Tell me about you",
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "title": "Name"},
                    "colour": {"type": "string", "title": "Colour", "enum": ["red", "green"]}
                },
                "required": ["name"]
            }
        }))
        .map_err(agent_client_protocol::Error::into_internal_error)?;
        let answer = cx.send_request(asked).block_task().await?;
        let answer =
            serde_json::to_value(&answer).map_err(agent_client_protocol::Error::into_internal_error)?;
        let said = match answer["action"].as_str() {
            Some("accept") => format!(
                " ANSWER: name={}, colour={}.",
                answer["content"]["name"].as_str().unwrap_or("?"),
                answer["content"]["colour"].as_str().unwrap_or("?")
            ),
            other => format!(" ANSWER: {}.", other.unwrap_or("?")),
        };
        say(cx, session, SessionUpdate::AgentMessageChunk(chunk(&said)))?;
    }
    if prompt.contains("ask overlapping") {
        // Two questions at once; once the first is answered, a third while the second still waits.
        let form = |message: &str| {
            serde_json::from_value::<CreateElicitationRequest>(serde_json::json!({
                "mode": "form",
                "sessionId": session.to_string(),
                "message": message,
                "requestedSchema": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "title": "Name"}},
                    "required": ["name"]
                }
            }))
            .map_err(agent_client_protocol::Error::into_internal_error)
        };
        let first = cx.send_request(form("first")?);
        let second = cx.send_request(form("second")?);
        let mut names = Vec::new();
        let first = first.block_task().await?;
        names.push(serde_json::to_value(&first).map_err(agent_client_protocol::Error::into_internal_error)?);
        let third = cx.send_request(form("third")?);
        for answer in [second.block_task().await?, third.block_task().await?] {
            names.push(
                serde_json::to_value(&answer).map_err(agent_client_protocol::Error::into_internal_error)?,
            );
        }
        let names: Vec<&str> = names
            .iter()
            .map(|answer| answer["content"]["name"].as_str().unwrap_or("?"))
            .collect();
        say(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(chunk(&format!(" ANSWERS: {}.", names.join(", ")))),
        )?;
    }
    if prompt.contains("escape") {
        // Try to leave the working directory through the relay: each attempt must be refused.
        for target in [
            cwd.join("../escaped.txt"),
            PathBuf::from("/tmp/ahp-relay-escaped.txt"),
            cwd.join("link/escaped.txt"),
        ] {
            let written = cx
                .send_request(WriteTextFileRequest::new(
                    session.clone(),
                    target.clone(),
                    "escaped",
                ))
                .block_task()
                .await;
            let verdict = if written.is_ok() { "WRITTEN" } else { "refused" };
            say(
                cx,
                session,
                SessionUpdate::AgentMessageChunk(chunk(&format!(" {verdict}:{}", target.display()))),
            )?;
        }
        for directory in [cwd.join(".."), PathBuf::from("/tmp"), cwd.join("link")] {
            let created = cx
                .send_request(
                    CreateTerminalRequest::new(session.clone(), "touch")
                        .args(vec!["escaped-by-terminal.txt".to_string()])
                        .cwd(directory.clone()),
                )
                .block_task()
                .await;
            let verdict = if created.is_ok() { "RAN" } else { "refused-cwd" };
            say(
                cx,
                session,
                SessionUpdate::AgentMessageChunk(chunk(&format!(" {verdict}:{}", directory.display()))),
            )?;
        }
    }
    let seen = load_count(cwd, &session.to_string()).unwrap_or(0) + 1;
    store_count(cwd, &session.to_string(), seen)?;
    if seen == 1 {
        // A title for the session, from its first prompt.
        let title: String = prompt.split_whitespace().take(4).collect::<Vec<_>>().join(" ");
        say(
            cx,
            session,
            SessionUpdate::SessionInfoUpdate(SessionInfoUpdate::new().title(format!("Test: {title}"))),
        )?;
    }
    say(
        cx,
        session,
        SessionUpdate::AgentMessageChunk(chunk(&format!(" This session has seen {seen} prompts."))),
    )?;
    if let Some(context) = context {
        // What the client told it besides the message, on one line.
        let context = context.replace('\n', " | ");
        say(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(chunk(&format!(" CONTEXT GIVEN: {context}"))),
        )?;
    }
    if prompt.contains("slow") {
        for i in 0..500 {
            if cancelled.load(Ordering::SeqCst) {
                return Ok(StopReason::Cancelled);
            }
            say(
                cx,
                session,
                SessionUpdate::AgentMessageChunk(chunk(&format!(" {i}"))),
            )?;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    Ok(StopReason::EndTurn)
}

/// Open `count` terminals at once running `sh -c command`; say how many the relay opened, then wait for them.
async fn many_terminals(
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    count: usize,
    command: &str,
) -> agent_client_protocol::Result<StopReason> {
    let mut opened = Vec::new();
    let mut refusals = Vec::new();
    for _ in 0..count {
        let request = CreateTerminalRequest::new(session.clone(), "sh")
            .args(vec!["-c".to_string(), command.to_string()])
            .output_byte_limit(4096_u64);
        match cx.send_request(request).block_task().await {
            Ok(created) => opened.push(created.terminal_id),
            Err(error) => refusals.push(error.to_string()),
        }
    }
    let first = refusals.first().cloned().unwrap_or_default();
    say(
        cx,
        session,
        SessionUpdate::AgentMessageChunk(chunk(&format!(
            "OPENED {} REFUSED {} {first}",
            opened.len(),
            refusals.len()
        ))),
    )?;
    for terminal in opened {
        cx.send_request(WaitForTerminalExitRequest::new(session.clone(), terminal.clone()))
            .block_task()
            .await?;
        cx.send_request(ReleaseTerminalRequest::new(session.clone(), terminal))
            .block_task()
            .await?;
    }
    Ok(StopReason::EndTurn)
}

/// Run `sh -c command` as this agent's own child, streaming its output (stdout and stderr) as the reply.
async fn run_shell(
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    command: &str,
    cwd: &std::path::Path,
    cancelled: &AtomicBool,
) -> agent_client_protocol::Result<StopReason> {
    use tokio::io::AsyncReadExt;
    let mut child = tokio::process::Command::new("sh")
        .args(["-c", command])
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(agent_client_protocol::Error::into_internal_error)?;
    let group = child.id();
    let (chunks_tx, mut chunks) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    for pipe in [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let chunks_tx = chunks_tx.clone();
        tokio::spawn(async move {
            let mut pipe = pipe;
            let mut buffer = vec![0_u8; 16 * 1024];
            while let Ok(read) = pipe.read(&mut buffer).await {
                if read == 0 || chunks_tx.send(buffer[..read].to_vec()).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(chunks_tx);
    let mut ticker = tokio::time::interval(std::time::Duration::from_millis(20));
    let mut unconfirmed = 0_usize;
    // The file its round trips read (a read that succeeds: a refused one would be logged as an error).
    let flow_control = cwd.join(".flow-control");
    let _ = std::fs::write(&flow_control, "");
    loop {
        tokio::select! {
            received = chunks.recv() => match received {
                Some(bytes) => {
                    say(
                        cx,
                        session,
                        SessionUpdate::AgentMessageChunk(chunk(&String::from_utf8_lossy(&bytes))),
                    )?;
                    unconfirmed += bytes.len();
                    if unconfirmed >= 64 * 1024 {
                        // Answered once the relay read everything sent before.
                        let _ = cx
                            .send_request(ReadTextFileRequest::new(session.clone(), flow_control.clone()))
                            .block_task()
                            .await;
                        unconfirmed = 0;
                    }
                }
                None => break,
            },
            _ = ticker.tick() => {
                if cancelled.load(Ordering::SeqCst) {
                    if let Some(group) = group {
                        // SAFETY: kill(2) with a negative pid signals the command's process group only.
                        unsafe { libc::kill(-(group as i32), libc::SIGKILL) };
                    }
                    return Ok(StopReason::Cancelled);
                }
            }
        }
    }
    let status = child
        .wait()
        .await
        .map_err(agent_client_protocol::Error::into_internal_error)?;
    use std::os::unix::process::ExitStatusExt;
    let end = match (status.code(), status.signal()) {
        (Some(code), _) => format!("\nEXIT {code}"),
        (None, Some(signal)) => format!("\nEXIT signal {signal}"),
        _ => "\nEXIT unknown".to_string(),
    };
    say(cx, session, SessionUpdate::AgentMessageChunk(chunk(&end)))?;
    Ok(StopReason::EndTurn)
}

fn session_file(cwd: &std::path::Path, id: &str) -> PathBuf {
    cwd.join(".test-agent").join(id)
}

fn load_count(cwd: &std::path::Path, id: &str) -> Option<u64> {
    std::fs::read_to_string(session_file(cwd, id))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn store_count(cwd: &std::path::Path, id: &str, count: u64) -> agent_client_protocol::Result<()> {
    let file = session_file(cwd, id);
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(agent_client_protocol::Error::into_internal_error)?;
    }
    std::fs::write(file, count.to_string()).map_err(agent_client_protocol::Error::into_internal_error)
}
