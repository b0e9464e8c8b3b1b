//! The HTTPS listeners: one per proxied group/version, plus the metrics listener.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::frontproxy::{FrontProxyTrust, PeerCertificate};
use crate::handler::GroupVersionProxy;
use crate::health::Readiness;
use crate::metrics::Metrics;
use crate::pool::ProxyBody;
use crate::transport;

mod streams;

use streams::ConnectionStreams;

/// Concurrent streams one caller connection may carry (as Kubernetes' own
/// aggregated API servers allow).
pub const CALLER_STREAMS_PER_CONNECTION: u32 = 1000;

/// How long in-flight requests may take to finish once shutdown starts. Watches
/// are closed when it expires so their clients re-list elsewhere.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long a caller has to complete the TLS handshake. kube-apiserver closes a
/// connection that never starts TLS after a similar while; without a limit, idle
/// TCP connections would pile up until the file-descriptor limit.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an HTTP/1.1 caller has to send a request's headers. The body is read
/// within the request's own 60 s cap (see `handler`).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a caller has, once TLS is up, to send the first bytes of its first
/// request (the HTTP/2 preface, or an HTTP/1.1 request line). hyper's choice
/// between the two protocols waits for those bytes without a limit of its own,
/// so a caller that completes the handshake and then says nothing would hold its
/// connection, and a file descriptor, for ever. As long as the HTTP/1.1 header
/// timeout, so no client that kube-apiserver accepts is cut off.
pub const FIRST_BYTES_TIMEOUT: Duration = HEADER_READ_TIMEOUT;

/// The largest header list a caller's HTTP/2 request may carry: kube-apiserver's
/// (Go's 1 MiB `MaxHeaderBytes` plus its allowance of 32 bytes for each of ten
/// fields). The aggregator sends one `X-Remote-Group` per group of the user, so
/// hyper's default of 16 KiB refused users in a few hundred groups, and refused
/// them by failing the whole connection, with every other caller's stream on it.
pub const CALLER_MAX_HEADER_LIST_SIZE: u32 = (1 << 20) + 10 * 32;

/// HTTP/2 keep-alive: a caller connection that stops answering pings is closed.
pub const CALLER_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const CALLER_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bounds of the pause after a failed `accept` (for example at the
/// file-descriptor limit), doubling from the first to the second like Go's
/// net/http server, so the loop waits instead of spinning.
pub const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_secs(1));

/// The pause after each failed `accept` of one burst of failures, and whether to
/// log it: one line per burst, not one per failure.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    failures: u32,
}

impl AcceptBackoff {
    /// A failed accept: how long to wait, and whether this starts a burst.
    pub fn failed(&mut self) -> (Duration, bool) {
        let (first, max) = ACCEPT_BACKOFF;
        let delay = first
            .checked_mul(1u32 << self.failures.min(16))
            .map_or(max, |d| d.min(max));
        self.failures = self.failures.saturating_add(1);
        (delay, self.failures == 1)
    }

    /// A successful accept ends the burst; returns how many failures it had.
    pub fn succeeded(&mut self) -> u32 {
        std::mem::take(&mut self.failures)
    }
}

/// A listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address is taken or not local.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The serving certificate or key is unusable.
    #[error("serving certificate: {0}")]
    Certificate(String),
}

/// A PEM serving certificate (with its chain) and key.
#[derive(Clone, Debug)]
pub struct ServingIdentity {
    pub cert_chain_pem: String,
    pub key_pem: String,
}

/// TLS settings for a proxy listener: our certificate, and optional client
/// certificates checked against the client cluster's front-proxy CA.
pub fn proxy_tls_config(
    identity: &ServingIdentity,
    trust: &Arc<FrontProxyTrust>,
) -> Result<Arc<ServerConfig>, ServerError> {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(identity.cert_chain_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| ServerError::Certificate(e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes())
        .map_err(|e| ServerError::Certificate(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(crproxy_kube::crypto_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerError::Certificate(e.to_string()))?
        .with_client_cert_verifier(trust.verifier())
        .with_single_cert(chain, key)
        .map_err(|e| ServerError::Certificate(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Binds a listener, reporting the address in the error. With `share_port`,
/// several replicas on one host listen on the same port (SO_REUSEPORT) and the
/// kernel spreads connections over them, as a Service spreads them over pods.
pub async fn bind(addr: SocketAddr, share_port: bool) -> Result<TcpListener, ServerError> {
    let error = |source| ServerError::Bind { addr, source };
    if !share_port {
        return TcpListener::bind(addr).await.map_err(error);
    }
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(error)?;
    socket.set_reuseaddr(true).map_err(error)?;
    socket.set_reuseport(true).map_err(error)?;
    socket.bind(addr).map_err(error)?;
    socket.listen(1024).map_err(error)
}

/// Serves one group/version until `shutdown` turns true, then lets in-flight
/// requests finish for up to [`SHUTDOWN_GRACE`] and closes the connections still
/// open after it.
pub fn serve_proxy(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    proxy: Arc<GroupVersionProxy>,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let acceptor = TlsAcceptor::from(tls);
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        // Set when the grace period is over: every connection still open is
        // dropped, with whatever it was streaming.
        let (close_all, closing) = watch::channel(false);
        let mut backoff = AcceptBackoff::default();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            let (tcp, remote) = match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    let (delay, burst_starts) = backoff.failed();
                    if burst_starts {
                        tracing::warn!(%error, "accepting a proxy connection failed; retrying with backoff");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.wait_for(|stop| *stop) => break,
                    }
                    continue;
                }
            };
            let failures = backoff.succeeded();
            if failures > 0 {
                tracing::info!(failures, "accepting proxy connections again");
            }
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let proxy = Arc::clone(&proxy);
            let watcher = graceful.watcher();
            let mut closing = closing.clone();
            let serve = async move {
                let mut tls =
                    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(error)) => {
                            tracing::debug!(%remote, %error, "TLS handshake with a caller failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%remote, "TLS handshake with a caller timed out");
                            return;
                        }
                    };
                if !first_bytes_within(&mut tls, FIRST_BYTES_TIMEOUT).await {
                    tracing::debug!(%remote, "caller sent no request after the TLS handshake");
                    return;
                }
                // Parsed once per connection: every request on it shares the result.
                //
                // The handler's future is boxed: hyper keeps each stream's service
                // future in its task for the stream's whole life, so unboxed, the
                // handler's state (a few KiB) would stay allocated for as long as a
                // watch streams. Boxed, it is freed once the response head is out.
                let peer = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .map(|cert| Arc::new(PeerCertificate::from_der(cert)));
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let answer = Box::pin(Arc::clone(&proxy).handle(request, peer.clone()));
                    async move { Ok::<_, Infallible>(answer.await) }
                });
                let (streams, started) = ConnectionStreams::new();
                let mut builder = auto::Builder::new(streams);
                builder
                    .http1()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT);
                // An aggregator multiplexes many callers' watches over one connection;
                // hyper's default of 200 streams would queue the rest.
                builder
                    .http2()
                    .timer(TokioTimer::new())
                    .keep_alive_interval(CALLER_KEEPALIVE_INTERVAL)
                    .keep_alive_timeout(CALLER_KEEPALIVE_TIMEOUT)
                    .max_concurrent_streams(CALLER_STREAMS_PER_CONNECTION)
                    .max_header_list_size(CALLER_MAX_HEADER_LIST_SIZE);
                let connection = builder
                    .serve_connection(TokioIo::new(tls), service)
                    .into_owned();
                if let Err(error) = started.serve(Box::pin(watcher.watch(connection))).await {
                    tracing::debug!(%remote, %error, "proxy connection ended with an error");
                }
            };
            tokio::spawn(async move {
                tokio::select! {
                    biased;
                    () = serve => {}
                    _ = closing.wait_for(|close| *close) => {}
                }
            });
        }
        drop(listener);
        if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::info!("closing connections still open after the shutdown grace period");
            close_all.send_replace(true);
        }
    })
}

/// Whether the caller sends anything (and not just end of stream) within `within`.
/// The bytes stay buffered in `io` for whoever reads it next.
async fn first_bytes_within<IO>(io: &mut IO, within: Duration) -> bool
where
    IO: tokio::io::AsyncBufRead + Unpin,
{
    use tokio::io::AsyncBufReadExt;
    matches!(
        tokio::time::timeout(within, io.fill_buf()).await,
        Ok(Ok(bytes)) if !bytes.is_empty()
    )
}

/// Serves `/metrics` and `/metrics/syncer` (the same registry), `/healthz` and
/// `/readyz` (what [`Readiness`] answers) and `/livez` over plain HTTP on a local
/// address.
pub fn serve_metrics(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            let Ok((tcp, _)) = accepted else { continue };
            let metrics = Arc::clone(&metrics);
            let readiness = Arc::clone(&readiness);
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let metrics = Arc::clone(&metrics);
                    let readiness = Arc::clone(&readiness);
                    async move { Ok::<_, Infallible>(metrics_response(&metrics, &readiness, &request)) }
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    })
}

fn metrics_response<B>(
    metrics: &Metrics,
    readiness: &Readiness,
    request: &Request<B>,
) -> Response<ProxyBody> {
    let accept = request
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let (code, content_type, body): (StatusCode, &str, Bytes) = match request.uri().path() {
        "/metrics" | "/metrics/syncer" => {
            // OpenMetrics for scrapers that ask for it, Prometheus text otherwise.
            let (body, content_type) = metrics.encode_for_accept(accept);
            (StatusCode::OK, content_type, body.into())
        }
        "/healthz" | "/readyz" => {
            let (code, body) = readiness.answer();
            (code, "text/plain; charset=utf-8", body.into())
        }
        "/livez" => (StatusCode::OK, "text/plain", "ok".into()),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "404 page not found\n".into(),
        ),
    };
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(transport::full(body))
        .unwrap_or_else(|_| Response::new(transport::empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_caller_must_start_its_first_request_in_time() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};

        // Silent past the limit: given up (paused time runs the 30 s at once).
        let (_silent_client, server) = tokio::io::duplex(64);
        let mut server = BufReader::new(server);
        assert!(!first_bytes_within(&mut server, FIRST_BYTES_TIMEOUT).await);

        // Hung up without a byte: given up too.
        let (closed_client, server) = tokio::io::duplex(64);
        drop(closed_client);
        let mut server = BufReader::new(server);
        assert!(!first_bytes_within(&mut server, FIRST_BYTES_TIMEOUT).await);

        // Speaking in time: kept, and nothing it sent is lost to the check.
        let (mut client, server) = tokio::io::duplex(64);
        let mut server = BufReader::new(server);
        let speak = async {
            tokio::time::sleep(FIRST_BYTES_TIMEOUT / 2).await;
            client.write_all(b"PRI * HTTP/2.0").await.expect("write");
        };
        let (kept, ()) = tokio::join!(first_bytes_within(&mut server, FIRST_BYTES_TIMEOUT), speak);
        assert!(kept);
        let mut preface = [0u8; 14];
        server.read_exact(&mut preface).await.expect("read");
        assert_eq!(&preface, b"PRI * HTTP/2.0");
    }

    #[test]
    fn accept_failures_back_off_and_log_once_per_burst() {
        let mut backoff = AcceptBackoff::default();
        let burst: Vec<(Duration, bool)> = (0..10).map(|_| backoff.failed()).collect();
        assert_eq!(burst[0], (Duration::from_millis(5), true));
        assert_eq!(burst[1], (Duration::from_millis(10), false));
        assert_eq!(burst[2], (Duration::from_millis(20), false));
        assert!(burst[1..].iter().all(|(_, log)| !log), "one line per burst");
        assert_eq!(burst[9].0, Duration::from_secs(1), "capped");
        assert_eq!(backoff.succeeded(), 10);
        assert_eq!(
            backoff.failed(),
            (Duration::from_millis(5), true),
            "a new burst"
        );
        // Far into a burst the delay stays at the cap without overflowing.
        for _ in 0..100 {
            backoff.failed();
        }
        assert_eq!(backoff.failed().0, Duration::from_secs(1));
    }
}
