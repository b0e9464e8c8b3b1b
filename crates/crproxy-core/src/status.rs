//! Builders for Kubernetes `Status` bodies (`apiVersion: v1`, `kind: Status`) in the
//! shapes kube-apiserver 1.32 sends (see `reference/kube-apiserver-1.32`), so kubectl
//! and client-go render proxy-made errors exactly like server-made ones.

use serde_json::{json, Map, Value};

/// A failure `Status` with no `details`.
pub fn status(code: u16, reason: &str, message: impl Into<String>) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message.into(),
        "reason": reason,
        "code": code,
    })
}

/// A failure `Status` with `details` (`name` and `group` are omitted when empty, as
/// kube does for the core group and collection URLs).
pub fn status_with_details(
    code: u16,
    reason: &str,
    message: impl Into<String>,
    name: Option<&str>,
    group: &str,
    kind: &str,
) -> Value {
    let mut details = Map::new();
    if let Some(name) = name.filter(|n| !n.is_empty()) {
        details.insert("name".into(), Value::from(name));
    }
    if !group.is_empty() {
        details.insert("group".into(), Value::from(group));
    }
    details.insert("kind".into(), Value::from(kind));
    let mut v = status(code, reason, message);
    if let Some(obj) = v.as_object_mut() {
        obj.insert("details".into(), Value::Object(details));
    }
    v
}

/// `<resource>.<group>` or, for the core group, `<resource>` (kube-apiserver
/// writes a kind this way too in an invalid object's message).
pub fn qualified_resource(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

/// 409 Conflict for a named object, as kube words an optimistic-concurrency failure:
/// `Operation cannot be fulfilled on <resource>.<group> "<name>": <why>`.
pub fn conflict(resource: &str, group: &str, name: &str, why: &str) -> Value {
    status_with_details(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            qualified_resource(resource, group)
        ),
        Some(name),
        group,
        resource,
    )
}

/// 422 Invalid for a replacement (PUT) of a custom resource that names no
/// resourceVersion: kube never updates a custom resource unconditionally, and
/// words it as a failed validation of the field.
pub fn resource_version_required(resource: &str, group: &str, name: &str) -> Value {
    const WHY: &str = "Invalid value: 0x0: must be specified for an update";
    let mut invalid = status_with_details(
        422,
        "Invalid",
        format!(
            "{} \"{name}\" is invalid: metadata.resourceVersion: {WHY}",
            qualified_resource(resource, group)
        ),
        Some(name),
        group,
        resource,
    );
    invalid["details"]["causes"] = json!([{
        "reason": "FieldValueInvalid",
        "message": WHY,
        "field": "metadata.resourceVersion",
    }]);
    invalid
}

/// 404 NotFound for a named object: `<resource>.<group> "<name>" not found`, details
/// `{name, group, kind: <plural resource>}`.
pub fn not_found(resource: &str, group: &str, name: &str) -> Value {
    status_with_details(
        404,
        "NotFound",
        format!(
            "{} \"{name}\" not found",
            qualified_resource(resource, group)
        ),
        Some(name),
        group,
        resource,
    )
}

/// 404 for a namespace missing on the client: `namespaces "<ns>" not found`.
pub fn namespace_not_found(ns: &str) -> Value {
    not_found("namespaces", "", ns)
}

/// The generic degraded-path text: `target tenant cluster "<name>" for
/// <group>/<version> is unavailable`, optionally followed by `: <cause>`.
pub fn target_unavailable_message(
    target_name: &str,
    group: &str,
    version: &str,
    cause: Option<&str>,
) -> String {
    let mut m =
        format!("target tenant cluster \"{target_name}\" for {group}/{version} is unavailable");
    if let Some(cause) = cause {
        m.push_str(": ");
        m.push_str(cause);
    }
    m
}

/// 503 ServiceUnavailable for every "cannot reach the target" case (the caller adds
/// `Retry-After: 1`).
pub fn target_unavailable(
    target_name: &str,
    group: &str,
    version: &str,
    cause: Option<&str>,
) -> Value {
    status(
        503,
        "ServiceUnavailable",
        target_unavailable_message(target_name, group, version, cause),
    )
}

/// 401 for a request the target refused to authenticate: the proxy's target
/// identity (its kubeconfig) was rejected, not the caller, who came through the
/// client's aggregation layer. Worded so that the runbook's "auth failed" finds
/// it and the caller does not take it for its own login failing.
pub fn target_auth_failed(target_name: &str, group: &str, version: &str) -> Value {
    status(
        401,
        "Unauthorized",
        format!(
            "auth failed: target tenant cluster \"{target_name}\" for {group}/{version} rejected the proxy's credentials (its target kubeconfig)"
        ),
    )
}

/// 503 when the proxy's own 60 s non-watch deadline expired: the unavailable text with
/// Go's `context deadline exceeded` as cause, which is what operators search for.
pub fn deadline_exceeded(target_name: &str, group: &str, version: &str) -> Value {
    target_unavailable(
        target_name,
        group,
        version,
        Some("context deadline exceeded"),
    )
}

/// The text of the 501 answer to a connection upgrade.
pub const UPGRADE_NOT_SUPPORTED_MESSAGE: &str =
    "resource proxy does not support connection upgrades";

/// 501 for exec/attach/port-forward and any other upgrade. metav1 has no
/// "NotImplemented" reason; `MethodNotAllowed` is the closest documented one ("the
/// action the client attempted ... was not supported by the code"), and it keeps
/// client-go from presenting the refusal as a server fault (`InternalError`).
pub fn upgrade_not_supported() -> Value {
    status(501, "MethodNotAllowed", UPGRADE_NOT_SUPPORTED_MESSAGE)
}

/// 401 exactly as kube-apiserver sends it for a bad credential (no details).
pub fn unauthorized() -> Value {
    status(401, "Unauthorized", "Unauthorized")
}

/// 400 BadRequest with a message used verbatim (e.g. a selector error).
pub fn bad_request(message: impl Into<String>) -> Value {
    status(400, "BadRequest", message)
}

/// 403 Forbidden in kube's resource form: `<resource>.<group> ["<name>" ]is forbidden:
/// <why>`, details `{name?, group?, kind: <plural resource>}`.
pub fn forbidden(resource: &str, group: &str, name: Option<&str>, why: &str) -> Value {
    let subject = match name.filter(|n| !n.is_empty()) {
        Some(n) => format!("{} \"{n}\"", qualified_resource(resource, group)),
        None => qualified_resource(resource, group),
    };
    status_with_details(
        403,
        "Forbidden",
        format!("{subject} is forbidden: {why}"),
        name,
        group,
        resource,
    )
}

/// 403 for a create into a namespace being deleted, as kube's namespace lifecycle
/// admission words it, with its `NamespaceTerminating` cause on `metadata.namespace`.
pub fn namespace_terminating(resource: &str, group: &str, name: &str, namespace: &str) -> Value {
    let why = format!(
        "unable to create new content in namespace {namespace} because it is being terminated"
    );
    let mut v = forbidden(resource, group, Some(name), &why);
    v["details"]["causes"] = json!([{
        "reason": "NamespaceTerminating",
        "message": format!("namespace {namespace} is being terminated"),
        "field": "metadata.namespace",
    }]);
    v
}

/// 406 for a request whose Accept names no media type the server has, in kube's
/// words.
pub fn not_acceptable() -> Value {
    status(
        406,
        "NotAcceptable",
        "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf",
    )
}

/// 504 Timeout with a message.
pub fn timeout(message: impl Into<String>) -> Value {
    status(504, "Timeout", message)
}

/// 405 MethodNotAllowed with a message.
pub fn method_not_allowed(message: impl Into<String>) -> Value {
    status(405, "MethodNotAllowed", message)
}

/// 500 InternalError with a message.
pub fn internal_error(message: impl Into<String>) -> Value {
    status(500, "InternalError", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference_body(file: &str) -> Value {
        let path = format!(
            "{}/../../../shared/reference/kube-apiserver-1.32/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let v: Value = serde_json::from_str(&text).expect("reference file is JSON");
                v["response"]["body"].clone()
            }
            Err(_) => Value::Null,
        }
    }

    fn check(got: Value, expected: Value) {
        assert_eq!(got, expected);
    }

    #[test]
    fn builders() {
        let rows: Vec<(Value, Value)> = vec![
            (
                not_found("crontabs", "stable.example.io", "does-not-exist"),
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                       "message":"crontabs.stable.example.io \"does-not-exist\" not found",
                       "reason":"NotFound",
                       "details":{"name":"does-not-exist","group":"stable.example.io","kind":"crontabs"},
                       "code":404}),
            ),
            (
                namespace_not_found("no-such-namespace"),
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                       "message":"namespaces \"no-such-namespace\" not found","reason":"NotFound",
                       "details":{"name":"no-such-namespace","kind":"namespaces"},"code":404}),
            ),
            (
                unauthorized(),
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                       "message":"Unauthorized","reason":"Unauthorized","code":401}),
            ),
            (
                target_unavailable("target", "example.com", "v1", None),
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                       "message":"target tenant cluster \"target\" for example.com/v1 is unavailable",
                       "reason":"ServiceUnavailable","code":503}),
            ),
            (
                target_unavailable("t", "example.com", "v1", Some("dial tcp: refused")),
                status(503, "ServiceUnavailable",
                       "target tenant cluster \"t\" for example.com/v1 is unavailable: dial tcp: refused"),
            ),
            (
                deadline_exceeded("t", "g.io", "v2"),
                status(503, "ServiceUnavailable",
                       "target tenant cluster \"t\" for g.io/v2 is unavailable: context deadline exceeded"),
            ),
            (
                upgrade_not_supported(),
                status(501, "MethodNotAllowed", "resource proxy does not support connection upgrades"),
            ),
            (
                bad_request("name must be provided"),
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                       "message":"name must be provided","reason":"BadRequest","code":400}),
            ),
            (
                forbidden("crontabs", "stable.example.io", Some("my-crontab"),
                    "User \"alice\" cannot get resource \"crontabs\" in API group \"stable.example.io\" in the namespace \"ref-crud\""),
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                       "message":"crontabs.stable.example.io \"my-crontab\" is forbidden: User \"alice\" cannot get resource \"crontabs\" in API group \"stable.example.io\" in the namespace \"ref-crud\"",
                       "reason":"Forbidden",
                       "details":{"name":"my-crontab","group":"stable.example.io","kind":"crontabs"},"code":403}),
            ),
            (
                forbidden("pods", "", None, "x"),
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                       "message":"pods is forbidden: x","reason":"Forbidden",
                       "details":{"kind":"pods"},"code":403}),
            ),
            (
                // A generateName create: kube's admission names it by the prefix.
                namespace_terminating("widgets", "example.com", "prefix-", "gone"),
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                       "message":"widgets.example.com \"prefix-\" is forbidden: unable to create new content in namespace gone because it is being terminated",
                       "reason":"Forbidden",
                       "details":{"name":"prefix-","group":"example.com","kind":"widgets","causes":[{
                           "reason":"NamespaceTerminating","message":"namespace gone is being terminated",
                           "field":"metadata.namespace"}]},
                       "code":403}),
            ),
            (timeout("slow"), status(504, "Timeout", "slow")),
        ];
        for (got, expected) in rows {
            check(got, expected);
        }
    }

    /// Where the recorded transcripts are available, the builders equal them exactly.
    #[test]
    fn match_recorded_bodies() {
        let rows: Vec<(&str, Value)> = vec![
            ("083-auth-bad-token.json", unauthorized()),
            (
                "052-crontab-get-missing-404.json",
                not_found("crontabs", "stable.example.io", "does-not-exist"),
            ),
            (
                "132-namespace-create-missing-ns-404.json",
                namespace_not_found("no-such-namespace"),
            ),
            (
                "130-namespace-create-in-terminating-403.json",
                namespace_terminating("crontabs", "stable.example.io", "too-late", "ref-nsdel"),
            ),
            ("117-error-not-acceptable-406.json", not_acceptable()),
            (
                "104-error-put-collection.json",
                bad_request("name must be provided"),
            ),
            (
                "107-error-invalid-fieldselector-400.json",
                bad_request(
                    crate::selector::FieldSelector::parse("metadata.name")
                        .expect_err("invalid")
                        .to_string(),
                ),
            ),
            (
                "105-error-invalid-labelselector-400.json",
                bad_request(
                    crate::selector::LabelSelector::parse("app in (cron")
                        .expect_err("invalid")
                        .to_string(),
                ),
            ),
            (
                "106-error-invalid-labelselector-value-400.json",
                bad_request(
                    crate::selector::LabelSelector::parse("app=bad value!")
                        .expect_err("invalid")
                        .to_string(),
                ),
            ),
        ];
        let total = rows.len();
        let mut compared = 0;
        for (file, built) in rows {
            let recorded = reference_body(file);
            if recorded.is_null() {
                continue;
            }
            assert_eq!(built, recorded, "{file}");
            compared += 1;
        }
        // Either the transcripts are absent (a checkout without ../shared) or every
        // row was compared; a renamed file must not silently skip a row.
        assert!(
            compared == 0 || compared == total,
            "compared {compared} of {total}"
        );
    }
}
