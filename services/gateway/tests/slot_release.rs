//! Connection slots given back to a real Redis (`REDIS_URL`; skipped without it, which `scripts/test` always
//! sets): thousands at once go back in a few round trips, and a gateway shutting down has given its slots back
//! when it is idle. In a test binary of their own: they hold the server's writes for a moment
//! ([`pause_redis_writes`]), which must not overlap other tests' Redis calls.

use std::sync::Arc;

use relay_gateway::quotas::TenantQuotas;
use relay_gateway::shared_quotas::SharedQuotas;

mod support;
use support::{limits, unique_tenant};

/// How many `ZREM` commands the Redis at `url` has run since it started (`INFO commandstats`).
async fn zrem_calls(url: &str) -> u64 {
    let client = redis::Client::open(url).expect("redis url");
    let mut connection = client.get_multiplexed_async_connection().await.expect("redis");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection)
        .await
        .expect("info");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_zrem:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().expect("a count"))
}

/// The size of `tenant`'s set of connection slots in the Redis at `url`.
async fn slots_held(url: &str, tenant: &str) -> usize {
    let client = redis::Client::open(url).expect("redis url");
    let mut connection = client.get_multiplexed_async_connection().await.expect("redis");
    redis::cmd("ZCARD")
        .arg(format!("ahp-relay:quota:{{{tenant}}}:slots"))
        .query_async(&mut connection)
        .await
        .expect("zcard")
}

/// Has the Redis at `url` hold every client's writes for a moment (reads go on): slots given back meanwhile
/// can only be gone once it ends, so a test that finds them gone at once saw a wait for them, not a race won.
async fn pause_redis_writes(url: &str) {
    let client = redis::Client::open(url).expect("redis url");
    let mut connection = client.get_multiplexed_async_connection().await.expect("redis");
    // Shorter than the gateway's Redis response timeout (500 ms), so what waits meanwhile does not fail.
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(300)
        .arg("WRITE")
        .query_async(&mut connection)
        .await
        .expect("client pause");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_given_back() {
    let Ok(url) = std::env::var("REDIS_URL") else {
        eprintln!("skipped: REDIS_URL not set");
        return;
    };
    // One after the other: each holds Redis's writes for a moment.
    thousands_of_slots_given_back_at_once_go_back_in_a_few_round_trips(&url).await;
    a_gateway_idle_after_its_connections_closed_has_given_their_slots_back(&url).await;
}

async fn thousands_of_slots_given_back_at_once_go_back_in_a_few_round_trips(url: &str) {
    const CONNECTIONS: usize = 3_000;
    // The gateway's Redis handle alone: no renewal runs beside the test.
    let shared = SharedQuotas::connect(url).await.expect("redis");
    let tenant = unique_tenant();
    let mut slots = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let slot = shared
            .take_slot(&tenant, CONNECTIONS, None)
            .await
            .expect("redis")
            .expect("under the cap");
        slots.push(slot);
    }
    assert_eq!(slots_held(url, &tenant).await, CONNECTIONS);

    let calls_before = zrem_calls(url).await;
    pause_redis_writes(url).await;
    for slot in slots {
        shared.release_slot(&tenant, slot); // every connection closes at once
    }
    shared.given_back().await;
    assert_eq!(
        slots_held(url, &tenant).await,
        0,
        "every slot is given back once given_back returns"
    );
    // One ZREM per round trip of up to RELEASES_PER_ROUND_TRIP slots (other test binaries may have run on this
    // Redis before, but none runs beside this one); one per slot would be 3,000.
    let calls = zrem_calls(url).await - calls_before;
    assert!(
        calls < 100,
        "{CONNECTIONS} slots given back with {calls} ZREM commands"
    );
    assert!(
        shared
            .take_slot(&tenant, CONNECTIONS, None)
            .await
            .expect("redis")
            .is_some(),
        "the cap is whole again"
    );
}

async fn a_gateway_idle_after_its_connections_closed_has_given_their_slots_back(url: &str) {
    let mut gateways = Vec::new();
    for _ in 0..2 {
        let shared = SharedQuotas::connect(url).await.expect("redis");
        let quotas = TenantQuotas::new(limits());
        quotas.share(shared);
        gateways.push(quotas);
    }
    let (a, b): (Arc<TenantQuotas>, Arc<TenantQuotas>) = (gateways.remove(0), gateways.remove(0));
    let tenant = unique_tenant();
    let first = a.admit_everywhere(&tenant, false).await.expect("one on a");
    let second = a.admit_everywhere(&tenant, false).await.expect("two on a");
    assert!(b.admit_everywhere(&tenant, false).await.is_none(), "at the cap");
    pause_redis_writes(url).await;
    drop((first, second));
    // What a gateway shutting down waits for before it exits.
    a.wait_idle().await;
    assert_eq!(slots_held(url, &tenant).await, 0);
    assert!(
        b.admit_everywhere(&tenant, false).await.is_some(),
        "the other gateway admits at once"
    );
}
