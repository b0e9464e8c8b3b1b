//! Kubernetes connections for crproxy: cluster configuration, credentials that
//! rotate, and kube-rs clients built on them.
//!
//! The proxy's data path needs byte-level control of bodies, so it does not use
//! kube-rs; what it shares with the control plane is here: load a kubeconfig or the
//! in-cluster service account ([`ClusterConfig`]) and keep its credentials current
//! as tokens rotate, certificate files are renewed and exec plugins issue new tokens
//! ([`Credentials`]). Everything else that talks to a Kubernetes API uses the
//! kube-rs clients [`kube_client`] builds on the same credentials and connector,
//! optionally with a read timeout ([`ReadTimeoutLayer`]) that turns a watch stalled
//! without closing into an error.
//!
//! TLS uses rustls with the aws-lc-rs provider passed explicitly, so nothing here
//! depends on a process-wide default provider being installed. [`crypto_provider`] is the one
//! place the workspace names that provider.

mod cluster;
mod connector;
mod credentials;
mod error;
mod kube_client;
mod kubeconfig;
mod pem;
mod read_timeout;
mod stand_ins;

use std::time::Duration;

/// The rustls crypto provider of every TLS configuration, key load and signature
/// check in crproxy and devcluster: aws-lc-rs's, whose key exchange offers the
/// hybrid post-quantum group X25519MLKEM768 first (kube-apiservers built with Go
/// 1.24 or later offer it too), so traffic recorded today cannot be decrypted
/// later by a quantum computer. ring's provider has no such group, and rustls
/// deprecates it from 0.23.48. The one place the provider is named, so that
/// moving to another is one change.
pub fn crypto_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}

/// Installs [`crypto_provider`] as the process's default, for code that builds a
/// rustls configuration without naming one (rustls cannot choose between several
/// compiled in). Only the first call has an effect.
pub fn install_crypto_provider() {
    // An error only says a provider is installed already.
    let _ = crypto_provider().install_default();
}

pub use cluster::{Auth, ClusterConfig, ExecConfig, InsecureAcceptAnyServerCert};
pub use credentials::{Credentials, DEFAULT_FILE_RECHECK};
pub use error::{reason_for_status, Error, KubeconfigFileError, KubeconfigFileProblem};
pub use kube_client::{
    kube_client, kube_client_with_read_timeout, kube_client_without_retries, ClusterAccess,
};
pub use kubeconfig::{
    KubeCluster, KubeContext, KubeUser, Kubeconfig, NamedCluster, NamedContext, NamedUser,
};
pub use read_timeout::{IdleTimeoutBody, ReadTimeout, ReadTimeoutLayer};

/// How long a single control-plane request (not a watch) may take by default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// `User-Agent` sent unless the request sets one, so API server audit logs name us.
pub const USER_AGENT_VALUE: &str = concat!("crproxy/", env!("CARGO_PKG_VERSION"));
/// How long TCP connect and the TLS handshake may each take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
