//! Idle hosts are evicted from memory: once evicted, nothing keeps a host alive.

use std::sync::Arc;
use std::time::Duration;

use relay_core::link::HostLink;
use relay_core::rpc::read_frame;
use relay_core::{ConnectionId, HostKey, Identity, Limits, Role};
use relay_runner::{DemoPace, DemoProvider, ProviderRegistry};
use relay_shard::ShardLink;
use relay_store::Store;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_host_is_freed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::connect(&format!("sqlite://{}", dir.path().join("t.sqlite").display()))
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
    let link = Arc::new(ShardLink::new(limits, providers, store, None));
    let key = HostKey::new("t", "h");
    let identity = Identity {
        subject: "u".into(),
        tenant: "t".into(),
        role: Role::Member,
    };
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
