//! A session's checkpoints: its working directory committed to the tenant's shadow repository when a turn starts
//! and when it ends, the ids kept in the session's `_meta["ahpRelay/checkpoints"]`.

use relay_runner::files::{FileOp, FileReply};
use serde::{Deserialize, Serialize};

use crate::host::HostCore;
use crate::model::changeset_uris::*;

/// The checkpoints of a session (its `_meta["ahpRelay/checkpoints"]`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Checkpoints {
    /// The first one: what *All changes* compares with.
    pub base: Option<String>,
    /// Each turn's `(turn id, start, end)`, oldest first.
    #[serde(default)]
    pub turns: Vec<(String, Option<String>, Option<String>)>,
}

/// Which end of a turn a checkpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    Start,
    End,
}

impl HostCore {
    /// The working directory of `session` as a path (its first working directory, else the one its agent's
    /// provider gives it under the tenant's part of the workspace), where this host reaches files.
    pub(crate) fn working_directory_of(&self, session: &str) -> Option<String> {
        let files = self.providers.files()?;
        let record = self.model.sessions.get(session)?;
        // Only an agent with a workspace works in a directory (the demo agent has none).
        self.providers
            .get(&record.state.provider)
            .and_then(|provider| provider.workspace_root())?;
        if let Some(first) = record
            .state
            .working_directories
            .as_ref()
            .and_then(|dirs| dirs.first())
        {
            return Some(first.strip_prefix("file://").unwrap_or(first).to_string());
        }
        let root = files.tenant_root(&self.key.tenant)?;
        let dir = relay_runner::acp::workspace::default_session_dir(&root, &self.key.host, session);
        Some(dir.display().to_string())
    }

    pub(crate) fn checkpoints_of(&self, session: &str) -> Checkpoints {
        self.model
            .sessions
            .get(session)
            .and_then(|record| record.state.meta.as_ref())
            .and_then(|meta| meta.get(CHECKPOINTS_META))
            .and_then(|value| serde_json::from_value(value.clone()).ok())
            .unwrap_or_default()
    }

    /// Record a turn's checkpoint in its session's `_meta`.
    pub(crate) fn record_checkpoint(&mut self, session: &str, turn_id: &str, end: TurnEnd, commit: String) {
        let mut checkpoints = self.checkpoints_of(session);
        checkpoints.base.get_or_insert_with(|| commit.clone());
        match checkpoints.turns.iter_mut().find(|(id, _, _)| id == turn_id) {
            Some(entry) => match end {
                // A resumed turn keeps where it started.
                TurnEnd::Start => {
                    entry.1.get_or_insert(commit);
                }
                TurnEnd::End => entry.2 = Some(commit),
            },
            None => {
                let (start, finish) = match end {
                    TurnEnd::Start => (Some(commit), None),
                    TurnEnd::End => (None, Some(commit)),
                };
                checkpoints.turns.push((turn_id.to_string(), start, finish));
            }
        }
        let excess = checkpoints.turns.len().saturating_sub(MAX_TURNS_KEPT);
        checkpoints.turns.drain(..excess);
        let Ok(value) = serde_json::to_value(&checkpoints) else {
            return;
        };
        self.set_session_meta(session, CHECKPOINTS_META, value);
    }

    /// Checkpoint `chat`'s session for the start of turn `turn_id`, then run `then` (the turn's start) on the
    /// host. Returns false — and runs nothing — where there is nothing to checkpoint (no workspace here).
    pub(crate) fn checkpoint_then(
        &mut self,
        chat: &str,
        turn_id: &str,
        end: TurnEnd,
        then: impl FnOnce(&mut HostCore) + Send + 'static,
    ) -> bool {
        let Some(session) = self.model.chats.get(chat).map(|record| record.session.clone()) else {
            return false;
        };
        let (Some(files), Some(workspace)) = (
            self.providers.files().cloned(),
            self.working_directory_of(&session),
        ) else {
            return false;
        };
        let (Some(host), Ok(runtime)) = (self.host.upgrade(), tokio::runtime::Handle::try_current()) else {
            return false;
        };
        let tenant = self.key.tenant.clone();
        let turn_id = turn_id.to_string();
        let label = format!(
            "{turn_id} {}",
            if end == TurnEnd::Start { "start" } else { "end" }
        );
        let of_session = Some(session.clone());
        runtime.spawn(async move {
            let taken = files
                .call(
                    &tenant,
                    FileOp::Checkpoint {
                        workspace,
                        label,
                        session: of_session,
                    },
                )
                .await;
            host.with_core(|core| {
                match taken {
                    Ok(FileReply::Checkpoint { commit }) => {
                        core.record_checkpoint(&session, &turn_id, end, commit)
                    }
                    Ok(other) => tracing::warn!(?other, "a checkpoint answered something else"),
                    Err(error) => tracing::warn!(%session, %error, "no checkpoint of the working directory"),
                }
                then(core);
                if end == TurnEnd::End {
                    core.refresh_changesets(&session);
                }
            });
        });
        true
    }

    /// The session is going: its working directory's checkpoints are forgotten by the file server (in the
    /// background).
    pub(crate) fn forget_checkpoints_of(&mut self, session: &str) {
        let (Some(files), Some(workspace)) = (
            self.providers.files().cloned(),
            self.working_directory_of(session),
        ) else {
            return;
        };
        if self.checkpoints_of(session).base.is_none() {
            return;
        }
        let tenant = self.key.tenant.clone();
        let session = Some(session.to_string());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let forgotten = files
                    .call(&tenant, FileOp::ForgetCheckpoints { workspace, session })
                    .await;
                if let Err(error) = forgotten {
                    tracing::warn!(%error, "a disposed session's checkpoints were not forgotten");
                }
            });
        }
    }
}
