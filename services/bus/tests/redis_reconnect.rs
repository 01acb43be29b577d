//! The subscriber survives losing its Redis connection (`CLIENT KILL TYPE pubsub`, as in a Redis restart):
//! it reconnects, re-subscribes and, with the repair source, delivers every event exactly once in order.
//! A separate test binary, so killing every pub/sub client disturbs no other test.

mod common;

use std::sync::Arc;

use common::*;
use relay_bus::{channel_name, RedisPublisher, RedisSubscriber, SubscriberOptions};
use relay_core::bus::BusEvent;

#[tokio::test]
async fn reconnects_and_repairs_across_connection_loss() {
    let Some(url) = redis_url() else { return };
    let host = unique_host("reconnect");
    let channel = channel_name(&host);
    let log = Arc::new(MemoryLog::default());
    let publisher = RedisPublisher::connect(&url).await.expect("publisher");
    let subscriber =
        RedisSubscriber::connect(&url, log.clone(), SubscriberOptions::default()).expect("subscriber");
    let mut admin = admin(&url).await;
    let mut rx = relay_core::bus::EventReceiver::new(subscriber.follow(&host));
    wait_subscribed(&mut admin, &channel).await;

    let send = |event: BusEvent| {
        log.commit(&event);
        let publisher = publisher.clone();
        let host = host.clone();
        async move { publisher.publish(&host, &event).await.expect("publish") }
    };
    let mut expected = Vec::new();
    for (seq, prev) in [(1, 0), (2, 1)] {
        send(action(seq, prev)).await;
        expected.push(action(seq, prev));
    }
    for e in &expected {
        assert_same(e, &recv(&mut rx).await);
    }

    // Round 1: actions published while the subscriber is (most likely) disconnected; the next action reveals
    // the gap through its prev_seq.
    kill_pubsub_clients(&mut admin).await;
    let mut expected = Vec::new();
    for (seq, prev) in [(3, 2), (4, 3)] {
        send(action(seq, prev)).await;
        expected.push(action(seq, prev));
    }
    wait_subscribed(&mut admin, &channel).await;
    send(action(5, 4)).await;
    expected.push(action(5, 4));
    for e in &expected {
        assert_same(e, &recv(&mut rx).await);
    }

    // Round 2: the first event after reconnecting is a notification; the lost action comes first (repaired
    // when the subscriber re-subscribes, or up to the notification's seq).
    kill_pubsub_clients(&mut admin).await;
    send(action(6, 5)).await;
    wait_subscribed(&mut admin, &channel).await;
    send(notification(6, 6)).await;
    send(action(7, 6)).await;
    for e in [action(6, 5), notification(6, 6), action(7, 6)] {
        assert_same(&e, &recv(&mut rx).await);
    }

    // Round 3: nothing follows the lost action: re-subscribing alone repairs it.
    kill_pubsub_clients(&mut admin).await;
    send(action(8, 7)).await;
    assert_same(&action(8, 7), &recv(&mut rx).await);

    // Nothing extra (no duplicate from a repair overlapping a live delivery) is pending.
    assert!(rx.try_recv().is_err(), "an event was delivered twice");
    println!("repairs: {:?}", log.calls.lock());
}
