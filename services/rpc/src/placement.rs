//! Agent runners seen from a shard: which `ahp-relay runner` processes are registered (the `Runners` service of
//! `proto/relay.proto`), which sessions each one hosts, and the [`crate::remote_agent::RemoteAgent`] providers that place sessions
//! and turns on them.
//!
//! Agents execute arbitrary code, so in the distributed deployment they never run in the shard. A session is
//! placed on the live runner offering its agent that hosts the fewest sessions: when it is created, and again
//! when a turn starts and its runner is gone. A runner's stream ending is its death: every turn it ran ends as
//! a resumable `chat/error` (the session's next prompt places it again, and the agent continues its ACP session
//! or says its context was reset), and its sessions lose their placement. A runner reaches only the sessions
//! placed on it (each action names its session, and its channel must be that session, one of its chats or one
//! of its terminals): anything else it sends is dropped.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ahp_types::state::AgentInfo;
use parking_lot::Mutex;
use relay_runner::acp::SessionKey;
use relay_runner::{ChatSink, SessionRequest, TerminalKey, TerminalRequest, TurnControl, TurnRequest};
use tokio::sync::oneshot;

use crate::pb;
use crate::pb::runner_work::Work;
use crate::work_queue::{Refused, WorkQueue};

/// A host of a tenant, as the runner protocol names it.
pub(crate) type HostId = (String, String);

/// How long one runner may take to say whether it still runs a terminal a host that moved here takes over.
pub(crate) const ADOPTION_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// The runners registered with this shard and the sessions placed on them.
#[derive(Default)]
pub struct RunnerPool {
    pub(crate) state: Mutex<PoolState>,
    pub(crate) next_runner: AtomicU64,
    pub(crate) next_turn: AtomicU64,
    /// What runners last reported about each agent (e.g. its models), by agent id.
    pub(crate) listings: Mutex<HashMap<String, AgentInfo>>,
    /// The session settings runners last reported for each agent, by agent id.
    pub(crate) settings: Mutex<HashMap<String, ahp_types::state::SessionConfigSchema>>,
    /// File operations and watches waiting on runners ([`crate::file_requests`]; sent by [`crate::remote_files`]).
    pub(crate) files: crate::file_requests::FileRequests,
    /// Terminals on runners ([`crate::remote_terminals`]).
    pub(crate) terminals: crate::remote_terminals::RemoteTerminals,
}

#[derive(Default)]
pub(crate) struct PoolState {
    pub(crate) runners: HashMap<u64, Runner>,
    /// Each placed session's runner.
    pub(crate) placements: HashMap<SessionKey, u64>,
    /// Each running turn, by the shard's number for it.
    pub(crate) turns: HashMap<u64, PlacedTurn>,
    /// Sessions whose agent is starting (until their runner reports `session/ready` or
    /// `session/creationFailed`): their runner, and where to say that it died.
    pub(crate) creating: HashMap<SessionKey, (u64, Arc<dyn ChatSink>)>,
}

pub(crate) struct Runner {
    pub(crate) name: String,
    pub(crate) agents: HashSet<String>,
    /// The tenants it is dedicated to (empty: shared).
    pub(crate) tenants: HashSet<String>,
    /// The root of its agents' workspaces, if it has one.
    pub(crate) workspace_root: Option<std::path::PathBuf>,
    pub(crate) work: WorkQueue,
    /// How many sessions are placed here.
    pub(crate) sessions: usize,
    /// The hosts this runner may emit to (those of the sessions placed on it), with where their actions go.
    pub(crate) hosts: HashMap<HostId, Arc<dyn ChatSink>>,
}

/// A session whose agent is starting, and where its creation's outcome goes.
pub(crate) type Starting = (SessionKey, Arc<dyn ChatSink>);

pub(crate) struct PlacedTurn {
    pub(crate) runner: u64,
    pub(crate) sink: Arc<dyn ChatSink>,
    pub(crate) chat: String,
    pub(crate) turn_id: String,
}

/// Why work could not be placed.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error("no runner is available for agent {0} (start `ahp-relay runner` with this agent configured)")]
    NoRunner(String),
    #[error("the runner of agent {0} is not taking work (its queue is full); retry")]
    Busy(String),
    #[error("cannot encode the request for the runner: {0}")]
    Encode(#[from] serde_json::Error),
}

impl Refused {
    pub(crate) fn for_agent(self, agent: &str) -> PlacementError {
        match self {
            Refused::Gone => PlacementError::NoRunner(agent.to_string()),
            Refused::Busy => PlacementError::Busy(agent.to_string()),
        }
    }
}

impl RunnerPool {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// How many runners are registered.
    pub fn runners(&self) -> usize {
        self.state.lock().runners.len()
    }

    /// Close every runner's stream (the shard is stopping): runners stop the agents they ran for it.
    pub fn close(&self) {
        let mut state = self.state.lock();
        state.runners.clear();
        state.placements.clear();
        state.turns.clear();
        state.creating.clear();
        relay_core::telemetry::agent_runners(0);
    }

    pub(crate) fn add(&self, hello: pb::RunnerHello, work: WorkQueue) -> u64 {
        let id = self.next_runner.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::info!(runner = %hello.name, agents = ?hello.agents, tenants = ?hello.tenants, "agent runner registered");
        let mut state = self.state.lock();
        state.runners.insert(
            id,
            Runner {
                name: hello.name,
                agents: hello.agents.into_iter().collect(),
                tenants: hello.tenants.into_iter().collect(),
                workspace_root: (!hello.workspace_root.is_empty())
                    .then(|| std::path::PathBuf::from(hello.workspace_root)),
                work,
                sessions: 0,
                hosts: HashMap::new(),
            },
        );
        relay_core::telemetry::agent_runners(state.runners.len());
        id
    }

    /// The workspace root of a runner offering `agent` (the first registered that has one).
    pub(crate) fn workspace_root(&self, agent: &str) -> Option<std::path::PathBuf> {
        let state = self.state.lock();
        let mut runners: Vec<(&u64, &Runner)> = state.runners.iter().collect();
        runners.sort_by_key(|(id, _)| **id);
        runners
            .into_iter()
            .filter(|(_, runner)| runner.agents.contains(agent))
            .find_map(|(_, runner)| runner.workspace_root.clone())
    }

    /// The runner of `key`, placing the session on the least-loaded live runner offering `agent` if it has
    /// none — one dedicated to the session's tenant when there is one, else a shared one, never one dedicated
    /// to other tenants; the runner may emit to the session's host from now on.
    pub(crate) fn place(
        state: &mut PoolState,
        agent: &str,
        key: &SessionKey,
        sink: &Arc<dyn ChatSink>,
    ) -> Result<u64, PlacementError> {
        let placed = state
            .placements
            .get(key)
            .copied()
            .filter(|id| state.runners.contains_key(id));
        let id = match placed {
            Some(id) => id,
            None => {
                let id = state
                    .runners
                    .iter()
                    .filter(|(_, runner)| runner.agents.contains(agent))
                    .filter(|(_, runner)| runner.tenants.is_empty() || runner.tenants.contains(&key.tenant))
                    .min_by_key(|(id, runner)| (runner.tenants.is_empty(), runner.sessions, **id))
                    .map(|(id, _)| *id)
                    .ok_or_else(|| PlacementError::NoRunner(agent.to_string()))?;
                state.placements.insert(key.clone(), id);
                if let Some(runner) = state.runners.get_mut(&id) {
                    runner.sessions += 1;
                    tracing::debug!(runner = %runner.name, session = %key.session, "session placed");
                }
                id
            }
        };
        if let Some(runner) = state.runners.get_mut(&id) {
            runner
                .hosts
                .insert((key.tenant.clone(), key.host.clone()), sink.clone());
        }
        Ok(id)
    }

    pub(crate) fn file_requests(&self) -> &crate::file_requests::FileRequests {
        &self.files
    }

    /// The runner holding `tenant`'s workspace: one dedicated to it with a workspace, else a shared one (the
    /// first registered).
    pub(crate) fn workspace_runner(&self, tenant: &str) -> Option<u64> {
        let state = self.state.lock();
        let mut runners: Vec<(&u64, &Runner)> = state
            .runners
            .iter()
            .filter(|(_, runner)| runner.workspace_root.is_some())
            .collect();
        runners.sort_by_key(|(id, _)| **id);
        runners
            .iter()
            .find(|(_, runner)| runner.tenants.contains(tenant))
            .or_else(|| runners.iter().find(|(_, runner)| runner.tenants.is_empty()))
            .map(|(id, _)| **id)
    }

    /// The workspace root of `runner`.
    pub(crate) fn workspace_root_of(&self, runner: u64) -> Option<std::path::PathBuf> {
        self.state.lock().runners.get(&runner)?.workspace_root.clone()
    }

    /// Send `work` to `runner`; whether it is still there.
    pub(crate) fn send_to(&self, runner: u64, work: Work) -> Result<(), Refused> {
        Self::send(&self.state.lock(), runner, work)
    }

    pub(crate) fn send(state: &PoolState, runner: u64, work: Work) -> Result<(), Refused> {
        match state.runners.get(&runner) {
            Some(runner) => runner.work.send(pb::RunnerWork { work: Some(work) }),
            None => Err(Refused::Gone),
        }
    }

    pub(crate) fn create_session(
        &self,
        agent: &str,
        request: &SessionRequest,
        sink: &Arc<dyn ChatSink>,
    ) -> Result<(), PlacementError> {
        let key = SessionKey {
            tenant: request.tenant.clone(),
            host: request.host.clone(),
            session: request.session.clone(),
        };
        let body = serde_json::to_vec(request)?;
        let mut state = self.state.lock();
        let runner = Self::place(&mut state, agent, &key, sink)?;
        let work = Work::CreateSession(pb::CreateAgentSession {
            agent: agent.to_string(),
            request: body,
        });
        Self::send(&state, runner, work).map_err(|refused| refused.for_agent(agent))?;
        state.creating.insert(key, (runner, sink.clone()));
        Ok(())
    }

    pub(crate) fn start_turn(
        &self,
        agent: &str,
        request: &TurnRequest,
        sink: &Arc<dyn ChatSink>,
    ) -> Result<u64, PlacementError> {
        let key = SessionKey {
            tenant: request.tenant.clone(),
            host: request.host.clone(),
            session: request.session.clone(),
        };
        let body = serde_json::to_vec(request)?;
        let turn = self.next_turn.fetch_add(1, Ordering::Relaxed) + 1;
        let mut state = self.state.lock();
        let runner = Self::place(&mut state, agent, &key, sink)?;
        let work = Work::StartTurn(pb::StartAgentTurn {
            agent: agent.to_string(),
            turn,
            request: body,
        });
        Self::send(&state, runner, work).map_err(|refused| refused.for_agent(agent))?;
        state.turns.insert(
            turn,
            PlacedTurn {
                runner,
                sink: sink.clone(),
                chat: request.chat.clone(),
                turn_id: request.turn_id.clone(),
            },
        );
        Ok(turn)
    }

    /// Start a terminal in a session of `agent` (placing the session if it has no runner); the answer comes
    /// with the runner's `TerminalStarted`.
    pub(crate) fn start_terminal(
        &self,
        agent: &str,
        request: &TerminalRequest,
        sink: &Arc<dyn ChatSink>,
    ) -> Result<oneshot::Receiver<Result<(), String>>, PlacementError> {
        let key = SessionKey {
            tenant: request.key.tenant.clone(),
            host: request.key.host.clone(),
            session: request.session.clone(),
        };
        let body = serde_json::to_vec(request)?;
        let id = self.next_turn.fetch_add(1, Ordering::Relaxed) + 1;
        let (answer, answered) = oneshot::channel();
        let state = &mut self.state.lock();
        let runner = Self::place(state, agent, &key, sink)?;
        self.terminals.starting(id, runner, request.key.clone(), answer);
        self.terminals
            .held(request.key.clone(), runner, &request.session, sink.clone());
        let work = Work::StartTerminal(pb::StartTerminal {
            id,
            agent: agent.to_string(),
            request: body,
        });
        if let Err(refused) = Self::send(state, runner, work) {
            self.terminals.ended(&request.key);
            return Err(refused.for_agent(agent));
        }
        Ok(answered)
    }

    /// Take over terminal `key` of `session` from whichever runner of `agent` still runs it (its host moved
    /// here from a shard that went): each runner that may hold it is asked in turn; the first that does keeps
    /// it, and its output goes to `sink` from then on.
    pub(crate) async fn adopt_terminal(
        self: Arc<Self>,
        agent: String,
        key: TerminalKey,
        session: String,
        sink: Arc<dyn ChatSink>,
    ) -> Result<(), String> {
        let candidates: Vec<u64> = {
            let state = self.state.lock();
            let mut candidates: Vec<u64> = state
                .runners
                .iter()
                .filter(|(_, runner)| runner.agents.contains(&agent))
                .filter(|(_, runner)| runner.tenants.is_empty() || runner.tenants.contains(&key.tenant))
                .map(|(id, _)| *id)
                .collect();
            candidates.sort_unstable();
            candidates
        };
        for runner in candidates {
            let id = self.next_turn.fetch_add(1, Ordering::Relaxed) + 1;
            let (answer, answered) = oneshot::channel();
            self.terminals.starting(id, runner, key.clone(), answer);
            // Held before it is asked: a runner that holds it sends its output at once, before its answer.
            self.terminals.held(key.clone(), runner, &session, sink.clone());
            let work = Work::AdoptTerminal(pb::AdoptTerminal {
                id,
                agent: agent.clone(),
                host: Some(pb::HostKey {
                    tenant: key.tenant.clone(),
                    host: key.host.clone(),
                }),
                session: session.clone(),
                uri: key.uri.clone(),
            });
            if self.send_to(runner, work).is_err() {
                self.terminals.abandoned(id);
                self.terminals.ended(&key);
                continue;
            }
            match tokio::time::timeout(ADOPTION_PATIENCE, answered).await {
                Ok(Ok(Ok(()))) => return Ok(()),
                Ok(_) => self.terminals.ended(&key),
                Err(_) => {
                    self.terminals.abandoned(id);
                    self.terminals.ended(&key);
                }
            }
        }
        Err("no runner runs it any more".into())
    }

    /// Send what a device did to a terminal to the runner holding it.
    pub(crate) fn terminal_work(&self, agent: &str, key: &TerminalKey, work: pb::terminal_work::Work) {
        let Some(runner) = self.terminals.runner_of(key) else {
            return;
        };
        if matches!(work, pb::terminal_work::Work::Kill(_)) {
            self.terminals.ended(key);
        }
        // Typed input a runner too far behind cannot take is dropped (like keys typed into a stalled link);
        // a kill or a resize always goes.
        let _ = self.send_to(
            runner,
            Work::Terminal(pb::TerminalWork {
                agent: agent.to_string(),
                host: Some(pb::HostKey {
                    tenant: key.tenant.clone(),
                    host: key.host.clone(),
                }),
                uri: key.uri.clone(),
                work: Some(work),
            }),
        );
    }

    /// Forward a decision to the runner of `turn`; `Cancelled` also ends the turn's number.
    pub(crate) fn control(&self, turn: u64, control: &TurnControl) {
        let body = match serde_json::to_vec(control) {
            Ok(body) => body,
            Err(error) => {
                tracing::error!(%error, "cannot encode a turn control");
                return;
            }
        };
        let mut state = self.state.lock();
        let Some(runner) = state.turns.get(&turn).map(|placed| placed.runner) else {
            return;
        };
        if matches!(control, TurnControl::Cancelled) {
            state.turns.remove(&turn);
        }
        let _ = Self::send(
            &state,
            runner,
            Work::Control(pb::AgentTurnControl { turn, control: body }),
        );
    }

    pub(crate) fn dispose_session(&self, key: &SessionKey) {
        // Every runner holding a terminal of it hears of it too (a terminal taken over after its host moved runs
        // where its session's agent may not).
        let mut runners = self
            .terminals
            .forget_session(&key.tenant, &key.host, &key.session);
        let mut state = self.state.lock();
        state.creating.remove(key);
        if let Some(runner) = state.placements.remove(key) {
            if let Some(placed) = state.runners.get_mut(&runner) {
                placed.sessions = placed.sessions.saturating_sub(1);
            }
            if !runners.contains(&runner) {
                runners.push(runner);
            }
        }
        for runner in runners {
            let _ = Self::send(
                &state,
                runner,
                Work::DisposeSession(pb::DisposeAgentSession {
                    host: Some(pb::HostKey {
                        tenant: key.tenant.clone(),
                        host: key.host.clone(),
                    }),
                    session: key.session.clone(),
                }),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::runner_report::Report;
    use ahp_types::actions::StateAction;

    /// Records what reaches a host.
    #[derive(Default)]
    struct Recorded(Mutex<Vec<(String, String)>>);

    impl ChatSink for Recorded {
        fn emit(&self, channel: &str, _action: StateAction) -> relay_runner::Emitted {
            self.0.lock().push((String::new(), channel.to_string()));
            relay_runner::Emitted::Applied
        }

        fn emit_in(&self, session: &str, channel: &str, _action: StateAction) -> relay_runner::Emitted {
            self.0.lock().push((session.to_string(), channel.to_string()));
            relay_runner::Emitted::Applied
        }
    }

    fn action(session: &str, channel: &str) -> Report {
        Report::Action(pb::AgentAction {
            host: Some(pb::HostKey {
                tenant: "acme".into(),
                host: "default".into(),
            }),
            channel: channel.into(),
            action: serde_json::to_vec(&StateAction::SessionReady(
                ahp_types::actions::SessionReadyAction {},
            ))
            .expect("json"),
            session: session.into(),
        })
    }

    #[test]
    fn a_runner_reaches_only_the_sessions_placed_on_it() {
        let pool = RunnerPool::new();
        let (work, _received) = WorkQueue::new();
        let mine = pool.add(
            pb::RunnerHello {
                name: "mine".into(),
                agents: vec!["scripted".into()],
                tenants: vec![],
                workspace_root: String::new(),
            },
            work,
        );
        let recorded = Arc::new(Recorded::default());
        let sink: Arc<dyn ChatSink> = recorded.clone();
        let request = SessionRequest {
            session: "ahp-session:/placed".into(),
            tenant: "acme".into(),
            host: "default".into(),
            working_directory: None,
            branch: None,
        };
        pool.create_session("scripted", &request, &sink).expect("placed");

        pool.report(mine, action("ahp-session:/placed", "ahp-chat:/placed"));
        // Another session of the same host, another host, a runner that does not hold the session: dropped.
        pool.report(mine, action("ahp-session:/elsewhere", "ahp-chat:/elsewhere"));
        let mut other_host = action("ahp-session:/placed", "ahp-chat:/placed");
        if let Report::Action(a) = &mut other_host {
            a.host = Some(pb::HostKey {
                tenant: "other".into(),
                host: "default".into(),
            });
        }
        pool.report(mine, other_host);
        pool.report(mine + 1, action("ahp-session:/placed", "ahp-chat:/placed"));
        assert_eq!(
            *recorded.0.lock(),
            [("ahp-session:/placed".to_string(), "ahp-chat:/placed".to_string())]
        );
        // Once disposed, the session is out of the runner's reach too.
        pool.dispose_session(&SessionKey {
            tenant: "acme".into(),
            host: "default".into(),
            session: "ahp-session:/placed".into(),
        });
        pool.report(mine, action("ahp-session:/placed", "ahp-chat:/placed"));
        assert_eq!(recorded.0.lock().len(), 1);
    }

    fn session_of(tenant: &str, name: &str) -> SessionRequest {
        SessionRequest {
            session: format!("ahp-session:/{name}"),
            tenant: tenant.into(),
            host: "default".into(),
            working_directory: None,
            branch: None,
        }
    }

    fn runner_of(pool: &RunnerPool, key: &SessionRequest) -> Option<u64> {
        pool.state
            .lock()
            .placements
            .get(&SessionKey {
                tenant: key.tenant.clone(),
                host: key.host.clone(),
                session: key.session.clone(),
            })
            .copied()
    }

    #[test]
    fn a_runner_dedicated_to_tenants_takes_only_theirs_and_takes_them_first() {
        let pool = RunnerPool::new();
        let hello = |name: &str, tenants: &[&str]| pb::RunnerHello {
            name: name.into(),
            agents: vec!["scripted".into()],
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
            workspace_root: String::new(),
        };
        let (work, _received) = WorkQueue::new();
        let acme_runner = pool.add(hello("acme-only", &["acme"]), work);
        let sink: Arc<dyn ChatSink> = Arc::new(Recorded::default());
        // Only acme's runner: another tenant's session finds no runner.
        let globex = session_of("globex", "g1");
        assert!(matches!(
            pool.create_session("scripted", &globex, &sink),
            Err(PlacementError::NoRunner(_))
        ));
        let (work, _received_shared) = WorkQueue::new();
        let shared = pool.add(hello("shared", &[]), work);
        pool.create_session("scripted", &globex, &sink)
            .expect("the shared runner");
        assert_eq!(runner_of(&pool, &globex), Some(shared));
        // acme's sessions go to its own runner, however loaded, before the shared one.
        for n in 0..3 {
            let acme = session_of("acme", &format!("a{n}"));
            pool.create_session("scripted", &acme, &sink).expect("placed");
            assert_eq!(runner_of(&pool, &acme), Some(acme_runner));
        }
    }
}
