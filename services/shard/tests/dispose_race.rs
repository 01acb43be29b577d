//! A message naming a session between its dispose and the dispose's commit must not load the session back
//! from the store (which still holds it until the commit). The commit is held back by taking the SQLite
//! file's write lock from a second connection.

use std::sync::Arc;
use std::time::Duration;

use relay_core::rpc::read_frame;
use relay_core::{ConnectionId, HostKey, Identity, Limits, Role};
use relay_runner::{DemoPace, DemoProvider, ProviderRegistry};
use relay_shard::Host;
use relay_store::Store;
use serde_json::{json, Value};
use sqlx::{Connection, Executor};

async fn call(host: &Host, connection: ConnectionId, frame: Value) -> Value {
    let text = frame.to_string();
    let message = read_frame(text.as_bytes(), 64).expect("valid frame");
    let reply = host.call(connection, message).await.frame.expect("a reply");
    serde_json::from_slice(&reply).expect("json reply")
}

async fn device(host: &Host, client_id: &str) -> ConnectionId {
    let id = ConnectionId::next();
    let _bus = host.attach(
        id,
        Identity {
            subject: client_id.into(),
            tenant: "t".into(),
            role: Role::Member,
            hosts: None,
        },
    );
    let reply = call(
        host,
        id,
        json!({"jsonrpc":"2.0","id":1,"method":"initialize",
               "params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":client_id}}),
    )
    .await;
    assert!(reply.get("result").is_some(), "{reply}");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_named_while_its_dispose_commits_is_not_loaded_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.sqlite");
    let store = Store::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("store");
    store.migrate().await.expect("migrate");
    let providers = ProviderRegistry::new().with(Arc::new(DemoProvider::new(DemoPace {
        step: Duration::from_millis(1),
    })));
    let host = Host::open(
        HostKey::new("t", "default"),
        Limits::default(),
        providers,
        store,
        None,
        None,
    )
    .await
    .expect("open host");
    let a = device(&host, "a").await;
    let b = device(&host, "b").await;
    let created = call(
        &host,
        a,
        json!({"jsonrpc":"2.0","id":2,"method":"createSession",
               "params":{"channel":"ahp-session:/s","provider":"demo"}}),
    )
    .await;
    assert!(created.get("result").is_some(), "{created}");

    // Hold the store's write lock: the dispose below is applied in memory but cannot commit.
    let mut blocker = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("second connection");
    blocker
        .execute("BEGIN IMMEDIATE")
        .await
        .expect("take the write lock");
    let disposing = {
        let host = host.clone();
        tokio::spawn(async move {
            call(
                &host,
                a,
                json!({"jsonrpc":"2.0","id":3,"method":"disposeSession",
                       "params":{"channel":"ahp-session:/s"}}),
            )
            .await
        })
    };
    while host.loaded_counts().sessions != 0 {
        tokio::task::yield_now().await;
    }
    let subscribing = {
        let host = host.clone();
        tokio::spawn(async move {
            call(
                &host,
                b,
                json!({"jsonrpc":"2.0","id":4,"method":"subscribe","params":{"channel":"ahp-session:/s"}}),
            )
            .await
        })
    };
    // While the disposal is not committed, the subscribe has no answer to give: neither the old session
    // (it is disposed) nor "not found" from the store (which still holds it).
    let early = tokio::time::timeout(Duration::from_millis(300), async {
        while !subscribing.is_finished() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(early.is_err(), "subscribe answered before the disposal committed");
    blocker.execute("ROLLBACK").await.expect("release the lock");

    let disposed = disposing.await.expect("dispose task");
    assert!(disposed.get("result").is_some(), "{disposed}");
    let subscribed = subscribing.await.expect("subscribe task");
    assert!(
        subscribed.get("error").is_some(),
        "a disposed session came back from the store: {subscribed}"
    );
    assert_eq!(host.loaded_counts().sessions, 0, "nothing was loaded back");
}
