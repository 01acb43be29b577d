//! Commit batches on Redis: a batch is one Redis message and reaches the gateway's host bus as one batch; a
//! batch split over several messages (a big commit) that is cut by a Redis failure — the first message
//! delivered, the rest lost — is repaired exactly: every event once, in order. A separate test binary, so
//! killing every pub/sub client disturbs no other test.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::*;
use relay_bus::publisher::{batch_messages, MAX_BATCH_MESSAGE_BYTES};
use relay_bus::{channel_name, RedisPublisher, RedisSubscriber, SubscriberOptions};
use relay_core::bus::{BusEvent, EventReceiver};

/// Action `seq` with a frame of about `size` bytes.
fn big_action(seq: u64, size: usize) -> BusEvent {
    let mut event = action(seq, seq - 1);
    let padding = "x".repeat(size);
    event.frame = Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","method":"action","params":{{"serverSeq":{seq},"pad":"{padding}"}}}}"#
    ));
    event
}

#[tokio::test]
async fn a_commit_batch_is_one_message_and_one_batch_on_the_host_bus() {
    let Some(url) = redis_url() else { return };
    let host = unique_host("one-batch");
    let log = Arc::new(MemoryLog::default());
    let publisher = RedisPublisher::connect(&url).await.expect("publisher");
    let subscriber =
        RedisSubscriber::connect(&url, log.clone(), SubscriberOptions::default()).expect("subscriber");
    let mut rx = subscriber.follow_subscribed(&host).await;
    let batch: Vec<BusEvent> = (1..=5).map(|seq| action(seq, seq - 1)).collect();
    assert_eq!(batch_messages(&batch, MAX_BATCH_MESSAGE_BYTES).len(), 1);
    publisher.publish_batch(&host, &batch).await.expect("publish");
    let received = tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("no batch")
        .expect("bus open");
    assert_eq!(received.len(), 5, "the commit arrived as one batch");
    for (expected, got) in batch.iter().zip(received.iter()) {
        assert_same(expected, got);
    }
    assert!(log.calls.lock().is_empty(), "nothing was lost, nothing repaired");
}

#[tokio::test]
async fn a_split_batch_cut_by_a_redis_failure_is_repaired_exactly() {
    let Some(url) = redis_url() else { return };
    let host = unique_host("split-batch");
    let channel = channel_name(&host);
    let log = Arc::new(MemoryLog::default());
    let publisher = RedisPublisher::connect(&url).await.expect("publisher");
    let subscriber =
        RedisSubscriber::connect(&url, log.clone(), SubscriberOptions::default()).expect("subscriber");
    let mut admin = admin(&url).await;
    let mut rx = EventReceiver::new(subscriber.follow_subscribed(&host).await);
    let mut raw = admin.clone();

    // Round 1: a commit of 6 big actions travels as 3 messages; only the first is published, then every
    // pub/sub connection drops (as when Redis restarts): the rest of the batch is lost.
    let first: Vec<BusEvent> = (1..=6).map(|seq| big_action(seq, 200 * 1024)).collect();
    for event in &first {
        log.commit(event); // committed before it is published
    }
    let messages = batch_messages(&first, MAX_BATCH_MESSAGE_BYTES);
    assert_eq!(messages.len(), 3, "the batch is split");
    let _: u64 = redis::cmd("PUBLISH")
        .arg(&channel)
        .arg(messages[0].as_ref())
        .query_async(&mut raw)
        .await
        .expect("publish the first part");
    for event in &first[..2] {
        assert_same(event, &recv(&mut rx).await);
    }
    kill_pubsub_clients(&mut admin).await;
    // The subscriber reconnects and catches up from the shard's log, before or with the next commit.
    wait_subscribed(&mut admin, &channel).await;
    let next: Vec<BusEvent> = (7..=8).map(|seq| action(seq, seq - 1)).collect();
    for event in &next {
        log.commit(event);
    }
    publisher.publish_batch(&host, &next).await.expect("publish");
    for event in first[2..].iter().chain(&next) {
        assert_same(event, &recv(&mut rx).await);
    }

    // Round 2: a split batch whose first message is lost and the rest arrive: the gap before the second
    // part is repaired, and the parts that arrive are not delivered twice.
    let third: Vec<BusEvent> = (9..=14).map(|seq| big_action(seq, 200 * 1024)).collect();
    for event in &third {
        log.commit(event);
    }
    let messages = batch_messages(&third, MAX_BATCH_MESSAGE_BYTES);
    assert_eq!(messages.len(), 3);
    for message in &messages[1..] {
        let _: u64 = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg(message.as_ref())
            .query_async(&mut raw)
            .await
            .expect("publish a later part");
    }
    for event in &third {
        assert_same(event, &recv(&mut rx).await);
    }

    // Exactly once: the host's stream is ordered, so the next event after a closing commit is that commit —
    // a duplicate of anything above would have come first.
    let closing = action(15, 14);
    log.commit(&closing);
    publisher
        .publish_batch(&host, &[&closing])
        .await
        .expect("publish");
    assert_same(&closing, &recv(&mut rx).await);
    println!("repairs: {:?}", log.calls.lock());
}
