//! Errors of the shard's store-backed paths.

use relay_store::StoreError;

/// Why a store-backed operation of a host failed.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored row did not parse as what the shard wrote.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// Part of a requested log range was compacted away: it can no longer be read.
    #[error("the action log after seq {0} was compacted")]
    Compacted(u64),
    /// The host could not be opened.
    #[error(transparent)]
    Link(#[from] relay_core::link::LinkError),
}

impl ShardError {
    pub fn corrupt(error: impl std::fmt::Display) -> Self {
        ShardError::Corrupt(error.to_string())
    }
}
