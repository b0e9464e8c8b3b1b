//! The custom resource sync of the dev environment: a `host` devcluster with two
//! example types, and the sync between it and the `client` cluster as the tenant.
//!
//! * `backups.example.org/v1`, kind Backup: namespaced, with a status subresource,
//!   synced toHost (a tenant creates Backups; a host controller would act on them).
//! * `sharedstores.example.org/v1`, kind SharedStore: cluster-scoped, synced fromHost
//!   (the host offers stores; the tenant sees copies).

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
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
pub async fn install_example_types(host: &crproxy_kube::Client) -> Result<()> {
    let collection = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    for crd in example_crds() {
        let name = crd["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match host.create(collection, &crd).await {
            Ok(_) => {}
            Err(e) if e.is_already_exists() => {}
            Err(e) => return Err(e).with_context(|| format!("installing CRD {name} on the host")),
        }
        let mut established = false;
        for _ in 0..100 {
            if let Ok(current) = host.get(&format!("{collection}/{name}")).await {
                established = current["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Established" && c["status"] == "True")
                    });
                if established {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !established {
            return Err(anyhow!("CRD {name} did not become Established on the host"));
        }
    }
    Ok(())
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
