//! A tenant's file server: `ahp-relay sandbox-files <root> <max-bytes>`, started by the runner inside a sandbox
//! of the tenant (its user, its directory the only writable one, Landlock and seccomp as for its agents). It
//! answers [`super::protocol`] requests, one JSON line each, on stdin and stdout, in order, until stdin closes.

use std::io::{BufRead, Read, Write};
use std::path::Path;

use super::ops::Files;
use super::protocol::{Answer, Request};

/// The subcommand that runs a file server.
pub const SUBCOMMAND: &str = "sandbox-files";

/// Longest request line read (a write's base64 data with room to spare), so a broken peer cannot grow memory.
fn max_line(max_bytes: u64) -> usize {
    usize::try_from(max_bytes.saturating_mul(4) / 3 + 64 * 1024).unwrap_or(usize::MAX)
}

/// Serve `args` = [root, max-bytes] on stdin/stdout; the process's exit status.
pub fn main(args: Vec<std::ffi::OsString>) -> i32 {
    let (Some(root), Some(max_bytes)) = (
        args.first(),
        args.get(1).and_then(|a| a.to_str()?.parse::<u64>().ok()),
    ) else {
        eprintln!("usage: ahp-relay {SUBCOMMAND} ROOT MAX-BYTES");
        return 2;
    };
    let files = match Files::new(Path::new(root), max_bytes) {
        Ok(files) => files,
        Err(error) => {
            eprintln!("{error}");
            return 1;
        }
    };
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let stdout = std::io::stdout();
    let mut output = stdout.lock();
    let limit = max_line(max_bytes);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut input).take(limit as u64 + 1).read_until(b'\n', &mut line);
        match read {
            Ok(0) => return 0,
            Ok(_) if line.len() > limit => {
                eprintln!("a request line is longer than {limit} bytes");
                return 1;
            }
            Ok(_) => {}
            Err(error) => {
                eprintln!("{error}");
                return 1;
            }
        }
        let answer = match serde_json::from_slice::<Request>(&line) {
            Ok(request) => Answer {
                id: request.id,
                result: files.run(request.op),
            },
            Err(error) => {
                eprintln!("unreadable request: {error}");
                return 1;
            }
        };
        let written = serde_json::to_writer(&mut output, &answer)
            .map_err(std::io::Error::other)
            .and_then(|()| output.write_all(b"\n"))
            .and_then(|()| output.flush());
        if written.is_err() {
            return 0;
        }
    }
}
