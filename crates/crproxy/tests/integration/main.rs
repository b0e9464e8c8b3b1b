//! The crproxy crate's integration tests, as one test binary: each file here was
//! a binary of its own, and each linked its own ~100 MiB copy of kube, hyper and
//! devcluster. One binary builds them once, links once and lets the test threads
//! move from one file's tests to the next without waiting for a file's slowest.
//!
//! Kept apart, as binaries of their own: `control_plane_faults.rs` (the
//! real-time group, which scripts/test runs by name) and `writethrough_e2e.rs`
//! (it installs a process-wide log subscriber and reads what it captures).
//!
//! One file's tests: `cargo test -p crproxy --test integration e2e_proxy::`.

#[path = "../support/sync_env.rs"]
mod support;

mod cli;
mod config_errors;
mod deploy_manifests;
mod dev_command;
mod doctor;
mod e2e_proxy;
mod e2e_sync;
mod e2e_wiring;
mod kube_connection;
mod run_command;
mod sync_fault_suite;
mod sync_run;
