//! Hands freed heap memory back to the operating system.
//!
//! Listing tens of thousands of Secrets and ConfigMaps, and the first pass over every workload,
//! allocate and free megabytes of short-lived objects (decoded pages, plan inputs) interleaved
//! with the store's small long-lived entries. glibc's malloc keeps those freed pages resident:
//! it returns memory on its own only from the top of the main heap, never from the middle of
//! its per-thread arenas, where tokio's worker threads allocate. The resident size then stays
//! near the peak although most of it is free (measured: ~80 MiB resident, ~40 MiB in use).
//! `malloc_trim(0)` releases every free page of every arena. Other allocators (musl's) have no
//! such call; there this is a no-op.
//!
//! The allocator is the system's, deliberately. The shipped image runs the static musl build,
//! whose allocator (mallocng) hands freed pages back by itself and gives the smallest footprint;
//! mimalloc keeps what it freed committed and stays an opt-in feature. The measurements behind
//! the choice are in docs/performance.md ("The shipped binary and its allocator"); there, not
//! here, they are dated and kept with the bench that makes them. `malloc_trim` stays for glibc
//! builds (see the first paragraph).

use std::time::Duration;

/// How often free heap pages are handed back: cheap (a walk over malloc's free lists), and
/// soon enough after a burst of work.
pub const TRIM_PERIOD: Duration = Duration::from_secs(10);

/// Returns free heap pages to the operating system (glibc only).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes glibc's arena locks itself and touches only free chunks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Calls [`release_free_memory`] every [`TRIM_PERIOD`], for bursts no one marks the end of
/// (the first pass over every workload, a wave of source changes).
pub async fn trim_periodically() {
    let mut ticker = tokio::time::interval(TRIM_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        release_free_memory();
    }
}
