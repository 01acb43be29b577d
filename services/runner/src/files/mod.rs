//! Tenants' files as AHP's `resource*` commands reach them: the operations and their rules ([`ops`]), the file
//! server that runs them inside a sandbox of the tenant ([`server`]) with its watches ([`watch`]), the runner's
//! handle on those servers ([`service`]) and what travels between the two ([`protocol`]); an operation the runner
//! stops waiting for is cancelled ([`cancel`]). Trees are copied, moved and deleted in [`tree_ops`]; the
//! shadow repository's checkpoints and changes are [`history`], run through [`git_run`].
//!
//! Rules of this folder: every operation runs in the file server, inside the tenant's sandbox (the relay never
//! touches a tenant's files itself); a path leaves the tenant's root only as a refusal; git runs only with the
//! configuration [`crate::git`] forces.

pub mod access;
pub mod cancel;
pub mod find;
pub mod git_run;
pub mod history;
pub mod ops;
pub mod protocol;
pub mod server;
pub mod service;
pub mod tree_ops;
pub mod watch;

pub use access::{
    change_channel, offer_changes, ChangeSink, ChangeStream, FileAccess, FileFuture, WatchHandle, WatchSpec,
    WATCH_BACKLOG,
};
pub use protocol::{
    ChangeKind, ChangeStatus, ChangedFile, EntryKind, FileError, FileOp, FileReply, RepositoryOp, Resolved,
    WriteMode,
};
pub use service::FileService;
