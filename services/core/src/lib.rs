//! Types the gateway and the shard share, and nothing else.
//!
//! The gateway (WebSockets, auth, fan-out) and the shard (validation, reducers, sequencing) meet only through
//! [`link::HostLink`]: a connection attaches to a host's [`bus`], sends raw JSON-RPC frames, and gets back a
//! [`link::CommandReply`]. The embedded relay implements that trait with in-process calls; the distributed
//! deployment implements it with gRPC and Redis without touching either side.

pub mod bus;
pub mod channel_names;
pub mod heavy;
pub mod identity;
pub mod limits;
pub mod link;
pub mod rpc;
pub mod telemetry;

pub use bus::{Audience, BusEvent, BusEventKind};
pub use identity::{ConnectionId, HostKey, Identity, Role};
pub use limits::Limits;
pub use link::{CloseRequest, CommandReply, HostLink, LinkError, NotReady, SubscriptionChange};
