//! A host to throw input at, for the fuzz targets (`fuzz/`) and the tests that replay their findings and run
//! property tests: one host on a fresh SQLite store, an agent that never answers, and a member connection
//! initialized and subscribed to a session and its chat. Everything goes through [`Host::call`], the
//! interface a gateway uses.

use std::path::Path;
use std::sync::Arc;

use ahp_types::state::AgentInfo;
use relay_core::rpc::read_frame;
use relay_core::{ConnectionId, HostKey, Identity, Limits, Role};
use relay_runner::{ChatSink, Provider, ProviderRegistry, TurnHandle, TurnRequest};
use relay_store::Store;
use serde_json::{json, Value};

use crate::Host;

/// The session every harness host has.
pub const SESSION: &str = "ahp-session:/s";
/// A chat of [`SESSION`] the harness creates (besides its default chat).
pub const CHAT: &str = "ahp-chat:/c";
/// JSON nesting accepted in frames (the gateway's default).
pub const MAX_DEPTH: usize = 64;

/// An agent whose turns run until cancelled and emit nothing.
pub struct IdleAgent;

impl Provider for IdleAgent {
    fn info(&self) -> AgentInfo {
        AgentInfo {
            provider: "idle".into(),
            display_name: "Idle".into(),
            description: "an agent that never answers".into(),
            models: vec![],
            protected_resources: None,
            customizations: None,
            // Chats beyond the default one (the harness's chat is a second), forks and side chats.
            capabilities: Some(ahp_types::state::AgentCapabilities {
                multiple_chats: Some(ahp_types::state::MultipleChatsCapability {
                    fork: Some(true),
                    side_chat: Some(true),
                }),
                ..Default::default()
            }),
        }
    }

    fn start_turn(&self, _turn: TurnRequest, _sink: Arc<dyn ChatSink>) -> TurnHandle {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move { while rx.recv().await.is_some() {} });
        TurnHandle::new(tx)
    }
}

/// Why the harness could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("store: {0}")]
    Store(String),
    #[error("setup call {0} failed: {1}")]
    Setup(&'static str, String),
}

/// A harness host and its member connection.
pub struct Harness {
    pub host: Arc<Host>,
    pub member: ConnectionId,
}

impl Harness {
    /// A host on a SQLite store in `dir`, with [`SESSION`] and [`CHAT`] created and `member` initialized
    /// and subscribed to both.
    pub async fn open(dir: &Path) -> Result<Self, HarnessError> {
        let store = Store::connect(&format!("sqlite://{}", dir.join("harness.sqlite").display()))
            .await
            .map_err(|e| HarnessError::Store(e.to_string()))?;
        store
            .migrate()
            .await
            .map_err(|e| HarnessError::Store(e.to_string()))?;
        let host = Host::open(
            HostKey::new("t", "default"),
            Limits::default(),
            ProviderRegistry::new().with(Arc::new(IdleAgent)),
            store,
            None,
            None,
        )
        .await
        .map_err(|e| HarnessError::Store(e.to_string()))?;
        let member = ConnectionId::next();
        // The bus receiver is dropped: the harness looks at replies and state, not at deliveries.
        drop(host.attach(member, identity("member", Role::Member)));
        let harness = Self { host, member };
        for (name, frame) in [
            (
                "initialize",
                json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://",
                "protocolVersions":["1.0.0"],"clientId":"member","initialSubscriptions":["ahp-root://"]}}),
            ),
            (
                "createSession",
                json!({"jsonrpc":"2.0","id":2,"method":"createSession",
                "params":{"channel":SESSION,"provider":"idle"}}),
            ),
            (
                "createChat",
                json!({"jsonrpc":"2.0","id":3,"method":"createChat",
                "params":{"channel":SESSION,"chat":CHAT}}),
            ),
            (
                "subscribe",
                json!({"jsonrpc":"2.0","id":4,"method":"subscribe","params":{"channel":SESSION}}),
            ),
            (
                "subscribe",
                json!({"jsonrpc":"2.0","id":5,"method":"subscribe","params":{"channel":CHAT}}),
            ),
        ] {
            match harness.call(harness.member, frame.to_string().as_bytes()).await {
                Some(reply) if reply.get("result").is_some() => {}
                other => return Err(HarnessError::Setup(name, format!("{other:?}"))),
            }
        }
        Ok(harness)
    }

    /// Send `frame` as `connection` the way a gateway does (parsed by [`read_frame`] first: a frame it
    /// refuses never reaches the host); the reply, if any.
    pub async fn call(&self, connection: ConnectionId, frame: &[u8]) -> Option<Value> {
        let message = read_frame(frame, MAX_DEPTH).ok()?;
        let reply = self.host.call(connection, message).await;
        reply.frame.and_then(|f| serde_json::from_slice(&f).ok())
    }

    /// `action` (any JSON) dispatched by the member on the session (`on_session`) or the chat.
    pub async fn dispatch(&self, on_session: bool, action: Value) -> Option<Value> {
        let channel = if on_session { SESSION } else { CHAT };
        let frame = json!({"jsonrpc":"2.0","method":"dispatchAction",
            "params":{"channel":channel,"clientSeq":1,"action":action}});
        self.call(self.member, frame.to_string().as_bytes()).await
    }

    /// The session's and the chat's state as a fresh subscriber sees them.
    pub async fn state(&self) -> Value {
        let observer = ConnectionId::next();
        drop(self.host.attach(observer, identity("observer", Role::Viewer)));
        let mut states = Vec::new();
        for (id, frame) in [
            json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://",
                "protocolVersions":["1.0.0"],"clientId":"observer"}}),
            json!({"jsonrpc":"2.0","id":2,"method":"subscribe","params":{"channel":SESSION}}),
            json!({"jsonrpc":"2.0","id":3,"method":"subscribe","params":{"channel":CHAT}}),
        ]
        .into_iter()
        .enumerate()
        {
            let reply = self.call(observer, frame.to_string().as_bytes()).await;
            if id > 0 {
                states.push(reply.map(|r| r["result"]["snapshot"]["state"].clone()));
            }
        }
        self.host.detach(observer);
        json!(states)
    }
}

fn identity(subject: &str, role: Role) -> Identity {
    Identity {
        subject: subject.into(),
        tenant: "t".into(),
        role,
        hosts: None,
    }
}
