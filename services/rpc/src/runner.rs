//! The `ahp-relay runner` side of the `Runners` service: registers with every shard, runs the sessions and
//! turns a shard places here on this process's providers (the ACP agents of its agents file), and streams
//! what the agents emit back to that shard.
//!
//! Each shard connection has its own providers: when the stream to a shard ends (it stopped, or the network
//! failed), every agent started for it is stopped, and the runner registers again with back-off. The shard
//! places the sessions again on their next prompt, where the agents continue their ACP sessions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ahp_types::actions::{SessionCreationFailedAction, StateAction};
use ahp_types::state::ErrorInfo;
use relay_runner::{
    ChatSink, Provider, SessionRequest, SessionStart, TerminalKey, TerminalRequest, TurnControl, TurnHandle,
    TurnRequest,
};
use tokio::sync::mpsc;
use tonic::transport::Endpoint;

use crate::credential::InternalCredential;
use crate::pb;
use crate::pb::runner_report::Report;
use crate::pb::runner_work::Work;
use crate::pb::runners_client::RunnersClient;
use crate::runner_stream::*;
use relay_runner::files::{FileAccess, FileError, FileOp, FileReply, WatchHandle, WatchSpec};

/// Makes a fresh set of providers for one shard connection.
pub type ProviderFactory = Arc<dyn Fn() -> Vec<Arc<dyn Provider>> + Send + Sync>;

/// How a runner reaches its shards.
#[derive(Clone)]
pub struct RunnerConfig {
    /// This runner's name in the shards' logs.
    pub name: String,
    /// The shards' gRPC URLs.
    pub shards: Vec<String>,
    pub credential: InternalCredential,
    pub providers: ProviderFactory,
    /// How many shards this runner is registered with now (its readiness).
    pub registrations: Arc<AtomicUsize>,
    /// The tenants this runner is dedicated to (empty: any tenant).
    pub tenants: Vec<String>,
    /// TLS to `https://` shards.
    pub tls: crate::LinkTls,
    /// Tenants' files in this runner's workspace, which shards reach through it.
    pub files: Option<Arc<dyn FileAccess>>,
}

/// Why one registration with a shard ended.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("invalid shard URL {0}")]
    Url(String),
    #[error("{0}")]
    Tls(String),
    #[error("cannot reach the shard: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("the shard refused or ended the registration: {0}")]
    Status(#[from] tonic::Status),
}

/// Serve every shard of `config` until the process stops (registrations are retried for ever).
pub async fn run(config: RunnerConfig) {
    let mut tasks = tokio::task::JoinSet::new();
    for shard in config.shards.clone() {
        let config = config.clone();
        tasks.spawn(async move { follow(shard, config).await });
    }
    while tasks.join_next().await.is_some() {}
}

/// Register with one shard again and again, with back-off after failures.
async fn follow(shard: String, config: RunnerConfig) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match serve_once(&shard, &config).await {
            Ok(()) => {
                tracing::info!(%shard, "the shard ended this runner's registration; registering again");
                backoff = Duration::from_millis(100);
            }
            Err(error) => {
                tracing::warn!(%shard, %error, "runner registration failed; retrying");
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
        tokio::time::sleep(jittered(backoff)).await;
    }
}

/// `delay` plus up to half of it again, so runners that lost a shard together do not return in step.
fn jittered(delay: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    delay + delay.mul_f64(f64::from(nanos % 1000) / 2000.0)
}

/// One registration: serve the shard's work until its stream ends.
async fn serve_once(shard: &str, config: &RunnerConfig) -> Result<(), RunnerError> {
    let endpoint = Endpoint::from_shared(shard.to_string())
        .map_err(|_| RunnerError::Url(shard.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let endpoint = config
        .tls
        .apply(shard, endpoint)
        .map_err(|error| RunnerError::Tls(error.to_string()))?;
    let channel = endpoint.connect().await?;
    let mut client = RunnersClient::with_interceptor(channel, config.credential.clone())
        .max_decoding_message_size(crate::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(crate::MAX_MESSAGE_BYTES);
    let providers: HashMap<String, Arc<dyn Provider>> = (config.providers)()
        .into_iter()
        .map(|provider| (provider.info().provider, provider))
        .collect();
    let (reports, outgoing) = mpsc::unbounded_channel();
    let outbox = Arc::new(Outbox::default());
    let hello = pb::RunnerHello {
        name: config.name.clone(),
        agents: providers.keys().cloned().collect(),
        tenants: config.tenants.clone(),
        workspace_root: providers
            .values()
            .find_map(|provider| provider.workspace_root())
            .map(|root| root.display().to_string())
            .unwrap_or_default(),
    };
    let _ = reports.send(pb::RunnerReport {
        report: Some(Report::Hello(hello)),
    });
    let mut work = client
        .register(Outbox::drain(outbox.clone(), outgoing))
        .await?
        .into_inner();
    tracing::info!(%shard, agents = providers.len(), "registered with the shard");
    let _registered = Registered::new(config.registrations.clone());
    let mut session = ShardSession {
        providers,
        turns: HashMap::new(),
        reports,
        tenants: config.tenants.clone(),
        files: config.files.clone(),
        watches: Arc::default(),
        ended: Arc::default(),
        outbox,
    };
    while let Some(item) = work.message().await? {
        if let Some(item) = item.work {
            session.handle(item);
        }
    }
    Ok(())
    // Dropping the providers stops every agent started for this shard.
}

/// What runs for one shard connection.
struct ShardSession {
    providers: HashMap<String, Arc<dyn Provider>>,
    /// The running turns, by the shard's number (dropping a handle cancels its turn).
    turns: HashMap<u64, TurnHandle>,
    reports: mpsc::UnboundedSender<pb::RunnerReport>,
    /// The tenants this runner is dedicated to (empty: any).
    tenants: Vec<String>,
    files: Option<Arc<dyn FileAccess>>,
    /// The watches a shard opened, by its number (dropping one stops it; all go with the registration); `None`
    /// while one is being made (an `Unwatch` then removes it, and the handle made is dropped).
    watches: Arc<parking_lot::Mutex<HashMap<u64, Option<WatchHandle>>>>,
    /// Set when the registration ended: its sinks reach nobody from then on, whatever the stream's buffers do.
    ended: Arc<AtomicBool>,
    /// What agents' actions, watch changes and file answers wait to go to the shard.
    outbox: Arc<Outbox>,
}

impl Drop for ShardSession {
    fn drop(&mut self) {
        self.ended.store(true, Ordering::Release);
    }
}

impl ShardSession {
    /// A file operation of a shard: run on the tenant's files here, answered with its id; a watch's changes
    /// follow as FileChanged reports under the shard's number for it.
    fn file(&mut self, request: pb::FileRequest) {
        let reports = self.reports.clone();
        let counted = self.outbox.clone();
        // An answer (a file read may be 16 MiB) is counted in the outbox too, so agents wait while answers fill
        // it; answers themselves are few (one per request the shard made) and do not wait.
        let answer = move |result: Result<FileReply, FileError>| {
            let result = serde_json::to_vec(&result).unwrap_or_default();
            let size = result.len();
            counted.bytes.fetch_add(size, Ordering::AcqRel);
            let sent = reports.send(pb::RunnerReport {
                report: Some(Report::FileAnswer(pb::FileAnswer {
                    id: request.id,
                    result,
                })),
            });
            if sent.is_err() {
                counted.bytes.fetch_sub(size, Ordering::AcqRel);
            }
        };
        let op: FileOp = match serde_json::from_slice(&request.op) {
            Ok(op) => op,
            Err(error) => {
                return answer(Err(FileError::Invalid(format!(
                    "unreadable file operation: {error}"
                ))))
            }
        };
        let Some(files) = self.files.clone().filter(|_| self.serves(&request.tenant)) else {
            return answer(Err(FileError::Unavailable(
                "this runner holds no workspace for this tenant".into(),
            )));
        };
        let tenant = request.tenant;
        let scope = request.host_scope;
        match op {
            FileOp::Watch {
                watch,
                path,
                recursive,
                includes,
                excludes,
            } => {
                let (changes_tx, mut changes) = relay_runner::files::change_channel();
                let reports = self.reports.clone();
                let watches = self.watches.clone();
                let (outbox, ended) = (self.outbox.clone(), self.ended.clone());
                watches.lock().insert(watch, None);
                tokio::spawn(async move {
                    let spec = WatchSpec {
                        path,
                        recursive,
                        includes,
                        excludes,
                    };
                    match files
                        .watch_within(&tenant, scope.as_deref(), spec, changes_tx)
                        .await
                    {
                        Ok(handle) => {
                            let mut held = watches.lock();
                            match held.get_mut(&watch) {
                                Some(slot) => *slot = Some(handle),
                                // Unwatched while it was being made: it stops at once.
                                None => {
                                    drop(held);
                                    drop(handle);
                                    return answer(Ok(FileReply::Done));
                                }
                            }
                            drop(held);
                            answer(Ok(FileReply::Done));
                        }
                        Err(error) => {
                            watches.lock().remove(&watch);
                            return answer(Err(error));
                        }
                    }
                    // A batch waits for room in the outbox, as agents' actions do; a watch whose changes keep
                    // coming meanwhile overflows (its sink's backlog) and ends, and the shard makes it again.
                    while let Some(batch) = changes.recv().await {
                        outbox.clone().room(ended.clone()).await;
                        let changes = serde_json::to_vec(&batch).unwrap_or_default();
                        outbox.bytes.fetch_add(changes.len(), Ordering::AcqRel);
                        let size = changes.len();
                        let sent = reports.send(pb::RunnerReport {
                            report: Some(Report::FileChanged(pb::FileChanged { watch, changes })),
                        });
                        if sent.is_err() {
                            outbox.bytes.fetch_sub(size, Ordering::AcqRel);
                        }
                    }
                    // The file server went (restarted) while the shard still watches: it is told the watch
                    // ended (a report with no changes), and makes it again.
                    if watches.lock().remove(&watch).is_some() {
                        let _ = reports.send(pb::RunnerReport {
                            report: Some(Report::FileChanged(pb::FileChanged {
                                watch,
                                changes: Vec::new(),
                            })),
                        });
                    }
                });
            }
            FileOp::Unwatch { watch } => {
                self.watches.lock().remove(&watch);
                answer(Ok(FileReply::Done));
            }
            op => {
                tokio::spawn(async move { answer(files.call_within(&tenant, scope.as_deref(), op).await) });
            }
        }
    }

    /// Start a terminal in a session placed here; the shard learns how it went from a TerminalStarted.
    fn start_terminal(&self, start: pb::StartTerminal) {
        let reports = self.reports.clone();
        let answer = move |error: String| {
            let _ = reports.send(pb::RunnerReport {
                report: Some(Report::TerminalStarted(pb::TerminalStarted {
                    id: start.id,
                    error,
                })),
            });
        };
        let request: TerminalRequest = match serde_json::from_slice(&start.request) {
            Ok(request) => request,
            Err(error) => return answer(format!("unreadable terminal request: {error}")),
        };
        let Some(provider) = self
            .providers
            .get(&start.agent)
            .filter(|_| self.serves(&request.key.tenant))
            .cloned()
        else {
            return answer(format!(
                "this runner has no agent {} for this tenant",
                start.agent
            ));
        };
        let sink = self.sink(&request.key.tenant, &request.key.host, &request.session);
        let started = provider.start_terminal(request, sink);
        tokio::spawn(async move {
            let error = match started.await {
                Ok(Ok(())) => String::new(),
                Ok(Err(error)) => error,
                Err(_) => "the terminal's start was abandoned".into(),
            };
            answer(error);
        });
    }

    fn sink(&self, tenant: &str, host: &str, session: &str) -> Arc<dyn ChatSink> {
        Arc::new(StreamSink {
            host: pb::HostKey {
                tenant: tenant.to_string(),
                host: host.to_string(),
            },
            session: session.to_string(),
            reports: self.reports.clone(),
            ended: self.ended.clone(),
            outbox: self.outbox.clone(),
        })
    }

    /// Whether this runner takes work of `tenant` (a shard placing another tenant's session here is refused:
    /// the dedication holds even against a shard's mistake).
    fn serves(&self, tenant: &str) -> bool {
        self.tenants.is_empty() || self.tenants.iter().any(|t| t == tenant)
    }

    /// Take over a terminal still running here for a host that moved to this shard; answered like a start.
    fn adopt_terminal(&self, adopt: pb::AdoptTerminal) {
        let reports = self.reports.clone();
        let id = adopt.id;
        let answer = move |error: String| {
            let _ = reports.send(pb::RunnerReport {
                report: Some(Report::TerminalStarted(pb::TerminalStarted { id, error })),
            });
        };
        let Some(host) = adopt.host.filter(|host| self.serves(&host.tenant)) else {
            return answer("this runner serves no such host".into());
        };
        let Some(provider) = self.providers.get(&adopt.agent).cloned() else {
            return answer(format!("this runner has no agent {}", adopt.agent));
        };
        let key = TerminalKey {
            tenant: host.tenant.clone(),
            host: host.host.clone(),
            uri: adopt.uri,
        };
        let sink = self.sink(&host.tenant, &host.host, &adopt.session);
        let adopted = provider.adopt_terminal(&key, &adopt.session, sink);
        tokio::spawn(async move {
            answer(match adopted.await {
                Ok(Ok(())) => String::new(),
                Ok(Err(error)) => error,
                Err(_) => "the takeover was abandoned".into(),
            });
        });
    }

    fn handle(&mut self, work: Work) {
        match work {
            Work::AdoptTerminal(adopt) => self.adopt_terminal(adopt),
            Work::CreateSession(create) => {
                let request: SessionRequest = match serde_json::from_slice(&create.request) {
                    Ok(request) => request,
                    Err(error) => return tracing::error!(%error, "unreadable session request"),
                };
                let sink = self.sink(&request.tenant, &request.host, &request.session);
                if !self.serves(&request.tenant) {
                    return refuse(
                        &*sink,
                        &request.session,
                        "this runner is dedicated to other tenants".into(),
                    );
                }
                let Some(provider) = self.providers.get(&create.agent) else {
                    return refuse(
                        &*sink,
                        &request.session,
                        format!("this runner has no agent {}", create.agent),
                    );
                };
                match provider.create_session(request.clone(), sink.clone()) {
                    SessionStart::Ready => {
                        sink.emit(
                            &request.session,
                            StateAction::SessionReady(ahp_types::actions::SessionReadyAction {}),
                        );
                    }
                    SessionStart::Pending => {}
                    SessionStart::Refused(message) => refuse(&*sink, &request.session, message),
                }
            }
            Work::StartTurn(start) => {
                let request: TurnRequest = match serde_json::from_slice(&start.request) {
                    Ok(request) => request,
                    Err(error) => return tracing::error!(%error, "unreadable turn request"),
                };
                let sink = self.sink(&request.tenant, &request.host, &request.session);
                let Some(provider) = self
                    .providers
                    .get(&start.agent)
                    .filter(|_| self.serves(&request.tenant))
                else {
                    let mut mapper = relay_runner::acp::turn::TurnMapper::new(
                        request.chat.clone(),
                        request.turn_id.clone(),
                        sink,
                    );
                    return mapper.fail(
                        "agentUnavailable",
                        &format!("this runner has no agent {} for this tenant", start.agent),
                        false,
                    );
                };
                let handle = provider.start_turn(request, sink);
                self.turns.insert(start.turn, handle);
            }
            Work::Control(control) => {
                let decoded: TurnControl = match serde_json::from_slice(&control.control) {
                    Ok(decoded) => decoded,
                    Err(error) => return tracing::error!(%error, "unreadable turn control"),
                };
                if matches!(decoded, TurnControl::Cancelled) {
                    // Dropping the handle cancels the turn (a no-op once it finished).
                    self.turns.remove(&control.turn);
                } else if let Some(handle) = self.turns.get(&control.turn) {
                    handle.send(decoded);
                }
            }
            Work::File(request) => self.file(request),
            Work::StartTerminal(start) => self.start_terminal(start),
            Work::Terminal(work) => {
                let (Some(host), Some(what)) = (work.host, work.work) else {
                    return;
                };
                let key = TerminalKey {
                    tenant: host.tenant,
                    host: host.host,
                    uri: work.uri,
                };
                // No agent named: a kill for whichever agent runs it (the shard no longer knows).
                if work.agent.is_empty() {
                    if matches!(what, pb::terminal_work::Work::Kill(_)) {
                        for provider in self.providers.values() {
                            provider.kill_terminal(&key);
                        }
                    }
                    return;
                }
                let Some(provider) = self.providers.get(&work.agent) else {
                    return;
                };
                match what {
                    pb::terminal_work::Work::Input(data) => provider.terminal_input(&key, &data),
                    pb::terminal_work::Work::Resize(size) => {
                        provider.terminal_resized(&key, size.cols, size.rows)
                    }
                    pb::terminal_work::Work::Kill(_) => provider.kill_terminal(&key),
                }
            }
            Work::DisposeSession(dispose) => {
                let Some(host) = dispose.host else { return };
                for provider in self.providers.values() {
                    provider.dispose_session(&host.tenant, &host.host, &dispose.session);
                }
            }
        }
    }
}

/// Tell the shard a session cannot be created, saying why.
fn refuse(sink: &dyn ChatSink, session: &str, message: String) {
    sink.emit(
        session,
        StateAction::SessionCreationFailed(SessionCreationFailedAction {
            error: ErrorInfo {
                error_type: "sessionRefused".into(),
                message,
                stack: None,
                meta: None,
            },
        }),
    );
}

/// Counts one live registration for as long as it lives.
struct Registered(Arc<AtomicUsize>);

impl Registered {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
