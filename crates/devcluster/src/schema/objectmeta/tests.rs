use serde_json::{json, Value};

use super::*;

const MAP_ERR: &str = "into Go struct field ObjectMeta.labels of type map[string]string";
const VALUE_ERR: &str = "into Go struct field ObjectMeta.labels of type string";

fn check(metadata: Value, expected: Option<&str>) {
    let obj =
        json!({"apiVersion": "stable.example.io/v1", "kind": "CronTab", "metadata": metadata});
    assert_eq!(
        decode_error(&obj).as_deref(),
        expected,
        "metadata: {metadata}"
    );
}

/// Go's encoding/json wording (sigs.k8s.io/json, whose type error is
/// encoding/json's `UnmarshalTypeError`): the JSON type, `ObjectMeta.<field>`
/// (map keys are not part of the path), and the Go type it could not become.
#[test]
fn decode_errors_name_the_field_and_the_go_type() {
    check(json!({"name": "a"}), None);
    check(
        json!({"labels": {"app": "x"}, "annotations": {"a": ""}}),
        None,
    );
    check(json!({"labels": null, "annotations": {"a": null}}), None);
    check(json!(null), None);
    let cases = [
        (json!({"labels": "x"}), format!("json: cannot unmarshal string {MAP_ERR}")),
        (json!({"labels": ["a"]}), format!("json: cannot unmarshal array {MAP_ERR}")),
        (json!({"labels": 1}), format!("json: cannot unmarshal number {MAP_ERR}")),
        (json!({"labels": true}), format!("json: cannot unmarshal bool {MAP_ERR}")),
        (json!({"labels": {"a": 1}}), format!("json: cannot unmarshal number {VALUE_ERR}")),
        (json!({"labels": {"a": false}}), format!("json: cannot unmarshal bool {VALUE_ERR}")),
        (json!({"labels": {"a": ["x"]}}), format!("json: cannot unmarshal array {VALUE_ERR}")),
        (json!({"labels": {"a": {"b": "c"}}}), format!("json: cannot unmarshal object {VALUE_ERR}")),
        // The first error in key order: Go re-marshals metadata with sorted keys.
        (json!({"labels": {"a": "ok", "b": 2, "c": true}}), format!("json: cannot unmarshal number {VALUE_ERR}")),
        (
            json!({"labels": "x", "annotations": {"note": 1}}),
            "json: cannot unmarshal number into Go struct field ObjectMeta.annotations of type string".into(),
        ),
        (
            json!({"annotations": "x"}),
            "json: cannot unmarshal string into Go struct field ObjectMeta.annotations of type map[string]string".into(),
        ),
        (json!("x"), "json: cannot unmarshal string into Go value of type v1.ObjectMeta".into()),
        (json!([]), "json: cannot unmarshal array into Go value of type v1.ObjectMeta".into()),
    ];
    for (metadata, expected) in cases {
        check(metadata, Some(&expected));
    }
}

#[test]
fn null_values_come_back_as_the_decoder_writes_them() {
    let mut obj =
        json!({"metadata": {"name": "a", "labels": {"a": null, "b": "x"}, "annotations": null}});
    normalize(&mut obj);
    assert_eq!(
        obj,
        json!({"metadata": {"name": "a", "labels": {"a": "", "b": "x"}}})
    );
}

/// structured-merge-diff's typed conversion of an applied configuration: the path
/// with a leading dot, `expected map` with Go's `%v` of its value wrapper, and
/// `expected string` with its `%#v`.
#[test]
fn apply_errors_are_structured_merge_diffs() {
    let check = |metadata: Value, expected: &[&str]| {
        let applied =
            json!({"apiVersion": "stable.example.io/v1", "kind": "CronTab", "metadata": metadata});
        assert_eq!(apply_errors(&applied), expected, "metadata: {metadata}");
    };
    check(json!({"name": "a", "labels": {"a": "x", "b": null}}), &[]);
    check(
        json!({"labels": "x"}),
        &[".metadata.labels: expected map, got &{x}"],
    );
    check(
        json!({"labels": ["a", "b"]}),
        &[".metadata.labels: expected map, got &{[a b]}"],
    );
    check(
        json!({"labels": 7}),
        &[".metadata.labels: expected map, got &{7}"],
    );
    check(
        json!({"labels": {"a": 1, "b": true}}),
        &[
            ".metadata.labels.a: expected string, got &value.valueUnstructured{Value:1}",
            ".metadata.labels.b: expected string, got &value.valueUnstructured{Value:true}",
        ],
    );
    check(
        json!({"annotations": {"n": ["x", 2]}, "labels": {"m": {"k": "v"}}}),
        &[
            ".metadata.annotations.n: expected string, got &value.valueUnstructured{Value:[]interface {}{\"x\", 2}}",
            ".metadata.labels.m: expected string, got &value.valueUnstructured{Value:map[string]interface {}{\"k\":\"v\"}}",
        ],
    );
    check(json!("x"), &[".metadata: expected map, got &{x}"]);
    assert_eq!(join_apply_errors(&["a: x".into()]), "a: x");
    assert_eq!(
        join_apply_errors(&["a: x".into(), "b: y".into()]),
        "errors:\n  a: x\n  b: y"
    );
}

#[test]
fn patched_objects_print_as_go_marshals_and_quotes_them() {
    assert_eq!(
        patched_value(
            &json!({"metadata": {"labels": "x"}, "kind": "CronTab", "spec": {"s": "<a&b>"}})
        ),
        r#""{\"kind\":\"CronTab\",\"metadata\":{\"labels\":\"x\"},\"spec\":{\"s\":\"\\u003ca\\u0026b\\u003e\"}}""#
    );
}
