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
//!   [`KNOWN_MAX`] paths a recursive watch falls back to inotify's kinds for paths it never saw);
//! - what the kernel could not say is settled from what is there: a new directory's contents (made before it
//!   was watched) are listed, what a directory replaced or moved out held is looked at again, and after events
//!   were lost (the kernel's queue overflowed, or a period held more than a report names) the whole tree is
//!   listed again, its root reported `updated` (see `prepare`).
//!
//! A recursive watch registers every directory of its tree with the kernel: one of a tree of more than
//! [`MAX_WATCHED_DIRECTORIES`] is refused at its start (saying to watch further down), so no watch starts by
//! exhausting the tenant's inotify watches or holding the server registering them. Directories made later are
//! watched as they come (by notify, and by `prepare`), without that bound, as the tenant's own per-user
//! inotify limit allows; a tree grown past it is watched again after an overflow only within it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use notify::{EventKind, RecursiveMode, Watcher};
use parking_lot::Mutex;

use super::protocol::{ChangeKind, FileError};

mod filter;
mod period;
mod prepare;

use filter::{globs, is_directory, Filter};
use period::{Listing, Pending, Period};
pub use period::{
    DEBOUNCE, KNOWN_MAX, MAX_CHANGES_PER_REPORT, MAX_LISTED_ENTRIES, MAX_NEW_TREES_PER_PERIOD,
    MAX_WATCHED_DIRECTORIES,
};
use prepare::{fewer_directories_than, listing, prepare};

/// What one watch reports.
struct Watch {
    filter: Arc<Filter>,
    /// Paths under the root known to exist (what tells `added` from `updated`).
    known: BTreeSet<PathBuf>,
    /// Whether `known` holds every path there (false past [`KNOWN_MAX`]).
    complete: bool,
    /// The kernel's watches of this watch (brought up to date when a period ends, see [`prepare`]); stops
    /// watching when dropped. Its own lock: a request to notify waits for notify's thread, never under the
    /// table's lock.
    watcher: Arc<Mutex<notify::RecommendedWatcher>>,
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
    /// before the kernel watched it: an agent's `mkdir d && echo > d/f` is one step), as [`prepare`] listed it
    /// once the kernel watched it. Also whether the report leaves anything out (more than
    /// [`MAX_CHANGES_PER_REPORT`] paths, or listings cut short): the watch must then be listed again.
    fn settle_all(&mut self, period: Period) -> (Vec<(String, ChangeKind)>, bool) {
        let Period {
            changes,
            new_directories,
            gone_directories,
            listed,
            lost,
        } = period;
        let mut settling = Settling {
            settled: Vec::new(),
            reported: std::collections::HashSet::new(),
            cut_short: false,
        };
        for (path, seen) in changes {
            if settling.settled.len() >= MAX_CHANGES_PER_REPORT {
                settling.cut_short = true;
                break;
            }
            if settling.reported.contains(&path) {
                continue;
            }
            let Some(kind) = self.settle(&path, seen) else {
                continue;
            };
            settling.settled.push((path.display().to_string(), kind));
            settling.reported.insert(path.clone());
            if lost {
                // The whole tree is listed again instead.
                continue;
            }
            if seen == ChangeKind::Added && kind == ChangeKind::Updated {
                // Replaced in the period (`mv d out && mkdir d`): what it held went with the old one.
                self.settle_known_beneath(&path, &mut settling);
            }
            // Made in the period, or replaced in it (`rm -rf d && mkdir d`: known before, so `updated`); `prepare`
            // listed the trees whose last event was one of these.
            if seen == ChangeKind::Added {
                self.list_new_directory(&path, &listed, &mut settling);
            }
        }
        // Directories the filter does not report themselves that went (deleted, moved out): what they held that
        // it does report went with them.
        if !lost {
            for path in gone_directories {
                self.settle_known_beneath(&path, &mut settling);
            }
        }
        // New directories the filter does not report themselves (`includes` names files), which may hold what it
        // does (`prepare` listed each new tree once).
        if !lost {
            for path in new_directories {
                if !settling.reported.contains(&path) {
                    self.list_new_directory(&path, &listed, &mut settling);
                }
            }
        }
        (settling.settled, settling.cut_short)
    }

    /// Reports what the watch knew beneath `path` as it is now (`deleted`, or `updated` if the name is there
    /// again), when `path` went or was replaced without an event for each.
    fn settle_known_beneath(&mut self, path: &Path, settling: &mut Settling) {
        if settling.settled.len() >= MAX_CHANGES_PER_REPORT {
            // Full: said only if something is left out.
            let mut after = self
                .known
                .range(path.to_path_buf()..)
                .skip_while(|known| known.as_path() == path);
            settling.cut_short |= after.next().is_some_and(|known| known.starts_with(path));
            return;
        }
        let beneath: Vec<PathBuf> = self
            .known
            .range(path.to_path_buf()..)
            .skip_while(|known| known.as_path() == path)
            .take_while(|known| known.starts_with(path))
            .cloned()
            .collect();
        for known in beneath {
            if settling.settled.len() >= MAX_CHANGES_PER_REPORT {
                settling.cut_short = true;
                return;
            }
            if settling.reported.contains(&known) {
                continue;
            }
            if let Some(kind) = self.settle(&known, ChangeKind::Deleted) {
                settling.settled.push((known.display().to_string(), kind));
                settling.reported.insert(known);
            }
        }
    }

    /// Reports what the new tree `path` holds, as `prepare` listed it (a directory beneath one is reported with
    /// it; a path it did not list is left alone), if it is still a directory (gone since, what it held is not
    /// reported: what was listed never was).
    fn list_new_directory(
        &mut self,
        path: &Path,
        listed: &BTreeMap<PathBuf, Listing>,
        settling: &mut Settling,
    ) {
        let Some((inside, complete)) = listed.get(path) else {
            return;
        };
        if !is_directory(path) {
            return;
        }
        settling.cut_short |= !complete;
        for entry in inside {
            if self.known.contains(entry) || settling.reported.contains(entry) {
                continue;
            }
            if settling.settled.len() >= MAX_CHANGES_PER_REPORT {
                settling.cut_short = true;
                return;
            }
            if let Some(kind) = self.settle(entry, ChangeKind::Added) {
                settling.settled.push((entry.display().to_string(), kind));
                settling.reported.insert(entry.clone());
            }
        }
    }
}

/// One period's report as it is settled.
struct Settling {
    settled: Vec<(String, ChangeKind)>,
    /// What it names (a path listed from its new directory and then seen in an event of its own is named once).
    reported: std::collections::HashSet<PathBuf>,
    /// Whether it leaves anything out.
    cut_short: bool,
}

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
        // Both ends of a rename, after an event for each: nothing more to say (and `updated` for both would
        // hide that the new name's directory is new).
        EventKind::Modify(notify::event::ModifyKind::Name(notify::event::RenameMode::Both))
        | EventKind::Modify(notify::event::ModifyKind::Metadata(_))
        | EventKind::Access(_) => return,
        EventKind::Modify(_) => ChangeKind::Updated,
        _ => return,
    };
    // A directory made, or anything moved in (which may be one).
    let may_be_directory = match event.kind {
        EventKind::Create(notify::event::CreateKind::Folder) => true,
        EventKind::Create(_) => false,
        _ => kind == ChangeKind::Added,
    };
    // A directory deleted, or anything moved out (which may have been one).
    let may_have_been_directory = match event.kind {
        EventKind::Remove(notify::event::RemoveKind::Folder) => true,
        EventKind::Remove(_) => false,
        _ => kind == ChangeKind::Deleted,
    };
    // Sorted out before the lock, which every watch's handler and the reporting thread share (one stat for a
    // path moved in or a directory made that the filter does not report).
    let sorted: Vec<(PathBuf, Noted)> = event
        .paths
        .into_iter()
        .filter_map(|path| {
            let noted = if filter.reports(&path) {
                Noted::Change
            } else if !filter.may_hold_reported(&path) {
                return None;
            } else if may_be_directory && is_directory(&path) {
                Noted::NewDirectory
            } else if may_have_been_directory {
                Noted::GoneDirectory
            } else {
                return None;
            };
            Some((path, noted))
        })
        .collect();
    if sorted.is_empty() {
        return;
    }
    let mut pending = pending.lock();
    let period = pending.entry(id).or_default();
    for (path, noted) in sorted {
        match noted {
            Noted::Change => {
                if period.changes.len() >= MAX_CHANGES_PER_REPORT && !period.changes.contains_key(&path) {
                    period.lost = true;
                    continue;
                }
                // The last word of inotify, but what was made in the period stays made (a directory renamed over a
                // new one ends with the old one's `DELETE_SELF`, which the watch of a new tree asks for); what is
                // true is settled when the period ends.
                let seen = period.changes.entry(path).or_insert(kind);
                if *seen != ChangeKind::Added {
                    *seen = kind;
                }
            }
            Noted::NewDirectory => {
                if period.new_directories.len() >= MAX_CHANGES_PER_REPORT {
                    period.lost = true;
                    continue;
                }
                period.new_directories.insert(path);
            }
            // Only memory, and one look into what is known each when the period ends: as many as the watch knows
            // paths (a `rm -rf target` of a watch whose includes name sources is thousands of directories).
            Noted::GoneDirectory => {
                if period.gone_directories.len() >= KNOWN_MAX {
                    period.lost = true;
                    continue;
                }
                period.gone_directories.insert(path);
            }
        }
    }
}

/// What [`record`] keeps of one path of an event.
enum Noted {
    /// A change of a path the watch reports.
    Change,
    /// A directory made or moved in that the watch does not report itself.
    NewDirectory,
    /// A path the watch does not report itself that went (a directory deleted, or anything moved out).
    GoneDirectory,
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
            let prepared: Vec<(u64, Period, Option<Listing>)> = batch
                .into_iter()
                .filter_map(|(id, period)| {
                    let (watcher, filter) = {
                        let watches = watches.lock();
                        let watch = watches.get(&id)?;
                        (watch.watcher.clone(), watch.filter.clone())
                    };
                    let mut period = period;
                    let listed = prepare(&watcher, &filter, &mut period);
                    Some((id, period, listed))
                })
                .collect();
            let reports: Vec<(u64, Vec<(String, ChangeKind)>)> = {
                let mut watches = watches.lock();
                prepared
                    .into_iter()
                    .filter_map(|(id, period, listed)| {
                        let watch = watches.get_mut(&id)?;
                        let (changes, cut_short) = watch.settle_all(period);
                        match listed {
                            // Listed again: what the report leaves out is in the new listing, its root reported.
                            Some((known, complete)) => (watch.known, watch.complete) = (known, complete),
                            // Listed again next period, and its root reported: what this report leaves out.
                            None if cut_short => taken.lock().entry(id).or_default().lost = true,
                            None => {}
                        }
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

    /// [`Watches::add`], calling `meanwhile` once the kernel watches and before it returns (a test's way into
    /// that window).
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
        let watcher = notify::RecommendedWatcher::new(handler, config)
            .map_err(|error| FileError::Unavailable(format!("cannot watch: {error}")))?;
        // A file is watched through its directory (saves replace its inode), and filtered by name.
        let is_dir = is_directory(&root);
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
        // Listed before the kernel watches: what is made between the two says nothing until it next changes (then
        // `added`); a client lists the path after its watch has started.
        let (known, complete) = if is_dir {
            // The root itself is known too: its own deletion is reported.
            let (mut known, complete) = listing(&root, recursive, &filter, KNOWN_MAX, &mut 0);
            known.insert(root.clone());
            (known, complete)
        } else {
            (BTreeSet::from([root.clone()]), true)
        };
        // In the table before the kernel watches: the reporting thread drops the changes of a watch it cannot find.
        let watcher = Arc::new(Mutex::new(watcher));
        self.watches.lock().insert(
            id,
            Watch {
                filter,
                known,
                complete,
                watcher: watcher.clone(),
            },
        );
        let watching = watcher.lock().watch(&watched, mode);
        if let Err(error) = watching {
            self.remove(id);
            return Err(FileError::Unavailable(format!(
                "cannot watch {}: {error}",
                root.display()
            )));
        }
        meanwhile();
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
    use std::time::Duration;

    use std::sync::mpsc::{channel, Receiver};

    type Reports = Receiver<(u64, Vec<(String, ChangeKind)>)>;

    /// A temporary directory (removed when the first is dropped) and its real path.
    fn temporary_root() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("dir");
        let root = dir.path().canonicalize().expect("real");
        (dir, root)
    }

    /// Writes `path` and waits for the kind watch `id` reports it with.
    fn written_and_reported(reported: &Reports, id: u64, path: &Path) -> ChangeKind {
        std::fs::write(path, b"x").expect("write");
        kind_reported(reported, id, path)
    }

    /// The kind `changes` report `path` with, if they name it.
    fn kind_named(changes: &[(String, ChangeKind)], path: &Path) -> Option<ChangeKind> {
        let named = path.display().to_string();
        changes
            .iter()
            .find(|(path, _)| *path == named)
            .map(|(_, kind)| *kind)
    }

    /// Watch `id`'s filter.
    fn filter_of(watches: &Watches, id: u64) -> Arc<Filter> {
        watches.watches.lock().get(&id).expect("the watch").filter.clone()
    }

    /// notify's event for the kernel's overflowed queue (`IN_Q_OVERFLOW`).
    fn overflow() -> notify::Event {
        notify::Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan)
    }

    /// Watches whose reports arrive on the receiver.
    fn reporting() -> (Watches, Reports) {
        let (reports, reported) = channel();
        let watches = Watches::new(move |watch, changes| {
            let _ = reports.send((watch, changes));
        });
        (watches, reported)
    }

    /// The kind of the first report of watch `id` naming `path` (other reports are passed over: a write may be
    /// reported in two periods).
    fn kind_reported(reported: &Reports, id: u64, path: &Path) -> ChangeKind {
        let named = path.display().to_string();
        loop {
            let (watch, changes) = reported
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("no report naming {named}"));
            if let Some((_, kind)) = changes.iter().find(|(path, _)| watch == id && *path == named) {
                return *kind;
            }
        }
    }

    /// Watch `id`, recursive, of `root`, knowing `known`, whose kernel watch is of `root` alone: notify adds no
    /// directory made beneath it, which is the state of the window between notify handing over a new
    /// directory's creation and watching it, held.
    fn watch_of_the_root_alone(watches: &Watches, id: u64, root: &Path, known: BTreeSet<PathBuf>) {
        watch_of_the_root_alone_including(watches, id, root, known, &[]);
    }

    /// [`watch_of_the_root_alone`], reporting only what `includes` names.
    fn watch_of_the_root_alone_including(
        watches: &Watches,
        id: u64,
        root: &Path,
        known: BTreeSet<PathBuf>,
        includes: &[String],
    ) {
        let filter = Arc::new(Filter {
            root: root.to_path_buf(),
            recursive: true,
            includes: globs(includes).expect("globs"),
            excludes: None,
        });
        let (pending, recorded) = (Arc::downgrade(&watches.pending), filter.clone());
        let mut watcher = notify::RecommendedWatcher::new(
            move |event: notify::Result<notify::Event>| {
                if let (Ok(event), Some(pending)) = (event, pending.upgrade()) {
                    record(&pending, &recorded, id, event);
                }
            },
            notify::Config::default().with_follow_symlinks(false),
        )
        .expect("watcher");
        watcher
            .watch(root, RecursiveMode::NonRecursive)
            .expect("watch the root");
        watches.watches.lock().insert(
            id,
            Watch {
                filter,
                known,
                complete: true,
                watcher: Arc::new(Mutex::new(watcher)),
            },
        );
    }

    /// What notify has not watched yet is watched before it is listed: a file made in a new directory of a
    /// recursive watch after its period ended is reported.
    #[test]
    fn a_new_directory_notify_has_not_watched_is_watched_when_its_period_ends() {
        let (_dir, root) = temporary_root();
        let (watches, reported) = reporting();
        watch_of_the_root_alone(&watches, 3, &root, BTreeSet::from([root.clone()]));

        std::fs::create_dir(root.join("d")).expect("mkdir");
        assert_eq!(kind_reported(&reported, 3, &root.join("d")), ChangeKind::Added);
        std::fs::write(root.join("d").join("f"), b"x").expect("write inside");
        assert_eq!(
            kind_reported(&reported, 3, &root.join("d").join("f")),
            ChangeKind::Added
        );
    }

    /// A directory replaced within a period (`rm -rf d && mkdir d`, so known before and `updated`) is listed as a
    /// new one: what the new directory already holds is reported.
    #[test]
    fn a_replaced_directory_is_listed_as_a_new_one() {
        let (_dir, root) = temporary_root();
        std::fs::create_dir(root.join("d")).expect("mkdir");
        std::fs::write(root.join("d").join("g"), b"x").expect("write");
        let (watches, reported) = reporting();
        // Known before the period: `d`; made in it with `d` again: `d/g`.
        watch_of_the_root_alone(&watches, 5, &root, BTreeSet::from([root.clone(), root.join("d")]));
        let filter = filter_of(&watches, 5);
        let made =
            notify::Event::new(EventKind::Create(notify::event::CreateKind::Folder)).add_path(root.join("d"));
        record(&watches.pending, &filter, 5, made);
        assert_eq!(
            kind_reported(&reported, 5, &root.join("d").join("g")),
            ChangeKind::Added
        );
    }

    /// A directory replaced by another under its name within a period (`mv d out && mkdir d`): what the old one
    /// held is reported `deleted`, or `updated` where the new one holds the same name, and the rest `added`.
    #[test]
    fn a_directory_replaced_under_its_name_reports_what_each_held() {
        let (_dir, root) = temporary_root();
        let d = root.join("d");
        std::fs::create_dir(&d).expect("mkdir");
        std::fs::write(d.join("same"), b"x").expect("write");
        std::fs::write(d.join("new"), b"x").expect("write");
        let (watches, reported) = reporting();
        // Known before the period: the old `d`, holding `old` and `same`.
        let known = BTreeSet::from([root.clone(), d.clone(), d.join("old"), d.join("same")]);
        watch_of_the_root_alone(&watches, 14, &root, known);
        let made =
            notify::Event::new(EventKind::Create(notify::event::CreateKind::Folder)).add_path(d.clone());
        record(&watches.pending, &filter_of(&watches, 14), 14, made);
        let (watch, changes) = reported.recv_timeout(Duration::from_secs(10)).expect("a report");
        assert_eq!(watch, 14);
        let kind_of = |name: &str| kind_named(&changes, &d.join(name));
        assert_eq!(kind_of("old"), Some(ChangeKind::Deleted), "{changes:?}");
        assert_eq!(kind_of("same"), Some(ChangeKind::Updated), "{changes:?}");
        assert_eq!(kind_of("new"), Some(ChangeKind::Added), "{changes:?}");
    }

    /// A directory a watch does not report itself (its `includes` names files) moved out: the files it held that
    /// the watch reported are reported `deleted`, and those it holds under its new name `added`.
    #[test]
    fn a_directory_outside_the_includes_moved_reports_its_files_deleted_and_added() {
        let (_dir, root) = temporary_root();
        std::fs::create_dir(root.join("src")).expect("mkdir");
        std::fs::write(root.join("src").join("a.rs"), b"x").expect("write");
        let (watches, reported) = reporting();
        watches
            .add(15, root.clone(), true, &["**/*.rs".to_string()], &[])
            .expect("watch");
        std::fs::rename(root.join("src"), root.join("lib")).expect("move");
        let (before, after) = (root.join("src").join("a.rs"), root.join("lib").join("a.rs"));
        let (before, after) = (before.display().to_string(), after.display().to_string());
        // Both, in one report or two.
        let mut kinds: HashMap<String, ChangeKind> = HashMap::new();
        while !(kinds.contains_key(&before) && kinds.contains_key(&after)) {
            let (watch, changes) = reported
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("reported so far: {kinds:?}"));
            assert_eq!(watch, 15);
            kinds.extend(changes);
        }
        assert_eq!(kinds[&before], ChangeKind::Deleted);
        assert_eq!(kinds[&after], ChangeKind::Added);
    }

    /// A new directory a watch does not report itself (its `includes` names files) is watched and listed all the
    /// same: the files it names inside are reported, those made before and after its period ended.
    #[test]
    fn a_new_directory_outside_the_includes_is_watched_and_listed() {
        let (_dir, root) = temporary_root();
        let (watches, reported) = reporting();
        watch_of_the_root_alone_including(
            &watches,
            6,
            &root,
            BTreeSet::from([root.clone()]),
            &["**/*.rs".to_string()],
        );
        let src = root.join("src");
        std::fs::create_dir(&src).expect("mkdir");
        assert_eq!(
            written_and_reported(&reported, 6, &src.join("early.rs")),
            ChangeKind::Added
        );
        assert_eq!(
            written_and_reported(&reported, 6, &src.join("late.rs")),
            ChangeKind::Added
        );
    }

    /// Watch `id` of `root`, recursive, reporting `**/*.rs`, is handed `flood` (paths beneath the root it does not
    /// report): nothing of it is reported, not even the root, and a source file written next is reported alone.
    fn a_flood_the_includes_leave_out_is_not_reported(id: u64, root: &Path, flood: notify::Event) {
        let (watches, reported) = reporting();
        watches
            .add(id, root.to_path_buf(), true, &["**/*.rs".to_string()], &[])
            .expect("watch");
        record(&watches.pending, &filter_of(&watches, id), id, flood);
        let source = root.join("x.rs");
        std::fs::write(&source, b"x").expect("write");
        loop {
            let (watch, changes) = reported.recv_timeout(Duration::from_secs(10)).expect("a report");
            assert_eq!(watch, id);
            let named: Vec<&String> = changes.iter().map(|(path, _)| path).collect();
            assert!(!named.contains(&&root.display().to_string()), "{changes:?}");
            if named.contains(&&source.display().to_string()) {
                break;
            }
        }
    }

    /// Files made that a watch's `includes` leave out are not taken for new directories.
    #[test]
    fn a_flood_of_files_the_includes_leave_out_is_not_reported() {
        let (_dir, root) = temporary_root();
        let mut flood = notify::Event::new(EventKind::Create(notify::event::CreateKind::File));
        for n in 0..=MAX_CHANGES_PER_REPORT {
            let object = root.join(format!("o{n}.o"));
            std::fs::write(&object, b"").expect("write");
            flood = flood.add_path(object);
        }
        a_flood_the_includes_leave_out_is_not_reported(13, &root, flood);
    }

    /// Directories deleted that a watch's `includes` leave out (`rm -rf target`), more than one report names, are
    /// looked into, not taken for lost events.
    #[test]
    fn a_flood_of_directories_deleted_the_includes_leave_out_is_not_reported() {
        let (_dir, root) = temporary_root();
        let mut flood = notify::Event::new(EventKind::Remove(notify::event::RemoveKind::Folder));
        for n in 0..=MAX_CHANGES_PER_REPORT {
            flood = flood.add_path(root.join("target").join(format!("d{n}")));
        }
        a_flood_the_includes_leave_out_is_not_reported(16, &root, flood);
    }

    /// A directory moved in over one of the same name (`mv d old && mv new d`: notify's last event for `d` is
    /// the rename's both ends) is settled as replaced: what the old one held `deleted`, what the new one holds
    /// `added`.
    #[test]
    fn a_directory_moved_in_under_a_known_name_reports_what_each_held() {
        let (_dir, root) = temporary_root();
        let d = root.join("d");
        std::fs::create_dir(&d).expect("mkdir");
        std::fs::write(d.join("y"), b"x").expect("write");
        let (watches, reported) = reporting();
        let known = BTreeSet::from([root.clone(), d.clone(), d.join("x")]);
        watch_of_the_root_alone(&watches, 17, &root, known);
        let filter = filter_of(&watches, 17);
        let name = |mode| notify::Event::new(EventKind::Modify(notify::event::ModifyKind::Name(mode)));
        let moved_in = name(notify::event::RenameMode::To).add_path(d.clone());
        let both = name(notify::event::RenameMode::Both)
            .add_path(root.join("new"))
            .add_path(d.clone());
        record(&watches.pending, &filter, 17, moved_in);
        record(&watches.pending, &filter, 17, both);
        let (watch, changes) = reported.recv_timeout(Duration::from_secs(10)).expect("a report");
        assert_eq!(watch, 17);
        let kind_of = |name: &str| kind_named(&changes, &d.join(name));
        assert_eq!(kind_of("x"), Some(ChangeKind::Deleted), "{changes:?}");
        assert_eq!(kind_of("y"), Some(ChangeKind::Added), "{changes:?}");
    }

    /// More paths in a period than one report names: the root is reported `updated` (the client lists it again)
    /// rather than what was left out said nothing of.
    #[test]
    fn more_changes_than_a_report_names_have_the_root_reported() {
        let (_dir, root) = temporary_root();
        let (watches, reported) = reporting();
        watches.add(10, root.clone(), true, &[], &[]).expect("watch");
        let filter = filter_of(&watches, 10);
        let mut burst = notify::Event::new(EventKind::Create(notify::event::CreateKind::File));
        for n in 0..=MAX_CHANGES_PER_REPORT {
            burst = burst.add_path(root.join(format!("f{n}")));
        }
        // None of them exists: each came and went, so only the root is left to report.
        record(&watches.pending, &filter, 10, burst);
        assert_eq!(kind_reported(&reported, 10, &root), ChangeKind::Updated);
    }

    /// A report cut short by what a new directory holds (more than one report names) is followed by the root
    /// reported `updated`.
    #[test]
    fn a_report_cut_short_by_a_new_directory_is_followed_by_the_root() {
        let (_dir, top) = temporary_root();
        let (root, outside) = (top.join("root"), top.join("big"));
        std::fs::create_dir(&root).expect("mkdir");
        std::fs::create_dir(&outside).expect("mkdir");
        for n in 0..=MAX_CHANGES_PER_REPORT {
            std::fs::write(outside.join(format!("f{n}")), b"").expect("write");
        }
        let (watches, reported) = reporting();
        watches.add(11, root.clone(), true, &[], &[]).expect("watch");
        std::fs::rename(&outside, root.join("big")).expect("move in");
        assert_eq!(kind_reported(&reported, 11, &root.join("big")), ChangeKind::Added);
        assert_eq!(kind_reported(&reported, 11, &root), ChangeKind::Updated);
    }

    /// More new trees in a period than are watched one by one: the period is taken as lost, so the root is
    /// reported `updated` and the whole tree watched and listed again.
    #[test]
    fn more_new_trees_than_are_watched_one_by_one_have_the_root_reported() {
        let (_dir, root) = temporary_root();
        let (watches, reported) = reporting();
        watch_of_the_root_alone(&watches, 12, &root, BTreeSet::from([root.clone()]));
        let filter = filter_of(&watches, 12);
        let mut made = notify::Event::new(EventKind::Create(notify::event::CreateKind::Folder));
        // Named so that the last in order is the one past the bound, left to the tree's watching as a whole.
        for n in 0..=MAX_NEW_TREES_PER_PERIOD {
            std::fs::create_dir(root.join(format!("d{n:02}"))).expect("mkdir");
            made = made.add_path(root.join(format!("d{n:02}")));
        }
        record(&watches.pending, &filter, 12, made);
        assert_eq!(kind_reported(&reported, 12, &root), ChangeKind::Updated);
        // Watched again as a whole: a file made in the last tree is reported.
        let last = root.join(format!("d{MAX_NEW_TREES_PER_PERIOD:02}"));
        assert_eq!(
            written_and_reported(&reported, 12, &last.join("f")),
            ChangeKind::Added
        );
    }

    /// A new tree gone between its listing and the period's settling reports nothing of what it held, even for a
    /// watch that no longer knows all it holds (which would otherwise say `deleted` of paths never reported).
    #[test]
    fn a_new_tree_gone_before_its_period_is_settled_reports_nothing_it_held() {
        let (_dir, root) = temporary_root();
        let d = root.join("d");
        std::fs::create_dir(&d).expect("mkdir");
        std::fs::write(d.join("f"), b"x").expect("write");
        let (watches, _reported) = reporting();
        watch_of_the_root_alone(&watches, 18, &root, BTreeSet::from([root.clone()]));
        let (watcher, filter) = {
            let table = watches.watches.lock();
            let watch = table.get(&18).expect("the watch");
            (watch.watcher.clone(), watch.filter.clone())
        };
        let mut period = Period::default();
        period.changes.insert(d.clone(), ChangeKind::Added);
        assert!(prepare(&watcher, &filter, &mut period).is_none());
        assert!(
            period.listed.contains_key(&d),
            "listed: {:?}",
            period.listed.keys()
        );
        std::fs::remove_dir_all(&d).expect("remove");
        let mut table = watches.watches.lock();
        let watch = table.get_mut(&18).expect("the watch");
        watch.complete = false;
        // The tree itself is settled as the watch settles any path it does not know (past all it knows,
        // inotify's word, `deleted` when gone); nothing is said of what it held.
        let (changes, _) = watch.settle_all(period);
        assert_eq!(changes, vec![(d.display().to_string(), ChangeKind::Deleted)]);
    }

    /// A directory renamed over a new one (the old one's last event, `DELETE_SELF`, comes after the rename's):
    /// what it holds is reported.
    #[test]
    fn a_directory_renamed_over_a_new_one_is_listed() {
        let (_dir, root) = temporary_root();
        let (_outside, outside) = temporary_root();
        let (watches, reported) = reporting();
        watches.add(19, root.clone(), true, &[], &[]).expect("watch");
        std::fs::create_dir(root.join("d")).expect("mkdir");
        assert_eq!(kind_reported(&reported, 19, &root.join("d")), ChangeKind::Added);
        std::fs::create_dir(outside.join("y")).expect("mkdir");
        std::fs::write(outside.join("y").join("g"), b"x").expect("write");
        std::fs::rename(outside.join("y"), root.join("d")).expect("rename over");
        assert_eq!(
            kind_reported(&reported, 19, &root.join("d").join("g")),
            ChangeKind::Added
        );
    }

    /// What happens while a watch is being added, after the kernel watches, is reported: the reporting thread
    /// finds the watch (before the fix it took the period, could not find the watch yet, and dropped it).
    #[test]
    fn a_change_made_while_the_watch_is_added_is_reported() {
        let (_dir, root) = temporary_root();
        let (watches, reported) = reporting();
        let meanwhile = || {
            std::fs::create_dir(root.join("early")).expect("mkdir");
            assert_eq!(
                kind_reported(&reported, 4, &root.join("early")),
                ChangeKind::Added
            );
        };
        watches
            .add_then(4, root.clone(), true, &[], &[], meanwhile)
            .expect("watch");
    }

    /// After the kernel lost a watch's events, the watch lists again what exists: a file made and one deleted
    /// while events were lost are each reported with their true kind when they next change.
    #[test]
    fn after_lost_events_the_watch_lists_again_what_exists() {
        let (_dir, root) = temporary_root();
        std::fs::write(root.join("kept"), b"x").expect("write");
        let (watches, reported) = reporting();
        watches.add(8, root.clone(), true, &[], &[]).expect("watch");
        let filter = {
            let mut table = watches.watches.lock();
            let watch = table.get_mut(&8).expect("the watch");
            // What the lost events would have said: `kept` was made, `phantom` deleted.
            watch.known.remove(&root.join("kept"));
            watch.known.insert(root.join("phantom"));
            watch.filter.clone()
        };
        record(&watches.pending, &filter, 8, overflow());
        assert_eq!(kind_reported(&reported, 8, &root), ChangeKind::Updated);

        assert_eq!(
            written_and_reported(&reported, 8, &root.join("kept")),
            ChangeKind::Updated
        );
        assert_eq!(
            written_and_reported(&reported, 8, &root.join("phantom")),
            ChangeKind::Added
        );
    }

    /// After lost events, a directory whose creation was lost (so notify never watched it) is watched: what is
    /// made inside it later is reported.
    #[test]
    fn after_lost_events_a_directory_made_meanwhile_is_watched() {
        let (_dir, root) = temporary_root();
        std::fs::create_dir(root.join("sub")).expect("mkdir");
        let (watches, reported) = reporting();
        // `sub` was made while events were lost: neither known nor watched.
        watch_of_the_root_alone(&watches, 9, &root, BTreeSet::from([root.clone()]));
        let filter = filter_of(&watches, 9);
        record(&watches.pending, &filter, 9, overflow());
        assert_eq!(kind_reported(&reported, 9, &root), ChangeKind::Updated);

        std::fs::write(root.join("sub").join("f"), b"x").expect("write inside");
        assert_eq!(
            kind_reported(&reported, 9, &root.join("sub").join("f")),
            ChangeKind::Added
        );
    }

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

    /// A lost event queue (notify's `Rescan`, from the kernel's `IN_Q_OVERFLOW`) is reported as the root
    /// `updated`: the client lists it again instead of missing what the queue lost.
    #[test]
    fn an_overflowed_event_queue_is_reported_as_the_root_updated() {
        let (_dir, root) = temporary_root();
        let (reports, reported) = std::sync::mpsc::channel();
        let watches = Watches::new(move |watch, changes| {
            let _ = reports.send((watch, changes));
        });
        watches.add(7, root.clone(), true, &[], &[]).expect("watch");
        let filter = filter_of(&watches, 7);
        record(&watches.pending, &filter, 7, overflow());
        let (watch, changes) = reported.recv_timeout(Duration::from_secs(10)).expect("a report");
        assert_eq!(watch, 7);
        assert_eq!(changes, vec![(root.display().to_string(), ChangeKind::Updated)]);
    }
}
