//! The request side: round robin, retry on another peer after a failed dial,
//! connection reuse over HTTP/2 and HTTP/1.1, and which requests take which.

use crate::pool_support;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crproxy_proxy::pool::{
    ConnectionSocket, Lane, HTTP1_IDLE_TIMEOUT, HTTP1_MAX_READ_BUFFER, MAX_EXCHANGE_CONNECTIONS,
};
use crproxy_proxy::transport::{TargetConnection, TargetPath};
use http::uri::PathAndQuery;
use http_body::Body;
use http_body_util::BodyExt;
use pool_support::*;
use test_support::RefusedPort;

#[tokio::test]
async fn one_refusing_peer_of_three_costs_callers_nothing() {
    let h = Harness::new();
    let refused = RefusedPort::bind();
    let dead = refused.addr;
    let b = TlsPeer::start(&h.pki, Protocols::H2AndHttp1).await;
    let c = TlsPeer::start(&h.pki, Protocols::H2AndHttp1).await;
    h.pool.publish(vec![dead.to_string(), b.host(), c.host()]);

    let mut served_by = BTreeSet::new();
    for i in 0..30 {
        let body = h
            .get()
            .await
            .unwrap_or_else(|e| panic!("request {i} failed: {e}"));
        served_by.insert(body.split(' ').nth(1).unwrap_or_default().to_owned());
    }
    assert_eq!(
        served_by,
        BTreeSet::from([b.addr.port().to_string(), c.addr.port().to_string()]),
        "round robin spreads requests over the live peers"
    );
    let s = h.scrape();
    assert_eq!(s.dial_failures("error"), 3.0);
    assert_eq!(s.value("vcluster_proxy_peer_quarantines_total", &[]), 1.0);
    assert_eq!(
        s.value("vcluster_proxy_target_all_peers_quarantined_total", &[]),
        0.0
    );
    assert_eq!((s.peers("healthy"), s.peers("quarantined")), (2.0, 1.0));
}

#[tokio::test(start_paused = true)]
async fn one_silent_peer_of_three_costs_callers_nothing() {
    let h = Harness::new();
    let silent = SilentPeer::start().await;
    let b = TlsPeer::start(&h.pki, Protocols::H2AndHttp1).await;
    let c = TlsPeer::start(&h.pki, Protocols::Http1Only).await;
    h.pool.publish(vec![b.host(), silent.host(), c.host()]);
    for i in 0..12 {
        h.get()
            .await
            .unwrap_or_else(|e| panic!("request {i} failed: {e}"));
    }
    let s = h.scrape();
    assert_eq!(s.dial_failures("timeout"), 3.0);
    assert_eq!(s.peers("quarantined"), 1.0);
}

#[tokio::test]
async fn http2_peers_share_one_connection() {
    let h = Harness::new();
    let peer = TlsPeer::start(&h.pki, Protocols::H2AndHttp1).await;
    h.pool.publish(vec![peer.host()]);
    for _ in 0..5 {
        let body = h.get().await.expect("request");
        assert!(body.contains("HTTP/2.0 /apis/example.com/v1"), "{body}");
        assert!(body.ends_with("host=target.example"), "{body}");
    }
    assert_eq!(peer.connections.load(Ordering::SeqCst), 1);
    assert_eq!(peer.requests.load(Ordering::SeqCst), 5);
    assert_eq!(h.scrape().dial_observations(), 1.0);
}

/// A burst of requests to a peer nobody is connected to yet (an aggregator
/// opening many watches at once) shares one dial instead of opening a connection
/// per request.
#[tokio::test]
async fn a_burst_of_requests_shares_one_http2_dial() {
    let h = Harness::new();
    let peer = TlsPeer::start(&h.pki, Protocols::H2AndHttp1).await;
    h.pool.publish(vec![peer.host()]);
    let burst = (0..50).map(|_| h.get());
    for result in futures_util::future::join_all(burst).await {
        let body = result.expect("request");
        assert!(body.contains("HTTP/2.0 /apis/example.com/v1"), "{body}");
    }
    assert_eq!(peer.connections.load(Ordering::SeqCst), 1);
    assert_eq!(peer.requests.load(Ordering::SeqCst), 50);
    assert_eq!(h.scrape().dial_observations(), 1.0);

    // More requests than one connection carries: a dial per 100 of them.
    let h = Harness::new();
    let peer = TlsPeer::start(&h.pki, Protocols::H2AndHttp1).await;
    h.pool.publish(vec![peer.host()]);
    let burst = (0..250).map(|_| h.get());
    for result in futures_util::future::join_all(burst).await {
        result.expect("request");
    }
    let connections = peer.connections.load(Ordering::SeqCst);
    assert!((1..=3).contains(&connections), "{connections} connections");
    assert_eq!(peer.requests.load(Ordering::SeqCst), 250);
}

/// HTTP/1.1 carries one request per connection: a burst to an HTTP/1.1 peer
/// still gets every request through (none waits for a connection it cannot
/// share).
#[tokio::test]
async fn a_burst_to_an_http1_peer_is_served_whole() {
    let h = Harness::new();
    let peer = TlsPeer::start(&h.pki, Protocols::Http1Only).await;
    h.pool.publish(vec![peer.host()]);
    h.get().await.expect("first request");
    let burst = (0..8).map(|_| h.get());
    for result in futures_util::future::join_all(burst).await {
        let body = result.expect("request");
        assert!(body.contains("HTTP/1.1 /apis/example.com/v1"), "{body}");
    }
    assert_eq!(peer.requests.load(Ordering::SeqCst), 9);
}

#[tokio::test]
async fn http1_peers_reuse_idle_connections() {
    let h = Harness::new();
    let peer = TlsPeer::start(&h.pki, Protocols::Http1Only).await;
    h.pool.publish(vec![peer.host()]);
    for _ in 0..5 {
        let body = h.get().await.expect("request");
        assert!(body.contains("HTTP/1.1 /apis/example.com/v1"), "{body}");
        assert!(body.ends_with("host=target.example"), "{body}");
    }
    assert_eq!(peer.connections.load(Ordering::SeqCst), 1);
    assert_eq!(peer.requests.load(Ordering::SeqCst), 5);
}

/// Exchanges (requests with a deadline) take HTTP/1.1 connections of their own,
/// which go back to the idle list when the answer ends, so requests one after the
/// other reuse one connection; streams (watches) share HTTP/2.
#[tokio::test]
async fn exchanges_reuse_one_http1_connection_and_streams_share_http2() {
    let (h, peer) = Harness::with_peer(Protocols::H2AndHttp1).await;
    for body in h.get_each(Lane::Exchange, 20).await {
        assert!(body.contains("HTTP/1.1 /apis/example.com/v1"), "{body}");
        assert!(body.ends_with("host=target.example"), "{body}");
    }
    // hyper asks for the next request in the same poll that reads the answer's
    // last bytes, so the connection is back on the idle list before the next
    // request asks.
    let exchange_connections = peer.connections.load(Ordering::SeqCst);
    assert_eq!(
        exchange_connections, 1,
        "{exchange_connections} connections for 20 exchanges"
    );
    for _ in 0..3 {
        let body = h.get_in(Lane::Stream).await.expect("stream");
        assert!(body.contains("HTTP/2.0 /apis/example.com/v1"), "{body}");
    }
    assert_eq!(
        peer.connections.load(Ordering::SeqCst),
        exchange_connections + 1
    );
    assert_eq!(peer.requests.load(Ordering::SeqCst), 23);
}

/// The transport picks the lane by the request's deadline: requests with one (every
/// verb but watch) go as exchanges over HTTP/1.1, requests without (watches, which
/// may last for hours) as streams over HTTP/2.
#[tokio::test]
async fn the_transport_sends_bounded_requests_as_exchanges_and_watches_as_streams() {
    let (h, _peer) = Harness::with_peer(Protocols::H2AndHttp1).await;
    let target = target_of(&h);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    // The caller's own path goes on as parsed, a written one is parsed here;
    // both arrive as they were, query included.
    let parsed = PathAndQuery::from_static("/apis/example.com/v1?watch=true&x=%2F");
    let paths = [
        TargetPath::Caller(&parsed),
        TargetPath::Written("/apis/example.com/v1/widgets?limit=2"),
    ];
    for (deadline, protocol) in [(Some(deadline), "HTTP/1.1"), (None, "HTTP/2.0")] {
        for path in paths {
            let body = get_through(&target, deadline, path)
                .await
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            let body = String::from_utf8_lossy(&body);
            let expected = format!("{protocol} {} host=", path.as_str());
            assert!(body.contains(&expected), "deadline {deadline:?}: {body}");
        }
    }
}

/// A transport on the harness's pool, with a token for credentials.
fn target_of(h: &Harness) -> TargetConnection {
    TargetConnection {
        pool: Arc::clone(&h.pool),
        host: http::HeaderValue::from_static(SERVER_NAME),
        credentials: Arc::new(
            crproxy_kube::Credentials::new(
                crproxy_kube::Auth::Token("token".into()),
                serde_json::Value::Null,
            )
            .expect("credentials"),
        ),
    }
}

/// The proxy's own watch (the ownership cache's) takes an HTTP/1.1 connection
/// dialled for it, even with an idle one at hand, and its answer carries a
/// duplicate of that connection's socket, for the cache to let it rest between
/// reads; a caller's exchange carries none.
#[tokio::test]
async fn the_proxys_own_watch_carries_its_connections_socket() {
    let (h, peer) = Harness::with_peer(Protocols::H2AndHttp1).await;
    let target = target_of(&h);
    let path = TargetPath::Written("/apis/example.com/v1/widgets?watch=true");
    // The exchange's connection goes back to the idle list once its body is read.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let exchange = get_through(&target, Some(deadline), path).await;
    assert!(exchange.extensions().get::<ConnectionSocket>().is_none());
    exchange.into_body().collect().await.expect("body");

    let mut watch = target
        .send_own_watch(path, &http::HeaderMap::new())
        .await
        .expect("answer");
    let ConnectionSocket(socket) = watch
        .extensions_mut()
        .remove::<ConnectionSocket>()
        .expect("the own watch's answer carries its socket");
    let socket = std::net::TcpStream::from(socket.try_clone().expect("duplicate"));
    assert_eq!(socket.peer_addr().expect("peer address"), peer.addr);
    let body = watch.into_body().collect().await.expect("body").to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("HTTP/1.1"));
}

/// The own watch's HTTP/1.1 connection has no pings and no limit on unanswered
/// data, so a target that took the watch and never answers would hold the
/// ownership cache's wait (and its pins) forever: the answer's head must come
/// within the request deadline, and the watch ends as a deadline error.
///
/// In real time until the peer has the request: with the clock paused, the dial
/// timeout's and the deadline's timers would let the runtime jump to either
/// while the loopback dial or exchange is momentarily not ready.
#[tokio::test]
async fn the_proxys_own_watch_gives_up_on_a_target_that_never_answers() {
    use crproxy_proxy::transport::{ForwardError, REQUEST_DEADLINE};
    use std::time::Duration;
    let (h, peer) = Harness::with_peer(Protocols::H2AndHttp1).await;
    let target = target_of(&h);
    let no_headers = http::HeaderMap::new();
    let started = tokio::time::Instant::now();
    let mut watch =
        std::pin::pin!(target.send_own_watch(TargetPath::Written(NEVER_ANSWERED), &no_headers));
    let sent_by = std::time::Instant::now() + Duration::from_secs(10);
    // Bounded: 10 s in real time, polling the watch meanwhile.
    while peer.requests.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < sent_by {
        tokio::select! {
            outcome = watch.as_mut() => panic!("answered before the peer had it: {:?}", outcome.err()),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
    assert_eq!(peer.requests.load(Ordering::SeqCst), 1, "the peer had it");
    // Nothing else to wait for: the paused clock goes straight to the deadline.
    tokio::time::pause();
    let outcome = tokio::time::timeout(REQUEST_DEADLINE * 2, watch)
        .await
        .expect("the wait for the answer's head is bounded");
    assert!(
        matches!(outcome, Err(ForwardError::Deadline)),
        "{:?}",
        outcome.err()
    );
    assert_eq!(started.elapsed().as_secs(), REQUEST_DEADLINE.as_secs());
}

/// How the peer turns away the connection a resend asks for.
#[derive(Debug, Clone, Copy)]
enum NextDial {
    /// The peer's listener is closed.
    Refused,
    /// The peer accepts and never completes TLS.
    Hangs,
}

/// A request on a cached connection that dies under it is sent again on
/// another connection; when none can be had, the request fails with the pool's
/// reason (the spec: a request failed by a dial carries that dial's reason), not
/// as an exchange failure (`upstream`), and that connection is acquired within
/// the request's deadline, so a dial it cuts counts as `deadline`, not
/// `canceled`. A watch (no deadline) is sent as a stream on HTTP/2, a request
/// with one as an exchange on HTTP/1.1. In real time: with the clock paused,
/// the deadline's timer would let the runtime jump to it while the loopback
/// exchange is momentarily not ready.
#[tokio::test]
async fn a_resend_that_gets_no_connection_fails_with_the_pools_reason() {
    use crproxy_core::reason::Reason;
    use std::time::Duration;
    async fn check(next: NextDial, deadline: Option<Duration>, want: Reason) {
        let (h, mut peer) = Harness::with_peer(Protocols::H2AndHttp1).await;
        let target = target_of(&h);
        let lane = match deadline {
            Some(_) => Lane::Exchange,
            None => Lane::Stream,
        };
        h.get_in(lane).await.expect("a connection to reuse");
        match next {
            NextDial::Refused => peer.stop_accepting().await,
            NextDial::Hangs => peer.hold_new_connections(),
        }

        let deadline = deadline.map(|after| tokio::time::Instant::now() + after);
        let no_headers = http::HeaderMap::new();
        let sent = target.send_before(
            deadline,
            http::Method::GET,
            TargetPath::Written(DROPS_CONNECTIONS),
            &no_headers,
            None,
            empty(),
        );
        let outcome = tokio::time::timeout(Duration::from_secs(30), sent)
            .await
            .expect("the resend ends");
        let error = outcome.expect_err("no connection for the resend");
        assert_eq!(error.reason(), want, "{next:?}: {error}");
        // The warm-up and the request the peer dropped: it went out on the
        // cached connection, and the connection that failed was the resend's.
        assert_eq!(peer.requests.load(Ordering::SeqCst), 2, "{next:?}");
        let accepted = match next {
            NextDial::Refused => 1,
            NextDial::Hangs => 2,
        };
        assert_eq!(
            peer.connections.load(Ordering::SeqCst),
            accepted,
            "{next:?}"
        );
        let s = h.scrape();
        assert_eq!(s.dial_failures(want.as_str()), 1.0, "{next:?}");
        assert_eq!(s.dial_failures("canceled"), 0.0, "{next:?}");
    }
    check(NextDial::Refused, None, Reason::Error).await;
    // Under the 5 s dial limit, so that the deadline ends the dial.
    check(
        NextDial::Hangs,
        Some(Duration::from_secs(1)),
        Reason::Deadline,
    )
    .await;
}

/// A bodiless GET of `path` through `target`, with a deadline or without.
async fn get_through(
    target: &TargetConnection,
    deadline: Option<tokio::time::Instant>,
    path: TargetPath<'_>,
) -> http::Response<crproxy_proxy::pool::ProxyBody> {
    target
        .send_before(
            deadline,
            http::Method::GET,
            path,
            &http::HeaderMap::new(),
            None,
            empty(),
        )
        .await
        .expect("answer")
}

/// Past the per-peer limit of exchange connections, exchanges share HTTP/2, so a
/// burst never becomes a burst of TLS handshakes.
#[tokio::test]
async fn exchanges_past_the_connection_limit_share_http2() {
    let (h, _peer) = Harness::with_peer(Protocols::H2AndHttp1).await;
    let mut held = Vec::new();
    for i in 0..MAX_EXCHANGE_CONNECTIONS {
        let sender = h.exchange().await;
        assert!(!sender.is_h2(), "exchange {i} within the limit is HTTP/1.1");
        held.push(sender);
    }
    let past = h.exchange().await;
    assert!(past.is_h2(), "past the limit an exchange shares HTTP/2");
    drop(past);
    // Connections that close give their place back.
    held.clear();
    let again = h.exchange().await;
    assert!(!again.is_h2());
}

/// An answer dropped before its end leaves unread bytes on its HTTP/1.1
/// connection: the connection is closed, never handed to the next request.
#[tokio::test]
async fn an_exchange_dropped_before_its_end_closes_its_connection() {
    let (h, peer) = Harness::with_peer(Protocols::H2AndHttp1).await;
    let sender = h.exchange().await;
    let unread = sender
        .send(request("/apis/example.com/v1"))
        .await
        .expect("answer");
    drop(unread);
    let body = h.get_in(Lane::Exchange).await.expect("next exchange");
    assert!(body.contains("HTTP/1.1"), "{body}");
    assert_eq!(peer.connections.load(Ordering::SeqCst), 2);
}

/// An answer without a body has ended before anyone reads it: dropping it
/// unread returns the connection.
#[tokio::test]
async fn an_answer_without_a_body_returns_its_connection_unread() {
    let (h, peer) = Harness::with_peer(Protocols::H2AndHttp1).await;
    let sender = h.exchange().await;
    let answer = sender.send(request("/empty")).await.expect("answer");
    assert!(answer.body().is_end_stream());
    drop(answer);
    let body = h.get_in(Lane::Exchange).await.expect("next exchange");
    assert!(body.contains("HTTP/1.1"), "{body}");
    assert_eq!(peer.connections.load(Ordering::SeqCst), 1);
}

/// A peer that speaks HTTP/2 only refuses a connection offering HTTP/1.1 alone.
/// That is no health failure: the exchange goes out as a stream, and so does
/// every later one.
#[tokio::test]
async fn a_peer_that_refuses_http1_alone_takes_exchanges_as_streams() {
    let (h, peer) = Harness::with_peer(Protocols::H2Only).await;
    for body in h.get_each(Lane::Exchange, 5).await {
        assert!(body.contains("HTTP/2.0"), "{body}");
    }
    let s = h.scrape();
    assert_eq!(s.dial_failures("error"), 1.0, "one refused dial, then none");
    assert_eq!(s.value("vcluster_proxy_peer_quarantines_total", &[]), 0.0);
    assert_eq!(s.peers("healthy"), 1.0);
    assert_eq!(peer.connections.load(Ordering::SeqCst), 2);
}

/// An answer's head must fit the HTTP/1.1 read buffer: kube-apiserver's are far
/// smaller, and a larger one is refused rather than buffered without bound.
#[tokio::test]
async fn answer_heads_up_to_the_read_buffer_pass_over_http1() {
    let (h, _peer) = Harness::with_peer(Protocols::H2AndHttp1).await;
    let h = &h;
    let send = |bytes: usize| async move {
        let sender = h.exchange().await;
        assert!(!sender.is_h2());
        let mut req = request("/apis/example.com/v1");
        req.headers_mut().insert(FILLER_BYTES, bytes.into());
        sender.send(req).await
    };
    let within = HTTP1_MAX_READ_BUFFER / 2;
    let answer = send(within).await.expect("a head within the buffer");
    assert_eq!(answer.headers()["x-filler"].len(), within);
    drop(answer);
    let beyond = send(HTTP1_MAX_READ_BUFFER * 2).await;
    assert!(beyond.is_err(), "a head larger than the buffer is refused");
}

#[tokio::test]
async fn a_dead_cached_connection_is_replaced_transparently() {
    for protocols in [Protocols::H2AndHttp1, Protocols::Http1Only] {
        let h = Harness::new();
        let peer = TlsPeer::start(&h.pki, protocols).await;
        h.pool.publish(vec![peer.host()]);
        h.get().await.expect("first request");
        tokio::task::yield_now().await;

        peer.kill_connections();
        // Bounded: each request either succeeds or fails; no loop on our side.
        let body = h
            .get()
            .await
            .expect("second request after the peer dropped it");
        assert!(body.starts_with("peer "), "{body}");
        assert_eq!(peer.connections.load(Ordering::SeqCst), 2, "{protocols:?}");
        let s = h.scrape();
        assert_eq!(s.dial_failures("error"), 0.0, "{protocols:?}");
    }
}

/// An idle HTTP/1.1 connection is not driven by anyone, so a close by the peer
/// is only seen when the connection is next taken. A write, which is never sent
/// twice, must then go out on a new connection, not fail on the closed one.
#[tokio::test]
async fn a_write_after_the_peer_closed_the_idle_connection_takes_a_new_one() {
    let (h, peer) = Harness::with_peer(Protocols::H2AndHttp1).await;
    h.get_in(Lane::Exchange).await.expect("first exchange");
    peer.kill_connections();
    // Lets the peer's task close its side; the close is a FIN on loopback.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;

    let sender = h.exchange().await;
    assert!(!sender.is_reused(), "the closed connection was handed out");
    let post = http::Request::builder()
        .method(http::Method::POST)
        .uri("/apis/example.com/v1")
        .header(http::header::HOST, "target.example")
        .body(
            http_body_util::Full::new(bytes::Bytes::from_static(b"{}"))
                .map_err(|never| match never {})
                .boxed(),
        )
        .expect("request");
    let answer = sender.send(post).await.expect("the write went out");
    let body = answer.into_body().collect().await.expect("body").to_bytes();
    assert!(body.starts_with(b"peer "), "{body:?}");
    assert_eq!(peer.connections.load(Ordering::SeqCst), 2);
    assert_eq!(h.scrape().dial_failures("error"), 0.0);
}

/// Nobody reads an idle HTTP/1.1 connection, so one the peer closed would keep its
/// socket until taken again: after `HTTP1_IDLE_TIMEOUT` it is closed instead of
/// reused, however many are idle.
#[tokio::test(start_paused = true)]
async fn an_http1_connection_idle_too_long_is_closed_not_reused() {
    let (h, peer) = Harness::with_peer(Protocols::H2AndHttp1).await;
    h.get_in(Lane::Exchange).await.expect("first exchange");
    tokio::time::sleep(HTTP1_IDLE_TIMEOUT - std::time::Duration::from_secs(1)).await;
    h.get_in(Lane::Exchange)
        .await
        .expect("within the idle timeout");
    assert_eq!(peer.connections.load(Ordering::SeqCst), 1, "reused");

    tokio::time::sleep(HTTP1_IDLE_TIMEOUT).await;
    h.get_in(Lane::Exchange)
        .await
        .expect("after the idle timeout");
    assert_eq!(peer.connections.load(Ordering::SeqCst), 2, "dialled anew");
}

/// Idle HTTP/1.1 connections are closed once idle for `HTTP1_IDLE_TIMEOUT` even
/// when no request comes to take them: without that, one the peer closed would
/// keep its socket, and one still open its place on the peer, for as long as
/// the pool lives. Those that went idle together close in one sweep.
#[tokio::test]
async fn idle_http1_connections_are_closed_without_another_request() {
    use std::time::Duration;
    use tokio::time::{sleep, sleep_until, Instant};
    const IDLE: usize = 10;
    let (h, peer) = Harness::with_peer(Protocols::H2AndHttp1).await;
    // In real time until the connections are idle: with the clock paused, the
    // sweep's timer (set when the first goes idle) would let the runtime jump
    // to it while a loopback exchange is momentarily not ready.
    let mut senders = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        senders.push(h.exchange().await);
    }
    let first_idle = Instant::now();
    for sender in senders {
        let answer = sender
            .send(request("/apis/example.com/v1"))
            .await
            .expect("answer");
        answer.into_body().collect().await.expect("body");
    }
    // Lets every connection reach the idle list.
    sleep(Duration::from_millis(100)).await;
    let last_idle = Instant::now();
    assert_eq!(peer.connections.load(Ordering::SeqCst), IDLE);
    assert_eq!(peer.open.load(Ordering::SeqCst), IDLE);
    tokio::time::pause();

    sleep_until(first_idle + HTTP1_IDLE_TIMEOUT - Duration::from_secs(1)).await;
    // Gives the peer time to read a close that came too early: in real time,
    // for the reason below, and well within the second left before 90 s.
    tokio::time::resume();
    sleep(Duration::from_millis(200)).await;
    assert_eq!(peer.open.load(Ordering::SeqCst), IDLE, "none before 90 s");
    tokio::time::pause();

    sleep_until(last_idle + HTTP1_IDLE_TIMEOUT + Duration::from_secs(1)).await;
    // The sweep's timer has fired. The peer reads the closes over loopback, in
    // real time: a paused sleep ends at once whenever that I/O is not ready,
    // so on a loaded machine a wait on the paused clock could end first.
    tokio::time::resume();
    let closed_by = std::time::Instant::now() + Duration::from_secs(10);
    // Bounded: 10 s in real time.
    while peer.open.load(Ordering::SeqCst) != 0 && std::time::Instant::now() < closed_by {
        sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(peer.open.load(Ordering::SeqCst), 0, "all closed after 91 s");
    assert_eq!(
        peer.requests.load(Ordering::SeqCst),
        IDLE,
        "no other request"
    );
}

#[tokio::test(start_paused = true)]
async fn pings_retire_a_connection_to_a_peer_that_stopped_answering() {
    let h = Harness::with_options(crproxy_proxy::pool::PoolOptions::default());
    let peer = TlsPeer::start(&h.pki, Protocols::H2AndHttp1).await;
    h.pool.publish(vec![peer.host()]);
    h.get().await.expect("first request");
    assert_eq!(peer.connections.load(Ordering::SeqCst), 1);

    // The peer goes silent on the open connection; the next ping goes unanswered.
    peer.freeze_connections();
    tokio::time::sleep(
        crproxy_proxy::pool::H2_KEEPALIVE_INTERVAL + crproxy_proxy::pool::H2_KEEPALIVE_TIMEOUT * 2,
    )
    .await;
    // Bounded: without pings the request would wait on the dead connection.
    tokio::time::timeout(std::time::Duration::from_secs(60), h.get())
        .await
        .expect("not stuck on the frozen connection")
        .expect("served on a fresh connection");
    assert_eq!(peer.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_retry_prefers_a_healthy_peer_over_a_second_trial() {
    let h = Harness::new();
    let (refused_a, refused_b) = (RefusedPort::bind(), RefusedPort::bind());
    let dead_a = refused_a.addr.to_string();
    let dead_b = refused_b.addr.to_string();
    let live = TlsPeer::start(&h.pki, Protocols::H2AndHttp1).await;
    h.pool.publish(vec![dead_a, dead_b, live.host()]);
    // Warm-up: until both dead peers are quarantined some requests may fail (two
    // dead peers in a row exhaust the single retry); bounded by the attempts.
    for _ in 0..10 {
        let _ = h.get().await;
    }
    assert_eq!(h.scrape().peers("quarantined"), 2.0);

    // Both quarantines expire together: every request must still succeed, even
    // the one whose first pick is a failing trial.
    tokio::time::sleep(crproxy_proxy::pool::QUARANTINE_DURATION).await;
    assert_eq!(h.scrape().peers("half_open"), 2.0);
    for i in 0..10 {
        h.get()
            .await
            .unwrap_or_else(|e| panic!("request {i} failed: {e}"));
    }
}

/// Every dialled connection, of either protocol, has TCP keepalive, so that the
/// kernel closes idle connections to a peer that vanished without closing them
/// (no FIN, no reset) within seconds, rather than a request finding out by
/// waiting out its deadline on a pooled one. (The closing itself is the
/// kernel's; this checks that every dial asks for it.)
#[tokio::test]
async fn dialled_connections_probe_idle_peers() {
    use crproxy_proxy::dial::{KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES};
    let pki = Pki::new();
    let peer = TlsPeer::start(&pki, Protocols::H2AndHttp1).await;
    let dialer = pki.dialer();
    for conn in [
        dialer.dial(&peer.host()).await.expect("dial"),
        dialer
            .dial_http1(&peer.host())
            .await
            .expect("dial http/1.1"),
    ] {
        let socket = socket2::SockRef::from(conn.stream.get_ref().0);
        assert!(socket.keepalive().expect("SO_KEEPALIVE"));
        assert_eq!(socket.tcp_keepalive_time().expect("idle"), KEEPALIVE_IDLE);
        assert_eq!(
            socket.tcp_keepalive_interval().expect("interval"),
            KEEPALIVE_INTERVAL
        );
        assert_eq!(
            socket.tcp_keepalive_retries().expect("probes"),
            KEEPALIVE_PROBES
        );
    }
}

/// A dial is a TLS handshake; one that resumes an earlier session skips verifying
/// the peer's certificate chain again, the dearest part of a dial. The dialer's two
/// identities (HTTP/2 first, and HTTP/1.1 alone) share one session store.
#[tokio::test]
async fn a_later_connection_to_a_peer_resumes_the_tls_session() {
    use rustls::HandshakeKind;
    let pki = Pki::new();
    let peer = TlsPeer::start(&pki, Protocols::H2AndHttp1).await;
    let dialer = pki.dialer();
    let kind = |c: &crproxy_proxy::dial::PeerConnection| c.stream.get_ref().1.handshake_kind();

    let first = dialer.dial_http1(&peer.host()).await.expect("first dial");
    assert_eq!(kind(&first), Some(HandshakeKind::Full));
    // One exchange, so the client reads the session tickets the peer sent after
    // the handshake.
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(first.stream))
            .await
            .expect("http/1.1 handshake");
    let driver = tokio::spawn(connection);
    let answer = sender.send_request(request("/x")).await.expect("answer");
    answer.into_body().collect().await.expect("body");

    let second = dialer.dial_http1(&peer.host()).await.expect("second dial");
    assert_eq!(kind(&second), Some(HandshakeKind::Resumed));
    let third = dialer.dial(&peer.host()).await.expect("third dial");
    assert_eq!(kind(&third), Some(HandshakeKind::Resumed));
    driver.abort();
}
