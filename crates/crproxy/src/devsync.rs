//! The custom resource sync of the dev environment: a `host` devcluster with two
//! example types, and the sync between it and the `client` cluster as the tenant.
//!
//! * `backups.example.org/v1`, kind Backup: namespaced, with a status subresource,
//!   synced toHost (a tenant creates Backups; a host controller would act on them).
//! * `sharedstores.example.org/v1`, kind SharedStore: cluster-scoped, synced fromHost
//!   (the host offers stores; the tenant sees copies).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use serde_json::{json, Value};

/// The tenant's namespace on the host, where its Backups are mirrored.
pub const HOST_NAMESPACE: &str = "vcluster-client";

/// The `sync` section of the dev environment's configuration file.
pub fn sync_section(host_kubeconfig: &str) -> String {
    format!(
        r#"sync:
  host:
    kubeconfig: {host_kubeconfig}
    namespace: {HOST_NAMESPACE}
  toHost:
    customResources:
      backups.example.org/v1:
        enabled: true
        patches:
          - path: spec.secretRef.name
            reference: {{apiVersion: v1, kind: Secret}}
      gateways.example.net/v1:
        enabled: true
  fromHost:
    customResources:
      sharedstores.example.org/v1:
        enabled: true
        scope: Cluster
"#
    )
}

/// The two example CRDs installed on the host.
pub fn example_crds() -> Vec<Value> {
    let any_object = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    vec![
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "backups.example.org"},
            "spec": {
                "group": "example.org",
                "scope": "Namespaced",
                "names": {"plural": "backups", "singular": "backup", "kind": "Backup", "listKind": "BackupList"},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Schedule", "type": "string", "jsonPath": ".spec.schedule"},
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"}
                    ],
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "properties": {"spec": any_object, "status": any_object}
                    }}
                }]
            }
        }),
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "sharedstores.example.org"},
            "spec": {
                "group": "example.org",
                "scope": "Cluster",
                "names": {"plural": "sharedstores", "singular": "sharedstore", "kind": "SharedStore", "listKind": "SharedStoreList"},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "additionalPrinterColumns": [
                        {"name": "Region", "type": "string", "jsonPath": ".spec.region"}
                    ],
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "properties": {"spec": any_object}
                    }}
                }]
            }
        }),
    ]
}

/// Installs the example CRDs on the host (keeping existing ones) and waits until
/// they are Established.
pub async fn install_example_types(host: &kube::Client) -> Result<()> {
    let crds = Api::<CustomResourceDefinition>::all(host.clone());
    for crd in example_crds() {
        let crd: CustomResourceDefinition = serde_json::from_value(crd)?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        crate::devenv::create_or_keep(&crds, &crd)
            .await
            .with_context(|| format!("installing CRD {name} on the host"))?;
        if !crate::devenv::wait_until_established(&crds, &name).await {
            return Err(anyhow!("CRD {name} did not become Established on the host"));
        }
    }
    Ok(())
}

/// Starts the example extension API server (`gateways.example.net/v1`, its Gateways
/// kept in `state_file` when given), registers it on `host` through an APIService
/// and waits until the host serves the type.
pub async fn start_example_apiserver(
    host: &devcluster::DevCluster,
    state_file: Option<PathBuf>,
) -> Result<devcluster::example_apiserver::ExampleApiServer> {
    let server = devcluster::example_apiserver::ExampleApiServer::start(
        &host.front_proxy_ca_pem(),
        state_file,
    )
    .await
    .context("starting the example extension API server")?;
    server
        .register(host)
        .await
        .context("registering the example extension API server on the host")?;
    let client = crate::devenv::admin_client(host)?;
    for _ in 0..100 {
        if client
            .list_api_group_resources("example.net/v1")
            .await
            .is_ok()
        {
            return Ok(server);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(anyhow!(
        "the host did not serve example.net/v1 within 10 s of registering the example API server"
    ))
}

/// A configuration file with only the sync: the dev environment's tenant is the
/// `client` cluster.
pub fn sync_only_config(
    client_name: &str,
    client_kubeconfig: &Path,
    host_kubeconfig: &Path,
) -> String {
    format!(
        "client:\n  name: {client_name}\n  project: default\n  kubeconfig: {}\n{}",
        client_kubeconfig.display(),
        sync_section(&host_kubeconfig.display().to_string())
    )
}

/// The sync part of `crproxy dev`: the `host` devcluster, the sync configuration file
/// and the running sync (elected on its Lease, exactly as `crproxy run` does).
pub struct DevSync {
    pub host: devcluster::DevCluster,
    pub host_kubeconfig: PathBuf,
    pub config_path: PathBuf,
    pub metrics_addr: SocketAddr,
    /// Serves `gateways.example.net/v1` on the host (aggregated, synced toHost).
    pub example_apiserver: devcluster::example_apiserver::ExampleApiServer,
    sync: crproxy_sync::SyncHandle,
    metrics_stop: tokio::sync::watch::Sender<bool>,
    metrics_task: tokio::task::JoinHandle<()>,
}

/// Where [`DevSync::start`] puts things.
pub struct DevSyncOptions<'a> {
    /// The environment's directory (absolute).
    pub dir: &'a Path,
    /// Keep the host's state in `dir/host` across restarts.
    pub persistent: bool,
    /// Host API port; 0 picks a free one.
    pub host_port: u16,
    /// Port of the sync's metrics listener; 0 picks a free one.
    pub metrics_port: u16,
    /// The tenant: the client cluster's name and admin kubeconfig.
    pub client_name: &'a str,
    pub client_kubeconfig: &'a Path,
}

impl DevSync {
    /// Starts the host devcluster, installs the example types, writes `host.kubeconfig`
    /// and `sync.yaml`, and starts the sync from that file.
    pub async fn start(options: DevSyncOptions<'_>) -> Result<DevSync> {
        let dir = options.dir;
        let host = devcluster::start(devcluster::DevClusterConfig {
            name: "host".into(),
            data_dir: options.persistent.then(|| dir.join("host")),
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: options.host_port,
        })
        .await
        .context("starting the host devcluster")?;
        let host_kubeconfig = dir.join("host.kubeconfig");
        std::fs::write(&host_kubeconfig, host.admin_kubeconfig())
            .with_context(|| format!("writing {}", host_kubeconfig.display()))?;
        install_example_types(&crate::devenv::admin_client(&host)?).await?;
        // Kept beside the host's own state: a restart must find the Gateways the
        // tenant's objects are mirrored to.
        let example_apiserver = start_example_apiserver(
            &host,
            options
                .persistent
                .then(|| dir.join("host").join("gateways.json")),
        )
        .await?;

        let config_path = dir.join("sync.yaml");
        let text = sync_only_config(
            options.client_name,
            options.client_kubeconfig,
            &host_kubeconfig,
        );
        std::fs::write(&config_path, &text)
            .with_context(|| format!("writing {}", config_path.display()))?;
        let config = crproxy_core::config::parse(&text).map_err(|e| anyhow!("{e}"))?;

        let sync_metrics = crproxy_sync::SyncMetrics::new();
        let metrics = crproxy_proxy::metrics::Metrics::with_extra(|r| sync_metrics.register(r));
        let metrics_port = if options.metrics_port == 0 {
            crate::devenv::free_port()?
        } else {
            options.metrics_port
        };
        let listener = crproxy_proxy::server::bind(
            SocketAddr::from((Ipv4Addr::LOCALHOST, metrics_port)),
            false,
        )
        .await
        .context("binding the sync metrics listener")?;
        let metrics_addr = listener.local_addr()?;
        let (metrics_stop, stopped) = tokio::sync::watch::channel(false);
        let metrics_task = crproxy_proxy::server::serve_metrics(
            listener,
            metrics,
            crproxy_proxy::health::Readiness::without_proxy(),
            stopped,
        );

        let sync = crproxy_sync::start_from_config(
            &config,
            crate::run::load_sync_clusters(&config_path, &config, dir)?,
            sync_metrics,
            "dev",
            crproxy_sync::LEASE_DURATION,
        )
        .await
        .context("starting the sync")?
        .ok_or_else(|| anyhow!("the dev sync configuration enables no type"))?;
        // The banner follows: by then a Gateway create must get the host's answer,
        // not "not ready".
        let mut ready = false;
        for _ in 0..300 {
            if sync.write_through_ready() {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !ready {
            return Err(anyhow!(
                "the sync's write-through did not become ready within 30 s"
            ));
        }
        Ok(DevSync {
            host,
            host_kubeconfig,
            config_path,
            metrics_addr,
            example_apiserver,
            sync,
            metrics_stop,
            metrics_task,
        })
    }

    pub fn metrics_url(&self) -> String {
        format!("http://{}/metrics/syncer", self.metrics_addr)
    }

    /// The `host` entry of `dev.json`.
    pub fn describe(&self) -> Value {
        json!({
            "api_url": self.host.url(),
            "kubeconfig": self.host_kubeconfig,
            "namespace": HOST_NAMESPACE,
            "sync_config": self.config_path,
            "sync_metrics_url": self.metrics_url(),
        })
    }

    /// Stops the sync (releasing its Lease), its metrics listener, then the host.
    pub async fn shutdown(self) {
        self.sync.stop().await;
        self.example_apiserver.stop();
        let _ = self.metrics_stop.send(true);
        let _ = self.metrics_task.await;
        self.host.shutdown().await;
    }
}

/// Starts the dev sync for `env`'s first client and adds the `host` entry to
/// `dev.json`.
pub async fn start_for(env: &crate::devenv::DevEnv) -> Result<DevSync> {
    let client = env
        .clients
        .first()
        .ok_or_else(|| anyhow!("the dev environment has no client"))?;
    let sync = DevSync::start(DevSyncOptions {
        dir: &env.options.dir,
        persistent: env.options.persistent,
        host_port: env.options.host_port,
        metrics_port: env.options.sync_metrics_port,
        client_name: &client.name,
        client_kubeconfig: &client.kubeconfig,
    })
    .await?;
    let mut described = env.describe();
    described["host"] = sync.describe();
    let path = env.options.dir.join("dev.json");
    std::fs::write(&path, serde_json::to_string_pretty(&described)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(sync)
}

/// The sync part of the start-up banner.
pub fn print_tour(env: &crate::devenv::DevEnv, sync: &DevSync) {
    let dir = env.options.dir.display();
    println!(
        r#"
Custom resource sync (tenant = client, its namespace on the host = {HOST_NAMESPACE}):
  host.kubeconfig    the host cluster: {host}
  sync.yaml          the sync configuration
  sync metrics:      {metrics}
  export HOST="--kubeconfig {dir}/host.kubeconfig"
  kubectl create namespace team
  kubectl -n team create -f - <<'EOF'
apiVersion: example.org/v1
kind: Backup
metadata: {{name: nightly}}
spec: {{schedule: "@daily", secretRef: {{name: creds}}}}
EOF
  kubectl $HOST -n {HOST_NAMESPACE} get backups -o yaml      # nightly-x-team-x-client
  kubectl $HOST -n {HOST_NAMESPACE} patch backup nightly-x-team-x-client --subresource=status --type=merge -p '{{"status":{{"phase":"Done"}}}}'
  kubectl -n team get backups                                  # PHASE Done
  kubectl $HOST create -f - <<'EOF'
apiVersion: example.org/v1
kind: SharedStore
metadata: {{name: eu-store}}
spec: {{region: eu, size: 1}}
EOF
  kubectl get sharedstores                                     # the host's store, copied
  kubectl -n team create -f - <<'EOF'                          # aggregated: the host's server validates it
apiVersion: example.net/v1
kind: Gateway
metadata: {{name: edge}}
spec: {{port: 70000}}
EOF
  # -> 422 naming spec.port, from the host's extension API server; stored on neither side

Press Ctrl-C to stop."#,
        host = sync.host.url(),
        metrics = sync.metrics_url(),
    );
}
