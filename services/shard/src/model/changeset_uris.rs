//! The URIs of changesets (`ahp-changeset:/<session>/turn/<turn id>`, `…/all`) and of the files their checkpoints
//! hold (`ahp-checkpoint:/<commit>/<path>`), and the `_meta` keys a session keeps them under.

use super::records::ChangesetScope;

/// The URI scheme of changeset channels.
pub const CHANGESET_SCHEME: &str = "ahp-changeset:";
/// The URI scheme of a file as a checkpoint holds it (`ahp-checkpoint:/<blob id>/<path in the working directory>`).
pub const CHECKPOINT_SCHEME: &str = "ahp-checkpoint:";
/// Where a session keeps its checkpoints.
pub const CHECKPOINTS_META: &str = "ahpRelay/checkpoints";
/// Turns whose checkpoints a session keeps.
pub const MAX_TURNS_KEPT: usize = 200;
/// The `_meta` key of a commit operation's message.
pub const COMMIT_MESSAGE_META: &str = "ahpRelay/commitMessage";

pub(crate) fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

pub(crate) fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = std::str::from_utf8(bytes.get(at + 1..at + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A path's segments encoded for a URI (its slashes kept).
pub(crate) fn encode_path(path: &str) -> String {
    path.split('/').map(encode).collect::<Vec<_>>().join("/")
}

/// The session and scope a changeset URI names.
pub fn parse_uri(uri: &str) -> Option<(String, ChangesetScope)> {
    let rest = uri.strip_prefix(CHANGESET_SCHEME)?.strip_prefix('/')?;
    let (session, scope) = rest.split_once('/')?;
    let session = decode(session)?;
    let scope = match scope.split_once('/') {
        None if scope == "all" => ChangesetScope::All,
        Some(("turn", turn)) if !turn.is_empty() => ChangesetScope::Turn {
            turn_id: decode(turn)?,
        },
        _ => return None,
    };
    Some((session, scope))
}

/// The URI of a changeset of `session`.
pub fn uri_of(session: &str, scope: &ChangesetScope) -> String {
    match scope {
        ChangesetScope::All => format!("{CHANGESET_SCHEME}/{}/all", encode(session)),
        ChangesetScope::Turn { turn_id } => {
            format!("{CHANGESET_SCHEME}/{}/turn/{}", encode(session), encode(turn_id))
        }
    }
}

/// The commit and path an `ahp-checkpoint:` URI names.
pub fn parse_checkpoint_uri(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix(CHECKPOINT_SCHEME)?.strip_prefix('/')?;
    let (commit, path) = rest.split_once('/')?;
    let path = path
        .split('/')
        .map(decode)
        .collect::<Option<Vec<String>>>()?
        .join("/");
    Some((commit.to_string(), path))
}
