//! Which client actions the host accepts (digest §4–§6).
//!
//! A client action is accepted only when it is client-dispatchable, targets a channel of the matching kind,
//! comes from a role that may write, and is valid in the current state. Everything refused here is echoed to
//! its dispatcher with the returned reason as `rejectionReason`, and changes nothing.
//!
//! Nothing here changes state or takes the host's lock: every check reads the model it is handed.

mod channels;
mod client_action;
mod dispatcher;
mod fields;
mod terminal;

pub use channels::*;
pub use client_action::*;
pub use dispatcher::*;
pub use fields::*;
pub use terminal::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ChannelKind, HostModel};
    use ahp_types::actions::StateAction;
    use ahp_types::state::MultipleWorkingDirectoriesCapability;
    use relay_core::Role;

    use ahp_types::actions::SessionWorkingDirectorySetAction;
    use ahp_types::state::{AgentCapabilities, AgentInfo, RootState, SessionLifecycle, SessionState};

    fn model_with_agent(capabilities: Option<AgentCapabilities>) -> HostModel {
        let agent = AgentInfo {
            provider: "solo".into(),
            display_name: "Solo".into(),
            description: String::new(),
            models: vec![],
            protected_resources: None,
            customizations: None,
            capabilities,
        };
        let root = RootState {
            agents: vec![agent],
            active_sessions: None,
            terminals: None,
            config: None,
            meta: None,
        };
        let mut model = HostModel::new(root, 1);
        let session: SessionState = serde_json::from_value(serde_json::json!({
            "provider": "solo", "title": "", "status": 1, "lifecycle": "ready",
            "workingDirectories": ["file:///a"], "activeClients": [], "chats": []
        }))
        .expect("session state");
        assert_eq!(session.lifecycle, SessionLifecycle::Ready);
        model.insert_new_session(
            "ahp-session:/s".into(),
            session,
            "2026-01-01T00:00:00.000Z".into(),
        );
        model
    }

    fn add_directory() -> StateAction {
        StateAction::SessionWorkingDirectorySet(SessionWorkingDirectorySetAction {
            directory: "file:///b".into(),
        })
    }

    fn member() -> Dispatcher<'static> {
        Dispatcher {
            client_id: "c",
            role: Role::Member,
            subject: "c",
        }
    }

    #[test]
    fn a_replaceable_primary_is_replaced_never_removed() {
        let model = model_with_agent(Some(AgentCapabilities {
            multiple_working_directories: Some(MultipleWorkingDirectoriesCapability {
                immutable_primary: None,
                primary_replacement: Some(true),
            }),
            ..Default::default()
        }));
        let check = |action: StateAction| {
            check_client_action(&model, ChannelKind::Session, "ahp-session:/s", &action, &member())
        };
        let removed = check(StateAction::SessionWorkingDirectoryRemoved(
            ahp_types::actions::SessionWorkingDirectoryRemovedAction {
                directory: "file:///a".into(),
            },
        ));
        assert!(removed.is_err_and(|reason| reason.contains("never remove it")));
        let replaced = check(StateAction::SessionWorkingDirectoryReplaced(
            ahp_types::actions::SessionWorkingDirectoryReplacedAction {
                directory: "file:///a".into(),
                replacement: "file:///c".into(),
            },
        ));
        assert_eq!(replaced, Ok(()));
    }

    #[test]
    fn a_replacing_config_change_keeps_the_values_that_are_not_session_mutable() {
        let mut model = model_with_agent(None);
        let config: ahp_types::state::SessionConfigState = serde_json::from_value(serde_json::json!({
            "schema": {"type": "object", "properties": {
                "sandbox": {"type": "string", "title": "Sandbox"},
                "effort": {"type": "string", "title": "Effort", "sessionMutable": true}
            }},
            "values": {"sandbox": "strict", "effort": "low"}
        }))
        .expect("config");
        if let Some(session) = model.sessions.get_mut("ahp-session:/s") {
            session.state.config = Some(config);
        }
        let check = |config: serde_json::Value, replace: Option<bool>| {
            let config = serde_json::from_value(config).expect("values");
            let action = StateAction::SessionConfigChanged(ahp_types::actions::SessionConfigChangedAction {
                config,
                replace,
            });
            check_client_action(&model, ChannelKind::Session, "ahp-session:/s", &action, &member())
        };
        // Merging a mutable value, or replacing with the fixed one carried as it is: accepted.
        assert_eq!(check(serde_json::json!({"effort": "high"}), None), Ok(()));
        assert_eq!(
            check(
                serde_json::json!({"effort": "high", "sandbox": "strict"}),
                Some(true)
            ),
            Ok(())
        );
        // Replacing without it would wipe it; changing it is refused either way.
        assert!(check(serde_json::json!({"effort": "high"}), Some(true))
            .is_err_and(|reason| reason.contains("sandbox") && reason.contains("replacing")));
        assert!(check(serde_json::json!({"sandbox": "off"}), None)
            .is_err_and(|reason| reason.contains("sandbox")));
    }

    #[test]
    fn working_directories_change_only_for_agents_that_advertise_it() {
        let who = Dispatcher {
            client_id: "c",
            role: Role::Member,
            subject: "c",
        };
        let check = |model: &HostModel| {
            check_client_action(
                model,
                ChannelKind::Session,
                "ahp-session:/s",
                &add_directory(),
                &who,
            )
        };
        let single = model_with_agent(None);
        assert!(check(&single).is_err_and(|reason| reason.contains("multipleWorkingDirectories")));
        let multiple = model_with_agent(Some(AgentCapabilities {
            multiple_working_directories: Some(MultipleWorkingDirectoriesCapability::default()),
            ..Default::default()
        }));
        assert_eq!(check(&multiple), Ok(()));
    }
}
