//! crproxy-kube
