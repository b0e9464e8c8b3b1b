//! A hyper-util connector: TCP, then TLS with the cluster's rustls config. Written here
//! rather than pulled from hyper-rustls so the crate graph stays small and the TLS
//! config is exactly the one [`crate::ClusterConfig::rustls_config`] builds.

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Dials the API server. Every connection verifies against the configured server name,
/// because the client only ever talks to the one server of its [`crate::ClusterConfig`].
#[derive(Clone)]
pub(crate) struct Connector {
    tls: TlsConnector,
    server_name: ServerName<'static>,
    connect_timeout: Duration,
}

impl Connector {
    pub(crate) fn new(
        tls: Arc<rustls::ClientConfig>,
        server_name: ServerName<'static>,
        connect_timeout: Duration,
    ) -> Self {
        Connector {
            tls: TlsConnector::from(tls),
            server_name,
            connect_timeout,
        }
    }
}

/// A plain or TLS connection.
pub(crate) enum Conn {
    Plain(TokioIo<TcpStream>),
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl tower::Service<Uri> for Connector {
    type Response = Conn;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Conn>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tls = match uri.scheme_str() {
                Some("https") => true,
                Some("http") => false,
                other => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("unsupported URL scheme {other:?}"),
                    ))
                }
            };
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "URL has no host"))?;
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
            let tcp = tokio::time::timeout(
                this.connect_timeout,
                TcpStream::connect((host.as_str(), port)),
            )
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting to {host}:{port} timed out"),
                )
            })??;
            let _ = tcp.set_nodelay(true);
            if !tls {
                return Ok(Conn::Plain(TokioIo::new(tcp)));
            }
            let stream = tokio::time::timeout(
                this.connect_timeout,
                this.tls.connect(this.server_name.clone(), tcp),
            )
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("TLS handshake with {host}:{port} timed out"),
                )
            })??;
            Ok(Conn::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        match self {
            Conn::Plain(_) => Connected::new(),
            Conn::Tls(s) => {
                let (_, session) = s.inner().get_ref();
                if session.alpn_protocol() == Some(b"h2") {
                    Connected::new().negotiated_h2()
                } else {
                    Connected::new()
                }
            }
        }
    }
}

impl Read for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl Write for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }
}
