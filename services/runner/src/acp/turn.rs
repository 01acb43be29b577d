//! One AHP turn of an ACP session: the agent's updates mapped to AHP chat actions, and the user's
//! decisions mapped back (digest: `acp-bridge.md` §2).
//!
//! Text and thought chunks go to parts the relay creates; chunks that arrive in a burst are coalesced into
//! one `chat/delta` / `chat/reasoning` (flushed on a short timer and before any other action), so a fast
//! agent does not make one envelope per token. Tool calls become `chat/toolCall*`; a permission request
//! becomes a pending confirmation that any device may answer, mapped to the agent's option ids by kind.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use agent_client_protocol::schema::MaybeUndefined;
use agent_client_protocol::v1::schema::{
    CreateElicitationRequest, CreateElicitationResponse, PermissionOption, RequestPermissionResponse,
    SessionUpdate, StopReason, ToolCallUpdateFields,
};
use agent_client_protocol::v1::Responder;
use ahp_types::actions::{
    ChatActivityChangedAction, ChatDeltaAction, ChatErrorAction, ChatInputRequestedAction,
    ChatReasoningAction, ChatResponsePartAction, ChatTurnCancelledAction, ChatTurnCompleteAction,
    ChatUsageAction, SessionConfigChangedAction, SessionTitleChangedAction, StateAction,
};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{
    ChatInputResponseKind, ErrorInfo, ErrorResponsePart, MarkdownResponsePart, ReasoningResponsePart,
    ResponsePart, SystemNotificationResponsePart, UsageInfo,
};

use super::turn_content::*;
use crate::provider::ChatSink;

/// The kind of text part being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TextKind {
    Markdown,
    Reasoning,
}

/// Where a tool call stands, as AHP sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolPhase {
    Streaming,
    PendingConfirmation,
    Running,
    Done,
}

/// A permission request waiting for a device's answer.
pub struct ParkedPermission {
    pub(crate) options: Vec<PermissionOption>,
    pub(crate) responder: Responder<RequestPermissionResponse>,
}

/// An elicitation waiting for a device's answer.
pub(crate) type ParkedInput = Responder<CreateElicitationResponse>;

/// Numbers every question asked in this process (see [`TurnMapper::elicitation`]).
static NEXT_INPUT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The mapping state of one turn.
pub struct TurnMapper {
    /// The chat's session (titles go there).
    pub(crate) session: Option<String>,
    pub(crate) chat: String,
    pub(crate) turn_id: String,
    pub(crate) sink: Arc<dyn ChatSink>,
    pub(crate) started: Instant,
    pub(crate) parts: usize,
    /// The text part being streamed and its not yet emitted text.
    pub(crate) current: Option<(TextKind, String)>,
    pub(crate) pending_text: String,
    pub(crate) tools: HashMap<String, (ToolPhase, String)>,
    pub(crate) parked: HashMap<String, ParkedPermission>,
    pub(crate) inputs: HashMap<String, ParkedInput>,
    /// Elicitations asked in this turn: each gets the next number in its id (never reused, also while
    /// earlier ones were answered and others wait).
    pub(crate) inputs_asked: usize,
    /// Whether the chat's activity shows the agent's plan (cleared when the turn ends).
    pub(crate) plan_shown: bool,
    /// Actions emitted (for the coalescing measurement).
    pub emitted: usize,
}

impl TurnMapper {
    pub fn new(chat: String, turn_id: String, sink: Arc<dyn ChatSink>) -> Self {
        Self {
            session: None,
            chat,
            turn_id,
            sink,
            started: Instant::now(),
            parts: 0,
            current: None,
            pending_text: String::new(),
            tools: HashMap::new(),
            parked: HashMap::new(),
            inputs: HashMap::new(),
            inputs_asked: 0,
            plan_shown: false,
            emitted: 0,
        }
    }

    pub(crate) fn emit(&mut self, action: StateAction) -> bool {
        self.emitted += 1;
        self.sink.emit(&self.chat, action).applied()
    }

    pub(crate) fn emit_on(&mut self, channel: &str, action: StateAction) -> bool {
        self.emitted += 1;
        self.sink.emit(channel, action).applied()
    }

    pub(crate) fn duration(&self) -> i64 {
        i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Emit the text gathered since the last flush.
    pub fn flush(&mut self) {
        if self.pending_text.is_empty() {
            return;
        }
        let Some((kind, part_id)) = self.current.clone() else {
            return;
        };
        let content = std::mem::take(&mut self.pending_text);
        let turn_id = self.turn_id.clone();
        self.emit(match kind {
            TextKind::Markdown => StateAction::ChatDelta(ChatDeltaAction {
                turn_id,
                part_id,
                content,
                meta: None,
            }),
            TextKind::Reasoning => StateAction::ChatReasoning(ChatReasoningAction {
                turn_id,
                part_id,
                content,
                meta: None,
            }),
        });
    }

    /// Whether text is waiting to be flushed.
    pub fn has_pending_text(&self) -> bool {
        !self.pending_text.is_empty()
    }

    pub(crate) fn text(&mut self, kind: TextKind, text: &str) {
        if text.is_empty() {
            return;
        }
        if self.current.as_ref().is_some_and(|(k, _)| *k == kind) {
            self.pending_text.push_str(text);
            return;
        }
        self.flush();
        self.parts += 1;
        let id = format!("{}-part{}", self.turn_id, self.parts);
        let part = match kind {
            TextKind::Markdown => ResponsePart::Markdown(MarkdownResponsePart {
                id: id.clone(),
                content: text.to_string(),
            }),
            TextKind::Reasoning => ResponsePart::Reasoning(ReasoningResponsePart {
                id: id.clone(),
                content: text.to_string(),
            }),
        };
        self.current = Some((kind, id));
        let turn_id = self.turn_id.clone();
        self.emit(StateAction::ChatResponsePart(ChatResponsePartAction {
            turn_id,
            part,
            meta: None,
        }));
    }

    /// The session the chat belongs to: the agent's title updates go to it.
    pub fn in_session(mut self, session: &str) -> Self {
        self.session = Some(session.to_string());
        self
    }

    /// A system message in the turn (e.g. the agent lost its context).
    pub fn system_note(&mut self, text: &str) {
        self.flush();
        self.current = None;
        let turn_id = self.turn_id.clone();
        self.emit(StateAction::ChatResponsePart(ChatResponsePartAction {
            turn_id,
            part: ResponsePart::SystemNotification(SystemNotificationResponsePart {
                content: StringOrMarkdown::Plain(text.to_string()),
                meta: None,
            }),
            meta: None,
        }));
    }

    /// One `session/update` of the agent.
    pub fn update(&mut self, update: SessionUpdate) {
        match update {
            SessionUpdate::AgentMessageChunk(chunk) => {
                self.text(TextKind::Markdown, &text_of(&chunk.content))
            }
            SessionUpdate::AgentThoughtChunk(chunk) => {
                self.text(TextKind::Reasoning, &text_of(&chunk.content))
            }
            SessionUpdate::ToolCall(call) => {
                let id = call.tool_call_id.to_string();
                self.start_tool(&id, &call.title, call.name.as_deref(), call.raw_input.as_ref());
                let fields = ToolCallUpdateFields::new()
                    .status(call.status)
                    .content(call.content);
                self.tool_update(&id, fields);
            }
            SessionUpdate::ToolCallUpdate(update) => {
                let id = update.tool_call_id.to_string();
                if !self.tools.contains_key(&id) {
                    let title = update.fields.title.clone().unwrap_or_else(|| id.clone());
                    self.start_tool(
                        &id,
                        &title,
                        update.fields.name.as_deref(),
                        update.fields.raw_input.as_ref(),
                    );
                }
                self.tool_update(&id, update.fields);
            }
            SessionUpdate::SessionInfoUpdate(info) => {
                if let (MaybeUndefined::Value(title), Some(session)) = (&info.title, &self.session) {
                    self.emit_on(
                        &session.clone(),
                        StateAction::SessionTitleChanged(SessionTitleChangedAction { title: title.clone() }),
                    );
                }
            }
            SessionUpdate::UsageUpdate(usage) => {
                // ACP reports the context window, AHP per-turn tokens: the window travels in `_meta`.
                let mut window = serde_json::json!({"used": usage.used, "size": usage.size});
                if let Some(cost) = &usage.cost {
                    window["cost"] = serde_json::json!({"amount": cost.amount, "currency": cost.currency});
                }
                let mut meta = serde_json::Map::new();
                meta.insert(CONTEXT_WINDOW_META.into(), window);
                let turn_id = self.turn_id.clone();
                self.emit(StateAction::ChatUsage(ChatUsageAction {
                    turn_id,
                    usage: UsageInfo {
                        input_tokens: None,
                        output_tokens: None,
                        model: None,
                        cache_read_tokens: None,
                        meta: Some(meta),
                    },
                    meta: None,
                }));
            }
            // The agent changed a setting itself: the session config follows.
            SessionUpdate::ConfigOptionUpdate(update) => {
                let current =
                    super::options::AgentSettings::reported(Some(&update.config_options), None).current;
                self.settings_changed(current);
            }
            SessionUpdate::CurrentModeUpdate(update) => {
                let mut current = ahp_types::common::JsonObject::new();
                current.insert(
                    super::options::MODE_PROPERTY.into(),
                    update.current_mode_id.to_string().into(),
                );
                self.settings_changed(current);
            }
            SessionUpdate::Plan(plan) => {
                let activity = plan_activity(&plan.entries);
                self.plan_shown = activity.is_some();
                self.emit(StateAction::ChatActivityChanged(ChatActivityChangedAction {
                    activity,
                }));
            }
            // The AHP message is the source of truth for the user's text; available commands and modes are
            // kept by the session worker (see docs/protocol.md).
            _ => {}
        }
    }

    /// The agent asks the user something: an AHP input request any device of the session may answer.
    pub fn elicitation(&mut self, request: CreateElicitationRequest, responder: ParkedInput) {
        self.flush();
        self.current = None;
        self.inputs_asked += 1;
        // Unique across every mapper of the process too: a resumed turn keeps its id and may still hold an
        // unanswered question from before.
        let id = format!(
            "{}-input{}-{}",
            self.turn_id,
            self.inputs_asked,
            NEXT_INPUT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let Some(input) = super::elicit::request_of(&id, &request) else {
            if let Some(decline) = super::elicit::response_of(ChatInputResponseKind::Decline, None) {
                let _ = responder.respond(decline);
            }
            return;
        };
        self.emit(StateAction::ChatInputRequested(ChatInputRequestedAction {
            request: input,
        }));
        self.inputs.insert(id, responder);
    }

    /// A device answered an input request: the agent gets the answer.
    pub fn input_completed(
        &mut self,
        request_id: &str,
        response: ChatInputResponseKind,
        answers: Option<&HashMap<String, ahp_types::state::ChatInputAnswer>>,
    ) {
        let Some(responder) = self.inputs.remove(request_id) else {
            return;
        };
        match super::elicit::response_of(response, answers) {
            Some(answer) => {
                if let Err(error) = responder.respond(answer) {
                    tracing::debug!(%error, "the agent no longer waits for this answer");
                }
            }
            None => tracing::warn!(
                request_id,
                "could not express an answer as an ACP elicitation response"
            ),
        }
    }

    /// The prompt ended: close the turn the way AHP says for its stop reason.
    pub fn finish(&mut self, stop: StopReason) {
        self.clear_plan();
        self.flush();
        self.cancel_permissions();
        let turn_id = self.turn_id.clone();
        let duration = self.duration();
        let action = match stop {
            StopReason::EndTurn => StateAction::ChatTurnComplete(ChatTurnCompleteAction {
                turn_id,
                duration,
                meta: None,
            }),
            StopReason::Cancelled => StateAction::ChatTurnCancelled(ChatTurnCancelledAction {
                turn_id,
                duration,
                meta: None,
            }),
            StopReason::MaxTokens | StopReason::MaxTurnRequests => {
                return self.fail("limitReached", &format!("the agent stopped: {stop:?}"), true);
            }
            other => return self.fail("refusal", &format!("the agent stopped: {other:?}"), false),
        };
        self.emit(action);
    }

    /// The agent's settings changed to `current`: `session/configChanged` on the session.
    pub(crate) fn settings_changed(&mut self, current: ahp_types::common::JsonObject) {
        if let (false, Some(session)) = (current.is_empty(), self.session.clone()) {
            self.emit_on(
                &session,
                StateAction::SessionConfigChanged(SessionConfigChangedAction {
                    config: current,
                    replace: None,
                }),
            );
        }
    }

    /// The plan ends with its turn: the chat's activity no longer shows it.
    pub(crate) fn clear_plan(&mut self) {
        if std::mem::take(&mut self.plan_shown) {
            self.emit(StateAction::ChatActivityChanged(ChatActivityChangedAction {
                activity: None,
            }));
        }
    }

    /// End the turn with an error saying what the agent said.
    pub fn fail(&mut self, error_type: &str, message: &str, resumable: bool) {
        self.clear_plan();
        self.flush();
        self.cancel_permissions();
        let turn_id = self.turn_id.clone();
        let duration = self.duration();
        self.emit(StateAction::ChatError(ChatErrorAction {
            turn_id,
            duration,
            part: ErrorResponsePart {
                error: ErrorInfo {
                    error_type: error_type.into(),
                    message: message.into(),
                    stack: None,
                    meta: None,
                },
                resumable: Some(resumable),
            },
            meta: None,
        }));
    }
}

/// The key of `chat/usage`'s `usage._meta` holding the agent's context window (`used`, `size`, `cost`).
pub const CONTEXT_WINDOW_META: &str = "ahpRelay/contextWindow";
