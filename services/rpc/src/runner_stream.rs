//! What a runner sends back to its shard: the outbox (bounded at [`OUTBOX_BYTES`]: agents wait while it is full)
//! and the sink its agents write to ([`StreamSink`]), which turns their actions, terminals and listings into
//! reports on the stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ahp_types::actions::StateAction;
use ahp_types::state::AgentInfo;
use relay_runner::ChatSink;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::pb;
use crate::pb::runner_report::Report;

/// Bytes of agents' actions, watch changes and file answers a registration's stream may hold unsent: past it,
/// agents, terminals and watches wait
/// ([`ChatSink::room`]) — the shard reads no faster than its hosts' stores take them.
pub(crate) const OUTBOX_BYTES: usize = 8 * 1024 * 1024;

/// The agents' actions, the watches' changes and the file answers queued for one shard, counted in bytes as
/// they are queued and as the stream takes them.
#[derive(Default)]
pub(crate) struct Outbox {
    pub(crate) bytes: std::sync::atomic::AtomicUsize,
    pub(crate) drained: tokio::sync::Notify,
}

impl Outbox {
    /// The stream of `outgoing` reports, counting out the actions it takes.
    pub(crate) fn drain(
        outbox: Arc<Outbox>,
        outgoing: mpsc::UnboundedReceiver<pb::RunnerReport>,
    ) -> impl tokio_stream::Stream<Item = pb::RunnerReport> {
        use tokio_stream::StreamExt;
        UnboundedReceiverStream::new(outgoing).map(move |report| {
            let counted = match &report.report {
                Some(Report::Action(action)) => action.action.len(),
                Some(Report::FileChanged(changed)) => changed.changes.len(),
                Some(Report::FileAnswer(answer)) => answer.result.len(),
                _ => 0,
            };
            if counted > 0 {
                outbox.bytes.fetch_sub(counted, Ordering::AcqRel);
                outbox.drained.notify_waiters();
            }
            report
        })
    }

    /// Resolves once fewer than [`OUTBOX_BYTES`] wait (or the registration ended).
    pub(crate) async fn room(self: Arc<Self>, ended: Arc<AtomicBool>) {
        loop {
            let drained = self.drained.notified();
            if self.bytes.load(Ordering::Acquire) < OUTBOX_BYTES || ended.load(Ordering::Acquire) {
                return;
            }
            // (Checked again every second: a registration that ends wakes nobody.)
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drained).await;
        }
    }
}

/// Where the actions of one session's agent go: the stream to the shard that placed the session.
pub(crate) struct StreamSink {
    pub(crate) host: pb::HostKey,
    pub(crate) session: String,
    pub(crate) reports: mpsc::UnboundedSender<pb::RunnerReport>,
    pub(crate) ended: Arc<AtomicBool>,
    pub(crate) outbox: Arc<Outbox>,
}

impl ChatSink for StreamSink {
    fn room(&self) -> Option<relay_runner::Room> {
        Some(Box::pin(self.outbox.clone().room(self.ended.clone())))
    }

    fn emit(&self, channel: &str, action: StateAction) -> relay_runner::Emitted {
        if self.ended.load(Ordering::Acquire) {
            return relay_runner::Emitted::Unreachable;
        }
        let action = match serde_json::to_vec(&action) {
            Ok(action) => action,
            Err(error) => {
                tracing::error!(%error, "cannot encode an agent's action");
                return relay_runner::Emitted::NotApplied;
            }
        };
        let size = action.len();
        self.outbox.bytes.fetch_add(size, Ordering::AcqRel);
        let sent = self
            .reports
            .send(pb::RunnerReport {
                report: Some(Report::Action(pb::AgentAction {
                    host: Some(self.host.clone()),
                    channel: channel.to_string(),
                    action,
                    session: self.session.clone(),
                })),
            })
            .is_ok();
        if !sent {
            self.outbox.bytes.fetch_sub(size, Ordering::AcqRel);
        }
        // The shard applies it in order, or finds it does not apply: only a closed stream is known here, and a
        // closed stream means the shard went, not the channel (another shard may own its host next).
        if sent {
            relay_runner::Emitted::Applied
        } else {
            relay_runner::Emitted::Unreachable
        }
    }

    fn reachable(&self) -> bool {
        !self.ended.load(Ordering::Acquire) && !self.reports.is_closed()
    }

    fn open_terminal(&self, session: &str, uri: &str, state: ahp_types::state::TerminalState) -> bool {
        let Ok(state) = serde_json::to_vec(&state) else {
            return false;
        };
        // The shard opens it before it applies anything this runner sends after (one ordered stream).
        self.reports
            .send(pb::RunnerReport {
                report: Some(Report::OpenTerminal(pb::AgentTerminal {
                    host: Some(self.host.clone()),
                    session: session.to_string(),
                    uri: uri.to_string(),
                    state,
                })),
            })
            .is_ok()
    }

    fn agent_settings_reported(&self, agent: &str, schema: &ahp_types::state::SessionConfigSchema) {
        let Ok(schema) = serde_json::to_vec(schema) else {
            return;
        };
        let _ = self.reports.send(pb::RunnerReport {
            report: Some(Report::AgentSettings(pb::AgentSettings {
                agent: agent.to_string(),
                schema,
            })),
        });
    }

    fn agent_changed(&self, info: AgentInfo) {
        let Ok(info) = serde_json::to_vec(&info) else {
            return;
        };
        let _ = self.reports.send(pb::RunnerReport {
            report: Some(Report::AgentChanged(pb::AgentListing {
                host: Some(self.host.clone()),
                info,
            })),
        });
    }
}
