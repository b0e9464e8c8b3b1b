//! kube clients from kubeconfig files.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::SyncError;

/// A kube `Client` for the cluster the kubeconfig's current context names (tokens,
/// client certificates and CA data as kubectl understands them).
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, SyncError> {
    client(path, true).await
}

/// Like [`client_from_kubeconfig`], but without kube's own retries of 429, 503 and
/// 504: write-through hands the host's answer to the tenant's client at once (with
/// `Retry-After`), inside the tenant's webhook timeout.
pub async fn client_without_retries(path: &Path) -> Result<kube::Client, SyncError> {
    client(path, false).await
}

async fn client(path: &Path, retry: bool) -> Result<kube::Client, SyncError> {
    let shown = path.display().to_string();
    let kubeconfig = Kubeconfig::read_from(path).map_err(|source| SyncError::Kubeconfig {
        path: shown.clone(),
        source,
    })?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| SyncError::Kubeconfig {
            path: shown.clone(),
            source,
        })?;
    let mut config = config;
    config.default_retry = retry;
    kube::Client::try_from(config).map_err(|source| SyncError::Client {
        path: shown,
        source,
    })
}
