//! devcluster: an embedded Kubernetes-compatible API server.
//!
//! It backs `crproxy dev` and every end-to-end test: real kubectl talks to it over
//! real TLS. Where a client can observe a difference, it answers as kube-apiserver
//! 1.32 does (see `../shared/reference/kube-apiserver-1.32`).
//!
//! Architecture invariant: the proxy and sync crates never import devcluster.

// Request pipeline and storage.
pub mod error;
pub mod server;
pub mod store;
pub mod types;
pub mod watch;

// Resources and their rules.
pub mod crd;
pub mod discovery;
pub mod registry;

// Pure per-request logic.
pub mod openapi;
pub mod patch;
pub mod schema;
pub mod table;

// Who may do what.
pub mod admission;
pub mod authn;
pub mod rbac;
pub mod reviews;

// Forwarding to extension API servers behind APIServices.
pub mod aggregation;

pub use error::{ApiError, Error};
pub use server::{start, DevCluster, DevClusterConfig};
