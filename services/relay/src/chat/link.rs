//! The connection of `ahp-relay chat` to the relay: the authorized URL, the handshake, finding or creating the
//! session and chat, and resuming after a dropped connection.

use std::time::Duration;

use ahp::{Client, ClientConfig, ClientEventStream};
use ahp_types::actions::ActionEnvelope;
use ahp_types::commands::{CreateChatParams, CreateSessionParams, ReconnectResult};
use ahp_types::state::{ChatState, Snapshot, SnapshotState};
use anyhow::Context;

const PROTOCOL_VERSION: &str = "1.0.0";
const ROOT: &str = "ahp-root://";

/// Where to connect and who we are: everything a fresh connection needs.
pub struct Endpoint {
    /// The WebSocket URL, token included.
    pub url: String,
    pub client_id: String,
}

/// A live connection: the client and the ordered stream of everything it receives.
pub struct Link {
    pub client: Client,
    /// Every channel's events, in arrival order (so `serverSeq`s stay in order across channels).
    pub events: ClientEventStream,
}

/// What the relay sent back when a dropped connection was resumed.
pub enum Resumed {
    /// The envelopes missed since `lastSeenServerSeq`.
    Replay(Vec<ActionEnvelope>),
    /// Fresh snapshots replacing the local state, and the relay's current `serverSeq` if it said.
    Snapshots(Vec<Snapshot>, Option<u64>),
}

/// The chat is no longer available on the relay: reconnecting again will not help.
#[derive(Debug)]
pub struct ChatGone(pub String);

impl std::fmt::Display for ChatGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is no longer available on the relay", self.0)
    }
}

impl std::error::Error for ChatGone {}

/// `url` with `access_token=<token>` added to its query.
pub fn with_access_token(url: &str, token: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}access_token={}", percent_encode(token))
}

/// Whether `url` already carries an `access_token` query parameter.
pub fn has_access_token(url: &str) -> bool {
    url.split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|pair| pair.starts_with("access_token=")))
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Endpoint {
    /// Opens a WebSocket and an `ahp::Client` on it, without any handshake.
    pub async fn connect(&self) -> anyhow::Result<Link> {
        let transport = ahp_ws::WebSocketTransport::connect(&self.url)
            .await
            .context("connecting to the relay")?;
        let config = ClientConfig {
            default_request_timeout: Some(Duration::from_secs(30)),
            subscription_buffer: 4096,
        };
        let client = Client::connect(transport, config).await?;
        // Taken before any request, so no event can slip past.
        let events = client.events();
        Ok(Link { client, events })
    }

    /// Connects and runs `initialize`; returns the link and the relay's current `serverSeq`.
    pub async fn open(&self) -> anyhow::Result<(Link, u64)> {
        let link = self.connect().await?;
        let seq = initialize(&link.client, &self.client_id).await?;
        Ok((link, seq))
    }

    /// Reconnects after a drop: `reconnect` with our subscriptions, else a fresh `initialize` and `subscribe`.
    pub async fn resume(&self, last_seen: u64, session: &str, chat: &str) -> anyhow::Result<(Link, Resumed)> {
        let link = self.connect().await?;
        let subscriptions = vec![session.to_string(), chat.to_string()];
        let last_seen = i64::try_from(last_seen).unwrap_or(i64::MAX);
        let resumed = match link
            .client
            .reconnect(self.client_id.clone(), last_seen, subscriptions)
            .await
        {
            Ok(ReconnectResult::Replay(replay)) => {
                if replay.missing.iter().any(|uri| uri == chat) {
                    return Err(ChatGone(chat.to_string()).into());
                }
                Resumed::Replay(replay.actions)
            }
            Ok(ReconnectResult::Snapshot(result)) => Resumed::Snapshots(result.snapshots, None),
            Err(error) => {
                tracing::debug!(%error, "reconnect failed; starting afresh");
                let seq = initialize(&link.client, &self.client_id).await?;
                let session = subscribe(&link.client, session).await?;
                let chat = subscribe(&link.client, chat).await?;
                Resumed::Snapshots(vec![session, chat], Some(seq))
            }
        };
        Ok((link, resumed))
    }
}

async fn initialize(client: &Client, client_id: &str) -> anyhow::Result<u64> {
    let result = client
        .initialize(
            client_id.to_string(),
            vec![PROTOCOL_VERSION.into()],
            vec![ROOT.into()],
        )
        .await
        .context("initialize")?;
    Ok(u64::try_from(result.server_seq).unwrap_or(0))
}

/// Subscribes to `uri` and returns its snapshot.
pub async fn subscribe(client: &Client, uri: &str) -> anyhow::Result<Snapshot> {
    let (result, _local) = client
        .subscribe(uri.to_string())
        .await
        .with_context(|| format!("subscribing to {uri}"))?;
    result
        .snapshot
        .with_context(|| format!("the relay sent no snapshot for {uri}"))
}

/// Creates a session run by `provider`; returns its URI.
pub async fn create_session(client: &Client, provider: &str) -> anyhow::Result<String> {
    let uri = format!("ahp-session:/{}", uuid::Uuid::new_v4());
    let params = CreateSessionParams {
        channel: uri.clone(),
        meta: None,
        provider: Some(provider.to_string()),
        working_directories: None,
        config: None,
        active_client: None,
        progress_token: None,
    };
    client
        .request::<_, serde_json::Value>("createSession", params)
        .await
        .context("createSession")?;
    Ok(uri)
}

/// Creates a chat in `session`; returns its URI.
pub async fn create_chat(client: &Client, session: &str) -> anyhow::Result<String> {
    let uri = format!("ahp-chat:/{}", uuid::Uuid::new_v4());
    let params = CreateChatParams {
        channel: session.to_string(),
        meta: None,
        chat: uri.clone(),
        initial_message: None,
        source: None,
        working_directories: None,
    };
    client
        .request::<_, serde_json::Value>("createChat", params)
        .await
        .context("createChat")?;
    Ok(uri)
}

/// The chat to join in a session snapshot: its default chat, else its first.
pub fn chat_to_join(snapshot: &Snapshot) -> anyhow::Result<Option<String>> {
    let SnapshotState::Session(session) = &snapshot.state else {
        anyhow::bail!("{} is not a session", snapshot.resource);
    };
    Ok(session
        .default_chat
        .clone()
        .or_else(|| session.chats.first().map(|chat| chat.resource.clone())))
}

/// The chat state in a chat snapshot, with its `fromSeq`.
pub fn chat_state(snapshot: Snapshot) -> anyhow::Result<(ChatState, u64)> {
    let from_seq = u64::try_from(snapshot.from_seq).unwrap_or(0);
    match snapshot.state {
        SnapshotState::Chat(state) => Ok((*state, from_seq)),
        _ => anyhow::bail!("{} is not a chat", snapshot.resource),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_the_token_to_the_query() {
        assert_eq!(
            with_access_token("ws://h:1/v1/ws", "a.b-c_d"),
            "ws://h:1/v1/ws?access_token=a.b-c_d"
        );
        assert_eq!(
            with_access_token("ws://h/v1/ws?x=1", "t"),
            "ws://h/v1/ws?x=1&access_token=t"
        );
        assert_eq!(
            with_access_token("ws://h/", "a+b/c="),
            "ws://h/?access_token=a%2Bb%2Fc%3D"
        );
    }

    #[test]
    fn notices_a_token_already_in_the_url() {
        assert!(has_access_token("ws://h/v1/ws?access_token=t"));
        assert!(has_access_token("ws://h/v1/ws?x=1&access_token=t"));
        assert!(!has_access_token("ws://h/v1/ws?x_access_token=t"));
        assert!(!has_access_token("ws://h/v1/ws"));
    }

    #[test]
    fn joins_the_default_chat_else_the_first() {
        let session = |default: Option<&str>, chats: &[&str]| Snapshot {
            resource: "ahp-session:/s".into(),
            from_seq: 1,
            state: serde_json::from_value(serde_json::json!({
                "provider": "demo", "title": "", "status": 0, "lifecycle": "ready", "activeClients": [],
                "defaultChat": default,
                "chats": chats.iter().map(|c| serde_json::json!({
                    "resource": c, "title": "", "status": 0, "modifiedAt": "2025-01-01T00:00:00Z",
                })).collect::<Vec<_>>(),
            }))
            .expect("session state"),
        };
        assert_eq!(chat_to_join(&session(None, &[])).expect("session"), None);
        assert_eq!(
            chat_to_join(&session(None, &["ahp-chat:/a", "ahp-chat:/b"]))
                .expect("session")
                .as_deref(),
            Some("ahp-chat:/a")
        );
        assert_eq!(
            chat_to_join(&session(Some("ahp-chat:/b"), &["ahp-chat:/a", "ahp-chat:/b"]))
                .expect("session")
                .as_deref(),
            Some("ahp-chat:/b")
        );
    }
}
