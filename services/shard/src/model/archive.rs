//! A chat's archived turns: where they are stored, which of them a chat's state holds, how they are paged and
//! loaded back, and how turns age out of a live chat.
//!
//! Turns have absolute indexes (0 = the chat's first turn). A chat's state holds the turns from some index
//! `first` on; the turns before it are in its archive, one store row per turn (`turn_archive`, keyed by the
//! chat's archive key and the index), so a page reads its rows only and no row grows with the chat. Rows at or
//! after `first` may exist (turns loaded back into state are not deleted): the state's cursor says where the
//! archive stops counting. Cursors are `turns:<end>` = "the turns before absolute index `end`".
//!
//! "Retained turns" (AHP: a subscribe without `view.turns` returns all of them) are the newest
//! `retained_turns` turns of a chat. A live chat holds at most a quarter more: when a turn ends beyond that, the
//! oldest move to the archive with the batch that ends it; a restore keeps exactly the retained ones. This
//! module depends on nothing of the host: the host's commands call it.

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

/// The single-row archive of releases before `turn_archive` (`None`: the chat has none), to move into rows.
pub async fn read_legacy(store: &Store, host: &HostKey, chat: &str) -> Result<Option<Vec<Turn>>, ShardError> {
    let (tenant, host) = (&host.tenant, &host.host);
    let mut record = store.load_channel(tenant, host, &key(chat)).await?;
    if record.is_none() {
        record = store.load_channel(tenant, host, &legacy_key(chat)).await?;
    }
    match record {
        Some(record) => serde_json::from_str(&record.state)
            .map(Some)
            .map_err(ShardError::corrupt),
        None => Ok(None),
    }
}

/// How many turns a live chat may hold beyond `retain` before the oldest age out (a quarter more: the moves,
/// and the snapshot stored with them, come once every so many turns, not with every turn).
pub fn aging_slack(retain: usize) -> usize {
    (retain / 4).max(1)
}

/// Move the oldest turns of `state` (whose first turn has absolute index `archived`) out, keeping its newest
/// `retain`, when it holds more than `retain + slack`; the state's cursor then points before what it keeps.
/// Returns the turns moved, each with its absolute index (empty when nothing moved).
pub fn age(state: &mut ChatState, archived: usize, retain: usize, slack: usize) -> Vec<(usize, Turn)> {
    let retain = retain.max(1);
    if state.turns.len() <= retain + slack {
        return Vec::new();
    }
    let cut = state.turns.len() - retain;
    let moved: Vec<(usize, Turn)> = state
        .turns
        .drain(..cut)
        .enumerate()
        .map(|(n, turn)| (archived + n, turn))
        .collect();
    state.turns_next_cursor = cursor_before(archived + cut);
    moved
}

/// The most archived turns one operation (a truncation to an old turn, a fork) loads back into a chat's state;
/// beyond it (or beyond the reply budget in bytes) the operation is refused, saying so.
pub const MAX_LOADED_BACK: usize = 2_000;

/// The archived turns with indexes in `[start, end)`, in order, unless they take more than `max_bytes` as JSON
/// (`None` then: their size is asked of the store first, so an archive too large is never read).
pub async fn range_within(
    store: &Store,
    host: &HostKey,
    chat: &str,
    start: usize,
    end: usize,
    max_bytes: usize,
) -> Result<Option<Vec<Turn>>, ShardError> {
    let (tenant, host_name, archive) = (&host.tenant, &host.host, key(chat));
    let length = store
        .archived_turns_length(tenant, host_name, &archive, start as u64, end as u64)
        .await?;
    if length > max_bytes as u64 {
        return Ok(None);
    }
    let rows = store
        .archived_turns(tenant, host_name, &archive, start as u64, end as u64)
        .await?;
    if rows.iter().map(|(_, turn)| turn.len()).sum::<usize>() > max_bytes {
        return Ok(None);
    }
    if rows.len() != end.saturating_sub(start) {
        return Err(ShardError::corrupt(format!(
            "the archive of {chat} lacks turns of [{start}, {end}): it has {} of them",
            rows.len()
        )));
    }
    rows.into_iter()
        .map(|(_, turn)| serde_json::from_str(&turn).map_err(ShardError::corrupt))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A page of archived turns: the newest of `[start, end)` that fit `max_bytes` as JSON (always the newest
/// one), in order, and the absolute index of the first. The store reads no more than the budget.
pub async fn page_within(
    store: &Store,
    host: &HostKey,
    chat: &str,
    start: usize,
    end: usize,
    max_bytes: usize,
) -> Result<(usize, Vec<Turn>), ShardError> {
    let rows = store
        .archived_turns_within(
            &host.tenant,
            &host.host,
            &key(chat),
            start as u64,
            end as u64,
            max_bytes as u64,
        )
        .await?;
    let first = rows.first().map_or(end, |(index, _)| *index as usize);
    if rows.len() != end - first {
        return Err(ShardError::corrupt(format!(
            "the archive of {chat} lacks turns of [{first}, {end}): it has {} of them",
            rows.len()
        )));
    }
    let turns = rows
        .into_iter()
        .map(|(_, turn)| serde_json::from_str(&turn).map_err(ShardError::corrupt))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((first, turns))
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

/// How many of the newest turns (of these `sizes`, oldest first) a chat keeps: at most `retain`, and at most
/// `budget` bytes of them, but always the newest.
pub fn retained_count(sizes: &[usize], retain: usize, budget: usize) -> usize {
    let mut total = 0;
    let mut keep = 0;
    for size in sizes.iter().rev() {
        if keep >= retain.max(1) || (keep > 0 && total + size > budget) {
            break;
        }
        total += size;
        keep += 1;
    }
    keep
}
