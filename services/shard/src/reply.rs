//! What every command answers with: [`CommandResult`], its JSON-RPC frame ([`reply`], [`answer`]), the error
//! for a channel that is not there ([`not_found`]), a file server's error as AHP's ([`file_error`]) and the host's
//! clock ([`now`]). This is the floor below every
//! handler: it imports nothing of the shard, so a handler never imports the router that calls it.

use ahp_types::errors::ahp_error_codes;
use relay_core::link::CommandReply;
use relay_core::rpc::{self, RpcError};
use relay_runner::files::FileError;
use serde::Serialize;

/// What a command handler returns: its reply, or the error to answer with.
pub type CommandResult = Result<CommandReply, RpcError>;

/// The reply frame for a command's `result` (nothing for a notification).
pub fn reply<T: Serialize + ?Sized>(id: Option<u64>, result: &T) -> CommandResult {
    match id {
        Some(id) => rpc::result_frame(id, result)
            .map(CommandReply::frame)
            .map_err(|e| RpcError::internal(format!("could not serialize result: {e}"))),
        None => Ok(CommandReply::none()),
    }
}

/// The reply to send for a command's result: its frame, or the error as a JSON-RPC error frame.
pub fn answer(id: Option<u64>, result: CommandResult) -> CommandReply {
    result.unwrap_or_else(|error| CommandReply::frame(rpc::error_frame(id, &error)))
}

/// The time now, as AHP timestamps are written (RFC 3339, milliseconds).
pub fn now() -> String {
    format!("{:.3}", jiff::Timestamp::now())
}

/// The error for a channel that does not exist (or that this identity may not see: the same answer).
pub fn not_found(channel: &str) -> RpcError {
    // -32001 names a missing session; a session's sub-resources (e.g. `<session>/annotations`) and other
    // URIs are -32008.
    if channel.starts_with("ahp-session:") && !is_session_subresource(channel) {
        RpcError::session_not_found(channel)
    } else {
        RpcError::not_found(channel)
    }
}

/// Whether a URI under `ahp-session:` names something of a session other than the session itself.
fn is_session_subresource(uri: &str) -> bool {
    const SUBRESOURCES: &[&str] = &["/annotations", "/changesets", "/terminals"];
    SUBRESOURCES.iter().any(|suffix| uri.ends_with(suffix))
}

/// A file server's error as the AHP error a client is answered with.
pub fn file_error(error: FileError) -> RpcError {
    match error {
        FileError::NotFound(message) => RpcError::new(ahp_error_codes::NOT_FOUND, message),
        FileError::PermissionDenied(message) => RpcError::permission_denied(message),
        FileError::AlreadyExists(message) => RpcError::new(ahp_error_codes::ALREADY_EXISTS, message),
        FileError::Conflict(message) => RpcError::new(ahp_error_codes::CONFLICT, message),
        FileError::Invalid(message) => RpcError::invalid_params(message),
        FileError::Unavailable(message) => RpcError::internal(message),
    }
}
