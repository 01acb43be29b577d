//! TLS to the identity provider (its JWKS over HTTPS): rustls needs one process-wide crypto provider; this
//! installs ring's before the first TLS connection, unless the process already chose one.

use std::sync::Once;

/// Make sure rustls has a process-wide crypto provider (ring) before a TLS connection is made.
pub(crate) fn ensure_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Fails only if another thread installed one meanwhile, which is just as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}
