//! Issue 26 (3): devices' terminals over AHP, with the official client over real WebSockets against `serve`
//! with an agents file (the relay holds a workspace): two devices share a shell on a pseudoterminal in the
//! session's sandbox (the claim's holder types and resizes, both see; Ctrl-C interrupts), shell integration marks each
//! command, a chat's `!command` runs in a terminal and shows in the chat, dispose kills the processes, viewers
//! watch only, and an output flood leaves the relay's memory bounded and other sessions answering.

mod support;

use std::time::{Duration, Instant};

use ahp::ClientError;
use ahp_types::actions::{StateAction, TerminalInputAction, TerminalResizedAction};
use ahp_types::state::{Snapshot, SnapshotState, TerminalContentPart, TerminalLifecycleState, TerminalState};
use relay_core::Role;
use serde_json::{json, Value};
use support::*;

struct TerminalRelay {
    relay: Relay,
    workspace: tempfile::TempDir,
    _config: tempfile::TempDir,
}

/// `serve` with the scripted agent's agents file, `quotas` appended to it (TOML), and `extra` flags.
async fn relay_with_workspace(quotas: &str, extra: &[&str]) -> TerminalRelay {
    let agents = scripted_agents_file();
    if !quotas.is_empty() {
        let mut text = std::fs::read_to_string(&agents.file).expect("agents file");
        text = format!("{text}\n{quotas}\n");
        std::fs::write(&agents.file, text).expect("agents file");
    }
    let mut args = vec!["--agents", agents.file.to_str().expect("path")];
    args.extend_from_slice(extra);
    let relay = Relay::start_with(&args).await;
    TerminalRelay {
        relay,
        workspace: agents.workspace,
        _config: agents.config,
    }
}

/// A session of the scripted agent, ready.
async fn session(client: &ahp::Client, name: &str) -> (String, String) {
    let (session, _) = ready_session(client, "scripted", name, json!({}))
        .await
        .expect("ready");
    (session, format!("ahp-chat:/{name}"))
}

async fn create_terminal(
    client: &ahp::Client,
    client_id: &str,
    session: &str,
    uri: &str,
) -> Result<Value, ClientError> {
    client
        .request(
            "createTerminal",
            json!({
                "channel": uri,
                "claim": {"kind": "client", "clientId": client_id},
                "name": "Shell",
                "cols": 80,
                "rows": 24,
                "_meta": {"ahpRelay/session": session},
            }),
        )
        .await
}

fn terminal_state(snapshot: &Snapshot) -> TerminalState {
    match &snapshot.state {
        SnapshotState::Terminal(state) => (**state).clone(),
        other => panic!("not a terminal: {other:?}"),
    }
}

/// A terminal's whole output.
fn text(state: &TerminalState) -> String {
    state
        .content
        .iter()
        .map(|part| match part {
            TerminalContentPart::Command(command) => command.output.clone(),
            TerminalContentPart::Unclassified(part) => part.value.clone(),
            _ => String::new(),
        })
        .collect()
}

/// A terminal a client watches: its state, kept up to date from its subscription.
struct Watched {
    state: TerminalState,
    sub: ahp::SessionSubscription,
    /// Whether a `terminal/input` envelope reached this device.
    saw_input: bool,
}

impl Watched {
    async fn open(client: &ahp::Client, uri: &str) -> Watched {
        let (result, sub) = client
            .subscribe(uri.to_string())
            .await
            .expect("subscribe terminal");
        Watched {
            state: terminal_state(&result.snapshot.expect("snapshot")),
            sub,
            saw_input: false,
        }
    }

    /// Apply envelopes until `done` holds for the state.
    async fn until(&mut self, what: &str, done: impl Fn(&TerminalState) -> bool) {
        let waited = tokio::time::timeout(PATIENCE, async {
            while !done(&self.state) {
                let envelope = next_envelope(&mut self.sub).await;
                self.saw_input |= matches!(envelope.action, StateAction::TerminalInput(_));
                if envelope.rejection_reason.is_none() {
                    ahp::reducers::apply_action_to_terminal(&mut self.state, &envelope.action);
                }
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "never saw {what}; the terminal shows:\n{}",
            text(&self.state)
        );
    }
}

fn input(data: &str) -> StateAction {
    StateAction::TerminalInput(TerminalInputAction { data: data.into() })
}

/// Host processes whose command line is exactly `args` (found in /proc).
fn processes(args: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = args.iter().flat_map(|arg| arg.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .expect("proc")
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| cmdline == wanted))
        .collect()
}

/// Wait (bounded) until `check` holds, polling the machine's state.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(Instant::now() < deadline, "{what} never happened");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Start `command` (a `sleep <marker>` among it) in the watched terminal and wait until it runs: its host PIDs.
async fn start_job(
    client: &ahp::Client,
    watched: &mut Watched,
    uri: &str,
    command: &str,
    marker: &str,
) -> Vec<u32> {
    client
        .dispatch(uri.to_string(), input(command))
        .await
        .expect("type");
    watched
        .until("the job", |state| text(state).contains("started"))
        .await;
    eventually("the job running", || !processes(&["sleep", marker]).is_empty()).await;
    processes(&["sleep", marker])
}

/// Wait until every process of `pids` is gone.
async fn all_gone(what: &str, pids: &[u32]) {
    eventually(what, || {
        pids.iter()
            .all(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
    })
    .await;
}

fn is_exited(state: &TerminalState) -> bool {
    matches!(state.lifecycle, TerminalLifecycleState::Exited(_))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_devices_share_a_shell_one_types_both_see_the_other_resizes() {
    let setup = relay_with_workspace("", &[]).await;
    let (a, init) = setup.relay.client("device-a").await;
    assert_eq!(init.terminal_command_prefix.as_deref(), Some("!"));
    let (b, _) = setup.relay.client("device-b").await;
    let (session, _) = session(&a, "shell").await;
    let uri = "ahp-terminal:/shared-shell";
    create_terminal(&a, "device-a", &session, uri)
        .await
        .expect("createTerminal");
    let (root, _) = b.subscribe("ahp-root://".into()).await.expect("root");
    let SnapshotState::Root(root) = root.snapshot.expect("root snapshot").state else {
        panic!("root");
    };
    assert!(
        root.terminals
            .unwrap_or_default()
            .iter()
            .any(|t| t.resource == uri),
        "root state lists the terminal"
    );
    let mut on_a = Watched::open(&a, uri).await;
    let mut on_b = Watched::open(&b, uri).await;
    assert_eq!(on_b.state.is_pty, Some(true));

    // A types; both see the shell's answer, marked as a command with its exit status.
    a.dispatch(uri.to_string(), input("echo hello-$((6*7))\n"))
        .await
        .expect("type");
    for watched in [&mut on_a, &mut on_b] {
        watched
            .until("the echo", |state| text(state).contains("hello-42"))
            .await;
        watched
            .until("the command finished", |state| {
                state.content.iter().any(|part| {
                    matches!(part, TerminalContentPart::Command(c)
                        if c.command_line == "echo hello-$((6*7))" && c.is_complete && c.exit_code == Some(0)
                            && c.output.contains("hello-42"))
                })
            })
            .await;
        assert_eq!(watched.state.supports_command_detection, Some(true));
    }
    a.dispatch(uri.to_string(), input("false\n")).await.expect("type");
    on_b.until("a failing command's status", |state| {
        state.content.iter().any(|part| {
            matches!(part, TerminalContentPart::Command(c) if c.command_line == "false" && c.exit_code == Some(1))
        })
    })
    .await;

    // A (the claim's holder) resizes; the shell sees the new size.
    a.dispatch(
        uri.to_string(),
        StateAction::TerminalResized(TerminalResizedAction { cols: 100, rows: 30 }),
    )
    .await
    .expect("resize");
    on_a.until("the resize", |state| state.cols == Some(100)).await;
    a.dispatch(uri.to_string(), input("stty size\n"))
        .await
        .expect("type");
    on_a.until("the new size", |state| text(state).contains("30 100"))
        .await;

    // The terminal is the shell's controlling terminal: Ctrl-C interrupts the foreground command.
    // (Ctrl-C once the command runs: pressed between the shell's mark and the command's start, it would reach
    // only the shell.)
    a.dispatch(uri.to_string(), input("sleep 31340\n"))
        .await
        .expect("type");
    eventually("sleep running", || !processes(&["sleep", "31340"]).is_empty()).await;
    a.dispatch(uri.to_string(), input("\u{3}")).await.expect("ctrl-c");
    a.dispatch(uri.to_string(), input("echo after-$((1+1))\n"))
        .await
        .expect("type");
    on_b.until("the shell back after Ctrl-C", |state| {
        text(state).contains("after-2")
    })
    .await;

    // The shell runs as the tenant's sandbox user in the session's directory, not as the relay.
    a.dispatch(uri.to_string(), input("echo uid=$(id -u) cwd=$PWD\n"))
        .await
        .expect("type");
    on_a.until("id", |state| text(state).contains("cwd=/")).await;
    let shown = text(&on_a.state);
    let answer = &shown[shown.rfind("uid=").expect("uid")..];
    let uid = answer.split_whitespace().next().expect("uid");
    assert_ne!(uid, "uid=0", "the shell runs as root: {answer}");
    assert!(
        setup.workspace.path().join("dev").exists(),
        "the session's directory is in the tenant's part of the workspace"
    );

    // `exit` ends it: exited with the shell's status, for every device.
    a.dispatch(uri.to_string(), input("exit 7\n"))
        .await
        .expect("exit");
    for watched in [&mut on_a, &mut on_b] {
        watched.until("the exit", is_exited).await;
        assert!(
            matches!(&watched.state.lifecycle, TerminalLifecycleState::Exited(e) if e.exit_code == Some(7))
        );
    }
    // What A typed reached A alone (its echo), never B: keystrokes (passwords too) are nobody else's.
    assert!(on_a.saw_input, "the typist gets its echo");
    assert!(!on_b.saw_input, "another device never sees what was typed");
    // Every device reduced the same state as the host's: a device that just connected sees it.
    let (c, _) = setup.relay.client("device-c").await;
    let fresh = Watched::open(&c, uri).await;
    assert_eq!(json(&fresh.state), json(&on_b.state));
    assert_eq!(json(&fresh.state), json(&on_a.state));
    // An exited terminal takes no input.
    a.dispatch(uri.to_string(), input("ls\n"))
        .await
        .expect("dispatch");
    let echo = echo_of(&mut on_a.sub, "device-a").await;
    assert!(echo.rejection_reason.is_some(), "{echo:?}");
}

/// The echo of the next action `client` dispatched on this subscription's channel.
async fn echo_of(sub: &mut ahp::SessionSubscription, client: &str) -> ahp_types::actions::ActionEnvelope {
    loop {
        let envelope = next_envelope(sub).await;
        if envelope
            .origin
            .as_ref()
            .is_some_and(|origin| origin.client_id == client)
        {
            return envelope;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_watch_terminals_and_cannot_open_type_or_dispose() {
    let setup = relay_with_workspace("", &[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let (viewer, _) = setup
        .relay
        .client_as("dev", "someone", Role::Viewer, "viewer")
        .await;
    let (session, _) = session(&a, "watched").await;
    let refused = create_terminal(&viewer, "viewer", &session, "ahp-terminal:/viewer-own").await;
    assert!(
        matches!(&refused, Err(ClientError::Rpc(e)) if e.code == -32009),
        "{refused:?}"
    );
    let uri = "ahp-terminal:/watched";
    create_terminal(&a, "device-a", &session, uri)
        .await
        .expect("createTerminal");
    let mut watched = Watched::open(&viewer, uri).await;
    a.dispatch(uri.to_string(), input("echo from-a\n"))
        .await
        .expect("type");
    watched
        .until("a's output", |state| text(state).contains("from-a"))
        .await;
    viewer
        .dispatch(uri.to_string(), input("echo from-viewer\n"))
        .await
        .expect("dispatch");
    let echo = echo_of(&mut watched.sub, "viewer").await;
    assert!(
        echo.rejection_reason.is_some(),
        "a viewer's input is refused: {echo:?}"
    );
    let refused: Result<Value, _> = viewer.request("disposeTerminal", json!({"channel": uri})).await;
    assert!(
        matches!(&refused, Err(ClientError::Rpc(e)) if e.code == -32009),
        "{refused:?}"
    );

    // Malformed requests change nothing.
    for bad in [
        json!({"channel": "ahp-chat:/not-a-terminal", "claim": {"kind": "client", "clientId": "device-a"}, "_meta": {"ahpRelay/session": session}}),
        json!({"channel": "ahp-terminal:/no-session", "claim": {"kind": "client", "clientId": "device-a"}}),
        json!({"channel": "ahp-terminal:/other-client", "claim": {"kind": "client", "clientId": "device-b"}, "_meta": {"ahpRelay/session": session}}),
        json!({"channel": uri, "claim": {"kind": "client", "clientId": "device-a"}, "_meta": {"ahpRelay/session": session}}),
        json!({"channel": "ahp-terminal:/unknown-session", "claim": {"kind": "client", "clientId": "device-a"}, "_meta": {"ahpRelay/session": "ahp-session:/nope"}}),
        json!({"channel": "ahp-terminal:/huge", "claim": {"kind": "client", "clientId": "device-a"}, "_meta": {"ahpRelay/session": session}, "cols": 100000, "rows": 5}),
    ] {
        let refused: Result<Value, _> = a.request("createTerminal", bad.clone()).await;
        assert!(matches!(refused, Err(ClientError::Rpc(_))), "{bad} was accepted");
    }
    let (root, _) = a.subscribe("ahp-root://".into()).await.expect("root");
    let SnapshotState::Root(root) = root.snapshot.expect("root snapshot").state else {
        panic!("root");
    };
    let listed: Vec<String> = root
        .terminals
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.resource)
        .collect();
    assert_eq!(listed, vec![uri.to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bang_command_runs_in_a_terminal_and_shows_in_the_chat() {
    let setup = relay_with_workspace("", &[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let (b, _) = setup.relay.client("device-b").await;
    let (_, chat) = session(&a, "bang").await;
    let (_, _, mut on_b) = subscribe_chat(&b, &chat).await;
    a.dispatch(
        chat.clone(),
        turn_started("t1", "!echo hi-from-$((40+2)); exit 3"),
    )
    .await
    .expect("dispatch");
    collect_until(&mut on_b, is_turn_complete).await;
    let state = fresh_chat_snapshot(&setup.relay, &chat).await;
    let turn = state.turns.last().expect("the turn");
    let tool_call = serde_json::to_value(&turn.response_parts).expect("json");
    let text_of = tool_call.to_string();
    assert!(
        text_of.contains("hi-from-42"),
        "the chat shows the output: {text_of}"
    );
    assert!(text_of.contains("exit 3"), "and the status: {text_of}");
    let terminal = tool_call
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|part| {
            part.pointer("/toolCall/content")?
                .as_array()?
                .iter()
                .find_map(|content| {
                    (content["type"] == "terminal").then(|| content["resource"].as_str().map(str::to_string))
                })
                .flatten()
        })
        .expect("the tool call names its terminal");
    // The same output in the terminal, which any device can open: the command, its status, exited.
    let watched = Watched::open(&b, &terminal).await;
    assert!(text(&watched.state).contains("hi-from-42"));
    assert!(matches!(&watched.state.lifecycle, TerminalLifecycleState::Exited(e) if e.exit_code == Some(3)));
    assert!(watched.state.content.iter().any(|part| matches!(part,
        TerminalContentPart::Command(c) if c.command_line == "echo hi-from-$((40+2)); exit 3" && c.exit_code == Some(3))));
    // A message that is not a command goes to the agent as before.
    a.dispatch(chat.clone(), turn_started("t2", "hello"))
        .await
        .expect("dispatch");
    collect_until(&mut on_b, is_turn_complete).await;
}

/// The terminals devices opened in `session`, as it names them (`_meta["ahpRelay/terminals"]`), read fresh.
async fn terminals_named_by(client: &ahp::Client, session: &str) -> Option<Vec<String>> {
    let (result, _) = client.subscribe(session.to_string()).await.expect("subscribe");
    let state = session_of(&result.snapshot.expect("snapshot"));
    client
        .unsubscribe(session.to_string())
        .await
        .expect("unsubscribe");
    state
        .meta
        .and_then(|meta| meta.get("ahpRelay/terminals").cloned())
        .map(|listed| serde_json::from_value(listed).expect("a list of URIs"))
}

/// Issue 36 (5): a session names the terminals devices opened in it, so a client lists a session's own
/// terminals — not those of another session working in the same folder — and the name goes with the terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_names_the_terminals_opened_in_it_and_not_another_sessions_in_its_folder() {
    let setup = relay_with_workspace("", &[]).await;
    let (a, initialized) = setup.relay.client("device-a").await;
    // The relay says that its sessions name their terminals (none named: none opened).
    assert_eq!(
        initialized
            .meta
            .as_ref()
            .and_then(|meta| meta.get("ahpRelay/sessionsNameTerminals")),
        Some(&json!(true))
    );
    let folder = setup.workspace.path().join("dev/default/shared");
    std::fs::create_dir_all(&folder).expect("folder");
    let in_folder = json!({"workingDirectories": [format!("file://{}", folder.display())]});
    let (first, _) = ready_session(&a, "scripted", "first", in_folder.clone())
        .await
        .expect("ready");
    let (second, _) = ready_session(&a, "scripted", "second", in_folder)
        .await
        .expect("ready");
    let uri = "ahp-terminal:/firsts";
    create_terminal(&a, "device-a", &first, uri)
        .await
        .expect("createTerminal");
    assert_eq!(terminals_named_by(&a, &first).await, Some(vec![uri.to_string()]));
    assert_eq!(terminals_named_by(&a, &second).await, None);
    // Both run in the same folder: the folder alone cannot tell them apart.
    let mut watched = Watched::open(&a, uri).await;
    assert!(
        watched
            .state
            .cwd
            .as_deref()
            .is_some_and(|cwd| cwd.ends_with("dev/default/shared")),
        "{:?}",
        watched.state.cwd
    );
    // Its holder may not pass it to another session (it runs in the first one's sandbox).
    a.dispatch(
        uri.to_string(),
        StateAction::TerminalClaimed(ahp_types::actions::TerminalClaimedAction {
            claim: ahp_types::state::TerminalClaim::Session(ahp_types::state::TerminalSessionClaim {
                session: second.clone(),
                chat: "ahp-chat:/second".into(),
                turn_id: None,
                tool_call_id: None,
            }),
        }),
    )
    .await
    .expect("dispatch");
    let refused = echo_of(&mut watched.sub, "device-a").await;
    assert!(
        refused
            .rejection_reason
            .as_deref()
            .is_some_and(|why| why.contains("own session")),
        "{refused:?}"
    );
    assert_eq!(terminals_named_by(&a, &second).await, None);
    let _: Value = a
        .request("disposeTerminal", json!({"channel": uri}))
        .await
        .expect("dispose");
    assert_eq!(terminals_named_by(&a, &first).await, Some(vec![]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disposing_a_terminal_or_its_session_kills_its_processes() {
    let setup = relay_with_workspace("", &[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let (session, _) = session(&a, "killed").await;
    let uri = "ahp-terminal:/doomed";
    create_terminal(&a, "device-a", &session, uri)
        .await
        .expect("createTerminal");
    let mut watched = Watched::open(&a, uri).await;
    // A background job, in its own process group, survives its shell's hang-up but not the sandbox's end.
    let pids = start_job(
        &a,
        &mut watched,
        uri,
        "setsid sleep 31337 & echo started\n",
        "31337",
    )
    .await;
    let _: Value = a
        .request("disposeTerminal", json!({"channel": uri}))
        .await
        .expect("dispose");
    all_gone("the job killed", &pids).await;
    let refused: Result<Value, _> = a.subscribe(uri.to_string()).await.map(|_| Value::Null);
    assert!(refused.is_err(), "the terminal is gone");

    let uri = "ahp-terminal:/with-its-session";
    create_terminal(&a, "device-a", &session, uri)
        .await
        .expect("createTerminal");
    let mut watched = Watched::open(&a, uri).await;
    let pids = start_job(&a, &mut watched, uri, "sleep 31338 & echo started\n", "31338").await;
    let _: Value = a
        .request("disposeSession", json!({"channel": session}))
        .await
        .expect("dispose session");
    all_gone("the session's job killed", &pids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_flood_keeps_memory_bounded_and_other_sessions_answering() {
    // Fast enough to flood, slow enough that the flood lasts a few seconds (the tenant's output rate).
    let setup = relay_with_workspace(
        "[quotas]\noutput_bytes_per_second = 16777216\n",
        &["--replay-buffer-bytes", "8388608"],
    )
    .await;
    let (a, _) = setup.relay.client("device-a").await;
    let (session, _) = session(&a, "flood").await;
    let uri = "ahp-terminal:/flood";
    create_terminal(&a, "device-a", &session, uri)
        .await
        .expect("createTerminal");
    let mut watched = Watched::open(&a, uri).await;
    let (rss_before, _) = setup.relay.memory();
    a.dispatch(
        uri.to_string(),
        input("yes 0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz | head -c 52428800; exit\n"),
    )
    .await
    .expect("type");
    // Another device works in another session meanwhile: a demo turn answers while the flood runs.
    let (b, _) = setup.relay.client("device-b").await;
    let (_, other_chat) = create_session_and_chat(&b, "elsewhere").await;
    let (_, _, mut other) = subscribe_chat(&b, &other_chat).await;
    b.dispatch(other_chat.clone(), turn_started("t1", "still there?"))
        .await
        .expect("prompt");
    collect_until(&mut other, is_turn_complete).await;
    let (_, peak_mid_flood) = setup.relay.memory();
    let terminal_now = fresh_terminal(&setup.relay, uri).await;
    assert!(
        !is_exited(&terminal_now),
        "the other session answered while the flood ran"
    );

    // The flood goes through: it exits, every byte counted once the state clears past its scrollback.
    let mut published = 0_usize;
    let mut envelopes = 0_usize;
    let counted = tokio::time::timeout(Duration::from_secs(120), async {
        while !is_exited(&watched.state) {
            let envelope = next_envelope(&mut watched.sub).await;
            if let StateAction::TerminalData(data) = &envelope.action {
                published += data.data.len();
                envelopes += 1;
            }
            ahp::reducers::apply_action_to_terminal(&mut watched.state, &envelope.action);
        }
    })
    .await;
    assert!(counted.is_ok(), "the flood never ended ({published} bytes seen)");
    assert!(published >= 50 * 1024 * 1024, "only {published} bytes arrived");
    eprintln!("flood: {published} bytes in {envelopes} terminal/data envelopes");
    assert!(
        envelopes < published / (16 * 1024),
        "output is coalesced: {envelopes} envelopes for {published} bytes"
    );
    let (_, peak) = setup.relay.memory();
    let grown = peak.saturating_sub(rss_before);
    assert!(
        grown < 64 * 1024 * 1024,
        "the relay's memory grew by {} MiB for a 50 MiB flood (peak {} MiB mid-flood)",
        grown / (1024 * 1024),
        peak_mid_flood / (1024 * 1024)
    );
    // The terminal's state keeps a bounded scrollback.
    let kept = text(&fresh_terminal(&setup.relay, uri).await).len();
    assert!(
        kept <= 1024 * 1024 + 64 * 1024,
        "the terminal's state holds {kept} bytes"
    );
}

/// A terminal's state as a device that just connected sees it.
async fn fresh_terminal(relay: &Relay, uri: &str) -> TerminalState {
    let (observer, _) = relay.client_as("dev", "observer", Role::Viewer, "observer").await;
    let (result, _) = observer.subscribe(uri.to_string()).await.expect("subscribe");
    let state = terminal_state(&result.snapshot.expect("snapshot"));
    observer.shutdown().await;
    state
}

/// Issue 26 (5, terminals): through a gateway to a shard, a device's terminal runs on the separate runner
/// process holding the session (two devices type and watch, a `!command` runs there too); SIGKILL of the runner
/// ends its terminals as `exited` for every device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_gateway_terminals_run_on_the_runner_and_end_with_it() {
    let agents = scripted_agents_file();
    let shard = Shard::start(&["--agents", &agents.file.display().to_string()]).await;
    let gateway = Relay::gateway(&shard.url).await;
    let mut runner = start_runner(&shard, &agents.file, 1.0).await;
    let (a, init) = gateway.client("device-a").await;
    assert_eq!(init.terminal_command_prefix.as_deref(), Some("!"));
    let (b, _) = gateway.client("device-b").await;
    let (session, chat) = session(&a, "remote-shell").await;
    let uri = "ahp-terminal:/remote";
    create_terminal(&a, "device-a", &session, uri)
        .await
        .expect("createTerminal");
    let mut on_a = Watched::open(&a, uri).await;
    let mut on_b = Watched::open(&b, uri).await;
    a.dispatch(uri.to_string(), input("echo remote-$((2*21))\n"))
        .await
        .expect("type");
    for watched in [&mut on_a, &mut on_b] {
        watched
            .until("the echo", |state| text(state).contains("remote-42"))
            .await;
    }
    a.dispatch(
        uri.to_string(),
        StateAction::TerminalResized(TerminalResizedAction { cols: 120, rows: 40 }),
    )
    .await
    .expect("resize");
    a.dispatch(uri.to_string(), input("stty size\n"))
        .await
        .expect("type");
    on_a.until("the new size", |state| text(state).contains("40 120"))
        .await;

    let (_, _, mut chat_on_b) = subscribe_chat(&b, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "!echo bang-$((1+2))"))
        .await
        .expect("dispatch");
    collect_until(&mut chat_on_b, is_turn_complete).await;
    let shown = serde_json::to_string(&fresh_chat_snapshot(&gateway, &chat).await.turns).expect("json");
    assert!(shown.contains("bang-3"), "{shown}");

    // SIGKILL the runner: the running shell ends as exited (no code) for every device.
    a.dispatch(uri.to_string(), input("sleep 31341\n"))
        .await
        .expect("type");
    eventually("sleep running", || !processes(&["sleep", "31341"]).is_empty()).await;
    let pids = processes(&["sleep", "31341"]);
    runner.start_kill().expect("kill the runner");
    runner.wait().await.expect("reaped");
    all_gone("the runner's shell killed with it", &pids).await;
    for watched in [&mut on_a, &mut on_b] {
        watched.until("the exit", is_exited).await;
        assert!(
            matches!(&watched.state.lifecycle, TerminalLifecycleState::Exited(e) if e.exit_code.is_none())
        );
    }
    // A new terminal while no runner holds the session: a clear error, and no channel left behind.
    wait_for_runners(&shard, 0.0).await;
    let refused = create_terminal(&a, "device-a", &session, "ahp-terminal:/no-runner").await;
    assert!(
        matches!(&refused, Err(ClientError::Rpc(e)) if e.code == -32603 && e.message.contains("runner")),
        "{refused:?}"
    );
    let gone: Result<Value, _> = a
        .subscribe("ahp-terminal:/no-runner".into())
        .await
        .map(|_| Value::Null);
    assert!(gone.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_terminal_is_stopped_and_a_deployment_may_switch_terminals_off() {
    // Idle: nothing typed or printed for the quotas' terminal_idle_seconds ends the shell.
    let setup = relay_with_workspace("[quotas]\nterminal_idle_seconds = 1\n", &[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let (idle_session, _) = session(&a, "idle").await;
    let uri = "ahp-terminal:/idle";
    create_terminal(&a, "device-a", &idle_session, uri)
        .await
        .expect("createTerminal");
    let mut watched = Watched::open(&a, uri).await;
    watched.until("the idle stop", is_exited).await;
    assert!(text(&watched.state).contains("idle"), "{}", text(&watched.state));

    // Switched off: no prefix advertised, createTerminal refused, a `!` message goes to the agent as it is.
    let off = relay_with_workspace("", &["--device-terminals", "false"]).await;
    let (b, init) = off.relay.client("device-b").await;
    assert_eq!(init.terminal_command_prefix, None);
    let (off_session, chat) = session(&b, "off").await;
    let refused = create_terminal(&b, "device-b", &off_session, "ahp-terminal:/off").await;
    assert!(
        matches!(&refused, Err(ClientError::Rpc(e)) if e.code == -32009),
        "{refused:?}"
    );
    let (_, _, mut sub) = subscribe_chat(&b, &chat).await;
    b.dispatch(chat.clone(), turn_started("t1", "!echo never-run"))
        .await
        .expect("prompt");
    collect_until(&mut sub, is_turn_complete).await;
    let shown = serde_json::to_string(&fresh_chat_snapshot(&off.relay, &chat).await.turns).expect("json");
    assert!(!shown.contains("\"terminal\""), "no terminal tool call: {shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_holder_passes_a_terminals_claim_and_members_rename_and_clear_it() {
    let setup = relay_with_workspace("", &[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let (b, _) = setup.relay.client("device-b").await;
    let (claims_session, _) = session(&a, "claims").await;
    let uri = "ahp-terminal:/claimed";
    create_terminal(&a, "device-a", &claims_session, uri)
        .await
        .expect("createTerminal");
    let mut on_b = Watched::open(&b, uri).await;
    let claim_for = |client: &str| {
        StateAction::TerminalClaimed(ahp_types::actions::TerminalClaimedAction {
            claim: ahp_types::state::TerminalClaim::Client(ahp_types::state::TerminalClientClaim {
                client_id: client.into(),
            }),
        })
    };
    // B does not hold it: refused.
    b.dispatch(uri.to_string(), claim_for("device-b"))
        .await
        .expect("dispatch");
    assert!(echo_of(&mut on_b.sub, "device-b")
        .await
        .rejection_reason
        .is_some());
    // A passes it to B; B renames and clears it.
    a.dispatch(uri.to_string(), claim_for("device-b"))
        .await
        .expect("dispatch");
    on_b.until("B holds it", |state| {
        matches!(&state.claim, ahp_types::state::TerminalClaim::Client(c) if c.client_id == "device-b")
    })
    .await;
    b.dispatch(
        uri.to_string(),
        StateAction::TerminalTitleChanged(ahp_types::actions::TerminalTitleChangedAction {
            title: "Build".into(),
        }),
    )
    .await
    .expect("rename");
    on_b.until("the new title", |state| state.title == "Build").await;
    // B holds it now: B types.
    b.dispatch(uri.to_string(), input("echo before-clear\n"))
        .await
        .expect("type");
    on_b.until("the output", |state| text(state).contains("before-clear\r\n"))
        .await;
    b.dispatch(
        uri.to_string(),
        StateAction::TerminalCleared(ahp_types::actions::TerminalClearedAction {}),
    )
    .await
    .expect("clear");
    on_b.until("cleared", |state| !text(state).contains("before-clear"))
        .await;
    // A server's action from a client is refused.
    b.dispatch(
        uri.to_string(),
        StateAction::TerminalData(ahp_types::actions::TerminalDataAction {
            data: "forged".into(),
        }),
    )
    .await
    .expect("dispatch");
    assert!(echo_of(&mut on_b.sub, "device-b")
        .await
        .rejection_reason
        .is_some());
}

/// Issue 32 (acceptance 3): a client-claimed terminal takes input and sizes from its holder alone (another
/// member's, sent as a request, is refused with -32009 and changes nothing); what a program prints cannot reach a
/// device's clipboard (OSC 52), nor end a command or move the terminal's directory with forged shell marks (no
/// nonce); and `TIOCSTI` (typing into the terminal from inside it) is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_holder_types_and_a_programs_output_forges_nothing() {
    let setup = relay_with_workspace("", &[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let (b, _) = setup.relay.client("device-b").await;
    let (session, _) = session(&a, "guarded").await;
    let uri = "ahp-terminal:/guarded";
    create_terminal(&a, "device-a", &session, uri)
        .await
        .expect("createTerminal");
    let mut on_a = Watched::open(&a, uri).await;
    on_a.until("the prompt", |state| {
        state.supports_command_detection == Some(true)
    })
    .await;
    for action in [
        json!({"type": "terminal/input", "data": "touch typed-by-b\n"}),
        json!({"type": "terminal/resized", "cols": 50, "rows": 10}),
    ] {
        let refused: Result<Value, ClientError> = b
            .request(
                "dispatchAction",
                json!({"channel": uri, "clientSeq": 1, "action": action}),
            )
            .await;
        assert!(
            matches!(&refused, Err(ClientError::Rpc(e)) if e.code == -32009),
            "{action}: {refused:?}"
        );
    }
    // A program prints a clipboard write, a link, and forged marks: a command's end with status 7 and a
    // directory of /etc/shadow. The command really ends with 0.
    a.dispatch(
        uri.to_string(),
        input(
            "printf 'x\\033]52;c;c2VjcmV0\\007\\033]8;;https://evil.example/\\007link\\033]8;;\\007\\033]633;D;7\\007\\033]633;P;Cwd=/etc/shadow\\007y\\n'; echo forged-$((2+3))\n",
        ),
    )
    .await
    .expect("type");
    on_a.until("the printing command's end", |state| {
        finished_with(state, "printf", "forged-5").is_some()
    })
    .await;
    let finished = finished_with(&on_a.state, "printf", "forged-5");
    assert_eq!(finished, Some(Some(0)), "the forged mark did not end the command");
    let shown = text(&on_a.state);
    assert!(
        !shown.contains("\u{1b}]52") && !shown.contains("\u{1b}]8;"),
        "{shown:?}"
    );
    assert!(shown.contains("xlinky"), "the text around them stays: {shown:?}");
    assert_ne!(on_a.state.cwd.as_deref(), Some("file:///etc/shadow"));
    // A program that looks for the nonce wherever it can read (every process's environment and command line
    // in the sandbox, the shell's among them) and forges a command's end with each candidate finds nothing.
    a.dispatch(
        uri.to_string(),
        input(
            "for t in $(cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -oE '[0-9a-f]{32}' | sort -u); do printf '\\033]633;D;9;%s\\007' \"$t\"; done; echo stolen-$((3+4))\n",
        ),
    )
    .await
    .expect("type");
    on_a.until("the searching command's end", |state| {
        finished_with(state, "for t in", "stolen-7").is_some()
    })
    .await;
    let finished = finished_with(&on_a.state, "for t in", "stolen-7");
    assert_eq!(
        finished,
        Some(Some(0)),
        "a nonce found in a process's environment or arguments ended the command"
    );
    // TIOCSTI: pushing input into the terminal from inside it.
    a.dispatch(
        uri.to_string(),
        input("perl -e 'my $c = \"x\"; print ioctl(STDIN, 0x5412, $c) ? \"sti:\".\"worked\\n\" : \"sti:\".\"refused $!\\n\"'\n"),
    )
    .await
    .expect("type");
    on_a.until("the TIOCSTI attempt", |state| {
        let shown = text(state);
        shown.contains("sti:worked") || shown.contains("sti:refused")
    })
    .await;
    let shown = text(&on_a.state);
    assert!(shown.contains("sti:refused Operation not permitted"), "{shown}");
    assert!(!setup
        .workspace
        .path()
        .join("dev/default/guarded/typed-by-b")
        .exists());
}

/// The terminals root state lists now (a fresh subscription's snapshot).
async fn listed_terminals(client: &ahp::Client) -> Vec<ahp_types::state::TerminalInfo> {
    let (root, _) = client.subscribe("ahp-root://".into()).await.expect("root");
    let SnapshotState::Root(root) = root.snapshot.expect("root snapshot").state else {
        panic!("root");
    };
    root.terminals.unwrap_or_default()
}

/// The running command of a terminal whose line starts with `start`, if any.
fn command_running(state: &TerminalState, start: &str) -> bool {
    state.content.iter().any(|part| {
        matches!(part, TerminalContentPart::Command(c) if c.command_line.starts_with(start) && !c.is_complete)
    })
}

/// The exit code of a finished command whose line starts with `start` and whose output holds `output`.
fn finished_with(state: &TerminalState, start: &str, output: &str) -> Option<Option<i64>> {
    state.content.iter().find_map(|part| match part {
        TerminalContentPart::Command(c)
            if c.command_line.starts_with(start) && c.is_complete && c.output.contains(output) =>
        {
            Some(c.exit_code)
        }
        _ => None,
    })
}

/// Issue 33 (1): a terminal lives on through a device's clear in the middle of a command (the clear takes the
/// open command, so its end applies to nothing) and through 5 MiB of output (past the host's 1 MiB scrollback,
/// which clears it itself): its shell still takes input and marks commands, it stays `running` in root state, and
/// it is disposed at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_survives_a_clear_mid_command_and_5_mib_of_output() {
    let setup = relay_with_workspace("", &[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let (session, _) = session(&a, "enduring").await;
    let uri = "ahp-terminal:/enduring";
    create_terminal(&a, "device-a", &session, uri)
        .await
        .expect("createTerminal");
    let mut on_a = Watched::open(&a, uri).await;
    on_a.until("the prompt", |state| {
        state.supports_command_detection == Some(true)
    })
    .await;
    // A command that runs until the test lets it go, cleared by the device while it runs.
    a.dispatch(
        uri.to_string(),
        input("while [ ! -e go ]; do sleep 0.05; done; echo after-clear-$((1+1))\n"),
    )
    .await
    .expect("type");
    on_a.until("the command running", |state| command_running(state, "while"))
        .await;
    a.dispatch(
        uri.to_string(),
        StateAction::TerminalCleared(ahp_types::actions::TerminalClearedAction {}),
    )
    .await
    .expect("clear");
    on_a.until("the clear", |state| !command_running(state, "while"))
        .await;
    std::fs::write(setup.workspace.path().join("dev/default/enduring/go"), "").expect("let it go");
    on_a.until("the output after the clear", |state| {
        text(state).contains("after-clear-2")
    })
    .await;
    a.dispatch(uri.to_string(), input("echo alive-$((2+3))\n"))
        .await
        .expect("type");
    on_a.until("the next command's end", |state| {
        finished_with(state, "echo alive", "alive-5").is_some()
    })
    .await;
    // 5 MiB: the host clears past its scrollback, mid-command, five times.
    a.dispatch(
        uri.to_string(),
        input("head -c 5242880 /dev/zero | tr '\\0' x; echo; echo big-done-$((3+4))\n"),
    )
    .await
    .expect("type");
    on_a.until("the end of 5 MiB", |state| text(state).contains("big-done-7"))
        .await;
    a.dispatch(uri.to_string(), input("echo still-$((4+5))\n"))
        .await
        .expect("type");
    on_a.until("a command after 5 MiB", |state| {
        finished_with(state, "echo still", "still-9") == Some(Some(0))
    })
    .await;
    assert!(!is_exited(&on_a.state), "the terminal is still running");
    let listed = listed_terminals(&a).await;
    assert!(
        listed
            .iter()
            .any(|t| t.resource == uri && matches!(t.lifecycle, TerminalLifecycleState::Running(_))),
        "root state lists it running: {listed:?}"
    );
    let _: Value = a
        .request("disposeTerminal", json!({"channel": uri}))
        .await
        .expect("disposeTerminal");
}

/// Issue 33 (1, 2): a `!command` printing 5 MiB (past the 1 MiB scrollback) ends its turn with its status, and
/// the next turn runs; disposing a running `!command`'s terminal ends its turn (killed) instead of leaving it
/// running for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bang_command_printing_5_mib_ends_its_turn_and_so_does_disposing_its_terminal() {
    let setup = relay_with_workspace("", &[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let (_, chat) = session(&a, "big-bang").await;
    let (_, _, mut on_chat) = subscribe_chat(&a, &chat).await;
    a.dispatch(
        chat.clone(),
        turn_started(
            "t1",
            "!head -c 5242880 /dev/zero | tr '\\0' y; echo; echo bang-done",
        ),
    )
    .await
    .expect("dispatch");
    collect_until(&mut on_chat, is_turn_complete).await;
    let shown = serde_json::to_string(&fresh_chat_snapshot(&setup.relay, &chat).await.turns).expect("json");
    assert!(shown.contains("bang-done") && shown.contains("exit 0"), "{shown}");
    // A running `!command` whose terminal a member disposes: its turn ends.
    a.dispatch(chat.clone(), turn_started("t2", "!sleep 31342"))
        .await
        .expect("dispatch");
    eventually("the command running", || {
        !processes(&["sleep", "31342"]).is_empty()
    })
    .await;
    let terminal = listed_terminals(&a)
        .await
        .into_iter()
        .find(|listed| listed.title.contains("31342"))
        .map(|listed| listed.resource)
        .expect("the command's terminal is listed");
    let _: Value = a
        .request("disposeTerminal", json!({"channel": terminal}))
        .await
        .expect("disposeTerminal");
    collect_until(&mut on_chat, is_turn_complete).await;
    let shown = serde_json::to_string(&fresh_chat_snapshot(&setup.relay, &chat).await.turns).expect("json");
    assert!(shown.contains("killed"), "{shown}");
    // And the chat takes the next turn.
    a.dispatch(chat.clone(), turn_started("t3", "!echo next-$((1+1))"))
        .await
        .expect("dispatch");
    collect_until(&mut on_chat, is_turn_complete).await;
    let shown = serde_json::to_string(&fresh_chat_snapshot(&setup.relay, &chat).await.turns).expect("json");
    assert!(shown.contains("next-2"), "{shown}");
}

/// Issue 33 (4): a client that follows the spec alone — a client claim and a `cwd`, no `_meta` of the relay's,
/// no size — opens a terminal in the session whose directory holds the `cwd`, at 80×24 (its state says so),
/// types into it and disposes it. A session whose agent has no workspace (the demo) is not offered a terminal
/// that would fail: `createTerminal` says why, and its `!command` goes to the agent as a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_only_client_opens_types_into_and_disposes_a_terminal() {
    let setup = relay_with_workspace("", &[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let (_, _) = session(&a, "spec").await;
    let directory = setup.workspace.path().join("dev/default/spec");
    let uri = "ahp-terminal:/spec-only";
    let _: Value = a
        .request(
            "createTerminal",
            json!({
                "channel": uri,
                "claim": {"kind": "client", "clientId": "device-a"},
                "cwd": format!("file://{}", directory.display()),
            }),
        )
        .await
        .expect("createTerminal without _meta");
    let mut on_a = Watched::open(&a, uri).await;
    assert_eq!((on_a.state.cols, on_a.state.rows), (Some(80), Some(24)));
    a.dispatch(uri.to_string(), input("stty size; echo spec-$((1+1))\n"))
        .await
        .expect("type");
    on_a.until("the answer", |state| {
        let shown = text(state);
        shown.contains("24 80") && shown.contains("spec-2")
    })
    .await;
    let _: Value = a
        .request("disposeTerminal", json!({"channel": uri}))
        .await
        .expect("disposeTerminal");
    // A cwd no session holds: said so.
    let refused: Result<Value, ClientError> = a
        .request(
            "createTerminal",
            json!({
                "channel": "ahp-terminal:/nowhere",
                "claim": {"kind": "client", "clientId": "device-a"},
                "cwd": "file:///nowhere",
            }),
        )
        .await;
    assert!(
        matches!(&refused, Err(ClientError::Rpc(e)) if e.code == -32602 && e.message.contains("cwd")),
        "{refused:?}"
    );
    // The demo agent has no workspace.
    let (demo, _) = ready_session(&a, "demo", "demo", json!({}))
        .await
        .expect("demo ready");
    let refused: Result<Value, ClientError> = a
        .request(
            "createTerminal",
            json!({
                "channel": "ahp-terminal:/demo",
                "claim": {"kind": "session", "session": demo, "chat": "ahp-chat:/demo"},
            }),
        )
        .await;
    assert!(
        matches!(&refused, Err(ClientError::Rpc(e)) if e.code == -32602 && e.message.contains("workspace")),
        "{refused:?}"
    );
    let chat = "ahp-chat:/demo".to_string();
    let (_, _, mut on_chat) = subscribe_chat(&a, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "!ls"))
        .await
        .expect("dispatch");
    collect_until(&mut on_chat, is_turn_complete).await;
    let shown = serde_json::to_string(&fresh_chat_snapshot(&setup.relay, &chat).await.turns).expect("json");
    assert!(
        !shown.contains("killed") && !shown.contains("ahp-terminal:"),
        "{shown}"
    );
}

/// Issue 33 (3): a terminal runs on while no device is connected for longer than the idle-host timeout (a
/// phone that started a build and locked its screen): its host stays in memory for it while another, idle one
/// is evicted; its late output is there when a device comes back, which types into it and disposes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_outlives_the_idle_host_timeout_with_no_client_connected() {
    // (The idle-host timeout is at least the clients' grace plus 1 s.)
    let setup = relay_with_workspace(
        "",
        &["--idle-host-timeout", "1s", "--active-client-grace-ms", "100"],
    )
    .await;
    let relay = &setup.relay;
    let uri = "ahp-terminal:/build";
    {
        let (a, _) = relay.client("phone").await;
        let (session, _) = session(&a, "build").await;
        create_terminal(&a, "phone", &session, uri)
            .await
            .expect("createTerminal");
        let mut on_a = Watched::open(&a, uri).await;
        on_a.until("the prompt", |state| {
            state.supports_command_detection == Some(true)
        })
        .await;
        a.dispatch(
            uri.to_string(),
            input("while [ ! -e done-waiting ]; do sleep 0.1; done; echo late-$((1+1))\n"),
        )
        .await
        .expect("type");
        on_a.until("the build running", |state| command_running(state, "while"))
            .await;
        // The phone locks its screen: no client of the tenant is connected.
    }
    // Another tenant's host, used after and left idle: the yardstick for the eviction pass.
    {
        let (other, _) = relay.client_as("other", "olga", Role::Member, "olga").await;
        other.ping().await.expect("ping");
    }
    let deadline = Instant::now() + PATIENCE;
    while relay.metric("ahp_relay_hosts_open").await > 1.0 {
        assert!(Instant::now() < deadline, "the idle host was never evicted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::write(setup.workspace.path().join("dev/default/build/done-waiting"), "").expect("let it finish");
    // The phone comes back: the terminal ran on, its output arrived, and it takes input.
    let (a, _) = relay.client("phone").await;
    let mut on_a = Watched::open(&a, uri).await;
    on_a.until("the late output", |state| text(state).contains("late-2"))
        .await;
    assert!(!is_exited(&on_a.state), "the terminal still runs");
    a.dispatch(uri.to_string(), input("echo back-$((2+3))\n"))
        .await
        .expect("type");
    on_a.until("the answer", |state| {
        finished_with(state, "echo back", "back-5") == Some(Some(0))
    })
    .await;
    let _: Value = a
        .request("disposeTerminal", json!({"channel": uri}))
        .await
        .expect("disposeTerminal");
}

/// Issue 33 (3), a live host: a session whose terminal runs stays in memory while nothing subscribes to it
/// (another device keeps the host open; unused sessions leave memory), so its terminal runs on and takes input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_keeps_its_session_in_memory_on_a_live_host() {
    let setup = relay_with_workspace(
        "",
        &["--idle-host-timeout", "400ms", "--active-client-grace-ms", "100"],
    )
    .await;
    let relay = &setup.relay;
    let (keeper, _) = relay.client("keeper").await;
    let (_, _) = session(&keeper, "unused").await;
    let uri = "ahp-terminal:/kept";
    {
        let (a, _) = relay.client("phone").await;
        let (session, _) = session(&a, "kept").await;
        create_terminal(&a, "phone", &session, uri)
            .await
            .expect("createTerminal");
        let mut on_a = Watched::open(&a, uri).await;
        on_a.until("the prompt", |state| {
            state.supports_command_detection == Some(true)
        })
        .await;
    }
    keeper.unsubscribe("ahp-session:/unused".into()).await.ok();
    keeper.unsubscribe("ahp-chat:/unused".into()).await.ok();
    // The unused session leaves memory: the yardstick for the sweep.
    let deadline = Instant::now() + PATIENCE;
    while relay.metric("ahp_relay_sessions_loaded").await > 1.0 {
        assert!(Instant::now() < deadline, "the unused session never left memory");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (a, _) = relay.client("phone").await;
    let mut on_a = Watched::open(&a, uri).await;
    assert!(!is_exited(&on_a.state), "the terminal still runs");
    a.dispatch(uri.to_string(), input("echo kept-$((2+3))\n"))
        .await
        .expect("type");
    on_a.until("the answer", |state| {
        finished_with(state, "echo kept", "kept-5") == Some(Some(0))
    })
    .await;
    keeper.ping().await.expect("the keeper is still attached");
}

/// Issue 33 (3), a shard failover: a device's terminal runs on a runner registered with two shards (on one
/// Postgres, over Redis); the shard owning its host is killed (SIGKILL) while the shell prints. The other shard
/// takes the host over and with it the running shell: what it prints after the move arrives (saying some may be
/// missing), it takes input, and disposing it kills its processes. Needs `DATABASE_URL` and `REDIS_URL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_survives_a_shard_failover_and_is_typed_into_and_disposed_after() {
    let (Ok(db), Ok(redis)) = (std::env::var("DATABASE_URL"), std::env::var("REDIS_URL")) else {
        eprintln!("skipped: DATABASE_URL and REDIS_URL are needed (scripts/test starts both)");
        return;
    };
    let agents = scripted_agents_file();
    let agents_path = agents.file.display().to_string();
    let shard_args = [
        "--database-url",
        db.as_str(),
        "--redis-url",
        redis.as_str(),
        "--lease-ttl",
        "3s",
        "--agents",
        agents_path.as_str(),
    ];
    let mut shards = vec![Shard::start(&shard_args).await, Shard::start(&shard_args).await];
    let urls = format!("{},{}", shards[0].url, shards[1].url);
    let gateways = [
        Relay::gateway_with(&urls, &["--redis-url", &redis]).await,
        Relay::gateway_with(&urls, &["--redis-url", &redis]).await,
    ];
    // One runner serves both shards.
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
    command
        .args([
            "runner",
            "--http-listen",
            "127.0.0.1:0",
            "--name",
            "both",
            "--shard",
            &urls,
            "--agents",
        ])
        .arg(&agents.file);
    let (_runner, _) = spawn_until(command, "runner serving").await;
    for shard in &shards {
        wait_for_runners(shard, 1.0).await;
    }

    let tenant = unique_tenant();
    let (a, _) = gateways[0]
        .client_as(&tenant, "ana", Role::Member, "ana-laptop")
        .await;
    let (session, _) = session(&a, "moving").await;
    let uri = "ahp-terminal:/moving";
    create_terminal(&a, "ana-laptop", &session, uri)
        .await
        .expect("createTerminal");
    let mut on_a = Watched::open(&a, uri).await;
    on_a.until("the prompt", |state| {
        state.supports_command_detection == Some(true)
    })
    .await;
    let marker = "31344";
    start_job(
        &a,
        &mut on_a,
        uri,
        &format!("sleep {marker} & echo started\n"),
        marker,
    )
    .await;
    let pids = processes(&["sleep", marker]);
    // A second terminal, quiet at its prompt when the shard dies (a job of its own in the background).
    let quiet = "ahp-terminal:/quiet";
    create_terminal(&a, "ana-laptop", &session, quiet)
        .await
        .expect("createTerminal");
    let mut on_quiet = Watched::open(&a, quiet).await;
    on_quiet
        .until("the prompt", |state| {
            state.supports_command_detection == Some(true)
        })
        .await;
    let quiet_marker = "31345";
    let quiet_pids = start_job(
        &a,
        &mut on_quiet,
        quiet,
        &format!("sleep {quiet_marker} & echo started\n"),
        quiet_marker,
    )
    .await;
    // A job that prints until it is told to stop: its output is in flight when the shard dies.
    a.dispatch(
        uri.to_string(),
        input("while [ ! -e stop-ticking ]; do echo tick; sleep 0.05; done; echo late-$((1+1))\n"),
    )
    .await
    .expect("type");
    on_a.until("the ticks", |state| text(state).matches("tick").count() > 3)
        .await;

    let store = relay_store::Store::connect(&db).await.expect("store");
    let owner_url = store
        .lease_of(&tenant, "default")
        .await
        .expect("lease")
        .expect("leased")
        .owner;
    let owner = shards
        .iter()
        .position(|shard| owner_url.starts_with(&shard.url))
        .expect("one of the shards owns the host");
    shards[owner].kill().await;
    // The runner's stream to the dead shard ended; the shell waits, its processes alive.
    assert!(
        !processes(&["sleep", marker]).is_empty(),
        "the job died with the shard"
    );

    // The device comes back through the other gateway, served by the other shard.
    let (a, _) = gateways[1]
        .client_as(&tenant, "ana", Role::Member, "ana-laptop")
        .await;
    let now_owner = store
        .lease_of(&tenant, "default")
        .await
        .expect("lease")
        .expect("leased")
        .owner;
    assert!(
        now_owner.starts_with(&shards[1 - owner].url),
        "the other shard took the host: {now_owner}"
    );
    let mut on_a = Watched::open(&a, uri).await;
    assert!(
        !is_exited(&on_a.state),
        "restored as running: {:?}",
        on_a.state.lifecycle
    );
    // Taken over: what it prints from now on arrives here, after the note that some may be missing.
    on_a.until("the note of the move", |state| text(state).contains("host moved"))
        .await;
    let workspace = agents.workspace.path().join(&tenant).join("default/moving");
    std::fs::write(workspace.join("stop-ticking"), "").expect("stop the ticks");
    on_a.until("the late output", |state| text(state).contains("late-2"))
        .await;
    a.dispatch(uri.to_string(), input("echo back-$((2+3))\n"))
        .await
        .expect("type");
    on_a.until("the answer to input after the move", |state| {
        text(state).contains("back-5")
    })
    .await;
    assert!(!is_exited(&on_a.state));
    let _: Value = a
        .request("disposeTerminal", json!({"channel": uri}))
        .await
        .expect("disposeTerminal after the move");
    all_gone("the terminal's job killed by its disposal", &pids).await;
    // The quiet one was taken over too (it learnt its shard went without printing), runs and takes input ...
    let mut on_quiet = Watched::open(&a, quiet).await;
    assert!(!is_exited(&on_quiet.state), "{:?}", on_quiet.state.lifecycle);
    on_quiet
        .until("the note of the move", |state| text(state).contains("host moved"))
        .await;
    a.dispatch(quiet.to_string(), input("echo quiet-$((3+4))\n"))
        .await
        .expect("type");
    on_quiet
        .until("its answer", |state| text(state).contains("quiet-7"))
        .await;
    // ... and disposing its session kills it, though the session's agent runs nowhere since the move.
    let _: Value = a
        .request("disposeSession", json!({"channel": session}))
        .await
        .expect("disposeSession after the move");
    all_gone("the quiet terminal's job killed with its session", &quiet_pids).await;
}

/// Issue 34 (2), acceptance 2: a store that blocks every commit for 60 s while a terminal floods output and an
/// agent streams its reply. The host's pending batch climbs to its byte budget (16 MiB) and stays there — the
/// shell is no longer read, its pty fills and its program waits; the agent's pipe fills the same way — so the
/// relay's memory stays bounded however long the store is stuck. Once the store returns, every line of both
/// arrives, once and in order, and the terminal takes input again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_stuck_for_60_s_holds_a_flooding_terminal_and_a_streaming_agent_at_the_pending_budget() {
    use sqlx::{Connection, Executor};
    const MIB: u64 = 1024 * 1024;
    const BUDGET: f64 = 16.0 * 1024.0 * 1024.0;
    const FLOOD_LINES: u64 = 2_500_000; // 18.9 MB
    const REPLY_LINES: u64 = 600_000; // 4.1 MB
                                      // No output rate to slow either: only the store's budget may.
    let setup = relay_with_workspace("[quotas]\noutput_bytes_per_second = 1073741824\n", &[]).await;
    let relay = &setup.relay;
    let (a, _) = relay.client("device-a").await;
    let (session, chat) = session(&a, "flood").await;
    let uri = "ahp-terminal:/flood";
    create_terminal(&a, "device-a", &session, uri)
        .await
        .expect("createTerminal");
    let mut watched = Watched::open(&a, uri).await;
    watched
        .until("the prompt", |state| {
            state.supports_command_detection == Some(true)
        })
        .await;
    // Every envelope of the terminal and of the chat from here on, as another device sees them.
    let (reader, _) = relay.client("device-b").await;
    let (_, mut terminal_sub) = reader.subscribe(uri.to_string()).await.expect("subscribe");
    let (_, _, mut chat_sub) = subscribe_chat(&reader, &chat).await;
    let terminal_seen = tokio::spawn(async move {
        let mut seen = Vec::new();
        let mut tail = String::new();
        while !tail.contains("flood-42-done") {
            let envelope = envelope_within(&mut terminal_sub).await;
            if let StateAction::TerminalData(data) = &envelope.action {
                tail.push_str(&data.data);
                let keep = tail.len().saturating_sub(64);
                tail = tail.split_off(tail.floor_char_boundary(keep));
            }
            seen.push(envelope);
        }
        seen
    });
    let chat_seen = tokio::spawn(async move {
        let mut seen = Vec::new();
        loop {
            let envelope = envelope_within(&mut chat_sub).await;
            let done = is_turn_complete(&envelope);
            seen.push(envelope);
            if done {
                return seen;
            }
        }
    });

    let mut blocker = sqlx::SqliteConnection::connect(&format!(
        "sqlite://{}",
        relay.data_dir().expect("data dir").join("relay.sqlite").display()
    ))
    .await
    .expect("open the relay's store");
    blocker
        .execute("BEGIN IMMEDIATE")
        .await
        .expect("take the write lock");
    let (before, _) = relay.memory();
    a.dispatch(
        uri.to_string(),
        input(&format!("seq 1 {FLOOD_LINES}; echo flood-$((40+2))-done\n")),
    )
    .await
    .expect("type");
    a.dispatch(
        chat.clone(),
        turn_started("t1", &format!("sh: seq 1 {REPLY_LINES}")),
    )
    .await
    .expect("prompt");
    // The pending batch fills up to its budget ...
    let deadline = Instant::now() + PATIENCE;
    while relay.metric("ahp_relay_pending_batch_bytes").await < BUDGET * 0.9 {
        assert!(
            Instant::now() < deadline,
            "the pending batch never filled up to its budget"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ... and then the store stays stuck for 60 s more while both run (the scenario's length, not a
    // synchronisation), the pending batch read once a second.
    let mut pending = Vec::new();
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        pending.push(relay.metric("ahp_relay_pending_batch_bytes").await);
    }
    let (_, peak) = relay.memory();
    let grown = peak.saturating_sub(before);
    let mib: Vec<String> = pending
        .iter()
        .map(|bytes| format!("{:.1}", bytes / MIB as f64))
        .collect();
    eprintln!(
        "60 s of a stuck store: pending batch (MiB, each second) {}; relay peak RSS +{} MiB",
        mib.join(" "),
        grown / MIB
    );
    // At the budget, give or take what was admitted before it was seen: the action of each producer that
    // crossed it (a terminal's data, at most 64 KiB; an agent's coalesced text) and the snapshot such an action
    // may queue (a terminal's document carries its scrollback, up to 1 MiB). Held there: not drained (nothing
    // commits) and not growing (nothing is read past it). Runs of this test have held at 16.3–17.3 MiB.
    let most = pending.iter().cloned().fold(0.0, f64::max);
    assert!(
        most <= BUDGET + 2.0 * MIB as f64,
        "the pending batch reached {most} bytes"
    );
    assert!(
        pending.iter().all(|&bytes| bytes >= BUDGET * 0.9),
        "the pending batch did not hold at its budget: {mib:?}"
    );
    assert!(
        pending.iter().all(|&bytes| bytes <= pending[0]),
        "the pending batch grew while the store was stuck: {mib:?}"
    );
    assert!(
        grown < 96 * MIB,
        "the relay's memory grew {} MiB while the store was stuck",
        grown / MIB
    );
    blocker.execute("ROLLBACK").await.expect("release the store");

    // Nothing lost, repeated or reordered: every number of both, once, in order.
    let terminal = terminal_seen.await.expect("the terminal's reader");
    let chat_envelopes = chat_seen.await.expect("the chat's reader");
    assert_increasing(&terminal);
    assert_increasing(&chat_envelopes);
    // What the shell printed, once: past its scrollback the terminal is cleared and its tail shown again,
    // which must be the end of what came before.
    let mut printed = String::new();
    let mut cleared = false;
    for envelope in &terminal {
        match &envelope.action {
            StateAction::TerminalCleared(_) => cleared = true,
            StateAction::TerminalData(data) if cleared => {
                assert!(
                    printed.ends_with(&data.data),
                    "the tail shown after a clear is not what was printed last"
                );
                cleared = false;
            }
            StateAction::TerminalData(data) => printed.push_str(&data.data),
            _ => {}
        }
    }
    assert_counts_up_to(&printed, FLOOD_LINES, "the terminal");
    let replied: String = chat_envelopes
        .iter()
        .filter_map(|envelope| match &envelope.action {
            StateAction::ChatResponsePart(part) => match &part.part {
                ahp_types::state::ResponsePart::Markdown(markdown) => Some(markdown.content.clone()),
                _ => None,
            },
            StateAction::ChatDelta(delta) => Some(delta.content.clone()),
            _ => None,
        })
        .collect();
    assert_counts_up_to(&replied, REPLY_LINES, "the agent's reply");
    watched
        .until("the end of the flood", |state| {
            text(state).contains("flood-42-done")
        })
        .await;
    a.dispatch(uri.to_string(), input("echo after-$((6*7))\n"))
        .await
        .expect("type");
    watched
        .until("input after the store returned", |state| {
            text(state).contains("after-42")
        })
        .await;
}

/// The lines of `output` that are numbers are exactly 1, 2, …, `last`. A line is what a terminal shows of it:
/// what follows its last carriage return, or the BEL ending an escape sequence (the shell's marks and modes
/// before a command's output).
fn assert_counts_up_to(output: &str, last: u64, what: &str) {
    let mut expected = 1;
    for line in output.lines() {
        let line = line.trim_end_matches('\r');
        let shown = line.rsplit(['\r', '\x07']).next().unwrap_or(line);
        if let Ok(n) = shown.parse::<u64>() {
            assert_eq!(
                n,
                expected,
                "{what}: {n} where {expected} was due; it began {:?}",
                output.chars().take(600).collect::<String>()
            );
            expected += 1;
        }
    }
    assert_eq!(expected, last + 1, "{what} stopped at {}", expected - 1);
}

/// The next envelope on `sub`, allowing for the time the store is stuck (its filling up, then 60 s).
async fn envelope_within(sub: &mut ahp::SessionSubscription) -> ahp_types::ActionEnvelope {
    loop {
        match tokio::time::timeout(Duration::from_secs(60) + 3 * PATIENCE, sub.recv())
            .await
            .expect("no envelope within the stall and a patience after it")
        {
            Some(ahp::client::SubscriptionEvent::Action(envelope)) => return envelope,
            Some(_) => continue,
            None => panic!("the subscription closed"),
        }
    }
}
