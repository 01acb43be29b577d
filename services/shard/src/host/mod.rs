//! The host's core: its one lock and what it guards ([`state`]), how a host opens ([`open`]) and restores
//! sessions from the store ([`restore`], [`preload`]), the sequencer that numbers everything it changes
//! ([`sequencer`]), the committer that writes each batch before anything of it is published ([`committer`],
//! [`batches`], [`commit_thread`], [`salvage`]), who may serve it ([`ownership`]), who may open a connection on
//! it ([`admission`], [`connections`], [`active_clients`]), the newest envelopes kept for exact replay
//! ([`replay_buffer`]) and those each client is owed ([`owed`]), its tenant's quota ([`storage`]) and readiness
//! ([`health`]), and its agents' way back in ([`sink`]).
//!
//! Rules of this floor: nothing here awaits while holding the host's lock (`HostCore` is only reached through
//! `Host::with_core`, which is synchronous); nothing is published before its batch commits; nothing here
//! imports a command handler (those are [`crate::commands`]). The floors are floors of imports: `Host` and
//! `HostCore` gain behaviour from `impl` blocks on every floor, so the host does call up through its own
//! methods (`route`, `apply_agent_action`, `archive_turns`, `adopt_terminals`), never by naming a file above it.

pub mod active_clients;
pub mod admission;
pub mod batches;
pub mod commit_thread;
pub mod committer;
pub mod connections;
pub mod failed_units;
pub mod health;
pub mod open;
pub mod owed;
pub mod ownership;
pub mod pending_batch;
pub mod preload;
pub mod publisher;
pub mod replay_buffer;
pub mod restore;
pub mod salvage;
pub mod sequencer;
pub mod sink;
pub mod state;
pub mod storage;
pub mod turn_windows;

pub use state::*;
