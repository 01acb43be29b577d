//! The state of one host ([`HostModel`]): lookups by URI, the newest-first catalogue behind `listSessions`,
//! reducing an action into its channel, and each channel's snapshot and stored document.

use std::collections::HashMap;

use ahp::reducers::{
    apply_action_to_chat, apply_action_to_root, apply_action_to_session, apply_action_to_terminal,
    ReduceOutcome,
};
use ahp_types::actions::StateAction;
use ahp_types::state::{ChatState, RootState, SessionState, Snapshot, SnapshotState, TerminalInfo};
use ahp_types::ROOT_RESOURCE_URI;

use super::documents::{ChangesetDocument, ChatDocument, RootDocument, SessionDocument, TerminalDocument};
use super::projections::summary_of;
use super::records::{
    ChangesetRecord, ChatRecord, SessionRecord, SnapshotClock, TerminalRecord, WatchRecord,
};

/// What a channel URI names on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    Root,
    Session,
    Chat,
    Terminal,
    /// A connection's resource watch ([`crate::workspace::watches`]).
    ResourceWatch,
    /// A session's changeset ([`crate::workspace::changesets`]).
    Changeset,
    /// A URI this host has no state for (unknown, disposed, or a kind the relay does not host).
    Unknown,
}

/// The state of one host.
pub struct HostModel {
    pub root: RootState,
    pub sessions: HashMap<String, SessionRecord>,
    pub chats: HashMap<String, ChatRecord>,
    pub terminals: HashMap<String, TerminalRecord>,
    /// Open changesets, by channel.
    pub changesets: HashMap<String, ChangesetRecord>,
    /// Open resource watches, by channel (never stored).
    pub watches: HashMap<String, WatchRecord>,
    next_catalog_no: u64,
}

impl HostModel {
    /// An empty model; catalogue numbers continue from `next_catalog_no` (numbers are never reused).
    pub fn new(root: RootState, next_catalog_no: u64) -> Self {
        Self {
            root,
            sessions: HashMap::new(),
            chats: HashMap::new(),
            terminals: HashMap::new(),
            changesets: HashMap::new(),
            watches: HashMap::new(),
            next_catalog_no: next_catalog_no.max(1),
        }
    }

    pub fn kind(&self, channel: &str) -> ChannelKind {
        if channel == ROOT_RESOURCE_URI {
            ChannelKind::Root
        } else if self.sessions.contains_key(channel) {
            ChannelKind::Session
        } else if self.chats.contains_key(channel) {
            ChannelKind::Chat
        } else if self.terminals.contains_key(channel) {
            ChannelKind::Terminal
        } else if self.watches.contains_key(channel) {
            ChannelKind::ResourceWatch
        } else if self.changesets.contains_key(channel) {
            ChannelKind::Changeset
        } else {
            ChannelKind::Unknown
        }
    }

    /// Apply `action` to the state of `channel` with the `ahp` reducers.
    pub fn reduce(&mut self, channel: &str, action: &StateAction) -> ReduceOutcome {
        if channel == ROOT_RESOURCE_URI {
            return apply_action_to_root(&mut self.root, action);
        }
        if let Some(session) = self.sessions.get_mut(channel) {
            return apply_action_to_session(&mut session.state, action);
        }
        if let Some(chat) = self.chats.get_mut(channel) {
            return apply_action_to_chat(&mut chat.state, action);
        }
        if let Some(terminal) = self.terminals.get_mut(channel) {
            return apply_action_to_terminal(&mut terminal.state, action);
        }
        if let Some(changeset) = self.changesets.get_mut(channel) {
            return ahp::reducers::apply_action_to_changeset(&mut changeset.state, action);
        }
        ReduceOutcome::OutOfScope
    }

    /// Insert a new session at the head of the catalogue; returns its catalogue number.
    pub fn insert_new_session(&mut self, uri: String, state: SessionState, created_at: String) -> u64 {
        let catalog_no = self.next_catalog_no;
        self.next_catalog_no += 1;
        self.insert_session(uri, state, created_at, catalog_no);
        catalog_no
    }

    /// Insert a session (new, or restored from the store).
    pub fn insert_session(&mut self, uri: String, state: SessionState, created_at: String, catalog_no: u64) {
        self.next_catalog_no = self.next_catalog_no.max(catalog_no + 1);
        let announced = summary_of(&uri, &state, &created_at);
        self.sessions.insert(
            uri,
            SessionRecord {
                state,
                created_at,
                catalog_no,
                announced,
                clock: SnapshotClock::fresh(),
                created_by: None,
            },
        );
    }

    /// Remove a session and every chat and terminal that belongs to it (stopping their turns); returns the
    /// chats' and terminals' URIs.
    pub fn remove_session(&mut self, uri: &str) -> Vec<String> {
        if self.sessions.remove(uri).is_none() {
            return Vec::new();
        }
        let mut children: Vec<String> = self
            .chats
            .iter()
            .filter(|(_, chat)| chat.session == uri)
            .map(|(chat, _)| chat.clone())
            .collect();
        for chat in &children {
            self.chats.remove(chat);
        }
        let terminals: Vec<String> = self
            .terminals
            .iter()
            .filter(|(_, terminal)| terminal.session == uri)
            .map(|(terminal, _)| terminal.clone())
            .collect();
        for terminal in &terminals {
            self.terminals.remove(terminal);
        }
        children.extend(terminals);
        children
    }

    /// Whether `channel` is `session`, one of its chats or one of its terminals.
    pub fn belongs_to(&self, channel: &str, session: &str) -> bool {
        (channel == session && self.sessions.contains_key(session))
            || self
                .chats
                .get(channel)
                .is_some_and(|chat| chat.session == session)
            || self
                .terminals
                .get(channel)
                .is_some_and(|terminal| terminal.session == session)
    }

    /// Root state's `terminals` as the terminals held now say, oldest URI first.
    pub fn terminal_list(&self) -> Vec<TerminalInfo> {
        let mut list: Vec<TerminalInfo> = self
            .terminals
            .iter()
            .map(|(uri, terminal)| TerminalInfo {
                resource: uri.clone(),
                title: terminal.state.title.clone(),
                claim: terminal.state.claim.clone(),
                lifecycle: terminal.state.lifecycle.clone(),
            })
            .collect();
        list.sort_by(|a, b| a.resource.cmp(&b.resource));
        list
    }

    /// The snapshot clock of a session, chat or terminal.
    pub fn clock_mut(&mut self, channel: &str) -> Option<&mut SnapshotClock> {
        if let Some(record) = self.sessions.get_mut(channel) {
            return Some(&mut record.clock);
        }
        if let Some(record) = self.chats.get_mut(channel) {
            return Some(&mut record.clock);
        }
        if let Some(record) = self.changesets.get_mut(channel) {
            return Some(&mut record.clock);
        }
        self.terminals.get_mut(channel).map(|record| &mut record.clock)
    }

    /// The JSON the store keeps for a channel: the root's configuration, or a session or chat.
    pub fn document(&self, channel: &str) -> Option<(Option<String>, String)> {
        if channel == ROOT_RESOURCE_URI {
            let doc = RootDocument {
                config: self.root.config.clone(),
                meta: self.root.meta.clone(),
            };
            return serde_json::to_string(&doc).ok().map(|json| (None, json));
        }
        if let Some(s) = self.sessions.get(channel) {
            let doc = SessionDocument {
                state: &s.state,
                created_at: &s.created_at,
                catalog_no: s.catalog_no,
                created_by: s.created_by.as_ref(),
            };
            return serde_json::to_string(&doc).ok().map(|json| (None, json));
        }
        if let Some(terminal) = self.terminals.get(channel) {
            let doc = TerminalDocument {
                state: &terminal.state,
                session: &terminal.session,
                device: terminal.device.as_ref(),
            };
            return serde_json::to_string(&doc)
                .ok()
                .map(|json| (Some(terminal.session.clone()), json));
        }
        if let Some(changeset) = self.changesets.get(channel) {
            let doc = ChangesetDocument {
                state: changeset.state.clone(),
                session: changeset.session.clone(),
                scope: changeset.scope.clone(),
            };
            return serde_json::to_string(&doc)
                .ok()
                .map(|json| (Some(changeset.session.clone()), json));
        }
        let chat = self.chats.get(channel)?;
        let doc = ChatDocument {
            state: &chat.state,
            session: &chat.session,
            created_by: chat.created_by.as_ref(),
        };
        serde_json::to_string(&doc)
            .ok()
            .map(|json| (Some(chat.session.clone()), json))
    }

    /// A snapshot of `channel` at `from_seq`; for chats, only the newest `turns` turns inline (with a cursor
    /// to the older ones).
    pub fn snapshot(&self, channel: &str, from_seq: u64, turns: usize) -> Option<Snapshot> {
        let state = match self.kind(channel) {
            ChannelKind::Root => SnapshotState::Root(Box::new(self.root.clone())),
            ChannelKind::Session => {
                SnapshotState::Session(Box::new(self.sessions.get(channel)?.state.clone()))
            }
            ChannelKind::Chat => {
                let chat = self.chats.get(channel)?;
                SnapshotState::Chat(Box::new(limit_turns(&chat.state, turns, chat.archived)))
            }
            ChannelKind::Terminal => {
                SnapshotState::Terminal(Box::new(self.terminals.get(channel)?.state.clone()))
            }
            ChannelKind::ResourceWatch => {
                SnapshotState::ResourceWatch(Box::new(self.watches.get(channel)?.state.clone()))
            }
            ChannelKind::Changeset => {
                SnapshotState::Changeset(Box::new(self.changesets.get(channel)?.state.clone()))
            }
            ChannelKind::Unknown => return None,
        };
        Some(Snapshot {
            resource: channel.to_string(),
            state,
            from_seq: from_seq as i64,
        })
    }
}

/// A chat state with only its newest `turns` turns inline, and a cursor to fetch the older ones. `archived` is
/// the absolute index of the first turn held in memory.
pub fn limit_turns(chat: &ChatState, turns: usize, archived: usize) -> ChatState {
    let mut limited = chat.clone();
    if chat.turns.len() > turns {
        let cut = chat.turns.len() - turns;
        limited.turns = chat.turns[cut..].to_vec();
        limited.turns_next_cursor = crate::model::archive::cursor_before(archived + cut);
    }
    limited
}
