//! A proxy in owned or all mode in front of a real target (devcluster, over TLS)
//! serving `widgets.example.com`, with a devcluster as the client cluster; shared by the
//! isolation and memory tests.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

use crproxy_core::config::{AccessMode, GroupVersionPlan, ResourceSet, TargetRef};
use crproxy_core::ownership::Owner;
use crproxy_core::pki::CertificateAuthority;
use crproxy_kube::{Auth, Client, ClusterConfig};
use crproxy_proxy::app::{self, ProxySetup, RunningProxy, TargetSetup};
use crproxy_proxy::metrics::Metrics;
use crproxy_proxy::server::ServingIdentity;
use crproxy_proxy::sources::PeerSourceConfig;
use test_support::TestCluster;

pub const WIDGETS: &str = "/apis/example.com/v1/namespaces/demo/widgets";
pub const OWNER_LABELS: &str =
    r#"{"vcluster.com/owner-vcluster":"client","vcluster.com/owner-project":"default"}"#;

const WIDGET_CRD: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1",
  "kind": "CustomResourceDefinition",
  "metadata": {"name": "widgets.example.com"},
  "spec": {
    "group": "example.com",
    "scope": "Namespaced",
    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
    "versions": [{
      "name": "v1", "served": true, "storage": true,
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
      }}},
      "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}
    }]
  }
}"#;

pub struct Harness {
    /// The client cluster (namespaces, front-proxy trust).
    pub _client_api: TestCluster,
    /// Kept so the target lives as long as the test.
    pub _target: TestCluster,
    pub proxy: RunningProxy,
    /// The target's admin, straight to the target.
    pub admin: Client,
    /// The aggregator: presents the front-proxy certificate.
    pub aggregator: Client,
    /// The proxy's metrics registry.
    pub metrics: std::sync::Arc<Metrics>,
}

pub async fn harness(access: AccessMode) -> Harness {
    harness_with_peers(access, |target| {
        PeerSourceConfig::Static(vec![target.to_string()])
    })
    .await
}

/// [`harness`] with the proxy's peers chosen from the target's address.
pub async fn harness_with_peers(
    access: AccessMode,
    peers: impl FnOnce(SocketAddr) -> PeerSourceConfig,
) -> Harness {
    let target = test_support::devcluster("target").await;
    let mut target_config =
        ClusterConfig::new(url::Url::parse(&target.cluster.url()).expect("url"));
    target_config.ca_pem = Some(target.cluster.ca_pem().into_bytes());
    target_config.auth = Auth::Token(target.cluster.admin_token());
    let admin = Client::new(target_config.clone()).expect("admin client");
    admin
        .create(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            &serde_json::from_str(WIDGET_CRD).expect("crd json"),
        )
        .await
        .expect("crd created");
    admin
        .create(
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}}),
        )
        .await
        .expect("namespace created");
    wait_until_served(&admin).await;

    // The client cluster publishes its front-proxy CA in
    // kube-system/extension-apiserver-authentication, as kube-apiserver does.
    let client_api = test_support::devcluster("client").await;
    let front_proxy_client = client_api.cluster.front_proxy_client();
    let mut client_config =
        ClusterConfig::new(url::Url::parse(&client_api.cluster.url()).expect("url"));
    client_config.ca_pem = Some(client_api.cluster.ca_pem().into_bytes());
    client_config.auth = Auth::Token(client_api.cluster.admin_token());
    let client_credentials = client_config.credentials().expect("credentials");
    let client_admin = crproxy_kube::kube_client(
        &client_config,
        std::sync::Arc::clone(&client_credentials),
        "default",
    )
    .expect("client admin");
    let demo: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "demo"}})).expect("namespace");
    kube::Api::all(client_admin)
        .create(&Default::default(), &demo)
        .await
        .expect("namespace created on the client");
    let serving_ca = CertificateAuthority::generate("serving-ca").expect("ca");
    let serving = serving_ca
        .issue_server(&["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
        .expect("serving cert");
    let metrics = Metrics::new();
    let setup = ProxySetup {
        owner: Owner::new("client", "default"),
        plan: vec![GroupVersionPlan {
            group: "example.com".into(),
            version: "v1".into(),
            resources: ResourceSet::Explicit(vec!["widgets".into()]),
            target: TargetRef {
                name: "target".into(),
                project: "default".into(),
            },
            access,
            port: 0,
        }],
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        metrics_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        client: crproxy_kube::kube_client_without_retries(
            &client_config,
            std::sync::Arc::clone(&client_credentials),
            "default",
        )
        .expect("client"),
        client_watches: crproxy_proxy::watches::WatchClient::new(
            &client_config,
            client_credentials,
        )
        .expect("watch client"),
        targets: vec![TargetSetup {
            name: "target".into(),
            project: "default".into(),
            cluster: target_config,
            peers: peers(target.cluster.addr()),
        }],
        serving: ServingIdentity {
            cert_chain_pem: serving.cert.clone(),
            key_pem: serving.key.clone(),
        },
        metrics: std::sync::Arc::clone(&metrics),
        share_ports: false,
        startup_sync_timeout: Duration::from_secs(60),
    };
    let proxy = app::start(setup, true).await.expect("proxy starts");
    let addr = proxy.servers[0].1;
    let mut aggregator =
        ClusterConfig::new(url::Url::parse(&format!("https://{addr}")).expect("url"));
    aggregator.ca_pem = Some(serving_ca.pem().cert.clone().into_bytes());
    aggregator.auth = Auth::ClientCert {
        cert_pem: front_proxy_client.cert.into_bytes(),
        key_pem: front_proxy_client.key.into_bytes(),
    };
    Harness {
        _client_api: client_api,
        _target: target,
        proxy,
        admin,
        aggregator: Client::new(aggregator).expect("aggregator client"),
        metrics,
    }
}

/// The CRD becomes served a moment after it is created (bounded: 10 s).
async fn wait_until_served(admin: &Client) {
    for _ in 0..100 {
        if admin.list(WIDGETS).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("widgets were never served");
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

/// A caller request through the aggregator; `content_type: None` sends none.
pub async fn send(
    h: &Harness,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: impl Into<Bytes>,
) -> Reply {
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("x-remote-user", "alice")
        .header("x-remote-group", "system:authenticated")
        .header("accept", "application/json");
    if let Some(ct) = content_type {
        request = request.header("content-type", ct);
    }
    let request = request.body(body.into()).expect("request");
    // A caller-side failure (the connection broke, the client gave up) is an
    // answer too: status 0 with the error, for the tests to count.
    let response = match h.aggregator.request(request).await {
        Ok(response) => response,
        Err(error) => {
            return Reply {
                status: 0,
                body: json!({"message": error.to_string()}),
            }
        }
    };
    Reply {
        status: response.status().as_u16(),
        body: serde_json::from_slice(response.body()).unwrap_or(Value::Null),
    }
}

pub fn widget(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget",
           "metadata": {"name": name, "namespace": "demo", "labels": labels},
           "spec": {"replicas": 1}})
}
