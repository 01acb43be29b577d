//! A turn's tool calls as the agent reports them: started, ready for confirmation, updated with their results,
//! and the permissions the agent asks for them, parked until a user answers (or the turn ends).

use agent_client_protocol::v1::schema::{
    PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, ToolCallStatus, ToolCallUpdateFields,
};
use agent_client_protocol::v1::Responder;
use ahp_types::actions::{
    ChatToolCallCompleteAction, ChatToolCallContentChangedAction, ChatToolCallReadyAction,
    ChatToolCallStartAction, StateAction,
};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{
    ChatInputResponseKind, ConfirmationOption, ConfirmationOptionKind, ToolCallConfirmationReason,
    ToolCallResult, ToolInput,
};

use super::turn::*;
use super::turn_content::*;

impl TurnMapper {
    pub(crate) fn start_tool(
        &mut self,
        id: &str,
        title: &str,
        name: Option<&str>,
        raw_input: Option<&serde_json::Value>,
    ) {
        if self.tools.contains_key(id) {
            return;
        }
        self.flush();
        self.current = None;
        self.tools
            .insert(id.to_string(), (ToolPhase::Streaming, title.to_string()));
        let turn_id = self.turn_id.clone();
        self.emit(StateAction::ChatToolCallStart(ChatToolCallStartAction {
            turn_id,
            tool_call_id: id.to_string(),
            meta: None,
            tool_name: name.unwrap_or(title).to_string(),
            display_name: title.to_string(),
            intention: raw_input.map(|input| input.to_string()),
            contributor: None,
        }));
    }

    pub(crate) fn ready(&mut self, id: &str, options: Option<Vec<ConfirmationOption>>) {
        let Some((phase, title)) = self.tools.get(id).cloned() else {
            return;
        };
        let pending = options.is_some();
        if phase == ToolPhase::Done || (!pending && phase != ToolPhase::Streaming) {
            return;
        }
        let turn_id = self.turn_id.clone();
        self.emit(StateAction::ChatToolCallReady(ChatToolCallReadyAction {
            turn_id,
            tool_call_id: id.to_string(),
            meta: None,
            contributor: None,
            intention: None,
            invocation_message: StringOrMarkdown::Plain(title.clone()),
            tool_input: None::<ToolInput>,
            confirmation_title: pending.then(|| StringOrMarkdown::Plain(title.clone())),
            risk_assessment: None,
            edits: None,
            editable: Some(false),
            confirmed: (!pending).then_some(ToolCallConfirmationReason::NotNeeded),
            options,
        }));
        let phase = if pending {
            ToolPhase::PendingConfirmation
        } else {
            ToolPhase::Running
        };
        self.tools.insert(id.to_string(), (phase, title));
    }

    pub(crate) fn tool_update(&mut self, id: &str, fields: ToolCallUpdateFields) {
        self.flush();
        self.current = None;
        if let Some(title) = &fields.title {
            if let Some(entry) = self.tools.get_mut(id) {
                entry.1 = title.clone();
            }
        }
        let status = fields.status.unwrap_or(ToolCallStatus::Pending);
        match status {
            ToolCallStatus::InProgress => {
                self.ready(id, None);
                let content = result_contents(fields.content.as_deref());
                let running = self
                    .tools
                    .get(id)
                    .is_some_and(|(phase, _)| *phase == ToolPhase::Running);
                if running && !content.is_empty() {
                    let turn_id = self.turn_id.clone();
                    self.emit(StateAction::ChatToolCallContentChanged(
                        ChatToolCallContentChangedAction {
                            turn_id,
                            tool_call_id: id.to_string(),
                            meta: None,
                            content,
                        },
                    ));
                }
            }
            ToolCallStatus::Completed | ToolCallStatus::Failed => {
                self.ready(id, None);
                let Some((phase, title)) = self.tools.get(id).cloned() else {
                    return;
                };
                if phase == ToolPhase::Done {
                    return;
                }
                let content = result_contents(fields.content.as_deref());
                let turn_id = self.turn_id.clone();
                self.emit(StateAction::ChatToolCallComplete(ChatToolCallCompleteAction {
                    turn_id,
                    tool_call_id: id.to_string(),
                    meta: None,
                    result: ToolCallResult {
                        success: status == ToolCallStatus::Completed,
                        past_tense_message: StringOrMarkdown::Plain(title.clone()),
                        content: (!content.is_empty()).then_some(content),
                        structured_content: None,
                        error: None,
                    },
                    requires_result_confirmation: None,
                }));
                self.tools.insert(id.to_string(), (ToolPhase::Done, title));
            }
            _ => {}
        }
    }

    /// The agent asks for permission: a pending confirmation any device of the session may answer.
    pub fn permission(
        &mut self,
        request: RequestPermissionRequest,
        responder: Responder<RequestPermissionResponse>,
    ) {
        let id = request.tool_call.tool_call_id.to_string();
        let title = request
            .tool_call
            .fields
            .title
            .clone()
            .unwrap_or_else(|| id.clone());
        self.start_tool(
            &id,
            &title,
            request.tool_call.fields.name.as_deref(),
            request.tool_call.fields.raw_input.as_ref(),
        );
        let options = request
            .options
            .iter()
            .map(|option| ConfirmationOption {
                id: option.option_id.to_string(),
                label: option.name.clone(),
                kind: if is_allow(option.kind) {
                    ConfirmationOptionKind::Approve
                } else {
                    ConfirmationOptionKind::Deny
                },
                group: None,
            })
            .collect();
        self.ready(&id, Some(options));
        self.parked.insert(
            id,
            ParkedPermission {
                options: request.options,
                responder,
            },
        );
    }

    /// A device answered a pending confirmation: answer the agent with the chosen option, or the first of
    /// the right kind (allow once before always; reject once before always).
    pub fn confirmed(&mut self, tool_call_id: &str, approved: bool, selected: Option<&str>) {
        let Some(parked) = self.parked.remove(tool_call_id) else {
            return;
        };
        let by_kind = |kinds: &[PermissionOptionKind]| {
            kinds.iter().find_map(|kind| {
                parked
                    .options
                    .iter()
                    .find(|o| o.kind == *kind)
                    .map(|o| o.option_id.clone())
            })
        };
        let chosen = selected
            .and_then(|id| {
                parked
                    .options
                    .iter()
                    .find(|o| o.option_id.to_string() == id && is_allow(o.kind) == approved)
            })
            .map(|o| o.option_id.clone())
            .or_else(|| {
                if approved {
                    by_kind(&[PermissionOptionKind::AllowOnce, PermissionOptionKind::AllowAlways])
                } else {
                    by_kind(&[
                        PermissionOptionKind::RejectOnce,
                        PermissionOptionKind::RejectAlways,
                    ])
                }
            });
        let outcome = match chosen {
            Some(option) => RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(option)),
            None => RequestPermissionOutcome::Cancelled,
        };
        if let Err(error) = parked.responder.respond(RequestPermissionResponse::new(outcome)) {
            tracing::debug!(%error, "the agent no longer waits for this permission");
        }
        if let Some(entry) = self.tools.get_mut(tool_call_id) {
            entry.0 = ToolPhase::Running;
        }
    }

    /// The turn was cancelled: every pending permission and elicitation is answered `cancelled` (ACP: MUST).
    pub fn cancel_permissions(&mut self) {
        for (_, parked) in self.parked.drain() {
            let _ = parked.responder.respond(RequestPermissionResponse::new(
                RequestPermissionOutcome::Cancelled,
            ));
        }
        for (_, responder) in self.inputs.drain() {
            if let Some(cancel) = super::elicit::response_of(ChatInputResponseKind::Cancel, None) {
                let _ = responder.respond(cancel);
            }
        }
    }
}
