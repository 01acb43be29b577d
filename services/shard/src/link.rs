//! The in-process [`HostLink`]: the embedded relay's gateway calls its hosts directly.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use relay_core::bus::SharedBusEvent;
use relay_core::link::{CommandReply, HostLink, LinkError};
use relay_core::rpc::InboundMessage;
use relay_core::{ConnectionId, HostKey, Identity, Limits};
use relay_runner::ProviderRegistry;
use tokio::sync::broadcast;

use crate::host::Host;

/// The hosts of this process, created on first use.
pub struct ShardLink {
    hosts: Mutex<HashMap<HostKey, Arc<Host>>>,
    limits: Limits,
    providers: ProviderRegistry,
}

impl ShardLink {
    pub fn new(limits: Limits, providers: ProviderRegistry) -> Self {
        Self {
            hosts: Mutex::new(HashMap::new()),
            limits,
            providers,
        }
    }

    /// The host for `key`, creating it on first use.
    pub fn host(&self, key: &HostKey) -> Arc<Host> {
        let mut hosts = self.hosts.lock();
        hosts
            .entry(key.clone())
            .or_insert_with(|| Host::new(key.clone(), self.limits.clone(), self.providers.clone()))
            .clone()
    }

    fn existing(&self, key: &HostKey) -> Option<Arc<Host>> {
        self.hosts.lock().get(key).cloned()
    }
}

impl HostLink for ShardLink {
    async fn attach(
        &self,
        host: &HostKey,
        connection: ConnectionId,
        identity: &Identity,
    ) -> Result<broadcast::Receiver<SharedBusEvent>, LinkError> {
        Ok(self.host(host).attach(connection, identity.clone()))
    }

    async fn call(&self, host: &HostKey, connection: ConnectionId, message: InboundMessage) -> CommandReply {
        match self.existing(host) {
            Some(h) => h.call(connection, message),
            None => CommandReply::none(),
        }
    }

    async fn detach(&self, host: &HostKey, connection: ConnectionId) {
        if let Some(h) = self.existing(host) {
            h.detach(connection);
        }
    }
}
