//! Raw WebSocket clients for tests that must see exact frames (what the official client would hide).

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use super::{Relay, PATIENCE};

pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A raw socket to the tenant `dev`'s default host, as member `raw`.
pub async fn raw(relay: &Relay) -> Socket {
    raw_as(relay, "dev", "raw", relay_core::Role::Member).await
}

/// A raw socket to `tenant`'s default host as `sub`.
pub async fn raw_as(relay: &Relay, tenant: &str, sub: &str, role: relay_core::Role) -> Socket {
    let url = format!("{}?access_token={}", relay.url(), relay.token(tenant, sub, role));
    let (socket, _) = tokio_tungstenite::connect_async(url).await.expect("connect");
    socket
}

pub async fn send(socket: &mut Socket, text: String) {
    socket.send(Message::Text(text.into())).await.expect("send");
}

/// The next JSON frame, within PATIENCE.
pub async fn recv(socket: &mut Socket) -> Value {
    loop {
        let frame = tokio::time::timeout(PATIENCE, socket.next())
            .await
            .expect("timed out")
            .expect("closed")
            .expect("read");
        if let Message::Text(text) = frame {
            return serde_json::from_str(&text).expect("server frames are JSON");
        }
    }
}

/// The next frame that answers request `id` (skipping notifications), within PATIENCE.
pub async fn answer_to(socket: &mut Socket, id: u64) -> Value {
    loop {
        let frame = recv(socket).await;
        if frame["id"].as_u64() == Some(id) {
            return frame;
        }
    }
}

pub fn error_code(frame: &Value) -> i64 {
    frame["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {frame}"))
}

/// `initialize` over a raw socket as `client_id`; panics unless it succeeds.
pub async fn initialize(socket: &mut Socket, client_id: &str) -> Value {
    send(
        socket,
        serde_json::json!({"jsonrpc":"2.0","id":0,"method":"initialize",
            "params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":client_id}})
        .to_string(),
    )
    .await;
    let reply = answer_to(socket, 0).await;
    assert!(reply.get("result").is_some(), "initialize failed: {reply}");
    reply
}
