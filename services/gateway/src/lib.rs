//! The client-facing side of the relay: WebSocket upgrade, authentication, per-connection delivery.

pub mod auth;
