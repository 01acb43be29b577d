//! Devices' terminals: `createTerminal` and `disposeTerminal`, what devices dispatch to a terminal they opened
//! (`terminal/input`, `resized`, `claimed`, `titleChanged`, `cleared`), and terminals taken over after a restart.
//! A chat's `!command`, run in a terminal of this kind, is [`super::command_turns`].
//!
//! The host opens the terminal's channel (listed in root state `terminals`), then asks the session's provider to
//! start its process — a shell on a pseudoterminal in the session's sandbox, wherever the session's agent runs
//! (in-process in `serve`, on its runner in the distributed shape); a start that fails closes the channel again.
//! The output arrives as server actions like an agent's. Members type, resize, rename, clear and pass the claim
//! on; viewers watch. An agent's own terminals stay read-only. `--device-terminals false` switches devices'
//! terminals off for a deployment.

use std::sync::Arc;
use std::time::Duration;

use ahp_types::actions::StateAction;
use ahp_types::commands::{CreateTerminalParams, DisposeTerminalParams};
use ahp_types::state::{TerminalClaim, TerminalLifecycleState, TerminalRunningLifecycleState, TerminalState};
use relay_core::link::CommandReply;
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::ConnectionId;
use relay_runner::{Provider, TerminalKey, TerminalRequest};

use crate::host::{Host, HostCore};
use crate::model::{ChannelKind, CommandTurn, DeviceTerminal, TERMINAL_SCHEME};
use crate::reply::{answer, reply, CommandResult};
use crate::validate::MAX_TERMINAL_TITLE;

/// How long a terminal may take to start.
pub(crate) const START_PATIENCE: Duration = Duration::from_secs(30);
/// How often a loaded session asks again for a running terminal no provider said it holds.
const ADOPTION_RETRY: Duration = Duration::from_secs(1);
impl Host {
    /// `createTerminal`: open the channel, start the process, answer once it runs (or refuse and close it).
    pub(crate) async fn create_terminal(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> CommandReply {
        let (opened, _unit) = self.with_core_as(Some(connection), |core| {
            core.open_device_terminal(connection, message)
                .map(|(provider, request)| (provider, request, core.sink.clone(), core.seq.barrier()))
        });
        let (provider, request, sink, barrier) = match opened {
            Ok(opened) => opened,
            Err(error) => return answer(message.id, Err(error)),
        };
        let Some(host) = self.with_core(|core| core.host.upgrade()) else {
            return answer(message.id, Err(RpcError::internal("the host is going away")));
        };
        // The start is the host's, not the request's: a request dropped meanwhile (its client gone, the
        // gateway's call timeout) still leaves the terminal running or closed, never open with no process.
        let started = tokio::spawn(async move {
            host.wait_committed(barrier).await;
            let key = request.key.clone();
            let failure =
                match tokio::time::timeout(START_PATIENCE, provider.start_terminal(request, sink)).await {
                    Ok(Ok(Ok(()))) => None,
                    Ok(Ok(Err(error))) => Some(error),
                    Ok(Err(_)) => Some("the process that was to run it went away".to_string()),
                    Err(_) => Some(format!("it did not start within {}s", START_PATIENCE.as_secs())),
                };
            if let Some(failure) = &failure {
                provider.kill_terminal(&key);
                let barrier = host.with_core(|core| {
                    core.close_terminal(&key.uri);
                    core.seq.barrier()
                });
                host.wait_committed(barrier).await;
                tracing::debug!(terminal = %key.uri, %failure, "a terminal did not start");
            }
            failure
        });
        match started.await {
            Ok(None) => answer(message.id, reply(message.id, &())),
            Ok(Some(failure)) => answer(
                message.id,
                Err(RpcError::internal(format!(
                    "cannot start the terminal: {failure}"
                ))),
            ),
            Err(_) => answer(
                message.id,
                Err(RpcError::internal("the terminal's start was lost")),
            ),
        }
    }
}

impl HostCore {
    /// Take over the processes of running devices' terminals a loaded session holds (the host moved here, or was
    /// loaded again): each provider that still runs one goes on sending its output here. One no provider runs any
    /// more ends as exited; a `!command`'s is killed, since its turn ended with the restore.
    pub(crate) fn adopt_terminals(&mut self, adopting: Vec<(String, String, DeviceTerminal)>) {
        if adopting.is_empty() {
            return;
        }
        let (Some(host), Ok(runtime)) = (self.host.upgrade(), tokio::runtime::Handle::try_current()) else {
            for (uri, _, _) in adopting {
                self.apply_server_action(
                    &uri,
                    StateAction::TerminalExited(ahp_types::actions::TerminalExitedAction { exit_code: None }),
                );
            }
            return;
        };
        for (uri, session, device) in adopting {
            let key = self.terminal_key(&uri);
            let provider = self.providers.get(&device.provider).cloned();
            let sink = self.sink.clone();
            let host = host.clone();
            runtime.spawn(async move {
                // Its runner may not be registered here yet (it reconnects with back-off after the shard it had
                // went): asked again until the start's patience runs out.
                let deadline = tokio::time::Instant::now() + START_PATIENCE;
                let mut taken = false;
                while let Some(provider) = &provider {
                    let answer = provider.adopt_terminal(&key, &session, sink.clone());
                    taken = matches!(tokio::time::timeout_at(deadline, answer).await, Ok(Ok(Ok(()))));
                    let later =
                        provider.runs_elsewhere() && tokio::time::Instant::now() + ADOPTION_RETRY < deadline;
                    if taken || !later {
                        break;
                    }
                    tokio::time::sleep(ADOPTION_RETRY).await;
                }
                let keep = host.with_core(|core| {
                    let running = core
                        .model
                        .terminals
                        .get(&uri)
                        .is_some_and(|record| record.runs_here());
                    if !taken && running {
                        core.apply_server_action(
                            &uri,
                            StateAction::TerminalExited(ahp_types::actions::TerminalExitedAction {
                                exit_code: None,
                            }),
                        );
                    }
                    running && device.command_turn.is_none()
                });
                if taken && !keep {
                    // Disposed while it was taken over, or a `!command` whose turn ended: it goes (its exit follows).
                    if let Some(provider) = provider {
                        provider.kill_terminal(&key);
                    }
                }
                tracing::debug!(terminal = %key.uri, taken, "a running terminal of a loaded session");
            });
        }
    }

    pub(crate) fn terminal_key(&self, uri: &str) -> TerminalKey {
        TerminalKey {
            tenant: self.key.tenant.clone(),
            host: self.key.host.clone(),
            uri: uri.to_string(),
        }
    }

    /// Check a `createTerminal` and open its channel: the provider to start it and what to ask.
    pub(crate) fn open_device_terminal(
        &mut self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> Result<(Arc<dyn Provider>, TerminalRequest), RpcError> {
        let client_id = self.client_id(connection)?;
        if !self.connection(connection)?.identity.role.can_write() {
            return Err(RpcError::permission_denied(
                "viewers may watch terminals, not open them",
            ));
        }
        if !self.limits.device_terminals {
            return Err(RpcError::permission_denied(
                "terminals are switched off on this relay (--device-terminals false)",
            ));
        }
        let params: CreateTerminalParams = message.parse_params()?;
        let uri = params.channel.clone();
        if !uri.starts_with(&format!("{TERMINAL_SCHEME}/")) || uri.len() > 1024 {
            return Err(RpcError::invalid_params(format!(
                "a terminal's channel is an {TERMINAL_SCHEME}/… URI (at most 1024 characters)"
            )));
        }
        if self.model.kind(&uri) != ChannelKind::Unknown {
            return Err(RpcError::new(
                ahp_types::errors::ahp_error_codes::ALREADY_EXISTS,
                format!("{uri} already exists"),
            ));
        }
        let session =
            match &params.claim {
                TerminalClaim::Session(claim) => claim.session.clone(),
                TerminalClaim::Client(claim) => {
                    if claim.client_id != client_id {
                        return Err(RpcError::invalid_params(
                            "a client claim names the client creating the terminal",
                        ));
                    }
                    let named = params
                        .meta
                        .as_ref()
                        .and_then(|meta| meta.get(crate::model::TERMINAL_SESSION_META))
                        .and_then(|session| session.as_str())
                        .map(str::to_string);
                    // A client that follows the spec alone names a `cwd`: the session whose directory holds it.
                    match named.or_else(|| params.cwd.as_deref().and_then(|cwd| self.session_holding(cwd))) {
                        Some(session) => session,
                        None => return Err(RpcError::invalid_params(
                            "name where the terminal runs: a cwd inside a session's working directory, or a \
                             session claim",
                        )),
                    }
                }
            };
        let (provider, request) = self.terminal_request(&session, &uri, params.cwd.clone(), None)?;
        if !provider.runs_terminals() {
            return Err(RpcError::invalid_params(
                "this session's agent has no workspace to open a terminal in: open it in a session of an agent \
                 that has one",
            ));
        }
        // A token scoped to hosts opens terminals in their directories only.
        let tenant_root = self
            .providers
            .files()
            .and_then(|files| files.tenant_root(&self.key.tenant));
        for directory in [&request.cwd, &request.working_directory].into_iter().flatten() {
            crate::workspace::host_scope::check_directory(
                &self.connection(connection)?.identity,
                tenant_root.as_deref(),
                directory,
            )?;
        }
        if [params.cols, params.rows]
            .into_iter()
            .flatten()
            .any(|size| !(1..=1000).contains(&size))
        {
            return Err(RpcError::invalid_params("cols and rows are 1 to 1000"));
        }
        let title = params
            .name
            .clone()
            .filter(|name| !name.trim().is_empty())
            .unwrap_or_else(|| "Terminal".into());
        // The size it runs at (80×24 unless asked), said in its state too.
        let (cols, rows) = (params.cols.unwrap_or(80), params.rows.unwrap_or(24));
        let state = TerminalState {
            title: cut(&title, MAX_TERMINAL_TITLE),
            // Where it runs, said to every device: the directory named, else the session's.
            cwd: request.cwd.clone().or_else(|| request.working_directory.clone()),
            cols: Some(cols),
            rows: Some(rows),
            content: Vec::new(),
            lifecycle: TerminalLifecycleState::Running(TerminalRunningLifecycleState {}),
            claim: params.claim.clone(),
            supports_command_detection: None,
            is_pty: Some(true),
        };
        let request = TerminalRequest {
            cols,
            rows,
            ..request
        };
        self.open_device_channel(
            &session,
            &uri,
            state,
            provider_id(&provider),
            None,
            Some(client_id),
        )?;
        Ok((provider, request))
    }

    /// The session of this host whose working directory holds `cwd` (a `file://` URI or a path): the one whose
    /// directory is the deepest such.
    pub(crate) fn session_holding(&self, cwd: &str) -> Option<String> {
        let path = |uri: &str| std::path::PathBuf::from(uri.strip_prefix("file://").unwrap_or(uri));
        let cwd = path(cwd);
        if cwd
            .components()
            .any(|part| part == std::path::Component::ParentDir)
        {
            return None;
        }
        self.model
            .sessions
            .keys()
            .filter_map(|uri| {
                let directory = path(&self.working_directory_of(uri)?);
                cwd.starts_with(&directory)
                    .then(|| (directory.components().count(), uri.clone()))
            })
            .max()
            .map(|(_, uri)| uri)
    }

    /// The provider of `session` and what to ask it for a terminal `uri` there.
    pub(crate) fn terminal_request(
        &self,
        session: &str,
        uri: &str,
        cwd: Option<String>,
        command: Option<String>,
    ) -> Result<(Arc<dyn Provider>, TerminalRequest), RpcError> {
        let record = self
            .model
            .sessions
            .get(session)
            .ok_or_else(|| RpcError::session_not_found(session))?;
        let provider = self
            .providers
            .get(&record.state.provider)
            .cloned()
            .ok_or_else(|| RpcError::internal("this session's agent is not configured here"))?;
        Ok((
            provider,
            TerminalRequest {
                key: self.terminal_key(uri),
                session: session.to_string(),
                working_directory: record
                    .state
                    .working_directories
                    .as_ref()
                    .and_then(|dirs| dirs.first().cloned()),
                cwd,
                cols: 80,
                rows: 24,
                command,
            },
        ))
    }

    pub(crate) fn open_device_channel(
        &mut self,
        session: &str,
        uri: &str,
        state: TerminalState,
        provider: String,
        command_turn: Option<CommandTurn>,
        opened_by: Option<String>,
    ) -> Result<(), RpcError> {
        let device = DeviceTerminal {
            provider,
            command_turn,
            opened_by,
        };
        if !self.open_terminal_of(session, uri, state, Some(device)) {
            return Err(RpcError::invalid_request(
                "this session holds its maximum of running terminals: dispose one first",
            ));
        }
        Ok(())
    }

    /// A terminal that did not start: its channel goes.
    pub(crate) fn close_terminal(&mut self, uri: &str) {
        self.dispose_terminal(uri);
        self.sync_terminal_list();
    }

    /// `disposeTerminal`: kill a device's terminal and remove it.
    pub(crate) fn dispose_terminal_command(
        &mut self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> CommandResult {
        if !self.connection(connection)?.identity.role.can_write() {
            return Err(RpcError::permission_denied(
                "viewers may watch terminals, not dispose them",
            ));
        }
        let params: DisposeTerminalParams = message.parse_params()?;
        let Some(record) = self.model.terminals.get(&params.channel) else {
            return Err(RpcError::not_found(&params.channel));
        };
        let client_id = self.client_id(connection)?;
        let holder = match &record.state.claim {
            TerminalClaim::Client(holder) => Some(holder.client_id.as_str()),
            TerminalClaim::Session(_) => None,
        };
        let opener = record
            .device
            .as_ref()
            .and_then(|device| device.opened_by.as_deref());
        if holder.is_some_and(|holder| holder != client_id) && opener != Some(client_id.as_str()) {
            return Err(RpcError::permission_denied(
                "the terminal is claimed by another client: only its holder or the client that opened it may \
                 dispose it",
            ));
        }
        let Some(device) = record.device.clone() else {
            if matches!(record.state.lifecycle, TerminalLifecycleState::Running(_)) {
                return Err(RpcError::permission_denied(
                    "this terminal runs an agent's command: it ends with the command (or the agent's turn)",
                ));
            }
            self.close_terminal(&params.channel);
            return reply(message.id, &());
        };
        if let Some(provider) = self.providers.get(&device.provider) {
            provider.kill_terminal(&self.terminal_key(&params.channel));
        }
        // A `!command`'s turn ends with its terminal (its exit will find no channel): killed, with what it
        // printed so far.
        let running = matches!(record.state.lifecycle, TerminalLifecycleState::Running(_));
        if let (true, Some(turn)) = (running, &device.command_turn) {
            self.finish_command_turn(&params.channel, turn, None);
        }
        self.close_terminal(&params.channel);
        reply(message.id, &())
    }

    /// After an accepted action on a terminal: devices' input and size reach its process; a `!command`'s exit
    /// completes its chat turn.
    pub(crate) fn terminal_side_effects(&mut self, uri: &str, action: &StateAction) {
        // Output (the bulk of a terminal's actions) has none: nothing is looked up for it.
        if !matches!(
            action,
            StateAction::TerminalInput(_) | StateAction::TerminalResized(_) | StateAction::TerminalExited(_)
        ) {
            return;
        }
        let Some(device) = self
            .model
            .terminals
            .get(uri)
            .and_then(|record| record.device.clone())
        else {
            return;
        };
        let provider = self.providers.get(&device.provider).cloned();
        let key = self.terminal_key(uri);
        match action {
            StateAction::TerminalInput(input) => {
                if let Some(provider) = provider {
                    provider.terminal_input(&key, &input.data);
                }
            }
            StateAction::TerminalResized(size) => {
                if let Some(provider) = provider {
                    provider.terminal_resized(&key, size.cols, size.rows);
                }
            }
            StateAction::TerminalExited(exited) => {
                if let Some(turn) = device.command_turn {
                    self.finish_command_turn(uri, &turn, exited.exit_code);
                }
            }
            _ => {}
        }
    }
}

pub(crate) fn provider_id(provider: &Arc<dyn Provider>) -> String {
    provider.info().provider
}

/// `text` cut to at most `max` characters, with an ellipsis when that cut anything.
pub(crate) fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}
