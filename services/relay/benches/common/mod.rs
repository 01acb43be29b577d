//! What the relay benchmarks share: the bare tokio-tungstenite broadcast server they compare against, raw
//! WebSocket clients speaking the relay's JSON-RPC, tokens, and starting `ahp-relay` processes.
//!
//! The clients are plain tokio-tungstenite sockets rather than the `ahp` client so that the load generator's
//! own cost stays small next to the servers being measured (it shares the machine's cores with them).
#![allow(dead_code)]

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use relay_core::Role;
use relay_gateway::auth::{mint_hs256, Claims};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::sync::broadcast;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

/// The HS256 secret every benchmarked relay process is started with.
pub const SECRET: &str = "bench-secret-at-least-32-bytes-long";
/// The chat every benchmark publishes to.
pub const CHAT: &str = "ahp-chat:/bench";
/// Longest wait for any single frame; a healthy run never comes near it.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// An admin token of tenant `bench`.
pub fn token() -> String {
    mint_hs256(
        SECRET.as_bytes(),
        &Claims::new("bench", "bench", Role::Admin, None, Duration::from_secs(3600)),
    )
    .expect("token")
}

/// A client's `dispatchAction` of `chat/draftChanged` with `text` on [`CHAT`].
pub fn dispatch_frame(i: usize, text: &str) -> String {
    json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":CHAT,"clientSeq":i + 1,
        "action":{"type":"chat/draftChanged","draft":{"text":text,"origin":{"kind":"user"}}}}})
    .to_string()
}

/// Start `command` (an `ahp-relay` process, or this bench re-executed as a bare server), wait until a stdout
/// line contains `marker` and return the child with the rest of that line. The child is killed when dropped
/// (also when the bench panics), and its stdout keeps being drained so it never blocks.
pub async fn spawn_until(mut command: Command, marker: &str) -> (Child, String) {
    command
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .env("RUST_LOG", "warn")
        .env(
            "AHP_RELAY_INTERNAL_SECRET",
            "bench-internal-secret-at-least-32-bytes",
        )
        // The benches measure delivery, not the relay's inbound rate limits.
        .env("AHP_RELAY_MESSAGES_PER_SECOND_PER_TENANT", "10000000")
        .env("AHP_RELAY_MESSAGES_PER_SECOND_PER_CONNECTION", "10000000")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .expect("spawn (cargo bench builds ahp-relay first)");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let rest = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            if let Some(rest) = line.split(marker).nth(1) {
                return rest.trim().to_string();
            }
        }
        panic!("process exited before printing {marker:?}");
    })
    .await
    .expect("process did not start in time");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, rest)
}

/// The baseline: every text frame received on any socket is broadcast, as is, to every socket (TCP_NODELAY,
/// 4 KiB socket buffers, queued frames written together and flushed once — the same as the relay's gateway). Runs on the
/// current tokio runtime; returns its address.
pub async fn bare_broadcast_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let (tx, _) = broadcast::channel::<bytes::Bytes>(65_536);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let tx = tx.clone();
            tokio::spawn(async move {
                // The same 4 KiB socket buffers as the relay's gateway.
                let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
                    .read_buffer_size(4 * 1024)
                    .write_buffer_size(4 * 1024);
                let Ok(ws) = tokio_tungstenite::accept_async_with_config(stream, Some(config)).await else {
                    return;
                };
                let (mut sink, mut stream) = ws.split();
                let mut rx = tx.subscribe();
                loop {
                    tokio::select! {
                        inbound = stream.next() => match inbound {
                            Some(Ok(Message::Text(text))) => { let _ = tx.send(bytes::Bytes::from(text)); }
                            Some(Ok(_)) => {}
                            _ => return,
                        },
                        frame = rx.recv() => match frame {
                            Ok(frame) => {
                                // Same write discipline as the relay: feed what is queued, flush once.
                                let mut next = Some(frame);
                                while let Some(frame) = next.take() {
                                    let Ok(text) = Utf8Bytes::try_from(frame) else { continue };
                                    if sink.feed(Message::Text(text)).await.is_err() { return; }
                                    next = rx.try_recv().ok();
                                }
                                if sink.flush().await.is_err() { return; }
                            }
                            Err(_) => return,
                        },
                    }
                }
            });
        }
    });
    addr
}

pub async fn connect(url: &str) -> Socket {
    let (socket, _) = tokio_tungstenite::connect_async(url).await.expect("connect");
    if let tokio_tungstenite::MaybeTlsStream::Plain(tcp) = socket.get_ref() {
        let _ = tcp.set_nodelay(true);
    }
    socket
}

/// A connected client that has completed `initialize` as `client_id`.
pub async fn initialized(url: &str, client_id: &str) -> Socket {
    let mut s = connect(url).await;
    request(
        &mut s,
        "initialize",
        json!({"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": client_id}),
    )
    .await;
    s
}

/// Create the demo session `ahp-session:/bench`, whose default chat is [`CHAT`].
pub async fn create_chat(s: &mut Socket) {
    request(
        s,
        "createSession",
        json!({"channel": "ahp-session:/bench", "provider": "demo"}),
    )
    .await;
}

/// Send a request and wait for its response (skipping notifications).
pub async fn request(s: &mut Socket, method: &str, params: Value) -> Value {
    s.send(Message::Text(
        json!({"jsonrpc":"2.0","id":1,"method":method,"params":params})
            .to_string()
            .into(),
    ))
    .await
    .expect("send");
    loop {
        let v: Value = serde_json::from_str(&next_text(s).await).expect("json");
        if v.get("id").is_some() {
            assert!(v.get("error").is_none(), "{method} failed: {v}");
            return v;
        }
    }
}

/// The next text frame, without copying it.
pub async fn next_frame(s: &mut Socket) -> Utf8Bytes {
    loop {
        match tokio::time::timeout(PATIENCE, s.next()).await.expect("timed out") {
            Some(Ok(Message::Text(text))) => return text,
            Some(Ok(_)) => continue,
            other => panic!("socket ended: {other:?}"),
        }
    }
}

pub async fn next_text(s: &mut Socket) -> String {
    next_frame(s).await.to_string()
}

/// CPU time (all threads) a process has used, in seconds, from `/proc/<pid>/stat`.
#[derive(Clone, Copy, Default)]
pub struct Cpu {
    user: f64,
    system: f64,
}

impl Cpu {
    pub fn of(pid: u32) -> Cpu {
        Cpu::try_of(pid).expect("/proc/<pid>/stat")
    }

    pub fn try_of(pid: u32) -> Option<Cpu> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the parenthesized command name, which may itself contain spaces: state is field 3, so
        // utime (14) and stime (15) are the 12th and 13th.
        let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
        let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
        // SAFETY: sysconf only reads a system constant.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        Some(Cpu {
            user: ticks(11)? as f64 / per_second,
            system: ticks(12)? as f64 / per_second,
        })
    }

    pub fn since(self, earlier: Cpu) -> Cpu {
        Cpu {
            user: self.user - earlier.user,
            system: self.system - earlier.system,
        }
    }

    pub fn plus(self, other: Cpu) -> Cpu {
        Cpu {
            user: self.user + other.user,
            system: self.system + other.system,
        }
    }

    pub fn total(self) -> f64 {
        self.user + self.system
    }
}

impl std::fmt::Display for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.2} s ({:.2} user + {:.2} sys)",
            self.total(),
            self.user,
            self.system
        )
    }
}

/// The Redis server's process id (from `INFO server`), to account its CPU time; `None` if it does not say.
pub async fn redis_pid(url: &str) -> Option<u32> {
    let mut conn = redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis");
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .expect("INFO server");
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Resident memory of a process, in KiB (0 if it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Release `ahp-relay` processes started for a bench: killed when this is dropped (also on panic).
pub struct RelayProcesses {
    /// WebSocket URLs clients connect to (token included): one per gateway.
    pub urls: Vec<String>,
    /// The processes holding connections and doing the work (for CPU and memory).
    pub pids: Vec<u32>,
    pub children: Vec<Child>,
    pub dirs: Vec<tempfile::TempDir>,
}

/// `ahp-relay serve` on an embedded SQLite store in a temporary directory.
pub async fn start_embedded() -> RelayProcesses {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--jwt-secret", SECRET])
        .args(["--max-connections-per-tenant", "1000000"])
        .arg("--data-dir")
        .arg(dir.path());
    let (child, url) = spawn_until(command, "listening on ws://").await;
    RelayProcesses {
        urls: vec![format!("ws://{url}?access_token={}", token())],
        pids: vec![child.id().expect("pid")],
        children: vec![child],
        dirs: vec![dir],
    }
}

/// 1 shard (SQLite store in a temporary directory) + 2 gateways, all on `redis_url`.
pub async fn start_gateways(redis_url: &str) -> RelayProcesses {
    start_gateways_n(redis_url, 2).await
}

/// 1 shard (SQLite store in a temporary directory) + `gateways` gateways, all on `redis_url`.
pub async fn start_gateways_n(redis_url: &str, gateways: usize) -> RelayProcesses {
    let dirs: Vec<_> = (0..=gateways)
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    let mut shard = Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
    shard
        .args([
            "shard",
            "--insecure-internal-link",
            "--grpc-listen",
            "127.0.0.1:0",
            "--redis-url",
            redis_url,
        ])
        .arg("--data-dir")
        .arg(dirs[0].path());
    let (shard, shard_url) = spawn_until(shard, "listening on grpc ").await;
    let mut pids = vec![shard.id().expect("pid")];
    let mut children = vec![shard];
    let mut urls = Vec::new();
    for dir in &dirs[1..] {
        let mut gateway = Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
        gateway
            .args(["gateway", "--listen", "127.0.0.1:0", "--jwt-secret", SECRET])
            .args(["--shard", &shard_url, "--redis-url", redis_url])
            .args(["--max-connections-per-tenant", "1000000"])
            .arg("--data-dir")
            .arg(dir.path());
        let (child, url) = spawn_until(gateway, "listening on ws://").await;
        pids.push(child.id().expect("pid"));
        children.push(child);
        urls.push(format!("ws://{url}?access_token={}", token()));
    }
    RelayProcesses {
        urls,
        pids,
        children,
        dirs,
    }
}

/// Raise the open-file limit as far as allowed (the hard limit too, where the process may): a bench holds one
/// descriptor per connection, and the servers it starts inherit the limit.
pub fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            let wanted = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: (1 << 20).max(limit.rlim_max),
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) != 0 {
                limit.rlim_cur = limit.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            }
        }
    }
}

/// Set in the environment of a bench re-executed as the bare broadcast server (a process of its own).
pub const BARE_SERVER_ENV: &str = "AHP_BENCH_BARE_SERVER";

/// If this process was started as the bare server ([`BARE_SERVER_ENV`]): serve, on the same kind of runtime as
/// `ahp-relay` (multi-threaded, one worker per core), until the parent closes our stdin (or kills us), and
/// return `true`.
pub fn serve_bare_if_asked() -> bool {
    if std::env::var_os(BARE_SERVER_ENV).is_none() {
        return false;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        use tokio::io::AsyncReadExt;
        let addr = bare_broadcast_server().await;
        println!("bare broadcast server listening on ws://{addr}");
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
    });
    true
}

/// Run a bench's `body` on a 2-worker runtime; it fails if it does not finish within `deadline`.
pub fn run_with_deadline(deadline: Duration, body: impl std::future::Future<Output = ()>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        tokio::time::timeout(deadline, body)
            .await
            .expect("the benchmark did not finish within its deadline");
    });
}

/// `ahp-relay serve` with the scripted test agent as `scripted` (its workspace in a temporary directory), `quotas`
/// (TOML, e.g. `[quotas]` lines) appended to its agents file.
pub struct ScriptedRelay {
    pub addr: String,
    _relay: Child,
    _data: tempfile::TempDir,
    _workspace: tempfile::TempDir,
}

pub async fn serve_with_scripted_agent(quotas: &str) -> ScriptedRelay {
    let data = tempfile::tempdir().expect("data");
    let workspace = tempfile::tempdir().expect("workspace");
    let agents = data.path().join("agents.toml");
    std::fs::write(
        &agents,
        format!(
            "workspace_root = {:?}\n\n[[agent]]\nid = \"scripted\"\ndisplay_name = \"Scripted\"\ncommand = {:?}\nenv = [\"PATH\"]\n\n{quotas}\n",
            workspace.path().display().to_string(),
            env!("CARGO_BIN_EXE_ahp-relay-test-agent"),
        ),
    )
    .expect("agents file");
    let mut command = Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
    command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--jwt-secret",
            SECRET,
            "--agents",
        ])
        .arg(&agents)
        .arg("--data-dir")
        .arg(data.path().join("relay"));
    let (relay, addr) = spawn_until(command, "listening on ws://").await;
    ScriptedRelay {
        addr,
        _relay: relay,
        _data: data,
        _workspace: workspace,
    }
}
