//! Who wrote a message, as the relay stamps it: `_meta["ahpRelay/author"]` = `{"sub": …}` (the stamping itself
//! is `commands::authorship`; the validation of truncations reads it here).

use ahp_types::state::Message;

/// The key of a message's `_meta` naming its author.
pub const AUTHOR_META: &str = "ahpRelay/author";

/// Who wrote `message`, as the relay stamped it (none for messages from before it stamped them).
pub fn author_of(message: &Message) -> Option<&str> {
    message.meta.as_ref()?.get(AUTHOR_META)?.get("sub")?.as_str()
}
