//! Idle scale: idle, initialized AHP connections held by one embedded `ahp-relay serve` ([`EMBEDDED`], within
//! one process's open files), then by 1 shard + [`GATEWAYS`] gateways over Redis ([`CONNECTIONS`] in all);
//! reported: the connect rate (TCP + WebSocket + `initialize`), each server process's memory per connection it
//! holds and the whole shape's, and how long one action takes to reach all of them.
//!
//! Run: `scripts/bench idle` (raises the open-file limit, starts Redis). `AHP_BENCH_IDLE_CONNECTIONS` and
//! `AHP_BENCH_IDLE_GATEWAYS` override the distributed shape's count and gateways. One process here may hold at
//! most 20,000 open files, so the connections are opened by worker processes (this bench re-executed, each
//! holding at most [`PER_WORKER`]) from loopback source addresses of their own (127.0.0.2, .3, …, so the
//! ephemeral ports of one source address do not run out). Every connection is initialized with the chat in
//! `initialSubscriptions`, so the one action goes to every connection; each worker notes when each of its
//! connections received it (wall clock, one machine) and the bench reports first, p50 and last over all.
//! Clients use 1 KiB socket buffers so the load generator itself fits in memory. Everything is on loopback and
//! bounded; every process started is killed at the end.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{create_chat, dispatch_frame, initialized, Socket, CHAT};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

/// Connections of the distributed shape.
const CONNECTIONS: usize = 100_000;
/// Its gateways: about 17,000 connections each.
const GATEWAYS: usize = 6;
/// Connections to the embedded `serve`: one process, within its 20,000 open files.
const EMBEDDED: usize = 19_000;
/// Connections one worker process opens (its open files, within the limit).
const PER_WORKER: usize = 17_000;
/// Connections a worker is opening at once.
const CONCURRENCY: usize = 16;
const DEADLINE: Duration = Duration::from_secs(1_800);
const PATIENCE: Duration = Duration::from_secs(300);
/// Set in a worker's environment: the URLs (comma-separated) its connections go to in turn.
const WORKER_URLS: &str = "AHP_BENCH_IDLE_WORKER_URLS";
/// How many connections a worker opens.
const WORKER_COUNT: &str = "AHP_BENCH_IDLE_WORKER_COUNT";
/// Which worker it is (its source address is 127.0.0.(2 + this)).
const WORKER_INDEX: &str = "AHP_BENCH_IDLE_WORKER_INDEX";

fn main() {
    common::raise_open_file_limit();
    if std::env::var_os(WORKER_URLS).is_some() {
        common::run_with_deadline(DEADLINE, worker());
        return;
    }
    common::run_with_deadline(DEADLINE, run());
}

struct Shape {
    name: String,
    /// Connections go to these in turn.
    urls: Vec<String>,
    /// Processes whose memory holds the connections, with what each is called.
    pids: Vec<(String, u32)>,
    _relay: common::RelayProcesses,
}

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

async fn run() {
    let count = env_count("AHP_BENCH_IDLE_CONNECTIONS", CONNECTIONS);
    let gateways = env_count("AHP_BENCH_IDLE_GATEWAYS", GATEWAYS);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct passed.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    println!(
        "idle: open-file limit per process {} (hard {}); {EMBEDDED} connections to one serve, {count} to 1 shard + {gateways} gateways",
        limit.rlim_cur, limit.rlim_max
    );
    measure(embedded().await, EMBEDDED.min(count)).await;
    match std::env::var("REDIS_URL") {
        Ok(redis) => measure(distributed(&redis, gateways).await, count).await,
        Err(_) => println!("gateways: skipped (REDIS_URL not set; run it as `scripts/bench idle`)"),
    }
}

/// A worker process opening its share of the connections.
struct Worker {
    child: Child,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Worker {
    fn start(index: usize, urls: &[String], count: usize) -> Worker {
        let mut child = Command::new(std::env::current_exe().expect("this bench"))
            .env(WORKER_URLS, urls.join(","))
            .env(WORKER_COUNT, count.to_string())
            .env(WORKER_INDEX, index.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start a worker");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Worker { child, lines }
    }

    /// The rest of the worker's next line starting with `marker`.
    async fn line(&mut self, marker: &str) -> String {
        loop {
            let line = tokio::time::timeout(PATIENCE, self.lines.next_line())
                .await
                .expect("a worker was silent too long")
                .expect("a worker's output")
                .unwrap_or_else(|| panic!("a worker ended before saying {marker:?}"));
            if let Some(rest) = line.strip_prefix(marker) {
                return rest.trim().to_string();
            }
        }
    }
}

async fn measure(shape: Shape, count: usize) {
    let mut creator = initialized(&shape.urls[0], "creator").await;
    create_chat(&mut creator).await;
    drop(creator);
    // A few subscribers first, so what the processes allocate once is not counted per connection.
    let mut warm = Worker::start(0, &shape.urls, shape.urls.len() * 4);
    warm.line("ready").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: Vec<u64> = shape.pids.iter().map(|(_, p)| common::rss_kib(*p)).collect();

    let started = Instant::now();
    let workers = count.div_ceil(PER_WORKER);
    let mut running: Vec<Worker> = (0..workers)
        .map(|w| {
            let share = count / workers + usize::from(w < count % workers);
            // Each worker's connections spread over every URL, from a source address of its own.
            let urls: Vec<String> = (0..shape.urls.len())
                .map(|k| shape.urls[(w + k) % shape.urls.len()].clone())
                .collect();
            Worker::start(w + 1, &urls, share)
        })
        .collect();
    for worker in &mut running {
        worker.line("ready").await;
    }
    let connect_time = started.elapsed();
    // Let the servers settle (allocations made during the burst are returned) before reading memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after: Vec<u64> = shape.pids.iter().map(|(_, p)| common::rss_kib(*p)).collect();
    let per_process: Vec<String> = shape
        .pids
        .iter()
        .zip(before.iter().zip(&after))
        .map(|((name, _), (b, a))| {
            let held = if name.starts_with("gateway") || name == "serve" {
                count.div_ceil(shape.urls.len())
            } else {
                count
            };
            format!(
                "{name} {:.2} KiB ({b} -> {a} KiB)",
                a.saturating_sub(*b) as f64 / held as f64
            )
        })
        .collect();
    let total_before: u64 = before.iter().sum();
    let total_after: u64 = after.iter().sum();

    // One action to all of them, from a connection opened now (one opened before would have had to answer
    // the server's pings meanwhile); every worker says when each of its connections received it.
    let mut publisher = initialized(&shape.urls[0], "publisher").await;
    let sent_at = unix_micros();
    publisher
        .send(Message::Text(dispatch_frame(0, "idle-probe").into()))
        .await
        .expect("dispatch");
    let mut arrivals: Vec<u64> = Vec::with_capacity(count);
    for worker in running.iter_mut().chain(std::iter::once(&mut warm)) {
        let line = worker.line("arrived").await;
        arrivals.extend(
            line.split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.parse::<u64>().expect("a time")),
        );
    }
    arrivals.sort_unstable();
    let at = |q: f64| {
        let t = arrivals[((arrivals.len() as f64 * q) as usize).min(arrivals.len() - 1)];
        Duration::from_micros(t.saturating_sub(sent_at))
    };
    println!(
        "{}: {count} idle initialized connections from {workers} worker processes: connect rate {:.0}/s ({connect_time:.1?}); memory per connection: all processes {:.2} KiB (RSS {total_before} -> {total_after} KiB); per process: {}; one action to all {}: first {:.1?}, p50 {:.1?}, last {:.1?}",
        shape.name,
        count as f64 / connect_time.as_secs_f64(),
        total_after.saturating_sub(total_before) as f64 / count as f64,
        per_process.join(", "),
        arrivals.len(),
        at(0.0),
        at(0.5),
        at(1.0),
    );
    for mut worker in running.into_iter().chain(std::iter::once(warm)) {
        let _ = worker.child.start_kill();
        let _ = worker.child.wait().await;
    }
    drop(shape);
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A worker: open the connections, say `ready`, note when each receives the probe, say `arrived` with the
/// times (µs since the epoch), then hold them until the bench closes stdin or kills it.
// Each connection's future yields the task that reads it (started as soon as it is open).
#[allow(clippy::async_yields_async)]
async fn worker() {
    let urls: Vec<String> = std::env::var(WORKER_URLS)
        .expect("urls")
        .split(',')
        .map(str::to_string)
        .collect();
    let count: usize = std::env::var(WORKER_COUNT)
        .expect("count")
        .parse()
        .expect("count");
    let index: usize = std::env::var(WORKER_INDEX)
        .expect("index")
        .parse()
        .expect("index");
    let source = Ipv4Addr::new(127, 0, (2 + index / 200) as u8, (2 + index % 200) as u8);
    // Each connection is read from the moment it is open (a real client's would be: it answers the server's
    // pings, or the server closes it as idle while the others are still connecting).
    let times = Arc::new(parking_lot::Mutex::new(Vec::with_capacity(count)));
    let opened = AtomicUsize::new(0);
    let waiters: Vec<_> = futures_util::stream::iter(0..count)
        .map(|i| {
            let url = urls[i % urls.len()].clone();
            let (opened, times) = (&opened, times.clone());
            async move {
                let mut socket = open(&url, source, &format!("idle-{index}-{i}")).await;
                opened.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    loop {
                        match socket.next().await {
                            Some(Ok(Message::Text(text))) if text.contains("\"idle-probe\"") => break,
                            Some(Ok(_)) => continue,
                            other => panic!("a connection ended or the action did not arrive: {other:?}"),
                        }
                    }
                    times.lock().push(unix_micros());
                    socket
                })
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    println!("ready {}", opened.load(Ordering::Relaxed));
    let mut sockets = Vec::with_capacity(count);
    for waiter in waiters {
        sockets.push(waiter.await.expect("waiter"));
    }
    let times: Vec<String> = times.lock().iter().map(u64::to_string).collect();
    println!("arrived {}", times.join(","));
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
    drop(sockets);
}

/// Connect from `source` with small buffers and `initialize` with the chat in `initialSubscriptions`.
async fn open(url: &str, source: Ipv4Addr, client_id: &str) -> Socket {
    let target: SocketAddr = url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .expect("host:port")
        .parse()
        .expect("address");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(IpAddr::V4(source), 0))
        .expect("bind a source address");
    let stream = socket.connect(target).await.expect("connect");
    let _ = stream.set_nodelay(true);
    let config = WebSocketConfig::default()
        .read_buffer_size(1024)
        .write_buffer_size(0);
    let (mut ws, _) = tokio_tungstenite::client_async_with_config(
        url,
        tokio_tungstenite::MaybeTlsStream::Plain(stream),
        Some(config),
    )
    .await
    .expect("websocket handshake");
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://",
        "protocolVersions":["1.0.0"],"clientId":client_id,"initialSubscriptions":[CHAT]}});
    ws.send(Message::Text(init.to_string().into()))
        .await
        .expect("send");
    loop {
        match tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("initialize timed out")
        {
            Some(Ok(Message::Text(text))) => {
                let v: Value = serde_json::from_str(&text).expect("json");
                if v.get("id").is_some() {
                    assert!(v.get("error").is_none(), "initialize failed: {v}");
                    return ws;
                }
            }
            Some(Ok(_)) => continue,
            other => panic!("socket ended during initialize: {other:?}"),
        }
    }
}

async fn embedded() -> Shape {
    let relay = common::start_embedded().await;
    Shape {
        name: "embedded serve".into(),
        urls: relay.urls.clone(),
        pids: vec![("serve".into(), relay.pids[0])],
        _relay: relay,
    }
}

async fn distributed(redis_url: &str, gateways: usize) -> Shape {
    let relay = common::start_gateways_n(redis_url, gateways).await;
    let mut pids: Vec<(String, u32)> = vec![("shard".into(), relay.pids[0])];
    pids.extend(
        relay.pids[1..]
            .iter()
            .enumerate()
            .map(|(i, pid)| (format!("gateway {}", i + 1), *pid)),
    );
    if let Some(redis) = common::redis_pid(redis_url).await {
        pids.push(("redis".into(), redis));
    }
    Shape {
        name: format!("1 shard + {gateways} gateways"),
        urls: relay.urls.clone(),
        pids,
        _relay: relay,
    }
}
