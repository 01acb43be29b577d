//! The relay's Prometheus metrics: every metric's name, type and meaning, the recorder that holds them, and
//! the one-line helpers call sites record them with.
//!
//! Metrics go through the [`metrics`] facade into one process-wide Prometheus recorder ([`install`]), which
//! the relay's own HTTP endpoints render ([`render`]): the gateway's (and the embedded `serve`'s) `/metrics`,
//! and the shard's `/metrics` on `--http-listen`. There is no exporter listener of its own. Without
//! [`install`] (unit tests, benchmarks) every helper is a no-op and [`render`] returns nothing. Each process
//! exposes only what it records itself: in the split deployment scrape the gateways *and* the shards.
//!
//! | name | type | side | meaning |
//! |---|---|---|---|
//! | `ahp_relay_connections` | gauge | gateway | open client WebSocket connections |
//! | `ahp_relay_subscriptions` | gauge | gateway | channel subscriptions over all connections (their delivery filters) |
//! | `ahp_relay_fanout_latency_seconds` | histogram | gateway | bus event → its frame flushed to a client socket (see below) |
//! | `ahp_relay_fanout_lanes` | gauge | gateway | fan-out lanes running (a host's connections on one lane; a lane ends with its last connection) |
//! | `ahp_relay_fanout_handoffs_total` | counter | gateway | writes a lane left to a connection's task because its socket pushed back |
//! | `ahp_relay_gap_repairs_total` | counter | gateway | gaps in the Redis bus repaired from the shard with `FetchRange` |
//! | `ahp_relay_slow_consumer_closes_total` | counter | gateway | connections closed with 1013 because they fell behind |
//! | `ahp_relay_redirects_total` | counter | gateway | redirects to a host's owning shard the gateway followed |
//! | `ahp_relay_actions_total` | counter | shard | envelopes sequenced and committed (`rate()`: actions/s) |
//! | `ahp_relay_commit_batch_size` | histogram | shard | envelopes per store commit (group commit batch) |
//! | `ahp_relay_commit_seconds` | histogram | shard | latency of one batch's store commit, retries included |
//! | `ahp_relay_replays_total{source}` | counter | shard | `reconnect`s by how they were answered: `memory`, `store`, `snapshot` |
//! | `ahp_relay_lease_moves_total` | counter | shard | host leases this shard took over (a new fencing epoch) |
//! | `ahp_relay_hosts_open` | gauge | shard | hosts opened by this shard |
//! | `ahp_relay_sessions_loaded` | gauge | shard | sessions held in memory |
//! | `ahp_relay_chats_loaded` | gauge | shard | chats held in memory |
//! | `ahp_relay_pending_batch_bytes` | gauge | shard | bytes of sequenced actions queued for the next commit, over all hosts (the batch being committed is not counted; past 16 MiB a host's senders wait) |
//! | `ahp_relay_agent_runners` | gauge | shard | `ahp-relay runner` processes registered with this shard |
//! | `ahp_relay_resource_watches` | gauge | shard | resource watches open (`createResourceWatch`, released on unsubscribe or disconnect) |
//!
//! **Fan-out latency** starts when the event was stamped ([`crate::bus::BusEvent::published_at`]): in the
//! embedded relay that is the shard publishing it on the in-process bus, right after its batch committed;
//! behind gRPC or Redis it is the gateway receiving it (an `Instant` of another process means nothing here),
//! so there it measures the gateway's own share of the path. It ends when the frame was flushed to the
//! client's socket.
//!
//! The shard's memory gauges (`hosts_open`, `sessions_loaded`, `chats_loaded`) are set at scrape time with
//! [`set_loaded`] from the hosts themselves, so they never drift.

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// Open client WebSocket connections (gauge, gateway).
pub const CONNECTIONS: &str = "ahp_relay_connections";
/// Fan-out lanes running (gauge, gateway).
pub const FANOUT_LANES: &str = "ahp_relay_fanout_lanes";
/// Writes a lane handed to a connection's task because the socket pushed back (counter, gateway).
pub const FANOUT_HANDOFFS: &str = "ahp_relay_fanout_handoffs_total";
/// Channel subscriptions over all connections (gauge, gateway).
pub const SUBSCRIPTIONS: &str = "ahp_relay_subscriptions";
/// Bus event stamped → frame flushed to the client socket, in seconds (histogram, gateway).
pub const FANOUT_LATENCY_SECONDS: &str = "ahp_relay_fanout_latency_seconds";
/// Gaps in the Redis bus repaired from the shard (counter, gateway).
pub const GAP_REPAIRS_TOTAL: &str = "ahp_relay_gap_repairs_total";
/// Connections closed as slow consumers, close code 1013 (counter, gateway).
pub const SLOW_CONSUMER_CLOSES_TOTAL: &str = "ahp_relay_slow_consumer_closes_total";
/// Writes the store had no room for (counter, shard; see [`store_full`]).
pub const STORE_FULL_TOTAL: &str = "ahp_relay_store_full_total";
pub const CALL_TIMEOUTS_TOTAL: &str = "ahp_relay_call_timeouts_total";
/// Envelopes sequenced and committed (counter, shard).
pub const ACTIONS_TOTAL: &str = "ahp_relay_actions_total";
/// Envelopes per store commit (histogram, shard).
pub const COMMIT_BATCH_SIZE: &str = "ahp_relay_commit_batch_size";
/// Store commit latency in seconds, retries included (histogram, shard).
pub const COMMIT_SECONDS: &str = "ahp_relay_commit_seconds";
/// `reconnect`s by how they were answered, label `source` (counter, shard).
pub const REPLAYS_TOTAL: &str = "ahp_relay_replays_total";
/// Host leases taken over by this shard (counter, shard).
pub const LEASE_MOVES_TOTAL: &str = "ahp_relay_lease_moves_total";
/// Redirects to a host's owning shard this gateway followed (counter, gateway).
pub const REDIRECTS_TOTAL: &str = "ahp_relay_redirects_total";
/// Hosts opened by this shard (gauge, shard).
pub const HOSTS_OPEN: &str = "ahp_relay_hosts_open";
/// Sessions held in memory (gauge, shard).
pub const SESSIONS_LOADED: &str = "ahp_relay_sessions_loaded";
/// Chats held in memory (gauge, shard).
pub const CHATS_LOADED: &str = "ahp_relay_chats_loaded";
/// Bytes of sequenced actions queued for the next store commit, over all hosts (gauge, shard).
pub const PENDING_BATCH_BYTES: &str = "ahp_relay_pending_batch_bytes";
/// `ahp-relay runner` processes registered with this shard (gauge, shard).
pub const AGENT_RUNNERS: &str = "ahp_relay_agent_runners";
/// Resource watches open (gauge, shard).
pub const RESOURCE_WATCHES: &str = "ahp_relay_resource_watches";
/// Counter: JSON-RPC notifications the host refused (never answered, as JSON-RPC 2.0 requires).
pub const NOTIFICATIONS_REFUSED_TOTAL: &str = "ahp_relay_notifications_refused_total";

const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
const COMMIT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
];

/// How often histogram samples are folded into their buckets between scrapes (bounds their memory).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Which side's metrics a process records: they are described and start at zero, so a dashboard sees every
/// series of the process from its first scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Gateway,
    Shard,
}

/// Why the recorder could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot install the Prometheus recorder: {0}")]
    Install(#[from] BuildError),
    #[error("cannot start the metrics upkeep thread: {0}")]
    Upkeep(#[source] std::io::Error),
}

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
static INSTALLING: Mutex<()> = Mutex::new(());

/// Install the process-wide Prometheus recorder (once; later calls only register more sides) and start its
/// upkeep thread.
pub fn install(sides: &[Side]) -> Result<(), TelemetryError> {
    {
        let _installing = INSTALLING.lock().unwrap_or_else(PoisonError::into_inner);
        if HANDLE.get().is_none() {
            let handle = builder()?.install_recorder()?;
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || loop {
                    std::thread::sleep(UPKEEP_EVERY);
                    upkeep.run_upkeep();
                })
                .map_err(TelemetryError::Upkeep)?;
            let _ = HANDLE.set(handle);
        }
    }
    for side in sides {
        register(*side);
    }
    Ok(())
}

/// The recorder's configuration: real histograms (with buckets) for the three histograms.
fn builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(FANOUT_LATENCY_SECONDS.into()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(COMMIT_SECONDS.into()), COMMIT_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(COMMIT_BATCH_SIZE.into()), BATCH_BUCKETS)
}

/// Describe one side's metrics and start them at zero.
fn register(side: Side) {
    match side {
        Side::Gateway => {
            describe_gauge!(CONNECTIONS, Unit::Count, "Open client WebSocket connections.");
            describe_gauge!(
                SUBSCRIPTIONS,
                Unit::Count,
                "Channel subscriptions over all client connections."
            );
            describe_gauge!(
                FANOUT_LANES,
                Unit::Count,
                "Fan-out lanes running: tasks that write a host's batches into its connections' sockets."
            );
            describe_counter!(
                FANOUT_HANDOFFS,
                Unit::Count,
                "Writes a fan-out lane handed to the connection's own task because its socket pushed back."
            );
            describe_histogram!(
                FANOUT_LATENCY_SECONDS,
                Unit::Seconds,
                "Bus event published (embedded) or received by the gateway (gRPC/Redis) until its frame was \
                 flushed to a client socket."
            );
            describe_counter!(
                GAP_REPAIRS_TOTAL,
                Unit::Count,
                "Gaps in the Redis bus this gateway repaired from the shard."
            );
            describe_counter!(
                SLOW_CONSUMER_CLOSES_TOTAL,
                Unit::Count,
                "Client connections closed with 1013 because they fell behind."
            );
            describe_counter!(
                CALL_TIMEOUTS_TOTAL,
                Unit::Count,
                "Client calls answered with an error because their host did not answer within the call timeout."
            );
            describe_counter!(
                REDIRECTS_TOTAL,
                Unit::Count,
                "Redirects to a host's owning shard this gateway followed."
            );
            gauge!(CONNECTIONS).increment(0.0);
            gauge!(SUBSCRIPTIONS).increment(0.0);
            counter!(GAP_REPAIRS_TOTAL).increment(0);
            counter!(SLOW_CONSUMER_CLOSES_TOTAL).increment(0);
            counter!(CALL_TIMEOUTS_TOTAL).increment(0);
        }
        Side::Shard => {
            describe_counter!(ACTIONS_TOTAL, Unit::Count, "Envelopes sequenced and committed.");
            describe_counter!(
                STORE_FULL_TOTAL,
                Unit::Count,
                "Writes the store had no room for (disk full): batches and units refused (their senders are told), and tries to record those rejections, which wait for space."
            );
            counter!(STORE_FULL_TOTAL).increment(0);
            describe_histogram!(COMMIT_BATCH_SIZE, Unit::Count, "Envelopes per store commit.");
            describe_histogram!(
                COMMIT_SECONDS,
                Unit::Seconds,
                "Latency of one batch's store commit, retries included."
            );
            describe_counter!(
                REPLAYS_TOTAL,
                Unit::Count,
                "Reconnects by how they were answered (memory, store, snapshot)."
            );
            describe_counter!(
                LEASE_MOVES_TOTAL,
                Unit::Count,
                "Host leases this shard took over (a new fencing epoch)."
            );
            describe_gauge!(HOSTS_OPEN, Unit::Count, "Hosts opened by this shard.");
            describe_gauge!(SESSIONS_LOADED, Unit::Count, "Sessions held in memory.");
            describe_gauge!(CHATS_LOADED, Unit::Count, "Chats held in memory.");
            describe_gauge!(
                PENDING_BATCH_BYTES,
                Unit::Bytes,
                "Bytes of sequenced actions queued for the next store commit, over all hosts (not the batch being committed)."
            );
            describe_gauge!(
                AGENT_RUNNERS,
                Unit::Count,
                "Agent runner processes registered with this shard."
            );
            gauge!(AGENT_RUNNERS).set(0.0);
            describe_gauge!(RESOURCE_WATCHES, Unit::Count, "Resource watches open.");
            gauge!(RESOURCE_WATCHES).set(0.0);
            counter!(ACTIONS_TOTAL).increment(0);
            for source in [ReplaySource::Memory, ReplaySource::Store, ReplaySource::Snapshot] {
                counter!(REPLAYS_TOTAL, "source" => source.label()).increment(0);
            }
            counter!(LEASE_MOVES_TOTAL).increment(0);
            describe_counter!(
                NOTIFICATIONS_REFUSED_TOTAL,
                Unit::Count,
                "Notifications refused (unknown method, bad params, not initialized): logged, never answered."
            );
            counter!(NOTIFICATIONS_REFUSED_TOTAL).increment(0);
            set_loaded(Loaded::default());
        }
    }
}

/// The Prometheus text of everything this process recorded; empty when [`install`] was never called.
pub fn render() -> String {
    HANDLE.get().map(PrometheusHandle::render).unwrap_or_default()
}

/// Run `record` with a fresh recorder for this thread only and return its Prometheus text: lets tests see
/// what a piece of code records without the process-wide recorder.
pub fn capture(record: impl FnOnce()) -> Result<String, TelemetryError> {
    let recorder = builder()?.build_recorder();
    metrics::with_local_recorder(&recorder, record);
    Ok(recorder.handle().render())
}

// ---- gateway ------------------------------------------------------------------------------------------------

/// One open client connection, counted in `ahp_relay_connections` while this lives.
#[must_use = "the connection is counted only while this is held"]
pub struct OpenConnection(());

/// A client WebSocket connection was opened; it stays counted until the returned value is dropped.
pub fn connection_opened() -> OpenConnection {
    gauge!(CONNECTIONS).increment(1.0);
    OpenConnection(())
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        gauge!(CONNECTIONS).decrement(1.0);
    }
}

/// A running fan-out lane, counted in `ahp_relay_fanout_lanes` while this lives.
#[must_use = "the lane is counted only while this is held"]
pub struct RunningLane(());

/// A fan-out lane started; it stays counted until the returned value is dropped.
pub fn fanout_lane_started() -> RunningLane {
    gauge!(FANOUT_LANES).increment(1.0);
    RunningLane(())
}

impl Drop for RunningLane {
    fn drop(&mut self) {
        gauge!(FANOUT_LANES).decrement(1.0);
    }
}

/// A lane's write met a full socket and was handed to the connection's task.
pub fn fanout_handed_off() {
    counter!(FANOUT_HANDOFFS).increment(1);
}

/// A connection's delivery filter went from `before` to `after` subscriptions.
pub fn subscriptions_changed(before: usize, after: usize) {
    if after > before {
        gauge!(SUBSCRIPTIONS).increment((after - before) as f64);
    } else if before > after {
        gauge!(SUBSCRIPTIONS).decrement((before - after) as f64);
    }
}

/// The fan-out latency histogram, to keep (looked up once): a connection's writer records each frame it flushed
/// with [`FanoutLatency::delivered`], a fan-out lane a turn's frames with [`FanoutLatency::delivered_all`].
pub struct FanoutLatency(metrics::Histogram);

/// The handle a connection's writer or a fan-out lane records fan-out latencies on.
pub fn fanout_latency() -> FanoutLatency {
    FanoutLatency(histogram!(FANOUT_LATENCY_SECONDS))
}

impl FanoutLatency {
    /// A frame stamped at `published_at` was flushed to its client's socket at `flushed_at`.
    pub fn delivered(&self, published_at: Instant, flushed_at: Instant) {
        self.0.record(flushed_at.saturating_duration_since(published_at));
    }

    /// Frames flushed with these latencies (seconds), gathered by a fan-out lane during one turn: recorded in
    /// one run, so two lanes on two cores do not take the histogram's shared counters in turns frame by frame.
    pub fn delivered_all(&self, latencies: &mut Vec<f64>) {
        for latency in latencies.drain(..) {
            self.0.record(latency);
        }
    }
}

/// How many agent runners are registered with this shard now.
pub fn agent_runners(count: usize) {
    gauge!(AGENT_RUNNERS).set(count as f64);
}

/// One open resource watch, counted in `ahp_relay_resource_watches` while this lives.
#[must_use = "the watch is counted only while this is held"]
pub struct OpenWatch(());

/// A resource watch was opened; it stays counted until the returned value is dropped.
pub fn resource_watch_opened() -> OpenWatch {
    gauge!(RESOURCE_WATCHES).increment(1.0);
    OpenWatch(())
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        gauge!(RESOURCE_WATCHES).decrement(1.0);
    }
}

/// A gap in the Redis bus was repaired from the shard (the range brought events back).
pub fn gap_repaired() {
    counter!(GAP_REPAIRS_TOTAL).increment(1);
}

/// The gateway followed a redirect to the shard that owns a host.
pub fn redirect_followed() {
    counter!(REDIRECTS_TOTAL).increment(1);
}

/// A write found the store with no room for it: a batch (or one unit of it) refused, or an attempt to record the
/// rejections of refused changes, which waits for space and tries again.
pub fn store_full() {
    counter!(STORE_FULL_TOTAL).increment(1);
}

/// A connection was closed with 1013 because it fell behind.
pub fn slow_consumer_closed() {
    counter!(SLOW_CONSUMER_CLOSES_TOTAL).increment(1);
}

/// A client's call was answered with an error: its host did not answer within the call timeout.
pub fn call_timed_out() {
    counter!(CALL_TIMEOUTS_TOTAL).increment(1);
}

// ---- shard --------------------------------------------------------------------------------------------------

/// A notification was refused: JSON-RPC 2.0 forbids answering it, so it is only counted (and logged).
pub fn notification_refused() {
    counter!(NOTIFICATIONS_REFUSED_TOTAL).increment(1);
}

/// One group commit under way: started before its first attempt, finished once the store took it.
#[must_use = "call finish() once the batch is committed"]
pub struct CommitTimer {
    envelopes: usize,
    started: Instant,
}

impl CommitTimer {
    /// A batch numbering `envelopes` envelopes goes to the store now.
    pub fn start(envelopes: usize) -> Self {
        Self {
            envelopes,
            started: Instant::now(),
        }
    }

    /// The batch's envelope count (for spans and logs).
    pub fn envelopes(&self) -> usize {
        self.envelopes
    }

    /// The store committed the batch: count its envelopes and record the batch's size and latency.
    pub fn finish(self) {
        counter!(ACTIONS_TOTAL).increment(self.envelopes as u64);
        histogram!(COMMIT_BATCH_SIZE).record(self.envelopes as f64);
        histogram!(COMMIT_SECONDS).record(self.started.elapsed());
    }
}

/// How a `reconnect` was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaySource {
    /// Exact replay from the host's in-memory replay buffer (no store read).
    Memory,
    /// Exact replay from the store's action log.
    Store,
    /// Fresh snapshots (the gap could not be replayed exactly).
    Snapshot,
}

impl ReplaySource {
    /// The `source` label value.
    pub fn label(self) -> &'static str {
        match self {
            ReplaySource::Memory => "memory",
            ReplaySource::Store => "store",
            ReplaySource::Snapshot => "snapshot",
        }
    }
}

/// A `reconnect` was answered from `source`.
pub fn replayed(source: ReplaySource) {
    counter!(REPLAYS_TOTAL, "source" => source.label()).increment(1);
}

/// This shard took a host's lease over from another owner, or after it was released or expired — a new
/// fencing epoch. Call it on every acquisition that changed the epoch, never on renewals or on re-acquiring a
/// lease this shard already held: `rate(ahp_relay_lease_moves_total)` over all shards is the rate at which
/// hosts move between shards.
pub fn lease_acquired() {
    counter!(LEASE_MOVES_TOTAL).increment(1);
}

/// What a shard holds in memory, reported at scrape time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Loaded {
    pub hosts: usize,
    pub sessions: usize,
    pub chats: usize,
    /// Bytes of the hosts' pending batches (sequenced, not yet committed).
    pub pending_batch_bytes: usize,
}

/// Set the shard's memory gauges (`hosts_open`, `sessions_loaded`, `chats_loaded`, `pending_batch_bytes`).
pub fn set_loaded(loaded: Loaded) {
    gauge!(HOSTS_OPEN).set(loaded.hosts as f64);
    gauge!(SESSIONS_LOADED).set(loaded.sessions as f64);
    gauge!(CHATS_LOADED).set(loaded.chats as f64);
    gauge!(PENDING_BATCH_BYTES).set(loaded.pending_batch_bytes as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{series} ")))
            .and_then(|v| v.trim().parse().ok())
    }

    #[test]
    fn helpers_record_under_the_documented_names() {
        let mut still_open = None;
        let text = capture(|| {
            let open = connection_opened();
            still_open = Some(connection_opened());
            drop(open);
            subscriptions_changed(0, 3);
            subscriptions_changed(3, 1);
            gap_repaired();
            slow_consumer_closed();
            let timer = CommitTimer::start(7);
            timer.finish();
            replayed(ReplaySource::Memory);
            replayed(ReplaySource::Memory);
            replayed(ReplaySource::Snapshot);
            lease_acquired();
            set_loaded(Loaded {
                hosts: 1,
                sessions: 2,
                chats: 3,
                pending_batch_bytes: 4096,
            });
            let now = Instant::now();
            fanout_latency().delivered(now, now);
        })
        .expect("recorder");
        assert!(still_open.is_some());
        assert_eq!(value(&text, CONNECTIONS), Some(1.0), "{text}");
        assert_eq!(value(&text, SUBSCRIPTIONS), Some(1.0), "{text}");
        assert_eq!(value(&text, GAP_REPAIRS_TOTAL), Some(1.0));
        assert_eq!(value(&text, SLOW_CONSUMER_CLOSES_TOTAL), Some(1.0));
        assert_eq!(value(&text, ACTIONS_TOTAL), Some(7.0));
        assert_eq!(
            value(&text, r#"ahp_relay_replays_total{source="memory"}"#),
            Some(2.0)
        );
        assert_eq!(
            value(&text, r#"ahp_relay_replays_total{source="snapshot"}"#),
            Some(1.0)
        );
        assert_eq!(value(&text, LEASE_MOVES_TOTAL), Some(1.0));
        assert_eq!(value(&text, SESSIONS_LOADED), Some(2.0));
        assert_eq!(value(&text, PENDING_BATCH_BYTES), Some(4096.0));
        // Histograms are real Prometheus histograms (buckets), not summaries.
        assert_eq!(
            value(&text, "ahp_relay_commit_batch_size_count"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(value(&text, "ahp_relay_commit_batch_size_sum"), Some(7.0));
        assert_eq!(
            value(&text, r#"ahp_relay_commit_batch_size_bucket{le="8"}"#),
            Some(1.0)
        );
        assert_eq!(
            value(&text, r#"ahp_relay_commit_batch_size_bucket{le="4"}"#),
            Some(0.0)
        );
        assert_eq!(value(&text, "ahp_relay_commit_seconds_count"), Some(1.0));
        assert_eq!(value(&text, "ahp_relay_fanout_latency_seconds_count"), Some(1.0));
    }

    #[test]
    fn nothing_is_rendered_without_a_recorder() {
        // No test in this crate installs the process-wide recorder.
        assert_eq!(render(), "");
        drop(connection_opened());
    }
}
