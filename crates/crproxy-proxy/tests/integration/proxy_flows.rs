//! The proxy's request flows over real TLS, with devclusters as the client and
//! target clusters and the test acting as the client's aggregation layer
//! (front-proxy client certificate + `X-Remote-*` headers).
//!
//! What reached the target is judged the way an operator would: by the target's
//! objects (a write that got through changes them), the proxy's metrics, and the
//! answers themselves. Unavailable targets are real ones: a stopped listener, or an
//! APIService whose backend is missing.

use crate::log_support;
use crate::target_support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::{json, Value};

use crproxy_core::config::AccessMode;
use crproxy_proxy::metrics::Metrics;
use crproxy_proxy::sources::PeerSourceConfig;
use log_support::LogBuffer;
use target_support::{
    aggregator_get, as_alice, caller_h2, caller_h2_with_window, example_crd, exchange, harness,
    harness_behind, harness_with, harness_with_peers, json_of, metric_value, on_target, send_as,
    wait_until_served, widget, widget_object, widget_resource, Harness, Options, Reply,
    OWNER_LABELS, WIDGETS,
};
use test_support::relay::Relay;

/// The Accept header of an aggregator's discovery fetch (v2, then v2beta1).
const AGGREGATED_DISCOVERY: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

async fn call(client: &kube::Client, method: &str, path: &str, body: Option<Value>) -> Reply {
    call_as(client, method, path, body, "application/json").await
}

async fn call_as(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: Option<Value>,
    content_type: &str,
) -> Reply {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    send_as(client, method, path, Some(content_type), body).await
}

fn owned_labels() -> Value {
    serde_json::from_str(OWNER_LABELS).expect("labels")
}

fn series(metrics: &Metrics, name: &str, needle: &str) -> bool {
    metrics
        .encode()
        .lines()
        .any(|l| l.starts_with(name) && l.contains(needle))
}

/// Connections the proxy opened to the target so far
/// (`vcluster_proxy_peer_dial_duration_seconds_count`).
fn dials(metrics: &Metrics) -> u64 {
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with("vcluster_proxy_peer_dial_duration_seconds_count{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Creates `name` in `demo` on the target, straight through its admin.
/// Creates `name` in `demo` through the proxy, as the client's aggregator would.
async fn created_through_proxy(h: &Harness, name: &str) {
    let created = call(
        &h.aggregator,
        "POST",
        WIDGETS,
        Some(widget(name, json!({}))),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
}

async fn create_on_target(h: &Harness, name: &str, labels: Value) -> Value {
    let created = h
        .widgets
        .create(&PostParams::default(), &widget_object(name, labels))
        .await
        .expect("created on the target");
    json_of(&created)
}

fn rv(object: &Value) -> &str {
    object["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test]
async fn callers_without_the_front_proxy_certificate_get_401_and_reach_nothing() {
    let h = harness(AccessMode::Owned).await;
    let mine = create_on_target(&h, "mine", owned_labels()).await;
    let path = format!("{WIDGETS}/mine");
    let list = call(&h.stranger, "GET", WIDGETS, None).await;
    assert_eq!(list.status, 401, "{}", list.body);
    assert_eq!(list.body["reason"], "Unauthorized");
    // Writes show whether a request reached the target: none of these may land.
    let writes = [
        call(&h.stranger, "DELETE", &path, None).await,
        call_as(
            &h.stranger,
            "PATCH",
            &path,
            Some(json!({"spec": {"replicas": 9}})),
            "application/merge-patch+json",
        )
        .await,
        call(
            &h.stranger,
            "POST",
            WIDGETS,
            Some(widget("intruder", json!({}))),
        )
        .await,
    ];
    for reply in &writes {
        assert_eq!(reply.status, 401, "{}", reply.body);
    }
    let stored = on_target(&h, "mine").await.expect("still on the target");
    assert_eq!(rv(&stored), rv(&mine), "untouched: {stored}");
    assert!(on_target(&h, "intruder").await.is_none());
    h.proxy.shutdown().await;
}

/// Creates the namespace `name` on the client cluster.
async fn create_client_namespace(h: &Harness, name: &str) {
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
    Api::all(h.client_admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace created on the client");
}

/// A target identity that may create namespaces but not read them (its GET of a
/// namespace answers 403) still gets the client's namespace mirrored: only a
/// namespace the target shows counts as there, and the create's 409 says one
/// exists. Before, the 403 counted as "exists", the namespace was never created,
/// and every write in it failed with the target's own 404. Only the namespace
/// actually made is logged as mirrored.
#[tokio::test]
async fn a_target_identity_that_cannot_read_namespaces_still_mirrors_them() {
    // A current-thread test: the proxy's events are this thread's.
    let (logs, _guard) = LogBuffer::capture();
    let h = harness_with(Options {
        target_rules: Some(json!([
            {"apiGroups": ["example.com"], "resources": ["*"], "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["create"]},
            {"nonResourceURLs": ["*"], "verbs": ["get"]},
        ])),
        ..Options::default()
    })
    .await;
    create_client_namespace(&h, "fresh").await;
    // `fresh` is new to the target; `demo` it has already.
    for namespace in ["fresh", "demo"] {
        let mut sent = widget("w1", json!({}));
        sent["metadata"]["namespace"] = json!(namespace);
        let reply = call(
            &h.aggregator,
            "POST",
            &format!("/apis/example.com/v1/namespaces/{namespace}/widgets"),
            Some(sent),
        )
        .await;
        assert_eq!(reply.status, 201, "{namespace}: {}", reply.body);
        let stored: Api<DynamicObject> =
            Api::namespaced_with(h.admin.clone(), namespace, &widget_resource());
        assert!(
            stored.get_opt("w1").await.expect("get").is_some(),
            "{namespace}: not stored on the target"
        );
    }
    let logged = logs.text();
    let mirrored = |namespace: &str| {
        logged.lines().any(|l| {
            l.contains("creating namespace on target cluster")
                && l.contains(&format!("namespace={namespace}"))
        })
    };
    assert!(mirrored("fresh"), "{logged}");
    assert!(!mirrored("demo"), "demo was there already: {logged}");
    h.proxy.shutdown().await;
}

/// A target identity that may neither read nor create namespaces writes into
/// the namespaces made for it: its writes there go through, as they did before
/// namespaces were mirrored only when the target shows them.
#[tokio::test]
async fn a_target_identity_without_namespace_rights_writes_into_existing_ones() {
    let h = harness_with(Options {
        target_rules: Some(json!([
            {"apiGroups": ["example.com"], "resources": ["*"], "verbs": ["*"]},
            {"nonResourceURLs": ["*"], "verbs": ["get"]},
        ])),
        ..Options::default()
    })
    .await;
    let reply = call(
        &h.aggregator,
        "POST",
        "/apis/example.com/v1/namespaces/demo/widgets",
        Some(widget("w1", json!({}))),
    )
    .await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    assert!(
        on_target(&h, "w1").await.is_some(),
        "not stored on the target"
    );
    h.proxy.shutdown().await;
}

/// The target's RBAC governs what the proxy's identity may read there, and its
/// refusal reaches the caller as the target wrote it: a named GET, a list and a
/// watch refused with 403 keep the code, the reason and the message that names
/// the identity and the verb (a named GET's 403 is decided before any object is
/// read, so it is neither masked nor checked).
#[tokio::test]
async fn the_targets_rbac_refusal_of_a_read_reaches_the_caller_as_it_was_written() {
    let h = harness_with(Options {
        target_rules: Some(json!([
            {"apiGroups": ["example.com"], "resources": ["*"],
             "verbs": ["create", "update", "patch", "delete"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "create"]},
            {"nonResourceURLs": ["*"], "verbs": ["get"]},
        ])),
        ..Options::default()
    })
    .await;
    let refusal = |name: &str, verb: &str| {
        format!(
            "widgets.example.com {name}is forbidden: User \"crproxy-under-test\" cannot \
             {verb} resource \"widgets\" in API group \"example.com\" in the namespace \"demo\""
        )
    };
    for (path, verb, name) in [
        (format!("{WIDGETS}/w1"), "get", "\"w1\" "),
        (WIDGETS.to_string(), "list", ""),
        (format!("{WIDGETS}?watch=true"), "watch", ""),
    ] {
        let reply = call(&h.aggregator, "GET", &path, None).await;
        assert_eq!(reply.status, 403, "{path}: {}", reply.body);
        assert_eq!(reply.body["reason"], "Forbidden", "{path}: {}", reply.body);
        assert_eq!(reply.body["code"], 403, "{path}: {}", reply.body);
        assert_eq!(reply.body["message"], refusal(name, verb), "{path}");
    }
    // Counted as the target's answer.
    let counted = h.metrics.encode();
    assert_eq!(
        metric_value(
            &h.metrics,
            "vcluster_proxy_request_total",
            "code=\"403\",reason=\"upstream\""
        ),
        3.0,
        "{counted}"
    );
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn creates_are_stamped_and_the_namespace_is_mirrored() {
    // A current-thread test: the proxy's events are this thread's.
    let (logs, _guard) = LogBuffer::capture();
    let h = harness(AccessMode::Owned).await;
    // A namespace of the client's that the target does not have yet.
    create_client_namespace(&h, "fresh").await;
    let target_namespaces: Api<Namespace> = Api::all(h.admin.clone());
    assert!(target_namespaces
        .get_opt("fresh")
        .await
        .expect("get")
        .is_none());
    let mut sent = widget(
        "w1",
        json!({"vcluster.com/owner-vcluster": "someone-else", "app": "x"}),
    );
    sent["metadata"]["namespace"] = json!("fresh");
    let reply = call(
        &h.aggregator,
        "POST",
        "/apis/example.com/v1/namespaces/fresh/widgets",
        Some(sent),
    )
    .await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    let fresh_widgets: Api<DynamicObject> =
        Api::namespaced_with(h.admin.clone(), "fresh", &widget_resource());
    let stored = fresh_widgets.get("w1").await.expect("stored on the target");
    let labels = &stored.metadata.labels.expect("labels");
    assert_eq!(labels["vcluster.com/owner-vcluster"], "client");
    assert_eq!(labels["vcluster.com/owner-project"], "default");
    assert_eq!(labels["app"], "x");
    assert!(
        target_namespaces
            .get_opt("fresh")
            .await
            .expect("get")
            .is_some(),
        "namespace mirrored"
    );
    let logged = logs.text();
    assert!(
        logged
            .lines()
            .any(|l| l.contains("creating namespace on target cluster")
                && l.contains("namespace=fresh")
                && l.contains("target=default/target")),
        "{logged}"
    );
    assert!(series(
        &h.metrics,
        "vcluster_proxy_request_total",
        "verb=\"POST\""
    ));
    h.proxy.shutdown().await;
}

/// A namespace deleted on the target after the proxy mirrored it is mirrored
/// again by the next create into it, which then succeeds: the target's 404
/// `namespaces "<ns>" not found` would tell the caller its own namespace is
/// missing. A server-side apply that creates is mirrored again the same way.
#[tokio::test]
async fn a_namespace_deleted_on_the_target_is_mirrored_again_by_the_next_create() {
    let (logs, _guard) = LogBuffer::capture();
    let h = harness(AccessMode::Owned).await;
    create_client_namespace(&h, "fresh").await;
    let fresh = "/apis/example.com/v1/namespaces/fresh/widgets";
    let in_fresh = |name: &str| {
        let mut sent = widget(name, json!({}));
        sent["metadata"]["namespace"] = json!("fresh");
        sent
    };
    let reply = call(&h.aggregator, "POST", fresh, Some(in_fresh("w1"))).await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    let target_namespaces: Api<Namespace> = Api::all(h.admin.clone());
    for (round, create) in ["POST", "PATCH"].into_iter().enumerate() {
        target_namespaces
            .delete("fresh", &Default::default())
            .await
            .expect("the target's admin deletes the namespace");
        let mut gone = false;
        for _ in 0..100 {
            if target_namespaces
                .get_opt("fresh")
                .await
                .expect("get")
                .is_none()
            {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(gone, "the target never finished deleting the namespace");
        let name = format!("again-{round}");
        let reply = if create == "POST" {
            call(&h.aggregator, "POST", fresh, Some(in_fresh(&name))).await
        } else {
            let body = format!(
                "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: {name}\n  namespace: fresh\nspec:\n  size: 1\n"
            );
            send_as(
                &h.aggregator,
                "PATCH",
                &format!("{fresh}/{name}?fieldManager=test"),
                Some("application/apply-patch+yaml"),
                body,
            )
            .await
        };
        assert_eq!(reply.status, 201, "{create}: {}", reply.body);
        assert!(
            target_namespaces
                .get_opt("fresh")
                .await
                .expect("get")
                .is_some(),
            "{create}: the namespace mirrored again"
        );
    }
    let mirrored = logs
        .text()
        .lines()
        .filter(|l| {
            l.contains("creating namespace on target cluster") && l.contains("namespace=fresh")
        })
        .count();
    assert_eq!(mirrored, 3, "{}", logs.text());
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn objects_without_both_labels_are_masked_for_every_named_verb() {
    let h = harness(AccessMode::Owned).await;
    let foreign = create_on_target(
        &h,
        "foreign",
        json!({"vcluster.com/owner-vcluster": "client"}),
    )
    .await;
    let path = format!("{WIDGETS}/foreign");
    let get = call(&h.aggregator, "GET", &path, None).await;
    assert_eq!(get.status, 404);
    assert_eq!(get.body["reason"], "NotFound");
    assert_eq!(
        get.body["message"],
        "widgets.example.com \"foreign\" not found"
    );
    let put = call(
        &h.aggregator,
        "PUT",
        &path,
        Some(widget("foreign", json!({}))),
    )
    .await;
    assert_eq!(put.status, 404);
    let patch = call_as(
        &h.aggregator,
        "PATCH",
        &path,
        Some(json!({"spec": {"replicas": 9}})),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(patch.status, 404);
    let delete = call(&h.aggregator, "DELETE", &path, None).await;
    assert_eq!(delete.status, 404);
    assert!(series(
        &h.metrics,
        "vcluster_proxy_request_total",
        "reason=\"ownership_masked\""
    ));
    // Only the ownership checks (reads) may have reached the target: the object is
    // exactly as the admin left it.
    let stored = on_target(&h, "foreign").await.expect("still there");
    assert_eq!(rv(&stored), rv(&foreign), "untouched: {stored}");
    assert_eq!(stored["spec"]["replicas"], 1);
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn a_caller_with_many_groups_is_served() {
    // kube-apiserver's aggregator sends one X-Remote-Group per group, and its own
    // backends accept a header list of up to 1 MiB; a user in 2 000 groups (about
    // 90 KiB of headers) must not be refused by the proxy.
    let h = harness(AccessMode::Owned).await;
    let mut request = http::Request::builder()
        .method("GET")
        .uri(WIDGETS)
        .header("x-remote-user", "alice")
        .header("accept", "application/json");
    for i in 0..2000 {
        request = request.header(
            "x-remote-group",
            format!("oidc:team-{i:05}-platform-engineering"),
        );
    }
    let reply = exchange(&h.aggregator, request.body(Bytes::new()).expect("request")).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.body["kind"], "WidgetList", "{}", reply.body);
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn owned_objects_can_be_read_and_deleted() {
    let h = harness(AccessMode::Owned).await;
    let created = call(
        &h.aggregator,
        "POST",
        WIDGETS,
        Some(widget("mine", json!({}))),
    )
    .await;
    assert_eq!(created.status, 201);
    let path = format!("{WIDGETS}/mine");
    let got = call(&h.aggregator, "GET", &path, None).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body["metadata"]["name"], "mine");
    let deleted = call(&h.aggregator, "DELETE", &path, None).await;
    assert!(
        deleted.status == 200 || deleted.status == 202,
        "{}",
        deleted.status
    );
    assert!(on_target(&h, "mine").await.is_none());
    h.proxy.shutdown().await;
}

/// A HEAD is answered as kube answers it: as the GET it stands for (an owned
/// object, a list, a masked object's 404, an unserved resource's 404), with no
/// body, over HTTP/1.1 (as kube-rs speaks) and HTTP/2 (as the aggregator does).
/// It was a 405 once.
#[tokio::test]
async fn a_head_is_answered_as_its_get_without_a_body() {
    use http_body_util::BodyExt;
    let h = harness(AccessMode::Owned).await;
    created_through_proxy(&h, "mine").await;
    create_on_target(
        &h,
        "foreign",
        json!({"vcluster.com/owner-vcluster": "client"}),
    )
    .await;
    let mine = format!("{WIDGETS}/mine");
    let mut h2 =
        caller_h2::<http_body_util::Empty<Bytes>>(h.addr, &h.serving_ca_pem, &h.front_proxy_client)
            .await;
    for (path, status) in [
        (mine.clone(), 200),
        (WIDGETS.to_owned(), 200),
        (format!("{WIDGETS}/foreign"), 404),
        (
            "/apis/example.com/v1/namespaces/demo/gadgets".to_owned(),
            404,
        ),
        ("/apis/example.com/v1".to_owned(), 200),
    ] {
        let get = call(&h.aggregator, "GET", &path, None).await;
        assert_eq!(get.status, status, "GET {path}: {}", get.body);
        let request = as_alice("HEAD", &path)
            .header("accept", "application/json")
            .body(Bytes::new())
            .expect("request");
        let response = tokio::time::timeout(
            Duration::from_secs(20),
            h.aggregator.send(request.map(kube::client::Body::from)),
        )
        .await
        .expect("HEAD over HTTP/1.1 answered within 20 s")
        .expect("HEAD over HTTP/1.1");
        assert_eq!(
            response.status().as_u16(),
            status,
            "HEAD {path} over HTTP/1.1"
        );
        for header in ["content-type", "content-length"] {
            assert_eq!(
                response.headers().get(header),
                get.headers.get(header),
                "HEAD {path} over HTTP/1.1: {header}"
            );
        }
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        assert!(
            body.is_empty(),
            "HEAD {path} over HTTP/1.1 had a body: {body:?}"
        );

        let request = as_alice("HEAD", &format!("https://localhost{path}"))
            .header("accept", "application/json")
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("request");
        let response = tokio::time::timeout(Duration::from_secs(20), h2.send_request(request))
            .await
            .expect("HEAD over HTTP/2 answered within 20 s")
            .expect("HEAD over HTTP/2");
        assert_eq!(
            response.status().as_u16(),
            status,
            "HEAD {path} over HTTP/2"
        );
        let body = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect())
            .await
            .expect("HEAD over HTTP/2 ended within 20 s")
            .expect("HEAD over HTTP/2 body")
            .to_bytes();
        assert!(
            body.is_empty(),
            "HEAD {path} over HTTP/2 had a body: {body:?}"
        );
    }
    // An owned object's HEAD is read and checked as its GET is: the masked
    // object's 404 is the proxy's, counted as such.
    assert!(series(
        &h.metrics,
        "vcluster_proxy_request_total",
        "reason=\"ownership_masked\""
    ));
    // kube counts a HEAD as the GET, LIST or WATCH it stands for.
    assert!(!series(
        &h.metrics,
        "vcluster_proxy_request_total",
        "verb=\"HEAD\""
    ));
    h.proxy.shutdown().await;
}

/// A body-less delete whose query is too long to carry the pin gets the pin in a
/// body, as JSON: the caller's Content-Type (here protobuf) described a body it
/// never sent and does not go with the proxy's.
#[tokio::test]
async fn a_delete_pinned_in_a_body_is_sent_as_json_whatever_the_callers_content_type() {
    let h = harness(AccessMode::Owned).await;
    created_through_proxy(&h, "long-query").await;
    let path = format!("{WIDGETS}/long-query?pretty=true&a=1&b=2&c=3&d=4&e=5");
    let deleted = send_as(
        &h.aggregator,
        "DELETE",
        &path,
        Some("application/vnd.kubernetes.protobuf"),
        Bytes::new(),
    )
    .await;
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    assert!(on_target(&h, "long-query").await.is_none());
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn lists_carry_the_owner_selector_merged_with_the_callers() {
    let h = harness(AccessMode::Owned).await;
    // In name order, each object but the last fails one part of the merged
    // selector (`app=x` and both owner labels).
    let half_owned = json!({"vcluster.com/owner-vcluster": "client", "app": "x"});
    let mut owned_y = owned_labels();
    owned_y["app"] = json!("y");
    let mut owned_x = owned_labels();
    owned_x["app"] = json!("x");
    for (name, labels) in [
        ("a-unowned", json!({"app": "x"})),
        ("b-half-owned", half_owned),
        ("c-owned-other-app", owned_y),
        ("d-owned", owned_x),
    ] {
        create_on_target(&h, name, labels).await;
    }
    let names = |reply: &Reply| -> Vec<String> {
        reply.body["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| {
                i["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    };
    // The whole list, then a page of one: that the page holds the match shows the
    // target applied the whole selector (narrowing the target's first page
    // afterwards would leave it empty).
    for query in ["labelSelector=app%3Dx", "labelSelector=app%3Dx&limit=1"] {
        let list = call(&h.aggregator, "GET", &format!("{WIDGETS}?{query}"), None).await;
        assert_eq!(list.status, 200, "{query}: {}", list.body);
        assert_eq!(names(&list), ["d-owned"], "{query}");
    }
    // Padded so that a target on current Go would drop the query whole, owner
    // selector included, and list every tenant's objects: refused here.
    let padded = vec!["x=1"; 10_000].join("&");
    for (query, count) in [
        (padded.clone(), 10_001),
        (format!("watch=1&{padded}"), 10_002),
    ] {
        let refused = call(&h.aggregator, "GET", &format!("{WIDGETS}?{query}"), None).await;
        assert_eq!(refused.status, 400, "{}", refused.body);
        assert_eq!(
            refused.body["message"],
            format!("the query has {count} parameters; a list or watch may have at most 100")
        );
    }
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn all_mode_forwards_without_masking() {
    let h = harness(AccessMode::All).await;
    create_on_target(&h, "foreign", json!({})).await;
    let got = call(&h.aggregator, "GET", &format!("{WIDGETS}/foreign"), None).await;
    assert_eq!(got.status, 200);
    let list = call(&h.aggregator, "GET", WIDGETS, None).await;
    assert_eq!(list.status, 200);
    // An owner selector would have left the unlabelled object out.
    assert_eq!(
        list.body["items"][0]["metadata"]["name"], "foreign",
        "{}",
        list.body
    );
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn writes_into_a_namespace_missing_on_the_client_are_404() {
    let h = harness(AccessMode::Owned).await;
    let path = "/apis/example.com/v1/namespaces/nowhere/widgets";
    let mut sent = widget("w", json!({}));
    sent["metadata"]["namespace"] = json!("nowhere");
    let reply = call(&h.aggregator, "POST", path, Some(sent.clone())).await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.body["message"], "namespaces \"nowhere\" not found");
    // The write stopped before the target: the namespace was not mirrored there.
    let target_namespaces: Api<Namespace> = Api::all(h.admin.clone());
    assert!(target_namespaces
        .get_opt("nowhere")
        .await
        .expect("get")
        .is_none());
    assert!(series(
        &h.metrics,
        "vcluster_proxy_request_total",
        "verb=\"POST\",code=\"404\",reason=\"namespace_missing\""
    ));
    // A replace or a patch may create its object's namespace on the target just
    // as a create does, so both are refused the same way.
    let object = format!("{path}/w");
    let replace = call(&h.aggregator, "PUT", &object, Some(sent)).await;
    let patch = call_as(
        &h.aggregator,
        "PATCH",
        &object,
        Some(json!({"spec": {"replicas": 2}})),
        "application/merge-patch+json",
    )
    .await;
    for (verb, reply) in [("PUT", replace), ("PATCH", patch)] {
        assert_eq!(reply.status, 404, "{verb}: {}", reply.body);
        assert_eq!(reply.body["reason"], "NotFound", "{verb}");
        assert_eq!(
            reply.body["message"], "namespaces \"nowhere\" not found",
            "{verb}"
        );
        let needle = format!("verb=\"{verb}\",code=\"404\",reason=\"namespace_missing\"");
        assert!(
            series(&h.metrics, "vcluster_proxy_request_total", &needle),
            "{needle}"
        );
    }
    assert!(target_namespaces
        .get_opt("nowhere")
        .await
        .expect("get")
        .is_none());
    h.proxy.shutdown().await;
}

/// A decoded path segment is one segment again wherever the proxy puts it back into
/// a URL. `default%3Fx` is the namespace `default?x`, which kube never stores (a
/// namespace name is a DNS-1123 label), not the namespace `default` followed by a
/// query: a write into it is refused as one into a missing namespace, before either
/// cluster is asked, and the proxy's set of namespaces known on the target does not
/// grow by one entry per such suffix. A name is the same: the ownership check of
/// `foreign%3Fx` asks about `foreign?x`, never about `foreign`; and a name kube
/// refuses (one with `/` or `%`) is refused with 400.
#[tokio::test]
async fn escaped_path_segments_are_never_read_as_other_namespaces_or_objects() {
    let h = harness(AccessMode::Owned).await;
    created_through_proxy(&h, "w1").await;
    // `demo`, mirrored by the create above.
    assert_eq!(h.proxy.known_target_namespaces(), 1);

    for (raw, decoded) in [
        ("default%3Fx", "default?x"),
        ("default%3Fy", "default?y"),
        ("default%3F", "default?"),
        ("demo%3Flimit=1", "demo?limit=1"),
        ("demo%23frag", "demo#frag"),
        ("Demo", "Demo"),
    ] {
        let path = format!("/apis/example.com/v1/namespaces/{raw}/widgets");
        let mut sent = widget("w2", json!({}));
        sent["metadata"]["namespace"] = json!(decoded);
        let reply = call(&h.aggregator, "POST", &path, Some(sent)).await;
        assert_eq!(reply.status, 404, "{path}: {}", reply.body);
        assert_eq!(
            reply.body["message"],
            format!("namespaces {decoded:?} not found"),
            "{path}"
        );
    }
    assert_eq!(
        h.proxy.known_target_namespaces(),
        1,
        "the known-namespace set grew"
    );
    // Refused by the proxy, not answered by the target after the namespace checks.
    assert!(!series(
        &h.metrics,
        "vcluster_proxy_request_total",
        "verb=\"POST\",code=\"404\",reason=\"upstream\""
    ));

    // A widget the client does not own: a delete of `foreign?x` must not be judged
    // by `foreign` (which would be masked as not owned); the target has no
    // `foreign?x` and says so.
    let foreign = create_on_target(&h, "foreign", json!({"app": "x"})).await;
    let held = create_on_target(&h, "held", owned_labels()).await;
    for name in ["foreign%3Fx", "foreign%23x", "held%3FdryRun=All"] {
        let path = format!("{WIDGETS}/{name}");
        let delete = call(&h.aggregator, "DELETE", &path, None).await;
        assert_eq!(delete.status, 404, "{path}: {}", delete.body);
        let patch = call_as(
            &h.aggregator,
            "PATCH",
            &path,
            Some(json!({"spec": {"replicas": 9}})),
            "application/merge-patch+json",
        )
        .await;
        assert_eq!(patch.status, 404, "{path}: {}", patch.body);
    }
    assert!(!series(
        &h.metrics,
        "vcluster_proxy_request_total",
        "reason=\"ownership_masked\""
    ));
    // Names kube refuses in a path: 400, nothing sent.
    for name in ["foreign%2Fx", "held%2F", "held%25", "%2E%2E"] {
        let path = format!("{WIDGETS}/{name}");
        let delete = call(&h.aggregator, "DELETE", &path, None).await;
        assert_eq!(delete.status, 400, "{path}: {}", delete.body);
        assert_eq!(delete.body["reason"], "BadRequest", "{path}");
    }
    for (name, before) in [("foreign", &foreign), ("held", &held)] {
        let after = on_target(&h, name).await.expect("still there");
        assert_eq!(rv(&after), rv(before), "{name} was written");
    }
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn connection_upgrades_are_refused_with_501() {
    let h = harness(AccessMode::Owned).await;
    let reply = call(&h.aggregator, "POST", &format!("{WIDGETS}/w/exec"), None).await;
    assert_eq!(reply.status, 501);
    assert_eq!(
        reply.body["message"],
        "resource proxy does not support connection upgrades"
    );
    assert!(series(
        &h.metrics,
        "vcluster_proxy_request_terminations_total",
        "reason=\"upgrade_rejected\""
    ));
    // The request itself is counted with the proxy's own code and the same
    // reason, not as the target's answer.
    let counted = h.metrics.encode();
    assert_eq!(
        metric_value(
            &h.metrics,
            "vcluster_proxy_request_total",
            "code=\"501\",reason=\"upgrade_rejected\""
        ),
        1.0,
        "{counted}"
    );
    h.proxy.shutdown().await;
}

/// A create or a delete of an owned widget's subresource is answered by the
/// proxy as kube answers it for a custom resource (405 naming the verb), and
/// nothing reaches the target: the widget keeps its resourceVersion.
#[tokio::test]
async fn a_create_or_delete_of_a_subresource_is_kubes_405_and_changes_nothing() {
    let h = harness(AccessMode::Owned).await;
    created_through_proxy(&h, "w1").await;
    let before = on_target(&h, "w1").await.expect("w1 on the target");
    for (method, subresource, verb) in [("POST", "status", "create"), ("DELETE", "scale", "delete")]
    {
        let path = format!("{WIDGETS}/w1/{subresource}");
        let reply = call(&h.aggregator, method, &path, Some(json!({}))).await;
        assert_eq!(reply.status, 405, "{method} {path}: {}", reply.body);
        assert_eq!(
            reply.body,
            json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": format!("{verb} is not supported on resources of kind \"widgets.example.com\""),
                "reason": "MethodNotAllowed",
                "details": {"group": "example.com", "kind": "widgets"},
                "code": 405,
            }),
            "{method} {path}"
        );
    }
    let after = on_target(&h, "w1")
        .await
        .expect("w1 is still on the target");
    assert_eq!(rv(&after), rv(&before));
    // The target answers these with the same 405; it never counted one.
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let target_metrics = h.admin.request_text(request).await.expect("target metrics");
    assert!(
        !target_metrics
            .lines()
            .any(|line| line.starts_with("apiserver_request_total{")
                && line.contains("resource=\"widgets\"")
                && line.contains("code=\"405\"")),
        "{target_metrics}"
    );
    h.proxy.shutdown().await;
}

/// The configuration enables `widgets` of example.com/v1 only. `gadgets`, which
/// the target also serves in that group/version, is not there for the client:
/// reads and writes get kube's 404 for a resource it does not have, nothing
/// reaches the target's gadgets, and discovery (legacy and aggregated) lists
/// widgets and their subresources alone.
#[tokio::test]
async fn a_resource_the_configuration_does_not_enable_is_not_served() {
    let h = harness(AccessMode::Owned).await;
    let gadget_crd = example_crd("gadgets", "Gadget", json!({"status": {}}));
    Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(h.admin.clone())
        .create(&PostParams::default(), &gadget_crd)
        .await
        .expect("gadgets crd created");
    let gadget_resource = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("example.com", "v1", "Gadget"),
        "gadgets",
    );
    let gadgets: Api<DynamicObject> =
        Api::namespaced_with(h.admin.clone(), "demo", &gadget_resource);
    wait_until_served(&gadgets).await;
    // Owned by this client, so only the configuration can hide it.
    let labels: Value = serde_json::from_str(OWNER_LABELS).expect("labels");
    let stored: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Gadget",
        "metadata": {"name": "g1", "namespace": "demo", "labels": labels},
    }))
    .expect("gadget");
    let stored = gadgets
        .create(&PostParams::default(), &stored)
        .await
        .expect("gadget created on the target");

    let collection = "/apis/example.com/v1/namespaces/demo/gadgets";
    for (method, path, body) in [
        ("GET", format!("{collection}/g1"), None),
        ("GET", "/apis/example.com/v1/gadgets".to_owned(), None),
        ("DELETE", format!("{collection}/g1"), None),
        (
            "PATCH",
            format!("{collection}/g1"),
            Some(json!({"metadata": {"labels": {"x": "y"}}})),
        ),
        (
            "POST",
            collection.to_owned(),
            Some(json!({
                "apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g2"}
            })),
        ),
        // Refused by their shape or method too, but first as a resource that is
        // not there, as kube's custom-resource handler looks the resource up first.
        ("POST", format!("{collection}/g1/status"), Some(json!({}))),
        ("DELETE", format!("{collection}/g1/logs"), None),
        ("PUT", collection.to_owned(), Some(json!({}))),
        ("GET", format!("{collection}?watch=1&watch=0"), None),
        (
            "GET",
            "/apis/example.com/v1/watch/namespaces/demo/gadgets/g1/status".to_owned(),
            None,
        ),
        (
            "POST",
            "/apis/example.com/v1/watch/namespaces/demo/gadgets".to_owned(),
            Some(json!({})),
        ),
        ("OPTIONS", collection.to_owned(), None),
        ("GET", format!("{collection}/g1/exec"), None),
    ] {
        let content_type = if method == "PATCH" {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        let reply = call_as(&h.aggregator, method, &path, body, content_type).await;
        assert_eq!(reply.status, 404, "{method} {path}: {}", reply.body);
        assert_eq!(
            reply.headers["content-type"], "text/plain; charset=utf-8",
            "{method} {path}"
        );
    }
    let after = gadgets.get("g1").await.expect("g1 is still on the target");
    assert_eq!(
        after.metadata.resource_version,
        stored.metadata.resource_version
    );
    assert!(gadgets.get_opt("g2").await.expect("read").is_none());

    let legacy = call(&h.aggregator, "GET", "/apis/example.com/v1", None).await;
    assert_eq!(legacy.status, 200, "{}", legacy.body);
    let mut names: Vec<&str> = legacy.body["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["widgets", "widgets/scale", "widgets/status"]);
    let aggregated = aggregated_discovery(&h).await;
    assert_eq!(aggregated.status, 200, "{}", aggregated.body);
    let listed: Vec<&str> = aggregated.body["items"][0]["versions"][0]["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["resource"].as_str())
        .collect();
    assert_eq!(listed, ["widgets"]);
    assert!(!fallbacks(&h), "the target answered discovery");

    // The OpenAPI document keeps widgets' paths and schemas, and nothing of gadgets.
    let openapi = call(
        &h.aggregator,
        "GET",
        "/openapi/v3/apis/example.com/v1",
        None,
    )
    .await;
    assert_eq!(openapi.status, 200, "{}", openapi.body);
    let keys = |pointer: &str| -> Vec<String> {
        openapi
            .body
            .pointer(pointer)
            .and_then(Value::as_object)
            .expect(pointer)
            .keys()
            .cloned()
            .collect()
    };
    let (paths, schemas) = (keys("/paths"), keys("/components/schemas"));
    assert!(paths.iter().any(|p| p.contains("/widgets")), "{paths:?}");
    assert!(!paths.iter().any(|p| p.contains("/gadgets")), "{paths:?}");
    assert!(
        schemas.iter().any(|s| s.ends_with(".Widget")),
        "{schemas:?}"
    );
    assert!(!schemas.iter().any(|s| s.contains("Gadget")), "{schemas:?}");
    h.proxy.shutdown().await;
}

/// Under explicit keys no part of the target's OpenAPI document goes out uncut:
/// a caller's `Range` never reaches the target (kube-openapi answers one 206
/// with the part asked for, which could not be cut down), and a 206 the target
/// sends anyway is read and cut down like a 200.
#[tokio::test]
async fn a_ranged_openapi_request_gets_only_the_cut_document() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const OPENAPI: &str = "/openapi/v3/apis/example.com/v1";
    for always_partial in [false, true] {
        let h = harness(AccessMode::Owned).await;
        let ranged = Arc::new(AtomicBool::new(false));
        let backend = Backend::start(Arc::new({
            let ranged = Arc::clone(&ranged);
            move |request: &http::request::Parts, _: &[u8]| {
                let path = request.uri.path();
                if path == "/apis/example.com/v1" {
                    return json_answer(200, &widgets_discovery());
                }
                if path != OPENAPI {
                    return failing_answer(path, 404, false);
                }
                let asked_range = request.headers.contains_key(http::header::RANGE);
                ranged.fetch_or(asked_range, Ordering::SeqCst);
                let document = json!({
                    "openapi": "3.0.0",
                    "paths": {
                        "/apis/example.com/v1/namespaces/{namespace}/widgets": {"get": {}},
                        "/apis/example.com/v1/namespaces/{namespace}/gadgets": {"get": {}},
                    },
                });
                let code = if always_partial || asked_range {
                    206
                } else {
                    200
                };
                json_answer(code, &document)
            }
        }))
        .await;
        widgets_served_by(&h, &backend, ("absent", 404)).await;
        let request = as_alice("GET", OPENAPI)
            .header("accept", "application/json")
            .header(http::header::RANGE, "bytes=0-")
            .body(Bytes::new())
            .expect("request");
        let reply = exchange(&h.aggregator, request).await;
        let partial = format!("the target always answers 206: {always_partial}");
        assert_eq!(reply.status, 200, "{partial}: {}", reply.body);
        let paths: Vec<&String> = reply.body["paths"]
            .as_object()
            .expect("paths")
            .keys()
            .collect();
        assert_eq!(
            paths,
            ["/apis/example.com/v1/namespaces/{namespace}/widgets"],
            "{partial}"
        );
        assert!(
            !ranged.load(Ordering::SeqCst),
            "{partial}: a Range reached the target"
        );
        h.proxy.shutdown().await;
    }
}

#[tokio::test]
async fn target_errors_become_a_retryable_503() {
    let h = harness(AccessMode::Owned).await;
    // The target hands example.com/v1 to an extension API server whose Service does
    // not exist: kube-apiserver answers 503 for the group, as when that server is down.
    hand_widgets_to_backend(&h, 443).await;
    // The target's aggregator picks the APIService up from its watch.
    let target_code = target_answers(503, || async {
        match h.widgets.list(&ListParams::default()).await {
            Err(kube::Error::Api(status)) => status.code,
            _ => 200,
        }
    })
    .await;
    assert_eq!(target_code, 503, "the target never answered 503");
    let reply = call(&h.aggregator, "GET", WIDGETS, None).await;
    assert_retryable_503(&reply);
    assert_eq!(
        reply.body["message"],
        "target tenant cluster \"target\" for example.com/v1 is unavailable"
    );
    h.proxy.shutdown().await;
}

/// How a [`Backend`] answers one request, from its head and its body.
type BackendAnswer = Arc<
    dyn Fn(&http::request::Parts, &[u8]) -> http::Response<http_body_util::Full<Bytes>>
        + Send
        + Sync,
>;

/// An extension API server for example.com/v1 on 127.0.0.1 (TLS, HTTP/2 and
/// HTTP/1.1), for the target's aggregator to send the group to; every request is
/// answered by the test's function. Stops when dropped.
struct Backend {
    addr: SocketAddr,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Backend {
    async fn start(answer: BackendAnswer) -> Backend {
        use rustls_pki_types::pem::PemObject as _;
        let ca = crproxy_core::pki::CertificateAuthority::generate("backend-ca").expect("ca");
        let leaf = ca
            .issue_server(
                &["widgets-backend.default.svc"],
                &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            )
            .expect("leaf");
        let cert =
            rustls_pki_types::CertificateDer::from_pem_slice(leaf.cert.as_bytes()).expect("cert");
        let key =
            rustls_pki_types::PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).expect("key");
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(crproxy_kube::crypto_provider()))
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_no_client_auth()
                .with_single_cert(vec![cert], key)
                .expect("server config");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accept = tokio::spawn(async move {
            // Bounded: aborted when the backend drops.
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let answer = Arc::clone(&answer);
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        move |request: http::Request<hyper::body::Incoming>| {
                            let answer = Arc::clone(&answer);
                            async move {
                                let (parts, body) = request.into_parts();
                                let body = http_body_util::BodyExt::collect(body)
                                    .await
                                    .map(|collected| collected.to_bytes())
                                    .unwrap_or_default();
                                Ok::<_, std::convert::Infallible>(answer(&parts, &body))
                            }
                        },
                    );
                    let builder = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    );
                    let _ = builder
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Backend { addr, accept }
    }
}

/// A [`Backend`] that answers discovery (so the APIService turns Available) and
/// every other request with the error `code` holds, as kube would word it: 429
/// `TooManyRequests` as an overloaded server or API priority and fairness
/// throttles, 401 or 403 as a refusing authorizer, 500 as a failed server.
struct FailingBackend {
    backend: Backend,
    code: Arc<std::sync::atomic::AtomicU16>,
    /// Whether discovery fails too, for every caller but the target's aggregator
    /// (whose availability check must keep passing).
    discovery_fails: Arc<std::sync::atomic::AtomicBool>,
}

impl FailingBackend {
    async fn start(code: u16) -> FailingBackend {
        let code = Arc::new(std::sync::atomic::AtomicU16::new(code));
        let current = Arc::clone(&code);
        let discovery_fails = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let failing_discovery = Arc::clone(&discovery_fails);
        let backend = Backend::start(Arc::new(move |request: &http::request::Parts, _: &[u8]| {
            let from_aggregator = request
                .headers
                .get("x-remote-user")
                .is_some_and(|u| u == "system:kube-aggregator");
            failing_answer(
                request.uri.path(),
                current.load(std::sync::atomic::Ordering::SeqCst),
                !from_aggregator && failing_discovery.load(std::sync::atomic::Ordering::SeqCst),
            )
        }))
        .await;
        FailingBackend {
            backend,
            code,
            discovery_fails,
        }
    }

    /// Answers every request but discovery with `code` from now on.
    fn answer(&self, code: u16) {
        self.code.store(code, std::sync::atomic::Ordering::SeqCst);
    }

    /// Answers discovery with the failing code too, except to the target's
    /// aggregator, so the APIService stays Available and the code reaches the proxy.
    fn fail_discovery(&self) {
        self.discovery_fails
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// example.com/v1's discovery document, as a backend serves it.
fn widgets_discovery() -> Value {
    json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "example.com/v1",
        "resources": [{"name": "widgets", "singularName": "widget", "namespaced": true,
                       "kind": "Widget", "verbs": ["get", "list", "delete", "patch", "update"]}],
    })
}

/// A backend's JSON answer.
fn json_answer(code: u16, body: &Value) -> http::Response<http_body_util::Full<Bytes>> {
    http::Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(Bytes::from(body.to_string())))
        .expect("response")
}

fn failing_answer(
    path: &str,
    code: u16,
    discovery_fails: bool,
) -> http::Response<http_body_util::Full<Bytes>> {
    let (code, body) = if path == "/apis/example.com/v1" && !discovery_fails {
        (200, widgets_discovery())
    } else {
        let (reason, message) = match code {
            429 => (
                "TooManyRequests",
                "Too many requests, please try again later.",
            ),
            401 => ("Unauthorized", "Unauthorized"),
            404 => (
                "NotFound",
                "the server could not find the requested resource",
            ),
            403 => ("Forbidden", "widgets.example.com is forbidden"),
            _ => ("InternalError", "Internal error occurred: backend failed"),
        };
        let failure = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": {"retryAfterSeconds": 1},
            "code": code,
        });
        (code, failure)
    };
    http::Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::RETRY_AFTER, "1")
        .body(http_body_util::Full::new(Bytes::from(body.to_string())))
        .expect("response")
}

/// Hands the target's example.com/v1 to a [`FailingBackend`] answering `code`,
/// and waits until the target's aggregator answers `demo/<name>` with it.
async fn widgets_failing_with(h: &Harness, name: &str, code: u16) -> FailingBackend {
    let backend = FailingBackend::start(code).await;
    widgets_served_by(h, &backend.backend, (name, code)).await;
    backend
}

/// Hands the target's example.com/v1 to `backend` (a Service and an APIService
/// on the target), and waits until the target answers a GET of `demo/<name>`
/// with `code` (`probe`): its aggregator routes the group to the backend once
/// the APIService is Available.
async fn widgets_served_by(h: &Harness, backend: &Backend, probe: (&str, u16)) {
    let port = backend.addr.port();
    let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": "widgets-backend", "namespace": "default"},
        "spec": {"type": "ExternalName", "externalName": "127.0.0.1",
                 "ports": [{"port": port}]}
    }))
    .expect("service");
    Api::namespaced(h.admin.clone(), "default")
        .create(&PostParams::default(), &service)
        .await
        .expect("service created");
    hand_widgets_to_backend(h, port).await;
    assert_target_answers(h, probe.0, probe.1).await;
}

/// A Scale carries no labels, so it is shown only as the state its object's
/// check saw. Scripted on a backend, so that the object moves exactly when the
/// test says: once between the check and the read, the object is checked again
/// and the Scale shown (not masked as missing); on every read, the read is
/// masked after three checks.
#[tokio::test]
async fn a_scale_read_is_checked_again_when_its_object_moved() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    for (moves, code, scale_reads) in [(1, 200, 2), (usize::MAX, 404, 3)] {
        let h = harness(AccessMode::Owned).await;
        let version = Arc::new(AtomicUsize::new(1));
        let reads = Arc::new(AtomicUsize::new(0));
        let backend = Backend::start(Arc::new({
            let (version, reads) = (Arc::clone(&version), Arc::clone(&reads));
            move |request: &http::request::Parts, _: &[u8]| {
                let path = request.uri.path();
                let (code, body) = if path == "/apis/example.com/v1" {
                    (200, widgets_discovery())
                } else if path == format!("{WIDGETS}/busy") {
                    let mut widget = widget("busy", owned_labels());
                    widget["metadata"]["uid"] = json!("u-busy");
                    widget["metadata"]["resourceVersion"] =
                        json!(version.load(Ordering::SeqCst).to_string());
                    (200, widget)
                } else if path == format!("{WIDGETS}/busy/scale") {
                    if reads.fetch_add(1, Ordering::SeqCst) < moves {
                        version.fetch_add(1, Ordering::SeqCst);
                    }
                    let scale = json!({
                        "kind": "Scale", "apiVersion": "autoscaling/v1",
                        "metadata": {"name": "busy", "namespace": "demo", "uid": "u-busy",
                                     "resourceVersion": version.load(Ordering::SeqCst).to_string()},
                        "spec": {"replicas": 1}, "status": {"replicas": 1},
                    });
                    (200, scale)
                } else {
                    return failing_answer(path, 404, false);
                };
                json_answer(code, &body)
            }
        }))
        .await;
        widgets_served_by(&h, &backend, ("busy", 200)).await;
        let reply = call(&h.aggregator, "GET", &format!("{WIDGETS}/busy/scale"), None).await;
        assert_eq!(reply.status, code, "moves {moves}: {}", reply.body);
        assert_eq!(
            reads.load(Ordering::SeqCst),
            scale_reads,
            "moves {moves}: Scale reads"
        );
        h.proxy.shutdown().await;
    }
}

/// What holds the name `busy` in [`a_refusal_that_ends_a_write_is_shown_only_for_the_checked_state`].
#[derive(Clone, Copy, PartialEq)]
enum Holder {
    Nobody,
    TheCaller,
    /// The caller's, changed since the check (resourceVersion 8).
    TheCallerChanged,
    AnotherTenant,
}

/// What the caller gets in [`a_refusal_that_ends_a_write_is_shown_only_for_the_checked_state`].
#[derive(Clone, Copy, Debug)]
enum Shown {
    /// The target's refusal, as it wrote it.
    TheRefusal,
    /// The masked 404.
    Masked,
    /// The proxy's "the object has been modified" conflict.
    Stale,
}

/// A pinned write's refusal that ends the request is looked at once more: kube
/// judges a write on whatever holds the name when it arrives, so its words may
/// be about another tenant's object that took the name after the check (a
/// failed uid precondition names that object's uid, an apply's conflicts name
/// its field managers, a webhook's denial may quote it). Taken by another
/// tenant meanwhile, the name gets the masked 404, and none of the refusal
/// reaches the caller; unchanged (the caller's object, or still nobody's for an
/// apply that would create it), the refusal is the request's own and goes back
/// as kube wrote it; still the caller's but changed, it is the proxy's conflict.
/// A 409 or 422 is sent once more first (but for a body naming another uid); any
/// other refusal ends the write at once. kube's own 429 (priority and fairness)
/// is passed on unjudged, a webhook's denial with that code or 404 is not.
#[tokio::test]
async fn a_refusal_that_ends_a_write_is_shown_only_for_the_checked_state() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let refusal = |code: u16, reason: &str, message: &str| {
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason,
            "details": {"name": "busy", "group": "example.com", "kind": "widgets"},
            "code": code,
        })
    };
    let uid_refusal = refusal(
        409,
        "Conflict",
        "Precondition failed: UID in precondition: u-busy, UID in object meta: u-other-tenant",
    );
    let apply_conflict = refusal(
        409,
        "Conflict",
        "Apply failed with 1 conflict: conflict with \"other-tenant-manager\": .spec.size",
    );
    let invalid = refusal(
        422,
        "Invalid",
        "Widget.example.com \"busy\" is invalid: spec.size: Invalid value: \"big\": must be a number",
    );
    let webhook = |code: u16, reason: &str| {
        refusal(
            code,
            reason,
            "admission webhook \"guard.example.com\" denied the request: owner other-tenant keeps spec.secret=hunter2",
        )
    };
    let webhook_403 = webhook(403, "Forbidden");
    // About another object, so that it is not masked as a 404 of this one.
    let mut webhook_404 = webhook(404, "NotFound");
    webhook_404["details"] = json!({"name": "guard", "kind": "policies"});
    let webhook_429 = webhook(429, "TooManyRequests");
    let throttled = refusal(
        429,
        "TooManyRequests",
        "Too many requests, please try again later.",
    );
    let apply = (
        "PATCH",
        Some("application/apply-patch+yaml"),
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: busy\nspec:\n  size: 2\n",
    );
    let merge = (
        "PATCH",
        Some("application/merge-patch+json"),
        r#"{"spec":{"size":2}}"#,
    );
    let put_naming_a_uid = (
        "PUT",
        Some("application/json"),
        r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"busy","namespace":"demo","uid":"u-earlier","resourceVersion":"7"},"spec":{"size":2}}"#,
    );
    use Holder::{AnotherTenant, Nobody, TheCaller, TheCallerChanged};
    use Shown::{Masked, Stale, TheRefusal};
    let delete = ("DELETE", None, "");
    // (what the check finds, who holds the name from the `taken_after`-th write
    // on, the request, the target's answer to every write, the writes sent, what
    // the caller gets)
    let cases = [
        (
            TheCaller,
            (AnotherTenant, 2),
            delete,
            &uid_refusal,
            2,
            Masked,
        ),
        (
            TheCaller,
            (TheCaller, 0),
            apply,
            &apply_conflict,
            2,
            TheRefusal,
        ),
        (
            Nobody,
            (AnotherTenant, 2),
            apply,
            &apply_conflict,
            2,
            Masked,
        ),
        (Nobody, (Nobody, 0), apply, &invalid, 2, TheRefusal),
        (
            TheCaller,
            (AnotherTenant, 1),
            merge,
            &webhook_403,
            1,
            Masked,
        ),
        (
            TheCaller,
            (TheCaller, 0),
            merge,
            &webhook_403,
            1,
            TheRefusal,
        ),
        (
            TheCaller,
            (TheCallerChanged, 1),
            merge,
            &webhook_403,
            1,
            Stale,
        ),
        (
            TheCaller,
            (AnotherTenant, 1),
            merge,
            &webhook_404,
            1,
            Masked,
        ),
        (
            TheCaller,
            (AnotherTenant, 1),
            delete,
            &webhook_429,
            1,
            Masked,
        ),
        (
            TheCaller,
            (AnotherTenant, 1),
            merge,
            &throttled,
            1,
            TheRefusal,
        ),
        (
            TheCaller,
            (AnotherTenant, 1),
            put_naming_a_uid,
            &uid_refusal,
            1,
            Masked,
        ),
    ];
    for (first, (then, taken_after), (method, content_type, body), answer, sent, shown) in cases {
        let h = harness(AccessMode::Owned).await;
        let writes = Arc::new(AtomicUsize::new(0));
        let backend = Backend::start(Arc::new({
            let (writes, answer) = (Arc::clone(&writes), answer.clone());
            move |request: &http::request::Parts, _: &[u8]| {
                let path = request.uri.path();
                if path == "/apis/example.com/v1" {
                    return json_answer(200, &widgets_discovery());
                }
                if path != format!("{WIDGETS}/busy") {
                    return failing_answer(path, 404, false);
                }
                if request.method != http::Method::GET {
                    writes.fetch_add(1, Ordering::SeqCst);
                    return json_answer(answer["code"].as_u64().unwrap_or(500) as u16, &answer);
                }
                let holder = if taken_after > 0 && writes.load(Ordering::SeqCst) >= taken_after {
                    then
                } else {
                    first
                };
                let (uid, version, labels) = match holder {
                    Nobody => return failing_answer(path, 404, false),
                    TheCaller => ("u-busy", "7", owned_labels()),
                    TheCallerChanged => ("u-busy", "8", owned_labels()),
                    AnotherTenant => ("u-other-tenant", "7", json!({"app": "theirs"})),
                };
                let mut widget = widget("busy", labels);
                widget["metadata"]["uid"] = json!(uid);
                widget["metadata"]["resourceVersion"] = json!(version);
                json_answer(200, &widget)
            }
        }))
        .await;
        widgets_served_by(
            &h,
            &backend,
            ("busy", if first == Nobody { 404 } else { 200 }),
        )
        .await;
        let path = format!("{WIDGETS}/busy?fieldManager=me");
        let reply = send_as(&h.aggregator, method, &path, content_type, body).await;
        let case = format!("{method} {} ({shown:?})", answer["message"]);
        assert_eq!(writes.load(Ordering::SeqCst), sent, "{case}: writes sent");
        match shown {
            TheRefusal => assert_eq!(reply.body, *answer, "{case}: the target's own words"),
            Masked | Stale => {
                let code = if matches!(shown, Masked) { 404 } else { 409 };
                assert_eq!(reply.status, code, "{case}: {}", reply.body);
                let text = reply.body.to_string();
                assert!(
                    !text.contains("other-tenant") && !text.contains("guard.example.com"),
                    "{case}: {text}"
                );
                if matches!(shown, Stale) {
                    assert!(text.contains("has been modified"), "{case}: {text}");
                }
            }
        }
        h.proxy.shutdown().await;
    }
}

/// Waits until the target answers a GET of `demo/<name>` with `code`.
async fn assert_target_answers(h: &Harness, name: &str, code: u16) {
    let target_code = target_answers(code, || async {
        match h.widgets.get(name).await {
            Err(kube::Error::Api(status)) => status.code,
            Err(_) => 0,
            Ok(_) => 200,
        }
    })
    .await;
    assert_eq!(target_code, code, "the target never answered {code}");
}

/// A throttled ownership check did not find the object missing: it could not look.
/// A named write or delete whose preliminary GET the target answers 429 fails with
/// the retryable 503 of a failed check, never the 404 a controller takes for "gone".
#[tokio::test]
async fn a_throttled_ownership_check_is_a_retryable_503_not_a_404() {
    let h = harness(AccessMode::Owned).await;
    create_on_target(&h, "throttled", owned_labels()).await;
    let _backend = widgets_failing_with(&h, "throttled", 429).await;

    let path = format!("{WIDGETS}/throttled");
    let delete = call(&h.aggregator, "DELETE", &path, None).await;
    assert_retryable_503(&delete);
    let patch = call_as(
        &h.aggregator,
        "PATCH",
        &path,
        Some(json!({"spec": {"replicas": 9}})),
        "application/merge-patch+json",
    )
    .await;
    assert_retryable_503(&patch);
    for verb in ["DELETE", "PATCH"] {
        let needle = format!("verb=\"{verb}\",code=\"503\",reason=\"ownership_check_failed\"");
        assert!(
            series(&h.metrics, "vcluster_proxy_request_total", &needle),
            "{needle}"
        );
    }
    h.proxy.shutdown().await;
}

/// An ownership check the target refuses with 401 or 403 means this client may not
/// see the object: to the caller it does not exist (404 `ownership_masked`).
#[tokio::test]
async fn an_ownership_check_refused_with_401_or_403_is_masked_as_a_404() {
    let h = harness(AccessMode::Owned).await;
    create_on_target(&h, "refused", owned_labels()).await;
    let backend = widgets_failing_with(&h, "refused", 401).await;
    let path = format!("{WIDGETS}/refused");
    for code in [401, 403] {
        backend.answer(code);
        assert_target_answers(&h, "refused", code).await;
        let delete = call(&h.aggregator, "DELETE", &path, None).await;
        assert_eq!(delete.status, 404, "{code}: {}", delete.body);
        assert_eq!(delete.body["reason"], "NotFound", "{code}: {}", delete.body);
        assert_eq!(delete.body["code"], 404, "{code}: {}", delete.body);
        assert_eq!(
            delete.body["message"], "widgets.example.com \"refused\" not found",
            "{code}"
        );
    }
    let needle = "verb=\"DELETE\",code=\"404\",reason=\"ownership_masked\"";
    assert!(
        series(&h.metrics, "vcluster_proxy_request_total", needle),
        "{needle}"
    );
    h.proxy.shutdown().await;
}

/// A target that refuses the proxy's credentials (401) is not the caller's login
/// failing: a read, a list and a watch get a 401 that says "auth failed" and names
/// the target and the group/version, as the runbook's symptom reads, instead of
/// the target's bare `Unauthorized`.
#[tokio::test]
async fn a_target_refusing_the_proxys_credentials_is_a_401_auth_failed() {
    let h = harness(AccessMode::Owned).await;
    let _backend = widgets_failing_with(&h, "refused", 401).await;
    for path in [
        format!("{WIDGETS}/refused"),
        WIDGETS.to_string(),
        format!("{WIDGETS}?watch=true"),
    ] {
        let reply = call(&h.aggregator, "GET", &path, None).await;
        assert_eq!(reply.status, 401, "{path}: {}", reply.body);
        assert_eq!(reply.body["kind"], "Status", "{path}");
        assert_eq!(reply.body["reason"], "Unauthorized", "{path}");
        assert_eq!(reply.body["code"], 401, "{path}");
        let message = reply.body["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("auth failed: target tenant cluster ")
                && message.contains("example.com/v1")
                && message.contains("rejected the proxy's credentials"),
            "{path}: {message}"
        );
    }
    let needle = "verb=\"LIST\",code=\"401\",reason=\"upstream\"";
    assert!(
        series(&h.metrics, "vcluster_proxy_request_total", needle),
        "{needle}"
    );
    h.proxy.shutdown().await;
}

/// An ownership check the target fails with a 5xx could not look, like a throttled
/// one: a retryable 503 `ownership_check_failed`, not a 404, logged like any
/// request the target failed. A current-thread runtime, so the log capture sees
/// the proxy's events.
#[tokio::test]
async fn an_ownership_check_failed_with_a_5xx_is_a_retryable_503() {
    let (logs, _guard) = LogBuffer::capture();
    let h = harness(AccessMode::Owned).await;
    create_on_target(&h, "failing", owned_labels()).await;
    let _backend = widgets_failing_with(&h, "failing", 500).await;
    let delete = call(&h.aggregator, "DELETE", &format!("{WIDGETS}/failing"), None).await;
    assert_retryable_503(&delete);
    assert_eq!(
        delete.body["reason"], "ServiceUnavailable",
        "{}",
        delete.body
    );
    assert_eq!(delete.body["code"], 503, "{}", delete.body);
    let needle = "verb=\"DELETE\",code=\"503\",reason=\"ownership_check_failed\"";
    assert!(
        series(&h.metrics, "vcluster_proxy_request_total", needle),
        "{needle}"
    );
    let logged = logs.text();
    assert!(
        logged
            .lines()
            .any(|line| line.contains("request to target failed")
                && line.contains("ownership_check_failed")
                && line.contains(".vcluster.invalid:443: the ownership check was answered 500")),
        "{logged}"
    );
    h.proxy.shutdown().await;
}

/// Whatever 5xx the target answers a read or a list with, the caller gets the
/// same retryable 503 (the cause is in the proxy's logs and metrics); a watch is
/// streamed from the target as it answered, its own status included.
#[tokio::test]
async fn target_5xx_answers_are_a_retryable_503_but_a_watch_gets_the_targets_own() {
    let h = harness(AccessMode::Owned).await;
    let backend = widgets_failing_with(&h, "broken", 500).await;
    for code in [500, 502, 504] {
        backend.answer(code);
        assert_target_answers(&h, "broken", code).await;
        for path in [format!("{WIDGETS}/broken"), WIDGETS.to_string()] {
            let reply = call(&h.aggregator, "GET", &path, None).await;
            assert_retryable_503(&reply);
            assert_eq!(
                reply.body["message"],
                "target tenant cluster \"target\" for example.com/v1 is unavailable",
                "{code} {path}"
            );
        }
        let watch = call(&h.aggregator, "GET", &format!("{WIDGETS}?watch=true"), None).await;
        assert_eq!(watch.status, code, "watch: {}", watch.body);
        assert_eq!(watch.body["code"], code, "watch: {}", watch.body);
        assert_eq!(
            watch.body["reason"], "InternalError",
            "watch: {}",
            watch.body
        );
    }
    // A named GET answered 5xx is shown only for an owned object, and the
    // check of its ownership failed too; a list is scoped, so it needs no check.
    for (verb, reason) in [("GET", "ownership_check_failed"), ("LIST", "upstream")] {
        let needle = format!("verb=\"{verb}\",code=\"503\",reason=\"{reason}\"");
        assert!(
            series(&h.metrics, "vcluster_proxy_request_total", &needle),
            "{needle}"
        );
    }
    h.proxy.shutdown().await;
}

/// A named GET whose answer cannot be read for its labels cannot be shown: the
/// object is masked as missing, in kube's words, and counted as a failed check.
#[tokio::test]
async fn a_named_get_whose_answer_cannot_be_decoded_is_masked_as_a_404() {
    let h = harness(AccessMode::Owned).await;
    let backend = Backend::start(Arc::new(|request: &http::request::Parts, _: &[u8]| {
        let path = request.uri.path();
        if path == "/apis/example.com/v1" {
            return json_answer(200, &widgets_discovery());
        }
        if path != format!("{WIDGETS}/garbled") {
            return failing_answer(path, 404, false);
        }
        http::Response::builder()
            .status(200)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(http_body_util::Full::new(Bytes::from_static(
                b"{\"kind\": \"Widget\", \"metadata\": {\"labels\": ",
            )))
            .expect("response")
    }))
    .await;
    widgets_served_by(&h, &backend, ("absent", 404)).await;
    let reply = call(&h.aggregator, "GET", &format!("{WIDGETS}/garbled"), None).await;
    assert_eq!(reply.status, 404, "{}", reply.body);
    assert_eq!(reply.body["reason"], "NotFound", "{}", reply.body);
    assert_eq!(
        reply.body["message"], "widgets.example.com \"garbled\" not found",
        "{}",
        reply.body
    );
    let needle = "verb=\"GET\",code=\"404\",reason=\"ownership_check_failed\"";
    assert!(
        series(&h.metrics, "vcluster_proxy_request_total", needle),
        "{needle}"
    );
    h.proxy.shutdown().await;
}

/// kube-apiserver fails some named GETs only after it has read the object: a
/// Table with an unknown `includeObject` is a 400, a list media type asked of
/// one object a 500. Passed on, such an answer would tell a caller that an
/// object of that name exists even when it is another client's. The object's
/// ownership is checked first: another client's object gets the same 404 as a
/// missing one, on GET and HEAD, and the caller's own object the target's answer.
#[tokio::test]
async fn failures_kube_makes_after_reading_an_object_do_not_reveal_another_clients() {
    const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
    const LIST_METADATA: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
    let h = harness(AccessMode::Owned).await;
    let backend = Backend::start(Arc::new(|request: &http::request::Parts, _: &[u8]| {
        let path = request.uri.path();
        if path == "/apis/example.com/v1" {
            return json_answer(200, &widgets_discovery());
        }
        let Some(name) = path.strip_prefix(&format!("{WIDGETS}/")) else {
            return failing_answer(path, 404, false);
        };
        let labels = match name {
            "taken" => json!({"team": "other"}),
            "mine" => owned_labels(),
            _ => {
                let missing = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure", "message": format!("widgets.example.com \"{name}\" not found"),
                    "reason": "NotFound", "code": 404,
                    "details": {"name": name, "group": "example.com", "kind": "widgets"}});
                return json_answer(404, &missing);
            }
        };
        let failure = |code: u16, reason: &str, message: &str| {
            json_answer(
                code,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "message": message, "reason": reason,
                        "code": code}),
            )
        };
        let accept = request
            .headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if request.uri.query().unwrap_or_default().contains("includeObject=Bogus") {
            return failure(
                400,
                "BadRequest",
                "Unable to convert to Table as requested: includeObject: Invalid value: \"Bogus\": must be 'Metadata', 'Object', 'None', or empty",
            );
        }
        if accept.contains("as=PartialObjectMetadataList") {
            return failure(500, "InternalError", "content is not a list");
        }
        let mut object = widget(name, labels);
        object["metadata"]["uid"] = json!(format!("u-{name}"));
        object["metadata"]["resourceVersion"] = json!("7");
        json_answer(200, &object)
    }))
    .await;
    widgets_served_by(&h, &backend, ("blank", 404)).await;
    let caller = &h.aggregator;
    let get = |method: &'static str, name: &str, query: &str, accept: &'static str| {
        let path = format!("{WIDGETS}/{name}{query}");
        async move {
            target_support::send_accepting(caller, method, &path, accept, None, Bytes::new()).await
        }
    };
    for (query, accept, own_code) in [
        ("?includeObject=Bogus", TABLE, 400),
        ("", LIST_METADATA, 503),
    ] {
        for method in ["GET", "HEAD"] {
            let hidden = get(method, "taken", query, accept).await;
            let missing = get(method, "blank", query, accept).await;
            assert_eq!(hidden.status, 404, "{method} {accept}: {}", hidden.body);
            assert_eq!(missing.status, 404, "{method} {accept}: {}", missing.body);
            assert_eq!(
                hidden.headers.get(http::header::CONTENT_LENGTH),
                missing.headers.get(http::header::CONTENT_LENGTH),
                "{method} {accept}: the same length for names of the same length"
            );
            if method == "GET" {
                assert_eq!(
                    hidden.body["message"], "widgets.example.com \"taken\" not found",
                    "{accept}"
                );
                assert_eq!(hidden.body, {
                    let mut body = missing.body.clone();
                    body["message"] = json!("widgets.example.com \"taken\" not found");
                    body["details"]["name"] = json!("taken");
                    body
                });
            }
            let own = get(method, "mine", query, accept).await;
            assert_eq!(own.status, own_code, "{method} {accept}: {}", own.body);
        }
    }
    let needle = "verb=\"GET\",code=\"404\",reason=\"ownership_masked\"";
    assert!(
        series(&h.metrics, "vcluster_proxy_request_total", needle),
        "{needle}"
    );
    h.proxy.shutdown().await;
}

/// A 503 that tells the caller to retry in a second.
fn assert_retryable_503(reply: &Reply) {
    assert_eq!(reply.status, 503, "{}", reply.body);
    let retry_after = reply
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok());
    assert_eq!(retry_after, Some("1"), "{}", reply.body);
}

/// A current-thread runtime, so the log capture sees the proxy's events.
#[tokio::test]
async fn an_unreachable_target_is_a_retryable_503_logged_at_warn() {
    let (logs, _guard) = LogBuffer::capture();
    let h = harness(AccessMode::Owned).await;
    // The target goes away: its port refuses connections, open ones are dropped.
    h.target
        .cluster
        .stop_listener(h.target.cluster.addr())
        .expect("stop the target");
    let reply = call(&h.aggregator, "GET", WIDGETS, None).await;
    assert_retryable_503(&reply);
    let message = reply.body["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("target tenant cluster \"target\" for example.com/v1 is unavailable"),
        "{message}"
    );
    // Operators alert on this line at the default level: it names the placeholder
    // upstream and what went wrong with it.
    let logged = logs.text();
    let line = logged
        .lines()
        .find(|l| l.contains("request to target failed"))
        .unwrap_or_else(|| panic!("no failure logged: {logged}"));
    assert!(line.contains(" WARN "), "{line}");
    for field in [
        "target=default/target",
        "group_version=example.com/v1",
        "reason=",
        "error=kube.target.default.vcluster.invalid:443: ",
    ] {
        assert!(line.contains(field), "{field}: {line}");
    }
    assert!(line.contains("refused"), "the dial's own error: {line}");
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn discovery_falls_back_locally_when_no_peer_answers() {
    // A port nobody listens on: every dial is refused.
    let refused = test_support::RefusedPort::bind();
    let dead = refused.addr.to_string();
    let h = harness_with_peers(AccessMode::Owned, |_| PeerSourceConfig::Static(vec![dead])).await;
    let reply = call(&h.aggregator, "GET", "/apis/example.com/v1", None).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["kind"], "APIResourceList");
    assert_eq!(reply.body["resources"][0]["name"], "widgets");
    assert_eq!(reply.body["resources"][0]["verbs"], json!(["get"]));
    // The dial failed before the discovery fell back: the request keeps the dial's
    // reason, the fallback is counted as an upstream error (the peer check passed).
    let counted = h.metrics.encode();
    assert!(
        series(
            &h.metrics,
            "vcluster_proxy_request_total",
            "verb=\"GET\",code=\"200\",reason=\"error\""
        ),
        "{counted}"
    );
    assert_eq!(
        metric_value(
            &h.metrics,
            "vcluster_proxy_discovery_fallbacks_total",
            "group_version=\"example.com/v1\",reason=\"upstream_error\""
        ),
        1.0,
        "{counted}"
    );
    // Resource requests fail with the retryable 503 meanwhile.
    let list = call(&h.aggregator, "GET", WIDGETS, None).await;
    assert_eq!(list.status, 503);
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn paths_outside_the_group_version_never_reach_the_target() {
    let h = harness(AccessMode::Owned).await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "s", "namespace": "demo"},
        "stringData": {"password": "hunter2"}
    }))
    .expect("secret");
    let secrets: Api<Secret> = Api::namespaced(h.admin.clone(), "demo");
    let secret = secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret created");
    for (path, expected) in [
        ("/api/v1/namespaces/demo/secrets/s", 404),
        ("/apis/example.com/v2/namespaces/demo/widgets", 404),
        ("/apis/other.io/v1/namespaces/demo/widgets", 404),
        ("/apis/example.com/v1/namespaces/demo/widgets/..%2F..%2F..%2Fapi%2Fv1%2Fnamespaces%2Fdemo%2Fsecrets%2Fs", 400),
        ("/apis/example.com/v1/namespaces/demo/widgets/../../../../api/v1/namespaces/demo/secrets/s", 400),
    ] {
        let read = call(&h.aggregator, "GET", path, None).await;
        assert_eq!(read.status, expected, "{path}: {}", read.body);
        assert_ne!(read.body["kind"], "Secret", "{path}");
        // A delete that reached the target would remove the secret.
        let delete = call(&h.aggregator, "DELETE", path, None).await;
        assert_eq!(delete.status, expected, "DELETE {path}: {}", delete.body);
    }
    let stored = secrets.get("s").await.expect("the secret is still there");
    assert_eq!(
        stored.metadata.resource_version,
        secret.metadata.resource_version
    );
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn a_namespace_deleted_on_the_client_stops_writes() {
    let h = harness(AccessMode::Owned).await;
    created_through_proxy(&h, "w1").await;
    Api::<Namespace>::all(h.client_admin.clone())
        .delete("demo", &Default::default())
        .await
        .expect("delete namespace on the client");
    // The namespace cache follows the client's watch, and the client finishes the
    // deletion in the background; allow them a moment (bounded: 10 s).
    let mut status = 0;
    for attempt in 0..100 {
        let reply = call(
            &h.aggregator,
            "POST",
            WIDGETS,
            Some(widget(&format!("late-{attempt}"), json!({}))),
        )
        .await;
        status = reply.status;
        if status == 404 {
            assert_eq!(reply.body["message"], "namespaces \"demo\" not found");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        status, 404,
        "writes into a namespace deleted on the client must stop"
    );
    h.proxy.shutdown().await;
}

/// A harness whose client namespace `demo` holds the widget `w1` (made through
/// the proxy) and is being deleted: the client's namespace controller is
/// stopped, so it stays Terminating.
async fn terminating_demo(access: AccessMode) -> Harness {
    let h = harness(access).await;
    created_through_proxy(&h, "w1").await;
    h.client_api.cluster.stop_namespace_controller();
    Api::<Namespace>::all(h.client_admin.clone())
        .delete("demo", &Default::default())
        .await
        .expect("delete namespace on the client");
    h
}

/// The first apply of a new widget into the terminating `demo` that the proxy
/// refuses (403), and the widget's name. The proxy learns of the deletion from
/// its watch of the client's namespaces; until then an apply may still create,
/// so each attempt names a new widget (100 attempts, 100 ms apart).
async fn first_apply_refused(h: &Harness) -> (String, Reply) {
    for attempt in 0..100 {
        let name = format!("late-{attempt}");
        let reply = applied_widget(h, &name).await;
        if reply.status == 403 {
            return (name, reply);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the proxy never refused an apply-create into the terminating namespace");
}

/// A server-side apply of widget `name` in `demo` (size 3), through the proxy.
async fn applied_widget(h: &Harness, name: &str) -> Reply {
    applied_widget_with(h, name, "", "").await
}

/// [`applied_widget`] with `metadata` (YAML lines indented by two spaces)
/// added to the widget's metadata and `query` (starting with `&`) to the
/// apply's query.
async fn applied_widget_with(h: &Harness, name: &str, metadata: &str, query: &str) -> Reply {
    let body = format!(
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: {name}\n  namespace: demo\n{metadata}spec:\n  size: 3\n"
    );
    let path = format!("{WIDGETS}/{name}?fieldManager=test&force=true{query}");
    send_as(
        &h.aggregator,
        "PATCH",
        &path,
        Some("application/apply-patch+yaml"),
        body,
    )
    .await
}

/// kube's namespace lifecycle admission: while a client namespace is being
/// deleted, a create into it is refused with kube's 403 (cause
/// `NamespaceTerminating`) and reaches nothing on the target, so the namespace
/// controller's sweep of the proxied resources is not undone by late creates; a
/// patch of an object already there still goes through.
#[tokio::test]
async fn creates_into_a_namespace_being_deleted_on_the_client_are_refused() {
    let h = terminating_demo(AccessMode::Owned).await;
    // The proxy learns of the deletion from its watch of the client's
    // namespaces; allow it a moment (bounded: 10 s).
    let mut refused = None;
    for attempt in 0..100 {
        let name = format!("late-{attempt}");
        let reply = call(
            &h.aggregator,
            "POST",
            WIDGETS,
            Some(widget(&name, json!({}))),
        )
        .await;
        if reply.status != 201 {
            refused = Some((name, reply));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (name, reply) = refused.expect("a create into a terminating namespace is refused");
    assert_eq!(reply.status, 403, "{}", reply.body);
    assert_eq!(
        reply.body["message"],
        format!("widgets.example.com \"{name}\" is forbidden: unable to create new content in namespace demo because it is being terminated")
    );
    assert_eq!(reply.body["reason"], "Forbidden");
    assert_eq!(
        reply.body["details"],
        json!({"name": name, "group": "example.com", "kind": "widgets", "causes": [{
            "reason": "NamespaceTerminating",
            "message": "namespace demo is being terminated",
            "field": "metadata.namespace",
        }]})
    );
    assert!(
        h.widgets.get_opt(&name).await.expect("get").is_none(),
        "the refused create reached the target"
    );
    // A generateName create is named by its prefix, as kube's admission names it.
    let mut generated = widget("unused", json!({}));
    generated["metadata"] = json!({"generateName": "gen-", "namespace": "demo"});
    let reply = call(&h.aggregator, "POST", WIDGETS, Some(generated)).await;
    assert_eq!(reply.status, 403, "{}", reply.body);
    assert_eq!(reply.body["details"]["name"], "gen-");
    // Server-side apply creates a missing object: refused the same way; an apply
    // of an object that is there goes through.
    let applied = applied_widget(&h, "applied-late").await;
    assert_eq!(applied.status, 403, "{}", applied.body);
    assert_eq!(
        applied.body["details"]["causes"][0]["reason"],
        "NamespaceTerminating"
    );
    assert!(h
        .widgets
        .get_opt("applied-late")
        .await
        .expect("get")
        .is_none());
    // One naming a uid is refused for the uid first, as kube's patcher checks
    // it before admission: 409, not 403.
    let uid = "  uid: 6d1c2a4e-0000-4000-8000-000000000003\n";
    let named = applied_widget_with(&h, "named-late", uid, "").await;
    assert_eq!(named.status, 409, "{}", named.body);
    assert!(
        named.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("uid mismatch")),
        "{}",
        named.body
    );
    assert!(h
        .widgets
        .get_opt("named-late")
        .await
        .expect("get")
        .is_none());
    let applied = applied_widget(&h, "w1").await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    let patched = call_as(
        &h.aggregator,
        "PATCH",
        &format!("{WIDGETS}/w1"),
        Some(json!({"spec": {"size": 2}})),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(patched.status, 200, "{}", patched.body);
    h.proxy.shutdown().await;
}

/// All mode forwards an apply as it came, so it looks at the object first: in a
/// namespace being deleted, an apply of a missing object is refused as a
/// create, one of an existing object goes through, and one whose look the
/// target fails is a retryable 503 (never forwarded: it might create).
#[tokio::test]
async fn all_mode_applies_into_a_namespace_being_deleted_create_nothing() {
    let (logs, _guard) = LogBuffer::capture();
    let h = terminating_demo(AccessMode::All).await;
    let (name, reply) = first_apply_refused(&h).await;
    assert_eq!(
        reply.body["details"]["causes"][0]["reason"], "NamespaceTerminating",
        "{}",
        reply.body
    );
    assert!(h.widgets.get_opt(&name).await.expect("get").is_none());
    let applied = applied_widget(&h, "w1").await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    // A target that throttles every request: forwarded, the apply would come
    // back as the target's 429.
    let _backend = widgets_failing_with(&h, "w1", 429).await;
    let unlooked = applied_widget(&h, "unlooked").await;
    assert_retryable_503(&unlooked);
    let logged = logs.text();
    assert!(
        logged
            .lines()
            .any(|line| line.contains("request to target failed")
                && line.contains("the existence check was answered 429")),
        "{logged}"
    );
    h.proxy.shutdown().await;
}

/// An owned-mode apply of a missing object goes pinned to a resourceVersion no
/// object has, so that it can only create. kube's dry-run storage answers with
/// the object as the apply left it, that resourceVersion included, which the
/// caller never sent: the proxy takes it out. Scripted on a backend that answers
/// a dry run as kube's does.
#[tokio::test]
async fn a_dry_run_apply_that_creates_shows_no_pinned_resource_version() {
    let h = harness(AccessMode::Owned).await;
    create_on_target(&h, "w1", owned_labels()).await;
    let applies = Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let backend = Backend::start(Arc::new({
        let applies = Arc::clone(&applies);
        move |request: &http::request::Parts, body: &[u8]| {
            let path = request.uri.path();
            // Discovery, and every other path, as a backend without the object.
            if path != format!("{WIDGETS}/fresh") || request.method != http::Method::PATCH {
                return failing_answer(path, 404, false);
            }
            let mut applied: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            // What reached the backend, with the query it came with.
            let mut seen = applied.clone();
            seen["query"] = json!(request.uri.query());
            crproxy_core::locks::lock(&applies).push(seen);
            applied["metadata"]["uid"] = json!("u-fresh");
            applied["metadata"]["creationTimestamp"] = json!("2026-12-06T00:00:00Z");
            json_answer(201, &applied)
        }
    }))
    .await;
    // w1 is on the devcluster, not on the backend.
    widgets_served_by(&h, &backend, ("w1", 404)).await;

    let reply = applied_widget_with(&h, "fresh", "", "&dryRun=All").await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    assert_eq!(reply.body["metadata"]["uid"], "u-fresh", "{}", reply.body);
    assert!(
        reply.body["metadata"].get("resourceVersion").is_none(),
        "{}",
        reply.body
    );
    let applies = crproxy_core::locks::lock(&applies).clone();
    assert_eq!(applies.len(), 1, "{applies:?}");
    assert_eq!(
        applies[0]["metadata"]["resourceVersion"],
        crproxy_core::precondition::NO_OBJECT_RESOURCE_VERSION,
        "the apply went pinned"
    );
    assert!(
        applies[0]["query"]
            .as_str()
            .is_some_and(|q| q.contains("dryRun=All")),
        "the apply went as a dry run: {}",
        applies[0]
    );
    h.proxy.shutdown().await;
}

/// All mode's apply into a namespace being deleted goes pinned to the uid its
/// look found, so an object deleted between the look and the apply is not
/// created again: kube refuses the pinned apply ("uid mismatch"), the proxy looks
/// again, finds nothing and refuses the apply as a create. A refusal of an object
/// that is still there is the apply's own and is not sent again. Scripted on a backend
/// that answers as kube would, so the object goes exactly between the two.
#[tokio::test]
async fn an_all_mode_apply_racing_a_delete_in_a_terminating_namespace_creates_nothing() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let h = terminating_demo(AccessMode::All).await;
    first_apply_refused(&h).await;
    let looks = Arc::new(AtomicUsize::new(0));
    let applies = Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let backend = Backend::start(Arc::new({
        let (looks, applies) = (Arc::clone(&looks), Arc::clone(&applies));
        move |request: &http::request::Parts, body: &[u8]| {
            let path = request.uri.path();
            let object = format!("{WIDGETS}/racing");
            // `contested` stays, and another field manager owns what the apply sets.
            if path == format!("{WIDGETS}/contested") {
                if request.method == http::Method::GET {
                    let mut found = widget("contested", json!({}));
                    found["metadata"]["uid"] = json!("u-contested");
                    found["metadata"]["resourceVersion"] = json!("7");
                    return json_answer(200, &found);
                }
                let applied: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                crproxy_core::locks::lock(&applies).push(applied);
                let why = "Apply failed with 1 conflict: conflict with \"other\": .spec.size";
                return json_answer(409, &crproxy_core::status::status(409, "Conflict", why));
            }
            // Discovery, and every other path, as a backend without the object.
            if path != object {
                return failing_answer(path, 404, false);
            }
            // Only the first look finds the object: it is deleted right after.
            if request.method == http::Method::GET {
                return match looks.fetch_add(1, Ordering::SeqCst) {
                    0 => {
                        let mut found = widget("racing", json!({}));
                        found["metadata"]["uid"] = json!("u-racing");
                        found["metadata"]["resourceVersion"] = json!("5");
                        json_answer(200, &found)
                    }
                    _ => failing_answer(path, 404, false),
                };
            }
            let applied: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            let uid = applied["metadata"]["uid"].as_str().map(str::to_owned);
            crproxy_core::locks::lock(&applies).push(applied);
            match uid {
                Some(uid) => json_answer(
                    409,
                    &crproxy_core::status::conflict(
                        "widgets",
                        "example.com",
                        "racing",
                        &format!("uid mismatch: the provided object specified uid {uid}, and no existing object was found"),
                    ),
                ),
                // Unpinned, the apply of the deleted object would create it.
                None => json_answer(201, &widget("racing", json!({}))),
            }
        }
    }))
    .await;
    // w1 is on the devcluster, not on the backend.
    widgets_served_by(&h, &backend, ("w1", 404)).await;
    let before = looks.load(Ordering::SeqCst);

    let reply = applied_widget(&h, "racing").await;
    assert_eq!(reply.status, 403, "{}", reply.body);
    assert_eq!(
        reply.body["details"]["causes"][0]["reason"],
        "NamespaceTerminating"
    );
    assert_eq!(
        looks.load(Ordering::SeqCst) - before,
        2,
        "a look before each apply"
    );
    let sent = crproxy_core::locks::lock(&applies).clone();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["metadata"]["uid"], "u-racing");
    assert_eq!(sent[0]["spec"]["size"], 3);

    // A refusal whose object the next look finds unchanged is the apply's own:
    // answered as it came, not sent a second time.
    let reply = applied_widget(&h, "contested").await;
    assert_eq!(reply.status, 409, "{}", reply.body);
    let sent = crproxy_core::locks::lock(&applies).clone();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[1]["metadata"]["uid"], "u-contested");
    h.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_watches_than_one_http2_connection_allows_all_open() {
    // API servers cap the streams of one HTTP/2 connection (kube-apiserver's Go
    // server at 250 by default, hyper at 200): the proxy must spread 250 watches
    // over several connections instead of queueing the excess forever. devcluster
    // allows more, so the spreading is read from the proxy's dial count.
    const WATCHES: usize = 250;
    /// The lowest per-connection stream cap among the servers above.
    const SERVER_STREAM_CAP: usize = 200;
    let h = harness(AccessMode::Owned).await;
    let mut senders = Vec::new();
    for _ in 0..5 {
        // Separate caller connections, so the caller side is not the limit.
        senders.push(
            caller_h2::<http_body_util::Empty<Bytes>>(
                h.addr,
                &h.serving_ca_pem,
                &h.front_proxy_client,
            )
            .await,
        );
    }
    let mut opened = Vec::new();
    for i in 0..WATCHES {
        let mut sender = senders[i % senders.len()].clone();
        opened.push(tokio::spawn(async move {
            let request = aggregator_get(&format!("{WIDGETS}?watch=true&labelSelector=n%3D{i}"));
            let response =
                tokio::time::timeout(Duration::from_secs(20), sender.send_request(request)).await;
            match response {
                Ok(Ok(response)) if response.status() == 200 => Some(response),
                _ => None,
            }
        }));
    }
    let mut responses = Vec::new();
    for task in opened {
        responses.push(task.await.expect("task"));
    }
    let open = responses.iter().filter(|r| r.is_some()).count();
    assert_eq!(open, WATCHES, "every watch must get its response");
    assert!(series(&h.metrics, "vcluster_proxy_active_watches", " 250"));
    let needed = WATCHES.div_ceil(SERVER_STREAM_CAP) as u64;
    assert!(
        dials(&h.metrics) >= needed,
        "{WATCHES} watches need {needed} connections to the target, the proxy opened {}",
        dials(&h.metrics)
    );
    drop(responses);
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn subresources_follow_the_objects_ownership() {
    let h = harness(AccessMode::Owned).await;
    let created = call(
        &h.aggregator,
        "POST",
        WIDGETS,
        Some(widget("mine", json!({}))),
    )
    .await;
    assert_eq!(created.status, 201);
    create_on_target(&h, "foreign", json!({})).await;
    // The target serves /status as the object itself: the owned one is shown.
    let owned = call(
        &h.aggregator,
        "GET",
        &format!("{WIDGETS}/mine/status"),
        None,
    )
    .await;
    assert_eq!(owned.status, 200, "{}", owned.body);
    assert_eq!(owned.body["metadata"]["name"], "mine");
    let foreign = call(
        &h.aggregator,
        "GET",
        &format!("{WIDGETS}/foreign/status"),
        None,
    )
    .await;
    assert_eq!(foreign.status, 404);
    assert_eq!(
        foreign.body["message"],
        "widgets.example.com \"foreign\" not found"
    );
    h.proxy.shutdown().await;
}

/// The local discovery document, as the proxy serves it while the target cannot
/// answer discovery.
#[track_caller]
fn assert_fallback_document(reply: &Reply) {
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.body["kind"], "APIResourceList", "{}", reply.body);
    assert_eq!(reply.body["resources"][0]["name"], "widgets");
    assert_eq!(reply.body["resources"][0]["verbs"], json!(["get"]));
}

fn discovery_fallbacks(h: &Harness, reason: &str) -> f64 {
    metric_value(
        &h.metrics,
        "vcluster_proxy_discovery_fallbacks_total",
        &format!("reason=\"{reason}\""),
    )
}

/// A target that answers `/apis/<group>/<version>` with 401, 404 or a 5xx has no
/// document to pass on: the proxy serves its own and counts `upstream_error`.
#[tokio::test]
async fn discovery_answered_with_401_404_or_5xx_falls_back_as_upstream_error() {
    let h = harness(AccessMode::Owned).await;
    let backend = widgets_failing_with(&h, "any", 401).await;
    backend.fail_discovery();
    for (round, code) in [401, 404, 500, 503].into_iter().enumerate() {
        backend.answer(code);
        let reply = call(&h.aggregator, "GET", "/apis/example.com/v1", None).await;
        assert_fallback_document(&reply);
        let counted = h.metrics.encode();
        assert_eq!(
            discovery_fallbacks(&h, "upstream_error"),
            (round + 1) as f64,
            "{code}: {counted}"
        );
        // The caller got a 200, and the request's own series names the
        // fallback's reason, not the target's answer.
        assert_eq!(
            metric_value(
                &h.metrics,
                "vcluster_proxy_request_total",
                "verb=\"GET\",code=\"200\",reason=\"upstream_error\""
            ),
            (round + 1) as f64,
            "{code}: {counted}"
        );
    }
    h.proxy.shutdown().await;
}

/// Under explicit keys a discovery answer the proxy cannot cut down to the
/// enabled resources (a 200 that is not the JSON asked for) is not passed on: it
/// is the target's failure, and the caller gets the local document.
#[tokio::test]
async fn discovery_the_proxy_cannot_cut_down_falls_back_under_explicit_keys() {
    let h = harness(AccessMode::Owned).await;
    let backend = Backend::start(Arc::new(|request: &http::request::Parts, _: &[u8]| {
        let path = request.uri.path();
        let from_aggregator = request
            .headers
            .get("x-remote-user")
            .is_some_and(|u| u == "system:kube-aggregator");
        if path != "/apis/example.com/v1" || from_aggregator {
            return failing_answer(path, 404, false);
        }
        http::Response::builder()
            .status(200)
            .header(http::header::CONTENT_TYPE, "text/plain")
            .body(http_body_util::Full::new(Bytes::from_static(b"gadgets")))
            .expect("response")
    }))
    .await;
    widgets_served_by(&h, &backend, ("absent", 404)).await;
    let reply = call(&h.aggregator, "GET", "/apis/example.com/v1", None).await;
    assert_fallback_document(&reply);
    assert_eq!(reply.body["resources"].as_array().map(Vec::len), Some(1));
    assert_eq!(discovery_fallbacks(&h, "upstream_error"), 1.0);
    h.proxy.shutdown().await;
}

/// When the peer check fails before any dial, the fallback is counted under the
/// check's own reason: an empty list (`no_peer`), every peer quarantined
/// (`all_quarantined`), a list older than the staleness tolerance after the
/// subscription dropped (`stale_peers`). The pool is driven directly: the static
/// source published once at start and never again.
#[tokio::test]
async fn discovery_fallbacks_count_the_peer_check_that_failed() {
    let h = harness(AccessMode::Owned).await;
    let pool = Arc::clone(&h.proxy.pools[0]);
    let discovery = || call(&h.aggregator, "GET", "/apis/example.com/v1", None);
    // The static source's one publication first, so it cannot undo the lists below.
    assert!(pool.wait_for_first_list(Duration::from_secs(10)).await);

    pool.publish(Vec::new());
    assert_fallback_document(&discovery().await);
    assert_eq!(discovery_fallbacks(&h, "no_peer"), 1.0);

    // A refusing peer: each dial fails (upstream_error) until it is quarantined.
    let refused = test_support::RefusedPort::bind();
    let dead = refused.addr.to_string();
    pool.publish(vec![dead]);
    for _ in 0..10 {
        assert_fallback_document(&discovery().await);
        if discovery_fallbacks(&h, "all_quarantined") > 0.0 {
            break;
        }
    }
    let counted = h.metrics.encode();
    assert_eq!(discovery_fallbacks(&h, "all_quarantined"), 1.0, "{counted}");
    assert_eq!(discovery_fallbacks(&h, "upstream_error"), 3.0, "{counted}");

    // The real target again, then the subscription drops and the staleness
    // tolerance passes. The clock is moved, not waited for; real sockets keep
    // running on real time around the jump.
    pool.publish(vec![h.target.cluster.addr().to_string()]);
    let served = discovery().await;
    assert_ne!(
        served.body["resources"][0]["verbs"],
        json!(["get"]),
        "the target's"
    );
    pool.subscription_dropped();
    tokio::time::pause();
    tokio::time::advance(crproxy_proxy::pool::STALENESS_TOLERANCE + Duration::from_secs(1)).await;
    tokio::time::resume();
    assert_fallback_document(&discovery().await);
    let counted = h.metrics.encode();
    assert_eq!(discovery_fallbacks(&h, "stale_peers"), 1.0, "{counted}");
    for reason in ["no_peer", "all_quarantined", "stale_peers"] {
        assert!(
            series(
                &h.metrics,
                "vcluster_proxy_request_total",
                &format!("reason=\"{reason}\"")
            ),
            "{reason}: {counted}"
        );
    }
    h.proxy.shutdown().await;
}

/// `GET /apis` for aggregated discovery, as the client's aggregator asks for it.
async fn aggregated_discovery(h: &Harness) -> Reply {
    let request = http::Request::get("/apis")
        .header("x-remote-user", "system:kube-aggregator")
        .header("x-remote-group", "system:masters")
        .header("accept", AGGREGATED_DISCOVERY)
        .body(Bytes::new())
        .expect("request");
    exchange(&h.aggregator, request).await
}

fn fallbacks(h: &Harness) -> bool {
    series(
        &h.metrics,
        "vcluster_proxy_discovery_fallbacks_total",
        "reason=\"upstream_error\"",
    )
}

#[tokio::test]
async fn aggregated_discovery_falls_back_when_the_target_cannot_answer() {
    let h = harness(AccessMode::Owned).await;
    // While the target answers, its own entry for the group is passed on.
    let served = aggregated_discovery(&h).await;
    assert_eq!(served.status, 200, "{}", served.body);
    assert_eq!(served.body["items"][0]["metadata"]["name"], "example.com");
    let resource = &served.body["items"][0]["versions"][0]["resources"][0];
    assert_eq!(resource["resource"], "widgets");
    assert_ne!(resource["verbs"], json!(["get"]), "the target's verbs");
    assert!(!fallbacks(&h));

    // The target goes away: the proxy answers from its local document.
    h.target
        .cluster
        .stop_listener(h.target.cluster.addr())
        .expect("stop the target");
    let fallback = aggregated_discovery(&h).await;
    assert_eq!(fallback.status, 200);
    let content_type = fallback.headers["content-type"].to_str().expect("ascii");
    assert!(
        content_type.contains("as=APIGroupDiscoveryList"),
        "{content_type}"
    );
    let doc = &fallback.body;
    assert_eq!(doc["kind"], "APIGroupDiscoveryList");
    assert_eq!(doc["items"][0]["metadata"]["name"], "example.com");
    let resource = &doc["items"][0]["versions"][0]["resources"][0];
    assert_eq!(resource["resource"], "widgets");
    assert_eq!(resource["verbs"], json!(["get"]));
    assert!(fallbacks(&h), "counted as a fallback");
    // Plain /apis is the client API server's own business.
    let plain = call(&h.aggregator, "GET", "/apis", None).await;
    assert_eq!(plain.status, 404);
    h.proxy.shutdown().await;
}

/// A target without aggregated discovery (kube before 1.26) answers the
/// aggregator's `GET /apis` with 406. That is no outage: the proxy answers 406 too,
/// counts no fallback, and the aggregator reads the group/version's legacy
/// document, which the target serves in full.
#[tokio::test]
async fn a_target_without_aggregated_discovery_sends_the_aggregator_to_the_legacy_document() {
    let h = harness(AccessMode::Owned).await;
    h.target.cluster.stop_aggregated_discovery();
    let aggregated = aggregated_discovery(&h).await;
    assert_eq!(aggregated.status, 406, "{}", aggregated.body);
    assert_eq!(aggregated.body["reason"], "NotAcceptable");
    assert!(!fallbacks(&h), "no fallback was served");
    let legacy = call(&h.aggregator, "GET", "/apis/example.com/v1", None).await;
    assert_eq!(legacy.status, 200, "{}", legacy.body);
    assert_eq!(legacy.body["resources"][0]["name"], "widgets");
    assert_ne!(
        legacy.body["resources"][0]["verbs"],
        json!(["get"]),
        "the target's verbs"
    );
    assert!(!fallbacks(&h));
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn a_peer_list_that_never_arrives_is_logged_and_requests_fail_with_no_peer() {
    let (logs, _guard) = LogBuffer::capture();
    let h = harness_with(Options {
        // A peer source that never publishes (a missing file).
        peers: Box::new(|_| PeerSourceConfig::File("/nonexistent/crproxy-peers.yaml".into())),
        startup_sync_timeout: Duration::from_millis(200),
        wait_for_peers: false,
        ..Options::default()
    })
    .await;
    let list = call(&h.aggregator, "GET", WIDGETS, None).await;
    assert_eq!(list.status, 503);
    assert!(series(
        &h.metrics,
        "vcluster_proxy_request_total",
        "reason=\"no_peer\""
    ));
    assert!(series(&h.metrics, "vcluster_proxy_peer_cache_synced", " 0"));
    let mut logged = String::new();
    for _ in 0..50 {
        logged = logs.text();
        if logged.contains("peer cache did not sync in time for the startup probe") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        logged.contains("peer cache did not sync in time for the startup probe"),
        "{logged}"
    );
    // "Starting proxy server" and friends are checked on the real binary's output
    // (tests/integration/run_command.rs in the crproxy crate).
    h.proxy.shutdown().await;
}

/// A caller that opens no window gets the answer's head but never a body byte;
/// the answer is whole in the proxy's hands all the same, so the request must end
/// (leave the in-flight gauge, be measured) instead of holding its place under
/// the in-flight limit for as long as the caller keeps its connection. Both ways a
/// target frames a whole answer: with a Content-Length (a small object), and
/// chunked (an object over Go's 2 KiB buffer, as kube-apiserver and devcluster
/// send it), whose end hyper would ask for only once the caller had room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_without_a_window_does_not_keep_its_place() {
    let h = harness(AccessMode::All).await;
    let mut large = widget("stuck-large", json!({}));
    large["spec"]["note"] = json!("x".repeat(4096));
    h.widgets
        .create(&PostParams::default(), &widget_object("stuck", json!({})))
        .await
        .expect("created on the target");
    h.widgets
        .create(
            &PostParams::default(),
            &serde_json::from_value(large).expect("widget"),
        )
        .await
        .expect("created on the target");
    let mut sender = caller_h2_with_window::<http_body_util::Empty<Bytes>>(
        h.addr,
        &h.serving_ca_pem,
        &h.front_proxy_client,
        0,
    )
    .await;
    let mut unsent = Vec::new();
    for (requests, name) in [(1.0, "stuck"), (2.0, "stuck-large")] {
        let request = aggregator_get(&format!("{WIDGETS}/{name}"));
        let response = tokio::time::timeout(Duration::from_secs(20), sender.send_request(request))
            .await
            .expect("the head in time")
            .expect("response");
        assert_eq!(response.status(), 200, "{name}");
        // Bounded: 10 s.
        let (mut inflight, mut measured) = (f64::NAN, f64::NAN);
        for _ in 0..100 {
            inflight = metric_value(&h.metrics, "vcluster_proxy_inflight_requests", "target=");
            measured = metric_value(
                &h.metrics,
                "vcluster_proxy_request_duration_seconds_count",
                "verb=\"GET\"",
            );
            if inflight == 0.0 && measured == requests {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            inflight == 0.0 && measured == requests,
            "{name}, with the body unsent: in flight {inflight}, GET durations observed {measured}"
        );
        unsent.push(response);
    }
    drop(unsent);
    h.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_in_flight_limit_callers_get_429_with_retry_after() {
    use crproxy_proxy::handler::MAX_IN_FLIGHT;
    let h = harness(AccessMode::Owned).await;
    type HeldBody = http_body_util::StreamBody<
        tokio_stream::wrappers::ReceiverStream<Result<hyper::body::Frame<Bytes>, std::io::Error>>,
    >;
    let mut sender = caller_h2::<HeldBody>(h.addr, &h.serving_ca_pem, &h.front_proxy_client).await;
    // Requests whose bodies never finish keep their places taken (a few more than
    // the limit, so the places stay full even if one of them ends early).
    let mut open_bodies = Vec::new();
    let mut pending = Vec::new();
    for i in 0..MAX_IN_FLIGHT + 10 {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(Ok(hyper::body::Frame::data(Bytes::from_static(b"{"))))
            .await
            .expect("first frame");
        open_bodies.push(tx);
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("https://localhost{WIDGETS}"))
            .header("x-remote-user", "alice")
            .header("content-type", "application/json")
            .body(http_body_util::StreamBody::new(
                tokio_stream::wrappers::ReceiverStream::new(rx),
            ))
            .expect("request");
        sender.ready().await.expect("ready");
        pending.push(tokio::spawn(sender.send_request(request)));
        if i % 50 == 0 {
            tokio::task::yield_now().await;
        }
    }
    // The requests past the limit are answered at once, while the others wait for
    // their bodies (bounded: 10 s).
    let mut refused = Vec::new();
    for _ in 0..200 {
        if pending.iter().filter(|p| p.is_finished()).count() >= 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (done, waiting): (Vec<_>, Vec<_>) = pending.into_iter().partition(|p| p.is_finished());
    for request in done {
        let response = request.await.expect("task").expect("response");
        let status = response.status();
        let retry_after = response.headers().get("retry-after").cloned();
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .expect("body")
            .to_bytes();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        refused.push((status.as_u16(), retry_after, body["reason"].clone()));
    }
    assert!(refused.len() >= 10, "past the limit: {refused:?}");
    for (status, retry_after, reason) in &refused {
        assert_eq!(*status, 429);
        assert_eq!(retry_after.as_ref().map(|v| v.as_bytes()), Some(&b"1"[..]));
        assert_eq!(reason, "TooManyRequests");
    }
    let pending = waiting;
    // Strangers take no place under the limit: they are told who they are not.
    let stranger = call(&h.stranger, "GET", WIDGETS, None).await;
    assert_eq!(stranger.status, 401, "{}", stranger.body);
    // Finishing the held requests frees the places.
    drop(open_bodies);
    for request in pending {
        let _ = request.await;
    }
    let reply = call(&h.aggregator, "GET", WIDGETS, None).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn a_connection_that_never_starts_tls_is_closed() {
    use tokio::io::AsyncReadExt;
    let h = harness(AccessMode::Owned).await;
    let mut tcp = tokio::net::TcpStream::connect(h.addr)
        .await
        .expect("connect");
    // Bounded: twice the handshake timeout.
    let limit = crproxy_proxy::server::TLS_HANDSHAKE_TIMEOUT * 2;
    let mut buffer = [0u8; 16];
    let read = tokio::time::timeout(limit, tcp.read(&mut buffer)).await;
    match read {
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("the proxy sent {n} bytes to a silent caller"),
        Err(_) => panic!("the connection was still open after {limit:?}"),
    }
    // The replica keeps serving.
    let reply = call(&h.aggregator, "GET", WIDGETS, None).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    h.proxy.shutdown().await;
}

/// Hands `example.com/v1` on the target to an extension API server behind the
/// Service `default/widgets-backend` on `port`, as its APIService.
async fn hand_widgets_to_backend(h: &Harness, port: u16) {
    let apiservice: APIService = serde_json::from_value(json!({
        "metadata": {"name": "v1.example.com"},
        "spec": {
            "group": "example.com", "version": "v1",
            "service": {"namespace": "default", "name": "widgets-backend", "port": port},
            "insecureSkipTLSVerify": true,
            "groupPriorityMinimum": 1000, "versionPriority": 15
        }
    }))
    .expect("apiservice");
    Api::all(h.admin.clone())
        .create(&PostParams::default(), &apiservice)
        .await
        .expect("apiservice created");
}

/// The code `probe` gets from the target once it is `want`, or the last one after
/// 10 s (100 probes, 100 ms apart).
async fn target_answers<F, Fut>(want: u16, probe: F) -> u16
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = u16>,
{
    let mut code = 0;
    for _ in 0..100 {
        code = probe().await;
        if code == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    code
}

/// A shutdown lets requests finish for the grace period, then closes what is
/// still open: a watch streaming through the proxy ends with the grace period
/// instead of outliving the proxy that served it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_watches_still_open_after_the_grace_period() {
    use http_body_util::BodyExt;
    let h = harness(AccessMode::Owned).await;
    let mut sender =
        caller_h2::<http_body_util::Empty<Bytes>>(h.addr, &h.serving_ca_pem, &h.front_proxy_client)
            .await;
    let request = aggregator_get(&format!("{WIDGETS}?watch=true"));
    let response = tokio::time::timeout(Duration::from_secs(20), sender.send_request(request))
        .await
        .expect("watch answered within 20 s")
        .expect("watch response");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let started = tokio::time::Instant::now();
    h.proxy.shutdown().await;
    let grace = crproxy_proxy::server::SHUTDOWN_GRACE;
    assert!(
        started.elapsed() >= grace,
        "shutdown returned before the grace period"
    );
    // The stream ends (or fails) soon after; before, it went on until the target
    // ended the watch. Bounded: at most 100 frames, and 10 s.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        for _ in 0..100 {
            match body.frame().await {
                None | Some(Err(_)) => return true,
                Some(Ok(_)) => {}
            }
        }
        false
    })
    .await;
    assert_eq!(ended, Ok(true), "the watch outlived the proxy's shutdown");
}

/// A DELETE gives its room under the parse memory budget back once its options
/// are read, before any round trip to the target. It once kept the room until
/// it was answered: options costly enough to take the whole budget (3 MiB of
/// line breaks), waiting on a target that had stopped answering, held every
/// other write that reads a body for up to the 60 s request deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_waiting_on_the_target_leaves_the_parse_budget_to_other_writes() {
    let relay = Relay::unconnected().await;
    let h = harness_behind(&relay, AccessMode::Owned).await;
    let object = format!("{WIDGETS}/roomy");
    // Created through the proxy, so that it has seen the namespace on the target
    // and the patch below needs no round trip to the frozen target.
    let created = call(
        &h.aggregator,
        "POST",
        WIDGETS,
        Some(widget("roomy", json!({}))),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);

    let mut options = String::from(r#"{"kind":"DeleteOptions","apiVersion":"v1"}"#);
    options.push_str(&"\n".repeat(3 * 1024 * 1024 - 1024));
    assert!(
        crproxy_core::request_body::parse_cost(options.as_bytes())
            >= crproxy_proxy::handler::PARSE_MEMORY_BUDGET,
        "the options take the whole budget"
    );
    relay.freeze();
    let aggregator = h.aggregator.clone();
    let delete_path = object.clone();
    let delete = tokio::spawn(async move {
        send_as(
            &aggregator,
            "DELETE",
            &delete_path,
            Some("application/json"),
            Bytes::from(options),
        )
        .await
    });
    // Debug builds read 3 MiB in well under a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !delete.is_finished(),
        "the DELETE waits on the frozen target"
    );

    // A merge patch that is not an object is refused once read, without a
    // round trip; reading it needs room under the budget.
    let patch = tokio::time::timeout(
        Duration::from_secs(15),
        send_as(
            &h.aggregator,
            "PATCH",
            &object,
            Some("application/merge-patch+json"),
            Bytes::from_static(b"[1]"),
        ),
    )
    .await
    .expect("the patch is read and answered while the DELETE waits");
    assert!(
        (400..500).contains(&patch.status),
        "refused as a bad body: {} {}",
        patch.status,
        patch.body
    );
    delete.abort();
    relay.thaw();
    h.proxy.shutdown().await;
}
