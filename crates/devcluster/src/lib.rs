//! devcluster: an embedded Kubernetes-compatible API server.
//!
//! It backs `crproxy dev` and every end-to-end test: real kubectl talks to it over
//! real TLS. Where a client can observe a difference, it answers as kube-apiserver
//! 1.32 does (see `../shared/reference/kube-apiserver-1.32`).
//!
//! Architecture invariant: the proxy and sync crates never import devcluster.
//!
//! # Map
//! - [`server`]: [`start`] / [`DevCluster`] (data directory, PKI, token file,
//!   kubeconfig, TLS listeners), and the request pipeline in `server/`:
//!   `handlers` (routing, authn → impersonation → flow classification → RBAC,
//!   discovery, OpenAPI, watch, reviews), `filters` (what kube's outer filters
//!   put on every answer: `Audit-Id`, `Cache-Control`, the priority-and-fairness
//!   UIDs), `rest` (the verbs), `objects` (metadata rules), `hooks`
//!   (what kube's controllers would do: CRD establishment, namespace cleanup,
//!   garbage collection), `seams` (calls into schema/patch/admission),
//!   `protobuf` (the few protobuf bodies kubectl's typed clients send),
//!   `admitted` (the writes that go through admission webhooks),
//!   `request_metrics` (`apiserver_request_total` on `/metrics`).
//! - [`store`]: all objects in memory behind one short lock, written through to
//!   redb; one global resourceVersion; a broadcast change feed plus a bounded
//!   per-resource history for watches that resume.
//! - [`watch`]: watch streams (initial state, replay, bookmarks, selectors).
//! - [`registry`] and [`crd`]: what is served; [`discovery`]: its documents.
//! - [`admission`] (ValidatingAdmissionPolicy) and [`webhook`] (admission
//!   webhooks): what may be written.
//! - [`example_apiserver`]: the dev environment's extension API server.
//!
//! # Behaviour
//! Shapes follow `../shared/reference/kube-apiserver-1.32`; the
//! `reference_replay` test replays that recording and lists the few accepted
//! differences. Deliberate simplifications: the garbage collector is a simple
//! inline one (dependents named by ownerReferences are deleted in the background;
//! `foregroundDeletion`/`orphan` finalizers are released at once), namespaces are
//! emptied and removed inline shortly after deletion (kube needs
//! kube-controller-manager for that; `DevCluster::stop_namespace_controller`
//! turns it off), built-in objects are not schema-validated
//! (unknown fields in them are kept), protobuf is read only for the kinds kubectl
//! creates with typed clients and never written, CBOR is refused, and writes are
//! persisted asynchronously (a crash can lose the last few milliseconds).

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
pub(crate) mod health;
pub mod rbac;
pub mod request_info;
pub mod reviews;
pub mod webhook;

// Forwarding to extension API servers behind APIServices.
pub mod aggregation;

// The dev environment's example extension API server (gateways.example.net).
pub mod example_apiserver;

#[cfg(test)]
mod test_util;

pub use error::{ApiError, Error};
pub use server::{start, DevCluster, DevClusterConfig};
