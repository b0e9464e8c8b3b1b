//! Custom resource sync end to end: two devclusters (host and tenant), the sync as
//! `crproxy run` starts it, and every check through the real kubectl.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crproxy::devsync;
use crproxy_sync::{SyncHandle, SyncMetrics, SyncOptions};
use serde_json::{json, Value};
use test_support::{kubectl, kubectl_stdin, TestCluster, KUBECTL_TIMEOUT};

/// Two clusters with the example types on the host.
struct Env {
    host: TestCluster,
    tenant: TestCluster,
}

impl Env {
    async fn new() -> Env {
        let host = test_support::devcluster("host").await;
        let tenant = test_support::devcluster("tenant").await;
        let client = crproxy_kube::Client::new(
            crproxy_kube::ClusterConfig::from_kubeconfig(
                &crproxy_kube::Kubeconfig::load(&host.kubeconfig).expect("kubeconfig"),
                None,
            )
            .expect("cluster"),
        )
        .expect("client");
        devsync::install_example_types(&client)
            .await
            .expect("example types");
        Env { host, tenant }
    }

    /// The sync for tenant `name` (always leading) with the dev environment's types.
    async fn start(&self, name: &str) -> Result<SyncHandle> {
        self.start_with(name, &self.tenant.kubeconfig, devsync::HOST_NAMESPACE, None)
            .await
    }

    async fn start_with(
        &self,
        name: &str,
        tenant_kubeconfig: &Path,
        host_namespace: &str,
        config_override: Option<String>,
    ) -> Result<SyncHandle> {
        let yaml = config_override.unwrap_or_else(|| {
            devsync::sync_only_config(name, tenant_kubeconfig, &self.host.kubeconfig)
                .replace(devsync::HOST_NAMESPACE, host_namespace)
        });
        let config = crproxy_core::config::parse(&yaml).map_err(|e| anyhow::anyhow!("{e}"))?;
        let plan = crproxy_core::config::sync::validate(&config)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .context("sync enabled")?;
        Ok(crproxy_sync::start(SyncOptions {
            plan,
            host_kubeconfig: self.host.kubeconfig.clone(),
            tenant_kubeconfig: Some(tenant_kubeconfig.to_path_buf()),
            leader: crproxy_wiring::LeaderHandle::fixed(true),
            metrics: SyncMetrics::new(),
            resync: Duration::from_secs(5),
        })
        .await?)
    }
}

/// Applies YAML with kubectl.
fn apply(kubeconfig: &Path, yaml: &str) {
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

fn run(kubeconfig: &Path, args: &[&str]) {
    let out = kubectl(kubeconfig, args);
    assert!(out.success(), "kubectl {args:?} failed: {}", out.stderr);
}

/// The object as JSON, or `None` when kubectl says NotFound.
fn get(kubeconfig: &Path, args: &[&str]) -> Option<Value> {
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
async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn backup(name: &str, namespace: &str, schedule: &str) -> String {
    format!(
        "apiVersion: example.org/v1\nkind: Backup\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  labels: {{app: db}}\nspec:\n  schedule: \"{schedule}\"\n  secretRef: {{name: creds}}\n"
    )
}

fn ns(kubeconfig: &Path, name: &str) {
    let out = kubectl(kubeconfig, &["create", "namespace", name]);
    assert!(
        out.success() || out.stderr.contains("AlreadyExists"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn to_host_mirrors_spec_down_status_up_and_deletes_both_ways() -> Result<()> {
    let env = Env::new().await;
    let sync = env.start("client").await?;
    let (host, tenant) = (&env.host.kubeconfig, &env.tenant.kubeconfig);
    // The CRD was copied into the tenant, without a conversion webhook.
    let crd = get(tenant, &["crd", "backups.example.org"]).context("CRD copied")?;
    assert_eq!(
        crd["spec"]["versions"][0]["subresources"],
        json!({"status": {}})
    );
    assert_eq!(
        crd["spec"]["versions"][0]["additionalPrinterColumns"][0]["name"],
        "Schedule"
    );
    assert_eq!(crd["spec"]["conversion"]["strategy"], "None");

    ns(tenant, "team");
    apply(tenant, &backup("db", "team", "@daily"));
    let uid =
        get(tenant, &["backup", "-n", "team", "db"]).context("created")?["metadata"]["uid"].clone();
    let mirror = eventually("mirror on the host", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "db-x-team-x-client"],
        )
    })
    .await;
    let a = &mirror["metadata"]["annotations"];
    assert_eq!(a["vcluster.loft.sh/object-name"], "db");
    assert_eq!(a["vcluster.loft.sh/object-namespace"], "team");
    assert_eq!(a["vcluster.loft.sh/object-uid"], uid);
    assert_eq!(
        a["vcluster.loft.sh/object-kind"],
        "example.org/v1, Kind=Backup"
    );
    assert_eq!(a["vcluster.loft.sh/object-host-name"], "db-x-team-x-client");
    assert_eq!(
        a["vcluster.loft.sh/object-host-namespace"],
        "vcluster-client"
    );
    let l = &mirror["metadata"]["labels"];
    assert_eq!(l["vcluster.loft.sh/managed-by"], "client");
    assert_eq!(l["vcluster.loft.sh/namespace"], "team");
    assert_eq!(l["app"], "db");
    assert_eq!(mirror["spec"]["schedule"], "@daily");
    // The patch rewrote the Secret reference to its host name.
    assert_eq!(mirror["spec"]["secretRef"]["name"], "creds-x-team-x-client");

    // Spec flows down.
    run(
        tenant,
        &[
            "patch",
            "backup",
            "-n",
            "team",
            "db",
            "--type=merge",
            "-p",
            r#"{"spec":{"schedule":"@hourly"}}"#,
        ],
    );
    eventually("spec update on the host", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "db-x-team-x-client"],
        )
        .filter(|m| m["spec"]["schedule"] == "@hourly")
    })
    .await;

    // Status flows up through the status subresource.
    run(
        host,
        &[
            "patch",
            "backup",
            "-n",
            "vcluster-client",
            "db-x-team-x-client",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Done"}}"#,
        ],
    );
    eventually("status in the tenant", || {
        get(tenant, &["backup", "-n", "team", "db"]).filter(|t| t["status"]["phase"] == "Done")
    })
    .await;
    // A tenant's edit of status is overwritten by the host's.
    run(
        tenant,
        &[
            "patch",
            "backup",
            "-n",
            "team",
            "db",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Faked"}}"#,
        ],
    );
    eventually("host status restored in the tenant", || {
        get(tenant, &["backup", "-n", "team", "db"]).filter(|t| t["status"]["phase"] == "Done")
    })
    .await;

    // Deleting the tenant object deletes the mirror.
    run(tenant, &["delete", "backup", "-n", "team", "db"]);
    eventually("mirror deleted", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "db-x-team-x-client"],
        )
        .is_none()
        .then_some(())
    })
    .await;

    // Deleting the mirror on the host deletes the tenant object.
    apply(tenant, &backup("web", "team", "@weekly"));
    eventually("second mirror", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "web-x-team-x-client"],
        )
    })
    .await;
    run(
        host,
        &[
            "delete",
            "backup",
            "-n",
            "vcluster-client",
            "web-x-team-x-client",
        ],
    );
    eventually("tenant object deleted after its mirror", || {
        get(tenant, &["backup", "-n", "team", "web"])
            .is_none()
            .then_some(())
    })
    .await;
    // ... and it is not recreated.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(get(
        host,
        &["backup", "-n", "vcluster-client", "web-x-team-x-client"]
    )
    .is_none());
    sync.stop().await;
    Ok(())
}
