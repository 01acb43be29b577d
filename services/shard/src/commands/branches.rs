//! The git branch a session works on, as a dynamic session setting. Where the working directory a client names is
//! a git repository, `resolveSessionConfig` adds a `branch` property (`enumDynamic`; its current branch the
//! default; a value must be one of the repository's branches), `sessionConfigCompletions` lists the branches
//! matching what the user typed, and `createSession` has the session start on the chosen one (its provider
//! switches to it in the session's own sandbox before the agent starts). The branches are read by the tenant's
//! file server ([`relay_runner::files`]).

use std::sync::Arc;

use ahp_types::commands::{
    ResolveSessionConfigParams, SessionConfigCompletionsParams, SessionConfigCompletionsResult,
    SessionConfigValueItem,
};
use ahp_types::state::SessionConfigPropertySchema;
use relay_core::link::CommandReply;
use relay_core::rpc::InboundMessage;
use relay_core::ConnectionId;
use relay_runner::files::{FileAccess, FileOp, FileReply, RepositoryOp};

use crate::host::Host;
use crate::reply::{answer, reply};

/// The property naming the session's branch.
pub const BRANCH_PROPERTY: &str = "branch";
/// Branches one answer lists at most.
const MAX_ITEMS: usize = 100;

/// The branch property of a repository whose current branch is `current`.
fn branch_property(current: Option<&str>) -> SessionConfigPropertySchema {
    SessionConfigPropertySchema {
        r#type: "string".into(),
        title: "Git branch".into(),
        description: Some("The branch the session works on: its agent starts there".into()),
        default: current.map(|branch| serde_json::Value::String(branch.to_string())),
        r#enum: None,
        enum_labels: None,
        enum_descriptions: None,
        read_only: None,
        items: None,
        min_items: None,
        max_items: None,
        properties: None,
        required: None,
        additional_properties: None,
        enum_dynamic: Some(true),
        session_mutable: Some(false),
    }
}

/// The repository's current branch and its branches, when `directory` (a `file://` URI or path) is one.
async fn branches_of(
    files: &Arc<dyn FileAccess>,
    tenant: &str,
    directory: &str,
) -> Option<(Option<String>, Vec<String>)> {
    let workspace = directory.strip_prefix("file://").unwrap_or(directory).to_string();
    match files
        .call(
            tenant,
            FileOp::Repository {
                workspace,
                action: RepositoryOp::Branches,
            },
        )
        .await
    {
        Ok(FileReply::Branches { current, branches }) => Some((current, branches)),
        _ => None,
    }
}

impl Host {
    /// The file access and tenant for a connection's request, where this host reaches files.
    fn files_for(&self, connection: ConnectionId) -> Option<(Arc<dyn FileAccess>, String)> {
        self.with_core(|core| {
            core.client_id(connection).ok()?;
            Some((core.providers.files()?.clone(), core.key.tenant.clone()))
        })
    }

    /// `resolveSessionConfig` for a working directory that is a git repository: the agent's settings plus the
    /// branch. `None` when it is not one (or names none): the host's other answer serves.
    pub(crate) async fn resolve_with_branch(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> Option<CommandReply> {
        let params: ResolveSessionConfigParams = message.parse_params().ok()?;
        let directory = params.working_directory.clone()?;
        if let Err(refused) = self.with_core(|core| core.scope_reaches(connection, &directory)) {
            return Some(answer(message.id, Err(refused)));
        }
        let (files, tenant) = self.files_for(connection)?;
        let (current, branches) = branches_of(&files, &tenant, &directory).await?;
        let resolved = self.with_core(|core| core.resolved_config(&params));
        let mut resolved = match resolved {
            Ok(resolved) => resolved,
            Err(error) => return Some(answer(message.id, Err(error))),
        };
        resolved
            .schema
            .properties
            .insert(BRANCH_PROPERTY.into(), branch_property(current.as_deref()));
        let asked = params
            .config
            .as_ref()
            .and_then(|config| config.get(BRANCH_PROPERTY))
            .and_then(|value| value.as_str())
            .filter(|branch| branches.iter().any(|known| known == branch))
            .map(str::to_string);
        if let Some(branch) = asked.or(current) {
            resolved
                .values
                .insert(BRANCH_PROPERTY.into(), serde_json::Value::String(branch));
        }
        Some(answer(message.id, reply(message.id, &resolved)))
    }

    /// `sessionConfigCompletions` of the branch property: the repository's branches containing the query.
    /// `None` for any other property (the host's other answer serves).
    pub(crate) async fn branch_completions(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> Option<CommandReply> {
        let params: SessionConfigCompletionsParams = message.parse_params().ok()?;
        if params.property != BRANCH_PROPERTY {
            return None;
        }
        let directory = params.working_directory.clone()?;
        if let Err(refused) = self.with_core(|core| core.scope_reaches(connection, &directory)) {
            return Some(answer(message.id, Err(refused)));
        }
        let (files, tenant) = self.files_for(connection)?;
        let (_, branches) = branches_of(&files, &tenant, &directory).await.unwrap_or_default();
        let query = params.query.unwrap_or_default().to_lowercase();
        let items: Vec<SessionConfigValueItem> = branches
            .into_iter()
            .filter(|branch| branch.to_lowercase().contains(&query))
            .take(MAX_ITEMS)
            .map(|branch| SessionConfigValueItem {
                label: branch.clone(),
                value: branch,
                description: None,
            })
            .collect();
        Some(answer(
            message.id,
            reply(message.id, &SessionConfigCompletionsResult { items }),
        ))
    }
}
