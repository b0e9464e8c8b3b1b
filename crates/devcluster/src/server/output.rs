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

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";

/// A `Table` of objects: Name, the CRD's printer columns (or Age), with each row's
/// object as PartialObjectMetadata.
pub fn table(info: &ResourceInfo, version: &str, objs: &[Arc<Value>], rv: Option<u64>) -> Value {
    let printer = info
        .version(version)
        .map(|v| v.printer_columns.clone())
        .unwrap_or_default();
    let mut columns = vec![json!({
        "name": "Name", "type": "string", "format": "name",
        "description": NAME_DESCRIPTION, "priority": 0,
    })];
    let custom: Vec<(String, String)> = if printer.is_empty() {
        columns.push(json!({
            "name": "Age", "type": "date", "format": "",
            "description": "CreationTimestamp is a timestamp representing the server time when this object was created.",
            "priority": 0,
        }));
        vec![(".metadata.creationTimestamp".into(), "date".into())]
    } else {
        printer
            .iter()
            .map(|c| {
                let path = c.get("jsonPath").and_then(Value::as_str).unwrap_or("");
                let ty = c.get("type").and_then(Value::as_str).unwrap_or("string");
                columns.push(json!({
                    "name": c.get("name").cloned().unwrap_or(json!("")),
                    "type": ty,
                    "format": c.get("format").cloned().unwrap_or(json!("")),
                    "description": c.get("description").cloned().unwrap_or_else(|| json!(format!("Custom resource definition column (in JSONPath format): {path}"))),
                    "priority": c.get("priority").cloned().unwrap_or(json!(0)),
                }));
                (path.to_string(), ty.to_string())
            })
            .collect()
    };
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let mut cells = vec![json!(crate::store::meta_str(o, "name"))];
            for (path, ty) in &custom {
                let v = simple_path(o, path);
                cells.push(match (ty.as_str(), v) {
                    ("date", Some(Value::String(ts))) => json!(age(ts)),
                    (_, Some(v)) => v.clone(),
                    (_, None) => Value::Null,
                });
            }
            json!({"cells": cells, "object": partial(o)})
        })
        .collect();
    let mut meta = Map::new();
    if let Some(rv) = rv {
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// Evaluates the `.a.b.c` subset of JSONPath.
fn simple_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut cur = obj;
    for seg in path.trim_start_matches('.').split('.') {
        if seg.is_empty() {
            continue;
        }
        cur = cur.get(seg)?;
    }
    Some(cur)
}

/// kube's short human duration (`5s`, `3m2s`, `4h`, `2d`).
pub fn age(ts: &str) -> String {
    let Ok(t) = chrono::DateTime::parse_from_rfc3339(ts) else {
        return "<unknown>".into();
    };
    let secs = (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
        .num_seconds()
        .max(0);
    human_duration(secs)
}

pub fn human_duration(secs: i64) -> String {
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        let s = secs % 60;
        if s == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{s}s")
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        let mm = m % 60;
        if mm == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{mm}m")
        }
    } else if h < 48 {
        format!("{h}h")
    } else if d < 8 {
        let hh = h % 24;
        if hh == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{hh}h")
        }
    } else {
        format!("{d}d")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_like_kubectl() {
        let check = |s: i64, e: &str| assert_eq!(human_duration(s), e, "{s}");
        check(5, "5s");
        check(119, "119s");
        check(125, "2m5s");
        check(600, "10m");
        check(3 * 3600 + 120, "3h2m");
        check(10 * 3600, "10h");
        check(3 * 86400 + 3600, "3d1h");
        check(30 * 86400, "30d");
    }

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
}
