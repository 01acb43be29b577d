//! The Redis side of the host bus (design §4, invariant 10): how a [`BusEvent`](relay_core::bus::BusEvent) is
//! encoded on the wire ([`codec`]), which Redis channel a host publishes on ([`channel`]), the shard-side
//! [`RedisPublisher`] and the gateway-side [`RedisSubscriber`], which detects lost messages and repairs them
//! through a [`GapRepair`] source. Both accept `redis://` and, for TLS, `rediss://` URLs, with a password
//! (`redis://:PASSWORD@host:port`) or an ACL user (`redis://USER:PASSWORD@…`).

pub mod channel;
pub mod codec;
pub mod publisher;
pub mod subscriber;
mod tls;

pub use channel::channel_name;
pub use codec::{decode, decode_batch, encode, encode_batch, CodecError};
pub use publisher::{PublishError, RedisPublisher};
pub use subscriber::{BoxFuture, GapRepair, RedisSubscriber, RepairError, SubscribeError, SubscriberOptions};
