//! A write's answer comes from the target, and the ownership cache remembers the
//! state it shows so that the next write of that object skips the ownership GET.
//! Whatever the answer, reading it must never panic, and it may pin an object only
//! when a JSON parser reads it as the addressed object carrying both owner labels
//! with the owner's values, in the pinned uid and resourceVersion: the cache's
//! safety rests on holding no other pins. An answer a parser reads as owned is
//! pinned, too (read the same way, not refused).
#![no_main]

use crproxy_core::ownership::{Owner, OWNER_PROJECT_LABEL, OWNER_VCLUSTER_LABEL};
use crproxy_proxy::ownership_cache::{read_write_answer, WriteAnswer};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// The owner the seed corpus labels its objects with.
fn owner() -> Owner {
    Owner::new("client", "proj")
}

/// What a parsed document says: the key of the object the write addressed and,
/// when it is owned, its uid and resourceVersion; `None` when the document is
/// not that object.
fn parsed(
    document: &Value,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Option<(String, Option<(String, String)>)> {
    let meta = document.as_object()?.get("metadata")?;
    let answered = meta["name"].as_str()?;
    if name.is_some_and(|name| name != answered) || meta["namespace"].as_str() != namespace {
        return None;
    }
    let key = match namespace {
        Some(namespace) => format!("{namespace}/{answered}"),
        None => answered.to_string(),
    };
    let owner = owner();
    let labels = &meta["labels"];
    let owned = labels[OWNER_VCLUSTER_LABEL].as_str() == Some(owner.name.as_str())
        && labels[OWNER_PROJECT_LABEL].as_str() == Some(owner.project.as_str());
    let uid = meta["uid"].as_str().filter(|uid| !uid.is_empty());
    let resource_version = meta["resourceVersion"]
        .as_str()
        .filter(|rv| !rv.is_empty());
    let pin = match (owned, uid, resource_version) {
        (true, Some(uid), Some(rv)) => Some((uid.to_string(), rv.to_string())),
        _ => None,
    };
    Some((key, pin))
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks what the write addressed, the rest is the answer.
    let Some((&choice, answer)) = data.split_first() else {
        return;
    };
    let namespace = (choice & 1 == 1).then_some("ns");
    let name = (choice & 2 == 2).then_some("obj");
    let read = read_write_answer(&owner(), namespace, name, answer);
    // A document a parser refuses only for a value the reader skips (a number
    // beyond f64's range, a lone surrogate escape) leaves no reference.
    let Ok(document) = serde_json::from_slice::<Value>(answer) else {
        if let Some(WriteAnswer::Owned { .. }) = read {
            assert!(
                serde_json::from_slice::<serde::de::IgnoredAny>(answer).is_ok(),
                "pinned an answer that is not JSON: {read:?}"
            );
        }
        return;
    };
    let reference = parsed(&document, namespace, name);
    match (&read, &reference) {
        (Some(WriteAnswer::Owned { key, pin }), Some((parsed_key, Some((uid, rv))))) => {
            assert_eq!(key, parsed_key);
            assert_eq!((&pin.uid, &pin.resource_version), (uid, rv));
        }
        (Some(WriteAnswer::Owned { .. }), _) => {
            panic!("pinned {read:?}; a parser reads {reference:?}")
        }
        (_, Some((_, Some(_)))) => panic!("did not pin {reference:?}; read {read:?}"),
        (Some(WriteAnswer::NotOwned { key }), Some((parsed_key, None))) => {
            assert_eq!(key, parsed_key)
        }
        _ => {}
    }
});
