//! Operations: after a chat turn the Prometheus metrics of the gateway and of the shard exist with plausible
//! values (connections, subscriptions, fan-out latency, sequenced actions, commit histograms, replays by
//! source); the shard's `/healthz` and `/readyz` answer 200; a gateway is ready while its shard answers and
//! stops being ready once the shard is gone. The embedded `serve` exposes both sides on one `/metrics`.

mod support;

use std::time::Duration;

use ahp_types::commands::ReconnectResult;
use relay_core::Role;
use support::*;

const MEMORY_REPLAYS: &str = r#"ahp_relay_replays_total{source="memory"}"#;

/// Poll (bounded by [`PATIENCE`]) until `check` holds for the value `read` returns; returns that value.
async fn eventually<F, Fut>(what: &str, read: F, check: impl Fn(f64) -> bool) -> f64
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = f64>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let value = read().await;
        if check(value) {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: still {value} after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_deployment_metrics_health_and_readiness() {
    let mut shard = Shard::start(&[]).await;
    let gateway = Relay::gateway(&shard.url).await;

    assert_eq!(
        http_get(&shard.http, "/healthz").await.expect("healthz"),
        (200, "ok".into())
    );
    assert_eq!(http_get(&shard.http, "/readyz").await.expect("readyz").0, 200);
    assert_eq!(http_get(&gateway.addr, "/healthz").await.expect("healthz").0, 200);
    assert_eq!(http_get(&gateway.addr, "/readyz").await.expect("readyz").0, 200);
    assert_eq!(gateway.metric("ahp_relay_connections").await, 0.0);

    let (a, _) = gateway.client("device-a").await;
    let (_, chat) = create_session_and_chat(&a, "ops").await;
    let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
    assert!(
        gateway.metric("ahp_relay_connections").await >= 1.0,
        "a connected client is counted"
    );
    assert!(
        gateway.metric("ahp_relay_subscriptions").await >= 1.0,
        "its chat subscription is counted"
    );
    assert_eq!(
        gateway.metric("ahp_relay_fanout_lanes").await,
        1.0,
        "one connection of one host: one fan-out lane"
    );
    let actions_before = shard.metric("ahp_relay_actions_total").await;
    let memory_replays_before = shard.metric(MEMORY_REPLAYS).await;

    a.dispatch(chat.clone(), turn_started("t1", "count me"))
        .await
        .expect("dispatch");
    let envelopes = collect_until(&mut sub, is_turn_complete).await;
    let last_seen = envelopes.last().map(|e| e.server_seq).expect("envelopes");

    // Every envelope the client saw was sequenced and committed after the first reading.
    let actions_after = shard.metric("ahp_relay_actions_total").await;
    assert!(
        actions_after >= actions_before + envelopes.len() as f64,
        "actions_total went from {actions_before} to {actions_after} over {} envelopes",
        envelopes.len()
    );
    let commits = shard.metric("ahp_relay_commit_seconds_count").await;
    assert!(commits > 0.0);
    assert_eq!(shard.metric("ahp_relay_commit_batch_size_count").await, commits);
    assert!(shard.metric("ahp_relay_commit_batch_size_sum").await >= actions_after);
    assert!(
        shard
            .metric(r#"ahp_relay_commit_seconds_bucket{le="+Inf"}"#)
            .await
            >= commits
    );
    assert!(shard.metric("ahp_relay_hosts_open").await >= 1.0);
    assert!(shard.metric("ahp_relay_sessions_loaded").await >= 1.0);
    assert!(shard.metric("ahp_relay_chats_loaded").await >= 1.0);
    eventually(
        "gateway fan-out latency samples",
        || gateway.metric("ahp_relay_fanout_latency_seconds_count"),
        |count| count >= envelopes.len() as f64,
    )
    .await;
    // Each process exposes only its own side.
    let (_, gateway_text) = http_get(&gateway.addr, "/metrics").await.expect("metrics");
    assert!(
        !gateway_text.contains("ahp_relay_actions_total"),
        "{gateway_text}"
    );

    // The device comes back (on the same gateway) while its gap is still in the shard's replay buffer.
    a.shutdown().await;
    eventually(
        "connections after the client left",
        || gateway.metric("ahp_relay_connections"),
        |n| n == 0.0,
    )
    .await;
    assert_eq!(gateway.metric("ahp_relay_subscriptions").await, 0.0);
    // The host's lane ends with its last connection, and lets go of the host's bus.
    eventually(
        "fan-out lanes after the client left",
        || gateway.metric("ahp_relay_fanout_lanes"),
        |n| n == 0.0,
    )
    .await;
    let back = gateway.connect("dev", "device-a", Role::Member).await;
    let _sub = back.attach_subscription(&chat).await;
    let replay = back
        .reconnect("device-a".into(), (last_seen - 3) as i64, vec![chat.clone()])
        .await
        .expect("reconnect");
    assert!(matches!(replay, ReconnectResult::Replay(_)), "an exact replay");
    assert_eq!(shard.metric(MEMORY_REPLAYS).await, memory_replays_before + 1.0);
    assert_eq!(
        shard.metric(r#"ahp_relay_replays_total{source="store"}"#).await,
        0.0
    );

    // Without its shard a gateway is not ready (but still alive).
    shard.kill().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (status, body) = http_get(&gateway.addr, "/readyz")
            .await
            .expect("the gateway is still up");
        if status == 503 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz still {status} {body:?} without a shard"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(http_get(&gateway.addr, "/healthz").await.expect("healthz").0, 200);
    assert!(
        http_get(&shard.http, "/healthz").await.is_err(),
        "the killed shard's HTTP endpoint is gone"
    );
    back.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_relay_serves_both_sides_on_one_metrics_endpoint() {
    let relay = Relay::start().await;
    assert_eq!(
        http_get(&relay.addr, "/readyz").await.expect("readyz"),
        (200, "ready".into())
    );
    let (a, _) = relay.client("device-a").await;
    let (_, chat) = create_session_and_chat(&a, "embedded").await;
    let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "hello"))
        .await
        .expect("dispatch");
    let envelopes = collect_until(&mut sub, is_turn_complete).await;

    assert!(relay.metric("ahp_relay_connections").await >= 1.0);
    assert!(relay.metric("ahp_relay_actions_total").await >= envelopes.len() as f64);
    assert!(relay.metric("ahp_relay_commit_seconds_count").await > 0.0);
    assert_eq!(relay.metric("ahp_relay_sessions_loaded").await, 1.0);
    // In one process the latency runs from the shard's publish (after commit) to the client's socket.
    eventually(
        "fan-out latency samples",
        || relay.metric("ahp_relay_fanout_latency_seconds_count"),
        |count| count >= envelopes.len() as f64,
    )
    .await;
    let (status, text) = http_get(&relay.addr, "/metrics").await.expect("metrics");
    assert_eq!(status, 200);
    for family in [
        "ahp_relay_connections",
        "ahp_relay_actions_total",
        "ahp_relay_hosts_open",
    ] {
        assert_eq!(
            text.matches(&format!("# TYPE {family} ")).count(),
            1,
            "{family} exactly once in:\n{text}"
        );
    }
    a.shutdown().await;
}
