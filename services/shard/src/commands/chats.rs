//! Chat commands: `createChat` (plain, fork, side chat: what the agent advertises, what the new chat
//! inherits, what its agent is told), `disposeChat`, and the chat every session starts with.

use ahp_types::actions::{
    SessionChatAddedAction, SessionChatRemovedAction, SessionDefaultChatChangedAction, StateAction,
};
use ahp_types::commands::{ChatSource, CreateChatParams, DisposeChatParams};
use ahp_types::errors::ahp_error_codes;
use ahp_types::state::{ChatOrigin, ChatState, SessionState, SessionStatus};
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::{ConnectionId, Role};

use crate::host::HostCore;
use crate::model::agent_context::{self, AgentContext};
use crate::model::{chat_summary_of, ChannelKind, ChatRecord, SnapshotClock};
use crate::reply::{not_found, now, reply, CommandResult};

impl HostCore {
    pub(crate) fn create_chat(
        &mut self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> CommandResult {
        let params: CreateChatParams = message.parse_params()?;
        self.check_create_chat(connection, &params)?;
        let session = params.channel;
        let chat = params.chat;
        let mut initial_message = params.initial_message;
        if let Some(message) = initial_message.as_mut() {
            let subject = &self.connection(connection)?.identity.subject;
            crate::commands::authorship::stamp_message(message, subject);
            crate::commands::attachments::pin(&self.model, message).map_err(RpcError::invalid_params)?;
        }
        // A fork continues its source: it inherits the source chat's working directories (naming others is
        // refused).
        let mut working_directories = params.working_directories;
        if let Some(ChatSource::Fork(source)) = &params.source {
            let inherited = self
                .model
                .chats
                .get(&source.chat)
                .and_then(|source| source.state.working_directories.clone());
            if working_directories.is_some() && working_directories != inherited {
                return Err(RpcError::invalid_params(
                    "a fork inherits its source chat's working directories: omit workingDirectories",
                ));
            }
            working_directories = inherited;
        }
        let mut agent_context = AgentContext::Current;
        let (origin, turns) = match params.source {
            None => (None, vec![]),
            Some(ChatSource::Fork(source)) => {
                let turns = self.fork_turns(&session, &source.chat, &chat, &source.turn_id)?;
                agent_context = AgentContext::Owed { source: None };
                (
                    Some(ChatOrigin::Fork {
                        chat: source.chat,
                        turn_id: source.turn_id,
                    }),
                    turns,
                )
            }
            // A side chat takes its source's context without copying it into its own history: its origin
            // keeps the source turn and the selection exactly as given.
            Some(ChatSource::SideChat(source)) => {
                self.check_source_turn(&session, &source.chat, &chat, &source.turn_id, true)?;
                if source.selection.as_ref().is_some_and(|s| s.text.is_empty()) {
                    return Err(RpcError::invalid_params(
                        "a side chat's selection.text must not be empty",
                    ));
                }
                // What its agent is told of the source is taken now: later changes to it do not reach it.
                let told = self
                    .model
                    .chats
                    .get(&source.chat)
                    .and_then(|record| agent_context::side_chat_source(&record.state, &source));
                agent_context = AgentContext::Owed { source: told };
                (
                    Some(ChatOrigin::SideChat {
                        chat: source.chat,
                        turn_id: source.turn_id,
                        selection: source.selection,
                    }),
                    vec![],
                )
            }
            Some(ChatSource::Unknown(_)) => {
                return Err(RpcError::invalid_params("unsupported chat source kind"))
            }
        };
        let state = new_chat_state(&chat, origin, turns, working_directories);
        let created_by = Some(self.connection(connection)?.identity.subject.clone());
        let forked_from = match &state.origin {
            Some(ChatOrigin::Fork { chat, .. }) => Some(chat.clone()),
            _ => None,
        };
        let summary = self.insert_chat(&session, state, created_by, agent_context);
        // A fork copies up to the loaded-back limit of turns: both chats hold their retained ones again.
        if let Some(source) = forked_from {
            let retain = self.limits.retained_turns;
            self.age_turns(&chat, retain, 0);
            self.age_turns(&source, retain, 0);
        }
        let needs_default = self
            .model
            .sessions
            .get(&session)
            .is_some_and(|s| s.state.default_chat.is_none());
        self.apply_server_action(
            &session,
            StateAction::SessionChatAdded(SessionChatAddedAction { summary }),
        );
        if needs_default {
            self.apply_server_action(
                &session,
                StateAction::SessionDefaultChatChanged(SessionDefaultChatChangedAction {
                    default_chat: Some(chat.clone()),
                }),
            );
        }
        if let Some(message_to_send) = initial_message {
            self.start_server_turn(&chat, message_to_send, None);
        }
        reply(message.id, &())
    }

    /// What refuses a `createChat` whatever its source's turns hold: checked before a fork's archived turns
    /// are loaded for it (a refused command loads nothing for everyone), and again by the command.
    pub(crate) fn check_create_chat(
        &self,
        connection: ConnectionId,
        params: &CreateChatParams,
    ) -> Result<(), RpcError> {
        self.require_writer(connection)?;
        let Some(record) = self.model.sessions.get(&params.channel) else {
            return Err(RpcError::session_not_found(&params.channel));
        };
        if let Some(refusal) = self.storage_refusal() {
            return Err(RpcError::invalid_request(refusal));
        }
        self.check_new_uri(&params.chat, "ahp-chat:", ahp_error_codes::ALREADY_EXISTS)?;
        if record.state.chats.len() >= self.limits.max_chats_per_session {
            return Err(RpcError::invalid_request("chat limit reached for this session"));
        }
        self.check_chat_capability(&record.state, params.source.as_ref())?;
        if let Some(directories) = &params.working_directories {
            crate::validate::check_in_session_directories(Some(&record.state), directories)
                .map_err(RpcError::invalid_params)?;
        }
        // Clients send only user messages (as a turn's message, and so as the chat's first one).
        if params
            .initial_message
            .as_ref()
            .is_some_and(|message| message.origin.kind != ahp_types::state::MessageKind::User)
        {
            return Err(RpcError::invalid_params("initialMessage must be a user message"));
        }
        Ok(())
    }

    /// Keep a new chat of `session` and store its first snapshot; returns its summary for the session's list.
    pub(crate) fn insert_chat(
        &mut self,
        session: &str,
        state: ChatState,
        created_by: Option<String>,
        agent_context: AgentContext,
    ) -> ahp_types::state::ChatSummary {
        let summary = chat_summary_of(&state);
        let chat = state.resource.clone();
        self.model.chats.insert(
            chat.clone(),
            ChatRecord {
                session: session.to_string(),
                state,
                running: None,
                clock: SnapshotClock::fresh(),
                archived: 0,
                created_by,
                agent_context,
                turn_sizes: Default::default(),
            },
        );
        self.store_snapshot(&chat);
        summary
    }

    /// The URI of a new session's default chat: the session's own name as a chat (`ahp-session:/x` →
    /// `ahp-chat:/x`; loaded before `createSession` runs if a stored chat has it, see
    /// [`crate::host::preload::channels_named_by`]), or, when a chat of the host has that URI, suffixed with the
    /// host's next sequence number (never issued before, so no stored chat has that name unless a client chose
    /// it, which `createChat` checks against the loaded chats the same way).
    pub(crate) fn default_chat_uri(&self, session: &str) -> String {
        let name = session.strip_prefix("ahp-session:").unwrap_or(session);
        let base = format!("ahp-chat:{name}");
        if self.model.kind(&base) == ChannelKind::Unknown {
            return base;
        }
        format!("{base}-default-{}", self.seq.current() + 1)
    }

    /// `createChat` beyond a session's first chat needs the agent's `multipleChats`, a fork its `fork`, a side
    /// chat its `sideChat` (AHP: clients MUST NOT use what is not advertised; the host refuses it).
    fn check_chat_capability(
        &self,
        session: &SessionState,
        source: Option<&ChatSource>,
    ) -> Result<(), RpcError> {
        let capability = self
            .model
            .root
            .agents
            .iter()
            .find(|agent| agent.provider == session.provider)
            .and_then(|agent| agent.capabilities.as_ref())
            .and_then(|capabilities| capabilities.multiple_chats.as_ref());
        let provider = &session.provider;
        match (capability, source) {
            (None, _) if !session.chats.is_empty() => Err(RpcError::invalid_request(format!(
                "the agent {provider} does not advertise multipleChats: the session has its one chat"
            ))),
            (None, Some(_)) => Err(RpcError::invalid_request(format!(
                "the agent {provider} does not advertise multipleChats: no forks or side chats"
            ))),
            (Some(chats), Some(ChatSource::Fork(_))) if chats.fork != Some(true) => {
                Err(RpcError::invalid_request(format!(
                    "the agent {provider} does not advertise multipleChats.fork"
                )))
            }
            (Some(chats), Some(ChatSource::SideChat(_))) if chats.side_chat != Some(true) => {
                Err(RpcError::invalid_request(format!(
                    "the agent {provider} does not advertise multipleChats.sideChat"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The turns of `source` up to and including `turn_id`, for a fork inside `session` (archived turns were
    /// loaded into the source's state before: [`crate::replay::history`]).
    fn fork_turns(
        &self,
        session: &str,
        source: &str,
        target: &str,
        turn_id: &str,
    ) -> Result<Vec<ahp_types::state::Turn>, RpcError> {
        // Its archived turns were not loaded back: more than one operation brings (see `crate::replay::history`).
        if let Some(archived) = self
            .model
            .chats
            .get(source)
            .map(|record| record.archived)
            .filter(|archived| *archived > 0)
        {
            return Err(RpcError::invalid_params(format!(
                "{source} has {archived} archived turns: a fork copies at most {} turns and {} bytes of them",
                crate::model::archive::MAX_LOADED_BACK,
                self.limits.max_reply_bytes
            )));
        }
        self.check_source_turn(session, source, target, turn_id, false)?;
        let record = self.model.chats.get(source).ok_or_else(|| not_found(source))?;
        let index = record
            .state
            .turns
            .iter()
            .position(|t| t.id == turn_id)
            .ok_or_else(|| RpcError::invalid_params(format!("unknown turn {turn_id} in {source}")))?;
        Ok(record.state.turns[..=index].to_vec())
    }

    /// A chat source must be another chat of the same session with the named turn (completed, or for a
    /// side chat also the active one).
    fn check_source_turn(
        &self,
        session: &str,
        source: &str,
        target: &str,
        turn_id: &str,
        active_allowed: bool,
    ) -> Result<(), RpcError> {
        if source == target {
            return Err(RpcError::invalid_params("a chat cannot be forked onto itself"));
        }
        let Some(record) = self.model.chats.get(source) else {
            return Err(RpcError::invalid_params(format!("unknown source chat {source}")));
        };
        if record.session != session {
            return Err(RpcError::invalid_params(
                "the source chat belongs to another session",
            ));
        }
        let completed = record.state.turns.iter().any(|t| t.id == turn_id);
        let active = record.state.active_turn.as_ref().is_some_and(|t| t.id == turn_id);
        if completed || (active_allowed && active) {
            Ok(())
        } else {
            Err(RpcError::invalid_params(format!(
                "unknown turn {turn_id} in {source}"
            )))
        }
    }

    pub(crate) fn dispose_chat(
        &mut self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> CommandResult {
        self.require_writer(connection)?;
        let params: DisposeChatParams = message.parse_params()?;
        let chat = params.channel;
        let Some(record) = self.model.chats.get(&chat) else {
            return Err(not_found(&chat));
        };
        let who = &self.connection(connection)?.identity;
        let own = |creator: Option<&String>| creator == Some(&who.subject);
        let session_creator = self
            .model
            .sessions
            .get(&record.session)
            .and_then(|s| s.created_by.as_ref());
        if who.role != Role::Admin && !own(record.created_by.as_ref()) && !own(session_creator) {
            return Err(RpcError::permission_denied(
                "members may dispose only chats they created or chats of their sessions (admins may dispose any)",
            ));
        }
        let Some(record) = self.model.chats.remove(&chat) else {
            return Err(not_found(&chat));
        };
        drop(record.running);
        self.clear_input_needed(&record.session, &chat);
        self.apply_server_action(
            &record.session,
            StateAction::SessionChatRemoved(SessionChatRemovedAction { chat: chat.clone() }),
        );
        self.seq.dispose(&chat);
        self.seq.forget(&crate::model::archive::key(&chat));
        self.seq.forget(&crate::model::archive::legacy_key(&chat));
        self.note_disposing(std::iter::once(chat.clone()));
        for state in self.connections.values_mut() {
            state.subscriptions.remove(&chat);
            state.turn_windows.remove(&chat);
        }
        for binding in self.clients.values_mut() {
            binding.turn_windows.remove(&chat);
        }
        reply(message.id, &())
    }
}

/// A new chat's state: idle, untitled, with the turns it starts with (a fork's copies).
pub(crate) fn new_chat_state(
    chat: &str,
    origin: Option<ChatOrigin>,
    turns: Vec<ahp_types::state::Turn>,
    working_directories: Option<Vec<String>>,
) -> ChatState {
    ChatState {
        resource: chat.to_string(),
        title: String::new(),
        status: SessionStatus::Idle.bits(),
        activity: None,
        modified_at: now(),
        changes: None,
        origin,
        movable: None,
        interactivity: None,
        working_directories,
        changesets: None,
        background_work: None,
        canvases: None,
        turns,
        turns_next_cursor: None,
        active_turn: None,
        steering_message: None,
        queued_messages: None,
        draft: None,
        meta: None,
    }
}
