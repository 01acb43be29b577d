//! Input assistance beyond `completions`: `sessionConfigCompletions` (the values of one property of the agent's
//! session settings that match what the user typed, from the schema `resolveSessionConfig` answers) and
//! `moveChat` (validated like the spec asks; this relay's chats are not movable — each is an ACP session of
//! its session's own agent process, which cannot be handed to another session's agent — so a request is refused
//! with why, and nothing changes).

use ahp_types::commands::{MoveChatParams, SessionConfigCompletionsParams, SessionConfigValueItem};
use ahp_types::state::SessionConfigSchema;
use relay_core::rpc::{InboundMessage, RpcError};

use crate::host::HostCore;
use crate::reply::{reply, CommandResult};

/// Values one answer lists at most.
pub const MAX_ITEMS: usize = 100;

/// The values of `property` in `schema` whose value or label contains `query` (case ignored), in the schema's
/// order.
pub fn matching_values(
    schema: &SessionConfigSchema,
    property: &str,
    query: &str,
) -> Result<Vec<SessionConfigValueItem>, RpcError> {
    let Some(found) = schema.properties.get(property) else {
        return Err(RpcError::invalid_params(format!(
            "the agent's settings have no property {property}"
        )));
    };
    let query = query.to_lowercase();
    let labels = found.enum_labels.clone().unwrap_or_default();
    let descriptions = found.enum_descriptions.clone().unwrap_or_default();
    Ok(found
        .r#enum
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(at, value)| {
            let value = match value {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            let label = labels.get(at).cloned().unwrap_or_else(|| value.clone());
            let matches = query.is_empty()
                || value.to_lowercase().contains(&query)
                || label.to_lowercase().contains(&query);
            matches.then(|| SessionConfigValueItem {
                value,
                label,
                description: descriptions.get(at).cloned(),
            })
        })
        .take(MAX_ITEMS)
        .collect())
}

impl HostCore {
    pub(crate) fn session_config_completions(&mut self, message: &InboundMessage) -> CommandResult {
        let params: SessionConfigCompletionsParams = message.parse_params()?;
        let provider = match &params.provider {
            Some(id) => self.providers.get(id).ok_or_else(|| {
                RpcError::new(
                    ahp_types::errors::ahp_error_codes::PROVIDER_NOT_FOUND,
                    format!("provider not found: {id}"),
                )
            })?,
            None => self
                .providers
                .default_provider()
                .and_then(|id| self.providers.get(id))
                .ok_or_else(|| RpcError::invalid_params("no agent is configured"))?,
        };
        let schema = provider
            .session_config_schema()
            .unwrap_or_else(|| SessionConfigSchema {
                r#type: "object".into(),
                properties: Default::default(),
                required: None,
            });
        let items = matching_values(&schema, &params.property, params.query.as_deref().unwrap_or(""))?;
        reply(
            message.id,
            &ahp_types::commands::SessionConfigCompletionsResult { items },
        )
    }

    pub(crate) fn move_chat(&mut self, message: &InboundMessage) -> CommandResult {
        let params: MoveChatParams = message.parse_params()?;
        let Some(chat) = self.model.chats.get(&params.channel) else {
            return Err(RpcError::not_found(&params.channel));
        };
        if chat.state.movable != Some(true) {
            return Err(RpcError::invalid_params(format!(
                "{} is not movable: each chat is a conversation of its session's own agent process",
                params.channel
            )));
        }
        Err(RpcError::invalid_params("this relay moves no chats"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> SessionConfigSchema {
        serde_json::from_value(serde_json::json!({
            "type": "object",
            "properties": {
                "model": {"type": "string", "title": "Model",
                          "enum": ["gpt-fast", "gpt-deep", "claude"], "enumLabels": ["Fast", "Deep", "Claude"]},
                "effort": {"type": "string", "title": "Effort"}
            }
        }))
        .expect("schema")
    }

    #[test]
    fn values_match_by_value_or_label_and_unknown_properties_are_refused() {
        let values = |query: &str| {
            matching_values(&schema(), "model", query)
                .expect("values")
                .into_iter()
                .map(|item| item.value)
                .collect::<Vec<_>>()
        };
        assert_eq!(values(""), ["gpt-fast", "gpt-deep", "claude"]);
        assert_eq!(values("GPT"), ["gpt-fast", "gpt-deep"]);
        assert_eq!(values("deep"), ["gpt-deep"]);
        assert!(values("zzz").is_empty());
        assert!(matching_values(&schema(), "effort", "")
            .expect("no enum")
            .is_empty());
        assert!(matching_values(&schema(), "nope", "").is_err());
    }
}
