use super::*;
use crproxy_core::config::sync::{Direction, Scope, SyncResource};
use serde_json::json;

fn version(name: &str, served: bool, storage: bool, field: &str) -> Value {
    json!({
        "name": name, "served": served, "storage": storage,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {field: {"type": "string"}}}}}},
        "subresources": {"status": {}},
        "additionalPrinterColumns": [{"name": "F", "type": "string", "jsonPath": format!(".spec.{field}")}],
    })
}

fn host_crd(versions: Vec<Value>) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "backups.example.org", "uid": "host-uid", "resourceVersion": "5"},
        "spec": {
            "group": "example.org", "scope": "Namespaced",
            "names": {"plural": "backups", "singular": "backup", "kind": "Backup", "listKind": "BackupList"},
            "versions": versions,
            "conversion": {"strategy": "Webhook", "webhook": {"clientConfig": {"url": "https://host-only.svc/convert"}, "conversionReviewVersions": ["v1"]}},
        },
    })
}

fn resource(version: Option<&str>, scope: Scope, direction: Direction) -> SyncResource {
    SyncResource {
        direction,
        key: "backups.example.org".into(),
        plural: "backups".into(),
        group: "example.org".into(),
        version: version.map(str::to_owned),
        scope,
        patches: vec![],
        mappings: vec![],
    }
}

#[test]
fn first_copy_takes_the_synced_version_without_the_webhook() {
    let host = host_crd(vec![
        version("v1", true, true, "a"),
        version("v2", true, false, "b"),
    ]);
    let copy = tenant_crd(&host, "v1", None).expect("copy");
    assert_eq!(copy["spec"]["conversion"], json!({"strategy": "None"}));
    assert_eq!(copy["spec"]["names"]["kind"], "Backup");
    assert_eq!(copy["metadata"]["name"], "backups.example.org");
    assert!(
        copy["metadata"].get("uid").is_none(),
        "host metadata is not copied"
    );
    let versions = copy["spec"]["versions"].as_array().expect("versions");
    assert_eq!(versions.len(), 1);
    assert_eq!(versions[0]["name"], "v1");
    assert_eq!(versions[0]["storage"], true);
    assert_eq!(versions[0]["subresources"], json!({"status": {}}));
    assert_eq!(
        versions[0]["additionalPrinterColumns"][0]["jsonPath"],
        ".spec.a"
    );
    assert!(versions[0]["schema"]["openAPIV3Schema"].is_object());
}

#[test]
fn an_upgrade_adds_the_version_and_moves_storage_leaving_served_alone() {
    let host = host_crd(vec![
        version("v1", true, false, "a"),
        version("v2", true, true, "b"),
    ]);
    // The tenant has v1 (storage) and an old v0 that an admin stopped serving.
    let mut existing = tenant_crd(&host, "v1", None).expect("copy");
    existing["metadata"]["resourceVersion"] = json!("9");
    let mut v0 = version("v0", false, false, "z");
    v0["served"] = json!(false);
    existing["spec"]["versions"]
        .as_array_mut()
        .expect("versions")
        .insert(0, v0);
    let upgraded = tenant_crd(&host, "v2", Some(&existing)).expect("upgrade");
    let versions = upgraded["spec"]["versions"].as_array().expect("versions");
    let by_name = |n: &str| versions.iter().find(|v| v["name"] == n).expect(n).clone();
    assert_eq!(versions.len(), 3);
    assert_eq!(by_name("v2")["storage"], true);
    assert_eq!(by_name("v2")["served"], true);
    assert_eq!(by_name("v1")["storage"], false);
    assert_eq!(by_name("v1")["served"], true, "served kept");
    assert_eq!(by_name("v0")["served"], false, "served kept");
    assert_eq!(versions.iter().filter(|v| v["storage"] == true).count(), 1);
    assert_eq!(
        upgraded["metadata"]["resourceVersion"], "9",
        "replace keeps the tenant's version"
    );
}

#[test]
fn version_and_scope_checks() {
    let host = host_crd(vec![
        version("v1", true, true, "a"),
        version("v2", false, false, "b"),
    ]);
    let plan = plan_version(&host, &resource(None, Scope::Namespaced, Direction::ToHost))
        .expect("storage version");
    assert_eq!(
        plan,
        VersionPlan {
            version: "v1".into(),
            kind: "Backup".into(),
            status_subresource: true
        }
    );
    let err = plan_version(
        &host,
        &resource(Some("v3"), Scope::Namespaced, Direction::ToHost),
    )
    .expect_err("no v3");
    assert!(err.contains("no version v3"), "{err}");
    let err = plan_version(
        &host,
        &resource(Some("v2"), Scope::Namespaced, Direction::ToHost),
    )
    .expect_err("not served");
    assert!(err.contains("does not serve version v2"), "{err}");
    let err = plan_version(&host, &resource(None, Scope::Cluster, Direction::FromHost))
        .expect_err("scope");
    assert!(
        err.contains("Namespaced but the entry says Cluster"),
        "{err}"
    );
}
