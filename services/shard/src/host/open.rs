//! Opening a host: its root restored from the store, its `serverSeq` continued above everything ever committed
//! for it, its agents' way back in ([`HostSink`]) and its committer started.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use relay_bus::RedisPublisher;
use relay_core::{HostKey, Limits};
use relay_runner::ProviderRegistry;
use relay_store::{Lease, Store, StoreError};
use tokio::sync::{watch, Notify};

use crate::host::committer::commit_loop;
use crate::host::sequencer::{Publisher, Sequencer};
use crate::host::sink::HostSink;
use crate::host::{Host, HostCore};
use crate::model::HostModel;

impl Host {
    /// Open a host from the store: its `serverSeq` continues above anything ever committed for it. With a
    /// `lease` (taken before this call, so the counters read here include every commit of any previous
    /// owner), every commit is fenced by it.
    pub async fn open(
        key: HostKey,
        limits: Limits,
        providers: ProviderRegistry,
        store: Store,
        redis: Option<RedisPublisher>,
        lease: Option<Lease>,
    ) -> Result<Arc<Self>, StoreError> {
        let record = store.load_host(&key.tenant, &key.host).await?;
        let session_count = store.session_count(&key.tenant, &key.host).await?;
        let root = crate::host::preload::restore_root(&store, &key, providers.agents()).await?;
        let host = Arc::new_cyclic(|me: &Weak<Host>| Host {
            core: Mutex::new(HostCore {
                seq: Sequencer::new(
                    record.last_seq,
                    limits.replay_buffer_envelopes,
                    limits.replay_buffer_bytes,
                ),
                model: HostModel::new(root, record.next_catalog_no),
                key: key.clone(),
                limits: limits.clone(),
                providers,
                connections: HashMap::new(),
                clients: HashMap::new(),
                sink: Arc::new(HostSink { host: me.clone() }),
                host: me.clone(),
                pending_grace: Vec::new(),
                disposing: HashMap::new(),
                owed: Default::default(),
                last_activity: std::time::Instant::now(),
                storage: None,
                failed_units: Default::default(),
                session_count,
                unused_sessions: HashSet::new(),
            }),
            publisher: Mutex::new(Publisher::new(
                record.last_seq,
                limits.bus_capacity,
                limits.bus_bytes,
            )),
            durable: watch::Sender::new(0),
            redis,
            lease,
            deposed: watch::Sender::new(false),
            wakeup: Arc::new(Notify::new()),
            store,
            key,
            me: me.clone(),
            full_backoff: parking_lot::Mutex::new(Duration::ZERO),
        });
        crate::host::commit_thread::spawn(&host.key, commit_loop(Arc::downgrade(&host)));
        Ok(host)
    }
}
