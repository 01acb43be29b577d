//! AHP 1.0 conformance of the served commands (issue 14): one test per rule the relay used to break, with raw
//! frames where the official client would hide the difference. Rules 1–4 are checked in the embedded relay
//! and in the distributed shape (one shard, two gateways, Redis); the official reducers replay what clients
//! received and must agree with a fresh snapshot.

mod support;

use ahp::SubscriptionEvent;
use ahp_types::actions::{
    ActionEnvelope, ChatDraftChangedAction, ChatPendingMessageSetAction, ChatTruncatedAction,
    ChatWorkingDirectorySetAction, SessionConfigChangedAction, SessionWorkingDirectoryRemovedAction,
    StateAction,
};
use ahp_types::commands::{CreateChatParams, CreateSessionParams, SubscribeView};
use ahp_types::state::{
    ChatOrigin, ChatState, MessageKind, PendingMessageKind, ResponsePart, SessionStatus, SideChatSelection,
    TurnState,
};
use relay_core::Role;
use serde_json::{json, Value};
use support::raw::*;
use support::redis_bus::{channel_of, wait_subscribers};
use support::*;

/// Where a test's clients connect: one embedded relay, or two gateways in front of a shard over Redis.
enum Shape {
    Embedded(Relay),
    Distributed {
        shard: Box<Shard>,
        gateways: Box<[Relay; 2]>,
        tenant: String,
    },
}

impl Shape {
    async fn embedded() -> Shape {
        Shape::Embedded(Relay::start().await)
    }

    /// `None` (the test is skipped) without `REDIS_URL`; scripts/test always sets it.
    async fn distributed() -> Option<Shape> {
        let Ok(url) = std::env::var("REDIS_URL") else {
            eprintln!("skipped: REDIS_URL not set");
            return None;
        };
        let shard = Box::new(Shard::start(&["--redis-url", &url]).await);
        let gateways = Box::new([
            Relay::gateway_with(&shard.url, &["--redis-url", &url]).await,
            Relay::gateway_with(&shard.url, &["--redis-url", &url]).await,
        ]);
        Some(Shape::Distributed {
            shard,
            gateways,
            tenant: unique_tenant(),
        })
    }

    fn tenant(&self) -> &str {
        match self {
            Shape::Embedded(_) => "dev",
            Shape::Distributed { tenant, .. } => tenant,
        }
    }

    /// The entry point clients numbered `i` use: the second gateway for odd `i` in the distributed shape.
    fn entry(&self, i: usize) -> &Relay {
        match self {
            Shape::Embedded(relay) => relay,
            Shape::Distributed { gateways, .. } => &gateways[i % 2],
        }
    }

    async fn client(&self, i: usize, client_id: &str) -> ahp::Client {
        let (client, _) = self
            .entry(i)
            .client_as(self.tenant(), client_id, Role::Member, client_id)
            .await;
        client
    }

    async fn raw(&self, i: usize, sub: &str) -> Socket {
        raw_as(self.entry(i), self.tenant(), sub, Role::Member).await
    }

    /// Wait until both gateways follow the tenant's host over Redis (the host is open once a client is).
    async fn settle(&self) {
        if let (Shape::Distributed { tenant, .. }, Ok(url)) = (self, std::env::var("REDIS_URL")) {
            let mut control = redis::Client::open(url.as_str())
                .expect("redis url")
                .get_multiplexed_async_connection()
                .await
                .expect("redis");
            wait_subscribers(&mut control, &channel_of(tenant), 2).await;
        }
    }

    /// The shard side's counter `series`.
    async fn shard_metric(&self, series: &str) -> f64 {
        match self {
            Shape::Embedded(relay) => relay.metric(series).await,
            Shape::Distributed { shard, .. } => shard.metric(series).await,
        }
    }
}

/// Two tests of one check: `<name>::embedded` and `<name>::distributed` (skipped without `REDIS_URL`).
macro_rules! in_both_shapes {
    ($name:ident, $check:ident) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                $check(&Shape::embedded().await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn distributed() {
                if let Some(shape) = Shape::distributed().await {
                    $check(&shape).await;
                }
            }
        }
    };
}

fn frame(method: &str, id: Option<u64>, params: Value) -> String {
    let mut frame = json!({"jsonrpc": "2.0", "method": method, "params": params});
    if let Some(id) = id {
        frame["id"] = json!(id);
    }
    frame.to_string()
}

/// Send a ping and assert that its answer is the very next frame: nothing was sent before it.
async fn next_frame_answers_ping(socket: &mut Socket, id: u64) {
    send(socket, frame("ping", Some(id), json!({}))).await;
    assert_eq!(
        recv(socket).await,
        json!({"jsonrpc": "2.0", "id": id, "result": null}),
        "a frame arrived before the answer to ping {id}"
    );
}

fn dispatch_frame(channel: &str, client_seq: u64, action: Value) -> String {
    frame(
        "dispatchAction",
        None,
        json!({"channel": channel, "clientSeq": client_seq, "action": action}),
    )
}

/// Run `count` demo turns `t0..` in a chat, each to completion.
async fn run_turns(client: &ahp::Client, chat: &str, count: usize) {
    let (_, _, mut sub) = subscribe_chat(client, chat).await;
    for i in 0..count {
        client
            .dispatch(chat.into(), turn_started(&format!("t{i}"), &format!("turn {i}")))
            .await
            .expect("dispatch");
        collect_until(&mut sub, is_turn_complete).await;
    }
    client.unsubscribe(chat.into()).await.expect("unsubscribe");
}

fn turn_ids(state: &ChatState) -> Vec<String> {
    state.turns.iter().map(|t| t.id.clone()).collect()
}

/// The next envelope on `sub` answering this client's `client_seq`.
async fn echo_of(sub: &mut ahp::SessionSubscription, client_id: &str, client_seq: u64) -> ActionEnvelope {
    loop {
        let envelope = next_envelope(sub).await;
        if envelope
            .origin
            .as_ref()
            .is_some_and(|o| o.client_id == client_id && o.client_seq == client_seq as i64)
        {
            return envelope;
        }
    }
}

// ---- 1. Notifications are never answered ------------------------------------------------------------------

async fn notifications_are_never_answered(shape: &Shape) {
    let owner = shape.client(0, "owner").await;
    let (_, chat) = create_session_and_chat(&owner, "quiet").await;
    let mut s = shape.raw(1, "raw").await;

    // Before initialize.
    send(
        &mut s,
        dispatch_frame(&chat, 1, json!({"type": "chat/draftChanged"})),
    )
    .await;
    next_frame_answers_ping(&mut s, 1).await;
    initialize(&mut s, "raw-client").await;
    // An unknown notification.
    send(
        &mut s,
        frame("noSuchNotification", None, json!({"channel": chat})),
    )
    .await;
    next_frame_answers_ping(&mut s, 2).await;
    // dispatchAction with bad params.
    send(
        &mut s,
        frame(
            "dispatchAction",
            None,
            json!({"channel": chat, "clientSeq": "x", "action": {"type": "chat/draftChanged"}}),
        ),
    )
    .await;
    next_frame_answers_ping(&mut s, 3).await;
    // An action on a chat that does not exist is ignored without an echo.
    send(
        &mut s,
        dispatch_frame("ahp-chat:/nowhere", 4, json!({"type": "chat/draftChanged"})),
    )
    .await;
    next_frame_answers_ping(&mut s, 4).await;

    // Logged and counted instead (each shape's shard serves this test alone).
    let refused = shape.shard_metric("ahp_relay_notifications_refused_total").await;
    assert!(refused >= 3.0, "refused notifications counted: {refused}");
}

in_both_shapes!(notifications_are_never_answered, notifications_are_never_answered);

// ---- 2. The dispatcher always gets its echo -------------------------------------------------------------

async fn an_unsubscribed_dispatcher_gets_its_echo(shape: &Shape) {
    let owner = shape.client(0, "owner").await;
    let (_, chat) = create_session_and_chat(&owner, "echo").await;
    let (state, from, mut owner_sub) = subscribe_chat(&owner, &chat).await;

    // Device B never subscribes to the chat.
    let mut b = shape.raw(1, "device-b").await;
    initialize(&mut b, "device-b").await;
    shape.settle().await;
    let draft = json!({"type": "chat/draftChanged", "draft": {"text": "from b", "origin": {"kind": "user"}}});
    send(&mut b, dispatch_frame(&chat, 1, draft)).await;
    let echo = recv(&mut b).await;
    assert_eq!(echo["method"], "action", "{echo}");
    assert_eq!(
        echo["params"]["origin"],
        json!({"clientId": "device-b", "clientSeq": 1})
    );
    assert!(echo["params"].get("rejectionReason").is_none(), "{echo}");

    // A refused one comes back to it with its reason.
    send(
        &mut b,
        dispatch_frame(&chat, 2, json!({"type": "chat/turnCancelled", "turnId": "none"})),
    )
    .await;
    let rejected = recv(&mut b).await;
    assert_eq!(rejected["params"]["origin"]["clientSeq"], 2, "{rejected}");
    assert!(rejected["params"]["rejectionReason"].is_string(), "{rejected}");
    next_frame_answers_ping(&mut b, 10).await;

    // Subscribers see the accepted action, and their state agrees with a fresh snapshot.
    let seen = echo_of(&mut owner_sub, "device-b", 1).await;
    assert_eq!(
        seen.server_seq,
        echo["params"]["serverSeq"].as_u64().expect("seq")
    );
    assert_eq!(
        json(&reduce_chat(state, from, &[seen])),
        json(&fresh_chat_snapshot_for(shape.entry(0), shape.tenant(), &chat).await)
    );
}

in_both_shapes!(
    an_unsubscribed_dispatcher_gets_its_echo,
    an_unsubscribed_dispatcher_gets_its_echo
);

// ---- 3. Session status follows its chats ----------------------------------------------------------------

fn status_of(event: &SubscriptionEvent) -> Option<u32> {
    match event {
        SubscriptionEvent::SessionSummaryChanged(change) => change.changes.status,
        _ => None,
    }
}

async fn next_status(root: &mut ahp::SessionSubscription, wanted: impl Fn(u32) -> bool) -> u32 {
    loop {
        let event = tokio::time::timeout(PATIENCE, root.recv())
            .await
            .expect("timed out waiting for a session status")
            .expect("root closed");
        if let Some(status) = status_of(&event).filter(|s| wanted(*s)) {
            return status;
        }
    }
}

async fn listed_status(client: &ahp::Client, session: &str) -> u32 {
    let listed: ahp_types::commands::ListSessionsResult = client
        .request("listSessions", json!({"channel": "ahp-root://"}))
        .await
        .expect("listSessions");
    listed
        .items
        .iter()
        .find(|s| s.resource == session)
        .map(|s| s.status)
        .expect("listed")
}

async fn session_status_follows_its_chats(shape: &Shape) {
    let user = shape.client(0, "user").await;
    let watcher = shape.client(1, "watcher").await;
    let mut root = watcher.attach_subscription("ahp-root://").await;
    let (session, chat) = create_session_and_chat(&user, "busy").await;
    let (session_sub_result, mut session_sub) = watcher.subscribe(session.clone()).await.expect("subscribe");
    let session_state = session_of(&session_sub_result.snapshot.expect("snapshot"));
    shape.settle().await;
    let has = |status: u32, flag: SessionStatus| status & flag.bits() == flag.bits();

    // "tool" makes the demo agent ask before running a tool: the session needs input.
    user.dispatch(chat.clone(), turn_started("t1", "use the tool"))
        .await
        .expect("dispatch");
    next_status(&mut root, |s| has(s, SessionStatus::InProgress)).await;
    next_status(&mut root, |s| has(s, SessionStatus::InputNeeded)).await;
    assert!(has(
        listed_status(&watcher, &session).await,
        SessionStatus::InputNeeded
    ));

    // The session channel mirrors the pending confirmation, so a client of the session alone can answer it.
    let mut session_envelopes = Vec::new();
    let request = loop {
        let envelope = next_envelope(&mut session_sub).await;
        session_envelopes.push(envelope.clone());
        if let StateAction::SessionInputNeededSet(set) = &envelope.action {
            break set.request.clone();
        }
    };
    let ahp_types::state::SessionInputRequest::ToolConfirmation(confirmation) = request else {
        panic!("expected a tool confirmation, got {request:?}");
    };
    assert_eq!(confirmation.chat, chat);
    let tool_call_id = match &confirmation.tool_call {
        ahp_types::state::ToolCallConfirmationState::PendingConfirmation(s) => s.tool_call_id.clone(),
        other => panic!("unexpected {other:?}"),
    };
    // The watcher answers without subscribing to the chat.
    watcher
        .dispatch(chat.clone(), confirm_tool_call("t1", &tool_call_id, true))
        .await
        .expect("confirm");
    loop {
        let envelope = next_envelope(&mut session_sub).await;
        session_envelopes.push(envelope.clone());
        if matches!(envelope.action, StateAction::SessionInputNeededRemoved(_)) {
            break;
        }
    }
    let idle = next_status(&mut root, |s| has(s, SessionStatus::Idle)).await;
    assert!(!has(idle, SessionStatus::InputNeeded));
    assert!(has(listed_status(&watcher, &session).await, SessionStatus::Idle));

    // The official reducers agree with a fresh snapshot of the session.
    let mut reduced = session_state;
    for envelope in &session_envelopes {
        ahp::reducers::apply_action_to_session(&mut reduced, &envelope.action);
    }
    let reader = shape.client(0, "reader").await;
    loop {
        // Catch up with what the fresh snapshot includes (the turn's last summary updates).
        let (fresh, _) = reader.subscribe(session.clone()).await.expect("fresh");
        let fresh = session_of(&fresh.snapshot.expect("snapshot"));
        reader.unsubscribe(session.clone()).await.expect("unsubscribe");
        if json(&fresh) == json(&reduced) {
            break;
        }
        let envelope = next_envelope(&mut session_sub).await;
        ahp::reducers::apply_action_to_session(&mut reduced, &envelope.action);
    }
}

in_both_shapes!(session_status_follows_its_chats, session_status_follows_its_chats);

// ---- 4. fetchTurns writes its page before it responds ---------------------------------------------------

async fn fetch_turns_answers_after_its_page(shape: &Shape) {
    let owner = shape.client(0, "owner").await;
    let (_, chat) = create_session_and_chat(&owner, "paged").await;
    run_turns(&owner, &chat, 3).await;

    let mut s = shape.raw(1, "reader").await;
    initialize(&mut s, "reader").await;
    shape.settle().await;
    send(
        &mut s,
        frame(
            "subscribe",
            Some(1),
            json!({"channel": chat, "view": {"turns": 1}}),
        ),
    )
    .await;
    let subscribed = answer_to(&mut s, 1).await;
    let cursor = subscribed["result"]["snapshot"]["state"]["turnsNextCursor"].clone();
    assert!(cursor.is_string(), "{subscribed}");
    for (id, params) in [
        (2, json!({"channel": chat, "cursor": cursor})),
        (3, json!({"channel": chat})),
    ] {
        send(&mut s, frame("fetchTurns", Some(id), params)).await;
        let first = recv(&mut s).await;
        assert_eq!(
            first["method"], "action",
            "the page comes before the answer: {first}"
        );
        assert_eq!(first["params"]["action"]["type"], "chat/turnsLoaded", "{first}");
        let answer = recv(&mut s).await;
        assert_eq!(answer["id"], id, "{answer}");
        assert!(answer.get("result").is_some(), "{answer}");
    }
}

in_both_shapes!(
    fetch_turns_answers_after_its_page,
    fetch_turns_answers_after_its_page
);

// ---- 5. fetchTurns without a cursor loads the next older page -------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_turns_without_a_cursor_loads_what_the_connection_lacks() {
    let relay = Relay::start().await;
    let (owner, _) = relay.client("owner").await;
    let (_, chat) = create_session_and_chat(&owner, "older").await;
    run_turns(&owner, &chat, 5).await;

    let (reader, _) = relay.client("reader").await;
    let (result, mut sub) = reader
        .subscribe_with_options(chat.clone(), None, Some(SubscribeView { turns: Some(2) }))
        .await
        .expect("subscribe");
    let snapshot = result.snapshot.expect("snapshot");
    let mut state = chat_of(&snapshot);
    assert_eq!(turn_ids(&state), ["t3", "t4"]);
    let mut pages = Vec::new();
    for _ in 0..2 {
        let _: Value = reader
            .request("fetchTurns", json!({"channel": chat}))
            .await
            .expect("fetchTurns");
        let loaded = next_envelope(&mut sub).await;
        let StateAction::ChatTurnsLoaded(page) = &loaded.action else {
            panic!("expected chat/turnsLoaded, got {:?}", loaded.action);
        };
        pages.push(page.turns.iter().map(|t| t.id.clone()).collect::<Vec<_>>());
        ahp::reducers::apply_action_to_chat(&mut state, &loaded.action);
    }
    // Each page is the one before what the connection holds; the cursor only moves back.
    assert_eq!(pages, [vec!["t0", "t1", "t2"], Vec::<&str>::new()]);
    assert_eq!(turn_ids(&state), ["t0", "t1", "t2", "t3", "t4"]);
    assert!(state.turns_next_cursor.is_none());
    assert_eq!(json(&state), json(&fresh_chat_snapshot(&relay, &chat).await));
}

// ---- 6. Operations on archived turns load them first ----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_on_archived_turns_load_them_first() {
    let data = tempfile::tempdir().expect("tempdir");
    let flags = ["--retained-turns", "2"];
    let mut relay = Relay::start_in(data.path(), &flags).await;
    let (owner, _) = relay.client("owner").await;
    let (session, chat) = create_session_and_chat(&owner, "archived").await;
    run_turns(&owner, &chat, 5).await;
    owner.shutdown().await;
    assert!(relay.terminate().await);
    // Restored with 2 turns retained: t0..t2 are in the store's archive.
    let relay = Relay::start_in(data.path(), &flags).await;
    let (owner, _) = relay.client("owner").await;
    let (state, from, mut sub) = subscribe_chat(&owner, &chat).await;
    assert_eq!(turn_ids(&state), ["t3", "t4"]);

    // Truncating to an archived turn: every subscriber first gets the turns it needs, then the truncation.
    owner
        .dispatch(
            chat.clone(),
            StateAction::ChatTruncated(ChatTruncatedAction {
                turn_id: Some("t1".into()),
            }),
        )
        .await
        .expect("truncate");
    let envelopes = collect_until(&mut sub, |e| matches!(e.action, StateAction::ChatTruncated(_))).await;
    assert!(envelopes.iter().all(|e| e.rejection_reason.is_none()));
    assert!(envelopes
        .iter()
        .any(|e| matches!(e.action, StateAction::ChatTurnsLoaded(_))));
    let reduced = reduce_chat(state, from, &envelopes);
    assert_eq!(turn_ids(&reduced), ["t1"]);
    assert_eq!(json(&reduced), json(&fresh_chat_snapshot(&relay, &chat).await));
    // What is before t1 still pages in from the archive.
    let (reader, _) = relay.client("reader").await;
    let (mut paged, paged_from, mut paged_sub) = subscribe_chat(&reader, &chat).await;
    fetch_all_turns(&reader, &mut paged_sub, &chat, &mut paged, paged_from).await;
    assert_eq!(turn_ids(&paged), ["t0", "t1"]);

    // A fork from an archived turn copies the history through it.
    let fork = "ahp-chat:/archived-fork".to_string();
    let _: Value = owner
        .request(
            "createChat",
            json!({"channel": session, "chat": fork, "source": {"kind": "fork", "chat": chat, "turnId": "t0"}}),
        )
        .await
        .expect("fork from an archived turn");
    assert_eq!(turn_ids(&fresh_chat_snapshot(&relay, &fork).await), ["t0"]);

    // Truncating the whole chat leaves nothing to page back in, now or after a restart.
    owner
        .dispatch(
            chat.clone(),
            StateAction::ChatTruncated(ChatTruncatedAction { turn_id: None }),
        )
        .await
        .expect("truncate all");
    let _ = collect_until(
        &mut sub,
        |e| matches!(&e.action, StateAction::ChatTruncated(t) if t.turn_id.is_none()),
    )
    .await;
    let _: Value = owner
        .request("fetchTurns", json!({"channel": chat}))
        .await
        .expect("fetchTurns");
    let StateAction::ChatTurnsLoaded(page) = next_envelope(&mut sub).await.action else {
        panic!("expected chat/turnsLoaded");
    };
    assert!(page.turns.is_empty() && page.turns_next_cursor.is_none());
    let emptied = fresh_chat_snapshot(&relay, &chat).await;
    assert!(emptied.turns.is_empty() && emptied.turns_next_cursor.is_none());
    drop(relay);
    let relay = Relay::start_in(data.path(), &flags).await;
    let restored = fresh_chat_snapshot(&relay, &chat).await;
    assert!(restored.turns.is_empty() && restored.turns_next_cursor.is_none());
}

// ---- 7. Retained turns: the same before and after a restart ---------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_without_view_returns_the_retained_turns_before_and_after_a_restart() {
    let data = tempfile::tempdir().expect("tempdir");
    let flags = ["--retained-turns", "3"];
    let mut relay = Relay::start_in(data.path(), &flags).await;
    let (owner, _) = relay.client("owner").await;
    let (_, chat) = create_session_and_chat(&owner, "retained").await;
    run_turns(&owner, &chat, 5).await;
    let before = fresh_chat_snapshot(&relay, &chat).await;
    assert_eq!(turn_ids(&before), ["t2", "t3", "t4"]);
    owner.shutdown().await;
    assert!(relay.terminate().await);

    let relay = Relay::start_in(data.path(), &flags).await;
    let after = fresh_chat_snapshot(&relay, &chat).await;
    assert_eq!(turn_ids(&after), turn_ids(&before));
    assert_eq!(after.turns_next_cursor, before.turns_next_cursor);
    // And fetchTurns pages the rest from where the snapshot stops.
    let (reader, _) = relay.client("reader").await;
    let (mut state, from, mut sub) = subscribe_chat(&reader, &chat).await;
    fetch_all_turns(&reader, &mut sub, &chat, &mut state, from).await;
    assert_eq!(turn_ids(&state), ["t0", "t1", "t2", "t3", "t4"]);
}

// ---- 8. Validation holes -------------------------------------------------------------------------------

fn agent_message(text: &str) -> ahp_types::state::Message {
    let mut m = message(text);
    m.origin.kind = MessageKind::Agent;
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_that_would_corrupt_shared_state_are_refused() {
    let relay = Relay::start().await;
    let (owner, _) = relay.client("owner").await;
    let session = "ahp-session:/dirs".to_string();
    let chat = "ahp-chat:/dirs-chat".to_string();
    let (primary, other) = ("file:///work/a".to_string(), "file:///work/b".to_string());
    let _: Value = owner
        .request(
            "createSession",
            CreateSessionParams {
                channel: session.clone(),
                meta: None,
                provider: Some("demo".into()),
                working_directories: Some(vec![primary.clone(), other.clone()]),
                config: None,
                active_client: None,
                progress_token: None,
            },
        )
        .await
        .expect("createSession");
    // A chat's working directories must be the session's.
    let outside = owner
        .request::<_, Value>(
            "createChat",
            CreateChatParams {
                channel: session.clone(),
                meta: None,
                chat: "ahp-chat:/elsewhere".into(),
                initial_message: None,
                source: None,
                working_directories: Some(vec!["file:///etc".into()]),
            },
        )
        .await;
    assert!(matches!(outside, Err(ahp::ClientError::Rpc(e)) if e.code == -32602));
    let _: Value = owner
        .request(
            "createChat",
            CreateChatParams {
                channel: session.clone(),
                meta: None,
                chat: chat.clone(),
                initial_message: None,
                source: None,
                working_directories: Some(vec![other.clone()]),
            },
        )
        .await
        .expect("createChat");
    let (chat_state, chat_from, mut chat_sub) = subscribe_chat(&owner, &chat).await;
    let (session_result, mut session_sub) = owner.subscribe(session.clone()).await.expect("subscribe");
    let session_state = session_of(&session_result.snapshot.expect("snapshot"));

    let mut chat_seen = Vec::new();
    let mut session_seen = Vec::new();
    let mut verdicts = Vec::new();
    let mut client_seq = 0;
    for (channel, action, accepted) in [
        (
            &chat,
            StateAction::ChatWorkingDirectorySet(ChatWorkingDirectorySetAction {
                directory: "file:///etc".into(),
            }),
            false,
        ),
        (
            &chat,
            StateAction::ChatWorkingDirectorySet(ChatWorkingDirectorySetAction {
                directory: primary.clone(),
            }),
            true,
        ),
        (
            &session,
            StateAction::SessionWorkingDirectoryRemoved(SessionWorkingDirectoryRemovedAction {
                directory: primary.clone(),
            }),
            false,
        ),
        (
            &session,
            StateAction::SessionWorkingDirectoryRemoved(SessionWorkingDirectoryRemovedAction {
                directory: other.clone(),
            }),
            true,
        ),
        (
            &session,
            StateAction::SessionConfigChanged(SessionConfigChangedAction {
                config: serde_json::from_value(json!({"model": "other"})).expect("object"),
                replace: None,
            }),
            false,
        ),
        (
            &chat,
            turn_started_with("t1", agent_message("I am the agent")),
            false,
        ),
        (
            &chat,
            StateAction::ChatPendingMessageSet(ChatPendingMessageSetAction {
                kind: PendingMessageKind::Queued,
                id: "q1".into(),
                message: agent_message("queued by a forger"),
            }),
            false,
        ),
        (
            &chat,
            StateAction::ChatDraftChanged(ChatDraftChangedAction {
                draft: Some(agent_message("draft")),
            }),
            false,
        ),
        (
            &chat,
            StateAction::ChatDraftChanged(ChatDraftChangedAction {
                draft: Some(message("my draft")),
            }),
            true,
        ),
    ] {
        client_seq += 1;
        owner.dispatch(channel.clone(), action).await.expect("dispatch");
        let sub = if channel == &chat {
            &mut chat_sub
        } else {
            &mut session_sub
        };
        // Up to the echo, keeping what the host itself applied meanwhile (a directory leaving the session
        // leaves its chats too), so the clients' reduction sees everything.
        let seen = if channel == &chat {
            &mut chat_seen
        } else {
            &mut session_seen
        };
        let echo = loop {
            let envelope = next_envelope(sub).await;
            let own = envelope
                .origin
                .as_ref()
                .is_some_and(|o| o.client_id == "owner" && o.client_seq == client_seq as i64);
            if own {
                break envelope;
            }
            seen.push(envelope);
        };
        verdicts.push((client_seq, echo.rejection_reason.is_none(), accepted));
        seen.push(echo);
    }
    let wrong: Vec<_> = verdicts.iter().filter(|(_, got, want)| got != want).collect();
    assert!(wrong.is_empty(), "(clientSeq, accepted, expected): {wrong:?}");

    // Host and clients agree.
    assert_eq!(
        json(&reduce_chat(chat_state, chat_from, &chat_seen)),
        json(&fresh_chat_snapshot(&relay, &chat).await)
    );
    let mut reduced = session_state;
    for envelope in session_seen.iter().filter(|e| e.rejection_reason.is_none()) {
        ahp::reducers::apply_action_to_session(&mut reduced, &envelope.action);
    }
    assert_eq!(reduced.working_directories, Some(vec![primary.clone()]));
}

// ---- 9. Steering ----------------------------------------------------------------------------------------

fn markdown_of(state: &ChatState, turn_id: &str) -> String {
    state
        .turns
        .iter()
        .find(|t| t.id == turn_id)
        .map(|t| {
            t.response_parts
                .iter()
                .filter_map(|p| match p {
                    ResponsePart::Markdown(m) => Some(m.content.clone()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steering_reaches_the_running_agent_and_queued_messages_still_run() {
    let relay = Relay::start_with(&["--demo-step-ms", "30"]).await;
    let (owner, _) = relay.client("owner").await;
    let (_, chat) = create_session_and_chat(&owner, "steer").await;
    let (state, from, mut sub) = subscribe_chat(&owner, &chat).await;
    owner
        .dispatch(chat.clone(), turn_started("t1", "write a long answer"))
        .await
        .expect("dispatch");
    let pending = |kind, id: &str, text: &str| {
        StateAction::ChatPendingMessageSet(ChatPendingMessageSetAction {
            kind,
            id: id.into(),
            message: message(text),
        })
    };
    owner
        .dispatch(
            chat.clone(),
            pending(PendingMessageKind::Steering, "s1", "focus on tests"),
        )
        .await
        .expect("steer");
    owner
        .dispatch(
            chat.clone(),
            pending(PendingMessageKind::Queued, "q1", "and then this"),
        )
        .await
        .expect("queue");
    // t1 completes, then the queued message runs as the next turn, to completion.
    let mut envelopes = collect_until(&mut sub, is_turn_complete).await;
    envelopes.extend(collect_until(&mut sub, is_turn_complete).await);
    assert!(envelopes.iter().all(|e| e.rejection_reason.is_none()));
    let state = reduce_chat(state, from, &envelopes);
    assert!(
        state.steering_message.is_none(),
        "the steering message was consumed"
    );
    assert!(state.queued_messages.iter().flatten().next().is_none());
    assert!(
        markdown_of(&state, "t1").contains("Steering taken: \"focus on tests\""),
        "{}",
        markdown_of(&state, "t1")
    );
    let second = state.turns.last().expect("a second turn");
    assert_eq!(second.message.text, "and then this");
    assert_eq!(json(&state), json(&fresh_chat_snapshot(&relay, &chat).await));
}

// ---- 10. Side chats -------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_chat_keeps_its_selection_and_copies_no_turns() {
    let relay = Relay::start_with(&["--demo-step-ms", "30"]).await;
    let (owner, _) = relay.client("owner").await;
    let (session, chat) = create_session_and_chat(&owner, "side").await;
    run_turns(&owner, &chat, 1).await;
    let (_, _, mut sub) = subscribe_chat(&owner, &chat).await;
    owner
        .dispatch(chat.clone(), turn_started("t1", "a running turn"))
        .await
        .expect("dispatch");
    let _ = collect_until(&mut sub, |e| matches!(e.action, StateAction::ChatTurnStarted(_))).await;

    let selection = SideChatSelection {
        text: "the selected words".into(),
        response_part_id: Some("t0-reply".into()),
    };
    for (side, turn_id) in [("ahp-chat:/side-done", "t0"), ("ahp-chat:/side-active", "t1")] {
        let _: Value = owner
            .request(
                "createChat",
                json!({"channel": session, "chat": side, "source": {
                    "kind": "sideChat", "chat": chat, "turnId": turn_id, "selection": selection}}),
            )
            .await
            .unwrap_or_else(|e| panic!("side chat from {turn_id}: {e:?}"));
        let state = fresh_chat_snapshot(&relay, side).await;
        assert!(state.turns.is_empty(), "a side chat copies no turns");
        assert_eq!(
            state.origin,
            Some(ChatOrigin::SideChat {
                chat: chat.clone(),
                turn_id: turn_id.into(),
                selection: Some(selection.clone()),
            })
        );
    }
}

// ---- 11. Only versions the relay speaks ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_0_9_is_never_claimed() {
    let relay = Relay::start().await;
    let mut s = raw(&relay).await;
    send(
        &mut s,
        frame(
            "initialize",
            Some(1),
            json!({"channel": "ahp-root://", "protocolVersions": ["0.9.0"], "clientId": "old"}),
        ),
    )
    .await;
    let reply = recv(&mut s).await;
    assert_eq!(error_code(&reply), -32005, "{reply}");
}

// ---- 12. Smaller rules ----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_notifications_go_to_root_subscribers_only() {
    let relay = Relay::start().await;
    let mut bystander = raw(&relay).await;
    initialize(&mut bystander, "bystander").await;
    let mut listener = raw(&relay).await;
    send(
        &mut listener,
        frame(
            "initialize",
            Some(1),
            json!({"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "listener",
                "initialSubscriptions": ["ahp-root://"]}),
        ),
    )
    .await;
    answer_to(&mut listener, 1).await;
    let (maker, _) = relay.client("maker").await;
    let (session, _) = create_session_and_chat(&maker, "announced").await;
    let added = recv(&mut listener).await;
    assert_eq!(added["method"], "root/sessionAdded", "{added}");
    assert_eq!(added["params"]["summary"]["resource"], json!(session));
    // The bystander's bus already carried it: it was filtered, not delayed.
    next_frame_answers_ping(&mut bystander, 7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_sessions_lists_the_most_recently_modified_first() {
    let relay = Relay::start().await;
    let (owner, _) = relay.client("owner").await;
    let (_, older_chat) = create_session_and_chat(&owner, "older").await;
    create_session_and_chat(&owner, "newer").await;
    // A turn in the older session (its start time, which the client gives, is later than anything else, and
    // within the clock skew a host accepts).
    let (_, _, mut sub) = subscribe_chat(&owner, &older_chat).await;
    let later = message("later");
    let in_a_minute = format!(
        "{:.3}",
        jiff::Timestamp::now() + jiff::SignedDuration::from_secs(60)
    );
    let started = turn_started_at("t0", &in_a_minute, later);
    owner
        .dispatch(older_chat.clone(), started)
        .await
        .expect("dispatch");
    collect_until(&mut sub, is_turn_complete).await;
    let listed: ahp_types::commands::ListSessionsResult = owner
        .request("listSessions", json!({"channel": "ahp-root://"}))
        .await
        .expect("listSessions");
    let order: Vec<&str> = listed.items.iter().map(|s| s.resource.as_str()).collect();
    assert_eq!(order, ["ahp-session:/older", "ahp-session:/newer"]);
    let paged: ahp_types::commands::ListSessionsResult = owner
        .request("listSessions", json!({"channel": "ahp-root://", "limit": 1}))
        .await
        .expect("listSessions");
    let rest: ahp_types::commands::ListSessionsResult = owner
        .request(
            "listSessions",
            json!({"channel": "ahp-root://", "limit": 1, "cursor": paged.next_cursor}),
        )
        .await
        .expect("listSessions");
    assert_eq!(rest.items[0].resource, "ahp-session:/newer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_channels_get_the_right_error_and_unknown_initial_subscriptions_are_named() {
    let relay = Relay::start().await;
    let mut s = raw(&relay).await;
    send(
        &mut s,
        frame(
            "initialize",
            Some(1),
            json!({"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "c",
                "initialSubscriptions": ["ahp-root://", "ahp-chat:/nope"]}),
        ),
    )
    .await;
    let init = answer_to(&mut s, 1).await;
    assert_eq!(
        init["result"]["_meta"]["ahpRelay/unavailableSubscriptions"],
        json!(["ahp-chat:/nope"]),
        "{init}"
    );
    for (id, channel, code) in [
        (2, "ahp-session:/x/annotations", -32008),
        (3, "ahp-session:/x", -32001),
        (4, "ahp-chat:/x", -32008),
    ] {
        send(&mut s, frame("subscribe", Some(id), json!({"channel": channel}))).await;
        assert_eq!(error_code(&answer_to(&mut s, id).await), code, "{channel}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_carries_the_rejections_and_echoes_a_dropped_client_is_owed() {
    let relay = Relay::start().await;
    let (owner, _) = relay.client("owner").await;
    let (_, chat) = create_session_and_chat(&owner, "owed").await;
    let (_, other_chat) = create_session_and_chat(&owner, "unwatched").await;

    let mut s = raw(&relay).await;
    initialize(&mut s, "phone").await;
    send(&mut s, frame("subscribe", Some(1), json!({"channel": chat}))).await;
    let subscribed = answer_to(&mut s, 1).await;
    let last_seen = subscribed["result"]["snapshot"]["fromSeq"]
        .as_u64()
        .expect("fromSeq");
    // A refused action, and an accepted one on a chat the phone does not subscribe to; then the phone
    // drops without reading anything.
    send(
        &mut s,
        dispatch_frame(&chat, 1, json!({"type": "chat/turnCancelled", "turnId": "none"})),
    )
    .await;
    let draft = json!({"type": "chat/draftChanged", "draft": {"text": "hi", "origin": {"kind": "user"}}});
    send(&mut s, dispatch_frame(&other_chat, 2, draft)).await;
    // Once the ping is answered both were handled; what arrived is forgotten (the phone died before
    // applying it).
    send(&mut s, frame("ping", Some(2), json!({}))).await;
    loop {
        if answer_is(&recv(&mut s).await, 2) {
            break;
        }
    }
    drop(s);

    let mut again = raw(&relay).await;
    send(
        &mut again,
        frame(
            "reconnect",
            Some(1),
            json!({"channel": "ahp-root://", "clientId": "phone", "lastSeenServerSeq": last_seen,
                "subscriptions": [chat]}),
        ),
    )
    .await;
    let replay = answer_to(&mut again, 1).await;
    let actions = replay["result"]["actions"].as_array().expect("a replay").clone();
    let mine: Vec<&Value> = actions
        .iter()
        .filter(|a| a["origin"]["clientId"] == "phone")
        .collect();
    assert_eq!(mine.len(), 2, "{replay}");
    assert_eq!(mine[0]["origin"]["clientSeq"], 1);
    assert!(mine[0]["rejectionReason"].is_string());
    assert_eq!(mine[1]["origin"]["clientSeq"], 2);
    assert!(mine[1].get("rejectionReason").is_none());
    let seqs: Vec<u64> = actions.iter().filter_map(|a| a["serverSeq"].as_u64()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
}

fn answer_is(frame: &Value, id: u64) -> bool {
    frame["id"].as_u64() == Some(id)
}

// ---- Issue 24 (2). Client timestamps and durations are checked; a chat never freezes on one ------------

/// A `chat/turnStarted` whose `startedAt` is not a timestamp, or is far from the host's clock, and a
/// `chat/turnCancelled` with a negative or impossible duration are rejected with the reason; the chat goes on
/// (a valid turn then runs and completes).
async fn client_timestamps_and_durations_are_checked(shape: &Shape) {
    let client = shape.client(0, "stamper").await;
    let (_, chat) = create_session_and_chat(&client, "stamps").await;
    let (_, _, mut sub) = subscribe_chat(&client, &chat).await;
    let rejected = |reason: &Option<String>, needle: &str| {
        reason.as_deref().is_some_and(|reason| reason.contains(needle))
    };
    for (started_at, needle) in [
        ("now", "ISO 8601"),
        ("2099-01-01T00:00:00.000Z", "away from the host's clock"),
        ("2001-01-01T00:00:00.000Z", "away from the host's clock"),
    ] {
        let seq = client
            .dispatch(chat.clone(), turn_started_at("bad", started_at, message("x")))
            .await
            .expect("dispatch")
            .client_seq;
        let echo = collect_until(&mut sub, |e| {
            e.origin.as_ref().is_some_and(|o| o.client_seq == seq)
        })
        .await;
        let reason = &echo.last().expect("echo").rejection_reason;
        assert!(rejected(reason, needle), "{started_at}: {reason:?}");
    }
    // A real turn (it waits for an answer to its question, so it is still running whatever the machine's
    // pace), cancelled with impossible durations (refused), then with a true one.
    client
        .dispatch(chat.clone(), turn_started("t1", "ask me for input"))
        .await
        .expect("dispatch");
    collect_until(&mut sub, |e| {
        matches!(e.action, StateAction::ChatInputRequested(_))
    })
    .await;
    for (duration, needle) in [(-5, "negative"), (1_000_000_000, "longer than the turn has run")] {
        let cancel = StateAction::ChatTurnCancelled(ahp_types::actions::ChatTurnCancelledAction {
            turn_id: "t1".into(),
            duration,
            meta: None,
        });
        let seq = client
            .dispatch(chat.clone(), cancel)
            .await
            .expect("dispatch")
            .client_seq;
        let echo = collect_until(&mut sub, |e| {
            e.origin.as_ref().is_some_and(|o| o.client_seq == seq)
        })
        .await;
        let reason = &echo.last().expect("echo").rejection_reason;
        assert!(rejected(reason, needle), "{duration}: {reason:?}");
    }
    let cancel = StateAction::ChatTurnCancelled(ahp_types::actions::ChatTurnCancelledAction {
        turn_id: "t1".into(),
        duration: 1,
        meta: None,
    });
    client.dispatch(chat.clone(), cancel).await.expect("dispatch");
    collect_until(&mut sub, |e| {
        matches!(e.action, StateAction::ChatTurnCancelled(_)) && e.rejection_reason.is_none()
    })
    .await;
    let state = fresh_chat_snapshot_for(shape.entry(0), shape.tenant(), &chat).await;
    assert!(state.active_turn.is_none(), "the chat is not frozen");
}

in_both_shapes!(
    client_timestamps_and_durations_are_checked,
    client_timestamps_and_durations_are_checked
);

/// A chat stored with a turn whose start time the reducers cannot read (from before timestamps were
/// checked) is not frozen: after a restart the host closes the interrupted turn and the chat takes new turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_unreadable_turn_start_does_not_freeze_its_chat() {
    use sqlx::{Connection, Executor};
    let data = tempfile::tempdir().expect("tempdir");
    let mut relay = Relay::start_in(data.path(), &["--demo-step-ms", "5000"]).await;
    let (client, _) = relay.client("frozen").await;
    let (_, chat) = create_session_and_chat(&client, "frozen").await;
    let (_, _, mut sub) = subscribe_chat(&client, &chat).await;
    let started_at = now_timestamp();
    client
        .dispatch(chat.clone(), turn_started_at("t1", &started_at, message("slow")))
        .await
        .expect("dispatch");
    collect_until(&mut sub, |e| matches!(e.action, StateAction::ChatTurnStarted(_))).await;
    client.shutdown().await;
    relay.kill().await;
    // What a release before the check could have stored.
    let mut store = sqlx::SqliteConnection::connect(&format!(
        "sqlite://{}",
        data.path().join("relay.sqlite").display()
    ))
    .await
    .expect("open the store");
    for table in ["log", "snapshots"] {
        let column = if table == "log" { "envelope" } else { "state" };
        store
            .execute(
                format!(
                    "UPDATE {table} SET {column} = replace({column}, '\"startedAt\":\"{started_at}\"', \
                     '\"startedAt\":\"now\"')"
                )
                .as_str(),
            )
            .await
            .expect("rewrite");
    }
    store.close().await.expect("close");

    let relay = Relay::start_in(data.path(), &[]).await;
    let (client, _) = relay.client("frozen").await;
    let (state, _, mut sub) = subscribe_chat(&client, &chat).await;
    assert!(
        state.active_turn.is_none(),
        "the interrupted turn is still in progress"
    );
    assert_eq!(state.turns.last().map(|turn| turn.state), Some(TurnState::Error));
    client
        .dispatch(chat.clone(), turn_started("t2", "again"))
        .await
        .expect("dispatch");
    collect_until(&mut sub, is_turn_complete).await;
}

// ---- Issue 24 (10). Queued messages run however the turn before them ended ---------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_message_runs_after_a_cancelled_turn() {
    let relay = Relay::start_with(&["--demo-step-ms", "200"]).await;
    let (owner, _) = relay.client("owner").await;
    let (_, chat) = create_session_and_chat(&owner, "queue-after-cancel").await;
    let (_, _, mut sub) = subscribe_chat(&owner, &chat).await;
    owner
        .dispatch(chat.clone(), turn_started("t1", "write a long answer"))
        .await
        .expect("dispatch");
    owner
        .dispatch(
            chat.clone(),
            StateAction::ChatPendingMessageSet(ChatPendingMessageSetAction {
                kind: PendingMessageKind::Queued,
                id: "q1".into(),
                message: message("and then this"),
            }),
        )
        .await
        .expect("queue");
    let cancel = StateAction::ChatTurnCancelled(ahp_types::actions::ChatTurnCancelledAction {
        turn_id: "t1".into(),
        duration: 1,
        meta: None,
    });
    owner.dispatch(chat.clone(), cancel).await.expect("cancel");
    // The queued message becomes the next turn, which runs to completion.
    let envelopes = collect_until(&mut sub, is_turn_complete).await;
    assert!(
        envelopes.iter().all(|e| e.rejection_reason.is_none()),
        "{envelopes:?}"
    );
    let started = envelopes.iter().find_map(|e| match &e.action {
        StateAction::ChatTurnStarted(started) if started.turn_id != "t1" => Some(started.clone()),
        _ => None,
    });
    let started = started.expect("a turn started from the queue");
    assert_eq!(started.queued_message_id.as_deref(), Some("q1"));
    assert_eq!(started.message.text, "and then this");
}

// ---- Issue 24 (5). A refused operation loads no archived turns --------------------------------------

/// A viewer's `chat/truncated` naming an archived turn is rejected and brings nothing back: no
/// `chat/turnsLoaded` reaches the chat's subscribers (the next thing the member sees is its own draft).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewers_truncation_of_an_archived_turn_loads_nothing() {
    let data = tempfile::tempdir().expect("tempdir");
    let flags = ["--retained-turns", "2"];
    let mut relay = Relay::start_in(data.path(), &flags).await;
    let (member, _) = relay.client_as("dev", "mia", Role::Member, "mia").await;
    let (_, chat) = create_session_and_chat(&member, "archived").await;
    let (_, _, mut sub) = subscribe_chat(&member, &chat).await;
    for n in 0..4 {
        member
            .dispatch(chat.clone(), turn_started(&format!("t{n}"), "hello"))
            .await
            .expect("dispatch");
        collect_until(&mut sub, is_turn_complete).await;
    }
    member.shutdown().await;
    relay.kill().await;
    // After a restart t0 and t1 are archived.
    let relay = Relay::start_in(data.path(), &flags).await;
    let (member, _) = relay.client_as("dev", "mia", Role::Member, "mia").await;
    let (state, _, mut sub) = subscribe_chat(&member, &chat).await;
    assert_eq!(state.turns.first().map(|turn| turn.id.as_str()), Some("t2"));
    let (viewer, _) = relay.client_as("dev", "vic", Role::Viewer, "vic").await;
    let (_, _, mut viewer_sub) = subscribe_chat(&viewer, &chat).await;
    let truncate = StateAction::ChatTruncated(ChatTruncatedAction {
        turn_id: Some("t0".into()),
    });
    viewer.dispatch(chat.clone(), truncate).await.expect("dispatch");
    let refused = next_envelope(&mut viewer_sub).await;
    assert!(
        refused
            .rejection_reason
            .as_deref()
            .is_some_and(|r| r.contains("viewer")),
        "{refused:?}"
    );
    member
        .dispatch(
            chat.clone(),
            StateAction::ChatDraftChanged(ChatDraftChangedAction {
                draft: Some(message("next")),
            }),
        )
        .await
        .expect("dispatch");
    let next = next_envelope(&mut sub).await;
    assert!(
        matches!(next.action, StateAction::ChatDraftChanged(_)),
        "the member saw {:?} first",
        next.action
    );
}

// ---- Issue 24 (14). A promoted status overrides the lead chat's activity bits ------------------------

/// A session whose default chat runs a turn while another chat is in error shows `Error` alone in its
/// activity bits (the spec's aggregation: promoted, it overrides), never `InProgress | Error` (10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_errored_chat_overrides_the_sessions_activity_bits() {
    let data = tempfile::tempdir().expect("tempdir");
    let mut relay = Relay::start_in(data.path(), &["--demo-step-ms", "5000"]).await;
    let (owner, _) = relay.client("owner").await;
    let (session, failed_chat) = create_session_and_chat(&owner, "mixed").await;
    let (_, _, mut sub) = subscribe_chat(&owner, &failed_chat).await;
    owner
        .dispatch(failed_chat.clone(), turn_started("t1", "slow"))
        .await
        .expect("dispatch");
    collect_until(&mut sub, |e| matches!(e.action, StateAction::ChatTurnStarted(_))).await;
    owner.shutdown().await;
    // Killed mid-turn: after the restart that chat is in error.
    relay.kill().await;
    let relay = Relay::start_in(data.path(), &["--demo-step-ms", "5000"]).await;
    let (owner, _) = relay.client("owner").await;
    let running_chat = "ahp-chat:/mixed-running".to_string();
    let _: serde_json::Value = owner
        .request("createChat", json!({"channel": session, "chat": running_chat}))
        .await
        .expect("createChat");
    owner
        .dispatch(
            session.clone(),
            StateAction::SessionDefaultChatChanged(ahp_types::actions::SessionDefaultChatChangedAction {
                default_chat: Some(running_chat.clone()),
            }),
        )
        .await
        .expect("dispatch");
    let (_, _, mut running) = subscribe_chat(&owner, &running_chat).await;
    owner
        .dispatch(running_chat.clone(), turn_started("t2", "slow"))
        .await
        .expect("dispatch");
    collect_until(&mut running, |e| {
        matches!(e.action, StateAction::ChatTurnStarted(_))
    })
    .await;
    let listed: ahp_types::commands::ListSessionsResult = owner
        .request("listSessions", json!({"channel": "ahp-root://"}))
        .await
        .expect("listSessions");
    let summary = listed
        .items
        .iter()
        .find(|s| s.resource == session)
        .expect("listed");
    assert_eq!(
        summary.status & 0x1f,
        SessionStatus::Error.bits(),
        "status {}",
        summary.status
    );
}

// ---- Issue 24 (11). More validation holes ---------------------------------------------------------------

/// `createChat` refuses an `initialMessage` that is not a user's, and a fork inherits its source chat's working
/// directories (naming others is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_chat_checks_its_initial_message_and_a_fork_inherits_its_directories() {
    let relay = Relay::start().await;
    let (owner, _) = relay.client("owner").await;
    let session = "ahp-session:/forks".to_string();
    let (primary, other) = ("file:///work/a".to_string(), "file:///work/b".to_string());
    let _: Value = owner
        .request(
            "createSession",
            json!({"channel": session, "provider": "demo", "workingDirectories": [primary, other]}),
        )
        .await
        .expect("createSession");
    let code = |result: Result<Value, ahp::ClientError>| match result {
        Err(ahp::ClientError::Rpc(error)) => error.code,
        other => panic!("expected an error, got {other:?}"),
    };
    let forged = owner
        .request::<_, Value>(
            "createChat",
            json!({"channel": session, "chat": "ahp-chat:/forged",
                "initialMessage": agent_message("I am the agent")}),
        )
        .await;
    assert_eq!(code(forged), -32602);
    // The source: a chat on `other` only, with a turn.
    let source = "ahp-chat:/forks-source".to_string();
    let _: Value = owner
        .request(
            "createChat",
            json!({"channel": session, "chat": source, "workingDirectories": [other]}),
        )
        .await
        .expect("createChat");
    let (_, _, mut sub) = subscribe_chat(&owner, &source).await;
    owner
        .dispatch(source.clone(), turn_started("t0", "hello"))
        .await
        .expect("dispatch");
    collect_until(&mut sub, is_turn_complete).await;
    let fork = |chat: &str, directories: Option<Vec<String>>| {
        let mut params = json!({"channel": session, "chat": chat,
            "source": {"kind": "fork", "chat": source, "turnId": "t0"}});
        if let Some(directories) = directories {
            params["workingDirectories"] = json!(directories);
        }
        owner.request::<_, Value>("createChat", params)
    };
    assert_eq!(
        code(fork("ahp-chat:/fork-elsewhere", Some(vec![primary.clone()])).await),
        -32602
    );
    fork("ahp-chat:/fork", None).await.expect("fork");
    let forked = fresh_chat_snapshot(&relay, "ahp-chat:/fork").await;
    assert_eq!(forked.working_directories, Some(vec![other.clone()]));
}

// ---- Issue 24 (12). Paging edges --------------------------------------------------------------------

/// `fetchTurns` without a cursor pages what the connection holds; a connection not subscribed to the chat
/// holds nothing to page from and is told so (it used to get the same page every time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursorless_fetch_turns_needs_a_subscription() {
    let relay = Relay::start_with(&["--retained-turns", "1"]).await;
    let (owner, _) = relay.client("owner").await;
    let (_, chat) = create_session_and_chat(&owner, "paged").await;
    let (_, _, mut sub) = subscribe_chat(&owner, &chat).await;
    for n in 0..3 {
        owner
            .dispatch(chat.clone(), turn_started(&format!("t{n}"), "hello"))
            .await
            .expect("dispatch");
        collect_until(&mut sub, is_turn_complete).await;
    }
    let (reader, _) = relay.client("reader").await;
    let refused = reader
        .request::<_, Value>("fetchTurns", json!({"channel": chat}))
        .await;
    match refused {
        Err(ahp::ClientError::Rpc(error)) => {
            assert_eq!(error.code, -32602);
            assert!(error.message.contains("subscribe"), "{}", error.message);
        }
        other => panic!("an unsubscribed cursor-less fetch was answered: {other:?}"),
    }
    // Subscribed, the same call pages in the older turns.
    let (_, _, mut reader_sub) = subscribe_chat(&reader, &chat).await;
    let _: Value = reader
        .request("fetchTurns", json!({"channel": chat}))
        .await
        .expect("fetchTurns");
    let page = next_envelope(&mut reader_sub).await;
    assert!(
        matches!(page.action, StateAction::ChatTurnsLoaded(_)),
        "{:?}",
        page.action
    );
}

/// A directory removed from a session leaves its chats too: no chat keeps a directory outside its session's
/// set (issue 24, 11).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_removed_from_a_session_leaves_its_chats() {
    let relay = Relay::start().await;
    let (owner, _) = relay.client("owner").await;
    let session = "ahp-session:/shrinking".to_string();
    let (primary, other) = ("file:///work/a".to_string(), "file:///work/b".to_string());
    let _: Value = owner
        .request(
            "createSession",
            json!({"channel": session, "provider": "demo", "workingDirectories": [primary, other]}),
        )
        .await
        .expect("createSession");
    let chat = "ahp-chat:/on-both".to_string();
    let _: Value = owner
        .request(
            "createChat",
            json!({"channel": session, "chat": chat, "workingDirectories": [primary, other]}),
        )
        .await
        .expect("createChat");
    let (_, mut session_sub) = owner.subscribe(session.clone()).await.expect("subscribe");
    owner
        .dispatch(
            session.clone(),
            StateAction::SessionWorkingDirectoryRemoved(SessionWorkingDirectoryRemovedAction {
                directory: other.clone(),
            }),
        )
        .await
        .expect("dispatch");
    let removed = next_envelope(&mut session_sub).await;
    assert!(removed.rejection_reason.is_none(), "{removed:?}");
    let state = fresh_chat_snapshot(&relay, &chat).await;
    assert_eq!(state.working_directories, Some(vec![primary.clone()]));
}

// ---- Issue 24 (1): every session starts with its default chat ------------------------------------------

/// `createSession` gives the session its default chat (listed, `defaultChat`, subscribable, prompted by a
/// client that creates no chat), and one device's session is another's; a side chat's selection must not be
/// empty.
async fn a_session_starts_with_its_default_chat(shape: &Shape) {
    let owner = shape.client(0, "owner").await;
    let other = shape.client(1, "other").await;
    let session = "ahp-session:/starts".to_string();
    let _: Value = owner
        .request("createSession", json!({"channel": session, "provider": "demo"}))
        .await
        .expect("createSession");
    let (result, _sub) = other.subscribe(session.clone()).await.expect("subscribe");
    let state = session_of(&result.snapshot.expect("snapshot"));
    let default_chat = state.default_chat.clone().expect("a default chat");
    assert_eq!(
        state.chats.iter().map(|c| c.resource.clone()).collect::<Vec<_>>(),
        vec![default_chat.clone()]
    );
    // The other device prompts it without creating anything.
    let (_, _, mut sub) = subscribe_chat(&other, &default_chat).await;
    other
        .dispatch(default_chat.clone(), turn_started("t1", "hello"))
        .await
        .expect("dispatch");
    let ended = collect_until(&mut sub, |e| {
        matches!(
            e.action,
            StateAction::ChatTurnComplete(_) | StateAction::ChatError(_) | StateAction::ChatTurnCancelled(_)
        )
    })
    .await;
    assert!(
        matches!(
            ended.last().map(|e| &e.action),
            Some(StateAction::ChatTurnComplete(_))
        ),
        "{ended:?}"
    );
    let empty = owner
        .request::<_, Value>(
            "createChat",
            json!({"channel": session, "chat": "ahp-chat:/starts-side",
                "source": {"kind": "sideChat", "chat": default_chat, "turnId": "t1", "selection": {"text": ""}}}),
        )
        .await;
    assert!(
        matches!(&empty, Err(ahp::ClientError::Rpc(e)) if e.code == -32602 && e.message.contains("selection")),
        "{empty:?}"
    );
}

in_both_shapes!(
    a_session_starts_with_its_default_chat,
    a_session_starts_with_its_default_chat
);

// ---- Issue 24 (4): an operation on a turn outside a subscriber's window ---------------------------------

/// A subscriber whose snapshot holds fewer turns than the host (`view.turns`) gets the turns a truncation
/// names before the truncation, to it alone, so it holds the host's turns from that one on (and pages in the
/// older ones to the host's state); a subscriber holding every turn gets nothing extra.
async fn a_truncation_outside_a_subscribers_window_keeps_it_in_step(shape: &Shape) {
    let owner = shape.client(0, "owner").await;
    let (_, chat) = create_session_and_chat(&owner, "window").await;
    run_turns(&owner, &chat, 4).await;
    let reader = shape.client(1, "reader").await;
    let (result, mut reader_sub) = reader
        .subscribe_with_options(chat.clone(), None, Some(SubscribeView { turns: Some(1) }))
        .await
        .expect("subscribe");
    let snapshot = result.snapshot.expect("snapshot");
    let reader_from = snapshot.from_seq as u64;
    let reader_state = chat_of(&snapshot);
    assert_eq!(turn_ids(&reader_state), ["t3"]);
    let (owner_state, owner_from, mut owner_sub) = subscribe_chat(&owner, &chat).await;
    owner
        .dispatch(
            chat.clone(),
            StateAction::ChatTruncated(ChatTruncatedAction {
                turn_id: Some("t1".into()),
            }),
        )
        .await
        .expect("truncate");
    let is_truncation = |e: &ActionEnvelope| matches!(e.action, StateAction::ChatTruncated(_));
    let reader_seen = collect_until(&mut reader_sub, is_truncation).await;
    let owner_seen = collect_until(&mut owner_sub, is_truncation).await;
    let mut reader_state = reduce_chat(reader_state, reader_from, &reader_seen);
    // It holds the kept turns from the one named on (its window), and pages in the rest as before.
    assert_eq!(turn_ids(&reader_state), ["t1"]);
    let _: Value = reader
        .request("fetchTurns", json!({"channel": chat}))
        .await
        .expect("fetchTurns");
    let page = collect_until(&mut reader_sub, |e| {
        matches!(e.action, StateAction::ChatTurnsLoaded(_))
    })
    .await;
    for envelope in &page {
        ahp::reducers::apply_action_to_chat(&mut reader_state, &envelope.action);
    }
    assert_eq!(
        json(&reader_state),
        json(&fresh_chat_snapshot_for(shape.entry(1), shape.tenant(), &chat).await)
    );
    assert!(
        !owner_seen
            .iter()
            .any(|e| matches!(e.action, StateAction::ChatTurnsLoaded(_))),
        "{owner_seen:?}"
    );
    assert_eq!(
        turn_ids(&reduce_chat(owner_state, owner_from, &owner_seen)),
        ["t0", "t1"]
    );
}

in_both_shapes!(
    a_truncation_outside_a_subscribers_window_keeps_it_in_step,
    a_truncation_outside_a_subscribers_window_keeps_it_in_step
);

// ---- Issue 24 (12): a replayed reconnect keeps the connection's turn window -----------------------------

/// A device that held one turn of a chat (`view.turns: 1`) and reconnects with a replay still holds one: a
/// truncation naming an older turn brings it the turns it lacks first (its window came back with it).
async fn a_replayed_reconnect_keeps_the_turn_window(shape: &Shape) {
    let owner = shape.client(0, "owner").await;
    let (_, chat) = create_session_and_chat(&owner, "rewindow").await;
    run_turns(&owner, &chat, 4).await;
    let mut s = shape.raw(1, "phone").await;
    initialize(&mut s, "phone").await;
    send(
        &mut s,
        frame(
            "subscribe",
            Some(1),
            json!({"channel": chat, "view": {"turns": 1}}),
        ),
    )
    .await;
    let subscribed = answer_to(&mut s, 1).await;
    let last_seen = subscribed["result"]["snapshot"]["fromSeq"]
        .as_u64()
        .expect("fromSeq");
    drop(s);
    let mut again = shape.raw(1, "phone").await;
    send(
        &mut again,
        frame(
            "reconnect",
            Some(1),
            json!({"channel": "ahp-root://", "clientId": "phone", "lastSeenServerSeq": last_seen,
                "subscriptions": [chat]}),
        ),
    )
    .await;
    let replay = answer_to(&mut again, 1).await;
    assert!(replay["result"]["actions"].is_array(), "a replay: {replay}");
    shape.settle().await;
    owner
        .dispatch(
            chat.clone(),
            StateAction::ChatTruncated(ChatTruncatedAction {
                turn_id: Some("t1".into()),
            }),
        )
        .await
        .expect("truncate");
    let mut kinds = Vec::new();
    loop {
        let frame = recv(&mut again).await;
        let kind = frame["params"]["action"]["type"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if kind.is_empty() {
            continue;
        }
        kinds.push(kind.clone());
        if kind == "chat/truncated" {
            break;
        }
    }
    assert_eq!(kinds, ["chat/turnsLoaded", "chat/truncated"]);
}

in_both_shapes!(
    a_replayed_reconnect_keeps_the_turn_window,
    a_replayed_reconnect_keeps_the_turn_window
);

// ---- Issue 24 (8): attachments reach the agent; a chat reference is pinned ------------------------------

/// A message with attachments: a chat reference without `endTurn` is pinned to that chat's latest completed
/// turn in the accepted action (every device sees the pin), and the agent gets every attachment; kinds the
/// host cannot resolve, and an `endTurn` that is not a completed turn, are rejected with the reason.
async fn attachments_reach_the_agent_and_a_chat_reference_is_pinned(shape: &Shape) {
    let owner = shape.client(0, "owner").await;
    let (_, earlier) = create_session_and_chat(&owner, "attach-source").await;
    run_turns(&owner, &earlier, 2).await;
    let (_, chat) = create_session_and_chat(&owner, "attach").await;
    let watcher = shape.client(1, "watcher").await;
    let (_, _, mut watched) = subscribe_chat(&watcher, &chat).await;
    let (_, _, mut sub) = subscribe_chat(&owner, &chat).await;
    let with = |turn_id: &str, attachments: Value| -> StateAction {
        let mut message = message("look at these");
        message.attachments = Some(serde_json::from_value(attachments).expect("attachments"));
        turn_started_with(turn_id, message)
    };
    owner
        .dispatch(
            chat.clone(),
            with(
                "t1",
                json!([{"type": "chat", "label": "earlier chat", "resource": earlier},
                       {"type": "resource", "label": "spec", "uri": "https://example.com/spec"}]),
            ),
        )
        .await
        .expect("dispatch");
    let seen = collect_until(&mut watched, |e| {
        matches!(e.action, StateAction::ChatTurnComplete(_))
    })
    .await;
    let started = seen
        .iter()
        .find_map(|e| match &e.action {
            StateAction::ChatTurnStarted(a) => Some(json(&a.message)),
            _ => None,
        })
        .expect("the turn started");
    assert_eq!(started["attachments"][0]["endTurn"], "t1", "{started}");
    let reply = collect_markdown(&seen);
    assert!(reply.contains("Attached: earlier chat, spec."), "{reply}");
    collect_until(&mut sub, |e| matches!(e.action, StateAction::ChatTurnComplete(_))).await;

    for (turn_id, attachments, reason) in [
        (
            "t2",
            json!([{"type": "annotations", "label": "notes", "resource": "ahp-session:/attach/annotations"}]),
            "annotations",
        ),
        (
            "t3",
            json!([{"type": "chat", "label": "x", "resource": earlier, "endTurn": "t9"}]),
            "not a completed",
        ),
        (
            "t4",
            json!([{"type": "chat", "label": "y", "resource": "ahp-chat:/nowhere"}]),
            "no chat",
        ),
        ("t5", json!([{"type": "hologram", "label": "z"}]), "does not know"),
    ] {
        owner
            .dispatch(chat.clone(), with(turn_id, attachments))
            .await
            .expect("dispatch");
        let rejected = next_envelope(&mut sub).await;
        let why = rejected.rejection_reason.unwrap_or_default();
        assert!(why.contains(reason), "{turn_id}: {why}");
    }
}

/// The markdown the envelopes streamed (response parts and deltas), in order.
fn collect_markdown(envelopes: &[ActionEnvelope]) -> String {
    let mut text = String::new();
    for envelope in envelopes {
        match &envelope.action {
            StateAction::ChatResponsePart(a) => {
                if let ResponsePart::Markdown(m) = &a.part {
                    text.push_str(&m.content);
                }
            }
            StateAction::ChatDelta(a) => text.push_str(&a.content),
            _ => {}
        }
    }
    text
}

in_both_shapes!(
    attachments_reach_the_agent_and_a_chat_reference_is_pinned,
    attachments_reach_the_agent_and_a_chat_reference_is_pinned
);

// ---- Issue 24 (12): what a client is owed reaches it after a snapshot reconnect too ---------------------

/// A client whose `reconnect` is answered with snapshots (here: the replay would exceed the reply budget)
/// still gets the rejection of its action and the echo on the chat it does not subscribe to, after the
/// snapshots and numbered after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_reconnect_still_carries_what_the_client_is_owed() {
    let relay = Relay::start_with(&["--max-reply-bytes", "65536"]).await;
    let (owner, _) = relay.client("owner").await;
    let (_, chat) = create_session_and_chat(&owner, "owed-snap").await;
    let (_, other_chat) = create_session_and_chat(&owner, "owed-snap-unwatched").await;
    let mut s = raw(&relay).await;
    initialize(&mut s, "tablet").await;
    send(&mut s, frame("subscribe", Some(1), json!({"channel": chat}))).await;
    let subscribed = answer_to(&mut s, 1).await;
    let last_seen = subscribed["result"]["snapshot"]["fromSeq"]
        .as_u64()
        .expect("fromSeq");
    send(
        &mut s,
        dispatch_frame(&chat, 1, json!({"type": "chat/turnCancelled", "turnId": "none"})),
    )
    .await;
    let draft = json!({"type": "chat/draftChanged", "draft": {"text": "hi", "origin": {"kind": "user"}}});
    send(&mut s, dispatch_frame(&other_chat, 2, draft)).await;
    send(&mut s, frame("ping", Some(2), json!({}))).await;
    loop {
        if answer_is(&recv(&mut s).await, 2) {
            break;
        }
    }
    drop(s);
    // More happens on the chat than one reply may carry: the reconnect gets snapshots.
    let (_, _, mut sub) = subscribe_chat(&owner, &chat).await;
    for n in 0..3 {
        owner
            .dispatch(
                chat.clone(),
                StateAction::ChatDraftChanged(ChatDraftChangedAction {
                    draft: Some(message(&format!("{n}{}", "d".repeat(30_000)))),
                }),
            )
            .await
            .expect("dispatch");
        next_envelope(&mut sub).await;
    }

    let mut again = raw(&relay).await;
    send(
        &mut again,
        frame(
            "reconnect",
            Some(1),
            json!({"channel": "ahp-root://", "clientId": "tablet", "lastSeenServerSeq": last_seen,
                "subscriptions": [chat]}),
        ),
    )
    .await;
    let answer = answer_to(&mut again, 1).await;
    assert_eq!(answer["result"]["type"], "snapshot", "{answer}");
    let from_seq = answer["result"]["snapshots"][0]["fromSeq"]
        .as_u64()
        .expect("fromSeq");
    let mut mine = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while mine.len() < 2 {
            let frame = recv(&mut again).await;
            if frame["params"]["origin"]["clientId"] == "tablet" {
                mine.push(frame["params"].clone());
            }
        }
    })
    .await
    .expect("the owed envelopes never came");
    assert_eq!(mine[0]["origin"]["clientSeq"], 1);
    assert!(mine[0]["rejectionReason"].is_string(), "{mine:?}");
    assert_eq!(mine[1]["origin"]["clientSeq"], 2);
    assert_eq!(mine[1]["channel"], other_chat.as_str());
    assert!(mine[1].get("rejectionReason").is_none(), "{mine:?}");
    assert!(
        mine.iter().all(|e| e["serverSeq"].as_u64() > Some(from_seq)),
        "{mine:?}"
    );
}

/// A member's `createChat` fork naming an archived turn that is refused anyway (here: its URI is taken)
/// loads nothing either: no `chat/turnsLoaded` reaches the source chat's subscribers (issue 24, 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_fork_of_an_archived_turn_loads_nothing() {
    let data = tempfile::tempdir().expect("tempdir");
    let flags = ["--retained-turns", "2"];
    let mut relay = Relay::start_in(data.path(), &flags).await;
    let (member, _) = relay.client_as("dev", "mia", Role::Member, "mia").await;
    let (session, chat) = create_session_and_chat(&member, "archived-fork").await;
    let (_, _, mut sub) = subscribe_chat(&member, &chat).await;
    for n in 0..4 {
        member
            .dispatch(chat.clone(), turn_started(&format!("t{n}"), "hello"))
            .await
            .expect("dispatch");
        collect_until(&mut sub, is_turn_complete).await;
    }
    member.shutdown().await;
    relay.kill().await;
    let relay = Relay::start_in(data.path(), &flags).await;
    let (member, _) = relay.client_as("dev", "mia", Role::Member, "mia").await;
    let (state, _, mut sub) = subscribe_chat(&member, &chat).await;
    assert_eq!(state.turns.first().map(|turn| turn.id.as_str()), Some("t2"));
    // The fork names the chat itself as its new URI: refused (it exists), whatever the turns hold.
    let refused = member
        .request::<_, Value>(
            "createChat",
            json!({"channel": session, "chat": chat, "source": {"kind": "fork", "chat": chat, "turnId": "t0"}}),
        )
        .await;
    assert!(
        matches!(&refused, Err(ahp::ClientError::Rpc(e)) if e.code == -32010),
        "{refused:?}"
    );
    member
        .dispatch(
            chat.clone(),
            StateAction::ChatDraftChanged(ChatDraftChangedAction {
                draft: Some(message("next")),
            }),
        )
        .await
        .expect("dispatch");
    let next = next_envelope(&mut sub).await;
    assert!(
        matches!(next.action, StateAction::ChatDraftChanged(_)),
        "the member saw {:?} first",
        next.action
    );
}

/// A directory replaced in a session leaves its chats too, which take its replacement: no chat keeps a
/// directory outside its session's set (issue 24, 11).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_replaced_in_a_session_is_replaced_in_its_chats() {
    let relay = Relay::start().await;
    let (owner, _) = relay.client("owner").await;
    let session = "ahp-session:/moving".to_string();
    let (primary, other, third) = (
        "file:///work/a".to_string(),
        "file:///work/b".to_string(),
        "file:///work/c".to_string(),
    );
    let _: Value = owner
        .request(
            "createSession",
            json!({"channel": session, "provider": "demo", "workingDirectories": [primary, other]}),
        )
        .await
        .expect("createSession");
    let chat = "ahp-chat:/on-the-other".to_string();
    let _: Value = owner
        .request(
            "createChat",
            json!({"channel": session, "chat": chat, "workingDirectories": [other]}),
        )
        .await
        .expect("createChat");
    let (_, mut session_sub) = owner.subscribe(session.clone()).await.expect("subscribe");
    owner
        .dispatch(
            session.clone(),
            StateAction::SessionWorkingDirectoryReplaced(
                ahp_types::actions::SessionWorkingDirectoryReplacedAction {
                    directory: other.clone(),
                    replacement: third.clone(),
                },
            ),
        )
        .await
        .expect("dispatch");
    let replaced = next_envelope(&mut session_sub).await;
    assert!(replaced.rejection_reason.is_none(), "{replaced:?}");
    let state = fresh_chat_snapshot(&relay, &chat).await;
    assert_eq!(state.working_directories, Some(vec![third.clone()]));
}

/// A chat attachment may name a chat whose session is not in memory (here: after a restart): the host loads
/// it to pin its latest completed turn instead of refusing the message (issue 24, 8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_attachment_may_name_a_chat_not_in_memory() {
    let data = tempfile::tempdir().expect("tempdir");
    let mut relay = Relay::start_in(data.path(), &[]).await;
    let (client, _) = relay.client("owner").await;
    let (_, earlier) = create_session_and_chat(&client, "attached-earlier").await;
    run_turns(&client, &earlier, 1).await;
    let (_, chat) = create_session_and_chat(&client, "attaching").await;
    client.shutdown().await;
    relay.kill().await;
    let relay = Relay::start_in(data.path(), &[]).await;
    let (client, _) = relay.client("owner").await;
    let (_, _, mut sub) = subscribe_chat(&client, &chat).await;
    let mut with = message("see the earlier chat");
    with.attachments = Some(
        serde_json::from_value(json!([{"type": "chat", "label": "earlier", "resource": earlier}]))
            .expect("attachments"),
    );
    client
        .dispatch(chat.clone(), turn_started_with("t1", with))
        .await
        .expect("dispatch");
    let first = next_envelope(&mut sub).await;
    assert!(first.rejection_reason.is_none(), "{:?}", first.rejection_reason);
    let StateAction::ChatTurnStarted(started) = &first.action else {
        panic!("{:?}", first.action);
    };
    assert_eq!(json(&started.message)["attachments"][0]["endTurn"], "t0");
}

/// A client that held one turn of a chat (`view.turns: 1`) and missed a truncation naming an older turn gets
/// snapshots on `reconnect`, not a replay whose truncation it would take as a no-op (issue 24, 4 and 12).
async fn a_missed_truncation_outside_the_window_is_answered_with_snapshots(shape: &Shape) {
    let owner = shape.client(0, "owner").await;
    let (_, chat) = create_session_and_chat(&owner, "missed").await;
    run_turns(&owner, &chat, 4).await;
    let mut s = shape.raw(1, "laptop").await;
    initialize(&mut s, "laptop").await;
    send(
        &mut s,
        frame(
            "subscribe",
            Some(1),
            json!({"channel": chat, "view": {"turns": 1}}),
        ),
    )
    .await;
    let subscribed = answer_to(&mut s, 1).await;
    let last_seen = subscribed["result"]["snapshot"]["fromSeq"]
        .as_u64()
        .expect("fromSeq");
    drop(s);
    let (_, _, mut sub) = subscribe_chat(&owner, &chat).await;
    owner
        .dispatch(
            chat.clone(),
            StateAction::ChatTruncated(ChatTruncatedAction {
                turn_id: Some("t1".into()),
            }),
        )
        .await
        .expect("truncate");
    collect_until(&mut sub, |e| matches!(e.action, StateAction::ChatTruncated(_))).await;
    let mut again = shape.raw(1, "laptop").await;
    send(
        &mut again,
        frame(
            "reconnect",
            Some(1),
            json!({"channel": "ahp-root://", "clientId": "laptop", "lastSeenServerSeq": last_seen,
                "subscriptions": [chat]}),
        ),
    )
    .await;
    let answer = answer_to(&mut again, 1).await;
    assert_eq!(answer["result"]["type"], "snapshot", "{answer}");
    let turns: Vec<&str> = answer["result"]["snapshots"][0]["state"]["turns"]
        .as_array()
        .map(|turns| turns.iter().filter_map(|t| t["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(turns, ["t0", "t1"], "{answer}");
}

in_both_shapes!(
    a_missed_truncation_outside_the_window_is_answered_with_snapshots,
    a_missed_truncation_outside_the_window_is_answered_with_snapshots
);

/// The same when the replay would come from the store (the client was away longer than the in-memory replay
/// buffer holds): a missed truncation outside its window gets it snapshots (issue 24, 4 and 12).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_truncation_outside_the_window_is_answered_with_snapshots_from_the_store_too() {
    let relay = Relay::start_with(&["--replay-buffer", "2"]).await;
    let (owner, _) = relay.client("owner").await;
    let (_, chat) = create_session_and_chat(&owner, "missed-long").await;
    run_turns(&owner, &chat, 4).await;
    let mut s = raw(&relay).await;
    initialize(&mut s, "desktop").await;
    send(
        &mut s,
        frame(
            "subscribe",
            Some(1),
            json!({"channel": chat, "view": {"turns": 1}}),
        ),
    )
    .await;
    let subscribed = answer_to(&mut s, 1).await;
    let last_seen = subscribed["result"]["snapshot"]["fromSeq"]
        .as_u64()
        .expect("fromSeq");
    drop(s);
    let (_, _, mut sub) = subscribe_chat(&owner, &chat).await;
    owner
        .dispatch(
            chat.clone(),
            StateAction::ChatTruncated(ChatTruncatedAction {
                turn_id: Some("t1".into()),
            }),
        )
        .await
        .expect("truncate");
    // More after it than the in-memory buffer keeps.
    for n in 0..4 {
        owner
            .dispatch(
                chat.clone(),
                StateAction::ChatDraftChanged(ChatDraftChangedAction {
                    draft: Some(message(&format!("draft {n}"))),
                }),
            )
            .await
            .expect("dispatch");
    }
    collect_until(&mut sub, |e| {
        matches!(&e.action, StateAction::ChatDraftChanged(d) if d.draft.as_ref().is_some_and(|m| m.text == "draft 3"))
    })
    .await;
    let mut again = raw(&relay).await;
    send(
        &mut again,
        frame(
            "reconnect",
            Some(1),
            json!({"channel": "ahp-root://", "clientId": "desktop", "lastSeenServerSeq": last_seen,
                "subscriptions": [chat]}),
        ),
    )
    .await;
    let answer = answer_to(&mut again, 1).await;
    assert_eq!(answer["result"]["type"], "snapshot", "{answer}");
}
