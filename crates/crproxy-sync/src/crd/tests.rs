use super::*;
use crate::fake_api::{not_found, AnswerFn, FakeApi};
use crproxy_core::config::sync::{Direction, Scope, SyncResource};
use http::Method;
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

/// The host serves gateways.example.net/v1 through an extension API server,
/// without a status subresource.
fn aggregated_host_without_status(method: &Method, path: &str, _: &Value) -> (u16, Value) {
    aggregated_host(method, path, false)
}

fn aggregated_host_with_status(method: &Method, path: &str, _: &Value) -> (u16, Value) {
    aggregated_host(method, path, true)
}

fn aggregated_host(method: &Method, path: &str, status: bool) -> (u16, Value) {
    let mut resources = vec![json!({"name": "gateways", "singularName": "gateway",
        "namespaced": true, "kind": "Gateway", "verbs": ["get", "list", "create", "update"]})];
    if status {
        resources.push(json!({"name": "gateways/status", "singularName": "",
            "namespaced": true, "kind": "Gateway", "verbs": ["get", "update"]}));
    }
    match (method, path) {
        (&Method::GET, "/apis/apiregistration.k8s.io/v1/apiservices") => (
            200,
            json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIServiceList",
                   "metadata": {}, "items": [{
                       "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                       "metadata": {"name": "v1.example.net"},
                       "spec": {"group": "example.net", "version": "v1",
                                "service": {"namespace": "gw", "name": "gw-api"}}}]}),
        ),
        (&Method::GET, "/apis/example.net/v1") => (
            200,
            json!({"kind": "APIResourceList", "apiVersion": "v1",
                   "groupVersion": "example.net/v1", "resources": resources}),
        ),
        _ => not_found(),
    }
}

/// The tenant holds the CRD generated by an earlier start (with a status
/// subresource, as every generated CRD had), Established; a replace is stored.
fn tenant_with_generated_crd(method: &Method, path: &str, body: &Value) -> (u16, Value) {
    let crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gateways.example.net";
    match (method, path) {
        (&Method::GET, p) if p == crd_path => {
            let resource = crate::fake_api::gateways_resource();
            let found = aggregated::Discovered {
                version: "v0".into(),
                kind: "Gateway".into(),
                scope: Scope::Namespaced,
                status_subresource: true,
            };
            let Ok(mut crd) = aggregated::generated_crd(&resource, &found, None) else {
                return not_found();
            };
            crd["metadata"]["resourceVersion"] = json!("5");
            crd["status"] = json!({"conditions": [{"type": "Established", "status": "True"}]});
            (200, crd)
        }
        (&Method::PUT, p) if p == crd_path => (200, body.clone()),
        _ => not_found(),
    }
}

/// An aggregated type's status goes through `/status` only when the host serves
/// `<plural>/status`: otherwise the syncer's replace of a mirror would send no status
/// and wipe the host's. The generated tenant CRD has the subresource exactly then, so
/// both sides agree on where status is written.
#[tokio::test]
async fn an_aggregated_type_has_a_status_subresource_only_when_the_host_has_one() {
    let cases: [(AnswerFn, bool); 2] = [
        (aggregated_host_without_status, false),
        (aggregated_host_with_status, true),
    ];
    for (answer, status) in cases {
        let host = FakeApi::start(answer).await;
        let tenant = FakeApi::start(tenant_with_generated_crd).await;
        let resource = crate::fake_api::gateways_resource();
        let ty = resolve(&host.client, &tenant.client, &resource)
            .await
            .expect("resolved");
        assert!(ty.aggregated);
        assert_eq!(ty.status_subresource, status, "host has /status: {status}");
        let puts = tenant.with_method(Method::PUT);
        assert_eq!(puts.len(), 1, "{:?}", tenant.received());
        let versions = puts[0].body["spec"]["versions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let v1 = versions.iter().find(|v| v["name"] == "v1");
        assert_eq!(
            v1.map(|v| v["subresources"]["status"].is_object()),
            Some(status),
            "tenant CRD: {versions:?}"
        );
    }
}

/// A tenant where another replica creates gateways.example.net while this one
/// looks: the first read finds nothing, every create is refused as already there,
/// and each read after it (when `winner_writes` is set) finds the winner's CRD,
/// Established.
fn tenant_racing_another_replica(winner_writes: bool) -> impl crate::fake_api::Answer {
    let reads = std::sync::atomic::AtomicUsize::new(0);
    move |method: &Method, path: &str, _: &Value| {
        let crd_path =
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gateways.example.net";
        match (method, path) {
            (&Method::GET, p) if p == crd_path => {
                let first = reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
                if first || !winner_writes {
                    return not_found();
                }
                let found = aggregated::Discovered {
                    version: "v1".into(),
                    kind: "Gateway".into(),
                    scope: Scope::Namespaced,
                    status_subresource: true,
                };
                let resource = crate::fake_api::gateways_resource();
                let Ok(mut crd) = aggregated::generated_crd(&resource, &found, None) else {
                    return not_found();
                };
                crd["metadata"]["resourceVersion"] = json!("7");
                crd["status"] = json!({"conditions": [{"type": "Established", "status": "True"}]});
                (200, crd)
            }
            (&Method::POST, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions") => (
                409,
                crproxy_core::status::status(409, "AlreadyExists", "already exists"),
            ),
            _ => not_found(),
        }
    }
}

/// Two replicas starting together: the one whose create of the tenant CRD is
/// refused as already there reads the winner's CRD and goes on with it, and a
/// tenant that keeps refusing fails the start after a bounded number of tries.
#[tokio::test]
async fn a_replica_that_loses_the_race_for_the_tenant_crd_takes_the_winners() {
    let host = FakeApi::start(aggregated_host_with_status as AnswerFn).await;
    let resource = crate::fake_api::gateways_resource();
    let tenant = FakeApi::start(tenant_racing_another_replica(true)).await;
    let ty = resolve(&host.client, &tenant.client, &resource)
        .await
        .expect("resolved with the winner's CRD");
    assert!(ty.aggregated && ty.status_subresource);
    assert_eq!(tenant.with_method(Method::POST).len(), 1);
    assert!(
        tenant.with_method(Method::PUT).is_empty(),
        "{:?}",
        tenant.received()
    );

    let tenant = FakeApi::start(tenant_racing_another_replica(false)).await;
    let refused = resolve(&host.client, &tenant.client, &resource)
        .await
        .expect_err("refused every time");
    assert!(
        refused
            .to_string()
            .contains("creating CRD gateways.example.net"),
        "{refused}"
    );
    assert_eq!(
        tenant.with_method(Method::POST).len(),
        3,
        "{:?}",
        tenant.received()
    );
}
