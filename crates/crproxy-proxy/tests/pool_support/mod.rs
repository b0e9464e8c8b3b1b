//! Shared harness for the peer-pool tests: real TLS peers on 127.0.0.1, peers that
//! refuse or hang, and a parser for the metrics exposition.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use crproxy_core::pki::CertificateAuthority;
use crproxy_proxy::dial::Dialer;
use crproxy_proxy::metrics::{Metrics, TargetMetrics};
use crproxy_proxy::pool::{Lane, PeerPool, PeerSender, PoolOptions, ProxyBody};
use http_body_util::{BodyExt, Empty, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The name every test peer's certificate carries, like a kubeconfig server host.
pub const SERVER_NAME: &str = "target.example";
pub const TARGET: &str = "p-default/target";
pub const GROUP_VERSION: &str = "example.com/v1";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(crproxy_kube::crypto_provider())
}

/// One CA for the test, issuing the peers' certificates and trusted by the dialer.
pub struct Pki {
    pub ca: CertificateAuthority,
}

impl Pki {
    pub fn new() -> Pki {
        Pki {
            ca: CertificateAuthority::generate("pool-test-ca").expect("ca"),
        }
    }

    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        let ca = CertificateDer::from_pem_slice(self.ca.pem().cert.as_bytes()).expect("ca pem");
        roots.add(ca).expect("add root");
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    }

    pub fn dialer(&self) -> Dialer {
        Dialer::new(
            self.client_config(),
            ServerName::try_from(SERVER_NAME).expect("name"),
        )
    }

    pub fn server_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
        let leaf = self
            .ca
            .issue_server(&[SERVER_NAME], &["127.0.0.1".parse().expect("ip")])
            .expect("leaf");
        let cert = CertificateDer::from_pem_slice(leaf.cert.as_bytes()).expect("cert pem");
        let key = PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).expect("key pem");
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .expect("server config");
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

/// Which HTTP versions a test peer offers through ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocols {
    H2AndHttp1,
    Http1Only,
    /// Refuses a client that offers HTTP/1.1 alone (`no_application_protocol`).
    H2Only,
}

/// Request header asking a [`TlsPeer`] for an answer header of that many bytes.
pub const FILLER_BYTES: &str = "x-filler-bytes";

/// A path whose request a [`TlsPeer`] reads and never answers, like an API server
/// that took the request and wedged.
pub const NEVER_ANSWERED: &str = "/never-answered";

/// A path whose request makes a [`TlsPeer`] drop every open connection (its own
/// too, unanswered) as [`TlsPeer::kill_connections`] does.
pub const DROPS_CONNECTIONS: &str = "/drops-connections";

/// A TLS + HTTP peer answering every request with
/// `peer <port> <version> <path and query> host=<host>`, except `/empty`, answered with no
/// body, and [`NEVER_ANSWERED`] and [`DROPS_CONNECTIONS`]; [`FILLER_BYTES`] adds an
/// `x-filler` header of that size to the answer.
pub struct TlsPeer {
    pub addr: SocketAddr,
    /// TCP connections accepted so far.
    pub connections: Arc<AtomicUsize>,
    /// Requests served so far.
    pub requests: Arc<AtomicUsize>,
    /// Connections served now: past the TLS handshake and not yet closed.
    pub open: Arc<AtomicUsize>,
    kill: tokio::sync::watch::Sender<u64>,
    freeze: tokio::sync::watch::Sender<u64>,
    /// New connections are accepted and held, never answered (see
    /// [`TlsPeer::hold_new_connections`]).
    hold: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl TlsPeer {
    pub async fn start(pki: &Pki, protocols: Protocols) -> TlsPeer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::serve(listener, pki, protocols)
    }

    /// Serves on the port a test held refused until now.
    pub fn start_on(held: test_support::RefusedPort, pki: &Pki, protocols: Protocols) -> TlsPeer {
        Self::serve(held.listen(), pki, protocols)
    }

    /// Serves on a listener the test made (in a network namespace of its own, say).
    pub fn serve(listener: TcpListener, pki: &Pki, protocols: Protocols) -> TlsPeer {
        let addr = listener.local_addr().expect("addr");
        let alpn: &[&[u8]] = match protocols {
            Protocols::H2AndHttp1 => &[b"h2", b"http/1.1"],
            Protocols::Http1Only => &[b"http/1.1"],
            Protocols::H2Only => &[b"h2"],
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config(alpn));
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (conns, reqs, opened) = (connections.clone(), requests.clone(), open.clone());
        let kill = tokio::sync::watch::channel(0u64).0;
        let killed = kill.clone();
        let freeze = tokio::sync::watch::channel(0u64).0;
        let frozen = freeze.clone();
        let hold = Arc::new(AtomicBool::new(false));
        let holding = hold.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            // Bounded: the task is aborted when the TlsPeer drops.
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                conns.fetch_add(1, Ordering::SeqCst);
                if holding.load(Ordering::SeqCst) {
                    held.push(tcp);
                    continue;
                }
                let acceptor = acceptor.clone();
                let reqs = reqs.clone();
                let opened = opened.clone();
                let killer = killed.clone();
                let mut killed = killed.subscribe();
                let generation = *killed.borrow();
                let mut frozen = frozen.subscribe();
                let frozen_generation = *frozen.borrow();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let _open = Counted::add(opened);
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        reqs.fetch_add(1, Ordering::SeqCst);
                        let host = req
                            .headers()
                            .get(http::header::HOST)
                            .and_then(|h| h.to_str().ok())
                            .map(str::to_owned)
                            .or_else(|| req.uri().authority().map(|a| a.to_string()))
                            .unwrap_or_default();
                        let never = req.uri().path() == NEVER_ANSWERED;
                        if req.uri().path() == DROPS_CONNECTIONS {
                            killer.send_modify(|g| *g += 1);
                        }
                        let body = if req.uri().path() == "/empty" {
                            String::new()
                        } else {
                            format!(
                                "peer {} {:?} {} host={}",
                                addr.port(),
                                req.version(),
                                req.uri().path_and_query().map_or("/", |p| p.as_str()),
                                host
                            )
                        };
                        let filler = req
                            .headers()
                            .get(FILLER_BYTES)
                            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
                        let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
                        if let Some(bytes) = filler {
                            let value = http::HeaderValue::from_str(&"f".repeat(bytes))
                                .expect("filler value");
                            response.headers_mut().insert("x-filler", value);
                        }
                        let dropped = req.uri().path() == DROPS_CONNECTIONS;
                        async move {
                            if never || dropped {
                                // Ends with its connection, when the peer drops.
                                std::future::pending::<()>().await;
                            }
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let mut conn =
                        std::pin::pin!(builder.serve_connection(TokioIo::new(tls), service));
                    // Killing drops the connection without a goodbye, like a crashed
                    // peer. Freezing keeps the socket open but never reads or writes
                    // it again, like a peer behind a partition.
                    let froze = tokio::select! {
                        _ = conn.as_mut() => false,
                        _ = killed.wait_for(|g| *g != generation) => false,
                        _ = frozen.wait_for(|g| *g != frozen_generation) => true,
                    };
                    if froze {
                        let _ = killed.wait_for(|g| *g != generation).await.map(|_| ());
                    }
                });
            }
        });
        TlsPeer {
            addr,
            connections,
            requests,
            open,
            kill,
            freeze,
            hold,
            task,
        }
    }

    /// From now on, accepts connections and holds them without a TLS answer,
    /// as a peer that hangs does, so that dials to it wait out their limit.
    pub fn hold_new_connections(&self) {
        self.hold.store(true, Ordering::SeqCst);
    }

    /// Closes the listener (open connections stay): dials are refused from
    /// now on, once the port is not taken again.
    pub async fn stop_accepting(&mut self) {
        self.task.abort();
        // The listener is closed once the aborted task has been dropped.
        let _ = (&mut self.task).await;
    }

    /// Stops serving every open connection without closing it (the listener keeps
    /// accepting and serving new ones).
    pub fn freeze_connections(&self) {
        self.freeze.send_modify(|g| *g += 1);
    }

    /// Drops every open connection (the listener keeps accepting).
    pub fn kill_connections(&self) {
        self.kill.send_modify(|g| *g += 1);
    }

    pub fn host(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for TlsPeer {
    fn drop(&mut self) {
        self.kill.send_modify(|g| *g += 1);
        self.task.abort();
    }
}

/// One in a count for as long as it lives.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn add(count: Arc<AtomicUsize>) -> Counted {
        count.fetch_add(1, Ordering::SeqCst);
        Counted(count)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A peer that accepts TCP and then never says anything, so TLS never completes.
pub struct SilentPeer {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl SilentPeer {
    pub async fn start() -> SilentPeer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            // Bounded by the abort in Drop.
            while let Ok((tcp, _)) = listener.accept().await {
                held.push(tcp);
            }
        });
        SilentPeer { addr, task }
    }

    pub fn host(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for SilentPeer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub struct Harness {
    pub pki: Pki,
    pub metrics: Arc<Metrics>,
    pub target: TargetMetrics,
    pub pool: Arc<PeerPool>,
}

impl Harness {
    /// A pool without HTTP/2 pings. Paused-time tests need that: a pending ping
    /// timer lets the runtime jump the clock whenever a loopback exchange is
    /// momentarily not ready, which would make measured times arbitrary.
    pub fn new() -> Harness {
        Self::with_options(PoolOptions {
            h2_keepalive_interval: None,
            ..PoolOptions::default()
        })
    }

    pub fn with_options(options: PoolOptions) -> Harness {
        let pki = Pki::new();
        let metrics = Metrics::new();
        let target = metrics.target(TARGET);
        let pool = PeerPool::with_options(
            GROUP_VERSION.to_owned(),
            pki.dialer(),
            target.clone(),
            options,
        );
        Harness {
            pki,
            metrics,
            target,
            pool,
        }
    }

    /// A harness whose pool knows one peer, speaking `protocols`.
    pub async fn with_peer(protocols: Protocols) -> (Harness, TlsPeer) {
        let h = Harness::new();
        let peer = TlsPeer::start(&h.pki, protocols).await;
        h.pool.publish(vec![peer.host()]);
        (h, peer)
    }

    /// A sender for an exchange (see [`Lane::Exchange`]).
    pub async fn exchange(&self) -> PeerSender {
        self.pool
            .acquire_in(Lane::Exchange, None)
            .await
            .expect("an exchange sender")
    }

    pub fn scrape(&self) -> Scrape {
        Scrape::parse(&self.metrics.encode())
    }

    /// Acquires a peer and sends `GET /apis/example.com/v1`, returning the body.
    pub async fn get(&self) -> Result<String, String> {
        self.get_in(Lane::Stream).await
    }

    /// [`Harness::get_in`] `count` times one after the other; the bodies, or a
    /// panic naming the first request that failed.
    pub async fn get_each(&self, lane: Lane, count: usize) -> Vec<String> {
        let mut bodies = Vec::with_capacity(count);
        for i in 0..count {
            let body = self.get_in(lane).await;
            bodies.push(body.unwrap_or_else(|e| panic!("request {i} of {count}: {e}")));
        }
        bodies
    }

    /// [`Harness::get`] on a connection of `lane`.
    pub async fn get_in(&self, lane: Lane) -> Result<String, String> {
        let sender = self
            .pool
            .acquire_in(lane, None)
            .await
            .map_err(|e| e.reason().to_string())?;
        let resp = sender
            .send(request("/apis/example.com/v1"))
            .await
            .map_err(|e| format!("send: {e}"))?;
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?;
        Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
    }
}

/// A bodiless GET of `path` with the target's `Host`.
pub fn request(path: &str) -> http::Request<ProxyBody> {
    http::Request::builder()
        .uri(path)
        .header(http::header::HOST, SERVER_NAME)
        .body(empty())
        .expect("request")
}

pub fn empty() -> ProxyBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

/// Samples of one series name: label set → value.
pub type Samples = Vec<(BTreeMap<String, String>, f64)>;

/// Parsed samples of one scrape: `name` → sorted label pairs → value.
pub struct Scrape {
    pub text: String,
    pub samples: BTreeMap<String, Samples>,
    /// `# TYPE` lines: family name → type.
    pub types: BTreeMap<String, String>,
}

impl Scrape {
    pub fn parse(text: &str) -> Scrape {
        let mut samples: BTreeMap<String, Samples> = BTreeMap::new();
        let mut types = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split(' ');
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    types.insert(name.to_owned(), kind.to_owned());
                }
            }
        }
        let sample_lines = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .count();
        let read = crproxy_core::exposition::parse(text);
        assert_eq!(
            read.len(),
            sample_lines,
            "an unreadable sample line in:\n{text}"
        );
        for sample in read {
            samples
                .entry(sample.name)
                .or_default()
                .push((sample.labels, sample.value));
        }
        Scrape {
            text: text.to_owned(),
            samples,
            types,
        }
    }

    /// The value of the sample `name` whose labels are exactly `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples
            .get(name)?
            .iter()
            .find(|(l, _)| *l == want)
            .map(|(_, v)| *v)
    }

    /// Like [`get`](Self::get) with `target` added, and absent counted as zero.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut all = vec![("target", TARGET)];
        all.extend_from_slice(labels);
        self.get(name, &all).unwrap_or(0.0)
    }

    pub fn dial_failures(&self, reason: &str) -> f64 {
        self.value(
            "vcluster_proxy_peer_dial_failures_total",
            &[("reason", reason)],
        )
    }

    pub fn dial_observations(&self) -> f64 {
        self.value("vcluster_proxy_peer_dial_duration_seconds_count", &[])
    }

    pub fn peers(&self, state: &str) -> f64 {
        self.get(
            "vcluster_proxy_peers",
            &[
                ("target", TARGET),
                ("group_version", GROUP_VERSION),
                ("state", state),
            ],
        )
        .expect("peer gauge is always present")
    }
}
