//! Issue 26 (1): a tenant's files over AHP's `resource*` commands, with the official client over real
//! WebSockets against `serve` with an agents file (so the relay holds a workspace): every rule of the commands
//! (encodings, write modes, createOnly, ifMatch, mkdir -p, followSymlinks, NotFound), escapes refused with
//! nothing touched outside, tenants apart, viewers reading only, sizes bounded, and the file server running as
//! the tenant's user in a sandbox, not as the relay.

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use std::time::Duration;

use ahp::ClientError;
use relay_core::Role;
use relay_gateway::auth::{mint_hs256, Claims};
use serde_json::{json, Value};
use support::*;

struct FilesRelay {
    relay: Relay,
    workspace: tempfile::TempDir,
    _config: tempfile::TempDir,
}

impl FilesRelay {
    /// `tenant`'s part of the workspace.
    fn root(&self, tenant: &str) -> PathBuf {
        self.workspace.path().join(tenant)
    }
}

/// `serve` with the scripted agent's agents file (a workspace in a temporary directory) and `extra` flags.
async fn relay_with_workspace(extra: &[&str]) -> FilesRelay {
    let agents = scripted_agents_file();
    let mut args = vec!["--agents", agents.file.to_str().expect("path")];
    args.extend_from_slice(extra);
    let relay = Relay::start_with(&args).await;
    FilesRelay {
        relay,
        workspace: agents.workspace,
        _config: agents.config,
    }
}

fn uri(path: &Path) -> String {
    format!("file://{}", path.display())
}

fn code<T: std::fmt::Debug>(result: Result<T, ClientError>) -> (i32, String) {
    match result {
        Err(ClientError::Rpc(e)) => (e.code, e.message),
        other => panic!("expected an RPC error, got {other:?}"),
    }
}

async fn call(client: &ahp::Client, method: &str, params: Value) -> Result<Value, ClientError> {
    let mut params = params;
    params["channel"] = json!("ahp-root://");
    client.request::<_, Value>(method, params).await
}

/// The tenant's directory exists once its file server started: the first request makes it.
async fn mkdir(client: &ahp::Client, path: &Path) {
    call(client, "resourceMkdir", json!({"uri": uri(path)}))
        .await
        .expect("mkdir");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_read_and_written_by_the_rules_of_the_spec() {
    let setup = relay_with_workspace(&[]).await;
    let (a, init) = setup.relay.client("device-a").await;
    let root = setup.root("dev");
    assert_eq!(init.default_directory.as_deref(), Some(uri(&root).as_str()));
    let dir = root.join("project/src");
    mkdir(&a, &dir).await;
    assert!(dir.is_dir(), "mkdir -p made the parents");
    mkdir(&a, &dir).await;

    // Text: written as UTF-8, read back as UTF-8 with a sniffed type.
    let notes = dir.join("notes.md");
    call(
        &a,
        "resourceWrite",
        json!({"uri": uri(&notes), "data": "# Notes\n", "encoding": "utf-8"}),
    )
    .await
    .expect("write");
    let read = call(&a, "resourceRead", json!({"uri": uri(&notes)}))
        .await
        .expect("read");
    assert_eq!(read["data"], "# Notes\n");
    assert_eq!(read["encoding"], "utf-8");
    assert_eq!(read["contentType"], "text/markdown");
    // Asked for base64, text comes as base64.
    let read = call(
        &a,
        "resourceRead",
        json!({"uri": uri(&notes), "encoding": "base64"}),
    )
    .await
    .expect("read");
    assert_eq!(
        (read["data"].as_str(), read["encoding"].as_str()),
        (Some("IyBOb3Rlcwo="), Some("base64"))
    );

    // Binary MUST be base64, whatever was asked.
    let png = dir.join("pixel.png");
    call(
        &a,
        "resourceWrite",
        json!({"uri": uri(&png), "data": "iVBORw0KGgoAAAANSUhEUg==", "encoding": "base64"}),
    )
    .await
    .expect("write binary");
    let read = call(&a, "resourceRead", json!({"uri": uri(&png), "encoding": "utf-8"}))
        .await
        .expect("read");
    assert_eq!(
        (read["encoding"].as_str(), read["contentType"].as_str()),
        (Some("base64"), Some("image/png"))
    );
    assert_eq!(read["data"], "iVBORw0KGgoAAAANSUhEUg==");

    // Modes and positions.
    let text = dir.join("t.txt");
    let write = |data: &str, mode: &str, position: i64| {
        call(
            &a,
            "resourceWrite",
            json!({"uri": uri(&text), "data": data, "encoding": "utf-8", "mode": mode, "position": position}),
        )
    };
    write("hello world", "truncate", 0).await.expect("create");
    write("there", "truncate", 6).await.expect("truncate at 6");
    write("!", "append", 0).await.expect("append");
    write(",", "append", 7).await.expect("append 7 from the end");
    write(">> ", "insert", 0).await.expect("insert");
    assert_eq!(std::fs::read_to_string(&text).expect("read"), ">> hello, there!");
    assert_eq!(code(write("x", "insert", 999).await).0, -32602);
    assert_eq!(
        code(
            call(
                &a,
                "resourceWrite",
                json!({"uri": uri(&text), "data": "x", "encoding": "utf-8", "position": -1})
            )
            .await
        )
        .0,
        -32602
    );

    // createOnly and ifMatch.
    let (refused, _) = code(
        call(
            &a,
            "resourceWrite",
            json!({"uri": uri(&text), "data": "x", "encoding": "utf-8", "createOnly": true}),
        )
        .await,
    );
    assert_eq!(refused, -32010);
    let resolved = call(&a, "resourceResolve", json!({"uri": uri(&text)}))
        .await
        .expect("resolve");
    assert_eq!(
        (resolved["type"].as_str(), resolved["size"].as_i64()),
        (Some("file"), Some(16))
    );
    let etag = resolved["etag"].as_str().expect("etag").to_string();
    write("changed meanwhile", "truncate", 0)
        .await
        .expect("another write");
    let (conflict, _) = code(
        call(
            &a,
            "resourceWrite",
            json!({"uri": uri(&text), "data": "lost update", "encoding": "utf-8", "ifMatch": etag}),
        )
        .await,
    );
    assert_eq!(conflict, -32011);
    assert_eq!(std::fs::read_to_string(&text).expect("read"), "changed meanwhile");
    let fresh = call(&a, "resourceResolve", json!({"uri": uri(&text)}))
        .await
        .expect("resolve")["etag"]
        .clone();
    call(
        &a,
        "resourceWrite",
        json!({"uri": uri(&text), "data": "ok", "encoding": "utf-8", "ifMatch": fresh}),
    )
    .await
    .expect("a write with the current etag");

    // mkdir over a file; NotFound for what is missing.
    assert_eq!(
        code(call(&a, "resourceMkdir", json!({"uri": uri(&text)})).await).0,
        -32010
    );
    for method in [
        "resourceRead",
        "resourceResolve",
        "resourceList",
        "resourceDelete",
    ] {
        let (missing, _) = code(call(&a, method, json!({"uri": uri(&dir.join("missing"))})).await);
        assert_eq!(missing, -32008, "{method}");
    }

    // Symlinks: lstat or followed to the canonical URI.
    std::os::unix::fs::symlink(&text, dir.join("link.txt")).expect("symlink");
    let link = call(
        &a,
        "resourceResolve",
        json!({"uri": uri(&dir.join("link.txt")), "followSymlinks": false}),
    )
    .await
    .expect("lstat");
    assert_eq!(link["type"], "symlink");
    let followed = call(&a, "resourceResolve", json!({"uri": uri(&dir.join("link.txt"))}))
        .await
        .expect("stat");
    assert_eq!(
        (followed["type"].as_str(), followed["uri"].as_str()),
        (
            Some("file"),
            Some(uri(&text.canonicalize().expect("real")).as_str())
        )
    );

    // List, copy, move, delete.
    let listed = call(&a, "resourceList", json!({"uri": uri(&dir)}))
        .await
        .expect("list");
    let names: Vec<(String, String)> = listed["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or("").to_string(),
                e["type"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("link.txt", "file"),
            ("notes.md", "file"),
            ("pixel.png", "file"),
            ("t.txt", "file")
        ]
        .map(|(n, t)| (n.to_string(), t.to_string()))
    );
    assert_eq!(
        code(call(&a, "resourceList", json!({"uri": uri(&text)})).await).0,
        -32602
    );
    let copy = root.join("project/copy");
    call(
        &a,
        "resourceCopy",
        json!({"source": uri(&dir), "destination": uri(&copy)}),
    )
    .await
    .expect("copy a tree");
    assert_eq!(
        std::fs::read_to_string(copy.join("notes.md")).expect("copied"),
        "# Notes\n"
    );
    let (exists, _) = code(
        call(
            &a,
            "resourceCopy",
            json!({"source": uri(&notes), "destination": uri(&copy.join("t.txt")), "failIfExists": true}),
        )
        .await,
    );
    assert_eq!(exists, -32010);
    call(
        &a,
        "resourceMove",
        json!({"source": uri(&copy.join("t.txt")), "destination": uri(&copy.join("moved.txt"))}),
    )
    .await
    .expect("move");
    assert!(!copy.join("t.txt").exists() && copy.join("moved.txt").exists());
    let (not_empty, _) = code(call(&a, "resourceDelete", json!({"uri": uri(&copy)})).await);
    assert_eq!(not_empty, -32602);
    call(
        &a,
        "resourceDelete",
        json!({"uri": uri(&copy), "recursive": true}),
    )
    .await
    .expect("delete a tree");
    assert!(!copy.exists());

    // The files were written by the tenant's file server, as the tenant's own user when the relay is root.
    if rustix_is_root() {
        let owner = std::fs::metadata(&notes).expect("meta").uid();
        assert_ne!(owner, 0, "the file server does not write as the relay's user");
    }
}

fn rustix_is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapes_are_refused_with_nothing_touched_outside() {
    let setup = relay_with_workspace(&[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let root = setup.root("dev");
    mkdir(&a, &root.join("p")).await;
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(outside.path().join("secret"), "secret").expect("secret");
    std::os::unix::fs::symlink(outside.path(), root.join("p/escape")).expect("symlink out");
    let attempts = [
        format!("file://{}/p/../../x", root.display()),
        uri(&outside.path().join("secret")),
        uri(&root.join("p/escape/secret")),
        uri(&root.join("p/escape/new")),
        "file:///etc/passwd".to_string(),
    ];
    for target in &attempts {
        let (read, _) = code(call(&a, "resourceRead", json!({"uri": target})).await);
        assert_eq!(read, -32009, "read {target}");
        let (write, _) = code(
            call(
                &a,
                "resourceWrite",
                json!({"uri": target, "data": "x", "encoding": "utf-8"}),
            )
            .await,
        );
        assert_eq!(write, -32009, "write {target}");
        let (mkdir, _) = code(call(&a, "resourceMkdir", json!({"uri": format!("{target}-dir")})).await);
        assert_eq!(mkdir, -32009, "mkdir {target}");
    }
    let (moved, _) = code(
        call(
            &a,
            "resourceMove",
            json!({"source": uri(&root.join("p")), "destination": uri(&outside.path().join("stolen"))}),
        )
        .await,
    );
    assert_eq!(moved, -32009);
    let (copied, _) = code(
        call(
            &a,
            "resourceCopy",
            json!({"source": uri(&outside.path().join("secret")), "destination": uri(&root.join("p/copy"))}),
        )
        .await,
    );
    assert_eq!(copied, -32009);
    let entries: Vec<_> = std::fs::read_dir(outside.path()).expect("list").collect();
    assert_eq!(entries.len(), 1, "nothing was created outside");
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret")).expect("read"),
        "secret"
    );
    assert!(root.join("p").is_dir() && !root.join("p/copy").exists());
    // Not a file: URI at all.
    assert_eq!(
        code(call(&a, "resourceRead", json!({"uri": "https://example.com/x"})).await).0,
        -32008
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_apart_and_viewers_only_read() {
    let setup = relay_with_workspace(&[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let root = setup.root("dev");
    let file = root.join("shared/plan.txt");
    mkdir(&a, &root.join("shared")).await;
    call(
        &a,
        "resourceWrite",
        json!({"uri": uri(&file), "data": "plan", "encoding": "utf-8"}),
    )
    .await
    .expect("write");

    // Another tenant reaches none of it.
    let (b, init) = setup.relay.client_as("other", "bob", Role::Admin, "bob").await;
    assert_eq!(
        init.default_directory.as_deref(),
        Some(uri(&setup.root("other")).as_str())
    );
    for (method, params) in [
        ("resourceRead", json!({"uri": uri(&file)})),
        ("resourceList", json!({"uri": uri(&root)})),
        ("resourceResolve", json!({"uri": uri(&file)})),
        ("resourceDelete", json!({"uri": uri(&file)})),
        (
            "resourceWrite",
            json!({"uri": uri(&file), "data": "mine", "encoding": "utf-8"}),
        ),
    ] {
        assert_eq!(code(call(&b, method, params).await).0, -32009, "{method}");
    }
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "plan");

    // A viewer of the tenant reads, never writes.
    let (viewer, _) = setup.relay.client_as("dev", "vera", Role::Viewer, "vera").await;
    let read = call(&viewer, "resourceRead", json!({"uri": uri(&file)}))
        .await
        .expect("a viewer reads");
    assert_eq!(read["data"], "plan");
    for (method, params) in [
        (
            "resourceWrite",
            json!({"uri": uri(&file), "data": "vandal", "encoding": "utf-8"}),
        ),
        ("resourceMkdir", json!({"uri": uri(&root.join("v"))})),
        ("resourceDelete", json!({"uri": uri(&file)})),
        (
            "resourceMove",
            json!({"source": uri(&file), "destination": uri(&root.join("x"))}),
        ),
        (
            "resourceCopy",
            json!({"source": uri(&file), "destination": uri(&root.join("x"))}),
        ),
        ("resourceRequest", json!({"uri": uri(&file), "write": true})),
    ] {
        assert_eq!(
            code(call(&viewer, method, params).await).0,
            -32009,
            "viewer {method}"
        );
    }
    call(
        &viewer,
        "resourceRequest",
        json!({"uri": uri(&file), "read": true}),
    )
    .await
    .expect("a viewer may read");
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "plan");
    assert!(!root.join("v").exists() && !root.join("x").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_writes_are_bounded_and_a_larger_file_is_an_error_naming_the_limit() {
    let setup = relay_with_workspace(&["--max-file-bytes", "1024"]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let root = setup.root("dev");
    mkdir(&a, &root).await;
    let big = root.join("big.log");
    std::fs::write(&big, vec![b'x'; 2000]).expect("big");
    let (read, message) = code(call(&a, "resourceRead", json!({"uri": uri(&big)})).await);
    assert_eq!(read, -32602);
    assert!(message.contains("1024 bytes"), "{message}");
    let small = root.join("small.log");
    call(
        &a,
        "resourceWrite",
        json!({"uri": uri(&small), "data": "ok", "encoding": "utf-8"}),
    )
    .await
    .expect("small");
    let (write, message) = code(
        call(
            &a,
            "resourceWrite",
            json!({"uri": uri(&small), "data": "y".repeat(1500), "encoding": "utf-8", "mode": "append"}),
        )
        .await,
    );
    assert_eq!(write, -32602);
    assert!(message.contains("1024 bytes"), "{message}");
    assert_eq!(
        std::fs::read_to_string(&small).expect("read"),
        "ok",
        "never a truncated success"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_workspace_the_commands_say_why() {
    let relay = Relay::start().await;
    let (a, _) = relay.client("device-a").await;
    let (refused, message) = code(call(&a, "resourceRead", json!({"uri": "file:///tmp/x"})).await);
    assert_eq!(refused, -32601);
    assert!(message.contains("--agents"), "{message}");
}

/// The metric `name` of the relay, once it reads `value` (or the last value read after [`PATIENCE`]).
async fn metric_becomes(relay: &Relay, name: &str, value: f64) -> f64 {
    let mut seen = relay.metric(name).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while seen != value && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        seen = relay.metric(name).await;
    }
    seen
}

/// The next `resourceWatch/changed` on `sub`: its (uri, type) items.
async fn next_changes(sub: &mut ahp::SessionSubscription) -> Vec<(String, String)> {
    loop {
        let envelope = next_envelope(sub).await;
        if let ahp_types::actions::StateAction::ResourceWatchChanged(changed) = &envelope.action {
            let value = serde_json::to_value(&changed.changes).expect("changes");
            return value["items"]
                .as_array()
                .expect("items")
                .iter()
                .map(|item| {
                    (
                        item["uri"].as_str().unwrap_or("").to_string(),
                        item["type"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect();
        }
    }
}

/// Issue 26 (1): a watch reports what a client and the agent change (its excludes filtered out), only to its
/// own connection, and is released on unsubscribe and on disconnect (the gauge says so); bounded per connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_reports_changes_and_is_released_on_unsubscribe_and_on_disconnect() {
    let setup = relay_with_workspace(&[]).await;
    let relay = &setup.relay;
    let (a, _) = relay.client("device-a").await;
    let root = setup.root("dev");
    mkdir(&a, &root.join("w")).await;
    let before = relay.metric("ahp_relay_resource_watches").await;
    let created = call(
        &a,
        "createResourceWatch",
        json!({"uri": uri(&root), "recursive": true, "excludes": {"items": ["*.log"]}}),
    )
    .await
    .expect("watch");
    let channel = created["channel"].as_str().expect("channel").to_string();
    assert!(channel.starts_with("ahp-resource-watch:/"), "{channel}");
    assert_eq!(
        metric_becomes(relay, "ahp_relay_resource_watches", before + 1.0).await,
        before + 1.0
    );
    let (subscribed, mut changes) = a.subscribe(channel.clone()).await.expect("subscribe");
    let state = serde_json::to_value(subscribed.snapshot.expect("snapshot").state).expect("state");
    assert_eq!(state["root"], uri(&root));
    assert_eq!(state["recursive"], true);

    // It is this connection's: another (same tenant) cannot subscribe to it.
    let (b, _) = relay.client("device-b").await;
    assert_eq!(
        code(b.subscribe(channel.clone()).await.map(|(result, _)| result)).0,
        -32008
    );

    // A client's writes: the excluded one is not reported.
    call(
        &a,
        "resourceWrite",
        json!({"uri": uri(&root.join("w/skip.log")), "data": "x", "encoding": "utf-8"}),
    )
    .await
    .expect("write log");
    call(
        &a,
        "resourceWrite",
        json!({"uri": uri(&root.join("w/seen.txt")), "data": "x", "encoding": "utf-8"}),
    )
    .await
    .expect("write txt");
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|(u, _): &(String, String)| u.ends_with("/w/seen.txt"))
    {
        seen.extend(next_changes(&mut changes).await);
    }
    assert!(
        !seen
            .iter()
            .any(|(u, _)| u.ends_with(".log") || u.contains(".ahp-")),
        "excluded and temporary files are not reported: {seen:?}"
    );
    assert!(
        seen.iter()
            .any(|(u, t)| u == &uri(&root.join("w/seen.txt")) && (t == "added" || t == "updated")),
        "{seen:?}"
    );

    // The agent's writes (a shell it runs in its session's directory, under the tenant's root).
    let session = "ahp-session:/watched";
    let _: Value = a
        .request(
            "createSession",
            json!({"channel": session, "provider": "scripted"}),
        )
        .await
        .expect("createSession");
    let (opened, mut session_sub) = a.subscribe(session.to_string()).await.expect("subscribe session");
    let state = serde_json::to_value(opened.snapshot.expect("snapshot").state).expect("state");
    let chat = state["defaultChat"].as_str().expect("default chat").to_string();
    if state["lifecycle"] != "ready" {
        while !matches!(
            next_envelope(&mut session_sub).await.action,
            ahp_types::actions::StateAction::SessionReady(_)
        ) {}
    }
    a.dispatch(chat, turn_started("t1", "sh: echo hi > agent-wrote.txt"))
        .await
        .expect("prompt");
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|(u, _): &(String, String)| u.ends_with("/agent-wrote.txt"))
    {
        seen.extend(next_changes(&mut changes).await);
    }

    // Released on unsubscribe.
    a.unsubscribe(channel.clone()).await.expect("unsubscribe");
    assert_eq!(
        metric_becomes(relay, "ahp_relay_resource_watches", before).await,
        before
    );

    // Released when its connection goes; at most 16 per connection.
    let (c, _) = relay.client("device-c").await;
    for _ in 0..16 {
        call(&c, "createResourceWatch", json!({"uri": uri(&root.join("w"))}))
            .await
            .expect("watch");
    }
    assert_eq!(
        code(call(&c, "createResourceWatch", json!({"uri": uri(&root.join("w"))})).await).0,
        -32602
    );
    assert_eq!(
        metric_becomes(relay, "ahp_relay_resource_watches", before + 16.0).await,
        before + 16.0
    );
    drop(c);
    assert_eq!(
        metric_becomes(relay, "ahp_relay_resource_watches", before).await,
        before
    );

    // Outside the root, or missing: refused.
    assert_eq!(
        code(call(&b, "createResourceWatch", json!({"uri": "file:///etc"})).await).0,
        -32009
    );
    assert_eq!(
        code(
            call(
                &b,
                "createResourceWatch",
                json!({"uri": uri(&root.join("missing"))})
            )
            .await
        )
        .0,
        -32008
    );
}

/// Issue 26 (5, files): through a gateway to a shard, files and watches are served by a separate runner process
/// (the one holding the workspace, in a sandbox of the tenant there); a runner killed with SIGKILL leaves resource
/// commands answered with a clear error, and a new runner serves them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_gateway_files_are_served_by_the_runner_and_its_death_is_a_clear_error() {
    let agents = scripted_agents_file();
    let (workspace, file) = (&agents.workspace, &agents.file);
    let shard = Shard::start(&["--agents", &file.display().to_string()]).await;
    let gateway = Relay::gateway(&shard.url).await;
    let root = workspace.path().join("dev");

    // No runner yet: said so.
    let (a, _) = gateway.client("device-a").await;
    let (refused, message) = code(call(&a, "resourceMkdir", json!({"uri": uri(&root.join("x"))})).await);
    assert_eq!(refused, -32603);
    assert!(message.contains("runner"), "{message}");

    let mut runner = start_runner(&shard, file, 1.0).await;
    let (b, init) = gateway.client("device-b").await;
    assert_eq!(init.default_directory.as_deref(), Some(uri(&root).as_str()));
    mkdir(&b, &root.join("remote")).await;
    let created = call(
        &b,
        "createResourceWatch",
        json!({"uri": uri(&root.join("remote"))}),
    )
    .await
    .expect("watch");
    let channel = created["channel"].as_str().expect("channel").to_string();
    let (_, mut changes) = b.subscribe(channel.clone()).await.expect("subscribe");
    let notes = root.join("remote/notes.txt");
    call(
        &b,
        "resourceWrite",
        json!({"uri": uri(&notes), "data": "from afar", "encoding": "utf-8"}),
    )
    .await
    .expect("write");
    assert_eq!(std::fs::read_to_string(&notes).expect("on disk"), "from afar");
    let read = call(&b, "resourceRead", json!({"uri": uri(&notes)}))
        .await
        .expect("read");
    assert_eq!(read["data"], "from afar");
    let mut seen = Vec::new();
    while !seen.iter().any(|(u, _): &(String, String)| u == &uri(&notes)) {
        seen.extend(next_changes(&mut changes).await);
    }
    assert_eq!(
        code(call(&b, "resourceRead", json!({"uri": "file:///etc/passwd"})).await).0,
        -32009
    );
    if rustix_is_root() {
        assert_ne!(
            std::fs::metadata(&notes).expect("meta").uid(),
            0,
            "written in the tenant's sandbox"
        );
    }

    // SIGKILL the runner: a clear error, not a hang.
    runner.start_kill().expect("kill the runner");
    runner.wait().await.expect("reaped");
    wait_for_runners(&shard, 0.0).await;
    let (gone, message) = code(call(&b, "resourceRead", json!({"uri": uri(&notes)})).await);
    assert_eq!(gone, -32603);
    assert!(message.contains("runner"), "{message}");

    // Another runner serves the same workspace.
    let _runner = start_runner(&shard, file, 1.0).await;
    let read = call(&b, "resourceRead", json!({"uri": uri(&notes)}))
        .await
        .expect("read again");
    assert_eq!(read["data"], "from afar");
}

/// The tenant's file server processes running for `workspace` (their command line names it).
fn file_servers(workspace: &Path) -> Vec<u32> {
    let needle = workspace.display().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            // The server itself, not the sandbox launcher around it.
            cmdline.contains(" sandbox-files ") && cmdline.contains(&needle) && !cmdline.contains("bwrap")
        })
        .collect()
}

/// A tenant's file server stops once idle (nothing under way, no watch open) and the next request starts
/// another; an open watch keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_file_server_stops_and_the_next_request_starts_another() {
    let setup = relay_with_workspace(&["--file-server-idle", "1s"]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let root = setup.root("dev");
    mkdir(&a, &root.join("idle")).await;
    assert!(
        !file_servers(setup.workspace.path()).is_empty(),
        "a file server runs"
    );
    let stopped = tokio::time::timeout(PATIENCE, async {
        while !file_servers(setup.workspace.path()).is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(stopped.is_ok(), "the idle file server stopped");
    // The next request starts another.
    let listed = call(&a, "resourceList", json!({"uri": uri(&root)}))
        .await
        .expect("list");
    assert_eq!(listed["entries"][0]["name"], "idle");
    // A watch keeps it: three idle periods later it still runs.
    call(&a, "createResourceWatch", json!({"uri": uri(&root)}))
        .await
        .expect("watch");
    let running = file_servers(setup.workspace.path());
    assert!(!running.is_empty());
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        file_servers(setup.workspace.path()),
        running,
        "a server with an open watch keeps running"
    );
}

/// Issue 26 (6): `@` completes the session's files (fuzzy, bounded, from the workspace), anywhere in a
/// message; `initialize` advertises `@` beside `/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_completes_the_sessions_files() {
    let setup = relay_with_workspace(&[]).await;
    let (a, init) = setup.relay.client("device-a").await;
    assert_eq!(
        init.completion_trigger_characters,
        Some(vec!["/".to_string(), "@".to_string()])
    );
    let dir = setup.root("dev").join("mentions");
    for (path, text) in [
        ("src/main.rs", "fn main() {}\n"),
        ("src/lib.rs", ""),
        ("README.md", "# x\n"),
    ] {
        let path = dir.join(path);
        mkdir(&a, path.parent().expect("parent")).await;
        call(
            &a,
            "resourceWrite",
            json!({"uri": uri(&path), "data": text, "encoding": "utf-8"}),
        )
        .await
        .expect("write");
    }
    let session = "ahp-session:/mentions";
    let _: Value = a
        .request(
            "createSession",
            json!({"channel": session, "provider": "scripted", "workingDirectories": [uri(&dir)]}),
        )
        .await
        .expect("createSession");
    let chat = "ahp-chat:/mentions";
    let complete = |text: &'static str| {
        let a = &a;
        async move {
            let offset = text.encode_utf16().count();
            let result: ahp_types::commands::CompletionsResult = a
                .request(
                    "completions",
                    json!({"channel": chat, "kind": "userMessage", "text": text, "offset": offset}),
                )
                .await
                .expect("completions");
            result
        }
    };
    let result = complete("look at @smain").await;
    let first = result.items.first().expect("a file");
    assert_eq!(first.insert_text, "@src/main.rs ");
    assert_eq!((first.range_start, first.range_end), (Some(8), Some(14)));
    let ahp_types::state::MessageAttachment::Resource(attachment) = &first.attachment else {
        panic!("{:?}", first.attachment);
    };
    assert_eq!(attachment.uri, uri(&dir.join("src/main.rs")));
    assert_eq!(complete("@read").await.items[0].insert_text, "@README.md ");
    assert!(complete("@zzzz").await.items.is_empty());
    // Not an @ word: nothing of the files.
    assert!(complete("mail me@x").await.items.is_empty());
}

/// Issue 26 (1): a watch with `includes` reports only the paths its globs name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_with_includes_reports_only_what_they_name() {
    let setup = relay_with_workspace(&[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let dir = setup.root("dev").join("only-md");
    mkdir(&a, &dir).await;
    let created = call(
        &a,
        "createResourceWatch",
        json!({"uri": uri(&dir), "includes": {"items": ["*.md"]}}),
    )
    .await
    .expect("watch");
    let channel = created["channel"].as_str().expect("channel").to_string();
    let (_, mut changes) = a.subscribe(channel).await.expect("subscribe");
    // The one not included is written first: had it been reported, it would come first.
    for name in ["notes.txt", "notes.md"] {
        call(
            &a,
            "resourceWrite",
            json!({"uri": uri(&dir.join(name)), "data": "x", "encoding": "utf-8"}),
        )
        .await
        .expect("write");
    }
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|(u, _): &(String, String)| u.ends_with("/notes.md"))
    {
        seen.extend(next_changes(&mut changes).await);
    }
    assert!(!seen.iter().any(|(u, _)| u.ends_with("/notes.txt")), "{seen:?}");
}

/// Issue 26 (1): a truncating write replaces the file whole (a temp file renamed over it: a reader never sees
/// half of it; the inode changes), a burst of writes is coalesced into few reports, and a tenant holds at most
/// 64 watches however many connections it spreads them over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_replace_files_whole_reports_are_coalesced_and_a_tenants_watches_are_bounded() {
    let setup = relay_with_workspace(&[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let dir = setup.root("dev").join("burst");
    mkdir(&a, &dir).await;
    let file = dir.join("f.txt");
    let write = |text: &'static str| {
        let (a, file) = (&a, file.clone());
        async move {
            call(
                a,
                "resourceWrite",
                json!({"uri": uri(&file), "data": text, "encoding": "utf-8"}),
            )
            .await
            .expect("write");
        }
    };
    write("first").await;
    let before = std::fs::metadata(&file).expect("meta").ino();
    write("second").await;
    assert_ne!(
        std::fs::metadata(&file).expect("meta").ino(),
        before,
        "renamed into place, not rewritten"
    );

    let created = call(&a, "createResourceWatch", json!({"uri": uri(&dir)}))
        .await
        .expect("watch");
    let (_, mut changes) = a
        .subscribe(created["channel"].as_str().expect("channel").to_string())
        .await
        .expect("subscribe");
    for i in 0..20 {
        call(
            &a,
            "resourceWrite",
            json!({"uri": uri(&dir.join(format!("n{i}.txt"))), "data": "x", "encoding": "utf-8"}),
        )
        .await
        .expect("write");
    }
    let mut reports = 0;
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|(u, _): &(String, String)| u.ends_with("/n19.txt"))
    {
        seen.extend(next_changes(&mut changes).await);
        reports += 1;
    }
    assert!(reports < 10, "20 writes in a burst came as {reports} reports");

    // 16 per connection: five connections try 80, the tenant keeps 64 (this one already holds one).
    let mut held = 1;
    let mut refused = 0;
    let mut clients = Vec::new();
    for n in 0..5 {
        let (client, _) = setup.relay.client(&format!("device-w{n}")).await;
        for _ in 0..16 {
            match call(&client, "createResourceWatch", json!({"uri": uri(&dir)})).await {
                Ok(_) => held += 1,
                Err(_) => refused += 1,
            }
        }
        clients.push(client);
    }
    assert_eq!((held, refused), (64, 17), "held {held}, refused {refused}");
}

async fn read_as(client: &ahp::Client, path: PathBuf) -> Result<Value, ClientError> {
    client
        .request::<_, Value>(
            "resourceRead",
            json!({"channel": "ahp-root://", "uri": uri(&path), "encoding": "utf-8"}),
        )
        .await
}

/// Issue 32 (acceptance 4): a token scoped to host `team1` reaches team1's session directories only: reading,
/// listing, watching and writing in team2's session directory, or in a directory of the tenant that is no
/// host's, are refused with -32009 (also through a link planted in team1's directory to team2's); opening a
/// terminal or creating a session there too. A token of the whole tenant reaches both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_scoped_to_a_host_reaches_that_hosts_directories_only() {
    let agents = scripted_agents_file();
    let relay = Relay::start_with(&["--agents", agents.file.to_str().expect("path")]).await;
    let root = agents.workspace.path().canonicalize().expect("root").join("dev");
    let (team1_dir, team2_dir) = (root.join("team1/s1"), root.join("team2/s2"));
    for dir in [&team1_dir, &team2_dir, &root.join("project")] {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    std::fs::write(team1_dir.join("ours.txt"), "ours").expect("write");
    std::fs::write(team2_dir.join("theirs.txt"), "theirs").expect("write");
    std::fs::write(root.join("project/shared.txt"), "shared").expect("write");
    std::os::unix::fs::symlink(&team2_dir, team1_dir.join("link")).expect("link");
    let scoped_token = mint_hs256(
        SECRET.as_bytes(),
        &Claims::new(
            "dev",
            "scoped",
            Role::Member,
            Some(vec!["team1".into()]),
            Duration::from_secs(3600),
        ),
    )
    .expect("mint");
    let url = format!(
        "{}/v1/hosts/team1/ws?access_token={scoped_token}",
        relay.url().trim_end_matches("/v1/ws")
    );
    let transport = ahp_ws::WebSocketTransport::connect(&url).await.expect("connect");
    let scoped = ahp::Client::connect(
        transport,
        ahp::ClientConfig {
            default_request_timeout: Some(PATIENCE),
            subscription_buffer: 1024,
        },
    )
    .await
    .expect("client");
    scoped
        .initialize("scoped-device".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    let ours = read_as(&scoped, team1_dir.join("ours.txt"))
        .await
        .expect("its own host's file");
    assert_eq!(ours["data"], "ours");
    let code = |result: Result<Value, ahp::ClientError>| match result {
        Err(ahp::ClientError::Rpc(error)) => error.code,
        other => panic!("expected an error: {other:?}"),
    };
    for path in [
        team2_dir.join("theirs.txt"),
        root.join("project/shared.txt"),
        team1_dir.join("link/theirs.txt"),
    ] {
        assert_eq!(
            code(read_as(&scoped, path.clone()).await),
            -32009,
            "{}",
            path.display()
        );
    }
    for (method, params) in [
        (
            "resourceList",
            json!({"channel": "ahp-root://", "uri": uri(&team2_dir)}),
        ),
        (
            "resourceWrite",
            json!({"channel": "ahp-root://", "uri": uri(&team2_dir.join("planted.txt")), "data": "x", "encoding": "utf-8"}),
        ),
        (
            "resourceMove",
            json!({"channel": "ahp-root://", "source": uri(&team1_dir.join("ours.txt")), "destination": uri(&team2_dir.join("moved.txt"))}),
        ),
        (
            "createResourceWatch",
            json!({"channel": "ahp-root://", "uri": uri(&team2_dir), "recursive": true}),
        ),
        (
            "sessionConfigCompletions",
            json!({"channel": "ahp-root://", "provider": "scripted", "property": "branch",
                "workingDirectory": uri(&team2_dir), "query": ""}),
        ),
        (
            "resolveSessionConfig",
            json!({"channel": "ahp-root://", "provider": "scripted", "workingDirectory": uri(&team2_dir)}),
        ),
        (
            "createSession",
            json!({"channel": "ahp-session:/in-team2", "provider": "scripted", "workingDirectories": [uri(&team2_dir)]}),
        ),
    ] {
        let refused = scoped.request::<_, Value>(method, params).await;
        assert_eq!(code(refused), -32009, "{method}");
    }
    assert!(!team2_dir.join("planted.txt").exists() && !team2_dir.join("moved.txt").exists());
    // A terminal of a team1 session whose directory would be team2's.
    let (session, _) = ready_session(&scoped, "scripted", "scoped-session", json!({}))
        .await
        .expect("a session of its own host");
    let terminal = scoped
        .request::<_, Value>(
            "createTerminal",
            json!({"channel": "ahp-terminal:/scoped", "claim": {"kind": "client", "clientId": "scoped-device"},
                "cwd": uri(&team2_dir), "_meta": {"ahpRelay/session": session}}),
        )
        .await;
    assert_eq!(code(terminal), -32009);
    // A token of the whole tenant reaches both.
    let (whole, _) = relay.client("whole-tenant").await;
    assert_eq!(
        read_as(&whole, team2_dir.join("theirs.txt"))
            .await
            .expect("theirs")["data"],
        "theirs"
    );
}

/// A ready session `name` of the scripted agent (whose `sh:` prompts run in its directory): its chat.
async fn scripted_session(client: &ahp::Client, name: &str) -> String {
    let (_, state) = ready_session(client, "scripted", name, json!({}))
        .await
        .expect("ready");
    state.default_chat.clone().expect("default chat")
}

/// Issue 33 (6): a watch tells the truth about files that are replaced, not edited. A non-recursive watch on
/// one file (what an editor holds for an open file) sees 20 writes — the agent's `>` (in place), the agent's
/// save through a temporary file and `mv`, and `resourceWrite` (which replaces the file) — each as `updated`,
/// never `deleted`; a directory watch reports overwriting a file as `updated`, and a move as the source
/// `deleted` and the destination `added`. `root` is tenant dev's directory, `chat` a session's whose directory
/// is `dir`.
async fn a_watch_sees_replaced_files_as_updated(client: &ahp::Client, chat: &str, dir: &Path) {
    let file = dir.join("open.txt");
    call(
        client,
        "resourceWrite",
        json!({"uri": uri(&file), "data": "0", "encoding": "utf-8"}),
    )
    .await
    .expect("write");
    let watch = |path: &Path| {
        let target = uri(path);
        async move {
            let created = call(client, "createResourceWatch", json!({"uri": target}))
                .await
                .expect("watch");
            let channel = created["channel"].as_str().expect("channel").to_string();
            client.subscribe(channel).await.expect("subscribe").1
        }
    };
    let mut on_file = watch(&file).await;
    // A turn is dispatched only once the one before it completed (a chat takes one turn at a time, and refuses
    // another meanwhile): the agent's turn ends a little after its write is seen.
    let (_, _, mut on_chat) = subscribe_chat(client, chat).await;
    let mut turn = 0;
    for write in 1..=20 {
        match write % 3 {
            0 => {
                call(
                    client,
                    "resourceWrite",
                    json!({"uri": uri(&file), "data": format!("{write}"), "encoding": "utf-8"}),
                )
                .await
                .expect("write");
            }
            how => {
                turn += 1;
                let command = if how == 1 {
                    format!("sh: echo {write} > open.txt")
                } else {
                    format!("sh: echo {write} > .open.swp && mv .open.swp open.txt")
                };
                client
                    .dispatch(chat.to_string(), turn_started(&format!("w{turn}"), &command))
                    .await
                    .expect("prompt");
            }
        }
        // Reports until one comes after this write (the agent's runs after its prompt is accepted): the next
        // write waits for it, so every write is seen.
        loop {
            let changes = next_changes(&mut on_file).await;
            assert!(
                !changes.is_empty()
                    && changes
                        .iter()
                        .all(|(u, kind)| u == &uri(&file) && kind == "updated"),
                "write {write}: {changes:?}"
            );
            let now = std::fs::read_to_string(&file).unwrap_or_default();
            if now.trim() == write.to_string() {
                break;
            }
        }
        if write % 3 != 0 {
            collect_until(&mut on_chat, is_turn_complete).await;
        }
    }
    // A directory watch: an overwrite is an update; a move is the source gone and the destination new.
    let mut on_dir = watch(dir).await;
    call(
        client,
        "resourceWrite",
        json!({"uri": uri(&file), "data": "again", "encoding": "utf-8"}),
    )
    .await
    .expect("write");
    let changes = next_changes(&mut on_dir).await;
    assert_eq!(changes, vec![(uri(&file), "updated".to_string())]);
    let moved = dir.join("moved.txt");
    call(
        client,
        "resourceMove",
        json!({"source": uri(&file), "destination": uri(&moved)}),
    )
    .await
    .expect("move");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.extend(next_changes(&mut on_dir).await);
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (uri(&moved), "added".to_string()),
            (uri(&file), "deleted".to_string())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_serve_a_watch_sees_replaced_files_as_updated() {
    let setup = relay_with_workspace(&[]).await;
    let (a, _) = setup.relay.client("device-a").await;
    let chat = scripted_session(&a, "editing").await;
    a_watch_sees_replaced_files_as_updated(&a, &chat, &setup.root("dev").join("default/editing")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_runner_a_watch_sees_replaced_files_as_updated() {
    let agents = scripted_agents_file();
    let shard = Shard::start(&["--agents", &agents.file.display().to_string()]).await;
    let gateway = Relay::gateway(&shard.url).await;
    let _runner = start_runner(&shard, &agents.file, 1.0).await;
    let (a, _) = gateway.client("device-a").await;
    let chat = scripted_session(&a, "editing").await;
    let dir = agents.workspace.path().join("dev/default/editing");
    a_watch_sees_replaced_files_as_updated(&a, &chat, &dir).await;
}

/// Issue 33 (8): a `data:` URI (what a file edit's small side is) is read like any content reference — with or
/// without a workspace — text as UTF-8, bytes as base64; one that cannot be decoded is a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_uri_is_read_like_any_content_reference() {
    let relay = Relay::start().await;
    let (a, _) = relay.client("device-a").await;
    let read = call(
        &a,
        "resourceRead",
        json!({"uri": "data:text/plain;charset=utf-8;base64,aGkgdGhlcmU="}),
    )
    .await
    .expect("read");
    assert_eq!(
        (read["data"].as_str(), read["encoding"].as_str()),
        (Some("hi there"), Some("utf-8"))
    );
    let read = call(&a, "resourceRead", json!({"uri": "data:,a%20b"}))
        .await
        .expect("read");
    assert_eq!(read["data"], "a b");
    let read = call(
        &a,
        "resourceRead",
        json!({"uri": "data:application/octet-stream;base64,AAEC"}),
    )
    .await
    .expect("read");
    assert_eq!(
        (read["data"].as_str(), read["encoding"].as_str()),
        (Some("AAEC"), Some("base64"))
    );
    assert_eq!(
        code(call(&a, "resourceRead", json!({"uri": "data:text/plain;base64,@@@"})).await).0,
        -32602
    );
}

/// Issue 33 (9): a resource watch is its connection's alone on every way in — not only `subscribe`, but
/// `initialize`'s `initialSubscriptions` and `reconnect` too; and `resourceRequest` of `<root>/../other` is not
/// inside the workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_is_its_connections_alone_on_every_way_in_and_dot_dot_is_outside() {
    let setup = relay_with_workspace(&[]).await;
    let relay = &setup.relay;
    let (a, _) = relay.client("device-a").await;
    let root = setup.root("dev");
    mkdir(&a, &root.join("w")).await;
    let created = call(&a, "createResourceWatch", json!({"uri": uri(&root.join("w"))}))
        .await
        .expect("watch");
    let channel = created["channel"].as_str().expect("channel").to_string();
    // Another device of the same tenant names it at initialize: no snapshot of it.
    let b = relay.connect("dev", "dev", Role::Member).await;
    let init = b
        .initialize("device-b".into(), vec!["1.0.0".into()], vec![channel.clone()])
        .await
        .expect("initialize");
    assert!(init.snapshots.is_empty(), "{:?}", init.snapshots);
    // Or at reconnect: missing, not replayed.
    let c = relay.connect("dev", "dev", Role::Member).await;
    match c
        .reconnect("device-c".into(), 0, vec![channel.clone()])
        .await
        .expect("reconnect")
    {
        ahp_types::commands::ReconnectResult::Replay(replay) => {
            assert!(replay.missing.contains(&channel), "{:?}", replay.missing);
            assert!(replay.actions.is_empty());
        }
        ahp_types::commands::ReconnectResult::Snapshot(snapshots) => {
            assert!(snapshots.snapshots.is_empty(), "{:?}", snapshots.snapshots);
        }
    }
    let outside = format!("file://{}/../other", root.display());
    let (refused, _) = code(call(&a, "resourceRequest", json!({"uri": outside})).await);
    assert_eq!(refused, -32009);
}

/// Issue 33 (14): a watch outlives its file server. Killed (SIGKILL), the tenant's server is started again by
/// the next request, and the watch is made again there: it says its root changed (what changed meanwhile is
/// not known) and reports what changes after, instead of going silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_outlives_its_file_server() {
    let setup = relay_with_workspace(&[]).await;
    let relay = &setup.relay;
    let (a, _) = relay.client("device-a").await;
    let root = setup.root("dev");
    let dir = root.join("w");
    mkdir(&a, &dir).await;
    let created = call(&a, "createResourceWatch", json!({"uri": uri(&dir)}))
        .await
        .expect("watch");
    let channel = created["channel"].as_str().expect("channel").to_string();
    let (_, mut changes) = a.subscribe(channel).await.expect("subscribe");
    let servers = file_servers(setup.workspace.path());
    assert!(!servers.is_empty(), "the tenant's file server runs");
    for pid in &servers {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    // The next write starts a server again; the watch, made again, reports.
    let after = dir.join("after-kill.txt");
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut attempt = 0;
    while !seen.iter().any(|(u, _): &(String, String)| u == &uri(&after)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch went silent: {seen:?}"
        );
        attempt += 1;
        let _ = call(
            &a,
            "resourceWrite",
            json!({"uri": uri(&after), "data": format!("{attempt}"), "encoding": "utf-8"}),
        )
        .await;
        if let Ok(more) = tokio::time::timeout(Duration::from_millis(500), next_changes(&mut changes)).await {
            seen.extend(more);
        }
    }
    assert!(
        seen.iter().any(|(u, kind)| u == &uri(&dir) && kind == "updated"),
        "the root is said to have changed: {seen:?}"
    );
}

/// Issue 33 (12): a tenant's file server runs operations side by side and cancels what the runner stops waiting
/// for. Driven as the runner drives it, over the stdin and stdout of `ahp-relay sandbox-files ROOT MAX`: while a
/// checkpoint of 200 MB of incompressible files runs (seconds of git) and more git waits behind it, a read is
/// answered; told to cancel the checkpoint, the server kills its git and answers it "cancelled".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_checkpoint_holds_up_no_read_and_a_cancel_stops_its_git() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let root = tempfile::tempdir().expect("root");
    let home = tempfile::tempdir().expect("home");
    let project = root.path().canonicalize().expect("real").join("project");
    std::fs::create_dir_all(&project).expect("project");
    for n in 0..4 {
        let mut random = std::fs::File::open("/dev/urandom").expect("urandom");
        let mut file = std::fs::File::create(project.join(format!("blob{n}.bin"))).expect("blob");
        std::io::copy(&mut std::io::Read::take(&mut random, 50_000_000), &mut file).expect("fill");
    }
    std::fs::write(project.join("small.txt"), "still answered\n").expect("small");
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
        .arg("sandbox-files")
        .arg(root.path())
        .arg((64 * 1024 * 1024).to_string())
        .env("HOME", home.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("file server");
    let mut input = server.stdin.take().expect("stdin");
    let mut output = tokio::io::BufReader::new(server.stdout.take().expect("stdout")).lines();
    let send = |line: Value| {
        let mut bytes = serde_json::to_vec(&line).expect("json");
        bytes.push(b'\n');
        bytes
    };
    let checkpoint = send(json!({"id": 1, "op": "checkpoint", "workspace": project, "label": "big"}));
    input.write_all(&checkpoint).await.expect("send");
    // Its git runs (found by the private directory its command line names).
    let home_path = home.path().display().to_string();
    let gits = || {
        std::fs::read_dir("/proc")
            .expect("proc")
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                    let cmdline = String::from_utf8_lossy(&cmdline);
                    cmdline.starts_with("git\0")
                        && cmdline.contains(&home_path)
                        && cmdline.contains("\0add\0")
                })
            })
            .collect::<Vec<u32>>()
    };
    let deadline = std::time::Instant::now() + PATIENCE;
    let adding = loop {
        let found = gits();
        if !found.is_empty() {
            break found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the checkpoint's git never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // More git behind it (a client loading a changeset's diffs) waits for it, on git's own thread ...
    for id in 10..16 {
        let changes = send(json!({"id": id, "op": "changes", "from": "0".repeat(40), "to": "1".repeat(40)}));
        input.write_all(&changes).await.expect("send");
    }
    // ... and a read does not.
    let read = send(json!({"id": 2, "op": "read", "path": project.join("small.txt")}));
    input.write_all(&read).await.expect("send");
    let first = next_answer(&mut output).await;
    assert_eq!(first["id"], 2, "the read is answered first: {first}");
    assert!(first["result"]["Ok"].is_object(), "{first}");
    assert!(
        adding
            .iter()
            .all(|pid| Path::new(&format!("/proc/{pid}")).exists()),
        "the read was answered while the checkpoint's git ran"
    );
    let cancel = send(json!({"cancel": 1}));
    input.write_all(&cancel).await.expect("send");
    let second = next_answer(&mut output).await;
    assert_eq!(second["id"], 1, "{second}");
    assert!(
        second["result"]["Err"].to_string().contains("cancelled"),
        "the checkpoint was cancelled: {second}"
    );
    assert!(
        adding
            .iter()
            .all(|pid| !Path::new(&format!("/proc/{pid}")).exists()),
        "its git was killed"
    );
}

/// The next line a file server wrote, as JSON.
async fn next_answer(
    output: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) -> Value {
    let line = tokio::time::timeout(PATIENCE, output.next_line())
        .await
        .expect("an answer in time")
        .expect("read")
        .expect("a line");
    serde_json::from_str(&line).expect("json")
}
