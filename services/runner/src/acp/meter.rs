//! How much one session's agent may say: its updates are counted as they arrive, before anything keeps them.
//! During a turn the turn's budget applies: past it the turn is cut ([`OutputMeter::cut`] resolves) and
//! everything more is dropped. Between turns (and while a session loads) only a small allowance is kept, for
//! the settings and titles agents announce on their own; the rest is dropped. So however much an agent
//! prints, the runner holds a bounded amount of it.

use parking_lot::Mutex;
use tokio::sync::Notify;

/// Bytes of updates kept between turns.
pub const BETWEEN_TURNS_BYTES: u64 = 256 * 1024;

/// One session's output meter, shared by the ACP handler that receives updates and the turn that maps them.
pub struct OutputMeter {
    per_turn: u64,
    state: Mutex<Phase>,
    cut: Notify,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Between { used: u64 },
    Turn { used: u64 },
    Cut,
}

impl OutputMeter {
    pub fn new(per_turn: u64) -> Self {
        Self {
            per_turn,
            state: Mutex::new(Phase::Between { used: 0 }),
            cut: Notify::new(),
        }
    }

    /// The budget of one turn, in bytes.
    pub fn per_turn(&self) -> u64 {
        self.per_turn
    }

    /// A turn starts: its budget is whole.
    pub fn begin_turn(&self) {
        *self.state.lock() = Phase::Turn { used: 0 };
    }

    /// The turn ended (however): back to the small allowance between turns.
    pub fn end_turn(&self) {
        *self.state.lock() = Phase::Between { used: 0 };
    }

    /// Whether an update of `bytes` may be kept. The update that passes the turn's budget cuts the turn.
    pub fn admit(&self, bytes: u64) -> bool {
        let mut state = self.state.lock();
        match *state {
            Phase::Turn { used } if used.saturating_add(bytes) > self.per_turn => {
                *state = Phase::Cut;
                drop(state);
                self.cut.notify_one();
                false
            }
            Phase::Turn { used } => {
                *state = Phase::Turn { used: used + bytes };
                true
            }
            Phase::Between { used } if used.saturating_add(bytes) <= BETWEEN_TURNS_BYTES => {
                *state = Phase::Between { used: used + bytes };
                true
            }
            Phase::Between { .. } | Phase::Cut => false,
        }
    }

    /// Whether the current turn was cut.
    pub fn is_cut(&self) -> bool {
        *self.state.lock() == Phase::Cut
    }

    /// Resolves when the current turn is cut.
    pub async fn cut(&self) {
        loop {
            let notified = self.cut.notified();
            if *self.state.lock() == Phase::Cut {
                return;
            }
            notified.await;
        }
    }
}

/// The size of an update as it came (its JSON), for the meter.
pub fn update_bytes<T: serde::Serialize>(update: &T) -> u64 {
    serde_json::to_vec(update).map_or(u64::MAX, |bytes| bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_turn_keeps_its_budget_then_is_cut_and_keeps_nothing_more() {
        let meter = OutputMeter::new(100);
        meter.begin_turn();
        assert!(meter.admit(60));
        assert!(meter.admit(40));
        assert!(!meter.admit(1), "past the budget");
        tokio::time::timeout(std::time::Duration::from_secs(1), meter.cut())
            .await
            .expect("the turn was cut");
        assert!(meter.is_cut());
        assert!(!meter.admit(1), "nothing more while cut");
        meter.end_turn();
        assert!(
            meter.admit(BETWEEN_TURNS_BYTES),
            "between turns: a small allowance"
        );
        assert!(!meter.admit(1));
        meter.begin_turn();
        assert!(meter.admit(100), "a new turn has its whole budget");
    }
}
