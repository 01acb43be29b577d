//! How the relay's processes use glibc's allocator. By default glibc serves a large allocation (a 2 MiB agent
//! reply, a chat snapshot, a page of turns) with its own mapping only until the first such mapping is freed:
//! then it raises its threshold (up to 32 MiB) and later large allocations come from its per-thread heaps,
//! where they fragment and stay resident long after they were freed. A chat of 2 MiB replies held the relay at
//! about 250 MiB above its idle size that way; with the threshold fixed at [`MMAP_THRESHOLD`] the same chat
//! holds about half of that (`tests/soak.rs`, docs/benchmarks.md). An operator's own setting (the
//! `MALLOC_MMAP_THRESHOLD_` variable, or `GLIBC_TUNABLES`) is left alone.

/// Allocations of at least this many bytes get a mapping of their own, returned to the system when freed.
pub const MMAP_THRESHOLD: usize = 256 * 1024;

/// Fix the allocator's mmap threshold (glibc on Linux; elsewhere nothing to do).
pub fn configure() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let chosen = std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
            || std::env::var("GLIBC_TUNABLES").is_ok_and(|tunables| tunables.contains("mmap_threshold"));
        if !chosen {
            // SAFETY: mallopt changes a setting of glibc's allocator; it takes no pointers and is called before
            // any thread of this process exists.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
            }
        }
    }
}
