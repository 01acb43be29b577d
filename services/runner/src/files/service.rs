//! The runner's side of tenants' files: one file server per tenant ([`super::server`]), started on first use
//! inside a sandbox of the tenant — its user, its part of the workspace the only writable directory, no
//! network — and asked over its stdin/stdout. A server that dies is started again on the next request; the
//! requests it had are answered "unavailable". Servers live as long as this service (killed with it).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use relay_sandbox::{Egress, ResourceLimits, SandboxSpec};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use super::access::{await_answer, ChangeSink, FileAccess, FileFuture, WatchHandle, WatchSpec};
use super::protocol::{ChangeKind, FileError, FileOp, FileReply, Request, ServerLine};
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
type Listeners = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Vec<(String, ChangeKind)>>>>>;

/// A running file server.
struct Server {
    input: tokio::sync::Mutex<tokio::process::ChildStdin>,
    pending: Pending,
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

    /// Run `op` on `tenant`'s files (on the directory of host `scope` alone, when given).
    pub async fn call(&self, tenant: &str, scope: Option<&str>, op: FileOp) -> Result<FileReply, FileError> {
        let key: ServerKey = (tenant.to_string(), scope.map(str::to_string));
        let server = self.server(&key).await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer_tx, answer_rx) = oneshot::channel();
        server.pending.lock().insert(id, answer_tx);
        let mut line = serde_json::to_vec(&Request { id, op })
            .map_err(|error| FileError::Unavailable(format!("cannot encode the request: {error}")))?;
        if line.len() > super::server::max_line(self.max_bytes) {
            return Err(FileError::Invalid(format!(
                "the request is larger than this relay's limit of {} bytes of file content",
                self.max_bytes
            )));
        }
        line.push(b'\n');
        let sent = {
            let mut input = server.input.lock().await;
            match input.write_all(&line).await {
                Ok(()) => input.flush().await,
                Err(error) => Err(error),
            }
        };
        if sent.is_err() {
            server.pending.lock().remove(&id);
            self.forget(&key, &server).await;
            return Err(FileError::Unavailable(
                "the tenant's file server stopped; retry".into(),
            ));
        }
        await_answer(answer_rx, "the tenant's file server stopped; retry", || {
            server.pending.lock().remove(&id);
        })
        .await
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
                        if let Some(waiting) = answers.lock().remove(&answer.id) {
                            let _ = waiting.send(answer.result);
                        }
                    }
                    Ok(ServerLine::Changed(changed)) => {
                        if let Some(listener) = watchers.lock().get(&changed.watch) {
                            let _ = listener.send(changed.changes);
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
            watchers.lock().clear();
        });
        tracing::info!(tenant, "started the tenant's file server");
        Ok(Server {
            input: tokio::sync::Mutex::new(input),
            pending,
            listeners,
            last_used: Mutex::new(std::time::Instant::now()),
            alive,
            _child: child,
        })
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
