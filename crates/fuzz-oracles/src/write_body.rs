//! Strict body reading, label stamping and precondition pinning for every media
//! type (JSON, YAML, merge/strategic/JSON patch, server-side apply, DeleteOptions,
//! and the delete options of a query), and whether a body names an owner:
//! never a panic; a JSON body is accepted exactly when serde_json's strict parse
//! accepts it; what is sent reads, strictly, as the document the tree-based model
//! (`request_body::reference`) makes of the caller's body with the same edits.

use crproxy_core::ownership::{self, BodyType, Owner};
use crproxy_core::precondition::{self, Pin};
use crproxy_core::request_body::{self, reference, WriteBody};
use serde_json::{json, Value};

const MEDIA_TYPES: [Option<&str>; 7] = [
    None,
    Some("application/json"),
    Some("application/yaml"),
    Some("application/merge-patch+json"),
    Some("application/strategic-merge-patch+json"),
    Some("application/json-patch+json"),
    Some("application/apply-patch+yaml"),
];

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let owner = Owner::new("client", "project");
    let pin = Pin {
        uid: "uid-1".into(),
        resource_version: "7".into(),
    };
    // A body that is read gives strict JSON whose preconditions are the pin's.
    if let Ok(options) = precondition::pin_delete(body, None, &pin) {
        let options = request_body::parse_json_strict(&options).expect("strict JSON");
        assert_eq!(options["preconditions"]["uid"], "uid-1");
        assert_eq!(options["preconditions"]["resourceVersion"], "7");
    }
    // An empty-bodied delete takes its options from the query: any query either
    // is refused or gives a DeleteOptions that carries the pin.
    if let Ok(query) = std::str::from_utf8(body) {
        if let Ok(options) = precondition::pin_delete(b"", Some(query), &pin) {
            let options = request_body::parse_json_strict(&options).expect("strict JSON");
            assert_eq!(options["kind"], "DeleteOptions");
            assert_eq!(
                options["preconditions"],
                json!({"uid": "uid-1", "resourceVersion": "7"})
            );
        }
        check_query_pin(query, &pin);
    }
    let media_type = MEDIA_TYPES[usize::from(selector) % MEDIA_TYPES.len()];
    // What a read is admitted for is never less than the text's own estimate.
    if let Ok(admitted) = crproxy_core::request_body::admit(media_type, body) {
        assert!(admitted.cost() >= crproxy_core::request_body::parse_cost(body));
    }
    let parsed = WriteBody::parse(media_type, body);
    let is_json = !matches!(
        media_type,
        Some("application/yaml" | "application/apply-patch+yaml")
    );
    // The model edits the caller's document as the strict parse reads it; a YAML
    // body is checked against what it was read as instead.
    let model = if is_json && body.len() <= request_body::MAX_REQUEST_BODY {
        let strict = request_body::parse_json_strict(body);
        assert_eq!(
            parsed.is_ok(),
            strict.is_ok(),
            "accepted differently: {parsed:?}"
        );
        strict.ok()
    } else {
        parsed.as_ref().ok().and_then(|write| write.document().ok())
    };
    let (Ok(mut write), Some(model)) = (parsed, model) else {
        return;
    };
    // The alias walk never says a YAML body's JSON is longer than it is: it
    // refuses bodies whose JSON the target would refuse for its size.
    if !is_json {
        if let Some(bound) = std::str::from_utf8(body)
            .ok()
            .and_then(request_body::yaml_json_lower_bound)
        {
            let json = write.to_bytes().len();
            assert!(bound <= json, "walked {bound}, JSON {json}");
        }
    }
    // An all-mode replace asks first whether the body names an owner itself.
    // It reads the layout, not the document: compare it with the model's labels.
    let carries = |value: &Value| value.is_null() || value.is_object();
    let model_labels = &model["metadata"]["labels"];
    match ownership::names_an_owner(&write) {
        Ok(named) => assert_eq!(
            named,
            [
                ownership::OWNER_VCLUSTER_LABEL,
                ownership::OWNER_PROJECT_LABEL
            ]
            .iter()
            .any(|key| model_labels[*key].is_string()),
            "names an owner: {model_labels}"
        ),
        Err(shape) => assert!(
            !model.is_object() || !carries(&model["metadata"]) || !carries(model_labels),
            "{shape} for a body that can carry labels: {model}"
        ),
    }
    // A view of the object (a Scale) is pinned unstamped, by uid and resourceVersion.
    let mut view = write.clone();
    if precondition::pin_view_write(&mut view, &pin).is_ok() {
        let want = if view.body_type == BodyType::JsonPatch {
            let tests = [
                json!({"op": "test", "path": "/metadata/uid", "value": "uid-1"}),
                json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"}),
            ];
            reference::with_operations(model.clone(), &tests, &[])
        } else {
            reference::edited(model.clone(), &[], &pinned_fields(&model))
        };
        assert_eq!(view.document().ok(), want, "view pin");
    }
    let labels = ownership::owner_labels(&owner);
    let stamped = ownership::stamp_owner_labels(&owner, &mut write);
    let want = if write.body_type == BodyType::JsonPatch {
        let adds: Vec<Value> = labels
            .iter()
            .map(|(key, value)| json!({"op": "add", "path": ownership::label_pointer(key), "value": value}))
            .collect();
        reference::with_operations(model.clone(), &[], &adds)
    } else {
        reference::edited(model.clone(), &labels, &[])
    };
    assert_eq!(stamped.is_ok(), want.is_some(), "stamping: {stamped:?}");
    let Some(want) = want else {
        return;
    };
    assert_eq!(write.document().expect("sent bytes are strict JSON"), want);
    if write.body_type == BodyType::JsonPatch {
        return;
    }
    if selector & 0x80 != 0 {
        if precondition::pin_apply_create(&mut write).is_ok() {
            let fields = [(
                "resourceVersion",
                Some(precondition::NO_OBJECT_RESOURCE_VERSION),
            )];
            let want = reference::edited(model, &labels, &fields);
            assert_eq!(write.document().ok(), want);
        }
    } else if precondition::pin_write(&owner, &mut write, &pin).is_ok() {
        let fields = pinned_fields(&model);
        let want = reference::edited(model, &labels, &fields);
        assert_eq!(write.document().ok(), want);
    }
}

/// The metadata fields a pin to uid `uid-1` and resourceVersion `7` sets in a
/// body modelled as `model`. A uid of the caller's own stays as sent (its
/// precondition, or a change kube refuses); an absent, null or empty one gets
/// the pinned uid.
fn pinned_fields(model: &Value) -> Vec<(&'static str, Option<&'static str>)> {
    let callers_uid = model
        .get("metadata")
        .and_then(|metadata| metadata.get("uid"));
    let keeps_callers_uid = match callers_uid {
        None | Some(Value::Null) => false,
        Some(Value::String(uid)) => !uid.is_empty(),
        Some(_) => true,
    };
    let mut fields = vec![("resourceVersion", Some("7"))];
    if !keeps_callers_uid {
        fields.insert(0, ("uid", Some("uid-1")));
    }
    fields
}

/// A delete sent without a body is pinned in its query: the pinned query reads
/// as the pin's preconditions (no other pin meets them) and otherwise as the
/// caller's options, for a plain pin and one that needs escaping.
fn check_query_pin(query: &str, plain: &Pin) {
    let odd = Pin {
        uid: "u 1&uid=x%".into(),
        resource_version: "7+8".into(),
    };
    let other = Pin {
        uid: "other".into(),
        resource_version: "1".into(),
    };
    for pin in [plain, &odd] {
        let Ok(options) = precondition::DeleteOptions::read(b"", Some(query)) else {
            continue;
        };
        let Ok(pinned) = options.pinned_delete(pin) else {
            continue;
        };
        let precondition::PinnedRequest::Query(pinned) = pinned else {
            // A long query is pinned in a body instead.
            assert!(
                query.len() > precondition::MAX_QUERY_PIN_BYTES
                    || query.split('&').filter(|pair| !pair.is_empty()).count()
                        > precondition::MAX_QUERY_PIN_PAIRS,
                "a short query without a body is pinned in the query"
            );
            continue;
        };
        // Far below the parameter count past which Go drops a query whole.
        assert!(pinned.split('&').count() <= precondition::MAX_QUERY_PIN_PAIRS + 2);
        let read_back = precondition::DeleteOptions::read(b"", Some(&pinned))
            .expect("a pinned query reads as the caller's did");
        assert_eq!(
            read_back.pinned(&other),
            Err(precondition::PreconditionError::Stale)
        );
        assert_eq!(read_back.pinned(pin), options.pinned(pin));
    }
}
