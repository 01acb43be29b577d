//! The gateway's one clock for all its connections: a single timer wheel (`tokio_util`'s `DelayQueue`, driven
//! by one task) holding every connection's next ping and its token's expiry, and the relay's shutdown.
//!
//! A connection keeps a small signal ([`ConnectionAlarm`]) instead of two timers and a shutdown future of its
//! own: the clock sets the signal's flags and wakes the connection's task only when something is due. An idle
//! connection is then smaller (no timer entries or boxed futures of its own), and a connection woken to write
//! a batch no longer polls three clocks on every wake.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use slab::Slab;
use tokio::time::Instant;
use tokio_util::time::delay_queue::{Expired, Key};
use tokio_util::time::DelayQueue;

/// What the clock says to a connection, in the order it is told: shutdown and expiry end the connection,
/// a ping is due every ping interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alarm {
    /// The relay is shutting down (or its shutdown signal is gone).
    Shutdown,
    /// The connection's token expired.
    TokenExpired,
    /// Time to ping (and to check that the peer was heard from within the idle timeout).
    Ping,
}

const SHUTDOWN: u8 = 1;
const TOKEN_EXPIRED: u8 = 2;
const PING: u8 = 4;

/// The farthest a deadline is put on the wheel (its range is about two years): a later expiry is
/// re-armed when this comes.
const FARTHEST: Duration = Duration::from_secs(365 * 24 * 3600);

/// The clock of one gateway (one per process's client listener). Cheap to clone.
#[derive(Clone)]
pub struct ConnectionClock {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<ClockState>,
    ping_every: Duration,
}

struct ClockState {
    wheel: DelayQueue<Due>,
    connections: Slab<Clocked>,
    shutting_down: bool,
}

/// A deadline on the wheel: whose, and what.
#[derive(Clone, Copy)]
enum Due {
    Ping(usize),
    TokenExpiry(usize),
}

/// One connection's entry: its signal and its deadlines' keys on the wheel.
struct Clocked {
    signal: Arc<Signal>,
    ping: Key,
    expiry: Option<Key>,
    expires_at: Instant,
}

/// Flags the clock sets and the connection's task reads, and the task's waker.
#[derive(Default)]
struct Signal {
    flags: AtomicU8,
    waker: AtomicWaker,
}

impl Signal {
    fn raise(&self, flag: u8) {
        self.flags.fetch_or(flag, Ordering::AcqRel);
        self.waker.wake();
    }
}

impl ConnectionClock {
    /// Start the clock's task (on the current runtime): it pings every `ping_every`, expires tokens, and
    /// tells every connection when `shutdown` turns true or its sender is dropped.
    pub fn start(ping_every: Duration, mut shutdown: tokio::sync::watch::Receiver<bool>) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(ClockState {
                wheel: DelayQueue::new(),
                connections: Slab::new(),
                shutting_down: *shutdown.borrow_and_update(),
            }),
            ping_every,
        });
        let driven = shared.clone();
        tokio::spawn(async move {
            if driven.state.lock().shutting_down {
                return;
            }
            tokio::select! {
                _ = shutdown.wait_for(|down| *down) => {}
                () = std::future::poll_fn(|cx| driven.drive(cx)) => {}
            }
            let mut state = driven.state.lock();
            state.shutting_down = true;
            for (_, clocked) in state.connections.iter() {
                clocked.signal.raise(SHUTDOWN);
            }
        });
        Self { shared }
    }

    /// Put a connection on the clock: its first ping one interval from now, its token's expiry at
    /// `token_expires_at`. It leaves the clock when the returned alarm is dropped.
    pub fn register(&self, token_expires_at: SystemTime) -> ConnectionAlarm {
        let now = Instant::now();
        let expires_at = now
            + token_expires_at
                .duration_since(SystemTime::now())
                .unwrap_or_default();
        let signal = Arc::new(Signal::default());
        let mut state = self.shared.state.lock();
        if state.shutting_down {
            // Told at once, and put on no wheel (nobody drives it any more).
            signal.flags.fetch_or(SHUTDOWN, Ordering::AcqRel);
            return ConnectionAlarm {
                shared: self.shared.clone(),
                slot: None,
                signal,
            };
        }
        let slot = state.connections.vacant_key();
        let ping = state
            .wheel
            .insert_at(Due::Ping(slot), now + self.shared.ping_every);
        let expiry = state
            .wheel
            .insert_at(Due::TokenExpiry(slot), expires_at.min(now + FARTHEST));
        state.connections.insert(Clocked {
            signal: signal.clone(),
            ping,
            expiry: Some(expiry),
            expires_at,
        });
        ConnectionAlarm {
            shared: self.shared.clone(),
            slot: Some(slot),
            signal,
        }
    }
}

impl Shared {
    /// Take every deadline that came and tell its connection; never completes (the wheel's waker is this
    /// task's, so a new, earlier deadline wakes it too).
    fn drive(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.state.lock();
        while let Poll::Ready(Some(expired)) = state.wheel.poll_expired(cx) {
            state.fire(expired, self.ping_every);
        }
        Poll::Pending
    }
}

impl ClockState {
    fn fire(&mut self, expired: Expired<Due>, ping_every: Duration) {
        let now = Instant::now();
        match expired.into_inner() {
            Due::Ping(slot) => {
                if self.connections.contains(slot) {
                    let next = self.wheel.insert_at(Due::Ping(slot), now + ping_every);
                    if let Some(clocked) = self.connections.get_mut(slot) {
                        clocked.ping = next;
                        clocked.signal.raise(PING);
                    }
                }
            }
            Due::TokenExpiry(slot) => {
                let Some(expires_at) = self.connections.get(slot).map(|c| c.expires_at) else {
                    return;
                };
                if expires_at > now {
                    // Beyond the wheel's range at registration: armed again for the rest.
                    let key = self
                        .wheel
                        .insert_at(Due::TokenExpiry(slot), expires_at.min(now + FARTHEST));
                    if let Some(clocked) = self.connections.get_mut(slot) {
                        clocked.expiry = Some(key);
                    }
                } else if let Some(clocked) = self.connections.get_mut(slot) {
                    clocked.expiry = None;
                    clocked.signal.raise(TOKEN_EXPIRED);
                }
            }
        }
    }
}

/// A connection's place on the clock: what is due for it. Dropping it takes the connection off the clock.
pub struct ConnectionAlarm {
    shared: Arc<Shared>,
    /// Its entry, unless it came after shutdown.
    slot: Option<usize>,
    signal: Arc<Signal>,
}

impl ConnectionAlarm {
    /// The next alarm: shutdown and expiry stay raised once raised; a ping is taken (raised again at the next
    /// interval).
    pub fn poll_alarm(&self, cx: &mut Context<'_>) -> Poll<Alarm> {
        self.signal.waker.register(cx.waker());
        let flags = self.signal.flags.load(Ordering::Acquire);
        if flags & SHUTDOWN != 0 {
            Poll::Ready(Alarm::Shutdown)
        } else if flags & TOKEN_EXPIRED != 0 {
            Poll::Ready(Alarm::TokenExpired)
        } else if flags & PING != 0 {
            self.signal.flags.fetch_and(!PING, Ordering::AcqRel);
            Poll::Ready(Alarm::Ping)
        } else {
            Poll::Pending
        }
    }

    /// Completes with the next alarm. Cancel-safe: an alarm is taken only when returned.
    pub async fn next(&self) -> Alarm {
        std::future::poll_fn(|cx| self.poll_alarm(cx)).await
    }
}

impl Drop for ConnectionAlarm {
    fn drop(&mut self) {
        let Some(slot) = self.slot else {
            return;
        };
        let mut state = self.shared.state.lock();
        if let Some(clocked) = state.connections.try_remove(slot) {
            state.wheel.try_remove(&clocked.ping);
            if let Some(expiry) = clocked.expiry {
                state.wheel.try_remove(&expiry);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_secs(secs: u64) -> SystemTime {
        SystemTime::now() + Duration::from_secs(secs)
    }

    #[tokio::test(start_paused = true)]
    async fn pings_come_every_interval_to_each_connection() {
        let (_tx, shutdown) = tokio::sync::watch::channel(false);
        let clock = ConnectionClock::start(Duration::from_secs(20), shutdown);
        let first = clock.register(in_secs(3600));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let second = clock.register(in_secs(3600));
        let started = Instant::now();
        assert_eq!(first.next().await, Alarm::Ping);
        assert_eq!(started.elapsed(), Duration::from_secs(15));
        assert_eq!(second.next().await, Alarm::Ping);
        assert_eq!(started.elapsed(), Duration::from_secs(20));
        assert_eq!(first.next().await, Alarm::Ping);
        assert_eq!(started.elapsed(), Duration::from_secs(35));
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_expires_on_time_and_stays_expired() {
        let (_tx, shutdown) = tokio::sync::watch::channel(false);
        let clock = ConnectionClock::start(Duration::from_secs(3600), shutdown);
        let started = Instant::now();
        let alarm = clock.register(in_secs(2));
        assert_eq!(alarm.next().await, Alarm::TokenExpired);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(1900) && took <= Duration::from_millis(2100),
            "{took:?}"
        );
        assert_eq!(alarm.next().await, Alarm::TokenExpired);
        let expired = clock.register(SystemTime::now() - Duration::from_secs(1));
        assert_eq!(expired.next().await, Alarm::TokenExpired);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_reaches_every_connection_and_those_that_come_after() {
        let (tx, shutdown) = tokio::sync::watch::channel(false);
        let clock = ConnectionClock::start(Duration::from_secs(3600), shutdown);
        let alarms: Vec<_> = (0..3).map(|_| clock.register(in_secs(3600))).collect();
        tx.send(true).expect("send");
        for alarm in &alarms {
            assert_eq!(alarm.next().await, Alarm::Shutdown);
        }
        // The clock's task has seen it (every alarm did): a connection opened now is told at once.
        assert_eq!(clock.register(in_secs(3600)).next().await, Alarm::Shutdown);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_shutdown_signal_is_a_shutdown() {
        let (tx, shutdown) = tokio::sync::watch::channel(false);
        let clock = ConnectionClock::start(Duration::from_secs(3600), shutdown);
        let alarm = clock.register(in_secs(3600));
        drop(tx);
        assert_eq!(alarm.next().await, Alarm::Shutdown);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_leaves_takes_its_deadlines_off_the_wheel() {
        let (_tx, shutdown) = tokio::sync::watch::channel(false);
        let clock = ConnectionClock::start(Duration::from_secs(20), shutdown);
        let gone = clock.register(in_secs(3600));
        let kept = clock.register(in_secs(3600));
        assert_eq!(clock.shared.state.lock().wheel.len(), 4);
        drop(gone);
        assert_eq!(clock.shared.state.lock().wheel.len(), 2);
        assert_eq!(clock.shared.state.lock().connections.len(), 1);
        // The slot is reused without the old deadlines firing for the new connection.
        let reused = clock.register(in_secs(3600));
        assert_eq!(kept.next().await, Alarm::Ping);
        assert_eq!(reused.next().await, Alarm::Ping);
        assert_eq!(clock.shared.state.lock().wheel.len(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn an_expiry_beyond_the_wheels_range_is_armed_again() {
        let (_tx, shutdown) = tokio::sync::watch::channel(false);
        let clock = ConnectionClock::start(Duration::from_secs(30 * 24 * 3600), shutdown);
        let alarm = clock.register(in_secs(3 * 365 * 24 * 3600));
        // Only pings come in the first year; the expiry comes after three.
        let started = Instant::now();
        tokio::time::sleep(FARTHEST + Duration::from_secs(1)).await;
        assert_eq!(alarm.next().await, Alarm::Ping);
        assert_eq!(alarm.next().await, Alarm::Ping);
        while alarm.next().await == Alarm::Ping {}
        assert!(started.elapsed() >= Duration::from_secs(3 * 365 * 24 * 3600 - 1));
        assert_eq!(alarm.next().await, Alarm::TokenExpired);
    }
}
