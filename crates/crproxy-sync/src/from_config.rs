//! Starting the sync the way `crproxy run` does: from the configuration file, with
//! leader election on a Lease in the tenant cluster.

use std::sync::Arc;
use std::time::Duration;

use crproxy_core::config::{sync, Config};
use crproxy_kube::ClusterAccess;
use crproxy_wiring::{LeaderElector, LeaseConfig};

use crate::run::{keep_retired, start, Retirer, SyncHandle, SyncOptions, DEFAULT_RESYNC};
use crate::{SyncError, SyncMetrics};

/// Lease timings: a standby takes over at most `LEASE_DURATION` after the leader
/// stops renewing.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);

/// The clusters the sync talks to, loaded (and checked) by the caller once, so
/// that each identity has one credential provider in the process.
pub struct SyncClusters {
    /// The tenant: the client cluster, whose identity the proxy shares, or why it
    /// cannot be reached (no `client.kubeconfig` outside a cluster). The sync then
    /// fails to start; with no sync configured, the old webhook's check is skipped.
    pub tenant: Result<ClusterAccess, String>,
    /// `sync.host.kubeconfig`'s cluster, when it is set.
    pub host: Option<ClusterAccess>,
}

/// Starts the sync of a validated configuration, or returns `None` when no sync entry
/// is enabled. `identity` prefixes this replica's Lease holder identity.
///
/// With no sync entry enabled (or no `sync` section), no syncer runs here, and
/// once no replica anywhere leads the sync either, this replica removes a
/// write-through webhook an earlier configuration registered, in the background
/// (see [`Retirer::WhileNoneLeads`]): left, it would refuse every
/// tenant write of the types it names.
pub async fn start_from_config(
    config: &Config,
    clusters: SyncClusters,
    metrics: Arc<SyncMetrics>,
    identity: &str,
    lease_duration: Duration,
) -> Result<Option<SyncHandle>, SyncError> {
    let plan = match sync::validate(config) {
        Ok(Some(plan)) => plan,
        Ok(None) => {
            retire_write_through(config, clusters.tenant, lease_duration);
            return Ok(None);
        }
        Err(errors) => {
            let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
            return Err(SyncError::Resolution {
                key: "sync".into(),
                message: lines.join("; "),
            });
        }
    };
    let tenant = clusters.tenant.map_err(|message| SyncError::Cluster {
        cluster: "tenant",
        message,
    })?;
    let host = clusters.host.ok_or_else(|| SyncError::Cluster {
        cluster: "host",
        message: "sync.host.kubeconfig is not set".into(),
    })?;
    // The elector retries on its own interval; see crproxy's start_wiring.
    let lease_client =
        (tenant.kube_client_without_retries()).map_err(SyncError::cluster("tenant"))?;
    let leader = LeaderElector::spawn(
        lease_client,
        LeaseConfig {
            namespace: crproxy_core::names::LEASE_NAMESPACE.into(),
            name: crproxy_core::names::sync_lease_name(&plan.tenant),
            identity: format!("{identity}-{}", crproxy_wiring::default_identity()),
            lease_duration,
            renew_interval: lease_duration / 5,
            retry_interval: (lease_duration / 7).max(Duration::from_millis(200)),
        },
    );
    start(SyncOptions {
        plan,
        host,
        tenant,
        leader,
        metrics,
        resync: DEFAULT_RESYNC,
        write_through_confirm: crate::writethrough::CONFIRM_WITHIN,
        // The downward API's status.podIP (deploy/ sets it).
        pod_ip: std::env::var("POD_IP").ok().and_then(|ip| ip.parse().ok()),
    })
    .await
    .map(Some)
}

/// Whether the configuration has a `sync` section at all: a host to sync with,
/// or entries (all disabled when the plan is `None`).
fn has_sync_section(sync: &sync::SyncConfig) -> bool {
    sync.host_kubeconfig.is_some() || !sync.to_host.is_empty() || !sync.from_host.is_empty()
}

/// Spawns the removal of the tenant's write-through webhook; a tenant that
/// cannot be reached is logged, and the start goes on (nothing else needs it).
/// Without a `sync` section a tenant that forbids the check is not worth a
/// warning (a proxy-only deployment may lack the sync's rights).
fn retire_write_through(
    config: &Config,
    tenant: Result<ClusterAccess, String>,
    lease_duration: Duration,
) {
    let tenant_name = config.client.name.clone();
    let warn = has_sync_section(&config.sync);
    let tenant = tenant.and_then(|access| access.kube_client().map_err(|e| e.to_string()));
    tokio::spawn(async move {
        match tenant {
            Ok(tenant) => {
                let retirer = Retirer::while_none_leads(&tenant, &tenant_name, lease_duration);
                keep_retired(&tenant, &tenant_name, lease_duration, retirer, warn).await
            }
            Err(e) if warn => {
                tracing::warn!(error = %e, "cannot check the tenant for a write-through webhook left by an earlier configuration")
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot check the tenant for a write-through webhook")
            }
        }
    });
}
