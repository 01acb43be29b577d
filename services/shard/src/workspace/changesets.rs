//! Changesets: what a session's turns changed in its working directory, over AHP. Each session with a
//! workspace advertises two (`session/changesetsChanged`): *This turn's changes*
//! (`ahp-changeset:/<session>/turn/{turnId}`, kind `turn`) and *All changes* (`ahp-changeset:/<session>/all`,
//! kind `session`), both reviewable. A changeset channel is opened when a client subscribes to it: its state
//! lists each changed file with its `FileEdit` — both sides as `ahp-checkpoint:` content refs any client reads
//! with `resourceRead`, and the added/removed line counts — computed by the tenant's file server
//! ([`relay_runner::files`]). Review marks (`changeset/filesReviewChanged`) are devices' actions, stored with the
//! channel (the session's child in the store, restored with it). `invokeChangesetOperation` reverts a file or
//! all of them (the files are written back as they were) and, where the working directory is a git repository
//! of its own, stages a file or commits everything; the operation's status is shown while it runs, and every
//! open changeset of the session is computed again after it.
//!
//! The working directory is checkpointed (a commit in the tenant's shadow repository) when a turn starts —
//! before its agent gets the prompt — and when it ends; the session's first checkpoint is its base. A turn's
//! changeset lists the files its two checkpoints differ in and that still differ from its start (a reverted
//! file leaves it); *All changes* compares the base with the directory now. The checkpoints' ids are kept in
//! the session's `_meta["ahpRelay/checkpoints"]` (the newest [`MAX_TURNS_KEPT`] turns).

use std::collections::BTreeMap;
use std::sync::Arc;

use ahp_types::actions::{
    ChangesetFileRemovedAction, ChangesetFileSetAction, ChangesetOperationStatusChangedAction,
    ChangesetStatusChangedAction, SessionMetaChangedAction, StateAction,
};
use ahp_types::commands::{
    ChangesetOperationTarget, InvokeChangesetOperationParams, InvokeChangesetOperationResult,
};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{
    Changeset, ChangesetCapabilities, ChangesetFile, ChangesetOperation, ChangesetOperationScope,
    ChangesetOperationStatus, ChangesetState, ChangesetStatus, ContentRef, ErrorInfo, FileEdit,
    FileEditDiffStats, FileEditSide,
};
use relay_core::link::CommandReply;
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::ConnectionId;
use relay_runner::files::{ChangedFile, FileAccess, FileOp, FileReply, RepositoryOp};
use serde::{Deserialize, Serialize};

use crate::host::{Host, HostCore};
use crate::model::{ChangesetRecord, ChangesetScope, ChannelKind, SnapshotClock};
use crate::reply::{answer, reply, CommandResult};

/// The URI scheme of changeset channels.
pub const CHANGESET_SCHEME: &str = "ahp-changeset:";
/// The URI scheme of a file as a checkpoint holds it (`ahp-checkpoint:/<blob id>/<path in the working directory>`).
pub const CHECKPOINT_SCHEME: &str = "ahp-checkpoint:";
/// Where a session keeps its checkpoints.
pub const CHECKPOINTS_META: &str = "ahpRelay/checkpoints";
/// Turns whose checkpoints a session keeps.
pub const MAX_TURNS_KEPT: usize = 200;
/// The `_meta` key of a commit operation's message.
pub const COMMIT_MESSAGE_META: &str = "ahpRelay/commitMessage";

/// The checkpoints of a session (its `_meta["ahpRelay/checkpoints"]`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Checkpoints {
    /// The first one: what *All changes* compares with.
    pub base: Option<String>,
    /// Each turn's `(turn id, start, end)`, oldest first.
    #[serde(default)]
    pub turns: Vec<(String, Option<String>, Option<String>)>,
}

/// Carry the host's own keys of a session's `_meta` (its checkpoints) into a `session/metaChanged` from its
/// agent, which replaces the whole object.
pub fn keep_host_meta(
    model: &crate::model::HostModel,
    session: &str,
    changed: &mut SessionMetaChangedAction,
) {
    let kept = model
        .sessions
        .get(session)
        .and_then(|record| record.state.meta.as_ref())
        .and_then(|meta| meta.get(CHECKPOINTS_META))
        .cloned();
    if let Some(kept) = kept {
        changed
            .meta
            .get_or_insert_with(Default::default)
            .insert(CHECKPOINTS_META.into(), kept);
    }
}

/// Which end of a turn a checkpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    Start,
    End,
}

fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = std::str::from_utf8(bytes.get(at + 1..at + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A path's segments encoded for a URI (its slashes kept).
fn encode_path(path: &str) -> String {
    path.split('/').map(encode).collect::<Vec<_>>().join("/")
}

/// The session and scope a changeset URI names.
pub fn parse_uri(uri: &str) -> Option<(String, ChangesetScope)> {
    let rest = uri.strip_prefix(CHANGESET_SCHEME)?.strip_prefix('/')?;
    let (session, scope) = rest.split_once('/')?;
    let session = decode(session)?;
    let scope = match scope.split_once('/') {
        None if scope == "all" => ChangesetScope::All,
        Some(("turn", turn)) if !turn.is_empty() => ChangesetScope::Turn {
            turn_id: decode(turn)?,
        },
        _ => return None,
    };
    Some((session, scope))
}

/// The URI of a changeset of `session`.
pub fn uri_of(session: &str, scope: &ChangesetScope) -> String {
    match scope {
        ChangesetScope::All => format!("{CHANGESET_SCHEME}/{}/all", encode(session)),
        ChangesetScope::Turn { turn_id } => {
            format!("{CHANGESET_SCHEME}/{}/turn/{}", encode(session), encode(turn_id))
        }
    }
}

/// The commit and path an `ahp-checkpoint:` URI names.
pub fn parse_checkpoint_uri(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix(CHECKPOINT_SCHEME)?.strip_prefix('/')?;
    let (commit, path) = rest.split_once('/')?;
    let path = path
        .split('/')
        .map(decode)
        .collect::<Option<Vec<String>>>()?
        .join("/");
    Some((commit.to_string(), path))
}

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

fn operation(
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
fn operations(repository: bool) -> Vec<ChangesetOperation> {
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

fn error_info(error_type: &str, message: impl Into<String>) -> ErrorInfo {
    ErrorInfo {
        error_type: error_type.into(),
        message: message.into(),
        stack: None,
        meta: None,
    }
}

/// A changed file as a changeset lists it: both sides name the file's blob (so an unchanged change is the same
/// edit however often it is computed, and keeps its review mark).
fn changeset_file(workspace: &str, changed: &ChangedFile) -> ChangesetFile {
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
    fn record_checkpoint(&mut self, session: &str, turn_id: &str, end: TurnEnd, commit: String) {
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
        let mut meta = self
            .model
            .sessions
            .get(session)
            .and_then(|record| record.state.meta.clone())
            .unwrap_or_default();
        let Ok(value) = serde_json::to_value(&checkpoints) else {
            return;
        };
        meta.insert(CHECKPOINTS_META.into(), value);
        self.apply_server_action(
            session,
            StateAction::SessionMetaChanged(SessionMetaChangedAction { meta: Some(meta) }),
        );
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
    fn changesets_of(&self, session: &str) -> Vec<String> {
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
    fn compute_changeset(&mut self, uri: &str) {
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

    fn apply_computed(&mut self, uri: &str, computed: Result<(Vec<ChangesetFile>, bool), ErrorInfo>) {
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
async fn compute(
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

impl Host {
    /// `invokeChangesetOperation`: run a changeset's operation, showing its status; every open changeset of
    /// the session is computed again after it.
    pub(crate) async fn invoke_changeset_operation(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> CommandReply {
        answer(
            message.id,
            self.run_changeset_operation(connection, message).await,
        )
    }

    async fn run_changeset_operation(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> CommandResult {
        let params: InvokeChangesetOperationParams = message.parse_params()?;
        let prepared = self.with_core(|core| {
            // The host first: once prepared, the operation shows `running` until the task settles it.
            let host = core
                .host
                .upgrade()
                .ok_or_else(|| RpcError::internal("the host is going away"))?;
            let prepared = core.prepare_operation(connection, &params)?;
            Ok::<_, RpcError>((prepared, host))
        });
        let ((files, tenant, op, session), host) = prepared?;
        let uri = params.channel.clone();
        let operation_id = params.operation_id.clone();
        // The operation is the host's, not the request's: a request dropped meanwhile (its client gone, the
        // gateway's call timeout) still settles its status, which would otherwise stay `running` for ever.
        let settled = tokio::spawn(async move {
            let outcome = files.call(&tenant, op).await;
            let failure = outcome.as_ref().err().map(|error| error.to_string());
            host.with_core(|core| {
                core.apply_server_action(
                    &uri,
                    StateAction::ChangesetOperationStatusChanged(ChangesetOperationStatusChangedAction {
                        operation_id,
                        status: if failure.is_some() {
                            ahp_types::state::ChangesetOperationStatus::Error
                        } else {
                            ahp_types::state::ChangesetOperationStatus::Idle
                        },
                        error: failure.clone().map(|why| error_info("operationFailed", why)),
                    }),
                );
                core.refresh_changesets(&session);
            });
            outcome
        });
        let outcome = settled
            .await
            .map_err(|_| RpcError::internal("the operation's task was lost"))?;
        match outcome {
            Ok(FileReply::Checkpoint { commit }) => reply(
                message.id,
                &InvokeChangesetOperationResult {
                    message: Some(StringOrMarkdown::Plain(format!("Committed {commit}"))),
                    follow_up: None,
                },
            ),
            Ok(_) => reply(message.id, &InvokeChangesetOperationResult::default()),
            Err(error) => Err(crate::reply::file_error(error)),
        }
    }
}

impl HostCore {
    /// Check an operation against the changeset's state and mark it running: the file operation to run.
    fn prepare_operation(
        &mut self,
        connection: ConnectionId,
        params: &InvokeChangesetOperationParams,
    ) -> Result<(Arc<dyn FileAccess>, String, FileOp, String), RpcError> {
        self.client_id(connection)?;
        if !self.connection(connection)?.identity.role.can_write() {
            return Err(RpcError::permission_denied(
                "viewers may review changes, not change files",
            ));
        }
        self.open_changeset(&params.channel);
        let Some(record) = self.model.changesets.get(&params.channel) else {
            return Err(RpcError::not_found(&params.channel));
        };
        let Some(operation) = record
            .state
            .operations
            .iter()
            .flatten()
            .find(|operation| operation.id == params.operation_id)
            .cloned()
        else {
            return Err(RpcError::invalid_params(format!(
                "{} has no operation {}",
                params.channel, params.operation_id
            )));
        };
        if operation.status == ChangesetOperationStatus::Running {
            return Err(RpcError::invalid_request(format!(
                "{} is already running",
                operation.label
            )));
        }
        let scope = match &params.target {
            None => ChangesetOperationScope::Changeset,
            Some(ChangesetOperationTarget::Resource { .. }) => ChangesetOperationScope::Resource,
            Some(ChangesetOperationTarget::Range { .. }) => ChangesetOperationScope::Range,
            Some(_) => return Err(RpcError::invalid_params("unknown operation target")),
        };
        if !operation.scopes.contains(&scope) {
            return Err(RpcError::invalid_params(format!(
                "{} does not take this target",
                operation.label
            )));
        }
        let files = self
            .providers
            .files()
            .cloned()
            .ok_or_else(|| RpcError::internal("this relay holds no workspace"))?;
        let session = record.session.clone();
        let workspace = self
            .working_directory_of(&session)
            .ok_or_else(|| RpcError::internal("this session has no working directory here"))?;
        self.scope_reaches(connection, &workspace)?;
        // The files the target names (by id, or by either side's file URI).
        let targeted: Vec<String> = match &params.target {
            Some(ChangesetOperationTarget::Resource { resource, .. }) => {
                let file = record.state.files.iter().find(|file| {
                    file.id == *resource
                        || file
                            .edit
                            .before
                            .as_ref()
                            .is_some_and(|side| side.uri == *resource)
                        || file.edit.after.as_ref().is_some_and(|side| side.uri == *resource)
                });
                match file {
                    Some(file) => vec![file.id.clone()],
                    None => {
                        return Err(RpcError::invalid_params(format!(
                            "{resource} is not a file of this changeset"
                        )))
                    }
                }
            }
            _ => record.state.files.iter().map(|file| file.id.clone()).collect(),
        };
        let checkpoints = self.checkpoints_of(&session);
        let before = match &record.scope {
            ChangesetScope::All => checkpoints.base.clone(),
            ChangesetScope::Turn { turn_id } => checkpoints
                .turns
                .iter()
                .find(|(id, _, _)| id == turn_id)
                .and_then(|(_, start, _)| start.clone()),
        };
        let op = match operation.id.as_str() {
            "revert-file" | "revert-all" => FileOp::Restore {
                workspace,
                commit: before.ok_or_else(|| RpcError::invalid_request("nothing to revert to yet"))?,
                paths: targeted,
            },
            "stage" => FileOp::Repository {
                workspace,
                action: RepositoryOp::Stage { paths: targeted },
            },
            "commit" => {
                let title = self
                    .model
                    .sessions
                    .get(&session)
                    .map(|record| record.state.title.clone())
                    .filter(|title| !title.is_empty())
                    .unwrap_or_else(|| "an ahp-relay session".into());
                let message = params
                    .meta
                    .as_ref()
                    .and_then(|meta| meta.get(COMMIT_MESSAGE_META))
                    .and_then(|message| message.as_str())
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("Changes from {title}"));
                FileOp::Repository {
                    workspace,
                    action: RepositoryOp::Commit { message },
                }
            }
            other => return Err(RpcError::invalid_params(format!("unknown operation {other}"))),
        };
        self.apply_server_action(
            &params.channel,
            StateAction::ChangesetOperationStatusChanged(ChangesetOperationStatusChangedAction {
                operation_id: operation.id.clone(),
                status: ChangesetOperationStatus::Running,
                error: None,
            }),
        );
        Ok((files, self.key.tenant.clone(), op, session))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_runner::files::ChangeStatus;

    #[test]
    fn changeset_uris_round_trip_whatever_the_session_is_called() {
        for session in [
            "ahp-session:/plain",
            "ahp-session:/with/slashes and {braces}%",
            "ahp-session:/ü",
        ] {
            for scope in [
                ChangesetScope::All,
                ChangesetScope::Turn {
                    turn_id: "t/1 {x}".into(),
                },
            ] {
                let uri = uri_of(session, &scope);
                assert!(!uri[CHANGESET_SCHEME.len()..].contains(['{', '}']), "{uri}");
                assert_eq!(
                    parse_uri(&uri),
                    Some((session.to_string(), scope.clone())),
                    "{uri}"
                );
            }
            let template = &catalogue(session)[0].uri_template;
            let expanded = template.replace("{turnId}", "t9");
            assert_eq!(
                parse_uri(&expanded),
                Some((session.to_string(), ChangesetScope::Turn { turn_id: "t9".into() }))
            );
        }
        assert_eq!(parse_uri("ahp-changeset:/x/other"), None);
        assert_eq!(parse_uri("ahp-changeset:/%zz/all"), None);
    }

    #[test]
    fn a_checkpoint_uri_names_its_blob_and_path() {
        let changed = ChangedFile {
            path: "src/a b%.rs".into(),
            status: ChangeStatus::Modified,
            added: Some(2),
            removed: Some(1),
            before: Some("c0ffee1".into()),
            after: Some("c0ffee2".into()),
        };
        let file = changeset_file("/w", &changed);
        let before = file.edit.before.expect("before");
        assert_eq!(before.uri, "file:///w/src/a b%.rs");
        assert_eq!(
            parse_checkpoint_uri(&before.content.uri),
            Some(("c0ffee1".into(), "src/a b%.rs".into()))
        );
        let added = changeset_file(
            "/w",
            &ChangedFile {
                status: ChangeStatus::Added,
                before: None,
                ..changed
            },
        );
        assert!(added.edit.before.is_none() && added.edit.after.is_some());
    }
}
