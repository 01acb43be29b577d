//! Tokens are checked at the upgrade, and a tenant can neither see nor touch another tenant's sessions.

mod support;

use std::time::Duration;

use ahp::ClientError;
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
