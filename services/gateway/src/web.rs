//! The web client, embedded in the binary and served at `/` (page) and `/assets/…` (script, styles, the
//! WebAssembly reducers), with the security headers a page holding an access token needs: a CSP without inline
//! script (`'wasm-unsafe-eval'` only lets the page compile its own WebAssembly), no framing, no referrer, no
//! MIME sniffing. The files are built by `scripts/build-web` into `services/gateway/web/` and committed, so a
//! Rust-only build ships them.

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    /// The body is gzip-compressed (served with `Content-Encoding: gzip`).
    gzip: bool,
}

const INDEX: &[u8] = include_bytes!("../web/index.html");

const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../web/app.js"),
        gzip: false,
    },
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../web/app.css"),
        gzip: false,
    },
    Asset {
        name: "reducers.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../web/reducers.js"),
        gzip: false,
    },
    Asset {
        name: "reducers_bg.wasm",
        content_type: "application/wasm",
        body: include_bytes!("../web/reducers_bg.wasm.gz"),
        gzip: true,
    },
];

/// The page's Content-Security-Policy: its own scripts and WebSocket only. Styles: its own sheet, and the style
/// elements its terminal emulator (xterm.js) writes for its rows and cursor — `'unsafe-inline'` for styles only;
/// no script runs but the page's own, and the page never turns text into markup.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// Headers on every response of the web client.
fn security_headers() -> [(HeaderName, HeaderValue); 5] {
    [
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        (
            HeaderName::from_static("cross-origin-opener-policy"),
            HeaderValue::from_static("same-origin"),
        ),
    ]
}

/// `GET /`: the page.
pub async fn index() -> Response {
    (
        security_headers(),
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX,
    )
        .into_response()
}

/// `GET /assets/{name}`: a script, style sheet or the WebAssembly reducers.
pub async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    let Some(asset) = ASSETS.iter().find(|asset| asset.name == name) else {
        return (StatusCode::NOT_FOUND, security_headers(), "no such asset").into_response();
    };
    if asset.gzip && !accepts_gzip(&headers) {
        // Every browser accepts gzip; the uncompressed file is not embedded.
        return (
            StatusCode::NOT_ACCEPTABLE,
            security_headers(),
            "this asset is only served gzip-encoded",
        )
            .into_response();
    }
    let mut response = (
        security_headers(),
        [
            (header::CONTENT_TYPE, asset.content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        asset.body,
    )
        .into_response();
    if asset.gzip {
        response
            .headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    response
}

fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT_ENCODING, value.parse().expect("header"));
        headers
    }

    #[test]
    fn gzip_is_accepted_only_when_offered_and_not_refused() {
        assert!(accepts_gzip(&with("gzip, deflate, br")));
        assert!(accepts_gzip(&with("br;q=1.0, GZIP;q=0.5")));
        assert!(accepts_gzip(&with("*")));
        assert!(!accepts_gzip(&with("gzip;q=0, br")));
        assert!(!accepts_gzip(&with("br")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn every_embedded_asset_is_non_empty_and_the_wasm_is_gzip() {
        for asset in ASSETS {
            assert!(!asset.body.is_empty(), "{} is empty", asset.name);
        }
        let wasm = ASSETS
            .iter()
            .find(|a| a.name == "reducers_bg.wasm")
            .expect("wasm");
        assert_eq!(
            &wasm.body[..2],
            &[0x1f, 0x8b],
            "the wasm is stored gzip-compressed"
        );
    }
}
