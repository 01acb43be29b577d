//! Shell integration and the terminal's output filter: the bash start-up script a device's terminal runs, which
//! marks each prompt, command line, command start and exit status with OSC 633 sequences (the ones VS Code's
//! shell integration uses), and the filter every terminal's output passes before any device sees it
//! ([`MarkParser`]):
//! - an OSC 633 mark becomes an event — from which the relay dispatches `terminal/commandExecuted`,
//!   `terminal/commandFinished` and `terminal/cwdChanged` — only when it carries the terminal's nonce, which the
//!   start-up script alone holds (the relay queues it as the terminal's first input, unechoed, and the script
//!   reads it before any command runs: it is in no environment, argument or file); a program's
//!   output that forges a mark (`cat` of a file, a remote shell) is dropped, never trusted;
//! - of the other OSC sequences only window titles (`0`, `1`, `2`) reach devices: the clipboard (`52`),
//!   hyperlinks (`8`), colour queries (whose answers a terminal types back) and every other one are dropped;
//!   an OSC too long to be one loses its introducer and shows as text.

/// The bash start-up script of a device's terminal (run by its first `PROMPT_COMMAND`, so nothing is written to
/// the session's directories): the user's `~/.bashrc` first, then the marks.
pub const BASH_RC: &str = r#"# ahp-relay: shell integration (OSC 633), so every device sees each command and its exit status.
# The nonce is the terminal's first input, not echoed (the relay queued it): no program finds it later.
IFS= read -r __ahp_nonce
stty echo -noflsh 2>/dev/null
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
  printf '\033]633;E;%s;%s\007\033]633;C;%s\007' "$(__ahp_escape "$line")" "$__ahp_nonce" "$__ahp_nonce"
}
__ahp_precmd() {
  local status=$?
  [ -n "$__ahp_running" ] && printf '\033]633;D;%s;%s\007' "$status" "$__ahp_nonce"
  __ahp_running=
  printf '\033]633;P;Cwd=%s;%s\007\033]633;A;%s\007' "$(__ahp_escape "$PWD")" "$__ahp_nonce" "$__ahp_nonce"
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

/// The string sequences' introducers, 7-bit and as C1 controls in UTF-8, and whether each is an OSC: OSC
/// (`ESC ]`), and DCS, SOS, PM and APC (`ESC P`, `X`, `^`, `_`), which are always dropped whole.
const INTRODUCERS: [(&[u8], bool); 10] = [
    (b"\x1b]", true),
    (b"\xc2\x9d", true),
    (b"\x1bP", false),
    (b"\xc2\x90", false),
    (b"\x1bX", false),
    (b"\xc2\x98", false),
    (b"\x1b^", false),
    (b"\xc2\x9e", false),
    (b"\x1b_", false),
    (b"\xc2\x9f", false),
];
/// An OSC longer than this is not one: its introducer is dropped and the rest shown as text.
const MAX_MARK: usize = 16 * 1024;
/// The OSC sequences devices may see: window and icon titles.
const SHOWN: [&[u8]; 3] = [b"0", b"1", b"2"];

/// Filters a terminal's byte stream (which may split a sequence anywhere): OSC 633 marks with the terminal's
/// nonce become events, titles of printable text pass (written anew), every other OSC and every DCS, SOS, PM
/// and APC string is dropped. A string ends where a terminal would end it: at BEL or ST, and also at any other
/// ESC, C1 control, CAN or SUB (what follows is then read afresh), so nothing rides inside a title.
#[derive(Debug, Default)]
pub struct MarkParser {
    carry: Vec<u8>,
    /// The nonce the shell integration holds; `None`: no mark is trusted (a one-shot command).
    nonce: Option<String>,
}

impl MarkParser {
    /// A filter that trusts marks carrying `nonce` (none: trusts no mark).
    pub fn new(nonce: Option<String>) -> MarkParser {
        MarkParser {
            carry: Vec::new(),
            nonce,
        }
    }

    /// The events in `bytes` (with what earlier calls left unfinished), in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<ShellEvent> {
        let mut data = std::mem::take(&mut self.carry);
        data.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut output = Vec::new();
        let mut at = 0;
        while at < data.len() {
            let Some((start, introducer, is_osc)) =
                next_introducer(&data[at..]).map(|(found, len, is_osc)| (at + found, len, is_osc))
            else {
                // An introducer may be cut at the end: keep its beginning for the next call.
                let keep = partial_introducer(&data[at..]);
                output.extend_from_slice(&data[at..data.len() - keep]);
                self.carry = data[data.len() - keep..].to_vec();
                break;
            };
            output.extend_from_slice(&data[at..start]);
            let body = start + introducer;
            match terminator(&data[body..]) {
                Some((length, skip, whole)) => {
                    let sequence = &data[body..body + length];
                    if !is_osc || !whole {
                        // Dropped: a string sequence no device needs, or an OSC cut short.
                    } else if SHOWN.contains(&osc_number(sequence)) && printable(sequence) {
                        output.extend_from_slice(b"\x1b]");
                        output.extend_from_slice(sequence);
                        output.push(0x07);
                    } else if let Some(event) = self.mark(sequence) {
                        if !output.is_empty() {
                            events.push(ShellEvent::Output(std::mem::take(&mut output)));
                        }
                        events.push(event);
                    }
                    at = body + length + skip;
                }
                None if data.len() - start <= MAX_MARK => {
                    self.carry = data[start..].to_vec();
                    break;
                }
                // Too long to be a sequence: shown without its introducer, as text.
                None => at = body,
            }
        }
        if !output.is_empty() {
            events.push(ShellEvent::Output(output));
        }
        events
    }

    /// The event of an OSC 633 mark with this terminal's nonce (its last field); `None` for anything else.
    fn mark(&self, sequence: &[u8]) -> Option<ShellEvent> {
        let body = sequence.strip_prefix(b"633;")?;
        let nonce = self.nonce.as_deref()?;
        let text = String::from_utf8_lossy(body);
        let (fields, given) = text.rsplit_once(';')?;
        if !constant_time_eq(given.as_bytes(), nonce.as_bytes()) {
            return None;
        }
        let (kind, rest) = fields.split_once(';').unwrap_or((fields, ""));
        match kind {
            "A" => Some(ShellEvent::Prompt),
            "C" => Some(ShellEvent::Executed),
            "D" => Some(ShellEvent::Finished(rest.parse().ok())),
            "E" => Some(ShellEvent::CommandLine(unescape(rest))),
            "P" => rest
                .strip_prefix("Cwd=")
                .map(|cwd| ShellEvent::Cwd(unescape(cwd))),
            _ => None,
        }
    }
}

/// A fresh nonce for a terminal's shell integration (128 random bits, hex).
pub fn new_nonce() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0_u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// The OSC's number: what comes before its first `;`.
fn osc_number(sequence: &[u8]) -> &[u8] {
    sequence.split(|byte| *byte == b';').next().unwrap_or_default()
}

/// Where the first string sequence's introducer in `data` is, its length, and whether it opens an OSC.
fn next_introducer(data: &[u8]) -> Option<(usize, usize, bool)> {
    // One pass: only ESC and C2 can begin one.
    data.iter().enumerate().find_map(|(at, byte)| {
        if !matches!(byte, 0x1b | 0xc2) {
            return None;
        }
        INTRODUCERS
            .iter()
            .find(|(introducer, _)| data[at..].starts_with(introducer))
            .map(|(introducer, is_osc)| (at, introducer.len(), *is_osc))
    })
}

/// A title's text: no control characters (C0, DEL, C1) at all.
fn printable(sequence: &[u8]) -> bool {
    !sequence.iter().any(|byte| *byte < 0x20 || *byte == 0x7f)
        && !sequence
            .windows(2)
            .any(|pair| pair[0] == 0xc2 && (0x80..=0x9f).contains(&pair[1]))
}

/// How many bytes at the end of `data` begin an introducer (the one byte both start with).
fn partial_introducer(data: &[u8]) -> usize {
    usize::from(matches!(data.last(), Some(0x1b) | Some(0xc2)))
}

/// Where a string sequence's body ends: its length, how many bytes end it, and whether it ended properly (BEL,
/// ESC \ or the C1 ST) rather than cut short — by CAN or SUB (consumed), or by another ESC or C1 control (left
/// to be read afresh). `None`: not ended yet (a lone ESC or C2 at the end may begin a terminator).
fn terminator(data: &[u8]) -> Option<(usize, usize, bool)> {
    for (at, byte) in data.iter().enumerate() {
        match byte {
            0x07 => return Some((at, 1, true)),
            0x18 | 0x1a => return Some((at, 1, false)),
            0x1b => {
                return match data.get(at + 1) {
                    None => None,
                    Some(b'\\') => Some((at, 2, true)),
                    Some(_) => Some((at, 0, false)),
                }
            }
            0xc2 => match data.get(at + 1) {
                None => return None,
                Some(0x9c) => return Some((at, 2, true)),
                Some(0x80..=0x9f) => return Some((at, 0, false)),
                Some(_) => {}
            },
            _ => {}
        }
    }
    None
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

    fn parser() -> MarkParser {
        MarkParser::new(Some("n0nce".into()))
    }

    #[test]
    fn marks_are_taken_out_of_the_output_in_order() {
        let stream = b"ls\r\n\x1b]633;E;ls -l \\x3b echo a\\\\b;n0nce\x07\x1b]633;C;n0nce\x07file\r\n\x1b]633;D;2;n0nce\x07\x1b]633;P;Cwd=/w/x;n0nce\x1b\\\x1b]633;A;n0nce\x07$ ";
        let events = parser().feed(stream);
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
        let stream: &[u8] = b"a\x1b]633;D;0;n0nce\x07b\x1b]633;C;n0nce\x07c\xc2\xa9\x1b]52;c;eA==\x07d";
        let whole = parser().feed(stream);
        assert_eq!(whole.len(), 5, "{whole:?}");
        for cut in 0..stream.len() {
            let mut parser = parser();
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
    fn marks_without_the_nonce_and_dangerous_sequences_never_reach_a_device() {
        // A program forging the shell's marks (no nonce, a wrong one), the clipboard, a link, a colour query, the
        // C1 form of OSC: all dropped; the text around them and a title stay.
        let stream = b"a\x1b]633;D;0\x07b\x1b]633;D;0;guess\x07c\x1b]633;P;Cwd=/etc/shadow\x07\
            d\x1b]52;c;cm0gLXJmIH4=\x07e\x1b]8;;https://evil.example/\x1b\\link\x1b]8;;\x1b\\\
            f\x1b]10;?\x07g\xc2\x9d52;c;eA==\xc2\x9ch\x1b]0;title\x07";
        let events = parser().feed(stream);
        assert_eq!(events, vec![output("abcdelinkfgh\x1b]0;title\x07")], "{events:?}");
        // Nothing rides inside a title: an OSC 52 after its ESC, a C1 OSC, a CAN; DCS, APC, PM and SOS strings go
        // whole.
        let smuggled = b"a\x1b]0;t\x1b]52;c;eA==\x07b\x1b]2;u\xc2\x9d52;c;eA==\x07c\x1b]1;v\x18w\
            \x1bPq#0;1;2\x1b\\d\x1b_apc\x07e\x1b^pm\x1b\\f\x1bXsos\x1b\\g\xc2\x90dcs\xc2\x9ch\x1b]0;ok\x1b\\";
        let events = parser().feed(smuggled);
        assert_eq!(events, vec![output("abcwdefgh\x1b]0;ok\x07")], "{events:?}");
        // Without a nonce (a one-shot command) no mark is trusted at all.
        let marks = b"\x1b]633;D;0;n0nce\x07x";
        assert_eq!(MarkParser::new(None).feed(marks), vec![output("x")]);
    }

    #[test]
    fn other_escape_sequences_pass_and_unterminated_giants_are_made_inert() {
        let colour = b"\x1b[31mred\x1b[0m \x1b]0;title\x07";
        assert_eq!(parser().feed(colour), vec![ShellEvent::Output(colour.to_vec())]);
        let mut giant = b"\x1b]52;c;".to_vec();
        giant.extend(std::iter::repeat_n(b'x', MAX_MARK + 10));
        let events = parser().feed(&giant);
        let shown: Vec<u8> = events
            .iter()
            .flat_map(|event| match event {
                ShellEvent::Output(bytes) => bytes.clone(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(shown.len(), giant.len() - 2, "all but the introducer");
        assert!(!shown.contains(&0x1b));
    }
}
