//! A message's attachments: checked and pinned when the host accepts the message, resolved into what an agent
//! takes when the message's turn starts.
//!
//! A chat attachment names another chat of the host (any session); without `endTurn` the host pins that chat's
//! latest completed turn when it accepts the message (AHP), and with it the turn must be a completed, retained
//! one. The agent gets the referenced chat's transcript from its first retained turn through the pinned one
//! (never expanding the attachments inside it); a chat with no completed turn gives an empty transcript.
//! Resources go as links, embedded content with its MIME type, simple attachments as their model
//! representation. Annotations and unknown kinds are refused with the reason.

use ahp_types::actions::StateAction;
use ahp_types::state::{Message, MessageAttachment, TurnState};
use relay_runner::TurnAttachment;

use crate::model::HostModel;

/// Check the attachments of the message `action` carries (a turn, a queued or steering message) and pin
/// its chat references; `Err` is the rejection's reason.
pub fn pin_action(model: &HostModel, action: &mut StateAction) -> Result<(), String> {
    match action {
        StateAction::ChatTurnStarted(a) => pin(model, &mut a.message),
        StateAction::ChatPendingMessageSet(a) => pin(model, &mut a.message),
        _ => Ok(()),
    }
}

/// [`pin_action`] for one message (also `createChat.initialMessage`).
pub fn pin(model: &HostModel, message: &mut Message) -> Result<(), String> {
    for attachment in message.attachments.iter_mut().flatten() {
        match attachment {
            MessageAttachment::Chat(chat) => {
                let Some(record) = model.chats.get(&chat.resource) else {
                    return Err(format!(
                        "attachment {}: no chat {} on this host",
                        chat.label, chat.resource
                    ));
                };
                let completed = |id: &str| {
                    record
                        .state
                        .turns
                        .iter()
                        .any(|turn| turn.id == id && turn.state == TurnState::Complete)
                };
                match &chat.end_turn {
                    Some(end) if !completed(end) => {
                        return Err(format!(
                            "attachment {}: {end} is not a completed, retained turn of {}",
                            chat.label, chat.resource
                        ));
                    }
                    Some(_) => {}
                    None => {
                        chat.end_turn = record
                            .state
                            .turns
                            .iter()
                            .rev()
                            .find(|turn| turn.state == TurnState::Complete)
                            .map(|turn| turn.id.clone());
                    }
                }
            }
            MessageAttachment::Simple(_)
            | MessageAttachment::EmbeddedResource(_)
            | MessageAttachment::Resource(_) => {}
            MessageAttachment::Annotations(a) => {
                return Err(format!(
                    "attachment {}: annotations attachments are not supported by this host",
                    a.label
                ));
            }
            MessageAttachment::Unknown(_) => {
                return Err("an attachment of a kind this host does not know".into());
            }
        }
    }
    Ok(())
}

/// What the agent gets for the message's attachments (pinned by [`pin`] when the message was accepted).
pub fn resolve(model: &HostModel, message: &Message) -> Vec<TurnAttachment> {
    message
        .attachments
        .iter()
        .flatten()
        .filter_map(|attachment| match attachment {
            MessageAttachment::Simple(a) => Some(TurnAttachment::Text {
                label: a.label.clone(),
                text: a.model_representation.clone().unwrap_or_else(|| a.label.clone()),
            }),
            MessageAttachment::EmbeddedResource(a) => Some(TurnAttachment::Embedded {
                label: a.label.clone(),
                content_type: a.content_type.clone(),
                data: a.data.clone(),
            }),
            MessageAttachment::Resource(a) => Some(TurnAttachment::Link {
                label: a.label.clone(),
                uri: a.uri.clone(),
                content_type: a.content_type.clone(),
            }),
            MessageAttachment::Chat(a) => {
                let transcript = model
                    .chats
                    .get(&a.resource)
                    .zip(a.end_turn.as_deref())
                    .and_then(|(record, end)| {
                        crate::model::agent_context::transcript_through(&record.state, end)
                    })
                    .unwrap_or_default();
                Some(TurnAttachment::Text {
                    label: a.label.clone(),
                    text: format!(
                        "[The chat {} (\"{}\"), as attached]\n{transcript}",
                        a.resource, a.label
                    ),
                })
            }
            MessageAttachment::Annotations(_) | MessageAttachment::Unknown(_) => None,
        })
        .collect()
}
