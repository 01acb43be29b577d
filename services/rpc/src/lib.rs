//! Internal gRPC between gateways and shards (design §4): [`HostLink`](relay_core::HostLink) over the network.
//!
//! [`server::ShardService`] serves a `HostLink` that is also a [`bus_history::BusHistory`] (`relay_shard::ShardLink`) as the
//! `ahp_relay.v1.Shard` service of `proto/relay.proto`; [`client::RemoteShard`] is a `HostLink` that calls such a server, so a gateway
//! runs unchanged against a shard in another process. AHP frames travel as opaque JSON bytes and are never
//! re-modelled in protobuf.
//!
//! A gateway follows each host it has connections on through one `Events` stream (the host's bus over gRPC),
//! or, given a Redis URL, through Redis pub/sub, repairing lost messages with `FetchRange`.
//!
//! With several shards, [`router::ShardRouter`] places each host on a shard and follows redirects when its
//! ownership moves (see its docs).
//!
//! Agents run in `ahp-relay runner` processes that register with the shards ([`runner`]); a shard places
//! sessions on them through [`remote_agent::RemoteAgent`] providers.
//!
//! Every call carries the deployment's internal credential ([`credential`]); a shard refuses calls without
//! it.
//!
//! Trace context travels as W3C `traceparent` metadata ([`trace`]): a shard's `Call` span continues the
//! gateway's `ahp.call` span.
//!
//! Connection ids come from [`relay_core::ConnectionId::next`], prefixed per gateway process, so several
//! gateways can attach connections to one shard.

pub mod assertion;
pub mod bus_history;
pub mod client;
mod convert;
pub mod credential;
mod file_requests;
pub mod gateway_streams;
pub mod placement;
pub mod remote_agent;
pub mod remote_files;
pub mod remote_terminals;
pub mod router;
pub mod runner;
pub mod runner_reports;
pub mod runner_stream;
pub mod runners_service;
pub mod server;
pub mod shard_repair;
pub mod tls;
pub mod trace;
pub mod work_queue;

/// The code generated from `proto/relay.proto`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("ahp_relay.v1");
}

pub use assertion::{AssertionSigner, AssertionVerifier};
pub use bus_history::{BusHistory, HistoryError};
pub use client::{ClientError, RemoteShard};
pub use credential::{CredentialError, InternalCredential};
pub use placement::RunnerPool;
pub use remote_agent::RemoteAgent;
pub use router::ShardRouter;
pub use runners_service::RunnersService;
pub use server::{serve, serve_secured, serve_with_runners, ShardSecurity, ShardService};
pub use shard_repair::ShardRepair;
pub use tls::{LinkTls, TlsError};

/// The response metadata key naming the shard that serves a host (its gRPC URL) on a FAILED_PRECONDITION
/// answer: the gateway asks that shard instead.
pub const OWNER_METADATA: &str = "ahp-relay-owner";

/// Largest gRPC message either side accepts: above the largest WebSocket frame and any snapshot reply.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

/// HTTP/2 pings on the gateway↔shard link, both ways, this often…
pub const LINK_KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// …and the link is closed when one is not answered this soon: a partitioned gateway's streams end (its
/// connections are detached after the gateway-stream grace), and a gateway stops waiting on a shard it cannot
/// reach.
pub const LINK_KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
