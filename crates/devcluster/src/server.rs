//! Starting and stopping a devcluster: data directory (PKI, token file,
//! kubeconfig, database), TLS listeners (HTTP/1.1 and HTTP/2 by ALPN, optional
//! client certificates), and the handle the embedding code and tests use.

mod admitted;
mod aggregated;
mod auth;
mod filters;
mod handlers;
mod hooks;
mod http;
mod objects;
mod output;
mod protobuf;
mod request_metrics;
mod rest;
mod scale;
pub(crate) mod seams;

pub use auth::PeerCertificates;
pub(crate) use filters::new_uuid;
pub(crate) use http::{decode_yaml, go_not_found, nosniff, query_parameters, text_plain};

use crate::error::Error;
use crate::registry::Registry;
use crate::store::Store;
use crate::types::UserInfo;
use crproxy_core::locks;
use crproxy_core::pki::{CertPem, CertificateAuthority};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How to start a devcluster.
#[derive(Clone, Debug)]
pub struct DevClusterConfig {
    /// Cluster name: kubeconfig cluster/context `<name>`, user `<name>-admin`.
    pub name: String,
    /// Where state lives; `None` keeps everything in memory (certificates too).
    pub data_dir: Option<PathBuf>,
    pub bind: IpAddr,
    /// 0 picks a free port.
    pub port: u16,
}

impl DevClusterConfig {
    /// An in-memory cluster on an ephemeral 127.0.0.1 port.
    pub fn in_memory(name: &str) -> Self {
        DevClusterConfig {
            name: name.to_string(),
            data_dir: None,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
        }
    }
}

/// Shared by every listener and request.
pub(crate) struct State {
    pub name: String,
    pub store: Arc<Store>,
    pub registry: Arc<Registry>,
    pub authn: crate::authn::Authenticator,
    pub policy: auth::PolicyCache,
    pub token_file: Option<PathBuf>,
    /// `host:port` of the first listener, for `/api`'s serverAddressByClientCIDRs.
    pub server_address: Mutex<String>,
    /// Flips to true at shutdown; watches and controllers stop.
    pub shutdown: watch::Receiver<bool>,
    pub ns_cleanups: Mutex<HashSet<String>>,
    /// Whether deleted namespaces are emptied and removed (kube-controller-manager's
    /// namespace controller); see [`DevCluster::stop_namespace_controller`].
    pub namespace_controller: std::sync::atomic::AtomicBool,
    /// Whether `/api` and `/apis` serve aggregated discovery; see
    /// [`DevCluster::stop_aggregated_discovery`].
    pub aggregated_discovery: std::sync::atomic::AtomicBool,
    /// Set once any object with ownerReferences was written: only then do
    /// deletions look for dependents to collect.
    pub owners_seen: std::sync::atomic::AtomicBool,
    /// Forwards requests for APIServices backed by a service; set once at start.
    pub aggregator: std::sync::OnceLock<Arc<crate::aggregation::Aggregator>>,
    /// `apiserver_request_total`, served on `/metrics`.
    pub requests: Arc<request_metrics::RequestMetrics>,
    /// The priority-and-fairness flow schemas requests are classified into.
    pub flow_schemas: filters::FlowSchemas,
}

impl State {
    /// Called when the set of served resources changes (discovery is computed on
    /// demand, so there is nothing to invalidate yet).
    pub fn discovery_changed(&self) {}
}

struct Listener {
    stop: watch::Sender<bool>,
}

struct Inner {
    state: Arc<State>,
    tls: Arc<rustls::ServerConfig>,
    ca: CertificateAuthority,
    front_proxy_ca: CertificateAuthority,
    front_proxy_client: CertPem,
    admin_token: String,
    addr: SocketAddr,
    listeners: Mutex<HashMap<SocketAddr, Listener>>,
    shutdown_tx: watch::Sender<bool>,
    data_dir: Option<PathBuf>,
}

/// A running devcluster. Dropping it without [`DevCluster::shutdown`] stops the
/// listeners when the runtime ends; call `shutdown` to flush the database.
#[derive(Clone)]
pub struct DevCluster {
    inner: Arc<Inner>,
}

fn write_file(path: &Path, contents: &str) -> Result<(), Error> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    std::fs::write(path, contents).map_err(|e| Error::io(path, e))?;
    #[cfg(unix)]
    if path
        .extension()
        .is_some_and(|e| e == "key" || e == "csv" || e == "kubeconfig")
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    }
    Ok(())
}

/// Loads `<dir>/<stem>.crt/.key` or generates and stores a new CA.
fn load_or_create_ca(
    dir: Option<&Path>,
    stem: &str,
    cn: &str,
) -> Result<CertificateAuthority, Error> {
    if let Some(dir) = dir {
        let crt = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        if crt.exists() && key.exists() {
            let pem = CertPem {
                cert: std::fs::read_to_string(&crt).map_err(|e| Error::io(&crt, e))?,
                key: std::fs::read_to_string(&key).map_err(|e| Error::io(&key, e))?,
            };
            return Ok(CertificateAuthority::from_pem(&pem)?);
        }
        let ca = CertificateAuthority::generate(cn)?;
        write_file(&crt, &ca.pem().cert)?;
        write_file(&key, &ca.pem().key)?;
        return Ok(ca);
    }
    Ok(CertificateAuthority::generate(cn)?)
}

fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn tls_config(
    serving: &CertPem,
    client_cas: &[&CertPem],
) -> Result<Arc<rustls::ServerConfig>, Error> {
    let provider = Arc::new(crproxy_kube::crypto_provider());
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(serving.cert.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| Error::Store(format!("serving certificate: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(serving.key.as_bytes())
        .map_err(|e| Error::Store(format!("serving key: {e}")))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in client_cas {
        for c in CertificateDer::pem_slice_iter(ca.cert.as_bytes()) {
            let c = c.map_err(|e| Error::Store(format!("client CA: {e}")))?;
            roots.add(c)?;
        }
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| Error::Store(format!("client certificate verifier: {e}")))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Starts a devcluster and returns once it accepts connections.
pub async fn start(cfg: DevClusterConfig) -> Result<DevCluster, Error> {
    let dir = cfg.data_dir.clone();
    if let Some(d) = &dir {
        std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
    }
    let pki = dir.as_ref().map(|d| d.join("pki"));
    let ca = load_or_create_ca(pki.as_deref(), "ca", &format!("{}-ca", cfg.name))?;
    let front_proxy_ca = load_or_create_ca(pki.as_deref(), "front-proxy-ca", "front-proxy-ca")?;
    let front_proxy_client = match &pki {
        Some(p) if p.join("front-proxy-client.crt").exists() => {
            let crt = p.join("front-proxy-client.crt");
            let key = p.join("front-proxy-client.key");
            CertPem {
                cert: std::fs::read_to_string(&crt).map_err(|e| Error::io(&crt, e))?,
                key: std::fs::read_to_string(&key).map_err(|e| Error::io(&key, e))?,
            }
        }
        _ => {
            let c = front_proxy_ca.issue_client("front-proxy-client", &[])?;
            if let Some(p) = &pki {
                write_file(&p.join("front-proxy-client.crt"), &c.cert)?;
                write_file(&p.join("front-proxy-client.key"), &c.key)?;
            }
            c
        }
    };
    let mut ips: Vec<IpAddr> = vec![
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        "::1".parse().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    ];
    if !cfg.bind.is_unspecified() && !ips.contains(&cfg.bind) {
        ips.push(cfg.bind);
    }
    let serving = ca.issue_server(&["localhost", "kubernetes", "kubernetes.default"], &ips)?;
    let tls = tls_config(&serving, &[ca.pem(), front_proxy_ca.pem()])?;

    // Tokens.
    let token_file = dir.as_ref().map(|d| d.join("tokens.csv"));
    let mut admin_token = None;
    let mut token_text = String::new();
    if let Some(tf) = token_file.as_ref().filter(|p| p.exists()) {
        token_text = std::fs::read_to_string(tf).map_err(|e| Error::io(tf, e))?;
        let users = auth::parse_token_file(&token_text).map_err(|message| Error::Format {
            path: tf.clone(),
            message,
        })?;
        admin_token = users
            .into_iter()
            .find(|(_, u)| u.name == "admin")
            .map(|(t, _)| t);
    }
    let tokens =
        crate::authn::Authenticator::new(&token_text, true).map_err(|e| Error::Format {
            path: token_file.clone().unwrap_or_default(),
            message: e.to_string(),
        })?;
    let admin_token = match admin_token {
        Some(t) => t,
        None => {
            let t = random_token();
            let user = UserInfo {
                name: "admin".into(),
                uid: "admin-uid".into(),
                groups: vec!["system:masters".into()],
                extra: Default::default(),
            };
            if let Some(tf) = &token_file {
                let mut text = std::fs::read_to_string(tf).unwrap_or_default();
                text.push_str(&auth::token_file_line(&t, &user));
                write_file(tf, &text)?;
            }
            tokens.add_token(t.clone(), user);
            t
        }
    };

    let store = Arc::new(match &dir {
        Some(d) => Store::open(&d.join("store.redb"))?,
        None => Store::in_memory(),
    });
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let state = Arc::new(State {
        name: cfg.name.clone(),
        store,
        registry: Arc::new(Registry::new()),
        authn: tokens,
        policy: auth::PolicyCache::default(),
        token_file,
        server_address: Mutex::new(String::new()),
        shutdown: shutdown_rx,
        ns_cleanups: Mutex::new(HashSet::new()),
        namespace_controller: std::sync::atomic::AtomicBool::new(true),
        aggregated_discovery: std::sync::atomic::AtomicBool::new(true),
        owners_seen: std::sync::atomic::AtomicBool::new(false),
        aggregator: std::sync::OnceLock::new(),
        requests: Arc::default(),
        flow_schemas: filters::FlowSchemas::new(),
    });
    handlers::bootstrap(&state);
    aggregated::publish_authentication_configmap(
        &state,
        &front_proxy_ca.pem().cert,
        &ca.pem().cert,
    );
    let aggregator = aggregated::start(&state, front_proxy_client.clone())
        .map_err(|e| Error::Aggregation(e.to_string()))?;
    let _ = state.aggregator.set(aggregator);
    hooks::load_crds(&state);
    hooks::resume_namespace_cleanup(&state);
    // Bootstrap writes are not watchable history, as on a compacted etcd.
    state.store.compact_history();

    let addr = SocketAddr::new(cfg.bind, cfg.port);
    let (bound, listener) = bind(addr, state.clone(), tls.clone()).await?;
    *locks::lock(&state.server_address) = bound.to_string();
    let inner = Arc::new(Inner {
        state,
        tls,
        ca,
        front_proxy_ca,
        front_proxy_client,
        admin_token,
        addr: bound,
        listeners: Mutex::new(HashMap::from([(bound, listener)])),
        shutdown_tx,
        data_dir: dir.clone(),
    });
    let cluster = DevCluster { inner };
    if let Some(d) = &dir {
        write_file(&d.join("admin.kubeconfig"), &cluster.admin_kubeconfig())?;
    }
    tracing::info!(name = %cfg.name, url = %cluster.url(), "devcluster started");
    Ok(cluster)
}

async fn bind(
    addr: SocketAddr,
    state: Arc<State>,
    tls: Arc<rustls::ServerConfig>,
) -> Result<(SocketAddr, Listener), Error> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(accept_loop(listener, tls, state, stop_rx));
    Ok((bound, Listener { stop: stop_tx }))
}

async fn accept_loop(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<State>,
    mut stop: watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut shutdown = state.shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _peer)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                tokio::spawn(serve_connection(tcp, acceptor.clone(), state.clone(), stop.clone()));
            }
            _ = stop.changed() => break,
            _ = shutdown.changed() => break,
        }
    }
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    state: Arc<State>,
    mut stop: watch::Receiver<bool>,
) {
    let handshake =
        tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(tcp)).await;
    let Ok(Ok(tls)) = handshake else { return };
    let certs = tls.get_ref().1.peer_certificates().map(|chain| {
        PeerCertificates(Arc::new(
            chain.iter().map(|c| c.clone().into_owned()).collect(),
        ))
    });
    let svc_state = state.clone();
    let service =
        hyper::service::service_fn(move |mut req: ::http::Request<hyper::body::Incoming>| {
            if let Some(c) = &certs {
                req.extensions_mut().insert(c.clone());
            }
            let state = svc_state.clone();
            let version = req.version();
            let head = req.method() == ::http::Method::HEAD;
            async move {
                let response = http::framed_like_go(version, handlers::handle(state, req).await);
                Ok::<_, std::convert::Infallible>(match head {
                    true => http::headed_like_go(response),
                    false => response,
                })
            }
        });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // client-go multiplexes every watch of a process over one HTTP/2 connection;
    // kube-apiserver allows 1000 streams per connection.
    builder.http2().max_concurrent_streams(1000);
    // Upgrades are bridged to aggregated API servers (exec-style requests).
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
    tokio::pin!(conn);
    let mut shutdown = state.shutdown.clone();
    tokio::select! {
        _ = conn.as_mut() => {}
        // A stopped listener drops its connections at once, like a replica that
        // went away.
        _ = stop.changed() => {}
        _ = shutdown.changed() => {}
    }
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

impl DevCluster {
    /// `https://<addr>` of the first listener.
    pub fn url(&self) -> String {
        let a = self.inner.addr;
        match a.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => format!("https://127.0.0.1:{}", a.port()),
            IpAddr::V6(ip) if ip.is_unspecified() => format!("https://[::1]:{}", a.port()),
            _ => format!("https://{a}"),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    pub fn name(&self) -> &str {
        &self.inner.state.name
    }

    /// The cluster CA certificate (PEM) clients trust.
    pub fn ca_pem(&self) -> String {
        self.inner.ca.pem().cert.clone()
    }

    pub fn admin_token(&self) -> String {
        self.inner.admin_token.clone()
    }

    /// The data directory, when the cluster has one.
    pub fn data_dir(&self) -> Option<&Path> {
        self.inner.data_dir.as_deref()
    }

    /// A kubeconfig (YAML) for `user` with `token`, against the first listener.
    pub fn kubeconfig(&self, user: &str, token: &str) -> String {
        let name = &self.inner.state.name;
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {user}\ncurrent-context: {name}\npreferences: {{}}\nusers:\n- name: {user}\n  user:\n    token: {token}\n",
            url = self.url(),
            ca = b64(&self.ca_pem()),
        )
    }

    /// The admin kubeconfig: cluster and context `<name>`, user `<name>-admin`.
    pub fn admin_kubeconfig(&self) -> String {
        let name = &self.inner.state.name;
        self.kubeconfig(&format!("{name}-admin"), &self.inner.admin_token)
    }

    /// Writes a kubeconfig for `user` (in `groups`) to `path`; `admin` uses the
    /// admin token, other users get a new token.
    pub fn write_kubeconfig(&self, path: &Path, user: &str, groups: &[&str]) -> Result<(), Error> {
        let text = if user == "admin" {
            self.admin_kubeconfig()
        } else {
            let token = self.issue_token(user, groups)?;
            self.kubeconfig(user, &token)
        };
        write_file(path, &text)
    }

    /// From now on, deleted namespaces stay Terminating with their contents: a
    /// kube-apiserver without kube-controller-manager, as the reference exchanges
    /// were recorded. Removing the finalizers through `/finalize` removes the
    /// namespace and leaves its contents behind, as on kube. Cleanups already
    /// under way finish.
    pub fn stop_namespace_controller(&self) {
        self.inner
            .state
            .namespace_controller
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// From now on, `/api` and `/apis` answer as a kube-apiserver without
    /// aggregated discovery (before 1.26, or with `AggregatedDiscoveryEndpoint`
    /// off): the aggregated media types are not acceptable, and a request naming
    /// no other gets 406.
    pub fn stop_aggregated_discovery(&self) {
        self.inner
            .state
            .aggregated_discovery
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Adds a bearer-token user at runtime (appended to tokens.csv when there is a
    /// data directory) and returns the token.
    pub fn issue_token(&self, user: &str, groups: &[&str]) -> Result<String, Error> {
        let token = random_token();
        let info = UserInfo {
            name: user.to_string(),
            uid: format!("{user}-uid"),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: Default::default(),
        };
        if let Some(tf) = &self.inner.state.token_file {
            let mut text = std::fs::read_to_string(tf).unwrap_or_default();
            text.push_str(&auth::token_file_line(&token, &info));
            write_file(tf, &text)?;
        }
        self.inner.state.authn.add_token(token.clone(), info);
        Ok(token)
    }

    /// Stops accepting a bearer token (as an expired or revoked token stops working),
    /// also removing it from tokens.csv when there is a data directory.
    pub fn revoke_token(&self, token: &str) -> Result<(), Error> {
        if let Some(tf) = &self.inner.state.token_file {
            let text = std::fs::read_to_string(tf).unwrap_or_default();
            let prefix = format!("{token},");
            let kept: String = text
                .lines()
                .filter(|line| !line.starts_with(&prefix))
                .map(|line| format!("{line}\n"))
                .collect();
            write_file(tf, &kept)?;
        }
        self.inner.state.authn.remove_token(token);
        Ok(())
    }

    /// A client certificate for `user` in `groups`, signed by the cluster CA.
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> Result<CertPem, Error> {
        Ok(self.inner.ca.issue_client(user, groups)?)
    }

    pub fn front_proxy_ca_pem(&self) -> String {
        self.inner.front_proxy_ca.pem().cert.clone()
    }

    /// The client certificate an aggregating front proxy presents.
    pub fn front_proxy_client(&self) -> CertPem {
        self.inner.front_proxy_client.clone()
    }

    /// Serves the same store on another port (0 = ephemeral): another "replica".
    pub async fn add_listener(&self, port: u16) -> Result<SocketAddr, Error> {
        let addr = SocketAddr::new(self.inner.addr.ip(), port);
        let (bound, listener) =
            bind(addr, self.inner.state.clone(), self.inner.tls.clone()).await?;
        locks::lock(&self.inner.listeners).insert(bound, listener);
        Ok(bound)
    }

    /// Stops a listener and drops its open connections.
    pub fn stop_listener(&self, addr: SocketAddr) -> Result<(), Error> {
        let l = locks::lock(&self.inner.listeners)
            .remove(&addr)
            .ok_or(Error::NoListener(addr))?;
        let _ = l.stop.send(true);
        Ok(())
    }

    /// Addresses of all running listeners.
    pub fn listeners(&self) -> Vec<SocketAddr> {
        let mut v: Vec<SocketAddr> = locks::lock(&self.inner.listeners).keys().copied().collect();
        v.sort();
        v
    }

    /// Stops every listener, ends watches and flushes the database.
    pub async fn shutdown(self) {
        let _ = self.inner.shutdown_tx.send(true);
        let listeners: Vec<Listener> = locks::lock(&self.inner.listeners)
            .drain()
            .map(|(_, l)| l)
            .collect();
        for l in listeners {
            let _ = l.stop.send(true);
        }
        let store = self.inner.state.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.close()).await;
    }
}
