//! Peer sources publishing into pools: static, file, DNS and EndpointSlices (over a
//! scripted API server, so the test decides when the watch drops).

use crate::pool_support;
// Shared with the crate's unit tests, which use all of it.
#[allow(dead_code)]
#[path = "../../src/scripted_api.rs"]
mod scripted_api;

use std::sync::Arc;
use std::time::Duration;

use crproxy_core::reason::Reason;
use crproxy_proxy::pool::{PeerPool, STALENESS_TOLERANCE};
use crproxy_proxy::sources::{self, PeerSourceConfig, FILE_POLL_INTERVAL};
use crproxy_proxy::watches::{WatchClient, WATCH_IDLE_LIMIT, WATCH_TIMEOUT_SECONDS};
use pool_support::*;
use scripted_api::ScriptedApi;
use serde_json::{json, Value};

/// Two pools of one target, as two group/version proxies would have.
fn two_pools(h: &Harness) -> Vec<Arc<PeerPool>> {
    let other = PeerPool::new(
        "other.example.com/v1".to_owned(),
        h.pki.dialer(),
        h.target.clone(),
    );
    vec![h.pool.clone(), other]
}

/// Lets spawned source tasks run without moving paused time.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_static_list_is_published_to_every_pool() {
    let h = Harness::new();
    let pools = two_pools(&h);
    let task = sources::spawn(
        PeerSourceConfig::Static(vec!["10.0.0.2:443".into(), "10.0.0.1:443".into()]),
        pools.clone(),
    );
    task.await.expect("static source ends after publishing");
    for pool in &pools {
        assert_eq!(pool.hosts(), ["10.0.0.1:443", "10.0.0.2:443"]);
        assert!(pool.snapshot().synced);
    }
}

#[tokio::test(start_paused = true)]
async fn a_peer_file_is_followed_and_a_broken_one_goes_stale() {
    let h = Harness::new();
    let pools = two_pools(&h);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("peers.yaml");
    std::fs::write(&path, "- 10.0.0.1:443\n").expect("write");
    let task = sources::spawn(PeerSourceConfig::File(path.clone()), pools.clone());
    assert!(h.pool.wait_for_first_list(Duration::from_secs(5)).await);
    assert_eq!(h.pool.hosts(), ["10.0.0.1:443"]);

    std::fs::write(&path, r#"["10.0.0.1:443", "10.0.0.3:443"]"#).expect("write");
    tokio::time::sleep(FILE_POLL_INTERVAL * 2).await;
    for pool in &pools {
        assert_eq!(pool.hosts(), ["10.0.0.1:443", "10.0.0.3:443"]);
    }

    // Broken: the last list stays in use until the staleness tolerance runs out.
    std::fs::write(&path, "- not a peer\n").expect("write");
    tokio::time::sleep(FILE_POLL_INTERVAL * 2).await;
    assert_eq!(h.pool.hosts(), ["10.0.0.1:443", "10.0.0.3:443"]);
    assert!(h.pool.snapshot().synced);
    tokio::time::sleep(STALENESS_TOLERANCE).await;
    assert!(!h.pool.snapshot().synced);
    assert_eq!(
        h.pool.acquire().await.expect_err("stale").reason(),
        Reason::StalePeers
    );

    // Missing counts as broken too; once it is back, it is published again even
    // though the content equals the last good list.
    std::fs::remove_file(&path).expect("remove");
    tokio::time::sleep(FILE_POLL_INTERVAL * 2).await;
    std::fs::write(&path, r#"["10.0.0.1:443", "10.0.0.3:443"]"#).expect("write");
    tokio::time::sleep(FILE_POLL_INTERVAL * 2).await;
    for pool in &pools {
        assert!(pool.snapshot().synced);
    }
    task.abort();
}

#[tokio::test]
async fn dns_names_resolve_to_peers() {
    let h = Harness::new();
    let task = sources::spawn(
        PeerSourceConfig::Dns {
            name: "localhost".into(),
            port: 6443,
            interval: Duration::from_secs(30),
        },
        vec![h.pool.clone()],
    );
    assert!(h.pool.wait_for_first_list(Duration::from_secs(10)).await);
    assert!(
        h.pool.hosts().contains(&"127.0.0.1:6443".to_owned()),
        "{:?}",
        h.pool.hosts()
    );
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_failing_dns_lookup_drops_the_subscription() {
    let h = Harness::new();
    h.pool.publish(vec!["10.0.0.1:443".into()]);
    let task = sources::spawn(
        PeerSourceConfig::Dns {
            name: "peers.does-not-exist.invalid".into(),
            port: 443,
            interval: Duration::from_secs(5),
        },
        vec![h.pool.clone()],
    );
    settle().await;
    tokio::time::sleep(STALENESS_TOLERANCE + Duration::from_secs(10)).await;
    assert!(
        !h.pool.snapshot().synced,
        "the failed lookups started the staleness clock"
    );
    assert_eq!(h.pool.hosts(), ["10.0.0.1:443"], "the last list is kept");
    task.abort();
}

// ---- EndpointSlices over a scripted API server -------------------------------------

fn slice(name: &str, service: &str, endpoints: &[(&str, Option<bool>)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, ready)| match ready {
            Some(r) => json!({"addresses": [ip], "conditions": {"ready": r}}),
            None => json!({"addresses": [ip]}),
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "resourceVersion": "2", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": 9090}, {"name": "https", "port": 6443}],
        "endpoints": endpoints,
    })
}

fn list(rv: &str, items: Vec<Value>) -> Value {
    json!({"kind": "EndpointSliceList", "metadata": {"resourceVersion": rv}, "items": items})
}

fn event(kind: &str, rv: &str, mut object: Value) -> Value {
    object["metadata"]["resourceVersion"] = json!(rv);
    json!({"type": kind, "object": object})
}

#[tokio::test(start_paused = true)]
async fn endpoint_slices_are_listed_watched_and_relisted() {
    let h = Harness::new();
    let pools = two_pools(&h);
    let api = ScriptedApi::default();
    let events = api.push(list(
        "10",
        vec![
            slice(
                "kube-a",
                "kube",
                &[("10.0.0.1", Some(true)), ("10.0.0.2", Some(false))],
            ),
            slice("kube-b", "kube", &[("10.0.0.3", None)]),
            slice("other", "other-service", &[("10.9.9.9", None)]),
        ],
    ));
    let task = sources::spawn_endpoint_slices(
        WatchClient::from_client(api.client(WATCH_IDLE_LIMIT), WATCH_TIMEOUT_SECONDS),
        "kube-system".into(),
        "kube".into(),
        Some("https".into()),
        pools.clone(),
    );
    assert!(h.pool.wait_for_first_list(Duration::from_secs(1)).await);
    settle().await;
    for pool in &pools {
        assert_eq!(pool.hosts(), ["10.0.0.1:6443", "10.0.0.3:6443"]);
    }
    let requests = api.requests();
    let selector = "labelSelector=kubernetes.io%2Fservice-name%3Dkube";
    assert!(
        requests[0]
            .starts_with("LIST /apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices?")
            && requests[0].contains(selector),
        "{requests:?}"
    );
    assert!(
        requests[1]
            .starts_with("WATCH /apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices?")
            && requests[1].contains(selector)
            && requests[1].contains("resourceVersion=10"),
        "{requests:?}"
    );

    // The not-ready endpoint becomes ready; a slice goes away.
    events
        .send(event(
            "MODIFIED",
            "11",
            slice(
                "kube-a",
                "kube",
                &[("10.0.0.1", Some(true)), ("10.0.0.2", Some(true))],
            ),
        ))
        .expect("send");
    events
        .send(event("DELETED", "12", slice("kube-b", "kube", &[])))
        .expect("send");
    events
        .send(json!({"type": "BOOKMARK", "object": {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"resourceVersion": "13"}}}))
        .expect("send");
    settle().await;
    for pool in &pools {
        assert_eq!(pool.hosts(), ["10.0.0.1:6443", "10.0.0.2:6443"]);
    }

    // The watch breaks and the API server is gone for a while: the list is kept,
    // then goes stale 60 s after the break.
    drop(events);
    settle().await;
    tokio::time::sleep(STALENESS_TOLERANCE - Duration::from_secs(1)).await;
    assert!(h.pool.snapshot().synced);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for pool in &pools {
        assert!(!pool.snapshot().synced);
        assert_eq!(pool.hosts(), ["10.0.0.1:6443", "10.0.0.2:6443"]);
    }

    // The API comes back: re-list with backoff, publish, watch again.
    let _events = api.push(list(
        "20",
        vec![slice("kube-c", "kube", &[("10.0.0.5", None)])],
    ));
    tokio::time::sleep(Duration::from_secs(61)).await;
    settle().await;
    for pool in &pools {
        assert!(pool.snapshot().synced);
        assert_eq!(pool.hosts(), ["10.0.0.5:6443"]);
    }
    let requests = api.requests();
    assert!(
        requests
            .last()
            .is_some_and(|r| r.starts_with("WATCH ") && r.contains("resourceVersion=20")),
        "{requests:?}"
    );
    // The watch that broke was resumed from the bookmark before anything was
    // listed again.
    assert!(
        requests[2].starts_with("WATCH ") && requests[2].contains("resourceVersion=13"),
        "{requests:?}"
    );
    task.abort();
}
