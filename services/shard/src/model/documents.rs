//! What the store keeps of each channel (its snapshot document), and the configuration a new host starts with.

use ahp_types::state::ChangesetState;
use ahp_types::state::{ChatState, SessionState, TerminalState};
use serde::{Deserialize, Serialize};

use super::records::{ChangesetScope, DeviceTerminal};

/// What the store keeps as a session's snapshot: its state and its place in the catalogue.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionDocument<S = SessionState, T = String> {
    pub state: S,
    pub created_at: T,
    pub catalog_no: u64,
    #[serde(default = "Option::default", skip_serializing_if = "Option::is_none")]
    pub created_by: Option<T>,
}

/// What the store keeps as a chat's snapshot: its state and its session.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatDocument<C = ChatState, T = String> {
    pub state: C,
    pub session: T,
    #[serde(default = "Option::default", skip_serializing_if = "Option::is_none")]
    pub created_by: Option<T>,
}

/// What the store keeps of a terminal: its state, its session (the parent it is restored with) and, for a
/// device's terminal, what the host needs to take its process over. Read as a chat's document was read before
/// `device` was kept.
#[derive(Serialize, Deserialize)]
pub struct TerminalDocument<S = TerminalState, T = String, D = DeviceTerminal> {
    pub state: S,
    pub session: T,
    #[serde(default = "Option::default", skip_serializing_if = "Option::is_none")]
    pub device: Option<D>,
}

/// What the store keeps of the root channel: what clients set and the host must not forget (its
/// configuration). The rest of root state is derived at start-up (`agents` from the configured providers).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RootDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ahp_types::state::RootConfigState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<ahp_types::common::JsonObject>,
}

/// The host configuration a new host starts with (root state `config`): what admins may change with
/// `root/configChanged`, persisted with the root's snapshot.
pub fn default_root_config(agents: &[ahp_types::state::AgentInfo]) -> ahp_types::state::RootConfigState {
    let providers: Vec<&str> = agents.iter().map(|a| a.provider.as_str()).collect();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "defaultProvider": {
                "type": "string",
                "title": "Default agent",
                "description": "The agent a new session gets when it names none.",
                "enum": providers,
                "default": providers.first(),
            },
            "notice": {
                "type": "string",
                "title": "Notice",
                "description": "A note for everyone on this host, shown by clients that support it.",
                "default": "",
            },
        },
    });
    let values = serde_json::json!({
        "defaultProvider": providers.first(),
        "notice": "",
    });
    let state = serde_json::json!({ "schema": schema, "values": values });
    serde_json::from_value(state).unwrap_or_else(|error| {
        tracing::error!(%error, "the default root configuration does not fit the AHP schema");
        ahp_types::state::RootConfigState {
            schema: ahp_types::state::ConfigSchema {
                r#type: "object".into(),
                properties: Default::default(),
                required: None,
            },
            values: Default::default(),
        }
    })
}

/// How the store keeps a changeset channel (its session is its parent).
#[derive(Serialize, Deserialize)]
pub struct ChangesetDocument {
    pub state: ChangesetState,
    pub session: String,
    #[serde(flatten)]
    pub scope: ChangesetScope,
}
