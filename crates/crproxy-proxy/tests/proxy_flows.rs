//! The proxy's request flows over real TLS, with in-memory fake API servers as the
//! client and target clusters and the test acting as the client's aggregation layer
//! (front-proxy client certificate + `X-Remote-*` headers).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use crproxy_core::config::{AccessMode, GroupVersionPlan, ResourceSet, TargetRef};
use crproxy_core::ownership::Owner;
use crproxy_core::pki::CertificateAuthority;
use crproxy_kube::fake::FakeApiServer;
use crproxy_kube::{Auth, Client, ClusterConfig};
use crproxy_proxy::app::{self, ProxySetup, RunningProxy, TargetSetup};
use crproxy_proxy::metrics::Metrics;
use crproxy_proxy::server::ServingIdentity;
use crproxy_proxy::sources::PeerSourceConfig;

const WIDGETS: &str = "/apis/example.com/v1/namespaces/demo/widgets";

struct Harness {
    client_api: FakeApiServer,
    target: FakeApiServer,
    proxy: RunningProxy,
    metrics: Arc<Metrics>,
    /// The aggregator: presents the front-proxy certificate.
    aggregator: Client,
    /// A caller that reached the proxy port without the front-proxy certificate.
    stranger: Client,
    /// For raw connections: the proxy's address, its serving CA and the
    /// front-proxy client certificate.
    addr: SocketAddr,
    serving_ca_pem: String,
    front_proxy_cert: (String, String),
}

struct Options {
    access: AccessMode,
    peers: Option<Vec<String>>,
    /// A peer source that never publishes (a missing file).
    silent_peer_source: bool,
    startup_sync_timeout: std::time::Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            access: AccessMode::Owned,
            peers: None,
            silent_peer_source: false,
            startup_sync_timeout: std::time::Duration::from_secs(60),
        }
    }
}

async fn harness(options: Options) -> Harness {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client_api = FakeApiServer::start().await.expect("client api");
    let target = FakeApiServer::start().await.expect("target api");
    let front_proxy_ca = CertificateAuthority::generate("front-proxy-ca").expect("ca");
    let front_proxy_client = front_proxy_ca
        .issue_client("front-proxy-client", &[])
        .expect("front-proxy client cert");
    client_api.insert(
        "/api/v1/namespaces/kube-system/configmaps",
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
            "data": {
                "requestheader-client-ca-file": front_proxy_ca.pem().cert,
                "requestheader-allowed-names": "[\"front-proxy-client\"]",
                "requestheader-username-headers": "[\"X-Remote-User\"]",
                "requestheader-group-headers": "[\"X-Remote-Group\"]",
                "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]"
            }
        }),
    );
    client_api.insert(
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}}),
    );

    let serving_ca = CertificateAuthority::generate("serving-ca").expect("ca");
    let serving = serving_ca
        .issue_server(&["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
        .expect("serving cert");
    let metrics = Metrics::new();
    let peers = options
        .peers
        .unwrap_or_else(|| vec![target.addr().to_string()]);
    let setup = ProxySetup {
        owner: Owner::new("client", "default"),
        plan: vec![GroupVersionPlan {
            group: "example.com".into(),
            version: "v1".into(),
            resources: ResourceSet::Explicit(vec!["widgets".into()]),
            target: TargetRef {
                name: "target".into(),
                project: "default".into(),
            },
            access: options.access,
            port: 0,
        }],
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        metrics_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        client: crproxy_kube::kube_client_without_retries(
            &client_api.config(),
            client_api.config().credentials().expect("credentials"),
            "default",
        )
        .expect("client"),
        client_watches: crproxy_proxy::watches::WatchClient::new(
            &client_api.config(),
            client_api.config().credentials().expect("credentials"),
        )
        .expect("watch client"),
        targets: vec![TargetSetup {
            name: "target".into(),
            project: "default".into(),
            cluster: target.config(),
            peers: if options.silent_peer_source {
                PeerSourceConfig::File("/nonexistent/crproxy-peers.yaml".into())
            } else {
                PeerSourceConfig::Static(peers)
            },
        }],
        serving: ServingIdentity {
            cert_chain_pem: serving.cert.clone(),
            key_pem: serving.key.clone(),
        },
        metrics: Arc::clone(&metrics),
        share_ports: false,
        startup_sync_timeout: options.startup_sync_timeout,
    };
    let proxy = app::start(setup, true).await.expect("proxy starts");
    let addr = proxy.servers[0].1;
    let url = url::Url::parse(&format!("https://{addr}")).expect("url");
    let mut aggregator = ClusterConfig::new(url.clone());
    aggregator.ca_pem = Some(serving_ca.pem().cert.clone().into_bytes());
    aggregator.auth = Auth::ClientCert {
        cert_pem: front_proxy_client.cert.clone().into_bytes(),
        key_pem: front_proxy_client.key.clone().into_bytes(),
    };
    let mut stranger = ClusterConfig::new(url);
    stranger.ca_pem = Some(serving_ca.pem().cert.clone().into_bytes());
    Harness {
        client_api,
        target,
        proxy,
        metrics,
        aggregator: Client::new(aggregator).expect("aggregator client"),
        stranger: Client::new(stranger).expect("stranger client"),
        addr,
        serving_ca_pem: serving_ca.pem().cert.clone(),
        front_proxy_cert: (front_proxy_client.cert, front_proxy_client.key),
    }
}

struct Reply {
    status: u16,
    headers: http::HeaderMap,
    body: Value,
}

async fn call(client: &Client, method: &str, path: &str, body: Option<Value>) -> Reply {
    call_as(client, method, path, body, "application/json").await
}

async fn call_as(
    client: &Client,
    method: &str,
    path: &str,
    body: Option<Value>,
    content_type: &str,
) -> Reply {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("x-remote-user", "alice")
        .header("x-remote-group", "system:authenticated")
        .header("content-type", content_type)
        .header("accept", "application/json")
        .body(Bytes::from(body.map(|b| b.to_string()).unwrap_or_default()))
        .expect("request");
    let response = client.request(request).await.expect("response");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = serde_json::from_slice(response.body()).unwrap_or(Value::Null);
    Reply {
        status,
        headers,
        body,
    }
}

fn widget(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget",
           "metadata": {"name": name, "namespace": "demo", "labels": labels}, "spec": {"size": 1}})
}

fn series(metrics: &Metrics, name: &str, needle: &str) -> bool {
    metrics
        .encode()
        .lines()
        .any(|l| l.starts_with(name) && l.contains(needle))
}

fn target_saw(h: &Harness, needle: &str) -> bool {
    h.target.requests().iter().any(|r| r.contains(needle))
}

#[tokio::test]
async fn callers_without_the_front_proxy_certificate_get_401_and_reach_nothing() {
    let h = harness(Options::default()).await;
    let reply = call(&h.stranger, "GET", WIDGETS, None).await;
    assert_eq!(reply.status, 401);
    assert_eq!(reply.body["reason"], "Unauthorized");
    assert!(!target_saw(&h, "widgets"), "{:?}", h.target.requests());
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn creates_are_stamped_and_the_namespace_is_mirrored() {
    let h = harness(Options::default()).await;
    let sent = widget(
        "w1",
        json!({"vcluster.com/owner-vcluster": "someone-else", "app": "x"}),
    );
    let reply = call(&h.aggregator, "POST", WIDGETS, Some(sent)).await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    let stored = h
        .target
        .object(&format!("{WIDGETS}/w1"))
        .expect("stored on the target");
    let labels = &stored["metadata"]["labels"];
    assert_eq!(labels["vcluster.com/owner-vcluster"], "client");
    assert_eq!(labels["vcluster.com/owner-project"], "default");
    assert_eq!(labels["app"], "x");
    assert!(
        h.target.object("/api/v1/namespaces/demo").is_some(),
        "namespace mirrored"
    );
    // The caller's identity never reaches the target; the proxy's own does.
    assert!(series(
        &h.metrics,
        "vcluster_proxy_request_total",
        "verb=\"POST\""
    ));
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn objects_without_both_labels_are_masked_for_every_named_verb() {
    let h = harness(Options::default()).await;
    h.target.insert(
        WIDGETS,
        widget("foreign", json!({"vcluster.com/owner-vcluster": "client"})),
    );
    let path = format!("{WIDGETS}/foreign");
    let get = call(&h.aggregator, "GET", &path, None).await;
    assert_eq!(get.status, 404);
    assert_eq!(get.body["reason"], "NotFound");
    assert_eq!(
        get.body["message"],
        "widgets.example.com \"foreign\" not found"
    );
    h.target.clear_requests();
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
        Some(json!({"spec": {"size": 9}})),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(patch.status, 404);
    let delete = call(&h.aggregator, "DELETE", &path, None).await;
    assert_eq!(delete.status, 404);
    assert!(
        !h.target
            .requests()
            .iter()
            .any(|r| !r.starts_with("GET") && r != "POST /api/v1/namespaces"),
        "only ownership GETs (and namespace mirroring) may reach the target: {:?}",
        h.target.requests()
    );
    assert!(series(
        &h.metrics,
        "vcluster_proxy_request_total",
        "reason=\"ownership_masked\""
    ));
    assert_eq!(
        h.target.object(&path).expect("still there")["spec"]["size"],
        1
    );
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn owned_objects_can_be_read_and_deleted() {
    let h = harness(Options::default()).await;
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
    assert!(h.target.object(&path).is_none());
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn lists_carry_the_owner_selector_merged_with_the_callers() {
    let h = harness(Options::default()).await;
    let reply = call(
        &h.aggregator,
        "GET",
        &format!("{WIDGETS}?labelSelector=app%3Dx"),
        None,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let list = h
        .target
        .requests()
        .into_iter()
        .find(|r| r.starts_with("GET") && r.contains("/widgets?"))
        .expect("list forwarded");
    let decoded = percent_encoding::percent_decode_str(&list)
        .decode_utf8_lossy()
        .replace('+', " ");
    assert!(decoded.contains("app=x"), "{decoded}");
    assert!(
        decoded.contains("vcluster.com/owner-vcluster=client"),
        "{decoded}"
    );
    assert!(
        decoded.contains("vcluster.com/owner-project=default"),
        "{decoded}"
    );
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn all_mode_forwards_without_masking() {
    let h = harness(Options {
        access: AccessMode::All,
        ..Options::default()
    })
    .await;
    h.target.insert(WIDGETS, widget("foreign", json!({})));
    let got = call(&h.aggregator, "GET", &format!("{WIDGETS}/foreign"), None).await;
    assert_eq!(got.status, 200);
    let list = call(&h.aggregator, "GET", WIDGETS, None).await;
    assert_eq!(list.status, 200);
    assert!(
        !target_saw(&h, "owner-vcluster"),
        "{:?}",
        h.target.requests()
    );
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn writes_into_a_namespace_missing_on_the_client_are_404() {
    let h = harness(Options::default()).await;
    let path = "/apis/example.com/v1/namespaces/nowhere/widgets";
    let reply = call(&h.aggregator, "POST", path, Some(widget("w", json!({})))).await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.body["message"], "namespaces \"nowhere\" not found");
    assert!(!target_saw(&h, "POST"), "{:?}", h.target.requests());
    assert!(series(
        &h.metrics,
        "vcluster_proxy_request_total",
        "reason=\"namespace_missing\""
    ));
    let _ = &h.client_api;
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn connection_upgrades_are_refused_with_501() {
    let h = harness(Options::default()).await;
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
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn target_errors_become_a_retryable_503() {
    let h = harness(Options::default()).await;
    h.target.set_unavailable(true);
    let reply = call(&h.aggregator, "GET", WIDGETS, None).await;
    assert_eq!(reply.status, 503);
    assert_eq!(
        reply
            .headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(
        reply.body["message"],
        "target tenant cluster \"target\" for example.com/v1 is unavailable"
    );
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn discovery_falls_back_locally_when_no_peer_answers() {
    // A port nobody listens on: every dial is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead = closed.local_addr().expect("addr").to_string();
    drop(closed);
    let h = harness(Options {
        peers: Some(vec![dead]),
        ..Options::default()
    })
    .await;
    let reply = call(&h.aggregator, "GET", "/apis/example.com/v1", None).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["kind"], "APIResourceList");
    assert_eq!(reply.body["resources"][0]["name"], "widgets");
    assert_eq!(reply.body["resources"][0]["verbs"], json!(["get"]));
    assert!(series(
        &h.metrics,
        "vcluster_proxy_discovery_fallbacks_total",
        "group_version=\"example.com/v1\""
    ));
    // Resource requests fail with the retryable 503 meanwhile.
    let list = call(&h.aggregator, "GET", WIDGETS, None).await;
    assert_eq!(list.status, 503);
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn paths_outside_the_group_version_never_reach_the_target() {
    let h = harness(Options::default()).await;
    h.target.insert(
        "/api/v1/namespaces/demo/secrets",
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "demo"}}),
    );
    for (path, expected) in [
        ("/api/v1/namespaces/demo/secrets/s", 404),
        ("/apis/example.com/v2/namespaces/demo/widgets", 404),
        ("/apis/other.io/v1/namespaces/demo/widgets", 404),
        ("/apis/example.com/v1/namespaces/demo/widgets/..%2F..%2F..%2Fapi%2Fv1%2Fnamespaces%2Fdemo%2Fsecrets%2Fs", 400),
        ("/apis/example.com/v1/namespaces/demo/widgets/../../../../api/v1/namespaces/demo/secrets/s", 400),
    ] {
        let reply = call(&h.aggregator, "GET", path, None).await;
        assert_eq!(reply.status, expected, "{path}");
    }
    assert!(!target_saw(&h, "secrets"), "{:?}", h.target.requests());
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn a_namespace_deleted_on_the_client_stops_writes() {
    let h = harness(Options::default()).await;
    let first = call(
        &h.aggregator,
        "POST",
        WIDGETS,
        Some(widget("w1", json!({}))),
    )
    .await;
    assert_eq!(first.status, 201, "{}", first.body);
    h.client_api
        .client()
        .delete("/api/v1/namespaces/demo")
        .await
        .expect("delete namespace on the client");
    // The namespace cache follows the client's watch; allow it a moment.
    let mut status = 0;
    for attempt in 0..40 {
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
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        status, 404,
        "writes into a namespace deleted on the client must stop"
    );
    h.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_watches_than_one_http2_connection_allows_all_open() {
    // The fake target (hyper) allows 200 concurrent streams per connection, as
    // kube-apiserver allows 250: the proxy must spread 250 watches over several
    // connections instead of queueing the excess forever.
    let h = harness(Options::default()).await;
    let addr = h.proxy.servers[0].1;
    let tls = h
        .aggregator
        .config()
        .rustls_config(&[b"h2"], h.aggregator.credentials())
        .expect("aggregator TLS");
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let mut senders = Vec::new();
    for _ in 0..5 {
        // Separate caller connections, so the caller side is not the limit.
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
        let stream = connector.connect(name, tcp).await.expect("tls");
        let (sender, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .expect("h2 handshake");
        tokio::spawn(connection);
        senders.push(sender);
    }
    let mut opened = Vec::new();
    for i in 0..250 {
        let mut sender = senders[i % senders.len()].clone();
        opened.push(tokio::spawn(async move {
            let request = http::Request::get(format!(
                "https://localhost{WIDGETS}?watch=true&labelSelector=n%3D{i}"
            ))
            .header("x-remote-user", "alice")
            .header("x-remote-group", "system:authenticated")
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("request");
            let response = tokio::time::timeout(
                std::time::Duration::from_secs(20),
                sender.send_request(request),
            )
            .await;
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
    assert_eq!(open, 250, "every watch must get its response");
    assert!(series(&h.metrics, "vcluster_proxy_active_watches", " 250"));
    drop(responses);
    h.proxy.shutdown().await;
}

#[tokio::test]
async fn subresources_follow_the_objects_ownership() {
    let h = harness(Options::default()).await;
    let created = call(
        &h.aggregator,
        "POST",
        WIDGETS,
        Some(widget("mine", json!({}))),
    )
    .await;
    assert_eq!(created.status, 201);
    h.target.insert(WIDGETS, widget("foreign", json!({})));
    // The fake stores no subresources, so an owned object's /status answers
    // whatever the target says; what matters is that it is not masked.
    let owned = call(
        &h.aggregator,
        "GET",
        &format!("{WIDGETS}/mine/status"),
        None,
    )
    .await;
    assert_eq!(owned.status, 200, "{}", owned.body);
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

#[tokio::test]
async fn aggregated_discovery_falls_back_when_the_target_cannot_answer() {
    let h = harness(Options::default()).await;
    let request = http::Request::get("/apis")
        .header("x-remote-user", "system:kube-aggregator")
        .header("x-remote-group", "system:masters")
        .header(
            "accept",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
        )
        .body(Bytes::new())
        .expect("request");
    let response = h.aggregator.request(request).await.expect("response");
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().expect("ascii");
    assert!(
        content_type.contains("as=APIGroupDiscoveryList"),
        "{content_type}"
    );
    let doc: Value = serde_json::from_slice(response.body()).expect("json");
    assert_eq!(doc["kind"], "APIGroupDiscoveryList");
    assert_eq!(doc["items"][0]["metadata"]["name"], "example.com");
    let resource = &doc["items"][0]["versions"][0]["resources"][0];
    assert_eq!(resource["resource"], "widgets");
    assert_eq!(resource["verbs"], json!(["get"]));
    // The fake target has no aggregated discovery: counted as a fallback.
    assert!(series(
        &h.metrics,
        "vcluster_proxy_discovery_fallbacks_total",
        "reason=\"upstream_error\""
    ));
    // Plain /apis is the client API server's own business.
    let plain = call(&h.aggregator, "GET", "/apis", None).await;
    assert_eq!(plain.status, 404);
    h.proxy.shutdown().await;
}

/// Collects formatted log output in memory.
#[derive(Clone, Default)]
struct LogBuffer(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

#[tokio::test]
async fn a_peer_list_that_never_arrives_is_logged_and_requests_fail_with_no_peer() {
    let logs = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let h = harness(Options {
        silent_peer_source: true,
        startup_sync_timeout: std::time::Duration::from_millis(200),
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
        logged = String::from_utf8_lossy(&logs.0.lock().expect("log")).into_owned();
        if logged.contains("peer cache did not sync in time for the startup probe") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        logged.contains("peer cache did not sync in time for the startup probe"),
        "{logged}"
    );
    // "Starting proxy server" and friends are checked on the real binary's output
    // (tests/run_command.rs in the crproxy crate): with tests running in parallel
    // threads, only a callsite this test alone reaches is reliably captured here.
    h.proxy.shutdown().await;
}

/// A raw HTTP/2 connection to the proxy as the aggregator, for requests whose
/// bodies the test controls frame by frame.
async fn raw_h2(
    h: &Harness,
) -> hyper::client::conn::http2::SendRequest<
    http_body_util::StreamBody<
        tokio_stream::wrappers::ReceiverStream<Result<hyper::body::Frame<Bytes>, std::io::Error>>,
    >,
> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(h.serving_ca_pem.as_bytes()).expect("ca"))
        .expect("root");
    let chain =
        vec![CertificateDer::from_pem_slice(h.front_proxy_cert.0.as_bytes()).expect("cert")];
    let key = PrivateKeyDer::from_pem_slice(h.front_proxy_cert.1.as_bytes()).expect("key");
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .expect("client config");
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(h.addr)
        .await
        .expect("connect");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("tls");
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .expect("h2 handshake");
    tokio::spawn(connection);
    sender
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_in_flight_limit_callers_get_429_with_retry_after() {
    use crproxy_proxy::handler::MAX_IN_FLIGHT;
    let h = harness(Options::default()).await;
    let mut sender = raw_h2(&h).await;
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
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
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
    let h = harness(Options::default()).await;
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
