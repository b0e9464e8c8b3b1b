//! The target's OpenAPI v3 document of a group/version, cut down to the resources
//! the proxy serves when the configuration names them (explicit keys).
//!
//! The document describes types, not objects, but on a shared target the schemas
//! of resources a client is not given are still not the client's to read. What
//! goes: the paths of those resources, and the schemas tagged with this
//! group/version (`x-kubernetes-group-version-kind`) that no remaining path refers
//! to. Shared schemas (`ObjectMeta`, `Status`, ...) carry no such tag, or are
//! referred to by the remaining paths, and stay.

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
    if matches!(resources, ResourceSet::Wildcard) {
        return document;
    }
    let prefix = format!("/apis/{group}/{version}/");
    if let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) {
        paths.retain(|path, _| {
            path_resource(path, &prefix).is_none_or(|resource| resources.serves(resource))
        });
    }
    let mut referenced = HashSet::new();
    collect_schema_refs(&document["paths"], &mut referenced);
    let referenced: HashSet<String> = referenced.into_iter().map(str::to_owned).collect();
    if let Some(schemas) = document
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        schemas.retain(|name, schema| {
            referenced.contains(name) || !tagged_with(schema, group, version)
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

/// Every schema name `value` refers to as `#/components/schemas/<name>`.
fn collect_schema_refs<'a>(value: &'a Value, names: &mut HashSet<&'a str>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                match (key.as_str(), child) {
                    ("$ref", Value::String(target)) => {
                        if let Some(name) = target.strip_prefix("#/components/schemas/") {
                            names.insert(name);
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
                "/apis/example.com/v1/widgetsx": {"get": {}}
            },
            "components": {"schemas": {
                "com.example.v1.Gadget": {"x-kubernetes-group-version-kind": gvk("Gadget")},
                "com.example.v1.GadgetList": {"x-kubernetes-group-version-kind": gvk("GadgetList")},
                "com.example.v1.Widget": {"x-kubernetes-group-version-kind": gvk("Widget"), "properties": {"metadata": schema("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")}},
                "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions": {"x-kubernetes-group-version-kind": gvk("DeleteOptions")},
                "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object"}
            }}
        })
    }

    fn keys(value: &Value) -> Vec<&str> {
        value
            .as_object()
            .map(|map| map.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    #[test]
    fn only_the_served_resources_paths_and_their_schemas_remain() {
        let explicit = ResourceSet::Explicit(vec!["widgets".into()]);
        let served = served_document(document(), "example.com", "v1", &explicit);
        assert_eq!(
            keys(&served["paths"]),
            [
                "/apis/example.com/v1/",
                "/apis/example.com/v1/namespaces/{namespace}/widgets/{name}"
            ]
        );
        // DeleteOptions is tagged with every group/version but a kept path uses
        // it; ObjectMeta is untagged.
        assert_eq!(
            keys(&served["components"]["schemas"]),
            [
                "com.example.v1.Widget",
                "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
                "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
            ]
        );
    }

    #[test]
    fn a_wildcard_keeps_the_whole_document() {
        let whole = served_document(document(), "example.com", "v1", &ResourceSet::Wildcard);
        assert_eq!(whole, document());
    }
}
