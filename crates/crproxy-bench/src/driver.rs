//! The load driver: one hyper client used unchanged for every path, so the only
//! difference between the columns of the report is what sits between the driver
//! and the target.
//!
//! The driver speaks HTTP/2 (what the kube-apiserver aggregator and client-go use)
//! or HTTP/1.1 keep-alive over TLS. With HTTP/2 each worker is a stream on a
//! shared connection (at most [`STREAMS_PER_CONNECTION`] per connection, like a
//! client that respects a server's stream limit); with HTTP/1.1 each worker has
//! its own connection. Load is closed-loop: a fixed number of workers, each sending
//! its next request when the previous answer has been read whole.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;
use tokio::time::Instant;

use crproxy_core::pki::CertPem;

/// Streams one HTTP/2 connection carries before the driver opens another.
/// Below the 100 that HTTP/2 servers commonly advertise as their minimum.
pub const STREAMS_PER_CONNECTION: usize = 100;

/// The body of every request the driver sends.
pub type Body = Full<Bytes>;

/// A request could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The TLS settings could not be built.
    #[error("TLS settings for {endpoint}: {message}")]
    Tls { endpoint: String, message: String },
    /// TCP connect or the TLS handshake failed.
    #[error("connecting to {endpoint} ({addr}): {source}")]
    Connect {
        endpoint: String,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The HTTP handshake, the exchange or the body failed.
    #[error("HTTP exchange with {endpoint}: {source}")]
    Http {
        endpoint: String,
        #[source]
        source: hyper::Error,
    },
    /// A request could not be built (a header value from the caller was invalid).
    #[error("building a request: {0}")]
    Request(#[from] http::Error),
}

/// How the driver authenticates on an endpoint.
#[derive(Clone, Debug)]
pub enum Identity {
    /// `Authorization: Bearer`, as a client of the target (direct and nginx paths).
    Bearer(String),
    /// The client cluster's aggregation layer: the front-proxy client certificate
    /// on the connection and the caller in `X-Remote-*` headers.
    FrontProxy {
        cert: CertPem,
        user: String,
        groups: Vec<String>,
    },
}

/// HTTP version the driver speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Protocol {
    Http2,
    Http1,
}

/// One path to the target: where to connect, how to trust it, who to be.
pub struct Endpoint {
    /// `direct`, `crproxy` or `nginx`: used in errors and reports.
    pub label: String,
    pub addr: SocketAddr,
    pub protocol: Protocol,
    tls: tokio_rustls::TlsConnector,
    server_name: ServerName<'static>,
    headers: HeaderMap,
    authority: String,
}

impl Endpoint {
    /// An endpoint trusting `ca_pem` (or, with `None`, any certificate: for a proxy
    /// whose serving CA is not written anywhere; verification happens once per
    /// connection, so this does not change the measured cost).
    pub fn new(
        label: &str,
        addr: SocketAddr,
        ca_pem: Option<&str>,
        identity: &Identity,
        protocol: Protocol,
    ) -> Result<Self, DriverError> {
        let tls_error = |message: String| DriverError::Tls {
            endpoint: label.to_string(),
            message,
        };
        let server =
            url::Url::parse(&format!("https://{addr}")).map_err(|e| tls_error(e.to_string()))?;
        let mut cluster = crproxy_kube::ClusterConfig::new(server);
        cluster.ca_pem = ca_pem.map(|pem| pem.as_bytes().to_vec());
        cluster.insecure_skip_tls_verify = ca_pem.is_none();
        let mut headers = HeaderMap::new();
        let header = |value: &str| {
            HeaderValue::from_str(value).map_err(|e| tls_error(format!("header value: {e}")))
        };
        match identity {
            Identity::Bearer(token) => {
                headers.insert(
                    http::header::AUTHORIZATION,
                    header(&format!("Bearer {token}"))?,
                );
            }
            Identity::FrontProxy { cert, user, groups } => {
                cluster.auth = crproxy_kube::Auth::ClientCert {
                    cert_pem: cert.cert.as_bytes().to_vec(),
                    key_pem: cert.key.as_bytes().to_vec(),
                };
                headers.insert(HeaderName::from_static("x-remote-user"), header(user)?);
                for group in groups {
                    headers.append(HeaderName::from_static("x-remote-group"), header(group)?);
                }
            }
        }
        headers.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json"),
        );
        let alpn: &[&[u8]] = match protocol {
            Protocol::Http2 => &[b"h2"],
            Protocol::Http1 => &[b"http/1.1"],
        };
        let credentials = cluster
            .credentials()
            .map_err(|e| tls_error(e.to_string()))?;
        let config = cluster
            .rustls_config(alpn, &credentials)
            .map_err(|e| tls_error(e.to_string()))?;
        let server_name = cluster
            .server_name()
            .map_err(|e| tls_error(e.to_string()))?;
        Ok(Self {
            label: label.to_string(),
            addr,
            protocol,
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            server_name,
            headers,
            authority: addr.to_string(),
        })
    }

    /// A request with this endpoint's identity. `body` is `(content type, bytes)`.
    pub fn request(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<Request<Body>, DriverError> {
        let uri = match self.protocol {
            // HTTP/2 carries scheme and authority as pseudo-headers.
            Protocol::Http2 => format!("https://{}{}", self.authority, path_and_query),
            Protocol::Http1 => path_and_query.to_string(),
        };
        let mut builder = Request::builder().method(method).uri(uri);
        if self.protocol == Protocol::Http1 {
            builder = builder.header(http::header::HOST, &self.authority);
        }
        let (content_type, bytes) = match body {
            Some((content_type, bytes)) => (Some(content_type), bytes),
            None => (None, Bytes::new()),
        };
        if let Some(content_type) = content_type {
            builder = builder.header(http::header::CONTENT_TYPE, content_type);
        }
        let mut request = builder.body(Full::new(bytes))?;
        for (name, value) in &self.headers {
            request.headers_mut().append(name.clone(), value.clone());
        }
        Ok(request)
    }

    /// One new connection: TCP, TLS, HTTP handshake.
    pub async fn connect(&self) -> Result<Sender, DriverError> {
        let connect_error = |source: std::io::Error| DriverError::Connect {
            endpoint: self.label.clone(),
            addr: self.addr,
            source,
        };
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(connect_error)?;
        let _ = tcp.set_nodelay(true);
        let tls = self
            .tls
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(connect_error)?;
        let io = TokioIo::new(tls);
        let http_error = |source| DriverError::Http {
            endpoint: self.label.clone(),
            source,
        };
        match self.protocol {
            Protocol::Http2 => {
                let (sender, connection) = http2::Builder::new(TokioExecutor::new())
                    // Large lists should not stall on flow control: the same
                    // windows for every path.
                    .initial_stream_window_size(4 * 1024 * 1024)
                    .initial_connection_window_size(16 * 1024 * 1024)
                    .handshake(io)
                    .await
                    .map_err(http_error)?;
                tokio::spawn(connection);
                Ok(Sender::H2(sender))
            }
            Protocol::Http1 => {
                let (sender, connection) = http1::handshake(io).await.map_err(http_error)?;
                tokio::spawn(connection);
                Ok(Sender::H1(sender))
            }
        }
    }

    /// One sender per worker: HTTP/2 workers share connections
    /// ([`STREAMS_PER_CONNECTION`] each), HTTP/1.1 workers get one each.
    pub async fn senders(&self, workers: usize) -> Result<Vec<Sender>, DriverError> {
        let mut out = Vec::with_capacity(workers);
        let mut shared: Option<Sender> = None;
        for worker in 0..workers {
            let reuse = self.protocol == Protocol::Http2 && worker % STREAMS_PER_CONNECTION != 0;
            let sender = match (&shared, reuse) {
                (Some(Sender::H2(h2)), true) => Sender::H2(h2.clone()),
                _ => {
                    let fresh = self.connect().await?;
                    if let Sender::H2(h2) = &fresh {
                        shared = Some(Sender::H2(h2.clone()));
                    }
                    fresh
                }
            };
            out.push(sender);
        }
        Ok(out)
    }
}

/// A worker's way to send: a stream on a shared HTTP/2 connection or its own
/// HTTP/1.1 connection.
pub enum Sender {
    H2(http2::SendRequest<Body>),
    H1(http1::SendRequest<Body>),
}

impl Sender {
    /// Sends a request and returns when the response head has arrived.
    pub async fn send(&mut self, request: Request<Body>) -> hyper::Result<Response<Incoming>> {
        match self {
            Sender::H2(h2) => {
                h2.ready().await?;
                h2.send_request(request).await
            }
            Sender::H1(h1) => {
                h1.ready().await?;
                h1.send_request(request).await
            }
        }
    }
}

/// A completed request.
#[derive(Debug)]
pub struct Exchange {
    pub status: StatusCode,
    /// The body, when asked for; otherwise it was read and dropped frame by frame.
    pub body: Option<Bytes>,
    pub bytes: u64,
    /// From sending the request to the last byte of the body.
    pub elapsed: Duration,
}

/// Sends `request` and reads the answer to its end.
pub async fn exchange(
    sender: &mut Sender,
    request: Request<Body>,
    keep_body: bool,
) -> hyper::Result<Exchange> {
    let started = Instant::now();
    let response = sender.send(request).await?;
    let status = response.status();
    let mut body = response.into_body();
    let mut kept = keep_body.then(Vec::new);
    let mut bytes = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            bytes += data.len() as u64;
            if let Some(kept) = kept.as_mut() {
                kept.extend_from_slice(&data);
            }
        }
    }
    Ok(Exchange {
        status,
        body: kept.map(Bytes::from),
        bytes,
        elapsed: started.elapsed(),
    })
}

/// What one kind of request does: which request a worker sends next, and whether
/// an answer counts as a success (updating the worker's state, e.g. the
/// resourceVersion for the next update).
pub trait Workload: Send + Sync + 'static {
    /// Per-worker state, prepared before the timed part.
    type State: Send + 'static;
    /// The `seq`-th request of the run, sent by `worker`.
    fn request(
        &self,
        endpoint: &Endpoint,
        worker: usize,
        seq: usize,
        state: &mut Self::State,
    ) -> Result<Request<Body>, DriverError>;
    /// Whether the body must be kept for [`Workload::observe`].
    fn keep_body(&self) -> bool {
        false
    }
    /// Judges an answer; false counts it as an error.
    fn observe(&self, state: &mut Self::State, exchange: &Exchange) -> bool {
        let _ = state;
        exchange.status.is_success()
    }
}

/// What a closed-loop run produced.
#[derive(Debug, Default)]
pub struct LoopResult {
    pub latencies: Vec<Duration>,
    pub errors: u64,
    /// The first failure, for the report's notes.
    pub first_error: Option<String>,
    pub wall: Duration,
}

/// Runs `total` requests with one worker per state (and sender), or fewer when
/// `limit` passes first. Workers pick sequence numbers from a shared counter, so
/// a slow worker does not hold the others back.
///
/// The workers (connections and states) are handed back, so later rounds reuse
/// warm connections and, for updates, the latest resourceVersions. A worker whose
/// task panicked is missing from the returned list.
pub async fn closed_loop<W: Workload>(
    endpoint: Arc<Endpoint>,
    workload: Arc<W>,
    workers: Vec<(Sender, W::State)>,
    total: usize,
    limit: Duration,
) -> (LoopResult, Vec<(Sender, W::State)>) {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + limit;
    let mut tasks = Vec::new();
    for (worker, (mut sender, mut state)) in workers.into_iter().enumerate() {
        let next = Arc::clone(&next);
        let endpoint = Arc::clone(&endpoint);
        let workload = Arc::clone(&workload);
        tasks.push(tokio::spawn(async move {
            let mut result = LoopResult::default();
            loop {
                let seq = next.fetch_add(1, Ordering::Relaxed);
                if seq >= total || Instant::now() >= deadline {
                    break;
                }
                let outcome = match workload.request(&endpoint, worker, seq, &mut state) {
                    Ok(request) => {
                        let sent = tokio::time::timeout_at(
                            deadline,
                            exchange(&mut sender, request, workload.keep_body()),
                        )
                        .await;
                        match sent {
                            Ok(Ok(exchange)) => {
                                if workload.observe(&mut state, &exchange) {
                                    Ok(exchange.elapsed)
                                } else {
                                    Err(format!(
                                        "{} answered {}: {}",
                                        endpoint.label,
                                        exchange.status,
                                        exchange
                                            .body
                                            .as_ref()
                                            .map(|b| String::from_utf8_lossy(
                                                &b[..b.len().min(300)]
                                            )
                                            .into_owned())
                                            .unwrap_or_default()
                                    ))
                                }
                            }
                            Ok(Err(e)) => Err(format!("{}: {e}", endpoint.label)),
                            Err(_) => Err(format!("{}: run time limit reached", endpoint.label)),
                        }
                    }
                    Err(e) => Err(e.to_string()),
                };
                match outcome {
                    Ok(latency) => result.latencies.push(latency),
                    Err(message) => {
                        result.errors += 1;
                        result.first_error.get_or_insert(message);
                    }
                }
            }
            (result, sender, state)
        }));
    }
    let mut total_result = LoopResult::default();
    let mut returned = Vec::with_capacity(tasks.len());
    for task in tasks {
        if let Ok((result, sender, state)) = task.await {
            returned.push((sender, state));
            total_result.latencies.extend(result.latencies);
            total_result.errors += result.errors;
            if total_result.first_error.is_none() {
                total_result.first_error = result.first_error;
            }
        }
    }
    total_result.wall = started.elapsed();
    (total_result, returned)
}

#[cfg(test)]
#[path = "driver/tests.rs"]
mod tests;
