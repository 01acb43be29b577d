//! The commit thread: once installed, hosts' commit loops run on it rather than on the caller's runtime. Its
//! own test binary, because installing is for the whole process.

use relay_shard::commit_thread;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_work_runs_on_the_commit_thread_once_installed() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    commit_thread::spawn(async move {
        let _ = tx.send(std::thread::current().name().map(str::to_owned));
    });
    let before = rx.await.expect("ran");
    assert_ne!(
        before.as_deref(),
        Some("ahp-commit"),
        "not installed yet: the caller's runtime"
    );

    commit_thread::install().expect("install");
    commit_thread::install().expect("installing twice is harmless");
    let (tx, rx) = tokio::sync::oneshot::channel();
    commit_thread::spawn(async move {
        // The commit runtime has a clock and sockets of its own: store round trips and retry back-offs work.
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        let _ = tx.send(std::thread::current().name().map(str::to_owned));
    });
    assert_eq!(rx.await.expect("ran").as_deref(), Some("ahp-commit"));
}
