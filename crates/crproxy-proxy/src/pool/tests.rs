use super::*;
use http_body_util::{BodyExt, Empty};
use test_support::tasks_alive;

fn empty() -> ProxyBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

/// Builds a request from `uri` and an optional Host header, adapts it, and renders
/// the parts that matter: version, URI, Host header.
fn check(uri: &str, host: Option<&str>, h2: bool, expected: (&str, &str, Option<&str>)) {
    let mut builder = Request::builder()
        .uri(uri)
        .header("connection", "keep-alive");
    if let Some(host) = host {
        builder = builder.header(header::HOST, host);
    }
    let req = builder.body(empty()).expect("request");
    let adapted = adapt_request(req, h2, "target.example").expect("adapt");
    let version = format!("{:?}", adapted.version());
    let host = adapted
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().expect("ascii").to_owned());
    assert_eq!(
        (
            version.as_str(),
            adapted.uri().to_string().as_str(),
            host.as_deref()
        ),
        expected,
        "{uri} host={host:?} h2={h2}"
    );
    if h2 {
        assert!(adapted.headers().get(header::CONNECTION).is_none());
    }
}

#[test]
fn requests_are_adapted_to_the_connection_protocol() {
    // Origin form with Host.
    check(
        "/apis/example.com/v1?watch=1",
        Some("api.example:6443"),
        true,
        (
            "HTTP/2.0",
            "https://api.example:6443/apis/example.com/v1?watch=1",
            None,
        ),
    );
    check(
        "/apis/example.com/v1?watch=1",
        Some("api.example:6443"),
        false,
        (
            "HTTP/1.1",
            "/apis/example.com/v1?watch=1",
            Some("api.example:6443"),
        ),
    );
    // Absolute form: the URI's authority wins.
    check(
        "https://kube.t.p.vcluster.invalid:443/apis",
        None,
        true,
        (
            "HTTP/2.0",
            "https://kube.t.p.vcluster.invalid:443/apis",
            None,
        ),
    );
    check(
        "https://kube.t.p.vcluster.invalid:443/apis",
        None,
        false,
        ("HTTP/1.1", "/apis", Some("kube.t.p.vcluster.invalid:443")),
    );
    // Neither: the TLS server name.
    check(
        "/apis",
        None,
        true,
        ("HTTP/2.0", "https://target.example/apis", None),
    );
    check(
        "/apis",
        None,
        false,
        ("HTTP/1.1", "/apis", Some("target.example")),
    );
}

#[test]
fn only_bodiless_safe_requests_are_replayable() {
    let with = |method: http::Method, body: ProxyBody| {
        let req = Request::builder()
            .method(method)
            .uri("/x")
            .body(body)
            .expect("request");
        ReplayableHead::capture(&req).is_some()
    };
    let full = || {
        http_body_util::Full::new(Bytes::from_static(b"{}"))
            .map_err(|never| match never {})
            .boxed()
    };
    assert!(with(http::Method::GET, empty()));
    assert!(with(http::Method::HEAD, empty()));
    assert!(!with(http::Method::GET, full()));
    assert!(!with(http::Method::DELETE, empty()));
    assert!(!with(http::Method::POST, full()));
    assert!(!with(http::Method::PATCH, full()));
}

#[test]
fn ages_read_like_durations() {
    for (age, expected) in [
        (Duration::from_millis(75_300), "75.3s"),
        (Duration::from_secs(61), "61s"),
        (Duration::from_micros(1_500), "1ms"),
    ] {
        assert_eq!(format_age(age), expected);
    }
}

/// Every request's future holds what `acquire` holds, and hyper keeps a request's
/// future allocated while its answer streams (a watch: for hours). A dial (TCP,
/// TLS and HTTP handshakes) takes several KiB and most requests never make one, so
/// it must stay out of line.
#[test]
fn acquiring_a_connection_does_not_carry_a_dial_inline() {
    let tls = test_support::client_config_without_roots();
    let dialer = Dialer::new(
        Arc::new(tls),
        rustls_pki_types::ServerName::try_from("target.example").expect("name"),
    );
    let metrics = crate::metrics::Metrics::new().target("default/target");
    let pool = PeerPool::new("example.com/v1".into(), dialer, metrics);
    let acquiring = pool.acquire();
    let size = std::mem::size_of_val(&acquiring);
    assert!(size <= 512, "acquire's future takes {size} bytes");
}

/// The spec's fixed-thresholds table ("Quarantine duration: 20s") names the value
/// itself, so the tests that sleep `QUARANTINE_DURATION` cannot catch a change of it.
#[test]
fn the_quarantine_duration_is_the_specs_20_seconds() {
    assert_eq!(QUARANTINE_DURATION, Duration::from_secs(20));
}

/// A pool whose one peer (on 127.0.0.1, HTTP/1.1 only, serving one connection
/// at a time from a single task) answered an exchange, whose connection is now
/// idle. In real time: the dial and the exchange are loopback I/O.
async fn pool_with_an_idle_http1_connection() -> (Arc<PeerPool>, tokio::task::JoinHandle<()>) {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(crproxy_kube::crypto_provider());
    let ca = crproxy_core::pki::CertificateAuthority::generate("pool-unit-ca").expect("ca");
    let leaf = ca
        .issue_server(&["target.example"], &["127.0.0.1".parse().expect("ip")])
        .expect("leaf");
    let mut server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(leaf.cert.as_bytes()).expect("cert")],
            PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).expect("key"),
        )
        .expect("server config");
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem().cert.as_bytes()).expect("ca cert"))
        .expect("root");
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    // One task, serving each connection to its end: the test's task count does
    // not move as connections come and go.
    let peer = tokio::spawn(async move {
        // Bounded: aborted by the test.
        while let Ok((tcp, _)) = listener.accept().await {
            let Ok(tls) = acceptor.accept(tcp).await else {
                continue;
            };
            let answer = hyper::service::service_fn(|_req| async {
                Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                    Bytes::from_static(b"ok"),
                )))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), answer)
                .await;
        }
    });

    let dialer = Dialer::new(
        Arc::new(client),
        rustls_pki_types::ServerName::try_from("target.example").expect("name"),
    );
    let metrics = crate::metrics::Metrics::new().target("default/target");
    let pool = PeerPool::new("example.com/v1".into(), dialer, metrics);
    pool.publish(vec![addr.to_string()]);
    let sender = pool
        .acquire_in(Lane::Exchange, None)
        .await
        .expect("a sender");
    let req = Request::builder().uri("/x").body(empty()).expect("request");
    let answer = sender.send(req).await.expect("answer");
    let body = answer.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"ok");
    let idle =
        |pool: &PeerPool| -> usize { pool.lock().peers.iter().map(|p| p.idle_http1.len()).sum() };
    let listed_by = std::time::Instant::now() + Duration::from_secs(10);
    // Bounded: 10 s in real time.
    while idle(&pool) == 0 && std::time::Instant::now() < listed_by {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(idle(&pool), 1, "the exchange's connection is idle");
    (pool, peer)
}

/// [`pool_with_an_idle_http1_connection`] with its one idle connection taken off
/// the list (as a check for closed connections does) and the clock paused while
/// the sweep runs, finds none and parks: the pool, the peer's task, the peer's
/// id and the list taken.
async fn a_parked_sweep_with_the_list_out() -> (
    Arc<PeerPool>,
    tokio::task::JoinHandle<()>,
    u64,
    Vec<Http1Conn>,
) {
    let (pool, peer) = pool_with_an_idle_http1_connection().await;
    let peer_id = pool.lock().peers[0].id;
    let idle = take_idle(&pool, peer_id);
    // With nothing else pending (no I/O, the only timers the sweep's and the
    // test's), the paused clock runs the sweep, then ends the test's sleep.
    tokio::time::pause();
    tokio::time::sleep(HTTP1_IDLE_TIMEOUT + IDLE_SWEEP_SLACK).await;
    tasks_alive().await;
    assert!(
        !pool.lock().idle_sweep_due,
        "the sweep found none and parked"
    );
    (pool, peer, peer_id, idle)
}

fn take_idle(pool: &PeerPool, peer_id: u64) -> Vec<Http1Conn> {
    std::mem::take(&mut pool.lock().peer_mut(peer_id).expect("the peer").idle_http1)
}

/// A resend checks a peer's idle HTTP/1.1 connections with the list off the
/// lock ([`PeerPool::forget_closed_http1`]). A sweep in that window finds none
/// and parks; putting the list back must wake it, or those connections stay
/// open until another goes idle, however long they are idle.
#[tokio::test]
async fn idle_connections_put_back_after_a_sweep_found_none_are_still_swept() {
    let (pool, peer, peer_id, idle) = a_parked_sweep_with_the_list_out().await;
    pool.relist_idle_http1(peer_id, idle);
    tokio::time::sleep(HTTP1_IDLE_TIMEOUT + IDLE_SWEEP_SLACK).await;
    tasks_alive().await;
    assert!(
        pool.lock().peers[0].idle_http1.is_empty(),
        "closed, idle for longer than {HTTP1_IDLE_TIMEOUT:?}"
    );
    peer.abort();
}

/// Putting the list back also wakes a sweep asleep until a newer connection's
/// time: the connections put back may be older, and due long before.
#[tokio::test]
async fn idle_connections_put_back_under_a_sleeping_sweep_are_swept_in_time() {
    let (pool, peer, peer_id, mut idle) = a_parked_sweep_with_the_list_out().await;
    let went_idle = idle[0].idle_since;
    // Back as if it had just gone idle: the sweep sleeps until its time.
    idle[0].idle_since = Instant::now();
    pool.relist_idle_http1(peer_id, idle);
    tasks_alive().await;
    assert!(pool.lock().idle_sweep_due, "the sweep sleeps");
    // Out again, and back with its real time, idle longer than the limit.
    let mut idle = take_idle(&pool, peer_id);
    idle[0].idle_since = went_idle;
    pool.relist_idle_http1(peer_id, idle);
    tokio::time::sleep(IDLE_SWEEP_SLACK).await;
    tasks_alive().await;
    assert!(
        pool.lock().peers[0].idle_http1.is_empty(),
        "closed at once, idle for longer than {HTTP1_IDLE_TIMEOUT:?}"
    );
    peer.abort();
}

/// A pool dropped while its sweep sleeps until the next sweep ends the sweep at
/// once, not when the sleep would have ended.
#[tokio::test]
async fn a_sleeping_idle_sweep_ends_with_its_pool() {
    let (pool, peer) = pool_with_an_idle_http1_connection().await;
    let before = tasks_alive().await;
    assert!(pool.lock().idle_sweep_due, "the sweep sleeps");
    drop(pool);
    assert_eq!(tasks_alive().await, before - 1, "the sweep ended");
    peer.abort();
}

/// The idle sweep holds its pool weakly and ends with it: a pool made and
/// dropped (a target's pool replaced, a test's) leaves no task behind.
#[tokio::test]
async fn the_idle_sweep_ends_with_its_pool() {
    let before = tasks_alive().await;
    let tls = test_support::client_config_without_roots();
    let dialer = Dialer::new(
        Arc::new(tls),
        rustls_pki_types::ServerName::try_from("target.example").expect("name"),
    );
    let metrics = crate::metrics::Metrics::new().target("default/target");
    let pool = PeerPool::new("example.com/v1".into(), dialer, metrics);
    assert_eq!(tasks_alive().await, before + 1, "the sweep runs");
    drop(pool);
    assert_eq!(tasks_alive().await, before, "and ends with the pool");
}
