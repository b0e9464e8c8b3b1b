//! Types shared between the request pipeline, authentication, authorization,
//! admission and aggregation.

use std::collections::BTreeMap;

/// An authenticated (or anonymous) caller, as Kubernetes' `user.Info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    /// Includes `system:authenticated` (or `system:unauthenticated`) once authentication
    /// has run.
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// Whether the user is in `system:masters`, which RBAC and the access
    /// reviews let do everything and priority and fairness exempts.
    pub(crate) fn in_system_masters(&self) -> bool {
        self.groups.iter().any(|g| g == crate::rbac::SYSTEM_MASTERS)
    }
}

/// What a request asks to do, as kube-apiserver's `authorizer.Attributes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestAttributes {
    pub user: UserInfo,
    /// Kubernetes verb: get, list, watch, create, update, patch, delete,
    /// deletecollection, impersonate, or an HTTP verb in lower case for non-resource
    /// requests.
    pub verb: String,
    /// True for `/api/...` and `/apis/...` resource paths; false for non-resource URLs.
    pub resource_request: bool,
    pub api_group: String,
    pub api_version: String,
    /// Plural resource name (`crontabs`).
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// The URL path (used for non-resource requests).
    pub path: String,
}
