//! kube clients from kubeconfig files, through crproxy-kube's one credential-aware
//! builder: tokens and token files, client certificates (re-read when renewed) and
//! exec plugins work here exactly as in the proxy.

use std::path::Path;

use crate::SyncError;

/// A kube `Client` for the cluster the kubeconfig's current context names.
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
    let error = |source| SyncError::Kubeconfig {
        path: shown.clone(),
        source,
    };
    let kubeconfig = crproxy_kube::Kubeconfig::load(path).map_err(SyncError::KubeconfigFile)?;
    let namespace = kubeconfig
        .context(None)
        .ok()
        .and_then(|c| c.context.namespace.clone())
        .unwrap_or_else(|| "default".to_string());
    let cluster = crproxy_kube::ClusterConfig::from_kubeconfig(&kubeconfig, None).map_err(error)?;
    client_for(&cluster, &namespace, retry).map_err(error)
}

/// The tenant's client: from its kubeconfig, else as [`inferred_client`].
pub async fn tenant_client(kubeconfig: Option<&Path>) -> Result<kube::Client, SyncError> {
    match kubeconfig {
        Some(path) => client_from_kubeconfig(path).await,
        None => inferred_client().await,
    }
}

/// A kube `Client` from the kubeconfig kubectl would use, else the pod's service
/// account.
pub async fn inferred_client() -> Result<kube::Client, SyncError> {
    let error = |source| SyncError::Kubeconfig {
        path: "in-cluster configuration".into(),
        source,
    };
    let cluster = crproxy_kube::ClusterConfig::infer().map_err(error)?;
    client_for(&cluster, "default", true).map_err(error)
}

fn client_for(
    cluster: &crproxy_kube::ClusterConfig,
    namespace: &str,
    retry: bool,
) -> Result<kube::Client, crproxy_kube::Error> {
    let credentials = cluster.credentials()?;
    if retry {
        crproxy_kube::kube_client(cluster, credentials, namespace)
    } else {
        crproxy_kube::kube_client_without_retries(cluster, credentials, namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kubeconfig that is not YAML: one line naming the file once.
    #[tokio::test]
    async fn a_broken_kubeconfig_is_named_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("host.kubeconfig");
        std::fs::write(&path, "clusters: [oops\n").expect("write");
        let message = match client(&path, false).await {
            Ok(_) => panic!("a broken kubeconfig made a client"),
            Err(e) => e.to_string(),
        };
        let shown = path.display().to_string();
        assert_eq!(message.matches(&shown).count(), 1, "{message}");
        assert!(!message.contains('\n'), "{message}");
        assert!(message.ends_with("at line 1, column 11"), "{message}");
    }
}
