/// Errors of the control-plane wiring.
#[derive(Debug, thiserror::Error)]
pub enum WiringError {
    /// Reading or writing one object in the client cluster failed. The registrar
    /// retries on its next pass; check the API server and the proxy's RBAC.
    #[error("{action} {kind} {name:?}: {source}")]
    Object {
        action: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: Box<crproxy_kube::Error>,
    },
    /// Several objects failed in one pass; every failure was logged, this carries the
    /// first.
    #[error("{count} objects failed to register, first: {first}")]
    Several {
        count: usize,
        #[source]
        first: Box<WiringError>,
    },
    /// A registration cannot be expressed: empty group or version, port 0.
    #[error("invalid registration: {0}")]
    Invalid(String),
}
