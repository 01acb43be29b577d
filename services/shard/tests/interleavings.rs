//! Property tests (issue 10): random interleavings of actions from several clients reduce to the same state
//! on every client and on a fresh subscribe; random garbage never changes state.
//!
//! Driven through the host's real frame interface ([`relay_shard::Host::call`], as a gateway calls it) on a
//! real SQLite store; each client reduces what its bus delivers with the official `ahp` reducers, the way a
//! client does. The number of cases is proptest's (`PROPTEST_CASES`, default 24 here).

use std::sync::Arc;
use std::time::Duration;

use ahp_types::state::{ChatState, SessionState};
use proptest::prelude::*;
use relay_core::bus::Audience;
use relay_core::rpc::read_frame;
use relay_core::{ConnectionId, Identity, Role};
use relay_shard::harness::{Harness, CHAT, SESSION};
use relay_shard::Host;
use serde_json::{json, Value};

/// One client: its connection, its bus, and the state it reduced.
struct Device {
    id: ConnectionId,
    bus: relay_core::bus::EventReceiver,
    session: SessionState,
    chat: ChatState,
    last_seq: u64,
}

async fn call(host: &Host, connection: ConnectionId, frame: &str) -> Option<Value> {
    let message = read_frame(frame.as_bytes(), 64).ok()?;
    host.call(connection, message)
        .await
        .frame
        .map(|f| serde_json::from_slice(&f).expect("json reply"))
}

async fn subscribe<T: serde::de::DeserializeOwned>(host: &Host, id: ConnectionId, channel: &str) -> (T, u64) {
    let reply = call(
        host,
        id,
        &json!({"jsonrpc":"2.0","id":7,"method":"subscribe","params":{"channel":channel}}).to_string(),
    )
    .await
    .expect("reply");
    let snapshot = &reply["result"]["snapshot"];
    let state = serde_json::from_value(snapshot["state"].clone()).unwrap_or_else(|e| panic!("{reply}: {e}"));
    (state, snapshot["fromSeq"].as_u64().expect("fromSeq"))
}

async fn connect(host: &Host, client_id: &str) -> Device {
    let id = ConnectionId::next();
    let bus = host.attach(
        id,
        Identity {
            subject: client_id.into(),
            tenant: "t".into(),
            role: Role::Member,
            hosts: None,
        },
    );
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize",
        "params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":client_id}});
    let reply = call(host, id, &init.to_string()).await.expect("reply");
    assert!(reply.get("result").is_some(), "{reply}");
    let (session, session_seq) = subscribe(host, id, SESSION).await;
    let (chat, chat_seq) = subscribe(host, id, CHAT).await;
    Device {
        id,
        bus: relay_core::bus::EventReceiver::new(bus),
        session,
        chat,
        last_seq: session_seq.max(chat_seq),
    }
}

impl Device {
    /// Reduce what the bus delivered to this connection until `done` matches an envelope.
    async fn reduce_until(&mut self, done: impl Fn(&Value) -> bool) {
        loop {
            let event = tokio::time::timeout(Duration::from_secs(10), self.bus.recv())
                .await
                .expect("timed out")
                .expect("bus open");
            let mine = matches!(event.audience, Audience::Subscribers)
                || event.audience == Audience::Connection(self.id);
            if !mine || event.frame.is_empty() {
                continue;
            }
            let frame: Value = serde_json::from_slice(&event.frame).expect("json");
            if frame["method"] != "action" {
                continue;
            }
            let envelope = &frame["params"];
            let seq = envelope["serverSeq"].as_u64().expect("serverSeq");
            if envelope.get("rejectionReason").is_none() && seq > self.last_seq {
                self.last_seq = seq;
                let action = serde_json::from_value(envelope["action"].clone()).expect("action");
                match envelope["channel"].as_str() {
                    Some(SESSION) => {
                        ahp::reducers::apply_action_to_session(&mut self.session, &action);
                    }
                    Some(CHAT) => {
                        ahp::reducers::apply_action_to_chat(&mut self.chat, &action);
                    }
                    _ => {}
                }
            }
            if done(envelope) {
                return;
            }
        }
    }
}

/// What a client sends.
#[derive(Debug, Clone)]
enum Op {
    /// A well-formed action on the session or the chat (valid or not for the state it meets).
    Action(&'static str, Value),
    /// Anything at all as a frame.
    Garbage(String),
    /// A dispatch whose action is any JSON.
    WrongAction(Value),
}

fn user_message(text: &str) -> Value {
    json!({"text": text, "origin": {"kind": "user"}})
}

fn action() -> impl Strategy<Value = (&'static str, Value)> {
    let text = "[a-z ]{0,12}";
    let id = 0..4u8;
    prop_oneof![
        text.prop_map(|t| (
            CHAT,
            json!({"type":"chat/draftChanged","draft": user_message(&t)})
        )),
        Just((CHAT, json!({"type":"chat/draftChanged"}))),
        text.prop_map(|t| (SESSION, json!({"type":"session/titleChanged","title": t}))),
        any::<bool>().prop_map(|b| (SESSION, json!({"type":"session/isReadChanged","isRead": b}))),
        any::<bool>().prop_map(|b| (
            SESSION,
            json!({"type":"session/isArchivedChanged","isArchived": b})
        )),
        any::<bool>().prop_map(|b| (CHAT, json!({"type":"chat/isReadChanged","isRead": b}))),
        (id.clone(), text).prop_map(|(n, t)| (
            CHAT,
            json!({"type":"chat/pendingMessageSet","kind":"queued",
            "id": format!("q{n}"), "message": user_message(&t)})
        )),
        id.clone().prop_map(|n| (
            CHAT,
            json!({"type":"chat/pendingMessageRemoved","kind":"queued","id": format!("q{n}")})
        )),
        Just(Vec::from(["q0", "q1", "q2", "q3"]))
            .prop_shuffle()
            .prop_map(|order| (
                CHAT,
                json!({"type":"chat/queuedMessagesReordered","order": order})
            )),
        id.clone().prop_map(|n| (
            CHAT,
            json!({"type":"chat/turnStarted","turnId": format!("t{n}"),
            "startedAt": format!("{:.3}", jiff::Timestamp::now()),"message": user_message("go")})
        )),
        id.prop_map(|n| (
            CHAT,
            json!({"type":"chat/turnCancelled","turnId": format!("t{n}"),"duration":0})
        )),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        ".{0,8}".prop_map(Value::from),
        Just(json!("chat/draftChanged")),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("type|draft|text|origin|[a-z]{1,5}", inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => action().prop_map(|(channel, action)| Op::Action(channel, action)),
        1 => ".{0,40}".prop_map(Op::Garbage),
        1 => json_value().prop_map(Op::WrongAction),
    ]
}

async fn fixture() -> (Arc<Host>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let harness = Harness::open(dir.path()).await.expect("harness");
    (harness.host, dir)
}

fn states(device: &Device) -> (Value, Value) {
    (
        serde_json::to_value(&device.session).expect("json"),
        serde_json::to_value(&device.chat).expect("json"),
    )
}

/// Send every op, each from the client it names.
async fn send_all(host: &Host, devices: &[Device], ops: Vec<(usize, Op)>) {
    for (n, (who, op)) in ops.into_iter().enumerate() {
        let device = &devices[who % devices.len()];
        let frame = match op {
            Op::Action(channel, action) => json!({"jsonrpc":"2.0","method":"dispatchAction",
                "params":{"channel":channel,"clientSeq":n + 1,"action":action}})
            .to_string(),
            Op::WrongAction(action) => json!({"jsonrpc":"2.0","method":"dispatchAction",
                "params":{"channel":CHAT,"clientSeq":n + 1,"action":action}})
            .to_string(),
            Op::Garbage(text) => text,
        };
        call(host, device.id, &frame).await;
    }
}

async fn devices(host: &Host) -> Vec<Device> {
    let mut devices = Vec::new();
    for name in ["laptop", "phone", "editor"] {
        devices.push(connect(host, name).await);
    }
    devices
}

/// Send the ops, then a marker every client waits for; returns each client's reduced state and a fresh
/// subscriber's.
async fn interleave(ops: Vec<(usize, Op)>) -> (Vec<(Value, Value)>, (Value, Value)) {
    let (host, _dir) = fixture().await;
    let mut devices = devices(&host).await;
    send_all(&host, &devices, ops).await;
    // The marker: accepted, so every subscriber gets it after everything before it.
    let marker = json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":SESSION,"clientSeq":100_000,
        "action":{"type":"session/titleChanged","title":"marker"}}});
    call(&host, devices[0].id, &marker.to_string()).await;
    let is_marker = |envelope: &Value| envelope["action"]["title"] == "marker";
    let mut reduced = Vec::new();
    for device in &mut devices {
        device.reduce_until(is_marker).await;
        reduced.push(states(device));
    }
    let fresh = connect(&host, "fresh").await;
    (reduced, states(&fresh))
}

/// A fresh subscriber's state before and after the ops.
async fn before_and_after(ops: Vec<(usize, Op)>) -> ((Value, Value), (Value, Value)) {
    let (host, _dir) = fixture().await;
    let devices = devices(&host).await;
    let before = states(&connect(&host, "before").await);
    send_all(&host, &devices, ops).await;
    // The host handles one call at a time: this subscribe sees every action the ops made.
    let after = states(&connect(&host, "after").await);
    (before, after)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(24),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_client_and_a_fresh_subscriber_hold_the_same_state(
        ops in prop::collection::vec((0..3usize, op()), 1..40)
    ) {
        let (reduced, fresh) = runtime().block_on(interleave(ops));
        for (n, state) in reduced.iter().enumerate() {
            prop_assert_eq!(state, &fresh, "client {} differs from a fresh subscriber", n);
        }
    }

    #[test]
    fn garbage_never_changes_state(
        garbage in prop::collection::vec((0..3usize, prop_oneof![
            ".{0,60}".prop_map(Op::Garbage),
            json_value().prop_map(Op::WrongAction),
            json_value().prop_map(|v| Op::Garbage(v.to_string())),
        ]), 1..30)
    ) {
        let (before, after) = runtime().block_on(before_and_after(garbage));
        prop_assert_eq!(before, after);
    }
}
