//! How the proxy edited a write body when it parsed the whole body into a tree:
//! the model that the edits of the body's text are held to, by the property
//! tests and by the `write_body` fuzz check. Compiled for tests and under the
//! `reference-model` feature (crates/fuzz-oracles) only.

use serde_json::{Map, Value};

/// `document` with `labels` set on the object it writes and `fields` set
/// (`Some`) or removed (`None`) in its own `metadata`; `None` where the edits
/// were refused.
pub fn edited(
    mut document: Value,
    labels: &[(&str, &str)],
    fields: &[(&str, Option<&str>)],
) -> Option<Value> {
    let object = document.as_object_mut()?;
    if !labels.is_empty() {
        label(object, labels)?;
    }
    if !fields.is_empty() {
        let metadata = metadata(object)?;
        for (name, value) in fields {
            match value {
                Some(value) => metadata.insert(name.to_string(), Value::from(*value)),
                None => metadata.remove(*name),
            };
        }
    }
    Some(document)
}

/// A JSON patch with `before` put ahead of the caller's operations and `after`
/// behind them; `None` for a body that is not an array.
pub fn with_operations(document: Value, before: &[Value], after: &[Value]) -> Option<Value> {
    let Value::Array(operations) = document else {
        return None;
    };
    Some(Value::Array(
        before
            .iter()
            .cloned()
            .chain(operations)
            .chain(after.iter().cloned())
            .collect(),
    ))
}

fn metadata(object: &mut Map<String, Value>) -> Option<&mut Map<String, Value>> {
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if metadata.is_null() {
        *metadata = Value::Object(Map::new());
    }
    metadata.as_object_mut()
}

fn label(object: &mut Map<String, Value>, labels: &[(&str, &str)]) -> Option<()> {
    let set = metadata(object)?
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    if set.is_null() {
        *set = Value::Object(Map::new());
    }
    let set = set.as_object_mut()?;
    for (key, value) in labels {
        set.insert(key.to_string(), Value::from(*value));
    }
    Some(())
}
