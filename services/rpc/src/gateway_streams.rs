//! Each gateway's event streams on a shard, and the connection keys that say which gateway speaks for which
//! connection: a connection's calls are refused from any other gateway, and a gateway's connections are detached
//! when its stream ends (after [`GATEWAY_STREAM_GRACE`]).

use std::sync::Arc;

use relay_core::HostKey;
use relay_core::{ConnectionId, HostLink};
use tonic::Status;

use crate::bus_history::BusHistory;

/// How long after a gateway's last stream of a host ended its connections to the host are detached, unless
/// it opened another one meanwhile (a client reconnecting to the same gateway re-follows the host).
pub const GATEWAY_STREAM_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Counts each gateway's live `Events`/`Watch` streams of each host, and detaches a gateway's connections from
/// a host once it has had none for [`GATEWAY_STREAM_GRACE`].
#[derive(Clone, Default)]
pub(crate) struct GatewayStreams {
    pub(crate) open: Arc<parking_lot::Mutex<std::collections::HashMap<(HostKey, u64), usize>>>,
    /// The keys of the connections attached with an assertion: they go with their gateway's connections.
    pub(crate) keys: ConnectionKeys,
}

/// The key each connection attached with an identity assertion was given (see [`crate::assertion`]): its
/// `Call`s and `Detach` must present it.
#[derive(Clone, Default)]
pub(crate) struct ConnectionKeys {
    pub(crate) keys: Arc<parking_lot::Mutex<std::collections::HashMap<(HostKey, u64), KeyOfConnection>>>,
}

/// A connection's key, and when it was attached.
type KeyOfConnection = (String, std::time::Instant);

impl ConnectionKeys {
    pub(crate) fn set(&self, host: &HostKey, connection: ConnectionId, key: String) {
        self.keys
            .lock()
            .insert((host.clone(), connection.0), (key, std::time::Instant::now()));
    }

    /// Whether `metadata` presents `connection`'s key, compared in constant time.
    pub(crate) fn check(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        host: &HostKey,
        connection: ConnectionId,
    ) -> Result<(), Status> {
        use subtle::ConstantTimeEq;
        let presented = metadata
            .get(crate::assertion::CONNECTION_KEY_METADATA)
            .and_then(|value| value.to_str().ok())
            .ok_or_else(|| Status::unauthenticated("the connection's key is required"))?;
        let keys = self.keys.lock();
        let matches = keys
            .get(&(host.clone(), connection.0))
            .is_some_and(|(key, _)| bool::from(key.as_bytes().ct_eq(presented.as_bytes())));
        if matches {
            Ok(())
        } else {
            Err(Status::permission_denied("not this connection's key"))
        }
    }

    pub(crate) fn remove(&self, host: &HostKey, connection: ConnectionId) {
        self.keys.lock().remove(&(host.clone(), connection.0));
    }

    /// Forget the keys of `gateway`'s connections to `host` attached by `ended` (they were detached).
    pub(crate) fn remove_gateway(&self, host: &HostKey, gateway: u64, ended: std::time::Instant) {
        self.keys.lock().retain(|(of_host, connection), (_, attached)| {
            !(of_host == host && ConnectionId(*connection).prefix() == gateway && *attached <= ended)
        });
    }
}

/// One live stream; dropping it ends it.
pub(crate) struct GatewayStream<L: HostLink + BusHistory> {
    pub(crate) streams: GatewayStreams,
    pub(crate) key: (HostKey, u64),
    pub(crate) link: Arc<L>,
}

impl GatewayStreams {
    /// `connection` was attached to `host` by its gateway: unless that gateway has (or opens) a stream of the
    /// host within [`GATEWAY_STREAM_GRACE`], the connection is detached — a gateway that died between its
    /// `Attach` and its `Watch` leaves nothing attached behind.
    pub(crate) fn expect_stream<L: HostLink + BusHistory>(
        &self,
        link: &Arc<L>,
        host: &HostKey,
        connection: ConnectionId,
    ) {
        let gateway = connection.prefix();
        if gateway == 0 {
            return;
        }
        let (streams, link, key) = (self.clone(), link.clone(), (host.clone(), gateway));
        tokio::spawn(async move {
            tokio::time::sleep(GATEWAY_STREAM_GRACE).await;
            if !streams.open.lock().contains_key(&key) {
                // (If a stream opened and ended meanwhile, its end detaches the connection too: harmless.)
                link.detach(&key.0, connection).await;
                streams.keys.remove(&key.0, connection);
            }
        });
    }

    /// A stream of `host` by the gateway with connection-id prefix `gateway` (0: not a gateway's).
    pub(crate) fn open<L: HostLink + BusHistory>(
        &self,
        link: &Arc<L>,
        host: &HostKey,
        gateway: u64,
    ) -> Option<GatewayStream<L>> {
        if gateway == 0 {
            return None;
        }
        let key = (host.clone(), gateway);
        *self.open.lock().entry(key.clone()).or_insert(0) += 1;
        Some(GatewayStream {
            streams: self.clone(),
            key,
            link: link.clone(),
        })
    }
}

impl<L: HostLink + BusHistory> Drop for GatewayStream<L> {
    fn drop(&mut self) {
        let last = {
            let mut open = self.streams.open.lock();
            match open.get_mut(&self.key) {
                Some(count) if *count > 1 => {
                    *count -= 1;
                    false
                }
                _ => {
                    open.remove(&self.key);
                    true
                }
            }
        };
        if !last {
            return;
        }
        let (streams, key, link) = (self.streams.clone(), self.key.clone(), self.link.clone());
        let ended = std::time::Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(GATEWAY_STREAM_GRACE).await;
            // Connections attached since the stream ended are the gateway's next stream's, even if that
            // stream registers only after this timer (a Watch is sent after its Attach).
            if !streams.open.lock().contains_key(&key) {
                link.detach_gateway(&key.0, key.1, ended).await;
                streams.keys.remove_gateway(&key.0, key.1, ended);
            }
        });
    }
}
