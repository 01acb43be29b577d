//! ACP agents as AHP providers: the relay is the ACP *client* and the AHP *host*.
//!
//! Each session (keyed by tenant, host and URI: URIs are unique only within a host) gets its own agent
//! subprocess ([`session`]), started by `createSession` in a sandbox of its own ([`sandboxes`]) in the
//! session's working directory under the tenant's part of the workspace ([`workspace`]), with exactly the
//! environment and credentials its configuration gives the tenant ([`config`]), within the tenant's quotas
//! ([`quota`], [`meter`]). Its turns are mapped both ways by [`turn`]; the files it reads and writes through
//! the relay stay inside its working directory ([`fs`]). Disposing the session (or the relay stopping) kills
//! the agent's sandbox, and disposing removes its directories.
//!
//! Rooms, bottom up: the turn's mapping ([`turn`], [`turn_tools`], [`turn_content`]), what a session and its
//! turns share ([`agent_link`]), the worker ([`session`], with [`chat_sessions`] and [`prompt_turn`]), the
//! provider ([`provider`]). Nothing here touches a host's state: agents speak only through their `ChatSink`.

pub mod agent_link;
pub mod agent_settings;
pub mod attachments;
pub mod chat_sessions;
pub mod config;
pub mod elicit;
pub mod fs;
pub mod listing;
pub mod meter;
pub mod options;
pub mod prompt_turn;
pub mod provider;
pub mod quota;
pub mod sandboxes;
pub mod session;
pub mod session_git;
pub mod session_key;
pub mod shell;
pub mod shell_output;
pub mod start_failure;
pub mod terminal;
pub mod turn;
pub mod turn_content;
pub mod turn_tools;
pub mod workspace;

pub use config::{AgentConfig, AgentConfigError, AgentsFile};
pub use listing::{agent_info, model_info, Listing};
pub use provider::AcpProvider;
pub use sandboxes::Sandboxes;
pub use session_key::SessionKey;
pub use shell::KeptShells;
