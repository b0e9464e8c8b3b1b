use chrono::{DateTime, TimeZone, Utc};
use serde_json::{json, Value};

use super::*;

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 11, 20, 12, 0, 0)
        .single()
        .unwrap_or_default()
}

fn crontab_version() -> Value {
    json!({"name": "v1", "additionalPrinterColumns": [
        {"name": "Spec", "type": "string", "jsonPath": ".spec.cronSpec"},
        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    ]})
}

fn crontab(name: &str, spec: &str, replicas: i64, created: &str) -> Value {
    json!({"apiVersion": "stable.example.io/v1", "kind": "CronTab",
        "metadata": {"name": name, "namespace": "ref-crud", "resourceVersion": "7", "creationTimestamp": created,
                     "labels": {"app": "cron"}},
        "spec": {"cronSpec": spec, "replicas": replicas}})
}

#[test]
fn crd_table_matches_reference_022() {
    let cols = columns_for_crd_version(&crontab_version());
    let objs = vec![
        crontab("my-crontab", "* * * * */5", 1, "2024-11-20T11:59:57Z"),
        crontab("second-crontab", "0 */2 * * *", 2, "2024-11-18T09:00:00Z"),
    ];
    let table = render_table(
        &cols,
        &objs,
        IncludeObject::Metadata,
        json!({"resourceVersion": "9"}),
        now(),
    );
    let want_defs = json!([
        {"name": "Name", "type": "string", "format": "name", "description": NAME_DESCRIPTION, "priority": 0},
        {"name": "Spec", "type": "string", "format": "", "description": "Custom resource definition column (in JSONPath format): .spec.cronSpec", "priority": 0},
        {"name": "Replicas", "type": "integer", "format": "", "description": "Custom resource definition column (in JSONPath format): .spec.replicas", "priority": 0},
        {"name": "Age", "type": "date", "format": "", "description": "Custom resource definition column (in JSONPath format): .metadata.creationTimestamp", "priority": 0}
    ]);
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(table["metadata"], json!({"resourceVersion": "9"}));
    assert_eq!(table["columnDefinitions"], want_defs);
    assert_eq!(
        table["rows"][0]["cells"],
        json!(["my-crontab", "* * * * */5", 1, "3s"])
    );
    assert_eq!(
        table["rows"][1]["cells"],
        json!(["second-crontab", "0 */2 * * *", 2, "2d3h"])
    );
    assert_eq!(
        table["rows"][0]["object"],
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": objs[0]["metadata"]})
    );

    let none = render_table(&cols, &objs, IncludeObject::None, json!({}), now());
    assert_eq!(none["rows"][0]["object"], Value::Null);
    let full = render_table(&cols, &objs, IncludeObject::Object, json!({}), now());
    assert_eq!(full["rows"][1]["object"], objs[1]);
}

#[test]
fn crd_cells_for_missing_and_mistyped_values() {
    let version = json!({"additionalPrinterColumns": [
        {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status", "priority": 1, "description": "ready?"},
        {"name": "Count", "type": "integer", "jsonPath": ".spec.count"},
        {"name": "Ratio", "type": "number", "jsonPath": ".spec.count"},
        {"name": "On", "type": "boolean", "jsonPath": ".spec.on"},
        {"name": "When", "type": "date", "jsonPath": ".spec.when"},
        {"name": "Obj", "type": "string", "jsonPath": ".spec.obj"}
    ]});
    let cols = columns_for_crd_version(&version);
    assert_eq!(cols[1].priority, 1);
    assert_eq!(cols[1].description, "ready?");
    let cases = [
        (
            json!({"metadata": {"name": "a"}}),
            json!(["a", null, null, null, null, null, null]),
        ),
        (
            json!({"metadata": {"name": "b"},
                   "status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]},
                   "spec": {"count": 2.7, "on": "yes", "when": "not a time", "obj": {"b": 1, "a": [1, "x"]}}}),
            json!(["b", "True", 2, 2.7, null, "<invalid>", "map[a:[1 x] b:1]"]),
        ),
    ];
    for (obj, want) in cases {
        let t = render_table(&cols, &[obj], IncludeObject::None, json!({}), now());
        assert_eq!(t["rows"][0]["cells"], want);
    }
}

#[test]
fn crd_without_columns_gets_name_and_age() {
    let cols = columns_for_crd_version(&json!({"name": "v1"}));
    let names: Vec<&str> = cols.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["Name", "Age"]);
    assert_eq!(cols[1].type_, "date");
    assert_eq!(cols[1].description, CREATION_TIMESTAMP_DESCRIPTION);
}

#[test]
fn human_duration_like_kube() {
    let cases = [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (3, "3s"),
        (119, "119s"),
        (120, "2m"),
        (303, "5m3s"),
        (600, "10m"),
        (3 * 3600 - 1, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 240, "3h4m"),
        (9 * 3600, "9h"),
        (47 * 3600, "47h"),
        (2 * 86400 + 3 * 3600, "2d3h"),
        (3 * 86400, "3d"),
        (40 * 86400, "40d"),
        (3 * 365 * 86400 + 20 * 86400, "3y20d"),
        (9 * 365 * 86400, "9y"),
    ];
    for (secs, want) in cases {
        assert_eq!(
            human_duration(chrono::Duration::seconds(secs)),
            want,
            "{secs}s"
        );
    }
}

#[test]
fn jsonpath_subset() {
    let doc = json!({"metadata": {"name": "x", "labels": {"a.b/c": "v"}},
        "spec": {"items": [{"name": "i0", "port": 80}, {"name": "i1", "port": 443}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Synced", "status": "False"}]}});
    let cases: &[(&str, Vec<Value>)] = &[
        (".metadata.name", vec![json!("x")]),
        ("{.metadata.name}", vec![json!("x")]),
        ("metadata.name", vec![json!("x")]),
        (".metadata.labels['a.b/c']", vec![json!("v")]),
        (".spec.items[1].port", vec![json!(443)]),
        (".spec.items[-1].name", vec![json!("i1")]),
        (".spec.items[*].name", vec![json!("i0"), json!("i1")]),
        (".spec.items[?(@.port==80)].name", vec![json!("i0")]),
        (
            ".status.conditions[?(@.type==\"Ready\")].status",
            vec![json!("True")],
        ),
        (
            ".status.conditions[?(@.type!='Ready')].type",
            vec![json!("Synced")],
        ),
        (".spec.missing.deeper", vec![]),
        (".spec.items[7]", vec![]),
    ];
    for (expr, want) in cases {
        let got: Vec<Value> = match jsonpath(expr, &doc) {
            Ok(v) => v.into_iter().cloned().collect(),
            Err(e) => panic!("{expr}: {e}"),
        };
        assert_eq!(&got, want, "{expr}");
    }
    assert!(jsonpath(".a[?(@.x>1)]", &doc).is_err());
    assert!(jsonpath(".a..b", &doc).is_err());
}

#[test]
fn builtin_tables() {
    let created = "2024-11-20T11:00:00Z";
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "namespaces",
            json!({"metadata": {"name": "ns", "creationTimestamp": created}, "status": {"phase": "Active"}}),
            json!(["ns", "Active", "60m"]),
        ),
        (
            "configmaps",
            json!({"metadata": {"name": "cm", "creationTimestamp": created}, "data": {"a": "1", "b": "2"}, "binaryData": {"c": ""}}),
            json!(["cm", 3, "60m"]),
        ),
        (
            "secrets",
            json!({"metadata": {"name": "s", "creationTimestamp": created}, "type": "Opaque"}),
            json!(["s", "Opaque", 0, "60m"]),
        ),
        (
            "leases",
            json!({"metadata": {"name": "l", "creationTimestamp": created}, "spec": {}}),
            json!(["l", "", "60m"]),
        ),
        (
            "services",
            json!({"metadata": {"name": "svc", "creationTimestamp": created},
            "spec": {"type": "NodePort", "clusterIP": "10.0.0.1", "ports": [{"port": 443, "protocol": "TCP", "nodePort": 30443}, {"port": 53, "protocol": "UDP"}],
                     "selector": {"app": "x"}}}),
            json!([
                "svc",
                "NodePort",
                "10.0.0.1",
                "<none>",
                "443:30443/TCP,53/UDP",
                "60m",
                "app=x"
            ]),
        ),
        (
            "apiservices",
            json!({"metadata": {"name": "v1.example.com", "creationTimestamp": created},
            "spec": {"service": {"namespace": "kube-system", "name": "proxy"}},
            "status": {"conditions": [{"type": "Available", "status": "False", "reason": "MissingEndpoints"}]}}),
            json!([
                "v1.example.com",
                "kube-system/proxy",
                "False (MissingEndpoints)",
                "60m"
            ]),
        ),
        (
            "apiservices",
            json!({"metadata": {"name": "v1.", "creationTimestamp": created}, "spec": {},
            "status": {"conditions": [{"type": "Available", "status": "True", "reason": "Local"}]}}),
            json!(["v1.", "Local", "True", "60m"]),
        ),
        (
            "endpointslices",
            json!({"metadata": {"name": "e", "creationTimestamp": created}, "addressType": "IPv4",
            "ports": [{"port": 9100}], "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2", "10.0.0.3", "10.0.0.4"]}]}),
            json!([
                "e",
                "IPv4",
                "9100",
                "10.0.0.1,10.0.0.2,10.0.0.3 + 1 more...",
                "60m"
            ]),
        ),
        (
            "customresourcedefinitions",
            json!({"metadata": {"name": "crontabs.stable.example.io", "creationTimestamp": "2024-11-20T11:00:00.000Z"}}),
            json!(["crontabs.stable.example.io", "2024-11-20T11:00:00Z"]),
        ),
        (
            "widgets",
            json!({"metadata": {"name": "w"}}),
            json!(["w", "<unknown>"]),
        ),
        (
            "services",
            json!({"metadata": {"name": "ext", "creationTimestamp": created},
            "spec": {"type": "ExternalName", "externalName": "example.com"}}),
            json!([
                "ext",
                "ExternalName",
                "<none>",
                "example.com",
                "<none>",
                "60m",
                "<none>"
            ]),
        ),
        (
            "validatingadmissionpolicies",
            json!({"metadata": {"name": "vap", "creationTimestamp": created},
            "spec": {"validations": [{"expression": "true"}, {"expression": "false"}]}}),
            json!(["vap", 2, "<unset>", "60m"]),
        ),
        (
            "validatingadmissionpolicybindings",
            json!({"metadata": {"name": "b", "creationTimestamp": created},
            "spec": {"policyName": "vap", "paramRef": {"name": "p", "namespace": "ns"}}}),
            json!(["b", "vap", "ns/p", "60m"]),
        ),
        (
            "validatingwebhookconfigurations",
            json!({"metadata": {"name": "hooks", "creationTimestamp": created},
            "webhooks": [{"name": "a.example.com"}, {"name": "b.example.com"}]}),
            json!(["hooks", 2, "60m"]),
        ),
        (
            "rolebindings",
            json!({"metadata": {"name": "rb", "creationTimestamp": created},
            "roleRef": {"kind": "ClusterRole", "name": "view"}}),
            json!(["rb", "ClusterRole/view", "60m"]),
        ),
    ];
    for (resource, obj, want) in cases {
        let cols = builtin_columns(resource);
        let t = render_table(&cols, &[obj], IncludeObject::None, json!({}), now());
        assert_eq!(t["rows"][0]["cells"], want, "{resource}");
        assert_eq!(
            t["columnDefinitions"].as_array().map(Vec::len),
            Some(cols.len())
        );
    }
}

#[test]
fn partial_metadata_list_matches_reference_021() {
    let items = vec![
        crontab("a", "* * * * *", 1, "2024-11-20T11:00:00Z"),
        crontab("b", "* * * * *", 1, "2024-11-20T11:00:00Z"),
    ];
    let list = partial_object_metadata_list(&items, json!({"resourceVersion": "12"}));
    assert_eq!(
        list,
        json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": "12"},
               "items": [
                 {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": items[0]["metadata"]},
                 {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": items[1]["metadata"]}]})
    );
    assert_eq!(IncludeObject::parse(""), Some(IncludeObject::Metadata));
    assert_eq!(IncludeObject::parse("None"), Some(IncludeObject::None));
    assert_eq!(IncludeObject::parse("bogus"), None);
}

mod properties {
    use proptest::prelude::*;
    use serde_json::json;

    use super::super::jsonpath;

    proptest! {
        /// Arbitrary expressions never panic.
        #[test]
        fn jsonpath_never_panics(expr in "[.\\[\\]a-z0-9*?@=!'\"(){}$-]{0,24}") {
            let doc = json!({"a": [{"b": 1}, {"b": "x"}], "c": {"d": null}});
            let _ = jsonpath(&expr, &doc);
        }
    }
}
