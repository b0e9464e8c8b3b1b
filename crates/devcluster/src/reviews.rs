//! Access and identity reviews: the create-only resources `kubectl auth can-i` and
//! `kubectl auth whoami` use, answered from an RBAC snapshot and the authenticator.
//!
//! Pure handlers: the pipeline authenticates the caller, authorizes `create` on the
//! review resource as for any other request (so alice gets kube's 403 for
//! `subjectaccessreviews`, reference 150), decodes the body and calls
//! [`handle_review`]. `Ok` is the object to answer with HTTP 201; `Err` is a Status
//! whose `code` is the HTTP status.

use crate::authn::{failure_status, Authenticator};
use crate::rbac::{self, authorize_with_reason, Decision, RbacSnapshot};
use crate::types::{RequestAttributes, UserInfo};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

const AUTHORIZATION_GROUP: &str = "authorization.k8s.io";
const AUTHENTICATION_GROUP: &str = "authentication.k8s.io";

/// The review resources [`handle_review`] answers, with their group.
pub const REVIEW_RESOURCES: &[(&str, &str)] = &[
    (AUTHORIZATION_GROUP, "subjectaccessreviews"),
    (AUTHORIZATION_GROUP, "selfsubjectaccessreviews"),
    (AUTHORIZATION_GROUP, "localsubjectaccessreviews"),
    (AUTHORIZATION_GROUP, "selfsubjectrulesreviews"),
    (AUTHENTICATION_GROUP, "tokenreviews"),
    (AUTHENTICATION_GROUP, "selfsubjectreviews"),
];

/// Answers a POST of a review object. `resource` is the plural resource name
/// (`subjectaccessreviews`, `selfsubjectaccessreviews`, `localsubjectaccessreviews`,
/// `selfsubjectrulesreviews`, `tokenreviews`, `selfsubjectreviews`); `caller` is the
/// (possibly impersonated) user. For `localsubjectaccessreviews` the body's
/// `metadata.namespace` must already be the namespace of the URL.
pub fn handle_review(
    resource: &str,
    body: &Value,
    caller: &UserInfo,
    rbac: &RbacSnapshot,
    authn: &Authenticator,
) -> Result<Value, Value> {
    match resource {
        "subjectaccessreviews" => subject_access_review(body, rbac, None),
        "localsubjectaccessreviews" => {
            let ns = body["metadata"]["namespace"].as_str().unwrap_or_default();
            subject_access_review(body, rbac, Some(ns))
        }
        "selfsubjectaccessreviews" => self_subject_access_review(body, caller, rbac),
        "selfsubjectrulesreviews" => self_subject_rules_review(body, caller, rbac),
        "tokenreviews" => token_review(body, authn),
        "selfsubjectreviews" => Ok(self_subject_review(body, caller)),
        _ => Err(failure_status(
            404,
            "NotFound",
            "the server could not find the requested resource",
            Some(json!({})),
        )),
    }
}

fn kind_for(resource: &str) -> &'static str {
    match resource {
        "subjectaccessreviews" => "SubjectAccessReview",
        "localsubjectaccessreviews" => "LocalSubjectAccessReview",
        "selfsubjectaccessreviews" => "SelfSubjectAccessReview",
        "selfsubjectrulesreviews" => "SelfSubjectRulesReview",
        "tokenreviews" => "TokenReview",
        _ => "SelfSubjectReview",
    }
}

/// The response's apiVersion: the request's own when it names the right group (for
/// v1beta1 clients), else v1.
fn api_version(body: &Value, group: &str) -> String {
    match body["apiVersion"].as_str() {
        Some(v) if v.starts_with(&format!("{group}/")) => v.to_string(),
        _ => format!("{group}/v1"),
    }
}

fn response(body: &Value, resource: &str, group: &str, spec: Value, status: Value) -> Value {
    let mut metadata = body["metadata"].as_object().cloned().unwrap_or_default();
    // Reviews are never stored: kube answers with a null creation timestamp.
    metadata.insert("creationTimestamp".into(), Value::Null);
    let mut out = Map::new();
    out.insert("kind".into(), json!(kind_for(resource)));
    out.insert("apiVersion".into(), json!(api_version(body, group)));
    out.insert("metadata".into(), Value::Object(metadata));
    out.insert("spec".into(), spec);
    out.insert("status".into(), status);
    Value::Object(out)
}

/// A field error as kube's `field.Error` prints it.
struct FieldError {
    field: &'static str,
    value: String,
    detail: &'static str,
}

impl FieldError {
    fn message(&self) -> String {
        format!("Invalid value: {}: {}", self.value, self.detail)
    }
}

/// kube's 422 for an invalid review. The decoded internal object has no Kind, which
/// is why the message starts with `.authorization.k8s.io ""` (reference 149).
fn invalid(group: &str, errors: &[FieldError]) -> Value {
    let causes: Vec<String> = errors
        .iter()
        .map(|e| format!("{}: {}", e.field, e.message()))
        .collect();
    let joined = if causes.len() == 1 {
        causes[0].clone()
    } else {
        format!("[{}]", causes.join(", "))
    };
    let message = format!(".{group} \"\" is invalid: {joined}");
    let causes: Vec<Value> = errors
        .iter()
        .map(|e| json!({"reason": "FieldValueInvalid", "message": e.message(), "field": e.field}))
        .collect();
    failure_status(
        422,
        "Invalid",
        &message,
        Some(json!({"group": group, "causes": causes})),
    )
}

fn go_struct_value(kind: &str, v: &Value) -> String {
    // Go's %#v of the internal struct; only the fields clients set matter here.
    match kind {
        "NonResourceAttributes" => format!(
            "authorization.NonResourceAttributes{{Path:{:?}, Verb:{:?}}}",
            v["path"].as_str().unwrap_or_default(),
            v["verb"].as_str().unwrap_or_default()
        ),
        _ => "null".to_string(),
    }
}

fn attribute_errors(spec: &Value) -> Vec<FieldError> {
    let has_res = spec["resourceAttributes"].is_object();
    let has_nonres = spec["nonResourceAttributes"].is_object();
    let mut errors = Vec::new();
    if has_res && has_nonres {
        errors.push(FieldError {
            field: "spec.nonResourceAttributes",
            value: go_struct_value("NonResourceAttributes", &spec["nonResourceAttributes"]),
            detail: "cannot be specified in combination with resourceAttributes",
        });
    }
    if !has_res && !has_nonres {
        errors.push(FieldError {
            field: "spec.resourceAttributes",
            value: "\"null\"".into(),
            detail: "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        });
    }
    errors
}

/// Request attributes described by a review's `resourceAttributes` or
/// `nonResourceAttributes`.
fn attributes_from_spec(spec: &Value, user: UserInfo) -> RequestAttributes {
    let s = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    if let Some(ra) = spec["resourceAttributes"].as_object() {
        let ra = Value::Object(ra.clone());
        RequestAttributes {
            user,
            verb: s(&ra, "verb"),
            resource_request: true,
            api_group: s(&ra, "group"),
            api_version: s(&ra, "version"),
            resource: s(&ra, "resource"),
            subresource: s(&ra, "subresource"),
            namespace: s(&ra, "namespace"),
            name: s(&ra, "name"),
            path: String::new(),
        }
    } else {
        let nra = &spec["nonResourceAttributes"];
        RequestAttributes {
            user,
            verb: s(nra, "verb"),
            resource_request: false,
            path: s(nra, "path"),
            ..Default::default()
        }
    }
}

fn access_status(rbac: &RbacSnapshot, attrs: &RequestAttributes) -> Value {
    let (decision, reason) = authorize_with_reason(rbac, attrs);
    let mut status = Map::new();
    status.insert("allowed".into(), json!(decision == Decision::Allow));
    if !reason.is_empty() {
        status.insert("reason".into(), json!(reason));
    }
    Value::Object(status)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn extra_of(v: &Value) -> BTreeMap<String, Vec<String>> {
    v.as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), strings(v))).collect())
        .unwrap_or_default()
}

fn subject_access_review(
    body: &Value,
    rbac: &RbacSnapshot,
    local_namespace: Option<&str>,
) -> Result<Value, Value> {
    let spec = &body["spec"];
    let user = spec["user"].as_str().unwrap_or_default();
    let groups = strings(&spec["groups"]);
    let mut errors = attribute_errors(spec);
    if user.is_empty() && groups.is_empty() {
        errors.push(FieldError {
            field: "spec.user",
            value: "\"\"".into(),
            detail: "at least one of user or group must be specified",
        });
    }
    if let Some(ns) = local_namespace {
        if spec["nonResourceAttributes"].is_object() {
            errors.push(FieldError {
                field: "spec.nonResourceAttributes",
                value: go_struct_value("NonResourceAttributes", &spec["nonResourceAttributes"]),
                detail: "disallowed on this kind of request",
            });
        }
        let spec_ns = spec["resourceAttributes"]["namespace"]
            .as_str()
            .unwrap_or_default();
        if spec["resourceAttributes"].is_object() && spec_ns != ns {
            return Err(failure_status(
                400,
                "BadRequest",
                &format!("spec.resourceAttributes.namespace must match namespace: {ns}"),
                None,
            ));
        }
    }
    if !errors.is_empty() {
        return Err(invalid(AUTHORIZATION_GROUP, &errors));
    }
    let subject = UserInfo {
        name: user.to_string(),
        uid: spec["uid"].as_str().unwrap_or_default().to_string(),
        groups,
        extra: extra_of(&spec["extra"]),
    };
    let attrs = attributes_from_spec(spec, subject);
    let resource = if local_namespace.is_some() {
        "localsubjectaccessreviews"
    } else {
        "subjectaccessreviews"
    };
    Ok(response(
        body,
        resource,
        AUTHORIZATION_GROUP,
        spec.clone(),
        access_status(rbac, &attrs),
    ))
}

fn self_subject_access_review(
    body: &Value,
    caller: &UserInfo,
    rbac: &RbacSnapshot,
) -> Result<Value, Value> {
    let spec = &body["spec"];
    let errors = attribute_errors(spec);
    if !errors.is_empty() {
        return Err(invalid(AUTHORIZATION_GROUP, &errors));
    }
    let attrs = attributes_from_spec(spec, caller.clone());
    Ok(response(
        body,
        "selfsubjectaccessreviews",
        AUTHORIZATION_GROUP,
        spec.clone(),
        access_status(rbac, &attrs),
    ))
}

fn self_subject_rules_review(
    body: &Value,
    caller: &UserInfo,
    rbac: &RbacSnapshot,
) -> Result<Value, Value> {
    let namespace = body["spec"]["namespace"].as_str().unwrap_or_default();
    if namespace.is_empty() {
        return Err(failure_status(
            400,
            "BadRequest",
            "no namespace on request",
            None,
        ));
    }
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    if caller.in_system_masters() {
        // The privileged-group authorizer runs first and reports everything.
        resource_rules.push(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}));
        non_resource_rules.push(json!({"verbs": ["*"], "nonResourceURLs": ["*"]}));
    }
    for rule in rbac::rules_for(rbac, caller, namespace) {
        let mut out = Map::new();
        out.insert("verbs".into(), json!(strings(&rule["verbs"])));
        if rule["nonResourceURLs"].is_array() && !rule["resources"].is_array() {
            out.insert(
                "nonResourceURLs".into(),
                json!(strings(&rule["nonResourceURLs"])),
            );
            non_resource_rules.push(Value::Object(out));
            continue;
        }
        out.insert("apiGroups".into(), json!(strings(&rule["apiGroups"])));
        out.insert("resources".into(), json!(strings(&rule["resources"])));
        let names = strings(&rule["resourceNames"]);
        if !names.is_empty() {
            out.insert("resourceNames".into(), json!(names));
        }
        resource_rules.push(Value::Object(out));
    }
    // kube answers with an empty spec (reference 153).
    Ok(response(
        body,
        "selfsubjectrulesreviews",
        AUTHORIZATION_GROUP,
        json!({}),
        json!({
            "resourceRules": resource_rules,
            "nonResourceRules": non_resource_rules,
            "incomplete": false,
        }),
    ))
}

/// `user` of a TokenReview / `userInfo` of a SelfSubjectReview.
fn user_json(user: &UserInfo) -> Value {
    let mut out = Map::new();
    out.insert("username".into(), json!(user.name));
    if !user.uid.is_empty() {
        out.insert("uid".into(), json!(user.uid));
    }
    if !user.groups.is_empty() {
        out.insert("groups".into(), json!(user.groups));
    }
    if !user.extra.is_empty() {
        out.insert("extra".into(), json!(user.extra));
    }
    Value::Object(out)
}

fn token_review(body: &Value, authn: &Authenticator) -> Result<Value, Value> {
    let spec = &body["spec"];
    let token = spec["token"].as_str().unwrap_or_default();
    if token.is_empty() {
        return Err(failure_status(
            400,
            "BadRequest",
            "token is required for TokenReview in authentication",
            None,
        ));
    }
    let requested = strings(&spec["audiences"]);
    let api_audiences = authn.api_audiences();
    // Static tokens are not audience-bound: kube answers with the API audiences, or
    // with the requested ones they share.
    let audiences: Vec<String> = if requested.is_empty() {
        api_audiences
    } else {
        requested
            .iter()
            .filter(|a| api_audiences.contains(a))
            .cloned()
            .collect()
    };
    let status = match authn.authenticate_token(token) {
        Ok(user) if !audiences.is_empty() => json!({
            "authenticated": true,
            "user": user_json(&user),
            "audiences": audiences,
        }),
        Ok(_) => {
            json!({"user": {}, "error": "token audiences is invalid for the target audiences"})
        }
        Err(e) => json!({"user": {}, "error": e.to_string()}),
    };
    Ok(response(
        body,
        "tokenreviews",
        AUTHENTICATION_GROUP,
        spec.clone(),
        status,
    ))
}

fn self_subject_review(body: &Value, caller: &UserInfo) -> Value {
    // Unlike the other reviews, kube stamps a creation time here (reference 156) and
    // writes no spec.
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mut metadata = body["metadata"].as_object().cloned().unwrap_or_default();
    metadata.insert("creationTimestamp".into(), json!(now));
    json!({
        "kind": "SelfSubjectReview",
        "apiVersion": api_version(body, AUTHENTICATION_GROUP),
        "metadata": metadata,
        "status": {"userInfo": user_json(caller)},
    })
}

#[cfg(test)]
#[path = "reviews/tests.rs"]
mod tests;
