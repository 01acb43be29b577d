//! The client's picture of the chat: the local [`ChatState`] kept in step with the relay's action stream, and
//! the line-oriented transcript printed from it.
//!
//! Output lines (one per event, so tests can grep them): `> <prompt>`, streamed reply text,
//! `(thinking) <reasoning>`, `[tool] …`, `[tool approved]`, `[tool denied]`, `[input] …`, `[input answered]`,
//! `[queued] <text>`, `[turn complete]`, `[turn cancelled]`, `[error] <message>`, `[rejected] <reason>`,
//! `[title] <title>`.

use std::collections::HashSet;
use std::io::Write;

use ahp::reducers::apply_action_to_chat;
use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{
    ChatState, PendingMessageKind, ResponsePart, Snapshot, SnapshotState, ToolCallState, TurnState,
};

/// The chat as this client sees it, and where it prints.
pub struct ChatView<W: Write> {
    session: String,
    chat: String,
    pub state: ChatState,
    /// Highest `serverSeq` applied to `state` (or its snapshot's `fromSeq`).
    chat_seq: u64,
    /// Highest `serverSeq` seen on the session channel.
    session_seq: u64,
    /// Highest `serverSeq` seen on any channel: what `reconnect` resumes from.
    last_seen: u64,
    /// Ids of turns and queued messages this client sent that the relay has not echoed yet.
    unechoed: HashSet<String>,
    /// Tool calls and input requests already announced, so a resync does not announce them twice.
    announced: HashSet<String>,
    out: Printer<W>,
}

impl<W: Write> ChatView<W> {
    /// A view of `chat` (in `session`) starting from its subscription snapshot.
    pub fn new(session: String, chat: String, state: ChatState, from_seq: u64, out: W) -> Self {
        let mut view = Self {
            session,
            chat,
            state,
            chat_seq: from_seq,
            session_seq: 0,
            last_seen: from_seq,
            unechoed: HashSet::new(),
            announced: HashSet::new(),
            out: Printer::new(out),
        };
        view.announce_pending();
        view
    }

    pub fn last_seen(&self) -> u64 {
        self.last_seen
    }

    /// Records a `serverSeq` the relay reported (e.g. in `InitializeResult`).
    pub fn saw_seq(&mut self, seq: u64) {
        self.last_seen = self.last_seen.max(seq);
    }

    /// Remembers that this client sent the turn or queued message `id`, so [`Self::is_idle`] waits for it.
    pub fn expect_echo(&mut self, id: String) {
        self.unechoed.insert(id);
    }

    /// No turn running, none of ours on its way, nothing queued.
    pub fn is_idle(&self) -> bool {
        self.state.active_turn.is_none()
            && self.unechoed.is_empty()
            && self.state.queued_messages.as_ref().is_none_or(Vec::is_empty)
    }

    /// Prints a line of the transcript.
    pub fn line(&mut self, text: &str) {
        self.out.line(text);
    }

    /// Applies one envelope from the relay (live or replayed), skipping what was already applied.
    pub fn on_envelope(&mut self, env: &ActionEnvelope) {
        self.saw_seq(env.server_seq);
        if env.channel == self.chat {
            if env.server_seq <= self.chat_seq {
                return;
            }
            self.chat_seq = env.server_seq;
            self.on_chat_action(&env.action, env.rejection_reason.as_deref());
        } else if env.channel == self.session {
            if env.server_seq <= self.session_seq {
                return;
            }
            self.session_seq = env.server_seq;
            if let (StateAction::SessionTitleChanged(a), None) = (&env.action, &env.rejection_reason) {
                self.out.line(&format!("[title] {}", a.title));
            }
        }
    }

    /// Takes a fresh snapshot (from `subscribe` or `reconnect`): the chat's replaces the local state.
    pub fn on_snapshot(&mut self, snapshot: Snapshot) {
        let from_seq = u64::try_from(snapshot.from_seq).unwrap_or(0);
        self.saw_seq(from_seq);
        if snapshot.resource == self.session {
            self.session_seq = self.session_seq.max(from_seq);
        } else if let (true, SnapshotState::Chat(state)) = (snapshot.resource == self.chat, snapshot.state) {
            let old = std::mem::replace(&mut self.state, *state);
            self.chat_seq = from_seq;
            self.catch_up_from(&old);
            self.announce_pending();
        }
    }

    fn on_chat_action(&mut self, action: &StateAction, rejection: Option<&str>) {
        if let Some(id) = sent_id(action) {
            self.unechoed.remove(id);
        }
        if let Some(reason) = rejection {
            self.out.line(&format!("[rejected] {reason}"));
            return;
        }
        apply_action_to_chat(&mut self.state, action);
        self.print_action(action);
    }

    fn print_action(&mut self, action: &StateAction) {
        match action {
            StateAction::ChatTurnStarted(a) => self.out.line(&format!("> {}", a.message.text)),
            StateAction::ChatDelta(a) if self.is_markdown(&a.part_id) => {
                self.out.stream(&a.part_id, "", &a.content)
            }
            StateAction::ChatReasoning(a) => self.out.stream(&a.part_id, "(thinking) ", &a.content),
            StateAction::ChatToolCallReady(_) | StateAction::ChatInputRequested(_) => self.announce_pending(),
            StateAction::ChatToolCallConfirmed(a) => self.out.line(if a.approved {
                "[tool approved]"
            } else {
                "[tool denied]"
            }),
            StateAction::ChatInputCompleted(_) => self.out.line("[input answered]"),
            StateAction::ChatPendingMessageSet(a) if a.kind == PendingMessageKind::Queued => {
                self.out.line(&format!("[queued] {}", a.message.text))
            }
            StateAction::ChatTurnComplete(_) => self.out.line("[turn complete]"),
            StateAction::ChatTurnCancelled(_) => self.out.line("[turn cancelled]"),
            StateAction::ChatError(a) => self.out.line(&format!("[error] {}", a.part.error.message)),
            _ => {}
        }
    }

    /// Whether `part_id` names a markdown part of the active turn.
    fn is_markdown(&self, part_id: &str) -> bool {
        self.state.active_turn.as_ref().is_some_and(|turn| {
            turn.response_parts
                .iter()
                .any(|part| matches!(part, ResponsePart::Markdown(m) if m.id == part_id))
        })
    }

    /// Prints the prompts for tool calls awaiting confirmation and open input requests not announced yet.
    fn announce_pending(&mut self) {
        let Some(turn) = self.state.active_turn.as_ref() else {
            return;
        };
        let prompts: Vec<(String, String)> = turn.response_parts.iter().filter_map(pending_prompt).collect();
        for (id, line) in prompts {
            if self.announced.insert(id) {
                self.out.line(&line);
            }
        }
    }

    /// After a resync: prints the reply text the running turn streamed while we were away, and how it ended.
    fn catch_up_from(&mut self, old: &ChatState) {
        let Some(old_turn) = old.active_turn.as_ref() else {
            return;
        };
        let (parts, ended) = match &self.state.active_turn {
            Some(turn) if turn.id == old_turn.id => (&turn.response_parts, None),
            _ => match self.state.turns.iter().find(|t| t.id == old_turn.id) {
                Some(turn) => (&turn.response_parts, Some(&turn.state)),
                None => return,
            },
        };
        for part in parts {
            if let ResponsePart::Markdown(m) = part {
                let printed = markdown_of(&old_turn.response_parts, &m.id);
                if let Some(missed) = m.content.strip_prefix(printed) {
                    self.out.stream(&m.id, "", missed);
                }
            }
        }
        match ended {
            Some(TurnState::Complete) => self.out.line("[turn complete]"),
            Some(TurnState::Cancelled) => self.out.line("[turn cancelled]"),
            Some(TurnState::Error) => {
                let message = parts.iter().rev().find_map(|part| match part {
                    ResponsePart::Error(e) => Some(e.error.message.as_str()),
                    _ => None,
                });
                self.out
                    .line(&format!("[error] {}", message.unwrap_or("the turn failed")));
            }
            None => {}
        }
    }
}

/// The content of markdown part `id` among `parts` ("" if absent).
fn markdown_of<'a>(parts: &'a [ResponsePart], id: &str) -> &'a str {
    parts
        .iter()
        .find_map(|part| match part {
            ResponsePart::Markdown(m) if m.id == id => Some(m.content.as_str()),
            _ => None,
        })
        .unwrap_or("")
}

/// For a part that waits on the user (a tool call to confirm, an open input request): its id and the line
/// announcing it.
fn pending_prompt(part: &ResponsePart) -> Option<(String, String)> {
    match part {
        ResponsePart::ToolCall(call) => match &call.tool_call {
            ToolCallState::PendingConfirmation(p) => Some((
                p.tool_call_id.clone(),
                format!(
                    "[tool] {}: {} — approve with /approve, deny with /deny",
                    p.display_name,
                    text_of(&p.invocation_message)
                ),
            )),
            _ => None,
        },
        ResponsePart::InputRequest(input) if input.response.is_none() => {
            let message = input.request.message.as_deref().unwrap_or("input requested");
            Some((
                input.request.id.clone(),
                format!("[input] {message} — answer with /answer <text>"),
            ))
        }
        _ => None,
    }
}

/// The id of a turn or queued message a client sends, to match the relay's echo.
fn sent_id(action: &StateAction) -> Option<&str> {
    match action {
        StateAction::ChatTurnStarted(a) => Some(&a.turn_id),
        StateAction::ChatPendingMessageSet(a) => Some(&a.id),
        _ => None,
    }
}

fn text_of(text: &StringOrMarkdown) -> &str {
    match text {
        StringOrMarkdown::Plain(s) => s,
        StringOrMarkdown::Markdown { markdown } => markdown,
    }
}

/// Writes whole lines, and streamed text that stays on one line until something else is printed.
struct Printer<W: Write> {
    out: W,
    /// The part whose text is being streamed on the current line.
    streaming: Option<String>,
    at_line_start: bool,
}

impl<W: Write> Printer<W> {
    fn new(out: W) -> Self {
        Self {
            out,
            streaming: None,
            at_line_start: true,
        }
    }

    /// Appends `text` of part `part_id`, starting a new line (with `prefix`) when another part was streaming.
    fn stream(&mut self, part_id: &str, prefix: &str, text: &str) {
        if text.is_empty() {
            return;
        }
        if self.streaming.as_deref() != Some(part_id) {
            self.end_line();
            self.write(prefix);
            self.streaming = Some(part_id.to_string());
        }
        self.write(text);
    }

    fn line(&mut self, text: &str) {
        self.end_line();
        self.write(text);
        self.write("\n");
        self.streaming = None;
    }

    fn end_line(&mut self) {
        if !self.at_line_start {
            self.write("\n");
        }
        self.streaming = None;
    }

    /// Writes and flushes; a closed stdout is not worth failing for.
    fn write(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let _ = self.out.write_all(text.as_bytes());
        let _ = self.out.flush();
        self.at_line_start = text.ends_with('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: &str = "ahp-session:/s";
    const CHAT: &str = "ahp-chat:/c";

    fn idle_chat() -> ChatState {
        serde_json::from_value(serde_json::json!({
            "resource": CHAT, "title": "t", "status": 0, "modifiedAt": "2025-01-01T00:00:00Z", "turns": [],
        }))
        .expect("chat state")
    }

    fn env(channel: &str, seq: u64, action: serde_json::Value) -> ActionEnvelope {
        serde_json::from_value(serde_json::json!({"channel": channel, "serverSeq": seq, "action": action}))
            .expect("envelope")
    }

    fn view() -> ChatView<Vec<u8>> {
        ChatView::new(SESSION.into(), CHAT.into(), idle_chat(), 10, Vec::new())
    }

    fn output(view: &ChatView<Vec<u8>>) -> String {
        String::from_utf8_lossy(&view.out.out).into_owned()
    }

    fn turn_actions() -> Vec<serde_json::Value> {
        use serde_json::json;
        vec![
            json!({"type": "chat/turnStarted", "turnId": "t1", "startedAt": "2025-01-01T00:00:00Z",
                   "message": {"text": "use a tool", "origin": {"kind": "user"}}}),
            json!({"type": "chat/responsePart", "turnId": "t1", "part": {"kind": "reasoning", "id": "r", "content": ""}}),
            json!({"type": "chat/reasoning", "turnId": "t1", "partId": "r", "content": "Hmm. "}),
            json!({"type": "chat/reasoning", "turnId": "t1", "partId": "r", "content": "Ok."}),
            json!({"type": "chat/responsePart", "turnId": "t1", "part": {"kind": "markdown", "id": "m", "content": ""}}),
            json!({"type": "chat/delta", "turnId": "t1", "partId": "m", "content": "Hello "}),
            json!({"type": "chat/delta", "turnId": "t1", "partId": "m", "content": "there."}),
            json!({"type": "chat/toolCallStart", "turnId": "t1", "toolCallId": "tc", "toolName": "demo_echo",
                   "displayName": "Echo"}),
            json!({"type": "chat/toolCallReady", "turnId": "t1", "toolCallId": "tc",
                   "invocationMessage": "Echo the prompt"}),
            json!({"type": "chat/toolCallConfirmed", "turnId": "t1", "toolCallId": "tc", "approved": true}),
            json!({"type": "chat/turnComplete", "turnId": "t1", "duration": 5}),
        ]
    }

    #[test]
    fn prints_a_turn_line_by_line() {
        let mut view = view();
        view.expect_echo("t1".into());
        assert!(!view.is_idle());
        for (i, action) in turn_actions().into_iter().enumerate() {
            view.on_envelope(&env(CHAT, 11 + i as u64, action));
            if i == 0 {
                assert!(!view.is_idle(), "a turn is running");
            }
        }
        assert_eq!(
            output(&view),
            "> use a tool\n(thinking) Hmm. Ok.\nHello there.\n\
             [tool] Echo: Echo the prompt — approve with /approve, deny with /deny\n\
             [tool approved]\n[turn complete]\n"
        );
        assert!(view.is_idle());
        assert_eq!(view.last_seen(), 21);
    }

    #[test]
    fn skips_seen_envelopes_and_prints_rejections() {
        let mut view = view();
        let started = turn_actions().remove(0);
        view.on_envelope(&env(CHAT, 9, started.clone()));
        assert!(view.state.active_turn.is_none(), "older than the snapshot");
        let mut rejected = env(CHAT, 11, started.clone());
        rejected.rejection_reason = Some("viewers cannot dispatch".into());
        view.expect_echo("t1".into());
        view.on_envelope(&rejected);
        assert!(view.state.active_turn.is_none());
        assert!(view.is_idle(), "a rejected prompt is not waited for");
        view.on_envelope(&env(CHAT, 11, started));
        assert!(view.state.active_turn.is_none(), "already seen");
        assert_eq!(output(&view), "[rejected] viewers cannot dispatch\n");
    }

    #[test]
    fn prints_session_titles() {
        let mut view = view();
        view.on_envelope(&env(
            SESSION,
            3,
            serde_json::json!({"type": "session/titleChanged", "title": "Hi"}),
        ));
        view.on_envelope(&env(
            SESSION,
            3,
            serde_json::json!({"type": "session/titleChanged", "title": "Hi"}),
        ));
        assert_eq!(output(&view), "[title] Hi\n");
    }

    #[test]
    fn a_resync_prints_what_the_running_turn_streamed_meanwhile() {
        let mut view = view();
        let actions = turn_actions();
        for (i, action) in actions[..6].iter().enumerate() {
            view.on_envelope(&env(CHAT, 11 + i as u64, action.clone()));
        }
        let mut done = view.state.clone();
        for action in &actions[6..] {
            let action: StateAction = serde_json::from_value(action.clone()).expect("action");
            apply_action_to_chat(&mut done, &action);
        }
        view.on_snapshot(Snapshot {
            resource: CHAT.into(),
            state: SnapshotState::Chat(Box::new(done)),
            from_seq: 40,
        });
        assert!(
            output(&view).ends_with("Hello there.\n[turn complete]\n"),
            "{}",
            output(&view)
        );
        assert_eq!(view.last_seen(), 40);
        view.on_envelope(&env(CHAT, 39, actions[0].clone()));
        assert!(view.state.active_turn.is_none(), "older than the new snapshot");
    }
}
