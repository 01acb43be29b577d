//! The protocol's commands: a connection's message from its arrival at the host ([`call`]: loading what it
//! names, the commands that await) to the one router under the host's lock ([`router`]), and one file per
//! family: sessions, chats, turns, the catalogue, completions, config assistance, branches, attachments, the
//! actions clients and agents dispatch ([`dispatch`]), and what follows them (summaries, `inputNeeded`).
//!
//! Rules of this floor: handlers answer through [`crate::reply`] and never import the router (nothing below
//! imports this folder's router or `call`); state changes only through the reducers in [`crate::model`] and
//! the sequencer; locked handlers never await.

pub mod attachments;
pub mod authorship;
pub mod branches;
pub mod call;
pub mod catalog;
pub mod chats;
pub mod completions;
pub mod config_assist;
pub mod dispatch;
pub mod input_needed;
pub mod router;
pub mod sessions;
pub mod summaries;
pub mod text_search;
pub mod titles;
pub mod turns;
