//! Watches inside a tenant's file server ([`super::server`]): inotify (the `notify` crate) on a watched path,
//! what changed filtered by the watch's `includes`/`excludes` globs (relative to the watched path, `globset`),
//! coalesced for [`DEBOUNCE`] and written out as one `changed` line per watch. Each watch has its own watcher,
//! dropped with it; how many a tenant may have is bounded by the runner ([`super::service`]).
//!
//! What is reported is the truth at the end of each period, not inotify's story of it: files are replaced, not
//! edited (an editor's or the file server's save writes a temporary file and renames it over the name), so
//! - a watched **file** is watched through its directory and filtered by name (inotify on the file itself
//!   follows the old inode: one `deleted`, then silence);
//! - each changed path is looked at when the period ends: there now and known before is `updated`, there and
//!   new is `added`, gone is `deleted`, and a path that came and went within the period is not reported. What
//!   is known is the watch's listing at its start, kept up to date by what it reports (bounded: past
//!   [`KNOWN_MAX`] paths a recursive watch falls back to inotify's kinds for paths it never saw).
//!
//! A recursive watch registers every directory of its tree with the kernel: one of a tree of more than
//! [`MAX_WATCHED_DIRECTORIES`] is refused (saying to watch further down), so no watch exhausts the tenant's
//! inotify watches or holds the server registering them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use globset::{Glob, GlobSet, GlobSetBuilder};
use notify::{EventKind, RecursiveMode, Watcher};
use parking_lot::Mutex;

use super::protocol::{ChangeKind, FileError};

/// How long changes are gathered before they are reported (an editor's save is several events).
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// Most paths one report of a watch names (a flood beyond it in one period is not itemized).
pub const MAX_CHANGES_PER_REPORT: usize = 1_000;

/// Most paths a watch knows exist (its listing at the start, then what it reported).
pub const KNOWN_MAX: usize = 20_000;

/// Most directories a recursive watch registers (the kernel watches each).
pub const MAX_WATCHED_DIRECTORIES: usize = 4_096;

/// Which paths one watch reports.
struct Filter {
    root: PathBuf,
    recursive: bool,
    includes: Option<GlobSet>,
    excludes: Option<GlobSet>,
}

/// What one watch reports.
struct Watch {
    filter: Arc<Filter>,
    /// Paths under the root known to exist (what tells `added` from `updated`).
    known: BTreeSet<PathBuf>,
    /// Whether `known` holds every path there (false past [`KNOWN_MAX`]).
    complete: bool,
    /// The kernel's watches of this watch (a new directory of a recursive watch is added to them when its
    /// period ends, see [`Watch::settle_all`]); stops watching when dropped.
    watcher: notify::RecommendedWatcher,
}

impl Filter {
    /// Whether a change of `path` is this watch's to report (never the file server's own temporary files).
    fn reports(&self, path: &Path) -> bool {
        let Ok(relative) = path.strip_prefix(&self.root) else {
            return false;
        };
        if path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(super::ops::is_temporary)
        {
            return false;
        }
        let depth = relative.components().count();
        if !self.recursive && depth > 1 {
            return false;
        }
        if depth > 0 && self.excludes.as_ref().is_some_and(|set| set.is_match(relative)) {
            return false;
        }
        match &self.includes {
            Some(set) if depth > 0 => set.is_match(relative),
            _ => true,
        }
    }

    /// Whether what is beneath `dir` is never reported (an excluded directory: not listed, not walked).
    fn excludes_all_of(&self, dir: &Path) -> bool {
        dir.strip_prefix(&self.root).is_ok_and(|relative| {
            relative.components().count() > 0
                && self.excludes.as_ref().is_some_and(|set| set.is_match(relative))
        })
    }
}

impl Watch {
    /// What `path`, reported by inotify as `seen` during the period, is now: `None` when it came and went.
    fn settle(&mut self, path: &Path, seen: ChangeKind) -> Option<ChangeKind> {
        let exists = std::fs::symlink_metadata(path).is_ok();
        let known = self.known.contains(path);
        let kind = match (known, exists) {
            (true, true) => ChangeKind::Updated,
            (true, false) => ChangeKind::Deleted,
            (false, true) if self.complete => ChangeKind::Added,
            // Never listed: inotify's word, but a path that is there was not deleted.
            (false, true) => match seen {
                ChangeKind::Deleted => ChangeKind::Updated,
                seen => seen,
            },
            (false, false) if self.complete => return None,
            (false, false) => ChangeKind::Deleted,
        };
        match kind {
            ChangeKind::Deleted => {
                // What was beneath it went with it.
                let gone: Vec<PathBuf> = self
                    .known
                    .range(path.to_path_buf()..)
                    .take_while(|known| known.starts_with(path))
                    .cloned()
                    .collect();
                for known in gone {
                    self.known.remove(&known);
                }
            }
            _ if self.known.len() < KNOWN_MAX => {
                self.known.insert(path.to_path_buf());
            }
            _ => self.complete = false,
        }
        Some(kind)
    }
}

impl Watch {
    /// What a period's changes are now; with what a new directory of a recursive watch holds already (made
    /// before the kernel watched it: an agent's `mkdir d && echo > d/f` is one step). After a period whose
    /// events the kernel lost, what the watch knows exists is listed again.
    fn settle_all(&mut self, period: Period) -> Vec<(String, ChangeKind)> {
        let Period { changes, lost } = period;
        let mut settled = Vec::new();
        // A path listed from its new directory and then seen in an event of its own is reported once.
        let mut reported: std::collections::HashSet<PathBuf> = std::collections::HashSet::new();
        for (path, seen) in changes {
            if settled.len() >= MAX_CHANGES_PER_REPORT || reported.contains(&path) {
                continue;
            }
            let Some(kind) = self.settle(&path, seen) else {
                continue;
            };
            let new_directory = kind == ChangeKind::Added
                && self.filter.recursive
                && std::fs::symlink_metadata(&path).is_ok_and(|meta| meta.is_dir());
            settled.push((path.display().to_string(), kind));
            reported.insert(path.clone());
            if new_directory {
                // Watched before it is listed. notify adds a new directory to a recursive watch itself, but only
                // after handing over every event it read with its creation (a burst such as an `npm install`
                // is many reads): a file made inside after our listing and before that watch would never be
                // reported. Our request waits until the directory is watched (asking again only adds to the
                // kernel's watch). A directory gone meanwhile fails here and is settled as gone next period.
                let _ = self.watcher.watch(&path, RecursiveMode::Recursive);
                let budget = MAX_CHANGES_PER_REPORT.saturating_sub(settled.len());
                let (inside, _) = listing(&path, true, &self.filter, budget);
                for entry in inside {
                    if self.known.contains(&entry) || reported.contains(&entry) {
                        continue;
                    }
                    if let Some(kind) = self.settle(&entry, ChangeKind::Added) {
                        settled.push((entry.display().to_string(), kind));
                        reported.insert(entry);
                    }
                }
            }
        }
        if lost {
            self.relist();
        }
        settled
    }

    /// Lists again what is beneath the watch's root, in place of what it knows: what came or went while
    /// events were lost is otherwise reported with the wrong kind when it next changes.
    fn relist(&mut self) {
        let root = self.filter.root.clone();
        if !std::fs::symlink_metadata(&root).is_ok_and(|meta| meta.is_dir()) {
            return;
        }
        let (mut known, complete) = listing(&root, self.filter.recursive, &self.filter, KNOWN_MAX);
        known.insert(root);
        (self.known, self.complete) = (known, complete);
    }
}

/// What `filter`'s watch reports of what exists beneath `root` now (`recursive`: the whole tree, links not
/// followed, excluded directories not walked), at most `most` paths; whether that is all of it.
fn listing(root: &Path, recursive: bool, filter: &Filter, most: usize) -> (BTreeSet<PathBuf>, bool) {
    let mut known = BTreeSet::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if known.len() >= most {
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
fn fewer_directories_than(root: &Path, most: usize) -> bool {
    walkdir::WalkDir::new(root)
        .follow_links(false)
        .into_iter()
        .flatten()
        .filter(|entry| entry.file_type().is_dir())
        .nth(most)
        .is_none()
}

fn globs(patterns: &[String]) -> Result<Option<GlobSet>, FileError> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        let glob =
            Glob::new(pattern).map_err(|error| FileError::Invalid(format!("glob {pattern:?}: {error}")))?;
        builder.add(glob);
        // `dir` also covers what is inside it.
        if let Ok(inside) = Glob::new(&format!("{}/**", pattern.trim_end_matches('/'))) {
            builder.add(inside);
        }
    }
    builder
        .build()
        .map(Some)
        .map_err(|error| FileError::Invalid(format!("globs: {error}")))
}

/// What one watch saw in a period not reported yet.
#[derive(Default)]
struct Period {
    /// Each path named, with the last kind seen.
    changes: BTreeMap<PathBuf, ChangeKind>,
    /// Whether the kernel lost events of the period (its queue overflowed).
    lost: bool,
}

type Pending = BTreeMap<u64, Period>;

/// Records what inotify says in `event` for watch `id` (whose paths `filter` chooses) until its period ends: each
/// path it names with the last kind seen. An event queue the kernel overflowed (`Rescan`: more happened at once
/// than it could hold, e.g. an `npm install` in the tree) names no path: the watch's root is reported
/// `updated`, so its client lists it again, rather than nothing said of what was lost; and the watch lists it
/// again too when the period ends.
fn record(pending: &Mutex<Pending>, filter: &Filter, id: u64, event: notify::Event) {
    if event.need_rescan() {
        let mut pending = pending.lock();
        let period = pending.entry(id).or_default();
        period.changes.insert(filter.root.clone(), ChangeKind::Updated);
        period.lost = true;
        return;
    }
    let kind = match event.kind {
        EventKind::Create(_) => ChangeKind::Added,
        EventKind::Remove(_) => ChangeKind::Deleted,
        EventKind::Modify(notify::event::ModifyKind::Name(notify::event::RenameMode::From)) => {
            ChangeKind::Deleted
        }
        EventKind::Modify(notify::event::ModifyKind::Name(notify::event::RenameMode::To)) => {
            ChangeKind::Added
        }
        EventKind::Modify(notify::event::ModifyKind::Metadata(_)) | EventKind::Access(_) => return,
        EventKind::Modify(_) => ChangeKind::Updated,
        _ => return,
    };
    let mut pending = pending.lock();
    for path in event.paths {
        if filter.reports(&path) {
            let changes = &mut pending.entry(id).or_default().changes;
            if changes.len() >= MAX_CHANGES_PER_REPORT && !changes.contains_key(&path) {
                continue;
            }
            // The last word of inotify; what is true is settled when the period ends.
            changes.insert(path, kind);
        }
    }
}

/// The watches of one file server, and the changes not reported yet.
pub struct Watches {
    watches: Arc<Mutex<HashMap<u64, Watch>>>,
    pending: Arc<Mutex<Pending>>,
}

impl Watches {
    /// Watches whose changes `report(watch, changes)` writes out (from a thread of their own, every
    /// [`DEBOUNCE`], while anything is pending).
    pub fn new(report: impl Fn(u64, Vec<(String, ChangeKind)>) + Send + 'static) -> Watches {
        let pending: Arc<Mutex<Pending>> = Arc::default();
        let watches: Arc<Mutex<HashMap<u64, Watch>>> = Arc::default();
        let (taken, settled) = (pending.clone(), Arc::downgrade(&watches));
        std::thread::spawn(move || loop {
            std::thread::sleep(DEBOUNCE);
            let batch = std::mem::take(&mut *taken.lock());
            if batch.is_empty() {
                continue;
            }
            let Some(watches) = settled.upgrade() else {
                return;
            };
            let reports: Vec<(u64, Vec<(String, ChangeKind)>)> = {
                let mut watches = watches.lock();
                batch
                    .into_iter()
                    .filter_map(|(id, changes)| {
                        let watch = watches.get_mut(&id)?;
                        let changes = watch.settle_all(changes);
                        (!changes.is_empty()).then_some((id, changes))
                    })
                    .collect()
            };
            for (watch, changes) in reports {
                report(watch, changes);
            }
        });
        Watches { watches, pending }
    }

    /// Start watch `id` of `root` (an existing path, already confined).
    pub fn add(
        &self,
        id: u64,
        root: PathBuf,
        recursive: bool,
        includes: &[String],
        excludes: &[String],
    ) -> Result<(), FileError> {
        self.add_then(id, root, recursive, includes, excludes, || {})
    }

    /// [`Watches::add`], calling `meanwhile` once the kernel watches and before the watch is in the table (a
    /// test's way into that window).
    fn add_then(
        &self,
        id: u64,
        root: PathBuf,
        recursive: bool,
        includes: &[String],
        excludes: &[String],
        meanwhile: impl FnOnce(),
    ) -> Result<(), FileError> {
        let filter = Arc::new(Filter {
            root: root.clone(),
            recursive,
            includes: globs(includes)?,
            excludes: globs(excludes)?,
        });
        let pending = Arc::downgrade(&self.pending);
        let reported = filter.clone();
        // The handler runs on the watcher's thread: it only records, under the pending lock alone.
        let handler = move |event: notify::Result<notify::Event>| {
            if let (Ok(event), Some(pending)) = (event, pending.upgrade()) {
                record(&pending, &reported, id, event);
            }
        };
        // Symlinks are not followed: a link to `/` in the workspace must not make the watch walk the system.
        let config = notify::Config::default().with_follow_symlinks(false);
        let mut watcher = notify::RecommendedWatcher::new(handler, config)
            .map_err(|error| FileError::Unavailable(format!("cannot watch: {error}")))?;
        // A file is watched through its directory (saves replace its inode), and filtered by name.
        let is_dir = std::fs::symlink_metadata(&root).is_ok_and(|meta| meta.is_dir());
        if is_dir && recursive && !fewer_directories_than(&root, MAX_WATCHED_DIRECTORIES) {
            return Err(FileError::Invalid(format!(
                "{} holds more than {MAX_WATCHED_DIRECTORIES} directories: watch a directory further down, or \
                 this one without `recursive`",
                root.display()
            )));
        }
        let (watched, mode) = match (is_dir, root.parent()) {
            (false, Some(parent)) => (parent.to_path_buf(), RecursiveMode::NonRecursive),
            _ if recursive => (root.clone(), RecursiveMode::Recursive),
            _ => (root.clone(), RecursiveMode::NonRecursive),
        };
        // Listed before the kernel watches: what appears meanwhile is reported as added.
        let (known, complete) = if is_dir {
            // The root itself is known too: its own deletion is reported.
            let (mut known, complete) = listing(&root, recursive, &filter, KNOWN_MAX);
            known.insert(root.clone());
            (known, complete)
        } else {
            (BTreeSet::from([root.clone()]), true)
        };
        // The table is held from the kernel's first watch until the watch is in it: the reporting thread settles
        // a period's changes under it, and would drop those of a watch it cannot find yet.
        let mut watches = self.watches.lock();
        watcher
            .watch(&watched, mode)
            .map_err(|error| FileError::Unavailable(format!("cannot watch {}: {error}", root.display())))?;
        meanwhile();
        watches.insert(
            id,
            Watch {
                filter,
                known,
                complete,
                watcher,
            },
        );
        Ok(())
    }

    /// Stop watch `id` (nothing more is reported for it).
    pub fn remove(&self, id: u64) {
        self.watches.lock().remove(&id);
        self.pending.lock().remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recursive_watch_of_a_tree_of_too_many_directories_is_refused_and_one_further_down_is_not() {
        let root = tempfile::tempdir().expect("root");
        let tree = root.path().canonicalize().expect("real").join("tree");
        for n in 0..MAX_WATCHED_DIRECTORIES {
            std::fs::create_dir_all(tree.join(format!("d{}", n / 64)).join(n.to_string())).expect("dir");
        }
        let watches = Watches::new(|_, _| {});
        let refused = watches.add(1, tree.clone(), true, &[], &[]);
        assert!(
            matches!(&refused, Err(FileError::Invalid(why)) if why.contains("further down")),
            "{refused:?}"
        );
        watches
            .add(2, tree.clone(), false, &[], &[])
            .expect("non-recursive");
        watches
            .add(3, tree.join("d0"), true, &[], &[])
            .expect("a subtree");
    }

    /// A directory new in a recursive watch is watched before its period's listing of it: a file made inside it
    /// afterwards is reported even when notify has not watched it yet. notify adds it only after handing over
    /// every event it read along with its creation; here it never does (the kernel watches the root alone), which
    /// is the state of that window, held.
    #[test]
    fn a_new_directory_is_watched_before_it_is_listed() {
        let dir = tempfile::tempdir().expect("dir");
        let root = dir.path().canonicalize().expect("real");
        let (reports, reported) = std::sync::mpsc::channel();
        let watches = Watches::new(move |watch, changes| {
            let _ = reports.send((watch, changes));
        });
        let filter = Arc::new(Filter {
            root: root.clone(),
            recursive: true,
            includes: None,
            excludes: None,
        });
        let (pending, recorded) = (Arc::downgrade(&watches.pending), filter.clone());
        let mut watcher = notify::RecommendedWatcher::new(
            move |event: notify::Result<notify::Event>| {
                if let (Ok(event), Some(pending)) = (event, pending.upgrade()) {
                    record(&pending, &recorded, 3, event);
                }
            },
            notify::Config::default().with_follow_symlinks(false),
        )
        .expect("watcher");
        watcher
            .watch(&root, RecursiveMode::NonRecursive)
            .expect("watch the root");
        watches.watches.lock().insert(
            3,
            Watch {
                filter,
                known: BTreeSet::from([root.clone()]),
                complete: true,
                watcher,
            },
        );
        let wait = |what: &str| reported.recv_timeout(Duration::from_secs(10)).expect(what);

        std::fs::create_dir(root.join("d")).expect("mkdir");
        let made = wait("the new directory reported");
        assert_eq!(
            made,
            (3, vec![(root.join("d").display().to_string(), ChangeKind::Added)])
        );
        std::fs::write(root.join("d").join("f"), b"x").expect("write inside");
        let (watch, changes) = wait("the file made inside it reported");
        assert_eq!(watch, 3);
        assert!(
            changes.contains(&(root.join("d").join("f").display().to_string(), ChangeKind::Added)),
            "{changes:?}"
        );
    }

    /// What happens while a watch is being added, after the kernel watches, is reported, even when the reporting
    /// thread takes that period's changes before the watch is in the table.
    #[test]
    fn a_change_made_while_the_watch_is_added_is_reported() {
        let dir = tempfile::tempdir().expect("dir");
        let root = dir.path().canonicalize().expect("real");
        let (reports, reported) = std::sync::mpsc::channel();
        let watches = Watches::new(move |watch, changes| {
            let _ = reports.send((watch, changes));
        });
        let pending = watches.pending.clone();
        let meanwhile = || {
            std::fs::write(root.join("early"), b"x").expect("write");
            // Until the change is recorded, and then until the reporting thread has taken it.
            let until = |what: &str, done: &dyn Fn() -> bool| {
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while !done() {
                    assert!(std::time::Instant::now() < deadline, "{what}");
                    std::thread::yield_now();
                }
            };
            until("the change recorded", &|| pending.lock().contains_key(&4));
            until("the change taken for reporting", &|| {
                !pending.lock().contains_key(&4)
            });
        };
        watches
            .add_then(4, root.clone(), true, &[], &[], meanwhile)
            .expect("watch");
        let (watch, changes) = reported
            .recv_timeout(Duration::from_secs(10))
            .expect("the change reported");
        assert_eq!(watch, 4);
        assert_eq!(
            changes,
            vec![(root.join("early").display().to_string(), ChangeKind::Added)]
        );
    }

    /// After the kernel lost a watch's events, the watch lists again what exists: a file made and one deleted
    /// while events were lost are each reported with their true kind when they next change.
    #[test]
    fn after_lost_events_the_watch_lists_again_what_exists() {
        let dir = tempfile::tempdir().expect("dir");
        let root = dir.path().canonicalize().expect("real");
        std::fs::write(root.join("kept"), b"x").expect("write");
        let (reports, reported) = std::sync::mpsc::channel();
        let watches = Watches::new(move |watch, changes| {
            let _ = reports.send((watch, changes));
        });
        watches.add(8, root.clone(), true, &[], &[]).expect("watch");
        let wait = |what: &str| reported.recv_timeout(Duration::from_secs(10)).expect(what);
        let filter = {
            let mut table = watches.watches.lock();
            let watch = table.get_mut(&8).expect("the watch");
            // What the lost events would have said: `kept` was made, `phantom` deleted.
            watch.known.remove(&root.join("kept"));
            watch.known.insert(root.join("phantom"));
            watch.filter.clone()
        };
        let overflow = notify::Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan);
        record(&watches.pending, &filter, 8, overflow);
        assert_eq!(
            wait("the overflow reported"),
            (8, vec![(root.display().to_string(), ChangeKind::Updated)])
        );

        std::fs::write(root.join("kept"), b"y").expect("write again");
        assert_eq!(
            wait("the write reported"),
            (
                8,
                vec![(root.join("kept").display().to_string(), ChangeKind::Updated)]
            )
        );
        std::fs::write(root.join("phantom"), b"z").expect("make");
        assert_eq!(
            wait("the new file reported"),
            (
                8,
                vec![(root.join("phantom").display().to_string(), ChangeKind::Added)]
            )
        );
    }

    /// A lost event queue (notify's `Rescan`, from the kernel's `IN_Q_OVERFLOW`) is reported as the root
    /// `updated`: the client lists it again instead of missing what the queue lost.
    #[test]
    fn an_overflowed_event_queue_is_reported_as_the_root_updated() {
        let dir = tempfile::tempdir().expect("dir");
        let root = dir.path().canonicalize().expect("real");
        let (reports, reported) = std::sync::mpsc::channel();
        let watches = Watches::new(move |watch, changes| {
            let _ = reports.send((watch, changes));
        });
        watches.add(7, root.clone(), true, &[], &[]).expect("watch");
        let filter = watches.watches.lock().get(&7).expect("the watch").filter.clone();
        let overflow = notify::Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan);
        record(&watches.pending, &filter, 7, overflow);
        let (watch, changes) = reported.recv_timeout(Duration::from_secs(10)).expect("a report");
        assert_eq!(watch, 7);
        assert_eq!(changes, vec![(root.display().to_string(), ChangeKind::Updated)]);
    }
}
