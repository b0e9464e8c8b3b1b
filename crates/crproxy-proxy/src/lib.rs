//! crproxy-proxy: one HTTPS server per proxied group/version, the peer pool that
//! spreads requests over the target's API server replicas, and the metrics that
//! report on both.
//!
//! The request path reads top to bottom: [`frontproxy`] (who is calling) →
//! [`handler`] (classify → ownership → namespaces) → [`pool`] (pick and dial a peer)
//! → [`transport`] (send, stream, deadline) → [`metrics`]. [`app`] assembles it all
//! from a validated configuration.

pub mod app;
pub mod cbor;
pub mod dial;
pub mod fallback;
pub mod frontproxy;
pub mod handler;
pub mod health;
pub mod metrics;
pub mod namespaces;
pub mod not_found;
pub mod ownership_cache;
pub mod pool;
pub mod resting_socket;
#[cfg(test)]
mod scripted_api;
pub mod served_openapi;
pub mod server;
pub mod sources;
pub mod transport;
pub mod watch_lines;
pub mod watches;
