//! A host's connections and the client ids bound to them: routing a connection's message, binding its
//! clientId to its user, and what a disconnect leaves (the grace period of the client's bindings).

use relay_core::link::CommandReply;
use relay_core::rpc::{self, InboundMessage, RpcError};
use relay_core::ConnectionId;

use crate::host::{ClientBinding, ConnectionState, HostCore, MAX_CLIENT_ID_BYTES};

impl HostCore {
    /// Route one inbound message to its command.
    pub(crate) fn handle(&mut self, connection: ConnectionId, message: InboundMessage) -> CommandReply {
        let id = message.id;
        match self.route(connection, &message) {
            Ok(reply) => reply,
            Err(error) => CommandReply::frame(rpc::error_frame(id, &error)),
        }
    }

    /// The connection's state; every attached connection has one.
    pub fn connection(&self, connection: ConnectionId) -> Result<&ConnectionState, RpcError> {
        self.connections
            .get(&connection)
            .ok_or_else(|| RpcError::internal("connection is not attached"))
    }

    /// The client id of an initialized connection, or the error to answer with.
    pub fn client_id(&self, connection: ConnectionId) -> Result<String, RpcError> {
        self.connection(connection)?.client_id.clone().ok_or_else(|| {
            RpcError::invalid_request("the connection is not initialized: send initialize first")
        })
    }

    pub(crate) fn disconnect(&mut self, connection: ConnectionId) {
        // Its resource watches go with it (AHP: MUST).
        self.release_watches_of(connection);
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

    /// Remember that `channels` were just disposed: a store read of one of them waits for this batch.
    pub(crate) fn note_disposing(&mut self, channels: impl Iterator<Item = String>) {
        let barrier = self.seq.barrier();
        for channel in channels {
            self.disposing.insert(channel, barrier);
        }
    }

    /// Bind `client_id` to the connection's user, refusing another user's client id.
    pub fn bind_client(&mut self, connection: ConnectionId, client_id: &str) -> Result<(), RpcError> {
        if client_id.is_empty() || client_id.len() > MAX_CLIENT_ID_BYTES {
            return Err(RpcError::invalid_params(format!(
                "clientId must be 1 to {MAX_CLIENT_ID_BYTES} bytes"
            )));
        }
        let subject = self.connection(connection)?.identity.subject.clone();
        // A binding the store knows was loaded before this call ([`Host::admit_opening`]): one that is not in
        // memory now is new — a stored row, which a tenant over its storage quota may not add. Its device still
        // gets in (to dispose sessions and make room, say): the binding then lives in memory only, while in
        // use and its grace, and is not recorded.
        let unrecorded = !self.clients.contains_key(client_id) && self.storage_refusal().is_some();
        let binding = self
            .clients
            .entry(client_id.to_string())
            .or_insert_with(|| ClientBinding {
                subject: subject.clone(),
                live_connections: 0,
                grace_epoch: 0,
                turn_windows: Default::default(),
            });
        if binding.subject != subject {
            return Err(RpcError::permission_denied(
                "this clientId belongs to another user",
            ));
        }
        // Recorded (when new) or its use noted (a binding in use is never pruned), with the reply's batch.
        if unrecorded {
            tracing::info!(host = %self.key, "over the storage quota: a new clientId is kept in memory only");
        } else {
            self.seq.bind_client(client_id, &subject);
        }
        binding.live_connections += 1;
        binding.grace_epoch += 1;
        if let Some(state) = self.connections.get_mut(&connection) {
            state.client_id = Some(client_id.to_string());
        }
        Ok(())
    }
}
