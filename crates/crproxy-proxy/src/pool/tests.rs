use super::*;
use http_body_util::{BodyExt, Empty};

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

/// The idle sweep holds its pool weakly and ends with it: a pool made and
/// dropped (a target's pool replaced, a test's) leaves no task behind.
#[tokio::test]
async fn the_idle_sweep_ends_with_its_pool() {
    async fn tasks_alive() -> usize {
        // Bounded: a few turns for a woken task to end.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    }
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
