use super::*;
use crate::metrics::Metrics;
use futures_util::stream;
use http_body_util::{BodyExt, StreamBody};

fn pending_body() -> ProxyBody {
    StreamBody::new(stream::pending::<Result<Frame<Bytes>, BoxError>>()).boxed()
}

fn chunks(parts: &[&'static str]) -> ProxyBody {
    let frames: Vec<Result<Frame<Bytes>, BoxError>> = parts
        .iter()
        .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
        .collect();
    StreamBody::new(stream::iter(frames)).boxed()
}

fn scrape_line(metrics: &Metrics, prefix: &str) -> Option<String> {
    metrics
        .encode()
        .lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_string)
}

#[tokio::test(start_paused = true)]
async fn a_stalled_non_watch_body_is_cut_at_the_deadline_and_counted() {
    let metrics = Metrics::new();
    let target = metrics.target("default/target");
    let started = Instant::now();
    let body = DeadlineBody::new(
        pending_body(),
        started + REQUEST_DEADLINE,
        started,
        target.clone(),
        "LIST",
        target.inflight(),
    );
    let collected = body.collect().await;
    assert!(collected.is_err(), "the body must end with an error");
    assert!(started.elapsed() >= REQUEST_DEADLINE);
    let line = scrape_line(&metrics, "vcluster_proxy_request_terminations_total").expect("counted");
    assert!(line.contains("reason=\"deadline\""), "{line}");
    let inflight = scrape_line(&metrics, "vcluster_proxy_inflight_requests").expect("gauge");
    assert!(inflight.ends_with(" 0"), "inflight released: {inflight}");
}

#[tokio::test(start_paused = true)]
async fn a_complete_body_passes_and_is_measured_once() {
    let metrics = Metrics::new();
    let target = metrics.target("default/target");
    let started = Instant::now();
    let body = DeadlineBody::new(
        chunks(&["{\"a\":", "1}"]),
        started + REQUEST_DEADLINE,
        started,
        target.clone(),
        "GET",
        target.inflight(),
    );
    let bytes = body.collect().await.expect("body").to_bytes();
    assert_eq!(&bytes[..], b"{\"a\":1}");
    let count =
        scrape_line(&metrics, "vcluster_proxy_request_duration_seconds_count").expect("histogram");
    assert!(count.ends_with(" 1"), "{count}");
    assert!(scrape_line(&metrics, "vcluster_proxy_request_terminations_total").is_none());
}

#[tokio::test]
async fn json_watch_events_are_counted_per_line_even_across_chunks() {
    let metrics = Metrics::new();
    let target = metrics.target("default/target");
    let body = WatchBody::new(
        chunks(&[
            "{\"type\":\"ADDED\"}\n{\"type\":",
            "\"MODIFIED\"}\n",
            "{\"type\":\"DELETED\"}\n",
        ]),
        target.clone(),
        WatchFraming::JsonLines,
    );
    let active = scrape_line(&metrics, "vcluster_proxy_active_watches").expect("gauge");
    assert!(active.ends_with(" 1"), "{active}");
    body.collect().await.expect("body");
    let events = scrape_line(&metrics, "vcluster_proxy_watch_events_total").expect("counter");
    assert!(events.ends_with(" 3"), "{events}");
    let active = scrape_line(&metrics, "vcluster_proxy_active_watches").expect("gauge");
    assert!(active.ends_with(" 0"), "{active}");
}

#[test]
fn only_uncompressed_json_watches_are_counted() {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    assert_eq!(WatchFraming::of(&headers), WatchFraming::JsonLines);
    headers.insert(
        http::header::CONTENT_ENCODING,
        HeaderValue::from_static("gzip"),
    );
    assert_eq!(WatchFraming::of(&headers), WatchFraming::Uncounted);
    let mut protobuf = HeaderMap::new();
    protobuf.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.kubernetes.protobuf;stream=watch"),
    );
    assert_eq!(WatchFraming::of(&protobuf), WatchFraming::Uncounted);
}

#[test]
fn caller_identity_and_hop_headers_never_reach_the_target() {
    for dropped in [
        "authorization",
        "x-remote-user",
        "x-remote-group",
        "x-remote-extra-scopes",
        "impersonate-user",
        "impersonate-group",
        "connection",
        "upgrade",
        "host",
        "x-forwarded-for",
    ] {
        assert!(
            !keep_request_header(&HeaderName::from_static(dropped)),
            "{dropped}"
        );
    }
    for kept in [
        "accept",
        "content-type",
        "user-agent",
        "audit-id",
        "kubectl-command",
    ] {
        assert!(
            keep_request_header(&HeaderName::from_static(kept)),
            "{kept}"
        );
    }
}

#[test]
fn forwarded_headers_change_only_for_an_answer_the_proxy_reads() {
    fn check(inspected: Option<Inspected>, expected: &[(&str, &str)]) {
        let mut caller = HeaderMap::new();
        for (name, value) in [
            ("accept", "application/json;as=Table;g=meta.k8s.io;v=v1"),
            ("accept", "application/json"),
            ("accept-encoding", "gzip"),
            ("if-none-match", "\"etag\""),
            ("user-agent", "kubectl"),
            ("x-remote-user", "alice"),
            ("authorization", "Bearer caller"),
        ] {
            caller.append(name, HeaderValue::from_static(value));
        }
        let forwarded = forwarded_headers(&caller, inspected.as_ref());
        let mut got: Vec<(&str, &str)> = forwarded
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap_or("?")))
            .collect();
        got.sort();
        let mut expected = expected.to_vec();
        expected.sort();
        assert_eq!(got, expected, "inspected: {inspected:?}");
    }
    // Streamed through: the caller's headers as they were, but for identities.
    check(
        None,
        &[
            ("accept", "application/json;as=Table;g=meta.k8s.io;v=v1"),
            ("accept", "application/json"),
            ("accept-encoding", "gzip"),
            ("if-none-match", "\"etag\""),
            ("user-agent", "kubectl"),
        ],
    );
    // Read by the proxy: one Accept of its choosing and nothing compressed.
    check(
        Some(Inspected {
            accept: Some(HeaderValue::from_static("application/json")),
            rewritten: false,
        }),
        &[
            ("accept", "application/json"),
            ("if-none-match", "\"etag\""),
            ("user-agent", "kubectl"),
        ],
    );
    // Rewritten: the caller's Accept, nothing compressed, and no validator the
    // target's ETag could satisfy.
    check(
        Some(Inspected {
            accept: None,
            rewritten: true,
        }),
        &[
            ("accept", "application/json;as=Table;g=meta.k8s.io;v=v1"),
            ("accept", "application/json"),
            ("user-agent", "kubectl"),
        ],
    );
}

#[tokio::test]
async fn cbor_sequence_watch_events_are_counted_per_item() {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/cbor-seq"),
    );
    assert_eq!(WatchFraming::of(&headers), WatchFraming::CborSequence);
    let metrics = Metrics::new();
    let target = metrics.target("default/target");
    // Three events: {"t": 1}, {"t": 2} split across chunks, then {"t": 3}.
    let parts: [&'static [u8]; 3] = [
        &[0xa1, 0x61, b't', 0x01],
        &[0xa1, 0x61],
        &[b't', 0x02, 0xa1, 0x61, b't', 0x03],
    ];
    let frames: Vec<Result<Frame<Bytes>, BoxError>> = parts
        .iter()
        .map(|p| Ok(Frame::data(Bytes::from_static(p))))
        .collect();
    let body = WatchBody::new(
        StreamBody::new(stream::iter(frames)).boxed(),
        target.clone(),
        WatchFraming::of(&headers),
    );
    body.collect().await.expect("body");
    let events = scrape_line(&metrics, "vcluster_proxy_watch_events_total").expect("counter");
    assert!(events.ends_with(" 3"), "{events}");
}

#[tokio::test]
async fn bodies_are_read_whole_in_one_piece_or_many_and_bounded() {
    assert_eq!(
        read_limited(chunks(&["{\"a\":1}"]), 7).await.ok(),
        Some(Bytes::from_static(b"{\"a\":1}"))
    );
    assert_eq!(
        read_limited(chunks(&["", "{\"a\":", "", "1}"]), 7)
            .await
            .ok(),
        Some(Bytes::from_static(b"{\"a\":1}"))
    );
    assert_eq!(read_limited(chunks(&[]), 0).await.ok(), Some(Bytes::new()));
    // The limit counts every piece, the first one included.
    assert!(matches!(
        read_limited(chunks(&["{\"a\":1}"]), 6).await,
        Err(ForwardError::TooLarge)
    ));
    assert!(matches!(
        read_limited(chunks(&["{\"a\":", "1}"]), 6).await,
        Err(ForwardError::TooLarge)
    ));
}

/// The spec's fixed-thresholds table ("Non-watch request timeout: 60s") names the
/// value itself, so the tests that wait `REQUEST_DEADLINE` cannot catch a change of it.
#[test]
fn the_request_deadline_is_the_specs_60_seconds() {
    assert_eq!(REQUEST_DEADLINE, Duration::from_secs(60));
}
