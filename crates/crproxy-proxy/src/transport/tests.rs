use super::*;
use crate::metrics::Metrics;
use futures_util::stream;
use http_body_util::{BodyExt, StreamBody};
use test_support::tasks_alive;

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

/// A fresh target's metrics, and `inner` as the answer of a `verb` request that
/// starts now, under the 60 s deadline.
fn under_deadline(inner: ProxyBody, verb: &'static str) -> (Arc<Metrics>, DeadlineBody) {
    let metrics = Metrics::new();
    let target = metrics.target("default/target");
    let started = Instant::now();
    let body = DeadlineBody::new(
        inner,
        started + REQUEST_DEADLINE,
        started,
        target.clone(),
        verb,
        target.inflight(),
    );
    (metrics, body)
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
    let (metrics, body) = under_deadline(chunks(&["{\"a\":", "1}"]), "GET");
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
fn hop_headers_never_reach_the_caller_and_only_the_audit_id_is_never_indexed() {
    let answer = |pairs: &[(&'static str, &'static str)]| {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_static(value));
        }
        prepare_response_headers(&mut headers);
        headers
    };
    let prepared = answer(&[
        ("content-type", "application/json"),
        ("audit-id", "1c4d6b3e-5f2a-4c1e-9d7b-2a6f8e0c3b51"),
        ("connection", "keep-alive"),
        ("keep-alive", "timeout=5"),
        ("transfer-encoding", "chunked"),
        ("upgrade", "h2c"),
        ("cache-control", "no-cache, private"),
    ]);
    let names: Vec<&str> = prepared.keys().map(HeaderName::as_str).collect();
    assert_eq!(names, ["content-type", "audit-id", "cache-control"]);
    let sensitive: Vec<&str> = prepared
        .iter()
        .filter(|(_, value)| value.is_sensitive())
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(sensitive, ["audit-id"]);
    // Without hop-by-hop headers, nothing else changes.
    let plain = answer(&[("content-type", "application/json"), ("date", "x")]);
    assert_eq!(plain.len(), 2);
    assert!(plain.values().all(|value| !value.is_sensitive()));
}

#[test]
fn forwarded_headers_change_only_where_the_proxy_reads_the_answer_or_wrote_the_body() {
    fn check(
        inspected: Option<Inspected>,
        media_type: Option<&'static str>,
        expected: &[(&str, &str)],
    ) {
        let mut caller = HeaderMap::new();
        for (name, value) in [
            ("accept", "application/json;as=Table;g=meta.k8s.io;v=v1"),
            ("accept", "application/json"),
            ("accept-encoding", "gzip"),
            ("if-none-match", "\"etag\""),
            ("if-modified-since", "Sun, 06 Dec 2026 10:00:00 GMT"),
            ("range", "bytes=0-99"),
            ("if-range", "\"etag\""),
            ("user-agent", "kubectl"),
            ("x-remote-user", "alice"),
            ("authorization", "Bearer caller"),
            ("content-type", "application/json; charset=utf-8"),
        ] {
            caller.append(name, HeaderValue::from_static(value));
        }
        let forwarded = forwarded_headers(&caller, inspected.as_ref(), media_type);
        let mut got: Vec<(&str, &str)> = forwarded
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap_or("?")))
            .collect();
        got.sort();
        let mut expected = expected.to_vec();
        expected.sort();
        assert_eq!(got, expected, "inspected: {inspected:?}, {media_type:?}");
    }
    // Streamed through: the caller's headers as they were, but for identities.
    check(
        None,
        None,
        &[
            ("accept", "application/json;as=Table;g=meta.k8s.io;v=v1"),
            ("accept", "application/json"),
            ("accept-encoding", "gzip"),
            ("if-none-match", "\"etag\""),
            ("if-modified-since", "Sun, 06 Dec 2026 10:00:00 GMT"),
            ("range", "bytes=0-99"),
            ("if-range", "\"etag\""),
            ("user-agent", "kubectl"),
            ("content-type", "application/json; charset=utf-8"),
        ],
    );
    // Read by the proxy: one Accept of its choosing and nothing compressed.
    check(
        Some(Inspected {
            accept: Some(HeaderValue::from_static("application/json")),
            rewritten: false,
        }),
        None,
        &[
            ("accept", "application/json"),
            ("if-none-match", "\"etag\""),
            ("if-modified-since", "Sun, 06 Dec 2026 10:00:00 GMT"),
            ("range", "bytes=0-99"),
            ("if-range", "\"etag\""),
            ("user-agent", "kubectl"),
            ("content-type", "application/json; charset=utf-8"),
        ],
    );
    // Rewritten: the caller's Accept, nothing compressed, no validator the
    // target's ETag could satisfy, and no range.
    check(
        Some(Inspected {
            accept: None,
            rewritten: true,
        }),
        None,
        &[
            ("accept", "application/json;as=Table;g=meta.k8s.io;v=v1"),
            ("accept", "application/json"),
            ("user-agent", "kubectl"),
            ("content-type", "application/json; charset=utf-8"),
        ],
    );
    // A body the proxy wrote: sent as the media type it was read as, once.
    check(
        None,
        Some("application/json"),
        &[
            ("accept", "application/json;as=Table;g=meta.k8s.io;v=v1"),
            ("accept", "application/json"),
            ("accept-encoding", "gzip"),
            ("if-none-match", "\"etag\""),
            ("if-modified-since", "Sun, 06 Dec 2026 10:00:00 GMT"),
            ("range", "bytes=0-99"),
            ("if-range", "\"etag\""),
            ("user-agent", "kubectl"),
            ("content-type", "application/json"),
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

/// `within` adds a timer to the future it bounds, not a second copy of it: as an
/// `async fn` it held its argument twice, and every request's future, kept whole
/// until the response head is out, grew by the size of the target exchange (3 KiB).
#[tokio::test(start_paused = true)]
async fn within_holds_the_work_it_bounds_once() {
    let work = async {
        let room = [7u8; 4096];
        std::future::pending::<()>().await;
        Ok::<_, ForwardError>(room[usize::from(room[0])])
    };
    let work_size = std::mem::size_of_val(&work);
    assert!(work_size >= 4096, "the work keeps its room: {work_size}");
    let bounded = within(Instant::now() + REQUEST_DEADLINE, work);
    let bounded_size = std::mem::size_of_val(&bounded);
    assert!(
        bounded_size < work_size + 512,
        "within({work_size} bytes of work) is {bounded_size} bytes"
    );
    assert!(matches!(bounded.await, Err(ForwardError::Deadline)));
}

/// The spec's fixed-thresholds table ("Non-watch request timeout: 60s") names the
/// value itself, so the tests that wait `REQUEST_DEADLINE` cannot catch a change of it.
#[test]
fn the_request_deadline_is_the_specs_60_seconds() {
    assert_eq!(REQUEST_DEADLINE, Duration::from_secs(60));
}

/// A caller that reads slowly while the target has already sent the answer (the
/// target's body is always ready when polled) is still cut at the 60 s cap: the
/// spec's "Hard cap on any single proxied request and response, end to end".
#[tokio::test(start_paused = true)]
async fn a_slowly_read_body_is_still_cut_at_the_deadline() {
    let metrics = Metrics::new();
    let target = metrics.target("default/target");
    let started = Instant::now();
    // The target's answer is all buffered: every poll finds the next chunk ready.
    let endless = StreamBody::new(stream::repeat_with(|| {
        Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"{\"kind\":\"Widget\"}\n")))
    }))
    .boxed();
    let mut body = DeadlineBody::new(
        endless,
        started + REQUEST_DEADLINE,
        started,
        target.clone(),
        "LIST",
        target.inflight(),
    );
    // The caller reads one chunk a second, for at most 120 s (bounded).
    let mut cut_at = None;
    for _ in 0..120 {
        match body.frame().await {
            Some(Ok(_)) => tokio::time::sleep(Duration::from_secs(1)).await,
            Some(Err(_)) | None => {
                cut_at = Some(started.elapsed());
                break;
            }
        }
    }
    let terminations = scrape_line(&metrics, "vcluster_proxy_request_terminations_total");
    let inflight = scrape_line(&metrics, "vcluster_proxy_inflight_requests");
    assert!(
        cut_at.is_some_and(|at| at <= REQUEST_DEADLINE + Duration::from_secs(1)),
        "the response was still streaming after {:?} (cut at {cut_at:?}); terminations: {terminations:?}; inflight: {inflight:?}",
        started.elapsed()
    );
    assert!(body.frame().await.is_none(), "a cut body stays ended");
    drop(body);
    check_ended_once(&metrics, true);
}

/// The request's end as the metrics show it: nothing in flight, one duration
/// observed, and one `deadline` termination if the cap cut it (none otherwise).
fn check_ended_once(metrics: &Metrics, cut: bool) {
    let inflight = scrape_line(metrics, "vcluster_proxy_inflight_requests").expect("gauge");
    assert!(inflight.ends_with(" 0"), "inflight released: {inflight}");
    let count =
        scrape_line(metrics, "vcluster_proxy_request_duration_seconds_count").expect("histogram");
    assert!(count.ends_with(" 1"), "measured once: {count}");
    let terminations = scrape_line(metrics, "vcluster_proxy_request_terminations_total");
    match cut {
        true => assert!(
            terminations
                .as_deref()
                .is_some_and(|l| l.contains("reason=\"deadline\"") && l.ends_with(" 1")),
            "one deadline termination: {terminations:?}"
        ),
        false => assert!(terminations.is_none(), "{terminations:?}"),
    }
}

/// A caller that stops reading (no room in its window) makes hyper stop polling
/// the body, so the body itself never runs again: the watchdog must still end the
/// request at the cap, freeing the target's body, the in-flight place and the
/// gauge, and the caller's stream then ends with an error.
#[tokio::test(start_paused = true)]
async fn a_body_nobody_polls_any_more_is_cut_at_the_deadline() {
    let metrics = Metrics::new();
    let target = metrics.target("default/target");
    let started = Instant::now();
    // Held by the target's body: its count says whether the body was dropped.
    let alive = Arc::new(());
    let held = Arc::clone(&alive);
    let endless = StreamBody::new(stream::repeat_with(move || {
        let _held = &held;
        Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"{\"kind\":\"Widget\"}\n")))
    }))
    .boxed();
    let limit = Arc::new(tokio::sync::Semaphore::new(1));
    let permit = Arc::clone(&limit).try_acquire_owned().expect("a place");
    let mut body = DeadlineBody::new(
        endless,
        started + REQUEST_DEADLINE,
        started,
        target.clone(),
        "LIST",
        target.inflight(),
    )
    .holding(Some(permit));
    assert!(matches!(body.frame().await, Some(Ok(_))), "the first chunk");
    // The caller reads nothing more for 61 s.
    tokio::time::sleep(REQUEST_DEADLINE + Duration::from_secs(1)).await;
    assert_eq!(
        Arc::strong_count(&alive),
        1,
        "the target's body was dropped"
    );
    assert_eq!(limit.available_permits(), 1, "the in-flight place is free");
    check_ended_once(&metrics, true);
    // When hyper polls again the caller gets an error, never a clean end.
    assert!(matches!(body.frame().await, Some(Err(_))));
    assert!(body.frame().await.is_none());
    drop(body);
    check_ended_once(&metrics, true);
}

/// An answer that comes whole (a named GET) is over once its one chunk is taken,
/// not when hyper drops the body: to a caller with no room in its window hyper
/// keeps the chunk, and the body, for as long as the connection lives, and the
/// request must not keep its in-flight place that long.
#[tokio::test(start_paused = true)]
async fn a_whole_answer_frees_its_place_when_its_chunk_is_taken() {
    let limit = Arc::new(tokio::sync::Semaphore::new(1));
    let permit = Arc::clone(&limit).try_acquire_owned().expect("a place");
    let (metrics, body) = under_deadline(full(Bytes::from_static(b"{\"kind\":\"Widget\"}")), "GET");
    let mut body = body.holding(Some(permit));
    assert!(matches!(body.frame().await, Some(Ok(_))));
    // The body is still alive (hyper would hold it), yet nothing is held any more.
    assert_eq!(limit.available_permits(), 1, "the in-flight place is free");
    check_ended_once(&metrics, false);
    assert!(body.is_end_stream());
    assert!(body.frame().await.is_none());
    drop(body);
    check_ended_once(&metrics, false);
}

/// An answer sent chunked (kube-apiserver chunks anything over 2 KiB) does not say
/// which chunk is its last: its end arrives as a frame of its own, which hyper
/// asks for only if the caller has room for more. Looking one frame ahead, the
/// body knows it has ended when its last chunk is taken: the in-flight place is
/// free, hyper can put END_STREAM on that chunk, and no watchdog is left running.
#[tokio::test(start_paused = true)]
async fn a_chunked_answer_ends_with_its_last_chunk() {
    for parts in [
        &["{\"kind\":\"Widget\"}"][..],
        &["{\"items\":[", "{\"kind\":\"Widget\"}", "]}"][..],
    ] {
        let limit = Arc::new(tokio::sync::Semaphore::new(1));
        let permit = Arc::clone(&limit).try_acquire_owned().expect("a place");
        let (metrics, body) = under_deadline(chunks(parts), "GET");
        let mut body = body.holding(Some(permit));
        let mut taken = Vec::new();
        for (index, part) in parts.iter().enumerate() {
            let frame = body.frame().await.expect("a chunk").expect("no error");
            taken.extend_from_slice(frame.data_ref().expect("data"));
            let last = index + 1 == parts.len();
            assert_eq!(body.is_end_stream(), last, "after {part:?} of {parts:?}");
            assert_eq!(
                limit.available_permits(),
                usize::from(last),
                "the place is let go with the last chunk, not before ({parts:?})"
            );
        }
        assert_eq!(taken, parts.concat().into_bytes());
        assert_eq!(tasks_alive().await, 0, "no watchdog left ({parts:?})");
        check_ended_once(&metrics, false);
        assert!(body.frame().await.is_none());
        drop(body);
        check_ended_once(&metrics, false);
    }
}

/// Frames whose body says it has ended as the last one is taken, as an HTTP/2
/// target's body does when END_STREAM comes on its last DATA frame.
struct EndKnown(std::collections::VecDeque<&'static str>);

impl Body for EndKnown {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(
            self.0
                .pop_front()
                .map(|part| Ok(Frame::data(Bytes::from_static(part.as_bytes())))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// An HTTP/2 target ends a long answer with an empty DATA frame that only
/// carries END_STREAM. Taken ahead and held, it would keep hyper from ending the
/// stream with the real last chunk; it is dropped instead.
#[tokio::test(start_paused = true)]
async fn an_empty_end_frame_taken_ahead_is_dropped() {
    let (metrics, mut body) = under_deadline(
        EndKnown(["{\"kind\":\"Widget\"}", ""].into()).boxed(),
        "GET",
    );
    let frame = body.frame().await.expect("a chunk").expect("no error");
    assert_eq!(frame.data_ref().map(Bytes::len), Some(17));
    assert!(body.is_end_stream(), "the chunk goes out as the last");
    check_ended_once(&metrics, false);
    assert!(body.frame().await.is_none());
}

/// A request ends when its last chunk is in hand. Taken ahead, that chunk goes
/// out even if the caller asks for it after the deadline, as a whole answer's
/// one chunk does; a chunk taken ahead of a request that had not ended by then
/// does not (a_body_nobody_polls_any_more_is_cut_at_the_deadline).
#[tokio::test(start_paused = true)]
async fn a_last_chunk_in_hand_goes_out_after_the_deadline() {
    let (metrics, mut body) =
        under_deadline(EndKnown(["{\"items\":[", "]}"].into()).boxed(), "LIST");
    assert!(matches!(body.frame().await, Some(Ok(_))));
    check_ended_once(&metrics, false);
    tokio::time::sleep(REQUEST_DEADLINE + Duration::from_secs(1)).await;
    let last = body
        .frame()
        .await
        .expect("the last chunk")
        .expect("no error");
    assert_eq!(last.data_ref().map(|d| &d[..]), Some(&b"]}"[..]));
    assert!(body.frame().await.is_none());
    check_ended_once(&metrics, false);
}

/// One chunk, then nothing for a while, then the end: the body is watched while it
/// waits (the look ahead found nothing yet) and ends when the end arrives.
#[tokio::test(start_paused = true)]
async fn a_chunked_answer_whose_end_is_late_is_watched_until_it_comes() {
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(2);
    sender
        .send(Ok(Frame::data(Bytes::from_static(
            b"{\"kind\":\"Widget\"}",
        ))))
        .await
        .expect("queued");
    let (metrics, mut body) = under_deadline(
        StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(receiver)).boxed(),
        "GET",
    );
    assert!(matches!(body.frame().await, Some(Ok(_))));
    assert!(!body.is_end_stream());
    assert_eq!(tasks_alive().await, 1, "watched while the end is awaited");
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(sender);
    assert!(body.frame().await.is_none());
    assert_eq!(tasks_alive().await, 0, "the watchdog ends with the body");
    check_ended_once(&metrics, false);
}

/// The watchdog is for bodies still streaming after their first chunk: an answer
/// that comes whole (a named GET) never starts one, and a streamed one's ends with
/// its body, before the deadline, counting nothing.
#[tokio::test(start_paused = true)]
async fn only_streamed_bodies_are_watched_and_only_while_they_stream() {
    let metrics = Metrics::new();
    let target = metrics.target("default/target");
    let started = Instant::now();
    let whole = DeadlineBody::new(
        full(Bytes::from_static(b"{\"kind\":\"Widget\"}")),
        started + REQUEST_DEADLINE,
        started,
        target.clone(),
        "GET",
        target.inflight(),
    );
    let mut whole = std::pin::pin!(whole);
    assert!(matches!(whole.frame().await, Some(Ok(_))));
    assert!(whole.is_end_stream());
    assert_eq!(tasks_alive().await, 0, "no watchdog for a whole answer");

    let mut streamed = DeadlineBody::new(
        chunks(&["{\"items\":[", "]}"]),
        started + REQUEST_DEADLINE,
        started,
        target.clone(),
        "LIST",
        target.inflight(),
    );
    assert!(matches!(streamed.frame().await, Some(Ok(_))));
    assert_eq!(tasks_alive().await, 1, "a watchdog while it streams");
    assert!(matches!(streamed.frame().await, Some(Ok(_))));
    assert!(streamed.frame().await.is_none());
    assert_eq!(tasks_alive().await, 0, "the watchdog ends with the body");
    drop(streamed);
    tokio::time::sleep(REQUEST_DEADLINE * 2).await;
    assert!(
        scrape_line(&metrics, "vcluster_proxy_request_terminations_total").is_none(),
        "a body that ended in time is no termination"
    );
}

/// An answer the handler wrote because the deadline expired (the 504 of a request
/// body that never arrived, already counted there) goes out whole, though it is
/// first polled past the deadline, and is not counted again.
#[tokio::test(start_paused = true)]
async fn an_answer_written_at_the_deadline_goes_out_whole_and_uncounted() {
    let metrics = Metrics::new();
    let target = metrics.target("default/target");
    let started = Instant::now();
    tokio::time::sleep(REQUEST_DEADLINE).await;
    let body = DeadlineBody::new(
        full(Bytes::from_static(b"{\"code\":504}")),
        started + REQUEST_DEADLINE,
        started,
        target.clone(),
        "POST",
        target.inflight(),
    );
    let bytes = body.collect().await.expect("the whole answer").to_bytes();
    assert_eq!(&bytes[..], b"{\"code\":504}");
    check_ended_once(&metrics, false);
}

#[tokio::test]
async fn an_empty_body_ends_at_once_as_an_empty_full_body_does() {
    for body in [empty(), full(Bytes::new())] {
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
        let read = read_limited(body, 1).await.expect("read");
        assert!(read.is_empty());
    }
}
