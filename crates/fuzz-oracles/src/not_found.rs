//! What the proxy reads from a target's 404 (`crproxy_proxy::not_found`), against
//! a reading of the same bytes as a `serde_json::Value`. Whatever the answer,
//! reading it never panics, and the typed reader never errs on the unsafe side of
//! the `Value` reading: it passes the target's 404 on (`may_be_about` false) only
//! where a `Value` also shows a `Status` naming something else, and it calls a
//! namespace missing only where a `Value` also shows kube's Status for it. (The
//! typed reader refuses more, such as a `details.name` that is not a string: such
//! answers are masked, and no namespace is mirrored for them. It also accepts
//! more, in what it skips: see `check`.)

use crproxy_proxy::not_found::{may_be_about, names_missing_namespace};
use serde_json::Value;

/// The names the seeds use.
const NAMESPACE: &str = "demo";
const RESOURCE: &str = "widgets";
const NAME: &str = "w";

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    let about = may_be_about(data, RESOURCE, NAME);
    let namespace_missing = names_missing_namespace(data, NAMESPACE);
    let value = match serde_json::from_slice::<Value>(data) {
        Ok(value) => Some(value).filter(Value::is_object),
        // serde_json skips an ignored string without checking its UTF-8 or its
        // escapes, and an ignored number without its range, which a `Value`
        // refuses: such answers have no reference here.
        Err(_) if serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok() => return,
        Err(_) => None,
    };
    let status = value.as_ref().filter(|v| v["kind"] == "Status");
    if !about {
        let details = status.map(|s| &s["details"]);
        assert!(
            details.is_some_and(|d| d["name"] != NAME || d["kind"] != RESOURCE),
            "passed on a 404 that may be about the object: {:?}",
            String::from_utf8_lossy(data)
        );
    }
    if namespace_missing {
        let details = value.as_ref().map(|v| &v["details"]);
        assert!(
            details.is_some_and(|d| d["kind"] == "namespaces"
                && d["name"] == NAMESPACE
                && d.get("group").is_none_or(|g| g == "")),
            "a missing namespace read where there is none: {:?}",
            String::from_utf8_lossy(data)
        );
    }
}
