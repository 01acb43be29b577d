//! A busy host beside a quiet one: does one tenant's load delay another tenant's actions?
//!
//! Run: `scripts/bench hosts` (SQLite, then Postgres from `scripts/with-postgres`). Everything is on loopback
//! and bounded in count and time.
//!
//! One embedded `serve`; two tenants, so two hosts, each with a publisher and [`SUBSCRIBERS`] subscribers of
//! one chat. The quiet host dispatches [`QUIET_RATE`] actions/s; its dispatch → arrival (every subscriber,
//! every action) is measured alone, then with the busy host dispatching [`BUSY_RATE`] actions/s beside it, in
//! alternating rounds of [`ROUND`]. The difference of the two p99s is what the busy host costs the quiet one.
//! Each store is measured with one commit thread (`AHP_RELAY_COMMIT_THREADS=1`) and with the default pool, in
//! the same run.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{initialized, next_text, request, run_with_deadline, spawn_until, Socket, SECRET};
use futures_util::SinkExt;
use relay_core::Role;
use relay_gateway::auth::{mint_hs256, Claims};
use serde_json::{json, Value};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::Message;

const SUBSCRIBERS: usize = 20;
const QUIET_RATE: u64 = 100;
const BUSY_RATE: u64 = 1_000;
const ROUND: Duration = Duration::from_secs(4);
const ROUNDS: usize = 3;

fn main() {
    run_with_deadline(Duration::from_secs(900), async {
        let mut stores = vec![("sqlite", None)];
        if let Ok(url) = std::env::var("DATABASE_URL") {
            stores.push(("postgres", Some(url)));
        }
        for (store, url) in &stores {
            for threads in ["1", "default"] {
                measure(store, url.as_deref(), threads).await;
            }
        }
    });
}

async fn measure(store: &str, database_url: Option<&str>, threads: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--jwt-secret", SECRET])
        .arg("--data-dir")
        .arg(dir.path());
    if let Some(url) = database_url {
        command.args(["--database-url", url]);
    }
    if threads != "default" {
        command.env("AHP_RELAY_COMMIT_THREADS", threads);
    }
    let (mut relay, addr): (Child, String) = spawn_until(command, "listening on ws://").await;
    let base = format!("ws://{}", addr.trim_end_matches("/v1/ws"));
    // Tenants of their own in every measurement (a Postgres database outlives the process).
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut quiet = Host::open(&base, &format!("quiet-{run}")).await;
    let mut busy = Host::open(&base, &format!("busy-{run}")).await;

    let (mut alone, mut beside) = (Vec::new(), Vec::new());
    let mut busy_sent = 0;
    for _ in 0..ROUNDS {
        alone.extend(quiet.run(QUIET_RATE, ROUND).await);
        let (quiet_latencies, sent) = tokio::join!(quiet.run(QUIET_RATE, ROUND), busy.run(BUSY_RATE, ROUND));
        beside.extend(quiet_latencies);
        busy_sent += sent.len() / SUBSCRIBERS;
    }
    let (a50, a99) = percentiles(&mut alone);
    let (b50, b99) = percentiles(&mut beside);
    println!(
        "{store:<8} commit threads {threads:<7}  quiet host alone p50 {:>6.2} ms p99 {:>6.2} ms | beside a busy host ({} actions, {:.0}/s) p50 {:>6.2} ms p99 {:>6.2} ms | p99 raised by {:+.2} ms (target <= 2 ms)",
        ms(a50),
        ms(a99),
        busy_sent,
        busy_sent as f64 / (ROUND * ROUNDS as u32).as_secs_f64(),
        ms(b50),
        ms(b99),
        ms(b99) - ms(a99),
    );
    relay.start_kill().expect("kill");
    let _ = relay.wait().await;
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentiles(latencies: &mut [Duration]) -> (Duration, Duration) {
    latencies.sort();
    let n = latencies.len();
    (latencies[n / 2], latencies[n * 99 / 100])
}

/// One tenant's host: a publisher and its chat's subscribers.
struct Host {
    publisher: Socket,
    subscribers: Vec<Socket>,
    chat: String,
    next: usize,
}

impl Host {
    async fn open(base: &str, tenant: &str) -> Host {
        let token = mint_hs256(
            SECRET.as_bytes(),
            &Claims::new(tenant, "bench", Role::Admin, None, Duration::from_secs(3600)),
        )
        .expect("token");
        let url = format!("{base}/v1/ws?access_token={token}");
        let mut publisher = initialized(&url, "publisher").await;
        request(
            &mut publisher,
            "createSession",
            json!({"channel": "ahp-session:/bench", "provider": "demo"}),
        )
        .await;
        let chat = "ahp-chat:/bench".to_string();
        let mut subscribers = Vec::new();
        for i in 0..SUBSCRIBERS {
            let mut s = initialized(&url, &format!("watch-{i}")).await;
            request(&mut s, "subscribe", json!({"channel": chat})).await;
            subscribers.push(s);
        }
        Host {
            publisher,
            subscribers,
            chat,
            next: 0,
        }
    }

    /// Offer `rate` actions/s for `period`, each marked with its index; returns dispatch → arrival for every
    /// (subscriber, action).
    async fn run(&mut self, rate: u64, period: Duration) -> Vec<Duration> {
        let total = (rate as f64 * period.as_secs_f64()) as usize;
        let first = self.next;
        self.next += total;
        let origin = Instant::now();
        let sent = Arc::new(parking_lot::Mutex::new(vec![None::<Duration>; total]));
        let readers: Vec<_> = std::mem::take(&mut self.subscribers)
            .into_iter()
            .map(|mut s| {
                let sent = sent.clone();
                tokio::spawn(async move {
                    let mut latencies = Vec::with_capacity(total);
                    while latencies.len() < total {
                        let text = next_text(&mut s).await;
                        let Ok(v) = serde_json::from_str::<Value>(&text) else {
                            continue;
                        };
                        let Some(mark) = v["params"]["action"]["draft"]["text"].as_str() else {
                            continue;
                        };
                        let Some(i) = mark.strip_prefix("n").and_then(|n| n.parse::<usize>().ok()) else {
                            continue;
                        };
                        let at = origin.elapsed();
                        if let Some(Some(when)) =
                            i.checked_sub(first).and_then(|k| sent.lock().get(k).copied())
                        {
                            latencies.push(at.saturating_sub(when));
                        }
                    }
                    (s, latencies)
                })
            })
            .collect();
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        for k in 0..total {
            tick.tick().await;
            let i = first + k;
            sent.lock()[k] = Some(origin.elapsed());
            let frame = json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":self.chat,"clientSeq":i + 1,
                "action":{"type":"chat/draftChanged","draft":{"text":format!("n{i}"),"origin":{"kind":"user"}}}}});
            self.publisher
                .send(Message::Text(frame.to_string().into()))
                .await
                .expect("publish");
        }
        let mut all = Vec::new();
        for reader in readers {
            let (s, latencies) = reader.await.expect("reader");
            self.subscribers.push(s);
            all.extend(latencies);
        }
        all
    }
}
