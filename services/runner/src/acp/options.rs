//! An agent's session settings (ACP `configOptions` other than its model selector, and legacy `modes`) as the
//! AHP session config: the schema clients pick values from (`resolveSessionConfig`, `createSession.config`,
//! `session/configChanged`), and the calls that put a session's chosen values into the agent
//! (`session/set_config_option`, `session/set_mode`) before each prompt.
//!
//! Models are not here: AHP selects them per message (`Message.model`).

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    SessionConfigKind, SessionConfigOption, SessionConfigOptionCategory, SessionConfigSelectOption,
    SessionConfigSelectOptions, SessionModeState,
};
use ahp_types::common::JsonObject;
use ahp_types::state::{SessionConfigPropertySchema, SessionConfigSchema};

/// The config property legacy ACP modes (`session/set_mode`) appear as, unless a config option has that id.
pub const MODE_PROPERTY: &str = "mode";

/// How a config property is set in the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setter {
    /// `session/set_config_option` with this option id.
    ConfigOption(String),
    /// `session/set_mode`.
    Mode,
}

/// What an agent reported about its settings: the schema for AHP and how to set each property.
#[derive(Debug, Clone, Default)]
pub struct AgentSettings {
    pub schema: Option<SessionConfigSchema>,
    /// The agent's current value of each property.
    pub current: JsonObject,
    pub setters: HashMap<String, Setter>,
}

impl AgentSettings {
    /// The settings in an agent's `session/new` / `session/load` answer (or a later `config_option_update`).
    pub fn reported(options: Option<&[SessionConfigOption]>, modes: Option<&SessionModeState>) -> Self {
        let mut settings = AgentSettings::default();
        let mut properties = HashMap::new();
        for option in options.into_iter().flatten() {
            if matches!(option.category, Some(SessionConfigOptionCategory::Model)) {
                continue;
            }
            let SessionConfigKind::Select(select) = &option.kind else {
                continue;
            };
            let choices: Vec<&SessionConfigSelectOption> = match &select.options {
                SessionConfigSelectOptions::Ungrouped(options) => options.iter().collect(),
                SessionConfigSelectOptions::Grouped(groups) => {
                    groups.iter().flat_map(|group| group.options.iter()).collect()
                }
                _ => Vec::new(),
            };
            let id = option.id.to_string();
            let current = select.current_value.to_string();
            properties.insert(
                id.clone(),
                property(
                    &option.name,
                    option.description.clone(),
                    &current,
                    choices
                        .iter()
                        .map(|c| (c.value.to_string(), c.name.clone(), c.description.clone())),
                ),
            );
            settings.current.insert(id.clone(), current.into());
            settings.setters.insert(id.clone(), Setter::ConfigOption(id));
        }
        if let Some(modes) = modes.filter(|_| !settings.setters.contains_key(MODE_PROPERTY)) {
            let current = modes.current_mode_id.to_string();
            properties.insert(
                MODE_PROPERTY.to_string(),
                property(
                    "Mode",
                    None,
                    &current,
                    modes
                        .available_modes
                        .iter()
                        .map(|m| (m.id.to_string(), m.name.clone(), m.description.clone())),
                ),
            );
            settings.current.insert(MODE_PROPERTY.into(), current.into());
            settings.setters.insert(MODE_PROPERTY.into(), Setter::Mode);
        }
        if !properties.is_empty() {
            settings.schema = Some(SessionConfigSchema {
                r#type: "object".into(),
                properties,
                required: None,
            });
        }
        settings
    }
}

/// A select property: its choices, labelled, and changeable during the session.
fn property(
    title: &str,
    description: Option<String>,
    current: &str,
    choices: impl Iterator<Item = (String, String, Option<String>)>,
) -> SessionConfigPropertySchema {
    let (mut values, mut labels, mut descriptions) = (Vec::new(), Vec::new(), Vec::new());
    for (value, label, description) in choices {
        values.push(serde_json::Value::from(value));
        labels.push(label);
        descriptions.push(description.unwrap_or_default());
    }
    let described = descriptions.iter().any(|d| !d.is_empty());
    SessionConfigPropertySchema {
        r#type: "string".into(),
        title: title.to_string(),
        description,
        default: Some(current.into()),
        r#enum: Some(values),
        enum_labels: Some(labels),
        enum_descriptions: described.then_some(descriptions),
        read_only: None,
        items: None,
        min_items: None,
        max_items: None,
        properties: None,
        required: None,
        additional_properties: None,
        enum_dynamic: None,
        session_mutable: Some(true),
    }
}

/// `requested` values checked against `schema`: only its properties, only their allowed values; the rest
/// take their defaults.
pub fn resolve(schema: &SessionConfigSchema, requested: Option<&JsonObject>) -> JsonObject {
    schema
        .properties
        .iter()
        .filter_map(|(id, property)| {
            let allowed = |value: &serde_json::Value| {
                property
                    .r#enum
                    .as_ref()
                    .is_none_or(|values| values.contains(value))
            };
            let value = requested
                .and_then(|requested| requested.get(id))
                .filter(|value| allowed(value))
                .cloned()
                .or_else(|| property.default.clone())?;
            Some((id.clone(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Vec<SessionConfigOption> {
        serde_json::from_value(serde_json::json!([
            {"id": "model", "name": "Model", "category": "model", "type": "select", "currentValue": "fast",
             "options": [{"value": "fast", "name": "Fast"}]},
            {"id": "effort", "name": "Effort", "category": "thought_level", "type": "select",
             "currentValue": "low",
             "options": [{"value": "low", "name": "Low"}, {"value": "high", "name": "High"}]}
        ]))
        .expect("options")
    }

    #[test]
    fn select_options_but_the_model_become_session_config() {
        let settings = AgentSettings::reported(Some(&options()), None);
        let schema = settings.schema.expect("schema");
        assert_eq!(schema.properties.len(), 1);
        let effort = &schema.properties["effort"];
        assert_eq!(
            effort.r#enum.as_deref(),
            Some(&[serde_json::json!("low"), serde_json::json!("high")][..])
        );
        assert_eq!(effort.session_mutable, Some(true));
        assert_eq!(settings.current["effort"], "low");
        assert_eq!(settings.setters["effort"], Setter::ConfigOption("effort".into()));
    }

    #[test]
    fn legacy_modes_are_the_mode_property() {
        let modes: SessionModeState = serde_json::from_value(serde_json::json!({
            "currentModeId": "ask",
            "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]
        }))
        .expect("modes");
        let settings = AgentSettings::reported(None, Some(&modes));
        assert_eq!(settings.setters[MODE_PROPERTY], Setter::Mode);
        let schema = settings.schema.expect("schema");
        assert_eq!(schema.properties[MODE_PROPERTY].default, Some("ask".into()));
    }

    #[test]
    fn resolving_keeps_only_allowed_values() {
        let schema = AgentSettings::reported(Some(&options()), None)
            .schema
            .expect("schema");
        let mut asked = JsonObject::new();
        asked.insert("effort".into(), "high".into());
        asked.insert("unknown".into(), "x".into());
        assert_eq!(
            serde_json::Value::Object(resolve(&schema, Some(&asked))),
            serde_json::json!({"effort": "high"})
        );
        asked.insert("effort".into(), "extreme".into());
        assert_eq!(
            serde_json::Value::Object(resolve(&schema, Some(&asked))),
            serde_json::json!({"effort": "low"})
        );
    }
}
