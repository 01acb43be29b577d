//! Conversions between `relay-core` types and their protobuf messages, in both directions.

use relay_core::bus::{Audience, BusEvent, BusEventKind};
use relay_core::link::{CloseRequest, CommandReply, SubscriptionChange};
use relay_core::{ConnectionId, HostKey, Identity, Role};

use crate::pb;

/// A request field the protocol requires was missing or out of range.
#[derive(Debug, thiserror::Error)]
#[error("malformed message: {0}")]
pub struct Malformed(pub &'static str);

impl From<Malformed> for tonic::Status {
    fn from(m: Malformed) -> Self {
        tonic::Status::invalid_argument(m.to_string())
    }
}

pub fn host_to_pb(host: &HostKey) -> pb::HostKey {
    pb::HostKey {
        tenant: host.tenant.clone(),
        host: host.host.clone(),
    }
}

pub fn host_from_pb(host: Option<pb::HostKey>) -> Result<HostKey, Malformed> {
    let host = host.ok_or(Malformed("host is required"))?;
    Ok(HostKey::new(host.tenant, host.host))
}

pub fn identity_to_pb(identity: &Identity) -> pb::Identity {
    let role = match identity.role {
        Role::Viewer => pb::Role::Viewer,
        Role::Member => pb::Role::Member,
        Role::Admin => pb::Role::Admin,
    };
    pb::Identity {
        subject: identity.subject.clone(),
        tenant: identity.tenant.clone(),
        role: role.into(),
        host_scoped: identity.hosts.is_some(),
        hosts: identity.hosts.clone().unwrap_or_default(),
    }
}

pub fn identity_from_pb(identity: Option<pb::Identity>) -> Result<Identity, Malformed> {
    let identity = identity.ok_or(Malformed("identity is required"))?;
    let role = match pb::Role::try_from(identity.role) {
        Ok(pb::Role::Viewer) => Role::Viewer,
        Ok(pb::Role::Member) => Role::Member,
        Ok(pb::Role::Admin) => Role::Admin,
        Ok(pb::Role::Unspecified) | Err(_) => return Err(Malformed("identity.role is unknown")),
    };
    Ok(Identity {
        subject: identity.subject,
        tenant: identity.tenant,
        role,
        hosts: identity.host_scoped.then_some(identity.hosts),
    })
}

pub fn reply_to_pb(reply: CommandReply) -> pb::CallReply {
    use pb::subscription_change::{Add, Change, Clear, Remove};
    pb::CallReply {
        frame: reply.frame.map(Vec::from),
        subscriptions: reply
            .subscriptions
            .into_iter()
            .map(|change| pb::SubscriptionChange {
                change: Some(match change {
                    SubscriptionChange::Add { channel, after_seq } => Change::Add(Add { channel, after_seq }),
                    SubscriptionChange::Remove { channel } => Change::Remove(Remove { channel }),
                    SubscriptionChange::Clear => Change::Clear(Clear {}),
                }),
            })
            .collect(),
        session_started: reply.session_started,
        deliver_first: reply.deliver_first,
        close: reply.close.map(|close| pb::Close {
            code: u32::from(close.code),
            reason: close.reason,
        }),
    }
}

pub fn reply_from_pb(reply: pb::CallReply) -> Result<CommandReply, Malformed> {
    use pb::subscription_change::Change;
    let subscriptions = reply
        .subscriptions
        .into_iter()
        .map(|change| match change.change {
            Some(Change::Add(add)) => Ok(SubscriptionChange::Add {
                channel: add.channel,
                after_seq: add.after_seq,
            }),
            Some(Change::Remove(remove)) => Ok(SubscriptionChange::Remove {
                channel: remove.channel,
            }),
            Some(Change::Clear(_)) => Ok(SubscriptionChange::Clear),
            None => Err(Malformed("subscription change is empty")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let close = reply
        .close
        .map(|close| {
            Ok::<_, Malformed>(CloseRequest {
                code: u16::try_from(close.code).map_err(|_| Malformed("close code out of range"))?,
                reason: close.reason,
            })
        })
        .transpose()?;
    Ok(CommandReply {
        frame: reply.frame.map(bytes::Bytes::from),
        subscriptions,
        session_started: reply.session_started,
        close,
        deliver_first: reply.deliver_first,
    })
}

pub fn event_to_pb(event: &BusEvent) -> pb::BusEvent {
    use pb::bus_event::Audience as PbAudience;
    let kind = match event.kind {
        BusEventKind::Action => pb::BusEventKind::Action,
        BusEventKind::Notification => pb::BusEventKind::Notification,
        BusEventKind::ChannelDisposed => pb::BusEventKind::ChannelDisposed,
    };
    let audience = match event.audience {
        Audience::Subscribers => PbAudience::Subscribers(pb::Subscribers {}),
        Audience::Connection(id) => PbAudience::Connection(id.0),
        Audience::Everyone => PbAudience::Everyone(pb::Everyone {}),
        Audience::SubscribersAnd(id) => PbAudience::SubscribersAnd(id.0),
    };
    pb::BusEvent {
        kind: kind.into(),
        channel: event.channel.to_string(),
        seq: event.seq,
        prev_seq: event.prev_seq,
        audience: Some(audience),
        frame: event.frame.to_vec(),
    }
}

pub fn event_from_pb(event: pb::BusEvent) -> Result<BusEvent, Malformed> {
    use pb::bus_event::Audience as PbAudience;
    let kind = match pb::BusEventKind::try_from(event.kind) {
        Ok(pb::BusEventKind::Action) => BusEventKind::Action,
        Ok(pb::BusEventKind::Notification) => BusEventKind::Notification,
        Ok(pb::BusEventKind::ChannelDisposed) => BusEventKind::ChannelDisposed,
        Ok(pb::BusEventKind::Unspecified) | Err(_) => return Err(Malformed("bus event kind is unknown")),
    };
    let audience = match event.audience {
        Some(PbAudience::Subscribers(_)) => Audience::Subscribers,
        Some(PbAudience::Connection(id)) => Audience::Connection(ConnectionId(id)),
        Some(PbAudience::Everyone(_)) => Audience::Everyone,
        Some(PbAudience::SubscribersAnd(id)) => Audience::SubscribersAnd(ConnectionId(id)),
        None => return Err(Malformed("bus event audience is missing")),
    };
    Ok(BusEvent {
        kind,
        channel: relay_core::channel_names::shared(&event.channel),
        seq: event.seq,
        prev_seq: event.prev_seq,
        audience,
        frame: bytes::Bytes::from(event.frame),
        // Received now: the shard's clock is not this process's.
        published_at: Some(std::time::Instant::now()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_and_events_round_trip() {
        let reply = CommandReply {
            frame: Some(bytes::Bytes::from_static(
                b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":null}",
            )),
            subscriptions: vec![
                SubscriptionChange::Clear,
                SubscriptionChange::Add {
                    channel: "ahp-chat:/x".into(),
                    after_seq: 7,
                },
                SubscriptionChange::Remove {
                    channel: "ahp-chat:/y".into(),
                },
            ],
            session_started: true,
            close: Some(CloseRequest {
                code: 4001,
                reason: "bye".into(),
            }),
            deliver_first: Some(42),
        };
        let back = reply_from_pb(reply_to_pb(reply)).expect("round trip");
        assert_eq!(back.deliver_first, Some(42));
        assert_eq!(back.subscriptions.len(), 3);
        assert_eq!(
            back.subscriptions[1],
            SubscriptionChange::Add {
                channel: "ahp-chat:/x".into(),
                after_seq: 7
            }
        );
        assert!(back.session_started);
        assert_eq!(back.close.map(|c| c.code), Some(4001));

        for audience in [
            Audience::Subscribers,
            Audience::Connection(ConnectionId(9)),
            Audience::Everyone,
            Audience::SubscribersAnd(ConnectionId(7)),
        ] {
            let event = BusEvent {
                kind: BusEventKind::Action,
                channel: std::sync::Arc::from("ahp-chat:/x"),
                seq: 5,
                prev_seq: 4,
                audience: audience.clone(),
                frame: bytes::Bytes::from_static(b"{}"),
                published_at: None,
            };
            let back = event_from_pb(event_to_pb(&event)).expect("round trip");
            assert_eq!(back.audience, audience);
            assert_eq!((back.seq, back.prev_seq, back.kind), (5, 4, BusEventKind::Action));
            assert_eq!(&*back.channel, "ahp-chat:/x");
            assert!(std::sync::Arc::ptr_eq(
                &back.channel,
                &relay_core::channel_names::shared("ahp-chat:/x")
            ));
        }
    }
}
