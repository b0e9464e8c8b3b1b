//! The target's documents cut down to the resources explicit configuration keys
//! serve (discovery in both forms, the OpenAPI v3 document): never a panic; under
//! a wildcard every document is left as it is; under explicit keys the discovery
//! entries are exactly the served resources' and the OpenAPI paths exactly those
//! outside the group/version or of a served resource, every schema the kept
//! paths lead to is still there, and a second cut changes nothing.

use std::collections::HashSet;

use crproxy_core::config::ResourceSet;
use crproxy_proxy::fallback::{aggregated_answer, served_resource_list, AggregatedAnswer};
use crproxy_proxy::served_openapi::served_document;
use serde_json::Value;

const GROUP: &str = "example.com";
const VERSION: &str = "v1";
const SERVED: &str = "widgets";

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    let explicit = ResourceSet::Explicit(vec![SERVED.to_owned()]);
    let Ok(document) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if let AggregatedAnswer::Entry(entry) = aggregated_answer(200, data, GROUP, VERSION, &explicit)
    {
        check_aggregated_entry(&document, &entry);
    }
    let whole = served_document(document.clone(), GROUP, VERSION, &ResourceSet::Wildcard);
    assert_eq!(whole, document, "a wildcard keeps the OpenAPI document");
    let cut = served_document(document.clone(), GROUP, VERSION, &explicit);
    check_openapi(&document, &cut);
    let again = served_document(cut.clone(), GROUP, VERSION, &explicit);
    assert_eq!(again, cut, "a second cut changes nothing");

    let list = served_resource_list(document.clone(), &ResourceSet::Wildcard);
    assert_eq!(list, document, "a wildcard keeps the resource list");
    let list = served_resource_list(document.clone(), &explicit);
    let served_entries = |list: &Value| -> Vec<Value> {
        let listed = list["resources"].as_array().into_iter().flatten();
        listed
            .filter(|entry| entry["name"].as_str().map(resource_of) == Some(SERVED))
            .cloned()
            .collect()
    };
    if let Some(kept) = list["resources"].as_array() {
        assert_eq!(
            kept,
            &served_entries(&document),
            "exactly the served entries"
        );
    }
}

/// `widgets` of `widgets/status`.
fn resource_of(name: &str) -> &str {
    name.split_once('/').map_or(name, |(resource, _)| resource)
}

/// One group, its versions all this version, and of their resources exactly the
/// served ones the target listed.
fn check_aggregated_entry(original: &Value, entry: &Value) {
    let items = entry["items"].as_array().expect("an entry has items");
    assert_eq!(items.len(), 1, "{entry}");
    assert_eq!(items[0]["metadata"]["name"], GROUP, "{entry}");
    let versions = items[0]["versions"].as_array().expect("versions");
    assert!(!versions.is_empty(), "{entry}");
    for version in versions {
        assert_eq!(version["version"], VERSION, "{entry}");
        for resource in version["resources"].as_array().into_iter().flatten() {
            assert_eq!(resource["resource"], SERVED, "{entry}");
        }
    }
    let listed = |document: &Value| -> usize {
        let groups = document["items"].as_array().into_iter().flatten();
        let group = groups
            .filter(|g| g["metadata"]["name"] == GROUP)
            .take(1)
            .flat_map(|g| g["versions"].as_array().into_iter().flatten());
        group
            .filter(|v| v["version"] == VERSION)
            .flat_map(|v| v["resources"].as_array().into_iter().flatten())
            .filter(|r| r["resource"] == SERVED)
            .count()
    };
    assert_eq!(
        listed(entry),
        listed(original),
        "every served resource kept"
    );
}

/// Paths outside the group/version and the served resource's stay; others of the
/// group/version go; every schema the kept paths lead to (through schemas of the
/// original document) is still there.
fn check_openapi(original: &Value, cut: &Value) {
    let (Some(before), Some(after)) = (
        original.get("paths").and_then(Value::as_object),
        cut.get("paths").and_then(Value::as_object),
    ) else {
        return;
    };
    let prefix = format!("/apis/{GROUP}/{VERSION}/");
    for path in before.keys() {
        let resource = path.strip_prefix(&prefix).map(|rest| {
            let rest = rest.strip_prefix("watch/").unwrap_or(rest);
            let rest = rest.strip_prefix("namespaces/{namespace}/").unwrap_or(rest);
            rest.split('/').next().unwrap_or("")
        });
        let kept = match resource {
            None | Some("") => true,
            Some(resource) => resource == SERVED,
        };
        assert_eq!(after.contains_key(path), kept, "{path}");
    }
    let original_schemas = &original["components"]["schemas"];
    let cut_schemas = &cut["components"]["schemas"];
    // Walks from the kept paths through the cut document's schemas: a name the
    // original defined must still be defined.
    let mut seen = HashSet::new();
    let mut pending = vec![&cut["paths"]];
    while let Some(value) = pending.pop() {
        for name in schema_refs(value) {
            if original_schemas.get(name).is_none() || !seen.insert(name.to_owned()) {
                continue;
            }
            let schema = cut_schemas
                .get(name)
                .unwrap_or_else(|| panic!("{name} is reachable from a kept path but was dropped"));
            pending.push(schema);
        }
    }
}

/// The schema names `value` refers to as `#/components/schemas/<name>`, at any depth.
fn schema_refs(value: &Value) -> Vec<&str> {
    let mut names = Vec::new();
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    match (key.as_str(), child.as_str()) {
                        ("$ref", Some(target)) => {
                            names.extend(target.strip_prefix("#/components/schemas/"))
                        }
                        _ => pending.push(child),
                    }
                }
            }
            Value::Array(items) => pending.extend(items),
            _ => {}
        }
    }
    names
}
