//! The `crproxy dev` environment: a target devcluster (with N replica listeners on
//! one store), one or more client devclusters, and one proxy per client wired
//! between them exactly as in production — configuration file, registration by an
//! elected leader, front-proxy trust — so that what the tour shows is what
//! operators get.
//!
//! The end-to-end tests start the same environment through [`DevEnv::start`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use serde_json::{json, Value};

use crproxy_core::names;
use crproxy_proxy::app::RunningProxy;
use crproxy_proxy::metrics::Metrics;

/// The example resource the environment proxies.
pub const EXAMPLE_GROUP: &str = "example.com";
pub const EXAMPLE_VERSION: &str = "v1";
pub const EXAMPLE_PLURAL: &str = "widgets";

/// Options of `crproxy dev` (and of the tests).
#[derive(Clone, Debug)]
pub struct DevOptions {
    pub dir: PathBuf,
    pub clients: usize,
    pub target_replicas: usize,
    /// 0 picks free ports.
    pub target_port: u16,
    pub client_port: u16,
    pub proxy_base_port: u16,
    pub metrics_port: u16,
    /// Keep state in `dir` across restarts (the CLI); tests use in-memory stores.
    pub persistent: bool,
}

/// One client cluster and its proxy.
pub struct DevClient {
    pub name: String,
    pub cluster: devcluster::DevCluster,
    pub kubeconfig: PathBuf,
    pub proxy: RunningProxy,
    pub metrics_url: String,
    pub config_path: PathBuf,
    wiring: crproxy_wiring::WiringHandle,
}

/// A running environment.
pub struct DevEnv {
    pub options: DevOptions,
    pub target: devcluster::DevCluster,
    /// Every listener of the target: the first is `target.addr()`.
    pub target_replicas: Vec<SocketAddr>,
    pub target_kubeconfig: PathBuf,
    pub clients: Vec<DevClient>,
}

impl DevEnv {
    /// Starts everything and waits until each client's APIService is Available.
    pub async fn start(options: DevOptions) -> Result<Self> {
        std::fs::create_dir_all(&options.dir)
            .with_context(|| format!("creating {}", options.dir.display()))?;
        let dir = options.dir.clone();

        let target = devcluster::start(devcluster::DevClusterConfig {
            name: "target".into(),
            data_dir: options.persistent.then(|| dir.join("target")),
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: options.target_port,
        })
        .await
        .context("starting the target devcluster")?;
        let mut target_replicas = vec![target.addr()];
        for i in 1..options.target_replicas.max(1) {
            let port = if options.target_port == 0 {
                0
            } else {
                options.target_port + i as u16
            };
            let addr = target
                .add_listener(port)
                .await
                .with_context(|| format!("starting target replica listener {i}"))?;
            target_replicas.push(addr);
        }
        let target_kubeconfig = dir.join("target.kubeconfig");
        std::fs::write(&target_kubeconfig, target.admin_kubeconfig())
            .with_context(|| format!("writing {}", target_kubeconfig.display()))?;
        let target_admin = admin_client(&target)?;
        install_example_crd(&target_admin).await?;

        let mut clients = Vec::new();
        for index in 0..options.clients.max(1) {
            let client = start_client(&options, index, &target, &target_replicas).await?;
            clients.push(client);
        }
        let env = Self {
            options,
            target,
            target_replicas,
            target_kubeconfig,
            clients,
        };
        env.wait_until_available(Duration::from_secs(30)).await?;
        env.write_dev_json()?;
        Ok(env)
    }

    /// Polls each client's APIService until it reports Available=True.
    pub async fn wait_until_available(&self, limit: Duration) -> Result<()> {
        let name = names::apiservice_name(EXAMPLE_GROUP, EXAMPLE_VERSION);
        for client in &self.clients {
            let api = admin_client(&client.cluster)?;
            let path = format!("/apis/apiregistration.k8s.io/v1/apiservices/{name}");
            let deadline = tokio::time::Instant::now() + limit;
            loop {
                let available = api
                    .get(&path)
                    .await
                    .ok()
                    .and_then(|s| condition_status(&s, "Available"))
                    == Some("True".into());
                if available {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(anyhow!(
                        "APIService {name} in client {} did not become Available within {}s",
                        client.name,
                        limit.as_secs()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Every URL and port, for people and scripts.
    pub fn describe(&self) -> Value {
        let clients: Vec<Value> = self
            .clients
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "api_url": c.cluster.url(),
                    "kubeconfig": c.kubeconfig,
                    "config": c.config_path,
                    "proxy_ports": c.proxy.servers.iter()
                        .map(|(gv, addr)| json!({"group_version": gv, "address": addr.to_string()}))
                        .collect::<Vec<_>>(),
                    "metrics_url": c.metrics_url,
                })
            })
            .collect();
        json!({
            "dir": self.options.dir,
            "target": {
                "api_url": self.target.url(),
                "kubeconfig": self.target_kubeconfig,
                "replicas": self.target_replicas.iter().map(|a| format!("https://{a}")).collect::<Vec<_>>(),
            },
            "clients": clients,
            "client_kubeconfig": self.clients.first().map(|c| c.kubeconfig.clone()),
            "metrics_url": self.clients.first().map(|c| c.metrics_url.clone()),
        })
    }

    fn write_dev_json(&self) -> Result<()> {
        let path = self.options.dir.join("dev.json");
        let text = serde_json::to_string_pretty(&self.describe())?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    }

    /// Stops the proxies first (so their watches end cleanly), then the clusters.
    pub async fn shutdown(self) {
        for client in self.clients {
            client.wiring.stop().await;
            client.proxy.shutdown().await;
            client.cluster.shutdown().await;
        }
        self.target.shutdown().await;
    }
}

async fn start_client(
    options: &DevOptions,
    index: usize,
    target: &devcluster::DevCluster,
    target_replicas: &[SocketAddr],
) -> Result<DevClient> {
    let name = if index == 0 {
        "client".to_string()
    } else {
        format!("client-{}", index + 1)
    };
    let project = "default";
    let project_namespace = "p-default";
    let dir = options.dir.join(&name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let port = if options.client_port == 0 {
        0
    } else {
        options.client_port + index as u16
    };
    let cluster = devcluster::start(devcluster::DevClusterConfig {
        name: name.clone(),
        data_dir: options.persistent.then(|| dir.join("cluster")),
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port,
    })
    .await
    .with_context(|| format!("starting the {name} devcluster"))?;
    let kubeconfig = if index == 0 {
        options.dir.join("client.kubeconfig")
    } else {
        options.dir.join(format!("{name}.kubeconfig"))
    };
    std::fs::write(&kubeconfig, cluster.admin_kubeconfig())
        .with_context(|| format!("writing {}", kubeconfig.display()))?;

    // The client's identity on the target, with just the rights the proxy needs.
    let identity = names::target_identity(project_namespace, &name);
    let token = target
        .issue_token(&identity, &[])
        .context("issuing the client identity's token on the target")?;
    grant_target_access(&admin_client(target)?, &identity).await?;
    let identity_kubeconfig = dir.join("target-identity.kubeconfig");
    std::fs::write(
        &identity_kubeconfig,
        token_kubeconfig("target", &target.url(), &target.ca_pem(), &identity, &token),
    )?;

    let proxy_base_port = if options.proxy_base_port == 0 {
        // The configuration requires a real port (replicas must agree on it), so
        // "any free port" is resolved here.
        free_port()?
    } else {
        options.proxy_base_port + (index as u16) * 10
    };
    let metrics_port = if options.metrics_port == 0 {
        0
    } else {
        options.metrics_port + index as u16
    };
    let peers: Vec<String> = target_replicas.iter().map(|a| a.to_string()).collect();
    let config_path = dir.join("crproxy.yaml");
    std::fs::write(
        &config_path,
        config_yaml(
            &name,
            project,
            project_namespace,
            &kubeconfig,
            &identity_kubeconfig,
            &peers,
            proxy_base_port,
            metrics_port,
        ),
    )?;

    let metrics = Metrics::new();
    let loaded = crate::run::load(&config_path)?;
    let serving = crate::run::serving_identity(&dir.join("serving-ca"), options.persistent)?;
    let setup = crate::run::setup(&loaded, serving.identity.clone(), Arc::clone(&metrics))?;
    let proxy = crproxy_proxy::app::start(setup, true)
        .await
        .with_context(|| format!("starting the proxy for {name}"))?;
    let metrics_url = proxy
        .metrics_addr
        .map(|a| format!("http://{a}/metrics"))
        .unwrap_or_default();
    let wiring = crate::run::start_wiring(&loaded, &proxy, &serving.ca_pem, &name).await?;
    Ok(DevClient {
        name,
        cluster,
        kubeconfig,
        proxy,
        metrics_url,
        config_path,
        wiring,
    })
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

fn admin_client(cluster: &devcluster::DevCluster) -> Result<crproxy_kube::Client> {
    let config = crproxy_kube::Kubeconfig::from_yaml(&cluster.admin_kubeconfig())?;
    let cluster = crproxy_kube::ClusterConfig::from_kubeconfig(&config, None)?;
    Ok(crproxy_kube::Client::new(cluster)?)
}

async fn install_example_crd(target: &crproxy_kube::Client) -> Result<()> {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{EXAMPLE_PLURAL}.{EXAMPLE_GROUP}")},
        "spec": {
            "group": EXAMPLE_GROUP,
            "scope": "Namespaced",
            "names": {"plural": EXAMPLE_PLURAL, "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": EXAMPLE_VERSION,
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                    }
                }}
            }]
        }
    });
    match target
        .create(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            &crd,
        )
        .await
    {
        Ok(_) => {}
        Err(e) if e.is_already_exists() => {}
        Err(e) => return Err(e).context("installing the Widget CRD on the target"),
    }
    let path = format!(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{EXAMPLE_PLURAL}.{EXAMPLE_GROUP}"
    );
    for _ in 0..100 {
        if let Ok(crd) = target.get(&path).await {
            if condition_status(&crd, "Established").as_deref() == Some("True") {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(anyhow!(
        "the Widget CRD did not become Established on the target"
    ))
}

/// What the client identity may do on the target: the proxied resource, and
/// namespaces so the proxy can mirror them.
async fn grant_target_access(target: &crproxy_kube::Client, identity: &str) -> Result<()> {
    let role_name = "crproxy-client";
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": role_name},
        "rules": [
            {"apiGroups": [EXAMPLE_GROUP], "resources": ["*"], "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch", "create"]}
        ]
    });
    create_or_keep(
        target,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        &role,
    )
    .await?;
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("crproxy-client-{}", sanitize(identity))},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": identity}]
    });
    create_or_keep(
        target,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        &binding,
    )
    .await
}

async fn create_or_keep(client: &crproxy_kube::Client, path: &str, object: &Value) -> Result<()> {
    match client.create(path, object).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_already_exists() => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating {path}")),
    }
}

fn sanitize(identity: &str) -> String {
    identity
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect::<String>()
        .to_lowercase()
}

fn condition_status(object: &Value, condition: &str) -> Option<String> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(condition))?
        .get("status")?
        .as_str()
        .map(str::to_string)
}

fn token_kubeconfig(name: &str, server: &str, ca_pem: &str, user: &str, token: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
    });
    // JSON is valid YAML, and kubectl reads it.
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

#[allow(clippy::too_many_arguments)]
fn config_yaml(
    name: &str,
    project: &str,
    project_namespace: &str,
    client_kubeconfig: &Path,
    target_kubeconfig: &Path,
    peers: &[String],
    base_port: u16,
    metrics_port: u16,
) -> String {
    let peers = peers
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "# Written by `crproxy dev`. The same file works with `crproxy run --config`.\n\
client:\n  name: {name}\n  project: {project}\n  projectNamespace: {project_namespace}\n  kubeconfig: {client}\n\
proxy:\n  bindAddress: 127.0.0.1\n  basePort: {base_port}\n  metricsAddress: 127.0.0.1:{metrics_port}\n  registration:\n    serviceType: ExternalName\n    externalName: localhost\n\
targets:\n  - name: target\n    project: {project}\n    kubeconfig: {target}\n    peers:\n      static: [{peers}]\n\
experimental:\n  proxy:\n    customResources:\n      {EXAMPLE_PLURAL}.{EXAMPLE_GROUP}/{EXAMPLE_VERSION}:\n        enabled: true\n        targetVirtualCluster:\n          name: target\n          project: {project}\n        accessResources: owned\n",
        client = client_kubeconfig.display(),
        target = target_kubeconfig.display(),
    )
}
