//! The units of work the store refused for good (see [`crate::host::salvage`]), remembered with why until the
//! request waiting on each asks.

use std::collections::{HashMap, VecDeque};

use crate::host::sequencer::UnitId;

/// Failed units a request may still be waiting on, with why (the newest few hundred).
#[derive(Default)]
pub struct FailedUnits {
    reasons: HashMap<UnitId, String>,
    order: VecDeque<UnitId>,
}

/// Failed units remembered for their waiting requests.
const REMEMBERED: usize = 1024;

impl FailedUnits {
    pub(crate) fn insert(&mut self, unit: UnitId, why: String) {
        if self.reasons.insert(unit, why).is_none() {
            self.order.push_back(unit);
        }
        while self.order.len() > REMEMBERED {
            if let Some(oldest) = self.order.pop_front() {
                self.reasons.remove(&oldest);
            }
        }
    }

    /// Why `unit` failed, if it did (asked once, by the request that waits on it).
    pub fn take(&mut self, unit: UnitId) -> Option<String> {
        let why = self.reasons.remove(&unit)?;
        self.order.retain(|u| *u != unit);
        Some(why)
    }
}
