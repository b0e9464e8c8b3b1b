use serde_json::{json, Value};

use super::*;

/// The CronTab schema of the reference recordings (004-crd-create-crontabs).
fn crontab() -> Value {
    json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "cronSpec": {"type": "string", "pattern": "^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$"},
                    "replicas": {"type": "integer", "minimum": 1, "maximum": 10},
                    "image": {"type": "string"}
                },
                "required": ["cronSpec"]
            },
            "status": {
                "type": "object",
                "properties": {"replicas": {"type": "integer"}, "labelSelector": {"type": "string"}}
            }
        }
    })
}

fn check(schema: Value, object: Value, expected: &[(&str, &str, &str)]) {
    let s = match StructuralSchema::from_json(&schema) {
        Ok(s) => s,
        Err(e) => panic!("schema did not parse: {e}"),
    };
    let got: Vec<(String, String, String)> = s
        .validate(&object)
        .into_iter()
        .map(|c| (c.reason, c.message, c.field))
        .collect();
    let want: Vec<(String, String, String)> = expected
        .iter()
        .map(|(r, m, f)| (r.to_string(), m.to_string(), f.to_string()))
        .collect();
    assert_eq!(got, want, "object: {object}");
}

#[test]
fn validation_messages_match_kube() {
    let pattern_msg = "Invalid value: \"every minute\": spec.cronSpec in body should match '^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$'";
    check(
        crontab(),
        json!({"spec": {"cronSpec": "* * * * */5", "replicas": 3, "image": "x"}}),
        &[],
    );
    // reference 047
    check(
        crontab(),
        json!({"apiVersion": "stable.example.io/v1", "kind": "CronTab", "metadata": {"name": "bad-crontab"},
               "spec": {"cronSpec": "every minute", "replicas": 11}}),
        &[
            ("FieldValueInvalid", pattern_msg, "spec.cronSpec"),
            (
                "FieldValueInvalid",
                "Invalid value: 11: spec.replicas in body should be less than or equal to 10",
                "spec.replicas",
            ),
        ],
    );
    // reference 048
    check(
        crontab(),
        json!({"spec": {"replicas": 0, "image": 7}}),
        &[
            (
                "FieldValueTypeInvalid",
                "Invalid value: \"integer\": spec.image in body must be of type string: \"integer\"",
                "spec.image",
            ),
            (
                "FieldValueInvalid",
                "Invalid value: 0: spec.replicas in body should be greater than or equal to 1",
                "spec.replicas",
            ),
            ("FieldValueRequired", "Required value", "spec.cronSpec"),
        ],
    );
    // number where integer expected; integral float accepted
    check(
        crontab(),
        json!({"spec": {"cronSpec": "* * * * *", "replicas": 1.5}}),
        &[(
            "FieldValueTypeInvalid",
            "Invalid value: \"number\": spec.replicas in body must be of type integer: \"number\"",
            "spec.replicas",
        )],
    );
    check(
        crontab(),
        json!({"spec": {"cronSpec": "* * * * *", "replicas": 2.0}}),
        &[],
    );
    // null for a non-nullable field
    check(
        crontab(),
        json!({"spec": {"cronSpec": null}}),
        &[(
            "FieldValueTypeInvalid",
            "Invalid value: \"null\": spec.cronSpec in body must be of type string: \"null\"",
            "spec.cronSpec",
        )],
    );
    check(
        json!({"type": "object", "properties": {"a": {"type": "string", "nullable": true}}}),
        json!({"a": null}),
        &[],
    );
    // enum
    check(
        json!({"type": "object", "properties": {"mode": {"type": "string", "enum": ["a", "b"]}}}),
        json!({"mode": "x"}),
        &[(
            "FieldValueNotSupported",
            "Unsupported value: \"x\": supported values: \"a\", \"b\"",
            "mode",
        )],
    );
    // a type error does not stop the enum check
    check(
        json!({"type": "object", "properties": {"mode": {"type": "string", "enum": ["a"]}}}),
        json!({"mode": 1}),
        &[
            (
                "FieldValueTypeInvalid",
                "Invalid value: \"integer\": mode in body must be of type string: \"integer\"",
                "mode",
            ),
            (
                "FieldValueNotSupported",
                "Unsupported value: 1: supported values: \"a\"",
                "mode",
            ),
        ],
    );
    // exclusive bounds and multipleOf
    check(
        json!({"type": "object", "properties": {"n": {"type": "number", "maximum": 5, "exclusiveMaximum": true,
               "minimum": 0.5, "exclusiveMinimum": true, "multipleOf": 2}}}),
        json!({"n": 5}),
        &[
            (
                "FieldValueInvalid",
                "Invalid value: 5: n in body should be a multiple of 2",
                "n",
            ),
            (
                "FieldValueInvalid",
                "Invalid value: 5: n in body should be less than 5",
                "n",
            ),
        ],
    );
    check(
        json!({"type": "object", "properties": {"n": {"type": "number", "minimum": 0.5, "exclusiveMinimum": true}}}),
        json!({"n": 0.5}),
        &[(
            "FieldValueInvalid",
            "Invalid value: 0.5: n in body should be greater than 0.5",
            "n",
        )],
    );
    // string lengths
    check(
        json!({"type": "object", "properties": {"s": {"type": "string", "maxLength": 3, "minLength": 2}}}),
        json!({"s": "abcd"}),
        &[(
            "FieldValueTooLong",
            "Too long: may not be more than 3 bytes",
            "s",
        )],
    );
    check(
        json!({"type": "object", "properties": {"s": {"type": "string", "minLength": 2}}}),
        json!({"s": "a"}),
        &[(
            "FieldValueInvalid",
            "Invalid value: \"a\": s in body should be at least 2 chars long",
            "s",
        )],
    );
    // arrays: bounds, items, uniqueness
    check(
        json!({"type": "object", "properties": {"l": {"type": "array", "maxItems": 2,
               "items": {"type": "integer", "maximum": 3}}}}),
        json!({"l": [1, 5, 2]}),
        &[
            (
                "FieldValueInvalid",
                "Invalid value: 5: l[1] in body should be less than or equal to 3",
                "l[1]",
            ),
            (
                "FieldValueTooMany",
                "Too many: 3: must have at most 2 items",
                "l",
            ),
        ],
    );
    check(
        json!({"type": "object", "properties": {"l": {"type": "array", "minItems": 1, "items": {"type": "string"}}}}),
        json!({"l": []}),
        &[(
            "FieldValueInvalid",
            "Invalid value: 0: l in body should have at least 1 items",
            "l",
        )],
    );
    check(
        json!({"type": "object", "properties": {"l": {"type": "array", "uniqueItems": true, "items": {"type": "string"}}}}),
        json!({"l": ["a", "a"]}),
        &[(
            "FieldValueInvalid",
            "Invalid value: \"\": l in body shouldn't contain duplicates",
            "l",
        )],
    );
    // maps: maxProperties and additionalProperties schemas
    check(
        json!({"type": "object", "properties": {"m": {"type": "object", "maxProperties": 1,
               "additionalProperties": {"type": "string"}}}}),
        json!({"m": {"a": "x", "b": "y"}}),
        &[(
            "FieldValueTooMany",
            "Too many: 2: must have at most 1 item",
            "m",
        )],
    );
    check(
        json!({"type": "object", "properties": {"m": {"type": "object", "additionalProperties": {"type": "string"}}}}),
        json!({"m": {"a": "x", "b": 1}}),
        &[(
            "FieldValueTypeInvalid",
            "Invalid value: \"integer\": m.b in body must be of type string: \"integer\"",
            "m.b",
        )],
    );
    // int-or-string
    check(
        json!({"type": "object", "properties": {"port": {"x-kubernetes-int-or-string": true}}}),
        json!({"port": "http"}),
        &[],
    );
    check(
        json!({"type": "object", "properties": {"port": {"x-kubernetes-int-or-string": true}}}),
        json!({"port": true}),
        &[(
            "FieldValueTypeInvalid",
            "Invalid value: \"boolean\": port in body must be of type integer-or-string: \"boolean\"",
            "port",
        )],
    );
    // string formats
    let fmt =
        |f: &str| json!({"type": "object", "properties": {"v": {"type": "string", "format": f}}});
    for (f, good, bad) in [
        ("date-time", "2024-11-20T10:00:00.000000Z", "yesterday"),
        ("date", "2024-11-20", "2024-13-01"),
        ("uuid", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "not-a-uuid"),
        ("byte", "aGVsbG8=", "***"),
        ("ipv4", "10.0.0.1", "10.0.0.256"),
        ("ipv6", "fd00::1", "fd00:::1"),
        ("cidr", "10.0.0.0/8", "10.0.0.0/33"),
    ] {
        check(fmt(f), json!({"v": good}), &[]);
        let msg = format!("Invalid value: \"{bad}\": v in body must be of type {f}: \"{bad}\"");
        check(
            fmt(f),
            json!({"v": bad}),
            &[("FieldValueTypeInvalid", &msg, "v")],
        );
    }
    check(fmt("k8s-custom"), json!({"v": "anything"}), &[]);
    // wrong container type stops deeper checks
    check(
        crontab(),
        json!({"spec": "nope"}),
        &[(
            "FieldValueTypeInvalid",
            "Invalid value: \"string\": spec in body must be of type object: \"string\"",
            "spec",
        )],
    );
}

#[test]
fn invalid_status_matches_reference() {
    let causes = StructuralSchema::from_json(&crontab())
        .map(|s| s.validate(&json!({"spec": {"cronSpec": "every minute", "replicas": 11}})))
        .unwrap_or_default();
    let status = invalid_status("CronTab", "stable.example.io", "bad-crontab", &causes);
    let want = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "CronTab.stable.example.io \"bad-crontab\" is invalid: [spec.cronSpec: Invalid value: \"every minute\": spec.cronSpec in body should match '^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$', spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10]",
        "reason": "Invalid",
        "details": {"name": "bad-crontab", "group": "stable.example.io", "kind": "CronTab", "causes": [
            {"reason": "FieldValueInvalid", "message": "Invalid value: \"every minute\": spec.cronSpec in body should match '^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$'", "field": "spec.cronSpec"},
            {"reason": "FieldValueInvalid", "message": "Invalid value: 11: spec.replicas in body should be less than or equal to 10", "field": "spec.replicas"}]},
        "code": 422});
    assert_eq!(status, want);

    // One cause (listed twice, reference 061): no brackets, both causes kept.
    let c = Cause::forbidden("metadata.finalizers", "no new finalizers");
    let status = invalid_status("Lease", "", "leader", &[c.clone(), c]);
    assert_eq!(
        status["message"],
        "Lease \"leader\" is invalid: metadata.finalizers: Forbidden: no new finalizers"
    );
    assert_eq!(
        status["details"]["causes"].as_array().map(Vec::len),
        Some(2)
    );
    assert!(status["details"].get("group").is_none());
}

fn check_prune(schema: Value, mut object: Value, want_object: Value, want_pruned: &[&str]) {
    let s = match StructuralSchema::from_json(&schema) {
        Ok(s) => s,
        Err(e) => panic!("schema did not parse: {e}"),
    };
    let pruned = s.prune(&mut object);
    assert_eq!(object, want_object);
    assert_eq!(pruned, want_pruned);
}

#[test]
fn pruning() {
    // reference 044/045: spec.colour and metadata.bogus are unknown
    check_prune(
        crontab(),
        json!({"apiVersion": "stable.example.io/v1", "kind": "CronTab", "metadata": {"name": "x", "bogus": 1},
               "spec": {"cronSpec": "* * * * */5", "colour": "blue"}}),
        json!({"apiVersion": "stable.example.io/v1", "kind": "CronTab", "metadata": {"name": "x"},
               "spec": {"cronSpec": "* * * * */5"}}),
        &["metadata.bogus", "spec.colour"],
    );
    // reference 076: preserve-unknown-fields spec keeps everything, top level does not
    let clusterthing = json!({"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}});
    check_prune(
        clusterthing,
        json!({"kind": "ClusterThing", "spec": {"anything": {"nested": [1, 2, {"x": true}]}, "size": "large"}, "extra": "pruned"}),
        json!({"kind": "ClusterThing", "spec": {"anything": {"nested": [1, 2, {"x": true}]}, "size": "large"}}),
        &["extra"],
    );
    // lists of objects, additionalProperties maps, embedded resources
    check_prune(
        json!({"type": "object", "properties": {
            "items": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}},
            "labels": {"type": "object", "additionalProperties": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "template": {"type": "object", "x-kubernetes-embedded-resource": true, "properties": {"spec": {"type": "object"}}}
        }}),
        json!({"items": [{"a": "1", "b": 2}], "labels": {"x": {"k": "v", "z": 1}},
               "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "oops": 1}, "spec": {"q": 1}, "w": 1}}),
        json!({"items": [{"a": "1"}], "labels": {"x": {"k": "v"}},
               "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}}),
        &[
            "items[0].b",
            "labels.x.z",
            "template.metadata.oops",
            "template.spec.q",
            "template.w",
        ],
    );
}

#[test]
fn cause_constructors() {
    let cases = [
        (
            Cause::required("metadata.name", ""),
            "FieldValueRequired",
            "metadata.name: Required value",
        ),
        (
            Cause::required("fieldManager", "is required for apply patch"),
            "FieldValueRequired",
            "fieldManager: Required value: is required for apply patch",
        ),
        (
            Cause::invalid(
                "spec.leaseDurationSeconds",
                &json!(0),
                "must be greater than 0",
            ),
            "FieldValueInvalid",
            "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0",
        ),
        (
            Cause::invalid(
                "metadata.name",
                &json!("Bad_Name"),
                "a lowercase RFC 1123 subdomain",
            ),
            "FieldValueInvalid",
            "metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain",
        ),
        (
            Cause::forbidden("spec", "no"),
            "FieldValueForbidden",
            "spec: Forbidden: no",
        ),
        (
            Cause::too_long("metadata.annotations", 1),
            "FieldValueTooLong",
            "metadata.annotations: Too long: may not be more than 1 byte",
        ),
        (
            Cause::duplicate("spec.ports[1]", &json!({"port": 80})),
            "FieldValueDuplicate",
            "spec.ports[1]: Duplicate value: {\"port\":80}",
        ),
        (
            Cause::not_found("spec.x", &json!(true)),
            "FieldValueNotFound",
            "spec.x: Not found: true",
        ),
        (
            Cause::not_supported("spec.type", &json!("X"), &[]),
            "FieldValueNotSupported",
            "spec.type: Unsupported value: \"X\"",
        ),
    ];
    for (c, reason, full) in cases {
        assert_eq!(c.reason, reason);
        assert_eq!(c.full_message(), full);
    }
}

#[test]
fn strict_error_and_warning_text() {
    let s = strict_decoding_error(
        "CronTab",
        "v1",
        &["metadata.bogus".to_string(), "spec.colour".to_string()],
    );
    assert_eq!(
        s,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "CronTab in version \"v1\" cannot be handled as a CronTab: strict decoding error: unknown field \"metadata.bogus\", unknown field \"spec.colour\"",
            "reason": "BadRequest", "code": 400})
    );
    assert_eq!(
        unknown_field_warning("spec.colour"),
        "299 - \"unknown field \\\"spec.colour\\\"\""
    );
}

#[test]
fn defaults() {
    let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "default": {},
    "properties": {
        "replicas": {"type": "integer", "default": 1},
        "mode": {"type": "string", "default": "auto"},
        "ports": {"type": "array", "items": {"type": "object", "properties": {"protocol": {"type": "string", "default": "TCP"}}}},
        "note": {"type": "string"},
        "keep": {"type": "string", "nullable": true}
    }},
    "labels": {"type": "object", "additionalProperties": {"type": "string"}}}});
    let s = match StructuralSchema::from_json(&schema) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let cases = [
        (json!({}), json!({"spec": {"replicas": 1, "mode": "auto"}})),
        (
            json!({"spec": {"replicas": 3, "mode": null, "ports": [{}]}}),
            json!({"spec": {"replicas": 3, "mode": "auto", "ports": [{"protocol": "TCP"}]}}),
        ),
        // null without a default disappears; nullable nulls stay
        (
            json!({"spec": {"note": null, "keep": null}, "labels": {"a": null, "b": "x"}}),
            json!({"spec": {"replicas": 1, "mode": "auto", "keep": null}, "labels": {"b": "x"}}),
        ),
    ];
    for (mut input, want) in cases {
        s.apply_defaults(&mut input);
        assert_eq!(input, want);
    }

    // After defaulting, a null required field reads as missing (as in kube).
    let ct = match StructuralSchema::from_json(&crontab()) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let mut obj = json!({"spec": {"cronSpec": null}});
    ct.apply_defaults(&mut obj);
    let causes = ct.validate(&obj);
    assert_eq!(causes.len(), 1);
    assert_eq!(causes[0].full_message(), "spec.cronSpec: Required value");
}

#[test]
fn schema_of_a_crd_version() {
    let with = json!({"name": "v1", "schema": {"openAPIV3Schema": crontab()}});
    let without = json!({"name": "v1"});
    let cases = [(with, 1), (without, 0)];
    for (version, causes) in cases {
        let s = match StructuralSchema::from_crd_version(&version) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let mut obj = json!({"kind": "CronTab", "spec": {"x": 1}, "extra": true});
        assert_eq!(s.validate(&obj).len(), causes, "{version}");
        let pruned = s.prune(&mut obj);
        assert_eq!(pruned.is_empty(), causes == 0, "{version}");
    }
}

#[test]
fn bad_schemas_are_rejected() {
    assert!(matches!(
        StructuralSchema::from_json(&json!({"type": "string", "pattern": "("})),
        Err(SchemaError::BadPattern { .. })
    ));
    assert!(matches!(
        StructuralSchema::from_json(&json!({"properties": {"a": 1}})),
        Err(SchemaError::NotAnObject { .. })
    ));
    assert!(matches!(
        StructuralSchema::from_json(&json!({"type": "integer", "maximum": "ten"})),
        Err(SchemaError::BadKeyword { .. })
    ));
}

#[test]
fn list_types_from_the_schema() {
    let s = match StructuralSchema::from_json(&json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "groups": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "properties": {
                    "members": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}}}},
            "byName": {"type": "object", "additionalProperties": {"type": "array", "x-kubernetes-list-type": "atomic", "items": {"type": "string"}}}}}}}))
    {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let keys = vec!["name".to_string()];
    type ListTypeCase<'a> = (&'a [&'a str], Option<(&'a str, &'a [String])>);
    let cases: Vec<ListTypeCase> = vec![
        (&["spec", "groups"], Some(("map", &keys))),
        (&["spec", "groups", "members"], Some(("set", &[]))),
        (&["spec", "byName", "x"], Some(("atomic", &[]))),
        (&["spec"], None),
        (&["spec", "nope"], None),
    ];
    for (path, want) in cases {
        assert_eq!(s.list_type(path), want, "{path:?}");
    }
}

mod properties {
    use proptest::prelude::*;
    use serde_json::{json, Map, Value};

    use super::super::StructuralSchema;
    use super::crontab;

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|i| json!(i)),
            (-1.0e6f64..1.0e6).prop_map(|f| json!(f)),
            "[a-z*/ 0-9]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    "(spec|status|cronSpec|replicas|image|metadata|name|x)",
                    inner,
                    0..5
                )
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<String, Value>>())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Any JSON given as a schema either parses or is rejected; a parsed
        /// one validates, prunes and defaults arbitrary documents without panicking.
        #[test]
        fn arbitrary_schemas_never_panic(schema in any_json(), mut obj in any_json()) {
            if let Ok(s) = StructuralSchema::from_json(&schema) {
                s.prune(&mut obj);
                s.apply_defaults(&mut obj);
                let _ = s.validate_update(&obj, Some(&obj.clone()));
            }
        }

        /// Pruning twice finds nothing the second time, and validation never panics.
        #[test]
        fn prune_is_idempotent(mut obj in any_json()) {
            let s = StructuralSchema::from_json(&crontab()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            s.prune(&mut obj);
            let again = s.prune(&mut obj);
            prop_assert!(again.is_empty(), "second prune removed {:?}", again);
            s.apply_defaults(&mut obj);
            let _ = s.validate(&obj);
        }
    }
}

fn rules_schema() -> Value {
    json!({"type": "object",
    "x-kubernetes-validations": [{"rule": "has(self.spec)", "message": "spec is required"}],
    "properties": {
    "spec": {"type": "object",
        "x-kubernetes-validations": [
            {"rule": "!has(self.replicas) || !has(self.maxReplicas) || self.replicas <= self.maxReplicas",
             "message": "replicas must not exceed maxReplicas"},
            {"rule": "!has(self.image) || self.image != 'forbidden'", "fieldPath": ".image",
             "reason": "FieldValueForbidden", "message": "this image may not be used"},
            {"rule": "!has(self.replicas) || self.replicas != 7",
             "messageExpression": "'replicas may not be ' + string(self.replicas)"},
            {"rule": "!has(self.mode) || !has(oldSelf.mode) || self.mode == oldSelf.mode", "message": "mode is immutable"}
        ],
        "properties": {
            "replicas": {"type": "integer"},
            "maxReplicas": {"type": "integer"},
            "image": {"type": "string", "x-kubernetes-validations": [{"rule": "self.size() >= 3"}]},
            "mode": {"type": "string"},
            "note": {"type": "string", "nullable": true},
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port"],
                      "items": {"type": "object", "properties": {"port": {"type": "integer"}, "name": {"type": "string"}},
                                "x-kubernetes-validations": [{"rule": "self.port > 0", "message": "port must be positive"}]}}
        }}}})
}

fn check_update(schema: Value, object: Value, old: Option<Value>, expected: &[(&str, &str, &str)]) {
    let s = match StructuralSchema::from_json(&schema) {
        Ok(s) => s,
        Err(e) => panic!("schema did not parse: {e}"),
    };
    let got: Vec<(String, String, String)> = s
        .validate_update(&object, old.as_ref())
        .into_iter()
        .map(|c| (c.reason, c.message, c.field))
        .collect();
    let want: Vec<(String, String, String)> = expected
        .iter()
        .map(|(r, m, f)| (r.to_string(), m.to_string(), f.to_string()))
        .collect();
    assert_eq!(got, want, "object: {object}");
}

#[test]
fn validation_rules() {
    check_update(
        rules_schema(),
        json!({"spec": {"replicas": 2, "maxReplicas": 3, "image": "abc", "note": null}}),
        None,
        &[],
    );
    check_update(
        rules_schema(),
        json!({"spec": {"replicas": 5, "maxReplicas": 3}}),
        None,
        &[(
            "FieldValueInvalid",
            "Invalid value: \"object\": replicas must not exceed maxReplicas",
            "spec",
        )],
    );
    check_update(
        rules_schema(),
        json!({"spec": {"image": "forbidden"}}),
        None,
        &[(
            "FieldValueForbidden",
            "Forbidden: this image may not be used",
            "spec.image",
        )],
    );
    check_update(
        rules_schema(),
        json!({"spec": {"replicas": 7}}),
        None,
        &[(
            "FieldValueInvalid",
            "Invalid value: \"object\": replicas may not be 7",
            "spec",
        )],
    );
    // A scalar rule without a message, and a rule on list items.
    check_update(
        rules_schema(),
        json!({"spec": {"image": "ab", "ports": [{"port": 80}, {"port": 0}]}}),
        None,
        &[
            (
                "FieldValueInvalid",
                "Invalid value: \"string\": failed rule: self.size() >= 3",
                "spec.image",
            ),
            (
                "FieldValueInvalid",
                "Invalid value: \"object\": port must be positive",
                "spec.ports[1]",
            ),
        ],
    );
    // The root rule reports at kube's nil path.
    check_update(
        rules_schema(),
        json!({"kind": "X"}),
        None,
        &[(
            "FieldValueInvalid",
            "Invalid value: \"object\": spec is required",
            "<nil>",
        )],
    );
    // Transition rules run only on updates.
    check_update(rules_schema(), json!({"spec": {"mode": "b"}}), None, &[]);
    check_update(
        rules_schema(),
        json!({"spec": {"mode": "b"}}),
        Some(json!({"spec": {"mode": "b"}})),
        &[],
    );
    check_update(
        rules_schema(),
        json!({"spec": {"mode": "b"}}),
        Some(json!({"spec": {"mode": "a"}})),
        &[(
            "FieldValueInvalid",
            "Invalid value: \"object\": mode is immutable",
            "spec",
        )],
    );
    // Blocking schema errors stop the rules.
    check_update(
        rules_schema(),
        json!({"spec": {"replicas": "many", "maxReplicas": 3}}),
        None,
        &[
            ("FieldValueTypeInvalid", "Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"", "spec.replicas"),
            ("FieldValueInvalid", "Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation", "<nil>"),
        ],
    );
    // Duplicates in set and map lists.
    check_update(
        rules_schema(),
        json!({"spec": {"tags": ["a", "b", "a"], "ports": [{"port": 80, "name": "x"}, {"port": 80, "name": "y"}]}}),
        None,
        &[
            (
                "FieldValueDuplicate",
                "Duplicate value: {\"port\":80}",
                "spec.ports[1]",
            ),
            (
                "FieldValueDuplicate",
                "Duplicate value: \"a\"",
                "spec.tags[2]",
            ),
        ],
    );
    assert!(matches!(
        StructuralSchema::from_json(
            &json!({"type": "object", "x-kubernetes-validations": [{"rule": "self.a ==="}]})
        ),
        Err(SchemaError::BadRule { .. })
    ));
}
