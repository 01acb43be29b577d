//! Channel names shared within a process: one `Arc<str>` per distinct channel URI in use, so that a bus
//! event's channel and a connection's subscription to it are one allocation. The gateway's delivery filter
//! then recognises a subscribed channel by comparing two pointers, without reading the name: a lane reads
//! each of thousands of connections' filters at every batch, and each name read there was a cache miss
//! (`memcmp`, 1.5–2% of `serve`'s samples at 2,000 subscribers × 50 actions/s). Whoever compares names must
//! still fall back to comparing the text, since not every name is taken from here.
//!
//! Names nothing else holds any more are dropped when a new name finds the table at twice the size it was
//! left at by its last pruning (and at least [`PRUNED_FROM`]): it holds at most that many names, twice those
//! in use then. The names are dropped after the table's lock is released, and a table left much larger than
//! it needs is shrunk.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};

/// The table is not pruned below this many names.
const PRUNED_FROM: usize = 1024;

struct Names {
    names: HashSet<Arc<str>, foldhash::fast::RandomState>,
    /// Prune when the table reaches this size.
    prune_at: usize,
    /// Prunings so far.
    prunes: u64,
}

static NAMES: LazyLock<Mutex<Names>> = LazyLock::new(|| {
    Mutex::new(Names {
        names: HashSet::default(),
        prune_at: PRUNED_FROM,
        prunes: 0,
    })
});

/// The process's shared `Arc` for the channel `name`.
pub fn shared(name: &str) -> Arc<str> {
    let mut table = lock();
    if let Some(found) = table.names.get(name) {
        return found.clone();
    }
    // Only the table holds a name whose count is 1, and only under its lock can the name be cloned from it.
    let unused: Vec<Arc<str>> = if table.names.len() >= table.prune_at {
        let unused = table
            .names
            .extract_if(|name| Arc::strong_count(name) == 1)
            .collect();
        table.prune_at = (table.names.len() * 2).max(PRUNED_FROM);
        table.prunes += 1;
        if table.names.capacity() > table.prune_at * 4 {
            let keep = table.prune_at;
            table.names.shrink_to(keep);
        }
        unused
    } else {
        Vec::new()
    };
    let name: Arc<str> = Arc::from(name);
    table.names.insert(name.clone());
    drop(table);
    // Freed outside the lock.
    drop(unused);
    name
}

fn lock() -> std::sync::MutexGuard<'static, Names> {
    match NAMES.lock() {
        Ok(table) => table,
        Err(poisoned) => poisoned.into_inner(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_name_is_one_allocation_while_it_is_used() {
        let first = shared("ahp-chat:/names-test-a");
        let again = shared("ahp-chat:/names-test-a");
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(&*again, "ahp-chat:/names-test-a");
        let other = shared("ahp-chat:/names-test-b");
        assert!(!Arc::ptr_eq(&first, &other));
    }

    #[test]
    fn the_table_stays_within_twice_the_names_in_use_and_keeps_them() {
        // Names in use beyond the pruning floor, so the bound is the one that follows what is used.
        let live: Vec<Arc<str>> = (0..PRUNED_FROM * 3 / 2)
            .map(|i| shared(&format!("ahp-chat:/names-test-live-{i}")))
            .collect();
        // The other test of this module holds a few names of its own meanwhile.
        let slack = 8;
        let prunes_before = lock().prunes;
        let churn = PRUNED_FROM * 8;
        for i in 0..churn {
            drop(shared(&format!("ahp-chat:/names-test-unused-{i}")));
            let size = lock().names.len();
            assert!(
                size <= 2 * (live.len() + slack) + 1,
                "{size} names kept for {} in use",
                live.len()
            );
        }
        // Each pruning frees room for as many new names as are in use: a few prunings, not one per name.
        let prunes = lock().prunes - prunes_before;
        assert!(
            prunes as usize <= churn / live.len() + 1,
            "{prunes} prunings for {churn} new names"
        );
        for (i, name) in live.iter().enumerate() {
            let again = shared(&format!("ahp-chat:/names-test-live-{i}"));
            assert!(Arc::ptr_eq(name, &again), "a name in use was dropped");
        }
    }
}
