//! Internal gRPC between gateways and shards (design §4): [`HostLink`](relay_core::HostLink) over the network.
//!
//! [`server::ShardService`] serves any `HostLink` (in practice `relay_shard::ShardLink`) as the `ahp_relay.v1.Shard`
//! service of `proto/relay.proto`; [`client::RemoteShard`] is a `HostLink` that calls such a server, so a gateway
//! runs unchanged against a shard in another process. AHP frames travel as opaque JSON bytes and are never
//! re-modelled in protobuf.
//!
//! A gateway follows each host it has connections on through one `Events` stream (the host's bus over gRPC);
//! the distributed deployment will carry the bus over Redis instead.
//!
//! Limitation: connection ids come from [`relay_core::ConnectionId::next`], which is unique per process only.
//! Two gateways attached to the same shard may therefore use the same id for different connections; until ids
//! are prefixed per gateway, run one gateway per shard or accept that such collisions mix up the two
//! connections' protocol state on the shard.

pub mod client;
mod convert;
pub mod server;

/// The code generated from `proto/relay.proto`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("ahp_relay.v1");
}

pub use client::{ClientError, RemoteShard};
pub use server::{serve, ShardService};

/// Largest gRPC message either side accepts: above the largest WebSocket frame and any snapshot reply.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;
