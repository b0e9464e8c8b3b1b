//! The per-field three-way merge of fromHost copies.
//!
//! The host owns a fromHost object, but a tenant may edit its copy: an edit stays
//! until the host changes that same field, which then overwrites it. To tell "the
//! host changed this field" from "the tenant changed it", the copy keeps the host
//! fields as last synced (the *base*). Mappings are merged key by key; anything else
//! (strings, numbers, lists) is one field.

use serde_json::{Map, Value};

/// The tenant's new fields given the last synced host fields (`base`, `None` when the
/// copy was never synced), the host's current fields and the tenant's current ones.
/// `None` means the field is absent.
pub fn three_way(
    base: Option<&Value>,
    host: Option<&Value>,
    tenant: Option<&Value>,
) -> Option<Value> {
    if host == base {
        // The host did not touch this subtree: whatever the tenant has stays.
        return tenant.cloned();
    }
    match (base, host, tenant) {
        (Some(Value::Object(b)), Some(Value::Object(h)), Some(Value::Object(t))) => {
            let mut keys: Vec<&String> = b.keys().chain(h.keys()).chain(t.keys()).collect();
            keys.sort();
            keys.dedup();
            let mut out = Map::new();
            for k in keys {
                if let Some(v) = three_way(b.get(k), h.get(k), t.get(k)) {
                    out.insert(k.clone(), v);
                }
            }
            Some(Value::Object(out))
        }
        // The host changed (or added, or removed) this field: its value wins.
        _ => host.cloned(),
    }
}

#[cfg(test)]
mod tests;
