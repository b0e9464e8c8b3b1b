//! The discovery document served locally while the target cannot answer, so the
//! client's APIService stays Available and its API server keeps working.
//!
//! Explicitly configured resources are listed with the single verb `get`; a wildcard
//! entry cannot be enumerated without the target and yields an empty list. Where the
//! target answered discovery earlier, its kind and scope for a resource are reused,
//! because clients (kubectl, the garbage collector) use them to build requests.

use serde_json::{json, Value};

use crproxy_core::config::ResourceSet;

/// The `APIResourceList` for `group/version` during an outage.
pub fn fallback_document(
    group: &str,
    version: &str,
    resources: &ResourceSet,
    last_good: Option<&Value>,
) -> Value {
    let listed: Vec<Value> = match resources {
        ResourceSet::Wildcard => Vec::new(),
        ResourceSet::Explicit(names) => names
            .iter()
            .map(|name| fallback_resource(name, last_good))
            .collect(),
    };
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{group}/{version}"),
        "resources": listed,
    })
}

fn fallback_resource(name: &str, last_good: Option<&Value>) -> Value {
    let known = last_good
        .and_then(|doc| doc.get("resources"))
        .and_then(Value::as_array)
        .and_then(|list| {
            list.iter()
                .find(|r| r.get("name").and_then(Value::as_str) == Some(name))
        });
    let field = |key: &str| known.and_then(|r| r.get(key)).cloned();
    json!({
        "name": name,
        "singularName": field("singularName").unwrap_or_else(|| json!("")),
        "namespaced": field("namespaced").unwrap_or(json!(true)),
        "kind": field("kind").unwrap_or_else(|| json!("")),
        "verbs": ["get"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_resources_are_listed_with_get_only() {
        let doc = fallback_document(
            "example.com",
            "v1",
            &ResourceSet::Explicit(vec!["widgets".into()]),
            None,
        );
        assert_eq!(doc["groupVersion"], "example.com/v1");
        assert_eq!(doc["resources"][0]["name"], "widgets");
        assert_eq!(doc["resources"][0]["verbs"], json!(["get"]));
    }

    #[test]
    fn wildcard_yields_an_empty_list() {
        let doc = fallback_document("example.com", "v1", &ResourceSet::Wildcard, None);
        assert_eq!(doc["resources"], json!([]));
    }

    #[test]
    fn kind_and_scope_come_from_the_last_good_document() {
        let last = json!({"resources": [
            {"name": "widgets", "singularName": "widget", "namespaced": false, "kind": "Widget",
             "verbs": ["get", "list", "create"]}
        ]});
        let doc = fallback_document(
            "example.com",
            "v1",
            &ResourceSet::Explicit(vec!["widgets".into()]),
            Some(&last),
        );
        let widget = &doc["resources"][0];
        assert_eq!(widget["kind"], "Widget");
        assert_eq!(widget["namespaced"], false);
        assert_eq!(widget["verbs"], json!(["get"]));
    }
}
