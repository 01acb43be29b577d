//! What a shard's gRPC service reads of a host's bus besides live events ([`BusHistory`]): published ranges for
//! gap repair, the last published seq, when the host moves, and detaching a gateway's connections.

use std::future::Future;

use relay_core::bus::BusEvent;
use relay_core::link::LinkError;
use relay_core::HostKey;
use relay_shard::error::ShardError;
use relay_shard::ShardLink;
use tonic::Status;

/// Why a range of a host's bus could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("host {0} is not available")]
    Unavailable(String),
    /// Part of the range is no longer held (compacted away).
    #[error("range no longer held: {0}")]
    Gone(String),
    #[error("{0}")]
    Internal(String),
    /// Another shard serves the host: the one at this gRPC URL.
    #[error("the host is served by {0}")]
    Moved(String),
}

impl From<HistoryError> for Status {
    fn from(error: HistoryError) -> Self {
        match error {
            HistoryError::Unavailable(_) => Status::unavailable(error.to_string()),
            HistoryError::Gone(_) => Status::out_of_range(error.to_string()),
            HistoryError::Internal(_) => Status::internal(error.to_string()),
            HistoryError::Moved(owner) => moved_status(&owner),
        }
    }
}

/// What a host published, read back: for gateways that follow hosts over Redis and repair its gaps.
pub trait BusHistory: Send + Sync + 'static {
    /// The logged action events of `host` with `after < seq <= through`, oldest first (`through` capped at
    /// what the host has published).
    fn fetch_range(
        &self,
        host: &HostKey,
        after: u64,
        through: u64,
    ) -> impl Future<Output = Result<Vec<BusEvent>, HistoryError>> + Send;

    /// The `serverSeq` of the last action `host` published.
    fn published_seq(&self, host: &HostKey) -> impl Future<Output = Result<u64, HistoryError>> + Send;

    /// Resolves once this shard stops serving `host` (at once if it does not serve it now).
    fn served_until_moved(&self, host: &HostKey) -> impl Future<Output = ()> + Send;

    /// Detach every connection the gateway with connection-id prefix `gateway` attached to `host` before
    /// `ended`, when its last stream for the host ended (it died, or follows the host no more).
    fn detach_gateway(
        &self,
        host: &HostKey,
        gateway: u64,
        ended: std::time::Instant,
    ) -> impl Future<Output = ()> + Send;
}

impl BusHistory for ShardLink {
    async fn fetch_range(
        &self,
        host: &HostKey,
        after: u64,
        through: u64,
    ) -> Result<Vec<BusEvent>, HistoryError> {
        ShardLink::fetch_range(self, host, after, through)
            .await
            .map_err(|error| match error {
                ShardError::Link(LinkError::Moved { owner, .. }) => HistoryError::Moved(owner),
                ShardError::Link(error) => HistoryError::Unavailable(error.to_string()),
                ShardError::Compacted(_) => HistoryError::Gone(error.to_string()),
                ShardError::Store(_) | ShardError::Corrupt(_) => {
                    tracing::error!(%host, %error, "could not read a bus range");
                    HistoryError::Internal(error.to_string())
                }
            })
    }

    async fn published_seq(&self, host: &HostKey) -> Result<u64, HistoryError> {
        ShardLink::published_seq(self, host)
            .await
            .map_err(|error| match error {
                LinkError::Moved { owner, .. } => HistoryError::Moved(owner),
                error => HistoryError::Unavailable(error.to_string()),
            })
    }

    async fn served_until_moved(&self, host: &HostKey) {
        ShardLink::served_until_moved(self, host).await;
    }

    async fn detach_gateway(&self, host: &HostKey, gateway: u64, ended: std::time::Instant) {
        ShardLink::detach_gateway(self, host, gateway, ended);
    }
}

/// FAILED_PRECONDITION naming the shard that serves the host in [`crate::OWNER_METADATA`].
pub(crate) fn moved_status(owner: &str) -> Status {
    let mut status = Status::failed_precondition(format!("the host is served by {owner}"));
    match tonic::metadata::MetadataValue::try_from(owner) {
        Ok(value) => {
            status.metadata_mut().insert(crate::OWNER_METADATA, value);
        }
        Err(_) => tracing::warn!(owner, "owner URL is not valid metadata; the gateway will search"),
    }
    status
}
