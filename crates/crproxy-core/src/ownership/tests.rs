use super::*;
use serde_json::json;

fn owner() -> Owner {
    Owner::new("client", "default")
}

const OWNED_LABELS: &str =
    r#"{"vcluster.com/owner-vcluster":"client","vcluster.com/owner-project":"default"}"#;

fn check_inject(body_type: BodyType, input: &str, expected: Result<Value, &str>) {
    let got = inject_owner_labels(&owner(), body_type, input.as_bytes());
    match (got, expected) {
        (Ok(bytes), Ok(want)) => {
            let v: Value = serde_json::from_slice(&bytes).expect("output is JSON");
            assert_eq!(v, want, "{body_type:?} {input}");
        }
        (Err(e), Err(prefix)) => {
            assert!(
                e.to_string().starts_with(prefix),
                "{body_type:?} {input}: {e}"
            );
        }
        (got, want) => panic!("{body_type:?} {input}: got {got:?}, want {want:?}"),
    }
}

#[test]
fn inject_object_bodies() {
    let labels: Value = serde_json::from_str(OWNED_LABELS).expect("json");
    let with = |extra: Value| {
        let mut l = labels.clone();
        if let (Some(l), Some(e)) = (l.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                l.insert(k.clone(), v.clone());
            }
        }
        l
    };
    for bt in [
        BodyType::Json,
        BodyType::MergePatch,
        BodyType::StrategicMergePatch,
        BodyType::Yaml,
        BodyType::ApplyPatchYaml,
    ] {
        let rows: Vec<(&str, Result<Value, &str>)> = vec![
            (r#"{}"#, Ok(json!({"metadata": {"labels": labels}}))),
            (
                r#"{"metadata": null}"#,
                Ok(json!({"metadata": {"labels": labels}})),
            ),
            (
                r#"{"metadata": {"name": "a"}}"#,
                Ok(json!({"metadata": {"name": "a", "labels": labels}})),
            ),
            (
                r#"{"metadata": {"labels": null}}"#,
                Ok(json!({"metadata": {"labels": labels}})),
            ),
            (
                r#"{"metadata": {"labels": {"app": "x"}}, "spec": {"metadata": {"labels": {"keep": "me"}}}}"#,
                Ok(
                    json!({"metadata": {"labels": with(json!({"app": "x"}))}, "spec": {"metadata": {"labels": {"keep": "me"}}}}),
                ),
            ),
            // Caller values, including null (a delete in a merge patch), are overridden.
            (
                r#"{"metadata": {"labels": {"vcluster.com/owner-vcluster": "other", "vcluster.com/owner-project": null}}}"#,
                Ok(json!({"metadata": {"labels": labels}})),
            ),
            // A kind ending in "List" with `items` is still the one object kube
            // stores: its own labels are the owner's, its items are data.
            (
                r#"{"kind": "WidgetList", "metadata": {"labels": {"vcluster.com/owner-vcluster": "victim"}}, "items": [{"metadata": {"name": "a"}}, 1]}"#,
                Ok(json!({"kind": "WidgetList", "metadata": {"labels": labels},
                    "items": [{"metadata": {"name": "a"}}, 1]})),
            ),
            (
                r#"{"kind": "PlayList", "spec": {}}"#,
                Ok(json!({"kind": "PlayList", "spec": {}, "metadata": {"labels": labels}})),
            ),
            (
                r#"{"metadata": "x"}"#,
                Err("request body has an unexpected shape"),
            ),
            (
                r#"{"metadata": {"labels": ["a"]}}"#,
                Err("request body has an unexpected shape"),
            ),
            (r#"[]"#, Err("request body has an unexpected shape")),
            (r#"null"#, Err("request body has an unexpected shape")),
        ];
        for (input, want) in rows {
            check_inject(bt, input, want);
        }
    }
}

#[test]
fn inject_rejects_unparsable() {
    let json_only = [
        BodyType::Json,
        BodyType::MergePatch,
        BodyType::StrategicMergePatch,
        BodyType::JsonPatch,
    ];
    for bt in json_only {
        check_inject(bt, "", Err("request body is not valid JSON"));
        check_inject(bt, "{", Err("request body is not valid JSON"));
        check_inject(bt, "apiVersion: v1", Err("request body is not valid JSON"));
    }
    // CBOR / protobuf bytes.
    let cbor = [0xd9, 0xd9, 0xf7, 0xa1, 0x61, 0x61, 0x01];
    let proto = b"k8s\x00\n\x0b\n\x02v1\x12\x05Thing";
    for bt in [BodyType::Json, BodyType::Yaml, BodyType::ApplyPatchYaml] {
        assert!(
            inject_owner_labels(&owner(), bt, &cbor).is_err(),
            "{bt:?} cbor"
        );
        assert!(
            inject_owner_labels(&owner(), bt, proto).is_err(),
            "{bt:?} protobuf"
        );
    }
    check_inject(
        BodyType::Yaml,
        "a: [",
        Err("request body is not a single valid YAML document"),
    );
    check_inject(
        BodyType::ApplyPatchYaml,
        "- a\n- b\n",
        Err("request body has an unexpected shape"),
    );
}

#[test]
fn inject_yaml_documents() {
    let labels: Value = serde_json::from_str(OWNED_LABELS).expect("json");
    let apply = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n  labels:\n    app: web\n    vcluster.com/owner-vcluster: someone-else\nspec:\n  replicas: 3\n  enabled: true\n  note: \"3\"\n";
    let mut want_labels = labels.clone();
    if let Some(l) = want_labels.as_object_mut() {
        l.insert("app".into(), json!("web"));
    }
    check_inject(
        BodyType::ApplyPatchYaml,
        apply,
        Ok(json!({"apiVersion": "example.com/v1", "kind": "Widget",
                   "metadata": {"name": "w", "labels": want_labels},
                   "spec": {"replicas": 3, "enabled": true, "note": "3"}})),
    );
    check_inject(
        BodyType::Yaml,
        "kind: Widget\n",
        Ok(json!({"kind": "Widget", "metadata": {"labels": labels}})),
    );
    // kubectl apply --server-side sends JSON with this content type.
    check_inject(
        BodyType::ApplyPatchYaml,
        r#"{"kind":"Widget"}"#,
        Ok(json!({"kind": "Widget", "metadata": {"labels": labels}})),
    );
}

#[test]
fn inject_json_patch() {
    let rows: Vec<(&str, Result<Value, &str>)> = vec![
        (
            "[]",
            Ok(json!([
                {"op": "add", "path": "/metadata/labels/vcluster.com~1owner-vcluster", "value": "client"},
                {"op": "add", "path": "/metadata/labels/vcluster.com~1owner-project", "value": "default"},
            ])),
        ),
        (
            r#"[{"op":"remove","path":"/metadata/labels/vcluster.com~1owner-vcluster"},{"op":"replace","path":"/spec/x","value":1}]"#,
            Ok(json!([
                {"op": "remove", "path": "/metadata/labels/vcluster.com~1owner-vcluster"},
                {"op": "replace", "path": "/spec/x", "value": 1},
                {"op": "add", "path": "/metadata/labels/vcluster.com~1owner-vcluster", "value": "client"},
                {"op": "add", "path": "/metadata/labels/vcluster.com~1owner-project", "value": "default"},
            ])),
        ),
        (
            r#"{"op":"add"}"#,
            Err("request body has an unexpected shape"),
        ),
    ];
    for (input, want) in rows {
        check_inject(BodyType::JsonPatch, input, want);
    }
}

#[test]
fn json_patch_result_keeps_ownership() {
    // Applying the rewritten patch to an owned object leaves it owned, whatever the
    // caller tried to change.
    let doc = json!({"metadata": {"labels": serde_json::from_str::<Value>(OWNED_LABELS).expect("json")}, "spec": {"x": 0}});
    let caller = r#"[{"op":"replace","path":"/metadata/labels/vcluster.com~1owner-vcluster","value":"thief"},{"op":"remove","path":"/metadata/labels/vcluster.com~1owner-project"}]"#;
    let out =
        inject_owner_labels(&owner(), BodyType::JsonPatch, caller.as_bytes()).expect("injects");
    let patch: json_patch::Patch = serde_json::from_slice(&out).expect("valid patch");
    let mut patched = doc.clone();
    json_patch::patch(&mut patched, &patch).expect("applies");
    assert!(owner().owns(&patched));
}

#[test]
fn body_types() {
    let rows = [
        ("application/json", Some(BodyType::Json)),
        ("application/json; charset=utf-8", Some(BodyType::Json)),
        ("Application/JSON", Some(BodyType::Json)),
        ("application/yaml", Some(BodyType::Yaml)),
        ("application/merge-patch+json", Some(BodyType::MergePatch)),
        ("application/json-patch+json", Some(BodyType::JsonPatch)),
        (
            "application/apply-patch+yaml",
            Some(BodyType::ApplyPatchYaml),
        ),
        (
            "application/apply-patch+yaml;charset=utf-8",
            Some(BodyType::ApplyPatchYaml),
        ),
        (
            "application/strategic-merge-patch+json",
            Some(BodyType::StrategicMergePatch),
        ),
        ("application/vnd.kubernetes.protobuf", None),
        ("application/cbor", None),
        ("application/apply-patch+cbor", None),
        ("text/plain", None),
        ("", None),
    ];
    for (ct, want) in rows {
        assert_eq!(from_content_type(ct), want, "{ct}");
        if let Some(bt) = want {
            assert_eq!(BodyType::from_content_type(bt.media_type()), Some(bt));
        }
    }
}

#[test]
fn ownership_checks() {
    let o = owner();
    let rows = [
        (
            json!({"metadata": {"labels": {"vcluster.com/owner-vcluster": "client", "vcluster.com/owner-project": "default"}}}),
            true,
        ),
        (
            json!({"metadata": {"labels": {"vcluster.com/owner-vcluster": "client"}}}),
            false,
        ),
        (
            json!({"metadata": {"labels": {"vcluster.com/owner-vcluster": "client", "vcluster.com/owner-project": "p-default"}}}),
            false,
        ),
        (
            json!({"metadata": {"labels": {"vcluster.com/owner-vcluster": "Client", "vcluster.com/owner-project": "default"}}}),
            false,
        ),
        (
            json!({"metadata": {"labels": {"vcluster.com/owner-vcluster": ["client"], "vcluster.com/owner-project": "default"}}}),
            false,
        ),
        (json!({"metadata": {}}), false),
        (json!({}), false),
        (json!("x"), false),
    ];
    for (obj, want) in rows {
        assert_eq!(o.owns(&obj), want, "{obj}");
        assert_eq!(
            o.selector()
                .matches_json(obj.get("metadata").and_then(|m| m.get("labels"))),
            want,
            "{obj}"
        );
    }
    assert_eq!(
        o.selector().to_string(),
        "vcluster.com/owner-project=default,vcluster.com/owner-vcluster=client"
    );
}

fn check_query(input: Option<&str>, expected: Result<&str, &str>) {
    let got = scoped_query(input, &owner()).map_err(|e| e.to_string());
    assert_eq!(
        got.as_deref(),
        expected.map_err(|e| e.to_owned()).as_deref(),
        "{input:?}"
    );
}

const OWNER_SEL: &str =
    "vcluster.com%2Fowner-project%3Ddefault%2Cvcluster.com%2Fowner-vcluster%3Dclient";

#[test]
fn scoped_queries() {
    let rows: Vec<(Option<&str>, Result<String, &str>)> = vec![
        (None, Ok(format!("labelSelector={OWNER_SEL}"))),
        (Some(""), Ok(format!("labelSelector={OWNER_SEL}"))),
        (Some("limit=500&watch=true"), Ok(format!("limit=500&watch=true&labelSelector={OWNER_SEL}"))),
        (
            Some("limit=500&labelSelector=app%3Dweb&resourceVersion=0"),
            Ok(format!("limit=500&labelSelector=app%3Dweb%2C{OWNER_SEL}&resourceVersion=0")),
        ),
        // Two selectors: kube reads the first (Go's Convert_Slice_string_To_string),
        // with '+' for spaces and encoded commas, and ignores the second; other
        // params keep their original encoding.
        (
            Some("labelSelector=tier+in+%28a%2Cb%29&fieldSelector=metadata.name%3Dx&labelSelector=app"),
            Ok(format!("labelSelector=tier%20in%20%28a%2Cb%29%2C{OWNER_SEL}&fieldSelector=metadata.name%3Dx")),
        ),
        (Some("label%53elector=app"), Ok(format!("labelSelector=app%2C{OWNER_SEL}"))),
        (Some("labelSelector="), Ok(format!("labelSelector={OWNER_SEL}"))),
        (Some("labelSelector"), Ok(format!("labelSelector={OWNER_SEL}"))),
        (Some("labelSelector=app+in+%28cron"), Err("unable to parse requirement: found '', expected: ',' or ')'")),
        // A second selector kube ignores cannot fail the request either.
        (Some("labelSelector=app&labelSelector=app+in+%28cron"), Ok(format!("labelSelector=app%2C{OWNER_SEL}"))),
        // A pair Go's query parser drops (a ';', a bad escape) is not the first
        // selector kube reads; the next one is. Neither goes to the target.
        (Some("labelSelector=x;y&labelSelector=app"), Ok(format!("labelSelector=app%2C{OWNER_SEL}"))),
        (Some("labelSelector=x%zz&labelSelector=app"), Ok(format!("labelSelector=app%2C{OWNER_SEL}"))),
        (Some("label%53elector=x%zz&labelSelector=app"), Ok(format!("labelSelector=app%2C{OWNER_SEL}"))),
        // Pairs Go drops are not forwarded, whatever their name.
        (Some("label%5=y&limit=1;2&labelSelector=app"), Ok(format!("labelSelector=app%2C{OWNER_SEL}"))),
        (Some("labelSelector=app%2"), Ok(format!("labelSelector={OWNER_SEL}"))),
    ];
    for (input, want) in rows {
        check_query(input, want.as_deref().map_err(|e| *e));
    }
}

/// A query the target's Go would drop whole for its length (and the owner
/// selector with it) is refused: at most `MAX_SCOPED_QUERY_PARAMS` parameters
/// with the owner selector, counted as Go counts them; empty ones are dropped.
#[test]
fn a_query_padded_past_the_limit_is_refused() {
    let padding = |n: usize| vec!["x=1"; n].join("&");
    let at_limit = padding(MAX_SCOPED_QUERY_PARAMS - 1);
    let scoped = scoped_query(Some(&at_limit), &owner()).expect("at the limit");
    assert_eq!(scoped.split('&').count(), MAX_SCOPED_QUERY_PARAMS);
    // The caller's own selector takes the owner's place.
    let with_selector = format!("{}&labelSelector=app", padding(MAX_SCOPED_QUERY_PARAMS - 1));
    assert!(scoped_query(Some(&with_selector), &owner()).is_ok());
    let empty_pairs = format!("{at_limit}{}", "&".repeat(20_000));
    assert!(scoped_query(Some(&empty_pairs), &owner()).is_ok());
    for count in [MAX_SCOPED_QUERY_PARAMS, 10_000] {
        let refused = scoped_query(Some(&padding(count)), &owner());
        assert_eq!(
            refused,
            Err(ScopeError::TooManyParameters {
                count: count + 1,
                max: MAX_SCOPED_QUERY_PARAMS
            })
        );
    }
    assert_eq!(
        ScopeError::TooManyParameters {
            count: 101,
            max: 100
        }
        .to_string(),
        "the query has 101 parameters; a list or watch may have at most 100"
    );
}

#[test]
fn caller_selector_cannot_widen() {
    let o = owner();
    let other = BTreeMapLabels::new("other", "default");
    let mine = BTreeMapLabels::new("client", "default");
    for caller in [
        "vcluster.com/owner-vcluster!=client",
        "vcluster.com/owner-vcluster in (client,other)",
        "vcluster.com/owner-vcluster notin (client)",
        "!vcluster.com/owner-vcluster",
        "vcluster.com/owner-project in (default,x)",
        "",
    ] {
        let q = format!(
            "labelSelector={}",
            percent_encoding::utf8_percent_encode(caller, percent_encoding::NON_ALPHANUMERIC)
        );
        let scoped = scoped_query(Some(&q), &o).expect("valid");
        let (_, v) = scoped.split_once('=').expect("one param");
        let decoded = crate::request::go_query_unescape(v).expect("escaped as Go reads it");
        let sel = LabelSelector::parse(&decoded).expect("parses");
        assert!(!sel.matches(&other.0), "{caller} widened to another owner");
        // Narrowing stays possible: mine matches only when the caller's selector does.
        let caller_sel = LabelSelector::parse(caller).expect("valid");
        assert_eq!(
            sel.matches(&mine.0),
            caller_sel.matches(&mine.0),
            "{caller}"
        );
    }
}

struct BTreeMapLabels(std::collections::BTreeMap<String, String>);

impl BTreeMapLabels {
    fn new(name: &str, project: &str) -> Self {
        let mut m = std::collections::BTreeMap::new();
        m.insert(OWNER_VCLUSTER_LABEL.to_owned(), name.to_owned());
        m.insert(OWNER_PROJECT_LABEL.to_owned(), project.to_owned());
        BTreeMapLabels(m)
    }
}

#[test]
fn visibility() {
    let owned_meta =
        json!({"name": "a", "labels": serde_json::from_str::<Value>(OWNED_LABELS).expect("json")});
    let other_meta = json!({"name": "a", "labels": {"vcluster.com/owner-vcluster": "x", "vcluster.com/owner-project": "default"}});
    let table = |rows: Value| json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "columnDefinitions": [], "rows": rows});
    let rows: Vec<(Value, Visibility)> = vec![
        (
            json!({"kind": "Widget", "metadata": owned_meta}),
            Visibility::Owned,
        ),
        (
            json!({"kind": "Widget", "metadata": other_meta}),
            Visibility::NotOwned,
        ),
        (
            json!({"kind": "Widget", "metadata": {"name": "a"}}),
            Visibility::NotOwned,
        ),
        (
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": owned_meta}),
            Visibility::Owned,
        ),
        (
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": other_meta}),
            Visibility::NotOwned,
        ),
        (
            table(
                json!([{"cells": ["a"], "object": {"kind": "PartialObjectMetadata", "metadata": owned_meta}}]),
            ),
            Visibility::Owned,
        ),
        (
            table(
                json!([{"cells": ["a"], "object": {"kind": "Widget", "metadata": owned_meta, "spec": {}}}]),
            ),
            Visibility::Owned,
        ),
        (
            table(json!([{"cells": ["a"], "object": {"metadata": other_meta}}])),
            Visibility::NotOwned,
        ),
        (
            table(
                json!([{"cells": ["a"], "object": {"metadata": owned_meta}}, {"cells": ["b"], "object": {"metadata": other_meta}}]),
            ),
            Visibility::NotOwned,
        ),
        // includeObject=None: no object to judge.
        (table(json!([{"cells": ["a"]}])), Visibility::Undecodable),
        (
            table(json!([{"cells": ["a"], "object": null}])),
            Visibility::Undecodable,
        ),
        (
            table(json!([{"cells": ["a"], "object": {"kind": "X"}}])),
            Visibility::Undecodable,
        ),
        (table(json!([])), Visibility::Undecodable),
        (
            json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1"}),
            Visibility::Undecodable,
        ),
        // A "Table" of another group is just an object.
        (
            json!({"kind": "Table", "apiVersion": "furniture.io/v1", "metadata": owned_meta}),
            Visibility::Owned,
        ),
        (json!({"kind": "Widget"}), Visibility::Undecodable),
        (json!([]), Visibility::Undecodable),
    ];
    for (body, want) in rows {
        let bytes = serde_json::to_vec(&body).expect("json");
        assert_eq!(response_visibility(&owner(), &bytes), want, "{body}");
    }
    assert_eq!(
        response_visibility(&owner(), b"\x0a\x0b protobuf"),
        Visibility::Undecodable
    );
    assert_eq!(response_visibility(&owner(), b""), Visibility::Undecodable);
}

/// The scan reads text, not a parsed document: key order, escapes, repeated keys
/// and bytes in values it skips must not change its verdict.
#[test]
fn visibility_scan_reads_the_text_like_a_parser() {
    let cases: [(&[u8], Visibility); 11] = [
        // `rows` before `kind`: the Table is recognised after its rows were read.
        (
            br#"{"rows":[{"object":{"metadata":{"labels":{"vcluster.com/owner-vcluster":"client","vcluster.com/owner-project":"default"}}}}],"kind":"Table","apiVersion":"meta.k8s.io/v1"}"#,
            Visibility::Owned,
        ),
        // Escaped keys and values are compared unescaped.
        (
            br#"{"\u006detadata":{"labels":{"vcluster.com\/owner-vcluster":"cl\u0069ent","vcluster.com/owner-project":"default"}}}"#,
            Visibility::Owned,
        ),
        // A repeated key counts with its last value, as in a parsed document.
        (
            br#"{"metadata":{"labels":{"vcluster.com/owner-vcluster":"client","vcluster.com/owner-project":"default","vcluster.com/owner-vcluster":"other"}}}"#,
            Visibility::NotOwned,
        ),
        (
            br#"{"metadata":{"labels":{"vcluster.com/owner-vcluster":"other","vcluster.com/owner-project":"default","vcluster.com/owner-vcluster":"client"}}}"#,
            Visibility::Owned,
        ),
        (
            br#"{"metadata":{"labels":{"vcluster.com/owner-vcluster":"client","vcluster.com/owner-project":"default"}},"metadata":"gone"}"#,
            Visibility::Undecodable,
        ),
        // Labels that are not strings, or labels that are not an object.
        (
            br#"{"metadata":{"labels":{"vcluster.com/owner-vcluster":["client"],"vcluster.com/owner-project":"default"}}}"#,
            Visibility::NotOwned,
        ),
        (
            br#"{"metadata":{"labels":["vcluster.com/owner-vcluster","client"]}}"#,
            Visibility::NotOwned,
        ),
        // Values the scan does not read as text are skipped like any other,
        // however a parser would take them; only the owner labels decide.
        (
            br#"{"kind":1e400,"metadata":{"labels":{"vcluster.com/owner-vcluster":"client","vcluster.com/owner-project":"default"}}}"#,
            Visibility::Owned,
        ),
        (
            br#"{"metadata":{"labels":"\ud800"}}"#,
            Visibility::NotOwned,
        ),
        // Trailing text after the document, and a document cut short.
        (br#"{"metadata":{}} {}"#, Visibility::Undecodable),
        (br#"{"metadata":{},"spec":{"#, Visibility::Undecodable),
    ];
    for (body, want) in cases {
        assert_eq!(
            response_visibility(&owner(), body),
            want,
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    // Invalid UTF-8 in a value the scan skips still makes the answer unreadable.
    let mut body =
        br#"{"metadata":{"labels":{"vcluster.com/owner-vcluster":"client","vcluster.com/owner-project":"default"}},"spec":{"x":""}}"#.to_vec();
    let at = body.len() - 3;
    body.insert(at, 0xff);
    assert_eq!(
        response_visibility(&owner(), &body),
        Visibility::Undecodable
    );
}

/// The verdict of a parsed document (the definition the scan must agree with).
fn visibility_of_parsed(owner: &Owner, body: &[u8]) -> Visibility {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Visibility::Undecodable;
    };
    let Some(obj) = v.as_object() else {
        return Visibility::Undecodable;
    };
    let is_table = obj.get("kind").and_then(Value::as_str) == Some("Table")
        && obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|a| a.starts_with("meta.k8s.io/"));
    if is_table {
        let Some(rows) = obj.get("rows").and_then(Value::as_array) else {
            return Visibility::Undecodable;
        };
        if rows.is_empty() {
            return Visibility::Undecodable;
        }
        let mut all_owned = true;
        for row in rows {
            let Some(object) = row.get("object").filter(|o| o.is_object()) else {
                return Visibility::Undecodable;
            };
            if !object.get("metadata").is_some_and(Value::is_object) {
                return Visibility::Undecodable;
            }
            all_owned &= owner.owns(object);
        }
        return if all_owned {
            Visibility::Owned
        } else {
            Visibility::NotOwned
        };
    }
    if !obj.get("metadata").is_some_and(Value::is_object) {
        return Visibility::Undecodable;
    }
    if owner.owns(&v) {
        Visibility::Owned
    } else {
        Visibility::NotOwned
    }
}

#[test]
fn accept_rewriting() {
    let rows: [(Option<&str>, &str); 10] = [
        (None, "application/json"),
        (Some(""), "application/json"),
        (Some("*/*"), "application/json"),
        (Some("application/vnd.kubernetes.protobuf"), "application/json"),
        (Some("application/vnd.kubernetes.protobuf,application/json"), "application/json"),
        (Some("application/cbor, application/json;q=0.9"), "application/json;q=0.9"),
        (
            Some("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"),
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
        ),
        (
            Some("application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        ),
        (Some("application/json;q=0"), "application/json"),
        (Some("application/yaml, text/html"), "application/json"),
    ];
    for (input, want) in rows {
        assert_eq!(inspectable_accept(input), want, "{input:?}");
    }
}

#[test]
fn an_accept_that_needs_no_change_is_borrowed_as_it_came() {
    let table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    for unchanged in ["application/json", table, "Application/JSON;q=0.5"] {
        let rewritten = inspectable_accept(Some(unchanged));
        assert!(
            matches!(rewritten, std::borrow::Cow::Borrowed(text) if std::ptr::eq(text, unchanged)),
            "{unchanged:?} became {rewritten:?}"
        );
    }
    // Spaces between ranges are tidied away, so the value is written anew.
    let spaced = "application/json, application/json;as=Table;v=v1;g=meta.k8s.io";
    assert!(matches!(
        inspectable_accept(Some(spaced)),
        std::borrow::Cow::Owned(_)
    ));
}

mod properties {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The rewriting as it was written before it could borrow the caller's
    /// text: every range trimmed, the JSON ones kept and joined.
    fn accept_rewritten_by_joining(accept: Option<&str>) -> String {
        let kept: Vec<&str> = accept
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|range| is_inspectable_range(range))
            .collect();
        if kept.is_empty() {
            "application/json".to_owned()
        } else {
            kept.join(",")
        }
    }

    /// Accept values made of ranges a caller may send, spaced or not.
    fn accept_strategy() -> impl Strategy<Value = String> {
        let range = prop::sample::select(vec![
            "application/json",
            " application/json",
            "application/json ",
            "Application/JSON",
            "application/json;as=Table;v=v1;g=meta.k8s.io",
            "application/json ; q=0.5",
            "application/json;q=0",
            "application/vnd.kubernetes.protobuf",
            "*/*",
            "",
            " ",
        ]);
        prop::collection::vec(range, 0..5).prop_map(|ranges| ranges.join(","))
    }

    proptest! {
        #[test]
        fn a_borrowed_accept_is_what_joining_the_kept_ranges_gives(
            accept in prop_oneof![accept_strategy(), ".{0,40}"],
            absent in any::<bool>(),
        ) {
            let accept = (!absent).then_some(accept.as_str());
            let rewritten = inspectable_accept(accept);
            prop_assert_eq!(rewritten.as_ref(), accept_rewritten_by_joining(accept));
            if let std::borrow::Cow::Borrowed(text) = &rewritten {
                prop_assert!(Some(*text) == accept || *text == "application/json");
            }
        }
    }

    const FRAGMENTS: [&str; 12] = [
        "vcluster.com/owner-vcluster!=client",
        "vcluster.com/owner-vcluster in (client,other)",
        "vcluster.com/owner-vcluster notin (client)",
        "vcluster.com/owner-vcluster=other",
        "vcluster.com/owner-vcluster",
        "!vcluster.com/owner-vcluster",
        "vcluster.com/owner-project in (default,x)",
        "!vcluster.com/owner-project",
        "app=web",
        "app",
        "!app",
        "app notin (web)",
    ];

    /// JSON documents made of the keys and values the ownership verdict depends on.
    fn document_strategy() -> impl Strategy<Value = Value> {
        let leaf = prop::sample::select(vec![
            json!("Table"),
            json!("meta.k8s.io/v1"),
            json!("example.com/v1"),
            json!("client"),
            json!("default"),
            json!("other"),
            json!(null),
            json!(1),
            json!(true),
            json!([]),
            json!({}),
        ]);
        let keys = prop::sample::select(vec![
            "kind",
            "apiVersion",
            "metadata",
            "labels",
            "rows",
            "object",
            OWNER_VCLUSTER_LABEL,
            OWNER_PROJECT_LABEL,
            "spec",
        ]);
        leaf.prop_recursive(6, 64, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(keys.clone(), inner, 0..6).prop_map(|m| Value::Object(
                    m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
                )),
            ]
        })
    }

    /// Query pairs Go's `url.ParseQuery` drops, some of them selectors that
    /// would match nothing the fragments above make.
    const PAIRS_GO_DROPS: [&str; 5] = [
        "labelSelector=app%3Dnone;x",
        "labelSelector=app%3",
        "labelSelector=%zzapp",
        "labelSelector%g0=app%3Dnone",
        ";labelSelector=app%3Dnone",
    ];

    fn labels_strategy() -> impl Strategy<Value = BTreeMap<String, String>> {
        (
            prop::option::of(prop::sample::select(vec!["client", "other", ""])),
            prop::option::of(prop::sample::select(vec!["default", "x", ""])),
            prop::option::of(prop::sample::select(vec!["web", "db"])),
        )
            .prop_map(|(vc, project, app)| {
                let mut m = BTreeMap::new();
                if let Some(v) = vc {
                    m.insert(OWNER_VCLUSTER_LABEL.to_owned(), v.to_owned());
                }
                if let Some(p) = project {
                    m.insert(OWNER_PROJECT_LABEL.to_owned(), p.to_owned());
                }
                if let Some(a) = app {
                    m.insert("app".to_owned(), a.to_owned());
                }
                m
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Whatever selectors the caller sends (one or several parameters, among
        /// pairs Go drops), the scoped query matches exactly the matches of the
        /// one kube reads, the first Go keeps, that this owner owns; the dropped
        /// pairs are not sent on.
        #[test]
        fn scoped_query_never_widens(
            params in prop::collection::vec(prop::collection::vec(prop::sample::select(FRAGMENTS.to_vec()), 0..3), 0..3),
            dropped in prop::collection::vec((0..4usize, prop::sample::select(PAIRS_GO_DROPS.to_vec())), 0..3),
            labels in labels_strategy(),
        ) {
            let o = owner();
            let mut query = vec!["limit=5".to_owned()];
            let mut caller = LabelSelector::everything();
            for (at, p) in params.iter().enumerate() {
                let text = p.join(",");
                let selector = LabelSelector::parse(&text).expect("fragments are valid");
                if at == 0 {
                    caller = selector;
                }
                query.push(format!(
                    "labelSelector={}",
                    percent_encoding::utf8_percent_encode(&text, percent_encoding::NON_ALPHANUMERIC)
                ));
            }
            for (at, pair) in dropped {
                query.insert(at.min(query.len()), pair.to_owned());
            }
            let scoped = scoped_query(Some(&query.join("&")), &o).expect("valid");
            prop_assert!(
                PAIRS_GO_DROPS.iter().all(|pair| !scoped.split('&').any(|sent| sent == *pair)),
                "{}", scoped
            );
            let pairs = crate::request::query_pairs(Some(&scoped));
            let selectors: Vec<&(String, String)> = pairs.iter().filter(|(k, _)| k == "labelSelector").collect();
            prop_assert_eq!(selectors.len(), 1);
            prop_assert_eq!(&pairs[0], &("limit".to_owned(), "5".to_owned()));
            let sel = LabelSelector::parse(&selectors[0].1).expect("canonical");
            let object = serde_json::json!({"metadata": {"labels": labels}});
            prop_assert_eq!(sel.matches(&labels), caller.matches(&labels) && o.owns(&object));
        }

        #[test]
        fn never_panics_on_arbitrary_input(body in prop::collection::vec(any::<u8>(), 0..64), text in ".{0,48}") {
            let o = owner();
            for bt in [BodyType::Json, BodyType::Yaml, BodyType::MergePatch, BodyType::JsonPatch, BodyType::ApplyPatchYaml, BodyType::StrategicMergePatch] {
                let _ = inject_owner_labels(&o, bt, &body);
                let _ = inject_owner_labels(&o, bt, text.as_bytes());
            }
            let _ = response_visibility(&o, &body);
            let _ = scoped_query(Some(&text), &o);
            let _ = inspectable_accept(Some(&text));
            let _ = BodyType::from_content_type(&text);
        }

        /// The scan gives a parsed document's verdict on documents built from the
        /// keys and values that decide it, nested in every way.
        #[test]
        fn visibility_scan_agrees_with_a_parsed_document(doc in document_strategy()) {
            let body = serde_json::to_vec(&doc).expect("json");
            let o = owner();
            prop_assert_eq!(response_visibility(&o, &body), visibility_of_parsed(&o, &body), "{}", doc);
        }

        /// A successful injection always yields a body whose every object is owned.
        #[test]
        fn injected_documents_are_owned(text in "\\{(\"metadata\":(null|\\{\\}|\\{\"labels\":(null|\\{\\}|\\{\"vcluster\\.com/owner-vcluster\":(null|\"x\")\\})\\}))?\\}") {
            let o = owner();
            if let Ok(out) = inject_owner_labels(&o, BodyType::MergePatch, text.as_bytes()) {
                let v: Value = serde_json::from_slice(&out).expect("json");
                prop_assert!(o.owns(&v), "{}", text);
            } else {
                prop_assert!(false, "valid JSON object rejected: {}", text);
            }
        }
    }
}
