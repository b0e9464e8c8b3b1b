//! What `/scale` reads of an object, and what kube checks of the Scale a write
//! asks for. A custom resource's replicas and selector as apiextensions-apiserver
//! reads them (`scaleFromCustomResource` in `pkg/registry/customresource/etcd.go`):
//! through apimachinery's `unstructured.NestedInt64` and `NestedString`, whose
//! errors for a field of the wrong type reach the client as their Go text. A
//! built-in's selector as its registry prints it (`scaleFromDeployment` in
//! `pkg/registry/apps/deployment/storage/storage.go`), and the Scale its
//! registry validates (`ValidateScale`).

use crate::registry::ScaleSpec;
use crate::schema::Cause;
use crproxy_core::go_text;
use crproxy_core::selector::{label_value_errors, qualified_name_errors, LabelSelector};
use serde_json::{json, Value};

/// A built-in's Scale `status.selector`: kube's `scaleFromDeployment` (and the
/// ReplicaSet and StatefulSet registries alike) prints `spec.selector` through
/// `metav1.LabelSelectorAsSelector`, so requirements come sorted by key, and a
/// missing or empty selector is "" (which the Scale then leaves out). A selector
/// kube cannot turn into requirements is the error, in kube's text.
pub fn builtin_selector(obj: &Value) -> Result<String, String> {
    let selector = obj.pointer("/spec/selector").unwrap_or(&Value::Null);
    match LabelSelector::from_object(selector) {
        Ok(selector) => Ok(selector.map(|s| s.to_string()).unwrap_or_default()),
        Err(e) => Err(e.message().to_string()),
    }
}

/// Which of a custom resource's scale fields a write has checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    /// Spec replicas, status replicas and the selector: a create or an update
    /// of the object or its `/scale`.
    SpecAndStatus,
    /// Status replicas and the selector: an update through `/status`.
    StatusOnly,
}

/// kube's `ValidateScale` (`pkg/apis/autoscaling/validation`), which a built-in's
/// registry runs on the Scale a write asks for before it writes anything: the
/// Scale's metadata as `ValidateObjectMeta` checks a new namespaced object's
/// (apimachinery's, then core's rule for finalizer names), then replicas of at
/// least 0. Members of another JSON type are read as Go's zero value (kube's
/// decoder refuses them before).
///
/// The name and namespace are the request's by then (kube's handlers hold the
/// Scale to them first), so their checks always pass and are left out. So are
/// those whose answer devcluster cannot give as kube does: managedFields (kube's
/// field manager rewrites a Scale's before the registry sees them), the total
/// size of the annotations (the text of 1.32's `field.TooLong` is not
/// confirmed), and an Event as owner or a second controller owner (kube prints
/// the owner references with Go's `%#v`, pointers and all).
pub fn builtin_scale_causes(scale: &Value) -> Vec<Cause> {
    let meta = scale.get("metadata").unwrap_or(&Value::Null);
    let mut causes = Vec::new();
    let generate_name = text(meta, "generateName");
    if !generate_name.is_empty() {
        for e in super::objects::generate_name_errors(generate_name) {
            let value = json!(generate_name);
            causes.push(Cause::invalid("metadata.generateName", &value, &e));
        }
    }
    if let Some(generation) = meta.get("generation").and_then(Value::as_i64) {
        if generation < 0 {
            causes.push(Cause::invalid(
                "metadata.generation",
                &json!(generation),
                NEGATIVE,
            ));
        }
    }
    let map = |key: &str| meta.get(key).and_then(Value::as_object);
    for (key, value) in map("labels").into_iter().flatten() {
        for e in qualified_name_errors(key) {
            causes.push(Cause::invalid("metadata.labels", &json!(key), &e));
        }
        let value = value.as_str().unwrap_or_default();
        for e in label_value_errors(value) {
            causes.push(Cause::invalid("metadata.labels", &json!(value), &e));
        }
    }
    for key in map("annotations").into_iter().flatten().map(|(k, _)| k) {
        // Case does not matter in an annotation's key.
        for e in qualified_name_errors(&key.to_lowercase()) {
            causes.push(Cause::invalid("metadata.annotations", &json!(key), &e));
        }
    }
    let owners = meta.get("ownerReferences").and_then(Value::as_array);
    for owner in owners.into_iter().flatten() {
        causes.extend(owner_reference_causes(owner));
    }
    causes.extend(finalizer_causes(meta));
    let replicas = scale
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or_default();
    if replicas < 0 {
        causes.push(Cause::invalid("spec.replicas", &json!(replicas), NEGATIVE));
    }
    causes
}

/// apimachinery's `IsNegativeErrorMsg`.
const NEGATIVE: &str = "must be greater than or equal to 0";

/// The string at `key` of `v`, "" when it is missing or not a string.
fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// apimachinery's `validateOwnerReference`, but for an Event as owner. Each
/// cause names the member under `metadata.ownerReferences`, without an index.
fn owner_reference_causes(owner: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let api_version = text(owner, "apiVersion");
    // `schema.FromAPIVersionAndKind`: no version when apiVersion is empty,
    // ends in a slash, or has more than one.
    let version = match api_version.split('/').collect::<Vec<_>>().as_slice() {
        [version] | [_, version] => *version,
        _ => "",
    };
    if version.is_empty() {
        causes.push(Cause::invalid(
            "metadata.ownerReferences.apiVersion",
            &json!(api_version),
            "version must not be empty",
        ));
    }
    for member in ["kind", "name", "uid"] {
        if text(owner, member).is_empty() {
            causes.push(Cause::invalid(
                &format!("metadata.ownerReferences.{member}"),
                &json!(""),
                "must not be empty",
            ));
        }
    }
    causes
}

/// apimachinery's `ValidateFinalizers` (qualified names, not both orphan and
/// foregroundDeletion), then core's `validateKubeFinalizerName` for each (a
/// name without a `/` must be one of kube's own).
fn finalizer_causes(meta: &Value) -> Vec<Cause> {
    let finalizers: Vec<&str> = meta
        .get("finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|f| f.as_str().unwrap_or_default())
        .collect();
    let mut causes = Vec::new();
    for finalizer in &finalizers {
        for e in qualified_name_errors(finalizer) {
            causes.push(Cause::invalid("metadata.finalizers", &json!(finalizer), &e));
        }
    }
    if finalizers.contains(&"orphan") && finalizers.contains(&"foregroundDeletion") {
        // `field.Invalid` prints the whole list as Go's `%#v` of a `[]string`.
        let quoted: Vec<String> = finalizers.iter().map(|f| go_text::quoted(f)).collect();
        causes.push(Cause {
            reason: "FieldValueInvalid".into(),
            message: format!(
                "Invalid value: []string{{{}}}: finalizer orphan and foregroundDeletion cannot be both set",
                quoted.join(", ")
            ),
            field: "metadata.finalizers".into(),
        });
    }
    for (i, finalizer) in finalizers.iter().enumerate() {
        let standard = ["kubernetes", "orphan", "foregroundDeletion"].contains(finalizer);
        if !finalizer.contains('/') && !standard {
            causes.push(Cause::invalid(
                &format!("metadata.finalizers[{i}]"),
                &json!(finalizer),
                "name is neither a standard finalizer name nor is it fully qualified",
            ));
        }
    }
    causes
}

/// kube's `ValidateScaleSpec` and `ValidateScaleStatus` (apiextensions-apiserver
/// `pkg/registry/customresource/validator.go`): every create and update of a
/// custom resource with a scale subresource checks the replicas (and the
/// selector) are of the right type and range; an update through `/status`
/// checks the status ones only. Each cause names the path as the CRD wrote it.
pub fn custom_resource_causes(obj: &Value, scale: &ScaleSpec, checked: Checked) -> Vec<Cause> {
    let mut causes = Vec::new();
    if checked == Checked::SpecAndStatus {
        causes.extend(replicas_cause(obj, &scale.spec_replicas_path));
    }
    causes.extend(replicas_cause(obj, &scale.status_replicas_path));
    if let Some(path) = &scale.label_selector_path {
        if let Err(e) = nested_string(obj, path) {
            causes.push(Cause::invalid(path, &json!(""), &e));
        }
    }
    causes
}

fn replicas_cause(obj: &Value, path: &str) -> Option<Cause> {
    match nested_int64(obj, path) {
        Err(e) => Some(Cause::invalid(path, &json!(0), &e)),
        Ok(Some(n)) if n < 0 => Some(Cause::invalid(
            path,
            &json!(n),
            "should be a non-negative integer",
        )),
        Ok(Some(n)) if n > i64::from(i32::MAX) => Some(Cause::invalid(
            path,
            &json!(n),
            &format!("should be less than or equal to {}", i32::MAX),
        )),
        _ => None,
    }
}

/// The integer at a JSON path like `.spec.replicas`, as `NestedInt64` reads it:
/// `Ok(None)` when it is absent, an error naming the path when it (or an
/// object on the way) has another type. kube decodes a JSON integer beyond
/// int64 as a float64, so that is refused too.
pub fn nested_int64(obj: &Value, path: &str) -> Result<Option<i64>, String> {
    let fields = fields(path);
    match nested_field(obj, &fields)? {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| accessor_error(&fields, v, "int64")),
    }
}

/// The string at a JSON path, as `NestedString` reads it.
pub fn nested_string(obj: &Value, path: &str) -> Result<Option<String>, String> {
    let fields = fields(path);
    match nested_field(obj, &fields)? {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(accessor_error(&fields, v, "string")),
    }
}

/// kube's `splitReplicasPath`: the path without its leading period, split at
/// every period (an empty segment is a field named "").
fn fields(path: &str) -> Vec<&str> {
    path.strip_prefix('.').unwrap_or(path).split('.').collect()
}

/// `NestedFieldNoCopy`: a null or missing field on the way means absent; a
/// null at the end is found (and then of the wrong type).
fn nested_field<'a>(obj: &'a Value, fields: &[&str]) -> Result<Option<&'a Value>, String> {
    let mut val = obj;
    for (i, field) in fields.iter().enumerate() {
        if val.is_null() {
            return Ok(None);
        }
        let Some(m) = val.as_object() else {
            return Err(accessor_error(&fields[..=i], val, "map[string]interface{}"));
        };
        match m.get(*field) {
            Some(v) => val = v,
            None => return Ok(None),
        }
    }
    Ok(Some(val))
}

/// `<path> accessor error: <%v> is of the type <%T>, expected <type>`.
fn accessor_error(fields: &[&str], val: &Value, expected: &str) -> String {
    format!(
        ".{} accessor error: {} is of the type {}, expected {expected}",
        fields.join("."),
        go_print(val),
        go_type(val)
    )
}

/// Go's `%T` of a value decoded from JSON.
fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() => "int64",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

/// Go's `%v` of a value decoded from JSON (maps print their keys sorted).
fn go_print(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match n.as_i64() {
            Some(i) => i.to_string(),
            None => go_float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(go_print).collect();
            format!("[{}]", items.join(" "))
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let entries: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{k}:{}", go_print(&m[k])))
                .collect();
            format!("map[{}]", entries.join(" "))
        }
    }
}

/// `%v` of a float64: the shortest digits, in exponent form (`1e+06`) when
/// the exponent is below -4 or at least 6, as Go's `%g` does.
fn go_float(f: f64) -> String {
    let sci = format!("{f:e}");
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return sci;
    };
    let exp: i32 = exp.parse().unwrap_or_default();
    if f != 0.0 && !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    } else {
        format!("{f}")
    }
}

#[cfg(test)]
mod tests;
