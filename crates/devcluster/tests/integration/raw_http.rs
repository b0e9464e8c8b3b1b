//! One request to a devcluster as its admin over a connection of the test's own,
//! for what kubectl cannot send or does not show: a method, headers, the
//! protocol, and the answer's exact framing.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// The protocol the request goes over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
}

/// `method` on `path` as the admin, with `extra` request headers, over
/// `protocol`; the answer's status, headers and whole body. Bounded by 10 s.
pub async fn admin_request(
    test: &test_support::TestCluster,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    protocol: Protocol,
) -> (http::StatusCode, http::HeaderMap, Bytes) {
    let exchange = async {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(test.cluster.ca_pem().as_bytes()) {
            roots.add(cert.expect("pem")).expect("root");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = match protocol {
            Protocol::Http1 => vec![b"http/1.1".to_vec()],
            Protocol::Http2 => vec![b"h2".to_vec()],
        };
        let addr = test.cluster.addr();
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", addr.port()))
            .await
            .expect("connect");
        let server_name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(server_name, tcp)
            .await
            .expect("tls");
        let authority = format!("127.0.0.1:{}", addr.port());
        let mut request = match protocol {
            Protocol::Http1 => http::Request::builder().uri(path).header("host", authority),
            Protocol::Http2 => http::Request::builder().uri(format!("https://{authority}{path}")),
        }
        .method(method)
        .header(
            "authorization",
            format!("Bearer {}", test.cluster.admin_token()),
        );
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(Bytes::new())).expect("request");
        let response = match protocol {
            Protocol::Http1 => {
                let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                    .await
                    .expect("handshake");
                tokio::spawn(conn);
                sender.send_request(request).await
            }
            Protocol::Http2 => {
                let (mut sender, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                        .await
                        .expect("handshake");
                tokio::spawn(conn);
                sender.send_request(request).await
            }
        }
        .expect("response");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        (parts.status, parts.headers, body)
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the cluster answers within 10 s")
}

/// A HEAD is answered as kube's Go server answers it: the GET's status and
/// headers, a Content-Length exactly where the GET has one (a short answer, or
/// one whose length its handler named), and no body, over either protocol.
/// hyper's HTTP/2 server used to send the body, which Go's client refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_is_answered_as_its_get_without_a_body() {
    let test = test_support::devcluster("head").await;
    for protocol in [Protocol::Http1, Protocol::Http2] {
        for (path, status) in [
            ("/api/v1/namespaces/default", 200),
            ("/api/v1/namespaces/missing", 404),
            ("/api/v1/namespaces", 200),
            ("/apis", 200),
            // Longer than Go's buffer on either protocol: no Content-Length.
            ("/apis/rbac.authorization.k8s.io/v1/clusterroles", 200),
            ("/openapi/v2", 200),
        ] {
            let (get_status, get_headers, get_body) =
                admin_request(&test, "GET", path, &[], protocol).await;
            assert_eq!(get_status, status, "GET {path} over {protocol:?}");
            assert!(!get_body.is_empty(), "GET {path} over {protocol:?}");
            let (head_status, head_headers, head_body) =
                admin_request(&test, "HEAD", path, &[], protocol).await;
            assert_eq!(head_status, status, "HEAD {path} over {protocol:?}");
            assert!(
                head_body.is_empty(),
                "HEAD {path} over {protocol:?} had a body of {} bytes",
                head_body.len()
            );
            for header in ["content-type", "content-length"] {
                assert_eq!(
                    head_headers.get(header),
                    get_headers.get(header),
                    "HEAD {path} over {protocol:?}: {header}"
                );
            }
        }
    }
}
