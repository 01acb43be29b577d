//! Agent providers: what runs a turn and turns the agent's output into AHP actions.
//!
//! The host tells a [`Provider`] that a turn started and forwards the user's decisions about it
//! ([`TurnControl`]); the provider answers only by emitting server actions through a [`ChatSink`], which the
//! host validates, sequences and publishes like any other action. Providers never see connections, tenants or
//! storage.

pub mod acp;
pub mod demo;
pub mod files;
pub mod git;
pub mod provider;
pub mod pty;
pub mod shell_integration;

pub use demo::{DemoPace, DemoProvider, DemoWorkspace};
pub use provider::{
    ChatSink, ClientTool, Emitted, Provider, ProviderRegistry, Room, SessionRequest, SessionStart,
    TerminalKey, TerminalRequest, TerminalStarted, TurnAttachment, TurnControl, TurnHandle, TurnRequest,
    AGENT_STATE_META,
};
