//! What an `initialize` or `reconnect` must pass before anything is read from the store for it — the
//! connection not initialized yet, a protocol version this relay speaks, a valid clientId that is free or the
//! caller's own — and unloading the sessions a refused one loaded. A client that fails these costs the host
//! no store reads and no memory, however many channels it names.

use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::ConnectionId;
use relay_store::StoreError;

use crate::host::{ClientBinding, Host, HostCore, MAX_CLIENT_ID_BYTES};

/// The verdict on an opening message before any session is loaded for it.
pub(crate) enum Admission {
    /// It may succeed: load what it names.
    Load,
    /// It will fail in the command itself (which says why): load nothing.
    LoadNothing,
    /// Refused here (the clientId is another user's).
    Refuse(RpcError),
}

impl Host {
    /// Check an `initialize` or `reconnect` before loading anything for it. The stored owner of its clientId
    /// is read (one row) and, when it is the caller, kept in memory for the command.
    pub(crate) async fn admit_opening(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> Result<Admission, StoreError> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Opening {
            client_id: Option<String>,
            protocol_versions: Option<Vec<String>>,
        }
        let Some(opening) = message
            .params
            .as_ref()
            .and_then(|params| serde_json::from_str::<Opening>(params.get()).ok())
        else {
            return Ok(Admission::LoadNothing);
        };
        let Some(client_id) = opening
            .client_id
            .filter(|id| !id.is_empty() && id.len() <= MAX_CLIENT_ID_BYTES)
        else {
            return Ok(Admission::LoadNothing);
        };
        if message.method == "initialize"
            && !opening
                .protocol_versions
                .as_deref()
                .is_some_and(|offered| matches!(crate::versions::negotiate(offered), Ok(Some(_))))
        {
            return Ok(Admission::LoadNothing);
        }
        let subject = {
            let core = self.core.lock();
            let Ok(state) = core.connection(connection) else {
                return Ok(Admission::LoadNothing);
            };
            if state.client_id.is_some() {
                return Ok(Admission::LoadNothing);
            }
            let subject = state.identity.subject.clone();
            if let Some(binding) = core.clients.get(&client_id) {
                return Ok(if binding.subject == subject {
                    Admission::Load
                } else {
                    Admission::Refuse(another_users())
                });
            }
            subject
        };
        match self
            .store
            .client_binding(&self.key.tenant, &self.key.host, &client_id)
            .await?
        {
            Some(owner) if owner != subject => Ok(Admission::Refuse(another_users())),
            Some(owner) => {
                // The caller's own binding (it survives restarts; dropped from memory after its grace). Its
                // grace starts now: an opening that then fails never binds it, and it leaves memory then.
                self.with_core(|core| {
                    if !core.clients.contains_key(&client_id) {
                        core.clients.insert(
                            client_id.clone(),
                            ClientBinding {
                                subject: owner,
                                live_connections: 0,
                                grace_epoch: 0,
                                turn_windows: Default::default(),
                            },
                        );
                        core.pending_grace.push((client_id, 0));
                    }
                });
                Ok(Admission::Load)
            }
            None => Ok(Admission::Load),
        }
    }
}

fn another_users() -> RpcError {
    RpcError::permission_denied("this clientId belongs to another user")
}

impl HostCore {
    /// Drop from memory the `sessions` (loaded for a command that then failed) that nothing uses: no
    /// connection subscribes to them or their chats and terminals, and no turn runs in them.
    pub(crate) fn unload_unused(&mut self, sessions: &[String]) {
        for session in sessions {
            if self.session_in_use(session) {
                continue;
            }
            let barrier = self.seq.barrier();
            let children = self.model.remove_session(session);
            // Writes loading queued (an interrupted turn closed) may not be in the store yet: a reload waits.
            if self.seq.has_pending() {
                for channel in std::iter::once(session.clone()).chain(children) {
                    self.disposing.insert(channel, barrier);
                }
            }
        }
    }

    /// Whether a connection subscribes to `session` or one of its chats or terminals, a turn or a terminal
    /// runs in it (a phone that started a build and locked its screen), or its agent is still starting it (a
    /// reload would fail it).
    pub(crate) fn session_in_use(&self, session: &str) -> bool {
        if self
            .model
            .terminals
            .values()
            .any(|terminal| terminal.session == session && terminal.runs_here())
        {
            return true;
        }
        let starting = self
            .model
            .sessions
            .get(session)
            .is_some_and(|record| record.state.lifecycle == ahp_types::state::SessionLifecycle::Creating);
        if starting {
            return true;
        }
        let running = self
            .model
            .chats
            .values()
            .any(|chat| chat.session == session && chat.running.is_some());
        running
            || self.connections.values().any(|state| {
                state
                    .subscriptions
                    .iter()
                    .any(|channel| self.model.belongs_to(channel, session))
            })
    }
}

impl HostCore {
    /// One idle sweep of a live host: the sessions nothing has used since the previous sweep leave memory (the
    /// next message naming one reads it back). Returns how many left.
    pub(crate) fn evict_unused_sessions(&mut self) -> usize {
        let unused: std::collections::HashSet<String> = self
            .model
            .sessions
            .keys()
            .filter(|session| !self.disposing.contains_key(*session) && !self.session_in_use(session))
            .cloned()
            .collect();
        let evicted: Vec<String> = unused.intersection(&self.unused_sessions).cloned().collect();
        self.unload_unused(&evicted);
        self.unused_sessions = unused.difference(&self.unused_sessions).cloned().collect();
        evicted.len()
    }
}
