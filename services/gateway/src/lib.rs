//! The client-facing side of the relay: WebSocket upgrade and JWT authentication ([`server`], [`auth`]),
//! per-connection delivery ([`connection`], [`filter`]), per-tenant quotas ([`quotas`]). It reaches hosts only through
//! [`relay_core::HostLink`].

pub mod auth;
pub mod connection;
pub mod filter;
pub mod oidc;
pub mod quotas;
pub mod server;

pub use server::{router, GatewayState};
