//! Agent runners seen from a shard: which `ahp-relay runner` processes are registered (the `Runners` service of
//! `proto/relay.proto`), which sessions each one hosts, and the [`RemoteAgent`] providers that place sessions
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
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ahp_types::actions::StateAction;
use ahp_types::state::AgentInfo;
use parking_lot::Mutex;
use relay_runner::acp::turn::TurnMapper;
use relay_runner::acp::SessionKey;
use relay_runner::{
    ChatSink, Provider, SessionRequest, SessionStart, TerminalKey, TerminalRequest, TerminalStarted,
    TurnControl, TurnHandle, TurnRequest,
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tonic::codegen::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

use crate::credential::{CredentialCheck, InternalCredential};
use crate::pb;
use crate::pb::runner_report::Report;
use crate::pb::runner_work::Work;
use crate::pb::runners_server::{Runners, RunnersServer};
use crate::work_queue::{Refused, WorkQueue};

/// A host of a tenant, as the runner protocol names it.
type HostId = (String, String);

/// How long one runner may take to say whether it still runs a terminal a host that moved here takes over.
const ADOPTION_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// The runners registered with this shard and the sessions placed on them.
#[derive(Default)]
pub struct RunnerPool {
    state: Mutex<PoolState>,
    next_runner: AtomicU64,
    next_turn: AtomicU64,
    /// What runners last reported about each agent (e.g. its models), by agent id.
    listings: Mutex<HashMap<String, AgentInfo>>,
    /// The session settings runners last reported for each agent, by agent id.
    settings: Mutex<HashMap<String, ahp_types::state::SessionConfigSchema>>,
    /// File operations and watches waiting on runners ([`crate::file_requests`]; sent by [`crate::remote_files`]).
    files: crate::file_requests::FileRequests,
    /// Terminals on runners ([`crate::remote_terminals`]).
    terminals: crate::remote_terminals::RemoteTerminals,
}

#[derive(Default)]
struct PoolState {
    runners: HashMap<u64, Runner>,
    /// Each placed session's runner.
    placements: HashMap<SessionKey, u64>,
    /// Each running turn, by the shard's number for it.
    turns: HashMap<u64, PlacedTurn>,
    /// Sessions whose agent is starting (until their runner reports `session/ready` or
    /// `session/creationFailed`): their runner, and where to say that it died.
    creating: HashMap<SessionKey, (u64, Arc<dyn ChatSink>)>,
}

struct Runner {
    name: String,
    agents: HashSet<String>,
    /// The tenants it is dedicated to (empty: shared).
    tenants: HashSet<String>,
    /// The root of its agents' workspaces, if it has one.
    workspace_root: Option<std::path::PathBuf>,
    work: WorkQueue,
    /// How many sessions are placed here.
    sessions: usize,
    /// The hosts this runner may emit to (those of the sessions placed on it), with where their actions go.
    hosts: HashMap<HostId, Arc<dyn ChatSink>>,
}

/// A session whose agent is starting, and where its creation's outcome goes.
type Starting = (SessionKey, Arc<dyn ChatSink>);

struct PlacedTurn {
    runner: u64,
    sink: Arc<dyn ChatSink>,
    chat: String,
    turn_id: String,
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
    fn for_agent(self, agent: &str) -> PlacementError {
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

    fn add(&self, hello: pb::RunnerHello, work: WorkQueue) -> u64 {
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
    fn workspace_root(&self, agent: &str) -> Option<std::path::PathBuf> {
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
    fn place(
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

    fn send(state: &PoolState, runner: u64, work: Work) -> Result<(), Refused> {
        match state.runners.get(&runner) {
            Some(runner) => runner.work.send(pb::RunnerWork { work: Some(work) }),
            None => Err(Refused::Gone),
        }
    }

    fn create_session(
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

    fn start_turn(
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
    fn start_terminal(
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
    async fn adopt_terminal(
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
    fn terminal_work(&self, agent: &str, key: &TerminalKey, work: pb::terminal_work::Work) {
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
    fn control(&self, turn: u64, control: &TurnControl) {
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

    fn dispose_session(&self, key: &SessionKey) {
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

    /// One report of a registered runner.
    fn report(&self, runner: u64, report: Report) {
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
    fn session_sink(
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

    fn sink(&self, runner: u64, host: Option<&pb::HostKey>) -> Option<Arc<dyn ChatSink>> {
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
    fn runner_lost(&self, runner: u64) {
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

/// An agent of the agents file, run by the registered runners.
pub struct RemoteAgent {
    info: AgentInfo,
    pool: Arc<RunnerPool>,
}

impl RemoteAgent {
    /// `info` is how the agent is listed until a runner reports more (e.g. its models).
    pub fn new(info: AgentInfo, pool: Arc<RunnerPool>) -> Self {
        Self { info, pool }
    }
}

/// End a turn that could not be placed (from a task: the host holds its lock while starting a turn).
fn fail_later(sink: Arc<dyn ChatSink>, request: &TurnRequest, error: PlacementError) {
    let mut mapper = TurnMapper::new(request.chat.clone(), request.turn_id.clone(), sink);
    tokio::spawn(async move { mapper.fail("agentUnavailable", &error.to_string(), true) });
}

impl Provider for RemoteAgent {
    fn info(&self) -> AgentInfo {
        self.pool
            .listings
            .lock()
            .get(&self.info.provider)
            .cloned()
            .unwrap_or_else(|| self.info.clone())
    }

    fn session_config_schema(&self) -> Option<ahp_types::state::SessionConfigSchema> {
        self.pool.settings.lock().get(&self.info.provider).cloned()
    }

    fn workspace_root(&self) -> Option<std::path::PathBuf> {
        self.pool.workspace_root(&self.info.provider)
    }

    fn create_session(&self, request: SessionRequest, sink: Arc<dyn ChatSink>) -> SessionStart {
        match self.pool.create_session(&self.info.provider, &request, &sink) {
            Ok(()) => SessionStart::Pending,
            Err(error) => SessionStart::Refused(error.to_string()),
        }
    }

    fn start_turn(&self, request: TurnRequest, sink: Arc<dyn ChatSink>) -> TurnHandle {
        let (control_tx, mut control_rx) = mpsc::unbounded_channel();
        let handle = TurnHandle::new(control_tx);
        match self.pool.start_turn(&self.info.provider, &request, &sink) {
            Ok(turn) => {
                let pool = self.pool.clone();
                tokio::spawn(async move {
                    while let Some(control) = control_rx.recv().await {
                        let ended = matches!(control, TurnControl::Cancelled);
                        pool.control(turn, &control);
                        if ended {
                            break;
                        }
                    }
                    pool.control(turn, &TurnControl::Cancelled);
                });
            }
            Err(error) => fail_later(sink, &request, error),
        }
        handle
    }

    fn runs_terminals(&self) -> bool {
        true
    }

    fn start_terminal(&self, request: TerminalRequest, sink: Arc<dyn ChatSink>) -> TerminalStarted {
        match self.pool.start_terminal(&self.info.provider, &request, &sink) {
            Ok(answered) => answered,
            Err(error) => relay_runner::provider::terminal_answer(Err(error.to_string())),
        }
    }

    fn terminal_input(&self, terminal: &TerminalKey, data: &str) {
        self.pool.terminal_work(
            &self.info.provider,
            terminal,
            pb::terminal_work::Work::Input(data.to_string()),
        );
    }

    fn terminal_resized(&self, terminal: &TerminalKey, cols: i64, rows: i64) {
        self.pool.terminal_work(
            &self.info.provider,
            terminal,
            pb::terminal_work::Work::Resize(pb::TerminalSize { cols, rows }),
        );
    }

    fn kill_terminal(&self, terminal: &TerminalKey) {
        self.pool
            .terminal_work(&self.info.provider, terminal, pb::terminal_work::Work::Kill(true));
    }

    fn runs_elsewhere(&self) -> bool {
        true
    }

    fn adopt_terminal(
        &self,
        terminal: &TerminalKey,
        session: &str,
        sink: Arc<dyn ChatSink>,
    ) -> TerminalStarted {
        let (answer, answered) = oneshot::channel();
        let adoption = self.pool.clone().adopt_terminal(
            self.info.provider.clone(),
            terminal.clone(),
            session.to_string(),
            sink,
        );
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move {
                let _ = answer.send(adoption.await);
            })),
            Err(_) => return relay_runner::provider::terminal_answer(Err("no runtime".into())),
        }
        answered
    }

    fn dispose_session(&self, tenant: &str, host: &str, session: &str) {
        self.pool.dispose_session(&SessionKey {
            tenant: tenant.to_string(),
            host: host.to_string(),
            session: session.to_string(),
        });
    }
}

/// The `Runners` gRPC service: where runners register.
pub struct RunnersService {
    pool: Arc<RunnerPool>,
}

impl RunnersService {
    pub fn new(pool: Arc<RunnerPool>) -> Self {
        Self { pool }
    }

    /// The service behind the internal credential check.
    pub fn into_server(
        self,
        credential: &InternalCredential,
    ) -> InterceptedService<RunnersServer<Self>, CredentialCheck> {
        let server = RunnersServer::new(self)
            .max_decoding_message_size(crate::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::MAX_MESSAGE_BYTES);
        InterceptedService::new(server, credential.check())
    }
}

type WorkStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::RunnerWork, Status>> + Send>>;

#[tonic::async_trait]
impl Runners for RunnersService {
    type RegisterStream = WorkStream;

    async fn register(
        &self,
        request: Request<Streaming<pb::RunnerReport>>,
    ) -> Result<Response<WorkStream>, Status> {
        let mut reports = request.into_inner();
        let hello = match reports.message().await? {
            Some(pb::RunnerReport {
                report: Some(Report::Hello(hello)),
            }) => hello,
            _ => {
                return Err(Status::invalid_argument(
                    "a runner's first report must be its RunnerHello",
                ))
            }
        };
        let (work_tx, work_rx) = WorkQueue::new();
        let runner = self.pool.add(hello, work_tx);
        let pool = self.pool.clone();
        tokio::spawn(async move {
            loop {
                match reports.message().await {
                    Ok(Some(pb::RunnerReport { report: Some(report) })) => {
                        // An agent's action waits for its host's room before the next report is read: a host
                        // whose store is behind slows this runner's stream, and so its agents and terminals.
                        let host = match &report {
                            Report::Action(action) => action.host.clone(),
                            _ => None,
                        };
                        pool.report(runner, report);
                        if let Some(room) = pool.sink(runner, host.as_ref()).and_then(|sink| sink.room()) {
                            room.await;
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(error) => {
                        tracing::warn!(runner, %error, "agent runner stream failed");
                        break;
                    }
                }
            }
            pool.runner_lost(runner);
        });
        Ok(Response::new(Box::pin(work_rx.map(Ok))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
