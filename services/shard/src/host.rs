//! One host: its single writer lock, its connections, and its agents' way back in.
//!
//! All of a host's state sits behind one mutex held only for synchronous work (never across an `.await`), so
//! the host is the single writer of its `serverSeq` space and every publication leaves in sequence order.
//! Commands ([`crate::commands`]), client actions and agent output ([`crate::dispatch`]) are methods on
//! [`HostCore`] defined in their own modules.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use ahp_types::actions::StateAction;
use ahp_types::state::RootState;
use parking_lot::Mutex;
use relay_core::bus::SharedBusEvent;
use relay_core::link::CommandReply;
use relay_core::rpc::{self, InboundMessage};
use relay_core::{ConnectionId, HostKey, Identity, Limits};
use relay_runner::{ChatSink, ProviderRegistry};
use tokio::sync::broadcast;

use crate::model::HostModel;
use crate::sequencer::Sequencer;

/// Protocol state of one connection, as the host sees it.
pub struct ConnectionState {
    pub identity: Identity,
    /// Set by `initialize` or `reconnect`.
    pub client_id: Option<String>,
    pub protocol_version: Option<String>,
    pub subscriptions: HashSet<String>,
}

/// A client id, the user it belongs to, and how many live connections use it.
pub struct ClientBinding {
    pub subject: String,
    pub live_connections: usize,
    /// Bumped on every disconnect, so a stale grace timer can tell it lost the race.
    pub grace_epoch: u64,
}

/// Everything behind the host lock.
pub struct HostCore {
    pub key: HostKey,
    pub limits: Limits,
    pub providers: ProviderRegistry,
    pub seq: Sequencer,
    pub model: HostModel,
    pub connections: HashMap<ConnectionId, ConnectionState>,
    pub clients: HashMap<String, ClientBinding>,
    /// A handle agents use to emit actions into this host.
    pub sink: Arc<dyn ChatSink>,
    /// Client ids whose grace period must be armed once the lock is released.
    pub pending_grace: Vec<(String, u64)>,
}

/// One AHP host.
pub struct Host {
    core: Mutex<HostCore>,
    me: Weak<Host>,
}

impl Host {
    pub fn new(key: HostKey, limits: Limits, providers: ProviderRegistry) -> Arc<Self> {
        Arc::new_cyclic(|me: &Weak<Host>| {
            let root = RootState {
                agents: providers.agents(),
                active_sessions: None,
                terminals: None,
                config: None,
                meta: None,
            };
            Host {
                core: Mutex::new(HostCore {
                    seq: Sequencer::new(limits.replay_buffer_envelopes, limits.bus_capacity),
                    model: HostModel::new(root),
                    key,
                    limits,
                    providers,
                    connections: HashMap::new(),
                    clients: HashMap::new(),
                    sink: Arc::new(HostSink { host: me.clone() }),
                    pending_grace: Vec::new(),
                }),
                me: me.clone(),
            }
        })
    }

    /// Register a connection and hand it the host's bus.
    pub fn attach(
        &self,
        connection: ConnectionId,
        identity: Identity,
    ) -> broadcast::Receiver<SharedBusEvent> {
        let mut core = self.core.lock();
        core.connections.insert(
            connection,
            ConnectionState {
                identity,
                client_id: None,
                protocol_version: None,
                subscriptions: HashSet::new(),
            },
        );
        core.seq.subscribe()
    }

    /// Handle one inbound request or notification of a connection.
    pub fn call(&self, connection: ConnectionId, message: InboundMessage) -> CommandReply {
        let (reply, grace) = {
            let mut core = self.core.lock();
            let reply = core.handle(connection, message);
            (reply, std::mem::take(&mut core.pending_grace))
        };
        self.arm_grace_timers(grace);
        reply
    }

    /// The connection is gone.
    pub fn detach(&self, connection: ConnectionId) {
        let grace = {
            let mut core = self.core.lock();
            core.disconnect(connection);
            std::mem::take(&mut core.pending_grace)
        };
        self.arm_grace_timers(grace);
    }

    /// The host's current `serverSeq`.
    pub fn server_seq(&self) -> u64 {
        self.core.lock().seq.current()
    }

    /// Emit a server action as an agent would (used by providers through [`HostSink`]).
    pub fn emit_agent_action(&self, channel: &str, action: StateAction) -> bool {
        self.core.lock().apply_agent_action(channel, action)
    }

    fn arm_grace_timers(&self, grace: Vec<(String, u64)>) {
        if grace.is_empty() {
            return;
        }
        let wait = self.core.lock().limits.active_client_grace;
        for (client_id, epoch) in grace {
            let host = self.me.clone();
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                if let Some(host) = host.upgrade() {
                    host.core.lock().expire_client(&client_id, epoch);
                }
            });
        }
    }
}

/// The [`ChatSink`] agents of a host write to.
struct HostSink {
    host: Weak<Host>,
}

impl ChatSink for HostSink {
    fn emit(&self, channel: &str, action: StateAction) -> bool {
        self.host
            .upgrade()
            .is_some_and(|host| host.emit_agent_action(channel, action))
    }
}

impl HostCore {
    /// Route one inbound message to its command.
    fn handle(&mut self, connection: ConnectionId, message: InboundMessage) -> CommandReply {
        let id = message.id;
        match self.route(connection, &message) {
            Ok(reply) => reply,
            Err(error) => {
                if id.is_none() {
                    tracing::debug!(method = %message.method, %error, "notification refused");
                }
                CommandReply::frame(rpc::error_frame(id, &error))
            }
        }
    }

    /// The connection's state; every attached connection has one.
    pub fn connection(&self, connection: ConnectionId) -> Result<&ConnectionState, rpc::RpcError> {
        self.connections
            .get(&connection)
            .ok_or_else(|| rpc::RpcError::internal("connection is not attached"))
    }

    /// The client id of an initialized connection, or the error to answer with.
    pub fn client_id(&self, connection: ConnectionId) -> Result<String, rpc::RpcError> {
        self.connection(connection)?.client_id.clone().ok_or_else(|| {
            rpc::RpcError::invalid_request("the connection is not initialized: send initialize first")
        })
    }

    fn disconnect(&mut self, connection: ConnectionId) {
        let Some(state) = self.connections.remove(&connection) else {
            return;
        };
        let Some(client_id) = state.client_id else {
            return;
        };
        if let Some(binding) = self.clients.get_mut(&client_id) {
            binding.live_connections = binding.live_connections.saturating_sub(1);
            if binding.live_connections == 0 {
                binding.grace_epoch += 1;
                self.pending_grace.push((client_id, binding.grace_epoch));
            }
        }
    }

    /// Bind `client_id` to the connection's user, refusing another user's client id.
    pub fn bind_client(&mut self, connection: ConnectionId, client_id: &str) -> Result<(), rpc::RpcError> {
        if client_id.is_empty() {
            return Err(rpc::RpcError::invalid_params("clientId must not be empty"));
        }
        let subject = self.connection(connection)?.identity.subject.clone();
        let binding = self
            .clients
            .entry(client_id.to_string())
            .or_insert_with(|| ClientBinding {
                subject: subject.clone(),
                live_connections: 0,
                grace_epoch: 0,
            });
        if binding.subject != subject {
            return Err(rpc::RpcError::permission_denied(
                "this clientId belongs to another user",
            ));
        }
        binding.live_connections += 1;
        binding.grace_epoch += 1;
        if let Some(state) = self.connections.get_mut(&connection) {
            state.client_id = Some(client_id.to_string());
        }
        Ok(())
    }
}
