//! The client-facing side of the relay: WebSocket upgrade and JWT authentication ([`server`], [`auth`], with an
//! identity provider's keys from [`oidc`] and [`jwks`]),
//! per-connection delivery ([`connection`], [`filter`]), per-tenant quotas ([`quotas`]). It reaches hosts only through
//! [`relay_core::HostLink`].

pub mod auth;
pub mod connection;
pub mod filter;
pub mod jwks;
pub mod oidc;
pub mod quotas;
pub mod server;
mod tls;

pub use server::{router, GatewayState};
