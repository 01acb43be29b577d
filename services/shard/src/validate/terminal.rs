//! A device's actions on a terminal it opened: input and resizing only by its claim's holder while it runs,
//! titles within bounds, nothing of the agent's read-only terminals.

use ahp_types::actions::StateAction;
use ahp_types::state::{TerminalClaim, TerminalLifecycleState};

use super::dispatcher::*;
use crate::model::HostModel;

/// Longest title a device may give a terminal.
pub const MAX_TERMINAL_TITLE: usize = 200;

/// Check a device's action on a terminal.
pub(crate) fn check_terminal_action(
    model: &HostModel,
    channel: &str,
    action: &StateAction,
    who: &Dispatcher<'_>,
) -> Result<(), String> {
    let Some(record) = model.terminals.get(channel) else {
        return Err(format!("unknown terminal {channel}"));
    };
    if record.device.is_none() {
        return Err(
            "this terminal shows an agent's command and is read-only: input, resizing, renaming, clearing and \
             claims are not accepted"
                .into(),
        );
    }
    let running = matches!(record.state.lifecycle, TerminalLifecycleState::Running(_));
    match action {
        StateAction::TerminalInput(_) | StateAction::TerminalResized(_) if !running => {
            Err("the terminal's process has exited".into())
        }
        StateAction::TerminalInput(_) | StateAction::TerminalResized(_) => {
            if let Some(why) = claim_refusal(&record.state.claim, who) {
                return Err(why);
            }
            match action {
                StateAction::TerminalResized(size)
                    if !((1..=1000).contains(&size.cols) && (1..=1000).contains(&size.rows)) =>
                {
                    Err("cols and rows are 1 to 1000".into())
                }
                _ => Ok(()),
            }
        }
        StateAction::TerminalClaimed(claimed) => match (&record.state.claim, &claimed.claim) {
            // A session's claim names the terminal's own session: it runs in that session's sandbox and
            // folder, and is listed with that session only.
            (TerminalClaim::Client(_), TerminalClaim::Session(to)) if to.session != record.session => {
                Err(format!(
                    "a terminal's claim may name only its own session ({})",
                    record.session
                ))
            }
            (TerminalClaim::Client(holder), _) if holder.client_id == who.client_id => Ok(()),
            _ => Err("only the terminal's holder may pass its claim on".into()),
        },
        StateAction::TerminalTitleChanged(title) => {
            if title.title.chars().count() <= MAX_TERMINAL_TITLE {
                Ok(())
            } else {
                Err(format!(
                    "a terminal's title is at most {MAX_TERMINAL_TITLE} characters"
                ))
            }
        }
        StateAction::TerminalCleared(_) => Ok(()),
        other => Err(format!(
            "{} is a server action and cannot be dispatched by clients",
            action_type(other)
        )),
    }
}

/// Why `who` may not type into (or resize) a terminal under `claim`: a client's claim is its holder's alone; a
/// session's claim lets any member of the session (every member may dispatch) type.
pub(crate) fn claim_refusal(claim: &TerminalClaim, who: &Dispatcher<'_>) -> Option<String> {
    match claim {
        TerminalClaim::Client(holder) if holder.client_id != who.client_id => Some(format!(
            "the terminal is claimed by client {}: only its holder types into it or resizes it",
            holder.client_id
        )),
        _ => None,
    }
}

/// Whether a refused terminal action was refused for its claim (a permission, not a malformed action).
pub(crate) fn refused_for_claim(
    model: &HostModel,
    channel: &str,
    action: &StateAction,
    who: &Dispatcher<'_>,
) -> bool {
    matches!(
        action,
        StateAction::TerminalInput(_) | StateAction::TerminalResized(_)
    ) && model
        .terminals
        .get(channel)
        .is_some_and(|record| record.device.is_some() && claim_refusal(&record.state.claim, who).is_some())
}
