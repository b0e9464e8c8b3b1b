use super::*;
use crate::fake_api::gateways_resource;
use crproxy_core::config::sync::Scope;
use serde_json::json;

fn found(version: &str) -> Discovered {
    Discovered {
        version: version.into(),
        kind: "Gateway".into(),
        scope: Scope::Namespaced,
        status_subresource: true,
    }
}

#[test]
fn a_new_generated_crd_is_schemaless_with_derived_names_status_and_the_annotation() {
    let crd = generated_crd(&gateways_resource(), &found("v1"), None).expect("crd");
    assert_eq!(crd["metadata"]["name"], "gateways.example.net");
    assert_eq!(
        crd["metadata"]["annotations"][GENERATED_FROM],
        "aggregated-apiserver"
    );
    assert_eq!(
        crd["spec"]["names"],
        json!({"plural": "gateways", "singular": "gateway", "kind": "Gateway", "listKind": "GatewayList"})
    );
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    let versions = crd["spec"]["versions"].as_array().expect("versions");
    assert_eq!(versions.len(), 1);
    assert_eq!(versions[0]["name"], "v1");
    assert_eq!(versions[0]["served"], true);
    assert_eq!(versions[0]["storage"], true);
    assert_eq!(
        versions[0]["schema"]["openAPIV3Schema"],
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
    );
    assert_eq!(versions[0]["subresources"], json!({"status": {}}));
}

#[test]
fn a_crd_without_the_annotation_is_refused_naming_it() {
    let theirs = json!({"metadata": {"name": "gateways.example.net"}, "spec": {"versions": []}});
    let err =
        generated_crd(&gateways_resource(), &found("v1"), Some(&theirs)).expect_err("refused");
    assert!(err.contains("gateways.example.net"), "{err}");
    assert!(
        err.contains("vcluster.loft.sh/generated-from: aggregated-apiserver"),
        "{err}"
    );
    let other = json!({"metadata": {"annotations": {GENERATED_FROM: "something-else"}}});
    assert!(generated_crd(&gateways_resource(), &found("v1"), Some(&other)).is_err());
}

#[test]
fn a_version_change_keeps_old_versions_stored_but_not_served() {
    let v1 = generated_crd(&gateways_resource(), &found("v1"), None).expect("v1");
    let mut existing = v1.clone();
    existing["metadata"]["resourceVersion"] = json!("7");
    existing["metadata"]["managedFields"] = json!([{"manager": "x"}]);
    let v2 = generated_crd(&gateways_resource(), &found("v2"), Some(&existing)).expect("v2");
    let versions = v2["spec"]["versions"].as_array().expect("versions");
    let names: Vec<_> = versions.iter().map(|v| v["name"].clone()).collect();
    assert_eq!(names, [json!("v1"), json!("v2")]);
    assert_eq!(versions[0]["served"], false);
    assert_eq!(versions[0]["storage"], false);
    assert_eq!(versions[1]["served"], true);
    assert_eq!(versions[1]["storage"], true);
    // An update: the resourceVersion stays for the replace, managedFields go.
    assert_eq!(v2["metadata"]["resourceVersion"], "7");
    assert!(v2["metadata"].get("managedFields").is_none());
    // Going back serves v1 again and stops serving v2; both are kept.
    let back = generated_crd(&gateways_resource(), &found("v1"), Some(&v2)).expect("back");
    let versions = back["spec"]["versions"].as_array().expect("versions");
    assert_eq!(versions.len(), 2);
    assert_eq!(versions[0]["served"], true);
    assert_eq!(versions[1]["served"], false);
    // Unchanged input gives an unchanged spec (no write at start-up).
    let again = generated_crd(&gateways_resource(), &found("v1"), Some(&back)).expect("again");
    assert_eq!(again["spec"], back["spec"]);
}
