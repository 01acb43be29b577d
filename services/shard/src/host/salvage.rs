//! What the committer does with a batch the store refuses for good (a value over the database's limits, a
//! trigger that says no): one bad action must not cost the host or anyone else's work.
//!
//! The batch is written again unit by unit (a unit is one connection's message, or one piece of the host's
//! own work: see [`crate::host::sequencer`]). A unit the store refuses fails; so does every later unit that touched
//! a channel it touched (those were reduced against state that included it). Units that commit are published
//! as usual. Then, under the host's lock:
//! - the sessions (with their chats and terminals) the failed units touched are dropped from memory and read
//!   back from the store, which holds exactly what committed; units still queued that touched them fail too;
//! - what the failed units numbered leaves the replay buffer and the owed envelopes (no client ever saw it);
//! - each client action of a failed unit is rejected to its sender (the client rolls it back), and a request
//!   waiting on a failed unit answers with an error ([`crate::host::failed_units::FailedUnits`]).
//!
//! The root channel, if a failed unit touched it, is read back from the store as well.

use std::collections::HashSet;
use std::sync::Arc;

use ahp_types::actions::ActionEnvelope;
use ahp_types::ROOT_RESOURCE_URI;

use crate::host::batches::Written;
use crate::host::sequencer::Unit;
use crate::host::{Host, HostCore};

/// Write `units` (a refused batch, in order) one by one; publish those that commit; fail the rest as the
/// module says. `false` when the host was deposed meanwhile.
pub(crate) async fn commit_units(host: &Arc<Host>, units: Vec<Unit>, span: &tracing::Span) -> bool {
    let mut touched_by_failures: HashSet<String> = HashSet::new();
    let mut failed: Vec<(Unit, String)> = Vec::new();
    for unit in units {
        let channels = unit.channels();
        if !channels.is_disjoint(&touched_by_failures) {
            touched_by_failures.extend(channels);
            failed.push((
                unit,
                "an earlier change to the same channel could not be stored".into(),
            ));
            continue;
        }
        match host.write(&unit.commit, span).await {
            Written::Committed => host.publish(unit.publications).await,
            Written::Deposed => return false,
            Written::Refused(error) => {
                tracing::warn!(host = %host.key, unit = unit.id, %error, "the store refused one unit of a batch; it fails alone");
                touched_by_failures.extend(channels);
                let why = if error.is_storage_full() {
                    "the store is full (no space left): retry once an operator has freed space"
                } else {
                    "the store refused it"
                };
                failed.push((unit, why.into()));
            }
        }
    }
    if failed.is_empty() {
        return true;
    }
    let (sessions, root) = host.with_core(|core| core.forget_failed(&touched_by_failures, failed));
    // Read back at once what was dropped (a running agent's actions need their chat in memory).
    let reload = host.clone();
    tokio::spawn(async move {
        if let Err(error) = reload.ensure_loaded(&sessions).await {
            tracing::error!(host = %reload.key, %error, "could not read sessions back after a refused commit");
        }
        if root {
            let agents = reload.core.lock().model.root.agents.clone();
            match crate::host::preload::restore_root(&reload.store, &reload.key, agents).await {
                Ok(state) => reload.with_core(|core| core.model.root = state),
                Err(error) => {
                    tracing::error!(host = %reload.key, %error, "could not read the root back after a refused commit")
                }
            }
        }
    });
    true
}

impl HostCore {
    /// Drop from memory what the failed units touched, fail the queued units built on it, and tell the
    /// senders. Returns the sessions to read back, and whether the root must be.
    fn forget_failed(
        &mut self,
        touched: &HashSet<String>,
        mut failed: Vec<(Unit, String)>,
    ) -> (Vec<String>, bool) {
        let mut sessions: HashSet<String> = HashSet::new();
        let mut root = false;
        for channel in touched {
            if channel == ROOT_RESOURCE_URI {
                root = true;
                continue;
            }
            let channel = channel.strip_prefix("relay-archive:").unwrap_or(channel);
            let session = if self.model.sessions.contains_key(channel) {
                Some(channel.to_string())
            } else if let Some(chat) = self.model.chats.get(channel) {
                Some(chat.session.clone())
            } else {
                self.model
                    .terminals
                    .get(channel)
                    .map(|terminal| terminal.session.clone())
            };
            sessions.extend(session);
        }
        let mut dropped: HashSet<String> = touched.clone();
        for session in &sessions {
            dropped.extend(self.model.remove_session(session));
            dropped.insert(session.clone());
        }
        if root {
            dropped.insert(ROOT_RESOURCE_URI.to_string());
        }
        for unit in self.seq.take_units_touching(&dropped) {
            failed.push((
                unit,
                "it changed state that an earlier, refused change had changed too".into(),
            ));
        }
        let numbered: HashSet<u64> = failed.iter().flat_map(|(unit, _)| unit.seqs()).collect();
        self.seq.replay_mut().remove(&numbered);
        self.owed.remove(&numbered);
        for (unit, why) in failed {
            let Some(owner) = unit.owner else {
                continue;
            };
            self.failed_units.insert(unit.id, why.clone());
            for entry in &unit.commit.log {
                let Ok(envelope) = serde_json::from_str::<ActionEnvelope>(&entry.envelope) else {
                    continue;
                };
                // Only a client's own actions are rolled back by a rejection.
                let Some(origin) = envelope.origin else {
                    continue;
                };
                let reason = format!("the store could not record this action: {why}");
                if let Some(rejected) = self.seq.private(
                    owner,
                    &envelope.channel,
                    &envelope.action,
                    Some(origin.clone()),
                    Some(reason),
                ) {
                    self.owed.owe(&origin.client_id, rejected);
                }
            }
        }
        (sessions.into_iter().collect(), root)
    }
}
