//! A session's title: a user's is final. Once a member renames a session (`session/titleChanged` from a
//! client), the host marks it in the session's `_meta` (`ahpRelay/titledByUser`, kept when an agent replaces
//! `_meta`) and drops later titles from the agent (an ACP agent's session-info title) and the host's own
//! naming after the first prompt; a member may still rename it again.

use serde_json::Value;

use crate::host::HostCore;

pub use crate::model::session_meta::TITLED_BY_USER_META;

/// Whether a user chose `session`'s title.
pub(crate) fn titled_by_user(model: &crate::model::HostModel, session: &str) -> bool {
    model
        .sessions
        .get(session)
        .and_then(|record| record.state.meta.as_ref())
        .and_then(|meta| meta.get(TITLED_BY_USER_META))
        .is_some_and(|marked| marked == &Value::Bool(true))
}

impl HostCore {
    /// A client's title was accepted for `session`: mark it as the user's (once).
    pub(crate) fn mark_titled_by_user(&mut self, session: &str) {
        if titled_by_user(&self.model, session) {
            return;
        }
        self.set_session_meta(session, TITLED_BY_USER_META, Value::Bool(true));
    }
}
