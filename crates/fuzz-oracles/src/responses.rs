//! How a named GET answer is judged and how its Accept header is rewritten: never a
//! panic; an answer judged owned names this owner in its labels (or, for a Table,
//! in every row); the rewritten Accept only ever asks for JSON.

use crproxy_core::ownership::{self, Owner, Visibility};
use crproxy_core::precondition::Pin;

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    let owner = Owner::new("client", "project");
    // The scan skips what it does not read as serde_json skips an ignored value,
    // so a number beyond f64's range or a lone surrogate escape there passes,
    // while a parsed `Value` refuses it: such answers have no reference here.
    let parsed = serde_json::from_slice::<serde_json::Value>(data);
    if ownership::response_visibility(&owner, data) == Visibility::Owned {
        let Ok(answer) = parsed else {
            assert!(
                serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok(),
                "owned means JSON"
            );
            return;
        };
        let is_table = answer["kind"] == "Table"
            && answer["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("meta.k8s.io/"));
        let rows = answer.get("rows").and_then(serde_json::Value::as_array);
        match rows {
            Some(rows) if is_table => {
                assert!(rows.iter().all(|r| owner.owns(&r["object"])));
            }
            _ => assert!(owner.owns(&answer)),
        }
        let _ = Pin::of(&answer);
    }
    if let Ok(accept) = std::str::from_utf8(data) {
        let rewritten = ownership::inspectable_accept(Some(accept));
        for range in rewritten.split(',') {
            let essence = range.split(';').next().unwrap_or("").trim();
            assert!(
                essence.eq_ignore_ascii_case("application/json"),
                "{rewritten}"
            );
        }
    }
}
