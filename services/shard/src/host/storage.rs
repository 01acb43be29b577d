//! The per-tenant storage quota: how many bytes a tenant keeps in the store (log rows, snapshots and client
//! bindings, every host, see [`relay_store::Store::stored_bytes`]), measured when one of its hosts opens and
//! then every `measure_every` while its hosts here are in use (a tenant nothing asked about for
//! [`FORGET_AFTER`] is no longer measured). A tenant at or over its quota cannot grow: new sessions and
//! chats are refused (`-32600`), actions that add content (turns, queued or steering messages, drafts) are
//! rejected with the reason, and its agents' output is not stored: a running turn ends with a `chat/error`
//! naming the quota (its agent is stopped), and terminal output is dropped — until disposing sessions and
//! compaction bring it back under. The measurement lags writes by up to `measure_every`, so a
//! tenant can overshoot by what it writes in that time (bounded by its byte rate at the gateway).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ahp_types::actions::StateAction;
use parking_lot::Mutex;
use relay_store::Store;

/// A tenant whose quota nothing checked for this long is no longer measured (until a host of it opens).
pub const FORGET_AFTER: Duration = Duration::from_secs(600);

/// The storage quota and the last measurement of each tenant in use here.
pub struct StorageQuota {
    store: Store,
    limit: u64,
    measure_every: Duration,
    /// Last measured bytes per tenant, and when its quota was last checked.
    tenants: Mutex<HashMap<String, TenantStorage>>,
}

struct TenantStorage {
    bytes: u64,
    checked: Instant,
}

impl StorageQuota {
    /// A quota of `limit` bytes per tenant, measured every `measure_every` by a task that ends when the
    /// quota is dropped.
    pub fn start(store: Store, limit: u64, measure_every: Duration) -> Arc<Self> {
        let quota = Arc::new(Self {
            store,
            limit,
            measure_every: measure_every.max(Duration::from_millis(10)),
            tenants: Mutex::new(HashMap::new()),
        });
        tokio::spawn(measure_periodically(Arc::downgrade(&quota)));
        quota
    }

    /// A host of `tenant` opened here: measure the tenant now (so the quota holds from its first message).
    pub async fn host_opened(&self, tenant: &str) {
        self.tenants
            .lock()
            .entry(tenant.to_string())
            .or_insert_with(|| TenantStorage {
                bytes: 0,
                checked: Instant::now(),
            })
            .checked = Instant::now();
        self.measure(tenant).await;
    }

    /// Why `tenant` may not grow, if it is at or over its quota.
    pub fn refusal(&self, tenant: &str) -> Option<String> {
        let bytes = {
            let mut tenants = self.tenants.lock();
            let usage = tenants
                .entry(tenant.to_string())
                .or_insert_with(|| TenantStorage {
                    bytes: 0,
                    checked: Instant::now(),
                });
            usage.checked = Instant::now();
            usage.bytes
        };
        (bytes >= self.limit).then(|| {
            format!(
                "the tenant keeps {bytes} bytes, at or over its storage quota of {} bytes: dispose sessions to \
                 free space",
                self.limit
            )
        })
    }

    async fn measure(&self, tenant: &str) {
        match self.store.stored_bytes(tenant).await {
            Ok(bytes) => {
                if let Some(usage) = self.tenants.lock().get_mut(tenant) {
                    usage.bytes = bytes;
                }
            }
            Err(error) => tracing::warn!(tenant, %error, "could not measure the tenant's stored bytes"),
        }
    }
}

/// Whether a client action adds content a tenant over its storage quota may not add.
pub fn grows_storage(action: &StateAction) -> bool {
    match action {
        StateAction::ChatTurnStarted(_) | StateAction::ChatPendingMessageSet(_) => true,
        StateAction::ChatDraftChanged(draft) => draft.draft.is_some(),
        _ => false,
    }
}

/// Whether an agent's action adds content a tenant over its storage quota may not add (what ends a turn or a
/// command, clearing a chat's activity, and the session's own lifecycle, always may; a tool call's result is
/// content: over the quota the call stays unfinished and its turn ends with `storageQuota`).
pub fn agent_grows_storage(action: &StateAction) -> bool {
    if let StateAction::ChatActivityChanged(changed) = action {
        return changed.activity.is_some();
    }
    matches!(
        action,
        StateAction::ChatDelta(_)
            | StateAction::ChatToolCallComplete(_)
            | StateAction::SessionConfigChanged(_)
            | StateAction::ChatReasoning(_)
            | StateAction::ChatResponsePart(_)
            | StateAction::ChatToolCallStart(_)
            | StateAction::ChatToolCallDelta(_)
            | StateAction::ChatToolCallReady(_)
            | StateAction::ChatToolCallContentChanged(_)
            | StateAction::ChatInputRequested(_)
            | StateAction::ChatUsage(_)
            | StateAction::SessionMetaChanged(_)
            | StateAction::SessionTitleChanged(_)
            | StateAction::TerminalData(_)
            | StateAction::TerminalCommandExecuted(_)
    )
}

async fn measure_periodically(quota: Weak<StorageQuota>) {
    let Some(every) = quota.upgrade().map(|quota| quota.measure_every) else {
        return;
    };
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(quota) = quota.upgrade() else { return };
        let tenants: Vec<String> = {
            let mut tenants = quota.tenants.lock();
            tenants.retain(|_, usage| usage.checked.elapsed() < FORGET_AFTER);
            tenants.keys().cloned().collect()
        };
        for tenant in tenants {
            quota.measure(&tenant).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ahp_types::actions::{ChatActivityChangedAction, ChatDeltaAction};

    fn action(json: serde_json::Value) -> StateAction {
        serde_json::from_value(json).expect("an AHP action")
    }

    #[test]
    fn content_grows_storage_and_ends_of_things_do_not() {
        let delta = StateAction::ChatDelta(ChatDeltaAction {
            turn_id: "t".into(),
            part_id: "p".into(),
            content: "x".into(),
            meta: None,
        });
        assert!(agent_grows_storage(&delta));
        let shown = |activity: Option<&str>| {
            StateAction::ChatActivityChanged(ChatActivityChangedAction {
                activity: activity.map(str::to_string),
            })
        };
        assert!(agent_grows_storage(&shown(Some("thinking"))));
        assert!(
            !agent_grows_storage(&shown(None)),
            "clearing an activity always may"
        );
        let result = action(serde_json::json!({
            "type": "chat/toolCallComplete", "turnId": "t", "toolCallId": "c",
            "result": {"success": true, "pastTenseMessage": "ran"}
        }));
        assert!(agent_grows_storage(&result), "a tool call's result is content");
        let complete = action(serde_json::json!({"type": "chat/turnComplete", "turnId": "t", "duration": 1}));
        assert!(!agent_grows_storage(&complete), "ending a turn always may");
    }
}
