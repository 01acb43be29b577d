//! The authoritative state of one host: root state, sessions, chats, agents' terminals and the session
//! catalogue.
//!
//! Nothing here takes the host's lock: these are the values the lock guards (only [`archive`] reads archived
//! turns back from the store).
//!
//! State changes only through the `ahp` reducers ([`HostModel::reduce`]); this module owns lookups by URI,
//! the newest-first catalogue behind `listSessions`, and the projections (summaries, snapshots) clients read.

pub mod agent_context;
pub mod archive;
pub mod authors;
mod budget;
pub mod changeset_uris;
mod documents;
mod host_model;
mod projections;
mod records;
pub mod session_meta;

pub use budget::*;
pub use documents::*;
pub use host_model::*;
pub use projections::*;
pub use records::*;

#[cfg(test)]
mod tests {
    use super::*;
    use ahp_types::state::*;

    fn session(status: u32, default_chat: Option<&str>, chats: &[(&str, u32, &str)]) -> SessionState {
        let chats: Vec<serde_json::Value> = chats
            .iter()
            .map(|(uri, status, modified)| {
                serde_json::json!({"resource": uri, "title": "", "status": status, "modifiedAt": modified,
                    "activity": format!("{uri} activity")})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "provider": "demo", "title": "", "status": status, "lifecycle": "ready",
            "activeClients": [], "chats": chats, "defaultChat": default_chat
        }))
        .expect("session state")
    }

    const IDLE: u32 = SessionStatus::Idle.bits();
    const BUSY: u32 = SessionStatus::InProgress.bits();
    const INPUT: u32 = SessionStatus::InputNeeded.bits();
    const ERROR: u32 = SessionStatus::Error.bits();
    const READ: u32 = SessionStatus::IsRead.bits();

    #[test]
    fn the_default_chat_leads_and_input_and_errors_are_promoted() {
        // The default chat's activity, the session's own flags.
        let s = session(IDLE | READ, Some("b"), &[("a", BUSY, "2"), ("b", IDLE, "1")]);
        assert_eq!(aggregate_status(&s), (IDLE | READ, Some("b activity".into())));
        // Without a default chat, the most recently modified one.
        let s = session(IDLE, None, &[("a", BUSY, "2"), ("b", IDLE, "1")]);
        assert_eq!(aggregate_status(&s).0, BUSY);
        // Any chat needing input promotes InputNeeded, with that chat's activity.
        let s = session(IDLE, Some("b"), &[("a", INPUT, "1"), ("b", IDLE, "2")]);
        assert_eq!(aggregate_status(&s), (INPUT, Some("a activity".into())));
        // Any chat in error promotes Error, which overrides the lead chat's bits (they are one state).
        let s = session(IDLE, Some("b"), &[("a", ERROR, "1"), ("b", BUSY, "2")]);
        assert_eq!(aggregate_status(&s).0, ERROR);
        // So does a chat needing input, and Error wins over it.
        let s = session(IDLE, Some("b"), &[("a", INPUT, "1"), ("b", BUSY, "2")]);
        assert_eq!(aggregate_status(&s).0, INPUT);
        let s = session(
            IDLE,
            Some("b"),
            &[("a", INPUT, "1"), ("c", ERROR, "1"), ("b", BUSY, "2")],
        );
        assert_eq!(aggregate_status(&s).0, ERROR);
        // No chats: the session's own status.
        let s = session(INPUT, None, &[]);
        assert_eq!(aggregate_status(&s).0, INPUT);
        // The activity text is the driving chat's, never the lead chat's beside a promoted status.
        let mut s = session(IDLE, Some("b"), &[("a", ERROR, "1"), ("b", BUSY, "2")]);
        s.chats[0].activity = None;
        assert_eq!(aggregate_status(&s), (ERROR, None));
    }

    #[test]
    fn a_channel_belongs_to_its_session_only() {
        let root: RootState = serde_json::from_value(serde_json::json!({"agents": []})).expect("root");
        let mut model = HostModel::new(root, 1);
        for uri in ["ahp-session:/a", "ahp-session:/b"] {
            model.insert_new_session(uri.into(), session(IDLE, None, &[]), "now".into());
        }
        let chat: ChatState = serde_json::from_value(serde_json::json!({
            "resource": "ahp-chat:/a", "title": "", "status": IDLE, "turns": [], "modifiedAt": "now"
        }))
        .unwrap_or_else(|error| panic!("chat state: {error}"));
        model.chats.insert(
            "ahp-chat:/a".into(),
            ChatRecord {
                session: "ahp-session:/a".into(),
                state: chat,
                running: None,
                clock: SnapshotClock::fresh(),
                archived: 0,
                created_by: None,
                agent_context: Default::default(),
                turn_sizes: Default::default(),
            },
        );
        assert!(model.belongs_to("ahp-session:/a", "ahp-session:/a"));
        assert!(model.belongs_to("ahp-chat:/a", "ahp-session:/a"));
        assert!(!model.belongs_to("ahp-chat:/a", "ahp-session:/b"));
        assert!(!model.belongs_to("ahp-session:/b", "ahp-session:/a"));
        assert!(!model.belongs_to("ahp-session:/gone", "ahp-session:/gone"));
    }
}
