//! A watch's bounds, and what it gathers in one period before it is reported.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use super::super::protocol::ChangeKind;

/// How long changes are gathered before they are reported (an editor's save is several events).
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// Most paths one report of a watch names (a flood beyond it in one period is not itemized).
pub const MAX_CHANGES_PER_REPORT: usize = 1_000;

/// Most paths a watch knows exist (its listing at the start, then what it reported).
pub const KNOWN_MAX: usize = 20_000;

/// Most directories a recursive watch registers (the kernel watches each).
pub const MAX_WATCHED_DIRECTORIES: usize = 4_096;

/// Most entries one period's listings of new directories look at, reported or not, and one listing of a whole
/// tree (a tree whose files `includes` leaves out is otherwise walked whole).
pub const MAX_LISTED_ENTRIES: usize = 100_000;

/// Most new trees of a recursive watch watched one by one in a period (each waits for notify's thread); past
/// it, the period is taken as lost: the tree is watched again as a whole (within [`MAX_WATCHED_DIRECTORIES`];
/// past that, the trees beyond this many are left to notify's own watching) and listed again.
pub const MAX_NEW_TREES_PER_PERIOD: usize = 64;

/// A listing of what exists beneath a watch's root, and whether it is all of it.
pub(super) type Listing = (BTreeSet<PathBuf>, bool);

/// What one watch saw in a period not reported yet.
#[derive(Default)]
pub(super) struct Period {
    /// Each path named, with the last kind seen.
    pub(super) changes: BTreeMap<PathBuf, ChangeKind>,
    /// Paths made in the period that the filter does not report themselves but a recursive watch looks into
    /// (directories, if they are, whose files `includes` names).
    pub(super) new_directories: BTreeSet<PathBuf>,
    /// What `prepare` listed of the period's new trees, by tree (outside the table's lock, after the kernel
    /// watched each).
    pub(super) listed: BTreeMap<PathBuf, Listing>,
    /// Paths that went in the period that the filter does not report themselves (directories deleted, or
    /// anything moved out), beneath which it may have reported something.
    pub(super) gone_directories: BTreeSet<PathBuf>,
    /// Whether events of the period were lost, or its report would leave something out: the kernel's queue
    /// overflowed, more paths changed (or new directories came) than one report names, more new trees came than
    /// are watched one by one, or the last report was cut short.
    pub(super) lost: bool,
}

pub(super) type Pending = BTreeMap<u64, Period>;
