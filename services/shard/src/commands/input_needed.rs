//! A session's `inputNeeded`: every open input request, tool confirmation, tool authentication and client tool
//! execution of its chats, mirrored as they open and close.

use ahp_types::actions::{SessionInputNeededRemovedAction, SessionInputNeededSetAction, StateAction};
use ahp_types::state::{
    ChatState, ResponsePart, SessionChatInputRequest, SessionInputRequest, SessionToolAuthenticationRequest,
    SessionToolClientExecutionRequest, SessionToolConfirmationRequest, ToolCallConfirmationState,
    ToolCallContributor, ToolCallState,
};

use crate::host::HostCore;

impl HostCore {
    /// A chat is gone: what it needed from the session's clients is no longer outstanding.
    pub(crate) fn clear_input_needed(&mut self, session: &str, chat: &str) {
        let ids: Vec<String> = self
            .model
            .sessions
            .get(session)
            .iter()
            .flat_map(|s| s.state.input_needed.iter().flatten())
            .filter(|request| input_chat(request) == Some(chat))
            .filter_map(|request| input_id(request).map(str::to_string))
            .collect();
        for id in ids {
            self.apply_server_action(
                session,
                StateAction::SessionInputNeededRemoved(SessionInputNeededRemovedAction { id }),
            );
        }
    }

    /// Mirror the chat's outstanding input (open input requests, tool calls awaiting confirmation or
    /// authentication, client tools running) into its session's `inputNeeded` with
    /// `session/inputNeededSet` / `session/inputNeededRemoved`, so a client of the session alone sees it.
    pub(crate) fn sync_input_needed(&mut self, chat: &str) {
        let (session, wanted) = match self.model.chats.get(chat) {
            Some(record) => (record.session.clone(), input_requests_of(chat, &record.state)),
            None => return,
        };
        let Some(listed) = self.model.sessions.get(&session) else {
            return;
        };
        let current: Vec<SessionInputRequest> = listed
            .state
            .input_needed
            .iter()
            .flatten()
            .filter(|request| input_chat(request) == Some(chat))
            .cloned()
            .collect();
        for gone in current
            .iter()
            .filter(|r| !wanted.iter().any(|w| input_id(w) == input_id(r)))
        {
            if let Some(id) = input_id(gone) {
                self.apply_server_action(
                    &session,
                    StateAction::SessionInputNeededRemoved(SessionInputNeededRemovedAction {
                        id: id.to_string(),
                    }),
                );
            }
        }
        for request in wanted.into_iter().filter(|w| !current.contains(w)) {
            self.apply_server_action(
                &session,
                StateAction::SessionInputNeededSet(Box::new(SessionInputNeededSetAction { request })),
            );
        }
    }
}

/// Whether an action can change a chat's outstanding input.
pub(crate) fn affects_input_needed(action: &StateAction) -> bool {
    use StateAction::*;
    matches!(
        action,
        ChatInputRequested(_)
            | ChatInputCompleted(_)
            | ChatInputAnswerChanged(_)
            | ChatToolCallStart(_)
            | ChatToolCallReady(_)
            | ChatToolCallConfirmed(_)
            | ChatToolCallComplete(_)
            | ChatToolCallResultConfirmed(_)
            | ChatToolCallAuthRequired(_)
            | ChatToolCallAuthResolved(_)
            | ChatTurnComplete(_)
            | ChatTurnCancelled(_)
            | ChatError(_)
            | ChatTruncated(_)
    )
}

/// The session-level mirror of a chat's outstanding input, keyed `<chat>#<kind>/<id>`.
fn input_requests_of(chat: &str, state: &ChatState) -> Vec<SessionInputRequest> {
    let Some(turn) = state.active_turn.as_ref() else {
        return Vec::new();
    };
    let key = |kind: &str, id: &str| format!("{chat}#{kind}/{id}");
    turn.response_parts
        .iter()
        .filter_map(|part| match part {
            ResponsePart::InputRequest(input) if input.response.is_none() => {
                Some(SessionInputRequest::ChatInput(SessionChatInputRequest {
                    id: key("input", &input.request.id),
                    chat: chat.to_string(),
                    request: input.request.clone(),
                }))
            }
            ResponsePart::ToolCall(tc) => match &tc.tool_call {
                ToolCallState::PendingConfirmation(s) => Some(SessionInputRequest::ToolConfirmation(
                    SessionToolConfirmationRequest {
                        id: key("tool", &s.tool_call_id),
                        chat: chat.to_string(),
                        turn_id: turn.id.clone(),
                        tool_call: ToolCallConfirmationState::PendingConfirmation(s.clone()),
                    },
                )),
                ToolCallState::PendingResultConfirmation(s) => Some(SessionInputRequest::ToolConfirmation(
                    SessionToolConfirmationRequest {
                        id: key("tool", &s.tool_call_id),
                        chat: chat.to_string(),
                        turn_id: turn.id.clone(),
                        tool_call: ToolCallConfirmationState::PendingResultConfirmation(s.clone()),
                    },
                )),
                ToolCallState::Running(s) => match &s.contributor {
                    Some(ToolCallContributor::Client(client)) => Some(
                        SessionInputRequest::ToolClientExecution(SessionToolClientExecutionRequest {
                            id: key("tool", &s.tool_call_id),
                            chat: chat.to_string(),
                            turn_id: turn.id.clone(),
                            client_id: client.client_id.clone(),
                            tool_call: s.clone(),
                        }),
                    ),
                    _ => None,
                },
                ToolCallState::AuthRequired(s) => Some(SessionInputRequest::ToolAuthentication(Box::new(
                    SessionToolAuthenticationRequest {
                        id: key("tool", &s.tool_call_id),
                        chat: chat.to_string(),
                        turn_id: turn.id.clone(),
                        tool_call: (**s).clone(),
                    },
                ))),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

pub(crate) fn input_id(request: &SessionInputRequest) -> Option<&str> {
    Some(match request {
        SessionInputRequest::ChatInput(r) => &r.id,
        SessionInputRequest::ToolConfirmation(r) => &r.id,
        SessionInputRequest::ToolClientExecution(r) => &r.id,
        SessionInputRequest::ToolAuthentication(r) => &r.id,
        SessionInputRequest::Unknown(_) => return None,
    })
}

pub(crate) fn input_chat(request: &SessionInputRequest) -> Option<&str> {
    Some(match request {
        SessionInputRequest::ChatInput(r) => &r.chat,
        SessionInputRequest::ToolConfirmation(r) => &r.chat,
        SessionInputRequest::ToolClientExecution(r) => &r.chat,
        SessionInputRequest::ToolAuthentication(r) => &r.chat,
        SessionInputRequest::Unknown(_) => return None,
    })
}
