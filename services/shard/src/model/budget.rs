//! Snapshots within a reply's byte budget: a chat's newest turns inline, a cursor for the older ones.

use ahp_types::state::{Snapshot, SnapshotState};

use super::host_model::{limit_turns, ChannelKind, HostModel};
use super::records::json_len;

/// What the snapshots of one reply may still take, in serialized bytes: a reply is budgeted while it is built,
/// so an over-budget request is refused before the rest of its snapshots are made.
pub struct ReplyBudget {
    left: usize,
}

/// A snapshot does not fit what is left of its reply's budget, even with no turns inline.
#[derive(Debug)]
pub struct OverBudget;

/// Room a reply keeps for its JSON-RPC frame and result fields around the snapshots.
const REPLY_FRAME_BYTES: usize = 4 * 1024;

impl ReplyBudget {
    /// The budget of a reply of at most `max_reply_bytes`.
    pub fn new(max_reply_bytes: usize) -> Self {
        Self {
            left: max_reply_bytes.saturating_sub(REPLY_FRAME_BYTES),
        }
    }

    fn take(&mut self, bytes: usize) -> Result<(), OverBudget> {
        self.left = self.left.checked_sub(bytes).ok_or(OverBudget)?;
        Ok(())
    }
}

impl HostModel {
    /// [`HostModel::snapshot`] within what is left of `budget`, which it takes from: a chat keeps the newest of
    /// its (at most `turns`) turns that fit inline, its cursor pointing before them (AHP lets a host return
    /// fewer turns than asked; `fetchTurns` pages in the rest). `Ok(None)` for a channel the host lacks.
    pub fn snapshot_within(
        &self,
        channel: &str,
        from_seq: u64,
        turns: usize,
        budget: &mut ReplyBudget,
    ) -> Result<Option<Snapshot>, OverBudget> {
        let turns = match (self.kind(channel), self.chats.get(channel)) {
            (ChannelKind::Chat, Some(chat)) => {
                let held = &chat.state.turns;
                let asked = turns.min(held.len());
                // The chat without the turns it may show, then its turns newest first while they fit.
                let base = json_len(&limit_turns(&chat.state, 0, chat.archived));
                // (A margin: the cursor that ends up in the snapshot may be a few digits longer.)
                let mut room = budget.left.saturating_sub(base + 64);
                let mut fitting = 0;
                for turn in held.iter().rev().take(asked) {
                    let size = json_len(turn) + 1;
                    if size > room {
                        break;
                    }
                    room -= size;
                    fitting += 1;
                }
                fitting
            }
            _ => turns,
        };
        let Some(snapshot) = self.snapshot(channel, from_seq, turns) else {
            return Ok(None);
        };
        budget.take(json_len(&snapshot))?;
        Ok(Some(snapshot))
    }
}

/// The absolute index of the first turn a chat snapshot carries (0 for other snapshots).
pub fn first_turn_of(snapshot: &Snapshot) -> usize {
    match &snapshot.state {
        SnapshotState::Chat(chat) => crate::model::archive::first_held(chat),
        _ => 0,
    }
}
