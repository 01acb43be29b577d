//! Which web pages may open a WebSocket to the relay. A browser sends the page's `Origin` with every WebSocket
//! upgrade (and lets scripts set no headers), so a page on another site could otherwise use a token it got hold
//! of from inside a user's browser. Allowed: requests without `Origin` (non-browser clients: they present
//! their token explicitly), the relay's own origin (the `Host` the request was sent to), and the configured
//! allow-list (`--allowed-origins`; VS Code's `vscode-file://vscode-app` by default; `*` allows any).

use axum::http::{header, HeaderMap};

/// The configured allow-list of origins, compared case-insensitively and without a trailing `/`.
#[derive(Clone, Debug, Default)]
pub struct AllowedOrigins {
    origins: Vec<String>,
    any: bool,
}

impl AllowedOrigins {
    pub fn new<I: IntoIterator<Item = S>, S: AsRef<str>>(origins: I) -> Self {
        let mut list = Self::default();
        for origin in origins {
            let origin = normalize(origin.as_ref());
            if origin == "*" {
                list.any = true;
            } else if !origin.is_empty() {
                list.origins.push(origin);
            }
        }
        list
    }

    /// Whether a WebSocket upgrade with these headers may proceed.
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return true;
        };
        let Ok(origin) = origin.to_str() else {
            return false;
        };
        let origin = normalize(origin);
        if self.any || self.origins.contains(&origin) {
            return true;
        }
        // The relay's own page: same host and port as the request, over http(s).
        let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
            return false;
        };
        let host = host.to_ascii_lowercase();
        origin == format!("http://{host}") || origin == format!("https://{host}")
    }
}

fn normalize(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(origin: Option<&str>, host: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, host.parse().expect("host"));
        if let Some(origin) = origin {
            headers.insert(header::ORIGIN, origin.parse().expect("origin"));
        }
        headers
    }

    #[test]
    fn own_origin_listed_origins_and_no_origin_are_admitted() {
        let allowed = AllowedOrigins::new(["vscode-file://vscode-app", "https://Team.Example/"]);
        assert!(allowed.admits(&headers(None, "127.0.0.1:7878")));
        assert!(allowed.admits(&headers(Some("http://127.0.0.1:7878"), "127.0.0.1:7878")));
        assert!(allowed.admits(&headers(Some("https://relay.example"), "relay.example")));
        assert!(allowed.admits(&headers(Some("vscode-file://vscode-app"), "relay.example")));
        assert!(allowed.admits(&headers(Some("https://team.example"), "relay.example")));
    }

    #[test]
    fn other_origins_are_refused() {
        let allowed = AllowedOrigins::new(["vscode-file://vscode-app"]);
        assert!(!allowed.admits(&headers(Some("https://evil.example"), "127.0.0.1:7878")));
        assert!(!allowed.admits(&headers(Some("http://127.0.0.1:7879"), "127.0.0.1:7878")));
        assert!(!allowed.admits(&headers(Some("null"), "127.0.0.1:7878")));
        assert!(!allowed.admits(&headers(
            Some("http://127.0.0.1:7878.evil.example"),
            "127.0.0.1:7878"
        )));
    }

    #[test]
    fn a_star_admits_every_origin() {
        let allowed = AllowedOrigins::new(["*"]);
        assert!(allowed.admits(&headers(Some("https://evil.example"), "127.0.0.1:7878")));
    }
}
