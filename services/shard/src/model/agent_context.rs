//! What a chat's agent has yet to be told of the chat's history, and the transcript that tells it.
//!
//! An agent keeps its own context per chat (an ACP session). Three things give a chat history its agent has
//! not seen: a fork (its copied turns), a side chat (its source chat up to the source turn, and the selected
//! text, snapshotted when the side chat is created), and a truncation (the agent saw turns the chat no
//! longer has: it starts the chat afresh). The chat's next turn carries the history as a transcript
//! (`TurnRequest::context`), bounded to [`MAX_TRANSCRIPT_BYTES`] (the newest turns are kept).

use ahp_types::commands::SideChatSource;
use ahp_types::state::{ChatOrigin, ChatState, ResponsePart, Turn};

/// At most this much transcript goes to an agent (about 16k tokens): older turns are left out, saying so.
pub const MAX_TRANSCRIPT_BYTES: usize = 64 * 1024;

/// What a chat's agent has yet to be told before the chat's next turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum AgentContext {
    /// It has seen the chat as it stands.
    #[default]
    Current,
    /// The chat's turns are new to it (a fork's copies), and for a side chat also its source: the
    /// transcript taken when the side chat was created (`None` after a restart: taken again from the
    /// source chat when the turn starts).
    Owed { source: Option<String> },
    /// It saw turns a truncation removed: it starts the chat afresh, told the kept turns.
    Reset,
}

impl AgentContext {
    /// What a chat restored from the store owes its agent: a fork or side chat that has run no turn of its
    /// own still owes its history (the agent's own session for it never existed); anything else is as the
    /// agent left it.
    pub fn at_restore(state: &ChatState) -> AgentContext {
        let untouched = match &state.origin {
            Some(ChatOrigin::Fork { turn_id, .. }) => state.turns.last().is_some_and(|t| &t.id == turn_id),
            Some(ChatOrigin::SideChat { .. }) => state.turns.is_empty(),
            _ => false,
        };
        if untouched {
            AgentContext::Owed { source: None }
        } else {
            AgentContext::Current
        }
    }
}

/// The transcript a chat's next turn gives its agent (`None` when there is nothing to tell), and whether the
/// agent must start the chat afresh (whenever something is owed: the chat's context is told once, to a new
/// agent session, and stays owed until a turn of the chat completes). `source` resolves a side chat's
/// source when its snapshot is gone.
pub fn for_turn(
    owed: AgentContext,
    chat: &ChatState,
    source: impl FnOnce(&str, &str) -> Option<String>,
) -> (Option<String>, bool) {
    match owed {
        AgentContext::Current => (None, false),
        AgentContext::Reset => (history(&chat.turns, "the turns this chat keeps"), true),
        AgentContext::Owed { source: snapshot } => {
            let side = match (&chat.origin, snapshot) {
                (_, Some(snapshot)) => Some(snapshot),
                (
                    Some(ChatOrigin::SideChat {
                        chat,
                        turn_id,
                        selection,
                    }),
                    None,
                ) => source(chat, turn_id)
                    .map(|text| with_selection(text, selection.as_ref().map(|s| s.text.as_str()))),
                _ => None,
            };
            let own = history(&chat.turns, "this chat so far");
            let text = match (side, own) {
                (Some(side), Some(own)) => Some(format!("{side}\n\n{own}")),
                (side, own) => side.or(own),
            };
            // Afresh too: until a turn completes the agent may have got this already (a turn that failed or
            // was cancelled), and a new session told it once is what it should hold.
            (text, true)
        }
    }
}

/// The side chat's source, as its agent is told: the source chat's turns up to and including `turn_id` (or
/// up to its active turn, with the partial answer, when that is the one named).
pub fn side_chat_source(source: &ChatState, request: &SideChatSource) -> Option<String> {
    let text = source_transcript(source, &request.turn_id)?;
    Some(with_selection(
        text,
        request.selection.as_ref().map(|s| s.text.as_str()),
    ))
}

/// The source chat up to the turn named, as a transcript (see [`side_chat_source`]).
pub fn source_transcript(source: &ChatState, turn_id: &str) -> Option<String> {
    let mut turns: Vec<(&str, String)> = Vec::new();
    if let Some(index) = source.turns.iter().position(|t| t.id == turn_id) {
        turns.extend(
            source.turns[..=index]
                .iter()
                .map(|t| (t.message.text.as_str(), answer(&t.response_parts))),
        );
    } else if let Some(active) = source.active_turn.as_ref().filter(|t| t.id == turn_id) {
        turns.extend(
            source
                .turns
                .iter()
                .map(|t| (t.message.text.as_str(), answer(&t.response_parts))),
        );
        turns.push((active.message.text.as_str(), answer(&active.response_parts)));
    } else {
        return None;
    }
    let body = bounded(&turns);
    Some(format!(
        "[Context from the relay] This is a side chat about another chat of this session. That chat, up to \
         the turn it is about:\n\n{body}"
    ))
}

/// A chat's transcript from its first retained turn through `through` (a chat attachment's content), never
/// expanding the attachments inside it; `None` when the turn is not retained.
pub fn transcript_through(chat: &ChatState, through: &str) -> Option<String> {
    let index = chat.turns.iter().position(|t| t.id == through)?;
    let turns: Vec<(&str, String)> = chat.turns[..=index]
        .iter()
        .map(|t| (t.message.text.as_str(), answer(&t.response_parts)))
        .collect();
    Some(bounded(&turns))
}

fn with_selection(text: String, selection: Option<&str>) -> String {
    match selection {
        Some(selection) => format!("{text}\n\nThe part of it the user selected:\n{selection}"),
        None => text,
    }
}

/// A transcript of `turns` under a heading, `None` when there are none.
fn history(turns: &[Turn], what: &str) -> Option<String> {
    if turns.is_empty() {
        return None;
    }
    let pairs: Vec<(&str, String)> = turns
        .iter()
        .map(|t| (t.message.text.as_str(), answer(&t.response_parts)))
        .collect();
    Some(format!(
        "[Context from the relay] The conversation of {what}, which you have not seen in this session; \
         answer the message that follows it:\n\n{}",
        bounded(&pairs)
    ))
}

/// The assistant's answer in a turn: its markdown parts, in order.
fn answer(parts: &[ResponsePart]) -> String {
    parts
        .iter()
        .filter_map(|part| match part {
            ResponsePart::Markdown(markdown) => Some(markdown.content.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("")
}

/// "User: … / Assistant: …" for each turn, the newest kept within [`MAX_TRANSCRIPT_BYTES`].
fn bounded(turns: &[(&str, String)]) -> String {
    let mut kept: Vec<String> = Vec::new();
    let mut size = 0;
    for (message, answer) in turns.iter().rev() {
        let entry = format!("User: {message}\nAssistant: {answer}\n");
        if size + entry.len() > MAX_TRANSCRIPT_BYTES {
            break;
        }
        size += entry.len();
        kept.push(entry);
    }
    let left_out = turns.len() - kept.len();
    kept.reverse();
    let mut text = String::new();
    if left_out > 0 {
        text.push_str(&format!("({left_out} earlier turns left out)\n"));
    }
    text.push_str(&kept.join("\n"));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(id: &str, message: &str, answer: &str) -> Turn {
        serde_json::from_value(serde_json::json!({
            "id": id, "message": {"text": message, "origin": {"kind": "user"}},
            "responseParts": [{"kind": "markdown", "id": format!("{id}-a"), "content": answer}],
            "state": "complete"
        }))
        .unwrap_or_else(|error| panic!("turn: {error}"))
    }

    fn chat(turns: Vec<Turn>, origin: serde_json::Value) -> ChatState {
        let mut state: ChatState = serde_json::from_value(serde_json::json!({
            "resource": "ahp-chat:/c", "title": "", "status": 1, "turns": [], "modifiedAt": "now",
            "origin": origin
        }))
        .unwrap_or_else(|error| panic!("chat: {error}"));
        state.turns = turns;
        state
    }

    #[test]
    fn a_reset_tells_the_kept_turns_and_starts_afresh() {
        let state = chat(
            vec![turn("t1", "first question", "first answer")],
            serde_json::Value::Null,
        );
        let (text, fresh) = for_turn(AgentContext::Reset, &state, |_, _| None);
        let text = text.unwrap_or_default();
        assert!(fresh);
        assert!(
            text.contains("User: first question\nAssistant: first answer"),
            "{text}"
        );
        let (nothing, fresh) = for_turn(AgentContext::Current, &state, |_, _| None);
        assert_eq!((nothing, fresh), (None, false));
    }

    #[test]
    fn a_transcript_keeps_the_newest_turns_within_its_bound() {
        let long = "x".repeat(MAX_TRANSCRIPT_BYTES / 3);
        let turns: Vec<Turn> = (0..5)
            .map(|n| turn(&format!("t{n}"), &format!("q{n}"), &long))
            .collect();
        let text = history(&turns, "it").unwrap_or_default();
        assert!(text.len() <= MAX_TRANSCRIPT_BYTES + 512, "{}", text.len());
        assert!(text.contains("(3 earlier turns left out)"), "{}", &text[..200]);
        assert!(text.contains("User: q4") && text.contains("User: q3") && !text.contains("User: q2"));
    }

    #[test]
    fn a_restored_fork_owes_its_history_until_it_runs_a_turn() {
        let origin = serde_json::json!({"kind": "fork", "chat": "ahp-chat:/s", "turnId": "t1"});
        let fork = chat(vec![turn("t1", "q", "a")], origin.clone());
        assert_eq!(
            AgentContext::at_restore(&fork),
            AgentContext::Owed { source: None }
        );
        let continued = chat(vec![turn("t1", "q", "a"), turn("t2", "q2", "a2")], origin);
        assert_eq!(AgentContext::at_restore(&continued), AgentContext::Current);
    }
}
