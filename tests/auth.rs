//! Tokens are checked at the upgrade, and a tenant can neither see nor touch another tenant's sessions.

mod support;

use std::time::Duration;

use ahp::ClientError;
use ahp_types::actions::StateAction;
use ahp_types::commands::ListSessionsResult;
use relay_core::Role;
use relay_gateway::auth::{mint_hs256, Claims};
use support::*;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Error as WsError;

async fn upgrade_status(url: String, bearer: Option<String>) -> u16 {
    let mut request = url.into_client_request().expect("request");
    if let Some(token) = bearer {
        request.headers_mut().insert(
            "Authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok(_) => 101,
        Err(WsError::Http(response)) => response.status().as_u16(),
        Err(other) => panic!("unexpected error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_bad_and_expired_tokens_are_refused_at_the_upgrade() {
    let relay = Relay::start().await;
    let url = relay.url();
    assert_eq!(upgrade_status(url.clone(), None).await, 401);
    assert_eq!(
        upgrade_status(format!("{url}?access_token=not-a-jwt"), None).await,
        401
    );

    let forged = mint_hs256(
        b"some-other-secret",
        &Claims::new("dev", "mallory", Role::Admin, None, Duration::from_secs(60)),
    )
    .expect("mint");
    assert_eq!(upgrade_status(url.clone(), Some(forged)).await, 401);

    let mut expired = Claims::new("dev", "ana", Role::Admin, None, Duration::from_secs(60));
    expired.exp = 1_000_000;
    let expired = mint_hs256(SECRET.as_bytes(), &expired).expect("mint");
    assert_eq!(
        upgrade_status(format!("{url}?access_token={expired}"), None).await,
        401
    );

    // A good token works both as a header and as a query parameter.
    let good = relay.token("dev", "ana", Role::Member);
    assert_eq!(upgrade_status(url.clone(), Some(good.clone())).await, 101);
    assert_eq!(
        upgrade_status(format!("{url}?access_token={good}"), None).await,
        101
    );

    // A token restricted to some hosts cannot open others.
    let scoped = mint_hs256(
        SECRET.as_bytes(),
        &Claims::new(
            "dev",
            "ana",
            Role::Member,
            Some(vec!["alpha".into()]),
            Duration::from_secs(60),
        ),
    )
    .expect("mint");
    let base = format!("ws://{}", relay.addr);
    assert_eq!(
        upgrade_status(format!("{base}/v1/hosts/alpha/ws?access_token={scoped}"), None).await,
        101
    );
    assert_eq!(
        upgrade_status(format!("{base}/v1/hosts/beta/ws?access_token={scoped}"), None).await,
        403
    );
}

/// The error's code and message, with the URI it names replaced, so errors for two URIs compare.
fn rpc_error<T: std::fmt::Debug>(result: Result<T, ClientError>, uri: &str) -> (i32, String) {
    match result {
        Err(ClientError::Rpc(e)) => (e.code, e.message.replace(uri, "<uri>")),
        other => panic!("expected an RPC error, got {other:?}"),
    }
}

fn rpc_code<T: std::fmt::Debug>(result: Result<T, ClientError>) -> i32 {
    match result {
        Err(ClientError::Rpc(e)) => e.code,
        other => panic!("expected an RPC error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_sees_exactly_what_it_would_for_a_session_that_does_not_exist() {
    let relay = Relay::start().await;
    let (alice, _) = relay.client_as("a", "alice", Role::Admin, "alice-laptop").await;
    let (session, chat) = create_session_and_chat(&alice, "secret-plans").await;
    let (before, _, mut alice_sub) = subscribe_chat(&alice, &chat).await;

    let (bob, _) = relay.client_as("b", "bob", Role::Admin, "bob-laptop").await;

    // Listing: nothing of tenant a.
    let list: ListSessionsResult = bob
        .request("listSessions", serde_json::json!({"channel": "ahp-root://"}))
        .await
        .expect("list");
    assert!(list.items.is_empty(), "{list:?}");

    // Subscribing: the same error as for a URI nobody ever used.
    for (taken, never) in [
        (&session, "ahp-session:/never-existed"),
        (&chat, "ahp-chat:/never-existed"),
    ] {
        let a = rpc_error(bob.subscribe(taken.clone()).await.map(|(r, _)| r), taken);
        let b = rpc_error(bob.subscribe(never.into()).await.map(|(r, _)| r), never);
        assert_eq!(a, b);
    }

    // Dispatching into a's chat does nothing: alice's next envelope is her own, and state is unchanged.
    bob.dispatch(chat.clone(), turn_started("b1", "hijack"))
        .await
        .expect("dispatch");
    assert_eq!(
        json(&fresh_chat_snapshot_for(&relay, "a", &chat).await),
        json(&before)
    );

    // Tenant b can even use the same URIs: they are its own, separate sessions.
    let (b_session, _) = create_session_and_chat(&bob, "secret-plans").await;
    assert_eq!(b_session, session);
    alice
        .dispatch(chat.clone(), turn_started("a1", "mine"))
        .await
        .expect("dispatch");
    let first = next_envelope(&mut alice_sub).await;
    assert_eq!(
        first.origin.as_ref().map(|o| o.client_id.as_str()),
        Some("alice-laptop")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_id_belongs_to_the_user_who_first_used_it() {
    let relay = Relay::start().await;
    let (_alice, _) = relay.client_as("dev", "alice", Role::Member, "shared-id").await;
    let mallory = relay.connect("dev", "mallory", Role::Member).await;
    let refused = mallory
        .initialize("shared-id".into(), vec!["1.0.0".into()], vec![])
        .await;
    assert_eq!(rpc_code(refused), -32009);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_connection_quota_is_refused_with_429() {
    let relay = Relay::start_with(&["--max-connections-per-tenant", "2"]).await;
    let url = |tenant: &str| {
        format!(
            "{}?access_token={}",
            relay.url(),
            relay.token(tenant, "ana", Role::Member)
        )
    };
    let (_first, _) = tokio_tungstenite::connect_async(url("busy"))
        .await
        .expect("first");
    let (_second, _) = tokio_tungstenite::connect_async(url("busy"))
        .await
        .expect("second");
    assert_eq!(upgrade_status(url("busy"), None).await, 429);
    assert_eq!(
        upgrade_status(url("quiet"), None).await,
        101,
        "other tenants are unaffected"
    );
}

/// An identity provider's RS256 token for `claims` (the throw-away key of services/gateway/tests/keys).
fn provider_token(claims: &serde_json::Value) -> String {
    let key = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../gateway/tests/keys/rsa.key"
    ))
    .expect("key");
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
        claims,
        &jsonwebtoken::EncodingKey::from_rsa_pem(&key).expect("rsa key"),
    )
    .expect("sign")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_identity_provider_only_its_tokens_get_in() {
    let public_key = concat!(env!("CARGO_MANIFEST_DIR"), "/../gateway/tests/keys/rsa.pub");
    let relay = Relay::start_with(&[
        "--jwt-public-key-file",
        public_key,
        "--jwt-issuer",
        "https://idp.test",
        "--jwt-audience",
        "ahp-relay",
        "--jwt-claim-tenant",
        "org",
        "--jwt-claim-role",
        "groups",
    ])
    .await;
    let url = relay.url();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let claims = serde_json::json!({
        "sub": "ana", "org": "acme", "groups": ["member"], "iss": "https://idp.test", "aud": "ahp-relay",
        "exp": now + 600, "iat": now
    });
    // The provider's token opens a session of its tenant (from the `org` claim).
    let token = provider_token(&claims);
    let transport = ahp_ws::WebSocketTransport::connect(&format!("{url}?access_token={token}"))
        .await
        .expect("connect");
    let client = ahp::Client::connect(transport, ahp::ClientConfig::default())
        .await
        .expect("client");
    let initialized = client
        .initialize(
            "provider-client".into(),
            vec!["1.0.0".into()],
            vec!["ahp-root://".into()],
        )
        .await;
    assert!(initialized.is_ok(), "{initialized:?}");
    // The relay's own HS256 tokens no longer get in; nor do the provider's for another audience or issuer.
    assert_eq!(
        upgrade_status(url.clone(), Some(relay.token("acme", "ana", Role::Admin))).await,
        401
    );
    for (claim, value) in [("aud", "someone-else"), ("iss", "https://evil.test")] {
        let mut other = claims.clone();
        other[claim] = value.into();
        assert_eq!(
            upgrade_status(url.clone(), Some(provider_token(&other))).await,
            401,
            "{claim}"
        );
    }
}

/// A file of services/gateway/tests/keys (throw-away keys).
fn test_key(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/../gateway/tests/keys/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("test key")
}

fn public_jwk(name: &str, kid: &str) -> serde_json::Value {
    let mut jwk: serde_json::Value =
        serde_json::from_slice(&test_key(&format!("{name}.jwk.json"))).expect("jwk");
    jwk["kid"] = kid.into();
    jwk["use"] = "sig".into();
    jwk
}

/// A token for `claims` signed with the test key `name` (`rsa`, `ec`), naming `kid`.
fn signed(name: &str, kid: &str, claims: &serde_json::Value) -> String {
    let (alg, key) = match name {
        "ec" => (
            jsonwebtoken::Algorithm::ES256,
            jsonwebtoken::EncodingKey::from_ec_pem(&test_key("ec.key")).expect("ec"),
        ),
        _ => (
            jsonwebtoken::Algorithm::RS256,
            jsonwebtoken::EncodingKey::from_rsa_pem(&test_key(&format!("{name}.key"))).expect("rsa"),
        ),
    };
    let mut header = jsonwebtoken::Header::new(alg);
    header.kid = Some(kid.into());
    jsonwebtoken::encode(&header, claims, &key).expect("sign")
}

/// A JWKS endpoint the test controls: the key set it serves, and how many times it was fetched.
struct JwksEndpoint {
    url: String,
    keys: std::sync::Arc<parking_lot::Mutex<serde_json::Value>>,
    fetches: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    server: tokio::task::JoinHandle<()>,
}

impl JwksEndpoint {
    async fn start(keys: serde_json::Value) -> JwksEndpoint {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/jwks", listener.local_addr().expect("addr"));
        let keys = std::sync::Arc::new(parking_lot::Mutex::new(keys));
        let fetches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (served, counted) = (keys.clone(), fetches.clone());
        let app = axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                let (served, counted) = (served.clone(), counted.clone());
                async move {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    axum::Json(serde_json::json!({ "keys": served.lock().clone() }))
                }
            }),
        );
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        JwksEndpoint {
            url,
            keys,
            fetches,
            server,
        }
    }

    fn serve(&self, keys: serde_json::Value) {
        *self.keys.lock() = keys;
    }

    fn fetches(&self) -> usize {
        self.fetches.load(std::sync::atomic::Ordering::SeqCst)
    }
}

async fn http_status(addr: &str, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_from_a_jwks_rotate_while_clients_stay_connected() {
    let jwks = JwksEndpoint::start(serde_json::json!([public_jwk("rsa", "k1")])).await;
    let relay = Relay::start_with(&[
        "--jwks-url",
        &jwks.url,
        "--jwks-min-refetch",
        "0s",
        "--jwt-issuer",
        "https://idp.test",
        "--jwt-audience",
        "ahp-relay",
    ])
    .await;
    let url = relay.url();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let claims = serde_json::json!({
        "sub": "ana", "tid": "acme", "role": "member", "iss": "https://idp.test", "aud": "ahp-relay",
        "exp": now + 600, "iat": now
    });
    let connect = |token: String| {
        let url = url.clone();
        async move {
            let transport = ahp_ws::WebSocketTransport::connect(&format!("{url}?access_token={token}"))
                .await
                .expect("connect");
            let client = ahp::Client::connect(transport, ahp::ClientConfig::default())
                .await
                .expect("client");
            let init = client
                .initialize(
                    format!("jwks-{token:.8}"),
                    vec!["1.0.0".into()],
                    vec!["ahp-root://".into()],
                )
                .await;
            assert!(init.is_ok(), "{init:?}");
            client
        }
    };
    // A token of the first key gets in; the client stays connected through the rotation.
    let first = connect(signed("rsa", "k1", &claims)).await;
    // Rotation, step 1: the provider adds a new key. A token naming it makes the relay fetch the set again.
    jwks.serve(serde_json::json!([
        public_jwk("rsa", "k1"),
        public_jwk("ec", "k2")
    ]));
    let second = connect(signed("ec", "k2", &claims)).await;
    // Step 2: the old key is removed. The relay learns it on its next fetch (here forced by an unknown kid).
    jwks.serve(serde_json::json!([public_jwk("ec", "k2")]));
    assert_eq!(
        upgrade_status(url.clone(), Some(signed("other-rsa", "k3", &claims))).await,
        401,
        "an unknown kid"
    );
    assert_eq!(
        upgrade_status(url.clone(), Some(signed("rsa", "k1", &claims))).await,
        401,
        "the removed key"
    );
    assert_eq!(
        upgrade_status(url.clone(), Some(signed("ec", "k2", &claims))).await,
        101,
        "the new key"
    );
    // Both connections opened before and during the rotation still work.
    for client in [&first, &second] {
        let listed: Result<ListSessionsResult, _> = client
            .request("listSessions", serde_json::json!({"channel": "ahp-root://"}))
            .await;
        assert!(listed.is_ok(), "{listed:?}");
    }
    // A token signed with a key of the set but claiming another one's kid does not verify.
    assert_eq!(
        upgrade_status(url.clone(), Some(signed("rsa", "k2", &claims))).await,
        401
    );
    // Wrong issuer or audience, expired, `alg: none`, and HS256 signed with the public key: all 401.
    for (claim, value) in [
        ("iss", serde_json::json!("https://evil.test")),
        ("aud", serde_json::json!("someone-else")),
        ("exp", serde_json::json!(now - 3600)),
    ] {
        let mut bad = claims.clone();
        bad[claim] = value;
        assert_eq!(
            upgrade_status(url.clone(), Some(signed("ec", "k2", &bad))).await,
            401,
            "{claim}"
        );
    }
    use base64::Engine;
    let b64 = |json: &serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(json).expect("json"))
    };
    let unsigned = format!(
        "{}.{}.",
        b64(&serde_json::json!({"alg": "none", "typ": "JWT", "kid": "k2"})),
        b64(&claims)
    );
    assert_eq!(upgrade_status(url.clone(), Some(unsigned)).await, 401, "alg none");
    let mut hs_header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    hs_header.kid = Some("k2".into());
    let confused = jsonwebtoken::encode(
        &hs_header,
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(&test_key("ec.pub")),
    )
    .expect("sign");
    assert_eq!(
        upgrade_status(url.clone(), Some(confused)).await,
        401,
        "alg confusion"
    );

    // The provider becomes unreachable: the relay keeps its cached keys and stays up.
    jwks.server.abort();
    let _ = (&mut { jwks.server }).await;
    assert_eq!(
        upgrade_status(url.clone(), Some(signed("other-rsa", "k4", &claims))).await,
        401,
        "an unknown kid while the provider is down"
    );
    assert_eq!(
        upgrade_status(url.clone(), Some(signed("ec", "k2", &claims))).await,
        101,
        "a cached key while the provider is down"
    );
    assert_eq!(http_status(&relay.addr, "/healthz").await, 200);
    let listed: Result<ListSessionsResult, _> = second
        .request("listSessions", serde_json::json!({"channel": "ahp-root://"}))
        .await;
    assert!(listed.is_ok(), "{listed:?}");
}

/// `ahp-relay ARGS` exits (it must not start); returns what it printed on stderr.
async fn refuses_to_start(args: &[&str]) -> String {
    let data = tempfile::tempdir().expect("tempdir");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path())
        .args(args)
        .env_remove("AHP_RELAY_JWT_ISSUER")
        .env_remove("AHP_RELAY_JWT_AUDIENCE")
        .stdin(std::process::Stdio::null())
        .output();
    let output = tokio::time::timeout(PATIENCE, output)
        .await
        .expect("the relay started instead of refusing")
        .expect("run");
    assert!(!output.status.success(), "it started: {output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_provider_without_issuer_and_audience_is_refused_at_start() {
    let public_key = concat!(env!("CARGO_MANIFEST_DIR"), "/../gateway/tests/keys/rsa.pub");
    for missing in [
        vec!["--jwt-public-key-file", public_key, "--jwt-audience", "ahp-relay"],
        vec![
            "--jwt-public-key-file",
            public_key,
            "--jwt-issuer",
            "https://idp.test",
        ],
        vec![
            "--jwks-url",
            "http://127.0.0.1:9/jwks",
            "--jwt-issuer",
            "https://idp.test",
        ],
    ] {
        let said = refuses_to_start(&missing).await;
        assert!(
            said.contains("--jwt-issuer") && said.contains("--jwt-audience"),
            "{missing:?}: {said}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_kids_refetch_the_jwks_at_most_once_per_interval() {
    let jwks = JwksEndpoint::start(serde_json::json!([public_jwk("rsa", "k1")])).await;
    let relay = Relay::start_with(&[
        "--jwks-url",
        &jwks.url,
        "--jwks-min-refetch",
        "1h",
        "--jwt-issuer",
        "https://idp.test",
        "--jwt-audience",
        "ahp-relay",
    ])
    .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let claims = serde_json::json!({
        "sub": "ana", "tid": "acme", "role": "member", "exp": now + 600,
        "iss": "https://idp.test", "aud": "ahp-relay",
    });
    // The start-up fetch.
    assert_eq!(
        upgrade_status(relay.url(), Some(signed("rsa", "k1", &claims))).await,
        101
    );
    assert_eq!(jwks.fetches(), 1);
    // Fifty tokens naming made-up kids within the interval since that fetch: no fetch at all (with
    // `--jwks-min-refetch 0s`, each would fetch: see keys_from_a_jwks_rotate_while_clients_stay_connected).
    // Past the burst of failures one address may have, the rest are throttled (429) before being looked at.
    let mut looked_at = 0;
    for n in 0..50 {
        let token = signed("other-rsa", &format!("made-up-{n}"), &claims);
        match upgrade_status(relay.url(), Some(token)).await {
            401 => looked_at += 1,
            429 => {}
            other => panic!("status {other}"),
        }
    }
    assert!(looked_at >= 20, "{looked_at} tokens looked at");
    assert_eq!(jwks.fetches(), 1, "no refetch within the interval");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_jwks_is_unreachable_still_starts() {
    // A port nothing listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/jwks", closed.local_addr().expect("addr"));
    drop(closed);
    let relay = Relay::start_with(&[
        "--jwks-url",
        &url,
        "--jwks-timeout",
        "1s",
        "--jwt-issuer",
        "https://idp.test",
        "--jwt-audience",
        "ahp-relay",
    ])
    .await;
    assert_eq!(http_status(&relay.addr, "/healthz").await, 200);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let claims = serde_json::json!({
        "sub": "ana", "tid": "acme", "role": "member", "exp": now + 600,
        "iss": "https://idp.test", "aud": "ahp-relay",
    });
    assert_eq!(
        upgrade_status(relay.url(), Some(signed("rsa", "k1", &claims))).await,
        401
    );
}

async fn http_body(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_reach_logs_or_metrics() {
    let data = tempfile::tempdir().expect("tempdir");
    let log = data.path().join("relay.log");
    // The relay at its most verbose (every crate at trace), its log written to a file the test reads.
    let mut command = tokio::process::Command::new("sh");
    command.args([
        "-c",
        "RUST_LOG=trace exec \"$0\" \"$@\" 2>>\"$RELAY_LOG\"",
        env!("CARGO_BIN_EXE_ahp-relay"),
        "serve",
        "--data-dir",
    ]);
    command
        .arg(data.path().join("store"))
        .args(["--listen", "127.0.0.1:0", "--jwt-secret", SECRET])
        .env("RELAY_LOG", &log);
    let (mut child, addr) = support::spawn_until(command, "listening on ws://").await;
    let addr = addr.trim_end_matches("/v1/ws").to_string();
    let valid = |sub: &str| {
        mint_hs256(
            SECRET.as_bytes(),
            &Claims::new("acme", sub, Role::Member, None, Duration::from_secs(3600)),
        )
        .expect("mint")
    };
    let (in_query, in_header) = (valid("query-user"), valid("header-user"));
    let expired = mint_hs256(
        SECRET.as_bytes(),
        &Claims {
            exp: 1,
            ..Claims::new("acme", "late", Role::Member, None, Duration::from_secs(1))
        },
    )
    .expect("mint");
    let forged = mint_hs256(
        b"not-the-relay-secret-but-32-bytes-long!",
        &Claims::new("acme", "forger", Role::Admin, None, Duration::from_secs(3600)),
    )
    .expect("mint");
    // Tokens in the query (accepted, expired, forged) and in the header; a token handed to `authenticate`.
    let transport =
        ahp_ws::WebSocketTransport::connect(&format!("ws://{addr}/v1/ws?access_token={in_query}"))
            .await
            .expect("connect");
    let client = ahp::Client::connect(transport, ahp::ClientConfig::default())
        .await
        .expect("client");
    client
        .initialize(
            "log-check".into(),
            vec!["1.0.0".into()],
            vec!["ahp-root://".into()],
        )
        .await
        .expect("initialize");
    let handed = valid("handed-over");
    let _ = client
        .request::<_, serde_json::Value>(
            "authenticate",
            serde_json::json!({"resource": "https://api.example", "token": handed}),
        )
        .await;
    let url = format!("ws://{addr}/v1/ws");
    assert_eq!(upgrade_status(url.clone(), Some(in_header.clone())).await, 101);
    for refused in [&expired, &forged] {
        assert_eq!(
            upgrade_status(format!("{url}?access_token={refused}"), None).await,
            401
        );
        assert_eq!(upgrade_status(url.clone(), Some(refused.clone())).await, 401);
    }
    let metrics = http_body(&addr, "/metrics").await;
    assert!(metrics.contains("ahp_relay"), "metrics are served");
    drop(client);
    // Shut the relay down so every log line is written, then read the log.
    let pid = child.id().expect("running");
    support::terminate(&mut child).await;
    let logged = std::fs::read_to_string(&log).expect("log");
    assert!(logged.len() > 1000, "the relay logged at trace level ({pid})");
    for (name, token) in [
        ("query", &in_query),
        ("header", &in_header),
        ("expired", &expired),
        ("forged", &forged),
        ("authenticate", &handed),
    ] {
        // The signature is the secret part; no piece of the token may show.
        let signature = token.rsplit('.').next().expect("signature");
        assert!(!logged.contains(signature), "the {name} token is in the log");
        assert!(!metrics.contains(signature), "the {name} token is in the metrics");
    }
}

/// Frames a raw socket receives for `request` (sent as is) up to the answer of a ping sent after it.
async fn frames_for(
    socket: &mut support::raw::Socket,
    request: serde_json::Value,
    ping_id: u64,
) -> Vec<serde_json::Value> {
    support::raw::send(socket, request.to_string()).await;
    support::raw::send(
        socket,
        serde_json::json!({"jsonrpc": "2.0", "id": ping_id, "method": "ping"}).to_string(),
    )
    .await;
    let mut frames = Vec::new();
    loop {
        let frame = support::raw::recv(socket).await;
        if frame["id"] == serde_json::json!(ping_id) && frame.get("result").is_some() {
            return frames;
        }
        frames.push(frame);
    }
}

/// Frames a raw socket receives for the notification `dispatch` (sent as is, with `clientSeq`) until both the
/// answer to a ping sent after it and the envelope echoing `clientSeq` have arrived. The echo is sequenced and
/// published once its batch is stored, the ping is answered at once: JSON-RPC orders neither before the other.
async fn frames_for_dispatch(
    socket: &mut support::raw::Socket,
    dispatch: serde_json::Value,
    client_seq: u64,
    ping_id: u64,
) -> Vec<serde_json::Value> {
    support::raw::send(socket, dispatch.to_string()).await;
    support::raw::send(
        socket,
        serde_json::json!({"jsonrpc": "2.0", "id": ping_id, "method": "ping"}).to_string(),
    )
    .await;
    let echoes = |frame: &serde_json::Value| {
        frame["params"]["envelope"]["origin"]["clientSeq"] == serde_json::json!(client_seq)
            || frame["params"]["origin"]["clientSeq"] == serde_json::json!(client_seq)
    };
    let (mut frames, mut answered, mut echoed) = (Vec::new(), false, false);
    while !(answered && echoed) {
        let frame = support::raw::recv(socket).await;
        if frame["id"] == serde_json::json!(ping_id) && frame.get("result").is_some() {
            answered = true;
            continue;
        }
        echoed |= echoes(&frame);
        frames.push(frame);
    }
    frames
}

/// Session and chat as a fresh subscriber of `tenant` sees them.
async fn session_and_chat_json(relay: &Relay, tenant: &str, session: &str, chat: &str) -> String {
    let (observer, _) = relay.client_as(tenant, "auditor", Role::Admin, "auditor").await;
    let (s, _) = observer.subscribe(session.to_string()).await.expect("session");
    let (c, _) = observer.subscribe(chat.to_string()).await.expect("chat");
    observer.shutdown().await;
    format!(
        "{}\n{}",
        json(&s.snapshot.map(|s| s.state)),
        json(&c.snapshot.map(|s| s.state))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_watches_a_live_turn_but_every_mutation_is_refused() {
    let relay = Relay::start_with(&["--demo-step-ms", "20"]).await;
    let (member, _) = relay.client_as("t", "mia", Role::Member, "mia-laptop").await;
    let (session, chat) = create_session_and_chat(&member, "watched").await;
    let (viewer, _) = relay.client_as("t", "vic", Role::Viewer, "vic-phone").await;
    let (_, _, mut watching) = subscribe_chat(&viewer, &chat).await;
    // The viewer sees the member's turn as it streams.
    member
        .dispatch(chat.clone(), turn_started("live", "hello"))
        .await
        .expect("dispatch");
    let seen = collect_until(&mut watching, is_turn_complete).await;
    assert!(
        matches!(
            seen.first().map(|e| &e.action),
            Some(StateAction::ChatTurnStarted(_))
        ),
        "the viewer saw the turn start"
    );
    assert!(
        seen.len() > 3,
        "and its streamed parts ({} envelopes)",
        seen.len()
    );
    let before = session_and_chat_json(&relay, "t", &session, &chat).await;

    // Every client-dispatchable action type is rejected for the viewer, with a reason, to it alone.
    let mut raw = support::raw::raw_as(&relay, "t", "vic", Role::Viewer).await;
    support::raw::send(
        &mut raw,
        serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "vic-raw",
            "initialSubscriptions": ["ahp-root://", session, chat]}})
        .to_string(),
    )
    .await;
    support::raw::answer_to(&mut raw, 0).await;
    // All but the viewer's own presence (no tools), which it may announce (see the test after this one).
    let actions: Vec<_> = every_client_action("vic-raw", &session, &chat)
        .into_iter()
        .filter(|(_, action)| !matches!(action, StateAction::SessionActiveClientSet(_)))
        .collect();
    for (n, (channel, action)) in actions.iter().enumerate() {
        let frames = frames_for_dispatch(
            &mut raw,
            serde_json::json!({"jsonrpc": "2.0", "method": "dispatchAction",
                "params": {"channel": channel, "clientSeq": n + 1, "action": action}}),
            n as u64 + 1,
            1000 + n as u64,
        )
        .await;
        assert_eq!(frames.len(), 1, "{action:?}: {frames:?}");
        let reason = frames[0]["params"]["envelope"]["rejectionReason"]
            .as_str()
            .or_else(|| frames[0]["params"]["rejectionReason"].as_str())
            .unwrap_or_default()
            .to_string();
        assert!(reason.contains("viewer"), "{action:?}: {frames:?}");
    }
    // Every mutating command is refused with PermissionDenied.
    for (n, (method, params)) in [
        (
            "createSession",
            serde_json::json!({"channel": "ahp-session:/viewer-made", "provider": "demo"}),
        ),
        (
            "createChat",
            serde_json::json!({"channel": session, "chat": "ahp-chat:/viewer-made"}),
        ),
        ("disposeChat", serde_json::json!({"channel": chat})),
        ("disposeSession", serde_json::json!({"channel": session})),
    ]
    .into_iter()
    .enumerate()
    {
        let id = 2000 + n as u64;
        let frames = frames_for(
            &mut raw,
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
            3000 + n as u64,
        )
        .await;
        assert_eq!(frames.len(), 1, "{method}: {frames:?}");
        assert_eq!(frames[0]["error"]["code"], -32009, "{method}: {frames:?}");
    }
    assert_eq!(
        session_and_chat_json(&relay, "t", &session, &chat).await,
        before,
        "nothing changed"
    );
}

/// Issue 36 (11): a viewer may say it watches a session (itself as an active client offering no tools), so every
/// device lists who is watching, named by the relay (its user, "watching": no words of its own); offering tools,
/// setting another client, or setting itself again while listed stays refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_may_say_it_watches_a_session_and_nothing_more() {
    let relay = Relay::start_with(&[]).await;
    let (member, _) = relay.client_as("t", "mia", Role::Member, "mia-laptop").await;
    let (session, chat) = create_session_and_chat(&member, "watched").await;
    let mut raw = support::raw::raw_as(&relay, "t", "vic", Role::Viewer).await;
    support::raw::send(
        &mut raw,
        serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "vic-raw",
            "initialSubscriptions": ["ahp-root://", session, chat]}})
        .to_string(),
    )
    .await;
    support::raw::answer_to(&mut raw, 0).await;
    let reason_of = |frames: &[serde_json::Value]| {
        frames.first().and_then(|frame| {
            frame["params"]["envelope"]["rejectionReason"]
                .as_str()
                .or_else(|| frame["params"]["rejectionReason"].as_str())
                .map(str::to_string)
        })
    };
    let tool = serde_json::json!({"name": "t", "description": "d", "inputSchema": {"type": "object"}});
    for (n, (active_client, accepted)) in [
        (
            serde_json::json!({"clientId": "someone-else", "tools": []}),
            false,
        ),
        (serde_json::json!({"clientId": "vic-raw", "tools": [tool]}), false),
        (
            serde_json::json!({"clientId": "vic-raw", "displayName": "Web · alice", "tools": []}),
            true,
        ),
        // Once listed, again: refused (a viewer cannot fill the log with presence).
        (serde_json::json!({"clientId": "vic-raw", "tools": []}), false),
    ]
    .into_iter()
    .enumerate()
    {
        let frames = frames_for_dispatch(
            &mut raw,
            serde_json::json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": {"channel": session,
                "clientSeq": n + 1, "action": {"type": "session/activeClientSet", "activeClient": active_client}}}),
            n as u64 + 1,
            1000 + n as u64,
        )
        .await;
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(
            reason_of(&frames).is_none(),
            accepted,
            "{active_client:?}: {frames:?}"
        );
    }
    let state = session_and_chat_json(&relay, "t", &session, &chat).await;
    let state: serde_json::Value =
        serde_json::from_str(state.lines().next().expect("the session's line")).expect("json");
    let listed: Vec<&str> = state["activeClients"]
        .as_array()
        .expect("active clients")
        .iter()
        .filter_map(|c| c["clientId"].as_str())
        .collect();
    assert!(listed.contains(&"vic-raw"), "the viewer is listed: {listed:?}");
    let named: Vec<&str> = state["activeClients"]
        .as_array()
        .expect("active clients")
        .iter()
        .filter_map(|c| c["displayName"].as_str())
        .collect();
    assert_eq!(named, ["vic (watching)"], "named by the relay, not by itself");
    assert!(!listed.contains(&"someone-else"), "{listed:?}");
    // And it leaves again.
    let frames = frames_for_dispatch(
        &mut raw,
        serde_json::json!({"jsonrpc": "2.0", "method": "dispatchAction", "params": {"channel": session,
            "clientSeq": 19, "action": {"type": "session/activeClientRemoved", "clientId": "vic-raw"}}}),
        19,
        1019,
    )
    .await;
    assert!(reason_of(&frames).is_none(), "{frames:?}");
}

/// Issue 36 (3): truncating a chat removes its turns for every device, so a member removes only their own: a
/// truncation that would drop a teammate's turn is refused (the page forks instead), one of their own turns is
/// accepted, and an admin's is too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_truncates_only_their_own_turns() {
    let relay = Relay::start_with(&["--demo-step-ms", "1"]).await;
    let (alice, _) = relay.client_as("t", "alice", Role::Member, "alice-laptop").await;
    let (bob, _) = relay.client_as("t", "bob", Role::Member, "bob-laptop").await;
    let (admin, _) = relay.client_as("t", "ada", Role::Admin, "ada-laptop").await;
    let (_, chat) = create_session_and_chat(&alice, "shared").await;
    let (_, _, mut alice_sub) = subscribe_chat(&alice, &chat).await;
    alice
        .dispatch(chat.clone(), turn_started("t1", "alice asks"))
        .await
        .expect("prompt");
    collect_until(&mut alice_sub, is_turn_complete).await;
    // Subscribed after Alice's turn ended: the next turn end they see is Bob's.
    let (_, _, mut bob_sub) = subscribe_chat(&bob, &chat).await;
    let (_, _, mut admin_sub) = subscribe_chat(&admin, &chat).await;
    bob.dispatch(chat.clone(), turn_started("t2", "bob asks"))
        .await
        .expect("prompt");
    collect_until(&mut bob_sub, is_turn_complete).await;
    let truncate = |turn: Option<&str>| {
        StateAction::ChatTruncated(ahp_types::actions::ChatTruncatedAction {
            turn_id: turn.map(str::to_string),
        })
    };
    // Alice's truncation after her turn would drop Bob's: refused, to her.
    alice
        .dispatch(chat.clone(), truncate(Some("t1")))
        .await
        .expect("dispatch");
    let echo = collect_until(&mut alice_sub, |e| {
        matches!(e.action, StateAction::ChatTruncated(_))
    })
    .await;
    let reason = echo.last().and_then(|e| e.rejection_reason.clone());
    assert!(reason.as_deref().is_some_and(|r| r.contains("bob")), "{reason:?}");
    assert_eq!(fresh_chat_snapshot_for(&relay, "t", &chat).await.turns.len(), 2);
    // Bob's, dropping only his own turn: accepted.
    bob.dispatch(chat.clone(), truncate(Some("t1")))
        .await
        .expect("dispatch");
    let echo = collect_until(&mut bob_sub, |e| {
        matches!(e.action, StateAction::ChatTruncated(_))
    })
    .await;
    assert!(
        echo.last().is_some_and(|e| e.rejection_reason.is_none()),
        "{echo:?}"
    );
    assert_eq!(fresh_chat_snapshot_for(&relay, "t", &chat).await.turns.len(), 1);
    // An admin's, dropping Alice's: accepted.
    admin
        .dispatch(chat.clone(), truncate(None))
        .await
        .expect("dispatch");
    let echo = collect_until(&mut admin_sub, |e| {
        matches!(e.action, StateAction::ChatTruncated(_))
    })
    .await;
    assert!(
        echo.last().is_some_and(|e| e.rejection_reason.is_none()),
        "{echo:?}"
    );
    assert!(fresh_chat_snapshot_for(&relay, "t", &chat).await.turns.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_disposes_only_its_own_sessions_and_chats_also_after_a_restart() {
    let data = tempfile::tempdir().expect("tempdir");
    let mut relay = Relay::start_in(data.path(), &[]).await;
    let (ana, _) = relay.client_as("t", "ana", Role::Member, "ana-laptop").await;
    let (ana_session, ana_chat) = create_session_and_chat(&ana, "ana-s").await;
    let (kept_session, _) = create_session_and_chat(&ana, "ana-kept").await;
    // Bob adds a chat to Ana's session: his own chat, which he may dispose.
    let (bob, _) = relay.client_as("t", "bob", Role::Member, "bob-laptop").await;
    let bob_chat = "ahp-chat:/bob-in-ana-s".to_string();
    let created: Result<serde_json::Value, _> = bob
        .request(
            "createChat",
            serde_json::json!({"channel": ana_session, "chat": bob_chat}),
        )
        .await;
    assert!(created.is_ok(), "{created:?}");
    ana.shutdown().await;
    bob.shutdown().await;
    // The creators are stored: a crash and restart keeps them.
    relay.kill().await;
    let relay = Relay::start_in(data.path(), &[]).await;
    let (bob, _) = relay.client_as("t", "bob", Role::Member, "bob-laptop").await;
    let refused = |result: Result<serde_json::Value, ClientError>| match result {
        Err(ClientError::Rpc(e)) => e.code,
        other => panic!("expected an error, got {other:?}"),
    };
    assert_eq!(
        refused(
            bob.request("disposeChat", serde_json::json!({"channel": ana_chat}))
                .await
        ),
        -32009,
        "bob disposing ana's chat"
    );
    assert_eq!(
        refused(
            bob.request("disposeSession", serde_json::json!({"channel": ana_session}))
                .await
        ),
        -32009,
        "bob disposing ana's session"
    );
    let own: Result<serde_json::Value, _> = bob
        .request("disposeChat", serde_json::json!({"channel": bob_chat}))
        .await;
    assert!(own.is_ok(), "bob disposes his own chat: {own:?}");
    // Ana disposes her session; an admin disposes any.
    let (ana, _) = relay.client_as("t", "ana", Role::Member, "ana-laptop").await;
    let own: Result<serde_json::Value, _> = ana
        .request("disposeSession", serde_json::json!({"channel": ana_session}))
        .await;
    assert!(own.is_ok(), "ana disposes her session: {own:?}");
    let (admin, _) = relay.client_as("t", "root", Role::Admin, "admin-console").await;
    let any: Result<serde_json::Value, _> = admin
        .request("disposeSession", serde_json::json!({"channel": kept_session}))
        .await;
    assert!(any.is_ok(), "an admin disposes anyone's session: {any:?}");
}

/// Issue 32 (acceptance 4): viewers filling a tenant's connection quota leave the members' share: a member
/// still gets in, another viewer does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_filling_the_connection_quota_do_not_lock_a_member_out() {
    let relay = Relay::start_with(&["--max-connections-per-tenant", "2"]).await;
    let url =
        |sub: &str, role: Role| format!("{}?access_token={}", relay.url(), relay.token("team", sub, role));
    let (_viewer, _) = tokio_tungstenite::connect_async(url("vera", Role::Viewer))
        .await
        .expect("a viewer");
    assert_eq!(
        upgrade_status(url("victor", Role::Viewer), None).await,
        429,
        "a second viewer would leave no room for a member"
    );
    assert_eq!(upgrade_status(url("ana", Role::Member), None).await, 101);
}

/// Issue 32 (acceptance 6 of the findings): bad tokens from one address are throttled after a burst (429
/// without the token being looked at).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_authentications_are_throttled_per_address() {
    let relay = Relay::start().await;
    let url = format!("{}?access_token=not-a-jwt", relay.url());
    let mut statuses = Vec::new();
    for _ in 0..40 {
        statuses.push(upgrade_status(url.clone(), None).await);
    }
    let refused = statuses.iter().filter(|status| **status == 401).count();
    let throttled = statuses.iter().filter(|status| **status == 429).count();
    assert!(refused <= 21 && throttled >= 19, "{statuses:?}");
    assert!(statuses.iter().all(|status| matches!(status, 401 | 429)));
}

/// Issue 32: behind a proxy the operator trusts (`--trusted-proxies`), failures are throttled per client as
/// `X-Forwarded-For` names it, not per proxy: one client's guesses do not lock out every member behind the same
/// proxy; a client's own `X-Forwarded-For` is not believed from an untrusted peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_failures_are_throttled_per_forwarded_client() {
    let status_from = |relay_url: String, forwarded_for: &'static str| async move {
        let mut request = format!("{relay_url}?access_token=not-a-jwt")
            .into_client_request()
            .expect("request");
        request
            .headers_mut()
            .insert("X-Forwarded-For", forwarded_for.parse().expect("header"));
        match tokio_tungstenite::connect_async(request).await {
            Ok(_) => 101,
            Err(WsError::Http(response)) => response.status().as_u16(),
            Err(other) => panic!("unexpected error: {other}"),
        }
    };
    let relay = Relay::start_with(&["--trusted-proxies", "127.0.0.0/8"]).await;
    let mut guesser = Vec::new();
    for _ in 0..40 {
        guesser.push(status_from(relay.url(), "198.51.100.1").await);
    }
    assert!(
        guesser.iter().filter(|status| **status == 429).count() >= 19,
        "the guessing client is throttled: {guesser:?}"
    );
    assert_eq!(
        status_from(relay.url(), "198.51.100.2").await,
        401,
        "another client behind the same proxy is not throttled"
    );
    // Not trusted (the default): the header is the client's own word, and the peer is throttled.
    let relay = Relay::start().await;
    for _ in 0..25 {
        status_from(relay.url(), "198.51.100.1").await;
    }
    assert_eq!(status_from(relay.url(), "198.51.100.2").await, 429);
}
