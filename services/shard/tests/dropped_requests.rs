//! Issue 33 (5): work a request starts is the host's, not the request's. A `createTerminal` whose request
//! future is dropped (its client gone, the gateway's call timeout) while the provider is still starting the
//! terminal is settled all the same: here the start then fails, and the terminal's channel is closed instead of
//! staying open, `running`, with no process, for ever.

use std::sync::Arc;
use std::time::Duration;

use ahp_types::state::AgentInfo;
use parking_lot::Mutex;
use relay_core::rpc::read_frame;
use relay_core::{ConnectionId, HostKey, Identity, Limits, Role};
use relay_runner::{ChatSink, Provider, ProviderRegistry, TerminalRequest, TurnHandle, TurnRequest};
use relay_shard::Host;
use relay_store::Store;
use serde_json::{json, Value};

type Starts = Arc<Mutex<Vec<tokio::sync::oneshot::Sender<Result<(), String>>>>>;

/// An agent whose terminals start only when the test answers for them.
struct SlowTerminals(Starts);

impl Provider for SlowTerminals {
    fn info(&self) -> AgentInfo {
        AgentInfo {
            provider: "slow".into(),
            display_name: "Slow".into(),
            description: "test".into(),
            models: vec![],
            protected_resources: None,
            customizations: None,
            capabilities: None,
        }
    }

    fn start_turn(&self, _turn: TurnRequest, _sink: Arc<dyn ChatSink>) -> TurnHandle {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        TurnHandle::new(tx)
    }

    fn runs_terminals(&self) -> bool {
        true
    }

    fn start_terminal(
        &self,
        _request: TerminalRequest,
        _sink: Arc<dyn ChatSink>,
    ) -> relay_runner::TerminalStarted {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.0.lock().push(tx);
        rx
    }
}

async fn call(host: &Host, connection: ConnectionId, frame: Value) -> Option<Value> {
    let text = frame.to_string();
    let message = read_frame(text.as_bytes(), 64).expect("valid frame");
    host.call(connection, message)
        .await
        .frame
        .map(|f| serde_json::from_slice(&f).expect("json reply"))
}

/// Poll `check` until it holds (at most 10 s).
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "{what} never happened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_terminal_whose_request_was_dropped_is_still_settled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::connect(&format!("sqlite://{}", dir.path().join("t.sqlite").display()))
        .await
        .expect("store");
    store.migrate().await.expect("migrate");
    let starts: Starts = Arc::default();
    let host = Host::open(
        HostKey::new("t", "default"),
        Limits::default(),
        ProviderRegistry::new().with(Arc::new(SlowTerminals(starts.clone()))),
        store,
        None,
        None,
    )
    .await
    .expect("open host");
    let device = ConnectionId::next();
    let _bus = host.attach(
        device,
        Identity {
            subject: "ana".into(),
            tenant: "t".into(),
            role: Role::Member,
            hosts: None,
        },
    );
    for frame in [
        json!({"jsonrpc":"2.0","id":1,"method":"initialize",
               "params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"device"}}),
        json!({"jsonrpc":"2.0","id":2,"method":"createSession","params":{"channel":"ahp-session:/s","provider":"slow"}}),
    ] {
        let reply = call(&host, device, frame).await.expect("reply");
        assert!(reply.get("result").is_some(), "{reply}");
    }
    let create = json!({"jsonrpc":"2.0","id":3,"method":"createTerminal","params":{
        "channel":"ahp-terminal:/t",
        "claim":{"kind":"session","session":"ahp-session:/s","chat":"ahp-chat:/s"}}});
    // The request goes away while the provider is still starting the terminal.
    let mut request = Box::pin(call(&host, device, create));
    eventually("the provider asked to start it", async || {
        tokio::select! {
            _ = request.as_mut() => panic!("the start was answered before the provider answered"),
            () = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
        !starts.lock().is_empty()
    })
    .await;
    drop(request);
    let sender = starts.lock().pop().expect("the provider's answer");
    let _ = sender.send(Err("no shell here".into()));
    // The start failed: the terminal's channel is gone, not open and running with no process.
    eventually("the terminal closed", async || {
        let reply = call(
            &host,
            device,
            json!({"jsonrpc":"2.0","id":4,"method":"subscribe","params":{"channel":"ahp-terminal:/t"}}),
        )
        .await
        .expect("reply");
        reply.get("error").is_some()
    })
    .await;
}
