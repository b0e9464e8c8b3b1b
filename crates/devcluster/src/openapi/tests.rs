use serde_json::{json, Value};

use super::*;

fn crontab_schema() -> Value {
    json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "cronSpec": {"type": "string", "pattern": "^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$"},
            "replicas": {"type": "integer", "minimum": 1, "maximum": 10},
            "image": {"type": "string"}}, "required": ["cronSpec"]},
        "status": {"type": "object", "properties": {"replicas": {"type": "integer"}, "labelSelector": {"type": "string"}}}}})
}

fn resources() -> Vec<CrdResource> {
    vec![
        CrdResource {
            group: "stable.example.io".into(),
            version: "v1".into(),
            kind: "CronTab".into(),
            list_kind: "CronTabList".into(),
            plural: "crontabs".into(),
            singular: "crontab".into(),
            namespaced: true,
            schema: Some(crontab_schema()),
        },
        CrdResource {
            group: "stable.example.io".into(),
            version: "v1".into(),
            kind: "ClusterThing".into(),
            list_kind: "ClusterThingList".into(),
            plural: "clusterthings".into(),
            singular: "clusterthing".into(),
            namespaced: false,
            schema: None,
        },
        CrdResource {
            group: "coordination.k8s.io".into(),
            version: "v1".into(),
            kind: "Lease".into(),
            list_kind: "LeaseList".into(),
            plural: "leases".into(),
            singular: "lease".into(),
            namespaced: true,
            schema: None,
        },
    ]
}

#[test]
fn index_matches_reference_015() {
    let idx = v3_index(&[
        ("apis/stable.example.io/v1".to_string(), "ABC".to_string()),
        ("api/v1".to_string(), "DEF".to_string()),
    ]);
    assert_eq!(
        idx,
        json!({"paths": {
            "apis/stable.example.io/v1": {"serverRelativeURL": "/openapi/v3/apis/stable.example.io/v1?hash=ABC"},
            "api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=DEF"}}})
    );
    let h = document_hash(&idx);
    assert_eq!(h.len(), 128);
    assert!(h
        .chars()
        .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase()));
    assert_ne!(h, document_hash(&json!({})));
    assert_eq!(group_version_path("", "v1"), "api/v1");
    assert_eq!(group_version_path("apps", "v1"), "apis/apps/v1");
}

#[test]
fn schema_names() {
    let cases = [
        (
            "stable.example.io",
            "v1",
            "CronTab",
            "io.example.stable.v1.CronTab",
        ),
        ("", "v1", "Namespace", "io.k8s.api.core.v1.Namespace"),
        ("apps", "v1", "Deployment", "io.k8s.api.apps.v1.Deployment"),
        (
            "coordination.k8s.io",
            "v1",
            "Lease",
            "io.k8s.api.coordination.v1.Lease",
        ),
        (
            "rbac.authorization.k8s.io",
            "v1",
            "Role",
            "io.k8s.api.rbacauthorization.v1.Role",
        ),
        (
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition",
        ),
        (
            "apiregistration.k8s.io",
            "v1",
            "APIService",
            "io.k8s.kube-aggregator.pkg.apis.apiregistration.v1.APIService",
        ),
    ];
    for (g, v, k, want) in cases {
        assert_eq!(schema_name(g, v, k), want);
    }
}

#[test]
fn group_version_document_matches_reference_016() {
    let doc = v3_group_version("stable.example.io", "v1", &resources());
    assert_eq!(doc["openapi"], "3.0.0");
    assert_eq!(
        doc["info"],
        json!({"title": "Kubernetes CRD Swagger", "version": "v0.1.0"})
    );
    // The CronTab schema exactly as the reference publishes it.
    let want = json!({
        "type": "object",
        "properties": {
            "apiVersion": {"description": API_VERSION_DESCRIPTION, "type": "string"},
            "kind": {"description": KIND_DESCRIPTION, "type": "string"},
            "metadata": {"description": METADATA_DESCRIPTION,
                         "allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]},
            "spec": {"type": "object", "required": ["cronSpec"], "properties": {
                "cronSpec": {"type": "string", "pattern": "^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$"},
                "image": {"type": "string"},
                "replicas": {"type": "integer", "maximum": 10, "minimum": 1}}},
            "status": {"type": "object", "properties": {"labelSelector": {"type": "string"}, "replicas": {"type": "integer"}}}
        },
        "x-kubernetes-group-version-kind": [{"group": "stable.example.io", "kind": "CronTab", "version": "v1"}],
        "x-kubernetes-selectable-fields": []
    });
    assert_eq!(
        doc["components"]["schemas"]["io.example.stable.v1.CronTab"],
        want
    );
    // Only this group-version's kinds.
    assert!(doc["components"]["schemas"]
        .get("io.k8s.api.coordination.v1.Lease")
        .is_none());
    assert!(
        doc["components"]["schemas"]["io.example.stable.v1.CronTabList"]
            ["x-kubernetes-group-version-kind"][0]["kind"]
            == "CronTabList"
    );

    let item = &doc["paths"]["/apis/stable.example.io/v1/namespaces/{namespace}/crontabs/{name}"];
    assert_eq!(
        item["get"]["operationId"],
        "readStableExampleIoV1NamespacedCronTab"
    );
    assert_eq!(item["get"]["tags"], json!(["stableExampleIo_v1"]));
    assert_eq!(
        item["patch"]["operationId"],
        "patchStableExampleIoV1NamespacedCronTab"
    );
    assert_eq!(item["parameters"][0]["name"], "name");
    assert_eq!(item["parameters"][0]["description"], "name of the CronTab");
    assert_eq!(
        item["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/io.example.stable.v1.CronTab"
    );
    assert_eq!(
        item["patch"]["requestBody"]["content"]["application/merge-patch+json"]["schema"]["$ref"],
        "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Patch"
    );
    // The cluster-scoped resource has no namespace segment.
    assert!(doc["paths"]
        .get("/apis/stable.example.io/v1/clusterthings/{name}")
        .is_some());
    assert!(doc["paths"]
        .get("/apis/stable.example.io/v1/namespaces/{namespace}/clusterthings")
        .is_none());
    assert_eq!(
        doc["components"]["schemas"]["io.example.stable.v1.ClusterThing"]
            ["x-kubernetes-preserve-unknown-fields"],
        true
    );
}

/// What `kubectl explain` does with the document: find a GVK on an operation
/// of the resource's path, then the schema that lists it.
fn explain_lookup(doc: &Value, prefix: &str, plural: &str) -> Option<Value> {
    let searches = [
        format!("{prefix}/{plural}"),
        format!("{prefix}/{plural}/{{name}}"),
        format!("{prefix}/namespaces/{{namespace}}/{plural}"),
        format!("{prefix}/namespaces/{{namespace}}/{plural}/{{name}}"),
    ];
    let gvk = searches.iter().find_map(|p| {
        let item = doc["paths"].get(p)?;
        ["get", "post", "put", "patch", "delete"]
            .iter()
            .find_map(|m| {
                item.get(*m)?
                    .get("x-kubernetes-group-version-kind")
                    .cloned()
            })
    })?;
    doc["components"]["schemas"]
        .as_object()?
        .values()
        .find(|s| {
            s["x-kubernetes-group-version-kind"]
                .as_array()
                .is_some_and(|a| a.contains(&gvk))
        })
        .cloned()
}

/// What kubectl's fieldValidation support check does: the PATCH operation of
/// the GVK must offer the query parameter.
fn supports_field_validation(doc: &Value, gvk: &Value) -> bool {
    doc["paths"].as_object().is_some_and(|paths| {
        paths.values().any(|p| {
            p.get("patch").is_some_and(|op| {
                op["x-kubernetes-group-version-kind"] == *gvk
                    && op["parameters"].as_array().is_some_and(|ps| {
                        ps.iter()
                            .any(|q| q["name"] == "fieldValidation" && q["in"] == "query")
                    })
            })
        })
    })
}

fn all_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.push(r.clone());
            }
            m.values().for_each(|c| all_refs(c, out));
        }
        Value::Array(a) => a.iter().for_each(|c| all_refs(c, out)),
        _ => {}
    }
}

#[test]
fn kubectl_can_explain_and_validate() {
    let rs = resources();
    for (group, prefix, plural, kind) in [
        (
            "stable.example.io",
            "/apis/stable.example.io/v1",
            "crontabs",
            "CronTab",
        ),
        (
            "stable.example.io",
            "/apis/stable.example.io/v1",
            "clusterthings",
            "ClusterThing",
        ),
        (
            "coordination.k8s.io",
            "/apis/coordination.k8s.io/v1",
            "leases",
            "Lease",
        ),
    ] {
        let doc = v3_group_version(group, "v1", &rs);
        let schema = explain_lookup(&doc, prefix, plural);
        assert!(schema.is_some(), "explain finds {plural}");
        let gvk = json!({"group": group, "kind": kind, "version": "v1"});
        assert!(
            supports_field_validation(&doc, &gvk),
            "{kind} fieldValidation"
        );
        let mut refs = Vec::new();
        all_refs(&doc, &mut refs);
        for r in refs {
            let name = r.trim_start_matches("#/components/schemas/");
            assert!(
                doc["components"]["schemas"].get(name).is_some(),
                "dangling {r}"
            );
        }
    }
}

#[test]
fn swagger_v2_document() {
    let doc = v2_document(&resources());
    assert_eq!(doc["swagger"], "2.0");
    let ct = &doc["definitions"]["io.example.stable.v1.CronTab"];
    assert_eq!(
        ct["properties"]["metadata"]["$ref"],
        "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    );
    // Schema-less resources are not published in v2.
    assert!(doc["definitions"]
        .get("io.k8s.api.coordination.v1.Lease")
        .is_none());
    assert!(doc["definitions"]
        .get("io.example.stable.v1.ClusterThing")
        .is_none());
    let patch =
        &doc["paths"]["/apis/stable.example.io/v1/namespaces/{namespace}/crontabs/{name}"]["patch"];
    let params = patch["parameters"].as_array().cloned().unwrap_or_default();
    assert!(params
        .iter()
        .any(|p| p["name"] == "fieldValidation" && p["type"] == "string"));
    assert!(params.iter().any(|p| p["in"] == "body"));
    let mut refs = Vec::new();
    all_refs(&doc, &mut refs);
    assert!(!refs.is_empty());
    for r in refs {
        let name = r
            .strip_prefix("#/definitions/")
            .unwrap_or("<not a definitions ref>");
        assert!(doc["definitions"].get(name).is_some(), "dangling {r}");
    }
}

#[test]
fn resources_from_a_crd() {
    let crd = json!({"spec": {"group": "stable.example.io", "scope": "Cluster",
    "names": {"plural": "clusterthings", "singular": "clusterthing", "kind": "ClusterThing"},
    "versions": [
        {"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object"}}},
        {"name": "v0", "served": false, "storage": false}
    ]}});
    assert_eq!(
        CrdResource::from_crd(&crd),
        vec![CrdResource {
            group: "stable.example.io".into(),
            version: "v1".into(),
            kind: "ClusterThing".into(),
            list_kind: "ClusterThingList".into(),
            plural: "clusterthings".into(),
            singular: "clusterthing".into(),
            namespaced: false,
            schema: Some(json!({"type": "object"})),
        }]
    );
    assert!(CrdResource::from_crd(&json!({})).is_empty());
}

#[test]
fn builtin_schemas_explain_and_validate() {
    let kinds = [
        ("", "Namespace", "namespaces", true),
        ("", "ConfigMap", "configmaps", true),
        ("", "Secret", "secrets", true),
        ("", "ServiceAccount", "serviceaccounts", true),
        ("", "Service", "services", true),
        ("coordination.k8s.io", "Lease", "leases", true),
        ("discovery.k8s.io", "EndpointSlice", "endpointslices", true),
        ("apiregistration.k8s.io", "APIService", "apiservices", false),
        (
            "admissionregistration.k8s.io",
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies",
            false,
        ),
        (
            "admissionregistration.k8s.io",
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            false,
        ),
        (
            "admissionregistration.k8s.io",
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            false,
        ),
        (
            "admissionregistration.k8s.io",
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            false,
        ),
    ];
    for (group, kind, plural, namespaced) in kinds {
        let schema = builtin_schema(group, "v1", kind);
        assert!(schema.is_some(), "{kind}");
        // The schemas are structural: they parse and accept an empty object.
        let parsed = schema
            .as_ref()
            .map(crate::schema::StructuralSchema::from_json);
        assert!(matches!(parsed, Some(Ok(_))), "{kind}");
        let r = CrdResource {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            list_kind: format!("{kind}List"),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            namespaced,
            schema,
        };
        let doc = v3_group_version(group, "v1", &[r]);
        let prefix = format!("/{}", group_version_path(group, "v1"));
        let found = explain_lookup(&doc, &prefix, plural);
        assert!(
            found.is_some_and(|s| s["properties"]["metadata"].is_object()),
            "{kind}"
        );
    }
    assert!(builtin_schema("apps", "v1", "Deployment").is_none());
    let lease = builtin_schema("coordination.k8s.io", "v1", "Lease").unwrap_or_default();
    assert_eq!(
        lease["properties"]["spec"]["properties"]["holderIdentity"]["type"],
        "string"
    );
}

fn v2_request(accept: Option<&str>, if_none_match: Option<&str>) -> Response<Bytes> {
    let mut headers = HeaderMap::new();
    if let Some(a) = accept {
        headers.insert(header::ACCEPT, HeaderValue::from_str(a).expect("valid"));
    }
    if let Some(tag) = if_none_match {
        headers.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_str(tag).expect("valid"),
        );
    }
    v2_response(&v2_document(&resources()), &headers)
}

fn content_type(r: &Response<Bytes>) -> &str {
    r.headers()[header::CONTENT_TYPE].to_str().expect("valid")
}

#[test]
fn openapi_v2_is_json_without_an_accept_header_and_for_json_clauses() {
    for accept in [
        None,
        Some("*/*"),
        Some("application/json"),
        Some("application/json;as=Table;v=v1;g=meta.k8s.io"),
    ] {
        let r = v2_request(accept, None);
        assert_eq!(r.status(), 200, "{accept:?}");
        assert_eq!(content_type(&r), "application/json", "{accept:?}");
        let body: Value = serde_json::from_slice(r.body()).expect("valid");
        assert_eq!(body["swagger"], "2.0");
        assert_eq!(r.headers()[header::VARY], "Accept");
    }
}

#[test]
fn openapi_v2_is_protobuf_for_both_protobuf_subtypes_and_by_quality() {
    for accept in [
        "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
        "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
        "application/json;q=0.5, application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
    ] {
        let r = v2_request(Some(accept), None);
        assert_eq!(r.status(), 200, "{accept}");
        // The deprecated subtype is answered under the current name, as kube does.
        assert_eq!(content_type(&r), V2_PROTOBUF, "{accept}");
        let expected = v2_protobuf::encode_document(&v2_document(&resources())).expect("valid");
        assert_eq!(r.body()[..], expected[..]);
    }
}

#[test]
fn openapi_v2_refuses_an_accept_header_naming_no_served_form() {
    let r = v2_request(Some("application/yaml, text/html"), None);
    assert_eq!(r.status(), 406);
    assert!(r.body().is_empty());
}

#[test]
fn openapi_v2_etag_is_the_json_digest_in_both_forms_and_revalidates() {
    let json = v2_request(None, None);
    let proto = v2_request(Some(V2_PROTOBUF), None);
    let etag = json.headers()[header::ETAG]
        .to_str()
        .expect("valid")
        .to_string();
    assert_eq!(proto.headers()[header::ETAG].to_str().expect("valid"), etag);
    // Quoted upper-case hex of a SHA-512.
    assert_eq!(etag.len(), 2 + 128);
    assert!(etag[1..129]
        .chars()
        .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase()));
    let again = v2_request(Some(V2_PROTOBUF), Some(&etag));
    assert_eq!(again.status(), 304);
    assert!(again.body().is_empty());
    let other = v2_request(None, Some("\"0\""));
    assert_eq!(other.status(), 200);
}

#[test]
fn every_published_v2_document_encodes_as_protobuf() {
    let doc = v2_document(&resources());
    let bytes = v2_protobuf::encode_document(&doc).expect("valid");
    // Every definition name appears in the message.
    for name in doc["definitions"].as_object().expect("valid").keys() {
        let needle = name.as_bytes();
        assert!(bytes.windows(needle.len()).any(|w| w == needle), "{name}");
    }
}
