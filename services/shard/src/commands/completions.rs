//! The `completions` command: an ACP agent's slash commands (kept by its provider in the session's
//! `_meta["ahpRelay/agent"].commands`) offered while the user types `/…` at the start of a message, and the
//! session's files (found by the tenant's file server, fuzzy and bounded) while the user types `@…` anywhere.

use ahp_types::commands::CompletionItem;
use ahp_types::state::{MessageAttachment, SimpleMessageAttachment};
use serde_json::Value;

/// The character that starts a slash command (advertised in `initialize`'s `completionTriggerCharacters`).
pub const TRIGGER: &str = "/";

/// The character that mentions a file of the session's working directory.
pub const FILE_TRIGGER: &str = "@";

/// The text before the cursor (`offset` in UTF-16 code units) and the cursor's offset in UTF-16 units.
fn before_cursor(text: &str, offset: usize) -> (&str, usize) {
    let mut units = 0;
    let mut end = 0;
    for (at, c) in text.char_indices() {
        if units + c.len_utf16() > offset {
            break;
        }
        units += c.len_utf16();
        end = at + c.len_utf8();
    }
    (&text[..end], units)
}

/// The `@…` word the cursor ends: its range (UTF-16) and what follows the `@`.
pub fn file_query(text: &str, offset: i64) -> Option<(usize, usize, String)> {
    let (before, units) = before_cursor(text, usize::try_from(offset).ok()?);
    let start = before
        .char_indices()
        .rev()
        .find(|(_, c)| c.is_whitespace())
        .map_or(0, |(at, c)| at + c.len_utf8());
    let query = before[start..].strip_prefix(FILE_TRIGGER)?;
    Some((before[..start].encode_utf16().count(), units, query.to_string()))
}

/// Completion items for files (`paths` relative to `workspace`) replacing the range `start..end`.
pub fn file_items(workspace: &str, paths: &[String], start: usize, end: usize) -> Vec<CompletionItem> {
    paths
        .iter()
        .map(|path| CompletionItem {
            insert_text: format!("{FILE_TRIGGER}{path} "),
            range_start: i64::try_from(start).ok(),
            range_end: i64::try_from(end).ok(),
            attachment: MessageAttachment::Resource(ahp_types::state::MessageResourceAttachment {
                label: path.clone(),
                range: None,
                display_kind: Some("file".into()),
                meta: None,
                uri: format!("file://{}/{path}", workspace.trim_end_matches('/')),
                size_hint: None,
                content_type: None,
                nonce: None,
                selection: None,
            }),
        })
        .collect()
}

/// The slash commands among `commands` (`{name, description}`) that complete the `/…` word the cursor is in,
/// when that word starts the message. `offset` counts UTF-16 code units, as AHP does.
pub fn slash_commands(text: &str, offset: i64, commands: &[Value]) -> Vec<CompletionItem> {
    let Ok(offset) = usize::try_from(offset) else {
        return Vec::new();
    };
    let (before, units) = before_cursor(text, offset);
    let start = before.len() - before.trim_start().len();
    let word = &before[start..];
    let Some(prefix) = word.strip_prefix(TRIGGER) else {
        return Vec::new();
    };
    if prefix.contains(char::is_whitespace) {
        return Vec::new();
    }
    let range_start = before[..start].encode_utf16().count();
    commands
        .iter()
        .filter_map(|command| command.get("name")?.as_str())
        .filter(|name| name.starts_with(prefix))
        .map(|name| CompletionItem {
            insert_text: format!("{TRIGGER}{name} "),
            range_start: i64::try_from(range_start).ok(),
            range_end: i64::try_from(units).ok(),
            attachment: MessageAttachment::Simple(SimpleMessageAttachment {
                label: format!("{TRIGGER}{name}"),
                range: None,
                display_kind: Some("command".into()),
                meta: None,
                model_representation: None,
            }),
        })
        .collect()
}

impl crate::host::Host {
    /// `completions` at an `@…` word: the session's files, found by the tenant's file server. `None` when the
    /// text is not at one, or the session has no working directory here (the other completions answer).
    pub(crate) async fn file_completions(
        &self,
        connection: relay_core::ConnectionId,
        message: &relay_core::rpc::InboundMessage,
    ) -> Option<relay_core::link::CommandReply> {
        let params: ahp_types::commands::CompletionsParams = message.parse_params().ok()?;
        let (start, end, query) = file_query(&params.text, params.offset)?;
        let (files, tenant, workspace) = self.with_core(|core| {
            core.client_id(connection).ok()?;
            let session = core.model.chats.get(&params.channel)?.session.clone();
            let workspace = core.working_directory_of(&session)?;
            // A host-scoped token completes files of its hosts' directories only.
            core.scope_reaches(connection, &workspace).ok()?;
            Some((
                core.providers.files()?.clone(),
                core.key.tenant.clone(),
                workspace,
            ))
        })?;
        let find = relay_runner::files::FileOp::Find {
            workspace: workspace.clone(),
            query,
            limit: relay_runner::files::find::MAX_FOUND,
        };
        let items = match files.call(&tenant, find).await {
            Ok(relay_runner::files::FileReply::Found { paths }) => file_items(&workspace, &paths, start, end),
            Ok(_) => Vec::new(),
            Err(error) => {
                tracing::debug!(%error, "no files for an @ completion");
                Vec::new()
            }
        };
        Some(crate::reply::answer(
            message.id,
            crate::reply::reply(message.id, &ahp_types::commands::CompletionsResult { items }),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands() -> Vec<Value> {
        serde_json::from_value(serde_json::json!([
            {"name": "review", "description": "Review the changes"},
            {"name": "reset", "description": "Start over"},
            {"name": "help", "description": "Help"}
        ]))
        .expect("commands")
    }

    fn inserted(items: &[CompletionItem]) -> Vec<&str> {
        items.iter().map(|item| item.insert_text.as_str()).collect()
    }

    #[test]
    fn a_slash_word_at_the_start_completes_to_matching_commands() {
        let items = slash_commands("/re", 3, &commands());
        assert_eq!(inserted(&items), ["/review ", "/reset "]);
        assert_eq!((items[0].range_start, items[0].range_end), (Some(0), Some(3)));
        assert_eq!(inserted(&slash_commands("  /", 3, &commands())).len(), 3);
    }

    #[test]
    fn elsewhere_nothing_completes() {
        assert!(slash_commands("please /re", 10, &commands()).is_empty());
        assert!(slash_commands("/review this", 12, &commands()).is_empty());
        assert!(slash_commands("re", 2, &commands()).is_empty());
        assert!(slash_commands("/re", -1, &commands()).is_empty());
    }

    #[test]
    fn offsets_count_utf16_units() {
        // "😀" is two UTF-16 units; the cursor after "/h" is at 2 when the emoji follows it.
        let items = slash_commands("/h😀", 2, &commands());
        assert_eq!(inserted(&items), ["/help "]);
        assert_eq!(items[0].range_end, Some(2));
    }

    #[test]
    fn an_at_word_anywhere_is_a_file_query() {
        assert_eq!(file_query("look at @src/ma", 15), Some((8, 15, "src/ma".into())));
        assert_eq!(file_query("@", 1), Some((0, 1, String::new())));
        assert_eq!(file_query("é @x", 4), Some((2, 4, "x".into())));
        assert_eq!(file_query("mail me@x.org later", 19), None);
        assert_eq!(file_query("no at word", 10), None);
    }
}
