//! What a target's 404 answer says is missing. The proxy asks two questions of
//! it: is it kube's answer for a missing namespace (then the namespace is mirrored
//! again and the request retried), and may it be about the object the request
//! names (then it is answered as a masked object is, so that no caller can tell
//! another tenant's object from none). The answer is the target's, so anything
//! may come: what cannot be read is never a missing namespace and may always be
//! about the object.

/// A 404 answer read as JSON: a `Status`'s `details` name the missing thing
/// (kube leaves them empty for a resource it does not serve).
#[derive(serde::Deserialize)]
struct NotFoundAnswer {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    details: MissingDetails,
}

#[derive(serde::Deserialize, Default)]
struct MissingDetails {
    #[serde(default)]
    name: String,
    /// The missing thing's resource, plural (`namespaces`, `widgets`).
    #[serde(default)]
    kind: String,
    #[serde(default)]
    group: String,
}

fn read(answer: &[u8]) -> Option<NotFoundAnswer> {
    // serde reads a struct from a JSON array as well, field by field in order;
    // a Status is an object, and `["Status", {...}]` is none.
    let object = answer.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    object
        .then(|| serde_json::from_slice(answer).ok())
        .flatten()
}

/// Whether a 404 is kube's answer for a missing namespace `namespace`
/// (`details: {name: <ns>, kind: namespaces}`), not for a missing object.
pub fn names_missing_namespace(answer: &[u8], namespace: &str) -> bool {
    read(answer).is_some_and(|answer| {
        let details = answer.details;
        details.kind == "namespaces" && details.name == namespace && details.group.is_empty()
    })
}

/// Whether a 404 may be about object `name` of `resource`: anything but a JSON
/// `Status` whose `details` name another object, or none.
pub fn may_be_about(answer: &[u8], resource: &str, name: &str) -> bool {
    read(answer).is_none_or(|answer| {
        answer.kind != "Status" || (answer.details.name == name && answer.details.kind == resource)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crproxy_core::status;
    use serde_json::Value;

    #[test]
    fn only_a_404_about_something_else_than_the_object_is_left_as_the_target_wrote_it() {
        let about = |answer: Value| may_be_about(answer.to_string().as_bytes(), "widgets", "w");
        let missing = status::not_found("widgets", "example.com", "w");
        assert!(about(missing.clone()));
        // Anything the proxy cannot read as a Status may be about the object.
        assert!(may_be_about(b"kind: Status\ncode: 404\n", "widgets", "w"));
        assert!(may_be_about(b"", "widgets", "w"));
        // Not an object, though serde could read a Status's fields from it.
        let array = serde_json::json!(["Status", {"name": "v", "kind": "widgets"}]);
        assert!(about(array));
        assert!(about(
            serde_json::json!({"kind": "Widget", "metadata": {"name": "w"}})
        ));
        // Another object, a namespace, or a resource the target does not serve.
        assert!(!about(status::not_found("widgets", "example.com", "v")));
        assert!(!about(status::not_found("gadgets", "example.com", "w")));
        assert!(!about(status::namespace_not_found("w")));
        let unserved = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "the server could not find the requested resource",
            "reason": "NotFound", "details": {}, "code": 404});
        assert!(!about(unserved));
    }

    #[test]
    fn only_a_404_for_the_namespace_itself_says_the_namespace_is_missing() {
        let says = |answer: Value| names_missing_namespace(answer.to_string().as_bytes(), "demo");
        assert!(says(status::namespace_not_found("demo")));
        assert!(!says(status::namespace_not_found("other")));
        // An object of a resource that happens to be called namespaces, elsewhere.
        let mut grouped = status::namespace_not_found("demo");
        grouped["details"]["group"] = "example.com".into();
        assert!(!says(grouped));
        assert!(!says(status::not_found("widgets", "example.com", "demo")));
        assert!(!names_missing_namespace(b"404 page not found", "demo"));
        let array = serde_json::json!(["Status", {"name": "demo", "kind": "namespaces"}]);
        assert!(!says(array));
    }
}
