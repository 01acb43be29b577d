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

/// Make the host's keys of `changed`, a `session/metaChanged` from `session`'s agent, what the host holds: an
/// agent neither drops them nor writes them.
pub fn keep_host_keys(model: &HostModel, session: &str, changed: &mut SessionMetaChangedAction) {
    let current = model
        .sessions
        .get(session)
        .and_then(|record| record.state.meta.as_ref());
    for key in HOST_SESSION_META_KEYS {
        if let Some(meta) = changed.meta.as_mut() {
            meta.remove(key);
        }
        if let Some(value) = current.and_then(|meta| meta.get(key)) {
            changed
                .meta
                .get_or_insert_with(Default::default)
                .insert(key.into(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ahp_types::state::{RootState, SessionState};
    use serde_json::json;

    #[test]
    fn an_agents_meta_neither_drops_nor_writes_the_hosts_keys() {
        let mut model = HostModel::new(
            serde_json::from_value::<RootState>(json!({"agents": []})).expect("root"),
            1,
        );
        let state: SessionState = serde_json::from_value(json!({
            "provider": "demo", "title": "", "status": 1, "lifecycle": "ready", "activeClients": [], "chats": [],
            "_meta": {"ahpRelay/terminals": ["ahp-terminal:/mine"], "ahpRelay/titledByUser": true, "agent": 1}
        }))
        .expect("session");
        model.insert_session("ahp-session:/s".into(), state, "now".into(), 1);
        // The agent replaces its `_meta`, forging a terminal list and a checkpoint of its own.
        let mut changed: SessionMetaChangedAction = serde_json::from_value(json!({
            "_meta": {"agent": 2, "ahpRelay/terminals": ["ahp-terminal:/forged"], "ahpRelay/checkpoints": {"forged": 1}}
        }))
        .expect("action");
        keep_host_keys(&model, "ahp-session:/s", &mut changed);
        assert_eq!(
            serde_json::Value::Object(changed.meta.expect("meta")),
            json!({"agent": 2, "ahpRelay/terminals": ["ahp-terminal:/mine"], "ahpRelay/titledByUser": true})
        );
    }
}
