//! The host side of a chat's turns: the agent's turn started, steered, controlled and stopped as actions are
//! accepted, and the chat's queued messages run when a turn ends.

use ahp_types::actions::{
    ChatPendingMessageRemovedAction, ChatTurnStartedAction, SessionTitleChangedAction, StateAction,
};
use ahp_types::state::{Message, PendingMessageKind};
use relay_runner::{TurnControl, TurnRequest};

use crate::host::HostCore;
use crate::model::agent_context::{self, AgentContext};
use crate::reply::now;
use crate::workspace::changesets::TurnEnd;

impl HostCore {
    pub(crate) fn chat_side_effects(&mut self, chat: &str, action: &StateAction) {
        match action {
            StateAction::ChatTurnStarted(a) => {
                self.name_untitled_session(chat, &a.message);
                self.start_provider_turn(chat, &a.turn_id, &a.message.clone())
            }
            StateAction::ChatTurnResume(a) => {
                let message = self
                    .model
                    .chats
                    .get(chat)
                    .and_then(|c| c.state.active_turn.as_ref())
                    .map(|t| t.message.clone());
                if let Some(message) = message {
                    self.start_provider_turn(chat, &a.turn_id, &message);
                }
            }
            // A truncation drops the active turn (AHP): the agent's turn stops with it, so its session is free
            // for the next turn (of this chat or another).
            // The agent saw turns the chat no longer has: its next turn starts the chat afresh, told the kept
            // ones (a fork or side chat that never ran still owes its whole history, kept turns included).
            StateAction::ChatTruncated(_) => {
                let dropped = self
                    .model
                    .chats
                    .get(chat)
                    .is_some_and(|record| record.state.active_turn.is_none() && record.running.is_some());
                if let Some(record) = self.model.chats.get_mut(chat) {
                    if !matches!(record.agent_context, AgentContext::Owed { .. }) {
                        record.agent_context = AgentContext::Reset;
                    }
                }
                // The chat is idle again: its next pending message runs (told the kept turns).
                if dropped {
                    self.stop_provider_turn(chat);
                    self.drain_queue(chat);
                }
            }
            // However a turn ends, the chat is idle: the next pending message runs. A completed turn is the
            // proof that the agent got what it was owed of the chat's history (a turn that failed or was
            // cancelled may not have reached it: the next one tells it again, afresh).
            StateAction::ChatTurnComplete(_)
            | StateAction::ChatTurnCancelled(_)
            | StateAction::ChatError(_) => {
                let ended = match action {
                    StateAction::ChatTurnComplete(a) => Some(&a.turn_id),
                    StateAction::ChatTurnCancelled(a) => Some(&a.turn_id),
                    StateAction::ChatError(a) => Some(&a.turn_id),
                    _ => None,
                };
                if let Some(turn_id) = ended {
                    self.checkpoint_then(chat, turn_id, TurnEnd::End, |_| {});
                }
                if matches!(action, StateAction::ChatTurnComplete(_)) {
                    if let Some(record) = self.model.chats.get_mut(chat) {
                        record.agent_context = AgentContext::Current;
                    }
                }
                self.stop_provider_turn(chat);
                self.drain_queue(chat);
            }
            StateAction::ChatToolCallConfirmed(a) => self.control_turn(
                chat,
                TurnControl::ToolCallConfirmed {
                    tool_call_id: a.tool_call_id.clone(),
                    approved: a.approved,
                    selected_option_id: a.selected_option_id.clone(),
                },
            ),
            StateAction::ChatToolCallComplete(a) => self.control_turn(
                chat,
                TurnControl::ToolCallCompleted {
                    tool_call_id: a.tool_call_id.clone(),
                    success: a.result.success,
                },
            ),
            StateAction::ChatInputCompleted(a) => self.control_turn(
                chat,
                TurnControl::InputCompleted {
                    request_id: a.request_id.clone(),
                    response: a.response,
                    answers: a.answers.clone(),
                },
            ),
            StateAction::ChatPendingMessageSet(a) if a.kind == PendingMessageKind::Queued => {
                self.drain_queue(chat)
            }
            StateAction::ChatPendingMessageSet(_) => self.steer(chat),
            _ => {}
        }
    }

    /// A session still untitled when one of its chats starts a turn is named after the prompt (an agent that
    /// names its sessions renames it later), so no session stays "New session" in every client's list.
    fn name_untitled_session(&mut self, chat: &str, message: &Message) {
        let Some(session) = self.model.chats.get(chat).map(|record| record.session.clone()) else {
            return;
        };
        let untitled = self
            .model
            .sessions
            .get(&session)
            .is_some_and(|record| record.state.title.is_empty())
            && !crate::commands::titles::titled_by_user(&self.model, &session);
        let title = title_from_prompt(&message.text);
        if untitled && !title.is_empty() {
            self.apply_server_action(
                &session,
                StateAction::SessionTitleChanged(SessionTitleChangedAction { title }),
            );
        }
    }

    /// Start a turn's work: once its session's working directory is checkpointed ([`crate::workspace::changesets`]), where
    /// this host reaches it, so the turn's changes are what happened after.
    pub(crate) fn start_provider_turn(&mut self, chat: &str, turn_id: &str, message: &Message) {
        let (later_chat, later_turn, later_message) =
            (chat.to_string(), turn_id.to_string(), message.clone());
        let deferred = self.checkpoint_then(chat, turn_id, TurnEnd::Start, move |core| {
            let still_running = core
                .model
                .chats
                .get(&later_chat)
                .and_then(|record| record.state.active_turn.as_ref())
                .is_some_and(|turn| turn.id == later_turn);
            if still_running {
                core.begin_turn(&later_chat, &later_turn, &later_message);
            }
        });
        if !deferred {
            self.begin_turn(chat, turn_id, message);
        }
    }

    fn begin_turn(&mut self, chat: &str, turn_id: &str, message: &Message) {
        // `!command`: the host runs it in a terminal itself ([`crate::workspace::device_terminals`]).
        if self.start_command_turn(chat, turn_id, &message.text) {
            return;
        }
        let Some(record) = self.model.chats.get(chat) else {
            return;
        };
        let Some(session) = self.model.sessions.get(&record.session) else {
            return;
        };
        let Some(provider) = self.providers.get(&session.state.provider).cloned() else {
            tracing::warn!(provider = %session.state.provider, "session provider is not configured");
            return;
        };
        let first_turn = session.state.title.is_empty();
        let client_tools = session
            .state
            .active_clients
            .iter()
            .flat_map(|client| {
                client.tools.iter().map(|tool| relay_runner::ClientTool {
                    client_id: client.client_id.clone(),
                    name: tool.name.clone(),
                })
            })
            .collect();
        // What the agent has not seen of the chat goes with the turn (told once: see below).
        let chats = &self.model.chats;
        let owed = record.agent_context.clone();
        let (context, fresh) = agent_context::for_turn(owed, &record.state, |source, turn_id| {
            chats
                .get(source)
                .and_then(|source| agent_context::source_transcript(&source.state, turn_id))
        });
        let request = TurnRequest {
            session: record.session.clone(),
            tenant: self.key.tenant.clone(),
            host: self.key.host.clone(),
            working_directory: session
                .state
                .working_directories
                .as_ref()
                .and_then(|dirs| dirs.first().cloned()),
            agent_state: session
                .state
                .meta
                .as_ref()
                .and_then(|meta| meta.get(relay_runner::AGENT_STATE_META).cloned()),
            chat: chat.to_string(),
            turn_id: turn_id.to_string(),
            prompt: message.text.clone(),
            context,
            fresh,
            attachments: crate::commands::attachments::resolve(&self.model, message),
            model: message.model.as_ref().map(|model| model.id.clone()),
            config: session.state.config.as_ref().map(|config| config.values.clone()),
            first_turn,
            client_tools,
        };
        let handle = provider.start_turn(request, self.sink.clone());
        if let Some(record) = self.model.chats.get_mut(chat) {
            // Replacing a previous handle cancels it.
            record.running = Some(handle);
        }
    }

    pub(crate) fn stop_provider_turn(&mut self, chat: &str) {
        if let Some(record) = self.model.chats.get_mut(chat) {
            record.running = None;
        }
    }

    pub(crate) fn control_turn(&mut self, chat: &str, control: TurnControl) {
        if let Some(handle) = self.model.chats.get(chat).and_then(|r| r.running.as_ref()) {
            handle.send(control);
        }
    }

    /// Hand the chat's steering message to its running turn: the agent takes it at its next step, and it
    /// stops being pending. An idle chat starts a turn with it; a turn whose agent cannot be steered (ACP v1
    /// has no steering) or that no agent runs (e.g. one restored after a restart) leaves it for the end of
    /// the turn.
    pub(crate) fn steer(&mut self, chat: &str) {
        let Some(record) = self.model.chats.get(chat) else {
            return;
        };
        let Some(steering) = record.state.steering_message.clone() else {
            return;
        };
        if record.state.active_turn.is_none() {
            self.drain_queue(chat);
            return;
        }
        let steerable = self
            .model
            .sessions
            .get(&record.session)
            .and_then(|session| self.providers.get(&session.state.provider))
            .is_some_and(|provider| provider.can_steer());
        let taken = steerable
            && record.running.as_ref().is_some_and(|turn| {
                turn.send(TurnControl::Steer {
                    text: steering.message.text.clone(),
                })
            });
        if taken {
            self.apply_server_action(
                chat,
                StateAction::ChatPendingMessageRemoved(ChatPendingMessageRemovedAction {
                    kind: PendingMessageKind::Steering,
                    id: steering.id,
                }),
            );
        }
    }

    /// Start the next pending message when the chat is idle (digest §6): a steering message no turn took
    /// first, then the queue in order.
    pub(crate) fn drain_queue(&mut self, chat: &str) {
        let Some(record) = self.model.chats.get(chat) else {
            return;
        };
        if record.state.active_turn.is_some() {
            return;
        }
        if let Some(steering) = record.state.steering_message.clone() {
            self.apply_server_action(
                chat,
                StateAction::ChatPendingMessageRemoved(ChatPendingMessageRemovedAction {
                    kind: PendingMessageKind::Steering,
                    id: steering.id,
                }),
            );
            self.start_server_turn(chat, steering.message, None);
            return;
        }
        let Some(next) = record
            .state
            .queued_messages
            .as_ref()
            .and_then(|q| q.first())
            .cloned()
        else {
            return;
        };
        self.apply_server_action(
            chat,
            StateAction::ChatPendingMessageRemoved(ChatPendingMessageRemovedAction {
                kind: PendingMessageKind::Queued,
                id: next.id.clone(),
            }),
        );
        self.start_server_turn(chat, next.message, Some(next.id));
    }

    /// Start a turn on the host's initiative (a queued message, or `createChat.initialMessage`).
    pub(crate) fn start_server_turn(
        &mut self,
        chat: &str,
        message: Message,
        queued_message_id: Option<String>,
    ) {
        let turn_id = format!("turn-{}", self.seq.current() + 1);
        self.apply_server_action(
            chat,
            StateAction::ChatTurnStarted(ChatTurnStartedAction {
                turn_id,
                started_at: now(),
                message,
                queued_message_id,
                meta: None,
            }),
        );
    }
}

/// Longest title taken from a prompt, in characters (an ellipsis marks the cut).
const PROMPT_TITLE_CHARS: usize = 60;

/// A session title from a prompt: its first line, whitespace collapsed, cut at a word near
/// [`PROMPT_TITLE_CHARS`].
pub(crate) fn title_from_prompt(prompt: &str) -> String {
    let line = prompt.lines().find(|line| !line.trim().is_empty()).unwrap_or("");
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut title = String::new();
    for word in words {
        let extra = usize::from(!title.is_empty()) + word.chars().count();
        if title.chars().count() + extra > PROMPT_TITLE_CHARS {
            if title.is_empty() {
                title = word.chars().take(PROMPT_TITLE_CHARS).collect();
            }
            title.push('…');
            return title;
        }
        if !title.is_empty() {
            title.push(' ');
        }
        title.push_str(word);
    }
    title
}

#[cfg(test)]
mod tests {
    use super::title_from_prompt;

    #[test]
    fn a_title_is_the_prompts_first_line_cut_at_a_word() {
        assert_eq!(
            title_from_prompt("  plan the   launch party\nwith details"),
            "plan the launch party"
        );
        assert_eq!(title_from_prompt("\n\n  second line"), "second line");
        assert_eq!(title_from_prompt("   "), "");
        let long = "word ".repeat(40);
        let title = title_from_prompt(&long);
        assert!(title.ends_with('…') && title.chars().count() <= 61, "{title}");
        assert_eq!(title_from_prompt(&"x".repeat(100)).chars().count(), 61);
    }
}
