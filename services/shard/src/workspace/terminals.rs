//! Agents' terminals: the `ahp-terminal:/…` channels a host opens for the commands an agent runs (ACP
//! `terminal/create`), owned by a session, listed in root state `terminals` and kept at most
//! [`MAX_TERMINALS_PER_SESSION`] per session (the oldest exited one goes first).
//!
//! Their output arrives as server actions like any agent output (`terminal/data`, `terminal/exited`, …):
//! sequenced, committed before publishing, replayable. They are stored like chats (a snapshot with their
//! session as parent) and restored with their session. Clients watch them; they cannot write to them.
//!
//! Also where each session says which terminals devices opened in it (`_meta["ahpRelay/terminals"]`), kept
//! in line with the list.

use ahp_types::actions::{RootTerminalsChangedAction, StateAction};
use std::collections::HashMap;

use ahp_types::state::{TerminalClaim, TerminalLifecycleState, TerminalState};
use ahp_types::ROOT_RESOURCE_URI;
use serde_json::Value;

use crate::host::HostCore;
use crate::model::session_meta::SESSION_TERMINALS_META;
use crate::model::{ChannelKind, SnapshotClock, TerminalRecord, TERMINAL_SCHEME};

/// Terminals a session keeps; opening one more disposes the oldest that has exited.
pub const MAX_TERMINALS_PER_SESSION: usize = 16;

impl HostCore {
    /// Open the terminal channel `uri` for an agent of `session`. Refused (false) when the session is not
    /// here, the URI is not a free `ahp-terminal:` URI, or the session already holds its maximum of running
    /// terminals.
    pub(crate) fn open_terminal(&mut self, session: &str, uri: &str, state: TerminalState) -> bool {
        self.open_terminal_of(session, uri, state, None)
    }

    /// [`HostCore::open_terminal`], for a device's terminal when `device` is set (stored with it).
    pub(crate) fn open_terminal_of(
        &mut self,
        session: &str,
        uri: &str,
        state: TerminalState,
        device: Option<crate::model::DeviceTerminal>,
    ) -> bool {
        if !uri.starts_with(TERMINAL_SCHEME)
            || self.model.kind(uri) != ChannelKind::Unknown
            || !self.model.sessions.contains_key(session)
        {
            return false;
        }
        let mut owned: Vec<(&String, &TerminalRecord)> = self
            .model
            .terminals
            .iter()
            .filter(|(_, terminal)| terminal.session == session)
            .collect();
        if owned.len() >= MAX_TERMINALS_PER_SESSION {
            owned.sort_by_key(|(_, terminal)| terminal.clock.taken_at);
            let oldest_exited = owned
                .iter()
                .find(|(_, terminal)| matches!(terminal.state.lifecycle, TerminalLifecycleState::Exited(_)))
                .map(|(uri, _)| (*uri).clone());
            match oldest_exited {
                Some(oldest) => self.dispose_terminal(&oldest),
                None => return false,
            }
        }
        self.model.terminals.insert(
            uri.to_string(),
            TerminalRecord {
                session: session.to_string(),
                state,
                clock: SnapshotClock::fresh(),
                device,
            },
        );
        self.store_snapshot(uri);
        self.sync_terminal_list();
        true
    }

    /// Remove a terminal channel: its subscribers see it disposed, the store forgets it.
    pub(crate) fn dispose_terminal(&mut self, uri: &str) {
        if self.model.terminals.remove(uri).is_none() {
            return;
        }
        self.seq.dispose(uri);
        self.note_disposing(std::iter::once(uri.to_string()));
        for state in self.connections.values_mut() {
            state.subscriptions.remove(uri);
        }
    }

    /// Bring root state's `terminals` in line with the terminals held (`root/terminalsChanged` when it differs).
    pub(crate) fn sync_terminal_list(&mut self) {
        let list = self.model.terminal_list();
        let listed = self.model.root.terminals.as_deref().unwrap_or_default();
        if list.as_slice() != listed {
            self.apply_server_action(
                ROOT_RESOURCE_URI,
                StateAction::RootTerminalsChanged(RootTerminalsChangedAction { terminals: list }),
            );
            // What the sessions name changes only with the list (a terminal opened, gone, or its claim passed
            // on), not with a terminal's output.
            self.sync_session_terminals();
        }
    }

    /// Bring each session's `_meta["ahpRelay/terminals"]` in line with the terminals devices opened in it
    /// (claimed by a client; an agent's and a `!command`'s name their session in their claim).
    pub(crate) fn sync_session_terminals(&mut self) {
        let mut opened: HashMap<&str, Vec<&str>> = HashMap::new();
        for (uri, terminal) in &self.model.terminals {
            if matches!(terminal.state.claim, TerminalClaim::Client(_)) {
                opened
                    .entry(terminal.session.as_str())
                    .or_default()
                    .push(uri.as_str());
            }
        }
        let mut changed = Vec::new();
        for (session, record) in &self.model.sessions {
            let listed = record
                .state
                .meta
                .as_ref()
                .and_then(|meta| meta.get(SESSION_TERMINALS_META));
            let mut own = opened.remove(session.as_str()).unwrap_or_default();
            own.sort_unstable();
            let wanted: Vec<Value> = own.into_iter().map(Value::from).collect();
            let same = match listed {
                Some(Value::Array(listed)) => *listed == wanted,
                None => wanted.is_empty(),
                Some(_) => false,
            };
            if !same {
                changed.push((session.clone(), Value::Array(wanted)));
            }
        }
        for (session, terminals) in changed {
            self.set_session_meta(&session, SESSION_TERMINALS_META, terminals);
        }
    }
}
