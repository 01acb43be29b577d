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
    ContentBlock, CreateElicitationRequest, CreateElicitationResponse, PermissionOption,
    PermissionOptionKind, PlanEntry, PlanEntryStatus, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, SessionUpdate, StopReason, ToolCallContent,
    ToolCallStatus, ToolCallUpdateFields,
};
use agent_client_protocol::v1::Responder;
use ahp_types::actions::{
    ChatActivityChangedAction, ChatDeltaAction, ChatErrorAction, ChatInputRequestedAction,
    ChatReasoningAction, ChatResponsePartAction, ChatToolCallCompleteAction,
    ChatToolCallContentChangedAction, ChatToolCallReadyAction, ChatToolCallStartAction,
    ChatTurnCancelledAction, ChatTurnCompleteAction, ChatUsageAction, SessionConfigChangedAction,
    SessionTitleChangedAction, StateAction,
};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{
    ChatInputResponseKind, ConfirmationOption, ConfirmationOptionKind, ContentRef, ErrorInfo,
    ErrorResponsePart, FileEditDiffStats, FileEditSide, MarkdownResponsePart, ReasoningResponsePart,
    ResponsePart, SystemNotificationResponsePart, ToolCallConfirmationReason, ToolCallResult, ToolInput,
    ToolResultContent, ToolResultFileEditContent, ToolResultTerminalContent, ToolResultTextContent,
    UsageInfo,
};

use crate::provider::ChatSink;

/// The kind of text part being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TextKind {
    Markdown,
    Reasoning,
}

/// Where a tool call stands, as AHP sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToolPhase {
    Streaming,
    PendingConfirmation,
    Running,
    Done,
}

/// A permission request waiting for a device's answer.
pub struct ParkedPermission {
    options: Vec<PermissionOption>,
    responder: Responder<RequestPermissionResponse>,
}

/// An elicitation waiting for a device's answer.
type ParkedInput = Responder<CreateElicitationResponse>;

/// Numbers every question asked in this process (see [`TurnMapper::elicitation`]).
static NEXT_INPUT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The mapping state of one turn.
pub struct TurnMapper {
    /// The chat's session (titles go there).
    session: Option<String>,
    chat: String,
    turn_id: String,
    sink: Arc<dyn ChatSink>,
    started: Instant,
    parts: usize,
    /// The text part being streamed and its not yet emitted text.
    current: Option<(TextKind, String)>,
    pending_text: String,
    tools: HashMap<String, (ToolPhase, String)>,
    parked: HashMap<String, ParkedPermission>,
    inputs: HashMap<String, ParkedInput>,
    /// Elicitations asked in this turn: each gets the next number in its id (never reused, also while
    /// earlier ones were answered and others wait).
    inputs_asked: usize,
    /// Whether the chat's activity shows the agent's plan (cleared when the turn ends).
    plan_shown: bool,
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

    fn emit(&mut self, action: StateAction) -> bool {
        self.emitted += 1;
        self.sink.emit(&self.chat, action).applied()
    }

    fn emit_on(&mut self, channel: &str, action: StateAction) -> bool {
        self.emitted += 1;
        self.sink.emit(channel, action).applied()
    }

    fn duration(&self) -> i64 {
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

    fn text(&mut self, kind: TextKind, text: &str) {
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

    fn start_tool(
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

    fn ready(&mut self, id: &str, options: Option<Vec<ConfirmationOption>>) {
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

    fn tool_update(&mut self, id: &str, fields: ToolCallUpdateFields) {
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
    fn settings_changed(&mut self, current: ahp_types::common::JsonObject) {
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
    fn clear_plan(&mut self) {
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

/// A chat's activity for an agent's plan: the entry in progress (else the next pending one) and how many are
/// done; none once every entry is done.
fn plan_activity(entries: &[PlanEntry]) -> Option<String> {
    let done = entries
        .iter()
        .filter(|entry| entry.status == PlanEntryStatus::Completed)
        .count();
    let current = entries
        .iter()
        .find(|entry| entry.status == PlanEntryStatus::InProgress)
        .or_else(|| {
            entries
                .iter()
                .find(|entry| entry.status == PlanEntryStatus::Pending)
        })?;
    Some(format!("{} ({done}/{} done)", current.content, entries.len()))
}

/// An ACP tool call's content as AHP tool result content: text; a diff as a file edit (each side's content
/// inline as a `data:` URI, since AHP 1.0 carries file contents by reference, with line counts); a terminal
/// the relay runs as a link to its `ahp-terminal:` channel.
fn result_contents(contents: Option<&[ToolCallContent]>) -> Vec<ToolResultContent> {
    contents
        .into_iter()
        .flatten()
        .filter_map(|content| match content {
            // An image as the image it is (the host keeps a large one by reference).
            ToolCallContent::Content(c) => match &c.content {
                ContentBlock::Image(image) => Some(ToolResultContent::EmbeddedResource(
                    ahp_types::state::ToolResultEmbeddedResourceContent {
                        data: image.data.clone(),
                        content_type: image.mime_type.clone(),
                    },
                )),
                other => Some(ToolResultContent::Text(ToolResultTextContent {
                    text: text_of(other),
                })),
            },
            ToolCallContent::Diff(diff) => Some(ToolResultContent::FileEdit(file_edit(
                &diff.path,
                diff.old_text.as_deref(),
                &diff.new_text,
            ))),
            ToolCallContent::Terminal(terminal) => {
                let uri = terminal.terminal_id.0.to_string();
                uri.starts_with("ahp-terminal:").then(|| {
                    ToolResultContent::Terminal(ToolResultTerminalContent {
                        resource: uri,
                        title: "Terminal".into(),
                        is_pty: Some(false),
                        result: None,
                    })
                })
            }
            _ => None,
        })
        .collect()
}

/// A file edit: `path` from `before` (absent: a new file) to `after`.
pub fn file_edit(path: &std::path::Path, before: Option<&str>, after: &str) -> ToolResultFileEditContent {
    let uri = format!("file://{}", path.display());
    let side = |text: &str| FileEditSide {
        uri: uri.clone(),
        content: ContentRef {
            uri: data_uri(text),
            size_hint: i64::try_from(text.len()).ok(),
            content_type: Some("text/plain".into()),
            nonce: None,
        },
    };
    let (added, removed) = changed_lines(before.unwrap_or(""), after);
    ToolResultFileEditContent {
        before: before.map(side),
        after: Some(side(after)),
        diff: Some(FileEditDiffStats {
            added: Some(added),
            removed: Some(removed),
        }),
    }
}

/// `text` as a `data:` URI.
fn data_uri(text: &str) -> String {
    use base64::Engine;
    format!(
        "data:text/plain;charset=utf-8;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(text)
    )
}

/// Lines only in `after` and lines only in `before`, counted as multisets (an edit's size, not its
/// position).
fn changed_lines(before: &str, after: &str) -> (i64, i64) {
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for line in before.lines() {
        *counts.entry(line).or_default() -= 1;
    }
    for line in after.lines() {
        *counts.entry(line).or_default() += 1;
    }
    let added = counts.values().filter(|n| **n > 0).sum();
    let removed = -counts.values().filter(|n| **n < 0).sum::<i64>();
    (added, removed)
}

fn is_allow(kind: PermissionOptionKind) -> bool {
    matches!(
        kind,
        PermissionOptionKind::AllowOnce | PermissionOptionKind::AllowAlways
    )
}

/// The text of a content block (other kinds are named, not shown: AHP needs hosted URIs for them).
fn text_of(content: &ContentBlock) -> String {
    match content {
        ContentBlock::Text(text) => text.text.clone(),
        ContentBlock::ResourceLink(link) => link.uri.clone(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_shows_its_current_entry_and_progress() {
        use agent_client_protocol::v1::schema::PlanEntryPriority;
        let entry = |content: &str, status| PlanEntry::new(content, PlanEntryPriority::Medium, status);
        let plan = [
            entry("read", PlanEntryStatus::Completed),
            entry("write", PlanEntryStatus::InProgress),
            entry("test", PlanEntryStatus::Pending),
        ];
        assert_eq!(plan_activity(&plan).as_deref(), Some("write (1/3 done)"));
        assert_eq!(plan_activity(&plan[..1]), None);
    }

    #[test]
    fn a_file_edit_carries_both_sides_and_its_line_counts() {
        let edit = file_edit(
            std::path::Path::new("/w/a.txt"),
            Some("one\ntwo\n"),
            "one\nthree\nfour\n",
        );
        assert_eq!(
            edit.before.as_ref().map(|side| side.uri.as_str()),
            Some("file:///w/a.txt")
        );
        let after = edit.after.expect("after");
        assert_eq!(after.content.uri, data_uri("one\nthree\nfour\n"));
        let stats = edit.diff.expect("stats");
        assert_eq!((stats.added, stats.removed), (Some(2), Some(1)));
        // A new file has no before side.
        assert!(file_edit(std::path::Path::new("/w/b"), None, "x")
            .before
            .is_none());
    }
}
