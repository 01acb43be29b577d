//! The web client in a real browser: headless Chromium (Debian's package; `scripts/with-chromium` installs it)
//! driven by `web/e2e/browser.mjs` with playwright-core, against a running `serve`.
//!
//! Needs `node`, the web client's npm packages (`web/node_modules`, installed by `scripts/build-web`) and
//! Chromium (`AHP_TEST_CHROMIUM`, else `/usr/bin/chromium`). `scripts/test` provides all three; without them
//! these tests fail and say what is missing.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use ahp::hosts::HostId;
use ahp::MultiHostStateMirror;
use ahp_types::actions::{ActionEnvelope, ChatInputCompletedAction, StateAction};
use ahp_types::state::{
    ChatInputAnswer, ChatInputAnswerValue, ChatInputAnswered, ChatInputResponseKind,
    ChatInputTextAnswerValue, Snapshot,
};
use relay_core::Role;
use support::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// With `AHP_README_SCREENSHOTS=1` (`scripts/screenshots`), copies the README's pictures from a run's
/// screenshots (`from` in `dir`) to `docs/` (`to`), so the README shows what the tests saw.
fn publish(dir: &Path, shots: &[(&str, &str)]) {
    if std::env::var("AHP_README_SCREENSHOTS").as_deref() != Ok("1") {
        return;
    }
    for (from, to) in shots {
        std::fs::copy(dir.join(from), repo().join("docs").join(to)).expect("copy a screenshot to docs/");
    }
}

/// Runs `web/e2e/browser.mjs` with `args`; panics with its output unless it succeeds.
async fn browser(args: &[&str]) -> String {
    let script = repo().join("web/e2e/browser.mjs");
    let modules = repo().join("web/node_modules/playwright-core");
    assert!(
        modules.exists(),
        "playwright-core is not installed in web/node_modules: run scripts/build-web (scripts/test does)"
    );
    let chromium = std::env::var("AHP_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "no Chromium at {chromium}: run the tests through scripts/with-chromium (scripts/test does)"
    );
    let run = tokio::process::Command::new("node")
        .arg(&script)
        .args(args)
        .env("AHP_TEST_CHROMIUM", &chromium)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    // Bounded: the script's own waits are 20 s each; a hung browser must not hang CI.
    let output = tokio::time::timeout(std::time::Duration::from_secs(180), run)
        .await
        .expect("the browser run did not finish in 3 minutes")
        .expect("run node (is Node.js installed?)");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "the browser run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // What the run reports (e.g. the accessibility pass's findings), shown with --nocapture.
    println!("{stdout}");
    stdout
}

/// Acceptance: a desktop browser creates a session with the demo agent, sends a prompt (with markup the agent
/// echoes), sees the reply stream in and approves the tool call; a phone-sized browser opens the same session
/// and shows the same conversation; the desktop's network is cut mid-turn while the phone answers the agent's
/// question, and once restored the desktop resumes by itself and ends with exactly the phone's state. Neither
/// page runs the echoed markup. Screenshots of both land in `target/browser-test/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_browsers_share_a_session_and_one_resumes_after_its_network_is_cut() {
    // Slow enough that the reply visibly arrives in parts.
    let relay = Relay::start_with(&["--demo-step-ms", "60"]).await;
    let token = relay.token("dev", "dev-user", Role::Admin);
    let out = repo().join("target/browser-test/flow");
    let _ = std::fs::remove_dir_all(&out);
    let base = format!("http://{}", relay.addr);
    let report = browser(&["flow", &base, &token, &out.display().to_string()]).await;
    assert!(report.contains("\"session\""), "{report}");
    for shot in ["desktop.png", "phone.png"] {
        let png = std::fs::read(out.join(shot)).expect("screenshot written");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{shot} is a PNG");
    }
    publish(
        &out,
        &[
            ("readme-desktop.png", "web-client.png"),
            ("readme-phone.png", "web-client-phone.png"),
            ("phone-offline.png", "web-client-phone-offline.png"),
        ],
    );
}

/// Issue 25 (1): sign-in that recovers. A foreign, an expired and an expiring token each bring the sign-in panel
/// with the reason (never an endless retry), a reload does not reuse a refused token, the identity provider's
/// login (`--sign-in-url`) returns with a working token, signing out forgets it, and no token is ever in a
/// WebSocket URL or the console (the page sends it in `Sec-WebSocket-Protocol`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_client_signs_in_and_recovers_from_a_refused_or_expired_token() {
    use relay_gateway::auth::{mint_hs256, Claims};
    use std::time::Duration;
    let relay = Relay::start_with(&[
        "--sign-in-url",
        "https://idp.example/login?return={return}&state={state}",
    ])
    .await;
    let good = relay.token("dev", "dev-user", Role::Admin);
    let mut stale = Claims::new("dev", "dev-user", Role::Admin, None, Duration::from_secs(3600));
    stale.exp -= 3 * 3600;
    stale.iat -= 3 * 3600;
    let expired = mint_hs256(SECRET.as_bytes(), &stale).expect("mint");
    let foreign = mint_hs256(
        b"someone-elses-secret-at-least-32-bytes-long",
        &Claims::new("dev", "dev-user", Role::Admin, None, Duration::from_secs(3600)),
    )
    .expect("mint");
    // A token of the tenant's host `other` only.
    let other_host = mint_hs256(
        SECRET.as_bytes(),
        &Claims::new(
            "dev",
            "dev-user",
            Role::Admin,
            Some(vec!["other".into()]),
            Duration::from_secs(3600),
        ),
    )
    .expect("mint");
    let out = repo().join("target/browser-test/signin");
    let _ = std::fs::remove_dir_all(&out);
    let base = format!("http://{}", relay.addr);
    let report = browser(&[
        "signin",
        &base,
        &good,
        &expired,
        &foreign,
        &other_host,
        // The page's test mints a token expiring on an open connection when it needs it (the secret signs it).
        SECRET,
        &out.display().to_string(),
    ])
    .await;
    assert!(report.contains("\"sockets\""), "{report}");
    publish(&out, &[("signin.png", "web-client-signin.png")]);
}

/// Issue 25 (6): the new-session form names the tenant's part of the workspace (`initialize`'s
/// `defaultDirectory`), a name typed there makes the session's directory under it, and a directory outside it is
/// refused next to the field, on a desktop and on a phone. Issue 26 (5, files): the session's Files pane lists,
/// walks and shows the folder's files on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_new_session_form_offers_the_workspace_and_says_what_is_wrong_beside_the_field() {
    let agents = scripted_agents_file();
    let (workspace, file) = (&agents.workspace, &agents.file);
    let relay = Relay::start_with(&["--agents", &file.display().to_string()]).await;
    let token = relay.token("dev", "dev-user", Role::Admin);
    let tenant_dir = workspace.path().join("dev");
    // What the session's Files pane finds in its folder.
    std::fs::create_dir_all(tenant_dir.join("myproject/src")).expect("project");
    std::fs::write(tenant_dir.join("myproject/README.md"), "# My project\n").expect("readme");
    std::fs::write(
        tenant_dir.join("myproject/src/main.rs"),
        "fn main() {\n    println!(\"hello from the workspace\");\n}\n",
    )
    .expect("main.rs");
    let out = repo().join("target/browser-test/form");
    let _ = std::fs::remove_dir_all(&out);
    let base = format!("http://{}", relay.addr);
    let report = browser(&[
        "form",
        &base,
        &token,
        &tenant_dir.display().to_string(),
        &out.display().to_string(),
    ])
    .await;
    assert!(report.contains("\"session\""), "{report}");
    assert!(
        tenant_dir.join("myproject").is_dir(),
        "the session's directory was made under the tenant's root"
    );
    publish(
        &out,
        &[
            ("form-phone.png", "web-client-form-phone.png"),
            ("files-desktop.png", "web-client-files.png"),
            ("files-phone.png", "web-client-files-phone.png"),
        ],
    );
    assert!(!Path::new("/etc/myproject").exists());
}

/// Issue 25 (8): messages — Markdown tables, quotes and highlighted code with a copy button, copying a reply,
/// long prompts folded, retrying the last turn and editing a sent prompt (truncate + resend), on a desktop and a
/// phone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_can_be_copied_edited_retried_and_read() {
    let relay = Relay::start_with(&["--demo-step-ms", "5"]).await;
    let token = relay.token("dev", "dev-user", Role::Admin);
    let out = repo().join("target/browser-test/messages");
    let _ = std::fs::remove_dir_all(&out);
    let base = format!("http://{}", relay.addr);
    let report = browser(&["messages", &base, &token, &out.display().to_string()]).await;
    assert!(report.contains("\"session\""), "{report}");
    publish(&out, &[("markdown.png", "web-client-markdown.png")]);
}

/// Issue 25 (11): search sessions by title across the tenant's catalogue (40 sessions, more than the list's first
/// page) and find text within the open chat, on a desktop and a phone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_searched_by_title_and_text_is_found_in_a_chat() {
    let relay = Relay::start_with(&["--demo-step-ms", "2"]).await;
    let (maker, _) = relay.client("maker").await;
    for i in 0..40 {
        let (session, _) = create_session_and_chat(&maker, &format!("titled-{i:02}")).await;
        let title = if i % 10 == 3 {
            format!("Launch plan {i}")
        } else {
            format!("Other work {i}")
        };
        maker
            .dispatch(
                session,
                StateAction::SessionTitleChanged(ahp_types::actions::SessionTitleChangedAction { title }),
            )
            .await
            .expect("title");
    }
    // The titles are actions: wait until the catalogue lists the last one.
    tokio::time::timeout(PATIENCE, async {
        loop {
            let page: ahp_types::commands::ListSessionsResult = maker
                .request(
                    "listSessions",
                    serde_json::json!({"channel": "ahp-root://", "limit": 1}),
                )
                .await
                .expect("list");
            if page.items.first().is_some_and(|s| s.title == "Other work 39") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("titles listed");
    // Something said in one of them, not in its title.
    let (_, _, mut said) = subscribe_chat(&maker, "ahp-chat:/titled-07").await;
    maker
        .dispatch(
            "ahp-chat:/titled-07".to_string(),
            turn_started("t1", "keep the zanzibar note"),
        )
        .await
        .expect("prompt");
    collect_until(&mut said, is_turn_complete).await;
    let token = relay.token("dev", "dev-user", Role::Admin);
    let out = repo().join("target/browser-test/search");
    let _ = std::fs::remove_dir_all(&out);
    let base = format!("http://{}", relay.addr);
    let report = browser(&["search", &base, &token, &out.display().to_string()]).await;
    assert!(report.contains("Launch plan 33"), "{report}");
    publish(
        &out,
        &[
            ("search-phone.png", "web-client-search-phone.png"),
            ("find-desktop.png", "web-client-find.png"),
        ],
    );
}

/// Issue 26 (5): the session's workspace in the page — a turn's changes (three files, counts, a diff), a review
/// mark the phone sees, a revert from the phone after its warning (the file back on disk), and a terminal the
/// desktop opens and types into while the phone watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workspace_panes_show_changes_and_share_a_terminal() {
    let agents = scripted_agents_file();
    let relay = Relay::start_with(&["--agents", &agents.file.display().to_string()]).await;
    let dir = agents.workspace.path().join("dev/project");
    std::fs::create_dir_all(&dir).expect("project");
    std::fs::write(dir.join("a.txt"), "one\ntwo\n").expect("a");
    std::fs::write(dir.join("b.txt"), "bee\n").expect("b");
    // The scripted agent's own state is not a change worth reviewing.
    std::fs::write(dir.join(".gitignore"), ".test-agent/\n.flow-control\n").expect("ignore");
    let (maker, _) = relay.client("maker").await;
    let session = "ahp-session:/workspace";
    let _: serde_json::Value = maker
        .request(
            "createSession",
            serde_json::json!({"channel": session, "provider": "scripted",
                "workingDirectories": [format!("file://{}", dir.display())]}),
        )
        .await
        .expect("createSession");
    let chat = "ahp-chat:/workspace";
    let (_, _, mut sub) = subscribe_chat(&maker, chat).await;
    maker
        .dispatch(
            chat.to_string(),
            turn_started(
                "t1",
                "sh: printf 'three\\n' >> a.txt && printf 'BEE\\n' > b.txt && printf 'new\\n' > c.txt",
            ),
        )
        .await
        .expect("prompt");
    collect_until(&mut sub, is_turn_complete).await;
    let token = relay.token("dev", "dev-user", Role::Admin);
    let out = repo().join("target/browser-test/workspace");
    let _ = std::fs::remove_dir_all(&out);
    let base = format!("http://{}", relay.addr);
    let report = browser(&["workspace", &base, &token, session, &out.display().to_string()]).await;
    assert!(report.contains("\"workspace\":\"ok\""), "{report}");
    assert_eq!(
        std::fs::read_to_string(dir.join("b.txt")).expect("b.txt"),
        "bee\n",
        "the phone's revert put b.txt back on disk"
    );
    publish(
        &out,
        &[
            ("changes-desktop.png", "web-client-changes.png"),
            ("changes-phone.png", "web-client-changes-phone.png"),
            ("terminal-desktop.png", "web-client-terminal.png"),
            ("terminal-phone.png", "web-client-terminal-phone.png"),
        ],
    );
}

/// Issue 36: a team's session in the web client — two members, a viewer, and a member of another tenant whose
/// link must not take over a tab; per-chat drafts, names on messages, edits only of one's own prompt, a
/// keyboard-only run (at most 5 Tabs from opening a session to its message box), a screen reader hearing one
/// "finished" per turn, approvals disabled offline, Return on a phone, a session's own terminals, panes only
/// where they work, view only — on desktop and phone, with axe finding nothing serious.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_shares_a_session_each_with_their_own_draft_name_and_terminal() {
    let agents = scripted_agents_file();
    // The same agent once more, serving one chat per session (no forks): its edits replace turns.
    let mut file = std::fs::read_to_string(&agents.file).expect("agents file");
    let scripted = file
        .split("[[agent]]")
        .nth(1)
        .expect("the scripted agent")
        .to_string();
    file.push_str(&format!(
        "\n[[agent]]{}multiple_chats = false\n",
        scripted
            .replace("id = \"scripted\"", "id = \"single\"")
            .replace("display_name = \"Scripted\"", "display_name = \"Single chat\"")
    ));
    // And an agent that cannot start (it exits at once).
    file.push_str("\n[[agent]]\nid = \"broken\"\ndisplay_name = \"Broken\"\ncommand = \"/bin/false\"\n");
    std::fs::write(&agents.file, file).expect("agents file");
    let relay = Relay::start_with(&[
        "--agents",
        &agents.file.display().to_string(),
        "--demo-step-ms",
        "20",
    ])
    .await;
    let alice = relay.token("dev", "alice", Role::Member);
    let bob = relay.token("dev", "bob", Role::Member);
    let viewer = relay.token("dev", "vic", Role::Viewer);
    let mallory = relay.token("evil", "mallory", Role::Member);
    let out = repo().join("target/browser-test/team");
    let _ = std::fs::remove_dir_all(&out);
    let base = format!("http://{}", relay.addr);
    let report = browser(&[
        "team",
        &base,
        &alice,
        &bob,
        &viewer,
        &mallory,
        &out.display().to_string(),
    ])
    .await;
    assert!(report.contains("\"team\":\"ok\""), "{report}");
    // Bob's edit was saved and Alice's, begun before it, was not written over it; then the phone saved its
    // own, on top of Bob's: the file holds the last save.
    assert_eq!(
        std::fs::read_to_string(agents.workspace.path().join("dev/teamproj/notes.txt")).expect("notes.txt"),
        "the phone's version\n"
    );
    publish(
        &out,
        &[
            ("team-desktop.png", "web-client-team.png"),
            ("team-phone.png", "web-client-team-phone.png"),
            ("team-link-question.png", "web-client-link-question.png"),
            ("team-branch.png", "web-client-team-branch.png"),
        ],
    );
}

/// Acceptance: the same envelope stream reduced in the browser (the page's WebAssembly `ahp` reducers) and by
/// `ahp` in Rust gives equal JSON, for a session and a chat through a turn with streaming, reasoning, a
/// confirmed tool call, an answered input request, a title and usage, and a second turn that is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_reducers_and_the_servers_agree_on_a_recorded_stream() {
    let relay = Relay::start().await;
    let (client, _) = relay.client("recorder").await;
    let (session, chat) = create_session_and_chat(&client, "agree").await;
    let (session_result, mut session_sub) = client.subscribe(session.clone()).await.expect("subscribe");
    let (chat_result, mut chat_sub) = client.subscribe(chat.clone()).await.expect("subscribe");
    let snapshots: Vec<Snapshot> = vec![
        session_result.snapshot.expect("session snapshot"),
        chat_result.snapshot.expect("chat snapshot"),
    ];

    let mut chat_envelopes: Vec<ActionEnvelope> = Vec::new();
    client
        .dispatch(
            chat.clone(),
            turn_started("t1", "use the tool, then ask for input"),
        )
        .await
        .expect("dispatch");
    loop {
        let env = next_envelope(&mut chat_sub).await;
        match &env.action {
            StateAction::ChatToolCallReady(ready) => {
                client
                    .dispatch(chat.clone(), confirm_tool_call("t1", &ready.tool_call_id, true))
                    .await
                    .expect("confirm");
            }
            StateAction::ChatInputRequested(asked) => {
                let question = asked
                    .request
                    .questions
                    .as_ref()
                    .and_then(|q| q.first())
                    .expect("a question");
                let id = serde_json::to_value(question).expect("question")["id"]
                    .as_str()
                    .expect("question id")
                    .to_string();
                let answer = ChatInputAnswer::Submitted(ChatInputAnswered {
                    value: ChatInputAnswerValue::Text(ChatInputTextAnswerValue { value: "Ana".into() }),
                });
                client
                    .dispatch(
                        chat.clone(),
                        StateAction::ChatInputCompleted(ChatInputCompletedAction {
                            request_id: asked.request.id.clone(),
                            response: ChatInputResponseKind::Accept,
                            answers: Some([(id, answer)].into_iter().collect()),
                        }),
                    )
                    .await
                    .expect("answer");
            }
            _ => {}
        }
        let done = is_turn_complete(&env);
        chat_envelopes.push(env);
        if done {
            break;
        }
    }
    // A second turn, cancelled while its tool call waits for confirmation.
    client
        .dispatch(chat.clone(), turn_started("t2", "the tool again"))
        .await
        .expect("dispatch");
    loop {
        let env = next_envelope(&mut chat_sub).await;
        if matches!(env.action, StateAction::ChatToolCallReady(_)) {
            client
                .dispatch(
                    chat.clone(),
                    StateAction::ChatTurnCancelled(ahp_types::actions::ChatTurnCancelledAction {
                        turn_id: "t2".into(),
                        duration: 0,
                        meta: None,
                    }),
                )
                .await
                .expect("cancel");
        }
        let done = matches!(env.action, StateAction::ChatTurnCancelled(_));
        chat_envelopes.push(env);
        if done {
            break;
        }
    }
    // Everything the session channel got up to the relay's current state of it.
    let (observer, _) = relay.client_as("dev", "observer", Role::Viewer, "observer").await;
    let (now, _) = observer.subscribe(session.clone()).await.expect("subscribe");
    let until = u64::try_from(now.snapshot.expect("session snapshot").from_seq).expect("seq");
    let mut session_envelopes = Vec::new();
    while session_envelopes
        .last()
        .is_none_or(|e: &ActionEnvelope| e.server_seq < until)
    {
        session_envelopes.push(next_envelope(&mut session_sub).await);
    }
    assert!(chat_envelopes.iter().all(|e| e.rejection_reason.is_none()));
    let envelopes: Vec<ActionEnvelope> = session_envelopes.into_iter().chain(chat_envelopes).collect();

    // In Rust, with `ahp`.
    let host = HostId::from("relay");
    let mut mirror = MultiHostStateMirror::new();
    for snapshot in &snapshots {
        mirror.apply_snapshot(&host, snapshot);
    }
    for envelope in &envelopes {
        mirror.apply_envelope(&host, envelope);
    }
    let key = |uri: &str| ahp::HostedResourceKey::new(host.clone(), uri);
    let rust_session = json(mirror.sessions().get(&key(&session)).expect("session mirrored"));
    let rust_chat = json(mirror.chats().get(&key(&chat)).expect("chat mirrored"));
    assert_eq!(
        rust_chat["turns"].as_array().map(Vec::len),
        Some(2),
        "{rust_chat}"
    );

    // In the browser, with the page's WebAssembly.
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("stream.json");
    let output = dir.path().join("states.json");
    std::fs::write(
        &input,
        serde_json::json!({"snapshots": snapshots, "envelopes": envelopes, "uris": [session, chat]})
            .to_string(),
    )
    .expect("write the stream");
    let base = format!("http://{}", relay.addr);
    browser(&[
        "reduce",
        &base,
        &input.display().to_string(),
        &output.display().to_string(),
    ])
    .await;
    let page: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&output).expect("the page's states")).expect("json");
    assert_eq!(page[&session], rust_session, "the session state");
    assert_eq!(page[&chat], rust_chat, "the chat state");
}

/// Issue 33 (15): a newcomer's `serve` (the demo agent's workspace on, as by default): the demo's first turn
/// shows in the web client's Changes pane as the file it wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_serves_demo_turn_shows_in_the_changes_pane() {
    let relay = Relay::start_with(&["--demo-workspace", "true"]).await;
    let (maker, _) = relay.client("maker").await;
    let (_, state) = ready_session(&maker, "demo", "newcomer", serde_json::json!({}))
        .await
        .expect("ready");
    let chat = state.default_chat.clone().expect("default chat");
    let (_, _, mut sub) = subscribe_chat(&maker, &chat).await;
    maker
        .dispatch(chat.clone(), turn_started("t1", "hello, demo"))
        .await
        .expect("prompt");
    collect_until(&mut sub, is_turn_complete).await;
    let token = relay.token("dev", "dev-user", Role::Admin);
    let out = repo().join("target/browser-test/demo");
    let _ = std::fs::remove_dir_all(&out);
    let base = format!("http://{}", relay.addr);
    let report = browser(&[
        "demo",
        &base,
        &token,
        "ahp-session:/newcomer",
        &out.display().to_string(),
    ])
    .await;
    assert!(report.contains("\"demo\":\"ok\""), "{report}");
}
