//! The ownership cache's watch decoding and bookkeeping read a stream the target
//! controls. Whatever arrives, in whatever chunks, it must never panic, must end
//! in the same state as when the stream arrives at once, and must pin only states
//! that some event showed carrying both owner labels with the owner's values:
//! the cache's safety rests on holding no other pins.

use crproxy_core::ownership::{Owner, OWNER_PROJECT_LABEL, OWNER_VCLUSTER_LABEL};
use crproxy_core::precondition::Pin;
use crproxy_proxy::ownership_cache::replay_watch;
use serde_json::Value;

/// The owner the seed corpus labels its objects with.
fn owner() -> Owner {
    Owner::new("client", "proj")
}

/// Whether some line of the stream is an ADDED or MODIFIED event of an object
/// with this key and pin, carrying both owner labels.
fn shown_owned(stream: &[u8], key: &str, pin: &Pin) -> bool {
    let owner = owner();
    stream.split(|b| *b == b'\n').any(|line| {
        // The cache refuses a line that is not UTF-8, as a parser does.
        let Ok(event) = serde_json::from_slice::<Value>(line) else {
            return false;
        };
        let meta = &event["object"]["metadata"];
        let text = |v: &Value| v.as_str().map(str::to_owned);
        let event_key = match (text(&meta["namespace"]), text(&meta["name"])) {
            (Some(namespace), Some(name)) => format!("{namespace}/{name}"),
            (None, Some(name)) => name,
            _ => return false,
        };
        let labels = &meta["labels"];
        matches!(event["type"].as_str(), Some("ADDED" | "MODIFIED"))
            && event_key == key
            && text(&meta["uid"]).as_ref() == Some(&pin.uid)
            && text(&meta["resourceVersion"]).as_ref() == Some(&pin.resource_version)
            && labels[OWNER_VCLUSTER_LABEL].as_str() == Some(owner.name.as_str())
            && labels[OWNER_PROJECT_LABEL].as_str() == Some(owner.project.as_str())
    })
}

/// Whether some line is JSON only to a reader that ignores some of its values:
/// a number beyond f64's range or a lone surrogate escape, which the cache skips
/// (as serde_json does when ignoring a value) but a parsed `Value` refuses.
fn has_unparsable_json(stream: &[u8]) -> bool {
    stream.split(|b| *b == b'\n').any(|line| {
        serde_json::from_slice::<Value>(line).is_err()
            && serde_json::from_slice::<serde::de::IgnoredAny>(line).is_ok()
    })
}

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    // The first byte picks the chunk size, the rest is the stream.
    let Some((&size, stream)) = data.split_first() else {
        return;
    };
    let whole = replay_watch(&owner(), [stream]);
    let chunked = replay_watch(&owner(), stream.chunks(usize::from(size).max(1)));
    assert_eq!(chunked, whole);
    // The check below reads lines as parsed documents; lines a parser refuses
    // only for a value the cache skips leave it without a reference.
    if has_unparsable_json(stream) {
        return;
    }
    for (key, pin) in &whole.pins {
        assert!(!pin.uid.is_empty() && !pin.resource_version.is_empty());
        assert!(
            shown_owned(stream, key, pin),
            "pinned {key} {pin:?} without an owned event"
        );
    }
}
