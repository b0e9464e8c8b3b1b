//! The labels and annotations crproxy manages on the objects it writes whole.
//!
//! Syncing replaces objects (a PUT of the whole object), and others write to the same
//! objects: a host controller annotates a mirror or puts its finalizer on it, a tenant
//! controller labels a fromHost copy. A replace must keep what they wrote, and what
//! they wrote must not make crproxy write again (each would undo the other, forever).
//! So the keys crproxy writes are recorded on the object itself
//! ([`names::MANAGED_LABELS`], [`names::MANAGED_ANNOTATIONS`]): only those keys decide
//! whether a write is needed, a replace removes a recorded key the source no longer
//! has, and every other key, the finalizers and the owner references stay as they
//! are. An object without a record (written before records existed) has no key
//! removed: nothing of someone else's is deleted on a guess; its next write records.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::names;

/// Which of an object's string maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    Labels,
    Annotations,
}

impl Keys {
    /// The metadata field holding these keys.
    pub fn field(self) -> &'static str {
        match self {
            Keys::Labels => "labels",
            Keys::Annotations => "annotations",
        }
    }

    /// The annotation recording which of these keys are crproxy's.
    pub fn record(self) -> &'static str {
        match self {
            Keys::Labels => names::MANAGED_LABELS,
            Keys::Annotations => names::MANAGED_ANNOTATIONS,
        }
    }
}

/// The records themselves (annotations) are crproxy's bookkeeping, never one of
/// the recorded keys. A label that happens to share a record's name is an
/// ordinary label, recorded and removed like any other.
fn is_record(keys: Keys, key: &str) -> bool {
    keys == Keys::Annotations && (key == names::MANAGED_LABELS || key == names::MANAGED_ANNOTATIONS)
}

fn map(object: &Value, keys: Keys) -> Map<String, Value> {
    object["metadata"][keys.field()]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

/// Records on `object`, which crproxy is about to write, that every key of its
/// `keys` is crproxy's. Always present, empty when there are none, so a record of
/// earlier keys is always replaced.
pub fn record(object: &mut Value, keys: Keys) {
    let recorded: BTreeSet<String> = map(object, keys)
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| !is_record(keys, k))
        .collect();
    let value = recorded.into_iter().collect::<Vec<_>>().join("\n");
    let metadata = &mut object["metadata"];
    if !metadata["annotations"].is_object() {
        metadata["annotations"] = Value::Object(Map::new());
    }
    metadata["annotations"][keys.record()] = Value::String(value);
}

/// The keys `object` records as crproxy's (none without a record).
fn recorded(object: &Value, keys: Keys) -> BTreeSet<String> {
    object["metadata"]["annotations"][keys.record()]
        .as_str()
        .map(|r| {
            r.lines()
                .filter(|k| !k.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `current`'s labels and annotations lack what `desired` sets there: a key
/// `desired` has, with its value, or the removal of a key `current` records as
/// crproxy's that `desired` no longer has. Other keys on `current` do not count.
pub fn metadata_differs(desired: &Value, current: &Value) -> bool {
    [Keys::Labels, Keys::Annotations].into_iter().any(|keys| {
        let (want, have) = (map(desired, keys), map(current, keys));
        want.iter().any(|(k, v)| have.get(k) != Some(v))
            || recorded(current, keys)
                .iter()
                .any(|k| !want.contains_key(k) && have.contains_key(k))
    })
}

/// The labels and annotations of `current` at the keys `desired` sets, the
/// records of crproxy's keys among them: others' keys are not, and a key added
/// to a record changes the record.
pub fn ours(desired: &Value, current: &Value) -> [Map<String, Value>; 2] {
    [Keys::Labels, Keys::Annotations].map(|keys| {
        let want = map(desired, keys);
        map(current, keys)
            .into_iter()
            .filter(|(k, _)| want.contains_key(k))
            .collect()
    })
}

/// Turns `desired` into the replace of `current`: `current`'s resourceVersion (the
/// write is pinned to what was read), finalizers and owner references, and the
/// labels and annotations of `current` that crproxy did not record, with `desired`'s
/// keys over them.
pub fn carry_over(desired: &mut Value, current: &Value) {
    for keys in [Keys::Labels, Keys::Annotations] {
        let ours = recorded(current, keys);
        let mut merged: Map<String, Value> = map(current, keys)
            .into_iter()
            .filter(|(k, _)| !ours.contains(k) && !is_record(keys, k))
            .collect();
        merged.extend(map(desired, keys));
        desired["metadata"][keys.field()] = Value::Object(merged);
    }
    for field in ["resourceVersion", "finalizers", "ownerReferences"] {
        let value = &current["metadata"][field];
        if !value.is_null() {
            desired["metadata"][field] = value.clone();
        }
    }
}

#[cfg(test)]
mod tests;
