//! The agent sandbox, attacked from inside (issue 22): a scripted ACP agent that runs each prompt as a shell
//! command (`sh: …`, as coding agents run their shell tools) is hosted for tenants `a` and `b`, in `serve` and
//! in the runner shape, and tenant `a`'s agent tries to reach what it must not: the relay's data directory and
//! store, every secret file, the relay's and the runner's environment, tenant `b`'s workspace and home,
//! anything outside its own workspace, every process (`kill -9 -1`), the relay's ports, Postgres and Redis, the
//! machine's process table (a fork bomb), the relay's memory (`yes` for 10 s) and the disk (a 10 GiB file).
//! Each attempt must fail, and the relay, the runner and tenant `b`'s running turn must not notice.
//!
//! Every process an attack could reach runs in a PID namespace of the test's own
//! (`unshare --pid --fork --kill-child`): should the sandbox ever fail, `kill -9 -1` reaches only this test.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::commands::CreateSessionParams;
use ahp_types::state::{ResponsePart, SessionLifecycle};
use relay_core::Role;
use relay_gateway::auth::{mint_hs256, Claims};
use serde_json::Value;
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A canary in the environment of the relay's processes: no agent may ever print it.
const CANARY: &str = "AHP_SANDBOX_CANARY=canary-5c1e3f0a9b";

/// A secret file of tenant `b` (its agent credential): only b's agent may read it.
const B_KEY: &str = "b-agent-key-7d2e91c4";
/// A file of the operator's beside the agents file, readable by anyone: a mounted ConfigMap's or Secret's
/// neighbour the relay was never told about. The directory holding the agents file is hidden as a whole.
const NEIGHBOUR: &str = "operator-neighbour-5c1a";

/// A process group of the test's own, in a PID namespace of its own, killed with the test.
struct Contained {
    child: Child,
}

/// `ahp-relay ARGS` inside a fresh PID namespace (the relay is not its init: `kill -9 -1` from inside would
/// reach it), waiting until stdout lines contain every marker; returns the rest of each marker's line.
async fn contained(args: &[String], env: &[(&str, &str)], markers: &[&str]) -> (Contained, Vec<String>) {
    contained_as(None, args, env, markers).await
}

/// [`contained`], the relay running as `user` (uid, with its own gid) when one is given.
async fn contained_as(
    user: Option<u32>,
    args: &[String],
    env: &[(&str, &str)],
    markers: &[&str],
) -> (Contained, Vec<String>) {
    contained_with(user, None, args, env, markers).await
}

/// [`contained_as`], the relay's namespace reading `resolv_conf` as its `/etc/resolv.conf` when one is given.
async fn contained_with(
    user: Option<u32>,
    resolv_conf: Option<&Path>,
    args: &[String],
    env: &[(&str, &str)],
    markers: &[&str],
) -> (Contained, Vec<String>) {
    // The mount namespace is the PID namespace's own (`--mount-proc`), private: nothing is bound outside it.
    let resolver = resolv_conf
        .map(|file| format!("mount --bind '{}' /etc/resolv.conf || exit 9; ", file.display()))
        .unwrap_or_default();
    let mut command = Command::new("unshare");
    // As root a PID namespace needs no user namespace; otherwise map the test's user to root in one.
    if unsafe_geteuid() != 0 {
        command.args(["--user", "--map-root-user"]);
    }
    command
        .args([
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--",
            "sh",
            "-c",
        ])
        // sh stays the namespace's init (pid 1, which `kill -9 -1` never reaches); the relay is its child.
        .arg(format!("{resolver}\"$@\" & wait $!"))
        .arg("sh");
    if let Some(uid) = user {
        command.args([
            "setpriv",
            "--reuid",
            &uid.to_string(),
            "--regid",
            &uid.to_string(),
            "--clear-groups",
        ]);
    }
    command
        .arg(env!("CARGO_BIN_EXE_ahp-relay"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env(
            "AHP_SANDBOX_CANARY",
            CANARY.split_once('=').map(|(_, v)| v).unwrap_or(""),
        )
        .env(
            "RUST_LOG",
            std::env::var("AHP_TEST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("spawn unshare");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let found = tokio::time::timeout(PATIENCE, async {
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
        panic!("ahp-relay {args:?} exited before printing all of {markers:?}");
    })
    .await
    .expect("ahp-relay did not start in time");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (Contained { child }, found)
}

fn unsafe_geteuid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

impl Contained {
    /// Whether the contained process tree is still running (its `unshare` has not exited).
    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// A file holding `content`, mode 0600 (the relay refuses secret files others may read).
fn private_file(dir: &Path, name: &str, content: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, content).expect("write secret");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    path
}

fn readable_file(dir: &Path, name: &str, content: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, content).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    path
}

/// A `[sandbox]` table with a range of tenant users of this test's own: tenants of tests running side by side
/// (the same names in other relays) must not share users, whose processes the kernel counts together.
fn own_users() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let first = 1_000_000 + (std::process::id() % 1000) * 20_000 + n * 1000;
    format!("[sandbox]\nfirst_uid = {first}\nuid_count = 1000\n")
}

/// The agents file: the scripted agent, with tenant b's own credential in a secret file, and limits small
/// enough to cross quickly (64 MiB files, 1 MiB of output per turn, 256 processes per tenant); workspaces are
/// measured, and disposed sessions' directories swept after a retention, every second. `system_paths`
/// are given to agents to read, as an operator might by mistake: the relay's secrets inside must stay hidden.
fn agents_file(config: &Path, workspace: &Path, b_key: &Path, system_paths: &[&Path]) -> PathBuf {
    let file = config.join("agents.toml");
    let system_paths: Vec<String> = system_paths.iter().map(|p| p.display().to_string()).collect();
    let text = format!(
        r#"workspace_root = {workspace:?}

{users}system_paths = {system_paths:?}
[quotas]
processes_per_tenant = 256
output_bytes_per_second = 524288
output_bytes_per_turn = 1048576
workspace_bytes_per_tenant = 1073741824
workspace_check_seconds = 1
workspace_retention_seconds = 1

[[agent]]
id = "shell"
display_name = "Shell"
command = {agent:?}
env = ["PATH"]
limits = {{ file_size_bytes = 67108864 }}
[agent.tenants.b]
env_files = {{ B_AGENT_KEY = {b_key:?} }}
"#,
        workspace = workspace.display().to_string(),
        agent = env!("CARGO_BIN_EXE_ahp-relay-test-agent"),
        b_key = b_key.display().to_string(),
        users = own_users(),
    );
    std::fs::write(&file, text).expect("write agents file");
    file
}

/// A connected, initialized client of `tenant` at `addr`, with a token signed by `secret`.
async fn client(addr: &str, secret: &[u8], tenant: &str) -> ahp::Client {
    let token = mint_hs256(
        secret,
        &Claims::new(
            tenant,
            &format!("{tenant}-user"),
            Role::Member,
            None,
            Duration::from_secs(3600),
        ),
    )
    .expect("mint");
    let url = format!("ws://{addr}/v1/ws?access_token={token}");
    let transport = ahp_ws::WebSocketTransport::connect(&url).await.expect("connect");
    let client = ahp::Client::connect(
        transport,
        ahp::ClientConfig {
            default_request_timeout: Some(Duration::from_secs(60)),
            subscription_buffer: 65_536,
        },
    )
    .await
    .expect("client");
    client
        .initialize(format!("{tenant}-device"), vec!["1.0.0".into()], vec![])
        .await
        .expect("initialize");
    client
}

/// Create a session on the shell agent and one chat in it, once the agent made the session ready.
async fn shell_session(client: &ahp::Client, name: &str) -> String {
    match try_shell_session(client, name).await {
        Ok(chat) => chat,
        Err(failed) => panic!("the session failed: {failed}"),
    }
}

/// [`shell_session`], or why the session failed.
async fn try_shell_session(client: &ahp::Client, name: &str) -> Result<String, String> {
    let session = format!("ahp-session:/{name}");
    let chat = format!("ahp-chat:/{name}");
    let _: Value = client
        .request(
            "createSession",
            CreateSessionParams {
                channel: session.clone(),
                meta: None,
                provider: Some("shell".into()),
                working_directories: None,
                config: None,
                active_client: None,
                progress_token: None,
            },
        )
        .await
        .expect("createSession");
    let (result, mut sub) = client.subscribe(session.clone()).await.expect("subscribe");
    let mut state = session_of(&result.snapshot.expect("snapshot"));
    while state.lifecycle != SessionLifecycle::Ready {
        if state.lifecycle == SessionLifecycle::Failed {
            return Err(format!("{:?}", state.creation_error));
        }
        let envelope = next_envelope(&mut sub).await;
        ahp::reducers::apply_action_to_session(&mut state, &envelope.action);
    }
    client.unsubscribe(session.clone()).await.expect("unsubscribe");
    // Its default chat, named after the session.
    Ok(chat)
}

fn is_turn_end(envelope: &ActionEnvelope) -> bool {
    matches!(
        envelope.action,
        StateAction::ChatTurnComplete(_) | StateAction::ChatTurnCancelled(_) | StateAction::ChatError(_)
    )
}

/// How a turn ended and everything it showed (markdown, notes, errors), as one text.
struct Reply {
    text: String,
}

/// Run one prompt on `chat` and return what the turn showed once it ended (within `patience`, else a reply
/// saying it did not end).
async fn run(client: &ahp::Client, chat: &str, turn: &str, prompt: &str, patience: Duration) -> Reply {
    let failed = |what: String| Reply {
        text: format!("[{what}]"),
    };
    let (result, mut sub) = match client.subscribe(chat.into()).await {
        Ok(subscribed) => subscribed,
        Err(error) => return failed(format!("subscribe failed: {error}")),
    };
    let Some(snapshot) = result.snapshot else {
        return failed("no snapshot".into());
    };
    let (state, from) = (chat_of(&snapshot), snapshot.from_seq as u64);
    if let Err(error) = client.dispatch(chat.into(), turn_started(turn, prompt)).await {
        return failed(format!("dispatch failed: {error}"));
    }
    let seen = tokio::time::timeout(patience, async {
        let mut seen = Vec::new();
        loop {
            match sub.recv().await {
                Some(ahp::SubscriptionEvent::Action(envelope)) => {
                    // The turn itself refused (e.g. over a quota): it never starts.
                    let refused = envelope.rejection_reason.is_some()
                        && matches!(&envelope.action, StateAction::ChatTurnStarted(started) if started.turn_id == turn);
                    let end = is_turn_end(&envelope) || refused;
                    seen.push(envelope);
                    if end {
                        return seen;
                    }
                }
                Some(_) => {}
                None => return seen,
            }
        }
    })
    .await;
    let Ok(seen) = seen else {
        return Reply {
            text: format!("[the turn did not end within {patience:?}]"),
        };
    };
    if let Some(reason) = seen.last().and_then(|e| e.rejection_reason.clone()) {
        let _ = client.unsubscribe(chat.into()).await;
        return Reply {
            text: format!("[the turn was refused: {reason}]"),
        };
    }
    let _ = client.unsubscribe(chat.into()).await;
    let state = reduce_chat(state, from, &seen);
    let Some(turn) = state.turns.iter().find(|t| t.id == turn) else {
        return Reply {
            text: format!(
                "[turn {turn} is not in the chat; last envelope: {:?}]",
                seen.last()
            ),
        };
    };
    let mut text = String::new();
    for part in &turn.response_parts {
        match part {
            ResponsePart::Markdown(m) => text.push_str(&m.content),
            other => text.push_str(&serde_json::to_string(other).unwrap_or_default()),
        }
    }
    Reply { text }
}

/// The shell command's output and exit line, for prompts that must run.
async fn sh(client: &ahp::Client, chat: &str, turn: &str, command: &str) -> String {
    run(client, chat, turn, &format!("sh: {command}"), PATIENCE)
        .await
        .text
}

/// A tenant at work: a session, its workspace and home (as its agent reports them), and a secret it wrote
/// there. Tenant b (whom a attacks), and a's own second session (which a's attacks must not reach either).
struct AtWork {
    client: ahp::Client,
    chat: String,
    workspace: String,
    home: String,
    marker: String,
}

async fn tenant_at_work(addr: &str, secret: &[u8], workspace_root: &Path, tenant: &str) -> AtWork {
    let client = client(addr, secret, tenant).await;
    let chat = shell_session(&client, &format!("{tenant}-work")).await;
    let marker = format!("{tenant}-marker-{}", uuid_like());
    let said = sh(
        &client,
        &chat,
        "setup",
        &format!(
            "echo {marker} > marker.txt && if [ -n \"$HOME\" ]; then echo {marker} > \"$HOME/marker.txt\"; fi; \
             echo \"WS=$(pwd)\"; echo \"HOME=${{HOME:-/nonexistent-home}}\""
        ),
    )
    .await;
    let field = |name: &str| {
        said.lines()
            .find_map(|line| line.strip_prefix(name))
            .unwrap_or_else(|| panic!("{tenant}'s agent did not report {name}: {said}"))
            .to_string()
    };
    let workspace = field("WS=");
    // Its home as the agent sees it is the sandbox's own (/home/agent); outside, it is the session's private
    // directory, which is what another tenant would go for.
    let home = match field("HOME=").as_str() {
        "/home/agent" => {
            let outside = workspace_root.join(format!(".sandbox/{tenant}/default/{tenant}-work/home"));
            let kept = std::fs::read_to_string(outside.join("marker.txt")).unwrap_or_default();
            assert!(
                kept.contains(&marker),
                "{tenant}'s home is not where the attack looks: {}",
                outside.display()
            );
            outside.display().to_string()
        }
        other => other.to_string(),
    };
    AtWork {
        workspace,
        home,
        client,
        chat,
        marker,
    }
}

fn uuid_like() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}

/// Ports on loopback the agent must not reach: the relay's own, Postgres' and Redis' (when this run has them),
/// and one of the test's (a stand-in for any local service).
fn ports_from_env() -> Vec<u16> {
    ["DATABASE_URL", "REDIS_URL"]
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .filter_map(|url| {
            let after_host = url.rsplit('@').next()?.to_string();
            let port = after_host
                .split(['/', '?'])
                .next()?
                .rsplit(':')
                .next()?
                .to_string();
            port.parse().ok()
        })
        .collect()
}

/// `bash` tries a TCP connection to each port on 127.0.0.1 and says OPEN or CLOSED.
fn connect_command(ports: &[u16]) -> String {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    format!(
        "bash -c 'for p in {}; do if (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo OPEN $p; else echo CLOSED $p; fi; done'",
        ports.join(" ")
    )
}

/// What every shape's attacker does, and what must hold after each attempt.
struct Attack<'a> {
    a: &'a ahp::Client,
    chat: &'a str,
    b: &'a AtWork,
    turn: usize,
    /// Every attempt that succeeded (each check records its failure and the suite goes on, so one run shows
    /// every hole).
    failures: Vec<String>,
}

/// Record a failed check instead of stopping at the first one.
macro_rules! check {
    ($attack:expr, $ok:expr, $($message:tt)+) => {
        if !$ok {
            let message = format!($($message)+);
            eprintln!("ESCAPE: {message}");
            $attack.failures.push(message);
        }
    };
}

/// The last `n` characters of a long output, for messages.
fn tail(text: &str, n: usize) -> &str {
    let mut cut = text.len().saturating_sub(n);
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    &text[cut..]
}

impl<'a> Attack<'a> {
    /// Run a shell command as A's agent and return what it printed; a command that did not run to its end
    /// is recorded (an attempt must fail by being refused, not by hanging or crashing the relay).
    async fn sh(&mut self, command: &str) -> String {
        self.sh_within(command, PATIENCE).await
    }

    async fn sh_within(&mut self, command: &str, patience: Duration) -> String {
        let said = self.run(&format!("sh: {command}"), patience).await.text;
        check!(
            self,
            said.contains("\nEXIT "),
            "{command:?} did not run to its end: {}",
            tail(&said, 300)
        );
        said
    }

    fn new(a: &'a ahp::Client, chat: &'a str, b: &'a AtWork) -> Self {
        Attack {
            a,
            chat,
            b,
            turn: 0,
            failures: Vec::new(),
        }
    }

    /// Every check passed.
    fn assert_contained(&self) {
        assert!(
            self.failures.is_empty(),
            "{} escapes:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }

    async fn run(&mut self, prompt: &str, patience: Duration) -> Reply {
        self.turn += 1;
        run(
            self.a,
            self.chat,
            &format!("attack-{}", self.turn),
            prompt,
            patience,
        )
        .await
    }

    /// Reading each of `files` shows none of `secrets`.
    async fn cannot_read(&mut self, files: &[&Path], secrets: &[&str]) {
        for file in files {
            let said = self.sh(&format!("cat '{}' 2>&1; echo", file.display())).await;
            for secret in secrets {
                check!(
                    self,
                    !said.contains(secret),
                    "the agent read {}: {}",
                    file.display(),
                    tail(&said, 300)
                );
            }
        }
    }

    /// Tenant b's workspace and home are out of reach: neither listed nor read, nor written.
    async fn cannot_reach_b(&mut self) {
        let b = self.b;
        let said = self
            .sh(&format!(
                "cat '{ws}/marker.txt' '{home}/marker.txt' 2>&1; ls -la '{ws}' '{home}' 2>&1; \
                 echo intruder > '{ws}/intruder.txt' 2>&1; echo",
                ws = b.workspace,
                home = b.home
            ))
            .await;
        check!(self, !said.contains(&b.marker), "a read b's files: {said}");
        check!(
            self,
            !said
                .lines()
                .any(|line| line.contains("marker.txt") && line.starts_with('-')),
            "a listed b's directories: {said}"
        );
        check!(
            self,
            !Path::new(&b.workspace).join("intruder.txt").exists(),
            "a wrote into b's workspace: {said}"
        );
    }

    /// No visible process holds the canary, and the relay's processes are not among the visible ones (nor
    /// their paths: the sandbox's own init shows nothing of the relay's layout).
    async fn cannot_see_outside(&mut self, programs: &[&str]) {
        let canary = CANARY.split_once('=').map(|(_, v)| v).unwrap_or(CANARY);
        let said = self
            .sh(
                "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep CANARY; \
                 for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done",
            )
            .await;
        check!(
            self,
            !said.contains(canary),
            "a read another process's environment: {}",
            tail(&said, 300)
        );
        for program in programs {
            check!(
                self,
                !said.contains(program),
                "a sees the relay's process {program}: {}",
                tail(&said, 600)
            );
        }
    }

    /// Nothing is written outside the workspace: not in the workspace root, the data dir, nor the real /tmp.
    async fn cannot_write_outside(&mut self, places: &[PathBuf]) {
        let mut command = String::new();
        for place in places {
            command.push_str(&format!("echo pwned > '{}' 2>&1; ", place.display()));
        }
        command.push_str("echo");
        let said = self.sh(&command).await;
        for place in places {
            check!(self, !place.exists(), "a wrote {}: {said}", place.display());
            let _ = std::fs::remove_file(place);
        }
    }

    async fn cannot_connect(&mut self, ports: &[u16]) {
        let said = self.sh(&connect_command(ports)).await;
        for port in ports {
            check!(
                self,
                said.contains(&format!("CLOSED {port}")),
                "a connected to port {port}: {said}"
            );
        }
    }

    /// Issue 32 (acceptance 2): under the default egress (TCP 443), no listening socket, no UDP to this
    /// machine's loopback (`udp`, a socket of the test), no TCP to `127.0.0.1:443` (`https`, a listener of the
    /// test standing for a TLS proxy in front of the relay), and no `AF_VSOCK`, netlink sock_diag, `AF_PACKET` or
    /// `AF_ALG` socket. Each datagram or connection would have arrived before the turn ended (loopback delivers
    /// at once), so nothing pending on the test's sockets afterwards means nothing got through.
    async fn network_edges_are_closed(&mut self, udp: &std::net::UdpSocket, https: &std::net::TcpListener) {
        let udp_port = udp.local_addr().expect("udp").port();
        let https_port = https.local_addr().expect("https").port();
        let script = format!(
            "import socket, errno\n\
             def attempt(name, f):\n\
             \x20   try:\n\
             \x20       f(); print(name, 'OPEN')\n\
             \x20   except OSError as e:\n\
             \x20       print(name, 'REFUSED', errno.errorcode.get(e.errno, e.errno))\n\
             def listen():\n\
             \x20   s = socket.socket(); s.bind(('0.0.0.0', 18081)); s.listen()\n\
             def udp():\n\
             \x20   s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'escaped', ('127.0.0.1', {udp_port}))\n\
             def https():\n\
             \x20   socket.create_connection(('127.0.0.1', {https_port}), timeout=3)\n\
             attempt('listen', listen)\n\
             attempt('udp', udp)\n\
             attempt('https', https)\n\
             attempt('vsock', lambda: socket.socket(40, socket.SOCK_STREAM))\n\
             attempt('sockdiag', lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4))\n\
             attempt('packet', lambda: socket.socket(17, socket.SOCK_RAW, 0))\n\
             attempt('alg', lambda: socket.socket(38, socket.SOCK_SEQPACKET, 0))\n\
             attempt('route', lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 0))\n"
        );
        let said = self
            .sh(&format!(
                "cat > edges.py <<'PYTHON'\n{script}PYTHON\n/usr/bin/python3 edges.py 2>&1"
            ))
            .await;
        for name in ["listen", "vsock", "sockdiag", "packet", "alg"] {
            check!(
                self,
                said.contains(&format!("{name} REFUSED")),
                "{name} was not refused: {said}"
            );
        }
        check!(
            self,
            said.contains("route OPEN"),
            "netlink's routing protocol (the resolver's) must stay open: {said}"
        );
        udp.set_nonblocking(true).expect("nonblocking");
        let mut buffer = [0_u8; 64];
        check!(
            self,
            udp.recv_from(&mut buffer).is_err(),
            "a datagram reached this machine's loopback: {said}"
        );
        https.set_nonblocking(true).expect("nonblocking");
        check!(
            self,
            https.accept().is_err(),
            "a connection reached 127.0.0.1:{https_port}: {said}"
        );
    }

    /// A (bounded, 8,190-process) fork bomb: forks fail at the tenant's process limit. The bomb runs in a
    /// subshell (a shell exits when it cannot fork); what it reported is read back with builtins only (the
    /// limit may still be reached while its processes sleep).
    async fn fork_bomb_is_contained(&mut self) {
        let said = self
            .sh("b(){ if [ $1 -gt 0 ]; then b $(($1-1)) & b $(($1-1)) & wait; else sleep 3; fi; }; \
                 (b 12) 2>bomb.err; echo bomb-done; \
                 while read -r line; do case $line in *fork*|*emporarily*) echo FORK-REFUSED; break;; esac; done < bomb.err")
            .await;
        check!(
            self,
            said.contains("bomb-done"),
            "the fork bomb's shell did not finish: {said}"
        );
        check!(
            self,
            said.contains("FORK-REFUSED"),
            "the fork bomb was not limited: {said}"
        );
    }

    /// `yes` for 10 s: its output is cut with a visible note long before it ends, and the turn ends.
    async fn output_flood_is_cut(&mut self) {
        let reply = self.run("sh: timeout 10 yes", Duration::from_secs(60)).await;
        check!(
            self,
            reply.text.contains("output limit"),
            "the flood was not cut ({} bytes shown): {}",
            reply.text.len(),
            tail(&reply.text, 300)
        );
        check!(
            self,
            reply.text.len() < 16 * 1024 * 1024,
            "the flood kept {} bytes",
            reply.text.len()
        );
    }

    /// A 10 GiB file (sparse and written): refused at the per-file limit.
    async fn big_file_is_refused(&mut self, workspace_of_a: &Path) {
        let said = self
            .sh_within(
                "truncate -s 10G sparse.bin 2>&1; echo truncate=$?; \
                 head -c 10737418240 /dev/zero > big.bin; echo head=$?; \
                 stat -c '%n %s' big.bin sparse.bin 2>&1; rm -f big.bin sparse.bin",
                Duration::from_secs(180),
            )
            .await;
        check!(
            self,
            said.contains("truncate=") && !said.contains("truncate=0"),
            "a 10 GiB sparse file was made: {said}"
        );
        check!(
            self,
            said.contains("head=") && !said.contains("head=0"),
            "a 10 GiB file was written: {said}"
        );
        for name in ["big.bin", "sparse.bin"] {
            let _ = std::fs::remove_file(workspace_of_a.join(name));
        }
    }
}

impl Attack<'_> {
    /// The tenant's process limit spans all its sandboxes: with 200 processes held in its other session
    /// (`sibling`), 100 more in this one are refused (each sandbox alone would allow 256).
    async fn process_limit_spans_the_tenants_sandboxes(&mut self, sibling: &AtWork) {
        let held = sh(
            &sibling.client,
            &sibling.chat,
            "hold",
            "rm -f held.pids; i=0; while [ $i -lt 200 ]; do sleep 600 >/dev/null 2>&1 & echo $! >> held.pids; \
             i=$((i+1)); done; echo HELD $(wc -l < held.pids)",
        )
        .await;
        check!(
            self,
            held.contains("HELD 200"),
            "the sibling session could not hold 200 processes: {held}"
        );
        let said = self
            .sh("(i=0; while [ $i -lt 100 ]; do sleep 5 & i=$((i+1)); done; wait) 2>more.err; echo more-done; \
                 while read -r line; do case $line in *fork*|*emporarily*) echo FORK-REFUSED; break;; esac; done < more.err")
            .await;
        check!(
            self,
            said.contains("more-done") && said.contains("FORK-REFUSED"),
            "the tenant's processes in two sandboxes were not counted together: {said}"
        );
        let released = sh(
            &sibling.client,
            &sibling.chat,
            "release",
            "kill $(cat held.pids); echo RELEASED",
        )
        .await;
        check!(
            self,
            released.contains("RELEASED"),
            "the held processes were not released: {released}"
        );
    }

    /// A library the agent built, named in a terminal's `LD_PRELOAD`, loads only into the command, inside the
    /// sandbox: never into bubblewrap or the relay's helper, which run before (and outside) the confinement.
    /// Its constructor writes a file into `/tmp`: the sandbox's own, not the host's.
    async fn preloaded_library_stays_inside(&mut self, workspace_of_a: &Path) {
        let marker = PathBuf::from(format!("/tmp/ahp-preload-escaped-{}", uuid_like()));
        let built = self
            .sh(&format!(
                "printf '%s\\n' '#include <stdio.h>' \
                 '__attribute__((constructor)) static void pwn(void) {{ FILE *f = fopen(\"{}\", \"a\"); if (f) {{ fputs(\"pwned\\n\", f); fclose(f); }} }}' \
                 > preload.c && cc -shared -fPIC -o preload.so preload.c 2>&1 && echo BUILT",
                marker.display()
            ))
            .await;
        check!(
            self,
            built.contains("BUILT"),
            "the attack library was not built: {built}"
        );
        let library = workspace_of_a.join("preload.so");
        let said = self
            .run(
                &format!(
                    "term-env LD_PRELOAD {}: cat {} 2>&1; echo preloaded",
                    library.display(),
                    marker.display()
                ),
                PATIENCE,
            )
            .await
            .text;
        check!(
            self,
            said.contains("pwned") && said.contains("preloaded"),
            "the command did not run with its library (the attack proves nothing): {}",
            tail(&said, 300)
        );
        check!(
            self,
            !marker.exists(),
            "a library preloaded by a terminal ran outside the sandbox: {} exists",
            marker.display()
        );
        let _ = std::fs::remove_file(&marker);
    }

    /// TCP without `connect(2)`, which Landlock's port rules watch: an MPTCP socket, and TCP Fast Open's
    /// `sendto(MSG_FASTOPEN)`, to a local service. Both refused.
    async fn tcp_without_connect_is_refused(&mut self, port: u16) {
        const SCRIPT: &str = r#"
import socket, sys
port = int(sys.argv[1])
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
    s.settimeout(3)
    s.connect(('127.0.0.1', port))
    print('MPTCP-CONNECTED')
except OSError as e:
    print('MPTCP-REFUSED', e.errno)
try:
    # Blocking: the call returns once the connection is made (with a timeout it would say EINPROGRESS).
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.sendto(b'x', socket.MSG_FASTOPEN, ('127.0.0.1', port))
    print('TFO-SENT')
except OSError as e:
    print('TFO-REFUSED', e.errno)
"#;
        let said = self
            .sh(&format!("python3 - {port} 2>&1 <<'PY'\n{SCRIPT}\nPY"))
            .await;
        check!(
            self,
            said.contains("MPTCP-REFUSED") && said.contains("TFO-REFUSED"),
            "TCP without connect(2) reached port {port}: {said}"
        );
    }
}

/// A's workspace, as its agent reports it.
async fn workspace_of(client: &ahp::Client, chat: &str) -> PathBuf {
    let said = sh(client, chat, "whereami", "pwd").await;
    PathBuf::from(said.lines().next().unwrap_or_default().trim())
}

/// `b` starts a turn that runs until a file `go` appears in its workspace; returns once it streams (it must
/// go on, untouched, while A attacks).
async fn starts_a_long_turn(b: &AtWork) -> ahp::SessionSubscription {
    let (_, _, mut sub) = subscribe_chat(&b.client, &b.chat).await;
    b.client
        .dispatch(
            b.chat.clone(),
            turn_started(
                "long",
                "sh: echo b-waiting; while [ ! -e go ]; do sleep 0.05; done; echo b-released",
            ),
        )
        .await
        .expect("dispatch");
    collect_until(&mut sub, |e| {
        matches!(
            e.action,
            StateAction::ChatResponsePart(_) | StateAction::ChatDelta(_)
        )
    })
    .await;
    sub
}

/// Release `b`'s long turn; it must complete as if nothing happened.
async fn long_turn_completes(b: &AtWork, mut sub: ahp::SessionSubscription) {
    std::fs::write(Path::new(&b.workspace).join("go"), "").expect("release the long turn");
    let seen = tokio::time::timeout(PATIENCE, collect_until(&mut sub, is_turn_end))
        .await
        .unwrap_or_else(|_| panic!("the long turn in {} did not end", b.workspace));
    assert!(
        matches!(
            seen.last().map(|e| &e.action),
            Some(StateAction::ChatTurnComplete(_))
        ),
        "the long turn in {} did not complete: {:?}",
        b.workspace,
        seen.last()
    );
    let said: String = seen
        .iter()
        .filter_map(|e| match &e.action {
            StateAction::ChatDelta(delta) => Some(delta.content.clone()),
            StateAction::ChatResponsePart(part) => match &part.part {
                ResponsePart::Markdown(m) => Some(m.content.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert!(said.contains("b-released") && said.contains("EXIT 0"), "{said}");
}

/// A listener of the test's own on loopback (a stand-in for any local service an agent must not reach).
async fn local_service() -> (tokio::net::TcpListener, u16) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    (listener, port)
}

/// Whether the process at `addr` still answers `/healthz`.
async fn serving(addr: &str) -> bool {
    matches!(http_get(addr, "/healthz").await, Ok((200, _)))
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_serve_an_agent_reaches_nothing_of_the_relay_nor_of_another_tenant() {
    let data = tempfile::tempdir().expect("data");
    let workspace = tempfile::tempdir().expect("workspace");
    let config = tempfile::tempdir().expect("config");
    let b_key = private_file(config.path(), "b-agent-key", B_KEY);
    let agents = agents_file(
        config.path(),
        workspace.path(),
        &b_key,
        &[config.path(), data.path()],
    );
    let neighbour = readable_file(config.path(), "neighbour.txt", NEIGHBOUR);
    let args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &data.path().display().to_string(),
        "--agents",
        &agents.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (mut relay, found) = contained(&args, &[], &["listening on ws://"]).await;
    let addr = found[0].trim_end_matches("/v1/ws").to_string();
    // The relay generated its signing secret into its data dir: the key to every tenant.
    let jwt_secret = std::fs::read_to_string(data.path().join("jwt-secret")).expect("jwt-secret");
    let secret = jwt_secret.trim().as_bytes().to_vec();

    let b = tenant_at_work(&addr, &secret, workspace.path(), "b").await;
    let sibling = tenant_at_work(&addr, &secret, workspace.path(), "a").await;
    // B's prompt is in the store (the SQLite file and its WAL).
    let b_prompt = format!("B-PROMPT-{}", uuid_like());
    sh(&b.client, &b.chat, "b-prompt", &format!("echo ok # {b_prompt}")).await;
    let a = client(&addr, &secret, "a").await;
    let chat = shell_session(&a, "a-attack").await;
    let a_workspace = workspace_of(&a, &chat).await;
    let b_turn = starts_a_long_turn(&b).await;
    let mut attack = Attack::new(&a, &chat, &b);

    attack
        .cannot_read(
            &[&data.path().join("jwt-secret"), &b_key, &agents, &neighbour],
            &[jwt_secret.trim(), B_KEY, "B_AGENT_KEY", NEIGHBOUR],
        )
        .await;
    let store = attack
        .sh(&format!(
            "ls -la '{d}' 2>&1; cat '{d}'/relay.sqlite* 2>&1 | grep -a -o 'B-PROMPT-[0-9a-f]*' | head -3",
            d = data.path().display()
        ))
        .await;
    check!(
        attack,
        !store.contains(&b_prompt),
        "a read b's prompt from the store: {store}"
    );
    check!(
        attack,
        !store.contains("relay.sqlite"),
        "a listed the data dir: {store}"
    );
    let env = attack.sh("env").await;
    check!(
        attack,
        !env.contains("CANARY") && !env.contains("B_AGENT_KEY"),
        "a's environment: {env}"
    );
    attack
        .cannot_see_outside(&["ahp-relay serve", "\"$@\" & wait"])
        .await;
    attack.cannot_reach_b().await;
    let tmp_marker = PathBuf::from(format!("/tmp/ahp-sandbox-escaped-{}", uuid_like()));
    attack
        .cannot_write_outside(&[
            workspace.path().join("escaped.txt"),
            data.path().join("escaped.txt"),
            tmp_marker,
        ])
        .await;
    let (_service, service_port) = local_service().await;
    let mut ports = vec![port_of(&addr), service_port];
    ports.extend(ports_from_env());
    attack.cannot_connect(&ports).await;
    attack.tcp_without_connect_is_refused(service_port).await;
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    let https = std::net::TcpListener::bind("127.0.0.1:443").expect("a stand-in TLS proxy on 127.0.0.1:443");
    attack.network_edges_are_closed(&udp, &https).await;
    attack.fork_bomb_is_contained().await;
    attack.process_limit_spans_the_tenants_sandboxes(&sibling).await;
    attack.big_file_is_refused(&a_workspace).await;
    attack.preloaded_library_stays_inside(&a_workspace).await;
    // kill -9 -1 reaches only the agent itself: the relay serves on, and b's turn and a's other session's go on.
    let sibling_turn = starts_a_long_turn(&sibling).await;
    let killed = attack.run("sh: kill -9 -1; echo survived", PATIENCE).await;
    check!(
        attack,
        !killed.text.contains("survived"),
        "kill -9 -1 did not reach the agent itself: {}",
        killed.text
    );
    check!(
        attack,
        serving(&addr).await && relay.alive(),
        "kill -9 -1 killed the relay"
    );
    attack.output_flood_is_cut().await;
    check!(
        attack,
        serving(&addr).await && relay.alive(),
        "the flood killed the relay"
    );
    attack.assert_contained();
    a.ping().await.expect("the relay answers");
    long_turn_completes(&b, b_turn).await;
    long_turn_completes(&sibling, sibling_turn).await;
    // And a new session of b still starts (its agent is placed and answers).
    let chat_b2 = shell_session(&b.client, "b-after").await;
    assert!(sh(&b.client, &chat_b2, "b-after", "echo fine")
        .await
        .contains("fine"));
    assert!(relay.alive(), "the relay died");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_runner_an_agent_reaches_nothing_of_the_runner_the_shard_nor_another_tenant() {
    runner_shape(None).await;
}

/// The runner of a deployment that gives it no root (the chart's and compose's): bubblewrap then makes a user
/// namespace per sandbox, and the same attacks fail. The test runs the runner as `nobody` when it is root
/// itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_an_unprivileged_runner_an_agent_reaches_nothing_either() {
    if unsafe_geteuid() != 0 {
        // Not root: the runner of the other test already is unprivileged.
        return runner_shape(None).await;
    }
    runner_shape(Some(65_534)).await;
}

/// Every attack, against a shard, a gateway and a runner (running as `runner_user` when given).
async fn runner_shape(runner_user: Option<u32>) {
    // Every directory of the test in one, which the relay-as-deputy attack at the end links to.
    let top_dir = tempfile::tempdir().expect("top");
    let top = top_dir.path().canonicalize().expect("real");
    std::fs::set_permissions(&top, std::os::unix::fs::PermissionsExt::from_mode(0o711)).expect("chmod");
    let made = |name: &str| {
        let dir = top.join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        Made(dir)
    };
    let config = made("config");
    let workspace = made("ws");
    let shard_data = made("sharddata");
    let gateway_data = made("gatewaydata");
    let runner_data = made("runnerdata");
    let etc = made("etc");
    std::fs::write(etc.path().join("passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("etc stand-in");
    let internal = private_file(config.path(), "internal-secret", INTERNAL_SECRET);
    let runner_secret = private_file(config.path(), "runner-secret", RUNNER_SECRET);
    let jwt = private_file(config.path(), "jwt-secret", SECRET);
    let b_key = private_file(config.path(), "b-agent-key", B_KEY);
    let agents = agents_file(
        config.path(),
        workspace.path(),
        &b_key,
        &[config.path(), runner_data.path()],
    );
    let neighbour = readable_file(config.path(), "neighbour.txt", NEIGHBOUR);
    let s = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    if let Some(uid) = runner_user {
        // What the runner reads and writes is its own: its secret, the agents' credentials, the workspace.
        for path in [
            config.path(),
            &runner_secret,
            &b_key,
            &agents,
            workspace.path(),
            runner_data.path(),
        ] {
            std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown");
        }
    }

    let (shard, found) = contained(
        &s(&[
            "shard",
            "--insecure-internal-link",
            "--grpc-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--data-dir",
            &shard_data.path().display().to_string(),
            "--agents",
            &agents.display().to_string(),
            "--internal-secret-file",
            &internal.display().to_string(),
            "--runner-secret-file",
            &runner_secret.display().to_string(),
        ]),
        &[],
        &["listening on grpc ", "http listening on "],
    )
    .await;
    let shard_url = found[0].clone();
    let shard_http = found[1].trim_start_matches("http://").to_string();
    let (gateway, found) = contained(
        &s(&[
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--shard",
            &shard_url,
            "--data-dir",
            &gateway_data.path().display().to_string(),
            "--internal-secret-file",
            &internal.display().to_string(),
            "--jwt-secret-file",
            &jwt.display().to_string(),
        ]),
        &[],
        &["listening on ws://"],
    )
    .await;
    let addr = found[0].trim_end_matches("/v1/ws").to_string();
    let (mut runner, found) = contained_as(
        runner_user,
        &s(&[
            "runner",
            "--http-listen",
            "127.0.0.1:0",
            "--shard",
            &shard_url,
            "--agents",
            &agents.display().to_string(),
            "--runner-secret-file",
            &runner_secret.display().to_string(),
        ]),
        &[("AHP_RELAY_DATA_DIR", &runner_data.path().display().to_string())],
        &["runner http listening on http://", "runner serving"],
    )
    .await;
    let runner_http = found[0].clone();
    let runners = || async { metric_at(&shard_http, "ahp_relay_agent_runners").await };
    tokio::time::timeout(PATIENCE, async {
        while runners().await != 1.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the runner registered");

    let secret = SECRET.as_bytes();
    let b = tenant_at_work(&addr, secret, workspace.path(), "b").await;
    let sibling = tenant_at_work(&addr, secret, workspace.path(), "a").await;
    let a = client(&addr, secret, "a").await;
    let chat = shell_session(&a, "a-attack").await;
    let a_workspace = workspace_of(&a, &chat).await;
    let b_turn = starts_a_long_turn(&b).await;
    let mut attack = Attack::new(&a, &chat, &b);

    attack
        .cannot_read(
            &[&internal, &runner_secret, &jwt, &b_key, &agents, &neighbour],
            &[
                INTERNAL_SECRET,
                RUNNER_SECRET,
                SECRET,
                B_KEY,
                "B_AGENT_KEY",
                NEIGHBOUR,
            ],
        )
        .await;
    let store = attack
        .sh(&format!("ls -la '{}' 2>&1", shard_data.path().display()))
        .await;
    check!(
        attack,
        !store.contains("relay.sqlite"),
        "a listed the shard's data dir: {store}"
    );
    attack
        .cannot_see_outside(&["ahp-relay runner", "ahp-relay shard", "\"$@\" & wait"])
        .await;
    attack.cannot_reach_b().await;
    attack
        .cannot_write_outside(&[
            workspace.path().join("escaped.txt"),
            runner_data.path().join("escaped.txt"),
            PathBuf::from(format!("/tmp/ahp-sandbox-escaped-{}", uuid_like())),
        ])
        .await;
    let (_service, service_port) = local_service().await;
    let mut ports = vec![
        port_of(&shard_url),
        port_of(&shard_http),
        port_of(&addr),
        port_of(&runner_http),
        service_port,
    ];
    ports.extend(ports_from_env());
    attack.cannot_connect(&ports).await;
    attack.tcp_without_connect_is_refused(service_port).await;
    attack.fork_bomb_is_contained().await;
    attack.process_limit_spans_the_tenants_sandboxes(&sibling).await;
    attack.big_file_is_refused(&a_workspace).await;
    attack.preloaded_library_stays_inside(&a_workspace).await;
    let sibling_turn = starts_a_long_turn(&sibling).await;
    let killed = attack.run("sh: kill -9 -1; echo survived", PATIENCE).await;
    check!(
        attack,
        !killed.text.contains("survived"),
        "kill -9 -1 did not reach the agent itself: {}",
        killed.text
    );
    check!(
        attack,
        serving(&runner_http).await && runner.alive(),
        "kill -9 -1 killed the runner"
    );
    attack.output_flood_is_cut().await;
    check!(
        attack,
        serving(&runner_http).await && runner.alive(),
        "the flood killed the runner"
    );
    attack.assert_contained();
    assert_eq!(runners().await, 1.0, "the runner is still registered");
    long_turn_completes(&b, b_turn).await;
    long_turn_completes(&sibling, sibling_turn).await;
    let chat_b2 = shell_session(&b.client, "b-after").await;
    assert!(sh(&b.client, &chat_b2, "b-after", "echo fine")
        .await
        .contains("fine"));
    // The relay as deputy (issue 32): the runner deletes nothing through a link tenant a plants.
    relay_as_deputy(
        &addr,
        secret,
        &top,
        workspace.path(),
        &[etc.path(), shard_data.path(), runner_data.path(), config.path()],
        &b,
    )
    .await;
    assert!(runner.alive(), "the runner died");
    drop((shard, gateway));
}

/// A directory the test made beneath its own (dropped with that one).
struct Made(PathBuf);

impl Made {
    fn path(&self) -> &Path {
        &self.0
    }
}

/// `serve` with the shell agent (and `quotas`, lines of the agents file's `[quotas]` table), outside any PID
/// namespace of the test's (for tests that kill it, or measure it).
struct ShellRelay {
    relay: Relay,
    workspace: tempfile::TempDir,
    _config: tempfile::TempDir,
}

async fn shell_relay(quotas: &str, extra: &[&str]) -> ShellRelay {
    let workspace = tempfile::tempdir().expect("workspace");
    let config = tempfile::tempdir().expect("config");
    let file = config.path().join("agents.toml");
    std::fs::write(
        &file,
        format!(
            "workspace_root = {:?}\n\n{}\n[quotas]\n{quotas}\n\n[[agent]]\nid = \"shell\"\ndisplay_name = \"Shell\"\ncommand = {:?}\nenv = [\"PATH\"]\n",
            workspace.path().display().to_string(),
            own_users(),
            env!("CARGO_BIN_EXE_ahp-relay-test-agent"),
        ),
    )
    .expect("agents file");
    let mut args = vec!["--agents", file.to_str().expect("path")];
    args.extend_from_slice(extra);
    ShellRelay {
        relay: Relay::start_with(&args).await,
        workspace,
        _config: config,
    }
}

/// Every process whose working directory is `dir` (a session's sandbox: its init, its agent, its commands).
fn processes_in(dir: &Path) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).ok().as_deref() == Some(dir))
                .collect()
        })
        .unwrap_or_default()
}

/// Wait (at most `PATIENCE`) until none of `pids` runs any more; the ones still running if some do.
async fn all_gone(pids: &[u32]) -> Vec<u32> {
    let running = || {
        pids.iter()
            .copied()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                    !stat
                        .rsplit_once(')')
                        .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
                })
            })
            .collect::<Vec<_>>()
    };
    let gone = tokio::time::timeout(PATIENCE, async {
        while !running().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if gone.is_ok() {
        Vec::new()
    } else {
        running()
    }
}

/// Start `sh: COMMAND` on `chat` and return once its first output arrived (the command runs on).
async fn start_command(
    client: &ahp::Client,
    chat: &str,
    turn: &str,
    command: &str,
) -> ahp::SessionSubscription {
    let (_, _, mut sub) = subscribe_chat(client, chat).await;
    client
        .dispatch(chat.into(), turn_started(turn, &format!("sh: {command}")))
        .await
        .expect("dispatch");
    collect_until(&mut sub, |e| {
        matches!(
            e.action,
            StateAction::ChatResponsePart(_) | StateAction::ChatDelta(_)
        )
    })
    .await;
    sub
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_with_sigkill_takes_its_agents_and_their_commands_along() {
    let mut setup = shell_relay("", &[]).await;
    let (a, _) = setup.relay.client_as("a", "ana", Role::Member, "ana").await;
    let chat = shell_session(&a, "doomed").await;
    let _running = start_command(&a, &chat, "t1", "echo started; sleep 600").await;
    let dir = setup
        .workspace
        .path()
        .join("a/default/doomed")
        .canonicalize()
        .expect("workspace");
    let pids = processes_in(&dir);
    assert!(
        pids.len() >= 3,
        "the sandbox's init, the agent, its shell and sleep: {pids:?}"
    );
    setup.relay.kill().await;
    let left = all_gone(&pids).await;
    assert!(left.is_empty(), "orphans of a killed relay still run: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_with_sigkill_takes_its_agents_and_their_commands_along() {
    let workspace = tempfile::tempdir().expect("workspace");
    let config = tempfile::tempdir().expect("config");
    let file = config.path().join("agents.toml");
    std::fs::write(
        &file,
        format!(
            "workspace_root = {:?}\n\n{}\n[[agent]]\nid = \"shell\"\ndisplay_name = \"Shell\"\ncommand = {:?}\nenv = [\"PATH\"]\n",
            workspace.path().display().to_string(),
            own_users(),
            env!("CARGO_BIN_EXE_ahp-relay-test-agent"),
        ),
    )
    .expect("agents file");
    let agents = file.display().to_string();
    let shard = Shard::start(&["--agents", &agents]).await;
    let gateway = Relay::gateway(&shard.url).await;
    let mut command = Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
    command.args([
        "runner",
        "--http-listen",
        "127.0.0.1:0",
        "--shard",
        &shard.url,
        "--agents",
        &agents,
    ]);
    let (mut runner, _) = spawn_until(command, "runner serving").await;
    tokio::time::timeout(PATIENCE, async {
        while shard.metric("ahp_relay_agent_runners").await != 1.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the runner registered");
    let (a, _) = gateway.client_as("a", "ana", Role::Member, "ana").await;
    let chat = shell_session(&a, "doomed").await;
    let _running = start_command(&a, &chat, "t1", "echo started; sleep 600").await;
    let dir = workspace
        .path()
        .join("a/default/doomed")
        .canonicalize()
        .expect("workspace");
    let pids = processes_in(&dir);
    assert!(
        pids.len() >= 3,
        "the sandbox's init, the agent, its shell and sleep: {pids:?}"
    );
    runner.start_kill().expect("SIGKILL the runner");
    runner.wait().await.expect("wait");
    let left = all_gone(&pids).await;
    assert!(left.is_empty(), "orphans of a killed runner still run: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_output_stops_at_its_tenants_storage_quota() {
    let setup = shell_relay(
        "",
        &[
            "--max-stored-bytes-per-tenant",
            "200000",
            "--storage-check-every",
            "100ms",
        ],
    )
    .await;
    let (a, _) = setup.relay.client_as("a", "ana", Role::Member, "ana").await;
    let chat = shell_session(&a, "hoard").await;
    // 3 MB of output, far past the tenant's 200 kB of storage (and within the turn's 8 MiB of output).
    let reply = run(
        &a,
        &chat,
        "t1",
        "sh: head -c 3000000 /dev/zero | tr '\\0' 'x'",
        Duration::from_secs(60),
    )
    .await;
    assert!(reply.text.contains("storageQuota"), "{}", tail(&reply.text, 400));
    // Stopped at the next measurement (every 100 ms), not at the end of the output.
    assert!(
        reply.text.len() < 2_000_000,
        "{} bytes of output were stored",
        reply.text.len()
    );
    // Over the quota, new turns are refused outright.
    let refused = run(&a, &chat, "t2", "sh: echo more", PATIENCE).await;
    assert!(refused.text.contains("storage quota"), "{}", refused.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_terminals_are_bounded_and_a_commands_output_is_cut() {
    let setup = shell_relay(
        "terminals_per_session = 2\noutput_bytes_per_turn = 200000\noutput_bytes_per_second = 10000000",
        &[],
    )
    .await;
    let (a, _) = setup.relay.client_as("a", "ana", Role::Member, "ana").await;
    let chat = shell_session(&a, "terms").await;
    let many = run(&a, &chat, "t2", "terminals 3: sleep 1", PATIENCE).await.text;
    assert!(many.contains("OPENED 2 REFUSED 1"), "{many}");
    assert!(many.contains("2 commands"), "the refusal says why: {many}");
    let flood = run(&a, &chat, "t3", "term: yes", PATIENCE).await.text;
    assert!(flood.contains("passed the output limit"), "{}", tail(&flood, 400));
    // Two commands, each within the budget, together over it: what terminals print counts toward the turn's
    // output budget too.
    let shared = run(
        &a,
        &chat,
        "t4",
        "terminals 2: head -c 150000 /dev/zero | tr '\\0' x",
        PATIENCE,
    )
    .await
    .text;
    assert!(
        shared.contains("passed the output limit") || shared.contains("passed its output budget"),
        "{}",
        tail(&shared, 400)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_workspace_over_its_quota_stops_its_work_until_sessions_are_disposed() {
    let setup = shell_relay(
        "workspace_bytes_per_tenant = 20000000\nworkspace_check_seconds = 1",
        &[],
    )
    .await;
    let (a, _) = setup.relay.client_as("a", "ana", Role::Member, "ana").await;
    let (b, _) = setup.relay.client_as("b", "bob", Role::Member, "bob").await;
    let full = shell_session(&a, "full").await;
    let said = sh(
        &a,
        &full,
        "t1",
        "head -c 30000000 /dev/zero > fill.bin; echo filled",
    )
    .await;
    assert!(said.contains("filled"), "{said}");
    // Within a few measurements, the tenant's next turn is refused (each attempt is a real turn).
    let mut refused = None;
    for n in 0..40 {
        let reply = run(&a, &full, &format!("probe-{n}"), "sh: echo alive", PATIENCE)
            .await
            .text;
        if !reply.contains("alive") {
            refused = Some(reply);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let refused = refused.expect("the tenant was never stopped");
    assert!(refused.contains("quota"), "{refused}");
    // Another tenant is not affected.
    let other = shell_session(&b, "fine").await;
    assert!(sh(&b, &other, "t1", "echo fine").await.contains("fine"));
    // Disposing the session removes its workspace; the tenant works again.
    let _: Value = a
        .request(
            "disposeSession",
            serde_json::json!({"channel": "ahp-session:/full"}),
        )
        .await
        .expect("disposeSession");
    // Until the next measurement the tenant is still over: sessions keep failing; then one starts and runs.
    let mut worked = false;
    for n in 0..40 {
        if let Ok(again) = try_shell_session(&a, &format!("again-{n}")).await {
            worked = run(&a, &again, "t1", "sh: echo alive", PATIENCE)
                .await
                .text
                .contains("alive");
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(worked, "the tenant stayed stopped after its files were removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_is_served_within_5s_while_one_runs_200_agents_that_flood_output() {
    const FLOODERS: usize = 200;
    let setup = shell_relay(
        "running_per_tenant = 256\noutput_bytes_per_second = 262144\noutput_bytes_per_turn = 4194304",
        &[],
    )
    .await;
    let (a, _) = setup.relay.client_as("a", "ana", Role::Member, "ana").await;
    // Tenant a: 200 sessions, each with its agent running, each flooding (its own output and a terminal's).
    for n in 0..FLOODERS {
        let _: Value = a
            .request(
                "createSession",
                CreateSessionParams {
                    channel: format!("ahp-session:/flood-{n}"),
                    meta: None,
                    provider: Some("shell".into()),
                    working_directories: None,
                    config: None,
                    active_client: None,
                    progress_token: None,
                },
            )
            .await
            .expect("createSession");
    }
    for n in 0..FLOODERS {
        let session = format!("ahp-session:/flood-{n}");
        let (result, mut sub) = a.subscribe(session.clone()).await.expect("subscribe");
        let mut state = session_of(&result.snapshot.expect("snapshot"));
        while state.lifecycle != SessionLifecycle::Ready {
            assert_ne!(
                state.lifecycle,
                SessionLifecycle::Failed,
                "{n}: {:?}",
                state.creation_error
            );
            let envelope = tokio::time::timeout(Duration::from_secs(120), sub.recv())
                .await
                .expect("the flooding session became ready");
            if let Some(ahp::SubscriptionEvent::Action(envelope)) = envelope {
                ahp::reducers::apply_action_to_session(&mut state, &envelope.action);
            }
        }
        a.unsubscribe(session.clone()).await.expect("unsubscribe");
        let chat = format!("ahp-chat:/flood-{n}");
        let flood = if n % 2 == 0 { "sh: yes" } else { "term: yes" };
        a.dispatch(chat, turn_started("flood", flood))
            .await
            .expect("dispatch");
    }
    // The floods are on: tenant a's output is arriving. (All its chats are watched: the tenant's output rate
    // is shared by its 200 agents, so any one of them gets a complete line through only now and then.)
    let (floods_tx, mut floods) = tokio::sync::mpsc::unbounded_channel::<usize>();
    for n in 0..FLOODERS {
        let (_, _, mut sub) = subscribe_chat(&a, &format!("ahp-chat:/flood-{n}")).await;
        let floods_tx = floods_tx.clone();
        tokio::spawn(async move {
            while let Some(event) = sub.recv().await {
                if let ahp::SubscriptionEvent::Action(envelope) = event {
                    let output = matches!(
                        envelope.action,
                        StateAction::ChatDelta(_) | StateAction::ChatResponsePart(_)
                    );
                    if output && floods_tx.send(n).is_err() {
                        return;
                    }
                }
            }
        });
    }
    output_arrives(&mut floods, "tenant a's output before tenant b starts").await;

    // Tenant b: a session from nothing to a completed turn.
    let started = std::time::Instant::now();
    let (b, _) = setup.relay.client_as("b", "bob", Role::Member, "bob").await;
    let chat = shell_session(&b, "quick").await;
    let reply = run(&b, &chat, "t1", "sh: echo served", Duration::from_secs(60)).await;
    let took = started.elapsed();
    eprintln!("tenant b: session ready and a turn completed in {took:?} beside {FLOODERS} flooding agents");
    assert!(
        reply.text.contains("served") && reply.text.contains("EXIT 0"),
        "{}",
        reply.text
    );
    assert!(
        took <= Duration::from_secs(5),
        "tenant b took {took:?} while tenant a flooded"
    );
    // Tenant a was flooding all along: output it printed after b was served still arrives.
    while floods.try_recv().is_ok() {}
    output_arrives(&mut floods, "tenant a's output after tenant b was served").await;
}

/// Wait (at most `PATIENCE`) for one of tenant a's floods to show output; panic naming `what` otherwise.
async fn output_arrives(floods: &mut tokio::sync::mpsc::UnboundedReceiver<usize>, what: &str) {
    let arrived = tokio::time::timeout(PATIENCE, floods.recv()).await;
    assert!(
        matches!(arrived, Ok(Some(_))),
        "{what}: none arrived within {PATIENCE:?} ({arrived:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminals_variables_must_be_variable_names() {
    let setup = shell_relay("", &[]).await;
    let (a, _) = setup.relay.client_as("a", "ana", Role::Member, "ana").await;
    let chat = shell_session(&a, "vars").await;
    // A name that would be read as an option (`env --chdir=…`, as terminals once ran) or that is no name.
    for name in ["--chdir", "A=B", "1X", ""] {
        let said = run(
            &a,
            &chat,
            &format!("bad-{name}"),
            &format!("term-env {name}: pwd"),
            PATIENCE,
        )
        .await
        .text;
        assert!(
            said.contains("REFUSED") && said.contains("not a valid environment variable name"),
            "{name}: {said}"
        );
    }
    let fine = run(&a, &chat, "good", "term-env GREETING: echo $GREETING", PATIENCE)
        .await
        .text;
    assert!(fine.contains("RAN: x"), "{fine}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_working_sandbox_agents_are_refused_unless_the_operator_says_otherwise() {
    let workspace = tempfile::tempdir().expect("workspace");
    let config = tempfile::tempdir().expect("config");
    let data = tempfile::tempdir().expect("data");
    let file = config.path().join("agents.toml");
    std::fs::write(
        &file,
        format!(
            "workspace_root = {:?}\n\n{}\n[[agent]]\nid = \"shell\"\ndisplay_name = \"Shell\"\ncommand = {:?}\nenv = [\"PATH\"]\n",
            workspace.path().display().to_string(),
            own_users(),
            env!("CARGO_BIN_EXE_ahp-relay-test-agent"),
        ),
    )
    .expect("agents file");
    // No bubblewrap (as on a machine without it): serve does not start, and says why and what to do.
    let refused = tokio::time::timeout(
        PATIENCE,
        Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--bwrap",
                "/nonexistent/bwrap",
                "--agents",
            ])
            .arg(&file)
            .arg("--data-dir")
            .arg(data.path())
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .expect("serve exited")
    .expect("run");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "serve started without a sandbox");
    assert!(
        said.contains("cannot be sandboxed") && said.contains("--unsafe-no-sandbox"),
        "{said}"
    );
    // The operator's explicit choice: agents run, unconfined, and the log says so at every agent start.
    let relay = Relay::start_with(&[
        "--agents",
        file.to_str().expect("path"),
        "--bwrap",
        "/nonexistent/bwrap",
        "--unsafe-no-sandbox",
    ])
    .await;
    let (a, _) = relay.client_as("a", "ana", Role::Member, "ana").await;
    let chat = shell_session(&a, "bare").await;
    // Unconfined, the agent sees the relay's processes (what the sandbox prevents).
    // (A process that exits between the glob and `ls` is not counted, nor reported on the first line.)
    let said = sh(&a, &chat, "t1", "ls -d /proc/[0-9]* 2>/dev/null | wc -l").await;
    let visible: usize = said
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    assert!(visible > 5, "{said}");
}

/// Issue 32: where pasta cannot give agents a network namespace of their own (here: not installed), agents with
/// port egress would share the relay's (its loopback services on their ports, listening on its addresses): the
/// relay refuses to start and says why, unless the operator opts in; agents without egress need no namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_network_of_their_own_agents_with_ports_are_refused_unless_the_operator_says_otherwise() {
    let workspace = tempfile::tempdir().expect("workspace");
    let config = tempfile::tempdir().expect("config");
    let data = tempfile::tempdir().expect("data");
    let agents = |egress: &str| {
        let file = config.path().join(format!("agents-{}.toml", egress.len()));
        std::fs::write(
            &file,
            format!(
                "workspace_root = {:?}\n\n{}\n[[agent]]\nid = \"shell\"\ndisplay_name = \"Shell\"\ncommand = {:?}\nenv = [\"PATH\"]\n{egress}\n",
                workspace.path().display().to_string(),
                own_users(),
                env!("CARGO_BIN_EXE_ahp-relay-test-agent"),
            ),
        )
        .expect("agents file");
        file.display().to_string()
    };
    let with_ports = agents("");
    let refused = tokio::time::timeout(
        PATIENCE,
        Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--pasta",
                "/nonexistent/pasta",
                "--agents",
                &with_ports,
            ])
            .arg("--data-dir")
            .arg(data.path())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("serve exited")
    .expect("run");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "serve started agents with port egress in its own network namespace"
    );
    assert!(
        said.contains("network namespace of its own") && said.contains("--unsafe-shared-network"),
        "{said}"
    );
    // An agent without egress needs no namespace of its own: it runs.
    let relay = Relay::start_with(&[
        "--agents",
        &agents("egress = \"none\""),
        "--pasta",
        "/nonexistent/pasta",
    ])
    .await;
    let (a, _) = relay.client_as("a", "ana", Role::Member, "ana").await;
    let chat = shell_session(&a, "offline").await;
    assert!(sh(&a, &chat, "t1", "echo fine").await.contains("fine"));
    drop(relay);
    // The operator's explicit choice: agents with ports run in the relay's network namespace.
    let relay = Relay::start_with(&[
        "--agents",
        &with_ports,
        "--pasta",
        "/nonexistent/pasta",
        "--unsafe-shared-network",
    ])
    .await;
    let (a, _) = relay.client_as("a", "ana", Role::Member, "ana").await;
    let chat = shell_session(&a, "shared").await;
    assert!(sh(&a, &chat, "t1", "echo fine").await.contains("fine"));
}

/// A DNS server of the test's on `address`:53 (UDP) that answers every A query with `answer` and every other
/// query with no record.
async fn stub_dns(address: &str, answer: [u8; 4]) -> tokio::task::JoinHandle<()> {
    let socket = tokio::net::UdpSocket::bind((address, 53))
        .await
        .expect("bind the stub resolver");
    tokio::spawn(async move {
        let mut buffer = [0u8; 512];
        while let Ok((len, from)) = socket.recv_from(&mut buffer).await {
            let query = &buffer[..len];
            // The question: labels up to a zero byte, then its type and class.
            let Some(end) = query.get(12..).and_then(|q| q.iter().position(|b| *b == 0)) else {
                continue;
            };
            let question = &query[12..12 + end + 5];
            let is_a = question[end + 1..end + 3] == [0, 1];
            let mut reply = vec![
                query[0],
                query[1],
                0x81,
                0x80,
                0,
                1,
                0,
                u8::from(is_a),
                0,
                0,
                0,
                0,
            ];
            reply.extend_from_slice(question);
            if is_a {
                reply.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
                reply.extend_from_slice(&answer);
            }
            let _ = socket.send_to(&reply, from).await;
        }
    })
}

/// Issue 32: in a network namespace of its own an agent's loopback is its own, so a host whose resolver is on
/// the host's loopback (systemd-resolved's 127.0.0.53, Docker's embedded 127.0.0.11) would leave it unable to
/// resolve any name: its resolver is then the host's, reached through pasta.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_resolves_names_through_a_resolver_on_the_hosts_loopback() {
    if unsafe_geteuid() != 0 {
        // A resolver listens on port 53, which needs root; the namespaces too.
        eprintln!("skipped: a resolver on port 53 needs root");
        return;
    }
    let top = tempfile::tempdir().expect("top");
    let (data, workspace, config) = (
        top.path().join("data"),
        top.path().join("ws"),
        top.path().join("config"),
    );
    for dir in [&data, &workspace, &config] {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    let resolver = stub_dns("127.0.0.153", [192, 0, 2, 7]).await;
    let resolv_conf = config.join("resolv.conf");
    std::fs::write(
        &resolv_conf,
        "nameserver 127.0.0.153\noptions timeout:2 attempts:2\n",
    )
    .expect("resolv.conf");
    let b_key = private_file(&config, "b-agent-key", B_KEY);
    let agents = agents_file(&config, &workspace, &b_key, &[]);
    let args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &data.display().to_string(),
        "--agents",
        &agents.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (_relay, found) = contained_with(None, Some(&resolv_conf), &args, &[], &["listening on ws://"]).await;
    let addr = found[0].trim_end_matches("/v1/ws").to_string();
    let secret = std::fs::read_to_string(data.join("jwt-secret")).expect("jwt-secret");
    let a = client(&addr, secret.trim().as_bytes(), "a").await;
    let chat = shell_session(&a, "dns").await;
    let resolved = sh(
        &a,
        &chat,
        "t1",
        "getent ahostsv4 relay-check.example || echo UNRESOLVED; grep nameserver /etc/resolv.conf",
    )
    .await;
    assert!(
        resolved.contains("192.0.2.7"),
        "the agent resolved no name: {resolved}"
    );
    resolver.abort();
}

// ---------------------------------------------------------------------------------------------------------------
// The relay as deputy (issue 32): what the relay does for a tenant outside any sandbox, as root, never follows a
// link the tenant planted.

/// A session of the shell agent in `directory` (a `file://` URI), or why it was refused or failed.
async fn try_session_in(client: &ahp::Client, name: &str, directory: &str) -> Result<String, String> {
    let session = format!("ahp-session:/{name}");
    let created: Result<Value, _> = client
        .request(
            "createSession",
            serde_json::json!({"channel": session, "provider": "shell", "workingDirectories": [directory]}),
        )
        .await;
    if let Err(error) = created {
        return Err(format!("refused: {error}"));
    }
    let (result, mut sub) = client.subscribe(session.clone()).await.expect("subscribe");
    let mut state = session_of(&result.snapshot.expect("snapshot"));
    while state.lifecycle != SessionLifecycle::Ready {
        if state.lifecycle == SessionLifecycle::Failed {
            return Err(format!("failed: {:?}", state.creation_error));
        }
        let envelope = next_envelope(&mut sub).await;
        ahp::reducers::apply_action_to_session(&mut state, &envelope.action);
    }
    Ok(format!("ahp-chat:/{name}"))
}

/// Every file beneath `dir` with its content, for a byte-for-byte comparison.
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir").flatten() {
            let kind = entry.file_type().expect("type");
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() {
                files.push((entry.path(), std::fs::read(entry.path()).expect("read")));
            }
        }
    }
    files.sort();
    files
}

/// What a disposal must leave alone: a directory of the test's (its entries at the start, and a canary file).
struct Guarded {
    dir: PathBuf,
    entries: Vec<std::ffi::OsString>,
    canary: String,
}

impl Guarded {
    fn new(dir: &Path) -> Guarded {
        let canary = format!("canary-{}", uuid_like());
        std::fs::write(dir.join("canary.txt"), &canary).expect("canary");
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("read_dir")
            .flatten()
            .map(|entry| entry.file_name())
            .collect();
        entries.sort();
        Guarded {
            dir: dir.to_path_buf(),
            entries,
            canary,
        }
    }

    fn intact(&self) -> Result<(), String> {
        let canary = std::fs::read_to_string(self.dir.join("canary.txt"))
            .map_err(|error| format!("{}: the canary is gone ({error})", self.dir.display()))?;
        if canary != self.canary {
            return Err(format!("{}: the canary changed", self.dir.display()));
        }
        for entry in &self.entries {
            if std::fs::symlink_metadata(self.dir.join(entry)).is_err() {
                return Err(format!("{}: {entry:?} is gone", self.dir.display()));
            }
        }
        Ok(())
    }
}

/// Issue 32 (acceptance 1, files): tenant a plants a link to `top` — the directory holding `guarded` (a
/// stand-in for `/etc`, the relay's data directories) and the workspace root `workspace` (tenant b's
/// workspaces) — over its host directory: its agent makes the link in its own workspace and a member moves it
/// over `<root>/a/default` with `resourceMove`. Sessions named after those directories (created before) are then
/// disposed: each guarded directory and b's workspace survive, byte for byte; neither the tenant's directory nor
/// a working directory through the link is accepted for a session. `b` is tenant b at work.
async fn relay_as_deputy(
    addr: &str,
    secret: &[u8],
    top: &Path,
    workspace: &Path,
    guarded: &[&Path],
    b: &AtWork,
) {
    let names: Vec<String> = guarded
        .iter()
        .chain(std::iter::once(&workspace))
        .map(|dir| {
            let name = dir.strip_prefix(top).expect("beneath top").display().to_string();
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{name}: a session name that is its own directory name"
            );
            name
        })
        .collect();
    let guards: Vec<Guarded> = guarded.iter().map(|dir| Guarded::new(dir)).collect();
    let b_before = contents(&workspace.join("b"));
    let a = client(addr, secret, "a").await;
    for name in &names {
        shell_session(&a, name).await;
    }
    let chat = shell_session(&a, "attack").await;
    let linked = sh(
        &a,
        &chat,
        "plant",
        &format!("ln -s {} link && ls -l link", top.display()),
    )
    .await;
    assert!(linked.contains("link ->"), "the agent made its link: {linked}");
    let tenant_dir = workspace.join("a");
    let host_dir = tenant_dir.join("default");
    let file_uri = |path: &Path| format!("file://{}", path.display());
    let moved = |from: PathBuf, to: PathBuf| {
        let a = &a;
        async move {
            let moved: Result<Value, _> = a
                .request(
                    "resourceMove",
                    serde_json::json!({"channel": "ahp-root://", "source": file_uri(&from), "destination": file_uri(&to)}),
                )
                .await;
            moved.map_err(|error| format!("{error}"))
        }
    };
    // Route (b): the host directory moved aside, the agent's link moved over it.
    moved(host_dir.clone(), tenant_dir.join("default-old"))
        .await
        .expect("the host directory moved aside");
    moved(tenant_dir.join("default-old/attack/link"), host_dir.clone())
        .await
        .expect("the link moved over the host directory");
    assert!(
        std::fs::symlink_metadata(&host_dir)
            .expect("planted")
            .file_type()
            .is_symlink(),
        "the host directory is now a link"
    );
    // Route (a) and a directory through the link: refused, nothing made through the link.
    let refused = try_session_in(&a, "at-root", &file_uri(&tenant_dir)).await;
    assert!(
        refused.is_err(),
        "the tenant's directory as a working directory: {refused:?}"
    );
    let through = try_session_in(&a, "through", &file_uri(&host_dir.join("new-dir"))).await;
    assert!(
        through.is_err(),
        "a working directory through the link: {through:?}"
    );
    assert!(!top.join("new-dir").exists() && !top.join("through").exists());

    for name in &names {
        let _: Value = a
            .request(
                "disposeSession",
                serde_json::json!({"channel": format!("ahp-session:/{name}")}),
            )
            .await
            .expect("disposeSession");
    }
    // The disposals reached the workspace, nothing through the link: with a retention (1 s) disposal marks the
    // sessions' private directories and the workspace sweep removes them, in a round of the runner's upkeep
    // that first walks tenant a's workspace for its quota, the link in place.
    let gone = tokio::time::timeout(PATIENCE, async {
        while names
            .iter()
            .any(|name| workspace.join(format!(".sandbox/a/default/{name}")).exists())
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "the disposed sessions' private directories stayed");
    for guard in &guards {
        if let Err(why) = guard.intact() {
            panic!("the relay deleted through the tenant's link: {why}");
        }
    }
    assert_eq!(
        contents(&workspace.join("b")),
        b_before,
        "tenant b's workspace changed"
    );
    // Tenant b goes on.
    assert!(sh(&b.client, &b.chat, "after-deputy", "cat marker.txt")
        .await
        .contains(&b.marker));
}

/// Issue 32 (acceptance 1, files), in `serve` as root: see [`relay_as_deputy`]; the guarded directories are a
/// stand-in for `/etc` and the relay's data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_serve_the_relay_deletes_creates_and_measures_nothing_through_a_tenants_link() {
    let top = tempfile::tempdir().expect("top");
    let top = top.path().canonicalize().expect("real");
    let (data, workspace, config, etc) = (
        top.join("data"),
        top.join("ws"),
        top.join("config"),
        top.join("etc"),
    );
    for dir in [&data, &workspace, &config, &etc] {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    std::fs::write(etc.join("passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("etc stand-in");
    let b_key = private_file(&config, "b-agent-key", B_KEY);
    let agents = agents_file(&config, &workspace, &b_key, &[]);
    let args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &data.display().to_string(),
        "--agents",
        &agents.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (mut relay, found) = contained(&args, &[], &["listening on ws://"]).await;
    let addr = found[0].trim_end_matches("/v1/ws").to_string();
    let secret = std::fs::read_to_string(data.join("jwt-secret")).expect("jwt-secret");
    let secret = secret.trim().as_bytes().to_vec();
    let b = tenant_at_work(&addr, &secret, &workspace, "b").await;
    relay_as_deputy(&addr, &secret, &top, &workspace, &[&etc, &data], &b).await;
    assert!(data.join("relay.sqlite").exists(), "the store is there");
    assert!(relay.alive(), "the relay died");
}
