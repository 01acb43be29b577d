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

    /// Publishes `events` on `host`'s channel, in order, in one pipelined round trip (a commit batch: the
    /// shard does not wait for Redis per event). On an error some of them may have been published; either
    /// way subscribers repair what they miss and drop what they already have.
    pub async fn publish_all(
        &self,
        host: &HostKey,
        events: &[impl AsRef<BusEvent>],
    ) -> Result<(), PublishError> {
        if events.is_empty() {
            return Ok(());
        }
        let channel = channel_name(host);
        let mut pipe = redis::pipe();
        for event in events {
            pipe.cmd("PUBLISH")
                .arg(&channel)
                .arg(codec::encode(event.as_ref()).as_ref())
                .ignore();
        }
        let mut connection = self.connection.clone();
        pipe.query_async::<()>(&mut connection).await?;
        Ok(())
    }
}
