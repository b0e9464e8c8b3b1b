use thiserror::Error;

/// Why the sync could not start or a sync step failed.
#[derive(Debug, Error)]
pub enum SyncError {
    /// The host or the tenant cannot be talked to: no client could be made for it.
    #[error("{cluster} cluster: {message}")]
    Cluster {
        cluster: &'static str,
        message: String,
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
}

impl SyncError {
    pub(crate) fn cluster(cluster: &'static str) -> impl FnOnce(crproxy_kube::Error) -> SyncError {
        move |e| SyncError::Cluster {
            cluster,
            message: e.to_string(),
        }
    }

    pub(crate) fn api(action: impl Into<String>) -> impl FnOnce(kube::Error) -> SyncError {
        let action = action.into();
        move |source| SyncError::Api { action, source }
    }
}
