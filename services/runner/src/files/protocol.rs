//! What the runner asks of a tenant's file server and what it answers ([`super::server`], inside the tenant's
//! sandbox): one JSON object per line each way, requests numbered so answers may come in any order. Paths are
//! absolute paths as the sandbox sees them (the tenant's directory is mounted at its own path).

use serde::{Deserialize, Serialize};

/// Where `data` goes in a written file (AHP `ResourceWriteMode`, its `position` resolved per mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WriteMode {
    /// Keep the first `position` bytes, then `data`.
    Truncate,
    /// Insert `data` `position` bytes back from the end.
    Append,
    /// Insert `data` at `position`.
    Insert,
}

/// One file operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum FileOp {
    Read {
        path: String,
    },
    Write {
        path: String,
        /// The bytes, base64.
        data: String,
        create_only: bool,
        mode: WriteMode,
        position: u64,
        if_match: Option<String>,
    },
    List {
        path: String,
    },
    Copy {
        source: String,
        destination: String,
        fail_if_exists: bool,
    },
    Move {
        source: String,
        destination: String,
        fail_if_exists: bool,
    },
    Delete {
        path: String,
        recursive: bool,
    },
    Resolve {
        path: String,
        follow_symlinks: bool,
    },
    Mkdir {
        path: String,
    },
    /// Start watch `watch` of `path` (its changes come as [`Changed`] lines).
    Watch {
        watch: u64,
        path: String,
        recursive: bool,
        includes: Vec<String>,
        excludes: Vec<String>,
    },
    /// Stop watch `watch`.
    Unwatch {
        watch: u64,
    },
    /// Commit the working directory `workspace` as a checkpoint of `session` ([`super::history`]): sessions
    /// sharing a directory keep checkpoints of their own (none named: the directory's, as before).
    Checkpoint {
        workspace: String,
        label: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// The files that differ between two checkpoints.
    Changes {
        from: String,
        to: String,
    },
    /// A file as a checkpoint holds it: its blob `object`, and its path relative to its working directory (for
    /// its content type).
    ReadVersion {
        object: String,
        path: String,
    },
    /// Forget the checkpoints `session` keeps of a working directory (the session is gone).
    ForgetCheckpoints {
        workspace: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// Put files (relative to `workspace`) back as a checkpoint holds them.
    Restore {
        workspace: String,
        commit: String,
        paths: Vec<String>,
    },
    /// Files under `workspace` matching `query` (fuzzy), at most `limit` ([`super::find`]).
    Find {
        workspace: String,
        query: String,
        limit: usize,
    },
    /// The working directory's own git repository.
    Repository {
        workspace: String,
        action: RepositoryOp,
    },
}

/// What to do with a working directory's own git repository.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum RepositoryOp {
    /// Whether it is one.
    Inspect,
    /// Stage these paths (relative to it).
    Stage { paths: Vec<String> },
    /// Stage everything and commit.
    Commit { message: String },
    /// Its current branch and its branches.
    Branches,
}

/// How a file differs between two checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ChangeStatus {
    Added,
    Modified,
    Deleted,
}

/// A file that differs between two checkpoints: its path relative to the working directory, and the lines
/// added and removed (none for a binary file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangedFile {
    pub path: String,
    pub status: ChangeStatus,
    pub added: Option<u64>,
    pub removed: Option<u64>,
    /// Each side's blob id (none: the file is not on that side).
    pub before: Option<String>,
    pub after: Option<String>,
}

impl FileOp {
    /// Whether the operation changes the tenant's files themselves (a checkpoint records them and changes none).
    pub fn changes_files(&self) -> bool {
        matches!(
            self,
            FileOp::Write { .. }
                | FileOp::Copy { .. }
                | FileOp::Move { .. }
                | FileOp::Delete { .. }
                | FileOp::Mkdir { .. }
                | FileOp::Restore { .. }
        )
    }

    /// Whether a caller that stops waiting may have the operation cancelled: reads of the checkpoints only. A
    /// checkpoint runs to its end (a later one reuses its work), and what changes files or a repository is
    /// never cut short (a killed git leaves its locks in the user's repository).
    pub fn cancellable(&self) -> bool {
        matches!(self, FileOp::Changes { .. } | FileOp::ReadVersion { .. })
    }

    /// Whether the operation runs git (checkpoints, their changes and restores, the working repository).
    pub fn runs_git(&self) -> bool {
        matches!(
            self,
            FileOp::Checkpoint { .. }
                | FileOp::Changes { .. }
                | FileOp::ReadVersion { .. }
                | FileOp::ForgetCheckpoints { .. }
                | FileOp::Restore { .. }
                | FileOp::Repository { .. }
        )
    }

    /// Whether the operation changes anything (a viewer may only read).
    pub fn writes(&self) -> bool {
        !matches!(
            self,
            FileOp::Read { .. }
                | FileOp::List { .. }
                | FileOp::Resolve { .. }
                | FileOp::Watch { .. }
                | FileOp::Unwatch { .. }
                | FileOp::Changes { .. }
                | FileOp::ReadVersion { .. }
                | FileOp::Find { .. }
                | FileOp::Repository {
                    action: RepositoryOp::Inspect | RepositoryOp::Branches,
                    ..
                }
        )
    }
}

/// A directory entry's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
}

/// What a resolved path is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resolved {
    pub path: String,
    pub kind: EntryKind,
    pub size: Option<u64>,
    pub mtime: Option<String>,
    pub ctime: Option<String>,
    pub content_type: Option<String>,
    pub etag: Option<String>,
}

/// A successful operation's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "camelCase")]
pub enum FileReply {
    /// The file's bytes (base64) and its sniffed content type; `text` when they are UTF-8 text.
    Read {
        data: String,
        content_type: String,
        text: bool,
    },
    Listed {
        entries: Vec<(String, EntryKind)>,
    },
    Resolved(Resolved),
    Done,
    /// A checkpoint's (or a repository's new commit's) id.
    Checkpoint {
        commit: String,
    },
    Changes {
        files: Vec<ChangedFile>,
    },
    Repository {
        is_repository: bool,
    },
    /// A repository's current branch (none when detached) and its branches (at most 500, by name).
    Branches {
        current: Option<String>,
        branches: Vec<String>,
    },
    /// Paths relative to the working directory searched, best match first.
    Found {
        paths: Vec<String>,
    },
}

/// Why an operation failed (each maps to an AHP error code).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "error", content = "message", rename_all = "camelCase")]
pub enum FileError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    Conflict(String),
    /// The request cannot be served as asked (too large, not a directory, a directory, not empty…).
    #[error("{0}")]
    Invalid(String),
    /// The file server failed (it died, timed out, or the disk did).
    #[error("{0}")]
    Unavailable(String),
}

/// How a watched path changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ChangeKind {
    Added,
    Updated,
    Deleted,
}

/// What a watch saw change (a line the server writes on its own).
#[derive(Debug, Serialize, Deserialize)]
pub struct Changed {
    pub watch: u64,
    pub changes: Vec<(String, ChangeKind)>,
}

/// A line the server writes: an answer, or a watch's changes.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ServerLine {
    Answer(Answer),
    Changed(Changed),
}

/// What the runner writes to a file server: a request, or that it no longer waits for one.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ClientLine {
    /// Stop request `cancel`: not started yet, it is answered "cancelled"; running, the git it runs is killed.
    Cancel {
        cancel: u64,
    },
    Request(Request),
}

/// A request on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    #[serde(flatten)]
    pub op: FileOp,
}

/// An answer on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub struct Answer {
    pub id: u64,
    pub result: Result<FileReply, FileError>,
}
