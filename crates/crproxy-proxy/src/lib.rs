//! crproxy-proxy: one HTTPS server per proxied group/version, the peer pool that
//! spreads requests over the target's API server replicas, and the metrics that
//! report on both.
//!
//! The request path reads top to bottom: `handler` (classify → ownership → namespaces)
//! → `pool` (pick and dial a peer) → `transport` (send, stream, map the response) →
//! `metrics`.

pub mod dial;
pub mod metrics;
pub mod pool;
pub mod sources;
