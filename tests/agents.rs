//! ACP agents through the relay (issue 9): the scripted test agent (`ahp-relay-test-agent`, built on the
//! agent side of the `agent-client-protocol` crate) configured with `--agents`, driven by official `ahp`
//! clients over real WebSockets — two devices share a session: one prompts, the other approves or cancels.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use ahp_types::actions::{ChatTurnCancelledAction, StateAction};
use ahp_types::commands::CreateSessionParams;
use ahp_types::state::{ResponsePart, SessionLifecycle, ToolCallState, ToolResultContent};
use serde_json::Value;
use support::*;

/// A relay with the scripted agent configured as `scripted`, its workspace in a temporary directory.
struct AgentRelay {
    relay: Relay,
    workspace: tempfile::TempDir,
    _config: tempfile::TempDir,
}

async fn relay_with_agent() -> AgentRelay {
    relay_with_agents(&[]).await
}

/// The scripted agent plus third-party ones, as (id, command, extra arguments).
async fn relay_with_agents(others: &[(&str, &str, &[&str])]) -> AgentRelay {
    let (workspace, config, file) = agents_file(&[], others);
    let relay = Relay::start_with(&["--agents", &file.display().to_string()]).await;
    AgentRelay {
        relay,
        workspace,
        _config: config,
    }
}

/// A workspace and an agents file: the scripted agent (with `scripted_args`) plus `others`.
fn agents_file(
    scripted_args: &[&str],
    others: &[(&str, &str, &[&str])],
) -> (tempfile::TempDir, tempfile::TempDir, PathBuf) {
    agents_file_idle(scripted_args, others, 600)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_under_its_configured_rlimits() {
    let (_workspace, _config, file) = agents_file(&[], &[]);
    let text = std::fs::read_to_string(&file).expect("read");
    std::fs::write(&file, format!("{text}limits = {{ open_files = 77 }}\n")).expect("write");
    let relay = Relay::start_with(&["--agents", &file.display().to_string()]).await;
    let (a, _) = relay.client("device-a").await;
    let (_, chat) = scripted_session(&a, "limited").await;
    let state = prompt(&a, &chat, "t1", "show your limits").await;
    assert_eq!(turn_text(&state, "t1").0, "NOFILE: 77.");
}

fn agents_file_idle(
    scripted_args: &[&str],
    others: &[(&str, &str, &[&str])],
    idle_timeout_seconds: u64,
) -> (tempfile::TempDir, tempfile::TempDir, PathBuf) {
    let workspace = tempfile::tempdir().expect("workspace");
    let config = tempfile::tempdir().expect("config");
    let file = config.path().join("agents.toml");
    let mut text = format!(
        "workspace_root = {:?}\nidle_timeout_seconds = {idle_timeout_seconds}\n\n[[agent]]\nid = \"scripted\"\ndisplay_name = \"Scripted\"\ncommand = {:?}\nargs = {scripted_args:?}\nenv = [\"PATH\"]\nmodels = [\"scripted-1\"]\n",
        workspace.path().display().to_string(),
        env!("CARGO_BIN_EXE_ahp-relay-test-agent"),
    );
    for (id, command, args) in others {
        // Third-party agents want a HOME (for their settings); they get the relay's.
        text.push_str(&format!(
            "\n[[agent]]\nid = {id:?}\ndisplay_name = {id:?}\ncommand = {command:?}\nargs = {args:?}\nenv = [\"PATH\", \"HOME\"]\n"
        ));
    }
    std::fs::write(&file, text).expect("write agents file");
    (workspace, config, file)
}

/// Create a session on the scripted agent and wait until the agent made it ready; then a chat in it.
async fn scripted_session(client: &ahp::Client, name: &str) -> (String, String) {
    agent_session(client, "scripted", name).await
}

/// Create a session on `agent` and wait until the agent made it ready; then a chat in it.
async fn agent_session(client: &ahp::Client, agent: &str, name: &str) -> (String, String) {
    configured_session(client, agent, name, None).await
}

/// [`agent_session`] with session config values.
async fn configured_session(
    client: &ahp::Client,
    agent: &str,
    name: &str,
    config: Option<serde_json::Map<String, Value>>,
) -> (String, String) {
    let session = format!("ahp-session:/{name}");
    let chat = format!("ahp-chat:/{name}");
    let _: Value = client
        .request(
            "createSession",
            CreateSessionParams {
                channel: session.clone(),
                meta: None,
                provider: Some(agent.into()),
                working_directories: None,
                config,
                active_client: None,
                progress_token: None,
            },
        )
        .await
        .expect("createSession");
    let (result, mut sub) = client.subscribe(session.clone()).await.expect("subscribe");
    let mut state = session_of(&result.snapshot.expect("snapshot"));
    while state.lifecycle != SessionLifecycle::Ready {
        assert_ne!(state.lifecycle, SessionLifecycle::Failed, "{state:?}");
        let envelope = next_envelope(&mut sub).await;
        ahp::reducers::apply_action_to_session(&mut state, &envelope.action);
    }
    client.unsubscribe(session.clone()).await.expect("unsubscribe");
    // Its default chat, named after the session.
    (session, chat)
}

fn is_turn_end(envelope: &ahp_types::actions::ActionEnvelope) -> bool {
    matches!(
        envelope.action,
        StateAction::ChatTurnComplete(_) | StateAction::ChatTurnCancelled(_) | StateAction::ChatError(_)
    )
}

fn markdown(state: &ahp_types::state::ChatState) -> String {
    state
        .turns
        .iter()
        .flat_map(|t| t.response_parts.iter())
        .filter_map(|p| match p {
            ResponsePart::Markdown(m) => Some(m.content.as_str()),
            _ => None,
        })
        .collect()
}

/// The processes running the scripted agent in `dir` (the agent itself: not the sandbox around it, whose
/// command line names the agent too).
fn agents_in(dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
            String::from_utf8_lossy(program).ends_with("ahp-relay-test-agent") && cwd.as_deref() == Some(dir)
        })
        .collect()
}

fn session_dir(workspace: &Path, name: &str) -> PathBuf {
    workspace
        .join("dev")
        .join("default")
        .join(name)
        .canonicalize()
        .expect("session dir")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_devices_share_an_acp_agents_turn_one_prompts_the_other_approves() {
    let setup = relay_with_agent().await;
    let (a, init) = setup.relay.client("device-a").await;
    let root = match &init.snapshots[0].state {
        ahp_types::state::SnapshotState::Root(root) => root.clone(),
        other => panic!("{other:?}"),
    };
    assert!(root.agents.iter().any(|agent| agent.provider == "scripted"));
    let (b, _) = setup.relay.client("device-b").await;
    let (_, chat) = scripted_session(&a, "shared").await;
    let (a_state, a_from, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (b_state, b_from, mut b_sub) = subscribe_chat(&b, &chat).await;

    a.dispatch(chat.clone(), turn_started("t1", "please ask permission"))
        .await
        .expect("dispatch");
    // Device B sees the agent's permission request as a pending confirmation and approves it.
    let mut b_seen = Vec::new();
    let tool_call_id = loop {
        let envelope = next_envelope(&mut b_sub).await;
        b_seen.push(envelope.clone());
        if let StateAction::ChatToolCallReady(ready) = &envelope.action {
            if ready.options.is_some() {
                break ready.tool_call_id.clone();
            }
        }
    };
    b.dispatch(chat.clone(), confirm_tool_call("t1", &tool_call_id, true))
        .await
        .expect("approve");
    b_seen.extend(collect_until(&mut b_sub, is_turn_end).await);
    let a_seen = collect_until(&mut a_sub, is_turn_end).await;
    assert!(
        matches!(
            a_seen.last().map(|e| &e.action),
            Some(StateAction::ChatTurnComplete(_))
        ),
        "{:?}",
        a_seen.last()
    );

    // Both devices saw the same envelopes and reduce to the host's state.
    let from = a_from.max(b_from);
    let after = |seen: &[ahp_types::actions::ActionEnvelope]| {
        json(&seen.iter().filter(|e| e.server_seq > from).collect::<Vec<_>>())
    };
    assert_eq!(after(&a_seen), after(&b_seen));
    let fresh = fresh_chat_snapshot(&setup.relay, &chat).await;
    assert_eq!(json(&reduce_chat(a_state, a_from, &a_seen)), json(&fresh));
    assert_eq!(json(&reduce_chat(b_state, b_from, &b_seen)), json(&fresh));
    let reply = markdown(&fresh);
    assert!(
        reply.contains("The test agent heard: please ask permission."),
        "{reply}"
    );
    assert!(reply.contains("Wrote notes.txt."), "{reply}");
    // The agent ran `cat notes.txt` in a relay terminal and read its output back.
    assert!(
        reply.contains("TERMINAL: written by the test agent (exit 0)."),
        "{reply}"
    );
    let tools = completed_tool_calls(&fresh);
    assert_eq!(tools.len(), 2, "{tools:?}");
    // The file edit is tool-call content: the new file's text and its line counts.
    let Some(ToolResultContent::FileEdit(edit)) = tools[0].content.as_ref().and_then(|c| c.first()) else {
        panic!("a file edit: {:?}", tools[0]);
    };
    let after = edit.after.as_ref().expect("after");
    assert!(after.uri.ends_with("/notes.txt"), "{}", after.uri);
    assert_eq!(data_uri_text(&after.content.uri), "written by the test agent\n");
    assert_eq!(edit.diff.as_ref().and_then(|d| d.added), Some(1));
    // The command's terminal is linked from its tool call, and any device can open it.
    let terminal = terminal_of(&tools[1]);
    let (c, _) = setup.relay.client("device-c").await;
    let (snapshot, _) = c.subscribe(terminal.clone()).await.expect("subscribe terminal");
    let state = terminal_state(&snapshot.snapshot.expect("snapshot"));
    assert_eq!(terminal_text(&state), "written by the test agent\n");
    assert_eq!(state.lifecycle, exited(Some(0)));

    // The agent's title update named the session.
    let listed: ahp_types::commands::ListSessionsResult = a
        .request("listSessions", serde_json::json!({"channel": "ahp-root://"}))
        .await
        .expect("listSessions");
    assert_eq!(listed.items[0].title, "Test: please ask permission");

    // The file exists in the session's directory and nowhere else in the workspace.
    let dir = session_dir(setup.workspace.path(), "shared");
    assert!(dir.join("notes.txt").exists());
    let found: Vec<PathBuf> = walk(setup.workspace.path())
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "notes.txt"))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
}

/// The completed tool calls of a chat's first turn, in order.
/// Issue 36 (4): a member's title is final. An ACP agent names its session after the first prompt; a session a
/// member renamed first keeps the member's title through that prompt, while an unrenamed one takes the
/// agent's; the member may rename it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_title_is_final_and_the_agents_naming_is_dropped() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let titles = |listed: ahp_types::commands::ListSessionsResult| {
        listed
            .items
            .into_iter()
            .map(|item| (item.resource, item.title))
            .collect::<std::collections::HashMap<_, _>>()
    };
    let (renamed, renamed_chat) = scripted_session(&a, "renamed").await;
    let (named_by_agent, agent_chat) = scripted_session(&a, "by-agent").await;
    a.dispatch(
        renamed.clone(),
        StateAction::SessionTitleChanged(ahp_types::actions::SessionTitleChangedAction {
            title: "Our launch plan".into(),
        }),
    )
    .await
    .expect("rename");
    for chat in [&renamed_chat, &agent_chat] {
        let (_, _, mut sub) = subscribe_chat(&a, chat).await;
        a.dispatch(chat.clone(), turn_started("t1", "hello there friend"))
            .await
            .expect("prompt");
        collect_until(&mut sub, is_turn_end).await;
    }
    let listed = titles(
        a.request("listSessions", serde_json::json!({"channel": "ahp-root://"}))
            .await
            .expect("listSessions"),
    );
    assert_eq!(
        listed[&named_by_agent], "Test: hello there friend",
        "the agent names an unrenamed session"
    );
    assert_eq!(listed[&renamed], "Our launch plan", "the member's title stays");
    // A member may still rename it again.
    a.dispatch(
        renamed.clone(),
        StateAction::SessionTitleChanged(ahp_types::actions::SessionTitleChangedAction {
            title: "Launch plan, v2".into(),
        }),
    )
    .await
    .expect("rename again");
    let (snapshot, _) = a.subscribe(renamed.clone()).await.expect("session");
    let state = serde_json::to_string(&snapshot.snapshot.map(|s| s.state)).expect("json");
    assert!(state.contains("Launch plan, v2"), "{state}");
}

fn completed_tool_calls(chat: &ahp_types::state::ChatState) -> Vec<ahp_types::state::ToolCallCompletedState> {
    chat.turns[0]
        .response_parts
        .iter()
        .filter_map(|p| match p {
            ResponsePart::ToolCall(tc) => match &tc.tool_call {
                ToolCallState::Completed(done) => Some(done.clone()),
                other => panic!("a tool call that did not complete: {other:?}"),
            },
            _ => None,
        })
        .collect()
}

/// The terminal a completed tool call links to.
fn terminal_of(tool: &ahp_types::state::ToolCallCompletedState) -> String {
    tool.content
        .iter()
        .flatten()
        .find_map(|content| match content {
            ToolResultContent::Terminal(terminal) => Some(terminal.resource.clone()),
            _ => None,
        })
        .expect("a terminal in the tool call's content")
}

fn terminal_state(snapshot: &ahp_types::state::Snapshot) -> ahp_types::state::TerminalState {
    match &snapshot.state {
        ahp_types::state::SnapshotState::Terminal(state) => (**state).clone(),
        other => panic!("not a terminal: {other:?}"),
    }
}

/// A terminal's whole output (the VT stream its content parts make up).
fn terminal_text(state: &ahp_types::state::TerminalState) -> String {
    serde_json::to_value(&state.content)
        .expect("json")
        .as_array()
        .expect("parts")
        .iter()
        .map(|part| {
            part.get("output")
                .or_else(|| part.get("value"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn exited(exit_code: Option<i64>) -> ahp_types::state::TerminalLifecycleState {
    ahp_types::state::TerminalLifecycleState::Exited(ahp_types::state::TerminalExitedLifecycleState {
        exit_code,
    })
}

/// The text of a `data:…;base64,` URI.
fn data_uri_text(uri: &str) -> String {
    use base64::Engine;
    let encoded = uri.split_once(";base64,").expect("a base64 data: URI").1;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("base64");
    String::from_utf8(bytes).expect("utf-8")
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_from_another_device_stops_the_agent_and_the_next_prompt_works() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (b, _) = setup.relay.client("device-b").await;
    let (_, chat) = scripted_session(&a, "cancelled").await;
    let (state, from, mut a_sub) = subscribe_chat(&a, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "a slow answer please"))
        .await
        .expect("dispatch");
    // Wait until the agent streams, then cancel from the other device.
    let mut seen = collect_until(&mut a_sub, |e| matches!(e.action, StateAction::ChatDelta(_))).await;
    b.dispatch(
        chat.clone(),
        StateAction::ChatTurnCancelled(ChatTurnCancelledAction {
            turn_id: "t1".into(),
            duration: 0,
            meta: None,
        }),
    )
    .await
    .expect("cancel");
    seen.extend(collect_until(&mut a_sub, is_turn_end).await);
    assert!(matches!(
        seen.last().map(|e| &e.action),
        Some(StateAction::ChatTurnCancelled(_))
    ));
    // The next prompt runs once the agent has stopped.
    a.dispatch(chat.clone(), turn_started("t2", "hello again"))
        .await
        .expect("dispatch");
    seen.extend(collect_until(&mut a_sub, is_turn_end).await);
    assert!(
        matches!(
            seen.last().map(|e| &e.action),
            Some(StateAction::ChatTurnComplete(_))
        ),
        "{:?}",
        seen.last()
    );
    let fresh = fresh_chat_snapshot(&setup.relay, &chat).await;
    assert_eq!(json(&reduce_chat(state, from, &seen)), json(&fresh));
    assert!(markdown(&fresh).contains("The test agent heard: hello again."));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_error_ends_the_turn_and_disposing_kills_the_agent() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (session, chat) = scripted_session(&a, "failing").await;
    let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "please fail"))
        .await
        .expect("dispatch");
    let seen = collect_until(&mut sub, is_turn_end).await;
    let Some(StateAction::ChatError(error)) = seen.last().map(|e| &e.action) else {
        panic!("expected chat/error, got {:?}", seen.last());
    };
    assert!(
        error.part.error.message.contains("asked to fail"),
        "{}",
        error.part.error.message
    );
    a.ping().await.expect("the relay is healthy");

    // The agent runs in the session's directory until the session is disposed.
    let dir = session_dir(setup.workspace.path(), "failing");
    assert!(
        !agents_in(&dir).is_empty(),
        "the agent process runs in {}",
        dir.display()
    );
    let _: Value = a
        .request("disposeSession", serde_json::json!({"channel": session}))
        .await
        .expect("dispose");
    let gone = tokio::time::timeout(PATIENCE, async {
        while !agents_in(&dir).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "the agent still runs: {:?}", agents_in(&dir));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_with_exactly_its_allowed_environment() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (_, chat) = scripted_session(&a, "environment").await;
    let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "show your environment"))
        .await
        .expect("dispatch");
    collect_until(&mut sub, is_turn_end).await;
    // The relay runs with the test's whole environment (secrets included); the agent sees PATH only, and
    // its sandbox's own HOME, TMPDIR and PWD.
    let reply = markdown(&fresh_chat_snapshot(&setup.relay, &chat).await);
    assert_eq!(reply, "ENV: HOME,PATH,PWD,TMPDIR.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cannot_write_outside_its_working_directory_through_the_relay() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (_, chat) = scripted_session(&a, "escape").await;
    let dir = session_dir(setup.workspace.path(), "escape");
    let elsewhere = setup.workspace.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("mkdir");
    std::os::unix::fs::symlink(&elsewhere, dir.join("link")).expect("symlink");
    let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "try to escape"))
        .await
        .expect("dispatch");
    collect_until(&mut sub, is_turn_end).await;
    let reply = markdown(&fresh_chat_snapshot(&setup.relay, &chat).await);
    assert_eq!(reply.matches(" refused:").count(), 3, "{reply}");
    assert!(!reply.contains("WRITTEN"), "{reply}");
    // The same directories as a terminal's working directory are refused too, and nothing ran there.
    assert_eq!(reply.matches(" refused-cwd:").count(), 3, "{reply}");
    assert!(!reply.contains("RAN:"), "{reply}");
    for directory in [dir.parent().expect("tenant dir"), Path::new("/tmp"), &elsewhere] {
        assert!(
            !directory.join("escaped-by-terminal.txt").exists(),
            "{}",
            directory.display()
        );
    }
    assert!(!dir.parent().expect("tenant dir").join("escaped.txt").exists());
    assert!(!Path::new("/tmp/ahp-relay-escaped.txt").exists());
    assert!(std::fs::read_dir(&elsewhere).expect("elsewhere").next().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_working_directory_outside_the_tenants_workspace_is_refused() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    for outside in [
        "file:///etc".to_string(),
        format!("file://{}/other-tenant/x", setup.workspace.path().display()),
        format!("file://{}/dev/../other-tenant", setup.workspace.path().display()),
    ] {
        let refused = a
            .request::<_, Value>(
                "createSession",
                CreateSessionParams {
                    channel: "ahp-session:/escape".into(),
                    meta: None,
                    provider: Some("scripted".into()),
                    working_directories: Some(vec![outside.clone()]),
                    config: None,
                    active_client: None,
                    progress_token: None,
                },
            )
            .await;
        assert!(
            matches!(&refused, Err(ahp::ClientError::Rpc(e)) if e.code == -32602 && e.message.contains("outside")),
            "{outside}: {refused:?}"
        );
    }
    assert!(!setup.workspace.path().join("other-tenant").exists());
}

/// Not a timed assertion: it checks that every chunk arrives, in order, on two devices, and prints what
/// coalescing did (recorded in docs/benchmarks.md; run with `-- --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_agents_chunks_reach_every_device_coalesced() {
    const CHUNKS: usize = 10_000;
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (b, _) = setup.relay.client("device-b").await;
    let (_, chat) = scripted_session(&a, "fast").await;
    let (_, _, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (b_state, b_from, mut b_sub) = subscribe_chat(&b, &chat).await;
    let started = std::time::Instant::now();
    a.dispatch(chat.clone(), turn_started("t1", &format!("chunks {CHUNKS}")))
        .await
        .expect("dispatch");
    let a_seen = collect_until(&mut a_sub, is_turn_end).await;
    let b_seen = collect_until(&mut b_sub, is_turn_end).await;
    let to_last_device = started.elapsed();
    let state = reduce_chat(b_state, b_from, &b_seen);
    assert_eq!(
        markdown(&state),
        "x".repeat(CHUNKS),
        "every chunk, once, in order"
    );
    assert_eq!(json(&a_seen), json(&b_seen));
    let text_envelopes = b_seen
        .iter()
        .filter(|e| {
            matches!(
                e.action,
                StateAction::ChatDelta(_) | StateAction::ChatResponsePart(_)
            )
        })
        .count();
    println!(
        "coalescing: {CHUNKS} agent chunks -> {text_envelopes} text envelopes ({:.4} per chunk); prompt to last device {:?}",
        text_envelopes as f64 / CHUNKS as f64,
        to_last_device
    );
}

/// An installed third-party agent (scripts/with-acp-agents exports it), or `None` with a note.
fn third_party(variable: &str) -> Option<String> {
    let path = std::env::var(variable).ok();
    if path.is_none() {
        // Under scripts/with-acp-agents (as scripts/test runs) the agent must be there: its install failed.
        assert!(
            std::env::var_os("AHP_TEST_ACP_AGENTS_REQUIRED").is_none(),
            "{variable} is not set although scripts/with-acp-agents ran: the agent could not be installed \
             (see target/acp-agents/*-install.log)"
        );
        eprintln!(
            "skipped: {variable} not set (scripts/test installs the agent with scripts/with-acp-agents)"
        );
    }
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elizacp_from_crates_io_completes_a_prompt_through_the_relay() {
    let Some(elizacp) = third_party("AHP_TEST_ELIZACP") else {
        return;
    };
    let setup = relay_with_agents(&[("eliza", &elizacp, &["--deterministic", "acp"])]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let (b, _) = setup.relay.client("device-b").await;
    let (_, chat) = agent_session(&a, "eliza", "eliza").await;
    let (_, _, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (b_state, b_from, mut b_sub) = subscribe_chat(&b, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "I feel a bit tired today"))
        .await
        .expect("dispatch");
    let a_seen = collect_until(&mut a_sub, is_turn_end).await;
    let b_seen = collect_until(&mut b_sub, is_turn_end).await;
    assert!(
        matches!(
            b_seen.last().map(|e| &e.action),
            Some(StateAction::ChatTurnComplete(_))
        ),
        "{:?}",
        b_seen.last()
    );
    assert_eq!(json(&a_seen), json(&b_seen));
    let state = reduce_chat(b_state, b_from, &b_seen);
    assert!(!markdown(&state).trim().is_empty(), "Eliza answered");
    assert_eq!(
        json(&state),
        json(&fresh_chat_snapshot(&setup.relay, &chat).await)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_agent_acp_lists_its_models_and_a_prompt_without_credentials_ends_in_an_error() {
    let Some(claude) = third_party("AHP_TEST_CLAUDE_ACP") else {
        return;
    };
    let setup = relay_with_agents(&[("claude", &claude, &[])]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let (b, _) = setup.relay.client("device-b").await;
    let mut root = b.attach_subscription("ahp-root://").await;
    let (_, chat) = agent_session(&a, "claude", "claude").await;
    // The models the agent reported in session/new are now listed in root state.
    let agents = loop {
        let event = tokio::time::timeout(PATIENCE, root.recv())
            .await
            .expect("timed out waiting for root/agentsChanged")
            .expect("root closed");
        if let ahp::SubscriptionEvent::Action(envelope) = event {
            if let StateAction::RootAgentsChanged(changed) = envelope.action {
                break changed.agents;
            }
        }
    };
    let claude_info = agents
        .iter()
        .find(|a| a.provider == "claude")
        .expect("claude listed");
    assert!(
        claude_info.models.iter().any(|m| m.id == "haiku"),
        "{:?}",
        claude_info.models
    );

    let (_, _, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (_, _, mut b_sub) = subscribe_chat(&b, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "hello"))
        .await
        .expect("dispatch");
    for sub in [&mut a_sub, &mut b_sub] {
        let seen = collect_until(sub, is_turn_end).await;
        let Some(StateAction::ChatError(error)) = seen.last().map(|e| &e.action) else {
            panic!("expected chat/error, got {:?}", seen.last());
        };
        assert!(
            error.part.error.message.contains("Authentication required"),
            "{}",
            error.part.error.message
        );
    }
    a.ping().await.expect("the relay is healthy");
    b.ping().await.expect("the relay is healthy");
}

/// Create a session on `agent` that the agent refuses: the error it failed with.
async fn creation_error(client: &ahp::Client, agent: &str, name: &str) -> ahp_types::state::ErrorInfo {
    let session = format!("ahp-session:/{name}");
    let _: Value = client
        .request(
            "createSession",
            CreateSessionParams {
                channel: session.clone(),
                meta: None,
                provider: Some(agent.into()),
                working_directories: None,
                config: None,
                active_client: None,
                progress_token: None,
            },
        )
        .await
        .expect("createSession");
    let (result, mut sub) = client.subscribe(session.clone()).await.expect("subscribe");
    let mut state = session_of(&result.snapshot.expect("snapshot"));
    while state.lifecycle == SessionLifecycle::Creating {
        let envelope = next_envelope(&mut sub).await;
        ahp::reducers::apply_action_to_session(&mut state, &envelope.action);
    }
    assert_eq!(state.lifecycle, SessionLifecycle::Failed);
    state.creation_error.expect("creation error")
}

/// Codex and Gemini CLI answer `session/new` without a key with an error, and list their authentication
/// methods in `initialize`: the session fails saying both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_and_gemini_without_credentials_fail_the_session_naming_what_to_configure() {
    let agents = [
        (
            "codex",
            "AHP_TEST_CODEX_ACP",
            &[][..],
            ["Authentication required", "Use OPENAI_API_KEY (openai-api-key)"],
        ),
        (
            "gemini",
            "AHP_TEST_GEMINI_CLI",
            &["--experimental-acp"][..],
            ["Gemini API key is missing", "Gemini API key (gemini-api-key)"],
        ),
    ];
    for (id, variable, args, expected) in agents {
        let Some(command) = third_party(variable) else {
            continue;
        };
        let setup = relay_with_agents(&[(id, &command, args)]).await;
        let (a, _) = setup.relay.client("device-a").await;
        let error = creation_error(&a, id, id).await;
        for said in expected {
            assert!(error.message.contains(said), "{id}: {}", error.message);
        }
        a.ping().await.expect("the relay is healthy");
    }
}

/// Prompt on `chat` and return the reduced state once the turn ended.
async fn prompt(client: &ahp::Client, chat: &str, turn_id: &str, text: &str) -> ahp_types::state::ChatState {
    let (state, from, mut sub) = subscribe_chat(client, chat).await;
    client
        .dispatch(chat.into(), turn_started(turn_id, text))
        .await
        .expect("dispatch");
    let seen = collect_until(&mut sub, is_turn_end).await;
    client.unsubscribe(chat.into()).await.expect("unsubscribe");
    reduce_chat(state, from, &seen)
}

fn turn_text(state: &ahp_types::state::ChatState, turn_id: &str) -> (String, Vec<String>) {
    let turn = state.turns.iter().find(|t| t.id == turn_id).expect("turn");
    let mut markdown = String::new();
    let mut notes = Vec::new();
    for part in &turn.response_parts {
        match part {
            ResponsePart::Markdown(m) => markdown.push_str(&m.content),
            ResponsePart::SystemNotification(n) => notes.push(match &n.content {
                ahp_types::common::StringOrMarkdown::Plain(text) => text.clone(),
                other => serde_json::to_string(other).unwrap_or_default(),
            }),
            _ => {}
        }
    }
    (markdown, notes)
}

/// Prompt once, restart the relay (the agent process goes with it), prompt again.
async fn prompt_across_a_restart(scripted_args: &[&str]) -> (String, Vec<String>) {
    let (workspace, _config, file) = agents_file(scripted_args, &[]);
    let data = tempfile::tempdir().expect("data");
    let flags = ["--agents", &file.display().to_string()];
    let mut relay = Relay::start_in(data.path(), &flags).await;
    let (a, _) = relay.client("device-a").await;
    let (_, chat) = scripted_session(&a, "restarted").await;
    let state = prompt(&a, &chat, "t1", "first").await;
    assert!(turn_text(&state, "t1")
        .0
        .contains("This session has seen 1 prompts."));
    a.shutdown().await;
    assert!(relay.terminate().await);
    let dir = session_dir(workspace.path(), "restarted");
    // The kernel ends the sandboxed agent when its relay exits (parent-death signal): soon after, not before
    // `terminate` returns.
    let gone = tokio::time::timeout(PATIENCE, async {
        while !agents_in(&dir).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "the agent stopped with the relay");

    let relay = Relay::start_in(data.path(), &flags).await;
    let (a, _) = relay.client("device-a").await;
    let state = prompt(&a, &chat, "t2", "second").await;
    assert_eq!(json(&state), json(&fresh_chat_snapshot(&relay, &chat).await));
    turn_text(&state, "t2")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_next_prompt_continues_the_agents_session() {
    let (reply, notes) = prompt_across_a_restart(&[]).await;
    assert!(reply.contains("This session has seen 2 prompts."), "{reply}");
    assert!(
        !reply.contains("replayed history"),
        "the load's replay is not published: {reply}"
    );
    assert!(notes.is_empty(), "{notes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_an_agent_that_cannot_load_says_its_context_was_reset() {
    let (reply, notes) = prompt_across_a_restart(&["--no-load"]).await;
    assert!(
        reply.contains("This session has seen 1 prompts."),
        "a new ACP session: {reply}"
    );
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("could not restore"), "{notes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steering_message_for_an_acp_agent_runs_as_the_next_turn() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (_, chat) = scripted_session(&a, "steered").await;
    let (state, from, mut sub) = subscribe_chat(&a, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "please ask permission"))
        .await
        .expect("dispatch");
    // While the turn waits for its permission, a device steers.
    let mut seen = collect_until(
        &mut sub,
        |e| matches!(&e.action, StateAction::ChatToolCallReady(r) if r.options.is_some()),
    )
    .await;
    let StateAction::ChatToolCallReady(ready) = &seen[seen.len() - 1].action else {
        unreachable!()
    };
    let tool_call_id = ready.tool_call_id.clone();
    a.dispatch(
        chat.clone(),
        StateAction::ChatPendingMessageSet(ahp_types::actions::ChatPendingMessageSetAction {
            kind: ahp_types::state::PendingMessageKind::Steering,
            id: "s1".into(),
            message: message("now focus on tests"),
        }),
    )
    .await
    .expect("steer");
    a.dispatch(chat.clone(), confirm_tool_call("t1", &tool_call_id, false))
        .await
        .expect("deny");
    // The ACP agent cannot take it mid-turn: it stays pending, then starts the next turn.
    let mut pending_during_t1 = false;
    loop {
        let envelope = next_envelope(&mut sub).await;
        let done = matches!(&envelope.action, StateAction::ChatTurnComplete(c) if c.turn_id != "t1");
        seen.push(envelope);
        let so_far = reduce_chat(state.clone(), from, &seen);
        if so_far.active_turn.as_ref().is_some_and(|t| t.id == "t1") && so_far.steering_message.is_some() {
            pending_during_t1 = true;
        }
        if done {
            break;
        }
    }
    assert!(
        pending_during_t1,
        "the steering message stayed pending while t1 ran"
    );
    let state = reduce_chat(state, from, &seen);
    assert!(state.steering_message.is_none());
    let last = state.turns.last().expect("a second turn");
    assert_eq!(last.message.text, "now focus on tests");
    assert!(markdown(&state).contains("Did not write notes.txt."));
    assert!(markdown(&state).contains("The test agent heard: now focus on tests."));
    assert_eq!(
        json(&state),
        json(&fresh_chat_snapshot(&setup.relay, &chat).await)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_agent_is_stopped_and_the_next_prompt_continues_its_session() {
    let (workspace, _config, file) = agents_file_idle(&[], &[], 1);
    let relay = Relay::start_with(&["--agents", &file.display().to_string()]).await;
    let (a, _) = relay.client("device-a").await;
    let (_, chat) = scripted_session(&a, "idle").await;
    let state = prompt(&a, &chat, "t1", "first").await;
    assert!(turn_text(&state, "t1")
        .0
        .contains("This session has seen 1 prompts."));
    // Idle past the timeout: the agent's process goes (bounded wait for the condition).
    let dir = session_dir(workspace.path(), "idle");
    let gone = tokio::time::timeout(PATIENCE, async {
        while !agents_in(&dir).is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "the idle agent still runs: {:?}", agents_in(&dir));
    let state = prompt(&a, &chat, "t2", "second").await;
    let (reply, notes) = turn_text(&state, "t2");
    assert!(reply.contains("This session has seen 2 prompts."), "{reply}");
    assert!(notes.is_empty(), "{notes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_chat_of_a_session_has_its_own_acp_session() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (session, first) = scripted_session(&a, "two-chats").await;
    let second = "ahp-chat:/two-chats-second".to_string();
    create_chat(&a, &session, &second).await;
    prompt(&a, &first, "t1", "one").await;
    prompt(&a, &first, "t2", "two").await;
    let state = prompt(&a, &second, "t3", "three").await;
    // The agent counts prompts per ACP session: the second chat starts at 1.
    assert!(turn_text(&state, "t3")
        .0
        .contains("This session has seen 1 prompts."));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_question_is_an_input_request_another_device_answers() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (b, _) = setup.relay.client("device-b").await;
    let (_, chat) = scripted_session(&a, "asked").await;
    let (state, from, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (_, _, mut b_sub) = subscribe_chat(&b, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "please ask me something"))
        .await
        .expect("dispatch");
    let requested = collect_until(&mut b_sub, |e| {
        matches!(e.action, StateAction::ChatInputRequested(_))
    })
    .await;
    let StateAction::ChatInputRequested(asked) = &requested[requested.len() - 1].action else {
        unreachable!()
    };
    let questions = json(&asked.request.questions);
    let question = |id: &str| {
        questions
            .as_array()
            .and_then(|all| all.iter().find(|q| q["id"] == id))
            .cloned()
            .unwrap_or_else(|| panic!("no question {id}: {questions}"))
    };
    assert_eq!(question("name")["kind"], "text");
    assert_eq!(question("name")["required"], true);
    assert_eq!(question("colour")["kind"], "single-select");
    assert_eq!(question("colour")["options"][1]["id"], "green");
    let answers: std::collections::HashMap<String, ahp_types::state::ChatInputAnswer> =
        serde_json::from_value(serde_json::json!({
            "name": {"state": "submitted", "value": {"kind": "text", "value": "Ada"}},
            "colour": {"state": "submitted", "value": {"kind": "selected", "value": "green"}},
        }))
        .expect("answers");
    b.dispatch(
        chat.clone(),
        StateAction::ChatInputCompleted(ahp_types::actions::ChatInputCompletedAction {
            request_id: asked.request.id.clone(),
            response: ahp_types::state::ChatInputResponseKind::Accept,
            answers: Some(answers),
        }),
    )
    .await
    .expect("answer");
    let seen = collect_until(&mut a_sub, is_turn_end).await;
    let state = reduce_chat(state, from, &seen);
    assert!(
        markdown(&state).contains("ANSWER: name=Ada, colour=green."),
        "{}",
        markdown(&state)
    );
    assert_eq!(
        json(&state),
        json(&fresh_chat_snapshot(&setup.relay, &chat).await)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_session_uri_in_two_tenants_has_two_agents() {
    let setup = relay_with_agent().await;
    let (acme, _) = setup
        .relay
        .client_as("acme", "ana", relay_core::Role::Member, "ana")
        .await;
    let (globex, _) = setup
        .relay
        .client_as("globex", "gil", relay_core::Role::Member, "gil")
        .await;
    let (_, acme_chat) = scripted_session(&acme, "same").await;
    let (_, globex_chat) = scripted_session(&globex, "same").await;
    prompt(&acme, &acme_chat, "t1", "acme speaking").await;
    let state = prompt(&globex, &globex_chat, "t1", "globex speaking").await;
    // Each tenant's agent counts only its own prompts, in its own directory.
    assert!(turn_text(&state, "t1")
        .0
        .contains("This session has seen 1 prompts."));
    let acme_dir = setup.workspace.path().join("acme/default/same");
    let globex_dir = setup.workspace.path().join("globex/default/same");
    assert!(acme_dir.is_dir() && globex_dir.is_dir());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_each_chat_continues_its_own_acp_session() {
    let (_workspace, _config, file) = agents_file(&[], &[]);
    let data = tempfile::tempdir().expect("data");
    let flags = ["--agents", &file.display().to_string()];
    let mut relay = Relay::start_in(data.path(), &flags).await;
    let (a, _) = relay.client("device-a").await;
    let (session, first) = scripted_session(&a, "two-restarted").await;
    let second = "ahp-chat:/two-restarted-second".to_string();
    create_chat(&a, &session, &second).await;
    prompt(&a, &first, "t1", "one").await;
    prompt(&a, &second, "t2", "two").await;
    prompt(&a, &second, "t3", "three").await;
    a.shutdown().await;
    assert!(relay.terminate().await);

    let relay = Relay::start_in(data.path(), &flags).await;
    let (a, _) = relay.client("device-a").await;
    let state = prompt(&a, &second, "t4", "four").await;
    assert!(turn_text(&state, "t4")
        .0
        .contains("This session has seen 3 prompts."));
    let state = prompt(&a, &first, "t5", "five").await;
    assert!(turn_text(&state, "t5")
        .0
        .contains("This session has seen 2 prompts."));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_a_message_names_is_selected_in_the_agent() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (_, chat) = scripted_session(&a, "models").await;
    let mut smart = message("which model?");
    smart.model = serde_json::from_value(serde_json::json!({"id": "smart"})).expect("model");
    let (state, from, mut sub) = subscribe_chat(&a, &chat).await;
    a.dispatch(chat.clone(), turn_started_with("t1", smart))
        .await
        .expect("dispatch");
    let mut seen = collect_until(&mut sub, is_turn_end).await;
    // A model the agent does not offer ends the turn with the agent's refusal.
    let mut unknown = message("and now?");
    unknown.model = serde_json::from_value(serde_json::json!({"id": "nope"})).expect("model");
    a.dispatch(chat.clone(), turn_started_with("t2", unknown))
        .await
        .expect("dispatch");
    seen.extend(collect_until(&mut sub, is_turn_end).await);
    let state = reduce_chat(state, from, &seen);
    assert!(
        turn_text(&state, "t1").0.contains("MODEL: smart."),
        "{:?}",
        turn_text(&state, "t1")
    );
    let Some(StateAction::ChatError(error)) = seen.last().map(|e| &e.action) else {
        panic!("expected chat/error, got {:?}", seen.last());
    };
    assert_eq!(error.part.error.error_type, "modelSelectionFailed");
}

/// Whether `ancestor` is `pid`'s parent, grandparent, …
fn descends_from(pid: u32, ancestor: Option<u32>) -> bool {
    let mut current = Some(pid);
    while let Some(pid) = current.filter(|pid| *pid > 1) {
        if Some(pid) == ancestor {
            return true;
        }
        current = parent_of(pid);
    }
    false
}

/// The parent process of `pid`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (2nd field) may hold spaces; the parent pid is the 2nd field after its ')'.
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_mid_turn_ends_it_resumably_everywhere_and_the_chat_continues_on_the_next_runner() {
    let (workspace, _config, file) = agents_file(&[], &[]);
    let mut shard = Shard::start(&["--agents", &file.display().to_string()]).await;
    let gateway = Relay::gateway(&shard.url).await;
    let (a, _) = gateway.client("device-a").await;
    let (b, _) = gateway.client("device-b").await;

    // Without a runner the shard lists the agent but cannot place its sessions, and says so.
    let refused = a
        .request::<_, Value>(
            "createSession",
            CreateSessionParams {
                channel: "ahp-session:/unplaced".into(),
                meta: None,
                provider: Some("scripted".into()),
                working_directories: None,
                config: None,
                active_client: None,
                progress_token: None,
            },
        )
        .await
        .expect_err("no runner");
    assert!(refused.to_string().contains("no runner"), "{refused}");

    let mut runner = start_runner(&shard, &file, 1.0).await;
    let (_, chat) = scripted_session(&a, "placed").await;
    let state = prompt(&a, &chat, "t1", "first").await;
    assert!(turn_text(&state, "t1")
        .0
        .contains("This session has seen 1 prompts."));
    // The agent runs under the runner, not under the shard.
    let dir = session_dir(workspace.path(), "placed");
    let agents = agents_in(&dir);
    assert_eq!(agents.len(), 1, "{agents:?}");
    assert!(
        descends_from(agents[0], runner.id()),
        "the agent runs under the runner (in its sandbox)"
    );

    let (a_state, a_from, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (b_state, b_from, mut b_sub) = subscribe_chat(&b, &chat).await;
    a.dispatch(chat.clone(), turn_started("t2", "a slow answer please"))
        .await
        .expect("dispatch");
    let mut a_seen = collect_until(&mut a_sub, |e| matches!(e.action, StateAction::ChatDelta(_))).await;
    runner.start_kill().expect("SIGKILL the runner");
    runner.wait().await.expect("wait");
    a_seen.extend(collect_until(&mut a_sub, is_turn_end).await);
    let b_seen = collect_until(&mut b_sub, is_turn_end).await;
    for seen in [&a_seen, &b_seen] {
        let Some(StateAction::ChatError(error)) = seen.last().map(|e| &e.action) else {
            panic!("expected chat/error, got {:?}", seen.last());
        };
        assert_eq!(error.part.resumable, Some(true), "{error:?}");
        assert_eq!(error.part.error.error_type, "runnerLost");
    }
    let a_final = reduce_chat(a_state, a_from, &a_seen);
    assert_eq!(json(&a_final), json(&reduce_chat(b_state, b_from, &b_seen)));
    assert_eq!(json(&a_final), json(&fresh_chat_snapshot(&gateway, &chat).await));

    // Another runner takes the session at its next prompt and continues the same ACP session.
    let mut runner = start_runner(&shard, &file, 1.0).await;
    let state = prompt(&a, &chat, "t3", "third").await;
    let (reply, notes) = turn_text(&state, "t3");
    assert!(reply.contains("This session has seen 3 prompts."), "{reply}");
    assert!(notes.is_empty(), "{notes:?}");

    // The runner's terminals reach the devices through the shard like any agent output.
    std::fs::write(dir.join("go"), "").expect("the command need not wait");
    let state = prompt(&a, &chat, "t4", "run a command").await;
    let tools: Vec<_> = state.turns[3]
        .response_parts
        .iter()
        .filter_map(|p| match p {
            ResponsePart::ToolCall(tc) => match &tc.tool_call {
                ToolCallState::Completed(done) => Some(done.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let terminal = terminal_of(&tools[0]);
    let (watched, _) = b.subscribe(terminal).await.expect("subscribe terminal");
    let watched = terminal_state(&watched.snapshot.expect("snapshot"));
    assert_eq!(terminal_text(&watched), "hello-from-terminal\nbye\n");
    assert_eq!(watched.lifecycle, exited(Some(3)));

    // A runner that stops stops its agents.
    assert!(
        agents_in(&dir)
            .into_iter()
            .any(|pid| descends_from(pid, runner.id())),
        "the new runner runs the agent"
    );
    assert!(terminate(&mut runner).await);
    let gone = tokio::time::timeout(PATIENCE, async {
        while !agents_in(&dir).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "the agent outlived its runner: {:?}",
        agents_in(&dir)
    );
    wait_for_runners(&shard, 0.0).await;
    assert!(shard.terminate().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_device_watches_an_agents_terminal_live_from_its_tool_call() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (b, _) = setup.relay.client("device-b").await;
    let (_, chat) = scripted_session(&a, "terminal").await;
    let dir = session_dir(setup.workspace.path(), "terminal");
    let (_, _, mut b_sub) = subscribe_chat(&b, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "run a command please"))
        .await
        .expect("dispatch");
    // Device B follows the tool call to its terminal while the command runs.
    let terminal = loop {
        let envelope = next_envelope(&mut b_sub).await;
        if let StateAction::ChatToolCallContentChanged(changed) = &envelope.action {
            if let Some(ToolResultContent::Terminal(terminal)) = changed.content.first() {
                break terminal.resource.clone();
            }
        }
    };
    assert!(terminal.starts_with("ahp-terminal:/"), "{terminal}");
    let (subscribed, mut t_sub) = b.subscribe(terminal.clone()).await.expect("subscribe terminal");
    let snapshot = subscribed.snapshot.expect("snapshot");
    let from = snapshot.from_seq as u64;
    let mut state = terminal_state(&snapshot);
    assert!(
        matches!(
            state.lifecycle,
            ahp_types::state::TerminalLifecycleState::Running(_)
        ),
        "{:?}",
        state.lifecycle
    );
    // It is listed in root state, claimed by the session's chat.
    let (c, init) = setup.relay.client("device-c").await;
    let root = match &init.snapshots[0].state {
        ahp_types::state::SnapshotState::Root(root) => root.clone(),
        other => panic!("{other:?}"),
    };
    let listed = root.terminals.unwrap_or_default();
    assert!(listed.iter().any(|t| t.resource == terminal), "{listed:?}");
    c.shutdown().await;
    // Its output arrives live: the first line, then (once the test lets the command go on) the rest.
    while !terminal_text(&state).contains("hello-from-terminal") {
        let envelope = next_envelope(&mut t_sub).await;
        if envelope.server_seq > from {
            ahp::reducers::apply_action_to_terminal(&mut state, &envelope.action);
        }
    }
    std::fs::write(dir.join("go"), "").expect("let the command finish");
    while state.lifecycle != exited(Some(3)) {
        let envelope = next_envelope(&mut t_sub).await;
        if envelope.server_seq > from {
            ahp::reducers::apply_action_to_terminal(&mut state, &envelope.action);
        }
    }
    assert_eq!(terminal_text(&state), "hello-from-terminal\nbye\n");
    let fresh = setup.relay.client("device-d").await.0;
    let (again, _) = fresh.subscribe(terminal.clone()).await.expect("subscribe");
    assert_eq!(
        json(&state),
        json(&terminal_state(&again.snapshot.expect("snapshot")))
    );
    collect_until(&mut b_sub, is_turn_end).await;
    let reply = markdown(&fresh_chat_snapshot(&setup.relay, &chat).await);
    assert!(
        reply.contains("TERMINAL: hello-from-terminal\nbye (exit 3)."),
        "{reply}"
    );
    // Clients watch an agent's terminal; they cannot type into it.
    b.dispatch(
        terminal.clone(),
        StateAction::TerminalInput(ahp_types::actions::TerminalInputAction { data: "ls\n".into() }),
    )
    .await
    .expect("dispatch");
    let echo = next_envelope(&mut t_sub).await;
    assert!(echo.rejection_reason.is_some(), "{echo:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_terminal_is_kept_across_a_restart() {
    let (workspace, _config, file) = agents_file(&[], &[]);
    let data = tempfile::tempdir().expect("data");
    let flags = ["--agents", &file.display().to_string()];
    let mut relay = Relay::start_in(data.path(), &flags).await;
    let (a, _) = relay.client("device-a").await;
    let (_, chat) = scripted_session(&a, "kept").await;
    std::fs::write(session_dir(workspace.path(), "kept").join("go"), "").expect("go");
    let state = prompt(&a, &chat, "t1", "run a command").await;
    let terminal = terminal_of(&completed_tool_calls(&state)[0]);
    let (before, _) = a.subscribe(terminal.clone()).await.expect("subscribe");
    let before = terminal_state(&before.snapshot.expect("snapshot"));
    a.shutdown().await;
    assert!(relay.terminate().await);

    let relay = Relay::start_in(data.path(), &flags).await;
    let (a, _) = relay.client("device-a").await;
    // Opening the chat loads its session, terminals included.
    let _ = subscribe_chat(&a, &chat).await;
    let (after, _) = a.subscribe(terminal).await.expect("subscribe after the restart");
    let after = terminal_state(&after.snapshot.expect("snapshot"));
    assert_eq!(json(&after), json(&before));
    assert_eq!(terminal_text(&after), "hello-from-terminal\nbye\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_turn_kills_the_command_its_agent_runs() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (b, _) = setup.relay.client("device-b").await;
    let (_, chat) = scripted_session(&a, "killed").await;
    let (_, _, mut a_sub) = subscribe_chat(&a, &chat).await;
    // The command waits for a `go` file that never comes.
    a.dispatch(chat.clone(), turn_started("t1", "run a command"))
        .await
        .expect("dispatch");
    let terminal = loop {
        let envelope = next_envelope(&mut a_sub).await;
        if let StateAction::ChatToolCallContentChanged(changed) = &envelope.action {
            if let Some(ToolResultContent::Terminal(terminal)) = changed.content.first() {
                break terminal.resource.clone();
            }
        }
    };
    let (subscribed, mut t_sub) = a.subscribe(terminal).await.expect("subscribe terminal");
    let mut state = terminal_state(&subscribed.snapshot.expect("snapshot"));
    b.dispatch(
        chat.clone(),
        StateAction::ChatTurnCancelled(ChatTurnCancelledAction {
            turn_id: "t1".into(),
            duration: 0,
            meta: None,
        }),
    )
    .await
    .expect("cancel");
    while matches!(
        state.lifecycle,
        ahp_types::state::TerminalLifecycleState::Running(_)
    ) {
        let envelope = next_envelope(&mut t_sub).await;
        ahp::reducers::apply_action_to_terminal(&mut state, &envelope.action);
    }
    // Killed (by a signal: no exit code).
    assert_eq!(state.lifecycle, exited(None));
    collect_until(&mut a_sub, is_turn_end).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_plan_is_the_chats_activity_and_its_usage_is_reported() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (b, _) = setup.relay.client("device-b").await;
    let (session, chat) = scripted_session(&a, "planned").await;
    let session_uri = session.clone();
    let (_, _, mut b_sub) = subscribe_chat(&b, &chat).await;
    // Device c follows the session from before the turn, and the host's session list.
    let (c, _) = setup.relay.client("device-c").await;
    let mut root = c.attach_subscription("ahp-root://").await;
    let (followed, mut c_sub) = c.subscribe(session.clone()).await.expect("session");
    let mut followed = session_of(&followed.snapshot.expect("snapshot"));
    a.dispatch(chat.clone(), turn_started("t1", "make a plan"))
        .await
        .expect("dispatch");
    let seen = collect_until(&mut b_sub, is_turn_end).await;
    let activities: Vec<Option<String>> = seen
        .iter()
        .filter_map(|e| match &e.action {
            StateAction::ChatActivityChanged(changed) => Some(changed.activity.clone()),
            _ => None,
        })
        .collect();
    // The entry in progress while the turn runs; cleared when it ends.
    assert_eq!(
        activities,
        vec![Some("Write the fix (1/3 done)".to_string()), None],
        "{activities:?}"
    );
    // Cleared in the session's chat list too (AHP: both representations kept consistent), for a fresh
    // subscriber and for one that followed the session all along.
    let (session, _) = b.subscribe(session).await.expect("session");
    let Some(ahp_types::state::SnapshotState::Session(session)) = session.snapshot.map(|s| s.state) else {
        panic!("a session snapshot");
    };
    let listed = session.chats.iter().find(|c| c.resource == chat).expect("listed");
    assert_eq!(listed.activity, None, "the session still lists the plan step");
    // The follower saw the plan step listed, then cleared.
    let mut listed_step = false;
    let cleared = tokio::time::timeout(PATIENCE, async {
        loop {
            let envelope = next_envelope(&mut c_sub).await;
            ahp::reducers::apply_action_to_session(&mut followed, &envelope.action);
            let activity = followed
                .chats
                .iter()
                .find(|c| c.resource == chat)
                .and_then(|c| c.activity.clone());
            listed_step |= activity.is_some();
            if listed_step && activity.is_none() {
                break;
            }
        }
    })
    .await;
    assert!(
        cleared.is_ok(),
        "the follower's list kept the plan step (listed: {listed_step})"
    );
    // So did its session list (root notifications: a summary that sets the step, then one without it).
    let mut shown: Option<String> = None;
    let mut shown_step = false;
    let cleared = tokio::time::timeout(PATIENCE, async {
        loop {
            match root.recv().await {
                Some(ahp::SubscriptionEvent::SessionAdded(added))
                    if added.summary.resource == session_uri =>
                {
                    shown = added.summary.activity.clone();
                }
                Some(ahp::SubscriptionEvent::SessionSummaryChanged(changed))
                    if changed.session == session_uri =>
                {
                    if let Some(activity) = changed.changes.activity.clone() {
                        shown = Some(activity);
                    }
                }
                Some(_) => {}
                None => panic!("root subscription closed"),
            }
            shown_step |= shown.is_some();
            if shown_step && shown.is_none() {
                break;
            }
        }
    })
    .await;
    assert!(
        cleared.is_ok(),
        "the session list kept the plan step (shown: {shown_step})"
    );
    let usage = seen
        .iter()
        .find_map(|e| match &e.action {
            StateAction::ChatUsage(usage) => Some(usage.usage.clone()),
            _ => None,
        })
        .expect("chat/usage");
    let window = &usage.meta.expect("meta")["ahpRelay/contextWindow"];
    assert_eq!(
        (window["used"].as_u64(), window["size"].as_u64()),
        (Some(1200), Some(200_000))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_needs_a_credential_says_which_and_gets_it_from_a_secret_file() {
    // Without its key the agent refuses session/new; the failure names the agent's authentication methods.
    let (_workspace, _config, file) = agents_file(&["--require-key"], &[]);
    let relay = Relay::start_with(&["--agents", &file.display().to_string()]).await;
    let (a, _) = relay.client("device-a").await;
    let error = creation_error(&a, "scripted", "locked").await;
    assert!(
        error.message.contains("API key (api-key): set TEST_AGENT_KEY"),
        "{}",
        error.message
    );

    // Given the tenant's key in a secret file (`[agent.tenants.dev] env_files`), the same agent opens sessions.
    let (_workspace, config, file) = agents_file(&["--require-key"], &[]);
    let secret = config.path().join("test-agent-key");
    std::fs::write(&secret, "s3cret\n").expect("secret");
    let text = std::fs::read_to_string(&file).expect("read");
    std::fs::write(
        &file,
        format!(
            "{text}[agent.tenants.dev]\nenv_files = {{ TEST_AGENT_KEY = {:?} }}\n",
            secret.display().to_string()
        ),
    )
    .expect("write");
    let relay = Relay::start_with(&["--agents", &file.display().to_string()]).await;
    let (a, _) = relay.client("device-a").await;
    let (_, chat) = scripted_session(&a, "unlocked").await;
    let state = prompt(&a, &chat, "t1", "show your environment").await;
    let (reply, _) = turn_text(&state, "t1");
    assert!(reply.contains("TEST_AGENT_KEY"), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_settings_are_session_config_any_device_may_change() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (b, _) = setup.relay.client("device-b").await;
    let resolve = |config: Value| {
        let a = &a;
        async move {
            let resolved: ahp_types::commands::ResolveSessionConfigResult = a
                .request(
                    "resolveSessionConfig",
                    serde_json::json!({"channel": "ahp-root://", "provider": "scripted", "config": config}),
                )
                .await
                .expect("resolveSessionConfig");
            resolved
        }
    };
    // Until the agent ran once, the relay does not know its settings.
    assert!(resolve(serde_json::json!({})).await.schema.properties.is_empty());
    scripted_session(&a, "first").await;

    // Its config options (but the model) and its modes are the session config, with allowed values only.
    let resolved = resolve(serde_json::json!({"effort": "high", "mode": "warp"})).await;
    let mut properties: Vec<&String> = resolved.schema.properties.keys().collect();
    properties.sort();
    assert_eq!(properties, ["effort", "mode"]);
    assert_eq!(
        Value::Object(resolved.values),
        serde_json::json!({"effort": "high", "mode": "ask"})
    );

    let chosen = serde_json::json!({"effort": "high", "mode": "code"});
    let (session, chat) = configured_session(&a, "scripted", "configured", chosen.as_object().cloned()).await;
    let state = prompt(&a, &chat, "t1", "show your settings").await;
    assert!(turn_text(&state, "t1")
        .0
        .contains("SETTINGS: effort=high, mode=code."));

    // Another device changes a setting: the next prompt runs with it.
    let (snapshot, mut sub) = b.subscribe(session.clone()).await.expect("subscribe");
    let from = snapshot.snapshot.expect("snapshot").from_seq as u64;
    let change = |value: &str| {
        StateAction::SessionConfigChanged(ahp_types::actions::SessionConfigChangedAction {
            config: serde_json::json!({"effort": value})
                .as_object()
                .cloned()
                .expect("object"),
            replace: None,
        })
    };
    b.dispatch(session.clone(), change("low"))
        .await
        .expect("dispatch");
    // The session's channel may carry other actions first (the last turn's end reaching the session).
    let echo = loop {
        let envelope = next_envelope(&mut sub).await;
        if let StateAction::SessionConfigChanged(_) = envelope.action {
            break envelope;
        }
    };
    assert!(
        echo.server_seq > from && echo.rejection_reason.is_none(),
        "{echo:?}"
    );
    let state = prompt(&a, &chat, "t2", "show your settings again").await;
    assert!(turn_text(&state, "t2")
        .0
        .contains("SETTINGS: effort=low, mode=code."));
    // A value the agent does not offer is refused.
    b.dispatch(session.clone(), change("extreme"))
        .await
        .expect("dispatch");
    loop {
        let envelope = next_envelope(&mut sub).await;
        if let StateAction::SessionConfigChanged(_) = envelope.action {
            assert!(envelope.rejection_reason.is_some(), "{envelope:?}");
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_slash_commands_complete_in_every_devices_input() {
    let setup = relay_with_agent().await;
    let (a, init) = setup.relay.client("device-a").await;
    // `/` for the agent's commands, `@` for the workspace's files (this relay holds the workspace).
    assert_eq!(
        init.completion_trigger_characters.as_deref(),
        Some(&["/".to_string(), "@".to_string()][..])
    );
    let (session, chat) = scripted_session(&a, "commands").await;
    // The agent announces its commands right after session/new; they land in the session's state.
    let (subscribed, mut sub) = a.subscribe(session.clone()).await.expect("subscribe");
    let mut state = session_of(&subscribed.snapshot.expect("snapshot"));
    let commands = |state: &ahp_types::state::SessionState| {
        state
            .meta
            .as_ref()
            .and_then(|meta| meta.get("ahpRelay/agent"))
            .and_then(|agent| agent.get("commands"))
            .and_then(Value::as_array)
            .map_or(0, Vec::len)
    };
    while commands(&state) == 0 {
        let envelope = next_envelope(&mut sub).await;
        ahp::reducers::apply_action_to_session(&mut state, &envelope.action);
    }
    let (b, _) = setup.relay.client("device-b").await;
    let completed: ahp_types::commands::CompletionsResult = b
        .request(
            "completions",
            serde_json::json!({"channel": chat, "kind": "userMessage", "text": "/re", "offset": 3}),
        )
        .await
        .expect("completions");
    let offered: Vec<&str> = completed
        .items
        .iter()
        .map(|item| item.insert_text.as_str())
        .collect();
    assert_eq!(offered, ["/review ", "/reset "]);
    let none: ahp_types::commands::CompletionsResult = b
        .request(
            "completions",
            serde_json::json!({"channel": chat, "kind": "userMessage", "text": "say /re", "offset": 7}),
        )
        .await
        .expect("completions");
    assert!(none.items.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_stuck_starting_fails_the_session_after_its_start_timeout() {
    let (_workspace, _config, file) = agents_file(&["--hang-on-new-session"], &[]);
    let text = std::fs::read_to_string(&file).expect("read");
    std::fs::write(&file, format!("start_timeout_seconds = 1\n{text}")).expect("write");
    let relay = Relay::start_with(&["--agents", &file.display().to_string()]).await;
    let (a, _) = relay.client("device-a").await;
    let error = creation_error(&a, "scripted", "stuck").await;
    assert_eq!(error.error_type, "agentStartTimeout");
    assert!(
        error.message.contains("session/new within 1s"),
        "{}",
        error.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_while_its_agent_starts_fails_the_session() {
    let (workspace, _config, file) = agents_file(&["--hang-on-new-session"], &[]);
    let shard = Shard::start(&["--agents", &file.display().to_string()]).await;
    let gateway = Relay::gateway(&shard.url).await;
    let mut runner = start_runner(&shard, &file, 1.0).await;
    let (a, _) = gateway.client("device-a").await;
    let session = "ahp-session:/unborn".to_string();
    let _: Value = a
        .request(
            "createSession",
            CreateSessionParams {
                channel: session.clone(),
                meta: None,
                provider: Some("scripted".into()),
                working_directories: None,
                config: None,
                active_client: None,
                progress_token: None,
            },
        )
        .await
        .expect("createSession");
    let (result, mut sub) = a.subscribe(session.clone()).await.expect("subscribe");
    let mut state = session_of(&result.snapshot.expect("snapshot"));
    // The agent has started (and hangs in session/new) when the runner dies.
    let dir = session_dir(workspace.path(), "unborn");
    let started = tokio::time::timeout(PATIENCE, async {
        while agents_in(&dir).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(started.is_ok(), "the agent never started");
    runner.start_kill().expect("SIGKILL the runner");
    runner.wait().await.expect("wait");
    while state.lifecycle == SessionLifecycle::Creating {
        let envelope = next_envelope(&mut sub).await;
        ahp::reducers::apply_action_to_session(&mut state, &envelope.action);
    }
    assert_eq!(state.lifecycle, SessionLifecycle::Failed);
    assert_eq!(state.creation_error.expect("error").error_type, "runnerLost");
}

/// A session whose agent was still starting when the relay was killed does not stay `creating` after the
/// restart: it fails, saying why (issue 24, 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_still_starting_at_a_crash_fails_after_the_restart() {
    let (_workspace, _config, file) = agents_file(&["--hang-on-new-session"], &[]);
    let data = tempfile::tempdir().expect("tempdir");
    let flags = ["--agents".to_string(), file.display().to_string()];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut relay = Relay::start_in(data.path(), &flags).await;
    let (a, _) = relay.client("device-a").await;
    let session = "ahp-session:/interrupted".to_string();
    let _: Value = a
        .request(
            "createSession",
            CreateSessionParams {
                channel: session.clone(),
                meta: None,
                provider: Some("scripted".into()),
                working_directories: None,
                config: None,
                active_client: None,
                progress_token: None,
            },
        )
        .await
        .expect("createSession");
    let (result, _) = a.subscribe(session.clone()).await.expect("subscribe");
    assert_eq!(
        session_of(&result.snapshot.expect("snapshot")).lifecycle,
        SessionLifecycle::Creating
    );
    a.shutdown().await;
    relay.kill().await;

    let relay = Relay::start_in(data.path(), &flags).await;
    let (b, _) = relay.client("device-b").await;
    let (result, _) = b.subscribe(session.clone()).await.expect("subscribe");
    let state = session_of(&result.snapshot.expect("snapshot"));
    assert_eq!(state.lifecycle, SessionLifecycle::Failed);
    assert_eq!(state.creation_error.expect("error").error_type, "interrupted");
}

/// Overlapping questions of one turn have ids of their own: the agent asks two at once, then a third once the
/// first is answered while the second still waits; each answer reaches the question it answers (issue 24, 9).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_questions_of_a_turn_have_distinct_ids() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (_, chat) = scripted_session(&a, "questions").await;
    let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
    a.dispatch(
        chat.clone(),
        turn_started("t1", "please ask overlapping questions"),
    )
    .await
    .expect("dispatch");
    let answer = |request_id: &str, name: &str| {
        let answers: std::collections::HashMap<String, ahp_types::state::ChatInputAnswer> =
            serde_json::from_value(serde_json::json!({
                "name": {"state": "submitted", "value": {"kind": "text", "value": name}},
            }))
            .expect("answers");
        StateAction::ChatInputCompleted(ahp_types::actions::ChatInputCompletedAction {
            request_id: request_id.into(),
            response: ahp_types::state::ChatInputResponseKind::Accept,
            answers: Some(answers),
        })
    };
    let mut asked: Vec<(String, String)> = Vec::new();
    let next_request = async |sub: &mut ahp::SessionSubscription| loop {
        let envelope = next_envelope(sub).await;
        if let StateAction::ChatInputRequested(requested) = &envelope.action {
            let message = requested.request.message.clone().unwrap_or_default();
            return (requested.request.id.clone(), message);
        }
    };
    asked.push(next_request(&mut sub).await);
    asked.push(next_request(&mut sub).await);
    let first = asked
        .iter()
        .find(|(_, message)| message.contains("first"))
        .cloned()
        .expect("the first question");
    a.dispatch(chat.clone(), answer(&first.0, "Ada"))
        .await
        .expect("answer");
    let third = next_request(&mut sub).await;
    let second = asked
        .iter()
        .find(|(_, message)| message.contains("second"))
        .cloned()
        .expect("the second question");
    assert_ne!(
        third.0, second.0,
        "the third question took the waiting second one's id"
    );
    a.dispatch(chat.clone(), answer(&second.0, "Bob"))
        .await
        .expect("answer");
    a.dispatch(chat.clone(), answer(&third.0, "Cy"))
        .await
        .expect("answer");
    collect_until(&mut sub, is_turn_end).await;
    let state = fresh_chat_snapshot(&setup.relay, &chat).await;
    assert!(
        markdown(&state).contains("ANSWERS: Ada, Bob, Cy."),
        "{}",
        markdown(&state)
    );
}

/// `createSession` without a provider takes the host's configured `defaultProvider` (root config, which an
/// admin changes), not always the first agent configured (issue 24, 14).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_session_without_a_provider_takes_the_configured_default() {
    let setup = relay_with_agent().await;
    let admin = setup.relay.connect("dev", "boss", relay_core::Role::Admin).await;
    admin
        .initialize("boss".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    let (root, _) = admin.subscribe("ahp-root://".into()).await.expect("root");
    let Some(ahp_types::state::SnapshotState::Root(root)) = root.snapshot.map(|s| s.state) else {
        panic!("a root snapshot");
    };
    let current = root
        .config
        .as_ref()
        .and_then(|config| config.values.get("defaultProvider"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let other = root
        .agents
        .iter()
        .map(|agent| agent.provider.clone())
        .find(|provider| Some(provider) != current.as_ref())
        .expect("two providers");
    let mut change = serde_json::Map::new();
    change.insert("defaultProvider".into(), Value::from(other.clone()));
    admin
        .dispatch(
            "ahp-root://".into(),
            StateAction::RootConfigChanged(ahp_types::actions::RootConfigChangedAction {
                config: change,
                replace: None,
            }),
        )
        .await
        .expect("dispatch");
    // (The admin's next request is answered after its dispatch was applied.)
    admin.ping().await.expect("ping");
    let session = "ahp-session:/by-default".to_string();
    let _: Value = admin
        .request("createSession", serde_json::json!({"channel": session}))
        .await
        .expect("createSession");
    let (created, _) = admin.subscribe(session).await.expect("subscribe");
    assert_eq!(session_of(&created.snapshot.expect("snapshot")).provider, other);
}

/// Truncating a chat whose turn is running stops the agent's turn (AHP: the active turn is dropped), so the
/// agent's session is free: another chat of the session runs a turn at once (issue 24, 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncating_a_running_turn_frees_the_agent_for_the_sessions_other_chats() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (session, chat) = scripted_session(&a, "truncated").await;
    let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
    // The agent waits for an answer nobody gives.
    a.dispatch(chat.clone(), turn_started("t1", "please ask me something"))
        .await
        .expect("dispatch");
    collect_until(&mut sub, |e| {
        matches!(e.action, StateAction::ChatInputRequested(_))
    })
    .await;
    a.dispatch(
        chat.clone(),
        StateAction::ChatTruncated(ahp_types::actions::ChatTruncatedAction { turn_id: None }),
    )
    .await
    .expect("truncate");
    let other = "ahp-chat:/truncated-other".to_string();
    let _: Value = a
        .request(
            "createChat",
            serde_json::json!({"channel": session, "chat": other}),
        )
        .await
        .expect("createChat");
    let (_, _, mut other_sub) = subscribe_chat(&a, &other).await;
    a.dispatch(other.clone(), turn_started("t2", "hello"))
        .await
        .expect("dispatch");
    let ended = collect_until(&mut other_sub, is_turn_end).await;
    assert!(
        ended
            .iter()
            .any(|e| matches!(e.action, StateAction::ChatTurnComplete(_))),
        "{ended:?}"
    );
}

/// A turn cancelled while it waits behind another chat's turn (one agent serves the session's chats in turn)
/// never reaches the agent (issue 24, 13): the chat's next turn is the first its agent session sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_cancelled_while_queued_never_reaches_the_agent() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (session, busy) = scripted_session(&a, "queued-cancel").await;
    let (_, _, mut busy_sub) = subscribe_chat(&a, &busy).await;
    // The agent is held by the busy chat's question.
    a.dispatch(busy.clone(), turn_started("t1", "please ask me something"))
        .await
        .expect("dispatch");
    let asked = collect_until(&mut busy_sub, |e| {
        matches!(e.action, StateAction::ChatInputRequested(_))
    })
    .await;
    let StateAction::ChatInputRequested(asked) = &asked[asked.len() - 1].action else {
        unreachable!()
    };
    let waiting = "ahp-chat:/queued-cancel-waiting".to_string();
    let _: Value = a
        .request(
            "createChat",
            serde_json::json!({"channel": session, "chat": waiting}),
        )
        .await
        .expect("createChat");
    let (_, _, mut waiting_sub) = subscribe_chat(&a, &waiting).await;
    a.dispatch(waiting.clone(), turn_started("w1", "never mind"))
        .await
        .expect("dispatch");
    a.dispatch(
        waiting.clone(),
        StateAction::ChatTurnCancelled(ChatTurnCancelledAction {
            turn_id: "w1".into(),
            duration: 1,
            meta: None,
        }),
    )
    .await
    .expect("cancel");
    collect_until(&mut waiting_sub, is_turn_end).await;
    // The busy chat's question is answered: its turn ends, and the agent takes the next one.
    let answers: std::collections::HashMap<String, ahp_types::state::ChatInputAnswer> =
        serde_json::from_value(serde_json::json!({
            "name": {"state": "submitted", "value": {"kind": "text", "value": "Ada"}},
        }))
        .expect("answers");
    a.dispatch(
        busy.clone(),
        StateAction::ChatInputCompleted(ahp_types::actions::ChatInputCompletedAction {
            request_id: asked.request.id.clone(),
            response: ahp_types::state::ChatInputResponseKind::Accept,
            answers: Some(answers),
        }),
    )
    .await
    .expect("answer");
    collect_until(&mut busy_sub, is_turn_end).await;
    a.dispatch(waiting.clone(), turn_started("w2", "hello"))
        .await
        .expect("dispatch");
    collect_until(&mut waiting_sub, is_turn_end).await;
    let state = fresh_chat_snapshot(&setup.relay, &waiting).await;
    assert!(
        turn_text(&state, "w2")
            .0
            .contains("This session has seen 1 prompts."),
        "{}",
        turn_text(&state, "w2").0
    );
}

/// A fork and a side chat reach the ACP agent with their context (issue 24, 1): each is a new ACP session,
/// whose first prompt carries the history it continues (a fork's copied turns; a side chat's source up to
/// its turn, and the selection), told once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_and_a_side_chat_reach_the_acp_agent_with_their_context() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (session, chat) = scripted_session(&a, "forked").await;
    prompt(&a, &chat, "t1", "hello alpha").await;
    let fork = "ahp-chat:/forked-fork".to_string();
    let _: Value = a
        .request(
            "createChat",
            serde_json::json!({"channel": session, "chat": fork,
                "source": {"kind": "fork", "chat": chat, "turnId": "t1"}}),
        )
        .await
        .expect("fork");
    let state = prompt(&a, &fork, "t2", "and then").await;
    let (reply, _) = turn_text(&state, "t2");
    assert!(reply.contains("This session has seen 1 prompts."), "{reply}");
    assert!(reply.contains("CONTEXT GIVEN:"), "{reply}");
    assert!(reply.contains("User: hello alpha"), "{reply}");
    // Told once: the fork's next turn continues its ACP session.
    let state = prompt(&a, &fork, "t3", "once more").await;
    let (reply, _) = turn_text(&state, "t3");
    assert!(reply.contains("This session has seen 2 prompts."), "{reply}");
    assert!(!reply.contains("CONTEXT GIVEN:"), "{reply}");

    let side = "ahp-chat:/forked-side".to_string();
    let _: Value = a
        .request(
            "createChat",
            serde_json::json!({"channel": session, "chat": side,
                "source": {"kind": "sideChat", "chat": chat, "turnId": "t1", "selection": {"text": "alpha"}}}),
        )
        .await
        .expect("side chat");
    let state = prompt(&a, &side, "t4", "what is this").await;
    let (reply, _) = turn_text(&state, "t4");
    assert!(reply.contains("side chat"), "{reply}");
    assert!(reply.contains("User: hello alpha"), "{reply}");
    assert!(
        reply.contains("The part of it the user selected: | alpha"),
        "{reply}"
    );
    // The side chat's own history does not hold its source.
    assert_eq!(state.turns.len(), 1);
}

/// After a truncation the agent starts the chat afresh, told only the kept turns (issue 24, 3): "truncate,
/// then resend an edited message" does not reach a session that still holds the removed turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_truncation_the_acp_agent_starts_the_chat_afresh_with_the_kept_turns() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (_, chat) = scripted_session(&a, "edited").await;
    prompt(&a, &chat, "t1", "first words").await;
    prompt(&a, &chat, "t2", "second words").await;
    a.dispatch(
        chat.clone(),
        StateAction::ChatTruncated(ahp_types::actions::ChatTruncatedAction {
            turn_id: Some("t1".into()),
        }),
    )
    .await
    .expect("truncate");
    let state = prompt(&a, &chat, "t3", "second words, edited").await;
    let (reply, _) = turn_text(&state, "t3");
    assert!(reply.contains("This session has seen 1 prompts."), "{reply}");
    assert!(reply.contains("User: first words"), "{reply}");
    assert!(!reply.contains("User: second words"), "{reply}");
}

/// An agent configured without `multiple_chats` does not advertise `multipleChats`: its sessions keep their
/// default chat, and `createChat` (plain, fork or side chat) is refused (issue 24, 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_multiple_chats_keeps_each_session_to_its_default_chat() {
    let (_workspace, _config, file) = agents_file(&[], &[]);
    let text = std::fs::read_to_string(&file).expect("read");
    std::fs::write(&file, format!("{text}multiple_chats = false\n")).expect("write");
    let relay = Relay::start_with(&["--agents", &file.display().to_string()]).await;
    let (a, _) = relay.client("device-a").await;
    let (root, _root_sub) = a
        .subscribe("ahp-root://".to_string())
        .await
        .expect("subscribe root");
    let root = serde_json::to_value(root.snapshot.expect("snapshot").state).expect("root state");
    let scripted = root["agents"]
        .as_array()
        .and_then(|agents| agents.iter().find(|agent| agent["provider"] == "scripted"))
        .expect("listed");
    assert!(scripted["capabilities"]["multipleChats"].is_null(), "{scripted}");
    let (session, chat) = scripted_session(&a, "single").await;
    let state = prompt(&a, &chat, "t1", "hello").await;
    assert!(turn_text(&state, "t1")
        .0
        .contains("This session has seen 1 prompts."));
    for source in [
        Value::Null,
        serde_json::json!({"kind": "fork", "chat": chat, "turnId": "t1"}),
        serde_json::json!({"kind": "sideChat", "chat": chat, "turnId": "t1"}),
    ] {
        let mut params = serde_json::json!({"channel": session, "chat": "ahp-chat:/single-more"});
        if !source.is_null() {
            params["source"] = source;
        }
        match a.request::<_, Value>("createChat", params).await {
            Err(ahp::ClientError::Rpc(e)) => {
                assert_eq!(e.code, -32600, "{}", e.message);
                assert!(e.message.contains("multipleChats"), "{}", e.message);
            }
            other => panic!("a second chat was created: {other:?}"),
        }
    }
}

/// A permission request of another ACP session (a tool call that outlived its chat's turn) is withdrawn,
/// never shown in the turn the agent runs at the time (issue 24, 13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_permission_of_another_chat_never_lands_in_the_running_turn() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (session, first) = scripted_session(&a, "late").await;
    prompt(&a, &first, "t1", "ask later").await;
    let second = "ahp-chat:/late-second".to_string();
    create_chat(&a, &session, &second).await;
    let (_, _, mut sub) = subscribe_chat(&a, &second).await;
    a.dispatch(second.clone(), turn_started("t2", "slow"))
        .await
        .expect("dispatch");
    // Once the second chat's turn streams, the first chat's late question comes.
    collect_until(&mut sub, |e| {
        matches!(
            e.action,
            StateAction::ChatResponsePart(_) | StateAction::ChatDelta(_)
        )
    })
    .await;
    let dir = session_dir(setup.workspace.path(), "late");
    std::fs::write(dir.join("go"), "").expect("go");
    let outcome = dir.join("late-outcome");
    let mut seen = Vec::new();
    let answered = tokio::time::timeout(PATIENCE, async {
        loop {
            if outcome.exists() {
                break;
            }
            match tokio::time::timeout(Duration::from_millis(50), next_envelope(&mut sub)).await {
                Ok(envelope) => {
                    assert!(
                        !is_turn_end(&envelope),
                        "the turn ended before the question was answered"
                    );
                    seen.push(envelope);
                }
                Err(_) => continue,
            }
        }
    })
    .await;
    assert!(answered.is_ok(), "the late question was never answered");
    assert_eq!(std::fs::read_to_string(&outcome).expect("outcome"), "cancelled");
    let shown: Vec<String> = seen
        .iter()
        .map(|e| serde_json::to_string(&e.action).unwrap_or_default())
        .filter(|json| json.contains("late-call"))
        .collect();
    assert!(
        shown.is_empty(),
        "the other chat's question reached this turn: {shown:?}"
    );
    a.dispatch(
        second.clone(),
        StateAction::ChatTurnCancelled(ChatTurnCancelledAction {
            turn_id: "t2".into(),
            duration: 0,
            meta: None,
        }),
    )
    .await
    .expect("cancel");
    collect_until(&mut sub, is_turn_end).await;
}

/// A message's attachments reach the ACP agent as prompt content (a chat reference as its transcript, a
/// resource as a link), and one the agent's `promptCapabilities` do not accept (an image, for this agent)
/// ends the turn with an error naming it (issue 24, 8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachments_reach_the_acp_agent_within_what_it_accepts() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (session, chat) = scripted_session(&a, "attached").await;
    prompt(&a, &chat, "t1", "remember the word zebra").await;
    let other = "ahp-chat:/attached-other".to_string();
    create_chat(&a, &session, &other).await;
    let with = |turn_id: &str, attachments: Value| {
        let mut message = message("what do you see");
        message.attachments = Some(serde_json::from_value(attachments).expect("attachments"));
        turn_started_with(turn_id, message)
    };
    let (state, from, mut sub) = subscribe_chat(&a, &other).await;
    a.dispatch(
        other.clone(),
        with(
            "t2",
            serde_json::json!([{"type": "chat", "label": "first chat", "resource": chat},
                               {"type": "resource", "label": "spec", "uri": "https://example.com/spec"}]),
        ),
    )
    .await
    .expect("dispatch");
    let seen = collect_until(&mut sub, is_turn_end).await;
    let state = reduce_chat(state, from, &seen);
    let (reply, _) = turn_text(&state, "t2");
    assert!(reply.contains("[Attachment: first chat]"), "{reply}");
    assert!(reply.contains("User: remember the word zebra"), "{reply}");
    assert!(reply.contains("LINK: https://example.com/spec"), "{reply}");

    a.dispatch(
        other.clone(),
        with(
            "t3",
            serde_json::json!([{"type": "embeddedResource", "label": "shot.png", "data": "iVBORw0KGgo=",
                                "contentType": "image/png"}]),
        ),
    )
    .await
    .expect("dispatch");
    let ended = collect_until(&mut sub, is_turn_end).await;
    let error = ended
        .iter()
        .find_map(|e| match &e.action {
            StateAction::ChatError(error) => Some(error.part.error.clone()),
            _ => None,
        })
        .expect("the turn ended in an error");
    assert_eq!(error.error_type, "attachmentNotSupported", "{error:?}");
    assert!(
        error.message.contains("images") && error.message.contains("shot.png"),
        "{error:?}"
    );
}

/// What a truncation owes the agent is not lost with a turn that never reached it (issue 24, 3): after a
/// truncation, a message whose attachment the agent cannot take ends in an error, and the next message still
/// starts the chat afresh, told the kept turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_never_reaches_the_agent_keeps_what_a_truncation_owes_it() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (_, chat) = scripted_session(&a, "owed-reset").await;
    prompt(&a, &chat, "t1", "first words").await;
    prompt(&a, &chat, "t2", "second words").await;
    a.dispatch(
        chat.clone(),
        StateAction::ChatTruncated(ahp_types::actions::ChatTruncatedAction {
            turn_id: Some("t1".into()),
        }),
    )
    .await
    .expect("truncate");
    let mut with_image = message("look");
    with_image.attachments = Some(
        serde_json::from_value(
            serde_json::json!([{"type": "embeddedResource", "label": "shot.png",
            "data": "iVBORw0KGgo=", "contentType": "image/png"}]),
        )
        .expect("attachments"),
    );
    let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
    a.dispatch(chat.clone(), turn_started_with("t3", with_image))
        .await
        .expect("dispatch");
    let ended = collect_until(&mut sub, is_turn_end).await;
    assert!(
        ended
            .iter()
            .any(|e| matches!(e.action, StateAction::ChatError(_))),
        "{ended:?}"
    );
    a.unsubscribe(chat.clone()).await.expect("unsubscribe");
    let state = prompt(&a, &chat, "t4", "second words, edited").await;
    let (reply, _) = turn_text(&state, "t4");
    assert!(reply.contains("This session has seen 1 prompts."), "{reply}");
    assert!(reply.contains("User: first words"), "{reply}");
    assert!(!reply.contains("User: second words"), "{reply}");
}

/// A truncation that drops the running turn leaves the chat idle: its queued message runs at once (issue
/// 24, 3 and 10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_message_runs_once_a_truncation_drops_the_running_turn() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (_, chat) = scripted_session(&a, "queued-truncated").await;
    let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "please ask me something"))
        .await
        .expect("dispatch");
    collect_until(&mut sub, |e| {
        matches!(e.action, StateAction::ChatInputRequested(_))
    })
    .await;
    a.dispatch(
        chat.clone(),
        StateAction::ChatPendingMessageSet(ahp_types::actions::ChatPendingMessageSetAction {
            kind: ahp_types::state::PendingMessageKind::Queued,
            id: "q1".into(),
            message: message("after the truncation"),
        }),
    )
    .await
    .expect("queue");
    a.dispatch(
        chat.clone(),
        StateAction::ChatTruncated(ahp_types::actions::ChatTruncatedAction { turn_id: None }),
    )
    .await
    .expect("truncate");
    let seen = collect_until(&mut sub, |e| matches!(e.action, StateAction::ChatTurnComplete(_))).await;
    let started = seen.iter().find_map(|e| match &e.action {
        StateAction::ChatTurnStarted(a) => Some(a.message.text.clone()),
        _ => None,
    });
    assert_eq!(started.as_deref(), Some("after the truncation"), "{seen:?}");
}

/// Issue 25 (6): `initialize` names the tenant's part of the workspace as `defaultDirectory` (so a client can
/// offer names under it) — in `serve`, and through a gateway to a shard once a runner holding the workspace has
/// registered (its hello says where its workspace is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_names_the_tenants_part_of_the_workspace_as_default_directory() {
    let setup = relay_with_agent().await;
    let (_, init) = setup.relay.client("device-a").await;
    let expected = format!("file://{}", setup.workspace.path().join("dev").display());
    assert_eq!(init.default_directory.as_deref(), Some(expected.as_str()));

    let (workspace, _config, file) = agents_file(&[], &[]);
    let shard = Shard::start(&["--agents", &file.display().to_string()]).await;
    let gateway = Relay::gateway(&shard.url).await;
    let (_, before) = gateway.client("device-b").await;
    assert_eq!(before.default_directory, None, "no runner, no workspace known");
    let _runner = start_runner(&shard, &file, 1.0).await;
    let (_, after) = gateway.client("device-c").await;
    let expected = format!("file://{}", workspace.path().join("dev").display());
    assert_eq!(after.default_directory.as_deref(), Some(expected.as_str()));
}

/// Issue 26 (2): an agent's large file edit, long text output and image go into the state by reference
/// (`ahp-content:/…`), their bytes in the store: the chat's state stays small, `resourceRead` serves them (also
/// after a restart, not to another tenant), and they go with their session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_tool_output_is_kept_by_reference_and_goes_with_its_session() {
    let (_workspace, _config, file) = agents_file(&[], &[]);
    let data = tempfile::tempdir().expect("data");
    let flags = ["--agents", &file.display().to_string()];
    let mut relay = Relay::start_in(data.path(), &flags).await;
    let (a, _) = relay.client("device-a").await;
    let (session, chat) = scripted_session(&a, "big").await;
    let state = prompt(&a, &chat, "t1", "big output").await;
    let parts = serde_json::to_string(&state.turns[0].response_parts).expect("json");
    assert!(!parts.contains("data:"), "nothing large stays inline");
    assert!(parts.len() < 16 * 1024, "the turn is {} bytes", parts.len());
    let tool = completed_tool_calls(&state)
        .into_iter()
        .find(|call| call.tool_call_id == "big")
        .expect("the big tool call");
    let contents = serde_json::to_value(&tool.content).expect("json");
    let by_type = |kind: &str| -> Vec<Value> {
        contents
            .as_array()
            .expect("contents")
            .iter()
            .filter(|content| content["type"] == kind)
            .cloned()
            .collect()
    };
    let after = by_type("fileEdit")[0]["after"]["content"]["uri"]
        .as_str()
        .expect("after")
        .to_string();
    let resources = by_type("resource");
    let uri_of = |content_type: &str| {
        resources
            .iter()
            .find(|r| {
                r["contentType"]
                    .as_str()
                    .is_some_and(|t| t.starts_with(content_type))
            })
            .and_then(|r| r["uri"].as_str())
            .expect(content_type)
            .to_string()
    };
    let (text_uri, image_uri) = (uri_of("text/plain"), uri_of("image/png"));
    assert!(by_type("text")[0]["text"]
        .as_str()
        .expect("preview")
        .contains(&text_uri));
    let read = |client: &ahp::Client, uri: String| {
        let client = client.clone();
        async move {
            client
                .request::<_, Value>(
                    "resourceRead",
                    serde_json::json!({"channel": "ahp-root://", "uri": uri}),
                )
                .await
        }
    };
    let check = |client: ahp::Client| {
        let (after, text_uri, image_uri) = (after.clone(), text_uri.clone(), image_uri.clone());
        async move {
            let edited = read(&client, after).await.expect("the edit's after side");
            assert_eq!(edited["data"], "new line\n".repeat(7_000));
            let text = read(&client, text_uri).await.expect("the text output");
            assert_eq!(text["data"], "output line\n".repeat(5_000));
            let image = read(&client, image_uri).await.expect("the image");
            assert_eq!(
                (image["encoding"].as_str(), image["data"].as_str()),
                (Some("base64"), Some("AAAA".repeat(10_000).as_str()))
            );
        }
    };
    check(a.clone()).await;
    // Stored: a restart serves them again.
    a.shutdown().await;
    assert!(relay.terminate().await);
    let relay = Relay::start_in(data.path(), &flags).await;
    let (a, _) = relay.client("device-a").await;
    check(a.clone()).await;
    // Another tenant reaches none of them.
    let (other, _) = relay
        .client_as("other-tenant", "someone", relay_core::Role::Member, "other")
        .await;
    let refused = read(&other, after.clone()).await;
    assert!(
        matches!(&refused, Err(ahp::ClientError::Rpc(e)) if e.code == -32008),
        "{refused:?}"
    );
    // They go with their session.
    let _: Value = a
        .request("disposeSession", serde_json::json!({"channel": session}))
        .await
        .expect("dispose");
    let gone = read(&a, after).await;
    assert!(
        matches!(&gone, Err(ahp::ClientError::Rpc(e)) if e.code == -32008),
        "{gone:?}"
    );
}

/// Issue 26 (6): `sessionConfigCompletions` lists the values of one of the agent's settings that match what the
/// user typed (from the schema the agent reported); `moveChat` is refused with why (chats here are not
/// movable) and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_config_values_complete_and_chats_do_not_move() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let (session, chat) = scripted_session(&a, "assist").await;
    let complete = |property: &'static str, query: &'static str| {
        let a = &a;
        async move {
            a.request::<_, ahp_types::commands::SessionConfigCompletionsResult>(
                "sessionConfigCompletions",
                serde_json::json!({"channel": "ahp-root://", "provider": "scripted", "property": property, "query": query}),
            )
            .await
        }
    };
    let values = |result: ahp_types::commands::SessionConfigCompletionsResult| {
        result
            .items
            .into_iter()
            .map(|item| item.value)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        values(complete("effort", "").await.expect("all")),
        ["low", "high"]
    );
    assert_eq!(
        values(complete("effort", "HI").await.expect("filtered")),
        ["high"]
    );
    assert_eq!(values(complete("mode", "co").await.expect("modes")), ["code"]);
    assert!(matches!(complete("nope", "").await, Err(ahp::ClientError::Rpc(e)) if e.code == -32602));

    let before = session_of(
        &a.subscribe(session.clone())
            .await
            .expect("session")
            .0
            .snapshot
            .expect("snapshot"),
    );
    let refused: Result<Value, _> = a
        .request(
            "moveChat",
            serde_json::json!({"channel": chat, "destination": {"kind": "session", "session": session}}),
        )
        .await;
    assert!(
        matches!(&refused, Err(ahp::ClientError::Rpc(e)) if e.code == -32602 && e.message.contains("not movable")),
        "{refused:?}"
    );
    let fresh = setup.relay.client("device-b").await.0;
    let after = session_of(
        &fresh
            .subscribe(session.clone())
            .await
            .expect("session")
            .0
            .snapshot
            .expect("snapshot"),
    );
    assert_eq!(json(&before.chats), json(&after.chats));
}

/// A ready session of the scripted agent in `directory`, with `config`: its chat, or why it failed.
async fn session_in(
    client: &ahp::Client,
    name: &str,
    directory: &Path,
    config: Value,
) -> Result<String, ahp_types::state::ErrorInfo> {
    let more = serde_json::json!({"config": config,
        "workingDirectories": [format!("file://{}", directory.display())]});
    ready_session(client, "scripted", name, more)
        .await
        .map(|_| format!("ahp-chat:/{name}"))
}

/// Issue 26 (6): where the working directory is a git repository, its branch is a dynamic session setting:
/// `resolveSessionConfig` offers it (the current branch the default), `sessionConfigCompletions` lists the
/// repository's branches matching the query, and `createSession` starts the session's agent on the chosen one
/// (a branch that does not exist fails the session's creation, saying so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repositorys_branch_is_a_session_setting_that_completes_and_applies() {
    let setup = relay_with_agent().await;
    let (a, _) = setup.relay.client("device-a").await;
    let dir = setup.workspace.path().join("dev/repo");
    let _: Value = a
        .request(
            "resourceMkdir",
            serde_json::json!({"channel": "ahp-root://", "uri": format!("file://{}", dir.display())}),
        )
        .await
        .expect("mkdir");
    // The repository is made by an agent, as the tenant's user in its sandbox.
    let maker = session_in(&a, "maker", &dir, serde_json::json!({}))
        .await
        .expect("maker");
    prompt(
        &a,
        &maker,
        "t1",
        "sh: git init -q -b main && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m init && git branch feature && git branch fix-login",
    )
    .await;
    let uri = format!("file://{}", dir.display());
    let resolved: ahp_types::commands::ResolveSessionConfigResult = a
        .request(
            "resolveSessionConfig",
            serde_json::json!({"channel": "ahp-root://", "provider": "scripted", "workingDirectory": uri}),
        )
        .await
        .expect("resolve");
    let branch = resolved
        .schema
        .properties
        .get("branch")
        .expect("a branch property");
    assert_eq!(branch.enum_dynamic, Some(true));
    assert_eq!(branch.default, Some(Value::String("main".into())));
    assert_eq!(resolved.values.get("branch"), Some(&Value::String("main".into())));
    let complete = |query: &'static str| {
        let (a, uri) = (&a, uri.clone());
        async move {
            let result: ahp_types::commands::SessionConfigCompletionsResult = a
                .request(
                    "sessionConfigCompletions",
                    serde_json::json!({"channel": "ahp-root://", "provider": "scripted", "property": "branch",
                        "workingDirectory": uri, "query": query}),
                )
                .await
                .expect("completions");
            result
                .items
                .into_iter()
                .map(|item| item.value)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(complete("").await, ["feature", "fix-login", "main"]);
    assert_eq!(complete("FEA").await, ["feature"]);
    // Elsewhere (not a repository) there is no branch property.
    let plain: ahp_types::commands::ResolveSessionConfigResult = a
        .request(
            "resolveSessionConfig",
            serde_json::json!({"channel": "ahp-root://", "provider": "scripted"}),
        )
        .await
        .expect("resolve");
    assert!(!plain.schema.properties.contains_key("branch"));

    // A session created on `feature` starts there.
    let chat = session_in(&a, "on-feature", &dir, serde_json::json!({"branch": "feature"}))
        .await
        .expect("on feature");
    let state = prompt(&a, &chat, "t1", "sh: git branch --show-current").await;
    let (reply, _) = turn_text(&state, "t1");
    assert!(reply.contains("feature"), "{reply}");
    let failed = session_in(
        &a,
        "nowhere",
        &dir,
        serde_json::json!({"branch": "no-such-branch"}),
    )
    .await
    .expect_err("no such branch");
    assert_eq!(failed.error_type, "branchUnavailable");
    assert!(failed.message.contains("no-such-branch"), "{}", failed.message);
    // Issue 33 (13): a switch over 24,000 modified files, which git lists (more than 1 MiB) as it carries them
    // over, starts the session on that branch instead of leaving it `creating` for ever on a full pipe.
    let prepared = prompt(
        &a,
        &maker,
        "t2",
        "sh: mkdir many && for i in $(seq 24000); do echo a > many/a-file-with-a-long-name-to-fill-the-pipe-$i.txt; done \
         && git add many && git -c user.name=t -c user.email=t@t commit -q -m many && git branch big \
         && for f in many/*; do echo dirty > $f; done && echo prepared",
    )
    .await;
    let (said, _) = turn_text(&prepared, "t2");
    assert!(said.contains("prepared"), "{said}");
    let chat = session_in(&a, "onto-big", &dir, serde_json::json!({"branch": "big"}))
        .await
        .expect("on big, its local changes carried over");
    let state = prompt(&a, &chat, "t1", "sh: git branch --show-current").await;
    let (reply, _) = turn_text(&state, "t1");
    assert!(reply.contains("big"), "{reply}");
}

/// Issue 33 (16): an agent that cannot start fails its session in its own words: what it wrote to stderr and
/// how it exited; and when what it runs is outside its sandbox's view (a shim that runs an interpreter under a
/// directory the sandbox does not show, as pyenv's), the message names the path and how to make it visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_start_says_why_in_its_own_words() {
    let shims = tempfile::tempdir().expect("shims");
    let shim = shims.path().join("python3");
    std::fs::write(
        &shim,
        format!("#!/bin/sh\nexec {}\n", env!("CARGO_BIN_EXE_ahp-relay-test-agent")),
    )
    .expect("shim");
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let shim_path = shim.display().to_string();
    let setup = relay_with_agents(&[
        (
            "talker",
            "sh",
            &["-c", "echo 'missing API key: set TALKER_KEY' >&2; exit 3"],
        ),
        ("shimmed", &shim_path, &[]),
    ])
    .await;
    let (a, _) = setup.relay.client("device-a").await;
    let failed = ready_session(&a, "talker", "talks", serde_json::json!({}))
        .await
        .expect_err("the agent exits at once");
    assert!(
        failed.message.contains("missing API key: set TALKER_KEY") && failed.message.contains('3'),
        "{}",
        failed.message
    );
    // The shim's directory is shown (an agent's command's is), the interpreter it runs is not.
    let failed = ready_session(&a, "shimmed", "shimmed", serde_json::json!({}))
        .await
        .expect_err("what the shim runs is not in the sandbox");
    let target = env!("CARGO_BIN_EXE_ahp-relay-test-agent");
    assert!(
        failed
            .message
            .contains(&format!("{target} is not visible in the agent's sandbox"))
            && failed.message.contains("read_only_paths"),
        "{}",
        failed.message
    );
}
