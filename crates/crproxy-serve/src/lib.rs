//! One HTTPS serve loop: accept TCP connections, complete the TLS handshake, serve
//! HTTP/1.1 or HTTP/2 (by ALPN) with a handler, until told to stop.
//!
//! Shared by `crproxy-sync`'s write-through webhook and devcluster's example
//! extension API server, which may not depend on each other (the sync never imports
//! devcluster) and must not put I/O into `crproxy-core`.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// Serves `handler` on every connection `listener` accepts, over TLS by `acceptor`,
/// until `stopped` turns true; then ends every open connection (watches included).
/// A failed handshake ends only its own connection.
pub async fn serve_tls<H, F, B>(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    handler: H,
    mut stopped: watch::Receiver<bool>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let tcp = match accepted {
                    Ok((tcp, _)) => tcp,
                    Err(_) => {
                        // Out of file descriptors and the like: do not spin on it.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let handler = handler.clone();
                connections.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service = service_fn(move |request| {
                        let answer = handler(request);
                        async move { Ok::<_, Infallible>(answer.await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
            () = until_stopped(&mut stopped) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // Dropping the set aborts every connection.
    connections.shutdown().await;
}

/// Returns once `stopped` is true (or its sender is gone), holding no borrow of it.
async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests;
