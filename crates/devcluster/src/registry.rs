//! Which resources the server serves: the built-in kinds (fixed) plus one entry per
//! established CustomResourceDefinition (changing at runtime).
//!
//! Discovery, routing and storage all read this one table, so a resource appears in
//! discovery exactly when requests for it are served.

use crproxy_core::locks;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// Standard verbs of a read-write resource, in kube's discovery order for built-ins.
pub const CRUD_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The verbs the CRD handler advertises, in its own (different) order.
pub const CR_VERBS: &[&str] = &[
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "create",
    "update",
    "watch",
];

/// Where the `/scale` subresource reads and writes replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleSpec {
    /// JSON path such as `.spec.replicas`.
    pub spec_replicas_path: String,
    pub status_replicas_path: String,
    pub label_selector_path: Option<String>,
}

/// One served version of a resource.
#[derive(Clone, Debug)]
pub struct VersionInfo {
    pub name: String,
    /// The version objects are stored in.
    pub storage: bool,
    /// The deprecation Warning text, when the version is deprecated.
    pub deprecation_warning: Option<String>,
    /// CRD `openAPIV3Schema`, when there is one.
    pub schema: Option<Value>,
    /// CRD `additionalPrinterColumns`.
    pub printer_columns: Vec<Value>,
    /// The compiled schema used for pruning, defaulting and validation.
    pub structural: Option<Arc<crate::schema::StructuralSchema>>,
    /// Whether this version serves `/status` (and so keeps status out of writes to
    /// the main resource). A CRD declares subresources per version
    /// (`spec.versions[i].subresources`), and kube serves them per version.
    pub status_subresource: bool,
    /// Where this version's `/scale` reads and writes replicas, when it serves one.
    pub scale: Option<ScaleSpec>,
}

/// How the server implements a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A built-in kind stored like any other object.
    BuiltIn,
    /// A create-only review resource answered without storing anything.
    Review,
    /// Served for the CustomResourceDefinition of that name.
    Crd(String),
}

/// Everything routing, storage and discovery need to know about one resource.
#[derive(Clone, Debug)]
pub struct ResourceInfo {
    pub group: String,
    /// Served versions, preferred (storage for built-ins) first.
    pub versions: Vec<VersionInfo>,
    /// Plural name (`crontabs`).
    pub resource: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub verbs: Vec<String>,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub source: Source,
    /// Whether `metadata.generation` is maintained (CRs and a few built-ins).
    pub has_generation: bool,
    /// Whether a PUT without `metadata.resourceVersion` is allowed.
    pub unconditional_update: bool,
    /// Other subresources `(name, kind, verbs)` listed in discovery (namespaces/finalize).
    pub extra_subresources: Vec<(String, String, Vec<String>)>,
}

impl ResourceInfo {
    /// Whether this is the core group's `namespaces`.
    pub fn is_namespace(&self) -> bool {
        self.group.is_empty() && self.resource == "namespaces"
    }

    pub fn is_crd(&self) -> bool {
        matches!(self.source, Source::Crd(_))
    }

    pub fn version(&self, name: &str) -> Option<&VersionInfo> {
        self.versions.iter().find(|v| v.name == name)
    }

    /// The Go type kube-apiserver holds one object of this resource in, as Go's
    /// `%T` prints it: kube names it in the 406 it answers when a media type asks
    /// for a list and the object is not one. Custom resources are unstructured;
    /// built-ins are the internal type of their group's package, named as the kind.
    pub fn go_type(&self) -> String {
        match self.source {
            Source::Crd(_) => "*unstructured.Unstructured".to_string(),
            _ => format!("*{}.{}", self.go_package(), self.kind),
        }
    }

    /// [`ResourceInfo::go_type`] of this resource's list.
    pub fn go_list_type(&self) -> String {
        match self.source {
            Source::Crd(_) => "*unstructured.UnstructuredList".to_string(),
            _ => format!("*{}.{}", self.go_package(), self.list_kind),
        }
    }

    /// The Go package of a built-in group's internal types: the group's first
    /// label (`rbac` for rbac.authorization.k8s.io), `core` for the core group.
    fn go_package(&self) -> &str {
        match self.group.as_str() {
            // events.k8s.io serves core's Event storage.
            "" | "events.k8s.io" => "core",
            "internal.apiserver.k8s.io" => "apiserverinternal",
            group => group.split('.').next().unwrap_or(group),
        }
    }

    /// Whether `version` serves the status subresource.
    pub fn has_status(&self, version: &str) -> bool {
        self.version(version).is_some_and(|v| v.status_subresource)
    }

    /// The scale subresource `version` serves, if any.
    pub fn scale(&self, version: &str) -> Option<&ScaleSpec> {
        self.version(version).and_then(|v| v.scale.as_ref())
    }

    pub fn storage_version(&self) -> &str {
        self.versions
            .iter()
            .find(|v| v.storage)
            .or(self.versions.first())
            .map(|v| v.name.as_str())
            .unwrap_or("v1")
    }

    /// `apiVersion` for a version of this resource (`v1` for the core group).
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    pub fn has_verb(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == verb)
    }
}

struct BuiltIn {
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    categories: &'static [&'static str],
    status: bool,
    generation: bool,
    review: bool,
}

const fn b(
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> BuiltIn {
    BuiltIn {
        group,
        version,
        resource,
        singular,
        kind,
        namespaced,
        short_names: &[],
        categories: &[],
        status: false,
        generation: false,
        review: false,
    }
}

impl BuiltIn {
    const fn short(mut self, s: &'static [&'static str]) -> Self {
        self.short_names = s;
        self
    }
    const fn cat(mut self, c: &'static [&'static str]) -> Self {
        self.categories = c;
        self
    }
    const fn status(mut self) -> Self {
        self.status = true;
        self
    }
    const fn generation(mut self) -> Self {
        self.generation = true;
        self
    }
    const fn review(mut self) -> Self {
        self.review = true;
        self
    }
}

const BUILT_INS: &[BuiltIn] = &[
    b("", "v1", "configmaps", "configmap", "ConfigMap", true).short(&["cm"]),
    b("", "v1", "endpoints", "endpoints", "Endpoints", true).short(&["ep"]),
    b("", "v1", "events", "event", "Event", true).short(&["ev"]),
    b("", "v1", "namespaces", "namespace", "Namespace", false)
        .short(&["ns"])
        .status(),
    b("", "v1", "secrets", "secret", "Secret", true),
    b(
        "",
        "v1",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
    )
    .short(&["sa"]),
    b("", "v1", "services", "service", "Service", true)
        .short(&["svc"])
        .cat(&["all"])
        .status(),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
        "validatingadmissionpolicy",
        "ValidatingAdmissionPolicy",
        false,
    )
    .cat(&["api-extensions"])
    .status()
    .generation(),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicybinding",
        "ValidatingAdmissionPolicyBinding",
        false,
    )
    .cat(&["api-extensions"])
    .generation(),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "validatingwebhookconfiguration",
        "ValidatingWebhookConfiguration",
        false,
    )
    .cat(&["api-extensions"])
    .generation(),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
        "MutatingWebhookConfiguration",
        false,
    )
    .cat(&["api-extensions"])
    .generation(),
    b(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        false,
    )
    .short(&["crd", "crds"])
    .cat(&["api-extensions"])
    .status()
    .generation(),
    b(
        "apiregistration.k8s.io",
        "v1",
        "apiservices",
        "apiservice",
        "APIService",
        false,
    )
    .cat(&["api-extensions"])
    .status(),
    b(
        "apps",
        "v1",
        "deployments",
        "deployment",
        "Deployment",
        true,
    )
    .short(&["deploy"])
    .cat(&["all"])
    .status()
    .generation(),
    b(
        "authentication.k8s.io",
        "v1",
        "selfsubjectreviews",
        "selfsubjectreview",
        "SelfSubjectReview",
        false,
    )
    .review(),
    b(
        "authentication.k8s.io",
        "v1",
        "tokenreviews",
        "tokenreview",
        "TokenReview",
        false,
    )
    .review(),
    b(
        "authorization.k8s.io",
        "v1",
        "localsubjectaccessreviews",
        "localsubjectaccessreview",
        "LocalSubjectAccessReview",
        true,
    )
    .review(),
    b(
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        "SelfSubjectAccessReview",
        false,
    )
    .review(),
    b(
        "authorization.k8s.io",
        "v1",
        "selfsubjectrulesreviews",
        "selfsubjectrulesreview",
        "SelfSubjectRulesReview",
        false,
    )
    .review(),
    b(
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "subjectaccessreview",
        "SubjectAccessReview",
        false,
    )
    .review(),
    b(
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        "Lease",
        true,
    ),
    b(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "endpointslice",
        "EndpointSlice",
        true,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "role",
        "Role",
        true,
    ),
];

fn built_in_info(bi: &BuiltIn) -> ResourceInfo {
    let verbs: Vec<String> = if bi.review {
        vec!["create".to_string()]
    } else {
        CRUD_VERBS
            .iter()
            // kube's namespace storage has no collection delete.
            .filter(|v| !(bi.resource == "namespaces" && **v == "deletecollection"))
            .map(|s| s.to_string())
            .collect()
    };
    let mut extra = Vec::new();
    if bi.resource == "namespaces" {
        extra.push((
            "finalize".to_string(),
            "Namespace".to_string(),
            vec!["update".to_string()],
        ));
    }
    let scale = (bi.resource == "deployments").then(|| ScaleSpec {
        spec_replicas_path: ".spec.replicas".into(),
        status_replicas_path: ".status.replicas".into(),
        label_selector_path: None,
    });
    ResourceInfo {
        group: bi.group.to_string(),
        versions: vec![VersionInfo {
            name: bi.version.to_string(),
            storage: true,
            deprecation_warning: None,
            schema: None,
            printer_columns: Vec::new(),
            structural: None,
            status_subresource: bi.status,
            scale,
        }],
        resource: bi.resource.to_string(),
        singular: bi.singular.to_string(),
        kind: bi.kind.to_string(),
        list_kind: format!("{}List", bi.kind),
        namespaced: bi.namespaced,
        verbs,
        short_names: bi.short_names.iter().map(|s| s.to_string()).collect(),
        categories: bi.categories.iter().map(|s| s.to_string()).collect(),
        source: if bi.review {
            Source::Review
        } else {
            Source::BuiltIn
        },
        has_generation: bi.generation,
        // kube allows unconditional updates of built-ins.
        unconditional_update: true,
        extra_subresources: extra,
    }
}

/// Key of a resource: (group, plural resource).
pub type GroupResource = (String, String);

/// The table of served resources.
pub struct Registry {
    builtins: BTreeMap<GroupResource, Arc<ResourceInfo>>,
    /// CRD resources with the order they were first served in (legacy discovery
    /// lists CRD resources in that order, as kube does).
    crds: RwLock<BTreeMap<GroupResource, (u64, Arc<ResourceInfo>)>>,
    next_seq: std::sync::atomic::AtomicU64,
    /// Bumped on every CRD change so discovery caches know to rebuild.
    generation: std::sync::atomic::AtomicU64,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    pub fn new() -> Self {
        let builtins = BUILT_INS
            .iter()
            .map(|bi| {
                (
                    (bi.group.to_string(), bi.resource.to_string()),
                    Arc::new(built_in_info(bi)),
                )
            })
            .collect();
        Registry {
            builtins,
            crds: RwLock::new(BTreeMap::new()),
            next_seq: std::sync::atomic::AtomicU64::new(0),
            generation: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// The resource served at `group/version/resource`, if any.
    pub fn lookup(&self, group: &str, version: &str, resource: &str) -> Option<Arc<ResourceInfo>> {
        let info = self.get(group, resource)?;
        info.version(version)?;
        Some(info)
    }

    /// The resource regardless of version.
    pub fn get(&self, group: &str, resource: &str) -> Option<Arc<ResourceInfo>> {
        let key = (group.to_string(), resource.to_string());
        if let Some(info) = self.builtins.get(&key) {
            return Some(info.clone());
        }
        locks::read(&self.crds).get(&key).map(|(_, i)| i.clone())
    }

    /// Every served resource, built-ins first, then CRDs by group and name.
    pub fn all(&self) -> Vec<Arc<ResourceInfo>> {
        let mut out: Vec<Arc<ResourceInfo>> = self.builtins.values().cloned().collect();
        let mut crds: Vec<(u64, Arc<ResourceInfo>)> =
            locks::read(&self.crds).values().cloned().collect();
        crds.sort_by_key(|(seq, _)| *seq);
        out.extend(crds.into_iter().map(|(_, i)| i));
        out
    }

    /// Whether a group is served by anything (a built-in or a CRD).
    pub fn group_exists(&self, group: &str) -> bool {
        self.all().iter().any(|r| r.group == group)
    }

    /// Whether a group has built-in resources (reviews included): kube serves
    /// it with go-restful webservices rather than the custom-resource handler.
    pub fn builtin_group(&self, group: &str) -> bool {
        self.builtins.keys().any(|(g, _)| g == group)
    }

    /// Serves (or re-serves, after an update) a CRD's resource.
    pub fn put_crd(&self, info: ResourceInfo) {
        let key = (info.group.clone(), info.resource.clone());
        let mut crds = locks::write(&self.crds);
        let seq = match crds.get(&key) {
            Some((seq, _)) => *seq,
            None => self
                .next_seq
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst),
        };
        crds.insert(key, (seq, Arc::new(info)));
        drop(crds);
        self.bump();
    }

    /// Stops serving the resource of the CRD named `crd_name`.
    pub fn remove_crd(&self, crd_name: &str) -> Option<Arc<ResourceInfo>> {
        let mut crds = locks::write(&self.crds);
        let key = crds
            .iter()
            .find(|(_, (_, v))| v.source == Source::Crd(crd_name.to_string()))
            .map(|(k, _)| k.clone())?;
        let removed = crds.remove(&key).map(|(_, i)| i);
        drop(crds);
        self.bump();
        removed
    }

    /// Changes whenever the set of served resources changes.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn bump(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_ins_are_found_by_group_version_resource() {
        let r = Registry::new();
        let check = |g: &str, v: &str, res: &str, kind: Option<&str>| {
            assert_eq!(
                r.lookup(g, v, res).map(|i| i.kind.clone()).as_deref(),
                kind,
                "{g}/{v}/{res}"
            );
        };
        check("", "v1", "configmaps", Some("ConfigMap"));
        check("", "v1", "namespaces", Some("Namespace"));
        check("coordination.k8s.io", "v1", "leases", Some("Lease"));
        check("coordination.k8s.io", "v2", "leases", None);
        check("", "v1", "foos", None);
        assert!(!r.get("", "namespaces").is_some_and(|i| i.namespaced));
        assert!(r
            .get("", "namespaces")
            .is_some_and(|i| !i.has_verb("deletecollection")));
        assert!(r
            .get("", "configmaps")
            .is_some_and(|i| i.has_verb("deletecollection")));
    }
}
