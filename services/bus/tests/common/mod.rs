//! Helpers shared by the Redis integration tests: the Redis URL (or a skip), an in-memory gap repair source,
//! event builders and bounded waits.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use relay_bus::{BoxFuture, GapRepair, RepairError};
use relay_core::bus::{Audience, BusEvent, BusEventKind, SharedBusEvent};
use relay_core::HostKey;

pub const WAIT: Duration = Duration::from_secs(10);

/// `REDIS_URL`, or `None` after printing that the test is skipped.
pub fn redis_url() -> Option<String> {
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            println!("skipped: REDIS_URL not set");
            None
        }
    }
}

/// A host whose name no other test uses.
pub fn unique_host(test: &str) -> HostKey {
    HostKey::new(format!("t:{test}:{}", std::process::id()), "default")
}

pub fn action(seq: u64, prev_seq: u64) -> BusEvent {
    BusEvent {
        kind: BusEventKind::Action,
        channel: Arc::from("ahp-session:/s1"),
        seq,
        prev_seq,
        audience: Audience::Subscribers,
        frame: Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","method":"action","params":{{"serverSeq":{seq}}}}}"#
        )),
        published_at: None,
    }
}

pub fn notification(seq: u64, prev_seq: u64) -> BusEvent {
    BusEvent {
        kind: BusEventKind::Notification,
        channel: Arc::from("ahp-root://"),
        seq,
        prev_seq,
        audience: Audience::Everyone,
        frame: Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","method":"root/sessionAdded","n":{seq}}}"#
        )),
        published_at: None,
    }
}

pub fn assert_same(expected: &BusEvent, got: &SharedBusEvent) {
    assert_eq!(
        (
            expected.kind,
            &expected.channel,
            expected.seq,
            expected.prev_seq,
            &expected.audience,
            &expected.frame
        ),
        (
            got.kind,
            &got.channel,
            got.seq,
            got.prev_seq,
            &got.audience,
            &got.frame
        )
    );
}

/// The shard's log, as a repair source: every action ever "committed", and the ranges asked for.
#[derive(Default)]
pub struct MemoryLog {
    pub events: Mutex<Vec<BusEvent>>,
    pub calls: Mutex<Vec<(u64, u64)>>,
}

impl MemoryLog {
    pub fn commit(&self, event: &BusEvent) {
        self.events.lock().push(event.clone());
    }
}

impl GapRepair for MemoryLog {
    fn fetch<'a>(
        &'a self,
        _host: &'a HostKey,
        after: u64,
        through: u64,
    ) -> BoxFuture<'a, Result<Vec<BusEvent>, RepairError>> {
        self.calls.lock().push((after, through));
        let events = self
            .events
            .lock()
            .iter()
            .filter(|e| e.kind == BusEventKind::Action && e.seq > after && e.seq <= through)
            .cloned()
            .collect();
        Box::pin(async move { Ok(events) })
    }
}

/// The next event, waiting at most [`WAIT`].
pub async fn recv(rx: &mut relay_core::bus::EventReceiver) -> SharedBusEvent {
    match tokio::time::timeout(WAIT, rx.recv()).await {
        Ok(Ok(event)) => event,
        Ok(Err(error)) => panic!("bus receiver failed: {error}"),
        Err(_) => panic!("no bus event within {WAIT:?}"),
    }
}

/// Polls `PUBSUB NUMSUB` (bounded) until `channel` has at least one subscriber.
pub async fn wait_subscribed(connection: &mut redis::aio::MultiplexedConnection, channel: &str) {
    for _ in 0..1000 {
        let (_, count): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(connection)
            .await
            .expect("PUBSUB NUMSUB");
        if count > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{channel} never got a subscriber");
}

pub async fn admin(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection")
}

/// Drop every pub/sub connection of the server, as a Redis restart does (at least one must exist).
pub async fn kill_pubsub_clients(admin: &mut redis::aio::MultiplexedConnection) {
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(admin)
        .await
        .expect("CLIENT KILL");
    assert!(killed >= 1, "no pub/sub client to kill");
}
