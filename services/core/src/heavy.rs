//! Work too big to run between other tasks' polls: parsing, validating and reducing a large client message
//! takes milliseconds, and a tokio worker busy with it cannot run any other connection's task meanwhile. On a
//! multi-threaded runtime such work runs with [`tokio::task::block_in_place`], which hands the worker's other
//! tasks to the other workers first, so one tenant's megabyte-sized frames do not delay another tenant's small
//! ones. Small work (the common case) runs inline.

/// Messages at least this large are handled as heavy work.
pub const HEAVY_MESSAGE_BYTES: usize = 64 * 1024;

/// Run `work` for a message of `bytes` bytes: inline when small or on a current-thread runtime, else with
/// the worker's other tasks moved away first.
pub fn for_message<R>(bytes: usize, work: impl FnOnce() -> R) -> R {
    let multi_threaded = tokio::runtime::Handle::try_current()
        .is_ok_and(|runtime| runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if bytes >= HEAVY_MESSAGE_BYTES && multi_threaded {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}
