//! A gateway's gap repair over gRPC ([`ShardRepair`]): the events it missed on Redis, read back from the host's
//! shard with `FetchRange`.

use std::sync::Arc;

use relay_bus::{BoxFuture, GapRepair, RepairError};
use relay_core::bus::BusEvent;
use relay_core::HostKey;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::convert::{event_from_pb, host_to_pb};
use crate::credential::InternalCredential;
use crate::pb;
use crate::pb::shard_client::ShardClient;

/// A channel to a shard whose every call carries the internal credential.
pub type AuthedChannel = InterceptedService<Channel, InternalCredential>;

/// The gateways' assertion signer, if the deployment has one (see [`crate::assertion`]).
pub(crate) type Signer = Option<Arc<crate::AssertionSigner>>;

/// `message` as a request carrying an assertion that this gateway reads `host` with `rpc` (none without a
/// signer).
pub(crate) fn host_request<T>(
    signer: &Signer,
    message: T,
    rpc: &str,
    host: &HostKey,
) -> Result<tonic::Request<T>, tonic::Status> {
    let mut request = tonic::Request::new(message);
    if let Some(signer) = signer {
        signer.host_rpc(request.metadata_mut(), rpc, host)?;
    }
    Ok(request)
}

/// Fetches lost bus events from the shard with `FetchRange`, counting the ranges that brought events back.
pub struct ShardRepair {
    pub(crate) client: ShardClient<AuthedChannel>,
    pub(crate) signer: Signer,
}

impl GapRepair for ShardRepair {
    fn fetch<'a>(
        &'a self,
        host: &'a HostKey,
        after: u64,
        through: u64,
    ) -> BoxFuture<'a, Result<Vec<BusEvent>, RepairError>> {
        Box::pin(async move {
            let request = host_request(
                &self.signer,
                pb::FetchRangeRequest {
                    host: Some(host_to_pb(host)),
                    after,
                    through,
                },
                "fetch_range",
                host,
            )
            .map_err(|status| RepairError(Box::new(status)))?;
            let reply = self
                .client
                .clone()
                .fetch_range(request)
                .await
                .map_err(|status| RepairError(Box::new(status)))?;
            let events = reply
                .into_inner()
                .events
                .into_iter()
                .map(event_from_pb)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|error| RepairError(Box::new(error)))?;
            if !events.is_empty() {
                relay_core::telemetry::gap_repaired();
            }
            Ok(events)
        })
    }
}
