//! A proxy in owned or all mode in front of a real target (devcluster, over TLS)
//! serving `widgets.example.com`, with a devcluster as the client cluster; shared by
//! the request-flow, isolation, ownership-cache, memory and fault tests.
//!
//! Everything talks kube-rs: the target's admin goes straight to the target, and the
//! test plays the client cluster's aggregation layer (front-proxy client
//! certificate plus `X-Remote-*` headers) through [`send`].
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::Api;
use serde_json::{json, Value};

use crproxy_core::config::{AccessMode, GroupVersionPlan, ResourceSet, TargetRef};
use crproxy_core::ownership::Owner;
use crproxy_core::pki::{CertPem, CertificateAuthority};
use crproxy_kube::{Auth, ClusterConfig};
use crproxy_proxy::app::{self, ProxySetup, RunningProxy, TargetSetup};
use crproxy_proxy::metrics::Metrics;
use crproxy_proxy::server::ServingIdentity;
use crproxy_proxy::sources::PeerSourceConfig;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use test_support::TestCluster;

pub const WIDGETS: &str = "/apis/example.com/v1/namespaces/demo/widgets";
pub const OWNER_LABELS: &str =
    r#"{"vcluster.com/owner-vcluster":"client","vcluster.com/owner-project":"default"}"#;

/// How long a caller waits for one answer before giving up (then [`send`] reports
/// status 0), as a client's request timeout would.
pub const CALLER_TIMEOUT: Duration = Duration::from_secs(30);

/// A namespaced CRD in example.com/v1 whose spec and status take any fields,
/// with `subresources` as given (the widgets' have status and scale).
pub fn example_crd(plural: &str, kind: &str, subresources: Value) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.example.com")},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }}},
                "subresources": subresources
            }]
        }
    }))
    .expect("a CRD")
}

pub struct Harness {
    /// The client cluster (namespaces, front-proxy trust).
    pub client_api: TestCluster,
    /// The target; tests stop its listener to take it away.
    pub target: TestCluster,
    pub proxy: RunningProxy,
    /// The client cluster's admin.
    pub client_admin: kube::Client,
    /// The target's admin, straight to the target.
    pub admin: kube::Client,
    /// `demo/widgets` on the target, as its admin sees them.
    pub widgets: Api<DynamicObject>,
    /// The aggregator: presents the front-proxy certificate.
    pub aggregator: kube::Client,
    /// A caller that reached the proxy port without the front-proxy certificate.
    pub stranger: kube::Client,
    /// The proxy's metrics registry.
    pub metrics: Arc<Metrics>,
    /// For raw connections: the proxy's address, its serving CA and the
    /// front-proxy client certificate.
    pub addr: SocketAddr,
    pub serving_ca_pem: String,
    pub front_proxy_client: CertPem,
}

/// What the proxy under test is set up with.
pub struct Options<'a> {
    pub access: AccessMode,
    /// The proxy's peer source, given the target's address.
    pub peers: Box<dyn FnOnce(SocketAddr) -> PeerSourceConfig + 'a>,
    pub startup_sync_timeout: Duration,
    /// Whether the harness waits for the peer source's first list before it
    /// returns; false for a source that is meant never to publish.
    pub wait_for_peers: bool,
    /// The RBAC rules (a ClusterRole's `rules`) of the identity the proxy uses
    /// on the target; `None`: the target's admin.
    pub target_rules: Option<Value>,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Self {
            access: AccessMode::Owned,
            peers: Box::new(|target| PeerSourceConfig::Static(vec![target.to_string()])),
            startup_sync_timeout: Duration::from_secs(60),
            wait_for_peers: true,
            target_rules: None,
        }
    }
}

pub async fn harness(access: AccessMode) -> Harness {
    harness_with(Options {
        access,
        ..Options::default()
    })
    .await
}

/// [`harness`] with the proxy's peers chosen from the target's address.
pub async fn harness_with_peers(
    access: AccessMode,
    peers: impl FnOnce(SocketAddr) -> PeerSourceConfig,
) -> Harness {
    harness_with(Options {
        access,
        peers: Box::new(peers),
        ..Options::default()
    })
    .await
}

/// A harness whose only target peer is `relay`, pointed at the target
/// devcluster (TLS stays end to end): the test freezes and thaws what the proxy
/// reaches.
pub async fn harness_behind(relay: &test_support::relay::Relay, access: AccessMode) -> Harness {
    harness_with_peers(access, |target| {
        relay.connect_to(target);
        PeerSourceConfig::Static(vec![relay.addr.to_string()])
    })
    .await
}

/// A kube-rs client of `config` that hands every answer back as it came (no retries
/// of 429 or 503: the tests look at exactly those).
fn client_of(config: &ClusterConfig) -> kube::Client {
    let credentials = config.credentials().expect("credentials");
    crproxy_kube::kube_client_without_retries(config, credentials, "default").expect("client")
}

/// The admin of a devcluster, by its token.
fn admin_config(cluster: &TestCluster) -> ClusterConfig {
    let mut config = ClusterConfig::new(url::Url::parse(&cluster.cluster.url()).expect("url"));
    config.ca_pem = Some(cluster.cluster.ca_pem().into_bytes());
    config.auth = Auth::Token(cluster.cluster.admin_token());
    config
}

pub async fn harness_with(options: Options<'_>) -> Harness {
    let target = test_support::devcluster("target").await;
    let target_config = admin_config(&target);
    let admin = client_of(&target_config);
    let widgets_crd = example_crd(
        "widgets",
        "Widget",
        json!({"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}),
    );
    Api::<CustomResourceDefinition>::all(admin.clone())
        .create(&PostParams::default(), &widgets_crd)
        .await
        .expect("crd created");
    let demo: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "demo"}})).expect("namespace");
    Api::all(admin.clone())
        .create(&PostParams::default(), &demo)
        .await
        .expect("namespace created");
    let widgets = Api::namespaced_with(admin.clone(), "demo", &widget_resource());
    wait_until_served(&widgets).await;
    let proxy_target_config = match &options.target_rules {
        None => target_config.clone(),
        Some(rules) => restricted_identity(&target, &admin, rules).await,
    };

    // The client cluster publishes its front-proxy CA in
    // kube-system/extension-apiserver-authentication, as kube-apiserver does.
    let client_api = test_support::devcluster("client").await;
    let front_proxy_client = client_api.cluster.front_proxy_client();
    let client = crproxy_kube::ClusterAccess::new(admin_config(&client_api)).expect("credentials");
    let client_admin = client.kube_client().expect("client admin");
    Api::all(client_admin.clone())
        .create(&PostParams::default(), &demo)
        .await
        .expect("namespace created on the client");
    let serving_ca = CertificateAuthority::generate("serving-ca").expect("ca");
    let serving = serving_ca
        .issue_server(&["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
        .expect("serving cert");
    let metrics = Metrics::new();
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
        client: client.kube_client_without_retries().expect("client"),
        client_watches: crproxy_proxy::watches::WatchClient::new(&client).expect("watch client"),
        targets: vec![TargetSetup {
            name: "target".into(),
            project: "default".into(),
            access: crproxy_kube::ClusterAccess::new(proxy_target_config)
                .expect("target credentials"),
            peers: (options.peers)(target.cluster.addr()),
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
    if options.wait_for_peers {
        wait_for_peer_lists(&proxy).await;
    }
    let addr = proxy.servers[0].1;
    let proxy_url = url::Url::parse(&format!("https://{addr}")).expect("url");
    let serving_ca_pem = serving_ca.pem().cert.clone();
    let mut stranger = ClusterConfig::new(proxy_url);
    stranger.ca_pem = Some(serving_ca_pem.clone().into_bytes());
    let mut aggregator = stranger.clone();
    aggregator.auth = Auth::ClientCert {
        cert_pem: front_proxy_client.cert.clone().into_bytes(),
        key_pem: front_proxy_client.key.clone().into_bytes(),
    };
    Harness {
        client_api,
        target,
        proxy,
        client_admin,
        admin,
        widgets,
        aggregator: client_of(&aggregator),
        stranger: client_of(&stranger),
        metrics,
        addr,
        serving_ca_pem,
        front_proxy_client,
    }
}

/// A target identity of its own (user `crproxy-under-test`) allowed `rules` only.
async fn restricted_identity(
    target: &TestCluster,
    admin: &kube::Client,
    rules: &Value,
) -> ClusterConfig {
    let user = "crproxy-under-test";
    let role: k8s_openapi::api::rbac::v1::ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": user},
        "rules": rules,
    }))
    .expect("cluster role");
    Api::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("cluster role created");
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .expect("cluster role binding");
    Api::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("cluster role binding created");
    let mut config = admin_config(target);
    config.auth = Auth::Token(target.cluster.issue_token(user, &[]).expect("token"));
    config
}

/// Waits (bounded: 10 s) until every pool has its first peer list, as an
/// aggregator waits for the backend to become ready: the peer sources publish
/// from tasks of their own, and a request that comes before the first list is
/// answered 503. The sources the tests give publish a non-empty list at once.
async fn wait_for_peer_lists(proxy: &RunningProxy) {
    for pool in &proxy.pools {
        assert!(
            pool.wait_for_first_list(Duration::from_secs(10)).await,
            "the proxy's peer source published no peer list within 10 s"
        );
    }
}

/// The CRD becomes served a moment after it is created (bounded: 10 s).
/// Waits (at most 10 s) until the target serves the resource of `objects`.
pub async fn wait_until_served(objects: &Api<DynamicObject>) {
    for _ in 0..100 {
        if objects.list(&ListParams::default().limit(1)).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the resource was never served");
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Value,
    /// The body as it came, for tests that compare answers byte for byte.
    pub bytes: Bytes,
}

/// A caller request through the aggregator; `content_type: None` sends none.
pub async fn send(
    h: &Harness,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: impl Into<Bytes>,
) -> Reply {
    send_as(&h.aggregator, method, path, content_type, body).await
}

/// A request of `method` to `uri` carrying the identity headers an aggregator
/// sets for alice (authenticated); the caller adds `Accept` and the rest.
pub fn as_alice(method: &str, uri: &str) -> http::request::Builder {
    http::Request::builder()
        .method(method)
        .uri(uri)
        .header("x-remote-user", "alice")
        .header("x-remote-group", "system:authenticated")
}

/// A request as `caller` to the proxy, carrying the identity headers an aggregator
/// sets (`alice`, authenticated); `content_type: None` sends none.
pub async fn send_as(
    caller: &kube::Client,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: impl Into<Bytes>,
) -> Reply {
    send_accepting(caller, method, path, "application/json", content_type, body).await
}

/// [`send_as`] asking for `accept` instead of plain JSON.
pub async fn send_accepting(
    caller: &kube::Client,
    method: &str,
    path: &str,
    accept: &str,
    content_type: Option<&str>,
    body: impl Into<Bytes>,
) -> Reply {
    let mut request = as_alice(method, path).header("accept", accept);
    if let Some(ct) = content_type {
        request = request.header("content-type", ct);
    }
    let request = request.body(body.into()).expect("request");
    exchange(caller, request).await
}

/// Sends `request` as `caller` and reads the whole answer. A caller-side failure
/// (the connection broke, no answer within [`CALLER_TIMEOUT`]) is an answer too:
/// status 0 with the error, for the tests to count.
pub async fn exchange(caller: &kube::Client, request: http::Request<Bytes>) -> Reply {
    let failed = |message: String| Reply {
        status: 0,
        headers: http::HeaderMap::new(),
        body: json!({ "message": message }),
        bytes: Bytes::new(),
    };
    let answer = async {
        let response = caller
            .send(request.map(kube::client::Body::from))
            .await
            .map_err(|e| e.to_string())?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok::<_, String>((parts, body))
    };
    match tokio::time::timeout(CALLER_TIMEOUT, answer).await {
        Ok(Ok((parts, body))) => Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            bytes: body,
        },
        Ok(Err(message)) => failed(message),
        Err(_) => failed(format!("no answer within {CALLER_TIMEOUT:?}")),
    }
}

pub fn widget(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget",
           "metadata": {"name": name, "namespace": "demo", "labels": labels},
           "spec": {"replicas": 1}})
}

/// The widget kind, for kube-rs's dynamic API.
pub fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    )
}

/// [`widget`] as the target's admin writes it.
pub fn widget_object(name: &str, labels: Value) -> DynamicObject {
    serde_json::from_value(widget(name, labels)).expect("widget")
}

/// `demo/<name>` as stored on the target, if it exists.
pub async fn on_target(h: &Harness, name: &str) -> Option<Value> {
    let object = h.widgets.get_opt(name).await.expect("get");
    object.as_ref().map(json_of)
}

/// An object the target's admin read or wrote, as JSON: the shape the proxy's
/// answers come in, so one set of checks reads both.
pub fn json_of(object: &DynamicObject) -> Value {
    serde_json::to_value(object).expect("objects are JSON")
}

/// A raw HTTP/2 connection to the proxy at `addr` as the client cluster's
/// aggregator (its front-proxy certificate), for requests whose bodies, streams
/// or flow control the test controls itself. Each stream's receive window is 64
/// KiB and opens again only as bodies are read.
pub async fn caller_h2<B>(
    addr: SocketAddr,
    serving_ca_pem: &str,
    front_proxy: &crproxy_core::pki::CertPem,
) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    caller_h2_with_window(addr, serving_ca_pem, front_proxy, 65_535).await
}

/// [`caller_h2`] with each stream's receive window `stream_window` bytes (0: the
/// proxy may send headers, never a body byte).
pub async fn caller_h2_with_window<B>(
    addr: SocketAddr,
    serving_ca_pem: &str,
    front_proxy: &crproxy_core::pki::CertPem,
    stream_window: u32,
) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tls = caller_tls(addr, serving_ca_pem, front_proxy).await;
    let (sender, connection) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(stream_window)
            .initial_connection_window_size(65_535)
            .adaptive_window(false)
            .handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    tokio::spawn(connection);
    sender
}

/// A TLS connection to the proxy at `addr` as the client cluster's aggregator
/// (its front-proxy certificate), offering only HTTP/2.
pub async fn caller_tls(
    addr: SocketAddr,
    serving_ca_pem: &str,
    front_proxy: &crproxy_core::pki::CertPem,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(serving_ca_pem.as_bytes()).expect("ca"))
        .expect("root");
    let chain = vec![CertificateDer::from_pem_slice(front_proxy.cert.as_bytes()).expect("cert")];
    let key = PrivateKeyDer::from_pem_slice(front_proxy.key.as_bytes()).expect("key");
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(crproxy_kube::crypto_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .expect("client config");
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("tls")
}

/// A bodiless GET of `path` as the client's aggregator forwards alice's, for the
/// connections [`caller_h2`] opens.
pub fn aggregator_get(path: &str) -> http::Request<http_body_util::Empty<Bytes>> {
    as_alice("GET", &format!("https://localhost{path}"))
        .header("accept", "application/json")
        .body(http_body_util::Empty::new())
        .expect("request")
}

/// The sum of `name`'s samples whose line contains `needle` (0 when none).
pub fn metric_value(metrics: &Metrics, name: &str, needle: &str) -> f64 {
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Resets this process's peak resident memory (`VmHWM`) to what it uses now.
/// A memory test runs in a test binary of its own: other tests move the peak.
pub fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
}

/// This process's peak resident memory since the last reset, in KiB.
pub fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM")
}
