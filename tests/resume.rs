//! A device that drops off resumes from its last `serverSeq`: exact replay when the host still holds every
//! missed envelope, fresh snapshots otherwise, and disposed channels reported as missing.

mod support;

use ahp_types::commands::{DisposeSessionParams, ReconnectResult};
use ahp_types::state::TurnState;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_client_replays_exactly_what_it_missed_mid_turn() {
    let relay = Relay::start_with(&["--demo-step-ms", "25"]).await;
    let (a, _) = relay.client("device-a").await;
    let (b, _) = relay.client("device-b").await;
    let (_, chat) = create_session_and_chat(&a, "resume").await;
    let (a_state, a_from, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (_, b_from, mut b_sub) = subscribe_chat(&b, &chat).await;

    a.dispatch(chat.clone(), turn_started("t1", "tell me something long"))
        .await
        .expect("dispatch");
    let mut a_seen = Vec::new();
    for _ in 0..4 {
        a_seen.push(next_envelope(&mut a_sub).await);
    }
    let last_seen = a_seen.last().map(|e| e.server_seq).expect("seen");
    // A's connection goes away without unsubscribing; the turn goes on without it.
    a.shutdown().await;
    drop(a_sub);

    // Wait until B has seen the turn move on past what A saw, then bring A back while it still streams.
    let mut b_envs = collect_until(&mut b_sub, |e| e.server_seq > last_seen + 3).await;

    let a2 = relay.connect("dev", "device-a", relay_core::Role::Member).await;
    let mut a2_sub = a2.attach_subscription(&chat).await;
    let result = a2
        .reconnect("device-a".into(), last_seen as i64, vec![chat.clone()])
        .await
        .expect("reconnect");
    let ReconnectResult::Replay(replay) = result else {
        panic!("expected an exact replay, got {result:?}");
    };
    assert!(replay.missing.is_empty());
    let mut resumed = replay.actions.clone();
    if !resumed.iter().any(is_turn_complete) {
        resumed.extend(collect_until(&mut a2_sub, is_turn_complete).await);
    }
    if !b_envs.iter().any(is_turn_complete) {
        b_envs.extend(collect_until(&mut b_sub, is_turn_complete).await);
    }

    // Exactly the envelopes A missed: none twice, none skipped, same JSON as B saw.
    let missed: Vec<_> = b_envs
        .iter()
        .filter(|e| e.server_seq > last_seen)
        .cloned()
        .collect();
    assert_increasing(&resumed);
    assert_eq!(json(&resumed), json(&missed));

    let a_final = reduce_chat(reduce_chat(a_state, a_from, &a_seen), last_seen, &resumed);
    let fresh = fresh_chat_snapshot(&relay, &chat).await;
    assert_eq!(json(&a_final), json(&fresh));
    assert!(b_from <= last_seen);
    assert_eq!(fresh.turns.last().map(|t| t.state), Some(TurnState::Complete));

    // The resumed connection keeps receiving live envelopes, after the replayed ones.
    a2.dispatch(chat.clone(), turn_started("t2", "again"))
        .await
        .expect("dispatch");
    let live = collect_until(&mut a2_sub, is_turn_complete).await;
    let last_resumed = resumed.last().map(|e| e.server_seq).unwrap_or(last_seen);
    assert!(live.iter().all(|e| e.server_seq > last_resumed));
    assert_increasing(&live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_older_than_the_memory_buffer_is_replayed_from_the_store() {
    let relay = Relay::start_with(&["--replay-buffer", "5"]).await;
    let (a, _) = relay.client("device-a").await;
    let (b, _) = relay.client("device-b").await;
    let (session, chat) = create_session_and_chat(&a, "old").await;
    let (a_state, a_from, _a_sub) = subscribe_chat(&a, &chat).await;
    a.shutdown().await;

    let (_, _, mut b_sub) = subscribe_chat(&b, &chat).await;
    b.dispatch(chat.clone(), turn_started("t1", "more than five envelopes"))
        .await
        .expect("dispatch");
    let b_envs = collect_until(&mut b_sub, is_turn_complete).await;
    assert!(b_envs.len() > 5, "more than the memory buffer holds");

    let a2 = relay.connect("dev", "device-a", relay_core::Role::Member).await;
    let result = a2
        .reconnect(
            "device-a".into(),
            a_from as i64,
            vec![chat.clone(), session.clone()],
        )
        .await
        .expect("reconnect");
    let ReconnectResult::Replay(replay) = result else {
        panic!("a gap inside retention is replayed exactly, got {result:?}");
    };
    let on_chat: Vec<_> = replay
        .actions
        .iter()
        .filter(|e| e.channel == chat)
        .cloned()
        .collect();
    assert_eq!(json(&on_chat), json(&b_envs));
    assert_eq!(
        json(&reduce_chat(a_state, a_from, &on_chat)),
        json(&fresh_chat_snapshot(&relay, &chat).await)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_an_unknown_watermark_gets_snapshots_equal_to_live_state() {
    let relay = Relay::start().await;
    let (a, init) = relay.client("device-a").await;
    let (session, chat) = create_session_and_chat(&a, "future").await;
    let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "hello"))
        .await
        .expect("dispatch");
    collect_until(&mut sub, is_turn_complete).await;
    a.shutdown().await;

    // A serverSeq this host never issued (e.g. a client of another deployment): replay cannot be proven.
    let a2 = relay.connect("dev", "device-a", relay_core::Role::Member).await;
    let result = a2
        .reconnect(
            "device-a".into(),
            init.server_seq + 1_000_000,
            vec![chat.clone(), session.clone()],
        )
        .await
        .expect("reconnect");
    let ReconnectResult::Snapshot(snapshots) = result else {
        panic!("expected snapshots, got {result:?}");
    };
    assert_eq!(snapshots.snapshots.len(), 2);
    let chat_snapshot = snapshots
        .snapshots
        .iter()
        .find(|s| s.resource == chat)
        .expect("chat snapshot");
    assert_eq!(
        json(&chat_of(chat_snapshot)),
        json(&fresh_chat_snapshot(&relay, &chat).await)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_disposed_while_away_comes_back_missing() {
    let relay = Relay::start().await;
    let (a, init) = relay.client("device-a").await;
    // The same user's other device disposes the session.
    let (b, _) = relay
        .client_as("dev", "device-a", relay_core::Role::Member, "device-b")
        .await;
    let (gone, gone_chat) = create_session_and_chat(&a, "gone").await;
    let (_, kept_chat) = create_session_and_chat(&a, "kept").await;
    let (_, _, _s1) = subscribe_chat(&a, &gone_chat).await;
    let (_, _, _s2) = subscribe_chat(&a, &kept_chat).await;
    let last_seen = relay_seq(&relay).await;
    assert!(last_seen >= init.server_seq as u64);
    a.shutdown().await;

    let _: serde_json::Value = b
        .request(
            "disposeSession",
            DisposeSessionParams {
                channel: gone.clone(),
                meta: None,
            },
        )
        .await
        .expect("dispose");

    let a2 = relay.connect("dev", "device-a", relay_core::Role::Member).await;
    let result = a2
        .reconnect(
            "device-a".into(),
            last_seen as i64,
            vec![gone.clone(), gone_chat.clone(), kept_chat.clone()],
        )
        .await
        .expect("reconnect");
    let ReconnectResult::Replay(replay) = result else {
        panic!("expected a replay, got {result:?}");
    };
    assert_eq!(replay.missing, vec![gone, gone_chat]);
    // The disposal's catalogue actions were on the disposed session's channel, which A no longer has.
    assert!(replay.actions.iter().all(|e| e.channel == kept_chat));
}

/// The host's current serverSeq, as a fresh client sees it.
async fn relay_seq(relay: &Relay) -> u64 {
    let (c, init) = relay.client("seq-probe").await;
    c.shutdown().await;
    init.server_seq as u64
}
