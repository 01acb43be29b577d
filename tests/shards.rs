//! Several shards behind several gateways (issue 4, acceptance 1, 2, 3 and 6): hosts are placed on shards by
//! lease, gateways route to the owner, and when the owner dies (SIGKILL) or shuts down (SIGTERM) another
//! shard takes the host over; clients resume with nothing lost or duplicated and `serverSeq` continues
//! upward.
//!
//! Every process is real: two `ahp-relay shard` processes on one Postgres, publishing to Redis, and two
//! `ahp-relay gateway` processes following hosts over Redis, each given both shards. Needs `DATABASE_URL`
//! and `REDIS_URL` (scripts/test starts both); skipped without them.

mod support;

use std::time::{Duration, Instant};

use relay_core::Role;
use support::devices::*;
use support::*;

/// The lease TTL the shards run with: the default.
const LEASE_TTL: &str = "3s";

/// Postgres and Redis URLs, or `None` (the test is skipped) when either is missing.
fn backends() -> Option<(String, String)> {
    match (std::env::var("DATABASE_URL"), std::env::var("REDIS_URL")) {
        (Ok(db), Ok(redis)) => Some((db, redis)),
        _ => {
            eprintln!("skipped: DATABASE_URL and REDIS_URL are needed (scripts/test starts both)");
            None
        }
    }
}

/// Two shards on one store and two gateways in front of both.
struct Cluster {
    shards: Vec<Shard>,
    gateways: Vec<Relay>,
    database_url: String,
}

impl Cluster {
    /// With `redis_url`, shards publish to Redis and gateways follow hosts there; without, gateways follow
    /// hosts over the owning shard's gRPC `Events` stream.
    async fn start(database_url: &str, redis_url: Option<&str>) -> Cluster {
        let mut shard_args = vec![
            "--database-url",
            database_url,
            "--lease-ttl",
            LEASE_TTL,
            "--demo-step-ms",
            "30",
        ];
        let mut gateway_args = Vec::new();
        if let Some(redis_url) = redis_url {
            shard_args.extend(["--redis-url", redis_url]);
            gateway_args.extend(["--redis-url", redis_url]);
        }
        let shards = vec![Shard::start(&shard_args).await, Shard::start(&shard_args).await];
        let urls = format!("{},{}", shards[0].url, shards[1].url);
        let gateways = vec![
            Relay::gateway_with(&urls, &gateway_args).await,
            Relay::gateway_with(&urls, &gateway_args).await,
        ];
        Cluster {
            shards,
            gateways,
            database_url: database_url.to_string(),
        }
    }

    /// The index of the shard whose lease on the tenant's `default` host is current.
    async fn owner_of(&self, tenant: &str) -> usize {
        let store = relay_store::Store::connect(&self.database_url)
            .await
            .expect("store");
        let lease = store
            .lease_of(tenant, "default")
            .await
            .expect("lease")
            .expect("the host is leased");
        let url = lease
            .owner
            .rsplit_once('#')
            .map_or(lease.owner.as_str(), |(url, _)| url);
        self.shards
            .iter()
            .position(|shard| shard.url == url)
            .unwrap_or_else(|| panic!("lease owner {url} is none of the shards"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_spread_over_two_shards_and_clients_on_two_gateways_share_a_session() {
    let Some((db, redis)) = backends() else { return };
    let cluster = Cluster::start(&db, Some(&redis)).await;
    // Hosts are placed over both shards: sixteen tenants' default hosts, each leased by one of them.
    let mut owners = [0usize; 2];
    let mut tenants = Vec::new();
    for _ in 0..16 {
        let tenant = unique_tenant();
        let (client, _) = cluster.gateways[0]
            .client_as(&tenant, "probe", Role::Member, "probe")
            .await;
        client.shutdown().await;
        owners[cluster.owner_of(&tenant).await] += 1;
        tenants.push(tenant);
    }
    assert!(owners[0] > 0 && owners[1] > 0, "hosts per shard: {owners:?}");

    // Two devices on two gateways share one session; both receive identical envelopes.
    let tenant = &tenants[0];
    let (creator, _) = cluster.gateways[0]
        .client_as(tenant, "creator", Role::Member, "creator")
        .await;
    let (_, chat) = create_session_and_chat(&creator, "shared").await;
    let mut a = Device::join(&cluster.gateways[0], tenant, "device-a", &chat).await;
    let mut b = Device::join(&cluster.gateways[1], tenant, "device-b", &chat).await;
    a.client
        .dispatch(chat.clone(), turn_started("t1", "hello from two shards"))
        .await
        .expect("dispatch");
    a.read_until(is_turn_complete).await;
    b.read_until(is_turn_complete).await;
    let from = a.from.max(b.from);
    assert_eq!(after(&a.seen, from), after(&b.seen, from));
    assert_increasing(&a.seen);
    assert_eq!(
        json(&a.reduced()),
        json(&fresh_chat_snapshot_for(&cluster.gateways[1], tenant, &chat).await)
    );

    // Device A drops and resumes on the other gateway: nothing twice, nothing skipped.
    let dropped_at = a.last_seen();
    a.client.shutdown().await;
    b.client
        .dispatch(chat.clone(), turn_started("t2", "while A is away"))
        .await
        .expect("dispatch");
    b.read_until(|e| is_turn_complete(e) && e.server_seq > dropped_at)
        .await;
    a.resume(&cluster.gateways[1], tenant, &chat).await;
    a.read_until(|e| is_turn_complete(e) && e.server_seq > dropped_at)
        .await;
    assert_increasing(&a.seen);
    assert_eq!(after(&a.seen, from), after(&b.seen, from));
    assert_eq!(
        json(&a.reduced()),
        json(&fresh_chat_snapshot_for(&cluster.gateways[0], tenant, &chat).await)
    );
}

/// Kill (`SIGKILL`) or stop (`SIGTERM`) the shard serving the chat mid-turn and check that both devices
/// resume exactly on the other shard. Returns how long the host was unavailable: from the kill until the
/// first device's `reconnect` was answered by the new owner. `over_redis`: the gateways follow the host over
/// Redis (else over the owner's gRPC `Events` stream).
async fn owner_goes_away_mid_turn(kill: bool, over_redis: bool) -> Option<Duration> {
    let (db, redis) = backends()?;
    let mut cluster = Cluster::start(&db, over_redis.then_some(redis.as_str())).await;
    let tenant = unique_tenant();
    let (creator, _) = cluster.gateways[0]
        .client_as(&tenant, "creator", Role::Member, "creator")
        .await;
    let (_, chat) = create_session_and_chat(&creator, "failover").await;
    creator.shutdown().await;
    let mut a = Device::join(&cluster.gateways[0], &tenant, "device-a", &chat).await;
    let mut b = Device::join(&cluster.gateways[1], &tenant, "device-b", &chat).await;
    let owner = cluster.owner_of(&tenant).await;

    a.client
        .dispatch(chat.clone(), turn_started("t1", "a long answer, interrupted"))
        .await
        .expect("dispatch");
    // Mid-turn: a few streamed envelopes in, the turn still running.
    for _ in 0..4 {
        a.seen.push(next_envelope(&mut a.sub).await);
    }
    assert!(
        !a.seen.iter().any(is_turn_end),
        "the turn ended before the shard went away"
    );
    let went_away = Instant::now();
    if kill {
        cluster.shards[owner].kill().await;
    } else {
        assert!(
            cluster.shards[owner].terminate().await,
            "the shard exited cleanly on SIGTERM"
        );
    }
    // Both gateways close their clients' connections (the shard's ownership watch ended) ...
    a.read_until_closed().await;
    b.read_until_closed().await;
    // ... and the clients resume through the other gateway each, landing on the surviving shard.
    a.resume(&cluster.gateways[1], &tenant, &chat).await;
    let unavailable = went_away.elapsed();
    b.resume(&cluster.gateways[0], &tenant, &chat).await;
    assert_eq!(
        cluster.owner_of(&tenant).await,
        1 - owner,
        "the other shard serves the host now"
    );

    // The interrupted turn ended (restored as a resumable error) and a new turn runs on the new owner.
    a.read_until(is_turn_end).await;
    b.read_until(is_turn_end).await;
    let before = a.last_seen().max(b.last_seen());
    a.client
        .dispatch(chat.clone(), turn_started("t2", "after the move"))
        .await
        .expect("dispatch on the new owner");
    a.read_until(|e| is_turn_complete(e) && e.server_seq > before)
        .await;
    b.read_until(|e| is_turn_complete(e) && e.server_seq > before)
        .await;

    // Nothing lost or duplicated: each device's envelopes strictly increase, both saw the same envelopes,
    // and each reduces to exactly the state a fresh subscriber gets.
    assert_increasing(&a.seen);
    assert_increasing(&b.seen);
    let from = a.from.max(b.from);
    assert_eq!(after(&a.seen, from), after(&b.seen, from));
    let fresh = fresh_chat_snapshot_for(&cluster.gateways[0], &tenant, &chat).await;
    assert_eq!(json(&a.reduced()), json(&fresh));
    assert_eq!(json(&b.reduced()), json(&fresh));
    // serverSeq continued upward across the move.
    let last_before_move = a.seen[3].server_seq;
    assert!(a.seen.iter().skip(4).all(|e| e.server_seq > last_before_move));
    Some(unavailable)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_killed_mid_turn_loses_its_hosts_to_the_other_within_the_lease() {
    let Some(unavailable) = owner_goes_away_mid_turn(true, true).await else {
        return;
    };
    // Reported, not asserted to the millisecond (the machine is shared): the lease TTL bounds it.
    eprintln!("failover after SIGKILL: host served again after {unavailable:?} (lease TTL {LEASE_TTL})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_stopped_with_sigterm_hands_its_hosts_over_without_waiting_for_expiry() {
    let Some(unavailable) = owner_goes_away_mid_turn(false, true).await else {
        return;
    };
    eprintln!("handover after SIGTERM: host served again after {unavailable:?} (lease TTL {LEASE_TTL})");
    // The lease was released, not left to lapse: the host moved faster than the TTL could allow.
    assert!(
        unavailable < Duration::from_secs(3),
        "the host waited {unavailable:?}: as long as a lease lapsing ({LEASE_TTL})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_gateways_follow_the_owners_events_stream_and_move_with_the_host() {
    let Some(unavailable) = owner_goes_away_mid_turn(true, false).await else {
        return;
    };
    eprintln!("failover after SIGKILL (gRPC Events, no Redis): host served again after {unavailable:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_stopped_with_sigterm_moves_its_clients_to_the_other_gateway() {
    let Some((db, redis)) = backends() else { return };
    let mut cluster = Cluster::start(&db, Some(&redis)).await;
    let tenant = unique_tenant();
    let (creator, _) = cluster.gateways[1]
        .client_as(&tenant, "creator", Role::Member, "creator")
        .await;
    let (_, chat) = create_session_and_chat(&creator, "gateway-stop").await;
    creator.shutdown().await;
    let mut a = Device::join(&cluster.gateways[0], &tenant, "device-a", &chat).await;
    let mut b = Device::join(&cluster.gateways[1], &tenant, "device-b", &chat).await;
    a.client
        .dispatch(
            chat.clone(),
            turn_started("t1", "keep going while my gateway restarts"),
        )
        .await
        .expect("dispatch");
    for _ in 0..4 {
        a.seen.push(next_envelope(&mut a.sub).await);
    }
    assert!(
        cluster.gateways[0].terminate().await,
        "the gateway exited cleanly on SIGTERM"
    );
    a.read_until_closed().await;
    a.resume(&cluster.gateways[1], &tenant, &chat).await;
    a.read_until(is_turn_complete).await;
    b.read_until(is_turn_complete).await;
    assert_increasing(&a.seen);
    let from = a.from.max(b.from);
    assert_eq!(
        after(&a.seen, from),
        after(&b.seen, from),
        "nothing lost or repeated"
    );
    assert_eq!(
        json(&a.reduced()),
        json(&fresh_chat_snapshot_for(&cluster.gateways[1], &tenant, &chat).await)
    );
}

/// A clientId belongs to the first user that used it also after its host fails over to another shard: the
/// binding is in the store, so the new owner refuses another subject's `initialize` and `reconnect` with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_id_stays_with_its_owner_after_a_failover() {
    let Some((db, redis)) = backends() else {
        return;
    };
    let mut cluster = Cluster::start(&db, Some(&redis)).await;
    let tenant = unique_tenant();
    let (ana, _) = cluster.gateways[0]
        .client_as(&tenant, "ana", Role::Member, "ana-laptop")
        .await;
    ana.shutdown().await;
    let owner = cluster.owner_of(&tenant).await;
    cluster.shards[owner].kill().await;
    // Bob tries to take the clientId through the other gateway until the surviving shard answers (while
    // the lease lapses, the gateway answers that the host is unavailable).
    let deadline = Instant::now() + PATIENCE;
    let refusal = loop {
        assert!(Instant::now() < deadline, "the host never came back");
        let bob = cluster.gateways[1].connect(&tenant, "bob", Role::Member).await;
        match bob
            .initialize("ana-laptop".into(), vec!["1.0.0".into()], vec![])
            .await
        {
            Ok(_) => panic!("bob took ana's clientId after the failover"),
            Err(ahp::ClientError::Rpc(e)) if e.code == -32009 => break e,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert_eq!(
        cluster.owner_of(&tenant).await,
        1 - owner,
        "the other shard answered"
    );
    eprintln!("refused after the failover: {}", refusal.message);
    let bob = cluster.gateways[1].connect(&tenant, "bob", Role::Member).await;
    assert!(
        bob.reconnect("ana-laptop".into(), 0, vec![]).await.is_err(),
        "bob took ana's clientId with reconnect"
    );
    let ana = cluster.gateways[1].connect(&tenant, "ana", Role::Member).await;
    ana.initialize("ana-laptop".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("ana keeps her clientId");
}
