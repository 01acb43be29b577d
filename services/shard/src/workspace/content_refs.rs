//! Content by reference: what an agent's tool results carry inline — file edits' before and after sides
//! (`data:` URIs), embedded resources (images), long text output — is moved out of the state tree when it is
//! larger than `--content-ref-bytes`: its bytes are stored with the action's batch (owned by the session, deleted
//! with it) and the state names them by an `ahp-content:/<id>` URI, which `resourceRead` serves to the host's
//! clients. Snapshots and replays stay small however much an agent prints; a long text keeps a short preview
//! inline.

use ahp_types::actions::StateAction;
use ahp_types::state::{ToolResultContent, ToolResultResourceContent, ToolResultTextContent};
use base64::Engine;
use relay_store::StoredContent;

/// The URI scheme of content kept by reference.
pub const CONTENT_SCHEME: &str = "ahp-content:";
/// Characters of a long text output kept inline as its preview.
pub const PREVIEW_CHARS: usize = 2_000;

const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The id an `ahp-content:` URI names.
pub fn id_of(uri: &str) -> Option<&str> {
    uri.strip_prefix(CONTENT_SCHEME)?
        .strip_prefix('/')
        .filter(|id| !id.is_empty() && id.len() <= 64)
}

/// A `data:` URI's content type and bytes.
pub(crate) fn decode_data_uri(uri: &str) -> Option<(String, Vec<u8>)> {
    let (head, payload) = uri.strip_prefix("data:")?.split_once(',')?;
    let mut parts = head.split(';');
    let content_type = parts
        .next()
        .filter(|t| !t.is_empty())
        .unwrap_or("text/plain")
        .to_string();
    let base64 = head.split(';').any(|part| part == "base64");
    let bytes = if base64 {
        BASE64.decode(payload).ok()?
    } else {
        percent_decode(payload)
    };
    Some((content_type, bytes))
}

fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = (bytes[at] == b'%')
            .then(|| bytes.get(at + 1..at + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match hex {
            Some(byte) => {
                out.push(byte);
                at += 3;
            }
            None => {
                out.push(bytes[at]);
                at += 1;
            }
        }
    }
    out
}

/// Whether `action` is one whose content [`extract`] looks at (a tool call's result or content): the others —
/// every streamed delta among them — cost nothing here.
pub fn may_carry(action: &StateAction) -> bool {
    matches!(
        action,
        StateAction::ChatToolCallComplete(_) | StateAction::ChatToolCallContentChanged(_)
    )
}

/// Moves `action`'s inline contents larger than `threshold` bytes out, naming them by reference; returns them,
/// owned by `session`, to store with the action. A running tool call's content update (its output so far,
/// sent again whole at each update) stores nothing: what is large is cut to its newest part inline, and the
/// whole output is stored once, with the call's result — 200 updates of a growing 100 KB output were 10 MB.
pub fn extract(action: &mut StateAction, session: &str, threshold: usize) -> Vec<StoredContent> {
    if let StateAction::ChatToolCallContentChanged(changed) = action {
        for content in &mut changed.content {
            match content {
                ToolResultContent::Text(text) if text.text.len() > threshold => {
                    let total = text.text.len();
                    let mut start = total.saturating_sub(PREVIEW_CHARS);
                    while !text.text.is_char_boundary(start) {
                        start += 1;
                    }
                    text.text = format!(
                        "… ({total} bytes so far; the whole output comes with the result)\n{}",
                        &text.text[start..]
                    );
                }
                ToolResultContent::EmbeddedResource(embedded) if embedded.data.len() / 4 * 3 > threshold => {
                    *content = ToolResultContent::Text(ToolResultTextContent {
                        text: format!(
                            "({} of {} bytes; it comes with the result)",
                            embedded.content_type,
                            embedded.data.len() / 4 * 3
                        ),
                    });
                }
                _ => {}
            }
        }
    }
    let contents = match action {
        StateAction::ChatToolCallComplete(complete) => complete.result.content.as_mut(),
        StateAction::ChatToolCallContentChanged(changed) => Some(&mut changed.content),
        _ => None,
    };
    let Some(contents) = contents else {
        return Vec::new();
    };
    let mut stored = Vec::new();
    let mut keep = |content_type: String, bytes: &[u8]| -> String {
        let id = uuid::Uuid::new_v4().simple().to_string();
        stored.push(StoredContent {
            id: id.clone(),
            owner: session.to_string(),
            content_type,
            data: BASE64.encode(bytes),
        });
        format!("{CONTENT_SCHEME}/{id}")
    };
    let mut out = Vec::with_capacity(contents.len());
    for content in contents.drain(..) {
        match content {
            ToolResultContent::FileEdit(mut edit) => {
                for side in [edit.before.as_mut(), edit.after.as_mut()].into_iter().flatten() {
                    let Some((content_type, bytes)) = decode_data_uri(&side.content.uri) else {
                        continue;
                    };
                    if bytes.len() > threshold {
                        side.content.uri = keep(content_type.clone(), &bytes);
                        side.content.size_hint = i64::try_from(bytes.len()).ok();
                        side.content.content_type = Some(content_type);
                    }
                }
                out.push(ToolResultContent::FileEdit(edit));
            }
            ToolResultContent::EmbeddedResource(embedded) if embedded.data.len() / 4 * 3 > threshold => {
                match BASE64.decode(&embedded.data) {
                    Ok(bytes) => out.push(ToolResultContent::Resource(ToolResultResourceContent {
                        uri: keep(embedded.content_type.clone(), &bytes),
                        size_hint: i64::try_from(bytes.len()).ok(),
                        content_type: Some(embedded.content_type),
                        nonce: None,
                    })),
                    Err(_) => out.push(ToolResultContent::EmbeddedResource(embedded)),
                }
            }
            ToolResultContent::Text(text) if text.text.len() > threshold => {
                let uri = keep("text/plain; charset=utf-8".into(), text.text.as_bytes());
                let preview: String = text.text.chars().take(PREVIEW_CHARS).collect();
                out.push(ToolResultContent::Text(ToolResultTextContent {
                    text: format!("{preview}\n… ({} bytes in all: {uri})", text.text.len()),
                }));
                out.push(ToolResultContent::Resource(ToolResultResourceContent {
                    uri,
                    size_hint: i64::try_from(text.text.len()).ok(),
                    content_type: Some("text/plain; charset=utf-8".into()),
                    nonce: None,
                }));
            }
            other => out.push(other),
        }
    }
    *contents = out;
    stored
}

#[cfg(test)]
mod tests {
    use super::*;
    use ahp_types::actions::ChatToolCallCompleteAction;
    use ahp_types::common::StringOrMarkdown;
    use ahp_types::state::{ToolCallResult, ToolResultEmbeddedResourceContent};

    fn complete(content: Vec<ToolResultContent>) -> StateAction {
        StateAction::ChatToolCallComplete(ChatToolCallCompleteAction {
            turn_id: "t".into(),
            tool_call_id: "c".into(),
            meta: None,
            result: ToolCallResult {
                success: true,
                past_tense_message: StringOrMarkdown::Plain("done".into()),
                content: Some(content),
                structured_content: None,
                error: None,
            },
            requires_result_confirmation: None,
        })
    }

    fn contents(action: &StateAction) -> Vec<ToolResultContent> {
        match action {
            StateAction::ChatToolCallComplete(a) => a.result.content.clone().unwrap_or_default(),
            _ => vec![],
        }
    }

    /// Issue 33 (8): a running tool call's output, sent whole at each update as it grows, is stored with its
    /// result only: 200 updates of a growing 100 KB output store nothing, each update carrying its newest part.
    #[test]
    fn a_running_tool_calls_updates_store_nothing_and_keep_the_newest_output() {
        let mut stored = 0;
        for update in 1..=200 {
            let text = format!("{}end-{update}", "x".repeat(update * 500));
            let mut action = StateAction::ChatToolCallContentChanged(
                ahp_types::actions::ChatToolCallContentChangedAction {
                    turn_id: "t".into(),
                    tool_call_id: "c".into(),
                    meta: None,
                    content: vec![ToolResultContent::Text(ToolResultTextContent { text })],
                },
            );
            stored += extract(&mut action, "ahp-session:/s", 8192)
                .iter()
                .map(|content| content.data.len())
                .sum::<usize>();
            let StateAction::ChatToolCallContentChanged(changed) = &action else {
                panic!("{action:?}");
            };
            let ToolResultContent::Text(shown) = &changed.content[0] else {
                panic!("{changed:?}");
            };
            // Within the threshold it stays whole; past it, its newest part.
            assert!(
                shown.text.len() <= 8192,
                "update {update}: {} bytes inline",
                shown.text.len()
            );
            assert!(
                shown.text.ends_with(&format!("end-{update}")),
                "the newest part is kept"
            );
        }
        assert_eq!(stored, 0, "updates stored copies");
    }

    #[test]
    fn large_inline_contents_move_out_and_small_ones_stay() {
        let big = "x".repeat(10_000);
        let mut action = complete(vec![
            ToolResultContent::FileEdit(relay_runner::acp::turn_content::file_edit(
                std::path::Path::new("/w/a.txt"),
                Some("small\n"),
                &big,
            )),
            ToolResultContent::Text(ToolResultTextContent { text: big.clone() }),
            ToolResultContent::Text(ToolResultTextContent { text: "short".into() }),
            ToolResultContent::EmbeddedResource(ToolResultEmbeddedResourceContent {
                data: BASE64.encode(vec![7_u8; 9_000]),
                content_type: "image/png".into(),
            }),
        ]);
        let stored = extract(&mut action, "ahp-session:/s", 4096);
        assert_eq!(stored.len(), 3, "the edit's large side, the long text, the image");
        assert!(stored.iter().all(|content| content.owner == "ahp-session:/s"));
        let after = contents(&action);
        let ToolResultContent::FileEdit(edit) = &after[0] else {
            panic!("{after:?}");
        };
        assert!(
            edit.before
                .as_ref()
                .expect("before")
                .content
                .uri
                .starts_with("data:"),
            "small stays inline"
        );
        let moved = &edit.after.as_ref().expect("after").content;
        assert!(id_of(&moved.uri).is_some(), "{}", moved.uri);
        assert_eq!(moved.size_hint, Some(10_000));
        let kept = stored
            .iter()
            .find(|c| moved.uri.ends_with(&c.id))
            .expect("stored");
        assert_eq!(BASE64.decode(&kept.data).expect("b64"), big.as_bytes());
        assert!(
            matches!(&after[1], ToolResultContent::Text(t) if t.text.len() < 2_200 && t.text.contains(CONTENT_SCHEME))
        );
        assert!(matches!(&after[2], ToolResultContent::Resource(r) if r.size_hint == Some(10_000)));
        assert!(matches!(&after[3], ToolResultContent::Text(t) if t.text == "short"));
        assert!(
            matches!(&after[4], ToolResultContent::Resource(r) if r.content_type.as_deref() == Some("image/png"))
        );
        let json = serde_json::to_string(&action).expect("json");
        assert!(
            json.len() < 4_000,
            "the action is small now: {} bytes",
            json.len()
        );
    }

    #[test]
    fn data_uris_decode_both_ways_and_ids_are_checked() {
        assert_eq!(
            decode_data_uri("data:text/plain;charset=utf-8;base64,aGk="),
            Some(("text/plain".into(), b"hi".to_vec()))
        );
        assert_eq!(
            decode_data_uri("data:,a%20b"),
            Some(("text/plain".into(), b"a b".to_vec()))
        );
        assert_eq!(id_of("ahp-content:/abc"), Some("abc"));
        assert_eq!(id_of("ahp-content:/"), None);
        assert_eq!(id_of("file:///abc"), None);
    }
}
