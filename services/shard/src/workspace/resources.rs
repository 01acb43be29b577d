//! AHP's `resource*` commands on `file:` URIs: a client reads and changes files of its tenant's part of the
//! agents' workspace, served by the tenant's file server in a sandbox of the tenant
//! ([`relay_runner::files`]). Here: the commands' parameters into file operations, the role rule (viewers read,
//! never write), and the answers and errors AHP defines. URIs name paths literally (`file://<path>`), as the
//! relay's `defaultDirectory` does.

use ahp_types::commands::{
    ContentEncoding, DirectoryEntry, ResourceCopyParams, ResourceDeleteParams, ResourceListParams,
    ResourceListResult, ResourceMkdirParams, ResourceMoveParams, ResourceReadParams, ResourceReadResult,
    ResourceRequestParams, ResourceResolveParams, ResourceResolveResult, ResourceType, ResourceWriteMode,
    ResourceWriteParams,
};
use ahp_types::errors::ahp_error_codes;
use base64::Engine;
use relay_core::link::CommandReply;
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::ConnectionId;
use relay_runner::files::{EntryKind, FileOp, FileReply, WriteMode};

use crate::host::Host;
use crate::reply::{answer, file_error, reply, CommandResult};

/// The commands served here.
pub const RESOURCE_METHODS: &[&str] = &[
    "resourceRead",
    "resourceWrite",
    "resourceList",
    "resourceCopy",
    "resourceMove",
    "resourceDelete",
    "resourceResolve",
    "resourceMkdir",
    "resourceRequest",
    "createResourceWatch",
];

/// The answer where this process holds no workspace.
pub(crate) fn no_files(method: &str) -> RpcError {
    RpcError::method_not_found(&format!(
        "{method} (this relay serves files only where it runs a workspace: configure --agents, or run serve where the kernel can sandbox; its log says why it could not)"
    ))
}

const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The path a `file:` URI names.
pub(crate) fn path_of(uri: &str) -> Result<String, RpcError> {
    match uri.strip_prefix("file://") {
        // No `..`: a path is compared with the workspace's by its words (`<root>/../other` is not inside it).
        Some(path)
            if path.starts_with('/')
                && std::path::Path::new(path)
                    .components()
                    .any(|part| part == std::path::Component::ParentDir) =>
        {
            Err(RpcError::permission_denied(format!(
                "{uri}: a path with `..` is not served: name the file itself"
            )))
        }
        Some(path) if path.starts_with('/') => Ok(path.to_string()),
        _ => Err(RpcError::new(
            ahp_error_codes::NOT_FOUND,
            format!("{uri}: this host serves file:///… URIs of its workspace only"),
        )),
    }
}

/// The path of the tenant's workspace a client's operation names first (a copy's or move's source: its
/// destination must then lie where the same file server sees it); `None` for a checkpoint's file, named by its
/// blob.
fn client_path(op: &FileOp) -> Option<&str> {
    match op {
        FileOp::Read { path }
        | FileOp::Write { path, .. }
        | FileOp::List { path, .. }
        | FileOp::Delete { path, .. }
        | FileOp::Resolve { path, .. }
        | FileOp::Mkdir { path, .. }
        | FileOp::Watch { path, .. } => Some(path),
        FileOp::Copy { source, .. } | FileOp::Move { source, .. } => Some(source),
        _ => None,
    }
}

/// A file operation from a command's parameters.
fn operation(message: &InboundMessage) -> Result<FileOp, RpcError> {
    Ok(match message.method.as_str() {
        "resourceRead" => {
            let params: ResourceReadParams = message.parse_params()?;
            // A changeset's file as a checkpoint holds it ([`crate::workspace::changesets`]).
            match crate::model::changeset_uris::parse_checkpoint_uri(&params.uri) {
                Some((object, path)) => FileOp::ReadVersion { object, path },
                None => FileOp::Read {
                    path: path_of(&params.uri)?,
                },
            }
        }
        "resourceWrite" => {
            let params: ResourceWriteParams = message.parse_params()?;
            let data = match params.encoding {
                ContentEncoding::Utf8 => BASE64.encode(params.data.as_bytes()),
                ContentEncoding::Base64 => {
                    let bytes = BASE64
                        .decode(&params.data)
                        .map_err(|error| RpcError::invalid_params(format!("data is not base64: {error}")))?;
                    BASE64.encode(bytes)
                }
            };
            let position = u64::try_from(params.position.unwrap_or(0))
                .map_err(|_| RpcError::invalid_params("position must not be negative"))?;
            FileOp::Write {
                path: path_of(&params.uri)?,
                data,
                create_only: params.create_only.unwrap_or(false),
                mode: match params.mode {
                    None | Some(ResourceWriteMode::Truncate) => WriteMode::Truncate,
                    Some(ResourceWriteMode::Append) => WriteMode::Append,
                    Some(ResourceWriteMode::Insert) => WriteMode::Insert,
                },
                position,
                if_match: params.if_match,
            }
        }
        "resourceList" => {
            let params: ResourceListParams = message.parse_params()?;
            FileOp::List {
                path: path_of(&params.uri)?,
            }
        }
        "resourceCopy" => {
            let params: ResourceCopyParams = message.parse_params()?;
            FileOp::Copy {
                source: path_of(&params.source)?,
                destination: path_of(&params.destination)?,
                fail_if_exists: params.fail_if_exists.unwrap_or(false),
            }
        }
        "resourceMove" => {
            let params: ResourceMoveParams = message.parse_params()?;
            FileOp::Move {
                source: path_of(&params.source)?,
                destination: path_of(&params.destination)?,
                fail_if_exists: params.fail_if_exists.unwrap_or(false),
            }
        }
        "resourceDelete" => {
            let params: ResourceDeleteParams = message.parse_params()?;
            FileOp::Delete {
                path: path_of(&params.uri)?,
                recursive: params.recursive.unwrap_or(false),
            }
        }
        "resourceResolve" => {
            let params: ResourceResolveParams = message.parse_params()?;
            FileOp::Resolve {
                path: path_of(&params.uri)?,
                follow_symlinks: params.follow_symlinks.unwrap_or(true),
            }
        }
        "resourceMkdir" => {
            let params: ResourceMkdirParams = message.parse_params()?;
            FileOp::Mkdir {
                path: path_of(&params.uri)?,
            }
        }
        other => return Err(RpcError::method_not_found(other)),
    })
}

/// What `resourceRead` answers for `bytes` of `content_type`: text as UTF-8 unless base64 was asked for (or
/// it is not UTF-8), anything else as base64.
fn read_result(content_type: String, bytes: Vec<u8>, wanted: Option<ContentEncoding>) -> ResourceReadResult {
    let textual = content_type.starts_with("text/")
        || content_type.starts_with("application/json")
        || content_type.is_empty();
    let (data, encoding) = match (textual, wanted) {
        (true, None | Some(ContentEncoding::Utf8)) => match String::from_utf8(bytes) {
            Ok(text) => (text, ContentEncoding::Utf8),
            Err(error) => (BASE64.encode(error.into_bytes()), ContentEncoding::Base64),
        },
        _ => (BASE64.encode(bytes), ContentEncoding::Base64),
    };
    ResourceReadResult {
        data,
        encoding,
        content_type: Some(content_type),
    }
}

impl Host {
    /// `resourceRead` of content kept by reference (`ahp-content:/<id>`): from the store, this host's only.
    async fn read_content(&self, id: Option<u64>, params: &ResourceReadParams) -> CommandResult {
        let missing = || {
            RpcError::new(
                ahp_error_codes::NOT_FOUND,
                format!("{} does not exist", params.uri),
            )
        };
        let content = crate::workspace::content_refs::id_of(&params.uri).ok_or_else(missing)?;
        let stored = self
            .store
            .load_content(&self.key.tenant, &self.key.host, content)
            .await
            .map_err(|error| RpcError::internal(format!("the store is unavailable: {error}")))?;
        let (content_type, data) = stored.ok_or_else(missing)?;
        let textual = content_type.starts_with("text/");
        let (data, encoding) = match (textual, params.encoding) {
            (true, None | Some(ContentEncoding::Utf8)) => {
                let bytes = BASE64
                    .decode(&data)
                    .map_err(|error| RpcError::internal(format!("a stored content is damaged: {error}")))?;
                match String::from_utf8(bytes) {
                    Ok(text) => (text, ContentEncoding::Utf8),
                    Err(_) => (data, ContentEncoding::Base64),
                }
            }
            _ => (data, ContentEncoding::Base64),
        };
        reply(
            id,
            &ResourceReadResult {
                data,
                encoding,
                content_type: Some(content_type),
            },
        )
    }

    pub(crate) async fn resource_command(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> CommandReply {
        answer(message.id, self.resource_result(connection, message).await)
    }

    async fn resource_result(&self, connection: ConnectionId, message: &InboundMessage) -> CommandResult {
        let (files, writer, identity) = {
            let core = self.core.lock();
            core.client_id(connection)?;
            let identity = core.connection(connection)?.identity.clone();
            (
                core.providers.files().cloned(),
                identity.role.can_write(),
                identity,
            )
        };
        if message.method == "resourceRead" {
            let params: ResourceReadParams = message.parse_params()?;
            if params
                .uri
                .starts_with(crate::workspace::content_refs::CONTENT_SCHEME)
            {
                return self.read_content(message.id, &params).await;
            }
            // Content small enough to travel inline (a file edit's side up to a few KiB) is a `data:` URI: a
            // client that fetches every `ContentRef` reads it here like any other.
            if params.uri.starts_with("data:") {
                let (content_type, bytes) = crate::workspace::content_refs::decode_data_uri(&params.uri)
                    .ok_or_else(|| RpcError::invalid_params("a data: URI that cannot be decoded"))?;
                return reply(message.id, &read_result(content_type, bytes, params.encoding));
            }
        }
        let Some(files) = files else {
            return Err(no_files(&message.method));
        };
        if message.method == "createResourceWatch" {
            return self.create_resource_watch(connection, message).await;
        }
        let tenant = &self.key.tenant;
        if message.method == "resourceRequest" {
            // Access is decided by who asks, not granted per file: a member may read and write the tenant's
            // workspace, a viewer may read it.
            let params: ResourceRequestParams = message.parse_params()?;
            let path = path_of(&params.uri)?;
            let inside = files
                .tenant_root(tenant)
                .is_some_and(|root| std::path::Path::new(&path).starts_with(root));
            if !inside {
                return Err(RpcError::permission_denied(format!(
                    "{path} is outside this tenant's workspace"
                )));
            }
            crate::workspace::host_scope::scope_for(&identity, files.tenant_root(tenant).as_deref(), &path)?;
            if params.write == Some(true) && !writer {
                return Err(RpcError::permission_denied(
                    "viewers may read files, not change them",
                ));
            }
            return reply(message.id, &serde_json::json!({}));
        }
        let op = operation(message)?;
        if op.writes() && !writer {
            return Err(RpcError::permission_denied(
                "viewers may read files, not change them",
            ));
        }
        // A token scoped to hosts reaches their directories alone, served where nothing else is seen.
        let scope = match client_path(&op) {
            Some(path) => crate::workspace::host_scope::scope_for(
                &identity,
                files.tenant_root(tenant).as_deref(),
                path,
            )?,
            None => None,
        };
        let wanted = match message.method.as_str() {
            "resourceRead" => message
                .parse_params::<ResourceReadParams>()
                .ok()
                .and_then(|params| params.encoding),
            _ => None,
        };
        match files
            .call_within(tenant, scope.as_deref(), op)
            .await
            .map_err(file_error)?
        {
            FileReply::Read {
                data,
                content_type,
                text,
            } => {
                // Binary MUST be base64; text is UTF-8 unless base64 was asked for.
                let utf8 = text && wanted != Some(ContentEncoding::Base64);
                let (data, encoding) = if utf8 {
                    let bytes = BASE64.decode(&data).map_err(|error| {
                        RpcError::internal(format!("the file server answered garbage: {error}"))
                    })?;
                    (
                        String::from_utf8_lossy(&bytes).into_owned(),
                        ContentEncoding::Utf8,
                    )
                } else {
                    (data, ContentEncoding::Base64)
                };
                reply(
                    message.id,
                    &ResourceReadResult {
                        data,
                        encoding,
                        content_type: Some(content_type),
                    },
                )
            }
            FileReply::Listed { entries } => reply(
                message.id,
                &ResourceListResult {
                    entries: entries
                        .into_iter()
                        .map(|(name, kind)| DirectoryEntry {
                            name,
                            r#type: match kind {
                                EntryKind::Directory => "directory",
                                EntryKind::File | EntryKind::Symlink => "file",
                            }
                            .into(),
                        })
                        .collect(),
                },
            ),
            FileReply::Resolved(resolved) => reply(
                message.id,
                &ResourceResolveResult {
                    uri: format!("file://{}", resolved.path),
                    r#type: match resolved.kind {
                        EntryKind::File => ResourceType::File,
                        EntryKind::Directory => ResourceType::Directory,
                        EntryKind::Symlink => ResourceType::Symlink,
                    },
                    size: resolved.size.and_then(|size| i64::try_from(size).ok()),
                    mtime: resolved.mtime,
                    ctime: resolved.ctime,
                    content_type: resolved.content_type,
                    etag: resolved.etag,
                },
            ),
            FileReply::Done
            | FileReply::Checkpoint { .. }
            | FileReply::Changes { .. }
            | FileReply::Found { .. }
            | FileReply::Branches { .. }
            | FileReply::Repository { .. } => reply(message.id, &serde_json::json!({})),
        }
    }
}
