use super::*;
use crproxy_core::config::sync::{Direction, FieldPath, Scope, SyncResource};
use kube::core::{ApiResource, GroupVersionKind};

fn backups(patches: &[&str]) -> ResolvedType {
    ResolvedType {
        resource: SyncResource {
            direction: Direction::ToHost,
            key: "backups.example.org/v1".into(),
            plural: "backups".into(),
            group: "example.org".into(),
            version: Some("v1".into()),
            scope: Scope::Namespaced,
            patches: patches
                .iter()
                .map(|p| FieldPath::parse(p).expect("path"))
                .collect(),
            mappings: vec![],
        },
        api: ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("example.org", "v1", "Backup"),
            "backups",
        ),
        status_subresource: true,
        aggregated: false,
    }
}

fn tenant_object() -> Value {
    json!({
        "apiVersion": "example.org/v1", "kind": "Backup",
        "metadata": {
            "name": "db", "namespace": "team", "uid": "tenant-uid", "resourceVersion": "7",
            "labels": {"app": "db", "vcluster.loft.sh/managed-by": "someone-else"},
            "annotations": {"note": "x", "crproxy.dev/host-mirror": "tenant-uid/m-1",
                "kubectl.kubernetes.io/last-applied-configuration": "{}"},
        },
        "spec": {"schedule": "@daily", "secretRef": {"name": "creds"}},
        "status": {"phase": "Pending"},
    })
}

#[test]
fn the_mirror_carries_identity_spec_and_rewritten_references() {
    let ty = backups(&["spec.secretRef.name"]);
    let m = desired_mirror(&ty, "client", "vcluster-client", &tenant_object());
    assert_eq!(m["metadata"]["name"], "db-x-team-x-client");
    assert_eq!(m["metadata"]["namespace"], "vcluster-client");
    let a = &m["metadata"]["annotations"];
    assert_eq!(a[names::OBJECT_NAME], "db");
    assert_eq!(a[names::OBJECT_NAMESPACE], "team");
    assert_eq!(a[names::OBJECT_UID], "tenant-uid");
    assert_eq!(a[names::OBJECT_KIND], "example.org/v1, Kind=Backup");
    assert_eq!(a[names::OBJECT_HOST_NAME], "db-x-team-x-client");
    assert_eq!(a[names::OBJECT_HOST_NAMESPACE], "vcluster-client");
    assert_eq!(a["note"], "x", "tenant annotations travel");
    assert!(
        a.get(names::MIRROR_UID).is_none(),
        "bookkeeping stays in the tenant"
    );
    assert!(a
        .get("kubectl.kubernetes.io/last-applied-configuration")
        .is_none());
    let l = &m["metadata"]["labels"];
    assert_eq!(l["app"], "db");
    assert_eq!(
        l[names::MANAGED_BY],
        "client",
        "a tenant cannot claim another owner"
    );
    assert_eq!(l[names::NAMESPACE_LABEL], "team");
    assert_eq!(m["spec"]["schedule"], "@daily");
    assert_eq!(m["spec"]["secretRef"]["name"], "creds-x-team-x-client");
    assert!(m.get("status").is_none(), "status flows up, never down");
    assert!(m["metadata"].get("uid").is_none());
}

#[test]
fn differences_that_need_a_write() {
    let ty = backups(&[]);
    let desired = desired_mirror(&ty, "client", "h", &tenant_object());
    let mut current = desired.clone();
    current["metadata"]["uid"] = json!("m-1");
    current["metadata"]["resourceVersion"] = json!("3");
    current["status"] = json!({"phase": "Done"});
    assert!(
        !mirror_differs(&desired, &current),
        "uid, resourceVersion and status do not count"
    );
    let mut edited = current.clone();
    edited["spec"]["schedule"] = json!("@hourly");
    assert!(mirror_differs(&desired, &edited));
    let mut relabelled = current.clone();
    relabelled["metadata"]["labels"]["app"] = json!("other");
    assert!(mirror_differs(&desired, &relabelled));
}

#[test]
fn status_comes_back_with_references_translated() {
    let ty = backups(&["status.secretName"]);
    let mirror = json!({"status": {"phase": "Done", "secretName": "out-x-team-x-client", "other": "out-x-team-x-client"}});
    let status = status_from_mirror(&ty, "client", "team", &mirror);
    assert_eq!(
        status,
        json!({"phase": "Done", "secretName": "out", "other": "out-x-team-x-client"})
    );
}

#[test]
fn a_mirror_record_counts_only_for_the_object_it_was_written_on() {
    let mut object = tenant_object();
    object["metadata"]["annotations"][names::MIRROR_UID] = json!("tenant-uid/m-1");
    assert_eq!(mirror_record(&object), Some("tenant-uid/m-1".to_owned()));
    // Copied onto another object (another uid): not a record of this one.
    object["metadata"]["uid"] = json!("other-uid");
    assert_eq!(mirror_record(&object), None);
    object["metadata"]["annotations"][names::MIRROR_UID] = json!("garbage");
    assert_eq!(mirror_record(&object), None);
}
