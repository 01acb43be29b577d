//! The host validates client actions: invalid ones are echoed to their dispatcher alone with a
//! `rejectionReason`, take no effect, and are replayed to nobody but their dispatcher's clientId.

mod support;

use ahp_types::actions::{
    ActionEnvelope, ChatDraftChangedAction, ChatPendingMessageSetAction, ChatToolCallConfirmedAction,
    ChatTurnCompleteAction, StateAction,
};
use ahp_types::commands::ReconnectResult;
use ahp_types::state::PendingMessageKind;
use relay_core::Role;
use support::*;

fn confirm(turn_id: &str, tool_call_id: &str) -> StateAction {
    StateAction::ChatToolCallConfirmed(ChatToolCallConfirmedAction {
        turn_id: turn_id.into(),
        tool_call_id: tool_call_id.into(),
        meta: None,
        approved: true,
        confirmed: None,
        reason: None,
        edited_tool_input: None,
        user_suggestion: None,
        reason_message: None,
        selected_option_id: None,
    })
}

fn draft(text: &str) -> StateAction {
    StateAction::ChatDraftChanged(ChatDraftChangedAction {
        draft: Some(message(text)),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_action_is_rejected_to_its_dispatcher_only_and_changes_nothing() {
    let relay = Relay::start().await;
    let (a, _) = relay.client("device-a").await;
    let (b, _) = relay.client("device-b").await;
    let (_, chat) = create_session_and_chat(&a, "invalid").await;
    let (before, _, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (_, _, mut b_sub) = subscribe_chat(&b, &chat).await;

    // No tool call is pending confirmation: the confirmation must be refused.
    let handle = a
        .dispatch(chat.clone(), confirm("no-turn", "no-call"))
        .await
        .expect("dispatch");
    let rejected = next_envelope(&mut a_sub).await;
    assert!(rejected.rejection_reason.is_some(), "{rejected:?}");
    assert_eq!(
        rejected.origin.as_ref().map(|o| o.client_seq),
        Some(handle.client_seq)
    );
    assert!(matches!(rejected.action, StateAction::ChatToolCallConfirmed(_)));

    // State is unchanged.
    assert_eq!(json(&fresh_chat_snapshot(&relay, &chat).await), json(&before));

    // A server-only action from a client is refused too.
    a.dispatch(
        chat.clone(),
        StateAction::ChatTurnComplete(ChatTurnCompleteAction {
            turn_id: "x".into(),
            duration: 1,
            meta: None,
        }),
    )
    .await
    .expect("dispatch");
    let server_only = next_envelope(&mut a_sub).await;
    assert!(server_only
        .rejection_reason
        .as_deref()
        .is_some_and(|r| r.contains("server action")));

    // The next thing B sees is A's following valid action: B never saw the rejections.
    a.dispatch(chat.clone(), draft("typing")).await.expect("dispatch");
    let accepted_on_a = next_envelope(&mut a_sub).await;
    let first_on_b = next_envelope(&mut b_sub).await;
    assert!(accepted_on_a.rejection_reason.is_none());
    assert_eq!(json(&first_on_b), json(&accepted_on_a));
    assert!(first_on_b.server_seq > server_only.server_seq);

    // A replay carries a client's own rejections (it may have dropped before reading them), in order, and
    // nobody else's.
    let a2 = relay.connect("dev", "device-a", Role::Member).await;
    let ReconnectResult::Replay(replay) = a2
        .reconnect("device-a".into(), 0, vec![chat.clone()])
        .await
        .expect("reconnect")
    else {
        panic!("expected replay");
    };
    let rejected: Vec<&ActionEnvelope> = replay
        .actions
        .iter()
        .filter(|e| e.rejection_reason.is_some())
        .collect();
    assert!(rejected.last().is_some_and(|e| json(e) == json(&server_only)));
    assert!(rejected
        .iter()
        .all(|e| e.origin.as_ref().is_some_and(|o| o.client_id == "device-a")));
    assert_increasing(&replay.actions);
    assert_eq!(replay.actions.last().map(json), Some(json(&accepted_on_a)));
    let b2 = relay.connect("dev", "device-b", Role::Member).await;
    let ReconnectResult::Replay(replay) = b2
        .reconnect("device-b".into(), 0, vec![chat.clone()])
        .await
        .expect("reconnect")
    else {
        panic!("expected replay");
    };
    assert!(replay.actions.iter().all(|e| e.rejection_reason.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_turn_while_one_runs_is_rejected_and_a_queued_message_starts_after_it() {
    let relay = Relay::start_with(&["--demo-step-ms", "20"]).await;
    let (a, _) = relay.client("device-a").await;
    let (_, chat) = create_session_and_chat(&a, "queue").await;
    let (state, from, mut sub) = subscribe_chat(&a, &chat).await;

    a.dispatch(chat.clone(), turn_started("t1", "first"))
        .await
        .expect("dispatch");
    a.dispatch(chat.clone(), turn_started("t2", "second"))
        .await
        .expect("dispatch");
    let mut seen = collect_until(&mut sub, |e| e.rejection_reason.is_some()).await;
    assert!(
        matches!(&seen.last().expect("rejection").action, StateAction::ChatTurnStarted(t) if t.turn_id == "t2")
    );

    a.dispatch(
        chat.clone(),
        StateAction::ChatPendingMessageSet(ChatPendingMessageSetAction {
            kind: PendingMessageKind::Queued,
            id: "q1".into(),
            message: message("queued one"),
        }),
    )
    .await
    .expect("dispatch");
    // The first turn completes, then the host starts the queued message as a new turn, which completes too.
    seen.extend(collect_until(&mut sub, is_turn_complete).await);
    seen.extend(collect_until(&mut sub, is_turn_complete).await);
    let started: Vec<_> = seen
        .iter()
        .filter(|e| e.rejection_reason.is_none())
        .filter_map(|e| match &e.action {
            StateAction::ChatTurnStarted(t) => Some((t.message.text.clone(), t.queued_message_id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        started,
        vec![
            ("first".to_string(), None),
            ("queued one".to_string(), Some("q1".to_string()))
        ]
    );
    let final_state = reduce_chat(state, from, &seen);
    assert_eq!(final_state.turns.len(), 2);
    assert!(final_state.queued_messages.is_none());
    assert_eq!(
        json(&final_state),
        json(&fresh_chat_snapshot(&relay, &chat).await)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_can_watch_but_every_dispatch_is_rejected() {
    let relay = Relay::start().await;
    let (member, _) = relay.client("member-device").await;
    let (_, chat) = create_session_and_chat(&member, "watched").await;
    let (viewer, _) = relay
        .client_as("dev", "watcher", Role::Viewer, "viewer-device")
        .await;
    let (before, _, mut sub) = subscribe_chat(&viewer, &chat).await;

    viewer
        .dispatch(chat.clone(), turn_started("v1", "let me in"))
        .await
        .expect("dispatch");
    let rejected = next_envelope(&mut sub).await;
    assert!(rejected
        .rejection_reason
        .as_deref()
        .is_some_and(|r| r.contains("viewer")));
    assert_eq!(json(&fresh_chat_snapshot(&relay, &chat).await), json(&before));

    // Viewers cannot create sessions either.
    let refused: Result<serde_json::Value, _> = viewer
        .request(
            "createSession",
            serde_json::json!({"channel": "ahp-session:/viewer-made", "provider": "demo"}),
        )
        .await;
    match refused {
        Err(ahp::ClientError::Rpc(e)) => assert_eq!(e.code, -32009),
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
}
