//! The command-line arguments of `serve`, `shard` and `gateway` (and what `runner`, `migrate` and `compact` share
//! with them), and opening the store they name.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

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
pub(crate) fn positive_rate(text: &str) -> Result<f64, String> {
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
