//! One message of a connection to its host, up to the host's lock: resource commands (no host state), the
//! admission of an opening, the channels it names loaded from the store, the commands that await (listings,
//! resumes, history, terminals, branches, changesets), then the locked command ([`crate::commands::router`]) and the
//! wait for what it changed to be committed before its reply goes.

use relay_core::link::CommandReply;
use relay_core::rpc::{self, InboundMessage, RpcError};
use relay_core::ConnectionId;

use crate::host::{Host, MAX_PENDING_BYTES, MAX_PENDING_PUBLICATIONS};

impl Host {
    /// Handle one inbound request or notification of a connection. Once the host is deposed, the answer is
    /// [`CommandReply::moved`] whatever the message: what it did may not be committed, and the client must reconnect
    /// to the host's new owner.
    pub async fn call(&self, connection: ConnectionId, message: InboundMessage) -> CommandReply {
        let id = message.id;
        if self.is_deposed() {
            return CommandReply::moved(id);
        }
        let mut reply = self.serve_call(connection, message).await;
        if self.is_deposed() {
            return CommandReply::moved(id);
        }
        if id.is_none() {
            // JSON-RPC 2.0: a notification is never answered, not even with an error (a refused
            // `dispatchAction` is answered by its rejected echo instead). It is logged and counted.
            if let Some(frame) = reply.frame.take() {
                tracing::debug!(host = %self.key, error = %String::from_utf8_lossy(&frame), "notification refused");
                relay_core::telemetry::notification_refused();
            }
        }
        reply
    }

    async fn serve_call(&self, connection: ConnectionId, message: InboundMessage) -> CommandReply {
        // Files: nothing of the host's state is read or changed.
        if crate::workspace::resources::RESOURCE_METHODS.contains(&message.method.as_str()) {
            return self.resource_command(connection, &message).await;
        }
        let size = message.params.as_ref().map_or(0, |params| params.get().len());
        let opens_session = matches!(message.method.as_str(), "initialize" | "reconnect");
        let mut admitted = !opens_session;
        if opens_session {
            match self.admit_opening(connection, &message).await {
                Ok(crate::host::admission::Admission::Load) => admitted = true,
                Ok(crate::host::admission::Admission::LoadNothing) => {}
                Ok(crate::host::admission::Admission::Refuse(error)) => {
                    return CommandReply::frame(rpc::error_frame(message.id, &error));
                }
                Err(error) => {
                    tracing::error!(host = %self.key, %error, "could not read a client binding from the store");
                    return CommandReply::frame(rpc::error_frame(
                        message.id,
                        &RpcError::internal("the store is unavailable; retry"),
                    ));
                }
            }
        }
        // Nothing is read from the store for a connection that has not initialized (it will be refused), for an
        // opening that cannot succeed, and never more channels than one message may name.
        let named = if (opens_session && admitted)
            || (!opens_session && self.core.lock().client_id(connection).is_ok())
        {
            relay_core::heavy::for_message(size, || crate::host::preload::channels_named_by(&message))
        } else {
            Vec::new()
        };
        let limit = self.core.lock().limits.max_channels_per_message;
        if named.len() > limit {
            return CommandReply::frame(rpc::error_frame(
                message.id,
                &RpcError::invalid_params(format!("a message may name at most {limit} distinct channels")),
            ));
        }
        let loaded = match self.ensure_loaded(&named).await {
            Ok(loaded) => loaded,
            Err(error) => {
                tracing::error!(host = %self.key, %error, "could not load channels from the store");
                return CommandReply::frame(rpc::error_frame(
                    message.id,
                    &RpcError::internal("the store is unavailable; retry"),
                ));
            }
        };
        let reply = self.serve_loaded(connection, message, size).await;
        // A refused opening leaves nothing it loaded behind.
        if opens_session && !loaded.is_empty() && reply.frame.as_deref().is_some_and(rpc::is_error) {
            self.with_core(|core| core.unload_unused(&loaded));
        }
        reply
    }

    /// [`Host::serve_call`] once what the message names is loaded.
    async fn serve_loaded(
        &self,
        connection: ConnectionId,
        message: InboundMessage,
        size: usize,
    ) -> CommandReply {
        let writer = {
            let core = self.core.lock();
            core.client_id(connection).is_ok()
                && core
                    .connection(connection)
                    .is_ok_and(|state| state.identity.role.can_write())
        };
        // A `createChat` that will be refused whatever the turns hold (a fork to a taken URI, say) is refused
        // now, before its source's archived turns are loaded for everyone.
        if writer && message.method == "createChat" {
            let refused = message
                .parse_params::<ahp_types::commands::CreateChatParams>()
                .and_then(|params| self.core.lock().check_create_chat(connection, &params));
            if let Err(error) = refused {
                return CommandReply::frame(rpc::error_frame(message.id, &error));
            }
        }
        // An operation on an archived turn reduces against state that holds it (AHP: eager loading) — only
        // for a connection that may make it: a viewer's (refused) operation loads nothing for everyone.
        if writer {
            if let Err(error) = self.load_named_turns(&message).await {
                tracing::error!(host = %self.key, %error, "could not load archived turns from the store");
                return CommandReply::frame(rpc::error_frame(
                    message.id,
                    &RpcError::internal("the store is unavailable; retry"),
                ));
            }
        }
        match message.method.as_str() {
            "listSessions" => return self.list_sessions(connection, &message).await,
            "reconnect" => return self.reconnect(connection, &message).await,
            "fetchTurns" => return self.fetch_turns(connection, &message).await,
            "createTerminal" => return self.create_terminal(connection, &message).await,
            // A repository's branch, where the client names a working directory ([`crate::commands::branches`]).
            "resolveSessionConfig" => {
                if let Some(reply) = self.resolve_with_branch(connection, &message).await {
                    return reply;
                }
            }
            "sessionConfigCompletions" => {
                if let Some(reply) = self.branch_completions(connection, &message).await {
                    return reply;
                }
            }
            "completions" => {
                if let Some(reply) = self.file_completions(connection, &message).await {
                    return reply;
                }
            }
            "invokeChangesetOperation" => return self.invoke_changeset_operation(connection, &message).await,
            // A changeset is opened (and computed again) when a client subscribes to it.
            "subscribe" => {
                if let Some(channel) = message.channel() {
                    if channel.starts_with(crate::model::changeset_uris::CHANGESET_SCHEME) {
                        self.with_core(|core| core.changeset_subscribed(&channel));
                    }
                }
            }
            _ => {}
        }
        let id = message.id;
        let ((mut reply, barrier, backlog, backlog_bytes), unit) =
            relay_core::heavy::for_message(size, || {
                self.with_core_as(Some(connection), |core| {
                    let reply = core.handle(connection, message);
                    (
                        reply,
                        core.seq.barrier(),
                        core.seq.pending_len(),
                        core.seq.pending_bytes(),
                    )
                })
            });
        // Replies show state: they wait for it to be durable. A connection that outruns the store waits too
        // (backpressure), which keeps every batch, and so every burst on the bus, bounded.
        if reply.frame.is_some() || backlog >= MAX_PENDING_PUBLICATIONS || backlog_bytes >= MAX_PENDING_BYTES
        {
            self.wait_committed(barrier).await;
            // The store refused what this request changed: it did not happen.
            if let Some(why) = self.core.lock().failed_units.take(unit) {
                if reply.frame.is_some() {
                    reply.frame = Some(rpc::error_frame(
                        id,
                        &RpcError::internal(format!("the store could not record this change: {why}")),
                    ));
                }
            }
        }
        reply
    }
}
