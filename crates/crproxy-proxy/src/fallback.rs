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

/// The aggregated-discovery media type parameters a request asks for, if any:
/// `Some("v2")` or `Some("v2beta1")` for an `APIGroupDiscoveryList` request.
pub fn aggregated_discovery_version(accept: Option<&str>) -> Option<&'static str> {
    let accept = accept?;
    accept.split(',').find_map(|range| {
        let params: Vec<&str> = range.split(';').map(str::trim).collect();
        let has = |p: &str| params.iter().any(|x| x.eq_ignore_ascii_case(p));
        if !has("as=APIGroupDiscoveryList") || !has("g=apidiscovery.k8s.io") {
            return None;
        }
        if has("v=v2") {
            Some("v2")
        } else if has("v=v2beta1") {
            Some("v2beta1")
        } else {
            None
        }
    })
}

/// The content type of an aggregated-discovery answer of `version`.
pub fn aggregated_discovery_content_type(version: &str) -> String {
    format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList")
}

/// What the target's answer to an aggregated discovery request (`GET /apis`) makes
/// of the aggregator's request.
#[derive(Debug, PartialEq)]
pub enum AggregatedAnswer {
    /// The target's entry for this group/version, alone in the list.
    Entry(Value),
    /// The target cannot say (401, 404, 5xx, or a success other than 200, which
    /// the proxy does not read) or does not serve this group/version (yet): the
    /// local document is served, as on the legacy path.
    Fallback,
    /// The target has no aggregated discovery (its 406, or a 200 in another form,
    /// from a server that ignores the media type): answered with 406, on which the
    /// aggregator reads `/apis/<group>/<version>` instead. Nothing has failed, so
    /// nothing counts as a fallback.
    NotAggregated,
    /// Any other answer (403, 429, ...) goes back as the target gave it, as on the
    /// legacy path.
    AsIs,
}

/// A target's `APIResourceList` for this group/version with only the resources
/// the proxy serves, and their subresources (`widgets/status`).
pub fn served_resource_list(mut document: Value, resources: &ResourceSet) -> Value {
    retain_served(&mut document, "name", resources);
    document
}

/// Keeps, of the `resources` list in `owner`, the entries whose `field` names a
/// served resource: `name` in a legacy list, where a subresource's entry is
/// `widgets/status`; `resource` in an aggregated one, which lists subresources
/// inside their resource. A wildcard keeps every entry.
fn retain_served(owner: &mut Value, field: &str, resources: &ResourceSet) {
    if !resources.is_explicit() {
        return;
    }
    if let Some(listed) = owner.get_mut("resources").and_then(Value::as_array_mut) {
        listed.retain(|entry| {
            entry[field].as_str().is_some_and(|name| {
                let resource = name.split_once('/').map_or(name, |(resource, _)| resource);
                resources.serves(resource)
            })
        });
    }
}

/// Reads the target's answer to an aggregated discovery request.
pub fn aggregated_answer(
    status: u16,
    body: &[u8],
    group: &str,
    version: &str,
    resources: &ResourceSet,
) -> AggregatedAnswer {
    match status {
        200 => {}
        401 | 404 | 201..=299 | 500..=599 => return AggregatedAnswer::Fallback,
        406 => return AggregatedAnswer::NotAggregated,
        _ => return AggregatedAnswer::AsIs,
    }
    let Ok(document) = serde_json::from_slice::<Value>(body) else {
        return AggregatedAnswer::NotAggregated;
    };
    if document["kind"] != "APIGroupDiscoveryList" {
        return AggregatedAnswer::NotAggregated;
    }
    match filter_aggregated(&document, group, version, resources) {
        Some(entry) => AggregatedAnswer::Entry(entry),
        None => AggregatedAnswer::Fallback,
    }
}

/// Keeps only this proxy's group and version of a target's aggregated discovery
/// document, and of them only the resources the proxy serves (subresources are
/// listed inside their resource). `None` when the target does not serve the
/// group/version.
pub fn filter_aggregated(
    document: &Value,
    group: &str,
    version: &str,
    resources: &ResourceSet,
) -> Option<Value> {
    let item = document["items"]
        .as_array()?
        .iter()
        .find(|g| g.pointer("/metadata/name").and_then(Value::as_str) == Some(group))?;
    let versions: Vec<Value> = item["versions"]
        .as_array()?
        .iter()
        .filter(|v| v["version"] == version)
        .cloned()
        .map(|mut v| {
            retain_served(&mut v, "resource", resources);
            v
        })
        .collect();
    if versions.is_empty() {
        return None;
    }
    let mut item = item.clone();
    item["versions"] = Value::Array(versions);
    let mut filtered = document.clone();
    filtered["items"] = Value::Array(vec![item]);
    Some(filtered)
}

/// The aggregated-discovery form of [`fallback_document`].
pub fn aggregated_fallback_document(
    group: &str,
    version: &str,
    discovery_version: &str,
    resources: &ResourceSet,
    last_good: Option<&Value>,
) -> Value {
    let legacy = fallback_document(group, version, resources, last_good);
    let listed: Vec<Value> = legacy["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            json!({
                "resource": r["name"],
                "responseKind": {"group": "", "version": "", "kind": r["kind"]},
                "scope": if r["namespaced"] == json!(false) { "Cluster" } else { "Namespaced" },
                "singularResource": r["singularName"],
                "verbs": r["verbs"],
            })
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{discovery_version}"),
        "metadata": {},
        "items": [{
            "metadata": {"name": group, "creationTimestamp": null},
            "versions": [{"version": version, "resources": listed, "freshness": "Current"}],
        }],
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
    fn aggregated_discovery_requests_are_recognised() {
        let aggregator = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
        assert_eq!(aggregated_discovery_version(Some(aggregator)), Some("v2"));
        assert_eq!(
            aggregated_discovery_version(Some(
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
            )),
            Some("v2beta1")
        );
        assert_eq!(aggregated_discovery_version(Some("application/json")), None);
        assert_eq!(aggregated_discovery_version(None), None);
    }

    #[test]
    fn only_this_group_version_survives_the_filter() {
        let document = json!({"kind": "APIGroupDiscoveryList", "items": [
            {"metadata": {"name": "apps"}, "versions": [{"version": "v1"}]},
            {"metadata": {"name": "example.com"}, "versions": [
                {"version": "v2", "resources": []},
                {"version": "v1", "resources": [{"resource": "widgets"}]}
            ]}
        ]});
        let filtered = filter_aggregated(&document, "example.com", "v1", &ResourceSet::Wildcard)
            .expect("served");
        assert_eq!(filtered["items"].as_array().map(Vec::len), Some(1));
        assert_eq!(
            filtered["items"][0]["versions"],
            json!([{"version": "v1", "resources": [{"resource": "widgets"}]}])
        );
        assert!(
            filter_aggregated(&document, "example.com", "v3", &ResourceSet::Wildcard).is_none()
        );
        assert!(filter_aggregated(&document, "other.io", "v1", &ResourceSet::Wildcard).is_none());
    }

    /// An explicit set shows its resources, with their subresources, and nothing
    /// else of the group/version; a wildcard shows everything the target lists.
    #[test]
    fn discovery_lists_only_the_served_resources() {
        let explicit = ResourceSet::Explicit(vec!["widgets".into()]);
        let legacy = json!({"kind": "APIResourceList", "groupVersion": "example.com/v1", "resources": [
            {"name": "gadgets"}, {"name": "gadgets/status"},
            {"name": "widgets"}, {"name": "widgets/scale"}, {"name": "widgets/status"},
            {"name": "widgetsx"}, {"verbs": ["get"]}
        ]});
        let names = |document: &Value| -> Vec<String> {
            document["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| r["name"].as_str().unwrap_or("<none>").to_owned())
                .collect()
        };
        assert_eq!(
            names(&served_resource_list(legacy.clone(), &explicit)),
            ["widgets", "widgets/scale", "widgets/status"]
        );
        assert_eq!(
            served_resource_list(legacy.clone(), &ResourceSet::Wildcard),
            legacy
        );

        let aggregated = json!({"kind": "APIGroupDiscoveryList", "items": [
            {"metadata": {"name": "example.com"}, "versions": [{"version": "v1", "resources": [
                {"resource": "gadgets", "subresources": [{"subresource": "status"}]},
                {"resource": "widgets", "subresources": [{"subresource": "status"}]},
                {"verbs": ["get"]}
            ]}]}
        ]});
        let filtered =
            filter_aggregated(&aggregated, "example.com", "v1", &explicit).expect("served");
        assert_eq!(
            filtered["items"][0]["versions"][0]["resources"],
            json!([{"resource": "widgets", "subresources": [{"subresource": "status"}]}])
        );
        let everything =
            filter_aggregated(&aggregated, "example.com", "v1", &ResourceSet::Wildcard)
                .expect("served");
        assert_eq!(everything, aggregated);
    }

    /// The aggregator reads `/apis/<group>/<version>` after a 406 or a 200 that is
    /// no aggregated list (kube-aggregator's discovery manager, and
    /// `reference/aggregation.md`): a target without aggregated discovery is
    /// served through that path, not counted as failing.
    #[test]
    fn the_targets_answer_to_aggregated_discovery_decides_what_the_aggregator_gets() {
        let aggregated = json!({"kind": "APIGroupDiscoveryList", "items": [
            {"metadata": {"name": "example.com"}, "versions": [{"version": "v1", "resources": []}]}
        ]})
        .to_string();
        let legacy = json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": "example.com", "versions": [{"groupVersion": "example.com/v1", "version": "v1"}]}
        ]})
        .to_string();
        let read = |status, body: &str| {
            aggregated_answer(
                status,
                body.as_bytes(),
                "example.com",
                "v1",
                &ResourceSet::Wildcard,
            )
        };
        assert!(
            matches!(read(200, &aggregated), AggregatedAnswer::Entry(doc)
            if doc["items"][0]["metadata"]["name"] == "example.com")
        );
        assert_eq!(
            aggregated_answer(
                200,
                aggregated.as_bytes(),
                "example.com",
                "v2",
                &ResourceSet::Wildcard
            ),
            AggregatedAnswer::Fallback,
            "a version the target does not serve"
        );
        assert_eq!(read(200, &legacy), AggregatedAnswer::NotAggregated);
        assert_eq!(read(200, "not json"), AggregatedAnswer::NotAggregated);
        assert_eq!(read(406, ""), AggregatedAnswer::NotAggregated);
        for code in [401, 404, 500, 503] {
            assert_eq!(read(code, ""), AggregatedAnswer::Fallback, "{code}");
        }
        // A success other than 200 is never passed on: it would list every group.
        for code in [203, 206] {
            assert_eq!(
                read(code, &aggregated),
                AggregatedAnswer::Fallback,
                "{code}"
            );
        }
        for code in [400, 403, 429] {
            assert_eq!(read(code, ""), AggregatedAnswer::AsIs, "{code}");
        }
    }

    #[test]
    fn aggregated_fallback_lists_get_only() {
        let doc = aggregated_fallback_document(
            "example.com",
            "v1",
            "v2",
            &ResourceSet::Explicit(vec!["widgets".into()]),
            None,
        );
        assert_eq!(doc["apiVersion"], "apidiscovery.k8s.io/v2");
        let resource = &doc["items"][0]["versions"][0]["resources"][0];
        assert_eq!(resource["resource"], "widgets");
        assert_eq!(resource["scope"], "Namespaced");
        assert_eq!(resource["verbs"], json!(["get"]));
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
