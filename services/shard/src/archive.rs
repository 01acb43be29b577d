//! A chat's archived turns: where they are stored, which of them a chat's state holds, how they are paged and
//! loaded back, and what truncation does to them.
//!
//! Turns have absolute indexes (0 = the chat's first turn). A chat's state holds the turns from some index
//! `first` on; the turns before it are in its archive, one store row beside the chat's snapshot holding turns
//! `[0, n)` with `n >= first` (a suffix loaded back into state is not deleted from the row: the state's cursor
//! says where the row stops counting). Cursors are `turns:<end>` = "the turns before absolute index `end`".
//!
//! "Retained turns" (AHP: a subscribe without `view.turns` returns all of them) are the newest
//! `retained_turns` turns of a chat, before and after a restart alike; a restore moves older ones to the
//! archive. This module depends on nothing of the host: the host's commands call it.

use ahp_types::state::{ChatState, Turn};
use relay_core::HostKey;
use relay_store::Store;

use crate::error::ShardError;

/// The store key of a chat's turn archive. Archives have a key space of their own: the `relay-archive:`
/// prefix is no channel scheme, and clients may only create `ahp-session:` and `ahp-chat:` URIs, so no
/// channel can ever share (and, disposed, delete) an archive's row.
pub fn key(chat: &str) -> String {
    format!("relay-archive:{chat}")
}

/// Where releases before the archive had its own key space kept it (read if the new key has none, and
/// deleted with the chat).
pub fn legacy_key(chat: &str) -> String {
    format!("{chat}#archived-turns")
}

/// The `turnsNextCursor` meaning "the turns before absolute index `end`".
pub fn cursor(end: usize) -> String {
    format!("turns:{end}")
}

/// The absolute index a cursor names, if it is one of ours.
pub fn parse_cursor(cursor: &str) -> Option<usize> {
    cursor.strip_prefix("turns:")?.parse().ok()
}

/// The cursor for "the turns before `end`", or none when there are none.
pub fn cursor_before(end: usize) -> Option<String> {
    (end > 0).then(|| cursor(end))
}

/// The absolute index of the first turn a chat state holds (what its cursor says is before it).
pub fn first_held(state: &ChatState) -> usize {
    state
        .turns_next_cursor
        .as_deref()
        .and_then(parse_cursor)
        .unwrap_or(0)
}

/// The archived turns of a chat as stored (empty when it has none).
pub async fn read(store: &Store, host: &HostKey, chat: &str) -> Result<Vec<Turn>, ShardError> {
    let (tenant, host) = (&host.tenant, &host.host);
    let mut record = store.load_channel(tenant, host, &key(chat)).await?;
    if record.is_none() {
        record = store.load_channel(tenant, host, &legacy_key(chat)).await?;
    }
    match record {
        Some(record) => serde_json::from_str(&record.state).map_err(ShardError::corrupt),
        None => Ok(Vec::new()),
    }
}

/// What a restored chat keeps in state and what its archive must hold.
pub struct Retained {
    /// How many turns are only in the archive (the state's turns start at this absolute index).
    pub archived: usize,
    /// The archive to store, when it changed.
    pub rewrite: Option<Vec<Turn>>,
}

/// Keep the newest `retain` turns of a restored chat in its state and move older ones to the archive.
/// `archive` is the stored row; only its first `first_held(state)` turns count (the rest were loaded back
/// into state). Without a readable archive (`None`) nothing moves: writing it anew would lose what it holds.
pub fn retain_newest(state: &mut ChatState, archive: Option<Vec<Turn>>, retain: usize) -> Retained {
    let Some(mut archive) = archive else {
        return Retained {
            archived: 0,
            rewrite: None,
        };
    };
    let first = first_held(state).min(archive.len());
    let trimmed = archive.len() > first;
    archive.truncate(first);
    let retain = retain.max(1);
    if state.turns.len() <= retain {
        state.turns_next_cursor = cursor_before(first);
        return Retained {
            archived: first,
            rewrite: trimmed.then_some(archive),
        };
    }
    let cut = state.turns.len() - retain;
    archive.extend(state.turns.drain(..cut));
    state.turns_next_cursor = cursor_before(archive.len());
    Retained {
        archived: archive.len(),
        rewrite: Some(archive),
    }
}

/// One page of turns for `fetchTurns`.
pub struct Page {
    /// Absolute index of the page's first turn.
    pub start: usize,
    /// Absolute index after the page's last turn.
    pub end: usize,
}

impl Page {
    /// The page before absolute index `end`, of at most `size` turns, not crossing from the state's turns
    /// (from `archived` on) into the archive: one page comes from one place.
    pub fn before(end: usize, size: usize, archived: usize) -> Page {
        let floor = if end > archived { archived } else { 0 };
        Page {
            start: end.saturating_sub(size.max(1)).max(floor),
            end,
        }
    }

    /// Whether the page is read from the archive.
    pub fn in_archive(&self, archived: usize) -> bool {
        self.end <= archived
    }

    /// The cursor to the turns before this page.
    pub fn next_cursor(&self) -> Option<String> {
        cursor_before(self.start)
    }
}

/// The archived turns an operation on `turn_id` needs in state: from that turn to the first turn the state
/// holds (`archived`), with its absolute index; `None` when the archive has no such turn.
pub fn from_turn(archive: &[Turn], archived: usize, turn_id: &str) -> Option<(usize, Vec<Turn>)> {
    let held = &archive[..archived.min(archive.len())];
    let index = held.iter().position(|turn| turn.id == turn_id)?;
    Some((index, held[index..].to_vec()))
}

/// Every archived turn the state does not hold.
pub fn all_held(archive: &[Turn], archived: usize) -> Vec<Turn> {
    archive[..archived.min(archive.len())].to_vec()
}
