//! Strict body reading, label stamping and precondition pinning for every media
//! type (JSON, YAML, merge/strategic/JSON patch, server-side apply, DeleteOptions):
//! never a panic; a body that is accepted is sent as JSON that reads back as the
//! checked document, and an accepted object body carries the owner's labels.
#![no_main]

use crproxy_core::ownership::{self, BodyType, Owner};
use crproxy_core::precondition::{self, Pin};
use crproxy_core::request_body::WriteBody;
use libfuzzer_sys::fuzz_target;

const MEDIA_TYPES: [Option<&str>; 7] = [
    None,
    Some("application/json"),
    Some("application/yaml"),
    Some("application/merge-patch+json"),
    Some("application/strategic-merge-patch+json"),
    Some("application/json-patch+json"),
    Some("application/apply-patch+yaml"),
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let owner = Owner::new("client", "project");
    let pin = Pin {
        uid: "uid-1".into(),
        resource_version: "7".into(),
    };
    let _ = precondition::pin_delete(body, &pin);
    let _ = request_body_cost(body);
    let media_type = MEDIA_TYPES[usize::from(selector) % MEDIA_TYPES.len()];
    let Ok(mut write) = WriteBody::parse(media_type, body) else {
        return;
    };
    if ownership::stamp_owner_labels(&owner, &mut write).is_err() {
        return;
    }
    let is_list = write.document.get("items").is_some();
    if write.body_type != BodyType::JsonPatch && !is_list {
        assert!(owner.owns(&write.document), "stamped: {}", write.document);
    }
    let stamped = write.to_bytes();
    let reread: serde_json::Value = serde_json::from_slice(&stamped).expect("sent bytes are JSON");
    assert_eq!(reread, write.document);
    if selector & 0x80 != 0 {
        let _ = precondition::pin_apply_create(&mut write, "fresh");
    } else if precondition::pin_write(&owner, &mut write, &pin).is_ok()
        && write.body_type != BodyType::JsonPatch
    {
        assert_eq!(write.document["metadata"]["uid"], "uid-1");
        assert_eq!(write.document["metadata"]["resourceVersion"], "7");
    }
});

fn request_body_cost(body: &[u8]) -> usize {
    crproxy_core::request_body::parse_cost(body)
}
