//! Durable throughput of one host against raw batched inserts of the same rows, and restore time.
//!
//! Run: `scripts/bench` (starts a throw-away Postgres when `DATABASE_URL` is unset). Both figures of each pair
//! are measured in the same run against the same database, so their ratio holds on a noisy machine.

use std::sync::Arc;
use std::time::Instant;

use relay_core::rpc::read_frame;
use relay_core::{ConnectionId, HostKey, Identity, Limits, Role};
use relay_runner::{DemoProvider, ProviderRegistry};
use relay_shard::Host;
use relay_store::{LogEntry, Store};
use serde_json::json;

const ACTIONS: usize = 100_000;
const BASELINE_BATCH: usize = 1_000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        let dir = std::env::temp_dir().join(format!("relay-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        format!("sqlite://{}", dir.join("bench.sqlite").display())
    });
    let store = Store::connect(&url).await.expect("store");
    store.migrate().await.expect("migrate");
    let backend = format!("{:?}", store.backend());
    let run = format!("{}", std::process::id());
    println!("store: {backend}; {ACTIONS} actions per measurement");

    // 1. Relay: one host, one connection, ACTIONS client dispatches, until all are durable.
    let host_key = HostKey::new(format!("bench-{run}"), "default");
    let limits = Limits::default();
    let providers = ProviderRegistry::new().with(Arc::new(DemoProvider::default()));
    let frames = draft_frames();
    let relay_elapsed = fill_host(&store, &host_key, limits.clone(), providers.clone(), &frames).await;
    // 2. Baseline: the same rows, inserted raw in batches, into the same database.
    let envelopes: Vec<String> = frames
        .iter()
        .enumerate()
        .map(|(i, _)| {
            json!({"channel":"ahp-chat:/bench","action":{"type":"chat/draftChanged","draft":{"text":format!("draft number {i} with some typical text"),"origin":{"kind":"user"}}},"serverSeq":i + 10,"origin":{"clientId":"bench","clientSeq":i + 1}})
            .to_string()
        })
        .collect();
    let baseline_tenant = format!("baseline-{run}");
    let started = Instant::now();
    for (chunk_no, chunk) in envelopes.chunks(BASELINE_BATCH).enumerate() {
        let log = chunk
            .iter()
            .enumerate()
            .map(|(i, envelope)| LogEntry {
                seq: (chunk_no * BASELINE_BATCH + i + 1) as u64,
                channel: "ahp-chat:/bench".into(),
                envelope: envelope.clone(),
                at_ms: 0,
            })
            .collect();
        store
            .insert_log_raw(&baseline_tenant, "default", log)
            .await
            .expect("baseline insert");
    }
    let baseline_elapsed = started.elapsed();

    let relay_rate = ACTIONS as f64 / relay_elapsed.as_secs_f64();
    let baseline_rate = ACTIONS as f64 / baseline_elapsed.as_secs_f64();
    println!("durable actions/s through one host: {relay_rate:>10.0}  ({relay_elapsed:.2?})");
    println!(
        "raw batched inserts/s (batch {BASELINE_BATCH}): {baseline_rate:>10.0}  ({baseline_elapsed:.2?})"
    );
    println!("ratio (target >= 0.50): {:.2}", relay_rate / baseline_rate);

    // 3. Restore: open the host again on the same store and load the chat (snapshot + log tail), once for the
    // host above (default snapshot policy) and once for a host whose chat was never snapshotted after creation.
    let unsnapshotted = HostKey::new(format!("bench-nosnap-{run}"), "default");
    let never = Limits {
        snapshot_every_actions: u32::MAX,
        snapshot_every: std::time::Duration::from_secs(86_400),
        ..limits.clone()
    };
    fill_host(&store, &unsnapshotted, never, providers.clone(), &frames).await;
    for (label, host_key) in [
        ("snapshots every 500 actions", &host_key),
        ("no snapshot since creation: full log replay", &unsnapshotted),
    ] {
        let started = Instant::now();
        let restored = Host::open(
            host_key.clone(),
            limits.clone(),
            providers.clone(),
            store.clone(),
            None,
            None,
        )
        .await
        .expect("reopen");
        let conn = ConnectionId::next();
        let _bus = restored.attach(
            conn,
            Identity {
                subject: "bench".into(),
                tenant: host_key.tenant.clone(),
                role: Role::Admin,
                hosts: None,
            },
        );
        call(&restored, conn, &json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"bench2"}}).to_string()).await;
        let reply = call(
            &restored,
            conn,
            &json!({"jsonrpc":"2.0","id":2,"method":"subscribe","params":{"channel":"ahp-chat:/bench"}})
                .to_string(),
        )
        .await;
        let elapsed = started.elapsed();
        assert!(
            reply.contains("\"snapshot\""),
            "restored chat must be subscribable: {reply}"
        );
        println!("restore of a host with {ACTIONS} logged actions ({label}): {elapsed:.2?}");
    }
}

/// ACTIONS `chat/draftChanged` dispatches, as a client would send them.
fn draft_frames() -> Vec<String> {
    (0..ACTIONS)
        .map(|i| {
            json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-chat:/bench","clientSeq":i + 1,
                "action":{"type":"chat/draftChanged","draft":{"text":format!("draft number {i} with some typical text"),"origin":{"kind":"user"}}}}})
            .to_string()
        })
        .collect()
}

/// Open a host, create a session and chat, push every frame through it, and return the time until all of
/// them are durable.
async fn fill_host(
    store: &Store,
    key: &HostKey,
    limits: Limits,
    providers: ProviderRegistry,
    frames: &[String],
) -> std::time::Duration {
    let host = Host::open(key.clone(), limits, providers, store.clone(), None, None)
        .await
        .expect("open");
    let conn = ConnectionId::next();
    let _bus = host.attach(
        conn,
        Identity {
            subject: "bench".into(),
            tenant: key.tenant.clone(),
            role: Role::Admin,
            hosts: None,
        },
    );
    for frame in [
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"bench"}}),
        json!({"jsonrpc":"2.0","id":2,"method":"createSession","params":{"channel":"ahp-session:/bench","provider":"demo"}}),
    ] {
        call(&host, conn, &frame.to_string()).await;
    }
    let started = Instant::now();
    for frame in frames {
        call(&host, conn, frame).await;
    }
    host.flush().await;
    started.elapsed()
}

async fn call(host: &Host, conn: ConnectionId, text: &str) -> String {
    let message = read_frame(text.as_bytes(), 64).expect("frame");
    host.call(conn, message)
        .await
        .frame
        .map(|f| String::from_utf8_lossy(&f).into_owned())
        .unwrap_or_default()
}
