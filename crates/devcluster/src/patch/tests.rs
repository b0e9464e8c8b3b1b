use serde_json::{json, Value};

use super::*;

const T: &str = "2024-11-20T10:00:00Z";
const CT: &str = "stable.example.io/v1";
const LEASE: &str = "coordination.k8s.io/v1";

/// The managedFields of `obj` with times replaced by `<time>`, as the
/// reference recordings print them.
fn managed(obj: &Value) -> Value {
    let mut mf = obj
        .pointer("/metadata/managedFields")
        .cloned()
        .unwrap_or(Value::Null);
    if let Some(list) = mf.as_array_mut() {
        for e in list {
            if let Some(m) = e.as_object_mut() {
                if m.contains_key("time") {
                    m.insert("time".into(), json!("<time>"));
                }
            }
        }
    }
    mf
}

fn entry(manager: &str, op: &str, av: &str, fields: Value) -> Value {
    json!({"manager": manager, "operation": op, "apiVersion": av, "time": "<time>",
           "fieldsType": "FieldsV1", "fieldsV1": fields})
}

#[test]
fn merge_patch_rfc7386() {
    let cases = [
        (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
        (
            json!({"a": "b"}),
            json!({"b": "c"}),
            json!({"a": "b", "b": "c"}),
        ),
        (json!({"a": "b"}), json!({"a": null}), json!({})),
        (
            json!({"a": {"b": "c"}}),
            json!({"a": {"b": "d", "c": null}}),
            json!({"a": {"b": "d"}}),
        ),
        (
            json!({"a": [{"b": "c"}]}),
            json!({"a": [1]}),
            json!({"a": [1]}),
        ),
        (json!(["a", "b"]), json!({"a": "c"}), json!({"a": "c"})),
        (json!({"a": "foo"}), json!("bar"), json!("bar")),
        (
            json!({"e": null}),
            json!({"a": 1}),
            json!({"e": null, "a": 1}),
        ),
        (
            json!({}),
            json!({"a": {"bb": {"ccc": null}}}),
            json!({"a": {"bb": {}}}),
        ),
        // reference 031
        (
            json!({"metadata": {"labels": {"app": "cron"}}, "spec": {"image": "old", "replicas": 2}}),
            json!({"metadata": {"labels": {"patched": "merge"}}, "spec": {"image": "my-new-image"}}),
            json!({"metadata": {"labels": {"app": "cron", "patched": "merge"}}, "spec": {"image": "my-new-image", "replicas": 2}}),
        ),
    ];
    for (mut target, patch, want) in cases {
        merge_patch(&mut target, &patch);
        assert_eq!(target, want, "patch {patch}");
    }
}

#[test]
fn json_patch_rfc6902() {
    let base = json!({"metadata": {"name": "x"}, "spec": {"replicas": 2}});
    let cases: Vec<(Value, Result<Value, &str>)> = vec![
        // reference 032
        (
            json!([{"op": "replace", "path": "/spec/replicas", "value": 3},
                   {"op": "add", "path": "/metadata/annotations", "value": {"note": "json-patch"}}]),
            Ok(
                json!({"metadata": {"name": "x", "annotations": {"note": "json-patch"}}, "spec": {"replicas": 3}}),
            ),
        ),
        // reference 033: a failing test leaves the object untouched
        (
            json!([{"op": "test", "path": "/spec/replicas", "value": 99},
                   {"op": "replace", "path": "/spec/replicas", "value": 4}]),
            Err("failed"),
        ),
        (
            json!([{"op": "remove", "path": "/spec/missing"}]),
            Err("failed"),
        ),
        // Found by the property test: json-patch's own undo of this panics.
        (
            json!([{"op": "move", "from": "/spec/replicas", "path": "/spec"},
                   {"op": "add", "path": "/spec/", "value": false}]),
            Err("failed"),
        ),
        (json!({"op": "add"}), Err("malformed")),
        (
            json!([{"op": "frobnicate", "path": "/a"}]),
            Err("malformed"),
        ),
    ];
    for (patch, want) in cases {
        let mut target = base.clone();
        let got = json_patch(&mut target, &patch);
        match want {
            Ok(w) => {
                assert_eq!(got, Ok(()), "{patch}");
                assert_eq!(target, w);
            }
            Err(kind) => {
                assert_eq!(target, base, "{patch} must not change the target");
                match (kind, got) {
                    ("failed", Err(e @ PatchError::OperationFailed(_))) => assert_eq!(
                        e.status(),
                        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                               "message": "the server rejected our request due to an error in our request",
                               "reason": "Invalid", "details": {}, "code": 422})
                    ),
                    ("malformed", Err(e @ PatchError::Malformed(_))) => {
                        assert_eq!(e.status()["code"], 400)
                    }
                    (k, other) => panic!("{patch}: wanted {k}, got {other:?}"),
                }
            }
        }
    }
}

#[test]
fn strategic_merge_patch_cases() {
    let pod = json!({"metadata": {"name": "p", "finalizers": ["a"],
        "ownerReferences": [{"uid": "u1", "name": "o1"}]},
        "spec": {"containers": [
            {"name": "c1", "image": "i1", "ports": [{"containerPort": 80, "name": "http"}], "env": [{"name": "A", "value": "1"}]},
            {"name": "c2", "image": "i2"}],
            "tolerations": [{"key": "k1"}]}});
    let cases: Vec<(&str, Value, Value, Value)> = vec![
        // reference 143
        (
            "Lease",
            json!({"spec": {"holderIdentity": "a"}}),
            json!({"metadata": {"labels": {"smp": "ok"}}}),
            json!({"spec": {"holderIdentity": "a"}, "metadata": {"labels": {"smp": "ok"}}}),
        ),
        (
            "Pod",
            pod.clone(),
            json!({"metadata": {"finalizers": ["b", "a"]}}),
            {
                let mut p = pod.clone();
                p["metadata"]["finalizers"] = json!(["a", "b"]);
                p
            },
        ),
        (
            "Pod",
            pod.clone(),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
            {
                let mut p = pod.clone();
                p["metadata"]["finalizers"] = json!([]);
                p
            },
        ),
        (
            "Pod",
            pod.clone(),
            json!({"metadata": {"ownerReferences": [{"uid": "u2", "name": "o2"}]}}),
            {
                let mut p = pod.clone();
                p["metadata"]["ownerReferences"] =
                    json!([{"uid": "u1", "name": "o1"}, {"uid": "u2", "name": "o2"}]);
                p
            },
        ),
        (
            "Pod",
            pod.clone(),
            json!({"spec": {"containers": [{"name": "c1", "image": "new", "ports": [{"containerPort": 443}], "env": [{"name": "B", "value": "2"}]}],
                         "$setElementOrder/containers": [{"name": "c1"}, {"name": "c2"}]}}),
            {
                let mut p = pod.clone();
                p["spec"]["containers"][0] = json!({"name": "c1", "image": "new",
               "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443}],
               "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]});
                p
            },
        ),
        (
            "Pod",
            pod.clone(),
            json!({"spec": {"containers": [{"name": "c2", "$patch": "delete"}, {"name": "c3", "image": "i3"}]}}),
            {
                let mut p = pod.clone();
                p["spec"]["containers"] =
                    json!([pod["spec"]["containers"][0], {"name": "c3", "image": "i3"}]);
                p
            },
        ),
        (
            "Pod",
            pod.clone(),
            json!({"spec": {"containers": [{"name": "only", "image": "x"}, {"$patch": "replace"}]}}),
            {
                let mut p = pod.clone();
                p["spec"]["containers"] = json!([{"name": "only", "image": "x"}]);
                p
            },
        ),
        (
            "Pod",
            pod.clone(),
            json!({"spec": {"tolerations": [{"key": "k2"}], "containers": null}}),
            json!({"metadata": pod["metadata"], "spec": {"tolerations": [{"key": "k2"}]}}),
        ),
        (
            "Pod",
            pod.clone(),
            json!({"spec": {"$patch": "replace", "containers": []}}),
            json!({"metadata": pod["metadata"], "spec": {"containers": []}}),
        ),
        (
            "Pod",
            pod.clone(),
            json!({"spec": {"$patch": "delete"}}),
            json!({"metadata": pod["metadata"]}),
        ),
        (
            "Service",
            json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443}]}}),
            json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}], "$retainKeys": ["ports"]}}),
            json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}, {"port": 443}]}}),
        ),
    ];
    for (kind, mut target, patch, want) in cases {
        assert_eq!(
            strategic_merge_patch(&mut target, &patch, kind),
            Ok(()),
            "{patch}"
        );
        assert_eq!(target, want, "patch {patch}");
    }
    let mut t = pod.clone();
    assert!(matches!(
        strategic_merge_patch(
            &mut t,
            &json!({"spec": {"containers": [{"image": "nokey"}]}}),
            "Pod"
        ),
        Err(PatchError::Malformed(_))
    ));
    assert!(strategic_merge_patch(&mut t, &json!([1]), "Pod").is_err());
}

#[test]
fn fields_v1_round_trip() {
    let cases = [
        json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:spec": {".": {}, "f:cronSpec": {}}}),
        json!({"f:status": {"f:conditions": {"k:{\"type\":\"Established\"}": {".": {}, "f:status": {}, "f:type": {}}}}}),
        json!({"f:metadata": {"f:finalizers": {".": {}, "v:\"a\"": {}}}}),
        json!({"f:spec": {"f:items": {"i:0": {}}}}),
    ];
    for c in cases {
        assert_eq!(encode_set(&decode_set(&c)), c);
    }
    let set = decode_set(
        &json!({"f:spec": {"f:containers": {"k:{\"port\":80,\"name\":\"c\"}": {"f:image": {}}}}}),
    );
    let paths: Vec<String> = set.iter().map(display_path).collect();
    assert_eq!(paths, [".spec.containers[name=\"c\",port=80].image"]);
}

#[test]
fn update_tracks_crontab_like_the_reference() {
    // 017: create
    let mut obj = json!({"apiVersion": CT, "kind": "CronTab",
        "metadata": {"name": "my-crontab", "namespace": "ref-crud", "uid": "u", "resourceVersion": "1",
                     "generation": 1, "creationTimestamp": T, "labels": {"app": "cron", "tier": "backend"}},
        "spec": {"cronSpec": "* * * * */5", "image": "my-awesome-cron-image", "replicas": 1}});
    update_managed_fields(None, &mut obj, "reference-recorder", "Update", CT, None, T);
    let main = |labels: Value, spec: Value, extra: Option<(&str, Value)>| {
        let mut fields = json!({"f:metadata": {"f:labels": labels}, "f:spec": spec});
        if let Some((k, v)) = extra {
            fields["f:metadata"][k] = v;
        }
        entry("reference-recorder", "Update", CT, fields)
    };
    let labels = json!({".": {}, "f:app": {}, "f:tier": {}});
    let spec = json!({".": {}, "f:cronSpec": {}, "f:image": {}, "f:replicas": {}});
    assert_eq!(
        managed(&obj),
        json!([main(labels.clone(), spec.clone(), None)])
    );

    // 028: PUT sends managedFields back and changes replicas
    let old = obj.clone();
    let mut put = obj.clone();
    put["spec"]["replicas"] = json!(2);
    update_managed_fields(
        Some(&old),
        &mut put,
        "reference-recorder",
        "Update",
        CT,
        None,
        T,
    );
    assert_eq!(
        managed(&put),
        json!([main(labels.clone(), spec.clone(), None)])
    );

    // 031 + 032: merge patch adds a label, json patch adds an annotation
    let old = put.clone();
    let mut patched = put.clone();
    merge_patch(
        &mut patched,
        &json!({"metadata": {"labels": {"patched": "merge"}}, "spec": {"image": "my-new-image"}}),
    );
    update_managed_fields(
        Some(&old),
        &mut patched,
        "reference-recorder",
        "Update",
        CT,
        None,
        T,
    );
    let old = patched.clone();
    assert_eq!(
        json_patch(
            &mut patched,
            &json!([{"op": "add", "path": "/metadata/annotations", "value": {"note": "json-patch"}}])
        ),
        Ok(())
    );
    update_managed_fields(
        Some(&old),
        &mut patched,
        "reference-recorder",
        "Update",
        CT,
        None,
        T,
    );
    let labels = json!({".": {}, "f:app": {}, "f:patched": {}, "f:tier": {}});
    let annotations = json!({".": {}, "f:note": {}});
    assert_eq!(
        managed(&patched),
        json!([main(
            labels.clone(),
            spec.clone(),
            Some(("f:annotations", annotations.clone()))
        )])
    );

    // 064: PUT /status (spec restored, request labels kept)
    let old = patched.clone();
    let mut status = patched.clone();
    status["metadata"]["labels"]["via-status"] = json!("yes");
    status["status"] = json!({"replicas": 2, "labelSelector": "app=cron"});
    update_managed_fields(
        Some(&old),
        &mut status,
        "reference-recorder",
        "Update",
        CT,
        Some("status"),
        "2024-11-20T10:00:01Z",
    );
    let mut status_entry = entry(
        "reference-recorder",
        "Update",
        CT,
        json!({"f:metadata": {"f:labels": {"f:via-status": {}}}, "f:status": {".": {}, "f:labelSelector": {}, "f:replicas": {}}}),
    );
    status_entry["subresource"] = json!("status");
    assert_eq!(
        managed(&status),
        json!([
            main(
                labels.clone(),
                spec.clone(),
                Some(("f:annotations", annotations.clone()))
            ),
            status_entry
        ])
    );

    // 068/069: PATCH /scale moves spec.replicas to a time-less scale entry
    let old = status.clone();
    let mut scaled = status.clone();
    scaled["spec"]["replicas"] = json!(5);
    update_managed_fields(
        Some(&old),
        &mut scaled,
        "reference-recorder",
        "Update",
        CT,
        Some("scale"),
        T,
    );
    let scale_entry = json!({"manager": "reference-recorder", "operation": "Update", "apiVersion": CT,
        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}, "subresource": "scale"});
    let spec_wo_replicas = json!({".": {}, "f:cronSpec": {}, "f:image": {}});
    assert_eq!(
        managed(&scaled),
        json!([
            scale_entry,
            main(
                labels,
                spec_wo_replicas,
                Some(("f:annotations", annotations))
            ),
            status_entry
        ])
    );
}

#[test]
fn update_of_preserved_fields_and_removals() {
    // 076: a preserve-unknown-fields spec; nested maps are added as members
    let mut thing = json!({"apiVersion": CT, "kind": "ClusterThing", "metadata": {"name": "thing-1"},
        "spec": {"anything": {"nested": [1, 2, {"x": true}]}, "size": "large"}});
    update_managed_fields(
        None,
        &mut thing,
        "reference-recorder",
        "Update",
        CT,
        None,
        T,
    );
    assert_eq!(
        managed(&thing),
        json!([entry(
            "reference-recorder",
            "Update",
            CT,
            json!({"f:spec": {".": {}, "f:anything": {".": {}, "f:nested": {}}, "f:size": {}}})
        )])
    );
    // Removing a field removes it from every owner; an emptied entry disappears.
    let old = thing.clone();
    let mut smaller = thing.clone();
    smaller["spec"] = json!({"size": "large"});
    update_managed_fields(
        Some(&old),
        &mut smaller,
        "someone-else",
        "Update",
        CT,
        None,
        T,
    );
    assert_eq!(
        managed(&smaller),
        json!([entry(
            "reference-recorder",
            "Update",
            CT,
            json!({"f:spec": {".": {}, "f:size": {}}})
        )])
    );
    // No change by a new manager: no entry.
    let old = smaller.clone();
    let mut same = smaller.clone();
    update_managed_fields(Some(&old), &mut same, "idle", "Update", CT, None, T);
    assert_eq!(same, smaller);
}

#[test]
fn update_of_builtin_spec_is_not_a_member() {
    // A Lease created by POST: its spec struct exists in the zero value, so kube
    // lists only the leaves under f:spec.
    let mut lease = json!({"apiVersion": LEASE, "kind": "Lease", "metadata": {"name": "l", "namespace": "n"},
        "spec": {"holderIdentity": "a"}});
    update_managed_fields(None, &mut lease, "kubectl", "Update", LEASE, None, T);
    assert_eq!(
        managed(&lease),
        json!([entry(
            "kubectl",
            "Update",
            LEASE,
            json!({"f:spec": {"f:holderIdentity": {}}})
        )])
    );
    // A ConfigMap's data is a map that did not exist: it is a member.
    let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}});
    update_managed_fields(None, &mut cm, "kubectl", "Update", "v1", None, T);
    assert_eq!(
        managed(&cm),
        json!([entry(
            "kubectl",
            "Update",
            "v1",
            json!({"f:data": {".": {}, "f:k": {}}})
        )])
    );
}

#[test]
fn user_agent_manager_names() {
    for (ua, want) in [
        ("reference-recorder/1.0", "reference-recorder"),
        ("kubectl/v1.32.0 (linux/amd64) kubernetes/abc", "kubectl"),
        ("curl", "curl"),
        ("", ""),
    ] {
        assert_eq!(manager_from_user_agent(ua), want);
    }
}

fn apply_ok(live: Option<&Value>, cfg: &Value, manager: &str, force: bool, av: &str) -> Value {
    match apply(live, cfg, manager, force, av, None, T) {
        Ok(v) => v,
        Err(e) => panic!("apply by {manager} failed: {e:?}"),
    }
}

#[test]
fn apply_crontab_like_the_reference() {
    let cfg = json!({"apiVersion": CT, "kind": "CronTab", "metadata": {"name": "apply-crontab", "labels": {"app": "cron"}},
        "spec": {"cronSpec": "*/10 * * * *", "image": "apply-image", "replicas": 2}});
    // 036
    let created = apply_ok(None, &cfg, "test", false, CT);
    let test_all = json!({"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {"f:cronSpec": {}, "f:image": {}, "f:replicas": {}}});
    assert_eq!(
        managed(&created),
        json!([entry("test", "Apply", CT, test_all)])
    );
    assert_eq!(created["spec"], cfg["spec"]);
    // 037: no-op
    let again = apply_ok(Some(&created), &cfg, "test", false, CT);
    assert_eq!(again, created);
    // 038: conflict
    let other = json!({"apiVersion": CT, "kind": "CronTab", "metadata": {"name": "apply-crontab"}, "spec": {"replicas": 5}});
    match apply(Some(&created), &other, "other", false, CT, None, T) {
        Err(ApplyError::Conflicts(c)) => assert_eq!(
            apply_conflict_status(&c),
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Apply failed with 1 conflict: conflict with \"test\": .spec.replicas",
                "reason": "Conflict",
                "details": {"causes": [{"reason": "FieldManagerConflict", "message": "conflict with \"test\"", "field": ".spec.replicas"}]},
                "code": 409})
        ),
        other => panic!("expected a conflict, got {other:?}"),
    }
    // 039: force moves ownership
    let forced = apply_ok(Some(&created), &other, "other", true, CT);
    assert_eq!(forced["spec"]["replicas"], 5);
    let test_rest = json!({"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {"f:cronSpec": {}, "f:image": {}}});
    assert_eq!(
        managed(&forced),
        json!([
            entry("other", "Apply", CT, json!({"f:spec": {"f:replicas": {}}})),
            entry("test", "Apply", CT, test_rest.clone())
        ])
    );
    // 041: a third manager adds an annotation
    let ann = json!({"apiVersion": CT, "kind": "CronTab", "metadata": {"name": "apply-crontab", "annotations": {"by": "json"}}});
    let third = apply_ok(Some(&forced), &ann, "json-applier", false, CT);
    assert_eq!(third["metadata"]["annotations"], json!({"by": "json"}));
    assert_eq!(third["metadata"]["labels"], json!({"app": "cron"}));
    assert_eq!(
        managed(&third),
        json!([
            entry(
                "json-applier",
                "Apply",
                CT,
                json!({"f:metadata": {"f:annotations": {"f:by": {}}}})
            ),
            entry("other", "Apply", CT, json!({"f:spec": {"f:replicas": {}}})),
            entry("test", "Apply", CT, test_rest)
        ])
    );
}

fn lease_cfg(holder: &str, time: &str, transitions: i64, duration: Option<i64>) -> Value {
    let mut spec = json!({"holderIdentity": holder, "acquireTime": time, "renewTime": time, "leaseTransitions": transitions});
    if let Some(d) = duration {
        spec["leaseDurationSeconds"] = json!(d);
    }
    json!({"apiVersion": LEASE, "kind": "Lease", "metadata": {"name": "leader", "namespace": "ref-lease"}, "spec": spec})
}

#[test]
fn apply_lease_leader_election_like_the_reference() {
    // 135
    let lease = apply_ok(
        None,
        &lease_cfg("candidate-a", "2024-11-20T10:00:00.000000Z", 0, Some(15)),
        "leader-test",
        false,
        LEASE,
    );
    assert_eq!(
        managed(&lease),
        json!([entry(
            "leader-test",
            "Apply",
            LEASE,
            json!({"f:spec": {"f:acquireTime": {}, "f:holderIdentity": {},
            "f:leaseDurationSeconds": {}, "f:leaseTransitions": {}, "f:renewTime": {}}})
        )])
    );
    // 136: an Update renews
    let mut renewed = lease.clone();
    renewed["spec"]["renewTime"] = json!("2024-11-20T10:00:05.000000Z");
    update_managed_fields(
        Some(&lease),
        &mut renewed,
        "reference-recorder",
        "Update",
        LEASE,
        None,
        T,
    );
    assert_eq!(
        managed(&renewed),
        json!([
            entry(
                "leader-test",
                "Apply",
                LEASE,
                json!({"f:spec": {"f:acquireTime": {}, "f:holderIdentity": {},
                   "f:leaseDurationSeconds": {}, "f:leaseTransitions": {}}})
            ),
            entry(
                "reference-recorder",
                "Update",
                LEASE,
                json!({"f:spec": {"f:renewTime": {}}})
            )
        ])
    );
    // 138: applying a new renewTime conflicts with the Update manager
    let mut cfg = lease_cfg("candidate-a", "2024-11-20T10:00:00.000000Z", 0, Some(15));
    cfg["spec"]["renewTime"] = json!("2024-11-20T10:00:10.000000Z");
    match apply(Some(&renewed), &cfg, "leader-test", false, LEASE, None, T) {
        Err(ApplyError::Conflicts(c)) => assert_eq!(
            apply_conflict_status(&c)["message"],
            "Apply failed with 1 conflict: conflict with \"reference-recorder\" using coordination.k8s.io/v1: .spec.renewTime"
        ),
        other => panic!("expected a conflict, got {other:?}"),
    }
    // 140: a second candidate conflicts with both managers
    let b = lease_cfg("candidate-b", "2024-11-20T10:01:00.000000Z", 1, None);
    match apply(Some(&renewed), &b, "leader-test-b", false, LEASE, None, T) {
        Err(ApplyError::Conflicts(c)) => assert_eq!(
            apply_conflict_status(&c),
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Apply failed with 4 conflicts: conflicts with \"leader-test\":\n- .spec.acquireTime\n- .spec.holderIdentity\n- .spec.leaseTransitions\nconflicts with \"reference-recorder\" using coordination.k8s.io/v1:\n- .spec.renewTime",
                "reason": "Conflict",
                "details": {"causes": [
                    {"reason": "FieldManagerConflict", "message": "conflict with \"leader-test\"", "field": ".spec.acquireTime"},
                    {"reason": "FieldManagerConflict", "message": "conflict with \"leader-test\"", "field": ".spec.holderIdentity"},
                    {"reason": "FieldManagerConflict", "message": "conflict with \"leader-test\"", "field": ".spec.leaseTransitions"},
                    {"reason": "FieldManagerConflict", "message": "conflict with \"reference-recorder\" using coordination.k8s.io/v1", "field": ".spec.renewTime"}]},
                "code": 409})
        ),
        other => panic!("expected conflicts, got {other:?}"),
    }
    // 141: with force the second candidate takes over; the emptied Update entry goes
    let taken = apply_ok(Some(&renewed), &b, "leader-test-b", true, LEASE);
    assert_eq!(taken["spec"]["holderIdentity"], "candidate-b");
    assert_eq!(taken["spec"]["leaseDurationSeconds"], 15);
    assert_eq!(
        managed(&taken),
        json!([
            entry(
                "leader-test",
                "Apply",
                LEASE,
                json!({"f:spec": {"f:leaseDurationSeconds": {}}})
            ),
            entry(
                "leader-test-b",
                "Apply",
                LEASE,
                json!({"f:spec": {"f:acquireTime": {}, "f:holderIdentity": {},
                   "f:leaseTransitions": {}, "f:renewTime": {}}})
            )
        ])
    );
    // 143: a strategic merge patch by an Update manager adds labels
    let mut labelled = taken.clone();
    assert_eq!(
        strategic_merge_patch(
            &mut labelled,
            &json!({"metadata": {"labels": {"smp": "ok"}}}),
            "Lease"
        ),
        Ok(())
    );
    update_managed_fields(
        Some(&taken),
        &mut labelled,
        "reference-recorder",
        "Update",
        LEASE,
        None,
        T,
    );
    let mf = managed(&labelled);
    assert_eq!(mf.as_array().map(Vec::len), Some(3));
    assert_eq!(
        mf[2],
        entry(
            "reference-recorder",
            "Update",
            LEASE,
            json!({"f:metadata": {"f:labels": {".": {}, "f:smp": {}}}})
        )
    );
}

#[test]
fn apply_removes_dropped_fields_unless_owned_elsewhere() {
    let av = "example.com/v1";
    let cfg = |spec: Value| json!({"apiVersion": av, "kind": "Thing", "metadata": {"name": "t"}, "spec": spec});
    let first = apply_ok(
        None,
        &cfg(json!({"a": 1, "b": 2, "c": {"d": 3}})),
        "m",
        false,
        av,
    );
    let second = apply_ok(Some(&first), &cfg(json!({"a": 1})), "m", false, av);
    assert_eq!(second["spec"], json!({"a": 1}));

    // b is also owned by another manager (same value, so no conflict): it stays.
    let shared = apply_ok(Some(&first), &cfg(json!({"b": 2})), "n", false, av);
    let third = apply_ok(Some(&shared), &cfg(json!({"a": 1})), "m", false, av);
    assert_eq!(third["spec"], json!({"a": 1, "b": 2}));
    // Same-value co-ownership: both managers list b.
    let mf = managed(&shared);
    assert_eq!(
        mf[0]["fieldsV1"],
        json!({"f:spec": {"f:a": {}, "f:b": {}, "f:c": {"f:d": {}}}})
    );
    assert_eq!(mf[1]["fieldsV1"], json!({"f:spec": {"f:b": {}}}));

    // Lists in custom resources are atomic.
    let l1 = apply_ok(
        None,
        &cfg(json!({"items": [{"name": "x"}]})),
        "m",
        false,
        av,
    );
    assert_eq!(
        managed(&l1)[0]["fieldsV1"],
        json!({"f:spec": {"f:items": {}}})
    );
}

#[test]
fn apply_keyed_lists_of_builtins() {
    let av = "apps/v1";
    let cfg = |containers: Value| {
        json!({"apiVersion": av, "kind": "Deployment", "metadata": {"name": "d", "finalizers": ["x"]},
        "spec": {"template": {"spec": {"containers": containers}}}})
    };
    let d = apply_ok(
        None,
        &cfg(json!([{"name": "app", "image": "v1"}])),
        "a",
        false,
        av,
    );
    assert_eq!(
        managed(&d)[0]["fieldsV1"],
        json!({"f:metadata": {"f:finalizers": {"v:\"x\"": {}}},
               "f:spec": {"f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})
    );
    // Another manager adds a sidecar: the lists merge by name, no conflict.
    let d2 = apply_ok(
        Some(&d),
        &cfg(json!([{"name": "sidecar", "image": "s"}])),
        "b",
        false,
        av,
    );
    assert_eq!(
        d2["spec"]["template"]["spec"]["containers"],
        json!([{"name": "app", "image": "v1"}, {"name": "sidecar", "image": "s"}])
    );
    // Changing the app image by b conflicts with a at the keyed path.
    match apply(
        Some(&d2),
        &cfg(json!([{"name": "app", "image": "v2"}])),
        "b",
        false,
        av,
        None,
        T,
    ) {
        Err(ApplyError::Conflicts(c)) => {
            assert_eq!(c.len(), 1);
            assert_eq!(
                c[0].field,
                ".spec.template.spec.containers[name=\"app\"].image"
            );
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(
        apply(None, &json!([1]), "a", false, av, None, T),
        Err(ApplyError::NotAnObject)
    );
}

#[test]
fn schema_list_types_for_custom_resources() {
    let schema = match StructuralSchema::from_json(&json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "plain": {"type": "array", "items": {"type": "string"}}}},
        "status": {"type": "object", "properties": {
            "conditions": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                "items": {"type": "object", "properties": {"type": {"type": "string"}, "status": {"type": "string"}}}}}}}}))
    {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let av = "example.com/v1";
    let opts = |manager: &'static str| ApplyOptions {
        manager,
        force: false,
        api_version: av,
        subresource: Some("status"),
        now: T,
        schema: Some(&schema),
    };
    let cfg = |cond: Value| json!({"apiVersion": av, "kind": "Thing", "metadata": {"name": "t"}, "status": {"conditions": [cond]}});
    let live = json!({"apiVersion": av, "kind": "Thing", "metadata": {"name": "t"}, "spec": {"tags": ["a"], "plain": ["x"]}});
    let a = match apply_with(
        Some(&live),
        &cfg(json!({"type": "Ready", "status": "True"})),
        &opts("a"),
    ) {
        Ok(v) => v,
        Err(e) => panic!("{e:?}"),
    };
    let b = match apply_with(
        Some(&a),
        &cfg(json!({"type": "Synced", "status": "False"})),
        &opts("b"),
    ) {
        Ok(v) => v,
        Err(e) => panic!("{e:?}"),
    };
    assert_eq!(
        b["status"]["conditions"],
        json!([{"type": "Ready", "status": "True"}, {"type": "Synced", "status": "False"}])
    );
    let mf = managed(&b);
    assert_eq!(
        mf[0]["fieldsV1"],
        json!({"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}}}})
    );
    assert_eq!(mf[0]["subresource"], "status");

    // Update tracking with the schema: set items by value, plain lists atomic.
    let mut changed = live.clone();
    changed["spec"]["tags"] = json!(["a", "b"]);
    changed["spec"]["plain"] = json!(["y"]);
    update_managed_fields_with(
        Some(&live),
        &mut changed,
        &UpdateOptions {
            manager: "m",
            operation: "Update",
            api_version: av,
            subresource: None,
            now: T,
            schema: Some(&schema),
        },
    );
    assert_eq!(
        managed(&changed)[0]["fieldsV1"],
        json!({"f:spec": {"f:plain": {}, "f:tags": {"v:\"b\"": {}}}})
    );
}

mod properties {
    use proptest::prelude::*;
    use serde_json::{json, Map, Value};

    use super::super::*;

    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<bool>().prop_map(Value::Bool),
            (0i64..100).prop_map(|i| json!(i)),
            "[a-c]{0,3}".prop_map(Value::String),
        ]
    }

    fn spec() -> impl Strategy<Value = Value> {
        let leaf = scalar();
        leaf.prop_recursive(3, 24, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::btree_map("[a-d]", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect::<Map<String, Value>>())),
            ]
        })
    }

    fn obj(spec: Value) -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"}, "spec": spec})
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Re-applying the same configuration changes nothing.
        #[test]
        fn apply_is_idempotent(a in spec(), b in spec()) {
            let first = apply(None, &obj(a), "m", false, "example.com/v1", None, "2024-11-20T10:00:00Z")
                .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            let second = apply(Some(&first), &obj(b.clone()), "m", false, "example.com/v1", None, "2024-11-20T10:00:01Z")
                .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            let third = apply(Some(&second), &obj(b), "m", false, "example.com/v1", None, "2024-11-20T10:00:02Z")
                .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            prop_assert_eq!(third, second);
        }

        /// Strategic merge patches and JSON patches of any shape never panic,
        /// and a failed JSON patch leaves the target as it was.
        #[test]
        fn patches_never_panic(a in spec(), p in spec(), ops in prop::collection::vec(
            (prop_oneof![Just("add"), Just("remove"), Just("replace"), Just("test"), Just("move"), Just("copy")],
             "(/[a-d0-9-]{0,2}){0,3}", scalar()), 0..4)) {
            let mut t = obj(a.clone());
            let _ = strategic_merge_patch(&mut t, &json!({"spec": p.clone()}), "Pod");
            let _ = strategic_merge_patch(&mut t, &p, "Service");
            let patch: Vec<Value> = ops
                .into_iter()
                .map(|(op, path, value)| json!({"op": op, "path": format!("/spec{path}"), "from": "/spec/a", "value": value}))
                .collect();
            let before = obj(a);
            let mut target = before.clone();
            if json_patch(&mut target, &Value::Array(patch)).is_err() {
                prop_assert_eq!(target, before);
            }
        }

        /// managedFields survive encoding and decoding unchanged.
        #[test]
        fn fields_v1_round_trips(a in spec()) {
            let mut o = obj(a);
            update_managed_fields(None, &mut o, "m", "Update", "example.com/v1", None, "2024-11-20T10:00:00Z");
            if let Some(fields) = o.pointer("/metadata/managedFields/0/fieldsV1") {
                prop_assert_eq!(&encode_set(&decode_set(fields)), fields);
            }
        }

        /// A merge patch computed as "set every field of b" turns any a into a
        /// document containing b.
        #[test]
        fn merge_patch_applies_values(a in spec(), b in spec()) {
            let mut t = obj(a);
            merge_patch(&mut t, &json!({"spec": b.clone()}));
            match (&b, t.get("spec")) {
                (Value::Object(bm), Some(Value::Object(tm))) => {
                    for (k, v) in bm {
                        if !v.is_null() && !v.is_object() {
                            prop_assert_eq!(tm.get(k), Some(v));
                        }
                    }
                }
                (Value::Object(_), other) => prop_assert!(false, "spec became {:?}", other),
                (_, got) => prop_assert_eq!(got, Some(&b)),
            }
        }
    }
}
