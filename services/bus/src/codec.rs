//! The wire format of a [`BusEvent`] on Redis: a small fixed binary header followed by the frame bytes as-is
//! (the frame is serialized once by the shard and never re-serialized).
//!
//! Layout (integers big-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | format version ([`VERSION`]) |
//! | 1 | 1 | kind: 0 action, 1 notification, 2 channel disposed |
//! | 2 | 1 | audience: 0 subscribers, 1 one connection, 2 everyone, 3 subscribers and one connection |
//! | 3 | 8 | connection id (audience 1 or 3), otherwise 0 |
//! | 11 | 8 | seq |
//! | 19 | 8 | prev_seq |
//! | 27 | 4 | channel length `n` in bytes |
//! | 31 | n | channel (UTF-8) |
//! | 31+n | … | frame |
//!
//! A commit's events travel as one message, a **batch** ([`encode_batch`], [`decode_batch`]):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | [`BATCH_VERSION`] |
//! | 1 | 4 | number of events `k` (at least 1) |
//! | 5 | … | `k` times: length `m` (4 bytes), then one event encoded as above (`m` bytes) |
//!
//! [`decode_batch`] also accepts a single event (version 1) as a batch of one.
//!
//! Decoding checks every field and returns a [`CodecError`] for anything else; it never panics.

use bytes::{BufMut, Bytes, BytesMut};
use relay_core::bus::{Audience, BusEvent, BusEventKind};
use relay_core::ConnectionId;

/// The format version written by [`encode`] and the only one [`decode`] accepts.
pub const VERSION: u8 = 1;

/// The format version of a batch of events.
pub const BATCH_VERSION: u8 = 2;

/// Bytes before the channel name.
pub const HEADER_LEN: usize = 31;

/// Bytes before a batch's first event.
const BATCH_HEADER_LEN: usize = 5;

/// Why bytes are not an encoded [`BusEvent`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("bus message truncated: {0} bytes")]
    Truncated(usize),
    #[error("unsupported bus message version {0}")]
    Version(u8),
    #[error("unknown bus event kind {0}")]
    Kind(u8),
    #[error("unknown bus audience {0}")]
    Audience(u8),
    #[error("connection id {0} given for an audience that is not one connection")]
    StrayConnection(u64),
    #[error("channel length {0} exceeds the message")]
    ChannelLength(u64),
    #[error("channel name is not UTF-8")]
    ChannelUtf8,
    #[error("a batch of {0} events")]
    BatchCount(u32),
    #[error("{0} bytes after a batch's last event")]
    Trailing(usize),
}

/// Encodes `event` as one bus message.
pub fn encode(event: &BusEvent) -> Bytes {
    let mut out = BytesMut::with_capacity(encoded_len(event));
    encode_into(event, &mut out);
    out.freeze()
}

/// The size of `event` encoded by [`encode`].
pub fn encoded_len(event: &BusEvent) -> usize {
    HEADER_LEN + event.channel.len() + event.frame.len()
}

/// Encodes `events` (at least one; a commit's events in order) as one bus message. A batch of one is written
/// in format 1, which gateways of the previous release read too: during a rolling upgrade they keep following
/// quiet hosts, and repair from the shard the multi-event batches they cannot read, instead of stalling.
pub fn encode_batch(events: &[impl std::borrow::Borrow<BusEvent>]) -> Bytes {
    if let [event] = events {
        return encode(event.borrow());
    }
    let size = BATCH_HEADER_LEN + events.iter().map(|e| 4 + encoded_len(e.borrow())).sum::<usize>();
    let mut out = BytesMut::with_capacity(size);
    out.put_u8(BATCH_VERSION);
    out.put_u32(u32::try_from(events.len()).unwrap_or(u32::MAX));
    for event in events {
        let event = event.borrow();
        out.put_u32(u32::try_from(encoded_len(event)).unwrap_or(u32::MAX));
        encode_into(event, &mut out);
    }
    out.freeze()
}

fn encode_into(event: &BusEvent, out: &mut BytesMut) {
    let channel = event.channel.as_bytes();
    out.put_u8(VERSION);
    out.put_u8(match event.kind {
        BusEventKind::Action => 0,
        BusEventKind::Notification => 1,
        BusEventKind::ChannelDisposed => 2,
    });
    let (audience, connection) = match &event.audience {
        Audience::Subscribers => (0, 0),
        Audience::Connection(id) => (1, id.0),
        Audience::Everyone => (2, 0),
        Audience::SubscribersAnd(id) => (3, id.0),
    };
    out.put_u8(audience);
    out.put_u64(connection);
    out.put_u64(event.seq);
    out.put_u64(event.prev_seq);
    // A channel name longer than 4 GiB cannot occur (frames are bounded far below that); saturate rather
    // than wrap so that such a message would fail to decode instead of decoding wrongly.
    out.put_u32(u32::try_from(channel.len()).unwrap_or(u32::MAX));
    out.put_slice(channel);
    out.put_slice(&event.frame);
}

/// Decodes one bus message holding a batch (or a single event, as a batch of one). The message is copied
/// once; every frame is a slice of that copy.
pub fn decode_batch(input: &[u8]) -> Result<Vec<BusEvent>, CodecError> {
    let Some(&version) = input.first() else {
        return Err(CodecError::Truncated(0));
    };
    if version == VERSION {
        return decode(input).map(|event| vec![event]);
    }
    if version != BATCH_VERSION {
        return Err(CodecError::Version(version));
    }
    let header = input
        .get(..BATCH_HEADER_LEN)
        .ok_or(CodecError::Truncated(input.len()))?;
    let count = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    // Every event takes at least its length and header: a count beyond that cannot be true.
    let most = (input.len() - BATCH_HEADER_LEN) / (4 + HEADER_LEN);
    let wanted = usize::try_from(count).unwrap_or(usize::MAX);
    if count == 0 || wanted > most {
        return Err(CodecError::BatchCount(count));
    }
    let message = Bytes::copy_from_slice(input);
    let mut events = Vec::with_capacity(wanted);
    let mut at = BATCH_HEADER_LEN;
    for _ in 0..wanted {
        let len_bytes = message
            .get(at..at + 4)
            .ok_or(CodecError::Truncated(message.len()))?;
        let len = u32::from_be_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]);
        let len = usize::try_from(len).map_err(|_| CodecError::Truncated(message.len()))?;
        let start = at + 4;
        let end = start.checked_add(len).filter(|end| *end <= message.len());
        let end = end.ok_or(CodecError::Truncated(message.len()))?;
        events.push(decode_shared(&message, start, end)?);
        at = end;
    }
    if at != message.len() {
        return Err(CodecError::Trailing(message.len() - at));
    }
    Ok(events)
}

/// Decodes one bus message holding a single event. The frame is copied out of `input` once.
pub fn decode(input: &[u8]) -> Result<BusEvent, CodecError> {
    let message = Bytes::copy_from_slice(input);
    decode_shared(&message, 0, message.len())
}

/// Decodes the event at `message[start..end]`; its frame is a slice of `message` (no copy).
fn decode_shared(message: &Bytes, start: usize, end: usize) -> Result<BusEvent, CodecError> {
    let input = &message[start..end];
    let header = input
        .get(..HEADER_LEN)
        .ok_or(CodecError::Truncated(input.len()))?;
    let u64_at = |at: usize| -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&header[at..at + 8]);
        u64::from_be_bytes(b)
    };
    if header[0] != VERSION {
        return Err(CodecError::Version(header[0]));
    }
    let kind = match header[1] {
        0 => BusEventKind::Action,
        1 => BusEventKind::Notification,
        2 => BusEventKind::ChannelDisposed,
        k => return Err(CodecError::Kind(k)),
    };
    let connection = u64_at(3);
    let audience = match header[2] {
        0 => Audience::Subscribers,
        1 => Audience::Connection(ConnectionId(connection)),
        2 => Audience::Everyone,
        3 => Audience::SubscribersAnd(ConnectionId(connection)),
        a => return Err(CodecError::Audience(a)),
    };
    if !matches!(header[2], 1 | 3) && connection != 0 {
        return Err(CodecError::StrayConnection(connection));
    }
    let seq = u64_at(11);
    let prev_seq = u64_at(19);
    let channel_len = u32::from_be_bytes([header[27], header[28], header[29], header[30]]);
    let rest = &input[HEADER_LEN..];
    let len = usize::try_from(channel_len).map_err(|_| CodecError::ChannelLength(channel_len.into()))?;
    if len > rest.len() {
        return Err(CodecError::ChannelLength(channel_len.into()));
    }
    let channel = std::str::from_utf8(&rest[..len]).map_err(|_| CodecError::ChannelUtf8)?;
    let frame_start = start + HEADER_LEN + len;
    Ok(BusEvent {
        kind,
        channel: relay_core::channel_names::shared(channel),
        seq,
        prev_seq,
        audience,
        frame: message.slice(frame_start..end),
        // Received now: the publisher's clock is not this process's.
        published_at: Some(std::time::Instant::now()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(kind: BusEventKind, audience: Audience) -> BusEvent {
        BusEvent {
            kind,
            channel: std::sync::Arc::from("ahp-session:/ü/1"),
            seq: 42,
            prev_seq: u64::MAX - 1,
            audience,
            frame: Bytes::from_static(br#"{"jsonrpc":"2.0","method":"action","params":{}}"#),
            published_at: None,
        }
    }

    fn assert_same(a: &BusEvent, b: &BusEvent) {
        assert_eq!(a.kind, b.kind);
        assert_eq!(a.channel, b.channel);
        assert_eq!(a.seq, b.seq);
        assert_eq!(a.prev_seq, b.prev_seq);
        assert_eq!(a.audience, b.audience);
        assert_eq!(a.frame, b.frame);
    }

    #[test]
    fn round_trips_every_kind_and_audience() {
        for kind in [
            BusEventKind::Action,
            BusEventKind::Notification,
            BusEventKind::ChannelDisposed,
        ] {
            for audience in [
                Audience::Subscribers,
                Audience::Connection(ConnectionId(7)),
                Audience::SubscribersAnd(ConnectionId(8)),
                Audience::Everyone,
            ] {
                let event = sample(kind, audience);
                let decoded = decode(&encode(&event)).expect("round trip");
                assert_same(&event, &decoded);
                // The process's shared name, which the gateway's filter recognises by its pointer.
                assert!(std::sync::Arc::ptr_eq(
                    &decoded.channel,
                    &relay_core::channel_names::shared(&event.channel)
                ));
            }
        }
    }

    #[test]
    fn empty_channel_and_frame() {
        let mut event = sample(BusEventKind::ChannelDisposed, Audience::Everyone);
        event.channel = std::sync::Arc::from("");
        event.frame = Bytes::new();
        let bytes = encode(&event);
        assert_eq!(bytes.len(), HEADER_LEN);
        assert_same(&event, &decode(&bytes).expect("round trip"));
    }

    #[test]
    fn frame_bytes_are_kept_verbatim() {
        let mut event = sample(BusEventKind::Action, Audience::Subscribers);
        event.frame = Bytes::from_static(&[0, 255, b'{', 0x80, b'\n']);
        assert_eq!(decode(&encode(&event)).expect("round trip").frame, event.frame);
    }

    #[test]
    fn truncated_input_is_an_error() {
        let bytes = encode(&sample(BusEventKind::Action, Audience::Subscribers));
        let channel_end = HEADER_LEN + "ahp-session:/ü/1".len();
        for cut in 0..channel_end {
            assert!(decode(&bytes[..cut]).is_err(), "accepted a message cut at {cut}");
        }
        // Cutting into the frame still decodes (the frame is the rest), with the shorter frame.
        assert!(decode(&bytes[..channel_end]).is_ok());
    }

    #[test]
    fn bad_fields_are_errors() {
        let good = encode(&sample(BusEventKind::Action, Audience::Subscribers)).to_vec();
        let mut bad = good.clone();
        bad[0] = 2;
        assert_eq!(decode(&bad).err(), Some(CodecError::Version(2)));
        let mut bad = good.clone();
        bad[1] = 3;
        assert_eq!(decode(&bad).err(), Some(CodecError::Kind(3)));
        let mut bad = good.clone();
        bad[2] = 9;
        assert_eq!(decode(&bad).err(), Some(CodecError::Audience(9)));
        let mut bad = good.clone();
        bad[10] = 1;
        assert_eq!(decode(&bad).err(), Some(CodecError::StrayConnection(1)));
        let mut bad = good.clone();
        bad[27..31].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            decode(&bad).err(),
            Some(CodecError::ChannelLength(u32::MAX.into()))
        );
        let mut bad = good;
        bad[HEADER_LEN] = 0xff;
        assert_eq!(decode(&bad).err(), Some(CodecError::ChannelUtf8));
    }

    /// A deterministic fuzz loop: random bytes, and valid messages with random bytes flipped, must decode to
    /// a value or an error and never panic; whatever decodes re-encodes to the same bytes.
    #[test]
    fn fuzz_never_panics() {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let valid = encode(&sample(
            BusEventKind::Notification,
            Audience::Connection(ConnectionId(3)),
        ))
        .to_vec();
        for round in 0..20_000u32 {
            let bytes: Vec<u8> = if round % 2 == 0 {
                let len = (next() % 80) as usize;
                (0..len).map(|_| next() as u8).collect()
            } else {
                let mut b = valid.clone();
                for _ in 0..(1 + next() % 4) {
                    let at = (next() % b.len() as u64) as usize;
                    b[at] = next() as u8;
                }
                let keep = (next() % (b.len() as u64 + 1)) as usize;
                b.truncate(keep);
                b
            };
            if let Ok(event) = decode(&bytes) {
                assert_eq!(encode(&event).as_ref(), bytes.as_slice());
            }
        }
    }

    #[test]
    fn batches_round_trip_and_single_events_decode_as_a_batch_of_one() {
        let events: Vec<BusEvent> = (1..=3)
            .map(|seq| {
                let mut e = sample(BusEventKind::Action, Audience::Subscribers);
                e.seq = seq;
                e.prev_seq = seq - 1;
                e
            })
            .collect();
        let decoded = decode_batch(&encode_batch(&events.iter().collect::<Vec<_>>())).expect("batch");
        assert_eq!(decoded.len(), 3);
        for (a, b) in events.iter().zip(&decoded) {
            assert_same(a, b);
        }
        let single = decode_batch(&encode(&events[0])).expect("a single event");
        assert_eq!(single.len(), 1);
        assert_same(&events[0], &single[0]);
    }

    #[test]
    fn a_batch_of_one_is_written_in_format_1_which_the_previous_release_reads() {
        let event = sample(BusEventKind::Action, Audience::Subscribers);
        let message = encode_batch(&[&event]);
        assert_eq!(message, encode(&event), "format 1, byte for byte");
        assert_same(&event, &decode(&message).expect("a format-1 reader decodes it"));
        assert_eq!(encode_batch(&[&event, &event])[0], BATCH_VERSION);
    }

    #[test]
    fn bad_batches_are_errors() {
        let event = sample(BusEventKind::Action, Audience::Subscribers);
        let good = encode_batch(&[&event, &event]).to_vec();
        for cut in 0..good.len() {
            assert!(
                decode_batch(&good[..cut]).is_err(),
                "accepted a batch cut at {cut}"
            );
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(decode_batch(&trailing).err(), Some(CodecError::Trailing(1)));
        let mut zero = good.clone();
        zero[1..5].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(decode_batch(&zero).err(), Some(CodecError::BatchCount(0)));
        let mut huge = good;
        huge[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_batch(&huge).err(), Some(CodecError::BatchCount(u32::MAX)));
        assert_eq!(decode_batch(&[9]).err(), Some(CodecError::Version(9)));
    }

    /// Random bytes and damaged batches decode to a value or an error, never a panic.
    #[test]
    fn batch_fuzz_never_panics() {
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        };
        let event = sample(BusEventKind::Notification, Audience::Everyone);
        let valid = encode_batch(&[&event, &event, &event]).to_vec();
        for round in 0..20_000u32 {
            let mut b = valid.clone();
            for _ in 0..(1 + next() % 4) {
                let at = (next() % b.len() as u64) as usize;
                b[at] = next() as u8;
            }
            if round % 3 == 0 {
                b.truncate((next() % (b.len() as u64 + 1)) as usize);
            }
            let _ = decode_batch(&b);
        }
    }
}
