//! Watching the Redis bus from tests: a host's channel name and waiting for its subscribers.

use std::time::Duration;

use relay_core::HostKey;

use super::PATIENCE;

/// The Redis channel of `tenant`'s default host (each test has its own tenant, so its own channel).
pub fn channel_of(tenant: &str) -> String {
    relay_bus::channel_name(&HostKey::new(tenant, "default"))
}

/// Wait (bounded) until exactly `n` Redis connections subscribe to `channel`.
pub async fn wait_subscribers(conn: &mut redis::aio::MultiplexedConnection, channel: &str, n: i64) {
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            let (_, count): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(channel)
                .query_async(conn)
                .await
                .expect("PUBSUB NUMSUB");
            if count == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{channel} never had {n} subscribers");
}
