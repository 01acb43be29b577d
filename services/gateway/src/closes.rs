//! How a connection ends: the WebSocket close codes the relay uses ([`close_code`]) and the reasons it gives.

/// WebSocket close codes the relay uses.
pub mod close_code {
    /// The message was too big to process.
    pub const TOO_BIG: u16 = 1009;
    /// The relay is restarting or shutting down: reconnect and resume.
    pub const RESTARTING: u16 = 1012;
    /// The client fell behind (slow consumer): reconnect and resume.
    pub const TRY_AGAIN_LATER: u16 = 1013;
    /// The host is not available right now.
    pub const UNAVAILABLE: u16 = 1011;
    /// Nothing (not even a pong to the relay's pings) arrived within the idle timeout.
    pub const GOING_AWAY: u16 = 1001;
    /// The connection's access token expired: get a fresh token, reconnect and `reconnect`.
    pub const TOKEN_EXPIRED: u16 = 4001;
}

/// A close code and reason.
pub(crate) type Close = (u16, String);

pub(crate) fn shutting_down() -> Close {
    (close_code::RESTARTING, "relay shutting down".to_string())
}

/// The fan-out lane that wrote to the connection failed: it reconnects and resumes, losing nothing.
pub(crate) fn lane_failed() -> Close {
    (close_code::RESTARTING, "fan-out failed; reconnect".to_string())
}

pub(crate) fn token_expired() -> Close {
    (
        close_code::TOKEN_EXPIRED,
        "access token expired; reconnect with a fresh one".to_string(),
    )
}

pub(crate) fn write_failed() -> Close {
    (close_code::GOING_AWAY, "write failed".to_string())
}

pub(crate) fn slow_consumer() -> Close {
    (close_code::TRY_AGAIN_LATER, "slow consumer".to_string())
}
