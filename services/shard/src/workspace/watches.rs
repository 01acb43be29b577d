//! Resource watches (`createResourceWatch`, `ahp-resource-watch:/<id>` channels): a connection asks to watch a
//! path of its tenant's workspace; the tenant's file server watches it ([`relay_runner::files`]) and what
//! changes reaches the connection as `resourceWatch/changed` on the watch's channel — privately (no other
//! connection may subscribe; nothing is logged or replayed). A watch is released when its connection
//! unsubscribes from it or goes away (AHP: MUST), and is bounded per connection ([`MAX_WATCHES_PER_CONNECTION`])
//! and per tenant (by the file service).

use ahp_types::actions::{ResourceWatchChangedAction, StateAction};
use ahp_types::commands::{CreateResourceWatchParams, CreateResourceWatchResult};
use ahp_types::state::{ResourceChange, ResourceChangeType, ResourceWatchState};
use relay_core::rpc::{InboundMessage, RpcError};
use relay_core::ConnectionId;
use relay_runner::files::{ChangeKind, WatchHandle};

use crate::host::{Host, HostCore};
use crate::model::WatchRecord;
use crate::reply::{reply, CommandResult};

/// Most watches one connection may hold.
pub const MAX_WATCHES_PER_CONNECTION: usize = 16;

/// The URI scheme of watch channels.
pub const WATCH_SCHEME: &str = "ahp-resource-watch:";

/// Patterns from `{ items: [...] }` (or a plain list).
fn patterns(value: Option<&serde_json::Value>) -> Result<Vec<String>, RpcError> {
    let items = match value {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::Object(object)) => object.get("items").cloned().unwrap_or_default(),
        Some(other) => other.clone(),
    };
    match items {
        serde_json::Value::Null => Ok(Vec::new()),
        serde_json::Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                serde_json::Value::String(pattern) => Ok(pattern),
                _ => Err(RpcError::invalid_params(
                    "includes/excludes items must be strings",
                )),
            })
            .collect(),
        _ => Err(RpcError::invalid_params(
            "includes/excludes must be { items: [...] }",
        )),
    }
}

impl HostCore {
    /// Whether `connection` may hold one more watch ([`MAX_WATCHES_PER_CONNECTION`]).
    fn room_for_a_watch(&self, connection: ConnectionId) -> Result<(), RpcError> {
        let held = self
            .model
            .watches
            .values()
            .filter(|watch| watch.owner == connection)
            .count();
        if held >= MAX_WATCHES_PER_CONNECTION {
            return Err(RpcError::invalid_params(format!(
                "a connection may hold at most {MAX_WATCHES_PER_CONNECTION} watches"
            )));
        }
        Ok(())
    }

    /// Forget the watches of `connection` (it went away); their file server watches stop.
    pub(crate) fn release_watches_of(&mut self, connection: ConnectionId) {
        self.model.watches.retain(|_, watch| watch.owner != connection);
    }

    /// Forget watch `channel` if it is `connection`'s.
    pub(crate) fn release_watch(&mut self, connection: ConnectionId, channel: &str) {
        if self
            .model
            .watches
            .get(channel)
            .is_some_and(|watch| watch.owner == connection)
        {
            self.model.watches.remove(channel);
        }
    }

    /// Report `changes` of watch `channel` to its connection.
    pub(crate) fn report_watch(&mut self, channel: &str, changes: Vec<(String, ChangeKind)>) {
        let Some(watch) = self.model.watches.get(channel) else {
            return;
        };
        let owner = watch.owner;
        let subscribed = self
            .connections
            .get(&owner)
            .is_some_and(|state| state.subscriptions.contains(channel));
        if !subscribed {
            return;
        }
        let items: Vec<ResourceChange> = changes
            .into_iter()
            .map(|(path, kind)| ResourceChange {
                uri: format!("file://{path}"),
                r#type: match kind {
                    ChangeKind::Added => ResourceChangeType::Added,
                    ChangeKind::Updated => ResourceChangeType::Updated,
                    ChangeKind::Deleted => ResourceChangeType::Deleted,
                },
            })
            .collect();
        let action = StateAction::ResourceWatchChanged(ResourceWatchChangedAction {
            changes: serde_json::json!({ "items": items }),
        });
        self.seq.private(owner, channel, &action, None, None);
    }
}

impl Host {
    pub(crate) async fn create_resource_watch(
        &self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> CommandResult {
        let params: CreateResourceWatchParams = message.parse_params()?;
        let includes = patterns(params.includes.as_ref())?;
        let excludes = patterns(params.excludes.as_ref())?;
        let path = crate::workspace::resources::path_of(&params.uri)?;
        let (files, identity) = {
            let core = self.core.lock();
            core.client_id(connection)?;
            let identity = core.connection(connection)?.identity.clone();
            core.room_for_a_watch(connection)?;
            (core.providers.files().cloned(), identity)
        };
        let files = files.ok_or_else(|| crate::workspace::resources::no_files("createResourceWatch"))?;
        let scope = crate::workspace::host_scope::scope_for(
            &identity,
            files.tenant_root(&self.key.tenant).as_deref(),
            &path,
        )?;
        let channel = format!("{WATCH_SCHEME}/{}", uuid::Uuid::new_v4());
        let recursive = params.recursive.unwrap_or(false);
        let (events_tx, mut events) = relay_runner::files::change_channel();
        let spec = relay_runner::files::WatchSpec {
            path,
            recursive,
            includes,
            excludes,
        };
        let handle = files
            .watch_within(&self.key.tenant, scope.as_deref(), spec.clone(), events_tx)
            .await
            .map_err(crate::reply::file_error)?;
        {
            let mut core = self.core.lock();
            // The connection may have gone meanwhile: then the watch goes with the handle.
            if core.connection(connection).is_err() {
                return Err(RpcError::internal("connection is not attached"));
            }
            // Counted again: requests made at once all passed the first count.
            core.room_for_a_watch(connection)?;
            core.model.watches.insert(
                channel.clone(),
                WatchRecord {
                    state: ResourceWatchState {
                        root: params.uri.clone(),
                        recursive,
                        excludes: params.excludes.clone(),
                        includes: params.includes.clone(),
                    },
                    owner: connection,
                    _handle: handle,
                    _counted: relay_core::telemetry::resource_watch_opened(),
                },
            );
        }
        let host = self.me.clone();
        let watched = channel.clone();
        let tenant = self.key.tenant.clone();
        tokio::spawn(async move {
            loop {
                while let Some(changes) = events.recv().await {
                    let Some(host) = host.upgrade() else { return };
                    host.with_core(|core| core.report_watch(&watched, changes));
                }
                // The file server went away (a runner lost, a server restarted) while the watch lives: watch
                // again, and say the root changed (what changed meanwhile is not known).
                let Some(again) = rewatch(&host, &watched, &files, &tenant, scope.as_deref(), &spec).await
                else {
                    return;
                };
                events = again;
            }
        });
        reply(message.id, &CreateResourceWatchResult { channel })
    }
}

/// Watch `spec` again for watch `channel` (its file server went away), while the watch lives: its new events,
/// once watching; `None` when the watch (or its host) is gone, or watching fails for a minute.
async fn rewatch(
    host: &std::sync::Weak<Host>,
    channel: &str,
    files: &std::sync::Arc<dyn relay_runner::files::FileAccess>,
    tenant: &str,
    scope: Option<&str>,
    spec: &relay_runner::files::WatchSpec,
) -> Option<relay_runner::files::ChangeStream> {
    // The dead watch's handle goes first: it must not count against the tenant's watches meanwhile.
    if let Some(host) = host.upgrade() {
        host.with_core(|core| {
            if let Some(watch) = core.model.watches.get_mut(channel) {
                drop(std::mem::replace(&mut watch._handle, WatchHandle::new(|| {})));
            }
        });
    }
    let mut backoff = std::time::Duration::from_millis(200);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let live = |host: &std::sync::Weak<Host>| {
            host.upgrade()
                .is_some_and(|host| host.with_core(|core| core.model.watches.contains_key(channel)))
        };
        if !live(host) {
            return None;
        }
        let (events_tx, events) = relay_runner::files::change_channel();
        match files.watch_within(tenant, scope, spec.clone(), events_tx).await {
            Ok(handle) => {
                let host = host.upgrade()?;
                let kept = host.with_core(|core| match core.model.watches.get_mut(channel) {
                    Some(watch) => {
                        watch._handle = handle;
                        core.report_watch(channel, vec![(spec.path.clone(), ChangeKind::Updated)]);
                        true
                    }
                    None => false,
                });
                return kept.then_some(events);
            }
            Err(error) => {
                if tokio::time::Instant::now() >= deadline {
                    tracing::warn!(%channel, %error, "a resource watch could not be made again; it reports nothing more");
                    return None;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(5));
            }
        }
    }
}
