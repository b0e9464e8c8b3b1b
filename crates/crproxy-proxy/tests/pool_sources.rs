//! Peer sources publishing into pools: static, file, DNS and EndpointSlices (over a
//! scripted feed, so the test decides when the watch drops).

mod pool_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crproxy_core::reason::Reason;
use crproxy_kube::{Error as KubeError, WatchEvent};
use crproxy_proxy::pool::{PeerPool, STALENESS_TOLERANCE};
use crproxy_proxy::sources::{self, PeerSourceConfig, WatchFeed, FILE_POLL_INTERVAL};
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use pool_support::*;
use serde_json::{json, Value};
use tokio::sync::mpsc;

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

// ---- EndpointSlices over a scripted feed -------------------------------------------

type Events = mpsc::UnboundedSender<Result<WatchEvent, KubeError>>;
type EventStream = mpsc::UnboundedReceiver<Result<WatchEvent, KubeError>>;

/// A feed whose list answers and watch streams the test hands out one by one.
#[derive(Clone, Default)]
struct ScriptedFeed {
    lists: Arc<Mutex<Vec<Result<Value, KubeError>>>>,
    watches: Arc<Mutex<Vec<EventStream>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl ScriptedFeed {
    fn push_list(&self, list: Result<Value, KubeError>) {
        self.lists.lock().expect("lock").push(list);
    }

    fn push_watch(&self) -> Events {
        let (tx, rx) = mpsc::unbounded_channel();
        self.watches.lock().expect("lock").push(rx);
        tx
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("lock").clone()
    }
}

impl WatchFeed for ScriptedFeed {
    fn list<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Value, KubeError>> {
        self.requests
            .lock()
            .expect("lock")
            .push(format!("LIST {path}"));
        let next = {
            let mut lists = self.lists.lock().expect("lock");
            (!lists.is_empty()).then(|| lists.remove(0))
        };
        Box::pin(async move {
            next.unwrap_or_else(|| Err(KubeError::Transport("no scripted list".into())))
        })
    }

    fn watch<'a>(
        &'a self,
        path: &'a str,
    ) -> BoxFuture<'a, Result<BoxStream<'static, Result<WatchEvent, KubeError>>, KubeError>> {
        self.requests
            .lock()
            .expect("lock")
            .push(format!("WATCH {path}"));
        let next = {
            let mut watches = self.watches.lock().expect("lock");
            (!watches.is_empty()).then(|| watches.remove(0))
        };
        Box::pin(async move {
            match next {
                Some(rx) => Ok(tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed()),
                None => Err(KubeError::Transport("no scripted watch".into())),
            }
        })
    }
}

fn slice(name: &str, service: &str, endpoints: &[(&str, Option<bool>)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, ready)| match ready {
            Some(r) => json!({"addresses": [ip], "conditions": {"ready": r}}),
            None => json!({"addresses": [ip]}),
        })
        .collect();
    json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": 9090}, {"name": "https", "port": 6443}],
        "endpoints": endpoints,
    })
}

fn list(rv: &str, items: Vec<Value>) -> Value {
    json!({"kind": "EndpointSliceList", "metadata": {"resourceVersion": rv}, "items": items})
}

fn event(kind: &str, object: Value) -> Result<WatchEvent, KubeError> {
    Ok(WatchEvent {
        event_type: kind.to_owned(),
        object,
    })
}

#[tokio::test(start_paused = true)]
async fn endpoint_slices_are_listed_watched_and_relisted() {
    let h = Harness::new();
    let pools = two_pools(&h);
    let feed = ScriptedFeed::default();
    feed.push_list(Ok(list(
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
    )));
    let events = feed.push_watch();
    let task = sources::spawn_endpoint_slices(
        feed.clone(),
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
    let requests = feed.requests();
    assert_eq!(
        requests[0],
        "LIST /apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dkube"
    );
    assert!(
        requests[1].starts_with("WATCH /apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dkube&watch=true")
            && requests[1].ends_with("&resourceVersion=10"),
        "{requests:?}"
    );

    // The not-ready endpoint becomes ready; a slice goes away.
    events
        .send(event(
            "MODIFIED",
            slice(
                "kube-a",
                "kube",
                &[("10.0.0.1", Some(true)), ("10.0.0.2", Some(true))],
            ),
        ))
        .expect("send");
    events
        .send(event("DELETED", slice("kube-b", "kube", &[])))
        .expect("send");
    events
        .send(event("BOOKMARK", json!({"metadata": {"name": ""}})))
        .expect("send");
    settle().await;
    for pool in &pools {
        assert_eq!(pool.hosts(), ["10.0.0.1:6443", "10.0.0.2:6443"]);
    }

    // The watch breaks and re-listing fails for a while: the list is kept, then
    // goes stale 60 s after the break.
    drop(events);
    feed.push_list(Err(KubeError::Transport("connection refused".into())));
    settle().await;
    tokio::time::sleep(STALENESS_TOLERANCE - Duration::from_secs(1)).await;
    assert!(h.pool.snapshot().synced);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for pool in &pools {
        assert!(!pool.snapshot().synced);
        assert_eq!(pool.hosts(), ["10.0.0.1:6443", "10.0.0.2:6443"]);
    }

    // The API comes back: re-list with backoff, publish, watch again.
    feed.push_list(Ok(list(
        "20",
        vec![slice("kube-c", "kube", &[("10.0.0.5", None)])],
    )));
    let _events = feed.push_watch();
    tokio::time::sleep(Duration::from_secs(31)).await;
    settle().await;
    for pool in &pools {
        assert!(pool.snapshot().synced);
        assert_eq!(pool.hosts(), ["10.0.0.5:6443"]);
    }
    assert!(
        feed.requests()
            .last()
            .is_some_and(|r| r.ends_with("&resourceVersion=20")),
        "{:?}",
        feed.requests()
    );
    task.abort();
}
