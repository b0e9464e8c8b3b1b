use super::*;
use crproxy_core::config::sync::Direction;
use kube::core::{ApiResource, GroupVersionKind};

fn resource(scope: Scope, mappings: Vec<Mapping>) -> SyncResource {
    SyncResource {
        direction: Direction::FromHost,
        key: "sharedstores.example.org".into(),
        plural: "sharedstores".into(),
        group: "example.org".into(),
        version: None,
        scope,
        patches: vec![],
        mappings,
    }
}

fn key(ns: &str, name: &str) -> Key {
    Key {
        namespace: ns.into(),
        name: name.into(),
    }
}

#[test]
fn mappings_translate_both_ways() {
    let r = resource(
        Scope::Namespaced,
        vec![
            Mapping::Namespace {
                host_namespace: "shared".into(),
                tenant_namespace: "team".into(),
            },
            Mapping::Object {
                host_namespace: "shared".into(),
                host_name: "main".into(),
                tenant_namespace: "apps".into(),
                tenant_name: "primary".into(),
            },
        ],
    );
    assert_eq!(
        tenant_key(&r, Some("shared"), "cache"),
        Some(key("team", "cache"))
    );
    assert_eq!(
        tenant_key(&r, Some("shared"), "main"),
        Some(key("apps", "primary"))
    );
    assert_eq!(tenant_key(&r, Some("elsewhere"), "cache"), None);
    assert_eq!(
        host_key(&r, &key("team", "cache")),
        Some((Some("shared".into()), "cache".into()))
    );
    assert_eq!(
        host_key(&r, &key("apps", "primary")),
        Some((Some("shared".into()), "main".into()))
    );
    assert_eq!(
        host_key(&r, &key("team", "main")),
        None,
        "main is mapped elsewhere"
    );
    assert_eq!(host_key(&r, &key("other", "x")), None);
    assert_eq!(
        FromHost::host_namespaces(&r),
        vec![Some("shared".to_owned())]
    );
    let c = resource(Scope::Cluster, vec![]);
    assert_eq!(tenant_key(&c, None, "s"), Some(key("", "s")));
    assert_eq!(host_key(&c, &key("", "s")), Some((None, "s".into())));
}

fn stores_type() -> ResolvedType {
    ResolvedType {
        resource: resource(Scope::Cluster, vec![]),
        api: ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("example.org", "v1", "SharedStore"),
            "sharedstores",
        ),
        status_subresource: false,
        aggregated: false,
    }
}

#[test]
fn copies_keep_tenant_edits_until_the_host_changes_the_field() {
    let ty = stores_type();
    let k = key("", "store");
    let host_v1 = json!({"apiVersion": "example.org/v1", "kind": "SharedStore",
        "metadata": {"name": "store", "uid": "h", "labels": {"tier": "a"}},
        "spec": {"size": 1, "region": "eu"}});
    let first = desired_copy(&ty, &k, &host_v1, None);
    assert_eq!(first["spec"], json!({"size": 1, "region": "eu"}));
    assert_eq!(first["metadata"]["labels"], json!({"tier": "a"}));
    assert_eq!(
        first["metadata"]["annotations"][names::OBJECT_HOST_NAME],
        "store"
    );
    assert!(first["metadata"].get("uid").is_none());
    // The tenant edits size.
    let mut tenant = first.clone();
    tenant["metadata"]["uid"] = json!("t");
    tenant["metadata"]["resourceVersion"] = json!("4");
    tenant["spec"]["size"] = json!(9);
    let again = desired_copy(&ty, &k, &host_v1, Some(&tenant));
    assert_eq!(
        again["spec"],
        json!({"size": 9, "region": "eu"}),
        "edit stays"
    );
    assert!(!copy_differs(&again, &tenant), "nothing to write");
    // The host changes region: the edit stays, the region lands.
    let mut host_v2 = host_v1.clone();
    host_v2["spec"]["region"] = json!("us");
    let merged = desired_copy(&ty, &k, &host_v2, Some(&tenant));
    assert_eq!(merged["spec"], json!({"size": 9, "region": "us"}));
    assert_eq!(merged["metadata"]["resourceVersion"], "4");
    // The host changes size: it overwrites the edit.
    let mut host_v3 = host_v2.clone();
    host_v3["spec"]["size"] = json!(2);
    let mut tenant2 = merged.clone();
    tenant2["metadata"]["uid"] = json!("t");
    let overwritten = desired_copy(&ty, &k, &host_v3, Some(&tenant2));
    assert_eq!(overwritten["spec"], json!({"size": 2, "region": "us"}));
}

#[test]
fn a_tenant_created_object_under_a_host_name_is_overwritten() {
    let ty = stores_type();
    let host = json!({"metadata": {"name": "store"}, "spec": {"size": 1}});
    let tenant = json!({"metadata": {"name": "store", "uid": "t", "resourceVersion": "1"}, "spec": {"size": 5, "mine": true}});
    let copy = desired_copy(&ty, &key("", "store"), &host, Some(&tenant));
    assert_eq!(copy["spec"], json!({"size": 1}));
}
