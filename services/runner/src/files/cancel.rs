//! Cancelling the operation a file server's worker runs: the runner stops waiting for it (its caller went, or
//! its deadline passed) and says so; what the operation runs (git) looks at [`cancelled`] and stops.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

thread_local! {
    /// The flag of the operation this thread runs.
    static CURRENT: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// Run `work` as the operation whose cancellation `flag` says.
pub fn run_as<T>(flag: &Arc<AtomicBool>, work: impl FnOnce() -> T) -> T {
    CURRENT.with(|current| *current.borrow_mut() = Some(flag.clone()));
    let done = work();
    CURRENT.with(|current| *current.borrow_mut() = None);
    done
}

/// Whether the operation this thread runs was cancelled.
pub fn cancelled() -> bool {
    CURRENT.with(|current| {
        current
            .borrow()
            .as_ref()
            .is_some_and(|flag| flag.load(Ordering::Acquire))
    })
}
