//! The shard: authoritative host logic.
//!
//! A shard owns hosts ([`host::Host`]); each host validates client actions, applies the official `ahp`
//! reducers, numbers every envelope in its single `serverSeq` space, commits it to the store before publishing
//! it to its bus, keeps the newest envelopes for exact replay, restores sessions lazily from the store, and
//! runs the host side effects (provider turns, queued messages, active clients). [`ShardLink`] is the in-process implementation of the gateway↔shard interface.

pub mod active_clients;
pub mod admission;
pub mod agent_context;
pub mod aging;
pub mod archive;
pub mod attachments;
pub mod batches;
pub mod branches;
pub mod call;
pub mod catalog;
pub mod changesets;
pub mod chats;
pub mod commands;
pub mod commit_thread;
pub mod committer;
pub mod completions;
pub mod config_assist;
pub mod connections;
pub mod content_refs;
pub mod device_terminals;
pub mod dispatch;
pub mod error;
pub mod failed_units;
pub mod gap_repair;
pub mod harness;
pub mod health;
pub mod history;
pub mod host;
pub mod host_scope;
pub mod input_needed;
pub mod link;
pub mod model;
pub mod open;
pub mod owed;
pub mod ownership;
pub mod preload;
pub mod replay;
pub mod reply;
pub mod resources;
pub mod restore;
pub mod resume;
pub mod salvage;
pub mod sequencer;
pub mod sessions;
pub mod sink;
pub mod storage;
pub mod summaries;
pub mod terminals;
pub mod turns;
pub mod validate;
pub mod versions;
pub mod watches;

pub use host::Host;
pub use link::ShardLink;
