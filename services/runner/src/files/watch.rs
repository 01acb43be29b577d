//! Watches inside a tenant's file server ([`super::server`]): inotify (the `notify` crate) on a watched path,
//! what changed filtered by the watch's `includes`/`excludes` globs (relative to the watched path, `globset`),
//! coalesced for [`DEBOUNCE`] and written out as one `changed` line per watch. Each watch has its own watcher,
//! dropped with it; how many a tenant may have is bounded by the runner ([`super::service`]).

use std::collections::{BTreeMap, HashMap};
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

/// What one watch reports.
struct Watch {
    root: PathBuf,
    recursive: bool,
    includes: Option<GlobSet>,
    excludes: Option<GlobSet>,
    /// Stops watching when dropped.
    _watcher: notify::RecommendedWatcher,
}

impl Watch {
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

type Pending = BTreeMap<u64, BTreeMap<PathBuf, ChangeKind>>;

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
        let taken = pending.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(DEBOUNCE);
            let batch = std::mem::take(&mut *taken.lock());
            for (watch, changes) in batch {
                report(
                    watch,
                    changes
                        .into_iter()
                        .map(|(path, kind)| (path.display().to_string(), kind))
                        .collect(),
                );
            }
        });
        Watches {
            watches: Arc::default(),
            pending,
        }
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
        let includes = globs(includes)?;
        let excludes = globs(excludes)?;
        let watches = Arc::downgrade(&self.watches);
        let pending = Arc::downgrade(&self.pending);
        let handler = move |event: notify::Result<notify::Event>| {
            let (Ok(event), Some(watches), Some(pending)) = (event, watches.upgrade(), pending.upgrade())
            else {
                return;
            };
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
            let watches = watches.lock();
            let Some(watch) = watches.get(&id) else { return };
            let mut pending = pending.lock();
            for path in event.paths {
                if watch.reports(&path) {
                    let changes = pending.entry(id).or_default();
                    if changes.len() >= MAX_CHANGES_PER_REPORT && !changes.contains_key(&path) {
                        continue;
                    }
                    // Added then changed is still added; deleted wins over both.
                    let merged = match (changes.get(&path), kind) {
                        (Some(ChangeKind::Added), ChangeKind::Updated) => ChangeKind::Added,
                        (_, kind) => kind,
                    };
                    changes.insert(path, merged);
                }
            }
        };
        // Symlinks are not followed: a link to `/` in the workspace must not make the watch walk the system.
        let config = notify::Config::default().with_follow_symlinks(false);
        let mut watcher = notify::RecommendedWatcher::new(handler, config)
            .map_err(|error| FileError::Unavailable(format!("cannot watch: {error}")))?;
        let mode = if recursive {
            RecursiveMode::Recursive
        } else {
            RecursiveMode::NonRecursive
        };
        watcher
            .watch(&root, mode)
            .map_err(|error| FileError::Unavailable(format!("cannot watch {}: {error}", root.display())))?;
        self.watches.lock().insert(
            id,
            Watch {
                root,
                recursive,
                includes,
                excludes,
                _watcher: watcher,
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
