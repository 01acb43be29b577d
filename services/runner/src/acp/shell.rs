//! Devices' terminals (AHP `createTerminal`) and chats' `!commands`: a shell (or the one command) on a
//! pseudoterminal ([`crate::pty`]), started in a sandbox of the session — the same confinement, directories,
//! user and quotas as its agent, counted against the tenant's running processes — with a plain environment
//! (none of the agent's credentials). What it prints is published on the terminal's channel: `terminal/data`
//! coalesced (at most every [`DATA_EVERY`] or [`DATA_MAX`] bytes, never an envelope per read), read no faster
//! than the tenant's output rate (a flood is slowed like a slow link, never buffered), with the shell's marks
//! ([`crate::shell_integration`]) turned into `terminal/commandExecuted`, `commandFinished` and `cwdChanged`;
//! `terminal/exited` with the exit status at the end.
//!
//! Retention: a terminal's state keeps at most [`SCROLLBACK_BYTES`] of output; past it the terminal is
//! `terminal/cleared` and its last [`SCROLLBACK_TAIL`] bytes are published again, so its snapshot stays bounded
//! however much it prints (the action log keeps what it printed until compaction, at the tenant's rate).
//!
//! A terminal's processes are killed (its whole sandbox) when it is disposed, when its session is disposed,
//! when nothing was typed or printed for the quotas' `terminal_idle_seconds`, and when this process stops.
//!
//! A terminal outlives the owner of its host: when its actions reach nobody ([`Emitted::Unreachable`]: the
//! stream to its shard ended, the host left the process) it stops reading (its programs wait, as on a slow
//! link) and holds what it had to say for [`ADOPTION_GRACE`]. The host's next owner takes it over
//! ([`ShellTerminals::adopt`]) and it goes on there, saying in its output that some may be missing; nobody
//! taking it over within the grace stops it. The terminals of a runner are its process's, not one shard
//! registration's ([`KeptShells`]).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::config::AgentConfig;
use super::sandboxes::Sandboxes;
use super::session_key::SessionKey;
use super::shell_output::*;
use crate::provider::{ChatSink, TerminalKey, TerminalRequest};
use crate::pty::{PtyController, TerminalSize};
use crate::shell_integration::BASH_RC;

/// Typed input waiting to reach a terminal, in messages (a device typing faster than the shell reads waits).
const INPUT_QUEUE: usize = 256;
/// How long a terminal whose host's owner went out of reach waits for the next owner to take it over (the host
/// is loaded again when a client next opens it: a phone that locked its screen comes back later).
pub const ADOPTION_GRACE: Duration = Duration::from_secs(600);
/// How often a terminal that prints nothing asks whether its host's owner is still in reach.
const REACH_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Why a terminal did not start.
#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    #[error("{0}")]
    Workspace(#[from] super::workspace::WorkspaceError),
    #[error("{0}")]
    Outside(#[from] super::fs::FsError),
    #[error("the working directory {0} is not a directory")]
    NotADirectory(String),
    #[error("this session already runs {0} terminals (its limit)")]
    TooMany(usize),
    #[error("terminal {0} is already running")]
    Exists(String),
    #[error("cannot open a pseudoterminal: {0}")]
    Pty(std::io::Error),
    #[error("cannot start the terminal's shell: {0}")]
    Spawn(#[from] super::sandboxes::StartError),
    #[error("no terminal {0} of this session runs here")]
    NotHere(String),
}

/// The devices' terminals of each agent of this process, kept for the process's life: a shard registration
/// that ends (its providers go) leaves them running for the host's next owner to take over.
#[derive(Default)]
pub struct KeptShells {
    by_agent: Mutex<HashMap<String, Arc<ShellTerminals>>>,
}

impl KeptShells {
    /// The terminals of the agent `config` describes (made on first use).
    pub fn of(&self, sandboxes: &Arc<Sandboxes>, config: &Arc<AgentConfig>) -> Arc<ShellTerminals> {
        self.by_agent
            .lock()
            .entry(config.id.clone())
            .or_insert_with(|| Arc::new(ShellTerminals::new(sandboxes.clone(), config.clone())))
            .clone()
    }
}

/// The running terminals of one provider's sessions.
pub struct ShellTerminals {
    sandboxes: Arc<Sandboxes>,
    config: Arc<AgentConfig>,
    running: Arc<Mutex<HashMap<TerminalKey, Arc<Shell>>>>,
    /// Terminals whose process is being started, with their session; and those killed meanwhile (killed as
    /// soon as their process exists).
    starting: Mutex<HashMap<TerminalKey, SessionKey>>,
    aborted: Mutex<std::collections::HashSet<TerminalKey>>,
}

struct Shell {
    session: SessionKey,
    destination: Arc<Destination>,
    controller: Arc<PtyController>,
    input: mpsc::Sender<Vec<u8>>,
    process_group: Option<u32>,
    /// When something was last typed or printed.
    touched: Mutex<Instant>,
    /// Its process was reaped: its group number may be another's now, and is never signalled.
    reaped: std::sync::atomic::AtomicBool,
}

impl Shell {
    fn kill(&self) {
        if self.reaped.load(std::sync::atomic::Ordering::Acquire) {
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

impl ShellTerminals {
    pub fn new(sandboxes: Arc<Sandboxes>, config: Arc<AgentConfig>) -> Self {
        Self {
            sandboxes,
            config,
            running: Arc::default(),
            starting: Mutex::default(),
            aborted: Mutex::default(),
        }
    }

    /// Start the terminal `request` names; its output goes to `sink`.
    pub async fn start(&self, request: TerminalRequest, sink: Arc<dyn ChatSink>) -> Result<(), ShellError> {
        let session = SessionKey {
            tenant: request.key.tenant.clone(),
            host: request.key.host.clone(),
            session: request.session.clone(),
        };
        let limit = self.sandboxes.config().terminals_per_session.max(1);
        {
            let running = self.running.lock();
            let mut starting = self.starting.lock();
            if running.contains_key(&request.key) || starting.contains_key(&request.key) {
                return Err(ShellError::Exists(request.key.uri.clone()));
            }
            let of_session = running.values().filter(|shell| shell.session == session).count()
                + starting.values().filter(|starting| **starting == session).count();
            if of_session >= limit {
                return Err(ShellError::TooMany(limit));
            }
            starting.insert(request.key.clone(), session.clone());
        }
        let started = self.spawn(request, sink, session).await;
        let key_started = started.as_ref().ok().cloned();
        if let Some((key, shell)) = key_started {
            self.starting.lock().remove(&key);
            // Disposed (or its session) while it started: it goes at once.
            if self.aborted.lock().remove(&key) {
                shell.kill();
            }
        }
        started.map(|_| ())
    }

    /// Start the process of a terminal counted in `starting` (taken out of it when this fails).
    async fn spawn(
        &self,
        request: TerminalRequest,
        sink: Arc<dyn ChatSink>,
        session: SessionKey,
    ) -> Result<(TerminalKey, Arc<Shell>), ShellError> {
        let key = request.key.clone();
        let spawned = self.spawn_inner(request, sink, session).await;
        if spawned.is_err() {
            self.starting.lock().remove(&key);
            self.aborted.lock().remove(&key);
        }
        spawned
    }

    async fn spawn_inner(
        &self,
        request: TerminalRequest,
        sink: Arc<dyn ChatSink>,
        session: SessionKey,
    ) -> Result<(TerminalKey, Arc<Shell>), ShellError> {
        let workspaces = self.sandboxes.workspaces();
        let dirs = workspaces.session(
            &session.tenant,
            &session.host,
            &session.session,
            request.working_directory.as_deref(),
        )?;
        // A device's terminal has a home of its own; a chat's `!command` runs as the agent's work does.
        let dirs = if request.command.is_none() {
            workspaces.for_devices(dirs)?
        } else {
            dirs
        };
        let cwd = match &request.cwd {
            Some(requested) => {
                let path = PathBuf::from(requested.strip_prefix("file://").unwrap_or(requested));
                let directory = super::fs::confine(&dirs.workspace, &path)?;
                if !directory.is_dir() {
                    return Err(ShellError::NotADirectory(path.display().to_string()));
                }
                directory
            }
            None => dirs.workspace.clone(),
        };
        let spec = self.sandboxes.spec(&dirs, &cwd, &self.config);
        let mut env = BTreeMap::from([
            ("PATH".to_string(), "/usr/local/bin:/usr/bin:/bin".to_string()),
            ("TERM".to_string(), "xterm-256color".to_string()),
            ("COLORTERM".to_string(), "truecolor".to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
        ]);
        // The shell integration's marks carry a nonce of this terminal's: a program printing marks is not trusted.
        let nonce = request
            .command
            .is_none()
            .then(crate::shell_integration::new_nonce);
        let (program, args) = match &request.command {
            Some(command) => ("sh".to_string(), vec!["-c".to_string(), command.clone()]),
            None => {
                // The marks are set up by the first prompt: nothing is written to the session's directories.
                env.insert("__AHP_RC".into(), BASH_RC.into());
                env.insert("PROMPT_COMMAND".into(), "eval \"$__AHP_RC\"".into());
                (
                    "bash".to_string(),
                    vec!["--noprofile".to_string(), "--norc".to_string(), "-i".to_string()],
                )
            }
        };
        let size = TerminalSize::clamped(request.cols, request.rows);
        let pair = crate::pty::open(size).map_err(ShellError::Pty)?;
        if let Some(nonce) = &nonce {
            pair.hand_over_unechoed(nonce).map_err(ShellError::Pty)?;
        }
        let (child, slot) = self
            .sandboxes
            .start_on_terminal(&session.tenant, &spec, &program, &args, &env, &pair.terminal)
            .await?;
        drop(pair.terminal);
        let controller = Arc::new(pair.controller);
        let (input, typed) = mpsc::channel(INPUT_QUEUE);
        let destination = Destination::new(sink);
        let shell = Arc::new(Shell {
            session: session.clone(),
            destination: destination.clone(),
            controller: controller.clone(),
            input,
            process_group: child.id(),
            touched: Mutex::new(Instant::now()),
            reaped: std::sync::atomic::AtomicBool::new(false),
        });
        self.running.lock().insert(request.key.clone(), shell.clone());
        let started = (request.key.clone(), shell.clone());
        tokio::spawn(write_input(controller, typed, Arc::downgrade(&shell)));
        let publisher = Publisher::new(
            destination,
            session.session.clone(),
            request.key.uri.clone(),
            request.command.clone(),
            nonce,
        );
        let idle = Duration::from_secs(self.sandboxes.config().terminal_idle_seconds.max(1));
        tokio::spawn(run(
            shell,
            child,
            slot,
            publisher,
            idle,
            Arc::downgrade(&self.running),
            request.key,
        ));
        Ok(started)
    }

    /// Type `data` into a terminal (dropped when its queue is full: the device sends faster than it reads).
    pub fn input(&self, key: &TerminalKey, data: &str) {
        if let Some(shell) = self.running.lock().get(key) {
            if shell.input.try_send(data.as_bytes().to_vec()).is_err() {
                tracing::debug!(terminal = %key.uri, "a terminal's input queue is full; input dropped");
            }
        }
    }

    /// Resize a terminal (the kernel tells its foreground processes).
    pub fn resize(&self, key: &TerminalKey, cols: i64, rows: i64) {
        if let Some(shell) = self.running.lock().get(key) {
            if let Err(error) = shell.controller.resize(TerminalSize::clamped(cols, rows)) {
                tracing::debug!(terminal = %key.uri, %error, "cannot resize a terminal");
            }
        }
    }

    /// Kill a terminal's processes; it then publishes `terminal/exited`.
    pub fn kill(&self, key: &TerminalKey) {
        if let Some(shell) = self.running.lock().get(key) {
            shell.kill();
        } else if self.starting.lock().contains_key(key) {
            self.aborted.lock().insert(key.clone());
        }
    }

    /// Take over terminal `key` of `session`, running here: its actions go to `sink` from now on (what it held
    /// while nobody heard it first).
    pub fn adopt(&self, key: &TerminalKey, session: &str, sink: Arc<dyn ChatSink>) -> Result<(), ShellError> {
        let running = self.running.lock();
        let shell = running
            .get(key)
            .filter(|shell| shell.session.session == session)
            .ok_or_else(|| ShellError::NotHere(key.uri.clone()))?;
        if shell.destination.replace(sink) {
            Ok(())
        } else {
            Err(ShellError::NotHere(key.uri.clone()))
        }
    }

    /// Kill every terminal of `session`.
    pub fn dispose_session(&self, session: &SessionKey) {
        for shell in self.running.lock().values() {
            if shell.session == *session {
                shell.kill();
            }
        }
        let starting: Vec<TerminalKey> = self
            .starting
            .lock()
            .iter()
            .filter(|(_, of)| *of == session)
            .map(|(key, _)| key.clone())
            .collect();
        self.aborted.lock().extend(starting);
    }
}

impl Drop for ShellTerminals {
    fn drop(&mut self) {
        for shell in self.running.lock().values() {
            shell.kill();
        }
    }
}

/// Forward what devices type to the terminal, in order.
async fn write_input(controller: Arc<PtyController>, mut typed: mpsc::Receiver<Vec<u8>>, shell: Weak<Shell>) {
    while let Some(data) = typed.recv().await {
        if let Some(shell) = shell.upgrade() {
            *shell.touched.lock() = Instant::now();
        }
        if controller.write_all(&data).await.is_err() {
            return;
        }
    }
}

/// Publish a terminal's output until its processes are gone, then its exit.
async fn run(
    shell: Arc<Shell>,
    mut child: tokio::process::Child,
    slot: super::quota::RunningSlot,
    mut publisher: Publisher,
    idle: Duration,
    registry: Weak<Mutex<HashMap<TerminalKey, Arc<Shell>>>>,
    key: TerminalKey,
) {
    let bucket = slot.output();
    let mut buffer = vec![0_u8; DATA_MAX];
    let mut status: Option<Option<i64>> = None;
    // Once the shell exited, what is still in the terminal is read for at most this long.
    let mut drain_until = None;
    let mut reach_checks = tokio::time::interval(REACH_CHECK_EVERY);
    reach_checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if let Some(since) = publisher.orphaned_since {
            // Nobody hears it: nothing is read (its programs wait) until the host's next owner takes it over.
            tokio::select! {
                exited = child.wait(), if status.is_none() => {
                    shell.reaped.store(true, std::sync::atomic::Ordering::Release);
                    status = Some(exited.ok().and_then(|status| status.code()).map(i64::from));
                    drain_until = Some(Instant::now() + Duration::from_secs(1));
                }
                () = shell.destination.replaced.notified() => {
                    *shell.touched.lock() = Instant::now();
                    publisher.resume();
                }
                () = tokio::time::sleep_until(since + ADOPTION_GRACE) => {
                    tracing::info!(terminal = %key.uri, "no owner of its host took this terminal over; it is stopped");
                    publisher.abandon();
                    shell.kill();
                    if status.is_some() {
                        break;
                    }
                }
            }
            continue;
        }
        // While its host's store is behind, nothing more is read: the pty fills and its programs wait.
        if let Some(room) = publisher.destination.current().room() {
            room.await;
        }
        let touched = *shell.touched.lock();
        let flush_at = publisher.flush_at();
        tokio::select! {
            exited = child.wait(), if status.is_none() => {
                // Anything it left running went with it: its sandbox's PID namespace ended with it. (Its
                // process group is not signalled now: reaped, its number may be another's.)
                shell.reaped.store(true, std::sync::atomic::Ordering::Release);
                status = Some(exited.ok().and_then(|status| status.code()).map(i64::from));
                drain_until = Some(Instant::now() + Duration::from_secs(1));
            }
            read = shell.controller.read(&mut buffer) => match read {
                Ok(0) | Err(_) => break,
                Ok(read) => {
                    *shell.touched.lock() = Instant::now();
                    publisher.push(&buffer[..read]);
                    pay(&bucket, read).await;
                    if publisher.closed {
                        shell.kill();
                    }
                }
            },
            () = sleep_until(flush_at) => publisher.flush(),
            () = tokio::time::sleep_until(touched + idle), if status.is_none() => {
                tracing::info!(terminal = %key.uri, "a terminal idle for {idle:?} is stopped");
                publisher.note("\r\n[ahp-relay: this terminal was idle and is stopped]\r\n");
                shell.kill();
            }
            () = sleep_until(drain_until), if drain_until.is_some() => break,
            // A terminal that prints nothing learns its host's owner went too.
            _ = reach_checks.tick() => {
                if !publisher.destination.current().reachable() {
                    publisher.orphaned_since = Some(Instant::now());
                }
            }
        }
    }
    if status.is_none() {
        shell.kill();
        status = Some(
            child
                .wait()
                .await
                .ok()
                .and_then(|status| status.code())
                .map(i64::from),
        );
    }
    publisher.flush();
    publisher.exited(status.flatten());
    drop(slot);
    if let Some(registry) = registry.upgrade() {
        let mut running = registry.lock();
        if running.get(&key).is_some_and(|held| Arc::ptr_eq(held, &shell)) {
            running.remove(&key);
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Wait until the tenant's output rate allowed `bytes` more.
async fn pay(bucket: &super::quota::OutputBucket, mut bytes: usize) {
    while bytes > 0 {
        match bucket.take(bytes) {
            Ok(granted) => bytes = bytes.saturating_sub(granted.max(1)),
            Err(wait) => tokio::time::sleep(wait).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ahp_types::actions::StateAction;

    #[derive(Default)]
    struct Recorded(Mutex<Vec<StateAction>>);

    impl ChatSink for Recorded {
        fn emit(&self, _channel: &str, action: StateAction) -> crate::Emitted {
            self.0.lock().push(action);
            crate::Emitted::Applied
        }
    }

    /// A sink nobody hears (the stream to the host's owner ended).
    struct Unheard;

    impl ChatSink for Unheard {
        fn emit(&self, _channel: &str, _action: StateAction) -> crate::Emitted {
            crate::Emitted::Unreachable
        }
    }

    /// A publisher whose destination nobody hears, and that destination (to replace it).
    fn unheard() -> (Arc<Destination>, Publisher) {
        let destination = Destination::new(Arc::new(Unheard));
        let publisher = Publisher::new(
            destination.clone(),
            "s".into(),
            "ahp-terminal:/t".into(),
            None,
            None,
        );
        (destination, publisher)
    }

    #[test]
    fn a_terminal_nobody_hears_holds_what_it_says_for_the_owner_that_takes_it_over() {
        let (destination, mut publisher) = unheard();
        publisher.push(b"in flight when the shard went");
        publisher.flush();
        assert!(publisher.orphaned_since.is_some(), "nobody heard it: it waits");
        publisher.exited(Some(3));
        let sink = Arc::new(Recorded::default());
        destination.replace(sink.clone());
        publisher.resume();
        assert!(publisher.orphaned_since.is_none());
        let actions = sink.0.lock();
        assert!(
            matches!(&actions[..], [StateAction::TerminalData(note), StateAction::TerminalExited(exit)]
                if note.data.contains("moved") && exit.exit_code == Some(3)),
            "{actions:?}"
        );
    }

    #[test]
    fn a_terminal_nobody_takes_over_says_nothing_more() {
        let (destination, mut publisher) = unheard();
        publisher.push(b"x");
        publisher.flush();
        publisher.abandon();
        let sink = Arc::new(Recorded::default());
        destination.replace(sink.clone());
        publisher.resume();
        publisher.exited(None);
        assert!(sink.0.lock().is_empty());
    }

    fn publisher(sink: &Arc<Recorded>, command: Option<&str>) -> Publisher {
        Publisher::new(
            Destination::new(sink.clone()),
            "s".into(),
            "ahp-terminal:/t".into(),
            command.map(str::to_string),
            None,
        )
    }

    #[test]
    fn a_character_split_between_reads_is_published_whole() {
        let sink = Arc::new(Recorded::default());
        let mut publisher = publisher(&sink, None);
        let text = "é€😀";
        let bytes = text.as_bytes();
        for byte in bytes {
            publisher.push(std::slice::from_ref(byte));
            publisher.flush();
        }
        let data: String = sink
            .0
            .lock()
            .iter()
            .filter_map(|action| match action {
                StateAction::TerminalData(data) => Some(data.data.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(data, text);
    }

    #[test]
    fn output_past_the_scrollback_clears_and_shows_the_tail_again() {
        let sink = Arc::new(Recorded::default());
        let mut publisher = publisher(&sink, None);
        let line = format!("{}\n", "x".repeat(99));
        for _ in 0..(2 * SCROLLBACK_BYTES / line.len()) {
            publisher.push(line.as_bytes());
        }
        publisher.flush();
        // Reduced as every client does, the state never holds more than the scrollback and a chunk.
        let mut state = ahp_types::state::TerminalState {
            title: String::new(),
            cwd: None,
            cols: None,
            rows: None,
            content: vec![],
            lifecycle: ahp_types::state::TerminalLifecycleState::Running(
                ahp_types::state::TerminalRunningLifecycleState {},
            ),
            claim: ahp_types::state::TerminalClaim::Client(ahp_types::state::TerminalClientClaim {
                client_id: "c".into(),
            }),
            supports_command_detection: None,
            is_pty: Some(true),
        };
        let mut largest = 0;
        let mut cleared = 0;
        for action in sink.0.lock().iter() {
            cleared += usize::from(matches!(action, StateAction::TerminalCleared(_)));
            ahp::reducers::apply_action_to_terminal(&mut state, action);
            let held: usize = state
                .content
                .iter()
                .map(|part| match part {
                    ahp_types::state::TerminalContentPart::Unclassified(part) => part.value.len(),
                    ahp_types::state::TerminalContentPart::Command(part) => part.output.len(),
                    _ => 0,
                })
                .sum();
            largest = largest.max(held);
        }
        assert!(cleared >= 1, "never cleared");
        assert!(largest <= SCROLLBACK_BYTES + DATA_MAX, "held {largest}");
        let ahp_types::state::TerminalContentPart::Unclassified(last) = &state.content[0] else {
            panic!("{:?}", state.content);
        };
        assert!(
            last.value.starts_with('x') && last.value.ends_with("x\n"),
            "the tail starts at a line"
        );
    }

    #[test]
    fn no_envelope_carries_more_than_its_maximum() {
        let sink = Arc::new(Recorded::default());
        let mut publisher = publisher(&sink, None);
        for _ in 0..5 {
            publisher.push(&vec![b'x'; 40 * 1024]);
        }
        publisher.flush();
        let sizes: Vec<usize> = sink
            .0
            .lock()
            .iter()
            .filter_map(|action| match action {
                StateAction::TerminalData(data) => Some(data.data.len()),
                _ => None,
            })
            .collect();
        assert_eq!(sizes.iter().sum::<usize>(), 5 * 40 * 1024);
        assert!(sizes.iter().all(|size| *size <= DATA_MAX), "{sizes:?}");
    }

    #[test]
    fn a_one_shot_command_starts_and_finishes_with_its_status() {
        let sink = Arc::new(Recorded::default());
        let mut publisher = publisher(&sink, Some("echo hi"));
        publisher.push(b"hi\r\n");
        publisher.flush();
        publisher.exited(Some(3));
        let actions = sink.0.lock();
        assert!(
            matches!(&actions[0], StateAction::TerminalCommandExecuted(a) if a.command_line == "echo hi")
        );
        assert!(matches!(&actions[1], StateAction::TerminalData(a) if a.data == "hi\r\n"));
        assert!(matches!(&actions[2], StateAction::TerminalCommandFinished(a) if a.exit_code == Some(3)));
        assert!(matches!(&actions[3], StateAction::TerminalExited(a) if a.exit_code == Some(3)));
    }
}
