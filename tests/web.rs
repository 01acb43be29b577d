//! What a browser and VS Code need from the relay, over real sockets: the embedded web client with its security
//! headers, `?tkn=` (VS Code's connection token), VS Code's version list, and the `Origin` rules of the
//! WebSocket endpoint.

mod support;

use relay_core::Role;
use serde_json::json;
use support::raw::{recv, send, Socket};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Error as WsError;

/// A raw HTTP/1.0 response: status, lower-cased headers, body bytes.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn get(addr: &str, path: &str, extra_headers: &str) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n{extra_headers}\r\n").as_bytes())
        .await
        .expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of headers");
    let head = String::from_utf8(raw[..split].to_vec()).expect("utf-8 head");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Reply {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

async fn raw_socket(url: &str) -> Socket {
    let (socket, _) = tokio_tungstenite::connect_async(url).await.expect("connect");
    socket
}

async fn upgrade(url: String, origin: Option<&str>) -> u16 {
    let mut request = url.into_client_request().expect("request");
    if let Some(origin) = origin {
        request
            .headers_mut()
            .insert("Origin", origin.parse().expect("origin"));
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok(_) => 101,
        Err(WsError::Http(response)) => response.status().as_u16(),
        Err(other) => panic!("unexpected error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_client_is_served_with_security_headers() {
    let relay = Relay::start().await;
    let page = get(&relay.addr, "/", "").await;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = page.header("content-security-policy").expect("a CSP");
    assert!(csp.contains("script-src 'self' 'wasm-unsafe-eval'"), "{csp}");
    // No inline script (styles may be inline: the terminal emulator writes its own style elements).
    let directive = |name: &str| {
        csp.split(';')
            .map(str::trim)
            .find(|directive| directive.starts_with(name))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        !directive("script-src").contains("unsafe-inline"),
        "no inline script: {csp}"
    );
    assert!(!directive("default-src").contains("unsafe-inline"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(page.header("referrer-policy"), Some("no-referrer"));
    let html = String::from_utf8(page.body).expect("utf-8 page");
    assert!(html.contains(r#"<script type="module" src="/assets/app.js"></script>"#));
    let handlers = html
        .split(|c: char| c.is_whitespace() || c == '<')
        .filter(|word| word.starts_with("on") && word.contains('='))
        .count();
    assert!(
        !html.contains("<script>") && handlers == 0,
        "the page has no inline script or handlers"
    );

    for (asset, content_type) in [
        ("app.js", "text/javascript; charset=utf-8"),
        ("reducers.js", "text/javascript; charset=utf-8"),
        ("app.css", "text/css; charset=utf-8"),
    ] {
        let reply = get(&relay.addr, &format!("/assets/{asset}"), "").await;
        assert_eq!(reply.status, 200, "{asset}");
        assert_eq!(reply.header("content-type"), Some(content_type), "{asset}");
        assert!(reply.header("content-security-policy").is_some(), "{asset}");
    }
    let wasm = get(
        &relay.addr,
        "/assets/reducers_bg.wasm",
        "Accept-Encoding: gzip, br\r\n",
    )
    .await;
    assert_eq!(wasm.status, 200);
    assert_eq!(wasm.header("content-type"), Some("application/wasm"));
    assert_eq!(wasm.header("content-encoding"), Some("gzip"));
    assert_eq!(&wasm.body[..2], &[0x1f, 0x8b]);
    assert_eq!(
        get(&relay.addr, "/assets/reducers_bg.wasm", "").await.status,
        406,
        "the wasm is only served gzip-encoded"
    );
    assert_eq!(get(&relay.addr, "/assets/../Cargo.toml", "").await.status, 404);
    assert_eq!(get(&relay.addr, "/assets/secret.txt", "").await.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_prints_a_link_with_the_token_in_the_fragment() {
    let data = tempfile::tempdir().expect("tempdir");
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
    command
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(data.path())
        .env("AHP_RELAY_JWT_SECRET", SECRET);
    let (mut child, lines) = spawn_until_all(command, &["open the web client: "]).await;
    let link = lines[0].as_str();
    let (base, token) = link.split_once("/#token=").expect("token in the fragment");
    assert!(
        base.starts_with("http://127.0.0.1:"),
        "a link a browser can open: {link}"
    );
    let addr = base.trim_start_matches("http://");
    assert_eq!(
        upgrade(format!("ws://{addr}/v1/ws?access_token={token}"), None).await,
        101
    );
    terminate(&mut child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_dev_token_serve_prints_no_token() {
    use tokio::io::AsyncBufReadExt;
    let data = tempfile::tempdir().expect("tempdir");
    // As the container image runs it: the setting comes from its environment.
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ahp-relay"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path())
        .env("AHP_RELAY_NO_DEV_TOKEN", "true")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let printed = tokio::time::timeout(PATIENCE, async {
        let mut printed = Vec::new();
        while let Some(line) = lines.next_line().await.expect("read") {
            // The last line serve prints at start, with a token or without.
            let done = line.contains("no token printed") || line.contains("try it:");
            printed.push(line);
            if done {
                return printed;
            }
        }
        panic!("serve exited: {printed:?}");
    })
    .await
    .expect("serve started");
    assert!(
        printed.iter().any(|line| line.contains("listening on ws://")),
        "{printed:?}"
    );
    for line in &printed {
        assert!(
            !line.contains("eyJ") && !line.contains("#token="),
            "a token was printed: {line}"
        );
    }
    terminate(&mut child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vs_code_connects_with_tkn_and_its_version_list() {
    let relay = Relay::start().await;
    let url = relay.url();
    let token = relay.token("dev", "ana", Role::Member);
    assert_eq!(upgrade(format!("{url}?tkn={token}"), None).await, 101);
    assert_eq!(upgrade(format!("{url}?tkn=not-a-jwt"), None).await, 401);
    // VS Code's renderer sends its own origin; it is allowed by default.
    assert_eq!(
        upgrade(format!("{url}?tkn={token}"), Some("vscode-file://vscode-app")).await,
        101
    );

    // A client given only host:port connects at `/`, to the default host.
    let root = format!("ws://{}/", relay.addr);
    assert_eq!(upgrade(format!("{root}?tkn={token}"), None).await, 101);
    assert_eq!(upgrade(format!("{root}?tkn=not-a-jwt"), None).await, 401);
    assert_eq!(
        upgrade(format!("{root}?tkn={token}"), Some("https://evil.example")).await,
        403
    );

    // The whole handshake as VS Code does it: no headers, `tkn`, three versions offered.
    let mut socket = raw_socket(&format!("{root}?tkn={token}")).await;
    send(
        &mut socket,
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
            "channel":"ahp-root://","protocolVersions":["1.0.0","0.10.0","0.9.0"],"clientId":"vscode-1",
            "initialSubscriptions":["ahp-root://"]}})
        .to_string(),
    )
    .await;
    let reply = recv(&mut socket).await;
    assert_eq!(reply["result"]["protocolVersion"], "1.0.0", "{reply}");

    // Only versions the relay does not speak: the documented error, naming what it supports.
    let mut socket = raw_socket(&format!("{url}?tkn={token}")).await;
    send(
        &mut socket,
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
            "channel":"ahp-root://","protocolVersions":["0.10.0","0.9.0"],"clientId":"vscode-2"}})
        .to_string(),
    )
    .await;
    let reply = recv(&mut socket).await;
    assert_eq!(reply["error"]["code"], -32005, "{reply}");
    assert_eq!(reply["error"]["data"]["supportedVersions"], json!(["1.0.0"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_origins_are_checked_against_the_allow_list() {
    let relay = Relay::start().await;
    let url = relay.url();
    let token = relay.token("dev", "ana", Role::Member);
    let with_token = format!("{url}?access_token={token}");
    let own = format!("http://{}", relay.addr);
    assert_eq!(
        upgrade(with_token.clone(), None).await,
        101,
        "no Origin: not a browser"
    );
    assert_eq!(
        upgrade(with_token.clone(), Some(&own)).await,
        101,
        "the relay's own page"
    );
    assert_eq!(
        upgrade(with_token.clone(), Some("https://evil.example")).await,
        403
    );
    assert_eq!(
        upgrade(with_token.clone(), Some(&format!("{own}.evil.example"))).await,
        403
    );
    assert_eq!(upgrade(with_token.clone(), Some("null")).await, 403);
    // The refusal comes before the token is looked at: a foreign page learns nothing about tokens.
    assert_eq!(upgrade(url.clone(), Some("https://evil.example")).await, 403);

    let configured = Relay::start_with(&["--allowed-origins", "https://team.example"]).await;
    let url = configured.url();
    let token = configured.token("dev", "ana", Role::Member);
    let with_token = format!("{url}?access_token={token}");
    assert_eq!(
        upgrade(with_token.clone(), Some("https://team.example")).await,
        101
    );
    assert_eq!(
        upgrade(with_token.clone(), Some(&format!("http://{}", configured.addr))).await,
        101,
        "the relay's own page is always allowed"
    );
    assert_eq!(
        upgrade(with_token.clone(), Some("vscode-file://vscode-app")).await,
        403,
        "the list replaces the default"
    );
}
