//! The web client's state mirror: the official `ahp` reducers ([`ahp::MultiHostStateMirror`]) behind a small
//! JSON-in, JSON-out interface for JavaScript. Nothing here reduces anything itself. The SDK's mirror seeds
//! changesets from snapshots but does not apply their actions; this one keeps them and applies each with the
//! SDK's `apply_action_to_changeset`.

use ahp::hosts::HostId;
use ahp::MultiHostStateMirror;
use ahp_types::actions::ActionEnvelope;
use ahp_types::state::Snapshot;
use wasm_bindgen::prelude::*;

/// The page talks to one relay host, so every state is kept under this one host id.
const HOST: &str = "relay";

/// The states of the channels the page is subscribed to, moved only by `ahp`'s reducers.
#[wasm_bindgen]
pub struct Mirror {
    host: HostId,
    inner: MultiHostStateMirror,
    /// Changesets, by URI (reduced here with the SDK's changeset reducer).
    changesets: std::collections::HashMap<String, ahp_types::state::ChangesetState>,
}

impl Default for Mirror {
    fn default() -> Self {
        Self::new()
    }
}

#[wasm_bindgen]
impl Mirror {
    #[wasm_bindgen(constructor)]
    pub fn new() -> Mirror {
        Mirror {
            host: HostId::from(HOST),
            inner: MultiHostStateMirror::new(),
            changesets: Default::default(),
        }
    }

    /// Seeds (or replaces) a channel's state from a snapshot (`{resource, state, fromSeq}`) as JSON.
    #[wasm_bindgen(js_name = applySnapshot)]
    pub fn apply_snapshot(&mut self, snapshot: &str) -> Result<(), JsError> {
        let snapshot: Snapshot = serde_json::from_str(snapshot)?;
        if let ahp_types::state::SnapshotState::Changeset(state) = &snapshot.state {
            self.changesets
                .insert(snapshot.resource.clone(), state.as_ref().clone());
            return Ok(());
        }
        self.inner.apply_snapshot(&self.host, &snapshot);
        Ok(())
    }

    /// Applies one action envelope (`{channel, action, serverSeq, …}`) as JSON with the `ahp` reducers.
    #[wasm_bindgen(js_name = applyEnvelope)]
    pub fn apply_envelope(&mut self, envelope: &str) -> Result<(), JsError> {
        let envelope: ActionEnvelope = serde_json::from_str(envelope)?;
        if let Some(changeset) = self.changesets.get_mut(&envelope.channel) {
            ahp::reducers::apply_action_to_changeset(changeset, &envelope.action);
            return Ok(());
        }
        self.inner.apply_envelope(&self.host, &envelope);
        Ok(())
    }

    /// The state of a channel (root, session, chat, terminal or changeset) as JSON, or `undefined` when it is not mirrored.
    pub fn state(&self, uri: &str) -> Result<Option<String>, JsError> {
        if let Some(changeset) = self.changesets.get(uri) {
            return Ok(Some(serde_json::to_string(changeset)?));
        }
        Ok(state_json(&self.inner, &self.host, uri)?)
    }

    /// Forgets every channel (before seeding afresh).
    pub fn reset(&mut self) {
        self.inner.reset();
        self.changesets.clear();
    }
}

/// A mirrored channel's state as JSON: the one function both the page and the Rust agreement test read.
pub fn state_json(
    mirror: &MultiHostStateMirror,
    host: &HostId,
    uri: &str,
) -> Result<Option<String>, serde_json::Error> {
    if uri == ahp_types::common::ROOT_RESOURCE_URI {
        return mirror
            .root_states()
            .get(host)
            .map(serde_json::to_string)
            .transpose();
    }
    let key = ahp::HostedResourceKey::new(host.clone(), uri);
    if let Some(session) = mirror.sessions().get(&key) {
        return serde_json::to_string(session).map(Some);
    }
    if let Some(chat) = mirror.chats().get(&key) {
        return serde_json::to_string(chat).map(Some);
    }
    mirror.terminals().get(&key).map(serde_json::to_string).transpose()
}
