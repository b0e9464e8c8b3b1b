//! The aggregation layer through the real server and real kubectl: a tiny HTTPS
//! backend registered by an APIService receives the caller's identity in
//! `X-Remote-*` headers over a front-proxy client certificate that chains to the CA
//! published in `kube-system/extension-apiserver-authentication`, and never the
//! caller's own credentials.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};

use crproxy_core::pki::CertificateAuthority;

use crate::raw_http::{admin_request, values, Protocol};

/// How many bytes the backend answers a Range request with.
const RANGE_LEN: usize = 10;

/// What the backend saw of one request.
#[derive(Clone, Debug, Default)]
struct Seen {
    path: String,
    headers: http::HeaderMap,
    client_cert: bool,
}

/// An HTTPS backend that requires a client certificate signed by `client_ca_pem`
/// and answers discovery for `test.io/v1` plus an empty list of things.
async fn backend(client_ca_pem: &str) -> (std::net::SocketAddr, String, Arc<Mutex<Vec<Seen>>>) {
    let ca = CertificateAuthority::generate("backend-ca").expect("ca");
    let serving = ca
        .issue_server(&["things-backend.kube-system.svc"], &[])
        .expect("serving cert");
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("root");
    }
    let provider = Arc::new(crproxy_kube::crypto_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .expect("verifier");
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(serving.cert.as_bytes()).expect("cert")],
            PrivateKeyDer::from_pem_slice(serving.key.as_bytes()).expect("key"),
        )
        .expect("tls");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let client_cert = tls.get_ref().1.peer_certificates().is_some();
                let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let log = Arc::clone(&log);
                    async move {
                        log.lock().expect("log").push(Seen {
                            path: request.uri().path().to_string(),
                            headers: request.headers().clone(),
                            client_cert,
                        });
                        let body = if request.uri().path() == "/apis/test.io/v1" {
                            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "test.io/v1",
                                   "resources": [{"name": "things", "singularName": "thing", "namespaced": true,
                                                  "kind": "Thing", "verbs": ["get", "list"]}]})
                        } else {
                            json!({"kind": "ThingList", "apiVersion": "test.io/v1", "metadata": {}, "items": []})
                        }
                        .to_string();
                        // A Range request gets its first bytes only, as Go's
                        // http.ServeContent answers one: 206 with Content-Range.
                        if request.headers().contains_key("range") {
                            let total = body.len();
                            return Ok::<_, Infallible>(
                                http::Response::builder()
                                    .status(206)
                                    .header("content-type", "application/json")
                                    .header(
                                        "content-range",
                                        format!("bytes 0-{}/{total}", RANGE_LEN - 1),
                                    )
                                    .body(Full::new(Bytes::from(body[..RANGE_LEN].to_string())))
                                    .expect("response"),
                            );
                        }
                        Ok::<_, Infallible>(
                            http::Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(body)))
                                .expect("response"),
                        )
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, ca.pem().cert.clone(), seen)
}

/// Starts [`backend`] and registers it for `test.io/v1` (an ExternalName Service
/// and an APIService), as an operator would with kubectl.
async fn serve_test_io(test: &test_support::TestCluster) -> Arc<Mutex<Vec<Seen>>> {
    let admin = &test.kubeconfig;
    let published = test_support::kubectl_json_async(
        admin,
        &[
            "-n",
            "kube-system",
            "get",
            "configmap",
            "extension-apiserver-authentication",
            "-o",
            "json",
        ],
    )
    .await
    .expect("published front-proxy settings");
    let front_proxy_ca = published["data"]["requestheader-client-ca-file"]
        .as_str()
        .expect("requestheader-client-ca-file")
        .to_string();
    let (addr, backend_ca, seen_log) = backend(&front_proxy_ca).await;

    use base64::Engine;
    let service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "things-backend", "namespace": "kube-system"},
        "spec": {"type": "ExternalName", "externalName": "localhost",
                 "ports": [{"port": addr.port(), "protocol": "TCP"}]}});
    let apiservice = json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1.test.io"},
        "spec": {"group": "test.io", "version": "v1", "groupPriorityMinimum": 1000, "versionPriority": 15,
                 "service": {"namespace": "kube-system", "name": "things-backend", "port": addr.port()},
                 "caBundle": base64::engine::general_purpose::STANDARD.encode(&backend_ca)}});
    for manifest in [service, apiservice] {
        let created = test_support::kubectl_stdin_async(
            admin,
            &["create", "-f", "-"],
            &manifest.to_string(),
            Duration::from_secs(30),
        )
        .await;
        assert!(created.success(), "{}", created.stderr);
    }
    seen_log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_requests_reach_the_backend_as_the_caller_over_the_front_proxy() {
    let test = test_support::devcluster("aggregation").await;
    let admin = &test.kubeconfig;
    let seen_log = serve_test_io(&test).await;

    // A user with rights to list things, identified by token, with an extra.
    let alice = test
        .kubeconfig_for("alice", &["developers"])
        .expect("alice");
    let grant = test_support::kubectl_async(
        admin,
        &[
            "create",
            "clusterrolebinding",
            "alice-things",
            "--clusterrole=cluster-admin",
            "--user=alice",
        ],
    )
    .await;
    assert!(grant.success(), "{}", grant.stderr);
    let alice_kubeconfig = &alice;
    let listed = crate::poll(crate::Polling::USUAL, move || async move {
        let out = test_support::kubectl_async(
            alice_kubeconfig,
            &["get", "--raw", "/apis/test.io/v1/namespaces/default/things"],
        )
        .await;
        out.success().then_some(out.stdout)
    })
    .await;
    let listed: Value =
        serde_json::from_str(&listed.expect("the aggregated list answers")).expect("json");
    assert_eq!(listed["kind"], "ThingList");

    let seen = seen_log.lock().expect("log").clone();
    let request = seen
        .iter()
        .find(|s| s.path == "/apis/test.io/v1/namespaces/default/things")
        .expect("the backend saw the request");
    assert!(
        request.client_cert,
        "the front proxy presented a client certificate"
    );
    assert_eq!(values(&request.headers, "x-remote-user"), ["alice"]);
    let groups = values(&request.headers, "x-remote-group");
    assert!(groups.contains(&"developers"), "{groups:?}");
    assert!(groups.contains(&"system:authenticated"), "{groups:?}");
    assert!(
        values(&request.headers, "authorization").is_empty(),
        "caller credentials leak"
    );
    assert_eq!(
        values(&request.headers, "x-forwarded-uri"),
        ["/apis/test.io/v1/namespaces/default/things"]
    );

    // A user without rights never reaches the backend. (The aggregator's own
    // discovery checks keep arriving meanwhile, as themselves.)
    let mallory = test.kubeconfig_for("mallory", &[]).expect("mallory");
    let denied = test_support::kubectl_async(
        &mallory,
        &["get", "--raw", "/apis/test.io/v1/namespaces/default/things"],
    )
    .await;
    assert!(!denied.success());
    assert!(
        denied.stderr.contains("Forbidden") || denied.stderr.contains("forbidden"),
        "{}",
        denied.stderr
    );
    let as_mallory = seen_log
        .lock()
        .expect("log")
        .iter()
        .filter(|s| values(&s.headers, "x-remote-user") == ["mallory"])
        .count();
    assert_eq!(as_mallory, 0, "a forbidden request must not be forwarded");
}

/// kube-aggregator proxies `/apis/<group>/<version>` itself (not only what is
/// under it) to the backend, and its reverse proxy passes the backend's status,
/// headers and body through, whatever the status: here a 206 Partial Content
/// answering a Range request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_group_version_document_passes_the_backends_status_through() {
    let test = test_support::devcluster("aggregation-passthrough").await;
    let seen_log = serve_test_io(&test).await;
    // Until the APIService is Available the aggregator answers 503 itself.
    let available = test_support::kubectl_async(
        &test.kubeconfig,
        &[
            "wait",
            "--for=condition=Available",
            "--timeout=20s",
            "apiservice/v1.test.io",
        ],
    )
    .await;
    assert!(available.success(), "{available:?}");
    let (status, headers, body) = admin_request(
        &test,
        "GET",
        "/apis/test.io/v1",
        &[("range", "bytes=0-9")],
        Protocol::Http1,
    )
    .await;
    let forwarded = seen_log
        .lock()
        .expect("log")
        .iter()
        .any(|s| s.path == "/apis/test.io/v1" && values(&s.headers, "range") == ["bytes=0-9"]);
    assert!(forwarded, "the Range header reaches the backend");
    assert_eq!(status, http::StatusCode::PARTIAL_CONTENT, "{body:?}");
    let content_range = headers
        .get("content-range")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(
        content_range.starts_with(&format!("bytes 0-{}/", RANGE_LEN - 1)),
        "{content_range:?}"
    );
    let (_, _, whole) = admin_request(&test, "GET", "/apis/test.io/v1", &[], Protocol::Http1).await;
    assert_eq!(body, whole.slice(..RANGE_LEN));
}
