use thiserror::Error;

/// Why the sync could not start or a sync step failed.
#[derive(Debug, Error)]
pub enum SyncError {
    /// A kubeconfig file could not be read or parsed (the error names the file).
    #[error(transparent)]
    KubeconfigFile(crproxy_kube::KubeconfigFileError),
    /// A kubeconfig could not be used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: crproxy_kube::Error,
    },
    /// A synced type cannot be used: the host does not serve it, or not as configured.
    /// The message names the type and says what to do.
    #[error("{key}: {message}")]
    Resolution { key: String, message: String },
    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// The write-through webhook could not start.
    #[error("{0}")]
    WriteThrough(String),
    /// The Lease client for leader election could not be built.
    #[error("leader election: {0}")]
    Leader(String),
}

impl SyncError {
    pub(crate) fn api(action: impl Into<String>) -> impl FnOnce(kube::Error) -> SyncError {
        let action = action.into();
        move |source| SyncError::Api { action, source }
    }
}
