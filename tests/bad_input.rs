//! Bad input gets a clear JSON-RPC error or a clean close, changes nothing, and never stops the relay.

mod support;

use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use support::raw::*;
use support::*;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_get_json_rpc_errors_and_change_nothing() {
    let relay = Relay::start().await;
    let (owner, _) = relay.client("owner").await;
    let (_, chat) = create_session_and_chat(&owner, "target").await;
    let (before, _, _sub) = subscribe_chat(&owner, &chat).await;

    let mut s = raw(&relay).await;

    // Before initialize: ping works, everything else is refused.
    send(
        &mut s,
        json!({"jsonrpc":"2.0","id":1,"method":"ping","params":{"channel":"ahp-root://"}}).to_string(),
    )
    .await;
    assert_eq!(recv(&mut s).await, json!({"jsonrpc":"2.0","id":1,"result":null}));
    // A notification is never answered, not even with an error: the next frame answers the ping after it.
    send(
        &mut s,
        json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel": chat, "clientSeq": 1,
            "action": {"type":"chat/draftChanged"}}})
        .to_string(),
    )
    .await;
    send(
        &mut s,
        json!({"jsonrpc":"2.0","id":100,"method":"ping"}).to_string(),
    )
    .await;
    assert_eq!(
        recv(&mut s).await,
        json!({"jsonrpc":"2.0","id":100,"result":null})
    );

    send(&mut s, "{this is not json".into()).await;
    let parse = recv(&mut s).await;
    assert_eq!(error_code(&parse), -32700);
    assert!(parse["id"].is_null());

    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    send(&mut s, deep).await;
    assert_eq!(error_code(&recv(&mut s).await), -32600);

    send(
        &mut s,
        json!({"jsonrpc":"2.0","id":2,"method":"initialize",
        "params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"raw-client"}})
        .to_string(),
    )
    .await;
    let init = recv(&mut s).await;
    assert_eq!(init["result"]["protocolVersion"], "1.0.0", "{init}");

    send(
        &mut s,
        json!({"jsonrpc":"2.0","id":3,"method":"noSuchMethod","params":{"channel":"ahp-root://"}})
            .to_string(),
    )
    .await;
    let unknown = recv(&mut s).await;
    assert_eq!((error_code(&unknown), unknown["id"].clone()), (-32601, json!(3)));

    send(
        &mut s,
        json!({"jsonrpc":"2.0","id":4,"method":"subscribe","params":{}}).to_string(),
    )
    .await;
    assert_eq!(error_code(&recv(&mut s).await), -32602);

    send(&mut s, json!({"jsonrpc":"2.0","id":5,"method":"listSessions","params":{"channel":"ahp-root://","limit":"ten"}}).to_string()).await;
    assert_eq!(error_code(&recv(&mut s).await), -32602);

    send(
        &mut s,
        json!({"jsonrpc":"2.0","id":"six","method":"ping"}).to_string(),
    )
    .await;
    assert_eq!(error_code(&recv(&mut s).await), -32600);

    send(
        &mut s,
        json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel": chat, "clientSeq": "x",
            "action": {"type":"chat/draftChanged"}}})
        .to_string(),
    )
    .await;
    send(
        &mut s,
        json!({"jsonrpc":"2.0","id":101,"method":"ping"}).to_string(),
    )
    .await;
    assert_eq!(
        recv(&mut s).await,
        json!({"jsonrpc":"2.0","id":101,"result":null})
    );

    // A well-formed action with a mistyped payload is an unknown action: rejected, not applied.
    send(
        &mut s,
        json!({"jsonrpc":"2.0","id":7,"method":"subscribe","params":{"channel": chat}}).to_string(),
    )
    .await;
    assert!(recv(&mut s).await["result"]["snapshot"].is_object());
    send(
        &mut s,
        json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel": chat, "clientSeq": 2,
            "action": {"type":"chat/turnStarted","turnId": 5}}})
        .to_string(),
    )
    .await;
    let rejected = recv(&mut s).await;
    assert_eq!(rejected["method"], "action");
    assert!(rejected["params"]["rejectionReason"].is_string(), "{rejected}");

    // Version negotiation: nothing in common → -32005 with the supported versions, then a close.
    let mut v = raw(&relay).await;
    send(
        &mut v,
        json!({"jsonrpc":"2.0","id":1,"method":"initialize",
        "params":{"channel":"ahp-root://","protocolVersions":["7.0.0"],"clientId":"future"}})
        .to_string(),
    )
    .await;
    let refused = recv(&mut v).await;
    assert_eq!(error_code(&refused), -32005);
    assert_eq!(refused["error"]["data"]["supportedVersions"], json!(["1.0.0"]));
    assert_closed(&mut v).await;

    // Nothing changed, and the relay still serves everyone.
    assert_eq!(json(&fresh_chat_snapshot(&relay, &chat).await), json(&before));
    owner.ping().await.expect("still serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_frame_closes_only_that_connection() {
    let relay = Relay::start().await;
    let (other, _) = relay.client("bystander").await;
    let mut s = raw(&relay).await;
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"channel":"ahp-root://","pad":"{}"}}}}"#,
        "x".repeat(10 * 1024 * 1024)
    );
    // The relay may close while the frame is still being written; either way the socket must end.
    let _ = s.send(Message::Text(huge.into())).await;
    assert_closed(&mut s).await;
    other.ping().await.expect("other connections are unaffected");
    let (fresh, _) = relay.client("newcomer").await;
    fresh.ping().await.expect("new connections are accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_garbage_never_crashes_the_relay() {
    let relay = Relay::start().await;
    let mut s = raw(&relay).await;
    // Deterministic pseudo-random frames: truncated, mutated and shuffled JSON-RPC.
    let seeds = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"g"}}"#,
        r#"{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-chat:/x","clientSeq":1,"action":{"type":"chat/turnStarted","turnId":"t","startedAt":"x","message":{"text":"hi","origin":{"kind":"user"}}}}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"reconnect","params":{"channel":"ahp-root://","clientId":"g","lastSeenServerSeq":-5,"subscriptions":[1,2]}}"#,
    ];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut errors = 0;
    for i in 0..300 {
        let seed = seeds[i % seeds.len()].as_bytes();
        let mut bytes = seed.to_vec();
        for _ in 0..(i % 7) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let pos = (x as usize) % bytes.len();
            bytes[pos] = b"{}[]\":,0a-\\ "[(x >> 32) as usize % 12];
        }
        bytes.truncate(bytes.len() - (i % 5));
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if s.send(Message::Text(text.into())).await.is_err() {
            // A mutation may legitimately end the connection (e.g. an unsupported version): start another.
            s = raw(&relay).await;
        }
    }
    // Everything sent so far is answered before this ping's response (one connection is served in order).
    if s.send(Message::Text(
        r#"{"jsonrpc":"2.0","id":424242,"method":"ping"}"#.into(),
    ))
    .await
    .is_err()
    {
        s = raw(&relay).await;
        s.send(Message::Text(
            r#"{"jsonrpc":"2.0","id":424242,"method":"ping"}"#.into(),
        ))
        .await
        .expect("send");
    }
    loop {
        let frame = recv(&mut s).await;
        if frame["id"] == 424242 {
            break;
        }
        if frame.get("error").is_some() {
            errors += 1;
        }
    }
    assert!(errors > 0, "the relay answers malformed input with errors");
    let (c, _) = relay.client("after-garbage").await;
    c.ping().await.expect("relay still serving");
}

async fn assert_closed(socket: &mut Socket) {
    let ended = tokio::time::timeout(PATIENCE, async {
        loop {
            match socket.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => continue,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the relay did not close the connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_negotiates_only_versions_the_relay_speaks() {
    let relay = Relay::start().await;
    for (offered, expected) in [
        (vec!["1.0.0"], Some("1.0.0")),
        // 0.9.0 differs on the wire: it is never claimed.
        (vec!["0.9.0"], None),
        (vec!["0.9.0", "1.0.0"], Some("1.0.0")),
        // What VS Code offers.
        (vec!["1.0.0", "0.10.0", "0.9.0"], Some("1.0.0")),
    ] {
        let mut s = raw(&relay).await;
        send(
            &mut s,
            json!({"jsonrpc":"2.0","id":1,"method":"initialize",
                "params":{"channel":"ahp-root://","protocolVersions":offered,"clientId":"negotiator"}})
            .to_string(),
        )
        .await;
        let reply = recv(&mut s).await;
        match expected {
            Some(version) => assert_eq!(
                reply["result"]["protocolVersion"], version,
                "{offered:?}: {reply}"
            ),
            None => {
                assert_eq!(error_code(&reply), -32005, "{offered:?}: {reply}");
                assert_eq!(reply["error"]["data"]["supportedVersions"], json!(["1.0.0"]));
            }
        }
    }
}
