//! The relay beside the fan-out servers a user could pick instead, on the same load in the same run:
//! nginx + nchan (Debian's `libnginx-mod-nchan`, 2 workers) and the bare tokio-tungstenite broadcast server
//! (its own process, the same runtime as `ahp-relay`), against the embedded `ahp-relay serve` and 1 shard +
//! 2 gateways over Redis.
//!
//! Run: `scripts/bench peers` (starts Redis and nginx + nchan on loopback). For each server:
//! - **Memory per idle connection:** RSS of the server's processes before and after opening
//!   [`IDLE_CONNECTIONS`] idle connections (relay: initialized AHP connections; nchan and bare: WebSocket
//!   subscribers), on fresh processes, before any load.
//! - **Fan-out at a fixed rate:** N subscribers of one channel (relay: a chat; nchan: a channel); one client
//!   publishes R frames/s for [`SECONDS`] s (relay: `dispatchAction`; nchan, bare: a frame the size of the
//!   relay's). Each publication carries its index; every subscriber records when each index arrived.
//!   Reported: dispatch → arrival p50/p99/p99.9/max over every (subscriber, publication), delivered frames/s,
//!   lost and duplicated, and the server processes' CPU time (user + system, from `/proc`).
//!
//! Everything is on loopback, bounded in count and time, and every process started is killed at the end.
//! The load generator shares the 2 cores with the servers; it is the same for every server.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{connect, create_chat, dispatch_frame, initialized, request, spawn_until, Cpu, Socket};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::Message;

/// (subscribers, publications per second) of each load (`AHP_BENCH_LOADS`, e.g. `1x50,2000x50`, overrides).
const LOADS: [(usize, u64); 2] = [(2_000, 50), (2_000, 200)];
/// How long each load is offered (`AHP_BENCH_SECONDS` overrides).
const SECONDS: u64 = 10;
const IDLE_CONNECTIONS: usize = 2_000;
/// How long subscribers wait for stragglers after the last publication before counting the rest lost.
const GRACE: Duration = Duration::from_secs(5);
const DEADLINE: Duration = Duration::from_secs(900);

fn main() {
    if common::serve_bare_if_asked() {
        return;
    }
    common::raise_open_file_limit();
    common::run_with_deadline(DEADLINE, run());
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// Speaks AHP: subscribers `initialize` and `subscribe`, the publisher dispatches actions.
    Relay,
    /// Plain WebSocket fan-out: subscribers connect, the publisher sends frames.
    Plain,
}

/// A running server under test.
struct Server {
    kind: Kind,
    /// Subscribers connect to these in turn.
    subscribe_urls: Vec<String>,
    publish_url: String,
    /// The server's processes (for CPU and RSS); `pids()` adds nginx's workers.
    pids: Vec<u32>,
    nginx_master: Option<u32>,
    /// The bare server's process (killed when dropped).
    _child: Option<Child>,
    /// The relay's processes (killed when dropped).
    _relay: Option<common::RelayProcesses>,
}

impl Server {
    fn pids(&self) -> Vec<u32> {
        let mut pids = self.pids.clone();
        if let Some(master) = self.nginx_master {
            pids.push(master);
            pids.extend(children(master));
        }
        pids
    }

    fn cpu(&self) -> Cpu {
        self.pids()
            .into_iter()
            .filter_map(Cpu::try_of)
            .fold(Cpu::default(), |sum, cpu| sum.plus(cpu))
    }

    fn rss_kib(&self) -> u64 {
        self.pids().into_iter().map(common::rss_kib).sum()
    }
}

/// What one load gave on one server.
struct Outcome {
    p50: Duration,
    p99: Duration,
    p999: Duration,
    max: Duration,
    delivered_per_second: f64,
    lost: usize,
    duplicated: usize,
    /// Frames subscribers received besides the publications (the relay's other notifications, if any).
    other: usize,
    cpu: Cpu,
}

async fn run() {
    let seconds = std::env::var("AHP_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SECONDS);
    let loads: Vec<(usize, u64)> = match std::env::var("AHP_BENCH_LOADS") {
        Ok(loads) => loads
            .split(',')
            .map(|load| {
                let (subscribers, rate) = load.trim().split_once('x').expect("AHP_BENCH_LOADS: NxR,...");
                (
                    subscribers.parse().expect("AHP_BENCH_LOADS: subscribers"),
                    rate.parse().expect("AHP_BENCH_LOADS: rate"),
                )
            })
            .collect(),
        Err(_) => LOADS.to_vec(),
    };
    let redis_url = std::env::var("REDIS_URL").expect("REDIS_URL (run it as `scripts/bench peers`)");
    let nchan_url = std::env::var("NCHAN_URL").expect("NCHAN_URL (run it as `scripts/bench peers`)");
    let nchan_pid: u32 = std::fs::read_to_string(std::env::var("NCHAN_PID_FILE").expect("NCHAN_PID_FILE"))
        .expect("nginx pid file")
        .trim()
        .parse()
        .expect("nginx pid");
    println!(
        "peers: {IDLE_CONNECTIONS} idle connections each; loads {loads:?} (subscribers, publications/s) for {seconds} s"
    );

    let mut memory = Vec::new();
    let mut results: Vec<(&'static str, Vec<Outcome>)> = Vec::new();
    // `AHP_BENCH_SERVERS=nchan,relay embedded` runs only those.
    let only = std::env::var("AHP_BENCH_SERVERS").ok();
    for name in ["bare", "nchan", "relay embedded", "relay 2 gateways"] {
        if only
            .as_deref()
            .is_some_and(|only| !only.split(',').any(|n| n.trim() == name))
        {
            continue;
        }
        let mut outcomes = Vec::new();
        for (i, &(subscribers, rate)) in loads.iter().enumerate() {
            // Fresh processes for every load, so one load's memory and backlog do not shape the next.
            let server = match name {
                "bare" => bare().await,
                "nchan" => nchan(&nchan_url, nchan_pid, &format!("load-{i}")),
                "relay embedded" => embedded().await,
                _ => gateways(&redis_url).await,
            };
            if i == 0 {
                let per = idle_memory(&server).await;
                println!("{name:>16}: memory per idle connection {per:.1} KiB");
                memory.push((name, per));
            }
            let outcome = fan_out(&server, subscribers, rate, seconds).await;
            println!(
                "{name:>16}: {subscribers} x {rate}/s: p50 {:.2?} p99 {:.2?} p99.9 {:.2?} max {:.2?}; {:.0} delivered/s; lost {} duplicated {}; other frames {}; server CPU {}",
                outcome.p50, outcome.p99, outcome.p999, outcome.max, outcome.delivered_per_second, outcome.lost,
                outcome.duplicated, outcome.other, outcome.cpu
            );
            outcomes.push(outcome);
        }
        results.push((name, outcomes));
    }

    println!();
    println!("| server | load | p50 | p99 | p99.9 | max | delivered/s | lost | dup | server CPU s | idle KiB/conn |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, outcomes) in &results {
        let per = memory.iter().find(|(n, _)| n == name).map_or(0.0, |(_, m)| *m);
        for (outcome, (subscribers, rate)) in outcomes.iter().zip(loads.iter().copied()) {
            println!(
                "| {name} | {subscribers} x {rate}/s | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.0} | {} | {} | {:.2} | {per:.1} |",
                ms(outcome.p50), ms(outcome.p99), ms(outcome.p999), ms(outcome.max), outcome.delivered_per_second,
                outcome.lost, outcome.duplicated, outcome.cpu.total()
            );
        }
    }
    println!();
    let find = |name: &str| results.iter().find(|(n, _)| *n == name).map(|(_, o)| o);
    let mem = |name: &str| {
        memory
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(f64::NAN, |(_, m)| *m)
    };
    for relay in ["relay embedded", "relay 2 gateways"] {
        for peer in ["nchan", "bare"] {
            let (Some(r), Some(p)) = (find(relay), find(peer)) else {
                continue;
            };
            for ((a, b), (subscribers, rate)) in r.iter().zip(p).zip(loads.iter().copied()) {
                println!(
                    "{relay} / {peer} at {subscribers} x {rate}/s: p99 {:.2} (<= 1 is better), delivered/s {:.2} (>= 1), CPU {:.2}",
                    ms(a.p99) / ms(b.p99),
                    a.delivered_per_second / b.delivered_per_second,
                    a.cpu.total() / b.cpu.total()
                );
            }
            println!(
                "{relay} / {peer}: memory per idle connection {:.2} (<= 1 is better)",
                mem(relay) / mem(peer)
            );
        }
    }
}

/// The relay's `/metrics` text (the first gateway's, for the 2-gateway shape), or empty.
async fn relay_metrics(server: &Server) -> String {
    let addr = server.subscribe_urls[0]
        .trim_start_matches("ws://")
        .split(['/', '?'])
        .next()
        .unwrap_or_default()
        .to_string();
    let Ok(mut stream) = tokio::net::TcpStream::connect(&addr).await else {
        return String::new();
    };
    use tokio::io::AsyncWriteExt;
    let mut body = String::new();
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() || stream.read_to_string(&mut body).await.is_err()
    {
        return String::new();
    }
    body
}

/// The relay's own view of the load, between two `/metrics` texts: how long store commits took and how long
/// events took from commit to the socket (histogram buckets, so the quantiles are bucket bounds).
fn relay_stages(before: &str, after: &str) -> String {
    let buckets = |body: &str, name: &str| -> Vec<(f64, f64)> {
        body.lines()
            .filter_map(|line| {
                let rest = line.strip_prefix(&format!("{name}_bucket{{le=\""))?;
                let (le, count) = rest.split_once("\"} ")?;
                Some((le.parse().unwrap_or(f64::INFINITY), count.trim().parse().ok()?))
            })
            .collect()
    };
    let quantiles = |name: &str| {
        let earlier = buckets(before, name);
        let delta: Vec<(f64, f64)> = buckets(after, name)
            .into_iter()
            .map(|(le, count)| {
                let was = earlier.iter().find(|(l, _)| *l == le).map_or(0.0, |(_, c)| *c);
                (le, count - was)
            })
            .collect();
        let total = delta.last().map_or(0.0, |b| b.1);
        let at = |q: f64| {
            delta
                .iter()
                .find(|(_, count)| *count >= q * total)
                .map_or(f64::NAN, |(le, _)| le * 1000.0)
        };
        format!("p50 <= {} ms, p99 <= {} ms ({total} samples)", at(0.5), at(0.99))
    };
    format!(
        "during the load: store commit {}; commit -> socket {}",
        quantiles(relay_core::telemetry::COMMIT_SECONDS),
        quantiles(relay_core::telemetry::FANOUT_LATENCY_SECONDS)
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn bare() -> Server {
    let mut command = Command::new(std::env::current_exe().expect("current exe"));
    command.env(common::BARE_SERVER_ENV, "1");
    let (child, addr) = spawn_until(command, "listening on ws://").await;
    Server {
        kind: Kind::Plain,
        subscribe_urls: vec![format!("ws://{addr}/")],
        publish_url: format!("ws://{addr}/"),
        pids: vec![child.id().expect("pid")],
        nginx_master: None,
        _child: Some(child),
        _relay: None,
    }
}

/// nginx + nchan (one process for the whole run, started by `scripts/with-nchan`); `channel` is new for every
/// load, so no load sees another's messages.
fn nchan(url: &str, master: u32, channel: &str) -> Server {
    let ws = url.replacen("http://", "ws://", 1);
    Server {
        kind: Kind::Plain,
        subscribe_urls: vec![format!("{ws}/sub?channel={channel}")],
        publish_url: format!("{ws}/pub?channel={channel}"),
        pids: Vec::new(),
        nginx_master: Some(master),
        _child: None,
        _relay: None,
    }
}

async fn embedded() -> Server {
    let relay = common::start_embedded().await;
    Server {
        kind: Kind::Relay,
        subscribe_urls: relay.urls.clone(),
        publish_url: relay.urls[0].clone(),
        pids: relay.pids.clone(),
        nginx_master: None,
        _child: None,
        _relay: Some(relay),
    }
}

async fn gateways(redis_url: &str) -> Server {
    let relay = common::start_gateways(redis_url).await;
    let mut pids = relay.pids.clone();
    if let Some(redis) = common::redis_pid(redis_url).await {
        pids.push(redis);
    }
    Server {
        kind: Kind::Relay,
        publish_url: relay.urls[0].clone(),
        subscribe_urls: relay.urls.clone(),
        pids,
        nginx_master: None,
        _child: None,
        _relay: Some(relay),
    }
}

/// nginx's workers: the children of its master process.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// A subscriber of the server's channel, ready to receive (relay: initialized and subscribed).
async fn subscriber(server: &Server, i: usize) -> Socket {
    let url = &server.subscribe_urls[i % server.subscribe_urls.len()];
    match server.kind {
        Kind::Relay => {
            let mut s = initialized(url, &format!("sub-{i}")).await;
            request(&mut s, "subscribe", json!({"channel": common::CHAT})).await;
            s
        }
        Kind::Plain => connect(url).await,
    }
}

/// RSS growth per idle connection, in KiB.
async fn idle_memory(server: &Server) -> f64 {
    // One connection first, so what the first connection allocates once (e.g. the host) is not counted.
    let mut idle = vec![open_idle(server, 0).await];
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = server.rss_kib();
    for i in 1..=IDLE_CONNECTIONS {
        idle.push(open_idle(server, i).await);
    }
    let after = server.rss_kib();
    drop(idle);
    after.saturating_sub(before) as f64 / IDLE_CONNECTIONS as f64
}

async fn open_idle(server: &Server, i: usize) -> Socket {
    let url = &server.subscribe_urls[i % server.subscribe_urls.len()];
    match server.kind {
        Kind::Relay => initialized(url, &format!("idle-{i}")).await,
        Kind::Plain => connect(url).await,
    }
}

/// The frame a publisher sends for publication `i` (`warm`: a warm-up frame, not counted).
fn publication(kind: Kind, i: usize, warm: bool) -> String {
    let marker = if warm {
        format!("warm-{i}-")
    } else {
        format!("pub-{i}-")
    };
    match kind {
        Kind::Relay => dispatch_frame(i, &marker),
        // The size and shape of a frame the relay delivers for the dispatch above.
        Kind::Plain => {
            json!({"jsonrpc":"2.0","method":"action","params":{"channel":common::CHAT,"serverSeq":i + 3,
            "action":{"type":"chat/draftChanged","draft":{"text":marker,"origin":{"kind":"user"}}},
            "origin":{"clientId":"publisher","clientSeq":i + 1}}})
            .to_string()
        }
    }
}

/// The index in a `"pub-{i}-"` marker, or `None` (warm-up frames, replies, other notifications).
fn index_of(frame: &str) -> Option<usize> {
    let at = frame.find("pub-")? + 4;
    let rest = &frame[at..];
    let end = rest.find('-')?;
    rest[..end].parse().ok()
}

async fn fan_out(server: &Server, subscribers: usize, rate: u64, seconds: u64) -> Outcome {
    let total = usize::try_from(rate * seconds).expect("count");
    // The publisher first: on the relay it creates the chat the subscribers subscribe to.
    let publisher_socket = match server.kind {
        Kind::Relay => {
            let mut p = initialized(&server.publish_url, "publisher").await;
            create_chat(&mut p).await;
            p
        }
        Kind::Plain => connect(&server.publish_url).await,
    };
    let mut sockets = Vec::with_capacity(subscribers);
    for i in 0..subscribers {
        sockets.push(subscriber(server, i).await);
    }
    let (mut publisher, mut echoes) = publisher_socket.split();
    // The publisher's own socket gets echoes and replies: keep it drained.
    let drain = tokio::spawn(async move { while let Some(Ok(_)) = echoes.next().await {} });

    let origin = Instant::now();
    let warmed = Arc::new(AtomicUsize::new(0));
    let publish_end = Arc::new(parking_lot::Mutex::new(None::<Instant>));
    let readers: Vec<_> = sockets
        .into_iter()
        .map(|mut socket| {
            let warmed = warmed.clone();
            let publish_end = publish_end.clone();
            tokio::spawn(async move {
                let mut arrivals = vec![u32::MAX; total];
                let mut got = 0usize;
                let mut duplicated = 0usize;
                let mut other = 0usize;
                let mut warm = false;
                while got < total {
                    let wait = match *publish_end.lock() {
                        Some(end) => (end + GRACE).saturating_duration_since(Instant::now()),
                        None => Duration::from_secs(60),
                    };
                    let frame = match tokio::time::timeout(wait, socket.next()).await {
                        Ok(Some(Ok(Message::Text(text)))) => text,
                        Ok(Some(Ok(_))) => continue,
                        Ok(_) => panic!("a subscriber's socket ended"),
                        Err(_) => {
                            if publish_end.lock().is_some() {
                                break; // the rest is lost
                            }
                            continue;
                        }
                    };
                    let at = origin.elapsed();
                    if !warm && frame.contains("warm-") {
                        warm = true;
                        warmed.fetch_add(1, Ordering::Relaxed);
                    }
                    let index = index_of(&frame);
                    if index.is_none() && warm && !frame.contains("warm-") {
                        other += 1;
                    }
                    if let Some(i) = index {
                        if i < total {
                            if arrivals[i] == u32::MAX {
                                arrivals[i] = u32::try_from(at.as_micros()).unwrap_or(u32::MAX - 1);
                                got += 1;
                            } else {
                                duplicated += 1;
                            }
                        }
                    }
                }
                (arrivals, duplicated, other, socket)
            })
        })
        .collect();

    // Warm up until every subscriber has received a frame: each is registered with the server.
    let mut w = 0;
    while warmed.load(Ordering::Relaxed) < subscribers {
        publisher
            .send(Message::Text(publication(server.kind, w, true).into()))
            .await
            .expect("warm-up");
        w += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(w < 600, "subscribers did not all receive a warm-up frame");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let metrics_before = match server.kind {
        Kind::Relay => relay_metrics(server).await,
        Kind::Plain => String::new(),
    };
    let cpu_before = server.cpu();
    let mut sent = vec![0u32; total];
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let frames: Vec<String> = (0..total).map(|i| publication(server.kind, i, false)).collect();
    for (i, frame) in frames.into_iter().enumerate() {
        tick.tick().await;
        sent[i] = u32::try_from(origin.elapsed().as_micros()).expect("micros");
        send(&mut publisher, frame).await;
    }
    *publish_end.lock() = Some(Instant::now());
    let mut latencies: Vec<u32> = Vec::with_capacity(total * subscribers);
    let (mut lost, mut duplicated, mut other) = (0, 0, 0);
    let mut last_arrival = 0u32;
    let mut sockets = Vec::new();
    for reader in readers {
        let (arrivals, dups, others, socket) = reader.await.expect("reader");
        duplicated += dups;
        other += others;
        for (i, at) in arrivals.into_iter().enumerate() {
            if at == u32::MAX {
                lost += 1;
            } else {
                latencies.push(at.saturating_sub(sent[i]));
                last_arrival = last_arrival.max(at);
            }
        }
        sockets.push(socket);
    }
    let cpu = server.cpu().since(cpu_before);
    if server.kind == Kind::Relay {
        let after = relay_metrics(server).await;
        println!("{:>16}  {}", "", relay_stages(&metrics_before, &after));
    }
    drop(sockets);
    drain.abort();
    latencies.sort_unstable();
    let pick = |q: f64| {
        let at = ((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1));
        Duration::from_micros(latencies.get(at).copied().unwrap_or(0).into())
    };
    let span = Duration::from_micros(last_arrival.saturating_sub(sent[0]).into());
    Outcome {
        p50: pick(0.50),
        p99: pick(0.99),
        p999: pick(0.999),
        max: pick(1.0),
        delivered_per_second: latencies.len() as f64 / span.as_secs_f64(),
        lost,
        duplicated,
        other,
        cpu,
    }
}

async fn send(publisher: &mut SplitSink<Socket, Message>, frame: String) {
    publisher
        .send(Message::Text(frame.into()))
        .await
        .expect("publish");
}
