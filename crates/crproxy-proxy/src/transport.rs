//! Sending a request to one of the target's peers, and the response bodies that
//! enforce the proxy's rules while they stream: the 60 s cap on non-watch requests
//! and the watch accounting.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use tokio::time::{Instant, Sleep};

use crate::metrics::{InflightGuard, TargetMetrics, WatchGuard};
pub use crate::pool::empty;
use crate::pool::{BoxError, Lane, PeerPool, PoolError, ProxyBody, SendError};
use crproxy_core::locks;
use crproxy_core::reason::Reason;
use std::sync::Arc;

/// Hard cap on one non-watch request, end to end.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(60);

/// Upper bound for request bodies the proxy must read whole (owned-mode writes) and
/// for responses it must inspect (owned-mode named GET). kube-apiserver refuses
/// request bodies above 3 MiB; responses of one object are far below the cap.
pub const MAX_BUFFERED_BODY: usize = 16 * 1024 * 1024;

/// Headers that describe one hop, or the caller's identity on the client side; none
/// of them may reach the target.
const DROPPED_REQUEST_HEADERS: &[&str] = &[
    "authorization",
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    // Bodies may be rewritten (ownership labels, preconditions); hyper derives the
    // length from the body it actually sends.
    "content-length",
];

/// Identity prefixes the aggregator uses for the caller. The target must judge the
/// client's own identity, never the caller's, so these are dropped.
const DROPPED_REQUEST_PREFIXES: &[&str] = &["x-remote-", "impersonate-"];

/// As header names, not text: removing by name then needs no parsing.
const DROPPED_RESPONSE_HEADERS: [HeaderName; 7] = [
    http::header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    http::header::TE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
];

/// A request could not be completed against the target.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// No peer could be used: the pool's precheck or every dial failed, for the
    /// request or for its resend after a cached connection died under it.
    #[error("{0}")]
    Pool(#[from] PoolError),
    /// The request reached a connection but the exchange failed.
    #[error("{0}")]
    Send(String),
    /// The 60 s deadline expired before the response headers arrived.
    #[error("context deadline exceeded")]
    Deadline,
    /// A response body the proxy had to read was larger than it will hold.
    #[error("response body larger than {MAX_BUFFERED_BODY} bytes")]
    TooLarge,
    /// The client identity's current credentials could not be read (a token file
    /// gone, an exec plugin failing).
    #[error("{0}")]
    Credentials(#[source] crproxy_kube::Error),
}

impl From<SendError> for ForwardError {
    fn from(error: SendError) -> Self {
        match error {
            // A resend whose new connection could not be had failed as a dial
            // (or a rejection) does: it keeps that reason.
            SendError::Pool(error) => ForwardError::Pool(error),
            SendError::InvalidRequest { .. } | SendError::Http { .. } => {
                ForwardError::Send(error.to_string())
            }
        }
    }
}

impl ForwardError {
    /// The outcome reason a failed request is counted under.
    pub fn reason(&self) -> Reason {
        match self {
            ForwardError::Pool(e) => e.reason(),
            ForwardError::Deadline => Reason::Deadline,
            // A failure on an established connection is not a dial failure; the
            // vocabulary's catch-all for unattributed proxy-local failures is upstream.
            ForwardError::Send(_) | ForwardError::TooLarge | ForwardError::Credentials(_) => {
                Reason::Upstream
            }
        }
    }
}

/// `work`, or [`ForwardError::Deadline`] once `deadline` has passed: the one way a
/// deadline ends the proxy's own waits on a target.
///
/// Not an `async fn`: its state would hold `work` twice, as the argument and
/// inside the timeout it awaits, and every request's future (kept whole until the
/// response head is out, for each of 10 000 watches opening at once) would carry
/// the copy.
pub fn within<T>(
    deadline: Instant,
    work: impl Future<Output = Result<T, ForwardError>>,
) -> impl Future<Output = Result<T, ForwardError>> {
    use futures_util::FutureExt;
    tokio::time::timeout_at(deadline, work)
        .map(|outcome| outcome.unwrap_or(Err(ForwardError::Deadline)))
}

/// A request's path and query on the target.
#[derive(Debug, Clone, Copy)]
pub enum TargetPath<'a> {
    /// The caller's own, parsed when its request was read: passed on as it is.
    Caller(&'a PathAndQuery),
    /// One the proxy wrote (a scoped list, a page, an object of its own).
    Written(&'a str),
}

impl TargetPath<'_> {
    pub fn as_str(&self) -> &str {
        match self {
            TargetPath::Caller(parsed) => parsed.as_str(),
            TargetPath::Written(text) => text,
        }
    }

    /// The request URI; only a written path is parsed here.
    fn uri(self) -> Result<Uri, ForwardError> {
        match self {
            TargetPath::Caller(parsed) => Ok(Uri::from(parsed.clone())),
            TargetPath::Written(text) => {
                Uri::try_from(text).map_err(|e| ForwardError::Send(e.to_string()))
            }
        }
    }
}

/// How the proxy reaches one target: its peers and its credentials.
#[derive(Clone)]
pub struct TargetConnection {
    pub pool: Arc<PeerPool>,
    /// The Host header every request carries: the name the target's certificate is
    /// issued for. Made once, when the target is configured, so that a request
    /// shares it rather than copying and checking the name again.
    pub host: HeaderValue,
    /// The client identity on the target. Asked before every request, so a rotated
    /// token is sent at once and a renewed client certificate is presented by the
    /// next connection the pool dials.
    pub credentials: Arc<crproxy_kube::Credentials>,
}

impl TargetConnection {
    /// Sends a request to the next selectable peer with the caller's method, path
    /// and query, and headers (filtered here); `media_type`, when the proxy
    /// wrote the body itself, replaces the caller's `Content-Type`. With a
    /// deadline, a dial still running when it expires is counted as `deadline`,
    /// not `canceled`; without one (watches), the request waits as long as its
    /// caller does.
    pub async fn send_before(
        &self,
        deadline: Option<Instant>,
        method: Method,
        path_and_query: TargetPath<'_>,
        caller_headers: &HeaderMap,
        media_type: Option<&'static str>,
        body: ProxyBody,
    ) -> Result<Response<ProxyBody>, ForwardError> {
        let headers = forwarded_headers(caller_headers, None, media_type);
        // A request with a deadline ends within it and may have a connection of
        // its own; one without (a watch) may last for hours and shares one.
        let lane = match deadline {
            Some(_) => Lane::Exchange,
            None => Lane::Stream,
        };
        self.exchange(deadline, lane, method, path_and_query, headers, body)
            .await
    }

    /// A long-lived GET of the proxy's own (a watch it reads itself) on an
    /// HTTP/1.1 connection of its own, which the reading task drives. The
    /// connection counts towards the peer's `MAX_EXCHANGE_CONNECTIONS`; past
    /// it, the watch shares an HTTP/2 connection as callers' watches do. The
    /// connection is dialled for the watch ([`Lane::OwnWatch`]), and the answer
    /// carries a duplicate of its socket as a [`crate::pool::ConnectionSocket`]
    /// extension, for the reader to let it rest.
    ///
    /// The answer's head must come within [`REQUEST_DEADLINE`], or the watch
    /// ends as [`ForwardError::Deadline`]: the target sends it as soon as the
    /// watch has started. Nothing else would end the wait: HTTP/1.1 has no pings,
    /// and the dial sets no `TCP_USER_TIMEOUT` (see `crate::dial`), so a target
    /// that took the request and never answers would hold the connection, and
    /// leave the cache trusting what it holds, for as long as the process lives.
    /// The body is the reader's to bound.
    pub async fn send_own_watch(
        &self,
        path_and_query: TargetPath<'_>,
        caller_headers: &HeaderMap,
    ) -> Result<Response<ProxyBody>, ForwardError> {
        let headers = forwarded_headers(caller_headers, None, None);
        self.exchange(
            Some(Instant::now() + REQUEST_DEADLINE),
            Lane::OwnWatch,
            Method::GET,
            path_and_query,
            headers,
            empty(),
        )
        .await
    }

    /// A bodiless GET with the caller's headers, changed as `inspected` says when
    /// the proxy reads or rewrites the answer itself (without copying them first).
    pub async fn send_get(
        &self,
        deadline: Instant,
        path_and_query: TargetPath<'_>,
        caller_headers: &HeaderMap,
        inspected: Option<&Inspected>,
    ) -> Result<Response<ProxyBody>, ForwardError> {
        let headers = forwarded_headers(caller_headers, inspected, None);
        self.exchange(
            Some(deadline),
            Lane::Exchange,
            Method::GET,
            path_and_query,
            headers,
            empty(),
        )
        .await
    }

    /// One exchange; with a deadline, its answer's head comes within it or the
    /// exchange ends as [`ForwardError::Deadline`] (the body is [`DeadlineBody`]'s
    /// or the reader's to bound).
    async fn exchange(
        &self,
        deadline: Option<Instant>,
        lane: Lane,
        method: Method,
        path_and_query: TargetPath<'_>,
        headers: HeaderMap,
        body: ProxyBody,
    ) -> Result<Response<ProxyBody>, ForwardError> {
        let sent = self.exchange_unbounded(deadline, lane, method, path_and_query, headers, body);
        match deadline {
            Some(deadline) => within(deadline, sent).await,
            None => sent.await,
        }
    }

    async fn exchange_unbounded(
        &self,
        deadline: Option<Instant>,
        lane: Lane,
        method: Method,
        path_and_query: TargetPath<'_>,
        mut headers: HeaderMap,
        body: ProxyBody,
    ) -> Result<Response<ProxyBody>, ForwardError> {
        let mut request = Request::builder()
            .method(method)
            .uri(path_and_query.uri()?)
            .body(body)
            .map_err(|e| ForwardError::Send(e.to_string()))?;
        self.stamp(&mut headers).await?;
        let sent_authorization = headers.get(http::header::AUTHORIZATION).cloned();
        *request.headers_mut() = headers;
        let sender = self.pool.acquire_in(lane, deadline).await?;
        let response = sender.send(request).await?;
        if response.status() == StatusCode::UNAUTHORIZED {
            // The identity's token was refused: read its file or run its plugin again
            // for the next request instead of waiting for the next recheck.
            self.credentials
                .invalidate(sent_authorization.as_ref())
                .await;
        }
        Ok(response.map(|body| body.map_err(|e| -> BoxError { Box::new(e) }).boxed()))
    }

    /// A small request of the proxy's own (ownership check, namespace mirroring):
    /// the response body is read whole, all of it within `deadline`.
    pub async fn call(
        &self,
        deadline: Instant,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<(StatusCode, Bytes), ForwardError> {
        self.call_accepting(deadline, method, path, "application/json", body)
            .await
    }

    /// [`TargetConnection::call`] asking for the answer as `accept`.
    pub async fn call_accepting(
        &self,
        deadline: Instant,
        method: Method,
        path: &str,
        accept: &'static str,
        body: Option<Bytes>,
    ) -> Result<(StatusCode, Bytes), ForwardError> {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::ACCEPT, HeaderValue::from_static(accept));
        let media_type = body.is_some().then_some("application/json");
        let body = body.map_or_else(empty, full);
        let response = self
            .send_before(
                Some(deadline),
                method,
                TargetPath::Written(path),
                &headers,
                media_type,
                body,
            )
            .await?;
        let status = response.status();
        let bytes = within(
            deadline,
            read_limited(response.into_body(), MAX_BUFFERED_BODY),
        )
        .await?;
        Ok((status, bytes))
    }

    async fn stamp(&self, headers: &mut HeaderMap) -> Result<(), ForwardError> {
        headers.insert(http::header::HOST, self.host.clone());
        let authorization = self
            .credentials
            .authorization()
            .await
            .map_err(ForwardError::Credentials)?;
        if let Some(value) = authorization {
            headers.insert(http::header::AUTHORIZATION, value);
        }
        Ok(())
    }
}

/// How the caller's headers change for a GET whose answer the proxy reads or
/// rewrites: it always asks for the answer uncompressed (no `Accept-Encoding`).
#[derive(Debug, Clone, Default)]
pub struct Inspected {
    /// Replaces the caller's `Accept`; `None` keeps it.
    pub accept: Option<HeaderValue>,
    /// Leaves out the caller's `If-None-Match` and `If-Modified-Since`: the answer
    /// is rewritten, so the target's 304 for its own version would not describe
    /// what the caller holds.
    pub rewritten: bool,
}

impl Inspected {
    /// An answer the proxy reads as JSON and rewrites before it goes back.
    pub fn rewritten_json() -> Inspected {
        Inspected {
            accept: Some(HeaderValue::from_static("application/json")),
            rewritten: true,
        }
    }
}

/// The caller's headers a request whose answer the proxy rewrites goes without:
/// validators the target would judge against its own version (a 304 for a
/// version the caller never got in its rewritten form), and ranges (kube-openapi
/// serves its documents through Go's `ServeContent`, which answers a `Range` 206
/// with the part asked for, and a part cannot be rewritten).
const NOT_FOR_REWRITTEN_ANSWERS: [HeaderName; 4] = [
    http::header::IF_NONE_MATCH,
    http::header::IF_MODIFIED_SINCE,
    http::header::RANGE,
    http::header::IF_RANGE,
];

/// The caller's headers that may reach the target, changed as `inspected` says
/// when the proxy reads the answer, and with `media_type` in place of the
/// caller's `Content-Type` when the proxy wrote the body. Sized up front: the
/// proxy adds `Host` and `Authorization`.
fn forwarded_headers(
    caller_headers: &HeaderMap,
    inspected: Option<&Inspected>,
    media_type: Option<&'static str>,
) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(caller_headers.len() + 3);
    for (name, value) in caller_headers {
        let changed = inspected.is_some_and(|inspected| {
            name == http::header::ACCEPT_ENCODING
                || (name == http::header::ACCEPT && inspected.accept.is_some())
                || (inspected.rewritten && NOT_FOR_REWRITTEN_ANSWERS.contains(name))
        }) || (name == http::header::CONTENT_TYPE && media_type.is_some());
        if !changed && keep_request_header(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    if let Some(accept) = inspected.and_then(|inspected| inspected.accept.clone()) {
        headers.insert(http::header::ACCEPT, accept);
    }
    if let Some(media_type) = media_type {
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(media_type),
        );
    }
    headers
}

fn keep_request_header(name: &HeaderName) -> bool {
    let name = name.as_str();
    !DROPPED_REQUEST_HEADERS.contains(&name)
        && !DROPPED_REQUEST_PREFIXES.iter().any(|p| name.starts_with(p))
        // The aggregator's own forwarding headers describe the client side.
        && !name.starts_with("x-forwarded-")
}

/// Readies a target answer's headers for the caller, in one pass over them: drops
/// the hop-by-hop ones, and marks those whose value is new on every answer (kube's
/// `Audit-Id`, one per request) so that HTTP/2 sends them as literals that are
/// never indexed. An HPACK encoder otherwise adds each such value to the
/// connection's table, where no later answer can use it: each answer then walks
/// the entries of that name, inserts one and evicts another, on a connection an
/// aggregator keeps for all its requests. The value goes out as before; its name is
/// then written out instead of referred to by index, a few bytes more. HTTP/1.1
/// ignores the mark.
pub fn prepare_response_headers(headers: &mut HeaderMap) {
    let mut hop_by_hop = false;
    for (name, value) in headers.iter_mut() {
        if name == AUDIT_ID {
            value.set_sensitive(true);
        } else if DROPPED_RESPONSE_HEADERS.contains(name) {
            hop_by_hop = true;
        }
    }
    // Most answers carry none of them: no lookup per hop-by-hop name then.
    if hop_by_hop {
        for name in &DROPPED_RESPONSE_HEADERS {
            headers.remove(name);
        }
    }
}

const AUDIT_ID: HeaderName = HeaderName::from_static("audit-id");

/// Reads a body whole, refusing anything larger than `limit`. A body that came in
/// one piece (most objects do) is returned as it came, without a copy.
pub async fn read_limited(mut body: ProxyBody, limit: usize) -> Result<Bytes, ForwardError> {
    let mut first: Option<Bytes> = None;
    let mut buffer = bytes::BytesMut::new();
    let mut length = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ForwardError::Send(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        length += data.len();
        if length > limit {
            return Err(ForwardError::TooLarge);
        }
        match first.take() {
            None if buffer.is_empty() => first = Some(data),
            earlier => {
                if let Some(earlier) = earlier {
                    buffer.extend_from_slice(&earlier);
                }
                buffer.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| buffer.freeze()))
}

/// A complete in-memory body.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| -> BoxError { match never {} })
        .boxed()
}

/// The caller's request body, streamed through unchanged but cut off with an error
/// past `limit` bytes, so a body the proxy does not read is still bounded like
/// kube-apiserver bounds it (the target then sees a reset request, never a
/// truncated one).
pub fn limited_stream(body: hyper::body::Incoming, limit: usize) -> ProxyBody {
    http_body_util::Limited::new(body, limit).boxed()
}

/// The caller's request body, streamed through unchanged.
pub fn stream(body: hyper::body::Incoming) -> ProxyBody {
    body.map_err(|e| -> BoxError { Box::new(e) }).boxed()
}

/// A non-watch response body: stops at the request deadline, and keeps the request
/// counted as in flight (and unmeasured) until its last chunk has been taken from
/// the target.
///
/// Past the first chunk the deadline is checked on every poll, so a body whose next
/// chunk is always ready (the target has sent everything; the caller reads slowly)
/// is cut too. The request ends when its last chunk is in hand, though: that chunk
/// goes out even to a caller who asks for it after the deadline, as a whole answer's
/// one chunk always has. A caller that stops reading is the harder case: with no room in its
/// window hyper stops polling the body at all, so nothing in here would run again.
/// A body that is still streaming after its first chunk therefore gets a watchdog,
/// a task that at the deadline takes what the request holds out of the body and
/// drops it (see [`Held::Watched`]); the caller's stream ends with an error (a
/// reset) when hyper polls the body again.
pub struct DeadlineBody {
    held: Held,
    deadline: Instant,
    /// Made the first time the target keeps the body waiting: an answer that is
    /// ready when polled (most are) never registers a timer.
    sleep: Option<Pin<Box<Sleep>>>,
    /// The frame after the one last handed out, taken early to learn whether
    /// that one was the last (see [`DeadlineBody::poll_frame`]).
    ahead: Option<Result<Frame<Bytes>, BoxError>>,
    metrics: TargetMetrics,
    verb: &'static str,
    started: Instant,
}

/// What a non-watch request holds until its response's last chunk has been taken
/// or the response was cut: the target's body (and with it the target connection or stream), its
/// place in the in-flight gauge, and its place under the in-flight limit.
struct Holding {
    inner: ProxyBody,
    _inflight: InflightGuard,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Where the [`Holding`] is. Whoever takes it out (the body at its end, the body's
/// drop, or the watchdog) records the request's duration, and a `deadline`
/// termination if it cut the request: each exactly once.
enum Held {
    /// In the body alone: before the first chunk. An answer that comes whole in
    /// its first chunk ends there and never pays for a watchdog: one sent with a
    /// Content-Length ends with that chunk, one sent chunked (kube-apiserver
    /// chunks answers over 2 KiB) when the look ahead finds its end right behind
    /// it. Only an answer still streaming after that is watched.
    Here(Holding),
    /// Still streaming after its first chunk: shared with a watchdog task that
    /// takes it out at the deadline even if hyper never polls the body again. The
    /// cost (one task, one timer, an uncontended lock per poll) is paid only by
    /// answers sent in several chunks, lists mostly, and the task is aborted as
    /// soon as the body ends.
    Watched {
        shared: Arc<std::sync::Mutex<Option<Holding>>>,
        watchdog: tokio::task::AbortHandle,
    },
    /// Taken to its last chunk, failed or cut; nothing is held any more.
    Ended,
}

/// What the caller's stream ends with when the deadline cut it.
fn deadline_exceeded() -> BoxError {
    "proxy request deadline of 60s exceeded".into()
}

impl DeadlineBody {
    pub fn new(
        inner: ProxyBody,
        deadline: Instant,
        started: Instant,
        metrics: TargetMetrics,
        verb: &'static str,
        inflight: InflightGuard,
    ) -> Self {
        Self {
            held: Held::Here(Holding {
                inner,
                _inflight: inflight,
                _permit: None,
            }),
            deadline,
            sleep: None,
            ahead: None,
            metrics,
            verb,
            started,
        }
    }

    /// Keeps `permit` (a place under the replica's in-flight limit) until the
    /// response's last chunk has been taken, or the body is cut or dropped.
    pub fn holding(mut self, permit: Option<tokio::sync::OwnedSemaphorePermit>) -> Self {
        if let Held::Here(holding) = &mut self.held {
            holding._permit = permit;
        }
        self
    }

    /// Takes the holding out of the body (and out of the watchdog's reach), and
    /// records the request's end if it was still held: `cut` says the deadline
    /// ended it. Stops the watchdog.
    fn end(&mut self, cut: bool) {
        let holding = match std::mem::replace(&mut self.held, Held::Ended) {
            Held::Here(holding) => Some(holding),
            Held::Watched { shared, watchdog } => {
                watchdog.abort();
                let holding = locks::lock(&shared).take();
                holding
            }
            Held::Ended => None,
        };
        if holding.is_some() {
            record_end(&self.metrics, self.verb, self.started, cut);
        }
        // Dropped here, after the lock: the target's body and the guards go now.
        drop(holding);
    }

    /// Hands the holding to a watchdog that drops it at the deadline.
    fn watch(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Held::Here(holding) = std::mem::replace(&mut self.held, Held::Ended) else {
            return;
        };
        let shared = Arc::new(std::sync::Mutex::new(Some(holding)));
        let (metrics, verb, started, deadline) =
            (self.metrics.clone(), self.verb, self.started, self.deadline);
        let theirs = Arc::clone(&shared);
        let watchdog = runtime
            .spawn(async move {
                tokio::time::sleep_until(deadline).await;
                let holding = locks::lock(&theirs).take();
                if holding.is_some() {
                    record_end(&metrics, verb, started, true);
                }
                // The caller's stream ends with an error when hyper polls the body
                // again; the request's connection, places and gauge are free now.
                drop(holding);
            })
            .abort_handle();
        self.held = Held::Watched { shared, watchdog };
    }
}

/// Records the end of one non-watch request's response: its duration, and a
/// `deadline` termination when the cap cut it.
fn record_end(metrics: &TargetMetrics, verb: &'static str, started: Instant, cut: bool) {
    if cut {
        metrics.termination(Reason::Deadline);
    }
    metrics.request_duration(verb, started.elapsed().as_secs_f64());
}

impl DeadlineBody {
    /// Whether a request still streaming past its first chunk has reached its
    /// deadline (where the watchdog, too, cuts it). Checked on every poll (a clock
    /// read) before anything more is taken from the target, or handed out from
    /// what was taken ahead: a target whose next chunk is always ready never
    /// returns Pending. The first chunk is not checked: an answer the handler
    /// wrote because the deadline expired (its 503 or 504, already counted) goes
    /// out as it is.
    fn is_cut(&self) -> bool {
        matches!(self.held, Held::Watched { .. }) && Instant::now() >= self.deadline
    }

    /// Takes the next frame from the target's body, ending the request when the
    /// body has ended, failed or run past the deadline.
    fn take(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.is_cut() {
            // Counted here unless the watchdog has counted it already.
            self.end(true);
            return Poll::Ready(Some(Err(deadline_exceeded())));
        }
        let (polled, ended) = match &mut self.held {
            Held::Here(holding) => {
                let polled = Pin::new(&mut holding.inner).poll_frame(cx);
                let ended = holding.inner.is_end_stream();
                (polled, ended)
            }
            Held::Watched { shared, .. } => {
                let mut guard = locks::lock(shared);
                let Some(holding) = guard.as_mut() else {
                    // The watchdog cut the request (and counted it) while hyper
                    // was not polling.
                    drop(guard);
                    self.held = Held::Ended;
                    return Poll::Ready(Some(Err(deadline_exceeded())));
                };
                let polled = Pin::new(&mut holding.inner).poll_frame(cx);
                let ended = holding.inner.is_end_stream();
                (polled, ended)
            }
            Held::Ended => return Poll::Ready(None),
        };
        match polled {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.end(false),
            // The last chunk is in hand: the request holds nothing more from the
            // target. Ended now rather than when hyper drops the body: to a
            // caller with no room in its window hyper keeps the chunk unsent, and
            // the body alive, for as long as the connection lives, and with it
            // the request's place under the in-flight limit.
            Poll::Ready(Some(Ok(_))) if ended => self.end(false),
            Poll::Ready(Some(Ok(_))) => {}
            Poll::Pending => {
                let deadline = self.deadline;
                let sleep = self
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.as_mut().poll(cx).is_ready() {
                    self.end(true);
                    return Poll::Ready(Some(Err(deadline_exceeded())));
                }
            }
        }
        polled
    }
}

impl Body for DeadlineBody {
    type Data = Bytes;
    type Error = BoxError;

    /// Hands out the target's frames, each with the frame after it already taken
    /// when the target has sent it. A body sent chunked (no Content-Length) does
    /// not say that a chunk is its last; its end comes as a frame of its own. Seen
    /// one frame early, the end is known when the last chunk goes out: hyper puts
    /// END_STREAM on that chunk's DATA frame instead of sending an empty one, the
    /// request lets go of the target connection and its in-flight place at once
    /// (even to a caller with no window, whom hyper never polls again), and an
    /// answer that came whole needs no watchdog. It holds one more chunk than
    /// the caller has taken, no more.
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let current = match this.ahead.take() {
            // Taken before the request was cut: the caller gets the cut (from
            // `take`), not it.
            Some(taken) if !this.is_cut() => taken,
            _ => match this.take(cx) {
                Poll::Ready(Some(taken)) => taken,
                other => return other,
            },
        };
        if current.is_ok() && !matches!(this.held, Held::Ended) {
            match this.take(cx) {
                // An empty DATA frame that only carries the end (as an HTTP/2
                // target sends after a long answer) is dropped: held, it would
                // keep hyper from putting END_STREAM on the chunk before it.
                Poll::Ready(Some(Ok(next)))
                    if matches!(this.held, Held::Ended)
                        && next.data_ref().is_some_and(Bytes::is_empty) => {}
                Poll::Ready(Some(next)) => this.ahead = Some(next),
                Poll::Ready(None) | Poll::Pending => {}
            }
            // Still streaming after handing out a chunk: from here on the
            // watchdog keeps the deadline even if hyper stops polling.
            if matches!(this.held, Held::Here(_)) {
                this.watch();
            }
        }
        Poll::Ready(Some(current))
    }

    fn is_end_stream(&self) -> bool {
        if self.ahead.is_some() {
            return false;
        }
        match &self.held {
            Held::Here(holding) => holding.inner.is_end_stream(),
            // Asked by hyper between polls; a lock nobody else holds before the
            // deadline.
            Held::Watched { shared, .. } => locks::lock(shared)
                .as_ref()
                .is_some_and(|holding| holding.inner.is_end_stream()),
            Held::Ended => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        let rest = match &self.held {
            Held::Here(holding) => holding.inner.size_hint(),
            Held::Watched { shared, .. } => locks::lock(shared)
                .as_ref()
                .map(|holding| holding.inner.size_hint())
                .unwrap_or_default(),
            Held::Ended => SizeHint::with_exact(0),
        };
        let ahead = match &self.ahead {
            Some(Ok(frame)) => frame.data_ref().map_or(0, |data| data.len() as u64),
            _ => 0,
        };
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(ahead));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(ahead));
        }
        hint
    }
}

impl Drop for DeadlineBody {
    fn drop(&mut self) {
        // A caller that hung up mid-body still took this long.
        self.end(false);
    }
}

/// How watch events are framed, which decides whether they can be counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchFraming {
    /// Newline-delimited JSON: one event per line.
    JsonLines,
    /// A CBOR sequence: one event per data item.
    CborSequence,
    /// Compressed, protobuf or anything else: not counted (as documented).
    Uncounted,
}

impl WatchFraming {
    pub fn of(headers: &HeaderMap) -> Self {
        if headers.contains_key(http::header::CONTENT_ENCODING) {
            return WatchFraming::Uncounted;
        }
        let content_type = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let media = content_type.split(';').next().unwrap_or("").trim();
        if media.eq_ignore_ascii_case("application/json") {
            WatchFraming::JsonLines
        } else if media.eq_ignore_ascii_case("application/cbor-seq") {
            WatchFraming::CborSequence
        } else {
            WatchFraming::Uncounted
        }
    }
}

/// A watch response body: no deadline, counted as an active watch while open, and
/// each JSON event that passes is counted.
pub struct WatchBody {
    inner: ProxyBody,
    metrics: TargetMetrics,
    framing: WatchFraming,
    cbor: crate::cbor::ItemCounter,
    _active: WatchGuard,
}

impl WatchBody {
    pub fn new(inner: ProxyBody, metrics: TargetMetrics, framing: WatchFraming) -> Self {
        let active = metrics.active_watch();
        Self {
            inner,
            metrics,
            framing,
            cbor: crate::cbor::ItemCounter::default(),
            _active: active,
        }
    }
}

impl Body for WatchBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                let events = match self.framing {
                    // kube-apiserver ends every JSON watch event with a newline and
                    // escapes newlines inside strings, so lines are events.
                    WatchFraming::JsonLines => memchr::memchr_iter(b'\n', data).count() as u64,
                    WatchFraming::CborSequence => self.cbor.push(data),
                    WatchFraming::Uncounted => 0,
                };
                if events > 0 {
                    self.metrics.watch_events(events);
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[path = "transport/tests.rs"]
mod tests;
