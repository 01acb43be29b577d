//! Client-executed tools: only the owning client may complete them, and they are failed when the owner
//! disconnects for longer than its grace period. Driven through the host's real frame interface, with a
//! scripted provider standing in for an agent that hands a tool to a client.

use std::sync::Arc;
use std::time::Duration;

use ahp_types::actions::{ChatToolCallReadyAction, ChatToolCallStartAction, StateAction};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{
    AgentInfo, ToolCallClientContributor, ToolCallConfirmationReason, ToolCallContributor,
};
use relay_core::bus::Audience;
use relay_core::rpc::read_frame;
use relay_core::{ConnectionId, HostKey, Identity, Limits, Role};
use relay_runner::{ChatSink, Provider, ProviderRegistry, TurnHandle, TurnRequest};
use relay_shard::Host;
use relay_store::Store;
use serde_json::{json, Value};

/// Starts every turn by handing a running tool call to client `owner`.
struct HandsToolToClient;

impl Provider for HandsToolToClient {
    fn info(&self) -> AgentInfo {
        AgentInfo {
            provider: "scripted".into(),
            display_name: "Scripted".into(),
            description: "test".into(),
            models: vec![],
            protected_resources: None,
            customizations: None,
            capabilities: None,
        }
    }

    fn start_turn(&self, turn: TurnRequest, sink: Arc<dyn ChatSink>) -> TurnHandle {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let contributor = Some(ToolCallContributor::Client(ToolCallClientContributor {
                client_id: "owner".into(),
            }));
            sink.emit(
                &turn.chat,
                StateAction::ChatToolCallStart(ChatToolCallStartAction {
                    turn_id: turn.turn_id.clone(),
                    tool_call_id: "tc1".into(),
                    meta: None,
                    tool_name: "client_tool".into(),
                    display_name: "Client tool".into(),
                    intention: None,
                    contributor: contributor.clone(),
                }),
            );
            sink.emit(
                &turn.chat,
                StateAction::ChatToolCallReady(ChatToolCallReadyAction {
                    turn_id: turn.turn_id.clone(),
                    tool_call_id: "tc1".into(),
                    meta: None,
                    contributor,
                    intention: None,
                    invocation_message: StringOrMarkdown::Plain("run it".into()),
                    tool_input: None,
                    confirmation_title: None,
                    risk_assessment: None,
                    edits: None,
                    editable: None,
                    confirmed: Some(ToolCallConfirmationReason::NotNeeded),
                    options: None,
                }),
            );
            // Stay alive until cancelled.
            while rx.recv().await.is_some() {}
        });
        TurnHandle::new(tx)
    }
}

struct Device {
    id: ConnectionId,
    bus: relay_core::bus::EventReceiver,
}

/// A host on a fresh SQLite store (kept alive by the returned directory).
async fn host(grace: Duration) -> (Arc<Host>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::connect(&format!("sqlite://{}", dir.path().join("t.sqlite").display()))
        .await
        .expect("store");
    store.migrate().await.expect("migrate");
    let limits = Limits {
        active_client_grace: grace,
        ..Limits::default()
    };
    let host = Host::open(
        HostKey::new("t", "default"),
        limits,
        ProviderRegistry::new().with(Arc::new(HandsToolToClient)),
        store,
        None,
        None,
    )
    .await
    .expect("open host");
    (host, dir)
}

async fn call(host: &Host, device: &Device, frame: Value) -> Option<Value> {
    let text = frame.to_string();
    let message = read_frame(text.as_bytes(), 64).expect("valid frame");
    host.call(device.id, message)
        .await
        .frame
        .map(|f| serde_json::from_slice(&f).expect("json reply"))
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
    let device = Device {
        id,
        bus: relay_core::bus::EventReceiver::new(bus),
    };
    let reply = call(
        host,
        &device,
        json!({"jsonrpc":"2.0","id":1,"method":"initialize",
               "params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":client_id}}),
    )
    .await
    .expect("reply");
    assert!(reply.get("result").is_some(), "{reply}");
    device
}

/// The next action envelope on the device's bus addressed to it (as its gateway connection would deliver).
async fn next_action(device: &mut Device, wanted: &str) -> Value {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), device.bus.recv())
            .await
            .expect("timed out")
            .expect("bus open");
        let mine = matches!(event.audience, Audience::Subscribers)
            || event.audience == Audience::Connection(device.id);
        if !mine || event.frame.is_empty() {
            continue;
        }
        let frame: Value = serde_json::from_slice(&event.frame).expect("json");
        if frame["method"] == "action" && frame["params"]["action"]["type"] == wanted {
            return frame["params"].clone();
        }
    }
}

fn complete(success: bool) -> Value {
    json!({"type":"chat/toolCallComplete","turnId":"t1","toolCallId":"tc1",
           "result":{"success":success,"pastTenseMessage":"done"}})
}

async fn dispatch(host: &Host, device: &Device, seq: i64, action: Value) {
    assert!(call(
        host,
        device,
        json!({"jsonrpc":"2.0","method":"dispatchAction",
               "params":{"channel":"ahp-chat:/s","clientSeq":seq,"action":action}}),
    )
    .await
    .is_none());
}

async fn setup(host: &Host, owner: &Device) {
    for frame in [
        json!({"jsonrpc":"2.0","id":2,"method":"createSession","params":{"channel":"ahp-session:/s","provider":"scripted",
               "activeClient":{"clientId":"owner","tools":[]}}}),
        json!({"jsonrpc":"2.0","id":4,"method":"subscribe","params":{"channel":"ahp-chat:/s"}}),
    ] {
        let reply = call(host, owner, frame).await.expect("reply");
        assert!(reply.get("result").is_some(), "{reply}");
    }
    dispatch(
        host,
        owner,
        1,
        json!({"type":"chat/turnStarted","turnId":"t1","startedAt": format!("{:.3}", jiff::Timestamp::now()),
               "message":{"text":"go","origin":{"kind":"user"}}}),
    )
    .await;
}

#[tokio::test]
async fn only_the_owning_client_may_complete_its_tool_call() {
    let (host, _dir) = host(Duration::from_secs(30)).await;
    let mut owner = connect(&host, "owner").await;
    let mut other = connect(&host, "other").await;
    setup(&host, &owner).await;
    next_action(&mut owner, "chat/toolCallReady").await;

    dispatch(&host, &other, 1, complete(true)).await;
    let refused = next_action(&mut other, "chat/toolCallComplete").await;
    assert!(
        refused["rejectionReason"]
            .as_str()
            .is_some_and(|r| r.contains("another client")),
        "{refused}"
    );

    dispatch(&host, &owner, 2, complete(true)).await;
    let accepted = next_action(&mut owner, "chat/toolCallComplete").await;
    assert!(accepted.get("rejectionReason").is_none(), "{accepted}");
    assert_eq!(accepted["origin"]["clientId"], "owner");
}

#[tokio::test]
async fn a_vanished_owner_has_its_tool_calls_failed_after_the_grace_period() {
    let (host, _dir) = host(Duration::from_millis(100)).await;
    let owner = connect(&host, "owner").await;
    let mut watcher = connect(&host, "watcher").await;
    setup(&host, &owner).await;
    let reply = call(
        &host,
        &watcher,
        json!({"jsonrpc":"2.0","id":9,"method":"subscribe","params":{"channel":"ahp-session:/s"}}),
    )
    .await
    .expect("reply");
    assert!(reply.get("result").is_some());
    next_action(&mut watcher, "chat/toolCallReady").await;

    host.detach(owner.id);
    let failed = next_action(&mut watcher, "chat/toolCallComplete").await;
    assert_eq!(failed["action"]["result"]["success"], false);
    assert!(failed.get("origin").is_none(), "failed by the host");
    let removed = next_action(&mut watcher, "session/activeClientRemoved").await;
    assert_eq!(removed["action"]["clientId"], "owner");
    assert!(removed["serverSeq"].as_u64() > failed["serverSeq"].as_u64());
}
