//! Tenant isolation, the whole matrix (design invariant 7): a valid token of tenant B aimed at tenant A's
//! sessions, chats and clientIds — with every client command and every client-dispatchable action type, and
//! with crafted URIs and host names — gets exactly the answer a target that never existed gets, and tenant
//! A's state and stored rows are byte for byte what they were.

mod support;

use relay_core::Role;
use serde_json::{json, Value};
use support::raw::{raw_as, recv, send, Socket};
use support::*;

/// Every row the store keeps for `tenant`, table by table, as text (leases are left out: their expiry is
/// renewed by the clock, not by clients).
async fn stored_rows(data_dir: &std::path::Path, tenant: &str) -> String {
    use sqlx::{Column, Row};
    let url = format!("sqlite://{}?mode=ro", data_dir.join("relay.sqlite").display());
    let mut db = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url)
        .await
        .expect("open the store");
    let mut out = String::new();
    for table in ["hosts", "log", "snapshots", "catalog", "client_bindings"] {
        let rows = sqlx::query(&format!(
            "SELECT * FROM {table} WHERE tenant = ? ORDER BY 1, 2, 3"
        ))
        .bind(tenant)
        .fetch_all(&mut db)
        .await
        .expect("read rows");
        for row in rows {
            out.push_str(table);
            // The observer's own binding records each of its uses: when it read, not what B did.
            let observers = table == "client_bindings"
                && row
                    .try_get::<Option<String>, _>("client_id")
                    .ok()
                    .flatten()
                    .as_deref()
                    == Some("auditor");
            for (i, column) in row.columns().iter().enumerate() {
                if observers && column.name() == "last_used_ms" {
                    continue;
                }
                let value = row
                    .try_get::<Option<String>, _>(i)
                    .map(|v| format!("{v:?}"))
                    .or_else(|_| row.try_get::<Option<i64>, _>(i).map(|v| format!("{v:?}")))
                    .or_else(|_| row.try_get::<Option<Vec<u8>>, _>(i).map(|v| format!("{v:?}")))
                    .unwrap_or_else(|e| panic!("column {}: {e}", column.name()));
                out.push_str(&format!(" {}={value}", column.name()));
            }
            out.push('\n');
        }
    }
    out
}

/// What tenant A has: its session and chat as a fresh subscriber sees them, and its stored rows.
async fn tenant_a_state(relay: &Relay, data_dir: &std::path::Path, session: &str, chat: &str) -> String {
    let (observer, _) = relay.client_as("a", "auditor", Role::Admin, "auditor").await;
    let (session_snapshot, _) = observer.subscribe(session.to_string()).await.expect("session");
    let (chat_snapshot, _) = observer.subscribe(chat.to_string()).await.expect("chat");
    let list: Value = observer
        .request("listSessions", json!({"channel": "ahp-root://"}))
        .await
        .expect("list");
    observer.shutdown().await;
    format!(
        "{}\n{}\n{}\n{}",
        json(&session_snapshot.snapshot.expect("snapshot").state),
        json(&chat_snapshot.snapshot.expect("snapshot").state),
        list,
        stored_rows(data_dir, "a").await
    )
}

/// Send `request` (its `id` set here) and then a ping; every frame up to the ping's answer, with the
/// request's id, `target` and `serverSeq`s made neutral, so answers about different targets compare.
async fn exchange(socket: &mut Socket, id: u64, mut request: Value, target: &str) -> Vec<String> {
    request["jsonrpc"] = "2.0".into();
    request["id"] = id.into();
    send(socket, request.to_string()).await;
    send(
        socket,
        json!({"jsonrpc": "2.0", "id": id + 1, "method": "ping"}).to_string(),
    )
    .await;
    let mut frames = Vec::new();
    loop {
        let mut frame = recv(socket).await;
        if frame["id"] == json!(id + 1) && frame.get("result").is_some() {
            return frames;
        }
        neutralize(&mut frame);
        let text = frame.to_string().replace(target, "<target>");
        // Parse errors name a column, which depends on the target's length, not on whose it is.
        let text = match text.find(" at line ") {
            Some(at) => format!("{}…", &text[..at]),
            None => text,
        };
        frames.push(text);
    }
}

fn neutralize(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map.iter_mut() {
                if matches!(key.as_str(), "serverSeq" | "id" | "clientSeq") {
                    *inner = Value::Null;
                } else {
                    neutralize(inner);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(neutralize),
        _ => {}
    }
}

/// The requests of every client command aimed at `target` (a session or a chat URI, per `kind`).
fn commands_aimed_at(target: &str, kind: &str, attacker_client: &str) -> Vec<Value> {
    let mut commands = vec![
        json!({"method": "subscribe", "params": {"channel": target}}),
        json!({"method": "unsubscribe", "params": {"channel": target}}),
        json!({"method": "completions", "params": {"channel": target, "kind": "userMessage", "text": "/", "offset": 1}}),
        json!({"method": "fetchTurns", "params": {"channel": target}}),
        json!({"method": "authenticate", "params": {"channel": "ahp-root://", "resource": target, "token": "t"}}),
    ];
    if kind == "session" {
        commands.extend([
            json!({"method": "createChat", "params": {"channel": target, "chat": "ahp-chat:/intruder"}}),
            json!({"method": "resolveSessionConfig", "params": {"channel": target, "provider": "demo"}}),
            json!({"method": "disposeSession", "params": {"channel": target}}),
            // Last: in B's own namespace the URI is free, so this creates B's session (for both targets).
            json!({"method": "createSession", "params": {"channel": target, "provider": "demo"}}),
            json!({"method": "disposeSession", "params": {"channel": target}}),
        ]);
    } else {
        commands.push(json!({"method": "disposeChat", "params": {"channel": target}}));
    }
    let (session, chat) = if kind == "session" {
        (target, "ahp-chat:/unrelated")
    } else {
        ("ahp-session:/unrelated", target)
    };
    for (channel, action) in every_client_action(attacker_client, session, chat) {
        if channel == target {
            commands.push(json!({"method": "dispatchAction",
                "params": {"channel": channel, "clientSeq": 1, "action": action}}));
        }
    }
    commands
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_gets_what_a_missing_target_gets_and_changes_nothing() {
    let data = tempfile::tempdir().expect("tempdir");
    let relay = Relay::start_in(data.path(), &[]).await;
    // Tenant A: a session whose chat ran a turn, on host `default`, used by clientId `a-laptop`.
    let (alice, _) = relay.client_as("a", "alice", Role::Admin, "a-laptop").await;
    let (session, chat) = create_session_and_chat(&alice, "secret-plans").await;
    let (_, _, mut sub) = subscribe_chat(&alice, &chat).await;
    alice
        .dispatch(chat.clone(), turn_started("a-turn", "hello"))
        .await
        .expect("dispatch");
    collect_until(&mut sub, is_turn_complete).await;
    // A also has a host named `secret-host`, with a session on it.
    let mut secret_host = {
        let url = format!(
            "ws://{}/v1/hosts/secret-host/ws?access_token={}",
            relay.addr,
            relay.token("a", "alice", Role::Admin)
        );
        tokio_tungstenite::connect_async(url).await.expect("a's host").0
    };
    support::raw::initialize(&mut secret_host, "a-laptop").await;
    let create = json!({"method": "createSession", "params": {"channel": "ahp-session:/on-secret-host", "provider": "demo"}});
    let made = exchange(&mut secret_host, 50, create, "\u{0}").await;
    assert!(made[0].contains("result"), "{made:?}");
    let before = tenant_a_state(&relay, data.path(), &session, &chat).await;

    // Tenant B, admin of its own `default` host.
    let mut bob = raw_as(&relay, "b", "bob", Role::Admin).await;
    support::raw::initialize(&mut bob, "b-laptop").await;
    let never_session = "ahp-session:/never-existed";
    let never_chat = "ahp-chat:/never-existed";
    let mut id = 100;
    let mut compared = 0;
    for (kind, taken, never) in [("session", &session, never_session), ("chat", &chat, never_chat)] {
        let aimed = commands_aimed_at(taken, kind, "b-laptop");
        let missing = commands_aimed_at(never, kind, "b-laptop");
        for (at_a, at_nothing) in aimed.into_iter().zip(missing) {
            let a = exchange(&mut bob, id, at_a.clone(), taken).await;
            let n = exchange(&mut bob, id + 10, at_nothing, never).await;
            assert_eq!(a, n, "{at_a}");
            id += 20;
            compared += 1;
        }
    }
    assert!(
        compared >= 40,
        "every command and action type was tried ({compared})"
    );

    // Crafted URIs near A's (traversal, encoded slashes, look-alikes, case, 10 KB), each against the same
    // crafting of a name that never existed.
    let crafted = |name: &str, chat_name: &str| {
        vec![
            format!("ahp-session:/../{name}"),
            format!("ahp-session:/./{name}"),
            format!("ahp-session:%2F{name}"),
            format!("ahp-session:/{name}%2F"),
            format!("ahp-session://{name}"),
            format!("ahp-session:/a/../{name}"),
            format!("AHP-SESSION:/{name}"),
            format!("ahp-session:/{}", name.replacen('e', "\u{0435}", 1)),
            format!("ahp-session:/{name}\u{200b}"),
            format!("ahp-session:/{name}{}", "x".repeat(10 * 1024)),
            format!("ahp-session:/{name}/../{chat_name}"),
        ]
    };
    let name = session.trim_start_matches("ahp-session:/");
    let chat_name = chat.trim_start_matches("ahp-chat:/");
    for (target, nothing) in crafted(name, chat_name)
        .into_iter()
        .zip(crafted("never-existed", "never-existed"))
    {
        for (at_target, at_nothing) in commands_aimed_at(&target, "session", "b-laptop")
            .into_iter()
            .zip(commands_aimed_at(&nothing, "session", "b-laptop"))
            .filter(|(c, _)| {
                c["method"] != "dispatchAction" || c["params"]["action"]["type"] == "session/titleChanged"
            })
        {
            let a = exchange(&mut bob, id, at_target.clone(), &target).await;
            let n = exchange(&mut bob, id + 10, at_nothing, &nothing).await;
            assert_eq!(a, n, "{at_target}");
            id += 20;
        }
    }

    // A's clientId: B may use it on its own host (it is a different client there), exactly like a fresh one,
    // and reconnecting with it sees nothing of A's.
    let mut answers = Vec::new();
    for (client_id, taken_session, taken_chat) in [
        ("a-laptop", session.as_str(), chat.as_str()),
        ("never-used", never_session, never_chat),
    ] {
        let mut fresh = raw_as(&relay, "b", "bob", Role::Admin).await;
        let reconnect = json!({"method": "reconnect", "params": {"channel": "ahp-root://",
            "clientId": client_id, "lastSeenServerSeq": 0, "subscriptions": [taken_session, taken_chat]}});
        let answer: Vec<String> = exchange(&mut fresh, 1, reconnect, client_id)
            .await
            .into_iter()
            .map(|frame| {
                frame
                    .replace(taken_session, "<session>")
                    .replace(taken_chat, "<chat>")
            })
            .collect();
        answers.push(answer);
    }
    assert_eq!(answers[0], answers[1], "reconnect with A's clientId and channels");
    let mut first = raw_as(&relay, "b", "bob", Role::Admin).await;
    let mut second = raw_as(&relay, "b", "bob", Role::Admin).await;
    let init = |client_id: &str, subs: Vec<String>| {
        json!({"method": "initialize", "params": {"channel": "ahp-root://", "protocolVersions": ["1.0.0"],
            "clientId": client_id, "initialSubscriptions": subs}})
    };
    let neutral = |frames: Vec<String>, taken: [&str; 2]| -> Vec<String> {
        frames
            .into_iter()
            .map(|f| f.replace(taken[0], "<session>").replace(taken[1], "<chat>"))
            .collect()
    };
    let a = exchange(
        &mut first,
        1,
        init("a-laptop", vec![session.clone(), chat.clone()]),
        "a-laptop",
    )
    .await;
    let n = exchange(
        &mut second,
        1,
        init("never-used-2", vec![never_session.into(), never_chat.into()]),
        "never-used-2",
    )
    .await;
    assert_eq!(
        neutral(a, [&session, &chat]),
        neutral(n, [never_session, never_chat]),
        "initialize with A's clientId and channels"
    );

    // A's other host, by name: B reaches its own (new, empty) host of that name, exactly as for a name
    // nobody used.
    let mut by_host = Vec::new();
    for host in ["secret-host", "never-host"] {
        let url = format!(
            "ws://{}/v1/hosts/{host}/ws?access_token={}",
            relay.addr,
            relay.token("b", "bob", Role::Admin)
        );
        let (mut socket, _) = tokio_tungstenite::connect_async(url).await.expect("upgrade");
        let mut answers = exchange(
            &mut socket,
            1,
            init("b-laptop", vec!["ahp-session:/on-secret-host".into()]),
            "\u{0}",
        )
        .await;
        answers.extend(
            exchange(
                &mut socket,
                3,
                json!({"method": "listSessions", "params": {"channel": "ahp-root://"}}),
                "\u{0}",
            )
            .await,
        );
        by_host.push(answers);
    }
    assert_eq!(by_host[0], by_host[1], "A's host name and a name nobody used");

    // Crafted host names: refused at the upgrade, or B's own empty host; never A's.
    for host in [
        "..",
        "%2E%2E",
        "default%2F..",
        "d\u{0435}fault",
        &"h".repeat(10 * 1024),
    ] {
        let url = format!(
            "ws://{}/v1/hosts/{host}/ws?access_token={}",
            relay.addr,
            relay.token("b", "bob", Role::Admin)
        );
        if let Ok((mut socket, _)) = tokio_tungstenite::connect_async(&url).await {
            let answer = exchange(&mut socket, 1, init("crafted", vec![session.clone()]), &session).await;
            assert!(
                answer.iter().all(|f| !f.contains("secret-plans")),
                "{host}: {answer:?}"
            );
        }
    }

    drop((bob, first, second));
    let after = tenant_a_state(&relay, data.path(), &session, &chat).await;
    assert_eq!(before, after, "tenant A's state and stored rows changed");
}
