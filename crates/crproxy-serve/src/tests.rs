use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::*;

/// A TLS server on 127.0.0.1 answering with the request path, and a client config
/// trusting it.
async fn start() -> (
    std::net::SocketAddr,
    Arc<rustls::ClientConfig>,
    watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let ca = crproxy_core::pki::CertificateAuthority::generate("test-ca").expect("ca");
    let leaf = ca
        .issue_server(&["localhost"], &["127.0.0.1".parse().expect("ip")])
        .expect("leaf");
    let provider = Arc::new(crproxy_kube::crypto_provider());
    let chain = CertificateDer::pem_slice_iter(leaf.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("chain");
    let key = PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).expect("key");
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.pem().cert.as_bytes()) {
        roots.add(cert.expect("ca pem")).expect("root");
    }
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(serve_tls(
        listener,
        TlsAcceptor::from(Arc::new(server)),
        |request: Request<Incoming>| async move {
            Response::new(Full::new(Bytes::from(request.uri().path().to_owned())))
        },
        stopped,
    ));
    (addr, Arc::new(client), stop, task)
}

async fn get(addr: std::net::SocketAddr, client: Arc<rustls::ClientConfig>, path: &str) -> String {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let tls = tokio_rustls::TlsConnector::from(client)
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("handshake");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("http");
    tokio::spawn(connection);
    let request = Request::get(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

#[tokio::test]
async fn serves_over_tls_survives_a_bad_handshake_and_stops() {
    let (addr, client, stop, task) = start().await;
    assert_eq!(get(addr, client.clone(), "/one").await, "/one");
    // A client that is not speaking TLS ends only its own connection.
    {
        use tokio::io::AsyncWriteExt;
        let mut plain = tokio::net::TcpStream::connect(addr).await.expect("connect");
        plain
            .write_all(b"GET / HTTP/1.1\r\n\r\n")
            .await
            .expect("write");
    }
    assert_eq!(get(addr, client, "/two").await, "/two");
    stop.send(true).expect("stop");
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the loop ends when stopped")
        .expect("no panic");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}
