//! Host ownership between two shard processes' links on one store (invariant 6, "one writer per host"):
//! a host is served by one link at a time, the other is redirected to it, a lease that lapses is taken
//! over, and the deposed link then commits nothing more — its next reply tells the client to reconnect and
//! its bus closes. Driven through the real `HostLink` interface on a real SQLite store.

use std::sync::Arc;
use std::time::Duration;

use relay_core::link::{HostLink, LinkError};
use relay_core::rpc::read_frame;
use relay_core::{ConnectionId, HostKey, Identity, Limits, Role};
use relay_runner::{DemoPace, DemoProvider, ProviderRegistry};
use relay_shard::ownership::Ownership;
use relay_shard::ShardLink;
use relay_store::Store;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

const TTL: Duration = Duration::from_millis(400);

async fn shard(store: &Store, url: &str) -> Arc<ShardLink> {
    Arc::new(
        ShardLink::new(Limits::default(), providers(), store.clone(), None)
            .with_ownership(Ownership::new(url, TTL)),
    )
}

/// A fresh SQLite store and two shards' links on it, named `http://first:1` and `http://second:1`.
async fn two_shards() -> (tempfile::TempDir, Store, Arc<ShardLink>, Arc<ShardLink>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("relay.sqlite").display());
    let store = Store::connect(&url).await.expect("store");
    store.migrate().await.expect("migrate");
    let first = shard(&store, "http://first:1").await;
    let second = shard(&store, "http://second:1").await;
    (dir, store, first, second)
}

/// Wait (bounded) until the bus reports itself closed, skipping whatever it still held.
async fn bus_closes(bus: &mut relay_core::bus::BusReceiver) {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), bus.recv())
            .await
            .expect("the bus did not close")
        {
            Err(RecvError::Closed) => return,
            Ok(_) | Err(RecvError::Lagged(_)) => continue,
        }
    }
}

fn providers() -> ProviderRegistry {
    ProviderRegistry::new().with(Arc::new(DemoProvider::new(DemoPace {
        step: Duration::from_millis(1),
    })))
}

fn identity() -> Identity {
    Identity {
        subject: "user".into(),
        tenant: "t".into(),
        role: Role::Member,
        hosts: None,
    }
}

async fn call(link: &ShardLink, key: &HostKey, id: ConnectionId, frame: Value) -> relay_core::CommandReply {
    let message = read_frame(frame.to_string().as_bytes(), 64).expect("valid frame");
    link.call(key, id, message).await
}

fn initialize() -> Value {
    json!({"jsonrpc":"2.0","id":1,"method":"initialize",
           "params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"c"}})
}

fn create_session(n: u32) -> Value {
    json!({"jsonrpc":"2.0","id":2,"method":"createSession",
           "params":{"channel":format!("ahp-session:/s{n}"),"provider":"demo"}})
}

fn reply_json(reply: &relay_core::CommandReply) -> Value {
    serde_json::from_slice(reply.frame.as_ref().expect("a reply frame")).expect("json")
}

#[tokio::test]
async fn one_shard_serves_a_host_the_other_is_redirected_and_takes_over_a_lapsed_lease() {
    let (_dir, store, first, second) = two_shards().await;
    let key = HostKey::new("t", "default");

    let conn = ConnectionId::next();
    let mut bus = first
        .attach(&key, conn, &identity())
        .await
        .expect("first takes the host");
    assert!(reply_json(&call(&first, &key, conn, initialize()).await)
        .get("result")
        .is_some());
    match second.attach(&key, ConnectionId::next(), &identity()).await {
        Err(LinkError::Moved { owner, .. }) => assert_eq!(owner, "http://first:1"),
        other => panic!(
            "expected a redirect to the first shard, got {:?}",
            other.map(|_| ())
        ),
    }

    // The first shard keeps no lease alive (no keeper running): once it lapses, the second takes the host.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let taken = loop {
        match second.attach(&key, ConnectionId::next(), &identity()).await {
            Ok(bus) => break bus,
            Err(LinkError::Moved { .. }) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the lapsed lease was never taken"
                );
                tokio::time::sleep(TTL / 4).await;
            }
            Err(error) => panic!("unexpected: {error}"),
        }
    };
    drop(taken);
    let epoch_after = store
        .lease_of("t", "default")
        .await
        .expect("lease")
        .expect("held")
        .epoch;

    // The deposed first shard tries to commit: fenced. The client is told to reconnect, the bus closes,
    // and nothing it tried reached the log.
    let before = store.load_host("t", "default").await.expect("host").last_seq;
    let reply = call(&first, &key, conn, create_session(1)).await;
    assert_eq!(
        reply.close.as_ref().map(|c| c.code),
        Some(1012),
        "told to reconnect"
    );
    assert!(reply_json(&reply).get("error").is_some());
    bus_closes(&mut bus).await;
    assert_eq!(
        store.load_host("t", "default").await.expect("host").last_seq,
        before
    );
    assert!(store
        .list_sessions("t", "default", None, 10)
        .await
        .expect("catalog")
        .is_empty());
    let lease = store
        .lease_of("t", "default")
        .await
        .expect("lease")
        .expect("held");
    assert_eq!(
        (lease.owner.starts_with("http://second:1#"), lease.epoch),
        (true, epoch_after)
    );
}

#[tokio::test]
async fn draining_a_shard_releases_its_leases_at_once() {
    let (_dir, store, first, second) = two_shards().await;
    let key = HostKey::new("t", "default");
    let conn = ConnectionId::next();
    let mut bus = first
        .attach(&key, conn, &identity())
        .await
        .expect("first takes the host");
    call(&first, &key, conn, initialize()).await;
    let created = reply_json(&call(&first, &key, conn, create_session(1)).await);
    assert!(created.get("result").is_some(), "{created}");

    first.drain().await;
    assert!(
        store.lease_of("t", "default").await.expect("lease").is_none(),
        "released"
    );
    bus_closes(&mut bus).await;
    // Released, not lapsed: the second shard gets the host immediately, with what the first committed.
    let conn2 = ConnectionId::next();
    second
        .attach(&key, conn2, &identity())
        .await
        .expect("taken over at once");
    assert!(reply_json(&call(&second, &key, conn2, initialize()).await)
        .get("result")
        .is_some());
    let listed = reply_json(
        &call(
            &second,
            &key,
            conn2,
            json!({"jsonrpc":"2.0","id":3,"method":"listSessions","params":{"channel":"ahp-root://"}}),
        )
        .await,
    );
    assert_eq!(
        listed["result"]["items"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    // And the drained shard refuses the host.
    assert!(first
        .attach(&key, ConnectionId::next(), &identity())
        .await
        .is_err());
}

#[tokio::test]
async fn a_kept_lease_is_not_taken_and_a_lost_one_is_noticed_at_the_next_renewal() {
    let (_dir, store, first, second) = two_shards().await;
    first.keep_leases();
    let key = HostKey::new("t", "default");
    let conn = ConnectionId::next();
    let mut bus = first
        .attach(&key, conn, &identity())
        .await
        .expect("first takes the host");

    // Three lease lifetimes later the host is still the first shard's: its keeper renewed the lease.
    let until = tokio::time::Instant::now() + 3 * TTL;
    while tokio::time::Instant::now() < until {
        match second.attach(&key, ConnectionId::next(), &identity()).await {
            Err(LinkError::Moved { owner, .. }) => assert_eq!(owner, "http://first:1"),
            other => panic!("the renewed lease was taken: {:?}", other.map(|_| ())),
        }
        tokio::time::sleep(TTL / 4).await;
    }

    // The lease is lost behind the first shard's back (released in the store, then taken by the second):
    // the keeper's next renewal misses it, deposes the host and closes its bus — with no commit attempted.
    let lease = store
        .lease_of("t", "default")
        .await
        .expect("lease")
        .expect("held");
    store.release_lease(&lease).await.expect("release");
    second
        .attach(&key, ConnectionId::next(), &identity())
        .await
        .expect("second takes the host");
    bus_closes(&mut bus).await;
    assert_eq!(
        call(&first, &key, conn, initialize()).await.close.map(|c| c.code),
        Some(1012)
    );
}

/// `max_hosts_per_tenant` holds across shards: the tenant's hosts leased by any shard count, so two shards do
/// not give a tenant twice its hosts.
#[tokio::test]
async fn the_host_cap_of_a_tenant_counts_its_hosts_on_every_shard() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("relay.sqlite").display());
    let store = Store::connect(&url).await.expect("store");
    store.migrate().await.expect("migrate");
    let capped = |name: &str| {
        let link = Arc::new(
            ShardLink::new(
                Limits {
                    max_hosts_per_tenant: 2,
                    ..Limits::default()
                },
                providers(),
                store.clone(),
                None,
            )
            .with_ownership(Ownership::new(name, Duration::from_secs(30))),
        );
        link.keep_leases();
        link
    };
    let (first, second) = (capped("http://first:1"), capped("http://second:1"));
    let _one = first
        .attach(&HostKey::new("t", "one"), ConnectionId::next(), &identity())
        .await
        .expect("first host");
    let _two = second
        .attach(&HostKey::new("t", "two"), ConnectionId::next(), &identity())
        .await
        .expect("second host, on the other shard");
    match first
        .attach(&HostKey::new("t", "three"), ConnectionId::next(), &identity())
        .await
    {
        Err(LinkError::OverQuota(reason)) => assert!(reason.contains("maximum of 2"), "{reason}"),
        other => panic!("a third host was opened: {:?}", other.map(|_| ())),
    }
    // Another tenant is not held back, and an open host of the tenant still takes connections.
    let other_tenant = Identity {
        tenant: "u".into(),
        ..identity()
    };
    first
        .attach(&HostKey::new("u", "one"), ConnectionId::next(), &other_tenant)
        .await
        .expect("another tenant's host");
    first
        .attach(&HostKey::new("t", "one"), ConnectionId::next(), &identity())
        .await
        .expect("the tenant's open host");
}
