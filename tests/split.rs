//! The distributed shape: gateways and a shard as separate processes, talking gRPC. Devices on different
//! gateways share one session, and a device moves between gateways without losing or repeating anything.

mod support;

use ahp_types::commands::ReconnectResult;
use relay_core::Role;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_on_two_gateways_receive_identical_envelopes() {
    let shard = Shard::start(&[]).await;
    let gateway1 = Relay::gateway(&shard.url).await;
    let gateway2 = Relay::gateway(&shard.url).await;
    let (a, _) = gateway1.client("device-a").await;
    let (b, _) = gateway2.client("device-b").await;
    let (_, chat) = create_session_and_chat(&a, "split").await;
    let (a_state, a_from, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (_, b_from, mut b_sub) = subscribe_chat(&b, &chat).await;

    a.dispatch(chat.clone(), turn_started("t1", "hello across gateways"))
        .await
        .expect("dispatch");
    let a_envs = collect_until(&mut a_sub, is_turn_complete).await;
    let b_envs = collect_until(&mut b_sub, is_turn_complete).await;
    let after = a_from.max(b_from);
    let a_after: Vec<_> = a_envs.iter().filter(|e| e.server_seq > after).collect();
    let b_after: Vec<_> = b_envs.iter().filter(|e| e.server_seq > after).collect();
    assert_eq!(json(&a_after), json(&b_after));
    assert_increasing(&a_envs);
    assert_eq!(
        json(&reduce_chat(a_state, a_from, &a_envs)),
        json(&fresh_chat_snapshot(&gateway2, &chat).await)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_dropped_from_one_gateway_resumes_exactly_on_the_other() {
    let shard = Shard::start(&["--demo-step-ms", "25"]).await;
    let gateway1 = Relay::gateway(&shard.url).await;
    let gateway2 = Relay::gateway(&shard.url).await;
    let (a, _) = gateway1.client("device-a").await;
    let (b, _) = gateway2.client("device-b").await;
    let (_, chat) = create_session_and_chat(&a, "moving").await;
    let (a_state, a_from, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (_, _, mut b_sub) = subscribe_chat(&b, &chat).await;

    a.dispatch(chat.clone(), turn_started("t1", "keep talking while I move"))
        .await
        .expect("dispatch");
    let mut a_seen = Vec::new();
    for _ in 0..4 {
        a_seen.push(next_envelope(&mut a_sub).await);
    }
    let last_seen = a_seen.last().map(|e| e.server_seq).expect("seen");
    a.shutdown().await;
    let mut b_envs = collect_until(&mut b_sub, |e| e.server_seq > last_seen + 3).await;

    let moved = gateway2.connect("dev", "device-a", Role::Member).await;
    let mut moved_sub = moved.attach_subscription(&chat).await;
    let ReconnectResult::Replay(replay) = moved
        .reconnect("device-a".into(), last_seen as i64, vec![chat.clone()])
        .await
        .expect("reconnect")
    else {
        panic!("expected an exact replay on the other gateway");
    };
    let mut resumed = replay.actions;
    if !resumed.iter().any(is_turn_complete) {
        resumed.extend(collect_until(&mut moved_sub, is_turn_complete).await);
    }
    if !b_envs.iter().any(is_turn_complete) {
        b_envs.extend(collect_until(&mut b_sub, is_turn_complete).await);
    }
    let missed: Vec<_> = b_envs
        .iter()
        .filter(|e| e.server_seq > last_seen)
        .cloned()
        .collect();
    assert_eq!(json(&resumed), json(&missed), "nothing twice, nothing skipped");
    let state = reduce_chat(reduce_chat(a_state, a_from, &a_seen), last_seen, &resumed);
    assert_eq!(json(&state), json(&fresh_chat_snapshot(&gateway1, &chat).await));
}
