//! Shared by the sync end-to-end tests: a host and a tenant devcluster with the dev
//! environment's example types, the sync started as `crproxy run` starts it, and
//! kubectl helpers.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crproxy::devsync;
use crproxy_sync::{SyncHandle, SyncMetrics, SyncOptions};
use serde_json::Value;
use test_support::{kubectl, kubectl_stdin, TestCluster, KUBECTL_TIMEOUT};

/// Two clusters with the example types on the host.
pub struct Env {
    pub host: TestCluster,
    pub tenant: TestCluster,
    /// Serves the aggregated `gateways.example.net/v1` on the host.
    pub example: devcluster::example_apiserver::ExampleApiServer,
}

impl Env {
    pub async fn new() -> Env {
        let host = test_support::devcluster("host").await;
        let tenant = test_support::devcluster("tenant").await;
        let client = crproxy::devenv::admin_client(&host.cluster).expect("client");
        devsync::install_example_types(&client)
            .await
            .expect("example types");
        let example = devsync::start_example_apiserver(&host.cluster, None)
            .await
            .expect("example API server");
        Env {
            host,
            tenant,
            example,
        }
    }

    /// The sync for tenant `name` (always leading) with the dev environment's types.
    pub async fn start(&self, name: &str) -> Result<SyncHandle> {
        self.start_with(name, &self.tenant.kubeconfig, devsync::HOST_NAMESPACE, None)
            .await
    }

    pub async fn start_with(
        &self,
        name: &str,
        tenant_kubeconfig: &Path,
        host_namespace: &str,
        config_override: Option<String>,
    ) -> Result<SyncHandle> {
        self.start_full(
            name,
            tenant_kubeconfig,
            host_namespace,
            config_override,
            SyncMetrics::new(),
        )
        .await
    }

    /// The sync of configuration `yaml` as `crproxy run` starts it (elected on
    /// its Lease with `lease` as its duration, `identity` its holder's prefix);
    /// `None` when no entry is enabled.
    pub async fn start_from_yaml(
        yaml: &str,
        identity: &str,
        lease: Duration,
    ) -> Result<Option<SyncHandle>> {
        let config = crproxy_core::config::parse(yaml).map_err(|e| anyhow::anyhow!("{e}"))?;
        let root = std::path::Path::new("/");
        let started = crproxy_sync::start_from_config(
            &config,
            crproxy::run::load_sync_clusters(Path::new("sync.yaml"), &config, root)?,
            SyncMetrics::new(),
            identity,
            lease,
        )
        .await?;
        Ok(started)
    }

    /// [`Env::start_with`] exporting into `metrics`.
    pub async fn start_full(
        &self,
        name: &str,
        tenant_kubeconfig: &Path,
        host_namespace: &str,
        config_override: Option<String>,
        metrics: std::sync::Arc<SyncMetrics>,
    ) -> Result<SyncHandle> {
        let options = self.options(
            name,
            tenant_kubeconfig,
            host_namespace,
            config_override,
            metrics,
        )?;
        Ok(crproxy_sync::start(options).await?)
    }

    /// The dev environment's sync configuration for tenant `name`, its mirrors in
    /// `host_namespace`: what [`Env::start_with`] runs without an override, and
    /// what a test edits to make one.
    pub fn config_text(
        &self,
        name: &str,
        tenant_kubeconfig: &Path,
        host_namespace: &str,
    ) -> String {
        devsync::sync_only_config(name, tenant_kubeconfig, &self.host.kubeconfig)
            .replace(devsync::HOST_NAMESPACE, host_namespace)
    }

    /// What [`Env::start_full`] starts the sync with (always leading, no Pod).
    pub fn options(
        &self,
        name: &str,
        tenant_kubeconfig: &Path,
        host_namespace: &str,
        config_override: Option<String>,
        metrics: std::sync::Arc<SyncMetrics>,
    ) -> Result<SyncOptions> {
        let yaml = config_override
            .unwrap_or_else(|| self.config_text(name, tenant_kubeconfig, host_namespace));
        let config = crproxy_core::config::parse(&yaml).map_err(|e| anyhow::anyhow!("{e}"))?;
        let plan = crproxy_core::config::sync::validate(&config)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .context("sync enabled")?;
        Ok(SyncOptions {
            plan,
            host: access(&self.host.kubeconfig)?,
            tenant: access(tenant_kubeconfig)?,
            leader: crproxy_wiring::LeaderHandle::fixed(true),
            metrics,
            resync: Duration::from_secs(5),
            // Short, so the test of a tenant store failure sees its rollback soon.
            write_through_confirm: Duration::from_secs(5),
            pod_ip: None,
        })
    }
}

/// The cluster and identity of a kubeconfig, as `crproxy run` loads them.
pub fn access(kubeconfig: &Path) -> Result<crproxy_kube::ClusterAccess> {
    let cluster = crproxy_kube::ClusterConfig::from_kubeconfig(
        &crproxy_kube::Kubeconfig::load(kubeconfig)?,
        None,
    )?;
    Ok(crproxy_kube::ClusterAccess::new(cluster)?)
}

/// Applies YAML with kubectl.
pub fn apply(kubeconfig: &Path, yaml: &str) {
    let out = kubectl_stdin(
        kubeconfig,
        &["apply", "-f", "-"],
        Some(yaml),
        KUBECTL_TIMEOUT,
    );
    assert!(
        out.success(),
        "kubectl apply failed: {}\n{yaml}",
        out.stderr
    );
}

pub fn run(kubeconfig: &Path, args: &[&str]) {
    let out = kubectl(kubeconfig, args);
    assert!(out.success(), "kubectl {args:?} failed: {}", out.stderr);
}

/// The object as JSON, or `None` when kubectl says NotFound.
pub fn get(kubeconfig: &Path, args: &[&str]) -> Option<Value> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend(["-o", "json"]);
    let out = kubectl(kubeconfig, &all);
    if out.success() {
        serde_json::from_str(&out.stdout).ok()
    } else {
        assert!(
            out.stderr.contains("NotFound") || out.stderr.contains("not found"),
            "kubectl {all:?}: {}",
            out.stderr
        );
        None
    }
}

/// Polls `check` (bounded: 60 s) until it returns `Some`.
pub async fn eventually<T>(what: &str, check: impl FnMut() -> Option<T>) -> T {
    eventually_within(Duration::from_secs(60), what, check).await
}

/// Polls `check` until it returns `Some`, failing after `limit`.
pub async fn eventually_within<T>(
    limit: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn backup(name: &str, namespace: &str, schedule: &str) -> String {
    format!(
        "apiVersion: example.org/v1\nkind: Backup\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  labels: {{app: db}}\nspec:\n  schedule: \"{schedule}\"\n  secretRef: {{name: creds}}\n"
    )
}

pub fn ns(kubeconfig: &Path, name: &str) {
    let out = kubectl(kubeconfig, &["create", "namespace", name]);
    assert!(
        out.success() || out.stderr.contains("AlreadyExists"),
        "{}",
        out.stderr
    );
}

pub fn store(name: &str, region: &str, size: u32) -> String {
    format!("apiVersion: example.org/v1\nkind: SharedStore\nmetadata:\n  name: {name}\nspec:\n  region: {region}\n  size: {size}\n")
}
