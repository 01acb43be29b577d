//! Issue 26 (4): changesets over AHP, with the official client over real WebSockets against `serve` with the
//! scripted ACP agent: a turn that edits two files and creates one lists three files with diffs (both sides
//! readable with `resourceRead`), review marks are shared by devices and survive a restart, a revert restores
//! the file on disk and updates every device, and in a git repository the commit operation makes a commit.

mod support;

use std::path::{Path, PathBuf};

use ahp::ClientError;
use ahp_types::actions::{ChangesetFilesReviewChangedAction, StateAction};
use ahp_types::state::{ChangesetState, ChangesetStatus, SessionState, Snapshot, SnapshotState};
use relay_core::Role;
use serde_json::{json, Value};
use support::*;

/// `serve` with the scripted agent's agents file, in `data`.
async fn relay(agents: &ScriptedAgents, data: &Path) -> Relay {
    Relay::start_in(data, &["--agents", agents.file.to_str().expect("path")]).await
}

/// A ready session of the scripted agent in `directory` (created first) or its own; its state.
async fn session(
    client: &ahp::Client,
    name: &str,
    directory: Option<&Path>,
) -> (String, String, SessionState) {
    let more = match directory {
        Some(directory) => json!({"workingDirectories": [format!("file://{}", directory.display())]}),
        None => json!({}),
    };
    let (session, state) = ready_session(client, "scripted", name, more)
        .await
        .expect("ready");
    (session, format!("ahp-chat:/{name}"), state)
}

/// Run a prompt in `chat` and wait for its turn to end.
async fn prompt(client: &ahp::Client, chat: &str, turn: &str, text: &str) {
    let (_, _, mut sub) = subscribe_chat(client, chat).await;
    client
        .dispatch(chat.to_string(), turn_started(turn, text))
        .await
        .expect("prompt");
    collect_until(&mut sub, is_turn_complete).await;
    client.unsubscribe(chat.to_string()).await.expect("unsubscribe");
}

fn changeset_state(snapshot: &Snapshot) -> ChangesetState {
    match &snapshot.state {
        SnapshotState::Changeset(state) => (**state).clone(),
        other => panic!("not a changeset: {other:?}"),
    }
}

/// A changeset a device watches, kept up to date from its subscription.
struct Watched {
    state: ChangesetState,
    sub: ahp::SessionSubscription,
}

impl Watched {
    async fn open(client: &ahp::Client, uri: &str) -> Watched {
        let (result, sub) = client
            .subscribe(uri.to_string())
            .await
            .expect("subscribe changeset");
        Watched {
            state: changeset_state(&result.snapshot.expect("snapshot")),
            sub,
        }
    }

    async fn until(&mut self, what: &str, done: impl Fn(&ChangesetState) -> bool) {
        let waited = tokio::time::timeout(PATIENCE, async {
            while !done(&self.state) {
                let envelope = next_envelope(&mut self.sub).await;
                if envelope.rejection_reason.is_none() {
                    ahp::reducers::apply_action_to_changeset(&mut self.state, &envelope.action);
                }
            }
        })
        .await;
        assert!(waited.is_ok(), "never saw {what}: {:#?}", self.state);
    }

    async fn ready(&mut self) {
        self.until("the changeset ready", |state| {
            state.status == ChangesetStatus::Ready
        })
        .await;
    }

    fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.state.files.iter().map(|file| file.id.clone()).collect();
        ids.sort();
        ids
    }
}

/// Marking `file` reviewed.
fn reviewed(file: &str) -> StateAction {
    StateAction::ChangesetFilesReviewChanged(ChangesetFilesReviewChangedAction {
        files: vec![file.into()],
        reviewed: true,
    })
}

fn is_reviewed(state: &ChangesetState, file: &str) -> bool {
    state
        .files
        .iter()
        .any(|entry| entry.id == file && entry.reviewed == Some(true))
}

async fn read_text(client: &ahp::Client, uri: &str) -> Result<String, ClientError> {
    let read: Value = client
        .request(
            "resourceRead",
            json!({"channel": "ahp-root://", "uri": uri, "encoding": "utf-8"}),
        )
        .await?;
    Ok(read["data"].as_str().expect("data").to_string())
}

async fn write(client: &ahp::Client, path: &Path, text: &str) {
    let _: Value = client
        .request(
            "resourceWrite",
            json!({"channel": "ahp-root://", "uri": format!("file://{}", path.display()), "data": text, "encoding": "utf-8"}),
        )
        .await
        .expect("write");
}

async fn invoke(
    client: &ahp::Client,
    changeset: &str,
    operation: &str,
    target: Option<Value>,
) -> Result<Value, ClientError> {
    let mut params = json!({"channel": changeset, "operationId": operation});
    if let Some(target) = target {
        params["target"] = target;
    }
    client.request("invokeChangesetOperation", params).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_changes_are_listed_reviewed_by_every_device_and_reverted() {
    let agents = scripted_agents_file();
    let data = tempfile::tempdir().expect("data");
    let mut relay_process = relay(&agents, data.path()).await;
    let (a, _) = relay_process.client("device-a").await;
    let (b, _) = relay_process.client("device-b").await;
    let dir: PathBuf = agents.workspace.path().join("dev/project");
    let _: Value = a
        .request(
            "resourceMkdir",
            json!({"channel": "ahp-root://", "uri": format!("file://{}", dir.display())}),
        )
        .await
        .expect("mkdir");
    write(&a, &dir.join("a.txt"), "one\ntwo\n").await;
    write(&a, &dir.join("b.txt"), "bee\n").await;
    // The scripted agent keeps its own state in the directory: not a change worth reviewing.
    write(&a, &dir.join(".gitignore"), ".test-agent/\n.flow-control\n").await;
    let (session, chat, state) = session(&a, "edits", Some(&dir)).await;
    let catalogue = state.changesets.expect("the session lists its changesets");
    assert_eq!(
        catalogue
            .iter()
            .map(|c| c.change_kind.as_str())
            .collect::<Vec<_>>(),
        vec!["turn", "session"]
    );
    assert!(catalogue
        .iter()
        .all(|c| c.capabilities.as_ref().and_then(|c| c.review.as_ref()).is_some()));

    // A turn edits two files and creates one (the agent's own shell, as coding agents write).
    prompt(
        &a,
        &chat,
        "t1",
        "sh: printf 'three\\n' >> a.txt && printf 'BEE\\n' > b.txt && printf 'new\\n' > c.txt",
    )
    .await;
    let turn = catalogue[0].uri_template.replace("{turnId}", "t1");
    // A turn that has no checkpoints names no changeset: nothing is opened (or computed) for it.
    let made_up = catalogue[0].uri_template.replace("{turnId}", "no-such-turn");
    let refused = b.subscribe(made_up).await.map(|_| ());
    assert!(
        matches!(&refused, Err(ClientError::Rpc(e)) if e.code == -32008),
        "{refused:?}"
    );
    let mut on_b = Watched::open(&b, &turn).await;
    on_b.ready().await;
    assert_eq!(on_b.ids(), vec!["a.txt", "b.txt", "c.txt"], "{:#?}", on_b.state);
    let file = |watched: &Watched, id: &str| {
        watched
            .state
            .files
            .iter()
            .find(|file| file.id == id)
            .cloned()
            .expect(id)
    };
    let a_txt = file(&on_b, "a.txt");
    let stats = a_txt.edit.diff.clone().expect("diff");
    assert_eq!((stats.added, stats.removed), (Some(1), Some(0)));
    let b_stats = file(&on_b, "b.txt").edit.diff.expect("diff");
    assert_eq!((b_stats.added, b_stats.removed), (Some(1), Some(1)));
    assert!(file(&on_b, "c.txt").edit.before.is_none(), "c.txt is new");
    // Both sides are content refs any client reads.
    let before = a_txt.edit.before.expect("before");
    let after = a_txt.edit.after.expect("after");
    assert_eq!(
        before.uri,
        format!(
            "file://{}",
            dir.canonicalize().expect("real").join("a.txt").display()
        )
    );
    assert_eq!(
        read_text(&b, &before.content.uri).await.expect("before"),
        "one\ntwo\n"
    );
    assert_eq!(
        read_text(&b, &after.content.uri).await.expect("after"),
        "one\ntwo\nthree\n"
    );

    // B marks a.txt reviewed; A sees it.
    let mut on_a = Watched::open(&a, &turn).await;
    on_a.ready().await;
    b.dispatch(turn.clone(), reviewed("a.txt")).await.expect("review");
    on_a.until("a.txt reviewed", |state| is_reviewed(state, "a.txt"))
        .await;
    // A file the changeset does not list (another device reverted it meanwhile) is ignored, as the spec says:
    // the mark is not refused, and the changeset does not grow a file.
    b.dispatch(turn.clone(), reviewed("nope.txt"))
        .await
        .expect("review");
    let echo = loop {
        let envelope = next_envelope(&mut on_b.sub).await;
        if envelope
            .origin
            .as_ref()
            .is_some_and(|origin| origin.client_id == "device-b")
            && envelope.action == reviewed("nope.txt")
        {
            break envelope;
        }
    };
    assert!(echo.rejection_reason.is_none(), "{echo:?}");
    ahp::reducers::apply_action_to_changeset(&mut on_b.state, &echo.action);
    assert!(
        !on_b.state.files.iter().any(|file| file.id == "nope.txt"),
        "{:#?}",
        on_b.state
    );

    // After a restart the mark is still there.
    drop((on_a, on_b));
    a.shutdown().await;
    b.shutdown().await;
    assert!(relay_process.terminate().await);
    let relay_process = relay(&agents, data.path()).await;
    let (a, _) = relay_process.client("device-a").await;
    let (b, _) = relay_process.client("device-b").await;
    let mut on_a = Watched::open(&a, &turn).await;
    on_a.ready().await;
    assert_eq!(file(&on_a, "a.txt").reviewed, Some(true), "{:#?}", on_a.state);
    assert_eq!(on_a.ids(), vec!["a.txt", "b.txt", "c.txt"]);
    let mut on_b = Watched::open(&b, &turn).await;
    on_b.ready().await;

    // A viewer reviews nothing and reverts nothing.
    let (viewer, _) = relay_process
        .client_as("dev", "someone", Role::Viewer, "viewer")
        .await;
    let refused = invoke(
        &viewer,
        &turn,
        "revert-file",
        Some(json!({"kind": "resource", "resource": "b.txt"})),
    )
    .await;
    assert!(
        matches!(&refused, Err(ClientError::Rpc(e)) if e.code == -32009),
        "{refused:?}"
    );
    // An operation the changeset does not offer, or with the wrong target, is refused.
    assert!(
        invoke(&a, &turn, "commit", None).await.is_err(),
        "no repository here"
    );
    assert!(
        invoke(&a, &turn, "revert-file", None).await.is_err(),
        "revert-file needs a file"
    );

    // A reverts b.txt: it is back on disk, and both devices see it leave the changeset.
    invoke(
        &a,
        &turn,
        "revert-file",
        Some(json!({"kind": "resource", "resource": "b.txt"})),
    )
    .await
    .expect("revert");
    assert_eq!(
        std::fs::read_to_string(dir.join("b.txt")).expect("b.txt"),
        "bee\n"
    );
    for watched in [&mut on_a, &mut on_b] {
        watched
            .until("b.txt gone from the changeset", |state| {
                state.status == ChangesetStatus::Ready && !state.files.iter().any(|file| file.id == "b.txt")
            })
            .await;
    }
    assert_eq!(on_b.ids(), vec!["a.txt", "c.txt"]);

    // All changes: the same three files since the session's first turn, less the reverted one.
    let all = Watched::open(&a, &catalogue[1].uri_template).await;
    let mut all = all;
    all.ready().await;
    assert_eq!(all.ids(), vec!["a.txt", "c.txt"]);
    // A mark on All changes holds while the change is the same, however often it is computed again (every
    // subscribe computes it anew).
    a.dispatch(catalogue[1].uri_template.clone(), reviewed("c.txt"))
        .await
        .expect("review");
    all.until("c.txt reviewed", |state| is_reviewed(state, "c.txt"))
        .await;
    let mut again = Watched::open(&b, &catalogue[1].uri_template).await;
    again
        .until("computed again", |state| {
            state.status == ChangesetStatus::Recomputing
        })
        .await;
    again.ready().await;
    assert_eq!(file(&again, "c.txt").reviewed, Some(true), "{:#?}", again.state);
    // Revert all (the destructive one says so first).
    let revert_all = all
        .state
        .operations
        .iter()
        .flatten()
        .find(|op| op.id == "revert-all")
        .cloned()
        .expect("revert-all");
    assert!(revert_all.confirmation.is_some());
    invoke(&a, &catalogue[1].uri_template, "revert-all", None)
        .await
        .expect("revert all");
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).expect("a.txt"),
        "one\ntwo\n"
    );
    assert!(!dir.join("c.txt").exists());
    all.until("nothing left", |state| {
        state.status == ChangesetStatus::Ready && state.files.is_empty()
    })
    .await;
    let _ = session;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_git_repository_the_commit_operation_makes_a_commit() {
    let agents = scripted_agents_file();
    let data = tempfile::tempdir().expect("data");
    let relay_process = relay(&agents, data.path()).await;
    let (a, _) = relay_process.client("device-a").await;
    let dir: PathBuf = agents.workspace.path().join("dev/repo");
    let _: Value = a
        .request(
            "resourceMkdir",
            json!({"channel": "ahp-root://", "uri": format!("file://{}", dir.display())}),
        )
        .await
        .expect("mkdir");
    write(&a, &dir.join(".gitignore"), ".test-agent/\n.flow-control\n").await;
    let (_, chat, state) = session(&a, "repo", Some(&dir)).await;
    let catalogue = state.changesets.expect("changesets");
    // The repository is made by the agent, as the tenant's user in its sandbox (whose files it is).
    prompt(&a, &chat, "t1", "sh: git init -q && printf 'hello\\n' > notes.md").await;
    let mut all = Watched::open(&a, &catalogue[1].uri_template).await;
    all.until("the repository's operations", |state| {
        state.status == ChangesetStatus::Ready
            && state.operations.iter().flatten().any(|op| op.id == "commit")
    })
    .await;
    assert!(all.ids().contains(&"notes.md".to_string()), "{:?}", all.ids());
    invoke(
        &a,
        &catalogue[1].uri_template,
        "stage",
        Some(json!({"kind": "resource", "resource": "notes.md"})),
    )
    .await
    .expect("stage");
    let result = invoke(&a, &catalogue[1].uri_template, "commit", None)
        .await
        .expect("commit");
    let log = std::process::Command::new("git")
        .args(["-c", "safe.directory=*", "-C"])
        .arg(&dir)
        .args(["log", "--format=%H %s", "--name-only"])
        .output()
        .expect("git log");
    let log = String::from_utf8_lossy(&log.stdout).to_string();
    assert!(log.contains("notes.md"), "{log}");
    assert!(log.contains("Changes from"), "{log}");
    let head = log.split_whitespace().next().expect("a commit");
    assert!(result.to_string().contains(head), "{result} names {head}");
}

/// Through a gateway to a shard, a turn's changes are checkpointed by the runner holding the workspace (its
/// tenant's file server), listed, read and reverted like in `serve`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_gateway_a_turns_changes_are_listed_and_reverted_on_the_runner() {
    let agents = scripted_agents_file();
    let shard = Shard::start(&["--agents", &agents.file.display().to_string()]).await;
    let gateway = Relay::gateway(&shard.url).await;
    let _runner = start_runner(&shard, &agents.file, 1.0).await;
    let (a, _) = gateway.client("device-a").await;
    let dir: PathBuf = agents.workspace.path().join("dev/remote");
    let _: Value = a
        .request(
            "resourceMkdir",
            json!({"channel": "ahp-root://", "uri": format!("file://{}", dir.display())}),
        )
        .await
        .expect("mkdir");
    write(&a, &dir.join("a.txt"), "one\n").await;
    write(&a, &dir.join(".gitignore"), ".test-agent/\n.flow-control\n").await;
    let (_, chat, state) = session(&a, "remote-edits", Some(&dir)).await;
    let catalogue = state.changesets.expect("changesets");
    prompt(
        &a,
        &chat,
        "t1",
        "sh: printf 'two\\n' >> a.txt && printf 'new\\n' > b.txt",
    )
    .await;
    let turn = catalogue[0].uri_template.replace("{turnId}", "t1");
    let mut watched = Watched::open(&a, &turn).await;
    watched.ready().await;
    assert_eq!(watched.ids(), vec!["a.txt", "b.txt"], "{:#?}", watched.state);
    let after = watched.state.files[0].edit.after.clone().expect("after");
    assert_eq!(
        read_text(&a, &after.content.uri).await.expect("after"),
        "one\ntwo\n"
    );
    invoke(&a, &turn, "revert-all", None).await.expect("revert");
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).expect("a.txt"),
        "one\n"
    );
    assert!(!dir.join("b.txt").exists());
    watched
        .until("nothing left", |state| {
            state.status == ChangesetStatus::Ready && state.files.is_empty()
        })
        .await;
}

/// Issue 32 (acceptance 1, git): a repository whose configuration the agent wrote to run commands — a filter in
/// a section header on the line of another, a byte that is not UTF-8, `core.fsmonitor`, `core.hooksPath`,
/// `include.path` (naming another filter) and `diff.external`, every file filtered by `.git/info/attributes` —
/// is staged, committed, checkpointed, its branches listed and switched to, and none of those commands runs.
/// Each would leave a file in the working directory (which every git the relay runs on it can write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_git_configuration_runs_nothing_the_relay_does_on_the_repository() {
    let agents = scripted_agents_file();
    let data = tempfile::tempdir().expect("data");
    let relay_process = relay(&agents, data.path()).await;
    let (a, _) = relay_process.client("device-a").await;
    let dir: PathBuf = agents.workspace.path().join("dev/planted");
    let _: Value = a
        .request(
            "resourceMkdir",
            json!({"channel": "ahp-root://", "uri": format!("file://{}", dir.display())}),
        )
        .await
        .expect("mkdir");
    write(&a, &dir.join(".gitignore"), ".test-agent/\n.flow-control\n").await;
    let (_, chat, state) = session(&a, "planted", Some(&dir)).await;
    let catalogue = state.changesets.expect("changesets");
    let touch = |name: &str| format!("touch {}/ran-{name}", dir.display());
    let config = format!(
        "[core] [filter \"x\"]\n\tclean = {}\n\tsmudge = {}\n\tprocess = {}\n\trequired = true\n\
         [core]\n\tfsmonitor = {}\n\thooksPath = {}/planted-hooks\n[diff]\n\texternal = {}\n\
         [include]\n\tpath = {}/.git/extra\n",
        touch("clean"),
        touch("smudge"),
        touch("process"),
        touch("fsmonitor"),
        dir.display(),
        touch("external"),
        dir.display(),
    );
    let extra = format!("[filter \"inc\"]\n\tclean = {}\n", touch("included"));
    let hooks = ["pre-commit", "post-commit", "post-checkout", "commit-msg"]
        .map(|hook| {
            format!(
                "printf '#!/bin/sh\\n{}\\n' > planted-hooks/{hook} && chmod +x planted-hooks/{hook}",
                touch(hook)
            )
        })
        .join(" && ");
    // The agent makes the repository and plants it all (as the tenant's user, in its sandbox).
    let script = format!(
        "sh: git init -q -b main && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m init && \
         git branch other && mkdir planted-hooks && {hooks} && printf '# \\377 not UTF-8\\n' >> .git/config && \
         printf '%s' '{config}' >> .git/config && \
         printf '%s' '{extra}' > .git/extra && printf '* filter=x\\n*.md filter=inc\\n' > .git/info/attributes && \
         printf 'hello\\n' > notes.md && git config --name-only --list | grep -c filter.x.clean"
    );
    prompt(&a, &chat, "t1", &script).await;
    assert!(
        dir.join(".git/config").exists() && dir.join("planted-hooks/pre-commit").exists(),
        "the agent planted the repository"
    );
    let planted = std::fs::read(dir.join(".git/config")).expect("config");
    assert!(
        planted.contains(&0o377),
        "the configuration holds a byte that is not UTF-8"
    );
    // A checkpoint (turn t2 starts and ends with one), Stage and Commit.
    prompt(&a, &chat, "t2", "sh: printf 'more\\n' >> notes.md").await;
    let mut all = Watched::open(&a, &catalogue[1].uri_template).await;
    all.until("the repository's operations", |state| {
        state.status == ChangesetStatus::Ready
            && state.operations.iter().flatten().any(|op| op.id == "commit")
    })
    .await;
    invoke(
        &a,
        &catalogue[1].uri_template,
        "stage",
        Some(json!({"kind": "resource", "resource": "notes.md"})),
    )
    .await
    .expect("stage");
    invoke(&a, &catalogue[1].uri_template, "commit", None)
        .await
        .expect("commit");
    // Branches listed, and a session started on another branch (switched to in its sandbox).
    let uri = format!("file://{}", dir.display());
    let listed: ahp_types::commands::SessionConfigCompletionsResult = a
        .request(
            "sessionConfigCompletions",
            json!({"channel": "ahp-root://", "provider": "scripted", "property": "branch",
                "workingDirectory": uri, "query": ""}),
        )
        .await
        .expect("completions");
    let branches: Vec<String> = listed.items.into_iter().map(|item| item.value).collect();
    assert_eq!(branches, ["main", "other"]);
    ready_session(
        &a,
        "scripted",
        "on-other",
        json!({"config": {"branch": "other"}, "workingDirectories": [uri]}),
    )
    .await
    .expect("switched to other");
    let head = std::fs::read_to_string(dir.join(".git/HEAD")).expect("HEAD");
    assert!(head.contains("refs/heads/other"), "{head}");
    let ran: Vec<String> = std::fs::read_dir(&dir)
        .expect("dir")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("ran-"))
        .collect();
    assert!(ran.is_empty(), "planted commands ran: {ran:?}");
}

/// Issue 33 (10): two sessions work in one directory; one is disposed. The other's checkpoints are its own, not
/// the directory's: its "All changes" still lists its change, and reverting it still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_share_a_directory_and_disposing_one_keeps_the_others_changes() {
    let agents = scripted_agents_file();
    let data = tempfile::tempdir().expect("data");
    let relay_process = relay(&agents, data.path()).await;
    let (a, _) = relay_process.client("device-a").await;
    let dir: PathBuf = agents.workspace.path().join("dev/shared");
    let _: Value = a
        .request(
            "resourceMkdir",
            json!({"channel": "ahp-root://", "uri": format!("file://{}", dir.display())}),
        )
        .await
        .expect("mkdir");
    write(&a, &dir.join("a.txt"), "one\n").await;
    write(&a, &dir.join(".gitignore"), ".test-agent/\n.flow-control\n").await;
    let (_, chat_one, _) = session(&a, "first", Some(&dir)).await;
    let (_, chat_two, state_two) = session(&a, "second", Some(&dir)).await;
    prompt(&a, &chat_one, "t1", "sh: printf 'by-first\\n' > first.txt").await;
    prompt(&a, &chat_two, "t1", "sh: printf 'two\\n' >> a.txt").await;
    let _: Value = a
        .request("disposeSession", json!({"channel": "ahp-session:/first"}))
        .await
        .expect("disposeSession");
    let catalogue = state_two.changesets.expect("changesets");
    let mut all = Watched::open(&a, &catalogue[1].uri_template).await;
    all.ready().await;
    assert_eq!(all.ids(), vec!["a.txt"], "{:#?}", all.state);
    // Issue 33 (9): a mark naming a file the changeset no longer lists (another device reverted it) marks the
    // others, as the spec says, instead of being refused whole.
    a.dispatch(
        catalogue[1].uri_template.clone(),
        StateAction::ChangesetFilesReviewChanged(ChangesetFilesReviewChangedAction {
            files: vec!["a.txt".into(), "reverted-meanwhile.txt".into()],
            reviewed: true,
        }),
    )
    .await
    .expect("review");
    all.until("a.txt reviewed", |state| is_reviewed(state, "a.txt"))
        .await;
    invoke(&a, &catalogue[1].uri_template, "revert-all", None)
        .await
        .expect("revert all");
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).expect("a.txt"),
        "one\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("first.txt")).expect("the first session's file stays"),
        "by-first\n"
    );
}

/// Issue 33 (15): `serve` as a newcomer starts it (no agents file) gives the demo agent a workspace under its
/// data directory where this machine can sandbox: `initialize` names the tenant's `defaultDirectory`, a demo
/// session gets a directory of its own, and each turn appends the prompt to `notes.md` there — a changeset to
/// review, whose file any client reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_serve_gives_the_demo_a_workspace_whose_turns_are_changes() {
    let relay = Relay::start_with(&["--demo-workspace", "true"]).await;
    let (a, init) = relay.client("device-a").await;
    let default_directory = init.default_directory.expect("a default directory");
    assert!(default_directory.starts_with("file:///"), "{default_directory}");
    let (_, state) = ready_session(&a, "demo", "first-steps", json!({}))
        .await
        .expect("ready");
    let catalogue = state.changesets.expect("the session lists its changesets");
    let chat = state.default_chat.clone().expect("default chat");
    prompt(&a, &chat, "t1", "hello from a newcomer").await;
    let turn = catalogue[0].uri_template.replace("{turnId}", "t1");
    let mut watched = Watched::open(&a, &turn).await;
    watched.ready().await;
    assert_eq!(watched.ids(), vec!["notes.md"], "{:#?}", watched.state);
    let notes = format!("{default_directory}/default/first-steps/notes.md");
    let text = read_text(&a, &notes).await.expect("notes.md");
    assert!(text.contains("hello from a newcomer"), "{text}");
    // A directory the new-session form names under the tenant's: the demo works there too.
    let project = format!("{default_directory}/project");
    let (_, state) = ready_session(&a, "demo", "in-project", json!({"workingDirectories": [project]}))
        .await
        .expect("a named directory");
    let chat = state.default_chat.clone().expect("default chat");
    prompt(&a, &chat, "t1", "notes in the project").await;
    let text = read_text(&a, &format!("{project}/notes.md"))
        .await
        .expect("the project's notes.md");
    assert!(text.contains("notes in the project"), "{text}");
}
