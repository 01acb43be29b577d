//! The shard: authoritative host logic.
//!
//! A shard owns hosts ([`host::Host`]); each host validates client actions, applies the official `ahp`
//! reducers, numbers every envelope in its single `serverSeq` space, commits it to the store before publishing
//! it to its bus, keeps the newest envelopes for exact replay, restores sessions lazily from the store, and
//! runs the host side effects (provider turns, queued messages, active clients). [`ShardLink`] is the in-process implementation of the gateway↔shard interface.

pub mod commands;
pub mod error;
pub mod harness;
pub mod host;
pub mod link;
pub mod model;
pub mod replay;
pub mod reply;
pub mod validate;
pub mod versions;
pub mod workspace;

pub use host::Host;
pub use host::{commit_thread, ownership, storage};
pub use link::ShardLink;
