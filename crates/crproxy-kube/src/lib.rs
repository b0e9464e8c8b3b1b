//! A small async Kubernetes REST client over JSON values.
//!
//! crproxy deliberately avoids kube-rs and k8s-openapi: they dominate compile time, and
//! the proxy needs byte-level control of bodies anyway. What is here is what the proxy,
//! the control-plane wiring and the tests need: load a kubeconfig or the in-cluster
//! service account ([`ClusterConfig`]), keep its credentials current as tokens rotate,
//! certificate files are renewed and exec plugins issue new tokens ([`Credentials`]), CRUD and PATCH on any path with
//! [`serde_json::Value`] bodies, raw requests, and watch streams ([`Client`]).
//!
//! TLS uses rustls with the ring provider passed explicitly, so nothing here depends on
//! a process-wide default provider being installed.

mod client;
mod cluster;
mod connector;
mod credentials;
mod error;
#[cfg(feature = "kube")]
mod kube_client;
mod kubeconfig;
mod watch;

pub use client::{
    Client, PatchType, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, USER_AGENT_VALUE,
};
pub use cluster::{Auth, ClusterConfig, ExecConfig, InsecureAcceptAnyServerCert};
pub use credentials::{Credentials, DEFAULT_FILE_RECHECK};
pub use error::{reason_for_status, Error};
pub use kubeconfig::{
    KubeCluster, KubeContext, KubeUser, Kubeconfig, NamedCluster, NamedContext, NamedUser,
};
pub use watch::WatchEvent;

#[cfg(feature = "kube")]
pub use kube_client::kube_client;

#[cfg(feature = "fake")]
pub mod fake;
