//! The bus over TLS: a `rediss://` URL with a password reaches a Redis that only speaks TLS and requires AUTH.
//! The test runs its own redis-server on a loopback TLS port with a throw-away CA made by `openssl`, and trusts
//! that CA through `SSL_CERT_FILE` (how the relay trusts a private CA too). Skipped when redis-server or openssl
//! is missing (scripts/test installs redis-server).

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use relay_bus::{channel_name, RedisPublisher, RedisSubscriber, SubscriberOptions};

fn found(program: &str) -> bool {
    Command::new(program).arg("-v").output().is_ok() || Command::new(program).arg("version").output().is_ok()
}

/// A CA and a certificate for 127.0.0.1 signed by it, written into `dir`.
fn make_certificates(dir: &Path) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
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
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "redis.key",
        "-out",
        "redis.csr",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("san");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "redis.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "san.ext",
        "-out",
        "redis.crt",
    ]);
}

#[tokio::test]
async fn the_bus_works_over_tls_with_a_password() {
    if !found("redis-server") || !found("openssl") {
        println!("skipped: redis-server or openssl not found");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    make_certificates(dir.path());
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        probe.local_addr().expect("addr").port()
    };
    let path = |name: &str| dir.path().join(name).display().to_string();
    let mut server = tokio::process::Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--tls-port",
            &port.to_string(),
        ])
        .args([
            "--tls-cert-file",
            &path("redis.crt"),
            "--tls-key-file",
            &path("redis.key"),
        ])
        .args(["--tls-ca-cert-file", &path("ca.crt"), "--tls-auth-clients", "no"])
        .args([
            "--requirepass",
            "tls-test-password",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--dir", &dir.path().display().to_string()])
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server");
    // The relay trusts the private CA the way any rustls client with native roots does.
    std::env::set_var("SSL_CERT_FILE", path("ca.crt"));
    let url = format!("rediss://:tls-test-password@127.0.0.1:{port}");

    let publisher = tokio::time::timeout(WAIT, async {
        loop {
            match RedisPublisher::connect(&url).await {
                Ok(publisher) => break publisher,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("a TLS connection to redis-server");
    let log = Arc::new(MemoryLog::default());
    let subscriber =
        RedisSubscriber::connect(&url, log.clone(), SubscriberOptions::default()).expect("subscriber");
    let host = unique_host("tls");
    let mut rx = relay_core::bus::EventReceiver::new(subscriber.follow(&host));
    let mut admin = admin(&url).await;
    wait_subscribed(&mut admin, &channel_name(&host)).await;
    let event = action(1, 0);
    log.commit(&event);
    publisher.publish(&host, &event).await.expect("publish over TLS");
    assert_same(&event, &recv(&mut rx).await);

    // Without TLS, or without the password, the same server refuses.
    let plain = format!("redis://:tls-test-password@127.0.0.1:{port}");
    // (A refusal may also show as the connection manager retrying until the bound.)
    let refusal_bound = Duration::from_secs(3);
    let refused = tokio::time::timeout(refusal_bound, RedisPublisher::connect(&plain)).await;
    assert!(
        !matches!(refused, Ok(Ok(_))),
        "a plain connection to the TLS port must fail"
    );
    let wrong = format!("rediss://:wrong@127.0.0.1:{port}");
    let refused = tokio::time::timeout(refusal_bound, RedisPublisher::connect(&wrong)).await;
    assert!(!matches!(refused, Ok(Ok(_))), "a wrong password must be refused");
    let _ = server.kill().await;
}
