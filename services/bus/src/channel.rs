//! The Redis channel name of a host: `ahp:{tenant}:{host}`, with both parts escaped so that distinct
//! (tenant, host) pairs never share a channel (tenant isolation, invariant 7).

use relay_core::HostKey;

/// The Redis pub/sub channel that carries `host`'s bus events.
///
/// `%` and `:` are percent-encoded in the tenant and the host, so neither part contains the separator and the
/// mapping is injective.
pub fn channel_name(host: &HostKey) -> String {
    let mut out = String::with_capacity(5 + host.tenant.len() + host.host.len());
    out.push_str("ahp:");
    escape_into(&host.tenant, &mut out);
    out.push(':');
    escape_into(&host.host, &mut out);
    out
}

fn escape_into(part: &str, out: &mut String) {
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names() {
        assert_eq!(channel_name(&HostKey::new("acme", "default")), "ahp:acme:default");
    }

    #[test]
    fn separators_cannot_collide() {
        let a = channel_name(&HostKey::new("a:b", "c"));
        let b = channel_name(&HostKey::new("a", "b:c"));
        assert_ne!(a, b);
        assert_eq!(a, "ahp:a%3Ab:c");
        assert_eq!(b, "ahp:a:b%3Ac");
    }

    #[test]
    fn escapes_cannot_collide() {
        // A literal "%3A" must not look like an escaped ':'.
        let a = channel_name(&HostKey::new("a%3Ab", "c"));
        let b = channel_name(&HostKey::new("a:b", "c"));
        assert_ne!(a, b);
    }

    #[test]
    fn injective_on_small_alphabet() {
        let alphabet = ["", "a", ":", "%", "%3A", "a:", ":a", "%25", "3A"];
        let mut seen = std::collections::HashMap::new();
        for t in alphabet {
            for h in alphabet {
                for t2 in alphabet {
                    let tenant = format!("{t}{t2}");
                    let key = HostKey::new(tenant.clone(), h);
                    if let Some(prev) = seen.insert(channel_name(&key), key.clone()) {
                        assert_eq!(prev, key, "two hosts share a channel");
                    }
                }
            }
        }
    }
}
