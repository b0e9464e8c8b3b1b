//! The aggregation layer: APIServices that point at a Service are served by an
//! extension API server (for crproxy: the proxy), and devcluster forwards their
//! requests the way kube-apiserver's aggregator does (`../shared/reference/aggregation.md`
//! is the observed behaviour this follows).
//!
//! # Contract with the request pipeline
//!
//! Authentication, impersonation and RBAC run **before** [`Aggregator::proxy`]: a
//! request the caller may not make is answered 403 by devcluster and never reaches
//! the backend, and admission does not run for aggregated resources. The pipeline
//! calls [`Aggregator::route`] for every `/apis/<group>/<version>[/...]` path; a
//! `Some(route)` means "forward with [`Aggregator::proxy`] as the authenticated (or
//! impersonated) user". If the request extensions carry the client's
//! [`std::net::SocketAddr`], it becomes `X-Forwarded-For`. For connection upgrades
//! the incoming request must come from a hyper server with upgrades enabled (axum's
//! `serve` does that).
//!
//! # What goes to the backend
//!
//! - TLS to `https://<externalName>:<port>` (ExternalName Services) or to a ready
//!   endpoint of the Service's EndpointSlices; the server certificate is verified
//!   against the APIService `caBundle` for the name `<service>.<namespace>.svc`
//!   (kube's choice, even for ExternalName) unless `insecureSkipTLSVerify`; the
//!   front-proxy client certificate is presented. HTTP/2 is used when the backend
//!   offers it (as Go's transport does), HTTP/1.1 otherwise and for upgrades.
//!   HTTP/2 connections are kept and shared by later requests to the same backend
//!   with the same TLS settings, as Go's transport keeps them for kube-apiserver; a
//!   request the kept connection could not take (it closed meanwhile) is sent on a
//!   new one. HTTP/1.1 connections serve one request.
//! - The caller's identity as `X-Remote-User`, one `X-Remote-Group` per group,
//!   `X-Remote-Uid`, `X-Remote-Extra-<percent-encoded key>` (one header per value),
//!   plus `X-Forwarded-For/Host/Proto/Uri` and `Audit-Id` (the request's own,
//!   which the server in front sets to its audit ID, else a new one). The caller's
//!   `Authorization`, `Impersonate-*` and any `X-Remote-*` headers are dropped;
//!   `Accept` and everything else pass unchanged.
//! - Bodies stream both ways frame by frame (watch events are not buffered);
//!   upgrades are bridged. The backend's answer comes back marked [`Relayed`],
//!   except an answer to an upgrade that is neither 101 nor an error, which
//!   becomes kube's 503 `invalid upgrade response: status code <n>`.
//!
//! # Controllers
//!
//! [`Aggregator::spawn_controllers`] keeps each APIService's `Available` condition
//! (every 30 s, on every store change, and after a failed discovery check with a
//! backoff doubling from 5 ms, as kube's work queue retries) and fetches backend
//! discovery (every 60 s, on change, and once an APIService turns Available) so `/apis` lists proxied groups: [`Aggregator::discovery_groups`]
//! (legacy APIGroupList entries) and [`Aggregator::aggregated_discovery`]
//! (apidiscovery.k8s.io/v2 APIGroupDiscovery entries).

use crate::types::UserInfo;
use base64::Engine;
use bytes::Bytes;
use crproxy_core::locks;
use crproxy_core::pki::CertPem;
use http::{header, HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::{BoxBody as HttpBoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// Errors crossing the module boundary.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Response bodies produced by the proxy (streamed, not buffered).
pub type BoxBody = HttpBoxBody<Bytes, BoxError>;

/// The front-proxy client identity kube-apiserver presents to extension servers.
pub const FRONT_PROXY_CLIENT_NAME: &str = "front-proxy-client";
/// How often availability is re-checked without a store change.
pub const AVAILABILITY_INTERVAL: Duration = Duration::from_secs(30);
/// How often backend discovery is re-fetched without a store change.
pub const DISCOVERY_INTERVAL: Duration = Duration::from_secs(60);
/// Limit of the TLS handshake with a backend.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Availability probes sent at once per check (kube's number).
pub const DISCOVERY_ATTEMPTS: usize = 5;
/// Time limit of one availability or discovery request.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// The Accept header of the aggregated-discovery fetch (v2, then v2beta1).
pub const AGGREGATED_DISCOVERY_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

/// Why the aggregator could not be built or a backend not be reached.
#[derive(Debug, thiserror::Error)]
pub enum AggregationError {
    /// The front-proxy client certificate or key PEM is unusable; regenerate
    /// `DATA/pki/front-proxy-client.{crt,key}`.
    #[error("front-proxy client certificate: {0}")]
    ClientCertificate(String),
    /// The APIService names a Service that does not exist, has no matching port or
    /// no ready endpoint.
    #[error("{0}")]
    Resolve(String),
    /// TLS settings of the APIService are unusable (bad caBundle).
    #[error("{0}")]
    Tls(String),
    /// Dialing, the TLS handshake or the HTTP exchange failed.
    #[error("{0}")]
    Transport(String),
}

/// Put in the extensions of every answer [`Aggregator::proxy`] relays from a
/// backend (not of the errors it answers itself), so that the server in front
/// can treat the backend's headers as kube's proxy does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relayed {
    /// The answer to an ordinary request.
    Answer,
    /// The answer to an upgrade request (`101 Switching Protocols`, or the
    /// backend's error answer: 400 and above).
    Upgrade,
}

/// The cluster state the aggregator reads and the status it writes, implemented by
/// the server over its store.
pub trait ClusterView: Send + Sync + 'static {
    /// All APIService objects (apiregistration.k8s.io/v1 JSON).
    fn apiservices(&self) -> Vec<Value>;
    /// One Service.
    fn service(&self, ns: &str, name: &str) -> Option<Value>;
    /// The EndpointSlices labelled `kubernetes.io/service-name=<service>` in `ns`.
    fn endpoint_slices(&self, ns: &str, service: &str) -> Vec<Value>;
    /// Replaces the status of the named APIService.
    fn set_apiservice_status(&self, name: &str, status: Value);
    /// Fires when APIServices, Services or EndpointSlices may have changed.
    fn changed(&self) -> tokio::sync::broadcast::Receiver<()>;
}

/// An APIService that forwards to a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The APIService name (`v1.example.com`).
    pub apiservice: String,
    pub group: String,
    pub version: String,
}

/// Where and how to reach a backend.
#[derive(Clone, Debug)]
struct Target {
    /// Host for the URL and the `Host` header (external name or endpoint address).
    host: String,
    port: u16,
    /// `<service>.<namespace>.svc`, checked against the serving certificate.
    server_name: String,
    ca_bundle: Vec<u8>,
    insecure: bool,
}

impl Target {
    fn url(&self, path: &str) -> String {
        format!("https://{}{}", self.authority(), path)
    }

    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Discovery fetched from one APIService's backend.
#[derive(Clone, Debug)]
struct FetchedDiscovery {
    /// APIGroupDiscovery version entry (`{version, resources, freshness}`).
    version_entry: Value,
    /// The APIService spec it was fetched for (a changed spec means refetch).
    spec: Value,
    /// False once a refetch failed: the entry is served as Stale.
    current: bool,
}

/// Forwards aggregated API requests and maintains APIService status.
pub struct Aggregator {
    view: Arc<dyn ClusterView>,
    client_chain: Vec<CertificateDer<'static>>,
    client_key: PrivateKeyDer<'static>,
    provider: Arc<rustls::crypto::CryptoProvider>,
    discovery: Mutex<HashMap<String, FetchedDiscovery>>,
    /// The kept HTTP/2 connection of each backend (see [`Aggregator::send_pooled`]).
    backends: Mutex<HashMap<BackendKey, http2::SendRequest<RequestBody>>>,
}

/// What a kept backend connection was made for: the same address reached with the
/// same TLS checks. A changed `caBundle` or server name gets a new connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct BackendKey {
    authority: String,
    server_name: String,
    ca_bundle: Vec<u8>,
    insecure: bool,
}

impl BackendKey {
    fn of(target: &Target) -> Self {
        BackendKey {
            authority: target.authority(),
            server_name: target.server_name.clone(),
            ca_bundle: target.ca_bundle.clone(),
            insecure: target.insecure,
        }
    }
}

impl Aggregator {
    /// Builds the aggregator; `front_proxy_client` is the client certificate (CN
    /// `front-proxy-client`) issued by the front-proxy CA.
    pub fn new(
        view: Arc<dyn ClusterView>,
        front_proxy_client: CertPem,
    ) -> Result<Arc<Self>, AggregationError> {
        let client_chain = CertificateDer::pem_slice_iter(front_proxy_client.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| AggregationError::ClientCertificate(e.to_string()))?;
        if client_chain.is_empty() {
            return Err(AggregationError::ClientCertificate(
                "no certificate in the PEM".into(),
            ));
        }
        let client_key = PrivateKeyDer::from_pem_slice(front_proxy_client.key.as_bytes())
            .map_err(|e| AggregationError::ClientCertificate(e.to_string()))?;
        Ok(Arc::new(Self {
            view,
            client_chain,
            client_key,
            provider: Arc::new(crproxy_kube::crypto_provider()),
            discovery: Mutex::new(HashMap::new()),
            backends: Mutex::new(HashMap::new()),
        }))
    }

    /// Starts the availability and discovery controllers. They run until the handle
    /// is aborted.
    pub fn spawn_controllers(self: &Arc<Self>) -> JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut changed = this.view.changed();
            let mut availability = tokio::time::interval(AVAILABILITY_INTERVAL);
            let mut discovery = tokio::time::interval(DISCOVERY_INTERVAL);
            let mut retries = RetryBackoff::default();
            loop {
                let retry = retries.next_retry();
                tokio::select! {
                    _ = availability.tick() => {}
                    _ = sleep_until_some(retry) => {}
                    _ = discovery.tick() => {
                        this.refresh_discovery().await;
                        continue;
                    }
                    event = changed.recv() => {
                        if let Err(tokio::sync::broadcast::error::RecvError::Closed) = event {
                            // The store is gone: keep the periodic checks only.
                            changed = this.view.changed();
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue;
                        }
                        // Coalesce bursts of store events into one pass.
                        while changed.try_recv().is_ok() {}
                    }
                }
                let failing = this.availability_pass().await;
                retries.record(failing);
                // An APIService that just turned Available has no current discovery
                // yet: kube's discovery manager reacts to that status change too.
                this.refresh_changed_discovery().await;
            }
        })
    }

    fn apiservice(&self, name: &str) -> Option<Value> {
        self.view
            .apiservices()
            .into_iter()
            .find(|a| a["metadata"]["name"] == name)
    }

    /// Does the path belong to an APIService served by a backend?
    pub fn route(&self, path: &str) -> Option<Route> {
        let mut parts = path.trim_start_matches('/').split('/');
        if parts.next() != Some("apis") {
            return None;
        }
        let group = parts.next().filter(|g| !g.is_empty())?;
        let version = parts.next().filter(|v| !v.is_empty())?;
        self.view.apiservices().into_iter().find_map(|a| {
            let spec = &a["spec"];
            (spec["group"] == group && spec["version"] == version && spec["service"].is_object())
                .then(|| Route {
                    apiservice: a["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    group: group.to_string(),
                    version: version.to_string(),
                })
        })
    }

    /// Forwards one request (see the module docs for what is sent). Never fails:
    /// problems become kube's error responses (503 `service unavailable` while the
    /// APIService is not Available or cannot be reached).
    pub async fn proxy<B>(
        &self,
        route: Route,
        mut req: Request<B>,
        user: &UserInfo,
    ) -> Response<BoxBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let Some(apiservice) = self.apiservice(&route.apiservice) else {
            return text_response(StatusCode::NOT_FOUND, "404 page not found\n");
        };
        if !is_available(&apiservice) {
            return service_unavailable();
        }
        let target = match self.resolve(&apiservice) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(apiservice = %route.apiservice, error = %e, "cannot resolve aggregated API backend");
                return service_unavailable();
            }
        };
        let upgrade = is_upgrade(req.headers());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (parts, body) = req.into_parts();
        let peer = parts.extensions.get::<SocketAddr>().copied();
        let path_and_query = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        let mut headers = parts.headers.clone();
        let original_host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(String::from)
            .or_else(|| parts.uri.authority().map(|a| a.to_string()))
            .unwrap_or_default();
        strip_request_headers(&mut headers, upgrade);
        set_identity_headers(&mut headers, user);
        set_forwarding_headers(&mut headers, peer, &original_host, parts.uri.path());
        // The server's filters always set one (`Exchange::begin`); a direct
        // caller such as the namespace controller's cleanup may not, and gets
        // one made the same way.
        if !headers.contains_key("audit-id") {
            headers.insert("audit-id", crate::server::new_uuid());
        }
        if let Ok(v) = HeaderValue::from_str(&target.authority()) {
            headers.insert(header::HOST, v);
        }
        let mut out = match Request::builder()
            .method(parts.method.clone())
            .uri(path_and_query)
            .body(body.map_err(Into::into).boxed_unsync())
        {
            Ok(r) => r,
            Err(e) => return proxy_error(&e.to_string()),
        };
        *out.headers_mut() = headers;

        let sent = if upgrade {
            match self.connect(&target, true).await {
                Ok(mut sender) => sender.send(out).await.map_err(SendError::Http),
                Err(e) => Err(SendError::Connect(e)),
            }
        } else {
            self.send_pooled(&target, out).await
        };
        let mut resp = match sent {
            Ok(r) => r,
            Err(SendError::Connect(e)) => {
                tracing::warn!(apiservice = %route.apiservice, error = %e, "aggregated API backend unreachable");
                return proxy_error(&e.to_string());
            }
            Err(SendError::Http(e)) => {
                return proxy_error(&format!("error trying to reach service: {e}"))
            }
        };
        // kube's UpgradeAwareHandler.tryUpgrade (k8s.io/apimachinery
        // `util/proxy/upgradeaware.go`): a backend that answers an upgrade with
        // neither 101 nor an error (a status below 400) failed the upgrade, and
        // the aggregator's responder says so with `http.Error` and 503; an
        // error answer goes to the caller as the backend sent it.
        match resp.status() {
            StatusCode::SWITCHING_PROTOCOLS if upgrade => {
                let backend_upgrade = hyper::upgrade::on(&mut resp);
                if let Some(client_upgrade) = client_upgrade {
                    tokio::spawn(async move {
                        let (Ok(client), Ok(backend)) =
                            (client_upgrade.await, backend_upgrade.await)
                        else {
                            return;
                        };
                        let mut client = TokioIo::new(client);
                        let mut backend = TokioIo::new(backend);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut backend).await;
                    });
                }
            }
            status if upgrade && status.as_u16() < 400 => {
                return proxy_error(&format!(
                    "invalid upgrade response: status code {}",
                    status.as_u16()
                ));
            }
            _ => strip_hop_by_hop(resp.headers_mut(), false),
        }
        resp.extensions_mut().insert(if upgrade {
            Relayed::Upgrade
        } else {
            Relayed::Answer
        });
        resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed())
    }

    /// Resolves an APIService's backend as kube's default (service) routing does,
    /// except that ClusterIP Services go to a ready endpoint directly (devcluster has
    /// no cluster network).
    fn resolve(&self, apiservice: &Value) -> Result<Target, AggregationError> {
        let spec = &apiservice["spec"];
        let svc_ref = &spec["service"];
        let ns = svc_ref["namespace"].as_str().unwrap_or_default();
        let name = svc_ref["name"].as_str().unwrap_or_default();
        let port = svc_ref["port"].as_u64().unwrap_or(443);
        let ca_bundle = spec["caBundle"]
            .as_str()
            .map(|b| base64::engine::general_purpose::STANDARD.decode(b))
            .transpose()
            .map_err(|e| AggregationError::Tls(format!("caBundle is not base64: {e}")))?
            .unwrap_or_default();
        let insecure = spec["insecureSkipTLSVerify"].as_bool().unwrap_or(false);
        let server_name = format!("{name}.{ns}.svc");
        let service = self.view.service(ns, name).ok_or_else(|| {
            AggregationError::Resolve(format!("service/{name} in {ns:?} is not present"))
        })?;
        let port_u16 = |p: u64| {
            u16::try_from(p).map_err(|_| AggregationError::Resolve(format!("invalid port {p}")))
        };
        let (host, endpoint_port) = self.service_address_of(ns, name, &service, port_u16(port)?)?;
        Ok(Target {
            host,
            port: endpoint_port,
            server_name,
            ca_bundle,
            insecure,
        })
    }

    /// Where a Service's `port` is reached: the external name of an ExternalName
    /// Service, else a ready endpoint (also used to reach admission webhooks).
    pub fn service_address(
        &self,
        ns: &str,
        name: &str,
        port: u16,
    ) -> Result<(String, u16), AggregationError> {
        let service = self
            .view
            .service(ns, name)
            .ok_or_else(|| AggregationError::Resolve(format!("service \"{name}\" not found")))?;
        self.service_address_of(ns, name, &service, port)
    }

    fn service_address_of(
        &self,
        ns: &str,
        name: &str,
        service: &Value,
        port: u16,
    ) -> Result<(String, u16), AggregationError> {
        if service["spec"]["type"] == "ExternalName" {
            let host = service["spec"]["externalName"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            return Ok((host, port));
        }
        self.ready_endpoint(ns, name, service, u64::from(port))
    }

    /// A ready address and port from the Service's EndpointSlices.
    fn ready_endpoint(
        &self,
        ns: &str,
        name: &str,
        service: &Value,
        port: u64,
    ) -> Result<(String, u16), AggregationError> {
        let service_port = service["spec"]["ports"]
            .as_array()
            .and_then(|ports| ports.iter().find(|p| p["port"].as_u64() == Some(port)))
            .ok_or_else(|| {
                AggregationError::Resolve(format!(
                    "service/{name} in {ns:?} is not listening on port {port}"
                ))
            })?;
        let port_name = service_port["name"].as_str().unwrap_or_default();
        let slices = self.view.endpoint_slices(ns, name);
        if slices.is_empty() {
            return Err(AggregationError::Resolve(format!(
                "cannot find endpoints for service/{name} in {ns:?}"
            )));
        }
        for slice in &slices {
            let Some(slice_port) = slice["ports"].as_array().and_then(|ports| {
                ports
                    .iter()
                    .find(|p| p["name"].as_str().unwrap_or_default() == port_name)
                    .and_then(|p| p["port"].as_u64())
                    .and_then(|p| u16::try_from(p).ok())
            }) else {
                continue;
            };
            for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
                // A missing `ready` means ready, as in the EndpointSlice API.
                if endpoint["conditions"]["ready"] == false {
                    continue;
                }
                if let Some(address) = endpoint["addresses"][0].as_str() {
                    return Ok((address.to_string(), slice_port));
                }
            }
        }
        Err(AggregationError::Resolve(format!(
            "endpoints for service/{name} in {ns:?} have no addresses with port name {port_name:?}"
        )))
    }

    fn tls_config(
        &self,
        target: &Target,
        http1_only: bool,
    ) -> Result<Arc<rustls::ClientConfig>, AggregationError> {
        let builder = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| AggregationError::Tls(e.to_string()))?;
        let builder = if target.insecure {
            builder
                .dangerous()
                // insecureSkipTLSVerify: the one verifier the project has for that.
                .with_custom_certificate_verifier(Arc::new(
                    crproxy_kube::InsecureAcceptAnyServerCert::new(self.provider.clone()),
                ))
        } else {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&target.ca_bundle) {
                let cert = cert.map_err(|e| AggregationError::Tls(format!("caBundle: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| AggregationError::Tls(format!("caBundle: {e}")))?;
            }
            builder.with_root_certificates(roots)
        };
        let mut config = builder
            .with_client_auth_cert(self.client_chain.clone(), self.client_key.clone_key())
            .map_err(|e| AggregationError::Tls(e.to_string()))?;
        // Like Go's transport: HTTP/2 when the backend offers it, HTTP/1.1 otherwise,
        // and HTTP/1.1 only for upgrades (which HTTP/2 cannot carry).
        config.alpn_protocols = if http1_only {
            vec![b"http/1.1".to_vec()]
        } else {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        };
        Ok(Arc::new(config))
    }

    /// Sends `req` on the backend's kept HTTP/2 connection, or on a new connection
    /// that is kept if it speaks HTTP/2. A kept connection that could not take the
    /// request (closed since its last use) is replaced, and the request, which it
    /// never sent, goes on the new one, as Go's transport retries a request it had not
    /// written.
    async fn send_pooled(
        &self,
        target: &Target,
        req: Request<RequestBody>,
    ) -> Result<Response<hyper::body::Incoming>, SendError> {
        let key = BackendKey::of(target);
        let kept = locks::lock(&self.backends)
            .get(&key)
            .filter(|sender| !sender.is_closed())
            .cloned();
        let req = match kept {
            Some(mut sender) => {
                match sender
                    .try_send_request(for_http2(req, &key.authority))
                    .await
                {
                    Ok(resp) => return Ok(resp),
                    Err(mut e) => match e.take_message() {
                        Some(unsent) => unsent,
                        None => return Err(SendError::Http(e.into_error())),
                    },
                }
            }
            None => req,
        };
        let mut sender = self
            .connect(target, false)
            .await
            .map_err(SendError::Connect)?;
        if let Sender::Http2(kept, _) = &sender {
            locks::lock(&self.backends).insert(key, kept.clone());
        }
        sender.send(req).await.map_err(SendError::Http)
    }

    /// Dials the backend and performs the TLS and HTTP handshakes.
    async fn connect(&self, target: &Target, http1_only: bool) -> Result<Sender, AggregationError> {
        let config = self.tls_config(target, http1_only)?;
        let authority = target.authority();
        let tcp = match tokio::time::timeout(CHECK_TIMEOUT, TcpStream::connect(&authority)).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(e)) => return Err(AggregationError::Transport(dial_error(&authority, &e))),
            Err(_) => {
                return Err(AggregationError::Transport(format!(
                    "dial tcp {authority}: i/o timeout"
                )))
            }
        };
        // As Go's dialer does for kube-apiserver: without it, Nagle's algorithm
        // holds a request's second small write until the backend's delayed ACK
        // (~40 ms), a stall a real aggregator never adds.
        let _ = tcp.set_nodelay(true);
        let server_name = ServerName::try_from(target.server_name.clone()).map_err(|e| {
            AggregationError::Tls(format!("server name {}: {e}", target.server_name))
        })?;
        // A backend that accepts TCP but never completes TLS must not hold the
        // request forever (Go's TLS handshake timeout is 10 s).
        let handshake = tokio_rustls::TlsConnector::from(config).connect(server_name, tcp);
        let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => return Err(AggregationError::Transport(format!("tls: {e}"))),
            Err(_) => {
                return Err(AggregationError::Transport(
                    "net/http: TLS handshake timeout".into(),
                ))
            }
        };
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        if h2 {
            let (sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                    .await
                    .map_err(|e| AggregationError::Transport(e.to_string()))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "aggregated API backend connection ended");
                }
            });
            return Ok(Sender::Http2(sender, target.authority()));
        }
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| AggregationError::Transport(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "aggregated API backend connection ended");
            }
        });
        Ok(Sender::Http1(sender))
    }

    /// One GET the aggregator makes on its own behalf, with a 5 s limit.
    async fn own_get(
        &self,
        target: &Target,
        path: &str,
        groups: &[&str],
        user: &str,
        accept: Option<&str>,
    ) -> Result<(StatusCode, HeaderMap, Bytes), AggregationError> {
        let url = target.url(path);
        let exchange = async {
            let mut sender = self.connect(target, false).await?;
            let mut req = Request::builder()
                .method("GET")
                .uri(path)
                .header(header::HOST, target.authority())
                .header("x-remote-user", user);
            for g in groups {
                req = req.header("x-remote-group", *g);
            }
            if let Some(accept) = accept {
                req = req.header(header::ACCEPT, accept);
            }
            let req = req
                .body(Empty::<Bytes>::new().map_err(|e| match e {}).boxed_unsync())
                .map_err(|e| AggregationError::Transport(e.to_string()))?;
            let resp = sender
                .send(req)
                .await
                .map_err(|e| AggregationError::Transport(e.to_string()))?;
            let (parts, body) = resp.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| AggregationError::Transport(e.to_string()))?
                .to_bytes();
            Ok::<_, AggregationError>((parts.status, parts.headers, body))
        };
        match tokio::time::timeout(CHECK_TIMEOUT, exchange).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(AggregationError::Transport(format!("Get {url:?}: {e}"))),
            Err(_) => Err(AggregationError::Transport(format!(
                "Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
            ))),
        }
    }

    /// One pass of the availability controller over every APIService.
    pub async fn check_availability(&self) {
        self.availability_pass().await;
    }

    /// [`Aggregator::check_availability`], returning the APIServices whose
    /// backend failed its discovery check (those kube's work queue retries).
    async fn availability_pass(&self) -> Vec<String> {
        let apiservices = self.view.apiservices();
        // Concurrently: one silent backend must not delay the others by its timeout.
        let results =
            futures_util::future::join_all(apiservices.iter().map(|a| self.availability_of(a)))
                .await;
        let failing = apiservices
            .iter()
            .zip(&results)
            .filter(|(_, (available, reason, _))| !available && reason == "FailedDiscoveryCheck")
            .map(|(a, _)| {
                a["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        for (apiservice, (available, reason, message)) in apiservices.into_iter().zip(results) {
            let name = apiservice["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let old = apiservice["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Available"))
                .cloned();
            let status_text = if available { "True" } else { "False" };
            let unchanged = old.as_ref().is_some_and(|c| {
                c["status"] == status_text && c["reason"] == reason && c["message"] == message
            });
            if unchanged {
                // Writing an identical status would wake every watcher for nothing.
                continue;
            }
            let transition = match &old {
                Some(c) if c["status"] == status_text => c["lastTransitionTime"].clone(),
                _ => json!(chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()),
            };
            let condition = json!({
                "type": "Available",
                "status": status_text,
                "lastTransitionTime": transition,
                "reason": reason,
                "message": message,
            });
            let mut conditions: Vec<Value> = apiservice["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|c| c["type"] != "Available")
                .collect();
            conditions.push(condition);
            self.view
                .set_apiservice_status(&name, json!({"conditions": conditions}));
        }
        failing
    }

    async fn availability_of(&self, apiservice: &Value) -> (bool, String, String) {
        let spec = &apiservice["spec"];
        let svc_ref = &spec["service"];
        if !svc_ref.is_object() {
            return (
                true,
                "Local".into(),
                "Local APIServices are always available".into(),
            );
        }
        let ns = svc_ref["namespace"].as_str().unwrap_or_default();
        let name = svc_ref["name"].as_str().unwrap_or_default();
        let Some(service) = self.view.service(ns, name) else {
            return (
                false,
                "ServiceNotFound".into(),
                format!("service/{name} in {ns:?} is not present"),
            );
        };
        let target = match self.resolve(apiservice) {
            Ok(t) => t,
            Err(e) => {
                let message = e.to_string();
                let reason = if message.contains("is not listening on port") {
                    "ServicePortError"
                } else if message.starts_with("cannot find endpoints") {
                    "EndpointsNotFound"
                } else if service["spec"]["type"] != "ExternalName"
                    && message.starts_with("endpoints for")
                {
                    "MissingEndpoints"
                } else {
                    "FailedDiscoveryCheck"
                };
                return (false, reason.into(), message);
            }
        };
        let path = format!(
            "/apis/{}/{}",
            spec["group"].as_str().unwrap_or_default(),
            spec["version"].as_str().unwrap_or_default()
        );
        let url = target.url(&path);
        // kube sends DISCOVERY_ATTEMPTS probes at once and is satisfied by any one;
        // the last failure is the one reported.
        let probes = (0..DISCOVERY_ATTEMPTS).map(|_| {
            self.own_get(
                &target,
                &path,
                &["system:masters"],
                "system:kube-aggregator",
                None,
            )
        });
        let mut last_error = String::new();
        for result in futures_util::future::join_all(probes).await {
            match result {
                Ok((status, _, _)) if status.is_success() || status.is_redirection() => {
                    return (true, "Passed".into(), "all checks passed".into());
                }
                Ok((status, _, _)) => {
                    last_error = format!("bad status from {url}: {}", status.as_u16());
                }
                Err(e) => last_error = e.to_string(),
            }
        }
        (
            false,
            "FailedDiscoveryCheck".into(),
            format!("failing or missing response from {url}: {last_error}"),
        )
    }

    /// One pass of the discovery fetcher over every Available APIService with a
    /// backend: aggregated discovery first, the legacy group-version document as the
    /// fallback.
    pub async fn refresh_discovery(&self) {
        self.refresh(false).await
    }

    /// Fetches discovery only where it is missing, stale or for a changed spec: what
    /// a store change calls for, without re-polling every backend on every write.
    pub async fn refresh_changed_discovery(&self) {
        self.refresh(true).await
    }

    async fn refresh(&self, only_needed: bool) {
        let apiservices: Vec<Value> = self
            .view
            .apiservices()
            .into_iter()
            .filter(|a| a["spec"]["service"].is_object())
            .collect();
        let previous = locks::lock(&self.discovery).clone();
        let mut fetched = HashMap::new();
        for apiservice in &apiservices {
            let name = apiservice["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let spec = &apiservice["spec"];
            let old = previous.get(&name);
            let available = is_available(apiservice);
            let needed =
                !only_needed || old.is_none_or(|o| o.spec != *spec || (available && !o.current));
            if !needed {
                if let Some(o) = old {
                    fetched.insert(name, o.clone());
                }
                continue;
            }
            let group = spec["group"].as_str().unwrap_or_default();
            let version = spec["version"].as_str().unwrap_or_default();
            let result = match self.resolve(apiservice) {
                Ok(target) if available => self.fetch_discovery(&target, group, version).await,
                _ => None,
            };
            match result {
                Some(version_entry) => {
                    fetched.insert(
                        name,
                        FetchedDiscovery {
                            version_entry,
                            spec: spec.clone(),
                            current: true,
                        },
                    );
                }
                None => {
                    // Keep what we had, marked stale, as kube does.
                    if let Some(mut entry) = old.cloned() {
                        entry.version_entry["freshness"] = json!("Stale");
                        entry.current = false;
                        fetched.insert(name, entry);
                    }
                }
            }
        }
        *locks::lock(&self.discovery) = fetched;
    }

    async fn fetch_discovery(&self, target: &Target, group: &str, version: &str) -> Option<Value> {
        // kube's OpenAPI aggregation polls these on the same period; devcluster does
        // not merge the documents but makes the same requests, so a backend sees
        // the traffic a real client cluster sends. The answers are not needed.
        let _ = self
            .own_get(
                target,
                "/openapi/v2",
                &[],
                "system:aggregator",
                Some("application/json"),
            )
            .await;
        let _ = self
            .own_get(target, "/openapi/v3", &[], "system:aggregator", None)
            .await;
        if let Ok((status, headers, body)) = self
            .own_get(
                target,
                "/apis",
                &["system:masters"],
                "system:kube-aggregator",
                Some(AGGREGATED_DISCOVERY_ACCEPT),
            )
            .await
        {
            let aggregated = headers
                .get(header::CONTENT_TYPE)
                .and_then(|c| c.to_str().ok())
                .is_some_and(|c| c.contains("as=APIGroupDiscoveryList"));
            if status.is_success() && aggregated {
                let doc: Value = serde_json::from_slice(&body).ok()?;
                let entry = doc["items"]
                    .as_array()?
                    .iter()
                    .filter(|g| g["metadata"]["name"] == group)
                    .flat_map(|g| g["versions"].as_array().cloned().unwrap_or_default())
                    .find(|v| v["version"] == version)?;
                let mut entry = entry;
                entry["freshness"] = json!("Current");
                return Some(entry);
            }
        }
        let path = format!("/apis/{group}/{version}");
        let (status, _, body) = self
            .own_get(
                target,
                &path,
                &[],
                "system:kube-aggregator",
                Some("application/json"),
            )
            .await
            .ok()?;
        if !status.is_success() {
            return None;
        }
        let list: Value = serde_json::from_slice(&body).ok()?;
        Some(version_entry_from_resource_list(&list, group, version))
    }

    /// Legacy `/apis` entries (APIGroup) for groups served by backends, versions in
    /// kube's priority order.
    pub fn discovery_groups(&self) -> Vec<Value> {
        let mut groups: BTreeMap<String, Vec<(i64, i64, String)>> = BTreeMap::new();
        for a in self.view.apiservices() {
            let spec = &a["spec"];
            if !spec["service"].is_object() {
                continue;
            }
            let group = spec["group"].as_str().unwrap_or_default().to_string();
            let version = spec["version"].as_str().unwrap_or_default().to_string();
            let group_priority = spec["groupPriorityMinimum"].as_i64().unwrap_or(0);
            let version_priority = spec["versionPriority"].as_i64().unwrap_or(0);
            groups
                .entry(group)
                .or_default()
                .push((group_priority, version_priority, version));
        }
        let mut out: Vec<(i64, String, Value)> = groups
            .into_iter()
            .map(|(group, mut versions)| {
                versions.sort_by(|a, b| {
                    b.1.cmp(&a.1)
                        .then_with(|| compare_kube_versions(&a.2, &b.2))
                });
                let priority = versions.iter().map(|v| v.0).max().unwrap_or(0);
                let entries: Vec<Value> = versions
                    .iter()
                    .map(|(_, _, v)| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
                    .collect();
                let preferred = entries.first().cloned().unwrap_or(Value::Null);
                (
                    priority,
                    group.clone(),
                    json!({"name": group, "versions": entries, "preferredVersion": preferred}),
                )
            })
            .collect();
        out.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        out.into_iter().map(|(_, _, v)| v).collect()
    }

    /// apidiscovery.k8s.io/v2 APIGroupDiscovery entries for groups served by
    /// backends whose discovery has been fetched.
    pub fn aggregated_discovery(&self) -> Vec<Value> {
        let fetched = locks::lock(&self.discovery).clone();
        let mut groups: BTreeMap<String, Vec<(i64, String, Value)>> = BTreeMap::new();
        for a in self.view.apiservices() {
            let name = a["metadata"]["name"].as_str().unwrap_or_default();
            let Some(entry) = fetched.get(name) else {
                continue;
            };
            let spec = &a["spec"];
            let group = spec["group"].as_str().unwrap_or_default().to_string();
            let version = spec["version"].as_str().unwrap_or_default().to_string();
            groups.entry(group).or_default().push((
                spec["versionPriority"].as_i64().unwrap_or(0),
                version,
                entry.version_entry.clone(),
            ));
        }
        groups
            .into_iter()
            .map(|(group, mut versions)| {
                versions.sort_by(|a, b| {
                    b.0.cmp(&a.0)
                        .then_with(|| compare_kube_versions(&a.1, &b.1))
                });
                json!({
                    "metadata": {"name": group, "creationTimestamp": null},
                    "versions": versions.into_iter().map(|(_, _, v)| v).collect::<Vec<_>>(),
                })
            })
            .collect()
    }

    /// `/apis/<group>` (APIGroup) when the group is served by backends.
    pub fn group_discovery(&self, group: &str) -> Option<Value> {
        self.discovery_groups()
            .into_iter()
            .find(|g| g["name"] == group)
            .map(|mut g| {
                if let Some(obj) = g.as_object_mut() {
                    let mut out = serde_json::Map::new();
                    out.insert("kind".into(), json!("APIGroup"));
                    out.insert("apiVersion".into(), json!("v1"));
                    out.extend(std::mem::take(obj));
                    return Value::Object(out);
                }
                g
            })
    }
}

/// Request bodies sent to backends.
type RequestBody = UnsyncBoxBody<Bytes, BoxError>;

/// One backend connection, HTTP/1.1 or HTTP/2 as ALPN decided.
enum Sender {
    Http1(hyper::client::conn::http1::SendRequest<RequestBody>),
    /// With the `host:port` the requests' URIs must carry.
    Http2(hyper::client::conn::http2::SendRequest<RequestBody>, String),
}

impl Sender {
    async fn send(
        &mut self,
        req: Request<RequestBody>,
    ) -> Result<Response<hyper::body::Incoming>, hyper::Error> {
        match self {
            Sender::Http1(s) => s.send_request(req).await,
            Sender::Http2(s, authority) => s.send_request(for_http2(req, authority)).await,
        }
    }
}

/// Why a proxied request got no answer from its backend.
enum SendError {
    /// No connection: dialing or a handshake failed.
    Connect(AggregationError),
    /// The connection failed the exchange.
    Http(hyper::Error),
}

/// `req` as an HTTP/2 request to `authority`: HTTP/2 names the target in
/// `:scheme`/`:authority`, not in `Host`.
fn for_http2(mut req: Request<RequestBody>, authority: &str) -> Request<RequestBody> {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    if let Ok(uri) = format!("https://{authority}{path}").parse() {
        *req.uri_mut() = uri;
    }
    req.headers_mut().remove(header::HOST);
    *req.version_mut() = http::Version::HTTP_2;
    req
}

/// APIResourceList (legacy discovery) → APIVersionDiscovery.
fn version_entry_from_resource_list(list: &Value, group: &str, version: &str) -> Value {
    let resources = list["resources"].as_array().cloned().unwrap_or_default();
    let mut top: Vec<Value> = Vec::new();
    let mut subresources: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for r in &resources {
        let name = r["name"].as_str().unwrap_or_default();
        let kind_of = |r: &Value| {
            json!({
                "group": r["group"].as_str().unwrap_or(group),
                "version": r["version"].as_str().unwrap_or(version),
                "kind": r["kind"],
            })
        };
        if let Some((parent, sub)) = name.split_once('/') {
            subresources
                .entry(parent.to_string())
                .or_default()
                .push(json!({
                    "subresource": sub,
                    "responseKind": kind_of(r),
                    "verbs": r["verbs"],
                }));
            continue;
        }
        let mut entry = json!({
            "resource": name,
            "responseKind": kind_of(r),
            "scope": if r["namespaced"] == true { "Namespaced" } else { "Cluster" },
            "singularResource": r["singularName"],
            "verbs": r["verbs"],
        });
        for key in ["shortNames", "categories"] {
            if r[key].is_array() {
                entry[key] = r[key].clone();
            }
        }
        top.push(entry);
    }
    for entry in &mut top {
        let name = entry["resource"].as_str().unwrap_or_default().to_string();
        if let Some(subs) = subresources.remove(&name) {
            entry["subresources"] = json!(subs);
        }
    }
    json!({"version": version, "resources": top, "freshness": "Current"})
}

/// kube's version ordering: GA > beta > alpha > other; higher numbers first.
/// Returns Less when `a` sorts first.
fn compare_kube_versions(a: &str, b: &str) -> std::cmp::Ordering {
    fn key(v: &str) -> (u8, i64, i64, String) {
        let parse = || -> Option<(u8, i64, i64)> {
            let rest = v.strip_prefix('v')?;
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let major: i64 = digits.parse().ok()?;
            let tail = &rest[digits.len()..];
            if tail.is_empty() {
                return Some((0, -major, 0));
            }
            for (prefix, rank) in [("beta", 1u8), ("alpha", 2u8)] {
                if let Some(n) = tail.strip_prefix(prefix) {
                    let minor: i64 = n.parse().ok()?;
                    return Some((rank, -major, -minor));
                }
            }
            None
        };
        match parse() {
            Some((rank, major, minor)) => (rank, major, minor, String::new()),
            None => (3, 0, 0, v.to_string()),
        }
    }
    key(a).cmp(&key(b))
}

/// When to re-check availability after failed discovery checks. kube's
/// availability controller returns the failure to its work queue, which retries
/// the APIService after a per-item delay doubling from 5 ms; without that a
/// backend that was down at the first check (a restarted proxy whose APIService
/// survived in the store) would wait for the 30 s resync. Passes check every
/// APIService, so the next retry is due for the one with the fewest failures.
#[derive(Debug, Default)]
struct RetryBackoff {
    failures: HashMap<String, u32>,
    next: Option<tokio::time::Instant>,
}

impl RetryBackoff {
    const BASE: Duration = Duration::from_millis(5);

    fn record(&mut self, failing: Vec<String>) {
        let mut failures = HashMap::new();
        for name in failing {
            let count = self.failures.get(&name).copied().unwrap_or(0) + 1;
            failures.insert(name, count);
        }
        self.failures = failures;
        self.next = self.failures.values().min().map(|&count| {
            // Beyond the resync interval the periodic pass retries anyway.
            let delay = Self::BASE
                .saturating_mul(1 << count.saturating_sub(1).min(20))
                .min(AVAILABILITY_INTERVAL);
            tokio::time::Instant::now() + delay
        });
    }

    fn next_retry(&self) -> Option<tokio::time::Instant> {
        self.next
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn is_available(apiservice: &Value) -> bool {
    apiservice["status"]["conditions"]
        .as_array()
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Available" && c["status"] == "True")
        })
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Headers named by Connection are hop-by-hop too.
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|t| t.trim().to_ascii_lowercase()))
        .filter(|t| !t.is_empty() && t != "upgrade")
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in [
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
    ] {
        headers.remove(name);
    }
    if !keep_upgrade {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
}

/// Drops what must not reach the backend: the caller's credentials, impersonation
/// requests and any identity headers the caller tried to set itself.
fn strip_request_headers(headers: &mut HeaderMap, upgrade: bool) {
    strip_hop_by_hop(headers, upgrade);
    headers.remove(header::AUTHORIZATION);
    let drop: Vec<HeaderName> = headers
        .keys()
        .filter(|k| {
            let k = k.as_str();
            k.starts_with("impersonate-") || k.starts_with("x-remote-")
        })
        .cloned()
        .collect();
    for k in drop {
        headers.remove(k);
    }
}

fn set_identity_headers(headers: &mut HeaderMap, user: &UserInfo) {
    let mut add = |name: &str, value: &str| {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(n, v);
        }
    };
    add("x-remote-user", &user.name);
    if !user.uid.is_empty() {
        add("x-remote-uid", &user.uid);
    }
    for g in &user.groups {
        add("x-remote-group", g);
    }
    for (key, values) in &user.extra {
        let name = format!("x-remote-extra-{}", escape_extra_key(key));
        for v in values {
            add(&name, v);
        }
    }
}

/// kube's header key escaping: every byte that is not a header token character (and
/// `%` itself) becomes `%xx` in lower-case hex.
pub fn escape_extra_key(key: &str) -> String {
    let mut out = String::new();
    for b in key.bytes() {
        let legal = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'!' | b'#'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        if legal {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

fn set_forwarding_headers(
    headers: &mut HeaderMap,
    peer: Option<SocketAddr>,
    host: &str,
    path: &str,
) {
    let forwarded_for = match (
        headers
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
            .map(String::from),
        peer,
    ) {
        (Some(prior), Some(p)) => Some(format!("{prior}, {}", p.ip())),
        (Some(prior), None) => Some(prior),
        (None, Some(p)) => Some(p.ip().to_string()),
        (None, None) => None,
    };
    let mut set = |name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(name, v);
        }
    };
    if let Some(ff) = forwarded_for {
        set("x-forwarded-for", &ff);
    }
    if !host.is_empty() {
        set("x-forwarded-host", host);
    }
    set("x-forwarded-proto", "https");
    set("x-forwarded-uri", path);
}

/// Go's `net.Dial` wording, which the FailedDiscoveryCheck message carries.
pub(crate) fn dial_error(authority: &str, e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => {
            format!("dial tcp {authority}: connect: connection refused")
        }
        _ => format!("dial tcp {authority}: {e}"),
    }
}

fn text_response(status: StatusCode, text: &str) -> Response<BoxBody> {
    let mut resp = Response::new(
        Full::new(Bytes::from(text.to_string()))
            .map_err(|e| match e {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    crate::server::nosniff(resp)
}

/// kube-aggregator's answer while an APIService is not Available: Go's `http.Error`
/// with `service unavailable`.
pub fn service_unavailable() -> Response<BoxBody> {
    text_response(StatusCode::SERVICE_UNAVAILABLE, "service unavailable\n")
}

/// A failed exchange with a reachable-looking backend (kube's proxy responder
/// answers 503 with the error text).
fn proxy_error(message: &str) -> Response<BoxBody> {
    text_response(StatusCode::SERVICE_UNAVAILABLE, &format!("{message}\n"))
}

/// `kube-system/extension-apiserver-authentication`, as kube-apiserver publishes it
/// for extension API servers: the client CA, and the front-proxy CA with the header
/// names it must trust.
pub fn extension_apiserver_authentication_configmap(
    front_proxy_ca_pem: &str,
    client_ca_pem: &str,
) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "extension-apiserver-authentication",
            "namespace": "kube-system",
        },
        "data": {
            "client-ca-file": client_ca_pem,
            "requestheader-allowed-names": format!("[\"{FRONT_PROXY_CLIENT_NAME}\"]"),
            "requestheader-client-ca-file": front_proxy_ca_pem,
            "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
            "requestheader-group-headers": "[\"X-Remote-Group\"]",
            "requestheader-username-headers": "[\"X-Remote-User\"]",
        },
    })
}

#[cfg(test)]
#[path = "aggregation/tests.rs"]
mod tests;
