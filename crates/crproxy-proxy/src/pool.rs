//! The peer pool of one proxied group/version: which target API server replica a
//! request goes to, and whether it may go anywhere at all.
//!
//! A peer source publishes complete peer lists ([`PeerPool::publish`]). Requests
//! [`acquire`](PeerPool::acquire) a [`PeerSender`], which reuses a live connection to
//! the next peer in round-robin order or dials a new one. Health is tracked per host
//! with the spec's fixed thresholds:
//!
//! * a dial (TCP + TLS) gives up after [`crate::dial::DIAL_TIMEOUT`];
//! * [`QUARANTINE_THRESHOLD`] consecutive failed dials take the host out of rotation
//!   for [`QUARANTINE_DURATION`]; afterwards exactly one request makes a trial dial:
//!   success brings the host back, failure quarantines it again;
//! * when the source's subscription drops, the cached list is trusted for
//!   [`STALENESS_TOLERANCE`] measured from the drop; a publication resets the clock.
//!
//! A failed dial never reached the target, so the request is retried once on another
//! selectable peer: with one healthy peer left, a dead peer costs callers nothing.
//!
//! Requests come in two [`Lane`]s: watches share HTTP/2 connections, requests with a
//! deadline take HTTP/1.1 connections of their own up to a per-peer limit.
//!
//! Locking: one `std::sync::Mutex` per pool, never held across an `.await`.

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use crproxy_core::reason::Reason;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{header, HeaderValue, Request, Response, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;

use crate::dial::{DialError, Dialer, PeerConnection, DIAL_TIMEOUT};
use crate::metrics::TargetMetrics;
use crproxy_core::locks;

/// Consecutive failed dials that take a peer out of rotation.
pub const QUARANTINE_THRESHOLD: u32 = 3;
/// How long a quarantined peer stays out of rotation before one trial dial.
pub const QUARANTINE_DURATION: Duration = Duration::from_secs(20);
/// How long after the peer subscription drops the cached list is still trusted.
pub const STALENESS_TOLERANCE: Duration = Duration::from_secs(60);
/// Streams this pool opens at once on one HTTP/2 connection. Servers cap
/// concurrent streams per connection (Go's HTTP/2 server, so kube-apiserver, at
/// 250; hyper at 200); a request beyond the cap would wait inside the connection
/// until its deadline, and a watch indefinitely. Like Go's transport, the pool
/// opens another connection instead. Kept under both limits.
pub const MAX_STREAMS_PER_CONNECTION: usize = 100;
/// HTTP/1.1 connections per peer for [`Lane::Exchange`], busy and idle together.
/// Past it, exchanges share HTTP/2 connections, so a burst of requests costs the
/// target at most this many TLS handshakes per proxy replica, not one per request.
pub const MAX_EXCHANGE_CONNECTIONS: usize = 64;
/// Largest read buffer of an HTTP/1.1 peer connection, which also bounds the size
/// of an answer's head (kube-apiserver's are a few hundred bytes; its warnings are
/// capped far below this).
pub const HTTP1_MAX_READ_BUFFER: usize = 64 * 1024;
/// How long after its answer ended an HTTP/1.1 connection may take to be ready
/// for the next request (its request body may still be on its way) before it is
/// closed instead of kept.
const HTTP1_READY_WAIT: Duration = Duration::from_secs(5);
/// Idle connections kept per HTTP/1.1-only peer (one that refused HTTP/2).
const MAX_IDLE_HTTP1: usize = 8;
/// How long an HTTP/1.1 connection may stay idle before it is closed rather than
/// reused (Go's transport uses the same 90 s). Nobody reads an idle connection, so
/// this also bounds how long one the peer closed keeps its socket and buffers:
/// the pool's sweep closes it at most [`IDLE_SWEEP_SLACK`] later.
pub const HTTP1_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long after the oldest idle HTTP/1.1 connection's [`HTTP1_IDLE_TIMEOUT`]
/// the pool's sweep comes. Every connection idle long enough by then closes in
/// the same sweep, so connections that went idle one after the other (a burst
/// ending) cost one wake-up, not one each, and sweeps are at least this far
/// apart.
pub const IDLE_SWEEP_SLACK: Duration = Duration::from_secs(1);
/// Default HTTP/2 ping interval on peer connections.
pub const H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Default time to wait for a ping answer before the connection is closed.
pub const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts `PeerSender::send` makes when cached connections turn out dead.
const SEND_ATTEMPTS: usize = 3;

/// What a request does with its connection, which decides the kind it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// A request that may stay open indefinitely (a watch). It takes a stream of
    /// a shared HTTP/2 connection, so thousands of them need a few connections.
    Stream,
    /// A request that ends within its deadline. It takes an HTTP/1.1 connection of
    /// its own, idle or freshly dialled, while the peer has fewer than
    /// [`MAX_EXCHANGE_CONNECTIONS`], and a stream like [`Lane::Stream`] beyond
    /// that. One exchange on its own connection costs less than a multiplexed
    /// stream: no stream state, header compression or flow-control frames, and no
    /// task per request in the client (nginx, the benchmark's plain reverse proxy,
    /// speaks HTTP/1.1 to its upstreams too). The connection goes back to the idle
    /// list as soon as the response body has ended.
    Exchange,
    /// The proxy's own long-lived GET that it reads itself (the ownership cache's
    /// watch): an [`Lane::Exchange`] on a connection dialled for it, never an idle
    /// one, whose answer carries that connection's socket ([`ConnectionSocket`])
    /// for the reader to let it rest between reads ([`crate::resting_socket`]).
    /// Past the peer's limit it is served as an exchange is, without a socket.
    OwnWatch,
}

/// The boxed error type of request bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type requests are sent with.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A body with nothing in it, as a GET's or a HEAD answer's is: the same as an
/// empty `Full` to hyper (ended, exactly 0 bytes), but boxed without an
/// allocation, since nothing in it takes room.
pub fn empty() -> ProxyBody {
    use http_body_util::BodyExt as _;
    http_body_util::Empty::<Bytes>::new()
        .map_err(|never| -> BoxError { match never {} })
        .boxed()
}

/// Why [`PeerPool::acquire`] could not provide a connection.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// No peer list has been published since start, or the latest list is empty.
    #[error("no peer host is available for the proxy target: {detail}")]
    NoPeer {
        /// Which of the two cases it is.
        detail: &'static str,
    },
    /// The peer subscription has been down longer than [`STALENESS_TOLERANCE`].
    #[error("the peer list is stale: the peer subscription has been down for {down_for:?}")]
    StalePeers {
        /// How long the subscription has been down.
        down_for: Duration,
    },
    /// Every peer is quarantined, or the only candidate is in its trial dial.
    #[error("all peer hosts of the proxy target are quarantined")]
    AllQuarantined,
    /// The peer was removed from the peer list while it was being dialled.
    #[error("peer {peer} left the peer list while it was being dialled")]
    PeerDeparted {
        /// The departed peer.
        peer: String,
    },
    /// The dial failed (and so did the retry on another peer, if there was one).
    #[error(transparent)]
    Dial(#[from] DialError),
    /// The caller's deadline (see [`PeerPool::acquire_before`]) expired while a
    /// dial was in flight.
    #[error("context deadline exceeded while dialling peer {peer}")]
    Deadline {
        /// The peer being dialled.
        peer: String,
    },
    /// The pool was dropped while a request still held a sender from it.
    #[error("the peer pool was shut down")]
    Closed,
}

impl PoolError {
    /// The `reason` label for this failure.
    pub fn reason(&self) -> Reason {
        match self {
            PoolError::NoPeer { .. } => Reason::NoPeer,
            PoolError::StalePeers { .. } => Reason::StalePeers,
            PoolError::AllQuarantined => Reason::AllQuarantined,
            PoolError::PeerDeparted { .. } => Reason::PeerDeparted,
            PoolError::Dial(e) => e.reason(),
            PoolError::Deadline { .. } => Reason::Deadline,
            PoolError::Closed => Reason::Error,
        }
    }

    /// The text for the caller-facing error message.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

/// Why [`PeerSender::send`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Cached connections were dead and getting a fresh one failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The request could not be turned into a valid request for the peer (bad URI
    /// or `Host`).
    #[error("invalid request for peer {peer}: {source}")]
    InvalidRequest {
        /// The chosen peer.
        peer: String,
        /// What was wrong.
        #[source]
        source: http::Error,
    },
    /// The HTTP exchange with the peer failed after the connection was set up.
    /// The request may have reached the target.
    #[error("request to peer {peer} failed: {source}")]
    Http {
        /// The peer the request was sent to.
        peer: String,
        /// hyper's error.
        #[source]
        source: hyper::Error,
        /// Whether the connection came from the cache. A failure on a cached
        /// connection that was provably unsent, or safe to replay, was already
        /// retried on another connection before this error was returned.
        reused: bool,
    },
}

impl SendError {
    /// The `reason` label: a pool failure keeps its own reason; an HTTP failure after
    /// the connection was up is not a dial failure and reports `upstream`.
    pub fn reason(&self) -> Reason {
        match self {
            SendError::Pool(e) => e.reason(),
            SendError::InvalidRequest { .. } | SendError::Http { .. } => Reason::Upstream,
        }
    }
}

/// Tunables of a pool that are not fixed by the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOptions {
    /// Ping interval on HTTP/2 peer connections, so a peer that vanished without
    /// closing its connections (partition, node loss) is noticed by a missing ping
    /// answer rather than by every request on the cached connection running into
    /// its deadline. `None` disables pings.
    pub h2_keepalive_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is closed.
    pub h2_keepalive_timeout: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            h2_keepalive_interval: Some(H2_KEEPALIVE_INTERVAL),
            h2_keepalive_timeout: H2_KEEPALIVE_TIMEOUT,
        }
    }
}

/// Peer counts and list state for the scrape-time gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSnapshot {
    /// Peers in rotation (including ones with fewer failures than the threshold).
    pub healthy: usize,
    /// Peers whose quarantine has not expired yet.
    pub quarantined: usize,
    /// Peers whose quarantine expired, waiting for or in their trial dial.
    pub half_open: usize,
    /// Whether the pool holds a current, trusted list (possibly empty).
    pub synced: bool,
    /// Time since the last publication; `None` before the first one.
    pub list_age: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    /// In rotation.
    Healthy,
    /// Out of rotation until `until`; afterwards the next request makes a trial.
    Quarantined { until: Instant },
    /// The single trial dial is in flight; nobody else may use the peer.
    Trial,
}

struct Peer {
    id: u64,
    /// Shared with every sender and dial to the peer: a request takes it without
    /// a copy, and only an error makes it a `String`.
    host: Arc<str>,
    consecutive_failures: u32,
    health: Health,
    /// Never sent on: dropping it (when the peer leaves the list) wakes every
    /// in-flight dial to this peer so it fails with `peer_departed`.
    departed: watch::Sender<()>,
    /// Multiplexed connections, each with the number of streams open on it.
    h2: Vec<H2Conn>,
    idle_http1: Vec<Http1Conn>,
    /// [`Lane::Exchange`] connections open to this peer, busy or idle.
    exchange_connections: Arc<AtomicUsize>,
    /// The peer refused a connection offering HTTP/1.1 alone: its exchanges take
    /// the stream lane.
    refuses_http1: bool,
    /// A dial in flight that requests finding every connection full wait for
    /// (see [`PendingDial`]).
    pending_dial: Option<PendingDial>,
    /// What the last successful dial negotiated; `None` before the first.
    speaks_h2: Option<bool>,
}

/// A dial to a peer that other requests wait for instead of each dialling its
/// own connection: a burst of requests (an aggregator opening hundreds of
/// watches at once) would otherwise open a connection per request, each with its
/// own TLS session and buffers, and keep them all for as long as the watches
/// last. An HTTP/2 connection carries [`MAX_STREAMS_PER_CONNECTION`] streams, so
/// that many requests share one dial; waiting ends when the dial does (at most
/// the dial timeout), successful or not, and the waiters select again.
struct PendingDial {
    id: u64,
    /// Closed when the dial ends: its sender lives in the dialling request's
    /// ticket.
    done: watch::Receiver<()>,
    waiters: usize,
}

/// One HTTP/2 connection to a peer and its open-stream count.
struct H2Conn {
    sender: http2::SendRequest<ProxyBody>,
    streams: Arc<AtomicUsize>,
}

/// One unit of a counted resource (a stream of an HTTP/2 connection, an exchange
/// connection of a peer), given back when dropped.
#[derive(Debug)]
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn reserve(count: &Arc<AtomicUsize>) -> Slot {
        count.fetch_add(1, Ordering::AcqRel);
        Slot(Arc::clone(count))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connection half of an HTTP/1.1 peer connection, the part that reads and
/// writes the socket.
type Http1Connection = http1::Connection<TokioIo<TlsStream<TcpStream>>, ProxyBody>;

/// An HTTP/1.1 connection; an exchange connection holds its peer's slot for as
/// long as it lives.
///
/// Its connection half is not a task of its own: whoever holds the connection
/// drives it (the request's task, then whoever reads the answer's body), nobody
/// while it is idle. A request then crosses one task fewer, each crossing a
/// wake-up that often meant another worker thread (docs/performance.md, "Issue
/// 15, fourth pass"). A close by the peer while the connection was idle is read
/// when it is next taken; one that tokio has not yet been told of can still be
/// missed, as with a connection task of its own.
struct Http1Conn {
    sender: http1::SendRequest<ProxyBody>,
    /// `None` once the connection has ended.
    connection: Option<Box<Http1Connection>>,
    exchange: Option<Slot>,
    /// When the connection was dialled or last went back to the idle list.
    idle_since: Instant,
    /// A duplicate of the connection's socket, made when it was dialled for a
    /// [`Lane::OwnWatch`] (hyper keeps the socket out of reach once the
    /// handshake has it) and handed to that watch's answer.
    socket: Option<OwnedFd>,
}

/// A response extension on the answer of a [`Lane::OwnWatch`] request: a
/// duplicate of the socket it arrives on (shared: extensions must be `Clone`).
/// It keeps the socket open while it lives, so it is dropped with the answer's
/// body.
#[derive(Debug, Clone)]
pub struct ConnectionSocket(pub Arc<OwnedFd>);

impl Http1Conn {
    /// Lets the connection write what is queued and read what has arrived. When it
    /// has ended it is dropped, which hands a request it never took back to its
    /// sender.
    fn drive(&mut self, cx: &mut Context<'_>) {
        let Some(connection) = self.connection.as_mut() else {
            return;
        };
        if let Poll::Ready(result) = Pin::new(connection.as_mut()).poll(cx) {
            if let Err(err) = result {
                tracing::debug!(error = %err, "peer HTTP/1.1 connection ended");
            }
            self.connection = None;
        }
    }

    /// Whether the connection can take a request now. Reads what arrived while
    /// it was idle, so a close by the peer that tokio has seen is found here;
    /// nothing is woken later.
    fn is_open(&mut self) -> bool {
        self.drive(&mut Context::from_waker(Waker::noop()));
        // With the task's cooperative budget spent, tokio does not read the
        // socket and a closed connection would look open: count it as closed.
        self.connection.is_some()
            && self.sender.is_ready()
            && tokio::task::coop::has_budget_remaining()
    }

    /// Whether the connection has been idle for longer than [`HTTP1_IDLE_TIMEOUT`].
    fn idle_too_long(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.idle_since) >= HTTP1_IDLE_TIMEOUT
    }

    /// Sends `req` and waits for the answer's head, driving the connection.
    async fn send(
        &mut self,
        req: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<ProxyBody>>> {
        let mut sent = std::pin::pin!(self.sender.try_send_request(req));
        std::future::poll_fn(|cx| {
            self.drive(cx);
            sent.as_mut().poll(cx)
        })
        .await
    }
}

impl Peer {
    fn new(id: u64, host: String) -> Peer {
        Peer {
            id,
            host: host.into(),
            consecutive_failures: 0,
            health: Health::Healthy,
            departed: watch::channel(()).0,
            h2: Vec::new(),
            idle_http1: Vec::new(),
            exchange_connections: Arc::new(AtomicUsize::new(0)),
            refuses_http1: false,
            pending_dial: None,
            speaks_h2: None,
        }
    }

    fn selectable(&self, now: Instant) -> bool {
        match self.health {
            Health::Healthy => true,
            Health::Quarantined { until } => until <= now,
            Health::Trial => false,
        }
    }

    /// Whether a request of `lane` is an exchange on this peer.
    fn exchange_lane(&self, lane: Lane) -> bool {
        matches!(lane, Lane::Exchange | Lane::OwnWatch) && !self.refuses_http1
    }

    fn drop_connections(&mut self) {
        self.h2.clear();
        self.idle_http1.clear();
    }

    /// Takes the idle HTTP/1.1 connections idle for [`HTTP1_IDLE_TIMEOUT`] off
    /// the list, for the caller to close once the lock is released.
    fn take_idle_too_long(&mut self, now: Instant) -> std::vec::Drain<'_, Http1Conn> {
        // The oldest idle connections are at the bottom.
        let expired = self
            .idle_http1
            .iter()
            .take_while(|c| c.idle_too_long(now))
            .count();
        self.idle_http1.drain(..expired)
    }
}

#[derive(Default)]
struct State {
    peers: Vec<Peer>,
    /// Round-robin cursor into `peers`.
    next: usize,
    next_id: u64,
    /// Identifies [`PendingDial`]s.
    next_dial_id: u64,
    last_publish: Option<Instant>,
    /// When the subscription dropped; `None` while it is up.
    down_since: Option<Instant>,
    /// The stale-list log line was written for the current outage.
    stale_logged: bool,
    /// The idle sweep has a sweep due (see [`sweep_idle_http1`]); when not, the
    /// next connection going idle wakes it.
    idle_sweep_due: bool,
}

impl State {
    fn down_for(&self, now: Instant) -> Option<Duration> {
        self.down_since.map(|t| now.saturating_duration_since(t))
    }

    fn is_stale(&self, now: Instant) -> bool {
        self.down_for(now)
            .is_some_and(|down| down > STALENESS_TOLERANCE)
    }

    fn any_selectable(&self, now: Instant) -> bool {
        self.peers.iter().any(|p| p.selectable(now))
    }

    fn peer_mut(&mut self, id: u64) -> Option<&mut Peer> {
        self.peers.iter_mut().find(|p| p.id == id)
    }

    /// A connection was put on an idle list: a sweep is due from now on.
    /// Returns whether none was, so the caller wakes the sweep (after releasing
    /// the lock).
    fn idle_listed(&mut self) -> bool {
        !std::mem::replace(&mut self.idle_sweep_due, true)
    }
}

/// The peers of one proxied group/version and their health.
pub struct PeerPool {
    group_version: String,
    options: PoolOptions,
    dialer: Dialer,
    metrics: TargetMetrics,
    /// The authority for requests that carry neither an absolute URI nor `Host`.
    default_authority: String,
    state: Mutex<State>,
    listed: watch::Sender<bool>,
    /// Wakes the idle sweep ([`sweep_idle_http1`]): parked, when a connection
    /// goes idle; parked or asleep, when the pool is dropped.
    idle_sweep: Arc<tokio::sync::Notify>,
    self_ref: Weak<PeerPool>,
}

impl Drop for PeerPool {
    fn drop(&mut self) {
        // The sweep holds the pool weakly: woken, it finds it gone and ends.
        self.idle_sweep.notify_one();
    }
}

impl std::fmt::Debug for PeerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerPool")
            .field("target", &self.metrics.target_label())
            .field("group_version", &self.group_version)
            .finish_non_exhaustive()
    }
}

enum DialOutcome {
    Departed,
    Deadline,
    Done(Result<Conn, DialError>),
}

enum Selection {
    Cached(PeerSender),
    Dial(DialTicket),
    /// Another request's dial to `peer` will have room: wait until it ends.
    Wait {
        peer: Arc<str>,
        done: watch::Receiver<()>,
    },
    Rejected(PoolError),
}

/// How many times one request waits for other requests' dials before it dials
/// itself; each wait lasts at most one dial.
const MAX_DIAL_WAITS: usize = 3;

impl PeerPool {
    /// A pool with no peer list yet; requests fail with `no_peer` until the first
    /// publication. The pool registers itself for the scrape-time peer gauges.
    pub fn new(group_version: String, dialer: Dialer, metrics: TargetMetrics) -> Arc<PeerPool> {
        Self::with_options(group_version, dialer, metrics, PoolOptions::default())
    }

    /// [`new`](Self::new) with explicit [`PoolOptions`].
    pub fn with_options(
        group_version: String,
        dialer: Dialer,
        metrics: TargetMetrics,
        options: PoolOptions,
    ) -> Arc<PeerPool> {
        let default_authority = dialer.server_name().to_str().into_owned();
        let pool = Arc::new_cyclic(|me| PeerPool {
            group_version,
            options,
            dialer,
            metrics,
            default_authority,
            state: Mutex::new(State::default()),
            listed: watch::channel(false).0,
            idle_sweep: Arc::new(tokio::sync::Notify::new()),
            self_ref: me.clone(),
        });
        pool.metrics
            .register_pool(&pool.group_version, Arc::downgrade(&pool));
        // Outside a runtime (some unit tests) there is nothing to sweep: no
        // connection can be dialled either.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweep_idle_http1(
                Arc::downgrade(&pool),
                Arc::clone(&pool.idle_sweep),
            ));
        }
        pool
    }

    /// The group/version this pool serves.
    pub fn group_version(&self) -> &str {
        &self.group_version
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        locks::lock(&self.state)
    }

    // ---- publication side -------------------------------------------------------

    /// Replaces the peer list with `peers` (complete, `host:port` each). Hosts that
    /// stay keep their health and connections, new hosts start healthy, and dials in
    /// flight to removed hosts fail with `peer_departed`. Marks the subscription up
    /// and resets the staleness clock.
    pub fn publish(&self, peers: Vec<String>) {
        let now = Instant::now();
        let mut st = self.lock();
        let mut old: HashMap<Arc<str>, Peer> =
            st.peers.drain(..).map(|p| (p.host.clone(), p)).collect();
        let mut fresh = Vec::with_capacity(peers.len());
        for host in peers {
            if fresh.iter().any(|p: &Peer| *p.host == *host) {
                continue;
            }
            let peer = match old.remove(host.as_str()) {
                Some(peer) => peer,
                None => {
                    st.next_id += 1;
                    Peer::new(st.next_id, host)
                }
            };
            fresh.push(peer);
        }
        let removed: Vec<String> = old.into_keys().map(|host| host.to_string()).collect();
        st.next = if fresh.is_empty() {
            0
        } else {
            st.next % fresh.len()
        };
        st.peers = fresh;
        st.last_publish = Some(now);
        st.down_since = None;
        st.stale_logged = false;
        let count = st.peers.len();
        drop(st);
        tracing::debug!(
            target = self.metrics.target_label(),
            group_version = %self.group_version,
            peers = count,
            removed = ?removed,
            "peer list published"
        );
        self.listed.send_replace(true);
    }

    /// The peer subscription dropped: the cached list stays trusted for
    /// [`STALENESS_TOLERANCE`] from now. Repeated calls keep the first drop time.
    pub fn subscription_dropped(&self) {
        let now = Instant::now();
        let mut st = self.lock();
        if st.down_since.is_none() {
            st.down_since = Some(now);
            drop(st);
            tracing::warn!(
                target = self.metrics.target_label(),
                group_version = %self.group_version,
                "peer subscription dropped; the cached peer list stays in use for 60s"
            );
        }
    }

    /// The peer subscription is back; the cached list is trusted again. Sources
    /// normally follow this with a [`publish`](Self::publish).
    pub fn subscription_restored(&self) {
        let mut st = self.lock();
        st.down_since = None;
        st.stale_logged = false;
    }

    /// Waits until the first peer list is published or `timeout` passes; returns
    /// whether a list arrived.
    pub async fn wait_for_first_list(&self, timeout: Duration) -> bool {
        let mut rx = self.listed.subscribe();
        let arrived = matches!(
            tokio::time::timeout(timeout, rx.wait_for(|listed| *listed)).await,
            Ok(Ok(_))
        );
        arrived
    }

    /// Current peer counts and list state, with expired quarantines as `half_open`.
    pub fn snapshot(&self) -> PoolSnapshot {
        let now = Instant::now();
        let st = self.lock();
        let mut snap = PoolSnapshot {
            healthy: 0,
            quarantined: 0,
            half_open: 0,
            synced: st.last_publish.is_some() && !st.is_stale(now),
            list_age: st.last_publish.map(|t| now.saturating_duration_since(t)),
        };
        for peer in &st.peers {
            match peer.health {
                Health::Healthy => snap.healthy += 1,
                Health::Quarantined { until } if until > now => snap.quarantined += 1,
                Health::Quarantined { .. } | Health::Trial => snap.half_open += 1,
            }
        }
        snap
    }

    /// The hosts of the current list, in publication order.
    pub fn hosts(&self) -> Vec<String> {
        self.lock()
            .peers
            .iter()
            .map(|p| p.host.to_string())
            .collect()
    }

    // ---- request side -----------------------------------------------------------

    /// A sender on a connection to the next selectable peer: a cached live one, or a
    /// fresh dial. A failed dial is retried once on another selectable peer.
    ///
    /// Rejections and failed dials are counted in
    /// `vcluster_proxy_peer_dial_failures_total`; the caller records the request.
    pub async fn acquire(&self) -> Result<PeerSender, PoolError> {
        self.acquire_in(Lane::Stream, None).await
    }

    /// Like [`acquire`](Self::acquire), but a dial still running at `deadline` (the
    /// request's own deadline) is abandoned and counted as `deadline` rather than
    /// `canceled`. Use it where the request deadline would otherwise drop the
    /// future.
    pub async fn acquire_before(&self, deadline: Instant) -> Result<PeerSender, PoolError> {
        self.acquire_in(Lane::Stream, Some(deadline)).await
    }

    /// A sender for a request of `lane` (see [`Lane`]); with a `deadline`, as
    /// [`acquire_before`](Self::acquire_before).
    pub async fn acquire_in(
        &self,
        lane: Lane,
        deadline: Option<Instant>,
    ) -> Result<PeerSender, PoolError> {
        let mut waits = 0;
        let ticket = loop {
            match self.select(None, waits < MAX_DIAL_WAITS, lane, deadline) {
                // A cached HTTP/1.1 connection the peer closed while it was idle
                // is dropped here, outside the lock; each such turn uses one up.
                Selection::Cached(mut sender) => {
                    if sender.is_open() {
                        return Ok(sender);
                    }
                }
                Selection::Dial(ticket) => break ticket,
                Selection::Wait { peer, mut done } => {
                    waits += 1;
                    let ended = done.changed();
                    let in_time = match deadline {
                        Some(deadline) => tokio::time::timeout_at(deadline, ended).await.is_ok(),
                        None => {
                            let _ = ended.await;
                            true
                        }
                    };
                    if !in_time {
                        self.metrics.dial_failure(Reason::Deadline);
                        return Err(PoolError::Deadline {
                            peer: peer.to_string(),
                        });
                    }
                }
                Selection::Rejected(err) => {
                    self.metrics.dial_failure(err.reason());
                    return Err(err);
                }
            }
        };
        let failed_peer = ticket.peer_id;
        // Dials are boxed: a dial (TCP, TLS and HTTP handshakes) is a future of
        // several KiB that most requests never run, and every request's future
        // (kept alive by the caller's stream, for a watch as long as it lasts)
        // would otherwise be sized for it.
        let first_error = match Box::pin(self.dial(ticket, deadline)).await {
            Ok(sender) => return Ok(sender),
            // Out of time: no point in another peer.
            Err(err @ PoolError::Deadline { .. }) => return Err(err),
            Err(err) => err,
        };
        // The request never reached a target, so another peer can take it; a peer
        // that only refused HTTP/1.1 alone can take it as a stream.
        let refused_http1 = matches!(&first_error, PoolError::Dial(err) if err.refused_protocol());
        let exclude = (!refused_http1).then_some(failed_peer);
        match self.select(exclude, false, lane, deadline) {
            Selection::Cached(mut sender) => {
                if sender.is_open() {
                    Ok(sender)
                } else {
                    Err(first_error)
                }
            }
            Selection::Dial(ticket) => Box::pin(self.dial(ticket, deadline)).await,
            // No other candidate: the caller sees the failure that actually happened.
            Selection::Rejected(_) | Selection::Wait { .. } => Err(first_error),
        }
    }

    /// Picks the next peer under the lock. Never waits itself; with `may_wait`,
    /// it may tell the caller to wait for a dial in flight (see [`PendingDial`]).
    fn select(
        &self,
        exclude: Option<u64>,
        may_wait: bool,
        lane: Lane,
        deadline: Option<Instant>,
    ) -> Selection {
        let now = Instant::now();
        let mut st = self.lock();
        if st.last_publish.is_none() {
            return Selection::Rejected(PoolError::NoPeer {
                detail: "no peer list has arrived yet",
            });
        }
        if st.is_stale(now) {
            let down_for = st.down_for(now).unwrap_or_default();
            if !st.stale_logged {
                st.stale_logged = true;
                let age = st
                    .last_publish
                    .map(|t| now.saturating_duration_since(t))
                    .unwrap_or_default();
                tracing::error!(
                    target = self.metrics.target_label(),
                    group_version = %self.group_version,
                    lastNetmapAge = %format_age(age),
                    "peer watch subscription is down and no fresh netmap is available; requests to the target fail with 503 until it recovers"
                );
            }
            return Selection::Rejected(PoolError::StalePeers { down_for });
        }
        if st.peers.is_empty() {
            return Selection::Rejected(PoolError::NoPeer {
                detail: "the peer list is empty",
            });
        }
        let n = st.peers.len();
        let start = st.next;
        // The retry after a failed dial goes to a healthy peer if there is one: a
        // trial there could fail too, and the caller would see an error although a
        // healthy peer was available. First requests take trials in turn.
        let healthy_first = exclude.is_some()
            && st
                .peers
                .iter()
                .any(|p| Some(p.id) != exclude && p.health == Health::Healthy);
        for i in 0..n {
            let idx = (start + i) % n;
            let peer = &mut st.peers[idx];
            if Some(peer.id) == exclude || !peer.selectable(now) {
                continue;
            }
            if healthy_first && peer.health != Health::Healthy {
                continue;
            }
            let trial = peer.health != Health::Healthy;
            if trial {
                peer.health = Health::Trial;
            } else if let Some(conn) = take_cached(peer, lane, now) {
                let sender = PeerSender {
                    peer: peer.host.clone(),
                    peer_id: peer.id,
                    conn,
                    lane,
                    reused: true,
                    deadline,
                    pool: self.self_ref.clone(),
                };
                st.next = idx + 1;
                return Selection::Cached(sender);
            }
            // An exchange under the peer's limit dials a connection of its own.
            let exchange = (peer.exchange_lane(lane)
                && peer.exchange_connections.load(Ordering::Acquire) < MAX_EXCHANGE_CONNECTIONS)
                .then(|| Slot::reserve(&peer.exchange_connections));
            // HTTP/1.1 connections carry one request at a time: only a peer that
            // speaks (or may speak) HTTP/2 is worth waiting for.
            let may_share = !trial && exchange.is_none() && peer.speaks_h2 != Some(false);
            if let (true, true, Some(pending)) = (may_wait, may_share, &mut peer.pending_dial) {
                if pending.waiters + 1 < MAX_STREAMS_PER_CONNECTION {
                    pending.waiters += 1;
                    let wait = Selection::Wait {
                        peer: peer.host.clone(),
                        done: pending.done.clone(),
                    };
                    st.next = idx + 1;
                    return wait;
                }
            }
            let mut ticket = DialTicket {
                pool: self.self_ref.clone(),
                peer_id: peer.id,
                host: peer.host.clone(),
                trial,
                departed: peer.departed.subscribe(),
                armed: true,
                shared: None,
                lane,
                exchange,
            };
            // This dial becomes the one to wait for (also when an earlier one
            // is full: its waiters keep waiting for it).
            if may_share {
                let (ended, done) = watch::channel(());
                let id = st.next_dial_id;
                st.next_dial_id += 1;
                let peer = &mut st.peers[idx];
                peer.pending_dial = Some(PendingDial {
                    id,
                    done,
                    waiters: 0,
                });
                ticket.shared = Some((id, ended));
            }
            st.next = idx + 1;
            return Selection::Dial(ticket);
        }
        Selection::Rejected(PoolError::AllQuarantined)
    }

    /// Dials the ticket's peer, records the outcome and builds the HTTP connection.
    async fn dial(
        &self,
        mut ticket: DialTicket,
        deadline: Option<Instant>,
    ) -> Result<PeerSender, PoolError> {
        let started = Instant::now();
        let mut departed = ticket.departed.clone();
        let expired = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        let outcome = tokio::select! {
            // A departure wins over a simultaneous result: the host is gone either way.
            biased;
            _ = departed.changed() => DialOutcome::Departed,
            _ = expired => DialOutcome::Deadline,
            result = self.connect(&ticket.host, ticket.exchange.is_some(), ticket.lane == Lane::OwnWatch) => DialOutcome::Done(result),
        };
        ticket.armed = false;
        let elapsed = started.elapsed().as_secs_f64();
        let outcome = match outcome {
            DialOutcome::Deadline => {
                // Like a cancellation: says nothing about the peer's health.
                self.metrics.dial_failure(Reason::Deadline);
                if ticket.trial {
                    self.abandon_trial(ticket.peer_id);
                }
                return Err(PoolError::Deadline {
                    peer: ticket.host.to_string(),
                });
            }
            DialOutcome::Departed => None,
            DialOutcome::Done(result) => Some(result),
        };
        match outcome {
            None => {
                // Never observed in the duration histogram: it is not a dial result.
                self.metrics.dial_failure(Reason::PeerDeparted);
                Err(PoolError::PeerDeparted {
                    peer: ticket.host.to_string(),
                })
            }
            Some(Err(err)) if ticket.exchange.is_some() && err.refused_protocol() => {
                // The peer is up but will not speak HTTP/1.1 alone: not a health
                // failure; its exchanges share HTTP/2 from now on.
                self.metrics.dial_duration(elapsed);
                self.metrics.dial_failure(err.reason());
                self.refuse_exchanges(ticket.peer_id, ticket.trial);
                Err(PoolError::Dial(err))
            }
            Some(Err(err)) => {
                self.metrics.dial_duration(elapsed);
                self.metrics.dial_failure(err.reason());
                self.record_failure(ticket.peer_id, ticket.trial, &err);
                Err(PoolError::Dial(err))
            }
            Some(Ok(mut conn)) => {
                self.metrics.dial_duration(elapsed);
                let exchange = ticket.exchange.take();
                if !self.record_success(ticket.peer_id, &conn, exchange.is_some()) {
                    // The list changed between the handshake and now.
                    self.metrics.dial_failure(Reason::PeerDeparted);
                    return Err(PoolError::PeerDeparted {
                        peer: ticket.host.to_string(),
                    });
                }
                if let Conn::Http1(http1) = &mut conn {
                    // Counted for as long as the connection lives.
                    http1.exchange = exchange;
                }
                Ok(PeerSender {
                    peer: ticket.host.clone(),
                    peer_id: ticket.peer_id,
                    conn,
                    lane: ticket.lane,
                    reused: false,
                    deadline,
                    pool: self.self_ref.clone(),
                })
            }
        }
    }

    /// TLS dial plus the HTTP handshake, within one dial budget; `http1_only` for
    /// an exchange connection, `keep_socket` for the own watch's.
    async fn connect(
        &self,
        host: &str,
        http1_only: bool,
        keep_socket: bool,
    ) -> Result<Conn, DialError> {
        let started = Instant::now();
        let tls = if http1_only {
            self.dialer.dial_http1(host).await?
        } else {
            self.dialer.dial(host).await?
        };
        let remaining = DIAL_TIMEOUT.saturating_sub(started.elapsed());
        match tokio::time::timeout(remaining, http_handshake(tls, &self.options, keep_socket)).await
        {
            Ok(result) => result,
            Err(_) => Err(DialError::Timeout {
                peer: host.to_owned(),
                timeout: DIAL_TIMEOUT,
            }),
        }
    }

    /// Applies a failed dial to the peer's health. Returns nothing: the metrics and
    /// logs are the observable effect.
    fn record_failure(&self, peer_id: u64, trial: bool, err: &DialError) {
        let now = Instant::now();
        let mut st = self.lock();
        let Some(peer) = st.peer_mut(peer_id) else {
            return;
        };
        let quarantine = match peer.health {
            Health::Trial if trial => {
                peer.consecutive_failures += 1;
                true
            }
            Health::Healthy => {
                peer.consecutive_failures += 1;
                peer.consecutive_failures >= QUARANTINE_THRESHOLD
            }
            // A result from a dial that started before the peer was quarantined (or
            // a non-trial dial finishing during the trial): the decision is made.
            Health::Quarantined { .. } | Health::Trial => false,
        };
        if !quarantine {
            return;
        }
        peer.health = Health::Quarantined {
            until: now + QUARANTINE_DURATION,
        };
        peer.drop_connections();
        let host = peer.host.clone();
        let failures = peer.consecutive_failures;
        // Every quarantine that leaves nothing selectable counts, a failed trial's
        // too: an outage keeps the counter rising (its alert is an increase over
        // 10 minutes) for as long as it lasts.
        let all_now = !st.any_selectable(now);
        drop(st);
        self.metrics.peer_quarantined();
        tracing::warn!(
            host = %host,
            consecutiveFailures = failures,
            target = self.metrics.target_label(),
            group_version = %self.group_version,
            error = %err,
            "quarantining proxy target peer host after consecutive dial failures"
        );
        if all_now {
            self.metrics.all_peers_quarantined();
            tracing::error!(
                target = self.metrics.target_label(),
                group_version = %self.group_version,
                "all peer hosts for the proxy target are quarantined; requests fail fast with 503 until a peer becomes dialable"
            );
        }
    }

    /// Applies a successful dial. Returns false when the peer left the list.
    fn record_success(&self, peer_id: u64, conn: &Conn, exchange: bool) -> bool {
        let mut st = self.lock();
        let Some(peer) = st.peer_mut(peer_id) else {
            return false;
        };
        let recovered = peer.consecutive_failures > 0 || peer.health != Health::Healthy;
        peer.consecutive_failures = 0;
        peer.health = Health::Healthy;
        if !exchange {
            // An exchange dial offers HTTP/1.1 alone and says nothing about HTTP/2.
            peer.speaks_h2 = Some(matches!(conn, Conn::H2(..)));
        }
        if let Conn::H2(sender, slot) = conn {
            // Later requests share this connection until its streams are used up.
            peer.h2.push(H2Conn {
                sender: sender.clone(),
                streams: Arc::clone(&slot.0),
            });
        }
        let host = peer.host.clone();
        drop(st);
        if recovered {
            self.metrics.peer_recovered();
            tracing::info!(
                host = %host,
                target = self.metrics.target_label(),
                group_version = %self.group_version,
                "proxy target peer host is dialable again"
            );
        }
        true
    }

    /// Drops the cached connections of a peer after one of them turned out dead.
    fn forget_connections(&self, peer_id: u64) {
        if let Some(peer) = self.lock().peer_mut(peer_id) {
            peer.drop_connections();
        }
    }

    /// Drops the idle HTTP/1.1 connections of a peer that are not ready any more.
    /// They are checked (which reads their sockets) outside the lock.
    fn forget_closed_http1(&self, peer_id: u64) {
        let mut idle = match self.lock().peer_mut(peer_id) {
            Some(peer) => std::mem::take(&mut peer.idle_http1),
            None => return,
        };
        idle.retain_mut(Http1Conn::is_open);
        self.relist_idle_http1(peer_id, idle);
    }

    /// Puts back the idle HTTP/1.1 connections [`forget_closed_http1`] took off
    /// the list. A sweep that ran meanwhile found them gone and may have parked:
    /// they wake it, as connections going idle do.
    ///
    /// [`forget_closed_http1`]: Self::forget_closed_http1
    fn relist_idle_http1(&self, peer_id: u64, mut idle: Vec<Http1Conn>) {
        let mut st = self.lock();
        let Some(peer) = st.peer_mut(peer_id) else {
            return;
        };
        // Connections returned meanwhile are the most recent: they stay on top.
        idle.append(&mut peer.idle_http1);
        peer.idle_http1 = idle;
        // A sweep that ran while the list was out may be parked, or asleep until
        // a newer connection's time: either way it looks again, as these may
        // be the older ones.
        let wake_sweep = !peer.idle_http1.is_empty();
        st.idle_sweep_due |= wake_sweep;
        drop(st);
        if wake_sweep {
            self.idle_sweep.notify_one();
        }
    }

    /// Returns an HTTP/1.1 connection that finished its exchange to the idle list.
    /// Exchange connections are bounded by their count, others by the idle limit.
    fn return_idle(&self, peer_id: u64, mut conn: Http1Conn) {
        let now = Instant::now();
        let mut st = self.lock();
        let Some(peer) = st.peer_mut(peer_id) else {
            return;
        };
        // Those idle too long are closed after the lock is released.
        let expired: Vec<Http1Conn> = peer.take_idle_too_long(now).collect();
        let room = conn.exchange.is_some() || peer.idle_http1.len() < MAX_IDLE_HTTP1;
        let mut wake_sweep = false;
        if peer.health == Health::Healthy && room {
            conn.idle_since = now;
            peer.idle_http1.push(conn);
            wake_sweep = st.idle_listed();
        }
        drop(st);
        drop(expired);
        if wake_sweep {
            self.idle_sweep.notify_one();
        }
    }

    /// Closes the idle HTTP/1.1 connections idle for [`HTTP1_IDLE_TIMEOUT`] and
    /// returns when the next sweep is due: [`IDLE_SWEEP_SLACK`] after the oldest
    /// one left will have been idle that long. `None`, with no idle connection
    /// left: the next one to go idle wakes the sweep.
    fn close_idle_too_long(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut st = self.lock();
        let mut closing = Vec::new();
        let mut oldest: Option<Instant> = None;
        for peer in &mut st.peers {
            closing.extend(peer.take_idle_too_long(now));
            // The oldest idle connections are at the bottom.
            if let Some(conn) = peer.idle_http1.first() {
                oldest = Some(oldest.map_or(conn.idle_since, |o| o.min(conn.idle_since)));
            }
        }
        let next = oldest.map(|since| since + HTTP1_IDLE_TIMEOUT + IDLE_SWEEP_SLACK);
        st.idle_sweep_due = next.is_some();
        drop(st);
        // Closed after the lock is released.
        drop(closing);
        next
    }

    /// The peer refused a connection offering HTTP/1.1 alone.
    fn refuse_exchanges(&self, peer_id: u64, trial: bool) {
        let mut st = self.lock();
        let Some(peer) = st.peer_mut(peer_id) else {
            return;
        };
        let first = !peer.refuses_http1;
        peer.refuses_http1 = true;
        let host = peer.host.clone();
        drop(st);
        if trial {
            // Says nothing about health either way: the next request makes the trial.
            self.abandon_trial(peer_id);
        }
        if first {
            tracing::info!(
                host = %host,
                target = self.metrics.target_label(),
                group_version = %self.group_version,
                "proxy target peer host refused HTTP/1.1, all its requests share HTTP/2 connections"
            );
        }
    }

    /// A trial dial was abandoned (the caller went away): let the next request
    /// make the trial instead of leaving the peer stuck in `Trial`.
    fn abandon_trial(&self, peer_id: u64) {
        let now = Instant::now();
        if let Some(peer) = self.lock().peer_mut(peer_id) {
            if peer.health == Health::Trial {
                peer.health = Health::Quarantined { until: now };
            }
        }
    }
}

/// A cached connection for `lane`, if there is one to take. An exchange takes an
/// idle HTTP/1.1 connection, or none while the peer is under its exchange limit
/// (the caller dials one); past the limit, or for a stream, an HTTP/2 connection
/// with a free stream. An HTTP/1.1-only peer's idle connections serve both lanes.
fn take_cached(peer: &mut Peer, lane: Lane, now: Instant) -> Option<Conn> {
    let exchange = peer.exchange_lane(lane);
    let under_limit =
        || peer.exchange_connections.load(Ordering::Acquire) < MAX_EXCHANGE_CONNECTIONS;
    // The own watch's socket is duplicated as its connection is dialled.
    if lane == Lane::OwnWatch && exchange && under_limit() {
        return None;
    }
    if exchange || peer.speaks_h2 == Some(false) {
        while let Some(mut conn) = peer.idle_http1.pop() {
            // The newest is on top: once one has been idle too long, so have all
            // below it, and each is dropped (closed) in turn.
            if !conn.idle_too_long(now) && conn.sender.is_ready() {
                if !exchange {
                    // A stream may hold it for hours: it no longer counts as one
                    // of the peer's exchange connections.
                    conn.exchange = None;
                }
                return Some(Conn::Http1(conn));
            }
        }
        if exchange && under_limit() {
            return None;
        }
    }
    peer.h2.retain(|c| !c.sender.is_closed());
    if let Some(c) = peer
        .h2
        .iter()
        .find(|c| c.streams.load(Ordering::Acquire) < MAX_STREAMS_PER_CONNECTION)
    {
        return Some(Conn::H2(c.sender.clone(), Slot::reserve(&c.streams)));
    }
    // No HTTP/2 connection, or every one is full: the caller dials another.
    None
}

/// The pool's idle sweep: closes HTTP/1.1 connections idle for
/// [`HTTP1_IDLE_TIMEOUT`] without waiting for a request to take them. Nobody
/// reads an idle connection, so without it one the peer closed would keep its
/// socket and buffers, and one still open its place among the peer's
/// [`MAX_EXCHANGE_CONNECTIONS`], for as long as no request came. It
/// holds the pool weakly and ends once the pool is dropped, asleep or not; it
/// has a timer only while the pool has idle HTTP/1.1 connections.
async fn sweep_idle_http1(pool: Weak<PeerPool>, wake: Arc<tokio::sync::Notify>) {
    loop {
        wake.notified().await;
        // Bounded: each turn either sleeps until the next sweep or ends.
        loop {
            let Some(strong) = pool.upgrade() else {
                return;
            };
            let next = strong.close_idle_too_long();
            drop(strong);
            let Some(at) = next else {
                break;
            };
            // The pool's drop wakes it too: a dropped pool's sweep would
            // otherwise linger, holding its timer, for up to a sweep's wait.
            // So does a list put back after a check for closed connections
            // (`relist_idle_http1`), whose connections may be due before this
            // sleep ends: woken early, it sweeps again, sooner.
            tokio::select! {
                () = tokio::time::sleep_until(at) => {}
                () = wake.notified() => {}
            }
        }
    }
}

/// Formats an age the way operators read it in logs, e.g. `75.3s`.
fn format_age(age: Duration) -> String {
    format!(
        "{:?}",
        Duration::from_millis(age.as_millis().try_into().unwrap_or(u64::MAX))
    )
}

/// The HTTP handshake on a dialled TLS connection; with `keep_socket`, an
/// HTTP/1.1 connection keeps a duplicate of its socket ([`Http1Conn::socket`]).
async fn http_handshake(
    tls: PeerConnection,
    options: &PoolOptions,
    keep_socket: bool,
) -> Result<Conn, DialError> {
    let peer = tls.peer.clone();
    let h2 = tls.is_h2();
    let socket = (keep_socket && !h2)
        .then(|| tls.stream.get_ref().0.as_fd().try_clone_to_owned().ok())
        .flatten();
    let io = TokioIo::new(tls.stream);
    if h2 {
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(options.h2_keepalive_interval)
            .keep_alive_timeout(options.h2_keepalive_timeout)
            .keep_alive_while_idle(true)
            .handshake(io)
            .await
            .map_err(|source| DialError::Http {
                peer: peer.clone(),
                source,
            })?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(peer = %peer, error = %err, "peer HTTP/2 connection ended");
            }
        });
        let streams = Arc::new(AtomicUsize::new(0));
        let slot = Slot::reserve(&streams);
        Ok(Conn::H2(sender, slot))
    } else {
        // hyper's default lets the read buffer grow to 400 KiB while a large list
        // streams through; with up to 64 connections per peer the benchmark's
        // lists raised the proxy's peak RSS from 45 MiB (over HTTP/2) to 152 MiB.
        let (sender, connection) = http1::Builder::new()
            .max_buf_size(HTTP1_MAX_READ_BUFFER)
            .handshake(io)
            .await
            .map_err(|source| DialError::Http {
                peer: peer.clone(),
                source,
            })?;
        Ok(Conn::Http1(Http1Conn {
            sender,
            connection: Some(Box::new(connection)),
            exchange: None,
            idle_since: Instant::now(),
            socket,
        }))
    }
}

/// A dial in progress. If the caller drops the request mid-dial, the drop counts
/// the dial as `canceled` and frees a trial slot.
struct DialTicket {
    pool: Weak<PeerPool>,
    peer_id: u64,
    host: Arc<str>,
    trial: bool,
    departed: watch::Receiver<()>,
    armed: bool,
    /// The [`PendingDial`] other requests may wait for, and the sender whose
    /// drop (with this ticket, once the dial ended either way) wakes them.
    shared: Option<(u64, watch::Sender<()>)>,
    lane: Lane,
    /// The peer's exchange slot an exchange dial holds; the connection keeps it.
    exchange: Option<Slot>,
}

impl Drop for DialTicket {
    fn drop(&mut self) {
        if let (Some((id, _)), Some(pool)) = (&self.shared, self.pool.upgrade()) {
            // Before the waiters wake (the sender drops after this), so that they
            // find the new connection, or dial themselves.
            if let Some(peer) = pool.lock().peer_mut(self.peer_id) {
                if peer.pending_dial.as_ref().is_some_and(|p| p.id == *id) {
                    peer.pending_dial = None;
                }
            }
        }
        if !self.armed {
            return;
        }
        if let Some(pool) = self.pool.upgrade() {
            pool.metrics.dial_failure(Reason::Canceled);
            if self.trial {
                pool.abandon_trial(self.peer_id);
            }
        }
    }
}

enum Conn {
    H2(http2::SendRequest<ProxyBody>, Slot),
    Http1(Http1Conn),
}

/// A connection to one peer, ready for one request.
pub struct PeerSender {
    /// The peer (`host:port`) the request goes to.
    pub peer: Arc<str>,
    peer_id: u64,
    conn: Conn,
    lane: Lane,
    /// Whether the connection came from the cache (and so may have died unnoticed).
    reused: bool,
    /// The deadline it was acquired within; a resend on another connection (see
    /// [`PeerSender::send`]) acquires that one within it too.
    deadline: Option<Instant>,
    pool: Weak<PeerPool>,
}

impl std::fmt::Debug for PeerSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerSender")
            .field("peer", &self.peer)
            .field("reused", &self.reused)
            .field("h2", &matches!(self.conn, Conn::H2(..)))
            .finish_non_exhaustive()
    }
}

enum Attempt {
    Done(Result<Response<PeerBody>, SendError>),
    /// The cached connection was dead and the request was handed back unsent.
    Unsent(Request<ProxyBody>, SendError),
}

impl PeerSender {
    /// Whether the connection speaks HTTP/2.
    pub fn is_h2(&self) -> bool {
        matches!(self.conn, Conn::H2(..))
    }

    /// Whether the connection was reused from the cache rather than freshly dialled.
    pub fn is_reused(&self) -> bool {
        self.reused
    }

    /// Whether the connection can take the request (see [`Http1Conn::is_open`]);
    /// an HTTP/2 connection's own task has already said so.
    fn is_open(&mut self) -> bool {
        match &mut self.conn {
            Conn::H2(..) => true,
            Conn::Http1(conn) => conn.is_open(),
        }
    }

    /// Sends `req` and returns the response head; the body streams from the peer.
    ///
    /// The request may use an absolute URI or origin form with a `Host` header; it is
    /// adapted to the connection's protocol. If a cached connection turns out dead
    /// before the request was written, the pool drops it and the request goes out on
    /// another connection (at most three tries), so callers need not
    /// retry that case themselves. That connection is acquired within the
    /// deadline the sender was, and when none can be had the request fails as
    /// [`SendError::Pool`] with the pool's reason.
    pub async fn send(self, req: Request<ProxyBody>) -> Result<Response<PeerBody>, SendError> {
        let mut sender = self;
        let mut req = req;
        for attempt in 1..=SEND_ATTEMPTS {
            let (pool, peer_id, lane, deadline) = (
                sender.pool.clone(),
                sender.peer_id,
                sender.lane,
                sender.deadline,
            );
            let h2 = sender.is_h2();
            match sender.send_once(req).await {
                Attempt::Done(result) => return result,
                Attempt::Unsent(unsent, err) => {
                    let Some(pool) = pool.upgrade() else {
                        return Err(err);
                    };
                    if h2 {
                        pool.forget_connections(peer_id);
                    } else {
                        // One HTTP/1.1 connection closed by the peer (an idle
                        // keep-alive timing out) says nothing about the others.
                        pool.forget_closed_http1(peer_id);
                    }
                    if attempt == SEND_ATTEMPTS {
                        return Err(err);
                    }
                    tracing::debug!(error = %err, "cached peer connection was dead; resending on another connection");
                    req = unsent;
                    sender = pool.acquire_in(lane, deadline).await?;
                }
            }
        }
        Err(PoolError::Closed.into())
    }

    async fn send_once(self, req: Request<ProxyBody>) -> Attempt {
        let Some(pool) = self.pool.upgrade() else {
            return Attempt::Done(Err(PoolError::Closed.into()));
        };
        let adapted = adapt_request(req, self.is_h2(), &pool.default_authority);
        drop(pool);
        let req = match adapted {
            Ok(req) => req,
            Err(source) => {
                return Attempt::Done(Err(SendError::InvalidRequest {
                    peer: self.peer.to_string(),
                    source,
                }))
            }
        };
        let replay = if self.reused {
            ReplayableHead::capture(&req)
        } else {
            None
        };
        let PeerSender {
            peer,
            peer_id,
            conn,
            reused,
            pool,
            ..
        } = self;
        match conn {
            Conn::H2(mut sender, slot) => match sender.try_send_request(req).await {
                Ok(resp) => Attempt::Done(Ok(resp.map(|body| PeerBody {
                    inner: body,
                    lease: Some(Lease::Stream { _slot: slot }),
                }))),
                Err(err) => failed(err, peer, reused, replay),
            },
            Conn::Http1(mut conn) => match conn.send(req).await {
                Ok(mut resp) => {
                    // Only the answer it was dialled for: once back in the idle
                    // list, the connection serves exchanges like any other.
                    if let Some(socket) = conn.socket.take() {
                        resp.extensions_mut()
                            .insert(ConnectionSocket(Arc::new(socket)));
                    }
                    let lease = Lease::Exchange(Returning {
                        conn,
                        pool,
                        peer_id,
                    });
                    Attempt::Done(Ok(resp.map(|body| PeerBody {
                        inner: body,
                        lease: Some(lease),
                    })))
                }
                Err(err) => failed(err, peer, reused, replay),
            },
        }
    }
}

/// The body of a peer's answer. It holds what the answer occupies of its
/// connection, a stream of an HTTP/2 connection or a whole HTTP/1.1 connection,
/// until the body has ended or is dropped. An HTTP/1.1 connection whose answer
/// ended goes back to its peer's idle list; one dropped before its end is closed,
/// as its unread rest would be the next request's answer.
pub struct PeerBody {
    inner: Incoming,
    lease: Option<Lease>,
}

enum Lease {
    /// Frees the stream when dropped.
    Stream {
        _slot: Slot,
    },
    Exchange(Returning),
}

/// An HTTP/1.1 connection on its way back to its peer's idle list.
struct Returning {
    conn: Http1Conn,
    pool: Weak<PeerPool>,
    peer_id: u64,
}

impl Returning {
    /// Returns the connection at once when it is ready, so the next request finds
    /// it: returning it from a task of its own lets a closed-loop caller's next
    /// request arrive first and dial.
    fn give_back(self) {
        let Returning {
            mut conn,
            pool,
            peer_id,
        } = self;
        if conn.is_open() {
            if let Some(pool) = pool.upgrade() {
                pool.return_idle(peer_id, conn);
            }
            return;
        }
        if conn.connection.is_none() {
            return;
        }
        // The request body may still be on its way; a connection that is not
        // ready for the next request in time is closed.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let ready = std::future::poll_fn(|cx| {
                    conn.drive(cx);
                    if conn.connection.is_none() {
                        return Poll::Ready(false);
                    }
                    conn.sender.poll_ready(cx).map(|ready| ready.is_ok())
                });
                let ready = tokio::time::timeout(HTTP1_READY_WAIT, ready).await;
                if let (Ok(true), Some(pool)) = (ready, pool.upgrade()) {
                    pool.return_idle(peer_id, conn);
                }
            });
        }
    }
}

impl PeerBody {
    /// The answer is complete: release the stream, or return the connection.
    fn ended(&mut self) {
        if let Some(Lease::Exchange(returning)) = self.lease.take() {
            returning.give_back();
        }
    }
}

impl Body for PeerBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let mut polled = Pin::new(&mut self.inner).poll_frame(cx);
        if polled.is_pending() {
            if let Some(Lease::Exchange(returning)) = &mut self.lease {
                // The HTTP/1.1 connection is this body's to drive: let it read
                // what the peer sent, then look again.
                returning.conn.drive(cx);
                polled = Pin::new(&mut self.inner).poll_frame(cx);
            }
        }
        match &polled {
            Poll::Ready(None) => self.ended(),
            // A reader may stop at the last frame without asking for the end.
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.ended(),
            _ => {}
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

impl Drop for PeerBody {
    fn drop(&mut self) {
        if self.inner.is_end_stream() {
            self.ended();
        }
    }
}

/// Classifies a failed exchange: on a cached connection, a request hyper handed back
/// unsent, or one that is safe to replay, goes out again on another connection.
fn failed(
    mut err: hyper::client::conn::TrySendError<Request<ProxyBody>>,
    peer: Arc<str>,
    reused: bool,
    replay: Option<ReplayableHead>,
) -> Attempt {
    let unsent = err.take_message();
    let error = SendError::Http {
        peer: peer.to_string(),
        source: err.into_error(),
        reused,
    };
    if !reused {
        return Attempt::Done(Err(error));
    }
    match (unsent, replay) {
        (Some(req), _) => Attempt::Unsent(req, error),
        (None, Some(head)) => Attempt::Unsent(head.rebuild(), error),
        (None, None) => Attempt::Done(Err(error)),
    }
}

/// The head of a bodiless safe request, kept so it can be sent again when a cached
/// connection dies under it. HTTP/2 never says whether a request made it onto the
/// wire before the connection failed, so only requests that are harmless to repeat
/// (GET, HEAD, OPTIONS without a body: the same rule Go's transport applies) are
/// replayed in that case.
struct ReplayableHead {
    method: http::Method,
    uri: Uri,
    version: Version,
    headers: http::HeaderMap,
    extensions: http::Extensions,
}

impl ReplayableHead {
    fn capture(req: &Request<ProxyBody>) -> Option<ReplayableHead> {
        use http_body::Body as _;
        let safe = matches!(
            *req.method(),
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        );
        if !safe || !req.body().is_end_stream() {
            return None;
        }
        Some(ReplayableHead {
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            headers: req.headers().clone(),
            extensions: req.extensions().clone(),
        })
    }

    fn rebuild(self) -> Request<ProxyBody> {
        let mut req = Request::new(empty());
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers;
        *req.extensions_mut() = self.extensions;
        req
    }
}

/// Hop-by-hop headers HTTP/2 forbids (RFC 9113 §8.2.2).
const CONNECTION_HEADERS: [header::HeaderName; 4] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::HeaderName::from_static("keep-alive"),
];

/// Rewrites the request for the connection: HTTP/2 needs an absolute URI (it becomes
/// the `:scheme`/`:authority` pseudo headers) and no connection-specific headers;
/// HTTP/1.1 needs origin form and a `Host` header.
fn adapt_request(
    req: Request<ProxyBody>,
    h2: bool,
    fallback_authority: &str,
) -> Result<Request<ProxyBody>, http::Error> {
    let (mut parts, body) = req.into_parts();
    let uri_authority = parts.uri.authority().cloned();
    // The path and query were parsed once already; they move over as they are.
    let path_and_query = std::mem::take(&mut parts.uri)
        .into_parts()
        .path_and_query
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    if h2 {
        let authority = match uri_authority {
            Some(authority) => authority,
            None => Authority::try_from(
                parts
                    .headers
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or(fallback_authority),
            )?,
        };
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(Scheme::HTTPS);
        uri.authority = Some(authority);
        uri.path_and_query = Some(path_and_query);
        parts.uri = Uri::from_parts(uri)?;
        parts.version = Version::HTTP_2;
        // One pass over the few names present instead of a lookup per forbidden
        // name: most requests carry none of them.
        let forbidden = parts
            .headers
            .keys()
            .any(|name| CONNECTION_HEADERS.contains(name) || name.as_str() == "proxy-connection");
        if forbidden {
            for name in &CONNECTION_HEADERS {
                parts.headers.remove(name);
            }
            parts.headers.remove("proxy-connection");
        }
        parts.headers.remove(header::HOST);
        if parts
            .headers
            .get(header::TE)
            .is_some_and(|te| te.as_bytes() != b"trailers")
        {
            parts.headers.remove(header::TE);
        }
    } else {
        let mut uri = http::uri::Parts::default();
        uri.path_and_query = Some(path_and_query);
        parts.uri = Uri::from_parts(uri)?;
        parts.version = Version::HTTP_11;
        if !parts.headers.contains_key(header::HOST) {
            let authority = uri_authority
                .as_ref()
                .map_or(fallback_authority, Authority::as_str);
            parts
                .headers
                .insert(header::HOST, HeaderValue::from_str(authority)?);
        }
    }
    Ok(Request::from_parts(parts, body))
}

#[cfg(test)]
mod tests;
