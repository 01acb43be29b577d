//! Which AHP protocol version a connection speaks, from the versions its client offers.

use ahp_types::{negotiate_protocol_version, PROTOCOL_VERSION};

/// The protocol version to speak, from the versions a client offers: this relay speaks AHP 1.0.0 (and so any
/// 1.x a client offers, which SemVer makes compatible with it). 0.x versions differ on the wire and are never
/// chosen, though the `ahp-types` crate would negotiate 0.9.0.
pub(crate) fn negotiate(offered: &[String]) -> Result<Option<String>, String> {
    let ours = PROTOCOL_VERSION.split('.').next().unwrap_or("1");
    let same_major: Vec<String> = offered
        .iter()
        .filter(|version| version.split('.').next() == Some(ours))
        .cloned()
        .collect();
    // Invalid offers are still reported as such.
    negotiate_protocol_version(offered)?;
    Ok(negotiate_protocol_version(&same_major)?.map(str::to_string))
}
