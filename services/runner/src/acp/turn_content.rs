//! ACP content as AHP shows it: a tool's results (text, diffs as file edits with both sides as `data:` URIs and
//! their line counts), a plan's progress, a permission option's kind, a content block's text.

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    ContentBlock, PermissionOptionKind, PlanEntry, PlanEntryStatus, ToolCallContent,
};
use ahp_types::state::{
    ContentRef, FileEditDiffStats, FileEditSide, ToolResultContent, ToolResultFileEditContent,
    ToolResultTerminalContent, ToolResultTextContent,
};

/// A chat's activity for an agent's plan: the entry in progress (else the next pending one) and how many are
/// done; none once every entry is done.
pub(crate) fn plan_activity(entries: &[PlanEntry]) -> Option<String> {
    let done = entries
        .iter()
        .filter(|entry| entry.status == PlanEntryStatus::Completed)
        .count();
    let current = entries
        .iter()
        .find(|entry| entry.status == PlanEntryStatus::InProgress)
        .or_else(|| {
            entries
                .iter()
                .find(|entry| entry.status == PlanEntryStatus::Pending)
        })?;
    Some(format!("{} ({done}/{} done)", current.content, entries.len()))
}

/// An ACP tool call's content as AHP tool result content: text; a diff as a file edit (each side's content
/// inline as a `data:` URI, since AHP 1.0 carries file contents by reference, with line counts); a terminal
/// the relay runs as a link to its `ahp-terminal:` channel.
pub(crate) fn result_contents(contents: Option<&[ToolCallContent]>) -> Vec<ToolResultContent> {
    contents
        .into_iter()
        .flatten()
        .filter_map(|content| match content {
            // An image as the image it is (the host keeps a large one by reference).
            ToolCallContent::Content(c) => match &c.content {
                ContentBlock::Image(image) => Some(ToolResultContent::EmbeddedResource(
                    ahp_types::state::ToolResultEmbeddedResourceContent {
                        data: image.data.clone(),
                        content_type: image.mime_type.clone(),
                    },
                )),
                other => Some(ToolResultContent::Text(ToolResultTextContent {
                    text: text_of(other),
                })),
            },
            ToolCallContent::Diff(diff) => Some(ToolResultContent::FileEdit(file_edit(
                &diff.path,
                diff.old_text.as_deref(),
                &diff.new_text,
            ))),
            ToolCallContent::Terminal(terminal) => {
                let uri = terminal.terminal_id.0.to_string();
                uri.starts_with("ahp-terminal:").then(|| {
                    ToolResultContent::Terminal(ToolResultTerminalContent {
                        resource: uri,
                        title: "Terminal".into(),
                        is_pty: Some(false),
                        result: None,
                    })
                })
            }
            _ => None,
        })
        .collect()
}

/// A file edit: `path` from `before` (absent: a new file) to `after`.
pub fn file_edit(path: &std::path::Path, before: Option<&str>, after: &str) -> ToolResultFileEditContent {
    let uri = format!("file://{}", path.display());
    let side = |text: &str| FileEditSide {
        uri: uri.clone(),
        content: ContentRef {
            uri: data_uri(text),
            size_hint: i64::try_from(text.len()).ok(),
            content_type: Some("text/plain".into()),
            nonce: None,
        },
    };
    let (added, removed) = changed_lines(before.unwrap_or(""), after);
    ToolResultFileEditContent {
        before: before.map(side),
        after: Some(side(after)),
        diff: Some(FileEditDiffStats {
            added: Some(added),
            removed: Some(removed),
        }),
    }
}

/// `text` as a `data:` URI.
pub(crate) fn data_uri(text: &str) -> String {
    use base64::Engine;
    format!(
        "data:text/plain;charset=utf-8;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(text)
    )
}

/// Lines only in `after` and lines only in `before`, counted as multisets (an edit's size, not its
/// position).
pub(crate) fn changed_lines(before: &str, after: &str) -> (i64, i64) {
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for line in before.lines() {
        *counts.entry(line).or_default() -= 1;
    }
    for line in after.lines() {
        *counts.entry(line).or_default() += 1;
    }
    let added = counts.values().filter(|n| **n > 0).sum();
    let removed = -counts.values().filter(|n| **n < 0).sum::<i64>();
    (added, removed)
}

pub(crate) fn is_allow(kind: PermissionOptionKind) -> bool {
    matches!(
        kind,
        PermissionOptionKind::AllowOnce | PermissionOptionKind::AllowAlways
    )
}

/// The text of a content block (other kinds are named, not shown: AHP needs hosted URIs for them).
pub(crate) fn text_of(content: &ContentBlock) -> String {
    match content {
        ContentBlock::Text(text) => text.text.clone(),
        ContentBlock::ResourceLink(link) => link.uri.clone(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_shows_its_current_entry_and_progress() {
        use agent_client_protocol::v1::schema::PlanEntryPriority;
        let entry = |content: &str, status| PlanEntry::new(content, PlanEntryPriority::Medium, status);
        let plan = [
            entry("read", PlanEntryStatus::Completed),
            entry("write", PlanEntryStatus::InProgress),
            entry("test", PlanEntryStatus::Pending),
        ];
        assert_eq!(plan_activity(&plan).as_deref(), Some("write (1/3 done)"));
        assert_eq!(plan_activity(&plan[..1]), None);
    }

    #[test]
    fn a_file_edit_carries_both_sides_and_its_line_counts() {
        let edit = file_edit(
            std::path::Path::new("/w/a.txt"),
            Some("one\ntwo\n"),
            "one\nthree\nfour\n",
        );
        assert_eq!(
            edit.before.as_ref().map(|side| side.uri.as_str()),
            Some("file:///w/a.txt")
        );
        let after = edit.after.expect("after");
        assert_eq!(after.content.uri, data_uri("one\nthree\nfour\n"));
        let stats = edit.diff.expect("stats");
        assert_eq!((stats.added, stats.removed), (Some(2), Some(1)));
        // A new file has no before side.
        assert!(file_edit(std::path::Path::new("/w/b"), None, "x")
            .before
            .is_none());
    }
}
