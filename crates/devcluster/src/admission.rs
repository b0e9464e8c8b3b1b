//! ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) with its bindings,
//! evaluated with CEL as kube-apiserver's `validating` policy plugin does.
//!
//! Pure: the pipeline passes the policies, bindings and namespaces it has stored and
//! one [`AdmissionRequest`]; [`validate`] answers with the warnings to send
//! (`Warning: 299 - "<text>"` headers) or the denial Status to answer with.
//!
//! What is evaluated, in kube's order:
//! 1. the policy's `matchConstraints` (resourceRules / excludeResourceRules with
//!    operations, apiGroups, apiVersions, resources incl. `*`, `*/*`, `r/sub`, `*/sub`,
//!    `r/*`, resourceNames and scope; namespaceSelector; objectSelector);
//! 2. each binding naming the policy, through its `matchResources` (same shape; an
//!    empty one matches what the policy matches);
//! 3. the policy's `matchConditions` (all must be true; an error follows
//!    `failurePolicy`);
//! 4. `variables`, then each `validations` entry: `expression`, `message`,
//!    `messageExpression`, `reason` (default Invalid);
//! 5. the binding's `validationActions`: Deny → the first denial is the answer; Warn →
//!    a warning; Audit is accepted and ignored.
//!
//! CEL variables: `object` and `oldObject` (null on CREATE resp. DELETE, as kube),
//! `request`, `params` (always null: parameter resources are not supported),
//! `namespaceObject` and `variables`.
//!
//! Callers: for DELETE pass the stored object as `old_object` and no `object`; for
//! CREATE only `object`; for UPDATE both.

use crate::authn::failure_status;
use crate::error::qualified;
use crate::rbac::{details, label_selector_matches};
use crate::types::RequestAttributes;
use cel::objects::{Key, Map as CelMap};
use cel::{Context, Env, Value as CelValue};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// Stored admission objects (JSON as served by the API).
#[derive(Clone, Debug, Default)]
pub struct AdmissionSnapshot {
    /// ValidatingAdmissionPolicy objects.
    pub policies: Vec<Value>,
    /// ValidatingAdmissionPolicyBinding objects.
    pub bindings: Vec<Value>,
    /// Namespace objects, for namespaceSelector and `namespaceObject`.
    pub namespaces: Vec<Value>,
}

/// One write (or connect) to admit.
#[derive(Clone, Copy, Debug)]
pub struct AdmissionRequest<'a> {
    /// CREATE, UPDATE, DELETE or CONNECT.
    pub operation: &'a str,
    /// Who asks and which resource, as resolved for authorization.
    pub attrs: &'a RequestAttributes,
    /// (group, version, Kind) of the object.
    pub kind: (&'a str, &'a str, &'a str),
    /// The new object (CREATE, UPDATE).
    pub object: Option<&'a Value>,
    /// The stored object (UPDATE, DELETE).
    pub old_object: Option<&'a Value>,
}

/// Upper bound of a `messageExpression` result kube accepts (5 KiB).
const MAX_MESSAGE_BYTES: usize = 5 * 1024;

pub(crate) fn env() -> Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| Arc::new(Env::stdlib())).clone()
}

/// Admits (with warnings, possibly none) or denies the request.
pub fn validate(s: &AdmissionSnapshot, r: &AdmissionRequest) -> Result<Vec<String>, Value> {
    let mut warnings = Vec::new();
    let namespace_object = namespace_object(s, r);
    for policy in &s.policies {
        let policy_name = str_at(policy, &["metadata", "name"]);
        let spec = &policy["spec"];
        if !resources_match(
            &spec["matchConstraints"],
            r,
            namespace_object.as_ref(),
            true,
        ) {
            continue;
        }
        let fail_closed = spec["failurePolicy"].as_str() != Some("Ignore");
        for binding in s
            .bindings
            .iter()
            .filter(|b| str_at(b, &["spec", "policyName"]) == policy_name)
        {
            let binding_name = str_at(binding, &["metadata", "name"]);
            let binding_spec = &binding["spec"];
            if !resources_match(
                &binding_spec["matchResources"],
                r,
                namespace_object.as_ref(),
                false,
            ) {
                continue;
            }
            let actions: Vec<&str> = binding_spec["validationActions"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let Some(outcome) = evaluate_policy(spec, r, namespace_object.as_ref(), fail_closed)
            else {
                continue;
            };
            let Failure { message, reason } = match outcome {
                Ok(()) => continue,
                Err(failure) => failure,
            };
            if actions.contains(&"Warn") {
                warnings.push(format!(
                    "Validation failed for ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}': {message}"
                ));
            }
            if actions.contains(&"Deny") {
                return Err(denial(r, policy_name, binding_name, &message, &reason));
            }
        }
    }
    Ok(warnings)
}

struct Failure {
    message: String,
    reason: String,
}

/// `None` when matchConditions exclude the request; otherwise the first failing
/// validation (or evaluation error under failurePolicy Fail).
fn evaluate_policy(
    spec: &Value,
    r: &AdmissionRequest,
    namespace_object: Option<&Value>,
    fail_closed: bool,
) -> Option<Result<(), Failure>> {
    let env = env();
    let mut ctx = Context::with_env(env.clone());
    ctx.add_variable_from_value("object", to_cel(r.object.unwrap_or(&Value::Null)));
    ctx.add_variable_from_value("oldObject", to_cel(r.old_object.unwrap_or(&Value::Null)));
    ctx.add_variable_from_value("request", to_cel(&request_json(r)));
    ctx.add_variable_from_value("params", CelValue::Null);
    ctx.add_variable_from_value(
        "namespaceObject",
        to_cel(namespace_object.unwrap_or(&Value::Null)),
    );
    ctx.add_variable_from_value(
        "variables",
        CelValue::Map(CelMap::from(HashMap::<Key, CelValue>::new())),
    );

    let eval = |ctx: &Context, expression: &str| -> Result<CelValue, String> {
        // Expressions are user input and the CEL crate is young: a panic inside it
        // becomes an evaluation error (handled by failurePolicy), not a dead request.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let program = env.compile(expression).map_err(|e| e.to_string())?;
            program.execute(ctx).map_err(|e| e.to_string())
        }))
        .unwrap_or_else(|_| Err("internal error evaluating the expression".to_string()))
    };

    for condition in spec["matchConditions"].as_array().into_iter().flatten() {
        let expression = condition["expression"].as_str().unwrap_or_default();
        match eval(&ctx, expression) {
            Ok(CelValue::Bool(true)) => {}
            Ok(CelValue::Bool(false)) => return None,
            Ok(_) | Err(_) if !fail_closed => return None,
            Ok(other) => {
                return Some(Err(Failure {
                    message: format!(
                        "matchCondition '{}' resulted in a non-bool value: {other:?}",
                        condition["name"].as_str().unwrap_or_default()
                    ),
                    reason: String::new(),
                }))
            }
            Err(e) => {
                return Some(Err(Failure {
                    message: format!(
                        "failed to evaluate matchCondition '{}': {e}",
                        condition["name"].as_str().unwrap_or_default()
                    ),
                    reason: String::new(),
                }))
            }
        }
    }

    // Variables see the ones declared before them.
    let mut variables: HashMap<Key, CelValue> = HashMap::new();
    for variable in spec["variables"].as_array().into_iter().flatten() {
        let name = variable["name"].as_str().unwrap_or_default().to_string();
        let expression = variable["expression"].as_str().unwrap_or_default();
        if let Ok(value) = eval(&ctx, expression) {
            variables.insert(Key::from(name), value);
            ctx.add_variable_from_value(
                "variables",
                CelValue::Map(CelMap::from(variables.clone())),
            );
        }
    }

    for validation in spec["validations"].as_array().into_iter().flatten() {
        let expression = validation["expression"].as_str().unwrap_or_default();
        match eval(&ctx, expression) {
            Ok(CelValue::Bool(true)) => {}
            Ok(CelValue::Bool(false)) => {
                let message = failure_message(&ctx, validation, &eval);
                let reason = validation["reason"]
                    .as_str()
                    .unwrap_or("Invalid")
                    .to_string();
                return Some(Err(Failure { message, reason }));
            }
            Ok(_) | Err(_) if !fail_closed => {}
            Ok(other) => {
                return Some(Err(Failure {
                    message: format!(
                    "expression '{expression}' resulted in error: expected a bool, got {other:?}"
                ),
                    reason: String::new(),
                }))
            }
            Err(e) => {
                return Some(Err(Failure {
                    message: format!("expression '{expression}' resulted in error: {e}"),
                    reason: String::new(),
                }))
            }
        }
    }
    Some(Ok(()))
}

/// messageExpression (single line, ≤ 5 KiB) wins, then message, then the expression.
fn failure_message(
    ctx: &Context,
    validation: &Value,
    eval: &dyn Fn(&Context, &str) -> Result<CelValue, String>,
) -> String {
    if let Some(expr) = validation["messageExpression"].as_str() {
        if let Ok(CelValue::String(s)) = eval(ctx, expr) {
            let s = s.trim();
            if !s.is_empty() && s.len() <= MAX_MESSAGE_BYTES && !s.contains('\n') {
                return s.to_string();
            }
        }
    }
    let message = validation["message"].as_str().unwrap_or_default().trim();
    if !message.is_empty() {
        return message.to_string();
    }
    format!(
        "failed expression: {}",
        validation["expression"].as_str().unwrap_or_default().trim()
    )
}

/// kube's denial: `admission.NewForbidden` wording with the validation's reason and
/// its HTTP code, and the policy message as the only cause.
fn denial(r: &AdmissionRequest, policy: &str, binding: &str, message: &str, reason: &str) -> Value {
    let text = format!(
        "ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {message}"
    );
    let reason = if reason.is_empty() { "Invalid" } else { reason };
    let code = match reason {
        "Forbidden" => 403,
        "Unauthorized" => 401,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    };
    let name = object_name(r);
    let qualified = qualified(&r.attrs.resource, &r.attrs.api_group);
    let full = format!("{qualified} {name:?} is forbidden: {text}");
    let mut d = details(&r.attrs.api_group, &r.attrs.resource, &name);
    d["causes"] = json!([{"message": text}]);
    failure_status(code, reason, &full, Some(d))
}

/// The name kube's admission errors use: the request's, else the object's name or
/// generateName, else `Unknown`.
fn object_name(r: &AdmissionRequest) -> String {
    if !r.attrs.name.is_empty() {
        return r.attrs.name.clone();
    }
    if let Some(obj) = r.object {
        for key in ["name", "generateName"] {
            if let Some(n) = obj["metadata"][key].as_str().filter(|n| !n.is_empty()) {
                return n.to_string();
            }
        }
    }
    "Unknown".to_string()
}

/// The namespace the request is in (or the Namespace object itself).
fn namespace_object(s: &AdmissionSnapshot, r: &AdmissionRequest) -> Option<Value> {
    if r.attrs.namespace.is_empty() {
        return None;
    }
    s.namespaces
        .iter()
        .find(|ns| str_at(ns, &["metadata", "name"]) == r.attrs.namespace)
        .cloned()
}

/// matchConstraints / matchResources. `required_rules`: a policy without
/// resourceRules matches nothing, a binding without them defers to its policy.
fn resources_match(
    m: &Value,
    r: &AdmissionRequest,
    namespace_object: Option<&Value>,
    required_rules: bool,
) -> bool {
    let rules = m["resourceRules"].as_array().filter(|r| !r.is_empty());
    match rules {
        Some(rules) if !rules.iter().any(|rule| rule_matches(rule, r)) => return false,
        None if required_rules => return false,
        _ => {}
    }
    if m["excludeResourceRules"]
        .as_array()
        .is_some_and(|rules| rules.iter().any(|rule| rule_matches(rule, r)))
    {
        return false;
    }
    namespace_selector_matches(&m["namespaceSelector"], r, namespace_object)
        && object_selector_matches(&m["objectSelector"], r)
}

fn contains_or_star(list: &Value, value: &str) -> bool {
    list.as_array().is_some_and(|a| {
        a.iter()
            .filter_map(Value::as_str)
            .any(|v| v == "*" || v == value)
    })
}

pub(crate) fn rule_matches(rule: &Value, r: &AdmissionRequest) -> bool {
    let a = r.attrs;
    if !contains_or_star(&rule["operations"], r.operation)
        || !contains_or_star(&rule["apiGroups"], &a.api_group)
        || !contains_or_star(&rule["apiVersions"], &a.api_version)
    {
        return false;
    }
    let resource_ok = rule["resources"].as_array().is_some_and(|list| {
        list.iter().filter_map(Value::as_str).any(|pattern| {
            let (res, sub) = pattern.split_once('/').unwrap_or((pattern, ""));
            if pattern == "*/*" {
                // All resources and all their subresources.
                true
            } else if pattern.contains('/') {
                // `r/*` is every subresource of r, but not r itself.
                (res == "*" || res == a.resource)
                    && ((sub == "*" && !a.subresource.is_empty()) || sub == a.subresource)
            } else {
                // `*` and `r` cover only the main resource, not its subresources.
                a.subresource.is_empty() && (res == "*" || res == a.resource)
            }
        })
    });
    if !resource_ok {
        return false;
    }
    let names = rule["resourceNames"].as_array();
    if names.is_some_and(|n| !n.is_empty()) && !contains_or_star(&rule["resourceNames"], &a.name) {
        return false;
    }
    match rule["scope"].as_str().unwrap_or("*") {
        "Cluster" => a.namespace.is_empty() || a.resource == "namespaces",
        "Namespaced" => !a.namespace.is_empty() && a.resource != "namespaces",
        _ => true,
    }
}

/// A missing selector matches everything (kube defaults it to `{}`).
fn selector_or_everything(selector: &Value, labels: &Value) -> bool {
    selector.is_null() || label_selector_matches(selector, labels)
}

pub(crate) fn namespace_selector_matches(
    selector: &Value,
    r: &AdmissionRequest,
    namespace_object: Option<&Value>,
) -> bool {
    if r.attrs.resource == "namespaces" {
        // For a Namespace, the selector applies to the object itself.
        let obj = r.object.or(r.old_object).unwrap_or(&Value::Null);
        return selector_or_everything(selector, &obj["metadata"]["labels"]);
    }
    if r.attrs.namespace.is_empty() {
        // Other cluster-scoped resources are never excluded by a namespaceSelector.
        return true;
    }
    let labels = namespace_object
        .map(|ns| ns["metadata"]["labels"].clone())
        .unwrap_or(Value::Null);
    selector_or_everything(selector, &labels)
}

/// Matches when the new or the old object's labels match (kube checks both).
pub(crate) fn object_selector_matches(selector: &Value, r: &AdmissionRequest) -> bool {
    if selector.is_null() {
        return true;
    }
    [r.object, r.old_object]
        .into_iter()
        .flatten()
        .any(|o| label_selector_matches(selector, &o["metadata"]["labels"]))
}

/// The `request` variable (admission.k8s.io AdmissionRequest).
pub(crate) fn request_json(r: &AdmissionRequest) -> Value {
    let a = r.attrs;
    let (group, version, kind) = r.kind;
    let mut user = json!({"username": a.user.name, "groups": a.user.groups});
    if !a.user.uid.is_empty() {
        user["uid"] = json!(a.user.uid);
    }
    if !a.user.extra.is_empty() {
        user["extra"] = json!(a.user.extra);
    }
    let gvk = json!({"group": group, "version": version, "kind": kind});
    let gvr = json!({"group": a.api_group, "version": a.api_version, "resource": a.resource});
    json!({
        "kind": gvk,
        "resource": gvr,
        "subResource": a.subresource,
        "requestKind": gvk,
        "requestResource": gvr,
        "requestSubResource": a.subresource,
        "name": a.name,
        "namespace": a.namespace,
        "operation": r.operation,
        "userInfo": user,
        "dryRun": false,
    })
}

/// JSON → CEL value: integers stay integers, objects become string-keyed maps.
pub fn to_cel(v: &Value) -> CelValue {
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => CelValue::Int(i),
            (None, Some(u), _) => CelValue::UInt(u),
            (_, _, Some(f)) => CelValue::Float(f),
            _ => CelValue::Null,
        },
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Array(items) => CelValue::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(map) => {
            let converted: HashMap<Key, CelValue> = map
                .iter()
                .map(|(k, v)| (Key::from(k.as_str()), to_cel(v)))
                .collect();
            CelValue::Map(CelMap::from(converted))
        }
    }
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or_default()
}

#[cfg(test)]
#[path = "admission/tests.rs"]
mod tests;
