//! The built-in `demo` provider: a deterministic agent that needs no network and no model.
//!
//! It exercises every part of a turn that clients must handle: a reasoning part, a markdown reply streamed in
//! several `chat/delta`s, usage, a session title, a tool call that needs confirmation (when the prompt contains
//! "tool"; its result is the prompt as text and as a file edit appending it to `notes.md`), a tool call that an active client of the session runs itself (when it contains "client tool" and a
//! client offers a tool), an input request (when the prompt contains "input"), and a reply showing what Markdown
//! clients render — a table, a block quote, a fenced code block — when it contains "markdown". It stops promptly on
//! [`crate::TurnControl::Cancelled`], and answers a steering message ([`crate::TurnControl::Steer`]) at the end of its reply.
//! Its pace is configurable so tests can stream slowly enough to interrupt.
//!
//! Given a workspace ([`DemoWorkspace`]: `serve` with no agents file, where this machine can sandbox), each
//! session gets a directory of its own and each turn appends its prompt to `notes.md` there — a change to
//! review in the Files and Changes panes. Both are written by the tenant's file server, in its sandbox.
//!
//! Rooms: [`provider`] (how it is listed, its sessions) above [`turn`] (one turn) above [`workspace`] (where it
//! writes, how fast it streams). Nothing here touches a host's state: it speaks only through the session's
//! `ChatSink`, like every agent.

mod provider;
mod turn;
mod workspace;

pub use provider::DemoProvider;
pub use turn::reply_chunks;
pub use workspace::{DemoPace, DemoWorkspace};
