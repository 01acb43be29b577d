//! A tenant's file server: `ahp-relay sandbox-files <root> <max-bytes>`, started by the runner inside a sandbox
//! of the tenant (its user, its directory the only writable one, Landlock and seccomp as for its agents). It
//! answers [`super::protocol`] requests, one JSON line each, on stdin and stdout, until stdin closes; its
//! watches ([`super::watch`]) write their changes on stdout between answers.
//!
//! Operations are answered as each ends (by id, not in order). Those that run git go one at a time on a thread
//! of their own, so a slow one (a checkpoint of a large tree) holds up only other git; the rest run on
//! [`WORKERS`] threads, changes one at a time ([`super::ops::Files::run`]: an `ifMatch`, an insert, stay
//! atomic). A queue that is full answers "busy" at once (the reader never blocks, so cancels always get
//! through). A request the runner cancels is answered "cancelled" if it has not started, and the git it runs
//! is killed if it has ([`super::cancel`]). A worker that panics answers its request with an error.

use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::ops::Files;
use super::protocol::{Answer, Changed, ClientLine, FileError, FileOp, FileReply, ServerLine};
use super::watch::Watches;

/// The subcommand that runs a file server.
pub const SUBCOMMAND: &str = "sandbox-files";
/// Operations one file server runs at once.
pub const WORKERS: usize = 4;
/// Operations waiting for a worker before the server reads no more requests.
const QUEUED: usize = 64;

/// An operation for a worker: its id, what to do, and whether it was cancelled.
type Job = (u64, FileOp, Arc<AtomicBool>);

/// Longest request line read (a write's base64 data with room to spare), so a broken peer cannot grow memory.
pub(crate) fn max_line(max_bytes: u64) -> usize {
    usize::try_from(max_bytes.saturating_mul(4) / 3 + 64 * 1024).unwrap_or(usize::MAX)
}

/// Writes one line; `false` once stdout is gone.
fn write_line(output: &Mutex<std::io::Stdout>, line: &ServerLine) -> bool {
    let Ok(mut bytes) = serde_json::to_vec(line) else {
        return true;
    };
    bytes.push(b'\n');
    let mut output = output.lock();
    output.write_all(&bytes).and_then(|()| output.flush()).is_ok()
}

/// Serve `args` = [root, max-bytes] on stdin/stdout; the process's exit status.
pub fn main(args: Vec<std::ffi::OsString>) -> i32 {
    let (Some(root), Some(max_bytes)) = (
        args.first(),
        args.get(1).and_then(|a| a.to_str()?.parse::<u64>().ok()),
    ) else {
        eprintln!("usage: ahp-relay {SUBCOMMAND} ROOT MAX-BYTES");
        return 2;
    };
    let files = match Files::new(Path::new(root), max_bytes) {
        // Its sandbox's private home keeps its own state (checkpoints), out of every agent's and client's reach.
        Ok(files) => match std::env::var_os("HOME") {
            Some(home) => files.with_state_dir(std::path::PathBuf::from(home)),
            None => files,
        },
        Err(error) => {
            eprintln!("{error}");
            return 1;
        }
    };
    let output = Arc::new(Mutex::new(std::io::stdout()));
    let reporter = output.clone();
    let watches = Watches::new(move |watch, changes| {
        write_line(&reporter, &ServerLine::Changed(Changed { watch, changes }));
    });
    let files = Arc::new(files);
    // The operations queued or running, by id: what a cancel sets.
    let running: Arc<Mutex<HashMap<u64, Arc<AtomicBool>>>> = Arc::default();
    let (jobs, queue) = std::sync::mpsc::sync_channel::<Job>(QUEUED);
    let (git_jobs, git_queue) = std::sync::mpsc::sync_channel::<Job>(QUEUED);
    let queue = Arc::new(Mutex::new(queue));
    let git_queue = Arc::new(Mutex::new(git_queue));
    for queue in std::iter::repeat_n(&queue, WORKERS).chain([&git_queue]) {
        let (files, running, queue, output) = (files.clone(), running.clone(), queue.clone(), output.clone());
        std::thread::spawn(move || loop {
            let next = queue.lock().recv();
            let Ok((id, op, cancelled)) = next else {
                return;
            };
            let result = if cancelled.load(Ordering::Acquire) {
                Err(FileError::Unavailable("cancelled".into()))
            } else {
                let run =
                    std::panic::AssertUnwindSafe(|| super::cancel::run_as(&cancelled, || files.run(op)));
                std::panic::catch_unwind(run).unwrap_or_else(|_| {
                    Err(FileError::Unavailable(
                        "the file operation failed unexpectedly".into(),
                    ))
                })
            };
            running.lock().remove(&id);
            if !write_line(&output, &ServerLine::Answer(Answer { id, result })) {
                return;
            }
        });
    }
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let limit = max_line(max_bytes);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut input).take(limit as u64 + 1).read_until(b'\n', &mut line);
        match read {
            Ok(0) => return 0,
            Ok(_) if line.len() > limit => {
                eprintln!("a request line is longer than {limit} bytes");
                return 1;
            }
            Ok(_) => {}
            Err(error) => {
                eprintln!("{error}");
                return 1;
            }
        }
        let request = match serde_json::from_slice::<ClientLine>(&line) {
            Ok(ClientLine::Request(request)) => request,
            Ok(ClientLine::Cancel { cancel }) => {
                if let Some(flag) = running.lock().get(&cancel) {
                    flag.store(true, Ordering::Release);
                }
                continue;
            }
            Err(error) => {
                eprintln!("unreadable request: {error}");
                return 1;
            }
        };
        let result = match request.op {
            FileOp::Watch {
                watch,
                path,
                recursive,
                includes,
                excludes,
            } => start_watch(&files, &watches, watch, &path, recursive, &includes, &excludes),
            FileOp::Unwatch { watch } => {
                watches.remove(watch);
                Ok(FileReply::Done)
            }
            op => {
                let cancelled = Arc::new(AtomicBool::new(false));
                running.lock().insert(request.id, cancelled.clone());
                let lane = if op.runs_git() { &git_jobs } else { &jobs };
                match lane.try_send((request.id, op, cancelled)) {
                    Ok(()) => continue,
                    Err(std::sync::mpsc::TrySendError::Full(_)) => {
                        running.lock().remove(&request.id);
                        Err(FileError::Unavailable(
                            "the tenant's file server is busy with other operations; retry".into(),
                        ))
                    }
                    Err(std::sync::mpsc::TrySendError::Disconnected(_)) => return 1,
                }
            }
        };
        if !write_line(
            &output,
            &ServerLine::Answer(Answer {
                id: request.id,
                result,
            }),
        ) {
            return 0;
        }
    }
}

/// Watch an existing path inside the root.
fn start_watch(
    files: &Files,
    watches: &Watches,
    watch: u64,
    requested: &str,
    recursive: bool,
    includes: &[String],
    excludes: &[String],
) -> Result<FileReply, FileError> {
    let path = files.confine(requested, true)?;
    if !path.exists() {
        return Err(FileError::NotFound(format!("{} does not exist", path.display())));
    }
    watches.add(watch, path, recursive, includes, excludes)?;
    Ok(FileReply::Done)
}
