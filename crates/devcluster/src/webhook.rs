//! Admission webhooks (admissionregistration.k8s.io/v1 Validating- and
//! MutatingWebhookConfiguration), called as kube-apiserver 1.32's `webhook`
//! admission plugins call them.
//!
//! The pipeline passes the stored configurations ([`WebhookSnapshot`]) and one
//! [`Call`]; [`mutate`] runs the matching mutating webhooks one after another and
//! applies their JSON patches, [`validate`] runs the matching validating webhooks
//! at once. Both answer with the warnings to send, or the Status to fail with.
//!
//! What decides whether a webhook is called, in kube's order:
//! 1. the admission configuration resources themselves never go to webhooks;
//! 2. `rules` (operations, apiGroups, apiVersions, resources incl. `*`, `*/*`,
//!    `r/sub`, `*/sub`, `r/*`, scope); with `matchPolicy: Equivalent` (the default)
//!    a rule naming another served version of the same resource also matches, and
//!    the webhook then sees the object in that version;
//! 3. `namespaceSelector` and `objectSelector`;
//! 4. `matchConditions` (CEL over `object`, `oldObject` and `request`);
//! 5. on a dry-run request, a webhook whose `sideEffects` is not `None` or
//!    `NoneOnDryRun` is not called: the request fails with 400.
//!
//! Answers: a denial becomes `admission webhook "<name>" denied the request: ...`
//! with the webhook's code (400 when it gives none below 400) and reason; a call
//! that fails (transport, timeout, bad response) is ignored under
//! `failurePolicy: Ignore` and becomes a 500 `failed calling webhook` otherwise.
//!
//! The `scale` subresource sends the Scale (autoscaling/v1) it changes.
//!
//! Not done: the `authorizer` CEL variable, the v1beta1 review version, and
//! system trust roots for a webhook without `caBundle` (it cannot be verified
//! and fails).

use crate::admission::{self, AdmissionRequest};
use crate::error::Cause;
use crate::types::RequestAttributes;
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// `timeoutSeconds` when a webhook gives none (kube's v1 default).
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 10;
/// The largest `timeoutSeconds` kube accepts.
pub const MAX_TIMEOUT_SECONDS: u64 = 30;
/// Largest webhook response read (kube's limit for admission responses is 3 MiB).
const MAX_RESPONSE_BYTES: usize = 3 * 1024 * 1024;

/// Stored webhook configurations (JSON as served by the API).
#[derive(Clone, Debug, Default)]
pub struct WebhookSnapshot {
    /// ValidatingWebhookConfiguration objects.
    pub validating: Vec<Value>,
    /// MutatingWebhookConfiguration objects.
    pub mutating: Vec<Value>,
    /// Namespace objects, for namespaceSelector.
    pub namespaces: Vec<Value>,
}

/// One write to admit through webhooks.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// CREATE, UPDATE, DELETE or CONNECT.
    pub operation: &'a str,
    /// Who asks and which resource (group, version, resource, subresource, name).
    pub attrs: &'a RequestAttributes,
    /// Kind of the object in the requested version.
    pub kind: &'a str,
    /// Group and version of that kind when they are not the resource's
    /// (`autoscaling`, `v1` for the Scale of `<resource>/scale`).
    pub kind_group_version: Option<(&'a str, &'a str)>,
    /// Every version the resource is served in (for `matchPolicy: Equivalent`).
    pub served_versions: &'a [String],
    /// The new object (CREATE, UPDATE).
    pub object: Option<&'a Value>,
    /// The stored object (UPDATE, DELETE).
    pub old_object: Option<&'a Value>,
    pub dry_run: bool,
    /// The CreateOptions/UpdateOptions/DeleteOptions of the request.
    pub options: &'a Value,
}

/// How a webhook's Service is reached: an address and port for
/// `(namespace, name, port)`, as the aggregator resolves Services.
pub trait ServiceResolver: Send + Sync {
    fn service_address(&self, ns: &str, name: &str, port: u16) -> Result<(String, u16), String>;
}

/// A request the webhooks refused, with the warnings they sent before that
/// (kube returns those with the error).
#[derive(Clone, Debug, PartialEq)]
pub struct Rejection {
    /// The Status to answer with.
    pub status: Value,
    pub warnings: Vec<String>,
}

/// Runs the matching mutating webhooks in order, applying each one's patch to
/// `object` (when there is one). Returns the webhooks' warnings.
pub async fn mutate(
    snapshot: &WebhookSnapshot,
    call: &Call<'_>,
    object: &mut Option<Value>,
    resolver: &dyn ServiceResolver,
) -> Result<Vec<String>, Rejection> {
    let mut warnings = Vec::new();
    match mutate_each(snapshot, call, object, resolver, &mut warnings).await {
        Ok(()) => Ok(warnings),
        Err(status) => Err(Rejection { status, warnings }),
    }
}

/// kube's order: every matching webhook once; then, once more, each
/// `reinvocationPolicy: IfNeeded` webhook that a later webhook's change made stale.
async fn mutate_each(
    snapshot: &WebhookSnapshot,
    call: &Call<'_>,
    object: &mut Option<Value>,
    resolver: &dyn ServiceResolver,
    warnings: &mut Vec<String>,
) -> Result<(), Value> {
    let hooks = hooks_of(&snapshot.mutating);
    let mut reinvocable: Vec<usize> = Vec::new();
    let mut reinvoke = std::collections::BTreeSet::new();
    for (i, hook) in hooks.iter().enumerate() {
        let Some(changed) = mutate_once(snapshot, hook, call, object, resolver, warnings).await?
        else {
            continue;
        };
        if changed {
            reinvoke.extend(reinvocable.iter().copied());
        }
        if hook["reinvocationPolicy"] == "IfNeeded" {
            reinvocable.push(i);
        }
    }
    for i in reinvoke {
        mutate_once(snapshot, hooks[i], call, object, resolver, warnings).await?;
    }
    Ok(())
}

/// Calls one mutating webhook if it matches. `None`: not called; otherwise
/// whether its patch changed the object.
async fn mutate_once(
    snapshot: &WebhookSnapshot,
    hook: &Value,
    call: &Call<'_>,
    object: &mut Option<Value>,
    resolver: &dyn ServiceResolver,
    warnings: &mut Vec<String>,
) -> Result<Option<bool>, Value> {
    let current = Call {
        object: object.as_ref(),
        ..*call
    };
    let Some(matched) = matching_version(snapshot, hook, &current)? else {
        return Ok(None);
    };
    let review = review_request(&current, &matched);
    let name = hook_name(hook);
    let outcome = match call_webhook(hook, &review, resolver).await {
        Ok(r) => verify_response(&review, r, true)
            .map_err(|e| format!("received invalid webhook response: {e}")),
        Err(e) => Err(format!("failed to call webhook: {e}")),
    };
    // Warnings count even when the webhook then denies.
    if let Ok(response) = &outcome {
        warnings.extend(response_warnings(response));
    }
    let patch = outcome.and_then(|response| {
        if response["allowed"] != true {
            return Ok(Err(denied(name, &response["status"])));
        }
        decode_patch(&response).map(Ok)
    });
    let patch = match patch {
        Ok(Ok(patch)) => patch,
        Ok(Err(denial)) => return Err(denial),
        Err(reason) if ignores_failures(hook) => {
            tracing::warn!(webhook = name, error = %reason, "failed calling webhook, failing open");
            return Ok(Some(false));
        }
        Err(reason) => return Err(calling_failed(name, &reason)),
    };
    let Some(patch) = patch.filter(|p| !p.0.is_empty()) else {
        return Ok(Some(false));
    };
    let Some(target) = object.as_mut() else {
        return Err(internal_error(format!(
            "admission webhook {name:?} attempted to modify the object, which is not supported for this operation"
        )));
    };
    // The webhook patched the object in the version it saw.
    let mut seen = match call.kind_group_version {
        Some(_) => target.clone(),
        None => in_version(target, &matched),
    };
    json_patch::patch(&mut seen, &patch).map_err(|e| internal_error(e.to_string()))?;
    if let (Some(m), Some(av)) = (seen.as_object_mut(), target.get("apiVersion").cloned()) {
        m.insert("apiVersion".into(), av);
    }
    let changed = seen != *target;
    *target = seen;
    Ok(Some(changed))
}

/// The JSON patch of an allowing response, if any. The error is kube's reason
/// (a failed call, subject to failurePolicy).
fn decode_patch(response: &Value) -> Result<Option<json_patch::Patch>, String> {
    let Some(patch) = response["patch"].as_str().filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .map_err(|e| format!("received undecodable patch in webhook response: {e}"))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| format!("received undecodable patch in webhook response: {e}"))
}

/// Calls the matching validating webhooks concurrently. Returns their warnings,
/// or the first denial or failure in configuration order.
pub async fn validate(
    snapshot: &WebhookSnapshot,
    call: &Call<'_>,
    resolver: &dyn ServiceResolver,
) -> Result<Vec<String>, Rejection> {
    let mut invocations = Vec::new();
    for hook in hooks_of(&snapshot.validating) {
        match matching_version(snapshot, hook, call) {
            Ok(Some(matched)) => invocations.push((hook, review_request(call, &matched))),
            Ok(None) => {}
            Err(status) => {
                return Err(Rejection {
                    status,
                    warnings: Vec::new(),
                })
            }
        }
    }
    let outcomes =
        futures_util::future::join_all(invocations.iter().map(|(hook, review)| async move {
            match call_webhook(hook, review, resolver).await {
                Ok(r) => verify_response(review, r, false)
                    .map_err(|e| format!("received invalid webhook response: {e}")),
                Err(e) => Err(format!("failed to call webhook: {e}")),
            }
        }))
        .await;
    // Every answer's warnings are sent, denial or not.
    let warnings: Vec<String> = outcomes
        .iter()
        .flatten()
        .flat_map(response_warnings)
        .collect();
    for ((hook, _), outcome) in invocations.iter().zip(outcomes) {
        let name = hook_name(hook);
        let status = match outcome {
            Err(reason) if ignores_failures(hook) => {
                tracing::warn!(webhook = name, error = %reason, "failed calling webhook, failing open");
                continue;
            }
            Err(reason) => calling_failed(name, &reason),
            Ok(response) if response["allowed"] != true => denied(name, &response["status"]),
            Ok(_) => continue,
        };
        return Err(Rejection { status, warnings });
    }
    Ok(warnings)
}

/// Resources whose writes never go to webhooks (kube exempts them so a broken
/// webhook can always be removed).
fn exempt(attrs: &RequestAttributes) -> bool {
    attrs.api_group == "admissionregistration.k8s.io"
        && matches!(
            attrs.resource.as_str(),
            "validatingwebhookconfigurations"
                | "mutatingwebhookconfigurations"
                | "validatingadmissionpolicies"
                | "validatingadmissionpolicybindings"
        )
}

/// The webhooks of all configurations, configurations sorted by name as kube
/// orders them.
fn hooks_of(configurations: &[Value]) -> Vec<&Value> {
    let mut sorted: Vec<&Value> = configurations.iter().collect();
    sorted.sort_by(|a, b| str_at(a, &["metadata", "name"]).cmp(str_at(b, &["metadata", "name"])));
    sorted
        .into_iter()
        .flat_map(|c| c["webhooks"].as_array().into_iter().flatten())
        .collect()
}

fn hook_name(hook: &Value) -> &str {
    hook["name"].as_str().unwrap_or_default()
}

fn ignores_failures(hook: &Value) -> bool {
    hook["failurePolicy"].as_str() == Some("Ignore")
}

/// The resource version a webhook is called for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatchedVersion {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub kind: String,
}

/// Whether `hook` is called for `call`, and in which version. `Err` is the
/// Status to fail with (dry run unsupported, matchCondition error).
fn matching_version(
    snapshot: &WebhookSnapshot,
    hook: &Value,
    call: &Call,
) -> Result<Option<MatchedVersion>, Value> {
    let Some(matched) = matches(hook, call, &snapshot.namespaces) else {
        return Ok(None);
    };
    match match_conditions(hook, call) {
        Ok(true) => {}
        Ok(false) => return Ok(None),
        Err(_) if ignores_failures(hook) => return Ok(None),
        Err(e) => {
            // kube fails closed with a Forbidden naming the object.
            let a = call.attrs;
            let qualified = crate::error::qualified(&a.resource, &a.api_group);
            return Err(crate::authn::failure_status(
                403,
                "Forbidden",
                &format!("{qualified} {:?} is forbidden: {e}", a.name),
                Some(crate::rbac::details(&a.api_group, &a.resource, &a.name)),
            ));
        }
    }
    if call.dry_run && !matches!(hook["sideEffects"].as_str(), Some("None" | "NoneOnDryRun")) {
        return Err(crate::authn::failure_status(
            400,
            "BadRequest",
            &format!(
                "admission webhook {:?} does not support dry run",
                hook_name(hook)
            ),
            None,
        ));
    }
    Ok(Some(matched))
}

/// Rules, scope and selectors (no CEL). Public for the unit tests' table.
pub fn matches(hook: &Value, call: &Call, namespaces: &[Value]) -> Option<MatchedVersion> {
    if exempt(call.attrs) {
        return None;
    }
    fn request<'b>(call: &Call<'b>, attrs: &'b RequestAttributes) -> AdmissionRequest<'b> {
        AdmissionRequest {
            operation: call.operation,
            attrs,
            kind: ("", "", ""),
            object: call.object,
            old_object: call.old_object,
        }
    }
    let rules: Vec<&Value> = hook["rules"].as_array().into_iter().flatten().collect();
    let exact = rules
        .iter()
        .any(|rule| admission::rule_matches(rule, &request(call, call.attrs)));
    let version = if exact {
        call.attrs.api_version.clone()
    } else if hook["matchPolicy"].as_str() != Some("Exact") {
        // Equivalent: the same resource in another served version.
        call.served_versions
            .iter()
            .filter(|v| **v != call.attrs.api_version)
            .find(|v| {
                let mut other = call.attrs.clone();
                other.api_version = (*v).clone();
                rules
                    .iter()
                    .any(|rule| admission::rule_matches(rule, &request(call, &other)))
            })?
            .clone()
    } else {
        return None;
    };
    let namespace_object = namespaces
        .iter()
        .find(|ns| str_at(ns, &["metadata", "name"]) == call.attrs.namespace)
        .filter(|_| !call.attrs.namespace.is_empty());
    let r = request(call, call.attrs);
    if !admission::namespace_selector_matches(&hook["namespaceSelector"], &r, namespace_object)
        || !admission::object_selector_matches(&hook["objectSelector"], &r)
    {
        return None;
    }
    Some(MatchedVersion {
        group: call.attrs.api_group.clone(),
        version,
        resource: call.attrs.resource.clone(),
        kind: call.kind.to_string(),
    })
}

/// All `matchConditions` true? `Err` when one cannot be evaluated to a bool.
fn match_conditions(hook: &Value, call: &Call) -> Result<bool, String> {
    let Some(conditions) = hook["matchConditions"].as_array().filter(|c| !c.is_empty()) else {
        return Ok(true);
    };
    let env = admission::env();
    let mut ctx = cel::Context::with_env(env.clone());
    let null = Value::Null;
    let request = AdmissionRequest {
        operation: call.operation,
        attrs: call.attrs,
        kind: (&call.attrs.api_group, &call.attrs.api_version, call.kind),
        object: call.object,
        old_object: call.old_object,
    };
    ctx.add_variable_from_value("object", admission::to_cel(call.object.unwrap_or(&null)));
    ctx.add_variable_from_value(
        "oldObject",
        admission::to_cel(call.old_object.unwrap_or(&null)),
    );
    ctx.add_variable_from_value(
        "request",
        admission::to_cel(&admission::request_json(&request)),
    );
    for condition in conditions {
        let name = condition["name"].as_str().unwrap_or_default();
        let expression = condition["expression"].as_str().unwrap_or_default();
        // The CEL crate is young: a panic in it is an evaluation error, not a dead request.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let program = env.compile(expression).map_err(|e| e.to_string())?;
            program.execute(&ctx).map_err(|e| e.to_string())
        }))
        .unwrap_or_else(|_| Err("internal error evaluating the expression".into()));
        match result {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => return Ok(false),
            Ok(other) => {
                return Err(format!(
                    "matchCondition {name:?}: expected a bool, got {other:?}"
                ))
            }
            Err(e) => return Err(format!("matchCondition {name:?}: {e}")),
        }
    }
    Ok(true)
}

/// `object` as the webhook sees it: in the matched version.
fn in_version(object: &Value, matched: &MatchedVersion) -> Value {
    let mut seen = object.clone();
    if let Some(m) = seen.as_object_mut() {
        let api_version = if matched.group.is_empty() {
            matched.version.clone()
        } else {
            format!("{}/{}", matched.group, matched.version)
        };
        m.insert("apiVersion".into(), json!(api_version));
    }
    seen
}

/// The `AdmissionReview` v1 request body for one webhook.
pub fn review_request(call: &Call, matched: &MatchedVersion) -> Value {
    let a = call.attrs;
    let mut user = json!({"username": a.user.name, "groups": a.user.groups});
    if !a.user.uid.is_empty() {
        user["uid"] = json!(a.user.uid);
    }
    if !a.user.extra.is_empty() {
        user["extra"] = json!(a.user.extra);
    }
    let (kind_group, kind_version, request_kind_version) = match call.kind_group_version {
        Some((g, v)) => (g, v, v),
        None => (
            matched.group.as_str(),
            matched.version.as_str(),
            a.api_version.as_str(),
        ),
    };
    let request_kind_group = call
        .kind_group_version
        .map_or(a.api_group.as_str(), |(g, _)| g);
    let mut request = json!({
        "uid": uuid::Uuid::new_v4().to_string(),
        "kind": {"group": kind_group, "version": kind_version, "kind": matched.kind},
        "resource": {"group": matched.group, "version": matched.version, "resource": matched.resource},
        "requestKind": {"group": request_kind_group, "version": request_kind_version, "kind": call.kind},
        "requestResource": {"group": a.api_group, "version": a.api_version, "resource": a.resource},
        "operation": call.operation,
        "userInfo": user,
        "dryRun": call.dry_run,
        "options": call.options,
    });
    let optional = [
        ("subResource", a.subresource.as_str()),
        ("requestSubResource", a.subresource.as_str()),
        ("name", a.name.as_str()),
        ("namespace", a.namespace.as_str()),
    ];
    for (key, value) in optional {
        if !value.is_empty() {
            request[key] = json!(value);
        }
    }
    // A subresource object of its own kind (Scale) is sent as it is.
    let seen = |o: &Value| match call.kind_group_version {
        Some(_) => o.clone(),
        None => in_version(o, matched),
    };
    if let Some(object) = call.object {
        request["object"] = seen(object);
    }
    if let Some(old) = call.old_object {
        request["oldObject"] = seen(old);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// kube's checks of a webhook's answer (`VerifyAdmissionResponse`). Returns the
/// `response` object.
fn verify_response(review: &Value, answer: Value, mutating: bool) -> Result<Value, String> {
    let (api_version, kind) = (answer["apiVersion"].as_str(), answer["kind"].as_str());
    if api_version != Some("admission.k8s.io/v1") || kind != Some("AdmissionReview") {
        return Err(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}, Kind={}",
            api_version.unwrap_or_default(),
            kind.unwrap_or_default()
        ));
    }
    let response = answer["response"].clone();
    if !response.is_object() {
        return Err("webhook response was absent".into());
    }
    let (want, got) = (
        review["request"]["uid"].as_str().unwrap_or_default(),
        response["uid"].as_str().unwrap_or_default(),
    );
    if want != got {
        return Err(format!("expected response.uid={want:?}, got {got:?}"));
    }
    let has_patch = response["patch"].as_str().is_some_and(|p| !p.is_empty());
    if has_patch && !mutating {
        return Err("validating webhooks may not return patches".into());
    }
    match response["patchType"].as_str() {
        Some("JSONPatch") | None if !has_patch => {}
        Some("JSONPatch") => {}
        None => return Err("webhook returned response.patch but not response.patchType".into()),
        Some(other) => {
            return Err(format!(
                "webhook returned invalid response.patchType of {other:?}"
            ))
        }
    }
    Ok(response)
}

fn response_warnings(response: &Value) -> Vec<String> {
    response["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

/// kube's `ToStatusErr`: the webhook's Status, at least 400, with its message
/// prefixed by who denied.
pub fn denied(name: &str, status: &Value) -> Value {
    let denied_by = format!("admission webhook {name:?} denied the request");
    let message = status["message"].as_str().filter(|m| !m.is_empty());
    let reason = status["reason"].as_str().filter(|r| !r.is_empty());
    let message = match (message, reason) {
        (Some(m), _) => format!("{denied_by}: {m}"),
        (None, Some(r)) => format!("{denied_by}: {r}"),
        (None, None) => format!("{denied_by} without explanation"),
    };
    let code = status["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(400);
    let details = status.get("details").filter(|d| d.is_object()).cloned();
    crate::authn::failure_status(code, reason.unwrap_or_default(), &message, details)
}

/// kube's answer when a webhook under `failurePolicy: Fail` cannot be used.
pub fn calling_failed(name: &str, reason: &str) -> Value {
    internal_error(format!("failed calling webhook {name:?}: {reason}"))
}

fn internal_error(error: String) -> Value {
    crate::authn::failure_status(
        500,
        "InternalError",
        &format!("Internal error occurred: {error}"),
        Some(json!({"causes": [{"message": error}]})),
    )
}

/// Where one webhook is reached.
struct Endpoint {
    /// The URL as kube reports it in errors (`https://svc.ns.svc:443/path?timeout=10s`).
    display_url: String,
    /// Dial address.
    host: String,
    port: u16,
    /// The name the serving certificate must carry.
    server_name: String,
    /// Path and query of the POST.
    path_and_query: String,
}

fn endpoint(
    config: &Value,
    timeout: Duration,
    resolver: &dyn ServiceResolver,
) -> Result<Endpoint, String> {
    let timeout_query = format!("timeout={}s", timeout.as_secs());
    if let Some(url) = config["url"].as_str() {
        let parsed = url::Url::parse(url).map_err(|e| format!("parse {url:?}: {e}"))?;
        let host = parsed
            .host_str()
            .unwrap_or_default()
            .trim_matches(['[', ']'])
            .to_string();
        let port = parsed.port().unwrap_or(443);
        let query = match parsed.query() {
            Some(q) if !q.is_empty() => format!("{q}&{timeout_query}"),
            _ => timeout_query,
        };
        let path = if parsed.path().is_empty() {
            "/"
        } else {
            parsed.path()
        };
        return Ok(Endpoint {
            display_url: format!("{}?{query}", url.split('?').next().unwrap_or(url)),
            server_name: host.clone(),
            host,
            port,
            path_and_query: format!("{path}?{query}"),
        });
    }
    let service = &config["service"];
    let ns = service["namespace"].as_str().unwrap_or_default();
    let name = service["name"].as_str().unwrap_or_default();
    let port = service["port"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(443);
    let path = service["path"]
        .as_str()
        .filter(|p| !p.is_empty())
        .unwrap_or("/");
    let server_name = format!("{name}.{ns}.svc");
    let display_url = format!("https://{server_name}:{port}{path}?{timeout_query}");
    let (host, port) = resolver
        .service_address(ns, name, port)
        .map_err(|e| format!("Post {display_url:?}: {e}"))?;
    Ok(Endpoint {
        display_url,
        host,
        port,
        server_name,
        path_and_query: format!("{path}?{timeout_query}"),
    })
}

fn timeout_of(hook: &Value) -> Duration {
    let seconds = hook["timeoutSeconds"]
        .as_u64()
        .unwrap_or(DEFAULT_TIMEOUT_SECONDS)
        .clamp(1, MAX_TIMEOUT_SECONDS);
    Duration::from_secs(seconds)
}

/// POSTs the review to the webhook over TLS verified against its caBundle and
/// returns the decoded answer. The error is the text after `failed to call webhook: `.
async fn call_webhook(
    hook: &Value,
    review: &Value,
    resolver: &dyn ServiceResolver,
) -> Result<Value, String> {
    let timeout = timeout_of(hook);
    let endpoint = endpoint(&hook["clientConfig"], timeout, resolver)?;
    let url = endpoint.display_url.clone();
    match tokio::time::timeout(timeout, post(hook, &endpoint, review)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(PostError::Transport(e))) => Err(format!("Post {url:?}: {e}")),
        Ok(Err(PostError::Answer(e))) => Err(e),
        Err(_) => Err(format!("Post {url:?}: context deadline exceeded")),
    }
}

enum PostError {
    /// Reaching the webhook failed (Go wraps these in the URL).
    Transport(String),
    /// The webhook answered, but not usefully.
    Answer(String),
}

async fn post(hook: &Value, endpoint: &Endpoint, review: &Value) -> Result<Value, PostError> {
    let transport = PostError::Transport;
    let ca_bundle = hook["clientConfig"]["caBundle"]
        .as_str()
        .map(|b| base64::engine::general_purpose::STANDARD.decode(b))
        .transpose()
        .map_err(|e| transport(format!("caBundle is not base64: {e}")))?
        .unwrap_or_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ca_bundle) {
        let cert = cert.map_err(|e| transport(format!("caBundle: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| transport(format!("caBundle: {e}")))?;
    }
    let provider = Arc::new(crproxy_kube::crypto_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| transport(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let authority = if endpoint.host.contains(':') {
        format!("[{}]:{}", endpoint.host, endpoint.port)
    } else {
        format!("{}:{}", endpoint.host, endpoint.port)
    };
    let tcp = TcpStream::connect(&authority)
        .await
        .map_err(|e| transport(crate::aggregation::dial_error(&authority, &e)))?;
    let server_name = ServerName::try_from(endpoint.server_name.clone())
        .map_err(|e| transport(format!("server name {}: {e}", endpoint.server_name)))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(server_name, tcp)
        .await
        .map_err(|e| transport(tls_error(&e)))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| transport(e.to_string()))?;
    let connection = tokio::spawn(conn);
    let body = serde_json::to_vec(review).map_err(|e| transport(e.to_string()))?;
    let request = http::Request::post(endpoint.path_and_query.as_str())
        .header(http::header::HOST, authority.as_str())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json, */*")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| transport(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| transport(e.to_string()))?;
    let status = response.status();
    let limited = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE_BYTES);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| transport(e.to_string()))?
        .to_bytes();
    connection.abort();
    if !status.is_success() {
        let text = String::from_utf8_lossy(&bytes);
        let shown = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| text.trim().to_string());
        return Err(PostError::Answer(if shown.is_empty() {
            format!(
                "the server responded with the status code {} but did not return more information",
                status.as_u16()
            )
        } else {
            format!("an error on the server ({shown:?}) has prevented the request from succeeding")
        }));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| PostError::Answer(format!("decoding the response: {e}")))
}

/// Go's wording for the TLS failures a misconfigured caBundle causes.
fn tls_error(e: &std::io::Error) -> String {
    let text = e.to_string();
    if text.contains("UnknownIssuer") {
        "tls: failed to verify certificate: x509: certificate signed by unknown authority".into()
    } else if text.contains("NotValidForName") {
        format!("tls: failed to verify certificate: x509: certificate is not valid for the requested name ({text})")
    } else {
        format!("tls: {text}")
    }
}

// ---------- the configuration objects ----------

/// kube's v1 defaults for each webhook of a configuration.
pub fn apply_defaults(configuration: &mut Value, mutating: bool) {
    let Some(hooks) = configuration["webhooks"].as_array_mut() else {
        return;
    };
    for hook in hooks.iter_mut().filter_map(Value::as_object_mut) {
        hook.entry("failurePolicy").or_insert_with(|| json!("Fail"));
        hook.entry("matchPolicy")
            .or_insert_with(|| json!("Equivalent"));
        hook.entry("namespaceSelector").or_insert_with(|| json!({}));
        hook.entry("objectSelector").or_insert_with(|| json!({}));
        hook.entry("timeoutSeconds")
            .or_insert_with(|| json!(DEFAULT_TIMEOUT_SECONDS));
        if mutating {
            hook.entry("reinvocationPolicy")
                .or_insert_with(|| json!("Never"));
        }
        if let Some(service) = hook
            .get_mut("clientConfig")
            .and_then(|c| c.get_mut("service"))
            .and_then(Value::as_object_mut)
        {
            service.entry("port").or_insert_with(|| json!(443));
        }
        for rule in hook
            .get_mut("rules")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object_mut)
        {
            rule.entry("scope").or_insert_with(|| json!("*"));
        }
    }
}

/// kube's validation of a Validating- or MutatingWebhookConfiguration (the checks
/// a client trips), as field causes.
pub fn validate_configuration(configuration: &Value, mutating: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let required = |field: String, detail: &str| {
        let message = if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        };
        Cause::new("FieldValueRequired", message, field)
    };
    let unsupported = |field: String, value: &str, supported: &[&str]| {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Cause::new(
            "FieldValueNotSupported",
            format!(
                "Unsupported value: {value:?}: supported values: {}",
                list.join(", ")
            ),
            field,
        )
    };
    let invalid = |field: String, value: &Value, detail: &str| {
        Cause::new(
            "FieldValueInvalid",
            format!("Invalid value: {value}: {detail}"),
            field,
        )
    };
    for (i, hook) in configuration["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = |f: &str| format!("webhooks[{i}].{f}");
        let name = hook["name"].as_str().unwrap_or_default();
        if name.is_empty() {
            causes.push(required(at("name"), ""));
        } else if name.split('.').filter(|s| !s.is_empty()).count() < 3 {
            causes.push(invalid(
                at("name"),
                &json!(name),
                "should be a domain with at least three segments separated by dots",
            ));
        } else if !seen.insert(name.to_string()) {
            causes.push(Cause::new(
                "FieldValueDuplicate",
                format!("Duplicate value: {name:?}"),
                at("name"),
            ));
        }
        let versions: Vec<&str> = hook["admissionReviewVersions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if versions.is_empty() {
            causes.push(required(
                at("admissionReviewVersions"),
                "must specify one of v1, v1beta1",
            ));
        } else if !versions.iter().any(|v| *v == "v1" || *v == "v1beta1") {
            causes.push(invalid(
                at("admissionReviewVersions"),
                &hook["admissionReviewVersions"],
                "must include at least one of v1, v1beta1",
            ));
        }
        match hook["sideEffects"].as_str() {
            None | Some("") => causes.push(required(
                at("sideEffects"),
                "must specify one of None, NoneOnDryRun",
            )),
            Some("None" | "NoneOnDryRun") => {}
            Some(other) => causes.push(unsupported(
                at("sideEffects"),
                other,
                &["None", "NoneOnDryRun"],
            )),
        }
        if let Some(t) = hook.get("timeoutSeconds").and_then(Value::as_i64) {
            if !(1..=MAX_TIMEOUT_SECONDS as i64).contains(&t) {
                causes.push(invalid(
                    at("timeoutSeconds"),
                    &json!(t),
                    "the timeout value must be between 1 and 30 seconds",
                ));
            }
        }
        let enums: [(&str, &[&str]); 2] = [
            ("failurePolicy", &["Fail", "Ignore"]),
            ("matchPolicy", &["Equivalent", "Exact"]),
        ];
        for (field, supported) in enums {
            if let Some(v) = hook[field].as_str().filter(|v| !supported.contains(v)) {
                causes.push(unsupported(at(field), v, supported));
            }
        }
        if mutating {
            let supported = ["IfNeeded", "Never"];
            if let Some(v) = hook["reinvocationPolicy"]
                .as_str()
                .filter(|v| !supported.contains(v))
            {
                causes.push(unsupported(at("reinvocationPolicy"), v, &supported));
            }
        }
        causes.extend(client_config_causes(
            &hook["clientConfig"],
            &at("clientConfig"),
        ));
        for (r, rule) in hook["rules"].as_array().into_iter().flatten().enumerate() {
            let rule_at = |f: &str| format!("webhooks[{i}].rules[{r}].{f}");
            for field in ["operations", "apiGroups", "apiVersions", "resources"] {
                if rule[field].as_array().is_none_or(Vec::is_empty) {
                    causes.push(required(rule_at(field), ""));
                }
            }
            if let Some(scope) = rule["scope"]
                .as_str()
                .filter(|s| !["*", "Cluster", "Namespaced"].contains(s))
            {
                causes.push(unsupported(
                    rule_at("scope"),
                    scope,
                    &["*", "Cluster", "Namespaced"],
                ));
            }
        }
    }
    causes
}

fn client_config_causes(config: &Value, at: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let url = config["url"].as_str().filter(|u| !u.is_empty());
    let service = config.get("service").filter(|s| s.is_object());
    match (url, service) {
        (Some(_), Some(_)) | (None, None) => causes.push(Cause::new(
            "FieldValueRequired",
            "Required value: exactly one of url or service is required",
            at,
        )),
        (Some(url), None) => {
            if !url.starts_with("https://") {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    format!("Invalid value: {url:?}: 'https' is the only allowed URL scheme"),
                    format!("{at}.url"),
                ));
            } else if url::Url::parse(url).map_or(true, |u| u.host_str().is_none_or(str::is_empty))
            {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    format!("Invalid value: {url:?}: host must be specified"),
                    format!("{at}.url"),
                ));
            }
        }
        (None, Some(service)) => {
            for key in ["name", "namespace"] {
                if service[key].as_str().is_none_or(str::is_empty) {
                    causes.push(Cause::new(
                        "FieldValueRequired",
                        format!("Required value: service {key} is required"),
                        format!("{at}.service.{key}"),
                    ));
                }
            }
            if let Some(path) = service["path"].as_str().filter(|p| !p.starts_with('/')) {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    format!("Invalid value: {path:?}: must start with a '/'"),
                    format!("{at}.service.path"),
                ));
            }
            if let Some(port) = service["port"]
                .as_i64()
                .filter(|p| !(1..=65535).contains(p))
            {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    format!("Invalid value: {port}: port is not valid: must be between 1 and 65535, inclusive"),
                    format!("{at}.service.port"),
                ));
            }
        }
    }
    causes
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or_default()
}

#[cfg(test)]
#[path = "webhook/tests.rs"]
mod tests;
