//! A write's answer comes from the target, and the ownership cache remembers the
//! state it shows so that the next write of that object skips the ownership GET.
//! Whatever the answer, reading it must never panic, and it may pin an object only
//! when a JSON reader sees the addressed object carrying both owner labels with
//! the owner's values, in the pinned uid and resourceVersion: the cache's safety
//! rests on holding no other pins. The other way round, an answer that a strict,
//! typed parse reads as the addressed object is read the same (pinned when owned),
//! so the cache does not refuse what the target answers.

use std::collections::HashMap;

use crproxy_core::ownership::{Owner, OWNER_PROJECT_LABEL, OWNER_VCLUSTER_LABEL};
use crproxy_core::precondition::Pin;
use crproxy_proxy::ownership_cache::{read_write_answer, WriteAnswer};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The owner the seed corpus labels its objects with.
fn owner() -> Owner {
    Owner::new("client", "proj")
}

/// What a reference reader makes of an answer.
#[derive(Debug, PartialEq)]
enum Reference {
    /// The addressed object under `key`, and its pin when it is owned.
    Object { key: String, pin: Option<Pin> },
    /// Not the addressed object, or not readable as one.
    Other,
}

/// The metadata fields the cache reads, as a typed parse reads them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<OwnerLabels>,
}

#[derive(Deserialize)]
struct OwnerLabels {
    #[serde(rename = "vcluster.com/owner-vcluster")]
    vcluster: Option<String>,
    #[serde(rename = "vcluster.com/owner-project")]
    project: Option<String>,
}

/// The answer as a typed parse reads it: it refuses a key given twice and a
/// needed field of the wrong type, and skips everything else as the cache does.
#[derive(Deserialize)]
struct Strict {
    metadata: Option<Metadata>,
}

fn reference(metadata: Option<Metadata>, namespace: Option<&str>, name: Option<&str>) -> Reference {
    let Some(meta) = metadata else {
        return Reference::Other;
    };
    let Some(answered) = meta.name else {
        return Reference::Other;
    };
    if name.is_some_and(|name| name != answered) || meta.namespace.as_deref() != namespace {
        return Reference::Other;
    }
    let key = match namespace {
        Some(namespace) => format!("{namespace}/{answered}"),
        None => answered,
    };
    let owner = owner();
    let labels = meta.labels.unwrap_or(OwnerLabels {
        vcluster: None,
        project: None,
    });
    let owned = labels.vcluster.as_deref() == Some(owner.name.as_str())
        && labels.project.as_deref() == Some(owner.project.as_str());
    let pin = match (owned, meta.uid, meta.resource_version) {
        (true, Some(uid), Some(resource_version))
            if !uid.is_empty() && !resource_version.is_empty() =>
        {
            Some(Pin {
                uid,
                resource_version,
            })
        }
        _ => None,
    };
    Reference::Object { key, pin }
}

/// An object's members as raw text, each key with its last value, values only
/// scanned: the lenient reading that applies to every answer, whatever it nests
/// or however large its numbers.
fn members(text: &str) -> Option<HashMap<String, Box<RawValue>>> {
    serde_json::from_str(text).ok()
}

fn field<T: for<'de> Deserialize<'de>>(
    object: &HashMap<String, Box<RawValue>>,
    key: &str,
) -> Option<T> {
    object
        .get(key)
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
}

/// The answer read leniently: keys keep their last value, values the cache does
/// not need are only scanned.
fn lenient(answer: &[u8], namespace: Option<&str>, name: Option<&str>) -> Reference {
    let Some(top) = std::str::from_utf8(answer).ok().and_then(members) else {
        return Reference::Other;
    };
    let Some(meta) = top.get("metadata").and_then(|raw| members(raw.get())) else {
        return Reference::Other;
    };
    let labels = meta.get("labels").and_then(|raw| members(raw.get()));
    let metadata = Metadata {
        name: field(&meta, "name"),
        namespace: field(&meta, "namespace"),
        uid: field(&meta, "uid"),
        resource_version: field(&meta, "resourceVersion"),
        labels: labels.map(|labels| OwnerLabels {
            vcluster: field(&labels, OWNER_VCLUSTER_LABEL),
            project: field(&labels, OWNER_PROJECT_LABEL),
        }),
    };
    reference(Some(metadata), namespace, name)
}

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    // The first byte picks what the write addressed, the rest is the answer.
    let Some((&choice, answer)) = data.split_first() else {
        return;
    };
    let namespace = (choice & 1 == 1).then_some("ns");
    let name = (choice & 2 == 2).then_some("obj");
    let read = read_write_answer(&owner(), namespace, name, answer);
    // Safety: a pin only where the lenient reading sees the owned object in it.
    if let Some(WriteAnswer::Owned { key, pin }) = &read {
        let seen = lenient(answer, namespace, name);
        assert_eq!(
            seen,
            Reference::Object {
                key: key.clone(),
                pin: Some(pin.clone()),
            },
            "pinned an answer read otherwise"
        );
    }
    // Agreement: an answer a strict parse reads is read the same. (A text that
    // is not UTF-8 throughout is refused whole, as by a parser that reads every
    // string; serde_json does not look inside the strings it skips.)
    let strict = std::str::from_utf8(answer)
        .ok()
        .and_then(|text| serde_json::from_str::<Strict>(text).ok());
    if let Some(strict) = strict {
        let expected = match reference(strict.metadata, namespace, name) {
            Reference::Object {
                key,
                pin: Some(pin),
            } => Some(WriteAnswer::Owned { key, pin }),
            Reference::Object { key, pin: None } => Some(WriteAnswer::NotOwned { key }),
            Reference::Other => None,
        };
        assert_eq!(read, expected, "read otherwise than a strict parse");
    }
}
