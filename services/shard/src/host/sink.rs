//! Where a host's agents write: their actions, terminals and listings, applied to the host they belong to
//! (held weakly, so an agent never keeps an evicted host alive).

use std::sync::Weak;

use ahp_types::actions::StateAction;
use relay_runner::{ChatSink, Emitted};

use crate::host::Host;

/// The [`ChatSink`] agents of a host write to.
pub(crate) struct HostSink {
    pub(crate) host: Weak<Host>,
}

impl ChatSink for HostSink {
    fn emit(&self, channel: &str, action: StateAction) -> Emitted {
        self.host.upgrade().map_or(Emitted::Unreachable, |host| {
            host.emit_agent_action(channel, action)
        })
    }

    fn emit_in(&self, session: &str, channel: &str, action: StateAction) -> Emitted {
        // A host that left this process may be loaded again (or owned elsewhere): nobody hears it, for now.
        self.host.upgrade().map_or(Emitted::Unreachable, |host| {
            host.with_core(|core| {
                if core.model.belongs_to(channel, session) {
                    core.apply_agent_action(channel, action)
                } else {
                    Emitted::Gone
                }
            })
        })
    }

    fn reachable(&self) -> bool {
        self.host.strong_count() > 0
    }

    fn room(&self) -> Option<relay_runner::Room> {
        let host = self.host.upgrade()?;
        Some(Box::pin(async move { host.room().await }))
    }

    fn open_terminal(&self, session: &str, uri: &str, state: ahp_types::state::TerminalState) -> bool {
        self.host
            .upgrade()
            .is_some_and(|host| host.with_core(|core| core.open_terminal(session, uri, state)))
    }

    fn agent_changed(&self, info: ahp_types::state::AgentInfo) {
        let Some(host) = self.host.upgrade() else {
            return;
        };
        host.with_core(|core| {
            let mut agents = core.model.root.agents.clone();
            match agents.iter_mut().find(|agent| agent.provider == info.provider) {
                Some(listed) if *listed == info => return,
                Some(listed) => *listed = info,
                None => return,
            }
            core.apply_server_action(
                ahp_types::ROOT_RESOURCE_URI,
                StateAction::RootAgentsChanged(ahp_types::actions::RootAgentsChangedAction { agents }),
            );
        });
    }
}
