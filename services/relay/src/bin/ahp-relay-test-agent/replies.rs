//! How the test agent speaks: a piece of its reply (or thought) as an ACP session update.

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, SessionId, SessionNotification, SessionUpdate,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Client;

pub(crate) fn say(
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    update: SessionUpdate,
) -> agent_client_protocol::Result<()> {
    cx.send_notification(SessionNotification::new(session.clone(), update))
}

pub(crate) fn chunk(text: &str) -> ContentChunk {
    ContentChunk::new(ContentBlock::from(text.to_string()))
}
