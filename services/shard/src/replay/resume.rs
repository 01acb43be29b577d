//! `reconnect`: exact replay of everything a client missed, or fresh snapshots — never partial.
//!
//! The replay comes from the host's in-memory buffer when it still holds every envelope after the client's
//! `lastSeenServerSeq` (no store read), from the store's action log in bounded pages when the gap is inside the
//! retention window, and as snapshots otherwise. Disposed or unknown channels are reported as `missing`.
//! Each answered `reconnect` counts in `ahp_relay_replays_total` under the path it took. A replay that would
//! exceed the reply budget (`Limits::max_reply_bytes`) is answered with snapshots instead: a small request
//! never makes a huge reply.

use crate::error::ShardError;
use ahp_types::actions::ActionEnvelope;
use ahp_types::commands::{ReconnectParams, ReconnectResult, ReconnectSnapshotResult};
use relay_core::link::{CommandReply, SubscriptionChange};
use relay_core::rpc::{self, InboundMessage, RpcError};
use relay_core::telemetry::{self, ReplaySource};
use relay_core::ConnectionId;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::host::replay_buffer::StoredEnvelope;
use crate::host::sequencer::CommitBarrier;
use crate::host::{Host, HostCore};
use crate::model::ChannelKind;
use crate::reply::{reply, CommandResult};
use std::sync::Arc;

/// The wire shape of `ReconnectResult::Replay`, with envelopes spliced in as the JSON already serialized.
#[derive(Serialize)]
struct RawReplay<'a> {
    r#type: &'static str,
    actions: Vec<&'a RawValue>,
    missing: &'a [String],
}

/// What the locked part of `reconnect` decided.
enum Resume {
    /// Answered from memory (replay buffer or snapshots); visible once this batch is committed.
    Ready(CommandReply, CommitBarrier),
    /// The gap is older than the buffer: read it from the store.
    FromStore(StorePlan),
}

struct StorePlan {
    id: Option<u64>,
    /// What the client is owed outside the replayed channels ([`crate::host::owed`]).
    owed: Vec<Arc<StoredEnvelope>>,
    last_seen: u64,
    current: u64,
    barrier: CommitBarrier,
    live: Vec<String>,
    missing: Vec<String>,
    subscriptions: Vec<SubscriptionChange>,
}

impl Host {
    pub(crate) async fn reconnect(&self, connection: ConnectionId, message: &InboundMessage) -> CommandReply {
        let planned = self.with_core(|core| core.plan_reconnect(connection, message));
        let plan = match planned {
            Err(error) => return CommandReply::frame(rpc::error_frame(message.id, &error)),
            Ok(Resume::Ready(reply, barrier)) => {
                self.wait_committed(barrier).await;
                return reply;
            }
            Ok(Resume::FromStore(plan)) => plan,
        };
        // Every envelope up to `current` must be in the store before the log is read.
        self.wait_committed(plan.barrier).await;
        let replayed = match self.read_log(&plan).await {
            Ok(replayed) => replayed,
            Err(error) => {
                tracing::error!(host = %self.key, %error, "reading the action log for reconnect failed");
                let error = RpcError::internal("the store is unavailable; retry");
                return CommandReply::frame(rpc::error_frame(plan.id, &error));
            }
        };
        // A missed truncation naming a turn outside the client's window: snapshots (as from memory).
        let replayed = match replayed {
            Some(envelopes)
                if self.with_core(|core| {
                    envelopes
                        .iter()
                        .any(|(_, envelope)| core.truncates_outside_window(connection, envelope))
                }) =>
            {
                None
            }
            other => other,
        };
        telemetry::replayed(match replayed {
            Some(_) => ReplaySource::Store,
            None => ReplaySource::Snapshot,
        });
        let result = match &replayed {
            Some(envelopes) => {
                let logged = envelopes.iter().map(|(seq, e)| (*seq, e.as_ref())).collect();
                let actions = with_owed(logged, &plan.owed);
                reply(
                    plan.id,
                    &RawReplay {
                        r#type: "replay",
                        actions,
                        missing: &plan.missing,
                    },
                )
                .map(|r| (r, plan.current, plan.barrier))
            }
            // Outside the retention window: fresh snapshots at a fresh sequence number.
            None => self.with_core(|core| {
                let current = core.seq.current();
                core.snapshot_reply(connection, plan.id, &plan.live, current, &plan.owed)
                    .map(|r| (r, current, core.seq.barrier()))
            }),
        };
        match result {
            Ok((mut out, from_seq, barrier)) => {
                self.wait_committed(barrier).await;
                out.subscriptions = retarget(plan.subscriptions, from_seq);
                out.session_started = true;
                out
            }
            Err(error) => CommandReply::frame(rpc::error_frame(plan.id, &error)),
        }
    }

    /// Every logged envelope on the plan's channels in `(last_seen, current]`, in bounded pages, or `None`
    /// when part of that range was compacted away or the envelopes would exceed the reply budget (snapshots
    /// answer then).
    async fn read_log(&self, plan: &StorePlan) -> Result<Option<Vec<(u64, Box<RawValue>)>>, ShardError> {
        let (tenant, host) = (&self.key.tenant, &self.key.host);
        let (page, budget) = {
            let core = self.core.lock();
            (core.limits.replay_page.max(1), core.limits.max_reply_bytes)
        };
        let mut bytes = 0usize;
        if self.store.load_host(tenant, host).await?.log_floor > plan.last_seen {
            return Ok(None);
        }
        let mut out = Vec::new();
        let mut after = plan.last_seen;
        'pages: loop {
            let rows = self
                .store
                .log_after(tenant, host, after, &plan.live, page)
                .await?;
            let full = rows.len() == page;
            for row in rows {
                if row.seq > plan.current {
                    break 'pages;
                }
                after = row.seq;
                bytes += row.envelope.len();
                if bytes > budget {
                    return Ok(None);
                }
                out.push((
                    row.seq,
                    RawValue::from_string(row.envelope).map_err(ShardError::corrupt)?,
                ));
            }
            if !full {
                break;
            }
        }
        // Compaction may have run while paging: only a range that is still complete is exact.
        if self.store.load_host(tenant, host).await?.log_floor > plan.last_seen {
            return Ok(None);
        }
        Ok(Some(out))
    }
}

/// Replayed envelopes and owed ones, in `serverSeq` order, each once (an owed echo on a channel the client
/// subscribes to again is in both).
fn with_owed<'a>(replayed: Vec<(u64, &'a RawValue)>, owed: &'a [Arc<StoredEnvelope>]) -> Vec<&'a RawValue> {
    let mut all: Vec<(u64, &RawValue)> = replayed;
    all.extend(owed.iter().map(|e| (e.seq, e.envelope.as_ref())));
    all.sort_by_key(|(seq, _)| *seq);
    all.dedup_by_key(|(seq, _)| *seq);
    all.into_iter().map(|(_, envelope)| envelope).collect()
}

/// Point every added subscription at `from_seq`.
fn retarget(changes: Vec<SubscriptionChange>, from_seq: u64) -> Vec<SubscriptionChange> {
    changes
        .into_iter()
        .map(|change| match change {
            SubscriptionChange::Add { channel, .. } => SubscriptionChange::Add {
                channel,
                after_seq: from_seq,
            },
            other => other,
        })
        .collect()
}

impl HostCore {
    fn plan_reconnect(
        &mut self,
        connection: ConnectionId,
        message: &InboundMessage,
    ) -> Result<Resume, RpcError> {
        if self.connection(connection)?.client_id.is_some() {
            return Err(RpcError::invalid_request(
                "reconnect must be the first request of a connection",
            ));
        }
        let params: ReconnectParams = message.parse_params()?;
        if params.last_seen_server_seq < 0 {
            return Err(RpcError::invalid_params("lastSeenServerSeq must not be negative"));
        }
        let mut live = Vec::new();
        let mut missing = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for channel in params.subscriptions {
            if !seen.insert(channel.clone()) {
                continue;
            }
            // A resource watch is its connection's alone (and went with the connection this one replaces).
            let others_watch = self
                .model
                .watches
                .get(&channel)
                .is_some_and(|watch| watch.owner != connection);
            if self.model.kind(&channel) == ChannelKind::Unknown || others_watch {
                missing.push(channel);
            } else {
                live.push(channel);
            }
        }
        let limit = self
            .limits
            .max_channels_per_message
            .min(self.limits.max_subscriptions_per_connection);
        if live.len() + missing.len() > limit {
            return Err(RpcError::invalid_params(format!(
                "reconnect may name at most {limit} distinct channels"
            )));
        }
        self.bind_client(connection, &params.client_id)?;
        if let Some(state) = self.connections.get_mut(&connection) {
            state.protocol_version = Some(ahp_types::PROTOCOL_VERSION.into());
        }
        for channel in &live {
            self.track_subscription(connection, channel)?;
        }
        // A replay continues the client's state, and so its last connection's turn windows (a snapshot
        // below opens its own).
        let windows: Vec<(String, usize)> = self
            .clients
            .get(&params.client_id)
            .map(|binding| {
                live.iter()
                    .filter_map(|channel| Some((channel.clone(), *binding.turn_windows.get(channel)?)))
                    .collect()
            })
            .unwrap_or_default();
        for (channel, first_turn) in windows {
            self.open_window(connection, &channel, first_turn);
        }
        self.release_sessions_not_resubscribed(&params.client_id, &live);

        let last_seen = params.last_seen_server_seq as u64;
        let current = self.seq.current();
        let mut subscriptions = vec![SubscriptionChange::Clear];
        subscriptions.extend(live.iter().map(|channel| SubscriptionChange::Add {
            channel: channel.clone(),
            after_seq: current,
        }));
        let barrier = self.seq.barrier();
        let ready = |mut reply: CommandReply| {
            reply.subscriptions = subscriptions.clone();
            reply.session_started = true;
            Ok(Resume::Ready(reply, barrier))
        };
        if last_seen > current {
            // A sequence number this host never issued: the client's state cannot be trusted.
            let owed = self.owed.after(&params.client_id, 0, current);
            let reply = self.snapshot_reply(connection, message.id, &live, current, &owed)?;
            telemetry::replayed(ReplaySource::Snapshot);
            return ready(reply);
        }
        if !self.seq.replay().covers(last_seen) {
            return Ok(Resume::FromStore(StorePlan {
                id: message.id,
                owed: self.owed.after(&params.client_id, last_seen, current),
                last_seen,
                current,
                barrier: self.seq.barrier(),
                live,
                missing,
                subscriptions,
            }));
        }
        let wanted: std::collections::HashSet<&str> = live.iter().map(String::as_str).collect();
        let mut bytes = 0usize;
        let owed = self.owed.after(&params.client_id, last_seen, current);
        let replayed: Vec<(u64, &RawValue)> = self
            .seq
            .replay()
            .after(last_seen, |c| wanted.contains(c))
            .map(|e| (e.seq, e.envelope.as_ref()))
            .collect();
        let merged = with_owed(replayed, &owed);
        // A truncation the client missed that names a turn outside its window would be a no-op for it (it
        // would keep the dropped turns): fresh snapshots instead.
        if merged
            .iter()
            .any(|envelope| self.truncates_outside_window(connection, envelope))
        {
            let reply = self.snapshot_reply(connection, message.id, &live, current, &owed)?;
            telemetry::replayed(ReplaySource::Snapshot);
            return ready(reply);
        }
        let mut actions = Vec::with_capacity(merged.len());
        for envelope in merged {
            bytes += envelope.get().len();
            if bytes > self.limits.max_reply_bytes {
                // Replaying would make a reply over budget: fresh snapshots say the same in less.
                let reply = self.snapshot_reply(connection, message.id, &live, current, &owed)?;
                telemetry::replayed(ReplaySource::Snapshot);
                return ready(reply);
            }
            actions.push(envelope);
        }
        let out = reply(
            message.id,
            &RawReplay {
                r#type: "replay",
                actions,
                missing: &missing,
            },
        )?;
        telemetry::replayed(ReplaySource::Memory);
        ready(out)
    }

    /// Fresh snapshots of `live` at `from_seq` (channels gone meanwhile are left out: clients treat them as
    /// missing), each chat with its retained turns; refused when even they exceed the reply budget.
    fn snapshot_reply(
        &mut self,
        connection: ConnectionId,
        id: Option<u64>,
        live: &[String],
        from_seq: u64,
        owed: &[Arc<StoredEnvelope>],
    ) -> CommandResult {
        let too_big = || {
            RpcError::invalid_params(format!(
                "the snapshots would exceed {} bytes: reconnect with fewer channels",
                self.limits.max_reply_bytes
            ))
        };
        // Budgeted while built: an over-budget reconnect is refused before the rest are made, and opens no
        // turn window.
        let mut budget = crate::model::ReplyBudget::new(self.limits.max_reply_bytes);
        let mut snapshots = Vec::with_capacity(live.len());
        for channel in live {
            match self
                .model
                .snapshot_within(channel, from_seq, self.limits.retained_turns, &mut budget)
            {
                Ok(Some(snapshot)) => snapshots.push(snapshot),
                Ok(None) => {}
                Err(crate::model::OverBudget) => return Err(too_big()),
            }
        }
        let windows: Vec<(String, usize)> = snapshots
            .iter()
            .map(|snapshot| (snapshot.resource.clone(), crate::model::first_turn_of(snapshot)))
            .collect();
        let out = reply(
            id,
            &ReconnectResult::Snapshot(ReconnectSnapshotResult { snapshots }),
        )?;
        if out
            .frame
            .as_ref()
            .is_some_and(|f| f.len() > self.limits.max_reply_bytes)
        {
            return Err(too_big());
        }
        for (channel, first_turn) in windows {
            self.open_window(connection, &channel, first_turn);
        }
        self.reissue_owed(connection, owed, live);
        Ok(out)
    }

    /// Whether `envelope` is a `chat/truncated{turnId}` naming a turn before the connection's window of the
    /// chat (or one the host no longer holds in memory, when it cannot tell).
    fn truncates_outside_window(&self, connection: ConnectionId, envelope: &RawValue) -> bool {
        if !envelope.get().contains("\"chat/truncated\"") {
            return false;
        }
        let Ok(parsed) = serde_json::from_str::<ActionEnvelope>(envelope.get()) else {
            return false;
        };
        let ahp_types::actions::StateAction::ChatTruncated(truncated) = &parsed.action else {
            return false;
        };
        let Some(turn_id) = &truncated.turn_id else {
            return false;
        };
        let index = self.model.chats.get(&parsed.channel).and_then(|record| {
            let position = record.state.turns.iter().position(|turn| &turn.id == turn_id)?;
            Some(record.archived + position)
        });
        match index {
            Some(index) => self.window_start(connection, &parsed.channel) > index,
            None => self.model.chats.contains_key(&parsed.channel),
        }
    }

    /// What the client is owed goes after a snapshot reply too (a reply of snapshots cannot carry envelopes):
    /// its rejections, and its echoes on channels the snapshots do not show, numbered anew after the snapshots
    /// (to this connection alone, and owed in place of the old ones).
    fn reissue_owed(
        &mut self,
        connection: ConnectionId,
        owed: &[Arc<StoredEnvelope>],
        snapshotted: &[String],
    ) {
        let Ok(client_id) = self.client_id(connection) else {
            return;
        };
        let mut replaced = std::collections::HashSet::new();
        for stored in owed {
            let Ok(envelope) = serde_json::from_str::<ActionEnvelope>(stored.envelope.get()) else {
                continue;
            };
            if envelope.rejection_reason.is_none() && snapshotted.contains(&envelope.channel) {
                continue;
            }
            if let Some(again) = self.seq.private(
                connection,
                &envelope.channel,
                &envelope.action,
                envelope.origin,
                envelope.rejection_reason,
            ) {
                replaced.insert(stored.seq);
                self.owed.owe(&client_id, again);
            }
        }
        self.owed.remove(&replaced);
    }
}
