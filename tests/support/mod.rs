//! Test harness: starts the real `ahp-relay` binary on a free loopback port and connects official `ahp`
//! clients to it over real WebSockets.
#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use ahp::{Client, ClientConfig, SessionSubscription, SubscriptionEvent};
use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::commands::{CreateChatParams, CreateSessionParams, InitializeResult};
use ahp_types::state::{
    ChatState, Message, MessageKind, MessageOrigin, SessionState, Snapshot, SnapshotState,
};
use relay_core::Role;
use relay_gateway::auth::{mint_hs256, Claims};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub mod devices;
pub mod raw;
pub mod redis_bus;

pub const SECRET: &str = "e2e-test-secret-at-least-32-bytes-long";
/// The internal credential every shard and gateway of a test shares (AHP_RELAY_INTERNAL_SECRET).
pub const INTERNAL_SECRET: &str = "e2e-internal-secret-at-least-32-bytes";
/// The credential runners present to the shards of a test (AHP_RELAY_RUNNER_SECRET), apart from the internal one.
pub const RUNNER_SECRET: &str = "e2e-runner-secret-at-least-32-bytes-long";
/// Upper bound for anything a test waits for; a correct relay answers in milliseconds.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A running relay process, killed when dropped.
pub struct Relay {
    child: Child,
    pub addr: String,
    _data: Option<tempfile::TempDir>,
}

impl Relay {
    /// The relay's data directory, when the test made it.
    pub fn data_dir(&self) -> Option<&std::path::Path> {
        self._data.as_ref().map(|dir| dir.path())
    }

    pub async fn start() -> Relay {
        Self::start_with(&[]).await
    }

    /// Start with extra `serve` flags, on a fresh embedded (SQLite) store.
    pub async fn start_with(extra: &[&str]) -> Relay {
        let data = tempfile::tempdir().expect("tempdir");
        let mut relay = Self::start_in(data.path(), extra).await;
        relay._data = Some(data);
        relay
    }

    /// [`Relay::start_with`], its throw-away data directory made inside `parent` (e.g. a tmpfs, where a
    /// commit's fsync costs nothing, for tests that time something other than the disk).
    pub async fn start_with_data_in(parent: &std::path::Path, extra: &[&str]) -> Relay {
        let data = tempfile::tempdir_in(parent).expect("tempdir");
        let mut relay = Self::start_in(data.path(), extra).await;
        relay._data = Some(data);
        relay
    }

    /// Start on the store in `data_dir` (or the `--database-url` among `extra`), e.g. after a crash.
    pub async fn start_in(data_dir: &std::path::Path, extra: &[&str]) -> Relay {
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--data-dir".into(),
            data_dir.display().to_string(),
        ];
        if !extra.contains(&"--demo-step-ms") {
            args.extend(["--demo-step-ms".into(), "5".into()]);
        }
        // The demo agent's workspace (on by default) is turned on by the tests about it: the others keep a
        // relay that starts no sandbox for the demo.
        if !extra.contains(&"--demo-workspace") {
            args.extend(["--demo-workspace".into(), "false".into()]);
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        Self::spawn(&args).await
    }

    /// A gateway process in front of the shard at `shard_url`.
    pub async fn gateway(shard_url: &str) -> Relay {
        Self::gateway_with(shard_url, &[]).await
    }

    /// A gateway process in front of the shard at `shard_url`, with extra `gateway` flags.
    pub async fn gateway_with(shard_url: &str, extra: &[&str]) -> Relay {
        Self::gateway_env(shard_url, extra, &[]).await
    }

    /// [`Relay::gateway_with`], with extra environment variables.
    pub async fn gateway_env(shard_url: &str, extra: &[&str], env: &[(&str, &str)]) -> Relay {
        let program = std::path::Path::new(env!("CARGO_BIN_EXE_ahp-relay"));
        Self::gateway_program(program, shard_url, extra, env).await
    }

    /// Run `ahp-relay ARGS --listen 127.0.0.1:0 --jwt-secret SECRET` and wait for its WebSocket URL.
    async fn spawn(args: &[String]) -> Relay {
        Self::spawn_env(args, &[]).await
    }

    /// `serve` with `extra` flags on the store in `data_dir`, run through `wrapper` (a program and its arguments,
    /// given the relay's path and arguments after them: e.g. one that mounts a filesystem first, then execs).
    pub async fn start_wrapped(wrapper: &[&str], data_dir: &std::path::Path, extra: &[&str]) -> Relay {
        let mut command = Command::new(wrapper[0]);
        command
            .args(&wrapper[1..])
            .arg(env!("CARGO_BIN_EXE_ahp-relay"))
            .args([
                "serve",
                "--demo-step-ms",
                "5",
                "--demo-workspace",
                "false",
                "--data-dir",
            ])
            .arg(data_dir)
            .args(extra)
            .args(["--listen", "127.0.0.1:0", "--jwt-secret", SECRET]);
        let (child, addr) = spawn_until(command, "listening on ws://").await;
        Relay {
            child,
            addr: addr.trim_end_matches("/v1/ws").to_string(),
            _data: None,
        }
    }

    async fn spawn_env(args: &[String], env: &[(&str, &str)]) -> Relay {
        Self::spawn_program(std::path::Path::new(env!("CARGO_BIN_EXE_ahp-relay")), args, env).await
    }

    /// A gateway process of the `ahp-relay` binary at `program` (e.g. the previous release's), in front of the
    /// shards at `shard_urls`, with extra `gateway` flags.
    pub async fn gateway_of(program: &std::path::Path, shard_urls: &str, extra: &[&str]) -> Relay {
        Self::gateway_program(program, shard_urls, extra, &[]).await
    }

    async fn gateway_program(
        program: &std::path::Path,
        shard_urls: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Relay {
        let data = tempfile::tempdir().expect("tempdir");
        let mut args: Vec<String> = vec![
            "gateway".into(),
            "--shard".into(),
            shard_urls.into(),
            "--data-dir".into(),
            data.path().display().to_string(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut relay = Self::spawn_program(program, &args, env).await;
        relay._data = Some(data);
        relay
    }

    async fn spawn_program(program: &std::path::Path, args: &[String], env: &[(&str, &str)]) -> Relay {
        let mut command = Command::new(program);
        command
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--jwt-secret", SECRET])
            .envs(env.iter().copied());
        let (child, addr) = spawn_until(command, "listening on ws://").await;
        Relay {
            child,
            addr: addr.trim_end_matches("/v1/ws").to_string(),
            _data: None,
        }
    }

    pub fn url(&self) -> String {
        format!("ws://{}/v1/ws", self.addr)
    }

    pub fn token(&self, tenant: &str, sub: &str, role: Role) -> String {
        mint_hs256(
            SECRET.as_bytes(),
            &Claims::new(tenant, sub, role, None, Duration::from_secs(3600)),
        )
        .expect("mint")
    }

    /// A connected, not yet initialized client of the tenant's `default` host.
    pub async fn connect(&self, tenant: &str, sub: &str, role: Role) -> Client {
        self.connect_host("default", tenant, sub, role).await
    }

    /// A connected, not yet initialized client of a named host.
    pub async fn connect_host(&self, host: &str, tenant: &str, sub: &str, role: Role) -> Client {
        let url = format!(
            "ws://{}/v1/hosts/{host}/ws?access_token={}",
            self.addr,
            self.token(tenant, sub, role)
        );
        let transport = ahp_ws::WebSocketTransport::connect(&url).await.expect("connect");
        Client::connect(
            transport,
            ClientConfig {
                default_request_timeout: Some(PATIENCE),
                subscription_buffer: 65_536,
            },
        )
        .await
        .expect("client")
    }

    /// A client of tenant `dev` initialized with `client_id`.
    pub async fn client(&self, client_id: &str) -> (Client, InitializeResult) {
        self.client_as("dev", client_id, Role::Member, client_id).await
    }

    pub async fn client_as(
        &self,
        tenant: &str,
        sub: &str,
        role: Role,
        client_id: &str,
    ) -> (Client, InitializeResult) {
        let client = self.connect(tenant, sub, role).await;
        let init = client
            .initialize(client_id.into(), vec!["1.0.0".into()], vec!["ahp-root://".into()])
            .await
            .expect("initialize");
        (client, init)
    }

    /// The relay process's id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// The relay process's resident memory now and at its peak (VmRSS, VmHWM), in bytes.
    pub fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("proc status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb * 1024)
                .unwrap_or_else(|| panic!("{name} missing in /proc status"))
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// The relay's Prometheus metrics.
    pub async fn metric(&self, name: &str) -> f64 {
        metric_at(&self.addr, name).await
    }

    /// SIGTERM the relay (graceful shutdown) and wait until it exits; returns whether it exited cleanly.
    pub async fn terminate(&mut self) -> bool {
        terminate(&mut self.child).await
    }

    /// SIGKILL the relay and wait until it is gone.
    pub async fn kill(&mut self) {
        self.child.start_kill().expect("SIGKILL");
        self.child.wait().await.expect("wait");
    }
}

/// `GET path` on `addr` (HTTP/1.0): the status code and the response body, or the connection error (e.g.
/// refused once the process is gone).
pub async fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// One series (`name` or `name{labels}`) of the Prometheus text served at `addr`'s `/metrics`.
pub async fn metric_at(addr: &str, series: &str) -> f64 {
    let (status, body) = http_get(addr, "/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{series} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("metric {series} missing in:\n{body}"))
}

/// Start an `ahp-relay` process and wait until a stdout line contains `marker`; returns the child and the rest
/// of that line after the marker. Its stdout keeps being drained so it never blocks.
pub async fn spawn_until(command: Command, marker: &str) -> (Child, String) {
    let (child, mut rest) = spawn_until_all(command, &[marker]).await;
    (child, rest.remove(0))
}

/// [`spawn_until`] for several lines: waits until each marker was seen (in any order) and returns the rest
/// of each marker's line, in the order of `markers`.
pub async fn spawn_until_all(mut command: Command, markers: &[&str]) -> (Child, Vec<String>) {
    command
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .env("AHP_RELAY_INTERNAL_SECRET", INTERNAL_SECRET)
        .env("AHP_RELAY_RUNNER_SECRET", RUNNER_SECRET)
        .env(
            "RUST_LOG",
            std::env::var("AHP_TEST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("spawn ahp-relay");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let rest = tokio::time::timeout(PATIENCE, async {
        let mut found: Vec<Option<String>> = vec![None; markers.len()];
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            for (marker, slot) in markers.iter().zip(found.iter_mut()) {
                if let Some(rest) = line.split(marker).nth(1) {
                    *slot = Some(rest.trim().to_string());
                }
            }
            if found.iter().all(Option::is_some) {
                return found.into_iter().flatten().collect::<Vec<_>>();
            }
        }
        panic!("ahp-relay exited before printing all of {markers:?}");
    })
    .await
    .expect("ahp-relay did not start in time");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, rest)
}

/// A shard process (host logic behind gRPC), killed when dropped.
pub struct Shard {
    child: Child,
    /// The gRPC URL gateways use.
    pub url: String,
    /// The address of its HTTP endpoint (`/healthz`, `/readyz`, `/metrics`).
    pub http: String,
    _data: tempfile::TempDir,
}

impl Shard {
    pub async fn start(extra: &[&str]) -> Shard {
        Self::start_env(extra, &[]).await
    }

    /// [`Shard::start`], with extra environment variables.
    pub async fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Shard {
        Self::start_program(std::path::Path::new(env!("CARGO_BIN_EXE_ahp-relay")), extra, env).await
    }

    /// [`Shard::start_env`] of the `ahp-relay` binary at `program` (e.g. the previous release's).
    pub async fn start_program(program: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> Shard {
        let data = tempfile::tempdir().expect("tempdir");
        let mut command = Command::new(program);
        command
            .arg("shard")
            // A test may name the gRPC address (a replacement on its predecessor's address).
            .args(if extra.contains(&"--grpc-listen") {
                &[][..]
            } else {
                &["--grpc-listen", "127.0.0.1:0"][..]
            })
            .args(["--http-listen", "127.0.0.1:0", "--data-dir"])
            .arg(data.path())
            .args(if extra.contains(&"--demo-step-ms") {
                &[][..]
            } else {
                &["--demo-step-ms", "5"][..]
            })
            // Tests that are not about identity assertions run the link without them (a test names its key).
            .args(if extra.contains(&"--identity-verifying-key") {
                &[][..]
            } else {
                &["--insecure-internal-link"][..]
            })
            .args(extra)
            .envs(env.iter().copied());
        let (child, mut found) =
            spawn_until_all(command, &["listening on grpc ", "http listening on "]).await;
        let http = found.remove(1);
        Shard {
            child,
            url: found.remove(0),
            http: http.trim_start_matches("http://").to_string(),
            _data: data,
        }
    }

    /// The shard's data directory (its SQLite store when it runs without --database-url).
    pub fn data_dir(&self) -> &std::path::Path {
        self._data.path()
    }

    /// SIGTERM the shard; true if it then exited successfully.
    pub async fn terminate(&mut self) -> bool {
        terminate(&mut self.child).await
    }

    /// One series of the shard's Prometheus metrics.
    pub async fn metric(&self, series: &str) -> f64 {
        metric_at(&self.http, series).await
    }

    /// SIGKILL the shard and wait until it is gone.
    pub async fn kill(&mut self) {
        self.child.start_kill().expect("SIGKILL");
        self.child.wait().await.expect("wait");
    }
}

/// SIGTERM a process; true if it then exited successfully within [`PATIENCE`].
pub async fn terminate(child: &mut Child) -> bool {
    let pid = child.id().expect("running");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("the process did not exit after SIGTERM")
        .expect("wait")
        .success()
}

/// Create a demo session; returns it and its default chat (the host names it after the session).
pub async fn create_session_and_chat(client: &Client, name: &str) -> (String, String) {
    let session = format!("ahp-session:/{name}");
    let chat = format!("ahp-chat:/{name}");
    let _: serde_json::Value = client
        .request(
            "createSession",
            CreateSessionParams {
                channel: session.clone(),
                meta: None,
                provider: Some("demo".into()),
                working_directories: None,
                config: None,
                active_client: None,
                progress_token: None,
            },
        )
        .await
        .expect("createSession");
    // Its default chat, which the host names after the session.
    (session, chat)
}

/// Create a plain chat in a session.
pub async fn create_chat(client: &Client, session: &str, chat: &str) {
    let _: serde_json::Value = client
        .request(
            "createChat",
            CreateChatParams {
                channel: session.into(),
                meta: None,
                chat: chat.into(),
                initial_message: None,
                source: None,
                working_directories: None,
            },
        )
        .await
        .expect("createChat");
}

/// A device's answer to a pending tool-call confirmation (no option named: the agent's by kind).
pub fn confirm_tool_call(turn_id: &str, tool_call_id: &str, approved: bool) -> StateAction {
    StateAction::ChatToolCallConfirmed(ahp_types::actions::ChatToolCallConfirmedAction {
        turn_id: turn_id.into(),
        tool_call_id: tool_call_id.into(),
        meta: None,
        approved,
        confirmed: None,
        reason: None,
        edited_tool_input: None,
        user_suggestion: None,
        reason_message: None,
        selected_option_id: None,
    })
}

pub fn message(text: &str) -> Message {
    Message {
        text: text.into(),
        origin: MessageOrigin {
            kind: MessageKind::User,
        },
        attachments: None,
        model: None,
        agent: None,
        meta: None,
    }
}

pub fn turn_started(turn_id: &str, text: &str) -> StateAction {
    turn_started_with(turn_id, message(text))
}

/// `chat/turnStarted` carrying a message built by the caller (another kind, a model, …), started now (a host
/// accepts client timestamps only near its own clock).
pub fn turn_started_with(turn_id: &str, message: Message) -> StateAction {
    turn_started_at(turn_id, &now_timestamp(), message)
}

/// The current time as a client stamps it (RFC 3339, milliseconds).
pub fn now_timestamp() -> String {
    format!("{:.3}", jiff::Timestamp::now())
}

/// `chat/turnStarted` with the start time a client gives (it becomes the chat's `modifiedAt`).
pub fn turn_started_at(turn_id: &str, started_at: &str, message: Message) -> StateAction {
    StateAction::ChatTurnStarted(ahp_types::actions::ChatTurnStartedAction {
        turn_id: turn_id.into(),
        started_at: started_at.into(),
        message,
        queued_message_id: None,
        meta: None,
    })
}

pub fn chat_of(snapshot: &Snapshot) -> ChatState {
    match &snapshot.state {
        SnapshotState::Chat(chat) => (**chat).clone(),
        other => panic!("not a chat snapshot: {other:?}"),
    }
}

pub fn session_of(snapshot: &Snapshot) -> SessionState {
    match &snapshot.state {
        SnapshotState::Session(s) => (**s).clone(),
        other => panic!("not a session snapshot: {other:?}"),
    }
}

/// Subscribe and return the chat snapshot, its seq, and the live subscription.
pub async fn subscribe_chat(client: &Client, chat: &str) -> (ChatState, u64, SessionSubscription) {
    let (result, sub) = client.subscribe(chat.into()).await.expect("subscribe");
    let snapshot = result.snapshot.expect("chat snapshot");
    (chat_of(&snapshot), snapshot.from_seq as u64, sub)
}

/// A fresh snapshot of a chat of tenant `dev`, taken by a throw-away client.
pub async fn fresh_chat_snapshot(relay: &Relay, chat: &str) -> ChatState {
    fresh_chat_snapshot_for(relay, "dev", chat).await
}

/// A fresh snapshot of a chat of `tenant`, taken by a throw-away viewer.
pub async fn fresh_chat_snapshot_for(relay: &Relay, tenant: &str, chat: &str) -> ChatState {
    let (observer, _) = relay
        .client_as(tenant, "observer", Role::Viewer, "observer")
        .await;
    let (state, _, _) = subscribe_chat(&observer, chat).await;
    observer.shutdown().await;
    state
}

/// Next action envelope on a subscription, within [`PATIENCE`].
pub async fn next_envelope(sub: &mut SessionSubscription) -> ActionEnvelope {
    loop {
        match tokio::time::timeout(PATIENCE, sub.recv())
            .await
            .expect("timed out waiting for an envelope")
        {
            Some(SubscriptionEvent::Action(env)) => return env,
            Some(_) => continue,
            None => panic!("subscription closed"),
        }
    }
}

/// Collect envelopes until (and including) the first one matching `done`.
pub async fn collect_until(
    sub: &mut SessionSubscription,
    done: impl Fn(&ActionEnvelope) -> bool,
) -> Vec<ActionEnvelope> {
    let mut out = Vec::new();
    loop {
        let env = next_envelope(sub).await;
        let stop = done(&env);
        out.push(env);
        if stop {
            return out;
        }
    }
}

pub fn is_turn_complete(env: &ActionEnvelope) -> bool {
    matches!(env.action, StateAction::ChatTurnComplete(_))
}

/// Apply envelopes to a chat state the way a client does: accepted ones only, each once, after `from`.
pub fn reduce_chat(mut state: ChatState, from: u64, envelopes: &[ActionEnvelope]) -> ChatState {
    let mut last = from;
    for env in envelopes {
        if env.rejection_reason.is_some() || env.server_seq <= last {
            continue;
        }
        last = env.server_seq;
        ahp::reducers::apply_action_to_chat(&mut state, &env.action);
    }
    state
}

pub fn json<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("json")
}

/// Assert strictly increasing `serverSeq`s.
pub fn assert_increasing(envelopes: &[ActionEnvelope]) {
    for pair in envelopes.windows(2) {
        assert!(
            pair[0].server_seq < pair[1].server_seq,
            "serverSeq went from {} to {}",
            pair[0].server_seq,
            pair[1].server_seq
        );
    }
}

/// A store the relay can run on: SQLite in a directory, or the Postgres in `DATABASE_URL`.
pub struct TestStore {
    pub dir: tempfile::TempDir,
    pub database_url: Option<String>,
}

impl TestStore {
    pub fn sqlite() -> TestStore {
        TestStore {
            dir: tempfile::tempdir().expect("tempdir"),
            database_url: None,
        }
    }

    /// The Postgres given by `DATABASE_URL` (scripts/test starts one); `None` when there is none.
    pub fn postgres() -> Option<TestStore> {
        let url = std::env::var("DATABASE_URL").ok()?;
        Some(TestStore {
            dir: tempfile::tempdir().expect("tempdir"),
            database_url: Some(url),
        })
    }

    /// Start a relay on this store with extra flags.
    pub async fn relay(&self, extra: &[&str]) -> Relay {
        let mut args: Vec<&str> = Vec::new();
        if let Some(url) = &self.database_url {
            args.extend(["--database-url", url.as_str()]);
        }
        args.extend(extra);
        Relay::start_in(self.dir.path(), &args).await
    }

    /// One number `sql` (with `$1` bound to `tenant`) answers on this store, read directly.
    pub async fn number(&self, sql: &str, tenant: &str) -> i64 {
        use sqlx::Connection;
        sqlx::any::install_default_drivers();
        let url = match &self.database_url {
            Some(url) => url.clone(),
            None => format!("sqlite://{}", self.dir.path().join("relay.sqlite").display()),
        };
        let mut db = sqlx::AnyConnection::connect(&url).await.expect("open the store");
        let value: Option<i64> = sqlx::query_scalar(sql)
            .bind(tenant)
            .fetch_one(&mut db)
            .await
            .expect("query");
        value.unwrap_or(0)
    }

    /// Run `ahp-relay compact` against this store.
    pub async fn compact(&self, retention: &str) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
        command
            .args(["compact", "--retention", retention])
            .arg("--data-dir")
            .arg(self.dir.path());
        if let Some(url) = &self.database_url {
            command.args(["--database-url", url]);
        }
        let status = command
            .env_remove("DATABASE_URL")
            .status()
            .await
            .expect("compact");
        assert!(status.success());
    }
}

/// A tenant name no other test uses (tests may share one Postgres).
pub fn unique_tenant() -> String {
    format!("t{}", uuid::Uuid::new_v4().simple())
}

/// Both stores: SQLite always, Postgres when `DATABASE_URL` is set.
#[macro_export]
macro_rules! on_both_stores {
    ($name:ident, $body:ident) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                $body(TestStore::sqlite()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                match TestStore::postgres() {
                    Some(store) => $body(store).await,
                    None => eprintln!("skipped: DATABASE_URL not set (scripts/test starts a Postgres)"),
                }
            }
        }
    };
}

/// Page every older turn of `state` in with `fetchTurns`, the way a client does: each page arrives as a
/// non-empty `chat/turnsLoaded` on the connection's own subscription, numbered after everything before it.
/// Returns how many pages it took.
pub async fn fetch_all_turns(
    client: &Client,
    sub: &mut SessionSubscription,
    chat: &str,
    state: &mut ChatState,
    from_seq: u64,
) -> usize {
    let mut last = from_seq;
    let mut pages = 0;
    while let Some(cursor) = state.turns_next_cursor.clone() {
        let _: serde_json::Value = client
            .request(
                "fetchTurns",
                serde_json::json!({"channel": chat, "cursor": cursor}),
            )
            .await
            .expect("fetchTurns");
        let loaded = next_envelope(sub).await;
        let StateAction::ChatTurnsLoaded(page) = &loaded.action else {
            panic!("expected chat/turnsLoaded, got {:?}", loaded.action);
        };
        assert!(!page.turns.is_empty(), "cursor {cursor} gave an empty page");
        assert!(loaded.server_seq > last, "pages arrive in serverSeq order");
        last = loaded.server_seq;
        ahp::reducers::apply_action_to_chat(state, &loaded.action);
        pages += 1;
    }
    pages
}

/// One action of every type a client may dispatch, each aimed at the channel it applies to: the root, the
/// session or the chat. `own_client` is the dispatching client's id (for `session/activeClientSet`). Each
/// parses as a known `StateAction` (checked), so a test that sends them exercises the relay's checks, not its
/// parser.
pub fn every_client_action(own_client: &str, session: &str, chat: &str) -> Vec<(String, StateAction)> {
    use serde_json::json;
    let message = json(&message("hello"));
    let root = "ahp-root://";
    let raw = vec![
        (
            root,
            json!({"type": "root/configChanged", "config": {"theme": "dark"}}),
        ),
        (
            session,
            json!({"type": "session/titleChanged", "title": "renamed"}),
        ),
        (session, json!({"type": "session/isReadChanged", "isRead": true})),
        (
            session,
            json!({"type": "session/isArchivedChanged", "isArchived": true}),
        ),
        (
            session,
            json!({"type": "session/activeClientSet", "activeClient": {"clientId": own_client, "tools": []}}),
        ),
        (
            session,
            json!({"type": "session/activeClientRemoved", "clientId": "someone"}),
        ),
        (
            session,
            json!({"type": "session/workingDirectorySet", "directory": "file:///tmp/extra"}),
        ),
        (
            session,
            json!({"type": "session/workingDirectoryRemoved", "directory": "file:///tmp/extra"}),
        ),
        (
            session,
            json!({"type": "session/workingDirectoryReplaced", "directory": "file:///tmp/a", "replacement": "file:///tmp/b"}),
        ),
        (
            session,
            json!({"type": "session/customizationToggled", "id": "c1", "enablement": ["session"]}),
        ),
        (
            session,
            json!({"type": "session/mcpServerStartRequested", "id": "m1"}),
        ),
        (
            session,
            json!({"type": "session/mcpServerStopRequested", "id": "m1"}),
        ),
        (
            session,
            json!({"type": "session/mcpServerBackgroundRequested", "id": "m1"}),
        ),
        (
            session,
            json!({"type": "session/configChanged", "config": {"mode": "fast"}}),
        ),
        (
            session,
            json!({"type": "session/defaultChatChanged", "defaultChat": chat}),
        ),
        (
            chat,
            json!({"type": "chat/turnStarted", "turnId": "intruder-turn", "startedAt": "2026-01-01T00:00:00Z", "message": message}),
        ),
        (
            chat,
            json!({"type": "chat/turnCancelled", "turnId": "t1", "duration": 0}),
        ),
        (chat, json!({"type": "chat/turnResume", "turnId": "t1"})),
        (chat, json!({"type": "chat/truncated"})),
        (
            chat,
            json!({"type": "chat/toolCallConfirmed", "turnId": "t1", "toolCallId": "tc1", "approved": true}),
        ),
        (
            chat,
            json!({"type": "chat/toolCallComplete", "turnId": "t1", "toolCallId": "tc1",
                "result": {"success": true, "pastTenseMessage": "done"}}),
        ),
        (
            chat,
            json!({"type": "chat/toolCallContentChanged", "turnId": "t1", "toolCallId": "tc1", "content": []}),
        ),
        (
            chat,
            json!({"type": "chat/toolCallResultConfirmed", "turnId": "t1", "toolCallId": "tc1", "approved": true}),
        ),
        (
            chat,
            json!({"type": "chat/pendingMessageSet", "kind": "queued", "id": "q1", "message": message}),
        ),
        (
            chat,
            json!({"type": "chat/pendingMessageRemoved", "kind": "queued", "id": "q1"}),
        ),
        (
            chat,
            json!({"type": "chat/queuedMessagesReordered", "order": ["q1"]}),
        ),
        (chat, json!({"type": "chat/draftChanged", "draft": message})),
        (
            chat,
            json!({"type": "chat/inputAnswerChanged", "requestId": "r1", "questionId": "q1"}),
        ),
        (
            chat,
            json!({"type": "chat/inputCompleted", "requestId": "r1", "response": "cancel"}),
        ),
        (
            chat,
            json!({"type": "chat/workingDirectorySet", "directory": "file:///tmp/extra"}),
        ),
        (
            chat,
            json!({"type": "chat/workingDirectoryRemoved", "directory": "file:///tmp/extra"}),
        ),
        (chat, json!({"type": "chat/isReadChanged", "isRead": true})),
        (
            chat,
            json!({"type": "chat/isArchivedChanged", "isArchived": true}),
        ),
    ];
    raw.into_iter()
        .map(|(channel, value)| {
            let action: StateAction =
                serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{value}: {e}"));
            assert!(
                !matches!(action, StateAction::Unknown(_)),
                "not a known action: {value}"
            );
            (channel.to_string(), action)
        })
        .collect()
}

/// An Ed25519 key pair for the gateways' identity assertions, made with `openssl` in `dir`: the paths of the
/// private key (mode 0600) and of the public key. `None` without openssl.
pub fn identity_keys(dir: &std::path::Path) -> Option<(String, String)> {
    let openssl = |args: &[&str]| {
        std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .ok()
            .filter(|out| out.status.success())
    };
    openssl(&["genpkey", "-algorithm", "ed25519", "-out", "identity.pem"])?;
    openssl(&[
        "pkey",
        "-in",
        "identity.pem",
        "-pubout",
        "-out",
        "identity.pub.pem",
    ])?;
    std::fs::set_permissions(
        dir.join("identity.pem"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .ok()?;
    let path = |name: &str| dir.join(name).display().to_string();
    Some((path("identity.pem"), path("identity.pub.pem")))
}

/// A workspace and an agents file naming the scripted test agent as `scripted`, in temporary directories
/// (dropped with this).
pub struct ScriptedAgents {
    pub workspace: tempfile::TempDir,
    pub config: tempfile::TempDir,
    pub file: std::path::PathBuf,
}

/// [`ScriptedAgents`]: `serve --agents <file>` (or a shard and runner) then has a workspace.
pub fn scripted_agents_file() -> ScriptedAgents {
    let workspace = tempfile::tempdir().expect("workspace");
    let config = tempfile::tempdir().expect("config");
    let file = config.path().join("agents.toml");
    std::fs::write(
        &file,
        format!(
            "workspace_root = {:?}\n\n[[agent]]\nid = \"scripted\"\ndisplay_name = \"Scripted\"\ncommand = {:?}\nenv = [\"PATH\"]\n",
            workspace.path().display().to_string(),
            env!("CARGO_BIN_EXE_ahp-relay-test-agent"),
        ),
    )
    .expect("write agents file");
    ScriptedAgents {
        workspace,
        config,
        file,
    }
}

/// Start `ahp-relay runner` for `shard` with the agents of `file`, and wait until the shard counts
/// `runners_after` runners.
pub async fn start_runner(shard: &Shard, file: &std::path::Path, runners_after: f64) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
    command
        .args([
            "runner",
            // A free port each: tests start runners side by side.
            "--http-listen",
            "127.0.0.1:0",
            "--name",
            "test-runner",
            "--shard",
            &shard.url,
            "--agents",
        ])
        .arg(file);
    let (child, _) = spawn_until(command, "runner serving").await;
    wait_for_runners(shard, runners_after).await;
    child
}

/// Wait until the shard has exactly `count` registered runners.
pub async fn wait_for_runners(shard: &Shard, count: f64) {
    let counted = tokio::time::timeout(PATIENCE, async {
        while shard.metric("ahp_relay_agent_runners").await != count {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(counted.is_ok(), "the shard never counted {count} runners");
}

/// Create session `name` of `provider` with `more` params (e.g. `workingDirectories`, `config`) and wait until
/// its agent made it ready: its URI and state, or why its creation failed.
pub async fn ready_session(
    client: &Client,
    provider: &str,
    name: &str,
    more: serde_json::Value,
) -> Result<(String, SessionState), ahp_types::state::ErrorInfo> {
    let session = format!("ahp-session:/{name}");
    let mut params = serde_json::json!({"channel": session, "provider": provider});
    if let (Some(params), Some(more)) = (params.as_object_mut(), more.as_object()) {
        params.extend(more.clone());
    }
    let _: serde_json::Value = client
        .request("createSession", params)
        .await
        .expect("createSession");
    let (result, mut sub) = client.subscribe(session.clone()).await.expect("subscribe");
    let mut state = session_of(&result.snapshot.expect("snapshot"));
    loop {
        match state.lifecycle {
            ahp_types::state::SessionLifecycle::Ready => break,
            ahp_types::state::SessionLifecycle::Failed => {
                return Err(state.creation_error.clone().expect("a creation error"))
            }
            _ => {}
        }
        let envelope = next_envelope(&mut sub).await;
        ahp::reducers::apply_action_to_session(&mut state, &envelope.action);
    }
    client.unsubscribe(session.clone()).await.expect("unsubscribe");
    Ok((session, state))
}

/// A new device's view of `chat`, a chat of large turns (1–2 MiB each) kept by bytes: its snapshot holds 1–5
/// of them within the reply budget (16 MiB), and the page of older turns `fetchTurns` brings is within it too.
pub async fn new_device_within_budgets(relay: &Relay, chat: &str) {
    const MIB: usize = 1024 * 1024;
    let (device, _) = relay.client("new-device").await;
    let (result, mut sub) = device.subscribe(chat.to_string()).await.expect("subscribe");
    let snapshot = result.snapshot.expect("snapshot");
    let size = serde_json::to_vec(&snapshot).expect("json").len();
    let SnapshotState::Chat(state) = &snapshot.state else {
        panic!("a chat");
    };
    assert!(size <= 16 * MIB, "a snapshot of {} MiB", size / MIB);
    assert!(
        (1..=5).contains(&state.turns.len()),
        "held {} large turns under the live chat's byte budget",
        state.turns.len()
    );
    let cursor = state
        .turns_next_cursor
        .clone()
        .expect("older turns behind a cursor");
    let _: serde_json::Value = device
        .request(
            "fetchTurns",
            serde_json::json!({"channel": chat, "cursor": cursor}),
        )
        .await
        .expect("fetchTurns");
    let page = next_envelope(&mut sub).await;
    let StateAction::ChatTurnsLoaded(loaded) = &page.action else {
        panic!("a page of turns: {:?}", page.action);
    };
    let size = serde_json::to_vec(&page).expect("json").len();
    assert!(
        !loaded.turns.is_empty() && size <= 16 * MIB,
        "a page of {} turns, {} bytes",
        loaded.turns.len(),
        size
    );
    device.shutdown().await;
}
