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
    /// The APIService of a configured group/version is the client cluster's own
    /// (a built-in group, a CRD's group, or another extension API server's):
    /// registering the proxy over it would take that API away from the client, so
    /// the registrar leaves it and its Service alone. Remove the group/version from
    /// `experimental.proxy.customResources`.
    #[error(
        "not registering APIService {name:?}: {why}; crproxy never takes over a \
         group/version the client cluster serves: remove it from \
         experimental.proxy.customResources"
    )]
    ServedByClient { name: String, why: String },
    /// A Service with the name the registration's Service takes exists and is not
    /// crproxy's: no protection label, and no APIService of crproxy's routes to
    /// it. Writing over it would break whatever uses it, and an APIService routed
    /// to it would send the client's requests to someone else's backend, so the
    /// registrar leaves both alone until it is renamed or deleted.
    #[error(
        "not registering Service \"{namespace}/{name}\": it exists and is not crproxy's \
         (no label {label}={value}, and no APIService of crproxy's routes to it); crproxy \
         never takes over another's Service: rename or delete it",
        label = crproxy_core::names::PROTECTION_LABEL_KEY,
        value = crproxy_core::names::PROTECTION_LABEL_VALUE
    )]
    ServiceNotOurs { namespace: String, name: String },
    /// A registration cannot be expressed: empty group or version, port 0.
    #[error("invalid registration: {0}")]
    Invalid(String),
}
