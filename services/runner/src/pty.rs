//! Pseudoterminals: a pair opened with `posix_openpt` (rustix), its controller side read and written
//! asynchronously through Tokio's reactor, its size set with `TIOCSWINSZ` (the kernel sends the foreground
//! process group `SIGWINCH`). The other side becomes a process's stdin, stdout and stderr; the sandbox's first
//! program makes it the controlling terminal ([`relay_sandbox::exec`]).

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::pty::OpenptFlags;
use tokio::io::unix::AsyncFd;

/// A terminal size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminalSize {
    pub cols: u16,
    pub rows: u16,
}

impl TerminalSize {
    /// Columns and rows from a client, clamped to what a terminal can be (1–1000).
    pub fn clamped(cols: i64, rows: i64) -> TerminalSize {
        let clamp = |value: i64| u16::try_from(value.clamp(1, 1000)).unwrap_or(80);
        TerminalSize {
            cols: clamp(cols),
            rows: clamp(rows),
        }
    }
}

/// A pseudoterminal pair: the controller (kept by the relay) and the other side (given to the process).
pub struct PtyPair {
    pub controller: PtyController,
    /// The process's side; close it in the relay once the process started.
    pub terminal: OwnedFd,
}

impl PtyPair {
    /// Queue `line` as the process's first input, not echoed (the terminal's echo is off, and an interrupt does
    /// not flush its input, until the process restores both): a secret handed to the shell that no later program finds in its environment or
    /// arguments, and that reading consumes.
    pub fn hand_over_unechoed(&self, line: &str) -> std::io::Result<()> {
        let mut modes = rustix::termios::tcgetattr(&self.terminal)?;
        modes.local_modes.remove(rustix::termios::LocalModes::ECHO);
        // An interrupt typed before the process reads the line must not flush it from the input queue.
        modes.local_modes.insert(rustix::termios::LocalModes::NOFLSH);
        rustix::termios::tcsetattr(&self.terminal, rustix::termios::OptionalActions::Now, &modes)?;
        let mut bytes = line.as_bytes().to_vec();
        bytes.push(b'\n');
        let written = rustix::io::write(self.controller.fd.get_ref(), &bytes)?;
        if written != bytes.len() {
            return Err(std::io::Error::other("the terminal took part of its first input"));
        }
        Ok(())
    }
}

/// Open a pseudoterminal of `size`.
pub fn open(size: TerminalSize) -> std::io::Result<PtyPair> {
    let controller = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&controller)?;
    rustix::pty::unlockpt(&controller)?;
    let name = rustix::pty::ptsname(&controller, Vec::new())?;
    let terminal = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let flags = rustix::fs::fcntl_getfl(&controller)?;
    rustix::fs::fcntl_setfl(&controller, flags | OFlags::NONBLOCK)?;
    // SAFETY: the File owns the descriptor and is owned by the AsyncFd, which never replaces it: it stays
    // open and the same for the AsyncFd's whole life.
    let fd = unsafe { AsyncFd::register(std::fs::File::from(controller)) }
        .map_err(|error| std::io::Error::other(error.to_string()))?;
    let controller = PtyController { fd };
    controller.resize(size)?;
    Ok(PtyPair { controller, terminal })
}

/// The relay's side of a pseudoterminal: what the process prints is read here, what the user types is written
/// here.
pub struct PtyController {
    fd: AsyncFd<std::fs::File>,
}

impl PtyController {
    /// Set the terminal's size.
    pub fn resize(&self, size: TerminalSize) -> std::io::Result<()> {
        rustix::termios::tcsetwinsize(
            self.fd.get_ref().as_fd(),
            rustix::termios::Winsize {
                ws_row: size.rows,
                ws_col: size.cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            },
        )?;
        Ok(())
    }
}

impl PtyController {
    /// Read what the process printed: `Ok(0)` once every process holding the other side closed it.
    pub async fn read(&self, buffer: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| fd.get_ref().read(buffer)) {
                Ok(Ok(read)) => return Ok(read),
                // EIO: the other side is closed everywhere (the end of the output).
                Ok(Err(error)) if error.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) => {
                    return Ok(0)
                }
                Ok(Err(error)) => return Err(error),
                Err(_would_block) => continue,
            }
        }
    }

    /// Write all of `data` (what the user typed), waiting while the terminal's input buffer is full.
    pub async fn write_all(&self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| fd.get_ref().write(data)) {
                Ok(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(Ok(written)) => data = &data[written..],
                Ok(Err(error)) => return Err(error),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_process_on_the_terminal_sees_its_size_and_its_input_echoed() {
        let pair = open(TerminalSize { cols: 91, rows: 37 }).expect("pty");
        let stdio = || {
            pair.terminal
                .try_clone()
                .map(std::process::Stdio::from)
                .expect("dup")
        };
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", "stty size; read line; echo got:$line"])
            .stdin(stdio())
            .stdout(stdio())
            .stderr(stdio())
            .spawn()
            .expect("sh");
        drop(pair.terminal);
        let controller = pair.controller;
        let mut seen = Vec::new();
        let mut buffer = [0_u8; 4096];
        while !String::from_utf8_lossy(&seen).contains("37 91") {
            let read = controller.read(&mut buffer).await.expect("read");
            assert!(read > 0, "ended early: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buffer[..read]);
        }
        controller.write_all(b"hello\n").await.expect("write");
        loop {
            let read = controller.read(&mut buffer).await.expect("read");
            if read == 0 {
                break;
            }
            seen.extend_from_slice(&buffer[..read]);
        }
        let text = String::from_utf8_lossy(&seen);
        assert!(text.contains("got:hello"), "{text}");
        assert!(child.wait().await.expect("wait").success());
    }
}
