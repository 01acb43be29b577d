//! One prompt turn of an ACP session: the prompt sent (context, attachments, message), everything the agent
//! sends mapped until it answers, the user's decisions forwarded, and the turn cut at a cancel that is not
//! honoured, the output budget or the workspace quota.

use std::time::Duration;

use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, PromptRequest, RequestPermissionOutcome, RequestPermissionResponse,
    SessionId, TextContent,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Agent;
use ahp_types::state::ChatInputResponseKind;

use super::agent_link::{AgentAsks, Prompt};
use super::turn::TurnMapper;
use crate::provider::TurnControl;

/// How often streamed text is flushed while the agent keeps sending chunks.
pub(crate) const COALESCE_EVERY: Duration = Duration::from_millis(40);

/// How long an agent may take to stop after `session/cancel` before the turn ends without it.
pub(crate) const CANCEL_PATIENCE: Duration = Duration::from_secs(10);

/// What bounds a turn: its output budget, and its tenant's workspace quota.
pub(crate) struct Bounds<'a> {
    pub(crate) meter: &'a super::meter::OutputMeter,
    pub(crate) slot: &'a super::quota::RunningSlot,
}

/// The note that ends a turn cut at its output budget.
pub(crate) fn output_limit_message(per_turn: u64) -> String {
    format!(
        "The agent's output passed the output limit of {per_turn} bytes per turn: the rest was dropped and the \
         turn was stopped."
    )
}

/// Prompt the agent with one turn and map everything it sends until the prompt answers (or the turn passes
/// its output budget, or the tenant's workspace its quota: then the turn is cut with a note).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_turn(
    cx: &ConnectionTo<Agent>,
    session_id: &SessionId,
    session: &str,
    mut prompt: Prompt,
    note: Option<&str>,
    asks: &mut AgentAsks,
    terminals: &super::terminal::Terminals,
    bounds: Bounds<'_>,
) {
    // A question or permission that arrived while no turn ran (a tool call that outlived its turn) belongs to
    // none: it is withdrawn, never shown in this turn.
    while let Ok((_, responder)) = asks.permissions.try_recv() {
        let _ = responder.respond(RequestPermissionResponse::new(
            RequestPermissionOutcome::Cancelled,
        ));
    }
    while let Ok((_, responder)) = asks.elicitations.try_recv() {
        if let Some(cancel) = super::elicit::response_of(ChatInputResponseKind::Cancel, None) {
            let _ = responder.respond(cancel);
        }
    }
    let mut mapper =
        TurnMapper::new(prompt.chat.clone(), prompt.turn_id.clone(), prompt.sink.clone()).in_session(session);
    if let Some(note) = note {
        mapper.system_note(note);
    }
    // The chat's history the agent has not seen goes first, as its own block; then the attachments; the
    // user's message last.
    let blocks = prompt
        .context
        .take()
        .map(|context| ContentBlock::Text(TextContent::new(context)))
        .into_iter()
        .chain(std::mem::take(&mut prompt.attached))
        .chain(std::iter::once(ContentBlock::Text(TextContent::new(
            prompt.text.clone(),
        ))))
        .collect();
    let reply = cx
        .send_request(PromptRequest::new(session_id.clone(), blocks))
        .block_task();
    tokio::pin!(reply);
    let mut flush = tokio::time::interval(COALESCE_EVERY);
    let mut cancelled: Option<tokio::time::Instant> = None;
    let mut control_open = true;
    loop {
        let cancel_deadline = cancelled.map(|at| at + CANCEL_PATIENCE);
        tokio::select! {
            biased;
            result = &mut reply => {
                // Updates sent before the answer are in the channel already: map them first.
                while let Ok(notification) = asks.updates.try_recv() {
                    if &notification.session_id == session_id {
                        mapper.update(notification.update);
                    }
                }
                match result {
                    // The answer raced the cut (a command stopped at the budget, say): the turn was cut.
                    Ok(_) if bounds.meter.is_cut() && cancelled.is_none() => {
                        mapper.fail("outputLimit", &output_limit_message(bounds.meter.per_turn()), false);
                    }
                    Ok(response) => mapper.finish(response.stop_reason),
                    Err(error) => mapper.fail("agentError", &error.to_string(), false),
                }
                return;
            }
            Some(notification) = asks.updates.recv() => {
                if &notification.session_id == session_id {
                    mapper.update(notification.update);
                }
            }
            // A question or permission of another ACP session (a turn of another chat that ended, late) is
            // not this turn's: it is withdrawn, never shown in this chat.
            Some((request, responder)) = asks.elicitations.recv() => {
                if super::elicit::session_of(&request).is_some_and(|id| id != session_id) {
                    if let Some(cancel) = super::elicit::response_of(ChatInputResponseKind::Cancel, None) {
                        let _ = responder.respond(cancel);
                    }
                    continue;
                }
                mapper.elicitation(request, responder);
                if cancelled.is_some() {
                    mapper.cancel_permissions();
                }
            }
            Some((request, responder)) = asks.permissions.recv() => {
                if &request.session_id != session_id {
                    let _ = responder.respond(RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled));
                    continue;
                }
                if cancelled.is_some() {
                    mapper.permission(request, responder);
                    mapper.cancel_permissions();
                } else {
                    mapper.permission(request, responder);
                }
            }
            control = prompt.control.recv(), if control_open => match control {
                Some(TurnControl::ToolCallConfirmed { tool_call_id, approved, selected_option_id }) => {
                    mapper.confirmed(&tool_call_id, approved, selected_option_id.as_deref());
                }
                Some(TurnControl::InputCompleted { request_id, response, answers }) => {
                    mapper.input_completed(&request_id, response, answers.as_ref());
                }
                Some(TurnControl::Cancelled) | None => {
                    control_open = control.is_some();
                    if cancelled.is_none() {
                        cancelled = Some(tokio::time::Instant::now());
                        terminals.kill_chat(&prompt.chat);
                        if let Err(error) = cx.send_notification(CancelNotification::new(session_id.clone())) {
                            tracing::warn!(%error, "could not send session/cancel");
                        }
                        mapper.cancel_permissions();
                    }
                }
                Some(_) => {}
            },
            () = sleep_until(cancel_deadline) => {
                mapper.fail("agentDidNotStop", "the agent did not stop after being cancelled", true);
                return;
            }
            () = bounds.meter.cut(), if cancelled.is_none() => {
                stop_agent_turn(cx, session_id, &prompt.chat, terminals, &mut mapper);
                mapper.fail("outputLimit", &output_limit_message(bounds.meter.per_turn()), false);
                return;
            }
            message = bounds.slot.workspace_exceeded(), if cancelled.is_none() => {
                stop_agent_turn(cx, session_id, &prompt.chat, terminals, &mut mapper);
                mapper.fail("quotaExceeded", &message, false);
                return;
            }
            _ = flush.tick(), if mapper.has_pending_text() => mapper.flush(),
        }
    }
}

/// Tell the agent to stop the turn the relay is ending: its commands are killed, its questions withdrawn.
pub(crate) fn stop_agent_turn(
    cx: &ConnectionTo<Agent>,
    session_id: &SessionId,
    chat: &str,
    terminals: &super::terminal::Terminals,
    mapper: &mut TurnMapper,
) {
    terminals.kill_chat(chat);
    if let Err(error) = cx.send_notification(CancelNotification::new(session_id.clone())) {
        tracing::warn!(%error, "could not send session/cancel");
    }
    mapper.cancel_permissions();
}

/// Resolves at `deadline`, or never without one.
pub(crate) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
