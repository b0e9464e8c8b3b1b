//! The comparison through a real aggregation layer: the load driver talks to a
//! client API server with a user token, and that server's aggregator forwards
//! `/apis/example.com/v1/...` to the backend of the APIService `v1.example.com`,
//! crproxy in one measurement and nginx in the other — the set-up issue 15 was
//! measured with.
//!
//! Each backend gets its own client devcluster ([`AggregationLayer`]) with the
//! same objects, so the two measurements can be interleaved round by round like
//! the direct comparison without re-pointing an APIService mid-run. The backend
//! is reached the way a real cluster reaches a backend outside it: a Service
//! without a selector and an EndpointSlice naming `127.0.0.1:<port>`.
//!
//! The aggregator presents a front-proxy client certificate. crproxy trusts the
//! front-proxy CA of the dev environment's client cluster (it reads it from that
//! cluster's `extension-apiserver-authentication`), so each layer is started with
//! that cluster's front-proxy client certificate, as an operator configures
//! `--proxy-client-cert-file` on kube-apiserver.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crproxy_core::pki::CertPem;

use crate::driver::{Endpoint, Identity, Protocol};
use crate::workload::{GROUP, VERSION};

/// Namespace and name of the Service the APIService points at.
const SERVICE_NAMESPACE: &str = "default";
const SERVICE_NAME: &str = "crproxy-bench-backend";
/// The user the driver is on the client cluster; the aggregator forwards it in
/// `X-Remote-*`, as the direct crproxy lane sends it itself.
pub const USER: &str = "bench-user";
pub const USER_GROUPS: &[&str] = &["system:masters"];

/// A client devcluster whose APIService `v1.example.com` forwards to one backend.
pub struct AggregationLayer {
    pub cluster: devcluster::DevCluster,
    /// The client API server, as the load driver's user.
    pub endpoint: Arc<Endpoint>,
}

impl AggregationLayer {
    /// Starts the cluster in `dir` presenting `front_proxy_client` to backends,
    /// registers `backend` as the APIService's backend and waits until the
    /// APIService is Available (bounded: 30 s).
    pub async fn start(
        dir: &Path,
        label: &str,
        front_proxy_client: &CertPem,
        backend: SocketAddr,
        protocol: Protocol,
    ) -> Result<Self> {
        // devcluster loads a front-proxy client certificate found in its PKI
        // directory instead of issuing its own.
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).with_context(|| format!("creating {}", pki.display()))?;
        for (file, pem) in [
            ("front-proxy-client.crt", &front_proxy_client.cert),
            ("front-proxy-client.key", &front_proxy_client.key),
        ] {
            let path = pki.join(file);
            std::fs::write(&path, pem).with_context(|| format!("writing {}", path.display()))?;
        }
        let cluster = devcluster::start(devcluster::DevClusterConfig {
            name: label.to_string(),
            data_dir: Some(dir.to_path_buf()),
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
        })
        .await
        .with_context(|| format!("starting the client devcluster {label}"))?;
        let admin = crproxy::devenv::admin_client(&cluster)?;
        for (resource, object) in backend_objects(backend) {
            create_object(&admin, &resource, &object).await?;
        }
        let name = format!("{VERSION}.{GROUP}");
        crproxy::devenv::wait_for_available(&admin, &name, Duration::from_secs(30))
            .await
            .with_context(|| format!("{label}: APIService {name} in front of {backend}"))?;
        let token = cluster
            .issue_token(USER, USER_GROUPS)
            .context("issuing the driver's token on the client devcluster")?;
        let endpoint = Endpoint::new(
            label,
            cluster.addr(),
            Some(&cluster.ca_pem()),
            &Identity::Bearer(token),
            protocol,
        )?;
        Ok(Self {
            cluster,
            endpoint: Arc::new(endpoint),
        })
    }

    pub async fn shutdown(self) {
        self.cluster.shutdown().await;
    }
}

/// The Service (no selector), its EndpointSlice at `backend` and the APIService.
///
/// The APIService skips verifying the backend's serving certificate: crproxy's
/// and nginx's name 127.0.0.1, not `<service>.<namespace>.svc`, and both paths
/// pay the same handshake either way.
pub fn backend_objects(backend: SocketAddr) -> Vec<(kube::api::ApiResource, Value)> {
    let resource = |group: &str, version: &str, kind: &str, plural: &str| kube::api::ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    };
    let address = match backend.ip() {
        IpAddr::V4(_) => "IPv4",
        IpAddr::V6(_) => "IPv6",
    };
    vec![
        (
            resource("", "v1", "Service", "services"),
            json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": SERVICE_NAME, "namespace": SERVICE_NAMESPACE},
                "spec": {"ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": backend.port()}]},
            }),
        ),
        (
            resource("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices"),
            json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": SERVICE_NAME,
                    "namespace": SERVICE_NAMESPACE,
                    "labels": {"kubernetes.io/service-name": SERVICE_NAME},
                },
                "addressType": address,
                "endpoints": [{"addresses": [backend.ip().to_string()], "conditions": {"ready": true}}],
                "ports": [{"name": "https", "port": backend.port(), "protocol": "TCP"}],
            }),
        ),
        (
            resource("apiregistration.k8s.io", "v1", "APIService", "apiservices"),
            json!({
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": format!("{VERSION}.{GROUP}")},
                "spec": {
                    "group": GROUP,
                    "version": VERSION,
                    "service": {"namespace": SERVICE_NAMESPACE, "name": SERVICE_NAME, "port": 443},
                    "insecureSkipTLSVerify": true,
                    "groupPriorityMinimum": 1000,
                    "versionPriority": 15,
                },
            }),
        ),
    ]
}

/// Creates `object` (namespaced when its metadata names a namespace); one that
/// exists already is kept.
pub async fn create_object(
    client: &kube::Client,
    resource: &kube::api::ApiResource,
    object: &Value,
) -> Result<()> {
    let api: kube::Api<kube::api::DynamicObject> = match object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
    {
        Some(ns) => kube::Api::namespaced_with(client.clone(), ns, resource),
        None => kube::Api::all_with(client.clone(), resource),
    };
    let typed: kube::api::DynamicObject = serde_json::from_value(object.clone())?;
    match api
        .create(&kube::api::PostParams::default(), &typed)
        .await
        .map_err(crproxy_kube::Error::from)
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_already_exists() => Ok(()),
        Err(e) => Err(e).with_context(|| {
            format!(
                "creating {} {}",
                resource.kind,
                object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            )
        }),
    }
}

#[cfg(test)]
#[path = "aggregated/tests.rs"]
mod tests;
