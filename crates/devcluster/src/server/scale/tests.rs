use super::*;
use serde_json::json;

/// What `NestedInt64` answers for `.spec.replicas` of `obj`.
fn check(obj: Value, expected: Result<Option<i64>, &str>) {
    let got = nested_int64(&obj, ".spec.replicas");
    assert_eq!(got, expected.map_err(str::to_string), "{obj}");
}

#[test]
fn replicas_are_read_as_kube_s_nested_int64_reads_them() {
    check(json!({"spec": {"replicas": 3}}), Ok(Some(3)));
    check(
        json!({"spec": {"replicas": 4294967298_i64}}),
        Ok(Some(4294967298)),
    );
    check(json!({"spec": {}}), Ok(None));
    check(json!({}), Ok(None));
    check(json!({"spec": null}), Ok(None));
    check(
        json!({"spec": {"replicas": "3"}}),
        Err(".spec.replicas accessor error: 3 is of the type string, expected int64"),
    );
    check(
        json!({"spec": {"replicas": 1.5}}),
        Err(".spec.replicas accessor error: 1.5 is of the type float64, expected int64"),
    );
    check(
        json!({"spec": {"replicas": 1e6}}),
        Err(".spec.replicas accessor error: 1e+06 is of the type float64, expected int64"),
    );
    check(
        json!({"spec": {"replicas": 18446744073709551615_u64}}),
        Err(".spec.replicas accessor error: 1.8446744073709552e+19 is of the type float64, expected int64"),
    );
    check(
        json!({"spec": {"replicas": null}}),
        Err(".spec.replicas accessor error: <nil> is of the type <nil>, expected int64"),
    );
    check(
        json!({"spec": {"replicas": {"b": [1, "x"], "a": true}}}),
        Err(".spec.replicas accessor error: map[a:true b:[1 x]] is of the type map[string]interface {}, expected int64"),
    );
    check(
        json!({"spec": "x"}),
        Err(".spec.replicas accessor error: x is of the type string, expected map[string]interface{}"),
    );
}

#[test]
fn a_selector_is_read_as_kube_s_nested_string_reads_it() {
    let obj = json!({"status": {"selector": "app=a", "n": 2}});
    assert_eq!(
        nested_string(&obj, ".status.selector"),
        Ok(Some("app=a".into()))
    );
    assert_eq!(nested_string(&obj, ".status.missing"), Ok(None));
    assert_eq!(
        nested_string(&obj, ".status.n"),
        Err(".status.n accessor error: 2 is of the type int64, expected string".into())
    );
}

#[test]
fn a_built_in_s_selector_is_printed_as_kube_s_label_selector_as_selector_prints_it() {
    let check = |selector: Value, expected: Result<&str, &str>| {
        let obj = json!({"spec": {"replicas": 1, "selector": selector}});
        let expected = expected.map(str::to_string).map_err(str::to_string);
        assert_eq!(builtin_selector(&obj), expected, "{obj}");
    };
    check(Value::Null, Ok(""));
    check(json!({}), Ok(""));
    check(json!({"matchLabels": {"app": "d"}}), Ok("app=d"));
    check(
        json!({"matchLabels": {"tier": "web", "app": "d"},
            "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["prod", "dev"]},
                {"key": "canary", "operator": "DoesNotExist"}]}),
        Ok("app=d,!canary,env notin (dev,prod),tier=web"),
    );
    check(
        json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
        Err("\"Gt\" is not a valid label selector operator"),
    );
    assert_eq!(
        builtin_selector(&json!({"spec": {"replicas": 1}})),
        Ok("".into())
    );
}

/// `IsQualifiedName`'s complaint about a name part.
const NAME_PART: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
/// `IsDNS1123Subdomain`'s complaint about the characters.
const SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// What `ValidateScale` finds in a built-in's Scale of `metadata` and
/// `replicas`: each cause as `<field>: <message>`.
fn check_scale(metadata: Value, replicas: i64, expected: &[String]) {
    let scale = json!({"metadata": metadata, "spec": {"replicas": replicas}});
    let got: Vec<String> = builtin_scale_causes(&scale)
        .iter()
        .map(Cause::full_message)
        .collect();
    assert_eq!(got, expected, "{scale}");
}

#[test]
fn a_built_in_s_scale_is_validated_as_kube_s_validate_scale_validates_it() {
    let valid = json!({"name": "d", "namespace": "default", "generateName": "d-",
        "generation": 0, "labels": {"app": "d", "empty": ""},
        "annotations": {"Example.com/Note": "anything at all"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "K", "name": "n", "uid": "u"}],
        "finalizers": ["kubernetes", "orphan", "example.com/f"]});
    check_scale(valid, 0, &[]);
    check_scale(json!({}), 2, &[]);
    check_scale(
        json!({}),
        -1,
        &["spec.replicas: Invalid value: -1: must be greater than or equal to 0".into()],
    );
    check_scale(
        json!({"generation": -2}),
        1,
        &["metadata.generation: Invalid value: -2: must be greater than or equal to 0".into()],
    );
    check_scale(
        json!({"labels": {"bad key": "bad value!"}, "annotations": {"Bad Key": "x", "OK": "y"}}),
        1,
        &[
            format!("metadata.labels: Invalid value: \"bad key\": {NAME_PART}"),
            format!(
                "metadata.labels: Invalid value: \"bad value!\": {}",
                crproxy_core::selector::label_value_errors("bad value!")[0]
            ),
            format!("metadata.annotations: Invalid value: \"Bad Key\": {NAME_PART}"),
        ],
    );
    check_scale(
        json!({"ownerReferences": [{}, {"apiVersion": "a/b/c", "kind": "K", "name": "n", "uid": "u"},
            {"apiVersion": "apps/", "kind": "K", "name": "n", "uid": "u"}]}),
        1,
        &[
            "metadata.ownerReferences.apiVersion: Invalid value: \"\": version must not be empty".into(),
            "metadata.ownerReferences.kind: Invalid value: \"\": must not be empty".into(),
            "metadata.ownerReferences.name: Invalid value: \"\": must not be empty".into(),
            "metadata.ownerReferences.uid: Invalid value: \"\": must not be empty".into(),
            "metadata.ownerReferences.apiVersion: Invalid value: \"a/b/c\": version must not be empty".into(),
            "metadata.ownerReferences.apiVersion: Invalid value: \"apps/\": version must not be empty".into(),
        ],
    );
    check_scale(
        json!({"finalizers": ["orphan", "custom", "foregroundDeletion", "Bad/x"]}),
        1,
        &[
            format!("metadata.finalizers: Invalid value: \"Bad/x\": prefix part {SUBDOMAIN}"),
            "metadata.finalizers: Invalid value: []string{\"orphan\", \"custom\", \"foregroundDeletion\", \"Bad/x\"}: finalizer orphan and foregroundDeletion cannot be both set".into(),
            "metadata.finalizers[1]: Invalid value: \"custom\": name is neither a standard finalizer name nor is it fully qualified".into(),
        ],
    );
}

#[test]
fn a_generate_name_is_checked_with_its_trailing_dash_masked_as_kube_masks_it() {
    let check = |prefix: &str, valid: bool| {
        let metadata = json!({"generateName": prefix});
        let expected: Vec<String> = if valid {
            vec![]
        } else {
            vec![format!(
                "metadata.generateName: Invalid value: {}: {SUBDOMAIN}",
                go_text::quoted(prefix)
            )]
        };
        check_scale(metadata, 1, &expected);
    };
    check("web-", true);
    check("w-", true);
    // kube masks the last two bytes: the dot before the dash goes too.
    check("web.-", true);
    check("Web-", false);
    check("web--", true);
    check("-", false);
    check("we_b", false);
    // The cut falls inside the é: kube checks the byte left of it, and refuses.
    check("é-", false);
}
