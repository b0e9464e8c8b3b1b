//! RBAC authorization over a snapshot of Roles, ClusterRoles and their bindings.
//!
//! Pure and data-driven: the request pipeline reads the four object kinds from the
//! store into an [`RbacSnapshot`] and asks [`authorize`]. The rules are kube's
//! (`k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac`):
//!
//! - members of `system:masters` are allowed everything before RBAC is consulted;
//! - ClusterRoleBindings grant their ClusterRole everywhere; RoleBindings grant a Role
//!   or a ClusterRole only inside the binding's namespace;
//! - a rule matches on verbs, apiGroups, resources (`resource/subresource`, `*`,
//!   `*/subresource`), resourceNames (empty = any), or on nonResourceURLs (exact, `*`,
//!   or a `prefix*`);
//! - ClusterRoles with an `aggregationRule` take the rules of every ClusterRole whose
//!   labels match one of its selectors (what kube's aggregation controller writes).
//!
//! [`authorize_attributes_from_request`] turns a URL into the attributes kube's
//! RequestInfo resolver would, and [`forbidden_status`] writes kube's 403 body.

use crate::authn::failure_status;
use crate::types::{RequestAttributes, UserInfo};
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// The group whose members bypass RBAC.
pub const SYSTEM_MASTERS: &str = "system:masters";

/// RBAC objects (rbac.authorization.k8s.io/v1 JSON) the decision is made from.
#[derive(Clone, Debug, Default)]
pub struct RbacSnapshot {
    pub cluster_roles: Vec<Value>,
    pub roles: Vec<Value>,
    pub cluster_role_bindings: Vec<Value>,
    pub role_bindings: Vec<Value>,
}

/// The outcome of an authorization check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
}

/// Allowed or not.
pub fn authorize(s: &RbacSnapshot, a: &RequestAttributes) -> Decision {
    authorize_with_reason(s, a).0
}

/// Like [`authorize`], plus kube's reason text for an allow by RBAC
/// (`RBAC: allowed by RoleBinding "b/ns" of Role "r" to User "u"`), used by the access
/// reviews. The `system:masters` bypass has no reason, as in kube.
pub fn authorize_with_reason(s: &RbacSnapshot, a: &RequestAttributes) -> (Decision, String) {
    if a.user.in_system_masters() {
        return (Decision::Allow, String::new());
    }
    let mut reason = None;
    visit_rules(s, &a.user, &a.namespace, &mut |source, rule| {
        if rule_allows(rule, a) {
            reason = Some(format!("RBAC: allowed by {source}"));
            false
        } else {
            true
        }
    });
    match reason {
        Some(r) => (Decision::Allow, r),
        None => (Decision::Deny, String::new()),
    }
}

/// Every rule that applies to `user` in `namespace` (cluster-wide rules included), in
/// kube's visiting order: ClusterRoleBindings, then the namespace's RoleBindings.
/// Used by SelfSubjectRulesReview.
pub fn rules_for(s: &RbacSnapshot, user: &UserInfo, namespace: &str) -> Vec<Value> {
    let mut rules = Vec::new();
    visit_rules(s, user, namespace, &mut |_, rule| {
        rules.push(rule.clone());
        true
    });
    rules
}

/// Calls `visit(description, rule)` for every rule granted to `user`; stops when it
/// returns false.
fn visit_rules(
    s: &RbacSnapshot,
    user: &UserInfo,
    namespace: &str,
    visit: &mut dyn FnMut(&str, &Value) -> bool,
) {
    for binding in &s.cluster_role_bindings {
        let Some(subject) = applies_to(binding, user, "") else {
            continue;
        };
        let role_ref = &binding["roleRef"];
        if str_of(role_ref, "kind") != "ClusterRole" {
            continue;
        }
        let role_name = str_of(role_ref, "name");
        let source = format!(
            "ClusterRoleBinding {:?} of ClusterRole {:?} to {subject}",
            name_of(binding),
            role_name
        );
        for rule in cluster_role_rules(s, role_name) {
            if !visit(&source, &rule) {
                return;
            }
        }
    }
    if namespace.is_empty() {
        return;
    }
    for binding in &s.role_bindings {
        if namespace_of(binding) != namespace {
            continue;
        }
        let Some(subject) = applies_to(binding, user, namespace) else {
            continue;
        };
        let role_ref = &binding["roleRef"];
        let role_name = str_of(role_ref, "name");
        let kind = str_of(role_ref, "kind");
        let rules = match kind {
            "ClusterRole" => cluster_role_rules(s, role_name),
            "Role" => s
                .roles
                .iter()
                .find(|r| name_of(r) == role_name && namespace_of(r) == namespace)
                .map(rules_of)
                .unwrap_or_default(),
            _ => continue,
        };
        let source = format!(
            "RoleBinding {:?} of {kind} {:?} to {subject}",
            format!("{}/{}", name_of(binding), namespace),
            role_name
        );
        for rule in rules {
            if !visit(&source, &rule) {
                return;
            }
        }
    }
}

/// The rules kube's ClusterRole aggregation controller would write into `name`:
/// `Some` for a ClusterRole with an `aggregationRule`, `None` otherwise. Lets the
/// server keep stored aggregated roles readable (`kubectl get clusterrole admin`);
/// authorization resolves aggregation itself and does not depend on it.
pub fn aggregated_rules(s: &RbacSnapshot, name: &str) -> Option<Vec<Value>> {
    let role = s.cluster_roles.iter().find(|r| name_of(r) == name)?;
    role["aggregationRule"]
        .is_object()
        .then(|| cluster_role_rules(s, name))
}

/// The rules of a ClusterRole, resolving aggregation (cycles and depth bounded).
fn cluster_role_rules(s: &RbacSnapshot, name: &str) -> Vec<Value> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    collect_cluster_role_rules(s, name, &mut seen, &mut out, 0);
    out
}

fn collect_cluster_role_rules(
    s: &RbacSnapshot,
    name: &str,
    seen: &mut BTreeSet<String>,
    out: &mut Vec<Value>,
    depth: usize,
) {
    if depth > 8 || !seen.insert(name.to_string()) {
        return;
    }
    let Some(role) = s.cluster_roles.iter().find(|r| name_of(r) == name) else {
        return;
    };
    let selectors = role["aggregationRule"]["clusterRoleSelectors"].as_array();
    match selectors {
        Some(selectors) => {
            // kube's controller overwrites the aggregated role's rules with the union
            // of the selected roles' rules.
            for other in &s.cluster_roles {
                let other_name = name_of(other);
                if other_name == name {
                    continue;
                }
                let labels = &other["metadata"]["labels"];
                if selectors
                    .iter()
                    .any(|sel| label_selector_matches(sel, labels))
                {
                    collect_cluster_role_rules(s, other_name, seen, out, depth + 1);
                }
            }
        }
        None => out.extend(rules_of(role)),
    }
}

fn rules_of(role: &Value) -> Vec<Value> {
    role["rules"].as_array().cloned().unwrap_or_default()
}

/// Which subject of the binding matches the user, described as kube does.
fn applies_to(binding: &Value, user: &UserInfo, binding_namespace: &str) -> Option<String> {
    let subjects = binding["subjects"].as_array()?;
    subjects.iter().find_map(|subject| {
        let kind = str_of(subject, "kind");
        let name = str_of(subject, "name");
        match kind {
            "User" if name == user.name => Some(format!("User {name:?}")),
            "Group" if user.groups.iter().any(|g| g == name) => Some(format!("Group {name:?}")),
            "ServiceAccount" => {
                let ns = match str_of(subject, "namespace") {
                    "" => binding_namespace,
                    ns => ns,
                };
                (user.name == format!("system:serviceaccount:{ns}:{name}"))
                    .then(|| format!("ServiceAccount {:?}", format!("{name}/{ns}")))
            }
            _ => None,
        }
    })
}

/// kube's `RuleAllows`.
pub fn rule_allows(rule: &Value, a: &RequestAttributes) -> bool {
    let verbs = strings(&rule["verbs"]);
    if !verbs.iter().any(|v| *v == "*" || *v == a.verb) {
        return false;
    }
    if a.resource_request {
        let groups = strings(&rule["apiGroups"]);
        if !groups.iter().any(|g| *g == "*" || *g == a.api_group) {
            return false;
        }
        let combined = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        let resources = strings(&rule["resources"]);
        let resource_ok = resources.iter().any(|r| {
            *r == "*"
                || *r == combined
                || (!a.subresource.is_empty()
                    && r.strip_prefix("*/") == Some(a.subresource.as_str()))
        });
        if !resource_ok {
            return false;
        }
        let names = strings(&rule["resourceNames"]);
        names.is_empty() || names.iter().any(|n| *n == a.name)
    } else {
        strings(&rule["nonResourceURLs"]).iter().any(|u| {
            *u == "*"
                || *u == a.path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| a.path.starts_with(prefix))
        })
    }
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

fn name_of(v: &Value) -> &str {
    str_of(&v["metadata"], "name")
}

fn namespace_of(v: &Value) -> &str {
    str_of(&v["metadata"], "namespace")
}

/// Evaluates a metav1 LabelSelector (`matchLabels`, `matchExpressions` with In,
/// NotIn, Exists, DoesNotExist) against a labels object. An empty selector matches
/// everything; a null selector matches nothing, as in kube's aggregation and
/// admission matching.
pub fn label_selector_matches(selector: &Value, labels: &Value) -> bool {
    if selector.is_null() {
        return false;
    }
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    if let Some(match_labels) = selector["matchLabels"].as_object() {
        for (k, v) in match_labels {
            if label(k) != v.as_str() {
                return false;
            }
        }
    }
    if let Some(exprs) = selector["matchExpressions"].as_array() {
        for expr in exprs {
            let key = str_of(expr, "key");
            let values = strings(&expr["values"]);
            let ok = match str_of(expr, "operator") {
                "In" => label(key).is_some_and(|v| values.contains(&v)),
                "NotIn" => label(key).is_none_or(|v| !values.contains(&v)),
                "Exists" => label(key).is_some(),
                "DoesNotExist" => label(key).is_none(),
                // kube rejects unknown operators at validation; treat as no match.
                _ => false,
            };
            if !ok {
                return false;
            }
        }
    }
    true
}

/// The 403 body kube-apiserver writes when `a` is refused (reference 081–094).
pub fn forbidden_status(a: &RequestAttributes) -> Value {
    let user = &a.user.name;
    if !a.resource_request {
        let message = format!(
            "forbidden: User {user:?} cannot {} path {:?}",
            a.verb, a.path
        );
        return failure_status(403, "Forbidden", &message, Some(json!({})));
    }
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace {:?}", a.namespace)
    };
    let reason = format!(
        "User {user:?} cannot {} resource {resource:?} in API group {:?} {scope}",
        a.verb, a.api_group
    );
    forbidden_for(&a.api_group, &a.resource, &a.name, &reason)
}

/// kube's `errors.NewForbidden(groupResource, name, err)`: the message starts with
/// `<resource>.<group> ["<name>" ]is forbidden: `, details carry the plural resource.
pub fn forbidden_for(group: &str, resource: &str, name: &str, reason: &str) -> Value {
    let qualified = crate::error::qualified(resource, group);
    let message = if qualified.is_empty() {
        format!("forbidden: {reason}")
    } else if name.is_empty() {
        format!("{qualified} is forbidden: {reason}")
    } else {
        format!("{qualified} {name:?} is forbidden: {reason}")
    };
    failure_status(
        403,
        "Forbidden",
        &message,
        Some(details(group, resource, name)),
    )
}

/// StatusDetails with empty fields omitted, in kube's field order.
pub(crate) fn details(group: &str, kind: &str, name: &str) -> Value {
    let mut d = serde_json::Map::new();
    if !name.is_empty() {
        d.insert("name".into(), json!(name));
    }
    if !group.is_empty() {
        d.insert("group".into(), json!(group));
    }
    if !kind.is_empty() {
        d.insert("kind".into(), json!(kind));
    }
    Value::Object(d)
}

fn cluster_role(name: &str, rules: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "rules": rules,
    })
}

fn aggregated_cluster_role(name: &str, selector_label: &str, extra_labels: Value) -> Value {
    let mut role = cluster_role(name, json!([]));
    role["aggregationRule"] =
        json!({"clusterRoleSelectors": [{"matchLabels": {selector_label: "true"}}]});
    if let (Some(labels), Some(extra)) = (
        role["metadata"]["labels"].as_object_mut(),
        extra_labels.as_object(),
    ) {
        labels.extend(extra.clone());
    }
    role
}

fn cluster_role_binding(name: &str, role: &str, subjects: &[(&str, &str)]) -> Value {
    let subjects: Vec<Value> = subjects
        .iter()
        .map(|(kind, name)| {
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name})
        })
        .collect();
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    })
}

/// The default ClusterRoles and ClusterRoleBindings (a subset of kube's bootstrap
/// policy) devcluster creates on first start. Binding order decides which binding an
/// access review names as the reason and the order of SelfSubjectRulesReview rules;
/// kube's order is its informer's (unordered), ours is alphabetical, which matches
/// reference 148.
pub fn bootstrap_objects() -> Vec<Value> {
    let read = json!(["get", "list", "watch"]);
    let write = json!(["create", "delete", "deletecollection", "patch", "update"]);
    let core_workload = json!([
        "configmaps",
        "endpoints",
        "persistentvolumeclaims",
        "pods",
        "pods/log",
        "pods/status",
        "secrets",
        "serviceaccounts",
        "services",
        "services/status"
    ]);
    vec![
        cluster_role(
            "cluster-admin",
            json!([
                {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
                {"verbs": ["*"], "nonResourceURLs": ["*"]},
            ]),
        ),
        cluster_role(
            "system:basic-user",
            json!([
                {"verbs": ["create"], "apiGroups": ["authorization.k8s.io"],
                 "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]},
                {"verbs": ["create"], "apiGroups": ["authentication.k8s.io"],
                 "resources": ["selfsubjectreviews"]},
            ]),
        ),
        cluster_role(
            "system:public-info-viewer",
            json!([{"verbs": ["get"], "nonResourceURLs":
                ["/healthz", "/livez", "/readyz", "/version", "/version/"]}]),
        ),
        cluster_role(
            "system:discovery",
            json!([{"verbs": ["get"], "nonResourceURLs": [
                "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                "/openapi/*", "/readyz", "/version", "/version/"]}]),
        ),
        // admin/edit/view aggregate, as in kube, so roles labelled for aggregation
        // (for example by a CRD installer) extend them.
        aggregated_cluster_role(
            "admin",
            "rbac.authorization.k8s.io/aggregate-to-admin",
            json!({}),
        ),
        aggregated_cluster_role(
            "edit",
            "rbac.authorization.k8s.io/aggregate-to-edit",
            json!({"rbac.authorization.k8s.io/aggregate-to-admin": "true"}),
        ),
        aggregated_cluster_role(
            "view",
            "rbac.authorization.k8s.io/aggregate-to-view",
            json!({"rbac.authorization.k8s.io/aggregate-to-edit": "true"}),
        ),
        {
            let mut r = cluster_role(
                "system:aggregate-to-admin",
                json!([
                    {"verbs": ["*"], "apiGroups": ["rbac.authorization.k8s.io"],
                     "resources": ["roles", "rolebindings"]},
                    {"verbs": ["create"], "apiGroups": ["authorization.k8s.io"],
                     "resources": ["localsubjectaccessreviews"]},
                ]),
            );
            r["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] = json!("true");
            r
        },
        {
            let mut r = cluster_role(
                "system:aggregate-to-edit",
                json!([
                    {"verbs": write, "apiGroups": [""], "resources": core_workload},
                    {"verbs": write, "apiGroups": ["coordination.k8s.io"], "resources": ["leases"]},
                ]),
            );
            r["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] = json!("true");
            r
        },
        {
            let mut r = cluster_role(
                "system:aggregate-to-view",
                json!([
                    {"verbs": read, "apiGroups": [""], "resources": [
                        "configmaps", "endpoints", "persistentvolumeclaims", "pods",
                        "pods/log", "pods/status", "serviceaccounts", "services",
                        "services/status", "namespaces", "namespaces/status", "events"]},
                    {"verbs": read, "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"]},
                    {"verbs": read, "apiGroups": ["coordination.k8s.io"], "resources": ["leases"]},
                ]),
            );
            r["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] = json!("true");
            r
        },
        cluster_role_binding(
            "cluster-admin",
            "cluster-admin",
            &[("Group", SYSTEM_MASTERS)],
        ),
        cluster_role_binding(
            "system:basic-user",
            "system:basic-user",
            &[("Group", "system:authenticated")],
        ),
        cluster_role_binding(
            "system:discovery",
            "system:discovery",
            &[("Group", "system:authenticated")],
        ),
        cluster_role_binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            &[
                ("Group", "system:authenticated"),
                ("Group", "system:unauthenticated"),
            ],
        ),
    ]
}

/// Splits bootstrap (or any) RBAC objects into a snapshot by kind.
pub fn snapshot_from_objects(objects: &[Value]) -> RbacSnapshot {
    let mut s = RbacSnapshot::default();
    for o in objects {
        let target = match str_of(o, "kind") {
            "ClusterRole" => &mut s.cluster_roles,
            "Role" => &mut s.roles,
            "ClusterRoleBinding" => &mut s.cluster_role_bindings,
            "RoleBinding" => &mut s.role_bindings,
            _ => continue,
        };
        target.push(o.clone());
    }
    s
}

/// The authorization attributes of a request: what
/// [`crate::request_info::resolve`] makes of it, for `user`. A path kube's
/// resolver refuses (the server answers it with a 500 before authorizing
/// anything) gets the attributes kube knows at that point.
pub fn authorize_attributes_from_request(
    method: &str,
    path: &str,
    query: Option<&str>,
    user: UserInfo,
) -> RequestAttributes {
    let info = crate::request_info::resolve(method, path, query).unwrap_or_else(|e| *e.partial);
    attributes(info, path, user)
}

/// `info` as authorization attributes of `user`'s request for `path`.
pub fn attributes(
    info: crate::request_info::RequestInfo,
    path: &str,
    user: UserInfo,
) -> RequestAttributes {
    RequestAttributes {
        user,
        verb: info.verb,
        resource_request: info.resource_request,
        api_group: info.api_group,
        api_version: info.api_version,
        resource: info.resource,
        subresource: info.subresource,
        namespace: info.namespace,
        name: info.name,
        path: path.to_string(),
    }
}

/// The whole "who is it and may they" front of the request pipeline, in kube's
/// order: authenticate (401), apply `Impersonate-*` headers (403/500), resolve the
/// request attributes and authorize them (403). `Ok` carries the attributes of the
/// effective (possibly impersonated) user; `Err` the HTTP code and Status body.
///
/// The caller must not forward `Authorization` or `Impersonate-*` anywhere after
/// this (the aggregation proxy drops them).
pub fn check_request(
    authn: &crate::authn::Authenticator,
    snapshot: &RbacSnapshot,
    method: &str,
    path: &str,
    query: Option<&str>,
    headers: &http::HeaderMap,
    peer_cert: Option<&rustls_pki_types::CertificateDer<'_>>,
) -> Result<RequestAttributes, (u16, Value)> {
    let user = authn
        .authenticate(headers, peer_cert)
        .map_err(|_| (401, crate::authn::unauthorized_status()))?;
    let user = crate::authn::impersonate(&user, headers, |a| {
        authorize(snapshot, a) == Decision::Allow
    })
    .map_err(|status| {
        let code = status["code"]
            .as_u64()
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or(403);
        (code, status)
    })?;
    let attrs = authorize_attributes_from_request(method, path, query, user);
    match authorize(snapshot, &attrs) {
        Decision::Allow => Ok(attrs),
        Decision::Deny => Err((403, forbidden_status(&attrs))),
    }
}

#[cfg(test)]
#[path = "rbac/tests.rs"]
mod tests;
