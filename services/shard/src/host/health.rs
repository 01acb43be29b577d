//! Whether the shard can take traffic: what `/readyz` asks of an in-process shard. Its only dependency is the
//! store; a shard that cannot reach it can sequence nothing durably (invariant 2).

use std::time::Duration;

use relay_core::link::NotReady;
use relay_store::Store;

/// How long the store may take to answer a ping before the shard counts as not ready.
const STORE_PING_TIMEOUT: Duration = Duration::from_secs(2);

/// `Ok` when the store answers a trivial query in time.
pub async fn store_ready(store: &Store) -> Result<(), NotReady> {
    match tokio::time::timeout(STORE_PING_TIMEOUT, store.ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(NotReady(format!("the store is unreachable: {error}"))),
        Err(_) => Err(NotReady("the store did not answer in time".into())),
    }
}
