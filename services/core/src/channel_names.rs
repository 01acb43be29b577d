//! Channel names shared within a process: one `Arc<str>` per distinct channel URI in use, so that a bus
//! event's channel and a connection's subscription to it are one allocation. The gateway's delivery filter
//! then recognises a subscribed channel by comparing two pointers, without reading the name: a lane reads
//! each of thousands of connections' filters at every batch, and each name read there was a cache miss
//! (`memcmp`, 1.5–2% of `serve`'s samples at 2,000 subscribers × 50 actions/s). Whoever compares names must
//! still fall back to comparing the text, since not every name is taken from here.
//!
//! Names nothing else holds any more are dropped when the table has doubled since it was last pruned, so it
//! holds at most about twice the names in use (and at least [`PRUNED_FROM`] before its first pruning).

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};

/// The table is not pruned below this many names.
const PRUNED_FROM: usize = 1024;

struct Names {
    names: HashSet<Arc<str>, foldhash::fast::RandomState>,
    /// Prune when the table reaches this size.
    prune_at: usize,
}

static NAMES: LazyLock<Mutex<Names>> = LazyLock::new(|| {
    Mutex::new(Names {
        names: HashSet::default(),
        prune_at: PRUNED_FROM,
    })
});

/// The process's shared `Arc` for the channel `name`.
pub fn shared(name: &str) -> Arc<str> {
    let mut table = match NAMES.lock() {
        Ok(table) => table,
        Err(poisoned) => poisoned.into_inner(),
    };
    if let Some(found) = table.names.get(name) {
        return found.clone();
    }
    if table.names.len() >= table.prune_at {
        table.names.retain(|name| Arc::strong_count(name) > 1);
        table.prune_at = (table.names.len() * 2).max(PRUNED_FROM);
    }
    let name: Arc<str> = Arc::from(name);
    table.names.insert(name.clone());
    name
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
    fn names_no_longer_used_are_pruned_and_used_ones_kept() {
        let kept = shared("ahp-chat:/names-test-kept");
        // Enough unused names to pass the pruning size more than once.
        for i in 0..PRUNED_FROM * 4 {
            drop(shared(&format!("ahp-chat:/names-test-unused-{i}")));
        }
        let size = match NAMES.lock() {
            Ok(table) => table.names.len(),
            Err(poisoned) => poisoned.into_inner().names.len(),
        };
        assert!(size <= PRUNED_FROM * 2, "{size} names kept");
        assert!(Arc::ptr_eq(&kept, &shared("ahp-chat:/names-test-kept")));
    }
}
