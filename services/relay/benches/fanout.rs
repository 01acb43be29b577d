//! Fan-out and latency of the embedded relay, each beside a baseline measured in the same run.
//!
//! Run: `scripts/bench fanout`. Everything is on loopback and bounded in count and time.
//! - Fan-out: N subscribers of one chat, one client dispatching M actions; delivered frames/s against a bare
//!   tokio-tungstenite broadcast server that forwards each frame of one publisher to the same N sockets.
//! - Latency: dispatch → last of 100 subscribers, p50/p99, at 1,000 actions/s.
//!
//! Memory per idle connection is measured on fresh processes by `scripts/bench peers` and `scripts/bench idle`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    bare_broadcast_server, connect, create_chat, dispatch_frame, initialized, next_text, request,
    spawn_until, token, Socket, SECRET,
};
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::Message;

const SUBSCRIBERS: usize = 1_000;
const ACTIONS: usize = 1_000;
const LATENCY_SUBSCRIBERS: usize = 100;
const LATENCY_RATE: u64 = 1_000;
const LATENCY_SECONDS: u64 = 5;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut relay, addr) = start_relay(dir.path()).await;
    let url = format!("ws://{addr}/v1/ws?access_token={}", token());
    println!("embedded relay (SQLite store); {SUBSCRIBERS} subscribers x {ACTIONS} actions");

    // Fan-out through the relay.
    let mut publisher = initialized(&url, "publisher").await;
    create_chat(&mut publisher).await;
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

    // Memory per idle connection: `scripts/bench peers` and `scripts/bench idle` measure it on fresh processes.
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

async fn start_relay(dir: &std::path::Path) -> (Child, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--jwt-secret", SECRET])
        .args(["--max-connections-per-tenant", "100000"])
        .arg("--data-dir")
        .arg(dir);
    let (child, url) = spawn_until(command, "listening on ws://").await;
    (child, url.trim_end_matches("/v1/ws").to_string())
}
