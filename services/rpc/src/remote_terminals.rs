//! Terminals on runners, seen from a shard: which runner holds each terminal of its sessions (devices'
//! terminals it started there, agents' commands the runner opened), the starts waiting for the runner's
//! `TerminalStarted`, and what a runner's death means for them — every terminal it held ends as
//! `terminal/exited` (no exit code), every start waiting on it fails.

use std::collections::HashMap;
use std::sync::Arc;

use ahp_types::actions::{StateAction, TerminalExitedAction};
use parking_lot::Mutex;
use relay_runner::{ChatSink, TerminalKey};
use tokio::sync::oneshot;

/// A terminal a runner holds.
struct Held {
    runner: u64,
    session: String,
    sink: Arc<dyn ChatSink>,
}

/// Where a runner's answer to a start goes.
type StartAnswer = oneshot::Sender<Result<(), String>>;

/// Terminals of a shard's sessions on its runners.
#[derive(Default)]
pub struct RemoteTerminals {
    held: Mutex<HashMap<TerminalKey, Held>>,
    /// Starts waiting for their runner's answer: the runner asked, the terminal, and where the answer goes.
    starting: Mutex<HashMap<u64, (u64, TerminalKey, StartAnswer)>>,
}

impl RemoteTerminals {
    /// `runner` holds terminal `key` of `session` (its actions go to `sink`).
    pub(crate) fn held(&self, key: TerminalKey, runner: u64, session: &str, sink: Arc<dyn ChatSink>) {
        self.held.lock().insert(
            key,
            Held {
                runner,
                session: session.to_string(),
                sink,
            },
        );
    }

    /// A start sent to `runner` as `id`, answered through `answer`.
    pub(crate) fn starting(&self, id: u64, runner: u64, key: TerminalKey, answer: StartAnswer) {
        self.starting.lock().insert(id, (runner, key, answer));
    }

    /// `runner` answered start `id` (empty `error`: it runs).
    pub(crate) fn started(&self, runner: u64, id: u64, error: String) {
        let taken = {
            let mut starting = self.starting.lock();
            match starting.get(&id) {
                Some((asked, _, _)) if *asked == runner => starting.remove(&id),
                _ => None,
            }
        };
        if let Some((_, key, answer)) = taken {
            if !error.is_empty() {
                // It never ran: nothing of it is held.
                self.ended(&key);
            }
            let _ = answer.send(if error.is_empty() { Ok(()) } else { Err(error) });
        }
    }

    /// A start (or takeover) `id` that will not be answered any more (it timed out).
    pub(crate) fn abandoned(&self, id: u64) {
        self.starting.lock().remove(&id);
    }

    /// Where `runner`'s actions on terminal `key` of `session` go, when it holds that terminal: a terminal taken
    /// over from a runner goes on there even while its session's agent is placed elsewhere (or nowhere).
    pub(crate) fn sink_of(&self, key: &TerminalKey, runner: u64, session: &str) -> Option<Arc<dyn ChatSink>> {
        self.held
            .lock()
            .get(key)
            .filter(|held| held.runner == runner && held.session == session)
            .map(|held| held.sink.clone())
    }

    /// The runner holding `key`, if one does.
    pub(crate) fn runner_of(&self, key: &TerminalKey) -> Option<u64> {
        self.held.lock().get(key).map(|held| held.runner)
    }

    /// `key` ended (exited, or disposed).
    pub(crate) fn ended(&self, key: &TerminalKey) {
        self.held.lock().remove(key);
    }

    /// The terminals of a disposed session are no longer anyone's: the runners that held them.
    pub(crate) fn forget_session(&self, tenant: &str, host: &str, session: &str) -> Vec<u64> {
        let mut runners = Vec::new();
        self.held.lock().retain(|key, held| {
            let of_session = key.tenant == tenant && key.host == host && held.session == session;
            if of_session && !runners.contains(&held.runner) {
                runners.push(held.runner);
            }
            !of_session
        });
        runners
    }

    /// `runner` is gone: its terminals exited, its starts failed.
    pub(crate) fn runner_lost(&self, runner: u64) {
        let gone: Vec<(TerminalKey, Held)> = {
            let mut held = self.held.lock();
            let keys: Vec<TerminalKey> = held
                .iter()
                .filter(|(_, held)| held.runner == runner)
                .map(|(key, _)| key.clone())
                .collect();
            keys.into_iter()
                .filter_map(|key| held.remove(&key).map(|held| (key, held)))
                .collect()
        };
        for (key, held) in gone {
            held.sink.emit_in(
                &held.session,
                &key.uri,
                StateAction::TerminalExited(TerminalExitedAction { exit_code: None }),
            );
        }
        let failed: Vec<StartAnswer> = {
            let mut starting = self.starting.lock();
            let ids: Vec<u64> = starting
                .iter()
                .filter(|(_, (asked, _, _))| *asked == runner)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| starting.remove(&id).map(|(_, _, answer)| answer))
                .collect()
        };
        for answer in failed {
            let _ = answer.send(Err("the runner that was to run it stopped".into()));
        }
    }
}
