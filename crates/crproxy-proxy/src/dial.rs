//! Dialling one peer: TCP connect plus TLS handshake under a single 5 s budget.
//!
//! Peers are addressed by `IP:port`, but the certificate they present names the
//! target's API server host from its kubeconfig, so every dial verifies against one
//! fixed [`ServerName`] instead of the address it connects to.

use std::sync::Arc;
use std::time::Duration;

use crproxy_core::reason::Reason;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// How long one dial (TCP connect and TLS handshake together) may take. Fixed by
/// the spec: it turns a hanging dial into a countable failure.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a target connection may sit idle before TCP keepalive probes it.
/// A peer that vanished without a FIN or a reset (a node powered off, a route
/// dropped) would otherwise leave its pooled connections looking usable: a
/// request picking one waits out its whole deadline, a quiet watch on one its
/// idle limit.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
/// Between keepalive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the kernel closes the connection: a peer gone
/// silent is found out some 30 s into its connection's idleness. (No limit on
/// unacknowledged data, `TCP_USER_TIMEOUT`, is set: since Linux 5.11 it also
/// ends a connection whose peer keeps its receive window shut, as an API server
/// does while a request waits, unread, in its priority and fairness queue.)
pub const KEEPALIVE_PROBES: u32 = 3;

/// ALPN protocols offered when the caller's TLS config offers none: HTTP/2 first so
/// a multiplexed connection carries many requests (every watch), HTTP/1.1 as
/// fallback. Exchange connections ([`Dialer::dial_http1`]) offer HTTP/1.1 alone.
pub const DEFAULT_ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Why a dial failed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// TCP connect and TLS handshake together took longer than [`DIAL_TIMEOUT`].
    #[error("dial {peer}: timed out after {timeout:?}")]
    Timeout {
        /// The peer that was dialled.
        peer: String,
        /// The budget that expired.
        timeout: Duration,
    },
    /// The TCP connection could not be established (refused, unreachable, bad
    /// address).
    #[error("dial {peer}: connect: {source}")]
    Connect {
        /// The peer that was dialled.
        peer: String,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The TCP connection was established but the TLS handshake failed (bad
    /// certificate, protocol error, connection reset).
    #[error("dial {peer}: tls handshake: {source}")]
    Tls {
        /// The peer that was dialled.
        peer: String,
        /// The handshake error; rustls errors are wrapped in it.
        #[source]
        source: std::io::Error,
    },
    /// TLS came up but the HTTP/2 or HTTP/1.1 connection setup on top of it failed.
    #[error("dial {peer}: http handshake: {source}")]
    Http {
        /// The peer that was dialled.
        peer: String,
        /// hyper's error.
        #[source]
        source: hyper::Error,
    },
}

impl DialError {
    /// The `reason` label for this failure: `timeout` for an expired dial budget,
    /// `error` for everything else.
    pub fn reason(&self) -> Reason {
        match self {
            DialError::Timeout { .. } => Reason::Timeout,
            DialError::Connect { .. } | DialError::Tls { .. } | DialError::Http { .. } => {
                Reason::Error
            }
        }
    }

    /// Whether the peer ended the TLS handshake because it speaks none of the
    /// protocols offered (the `no_application_protocol` alert).
    pub fn refused_protocol(&self) -> bool {
        let DialError::Tls { source, .. } = self else {
            return false;
        };
        matches!(
            source
                .get_ref()
                .and_then(|e| e.downcast_ref::<rustls::Error>()),
            Some(rustls::Error::AlertReceived(
                rustls::AlertDescription::NoApplicationProtocol
            ))
        )
    }
}

/// Options of every target connection. Each only helps (a socket without one
/// works as before), so a failure to set one is logged, not fatal.
///
/// Keepalive is set before the handshake, so before ALPN says which protocol the
/// connection speaks: [`Dialer::dial`] may end up on HTTP/1.1 too, where it is
/// the only check that the peer is still there. An HTTP/2 connection keeps it
/// beside its own PINGs (`pool::H2_KEEPALIVE_INTERVAL`, 30 s after the last
/// read, closed 10 s after an unanswered one), where it adds little: each
/// answered PING resets the kernel's idle time, so an idle HTTP/2 connection
/// carries about one probe between two PINGs, and a PING in flight holds the
/// probes off, so a host gone silent is usually found by the PING, some 40 s
/// into the silence. The PING also finds what probes cannot: an API server that
/// stopped answering on a host whose kernel still does.
fn tune_socket(tcp: &TcpStream) {
    // Requests are small and latency-bound; don't let Nagle hold them back.
    let _ = tcp.set_nodelay(true);
    let socket = socket2::SockRef::from(tcp);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(error) = socket.set_tcp_keepalive(&keepalive) {
        tracing::debug!(%error, "setting TCP keepalive on a target connection failed");
    }
}

/// An established TLS connection to one peer.
#[derive(Debug)]
pub struct PeerConnection {
    /// The peer address that was dialled.
    pub peer: String,
    /// The TLS stream, handshake complete.
    pub stream: TlsStream<TcpStream>,
}

impl PeerConnection {
    /// Whether the peer agreed to speak HTTP/2 through ALPN.
    pub fn is_h2(&self) -> bool {
        self.stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice())
    }
}

/// Dials peers of one target with one TLS identity.
#[derive(Clone)]
pub struct Dialer {
    /// Offers the configured protocols (HTTP/2 first by default).
    connector: TlsConnector,
    /// The same identity offering HTTP/1.1 alone, for connections that carry one
    /// exchange at a time.
    http1_connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl Dialer {
    /// A dialer that verifies every peer against `server_name`. If `config` offers
    /// no ALPN protocols, [`DEFAULT_ALPN`] is added to a copy of it.
    pub fn new(config: Arc<rustls::ClientConfig>, server_name: ServerName<'static>) -> Dialer {
        let config = if config.alpn_protocols.is_empty() {
            let mut owned = (*config).clone();
            owned.alpn_protocols = DEFAULT_ALPN.iter().map(|p| p.to_vec()).collect();
            Arc::new(owned)
        } else {
            config
        };
        let mut http1 = (*config).clone();
        http1.alpn_protocols = vec![b"http/1.1".to_vec()];
        Dialer {
            connector: TlsConnector::from(config),
            http1_connector: TlsConnector::from(Arc::new(http1)),
            server_name,
        }
    }

    /// The name every peer certificate is verified against.
    pub fn server_name(&self) -> &ServerName<'static> {
        &self.server_name
    }

    /// Connects to `peer` (`host:port`) and completes the TLS handshake, all within
    /// [`DIAL_TIMEOUT`].
    pub async fn dial(&self, peer: &str) -> Result<PeerConnection, DialError> {
        self.dial_with(&self.connector, peer).await
    }

    /// [`Dialer::dial`] offering only HTTP/1.1 in ALPN.
    pub async fn dial_http1(&self, peer: &str) -> Result<PeerConnection, DialError> {
        self.dial_with(&self.http1_connector, peer).await
    }

    async fn dial_with(
        &self,
        connector: &TlsConnector,
        peer: &str,
    ) -> Result<PeerConnection, DialError> {
        let attempt = async {
            let tcp = TcpStream::connect(peer)
                .await
                .map_err(|source| DialError::Connect {
                    peer: peer.to_owned(),
                    source,
                })?;
            tune_socket(&tcp);
            let stream = connector
                .connect(self.server_name.clone(), tcp)
                .await
                .map_err(|source| DialError::Tls {
                    peer: peer.to_owned(),
                    source,
                })?;
            Ok(PeerConnection {
                peer: peer.to_owned(),
                stream,
            })
        };
        match tokio::time::timeout(DIAL_TIMEOUT, attempt).await {
            Ok(result) => result,
            Err(_elapsed) => Err(DialError::Timeout {
                peer: peer.to_owned(),
                timeout: DIAL_TIMEOUT,
            }),
        }
    }
}
