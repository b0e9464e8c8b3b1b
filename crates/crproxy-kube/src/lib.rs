//! Kubernetes connections for crproxy: cluster configuration, credentials that
//! rotate, and a small async REST client over JSON values.
//!
//! The proxy's data path needs byte-level control of bodies, so it does not use
//! kube-rs; what it needs is here: load a kubeconfig or the in-cluster service
//! account ([`ClusterConfig`]), keep its credentials current as tokens rotate,
//! certificate files are renewed and exec plugins issue new tokens
//! ([`Credentials`]), and CRUD, PATCH, raw requests and watch streams with
//! [`serde_json::Value`] bodies ([`Client`]). With the `kube` feature,
//! `kube_client` builds kube-rs clients on the same credentials and connector,
//! optionally with a read timeout ([`ReadTimeoutLayer`]) that turns a watch
//! stalled without closing into an error.
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
mod read_timeout;
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
pub use read_timeout::{IdleTimeoutBody, ReadTimeout, ReadTimeoutLayer};
pub use watch::{LineDecoder, WatchEvent};

#[cfg(feature = "kube")]
pub use kube_client::{kube_client, kube_client_with_read_timeout, kube_client_without_retries};

#[cfg(feature = "fake")]
pub mod fake;
