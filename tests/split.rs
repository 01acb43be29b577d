//! The distributed shape: gateways and a shard as separate processes, talking gRPC. Devices on different
//! gateways share one session, and a device moves between gateways without losing or repeating anything.

mod support;

use ahp_types::commands::ReconnectResult;
use relay_core::Role;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_on_two_gateways_receive_identical_envelopes() {
    let shard = Shard::start(&[]).await;
    let gateway1 = Relay::gateway(&shard.url).await;
    let gateway2 = Relay::gateway(&shard.url).await;
    let (a, _) = gateway1.client("device-a").await;
    let (b, _) = gateway2.client("device-b").await;
    let (_, chat) = create_session_and_chat(&a, "split").await;
    let (a_state, a_from, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (_, b_from, mut b_sub) = subscribe_chat(&b, &chat).await;

    a.dispatch(chat.clone(), turn_started("t1", "hello across gateways"))
        .await
        .expect("dispatch");
    let a_envs = collect_until(&mut a_sub, is_turn_complete).await;
    let b_envs = collect_until(&mut b_sub, is_turn_complete).await;
    let after = a_from.max(b_from);
    let a_after: Vec<_> = a_envs.iter().filter(|e| e.server_seq > after).collect();
    let b_after: Vec<_> = b_envs.iter().filter(|e| e.server_seq > after).collect();
    assert_eq!(json(&a_after), json(&b_after));
    assert_increasing(&a_envs);
    assert_eq!(
        json(&reduce_chat(a_state, a_from, &a_envs)),
        json(&fresh_chat_snapshot(&gateway2, &chat).await)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_dropped_from_one_gateway_resumes_exactly_on_the_other() {
    let shard = Shard::start(&["--demo-step-ms", "25"]).await;
    let gateway1 = Relay::gateway(&shard.url).await;
    let gateway2 = Relay::gateway(&shard.url).await;
    let (a, _) = gateway1.client("device-a").await;
    let (b, _) = gateway2.client("device-b").await;
    let (_, chat) = create_session_and_chat(&a, "moving").await;
    let (a_state, a_from, mut a_sub) = subscribe_chat(&a, &chat).await;
    let (_, _, mut b_sub) = subscribe_chat(&b, &chat).await;

    a.dispatch(chat.clone(), turn_started("t1", "keep talking while I move"))
        .await
        .expect("dispatch");
    let mut a_seen = Vec::new();
    for _ in 0..4 {
        a_seen.push(next_envelope(&mut a_sub).await);
    }
    let last_seen = a_seen.last().map(|e| e.server_seq).expect("seen");
    a.shutdown().await;
    let mut b_envs = collect_until(&mut b_sub, |e| e.server_seq > last_seen + 3).await;

    let moved = gateway2.connect("dev", "device-a", Role::Member).await;
    let mut moved_sub = moved.attach_subscription(&chat).await;
    let ReconnectResult::Replay(replay) = moved
        .reconnect("device-a".into(), last_seen as i64, vec![chat.clone()])
        .await
        .expect("reconnect")
    else {
        panic!("expected an exact replay on the other gateway");
    };
    let mut resumed = replay.actions;
    if !resumed.iter().any(is_turn_complete) {
        resumed.extend(collect_until(&mut moved_sub, is_turn_complete).await);
    }
    if !b_envs.iter().any(is_turn_complete) {
        b_envs.extend(collect_until(&mut b_sub, is_turn_complete).await);
    }
    let missed: Vec<_> = b_envs
        .iter()
        .filter(|e| e.server_seq > last_seen)
        .cloned()
        .collect();
    assert_eq!(json(&resumed), json(&missed), "nothing twice, nothing skipped");
    let state = reduce_chat(reduce_chat(a_state, a_from, &a_seen), last_seen, &resumed);
    assert_eq!(json(&state), json(&fresh_chat_snapshot(&gateway1, &chat).await));
}

/// A CA and, signed by it, a certificate for 127.0.0.1 (`name.crt`/`name.key` for each of `names`), made with
/// `openssl` in `dir`.
fn certificates(dir: &std::path::Path, ca: &str, names: &[&str]) {
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let (ca_key, ca_crt) = (format!("{ca}.key"), format!("{ca}.crt"));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        &format!("/CN={ca}"),
        "-keyout",
        &ca_key,
        "-out",
        &ca_crt,
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("san");
    for name in names {
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            &key,
            "-out",
            &csr,
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.ext",
            "-out",
            &crt,
        ]);
        // Keys are private files (the relay refuses group- or world-readable ones).
        std::fs::set_permissions(
            dir.join(&key),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .expect("chmod");
    }
}

/// The internal link over mutual TLS: a shard with a certificate, requiring callers' certificates from its CA;
/// a gateway presenting one works end to end, while a caller in plaintext, one without a certificate and one
/// with a certificate of another CA are refused before any call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_internal_link_runs_over_mutual_tls() {
    use relay_core::link::HostLink;
    if std::process::Command::new("openssl")
        .arg("version")
        .output()
        .is_err()
    {
        println!("skipped: openssl not found");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path(), "ca", &["shard", "gateway"]);
    certificates(dir.path(), "rogue-ca", &["rogue"]);
    let path = |name: &str| dir.path().join(name).display().to_string();
    let shard = Shard::start(&[
        "--internal-tls-cert",
        &path("shard.crt"),
        "--internal-tls-key",
        &path("shard.key"),
        "--internal-tls-ca",
        &path("ca.crt"),
    ])
    .await;
    assert!(shard.url.starts_with("https://"), "{}", shard.url);

    let gateway = Relay::gateway_with(
        &shard.url,
        &[
            "--internal-tls-ca",
            &path("ca.crt"),
            "--internal-tls-cert",
            &path("gateway.crt"),
            "--internal-tls-key",
            &path("gateway.key"),
        ],
    )
    .await;
    let (client, _) = gateway.client("over-tls").await;
    let (_, chat) = create_session_and_chat(&client, "tls").await;
    let (_, _, mut sub) = subscribe_chat(&client, &chat).await;
    client
        .dispatch(chat.clone(), turn_started("t1", "hello over mutual TLS"))
        .await
        .expect("dispatch");
    collect_until(&mut sub, is_turn_complete).await;

    // Callers the shard refuses: they cannot even ask whether it is ready.
    let credential = relay_rpc::InternalCredential::new(INTERNAL_SECRET.as_bytes()).expect("credential");
    let read = |name: &str| std::fs::read(dir.path().join(name)).expect("read");
    let plaintext = shard.url.replacen("https://", "http://", 1);
    let callers = [
        ("plaintext", plaintext.as_str(), relay_rpc::LinkTls::default()),
        (
            "no certificate",
            shard.url.as_str(),
            relay_rpc::LinkTls {
                identity: None,
                ca: Some(read("ca.crt")),
            },
        ),
        (
            "another CA's certificate",
            shard.url.as_str(),
            relay_rpc::LinkTls {
                identity: Some((read("rogue.crt"), read("rogue.key"))),
                ca: Some(read("ca.crt")),
            },
        ),
    ];
    for (what, url, tls) in callers {
        let caller =
            relay_rpc::RemoteShard::connect_lazy_with(url, 16, credential.clone(), &tls).expect("url");
        assert!(caller.ready().await.is_err(), "a caller with {what} was served");
    }
    let trusted = relay_rpc::RemoteShard::connect_lazy_with(
        &shard.url,
        16,
        credential,
        &relay_rpc::LinkTls {
            identity: Some((read("gateway.crt"), read("gateway.key"))),
            ca: Some(read("ca.crt")),
        },
    )
    .expect("url");
    assert!(
        trusted.ready().await.is_ok(),
        "the gateway's certificate is refused"
    );
}

/// `ahp-relay internal-tls` makes TLS for the internal link where there is no CA of one's own (what
/// docker-compose runs at start): the shard serves TLS with the certificate it made, a gateway that trusts only
/// its CA works end to end, and a caller in plaintext or trusting another CA is refused before any call. A
/// second run keeps what is there; the key is readable by its owner only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_tls_made_by_the_relay_secures_the_link() {
    use relay_core::link::HostLink;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let make = |set: &str| {
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
            .arg("internal-tls")
            .arg("--dir")
            .arg(dir.path().join(set).join("shard"))
            .arg("--ca-dir")
            .arg(dir.path().join(set).join("ca"))
            .args(["--name", "localhost,127.0.0.1"])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("internal-tls");
        assert!(status.success());
    };
    let path = |file: &str| dir.path().join(file).display().to_string();
    let read = |file: &str| std::fs::read(dir.path().join(file)).expect("read");
    make("ours");
    let made = read("ours/shard/tls.crt");
    make("ours");
    assert_eq!(
        read("ours/shard/tls.crt"),
        made,
        "a second run replaced the certificate"
    );
    let mode = std::fs::metadata(dir.path().join("ours/shard/tls.key"))
        .expect("key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "the key is readable by others: {mode:o}");
    make("theirs");

    let shard = Shard::start(&[
        "--internal-tls-cert",
        &path("ours/shard/tls.crt"),
        "--internal-tls-key",
        &path("ours/shard/tls.key"),
    ])
    .await;
    assert!(shard.url.starts_with("https://"), "{}", shard.url);
    let gateway = Relay::gateway_with(&shard.url, &["--internal-tls-ca", &path("ours/ca/ca.crt")]).await;
    let (client, _) = gateway.client("over-tls").await;
    let (_, chat) = create_session_and_chat(&client, "made-tls").await;
    let (_, _, mut sub) = subscribe_chat(&client, &chat).await;
    client
        .dispatch(chat.clone(), turn_started("t1", "hello over the relay's own TLS"))
        .await
        .expect("dispatch");
    collect_until(&mut sub, is_turn_complete).await;

    let credential = relay_rpc::InternalCredential::new(INTERNAL_SECRET.as_bytes()).expect("credential");
    let plaintext = shard.url.replacen("https://", "http://", 1);
    let callers = [
        ("plaintext", plaintext.as_str(), None),
        ("another CA", shard.url.as_str(), Some(read("theirs/ca/ca.crt"))),
    ];
    for (what, url, ca) in callers {
        let caller = relay_rpc::RemoteShard::connect_lazy_with(
            url,
            16,
            credential.clone(),
            &relay_rpc::LinkTls { identity: None, ca },
        )
        .expect("url");
        assert!(
            caller.ready().await.is_err(),
            "a caller trusting {what} was served"
        );
    }
    let trusted = relay_rpc::RemoteShard::connect_lazy_with(
        &shard.url,
        16,
        credential,
        &relay_rpc::LinkTls {
            identity: None,
            ca: Some(read("ours/ca/ca.crt")),
        },
    )
    .expect("url");
    assert!(
        trusted.ready().await.is_ok(),
        "a caller trusting the CA made was refused"
    );
}

/// With the gateways' identity-assertion key, a shard acts only on what a gateway signed: a gateway holding
/// the private key works end to end, while a caller holding just the internal secret cannot attach (without an
/// assertion, with one of another key, or for another host), cannot follow a host's events, and an attach
/// acts as the identity asserted, not the one the request names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shard_acts_only_on_identities_the_gateways_signed() {
    use relay_rpc::pb;
    if std::process::Command::new("openssl")
        .arg("version")
        .output()
        .is_err()
    {
        println!("skipped: openssl not found");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // The gateways' pair as a deployment makes it (compose's init step); a rogue pair with openssl.
    let made = std::process::Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
        .args(["identity-keys", "--dir"])
        .arg(dir.path().join("made"))
        .output()
        .expect("identity-keys");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let private_mode = std::fs::metadata(dir.path().join("made/identity.pem"))
        .expect("private key")
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&private_mode) & 0o777,
        0o400
    );
    openssl(&["genpkey", "-algorithm", "ed25519", "-out", "rogue.pem"]);
    let path = |name: &str| dir.path().join(name).display().to_string();
    // Without a key, and not told the link is trusted, a shard does not start.
    let starting = tokio::process::Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
        .args([
            "shard",
            "--grpc-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.path())
        .env("AHP_RELAY_INTERNAL_SECRET", INTERNAL_SECRET)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("shard");
    let refused = tokio::time::timeout(PATIENCE, starting.wait_with_output())
        .await
        .expect("a shard with no key exits instead of serving")
        .expect("shard");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--identity-verifying-key"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let shard = Shard::start(&["--identity-verifying-key", &path("made/identity.pub.pem")]).await;
    let gateway = Relay::gateway_with(
        &shard.url,
        &["--identity-signing-key", &path("made/identity.pem")],
    )
    .await;
    let (client, _) = gateway.client("signed").await;
    let (_, chat) = create_session_and_chat(&client, "signed").await;
    let (_, _, mut sub) = subscribe_chat(&client, &chat).await;
    client
        .dispatch(chat.clone(), turn_started("t1", "hello, signed"))
        .await
        .expect("dispatch");
    collect_until(&mut sub, is_turn_complete).await;

    // A caller with only the internal secret.
    let channel = tonic::transport::Endpoint::from_shared(shard.url.clone())
        .expect("url")
        .connect()
        .await
        .expect("grpc");
    let credential = relay_rpc::InternalCredential::new(INTERNAL_SECRET.as_bytes()).expect("credential");
    let mut grpc = pb::shard_client::ShardClient::with_interceptor(channel, credential);
    let signer = |name: &str| {
        relay_rpc::AssertionSigner::from_pem(&std::fs::read(dir.path().join(name)).expect("key"))
            .expect("signer")
    };
    let (gateways, rogue) = (signer("made/identity.pem"), signer("rogue.pem"));
    let host = relay_core::HostKey::new("dev", "default");
    let connection = relay_core::ConnectionId((0x51a7 << 32) | 1);
    let viewer = relay_core::Identity {
        subject: "vera".into(),
        tenant: "dev".into(),
        role: Role::Viewer,
        hosts: None,
    };
    let attach = |assert_as: Option<(&relay_rpc::AssertionSigner, &relay_core::HostKey)>| {
        let mut request = tonic::Request::new(pb::AttachRequest {
            host: Some(pb::HostKey {
                tenant: "dev".into(),
                host: "default".into(),
            }),
            connection: connection.0,
            // What the request names: an admin. Only an assertion says who it is.
            identity: Some(pb::Identity {
                subject: "mallory".into(),
                tenant: "dev".into(),
                role: pb::Role::Admin as i32,
                ..Default::default()
            }),
        });
        if let Some((signer, asserted_host)) = assert_as {
            signer
                .attach(
                    request.metadata_mut(),
                    asserted_host,
                    connection,
                    &viewer,
                    "vera-key",
                )
                .expect("sign");
        }
        request
    };
    let code = |result: Result<tonic::Response<pb::AttachReply>, tonic::Status>| match result {
        Ok(_) => tonic::Code::Ok,
        Err(status) => status.code(),
    };
    assert_eq!(
        code(grpc.attach(attach(None)).await),
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        code(grpc.attach(attach(Some((&rogue, &host)))).await),
        tonic::Code::Unauthenticated
    );
    let elsewhere = relay_core::HostKey::new("other", "default");
    assert_eq!(
        code(grpc.attach(attach(Some((&gateways, &elsewhere)))).await),
        tonic::Code::PermissionDenied
    );
    let events = grpc
        .events(pb::EventsRequest {
            host: Some(pb::HostKey {
                tenant: "dev".into(),
                host: "default".into(),
            }),
            gateway: 0x51a7,
        })
        .await;
    assert_eq!(
        events.err().map(|status| status.code()),
        Some(tonic::Code::Unauthenticated)
    );

    // Signed as a viewer, the connection is a viewer, whatever the request said.
    assert_eq!(
        code(grpc.attach(attach(Some((&gateways, &host)))).await),
        tonic::Code::Ok
    );
    let call_with = |key: Option<&'static str>, frame: serde_json::Value| {
        let mut grpc = grpc.clone();
        async move {
            let mut request = tonic::Request::new(pb::CallRequest {
                host: Some(pb::HostKey {
                    tenant: "dev".into(),
                    host: "default".into(),
                }),
                connection: connection.0,
                frame: frame.to_string().into_bytes(),
            });
            if let Some(key) = key {
                relay_rpc::AssertionSigner::present_key(request.metadata_mut(), key).expect("key");
            }
            grpc.call(request).await.map(|reply| {
                serde_json::from_slice::<serde_json::Value>(&reply.into_inner().frame.expect("frame"))
                    .expect("JSON")
            })
        }
    };
    let ping = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "ping"});
    // Connection ids are no secret: without the key its gateway was given, nobody calls on the connection.
    for key in [None, Some("guessed")] {
        let refused = call_with(key, ping.clone())
            .await
            .expect_err("a call without the connection's key");
        assert!(
            matches!(
                refused.code(),
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            ),
            "{refused}"
        );
    }
    let call = |frame: serde_json::Value| {
        let call_with = &call_with;
        async move { call_with(Some("vera-key"), frame).await.expect("call") }
    };
    let opened = call(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "vera-phone"}}),
    )
    .await;
    assert!(opened.get("result").is_some(), "{opened}");
    let created = call(
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "createSession",
        "params": {"channel": "ahp-session:/by-mallory", "provider": "demo"}}),
    )
    .await;
    assert_eq!(created["error"]["code"], -32009, "{created}");
}
