//! Rendering stored objects for a client: version conversion (apiVersion rewrite),
//! lists, PartialObjectMetadata and Table.

use crate::registry::ResourceInfo;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The object as the requested version (conversion strategy None: only apiVersion
/// changes).
pub fn convert(obj: &Value, api_version: &str) -> Value {
    let mut out = obj.clone();
    if let Some(m) = out.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(api_version.to_string()));
    }
    out
}

/// `PartialObjectMetadata` of an object.
pub fn partial(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// [`partial`] written as JSON onto the end of `out`, without building it: a
/// metadata watch writes one for every change, and copying the metadata (its
/// managedFields above all) into a new tree cost more than writing it.
pub fn write_partial(obj: &Value, out: &mut Vec<u8>) {
    out.extend_from_slice(
        br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":"#,
    );
    match obj.get("metadata") {
        Some(metadata) => crate::watch::write_value(out, metadata),
        None => out.extend_from_slice(b"{}"),
    }
    out.push(b'}');
}

/// List metadata: `continue` always present (empty at the end), as kube sends it.
pub fn list_metadata(rv: u64, cont: &str, remaining: Option<usize>) -> Value {
    let mut m = Map::new();
    m.insert("continue".into(), json!(cont));
    if let Some(r) = remaining {
        m.insert("remainingItemCount".into(), json!(r));
    }
    m.insert("resourceVersion".into(), json!(rv.to_string()));
    Value::Object(m)
}

/// A list body serialized piece by piece, without building one big value.
pub fn list_bytes(
    api_version: &str,
    list_kind: &str,
    items: &[Arc<Value>],
    metadata: &Value,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + items.len() * 512);
    out.extend_from_slice(b"{\"apiVersion\":");
    out.extend_from_slice(json!(api_version).to_string().as_bytes());
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let same_version = item.get("apiVersion").and_then(Value::as_str) == Some(api_version);
        let written = if same_version {
            serde_json::to_writer(&mut out, item.as_ref())
        } else {
            serde_json::to_writer(&mut out, &convert(item, api_version))
        };
        if written.is_err() {
            out.extend_from_slice(b"null");
        }
    }
    out.extend_from_slice(b"],\"kind\":");
    out.extend_from_slice(json!(list_kind).to_string().as_bytes());
    out.extend_from_slice(b",\"metadata\":");
    out.extend_from_slice(metadata.to_string().as_bytes());
    out.push(b'}');
    out
}

pub fn list_value(
    api_version: &str,
    list_kind: &str,
    items: &[Arc<Value>],
    metadata: Value,
) -> Value {
    json!({
        "apiVersion": api_version,
        "items": items.iter().map(|i| convert(i, api_version)).collect::<Vec<_>>(),
        "kind": list_kind,
        "metadata": metadata,
    })
}

pub fn partial_list(items: &[Arc<Value>], metadata: Value) -> Value {
    json!({
        "kind": "PartialObjectMetadataList",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "items": items.iter().map(|i| partial(i)).collect::<Vec<_>>(),
    })
}

/// A `Table` of one `/scale` subresource's Scale.
pub fn scale_table(
    info: &ResourceInfo,
    scale: &Value,
    include: crate::table::IncludeObject,
) -> Value {
    let columns = crate::table::scale_columns(if info.is_crd() {
        crate::table::ScaleOf::CustomResource
    } else {
        crate::table::ScaleOf::BuiltIn
    });
    let rv = scale
        .get("metadata")
        .and_then(|m| m.get("resourceVersion"))
        .cloned()
        .unwrap_or_else(|| json!(""));
    // A custom resource's scale columns are JSONPaths on the Scale, so 0
    // replicas (left out) is an empty cell; kube's printer for a built-in's
    // Scale reads the Go field, 0.
    let mut scale = scale.clone();
    if !info.is_crd() && scale.pointer("/spec/replicas").is_none() {
        if let Some(spec) = scale.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("replicas".into(), json!(0));
        }
    }
    crate::table::render_table(
        &columns,
        std::slice::from_ref(&scale),
        include,
        json!({"resourceVersion": rv}),
        chrono::Utc::now(),
    )
}

/// A `Table` of objects with the resource's columns (the CRD version's printer
/// columns, or kube's built-in printer columns).
pub fn table(
    info: &ResourceInfo,
    version: &str,
    objs: &[Arc<Value>],
    metadata: Value,
    include: crate::table::IncludeObject,
) -> Value {
    let columns = if info.is_crd() {
        let printer = info
            .version(version)
            .map(|v| v.printer_columns.clone())
            .unwrap_or_default();
        crate::table::columns_for_crd_version(&json!({"additionalPrinterColumns": printer}))
    } else {
        crate::table::builtin_columns(&info.resource)
    };
    let objects: Vec<Value> = objs.iter().map(|o| (**o).clone()).collect();
    crate::table::render_table(&columns, &objects, include, metadata, chrono::Utc::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_bytes_is_valid_json_with_converted_items() {
        let items = vec![Arc::new(
            json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": "a"}}),
        )];
        let bytes = list_bytes("g/v1beta1", "KList", &items, &list_metadata(7, "", None));
        let v: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v["items"][0]["apiVersion"], "g/v1beta1");
        assert_eq!(v["metadata"]["resourceVersion"], "7");
        assert_eq!(v["kind"], "KList");
    }

    #[test]
    fn a_written_partial_is_the_built_one_in_kubes_key_order() {
        let object = json!({
            "apiVersion": "g/v1", "kind": "K", "spec": {"x": 1},
            "metadata": {"name": "a", "labels": {"app": "x"},
                         "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]},
        });
        for object in [object, json!({"apiVersion": "g/v1", "kind": "K"})] {
            let mut written = Vec::new();
            write_partial(&object, &mut written);
            let text = std::str::from_utf8(&written).expect("utf-8");
            assert!(
                text.starts_with(
                    r#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","#
                ),
                "{text}"
            );
            let parsed: Value = serde_json::from_str(text).expect("json");
            assert_eq!(parsed, partial(&object));
        }
    }
}
