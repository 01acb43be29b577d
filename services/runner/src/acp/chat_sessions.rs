//! The ACP sessions of one agent process, one per AHP chat: the session's first (opened when the AHP session
//! was created) for the first chat that prompts, loaded again after a restart when the agent can, or opened
//! anew (saying the chat's earlier context is gone); the agent's model selector and settings as each ACP
//! session has them; and what the AHP session's `_meta` records of them.

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    SessionConfigId, SessionConfigOptionValue, SessionId, SetSessionConfigOptionRequest,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Agent;
use parking_lot::Mutex;

use super::agent_link::{load, open, AgentAsks, Announcer, Prompt, Reported, CONTEXT_RESET};
use super::agent_settings::{apply_settings, observe_options};
use super::options::AgentSettings;
use crate::provider::ChatSink;
use agent_client_protocol::v1::schema::AvailableCommand;
use ahp_types::actions::{SessionMetaChangedAction, StateAction};

/// Said when a chat's ACP session cannot be had.
pub(crate) type Refusal = (&'static str, String);

/// What opening a chat's session needs of its worker.
pub(crate) struct Opening<'a> {
    pub(crate) cwd: &'a std::path::Path,
    pub(crate) can_load: bool,
    pub(crate) agent: &'a str,
    pub(crate) listing: &'a super::listing::Listing,
    pub(crate) announcer: &'a Announcer,
    pub(crate) agent_meta: &'a Mutex<AgentMeta>,
    pub(crate) terminals: &'a super::terminal::Terminals,
}

/// Each chat's ACP session and what it has of the agent's settings.
#[derive(Default)]
pub(crate) struct ChatSessions {
    /// Sessions an earlier process of the agent opened (to load again), by chat.
    stored: HashMap<String, String>,
    /// Sessions of this process, by chat.
    by_chat: HashMap<String, SessionId>,
    /// The AHP session's first ACP session, for the first chat that prompts.
    pub(crate) primary: Option<SessionId>,
    /// The agent's model selector (a config option of category `model`) and each ACP session's choice.
    model_option: Option<SessionConfigId>,
    chosen: HashMap<String, String>,
    /// The agent's other settings (session config) and what each ACP session has of them.
    settings: AgentSettings,
    chosen_settings: HashMap<(String, String), serde_json::Value>,
}

impl ChatSessions {
    /// With the sessions an earlier process of the agent opened (chat → ACP session id).
    pub(crate) fn continuing(stored: HashMap<String, String>) -> ChatSessions {
        ChatSessions {
            stored,
            ..ChatSessions::default()
        }
    }

    /// The agent reported its settings (opening or loading a session): keep its model selector and settings,
    /// and list its models.
    pub(crate) fn observe(
        &mut self,
        reported: &Reported,
        agent: &str,
        listing: &super::listing::Listing,
        sink: &dyn ChatSink,
    ) {
        observe_options(
            reported,
            agent,
            listing,
            sink,
            &mut self.model_option,
            &mut self.settings,
        );
    }

    /// The relay let go of what the agent had for `chat`: its next prompt opens a new ACP session.
    pub(crate) fn forget(&mut self, chat: &str) {
        self.by_chat.remove(chat);
        self.stored.remove(chat);
    }

    /// The chat's ACP session (opened or loaded on its first prompt here), and the note to show in its turn
    /// when its earlier context could not be restored.
    pub(crate) async fn session_for(
        &mut self,
        cx: &ConnectionTo<Agent>,
        chat: &str,
        opening: &Opening<'_>,
        asks: &mut AgentAsks,
    ) -> Result<(SessionId, Option<&'static str>), Refusal> {
        if let Some(id) = self.by_chat.get(chat) {
            return Ok((id.clone(), None));
        }
        let mut note = None;
        let previous = self.stored.remove(chat);
        let loaded = match (&previous, opening.can_load) {
            (Some(id), true) => load(cx, id, opening.cwd, asks).await,
            _ => None,
        };
        let opened = match (self.primary.take(), loaded) {
            (Some(id), _) => Ok(id),
            (None, Some((id, reported))) => {
                self.observe(
                    &reported,
                    opening.agent,
                    opening.listing,
                    opening.announcer.sink.as_ref(),
                );
                Ok(id)
            }
            (None, None) => {
                if previous.is_some() {
                    note = Some(CONTEXT_RESET);
                }
                match open(cx, opening.cwd).await {
                    Ok((id, reported)) => {
                        self.observe(
                            &reported,
                            opening.agent,
                            opening.listing,
                            opening.announcer.sink.as_ref(),
                        );
                        Ok(id)
                    }
                    Err(error) => Err(error),
                }
            }
        };
        match opened {
            Ok(id) => {
                opening.terminals.chat_opened(&id.0, chat);
                self.by_chat.insert(chat.to_string(), id.clone());
                remember(opening.announcer, opening.agent_meta, &self.stored, &self.by_chat);
                Ok((id, note))
            }
            Err(error) => Err((
                "agentSessionNew",
                format!("the agent could not open a session: {error}"),
            )),
        }
    }

    /// Select the model the prompt names and apply the AHP session's settings to the chat's ACP session.
    pub(crate) async fn prepare(
        &mut self,
        cx: &ConnectionTo<Agent>,
        session: &SessionId,
        prompt: &Prompt,
    ) -> Result<(), Refusal> {
        if let (Some(model), Some(option)) = (prompt.model.clone(), self.model_option.clone()) {
            if self.chosen.get(&session.to_string()) != Some(&model) {
                let selected = cx
                    .send_request(SetSessionConfigOptionRequest::new(
                        session.clone(),
                        option,
                        SessionConfigOptionValue::value_id(model.clone()),
                    ))
                    .block_task()
                    .await;
                if let Err(error) = selected {
                    return Err((
                        "modelSelectionFailed",
                        format!("the agent could not switch to model {model}: {error}"),
                    ));
                }
                self.chosen.insert(session.to_string(), model);
            }
        }
        apply_settings(cx, session, prompt, &self.settings, &mut self.chosen_settings)
            .await
            .map_err(|message| ("configSelectionFailed", message))
    }
}

/// What a session's worker keeps in the AHP session's `_meta["ahpRelay/agent"]`: each chat's ACP session id
/// (`acpSessions`, loaded after a restart) and the agent's slash commands (`commands`: `name`, `description`,
/// answered by `completions`).
#[derive(Default)]
pub struct AgentMeta {
    sessions: serde_json::Map<String, serde_json::Value>,
    commands: Vec<serde_json::Value>,
}

impl AgentMeta {
    /// Publish it (`session/metaChanged`).
    fn publish(&self, sink: &dyn ChatSink, session: &str) {
        let mut meta = ahp_types::common::JsonObject::new();
        meta.insert(
            crate::provider::AGENT_STATE_META.into(),
            serde_json::json!({ "acpSessions": self.sessions, "commands": self.commands }),
        );
        sink.emit(
            session,
            StateAction::SessionMetaChanged(SessionMetaChangedAction { meta: Some(meta) }),
        );
    }

    /// The agent announced its slash commands.
    pub(crate) fn commands_changed(
        &mut self,
        commands: &[AvailableCommand],
        sink: &dyn ChatSink,
        session: &str,
    ) {
        self.commands = commands
            .iter()
            .map(|command| serde_json::json!({"name": command.name, "description": command.description}))
            .collect();
        self.publish(sink, session);
    }
}

/// Keep each chat's ACP session id in the AHP session's state (`_meta`), so a restarted agent can load them.
pub(crate) fn remember(
    announcer: &Announcer,
    meta: &Mutex<AgentMeta>,
    stored: &HashMap<String, String>,
    open: &HashMap<String, SessionId>,
) {
    let mut meta = meta.lock();
    meta.sessions = stored
        .iter()
        .map(|(chat, id)| (chat.clone(), serde_json::Value::from(id.clone())))
        .collect();
    for (chat, id) in open {
        meta.sessions
            .insert(chat.clone(), serde_json::Value::from(id.to_string()));
    }
    meta.publish(announcer.sink.as_ref(), &announcer.session);
}
