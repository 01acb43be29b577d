//! Idle hosts are evicted from memory: once evicted, nothing keeps a host alive.

use std::sync::Arc;
use std::time::Duration;

use relay_core::link::HostLink;
use relay_core::rpc::read_frame;
use relay_core::{ConnectionId, HostKey, Identity, Limits, Role};
use relay_runner::{DemoPace, DemoProvider, ProviderRegistry};
use relay_shard::ShardLink;
use relay_store::Store;

/// A shard on a SQLite store in `dir` with the demo agent and a short active-client grace, its host `t/h`, and
/// a member of tenant `t`.
async fn demo_link(dir: &std::path::Path) -> (Arc<ShardLink>, HostKey, Identity) {
    let store = Store::connect(&format!("sqlite://{}", dir.join("t.sqlite").display()))
        .await
        .expect("store");
    store.migrate().await.expect("migrate");
    let providers = ProviderRegistry::new().with(Arc::new(DemoProvider::new(DemoPace {
        step: Duration::from_millis(1),
    })));
    let limits = Limits {
        active_client_grace: Duration::from_millis(10),
        ..Limits::default()
    };
    let identity = Identity {
        subject: "u".into(),
        tenant: "t".into(),
        role: Role::Member,
        hosts: None,
    };
    (
        Arc::new(ShardLink::new(limits, providers, store, None)),
        HostKey::new("t", "h"),
        identity,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_host_is_freed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (link, key, identity) = demo_link(dir.path()).await;
    let connection = ConnectionId::next();
    let bus = link.attach(&key, connection, &identity).await.expect("attach");
    let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"c"}}"#;
    let reply = link
        .call(&key, connection, read_frame(init, 64).expect("frame"))
        .await;
    assert!(reply.frame.is_some());
    let host = Arc::downgrade(&link.host(&key).await.expect("host"));
    link.detach(&key, connection).await;
    drop(bus);

    // Not idle before the grace and the idle time pass; evicted after.
    assert_eq!(link.evict_idle(Duration::from_secs(3600)).await, 0);
    let started = std::time::Instant::now();
    while link.evict_idle(Duration::from_millis(50)).await == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "never idle");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while host.upgrade().is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "something still holds the evicted host"
        );
        tokio::task::yield_now().await;
    }
}

/// A new session's default chat never takes the URI of a stored chat of a session that is not in memory
/// (its name is derived from the session's: the stored chat is loaded first, and the new one named apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_chat_never_takes_the_name_of_an_unloaded_chat() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (link, key, identity) = demo_link(dir.path()).await;
    let call = |connection: ConnectionId, frame: serde_json::Value| {
        let link = link.clone();
        let key = key.clone();
        async move {
            let frame = frame.to_string();
            let reply = link
                .call(&key, connection, read_frame(frame.as_bytes(), 64).expect("frame"))
                .await;
            let reply: serde_json::Value =
                serde_json::from_slice(&reply.frame.expect("a reply")).expect("json");
            assert!(reply.get("result").is_some(), "{frame}: {reply}");
            reply
        }
    };
    let init = serde_json::json!({"jsonrpc":"2.0","id":1,"method":"initialize",
        "params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"c"}});
    // Session a holds a chat named like session b's default chat would be; then the host leaves memory.
    let first = ConnectionId::next();
    let bus = link.attach(&key, first, &identity).await.expect("attach");
    call(first, init.clone()).await;
    call(
        first,
        serde_json::json!({"jsonrpc":"2.0","id":2,"method":"createSession",
        "params":{"channel":"ahp-session:/a","provider":"demo"}}),
    )
    .await;
    call(
        first,
        serde_json::json!({"jsonrpc":"2.0","id":3,"method":"createChat",
        "params":{"channel":"ahp-session:/a","chat":"ahp-chat:/b"}}),
    )
    .await;
    link.detach(&key, first).await;
    drop(bus);
    let started = std::time::Instant::now();
    while link.evict_idle(Duration::from_millis(50)).await == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "never idle");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let second = ConnectionId::next();
    let _bus = link.attach(&key, second, &identity).await.expect("attach");
    call(second, init).await;
    call(
        second,
        serde_json::json!({"jsonrpc":"2.0","id":2,"method":"createSession",
        "params":{"channel":"ahp-session:/b","provider":"demo"}}),
    )
    .await;
    let b = call(
        second,
        serde_json::json!({"jsonrpc":"2.0","id":3,"method":"subscribe",
        "params":{"channel":"ahp-session:/b"}}),
    )
    .await;
    let default_chat = b["result"]["snapshot"]["state"]["defaultChat"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(default_chat.starts_with("ahp-chat:/b-default-"), "{b}");
    let a = call(
        second,
        serde_json::json!({"jsonrpc":"2.0","id":4,"method":"subscribe",
        "params":{"channel":"ahp-session:/a"}}),
    )
    .await;
    let listed: Vec<&str> = a["result"]["snapshot"]["state"]["chats"]
        .as_array()
        .map(|chats| chats.iter().filter_map(|c| c["resource"].as_str()).collect())
        .unwrap_or_default();
    assert!(listed.contains(&"ahp-chat:/b"), "{a}");
}
