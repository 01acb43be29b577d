//! What the test agent does with a prompt: the script the crate's doc lists, keyed by what the prompt contains.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::replies::*;
use crate::session_files::*;
use crate::terminals::*;
use agent_client_protocol::v1::schema::{
    ContentBlock, CreateElicitationRequest, PermissionOption, PermissionOptionKind, RequestPermissionOutcome,
    RequestPermissionRequest, SessionId, SessionInfoUpdate, SessionUpdate, StopReason, ToolCall,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind, WriteTextFileRequest,
};
use agent_client_protocol::v1::schema::{
    CreateTerminalRequest, Diff, Plan, PlanEntry, PlanEntryPriority, PlanEntryStatus, ReleaseTerminalRequest,
    TerminalOutputRequest, ToolCallContent, UsageUpdate, WaitForTerminalExitRequest,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Client;

/// The model and settings the relay chose for the session, as the agent reports them.
pub(crate) struct Chosen {
    pub(crate) model: Option<String>,
    pub(crate) settings: String,
}

pub(crate) async fn script(
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    prompt: &str,
    context: Option<String>,
    cwd: &std::path::Path,
    cancelled: &AtomicBool,
    chosen: Chosen,
) -> agent_client_protocol::Result<StopReason> {
    let Chosen { model, settings } = chosen;
    if let Some(command) = prompt.strip_prefix("sh: ") {
        return run_shell(cx, session, command, cwd, cancelled).await;
    }
    if let Some((count, command)) = prompt
        .strip_prefix("terminals ")
        .and_then(|rest| rest.split_once(": "))
        .and_then(|(count, command)| Some((count.parse::<usize>().ok()?, command)))
    {
        return many_terminals(cx, session, count, command).await;
    }
    if let Some((name, command)) = prompt
        .strip_prefix("term-env ")
        .and_then(|rest| rest.split_once(": "))
    {
        let request = CreateTerminalRequest::new(session.clone(), "sh")
            .args(vec!["-c".to_string(), command.to_string()])
            .env(vec![{
                let (name, value) = name.split_once(' ').unwrap_or((name, "x"));
                agent_client_protocol::v1::schema::EnvVariable::new(name, value)
            }])
            .output_byte_limit(4096_u64);
        let said = match cx.send_request(request).block_task().await {
            Ok(created) => {
                let terminal = created.terminal_id;
                cx.send_request(WaitForTerminalExitRequest::new(session.clone(), terminal.clone()))
                    .block_task()
                    .await?;
                let output = cx
                    .send_request(TerminalOutputRequest::new(session.clone(), terminal.clone()))
                    .block_task()
                    .await?
                    .output;
                cx.send_request(ReleaseTerminalRequest::new(session.clone(), terminal))
                    .block_task()
                    .await?;
                format!("RAN: {output}")
            }
            Err(error) => format!("REFUSED: {error}"),
        };
        say(cx, session, SessionUpdate::AgentMessageChunk(chunk(&said)))?;
        return Ok(StopReason::EndTurn);
    }
    if let Some(command) = prompt.strip_prefix("term: ") {
        let said = run_in_terminal(cx, session, "term", "sh", &["-c", command], None).await?;
        say(cx, session, SessionUpdate::AgentMessageChunk(chunk(&said)))?;
        return Ok(StopReason::EndTurn);
    }
    if prompt.contains("fail") {
        return Err(agent_client_protocol::Error::internal_error().data("the test agent was asked to fail"));
    }
    if let Some(count) = prompt
        .split_whitespace()
        .skip_while(|w| *w != "chunks")
        .nth(1)
        .and_then(|n| n.parse::<usize>().ok())
    {
        for _ in 0..count {
            say(cx, session, SessionUpdate::AgentMessageChunk(chunk("x")))?;
        }
        return Ok(StopReason::EndTurn);
    }
    if prompt.contains("big output") {
        // 30,000 zero bytes, base64.
        let image = "AAAA".repeat(10_000);
        let contents = vec![
            ToolCallContent::Diff(
                Diff::new(cwd.join("big.txt"), "new line\n".repeat(7_000))
                    .old_text("old line\n".repeat(5_000)),
            ),
            ToolCallContent::Content(agent_client_protocol::v1::schema::Content::new(
                ContentBlock::Text(agent_client_protocol::v1::schema::TextContent::new(
                    "output line\n".repeat(5_000),
                )),
            )),
            ToolCallContent::Content(agent_client_protocol::v1::schema::Content::new(
                ContentBlock::Image(agent_client_protocol::v1::schema::ImageContent::new(
                    image,
                    "image/png",
                )),
            )),
        ];
        let tool = ToolCall::new("big", "Produce big output")
            .kind(ToolKind::Edit)
            .status(ToolCallStatus::Completed)
            .content(contents);
        say(cx, session, SessionUpdate::ToolCall(tool))?;
    }
    if prompt.contains("limits") {
        // Its open-files limit, as the kernel applies it.
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let open_files = limits
            .lines()
            .find(|line| line.starts_with("Max open files"))
            .and_then(|line| line.split_whitespace().nth(3))
            .unwrap_or("unknown")
            .to_string();
        say(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(chunk(&format!("NOFILE: {open_files}."))),
        )?;
        return Ok(StopReason::EndTurn);
    }
    if prompt.contains("environment") {
        let mut names: Vec<String> = std::env::vars().map(|(name, _)| name).collect();
        names.sort();
        say(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(chunk(&format!("ENV: {}.", names.join(",")))),
        )?;
        return Ok(StopReason::EndTurn);
    }
    say(
        cx,
        session,
        SessionUpdate::AgentThoughtChunk(chunk("Thinking about it.")),
    )?;
    for word in format!("The test agent heard: {prompt}.").split_inclusive(' ') {
        say(cx, session, SessionUpdate::AgentMessageChunk(chunk(word)))?;
    }
    if prompt.contains("ask later") {
        // A tool call that outlives its turn: once a file `go` exists in its directory, a permission request of
        // this session, whatever the relay runs by then; the answer goes to `late-outcome` in the directory.
        let late = cx.clone();
        let session = session.clone();
        let cwd = cwd.to_path_buf();
        cx.spawn(async move {
            while !cwd.join("go").exists() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            let asked = RequestPermissionRequest::new(
                session,
                ToolCallUpdate::new(
                    "late-call",
                    ToolCallUpdateFields::new().title("A question asked late".to_string()),
                ),
                vec![PermissionOption::new(
                    "allow",
                    "Allow",
                    PermissionOptionKind::AllowOnce,
                )],
            );
            let outcome = match late.send_request(asked).block_task().await {
                Ok(answer) => match answer.outcome {
                    RequestPermissionOutcome::Cancelled => "cancelled".to_string(),
                    RequestPermissionOutcome::Selected(chosen) => format!("selected {}", chosen.option_id),
                    _ => "unknown".to_string(),
                },
                Err(error) => format!("error {error}"),
            };
            std::fs::write(cwd.join("late-outcome"), outcome)
                .map_err(agent_client_protocol::Error::into_internal_error)
        })?;
    }
    if prompt.contains("permission") {
        let tool = ToolCall::new("write-notes", "Write notes.txt")
            .kind(ToolKind::Edit)
            .status(ToolCallStatus::Pending);
        say(cx, session, SessionUpdate::ToolCall(tool))?;
        let options = vec![
            PermissionOption::new("allow", "Allow once", PermissionOptionKind::AllowOnce),
            PermissionOption::new("allow-always", "Always allow", PermissionOptionKind::AllowAlways),
            PermissionOption::new("reject", "Reject", PermissionOptionKind::RejectOnce),
        ];
        let asked = RequestPermissionRequest::new(
            session.clone(),
            ToolCallUpdate::new(
                "write-notes",
                ToolCallUpdateFields::new().title("Write notes.txt".to_string()),
            ),
            options,
        );
        let answer = cx.send_request(asked).block_task().await?;
        let allowed = matches!(&answer.outcome, RequestPermissionOutcome::Selected(s) if s.option_id.to_string() == "allow");
        if matches!(answer.outcome, RequestPermissionOutcome::Cancelled) || cancelled.load(Ordering::SeqCst) {
            return Ok(StopReason::Cancelled);
        }
        if allowed {
            // Through the client (the relay), which keeps it inside the session's directory.
            cx.send_request(WriteTextFileRequest::new(
                session.clone(),
                cwd.join("notes.txt"),
                "written by the test agent\n",
            ))
            .block_task()
            .await?;
        }
        let status = if allowed {
            ToolCallStatus::Completed
        } else {
            ToolCallStatus::Failed
        };
        let mut fields = ToolCallUpdateFields::new().status(status);
        if allowed {
            fields = fields.content(vec![ToolCallContent::Diff(Diff::new(
                cwd.join("notes.txt"),
                "written by the test agent\n",
            ))]);
        }
        say(
            cx,
            session,
            SessionUpdate::ToolCallUpdate(ToolCallUpdate::new("write-notes", fields)),
        )?;
        let outcome = if allowed {
            " Wrote notes.txt."
        } else {
            " Did not write notes.txt."
        };
        say(cx, session, SessionUpdate::AgentMessageChunk(chunk(outcome)))?;
        if allowed {
            let said = run_in_terminal(cx, session, "cat-notes", "cat", &["notes.txt"], None).await?;
            say(cx, session, SessionUpdate::AgentMessageChunk(chunk(&said)))?;
        }
    }
    if prompt.contains("settings") {
        say(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(chunk(&format!(" SETTINGS: {settings}."))),
        )?;
    }
    if prompt.contains("plan") {
        let plan = Plan::new(vec![
            PlanEntry::new(
                "Read the code",
                PlanEntryPriority::High,
                PlanEntryStatus::Completed,
            ),
            PlanEntry::new(
                "Write the fix",
                PlanEntryPriority::High,
                PlanEntryStatus::InProgress,
            ),
            PlanEntry::new(
                "Run the tests",
                PlanEntryPriority::Medium,
                PlanEntryStatus::Pending,
            ),
        ]);
        say(cx, session, SessionUpdate::Plan(plan))?;
        say(
            cx,
            session,
            SessionUpdate::UsageUpdate(UsageUpdate::new(1200, 200_000)),
        )?;
    }
    if prompt.contains("run a command") {
        // Waits for a file named `go` in its directory (a test creates it while watching) before it ends.
        let args = [
            "-c",
            "echo hello-from-terminal; while [ ! -e go ]; do sleep 0.05; done; echo bye; exit 3",
        ];
        let said = run_in_terminal(cx, session, "run-shell", "sh", &args, None).await?;
        say(cx, session, SessionUpdate::AgentMessageChunk(chunk(&said)))?;
    }
    if let Some(model) = model {
        say(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(chunk(&format!(" MODEL: {model}."))),
        )?;
    }
    if prompt.contains("ask me") {
        // A form: a required name and a colour from a list; the answer is echoed.
        let asked: CreateElicitationRequest = serde_json::from_value(serde_json::json!({
            "mode": "form",
            "sessionId": session.to_string(),
            "message": "Tell me about you",
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "title": "Name"},
                    "colour": {"type": "string", "title": "Colour", "enum": ["red", "green"]}
                },
                "required": ["name"]
            }
        }))
        .map_err(agent_client_protocol::Error::into_internal_error)?;
        let answer = cx.send_request(asked).block_task().await?;
        let answer =
            serde_json::to_value(&answer).map_err(agent_client_protocol::Error::into_internal_error)?;
        let said = match answer["action"].as_str() {
            Some("accept") => format!(
                " ANSWER: name={}, colour={}.",
                answer["content"]["name"].as_str().unwrap_or("?"),
                answer["content"]["colour"].as_str().unwrap_or("?")
            ),
            other => format!(" ANSWER: {}.", other.unwrap_or("?")),
        };
        say(cx, session, SessionUpdate::AgentMessageChunk(chunk(&said)))?;
    }
    if prompt.contains("ask overlapping") {
        // Two questions at once; once the first is answered, a third while the second still waits.
        let form = |message: &str| {
            serde_json::from_value::<CreateElicitationRequest>(serde_json::json!({
                "mode": "form",
                "sessionId": session.to_string(),
                "message": message,
                "requestedSchema": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "title": "Name"}},
                    "required": ["name"]
                }
            }))
            .map_err(agent_client_protocol::Error::into_internal_error)
        };
        let first = cx.send_request(form("first")?);
        let second = cx.send_request(form("second")?);
        let mut names = Vec::new();
        let first = first.block_task().await?;
        names.push(serde_json::to_value(&first).map_err(agent_client_protocol::Error::into_internal_error)?);
        let third = cx.send_request(form("third")?);
        for answer in [second.block_task().await?, third.block_task().await?] {
            names.push(
                serde_json::to_value(&answer).map_err(agent_client_protocol::Error::into_internal_error)?,
            );
        }
        let names: Vec<&str> = names
            .iter()
            .map(|answer| answer["content"]["name"].as_str().unwrap_or("?"))
            .collect();
        say(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(chunk(&format!(" ANSWERS: {}.", names.join(", ")))),
        )?;
    }
    if prompt.contains("escape") {
        // Try to leave the working directory through the relay: each attempt must be refused.
        for target in [
            cwd.join("../escaped.txt"),
            PathBuf::from("/tmp/ahp-relay-escaped.txt"),
            cwd.join("link/escaped.txt"),
        ] {
            let written = cx
                .send_request(WriteTextFileRequest::new(
                    session.clone(),
                    target.clone(),
                    "escaped",
                ))
                .block_task()
                .await;
            let verdict = if written.is_ok() { "WRITTEN" } else { "refused" };
            say(
                cx,
                session,
                SessionUpdate::AgentMessageChunk(chunk(&format!(" {verdict}:{}", target.display()))),
            )?;
        }
        for directory in [cwd.join(".."), PathBuf::from("/tmp"), cwd.join("link")] {
            let created = cx
                .send_request(
                    CreateTerminalRequest::new(session.clone(), "touch")
                        .args(vec!["escaped-by-terminal.txt".to_string()])
                        .cwd(directory.clone()),
                )
                .block_task()
                .await;
            let verdict = if created.is_ok() { "RAN" } else { "refused-cwd" };
            say(
                cx,
                session,
                SessionUpdate::AgentMessageChunk(chunk(&format!(" {verdict}:{}", directory.display()))),
            )?;
        }
    }
    let seen = load_count(cwd, &session.to_string()).unwrap_or(0) + 1;
    store_count(cwd, &session.to_string(), seen)?;
    if seen == 1 {
        // A title for the session, from its first prompt.
        let title: String = prompt.split_whitespace().take(4).collect::<Vec<_>>().join(" ");
        say(
            cx,
            session,
            SessionUpdate::SessionInfoUpdate(SessionInfoUpdate::new().title(format!("Test: {title}"))),
        )?;
    }
    say(
        cx,
        session,
        SessionUpdate::AgentMessageChunk(chunk(&format!(" This session has seen {seen} prompts."))),
    )?;
    if let Some(context) = context {
        // What the client told it besides the message, on one line.
        let context = context.replace('\n', " | ");
        say(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(chunk(&format!(" CONTEXT GIVEN: {context}"))),
        )?;
    }
    if prompt.contains("slow") {
        for i in 0..500 {
            if cancelled.load(Ordering::SeqCst) {
                return Ok(StopReason::Cancelled);
            }
            say(
                cx,
                session,
                SessionUpdate::AgentMessageChunk(chunk(&format!(" {i}"))),
            )?;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    Ok(StopReason::EndTurn)
}
