//! Changeset channels: the session's catalogue of them, a channel opened when a client subscribes, its files
//! computed by the tenant's file server (and computed again after a turn or an operation), disposed with the
//! session.

use std::collections::BTreeMap;

use ahp_types::actions::{
    ChangesetFileRemovedAction, ChangesetFileSetAction, ChangesetStatusChangedAction, StateAction,
};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{
    Changeset, ChangesetCapabilities, ChangesetFile, ChangesetOperation, ChangesetOperationScope,
    ChangesetOperationStatus, ChangesetState, ChangesetStatus, ContentRef, ErrorInfo, FileEdit,
    FileEditDiffStats, FileEditSide,
};
use relay_runner::files::{ChangedFile, FileAccess, FileOp, FileReply, RepositoryOp};

use super::checkpoints::*;
use crate::host::HostCore;
use crate::model::changeset_uris::*;
use crate::model::{ChangesetRecord, ChangesetScope, ChannelKind, SnapshotClock};

/// The session's changeset catalogue.
pub fn catalogue(session: &str) -> Vec<Changeset> {
    let review = Some(ChangesetCapabilities {
        review: Some(Default::default()),
    });
    vec![
        Changeset {
            label: "This turn's changes".into(),
            uri_template: format!("{CHANGESET_SCHEME}/{}/turn/{{turnId}}", encode(session)),
            description: Some("The files a turn changed in the working directory".into()),
            change_kind: "turn".into(),
            capabilities: review.clone(),
        },
        Changeset {
            label: "All changes".into(),
            uri_template: uri_of(session, &ChangesetScope::All),
            description: Some("Every change in the working directory since the session's first turn".into()),
            change_kind: "session".into(),
            capabilities: review,
        },
    ]
}

pub(crate) fn operation(
    id: &str,
    label: &str,
    scope: ChangesetOperationScope,
    confirmation: Option<&str>,
) -> ChangesetOperation {
    ChangesetOperation {
        id: id.into(),
        label: label.into(),
        description: None,
        scopes: vec![scope],
        confirmation: confirmation.map(|text| StringOrMarkdown::Plain(text.into())),
        icon: None,
        group: None,
        status: ChangesetOperationStatus::Idle,
        error: None,
    }
}

/// The operations of a changeset (stage and commit where the working directory is a repository).
pub(crate) fn operations(repository: bool) -> Vec<ChangesetOperation> {
    let mut list = vec![
        operation(
            "revert-file",
            "Revert file",
            ChangesetOperationScope::Resource,
            Some("Put this file back as it was before these changes? Its changes are lost."),
        ),
        operation(
            "revert-all",
            "Revert all",
            ChangesetOperationScope::Changeset,
            Some("Put every file of this changeset back as it was before? All its changes are lost."),
        ),
    ];
    if repository {
        list.push(operation(
            "stage",
            "Stage",
            ChangesetOperationScope::Resource,
            None,
        ));
        list.push(operation(
            "commit",
            "Commit",
            ChangesetOperationScope::Changeset,
            Some("Commit every change in the working directory to its git repository?"),
        ));
    }
    list
}

pub(crate) fn error_info(error_type: &str, message: impl Into<String>) -> ErrorInfo {
    ErrorInfo {
        error_type: error_type.into(),
        message: message.into(),
        stack: None,
        meta: None,
    }
}

/// A changed file as a changeset lists it: both sides name the file's blob (so an unchanged change is the same
/// edit however often it is computed, and keeps its review mark).
pub(crate) fn changeset_file(workspace: &str, changed: &ChangedFile) -> ChangesetFile {
    let file_uri = format!("file://{}/{}", workspace.trim_end_matches('/'), changed.path);
    let side = |blob: &String| FileEditSide {
        uri: file_uri.clone(),
        content: ContentRef {
            uri: format!("{CHECKPOINT_SCHEME}/{blob}/{}", encode_path(&changed.path)),
            size_hint: None,
            content_type: None,
            nonce: None,
        },
    };
    ChangesetFile {
        id: changed.path.clone(),
        edit: FileEdit {
            before: changed.before.as_ref().map(side),
            after: changed.after.as_ref().map(side),
            diff: Some(FileEditDiffStats {
                added: changed.added.and_then(|n| i64::try_from(n).ok()),
                removed: changed.removed.and_then(|n| i64::try_from(n).ok()),
            }),
        },
        reviewed: None,
        meta: None,
    }
}

impl HostCore {
    /// Open the changeset channel `uri` if it names a changeset of a session here and is not open yet: its
    /// state is computed in the background.
    pub(crate) fn open_changeset(&mut self, uri: &str) {
        if self.model.kind(uri) != ChannelKind::Unknown || self.providers.files().is_none() {
            return;
        }
        let Some((session, scope)) = parse_uri(uri) else {
            return;
        };
        // Only a changeset of a session here, named as the catalogue names it, of a turn that has checkpoints:
        // nobody can make the host keep (and compute) changesets of made-up turns.
        if !self.model.sessions.contains_key(&session) || uri_of(&session, &scope) != uri {
            return;
        }
        if let ChangesetScope::Turn { turn_id } = &scope {
            if !self
                .checkpoints_of(&session)
                .turns
                .iter()
                .any(|(id, _, _)| id == turn_id)
            {
                return;
            }
        }
        self.model.changesets.insert(
            uri.to_string(),
            ChangesetRecord {
                session,
                scope,
                state: ChangesetState {
                    status: ChangesetStatus::Computing,
                    error: None,
                    files: Vec::new(),
                    operations: Some(operations(false)),
                },
                clock: SnapshotClock::fresh(),
            },
        );
        self.store_snapshot(uri);
        self.compute_changeset(uri);
    }

    /// A client subscribes to `uri`: open it, or compute it again (the files may have changed since).
    pub(crate) fn changeset_subscribed(&mut self, uri: &str) {
        match self
            .model
            .changesets
            .get(uri)
            .map(|record| record.state.status.clone())
        {
            None => self.open_changeset(uri),
            Some(ChangesetStatus::Computing | ChangesetStatus::Recomputing) => {}
            Some(_) => self.compute_changeset(uri),
        }
    }

    /// The open changesets of `session`.
    pub(crate) fn changesets_of(&self, session: &str) -> Vec<String> {
        self.model
            .changesets
            .iter()
            .filter(|(_, record)| record.session == session)
            .map(|(uri, _)| uri.clone())
            .collect()
    }

    /// Compute every open changeset of `session` again.
    pub(crate) fn refresh_changesets(&mut self, session: &str) {
        for uri in self.changesets_of(session) {
            self.compute_changeset(&uri);
        }
    }

    /// Compute `uri`'s files in the background and apply them as `changeset/*` actions.
    pub(crate) fn compute_changeset(&mut self, uri: &str) {
        let Some(record) = self.model.changesets.get(uri) else {
            return;
        };
        let session = record.session.clone();
        let scope = record.scope.clone();
        let (Some(files), Some(workspace)) = (
            self.providers.files().cloned(),
            self.working_directory_of(&session),
        ) else {
            return;
        };
        let (Some(host), Ok(runtime)) = (self.host.upgrade(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        if !matches!(record.state.status, ChangesetStatus::Computing) {
            self.apply_server_action(
                uri,
                StateAction::ChangesetStatusChanged(ChangesetStatusChangedAction {
                    status: ChangesetStatus::Recomputing,
                    error: None,
                }),
            );
        }
        let checkpoints = self.checkpoints_of(&session);
        let tenant = self.key.tenant.clone();
        let uri = uri.to_string();
        runtime.spawn(async move {
            let computed = compute(&*files, &tenant, &workspace, &session, &scope, &checkpoints).await;
            host.with_core(|core| core.apply_computed(&uri, computed));
        });
    }

    pub(crate) fn apply_computed(
        &mut self,
        uri: &str,
        computed: Result<(Vec<ChangesetFile>, bool), ErrorInfo>,
    ) {
        let Some(record) = self.model.changesets.get(uri) else {
            return;
        };
        let (files, repository) = match computed {
            Ok(computed) => computed,
            Err(error) => {
                self.apply_server_action(
                    uri,
                    StateAction::ChangesetStatusChanged(ChangesetStatusChangedAction {
                        status: ChangesetStatus::Error,
                        error: Some(error),
                    }),
                );
                return;
            }
        };
        let current: BTreeMap<String, ChangesetFile> = record
            .state
            .files
            .iter()
            .map(|file| (file.id.clone(), file.clone()))
            .collect();
        let wanted_operations = operations(repository);
        let operations_differ = record
            .state
            .operations
            .as_ref()
            .map(|listed| listed.iter().map(|op| &op.id).collect::<Vec<_>>())
            != Some(wanted_operations.iter().map(|op| &op.id).collect());
        let mut actions = Vec::new();
        for id in current.keys() {
            if !files.iter().any(|file| &file.id == id) {
                actions.push(StateAction::ChangesetFileRemoved(ChangesetFileRemovedAction {
                    file_id: id.clone(),
                }));
            }
        }
        for mut file in files {
            // A review mark stays while the file's change is the same.
            if let Some(before) = current.get(&file.id) {
                if before.edit == file.edit {
                    continue;
                }
                file.reviewed = None;
            }
            actions.push(StateAction::ChangesetFileSet(ChangesetFileSetAction { file }));
        }
        if operations_differ {
            actions.push(StateAction::ChangesetOperationsChanged(
                ahp_types::actions::ChangesetOperationsChangedAction {
                    operations: Some(wanted_operations),
                },
            ));
        }
        actions.push(StateAction::ChangesetStatusChanged(
            ChangesetStatusChangedAction {
                status: ChangesetStatus::Ready,
                error: None,
            },
        ));
        for action in actions {
            self.apply_server_action(uri, action);
        }
        self.store_snapshot(uri);
    }

    /// A changeset's files and review marks go with it: the store forgets it.
    pub(crate) fn dispose_changesets_of(&mut self, session: &str) -> Vec<String> {
        let gone = self.changesets_of(session);
        for uri in &gone {
            self.model.changesets.remove(uri);
            self.seq.dispose(uri);
        }
        gone
    }
}

/// A changeset's files, and whether the working directory is a git repository.
pub(crate) async fn compute(
    files: &dyn FileAccess,
    tenant: &str,
    workspace: &str,
    session: &str,
    scope: &ChangesetScope,
    checkpoints: &Checkpoints,
) -> Result<(Vec<ChangesetFile>, bool), ErrorInfo> {
    let failed = |error: relay_runner::files::FileError| error_info("changesetFailed", error.to_string());
    let repository = matches!(
        files
            .call(
                tenant,
                FileOp::Repository {
                    workspace: workspace.to_string(),
                    action: RepositoryOp::Inspect,
                },
            )
            .await,
        Ok(FileReply::Repository { is_repository: true })
    );
    let now = || async {
        match files
            .call(
                tenant,
                FileOp::Checkpoint {
                    workspace: workspace.to_string(),
                    label: "now".into(),
                    session: Some(session.to_string()),
                },
            )
            .await
            .map_err(failed)?
        {
            FileReply::Checkpoint { commit } => Ok(commit),
            _ => Err(error_info(
                "changesetFailed",
                "the file server answered something else",
            )),
        }
    };
    let changes = |from: String, to: String| async move {
        match files
            .call(tenant, FileOp::Changes { from, to })
            .await
            .map_err(failed)?
        {
            FileReply::Changes { files } => Ok(files),
            _ => Err(error_info(
                "changesetFailed",
                "the file server answered something else",
            )),
        }
    };
    let listed = match scope {
        ChangesetScope::All => {
            let Some(base) = checkpoints.base.clone() else {
                // No turn ran yet: nothing changed.
                return Ok((Vec::new(), repository));
            };
            let now = now().await?;
            changes(base.clone(), now.clone())
                .await?
                .iter()
                .map(|changed| changeset_file(workspace, changed))
                .collect()
        }
        ChangesetScope::Turn { turn_id } => {
            let Some((_, Some(start), end)) =
                checkpoints.turns.iter().find(|(id, _, _)| id == turn_id).cloned()
            else {
                return Err(error_info(
                    "noCheckpoints",
                    format!("no checkpoints of the working directory for turn {turn_id}"),
                ));
            };
            let now = now().await?;
            // A running turn shows its changes so far.
            let end = end.unwrap_or_else(|| now.clone());
            let turn = changes(start.clone(), end.clone()).await?;
            let still = changes(start.clone(), now).await?;
            turn.iter()
                .filter(|changed| still.iter().any(|other| other.path == changed.path))
                .map(|changed| changeset_file(workspace, changed))
                .collect()
        }
    };
    Ok((listed, repository))
}
