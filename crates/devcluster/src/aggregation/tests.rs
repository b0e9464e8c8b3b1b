//! The aggregator against a real HTTPS backend on 127.0.0.1 that requires a client
//! certificate from the front-proxy CA, fronted by a plain hyper server that routes
//! like the devcluster pipeline would.

use super::*;
use crate::test_util::values;
use crproxy_core::pki::CertificateAuthority;
use http_body_util::StreamBody;
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use std::convert::Infallible;
use std::sync::Mutex as StdMutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, Notify};

const TEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the backend saw.
#[derive(Clone, Debug)]
struct Seen {
    version: http::Version,
    /// `Host` (HTTP/1.1) or `:authority` (HTTP/2).
    authority: String,
    method: String,
    uri: String,
    headers: HeaderMap,
    client_cn: String,
}

struct Backend {
    addr: SocketAddr,
    seen: Arc<StdMutex<Vec<Seen>>>,
    release_watch: Arc<Notify>,
    /// TLS connections the backend accepted.
    connections: Arc<std::sync::atomic::AtomicUsize>,
    /// Bumped to make the backend drop every open connection.
    close_connections: Arc<tokio::sync::watch::Sender<u32>>,
}

impl Backend {
    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Closes every connection the backend has open (it keeps listening).
    fn drop_connections(&self) {
        self.close_connections
            .send_modify(|generation| *generation += 1);
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(crproxy_kube::crypto_provider())
}

struct Pki {
    front_proxy_ca: CertificateAuthority,
    serving_ca: CertificateAuthority,
}

fn pki() -> Pki {
    Pki {
        front_proxy_ca: CertificateAuthority::generate("front-proxy-ca").expect("ca"),
        serving_ca: CertificateAuthority::generate("serving-ca").expect("ca"),
    }
}

fn resource_list(group: &str) -> Value {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{group}/v1"),
           "resources": [
               {"name": "widgets", "singularName": "widget", "namespaced": true, "kind": "Widget",
                "verbs": ["get", "list", "watch", "create"], "shortNames": ["wd"]},
               {"name": "widgets/status", "singularName": "", "namespaced": true, "kind": "Widget",
                "verbs": ["get", "patch"]}]})
}

/// Starts the backend for `group`. `aggregated`: answer `/apis` with aggregated
/// discovery (else with a legacy APIGroupList, forcing the fallback).
async fn start_backend(pki: &Pki, group: &'static str, aggregated: bool) -> Backend {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    start_backend_on(pki, group, aggregated, listener).await
}

/// [`start_backend`] on a chosen address (a backend that comes up late).
async fn start_backend_on(
    pki: &Pki,
    group: &'static str,
    aggregated: bool,
    listener: TcpListener,
) -> Backend {
    let server_pem = pki
        .serving_ca
        .issue_server(
            &["widgets.ns1.svc", "sliced.ns1.svc", "gadgets.ns1.svc"],
            &[],
        )
        .expect("server cert");
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(
            CertificateDer::from_pem_slice(pki.front_proxy_ca.pem().cert.as_bytes())
                .expect("ca der"),
        )
        .expect("root");
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .expect("verifier");
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            CertificateDer::pem_slice_iter(server_pem.cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .expect("chain"),
            PrivateKeyDer::from_pem_slice(server_pem.key.as_bytes()).expect("key"),
        )
        .expect("server config");
    let mut config = config;
    // The aggregated backend speaks HTTP/1.1 only, the other both (as crproxy does).
    config.alpn_protocols = if aggregated {
        vec![b"http/1.1".to_vec()]
    } else {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(StdMutex::new(Vec::new()));
    let release_watch = Arc::new(Notify::new());
    let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let close_connections = Arc::new(tokio::sync::watch::channel(0u32).0);
    let (seen2, release2, connections2, close2) = (
        seen.clone(),
        release_watch.clone(),
        connections.clone(),
        close_connections.clone(),
    );
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let (seen, release) = (seen2.clone(), release2.clone());
            let connections = connections2.clone();
            let mut closing = close2.subscribe();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                connections.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let client_cn = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first().cloned())
                    .and_then(|der| {
                        let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
                        let cn = cert
                            .subject()
                            .iter_common_name()
                            .next()?
                            .as_str()
                            .ok()?
                            .to_string();
                        Some(cn)
                    })
                    .unwrap_or_default();
                let service = service_fn(move |req: Request<Incoming>| {
                    let (seen, release, client_cn) =
                        (seen.clone(), release.clone(), client_cn.clone());
                    async move {
                        Ok::<_, Infallible>(
                            backend_handler(req, seen, release, client_cn, group, aggregated).await,
                        )
                    }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                );
                let serving = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
                // Dropping the connection closes its socket.
                tokio::select! {
                    _ = serving => {}
                    _ = closing.changed() => {}
                }
            });
        }
    });
    Backend {
        addr,
        seen,
        release_watch,
        connections,
        close_connections,
    }
}

async fn backend_handler(
    mut req: Request<Incoming>,
    seen: Arc<StdMutex<Vec<Seen>>>,
    release: Arc<Notify>,
    client_cn: String,
    group: &str,
    aggregated: bool,
) -> Response<BoxBody> {
    seen.lock().expect("lock").push(Seen {
        version: req.version(),
        authority: req
            .uri()
            .authority()
            .map(|a| a.to_string())
            .or_else(|| {
                req.headers()
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(String::from)
            })
            .unwrap_or_default(),
        method: req.method().to_string(),
        uri: req
            .uri()
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: req.headers().clone(),
        client_cn,
    });
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let json_response = |content_type: &str, v: Value| {
        let mut r = Response::new(
            Full::new(Bytes::from(v.to_string()))
                .map_err(|e| match e {})
                .boxed(),
        );
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(content_type).expect("ct"),
        );
        r
    };
    // `/status/<code>`: that status and a short text, whatever was asked (an
    // upgrade the backend does not take, say).
    if let Some(code) = path.strip_prefix("/status/") {
        let status = code
            .parse::<u16>()
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .unwrap_or(StatusCode::BAD_REQUEST);
        let mut r = Response::new(
            Full::new(Bytes::from(format!("backend says {code}\n")))
                .map_err(|e| match e {})
                .boxed(),
        );
        *r.status_mut() = status;
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        return r;
    }
    if path == "/upgrade" {
        let on_upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = on_upgrade.await {
                let mut io = TokioIo::new(upgraded);
                let mut buf = [0u8; 4];
                if io.read_exact(&mut buf).await.is_ok() {
                    let _ = io.write_all(&buf).await;
                }
            }
        });
        let mut r = Response::new(Empty::new().map_err(|e| match e {}).boxed());
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        r.headers_mut()
            .insert(header::UPGRADE, HeaderValue::from_static("test-proto"));
        return r;
    }
    if path == "/apis" {
        return if aggregated {
            json_response(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
                json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "items": [
                    {"metadata": {"name": group}, "versions": [{"version": "v1", "resources": [
                        {"resource": "gadgets", "responseKind": {"group": group, "version": "v1", "kind": "Gadget"},
                         "scope": "Cluster", "singularResource": "gadget", "verbs": ["get", "list"]}]}]}]}),
            )
        } else {
            json_response(
                "application/json",
                json!({"kind": "APIGroupList", "groups": []}),
            )
        };
    }
    if path == format!("/apis/{group}/v1") {
        return json_response("application/json", resource_list(group));
    }
    if query.contains("watch=true") {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(4);
        tokio::spawn(async move {
            let event = |t: &str| Ok(Frame::data(Bytes::from(format!("{{\"type\":\"{t}\"}}\n"))));
            let _ = tx.send(event("ADDED")).await;
            release.notified().await;
            let _ = tx.send(event("MODIFIED")).await;
        });
        let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut r = Response::new(BodyExt::boxed(body));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        return r;
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    json_response(
        "application/json",
        json!({"path": path, "body": String::from_utf8_lossy(&body)}),
    )
}

/// An in-memory ClusterView.
struct FakeView {
    apiservices: StdMutex<Vec<Value>>,
    services: StdMutex<HashMap<(String, String), Value>>,
    slices: StdMutex<HashMap<(String, String), Vec<Value>>>,
    changes: broadcast::Sender<()>,
}

impl FakeView {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            apiservices: StdMutex::new(Vec::new()),
            services: StdMutex::new(HashMap::new()),
            slices: StdMutex::new(HashMap::new()),
            changes: broadcast::channel(16).0,
        })
    }

    fn add_apiservice(
        &self,
        group: &str,
        service: Option<(&str, &str)>,
        ca: &CertificateAuthority,
    ) {
        let mut spec = json!({"group": group, "version": "v1", "groupPriorityMinimum": 1000, "versionPriority": 15});
        if let Some((ns, name)) = service {
            spec["service"] = json!({"namespace": ns, "name": name, "port": 443});
            spec["caBundle"] =
                json!(base64::engine::general_purpose::STANDARD.encode(ca.pem().cert.as_bytes()));
        }
        self.apiservices
            .lock()
            .expect("lock")
            .push(json!({"metadata": {"name": format!("v1.{group}")}, "spec": spec}));
    }

    fn set_external_service(&self, ns: &str, name: &str, port: u16) {
        // The APIService names port 443; an ExternalName Service uses it as is, so
        // the test rewrites the APIService port to the backend's.
        self.services.lock().expect("lock").insert(
            (ns.into(), name.into()),
            json!({"metadata": {"name": name, "namespace": ns},
                   "spec": {"type": "ExternalName", "externalName": "127.0.0.1"}}),
        );
        for a in self.apiservices.lock().expect("lock").iter_mut() {
            if a["spec"]["service"]["name"] == name {
                a["spec"]["service"]["port"] = json!(port);
            }
        }
    }

    fn condition(&self, name: &str) -> Value {
        self.apiservices
            .lock()
            .expect("lock")
            .iter()
            .find(|a| a["metadata"]["name"] == name)
            .and_then(|a| a["status"]["conditions"].as_array().cloned())
            .and_then(|c| c.into_iter().find(|c| c["type"] == "Available"))
            .unwrap_or(Value::Null)
    }
}

impl ClusterView for FakeView {
    fn apiservices(&self) -> Vec<Value> {
        self.apiservices.lock().expect("lock").clone()
    }
    fn service(&self, ns: &str, name: &str) -> Option<Value> {
        self.services
            .lock()
            .expect("lock")
            .get(&(ns.into(), name.into()))
            .cloned()
    }
    fn endpoint_slices(&self, ns: &str, service: &str) -> Vec<Value> {
        self.slices
            .lock()
            .expect("lock")
            .get(&(ns.into(), service.into()))
            .cloned()
            .unwrap_or_default()
    }
    fn set_apiservice_status(&self, name: &str, status: Value) {
        for a in self.apiservices.lock().expect("lock").iter_mut() {
            if a["metadata"]["name"] == name {
                a["status"] = status.clone();
            }
        }
    }
    fn changed(&self) -> broadcast::Receiver<()> {
        self.changes.subscribe()
    }
}

fn alice() -> UserInfo {
    UserInfo {
        name: "alice".into(),
        uid: "alice-uid".into(),
        groups: vec!["developers".into(), "system:authenticated".into()],
        extra: BTreeMap::from([(
            "acme.com/project".to_string(),
            vec!["p1".to_string(), "p2".to_string()],
        )]),
    }
}

/// A plain-HTTP front server that forwards routed paths like the devcluster pipeline.
async fn start_front(agg: Arc<Aggregator>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, peer)) = listener.accept().await {
            let agg = agg.clone();
            tokio::spawn(async move {
                let service = service_fn(move |mut req: Request<Incoming>| {
                    let agg = agg.clone();
                    req.extensions_mut().insert(peer);
                    async move {
                        let resp = match agg.route(req.uri().path()) {
                            Some(route) => agg.proxy(route, req, &alice()).await,
                            None => text_response(StatusCode::NOT_FOUND, "not routed\n"),
                        };
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    addr
}

async fn client(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(addr).await.expect("connect front");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn.with_upgrades());
    sender
}

struct Setup {
    pki: Pki,
    view: Arc<FakeView>,
    agg: Arc<Aggregator>,
    backend: Backend,
    front: SocketAddr,
}

async fn setup(aggregated: bool) -> Setup {
    let pki = pki();
    let backend = start_backend(&pki, "example.com", aggregated).await;
    let view = FakeView::new();
    view.add_apiservice("example.com", Some(("ns1", "widgets")), &pki.serving_ca);
    view.set_external_service("ns1", "widgets", backend.addr.port());
    let client_pem = pki
        .front_proxy_ca
        .issue_client(FRONT_PROXY_CLIENT_NAME, &[])
        .expect("client cert");
    let agg = Aggregator::new(view.clone(), client_pem).expect("aggregator");
    let front = start_front(agg.clone()).await;
    Setup {
        pki,
        view,
        agg,
        backend,
        front,
    }
}

#[tokio::test]
async fn proxied_request_carries_identity_and_not_credentials() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let s = setup(false).await;
        s.agg.check_availability().await;
        let cond = s.view.condition("v1.example.com");
        assert_eq!(
            (cond["status"].as_str(), cond["reason"].as_str()),
            (Some("True"), Some("Passed")),
            "{cond}"
        );

        let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
        let req = Request::builder()
            .uri("/apis/example.com/v1/namespaces/ns1/widgets?limit=1")
            .header(header::HOST, "devcluster.local:6443")
            .header(header::AUTHORIZATION, "Bearer secret-token")
            .header("impersonate-user", "bob")
            .header("x-remote-user", "mallory")
            .header(header::ACCEPT, accept)
            .header("kubectl-command", "kubectl get")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let resp = client(s.front)
            .await
            .send_request(req)
            .await
            .expect("response");
        assert_eq!(resp.status(), StatusCode::OK);

        let seen = s.backend.seen();
        let probes: Vec<&Seen> = seen
            .iter()
            .filter(|r| r.uri == "/apis/example.com/v1")
            .collect();
        assert_eq!(probes.len(), DISCOVERY_ATTEMPTS);
        for probe in probes {
            assert_eq!(
                values(&probe.headers, "x-remote-user"),
                vec!["system:kube-aggregator"]
            );
            assert_eq!(
                values(&probe.headers, "x-remote-group"),
                vec!["system:masters"]
            );
            assert!(probe.headers.get(header::ACCEPT).is_none());
            assert_eq!(probe.client_cn, "front-proxy-client");
        }

        let got = seen
            .iter()
            .find(|r| r.uri.contains("widgets"))
            .expect("forwarded");
        assert_eq!(got.method, "GET");
        assert_eq!(
            got.version,
            http::Version::HTTP_2,
            "h2 when the backend offers it"
        );
        assert_eq!(
            got.uri,
            "/apis/example.com/v1/namespaces/ns1/widgets?limit=1"
        );
        assert_eq!(got.client_cn, "front-proxy-client");
        let h = &got.headers;
        assert_eq!(values(h, "x-remote-user"), vec!["alice"]);
        assert_eq!(values(h, "x-remote-uid"), vec!["alice-uid"]);
        assert_eq!(
            values(h, "x-remote-group"),
            vec!["developers", "system:authenticated"]
        );
        assert_eq!(
            values(h, "x-remote-extra-acme.com%2fproject"),
            vec!["p1", "p2"]
        );
        assert!(h.get(header::AUTHORIZATION).is_none());
        assert!(h.get("impersonate-user").is_none());
        assert_eq!(values(h, "accept"), vec![accept]);
        assert_eq!(values(h, "kubectl-command"), vec!["kubectl get"]);
        assert_eq!(
            values(h, "x-forwarded-uri"),
            vec!["/apis/example.com/v1/namespaces/ns1/widgets"]
        );
        assert_eq!(values(h, "x-forwarded-proto"), vec!["https"]);
        assert_eq!(values(h, "x-forwarded-host"), vec!["devcluster.local:6443"]);
        assert_eq!(values(h, "x-forwarded-for"), vec!["127.0.0.1"]);
        assert_eq!(
            got.authority,
            format!("127.0.0.1:{}", s.backend.addr.port())
        );
        assert_eq!(values(h, "audit-id").len(), 1);
    })
    .await
    .expect("test timed out");
}

/// The backend's answers come back marked [`Relayed`] (for the upgrade kind when
/// the request was an upgrade), the aggregator's own answers unmarked, and a
/// caller's `Audit-Id` reaches the backend as it was sent (the server in front
/// sets it to its own audit ID).
#[tokio::test]
async fn backend_answers_are_marked_relayed_and_keep_the_audit_id() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let s = setup(false).await;
        s.agg.check_availability().await;
        let route = s.agg.route("/apis/example.com/v1").expect("route");
        let request = |uri: &str, upgrade: bool| {
            let mut builder = Request::builder().uri(uri).header("audit-id", "front-id");
            if upgrade {
                builder = builder
                    .header(header::CONNECTION, "Upgrade")
                    .header(header::UPGRADE, "test-proto");
            }
            builder.body(Full::new(Bytes::new())).expect("request")
        };
        let resp = s
            .agg
            .proxy(
                route.clone(),
                request("/apis/example.com/v1/namespaces/ns1/widgets", false),
                &alice(),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.extensions().get::<Relayed>(), Some(&Relayed::Answer));
        let seen = s.backend.seen();
        let got = seen
            .iter()
            .find(|r| r.uri.contains("widgets"))
            .expect("forwarded");
        assert_eq!(values(&got.headers, "audit-id"), vec!["front-id"]);

        let resp = s
            .agg
            .proxy(route.clone(), request("/upgrade", true), &alice())
            .await;
        assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(resp.extensions().get::<Relayed>(), Some(&Relayed::Upgrade));

        // Not Available any more: the aggregator's own 503.
        let refused = test_support::RefusedPort::bind();
        s.view
            .set_external_service("ns1", "widgets", refused.addr.port());
        s.agg.check_availability().await;
        let resp = s
            .agg
            .proxy(
                route,
                request("/apis/example.com/v1/namespaces/ns1/widgets", false),
                &alice(),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.extensions().get::<Relayed>(), None);
    })
    .await
    .expect("test timed out");
}

/// An upgrade the backend does not take, as kube's UpgradeAwareHandler
/// (`tryUpgrade`) and the aggregator's responder answer it: any status below
/// 400 but 101 becomes the aggregator's own 503 from `http.Error` (unmarked, so
/// the server in front puts its headers on it), and an error answer goes to the
/// caller as the backend sent it.
#[tokio::test]
async fn an_upgrade_the_backend_does_not_take_is_refused_or_passed_on() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let s = setup(false).await;
        s.agg.check_availability().await;
        let route = s.agg.route("/apis/example.com/v1").expect("route");
        for code in [200u16, 204, 302, 400, 403, 500, 503] {
            let request = Request::builder()
                .uri(format!("/status/{code}"))
                .header(header::CONNECTION, "Upgrade")
                .header(header::UPGRADE, "test-proto")
                .body(Full::new(Bytes::new()))
                .expect("request");
            let resp = s.agg.proxy(route.clone(), request, &alice()).await;
            let relayed = resp.extensions().get::<Relayed>().copied();
            let (parts, body) = resp.into_parts();
            let body = body.collect().await.expect("body").to_bytes();
            let body = String::from_utf8_lossy(&body);
            if code < 400 {
                assert_eq!(parts.status, StatusCode::SERVICE_UNAVAILABLE, "{code}");
                assert_eq!(relayed, None, "{code}");
                assert_eq!(
                    values(&parts.headers, "content-type"),
                    vec!["text/plain; charset=utf-8"],
                    "{code}"
                );
                assert_eq!(
                    values(&parts.headers, "x-content-type-options"),
                    vec!["nosniff"],
                    "{code}"
                );
                assert_eq!(
                    body,
                    format!("invalid upgrade response: status code {code}\n")
                );
            } else {
                assert_eq!(parts.status.as_u16(), code);
                assert_eq!(relayed, Some(Relayed::Upgrade), "{code}");
                assert_eq!(
                    values(&parts.headers, "content-type"),
                    vec!["text/plain"],
                    "{code}"
                );
                assert_eq!(body, format!("backend says {code}\n"));
            }
        }
    })
    .await
    .expect("test timed out");
}

/// A GET of `path` through the front, on a new caller connection.
async fn get_via(front: SocketAddr, path: &str) -> Response<Incoming> {
    let req = Request::builder()
        .uri(path)
        .body(Full::new(Bytes::new()))
        .expect("request");
    client(front)
        .await
        .send_request(req)
        .await
        .expect("response")
}

/// Sends `count` GETs through the front, each on a new caller connection, and
/// returns how many backend connections they opened. The availability check (which
/// dials on its own, as kube's does) runs first, so its connections do not count.
async fn connections_for_gets(s: &Setup, backend: &Backend, count: usize) -> usize {
    s.agg.check_availability().await;
    let before = backend.connections();
    for _ in 0..count {
        let resp = get_via(s.front, "/apis/example.com/v1/namespaces/ns1/widgets").await;
        assert_eq!(resp.status(), StatusCode::OK);
    }
    backend.connections() - before
}

#[tokio::test]
async fn an_http2_backend_connection_is_kept_for_later_requests() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let s = setup(false).await;
        assert_eq!(connections_for_gets(&s, &s.backend, 3).await, 1);
        // Another backend for the same APIService is another connection, kept too,
        // and the first backend sees nothing more.
        let second = start_backend(&s.pki, "example.com", false).await;
        s.view
            .set_external_service("ns1", "widgets", second.addr.port());
        let first_before = s.backend.connections();
        assert_eq!(connections_for_gets(&s, &second, 2).await, 1);
        assert_eq!(s.backend.connections(), first_before);
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn a_kept_connection_the_backend_closed_is_replaced() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let s = setup(false).await;
        assert_eq!(connections_for_gets(&s, &s.backend, 1).await, 1);
        s.backend.drop_connections();
        // Bounded: 5 s for the aggregator's side to see the close.
        let mut closed = false;
        for _ in 0..100 {
            closed = s
                .agg
                .backends
                .lock()
                .expect("lock")
                .values()
                .all(|kept| kept.is_closed());
            if closed {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(closed, "the kept connection never closed");
        // The next requests get 200 on one new connection, kept again.
        assert_eq!(connections_for_gets(&s, &s.backend, 2).await, 1);
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn an_http1_backend_gets_a_connection_per_request() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // The aggregated-discovery backend speaks HTTP/1.1 only.
        let s = setup(true).await;
        assert_eq!(connections_for_gets(&s, &s.backend, 2).await, 2);
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn request_bodies_are_forwarded() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let s = setup(false).await;
        s.agg.check_availability().await;
        let req = Request::builder()
            .method("POST")
            .uri("/apis/example.com/v1/namespaces/ns1/widgets")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from_static(b"{\"kind\":\"Widget\"}")))
            .expect("request");
        let resp = client(s.front)
            .await
            .send_request(req)
            .await
            .expect("response");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let v: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["body"], "{\"kind\":\"Widget\"}");
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn unreachable_backend_is_unavailable_and_requests_get_503() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let s = setup(false).await;
        // A port nothing listens on.
        let refused = test_support::RefusedPort::bind();
        let port = refused.addr.port();
        s.view.set_external_service("ns1", "widgets", port);
        s.agg.check_availability().await;
        let cond = s.view.condition("v1.example.com");
        assert_eq!(cond["status"], "False", "{cond}");
        assert_eq!(cond["reason"], "FailedDiscoveryCheck");
        let message = cond["message"].as_str().unwrap_or_default();
        assert!(message.contains("connection refused"), "{message}");
        assert!(
            message.starts_with(&format!(
                "failing or missing response from https://127.0.0.1:{port}/apis/example.com/v1"
            )),
            "{message}"
        );

        let resp = get_via(s.front, "/apis/example.com/v1/widgets").await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"service unavailable\n");
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn watch_events_stream_before_the_backend_finishes() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let s = setup(false).await;
        s.agg.check_availability().await;
        let resp = get_via(
            s.front,
            "/apis/example.com/v1/namespaces/ns1/widgets?watch=true",
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body();
        // The backend holds the second event until released: the first must arrive
        // on its own.
        let first = body.frame().await.expect("frame").expect("ok");
        let first = first.into_data().expect("data");
        assert_eq!(&first[..], b"{\"type\":\"ADDED\"}\n");
        s.backend.release_watch.notify_one();
        let rest = body.collect().await.expect("rest").to_bytes();
        assert_eq!(&rest[..], b"{\"type\":\"MODIFIED\"}\n");
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn upgrades_are_bridged() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let s = setup(false).await;
        s.agg.check_availability().await;
        // Real requests stay under the group path; the test backend upgrades at
        // `/upgrade`, so a front server forwards everything on the APIService's route.
        let route = s.agg.route("/apis/example.com/v1").expect("route");
        let front = {
            let agg = s.agg.clone();
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            tokio::spawn(async move {
                if let Ok((tcp, _)) = listener.accept().await {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let (agg, route) = (agg.clone(), route.clone());
                        async move { Ok::<_, Infallible>(agg.proxy(route, req, &alice()).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .with_upgrades()
                        .await;
                }
            });
            addr
        };
        let req = Request::builder()
            .uri("/upgrade")
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "test-proto")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let resp = client(front)
            .await
            .send_request(req)
            .await
            .expect("response");
        assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
        let upgraded = hyper::upgrade::on(resp).await.expect("upgraded");
        let mut io = TokioIo::new(upgraded);
        io.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        io.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"ping");
        let seen = s.backend.seen();
        let up = seen
            .iter()
            .find(|r| r.uri == "/upgrade")
            .expect("upgrade request");
        assert_eq!(values(&up.headers, "upgrade"), vec!["test-proto"]);
        assert_eq!(up.version, http::Version::HTTP_11, "upgrades need HTTP/1.1");
        assert_eq!(values(&up.headers, "x-remote-user"), vec!["alice"]);
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn discovery_falls_back_to_legacy_and_merges_groups() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let s = setup(false).await;
        // A second group whose backend serves aggregated discovery.
        let other = start_backend(&s.pki, "other.io", true).await;
        s.view.add_apiservice("other.io", Some(("ns1", "gadgets")), &s.pki.serving_ca);
        s.view.services.lock().expect("lock").insert(
            ("ns1".into(), "gadgets".into()),
            json!({"spec": {"type": "ExternalName", "externalName": "127.0.0.1"}}),
        );
        for a in s.view.apiservices.lock().expect("lock").iter_mut() {
            if a["spec"]["group"] == "other.io" {
                a["spec"]["service"]["port"] = json!(other.addr.port());
            }
        }
        // A local APIService is not proxied and not listed here.
        s.view.add_apiservice("apps", None, &s.pki.serving_ca);
        assert!(s.agg.route("/apis/apps/v1/deployments").is_none());

        s.agg.check_availability().await;
        s.agg.refresh_discovery().await;

        let legacy: Vec<String> = s.agg.discovery_groups().iter().map(|g| g["name"].as_str().unwrap_or_default().to_string()).collect();
        assert_eq!(legacy, vec!["example.com", "other.io"]);
        assert_eq!(
            s.agg.discovery_groups()[0],
            json!({"name": "example.com", "versions": [{"groupVersion": "example.com/v1", "version": "v1"}],
                   "preferredVersion": {"groupVersion": "example.com/v1", "version": "v1"}})
        );
        assert_eq!(s.agg.group_discovery("other.io").expect("group")["kind"], "APIGroup");

        let aggregated = s.agg.aggregated_discovery();
        assert_eq!(aggregated.len(), 2, "{aggregated:?}");
        let example = &aggregated[0];
        assert_eq!(example["metadata"]["name"], "example.com");
        let widgets = &example["versions"][0]["resources"][0];
        assert_eq!(widgets["resource"], "widgets");
        assert_eq!(widgets["scope"], "Namespaced");
        assert_eq!(widgets["responseKind"], json!({"group": "example.com", "version": "v1", "kind": "Widget"}));
        assert_eq!(widgets["shortNames"], json!(["wd"]));
        assert_eq!(widgets["subresources"][0]["subresource"], "status");
        assert_eq!(example["versions"][0]["freshness"], "Current");
        assert_eq!(aggregated[1]["versions"][0]["resources"][0]["resource"], "gadgets");

        // The legacy backend saw /apis with the aggregated Accept, then the
        // group-version document without a group header.
        let seen = s.backend.seen();
        let apis = seen.iter().find(|r| r.uri == "/apis").expect("/apis fetched");
        assert_eq!(values(&apis.headers, "accept"), vec![AGGREGATED_DISCOVERY_ACCEPT]);
        let legacy_fetch = seen
            .iter()
            .filter(|r| r.uri == "/apis/example.com/v1")
            .find(|r| r.headers.get("x-remote-group").is_none())
            .expect("legacy fetch");
        assert_eq!(values(&legacy_fetch.headers, "accept"), vec!["application/json"]);
        assert_eq!(values(&legacy_fetch.headers, "x-remote-user"), vec!["system:kube-aggregator"]);
        // OpenAPI is polled as system:aggregator, without groups.
        let v2 = seen.iter().find(|r| r.uri == "/openapi/v2").expect("openapi v2");
        assert_eq!(values(&v2.headers, "x-remote-user"), vec!["system:aggregator"]);
        assert_eq!(values(&v2.headers, "accept"), vec!["application/json"]);
        assert!(v2.headers.get("x-remote-group").is_none());
        let v3 = seen.iter().find(|r| r.uri == "/openapi/v3").expect("openapi v3");
        assert!(v3.headers.get(header::ACCEPT).is_none());
        // The HTTP/1.1-only backend was reached over HTTP/1.1.
        assert!(other.seen().iter().all(|r| r.version == http::Version::HTTP_11));
        // The aggregated backend was not asked for the legacy document by the fetcher.
        assert!(other
            .seen()
            .iter()
            .all(|r| r.uri != "/apis/other.io/v1" || r.headers.get("x-remote-group").is_some()));

        // When the backend goes away, its discovery is kept but marked stale.
        let refused = test_support::RefusedPort::bind();
        let port = refused.addr.port();
        s.view.set_external_service("ns1", "widgets", port);
        s.agg.check_availability().await;
        s.agg.refresh_discovery().await;
        assert_eq!(s.agg.aggregated_discovery()[0]["versions"][0]["freshness"], "Stale");
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn availability_reasons_for_services_and_endpoints() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let s = setup(false).await;
        s.view.add_apiservice("local.io", None, &s.pki.serving_ca);
        s.view.add_apiservice("missing.io", Some(("ns1", "nope")), &s.pki.serving_ca);
        s.view.add_apiservice("slices.io", Some(("ns1", "sliced")), &s.pki.serving_ca);
        let port = s.backend.addr.port();
        let check = |reason: &str, status: &str, name: &str| {
            let cond = s.view.condition(name);
            assert_eq!((cond["reason"].as_str(), cond["status"].as_str()), (Some(reason), Some(status)), "{name}: {cond}");
            cond["message"].as_str().unwrap_or_default().to_string()
        };

        s.view.services.lock().expect("lock").insert(
            ("ns1".into(), "sliced".into()),
            json!({"spec": {"type": "ClusterIP", "ports": [{"name": "https", "port": 443, "targetPort": port}]}}),
        );
        s.agg.check_availability().await;
        assert_eq!(check("Local", "True", "v1.local.io"), "Local APIServices are always available");
        assert_eq!(check("ServiceNotFound", "False", "v1.missing.io"), "service/nope in \"ns1\" is not present");
        assert_eq!(check("EndpointsNotFound", "False", "v1.slices.io"), "cannot find endpoints for service/sliced in \"ns1\"");

        let slice = |ready: bool| {
            json!({"endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready}}],
                   "ports": [{"name": "https", "port": port, "protocol": "TCP"}]})
        };
        s.view.slices.lock().expect("lock").insert(("ns1".into(), "sliced".into()), vec![slice(false)]);
        s.agg.check_availability().await;
        assert_eq!(
            check("MissingEndpoints", "False", "v1.slices.io"),
            "endpoints for service/sliced in \"ns1\" have no addresses with port name \"https\""
        );

        s.view.slices.lock().expect("lock").insert(("ns1".into(), "sliced".into()), vec![slice(true)]);
        s.agg.check_availability().await;
        assert_eq!(check("Passed", "True", "v1.slices.io"), "all checks passed");
        // Routed through the endpoint too.
        let resp = get_via(s.front, "/apis/slices.io/v1/things").await;
        assert_eq!(resp.status(), StatusCode::OK);

        // A wrong CA fails the TLS check.
        let stranger = CertificateAuthority::generate("stranger").expect("ca");
        for a in s.view.apiservices.lock().expect("lock").iter_mut() {
            if a["spec"]["group"] == "slices.io" {
                a["spec"]["caBundle"] = json!(base64::engine::general_purpose::STANDARD.encode(stranger.pem().cert.as_bytes()));
            }
        }
        s.agg.check_availability().await;
        let message = check("FailedDiscoveryCheck", "False", "v1.slices.io");
        assert!(message.contains("tls"), "{message}");
        // ... unless verification is skipped.
        for a in s.view.apiservices.lock().expect("lock").iter_mut() {
            if a["spec"]["group"] == "slices.io" {
                a["spec"]["insecureSkipTLSVerify"] = json!(true);
            }
        }
        s.agg.check_availability().await;
        check("Passed", "True", "v1.slices.io");
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn controllers_react_to_changes() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let s = setup(false).await;
        let handle = s.agg.spawn_controllers();
        // The first pass runs at start.
        for _ in 0..100 {
            if s.view.condition("v1.example.com")["status"] == "True" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(s.view.condition("v1.example.com")["status"], "True");
        // Break the Service and announce the change: noticed well before 30 s.
        s.view.services.lock().expect("lock").clear();
        let _ = s.view.changes.send(());
        for _ in 0..100 {
            if s.view.condition("v1.example.com")["reason"] == "ServiceNotFound" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            s.view.condition("v1.example.com")["reason"],
            "ServiceNotFound"
        );
        handle.abort();
    })
    .await
    .expect("test timed out");
}

/// A backend that is down when the controllers start (a restarted proxy whose
/// APIService survived in the store) is found again by the retries kube's work
/// queue makes after a failed check — well before the 30 s resync — and its
/// discovery is fetched as soon as it is Available, with no store change at all.
#[tokio::test]
async fn a_backend_that_starts_late_is_found_without_a_store_change() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let pki = pki();
        let refused = test_support::RefusedPort::bind();
        let addr = refused.addr;
        let view = FakeView::new();
        view.add_apiservice("example.com", Some(("ns1", "widgets")), &pki.serving_ca);
        view.set_external_service("ns1", "widgets", addr.port());
        let client_pem = pki
            .front_proxy_ca
            .issue_client(FRONT_PROXY_CLIENT_NAME, &[])
            .expect("client cert");
        let agg = Aggregator::new(view.clone(), client_pem).expect("aggregator");
        let handle = agg.spawn_controllers();
        for _ in 0..100 {
            if view.condition("v1.example.com")["reason"] == "FailedDiscoveryCheck" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let cond = view.condition("v1.example.com");
        assert!(
            cond["message"]
                .as_str()
                .unwrap_or_default()
                .contains("connection refused"),
            "{cond}"
        );
        let _backend = start_backend_on(&pki, "example.com", false, refused.listen()).await;
        // Bounded: 8 s is far below the 30 s resync the fix must not rely on.
        let mut listed = false;
        for _ in 0..400 {
            listed = view.condition("v1.example.com")["status"] == "True"
                && agg
                    .aggregated_discovery()
                    .iter()
                    .any(|g| g["metadata"]["name"] == "example.com");
            if listed {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            listed,
            "still {} and discovery {:?}",
            view.condition("v1.example.com"),
            agg.aggregated_discovery()
        );
        handle.abort();
    })
    .await
    .expect("test timed out");
}

#[test]
fn routes_and_helpers() {
    let view = FakeView::new();
    let ca = CertificateAuthority::generate("ca").expect("ca");
    view.add_apiservice("example.com", Some(("ns1", "widgets")), &ca);
    let client_pem = ca
        .issue_client(FRONT_PROXY_CLIENT_NAME, &[])
        .expect("client");
    let agg = Aggregator::new(view, client_pem).expect("aggregator");
    let expected = Some(Route {
        apiservice: "v1.example.com".into(),
        group: "example.com".into(),
        version: "v1".into(),
    });
    assert_eq!(agg.route("/apis/example.com/v1"), expected);
    assert_eq!(
        agg.route("/apis/example.com/v1/namespaces/a/widgets/b"),
        expected
    );
    assert_eq!(agg.route("/apis/example.com/v2/widgets"), None);
    assert_eq!(agg.route("/apis/example.com"), None);
    assert_eq!(agg.route("/api/v1/pods"), None);

    assert_eq!(escape_extra_key("acme.com/project"), "acme.com%2fproject");
    assert_eq!(escape_extra_key("a%b c"), "a%25b%20c");

    let mut versions = vec![
        "v1beta1", "v2", "v1", "v1alpha1", "foo", "v2beta2", "v1beta2",
    ];
    versions.sort_by(|a, b| compare_kube_versions(a, b));
    assert_eq!(
        versions,
        vec!["v2", "v1", "v2beta2", "v1beta2", "v1beta1", "v1alpha1", "foo"]
    );

    let bad = Aggregator::new(
        FakeView::new(),
        CertPem {
            cert: "nope".into(),
            key: "nope".into(),
        },
    );
    assert!(matches!(bad, Err(AggregationError::ClientCertificate(_))));
}

#[test]
fn extension_apiserver_authentication_keys() {
    let cm = extension_apiserver_authentication_configmap("FRONT", "CLIENT");
    assert_eq!(
        cm["metadata"],
        json!({"name": "extension-apiserver-authentication", "namespace": "kube-system"})
    );
    assert_eq!(
        cm["data"],
        json!({
            "client-ca-file": "CLIENT",
            "requestheader-allowed-names": "[\"front-proxy-client\"]",
            "requestheader-client-ca-file": "FRONT",
            "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
            "requestheader-group-headers": "[\"X-Remote-Group\"]",
            "requestheader-username-headers": "[\"X-Remote-User\"]",
        })
    );
}

/// A backend that accepts TCP and then says nothing: the probe gives up after the
/// 5 s limit (paused time, so no real waiting) and the APIService is unavailable.
#[tokio::test(start_paused = true)]
async fn silent_backend_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let held = Arc::new(StdMutex::new(Vec::new()));
    let held2 = held.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            held2.lock().expect("lock").push(tcp);
        }
    });
    let view = FakeView::new();
    let ca = CertificateAuthority::generate("ca").expect("ca");
    view.add_apiservice("example.com", Some(("ns1", "widgets")), &ca);
    view.set_external_service("ns1", "widgets", port);
    let client_pem = ca
        .issue_client(FRONT_PROXY_CLIENT_NAME, &[])
        .expect("client");
    let agg = Aggregator::new(view.clone(), client_pem).expect("aggregator");
    agg.check_availability().await;
    let cond = view.condition("v1.example.com");
    assert_eq!(cond["reason"], "FailedDiscoveryCheck", "{cond}");
    let message = cond["message"].as_str().unwrap_or_default();
    assert!(message.contains("Client.Timeout exceeded"), "{message}");
}

/// A store change refetches discovery only where something changed; the periodic
/// refresh always refetches.
#[tokio::test]
async fn change_triggered_discovery_refetches_only_what_changed() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let s = setup(false).await;
        let apis_fetches = || s.backend.seen().iter().filter(|r| r.uri == "/apis").count();
        s.agg.check_availability().await;
        s.agg.refresh_changed_discovery().await;
        assert_eq!(apis_fetches(), 1, "missing entry is fetched");
        s.agg.refresh_changed_discovery().await;
        assert_eq!(apis_fetches(), 1, "nothing changed");
        for a in s.view.apiservices.lock().expect("lock").iter_mut() {
            a["spec"]["versionPriority"] = json!(20);
        }
        s.agg.refresh_changed_discovery().await;
        assert_eq!(apis_fetches(), 2, "spec changed");
        s.agg.refresh_discovery().await;
        assert_eq!(apis_fetches(), 3, "periodic refresh");
        // A deleted APIService leaves discovery.
        s.view.apiservices.lock().expect("lock").clear();
        s.agg.refresh_changed_discovery().await;
        assert!(s.agg.aggregated_discovery().is_empty());
    })
    .await
    .expect("test timed out");
}
