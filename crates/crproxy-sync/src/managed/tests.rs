use serde_json::json;

use super::*;

/// What crproxy writes: its labels and annotations, recorded.
fn ours(labels: Value, annotations: Value) -> Value {
    let mut o = json!({"metadata": {"name": "x", "labels": labels, "annotations": annotations}});
    record(&mut o, Keys::Labels);
    record(&mut o, Keys::Annotations);
    o
}

/// `current` as stored: `written` plus what others added.
fn stored(written: &Value, others_label: Option<&str>, others_annotation: Option<&str>) -> Value {
    let mut o = written.clone();
    if let Some(k) = others_label {
        o["metadata"]["labels"][k] = json!("theirs");
    }
    if let Some(k) = others_annotation {
        o["metadata"]["annotations"][k] = json!("theirs");
    }
    o["metadata"]["resourceVersion"] = json!("5");
    o
}

#[test]
fn only_what_crproxy_sets_decides_a_write() {
    let written = ours(json!({"app": "db"}), json!({"note": "x"}));
    let check = |desired: &Value, current: &Value, expected: bool, what: &str| {
        assert_eq!(metadata_differs(desired, current), expected, "{what}");
    };
    check(&written, &stored(&written, None, None), false, "as written");
    check(
        &written,
        &stored(&written, Some("zone"), Some("audited")),
        false,
        "others' keys",
    );
    let relabelled = ours(json!({"app": "web"}), json!({"note": "x"}));
    check(
        &relabelled,
        &stored(&written, None, None),
        true,
        "a value changed",
    );
    let fewer = ours(json!({}), json!({"note": "x"}));
    check(&fewer, &stored(&written, None, None), true, "a key removed");
    let more = ours(json!({"app": "db", "tier": "1"}), json!({"note": "x"}));
    check(&more, &stored(&written, None, None), true, "a key added");
    // Written before records existed: the record itself is missing, so one write.
    let unrecorded = json!({"metadata": {"labels": {"app": "db"}, "annotations": {"note": "x"}}});
    check(&written, &unrecorded, true, "no record yet");
}

#[test]
fn a_replace_keeps_others_keys_finalizers_and_owners_and_drops_removed_ones() {
    let written = ours(json!({"app": "db", "old": "1"}), json!({"note": "x"}));
    let mut current = stored(&written, Some("zone"), Some("audited"));
    current["metadata"]["finalizers"] = json!(["host.example/cleanup"]);
    current["metadata"]["ownerReferences"] = json!([{"uid": "o-1"}]);
    let mut desired = ours(json!({"app": "web"}), json!({}));
    carry_over(&mut desired, &current);
    let m = &desired["metadata"];
    assert_eq!(m["resourceVersion"], "5");
    assert_eq!(m["finalizers"], json!(["host.example/cleanup"]));
    assert_eq!(m["ownerReferences"], json!([{"uid": "o-1"}]));
    assert_eq!(m["labels"], json!({"app": "web", "zone": "theirs"}));
    assert_eq!(
        m["annotations"],
        json!({"audited": "theirs", names::MANAGED_LABELS: "app", names::MANAGED_ANNOTATIONS: ""})
    );
    // Without a record nothing is removed.
    let mut unrecorded = json!({"metadata": {"labels": {"old": "1"}, "annotations": {}}});
    unrecorded["metadata"]["resourceVersion"] = json!("2");
    let mut desired = ours(json!({"app": "web"}), json!({}));
    carry_over(&mut desired, &unrecorded);
    assert_eq!(
        desired["metadata"]["labels"],
        json!({"app": "web", "old": "1"})
    );
}

/// A label that shares a record's name is an ordinary label: recorded when
/// crproxy writes it, removed when the source drops it. It once counted as a
/// record in the labels too, so it was never recorded and never removed.
#[test]
fn a_label_named_like_a_record_is_an_ordinary_label() {
    let name = names::MANAGED_LABELS;
    let written = ours(json!({name: "copied", "app": "db"}), json!({}));
    assert_eq!(
        written["metadata"]["annotations"][names::MANAGED_LABELS],
        format!("app\n{name}")
    );
    let current = stored(&written, None, None);
    let dropped = ours(json!({"app": "db"}), json!({}));
    assert!(
        metadata_differs(&dropped, &current),
        "the source dropped the label: a write"
    );
    let mut replaced = dropped.clone();
    carry_over(&mut replaced, &current);
    assert_eq!(replaced["metadata"]["labels"], json!({"app": "db"}));
    // Someone else's label of that name is theirs, and stays.
    let theirs = stored(&dropped, Some(name), None);
    assert!(!metadata_differs(&dropped, &theirs));
    let mut kept = dropped.clone();
    carry_over(&mut kept, &theirs);
    assert_eq!(kept["metadata"]["labels"][name], "theirs");
}
