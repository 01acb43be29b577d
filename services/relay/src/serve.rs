//! The relay's processes: `serve` (the embedded relay — gateway, host logic and demo agent in one process),
//! and the two halves of the distributed deployment, `shard` (host logic behind gRPC) and `gateway`
//! (WebSockets and auth, calling a shard over gRPC). Given `--redis-url`, the shard also publishes every
//! host's bus to Redis and gateways follow hosts there, repairing lost messages from the shard.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use relay_bus::RedisPublisher;
use relay_core::link::HostLink;
use relay_core::telemetry::Side;
use relay_core::{Limits, Role};
use relay_gateway::auth::{mint_hs256, Claims, TokenVerifier};
use relay_gateway::GatewayState;
use relay_runner::{DemoPace, DemoProvider, ProviderRegistry};
use relay_shard::ShardLink;

use crate::secret;

/// Where the relay keeps its files (the SQLite store, the generated JWT secret).
#[derive(clap::Args)]
pub struct DataArgs {
    #[arg(long, env = "AHP_RELAY_DATA_DIR", default_value = ".relay-data")]
    pub data_dir: PathBuf,
}

/// The host logic's settings (the shard side).
#[derive(clap::Args)]
pub struct HostArgs {
    /// Postgres URL (postgres://…) for the distributed store; default: SQLite in --data-dir.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Pause between the demo agent's streamed actions, in milliseconds.
    #[arg(long, env = "AHP_RELAY_DEMO_STEP_MS", default_value_t = 40)]
    pub demo_step_ms: u64,
    /// `serve` without --agents: give the demo agent a workspace under the data directory (`workspaces/`),
    /// sandboxed as agents are, so the Files and Changes panes work out of the box; where this machine cannot
    /// sandbox, `serve` says so at start and runs without one.
    #[arg(long, env = "AHP_RELAY_DEMO_WORKSPACE", default_value_t = true, action = clap::ArgAction::Set)]
    pub demo_workspace: bool,
    /// The ACP agents this deployment offers besides `demo` (TOML; see deploy/agents.example.toml). `serve`
    /// runs them itself; a shard only lists them and places their sessions on `ahp-relay runner` processes.
    #[arg(long, env = "AHP_RELAY_AGENTS")]
    pub agents: Option<PathBuf>,
    /// Envelopes per host kept in memory for exact reconnect replay.
    #[arg(long, env = "AHP_RELAY_REPLAY_BUFFER", default_value_t = 10_000)]
    pub replay_buffer: usize,
    /// How long a disconnected active client keeps its slot, in milliseconds.
    #[arg(long, env = "AHP_RELAY_ACTIVE_CLIENT_GRACE_MS", default_value_t = 30_000)]
    pub active_client_grace_ms: u64,
    /// Store a channel's snapshot after this many actions (or after --snapshot-every).
    #[arg(long, env = "AHP_RELAY_SNAPSHOT_EVERY_ACTIONS", default_value_t = 500)]
    pub snapshot_every_actions: u32,
    /// Store a channel's snapshot when an action arrives this long after its last one (e.g. 60s).
    #[arg(long, env = "AHP_RELAY_SNAPSHOT_EVERY", default_value = "60s", value_parser = crate::parse_ttl)]
    pub snapshot_every: Duration,
    /// How long the action log is kept: the resume window (e.g. 7d). Older rows are compacted into snapshots.
    #[arg(long, env = "AHP_RELAY_RETENTION", default_value = "7d", value_parser = crate::parse_ttl)]
    pub retention: Duration,
    /// A chat's retained turns: the newest this many, sent in a snapshot when `view.turns` is omitted and
    /// kept in memory when a chat is restored; older ones are paged in from the store with fetchTurns.
    #[arg(long, env = "AHP_RELAY_RETAINED_TURNS", default_value_t = 100)]
    pub retained_turns: usize,
    /// …and at most this many bytes of them (as JSON; at least the newest turn): a chat of large turns keeps
    /// fewer in memory, the rest in the turn archive.
    #[arg(long, env = "AHP_RELAY_RETAINED_TURN_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub retained_turn_bytes: usize,
    /// Turns one chat may hold, archived ones included; a turn beyond it is refused (a rejection saying so).
    #[arg(long, env = "AHP_RELAY_MAX_TURNS_PER_CHAT", default_value_t = 100_000)]
    pub max_turns_per_chat: usize,
    /// Turns per `fetchTurns` page.
    #[arg(long, env = "AHP_RELAY_FETCH_TURNS_PAGE", default_value_t = 50)]
    pub fetch_turns_page: usize,
    /// Largest reply built for one request, in bytes: a reconnect replay over it is answered with snapshots.
    #[arg(long, env = "AHP_RELAY_MAX_REPLY_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_reply_bytes: usize,
    /// Bytes of envelopes per host kept in memory for exact reconnect replay (besides --replay-buffer).
    #[arg(long, env = "AHP_RELAY_REPLAY_BUFFER_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub replay_buffer_bytes: usize,
    /// Sessions one host may hold; createSession beyond it is refused (-32600).
    #[arg(long, env = "AHP_RELAY_MAX_SESSIONS_PER_HOST", default_value_t = 100_000)]
    pub max_sessions_per_host: usize,
    /// Chats one session may hold; createChat beyond it is refused (-32600).
    #[arg(long, env = "AHP_RELAY_MAX_CHATS_PER_SESSION", default_value_t = 256)]
    pub max_chats_per_session: usize,
    /// Channels one connection may be subscribed to at once; subscribing beyond it is refused (-32602).
    #[arg(
        long,
        env = "AHP_RELAY_MAX_SUBSCRIPTIONS_PER_CONNECTION",
        default_value_t = 1024
    )]
    pub max_subscriptions_per_connection: usize,
    /// Bytes one tenant may keep in the store (log and snapshots, every host); at or over it, new sessions,
    /// chats and content are refused until sessions are disposed and compacted. 0: no quota.
    #[arg(long, env = "AHP_RELAY_MAX_STORED_BYTES_PER_TENANT", default_value_t = 10 * 1024 * 1024 * 1024)]
    pub max_stored_bytes_per_tenant: u64,
    /// How often a tenant's stored bytes are measured (the quota may be overshot by what it writes meanwhile).
    #[arg(long, env = "AHP_RELAY_STORAGE_CHECK_EVERY", default_value = "60s", value_parser = crate::parse_ttl)]
    pub storage_check_every: Duration,
    /// Hosts of one tenant held open at once (per shard); opening one more is refused.
    #[arg(long, env = "AHP_RELAY_MAX_HOSTS_PER_TENANT", default_value_t = 100)]
    pub max_hosts_per_tenant: usize,
    /// A host with no connection, no running turn and nothing to commit for this long is evicted from
    /// memory and its lease released (e.g. 5m); the next message reopens it from the store.
    #[arg(long, env = "AHP_RELAY_IDLE_HOST_TIMEOUT", default_value = "5m", value_parser = crate::parse_ttl)]
    pub idle_host_timeout: Duration,
    /// How often the retention job runs (e.g. 1h).
    #[arg(long, env = "AHP_RELAY_COMPACT_EVERY", default_value = "1h", value_parser = crate::parse_ttl)]
    pub compact_every: Duration,
    /// Largest file a client reads or writes with resourceRead/resourceWrite (bytes); a larger one is refused
    /// with an error naming this limit.
    #[arg(long, env = "AHP_RELAY_MAX_FILE_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_file_bytes: u64,
    /// Whether devices may open terminals in their sessions (createTerminal, a chat's `!command`); with
    /// false they still watch agents' terminals.
    #[arg(long, env = "AHP_RELAY_DEVICE_TERMINALS", default_value_t = true, action = clap::ArgAction::Set)]
    pub device_terminals: bool,
    /// An agent's file edit side, image or text output larger than this many bytes is kept in the store and
    /// named by an `ahp-content:` URI (read with resourceRead) instead of inline in the state.
    #[arg(long, env = "AHP_RELAY_CONTENT_REF_BYTES", default_value_t = 8 * 1024)]
    pub content_ref_bytes: usize,
    /// A tenant's file server with nothing under way and no watch open stops after this long (e.g. 10m).
    #[arg(long, env = "AHP_RELAY_FILE_SERVER_IDLE", default_value = "10m", value_parser = crate::parse_ttl)]
    pub file_server_idle: Duration,
}

/// The client-facing side's settings (the gateway).
#[derive(clap::Args)]
pub struct EdgeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "AHP_RELAY_LISTEN", default_value = "127.0.0.1:7878")]
    pub listen: SocketAddr,
    /// Web pages that may open WebSockets besides the relay's own page (browser `Origin`s, comma-separated;
    /// `*` allows any). Clients that send no `Origin` (not browsers) are not affected.
    #[arg(
        long,
        env = "AHP_RELAY_ALLOWED_ORIGINS",
        value_delimiter = ',',
        default_value = "vscode-file://vscode-app"
    )]
    pub allowed_origins: Vec<String>,
    /// Proxies in front of the relay (addresses or networks, comma-separated) whose `X-Forwarded-For` names
    /// the client, for the per-address throttle of failed sign-ins (default: none; every peer is the client).
    #[arg(long, env = "AHP_RELAY_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<String>,
    /// Where the web client sends a user to sign in: an identity provider's login that returns to the page
    /// with the token in the fragment (`#access_token=…`); `{return}` is replaced by the page's address and
    /// `{state}` by a one-time value the provider must hand back (`&state=…`), else the answer is refused.
    #[arg(long, env = "AHP_RELAY_SIGN_IN_URL")]
    pub sign_in_url: Option<String>,
    /// HS256 secret for access tokens (at least 32 bytes); default: --jwt-secret-file, else generated once
    /// and kept in --data-dir.
    #[arg(long, env = "AHP_RELAY_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// A file holding the HS256 secret (mode 0600 or stricter), so the secret is not on the command line.
    #[arg(long, env = "AHP_RELAY_JWT_SECRET_FILE")]
    pub jwt_secret_file: Option<PathBuf>,
    /// Accept tokens of an identity provider instead of HS256 ones: its public keys (RSA, EC P-256 or
    /// Ed25519, PEM; comma-separated or the flag repeated).
    #[arg(long, env = "AHP_RELAY_JWT_PUBLIC_KEY_FILES", value_delimiter = ',')]
    pub jwt_public_key_file: Vec<PathBuf>,
    /// Accept tokens of an identity provider whose keys are at this JWKS URL (its OpenID configuration's
    /// `jwks_uri`): fetched at start, refreshed, and fetched again for an unknown `kid`.
    #[arg(long, env = "AHP_RELAY_JWKS_URL")]
    pub jwks_url: Option<String>,
    /// How often the JWKS is fetched again.
    #[arg(long, env = "AHP_RELAY_JWKS_REFRESH", default_value = "5m", value_parser = crate::parse_ttl)]
    pub jwks_refresh: Duration,
    /// The shortest time between two fetches of the JWKS for tokens with an unknown `kid`.
    #[arg(long, env = "AHP_RELAY_JWKS_MIN_REFETCH", default_value = "30s", value_parser = crate::parse_ttl)]
    pub jwks_min_refetch: Duration,
    /// How long one fetch of the JWKS may take.
    #[arg(long, env = "AHP_RELAY_JWKS_TIMEOUT", default_value = "5s", value_parser = crate::parse_ttl)]
    pub jwks_timeout: Duration,
    /// The provider's signature algorithms (pinned: a token's own `alg` is never trusted).
    #[arg(
        long,
        env = "AHP_RELAY_JWT_ALGORITHMS",
        value_delimiter = ',',
        default_value = "RS256,ES256,EdDSA"
    )]
    pub jwt_algorithms: Vec<String>,
    /// Required `iss` of provider tokens.
    #[arg(long, env = "AHP_RELAY_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// Accepted `aud` values of provider tokens (one must match; comma-separated or repeated).
    #[arg(long, env = "AHP_RELAY_JWT_AUDIENCE", value_delimiter = ',')]
    pub jwt_audience: Vec<String>,
    /// Clock skew accepted for provider tokens' `exp` / `nbf` (at most 5m).
    #[arg(long, env = "AHP_RELAY_JWT_LEEWAY", default_value = "5s", value_parser = crate::parse_ttl)]
    pub jwt_leeway: Duration,
    /// The claim of provider tokens that names the tenant.
    #[arg(long, env = "AHP_RELAY_JWT_CLAIM_TENANT", default_value = "tid")]
    pub jwt_claim_tenant: String,
    /// The claim that holds the role (`viewer` | `member` | `admin`, or a list: the highest counts).
    #[arg(long, env = "AHP_RELAY_JWT_CLAIM_ROLE", default_value = "role")]
    pub jwt_claim_role: String,
    /// The claim that lists the host names a token may open (absent: all of its tenant's).
    #[arg(long, env = "AHP_RELAY_JWT_CLAIM_HOSTS", default_value = "hosts")]
    pub jwt_claim_hosts: String,
    /// Deepest JSON nesting accepted in a client message (8–64); deeper is refused with a JSON-RPC error and
    /// changes nothing.
    #[arg(long, env = "AHP_RELAY_MAX_JSON_DEPTH", default_value_t = 64)]
    pub max_json_depth: usize,
    /// Largest accepted WebSocket message, in bytes.
    #[arg(long, env = "AHP_RELAY_MAX_FRAME_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_frame_bytes: usize,
    /// Frames queued per connection before it is closed as a slow consumer.
    #[arg(long, env = "AHP_RELAY_OUTBOUND_QUEUE", default_value_t = 4096)]
    pub outbound_queue: usize,
    /// Bytes queued per connection before it is closed as a slow consumer.
    #[arg(long, env = "AHP_RELAY_OUTBOUND_QUEUE_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub outbound_queue_bytes: usize,
    /// Open WebSocket connections one tenant may have (more are refused with HTTP 429).
    #[arg(long, env = "AHP_RELAY_MAX_CONNECTIONS_PER_TENANT", default_value_t = 10_000)]
    pub max_connections_per_tenant: usize,
    /// Inbound messages per second per tenant (bursts of twice that); faster senders are slowed down.
    #[arg(
        long,
        env = "AHP_RELAY_MESSAGES_PER_SECOND_PER_TENANT",
        default_value_t = 50_000.0,
        value_parser = positive_rate
    )]
    pub messages_per_second_per_tenant: f64,
    /// Inbound messages per second per connection (bursts of twice that), so one connection cannot use up
    /// its tenant's budget; faster senders are slowed down.
    #[arg(
        long,
        env = "AHP_RELAY_MESSAGES_PER_SECOND_PER_CONNECTION",
        default_value_t = 10_000.0,
        value_parser = positive_rate
    )]
    pub messages_per_second_per_connection: f64,
    /// Inbound bytes per second per tenant (bursts of twice that, and at least one largest frame); faster
    /// senders are slowed down.
    #[arg(
        long,
        env = "AHP_RELAY_BYTES_PER_SECOND_PER_TENANT",
        default_value_t = 64.0 * 1024.0 * 1024.0,
        value_parser = positive_rate
    )]
    pub bytes_per_second_per_tenant: f64,
    /// How often the relay pings an idle client (WebSocket ping), e.g. 20s.
    #[arg(long, env = "AHP_RELAY_PING_INTERVAL", default_value = "20s", value_parser = crate::parse_ttl)]
    pub ping_interval: Duration,
    /// A connection from which nothing (not even a pong) arrived for this long is closed (1001), e.g. 60s.
    #[arg(long, env = "AHP_RELAY_IDLE_TIMEOUT", default_value = "60s", value_parser = crate::parse_ttl)]
    pub idle_timeout: Duration,
    /// How long a client's call may wait for its host (e.g. a store that does not commit) before it is
    /// answered with an error, e.g. 30s. The connection's pings, shutdown and token expiry go on meanwhile (the
    /// idle check waits: the client's frames are not read during a call).
    #[arg(long, env = "AHP_RELAY_CALL_TIMEOUT", default_value = "30s", value_parser = crate::parse_ttl)]
    pub call_timeout: Duration,
}

/// The credential a deployment's shards and gateways share (the shard refuses gRPC calls without it).
#[derive(clap::Args)]
pub struct InternalArgs {
    /// Secret shared by a deployment's shards and gateways (printable ASCII, at least 32 bytes, e.g.
    /// `openssl rand -hex 32`): every internal gRPC call carries it. Required.
    #[arg(long, env = "AHP_RELAY_INTERNAL_SECRET", hide_env_values = true)]
    pub internal_secret: Option<String>,
    /// A file holding the internal secret (mode 0600 or stricter), instead of --internal-secret.
    #[arg(long, env = "AHP_RELAY_INTERNAL_SECRET_FILE")]
    pub internal_secret_file: Option<PathBuf>,
}

impl InternalArgs {
    pub fn credential(&self) -> anyhow::Result<relay_rpc::InternalCredential> {
        let secret = match (&self.internal_secret, &self.internal_secret_file) {
            (Some(secret), _) => secret.as_bytes().to_vec(),
            (None, Some(file)) => secret::read_private(file)?,
            (None, None) => anyhow::bail!(
                "an internal secret is required: set AHP_RELAY_INTERNAL_SECRET (or --internal-secret-file) to \
                 the same value on every shard and gateway, e.g. from `openssl rand -hex 32`"
            ),
        };
        Ok(relay_rpc::InternalCredential::new(&secret)?)
    }
}

/// TLS on the internal gRPC link (see `relay_rpc::tls`): PEM files.
#[derive(clap::Args, Clone, Default)]
pub struct LinkTlsArgs {
    /// This process's certificate chain: a shard's server certificate; on a gateway or runner, its client
    /// certificate for mutual TLS. With it, a shard serves TLS only.
    #[arg(long, env = "AHP_RELAY_INTERNAL_TLS_CERT", requires = "internal_tls_key")]
    pub internal_tls_cert: Option<PathBuf>,
    /// The key of --internal-tls-cert (mode 0600 or stricter).
    #[arg(long, env = "AHP_RELAY_INTERNAL_TLS_KEY", requires = "internal_tls_cert")]
    pub internal_tls_key: Option<PathBuf>,
    /// A CA certificate. On a shard: callers must present a certificate it signed (mutual TLS). On a gateway
    /// or runner: the shards' certificates must chain to it (their URLs must then be https://).
    #[arg(long, env = "AHP_RELAY_INTERNAL_TLS_CA")]
    pub internal_tls_ca: Option<PathBuf>,
}

impl LinkTlsArgs {
    pub fn load(&self) -> anyhow::Result<relay_rpc::LinkTls> {
        let read =
            |path: &PathBuf| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
        let identity = match (&self.internal_tls_cert, &self.internal_tls_key) {
            (Some(cert), Some(key)) => Some((read(cert)?, secret::read_private(key)?)),
            _ => None,
        };
        Ok(relay_rpc::LinkTls {
            identity,
            ca: self.internal_tls_ca.as_ref().map(read).transpose()?,
        })
    }

    /// The files an agent must not see (the key).
    pub fn private_files(&self) -> Vec<PathBuf> {
        self.internal_tls_key.iter().cloned().collect()
    }
}

/// Arguments of `ahp-relay serve`: everything in one process.
#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub edge: EdgeArgs,
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub sandbox: crate::agents::SandboxArgs,
    /// Print no ready-to-use admin token at start (a deployment's logs must not hold one; the container image
    /// sets this): mint tokens with `ahp-relay token` instead.
    #[arg(long, env = "AHP_RELAY_NO_DEV_TOKEN")]
    pub no_dev_token: bool,
}

/// The credential runners present to shards, apart from the internal one (a runner cannot call what gateways
/// call, and a gateway cannot register as a runner).
#[derive(clap::Args)]
pub struct RunnerSecretArgs {
    /// Secret runners present to shards (printable ASCII, at least 32 bytes, different from the internal
    /// secret). On a shard: runners may register only with it (none: no runner can register).
    #[arg(long, env = "AHP_RELAY_RUNNER_SECRET", hide_env_values = true)]
    pub runner_secret: Option<String>,
    /// A file holding the runner secret (mode 0600 or stricter), instead of --runner-secret.
    #[arg(long, env = "AHP_RELAY_RUNNER_SECRET_FILE")]
    pub runner_secret_file: Option<PathBuf>,
}

impl RunnerSecretArgs {
    /// The runner credential, if one is configured.
    pub fn credential(&self) -> anyhow::Result<Option<relay_rpc::InternalCredential>> {
        let secret = match (&self.runner_secret, &self.runner_secret_file) {
            (Some(secret), _) => secret.as_bytes().to_vec(),
            (None, Some(file)) => secret::read_private(file)?,
            (None, None) => return Ok(None),
        };
        Ok(Some(
            relay_rpc::InternalCredential::new(&secret).context("the runner secret")?,
        ))
    }
}

/// Arguments of `ahp-relay shard`: the host logic, served over gRPC to gateways.
#[derive(clap::Args)]
pub struct ShardArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub host: HostArgs,
    /// Address of the internal gRPC endpoint gateways call.
    #[arg(long, env = "AHP_RELAY_GRPC_LISTEN", default_value = "127.0.0.1:7879")]
    pub grpc_listen: SocketAddr,
    #[command(flatten)]
    pub http: crate::ops::ShardHttpArgs,
    /// Redis URL (redis://…): publish every host's bus there too, for gateways to follow.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// The gRPC URL gateways and other shards reach this shard at (it names this shard in host leases and
    /// redirects); default: http:// and the bound --grpc-listen address.
    #[arg(long, env = "AHP_RELAY_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// How long a host lease lasts unless renewed (renewed every third of it): how soon another shard takes
    /// over the hosts of a shard that died (e.g. 3s, 1500ms).
    #[arg(long, env = "AHP_RELAY_LEASE_TTL", default_value = "3s", value_parser = crate::parse_ttl)]
    pub lease_ttl: Duration,
    #[command(flatten)]
    pub internal: InternalArgs,
    #[command(flatten)]
    pub tls: LinkTlsArgs,
    /// The gateways' identity-assertion public key (Ed25519, PEM: `openssl pkey -in private.pem -pubout`):
    /// with it, `Attach`, `Events`, `Watch` and `FetchRange` need an assertion signed by the gateways'
    /// private key, and an `Attach` acts as the identity asserted — the internal secret alone no longer does.
    #[arg(long, env = "AHP_RELAY_IDENTITY_VERIFYING_KEY")]
    pub identity_verifying_key: Option<PathBuf>,
    /// Run without --identity-verifying-key: any holder of the internal secret may then act as any tenant's
    /// user. For a trusted network and tests only; without it a shard with no key refuses to start.
    #[arg(long, env = "AHP_RELAY_INSECURE_INTERNAL_LINK")]
    pub insecure_internal_link: bool,
    #[command(flatten)]
    pub runner: RunnerSecretArgs,
}

/// A rate: a finite number above zero (a rate of 0 would hold every sender for ever).
fn positive_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        Ok(_) => Err(format!("{text} is not a rate: give a number above 0")),
        Err(error) => Err(format!("{text}: {error}")),
    }
}

/// Arguments of `ahp-relay gateway`: WebSockets and auth, forwarding to a shard over gRPC.
#[derive(clap::Args)]
pub struct GatewayArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub edge: EdgeArgs,
    /// The shards' gRPC endpoints, comma-separated (or the flag repeated): hosts are placed over them and
    /// followed to whichever shard serves them.
    #[arg(
        long,
        env = "AHP_RELAY_SHARD_URL",
        default_value = "http://127.0.0.1:7879",
        value_delimiter = ','
    )]
    pub shard: Vec<String>,
    /// Redis URL (redis://…): follow hosts' buses there (repairing gaps from the shard) instead of over gRPC, and hold
    /// each tenant to its connection and rate quotas together with the other gateways sharing it.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    #[command(flatten)]
    pub internal: InternalArgs,
    #[command(flatten)]
    pub tls: LinkTlsArgs,
    /// The gateways' identity-assertion private key (Ed25519, PEM: `openssl genpkey -algorithm ed25519`;
    /// mode 0600 or stricter): signs who each connection is, for shards given --identity-verifying-key.
    #[arg(long, env = "AHP_RELAY_IDENTITY_SIGNING_KEY")]
    pub identity_signing_key: Option<PathBuf>,
}

/// Where the relay keeps its state.
#[derive(clap::Args)]
pub struct StoreArgs {
    /// Postgres URL (postgres://…); default: SQLite in --data-dir.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    #[arg(long, env = "AHP_RELAY_DATA_DIR", default_value = ".relay-data")]
    pub data_dir: PathBuf,
}

/// The store URL: the given database, or the SQLite file in the data dir.
pub fn store_url(database_url: Option<&str>, data_dir: &std::path::Path) -> anyhow::Result<String> {
    if let Some(url) = database_url {
        return Ok(url.to_string());
    }
    crate::secret::create_private_dir(data_dir)?;
    Ok(format!("sqlite://{}", data_dir.join("relay.sqlite").display()))
}

/// Connect to the store and bring its schema up to date.
pub async fn open_store(
    database_url: Option<&str>,
    data_dir: &std::path::Path,
) -> anyhow::Result<relay_store::Store> {
    let url = store_url(database_url, data_dir)?;
    let store = relay_store::Store::connect(&url)
        .await
        .context("connecting to the store")?;
    store.migrate().await.context("running migrations")?;
    Ok(store)
}

impl HostArgs {
    fn apply(&self, limits: Limits) -> Limits {
        Limits {
            replay_buffer_envelopes: self.replay_buffer.max(1),
            active_client_grace: Duration::from_millis(self.active_client_grace_ms),
            snapshot_every_actions: self.snapshot_every_actions.max(1),
            snapshot_every: self.snapshot_every,
            retention: self.retention,
            retained_turns: self.retained_turns.max(1),
            retained_turn_bytes: self.retained_turn_bytes.max(1),
            max_turns_per_chat: self.max_turns_per_chat.max(1),
            fetch_turns_page: self.fetch_turns_page.max(1),
            max_hosts_per_tenant: self.max_hosts_per_tenant.max(1),
            max_sessions_per_host: self.max_sessions_per_host.max(1),
            max_chats_per_session: self.max_chats_per_session.max(1),
            max_subscriptions_per_connection: self.max_subscriptions_per_connection.max(1),
            // Never before a disconnected client's grace ends: its expiry must still reach the host.
            idle_host_after: self
                .idle_host_timeout
                .max(Duration::from_millis(self.active_client_grace_ms) + Duration::from_secs(1)),
            max_reply_bytes: self.max_reply_bytes.max(64 * 1024),
            replay_buffer_bytes: self.replay_buffer_bytes,
            device_terminals: self.device_terminals,
            content_ref_bytes: self.content_ref_bytes.max(256),
            ..limits
        }
    }
}

impl EdgeArgs {
    /// How tokens are checked: the identity provider's keys when configured, else the HS256 secret.
    async fn verifier(&self, secret: &[u8]) -> anyhow::Result<TokenVerifier> {
        if self.jwt_public_key_file.is_empty() && self.jwks_url.is_none() {
            return Ok(TokenVerifier::hs256(secret));
        }
        anyhow::ensure!(
            self.jwt_public_key_file.is_empty() || self.jwks_url.is_none(),
            "give the identity provider's keys as --jwt-public-key-file or --jwks-url, not both"
        );
        // Without both, a token the provider issued for another application (or another issuer using the same
        // keys, e.g. a multi-tenant provider) would be accepted here.
        anyhow::ensure!(
            self.jwt_issuer.as_deref().is_some_and(|issuer| !issuer.trim().is_empty())
                && self.jwt_audience.iter().any(|audience| !audience.trim().is_empty()),
            "an identity provider needs --jwt-issuer and --jwt-audience (its tokens' `iss` and an `aud` meant for \
             this relay): without them tokens issued for other applications would be accepted"
        );
        let algorithms = self
            .jwt_algorithms
            .iter()
            .map(|name| {
                name.trim()
                    .parse::<relay_gateway::oidc::Algorithm>()
                    .with_context(|| format!("unknown JWT algorithm {name}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let settings = relay_gateway::oidc::ProviderSettings {
            algorithms,
            issuer: self.jwt_issuer.clone(),
            audience: self.jwt_audience.clone(),
            leeway_seconds: self.jwt_leeway.as_secs(),
            claims: relay_gateway::oidc::ClaimNames {
                tenant: self.jwt_claim_tenant.clone(),
                role: self.jwt_claim_role.clone(),
                hosts: self.jwt_claim_hosts.clone(),
            },
        };
        let provider = match &self.jwks_url {
            Some(url) => {
                let jwks = relay_gateway::jwks::JwksKeys::start(relay_gateway::jwks::JwksSettings {
                    url: url.clone(),
                    refresh_every: self.jwks_refresh.max(Duration::from_secs(1)),
                    min_refetch: self.jwks_min_refetch,
                    timeout: self.jwks_timeout.max(Duration::from_millis(100)),
                })
                .await?;
                tracing::info!(url, "tokens checked with the identity provider's JWKS");
                relay_gateway::oidc::IdentityProvider::from_jwks(jwks, settings)?
            }
            None => {
                tracing::info!(
                    keys = self.jwt_public_key_file.len(),
                    "tokens checked with the identity provider's keys"
                );
                relay_gateway::oidc::IdentityProvider::from_pem_files(&self.jwt_public_key_file, settings)?
            }
        };
        Ok(TokenVerifier::provider(provider))
    }

    fn apply(&self, limits: Limits) -> Limits {
        Limits {
            ping_interval: self.ping_interval.max(Duration::from_millis(10)),
            idle_timeout: self.idle_timeout.max(Duration::from_millis(10)),
            call_timeout: self.call_timeout.max(Duration::from_millis(10)),
            max_frame_bytes: self.max_frame_bytes.max(1024),
            max_json_depth: self.max_json_depth.clamp(8, 64),
            outbound_queue_frames: self.outbound_queue.max(16),
            outbound_queue_bytes: self.outbound_queue_bytes.max(64 * 1024),
            ..limits
        }
    }
}

/// Where a host's ACP agents run.
enum AgentPlacement {
    /// In this process (the embedded relay), in sandboxes, never reaching what `protected` names.
    InProcess {
        sandbox: crate::agents::SandboxArgs,
        protected: crate::agents::Protected,
    },
    /// On the `ahp-relay runner` processes registered in this pool (a shard).
    Runners(Arc<relay_rpc::RunnerPool>),
}

/// The demo agent's workspace under `data_dir` (`workspaces/`), sandboxed as agents' are, and the tenants'
/// file servers there; or why this machine cannot give it one.
async fn demo_workspace(
    data_dir: &std::path::Path,
    host: &HostArgs,
    sandbox: &crate::agents::SandboxArgs,
    protected: crate::agents::Protected,
) -> anyhow::Result<(
    relay_runner::DemoWorkspace,
    Arc<dyn relay_runner::files::FileAccess>,
)> {
    // The data directory stays its owner's alone (it holds the store and the signing secret).
    crate::secret::create_private_dir(data_dir)?;
    let root = std::path::absolute(data_dir.join("workspaces"))?;
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let root = root.canonicalize()?;
    // No agents file: this text stands for one (its path names it in errors, and is never shown to agents).
    let path = data_dir.join("demo-workspace.toml");
    let text = format!("workspace_root = {:?}\n", root.display().to_string());
    let file = relay_runner::acp::AgentsFile::parse(&path, &text)?;
    let sandboxes = crate::agents::sandboxes(&file, &path, sandbox, protected).await?;
    let program = std::env::current_exe().context("finding this program's path (it serves files)")?;
    let files: Arc<dyn relay_runner::files::FileAccess> =
        relay_runner::files::FileService::new(sandboxes, program, host.max_file_bytes, host.file_server_idle);
    Ok((
        relay_runner::DemoWorkspace {
            root,
            files: files.clone(),
        },
        files,
    ))
}

/// The host logic on its store, with the demo provider and the retention job.
async fn open_hosts(
    data: &DataArgs,
    host: &HostArgs,
    limits: Limits,
    redis: Option<RedisPublisher>,
    ownership: Option<relay_shard::ownership::Ownership>,
    placement: AgentPlacement,
) -> anyhow::Result<Arc<ShardLink>> {
    let mut demo = DemoProvider::new(DemoPace {
        step: Duration::from_millis(host.demo_step_ms),
    });
    let mut demo_files = None;
    if let (None, true, AgentPlacement::InProcess { sandbox, protected }) =
        (&host.agents, host.demo_workspace, &placement)
    {
        if sandbox.unsafe_no_sandbox {
            tracing::warn!("--unsafe-no-sandbox: the demo agent gets no workspace (its file server would run unconfined)");
        } else {
            match demo_workspace(&data.data_dir, host, sandbox, protected.clone()).await {
                Ok((workspace, files)) => {
                    tracing::info!(root = %workspace.root.display(), "the demo agent works in a workspace under the data directory");
                    demo = demo.with_workspace(workspace);
                    demo_files = Some(files);
                }
                Err(error) => tracing::warn!(
                    "the demo agent runs without a workspace (no Files, Changes or Terminal panes): {error:#}"
                ),
            }
        }
    }
    let mut providers = ProviderRegistry::new().with(Arc::new(demo));
    if let Some(files) = demo_files {
        providers = providers.with_files(files);
    }
    if let Some(path) = &host.agents {
        let file = relay_runner::acp::AgentsFile::load(path)?;
        match placement {
            AgentPlacement::InProcess { sandbox, protected } => {
                let sandboxes = crate::agents::sandboxes(&file, path, &sandbox, protected).await?;
                for agent in relay_runner::acp::AcpProvider::from_file(
                    &file,
                    &sandboxes,
                    &relay_runner::acp::KeptShells::default(),
                ) {
                    providers = providers.with(Arc::new(agent));
                }
                // Tenants' files (resource*), served from a sandbox of each tenant by this program.
                let program =
                    std::env::current_exe().context("finding this program's path (it serves files)")?;
                providers = providers.with_files(relay_runner::files::FileService::new(
                    sandboxes.clone(),
                    program,
                    host.max_file_bytes,
                    host.file_server_idle,
                ));
            }
            AgentPlacement::Runners(pool) => {
                for agent in &file.agents {
                    let info = relay_runner::acp::agent_info(agent);
                    providers = providers.with(Arc::new(relay_rpc::RemoteAgent::new(info, pool.clone())));
                }
                // Tenants' files are on the runners: asked through them.
                providers = providers.with_files(relay_rpc::remote_files::RemoteFiles::new(pool.clone()));
            }
        }
        tracing::info!(agents = file.agents.len(), path = %path.display(), "ACP agents configured");
    }
    let store = open_store(host.database_url.as_deref(), &data.data_dir).await?;
    let quota = (host.max_stored_bytes_per_tenant > 0).then(|| {
        relay_shard::storage::StorageQuota::start(
            store.clone(),
            host.max_stored_bytes_per_tenant,
            host.storage_check_every,
        )
    });
    let mut link = ShardLink::new(limits, providers, store, redis);
    if let Some(quota) = quota {
        link = link.with_storage_quota(quota);
    }
    if let Some(ownership) = ownership {
        link = link.with_ownership(ownership);
    }
    let link = Arc::new(link);
    link.keep_leases();
    link.evict_idle_hosts();
    spawn_retention(link.clone(), host.compact_every);
    Ok(link)
}

/// Commit whatever agents produced after the last reply before the process exits.
async fn flush(link: &ShardLink) {
    if tokio::time::timeout(Duration::from_secs(10), link.flush_all())
        .await
        .is_err()
    {
        tracing::warn!("the store did not take the last batches within 10s");
    }
}

/// `ahp-relay serve`.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let _observability = crate::observe::init("serve", &[Side::Gateway, Side::Shard])?;
    let limits = args.edge.apply(args.host.apply(Limits::default()));
    let mut ports = vec![(args.edge.listen.port(), "this relay's own port".to_string())];
    if let Some(port) = args
        .host
        .database_url
        .as_deref()
        .and_then(crate::agents::url_port)
    {
        ports.push((port, "the store's (Postgres) port".into()));
    }
    let protected = crate::agents::Protected {
        paths: [
            Some(args.data.data_dir.clone()),
            args.edge.jwt_secret_file.clone(),
        ]
        .into_iter()
        .flatten()
        .collect(),
        ports,
    };
    let link = open_hosts(
        &args.data,
        &args.host,
        limits.clone(),
        None,
        None,
        AgentPlacement::InProcess {
            sandbox: args.sandbox.clone(),
            protected,
        },
    )
    .await?;
    let dev_token = if args.no_dev_token {
        DevToken::Omitted
    } else {
        DevToken::Print
    };
    serve_edge(&args.data, &args.edge, limits, link.clone(), dev_token, None).await?;
    flush(&link).await;
    Ok(())
}

/// `ahp-relay shard`.
pub async fn run_shard(args: ShardArgs) -> anyhow::Result<()> {
    let _observability = crate::observe::init("shard", &[Side::Shard])?;
    let limits = args.host.apply(Limits::default());
    let credential = args.internal.credential()?;
    let runner_credential = args.runner.credential()?;
    if let Some(runner) = &runner_credential {
        anyhow::ensure!(
            !runner.same_secret_as(&credential),
            "the runner secret must differ from the internal secret: runners must not be able to call what \
             gateways call"
        );
    }
    if args.host.agents.is_some() && runner_credential.is_none() {
        anyhow::bail!(
            "--agents places sessions on runners, which register with the runner secret: set \
             AHP_RELAY_RUNNER_SECRET (or --runner-secret-file) on the shards and the runners"
        );
    }
    let redis = match &args.redis_url {
        Some(url) => Some(
            RedisPublisher::connect(url)
                .await
                .context("connecting to Redis")?,
        ),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(args.grpc_listen)
        .await
        .with_context(|| format!("binding {}", args.grpc_listen))?;
    let addr = listener.local_addr()?;
    let tls = args.tls.load()?;
    let assertions = match &args.identity_verifying_key {
        Some(path) => {
            let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            Some(Arc::new(
                relay_rpc::AssertionVerifier::from_pem(&pem)
                    .with_context(|| format!("loading {}", path.display()))?,
            ))
        }
        None if args.insecure_internal_link => {
            tracing::warn!(
                "--insecure-internal-link: this shard takes the identity a holder of the internal secret names"
            );
            None
        }
        None => anyhow::bail!(
            "no --identity-verifying-key: a shard acts for a tenant's user only on what the gateways signed. Give \
             it the gateways' public key (AHP_RELAY_IDENTITY_VERIFYING_KEY; the gateways take the private key as \
             --identity-signing-key), or pass --insecure-internal-link to let any holder of the internal secret \
             name the tenant (a trusted network, or tests)"
        ),
    };
    let scheme = if tls.identity.is_some() { "https" } else { "http" };
    let advertise = args
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{addr}"));
    let ownership = relay_shard::ownership::Ownership::new(&advertise, args.lease_ttl);
    let runners = relay_rpc::RunnerPool::new();
    let link = open_hosts(
        &args.data,
        &args.host,
        limits,
        redis,
        Some(ownership),
        AgentPlacement::Runners(runners.clone()),
    )
    .await?;
    let grpc_serving = crate::ops::serve_shard_http(&args.http, link.clone()).await?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "ahp-relay {} shard listening on grpc {scheme}://{addr}",
            env!("CARGO_PKG_VERSION")
        )?;
        out.flush()?;
    }
    let shutdown = grpc_serving.until(wait_for_signal());
    let draining = link.clone();
    let runners_closing = runners.clone();
    relay_rpc::serve_secured(
        listener,
        link.clone(),
        runners,
        &credential,
        runner_credential.as_ref(),
        relay_rpc::ShardSecurity { tls, assertions },
        async move {
            shutdown.await;
            // Runners stop the agents they ran for this shard; their sessions go with the hosts to the next one.
            runners_closing.close();
            tracing::info!("shutting down: committing, releasing host leases");
            // Commits what is queued, closes every host's bus (gateways move their clients) and releases the
            // leases; the gRPC server then finishes the calls in flight.
            if tokio::time::timeout(Duration::from_secs(10), draining.drain())
                .await
                .is_err()
            {
                tracing::warn!("draining did not finish within 10s; unreleased leases will lapse");
            }
        },
    )
    .await?;
    Ok(())
}

/// `ahp-relay gateway`.
pub async fn run_gateway(args: GatewayArgs) -> anyhow::Result<()> {
    let _observability = crate::observe::init("gateway", &[Side::Gateway])?;
    let limits = args.edge.apply(Limits::default());
    let shards: Vec<String> = args
        .shard
        .iter()
        .map(|url| url.trim().to_string())
        .filter(|url| !url.is_empty())
        .collect();
    anyhow::ensure!(!shards.is_empty(), "--shard names no shard");
    let link = Arc::new(relay_rpc::ShardRouter::new(
        &shards,
        limits.bus_capacity,
        args.redis_url.as_deref(),
        args.internal.credential()?,
        args.tls.load()?,
        match &args.identity_signing_key {
            Some(path) => Some(Arc::new(
                relay_rpc::AssertionSigner::from_pem(&secret::read_private(path)?)
                    .with_context(|| format!("loading {}", path.display()))?,
            )),
            None => None,
        },
    )?);
    // Gateways sharing a Redis hold each tenant to its quotas together.
    serve_edge(
        &args.data,
        &args.edge,
        limits,
        link,
        DevToken::Silent,
        args.redis_url.as_deref(),
    )
    .await
}

/// Whether the edge prints a ready dev token at start: only the embedded relay, for its own local use, unless
/// told not to (`--no-dev-token`, as in the container image). A gateway never does (its output lands in a
/// deployment's logs).
#[derive(Clone, Copy, PartialEq, Eq)]
enum DevToken {
    Print,
    /// `serve --no-dev-token`: says how to mint one instead.
    Omitted,
    Silent,
}

/// The WebSocket side: auth, quotas, delivery, until SIGTERM / Ctrl-C closes every connection with 1012.
async fn serve_edge<L: HostLink>(
    data: &DataArgs,
    edge: &EdgeArgs,
    limits: Limits,
    link: Arc<L>,
    dev_token: DevToken,
    shared_quotas_redis: Option<&str>,
) -> anyhow::Result<()> {
    let secret = secret::load_or_create(secret::SecretSource {
        explicit: edge.jwt_secret.as_deref(),
        file: edge.jwt_secret_file.as_deref(),
        data_dir: &data.data_dir,
    })?;
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let quotas = relay_gateway::quotas::TenantQuotas::new(relay_gateway::quotas::QuotaLimits {
        max_connections: edge.max_connections_per_tenant.max(1),
        messages_per_second: edge.messages_per_second_per_tenant.max(1.0),
        message_burst: (edge.messages_per_second_per_tenant * 2.0).max(1.0),
        connection_messages_per_second: edge.messages_per_second_per_connection.max(1.0),
        connection_message_burst: (edge.messages_per_second_per_connection * 2.0).max(1.0),
        bytes_per_second: edge.bytes_per_second_per_tenant.max(1024.0),
        byte_burst: (edge.bytes_per_second_per_tenant * 2.0).max(edge.max_frame_bytes as f64),
    });
    if let Some(url) = shared_quotas_redis {
        quotas.share_through_redis(url.to_string()).await;
    }
    let verifier = edge.verifier(&secret).await?;
    let app = relay_gateway::router(Arc::new(GatewayState {
        link,
        verifier,
        limits,
        shutdown: shutdown_rx,
        quotas: quotas.clone(),
        allowed_origins: relay_gateway::origin::AllowedOrigins::new(&edge.allowed_origins),
        web_sign_in: relay_gateway::sign_in::WebSignIn {
            sign_in_url: edge.sign_in_url.clone(),
        },
        trusted_proxies: relay_gateway::auth_throttle::TrustedProxies::parse(&edge.trusted_proxies)
            .context("--trusted-proxies")?,
    }));
    let listener = tokio::net::TcpListener::bind(edge.listen)
        .await
        .with_context(|| format!("binding {}", edge.listen))?;
    let addr = listener.local_addr()?;
    // Frames are small and latency matters more than packing: no Nagle delay on client sockets.
    let listener = axum::serve::ListenerExt::tap_io(listener, |stream: &mut tokio::net::TcpStream| {
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
    });
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "ahp-relay {} listening on ws://{addr}/v1/ws",
            env!("CARGO_PKG_VERSION")
        )?;
        if dev_token == DevToken::Print {
            let token = mint_hs256(
                &secret,
                &Claims::new(
                    "dev",
                    "dev-user",
                    Role::Admin,
                    None,
                    Duration::from_secs(24 * 3600),
                ),
            )?;
            writeln!(
                out,
                "dev token (tenant dev, user dev-user, role admin, valid 24h):"
            )?;
            writeln!(out, "{token}")?;
            // The token travels in the fragment: browsers never send it to the server, log it or put it in
            // a Referer.
            let page = if addr.ip().is_unspecified() {
                SocketAddr::from(([127, 0, 0, 1], addr.port()))
            } else {
                addr
            };
            writeln!(out, "open the web client: http://{page}/#token={token}")?;
            writeln!(out, "try it: ahp-relay chat --url ws://{addr}/v1/ws")?;
        } else if dev_token == DevToken::Omitted {
            writeln!(
                out,
                "no token printed: mint one with `ahp-relay token --tenant TENANT --sub USER --role admin` (same \
                 --data-dir or --jwt-secret-file)"
            )?;
        }
        out.flush()?;
    }

    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async move {
            wait_for_signal().await;
            tracing::info!("shutting down: closing client connections");
            let _ = shutdown_tx.send(true);
        })
        .await
        .context("serving")?;
    // Upgraded WebSockets outlive the HTTP server: let each finish sending its close frame before exiting.
    if tokio::time::timeout(Duration::from_secs(5), quotas.wait_idle())
        .await
        .is_err()
    {
        tracing::warn!("some connections did not close within 5s");
    }
    Ok(())
}

/// The retention job: compacts old log rows into snapshots on a fixed period.
fn spawn_retention(link: Arc<ShardLink>, every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_secs(1)));
        loop {
            tick.tick().await;
            match link.compact().await {
                Ok(0) => {}
                Ok(rows) => tracing::info!(rows, "compacted old action log rows"),
                Err(error) => tracing::warn!(%error, "retention job failed"),
            }
        }
    });
}

pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
