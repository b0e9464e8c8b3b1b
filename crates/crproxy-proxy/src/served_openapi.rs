//! The target's OpenAPI v3 document of a group/version, cut down to the resources
//! the proxy serves when the configuration names them (explicit keys).
//!
//! The document describes types, not objects, but on a shared target the schemas
//! of resources a client is not given are still not the client's to read. What
//! goes: the paths of those resources; every schema only they lead to (following
//! `$ref`s through schemas, so a `GadgetSpec` goes with `Gadget`); and any other
//! schema tagged with this group/version (`x-kubernetes-group-version-kind`) that
//! the remaining paths do not lead to. What the remaining paths lead to stays,
//! shared schemas (`ObjectMeta`, `DeleteOptions`) included, as does anything
//! untagged that no path leads to.

use std::collections::HashSet;

use serde_json::Value;

use crproxy_core::config::ResourceSet;

/// `document` with only what `resources` serves of `group/version`. A wildcard
/// keeps the document as it is.
pub fn served_document(
    mut document: Value,
    group: &str,
    version: &str,
    resources: &ResourceSet,
) -> Value {
    if !resources.is_explicit() {
        return document;
    }
    let prefix = format!("/apis/{group}/{version}/");
    let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) else {
        return document;
    };
    let (kept, dropped): (Vec<_>, Vec<_>) =
        std::mem::take(paths).into_iter().partition(|(path, _)| {
            path_resource(path, &prefix).is_none_or(|resource| resources.serves(resource))
        });
    paths.extend(kept);
    let dropped = Value::Object(dropped.into_iter().collect());
    let schemas = document
        .pointer("/components/schemas")
        .unwrap_or(&Value::Null);
    let kept_reach = reachable(&document["paths"], schemas);
    let dropped_reach = reachable(&dropped, schemas);
    if let Some(schemas) = document
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        schemas.retain(|name, schema| {
            kept_reach.contains(name)
                || !(dropped_reach.contains(name) || tagged_with(schema, group, version))
        });
    }
    document
}

/// The resource a path of the group/version addresses (`gadgets` in
/// `/apis/example.com/v1/namespaces/{namespace}/gadgets/{name}/status`); `None`
/// for the group/version's own path or a path outside it.
fn path_resource<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = path.strip_prefix(prefix)?;
    let rest = rest.strip_prefix("watch/").unwrap_or(rest);
    let rest = rest.strip_prefix("namespaces/{namespace}/").unwrap_or(rest);
    rest.split('/')
        .next()
        .filter(|resource| !resource.is_empty())
}

/// The names of the schemas `from` leads to through `$ref`s, directly or through
/// other schemas of `schemas`.
fn reachable(from: &Value, schemas: &Value) -> HashSet<String> {
    let mut found = HashSet::new();
    let mut pending = Vec::new();
    collect_schema_refs(from, &mut pending);
    while let Some(name) = pending.pop() {
        if found.insert(name.to_owned()) {
            collect_schema_refs(&schemas[name], &mut pending);
        }
    }
    found
}

/// Every schema name `value` refers to as `#/components/schemas/<name>`.
fn collect_schema_refs<'a>(value: &'a Value, names: &mut Vec<&'a str>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                match (key.as_str(), child) {
                    ("$ref", Value::String(target)) => {
                        if let Some(name) = target.strip_prefix("#/components/schemas/") {
                            names.push(name);
                        }
                    }
                    _ => collect_schema_refs(child, names),
                }
            }
        }
        Value::Array(items) => items
            .iter()
            .for_each(|item| collect_schema_refs(item, names)),
        _ => {}
    }
}

/// Whether a schema names a kind of `group/version` among its
/// `x-kubernetes-group-version-kind` entries.
fn tagged_with(schema: &Value, group: &str, version: &str) -> bool {
    schema["x-kubernetes-group-version-kind"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|gvk| gvk["group"] == group && gvk["version"] == version)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn gvk(kind: &str) -> Value {
        json!([{"group": "example.com", "version": "v1", "kind": kind}])
    }

    fn document() -> Value {
        let schema = |name: &str| json!({"$ref": format!("#/components/schemas/{name}")});
        json!({
            "openapi": "3.0.0",
            "paths": {
                "/apis/example.com/v1/": {"get": {}},
                "/apis/example.com/v1/gadgets": {"get": {"responses": {"200": {"content": {"application/json": {"schema": schema("com.example.v1.GadgetList")}}}}}},
                "/apis/example.com/v1/namespaces/{namespace}/gadgets/{name}/status": {"get": {"responses": {"200": {"content": {"application/json": {"schema": schema("com.example.v1.Gadget")}}}}}},
                "/apis/example.com/v1/watch/namespaces/{namespace}/gadgets": {"get": {}},
                "/apis/example.com/v1/namespaces/{namespace}/widgets/{name}": {
                    "get": {"responses": {"200": {"content": {"application/json": {"schema": schema("com.example.v1.Widget")}}}}},
                    "delete": {"requestBody": {"content": {"application/json": {"schema": schema("io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions")}}}}
                },
                "/apis/example.com/v1/widgetsx": {"get": {}},
                "/apis/example.com/v1/widgets": {"get": {"responses": {"200": {"content": {"application/json": {"schema": schema("com.example.v1.WidgetList")}}}}}}
            },
            "components": {"schemas": {
                "com.example.v1.Gadget": {"x-kubernetes-group-version-kind": gvk("Gadget"), "properties": {"spec": schema("com.example.v1.GadgetSpec")}},
                "com.example.v1.GadgetSpec": {"type": "object"},
                "com.example.v1.GadgetList": {"x-kubernetes-group-version-kind": gvk("GadgetList")},
                "com.example.v1.Widget": {"x-kubernetes-group-version-kind": gvk("Widget"), "properties": {"metadata": schema("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")}},
                "com.example.v1.WidgetList": {"x-kubernetes-group-version-kind": gvk("WidgetList"), "properties": {"items": {"items": schema("com.example.v1.WidgetStatus")}}},
                "com.example.v1.WidgetStatus": {"x-kubernetes-group-version-kind": gvk("WidgetStatus")},
                "io.k8s.example.Unused": {"type": "object"},
                "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions": {"x-kubernetes-group-version-kind": gvk("DeleteOptions")},
                "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object"}
            }}
        })
    }

    fn keys(value: &Value) -> Vec<&str> {
        let mut keys: Vec<&str> = value
            .as_object()
            .map(|map| map.keys().map(String::as_str).collect())
            .unwrap_or_default();
        keys.sort_unstable();
        keys
    }

    #[test]
    fn only_the_served_resources_paths_and_their_schemas_remain() {
        let explicit = ResourceSet::Explicit(vec!["widgets".into()]);
        let served = served_document(document(), "example.com", "v1", &explicit);
        assert_eq!(
            keys(&served["paths"]),
            [
                "/apis/example.com/v1/",
                "/apis/example.com/v1/namespaces/{namespace}/widgets/{name}",
                "/apis/example.com/v1/widgets"
            ]
        );
        // WidgetStatus and ObjectMeta are reached only through other schemas;
        // DeleteOptions is tagged with every group/version but a kept path uses
        // it; an untagged schema no path leads to stays. GadgetSpec, untagged,
        // goes with the gadgets' paths, the only ones that lead to it.
        assert_eq!(
            keys(&served["components"]["schemas"]),
            [
                "com.example.v1.Widget",
                "com.example.v1.WidgetList",
                "com.example.v1.WidgetStatus",
                "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
                "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
                "io.k8s.example.Unused"
            ]
        );
    }

    #[test]
    fn a_wildcard_keeps_the_whole_document() {
        let whole = served_document(document(), "example.com", "v1", &ResourceSet::Wildcard);
        assert_eq!(whole, document());
    }
}
