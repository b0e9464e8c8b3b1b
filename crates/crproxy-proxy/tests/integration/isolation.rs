//! Owned-mode tenant isolation against a real API server (devcluster as the target,
//! over TLS): every body a caller sends either carries this client's labels on the
//! target or is refused, and no write or read lands on an object that was not owned
//! at that moment, even while the target's admin changes owner labels concurrently.
//!
//! The race tests run a bounded number of rounds (each a real interleaving of a
//! caller request through the proxy and an admin write straight to the target) and
//! count violations; before the pins existed, a third to a half of the rounds
//! produced one.

use crate::log_support;
use crate::target_support;

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use serde_json::{json, Value};

use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::Api;

use crproxy_core::config::AccessMode;
use log_support::LogBuffer;
use target_support::{
    harness, json_of, on_target, send, widget, widget_object, widget_resource, Harness, Reply,
    OWNER_LABELS, WIDGETS,
};

/// Rounds per race test: enough that an unpinned proxy loses many of them.
const RACE_ROUNDS: usize = 40;

fn owned_labels() -> Value {
    serde_json::from_str(OWNER_LABELS).expect("labels")
}

fn is_owned(object: &Value) -> bool {
    let labels = &object["metadata"]["labels"];
    labels["vcluster.com/owner-vcluster"] == "client"
        && labels["vcluster.com/owner-project"] == "default"
}

/// Every widget on the target carries this client's labels.
async fn assert_all_owned(h: &Harness) {
    let list = h.widgets.list(&ListParams::default()).await.expect("list");
    for item in list.items.iter().map(json_of) {
        assert!(is_owned(&item), "unlabelled object on the target: {item}");
    }
}

fn rv(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// How long the admin's write waits in round `round`: the rounds sweep the few
/// milliseconds between the proxy's check and its write, so some land inside.
fn stagger(round: usize) -> Duration {
    Duration::from_micros((round % 20) as u64 * 200)
}

/// The admin removes the owner labels of `name` after `delay` and returns the
/// object as written.
async fn unlabel_after(widgets: &Api<DynamicObject>, name: &str, delay: Duration) -> Option<Value> {
    tokio::time::sleep(delay).await;
    unlabel(widgets, name).await
}

/// The admin removes the owner labels of `name` and returns the object as written.
async fn unlabel(widgets: &Api<DynamicObject>, name: &str) -> Option<Value> {
    let patch = json!({"metadata": {"labels": {
        "vcluster.com/owner-vcluster": null, "vcluster.com/owner-project": null}}});
    widgets
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .ok()
        .map(|object| json_of(&object))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_the_proxy_cannot_read_strictly_are_refused_never_forwarded() {
    let h = harness(AccessMode::Owned).await;
    // No Content-Type is JSON, as kube-apiserver reads it: stamped like any create.
    let created = send(
        &h,
        "POST",
        WIDGETS,
        None,
        widget("plain", json!({})).to_string(),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert!(is_owned(&created.body), "{}", created.body);

    let refused: Vec<(&str, Option<&str>, Vec<u8>, u16)> = vec![
        (
            "lone surrogate",
            Some("application/json"),
            br#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"a","labels":{"x":"\ud800"}}}"#.to_vec(),
            400,
        ),
        (
            "raw 0xFF",
            None,
            b"{\"apiVersion\":\"example.com/v1\",\"kind\":\"Widget\",\"metadata\":{\"name\":\"b\xff\"}}".to_vec(),
            400,
        ),
        (
            "duplicate metadata",
            Some("application/json"),
            br#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"c"},"metadata":{"name":"c","labels":{"vcluster.com/owner-vcluster":"other"}}}"#.to_vec(),
            400,
        ),
        (
            "deep JSON",
            Some("application/json"),
            format!(
                r#"{{"apiVersion":"example.com/v1","kind":"Widget","metadata":{{"name":"d"}},"spec":{}0{}}}"#,
                "[".repeat(200),
                "]".repeat(200)
            )
            .into_bytes(),
            400,
        ),
        (
            "duplicate YAML key",
            Some("application/yaml"),
            b"apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: e\n  name: f\n".to_vec(),
            400,
        ),
        (
            "several YAML documents",
            Some("application/yaml"),
            b"apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: g\n---\napiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: h\n".to_vec(),
            400,
        ),
        (
            "protobuf",
            Some("application/vnd.kubernetes.protobuf"),
            b"k8s\x00\n\x0b".to_vec(),
            415,
        ),
    ];
    for (what, content_type, body, code) in refused {
        let reply = send(&h, "POST", WIDGETS, content_type, body).await;
        assert_eq!(reply.status, code, "{what}: {}", reply.body);
        assert_eq!(reply.body["kind"], "Status", "{what}");
    }

    // Writes to an owned object: the same bodies are refused, the object unchanged.
    let path = format!("{WIDGETS}/plain");
    let before = on_target(&h, "plain").await.expect("stored");
    let patches: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "merge patch with 0xFF",
            "application/merge-patch+json",
            b"{\"metadata\":{\"labels\":{\"vcluster.com/owner-vcluster\":\"other\xff\"}}}".to_vec(),
        ),
        (
            "apply with a duplicate key",
            "application/apply-patch+yaml",
            b"apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: plain\n  labels:\n    vcluster.com/owner-vcluster: other\n    vcluster.com/owner-vcluster: other\n".to_vec(),
        ),
        (
            "JSON patch with a lone surrogate",
            "application/json-patch+json",
            br#"[{"op":"replace","path":"/spec/replicas","value":"\udfff"}]"#.to_vec(),
        ),
    ];
    for (what, content_type, body) in patches {
        let reply = send(
            &h,
            "PATCH",
            &format!("{path}?fieldManager=t&force=true"),
            Some(content_type),
            body,
        )
        .await;
        assert_eq!(reply.status, 400, "{what}: {}", reply.body);
    }
    let after = on_target(&h, "plain").await.expect("stored");
    assert_eq!(rv(&after), rv(&before), "the object was not written");
    assert_all_owned(&h).await;
    h.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_three_mebibytes_get_kubes_413() {
    let h = harness(AccessMode::Owned).await;
    let mut big = widget("big", json!({}));
    big["spec"]["blob"] = json!("x".repeat(3 * 1024 * 1024));
    let reply = send(
        &h,
        "POST",
        WIDGETS,
        Some("application/json"),
        big.to_string(),
    )
    .await;
    assert_eq!(reply.status, 413, "{}", reply.body);
    assert_eq!(reply.body["reason"], "RequestEntityTooLarge");
    assert_eq!(
        reply.body["message"],
        "Request entity too large: limit is 3145728"
    );
    h.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_mode_keeps_continue_without_labels() {
    let h = harness(AccessMode::All).await;
    let body = b"apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: y\n---\n".to_vec();
    // Not one strict document for the proxy; forwarded as it came, for the target
    // to judge (accessResources: all hides nothing, so nothing can leak).
    let reply = send(&h, "POST", WIDGETS, Some("application/yaml"), body).await;
    let message = reply.body["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("the object provided is unrecognized"),
        "the target's answer, not the proxy's: {}",
        reply.body
    );
    let plain = send(
        &h,
        "POST",
        WIDGETS,
        None,
        widget("z", json!({})).to_string(),
    )
    .await;
    assert_eq!(plain.status, 201, "{}", plain.body);
    assert!(
        is_owned(&plain.body),
        "creates are still stamped: {}",
        plain.body
    );
    h.proxy.shutdown().await;
}

/// In all mode a replace whose body names no owner is stamped, so a PUT without
/// labels does not strip them; one that names an owner (another client's object
/// sent back as it was read) keeps that owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_mode_stamps_a_replace_that_names_no_owner() {
    let h = harness(AccessMode::All).await;
    let created = send(
        &h,
        "POST",
        WIDGETS,
        Some("application/json"),
        widget("r", json!({})).to_string(),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let mut replaced = widget("r", json!({"app": "x"}));
    replaced["metadata"]["resourceVersion"] = created.body["metadata"]["resourceVersion"].clone();
    replaced["spec"]["replicas"] = json!(2);
    let put = send(
        &h,
        "PUT",
        &format!("{WIDGETS}/r"),
        Some("application/json"),
        replaced.to_string(),
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    let stored = on_target(&h, "r").await.expect("replaced");
    assert_eq!(stored["spec"]["replicas"], 2, "{stored}");
    assert!(is_owned(&stored), "the replace kept the labels: {stored}");
    assert_eq!(stored["metadata"]["labels"]["app"], "x", "{stored}");

    // Another client's object, read and sent back with a change: still theirs.
    let theirs =
        json!({"vcluster.com/owner-vcluster": "other", "vcluster.com/owner-project": "team"});
    create_on_target(&h, "t", theirs.clone()).await;
    let mut read = on_target(&h, "t").await.expect("theirs");
    read["spec"]["replicas"] = json!(4);
    let put = send(
        &h,
        "PUT",
        &format!("{WIDGETS}/t"),
        Some("application/json"),
        read.to_string(),
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    let stored = on_target(&h, "t").await.expect("replaced");
    assert_eq!(stored["spec"]["replicas"], 4, "{stored}");
    assert_eq!(stored["metadata"]["labels"], theirs, "{stored}");
    h.proxy.shutdown().await;
}

/// All-mode patches go as they came: another client's object keeps its owner, and
/// a JSON patch of an object without labels (whose `add` under
/// `/metadata/labels` would fail) is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_mode_patches_leave_ownership_alone() {
    let h = harness(AccessMode::All).await;
    let theirs =
        json!({"vcluster.com/owner-vcluster": "other", "vcluster.com/owner-project": "team"});
    create_on_target(&h, "a", theirs.clone()).await;
    let patch = send(
        &h,
        "PATCH",
        &format!("{WIDGETS}/a"),
        Some("application/merge-patch+json"),
        json!({"metadata": {"annotations": {"seen": "yes"}}}).to_string(),
    )
    .await;
    assert_eq!(patch.status, 200, "{}", patch.body);
    let stored = on_target(&h, "a").await.expect("patched");
    assert_eq!(stored["metadata"]["annotations"]["seen"], "yes", "{stored}");
    assert_eq!(stored["metadata"]["labels"], theirs, "{stored}");

    create_on_target(&h, "bare", Value::Null).await;
    let patch = send(
        &h,
        "PATCH",
        &format!("{WIDGETS}/bare"),
        Some("application/json-patch+json"),
        json!([{"op": "replace", "path": "/spec/replicas", "value": 5}]).to_string(),
    )
    .await;
    assert_eq!(patch.status, 200, "{}", patch.body);
    let stored = on_target(&h, "bare").await.expect("patched");
    assert_eq!(stored["spec"]["replicas"], 5, "{stored}");
    h.proxy.shutdown().await;
}

/// A replace the proxy cannot label goes to the target as it came, and the target
/// gives its own answer; the failed injection is logged. A current-thread runtime,
/// so the log capture sees the proxy's events.
#[tokio::test]
async fn all_mode_forwards_an_unlabellable_replace_and_logs_it() {
    let (logs, _guard) = LogBuffer::capture();
    let h = harness(AccessMode::All).await;
    create_on_target(&h, "m", json!({})).await;
    // Two YAML documents: not one strict document for the proxy.
    let body = b"apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: m\n---\n".to_vec();
    let put = send(
        &h,
        "PUT",
        &format!("{WIDGETS}/m"),
        Some("application/yaml"),
        body,
    )
    .await;
    assert_eq!(put.status, 400, "{}", put.body);
    let message = put.body["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("the object provided is unrecognized"),
        "the target's answer, not the proxy's: {}",
        put.body
    );
    let logged = logs.text();
    let line = logged
        .lines()
        .find(|l| l.contains("inject source labels failed"))
        .unwrap_or_else(|| panic!("not logged: {logged}"));
    assert!(line.contains("target=default/target"), "{line}");
    let stored = on_target(&h, "m").await.expect("still there");
    assert_eq!(stored["spec"]["replicas"], 1, "{stored}");
    h.proxy.shutdown().await;
}

/// Creates `name` straight on the target with `labels`.
async fn create_on_target(h: &Harness, name: &str, labels: Value) {
    h.widgets
        .create(&PostParams::default(), &widget_object(name, labels))
        .await
        .expect("created on the target");
}

/// Creates `name` owned by the client, straight on the target.
async fn owned_widget(h: &Harness, name: &str) -> Value {
    let created = h
        .widgets
        .create(&PostParams::default(), &widget_object(name, owned_labels()))
        .await
        .expect("created");
    json_of(&created)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_never_lands_on_an_object_that_lost_its_labels() {
    let h = harness(AccessMode::Owned).await;
    let mut violations = Vec::new();
    for round in 0..RACE_ROUNDS {
        let name = format!("p{round}");
        owned_widget(&h, &name).await;
        let path = format!("{WIDGETS}/{name}");
        let patch = send(
            &h,
            "PATCH",
            &path,
            Some("application/merge-patch+json"),
            r#"{"spec":{"replicas":7}}"#,
        );
        let (patched, unlabelled) =
            tokio::join!(patch, unlabel_after(&h.widgets, &name, stagger(round)));
        let unlabelled = unlabelled.expect("admin unlabels");
        // Any write after the admin's is a write to an object that was not owned.
        if patched.status == 200 && rv(&patched.body) > rv(&unlabelled) {
            violations.push(name.clone());
        }
        let stored = on_target(&h, &name).await.expect("stored");
        if stored["spec"]["replicas"] == 7 && !is_owned(&stored) && rv(&stored) > rv(&unlabelled) {
            violations.push(format!("{name} (stored)"));
        }
    }
    assert!(
        violations.is_empty(),
        "patched after unlabelling: {violations:?}"
    );
    h.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_never_removes_an_object_that_lost_its_labels() {
    let h = harness(AccessMode::Owned).await;
    let mut violations = Vec::new();
    for round in 0..RACE_ROUNDS {
        let name = format!("d{round}");
        owned_widget(&h, &name).await;
        let path = format!("{WIDGETS}/{name}");
        let delete = send(&h, "DELETE", &path, None, Bytes::new());
        let (_, unlabelled) =
            tokio::join!(delete, unlabel_after(&h.widgets, &name, stagger(round)));
        // The admin's write succeeded, so the object was unlabelled while it still
        // existed; from then on nobody but the admin may delete it.
        if unlabelled.is_some() && on_target(&h, &name).await.is_none() {
            violations.push(name);
        }
    }
    assert!(
        violations.is_empty(),
        "deleted after unlabelling: {violations:?}"
    );
    h.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_that_creates_never_takes_over_an_object_created_meanwhile() {
    let h = harness(AccessMode::Owned).await;
    let mut violations = Vec::new();
    for round in 0..RACE_ROUNDS {
        let name = format!("a{round}");
        let path = format!("{WIDGETS}/{name}?fieldManager=tenant&force=true");
        let applied = format!(
            "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: {name}\n  namespace: demo\nspec:\n  replicas: 5\n"
        );
        let apply = send(
            &h,
            "PATCH",
            &path,
            Some("application/apply-patch+yaml"),
            applied,
        );
        let foreign_widget = widget_object(&name, json!({"team": "admin"}));
        let foreign = async {
            tokio::time::sleep(stagger(round)).await;
            h.widgets
                .create(&PostParams::default(), &foreign_widget)
                .await
        };
        let (_, created) = tokio::join!(apply, foreign);
        // The admin's create won the name: the object is the admin's and must stay
        // unlabelled and untouched.
        if created.is_ok() {
            let stored = on_target(&h, &name).await.expect("stored");
            if is_owned(&stored) || stored["spec"]["replicas"] == 5 {
                violations.push(name);
            }
        }
    }
    assert!(violations.is_empty(), "taken over: {violations:?}");
    h.proxy.shutdown().await;
}

/// Owned deletecollection is list-owned + pinned deletes. devcluster deletes a
/// collection under one lock, so unlike kube-apiserver (list, then delete one by
/// one) it has no window of its own to show; this test pins down that only owned
/// objects go, the answer lists only owned objects, and an object unlabelled while
/// the sweep runs survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletecollection_never_removes_an_object_that_lost_its_labels() {
    let h = harness(AccessMode::Owned).await;
    let mut violations = Vec::new();
    for round in 0..RACE_ROUNDS / 4 {
        let names: Vec<String> = (0..4).map(|i| format!("c{round}-{i}")).collect();
        for name in &names {
            owned_widget(&h, name).await;
        }
        let foreign = format!("c{round}-foreign");
        h.widgets
            .create(&PostParams::default(), &widget_object(&foreign, json!({})))
            .await
            .expect("foreign");
        let sweep = send(&h, "DELETE", WIDGETS, None, Bytes::new());
        let (swept, unlabelled) = tokio::join!(
            sweep,
            unlabel_after(&h.widgets, &names[3], stagger(round * 4))
        );
        assert_eq!(swept.status, 200, "{}", swept.body);
        for item in swept.body["items"].as_array().expect("items") {
            assert!(is_owned(item), "answered with an unowned object: {item}");
        }
        if on_target(&h, &foreign).await.is_none() {
            violations.push(foreign);
        }
        if unlabelled.is_some() && on_target(&h, &names[3]).await.is_none() {
            violations.push(names[3].clone());
        }
        // The objects that stayed owned are gone.
        for name in &names[..3] {
            assert!(on_target(&h, name).await.is_none(), "{name}");
        }
    }
    assert!(
        violations.is_empty(),
        "deleted while not owned: {violations:?}"
    );
    h.proxy.shutdown().await;
}

/// A deletecollection without a namespace in its path deletes across namespaces, as
/// kube's does: each owned object at its own namespace's path, foreign ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_wide_deletecollection_deletes_owned_objects_in_every_namespace() {
    let h = harness(AccessMode::Owned).await;
    let other: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "other"}})).expect("namespace");
    Api::all(h.admin.clone())
        .create(&PostParams::default(), &other)
        .await
        .expect("namespace created on the target");
    let other_widgets: Api<DynamicObject> =
        Api::namespaced_with(h.admin.clone(), "other", &widget_resource());
    let in_other = |name: &str, labels: Value| -> DynamicObject {
        let mut object = widget(name, labels);
        object["metadata"]["namespace"] = json!("other");
        serde_json::from_value(object).expect("widget")
    };
    owned_widget(&h, "mine-demo").await;
    h.widgets
        .create(
            &PostParams::default(),
            &widget_object("theirs-demo", json!({})),
        )
        .await
        .expect("foreign in demo");
    for (name, labels) in [("mine-other", owned_labels()), ("theirs-other", json!({}))] {
        other_widgets
            .create(&PostParams::default(), &in_other(name, labels))
            .await
            .expect("created in other");
    }

    let swept = send(
        &h,
        "DELETE",
        "/apis/example.com/v1/widgets",
        None,
        Bytes::new(),
    )
    .await;
    assert_eq!(swept.status, 200, "{}", swept.body);
    let mut names: Vec<String> = swept.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| {
            format!(
                "{}/{}",
                item["metadata"]["namespace"].as_str().unwrap_or_default(),
                item["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    names.sort();
    assert_eq!(names, ["demo/mine-demo", "other/mine-other"]);
    assert!(on_target(&h, "mine-demo").await.is_none());
    assert!(on_target(&h, "theirs-demo").await.is_some());
    assert!(other_widgets
        .get_opt("mine-other")
        .await
        .expect("get")
        .is_none());
    assert!(other_widgets
        .get_opt("theirs-other")
        .await
        .expect("get")
        .is_some());
    h.proxy.shutdown().await;
}

/// kube's deletecollection lists with the query's list options and ignores the
/// watch-only ones; the proxy's own list must not turn into a watch either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletecollection_with_watch_options_in_its_query_still_lists() {
    let h = harness(AccessMode::Owned).await;
    owned_widget(&h, "swept").await;
    let swept = send(
        &h,
        "DELETE",
        &format!("{WIDGETS}?watch=true&allowWatchBookmarks=true"),
        None,
        Bytes::new(),
    )
    .await;
    assert_eq!(swept.status, 200, "{}", swept.body);
    assert_eq!(
        swept.body["items"][0]["metadata"]["name"], "swept",
        "{}",
        swept.body
    );
    assert!(on_target(&h, "swept").await.is_none());
    // Options kube refuses for a list are refused, and nothing is deleted.
    owned_widget(&h, "kept").await;
    let refused = send(
        &h,
        "DELETE",
        &format!("{WIDGETS}?sendInitialEvents=true"),
        None,
        Bytes::new(),
    )
    .await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(on_target(&h, "kept").await.is_some());
    h.proxy.shutdown().await;
}

/// More owned objects than one page of the sweep's list (500), and more bytes than
/// the 16 MiB the proxy reads of one target answer: the deletecollection lists
/// them page by page and deletes every one; foreign objects stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletecollection_deletes_more_owned_objects_than_one_answer_can_hold() {
    const OWNED: usize = 520;
    let h = harness(AccessMode::Owned).await;
    // 520 objects of some 34 KiB: about 17.5 MiB as one list.
    let filler = "x".repeat(34 * 1024);
    let creates = futures_util::stream::iter(0..OWNED)
        .map(|i| {
            let mut object = widget(&format!("bulk-{i:04}"), owned_labels());
            object["spec"]["filler"] = json!(filler);
            let object: DynamicObject = serde_json::from_value(object).expect("widget");
            let widgets = h.widgets.clone();
            async move { widgets.create(&PostParams::default(), &object).await }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    assert!(creates.iter().all(Result::is_ok), "every create succeeds");
    for name in ["theirs-1", "theirs-2"] {
        h.widgets
            .create(&PostParams::default(), &widget_object(name, json!({})))
            .await
            .expect("foreign");
    }

    let swept = send(&h, "DELETE", WIDGETS, None, Bytes::new()).await;
    assert_eq!(swept.status, 200, "{}", swept.body["message"]);
    // The target's own list envelope, as one list would have it.
    assert_eq!(swept.body["kind"], "WidgetList");
    assert_eq!(swept.body["apiVersion"], "example.com/v1");
    assert!(swept.body["metadata"].get("continue").is_none());
    let items = swept.body["items"].as_array().expect("items");
    assert_eq!(items.len(), OWNED, "every owned object is answered");
    assert!(items.iter().all(is_owned), "answered only owned objects");
    let left: Vec<String> = h
        .widgets
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .filter_map(|object| object.metadata.name.clone())
        .collect();
    assert_eq!(left, ["theirs-1", "theirs-2"]);
    h.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subresource_answers_never_show_an_object_that_lost_its_labels() {
    let h = harness(AccessMode::Owned).await;
    let mut violations = Vec::new();
    for round in 0..RACE_ROUNDS {
        let name = format!("s{round}");
        owned_widget(&h, &name).await;
        let status_path = format!("{WIDGETS}/{name}/status");
        let status = send(&h, "GET", &status_path, None, Bytes::new());
        let (shown, unlabelled) =
            tokio::join!(status, unlabel_after(&h.widgets, &name, stagger(round)));
        let unlabelled = unlabelled.expect("admin unlabels");
        if shown.status == 200 && !is_owned(&shown.body) {
            violations.push(format!("{name}: {}", shown.body));
        }
        assert!(shown.status == 200 || shown.status == 404, "{shown:?}");
        let _ = unlabelled;
    }
    // A Scale carries no labels: shown only as the state that was checked.
    owned_widget(&h, "scaled").await;
    let scale = send(
        &h,
        "GET",
        &format!("{WIDGETS}/scaled/scale"),
        None,
        Bytes::new(),
    )
    .await;
    assert_eq!(scale.status, 200, "{}", scale.body);
    assert_eq!(scale.body["kind"], "Scale");
    unlabel(&h.widgets, "scaled").await.expect("unlabel");
    let scale = send(
        &h,
        "GET",
        &format!("{WIDGETS}/scaled/scale"),
        None,
        Bytes::new(),
    )
    .await;
    assert_eq!(scale.status, 404, "{}", scale.body);
    assert!(
        violations.is_empty(),
        "shown while not owned: {violations:?}"
    );
    h.proxy.shutdown().await;
}

/// An owned watch shows only this client's objects: neither the ones already
/// there when it opens nor the ones created while it runs may show another
/// client's object, one labelled for this client by half, or one without
/// labels. The watch runs until the owned object created last arrives; the
/// target sends events in the order of its writes, so an unfiltered watch
/// would have shown the others before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owned_watch_shows_no_object_this_client_does_not_own() {
    use http_body_util::BodyExt as _;
    let h = harness(AccessMode::Owned).await;
    let not_owned = [
        ("unlabelled", json!({})),
        (
            "other-client",
            json!({"vcluster.com/owner-vcluster": "other", "vcluster.com/owner-project": "default"}),
        ),
        (
            "half-owned",
            json!({"vcluster.com/owner-vcluster": "client"}),
        ),
    ];
    for (name, labels) in &not_owned {
        create_on_target(&h, &format!("{name}-before"), labels.clone()).await;
    }
    owned_widget(&h, "owned-before").await;

    let mut sender = target_support::caller_h2::<http_body_util::Empty<Bytes>>(
        h.addr,
        &h.serving_ca_pem,
        &h.front_proxy_client,
    )
    .await;
    let request = target_support::aggregator_get(&format!("{WIDGETS}?watch=true"));
    let response = tokio::time::timeout(Duration::from_secs(20), sender.send_request(request))
        .await
        .expect("watch answered within 20 s")
        .expect("watch response");
    assert_eq!(response.status(), 200);
    for (name, labels) in &not_owned {
        create_on_target(&h, &format!("{name}-after"), labels.clone()).await;
    }
    owned_widget(&h, "owned-after").await;

    // Bounded: at most 200 frames, and 20 s.
    let mut body = response.into_body();
    let mut text = String::new();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        for _ in 0..200 {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        text.push_str(&String::from_utf8_lossy(&data));
                    }
                    if text.contains("\"owned-after\"") && text.ends_with('\n') {
                        return;
                    }
                }
                None | Some(Err(_)) => return,
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no event for owned-after within 20 s: {text}");
    let shown: Vec<(String, String)> = text
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("a watch event"))
        .map(|event| {
            let name = event["object"]["metadata"]["name"]
                .as_str()
                .unwrap_or_default();
            (
                event["type"].as_str().unwrap_or_default().to_owned(),
                name.to_owned(),
            )
        })
        .collect();
    let added = |name: &str| ("ADDED".to_owned(), name.to_owned());
    assert_eq!(
        shown,
        [added("owned-before"), added("owned-after")],
        "{text}"
    );
    h.proxy.shutdown().await;
}

/// Another tenant's object and no object at all get the same 404, byte for byte
/// and header for header (but `date`), for every named verb: the target's own
/// answer for a missing object would otherwise tell a caller which names other
/// tenants use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hidden_object_and_a_missing_one_get_the_same_404() {
    const JSON: &str = "application/json";
    const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
    const LIST_METADATA: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
    let h = harness(AccessMode::Owned).await;
    let path = format!("{WIDGETS}/taken");
    let replacement = widget("taken", owned_labels()).to_string();
    // (method, path, content type, body, Accept). The last three GETs are ones
    // kube fails only after reading the object (a 400 and a 500 for it, a 404
    // without it).
    let bogus_table = format!("{path}?includeObject=Bogus");
    let requests: [(&str, String, Option<&str>, &str, &str); 10] = [
        ("GET", path.clone(), None, "", JSON),
        ("HEAD", path.clone(), None, "", JSON),
        ("GET", format!("{path}/status"), None, "", JSON),
        ("GET", format!("{path}/scale"), None, "", JSON),
        ("PUT", path.clone(), Some(JSON), &replacement, JSON),
        (
            "PATCH",
            path.clone(),
            Some("application/merge-patch+json"),
            r#"{"spec":{"replicas":2}}"#,
            JSON,
        ),
        ("DELETE", path.clone(), None, "", JSON),
        ("GET", bogus_table.clone(), None, "", TABLE),
        ("HEAD", bogus_table, None, "", TABLE),
        ("GET", path.clone(), None, "", LIST_METADATA),
    ];
    async fn answers(
        h: &Harness,
        requests: &[(&str, String, Option<&str>, &str, &str)],
    ) -> Vec<Reply> {
        let mut replies = Vec::new();
        for (method, path, content_type, body, accept) in requests {
            let mut reply = target_support::send_accepting(
                &h.aggregator,
                method,
                path,
                accept,
                *content_type,
                body.to_string(),
            )
            .await;
            reply.headers.remove(http::header::DATE);
            replies.push(reply);
        }
        replies
    }
    let other_tenant = json!({
        "vcluster.com/owner-vcluster": "other", "vcluster.com/owner-project": "default"});
    create_on_target(&h, "taken", other_tenant).await;
    let hidden = answers(&h, &requests).await;
    h.widgets
        .delete("taken", &Default::default())
        .await
        .expect("deleted on the target");
    let missing = answers(&h, &requests).await;
    for (((method, path, .., accept), hidden), missing) in
        requests.iter().zip(&hidden).zip(&missing)
    {
        assert_eq!(hidden.status, 404, "{method} {path} {accept}: {hidden:?}");
        assert_eq!(missing.status, 404, "{method} {path} {accept}: {missing:?}");
        assert_eq!(hidden.bytes, missing.bytes, "{method} {path} {accept}");
        // As kube's encoder ends every JSON answer.
        if *method != "HEAD" {
            assert!(hidden.bytes.ends_with(b"}\n"), "{method} {path}");
        }
        assert_eq!(hidden.headers, missing.headers, "{method} {path} {accept}");
    }
    h.proxy.shutdown().await;
}

/// A Scale carries no labels, so it is shown as the checked state; an update of
/// the object that keeps it owned (its controller's, say) landing between the
/// check and the read must not make the read a 404: the object is checked again.
/// Each round's one update can move the object once, so every read is a 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_read_survives_an_update_that_keeps_the_object_owned() {
    let h = harness(AccessMode::Owned).await;
    let mut missing = Vec::new();
    for round in 0..RACE_ROUNDS {
        let name = format!("busy{round}");
        owned_widget(&h, &name).await;
        let scale_path = format!("{WIDGETS}/{name}/scale");
        let scale = send(&h, "GET", &scale_path, None, Bytes::new());
        let update = async {
            tokio::time::sleep(stagger(round)).await;
            let patch = json!({"spec": {"size": round}});
            h.widgets
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("admin updates")
        };
        let (shown, _) = tokio::join!(scale, update);
        if shown.status != 200 {
            missing.push(format!("{name}: {} {}", shown.status, shown.body));
        }
    }
    assert!(missing.is_empty(), "owned, yet not shown: {missing:?}");
    h.proxy.shutdown().await;
}

/// A Scale is a view of the object: its uid and resourceVersion, no labels. Every
/// kind of write to it works for an owned object, is pinned to the checked state,
/// and never reaches an object that is not owned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_writes_are_pinned_without_labels_in_their_body() {
    let h = harness(AccessMode::Owned).await;
    owned_widget(&h, "scaled").await;
    let path = format!("{WIDGETS}/scaled/scale");
    for (replicas, content_type, body) in [
        (
            2,
            "application/merge-patch+json",
            r#"{"spec":{"replicas":2}}"#,
        ),
        (
            3,
            "application/json-patch+json",
            r#"[{"op":"replace","path":"/spec/replicas","value":3}]"#,
        ),
    ] {
        let reply = send(&h, "PATCH", &path, Some(content_type), body).await;
        assert_eq!(reply.status, 200, "{content_type}: {}", reply.body);
        assert_eq!(reply.body["kind"], "Scale", "{}", reply.body);
        let stored = on_target(&h, "scaled").await.expect("stored");
        assert_eq!(stored["spec"]["replicas"], replicas, "{content_type}");
        assert!(is_owned(&stored), "{stored}");
    }
    let mut scale = send(&h, "GET", &path, None, Bytes::new()).await.body;
    scale["spec"]["replicas"] = json!(4);
    let put = send(
        &h,
        "PUT",
        &path,
        Some("application/json"),
        scale.to_string(),
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    assert_eq!(
        on_target(&h, "scaled").await.expect("stored")["spec"]["replicas"],
        4
    );
    // Not owned any more: every write is masked and nothing changes.
    unlabel(&h.widgets, "scaled").await.expect("unlabel");
    for (content_type, body) in [
        ("application/merge-patch+json", r#"{"spec":{"replicas":9}}"#),
        (
            "application/json-patch+json",
            r#"[{"op":"replace","path":"/spec/replicas","value":9}]"#,
        ),
    ] {
        let reply = send(&h, "PATCH", &path, Some(content_type), body).await;
        assert_eq!(reply.status, 404, "{content_type}: {}", reply.body);
    }
    assert_eq!(
        on_target(&h, "scaled").await.expect("stored")["spec"]["replicas"],
        4
    );
    h.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_writes_still_work_with_their_pins() {
    let h = harness(AccessMode::Owned).await;
    owned_widget(&h, "w").await;
    let path = format!("{WIDGETS}/w");
    for (content_type, body) in [
        ("application/merge-patch+json", r#"{"spec":{"replicas":2}}"#.to_string()),
        (
            "application/json-patch+json",
            r#"[{"op":"replace","path":"/spec/replicas","value":3}]"#.to_string(),
        ),
        (
            "application/apply-patch+yaml",
            "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n  namespace: demo\nspec:\n  replicas: 4\n"
                .to_string(),
        ),
    ] {
        let reply = send(
            &h,
            "PATCH",
            &format!("{path}?fieldManager=tenant&force=true"),
            Some(content_type),
            body,
        )
        .await;
        assert_eq!(reply.status, 200, "{content_type}: {}", reply.body);
        assert!(is_owned(&reply.body), "{}", reply.body);
    }
    // A PUT of the current resourceVersion writes; without one it is refused
    // (422) and with a stale one it is a conflict, as on kube.
    let mut current = on_target(&h, "w").await.expect("stored");
    current["spec"]["replicas"] = json!(6);
    let put = send(
        &h,
        "PUT",
        &path,
        Some("application/json"),
        current.to_string(),
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    let mut unversioned = put.body.clone();
    unversioned["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("resourceVersion");
    let refused = send(
        &h,
        "PUT",
        &path,
        Some("application/json"),
        unversioned.to_string(),
    )
    .await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert_eq!(refused.body["reason"], "Invalid");
    let mut stale = put.body.clone();
    stale["metadata"]["resourceVersion"] = json!("1");
    let put = send(
        &h,
        "PUT",
        &path,
        Some("application/json"),
        stale.to_string(),
    )
    .await;
    assert_eq!(put.status, 409, "{}", put.body);
    assert_eq!(put.body["reason"], "Conflict");
    // Server-side apply creates a missing object, labelled.
    let created = send(
        &h,
        "PATCH",
        &format!("{WIDGETS}/fresh?fieldManager=tenant"),
        Some("application/apply-patch+yaml"),
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: fresh\n  namespace: demo\nspec:\n  replicas: 1\n",
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert!(is_owned(&created.body));
    let deleted = send(&h, "DELETE", &path, None, Bytes::new()).await;
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    assert!(on_target(&h, "w").await.is_none());
    h.proxy.shutdown().await;
}

/// A deletecollection reads its body's options once and sends them, pinned,
/// with every listed object's delete: a dry run in the body deletes none of
/// them, and the caller's other options and preconditions travel along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletecollection_sends_its_body_options_with_every_object() {
    let h = harness(AccessMode::Owned).await;
    let names = ["opt-1", "opt-2", "opt-3"];
    for name in names {
        owned_widget(&h, name).await;
    }
    let dry_run = json!({"kind": "DeleteOptions", "apiVersion": "v1",
        "preconditions": {}, "dryRun": ["All"], "propagationPolicy": "Background"});
    let swept = send(
        &h,
        "DELETE",
        WIDGETS,
        Some("application/json"),
        dry_run.to_string(),
    )
    .await;
    assert_eq!(swept.status, 200, "{}", swept.body);
    let items = swept.body["items"].as_array().expect("items");
    assert_eq!(items.len(), names.len(), "{}", swept.body);
    for name in names {
        assert!(
            on_target(&h, name).await.is_some(),
            "{name} was deleted by a dry run in the body"
        );
    }
    // A caller's resourceVersion precondition holds for one object at most: kube
    // deletes in name order until an object's conflict fails the collection.
    let first = on_target(&h, "opt-1").await.expect("opt-1");
    let pinned_to_one = json!({"preconditions":
        {"resourceVersion": first["metadata"]["resourceVersion"]}});
    let swept = send(
        &h,
        "DELETE",
        WIDGETS,
        Some("application/json"),
        pinned_to_one.to_string(),
    )
    .await;
    assert_eq!(swept.status, 409, "{}", swept.body);
    assert_eq!(swept.body["reason"], "Conflict", "{}", swept.body);
    assert!(on_target(&h, "opt-1").await.is_none());
    for name in ["opt-2", "opt-3"] {
        assert!(on_target(&h, name).await.is_some(), "{name}");
    }
    h.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_options_sent_in_the_query_survive_the_pinned_body() {
    // kube reads a delete's options from the query only when the body is empty,
    // and the proxy always sends a body (the pin): a `?dryRun=All` left in the
    // query alone would delete for real.
    let h = harness(AccessMode::Owned).await;
    for name in ["kept-1", "kept-2"] {
        owned_widget(&h, name).await;
    }
    let one = send(
        &h,
        "DELETE",
        &format!("{WIDGETS}/kept-1?dryRun=All"),
        None,
        Bytes::new(),
    )
    .await;
    assert_eq!(one.status, 200, "{}", one.body);
    let all = send(
        &h,
        "DELETE",
        &format!("{WIDGETS}?dryRun=All"),
        None,
        Bytes::new(),
    )
    .await;
    assert_eq!(all.status, 200, "{}", all.body);
    for name in ["kept-1", "kept-2"] {
        assert!(
            on_target(&h, name).await.is_some(),
            "{name} was deleted by a dry run"
        );
    }
    let invalid = send(
        &h,
        "DELETE",
        &format!("{WIDGETS}/kept-1?gracePeriodSeconds=soon"),
        None,
        Bytes::new(),
    )
    .await;
    assert_eq!(invalid.status, 400, "{}", invalid.body);
    assert_eq!(invalid.body["reason"], "BadRequest");
    assert!(on_target(&h, "kept-1").await.is_some());
    let real = send(
        &h,
        "DELETE",
        &format!("{WIDGETS}/kept-1"),
        None,
        Bytes::new(),
    )
    .await;
    assert_eq!(real.status, 200, "{}", real.body);
    assert!(on_target(&h, "kept-1").await.is_none());
    // A deletecollection reads its options before it lists, as kube does: refused
    // even when nothing owned is left to delete.
    let real = send(
        &h,
        "DELETE",
        &format!("{WIDGETS}/kept-2"),
        None,
        Bytes::new(),
    )
    .await;
    assert_eq!(real.status, 200, "{}", real.body);
    let invalid = send(
        &h,
        "DELETE",
        &format!("{WIDGETS}?gracePeriodSeconds=soon"),
        None,
        Bytes::new(),
    )
    .await;
    assert_eq!(invalid.status, 400, "{}", invalid.body);
    h.proxy.shutdown().await;
}

/// kube reads a query's uid and resourceVersion as delete preconditions when the
/// body is empty; the pinned body the proxy sends replaces the query's options,
/// so the proxy holds them to the checked state itself, as it does a body's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_preconditions_sent_in_the_query_hold() {
    let h = harness(AccessMode::Owned).await;
    let created = owned_widget(&h, "held").await;
    let uid = created["metadata"]["uid"].as_str().expect("uid");
    let version = created["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion");
    for stale in [
        "resourceVersion=1".to_string(),
        "uid=00000000-0000-0000-0000-000000000000".to_string(),
        format!("uid={uid}&resourceVersion=1"),
    ] {
        let refused = send(
            &h,
            "DELETE",
            &format!("{WIDGETS}/held?{stale}"),
            None,
            Bytes::new(),
        )
        .await;
        assert_eq!(refused.status, 409, "{stale}: {}", refused.body);
        assert_eq!(refused.body["reason"], "Conflict", "{}", refused.body);
        assert!(on_target(&h, "held").await.is_some(), "{stale} deleted it");
    }
    let met = send(
        &h,
        "DELETE",
        &format!("{WIDGETS}/held?uid={uid}&resourceVersion={version}"),
        None,
        Bytes::new(),
    )
    .await;
    assert_eq!(met.status, 200, "{}", met.body);
    assert!(on_target(&h, "held").await.is_none());
    h.proxy.shutdown().await;
}
