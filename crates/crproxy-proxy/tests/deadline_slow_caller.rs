//! The 60 s cap on non-watch requests holds against a caller that stops reading
//! (how-it-works.txt:77: "Hard cap on any single proxied request and response, end
//! to end"). The caller is an HTTP/2 client with a 64 KiB window that opens again
//! only as it reads, so the proxy's server cannot send, and hyper stops polling the
//! response body: only something outside the body can end the request in time.
//!
//! The wait is real time (about 66 s): the proxy talks to devclusters over real
//! sockets. Every wait is bounded.

mod target_support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use kube::api::PostParams;
use serde_json::json;
use tokio::time::Instant;

use crproxy_core::config::AccessMode;
use crproxy_proxy::metrics::Metrics;
use target_support::{harness, widget_object, WIDGETS};

/// The sum of `name`'s samples whose line contains `needle` (0 when none).
fn value(metrics: &Metrics, name: &str, needle: &str) -> f64 {
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, v| sum + v)
}

fn lines(metrics: &Metrics, name: &str) -> Vec<String> {
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(name))
        .map(str::to_owned)
        .collect()
}

/// An HTTP/2 caller presenting the front-proxy certificate, like the client
/// cluster's aggregator, with a 64 KiB receive window that it only opens again
/// as the body is read.
async fn caller_h2<B>(
    addr: SocketAddr,
    serving_ca_pem: &str,
    front_proxy: &crproxy_core::pki::CertPem,
) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(serving_ca_pem.as_bytes()).expect("ca"))
        .expect("root");
    let chain = vec![CertificateDer::from_pem_slice(front_proxy.cert.as_bytes()).expect("cert")];
    let key = PrivateKeyDer::from_pem_slice(front_proxy.key.as_bytes()).expect("key");
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .expect("client config");
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("tls");
    let (sender, connection) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(65_535)
            .initial_connection_window_size(65_535)
            .adaptive_window(false)
            .handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    tokio::spawn(connection);
    sender
}

fn get(path: &str) -> http::Request<http_body_util::Empty<Bytes>> {
    http::Request::builder()
        .method("GET")
        .uri(format!("https://localhost{path}"))
        .header("x-remote-user", "alice")
        .header("x-remote-group", "system:authenticated")
        .header("accept", "application/json")
        .body(http_body_util::Empty::new())
        .expect("request")
}

/// A caller (the aggregator, behind it a slow kubectl) that stops reading a large
/// list must not keep the request, its in-flight place and its target connection
/// past the cap; the cut is one `deadline` termination (operate.txt:97).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_stops_reading_a_list_is_cut_at_the_deadline() {
    let h = harness(AccessMode::All).await;
    // About 2 MiB of widgets: far more than the caller's 64 KiB window.
    let padding = "x".repeat(50 * 1024);
    for i in 0..40 {
        let mut widget = widget_object(&format!("big-{i:02}"), json!({}));
        widget.data["spec"]["padding"] = json!(padding);
        h.widgets
            .create(&PostParams::default(), &widget)
            .await
            .expect("created on the target");
    }
    let mut sender = caller_h2(h.addr, &h.serving_ca_pem, &h.front_proxy_client).await;
    let started = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(20), sender.send_request(get(WIDGETS)))
        .await
        .expect("headers in time")
        .expect("response");
    assert_eq!(response.status(), 200);
    // The caller stops reading for longer than the cap.
    tokio::time::sleep(Duration::from_secs(66)).await;
    let inflight = value(&h.metrics, "vcluster_proxy_inflight_requests", "target=");
    let deadline = value(
        &h.metrics,
        "vcluster_proxy_request_terminations_total",
        "reason=\"deadline\"",
    );
    let durations = lines(&h.metrics, "vcluster_proxy_request_duration_seconds_sum");
    let measured = value(
        &h.metrics,
        "vcluster_proxy_request_duration_seconds_count",
        "verb=\"LIST\"",
    );
    // Reading on now must not deliver the whole list long after the cap.
    let rest = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect()).await;
    let completed = matches!(rest, Ok(Ok(_)));
    let rest = match rest {
        Ok(Ok(body)) => format!("complete, {} bytes", body.to_bytes().len()),
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => "no end within 20 s".to_owned(),
    };
    assert!(
        inflight == 0.0 && deadline == 1.0 && measured == 1.0 && !completed,
        "after {:?}: inflight {inflight}, deadline terminations {deadline}, LIST durations \
         observed {measured}, whole list still delivered after the cap: {completed} ({rest}); \
         durations {durations:?}",
        started.elapsed()
    );
    // Once cut, nothing is counted again when the caller reads on.
    assert_eq!(
        value(
            &h.metrics,
            "vcluster_proxy_request_terminations_total",
            "reason=\"deadline\""
        ),
        1.0
    );
    assert_eq!(
        value(
            &h.metrics,
            "vcluster_proxy_request_duration_seconds_count",
            "verb=\"LIST\""
        ),
        1.0
    );
    h.proxy.shutdown().await;
}
