//! What the reporting thread does for a period before settling it, outside the watch table's lock: the kernel's
//! watches brought up to date, new trees listed, and after lost events the whole tree listed again; and the
//! walks it is made of.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use notify::{RecursiveMode, Watcher};
use parking_lot::Mutex;

use super::super::protocol::ChangeKind;
use super::filter::{is_directory, Filter};
use super::period::{
    Listing, Period, KNOWN_MAX, MAX_CHANGES_PER_REPORT, MAX_LISTED_ENTRIES, MAX_NEW_TREES_PER_PERIOD,
    MAX_WATCHED_DIRECTORIES,
};

/// What the reporting thread does for a watch's period before settling it, outside the table's lock (each
/// request to notify waits for notify's thread, which may be reading a burst, and a listing walks a tree, while
/// the file server's reader needs the table for Watch and Unwatch): brings the kernel's watches up to date, lists
/// the period's new trees (into [`Period::listed`]), and after lost events returns a new listing of the tree, to
/// take the place of what the watch knows.
///
/// - A new directory of a recursive watch is watched before it is listed. notify adds it itself, but only
///   after handing over every event it read with its creation (a burst such as an `npm install` is many reads),
///   so a file made inside after our listing and before that watch would never be reported. Our request waits
///   until it is watched (for a directory notify has added, it only adds to the kernel's watch; a directory
///   gone meanwhile fails, and is settled as gone). One request per new tree, what is beneath it walked with it;
///   past [`MAX_NEW_TREES_PER_PERIOD`] the period is taken as lost instead.
/// - After lost events (the kernel's queue overflowed, a report would have named too many paths, or too many
///   new trees) notify may have added no directory whose creation was lost: the whole tree is watched again,
///   within [`MAX_WATCHED_DIRECTORIES`], and listed again, so what came or went meanwhile is reported with its
///   true kind when it next changes; and the root is reported `updated`, so the client lists it again.
pub(super) fn prepare(
    watcher: &Mutex<notify::RecommendedWatcher>,
    filter: &Filter,
    period: &mut Period,
) -> Option<Listing> {
    let root = &filter.root;
    if filter.recursive && !period.lost {
        let added = period
            .changes
            .iter()
            .filter(|(_, seen)| **seen == ChangeKind::Added)
            .map(|(path, _)| path);
        let candidates: BTreeSet<&PathBuf> = added.chain(period.new_directories.iter()).collect();
        let mut trees: Vec<&Path> = Vec::new();
        let mut listed = BTreeMap::new();
        let mut looked_at = 0;
        for path in candidates {
            if trees.last().is_some_and(|tree| path.starts_with(tree)) || !is_directory(path) {
                continue;
            }
            if trees.len() == MAX_NEW_TREES_PER_PERIOD {
                period.lost = true;
                break;
            }
            let _ = watcher.lock().watch(path, RecursiveMode::Recursive);
            let inside = listing(path, true, filter, MAX_CHANGES_PER_REPORT, &mut looked_at);
            listed.insert(path.clone(), inside);
            trees.push(path);
        }
        period.listed = listed;
    }
    if !period.lost || !is_directory(root) {
        return None;
    }
    period.changes.insert(root.clone(), ChangeKind::Updated);
    if filter.recursive && fewer_directories_than(root, MAX_WATCHED_DIRECTORIES) {
        let _ = watcher.lock().watch(root, RecursiveMode::Recursive);
    }
    let (mut known, complete) = listing(root, filter.recursive, filter, KNOWN_MAX, &mut 0);
    known.insert(root.clone());
    Some((known, complete))
}

/// What `filter`'s watch reports of what exists beneath `root` now (`recursive`: the whole tree, links not
/// followed, excluded directories not walked), at most `most` paths; whether that is all of it.
/// `looked_at` counts the entries looked at, reported or not, and the listing stops (incomplete) at
/// [`MAX_LISTED_ENTRIES`] of them: callers listing several trees share one count.
pub(super) fn listing(
    root: &Path,
    recursive: bool,
    filter: &Filter,
    most: usize,
    looked_at: &mut usize,
) -> Listing {
    let mut known = BTreeSet::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            *looked_at += 1;
            if known.len() >= most || *looked_at > MAX_LISTED_ENTRIES {
                return (known, false);
            }
            let path = entry.path();
            if recursive
                && entry.file_type().is_ok_and(|kind| kind.is_dir())
                && !filter.excludes_all_of(&path)
            {
                pending.push(path.clone());
            }
            if filter.reports(&path) {
                known.insert(path);
            }
        }
    }
    (known, true)
}

/// Whether the tree beneath `root` (links not followed) holds at most `most` directories, `root` included.
pub(super) fn fewer_directories_than(root: &Path, most: usize) -> bool {
    walkdir::WalkDir::new(root)
        .follow_links(false)
        .into_iter()
        .flatten()
        .filter(|entry| entry.file_type().is_dir())
        .nth(most)
        .is_none()
}
