//! One turn of the demo agent: its reply streamed in chunks (a Markdown sample on request), steering taken at each
//! step, a tool call to confirm, a question to answer, a note written to its workspace.

use std::sync::Arc;
use std::time::Instant;

use ahp_types::actions::{
    ChatDeltaAction, ChatInputRequestedAction, ChatReasoningAction, ChatResponsePartAction,
    ChatToolCallCompleteAction, ChatToolCallReadyAction, ChatToolCallStartAction, ChatTurnCompleteAction,
    ChatUsageAction, StateAction,
};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{
    ChatInputAnswer, ChatInputAnswerValue, ChatInputQuestion, ChatInputRequest, ChatInputResponseKind,
    ChatInputTextQuestion, ConfirmationOption, ConfirmationOptionKind, MarkdownResponsePart,
    ReasoningResponsePart, ResponsePart, ToolCallClientContributor, ToolCallConfirmationReason,
    ToolCallContributor, ToolCallResult, ToolInput, ToolResultContent, ToolResultTextContent, UsageInfo,
};
use tokio::sync::mpsc;

use crate::provider::{ChatSink, TurnControl, TurnRequest};

use super::workspace::*;

/// The reply the demo agent streams for a prompt, in chunks.
pub fn reply_chunks(prompt: &str) -> Vec<String> {
    let text = format!(
        "Hello from the demo agent. You said: \"{}\". This reply is streamed in several parts so every device \
         sees it arrive.",
        prompt.trim()
    );
    let words: Vec<&str> = text.split(' ').collect();
    let mut chunks: Vec<String> = words
        .chunks(4)
        .enumerate()
        .map(|(i, c)| {
            let mut s = c.join(" ");
            if i + 1 < words.len().div_ceil(4) {
                s.push(' ');
            }
            s
        })
        .collect();
    if prompt.to_lowercase().contains("markdown") {
        chunks.extend(MARKDOWN_SAMPLE.split_inclusive('\n').map(str::to_string));
    }
    chunks
}

/// What the demo appends when asked for Markdown: a line at a time.
pub(crate) const MARKDOWN_SAMPLE: &str =
    "\n\n| Step | State |\n| --- | :---: |\n| build | done |\n| test | running |\n\n\
> Quoted from the plan.\n\n```rust\nfn main() {\n    let answer = 42;\n    println!(\"{answer}\");\n}\n```\n";

pub(crate) struct DemoTurn {
    pub(crate) turn: TurnRequest,
    pub(crate) sink: Arc<dyn ChatSink>,
    pub(crate) control: mpsc::UnboundedReceiver<TurnControl>,
    pub(crate) pace: DemoPace,
    pub(crate) started: Instant,
    pub(crate) output_words: i64,
    /// Steering messages taken at a step and not answered yet.
    pub(crate) steering: std::collections::VecDeque<String>,
    /// Where it writes its notes, if it has a workspace.
    pub(crate) workspace: Option<DemoWorkspace>,
}

impl DemoTurn {
    /// Runs the turn; `None` means it stopped early (cancelled, or its chat is gone).
    pub(crate) async fn run(&mut self) -> Option<()> {
        let chat = self.turn.chat.clone();
        let turn_id = self.turn.turn_id.clone();
        let prompt = self.turn.prompt.clone();
        let lower = prompt.to_lowercase();

        self.pause().await?;
        self.emit(StateAction::ChatResponsePart(ChatResponsePartAction {
            turn_id: turn_id.clone(),
            part: ResponsePart::Reasoning(ReasoningResponsePart {
                id: format!("{turn_id}-reasoning"),
                content: String::new(),
            }),
            meta: None,
        }))?;
        for thought in ["Reading the prompt. ", "Planning a short reply."] {
            self.pause().await?;
            self.emit(StateAction::ChatReasoning(ChatReasoningAction {
                turn_id: turn_id.clone(),
                part_id: format!("{turn_id}-reasoning"),
                content: thought.into(),
                meta: None,
            }))?;
        }

        self.stream_markdown("reply", &reply_chunks(&prompt)).await?;
        // What it was given besides the message, by label (it keeps no memory, so it only says so).
        if !self.turn.attachments.is_empty() {
            let labels: Vec<&str> = self.turn.attachments.iter().map(|a| a.label()).collect();
            let seen = format!(" Attached: {}.", labels.join(", "));
            self.stream_markdown("attachments", &[seen]).await?;
        }

        let client_tool = self.turn.client_tools.first().cloned();
        match client_tool {
            Some(tool) if lower.contains("client tool") => self.run_client_tool(&tool, &prompt).await?,
            _ if lower.contains("tool") => self.run_tool_call(&prompt).await?,
            _ => {}
        }
        if lower.contains("input") {
            self.ask_for_input().await?;
        }

        self.write_notes(&prompt).await;
        self.pause().await?;
        let mut steered = 0;
        while let Some(text) = self.steering.pop_front() {
            steered += 1;
            let part = format!("steering-{steered}");
            self.stream_markdown(&part, &[format!("Steering taken: \"{text}\".")])
                .await?;
        }
        self.emit(StateAction::ChatUsage(ChatUsageAction {
            turn_id: turn_id.clone(),
            usage: UsageInfo {
                input_tokens: Some(prompt.split_whitespace().count() as i64),
                output_tokens: Some(self.output_words),
                model: Some("demo".into()),
                cache_read_tokens: None,
                meta: None,
            },
            meta: None,
        }))?;
        self.emit(StateAction::ChatTurnComplete(ChatTurnCompleteAction {
            turn_id,
            duration: self.started.elapsed().as_millis() as i64,
            meta: None,
        }))?;
        tracing::debug!(%chat, "demo turn complete");
        Some(())
    }

    /// With a workspace: append the prompt to `notes.md` in the session's directory (a change to review).
    pub(crate) async fn write_notes(&mut self, prompt: &str) {
        let Some(workspace) = &self.workspace else {
            return;
        };
        let turn = &self.turn;
        let dir = match workspace.session_dir(
            &turn.tenant,
            &turn.host,
            &turn.session,
            turn.working_directory.as_deref(),
        ) {
            Ok(dir) => dir,
            Err(why) => {
                tracing::debug!(%why, "the demo agent writes no notes");
                return;
            }
        };
        let line = format!("- {}\n", prompt.lines().next().unwrap_or_default());
        let write = crate::files::FileOp::Write {
            path: format!("{dir}/notes.md"),
            data: base64::Engine::encode(&base64::engine::general_purpose::STANDARD, line.as_bytes()),
            create_only: false,
            mode: crate::files::WriteMode::Append,
            position: 0,
            if_match: None,
        };
        if let Err(error) = workspace.files.call(&turn.tenant, write).await {
            tracing::debug!(%error, "the demo agent's notes were not written");
        }
    }

    pub(crate) async fn run_tool_call(&mut self, prompt: &str) -> Option<()> {
        let turn_id = self.turn.turn_id.clone();
        let tool_call_id = format!("{turn_id}-tool");
        self.pause().await?;
        self.emit(StateAction::ChatToolCallStart(ChatToolCallStartAction {
            turn_id: turn_id.clone(),
            tool_call_id: tool_call_id.clone(),
            meta: None,
            tool_name: "demo_echo".into(),
            display_name: "Echo".into(),
            intention: Some("Echo the prompt back".into()),
            contributor: None,
        }))?;
        self.pause().await?;
        self.emit(StateAction::ChatToolCallReady(ChatToolCallReadyAction {
            turn_id: turn_id.clone(),
            tool_call_id: tool_call_id.clone(),
            meta: None,
            contributor: None,
            intention: None,
            invocation_message: StringOrMarkdown::Plain("Echo the prompt".into()),
            tool_input: Some(ToolInput::Inline(prompt.to_string())),
            confirmation_title: Some(StringOrMarkdown::Plain("Run the echo tool?".into())),
            risk_assessment: None,
            edits: None,
            editable: Some(false),
            confirmed: None,
            options: Some(vec![
                ConfirmationOption {
                    id: "allow".into(),
                    label: "Allow".into(),
                    kind: ConfirmationOptionKind::Approve,
                    group: None,
                },
                ConfirmationOption {
                    id: "deny".into(),
                    label: "Deny".into(),
                    kind: ConfirmationOptionKind::Deny,
                    group: None,
                },
            ]),
        }))?;
        let approved = loop {
            match self.control.recv().await? {
                TurnControl::ToolCallConfirmed {
                    tool_call_id: id,
                    approved,
                    ..
                } if id == tool_call_id => break approved,
                TurnControl::Cancelled => return None,
                TurnControl::Steer { text } => self.steering.push_back(text),
                _ => continue,
            }
        };
        if approved {
            self.pause().await?;
            self.emit(StateAction::ChatToolCallComplete(ChatToolCallCompleteAction {
                turn_id,
                tool_call_id,
                meta: None,
                result: ToolCallResult {
                    success: true,
                    past_tense_message: StringOrMarkdown::Plain("Echoed the prompt".into()),
                    content: Some(vec![
                        ToolResultContent::Text(ToolResultTextContent {
                            text: prompt.to_string(),
                        }),
                        ToolResultContent::FileEdit(crate::acp::turn_content::file_edit(
                            std::path::Path::new(DEMO_EDITED_FILE),
                            Some(DEMO_EDITED_BEFORE),
                            &format!("{DEMO_EDITED_BEFORE}{prompt}\n"),
                        )),
                    ]),
                    structured_content: None,
                    error: None,
                },
                requires_result_confirmation: None,
            }))?;
            self.stream_markdown(
                "after-tool",
                &["The tool ran ".into(), "and echoed your prompt.".into()],
            )
            .await
        } else {
            self.stream_markdown(
                "after-tool",
                &["The tool call was denied, ".into(), "so I did not run it.".into()],
            )
            .await
        }
    }

    /// Hand a tool call to the client that offers `tool`, and wait until it completes (or fails because that
    /// client went away).
    pub(crate) async fn run_client_tool(
        &mut self,
        tool: &crate::provider::ClientTool,
        prompt: &str,
    ) -> Option<()> {
        let turn_id = self.turn.turn_id.clone();
        let tool_call_id = format!("{turn_id}-client-tool");
        let contributor = Some(ToolCallContributor::Client(ToolCallClientContributor {
            client_id: tool.client_id.clone(),
        }));
        self.pause().await?;
        self.emit(StateAction::ChatToolCallStart(ChatToolCallStartAction {
            turn_id: turn_id.clone(),
            tool_call_id: tool_call_id.clone(),
            meta: None,
            tool_name: tool.name.clone(),
            display_name: tool.name.clone(),
            intention: Some("Run the client's tool".into()),
            contributor: contributor.clone(),
        }))?;
        self.emit(StateAction::ChatToolCallReady(ChatToolCallReadyAction {
            turn_id,
            tool_call_id: tool_call_id.clone(),
            meta: None,
            contributor,
            intention: None,
            invocation_message: StringOrMarkdown::Plain(format!("Run {}", tool.name)),
            tool_input: Some(ToolInput::Inline(prompt.to_string())),
            confirmation_title: None,
            risk_assessment: None,
            edits: None,
            editable: None,
            confirmed: Some(ToolCallConfirmationReason::NotNeeded),
            options: None,
        }))?;
        let success = loop {
            match self.control.recv().await? {
                TurnControl::ToolCallCompleted {
                    tool_call_id: id,
                    success,
                } if id == tool_call_id => break success,
                TurnControl::Cancelled => return None,
                TurnControl::Steer { text } => self.steering.push_back(text),
                _ => continue,
            }
        };
        let outcome = if success {
            "The client's tool finished."
        } else {
            "The client's tool failed, so I carried on without it."
        };
        self.stream_markdown("after-client-tool", &[outcome.into()]).await
    }

    pub(crate) async fn ask_for_input(&mut self) -> Option<()> {
        let request_id = format!("{}-input", self.turn.turn_id);
        self.pause().await?;
        self.emit(StateAction::ChatInputRequested(ChatInputRequestedAction {
            request: ChatInputRequest {
                id: request_id.clone(),
                message: Some("What should I call you?".into()),
                url: None,
                questions: Some(vec![ChatInputQuestion::Text(ChatInputTextQuestion {
                    id: "name".into(),
                    title: Some("Name".into()),
                    message: "Your name".into(),
                    required: Some(true),
                    format: None,
                    min: None,
                    max: None,
                    default_value: None,
                })]),
                answers: None,
            },
        }))?;
        let (response, answers) = loop {
            match self.control.recv().await? {
                TurnControl::InputCompleted {
                    request_id: id,
                    response,
                    answers,
                } if id == request_id => break (response, answers),
                TurnControl::Cancelled => return None,
                TurnControl::Steer { text } => self.steering.push_back(text),
                _ => continue,
            }
        };
        let name = answers
            .as_ref()
            .and_then(|a| a.get("name"))
            .and_then(|a| match a {
                ChatInputAnswer::Submitted(v) | ChatInputAnswer::Draft(v) => match &v.value {
                    ChatInputAnswerValue::Text(t) => Some(t.value.clone()),
                    _ => None,
                },
                ChatInputAnswer::Skipped(_) => None,
            });
        let reply = match (response, name) {
            (ChatInputResponseKind::Accept, Some(name)) => format!("Nice to meet you, {name}."),
            _ => "No answer given; carrying on.".to_string(),
        };
        self.stream_markdown("after-input", &[reply]).await
    }

    pub(crate) async fn stream_markdown(&mut self, part: &str, chunks: &[String]) -> Option<()> {
        let turn_id = self.turn.turn_id.clone();
        let part_id = format!("{turn_id}-{part}");
        self.pause().await?;
        self.emit(StateAction::ChatResponsePart(ChatResponsePartAction {
            turn_id: turn_id.clone(),
            part: ResponsePart::Markdown(MarkdownResponsePart {
                id: part_id.clone(),
                content: String::new(),
            }),
            meta: None,
        }))?;
        for chunk in chunks {
            self.pause().await?;
            self.output_words += chunk.split_whitespace().count() as i64;
            self.emit(StateAction::ChatDelta(ChatDeltaAction {
                turn_id: turn_id.clone(),
                part_id: part_id.clone(),
                content: chunk.clone(),
                meta: None,
            }))?;
        }
        Some(())
    }

    /// Waits one step; `None` if the turn was cancelled meanwhile.
    pub(crate) async fn pause(&mut self) -> Option<()> {
        let sleep = tokio::time::sleep(self.pace.step);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => return Some(()),
                control = self.control.recv() => match control {
                    Some(TurnControl::Cancelled) | None => return None,
                    Some(TurnControl::Steer { text }) => self.steering.push_back(text),
                    Some(_) => continue,
                },
            }
        }
    }

    pub(crate) fn emit(&self, action: StateAction) -> Option<()> {
        self.sink.emit(&self.turn.chat, action).applied().then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_is_streamed_in_several_chunks_that_join_to_the_reply() {
        let chunks = reply_chunks("hi there");
        assert!(chunks.len() >= 3, "{chunks:?}");
        let joined: String = chunks.concat();
        assert!(joined.starts_with("Hello from the demo agent. You said: \"hi there\"."));
        assert!(!joined.contains("  "));
        assert!(!joined.contains("```"), "no Markdown sample unless asked");
        let sample: String = reply_chunks("show markdown").concat();
        assert!(
            sample.contains("| Step | State |") && sample.ends_with("```\n"),
            "{sample}"
        );
    }
}
