//! A chat's `!command`: run in a terminal of the session (a device's), shown as a turn of the chat whose
//! response is the command's output (its tail, at most 16 KiB), finished when the command exits.

use ahp_types::actions::{
    ChatToolCallCompleteAction, ChatToolCallContentChangedAction, ChatToolCallReadyAction,
    ChatToolCallStartAction, ChatTurnCompleteAction, StateAction,
};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{
    TerminalClaim, TerminalCommandResult, TerminalContentPart, TerminalLifecycleState,
    TerminalRunningLifecycleState, TerminalSessionClaim, TerminalState, ToolCallConfirmationReason,
    ToolCallResult, ToolInput, ToolResultContent, ToolResultTerminalContent, ToolResultTextContent,
};
use relay_runner::{TurnControl, TurnHandle};

use crate::host::HostCore;
use crate::model::{CommandTurn, TERMINAL_SCHEME};

use super::device_terminals::{cut, provider_id, START_PATIENCE};

/// What a user message starts with to run a command in a terminal (initialize's `terminalCommandPrefix`).
pub const TERMINAL_COMMAND_PREFIX: &str = "!";
/// Output of a `!command` copied into its chat (the terminal keeps the rest).
pub(crate) const CHAT_PREVIEW_BYTES: usize = 16 * 1024;

impl HostCore {
    /// A user message `!command`: run `command` in a terminal of the chat, shown as the turn's tool call.
    /// Returns false when devices' terminals are off (the message goes to the agent as it is).
    pub(crate) fn start_command_turn(&mut self, chat: &str, turn_id: &str, text: &str) -> bool {
        let Some(command) = text.strip_prefix(TERMINAL_COMMAND_PREFIX).map(str::trim) else {
            return false;
        };
        if !self.limits.device_terminals || command.is_empty() {
            return false;
        }
        let Some(session) = self.model.chats.get(chat).map(|record| record.session.clone()) else {
            return false;
        };
        // An agent without a workspace (the demo) runs no command: the message goes to it as it is.
        let runs_terminals = self
            .model
            .sessions
            .get(&session)
            .and_then(|record| self.providers.get(&record.state.provider))
            .is_some_and(|provider| provider.runs_terminals());
        if !runs_terminals {
            return false;
        }
        let uri = format!("{TERMINAL_SCHEME}/{}", uuid::Uuid::new_v4());
        let tool_call_id = format!("{turn_id}-terminal");
        let turn = CommandTurn {
            chat: chat.to_string(),
            turn_id: turn_id.to_string(),
            tool_call_id: tool_call_id.clone(),
            command: command.to_string(),
        };
        self.apply_server_action(
            chat,
            StateAction::ChatToolCallStart(ChatToolCallStartAction {
                turn_id: turn_id.to_string(),
                tool_call_id: tool_call_id.clone(),
                meta: None,
                tool_name: "terminal".into(),
                display_name: "Terminal".into(),
                intention: Some(format!("Run {command}")),
                contributor: None,
            }),
        );
        self.apply_server_action(
            chat,
            StateAction::ChatToolCallReady(ChatToolCallReadyAction {
                turn_id: turn_id.to_string(),
                tool_call_id: tool_call_id.clone(),
                meta: None,
                contributor: None,
                intention: None,
                invocation_message: StringOrMarkdown::Plain(format!("Running `{command}`")),
                tool_input: Some(ToolInput::Inline(command.to_string())),
                confirmation_title: None,
                risk_assessment: None,
                edits: None,
                editable: Some(false),
                confirmed: Some(ToolCallConfirmationReason::UserAction),
                options: None,
            }),
        );
        let started = self.terminal_request(&session, &uri, None, Some(command.to_string()));
        let opened = started.and_then(|(provider, request)| {
            let state = TerminalState {
                title: cut(command, 80),
                cwd: None,
                cols: Some(request.cols),
                rows: Some(request.rows),
                content: Vec::new(),
                lifecycle: TerminalLifecycleState::Running(TerminalRunningLifecycleState {}),
                claim: TerminalClaim::Session(TerminalSessionClaim {
                    session: session.clone(),
                    chat: chat.to_string(),
                    turn_id: Some(turn_id.to_string()),
                    tool_call_id: Some(tool_call_id.clone()),
                }),
                supports_command_detection: Some(true),
                is_pty: Some(true),
            };
            self.open_device_channel(
                &session,
                &uri,
                state,
                provider_id(&provider),
                Some(turn.clone()),
                None,
            )?;
            Ok((provider, request))
        });
        let (provider, request) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                self.fail_command_turn(&turn, &error.message);
                return true;
            }
        };
        self.apply_server_action(
            chat,
            StateAction::ChatToolCallContentChanged(ChatToolCallContentChangedAction {
                turn_id: turn_id.to_string(),
                tool_call_id,
                meta: None,
                content: vec![ToolResultContent::Terminal(ToolResultTerminalContent {
                    resource: uri.clone(),
                    title: cut(command, 80),
                    is_pty: Some(true),
                    result: None,
                })],
            }),
        );
        // Cancelling the turn kills the command (the handle also says "cancelled" when the turn ends and the
        // host drops it: the command has exited by then).
        let (control, mut controls) = tokio::sync::mpsc::unbounded_channel();
        let key = request.key.clone();
        let killer = provider.clone();
        let sink = self.sink.clone();
        let started = provider.start_terminal(request, sink.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let failure = match tokio::time::timeout(START_PATIENCE, started).await {
                    Ok(Ok(Ok(()))) => None,
                    Ok(Ok(Err(error))) => Some(error),
                    Ok(Err(_)) => Some("the process that was to run it went away".to_string()),
                    Err(_) => Some("it did not start in time".to_string()),
                };
                if let Some(failure) = failure {
                    killer.kill_terminal(&key);
                    // The terminal never ran: it exits, which fails the turn's tool call.
                    sink.emit(
                        &key.uri,
                        StateAction::TerminalData(ahp_types::actions::TerminalDataAction {
                            data: format!("cannot run the command: {failure}\r\n"),
                        }),
                    );
                    sink.emit(
                        &key.uri,
                        StateAction::TerminalExited(ahp_types::actions::TerminalExitedAction {
                            exit_code: None,
                        }),
                    );
                }
                while let Some(control) = controls.recv().await {
                    if matches!(control, TurnControl::Cancelled) {
                        killer.kill_terminal(&key);
                        return;
                    }
                }
            });
        }
        if let Some(record) = self.model.chats.get_mut(chat) {
            record.running = Some(TurnHandle::new(control));
        }
        true
    }

    /// The `!command` exited: its tool call completes with its output, and its turn ends.
    pub(crate) fn finish_command_turn(&mut self, uri: &str, turn: &CommandTurn, exit_code: Option<i64>) {
        let output = self
            .model
            .terminals
            .get(uri)
            .map(|record| terminal_text(&record.state))
            .unwrap_or_default();
        let (preview, truncated) = tail(&output, CHAT_PREVIEW_BYTES);
        let status = match exit_code {
            Some(code) => format!("exit {code}"),
            None => "killed".into(),
        };
        self.apply_server_action(
            &turn.chat,
            StateAction::ChatToolCallComplete(ChatToolCallCompleteAction {
                turn_id: turn.turn_id.clone(),
                tool_call_id: turn.tool_call_id.clone(),
                meta: None,
                result: ToolCallResult {
                    success: exit_code == Some(0),
                    past_tense_message: StringOrMarkdown::Plain(format!("Ran `{}` ({status})", turn.command)),
                    content: Some(vec![
                        ToolResultContent::Terminal(ToolResultTerminalContent {
                            resource: uri.to_string(),
                            title: cut(&turn.command, 80),
                            is_pty: Some(true),
                            result: Some(TerminalCommandResult {
                                exit_code,
                                preview: Some(preview.clone()),
                                truncated: Some(truncated),
                            }),
                        }),
                        ToolResultContent::Text(ToolResultTextContent { text: preview }),
                    ]),
                    structured_content: None,
                    error: None,
                },
                requires_result_confirmation: None,
            }),
        );
        self.complete_command_turn(turn);
    }

    pub(crate) fn fail_command_turn(&mut self, turn: &CommandTurn, why: &str) {
        self.apply_server_action(
            &turn.chat,
            StateAction::ChatToolCallComplete(ChatToolCallCompleteAction {
                turn_id: turn.turn_id.clone(),
                tool_call_id: turn.tool_call_id.clone(),
                meta: None,
                result: ToolCallResult {
                    success: false,
                    past_tense_message: StringOrMarkdown::Plain(format!(
                        "Could not run `{}`: {why}",
                        turn.command
                    )),
                    content: None,
                    structured_content: None,
                    error: None,
                },
                requires_result_confirmation: None,
            }),
        );
        self.complete_command_turn(turn);
    }

    pub(crate) fn complete_command_turn(&mut self, turn: &CommandTurn) {
        let started = self
            .model
            .chats
            .get(&turn.chat)
            .and_then(|record| record.state.active_turn.as_ref())
            .filter(|active| active.id == turn.turn_id)
            .and_then(|active| active.started_at.parse::<jiff::Timestamp>().ok());
        let Some(started) = started else {
            return;
        };
        let duration = (jiff::Timestamp::now().as_millisecond() - started.as_millisecond()).max(0);
        self.apply_server_action(
            &turn.chat,
            StateAction::ChatTurnComplete(ChatTurnCompleteAction {
                turn_id: turn.turn_id.clone(),
                duration,
                meta: None,
            }),
        );
    }
}

/// The terminal's output as one text (what a naive consumer reconstructs).
pub(crate) fn terminal_text(state: &TerminalState) -> String {
    state
        .content
        .iter()
        .map(|part| match part {
            TerminalContentPart::Command(command) => command.output.as_str(),
            TerminalContentPart::Unclassified(part) => part.value.as_str(),
            _ => "",
        })
        .collect()
}

/// The last `max` bytes of `text` (on a character boundary), and whether that cut anything.
pub(crate) fn tail(text: &str, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text.to_string(), false);
    }
    let mut from = text.len() - max;
    while !text.is_char_boundary(from) {
        from += 1;
    }
    (text[from..].to_string(), true)
}
