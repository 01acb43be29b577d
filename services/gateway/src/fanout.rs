//! Where a host's batches are written: a few fan-out lanes per host (one per worker thread), each a task that
//! waits on the host's bus once and, when it rings, has every member connection of the lane read its bus and
//! write what it admits straight into its socket ([`crate::member`]).
//!
//! This is nchan's write path on tokio: a batch costs, per lane, one wake; per connection, one bus read, one
//! filter pass and one write into its socket — no wake of the connection's task unless its socket is full.
//! A host's connections are spread over its lanes, so a busy host's writes run on every core. A lane ends
//! when its last member leaves, and so lets go of the host's bus. A lane that finds batches waiting when a
//! turn ends rests briefly before the next, so that one writes them together ([`rest_after`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use relay_core::bus::BusReceiver;
use relay_core::telemetry::FanoutLatency;
use relay_core::{ConnectionId, HostKey};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::member::Member;

/// The gateway's lanes, by host. Cheap to clone.
#[derive(Clone)]
pub struct Fanout {
    shared: Arc<Shared>,
}

struct Shared {
    lanes_per_host: usize,
    /// Numbers the lanes started, so a ticket counts only in its own lane (not in one started after it).
    started: std::sync::atomic::AtomicU64,
    hosts: Mutex<HashMap<HostKey, HostLanes>>,
}

/// One host's lanes, and its key shared with every ticket (a pointer each, not a copy of the key's strings).
struct HostLanes {
    key: Arc<HostKey>,
    lanes: Vec<Option<LaneHandle>>,
}

/// What a lane is told besides its bus.
enum LaneNews {
    Joined(Arc<Member>),
    /// A member's connection ended (its place is freed at the lane's next prune).
    Left,
}

/// A running lane: where members join it, and how many it has.
struct LaneHandle {
    joins: mpsc::UnboundedSender<LaneNews>,
    members: usize,
    generation: u64,
}

impl Default for Fanout {
    /// One lane per host per worker thread (the available parallelism, at most 8).
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_lanes(cores.clamp(1, 8))
    }
}

impl Fanout {
    /// `lanes` lanes per host.
    pub fn with_lanes(lanes: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                lanes_per_host: lanes.max(1),
                started: std::sync::atomic::AtomicU64::new(0),
                hosts: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Put `member` (connection `id` of `host`) on one of the host's lanes, starting it if needed. The
    /// member is rung at once (for what its bus brought since it was attached) and at every batch after;
    /// it leaves the lane's count when the returned ticket is dropped, and the lane itself at its next turn
    /// after [`Member::leave`].
    pub(crate) fn join(&self, host: &HostKey, id: ConnectionId, member: Arc<Member>) -> LaneTicket {
        let member_kept = member.clone();
        let lane = (id.0 % self.shared.lanes_per_host as u64) as usize;
        let mut hosts = self.shared.hosts.lock();
        let entry = hosts.entry(host.clone()).or_insert_with(|| HostLanes {
            key: Arc::new(host.clone()),
            lanes: (0..self.shared.lanes_per_host).map(|_| None).collect(),
        });
        let key = entry.key.clone();
        let lanes = &mut entry.lanes;
        // A running lane ends only once its handle is dropped (by a ticket, with the registry's lock held); one
        // that failed has closed its channel (even between a check and a send), and is replaced.
        let joined = lanes[lane].as_mut().and_then(|handle| {
            handle.joins.send(LaneNews::Joined(member.clone())).ok()?;
            handle.members += 1;
            Some(handle.generation)
        });
        let generation = match joined {
            Some(generation) => generation,
            None => {
                let (joins, joined) = mpsc::unbounded_channel();
                let _ = joins.send(LaneNews::Joined(member));
                tokio::spawn(run_lane(joined));
                let generation = self
                    .shared
                    .started
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                lanes[lane] = Some(LaneHandle {
                    joins,
                    members: 1,
                    generation,
                });
                generation
            }
        };
        LaneTicket {
            member: member_kept,
            shared: self.shared.clone(),
            host: key,
            lane,
            generation,
        }
    }

    /// Lanes running now, over all hosts.
    pub fn lanes(&self) -> usize {
        self.shared
            .hosts
            .lock()
            .values()
            .flat_map(|host| host.lanes.iter().flatten())
            .count()
    }
}

/// A connection's place in a lane's count: dropping it takes the connection off the lane (even when its task
/// ends without closing, e.g. by a panic) and lets the lane end with its last member.
pub(crate) struct LaneTicket {
    member: Arc<Member>,
    shared: Arc<Shared>,
    host: Arc<HostKey>,
    lane: usize,
    generation: u64,
}

impl Drop for LaneTicket {
    fn drop(&mut self) {
        drop(self.member.leave());
        let mut hosts = self.shared.hosts.lock();
        let Some(HostLanes { lanes, .. }) = hosts.get_mut(&*self.host) else {
            return;
        };
        if let Some(handle) = lanes[self.lane]
            .as_mut()
            .filter(|handle| handle.generation == self.generation)
        {
            handle.members = handle.members.saturating_sub(1);
            if handle.members == 0 {
                // Its join channel closes: the lane ends and drops its doorbells.
                lanes[self.lane] = None;
            } else {
                let _ = handle.joins.send(LaneNews::Left);
            }
        }
        if lanes.iter().all(Option::is_none) {
            hosts.remove(&*self.host);
        }
    }
}

/// Members that read one bus, and the lane's own reader of it, which only says when to ring them.
struct Ring {
    doorbell: BusReceiver,
    members: Vec<Arc<Member>>,
}

/// Fan-out latencies a lane gathers before it records them (the bound of its buffer, give or take one
/// member's frames).
const LATENCIES_KEPT: usize = 4096;

/// The longest a lane that is behind rests between turns (see [`rest_after`]).
const REST_AT_MOST: Duration = Duration::from_millis(10);

/// How long a lane rests before its next turn. Only a lane that is behind rests: batches arrived while its turn
/// wrote (`waiting`). It rests as long as the turn `took` (wall time: the longer the turn, the more batches
/// wait), at most [`REST_AT_MOST`]. Meanwhile more batches arrive, and the next turn writes them to each socket at
/// once: fewer writes, packets and client wake-ups per frame when the host is busiest — at 2,000 subscribers ×
/// 200 actions/s a quarter less CPU, and lower latency, since the clients get more of the cores
/// (`docs/benchmarks.md`). A lane that keeps up — nothing waiting when its turn ends — never rests, so a lone
/// batch goes out at once; nor does one whose doorbell lagged or whose bus ended (`batches`, what the doorbell
/// counted, unknown), whose backlog is long already. A resting lane still writes at least half the time. A batch
/// that lands during a turn of a busy lane may wait for the rest too (at most as long as that turn); so does a
/// call's reply that waits for its own action's echo.
fn rest_after(batches: Option<usize>, took: Duration, waiting: bool) -> Option<Duration> {
    (waiting && batches.is_some()).then(|| took.min(REST_AT_MOST))
}

/// Until `until`, or never.
async fn rest(until: Option<Instant>) {
    match until {
        Some(until) => tokio::time::sleep_until(until).await,
        None => std::future::pending().await,
    }
}

/// A lane: takes joining members and rings its members whenever their bus has something.
async fn run_lane(news: mpsc::UnboundedReceiver<LaneNews>) {
    let _running = relay_core::telemetry::fanout_lane_started();
    let latency = relay_core::telemetry::fanout_latency();
    // Almost always one ring: a second appears only while a restarted host's new bus replaces the old one.
    let mut lane = Lane {
        news,
        rings: Vec::new(),
    };
    let Lane { news, rings } = &mut lane;
    let mut departed = 0usize;
    let mut rest_until: Option<Instant> = None;
    loop {
        let rang = tokio::select! {
            biased;
            told = news.recv() => {
                match told {
                    None => return,
                    Some(LaneNews::Joined(member)) => join_ring(rings, member, &latency),
                    Some(LaneNews::Left) => {
                        // A quiet host's departed members are pruned here rather than at its next batch: once
                        // they are a quarter of the lane, in one pass.
                        departed += 1;
                        let members: usize = rings.iter().map(|ring| ring.members.len()).sum();
                        if departed * 4 >= members.max(64) {
                            departed = 0;
                            for ring in rings.iter_mut() {
                                ring.members.retain(|member| !member.is_gone());
                            }
                            rings.retain(|ring| !ring.members.is_empty());
                        }
                    }
                }
                continue;
            }
            // A resting lane still takes news (joins, departures, its own end); its doorbells wait.
            () = rest(rest_until), if rest_until.is_some() => {
                rest_until = None;
                continue;
            }
            rang = doorbells(rings), if rest_until.is_none() => rang,
        };
        let (index, outcome) = rang;
        let Some(ring) = rings.get_mut(index) else {
            continue;
        };
        let turn_started = Instant::now();
        // Batches that rang meanwhile are read by the members now: one turn for all of them.
        // The members read as many batches as the doorbell counted (each member's bus has them too); when
        // the doorbell lagged or the bus ended, they read theirs dry.
        let mut closed = matches!(outcome, Err(RecvError::Closed));
        let mut counted = outcome.is_ok().then_some(1usize);
        loop {
            match ring.doorbell.try_recv() {
                Ok(_) => counted = counted.map(|n| n + 1),
                Err(TryRecvError::Lagged(_)) => counted = None,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Closed) => {
                    closed = true;
                    counted = None;
                    break;
                }
            }
        }
        ring_all(&mut ring.members, counted, &latency).await;
        rest_until = rest_after(counted, turn_started.elapsed(), !ring.doorbell.is_empty())
            .map(|rest| Instant::now() + rest);
        if closed || ring.members.is_empty() {
            // Every member has read the bus's end (and is closing), or has gone; the rest was for this ring.
            rings.swap_remove(index);
            rest_until = None;
        }
    }
}

/// A lane's members, and those still on their way to it. Should the lane's task die (a panic while ringing:
/// tokio drops the task's future after catching it), the members still on it or still to join are told to
/// close with 1012: nothing else would write their batches, and pongs alone would keep them open. A lane that
/// ends normally has no members left.
struct Lane {
    news: mpsc::UnboundedReceiver<LaneNews>,
    rings: Vec<Ring>,
}

impl Drop for Lane {
    fn drop(&mut self) {
        self.news.close();
        let mut joining = Vec::new();
        while let Ok(news) = self.news.try_recv() {
            if let LaneNews::Joined(member) = news {
                joining.push(member);
            }
        }
        let abandoned = self
            .rings
            .iter()
            .flat_map(|ring| &ring.members)
            .chain(&joining)
            .filter(|member| member.abandon())
            .count();
        if abandoned > 0 {
            // At a runtime's shutdown too, when the connections are closing anyway.
            tracing::warn!(
                abandoned,
                "a fan-out lane ended with connections on it; they close with 1012"
            );
        }
    }
}

/// Put `member` in the ring of its bus (a new ring if it reads another bus), and ring it at once.
fn join_ring(rings: &mut Vec<Ring>, member: Arc<Member>, latency: &FanoutLatency) {
    let found = rings
        .iter()
        .position(|ring| member.reads_same_bus(&ring.doorbell) == Some(true));
    let index = match found {
        Some(index) => index,
        None => {
            let Some(doorbell) = member.doorbell() else {
                return;
            };
            rings.push(Ring {
                doorbell,
                members: Vec::new(),
            });
            rings.len() - 1
        }
    };
    let mut latencies = Vec::new();
    if member.ring(None, &mut latencies) {
        rings[index].members.push(member);
    }
    latency.delivered_all(&mut latencies);
}

/// The first ring whose bus has something (or ended).
async fn doorbells(rings: &mut [Ring]) -> (usize, Result<(), RecvError>) {
    if rings.is_empty() {
        return std::future::pending().await;
    }
    let waits = rings
        .iter_mut()
        .map(|ring| Box::pin(async move { ring.doorbell.recv().await.map(drop) }));
    let (outcome, index, _) = futures_util::future::select_all(waits).await;
    (index, outcome)
}

/// Ring every member in turn, dropping those that left. The fan-out latencies of what the members write are
/// recorded together at the end of the turn (or once [`LATENCIES_KEPT`] are gathered): the lanes run on
/// different cores, and recording frame by frame would have them take the histogram's shared counters in turns.
///
/// Other tasks of the thread run whenever the lane has used its cooperative budget: a socket write spends one
/// unit, and a write past the budget would come back `Pending` as if the socket were full (and be handed to the
/// connection's task for nothing).
async fn ring_all(members: &mut Vec<Arc<Member>>, batches: Option<usize>, latency: &FanoutLatency) {
    let mut latencies = Vec::new();
    let mut index = 0;
    while index < members.len() {
        if !tokio::task::coop::has_budget_remaining() {
            tokio::task::yield_now().await;
        }
        if members[index].ring(batches, &mut latencies) {
            index += 1;
        } else {
            members.swap_remove(index);
        }
        if latencies.len() >= LATENCIES_KEPT {
            latency.delivered_all(&mut latencies);
        }
    }
    latency.delivered_all(&mut latencies);
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::time::Duration;

    use axum::extract::ws::WebSocketUpgrade;
    use bytes::Bytes;
    use futures_util::StreamExt;
    use relay_core::bus::{Audience, BusBatch, BusEvent, BusEventKind, BusSender};
    use relay_core::Limits;
    use tokio_tungstenite::tungstenite::Message;

    use super::*;
    use crate::closes::close_code;
    use crate::filter::SubscriptionFilter;
    use crate::member::Next;
    use crate::outbox::Outbox;

    /// A real WebSocket on loopback: the server's side becomes a [`Member`] reading `bus`; the client's side
    /// is returned with it.
    async fn member_on_loopback(
        bus: &BusSender,
    ) -> (
        Arc<Member>,
        tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    ) {
        let (accepted, member) = tokio::sync::oneshot::channel();
        let accepted = Arc::new(Mutex::new(Some(accepted)));
        let reader = Arc::new(Mutex::new(Some(bus.subscribe())));
        let app = axum::Router::new().route(
            "/",
            axum::routing::get(move |upgrade: WebSocketUpgrade| async move {
                upgrade.on_upgrade(move |socket| async move {
                    let (Some(accepted), Some(bus)) = (accepted.lock().take(), reader.lock().take()) else {
                        return;
                    };
                    let mut filter = SubscriptionFilter::new(ConnectionId(1));
                    filter.enable_notifications();
                    let outbox = Outbox::new(socket, &Limits::default());
                    let _ = accepted.send(Member::new(filter, bus, 1 << 20, outbox));
                })
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        let (client, _) = tokio_tungstenite::connect_async(format!("ws://{address}/"))
            .await
            .expect("connect");
        (member.await.expect("accepted"), client)
    }

    fn batch(seq: u64) -> BusBatch {
        Arc::from(vec![Arc::new(BusEvent {
            kind: BusEventKind::Action,
            channel: "root".into(),
            seq,
            prev_seq: seq - 1,
            audience: Audience::Everyone,
            frame: Bytes::from(format!("{{\"seq\":{seq}}}")),
            published_at: None,
        })])
    }

    /// A lane that keeps up (nothing waiting after its turn) never rests, so a lone batch goes out at once;
    /// nor does one whose doorbell lagged or whose bus ended. One that finds batches waiting rests as long as
    /// its turn took, at most `REST_AT_MOST`, so it still writes at least half the time.
    #[test]
    fn only_a_saturated_lane_rests_and_never_longer_than_its_turn_or_the_bound() {
        let took = Duration::from_millis(3);
        assert_eq!(rest_after(Some(3), took, false), None, "kept up");
        assert_eq!(rest_after(None, took, true), None, "lagged or ended");
        assert_eq!(rest_after(Some(1), took, true), Some(took));
        assert_eq!(
            rest_after(Some(2), Duration::from_secs(1), true),
            Some(REST_AT_MOST)
        );
    }

    /// A lane writes the bus's batches straight into its members' sockets; when the lane dies with members on
    /// it (or on their way to it), they are told to close with 1012 rather than left open with nothing writing
    /// to them. (One thread: the test decides what the lane has read when it dies.)
    #[tokio::test(flavor = "current_thread")]
    async fn a_lane_that_dies_closes_its_connections_with_1012() {
        let bus = BusSender::new(16, 1 << 20);
        let (member, mut client) = member_on_loopback(&bus).await;
        let (joining, _joining_client) = member_on_loopback(&bus).await;
        let (joins, joined) = mpsc::unbounded_channel();
        joins.send(LaneNews::Joined(member.clone())).expect("join");
        let lane = tokio::spawn(run_lane(joined));

        // The lane rings the member: the batch reaches the client without the connection's task.
        assert!(bus.send(batch(1)).is_ok());
        let first = tokio::time::timeout(Duration::from_secs(10), client.next())
            .await
            .expect("the lane wrote the batch")
            .expect("a frame")
            .expect("a frame");
        assert_eq!(first, Message::text("{\"seq\":1}"));

        // A second member's join is queued, and the lane dies before it reads it (its future dropped, as
        // tokio does after catching a panic): nothing runs the lane between these two lines.
        joins.send(LaneNews::Joined(joining.clone())).expect("join");
        lane.abort();
        assert!(lane.await.is_err_and(|error| error.is_cancelled()));
        for member in [member, joining] {
            let next = tokio::time::timeout(Duration::from_secs(10), poll_fn(|cx| member.poll_next(cx)))
                .await
                .expect("the connection's task is told at once");
            match next {
                Next::Close((code, _)) => assert_eq!(code, close_code::RESTARTING),
                Next::Inbound(frame) => panic!("expected a close, read {frame:?}"),
            }
        }
    }
}
