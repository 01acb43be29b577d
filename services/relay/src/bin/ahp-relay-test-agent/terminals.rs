//! Commands the test agent runs: in a relay terminal (`terminal/create`, one or many at once), or itself with
//! `sh -c` (its output streamed as the reply, at most 64 KiB unread by the relay).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::replies::*;
use agent_client_protocol::v1::schema::{
    CreateTerminalRequest, ReleaseTerminalRequest, Terminal, TerminalOutputRequest, ToolCallContent,
    WaitForTerminalExitRequest,
};
use agent_client_protocol::v1::schema::{
    ReadTextFileRequest, SessionId, SessionUpdate, StopReason, ToolCall, ToolCallStatus, ToolCallUpdate,
    ToolCallUpdateFields, ToolKind,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Client;

/// Run `command args` in a relay terminal as tool call `tool_id` (linked to the terminal), wait for it, and
/// say what it printed and how it exited.
pub(crate) async fn run_in_terminal(
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    tool_id: &str,
    command: &str,
    args: &[&str],
    directory: Option<PathBuf>,
) -> agent_client_protocol::Result<String> {
    say(
        cx,
        session,
        SessionUpdate::ToolCall(
            ToolCall::new(tool_id.to_string(), format!("Run {command}"))
                .kind(ToolKind::Execute)
                .status(ToolCallStatus::Pending),
        ),
    )?;
    let mut request = CreateTerminalRequest::new(session.clone(), command)
        .args(args.iter().map(|arg| arg.to_string()).collect::<Vec<_>>())
        .output_byte_limit(4096_u64);
    if let Some(directory) = directory {
        request = request.cwd(directory);
    }
    let terminal = cx.send_request(request).block_task().await?.terminal_id;
    say(
        cx,
        session,
        SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
            tool_id.to_string(),
            ToolCallUpdateFields::new()
                .status(ToolCallStatus::InProgress)
                .content(vec![ToolCallContent::Terminal(Terminal::new(terminal.clone()))]),
        )),
    )?;
    let exit = cx
        .send_request(WaitForTerminalExitRequest::new(session.clone(), terminal.clone()))
        .block_task()
        .await?
        .exit_status;
    let output = cx
        .send_request(TerminalOutputRequest::new(session.clone(), terminal.clone()))
        .block_task()
        .await?
        .output;
    cx.send_request(ReleaseTerminalRequest::new(session.clone(), terminal.clone()))
        .block_task()
        .await?;
    let code = exit.exit_code.map_or("none".to_string(), |code| code.to_string());
    say(
        cx,
        session,
        SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
            tool_id.to_string(),
            ToolCallUpdateFields::new()
                .status(ToolCallStatus::Completed)
                .content(vec![ToolCallContent::Terminal(Terminal::new(terminal))]),
        )),
    )?;
    Ok(format!(" TERMINAL: {} (exit {code}).", output.trim()))
}

/// Open `count` terminals at once running `sh -c command`; say how many the relay opened, then wait for them.
pub(crate) async fn many_terminals(
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    count: usize,
    command: &str,
) -> agent_client_protocol::Result<StopReason> {
    let mut opened = Vec::new();
    let mut refusals = Vec::new();
    for _ in 0..count {
        let request = CreateTerminalRequest::new(session.clone(), "sh")
            .args(vec!["-c".to_string(), command.to_string()])
            .output_byte_limit(4096_u64);
        match cx.send_request(request).block_task().await {
            Ok(created) => opened.push(created.terminal_id),
            Err(error) => refusals.push(error.to_string()),
        }
    }
    let first = refusals.first().cloned().unwrap_or_default();
    say(
        cx,
        session,
        SessionUpdate::AgentMessageChunk(chunk(&format!(
            "OPENED {} REFUSED {} {first}",
            opened.len(),
            refusals.len()
        ))),
    )?;
    for terminal in opened {
        cx.send_request(WaitForTerminalExitRequest::new(session.clone(), terminal.clone()))
            .block_task()
            .await?;
        cx.send_request(ReleaseTerminalRequest::new(session.clone(), terminal))
            .block_task()
            .await?;
    }
    Ok(StopReason::EndTurn)
}

/// Run `sh -c command` as this agent's own child, streaming its output (stdout and stderr) as the reply.
pub(crate) async fn run_shell(
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    command: &str,
    cwd: &std::path::Path,
    cancelled: &AtomicBool,
) -> agent_client_protocol::Result<StopReason> {
    use tokio::io::AsyncReadExt;
    let mut child = tokio::process::Command::new("sh")
        .args(["-c", command])
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(agent_client_protocol::Error::into_internal_error)?;
    let group = child.id();
    let (chunks_tx, mut chunks) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    for pipe in [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let chunks_tx = chunks_tx.clone();
        tokio::spawn(async move {
            let mut pipe = pipe;
            let mut buffer = vec![0_u8; 16 * 1024];
            while let Ok(read) = pipe.read(&mut buffer).await {
                if read == 0 || chunks_tx.send(buffer[..read].to_vec()).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(chunks_tx);
    let mut ticker = tokio::time::interval(std::time::Duration::from_millis(20));
    let mut unconfirmed = 0_usize;
    // The file its round trips read (a read that succeeds: a refused one would be logged as an error).
    let flow_control = cwd.join(".flow-control");
    let _ = std::fs::write(&flow_control, "");
    loop {
        tokio::select! {
            received = chunks.recv() => match received {
                Some(bytes) => {
                    say(
                        cx,
                        session,
                        SessionUpdate::AgentMessageChunk(chunk(&String::from_utf8_lossy(&bytes))),
                    )?;
                    unconfirmed += bytes.len();
                    if unconfirmed >= 64 * 1024 {
                        // Answered once the relay read everything sent before.
                        let _ = cx
                            .send_request(ReadTextFileRequest::new(session.clone(), flow_control.clone()))
                            .block_task()
                            .await;
                        unconfirmed = 0;
                    }
                }
                None => break,
            },
            _ = ticker.tick() => {
                if cancelled.load(Ordering::SeqCst) {
                    if let Some(group) = group {
                        // SAFETY: kill(2) with a negative pid signals the command's process group only.
                        unsafe { libc::kill(-(group as i32), libc::SIGKILL) };
                    }
                    return Ok(StopReason::Cancelled);
                }
            }
        }
    }
    let status = child
        .wait()
        .await
        .map_err(agent_client_protocol::Error::into_internal_error)?;
    use std::os::unix::process::ExitStatusExt;
    let end = match (status.code(), status.signal()) {
        (Some(code), _) => format!("\nEXIT {code}"),
        (None, Some(signal)) => format!("\nEXIT signal {signal}"),
        _ => "\nEXIT unknown".to_string(),
    };
    say(cx, session, SessionUpdate::AgentMessageChunk(chunk(&end)))?;
    Ok(StopReason::EndTurn)
}
