//! A TCP relay in front of a server, for tests that must see or break what crosses
//! the network: it counts the connections made through it and can freeze them.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A TCP relay in front of the API server whose connections can be frozen: a
/// frozen connection stays open and never forwards another byte (a dead NAT entry,
/// a hung middlebox), and connections made while frozen are born that way.
pub struct Relay {
    /// Where callers connect instead of the upstream.
    pub addr: SocketAddr,
    upstream: Arc<OnceLock<SocketAddr>>,
    frozen: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
    accept: JoinHandle<()>,
    pumps: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    /// Starts relaying to `upstream` from a new port on 127.0.0.1.
    pub async fn start(upstream: SocketAddr) -> Relay {
        let relay = Relay::unconnected().await;
        relay.connect_to(upstream);
        relay
    }

    /// A relay on a new port on 127.0.0.1 that closes what it accepts until
    /// [`Relay::connect_to`] names its upstream: for a server that is told the
    /// relay's address before it exists itself.
    pub async fn unconnected() -> Relay {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let upstream: Arc<OnceLock<SocketAddr>> = Arc::default();
        let frozen = Arc::new(AtomicBool::new(false));
        let connections: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let pumps: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let upstream = Arc::clone(&upstream);
            let frozen = Arc::clone(&frozen);
            let connections = Arc::clone(&connections);
            let pumps = Arc::clone(&pumps);
            async move {
                // Bounded by the abort in Drop.
                while let Ok((caller, _)) = listener.accept().await {
                    let Some(upstream) = upstream.get().copied() else {
                        continue;
                    };
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        continue;
                    };
                    let dead = Arc::new(AtomicBool::new(frozen.load(Ordering::SeqCst)));
                    connections.lock().expect("lock").push(Arc::clone(&dead));
                    let (caller_read, caller_write) = caller.into_split();
                    let (server_read, server_write) = server.into_split();
                    let mut pumps = pumps.lock().expect("lock");
                    pumps.push(tokio::spawn(pump(
                        caller_read,
                        server_write,
                        Arc::clone(&dead),
                    )));
                    pumps.push(tokio::spawn(pump(server_read, caller_write, dead)));
                }
            }
        });
        Relay {
            addr,
            upstream,
            frozen,
            connections,
            accept,
            pumps,
        }
    }

    /// Where connections accepted from now on are relayed to. Set once.
    pub fn connect_to(&self, upstream: SocketAddr) {
        self.upstream
            .set(upstream)
            .expect("a relay's upstream is set once");
    }

    /// Every open connection stops forwarding for good; new ones too, until
    /// [`Relay::thaw`].
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
        for dead in self.connections.lock().expect("lock").iter() {
            dead.store(true, Ordering::SeqCst);
        }
    }

    /// How many connections callers have made through the relay.
    pub fn connections(&self) -> usize {
        self.connections.lock().expect("lock").len()
    }

    /// New connections forward again; frozen ones stay frozen.
    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        for pump in self.pumps.lock().expect("lock").drain(..) {
            pump.abort();
        }
    }
}

/// Copies bytes one way until either side closes; once `dead` is set, holds what
/// it read and both sockets open for ever.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    dead: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if dead.load(Ordering::SeqCst) {
            let _keep_open = (from, to);
            std::future::pending::<()>().await;
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
