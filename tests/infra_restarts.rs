//! The distributed shape survives its infrastructure failing under a live stream (issue 4): a shard and two
//! gateways following the host over Redis, one client on each gateway subscribed to one chat, and a demo turn
//! streaming, when
//! - Redis is killed (SIGKILL) and started again on the same port: both gateways reconnect and fetch what was
//!   published meanwhile from the shard (design §6, invariant 10);
//! - only one gateway's Redis subscriber connection is cut: that gateway repairs its gap, the other one keeps
//!   streaming live from Redis without needing any repair;
//! - Postgres is stopped (`pg_ctl stop -m immediate`) for a moment while the agent streams and a client
//!   dispatches, then started again: no client received anything the store did not hold when it went down
//!   (checked on a copy of the stopped cluster: durable before visible, invariant 2), what was dispatched
//!   during the outage is committed and delivered after it, and new turns run;
//! - the answer to a COMMIT is lost although the commit went through (a proxy cuts the connection right
//!   then): the shard does not write the batch again and goes on.
//!
//! In every case each client receives every envelope of the chat exactly once, in increasing `serverSeq`
//! order: both clients' sequences are identical JSON, equal to the store's log of the chat, and reduce to
//! a fresh snapshot (invariants 3 and 4).
//!
//! Each test starts its own redis-server (and its own Postgres cluster through `scripts/pg-cluster`) on a
//! free loopback port, so it can kill and restart them without disturbing other tests. A missing binary
//! fails the test with a message saying so (scripts/test installs Redis and PostgreSQL).

mod support;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ahp::{Client, SessionSubscription, SubscriptionEvent};
use ahp_types::actions::{ActionEnvelope, ChatPendingMessageSetAction, StateAction};
use ahp_types::state::{ChatState, PendingMessageKind};
use relay_core::Role;
use support::redis_bus::{channel_of, wait_subscribers};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// Pause between the demo agent's streamed actions: a turn on [`long_prompt`] streams for about two seconds.
const DEMO_STEP_MS: &str = "25";

/// A prompt long enough that the demo agent's reply takes ~80 streamed chunks.
fn long_prompt() -> String {
    (1..=300).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ")
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port()
}

/// A redis-server of this test's own (persistence off) on a fixed loopback port, killed when dropped.
struct RedisServer {
    binary: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    async fn start() -> RedisServer {
        let mut server = RedisServer {
            binary: redis_server_binary(),
            port: free_port(),
            dir: tempfile::tempdir().expect("tempdir"),
            child: None,
        };
        server.launch().await;
        server
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Start redis-server on the port and wait (bounded) until it answers PING.
    async fn launch(&mut self) {
        assert!(self.child.is_none(), "redis-server is already running");
        let log = self.dir.path().join("server.log");
        let mut child = Command::new(&self.binary)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .arg("--dir")
            .arg(self.dir.path())
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--logfile",
            ])
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.binary.display()));
        let ready = tokio::time::timeout(PATIENCE, async {
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    let log = std::fs::read_to_string(&log).unwrap_or_default();
                    panic!("redis-server exited ({status}) on port {}:\n{log}", self.port);
                }
                if ping(&self.url()).await {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(
            ready.is_ok(),
            "redis-server on port {} did not answer PING",
            self.port
        );
        self.child = Some(child);
    }

    /// SIGKILL redis-server (every connection to it is cut, nothing it held survives) and wait until it is gone.
    async fn kill(&mut self) {
        let mut child = self.child.take().expect("redis-server is running");
        child.start_kill().expect("SIGKILL redis-server");
        child.wait().await.expect("wait for redis-server");
    }

    async fn control(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to redis")
    }
}

/// redis-server from the PATH, /usr/bin, /usr/sbin or /usr/local/bin (as scripts/with-redis finds it).
fn redis_server_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin", "/usr/local/bin"].map(PathBuf::from))
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
        .expect(
            "redis-server not found in PATH, /usr/bin, /usr/sbin or /usr/local/bin: install Redis \
             (scripts/test does, through scripts/with-redis)",
        )
}

/// Whether a Redis server answers PING at `url` (within a second).
async fn ping(url: &str) -> bool {
    let attempt = async {
        let mut conn = redis::Client::open(url)
            .ok()?
            .get_multiplexed_async_connection()
            .await
            .ok()?;
        redis::cmd("PING").query_async::<String>(&mut conn).await.ok()
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), attempt).await,
        Ok(Some(pong)) if pong == "PONG"
    )
}

/// The ids of the Redis connections in pub/sub mode.
async fn pubsub_client_ids(conn: &mut redis::aio::MultiplexedConnection) -> HashSet<u64> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(conn)
        .await
        .expect("CLIENT LIST TYPE pubsub");
    list.lines()
        .filter_map(|line| line.split(' ').find_map(|field| field.strip_prefix("id=")))
        .map(|id| id.parse().expect("client id"))
        .collect()
}

/// A throw-away PostgreSQL cluster of this test's own (scripts/pg-cluster) on a fixed loopback port; stopped
/// when dropped.
struct PostgresServer {
    dir: tempfile::TempDir,
    port: u16,
    running: bool,
}

fn pg_cluster_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/pg-cluster")
}

/// Run `scripts/pg-cluster ARGS` and fail with its output if it fails.
async fn pg_cluster(args: &[&str]) {
    let mut command = Command::new(pg_cluster_script());
    command.args(args).stdin(Stdio::null()).kill_on_drop(true);
    let output = tokio::time::timeout(PATIENCE * 3, command.output())
        .await
        .unwrap_or_else(|_| panic!("scripts/pg-cluster {args:?} did not finish"))
        .expect("run scripts/pg-cluster");
    assert!(
        output.status.success(),
        "scripts/pg-cluster {args:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl PostgresServer {
    async fn start() -> PostgresServer {
        let mut server = PostgresServer::stopped();
        pg_cluster(&["init", server.dir_arg()]).await;
        server.launch().await;
        server
    }

    /// A directory for a cluster, and a port for it; nothing runs yet.
    fn stopped() -> PostgresServer {
        // Under /tmp: the server's user must reach it, and its socket path must stay short.
        let dir = tempfile::Builder::new()
            .prefix("infra-restarts-pg.")
            .tempdir_in("/tmp")
            .expect("tempdir");
        PostgresServer {
            dir,
            port: free_port(),
            running: false,
        }
    }

    /// A copy of this stopped cluster, on a port of its own and not running: it holds exactly what this one
    /// held when it stopped.
    async fn copy_stopped(&self) -> PostgresServer {
        assert!(!self.running, "stop the server before copying it");
        let copy = PostgresServer::stopped();
        pg_cluster(&["copy", self.dir_arg(), copy.dir_arg()]).await;
        copy
    }

    fn dir_arg(&self) -> &str {
        self.dir.path().to_str().expect("utf-8 temp dir")
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Start the server on its port; returns once it accepts connections (crash recovery done).
    async fn launch(&mut self) {
        pg_cluster(&["start", self.dir_arg(), &self.port.to_string()]).await;
        self.running = true;
    }

    /// `pg_ctl stop -m immediate`: every backend dies at once, like a crash; returns once the server is gone.
    async fn stop_immediately(&mut self) {
        pg_cluster(&["stop", self.dir_arg(), "immediate"]).await;
        self.running = false;
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if self.running {
            let _ = std::process::Command::new(pg_cluster_script())
                .args(["stop", self.dir_arg(), "immediate"])
                .stdin(Stdio::null())
                .status();
        }
    }
}

/// A TCP proxy in front of Postgres that can lose the answer to one COMMIT. Armed, it passes the next
/// `COMMIT` a client sends on to the server and, when the server answers it (the transaction is committed),
/// closes that connection instead of passing the answer back: the client sees its commit fail although it
/// went through — an in-doubt commit, as when a network or a server fails at the wrong moment.
struct CommitAnswerCutter {
    port: u16,
    armed: Arc<AtomicBool>,
    /// How many answers were cut.
    cuts: watch::Receiver<u32>,
    task: tokio::task::JoinHandle<()>,
}

impl CommitAnswerCutter {
    async fn start(upstream_port: u16) -> CommitAnswerCutter {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let armed = Arc::new(AtomicBool::new(false));
        let (cuts_tx, cuts) = watch::channel(0);
        let cuts_tx = Arc::new(cuts_tx);
        let task = tokio::spawn({
            let armed = Arc::clone(&armed);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    // A refused upstream connection drops the client's: it sees the server down.
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await {
                        tokio::spawn(Self::pass(
                            client,
                            server,
                            Arc::clone(&armed),
                            Arc::clone(&cuts_tx),
                        ));
                    }
                }
            }
        });
        CommitAnswerCutter {
            port,
            armed,
            cuts,
            task,
        }
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Lose the answer to the next COMMIT.
    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Wait (bounded) until an answer to a COMMIT was lost.
    async fn wait_cut(&mut self) {
        let cut = tokio::time::timeout(PATIENCE, self.cuts.wait_for(|cuts| *cuts > 0)).await;
        assert!(matches!(cut, Ok(Ok(_))), "no COMMIT went through the proxy");
    }

    /// Carry one connection both ways until either side closes it, or until the answer to an armed COMMIT
    /// arrives: then both sides are closed and that answer is dropped.
    async fn pass(
        client: TcpStream,
        server: TcpStream,
        armed: Arc<AtomicBool>,
        cuts: Arc<watch::Sender<u32>>,
    ) {
        // The simple-query COMMIT sqlx sends; a client waits for every earlier answer before sending it, so
        // the next bytes from the server answer it.
        const COMMIT: &[u8] = b"COMMIT\0";
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = server.into_split();
        let cut_next_answer = AtomicBool::new(false);
        let upstream = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = client_read.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<_, std::io::Error>(());
                }
                if buf[..n].windows(COMMIT.len()).any(|w| w == COMMIT)
                    && armed
                        .compare_exchange(true, false, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                {
                    cut_next_answer.store(true, Ordering::SeqCst);
                }
                server_write.write_all(&buf[..n]).await?;
            }
        };
        let downstream = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = server_read.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<_, std::io::Error>(());
                }
                if cut_next_answer.load(Ordering::SeqCst) {
                    cuts.send_modify(|cuts| *cuts += 1);
                    return Ok(());
                }
                client_write.write_all(&buf[..n]).await?;
            }
        };
        // Whichever ends first, every half is dropped on return: both connections close.
        tokio::select! {
            _ = upstream => {}
            _ = downstream => {}
        }
    }
}

impl Drop for CommitAnswerCutter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A gateway in front of `shard` following hosts over `redis`, and a client of `tenant` on it (so the gateway
/// follows the tenant's default host).
async fn gateway_with_client(
    shard: &Shard,
    redis: &RedisServer,
    tenant: &str,
    name: &str,
) -> (Relay, Client) {
    let gateway = Relay::gateway_with(&shard.url, &["--redis-url", &redis.url()]).await;
    let (client, _) = gateway.client_as(tenant, name, Role::Member, name).await;
    (gateway, client)
}

/// A client subscribed to the chat, with everything it received on it.
struct Device {
    name: &'static str,
    client: Client,
    /// The chat as the subscribe snapshot showed it, and that snapshot's `fromSeq`.
    state: ChatState,
    from: u64,
    sub: SessionSubscription,
    seen: Vec<ActionEnvelope>,
}

impl Device {
    async fn subscribe(name: &'static str, client: Client, chat: &str) -> Device {
        let (state, from, sub) = subscribe_chat(&client, chat).await;
        Device {
            name,
            client,
            state,
            from,
            sub,
            seen: Vec::new(),
        }
    }

    /// Receive until (and including) the next `chat/turnComplete`.
    async fn until_turn_complete(&mut self) {
        let envelopes = collect_until(&mut self.sub, is_turn_complete).await;
        self.seen.extend(envelopes);
    }

    /// Receive `n` envelopes; asserts the turn they belong to is still streaming after them.
    async fn receive_mid_turn(&mut self, n: usize) {
        for _ in 0..n {
            let envelope = next_envelope(&mut self.sub).await;
            assert!(
                !is_turn_complete(&envelope),
                "the turn ended before the failure: make it longer"
            );
            self.seen.push(envelope);
        }
    }

    fn after(&self, seq: u64) -> Vec<&ActionEnvelope> {
        self.seen.iter().filter(|e| e.server_seq > seq).collect()
    }
}

/// Every envelope arriving on `sub` within `window`.
async fn receive_for(sub: &mut SessionSubscription, window: Duration) -> Vec<ActionEnvelope> {
    let deadline = tokio::time::Instant::now() + window;
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, sub.recv()).await {
            Err(_) => return out,
            Ok(Some(SubscriptionEvent::Action(envelope))) => out.push(envelope),
            Ok(Some(_)) => continue,
            Ok(None) => panic!("subscription closed"),
        }
    }
}

/// The chat's envelopes in the store's log of `tenant`'s default host, oldest first.
async fn chat_log(store_url: &str, tenant: &str, chat: &str) -> Vec<ActionEnvelope> {
    const PAGE: usize = 1000;
    let store = relay_store::Store::connect(store_url)
        .await
        .expect("open the store");
    let (mut out, mut after) = (Vec::new(), 0);
    loop {
        let rows = store
            .log_range(tenant, "default", after, i64::MAX as u64, PAGE)
            .await
            .expect("read the log");
        let full = rows.len() == PAGE;
        for row in rows {
            after = row.seq;
            if row.channel == chat {
                out.push(serde_json::from_str(&row.envelope).expect("logged envelope"));
            }
        }
        if !full {
            return out;
        }
    }
}

/// What each device received is exactly the store's log of the chat after its snapshot — no envelope twice,
/// none skipped, none that was not committed, each identical to the logged one — in increasing `serverSeq`
/// order; both devices received the same envelopes; and each device's state is the server's.
async fn assert_exactly_the_log(
    devices: &[&Device],
    store_url: &str,
    tenant: &str,
    chat: &str,
    fresh: &ChatState,
) {
    let log = chat_log(store_url, tenant, chat).await;
    for device in devices {
        assert_increasing(&device.seen);
        let accepted: Vec<_> = device
            .seen
            .iter()
            .filter(|e| e.rejection_reason.is_none())
            .collect();
        let logged: Vec<_> = log.iter().filter(|e| e.server_seq > device.from).collect();
        let seqs = |envelopes: &[&ActionEnvelope]| envelopes.iter().map(|e| e.server_seq).collect::<Vec<_>>();
        assert_eq!(
            seqs(&accepted),
            seqs(&logged),
            "{} received exactly the serverSeqs of the chat's log after its snapshot",
            device.name
        );
        assert_eq!(
            json(&accepted),
            json(&logged),
            "{} received exactly the chat's log after its snapshot",
            device.name
        );
        assert_eq!(
            json(&reduce_chat(device.state.clone(), device.from, &device.seen)),
            json(fresh),
            "{} holds the server's state",
            device.name
        );
    }
    let from = devices.iter().map(|d| d.from).max().unwrap_or(0);
    for pair in devices.windows(2) {
        let seqs = |device: &Device| {
            device
                .after(from)
                .iter()
                .map(|e| e.server_seq)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            seqs(pair[0]),
            seqs(pair[1]),
            "both devices received the same serverSeqs"
        );
        assert_eq!(
            json(&pair[0].after(from)),
            json(&pair[1].after(from)),
            "both devices received the same envelopes"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_mid_stream_loses_and_repeats_nothing() {
    let mut redis = RedisServer::start().await;
    let store = tempfile::tempdir().expect("tempdir");
    let store_url = format!("sqlite://{}", store.path().join("relay.sqlite").display());
    let shard = Shard::start(&[
        "--redis-url",
        &redis.url(),
        "--database-url",
        &store_url,
        "--demo-step-ms",
        DEMO_STEP_MS,
    ])
    .await;
    let tenant = unique_tenant();
    let channel = channel_of(&tenant);
    let (gateway1, a) = gateway_with_client(&shard, &redis, &tenant, "device-a").await;
    let (gateway2, b) = gateway_with_client(&shard, &redis, &tenant, "device-b").await;
    wait_subscribers(&mut redis.control().await, &channel, 2).await;
    let (_, chat) = create_session_and_chat(&a, "redis-restart").await;
    let mut a = Device::subscribe("device-a", a, &chat).await;
    let mut b = Device::subscribe("device-b", b, &chat).await;

    for turn in 1..=2 {
        let repairs_before = [
            gateway1.metric("ahp_relay_gap_repairs_total").await,
            gateway2.metric("ahp_relay_gap_repairs_total").await,
        ];
        a.client
            .dispatch(chat.clone(), turn_started(&format!("t{turn}"), &long_prompt()))
            .await
            .expect("dispatch");
        // Mid-stream: the reply is still being streamed when Redis dies and comes back.
        a.receive_mid_turn(5).await;
        redis.kill().await;
        redis.launch().await;
        a.until_turn_complete().await;
        b.until_turn_complete().await;
        // Both gateways are back on the new Redis before the next restart.
        wait_subscribers(&mut redis.control().await, &channel, 2).await;
        let repairs_after = [
            gateway1.metric("ahp_relay_gap_repairs_total").await,
            gateway2.metric("ahp_relay_gap_repairs_total").await,
        ];
        for (gateway, (before, after)) in repairs_before.iter().zip(repairs_after).enumerate() {
            assert!(
                after > *before,
                "gateway {} fetched what was published while Redis was down (restart {turn})",
                gateway + 1
            );
        }
    }

    let fresh = fresh_chat_snapshot_for(&gateway2, &tenant, &chat).await;
    assert_exactly_the_log(&[&a, &b], &store_url, &tenant, &chat, &fresh).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gateways_redis_subscriber_cut_mid_stream_is_repaired_while_the_other_streams_on() {
    let redis = RedisServer::start().await;
    let mut control = redis.control().await;
    let store = tempfile::tempdir().expect("tempdir");
    let store_url = format!("sqlite://{}", store.path().join("relay.sqlite").display());
    let shard = Shard::start(&[
        "--redis-url",
        &redis.url(),
        "--database-url",
        &store_url,
        "--demo-step-ms",
        DEMO_STEP_MS,
    ])
    .await;
    let tenant = unique_tenant();
    let channel = channel_of(&tenant);
    // One gateway at a time, to tell their subscriber connections apart.
    let (gateway1, a) = gateway_with_client(&shard, &redis, &tenant, "device-a").await;
    wait_subscribers(&mut control, &channel, 1).await;
    let first = pubsub_client_ids(&mut control).await;
    let (gateway2, b) = gateway_with_client(&shard, &redis, &tenant, "device-b").await;
    wait_subscribers(&mut control, &channel, 2).await;
    let gateway2_ids: Vec<u64> = pubsub_client_ids(&mut control)
        .await
        .difference(&first)
        .copied()
        .collect();
    let [gateway2_id] = gateway2_ids[..] else {
        panic!("expected one new pub/sub connection for gateway 2, got {gateway2_ids:?}");
    };
    let (_, chat) = create_session_and_chat(&a, "one-cut").await;
    let mut a = Device::subscribe("device-a", a, &chat).await;
    let mut b = Device::subscribe("device-b", b, &chat).await;

    for turn in 1..=2 {
        a.client
            .dispatch(chat.clone(), turn_started(&format!("t{turn}"), &long_prompt()))
            .await
            .expect("dispatch");
        a.receive_mid_turn(5).await;
        let mut ids = pubsub_client_ids(&mut control).await;
        assert!(ids.remove(&gateway2_id), "gateway 2's subscriber is connected");
        let gateway1_ids: Vec<u64> = ids.into_iter().collect();
        let [gateway1_id] = gateway1_ids[..] else {
            panic!("expected one pub/sub connection of gateway 1, got {gateway1_ids:?}");
        };
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(gateway1_id)
            .query_async(&mut control)
            .await
            .expect("CLIENT KILL ID");
        assert_eq!(killed, 1, "gateway 1's subscriber connection was cut");
        a.until_turn_complete().await;
        b.until_turn_complete().await;
        wait_subscribers(&mut control, &channel, 2).await;
        assert!(
            pubsub_client_ids(&mut control).await.contains(&gateway2_id),
            "gateway 2 kept its one subscriber connection"
        );
    }

    let fresh = fresh_chat_snapshot_for(&gateway2, &tenant, &chat).await;
    assert_exactly_the_log(&[&a, &b], &store_url, &tenant, &chat, &fresh).await;
    // Each cut leaves gateway 1 off Redis for at least its 50 ms reconnect backoff, two demo steps.
    assert!(
        gateway1.metric("ahp_relay_gap_repairs_total").await >= 1.0,
        "gateway 1 fetched what it missed while its subscriber was cut"
    );
    assert_eq!(
        gateway2.metric("ahp_relay_gap_repairs_total").await,
        0.0,
        "gateway 2 received everything live from Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_stream_publishes_only_what_was_committed_and_recovers() {
    /// How long Postgres stays down while the agent streams and a client dispatches.
    const OUTAGE: Duration = Duration::from_millis(1500);
    let mut postgres = PostgresServer::start().await;
    let redis = RedisServer::start().await;
    let shard = Shard::start(&[
        "--redis-url",
        &redis.url(),
        "--database-url",
        &postgres.url(),
        "--demo-step-ms",
        DEMO_STEP_MS,
    ])
    .await;
    let tenant = unique_tenant();
    let (gateway1, a) = gateway_with_client(&shard, &redis, &tenant, "device-a").await;
    let (_gateway2, b) = gateway_with_client(&shard, &redis, &tenant, "device-b").await;
    wait_subscribers(&mut redis.control().await, &channel_of(&tenant), 2).await;
    let (_, chat) = create_session_and_chat(&a, "pg-restart").await;
    let mut a = Device::subscribe("device-a", a, &chat).await;
    let mut b = Device::subscribe("device-b", b, &chat).await;

    a.client
        .dispatch(chat.clone(), turn_started("t1", &long_prompt()))
        .await
        .expect("dispatch");
    a.receive_mid_turn(5).await;
    postgres.stop_immediately().await;
    // What the store held when it went down: nothing can be committed until it is back.
    let mut at_stop = postgres.copy_stopped().await;
    // The store is down: the agent keeps streaming, and a client queues a message. Nothing numbered from now
    // on can be committed until Postgres is back.
    a.client
        .dispatch(
            chat.clone(),
            StateAction::ChatPendingMessageSet(ChatPendingMessageSetAction {
                kind: PendingMessageKind::Queued,
                id: "q1".into(),
                message: message("queued while the store was down"),
            }),
        )
        .await
        .expect("dispatch");
    let (a_during, b_during) = tokio::join!(receive_for(&mut a.sub, OUTAGE), receive_for(&mut b.sub, OUTAGE));
    a.seen.extend(a_during);
    b.seen.extend(b_during);
    let seen_before_restart = [a.seen.len(), b.seen.len()];
    postgres.launch().await;

    // The shard commits what waited and goes on: t1 completes, then the queued message runs as a turn.
    a.until_turn_complete().await;
    a.until_turn_complete().await;
    b.until_turn_complete().await;
    b.until_turn_complete().await;
    // Durable before visible: everything a client received before Postgres came back had been committed
    // before it went down, as it was sent.
    at_stop.launch().await;
    let committed: HashMap<u64, serde_json::Value> = chat_log(&at_stop.url(), &tenant, &chat)
        .await
        .iter()
        .map(|e| (e.server_seq, json(e)))
        .collect();
    at_stop.stop_immediately().await;
    for (device, before) in [&a, &b].into_iter().zip(seen_before_restart) {
        for envelope in device.seen[..before]
            .iter()
            .filter(|e| e.rejection_reason.is_none())
        {
            assert_eq!(
                committed.get(&envelope.server_seq),
                Some(&json(envelope)),
                "{} received serverSeq {} before Postgres came back, but the store did not hold it when it went down",
                device.name,
                envelope.server_seq
            );
        }
    }
    let queued = a
        .seen
        .iter()
        .find(|e| matches!(&e.action, StateAction::ChatPendingMessageSet(p) if p.id == "q1"))
        .expect("the message queued during the outage was echoed after it");
    assert!(
        !committed.contains_key(&queued.server_seq),
        "the message queued during the outage was committed only after it"
    );
    let started: Vec<_> = a
        .seen
        .iter()
        .filter_map(|e| match &e.action {
            StateAction::ChatTurnStarted(t) => Some((t.turn_id.clone(), t.queued_message_id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), 2, "t1 and the queued turn: {started:?}");
    assert_eq!(
        started[1].1.as_deref(),
        Some("q1"),
        "the queued message ran as a turn"
    );

    // Recovered: a new turn runs end to end on the restarted store.
    a.client
        .dispatch(chat.clone(), turn_started("t3", "after the restart"))
        .await
        .expect("dispatch");
    a.until_turn_complete().await;
    b.until_turn_complete().await;

    let fresh = fresh_chat_snapshot_for(&gateway1, &tenant, &chat).await;
    assert_eq!(fresh.turns.len(), 3, "three turns completed");
    assert_exactly_the_log(&[&a, &b], &postgres.url(), &tenant, &chat, &fresh).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_went_through_but_whose_answer_was_lost_is_published_once_and_the_host_goes_on() {
    let postgres = PostgresServer::start().await;
    let mut proxy = CommitAnswerCutter::start(postgres.port).await;
    let shard = Shard::start(&["--database-url", &proxy.url(), "--demo-step-ms", DEMO_STEP_MS]).await;
    let gateway = Relay::gateway(&shard.url).await;
    let tenant = unique_tenant();
    let (client, _) = gateway
        .client_as(&tenant, "device-a", Role::Member, "device-a")
        .await;
    let (_, chat) = create_session_and_chat(&client, "in-doubt").await;
    let mut a = Device::subscribe("device-a", client, &chat).await;

    // The first commit of the turn is written, but the shard is told it failed.
    proxy.arm();
    a.client
        .dispatch(chat.clone(), turn_started("t1", "a commit in doubt"))
        .await
        .expect("dispatch");
    proxy.wait_cut().await;
    a.until_turn_complete().await;
    // And the host goes on committing.
    a.client
        .dispatch(chat.clone(), turn_started("t2", "after the commit in doubt"))
        .await
        .expect("dispatch");
    a.until_turn_complete().await;

    let fresh = fresh_chat_snapshot_for(&gateway, &tenant, &chat).await;
    assert_eq!(fresh.turns.len(), 2, "both turns completed");
    assert_exactly_the_log(&[&a], &postgres.url(), &tenant, &chat, &fresh).await;
}
