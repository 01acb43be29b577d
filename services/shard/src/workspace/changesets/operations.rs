//! `invokeChangesetOperation`: reverting a file or all of them, staging a file or committing everything, with
//! the operation's status shown while it runs.

use std::sync::Arc;

use ahp_types::actions::{ChangesetOperationStatusChangedAction, StateAction};
use ahp_types::commands::{
    ChangesetOperationTarget, InvokeChangesetOperationParams, InvokeChangesetOperationResult,
};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{ChangesetOperationScope, ChangesetOperationStatus};
use relay_core::link::CommandReply;
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::ConnectionId;
use relay_runner::files::{FileAccess, FileOp, FileReply, RepositoryOp};

use super::channels::*;
use crate::host::{Host, HostCore};
use crate::model::changeset_uris::*;
use crate::model::ChangesetScope;
use crate::reply::{answer, reply, CommandResult};

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

    pub(crate) async fn run_changeset_operation(
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
    pub(crate) fn prepare_operation(
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
