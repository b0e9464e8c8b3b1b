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

/// The tenant: a replace is stored as sent.
fn tenant_answers(method: &http::Method, _path: &str, body: &Value) -> (u16, Value) {
    match *method {
        http::Method::PUT => (200, body.clone()),
        _ => crate::fake_api::not_found(),
    }
}

fn host_store_object() -> Value {
    json!({"apiVersion": "example.org/v1", "kind": "SharedStore",
        "metadata": {"name": "store", "uid": "h", "resourceVersion": "5", "labels": {"tier": "a"}},
        "spec": {"size": 1, "region": "eu"}})
}

/// The copy of `host` as the tenant stores it, with what a tenant controller added: a
/// label, a finalizer, an owner.
fn stored_copy(ty: &ResolvedType, host: &Value) -> Value {
    let mut copy = desired_copy(ty, &key("", "store"), host, None);
    let m = &mut copy["metadata"];
    m["uid"] = json!("t");
    m["resourceVersion"] = json!("9");
    m["labels"]["tenant.example/team"] = json!("a");
    m["finalizers"] = json!(["tenant.example/protect"]);
    m["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "o-1"}]);
    copy
}

/// One reconcile of the copy `store` with `host` and `tenant` in the caches; what the
/// tenant was sent.
async fn reconcile_copy(host: &Value, tenant: &Value) -> Vec<crate::fake_api::Received> {
    let (reconciled, sent) = reconcile_copy_against(tenant_answers, host, Some(tenant)).await;
    reconciled.expect("reconciled");
    sent
}

/// One reconcile of the copy `store` against a tenant answering `answer`, with
/// `host` and `tenant` (if any) in the caches: its result, and what the tenant
/// was sent.
async fn reconcile_copy_against(
    answer: impl crate::fake_api::Answer,
    host: &Value,
    tenant: Option<&Value>,
) -> (Result<Outcome, StepError>, Vec<crate::fake_api::Received>) {
    reconcile_against(stores_type(), &key("", "store"), answer, host, tenant).await
}

/// One reconcile of `key` of `ty` against a tenant answering `answer`, with `host`
/// and `tenant` (if any) in the caches: its result, and what the tenant was sent.
async fn reconcile_against(
    ty: ResolvedType,
    key: &Key,
    answer: impl crate::fake_api::Answer,
    host: &Value,
    tenant: Option<&Value>,
) -> (Result<Outcome, StepError>, Vec<crate::fake_api::Received>) {
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    let api = crate::fake_api::FakeApi::start(answer).await;
    let cached = |object: Option<&Value>| {
        let mut writer = Writer::<DynamicObject>::new(ty.api.clone());
        if let Some(object) = object {
            let object: DynamicObject = serde_json::from_value(object.clone()).expect("object");
            writer.apply_watcher_event(&Event::Apply(object));
        }
        writer.as_reader()
    };
    let nowhere = kube::Config::new("http://127.0.0.1:1".parse().expect("url"));
    let syncer = FromHost {
        ty: ty.clone(),
        tenant_client: api.client.clone(),
        host_client: kube::Client::try_from(nowhere).expect("client"),
        tenant_store: cached(tenant),
        host_stores: vec![(None, cached(Some(host)))],
        metrics: SyncMetrics::new(),
    };
    let reconciled = syncer.reconcile_key(key).await;
    (reconciled, api.received())
}

/// The stores type, namespaced, with one mapping: host namespace `shared` to
/// tenant namespace `shared`.
fn mapping_only_shared() -> ResolvedType {
    let mut ty = stores_type();
    ty.resource = resource(
        Scope::Namespaced,
        vec![Mapping::Namespace {
            host_namespace: "shared".into(),
            tenant_namespace: "shared".into(),
        }],
    );
    ty
}

/// A namespaced type's object in a tenant namespace that no mapping covers is the
/// tenant's own: the syncer, watching the tenant cluster-wide, neither deletes
/// it nor asks the host about it. A copy left there by an earlier mapping (since
/// removed) has no host object any more, and is deleted.
#[tokio::test]
async fn a_tenant_object_outside_every_mapped_namespace_is_left_alone() {
    let ty = mapping_only_shared();
    let host = host_store_object();
    let mut own = host.clone();
    own["metadata"] = json!({"name": "store", "namespace": "app", "uid": "t-1"});
    let (reconciled, sent) = reconcile_against(
        ty.clone(),
        &key("app", "store"),
        tenant_answers,
        &host,
        Some(&own),
    )
    .await;
    assert!(
        matches!(reconciled, Ok(Outcome::Done)),
        "{:?}",
        reconciled.map_err(|e| e.to_string())
    );
    assert!(sent.is_empty(), "the tenant was written: {sent:?}");

    let mut copy = stored_copy(&ty, &host);
    copy["metadata"]["namespace"] = json!("app");
    copy["metadata"]["uid"] = json!("t-2");
    // The live read finds the copy as cached.
    let (reconciled, sent) = reconcile_against(
        ty,
        &key("app", "store"),
        holding(copy.clone()),
        &host,
        Some(&copy),
    )
    .await;
    assert!(matches!(reconciled, Ok(Outcome::Done)));
    let deletes: Vec<_> = sent
        .iter()
        .filter(|r| r.method == http::Method::DELETE)
        .collect();
    assert_eq!(deletes.len(), 1, "{sent:?}");
    assert_eq!(deletes[0].body["preconditions"]["uid"], "t-2");
    assert_eq!(deletes[0].body["preconditions"]["resourceVersion"], "9");
}

/// A tenant holding `object`: a read answers it, a delete pinned to its uid and
/// resourceVersion succeeds, any other delete conflicts.
fn holding(object: Value) -> impl crate::fake_api::Answer {
    move |method: &http::Method, _: &str, body: &Value| match *method {
        http::Method::GET => (200, object.clone()),
        http::Method::DELETE
            if body["preconditions"]["uid"] == object["metadata"]["uid"]
                && body["preconditions"]["resourceVersion"]
                    == object["metadata"]["resourceVersion"] =>
        {
            crate::fake_api::success()
        }
        http::Method::DELETE => (
            409,
            crproxy_core::status::status(409, "Conflict", "Precondition failed"),
        ),
        _ => crate::fake_api::not_found(),
    }
}

/// Outside every mapped namespace only the copy marker tells a copy from the
/// tenant's own object, and the cache may be behind: a tenant user who just
/// removed the marker (or changed the object in any way since) does not see the
/// object deleted; the delete waits for a live read that still shows a copy and
/// is pinned to it.
#[tokio::test]
async fn an_unmapped_copy_is_deleted_only_as_a_live_read_shows_it() {
    let ty = mapping_only_shared();
    let host = host_store_object();
    let mut cached = stored_copy(&ty, &host);
    cached["metadata"]["namespace"] = json!("app");
    // The tenant removed the marker; the cache has not seen it yet.
    let mut unmarked = cached.clone();
    unmarked["metadata"]["resourceVersion"] = json!("10");
    unmarked["metadata"]["annotations"]
        .as_object_mut()
        .map(|a| a.remove(names::LAST_HOST_STATE));
    let (reconciled, sent) = reconcile_against(
        ty.clone(),
        &key("app", "store"),
        holding(unmarked),
        &host,
        Some(&cached),
    )
    .await;
    assert!(matches!(reconciled, Ok(Outcome::Done)));
    let methods: Vec<_> = sent.iter().map(|r| r.method.clone()).collect();
    assert_eq!(methods, [http::Method::GET], "{sent:?}");

    // Still a copy when read, changed before the delete: looked at again.
    let read = cached.clone();
    let changed = move |method: &http::Method, path: &str, body: &Value| match *method {
        http::Method::DELETE => (
            409,
            crproxy_core::status::status(409, "Conflict", "Precondition failed"),
        ),
        _ => holding(read.clone())(method, path, body),
    };
    let (reconciled, sent) =
        reconcile_against(ty, &key("app", "store"), changed, &host, Some(&cached)).await;
    assert!(
        matches!(reconciled, Ok(Outcome::Requeue(_))),
        "{:?}",
        reconciled.map_err(|e| e.to_string())
    );
    let deletes: Vec<_> = sent
        .iter()
        .filter(|r| r.method == http::Method::DELETE)
        .collect();
    assert_eq!(deletes.len(), 1, "{sent:?}");
    assert_eq!(deletes[0].body["preconditions"]["resourceVersion"], "9");
}

/// The tenant refuses a copy's create with a 409 that no object under the name
/// explains (a tenant admission webhook's): the step fails as a `conflict`, so the
/// queue backs off and the failure is counted. One the name explains (the cache is
/// behind) is looked at again soon.
#[tokio::test]
async fn a_copy_create_refused_409_is_requeued_only_when_the_name_is_taken() {
    fn refusing(taken: bool) -> impl crate::fake_api::Answer {
        move |method: &http::Method, _: &str, _: &Value| match *method {
            http::Method::POST => (
                409,
                crproxy_core::status::status(409, "Conflict", "refused"),
            ),
            http::Method::GET if taken => (200, host_store_object()),
            _ => crate::fake_api::not_found(),
        }
    }
    let host = host_store_object();
    let (refused, sent) = reconcile_copy_against(refusing(false), &host, None).await;
    let failed = refused.expect_err("a failure, not a requeue");
    assert_eq!(failed.reason(), "conflict", "{failed}");
    let methods: Vec<_> = sent.iter().map(|r| r.method.clone()).collect();
    assert_eq!(methods, [http::Method::POST, http::Method::GET], "{sent:?}");
    let (taken, _) = reconcile_copy_against(refusing(true), &host, None).await;
    assert!(
        matches!(taken, Ok(Outcome::Requeue(_))),
        "{:?}",
        taken.map_err(|e| e.to_string())
    );
}

/// A tenant controller labelling a copy (and adding its finalizer) does not make the
/// syncer write it again.
#[tokio::test]
async fn a_copy_the_tenant_labelled_is_left_alone() {
    let host = host_store_object();
    let sent = reconcile_copy(&host, &stored_copy(&stores_type(), &host)).await;
    assert!(sent.is_empty(), "the tenant was written: {sent:?}");
}

/// A host change replaces the copy and keeps the tenant's label, finalizer and
/// owner; a label the host removed leaves the copy.
#[tokio::test]
async fn a_host_change_keeps_the_copys_tenant_keys_finalizers_and_owners() {
    let host = host_store_object();
    let copy = stored_copy(&stores_type(), &host);
    let mut changed = host.clone();
    changed["spec"]["size"] = json!(2);
    changed["metadata"]["labels"] = json!({"tier": "b", "new": "x"});
    let sent = reconcile_copy(&changed, &copy).await;
    let puts: Vec<_> = sent
        .iter()
        .filter(|r| r.method == http::Method::PUT)
        .collect();
    assert_eq!(puts.len(), 1, "{sent:?}");
    let body = &puts[0].body;
    assert_eq!(body["spec"]["size"], 2);
    let m = &body["metadata"];
    assert_eq!(m["resourceVersion"], "9", "{body}");
    assert_eq!(m["finalizers"], json!(["tenant.example/protect"]), "{body}");
    assert_eq!(m["ownerReferences"][0]["uid"], "o-1", "{body}");
    assert_eq!(m["labels"]["tenant.example/team"], "a", "{body}");
    assert_eq!(m["labels"]["tier"], "b", "{body}");
    assert_eq!(m["labels"]["new"], "x", "{body}");

    // The host drops its label: the copy loses it, the tenant's stays.
    let mut relabelled = host.clone();
    relabelled["metadata"]["labels"] = json!({});
    let sent = reconcile_copy(&relabelled, &copy).await;
    let puts: Vec<_> = sent
        .iter()
        .filter(|r| r.method == http::Method::PUT)
        .collect();
    assert_eq!(puts.len(), 1, "{sent:?}");
    let m = &puts[0].body["metadata"];
    assert!(m["labels"].get("tier").is_none(), "{m}");
    assert_eq!(m["labels"]["tenant.example/team"], "a", "{m}");
}
