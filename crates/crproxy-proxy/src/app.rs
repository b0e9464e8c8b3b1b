//! Assembling a running proxy from a validated plan: one pool, one server and one
//! startup probe per group/version; one peer source per target feeding the pools of
//! every group/version routed to it; one metrics listener.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crproxy_core::config::GroupVersionPlan;
use crproxy_core::names;
use crproxy_core::ownership::Owner;

use crate::dial::Dialer;
use crate::frontproxy::{self, FrontProxyTrust};
use crate::handler::GroupVersionProxy;
use crate::health::Readiness;
use crate::metrics::Metrics;
use crate::namespaces::ClientNamespaces;
use crate::pool::PeerPool;
use crate::server::{self, ServerError, ServingIdentity};
use crate::sources::{self, PeerSourceConfig};
use crate::transport::{self, TargetConnection, TargetPath};

/// How long the startup probe waits for the first peer list.
pub const STARTUP_SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// The proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// A listener could not be opened.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// A group/version names a target that has no connection settings.
    #[error("group/version {group_version} is routed to target {target:?}, which has no entry under targets")]
    UnknownTarget {
        group_version: String,
        target: String,
    },
    /// The target's TLS or credential settings are unusable.
    #[error("target {target:?}: {message}")]
    Target { target: String, message: String },
}

/// How to reach one target cluster.
pub struct TargetSetup {
    pub name: String,
    pub project: String,
    /// The client's identity on the target: TLS, and the credential provider all
    /// its group versions share (a rotated file is read and a plugin run once).
    pub access: crproxy_kube::ClusterAccess,
    pub peers: PeerSourceConfig,
}

/// Everything a proxy process needs.
pub struct ProxySetup {
    pub owner: Owner,
    /// Validated group/version plans, in port order.
    pub plan: Vec<GroupVersionPlan>,
    pub bind: IpAddr,
    pub metrics_addr: SocketAddr,
    /// The client cluster, for the namespace checks of requests: a kube-rs client
    /// without retries (`crproxy_kube::kube_client_without_retries`).
    pub client: kube::Client,
    /// The client cluster, for the watches of the front-proxy trust and of
    /// namespaces.
    pub client_watches: crate::watches::WatchClient,
    pub targets: Vec<TargetSetup>,
    pub serving: ServingIdentity,
    /// Shared by every proxy in the process (several clients in `crproxy dev`).
    pub metrics: Arc<Metrics>,
    /// Let other replicas on this host listen on the same proxy ports.
    pub share_ports: bool,
    /// How long the startup probe waits for the first peer list
    /// ([`STARTUP_SYNC_TIMEOUT`] in production).
    pub startup_sync_timeout: Duration,
}

/// A started proxy.
pub struct RunningProxy {
    /// `group/version` → listening address, in port order.
    pub servers: Vec<(String, SocketAddr)>,
    pub metrics_addr: Option<SocketAddr>,
    pub pools: Vec<Arc<PeerPool>>,
    proxies: Vec<Arc<GroupVersionProxy>>,
    shutdown: watch::Sender<bool>,
    servers_done: Vec<JoinHandle<()>>,
    background: Vec<JoinHandle<()>>,
}

impl RunningProxy {
    /// How many namespaces the servers believe the target has, summed over the
    /// servers (each mirrors namespaces on its own): the size of the caches that
    /// spare a write the namespace GET. Only namespaces that exist on the client get
    /// in, so a caller cannot grow it.
    pub fn known_target_namespaces(&self) -> usize {
        self.proxies
            .iter()
            .map(|proxy| proxy.known_target_namespaces())
            .sum()
    }

    /// Stops accepting, lets in-flight requests finish within the grace period,
    /// then stops the background tasks.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for handle in self.servers_done {
            let _ = handle.await;
        }
        for handle in self.background {
            handle.abort();
        }
    }
}

/// Starts every group/version server of `setup`. When `serve_metrics` is false the
/// caller serves `setup.metrics` itself (several proxies in one process).
pub async fn start(setup: ProxySetup, serve_metrics: bool) -> Result<RunningProxy, AppError> {
    let (shutdown, shutdown_rx) = watch::channel(false);
    let trust = FrontProxyTrust::new();
    let loaded = match frontproxy::load_trust(setup.client_watches.client(), &trust).await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(%error, "front-proxy trust not loaded yet; callers get 401 until it is");
            false
        }
    };
    let mut background = vec![frontproxy::spawn_trust_watch(
        setup.client_watches.clone(),
        Arc::clone(&trust),
        loaded,
    )];
    let tls = server::proxy_tls_config(&setup.serving, &trust)?;
    let client_namespaces = ClientNamespaces::new();
    background.push(client_namespaces.spawn_sync(setup.client_watches.clone()));

    let mut servers = Vec::new();
    let mut servers_done = Vec::new();
    let mut pools = Vec::new();
    let mut proxies = Vec::new();
    let mut pools_by_target: Vec<(usize, Arc<PeerPool>)> = Vec::new();
    let mut readiness_pools = Vec::new();
    for plan in &setup.plan {
        let group_version = format!("{}/{}", plan.group, plan.version);
        let target_index = setup
            .targets
            .iter()
            .position(|t| t.name == plan.target.name && t.project == plan.target.project)
            .ok_or_else(|| AppError::UnknownTarget {
                group_version: group_version.clone(),
                target: format!("{}/{}", plan.target.project, plan.target.name),
            })?;
        let target = &setup.targets[target_index];
        let target_label = names::target_label(&target.project, &target.name);
        let metrics = setup.metrics.target(&target_label);
        let target_error = |message: String| AppError::Target {
            target: target_label.clone(),
            message,
        };
        let credentials = Arc::clone(&target.access.credentials);
        let tls_client = target
            .access
            .cluster
            .rustls_config(&[b"h2", b"http/1.1"], &credentials)
            .map_err(|e| target_error(e.to_string()))?;
        let server_name = target
            .access
            .cluster
            .server_name()
            .map_err(|e| target_error(e.to_string()))?;
        let host = target
            .access
            .cluster
            .server
            .host_str()
            .unwrap_or("localhost");
        let host = HeaderValue::from_str(host)
            .map_err(|e| target_error(format!("invalid target host {host:?}: {e}")))?;

        tracing::info!(group_version = %group_version, target = %target_label, port = plan.port, "Starting proxy server");
        let pool = PeerPool::new(
            group_version.clone(),
            Dialer::new(Arc::new(tls_client), server_name),
            metrics.clone(),
        );
        let connection = TargetConnection {
            pool: Arc::clone(&pool),
            host,
            credentials,
        };
        let upstream = names::placeholder_host(&target.name, &target.project);
        tracing::info!(group_version = %group_version, target = %target_label, upstream = %upstream, "Starting target transport");
        let proxy = GroupVersionProxy::new(
            plan.group.clone(),
            plan.version.clone(),
            plan.resources.clone(),
            plan.access,
            setup.owner.clone(),
            target.name.clone(),
            upstream,
            connection,
            metrics,
            setup.client.clone(),
            Arc::clone(&client_namespaces),
            Arc::clone(&trust),
        );
        let addr = SocketAddr::new(setup.bind, plan.port);
        let listener = server::bind(addr, setup.share_ports).await?;
        let addr = listener.local_addr().unwrap_or(addr);
        servers.push((group_version.clone(), addr));
        servers_done.push(server::serve_proxy(
            listener,
            Arc::clone(&tls),
            Arc::clone(&proxy),
            shutdown_rx.clone(),
        ));
        background.push(spawn_startup_probe(
            Arc::clone(&proxy),
            setup.startup_sync_timeout,
        ));
        proxies.push(proxy);
        pools.push(Arc::clone(&pool));
        readiness_pools.push((target_label.clone(), Arc::clone(&pool)));
        pools_by_target.push((target_index, pool));
    }

    for (index, target) in setup.targets.into_iter().enumerate() {
        let target_pools: Vec<Arc<PeerPool>> = pools_by_target
            .iter()
            .filter(|(i, _)| *i == index)
            .map(|(_, pool)| Arc::clone(pool))
            .collect();
        if !target_pools.is_empty() {
            background.push(sources::spawn(target.peers, target_pools));
        }
    }

    let metrics_addr = if serve_metrics {
        let listener = server::bind(setup.metrics_addr, false).await?;
        let addr = listener.local_addr().unwrap_or(setup.metrics_addr);
        servers_done.push(server::serve_metrics(
            listener,
            Arc::clone(&setup.metrics),
            Readiness::new(Arc::clone(&trust), readiness_pools),
            shutdown_rx.clone(),
        ));
        Some(addr)
    } else {
        None
    };

    Ok(RunningProxy {
        servers,
        metrics_addr,
        pools,
        proxies,
        shutdown,
        servers_done,
        background,
    })
}

/// Probes the target once at start so an operator sees at once whether the proxy
/// can reach it; serving does not wait for the probe.
fn spawn_startup_probe(proxy: Arc<GroupVersionProxy>, sync_timeout: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let group_version = proxy.group_version.clone();
        if !proxy.target.pool.wait_for_first_list(sync_timeout).await {
            tracing::warn!(group_version = %group_version, target = %proxy.metrics.target_label(), "peer cache did not sync in time for the startup probe, requests fail with 503 until the first netmap arrives");
            return;
        }
        let path = format!("/apis/{group_version}");
        // Bounded like any request: a target that accepts and never answers must
        // still be reported.
        let deadline = tokio::time::Instant::now() + transport::REQUEST_DEADLINE;
        let probe = proxy
            .target
            .send_get(
                deadline,
                TargetPath::Written(&path),
                &HeaderMap::new(),
                None,
            )
            .await;
        match probe {
            Ok(response) if response.status() == StatusCode::OK => {
                tracing::debug!(group_version = %group_version, target = %proxy.metrics.target_label(), "Connected to target");
            }
            Ok(response) => {
                tracing::warn!(group_version = %group_version, target = %proxy.metrics.target_label(), code = response.status().as_u16(), "initial probe of proxy target failed, requests will keep retrying");
            }
            Err(error) => {
                tracing::warn!(group_version = %group_version, target = %proxy.metrics.target_label(), %error, "initial probe of proxy target failed, requests will keep retrying");
            }
        }
    })
}

#[cfg(test)]
mod tests;
