//! `fetchTurns`, and loading archived turns back into a chat's state before an operation names one of them.
//!
//! A page goes to the asking connection alone as `chat/turnsLoaded` (each connection has its own window into a
//! chat's history: its snapshot's `view.turns` and the pages it fetched), numbered and written to the client
//! before the `fetchTurns` response (the reply names it in `deliver_first`). Without a cursor the page is the
//! one before the oldest turn the connection holds. Where the archived turns live and how they page is
//! [`crate::model::archive`]'s.

use ahp_types::actions::{ChatTurnsLoadedAction, StateAction};
use ahp_types::commands::{ChatSource, CreateChatParams, DispatchActionParams, FetchTurnsParams};
use ahp_types::state::Turn;
use relay_core::link::CommandReply;
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::ConnectionId;

use crate::error::ShardError;
use crate::host::{Host, HostCore};
use crate::model::archive::{self, Page};
use crate::reply::{answer, not_found, reply};

/// An operation that names a turn which may be archived.
enum NamedTurn {
    /// `chat/truncated{turnId}`: the turns from it on must be in state.
    Truncate { chat: String, turn_id: String },
    /// A fork: every turn up to it must be in state.
    Fork { chat: String, turn_id: String },
}

impl Host {
    pub(crate) async fn fetch_turns(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> CommandReply {
        answer(message.id, self.fetch_turns_result(connection, message).await)
    }

    async fn fetch_turns_result(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> Result<CommandReply, RpcError> {
        let params: FetchTurnsParams = message.parse_params()?;
        let chat = params.channel;
        let (mut page, memory, barrier, max_bytes) = {
            let core = self.core.lock();
            core.client_id(connection)?;
            let record = core.model.chats.get(&chat).ok_or_else(|| not_found(&chat))?;
            let total = record.archived + record.state.turns.len();
            let end = match params.cursor.as_deref() {
                // "Load the next older page": before the oldest turn this connection holds — which only a
                // subscription tracks (else every call would answer the same page).
                None => {
                    let subscribed = core
                        .connections
                        .get(&connection)
                        .is_some_and(|state| state.subscriptions.contains(&chat));
                    if !subscribed {
                        return Err(RpcError::invalid_params(
                            "fetchTurns without a cursor pages in what this connection holds: subscribe to the \
                             chat first, or pass a cursor",
                        ));
                    }
                    core.window_start(connection, &chat)
                }
                Some(cursor) => match archive::parse_cursor(cursor) {
                    Some(end) if end <= total => end,
                    _ => return Err(RpcError::invalid_params("unknown turns cursor")),
                },
            };
            let page = Page::before(end, core.limits.fetch_turns_page, record.archived);
            let memory = (!page.in_archive(record.archived)).then(|| {
                record.state.turns[page.start - record.archived..page.end - record.archived].to_vec()
            });
            // Archived turns are written with the batch that moved them (or by the restore that loaded the
            // chat): a page of them is read once everything queued so far is stored.
            (page, memory, core.seq.barrier(), core.limits.max_reply_bytes)
        };
        let mut turns = match memory {
            Some(turns) => turns,
            // One page read: its rows only, and no more of them than the reply budget.
            None => {
                self.wait_committed(barrier).await;
                let (first, turns) =
                    archive::page_within(&self.store, &self.key, &chat, page.start, page.end, max_bytes)
                        .await
                        .map_err(|error| {
                            tracing::error!(%chat, %error, "reading the turn archive failed");
                            RpcError::internal("the store is unavailable; retry")
                        })?;
                page.start = first;
                turns
            }
        };
        // A page is one envelope: it keeps its newest turns that fit the reply budget (at least one), and its
        // cursor points before them.
        let fitting = newest_fitting(&turns, max_bytes).min(turns.len());
        let cut = turns.len() - fitting;
        turns.drain(..cut);
        page.start += cut;
        let action = StateAction::ChatTurnsLoaded(ChatTurnsLoadedAction {
            turns,
            turns_next_cursor: page.next_cursor(),
        });
        let (loaded, barrier) = self.with_core(|core| {
            core.narrow_window(connection, &chat, page.start);
            // A page is part of this connection's view only: it goes to it alone and is not logged.
            let loaded = core.seq.private(connection, &chat, &action, None, None);
            (loaded, core.seq.barrier())
        });
        self.wait_committed(barrier).await;
        let mut out = reply(message.id, &serde_json::json!({}))?;
        out.deliver_first = loaded.map(|loaded| loaded.seq);
        Ok(out)
    }

    /// Before an operation that names an archived turn (a truncation or a fork) is applied, load the turns it
    /// needs back into the chat's state, for every subscriber (`chat/turnsLoaded`, logged like any action),
    /// so host and clients reduce it against the same turns.
    pub(crate) async fn load_named_turns(&self, message: &InboundMessage) -> Result<(), ShardError> {
        let size = message.params.as_ref().map_or(0, |params| params.get().len());
        let Some(named) = relay_core::heavy::for_message(size, || named_turn(message)) else {
            return Ok(());
        };
        let chat = match &named {
            NamedTurn::Truncate { chat, .. } | NamedTurn::Fork { chat, .. } => chat.clone(),
        };
        // (How many turns are archived, and whether the named one is in state.)
        let needs_archive = {
            let core = self.core.lock();
            core.model.chats.get(&chat).and_then(|record| {
                let held = match &named {
                    NamedTurn::Truncate { turn_id, .. } | NamedTurn::Fork { turn_id, .. } => {
                        record.state.turns.iter().any(|turn| &turn.id == turn_id)
                    }
                };
                let needed = record.archived > 0
                    && match &named {
                        // A fork copies every turn up to the one it names, archived ones too.
                        NamedTurn::Fork { .. } => true,
                        NamedTurn::Truncate { .. } => !held,
                    };
                needed.then_some((record.archived, held))
            })
        };
        let Some((archived, held)) = needs_archive else {
            return Ok(());
        };
        // Turns that aged out are written with the batch that moved them: read the archive after it.
        self.flush().await;
        let (NamedTurn::Truncate { turn_id, .. } | NamedTurn::Fork { turn_id, .. }) = &named;
        let position = match held {
            true => None,
            false => self
                .store
                .archived_turn_position(
                    &self.key.tenant,
                    &self.key.host,
                    &archive::key(&chat),
                    turn_id,
                    archived as u64,
                )
                .await?
                .map(|position| position as usize),
        };
        let start = match (&named, position) {
            (NamedTurn::Truncate { .. }, Some(position)) => position,
            (NamedTurn::Fork { .. }, _) if held || position.is_some() => 0,
            // No such turn: the operation is refused as it is.
            _ => return Ok(()),
        };
        // One logged envelope brings them back: bounded in turns and bytes. Beyond, nothing is loaded and the
        // operation is refused, saying so (`validate`, `createChat`).
        if archived - start > archive::MAX_LOADED_BACK {
            return Ok(());
        }
        let max_bytes = self.core.lock().limits.max_reply_bytes;
        if let Some(turns) =
            archive::range_within(&self.store, &self.key, &chat, start, archived, max_bytes).await?
        {
            self.with_core(|core| core.load_archived(&chat, archived, start, turns));
        }
        Ok(())
    }
}

impl HostCore {
    /// The absolute index of the oldest turn of `chat` the connection holds: what its snapshot and pages
    /// brought, or (when it has no snapshot of the chat) where a snapshot without `view.turns` starts.
    pub(crate) fn window_start(&self, connection: ConnectionId, chat: &str) -> usize {
        if let Some(start) = self
            .connections
            .get(&connection)
            .and_then(|state| state.turn_windows.get(chat))
        {
            return *start;
        }
        self.model.chats.get(chat).map_or(0, |record| {
            record.archived
                + record
                    .state
                    .turns
                    .len()
                    .saturating_sub(self.limits.retained_turns)
        })
    }

    /// The connection now holds the turns of `chat` from absolute index `start` on (remembered while it
    /// subscribes to the chat).
    pub(crate) fn narrow_window(&mut self, connection: ConnectionId, chat: &str, start: usize) {
        if let Some(state) = self
            .connections
            .get_mut(&connection)
            .filter(|state| state.subscriptions.contains(chat))
        {
            let window = state.turn_windows.get_or_insert(chat, start);
            *window = (*window).min(start);
            let window = *window;
            self.remember_window(connection, chat, window);
        }
    }

    /// Before an operation naming `turn_id` of `chat` is applied (a truncation, a resume): see
    /// [`HostCore::fill_windows_from`].
    pub(crate) fn fill_windows_to(&mut self, chat: &str, turn_id: &str) {
        let index = self.model.chats.get(chat).and_then(|record| {
            let position = record.state.turns.iter().position(|turn| turn.id == turn_id)?;
            Some(record.archived + position)
        });
        if let Some(index) = index {
            self.fill_windows_from(chat, index);
        }
    }

    /// Every subscriber of `chat` whose window starts after absolute turn `index` gets the turns it lacks
    /// (from `index` to its window), to it alone as `chat/turnsLoaded` pages within the reply budget, newest
    /// first: AHP has the host load a turn outside the window before an operation that names it, and each
    /// connection has its own window (a subscriber holding fewer turns would take the operation as a no-op
    /// and diverge for good). The turns must be in the host's memory (archived ones are loaded first).
    pub(crate) fn fill_windows_from(&mut self, chat: &str, index: usize) {
        let Some(archived) = self.model.chats.get(chat).map(|record| record.archived) else {
            return;
        };
        if index < archived {
            return;
        }
        let lacking: Vec<(ConnectionId, usize)> = self
            .connections
            .iter()
            .filter(|(_, state)| state.subscriptions.contains(chat))
            .map(|(id, _)| (*id, self.window_start(*id, chat)))
            .filter(|(_, start)| *start > index)
            .collect();
        let max_bytes = self.limits.max_reply_bytes;
        for (connection, start) in lacking {
            let Some(record) = self.model.chats.get(chat) else {
                return;
            };
            let held = &record.state.turns;
            let mut end = (start - archived).min(held.len());
            let first = index - archived;
            let mut pages = Vec::new();
            while end > first {
                let fitting = newest_fitting(&held[first..end], max_bytes);
                let page_start = end - fitting;
                pages.push(StateAction::ChatTurnsLoaded(ChatTurnsLoadedAction {
                    turns: held[page_start..end].to_vec(),
                    turns_next_cursor: archive::cursor_before(archived + page_start),
                }));
                end = page_start;
            }
            for page in pages {
                self.seq.private(connection, chat, &page, None, None);
            }
            self.narrow_window(connection, chat, index);
        }
    }

    /// Load archived turns `[start, archived)` into the chat's state (see [`Host::load_named_turns`]), unless
    /// the chat's archive moved meanwhile (then the operation meets the state as it is).
    fn load_archived(&mut self, chat: &str, archived: usize, start: usize, turns: Vec<Turn>) {
        if self.model.chats.get(chat).map(|record| record.archived) != Some(archived) {
            return;
        }
        // Subscribers that lack some of the turns held in memory get them first, so the archived ones land
        // right before what they hold.
        self.fill_windows_from(chat, archived);
        self.apply_server_action(
            chat,
            StateAction::ChatTurnsLoaded(ChatTurnsLoadedAction {
                turns,
                turns_next_cursor: archive::cursor_before(start),
            }),
        );
        let subscribers: Vec<ConnectionId> = self
            .connections
            .iter()
            .filter(|(_, state)| state.subscriptions.contains(chat))
            .map(|(id, _)| *id)
            .collect();
        for connection in subscribers {
            self.narrow_window(connection, chat, start);
        }
    }
}

/// How many of the newest `turns` one `chat/turnsLoaded` page carries within `max_bytes` (at least one).
fn newest_fitting(turns: &[Turn], max_bytes: usize) -> usize {
    let mut bytes = 0usize;
    turns
        .iter()
        .rev()
        .take_while(|turn| {
            bytes += crate::model::json_len(turn) + 1;
            bytes <= max_bytes
        })
        .count()
        .max(1)
}

/// The archived turn a message may name: `chat/truncated{turnId}`, or a `createChat` fork.
fn named_turn(message: &InboundMessage) -> Option<NamedTurn> {
    // Every action passes here: parse its params again only when they can name a turn.
    let params = message.params.as_ref()?.get();
    let candidate = match message.method.as_str() {
        "dispatchAction" => params.contains("\"chat/truncated\""),
        "createChat" => params.contains("\"fork\""),
        _ => false,
    };
    if !candidate {
        return None;
    }
    match message.method.as_str() {
        "dispatchAction" => {
            let params: DispatchActionParams = message.parse_params().ok()?;
            match params.action {
                StateAction::ChatTruncated(truncated) => Some(NamedTurn::Truncate {
                    chat: params.channel,
                    turn_id: truncated.turn_id?,
                }),
                _ => None,
            }
        }
        "createChat" => {
            let params: CreateChatParams = message.parse_params().ok()?;
            match params.source? {
                ChatSource::Fork(fork) => Some(NamedTurn::Fork {
                    chat: fork.chat,
                    turn_id: fork.turn_id,
                }),
                _ => None,
            }
        }
        _ => None,
    }
}
