//! `ahp-relay sandbox-exec`: the first program inside every sandbox. Bubblewrap has built the sandbox's view
//! of the system (namespaces, mounts); this confines the process itself ([`crate::confine`]) and then replaces
//! it with the agent (or an agent's command):
//!
//! ```text
//! ahp-relay sandbox-exec CONFINEMENT-JSON -- PROGRAM [ARGS…]    confine, then exec PROGRAM (looked up on PATH)
//! ahp-relay sandbox-exec CONFINEMENT-JSON --probe               confine, then print what was enforced (JSON)
//! ```
//!
//! It must stay small and single-threaded: it runs before anything else in the sandbox, as the user bubblewrap
//! started it as, and must not start threads before the user switch. Failures print one line to stderr and
//! exit with [`EXIT_CONFINEMENT_FAILED`]: the agent never runs unconfined.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use crate::policy::Confinement;

/// The subcommand name (the runner puts it on the command line; `main` dispatches on it before anything else).
pub const SUBCOMMAND: &str = "sandbox-exec";

/// Exit status when the process could not confine itself.
pub const EXIT_CONFINEMENT_FAILED: i32 = 125;

/// Exit status when the program could not be started.
pub const EXIT_NOT_STARTED: i32 = 127;

/// Run `sandbox-exec` with the arguments after the subcommand name; returns only with the exit status of a
/// failure or a probe.
pub fn main(args: Vec<OsString>) -> i32 {
    let mut args = args.into_iter();
    let Some(confinement) = args.next().and_then(|json| json.into_string().ok()) else {
        eprintln!(
            "ahp-relay sandbox-exec: usage: sandbox-exec CONFINEMENT-JSON (-- PROGRAM [ARGS…] | --probe)"
        );
        return EXIT_CONFINEMENT_FAILED;
    };
    let confinement: Confinement = match serde_json::from_str(&confinement) {
        Ok(confinement) => confinement,
        Err(error) => {
            eprintln!("ahp-relay sandbox-exec: unreadable confinement: {error}");
            return EXIT_CONFINEMENT_FAILED;
        }
    };
    let mode = args.next();
    let enforced = match crate::confine::apply(&confinement) {
        Ok(enforced) => enforced,
        Err(error) => {
            eprintln!("ahp-relay sandbox: cannot confine the agent: {error}");
            return EXIT_CONFINEMENT_FAILED;
        }
    };
    match mode.as_ref().and_then(|mode| mode.to_str()) {
        Some("--probe") => match serde_json::to_string(&enforced) {
            Ok(json) => {
                println!("{json}");
                0
            }
            Err(error) => {
                eprintln!("ahp-relay sandbox-exec: {error}");
                EXIT_CONFINEMENT_FAILED
            }
        },
        Some("--") => {
            let Some(program) = args.next() else {
                eprintln!("ahp-relay sandbox-exec: no program after --");
                return EXIT_NOT_STARTED;
            };
            let environment = match confinement.environment_fd.map(read_environment).transpose() {
                Ok(environment) => environment,
                Err(error) => {
                    eprintln!("ahp-relay sandbox-exec: cannot read the agent's environment: {error}");
                    return EXIT_CONFINEMENT_FAILED;
                }
            };
            // A device's terminal: bubblewrap made this process a session leader; its pseudoterminal (stdin)
            // becomes the session's controlling terminal, so job control and Ctrl-C work in the shell.
            if rustix::termios::isatty(std::io::stdin()) {
                // bubblewrap's init may hold the session: a session of its own first (this process leads no
                // group here, so setsid succeeds), then the terminal.
                let _ = rustix::process::setsid();
                let _ = rustix::process::ioctl_tiocsctty(std::io::stdin());
            }
            close_inherited_descriptors();
            let mut command = std::process::Command::new(&program);
            command.args(args);
            if let Some(environment) = environment {
                // Exactly the agent's environment, set only now that the process is confined.
                command.env_clear().envs(environment);
            }
            // exec only returns on failure.
            let error = command.exec();
            eprintln!(
                "ahp-relay sandbox: cannot start {}: {error}",
                program.to_string_lossy()
            );
            EXIT_NOT_STARTED
        }
        _ => {
            eprintln!("ahp-relay sandbox-exec: expected -- PROGRAM or --probe");
            EXIT_NOT_STARTED
        }
    }
}

/// The agent's environment from the descriptor the relay passed: `NAME=value` entries, NUL-separated.
fn read_environment(fd: i32) -> std::io::Result<Vec<(OsString, OsString)>> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStringExt;
    // SAFETY: the relay passed this descriptor for this purpose; nothing else in this process uses it.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes
        .split(|byte| *byte == 0)
        .filter_map(|entry| {
            let at = entry.iter().position(|byte| *byte == b'=')?;
            let (name, value) = (&entry[..at], &entry[at + 1..]);
            let valid = !name.is_empty()
                && !name[0].is_ascii_digit()
                && name.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
            valid.then(|| {
                (
                    OsString::from_vec(name.to_vec()),
                    OsString::from_vec(value.to_vec()),
                )
            })
        })
        .collect())
}

/// Nothing but stdin, stdout and stderr reaches the agent: every other descriptor closes on exec.
fn close_inherited_descriptors() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range only changes descriptor flags of this process.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3_u32, u32::MAX, CLOSE_RANGE_CLOEXEC);
    }
}
