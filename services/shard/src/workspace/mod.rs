//! The tenant's workspace as a host shows it: files through the tenant's file server ([`resources`]), watches
//! of its paths ([`watches`]), what a session's turns changed ([`changesets`]), terminals devices open
//! ([`device_terminals`]), a chat's `!command` run in one ([`command_turns`]), the terminals agents run
//! ([`terminals`]), content held by reference ([`content_refs`]), and what a token scoped to hosts may reach ([`host_scope`]).
//!
//! Rules of this floor: the relay never touches a tenant's files itself — every file operation goes to the
//! tenant's file server (sandboxed); nothing awaits while holding the host's lock (file work runs outside it
//! and comes back through `Host::with_core`).

pub mod changesets;
pub mod command_turns;
pub mod content_refs;
pub mod device_terminals;
pub mod host_scope;
pub mod resources;
pub mod terminals;
pub mod watches;
