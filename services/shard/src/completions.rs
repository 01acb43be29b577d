//! The `completions` command: an ACP agent's slash commands (kept by its provider in the session's
//! `_meta["ahpRelay/agent"].commands`) offered while the user types `/…` at the start of a message.

use ahp_types::commands::CompletionItem;
use ahp_types::state::{MessageAttachment, SimpleMessageAttachment};
use serde_json::Value;

/// The character that starts a slash command (advertised in `initialize`'s `completionTriggerCharacters`).
pub const TRIGGER: &str = "/";

/// The slash commands among `commands` (`{name, description}`) that complete the `/…` word the cursor is in,
/// when that word starts the message. `offset` counts UTF-16 code units, as AHP does.
pub fn slash_commands(text: &str, offset: i64, commands: &[Value]) -> Vec<CompletionItem> {
    let Ok(offset) = usize::try_from(offset) else {
        return Vec::new();
    };
    // The text before the cursor.
    let mut units = 0;
    let mut end = 0;
    for (at, c) in text.char_indices() {
        if units + c.len_utf16() > offset {
            break;
        }
        units += c.len_utf16();
        end = at + c.len_utf8();
    }
    let before = &text[..end];
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
}
