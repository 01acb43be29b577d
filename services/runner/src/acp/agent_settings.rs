//! What an agent's session config options say (its models, its settings, its model selector), and applying
//! the session's chosen settings to an ACP session before a turn.

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    SessionConfigId, SessionConfigKind, SessionConfigOption, SessionConfigOptionCategory,
    SessionConfigOptionValue, SessionConfigSelectOption, SessionConfigSelectOptions, SessionId,
    SetSessionConfigOptionRequest, SetSessionModeRequest,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Agent;
use ahp_types::state::SessionModelInfo;

use super::agent_link::{Prompt, Reported};
use super::options::{AgentSettings, Setter};
use crate::provider::ChatSink;

/// The models an agent offers, from its `session/new` model selector (config option of category `model`).
pub(crate) fn reported_models(
    provider: &str,
    options: Option<&[SessionConfigOption]>,
) -> Vec<SessionModelInfo> {
    let Some(selector) = options
        .into_iter()
        .flatten()
        .find(|option| matches!(option.category, Some(SessionConfigOptionCategory::Model)))
    else {
        return Vec::new();
    };
    let SessionConfigKind::Select(select) = &selector.kind else {
        return Vec::new();
    };
    let choices: Vec<&SessionConfigSelectOption> = match &select.options {
        SessionConfigSelectOptions::Ungrouped(options) => options.iter().collect(),
        SessionConfigSelectOptions::Grouped(groups) => groups.iter().flat_map(|g| g.options.iter()).collect(),
        _ => Vec::new(),
    };
    choices
        .into_iter()
        .map(|choice| super::listing::model_info(provider, &choice.value.to_string(), &choice.name))
        .collect()
}

/// Put the session config's values into the agent's ACP session before a prompt: each setting the agent
/// offers whose chosen value differs from what that ACP session has. An error names the setting.
pub(crate) async fn apply_settings(
    cx: &ConnectionTo<Agent>,
    session: &SessionId,
    prompt: &Prompt,
    settings: &AgentSettings,
    chosen: &mut HashMap<(String, String), serde_json::Value>,
) -> Result<(), String> {
    for (property, value) in prompt.config.iter().flatten() {
        let Some(setter) = settings.setters.get(property) else {
            continue;
        };
        let key = (session.to_string(), property.clone());
        let has = chosen.get(&key).or_else(|| settings.current.get(property));
        if has == Some(value) {
            continue;
        }
        let Some(text) = value.as_str() else {
            continue;
        };
        let set = match setter {
            Setter::ConfigOption(id) => cx
                .send_request(SetSessionConfigOptionRequest::new(
                    session.clone(),
                    SessionConfigId::new(id.clone()),
                    SessionConfigOptionValue::value_id(text.to_string()),
                ))
                .block_task()
                .await
                .map(|_| ()),
            Setter::Mode => cx
                .send_request(SetSessionModeRequest::new(session.clone(), text.to_string()))
                .block_task()
                .await
                .map(|_| ()),
        };
        set.map_err(|error| format!("the agent could not set {property} to {text}: {error}"))?;
        chosen.insert(key, value.clone());
    }
    Ok(())
}

/// What an agent's session config options tell: its models (listed in root `agents`) and its model selector.
pub(crate) fn observe_options(
    reported: &Reported,
    agent: &str,
    listing: &super::listing::Listing,
    sink: &dyn ChatSink,
    model_option: &mut Option<SessionConfigId>,
    settings: &mut AgentSettings,
) {
    let options = reported.options.as_deref();
    listing.models_reported(reported_models(agent, options), sink);
    *settings = AgentSettings::reported(options, reported.modes.as_ref());
    listing.settings_reported(settings, sink);
    if model_option.is_none() {
        *model_option = options
            .into_iter()
            .flatten()
            .find(|option| matches!(option.category, Some(SessionConfigOptionCategory::Model)))
            .map(|option| option.id.clone());
    }
}
