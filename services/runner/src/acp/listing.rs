//! How an ACP agent is listed (root state `agents`): from its configuration, then as it reports its models and
//! settings.

use std::sync::Arc;

use ahp_types::state::{
    AgentCapabilities, AgentInfo, MultipleChatsCapability, SessionConfigSchema, SessionModelInfo,
};
use parking_lot::Mutex;

use super::config::AgentConfig;
use super::options;
use crate::provider::ChatSink;

/// How an agent of the agents file is listed (root state `agents`) before it reports more about itself.
pub fn agent_info(config: &AgentConfig) -> AgentInfo {
    AgentInfo {
        provider: config.id.clone(),
        display_name: config.display_name.clone(),
        description: config.description.clone(),
        models: config
            .models
            .iter()
            .map(|model| model_info(&config.id, model, model))
            .collect(),
        protected_resources: None,
        customizations: None,
        // Every chat is an ACP session of the one agent process; a fork or side chat gets its history as
        // context in its first prompt (`TurnRequest::context`).
        capabilities: config.multiple_chats.then(|| AgentCapabilities {
            multiple_chats: Some(MultipleChatsCapability {
                fork: Some(true),
                side_chat: Some(true),
            }),
            ..Default::default()
        }),
    }
}

/// How a session's worker tells the host what the agent reported about itself.
pub struct Listing {
    pub(crate) base: AgentInfo,
    pub(crate) reported: Arc<Mutex<Option<Vec<SessionModelInfo>>>>,
    pub(crate) settings: Arc<Mutex<Option<SessionConfigSchema>>>,
}

impl Listing {
    /// The agent reported its models: list them (here and in every host that lists the agent from now on).
    pub fn models_reported(&self, models: Vec<SessionModelInfo>, sink: &dyn ChatSink) {
        if models.is_empty() {
            return;
        }
        *self.reported.lock() = Some(models.clone());
        let mut info = self.base.clone();
        info.models = models;
        sink.agent_changed(info);
    }

    /// The agent reported its settings: sessions created from now on offer them as session config.
    pub fn settings_reported(&self, settings: &options::AgentSettings, sink: &dyn ChatSink) {
        let Some(schema) = &settings.schema else {
            return;
        };
        *self.settings.lock() = Some(schema.clone());
        sink.agent_settings_reported(&self.base.provider, schema);
    }
}

/// An `AgentInfo` model entry.
pub fn model_info(provider: &str, id: &str, name: &str) -> SessionModelInfo {
    SessionModelInfo {
        id: id.to_string(),
        provider: provider.to_string(),
        name: name.to_string(),
        max_context_window: None,
        max_output_tokens: None,
        max_prompt_tokens: None,
        supports_vision: None,
        policy_state: None,
        config_schema: None,
        meta: None,
    }
}
