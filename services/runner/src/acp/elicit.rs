//! ACP elicitation (`elicitation/create`) ↔ AHP input requests: a form's JSON-Schema properties become AHP
//! questions (text, number, integer, boolean, single- and multi-select), a URL request an input request with
//! its URL; the answer a device submits goes back as the elicitation's `accept` / `decline` / `cancel`.

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    CreateElicitationRequest, CreateElicitationResponse, ElicitationMode, ElicitationScope, SessionId,
};
use ahp_types::state::{
    ChatInputAnswer, ChatInputAnswerValue, ChatInputQuestion, ChatInputRequest, ChatInputResponseKind,
};
use serde_json::{json, Value};

/// The AHP input request for an elicitation, under `id`; `None` for a mode AHP cannot show.
pub fn request_of(id: &str, request: &CreateElicitationRequest) -> Option<ChatInputRequest> {
    let (url, questions) = match &request.mode {
        ElicitationMode::Form(form) => {
            let schema = serde_json::to_value(&form.requested_schema).ok()?;
            (None, Some(questions_of(&schema)))
        }
        ElicitationMode::Url(url) => (Some(url.url.clone()), None),
        _ => return None,
    };
    Some(ChatInputRequest {
        id: id.to_string(),
        message: Some(request.message.clone()),
        url,
        questions,
        answers: None,
    })
}

/// One AHP question per property of a form's schema (in property-name order: the schema's map is unordered).
fn questions_of(schema: &Value) -> Vec<ChatInputQuestion> {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema["properties"].as_object() else {
        return Vec::new();
    };
    properties
        .iter()
        .filter_map(|(name, property)| {
            let title = property["title"].as_str().unwrap_or(name);
            let message = property["description"].as_str().unwrap_or(title);
            let mut question = json!({
                "id": name,
                "title": title,
                "message": message,
                "required": required.contains(&name.as_str()),
            });
            let options = |values: &Value| -> Vec<Value> {
                values
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| {
                        let (id, label) = match v {
                            Value::String(s) => (s.clone(), s.clone()),
                            other => (
                                other["const"].as_str()?.to_string(),
                                other["title"].as_str()?.to_string(),
                            ),
                        };
                        Some(json!({"id": id, "label": label}))
                    })
                    .collect()
            };
            let kind = match property["type"].as_str() {
                Some("string") if property.get("enum").is_some() || property.get("oneOf").is_some() => {
                    let choices = property
                        .get("enum")
                        .or_else(|| property.get("oneOf"))
                        .unwrap_or(&Value::Null);
                    question["options"] = json!(options(choices));
                    "single-select"
                }
                Some("string") => "text",
                Some("number") => "number",
                Some("integer") => "integer",
                Some("boolean") => "boolean",
                Some("array") => {
                    let items = &property["items"];
                    let choices = items
                        .get("enum")
                        .or_else(|| items.get("anyOf"))
                        .unwrap_or(&Value::Null);
                    question["options"] = json!(options(choices));
                    "multi-select"
                }
                _ => return None,
            };
            question["kind"] = json!(kind);
            serde_json::from_value(question).ok()
        })
        .collect()
}

/// The elicitation's answer for what a device submitted.
pub fn response_of(
    response: ChatInputResponseKind,
    answers: Option<&HashMap<String, ChatInputAnswer>>,
) -> Option<CreateElicitationResponse> {
    let answer = match response {
        ChatInputResponseKind::Accept => {
            let content: serde_json::Map<String, Value> = answers
                .into_iter()
                .flatten()
                .filter_map(|(name, answer)| {
                    let value = match answer {
                        ChatInputAnswer::Submitted(answered) | ChatInputAnswer::Draft(answered) => {
                            match &answered.value {
                                ChatInputAnswerValue::Text(v) => json!(v.value),
                                ChatInputAnswerValue::Number(v) => json!(v.value),
                                ChatInputAnswerValue::Boolean(v) => json!(v.value),
                                ChatInputAnswerValue::Selected(v) => json!(v.value),
                                ChatInputAnswerValue::SelectedMany(v) => json!(v.value),
                                ChatInputAnswerValue::Unknown(_) => return None,
                            }
                        }
                        ChatInputAnswer::Skipped(_) => return None,
                    };
                    Some((name.clone(), value))
                })
                .collect();
            json!({"action": "accept", "content": content})
        }
        ChatInputResponseKind::Decline => json!({"action": "decline"}),
        _ => json!({"action": "cancel"}),
    };
    serde_json::from_value(answer).ok()
}

/// The ACP session an elicitation is for (`None` for one tied to a request rather than a session, or of a
/// mode this relay does not know).
pub fn session_of(request: &CreateElicitationRequest) -> Option<&SessionId> {
    let scope = match &request.mode {
        ElicitationMode::Form(form) => &form.scope,
        ElicitationMode::Url(url) => &url.scope,
        _ => return None,
    };
    match scope {
        ElicitationScope::Session(session) => Some(&session.session_id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_requests_and_refusals_map_both_ways() {
        let asked: CreateElicitationRequest = serde_json::from_value(json!({
            "mode": "url", "sessionId": "s", "elicitationId": "e1",
            "url": "https://example.com/login", "message": "Sign in"
        }))
        .expect("url elicitation");
        let request = request_of("r1", &asked).expect("shown");
        assert_eq!(request.url.as_deref(), Some("https://example.com/login"));
        assert_eq!(request.message.as_deref(), Some("Sign in"));
        for (kind, action) in [
            (ChatInputResponseKind::Decline, "decline"),
            (ChatInputResponseKind::Cancel, "cancel"),
        ] {
            let answer = response_of(kind, None).expect("answer");
            assert_eq!(serde_json::to_value(answer).expect("json")["action"], action);
        }
    }
}
