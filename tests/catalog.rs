//! The session catalogue and chat history: `listSessions` paging, `root/*` notifications, `fetchTurns`,
//! and active clients released after their grace period.

mod support;

use std::collections::HashSet;

use ahp::SubscriptionEvent;
use ahp_types::actions::{SessionActiveClientSetAction, StateAction};
use ahp_types::commands::{ListSessionsResult, SubscribeView};
use ahp_types::state::SessionActiveClient;
use support::*;

async fn list_page(client: &ahp::Client, cursor: Option<String>, limit: i64) -> ListSessionsResult {
    client
        .request(
            "listSessions",
            serde_json::json!({"channel": "ahp-root://", "limit": limit, "cursor": cursor}),
        )
        .await
        .expect("listSessions")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_sessions_pages_newest_first_without_gaps_while_sessions_are_created() {
    let relay = Relay::start().await;
    let (a, _) = relay.client("lister").await;
    let (b, _) = relay.client("creator").await;
    for i in 0..60 {
        create_session_and_chat(&a, &format!("s{i:03}")).await;
    }
    // Page through while another client keeps creating sessions.
    let creator = tokio::spawn(async move {
        for i in 0..40 {
            create_session_and_chat(&b, &format!("late{i:03}")).await;
        }
    });
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = list_page(&a, cursor, 7).await;
        assert!(page.items.len() <= 7);
        seen.extend(page.items.into_iter().map(|s| s.resource));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    creator.await.expect("creator");
    // Every session that existed when paging started appears exactly once, newest first.
    let original: Vec<String> = (0..60).rev().map(|i| format!("ahp-session:/s{i:03}")).collect();
    let listed_original: Vec<&String> = seen.iter().filter(|s| s.contains("/s")).collect();
    assert_eq!(listed_original, original.iter().collect::<Vec<_>>());
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no session listed twice");

    // A bad cursor is InvalidParams.
    let bad: Result<ListSessionsResult, _> = a
        .request(
            "listSessions",
            serde_json::json!({"channel": "ahp-root://", "cursor": "bogus"}),
        )
        .await;
    assert!(matches!(bad, Err(ahp::ClientError::Rpc(e)) if e.code == -32602));
}

/// Issue 25 (11): `listSessions` with `_meta["ahpRelay/titleContains"]` lists the sessions whose title holds
/// the text (ignoring case), newest first, paged without gaps or duplicates — including sessions far beyond the
/// first page of the unfiltered list and across the shard's scan batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_sessions_searches_titles_across_the_whole_catalogue() {
    let relay = Relay::start().await;
    let (a, _) = relay.client("searcher").await;
    let mut expected = Vec::new();
    // More than one scan batch (200 entries), so a search page continues from one batch into the next.
    for i in 0..230 {
        let (session, _) = create_session_and_chat(&a, &format!("q{i:03}")).await;
        let title = if i % 10 == 3 {
            format!("Launch plan {i}")
        } else if i == 5 || i == 225 {
            format!("Rare find {i}")
        } else {
            format!("Other work {i}")
        };
        a.dispatch(
            session,
            StateAction::SessionTitleChanged(ahp_types::actions::SessionTitleChangedAction {
                title: title.clone(),
            }),
        )
        .await
        .expect("title");
        if title.starts_with("Launch") {
            expected.push(title);
        }
    }
    expected.reverse();
    let search = |cursor: Option<String>, text: serde_json::Value| {
        let a = &a;
        async move {
            a.request::<_, ListSessionsResult>(
                "listSessions",
                serde_json::json!({
                    "channel": "ahp-root://", "limit": 2, "cursor": cursor,
                    "_meta": {"ahpRelay/titleContains": text},
                }),
            )
            .await
        }
    };
    // The titles are set by actions after creation: wait until the catalogue has the last one.
    let last = expected[0].clone();
    tokio::time::timeout(PATIENCE, async {
        while !search(None, "launch".into())
            .await
            .expect("search")
            .items
            .iter()
            .any(|s| s.title == last)
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the catalogue has the titles");
    let mut found = Vec::new();
    let mut cursor = None;
    loop {
        let page = search(cursor, "LAUNCH".into()).await.expect("search");
        assert!(page.items.len() <= 2);
        found.extend(page.items.into_iter().map(|s| s.title));
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(found, expected, "every match, newest first, once");
    // Two matches 220 entries apart: one page, read across two scan batches.
    let rare = search(None, "rare find".into()).await.expect("search");
    let titles: Vec<&str> = rare.items.iter().map(|s| s.title.as_str()).collect();
    assert_eq!(titles, ["Rare find 225", "Rare find 5"]);
    assert!(search(None, "nothing like it".into())
        .await
        .expect("search")
        .items
        .is_empty());
    let wrong = search(None, serde_json::json!(7))
        .await
        .expect_err("a number is not a search");
    assert!(wrong.to_string().contains("titleContains"), "{wrong}");
    // Without the key, the list is unfiltered.
    assert_eq!(list_page(&a, None, 50).await.items.len(), 50);
}

/// Issue 36 (12): `listSessions` with `_meta["ahpRelay/textContains"]` finds sessions by what was said in them —
/// a prompt or a reply, in memory, in the store after a restart (nothing loaded), and in turns archived out of
/// a chat's live state — and by title; ignoring case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_sessions_searches_what_was_said_in_memory_in_the_store_and_in_the_archive() {
    let data = tempfile::tempdir().expect("data dir");
    // One turn kept in a chat's live state: older ones go to the turn archive.
    let args = ["--retained-turns", "1", "--demo-step-ms", "1"];
    let mut relay = Relay::start_in(data.path(), &args).await;
    let (a, _) = relay.client("searcher").await;
    let mut sessions = Vec::new();
    for (name, prompts) in [
        ("archived", &["the Zanzibar plan", "second", "third"][..]),
        ("live", &["a ripe mango"][..]),
        ("quiet", &[][..]),
    ] {
        let (session, chat) = create_session_and_chat(&a, name).await;
        // A title of its own first: the session is not named after its first prompt (a search must find the
        // turns, not the title).
        a.dispatch(
            session.clone(),
            StateAction::SessionTitleChanged(ahp_types::actions::SessionTitleChangedAction {
                title: format!("Session {name}"),
            }),
        )
        .await
        .expect("title");
        let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
        for (i, prompt) in prompts.iter().enumerate() {
            a.dispatch(chat.clone(), turn_started(&format!("t{i}"), prompt))
                .await
                .expect("prompt");
            collect_until(&mut sub, is_turn_complete).await;
        }
        sessions.push(session);
    }
    a.dispatch(
        sessions[2].clone(),
        StateAction::SessionTitleChanged(ahp_types::actions::SessionTitleChangedAction {
            title: "A quiet one".into(),
        }),
    )
    .await
    .expect("title");
    let search = |client: ahp::Client, text: &'static str| async move {
        let page: ListSessionsResult = client
            .request(
                "listSessions",
                serde_json::json!({"channel": "ahp-root://", "_meta": {"ahpRelay/textContains": text}}),
            )
            .await
            .expect("search");
        page.items.into_iter().map(|s| s.resource).collect::<Vec<_>>()
    };
    let (archived, live, quiet) = (sessions[0].clone(), sessions[1].clone(), sessions[2].clone());
    // The title is an action after creation: wait until the catalogue has it.
    tokio::time::timeout(PATIENCE, async {
        while search(a.clone(), "quiet one").await != [quiet.clone()] {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the catalogue has the title");
    assert_eq!(
        search(a.clone(), "ZANZIBAR").await,
        std::slice::from_ref(&archived),
        "an archived prompt"
    );
    assert_eq!(
        search(a.clone(), "ripe mango").await,
        std::slice::from_ref(&live),
        "a prompt in memory"
    );
    // The demo's reply says "Hello from the demo agent": every session with a turn.
    let replied = search(a.clone(), "hello from the demo").await;
    assert_eq!(replied.len(), 2, "{replied:?}");
    assert!(search(a.clone(), "nothing like it").await.is_empty());
    // After a restart nothing is loaded: the store is searched.
    relay.kill().await;
    let relay = Relay::start_in(data.path(), &args).await;
    let (b, _) = relay.client("searcher-2").await;
    assert_eq!(
        search(b.clone(), "ripe MANGO").await,
        [live],
        "a prompt in the store"
    );
    assert_eq!(
        search(b.clone(), "zanzibar").await,
        [archived],
        "an archived prompt, after a restart"
    );
    assert_eq!(search(b.clone(), "a quiet").await, [quiet], "a title");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_notifications_announce_sessions_and_their_titles() {
    let relay = Relay::start().await;
    let (watcher, _) = relay.client("watcher").await;
    let mut root = watcher.attach_subscription("ahp-root://").await;
    let (maker, _) = relay.client("maker").await;
    let (session, chat) = create_session_and_chat(&maker, "announced").await;

    let added = next_matching(&mut root, |e| matches!(e, SubscriptionEvent::SessionAdded(_))).await;
    let SubscriptionEvent::SessionAdded(added) = added else {
        unreachable!()
    };
    assert_eq!(added.summary.resource, session);
    assert_eq!(added.summary.provider, "demo");

    maker
        .dispatch(chat.clone(), turn_started("t1", "plan the launch party"))
        .await
        .expect("dispatch");
    let titled = next_matching(
        &mut root,
        |e| matches!(e, SubscriptionEvent::SessionSummaryChanged(c) if c.changes.title.is_some()),
    )
    .await;
    let SubscriptionEvent::SessionSummaryChanged(change) = titled else {
        unreachable!()
    };
    assert_eq!(change.session, session);
    assert_eq!(change.changes.title.as_deref(), Some("plan the launch party"));

    let _: serde_json::Value = maker
        .request("disposeSession", serde_json::json!({"channel": session}))
        .await
        .expect("dispose");
    let removed = next_matching(&mut root, |e| matches!(e, SubscriptionEvent::SessionRemoved(_))).await;
    let SubscriptionEvent::SessionRemoved(removed) = removed else {
        unreachable!()
    };
    assert_eq!(removed.session, session);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_turns_pages_older_turns_into_a_limited_snapshot() {
    let relay = Relay::start().await;
    let (a, _) = relay.client("historian").await;
    let (_, chat) = create_session_and_chat(&a, "history").await;
    let (_, _, mut sub) = subscribe_chat(&a, &chat).await;
    for i in 0..5 {
        a.dispatch(chat.clone(), turn_started(&format!("t{i}"), &format!("turn {i}")))
            .await
            .expect("dispatch");
        collect_until(&mut sub, is_turn_complete).await;
    }
    let full = fresh_chat_snapshot(&relay, &chat).await;
    assert_eq!(full.turns.len(), 5);

    let (b, _) = relay.client("reader").await;
    let (result, mut b_sub) = b
        .subscribe_with_options(chat.clone(), None, Some(SubscribeView { turns: Some(2) }))
        .await
        .expect("subscribe");
    let snapshot = result.snapshot.expect("snapshot");
    let mut state = chat_of(&snapshot);
    assert_eq!(state.turns.len(), 2);
    fetch_all_turns(&b, &mut b_sub, &chat, &mut state, snapshot.from_seq as u64).await;
    assert_eq!(json(&state), json(&full));

    let bad: Result<serde_json::Value, _> = b
        .request(
            "fetchTurns",
            serde_json::json!({"channel": chat, "cursor": "nope"}),
        )
        .await;
    assert!(matches!(bad, Err(ahp::ClientError::Rpc(e)) if e.code == -32602));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_active_client_is_removed_after_its_grace_period() {
    let relay = Relay::start_with(&["--active-client-grace-ms", "300"]).await;
    let (a, _) = relay.client("phone").await;
    let (b, _) = relay.client("laptop").await;
    let (session, _) = create_session_and_chat(&a, "presence").await;
    let (_, mut b_sub) = b.subscribe(session.clone()).await.expect("subscribe");
    let _ = a.subscribe(session.clone()).await.expect("subscribe");
    a.dispatch(
        session.clone(),
        StateAction::SessionActiveClientSet(SessionActiveClientSetAction {
            active_client: SessionActiveClient {
                client_id: "phone".into(),
                display_name: Some("Phone".into()),
                tools: vec![],
                customizations: None,
            },
        }),
    )
    .await
    .expect("dispatch");
    let set = collect_until(&mut b_sub, |e| {
        matches!(e.action, StateAction::SessionActiveClientSet(_))
    })
    .await;
    assert!(set.last().is_some_and(|e| e.rejection_reason.is_none()));

    a.shutdown().await;
    let removed = collect_until(&mut b_sub, |e| {
        matches!(e.action, StateAction::SessionActiveClientRemoved(_))
    })
    .await;
    let StateAction::SessionActiveClientRemoved(r) = &removed[removed.len() - 1].action else {
        unreachable!()
    };
    assert_eq!(r.client_id, "phone");
    assert!(
        removed.last().is_some_and(|e| e.origin.is_none()),
        "removed by the host"
    );
}

async fn next_matching(
    sub: &mut ahp::SessionSubscription,
    wanted: impl Fn(&SubscriptionEvent) -> bool,
) -> SubscriptionEvent {
    loop {
        let event = tokio::time::timeout(PATIENCE, sub.recv())
            .await
            .expect("timed out")
            .expect("closed");
        if wanted(&event) {
            return event;
        }
    }
}
