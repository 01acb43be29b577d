//! Idle scale: [`CONNECTIONS`] idle, initialized AHP connections held by one embedded `ahp-relay serve`, then
//! by 1 shard + 2 gateways over Redis; reported: the connect rate (TCP + WebSocket + `initialize`), the
//! servers' memory per connection, and how long one action takes to reach all of them.
//!
//! Run: `scripts/bench idle` (raises the open-file limit, starts Redis). `AHP_BENCH_IDLE_CONNECTIONS`
//! overrides the count. Connections come from several loopback source addresses (127.0.0.2, .3, …) so the
//! ephemeral ports of one source address do not run out. Every connection is initialized with the chat in
//! `initialSubscriptions`, so the one action goes to every connection. Clients use 1 KiB socket buffers so the
//! load generator itself fits in memory. Everything is on loopback and bounded; every process started is
//! killed at the end.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{create_chat, dispatch_frame, initialized, Socket, CHAT};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

const CONNECTIONS: usize = 100_000;
/// Source addresses 127.0.0.2 ..= 127.0.0.(1 + SOURCES): about 28,000 ephemeral ports each.
const SOURCES: u8 = 8;
/// Connections being opened at once.
const CONCURRENCY: usize = 128;
const DEADLINE: Duration = Duration::from_secs(1_200);
const PATIENCE: Duration = Duration::from_secs(120);

fn main() {
    common::raise_open_file_limit();
    common::run_with_deadline(DEADLINE, run());
}

struct Shape {
    name: &'static str,
    /// Connections go to these in turn.
    urls: Vec<String>,
    /// Processes whose memory holds the connections.
    pids: Vec<u32>,
    _relay: common::RelayProcesses,
}

async fn run() {
    let count = std::env::var("AHP_BENCH_IDLE_CONNECTIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CONNECTIONS);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct passed.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    // Each side holds one descriptor per connection (plus the server's own): the limit caps the count.
    let most = usize::try_from(limit.rlim_cur)
        .unwrap_or(usize::MAX)
        .saturating_sub(1_000);
    let count = if count > most {
        println!(
            "idle: NOTE the open-file limit is {} (hard {}) and raising it needs CAP_SYS_RESOURCE: this run \
             opens {most} connections per shape instead of {count}",
            limit.rlim_cur, limit.rlim_max
        );
        most
    } else {
        count
    };
    println!(
        "idle: {count} connections per shape; open-file limit {}",
        limit.rlim_cur
    );
    let embedded = embedded().await;
    measure(embedded, count).await;
    match std::env::var("REDIS_URL") {
        Ok(redis) => measure(gateways(&redis).await, count).await,
        Err(_) => println!("2 gateways: skipped (REDIS_URL not set; run it as `scripts/bench idle`)"),
    }
}

async fn measure(shape: Shape, count: usize) {
    let mut publisher = initialized(&shape.urls[0], "publisher").await;
    create_chat(&mut publisher).await;
    // One subscriber first, so what the host allocates once is not counted per connection.
    let first = open(&shape.urls[0], 0).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: u64 = shape.pids.iter().map(|p| common::rss_kib(*p)).sum();

    let started = Instant::now();
    let opened = AtomicUsize::new(0);
    let mut sockets: Vec<Socket> = futures_util::stream::iter(1..=count)
        .map(|i| {
            let url = shape.urls[i % shape.urls.len()].clone();
            let opened = &opened;
            async move {
                let socket = open(&url, i).await;
                let n = opened.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_multiple_of(20_000) {
                    println!("  {n} open after {:.1?}", started.elapsed());
                }
                socket
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let connect_time = started.elapsed();
    sockets.push(first);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after: u64 = shape.pids.iter().map(|p| common::rss_kib(*p)).sum();
    let per = after.saturating_sub(before) as f64 / count as f64;

    // One action to all of them: every socket waits for it in a task of its own.
    let arrived = Arc::new(AtomicUsize::new(0));
    let all = Arc::new(tokio::sync::Notify::new());
    let total = sockets.len();
    let origin = Instant::now();
    let last = Arc::new(parking_lot::Mutex::new(Vec::with_capacity(total)));
    let waiters: Vec<_> = sockets
        .into_iter()
        .map(|mut socket| {
            let (arrived, all, last) = (arrived.clone(), all.clone(), last.clone());
            tokio::spawn(async move {
                loop {
                    match tokio::time::timeout(PATIENCE, socket.next()).await {
                        Ok(Some(Ok(Message::Text(text)))) if text.contains("\"idle-probe\"") => break,
                        Ok(Some(Ok(_))) => continue,
                        other => panic!("a connection ended or the action did not arrive: {other:?}"),
                    }
                }
                last.lock().push(origin.elapsed());
                if arrived.fetch_add(1, Ordering::Relaxed) + 1 == total {
                    all.notify_one();
                }
                socket
            })
        })
        .collect();
    let notified = all.notified();
    let sent_at = origin.elapsed();
    publisher
        .send(Message::Text(dispatch_frame(0, "idle-probe").into()))
        .await
        .expect("dispatch");
    tokio::time::timeout(PATIENCE, notified)
        .await
        .expect("the action did not reach every connection");
    let mut times = last.lock().clone();
    times.sort();
    let to = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)].saturating_sub(sent_at);
    println!(
        "{}: {count} idle initialized connections: connect rate {:.0}/s ({connect_time:.1?}); memory {:.2} KiB per connection (RSS {before} -> {after} KiB); one action to all {total}: first {:.1?}, p50 {:.1?}, last {:.1?}",
        shape.name,
        count as f64 / connect_time.as_secs_f64(),
        per,
        to(0.0),
        to(0.5),
        to(1.0),
    );
    let mut sockets = Vec::with_capacity(total);
    for waiter in waiters {
        sockets.push(waiter.await.expect("waiter"));
    }
    drop(sockets);
    drop(shape);
}

/// Connect from source address 127.0.0.(2 + i % SOURCES) with small buffers and `initialize` with the
/// chat in `initialSubscriptions`.
async fn open(url: &str, i: usize) -> Socket {
    let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (i % usize::from(SOURCES)) as u8));
    let target: SocketAddr = url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .expect("host:port")
        .parse()
        .expect("address");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(source, 0))
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
        "protocolVersions":["1.0.0"],"clientId":format!("idle-{i}"),"initialSubscriptions":[CHAT]}});
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
        name: "embedded serve",
        urls: relay.urls.clone(),
        pids: relay.pids.clone(),
        _relay: relay,
    }
}

async fn gateways(redis_url: &str) -> Shape {
    let relay = common::start_gateways(redis_url).await;
    Shape {
        name: "1 shard + 2 gateways",
        urls: relay.urls.clone(),
        pids: relay.pids.clone(),
        _relay: relay,
    }
}
