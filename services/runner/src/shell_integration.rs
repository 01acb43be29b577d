//! Shell integration: the bash start-up script a device's terminal runs, which marks each prompt, command line,
//! command start and exit status with OSC 633 sequences (the ones VS Code's shell integration uses), and the
//! parser that takes those sequences out of the terminal's output and turns them into events — from which the
//! relay dispatches `terminal/commandExecuted`, `terminal/commandFinished` and `terminal/cwdChanged`.

/// The bash start-up script of a device's terminal (run by its first `PROMPT_COMMAND`, so nothing is written to
/// the session's directories): the user's `~/.bashrc` first, then the marks.
pub const BASH_RC: &str = r#"# ahp-relay: shell integration (OSC 633), so every device sees each command and its exit status.
if [ -f "$HOME/.bashrc" ]; then . "$HOME/.bashrc"; fi
HISTCONTROL=
__ahp_escape() { local s=$1; s=${s//\\/\\\\}; s=${s//;/\\x3b}; s=${s//$'\n'/\\x0a}; printf '%s' "$s"; }
__ahp_running=
__ahp_preexec() {
  [ -n "$COMP_LINE" ] && return
  [ -n "$__ahp_running" ] && return
  [ "$BASH_COMMAND" = __ahp_precmd ] && return
  __ahp_running=1
  local line; line=$(HISTTIMEFORMAT= builtin history 1); line=${line#*[0-9]  }
  printf '\033]633;E;%s\007\033]633;C\007' "$(__ahp_escape "$line")"
}
__ahp_precmd() {
  local status=$?
  [ -n "$__ahp_running" ] && printf '\033]633;D;%s\007' "$status"
  __ahp_running=
  printf '\033]633;P;Cwd=%s\007\033]633;A\007' "$(__ahp_escape "$PWD")"
}
PS1='\w \$ '
unset __AHP_RC
export -n PROMPT_COMMAND
PROMPT_COMMAND=__ahp_precmd
__ahp_precmd
# Last: the trap fires before every later simple command, and nothing of this file may count as one.
trap '__ahp_preexec' DEBUG
"#;

/// What the terminal's output held: text to show, or a mark of the shell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShellEvent {
    /// Output to show (the marks taken out).
    Output(Vec<u8>),
    /// A prompt starts: the shell integration is running.
    Prompt,
    /// The command line about to run.
    CommandLine(String),
    /// The command started.
    Executed,
    /// The command finished, with its exit status if the shell said it.
    Finished(Option<i64>),
    /// The shell's working directory.
    Cwd(String),
}

const INTRODUCER: &[u8] = b"\x1b]633;";
/// A mark longer than this is not one: its bytes are shown as they are.
const MAX_MARK: usize = 16 * 1024;

/// Takes OSC 633 marks out of a byte stream that may split them anywhere.
#[derive(Debug, Default)]
pub struct MarkParser {
    carry: Vec<u8>,
}

impl MarkParser {
    /// The events in `bytes` (with what earlier calls left unfinished), in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<ShellEvent> {
        let mut data = std::mem::take(&mut self.carry);
        data.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut output = Vec::new();
        let mut at = 0;
        while at < data.len() {
            let Some(start) = find(&data[at..], INTRODUCER).map(|found| at + found) else {
                // A mark's beginning may be cut at the end: keep it for the next call.
                let keep = partial_introducer(&data[at..]);
                output.extend_from_slice(&data[at..data.len() - keep]);
                self.carry = data[data.len() - keep..].to_vec();
                break;
            };
            output.extend_from_slice(&data[at..start]);
            let body = start + INTRODUCER.len();
            match terminator(&data[body..]) {
                Some((length, skip)) => {
                    if !output.is_empty() {
                        events.push(ShellEvent::Output(std::mem::take(&mut output)));
                    }
                    if let Some(event) = mark(&data[body..body + length]) {
                        events.push(event);
                    }
                    at = body + length + skip;
                }
                None if data.len() - start <= MAX_MARK => {
                    self.carry = data[start..].to_vec();
                    break;
                }
                None => {
                    output.extend_from_slice(&data[start..body]);
                    at = body;
                }
            }
        }
        if !output.is_empty() {
            events.push(ShellEvent::Output(output));
        }
        events
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// How many bytes at the end of `data` begin the introducer.
fn partial_introducer(data: &[u8]) -> usize {
    (1..INTRODUCER.len())
        .rev()
        .find(|&length| data.len() >= length && data.ends_with(&INTRODUCER[..length]))
        .unwrap_or(0)
}

/// The mark's length and its terminator's (BEL, or ESC \).
fn terminator(data: &[u8]) -> Option<(usize, usize)> {
    data.iter().enumerate().find_map(|(at, byte)| match byte {
        0x07 => Some((at, 1)),
        0x1b if data.get(at + 1) == Some(&b'\\') => Some((at, 2)),
        _ => None,
    })
}

fn mark(body: &[u8]) -> Option<ShellEvent> {
    let text = String::from_utf8_lossy(body);
    let (kind, rest) = text.split_once(';').unwrap_or((&text, ""));
    match kind {
        "A" => Some(ShellEvent::Prompt),
        "C" => Some(ShellEvent::Executed),
        "D" => Some(ShellEvent::Finished(rest.parse().ok())),
        // `E;<command line>[;<nonce>]`
        "E" => Some(ShellEvent::CommandLine(unescape(
            rest.split(';').next().unwrap_or_default(),
        ))),
        "P" => rest
            .strip_prefix("Cwd=")
            .map(|cwd| ShellEvent::Cwd(unescape(cwd))),
        _ => None,
    }
}

/// `\\` is a backslash, `\xHH` a byte.
fn unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'\\' {
            if bytes.get(at + 1) == Some(&b'\\') {
                out.push(b'\\');
                at += 2;
                continue;
            }
            if bytes.get(at + 1) == Some(&b'x') {
                if let Some(byte) = bytes
                    .get(at + 2..at + 4)
                    .and_then(|hex| std::str::from_utf8(hex).ok())
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                {
                    out.push(byte);
                    at += 4;
                    continue;
                }
            }
        }
        out.push(bytes[at]);
        at += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(text: &str) -> ShellEvent {
        ShellEvent::Output(text.as_bytes().to_vec())
    }

    #[test]
    fn marks_are_taken_out_of_the_output_in_order() {
        let stream = b"ls\r\n\x1b]633;E;ls -l \\x3b echo a\\\\b\x07\x1b]633;C\x07file\r\n\x1b]633;D;2\x07\x1b]633;P;Cwd=/w/x\x1b\\\x1b]633;A\x07$ ";
        let events = MarkParser::default().feed(stream);
        assert_eq!(
            events,
            vec![
                output("ls\r\n"),
                ShellEvent::CommandLine("ls -l ; echo a\\b".into()),
                ShellEvent::Executed,
                output("file\r\n"),
                ShellEvent::Finished(Some(2)),
                ShellEvent::Cwd("/w/x".into()),
                ShellEvent::Prompt,
                output("$ "),
            ]
        );
    }

    #[test]
    fn a_mark_split_anywhere_is_found_whole() {
        let stream: &[u8] = b"a\x1b]633;D;0\x07b\x1b]633;C\x07c";
        let whole = MarkParser::default().feed(stream);
        for cut in 0..stream.len() {
            let mut parser = MarkParser::default();
            let mut events = parser.feed(&stream[..cut]);
            events.extend(parser.feed(&stream[cut..]));
            // Output may arrive in more pieces; joined, it is the same.
            let mut joined: Vec<ShellEvent> = Vec::new();
            for event in events {
                match (joined.last_mut(), event) {
                    (Some(ShellEvent::Output(before)), ShellEvent::Output(more)) => before.extend(more),
                    (_, event) => joined.push(event),
                }
            }
            assert_eq!(joined, whole, "cut at {cut}");
        }
    }

    #[test]
    fn other_escape_sequences_and_unterminated_giants_pass_through() {
        let colour = b"\x1b[31mred\x1b[0m \x1b]0;title\x07";
        assert_eq!(
            MarkParser::default().feed(colour),
            vec![ShellEvent::Output(colour.to_vec())]
        );
        let mut giant = b"\x1b]633;E;".to_vec();
        giant.extend(std::iter::repeat_n(b'x', MAX_MARK + 10));
        let events = MarkParser::default().feed(&giant);
        let shown: usize = events
            .iter()
            .map(|event| match event {
                ShellEvent::Output(bytes) => bytes.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(shown, giant.len());
    }
}
