//! What a host reads before anything is loaded: its root state when it opens, the channels a message names
//! (loaded before the message is handled, [`crate::host::restore`]), and the log rows after a stored snapshot.

use std::collections::BTreeSet;

use ahp::reducers::apply_action_to_root;
use ahp_types::actions::ActionEnvelope;
use ahp_types::state::RootState;
use ahp_types::ROOT_RESOURCE_URI;
use relay_core::rpc::InboundMessage;
use relay_store::ChannelRecord;
use serde::Deserialize;

use crate::model::RootDocument;

/// Every session or chat URI a message refers to (its channel, chat, subscriptions, and the chats its
/// message attaches).
pub fn channels_named_by(message: &InboundMessage) -> Vec<String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Named {
        channel: Option<String>,
        chat: Option<String>,
        initial_subscriptions: Option<Vec<String>>,
        subscriptions: Option<Vec<String>>,
        /// `dispatchAction`: a message's chat attachments name chats too (read leniently: any action).
        action: Option<serde_json::Value>,
        /// `createChat`'s first message.
        initial_message: Option<serde_json::Value>,
        /// `createTerminal`: the session it runs in (a session claim, or `_meta`).
        claim: Option<serde_json::Value>,
        #[serde(rename = "_meta")]
        meta: Option<serde_json::Value>,
    }
    let Some(params) = message.params.as_ref() else {
        return Vec::new();
    };
    let Ok(named) = serde_json::from_str::<Named>(params.get()) else {
        return Vec::new();
    };
    let mut out: BTreeSet<String> = BTreeSet::new();
    // A new session's default chat is named after it: a chat of an unloaded session may hold that name.
    if message.method == "createSession" {
        if let Some(name) = named
            .channel
            .as_deref()
            .and_then(|c| c.strip_prefix("ahp-session:"))
        {
            out.insert(format!("ahp-chat:{name}"));
        }
    }
    if message.method == "createTerminal" {
        let claimed = named.claim.as_ref().and_then(|claim| claim.get("session"));
        let meta = named
            .meta
            .as_ref()
            .and_then(|meta| meta.get(crate::model::TERMINAL_SESSION_META));
        out.extend(
            [claimed, meta]
                .into_iter()
                .flatten()
                .filter_map(|session| session.as_str().map(str::to_string)),
        );
    }
    // A chat a message attaches is resolved (and its turn pinned) when the message is accepted.
    let messages = [
        named.action.as_ref().and_then(|action| action.get("message")),
        named.initial_message.as_ref(),
    ];
    let attached = messages
        .into_iter()
        .flatten()
        .filter_map(|message| message.get("attachments")?.as_array())
        .flatten()
        .filter(|attachment| attachment.get("type").and_then(|t| t.as_str()) == Some("chat"))
        .filter_map(|attachment| attachment.get("resource")?.as_str().map(str::to_string));
    out.extend(attached);
    out.extend(named.channel);
    out.extend(named.chat);
    out.extend(named.initial_subscriptions.unwrap_or_default());
    out.extend(named.subscriptions.unwrap_or_default());
    // A changeset is opened in its session, which must be loaded for it.
    let sessions: Vec<String> = out
        .iter()
        .filter_map(|channel| crate::model::changeset_uris::parse_uri(channel).map(|(session, _)| session))
        .collect();
    out.extend(sessions);
    out.into_iter()
        .filter(|c| {
            c.starts_with("ahp-session:")
                || c.starts_with("ahp-chat:")
                || c.starts_with(crate::model::TERMINAL_SCHEME)
                || c.starts_with(crate::model::changeset_uris::CHANGESET_SCHEME)
        })
        .collect()
}

/// The root state of a host as last stored: its configuration from the root's snapshot plus the root
/// actions logged after it, with `agents` as configured now.
pub(crate) async fn restore_root(
    store: &relay_store::Store,
    key: &relay_core::HostKey,
    agents: Vec<ahp_types::state::AgentInfo>,
) -> Result<RootState, relay_store::StoreError> {
    let mut root = RootState {
        config: Some(crate::model::default_root_config(&agents)),
        agents,
        active_sessions: None,
        terminals: None,
        meta: None,
    };
    let Some(record) = store
        .load_channel(&key.tenant, &key.host, ROOT_RESOURCE_URI)
        .await?
    else {
        return Ok(root);
    };
    match serde_json::from_str::<RootDocument>(&record.state) {
        Ok(doc) => {
            // The schema is this release's; the values are what the host's admins set.
            if let (Some(config), Some(stored)) = (root.config.as_mut(), doc.config) {
                config.values.extend(stored.values);
            }
            root.meta = doc.meta;
        }
        Err(error) => tracing::error!(host = %key, %error, "unreadable root snapshot; starting without it"),
    }
    for envelope in tail(&record) {
        apply_action_to_root(&mut root, &envelope.action);
    }
    Ok(root)
}

/// The log rows after a snapshot, parsed; unreadable rows are skipped with an error.
pub(crate) fn tail(record: &ChannelRecord) -> impl Iterator<Item = ActionEnvelope> + '_ {
    record.tail.iter().filter_map(
        |entry| match serde_json::from_str::<ActionEnvelope>(&entry.envelope) {
            Ok(envelope) => Some(envelope),
            Err(error) => {
                tracing::error!(seq = entry.seq, %error, "unreadable log row");
                None
            }
        },
    )
}
