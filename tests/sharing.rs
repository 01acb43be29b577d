//! Several devices share one chat: they see the same envelopes, and any device can answer the agent.

mod support;

use ahp_types::actions::{ChatToolCallConfirmedAction, StateAction};
use ahp_types::state::{ResponsePart, ToolCallState, TurnState};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_receive_identical_envelopes_and_reduce_to_the_snapshot() {
    let relay = Relay::start().await;
    let (a, _) = relay.client("device-a").await;
    let (b, _) = relay.client("device-b").await;
    let (_, chat) = create_session_and_chat(&a, "shared").await;

    let (a_state, a_from, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (b_state, b_from, mut b_sub) = subscribe_chat(&b, &chat).await;

    a.dispatch(chat.clone(), turn_started("t1", "hello there"))
        .await
        .expect("dispatch");
    let a_envs = collect_until(&mut a_sub, is_turn_complete).await;
    let b_envs = collect_until(&mut b_sub, is_turn_complete).await;

    // The same envelopes, byte-for-byte the same JSON, in increasing order.
    let a_after: Vec<_> = a_envs
        .iter()
        .filter(|e| e.server_seq > b_from.max(a_from))
        .collect();
    let b_after: Vec<_> = b_envs
        .iter()
        .filter(|e| e.server_seq > b_from.max(a_from))
        .collect();
    assert_eq!(json(&a_after), json(&b_after));
    assert_increasing(&a_envs);
    assert_increasing(&b_envs);
    assert!(
        a_envs.len() > 5,
        "the demo turn streams several envelopes, got {}",
        a_envs.len()
    );
    let deltas = a_envs
        .iter()
        .filter(|e| matches!(e.action, StateAction::ChatDelta(_)))
        .count();
    assert!(deltas >= 3, "reply streamed in several deltas, got {deltas}");

    // The echo of A's own action carries its origin.
    let echo = &a_envs[0];
    assert!(matches!(echo.action, StateAction::ChatTurnStarted(_)));
    let origin = echo.origin.as_ref().expect("origin on a client action");
    assert_eq!(origin.client_id, "device-a");

    // Each client's reduced state equals a fresh snapshot taken afterwards.
    let fresh = fresh_chat_snapshot(&relay, &chat).await;
    assert_eq!(json(&reduce_chat(a_state, a_from, &a_envs)), json(&fresh));
    assert_eq!(json(&reduce_chat(b_state, b_from, &b_envs)), json(&fresh));
    assert_eq!(fresh.turns.len(), 1);
    assert_eq!(fresh.turns[0].state, TurnState::Complete);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_proposed_to_one_client_is_approved_by_another() {
    let relay = Relay::start().await;
    let (a, _) = relay.client("device-a").await;
    let (b, _) = relay.client("device-b").await;
    let (_, chat) = create_session_and_chat(&a, "tools").await;
    let (a_state, a_from, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (_, _, mut b_sub) = subscribe_chat(&b, &chat).await;

    a.dispatch(chat.clone(), turn_started("t1", "please use a tool"))
        .await
        .expect("dispatch");

    // B waits for the tool call to need confirmation, then approves it.
    let before = collect_until(
        &mut b_sub,
        |e| matches!(&e.action, StateAction::ChatToolCallReady(r) if r.confirmed.is_none()),
    )
    .await;
    let StateAction::ChatToolCallReady(ready) = &before[before.len() - 1].action else {
        unreachable!()
    };
    b.dispatch(
        chat.clone(),
        StateAction::ChatToolCallConfirmed(ChatToolCallConfirmedAction {
            turn_id: ready.turn_id.clone(),
            tool_call_id: ready.tool_call_id.clone(),
            meta: None,
            approved: true,
            confirmed: None,
            reason: None,
            edited_tool_input: None,
            user_suggestion: None,
            reason_message: None,
            selected_option_id: Some("allow".into()),
        }),
    )
    .await
    .expect("approve");

    let a_envs = collect_until(&mut a_sub, is_turn_complete).await;
    let b_rest = collect_until(&mut b_sub, is_turn_complete).await;
    let confirm = a_envs
        .iter()
        .find(|e| matches!(e.action, StateAction::ChatToolCallConfirmed(_)))
        .expect("A sees B's approval");
    assert_eq!(
        confirm.origin.as_ref().map(|o| o.client_id.as_str()),
        Some("device-b")
    );
    assert!(b_rest
        .iter()
        .any(|e| matches!(e.action, StateAction::ChatToolCallComplete(_))));

    let state = reduce_chat(a_state, a_from, &a_envs);
    let turn = state.turns.last().expect("turn finished");
    assert_eq!(turn.state, TurnState::Complete);
    let tool = turn
        .response_parts
        .iter()
        .find_map(|p| match p {
            ResponsePart::ToolCall(tc) => Some(&tc.tool_call),
            _ => None,
        })
        .expect("tool call part");
    assert!(
        matches!(tool, ToolCallState::Completed(c) if c.success),
        "{tool:?}"
    );
    assert_eq!(json(&state), json(&fresh_chat_snapshot(&relay, &chat).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_request_is_answered_from_another_device() {
    use ahp_types::actions::ChatInputCompletedAction;
    use ahp_types::state::{
        ChatInputAnswer, ChatInputAnswerValue, ChatInputAnswered, ChatInputResponseKind,
        ChatInputTextAnswerValue,
    };
    let relay = Relay::start().await;
    let (a, _) = relay.client("device-a").await;
    let (b, _) = relay.client("device-b").await;
    let (_, chat) = create_session_and_chat(&a, "input").await;
    let (state, from, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (_, _, mut b_sub) = subscribe_chat(&b, &chat).await;

    a.dispatch(chat.clone(), turn_started("t1", "ask me for input"))
        .await
        .expect("dispatch");
    let asked = collect_until(&mut b_sub, |e| {
        matches!(e.action, StateAction::ChatInputRequested(_))
    })
    .await;
    let StateAction::ChatInputRequested(request) = &asked[asked.len() - 1].action else {
        unreachable!()
    };
    let answers = std::collections::HashMap::from([(
        "name".to_string(),
        ChatInputAnswer::Submitted(ChatInputAnswered {
            value: ChatInputAnswerValue::Text(ChatInputTextAnswerValue { value: "Bea".into() }),
        }),
    )]);
    b.dispatch(
        chat.clone(),
        StateAction::ChatInputCompleted(ChatInputCompletedAction {
            request_id: request.request.id.clone(),
            response: ChatInputResponseKind::Accept,
            answers: Some(answers),
        }),
    )
    .await
    .expect("answer");
    let envs = collect_until(&mut a_sub, is_turn_complete).await;
    let done = reduce_chat(state, from, &envs);
    let text: String = done.turns[0]
        .response_parts
        .iter()
        .filter_map(|p| match p {
            ResponsePart::Markdown(m) => Some(m.content.as_str()),
            _ => None,
        })
        .collect();
    assert!(text.contains("Nice to meet you, Bea."), "{text}");
    assert_eq!(json(&done), json(&fresh_chat_snapshot(&relay, &chat).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_turn_from_any_device_stops_the_agent() {
    use ahp_types::actions::ChatTurnCancelledAction;
    let relay = Relay::start_with(&["--demo-step-ms", "30"]).await;
    let (a, _) = relay.client("device-a").await;
    let (b, _) = relay.client("device-b").await;
    let (_, chat) = create_session_and_chat(&a, "cancel").await;
    let (state, from, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (_, _, mut b_sub) = subscribe_chat(&b, &chat).await;

    a.dispatch(chat.clone(), turn_started("t1", "a long answer please"))
        .await
        .expect("dispatch");
    collect_until(&mut b_sub, |e| matches!(e.action, StateAction::ChatDelta(_))).await;
    b.dispatch(
        chat.clone(),
        StateAction::ChatTurnCancelled(ChatTurnCancelledAction {
            turn_id: "t1".into(),
            duration: 5,
            meta: None,
        }),
    )
    .await
    .expect("cancel");
    let mut envs = collect_until(&mut a_sub, |e| {
        matches!(e.action, StateAction::ChatTurnCancelled(_))
    })
    .await;
    // A second turn runs to completion; nothing from the cancelled turn arrives in between.
    a.dispatch(chat.clone(), turn_started("t2", "short"))
        .await
        .expect("dispatch");
    let next = collect_until(&mut a_sub, is_turn_complete).await;
    assert!(
        matches!(&next[0].action, StateAction::ChatTurnStarted(t) if t.turn_id == "t2"),
        "{:?}",
        next[0]
    );
    envs.extend(next);
    let done = reduce_chat(state, from, &envs);
    assert_eq!(done.turns.len(), 2);
    assert_eq!(done.turns[0].state, TurnState::Cancelled);
    assert_eq!(done.turns[1].state, TurnState::Complete);
    assert_eq!(json(&done), json(&fresh_chat_snapshot(&relay, &chat).await));
}
