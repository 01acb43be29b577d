//! What a client that was away gets back: exact replay from the host's newest envelopes
//! ([`crate::host::replay_buffer`]) or fresh snapshots on `reconnect` ([`resume`]), with the envelopes it is owed
//! ([`crate::host::owed`]); a gateway's gap read back ([`gap_repair`]); and a chat's older turns: paged by
//! `fetchTurns` ([`history`]) and aged out of live state into the archive ([`aging`]; where archived turns live:
//! [`crate::model::archive`]).
//!
//! Rules of this floor: replay is exact or not at all (never partial); nothing is handed out that is not yet
//! committed and published.

pub mod aging;
pub mod gap_repair;
pub mod history;
pub mod resume;
