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
    let m = desired_mirror(
        &ty,
        "client",
        "default",
        "vcluster-client",
        &tenant_object(),
    )
    .expect("translatable");
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
    let desired =
        desired_mirror(&ty, "client", "default", "h", &tenant_object()).expect("translatable");
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

/// The way back gives no name the way there refuses: in namespace `b` of
/// tenant `c-x-d`, `a-x-b-x-c-x-d` is tenant `d`'s object `a` of namespace
/// `b-x-c`, not this tenant's `a`; an ambiguous or over-long name stays as the
/// host wrote it too.
#[test]
fn status_comes_back_only_with_references_that_translate_there() {
    let ty = backups(&["status.secretNames[*]"]);
    let long = format!("{}-x-b-x-client", "s".repeat(60));
    let check = |tenant: &str, host: &str, want: &str| {
        let mirror = json!({"status": {"secretNames": [host]}});
        let status = status_from_mirror(&ty, tenant, "b", &mirror);
        assert_eq!(
            status,
            json!({"secretNames": [want]}),
            "{host} of tenant {tenant}"
        );
    };
    check("c-x-d", "a-x-b-x-c-x-d", "a-x-b-x-c-x-d");
    check("x-d", "a-x-b-x-x-d", "a-x-b-x-x-d");
    check("client", "a-x-b-x-client", "a");
    check("client", "a-x-x-b-x-client", "a-x-x-b-x-client");
    check("client", &long, &long);
}

/// A reference whose host name would be cut to 52 characters and a 40-bit hash
/// is refused: a tenant could search for one meeting another object's host
/// name. What the refusal repeats of the reference is capped, as a tenant
/// chooses its length.
#[test]
fn a_reference_whose_host_name_would_be_shortened_is_refused() {
    let ty = backups(&["spec.secretRef.name"]);
    let with_secret = |secret: &str| {
        let mut object = tenant_object();
        object["spec"]["secretRef"]["name"] = json!(secret);
        desired_mirror(&ty, "client", "default", "vcluster-client", &object)
    };
    let fits = "s".repeat(63 - "-x-team-x-client".len());
    let mirror = with_secret(&fits).expect("63 characters fit");
    assert_eq!(
        mirror["spec"]["secretRef"]["name"],
        format!("{fits}-x-team-x-client")
    );
    let error = with_secret(&format!("{fits}s")).expect_err("refused");
    assert_eq!(error.why, "the host name would be shortened");
    assert!(
        error
            .to_string()
            .contains("cannot be translated to a host name: the host name would be shortened"),
        "{error}"
    );
    // Quoted as kube-apiserver (Go's %q) quotes it, not as Rust's Debug does.
    let error = with_secret("a\u{1}\u{7}-x").expect_err("refused");
    assert!(
        error
            .to_string()
            .contains(r#"Invalid value: "a\x01\a-x": in namespace "team""#),
        "{error}"
    );
    let huge = format!("{}-x", "é".repeat(100_000));
    let error = with_secret(&huge).expect_err("refused");
    assert_eq!(error.value, format!("{}…", "é".repeat(253)));
    assert!(error.to_string().len() < 2_000, "{error}");
}

/// An empty reference is an unset one: the host controller must see it unset
/// too, not a made-up name such as `-x-team-x-client`, and the way back keeps
/// it empty.
#[test]
fn an_empty_reference_stays_empty_both_ways() {
    let ty = backups(&["spec.secretRef.name", "status.secretName"]);
    let mut object = tenant_object();
    object["spec"]["secretRef"]["name"] = json!("");
    let mirror = desired_mirror(&ty, "client", "default", "vcluster-client", &object)
        .expect("nothing to translate");
    assert_eq!(mirror["spec"]["secretRef"]["name"], "");
    let mirror = json!({"status": {"secretName": ""}});
    let status = status_from_mirror(&ty, "client", "team", &mirror);
    assert_eq!(status, json!({"secretName": ""}));
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

/// What others put on a mirror: a host controller's annotation and label, its
/// finalizer, and an owner.
fn with_others_keys(mut mirror: Value) -> Value {
    let m = &mut mirror["metadata"];
    m["annotations"]["host.example/audited"] = json!("yes");
    m["labels"]["host.example/zone"] = json!("a");
    m["finalizers"] = json!(["host.example/cleanup"]);
    m["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "o-1"}]);
    mirror
}

/// The mirror of `tenant_object()` as the host stores it (uid `m-1`, the uid its
/// record names), with others' keys on it.
fn stored_mirror(ty: &ResolvedType) -> Value {
    let mut mirror = desired_mirror(ty, "client", "default", "vcluster-client", &tenant_object())
        .expect("translatable");
    mirror["metadata"]["uid"] = json!("m-1");
    mirror["metadata"]["resourceVersion"] = json!("3");
    mirror["status"] = json!({"phase": "Pending"});
    with_others_keys(mirror)
}

#[test]
fn keys_others_put_on_a_mirror_need_no_write() {
    let ty = backups(&[]);
    let desired = desired_mirror(
        &ty,
        "client",
        "default",
        "vcluster-client",
        &tenant_object(),
    )
    .expect("translatable");
    assert!(!mirror_differs(&desired, &stored_mirror(&ty)));
}

/// The host: a replace is stored as sent, with the mirror's uid and (a status
/// subresource) the status it had.
fn host_answers(method: &http::Method, _path: &str, body: &Value) -> (u16, Value) {
    match *method {
        http::Method::PUT => {
            let mut stored = body.clone();
            stored["metadata"]["uid"] = json!("m-1");
            stored["status"] = json!({"phase": "Pending"});
            (200, stored)
        }
        _ => crate::fake_api::not_found(),
    }
}

fn to_host(ty: &ResolvedType, host: kube::Client) -> ToHost {
    let empty = || kube::runtime::reflector::store::Writer::new(ty.api.clone()).as_reader();
    let nowhere = kube::Config::new("http://127.0.0.1:1".parse().expect("url"));
    ToHost {
        ty: ty.clone(),
        tenant: "client".into(),
        tenant_project: "default".into(),
        host_namespace: "vcluster-client".into(),
        // The tenant is not needed: the record and status already agree.
        tenant_client: kube::Client::try_from(nowhere).expect("client"),
        host_client: host,
        tenant_store: empty(),
        host_store: empty(),
        metrics: SyncMetrics::new(),
        gate: None,
        observed_host_deletes: Default::default(),
        last_writes: Default::default(),
    }
}

fn key() -> Key {
    Key {
        namespace: "team".into(),
        name: "db".into(),
    }
}

/// A host controller annotating the mirror (and adding its finalizer) does not make
/// the syncer write it again: no replace war over keys that are not crproxy's.
#[tokio::test]
async fn a_mirror_others_annotated_is_left_alone() {
    let ty = backups(&[]);
    let host = crate::fake_api::FakeApi::start(host_answers).await;
    let syncer = to_host(&ty, host.client.clone());
    let outcome = syncer
        .update(&key(), &tenant_object(), &stored_mirror(&ty))
        .await
        .expect("reconciled");
    assert_eq!(outcome, Outcome::Done);
    assert!(
        host.received().is_empty(),
        "the host was written: {:?}",
        host.received()
    );
}

/// A tenant spec change replaces the mirror and keeps what others put on it: the
/// finalizer (a mirror being deleted still waits for its host controller), the owner,
/// and their label and annotation.
#[tokio::test]
async fn a_spec_change_keeps_others_keys_finalizers_and_owners_on_the_mirror() {
    let ty = backups(&[]);
    let host = crate::fake_api::FakeApi::start(host_answers).await;
    let syncer = to_host(&ty, host.client.clone());
    let mut tenant = tenant_object();
    tenant["spec"]["schedule"] = json!("@hourly");
    syncer
        .update(&key(), &tenant, &stored_mirror(&ty))
        .await
        .expect("reconciled");
    let puts = host.with_method(http::Method::PUT);
    assert_eq!(puts.len(), 1, "{:?}", host.received());
    let sent = &puts[0].body;
    assert_eq!(sent["spec"]["schedule"], "@hourly");
    let m = &sent["metadata"];
    assert_eq!(m["resourceVersion"], "3", "{sent}");
    assert_eq!(m["finalizers"], json!(["host.example/cleanup"]), "{sent}");
    assert_eq!(m["ownerReferences"][0]["uid"], "o-1", "{sent}");
    assert_eq!(m["annotations"]["host.example/audited"], "yes", "{sent}");
    assert_eq!(m["labels"]["host.example/zone"], "a", "{sent}");
    assert_eq!(m["annotations"][names::OBJECT_UID], "tenant-uid", "{sent}");
    assert_eq!(m["labels"]["app"], "db", "{sent}");
}

/// A label or annotation the tenant removes is removed from the mirror too, while
/// others' keys stay.
#[tokio::test]
async fn a_key_the_tenant_removed_leaves_the_mirror() {
    let ty = backups(&[]);
    let host = crate::fake_api::FakeApi::start(host_answers).await;
    let syncer = to_host(&ty, host.client.clone());
    let mut tenant = tenant_object();
    if let Some(labels) = tenant["metadata"]["labels"].as_object_mut() {
        labels.remove("app");
    }
    if let Some(annotations) = tenant["metadata"]["annotations"].as_object_mut() {
        annotations.remove("note");
    }
    syncer
        .update(&key(), &tenant, &stored_mirror(&ty))
        .await
        .expect("reconciled");
    let puts = host.with_method(http::Method::PUT);
    assert_eq!(puts.len(), 1, "{:?}", host.received());
    let m = &puts[0].body["metadata"];
    assert!(m["labels"].get("app").is_none(), "{m}");
    assert!(m["annotations"].get("note").is_none(), "{m}");
    assert_eq!(m["labels"]["host.example/zone"], "a", "{m}");
    assert_eq!(m["annotations"]["host.example/audited"], "yes", "{m}");
    assert_eq!(m["labels"][names::MANAGED_BY], "client", "{m}");
}

/// A host that defaults `spec.retention` on every write and keeps what it stored:
/// a write that changes nothing is a no-op, as in kube (the same resourceVersion
/// comes back); any other moves the resourceVersion. A created mirror's status is
/// `Pending`; a replace keeps the status it carries (the mirror's). No mirror is
/// found by a read.
fn defaulting_host() -> impl crate::fake_api::Answer {
    let stored: Mutex<Option<Value>> = Mutex::new(None);
    move |method: &http::Method, _path: &str, body: &Value| {
        let mut stored = locks::lock(&stored);
        let mut next = body.clone();
        next["spec"]["retention"] = json!("7d");
        next["metadata"]["uid"] = json!("m-1");
        if next["status"].is_null() {
            next["status"] = json!({"phase": "Pending"});
        }
        match *method {
            http::Method::POST => next["metadata"]["resourceVersion"] = json!("1"),
            http::Method::PUT => {
                let Some(before) = stored.as_ref() else {
                    return crate::fake_api::not_found();
                };
                let version = meta(before, "resourceVersion").parse::<u64>().unwrap_or(0);
                let mut unchanged = next.clone();
                unchanged["metadata"]["resourceVersion"] =
                    before["metadata"]["resourceVersion"].clone();
                next = if unchanged == *before {
                    unchanged
                } else {
                    next["metadata"]["resourceVersion"] = json!((version + 1).to_string());
                    next
                };
            }
            _ => return crate::fake_api::not_found(),
        }
        *stored = Some(next.clone());
        (
            if *method == http::Method::POST {
                201
            } else {
                200
            },
            next,
        )
    }
}

/// A field the host fills in on every write is not fought over: once a write has
/// come back with it, the mirror is not written again, neither at a resync nor
/// when the host changes the mirror's status or its own keys on it, until the
/// mirror's synced fields, crproxy's keys on it or the tenant object change.
#[tokio::test]
async fn a_field_the_host_defaults_is_written_once() {
    let ty = backups(&[]);
    let host = crate::fake_api::FakeApi::start(defaulting_host()).await;
    let syncer = to_host(&ty, host.client.clone());
    let puts = || host.with_method(http::Method::PUT);

    // The host lost the mirror (a tenant object that records one, no DELETED
    // event seen): created again, with the host's default.
    syncer
        .mirror_missing(&key(), &tenant_object())
        .await
        .expect("created");
    let posts = host.with_method(http::Method::POST);
    assert_eq!(posts.len(), 1, "{:?}", host.received());
    let (_, created) = defaulting_host()(&http::Method::POST, "", &posts[0].body);
    for _ in 0..3 {
        syncer
            .update(&key(), &tenant_object(), &created)
            .await
            .expect("reconciled");
    }
    assert!(
        puts().is_empty(),
        "the created mirror was written: {:?}",
        host.received()
    );

    // An extension server may list an object with a field its write's answer
    // left out: the same resourceVersion is still the answer.
    let mut listed = created.clone();
    listed["spec"]["computedOnRead"] = json!(true);
    syncer
        .update(&key(), &tenant_object(), &listed)
        .await
        .expect("reconciled");
    assert!(
        puts().is_empty(),
        "the listed mirror was written: {:?}",
        host.received()
    );

    // The host controller moves the mirror's status (copied up already) and
    // notes it in an annotation of its own.
    let mut progressed = created.clone();
    progressed["status"] = json!({"phase": "Done"});
    progressed["metadata"]["annotations"]["host.example/checked"] = json!("at 2");
    progressed["metadata"]["resourceVersion"] = json!("2");
    let mut tenant = tenant_object();
    tenant["status"] = json!({"phase": "Done"});
    syncer
        .update(&key(), &tenant, &progressed)
        .await
        .expect("reconciled");
    assert!(
        puts().is_empty(),
        "a status change wrote the mirror: {:?}",
        host.received()
    );

    // Someone edits the mirror's spec on the host: put back, once.
    let mut edited = progressed.clone();
    edited["spec"]["schedule"] = json!("@weekly");
    edited["metadata"]["resourceVersion"] = json!("3");
    syncer
        .update(&key(), &tenant, &edited)
        .await
        .expect("reconciled");
    assert_eq!(puts().len(), 1, "{:?}", host.received());
    assert_eq!(puts()[0].body["spec"]["schedule"], "@daily");

    // Someone edits a label crproxy set: put back, once.
    let mut relabelled = progressed.clone();
    relabelled["metadata"]["labels"]["app"] = json!("other");
    relabelled["metadata"]["resourceVersion"] = json!("5");
    syncer
        .update(&key(), &tenant, &relabelled)
        .await
        .expect("reconciled");
    assert_eq!(puts().len(), 2, "{:?}", host.received());
    assert_eq!(puts()[1].body["metadata"]["labels"]["app"], "db");

    // The tenant changes its object: written down, once.
    tenant["spec"]["schedule"] = json!("@hourly");
    syncer
        .update(&key(), &tenant, &progressed)
        .await
        .expect("reconciled");
    assert_eq!(puts().len(), 3, "{:?}", host.received());
    assert_eq!(puts()[2].body["spec"]["schedule"], "@hourly");
}

/// The mirror of an earlier tenant object of the same name that a host
/// controller's finalizer holds while it cleans up (the tenant replaced the
/// object, `kubectl replace --force`): neither deleted again nor read about in the
/// tenant, every 100 ms for as long as the finalizer stays, but left until its
/// removal brings the key back.
#[tokio::test]
async fn an_earlier_object_s_mirror_being_deleted_is_left_to_its_finalizer() {
    let ty = backups(&[]);
    let host = crate::fake_api::FakeApi::start(host_answers).await;
    let syncer = to_host(&ty, host.client.clone());
    let mut earlier = stored_mirror(&ty);
    earlier["metadata"]["annotations"][names::OBJECT_UID] = json!("earlier-tenant-uid");
    earlier["metadata"]["deletionTimestamp"] = json!("2026-12-05T20:00:00Z");
    // The tenant client refuses connections: a live read would fail the step.
    let outcome = syncer
        .update(&key(), &tenant_object(), &earlier)
        .await
        .expect("reconciled without the tenant");
    assert_eq!(outcome, Outcome::Done);
    assert!(
        host.received().is_empty(),
        "the host was written: {:?}",
        host.received()
    );
}

/// The host refuses the mirror's create with a 409 that no object under the name
/// explains (a host admission webhook's): the step fails as a `conflict`, so the
/// queue backs off and the failure is counted, instead of a quiet retry every
/// 200 ms for as long as the refusal lasts. A read of the name that is forbidden
/// cannot explain it either: the refusal stands, as fromHost's does.
#[tokio::test]
async fn a_create_refused_409_with_nothing_under_the_name_is_a_failure() {
    for (read, answer) in [
        ("nothing under the name", crate::fake_api::not_found()),
        (
            "the read forbidden",
            (
                403,
                crproxy_core::status::status(403, "Forbidden", "get is forbidden"),
            ),
        ),
    ] {
        let ty = backups(&[]);
        let refusal = crproxy_core::status::status(
            409,
            "Conflict",
            "admission webhook \"ports.host.example\" denied the request: port taken",
        );
        let host =
            crate::fake_api::FakeApi::start(move |method: &http::Method, _: &str, _: &Value| {
                match *method {
                    http::Method::POST => (409, refusal.clone()),
                    _ => answer.clone(),
                }
            })
            .await;
        let syncer = to_host(&ty, host.client.clone());
        let mut never_mirrored = tenant_object();
        never_mirrored["metadata"]["annotations"] = json!({"note": "x"});
        let failed = syncer
            .mirror_missing(&key(), &never_mirrored)
            .await
            .expect_err("a failure, not a requeue");
        assert_eq!(failed.reason(), "conflict", "{read}: {failed}");
        // The create, then the live read that could not explain the 409.
        let methods: Vec<_> = host.received().into_iter().map(|r| r.method).collect();
        assert_eq!(methods, [http::Method::POST, http::Method::GET], "{read}");
    }
}

/// The mirror of the tenant of this name in another project, sharing the host
/// namespace: with no tenant object here under its key, it is not taken for an
/// orphan of this tenant's and deleted; nor is its key ever this syncer's.
#[tokio::test]
async fn another_projects_mirror_is_never_collected() {
    let ty = backups(&[]);
    let host = crate::fake_api::FakeApi::start(host_answers).await;
    let syncer = to_host(&ty, host.client.clone());
    let mut theirs = stored_mirror(&ty);
    theirs["metadata"]["annotations"][names::TENANT_PROJECT] = json!("other");
    let outcome = syncer.collect(&key(), &theirs).await.expect("reconciled");
    assert_eq!(outcome, Outcome::Done);
    assert!(
        host.received().is_empty(),
        "the host was written: {:?}",
        host.received()
    );
    let object: DynamicObject = serde_json::from_value(theirs).expect("object");
    assert_eq!(syncer.key_of_host(&object), None);
    let object: DynamicObject = serde_json::from_value(stored_mirror(&ty)).expect("object");
    assert_eq!(syncer.key_of_host(&object), Some(key()));
}

/// A mirror written before mirrors recorded their project may be a namesake
/// tenant's in another project: its tenant object's syncer stamps it when it
/// replaces it, but never deletes it, neither as an orphan nor as an earlier
/// incarnation's; it is left, counted as a foreign object.
#[tokio::test]
async fn a_mirror_that_records_no_project_is_never_deleted() {
    let ty = backups(&[]);
    let host = crate::fake_api::FakeApi::start(host_answers).await;
    let syncer = to_host(&ty, host.client.clone());
    let mut older = stored_mirror(&ty);
    older["metadata"]["annotations"]
        .as_object_mut()
        .map(|a| a.remove(names::TENANT_PROJECT));

    let collected = syncer.collect(&key(), &older).await;
    assert!(
        matches!(collected, Err(StepError::Foreign)),
        "{collected:?}"
    );
    let mut reborn = tenant_object();
    reborn["metadata"]["uid"] = json!("t-2");
    let stale = syncer.update(&key(), &reborn, &older).await;
    assert!(matches!(stale, Err(StepError::Foreign)), "{stale:?}");
    assert!(host.received().is_empty(), "{:?}", host.received());

    // Its own tenant object's replace records the project.
    let mut changed = tenant_object();
    changed["spec"]["schedule"] = json!("@hourly");
    syncer
        .update(&key(), &changed, &older)
        .await
        .expect("replaced");
    let puts = host.with_method(http::Method::PUT);
    assert_eq!(puts.len(), 1, "{:?}", host.received());
    let annotations = &puts[0].body["metadata"]["annotations"];
    assert_eq!(annotations[names::TENANT_PROJECT], "default");
}

/// A tenant object and its mirror both removed while the watches were down leave
/// no event, only relists without them: what the syncer kept for the key is still
/// looked at by the resync, finds nothing on either side, and goes.
#[tokio::test]
async fn what_is_kept_for_a_key_gone_from_both_sides_goes_at_the_resync() {
    let ty = backups(&[]);
    let host = crate::fake_api::FakeApi::start(host_answers).await;
    let syncer = to_host(&ty, host.client.clone());
    let mirror = stored_mirror(&ty);
    syncer
        .last_writes()
        .insert(key(), LastWrite::of(&mirror, &mirror));
    syncer
        .observed_host_deletes()
        .insert(key(), "m-1".to_string());
    assert_eq!(syncer.all_keys(), [key()].into());
    let outcome = syncer.reconcile(&key()).await.expect("reconciled");
    assert_eq!(outcome, Outcome::Done);
    assert!(syncer.last_writes().is_empty());
    assert!(syncer.observed_host_deletes().is_empty());
    assert!(syncer.all_keys().is_empty());
    assert!(host.received().is_empty(), "{:?}", host.received());
}

/// A user who writes only in namespace `b-x-c` names Secret `a`: its host name,
/// `a-x-b-x-c-x-client`, is also that of Secret `a-x-b` in namespace `c`, which
/// the host controller would read for them. Such a reference has no mirror.
#[test]
fn a_reference_whose_host_name_is_ambiguous_is_refused() {
    let ty = backups(&["spec.secretRef.name"]);
    let refused = |namespace: &str, secret: &str| {
        let mut object = tenant_object();
        object["metadata"]["namespace"] = json!(namespace);
        object["spec"]["secretRef"]["name"] = json!(secret);
        desired_mirror(&ty, "client", "default", "vcluster-client", &object).err()
    };
    let error = refused("b-x-c", "a").expect("refused");
    assert_eq!(error.field, "spec.secretRef.name");
    assert_eq!(error.why, "the namespace contains \"-x-\"");
    assert_eq!(StepError::from(error.clone()).reason(), "invalid");
    let message = error.to_string();
    assert!(
        message.starts_with(
            "spec.secretRef.name: Invalid value: \"a\": in namespace \"b-x-c\" the reference cannot be translated to a host name: the namespace contains \"-x-\""
        ),
        "{message}"
    );
    assert_eq!(
        refused("b", "a-x").map(|e| e.why),
        Some("the name ends in \"-x\"")
    );
    assert_eq!(refused("b", "a"), None);
    // The object's own name is not a reference: its mirror's name is held by
    // whichever object came first (the ownership annotations decide).
    let mut own = tenant_object();
    own["metadata"]["name"] = json!("a-x-b");
    assert!(desired_mirror(&ty, "client", "default", "vcluster-client", &own).is_ok());
}

/// A tenant can write crproxy's stand-in marker on its object; copied, it would
/// make the mirror look like a stand-in, and every later step fail `too_deep`.
#[test]
fn the_stand_in_marker_never_reaches_the_mirror() {
    use crproxy_core::deep_objects::{is_stand_in, TOO_DEEP_ANNOTATION};
    let mut object = tenant_object();
    object["metadata"]["annotations"][TOO_DEEP_ANNOTATION] = json!("set by the tenant");
    let mirror =
        desired_mirror(&backups(&[]), "client", "default", "h", &object).expect("translatable");
    assert!(!is_stand_in(&mirror), "{mirror}");
    assert_eq!(mirror["metadata"]["annotations"]["note"], "x");
}

/// A host watch filtered by `managed-by` says DELETED when someone removes the
/// label from a mirror, and ADDED when it is put back: the mirror was never
/// deleted. Seen again (by the watch, or by a live read), it leaves no
/// observation behind, so its loss weeks later (a restored backup) creates it
/// again instead of deleting the tenant object.
#[tokio::test]
async fn a_mirror_seen_again_after_its_deleted_event_is_recreated_when_lost() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let ty = backups(&[]);
    let mirror: DynamicObject = serde_json::from_value(stored_mirror(&ty)).expect("object");
    for seen_by in ["the watch", "a live read"] {
        let on_host = Arc::new(AtomicBool::new(seen_by == "a live read"));
        let present = Arc::clone(&on_host);
        let stored = stored_mirror(&ty);
        let host =
            crate::fake_api::FakeApi::start(move |method: &http::Method, _: &str, body: &Value| {
                match *method {
                    http::Method::GET if present.load(Ordering::SeqCst) => (200, stored.clone()),
                    http::Method::POST => {
                        let mut created = body.clone();
                        created["metadata"]["uid"] = json!("m-1");
                        created["status"] = json!({"phase": "Pending"});
                        (201, created)
                    }
                    _ => crate::fake_api::not_found(),
                }
            })
            .await;
        // The tenant client refuses connections: a tenant delete fails the step.
        let syncer = to_host(&ty, host.client.clone());
        syncer.host_deleted(&mirror);
        if seen_by == "the watch" {
            syncer.host_seen(&mirror);
        } else {
            syncer
                .mirror_missing(&key(), &tenant_object())
                .await
                .expect("reconciled with the live mirror");
        }
        assert!(syncer.observed_host_deletes().is_empty(), "{seen_by}");
        // Lost later: created again.
        on_host.store(false, Ordering::SeqCst);
        let outcome = syncer
            .mirror_missing(&key(), &tenant_object())
            .await
            .expect("recreated, the tenant object left alone");
        assert_eq!(outcome, Outcome::Done, "{seen_by}");
        let posts = host.with_method(http::Method::POST);
        assert_eq!(posts.len(), 1, "{seen_by}: {:?}", host.received());
    }
}

/// The DELETED event of another mirror uid is no evidence about this one, and
/// the mirror seen again under another uid leaves the observation as it was.
#[tokio::test]
async fn only_the_mirror_seen_again_ends_its_observed_delete() {
    let ty = backups(&[]);
    let syncer = to_host(&ty, crate::fake_api::unreachable_api());
    let mirror: DynamicObject = serde_json::from_value(stored_mirror(&ty)).expect("object");
    let mut other = stored_mirror(&ty);
    other["metadata"]["uid"] = json!("m-2");
    let other: DynamicObject = serde_json::from_value(other).expect("object");
    syncer.host_deleted(&mirror);
    syncer.host_seen(&other);
    assert!(syncer.saw_host_delete(&key(), "m-1"));
    syncer.host_seen(&mirror);
    assert!(!syncer.saw_host_delete(&key(), "m-1"));
}

/// The host deleted the mirror, and the step is about to delete the tenant
/// object when a write-through of the key lands (it passed the pending check
/// before): the delete is pinned to the version the step read, so the updated
/// object is not deleted with its new mirror left orphaned; the step is looked at
/// again instead.
#[tokio::test]
async fn a_tenant_object_updated_after_the_step_read_it_is_not_deleted() {
    let ty = backups(&[]);
    let host = crate::fake_api::FakeApi::start(host_answers).await;
    // The tenant: the read answers version 7; by the delete, an update stored 8.
    let read = tenant_object();
    let tenant =
        crate::fake_api::FakeApi::start(move |method: &http::Method, _: &str, body: &Value| {
            match *method {
                http::Method::GET => (200, read.clone()),
                http::Method::DELETE => match body["preconditions"]["resourceVersion"].as_str() {
                    None | Some("8") => crate::fake_api::success(),
                    Some(_) => (
                        409,
                        crproxy_core::status::status(409, "Conflict", "Precondition failed"),
                    ),
                },
                _ => crate::fake_api::not_found(),
            }
        })
        .await;
    let mut syncer = to_host(&ty, host.client.clone());
    syncer.tenant_client = tenant.client.clone();
    let mirror: DynamicObject = serde_json::from_value(stored_mirror(&ty)).expect("object");
    syncer.host_deleted(&mirror);
    let outcome = syncer
        .mirror_missing(&key(), &tenant_object())
        .await
        .expect("reconciled");
    assert!(matches!(outcome, Outcome::Requeue(_)), "{outcome:?}");
    let deletes = tenant.with_method(http::Method::DELETE);
    assert_eq!(deletes.len(), 1, "{:?}", tenant.received());
    let preconditions = &deletes[0].body["preconditions"];
    assert_eq!(preconditions["uid"], "tenant-uid");
    assert_eq!(preconditions["resourceVersion"], "7");
    assert!(
        syncer.saw_host_delete(&key(), "m-1"),
        "the next step still knows the host deleted the mirror"
    );
}
