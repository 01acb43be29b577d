//! The shard side of the Redis bus: publishes a host's events, encoded by [`codec`](crate::codec), on the
//! host's channel over a connection that reconnects by itself.

use redis::aio::ConnectionManager;
use relay_core::bus::BusEvent;
use relay_core::HostKey;

use crate::{channel_name, codec};

/// Why a publish (or connecting the publisher) failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Publishes bus events to Redis. Cheap to clone; clones share one multiplexed connection.
#[derive(Clone)]
pub struct RedisPublisher {
    connection: ConnectionManager,
}

impl RedisPublisher {
    /// Connects to the Redis server at `url` (`redis://[:PASSWORD@]host:port[/db]`, or `rediss://…` for
    /// TLS). The connection is re-established automatically after it is lost.
    pub async fn connect(url: &str) -> Result<Self, PublishError> {
        crate::tls::ensure_provider();
        let client = redis::Client::open(url)?;
        let connection = client.get_connection_manager().await?;
        Ok(Self { connection })
    }

    /// Publishes `event` on `host`'s channel and returns how many Redis subscribers received it.
    ///
    /// Pub/sub is at-most-once: a subscriber that misses the message repairs the gap from the shard.
    pub async fn publish(&self, host: &HostKey, event: &BusEvent) -> Result<u64, PublishError> {
        let mut connection = self.connection.clone();
        let receivers: u64 = redis::cmd("PUBLISH")
            .arg(channel_name(host))
            .arg(codec::encode(event).as_ref())
            .query_async(&mut connection)
            .await?;
        Ok(receivers)
    }

    /// Publishes one commit's `events` on `host`'s channel as one message ([`codec::encode_batch`]), so a
    /// gateway receives, wakes for and forwards the commit once. A batch over [`MAX_BATCH_MESSAGE_BYTES`] is
    /// split into several messages, sent in order in one pipelined round trip. On an error some of them may
    /// have been published; either way subscribers repair what they miss and drop what they already have.
    pub async fn publish_batch(
        &self,
        host: &HostKey,
        events: &[impl std::borrow::Borrow<BusEvent>],
    ) -> Result<(), PublishError> {
        if events.is_empty() {
            return Ok(());
        }
        let messages = batch_messages(events, MAX_BATCH_MESSAGE_BYTES);
        let channel = channel_name(host);
        let mut connection = self.connection.clone();
        if let [message] = messages.as_slice() {
            redis::cmd("PUBLISH")
                .arg(&channel)
                .arg(message.as_ref())
                .query_async::<()>(&mut connection)
                .await?;
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for message in &messages {
            pipe.cmd("PUBLISH").arg(&channel).arg(message.as_ref()).ignore();
        }
        pipe.query_async::<()>(&mut connection).await?;
        Ok(())
    }
}

/// A batch message stays under this size unless a single event is bigger (then it travels alone).
pub const MAX_BATCH_MESSAGE_BYTES: usize = 512 * 1024;

/// `events` as batch messages of at most `limit` encoded bytes each (an event bigger than that alone),
/// in order. Nothing for no events.
pub fn batch_messages(events: &[impl std::borrow::Borrow<BusEvent>], limit: usize) -> Vec<bytes::Bytes> {
    let mut messages = Vec::new();
    let mut start = 0;
    let mut size = 0;
    for (i, event) in events.iter().enumerate() {
        let len = 4 + codec::encoded_len(event.borrow());
        if i > start && size + len > limit {
            messages.push(codec::encode_batch(&events[start..i]));
            start = i;
            size = 0;
        }
        size += len;
    }
    if start < events.len() {
        messages.push(codec::encode_batch(&events[start..]));
    }
    messages
}
