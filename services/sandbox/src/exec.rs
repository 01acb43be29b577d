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
            close_inherited_descriptors();
            // exec only returns on failure.
            let error = std::process::Command::new(&program).args(args).exec();
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

/// Nothing but stdin, stdout and stderr reaches the agent: every other descriptor closes on exec.
fn close_inherited_descriptors() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range only changes descriptor flags of this process.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3_u32, u32::MAX, CLOSE_RANGE_CLOEXEC);
    }
}
