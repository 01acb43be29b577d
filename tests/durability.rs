//! Sessions outlive the process: the relay is killed with SIGKILL mid-stream and restarted on the same store
//! (SQLite and Postgres), and every client resumes exactly.

mod support;

use std::collections::BTreeMap;

use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::commands::ReconnectResult;
use ahp_types::state::{ChatState, TurnState};
use relay_core::Role;
use support::*;
use tokio::sync::mpsc;

/// One device on one host, following two chats.
struct Device {
    host: &'static str,
    client_id: String,
    chats: Vec<String>,
    initial: BTreeMap<String, (ChatState, u64)>,
    received: mpsc::UnboundedReceiver<ActionEnvelope>,
    seen: Vec<ActionEnvelope>,
}

async fn device(relay: &Relay, tenant: &str, host: &'static str) -> Device {
    let client_id = format!("{host}-device");
    let client = relay.connect_host(host, tenant, "user", Role::Member).await;
    client
        .initialize(client_id.clone(), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    let (tx, rx) = mpsc::unbounded_channel();
    // One stream for the whole connection keeps the wire order across channels.
    let mut events = client.events();
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if let ahp::SubscriptionEvent::Action(envelope) = event.event {
                let _ = tx.send(envelope);
            }
        }
    });
    let mut chats = Vec::new();
    let mut initial = BTreeMap::new();
    for i in 0..2 {
        let (_, chat) = create_session_and_chat(&client, &format!("{host}-{i}")).await;
        let (state, from, _sub) = subscribe_chat(&client, &chat).await;
        initial.insert(chat.clone(), (state, from));
        client
            .dispatch(
                chat.clone(),
                turn_started("t1", "a long story that streams for a while"),
            )
            .await
            .expect("dispatch");
        chats.push(chat);
    }
    // Keep the connection open until the relay dies.
    std::mem::forget(client);
    Device {
        host,
        client_id,
        chats,
        initial,
        received: rx,
        seen: Vec::new(),
    }
}

async fn crash_and_resume(store: TestStore) {
    let tenant = unique_tenant();
    let mut relay = store.relay(&["--demo-step-ms", "60"]).await;
    let mut devices = vec![
        device(&relay, &tenant, "default").await,
        device(&relay, &tenant, "second").await,
    ];
    // Kill the relay once every device is mid-stream.
    for d in &mut devices {
        while d.seen.len() < 6 {
            let envelope = tokio::time::timeout(PATIENCE, d.received.recv())
                .await
                .expect("timed out")
                .expect("stream");
            d.seen.push(envelope);
        }
    }
    relay.kill().await;
    for d in &mut devices {
        // Whatever reached the client before the kill counts as received.
        while let Some(envelope) = d.received.recv().await {
            d.seen.push(envelope);
        }
        let completed = d
            .seen
            .iter()
            .filter(|e| matches!(e.action, StateAction::ChatTurnComplete(_)))
            .count();
        assert!(
            completed < d.chats.len(),
            "killed while turns were still streaming"
        );
        assert_increasing(&d.seen);
    }

    let relay = store.relay(&["--demo-step-ms", "60"]).await;
    for d in &devices {
        let max_seen = d.seen.iter().map(|e| e.server_seq).max().expect("seen");

        // Every envelope the client received is in the store, unchanged.
        let auditor = relay.connect_host(d.host, &tenant, "user", Role::Member).await;
        let ReconnectResult::Replay(all) = auditor
            .reconnect(format!("{}-audit", d.client_id), 0, d.chats.clone())
            .await
            .expect("audit")
        else {
            panic!("the full log should replay from the store");
        };
        let logged: BTreeMap<u64, serde_json::Value> =
            all.actions.iter().map(|e| (e.server_seq, json(e))).collect();
        for envelope in &d.seen {
            assert_eq!(
                logged.get(&envelope.server_seq),
                Some(&json(envelope)),
                "seq {} not stored",
                envelope.server_seq
            );
        }

        // The device resumes exactly: nothing it saw again, nothing skipped, and the interrupted turns are
        // closed as resumable errors.
        let resumed = relay.connect_host(d.host, &tenant, "user", Role::Member).await;
        let ReconnectResult::Replay(replay) = resumed
            .reconnect(d.client_id.clone(), max_seen as i64, d.chats.clone())
            .await
            .expect("reconnect")
        else {
            panic!("expected an exact replay after restart");
        };
        assert!(
            replay.actions.iter().all(|e| e.server_seq > max_seen),
            "nothing duplicated"
        );
        assert_increasing(&replay.actions);
        let expected: Vec<_> = all.actions.iter().filter(|e| e.server_seq > max_seen).collect();
        assert_eq!(json(&replay.actions), json(&expected), "nothing skipped");

        for chat in &d.chats {
            let (state, from) = d.initial[chat].clone();
            let mine: Vec<ActionEnvelope> = d
                .seen
                .iter()
                .chain(replay.actions.iter())
                .filter(|e| &e.channel == chat)
                .cloned()
                .collect();
            let reduced = reduce_chat(state, from, &mine);
            let (fresh, _, _) = subscribe_chat(&resumed, chat).await;
            assert_eq!(json(&reduced), json(&fresh), "{chat}");
            let last = fresh.turns.last().map(|t| t.state);
            assert!(
                matches!(last, Some(TurnState::Error | TurnState::Complete)),
                "no turn left running"
            );
        }

        // serverSeq continues above everything any client saw.
        let (probe, init) = {
            let c = relay.connect_host(d.host, &tenant, "user", Role::Member).await;
            let init = c
                .initialize(format!("{}-probe", d.client_id), vec!["1.0.0".into()], vec![])
                .await
                .expect("initialize");
            (c, init)
        };
        assert!(init.server_seq as u64 >= max_seen);
        let (_, _, mut sub) = subscribe_chat(&probe, &d.chats[0]).await;
        probe
            .dispatch(d.chats[0].clone(), turn_started("t2", "after the crash"))
            .await
            .expect("dispatch");
        let next = next_envelope(&mut sub).await;
        assert!(
            next.server_seq > max_seen && next.server_seq > replay.actions.last().map_or(0, |e| e.server_seq)
        );
    }
}

on_both_stores!(killed_mid_stream_and_restarted, crash_and_resume);

/// Dispatch `count` draft changes on `chat` and wait until all of them are committed and echoed back.
async fn stream_drafts(client: &ahp::Client, chat: &str, count: usize) -> Vec<ActionEnvelope> {
    let (_, _, mut sub) = subscribe_chat(client, chat).await;
    let mut last = None;
    for i in 0..count {
        let action = StateAction::ChatDraftChanged(ahp_types::actions::ChatDraftChangedAction {
            draft: Some(message(&format!("draft {i}"))),
        });
        last = Some(
            client
                .dispatch(chat.to_string(), action)
                .await
                .expect("dispatch")
                .client_seq,
        );
    }
    let last = last.expect("at least one");
    collect_until(&mut sub, |e| {
        e.origin.as_ref().is_some_and(|o| o.client_seq == last)
    })
    .await
}

async fn away_for_many_actions(store: TestStore) {
    let tenant = unique_tenant();
    let relay = store.relay(&[]).await;
    let (a, _) = relay.client_as(&tenant, "ana", Role::Member, "away").await;
    let (_, chat) = create_session_and_chat(&a, "busy").await;
    let (_, last_seen, _) = subscribe_chat(&a, &chat).await;
    a.shutdown().await;

    let (b, _) = relay.client_as(&tenant, "ana", Role::Member, "busy-device").await;
    let sent = stream_drafts(&b, &chat, 50_000).await;
    assert_eq!(sent.len(), 50_000);

    let a2 = relay.connect(&tenant, "ana", Role::Member).await;
    let ReconnectResult::Replay(replay) = a2
        .reconnect("away".into(), last_seen as i64, vec![chat.clone()])
        .await
        .expect("reconnect")
    else {
        panic!("a gap inside retention must be replayed exactly");
    };
    assert_eq!(replay.actions.len(), 50_000);
    assert_eq!(json(&replay.actions), json(&sent));
}

on_both_stores!(
    a_client_away_for_50k_actions_replays_from_the_store,
    away_for_many_actions
);

async fn away_past_retention(store: TestStore) {
    let tenant = unique_tenant();
    let relay = store
        .relay(&["--replay-buffer", "5", "--snapshot-every-actions", "10"])
        .await;
    let (a, _) = relay.client_as(&tenant, "ana", Role::Member, "away").await;
    let (_, chat) = create_session_and_chat(&a, "old").await;
    let (_, last_seen, _) = subscribe_chat(&a, &chat).await;
    a.shutdown().await;
    let (b, _) = relay.client_as(&tenant, "ana", Role::Member, "busy-device").await;
    stream_drafts(&b, &chat, 35).await;

    // The retention job compacts everything the snapshots cover.
    store.compact("0s").await;

    let a2 = relay.connect(&tenant, "ana", Role::Member).await;
    let result = a2
        .reconnect("away".into(), last_seen as i64, vec![chat.clone()])
        .await
        .expect("reconnect");
    let ReconnectResult::Snapshot(snapshots) = result else {
        panic!("a gap past retention must get snapshots, got {result:?}");
    };
    assert_eq!(snapshots.snapshots.len(), 1);
    assert_eq!(
        json(&chat_of(&snapshots.snapshots[0])),
        json(&fresh_chat_snapshot_for(&relay, &tenant, &chat).await)
    );
}

on_both_stores!(a_client_away_past_retention_gets_snapshots, away_past_retention);

async fn lazy_restore(store: TestStore) {
    let tenant = unique_tenant();
    let mut relay = store.relay(&[]).await;
    let clients = futures_util::future::join_all((0..4).map(|i| {
        let relay = &relay;
        let tenant = tenant.clone();
        async move {
            relay
                .client_as(&tenant, "ana", Role::Member, &format!("maker-{i}"))
                .await
                .0
        }
    }))
    .await;
    futures_util::future::join_all(clients.iter().enumerate().map(|(i, c)| async move {
        for j in 0..250 {
            create_session_and_chat(c, &format!("s{i}-{j}")).await;
        }
    }))
    .await;
    relay.kill().await;

    let relay = store.relay(&[]).await;
    let (c, _) = relay.client_as(&tenant, "ana", Role::Member, "reader").await;
    let first: ahp_types::commands::ListSessionsResult = c
        .request(
            "listSessions",
            serde_json::json!({"channel": "ahp-root://", "limit": 100}),
        )
        .await
        .expect("list");
    assert_eq!(first.items.len(), 100);
    assert_eq!(
        relay.metric("ahp_relay_sessions_loaded").await,
        0.0,
        "listing loads nothing"
    );
    let (state, _, _) = subscribe_chat(&c, "ahp-chat:/s2-17").await;
    assert!(state.turns.is_empty());
    assert_eq!(
        relay.metric("ahp_relay_sessions_loaded").await,
        1.0,
        "only the touched session is loaded"
    );
    assert_eq!(relay.metric("ahp_relay_chats_loaded").await, 1.0);
}

on_both_stores!(restart_restores_1000_sessions_lazily, lazy_restore);

async fn list_ten_thousand(store: TestStore) {
    let tenant = unique_tenant();
    let relay = store.relay(&[]).await;
    let makers = futures_util::future::join_all((0..8).map(|i| {
        let (relay, tenant) = (&relay, tenant.clone());
        async move {
            relay
                .client_as(&tenant, "ana", Role::Member, &format!("maker-{i}"))
                .await
                .0
        }
    }))
    .await;
    let create = |client: &ahp::Client, uri: String| {
        let client = client.clone();
        async move {
            let _: serde_json::Value = client
                .request(
                    "createSession",
                    serde_json::json!({"channel": uri, "provider": "demo"}),
                )
                .await
                .expect("createSession");
        }
    };
    futures_util::future::join_all(makers.iter().enumerate().map(|(i, c)| async move {
        for j in 0..1_250 {
            create(c, format!("ahp-session:/s{:05}", i * 1_250 + j)).await;
        }
    }))
    .await;

    // Page through all 10,000 while another client keeps creating sessions.
    let (reader, _) = relay.client_as(&tenant, "ana", Role::Member, "reader").await;
    let late = makers[0].clone();
    let creating = tokio::spawn(async move {
        for j in 0..300 {
            create(&late, format!("ahp-session:/late{j:04}")).await;
        }
    });
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page: ahp_types::commands::ListSessionsResult = reader
            .request(
                "listSessions",
                serde_json::json!({"channel": "ahp-root://", "limit": 100, "cursor": cursor}),
            )
            .await
            .expect("listSessions");
        seen.extend(page.items.into_iter().map(|s| (s.resource, s.created_at)));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    creating.await.expect("creator");
    let original: Vec<&(String, String)> = seen
        .iter()
        .filter(|(uri, _)| uri.starts_with("ahp-session:/s"))
        .collect();
    assert_eq!(original.len(), 10_000, "every session listed once");
    let unique: std::collections::HashSet<&String> = seen.iter().map(|(uri, _)| uri).collect();
    assert_eq!(unique.len(), seen.len(), "no duplicates");
    assert!(seen.windows(2).all(|w| w[0].1 >= w[1].1), "newest first");
}

on_both_stores!(
    list_sessions_pages_10000_sessions_during_creation,
    list_ten_thousand
);

async fn thousand_turns(store: TestStore) {
    let tenant = unique_tenant();
    let mut relay = store.relay(&["--demo-step-ms", "1000"]).await;
    let (a, _) = relay.client_as(&tenant, "ana", Role::Member, "writer").await;
    let (_, chat) = create_session_and_chat(&a, "long").await;
    let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
    let mut last = 0;
    for i in 0..1_000 {
        a.dispatch(
            chat.clone(),
            turn_started(&format!("t{i:04}"), &format!("turn {i}")),
        )
        .await
        .expect("start");
        let cancel = StateAction::ChatTurnCancelled(ahp_types::actions::ChatTurnCancelledAction {
            turn_id: format!("t{i:04}"),
            duration: 1,
            meta: None,
        });
        last = a.dispatch(chat.clone(), cancel).await.expect("cancel").client_seq;
    }
    let envs = collect_until(&mut sub, |e| {
        e.origin.as_ref().is_some_and(|o| o.client_seq == last)
    })
    .await;
    assert!(envs.iter().all(|e| e.rejection_reason.is_none()));
    // A snapshot carries the newest turns by default; a client asks for more with `view.turns`.
    let window = fresh_chat_snapshot_for(&relay, &tenant, &chat).await;
    assert_eq!(window.turns.len(), 100);
    assert_eq!(window.turns_next_cursor.as_deref(), Some("turns:900"));
    // A live chat holds its retained turns (and a few more until the next ages out): however many are asked
    // for, the rest are paged in.
    let (observer, _) = relay.client_as(&tenant, "ana", Role::Viewer, "full").await;
    let (result, mut full_sub) = observer
        .subscribe_with_options(
            chat.clone(),
            None,
            Some(ahp_types::commands::SubscribeView { turns: Some(1_000) }),
        )
        .await
        .expect("subscribe");
    let snapshot = result.snapshot.expect("snapshot");
    let mut full = chat_of(&snapshot);
    assert!(
        (100..=125).contains(&full.turns.len()),
        "{} turns in memory",
        full.turns.len()
    );
    fetch_all_turns(
        &observer,
        &mut full_sub,
        &chat,
        &mut full,
        snapshot.from_seq as u64,
    )
    .await;
    let ids: Vec<String> = full.turns.iter().map(|turn| turn.id.clone()).collect();
    let expected: Vec<String> = (0..1_000).map(|i| format!("t{i:04}")).collect();
    assert_eq!(ids, expected);

    let (b, _) = relay.client_as(&tenant, "ana", Role::Member, "reader").await;
    let (result, mut b_sub) = b
        .subscribe_with_options(
            chat.clone(),
            None,
            Some(ahp_types::commands::SubscribeView { turns: Some(20) }),
        )
        .await
        .expect("subscribe");
    let snapshot = result.snapshot.expect("snapshot");
    let mut state = chat_of(&snapshot);
    assert_eq!(state.turns.len(), 20);
    let pages = fetch_all_turns(&b, &mut b_sub, &chat, &mut state, snapshot.from_seq as u64).await;
    assert!(pages >= 1_000 / 50);
    assert_eq!(json(&state), json(&full));
    drop((a, b));

    // After a restart only the newest turns are in memory; the older ones are paged in from the store.
    relay.kill().await;
    let relay = store.relay(&["--retained-turns", "100"]).await;
    let (c, _) = relay.client_as(&tenant, "ana", Role::Member, "late-reader").await;
    let (mut restored, restored_from, mut c_sub) = subscribe_chat(&c, &chat).await;
    assert_eq!(restored.turns.len(), 100, "only the retained turns are inline");
    assert_eq!(
        restored.turns_next_cursor.as_deref(),
        Some("turns:900"),
        "older turns are behind the cursor"
    );
    fetch_all_turns(&c, &mut c_sub, &chat, &mut restored, restored_from).await;
    assert_eq!(
        json(&restored.turns),
        json(&full.turns),
        "the full history, oldest first"
    );
}

on_both_stores!(fetch_turns_pages_a_1000_turn_chat, thousand_turns);

/// Page every older turn of `state` in with `fetchTurns` (as [`fetch_all_turns`]), timing each page from the
/// request to its `chat/turnsLoaded`.
async fn timed_pages(
    client: &ahp::Client,
    sub: &mut ahp::SessionSubscription,
    chat: &str,
    state: &mut ChatState,
) -> Vec<std::time::Duration> {
    let mut times = Vec::new();
    while let Some(cursor) = state.turns_next_cursor.clone() {
        let started = std::time::Instant::now();
        let _: serde_json::Value = client
            .request(
                "fetchTurns",
                serde_json::json!({"channel": chat, "cursor": cursor}),
            )
            .await
            .expect("fetchTurns");
        let loaded = next_envelope(sub).await;
        times.push(started.elapsed());
        assert!(
            matches!(loaded.action, StateAction::ChatTurnsLoaded(_)),
            "{:?}",
            loaded.action
        );
        ahp::reducers::apply_action_to_chat(state, &loaded.action);
    }
    times
}

fn median(mut times: Vec<std::time::Duration>) -> std::time::Duration {
    times.sort();
    times[times.len() / 2]
}

/// Run `turns` turns of `prompt` on `chat` (each started and cancelled by `client`), checking every one was
/// accepted; `each_batch` runs after every 500.
async fn run_turns(
    client: &ahp::Client,
    sub: &mut ahp::SessionSubscription,
    chat: &str,
    turns: usize,
    prompt: &str,
    mut each_batch: impl AsyncFnMut(),
) {
    for batch in 0..turns.div_ceil(500) {
        let mut last = 0;
        for i in batch * 500..((batch + 1) * 500).min(turns) {
            client
                .dispatch(chat.to_string(), turn_started(&format!("t{i:05}"), prompt))
                .await
                .expect("start");
            let cancel = StateAction::ChatTurnCancelled(ahp_types::actions::ChatTurnCancelledAction {
                turn_id: format!("t{i:05}"),
                duration: 1,
                meta: None,
            });
            last = client
                .dispatch(chat.to_string(), cancel)
                .await
                .expect("cancel")
                .client_seq;
        }
        // Echoed (so committed) before the next 500: the test's own memory stays bounded too.
        let envs = collect_until(sub, |e| e.origin.as_ref().is_some_and(|o| o.client_seq == last)).await;
        assert!(envs.iter().all(|e| e.rejection_reason.is_none()));
        each_batch().await;
    }
}

/// Soak: one chat of 10,000 turns holding 50 MiB. A live host keeps only its retained turns (in memory and in
/// every snapshot row), the older ones are one store row each, a page of them takes as long as in a chat of
/// 200 turns, every turn is still paged in in order after a restart, another session of the host keeps working
/// throughout, and a chat at its turn limit refuses the next turn, saying so.
async fn ten_thousand_turns(store: TestStore) {
    const TURNS: usize = 10_000;
    const PROMPT: usize = 5 * 1024;
    let tenant = unique_tenant();
    let flags = [
        "--demo-step-ms",
        "1000",
        "--max-turns-per-chat",
        "10000",
        "--max-reply-bytes",
        "1048576",
    ];
    let mut relay = store.relay(&flags).await;
    let (a, _) = relay.client_as(&tenant, "ana", Role::Member, "writer").await;
    let (_, chat) = create_session_and_chat(&a, "soak").await;
    let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
    let prompt = "p".repeat(PROMPT);
    // A neighbour: another session of the same host, drafting between every 500 turns of the soak.
    let (neighbour, _) = relay.client_as(&tenant, "ned", Role::Member, "neighbour").await;
    let (_, neighbour_chat) = create_session_and_chat(&neighbour, "next-door").await;
    let (neighbour_start, neighbour_from, mut neighbour_sub) =
        subscribe_chat(&neighbour, &neighbour_chat).await;
    let mut drafts = 0;
    let mut neighbour_seen = Vec::new();
    run_turns(&a, &mut sub, &chat, TURNS, &prompt, async || {
        drafts += 1;
        let draft = StateAction::ChatDraftChanged(ahp_types::actions::ChatDraftChangedAction {
            draft: Some(message(&format!("draft {drafts}"))),
        });
        neighbour
            .dispatch(neighbour_chat.clone(), draft)
            .await
            .expect("draft");
        let echo = next_envelope(&mut neighbour_sub).await;
        assert!(echo.rejection_reason.is_none(), "{:?}", echo.rejection_reason);
        neighbour_seen.push(echo);
    })
    .await;
    assert_eq!(neighbour_seen.len(), TURNS / 500);
    assert_increasing(&neighbour_seen);
    assert_eq!(
        json(&reduce_chat(neighbour_start, neighbour_from, &neighbour_seen)),
        json(&fresh_chat_snapshot_for(&relay, &tenant, &neighbour_chat).await),
        "the neighbour's chat is what its own actions made it"
    );

    // The host holds the retained turns (and at most a quarter more), however many are asked for.
    let (viewer, _) = relay.client_as(&tenant, "ana", Role::Viewer, "viewer").await;
    let (result, _viewer_sub) = viewer
        .subscribe_with_options(
            chat.clone(),
            None,
            Some(ahp_types::commands::SubscribeView {
                turns: Some(1_000_000),
            }),
        )
        .await
        .expect("subscribe");
    let inline = chat_of(&result.snapshot.expect("snapshot")).turns.len();
    assert!((100..=125).contains(&inline), "{inline} turns in memory");

    // The 10,001st turn is refused, with the reason.
    a.dispatch(chat.clone(), turn_started("one-too-many", "x"))
        .await
        .expect("dispatch");
    let refused = collect_until(&mut sub, |e| e.rejection_reason.is_some()).await;
    let reason = refused
        .last()
        .and_then(|e| e.rejection_reason.clone())
        .unwrap_or_default();
    assert!(reason.contains("limit of 10000 turns"), "{reason}");

    // A small chat beside it, to compare its pages with.
    let (_, small) = create_session_and_chat(&a, "small").await;
    let (_, _, mut small_sub) = subscribe_chat(&a, &small).await;
    run_turns(&a, &mut small_sub, &small, 200, &prompt, async || {}).await;

    // No stored row grows with the chat: the chat's snapshot holds its retained turns (up to 125 of 5 KiB),
    // and every older turn is a row of its own.
    let largest_snapshot = store
        .number(
            "SELECT CAST(MAX(LENGTH(state)) AS BIGINT) FROM snapshots WHERE tenant = $1",
            &tenant,
        )
        .await;
    assert!(
        largest_snapshot < 2 * 1024 * 1024,
        "a snapshot row of {largest_snapshot} bytes"
    );
    let archived = store
        .number(
            "SELECT CAST(COUNT(*) AS BIGINT) FROM turn_archive WHERE tenant = $1",
            &tenant,
        )
        .await;
    assert!(archived >= 9_875, "{archived} archived turn rows");
    let largest_turn = store
        .number(
            "SELECT CAST(MAX(LENGTH(turn)) AS BIGINT) FROM turn_archive WHERE tenant = $1",
            &tenant,
        )
        .await;
    assert!(
        largest_turn < 8 * 1024,
        "an archived turn row of {largest_turn} bytes"
    );
    drop((a, neighbour, viewer));

    // After a restart every turn is still there, oldest first, paged in; a page of the long chat's archive
    // takes about as long as one of the small chat's (measured in this run: a ratio, not a time).
    relay.kill().await;
    let relay = store.relay(&flags).await;
    let (c, _) = relay.client_as(&tenant, "ana", Role::Member, "reader").await;
    let (mut restored, _, mut c_sub) = subscribe_chat(&c, &chat).await;
    assert_eq!(restored.turns.len(), 100, "the retained turns are inline");
    let long_pages = timed_pages(&c, &mut c_sub, &chat, &mut restored).await;
    assert_eq!(long_pages.len(), (TURNS - 100) / 50);
    assert_eq!(restored.turns.len(), TURNS);
    assert!(restored
        .turns
        .iter()
        .enumerate()
        .all(|(i, turn)| turn.id == format!("t{i:05}")));
    let (mut small_state, _, mut small_sub) = subscribe_chat(&c, &small).await;
    let mut small_pages = Vec::new();
    // The small chat has two pages: read them again (a fresh subscription each time) for enough samples.
    for _ in 0..10 {
        small_pages.extend(timed_pages(&c, &mut small_sub, &small, &mut small_state).await);
        c.unsubscribe(small.clone()).await.expect("unsubscribe");
        (small_state, _, small_sub) = subscribe_chat(&c, &small).await;
    }
    let (long, short) = (median(long_pages), median(small_pages));
    assert!(
        long < short * 5,
        "a page of the 10,000-turn chat took {long:?}, of the 200-turn chat {short:?}"
    );

    // Truncating to an old turn, or forking, loads archived turns back in one logged envelope: bounded. Too far
    // back is refused, saying so (and nothing is loaded); within reach it works.
    let truncate = |turn_id: &str| {
        StateAction::ChatTruncated(ahp_types::actions::ChatTruncatedAction {
            turn_id: Some(turn_id.into()),
        })
    };
    let (_, _, mut t_sub) = subscribe_chat(&c, &chat).await;
    c.dispatch(chat.clone(), truncate("t00010"))
        .await
        .expect("dispatch");
    let refused = next_envelope(&mut t_sub).await;
    let reason = refused.rejection_reason.clone().unwrap_or_default();
    assert!(reason.contains("reaches back at most"), "{:?}", refused);
    let session = "ahp-session:/soak";
    let forked: Result<serde_json::Value, _> = c
        .request(
            "createChat",
            serde_json::json!({"channel": session, "chat": "ahp-chat:/soak-fork",
                "source": {"kind": "fork", "chat": chat, "turnId": "t09990"}}),
        )
        .await;
    match forked {
        Err(ahp::ClientError::Rpc(error)) => {
            assert!(error.message.contains("archived turns"), "{}", error.message)
        }
        other => panic!("a fork of 10,000 turns was made: {other:?}"),
    }
    c.dispatch(chat.clone(), truncate("t09800"))
        .await
        .expect("dispatch");
    let truncated = collect_until(&mut t_sub, |e| matches!(e.action, StateAction::ChatTruncated(_))).await;
    assert!(
        truncated.iter().all(|e| e.rejection_reason.is_none()),
        "{truncated:?}"
    );
    let after = fresh_chat_snapshot_for(&relay, &tenant, &chat).await;
    assert_eq!(after.turns.last().map(|turn| turn.id.as_str()), Some("t09800"));
}

on_both_stores!(a_10000_turn_chat_stays_bounded, ten_thousand_turns);

async fn graceful_shutdown(store: TestStore) {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let tenant = unique_tenant();
    let mut relay = store.relay(&["--demo-step-ms", "50"]).await;
    let (a, _) = relay.client_as(&tenant, "ana", Role::Member, "device").await;
    let (_, chat) = create_session_and_chat(&a, "deploy").await;
    let (_, from, mut sub) = subscribe_chat(&a, &chat).await;
    a.dispatch(chat.clone(), turn_started("t1", "a reply long enough to be cut"))
        .await
        .expect("dispatch");
    let seen = [next_envelope(&mut sub).await, next_envelope(&mut sub).await];

    // A raw socket sees how the relay closes connections on SIGTERM.
    let url = format!(
        "{}?access_token={}",
        relay.url(),
        relay.token(&tenant, "ana", Role::Member)
    );
    let (mut raw, _) = tokio_tungstenite::connect_async(url).await.expect("connect");
    assert!(relay.terminate().await, "clean exit");
    let close = loop {
        match tokio::time::timeout(PATIENCE, raw.next())
            .await
            .expect("close in time")
        {
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    assert_eq!(
        close.map(|f| u16::from(f.code)),
        Some(1012),
        "clients are told to reconnect"
    );

    // The next process serves the session: the client resumes exactly.
    let relay = store.relay(&[]).await;
    let last_seen = seen.last().map(|e| e.server_seq).expect("seen");
    let resumed = relay.connect(&tenant, "ana", Role::Member).await;
    let ReconnectResult::Replay(replay) = resumed
        .reconnect("device".into(), last_seen as i64, vec![chat.clone()])
        .await
        .expect("reconnect")
    else {
        panic!("expected an exact replay after a graceful restart");
    };
    assert!(replay.actions.iter().all(|e| e.server_seq > last_seen));
    assert!(from < last_seen);
    let (fresh, _, _) = subscribe_chat(&resumed, &chat).await;
    assert!(fresh.active_turn.is_none(), "the interrupted turn is closed");
}

on_both_stores!(
    sigterm_closes_with_1012_and_the_next_process_resumes,
    graceful_shutdown
);
