//! Fan-out, latency and memory of the embedded relay, each beside a baseline measured in the same run.
//!
//! Run: `scripts/bench fanout`. Everything is on loopback and bounded in count and time.
//! - Fan-out: N subscribers of one chat, one client dispatching M actions; delivered frames/s against a bare
//!   tokio-tungstenite broadcast server that forwards each frame of one publisher to the same N sockets.
//! - Latency: dispatch → last subscriber, p50/p99, at a fixed offered load.
//! - Memory: relay RSS growth per idle, initialized WebSocket connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use relay_core::Role;
use relay_gateway::auth::{mint_hs256, Claims};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::sync::broadcast;
use tokio_tungstenite::tungstenite::Message;

const SECRET: &str = "bench-secret";
const SUBSCRIBERS: usize = 1_000;
const ACTIONS: usize = 1_000;
const LATENCY_SUBSCRIBERS: usize = 10;
const LATENCY_RATE: u64 = 1_000;
const LATENCY_SECONDS: u64 = 3;
const IDLE_CONNECTIONS: usize = 2_000;

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut relay, addr) = start_relay(dir.path()).await;
    let url = format!("ws://{addr}/v1/ws?access_token={}", token());
    println!("embedded relay (SQLite store); {SUBSCRIBERS} subscribers x {ACTIONS} actions");

    // Fan-out through the relay.
    let mut publisher = initialized(&url, "publisher").await;
    request(
        &mut publisher,
        "createSession",
        json!({"channel": "ahp-session:/bench", "provider": "demo"}),
    )
    .await;
    request(
        &mut publisher,
        "createChat",
        json!({"channel": "ahp-session:/bench", "chat": "ahp-chat:/bench"}),
    )
    .await;
    let mut subscribers = Vec::new();
    for i in 0..SUBSCRIBERS {
        let mut s = initialized(&url, &format!("sub-{i}")).await;
        request(&mut s, "subscribe", json!({"channel": "ahp-chat:/bench"})).await;
        subscribers.push(s);
    }
    let frames: Vec<String> = (0..ACTIONS)
        .map(|i| dispatch_frame(i, &format!("d{i}")))
        .collect();
    let relay_rate = fan_out(&mut publisher, subscribers, &frames).await;

    // The same through a bare broadcast server.
    let bare = bare_broadcast_server().await;
    let mut bare_publisher = connect(&format!("ws://{bare}/")).await;
    let mut bare_subscribers = Vec::new();
    for _ in 0..SUBSCRIBERS {
        bare_subscribers.push(connect(&format!("ws://{bare}/")).await);
    }
    // Let the bare server register every socket: a ping through it reaches all of them.
    bare_publisher
        .send(Message::Text("hello".into()))
        .await
        .expect("send");
    for s in &mut bare_subscribers {
        next_text(s).await;
    }
    let bare_rate = fan_out(&mut bare_publisher, bare_subscribers, &frames).await;
    println!("fan-out frames/s: relay {relay_rate:>10.0}   bare broadcast {bare_rate:>10.0}   ratio {:.2} (target >= 0.70)", relay_rate / bare_rate);

    // Latency at a fixed offered load.
    let mut watchers = Vec::new();
    for i in 0..LATENCY_SUBSCRIBERS {
        let mut s = initialized(&url, &format!("watch-{i}")).await;
        request(&mut s, "subscribe", json!({"channel": "ahp-chat:/bench"})).await;
        watchers.push(s);
    }
    let (p50, p99, count) = latency(&mut publisher, watchers).await;
    println!("dispatch -> last of {LATENCY_SUBSCRIBERS} subscribers at {LATENCY_RATE}/s for {LATENCY_SECONDS}s ({count} actions): p50 {p50:.2?}  p99 {p99:.2?}  (target p99 <= 10ms embedded)");

    // Memory per idle connection.
    let pid = relay.id().expect("pid");
    let before = rss_kib(pid);
    let mut idle = Vec::new();
    for i in 0..IDLE_CONNECTIONS {
        idle.push(initialized(&url, &format!("idle-{i}")).await);
    }
    let after = rss_kib(pid);
    println!(
        "memory per idle connection: {:.1} KiB ({IDLE_CONNECTIONS} connections, RSS {before} -> {after} KiB; target <= 16 KiB)",
        (after.saturating_sub(before)) as f64 / IDLE_CONNECTIONS as f64
    );
    drop(idle);
    relay.start_kill().expect("kill");
    let _ = relay.wait().await;
}

/// Send every frame from the publisher and wait until every subscriber has received one frame per action;
/// returns delivered frames per second.
async fn fan_out(publisher: &mut Socket, subscribers: Vec<Socket>, frames: &[String]) -> f64 {
    let started = Instant::now();
    let readers: Vec<_> = subscribers
        .into_iter()
        .map(|mut s| {
            let expected = frames.len();
            tokio::spawn(async move {
                let mut got = 0;
                while got < expected {
                    let text = next_text(&mut s).await;
                    if text.contains("\"action\"") || text.starts_with('{') && !text.contains("\"id\"") {
                        got += 1;
                    }
                }
                s
            })
        })
        .collect();
    for frame in frames {
        publisher
            .send(Message::Text(frame.clone().into()))
            .await
            .expect("publish");
    }
    let count = readers.len();
    for reader in readers {
        reader.await.expect("reader");
    }
    (count * frames.len()) as f64 / started.elapsed().as_secs_f64()
}

/// Offer LATENCY_RATE actions/s; each carries its send time; returns (p50, p99, count) of dispatch → last
/// subscriber.
async fn latency(publisher: &mut Socket, watchers: Vec<Socket>) -> (Duration, Duration, usize) {
    let total = (LATENCY_RATE * LATENCY_SECONDS) as usize;
    let origin = Instant::now();
    let arrivals = Arc::new(parking_lot::Mutex::new(vec![Duration::ZERO; total]));
    let readers: Vec<_> = watchers
        .into_iter()
        .map(|mut s| {
            let arrivals = arrivals.clone();
            tokio::spawn(async move {
                let mut got = 0;
                while got < total {
                    let text = next_text(&mut s).await;
                    let Ok(v) = serde_json::from_str::<Value>(&text) else {
                        continue;
                    };
                    let Some(draft) = v["params"]["action"]["draft"]["text"].as_str() else {
                        continue;
                    };
                    let Some(i) = draft.strip_prefix("lat").and_then(|n| n.parse::<usize>().ok()) else {
                        continue;
                    };
                    let at = origin.elapsed();
                    let mut arrivals = arrivals.lock();
                    if at > arrivals[i] {
                        arrivals[i] = at;
                    }
                    got += 1;
                }
            })
        })
        .collect();
    let mut sent = vec![Duration::ZERO; total];
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / LATENCY_RATE));
    for (i, slot) in sent.iter_mut().enumerate() {
        tick.tick().await;
        *slot = origin.elapsed();
        publisher
            .send(Message::Text(dispatch_frame(i, &format!("lat{i}")).into()))
            .await
            .expect("publish");
    }
    for reader in readers {
        reader.await.expect("reader");
    }
    let arrivals = arrivals.lock();
    let mut latencies: Vec<Duration> = arrivals
        .iter()
        .zip(&sent)
        .map(|(a, s)| a.saturating_sub(*s))
        .collect();
    latencies.sort();
    (latencies[total / 2], latencies[total * 99 / 100], total)
}

fn dispatch_frame(i: usize, text: &str) -> String {
    json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-chat:/bench","clientSeq":i + 1,
        "action":{"type":"chat/draftChanged","draft":{"text":text,"origin":{"kind":"user"}}}}})
    .to_string()
}

fn token() -> String {
    mint_hs256(
        SECRET.as_bytes(),
        &Claims::new("bench", "bench", Role::Admin, None, Duration::from_secs(3600)),
    )
    .expect("token")
}

async fn start_relay(dir: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
        .args(["serve", "--listen", "127.0.0.1:0", "--jwt-secret", SECRET])
        .args(["--max-connections-per-tenant", "100000"])
        .arg("--data-dir")
        .arg(dir)
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn relay (build it first: cargo build --release -p ahp-relay)");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    while let Some(line) = lines.next_line().await.expect("stdout") {
        if let Some(rest) = line.split("listening on ws://").nth(1) {
            let addr = rest.trim_end_matches("/v1/ws").to_string();
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return (child, addr);
        }
    }
    panic!("relay exited");
}

/// The baseline: every text frame received on any socket is broadcast, as is, to every socket (TCP_NODELAY,
/// queued frames written together and flushed once — the same discipline as the relay's writer).
async fn bare_broadcast_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let (tx, _) = broadcast::channel::<bytes::Bytes>(65_536);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let Ok(ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                let (mut sink, mut stream) = ws.split();
                let mut rx = tx.subscribe();
                loop {
                    tokio::select! {
                        inbound = stream.next() => match inbound {
                            Some(Ok(Message::Text(text))) => { let _ = tx.send(bytes::Bytes::from(text)); }
                            Some(Ok(_)) => {}
                            _ => return,
                        },
                        frame = rx.recv() => match frame {
                            Ok(frame) => {
                                // Same write discipline as the relay: feed what is queued, flush once.
                                let mut next = Some(frame);
                                while let Some(frame) = next.take() {
                                    let Ok(text) = tokio_tungstenite::tungstenite::Utf8Bytes::try_from(frame) else { continue };
                                    if sink.feed(Message::Text(text)).await.is_err() { return; }
                                    next = rx.try_recv().ok();
                                }
                                if sink.flush().await.is_err() { return; }
                            }
                            Err(_) => return,
                        },
                    }
                }
            });
        }
    });
    addr
}

async fn connect(url: &str) -> Socket {
    tokio_tungstenite::connect_async(url).await.expect("connect").0
}

async fn initialized(url: &str, client_id: &str) -> Socket {
    let mut s = connect(url).await;
    request(
        &mut s,
        "initialize",
        json!({"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": client_id}),
    )
    .await;
    s
}

/// Send a request and wait for its response (skipping notifications).
async fn request(s: &mut Socket, method: &str, params: Value) -> Value {
    s.send(Message::Text(
        json!({"jsonrpc":"2.0","id":1,"method":method,"params":params})
            .to_string()
            .into(),
    ))
    .await
    .expect("send");
    loop {
        let v: Value = serde_json::from_str(&next_text(s).await).expect("json");
        if v.get("id").is_some() {
            assert!(v.get("error").is_none(), "{method} failed: {v}");
            return v;
        }
    }
}

async fn next_text(s: &mut Socket) -> String {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), s.next())
            .await
            .expect("timed out")
        {
            Some(Ok(Message::Text(text))) => return text.to_string(),
            Some(Ok(_)) => continue,
            other => panic!("socket ended: {other:?}"),
        }
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
