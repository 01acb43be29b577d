//! Two `ahp-relay chat` processes joined to one session, driven through pipes, show the same streamed reply.

mod support;

use std::process::Stdio;

use relay_core::Role;
use support::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

struct ChatProcess {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    transcript: Vec<String>,
}

impl ChatProcess {
    fn spawn(relay: &Relay, client_id: &str, session: Option<&str>) -> ChatProcess {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ahp-relay"));
        command
            .args([
                "chat",
                "--url",
                &relay.url(),
                "--client-id",
                client_id,
                "--wait-idle",
            ])
            .arg("--token")
            .arg(relay.token("dev", client_id, Role::Member))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(session) = session {
            command.args(["--session", session]);
        }
        let mut child = command.spawn().expect("spawn chat");
        let stdout = child.stdout.take().expect("stdout");
        ChatProcess {
            child,
            lines: BufReader::new(stdout).lines(),
            transcript: Vec::new(),
        }
    }

    /// Read lines until one satisfies `done`; returns that line.
    async fn read_until(&mut self, done: impl Fn(&str) -> bool) -> String {
        tokio::time::timeout(PATIENCE, async {
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .expect("read")
                    .expect("chat exited early");
                self.transcript.push(line.clone());
                if done(&line) {
                    return line;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("timed out; transcript so far:\n{}", self.transcript.join("\n")))
    }

    async fn type_line(&mut self, text: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(format!("{text}\n").as_bytes())
            .await
            .expect("write");
        stdin.flush().await.expect("flush");
    }

    /// Close stdin and wait for a clean exit, keeping the rest of the transcript.
    async fn finish(mut self) -> Vec<String> {
        drop(self.child.stdin.take());
        let rest = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = self.lines.next_line().await.expect("read") {
                self.transcript.push(line);
            }
            self.child.wait().await.expect("wait")
        })
        .await
        .expect("chat did not exit");
        assert!(rest.success(), "chat exited with {rest}");
        self.transcript
    }
}

/// The assistant's reply to `prompt` as printed: the text lines after `> prompt`, up to `[turn complete]`.
fn printed_reply(transcript: &[String], prompt: &str) -> String {
    let start = transcript
        .iter()
        .position(|l| l == &format!("> {prompt}"))
        .unwrap_or_else(|| panic!("prompt not shown:\n{}", transcript.join("\n")));
    transcript[start + 1..]
        .iter()
        .take_while(|l| !l.contains("[turn complete]"))
        .filter(|l| !l.starts_with('(') && !l.starts_with('['))
        .map(String::as_str)
        .collect::<Vec<_>>()
        .concat()
}

/// A first terminal that creates a session and a second one that joins it, both ready.
async fn two_terminals(relay: &Relay) -> (ChatProcess, ChatProcess) {
    let mut first = ChatProcess::spawn(relay, "terminal-1", None);
    let session_line = first.read_until(|l| l.starts_with("session: ")).await;
    let session = session_line.trim_start_matches("session: ").trim().to_string();
    first.read_until(|l| l == "[ready]").await;
    let mut second = ChatProcess::spawn(relay, "terminal-2", Some(&session));
    second.read_until(|l| l == "[ready]").await;
    (first, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_chat_terminals_show_the_same_streamed_reply() {
    let relay = Relay::start().await;
    let (mut first, mut second) = two_terminals(&relay).await;

    let prompt = "tell both terminals a story";
    first.type_line(prompt).await;
    second.read_until(|l| l.contains("[turn complete]")).await;
    let first_transcript = first.finish().await;
    let second_transcript = second.finish().await;

    let expected = relay_runner::demo::reply_chunks(prompt).concat();
    assert_eq!(printed_reply(&first_transcript, prompt), expected);
    assert_eq!(printed_reply(&second_transcript, prompt), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_from_one_terminal_is_approved_in_the_other() {
    let relay = Relay::start().await;
    let (mut first, mut second) = two_terminals(&relay).await;
    first.type_line("please use a tool").await;
    second.read_until(|l| l.contains("[tool]")).await;
    second.type_line("/approve").await;
    first.read_until(|l| l.contains("[turn complete]")).await;
    second.read_until(|l| l.contains("[turn complete]")).await;
    let a = first.finish().await.join("\n");
    let b = second.finish().await.join("\n");
    for transcript in [&a, &b] {
        assert!(transcript.contains("[tool approved]"), "{transcript}");
        assert!(
            transcript.contains("The tool ran and echoed your prompt."),
            "{transcript}"
        );
    }
}
