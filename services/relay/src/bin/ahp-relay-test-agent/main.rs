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
//!
//! Rooms: [`script`] (what a prompt does) above [`terminals`] (commands it runs) and [`session_files`] (its sessions
//! on disk), all speaking through [`replies`]. It is a test fixture: it touches only its working directory and
//! what the relay gives it, and tests rely on every behaviour listed above.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, InitializeRequest, InitializeResponse,
    LoadSessionRequest, LoadSessionResponse, NewSessionRequest, NewSessionResponse, PromptRequest,
    PromptResponse, SessionId, SessionUpdate, SetSessionConfigOptionRequest, SetSessionConfigOptionResponse,
};
use agent_client_protocol::v1::schema::{
    AuthMethod, AuthMethodAgent, AvailableCommand, AvailableCommandsUpdate, SetSessionModeRequest,
    SetSessionModeResponse,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{Agent, Client, Stdio};
use parking_lot::Mutex;

mod replies;
mod script;
mod session_files;
mod terminals;

use replies::*;
use script::*;
use session_files::*;

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
