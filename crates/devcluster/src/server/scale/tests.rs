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
