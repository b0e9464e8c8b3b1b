//! devcluster's integration tests (real kubectl against a devcluster), as one test
//! binary: each file here was a binary of its own, and each linked its own copy
//! of the API server. One binary builds them once and links once.
//!
//! One file's tests: `cargo test -p devcluster --test integration kubectl_access::`.

mod aggregation_kubectl;
mod example_apiserver_kubectl;
mod kubectl;
mod kubectl_access;
mod raw_http;
mod reference_replay;
mod serve_for_manual;
mod webhooks_kubectl;
