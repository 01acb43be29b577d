//! The keys of a session's `_meta` the host owns: what it writes there for clients to read, and keeps when an
//! agent replaces the session's `_meta` (a `session/metaChanged` replaces the whole object).

use ahp_types::actions::SessionMetaChangedAction;

use crate::model::changeset_uris::CHECKPOINTS_META;
use crate::model::HostModel;

/// A user chose the session's title (`true`): the agent's titles are dropped (`commands/titles.rs`).
pub const TITLED_BY_USER_META: &str = "ahpRelay/titledByUser";
/// The terminals devices opened in the session (client-claimed `ahp-terminal:` URIs, in URI order): a
/// terminal's own state says where it runs, not for which session.
pub const SESSION_TERMINALS_META: &str = "ahpRelay/terminals";

/// Every key above, and the checkpoints of the session's turns.
pub const HOST_SESSION_META_KEYS: [&str; 3] = [CHECKPOINTS_META, TITLED_BY_USER_META, SESSION_TERMINALS_META];

/// Carry the host's keys of `session`'s `_meta` into `changed`, a `session/metaChanged` from its agent.
pub fn keep_host_keys(model: &HostModel, session: &str, changed: &mut SessionMetaChangedAction) {
    let Some(current) = model
        .sessions
        .get(session)
        .and_then(|record| record.state.meta.as_ref())
    else {
        return;
    };
    for key in HOST_SESSION_META_KEYS {
        if let Some(value) = current.get(key) {
            changed
                .meta
                .get_or_insert_with(Default::default)
                .insert(key.into(), value.clone());
        }
    }
}
