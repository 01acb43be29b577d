//! The distributed relay's delivery cost and latency: 1 shard + 2 gateways (separate `ahp-relay` processes,
//! following the host over Redis) against a bare tokio-tungstenite broadcast server, in the same run.
//!
//! Run: `scripts/bench gateways` (starts a throw-away Redis; the shard uses the embedded SQLite store in a
//! temporary directory). Everything is on loopback, bounded in count and time, and every child process is
//! killed when the bench ends or panics.
//! - Throughput: N subscribers of one chat, half on each gateway; 32 clients (alternating gateways) dispatch M
//!   actions round-robin, with at most W in flight (a gateway forwards one client's frames one gRPC call at a
//!   time, so a single dispatching client caps the action rate far below what the fan-out takes). Delivered frames per
//!   second of wall clock, and per CPU-second of the two gateway processes together (utime + stime from
//!   `/proc/<pid>/stat`, before/after). The baseline is the bare broadcast server, run as its own process (this
//!   bench re-executed, on the same kind of tokio runtime as `ahp-relay`), with the same N subscribers, the
//!   same frame (one the gateways delivered, byte for byte), the same dispatchers and window, measured the same
//!   way: once as fast as it goes, once paced at the action rate the gateways reached. (It also echoes every
//!   frame to the dispatching sockets, which it is not credited for: about 3 % in the gateways' favour.)
//! - Latency: 100 of those subscribers (50 per gateway; the others disconnect); a fixed offered load of
//!   actions/s, each carrying its index; dispatch → arrival at the *last* of them, p50/p99.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    connect, create_chat, dispatch_frame, initialized, next_frame, redis_pid, request, spawn_until, token,
    Cpu, Socket, SECRET,
};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

/// Subscribers of the chat, alternating between the two gateways.
const SUBSCRIBERS: usize = 1_000;
/// Actions of the warm-up round (not measured) before each measured round.
const WARMUP_ACTIONS: usize = 200;
/// Actions of the measured throughput round.
const ACTIONS: usize = 5_000;
/// Clients dispatching the actions, round-robin, alternating between the gateways.
const PUBLISHERS: usize = 32;
/// Most actions the dispatchers run ahead of the subscribers on average (well under the relay's outbound queue
/// of 4,096 frames per connection, so nobody is closed as a slow consumer).
const WINDOW: usize = 1_000;
/// Subscribers kept for the latency phase (the others disconnect), alternating between the gateways.
const LATENCY_SUBSCRIBERS: usize = 100;
/// Offered load of the latency phase, in actions per second, and how long it lasts.
const LATENCY_RATE: u64 = 1_000;
const LATENCY_SECONDS: u64 = 5;
/// The whole run is cut off (and fails) after this long.
const DEADLINE: Duration = Duration::from_secs(170);

type Publisher = SplitSink<Socket, Message>;

fn main() {
    if common::serve_bare_if_asked() {
        return;
    }
    common::run_with_deadline(DEADLINE, run());
}

async fn run() {
    let redis_url = std::env::var("REDIS_URL").expect("REDIS_URL (run it as `scripts/bench gateways`)");
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().expect("tempdir")).collect();

    let mut shard = Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
    shard
        .args([
            "shard",
            "--insecure-internal-link",
            "--grpc-listen",
            "127.0.0.1:0",
            "--redis-url",
            &redis_url,
        ])
        .arg("--data-dir")
        .arg(dirs[0].path());
    let (shard, shard_url) = spawn_until(shard, "listening on grpc ").await;
    let mut gateways = Vec::new();
    for dir in &dirs[1..] {
        let mut gateway = Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
        gateway
            .args(["gateway", "--listen", "127.0.0.1:0", "--jwt-secret", SECRET])
            .args(["--shard", &shard_url, "--redis-url", &redis_url])
            .args(["--max-connections-per-tenant", "100000"])
            .arg("--data-dir")
            .arg(dir.path());
        let (child, url) = spawn_until(gateway, "listening on ws://").await;
        gateways.push((child, url.trim_end_matches("/v1/ws").to_string()));
    }
    let urls: Vec<String> = gateways
        .iter()
        .map(|(_, addr)| format!("ws://{addr}/v1/ws?access_token={}", token()))
        .collect();
    let redis_pid = redis_pid(&redis_url).await;

    let mut first = initialized(&urls[0], "publisher-0").await;
    create_chat(&mut first).await;
    let mut publishers = vec![drain(first)];
    for i in 1..PUBLISHERS {
        publishers.push(drain(initialized(&urls[i % 2], &format!("publisher-{i}")).await));
    }
    let mut subscribers = Vec::new();
    for i in 0..SUBSCRIBERS {
        let mut s = initialized(&urls[i % 2], &format!("sub-{i}")).await;
        request(&mut s, "subscribe", json!({"channel": common::CHAT})).await;
        subscribers.push(s);
    }
    println!(
        "1 shard (SQLite store) + 2 gateways following it over Redis; {SUBSCRIBERS} subscribers of one chat \
         ({} per gateway); {PUBLISHERS} clients dispatching (alternating gateways)",
        SUBSCRIBERS / 2
    );

    // Throughput through the gateways.
    let warmup = (0..WARMUP_ACTIONS)
        .map(|i| dispatch_frame(i, &format!("w{i:08}")))
        .collect();
    let Round {
        subscribers, sample, ..
    } = round(&mut publishers, subscribers, warmup, None).await;
    let frames = (0..ACTIONS)
        .map(|i| dispatch_frame(WARMUP_ACTIONS + i, &format!("d{i:08}")))
        .collect();
    let pids = [
        pid(&gateways[0].0),
        pid(&gateways[1].0),
        pid(&shard),
        std::process::id(),
    ];
    let before = pids.map(Cpu::of);
    let redis_before = redis_pid.and_then(Cpu::try_of);
    let Round {
        subscribers,
        elapsed,
        blocked,
        ..
    } = round(&mut publishers, subscribers, frames, None).await;
    let after = pids.map(Cpu::of);
    let [gw1, gw2, shard_cpu, generator] = [0, 1, 2, 3].map(|i| after[i].since(before[i]));
    let redis_cpu = match (redis_before, redis_pid.and_then(Cpu::try_of)) {
        (Some(before), Some(after)) => format!("{:.2} s", after.since(before).total()),
        _ => "unknown (not a local process)".into(),
    };
    let delivered = (SUBSCRIBERS * ACTIONS) as f64;
    let gateway_rate = delivered / elapsed.as_secs_f64();
    let gateway_per_cpu = delivered / (gw1.total() + gw2.total());
    println!(
        "gateways: {ACTIONS} actions x {SUBSCRIBERS} subscribers = {delivered:.0} frames of {} bytes in {:.2} s: \
         {gateway_rate:.0} frames/s ({:.0} actions/s; dispatchers waited for subscribers {:.2} s)",
        sample.len(),
        elapsed.as_secs_f64(),
        ACTIONS as f64 / elapsed.as_secs_f64(),
        blocked.as_secs_f64()
    );
    println!(
        "  CPU: gateway 1 {gw1}, gateway 2 {gw2} -> {gateway_per_cpu:.0} frames per gateway CPU-second; \
         shard {:.2} s, Redis {redis_cpu}, load generator {generator} (wall {:.2} s, 2 cores)",
        shard_cpu.total(),
        elapsed.as_secs_f64()
    );

    // Latency at a fixed offered load, to some of the same subscribers (half on each gateway).
    let mut subscribers = subscribers;
    for mut s in subscribers.split_off(LATENCY_SUBSCRIBERS) {
        let _ = s.close(None).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (p50, p99, max) = latency(&mut publishers, subscribers, WARMUP_ACTIONS + ACTIONS).await;
    println!(
        "latency: {LATENCY_RATE} actions/s for {LATENCY_SECONDS} s to {LATENCY_SUBSCRIBERS} subscribers ({} frames/s \
         offered): dispatch -> last subscriber p50 {p50:.2?}  p99 {p99:.2?}  max {max:.2?}",
        LATENCY_RATE as usize * LATENCY_SUBSCRIBERS
    );
    let mut repairs = 0.0;
    for (_, addr) in &gateways {
        repairs += metric(addr, "ahp_relay_gap_repairs_total").await;
    }
    println!("gap repairs (lost Redis messages fetched from the shard) on both gateways: {repairs}");
    for mut p in publishers {
        let _ = p.close().await;
    }
    drop(gateways);
    drop(shard);

    // The same through the bare broadcast server, a process of its own.
    let mut bare = Command::new(std::env::current_exe().expect("current exe"));
    bare.env(common::BARE_SERVER_ENV, "1");
    let (bare, bare_addr) = spawn_until(bare, "listening on ws://").await;
    let bare_url = format!("ws://{bare_addr}/");
    let mut bare_publishers = Vec::new();
    for _ in 0..PUBLISHERS {
        bare_publishers.push(connect(&bare_url).await);
    }
    let mut bare_subscribers = Vec::new();
    for _ in 0..SUBSCRIBERS {
        bare_subscribers.push(connect(&bare_url).await);
    }
    // Every socket registers with the broadcast after its handshake: let them, then check one frame reaches all.
    tokio::time::sleep(Duration::from_millis(200)).await;
    bare_publishers[0]
        .send(Message::Text("hello".into()))
        .await
        .expect("send");
    for s in &mut bare_subscribers {
        next_frame(s).await;
    }
    let mut bare_publishers: Vec<Publisher> = bare_publishers.into_iter().map(drain).collect();
    let template = sample.to_string();
    let mut bare_subscribers = round(
        &mut bare_publishers,
        bare_subscribers,
        vec![template.clone(); WARMUP_ACTIONS],
        None,
    )
    .await
    .subscribers;
    let bare_pid = pid(&bare);
    let mut bare_results = Vec::new();
    // As fast as it goes, then paced at the action rate the gateways reached (the input pattern they had).
    for pace in [None, Some(elapsed / ACTIONS as u32)] {
        let pids = [bare_pid, std::process::id()];
        let before = pids.map(Cpu::of);
        let Round {
            subscribers,
            elapsed: bare_elapsed,
            blocked: bare_blocked,
            ..
        } = round(
            &mut bare_publishers,
            bare_subscribers,
            vec![template.clone(); ACTIONS],
            pace,
        )
        .await;
        bare_subscribers = subscribers;
        let after = pids.map(Cpu::of);
        let [bare_cpu, generator] = [0, 1].map(|i| after[i].since(before[i]));
        let bare_rate = delivered / bare_elapsed.as_secs_f64();
        let bare_per_cpu = delivered / bare_cpu.total();
        let how = match pace {
            None => "as fast as it goes".to_string(),
            Some(_) => format!(
                "paced at the gateways' {:.0} actions/s",
                ACTIONS as f64 / elapsed.as_secs_f64()
            ),
        };
        println!(
            "bare broadcast server (own process), {how}: {delivered:.0} frames of {} bytes in {:.2} s: \
             {bare_rate:.0} frames/s (dispatchers waited for subscribers {:.2} s)",
            sample.len(),
            bare_elapsed.as_secs_f64(),
            bare_blocked.as_secs_f64()
        );
        println!("  CPU: {bare_cpu} -> {bare_per_cpu:.0} frames per CPU-second; load generator {generator}");
        bare_results.push((bare_rate, bare_per_cpu));
    }
    let [(max_rate, max_per_cpu), (_, paced_per_cpu)] = [bare_results[0], bare_results[1]];
    println!(
        "ratio gateways / bare: per CPU-second {:.2} (target >= 0.70), per wall-clock second {:.2}; \
         per CPU-second against the bare server at the same action rate {:.2}",
        gateway_per_cpu / max_per_cpu,
        gateway_rate / max_rate,
        gateway_per_cpu / paced_per_cpu
    );
    for mut p in bare_publishers {
        let _ = p.close().await;
    }
    drop(bare_subscribers);
    drop(bare);
}

/// Keep reading (and discarding) what the server sends the publisher, so its socket never backs up; returns
/// the sending half.
fn drain(socket: Socket) -> Publisher {
    let (sink, mut stream) = socket.split();
    tokio::spawn(async move { while let Some(Ok(_)) = stream.next().await {} });
    sink
}

/// What one [`round`] measured.
struct Round {
    subscribers: Vec<Socket>,
    /// From the first send to the last arrival.
    elapsed: Duration,
    /// How long the publishers waited for the subscribers (the window was full).
    blocked: Duration,
    /// One delivered frame.
    sample: Utf8Bytes,
}

/// Publish `frames` round-robin (at most [`WINDOW`] ahead of the subscribers on average, and one per `pace`
/// if given) and wait until every subscriber has received one `chat/draftChanged` frame per frame sent.
async fn round(
    publishers: &mut [Publisher],
    subscribers: Vec<Socket>,
    frames: Vec<String>,
    pace: Option<Duration>,
) -> Round {
    let expected = frames.len();
    let count = subscribers.len() as u64;
    let delivered = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let readers: Vec<_> = subscribers
        .into_iter()
        .map(|mut s| {
            let delivered = delivered.clone();
            tokio::spawn(async move {
                let mut got = 0;
                let mut last = Utf8Bytes::from_static("");
                while got < expected {
                    let frame = next_frame(&mut s).await;
                    if frame.as_str().contains("chat/draftChanged") {
                        got += 1;
                        delivered.fetch_add(1, Ordering::Relaxed);
                        last = frame;
                    }
                }
                (s, last)
            })
        })
        .collect();
    let mut blocked = Duration::ZERO;
    let mut tick = pace.map(|every| {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        tick
    });
    for (i, frame) in frames.into_iter().enumerate() {
        if let Some(tick) = &mut tick {
            tick.tick().await;
        }
        if i >= WINDOW {
            // The window is full: wait until the subscribers have caught up by half a window, so sends come in
            // bursts.
            let must = (i - WINDOW) as u64 * count;
            if delivered.load(Ordering::Relaxed) < must {
                let waiting = Instant::now();
                let resume = (i - WINDOW / 2) as u64 * count;
                while delivered.load(Ordering::Relaxed) < resume {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                blocked += waiting.elapsed();
            }
        }
        let n = publishers.len();
        publishers[i % n]
            .send(Message::Text(frame.into()))
            .await
            .expect("publish");
    }
    let mut sockets = Vec::new();
    let mut sample = Utf8Bytes::from_static("");
    for reader in readers {
        let (s, last) = reader.await.expect("reader");
        sockets.push(s);
        sample = last;
    }
    Round {
        subscribers: sockets,
        elapsed: started.elapsed(),
        blocked,
        sample,
    }
}

/// Offer [`LATENCY_RATE`] actions/s for [`LATENCY_SECONDS`]; each carries its index. Returns p50, p99 and max
/// of dispatch → arrival at the last subscriber.
async fn latency(
    publishers: &mut [Publisher],
    subscribers: Vec<Socket>,
    first_seq: usize,
) -> (Duration, Duration, Duration) {
    let total = (LATENCY_RATE * LATENCY_SECONDS) as usize;
    let origin = Instant::now();
    let arrivals: Arc<Vec<AtomicU64>> = Arc::new((0..total).map(|_| AtomicU64::new(0)).collect());
    let readers: Vec<_> = subscribers
        .into_iter()
        .map(|mut s| {
            let arrivals = arrivals.clone();
            tokio::spawn(async move {
                let mut got = 0;
                while got < total {
                    let frame = next_frame(&mut s).await;
                    let Some(i) = lat_index(frame.as_str()) else {
                        continue;
                    };
                    let at = origin.elapsed().as_nanos() as u64;
                    arrivals[i].fetch_max(at, Ordering::Relaxed);
                    got += 1;
                }
                s
            })
        })
        .collect();
    let mut sent = vec![Duration::ZERO; total];
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / LATENCY_RATE));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for (i, slot) in sent.iter_mut().enumerate() {
        tick.tick().await;
        *slot = origin.elapsed();
        let n = publishers.len();
        publishers[i % n]
            .send(Message::Text(
                dispatch_frame(first_seq + i, &format!("lat:{i}")).into(),
            ))
            .await
            .expect("publish");
    }
    for reader in readers {
        reader.await.expect("reader");
    }
    let mut latencies: Vec<Duration> = arrivals
        .iter()
        .zip(&sent)
        .map(|(a, s)| Duration::from_nanos(a.load(Ordering::Relaxed)).saturating_sub(*s))
        .collect();
    latencies.sort();
    (
        latencies[total / 2],
        latencies[total * 99 / 100],
        latencies[total - 1],
    )
}

/// The index `i` of a delivered `"lat:{i}"` draft.
fn lat_index(frame: &str) -> Option<usize> {
    let rest = &frame[frame.find("\"lat:")? + 5..];
    let end = rest.find('"')?;
    rest[..end].parse().ok()
}

fn pid(child: &Child) -> u32 {
    child.id().expect("child is running")
}

/// A value from a gateway's Prometheus `/metrics`.
async fn metric(addr: &str, name: &str) -> f64 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let mut body = String::new();
    stream.read_to_string(&mut body).await.expect("response");
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing"))
}
