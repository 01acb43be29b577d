//! Terminal throughput: `cat` of a 32 MiB text file in a device's terminal (a shell on a pseudoterminal in the
//! session's sandbox, the embedded relay, two devices subscribed over WebSockets, each reading until
//! `terminal/exited`), against baselines measured in the same run on this machine: `cat` of the same file into a
//! pipe this process reads, and into a pseudoterminal this process reads (a terminal without the relay). Also:
//! `terminal/data` envelopes per MiB (output is coalesced). The tenant's output rate is lifted for the run (the
//! default, 1 MiB/s, would measure the quota).
//!
//! Run: `scripts/bench terminals`. Loopback only; three runs of each, the median reported.

mod common;

use std::time::{Duration, Instant};

use common::{connect, next_text, request, serve_with_scripted_agent, token, Socket};
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const FILE_BYTES: usize = 32 * 1024 * 1024;
const RUNS: usize = 3;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn mib_per_s(bytes: usize, took: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / took.as_secs_f64()
}

/// Read frames until the terminal's `terminal/exited`: (data bytes, data envelopes).
async fn read_until_exited(mut socket: Socket, uri: String) -> (usize, usize, Socket) {
    let (mut bytes, mut envelopes) = (0, 0);
    loop {
        let frame: Value = serde_json::from_str(&next_text(&mut socket).await).expect("json");
        if frame["method"] != "action" || frame["params"]["channel"] != uri.as_str() {
            continue;
        }
        let action = &frame["params"]["action"];
        match action["type"].as_str() {
            Some("terminal/data") => {
                bytes += action["data"].as_str().map_or(0, str::len);
                envelopes += 1;
            }
            Some("terminal/exited") => return (bytes, envelopes, socket),
            _ => {}
        }
    }
}

/// Read frames until one of `uri`'s actions is of `kind`; returns that action.
async fn wait_for(socket: &mut Socket, uri: &str, kind: &str) -> Value {
    loop {
        let frame: Value = serde_json::from_str(&next_text(socket).await).expect("json");
        if frame["method"] == "action"
            && frame["params"]["channel"] == uri
            && frame["params"]["action"]["type"] == kind
        {
            return frame["params"]["action"].clone();
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let relay = serve_with_scripted_agent("[quotas]\noutput_bytes_per_second = 4294967296").await;
    let addr = &relay.addr;
    let url = format!("ws://{addr}?access_token={}", token());
    let mut a = connect(&url).await;
    let mut b = connect(&url).await;
    for (socket, id) in [(&mut a, "bench-a"), (&mut b, "bench-b")] {
        request(
            socket,
            "initialize",
            json!({"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": id}),
        )
        .await;
    }
    let session = "ahp-session:/bench-terminal";
    request(
        &mut a,
        "createSession",
        json!({"channel": session, "provider": "scripted"}),
    )
    .await;
    let opened = request(&mut a, "subscribe", json!({"channel": session})).await;
    if opened["result"]["snapshot"]["state"]["lifecycle"] != "ready" {
        wait_for(&mut a, session, "session/ready").await;
    }

    let mut relay_times = Vec::new();
    let mut pipe_times = Vec::new();
    let mut pty_times = Vec::new();
    let mut per_mib = Vec::new();
    let mut file = None;
    for run in 0..RUNS {
        let uri = format!("ahp-terminal:/bench-{run}");
        request(
            &mut a,
            "createTerminal",
            json!({"channel": uri, "claim": {"kind": "client", "clientId": "bench-a"},
                   "_meta": {"ahpRelay/session": session}, "cols": 120, "rows": 40}),
        )
        .await;
        for socket in [&mut a, &mut b] {
            request(socket, "subscribe", json!({"channel": uri})).await;
        }
        // The shell's first prompt says where it is: the session's working directory.
        let cwd = wait_for(&mut a, &uri, "terminal/cwdChanged").await;
        let dir = cwd["cwd"]
            .as_str()
            .expect("cwd")
            .trim_start_matches("file://")
            .to_string();
        let path = std::path::PathBuf::from(&dir).join("flood.txt");
        if file.is_none() {
            let line = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopqrstuvwxyz\n";
            let text: String = line.repeat(FILE_BYTES / line.len());
            std::fs::write(&path, &text).expect("write the file");
            file = Some((path.clone(), text.len()));
        }
        let started = Instant::now();
        a.send(Message::Text(
            json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": {
                "channel": uri, "clientSeq": run + 1,
                "action": {"type": "terminal/input", "data": "cat flood.txt; exit\n"}}})
            .to_string()
            .into(),
        ))
        .await
        .expect("send");
        let readers = [
            tokio::spawn(read_until_exited(a, uri.clone())),
            tokio::spawn(read_until_exited(b, uri.clone())),
        ];
        let [on_a, on_b] = readers;
        let (bytes_a, envelopes_a, socket_a) = on_a.await.expect("device a");
        let (bytes_b, _, socket_b) = on_b.await.expect("device b");
        relay_times.push(started.elapsed());
        (a, b) = (socket_a, socket_b);
        let size = file.as_ref().map_or(0, |(_, size)| *size);
        assert!(
            bytes_a >= size && bytes_b >= size,
            "{bytes_a} / {bytes_b} of {size} bytes"
        );
        per_mib.push(envelopes_a as f64 / (bytes_a as f64 / (1024.0 * 1024.0)));
        request(&mut a, "disposeTerminal", json!({"channel": uri})).await;

        // Baselines: the same bytes by `cat` into a pipe, and into a pseudoterminal, read by this process.
        let started = Instant::now();
        let out = std::process::Command::new("cat")
            .arg(&path)
            .output()
            .expect("cat");
        assert_eq!(out.stdout.len(), size);
        pipe_times.push(started.elapsed());
        let pair =
            relay_runner::pty::open(relay_runner::pty::TerminalSize { cols: 120, rows: 40 }).expect("pty");
        let stdio = || {
            pair.terminal
                .try_clone()
                .map(std::process::Stdio::from)
                .expect("dup")
        };
        let started = Instant::now();
        let mut child = tokio::process::Command::new("cat")
            .arg(&path)
            .stdin(stdio())
            .stdout(stdio())
            .stderr(stdio())
            .spawn()
            .expect("cat on a pty");
        drop(pair.terminal);
        let mut read = 0;
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            let n = pair.controller.read(&mut buffer).await.expect("read");
            if n == 0 {
                break;
            }
            read += n;
        }
        pty_times.push(started.elapsed());
        child.wait().await.expect("cat");
        assert!(read >= size, "{read} of {size}");
    }
    let size = file.map_or(0, |(_, size)| size);
    let (relay, pipe, pty) = (median(relay_times), median(pipe_times), median(pty_times));
    per_mib.sort_by(f64::total_cmp);
    println!(
        "terminal throughput: cat of a {:.1} MiB text file, two devices, embedded relay (median of {RUNS}):",
        size as f64 / (1024.0 * 1024.0)
    );
    println!(
        "  through the relay to both devices  {:>8.1} ms  {:>7.1} MiB/s",
        relay.as_secs_f64() * 1000.0,
        mib_per_s(size, relay)
    );
    println!(
        "  baseline: cat into a pipe          {:>8.1} ms  {:>7.1} MiB/s",
        pipe.as_secs_f64() * 1000.0,
        mib_per_s(size, pipe)
    );
    println!(
        "  baseline: cat into a pty           {:>8.1} ms  {:>7.1} MiB/s",
        pty.as_secs_f64() * 1000.0,
        mib_per_s(size, pty)
    );
    println!(
        "  ratio relay / pty: {:.1}x   relay / pipe: {:.1}x",
        relay.as_secs_f64() / pty.as_secs_f64(),
        relay.as_secs_f64() / pipe.as_secs_f64()
    );
    println!(
        "  terminal/data envelopes per MiB (per device): {:.1}",
        per_mib[per_mib.len() / 2]
    );
}
