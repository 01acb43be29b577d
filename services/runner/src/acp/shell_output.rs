//! A device terminal's output on its way to the host: read from the pty, held whole across split characters,
//! sent in envelopes of at most [`DATA_MAX`] every [`DATA_EVERY`], the scrollback cleared past
//! [`SCROLLBACK_BYTES`] (its tail shown again), and the command marks of the shell's integration turned into
//! terminal actions; to whichever sink holds the terminal now ([`Destination`]: an adopted terminal changes hands).

use std::sync::Arc;
use std::time::Duration;

use ahp_types::actions::{
    StateAction, TerminalClearedAction, TerminalCommandDetectionAvailableAction,
    TerminalCommandExecutedAction, TerminalCommandFinishedAction, TerminalCwdChangedAction,
    TerminalDataAction, TerminalExitedAction,
};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::provider::{ChatSink, Emitted};
use crate::shell_integration::{MarkParser, ShellEvent};

/// What a terminal taken over says in its output.
pub(crate) const ADOPTED_NOTE: &str =
    "\r\n[ahp-relay: this terminal's host moved; output printed meanwhile may be missing here]\r\n";

/// Bytes one `terminal/data` carries at most.
pub const DATA_MAX: usize = 64 * 1024;
/// How long output waits for more before it is published.
pub const DATA_EVERY: Duration = Duration::from_millis(40);
/// Output a terminal's state keeps; past it the terminal is cleared and its tail published again.
pub const SCROLLBACK_BYTES: usize = 1024 * 1024;
/// What a cleared terminal shows again of its output.
pub const SCROLLBACK_TAIL: usize = 64 * 1024;

/// Where a terminal's actions go: its host's owner now, replaced when a host's next owner takes it over.
pub(crate) struct Destination {
    pub(crate) sink: Mutex<Arc<dyn ChatSink>>,
    /// Woken when the sink is replaced.
    pub(crate) replaced: tokio::sync::Notify,
    /// Set once the terminal says nothing more (its channel is gone, or nobody took it over): it cannot be
    /// taken over then.
    pub(crate) ended: std::sync::atomic::AtomicBool,
}

impl Destination {
    pub(crate) fn new(sink: Arc<dyn ChatSink>) -> Arc<Self> {
        Arc::new(Self {
            sink: Mutex::new(sink),
            replaced: tokio::sync::Notify::new(),
            ended: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub(crate) fn current(&self) -> Arc<dyn ChatSink> {
        self.sink.lock().clone()
    }

    /// Take it over; false when it says nothing more.
    pub(crate) fn replace(&self, sink: Arc<dyn ChatSink>) -> bool {
        if self.ended.load(std::sync::atomic::Ordering::Acquire) {
            return false;
        }
        *self.sink.lock() = sink;
        self.replaced.notify_one();
        true
    }

    pub(crate) fn end(&self) {
        self.ended.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Turns a terminal's bytes into its channel's actions.
pub(crate) struct Publisher {
    pub(crate) destination: Arc<Destination>,
    pub(crate) session: String,
    pub(crate) uri: String,
    /// Filters the output; trusts marks with the shell's nonce (none for a one-shot command: its start and end
    /// are the relay's own).
    pub(crate) marks: MarkParser,
    pub(crate) one_shot: Option<(String, std::time::Instant)>,
    pub(crate) pending: Vec<u8>,
    pub(crate) pending_since: Option<Instant>,
    pub(crate) published_since_clear: usize,
    pub(crate) tail: String,
    pub(crate) detection_announced: bool,
    pub(crate) command_line: Option<String>,
    pub(crate) commands: u64,
    pub(crate) open_command: Option<(String, std::time::Instant)>,
    pub(crate) cwd: Option<String>,
    /// The channel is gone: stop.
    pub(crate) closed: bool,
    /// Since when nobody hears it (its host's owner went out of reach), and what it had to say meanwhile.
    pub(crate) orphaned_since: Option<Instant>,
    pub(crate) held: Vec<StateAction>,
}

impl Publisher {
    pub(crate) fn new(
        destination: Arc<Destination>,
        session: String,
        uri: String,
        command: Option<String>,
        nonce: Option<String>,
    ) -> Self {
        let mut publisher = Self {
            destination,
            session,
            uri,
            marks: MarkParser::new(nonce),
            one_shot: None,
            pending: Vec::new(),
            pending_since: None,
            published_since_clear: 0,
            tail: String::new(),
            detection_announced: false,
            command_line: None,
            commands: 0,
            open_command: None,
            cwd: None,
            closed: false,
            orphaned_since: None,
            held: Vec::new(),
        };
        if let Some(command) = command {
            publisher.emit(StateAction::TerminalCommandExecuted(
                TerminalCommandExecutedAction {
                    command_id: "1".into(),
                    command_line: command.clone(),
                    timestamp: now_ms(),
                },
            ));
            publisher.one_shot = Some(("1".into(), std::time::Instant::now()));
        }
        publisher
    }

    pub(crate) fn emit(&mut self, action: StateAction) {
        if self.closed {
            return;
        }
        if self.orphaned_since.is_some() {
            // Bounded: nothing more is read while it waits, so this is what one read and the exit produce.
            self.held.push(action);
            return;
        }
        // A clear may take the open command: its end then applies to nothing, and the terminal goes on.
        let sink = self.destination.current();
        match sink.emit_in(&self.session, &self.uri, action) {
            Emitted::Applied | Emitted::NotApplied => {}
            Emitted::Gone => {
                self.closed = true;
                self.destination.end();
            }
            // What was in flight to the owner that went is lost with it (the note on resuming says so).
            Emitted::Unreachable => self.orphaned_since = Some(Instant::now()),
        }
    }

    /// Its host's next owner took it over: say so, and publish what it held.
    pub(crate) fn resume(&mut self) {
        if self.orphaned_since.take().is_none() {
            return;
        }
        let held = std::mem::take(&mut self.held);
        self.emit(StateAction::TerminalData(TerminalDataAction {
            data: ADOPTED_NOTE.into(),
        }));
        for action in held {
            self.emit(action);
        }
    }

    /// Nobody took it over: it is stopped, and what it held goes.
    pub(crate) fn abandon(&mut self) {
        self.closed = true;
        self.destination.end();
        self.orphaned_since = None;
        self.held.clear();
    }

    pub(crate) fn flush_at(&self) -> Option<Instant> {
        self.pending_since.map(|since| since + DATA_EVERY)
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) {
        let events = self.marks.feed(bytes);
        for event in events {
            match event {
                ShellEvent::Output(bytes) => {
                    // An envelope carries at most DATA_MAX (and the few bytes of a character cut at its end).
                    if self.pending.len() + bytes.len() > DATA_MAX {
                        self.flush();
                    }
                    self.pending.extend_from_slice(&bytes);
                    self.pending_since.get_or_insert_with(Instant::now);
                    if self.pending.len() >= DATA_MAX {
                        self.flush();
                    }
                }
                ShellEvent::Prompt => {
                    self.flush();
                    if !self.detection_announced {
                        self.detection_announced = true;
                        self.emit(StateAction::TerminalCommandDetectionAvailable(
                            TerminalCommandDetectionAvailableAction {},
                        ));
                    }
                }
                ShellEvent::CommandLine(line) => self.command_line = Some(line),
                ShellEvent::Executed => {
                    self.flush();
                    self.commands += 1;
                    let id = self.commands.to_string();
                    let command_line = self.command_line.take().unwrap_or_default();
                    self.emit(StateAction::TerminalCommandExecuted(
                        TerminalCommandExecutedAction {
                            command_id: id.clone(),
                            command_line,
                            timestamp: now_ms(),
                        },
                    ));
                    self.open_command = Some((id, std::time::Instant::now()));
                }
                ShellEvent::Finished(code) => {
                    self.flush();
                    if let Some((id, started)) = self.open_command.take() {
                        self.finished(id, code, started);
                    }
                }
                ShellEvent::Cwd(path) => {
                    let cwd = format!("file://{path}");
                    if self.cwd.as_ref() != Some(&cwd) {
                        self.flush();
                        self.cwd = Some(cwd.clone());
                        self.emit(StateAction::TerminalCwdChanged(TerminalCwdChangedAction { cwd }));
                    }
                }
            }
        }
    }

    pub(crate) fn finished(&mut self, id: String, code: Option<i64>, started: std::time::Instant) {
        self.emit(StateAction::TerminalCommandFinished(
            TerminalCommandFinishedAction {
                command_id: id,
                exit_code: code,
                duration_ms: i64::try_from(started.elapsed().as_millis()).ok(),
            },
        ));
    }

    /// A line of the relay's own in the output.
    pub(crate) fn note(&mut self, text: &str) {
        self.flush();
        self.pending.extend_from_slice(text.as_bytes());
        self.flush();
    }

    /// Publish what is pending (an incomplete UTF-8 sequence at its end waits for the rest).
    pub(crate) fn flush(&mut self) {
        let keep = incomplete_utf8_suffix(&self.pending);
        let ready: Vec<u8> = self.pending.drain(..self.pending.len() - keep).collect();
        self.pending_since = (!self.pending.is_empty()).then(Instant::now);
        if ready.is_empty() {
            return;
        }
        let data = String::from_utf8_lossy(&ready).into_owned();
        self.published_since_clear += data.len();
        self.tail.push_str(&data);
        if self.tail.len() > 2 * SCROLLBACK_TAIL {
            let cut = char_boundary(&self.tail, self.tail.len() - SCROLLBACK_TAIL);
            self.tail.drain(..cut);
        }
        self.emit(StateAction::TerminalData(TerminalDataAction { data }));
        if self.published_since_clear > SCROLLBACK_BYTES {
            // The state keeps a bounded scrollback: clear it and show the tail again, from a line's start.
            let from = char_boundary(&self.tail, self.tail.len().saturating_sub(SCROLLBACK_TAIL));
            let tail = &self.tail[from..];
            let tail = tail
                .find('\n')
                .map_or(tail, |newline| &tail[newline + 1..])
                .to_string();
            self.emit(StateAction::TerminalCleared(TerminalClearedAction {}));
            self.published_since_clear = tail.len();
            if !tail.is_empty() {
                self.emit(StateAction::TerminalData(TerminalDataAction { data: tail }));
            }
        }
    }

    pub(crate) fn exited(&mut self, code: Option<i64>) {
        if !self.pending.is_empty() {
            // Whatever is left, even half a character.
            let rest = std::mem::take(&mut self.pending);
            self.emit(StateAction::TerminalData(TerminalDataAction {
                data: String::from_utf8_lossy(&rest).into_owned(),
            }));
        }
        if let Some((id, started)) = self.one_shot.take() {
            self.finished(id, code, started);
        }
        self.emit(StateAction::TerminalExited(TerminalExitedAction {
            exit_code: code,
        }));
    }
}

/// How many bytes at the end of `bytes` are the start of a UTF-8 sequence not yet complete.
pub(crate) fn incomplete_utf8_suffix(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let width = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if width > back { back } else { 0 };
    }
    0
}

/// The nearest char boundary at or after `at`.
pub(crate) fn char_boundary(text: &str, at: usize) -> usize {
    (at..=text.len())
        .find(|&at| text.is_char_boundary(at))
        .unwrap_or(text.len())
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
