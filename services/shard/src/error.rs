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
}

impl ShardError {
    pub fn corrupt(error: impl std::fmt::Display) -> Self {
        ShardError::Corrupt(error.to_string())
    }
}
