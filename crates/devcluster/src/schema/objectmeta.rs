//! What kube-apiserver's custom resource decoder makes of `metadata`.
//!
//! apiextensions-apiserver reads a custom resource's `metadata` by marshalling it
//! to JSON and unmarshalling that into a `metav1.ObjectMeta`
//! (`pkg/apiserver/schema/objectmeta/coerce.go`, `GetObjectMetaWithOptions`, called
//! from `unstructuredSchemaCoercer.apply` in `customresource_handler.go` with
//! `DropMalformedFields` off for request bodies). So a member of the wrong JSON
//! type fails the request with Go's `encoding/json` error, a null map value comes
//! out as `""`, and a null map goes away. Server-side apply never decodes the body
//! that way: its type check is structured-merge-diff's typed conversion
//! ([`apply_errors`]).
//!
//! devcluster checks the two maps clients write, `labels` and `annotations`
//! (`map[string]string`), and `metadata` itself; other ObjectMeta members of the
//! wrong type are not checked here.

use serde_json::Value;

use super::go_quote;

/// The `map[string]string` members of ObjectMeta, in the order Go's decoder meets
/// them: `metadata` is re-marshalled first, and Go writes map keys sorted.
const STRING_MAPS: [&str; 2] = ["annotations", "labels"];

/// Go's `encoding/json` error for the first member of `obj.metadata` that does not
/// decode into ObjectMeta (`json: cannot unmarshal string into Go struct field
/// ObjectMeta.labels of type map[string]string`), or `None` when it decodes.
///
/// Only the first error counts, as in Go (the decoder keeps the first type error
/// and goes on).
pub fn decode_error(obj: &Value) -> Option<String> {
    let meta = obj.get("metadata")?;
    let meta = match meta {
        Value::Null => return None,
        Value::Object(m) => m,
        other => {
            return Some(format!(
                "json: cannot unmarshal {} into Go value of type v1.ObjectMeta",
                json_kind(other)
            ))
        }
    };
    STRING_MAPS.iter().find_map(|field| {
        let unmarshal = |value: &Value, go_type: &str| {
            format!(
                "json: cannot unmarshal {} into Go struct field ObjectMeta.{field} of type {go_type}",
                json_kind(value)
            )
        };
        match meta.get(*field)? {
            Value::Null => None,
            Value::Object(map) => map
                .values()
                .find(|v| !matches!(v, Value::String(_) | Value::Null))
                .map(|v| unmarshal(v, "string")),
            other => Some(unmarshal(other, "map[string]string")),
        }
    })
}

/// What the decoder writes back for a `metadata` that decoded: a null label or
/// annotation value is `""`, and a null map is left out.
pub fn normalize(obj: &mut Value) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    for field in STRING_MAPS {
        match meta.get_mut(field) {
            Some(Value::Null) => {
                meta.remove(field);
            }
            Some(Value::Object(map)) => {
                for v in map.values_mut().filter(|v| v.is_null()) {
                    *v = Value::String(String::new());
                }
            }
            _ => {}
        }
    }
}

/// structured-merge-diff's errors for an applied configuration whose `metadata`,
/// `labels` or `annotations` is not a map, or whose label or annotation value is
/// not a string (`.metadata.labels: expected map, got &{x}`), as kube prints them
/// in the 500 "failed to create typed patch object" of server-side apply. Empty
/// when the metadata types check.
///
/// structured-merge-diff reports every such error; it visits map members in Go's
/// map order (random), devcluster in key order.
pub fn apply_errors(applied: &Value) -> Vec<String> {
    let meta = match applied.get("metadata") {
        None | Some(Value::Null) => return Vec::new(),
        Some(Value::Object(m)) => m,
        Some(other) => return vec![not_a_map(".metadata", other)],
    };
    let mut errors = Vec::new();
    for field in STRING_MAPS {
        let path = format!(".metadata.{field}");
        match meta.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => {
                for (key, v) in map {
                    if !matches!(v, Value::String(_) | Value::Null) {
                        errors.push(format!(
                            "{path}.{key}: expected string, got &value.valueUnstructured{{Value:{}}}",
                            go_sharp_v(v)
                        ));
                    }
                }
            }
            Some(other) => errors.push(not_a_map(&path, other)),
        }
    }
    errors
}

/// structured-merge-diff's `ValidationErrors.Error()`: one error alone, several
/// under `errors:`, each on its own indented line.
pub fn join_apply_errors(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => {
            let mut text = String::from("errors:");
            for e in many {
                text.push_str("\n  ");
                text.push_str(e);
            }
            text
        }
    }
}

/// The patched object as kube renders it in a patch's 422: Go's `json.Marshal`
/// of the object (sorted keys, compact, `<`, `>` and `&` escaped) under Go's `%q`.
pub fn patched_value(patched: &Value) -> String {
    let mut text = String::new();
    for c in patched.to_string().chars() {
        match c {
            '<' => text.push_str("\\u003c"),
            '>' => text.push_str("\\u003e"),
            '&' => text.push_str("\\u0026"),
            '\u{2028}' => text.push_str("\\u2028"),
            '\u{2029}' => text.push_str("\\u2029"),
            c => text.push(c),
        }
    }
    go_quote(&text)
}

fn not_a_map(path: &str, value: &Value) -> String {
    format!("{path}: expected map, got &{{{}}}", go_v(value))
}

/// How Go's `encoding/json` names a JSON value in an `UnmarshalTypeError`.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Go's `%v` of a decoded JSON value (`interface{}`: float64, string, slices and
/// maps, whose members Go prints sorted by key, as `Map` iterates).
fn go_v(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => go_number(n),
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(go_v).collect();
            format!("[{}]", items.join(" "))
        }
        Value::Object(m) => {
            let members: Vec<String> = m.iter().map(|(k, v)| format!("{k}:{}", go_v(v))).collect();
            format!("map[{}]", members.join(" "))
        }
    }
}

/// Go's `%#v` of a decoded JSON value.
fn go_sharp_v(v: &Value) -> String {
    match v {
        Value::Null => "interface {}(nil)".into(),
        Value::String(s) => go_quote(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(go_sharp_v).collect();
            format!("[]interface {{}}{{{}}}", items.join(", "))
        }
        Value::Object(m) => {
            let members: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{}:{}", go_quote(k), go_sharp_v(v)))
                .collect();
            format!("map[string]interface {{}}{{{}}}", members.join(", "))
        }
        other => go_v(other),
    }
}

/// JSON numbers decode to float64 in Go.
fn go_number(n: &serde_json::Number) -> String {
    super::go_float(n.as_f64().unwrap_or(0.0))
}

#[cfg(test)]
mod tests;
