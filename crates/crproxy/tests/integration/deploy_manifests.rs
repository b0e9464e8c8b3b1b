//! deploy/: every kustomization renders and passes a server-side dry run against
//! devcluster; the cluster-ip overlay's pods are the ones the registered Service
//! selects, so the APIService reaches them; the monitoring kit matches the tested
//! rule files and the metrics crproxy exposes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
};
use serde_json::{json, Value};

use crproxy::devenv::{self, LinkSpec, ProxiedResource};
use crproxy_core::names;

/// Every kustomization under deploy/, and whether it is applied to the client or
/// the target cluster (both are the same devcluster here: a dry run stores nothing).
const KUSTOMIZATIONS: &[&str] = &[
    "base",
    "overlays/cluster-ip",
    "overlays/beside-apiserver",
    "target",
    "monitoring",
    "components/sync",
];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn standin_crds() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/deploy_manifests/standin-crds.yaml")
}

async fn render(kubeconfig: &Path, dir: &str) -> Result<String> {
    let path = deploy_dir().join(dir);
    let out = test_support::kubectl_async(
        kubeconfig,
        &["kustomize", path.to_str().context("utf8 path")?],
    )
    .await;
    if !out.success() {
        bail!("kubectl kustomize {dir}: {}", out.stderr);
    }
    Ok(out.stdout)
}

fn documents(yaml: &str) -> Result<Vec<Value>> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).context("parsing YAML")?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn find<'a>(docs: &'a [Value], kind: &str) -> Result<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .ok_or_else(|| anyhow!("no {kind} rendered"))
}

/// Installs the stand-in CRDs for kinds devcluster does not serve and waits until
/// the API server serves them.
async fn install_standins(kubeconfig: &Path) -> Result<()> {
    let path = standin_crds();
    let out = test_support::kubectl_async(
        kubeconfig,
        &["apply", "-f", path.to_str().context("utf8 path")?],
    )
    .await;
    if !out.success() {
        bail!("installing stand-in CRDs: {}", out.stderr);
    }
    let text = std::fs::read_to_string(&path)?;
    for crd in documents(&text)? {
        let name = crd["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut established = false;
        for _ in 0..100 {
            let got = test_support::kubectl_json_async(kubeconfig, &["get", "crd", &name]).await?;
            if devenv::condition_status(&got, "Established").as_deref() == Some("True") {
                established = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !established {
            bail!("stand-in CRD {name} did not become Established");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kustomization_passes_a_server_side_dry_run() -> Result<()> {
    let cluster = test_support::devcluster("deploy-check").await;
    install_standins(&cluster.kubeconfig).await?;
    for dir in KUSTOMIZATIONS {
        let rendered = render(&cluster.kubeconfig, dir).await?;
        let objects = documents(&rendered)?;
        assert!(!objects.is_empty(), "{dir} renders nothing");
        let applied = server_dry_run(&cluster.kubeconfig, &rendered).await;
        assert!(
            applied.success(),
            "{dir}: dry run failed: {}",
            applied.stderr
        );
        // Every object was accepted, not just the first few.
        let accepted = applied
            .stdout
            .lines()
            .filter(|l| l.ends_with("created (server dry run)"))
            .count();
        assert_eq!(accepted, objects.len(), "{dir}: {}", applied.stdout);
    }
    // A dry run stores nothing.
    let get = test_support::kubectl_async(
        &cluster.kubeconfig,
        &["-n", "kube-system", "get", "deployment", "crproxy"],
    )
    .await;
    assert!(!get.success(), "a dry run must not create objects");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dry_run_catches_a_broken_manifest() -> Result<()> {
    // The stand-ins are only worth having if they reject what the real API would.
    let cluster = test_support::devcluster("deploy-broken").await;
    install_standins(&cluster.kubeconfig).await?;
    let cases = [
        ("monitoring", "for: 2m", "for: 2 minutes"),
        (
            "monitoring",
            "concurrencyPolicy: Forbid",
            "concurrencyPolicy: Never",
        ),
        ("overlays/cluster-ip", "minAvailable: 1", "minAvailabel: 1"),
        (
            "overlays/beside-apiserver",
            "rollingUpdate:",
            "rolingUpdate:",
        ),
    ];
    for (dir, good, bad) in cases {
        let rendered = render(&cluster.kubeconfig, dir).await?;
        assert!(rendered.contains(good), "{dir} has no {good:?}");
        let broken = rendered.replacen(good, bad, 1);
        let applied = test_support::kubectl_stdin_async(
            &cluster.kubeconfig,
            &["apply", "--dry-run=server", "-f", "-"],
            &broken,
            Duration::from_secs(60),
        )
        .await;
        assert!(!applied.success(), "{dir} with {bad:?} was accepted");
    }
    Ok(())
}

/// `kubectl apply --dry-run=server` of rendered manifests.
async fn server_dry_run(kubeconfig: &Path, rendered: &str) -> test_support::KubectlOutput {
    test_support::kubectl_stdin_async(
        kubeconfig,
        &["apply", "--dry-run=server", "-f", "-"],
        rendered,
        Duration::from_secs(60),
    )
    .await
}

/// The `sync:` example an overlay's config.yaml carries commented out, uncommented.
fn sync_example(docs: &[Value]) -> Result<String> {
    let config = find(docs, "ConfigMap")?["data"]["config.yaml"]
        .as_str()
        .context("config.yaml")?;
    Ok(config
        .lines()
        .skip_while(|l| !l.starts_with("# sync:"))
        .map(|l| l.strip_prefix("# ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n"))
}

/// Renders `overlay` with the sync component added, as an operator's own
/// kustomization beside deploy/ would (kustomize wants relative paths).
async fn render_with_sync(kubeconfig: &Path, overlay: &str) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let deploy = deploy_dir().canonicalize()?;
    let up = "../".repeat(dir.path().canonicalize()?.components().count() - 1);
    let deploy = format!("{up}{}", deploy.strip_prefix("/")?.display());
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!("resources: [{deploy}/{overlay}]\ncomponents: [{deploy}/components/sync]\n"),
    )?;
    let out = test_support::kubectl_async(
        kubeconfig,
        &["kustomize", dir.path().to_str().context("utf8 path")?],
    )
    .await;
    if !out.success() {
        bail!(
            "kubectl kustomize {overlay} + components/sync: {}",
            out.stderr
        );
    }
    Ok(out.stdout)
}

/// The sync component on each overlay: the result passes a dry run, mounts the
/// host kubeconfig where the overlay's commented sync example expects it, and
/// grants the tenant-side rights the sync uses for the example's type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sync_component_completes_each_overlay() -> Result<()> {
    let cluster = test_support::devcluster("deploy-sync").await;
    install_standins(&cluster.kubeconfig).await?;
    for overlay in ["overlays/cluster-ip", "overlays/beside-apiserver"] {
        let rendered = render_with_sync(&cluster.kubeconfig, overlay).await?;
        let docs = documents(&rendered)?;
        let applied = server_dry_run(&cluster.kubeconfig, &rendered).await;
        assert!(applied.success(), "{overlay}: {}", applied.stderr);
        let example: Value = serde_saphyr::from_str(&sync_example(&docs)?)?;
        let host_kubeconfig = example["sync"]["host"]["kubeconfig"]
            .as_str()
            .context("sync.host.kubeconfig in the example")?;
        let workload = docs
            .iter()
            .find(|d| d["kind"] == "Deployment" || d["kind"] == "DaemonSet")
            .context("no workload rendered")?;
        let pod = &workload["spec"]["template"]["spec"];
        assert_eq!(
            pod["containers"][0]["volumeMounts"][0]["mountPath"],
            "/etc/crproxy"
        );
        let mounted = pod["volumes"][0]["projected"]["sources"]
            .as_array()
            .context("projected volume")?
            .iter()
            .any(|s| {
                s["secret"]["name"] == "crproxy-host-kubeconfig"
                    && s["secret"]["items"][0]["key"] == "kubeconfig"
                    && format!(
                        "/etc/crproxy/{}",
                        s["secret"]["items"][0]["path"].as_str().unwrap_or_default()
                    ) == host_kubeconfig
            });
        assert!(mounted, "{overlay}: {host_kubeconfig} is not mounted");
        // The example type's rights, and the CRD and namespace rights resolution
        // and fromHost copies need.
        let role = docs
            .iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "crproxy-sync")
            .context("no ClusterRole crproxy-sync")?;
        let allows = |group: &str, resource: &str, verb: &str| {
            role["rules"].as_array().into_iter().flatten().any(|r| {
                r["apiGroups"]
                    .as_array()
                    .is_some_and(|g| g.contains(&json!(group)))
                    && r["resources"]
                        .as_array()
                        .is_some_and(|g| g.contains(&json!(resource)))
                    && r["verbs"]
                        .as_array()
                        .is_some_and(|g| g.contains(&json!(verb)))
            })
        };
        for verb in ["get", "create", "update"] {
            assert!(
                allows("apiextensions.k8s.io", "customresourcedefinitions", verb),
                "{verb}"
            );
        }
        assert!(allows("", "namespaces", "create"));
        let key = example["sync"]["toHost"]["customResources"]
            .as_object()
            .and_then(|m| m.keys().next().cloned())
            .context("the example's synced type")?;
        let (plural, rest) = key.split_once('.').context("<plural>.<group>/<version>")?;
        let group = rest.split('/').next().unwrap_or_default();
        for verb in ["get", "list", "watch", "update", "patch", "delete"] {
            assert!(allows(group, plural, verb), "{key}: {verb}");
        }
        assert!(
            allows(group, &format!("{plural}/status"), "update"),
            "{key}: status"
        );
        // The write-through webhook, its Lease and EndpointSlice: see
        // the_client_rights_are_the_calls_the_code_makes.
    }
    Ok(())
}

/// One request the crproxy service account makes in the client cluster, as RBAC
/// sees it: verb, API group, resource, namespace (`None`: cluster-scoped or
/// all namespaces) and object name (`None`: create, list, watch).
type Call<'a> = (&'a str, &'a str, &'a str, Option<&'a str>, Option<&'a str>);

/// Whether the rendered RBAC lets the service account kube-system/crproxy make
/// `call`, by Kubernetes' rules: a Role counts in its RoleBinding's namespace, a
/// ClusterRole in a RoleBinding's namespace or, through a ClusterRoleBinding,
/// everywhere; a rule with resourceNames matches named requests only.
fn service_account_may(docs: &[Value], call: Call<'_>) -> bool {
    let (verb, group, resource, namespace, name) = call;
    let has = |list: &Value, item: &str| {
        list.as_array()
            .is_some_and(|l| l.iter().any(|v| v == item || v == "*"))
    };
    let grants = |role: &Value| {
        role["rules"].as_array().into_iter().flatten().any(|r| {
            has(&r["apiGroups"], group)
                && has(&r["resources"], resource)
                && has(&r["verbs"], verb)
                && match r["resourceNames"].as_array() {
                    None => true,
                    Some(names) if names.is_empty() => true,
                    Some(names) => name.is_some_and(|n| names.iter().any(|v| v == n)),
                }
        })
    };
    docs.iter()
        .filter(|b| b["kind"] == "RoleBinding" || b["kind"] == "ClusterRoleBinding")
        .filter(|b| {
            b["subjects"].as_array().into_iter().flatten().any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == "crproxy"
                    && s["namespace"] == names::SERVICE_NAMESPACE
            })
        })
        .filter(|b| {
            b["kind"] == "ClusterRoleBinding"
                || namespace.is_some_and(|ns| b["metadata"]["namespace"] == ns)
        })
        .filter_map(|b| {
            let kind = &b["roleRef"]["kind"];
            docs.iter().find(|r| {
                r["kind"] == *kind
                    && r["metadata"]["name"] == b["roleRef"]["name"]
                    && (*kind == "ClusterRole"
                        || r["metadata"]["namespace"] == b["metadata"]["namespace"])
            })
        })
        .any(grants)
}

/// The crproxy service account's rights in the client cluster are the calls the
/// code makes there and no more: every object the proxy registers, its Lease,
/// the sync's Lease and write-through objects are read by name, created and
/// replaced, never listed, watched or patched; Leases and Services only in
/// kube-system; the sync's writes only with deploy/components/sync. The names
/// come from the overlay's config.yaml as the code builds them. (That the rights
/// suffice for a proxy is shown by the walkthroughs, which run the binary as
/// this service account.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_rights_are_the_calls_the_code_makes() -> Result<()> {
    let cluster = test_support::devcluster("deploy-rights").await;
    for overlay in ["overlays/cluster-ip", "overlays/beside-apiserver"] {
        let proxy_only = documents(&render(&cluster.kubeconfig, overlay).await?)?;
        let with_sync = documents(&render_with_sync(&cluster.kubeconfig, overlay).await?)?;
        let config: Value = serde_saphyr::from_str(
            find(&proxy_only, "ConfigMap")?["data"]["config.yaml"]
                .as_str()
                .context("config.yaml")?,
        )?;
        let client = config["client"]["name"].as_str().context("client.name")?;
        let key = config["experimental"]["proxy"]["customResources"]
            .as_object()
            .and_then(|m| m.keys().next().cloned())
            .context("a proxied resource")?;
        let (resource_group, version) =
            key.split_once('/').context("<plural>.<group>/<version>")?;
        let group = resource_group
            .split_once('.')
            .context("<plural>.<group>")?
            .1;
        let example: Value = serde_saphyr::from_str(&sync_example(&with_sync)?)?;
        let write_through = example["sync"]["writeThrough"]["service"]["name"]
            .as_str()
            .context("sync.writeThrough.service.name")?;

        let system = Some(names::LEASE_NAMESPACE);
        let lease = names::registration_lease_name(client);
        let lease = lease.as_str();
        let sync_lease = names::sync_lease_name(client);
        let sync_lease = sync_lease.as_str();
        let service = names::service_name(group, version);
        let service = service.as_str();
        let apiservice = names::apiservice_name(group, version);
        let apiservice = apiservice.as_str();
        let configuration = crproxy_sync::writethrough::configuration_name(client);
        let configuration = configuration.as_str();
        let slice = crproxy_sync::writethrough::leader_slice_name(write_through);
        let slice = slice.as_str();
        let (coord, disc) = ("coordination.k8s.io", "discovery.k8s.io");
        let (reg, adm) = ("apiregistration.k8s.io", "admissionregistration.k8s.io");
        let (policy, binding) = (names::POLICY_NAME, names::POLICY_BINDING_NAME);
        let (policies, bindings) = (
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
        );
        let webhooks = "validatingwebhookconfigurations";

        // What every replica does, sync or not: leader election, registration,
        // and the removal of a write-through webhook left behind.
        let proxy: Vec<Call> = vec![
            ("create", coord, "leases", system, None),
            ("get", coord, "leases", system, Some(lease)),
            ("update", coord, "leases", system, Some(lease)),
            ("get", coord, "leases", system, Some(sync_lease)),
            ("get", "", "services", system, Some(service)),
            ("create", "", "services", system, None),
            ("update", "", "services", system, Some(service)),
            ("get", reg, "apiservices", None, Some(apiservice)),
            ("create", reg, "apiservices", None, None),
            ("update", reg, "apiservices", None, Some(apiservice)),
            ("get", adm, policies, None, Some(policy)),
            ("create", adm, policies, None, None),
            ("update", adm, policies, None, Some(policy)),
            ("get", adm, bindings, None, Some(binding)),
            ("create", adm, bindings, None, None),
            ("update", adm, bindings, None, Some(binding)),
            ("get", adm, webhooks, None, Some(configuration)),
            ("delete", adm, webhooks, None, Some(configuration)),
            // The sync's leader reads the write-through Service; deploy/base's
            // Role reads every Service in kube-system anyway.
            ("get", "", "services", system, Some(write_through)),
        ];
        // What only the sync does: renew its Lease, register the write-through
        // webhook, point the write-through Service at the leader.
        let sync: Vec<Call> = vec![
            ("update", coord, "leases", system, Some(sync_lease)),
            ("create", adm, webhooks, None, None),
            ("update", adm, webhooks, None, Some(configuration)),
            ("create", disc, "endpointslices", system, None),
            ("get", disc, "endpointslices", system, Some(slice)),
            ("update", disc, "endpointslices", system, Some(slice)),
        ];
        // Never, with or without the sync: other Leases (the control plane's
        // leader Leases in kube-system, node heartbeats), Services elsewhere,
        // other webhook configurations and EndpointSlices, and any list, watch,
        // patch or delete of the kinds the code only reads, creates and replaces.
        let (kcm, node, dns) = (
            Some("kube-controller-manager"),
            Some("node-1"),
            Some("kube-dns-abcde"),
        );
        let (heartbeats, default) = (Some("kube-node-lease"), Some("default"));
        let mut never: Vec<Call> = vec![
            ("update", coord, "leases", system, kcm),
            ("get", coord, "leases", heartbeats, node),
            ("update", coord, "leases", heartbeats, node),
            ("create", coord, "leases", default, None),
            ("get", "", "services", default, Some("kubernetes")),
            ("update", "", "services", default, Some("kubernetes")),
            ("create", "", "services", default, None),
            ("get", adm, webhooks, None, Some("another-webhook")),
            ("update", adm, webhooks, None, Some("another-webhook")),
            ("delete", adm, webhooks, None, Some("another-webhook")),
            ("update", disc, "endpointslices", system, dns),
            ("list", disc, "endpointslices", system, None),
        ];
        let read_created_replaced = [
            (coord, "leases", system),
            ("", "services", system),
            (reg, "apiservices", None),
            (adm, policies, None),
            (adm, bindings, None),
            (adm, webhooks, None),
        ];
        for (group, resource, namespace) in read_created_replaced {
            for verb in ["list", "watch", "patch", "deletecollection"] {
                never.push((verb, group, resource, namespace, None));
            }
        }
        for (verb, group, resource, namespace, name) in [
            ("patch", coord, "leases", system, Some(lease)),
            ("delete", coord, "leases", system, Some(lease)),
            ("patch", "", "services", system, Some(service)),
            ("delete", "", "services", system, Some(service)),
            ("patch", reg, "apiservices", None, Some(apiservice)),
            ("delete", reg, "apiservices", None, Some(apiservice)),
            ("patch", adm, webhooks, None, Some(configuration)),
        ] {
            never.push((verb, group, resource, namespace, name));
        }

        for call in &proxy {
            assert!(
                service_account_may(&proxy_only, *call),
                "{overlay}: {call:?}"
            );
            assert!(
                service_account_may(&with_sync, *call),
                "{overlay} + sync: {call:?}"
            );
        }
        for call in &sync {
            assert!(
                !service_account_may(&proxy_only, *call),
                "{overlay} grants the sync's {call:?} without the sync"
            );
            assert!(
                service_account_may(&with_sync, *call),
                "{overlay} + sync: {call:?}"
            );
        }
        for call in &never {
            assert!(
                !service_account_may(&proxy_only, *call),
                "{overlay}: {call:?}"
            );
            assert!(
                !service_account_may(&with_sync, *call),
                "{overlay} + sync: {call:?}"
            );
        }
    }
    Ok(())
}

/// The Kubernetes endpoints controller's rule: a Service selects the pods of its
/// own namespace whose labels contain every pair of its selector.
fn selects(service: &Value, pod_namespace: &str, pod_labels: &Value) -> bool {
    let Some(selector) = service["spec"]["selector"].as_object() else {
        return false;
    };
    service["metadata"]["namespace"] == pod_namespace
        && !selector.is_empty()
        && selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_ip_overlay_is_highly_available_and_locked_down() -> Result<()> {
    let cluster = test_support::devcluster("deploy-shape").await;
    let docs = documents(&render(&cluster.kubeconfig, "overlays/cluster-ip").await?)?;
    let deployment = find(&docs, "Deployment")?;
    let pod = &deployment["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    assert_eq!(
        deployment["metadata"]["namespace"],
        names::SERVICE_NAMESPACE
    );
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pdb = find(&docs, "PodDisruptionBudget")?;
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert!(pdb["spec"]["selector"]["matchLabels"]
        .as_object()
        .context("pdb selector")?
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v)));
    let anti = &pod["spec"]["affinity"]["podAntiAffinity"];
    assert!(anti.is_object(), "no pod anti-affinity");
    let security = &pod["spec"]["securityContext"];
    assert_eq!(security["runAsNonRoot"], true);
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    assert!(container["resources"]["requests"]["memory"].is_string());
    assert!(container["resources"]["limits"]["memory"].is_string());
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        assert!(container[probe]["httpGet"]["path"].is_string(), "{probe}");
    }
    // The metrics Service selects the same pods.
    let metrics = find(&docs, "Service")?;
    assert!(selects(metrics, names::SERVICE_NAMESPACE, labels));
    // The mounted layout is the one config.yaml names: the target kubeconfig and
    // the serving CA directory `crproxy run` loads from next to its config.
    let config = find(&docs, "ConfigMap")?["data"]["config.yaml"]
        .as_str()
        .context("config.yaml")?
        .to_owned();
    let config: Value = serde_saphyr::from_str(&config)?;
    let args = container["args"].as_array().context("args")?;
    assert_eq!(args.last(), Some(&json!("/etc/crproxy/config.yaml")));
    let mount = &container["volumeMounts"][0];
    assert_eq!(mount["mountPath"], "/etc/crproxy");
    let sources = pod["spec"]["volumes"][0]["projected"]["sources"]
        .as_array()
        .context("projected volume")?;
    let paths: BTreeSet<String> = sources
        .iter()
        .flat_map(|s| {
            ["configMap", "secret"]
                .into_iter()
                .flat_map(move |k| s[k]["items"].as_array().cloned().unwrap_or_default())
        })
        .filter_map(|item| item["path"].as_str().map(|p| format!("/etc/crproxy/{p}")))
        .collect();
    let expected: BTreeSet<String> = [
        "/etc/crproxy/config.yaml".to_owned(),
        config["targets"][0]["kubeconfig"]
            .as_str()
            .context("target kubeconfig")?
            .to_owned(),
        "/etc/crproxy/serving-ca/ca.crt".to_owned(),
        "/etc/crproxy/serving-ca/ca.key".to_owned(),
    ]
    .into();
    assert_eq!(paths, expected);
    assert_eq!(config["proxy"]["registration"]["serviceType"], "ClusterIP");
    let base_port = config["proxy"]["basePort"].as_u64().context("basePort")?;
    assert!(container["ports"]
        .as_array()
        .context("ports")?
        .iter()
        .any(|p| p["containerPort"].as_u64() == Some(base_port)));
    Ok(())
}

/// Plays the endpoints controller for `service`: one ready endpoint per
/// Deployment in the client cluster whose pods the Service selects, pointing at
/// `addr` (the proxy replica that stands in for those pods on this machine).
async fn publish_endpoints(
    api: &kube::Client,
    service: &Value,
    addr: std::net::SocketAddr,
) -> Result<usize> {
    let namespace = service["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let name = service["metadata"]["name"].as_str().unwrap_or_default();
    let deployments = Api::<Deployment>::all(api.clone())
        .list(&ListParams::default())
        .await?;
    let mut selected = 0;
    for deployment in deployments.items {
        let pod_namespace = deployment.metadata.namespace.as_deref().unwrap_or("");
        let pod_labels = deployment
            .spec
            .as_ref()
            .and_then(|spec| spec.template.metadata.as_ref())
            .and_then(|metadata| metadata.labels.clone());
        if !selects(service, pod_namespace, &json!(pod_labels)) {
            continue;
        }
        selected += 1;
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": format!("{name}-{selected}"),
                "namespace": namespace,
                "labels": {"kubernetes.io/service-name": name},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [addr.ip().to_string()], "conditions": {"ready": true}}],
            "ports": [{"name": "https", "protocol": "TCP", "port": addr.port()}],
        });
        let slice: EndpointSlice = serde_json::from_value(slice)?;
        Api::<EndpointSlice>::namespaced(api.clone(), namespace)
            .create(&PostParams::default(), &slice)
            .await?;
    }
    Ok(selected)
}

/// The proxy Service the leader registers, as JSON, once it exists (looked for
/// every 50 ms, `attempts` times).
async fn registered_service(api: &kube::Client, attempts: usize) -> Result<Option<Value>> {
    let services = Api::<Service>::namespaced(api.clone(), names::SERVICE_NAMESPACE);
    let name = names::service_name(devenv::EXAMPLE_GROUP, devenv::EXAMPLE_VERSION);
    for _ in 0..attempts {
        if let Ok(found) = services.get(&name).await {
            return Ok(Some(serde_json::to_value(found)?));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(None)
}

/// The names a PromQL expression uses that look like crproxy metrics.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(start) = rest.find("vcluster_proxy_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// The label names a PromQL expression groups by or matches on.
fn referenced_labels(expr: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    for keyword in ["by (", "without ("] {
        for part in expr.split(keyword).skip(1) {
            let inside = part.split(')').next().unwrap_or_default();
            labels.extend(inside.split(',').map(|l| l.trim().to_owned()));
        }
    }
    for part in expr.split('{').skip(1) {
        let inside = part.split('}').next().unwrap_or_default();
        for matcher in inside.split(',') {
            let key = matcher.split(['=', '!', '~']).next().unwrap_or_default();
            labels.insert(key.trim().to_owned());
        }
    }
    labels.retain(|l| !l.is_empty());
    labels
}

/// Metric families of a Prometheus text exposition, by `# TYPE` line.
fn families(exposition: &str) -> BTreeMap<String, String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
        })
        .collect()
}

/// Whether `name` is a series of a family: counters gain `_total`, histograms
/// `_bucket`, `_sum` and `_count`.
fn exposed(name: &str, families: &BTreeMap<String, String>) -> bool {
    if families.contains_key(name) {
        return true;
    }
    let counter = name
        .strip_suffix("_total")
        .is_some_and(|base| families.get(base).map(String::as_str) == Some("counter"));
    let histogram = ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix)
            .is_some_and(|base| families.get(base).map(String::as_str) == Some("histogram"))
    });
    counter || histogram
}

fn dashboard_expressions() -> Result<Vec<String>> {
    let path = deploy_dir().join("monitoring/crproxy-dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .context("panels")?
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(query) = variable["definition"].as_str() {
            exprs.push(query.to_owned());
        }
    }
    Ok(exprs)
}

#[test]
fn the_dashboard_covers_what_the_issue_asks_for() -> Result<()> {
    let used: BTreeSet<String> = dashboard_expressions()?
        .iter()
        .flat_map(|e| metric_names(e))
        .collect();
    for name in [
        "vcluster_proxy_request_total",
        "vcluster_proxy_request_duration_seconds_bucket",
        "vcluster_proxy_request_terminations_total",
        "vcluster_proxy_peers",
        "vcluster_proxy_peer_cache_synced",
        "vcluster_proxy_peer_list_age_seconds",
        "vcluster_proxy_peer_quarantines_total",
        "vcluster_proxy_target_all_peers_quarantined_total",
        "vcluster_proxy_peer_dial_failures_total",
        "vcluster_proxy_discovery_fallbacks_total",
        "vcluster_proxy_active_watches",
        "vcluster_proxy_watch_events_total",
    ] {
        assert!(used.contains(name), "the dashboard does not show {name}");
    }
    Ok(())
}

/// The issue's registration bug, end to end: the leader registers its ClusterIP
/// Service in kube-system with the code's pod selector; the cluster-ip overlay's
/// Deployment must be what that Service selects, so the API server's aggregation
/// reaches a proxy and the APIService turns Available. Also checks the dashboard
/// against the live metrics of the same proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_ip_registration_reaches_the_overlay_pods() -> Result<()> {
    test_support::init_crypto();
    let dir = tempfile::tempdir()?;
    let root = std::fs::canonicalize(dir.path())?;
    let target = test_support::devcluster("target").await;
    let client = test_support::devcluster("client").await;
    let link = devenv::Link::prepare(LinkSpec {
        dir: root.join("client"),
        client_name: "client".into(),
        client_kubeconfig: client.kubeconfig.clone(),
        target_name: "target".into(),
        target: &target.cluster,
        target_peers: vec![target.cluster.addr()],
        resources: vec![ProxiedResource::example()],
        proxy_port: 0,
        metrics_port: devenv::free_port()?,
    })
    .await?;
    // Registration as the overlay's config.yaml asks for it.
    let config = std::fs::read_to_string(&link.config_path)?;
    let clusterip = config.replace(
        "serviceType: ExternalName\n    externalName: localhost",
        "serviceType: ClusterIP",
    );
    assert_ne!(config, clusterip, "the dev configuration changed shape");
    std::fs::write(&link.config_path, clusterip)?;

    // Install the overlay in the client, as `kubectl apply -k` would (the
    // PodDisruptionBudget needs its stand-in kind).
    install_standins(&client.kubeconfig).await?;
    let rendered = render(&client.kubeconfig, "overlays/cluster-ip").await?;
    let applied = test_support::kubectl_stdin_async(
        &client.kubeconfig,
        &["apply", "-f", "-"],
        &rendered,
        Duration::from_secs(60),
    )
    .await;
    assert!(applied.success(), "apply -k: {}", applied.stderr);

    let replica = link.start_replica().await?;
    let api = devenv::admin_client(&client.cluster)?;
    let service = registered_service(&api, 200)
        .await?
        .context("the leader did not register the Service")?;
    assert_eq!(service["spec"]["type"], "ClusterIP");
    let addr = replica
        .proxy
        .servers
        .first()
        .map(|(_, addr)| *addr)
        .context("no proxy server")?;
    let selected = publish_endpoints(&api, &service, addr).await?;
    assert_eq!(
        selected, 1,
        "the registered Service selects no overlay pods"
    );
    let apiservice = names::apiservice_name(devenv::EXAMPLE_GROUP, devenv::EXAMPLE_VERSION);
    devenv::wait_for_available(
        &devenv::admin_client(&client.cluster)?,
        &apiservice,
        Duration::from_secs(30),
    )
    .await?;
    let list = test_support::kubectl_async(
        &client.kubeconfig,
        &[
            "get",
            "--raw",
            "/apis/example.com/v1/namespaces/default/widgets?limit=1",
        ],
    )
    .await;
    assert!(
        list.success(),
        "list through the APIService: {}",
        list.stderr
    );

    // Every metric the dashboard queries is one this proxy exposes. Counters
    // only appear after their first event, and this quiet proxy has had none of
    // most: those are taken from the same registry code after one event of each
    // kind. Gauges and histograms must be in the live scrape.
    let exposition = fetch(&replica.metrics_url).await?;
    let live = families(&exposition);
    for gauge in ["vcluster_proxy_peers", "vcluster_proxy_peer_cache_synced"] {
        assert!(
            live.contains_key(gauge),
            "live scrape lacks {gauge}:\n{exposition}"
        );
    }
    let evented = counters_after_one_event_each();
    let mut families = live;
    families.extend(self::families(&evented));
    let mut samples = crproxy_core::exposition::parse(&exposition);
    samples.extend(crproxy_core::exposition::parse(&evented));
    // The sync panels' series come from the sync's registry: crproxy-sync's
    // metrics tests check those queries against it.
    let proxy_exprs = dashboard_expressions()?
        .into_iter()
        .filter(|e| !metric_names(e).is_empty());
    for expr in proxy_exprs {
        let mut labels: BTreeSet<String> = ["pod".to_owned()].into();
        for name in metric_names(&expr) {
            assert!(
                exposed(&name, &families),
                "dashboard query uses {name}, not exposed: {expr}"
            );
            labels.extend(
                samples
                    .iter()
                    .filter(|s| s.name == name)
                    .flat_map(|s| s.labels.keys().cloned()),
            );
        }
        // A label the series do not carry would leave the panel empty.
        for label in referenced_labels(&expr) {
            assert!(
                labels.contains(&label),
                "dashboard query uses label {label} its series lack: {expr}"
            );
        }
    }
    replica.stop().await;
    Ok(())
}

/// The exposition of a fresh metrics registry after one event of every counter.
fn counters_after_one_event_each() -> String {
    use crproxy_core::reason::Reason;
    let metrics = crproxy_proxy::metrics::Metrics::new();
    let target = metrics.target("default/target");
    target.request(
        &std::sync::Arc::from("example.com/v1"),
        "list",
        503,
        Reason::NoPeer,
    );
    target.termination(Reason::Deadline);
    target.discovery_fallback("example.com/v1", Reason::NoPeer);
    target.watch_events(1);
    target.peer_quarantined();
    target.all_peers_quarantined();
    target.peer_recovered();
    target.dial_failure(Reason::Timeout);
    target.request_duration("list", 0.1);
    target.dial_duration(0.1);
    metrics.encode_prometheus_text()
}

async fn fetch(url: &str) -> Result<String> {
    let url = url.strip_prefix("http://").context("http URL")?;
    let (host, path) = url.split_once('/').context("URL path")?;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(host).await?;
    stream
        .write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut body)).await??;
    Ok(body)
}

#[test]
fn the_prometheus_rule_carries_exactly_the_tested_rule_files() -> Result<()> {
    let read = |p: &str| -> Result<Value> {
        Ok(serde_saphyr::from_str(&std::fs::read_to_string(
            deploy_dir().join(p),
        )?)?)
    };
    let rule = read("monitoring/prometheusrule.yaml")?;
    let mut groups = Vec::new();
    for file in ["prometheus/alerts.yaml", "prometheus/probe-alerts.yaml"] {
        groups.extend(read(file)?["groups"].as_array().cloned().context(file)?);
    }
    assert_eq!(rule["spec"]["groups"], Value::Array(groups.clone()));

    // Every alert has a promtool test where it fires and one where it stays quiet.
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for entry in std::fs::read_dir(deploy_dir().join("prometheus"))? {
        let path = entry?.path();
        if !path.to_string_lossy().ends_with("_test.yaml") {
            continue;
        }
        let tests: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path)?)?;
        for case in tests["tests"].as_array().into_iter().flatten() {
            for check in case["alert_rule_test"].as_array().into_iter().flatten() {
                let name = check["alertname"].as_str().unwrap_or_default().to_owned();
                let expected = check["exp_alerts"].as_array().map(Vec::len).unwrap_or(0);
                if expected == 0 {
                    quiet.insert(name);
                } else {
                    fires.insert(name);
                }
            }
        }
    }
    for group in &groups {
        for rule in group["rules"].as_array().into_iter().flatten() {
            let Some(alert) = rule["alert"].as_str() else {
                continue;
            };
            assert!(fires.contains(alert), "no promtool test makes {alert} fire");
            assert!(
                quiet.contains(alert),
                "no promtool test keeps {alert} quiet"
            );
        }
    }
    Ok(())
}

/// Runs one of deploy/secrets/*.sh.
async fn script(name: &str, args: &[&str]) -> Result<String> {
    let out = script_output(name, args).await?;
    if !out.status.success() {
        bail!("{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs one of deploy/secrets/*.sh, successful or not.
async fn script_output(name: &str, args: &[&str]) -> Result<std::process::Output> {
    let path = deploy_dir().join("secrets").join(name);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    Ok(tokio::task::spawn_blocking(move || {
        std::process::Command::new("/bin/sh")
            .arg(path)
            .args(&args)
            .output()
    })
    .await??)
}

/// The data of a Secret or ConfigMap in kube-system, decoded.
async fn object_data(
    kubeconfig: &Path,
    kind: &str,
    name: &str,
) -> Result<BTreeMap<String, Vec<u8>>> {
    use base64::Engine as _;
    let object =
        test_support::kubectl_json_async(kubeconfig, &["-n", "kube-system", "get", kind, name])
            .await?;
    let mut out = BTreeMap::new();
    for (key, value) in object["data"].as_object().into_iter().flatten() {
        let text = value.as_str().unwrap_or_default();
        let bytes = if kind == "secret" {
            base64::engine::general_purpose::STANDARD.decode(text)?
        } else {
            text.as_bytes().to_vec()
        };
        out.insert(key.clone(), bytes);
    }
    Ok(out)
}

/// `kubeconfig` (a devcluster's admin kubeconfig) with every cluster's CA given by
/// `ca`: `Some(file)` as `certificate-authority: <file>` (minikube, hand-written
/// kubeconfigs), `None` not at all.
fn with_ca(kubeconfig: &Path, ca: Option<&Path>, out: &Path) -> Result<()> {
    let mut config: Value = serde_saphyr::from_str(&std::fs::read_to_string(kubeconfig)?)
        .context("parsing the kubeconfig")?;
    for cluster in config["clusters"]
        .as_array_mut()
        .context("a kubeconfig with clusters")?
    {
        let cluster = cluster["cluster"]
            .as_object_mut()
            .context("a cluster entry")?;
        cluster.remove("certificate-authority-data");
        if let Some(ca) = ca {
            cluster.insert("certificate-authority".into(), json!(ca));
        }
    }
    // JSON is YAML, and kubectl reads it.
    std::fs::write(out, serde_json::to_string_pretty(&config)?)?;
    Ok(())
}

/// Step 2.3's CA extraction (deploy/secrets/target-ca.sh, which target-identity.sh
/// runs first): an admin kubeconfig naming its CA as a file gives the same ca.crt
/// as one embedding it; one with no CA stops target-identity.sh with one line on
/// stderr before it creates anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_target_ca_comes_from_embedded_and_file_kubeconfigs() -> Result<()> {
    let target = test_support::devcluster("target-ca").await;
    let work = tempfile::tempdir()?;
    let dir = std::fs::canonicalize(work.path())?;
    let path = |p: &Path| p.display().to_string();
    let ca_file = dir.join("target-ca.pem");
    std::fs::write(&ca_file, target.cluster.ca_pem())?;
    let file_ca = dir.join("file-ca.kubeconfig");
    with_ca(&target.kubeconfig, Some(&ca_file), &file_ca)?;
    // kubectl itself trusts the target through the rewritten kubeconfig.
    let reached = test_support::kubectl_async(&file_ca, &["get", "namespaces"]).await;
    assert!(reached.success(), "{}", reached.stderr);

    for (form, kubeconfig) in [("embedded", &target.kubeconfig), ("file", &file_ca)] {
        let out = dir.join(format!("{form}-ca.crt"));
        script("target-ca.sh", &[&path(kubeconfig), &path(&out)]).await?;
        let written = std::fs::read_to_string(&out)?;
        assert!(!written.is_empty(), "{form}: empty ca.crt");
        assert_eq!(written, target.cluster.ca_pem(), "{form}");
    }

    let no_ca = dir.join("no-ca.kubeconfig");
    with_ca(&target.kubeconfig, None, &no_ca)?;
    let identity = dir.join("identity");
    let out = script_output(
        "target-identity.sh",
        &[&path(&no_ca), "p-default", "client", &path(&identity)],
    )
    .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one readable line: {stderr}");
    assert!(
        stderr.contains("no-ca.kubeconfig names no certificate-authority"),
        "{stderr}"
    );
    for file in ["ca.crt", "client.key", "client.csr"] {
        assert!(!identity.join(file).exists(), "{file} written");
    }
    Ok(())
}

/// The walk-through of docs/operations.md, "Deploy on real clusters", on two
/// devclusters with only deploy/'s files: target RBAC from deploy/target, the
/// identity's kubeconfig and the serving CA from deploy/secrets, the Secrets and
/// an overlay in the client. The pod is played by the `crproxy`
/// binary running from exactly what the pod would mount (the ConfigMap and the
/// two Secrets read back from the cluster), with its service account's
/// identity; the only changes are the ones a process outside the cluster needs
/// (loopback addresses, a kubeconfig instead of the in-cluster token). Then
/// `crproxy doctor` is all green, and names the Service (ClusterIP), the target
/// credentials and the peers when they are broken one at a time.
async fn walkthrough(overlay: &str) -> Result<()> {
    test_support::init_crypto();
    let work = tempfile::tempdir()?;
    let work_dir = std::fs::canonicalize(work.path())?;
    let target = test_support::devcluster("target").await;
    let client = test_support::devcluster("client").await;
    let target_admin = devenv::admin_client(&target.cluster)?;
    let client_admin = devenv::admin_client(&client.cluster)?;

    // Target: the CRD, the identity's rights, and the EndpointSlice of its
    // `kubernetes` Service that a real cluster keeps (the peer source).
    devenv::install_crd(&target_admin, &ProxiedResource::example()).await?;
    let rendered = render(&target.kubeconfig, "target").await?;
    let applied = test_support::kubectl_stdin_async(
        &target.kubeconfig,
        &["apply", "-f", "-"],
        &rendered,
        Duration::from_secs(60),
    )
    .await;
    assert!(applied.success(), "target RBAC: {}", applied.stderr);
    let target_slice = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "protocol": "TCP", "port": target.cluster.addr().port()}],
    });
    let target_slices = Api::<EndpointSlice>::namespaced(target_admin.clone(), "default");
    target_slices
        .create(
            &PostParams::default(),
            &serde_json::from_value(target_slice)?,
        )
        .await?;

    // The identity's credentials: a client certificate for
    // loft:vcluster:p-default:client (devcluster signs it; a real target signs
    // the CSR of target-identity.sh), assembled by target-kubeconfig.sh.
    let identity = names::target_identity("p-default", "client");
    let cert = target.cluster.client_cert(&identity, &[])?;
    let secrets = work_dir.join("secrets");
    std::fs::create_dir_all(&secrets)?;
    std::fs::write(secrets.join("target-ca.crt"), target.cluster.ca_pem())?;
    std::fs::write(secrets.join("client.crt"), &cert.cert)?;
    std::fs::write(secrets.join("client.key"), &cert.key)?;
    let target_kubeconfig = secrets.join("target.kubeconfig");
    let path = |p: &Path| p.display().to_string();
    script(
        "target-kubeconfig.sh",
        &[
            &target.cluster.url(),
            &path(&secrets.join("target-ca.crt")),
            &path(&secrets.join("client.crt")),
            &path(&secrets.join("client.key")),
            &identity,
            &path(&target_kubeconfig),
        ],
    )
    .await?;
    let can = test_support::kubectl_async(
        &target_kubeconfig,
        &["auth", "can-i", "list", "widgets.example.com"],
    )
    .await;
    assert_eq!(can.stdout.trim(), "yes", "{}", can.stderr);
    script("serving-ca.sh", &[&path(&secrets.join("serving-ca"))]).await?;

    // Client: the two Secrets, then the overlay.
    for args in [
        vec![
            "-n".to_owned(),
            "kube-system".into(),
            "create".into(),
            "secret".into(),
            "generic".into(),
            "crproxy-target-kubeconfig".into(),
            format!("--from-file=kubeconfig={}", path(&target_kubeconfig)),
        ],
        vec![
            "-n".to_owned(),
            "kube-system".into(),
            "create".into(),
            "secret".into(),
            "generic".into(),
            "crproxy-serving-ca".into(),
            format!(
                "--from-file=ca.crt={}",
                path(&secrets.join("serving-ca/ca.crt"))
            ),
            format!(
                "--from-file=ca.key={}",
                path(&secrets.join("serving-ca/ca.key"))
            ),
        ],
    ] {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = test_support::kubectl_async(&client.kubeconfig, &refs).await;
        assert!(out.success(), "{}", out.stderr);
    }
    install_standins(&client.kubeconfig).await?;
    let rendered = render(&client.kubeconfig, overlay).await?;
    let applied = test_support::kubectl_stdin_async(
        &client.kubeconfig,
        &["apply", "-f", "-"],
        &rendered,
        Duration::from_secs(60),
    )
    .await;
    assert!(applied.success(), "overlay: {}", applied.stderr);

    // The pod's /etc/crproxy, from what the cluster holds.
    let config_map = find(&documents(&rendered)?, "ConfigMap")?["metadata"]["name"]
        .as_str()
        .context("ConfigMap name")?
        .to_owned();
    let etc = work_dir.join("etc-crproxy");
    std::fs::create_dir_all(etc.join("target"))?;
    std::fs::create_dir_all(etc.join("serving-ca"))?;
    let config = object_data(&client.kubeconfig, "configmap", &config_map).await?;
    let target_secret =
        object_data(&client.kubeconfig, "secret", "crproxy-target-kubeconfig").await?;
    let ca_secret = object_data(&client.kubeconfig, "secret", "crproxy-serving-ca").await?;
    std::fs::write(etc.join("target/kubeconfig"), &target_secret["kubeconfig"])?;
    std::fs::write(etc.join("serving-ca/ca.crt"), &ca_secret["ca.crt"])?;
    std::fs::write(etc.join("serving-ca/ca.key"), &ca_secret["ca.key"])?;
    let service_account = client.kubeconfig_for(
        "system:serviceaccount:kube-system:crproxy",
        &[
            "system:serviceaccounts",
            "system:serviceaccounts:kube-system",
        ],
    )?;
    let proxy_port = devenv::free_port()?;
    let metrics_port = devenv::free_port()?;
    // Loopback only (beside-apiserver already listens there).
    let mut text = String::from_utf8(config["config.yaml"].clone())?
        .replace("bindAddress: 0.0.0.0", "bindAddress: 127.0.0.1");
    assert!(text.contains("bindAddress: 127.0.0.1"), "{text}");
    let parsed: Value = serde_saphyr::from_str(&text)?;
    let base_port = parsed["proxy"]["basePort"].as_u64().context("basePort")?;
    let metrics_address = parsed["proxy"]["metricsAddress"]
        .as_str()
        .context("metricsAddress")?
        .to_owned();
    for (from, to) in [
        (
            "  # No kubeconfig: the pod's service account (deploy/base/rbac.yaml) is used.\n"
                .to_owned(),
            format!("  kubeconfig: {}\n", path(&service_account)),
        ),
        (
            format!("basePort: {base_port}"),
            format!("basePort: {proxy_port}"),
        ),
        (
            format!("metricsAddress: {metrics_address}"),
            format!("metricsAddress: 127.0.0.1:{metrics_port}"),
        ),
        (
            "/etc/crproxy/target/kubeconfig".to_owned(),
            path(&etc.join("target/kubeconfig")),
        ),
    ] {
        assert!(text.contains(&from), "config.yaml lost {from:?}");
        text = text.replace(&from, &to);
    }
    std::fs::write(etc.join("config.yaml"), text)?;
    // A write-through webhook configuration that an earlier configuration with a
    // sync left behind: this replica runs no sync, and removes it once no replica
    // leads the sync, with deploy/base's rights alone (a named get and delete, and
    // a read of the sync's Lease).
    let client_name = parsed["client"]["name"]
        .as_str()
        .context("client.name")?
        .to_owned();
    let left_behind = crproxy_sync::writethrough::configuration_name(&client_name);
    let configurations = Api::<ValidatingWebhookConfiguration>::all(client_admin.clone());
    configurations
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": left_behind},
            }))?,
        )
        .await?;
    let log = std::fs::File::create(work_dir.join("crproxy.log"))?;
    let _pod = test_support::KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_crproxy"))
            .args(["run", "--config"])
            .arg(etc.join("config.yaml"))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()?,
    );
    let logs = || std::fs::read_to_string(work_dir.join("crproxy.log")).unwrap_or_default();

    // The leader registers; the endpoints controller's part is played here.
    let service = registered_service(&client_admin, 300)
        .await?
        .with_context(|| format!("no Service registered; logs:\n{}", logs()))?;
    let pod_addr = std::net::SocketAddr::from(([127, 0, 0, 1], proxy_port));
    let cluster_ip = overlay.ends_with("cluster-ip");
    if cluster_ip {
        assert_eq!(service["spec"]["type"], "ClusterIP");
        assert_eq!(
            publish_endpoints(&client_admin, &service, pod_addr).await?,
            1
        );
    } else {
        // Each API server reaches the proxy on its own node.
        assert_eq!(service["spec"]["type"], "ExternalName");
        assert_eq!(service["spec"]["externalName"], "localhost");
    }
    let apiservice = names::apiservice_name(devenv::EXAMPLE_GROUP, devenv::EXAMPLE_VERSION);
    devenv::wait_for_available(&client_admin, &apiservice, Duration::from_secs(30))
        .await
        .with_context(logs)?;
    let mut retired = false;
    for _ in 0..200 {
        if configurations.get_opt(&left_behind).await?.is_none() {
            retired = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(retired, "{left_behind} was left; logs:\n{}", logs());

    // A write through the client lands on the target with the ownership labels.
    let widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w1\n  namespace: default\nspec:\n  size: 1\n";
    let created = test_support::kubectl_stdin_async(
        &client.kubeconfig,
        &["apply", "-f", "-"],
        widget,
        Duration::from_secs(60),
    )
    .await;
    assert!(created.success(), "{}\n{}", created.stderr, logs());
    let widgets = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    );
    let stored = Api::<DynamicObject>::namespaced_with(target_admin.clone(), "default", &widgets)
        .get("w1")
        .await?;
    assert_eq!(
        stored
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get("vcluster.com/owner-vcluster"))
            .map(String::as_str),
        Some("client")
    );

    // The doctor: all green, then each piece broken on purpose.
    let metrics = format!("http://127.0.0.1:{metrics_port}/metrics/syncer");
    let target_path = etc.join("target/kubeconfig");
    let doctor = |client_kubeconfig: PathBuf, target_kubeconfig: PathBuf, metrics: String| async move {
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_crproxy"))
                .arg("doctor")
                .arg("--kubeconfig")
                .arg(client_kubeconfig)
                .arg("--target-kubeconfig")
                .arg(target_kubeconfig)
                .args(["--metrics-url", &metrics, "-o", "json"])
                .output()
        })
        .await??;
        let report: Value = serde_json::from_slice(&out.stdout)?;
        anyhow::Ok((out.status.success(), report))
    };
    let status = |report: &Value, check: &str| -> String {
        report["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["check"] == check && c["group_version"] != "")
            .or_else(|| {
                report["checks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["check"] == check)
            })
            .and_then(|c| c["status"].as_str())
            .unwrap_or("absent")
            .to_owned()
    };
    let run = || {
        doctor(
            client.kubeconfig.clone(),
            target_path.clone(),
            metrics.clone(),
        )
    };
    let (ok, report) = run().await?;
    assert!(ok, "{report:#}");
    assert_eq!(report["status"], "ok", "{report:#}");
    assert_eq!(status(&report, "service"), "ok");

    // 1. The Service loses its endpoints (as when the pods run elsewhere).
    if cluster_ip {
        let kube_system_slices =
            Api::<EndpointSlice>::namespaced(client_admin.clone(), names::SERVICE_NAMESPACE);
        let listed = kube_system_slices.list(&ListParams::default()).await?;
        for slice in listed.items {
            let name = slice.metadata.name.unwrap_or_default();
            kube_system_slices
                .delete(&name, &DeleteParams::default())
                .await?;
        }
        let (ok, report) = run().await?;
        assert!(!ok);
        assert_eq!(status(&report, "service"), "fail", "{report:#}");
        publish_endpoints(&client_admin, &service, pod_addr).await?;
        devenv::wait_for_available(&client_admin, &apiservice, Duration::from_secs(30)).await?;
    }

    // 2. The target no longer grants the identity its rights.
    Api::<ClusterRoleBinding>::all(target_admin.clone())
        .delete("crproxy-client", &DeleteParams::default())
        .await?;
    let (ok, report) = run().await?;
    assert!(!ok);
    assert_eq!(status(&report, "target-rbac"), "fail", "{report:#}");
    assert_eq!(status(&report, "service"), "ok", "{report:#}");
    let restored = test_support::kubectl_stdin_async(
        &target.kubeconfig,
        &["apply", "-f", "-"],
        &render(&target.kubeconfig, "target").await?,
        Duration::from_secs(60),
    )
    .await;
    assert!(restored.success(), "{}", restored.stderr);

    // 3. The target's endpoints disappear: the peer list becomes empty.
    target_slices
        .delete("kubernetes", &DeleteParams::default())
        .await?;
    let mut named = false;
    for _ in 0..100 {
        let (ok, report) = run().await?;
        if !ok && status(&report, "peers") == "fail" {
            assert_eq!(status(&report, "target-credentials"), "ok", "{report:#}");
            named = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(named, "the doctor never named the peers");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walkthrough_cluster_ip_on_two_devclusters() -> Result<()> {
    walkthrough("overlays/cluster-ip").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walkthrough_beside_apiserver_on_two_devclusters() -> Result<()> {
    walkthrough("overlays/beside-apiserver").await
}

/// The write-through Service (deploy/base) has no selector, so only the EndpointSlice
/// the sync's leader writes leads to a Pod; that slice's name and port name are the
/// ones the Service and the Role expect, and the Pods of both overlays expose the
/// webhook port and their IP as the commented sync example in config.yaml uses them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_through_service_leads_only_where_the_leader_points_it() -> Result<()> {
    let cluster = test_support::devcluster("deploy-writethrough").await;
    for (overlay, workload) in [
        ("overlays/cluster-ip", "Deployment"),
        ("overlays/beside-apiserver", "DaemonSet"),
    ] {
        write_through_service_leads_to_the_leader(&cluster.kubeconfig, overlay, workload)
            .await
            .with_context(|| overlay.to_string())?;
    }
    Ok(())
}

async fn write_through_service_leads_to_the_leader(
    kubeconfig: &Path,
    overlay: &str,
    workload: &str,
) -> Result<()> {
    let docs = documents(&render(kubeconfig, overlay).await?)?;
    let named = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .with_context(|| format!("{kind} {name}"))
    };
    let service = named("Service", "crproxy-writethrough")?;
    assert_eq!(service["metadata"]["namespace"], names::SERVICE_NAMESPACE);
    assert!(service["spec"]["selector"].is_null(), "{service}");
    assert_eq!(service["spec"]["ports"][0]["name"], "https");
    assert_eq!(service["spec"]["ports"][0]["port"], 443);
    // The rights to point it at the leader come with the sync component
    // (the_client_rights_are_the_calls_the_code_makes).
    let container = &find(&docs, workload)?["spec"]["template"]["spec"]["containers"][0];
    assert!(container["env"].as_array().context("env")?.iter().any(
        |e| e["name"] == "POD_IP" && e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    ));
    // The commented example, uncommented, is a valid sync section naming that
    // Service and port.
    let plan = example_sync_plan(&docs)?;
    assert_eq!(
        declared_port(container, "writethrough")?,
        plan.write_through.listen.port()
    );
    assert_eq!(
        plan.write_through.endpoint,
        crproxy_core::config::sync::WebhookEndpoint::Service {
            namespace: names::SERVICE_NAMESPACE.into(),
            name: "crproxy-writethrough".into(),
            port: 443
        }
    );
    Ok(())
}

/// The overlay's commented sync example, uncommented, validated as crproxy
/// validates a sync section.
fn example_sync_plan(docs: &[Value]) -> Result<crproxy_core::config::sync::SyncPlan> {
    let uncommented = format!(
        "client: {{name: client, project: default}}\n{}\n",
        sync_example(docs)?.replace("/etc/crproxy/host/kubeconfig", "host.kubeconfig")
    );
    let parsed = crproxy_core::config::parse(&uncommented).map_err(|e| anyhow!("{e}"))?;
    crproxy_core::config::sync::validate(&parsed)
        .map_err(|e| anyhow!("{e:?}"))?
        .context("the example enables a type")
}

/// The number of the container port named `name`.
fn declared_port(container: &Value, name: &str) -> Result<u16> {
    let port = container["ports"]
        .as_array()
        .context("ports")?
        .iter()
        .find(|p| p["name"] == name)
        .with_context(|| format!("no container port named {name}"))?;
    let number = port["containerPort"].as_u64().context("containerPort")?;
    Ok(u16::try_from(number)?)
}

/// Ports that node components commonly hold on a node's own network (the list
/// in docs/operations.md, "Host ports beside the API server"). A pod on the host
/// network that listens on one of them fails at start with `Address already in
/// use`, or keeps the component from starting.
const WELL_KNOWN_HOST_PORTS: &[(u16, &str)] = &[
    (2379, "etcd"),
    (2380, "etcd peers"),
    (2381, "etcd metrics"),
    (4240, "Cilium health"),
    (4244, "Hubble"),
    (6443, "the API server"),
    (8132, "konnectivity"),
    (8133, "konnectivity"),
    (8134, "konnectivity"),
    (9090, "Prometheus, and Cockpit on RHEL-family hosts"),
    (9091, "Calico's Felix metrics"),
    (9099, "Calico's health"),
    (9100, "node-exporter"),
    (9101, "node-exporter's kube-rbac-proxy"),
    (9102, "node-exporter's kube-rbac-proxy"),
    (9443, "admission webhooks on the host network"),
    (9962, "Cilium's agent metrics"),
    (9963, "Cilium's operator metrics"),
    (9964, "Cilium's Envoy metrics"),
    (10248, "the kubelet's health"),
    (10249, "kube-proxy's metrics"),
    (10250, "the kubelet"),
    (10256, "kube-proxy's health"),
    (10257, "kube-controller-manager"),
    (10259, "kube-scheduler"),
];

/// Where the NodePort range starts; Linux's ephemeral ports (from 32768) lie
/// above it, and a loopback connection may hold one of those.
const NODE_PORT_RANGE_START: u16 = 30000;

/// The proxy ports from `proxy.basePort` that docs/operations.md keeps free for
/// group/versions (one each).
const PROXY_PORTS_KEPT_FREE: u16 = 100;

/// Each overlay's pods declare, by name, the ports its config.yaml listens on
/// (metrics, the first proxy port, and the write-through port of the commented
/// sync example); the probes and the metrics Service use the metrics port by
/// name, so they follow the overlay's number. Where the pods share the node's
/// network (beside-apiserver), none of those ports, nor any of the proxy ports
/// kept free for further group/versions, is one that node components commonly
/// hold or lies in the NodePort range, and the metrics and write-through ports
/// are not among the proxy ports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_overlay_declares_the_ports_its_config_listens_on() -> Result<()> {
    let cluster = test_support::devcluster("deploy-ports").await;
    for (overlay, workload, host_network) in [
        ("overlays/cluster-ip", "Deployment", false),
        ("overlays/beside-apiserver", "DaemonSet", true),
    ] {
        let docs = documents(&render(&cluster.kubeconfig, overlay).await?)?;
        let pod = &find(&docs, workload)?["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let config: Value = serde_saphyr::from_str(
            find(&docs, "ConfigMap")?["data"]["config.yaml"]
                .as_str()
                .context("config.yaml")?,
        )?;
        let metrics: std::net::SocketAddr = config["proxy"]["metricsAddress"]
            .as_str()
            .context("metricsAddress")?
            .parse()?;
        let base_port = u16::try_from(config["proxy"]["basePort"].as_u64().context("basePort")?)?;
        let write_through = example_sync_plan(&docs)?.write_through.listen.port();
        let listens = [
            ("metrics", metrics.port()),
            ("proxy-0", base_port),
            ("writethrough", write_through),
        ];
        for (name, port) in listens {
            assert_eq!(declared_port(container, name)?, port, "{overlay}: {name}");
        }
        for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
            assert_eq!(
                container[probe]["httpGet"]["port"], "metrics",
                "{overlay}: {probe}"
            );
        }
        let service = docs
            .iter()
            .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == "crproxy-metrics")
            .context("the crproxy-metrics Service")?;
        assert_eq!(
            service["spec"]["ports"][0]["targetPort"], "metrics",
            "{overlay}"
        );
        assert_eq!(
            pod["hostNetwork"] == true,
            host_network,
            "{overlay}: hostNetwork"
        );
        if !host_network {
            continue;
        }
        let proxy_ports = base_port..base_port + PROXY_PORTS_KEPT_FREE;
        for (name, port) in [("metrics", metrics.port()), ("writethrough", write_through)] {
            assert!(
                !proxy_ports.contains(&port),
                "{overlay}: {name} port {port} is among the proxy ports {proxy_ports:?}"
            );
        }
        let host_ports = proxy_ports
            .map(|port| ("a proxy", port))
            .chain([("metrics", metrics.port()), ("writethrough", write_through)]);
        for (name, port) in host_ports {
            assert!(
                port < NODE_PORT_RANGE_START,
                "{overlay}: {name} port {port} is in the NodePort range"
            );
            if let Some((_, holder)) = WELL_KNOWN_HOST_PORTS.iter().find(|(p, _)| *p == port) {
                panic!("{overlay}: {name} port {port} is commonly held on nodes by {holder}");
            }
        }
    }
    Ok(())
}
