//! A session's active clients: released when they leave or their grace ends, and the tool calls they were
//! running for the session failed with them.

use ahp_types::actions::{ChatToolCallCompleteAction, SessionActiveClientRemovedAction, StateAction};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{ResponsePart, ToolCallContributor, ToolCallResult};

use crate::host::HostCore;
use crate::validate::{self};

impl HostCore {
    /// Remove `client_id` from a session's active clients, failing the client tool calls it owns.
    pub(crate) fn remove_active_client(&mut self, session: &str, client_id: &str) {
        let Some(record) = self.model.sessions.get(session) else {
            return;
        };
        if !record
            .state
            .active_clients
            .iter()
            .any(|c| c.client_id == client_id)
        {
            return;
        }
        let chats: Vec<String> = record.state.chats.iter().map(|c| c.resource.clone()).collect();
        for chat in chats {
            for (turn_id, tool_call_id) in self.client_tool_calls(&chat, client_id) {
                self.apply_server_action(
                    &chat,
                    StateAction::ChatToolCallComplete(ChatToolCallCompleteAction {
                        turn_id,
                        tool_call_id,
                        meta: None,
                        result: ToolCallResult {
                            success: false,
                            past_tense_message: StringOrMarkdown::Plain(
                                "The client that owned this tool disconnected".into(),
                            ),
                            content: None,
                            structured_content: None,
                            error: None,
                        },
                        requires_result_confirmation: None,
                    }),
                );
            }
        }
        self.apply_server_action(
            session,
            StateAction::SessionActiveClientRemoved(SessionActiveClientRemovedAction {
                client_id: client_id.to_string(),
            }),
        );
    }

    /// Open tool calls of the active turn in `chat` that `client_id` executes.
    pub(crate) fn client_tool_calls(&self, chat: &str, client_id: &str) -> Vec<(String, String)> {
        let Some(turn) = self
            .model
            .chats
            .get(chat)
            .and_then(|c| c.state.active_turn.as_ref())
        else {
            return vec![];
        };
        turn.response_parts
            .iter()
            .filter_map(|part| match part {
                ResponsePart::ToolCall(tc) => {
                    let owned = matches!(
                        validate::tool_call_contributor(&tc.tool_call),
                        Some(ToolCallContributor::Client(c)) if c.client_id == client_id
                    );
                    let open = !matches!(
                        tc.tool_call,
                        ahp_types::state::ToolCallState::Completed(_)
                            | ahp_types::state::ToolCallState::Cancelled(_)
                    );
                    (owned && open)
                        .then(|| {
                            validate::tool_call_id_of(&tc.tool_call)
                                .map(|id| (turn.id.clone(), id.to_string()))
                        })
                        .flatten()
                }
                _ => None,
            })
            .collect()
    }

    /// The grace period of a disconnected client ran out: if it did not come back, release it everywhere.
    pub(crate) fn expire_client(&mut self, client_id: &str, epoch: u64) {
        let Some(binding) = self.clients.get(client_id) else {
            return;
        };
        if binding.live_connections > 0 || binding.grace_epoch != epoch {
            return;
        }
        let sessions: Vec<String> = self
            .model
            .sessions
            .iter()
            .filter(|(_, s)| s.state.active_clients.iter().any(|c| c.client_id == client_id))
            .map(|(uri, _)| uri.clone())
            .collect();
        for session in sessions {
            self.remove_active_client(&session, client_id);
        }
        // Its owner is in the store: memory keeps only bindings in use (or within their grace).
        self.clients.remove(client_id);
        self.owed.forget(client_id);
    }
}
