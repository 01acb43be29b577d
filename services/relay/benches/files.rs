//! `resourceRead` of a 1 MiB file through the embedded relay (the tenant's file server in its sandbox, the
//! relay, a WebSocket), against baselines measured in the same run: a `ping` round trip on the same socket (the
//! transport's floor) plus the same file read and base64-encoded in this process (the work any server must do).
//!
//! Run: `scripts/bench files`. Loopback only; 200 reads of each kind.

mod common;

use std::time::{Duration, Instant};

use base64::Engine;
use common::{connect, request, serve_with_scripted_agent, token};
use serde_json::json;

const READS: usize = 200;
const FILE_BYTES: usize = 1024 * 1024;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let relay = serve_with_scripted_agent("").await;
    let addr = &relay.addr;
    let mut socket = connect(&format!("ws://{addr}?access_token={}", token())).await;
    let init = request(
        &mut socket,
        "initialize",
        json!({"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "bench-files"}),
    )
    .await;
    let root = init["result"]["defaultDirectory"]
        .as_str()
        .expect("defaultDirectory")
        .to_string();
    request(
        &mut socket,
        "resourceMkdir",
        json!({"channel": "ahp-root://", "uri": root}),
    )
    .await;

    // 1 MiB of bytes that are not text (base64 on the wire), written where the tenant's files are.
    let mut seed = 7u64;
    let bytes: Vec<u8> = (0..FILE_BYTES)
        .map(|_| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 56) as u8
        })
        .collect();
    let path = std::path::PathBuf::from(root.trim_start_matches("file://")).join("bench.bin");
    std::fs::write(&path, &bytes).expect("write the file");
    let uri = format!("{root}/bench.bin");

    let read = json!({"channel": "ahp-root://", "uri": uri});
    for _ in 0..10 {
        request(&mut socket, "resourceRead", read.clone()).await;
    }
    let mut relay = Vec::with_capacity(READS);
    for _ in 0..READS {
        let started = Instant::now();
        let reply = request(&mut socket, "resourceRead", read.clone()).await;
        relay.push(started.elapsed());
        assert_eq!(reply["result"]["encoding"], "base64");
    }
    let mut ping = Vec::with_capacity(READS);
    for _ in 0..READS {
        let started = Instant::now();
        request(&mut socket, "ping", json!({})).await;
        ping.push(started.elapsed());
    }
    let mut local = Vec::with_capacity(READS);
    for _ in 0..READS {
        let started = Instant::now();
        let read = std::fs::read(&path).expect("read");
        let encoded = base64::engine::general_purpose::STANDARD.encode(&read);
        assert!(encoded.len() > FILE_BYTES);
        local.push(started.elapsed());
    }
    let (relay50, relay99) = (percentile(&mut relay, 0.5), percentile(&mut relay, 0.99));
    let (ping50, local50) = (percentile(&mut ping, 0.5), percentile(&mut local, 0.5));
    println!("resourceRead of a 1 MiB binary file ({READS} reads, one client, embedded relay, sandboxed file server):");
    println!(
        "  resourceRead       p50 {:.2} ms   p99 {:.2} ms",
        ms(relay50),
        ms(relay99)
    );
    println!(
        "  baseline: ping round trip p50 {:.3} ms + read and base64 in-process p50 {:.2} ms",
        ms(ping50),
        ms(local50)
    );
    println!(
        "  ratio resourceRead p50 / (ping p50 + in-process p50): {:.1}x",
        relay50.as_secs_f64() / (ping50 + local50).as_secs_f64()
    );
}
