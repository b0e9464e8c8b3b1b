//! The EndpointSlice source through the real watch client (kube-rs over crproxy-kube's
//! connector and credentials), against a small
//! HTTPS stand-in for the API server that serves one EndpointSlice list and scripted
//! watch streams. Real time: the client's own timers do not mix with paused time.

use crate::pool_support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use pool_support::*;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

type WatchFeed = mpsc::UnboundedSender<Value>;
type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

#[derive(Default)]
struct ApiState {
    slices: Vec<Value>,
    watches: Vec<mpsc::UnboundedReceiver<Value>>,
    requests: Vec<String>,
}

struct FakeApi {
    state: Arc<Mutex<ApiState>>,
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeApi {
    async fn start(pki: &Pki) -> FakeApi {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config(&[b"http/1.1"]));
        let state = Arc::new(Mutex::new(ApiState::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            // Bounded by the abort in Drop.
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let state = shared.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(answer(&state, &req)) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        FakeApi { state, port, task }
    }

    fn set_slices(&self, slices: Vec<Value>) {
        self.state.lock().expect("lock").slices = slices;
    }

    fn push_watch(&self) -> WatchFeed {
        let (tx, rx) = mpsc::unbounded_channel();
        self.state.lock().expect("lock").watches.push(rx);
        tx
    }

    fn requests(&self) -> Vec<String> {
        self.state.lock().expect("lock").requests.clone()
    }

    fn client(&self, pki: &Pki, dir: &std::path::Path) -> crproxy_proxy::watches::WatchClient {
        std::fs::write(dir.join("token"), "test-token").expect("token");
        std::fs::write(dir.join("ca.crt"), &pki.ca.pem().cert).expect("ca");
        let config = crproxy_kube::ClusterConfig::in_cluster_from(
            Some("127.0.0.1"),
            Some(&self.port.to_string()),
            dir,
        )
        .expect("cluster config");
        let access = crproxy_kube::ClusterAccess::new(config).expect("credentials");
        crproxy_proxy::watches::WatchClient::new(&access).expect("client")
    }
}

fn answer(
    state: &Mutex<ApiState>,
    req: &hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Body> {
    let path = req
        .uri()
        .path_and_query()
        .map(|pq| pq.as_str().to_owned())
        .unwrap_or_default();
    let mut st = state.lock().expect("lock");
    st.requests.push(path.clone());
    if req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        != Some("Bearer test-token")
    {
        return respond(401, json!({"kind": "Status", "code": 401}));
    }
    if path.contains("watch=true") {
        let Some(rx) = (!st.watches.is_empty()).then(|| st.watches.remove(0)) else {
            return respond(503, json!({"kind": "Status", "code": 503}));
        };
        let lines = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        let frames = futures_util::StreamExt::map(lines, |event: Value| {
            Ok::<_, Infallible>(Frame::data(Bytes::from(format!("{event}\n"))))
        });
        return hyper::Response::new(BodyExt::boxed(StreamBody::new(frames)));
    }
    let list = json!({
        "kind": "EndpointSliceList",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"resourceVersion": format!("{}", st.requests.len())},
        "items": st.slices,
    });
    respond(200, list)
}

fn respond(code: u16, body: Value) -> hyper::Response<Body> {
    let mut resp = hyper::Response::new(BodyExt::boxed(Full::new(Bytes::from(body.to_string()))));
    *resp.status_mut() = http::StatusCode::from_u16(code).expect("status");
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// The value of query parameter `name` in `request`.
fn param<'a>(request: &'a str, name: &str) -> Option<&'a str> {
    let (_, query) = request.split_once('?')?;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
}

fn slice(name: &str, ips: &[&str]) -> Value {
    let endpoints: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}}))
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "kube-system", "resourceVersion": "1",
                     "labels": {"kubernetes.io/service-name": "kube"}},
        "addressType": "IPv4",
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
        "endpoints": endpoints,
    })
}

/// Polls `check` every 20 ms for at most 5 s.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..250 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn endpoint_slices_through_the_kube_client() {
    let h = Harness::new();
    let api = FakeApi::start(&h.pki).await;
    let dir = tempfile::tempdir().expect("tempdir");
    api.set_slices(vec![slice("kube-1", &["10.0.0.1", "10.0.0.2"])]);
    let events = api.push_watch();
    let task = crproxy_proxy::sources::spawn(
        crproxy_proxy::sources::PeerSourceConfig::EndpointSlices {
            client: api.client(&h.pki, dir.path()),
            namespace: "kube-system".into(),
            service: "kube".into(),
            port_name: Some("https".into()),
        },
        vec![h.pool.clone()],
    );

    assert!(h.pool.wait_for_first_list(Duration::from_secs(5)).await);
    assert_eq!(h.pool.hosts(), ["10.0.0.1:6443", "10.0.0.2:6443"]);

    // A watch event moves the list.
    let mut modified = slice("kube-1", &["10.0.0.3"]);
    modified["metadata"]["resourceVersion"] = json!("7");
    events
        .send(json!({"type": "MODIFIED", "object": modified}))
        .expect("send");
    eventually("the MODIFIED event", || h.pool.hosts() == ["10.0.0.3:6443"]).await;

    // The watch ends (the server's timeoutSeconds): the source resumes from the
    // last resourceVersion it saw, without listing again.
    let next = api.push_watch();
    drop(events);
    let mut added = slice("kube-2", &["10.0.0.5"]);
    added["metadata"]["resourceVersion"] = json!("8");
    next.send(json!({"type": "ADDED", "object": added}))
        .expect("send");
    eventually("the resumed watch", || {
        h.pool.hosts() == ["10.0.0.3:6443", "10.0.0.5:6443"]
    })
    .await;

    let requests = api.requests();
    let selector = "labelSelector=kubernetes.io%2Fservice-name%3Dkube";
    assert!(
        requests[0].starts_with("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices?")
            && requests[0].contains(selector)
            && param(&requests[0], "watch").is_none(),
        "{requests:?}"
    );
    for (request, resource_version) in [(&requests[1], "1"), (&requests[2], "7")] {
        assert_eq!(param(request, "watch"), Some("true"), "{requests:?}");
        assert_eq!(
            param(request, "allowWatchBookmarks"),
            Some("true"),
            "{requests:?}"
        );
        assert!(request.contains(selector), "{requests:?}");
        assert_eq!(
            param(request, "resourceVersion"),
            Some(resource_version),
            "{requests:?}"
        );
    }
    assert_eq!(
        requests
            .iter()
            .filter(|r| param(r, "watch").is_none())
            .count(),
        1
    );
    task.abort();
}
