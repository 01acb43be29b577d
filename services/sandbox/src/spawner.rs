//! Where sandboxes are started: one long-lived thread of the process.
//!
//! bubblewrap's `--die-with-parent` (how a sandbox dies with the relay, even on SIGKILL) is the kernel's
//! parent-death signal, and the kernel sends it when the *thread* that forked the sandbox exits, not only the
//! process. Tokio's worker and blocking threads come and go (a blocking thread idles out after seconds; a worker
//! that ran `block_in_place` may become one), so a sandbox forked from one of them could be killed at a random
//! moment. Every sandbox is therefore forked by this thread, which lives as long as the process.

use std::sync::mpsc;
use std::sync::OnceLock;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send>;

/// The spawning thread's queue (started on first use).
fn queue() -> Option<&'static mpsc::Sender<Job>> {
    static QUEUE: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (jobs, received) = mpsc::channel::<Job>();
            let started = std::thread::Builder::new()
                .name("sandbox-spawner".into())
                .spawn(move || {
                    while let Ok(job) = received.recv() {
                        job();
                    }
                });
            match started {
                Ok(_) => Some(jobs),
                Err(error) => {
                    tracing::error!(%error, "cannot start the sandbox spawner thread");
                    None
                }
            }
        })
        .as_ref()
}

/// Start `command` from the spawner thread, inside the current Tokio runtime (which reaps it).
pub async fn spawn(mut command: Command) -> std::io::Result<Child> {
    let runtime = tokio::runtime::Handle::current();
    let (reply, answer) = oneshot::channel();
    let job: Job = Box::new(move || {
        let _entered = runtime.enter();
        let _ = reply.send(command.spawn());
    });
    let queue = queue().ok_or_else(|| std::io::Error::other("the sandbox spawner thread is not running"))?;
    queue
        .send(job)
        .map_err(|_| std::io::Error::other("the sandbox spawner thread stopped"))?;
    answer
        .await
        .map_err(|_| std::io::Error::other("the sandbox spawner thread dropped a spawn"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that dies (SIGKILL) when the thread that forked it exits, as bubblewrap's `--die-with-parent`.
    fn dies_with_its_parent_thread() -> Command {
        let mut command = Command::new("sleep");
        command.arg("30").kill_on_drop(true);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        command
    }

    /// Run `start` on a thread of its own that then exits, and wait until the kernel is done with that thread.
    fn on_a_short_lived_thread(start: impl FnOnce() -> Child + Send + 'static) -> Child {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let child = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            let _ = tid_tx.send(unsafe { libc::gettid() });
            start()
        })
        .join()
        .expect("thread");
        let tid = tid_rx.recv().expect("tid");
        // The thread is gone (and its children signalled) once its task entry is.
        while std::path::Path::new(&format!("/proc/self/task/{tid}")).exists() {
            std::thread::yield_now();
        }
        child
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sandbox_outlives_the_thread_that_asked_for_it() {
        let runtime = tokio::runtime::Handle::current();
        // Forked by a thread that then exits: killed (what this module prevents).
        let entered = runtime.clone();
        let mut direct = on_a_short_lived_thread(move || {
            let _entered = entered.enter();
            dies_with_its_parent_thread().spawn().expect("spawn")
        });
        let status = direct.wait().await.expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "the control child was not killed: {status:?}"
        );
        // Asked for by such a thread, forked by the spawner: alive.
        let mut spawned = on_a_short_lived_thread(move || {
            runtime
                .block_on(spawn(dies_with_its_parent_thread()))
                .expect("spawn")
        });
        assert!(
            spawned.try_wait().expect("try_wait").is_none(),
            "the sandbox died with the asking thread"
        );
        spawned.kill().await.expect("kill");
    }
}
