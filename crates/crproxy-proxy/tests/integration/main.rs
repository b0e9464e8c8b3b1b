//! The proxy's integration tests, as one test binary: each file here was a binary
//! of its own, and each linked its own copy of hyper, rustls and devcluster. One
//! binary builds them once, links once and lets the test threads move from one
//! file's tests to the next without waiting for a file's slowest.
//!
//! Kept apart, as binaries of their own: the real-time group
//! (`failure_deadlines.rs`, `fault_suite.rs`), which scripts/test runs by name,
//! and the `memory_bound*.rs` tests, which read the peak RSS of their process
//! and so must have it to themselves.
//!
//! One file's tests: `cargo test -p crproxy-proxy --test integration pool_list::`.

#[path = "../log_support/mod.rs"]
mod log_support;
#[path = "../pool_support/mod.rs"]
mod pool_support;
#[path = "../target_support/mod.rs"]
mod target_support;

mod isolation;
mod ownership_cache;
mod pool_health;
mod pool_list;
mod pool_logs;
mod pool_metrics;
mod pool_requests;
mod pool_sources;
mod pool_sources_kube;
mod proxy_flows;
mod wire;
