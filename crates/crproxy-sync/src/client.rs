//! kube clients from kubeconfig files.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::SyncError;

/// A kube `Client` for the cluster the kubeconfig's current context names (tokens,
/// client certificates and CA data as kubectl understands them).
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, SyncError> {
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
    kube::Client::try_from(config).map_err(|source| SyncError::Client {
        path: shown,
        source,
    })
}
