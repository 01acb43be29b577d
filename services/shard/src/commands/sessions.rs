//! Session commands: `createSession` (with the session's default chat, the agent's preparation and its
//! settings) and `disposeSession` (its chats, its agent, its subscriptions).

use ahp_types::actions::{SessionChatRemovedAction, SessionReadyAction, StateAction};
use ahp_types::commands::{CreateSessionParams, DisposeSessionParams};
use ahp_types::errors::ahp_error_codes;
use ahp_types::notifications::{SessionAddedParams, SessionRemovedParams};
use ahp_types::state::{SessionLifecycle, SessionState, SessionStatus};
use ahp_types::ROOT_RESOURCE_URI;
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::{ConnectionId, Role};

use crate::commands::chats::new_chat_state;
use crate::host::HostCore;
use crate::model::agent_context::AgentContext;
use crate::model::{chat_summary_of, summary_of};
use crate::reply::{now, reply, CommandResult};
use relay_store::CatalogChange;

impl HostCore {
    pub(crate) fn create_session(
        &mut self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> CommandResult {
        self.require_writer(connection)?;
        let params: CreateSessionParams = message.parse_params()?;
        if let Some(refusal) = self.storage_refusal() {
            return Err(RpcError::invalid_request(refusal));
        }
        let uri = params.channel;
        self.check_new_uri(&uri, "ahp-session:", ahp_error_codes::SESSION_ALREADY_EXISTS)?;
        if self.session_count >= self.limits.max_sessions_per_host as u64 {
            return Err(RpcError::invalid_request(format!(
                "session limit reached ({} per host)",
                self.limits.max_sessions_per_host
            )));
        }
        // Without a provider: the host's configured `defaultProvider` (root config, which admins set), else
        // the first one configured.
        let configured = self
            .model
            .root
            .config
            .as_ref()
            .and_then(|config| config.values.get("defaultProvider"))
            .and_then(|value| value.as_str())
            .filter(|provider| self.providers.get(provider).is_some())
            .map(str::to_string);
        let provider = match params.provider.or(configured) {
            Some(p) => p,
            None => self
                .providers
                .default_provider()
                .ok_or_else(|| {
                    RpcError::new(ahp_error_codes::PROVIDER_NOT_FOUND, "no provider is configured")
                })?
                .to_string(),
        };
        let Some(agent) = self.providers.get(&provider).cloned() else {
            return Err(RpcError::new(
                ahp_error_codes::PROVIDER_NOT_FOUND,
                format!("provider not found: {provider}"),
            ));
        };
        let directories = params.working_directories.as_deref().unwrap_or_default();
        let multiple = self
            .model
            .root
            .agents
            .iter()
            .find(|agent| agent.provider == provider)
            .and_then(|agent| agent.capabilities.as_ref())
            .is_some_and(|capabilities| capabilities.multiple_working_directories.is_some());
        if directories.len() > 1 && !multiple {
            return Err(RpcError::invalid_params(format!(
                "the agent {provider} does not advertise multipleWorkingDirectories: name at most one working directory"
            )));
        }
        let client_id = self.client_id(connection)?;
        // A token scoped to hosts names working directories in their directories only.
        let tenant_root = self
            .providers
            .files()
            .and_then(|files| files.tenant_root(&self.key.tenant));
        for directory in directories {
            crate::workspace::host_scope::check_directory(
                &self.connection(connection)?.identity,
                tenant_root.as_deref(),
                directory,
            )?;
        }
        let active_clients = match params.active_client {
            Some(active) if active.client_id != client_id => {
                return Err(RpcError::invalid_params(
                    "activeClient.clientId must be this connection's clientId",
                ))
            }
            Some(active) => vec![active],
            None => vec![],
        };
        // The agent prepares the session (e.g. starts its process); it reports back on the session channel.
        let start = agent.create_session(
            relay_runner::SessionRequest {
                session: uri.clone(),
                tenant: self.key.tenant.clone(),
                host: self.key.host.clone(),
                working_directory: params
                    .working_directories
                    .as_ref()
                    .and_then(|d| d.first().cloned()),
                // The repository's branch the client chose ([`crate::commands::branches`]).
                branch: params
                    .config
                    .as_ref()
                    .and_then(|config| config.get(crate::commands::branches::BRANCH_PROPERTY))
                    .and_then(|branch| branch.as_str())
                    .map(str::to_string),
            },
            self.sink.clone(),
        );
        if let relay_runner::SessionStart::Refused(message) = &start {
            return Err(RpcError::invalid_params(message.clone()));
        }
        let created_at = now();
        // The agent's settings, as the client chose them (checked against the schema; defaults for the rest).
        let config = agent
            .session_config_schema()
            .map(|schema| ahp_types::state::SessionConfigState {
                values: relay_runner::acp::options::resolve(&schema, params.config.as_ref()),
                schema,
            });
        // Every session starts with its default chat (AHP: clients open chats beyond it only where the agent
        // advertises `multipleChats`).
        let default_chat = self.default_chat_uri(&uri);
        let chat_state = new_chat_state(&default_chat, None, vec![], None);
        let state = SessionState {
            provider,
            title: String::new(),
            status: SessionStatus::Idle.bits(),
            activity: None,
            origin: None,
            project: None,
            working_directories: params.working_directories,
            annotations: None,
            lifecycle: SessionLifecycle::Creating,
            creation_error: None,
            server_tools: None,
            active_clients,
            chats: vec![chat_summary_of(&chat_state)],
            default_chat: Some(default_chat.clone()),
            config,
            customizations: None,
            // What its turns change, where this host reaches its files ([`crate::workspace::changesets`]).
            changesets: (self.providers.files().is_some() && agent.workspace_root().is_some())
                .then(|| crate::workspace::changesets::catalogue(&uri)),
            input_needed: None,
            meta: None,
        };
        let summary = summary_of(&uri, &state, &created_at);
        let catalog_no = self
            .model
            .insert_new_session(uri.clone(), state, created_at.clone());
        self.session_count += 1;
        let creator = self.connection(connection)?.identity.subject.clone();
        if let Some(session) = self.model.sessions.get_mut(&uri) {
            session.created_by = Some(creator.clone());
        }
        self.insert_chat(&uri, chat_state, Some(creator), AgentContext::Current);
        self.store_session_summary(&uri, catalog_no, &created_at, &summary);
        self.store_snapshot(&uri);
        self.seq.notify(
            ROOT_RESOURCE_URI,
            "root/sessionAdded",
            &SessionAddedParams {
                channel: ROOT_RESOURCE_URI.into(),
                summary,
            },
        );
        if start == relay_runner::SessionStart::Ready {
            self.apply_server_action(&uri, StateAction::SessionReady(SessionReadyAction {}));
        }
        reply(message.id, &())
    }

    pub(crate) fn dispose_session(
        &mut self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> CommandResult {
        self.require_writer(connection)?;
        let params: DisposeSessionParams = message.parse_params()?;
        let uri = params.channel;
        let Some(session) = self.model.sessions.get(&uri) else {
            return Err(RpcError::session_not_found(&uri));
        };
        let who = &self.connection(connection)?.identity;
        if who.role != Role::Admin && session.created_by.as_ref() != Some(&who.subject) {
            return Err(RpcError::permission_denied(
                "members may dispose only sessions they created (admins may dispose any)",
            ));
        }
        if let Some(agent) = self.providers.get(&session.state.provider) {
            agent.dispose_session(&self.key.tenant, &self.key.host, &uri);
        }
        let listed: Vec<String> = session.state.chats.iter().map(|c| c.resource.clone()).collect();
        for chat in &listed {
            self.apply_server_action(
                &uri,
                StateAction::SessionChatRemoved(SessionChatRemovedAction { chat: chat.clone() }),
            );
        }
        self.forget_checkpoints_of(&uri);
        let changesets = self.dispose_changesets_of(&uri);
        self.note_disposing(changesets.iter().cloned());
        for state in self.connections.values_mut() {
            for changeset in &changesets {
                state.subscriptions.remove(changeset);
            }
        }
        let chats = self.model.remove_session(&uri);
        self.session_count = self.session_count.saturating_sub(1);
        for chat in &chats {
            self.seq.dispose(chat);
            self.seq.forget(&crate::model::archive::key(chat));
            self.seq.forget(&crate::model::archive::legacy_key(chat));
        }
        self.seq.catalog(CatalogChange::Remove { uri: uri.clone() });
        self.seq.dispose(&uri);
        self.note_disposing(std::iter::once(uri.clone()).chain(chats.iter().cloned()));
        for state in self.connections.values_mut() {
            state.subscriptions.remove(&uri);
            for chat in &chats {
                state.subscriptions.remove(chat);
                state.turn_windows.remove(chat);
            }
        }
        for binding in self.clients.values_mut() {
            for chat in &chats {
                binding.turn_windows.remove(chat);
            }
        }
        self.sync_terminal_list();
        self.seq.notify(
            ROOT_RESOURCE_URI,
            "root/sessionRemoved",
            &SessionRemovedParams {
                channel: ROOT_RESOURCE_URI.into(),
                session: uri,
            },
        );
        reply(message.id, &())
    }
}
