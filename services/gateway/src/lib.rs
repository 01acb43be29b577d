//! The client-facing side of the relay: WebSocket upgrade and JWT authentication ([`server`], [`auth`], with an
//! identity provider's keys from [`oidc`] and [`jwks`]),
//! per-connection delivery ([`connection`], [`filter`]), per-tenant quotas ([`quotas`]), the browser's `Origin`
//! rules ([`origin`]) and the embedded web client ([`web`]). It reaches hosts only through
//! [`relay_core::HostLink`].

pub mod auth;
pub mod auth_throttle;
pub mod claims;
pub mod clock;
pub mod closes;
pub mod connection;
pub mod fanout;
pub mod filter;
pub mod jwks;
mod member;
pub mod oidc;
pub mod origin;
pub mod outbox;
pub mod quotas;
pub mod server;
pub mod shared_quotas;
pub mod sign_in;
pub mod state;
mod tls;
pub mod web;

pub use server::{router, GatewayState};
