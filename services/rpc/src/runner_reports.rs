//! What a runner reports on its stream, applied where it belongs: agents' actions and terminals to the sink of
//! their session on the host it was placed for (never another's), turns ended, file answers to their waiting
//! requests; and a lost runner's sessions and turns failed over.

use std::sync::Arc;

use ahp_types::actions::StateAction;
use ahp_types::state::AgentInfo;
use relay_runner::acp::turn::TurnMapper;
use relay_runner::acp::SessionKey;
use relay_runner::{ChatSink, TerminalKey};

use crate::pb;
use crate::pb::runner_report::Report;
use crate::pb::runner_work::Work;

use crate::placement::*;

impl RunnerPool {
    /// One report of a registered runner.
    pub(crate) fn report(&self, runner: u64, report: Report) {
        match report {
            Report::Hello(_) => tracing::warn!(runner, "a runner said hello twice; ignored"),
            Report::FileAnswer(answer) => self.files.answered(runner, answer),
            Report::FileChanged(changed) => self.files.changed(runner, changed),
            Report::TerminalStarted(started) => self.terminals.started(runner, started.id, started.error),
            Report::Action(action) => {
                let held = action.host.as_ref().and_then(|host| {
                    let key = TerminalKey {
                        tenant: host.tenant.clone(),
                        host: host.host.clone(),
                        uri: action.channel.clone(),
                    };
                    self.terminals.sink_of(&key, runner, &action.session)
                });
                let Some(sink) =
                    held.or_else(|| self.session_sink(runner, action.host.as_ref(), &action.session))
                else {
                    // A terminal of a session no longer placed here (disposed), or one nobody here holds (taken
                    // over too late): no longer held, and its processes go (its output would go nowhere).
                    if let Some(host) = &action.host {
                        let key = TerminalKey {
                            tenant: host.tenant.clone(),
                            host: host.host.clone(),
                            uri: action.channel.clone(),
                        };
                        self.terminals.ended(&key);
                        if action.channel.starts_with("ahp-terminal:") {
                            let _ = self.send_to(
                                runner,
                                Work::Terminal(pb::TerminalWork {
                                    agent: String::new(),
                                    host: Some(host.clone()),
                                    uri: key.uri,
                                    work: Some(pb::terminal_work::Work::Kill(true)),
                                }),
                            );
                        }
                    }
                    tracing::warn!(runner, "a runner emitted for a session not placed on it; dropped");
                    return;
                };
                match serde_json::from_slice::<StateAction>(&action.action) {
                    Ok(parsed) => {
                        if matches!(
                            parsed,
                            StateAction::SessionReady(_) | StateAction::SessionCreationFailed(_)
                        ) {
                            if let Some(host) = &action.host {
                                self.state.lock().creating.remove(&SessionKey {
                                    tenant: host.tenant.clone(),
                                    host: host.host.clone(),
                                    session: action.channel.clone(),
                                });
                            }
                        }
                        if let (StateAction::TerminalExited(_), Some(host)) = (&parsed, &action.host) {
                            self.terminals.ended(&TerminalKey {
                                tenant: host.tenant.clone(),
                                host: host.host.clone(),
                                uri: action.channel.clone(),
                            });
                        }
                        if !sink.emit_in(&action.session, &action.channel, parsed).applied() {
                            tracing::debug!(runner, channel = %action.channel, "an agent's action was not applied");
                        }
                    }
                    Err(error) => {
                        tracing::warn!(runner, %error, "a runner sent an unreadable action; dropped")
                    }
                }
            }
            Report::OpenTerminal(terminal) => {
                let Some(sink) = self.session_sink(runner, terminal.host.as_ref(), &terminal.session) else {
                    tracing::warn!(
                        runner,
                        "a runner opened a terminal for a session not placed on it; dropped"
                    );
                    return;
                };
                match serde_json::from_slice::<ahp_types::state::TerminalState>(&terminal.state) {
                    Ok(state) => {
                        if sink.open_terminal(&terminal.session, &terminal.uri, state) {
                            if let Some(host) = &terminal.host {
                                let key = TerminalKey {
                                    tenant: host.tenant.clone(),
                                    host: host.host.clone(),
                                    uri: terminal.uri.clone(),
                                };
                                self.terminals.held(key, runner, &terminal.session, sink.clone());
                            }
                        } else {
                            tracing::warn!(runner, uri = %terminal.uri, "the host refused an agent's terminal");
                        }
                    }
                    Err(error) => tracing::warn!(runner, %error, "a runner sent an unreadable terminal"),
                }
            }
            Report::AgentSettings(settings) => {
                match serde_json::from_slice::<ahp_types::state::SessionConfigSchema>(&settings.schema) {
                    Ok(schema) => {
                        self.settings.lock().insert(settings.agent, schema);
                    }
                    Err(error) => tracing::warn!(runner, %error, "a runner sent unreadable agent settings"),
                }
            }
            Report::AgentChanged(listing) => {
                let Some(sink) = self.sink(runner, listing.host.as_ref()) else {
                    return;
                };
                match serde_json::from_slice::<AgentInfo>(&listing.info) {
                    Ok(info) => {
                        self.listings.lock().insert(info.provider.clone(), info.clone());
                        sink.agent_changed(info);
                    }
                    Err(error) => tracing::warn!(runner, %error, "a runner sent an unreadable agent listing"),
                }
            }
        }
    }

    /// Where a runner's actions for `session` go, when that session is placed on the runner (or is starting
    /// there).
    pub(crate) fn session_sink(
        &self,
        runner: u64,
        host: Option<&pb::HostKey>,
        session: &str,
    ) -> Option<Arc<dyn ChatSink>> {
        let host = host?;
        let key = SessionKey {
            tenant: host.tenant.clone(),
            host: host.host.clone(),
            session: session.to_string(),
        };
        let state = self.state.lock();
        let placed = state.placements.get(&key) == Some(&runner)
            || state
                .creating
                .get(&key)
                .is_some_and(|(placed, _)| *placed == runner);
        if !placed {
            return None;
        }
        state
            .runners
            .get(&runner)?
            .hosts
            .get(&(key.tenant, key.host))
            .cloned()
    }

    pub(crate) fn sink(&self, runner: u64, host: Option<&pb::HostKey>) -> Option<Arc<dyn ChatSink>> {
        let host = host?;
        self.state
            .lock()
            .runners
            .get(&runner)?
            .hosts
            .get(&(host.tenant.clone(), host.host.clone()))
            .cloned()
    }

    /// A runner's stream ended: its turns end as resumable errors, the sessions it was starting fail, and its
    /// sessions lose their placement.
    pub(crate) fn runner_lost(&self, runner: u64) {
        self.files.runner_lost(runner);
        self.terminals.runner_lost(runner);
        let (orphans, unborn): (Vec<PlacedTurn>, Vec<Starting>) = {
            let mut state = self.state.lock();
            let Some(gone) = state.runners.remove(&runner) else {
                return;
            };
            tracing::warn!(runner = %gone.name, sessions = gone.sessions, "agent runner gone");
            relay_core::telemetry::agent_runners(state.runners.len());
            state.placements.retain(|_, placed| *placed != runner);
            let turns: Vec<u64> = state
                .turns
                .iter()
                .filter(|(_, turn)| turn.runner == runner)
                .map(|(id, _)| *id)
                .collect();
            let unborn: Vec<SessionKey> = state
                .creating
                .iter()
                .filter(|(_, (placed, _))| *placed == runner)
                .map(|(key, _)| key.clone())
                .collect();
            (
                turns
                    .into_iter()
                    .filter_map(|id| state.turns.remove(&id))
                    .collect(),
                unborn
                    .into_iter()
                    .filter_map(|key| state.creating.remove(&key).map(|(_, sink)| (key, sink)))
                    .collect(),
            )
        };
        for (key, sink) in unborn {
            sink.emit(
                &key.session,
                StateAction::SessionCreationFailed(ahp_types::actions::SessionCreationFailedAction {
                    error: ahp_types::state::ErrorInfo {
                        error_type: "runnerLost".into(),
                        message:
                            "The runner starting this session's agent stopped; create the session again."
                                .into(),
                        stack: None,
                        meta: None,
                    },
                }),
            );
        }
        for turn in orphans {
            TurnMapper::new(turn.chat, turn.turn_id, turn.sink).fail(
                "runnerLost",
                "The runner hosting this agent stopped during the turn; send your message again to continue.",
                true,
            );
        }
    }
}
