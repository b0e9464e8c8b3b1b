use super::*;

use std::convert::Infallible;

use crproxy_core::pki::CertificateAuthority;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A TLS server on 127.0.0.1 that answers every request with what it saw:
/// `authorization|x-remote-user|groups|client-cert|http-version|method path`.
struct EchoServer {
    addr: SocketAddr,
    server_ca: String,
    client_ca: CertificateAuthority,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn echo_server() -> EchoServer {
    crproxy_kube::install_crypto_provider();
    let server_ca = CertificateAuthority::generate("echo-ca").expect("ca");
    let leaf = server_ca
        .issue_server(&["localhost"], &["127.0.0.1".parse().expect("ip")])
        .expect("leaf");
    let client_ca = CertificateAuthority::generate("front-proxy-ca").expect("ca");
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(client_ca.pem().cert.as_bytes()) {
        roots.add(cert.expect("pem")).expect("root");
    }
    let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
        .allow_unauthenticated()
        .build()
        .expect("verifier");
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(leaf.cert.as_bytes())
        .collect::<Result<_, _>>()
        .expect("chain");
    let key = PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).expect("key");
    let mut config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("server config");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let has_cert = tls.get_ref().1.peer_certificates().is_some();
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let header = |name: &str| {
                        request
                            .headers()
                            .get_all(name)
                            .iter()
                            .filter_map(|v| v.to_str().ok())
                            .collect::<Vec<_>>()
                            .join(",")
                    };
                    let text = format!(
                        "{}|{}|{}|{}|{:?}|{} {}",
                        header("authorization"),
                        header("x-remote-user"),
                        header("x-remote-group"),
                        has_cert,
                        request.version(),
                        request.method(),
                        request.uri().path(),
                    );
                    async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text)))) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    EchoServer {
        addr,
        server_ca: server_ca.pem().cert.clone(),
        client_ca,
        task,
    }
}

async fn echo(endpoint: &Endpoint, method: Method, path: &str) -> String {
    let mut sender = endpoint.connect().await.expect("connect");
    let request = endpoint.request(method, path, None).expect("request");
    let answer = exchange(&mut sender, request, true)
        .await
        .expect("exchange");
    assert_eq!(answer.status, StatusCode::OK);
    let body = answer.body.expect("kept body");
    assert_eq!(answer.bytes, body.len() as u64);
    String::from_utf8(body.to_vec()).expect("utf8")
}

#[tokio::test]
async fn bearer_identity_over_both_protocols() {
    let server = echo_server().await;
    let identity = Identity::Bearer("t0ken".into());
    for (protocol, version) in [(Protocol::Http2, "HTTP/2.0"), (Protocol::Http1, "HTTP/1.1")] {
        let endpoint = Endpoint::new(
            "direct",
            server.addr,
            Some(&server.server_ca),
            &identity,
            protocol,
        )
        .expect("endpoint");
        let seen = echo(&endpoint, Method::GET, "/apis/example.com/v1").await;
        assert_eq!(
            seen,
            format!("Bearer t0ken|||false|{version}|GET /apis/example.com/v1")
        );
    }
}

#[tokio::test]
async fn front_proxy_identity_presents_the_certificate_and_headers() {
    let server = echo_server().await;
    let cert = server
        .client_ca
        .issue_client("front-proxy-client", &[])
        .expect("client cert");
    let identity = Identity::FrontProxy {
        cert,
        user: "bench".into(),
        groups: vec!["system:masters".into(), "system:authenticated".into()],
    };
    let endpoint =
        Endpoint::new("crproxy", server.addr, None, &identity, Protocol::Http2).expect("endpoint");
    let seen = echo(&endpoint, Method::DELETE, "/x").await;
    assert_eq!(
        seen,
        "|bench|system:masters,system:authenticated|true|HTTP/2.0|DELETE /x"
    );
}

#[tokio::test]
async fn an_untrusted_server_is_refused() {
    let server = echo_server().await;
    let other = CertificateAuthority::generate("other").expect("ca");
    let endpoint = Endpoint::new(
        "direct",
        server.addr,
        Some(&other.pem().cert),
        &Identity::Bearer("x".into()),
        Protocol::Http2,
    )
    .expect("endpoint");
    assert!(matches!(
        endpoint.connect().await,
        Err(DriverError::Connect { .. })
    ));
}

#[tokio::test]
async fn http2_workers_share_connections_by_the_hundred() {
    let server = echo_server().await;
    let identity = Identity::Bearer("x".into());
    let h2 = Endpoint::new(
        "d",
        server.addr,
        Some(&server.server_ca),
        &identity,
        Protocol::Http2,
    )
    .expect("endpoint");
    let senders = h2.senders(150).await.expect("senders");
    assert_eq!(senders.len(), 150);
    let h1 = Endpoint::new(
        "d",
        server.addr,
        Some(&server.server_ca),
        &identity,
        Protocol::Http1,
    )
    .expect("endpoint");
    assert_eq!(h1.senders(3).await.expect("senders").len(), 3);
}

struct Counting;

impl Workload for Counting {
    type State = usize;
    fn request(
        &self,
        endpoint: &Endpoint,
        _worker: usize,
        seq: usize,
        state: &mut usize,
    ) -> Result<Request<Body>, DriverError> {
        *state += 1;
        // Every fifth request "fails" by asking for a path the check rejects.
        let path = if seq % 5 == 4 { "/bad" } else { "/ok" };
        endpoint.request(Method::GET, path, None)
    }
    fn keep_body(&self) -> bool {
        true
    }
    fn observe(&self, _state: &mut usize, exchange: &Exchange) -> bool {
        exchange
            .body
            .as_ref()
            .is_some_and(|b| b.ends_with(b"GET /ok"))
    }
}

#[tokio::test]
async fn the_closed_loop_runs_exactly_the_requested_count() {
    let server = echo_server().await;
    let endpoint = Arc::new(
        Endpoint::new(
            "d",
            server.addr,
            Some(&server.server_ca),
            &Identity::Bearer("x".into()),
            Protocol::Http2,
        )
        .expect("endpoint"),
    );
    let senders = endpoint.senders(4).await.expect("senders");
    let workers = senders.into_iter().map(|s| (s, 0)).collect();
    let (result, workers) = closed_loop(
        Arc::clone(&endpoint),
        Arc::new(Counting),
        workers,
        50,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(workers.len(), 4);
    let counted: usize = workers.iter().map(|(_, n)| *n).sum();
    assert_eq!(counted, 50, "every request went through a worker state");
    assert_eq!(result.latencies.len(), 40);
    assert_eq!(result.errors, 10);
    assert!(result
        .first_error
        .as_deref()
        .is_some_and(|e| e.contains("GET /bad")));
    assert!(result.wall > Duration::ZERO);
}
