//! What one tenant's agents may use where they run (this runner, or `serve`), enforced here:
//! - **running processes**: agents and terminal commands started for the tenant at once ([`RunningSlot`]);
//! - **output rate**: one token bucket per tenant, drawn by every pipe the relay reads from the tenant's agents
//!   and commands ([`ThrottledReader`]): past the rate the relay stops reading, the pipe fills and the agent
//!   waits — nothing is buffered without bound, in the runner or anywhere after it;
//! - **workspace bytes**: each active tenant's directories are measured periodically; at or over the quota
//!   the tenant's running turns and commands are stopped and new ones refused ([`TenantQuotas::over_workspace`]).
//!
//! The per-turn output cap lives with the turn ([`super::session`]); the per-session terminal count with the
//! terminals ([`super::terminal`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::watch;

/// Limits of every tenant here.
#[derive(Debug, Clone)]
pub struct QuotaLimits {
    pub running_per_tenant: usize,
    pub output_bytes_per_second: u64,
    /// What a tenant may read in a burst before the rate applies.
    pub output_burst_bytes: u64,
    pub workspace_bytes_per_tenant: u64,
}

/// The quotas of every tenant with agents here.
pub struct TenantQuotas {
    limits: QuotaLimits,
    tenants: Mutex<HashMap<String, TenantUsage>>,
}

struct TenantUsage {
    running: usize,
    output: Arc<OutputBucket>,
    /// Set while the tenant's last measurement was at or over its workspace quota (with that measurement).
    over_workspace: watch::Sender<Option<u64>>,
    /// When the tenant last had something running (tenants idle for long are no longer measured).
    last_active: Instant,
    /// The last measurement of its workspace (none yet: measure before it starts anything).
    measured: Option<(u64, Instant)>,
    /// Bytes the relay wrote for its agents since (`fs/write_text_file`), counted until the next measurement.
    written_since: u64,
}

/// Why a process was not started.
#[derive(Debug, Clone, thiserror::Error)]
pub enum QuotaRefusal {
    #[error("this tenant already runs {0} agent processes and commands here (its limit)")]
    Running(usize),
    #[error(
        "this tenant's workspace holds {used} bytes, at or over its quota of {limit} bytes: remove files or \
         dispose sessions"
    )]
    Workspace { used: u64, limit: u64 },
}

impl TenantQuotas {
    pub fn new(limits: QuotaLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            tenants: Mutex::new(HashMap::new()),
        })
    }

    pub fn limits(&self) -> &QuotaLimits {
        &self.limits
    }

    fn with_usage<T>(&self, tenant: &str, f: impl FnOnce(&mut TenantUsage) -> T) -> T {
        let mut tenants = self.tenants.lock();
        let usage = tenants.entry(tenant.to_string()).or_insert_with(|| TenantUsage {
            running: 0,
            output: Arc::new(OutputBucket::new(
                self.limits.output_bytes_per_second,
                self.limits.output_burst_bytes,
            )),
            over_workspace: watch::channel(None).0,
            last_active: Instant::now(),
            measured: None,
            written_since: 0,
        });
        f(usage)
    }

    /// Take a slot for one more running process of `tenant`, or say why not.
    pub fn start(self: &Arc<Self>, tenant: &str) -> Result<RunningSlot, QuotaRefusal> {
        if let Some(refusal) = self.workspace_refusal(tenant) {
            return Err(refusal);
        }
        let limit = self.limits.running_per_tenant;
        self.with_usage(tenant, |usage| {
            if usage.running >= limit {
                return Err(QuotaRefusal::Running(limit));
            }
            usage.running += 1;
            usage.last_active = Instant::now();
            Ok(RunningSlot {
                tenant: tenant.to_string(),
                quotas: self.clone(),
                over_workspace: usage.over_workspace.subscribe(),
                output: usage.output.clone(),
            })
        })
    }

    /// Why `tenant` may not start more work now, if its workspace is over its quota.
    pub fn workspace_refusal(&self, tenant: &str) -> Option<QuotaRefusal> {
        let used = self.with_usage(tenant, |usage| *usage.over_workspace.borrow())?;
        Some(QuotaRefusal::Workspace {
            used,
            limit: self.limits.workspace_bytes_per_tenant,
        })
    }

    /// The tenants to measure: those with something running, or active in the last `recent`.
    pub fn active_tenants(&self, recent: Duration) -> Vec<String> {
        let mut tenants = self.tenants.lock();
        tenants.retain(|_, usage| usage.running > 0 || usage.last_active.elapsed() < recent * 10);
        tenants
            .iter()
            .filter(|(_, usage)| usage.running > 0 || usage.last_active.elapsed() < recent)
            .map(|(tenant, _)| tenant.clone())
            .collect()
    }

    /// Whether `tenant`'s workspace has no recent measurement (`fresh`), so it must be measured before it
    /// starts anything (a runner that just started, or a tenant idle for long, knows nothing of its disk).
    pub fn needs_measurement(&self, tenant: &str, fresh: Duration) -> bool {
        self.with_usage(tenant, |usage| {
            usage.measured.is_none_or(|(_, at)| at.elapsed() > fresh)
        })
    }

    /// The relay wrote `bytes` into `tenant`'s workspace for an agent: counted with its last measurement.
    pub fn written(&self, tenant: &str, bytes: u64) {
        let limit = self.limits.workspace_bytes_per_tenant;
        self.with_usage(tenant, |usage| {
            usage.written_since = usage.written_since.saturating_add(bytes);
            let total = usage.measured.map_or(0, |(measured, _)| measured) + usage.written_since;
            if total >= limit {
                usage.over_workspace.send_replace(Some(total));
            }
        });
    }

    /// Record a measurement of `tenant`'s workspace: at or over the quota its running work is told to stop.
    pub fn workspace_measured(&self, tenant: &str, bytes: u64) {
        let over = (bytes >= self.limits.workspace_bytes_per_tenant).then_some(bytes);
        self.with_usage(tenant, |usage| {
            usage.measured = Some((bytes, Instant::now()));
            usage.written_since = 0;
            usage.over_workspace.send_if_modified(|current| {
                let changed = current.is_some() != over.is_some();
                *current = over;
                changed
            });
        });
        if over.is_some() {
            tracing::warn!(
                tenant,
                bytes,
                limit = self.limits.workspace_bytes_per_tenant,
                "a tenant's workspace is over its quota"
            );
        }
    }

    /// How many processes `tenant` runs here now.
    pub fn running(&self, tenant: &str) -> usize {
        self.tenants.lock().get(tenant).map_or(0, |usage| usage.running)
    }
}

/// One running process of a tenant (an agent or a command), counted until dropped.
pub struct RunningSlot {
    tenant: String,
    quotas: Arc<TenantQuotas>,
    over_workspace: watch::Receiver<Option<u64>>,
    output: Arc<OutputBucket>,
}

impl RunningSlot {
    /// Resolves when the tenant's workspace goes over its quota (the process should stop), with the message.
    pub async fn workspace_exceeded(&self) -> String {
        let limit = self.quotas.limits.workspace_bytes_per_tenant;
        let mut over = self.over_workspace.clone();
        let used = over
            .wait_for(Option::is_some)
            .await
            .ok()
            .map(|used| used.unwrap_or(limit));
        let Some(used) = used else {
            return std::future::pending().await;
        };
        QuotaRefusal::Workspace { used, limit }.to_string()
    }

    /// The tenant's output bucket, for readers of this process's pipes.
    pub fn output(&self) -> Arc<OutputBucket> {
        self.output.clone()
    }
}

impl Drop for RunningSlot {
    fn drop(&mut self) {
        self.quotas.with_usage(&self.tenant, |usage| {
            usage.running = usage.running.saturating_sub(1);
            usage.last_active = Instant::now();
        });
    }
}

/// A token bucket of bytes (rate per second, burst), shared by every reader of one tenant's pipes. Its clock is
/// Tokio's (the same as the waits it asks for).
#[derive(Debug)]
pub struct OutputBucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, tokio::time::Instant)>,
}

impl OutputBucket {
    pub fn new(bytes_per_second: u64, burst: u64) -> Self {
        let burst = burst.max(bytes_per_second).max(64 * 1024) as f64;
        Self {
            rate: (bytes_per_second.max(1)) as f64,
            burst,
            state: Mutex::new((burst, tokio::time::Instant::now())),
        }
    }

    /// Take up to `want` bytes now: the bytes granted, or how long until some may be read.
    pub fn take(&self, want: usize) -> Result<usize, Duration> {
        let mut state = self.state.lock();
        let now = tokio::time::Instant::now();
        let refilled = (state.0 + now.duration_since(state.1).as_secs_f64() * self.rate).min(self.burst);
        *state = (refilled, now);
        // Wait for a useful amount rather than trickle a byte at a time.
        let useful = (want as f64).min(4096.0).min(self.burst);
        if refilled < useful {
            let hour = Duration::from_secs(3600);
            let wait = Duration::try_from_secs_f64((useful - refilled) / self.rate);
            return Err(wait.map_or(hour, |wait| wait.min(hour)));
        }
        let granted = (want as f64).min(refilled).floor();
        state.0 -= granted;
        Ok(granted as usize)
    }
}

/// A pipe read no faster than its tenant's output rate, with lines no longer than a limit (ACP is one JSON
/// message per line: a longer line ends the stream instead of growing a buffer without bound).
pub struct ThrottledReader<R> {
    inner: R,
    bucket: Arc<OutputBucket>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Bytes taken from the bucket and not read yet (a read that was pending keeps its grant).
    grant: usize,
    scratch: Vec<u8>,
    max_line: Option<usize>,
    line: usize,
    /// Where what is read goes: nothing more is read while it has no room (its host's store is behind).
    sink: Option<Arc<dyn crate::provider::ChatSink>>,
    room: Option<crate::provider::Room>,
}

impl<R> ThrottledReader<R> {
    pub fn new(inner: R, bucket: Arc<OutputBucket>, max_line: Option<usize>) -> Self {
        Self {
            inner,
            bucket,
            wait: None,
            grant: 0,
            scratch: vec![0; 64 * 1024],
            max_line,
            line: 0,
            sink: None,
            room: None,
        }
    }

    /// Read nothing more while `sink` has no room ([`crate::provider::ChatSink::room`]): the agent's pipe
    /// fills, not this process's memory (its messages are queued by the ACP connection as they are read).
    pub fn waiting_for(mut self, sink: Arc<dyn crate::provider::ChatSink>) -> Self {
        self.sink = Some(sink);
        self
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for ThrottledReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.grant == 0 && this.room.is_none() {
            this.room = this.sink.as_ref().and_then(|sink| sink.room());
        }
        if let Some(room) = &mut this.room {
            if room.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.room = None;
        }
        while this.grant == 0 {
            if let Some(wait) = &mut this.wait {
                if wait.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.wait = None;
            }
            match this.bucket.take(this.scratch.len()) {
                Ok(granted) => this.grant = granted,
                Err(wait) => this.wait = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        let want = this.grant.min(buf.remaining()).min(this.scratch.len());
        let mut scratch = ReadBuf::new(&mut this.scratch[..want]);
        match Pin::new(&mut this.inner).poll_read(cx, &mut scratch) {
            Poll::Ready(Ok(())) => {
                let read = scratch.filled();
                this.grant -= read.len();
                if let Some(max) = this.max_line {
                    for byte in read {
                        this.line = if *byte == b'\n' { 0 } else { this.line + 1 };
                        if this.line > max {
                            return Poll::Ready(Err(std::io::Error::other(format!(
                                "the agent wrote a line over {max} bytes"
                            ))));
                        }
                    }
                }
                buf.put_slice(read);
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn limits(running: usize) -> QuotaLimits {
        QuotaLimits {
            running_per_tenant: running,
            output_bytes_per_second: 64 * 1024,
            output_burst_bytes: 64 * 1024,
            workspace_bytes_per_tenant: 1000,
        }
    }

    #[test]
    fn a_tenant_runs_up_to_its_limit_and_another_tenant_is_not_counted() {
        let quotas = TenantQuotas::new(limits(2));
        let one = quotas.start("a").expect("one");
        let _two = quotas.start("a").expect("two");
        assert!(matches!(quotas.start("a"), Err(QuotaRefusal::Running(2))));
        let _b = quotas.start("b").expect("b is not a");
        drop(one);
        assert!(quotas.start("a").is_ok(), "a slot is given back");
    }

    #[tokio::test]
    async fn a_workspace_over_its_quota_stops_running_work_and_refuses_new() {
        let quotas = TenantQuotas::new(limits(10));
        let running = quotas.start("a").expect("start");
        quotas.workspace_measured("a", 999);
        assert!(quotas.start("a").is_ok());
        quotas.workspace_measured("a", 1000);
        let said = tokio::time::timeout(Duration::from_secs(5), running.workspace_exceeded())
            .await
            .expect("told to stop");
        assert!(said.contains("1000 bytes"), "{said}");
        assert!(matches!(
            quotas.start("a"),
            Err(QuotaRefusal::Workspace { used: 1000, .. })
        ));
        assert!(quotas.start("b").is_ok(), "another tenant is not refused");
        quotas.workspace_measured("a", 10);
        assert!(quotas.start("a").is_ok(), "back under: allowed again");
    }

    #[tokio::test(start_paused = true)]
    async fn reading_is_held_to_the_rate_after_the_burst() {
        let bucket = Arc::new(OutputBucket::new(64 * 1024, 64 * 1024));
        let data = vec![b'y'; 256 * 1024];
        let mut reader = ThrottledReader::new(&data[..], bucket, None);
        let started = tokio::time::Instant::now();
        let mut all = Vec::new();
        reader.read_to_end(&mut all).await.expect("read");
        assert_eq!(all.len(), data.len());
        // 64 KiB of burst, then 192 KiB at 64 KiB/s: three seconds (of the paused, auto-advancing clock).
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(2900) && took <= Duration::from_millis(3200),
            "{took:?}"
        );
    }

    #[tokio::test]
    async fn a_line_over_the_limit_ends_the_stream() {
        let bucket = Arc::new(OutputBucket::new(1 << 30, 1 << 30));
        let data = [b"short\n".to_vec(), vec![b'x'; 100]].concat();
        let mut reader = ThrottledReader::new(&data[..], bucket, Some(50));
        let mut all = Vec::new();
        let error = reader.read_to_end(&mut all).await.expect_err("too long");
        assert!(error.to_string().contains("over 50 bytes"), "{error}");
    }
}
