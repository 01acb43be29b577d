//! The commands an agent runs through ACP `terminal/*`: each in a sandbox of the agent's session (the same
//! confinement as the agent), in the session's working directory (or a directory inside it: `..`, absolute
//! paths elsewhere and symlinks leading out are refused), with the agent's environment plus the variables the
//! agent names (valid names only), counted against the tenant's running processes and at most
//! `terminals_per_session` at once, and shown to every device as an AHP terminal channel
//! (`ahp-terminal:/…`, listed in root state `terminals`): `terminal/commandExecuted`, the output as
//! `terminal/data` (coalesced), `terminal/commandFinished` and `terminal/exited`.
//!
//! The output the agent reads back (`terminal/output`) keeps at most the agent's `outputByteLimit` (at most
//! [`DEFAULT_OUTPUT_LIMIT`], also when it names none) bytes, cut at the front on a character boundary. The
//! command's output is read no faster than its tenant's output rate and counts toward the session's output
//! budget ([`super::meter`], with the agent's own updates): past it, or past the output budget of a turn for
//! the command alone, the command is killed with a note in its output. A session keeps at most
//! [`KEPT_PER_RUNNING`] times `terminals_per_session` terminals, running or exited: the oldest exited go first. `terminal/kill`, `terminal/release`, a cancelled turn of the terminal's chat, the tenant's
//! workspace going over its quota and the session's agent stopping kill the command's whole sandbox.

use crate::shell_integration::{MarkParser, ShellEvent};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_client_protocol::v1::schema::{CreateTerminalRequest, TerminalExitStatus};
use ahp_types::actions::{
    StateAction, TerminalCommandExecutedAction, TerminalCommandFinishedAction, TerminalDataAction,
    TerminalExitedAction,
};
use ahp_types::state::{
    TerminalClaim, TerminalLifecycleState, TerminalRunningLifecycleState, TerminalSessionClaim, TerminalState,
};
use parking_lot::Mutex;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, watch};

use super::config::AgentConfig;
use crate::provider::ChatSink;

/// Output kept for `terminal/output` when the agent names no limit.
pub const DEFAULT_OUTPUT_LIMIT: usize = 1024 * 1024;
/// How often a running command's output is published at most.
const DATA_EVERY: Duration = Duration::from_millis(40);
/// Terminals a session keeps (running or exited, until released) per running terminal it may have.
pub const KEPT_PER_RUNNING: usize = 4;
/// The one command of an agent's terminal (AHP command ids are scoped to the terminal).
const COMMAND_ID: &str = "1";

/// Why a terminal request was refused.
#[derive(Debug, thiserror::Error)]
pub enum TerminalError {
    #[error("{0}")]
    Outside(#[from] super::fs::FsError),
    #[error("the working directory {0} is not a directory")]
    NotADirectory(String),
    #[error("unknown ACP session {0}")]
    UnknownSession(String),
    #[error("unknown terminal {0}")]
    UnknownTerminal(String),
    #[error("the relay refused to open a terminal for this session (too many running terminals?)")]
    Refused,
    #[error("this session already runs {0} commands (its limit)")]
    TooMany(usize),
    #[error("{0:?} is not a valid environment variable name")]
    InvalidVariable(String),
    #[error("cannot start {command}: {source}")]
    Spawn {
        command: String,
        source: super::sandboxes::StartError,
    },
}

/// One session's terminals.
pub struct Terminals {
    cwd: PathBuf,
    /// Where the session's processes run (sandboxes, tenant, directories).
    place: super::agent_link::Place,
    /// The AHP session the terminals belong to.
    session: String,
    sink: Arc<dyn ChatSink>,
    config: Arc<AgentConfig>,
    env: BTreeMap<String, String>,
    /// The session's output budget, which commands' output counts toward.
    meter: Arc<super::meter::OutputMeter>,
    /// Each ACP session's chat (a terminal is claimed by the chat whose agent session created it).
    chats: Mutex<HashMap<String, String>>,
    running: Mutex<HashMap<String, Arc<Terminal>>>,
}

/// Drop the oldest exited terminals of `terminals` until fewer than `keep` remain (running ones stay).
fn evict_exited(terminals: &mut HashMap<String, Arc<Terminal>>, keep: usize) {
    while terminals.len() >= keep {
        let oldest = terminals
            .iter()
            .filter(|(_, terminal)| terminal.exit.borrow().is_some())
            .min_by_key(|(_, terminal)| terminal.created)
            .map(|(id, _)| id.clone());
        match oldest {
            Some(id) => terminals.remove(&id),
            None => return,
        };
    }
}

/// One command and what it produced.
pub struct Terminal {
    /// Its AHP channel.
    pub uri: String,
    chat: String,
    output: Mutex<Output>,
    exit: watch::Receiver<Option<TerminalExitStatus>>,
    process_group: Option<u32>,
    created: Instant,
}

struct Output {
    text: String,
    truncated: bool,
    limit: usize,
}

impl Output {
    fn push(&mut self, data: &str) {
        self.text.push_str(data);
        if self.text.len() > self.limit {
            let mut cut = self.text.len() - self.limit;
            while !self.text.is_char_boundary(cut) {
                cut += 1;
            }
            self.text.drain(..cut);
            self.truncated = true;
        }
    }
}

impl Terminal {
    /// What the agent reads back: the kept output, whether it was cut, and the exit status once exited.
    pub fn output(&self) -> (String, bool, Option<TerminalExitStatus>) {
        let output = self.output.lock();
        (output.text.clone(), output.truncated, self.exit.borrow().clone())
    }

    /// Wait until the command exits.
    pub async fn wait(&self) -> TerminalExitStatus {
        let mut exit = self.exit.clone();
        let status = match exit.wait_for(Option::is_some).await {
            Ok(status) => status.clone().unwrap_or_default(),
            Err(_) => TerminalExitStatus::new(),
        };
        status
    }

    /// Kill the command's process group (a no-op once it exited).
    pub fn kill(&self) {
        if self.exit.borrow().is_some() {
            return;
        }
        if let Some(group) = self
            .process_group
            .and_then(|pid| rustix::process::Pid::from_raw(pid as i32))
        {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Terminals {
    pub fn new(
        place: super::agent_link::Place,
        session: String,
        sink: Arc<dyn ChatSink>,
        config: Arc<AgentConfig>,
        env: BTreeMap<String, String>,
        meter: Arc<super::meter::OutputMeter>,
    ) -> Self {
        Self {
            cwd: place.dirs.workspace.clone(),
            place,
            session,
            sink,
            config,
            env,
            meter,
            chats: Mutex::default(),
            running: Mutex::default(),
        }
    }

    /// `acp_session`'s terminals are claimed by `chat`.
    pub fn chat_opened(&self, acp_session: &str, chat: &str) {
        self.chats
            .lock()
            .insert(acp_session.to_string(), chat.to_string());
    }

    /// A terminal by its id (its AHP URI).
    pub fn get(&self, id: &str) -> Result<Arc<Terminal>, TerminalError> {
        self.running
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| TerminalError::UnknownTerminal(id.to_string()))
    }

    /// The agent released a terminal: its command is killed; the AHP channel stays (exited) for the devices.
    pub fn release(&self, id: &str) -> Result<(), TerminalError> {
        let terminal = self
            .running
            .lock()
            .remove(id)
            .ok_or_else(|| TerminalError::UnknownTerminal(id.to_string()))?;
        terminal.kill();
        Ok(())
    }

    /// A turn of `chat` was cancelled: kill its running commands.
    pub fn kill_chat(&self, chat: &str) {
        for terminal in self.running.lock().values().filter(|t| t.chat == chat) {
            terminal.kill();
        }
    }

    /// Why the tenant may not start work now, if its workspace is over its quota.
    pub fn workspace_refusal(&self) -> Option<String> {
        self.place
            .sandboxes
            .quotas()
            .workspace_refusal(&self.place.tenant)
            .map(|refusal| refusal.to_string())
    }

    /// Start a command; its id is its AHP terminal URI.
    pub async fn create(&self, request: CreateTerminalRequest) -> Result<String, TerminalError> {
        let directory = match &request.cwd {
            Some(requested) => {
                let directory = super::fs::confine(&self.cwd, requested)?;
                if !directory.is_dir() {
                    return Err(TerminalError::NotADirectory(requested.display().to_string()));
                }
                directory
            }
            None => self.cwd.clone(),
        };
        let chat = self
            .chats
            .lock()
            .get(&*request.session_id.0)
            .cloned()
            .ok_or_else(|| TerminalError::UnknownSession(request.session_id.0.to_string()))?;
        let command_line = std::iter::once(request.command.as_str())
            .chain(request.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        let mut env = self.env.clone();
        for var in &request.env {
            if !super::config::valid_variable_name(&var.name) {
                return Err(TerminalError::InvalidVariable(var.name.clone()));
            }
            env.insert(var.name.clone(), var.value.clone());
        }
        let per_session = self.place.sandboxes.config().terminals_per_session.max(1);
        let running = self
            .running
            .lock()
            .values()
            .filter(|terminal| terminal.exit.borrow().is_none())
            .count();
        if running >= per_session {
            return Err(TerminalError::TooMany(per_session));
        }
        evict_exited(
            &mut self.running.lock(),
            per_session.saturating_mul(KEPT_PER_RUNNING),
        );
        let spec = self
            .place
            .sandboxes
            .spec(&self.place.dirs, &directory, &self.config);
        let (mut child, slot) = self
            .place
            .sandboxes
            .start(&self.place.tenant, &spec, &request.command, &request.args, &env)
            .await
            .map_err(|source| TerminalError::Spawn {
                command: command_line.clone(),
                source,
            })?;
        // Commands read nothing: their stdin is closed.
        drop(child.stdin.take());
        // Held until the command's sandbox is reaped; none: the session is being stopped.
        let Some(reaping) = self.place.alive.upgrade() else {
            return Err(TerminalError::Refused);
        };
        let uri = format!("ahp-terminal:/{}", uuid::Uuid::new_v4());
        let state = TerminalState {
            title: title_of(&command_line),
            cwd: Some(format!("file://{}", directory.display())),
            cols: None,
            rows: None,
            content: Vec::new(),
            lifecycle: TerminalLifecycleState::Running(TerminalRunningLifecycleState {}),
            claim: TerminalClaim::Session(TerminalSessionClaim {
                session: self.session.clone(),
                chat: chat.clone(),
                turn_id: None,
                tool_call_id: None,
            }),
            supports_command_detection: Some(true),
            is_pty: Some(false),
        };
        if !self.sink.open_terminal(&self.session, &uri, state) {
            return Err(TerminalError::Refused);
        }
        self.sink.emit(
            &uri,
            StateAction::TerminalCommandExecuted(TerminalCommandExecutedAction {
                command_id: COMMAND_ID.into(),
                command_line,
                timestamp: now_ms(),
            }),
        );
        let (exit_tx, exit) = watch::channel(None);
        let limit = request
            .output_byte_limit
            .and_then(|limit| usize::try_from(limit).ok())
            .map_or(DEFAULT_OUTPUT_LIMIT, |limit| limit.min(DEFAULT_OUTPUT_LIMIT));
        let terminal = Arc::new(Terminal {
            uri: uri.clone(),
            chat,
            output: Mutex::new(Output {
                text: String::new(),
                truncated: false,
                limit,
            }),
            exit,
            process_group: child.id(),
            created: Instant::now(),
        });
        let (chunks_tx, chunks) = mpsc::channel(4);
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(read_into(
                super::quota::ThrottledReader::new(stdout, slot.output(), None),
                chunks_tx.clone(),
            ));
        }
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(read_into(
                super::quota::ThrottledReader::new(stderr, slot.output(), None),
                chunks_tx,
            ));
        }
        let budget = self.place.sandboxes.config().output_bytes_per_turn.max(1024);
        tokio::spawn(pump(
            Running {
                child,
                slot,
                budget,
                meter: self.meter.clone(),
                _reaping: reaping,
            },
            chunks,
            Arc::downgrade(&terminal),
            self.sink.clone(),
            exit_tx,
        ));
        self.running.lock().insert(uri.clone(), terminal);
        Ok(uri)
    }

    /// The URI of a terminal the agent names in a tool call, if it is one of this session's.
    pub fn uri_of(&self, id: &str) -> Option<String> {
        self.running.lock().get(id).map(|terminal| terminal.uri.clone())
    }
}

impl Drop for Terminals {
    fn drop(&mut self) {
        for terminal in self.running.lock().values() {
            terminal.kill();
        }
    }
}

/// A short title for a command line.
fn title_of(command_line: &str) -> String {
    const MAX: usize = 80;
    match command_line.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &command_line[..cut]),
        None => command_line.to_string(),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Forward what a pipe yields until it closes (a bounded channel: a command that prints faster than its
/// output is published waits).
async fn read_into(mut pipe: impl tokio::io::AsyncRead + Unpin, chunks: mpsc::Sender<Vec<u8>>) {
    let mut buffer = vec![0_u8; 16 * 1024];
    while let Ok(read) = pipe.read(&mut buffer).await {
        if read == 0 || chunks.send(buffer[..read].to_vec()).await.is_err() {
            return;
        }
    }
}

/// A command's output not yet published, and what it may still print.
struct Budgeted {
    pending: Vec<u8>,
    printed: u64,
    budget: u64,
    /// The session's output budget, which the output counts toward too.
    meter: Arc<super::meter::OutputMeter>,
    /// Killed by the relay: what it prints from now on is dropped.
    stopped: bool,
    /// Said once, at the end of what it printed.
    note: Option<String>,
    /// Takes out what no device may receive (the clipboard, links, forged marks: see [`MarkParser`]).
    filter: MarkParser,
}

impl Budgeted {
    fn accept(&mut self, chunk: Vec<u8>, child: &mut tokio::process::Child) {
        self.printed = self.printed.saturating_add(chunk.len() as u64);
        if self.stopped {
            return;
        }
        if self.printed > self.budget {
            let note = format!(
                "\n[the command passed the output limit of {} bytes and was stopped]\n",
                self.budget
            );
            return self.stop(note, child);
        }
        if !self.meter.admit(chunk.len() as u64) {
            let note = "\n[the session passed its output budget: the command was stopped]\n".to_string();
            return self.stop(note, child);
        }
        for event in self.filter.feed(&chunk) {
            if let ShellEvent::Output(shown) = event {
                self.pending.extend(shown);
            }
        }
    }

    fn stop(&mut self, note: String, child: &mut tokio::process::Child) {
        self.stopped = true;
        self.note = Some(note);
        let _ = child.start_kill();
    }
}

/// A running command: its sandbox, its tenant's slot, and the output it may still print.
struct Running {
    child: tokio::process::Child,
    slot: super::quota::RunningSlot,
    budget: u64,
    meter: Arc<super::meter::OutputMeter>,
    /// Held until the command's sandbox is reaped.
    _reaping: mpsc::Sender<()>,
}

/// Publish the command's output (coalesced) until both pipes close, then its end. Past the output budget, or
/// when the tenant's workspace goes over its quota, the command is killed and a note ends its output.
async fn pump(
    running: Running,
    mut chunks: mpsc::Receiver<Vec<u8>>,
    terminal: std::sync::Weak<Terminal>,
    sink: Arc<dyn ChatSink>,
    exit: watch::Sender<Option<TerminalExitStatus>>,
) {
    let Running {
        mut child,
        slot,
        budget,
        meter,
        _reaping,
    } = running;
    let started = Instant::now();
    let Some(uri) = terminal.upgrade().map(|t| t.uri.clone()) else {
        return;
    };
    let mut output = Budgeted {
        pending: Vec::new(),
        printed: 0,
        budget,
        meter,
        stopped: false,
        note: None,
        filter: MarkParser::new(None),
    };
    let mut open = true;
    while open {
        tokio::select! {
            chunk = chunks.recv() => match chunk {
                Some(chunk) => output.accept(chunk, &mut child),
                None => open = false,
            },
            message = slot.workspace_exceeded(), if !output.stopped => {
                output.stop(format!("\n[{message}: the command was stopped]\n"), &mut child);
            }
        }
        let deadline = tokio::time::Instant::now() + DATA_EVERY;
        while open {
            match tokio::time::timeout_at(deadline, chunks.recv()).await {
                Ok(Some(chunk)) => output.accept(chunk, &mut child),
                Ok(None) => open = false,
                Err(_) => break,
            }
        }
        if let Some(note) = output.note.take() {
            output.pending.extend(note.into_bytes());
        }
        let pending = &mut output.pending;
        // Keep an incomplete UTF-8 sequence at the end for the next chunk.
        let complete = match std::str::from_utf8(pending) {
            Ok(_) => pending.len(),
            Err(error) if error.error_len().is_none() && open => error.valid_up_to(),
            Err(_) => pending.len(),
        };
        if complete == 0 {
            continue;
        }
        let data = String::from_utf8_lossy(&pending[..complete]).into_owned();
        pending.drain(..complete);
        if let Some(terminal) = terminal.upgrade() {
            terminal.output.lock().push(&data);
        }
        sink.emit(&uri, StateAction::TerminalData(TerminalDataAction { data }));
    }
    let status = child.wait().await;
    drop(slot);
    let (exit_code, signal) = match &status {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            (status.code(), status.signal())
        }
        Err(_) => (None, None),
    };
    sink.emit(
        &uri,
        StateAction::TerminalCommandFinished(TerminalCommandFinishedAction {
            command_id: COMMAND_ID.into(),
            exit_code: exit_code.map(i64::from),
            duration_ms: Some(i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX)),
        }),
    );
    sink.emit(
        &uri,
        StateAction::TerminalExited(TerminalExitedAction {
            exit_code: exit_code.map(i64::from),
        }),
    );
    let status = TerminalExitStatus::new()
        .exit_code(exit_code.and_then(|code| u32::try_from(code).ok()))
        .signal(signal.map(|signal| format!("signal {signal}")));
    let _ = exit.send(Some(status));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_output_is_cut_at_the_front_on_a_character_boundary() {
        let mut output = Output {
            text: String::new(),
            truncated: false,
            limit: 5,
        };
        output.push("aé");
        assert_eq!((output.text.as_str(), output.truncated), ("aé", false));
        // "aéwxyz" is 7 bytes; cutting 2 at the front would split "é" (bytes 1–2), so 3 go.
        output.push("wxyz");
        assert!(output.truncated);
        assert_eq!(output.text, "wxyz");
    }

    #[test]
    fn the_oldest_exited_terminals_make_room_and_running_ones_stay() {
        let terminal = |n: u64, exited: bool| {
            let (_tx, exit) = watch::channel(exited.then(TerminalExitStatus::new));
            Arc::new(Terminal {
                uri: format!("t{n}"),
                chat: "c".into(),
                output: Mutex::new(Output {
                    text: String::new(),
                    truncated: false,
                    limit: 1,
                }),
                exit,
                process_group: None,
                created: Instant::now() + Duration::from_secs(n),
            })
        };
        let mut kept: HashMap<String, Arc<Terminal>> = HashMap::new();
        for (n, exited) in [(0, true), (1, false), (2, true), (3, true)] {
            kept.insert(format!("t{n}"), terminal(n, exited));
        }
        evict_exited(&mut kept, 3);
        let mut left: Vec<&str> = kept.keys().map(String::as_str).collect();
        left.sort_unstable();
        assert_eq!(
            left,
            ["t1", "t3"],
            "room for one more: the two oldest exited went"
        );
        // Only running terminals left: nothing to evict (the running limit refuses new ones elsewhere).
        let mut running: HashMap<String, Arc<Terminal>> = HashMap::new();
        for n in 0..3 {
            running.insert(format!("t{n}"), terminal(n, false));
        }
        evict_exited(&mut running, 2);
        assert_eq!(running.len(), 3);
    }

    #[test]
    fn long_command_lines_get_a_short_title() {
        assert_eq!(title_of("ls -la"), "ls -la");
        let long = "x".repeat(100);
        assert_eq!(title_of(&long).chars().count(), 81);
    }
}
