//! The commit threads: once installed, hosts' commit loops run on them rather than on the caller's runtime,
//! each host pinned to one thread. Its own test binary, because installing is for the whole process.

use relay_core::HostKey;
use relay_shard::commit_thread;

async fn thread_of(key: &HostKey) -> Option<String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    commit_thread::spawn(key, async move {
        // A commit runtime has a clock and sockets of its own: store round trips and retry back-offs work.
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        let _ = tx.send(std::thread::current().name().map(str::to_owned));
    });
    rx.await.expect("ran")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_work_runs_on_the_commit_thread_its_host_is_pinned_to_once_installed() {
    let key = |n: usize| HostKey::new(format!("tenant-{n}"), "default");
    let before = thread_of(&key(0)).await;
    assert!(
        !before.as_deref().unwrap_or_default().starts_with("ahp-commit"),
        "not installed yet: the caller's runtime ({before:?})"
    );

    commit_thread::install_threads(3).expect("install");
    commit_thread::install_threads(5).expect("installing twice is harmless (the first pool stays)");
    let mut used = std::collections::BTreeSet::new();
    for n in 0..32 {
        let first = thread_of(&key(n)).await.expect("a named thread");
        assert!(first.starts_with("ahp-commit-"), "{first}");
        // Pinned: the same host runs on the same thread every time.
        assert_eq!(thread_of(&key(n)).await.as_deref(), Some(first.as_str()));
        used.insert(first);
    }
    assert_eq!(
        used.len(),
        3,
        "32 hosts spread over the pool's 3 threads: {used:?}"
    );
    // What is started beside the commits runs there too, and its output comes back.
    let name = commit_thread::run_on_pool(async { std::thread::current().name().map(str::to_owned) })
        .await
        .flatten();
    assert_eq!(name.as_deref(), Some("ahp-commit-0"));
}
