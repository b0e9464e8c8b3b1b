//! Strict body reading, label stamping and precondition pinning for every media
//! type (JSON, YAML, merge/strategic/JSON patch, server-side apply, DeleteOptions):
//! never a panic; a JSON body is accepted exactly when serde_json's strict parse
//! accepts it; a body that is accepted is sent as JSON without repeated keys, and
//! an accepted object body carries the owner's labels and pins.
#![no_main]

use crproxy_core::ownership::{self, BodyType, Owner};
use crproxy_core::precondition::{self, Pin};
use crproxy_core::request_body::{self, WriteBody};
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
    let parsed = WriteBody::parse(media_type, body);
    let is_json = !matches!(
        media_type,
        Some("application/yaml" | "application/apply-patch+yaml")
    );
    if is_json && body.len() <= request_body::MAX_REQUEST_BODY {
        assert_eq!(
            parsed.is_ok(),
            request_body::parse_json_strict(body).is_ok(),
            "accepted differently: {parsed:?}"
        );
    }
    let Ok(mut write) = parsed else {
        return;
    };
    if ownership::stamp_owner_labels(&owner, &mut write).is_err() {
        return;
    }
    let document = write.document();
    let is_list = document.get("items").is_some();
    if write.body_type != BodyType::JsonPatch && !is_list {
        assert!(owner.owns(&document), "stamped: {document}");
    }
    let stamped = write.to_bytes();
    let reread = request_body::parse_json_strict(&stamped).expect("sent bytes are strict JSON");
    assert_eq!(reread, document);
    if selector & 0x80 != 0 {
        let _ = precondition::pin_apply_create(&mut write, "fresh");
    } else if precondition::pin_write(&owner, &mut write, &pin).is_ok()
        && write.body_type != BodyType::JsonPatch
    {
        let document = write.document();
        assert_eq!(document["metadata"]["uid"], "uid-1");
        assert_eq!(document["metadata"]["resourceVersion"], "7");
        if !is_list {
            assert!(owner.owns(&document), "pinned: {document}");
        }
    }
    request_body::parse_json_strict(&write.to_bytes()).expect("pinned bytes are strict JSON");
});

fn request_body_cost(body: &[u8]) -> usize {
    crproxy_core::request_body::parse_cost(body)
}
