//! Issue 34 (3): a rolling upgrade, as `docs/operations.md` tells an operator to do it, with the previous
//! release's real binary. Two shards and two gateways of the previous release run on Postgres and Redis, two
//! devices share a chat whose turns keep running, and a client keeps binding new clientIds. Then the new
//! release's `migrate` runs, then one shard and one gateway are replaced (SIGTERM, then the new binary, a shard
//! on its own address), then the other pair. Nothing may be lost or repeated, every device resumes, no clientId binding is
//! pruned, and the migration (and the prune that replaced 0006's full-table update) holds no lock on
//! `client_bindings` longer than 1 s while that table has 1,000,000 rows, sampled from `pg_locks`.
//!
//! Needs `DATABASE_URL`, `REDIS_URL` and `AHP_RELAY_PREVIOUS_BIN` (the previous release's `ahp-relay`, built by
//! `scripts/previous-release`); `scripts/test` provides all three. Skipped, saying so, without them.

mod support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ahp::ClientConfig;
use relay_core::Role;
use sqlx::{Connection, Executor, PgConnection};
use support::devices::*;
use support::*;

/// Rows of `client_bindings` the upgrade runs against.
const SEEDED: i64 = 1_000_000;
/// The longest a lock on `client_bindings` may be held by the upgrade's work.
const LONGEST_HOLD: f64 = 1.0;

/// Postgres, Redis and the previous release's binary, or `None` (the test is skipped) when one is missing.
fn needs() -> Option<(String, String, PathBuf)> {
    match (
        std::env::var("DATABASE_URL"),
        std::env::var("REDIS_URL"),
        std::env::var("AHP_RELAY_PREVIOUS_BIN"),
    ) {
        (Ok(db), Ok(redis), Ok(previous)) if !previous.is_empty() => Some((db, redis, previous.into())),
        _ => {
            eprintln!(
                "skipped: DATABASE_URL, REDIS_URL and AHP_RELAY_PREVIOUS_BIN are needed (scripts/test sets all three; \
                 scripts/previous-release builds the previous release)"
            );
            None
        }
    }
}

/// A database of its own on the test server: the shared one is already on the new release's schema.
async fn fresh_database(url: &str) -> String {
    let name = format!("upgrade_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(url).await.expect("connect to Postgres");
    admin
        .execute(format!("CREATE DATABASE {name}").as_str())
        .await
        .expect("create a database");
    let (server, _) = url.rsplit_once('/').expect("a database name in DATABASE_URL");
    format!("{server}/{name}")
}

/// `url` with the connections' `application_name` set, so `pg_stat_activity` tells whose they are.
fn named(url: &str, name: &str) -> String {
    format!("{url}?application_name={name}")
}

/// The newest migration this source tree holds (its number).
fn newest_migration() -> i64 {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations/postgres");
    std::fs::read_dir(dir)
        .expect("migrations")
        .filter_map(|entry| {
            let name = entry.expect("entry").file_name();
            name.to_str()?.split('_').next()?.parse::<i64>().ok()
        })
        .max()
        .expect("a migration")
}

async fn schema_version(db: &str) -> i64 {
    let mut conn = PgConnection::connect(db).await.expect("connect");
    sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations")
        .fetch_one(&mut conn)
        .await
        .expect("schema version")
}

/// One number `sql` answers.
async fn number(db: &str, sql: &str) -> i64 {
    let mut conn = PgConnection::connect(db).await.expect("connect");
    sqlx::query_scalar(sql).fetch_one(&mut conn).await.expect(sql)
}

/// A million bindings of other tenants: half written by a release before 0006 (last use 0, which a prune must
/// not take for stale), half used a day ago.
async fn seed_bindings(db: &str) {
    let mut conn = PgConnection::connect(db).await.expect("connect");
    conn.execute(
        format!(
            "INSERT INTO client_bindings (tenant, host, client_id, subject, last_used_ms) \
             SELECT 'seeded-' || (i % 1000), 'default', 'client-' || i, 'user-' || (i % 5000), \
                    CASE WHEN i % 2 = 0 THEN 0 \
                         ELSE (EXTRACT(EPOCH FROM now()) * 1000)::BIGINT - 86400000 END \
             FROM generate_series(1, {SEEDED}) AS i"
        )
        .as_str(),
    )
    .await
    .expect("seed client_bindings");
    conn.execute("ANALYZE client_bindings").await.expect("analyze");
}

/// Run the `ahp-relay` at `program` with `args` to its end; it must succeed.
async fn run(program: &Path, args: &[&str]) {
    let status = tokio::process::Command::new(program)
        .args(args)
        .env_remove("DATABASE_URL")
        .status()
        .await
        .expect("run ahp-relay");
    assert!(status.success(), "ahp-relay {args:?} failed");
}

/// What the lock sampler saw: the longest any transaction had held a lock on `client_bindings` when sampled
/// (seconds since its transaction began), and whose (mode and application) it was.
#[derive(Debug, Default)]
struct Holds {
    /// By anyone, in a mode that blocks writers: one that conflicts with `RowExclusiveLock` (what a
    /// non-concurrent index build or a table rewrite takes).
    blocking_writers: (f64, String),
    /// By the new release's `migrate` and `compact` (any mode).
    by_the_upgrade: (f64, String),
    /// By anyone, in any mode (reported only: autovacuum, or a commit on a busy 2-core machine, may be slow).
    any: (f64, String),
    samples: usize,
}

/// Keep the longer of `held` and what `longest` holds.
fn longest(longest: &mut (f64, String), held: f64, whose: &str) {
    if held > longest.0 {
        *longest = (held, whose.to_string());
    }
}

/// Samples `pg_locks` every 5 ms until stopped.
struct LockSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Holds>,
}

impl LockSampler {
    async fn start(db: &str) -> LockSampler {
        let mut conn = PgConnection::connect(db).await.expect("connect");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut holds = Holds::default();
            while !stopped.load(Ordering::Relaxed) {
                // A lock held counts from its transaction's start; one waited for (queued: it holds up every
                // writer queued after it) from the start of its wait.
                let rows: Vec<(f64, String, String)> = sqlx::query_as(
                    "SELECT EXTRACT(EPOCH FROM clock_timestamp() - \
                              CASE WHEN l.granted THEN a.xact_start ELSE l.waitstart END)::float8, \
                            l.mode || CASE WHEN l.granted THEN '' ELSE ' (waiting)' END, \
                            COALESCE(a.application_name, '') \
                     FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                     WHERE l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                       AND l.locktype = 'relation' AND l.relation = 'client_bindings'::regclass \
                       AND l.pid <> pg_backend_pid() \
                       AND (CASE WHEN l.granted THEN a.xact_start ELSE l.waitstart END) IS NOT NULL",
                )
                .fetch_all(&mut conn)
                .await
                .expect("sample pg_locks");
                for (held, mode, application) in rows {
                    let whose = format!("{mode} by {application:?}");
                    longest(&mut holds.any, held, &whose);
                    let blocks_writers = [
                        "ShareLock",
                        "ShareRowExclusiveLock",
                        "ExclusiveLock",
                        "AccessExclusiveLock",
                    ]
                    .iter()
                    .any(|strong| mode.split(' ').next() == Some(strong));
                    if blocks_writers {
                        longest(&mut holds.blocking_writers, held, &whose);
                    }
                    if application.starts_with("ahp-relay-upgrade") {
                        longest(&mut holds.by_the_upgrade, held, &whose);
                    }
                }
                holds.samples += 1;
                // The sampling period, not a synchronisation.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            holds
        });
        LockSampler { stop, task }
    }

    async fn stop(self) -> Holds {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("sampler")
    }
}

/// A client that keeps binding new clientIds (an `initialize` each) through whichever gateways run, while the
/// fleet is replaced. Returns the clientIds that were bound (answered).
struct Binder {
    stop: Arc<AtomicBool>,
    gateways: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Binder {
    fn start(gateways: Vec<String>, token: String) -> Binder {
        let stop = Arc::new(AtomicBool::new(false));
        let gateways = Arc::new(Mutex::new(gateways));
        let (stopped, addresses) = (stop.clone(), gateways.clone());
        let task = tokio::spawn(async move {
            let mut bound = Vec::new();
            let mut n = 0usize;
            while !stopped.load(Ordering::Relaxed) {
                n += 1;
                let address = {
                    let addresses = addresses.lock().expect("gateways");
                    addresses[n % addresses.len()].clone()
                };
                let id = format!("binder-{n}");
                let url = format!("ws://{address}/v1/hosts/default/ws?access_token={token}");
                let attempt = async {
                    let transport = ahp_ws::WebSocketTransport::connect(&url).await.ok()?;
                    let client = ahp::Client::connect(
                        transport,
                        ClientConfig {
                            default_request_timeout: Some(Duration::from_secs(5)),
                            subscription_buffer: 16,
                        },
                    )
                    .await
                    .ok()?;
                    let answered = client
                        .initialize(id.clone(), vec!["1.0.0".into()], vec![])
                        .await
                        .is_ok();
                    client.shutdown().await;
                    answered.then_some(())
                };
                if tokio::time::timeout(Duration::from_secs(10), attempt)
                    .await
                    .ok()
                    .flatten()
                    .is_some()
                {
                    bound.push(id);
                }
                // The pace of the load, not a synchronisation.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            bound
        });
        Binder { stop, gateways, task }
    }

    fn replace(&self, index: usize, address: &str) {
        self.gateways.lock().expect("gateways")[index] = address.to_string();
    }

    async fn stop(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("binder")
    }
}

async fn start_shard(program: &Path, db: &str, redis: &str, listen: Option<&str>) -> Shard {
    let mut args = vec![
        "--database-url",
        db,
        "--redis-url",
        redis,
        "--lease-ttl",
        "3s",
        "--demo-step-ms",
        "30",
    ];
    if let Some(listen) = listen {
        args.extend(["--grpc-listen", listen]);
    }
    Shard::start_program(program, &args, &[]).await
}

/// Which of `shards` holds the tenant's `default` host, if any does.
async fn owner_of(db: &str, tenant: &str, shards: &[Shard]) -> Option<usize> {
    let mut conn = PgConnection::connect(db).await.expect("connect");
    let owner: Option<String> = sqlx::query_scalar(
        "SELECT owner FROM leases WHERE tenant = $1 AND host = 'default' \
         AND expires_at_ms > (EXTRACT(EPOCH FROM now()) * 1000)::BIGINT",
    )
    .bind(tenant)
    .fetch_optional(&mut conn)
    .await
    .expect("lease")
    .flatten();
    let owner = owner?;
    let url = owner.rsplit_once('#').map_or(owner.as_str(), |(url, _)| url);
    shards.iter().position(|shard| shard.url == url)
}

/// Start turn `id` and wait until `device` saw it under way (a few streamed envelopes).
async fn start_turn(device: &mut Device, chat: &str, id: &str) -> u64 {
    let before = device.last_seen();
    device
        .client
        .dispatch(
            chat.to_string(),
            turn_started(id, "a long answer, while the fleet rolls"),
        )
        .await
        .expect("dispatch");
    for _ in 0..3 {
        device.seen.push(next_envelope(&mut device.sub).await);
    }
    before
}

/// Both devices saw the turn that began after `before` end.
async fn both_see_the_turn_end(a: &mut Device, b: &mut Device, before: u64) {
    a.read_until(|e| is_turn_end(e) && e.server_seq > before).await;
    b.read_until(|e| is_turn_end(e) && e.server_seq > before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_rolls_to_the_new_release_under_load_losing_nothing_and_locking_nothing_long() {
    let Some((server, redis, previous)) = needs() else {
        return;
    };
    let current = PathBuf::from(env!("CARGO_BIN_EXE_ahp-relay"));
    let db = fresh_database(&server).await;

    // The previous release's fleet, on the previous schema, with a million bindings.
    let mut shards = vec![
        start_shard(&previous, &db, &redis, None).await,
        start_shard(&previous, &db, &redis, None).await,
    ];
    let urls = format!("{},{}", shards[0].url, shards[1].url);
    let gateway_args = ["--redis-url", redis.as_str()];
    let mut gateways = [
        Relay::gateway_of(&previous, &urls, &gateway_args).await,
        Relay::gateway_of(&previous, &urls, &gateway_args).await,
    ];
    let newest = newest_migration();
    assert_eq!(
        schema_version(&db).await,
        newest - 1,
        "the previous release's schema is the one before the newest migration"
    );
    seed_bindings(&db).await;

    let tenant = unique_tenant();
    let (creator, _) = gateways[0]
        .client_as(&tenant, "creator", Role::Member, "creator")
        .await;
    let (_, chat) = create_session_and_chat(&creator, "rolling").await;
    creator.shutdown().await;
    let mut a = Device::join(&gateways[0], &tenant, "device-a", &chat).await;
    let mut b = Device::join(&gateways[1], &tenant, "device-b", &chat).await;
    let sampler = LockSampler::start(&db).await;
    let binder = Binder::start(
        gateways.iter().map(|gateway| gateway.addr.clone()).collect(),
        gateways[0].token(&tenant, "binder", Role::Member),
    );

    // The sampler tells the upgrade's own connections by their application_name: it reaches Postgres through
    // the driver the relay uses.
    {
        use sqlx::Connection as _;
        sqlx::any::install_default_drivers();
        let mut probe = sqlx::AnyConnection::connect(&named(&db, "ahp-relay-upgrade-probe"))
            .await
            .expect("connect");
        let name: String = sqlx::query_scalar("SELECT current_setting('application_name')")
            .fetch_one(&mut probe)
            .await
            .expect("application_name");
        assert_eq!(name, "ahp-relay-upgrade-probe");
    }

    // 1. The new release migrates the store while a turn runs.
    let before = start_turn(&mut a, &chat, "t-migrate").await;
    let migrating = Instant::now();
    run(
        &current,
        &[
            "migrate",
            "--database-url",
            &named(&db, "ahp-relay-upgrade-migrate"),
        ],
    )
    .await;
    eprintln!("migrated to {newest} in {:?} under load", migrating.elapsed());
    assert_eq!(schema_version(&db).await, newest);
    both_see_the_turn_end(&mut a, &mut b, before).await;
    // A writer that does not know last_used_ms (a release before 0006, still running) binds a clientId: the
    // binding counts as used now, not at 0 (0009), so no prune may take it for stale.
    let mut old_writer = PgConnection::connect(&db).await.expect("connect");
    old_writer
        .execute(
            format!(
                "INSERT INTO client_bindings (tenant, host, client_id, subject) \
                 VALUES ('{tenant}', 'default', 'written-before-0006', 'someone')"
            )
            .as_str(),
        )
        .await
        .expect("an old writer's binding");
    let noted: i64 = sqlx::query_scalar(
        "SELECT last_used_ms FROM client_bindings WHERE tenant = $1 AND client_id = 'written-before-0006'",
    )
    .bind(&tenant)
    .fetch_one(&mut old_writer)
    .await
    .expect("its use");
    assert!(noted > 0, "an old writer's binding is noted as used at {noted}");

    // 2. One shard and one gateway, then the other pair: each stopped with SIGTERM mid-turn and replaced (a
    // shard on its own address) by the new release, so new gateways meet old shards and old gateways new ones.
    // Which gateway each device is on: a on the first, b on the second.
    let (mut a_on, mut b_on) = (0, 1);
    let mut followed = 0;
    for index in 0..2 {
        let owner = owner_of(&db, &tenant, &shards).await;
        let before = start_turn(&mut a, &chat, &format!("t-shard-{index}")).await;
        assert!(
            shards[index].terminate().await,
            "the shard exited cleanly on SIGTERM"
        );
        let address = shards[index].url.trim_start_matches("http://").to_string();
        if owner == Some(index) {
            // The host moved: both devices are closed and resume, each through the other gateway.
            a.read_until_closed().await;
            b.read_until_closed().await;
            (a_on, b_on) = (1 - a_on, 1 - b_on);
            a.resume(&gateways[a_on], &tenant, &chat).await;
            b.resume(&gateways[b_on], &tenant, &chat).await;
            followed += 1;
        }
        shards[index] = start_shard(&current, &db, &redis, Some(&address)).await;
        both_see_the_turn_end(&mut a, &mut b, before).await;

        // Its gateway: the devices on it resume through the other.
        let before = start_turn(&mut a, &chat, &format!("t-gateway-{index}")).await;
        assert!(
            gateways[index].terminate().await,
            "the gateway exited cleanly on SIGTERM"
        );
        if a_on == index {
            a.read_until_closed().await;
            a_on = 1 - index;
            a.resume(&gateways[a_on], &tenant, &chat).await;
        }
        if b_on == index {
            b.read_until_closed().await;
            b_on = 1 - index;
            b.resume(&gateways[b_on], &tenant, &chat).await;
        }
        gateways[index] = Relay::gateway_of(&current, &urls, &gateway_args).await;
        binder.replace(index, &gateways[index].addr);
        both_see_the_turn_end(&mut a, &mut b, before).await;
    }
    assert!(
        followed >= 1,
        "the host's owner was replaced and the devices followed it"
    );

    // The whole fleet is new: one more turn, then the prune a shard's retention job runs.
    let before = start_turn(&mut a, &chat, "t-new").await;
    both_see_the_turn_end(&mut a, &mut b, before).await;
    let bound = binder.stop().await;
    run(
        &current,
        &[
            "compact",
            "--retention",
            "7d",
            "--database-url",
            &named(&db, "ahp-relay-upgrade-compact"),
        ],
    )
    .await;
    let holds = sampler.stop().await;
    eprintln!(
        "{} samples of pg_locks on client_bindings ({SEEDED} rows): longest hold by the upgrade {:.3} s ({}), \
         in a mode blocking writers {:.3} s ({}), by anyone {:.3} s ({}); {} clientIds bound during the roll",
        holds.samples,
        holds.by_the_upgrade.0,
        holds.by_the_upgrade.1,
        holds.blocking_writers.0,
        holds.blocking_writers.1,
        holds.any.0,
        holds.any.1,
        bound.len()
    );

    // Nothing lost or repeated: each device's envelopes strictly increase, both saw the same ones, and each
    // reduces to what a new device is given.
    assert_increasing(&a.seen);
    assert_increasing(&b.seen);
    let from = a.from.max(b.from);
    assert_eq!(after(&a.seen, from), after(&b.seen, from));
    let fresh = fresh_chat_snapshot_for(&gateways[0], &tenant, &chat).await;
    assert_eq!(json(&a.reduced()), json(&fresh));
    assert_eq!(json(&b.reduced()), json(&fresh));
    let ids: Vec<&str> = fresh.turns.iter().map(|turn| turn.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "t-migrate",
            "t-shard-0",
            "t-gateway-0",
            "t-shard-1",
            "t-gateway-1",
            "t-new"
        ],
        "every turn of the roll is in the chat, once, in order"
    );

    // No binding pruned: the million, the devices' and every one made during the roll.
    assert_eq!(
        number(
            &db,
            "SELECT COUNT(*) FROM client_bindings WHERE tenant LIKE 'seeded-%'"
        )
        .await,
        SEEDED
    );
    assert!(!bound.is_empty(), "no clientId was bound during the roll");
    let mut kept = PgConnection::connect(&db).await.expect("connect");
    for client_id in bound
        .iter()
        .map(String::as_str)
        .chain(["device-a", "device-b", "written-before-0006"])
    {
        let found: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM client_bindings WHERE tenant = $1 AND client_id = $2")
                .bind(&tenant)
                .bind(client_id)
                .fetch_one(&mut kept)
                .await
                .expect("binding");
        assert_eq!(found, 1, "the binding of {client_id} was pruned");
    }

    assert!(holds.samples > 100, "{} samples", holds.samples);
    assert!(
        holds.by_the_upgrade.0 <= LONGEST_HOLD && holds.blocking_writers.0 <= LONGEST_HOLD,
        "a lock on client_bindings was held too long: {holds:?}"
    );
}

/// A migration that cannot get its lock at once (a long transaction holds `client_bindings`) never holds up the
/// table's writers for longer than `MIGRATION_LOCK_TIMEOUT` (1 s) at a time: queued behind the transaction it
/// gives way, pauses while the writers go on, and tries again — and once the transaction ends it completes.
/// (Without the timeout, the migration waits in the lock queue and every writer after it waits behind it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_behind_a_long_transaction_gives_way_to_writers_and_completes_after_it() {
    let Some((server, _, previous)) = needs() else {
        return;
    };
    let current = PathBuf::from(env!("CARGO_BIN_EXE_ahp-relay"));
    let db = fresh_database(&server).await;
    run(&previous, &["migrate", "--database-url", &db]).await;
    let newest = newest_migration();
    assert_eq!(schema_version(&db).await, newest - 1);
    let mut long = PgConnection::connect(&db).await.expect("connect");
    long.execute("BEGIN").await.expect("begin");
    long.execute("LOCK TABLE client_bindings IN ACCESS SHARE MODE")
        .await
        .expect("hold the table");
    let mut migrate = tokio::process::Command::new(&current)
        .args(["migrate", "--database-url", &db])
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("migrate");
    // Writers of the table for 6 s while the migration waits: each is held up a second at most (the
    // migration's queued lock), never until the long transaction ends.
    let mut writer = PgConnection::connect(&db).await.expect("connect");
    let mut longest = Duration::ZERO;
    let writing = Instant::now();
    let mut n = 0;
    while writing.elapsed() < Duration::from_secs(6) {
        n += 1;
        let started = Instant::now();
        let insert = sqlx::query(
            "INSERT INTO client_bindings (tenant, host, client_id, subject, last_used_ms) \
             VALUES ('writer', 'default', $1, 'w', 1)",
        )
        .bind(format!("w{n}"))
        .execute(&mut writer);
        tokio::time::timeout(Duration::from_secs(10), insert)
            .await
            .expect("a writer waited 10 s behind the queued migration")
            .expect("insert");
        longest = longest.max(started.elapsed());
        // The writers' pace, not a synchronisation.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("{n} writes while the migration waited; the longest took {longest:?}");
    assert!(
        longest < Duration::from_secs(3),
        "a writer waited {longest:?} behind the migration's queued lock"
    );
    assert_eq!(
        schema_version(&db).await,
        newest - 1,
        "the migration ran through a held lock"
    );
    assert!(
        migrate.try_wait().expect("try_wait").is_none(),
        "the migration stopped trying while the transaction held the table"
    );
    long.execute("COMMIT").await.expect("release the table");
    let status = tokio::time::timeout(Duration::from_secs(30), migrate.wait())
        .await
        .expect("the migration did not complete once the table was free")
        .expect("wait");
    let mut said = String::new();
    if let Some(mut stderr) = migrate.stderr.take() {
        use tokio::io::AsyncReadExt;
        let _ = stderr.read_to_string(&mut said).await;
    }
    assert!(status.success(), "migrate failed: {said}");
    assert!(said.contains("gave way"), "the migration never gave way: {said}");
    assert_eq!(schema_version(&db).await, newest);
}
