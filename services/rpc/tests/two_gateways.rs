//! Two gateways follow one shard over real gRPC: clients on either gateway see the same envelopes, and a
//! rejected action reaches only its dispatcher. `FetchRange` reads published actions back, identical to what
//! the bus carried, from the replay buffer and from the store.

mod common;

use std::sync::Arc;
use std::time::Duration;

use ahp::{Client, SessionSubscription, SubscriptionEvent};
use ahp_types::actions::{
    ActionEnvelope, ChatDraftChangedAction, ChatToolCallConfirmedAction, ChatTurnStartedAction, StateAction,
};
use ahp_types::commands::CreateSessionParams;
use ahp_types::state::{Message, MessageKind, MessageOrigin, SnapshotState};
use relay_core::link::HostLink;
use relay_core::rpc::read_frame;
use relay_core::{ConnectionId, HostKey, Limits, Role};
use relay_rpc::RemoteShard;
use relay_runner::{DemoPace, DemoProvider, ProviderRegistry};
use relay_shard::ShardLink;

const SECRET: &[u8] = b"rpc-test-secret";
/// Upper bound for anything a test waits for; a correct relay answers in milliseconds.
const PATIENCE: Duration = Duration::from_secs(20);

/// A shard served over gRPC on loopback, and its URL.
struct Shard {
    url: String,
    _data: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start_shard() -> Shard {
    start_shard_with(Limits::default()).await.0
}

async fn start_shard_with(limits: Limits) -> (Shard, Arc<ShardLink>) {
    let data = tempfile::tempdir().expect("tempdir");
    let store = relay_store::Store::connect(&format!("sqlite://{}", data.path().join("x.sqlite").display()))
        .await
        .expect("store");
    store.migrate().await.expect("migrate");
    let providers = ProviderRegistry::new().with(Arc::new(DemoProvider::new(DemoPace {
        step: Duration::from_millis(5),
    })));
    let link = Arc::new(ShardLink::new(limits, providers, store, None));
    let served = link.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        relay_rpc::serve(listener, served, &common::credential(), async move {
            let _ = stopped.await;
        })
        .await
        .expect("serve");
    });
    (
        Shard {
            url,
            _data: data,
            _stop: stop,
        },
        link,
    )
}

/// A raw gRPC client of the shard at `url`, presenting the internal credential (as a gateway does).
async fn grpc_client(
    url: &str,
) -> relay_rpc::pb::shard_client::ShardClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, relay_rpc::InternalCredential>,
> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())
        .expect("url")
        .connect()
        .await
        .expect("grpc");
    relay_rpc::pb::shard_client::ShardClient::with_interceptor(channel, common::credential())
}

/// A gateway in this process in front of the shard; returns its address.
async fn start_gateway(shard_url: &str) -> String {
    common::start_gateway(shard_url, SECRET, 1000).await
}

async fn client(gateway: &str, client_id: &str) -> Client {
    let client = common::connect(gateway, SECRET, client_id, PATIENCE).await;
    client
        .initialize(client_id.into(), vec!["1.0.0".into()], vec!["ahp-root://".into()])
        .await
        .expect("initialize");
    client
}

async fn create_session_and_chat(client: &Client, name: &str) -> String {
    let session = format!("ahp-session:/{name}");
    let chat = format!("ahp-chat:/{name}");
    let _: serde_json::Value = client
        .request(
            "createSession",
            CreateSessionParams {
                channel: session.clone(),
                meta: None,
                provider: Some("demo".into()),
                working_directories: None,
                config: None,
                active_client: None,
                progress_token: None,
            },
        )
        .await
        .expect("createSession");
    // Its default chat, which the host names after the session.
    chat
}

fn message(text: &str) -> Message {
    Message {
        text: text.into(),
        origin: MessageOrigin {
            kind: MessageKind::User,
        },
        attachments: None,
        model: None,
        agent: None,
        meta: None,
    }
}

async fn subscribe_chat(client: &Client, chat: &str) -> (u64, SessionSubscription) {
    let (result, sub) = client.subscribe(chat.into()).await.expect("subscribe");
    let snapshot = result.snapshot.expect("chat snapshot");
    assert!(matches!(snapshot.state, SnapshotState::Chat(_)));
    (snapshot.from_seq as u64, sub)
}

async fn next_envelope(sub: &mut SessionSubscription) -> ActionEnvelope {
    loop {
        match tokio::time::timeout(PATIENCE, sub.recv())
            .await
            .expect("timed out waiting for an envelope")
        {
            Some(SubscriptionEvent::Action(env)) => return env,
            Some(_) => continue,
            None => panic!("subscription closed"),
        }
    }
}

async fn until_turn_complete(sub: &mut SessionSubscription) -> Vec<ActionEnvelope> {
    let mut out = Vec::new();
    loop {
        let env = next_envelope(sub).await;
        let done = matches!(env.action, StateAction::ChatTurnComplete(_));
        out.push(env);
        if done {
            return out;
        }
    }
}

fn json<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_two_gateways_share_one_chat_through_grpc() {
    let shard = start_shard().await;
    let gateway_1 = start_gateway(&shard.url).await;
    let gateway_2 = start_gateway(&shard.url).await;
    let a = client(&gateway_1, "device-a").await;
    let b = client(&gateway_2, "device-b").await;

    let chat = create_session_and_chat(&a, "shared").await;
    let (a_from, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (b_from, mut b_sub) = subscribe_chat(&b, &chat).await;

    a.dispatch(
        chat.clone(),
        StateAction::ChatTurnStarted(ChatTurnStartedAction {
            turn_id: "t1".into(),
            started_at: format!("{:.3}", jiff::Timestamp::now()),
            message: message("hello there"),
            queued_message_id: None,
            meta: None,
        }),
    )
    .await
    .expect("dispatch");
    let a_envs = until_turn_complete(&mut a_sub).await;
    let b_envs = until_turn_complete(&mut b_sub).await;

    // The same envelopes (same serverSeq, same JSON) on both gateways, in increasing order.
    let after = a_from.max(b_from);
    let a_after: Vec<_> = a_envs.iter().filter(|e| e.server_seq > after).collect();
    let b_after: Vec<_> = b_envs.iter().filter(|e| e.server_seq > after).collect();
    assert_eq!(json(&a_after), json(&b_after));
    assert!(
        a_after.len() > 5,
        "the demo turn streams several envelopes, got {}",
        a_after.len()
    );
    for pair in a_envs.windows(2) {
        assert!(pair[0].server_seq < pair[1].server_seq);
    }
    assert!(matches!(a_envs[0].action, StateAction::ChatTurnStarted(_)));
    assert_eq!(
        a_envs[0].origin.as_ref().map(|o| o.client_id.as_str()),
        Some("device-a")
    );

    // No tool call is pending: A's confirmation is rejected, to A alone.
    let handle = a
        .dispatch(
            chat.clone(),
            StateAction::ChatToolCallConfirmed(ChatToolCallConfirmedAction {
                turn_id: "no-turn".into(),
                tool_call_id: "no-call".into(),
                meta: None,
                approved: true,
                confirmed: None,
                reason: None,
                edited_tool_input: None,
                user_suggestion: None,
                reason_message: None,
                selected_option_id: None,
            }),
        )
        .await
        .expect("dispatch");
    let rejected = next_envelope(&mut a_sub).await;
    assert!(rejected.rejection_reason.is_some(), "{rejected:?}");
    assert_eq!(
        rejected.origin.as_ref().map(|o| o.client_seq),
        Some(handle.client_seq)
    );

    // The next thing B sees is A's following valid action: B never saw the rejection.
    a.dispatch(
        chat.clone(),
        StateAction::ChatDraftChanged(ChatDraftChangedAction {
            draft: Some(message("typing")),
        }),
    )
    .await
    .expect("dispatch");
    let accepted_on_a = next_envelope(&mut a_sub).await;
    assert!(accepted_on_a.rejection_reason.is_none(), "{accepted_on_a:?}");
    let accepted_on_b = next_envelope(&mut b_sub).await;
    assert_eq!(json(&accepted_on_b), json(&accepted_on_a));
    assert!(accepted_on_b.server_seq > rejected.server_seq);

    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_shard_answers_requests_with_an_internal_error_and_notifications_with_nothing() {
    // A port that was free a moment ago: nothing listens there.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let shard = RemoteShard::connect_lazy(&format!("http://127.0.0.1:{port}"), 16, common::credential())
        .expect("url");
    let host = HostKey::new("dev", "default");

    let request = read_frame(br#"{"jsonrpc":"2.0","id":42,"method":"ping"}"#, 64).expect("frame");
    let reply = tokio::time::timeout(PATIENCE, shard.call(&host, ConnectionId(1), request))
        .await
        .expect("answered in time");
    let frame: serde_json::Value =
        serde_json::from_slice(&reply.frame.expect("an error frame")).expect("json");
    assert_eq!(frame["id"], 42);
    assert_eq!(frame["error"]["code"], -32603);

    let notification = read_frame(br#"{"jsonrpc":"2.0","method":"ping"}"#, 64).expect("frame");
    let reply = tokio::time::timeout(PATIENCE, shard.call(&host, ConnectionId(1), notification))
        .await
        .expect("answered in time");
    assert!(reply.frame.is_none());

    let identity = relay_core::Identity {
        subject: "u".into(),
        tenant: "dev".into(),
        role: Role::Member,
        hosts: None,
    };
    let attached = tokio::time::timeout(PATIENCE, shard.attach(&host, ConnectionId(1), &identity))
        .await
        .expect("answered in time");
    assert!(attached.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_metrics_come_over_grpc_and_readiness_follows_the_shard() {
    relay_core::telemetry::install(&[relay_core::telemetry::Side::Shard]).expect("recorder");
    let shard = start_shard().await;
    let text = grpc_client(&shard.url)
        .await
        .metrics(relay_rpc::pb::MetricsRequest {})
        .await
        .expect("metrics")
        .into_inner()
        .text;
    assert!(text.contains("ahp_relay_hosts_open 0"), "{text}");
    assert!(text.contains("# TYPE ahp_relay_actions_total counter"), "{text}");

    let remote = RemoteShard::connect_lazy(&shard.url, 16, common::credential()).expect("url");
    tokio::time::timeout(PATIENCE, remote.ready())
        .await
        .expect("in time")
        .expect("a serving shard is ready");
    drop(shard);
    let stopped = tokio::time::timeout(PATIENCE, async {
        while remote.ready().await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(stopped.is_ok(), "a stopped shard must not count as ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_range_reads_published_actions_back_from_the_buffer_and_the_store() {
    // A replay buffer of 4 envelopes: ranges starting earlier are read from the store's log.
    let (shard, link) = start_shard_with(Limits {
        replay_buffer_envelopes: 4,
        ..Limits::default()
    })
    .await;
    let host = HostKey::new("dev", "default");
    let observer = relay_core::Identity {
        subject: "observer".into(),
        tenant: "dev".into(),
        role: Role::Viewer,
        hosts: None,
    };
    let mut bus = link
        .attach(&host, ConnectionId(7), &observer)
        .await
        .expect("attach");
    let gateway = start_gateway(&shard.url).await;
    let a = client(&gateway, "device-a").await;
    let chat = create_session_and_chat(&a, "range").await;
    let (_, mut sub) = subscribe_chat(&a, &chat).await;
    a.dispatch(
        chat.clone(),
        StateAction::ChatTurnStarted(ChatTurnStartedAction {
            turn_id: "t1".into(),
            started_at: format!("{:.3}", jiff::Timestamp::now()),
            message: message("read me back"),
            queued_message_id: None,
            meta: None,
        }),
    )
    .await
    .expect("dispatch");
    until_turn_complete(&mut sub).await;

    // What the bus carried to subscribers so far (the client saw the turn complete, so it was published).
    let mut expected = Vec::new();
    while let Ok(batch) = bus.try_recv() {
        for event in batch.iter().filter(|event| {
            event.kind == relay_core::bus::BusEventKind::Action
                && event.audience == relay_core::bus::Audience::Subscribers
        }) {
            expected.push((event.seq, event.channel.to_string(), event.frame.to_vec()));
        }
    }
    assert!(expected.len() > 6, "a demo turn publishes several actions");
    let through = expected.last().map(|e| e.0).expect("actions");

    let mut grpc = grpc_client(&shard.url).await;
    let mut fetch = async |after: u64, through: u64| {
        let events = grpc
            .fetch_range(relay_rpc::pb::FetchRangeRequest {
                host: Some(relay_rpc::pb::HostKey {
                    tenant: "dev".into(),
                    host: "default".into(),
                }),
                after,
                through,
            })
            .await
            .expect("fetch range")
            .into_inner()
            .events;
        let mut prev = after;
        for event in &events {
            assert_eq!(event.prev_seq, prev, "prev_seq chains the returned events");
            prev = event.seq;
        }
        events
            .into_iter()
            .map(|e| (e.seq, e.channel, e.frame))
            .collect::<Vec<_>>()
    };
    // From the store: the buffer no longer holds the beginning.
    assert_eq!(fetch(0, through).await, expected);
    // From the replay buffer: its last two envelopes.
    let tail = &expected[expected.len() - 2..];
    assert_eq!(fetch(expected[expected.len() - 3].0, through).await, tail);
    // A range ending inside: only what it covers.
    let first_two = &expected[..2];
    assert_eq!(fetch(0, expected[1].0).await, first_two);
    a.shutdown().await;
}

/// A gateway that follows a host again soon after it stopped (its last client left, a new one came) sends its
/// `Attach` before its new `Watch` is in: the old stream's grace timer must not detach the new connection,
/// even when the new `Watch` registers only after the timer fired. (The grace is a time, so the test waits
/// for it to pass.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_attached_after_a_gateways_stream_ended_survives_the_streams_grace() {
    let shard = start_shard().await;
    let mut grpc = grpc_client(&shard.url).await;
    let host = || {
        Some(relay_rpc::pb::HostKey {
            tenant: "dev".into(),
            host: "default".into(),
        })
    };
    let gateway: u64 = 0x5eed;
    let connection = ConnectionId((gateway << 32) | 1);
    // The gateway's stream of the host, then its end (its last client left).
    let watch = grpc
        .watch(relay_rpc::pb::WatchRequest {
            host: host(),
            gateway,
        })
        .await
        .expect("watch");
    drop(watch);
    let ended = tokio::time::Instant::now();
    // A new client: attached within the grace, its Watch registered after the grace.
    tokio::time::sleep_until(ended + relay_rpc::gateway_streams::GATEWAY_STREAM_GRACE / 2).await;
    grpc.attach(relay_rpc::pb::AttachRequest {
        host: host(),
        connection: connection.0,
        identity: Some(relay_rpc::pb::Identity {
            subject: "late".into(),
            tenant: "dev".into(),
            role: relay_rpc::pb::Role::Member as i32,
            ..Default::default()
        }),
    })
    .await
    .expect("attach");
    tokio::time::sleep_until(
        ended + relay_rpc::gateway_streams::GATEWAY_STREAM_GRACE + Duration::from_millis(500),
    )
    .await;
    let _watch = grpc
        .watch(relay_rpc::pb::WatchRequest {
            host: host(),
            gateway,
        })
        .await
        .expect("watch again");
    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "late"}});
    let reply = grpc
        .call(relay_rpc::pb::CallRequest {
            host: host(),
            connection: connection.0,
            frame: initialize.to_string().into_bytes(),
        })
        .await
        .expect("call")
        .into_inner();
    let frame: serde_json::Value =
        serde_json::from_slice(&reply.frame.expect("a reply frame")).expect("JSON");
    assert!(
        frame.get("result").is_some(),
        "the connection was detached: {frame}"
    );
}

/// A gateway that stops reading its `Events` stream holds back bytes, not a count of batches: once its stream
/// and the host's bus hold their byte bounds, the stream ends with `DATA_LOSS` (the gateway's connections
/// resync) instead of buffering every batch the host publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_stops_reading_its_events_is_cut_at_a_byte_bound() {
    const DRAFTS: usize = 160;
    const DRAFT_BYTES: usize = 256 * 1024;
    let (shard, _link) = start_shard_with(Limits {
        bus_bytes: 2 * 1024 * 1024,
        ..Limits::default()
    })
    .await;
    let mut grpc = grpc_client(&shard.url).await;
    // The stalled gateway: follows the host, then reads nothing.
    let mut stalled = grpc
        .events(relay_rpc::pb::EventsRequest {
            host: Some(relay_rpc::pb::HostKey {
                tenant: "dev".into(),
                host: "default".into(),
            }),
            gateway: 0xdead,
        })
        .await
        .expect("events")
        .into_inner();

    // 40 MiB of drafts through a working gateway, each one echoed back to its writer.
    let gateway = start_gateway(&shard.url).await;
    let writer = client(&gateway, "writer").await;
    let chat = create_session_and_chat(&writer, "flood").await;
    let (_, mut sub) = subscribe_chat(&writer, &chat).await;
    for n in 0..DRAFTS {
        let draft = StateAction::ChatDraftChanged(ChatDraftChangedAction {
            draft: Some(message(&format!("{n}:{}", "d".repeat(DRAFT_BYTES)))),
        });
        writer.dispatch(chat.clone(), draft).await.expect("dispatch");
        next_envelope(&mut sub).await;
    }

    // The stalled stream gives what it buffered, then ends: far fewer than every draft.
    let mut drafts_seen = 0;
    let ended = loop {
        match tokio::time::timeout(PATIENCE, stalled.message()).await {
            Ok(Ok(Some(batch))) => {
                drafts_seen += batch
                    .events
                    .iter()
                    .filter(|event| String::from_utf8_lossy(&event.frame).contains("chat/draftChanged"))
                    .count();
                assert!(drafts_seen < DRAFTS, "the stalled stream buffered every draft");
            }
            Ok(Ok(None)) => panic!("the stream ended without a status"),
            Ok(Err(status)) => break status,
            Err(_) => panic!("the stalled stream neither ended nor delivered ({drafts_seen} drafts)"),
        }
    };
    assert_eq!(ended.code(), tonic::Code::DataLoss, "{ended}");
}

/// A TCP proxy on loopback that can be frozen: it then forwards nothing more either way and closes nothing,
/// like a network partition.
struct FreezingProxy {
    addr: std::net::SocketAddr,
    frozen: tokio::sync::watch::Sender<bool>,
}

impl FreezingProxy {
    async fn start(upstream: std::net::SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let frozen = tokio::sync::watch::Sender::new(false);
        let watching = frozen.subscribe();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let (a_read, a_write) = inbound.into_split();
                let (b_read, b_write) = outbound.into_split();
                tokio::spawn(Self::pump(a_read, b_write, watching.clone()));
                tokio::spawn(Self::pump(b_read, a_write, watching.clone()));
            }
        });
        Self { addr, frozen }
    }

    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut frozen: tokio::sync::watch::Receiver<bool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buffer = vec![0u8; 64 * 1024];
        // Once frozen, neither read nor write again, and keep both halves open.
        let _ = frozen.wait_for(|frozen| !frozen).await;
        loop {
            let read = tokio::select! {
                read = from.read(&mut buffer) => read,
                _ = frozen.wait_for(|frozen| *frozen) => break,
            };
            let Ok(n) = read else { return };
            if n == 0 || *frozen.borrow() || to.write_all(&buffer[..n]).await.is_err() {
                return;
            }
        }
        let _keep = (from, to);
        std::future::pending::<()>().await;
    }
}

/// A gateway cut off by a partition (its TCP connection open, nothing getting through) is let go by the
/// shard: HTTP/2 keepalive ends its link, its streams end, and its connections are detached after the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_gateways_connections_are_released() {
    let shard = start_shard().await;
    let upstream: std::net::SocketAddr = shard
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("shard addr");
    let proxy = FreezingProxy::start(upstream).await;
    let through_proxy = tonic::transport::Endpoint::from_shared(format!("http://{}", proxy.addr))
        .expect("url")
        .connect()
        .await
        .expect("grpc");
    let mut partitioned =
        relay_rpc::pb::shard_client::ShardClient::with_interceptor(through_proxy, common::credential());
    let host = || {
        Some(relay_rpc::pb::HostKey {
            tenant: "dev".into(),
            host: "default".into(),
        })
    };
    let gateway: u64 = 0xfa11;
    let connection = ConnectionId((gateway << 32) | 1);
    partitioned
        .attach(relay_rpc::pb::AttachRequest {
            host: host(),
            connection: connection.0,
            identity: Some(relay_rpc::pb::Identity {
                subject: "cut-off".into(),
                tenant: "dev".into(),
                role: relay_rpc::pb::Role::Member as i32,
                ..Default::default()
            }),
        })
        .await
        .expect("attach");
    // As a gateway does: the host's Watch once a connection is attached.
    let _watch = partitioned
        .watch(relay_rpc::pb::WatchRequest {
            host: host(),
            gateway,
        })
        .await
        .expect("watch");

    // Another caller of the shard watches the connection: attached until the partition is detected.
    let mut observer = grpc_client(&shard.url).await;
    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "cut-off"}});
    let attached = |frame: &serde_json::Value| {
        !frame["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("not attached"))
    };
    let call = |observer: &mut relay_rpc::pb::shard_client::ShardClient<_>| {
        let request = relay_rpc::pb::CallRequest {
            host: host(),
            connection: connection.0,
            frame: initialize.to_string().into_bytes(),
        };
        let mut observer = observer.clone();
        async move {
            let reply = observer.call(request).await.expect("call").into_inner();
            serde_json::from_slice::<serde_json::Value>(&reply.frame.expect("a reply frame")).expect("JSON")
        }
    };
    assert!(
        attached(&call(&mut observer).await),
        "attached before the partition"
    );

    proxy.frozen.send_replace(true);
    let partitioned_at = std::time::Instant::now();
    // Keepalive closes the link (a ping unanswered), which ends the Watch; then the grace ends.
    let bound = relay_rpc::LINK_KEEPALIVE_INTERVAL
        + relay_rpc::LINK_KEEPALIVE_TIMEOUT
        + relay_rpc::gateway_streams::GATEWAY_STREAM_GRACE
        + Duration::from_secs(5);
    let mut polls = tokio::time::interval(Duration::from_millis(250));
    loop {
        polls.tick().await;
        if !attached(&call(&mut observer).await) {
            break;
        }
        assert!(
            partitioned_at.elapsed() < bound,
            "the partitioned gateway's connection was still attached after {bound:?}"
        );
    }
}

/// A gateway that attaches a connection and then opens no stream of the host (it died between its `Attach`
/// and its `Watch`) leaves nothing attached: the connection is detached once the grace has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_gateway_never_follows_the_host_is_detached() {
    let shard = start_shard().await;
    let mut grpc = grpc_client(&shard.url).await;
    let host = || {
        Some(relay_rpc::pb::HostKey {
            tenant: "dev".into(),
            host: "default".into(),
        })
    };
    let connection = ConnectionId((0xdead_u64 << 32) | 1);
    grpc.attach(relay_rpc::pb::AttachRequest {
        host: host(),
        connection: connection.0,
        identity: Some(relay_rpc::pb::Identity {
            subject: "orphan".into(),
            tenant: "dev".into(),
            role: relay_rpc::pb::Role::Member as i32,
            ..Default::default()
        }),
    })
    .await
    .expect("attach");
    let attached_at = std::time::Instant::now();
    let ping = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "orphan"}});
    let mut polls = tokio::time::interval(Duration::from_millis(100));
    loop {
        polls.tick().await;
        let reply = grpc
            .call(relay_rpc::pb::CallRequest {
                host: host(),
                connection: connection.0,
                frame: ping.to_string().into_bytes(),
            })
            .await
            .expect("call")
            .into_inner();
        let frame: serde_json::Value =
            serde_json::from_slice(&reply.frame.expect("a reply frame")).expect("JSON");
        if frame["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("not attached"))
        {
            break;
        }
        assert!(
            attached_at.elapsed() < relay_rpc::gateway_streams::GATEWAY_STREAM_GRACE + Duration::from_secs(5),
            "still attached: {frame}"
        );
    }
    assert!(attached_at.elapsed() >= relay_rpc::gateway_streams::GATEWAY_STREAM_GRACE);
}
