//! The runner's side of tenants' files: one file server per tenant ([`super::server`]), started on first use
//! inside a sandbox of the tenant — its user, its part of the workspace the only writable directory, no
//! network — and asked over its stdin/stdout. A server that dies is started again on the next request; the
//! requests it had are answered "unavailable". Servers live as long as this service (killed with it).
//!
//! Each operation has a deadline ([`OPERATION_TIMEOUT`], from its call to its answer, its sending included): past
//! it, or when its caller goes, the server is told to cancel it. Requests reach the server through one writer
//! task per server, whole lines only, so a caller that gives up never leaves half a line behind. A server is
//! idle (and may be stopped) only when no operation it was given is still running there, answered or not.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use relay_sandbox::{Egress, ResourceLimits, SandboxSpec};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use super::access::{ChangeSink, FileAccess, FileFuture, WatchHandle, WatchSpec, OPERATION_TIMEOUT};
use super::protocol::{ClientLine, FileError, FileOp, FileReply, Request, ServerLine};
use super::server::SUBCOMMAND;
use crate::acp::sandboxes::Sandboxes;

/// The host name under which file servers get their private directories (no AHP host can have it).
const FILES_HOST: &str = ".files";

/// Most watches one tenant may have open (each is an inotify instance in its file server).
const MAX_WATCHES_PER_TENANT: usize = 64;

/// A file server's key: its tenant, and the host whose directory alone it serves (none: the whole tenant's).
type ServerKey = (String, Option<String>);

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<FileReply, FileError>>>>>;

/// Where each watch's changes go.
type Listeners = Arc<Mutex<HashMap<u64, ChangeSink>>>;

/// Request lines waiting for a server's writer.
const LINES_QUEUED: usize = 64;

/// A running file server.
struct Server {
    /// Whole request lines, written in order by the server's writer task.
    lines: mpsc::Sender<Vec<u8>>,
    pending: Pending,
    /// The operations sent and not answered yet, waited for or not (a cancelled one still runs until its
    /// answer comes).
    running: Arc<Mutex<std::collections::HashSet<u64>>>,
    listeners: Listeners,
    /// When it was last asked something.
    last_used: Mutex<std::time::Instant>,
    /// Cleared when its output ended or broke the protocol: the next request starts another.
    alive: Arc<std::sync::atomic::AtomicBool>,
    /// Kills the sandbox when the server is dropped.
    _child: tokio::process::Child,
}

impl Server {
    /// Nothing under way, no watch open, and not asked anything for `idle`.
    fn idle_for(&self, idle: Duration) -> bool {
        self.pending.lock().is_empty()
            && self.running.lock().is_empty()
            && self.listeners.lock().is_empty()
            && self.last_used.lock().elapsed() >= idle
    }
}

/// Tenants' files, served from their sandboxes.
pub struct FileService {
    sandboxes: Arc<Sandboxes>,
    /// The program that serves files (this binary).
    program: PathBuf,
    max_bytes: u64,
    next_id: AtomicU64,
    servers: tokio::sync::Mutex<HashMap<ServerKey, Arc<Server>>>,
    /// Open watches per tenant.
    watches: Mutex<HashMap<String, usize>>,
    me: std::sync::Weak<FileService>,
}

impl FileService {
    /// Files of the tenants of `sandboxes`' workspace, served by `program` (`ahp-relay`), reads and writes at
    /// most `max_bytes` each.
    /// A tenant's server that is `idle` (nothing under way, no watch) stops; the next request starts another.
    /// Needs a Tokio runtime (the stopping runs on it).
    pub fn new(
        sandboxes: Arc<Sandboxes>,
        program: PathBuf,
        max_bytes: u64,
        idle: Duration,
    ) -> Arc<FileService> {
        let service = Arc::new_cyclic(|me| FileService {
            sandboxes,
            program,
            max_bytes,
            next_id: AtomicU64::new(1),
            servers: tokio::sync::Mutex::new(HashMap::new()),
            watches: Mutex::new(HashMap::new()),
            me: me.clone(),
        });
        tokio::spawn(stop_idle_servers(Arc::downgrade(&service), idle));
        service
    }

    /// The largest file read or written.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// `tenant`'s part of the workspace (the root its file URIs must lie in).
    pub fn tenant_root(&self, tenant: &str) -> PathBuf {
        self.sandboxes.workspaces().tenant_dir(tenant)
    }

    /// Run `op` on `tenant`'s files (on the directory of host `scope` alone, when given), within
    /// [`OPERATION_TIMEOUT`]; cancelled on the server past it, or when this future is dropped.
    pub async fn call(&self, tenant: &str, scope: Option<&str>, op: FileOp) -> Result<FileReply, FileError> {
        let deadline = tokio::time::Instant::now() + OPERATION_TIMEOUT;
        let late = || {
            FileError::Unavailable(format!(
                "the file operation took longer than {} s",
                OPERATION_TIMEOUT.as_secs()
            ))
        };
        let key: ServerKey = (tenant.to_string(), scope.map(str::to_string));
        let server = tokio::time::timeout_at(deadline, self.server(&key))
            .await
            .map_err(|_| late())??;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let cancellable = op.cancellable();
        let mut line = serde_json::to_vec(&Request { id, op })
            .map_err(|error| FileError::Unavailable(format!("cannot encode the request: {error}")))?;
        if line.len() > super::server::max_line(self.max_bytes) {
            return Err(FileError::Invalid(format!(
                "the request is larger than this relay's limit of {} bytes of file content",
                self.max_bytes
            )));
        }
        line.push(b'\n');
        let (answer_tx, answer_rx) = oneshot::channel();
        server.pending.lock().insert(id, answer_tx);
        server.running.lock().insert(id);
        let mut outstanding = Outstanding {
            server: server.clone(),
            id,
            sent: false,
            answered: false,
            cancellable,
        };
        match tokio::time::timeout_at(deadline, server.lines.send(line)).await {
            Ok(Ok(())) => outstanding.sent = true,
            Ok(Err(_)) => {
                self.forget(&key, &server).await;
                return Err(FileError::Unavailable(
                    "the tenant's file server stopped; retry".into(),
                ));
            }
            Err(_) => return Err(late()),
        }
        let answer = tokio::time::timeout_at(deadline, answer_rx).await;
        outstanding.answered = answer.is_ok();
        match answer {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(FileError::Unavailable(
                "the tenant's file server stopped; retry".into(),
            )),
            Err(_) => Err(late()),
        }
    }

    /// Watch `path` of `tenant`'s files; its changes go to `changes` (coalesced, at most every 100 ms) until the
    /// returned handle is dropped. At most [`MAX_WATCHES_PER_TENANT`] per tenant.
    pub async fn watch(
        &self,
        tenant: &str,
        scope: Option<&str>,
        spec: WatchSpec,
        changes: ChangeSink,
    ) -> Result<WatchHandle, FileError> {
        let key: ServerKey = (tenant.to_string(), scope.map(str::to_string));
        {
            let mut watches = self.watches.lock();
            let count = watches.entry(tenant.to_string()).or_default();
            if *count >= MAX_WATCHES_PER_TENANT {
                return Err(FileError::Invalid(format!(
                    "a tenant may have at most {MAX_WATCHES_PER_TENANT} resource watches open"
                )));
            }
            *count += 1;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let handle = self.handle(&key, id);
        let server = self.server(&key).await?;
        server.listeners.lock().insert(id, changes);
        let op = FileOp::Watch {
            watch: id,
            path: spec.path,
            recursive: spec.recursive,
            includes: spec.includes,
            excludes: spec.excludes,
        };
        // Refused: dropping the handle uncounts it (and tells the server, which has nothing to stop).
        self.call(tenant, scope, op).await?;
        Ok(handle)
    }

    /// The handle of watch `id` of `tenant`: dropped, the file server stops it and it is no longer counted.
    fn handle(&self, key: &ServerKey, id: u64) -> WatchHandle {
        let service = self.me.clone();
        let key = key.clone();
        let tenant = key.0.clone();
        WatchHandle::new(move || {
            let Some(service) = service.upgrade() else {
                return;
            };
            if let Some(count) = service.watches.lock().get_mut(&tenant) {
                *count = count.saturating_sub(1);
            }
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    if let Some(server) = service.servers.lock().await.get(&key).cloned() {
                        server.listeners.lock().remove(&id);
                    }
                    let _ = service
                        .call(&key.0, key.1.as_deref(), FileOp::Unwatch { watch: id })
                        .await;
                });
            }
        })
    }

    /// Drop `server` if it is still `key`'s (the next request starts another).
    async fn forget(&self, key: &ServerKey, server: &Arc<Server>) {
        let mut servers = self.servers.lock().await;
        if servers
            .get(key)
            .is_some_and(|current| Arc::ptr_eq(current, server))
        {
            servers.remove(key);
        }
    }

    /// The server of `key`, started if there is none.
    async fn server(&self, key: &ServerKey) -> Result<Arc<Server>, FileError> {
        let mut servers = self.servers.lock().await;
        if let Some(server) = servers
            .get(key)
            .filter(|server| server.alive.load(Ordering::Relaxed))
        {
            *server.last_used.lock() = std::time::Instant::now();
            return Ok(server.clone());
        }
        let server = Arc::new(self.start(&key.0, key.1.as_deref()).await?);
        servers.insert(key.clone(), server.clone());
        Ok(server)
    }

    async fn start(&self, tenant: &str, scope: Option<&str>) -> Result<Server, FileError> {
        let unavailable =
            |what: String| FileError::Unavailable(format!("cannot start the tenant's file server: {what}"));
        let workspaces = self.sandboxes.workspaces();
        let dirs = match scope {
            None => workspaces.tenant_wide(tenant, FILES_HOST, FILES_HOST),
            Some(host) => workspaces.host_wide(tenant, host, FILES_HOST),
        }
        .map_err(|error| unavailable(error.to_string()))?;
        let install = self.program.parent().map(PathBuf::from).into_iter().collect();
        let spec = SandboxSpec {
            tenant: dirs.tenant_key.clone(),
            anchor: self.sandboxes.anchor().to_path_buf(),
            cgroup: None,
            workspace: dirs.workspace.clone(),
            home: dirs.home.clone(),
            tmp: dirs.tmp.clone(),
            shm: dirs.shm.clone(),
            cwd: dirs.workspace.clone(),
            install,
            egress: Egress::None,
            loopback_ports: Vec::new(),
            limits: ResourceLimits::default(),
            user: dirs.user,
        };
        let args = vec![
            SUBCOMMAND.to_string(),
            dirs.workspace.display().to_string(),
            self.max_bytes.to_string(),
        ];
        let program = self.program.display().to_string();
        let mut child = self
            .sandboxes
            .start_service(&spec, &program, &args)
            .await
            .map_err(|error| unavailable(error.to_string()))?;
        let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(unavailable("its pipes are missing".into()));
        };
        let pending: Pending = Arc::default();
        let listeners: Listeners = Arc::default();
        let running: Arc<Mutex<std::collections::HashSet<u64>>> = Arc::default();
        let answered = running.clone();
        let answers = pending.clone();
        let watchers = listeners.clone();
        let tenant_name = tenant.to_string();
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let living = alive.clone();
        // An answer is at most a file's base64 or a capped listing; a longer line breaks the protocol.
        let limit = (super::server::max_line(self.max_bytes) as u64).max(8 * 1024 * 1024);
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut reader = BufReader::new(output);
            let mut line = Vec::new();
            loop {
                line.clear();
                match (&mut reader).take(limit).read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) if !line.ends_with(b"\n") && line.len() as u64 >= limit => {
                        tracing::warn!(tenant = %tenant_name, limit, "a file server wrote a line longer than allowed; stopping it");
                        break;
                    }
                    Ok(_) => {}
                }
                match serde_json::from_slice::<ServerLine>(&line) {
                    Ok(ServerLine::Answer(answer)) => {
                        answered.lock().remove(&answer.id);
                        if let Some(waiting) = answers.lock().remove(&answer.id) {
                            let _ = waiting.send(answer.result);
                        }
                    }
                    Ok(ServerLine::Changed(changed)) => {
                        let mut listeners = watchers.lock();
                        if let Some(listener) = listeners.get(&changed.watch) {
                            if !super::access::offer_changes(listener, changed.changes) {
                                // Its reader fell behind: the watch ends here (its handle still stops it).
                                listeners.remove(&changed.watch);
                            }
                        }
                    }
                    Err(error) => {
                        tracing::warn!(tenant = %tenant_name, %error, "unreadable line of a file server")
                    }
                }
            }
            // Stopped: whatever it had is answered by the dropped senders ("stopped; retry"); its watches end.
            living.store(false, Ordering::Relaxed);
            answers.lock().clear();
            answered.lock().clear();
            watchers.lock().clear();
        });
        let (lines, mut to_write) = mpsc::channel::<Vec<u8>>(LINES_QUEUED);
        let writing = alive.clone();
        tokio::spawn(async move {
            let mut input = input;
            while let Some(line) = to_write.recv().await {
                let written = match input.write_all(&line).await {
                    Ok(()) => input.flush().await,
                    Err(error) => Err(error),
                };
                if written.is_err() {
                    // Its stdin broke: the next request starts another server.
                    writing.store(false, Ordering::Relaxed);
                    return;
                }
            }
        });
        tracing::info!(tenant, "started the tenant's file server");
        Ok(Server {
            lines,
            pending,
            running,
            listeners,
            last_used: Mutex::new(std::time::Instant::now()),
            alive,
            _child: child,
        })
    }
}

/// An operation given to a server: when its caller stops waiting (deadline, or dropped) before the answer, the
/// answer is no longer waited for and the server is told to cancel it.
struct Outstanding {
    server: Arc<Server>,
    id: u64,
    /// Its line went to the writer (else the server never hears of it).
    sent: bool,
    answered: bool,
    /// Whether to have it cancelled ([`FileOp::cancellable`]); else it runs to its end, unwaited for.
    cancellable: bool,
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        self.server.pending.lock().remove(&self.id);
        if !self.sent {
            self.server.running.lock().remove(&self.id);
            return;
        }
        if !self.cancellable {
            return;
        }
        let cancel = serde_json::to_vec(&ClientLine::Cancel { cancel: self.id }).map(|mut line| {
            line.push(b'\n');
            line
        });
        // A full queue: the server is far behind, and the operation is still running when it is read; its
        // answer (or the server's end) clears it anyway.
        if let Ok(cancel) = cancel {
            let _ = self.server.lines.try_send(cancel);
        }
    }
}

/// Stop the servers that were idle for `idle` (dropping one kills its sandbox), until the service goes.
async fn stop_idle_servers(service: std::sync::Weak<FileService>, idle: Duration) {
    let mut ticks =
        tokio::time::interval((idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(30)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(service) = service.upgrade() else { return };
        let mut servers = service.servers.lock().await;
        let before = servers.len();
        servers.retain(|_, server| !server.idle_for(idle));
        if servers.len() < before {
            tracing::debug!(stopped = before - servers.len(), "stopped idle file servers");
        }
    }
}

impl FileAccess for FileService {
    fn tenant_root(&self, tenant: &str) -> Option<PathBuf> {
        Some(FileService::tenant_root(self, tenant))
    }

    fn call_within<'a>(
        &'a self,
        tenant: &'a str,
        scope: Option<&'a str>,
        op: FileOp,
    ) -> FileFuture<'a, FileReply> {
        Box::pin(FileService::call(self, tenant, scope, op))
    }

    fn watch_within<'a>(
        &'a self,
        tenant: &'a str,
        scope: Option<&'a str>,
        spec: WatchSpec,
        changes: ChangeSink,
    ) -> FileFuture<'a, WatchHandle> {
        Box::pin(FileService::watch(self, tenant, scope, spec, changes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server whose lines this test reads (its process: a `sleep`, killed with it).
    fn server() -> (Arc<Server>, mpsc::Receiver<Vec<u8>>) {
        let (lines, written) = mpsc::channel(8);
        let child = tokio::process::Command::new("sleep")
            .arg("60")
            .kill_on_drop(true)
            .spawn()
            .expect("sleep");
        let server = Arc::new(Server {
            lines,
            pending: Arc::default(),
            running: Arc::default(),
            listeners: Arc::default(),
            last_used: Mutex::new(std::time::Instant::now() - Duration::from_secs(3600)),
            alive: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            _child: child,
        });
        (server, written)
    }

    #[tokio::test]
    async fn an_operation_given_up_on_is_cancelled_and_keeps_its_server_busy_until_answered() {
        let (server, mut written) = server();
        let (answer, _waiting) = oneshot::channel();
        server.pending.lock().insert(7, answer);
        server.running.lock().insert(7);
        drop(Outstanding {
            server: server.clone(),
            id: 7,
            sent: true,
            answered: false,
            cancellable: true,
        });
        let line = tokio::time::timeout(Duration::from_secs(10), written.recv())
            .await
            .expect("a cancel was sent")
            .expect("a line");
        assert_eq!(line, b"{\"cancel\":7}\n");
        assert!(server.pending.lock().is_empty(), "nobody waits for its answer");
        assert!(
            !server.idle_for(Duration::ZERO),
            "still running on the server: not idle, so not stopped mid-git"
        );
    }

    #[tokio::test]
    async fn a_checkpoint_given_up_on_runs_to_its_end_and_keeps_its_server_busy() {
        let (server, mut written) = server();
        let (answer, _waiting) = oneshot::channel();
        server.pending.lock().insert(9, answer);
        server.running.lock().insert(9);
        drop(Outstanding {
            server: server.clone(),
            id: 9,
            sent: true,
            answered: false,
            cancellable: FileOp::Checkpoint {
                workspace: "/w".into(),
                label: "l".into(),
                session: None,
            }
            .cancellable(),
        });
        assert!(written.try_recv().is_err(), "not cancelled");
        assert!(server.pending.lock().is_empty());
        assert!(!server.idle_for(Duration::ZERO), "still running: not idle");
    }

    #[tokio::test]
    async fn an_operation_never_sent_is_not_cancelled_and_leaves_its_server_idle() {
        let (server, mut written) = server();
        let (answer, _waiting) = oneshot::channel();
        server.pending.lock().insert(8, answer);
        server.running.lock().insert(8);
        drop(Outstanding {
            server: server.clone(),
            id: 8,
            sent: false,
            answered: false,
            cancellable: true,
        });
        assert!(written.try_recv().is_err(), "nothing to cancel");
        assert!(server.idle_for(Duration::ZERO));
    }
}
