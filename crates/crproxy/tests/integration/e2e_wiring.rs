//! Control-plane wiring end to end: several replicas of one proxy (only the leader
//! registers; leadership moves when it dies and the APIService stays Available),
//! and two clusters proxying each other.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::json;
use tokio::time::Instant;

use crproxy::devenv::{
    self, wait_for_available, DevEnv, DevOptions, Link, LinkSpec, ProxiedResource, ReplicaOptions,
};

const APISERVICE: &str = "v1.example.com";
const SERVICE: &str = "proxy-example-com-v1";

/// An admin client that does not retry: every failed request counts here.
fn admin(cluster: &devcluster::DevCluster) -> Result<kube::Client> {
    devenv::admin_client_without_retries(cluster)
}

/// The `Available` condition of an APIService: its status and reason.
fn availability(apiservice: &APIService) -> Option<(String, String)> {
    let conditions = apiservice.status.as_ref()?.conditions.as_ref()?;
    let available = conditions.iter().find(|c| c.type_ == "Available")?;
    Some((
        available.status.clone(),
        available.reason.clone().unwrap_or_default(),
    ))
}

async fn available(apiservices: &Api<APIService>, name: &str) -> bool {
    let apiservice = apiservices.get(name).await.ok();
    apiservice
        .as_ref()
        .and_then(availability)
        .is_some_and(|(status, _)| status == "True")
}

/// A namespaced custom resource of `group/v1`, read as a dynamic object.
fn custom(
    client: &kube::Client,
    group: &str,
    kind: &str,
    plural: &str,
    ns: &str,
) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, "v1", kind);
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_registers_and_leadership_moves_when_it_dies() -> Result<()> {
    crproxy_kube::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let mut env = DevEnv::start(DevOptions {
        share_ports: true,
        ..DevOptions::ephemeral(dir.path(), 1, 1)
    })
    .await?;
    let api = admin(&env.clients[0].cluster)?;
    let apiservices = Api::<APIService>::all(api.clone());
    let services = Api::<Service>::namespaced(api.clone(), "kube-system");
    let widgets = custom(&api, "example.com", "Widget", "widgets", "default");
    let first_is_leader = env.clients[0]
        .replica
        .as_ref()
        .is_some_and(|r| r.is_leader());
    ensure!(first_is_leader, "the first replica must lead");
    let service_rv = services.get(SERVICE).await?.metadata.resource_version;

    // A second replica of the same proxy: serves on the same port, does not lead.
    let second = env.clients[0]
        .link
        .start_replica_with(ReplicaOptions {
            share_ports: true,
            metrics_address: Some(format!("127.0.0.1:{}", devenv::free_port()?)),
        })
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(
        !second.is_leader(),
        "a second replica must not lead while the first lives"
    );
    let lease = Api::<Lease>::namespaced(api.clone(), "kube-system")
        .get("crproxy-client")
        .await?;
    ensure!(
        lease
            .spec
            .as_ref()
            .is_some_and(|s| s.holder_identity.is_some()),
        "lease held: {lease:?}"
    );
    ensure!(
        services.get(SERVICE).await?.metadata.resource_version == service_rv,
        "the follower must not write the registration objects"
    );

    // The leader crashes (its lease is not handed back).
    let first = env.clients[0].replica.take().context("first replica")?;
    first.crash().await;
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut unavailable_seen = 0;
    let mut failed_requests = 0;
    while !second.is_leader() {
        ensure!(
            Instant::now() < deadline,
            "leadership did not move within 40s"
        );
        if !available(&apiservices, APISERVICE).await {
            unavailable_seen += 1;
        }
        let listed = widgets.list(&ListParams::default()).await;
        if listed.is_err() {
            failed_requests += 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        unavailable_seen, 0,
        "the APIService must stay Available during takeover"
    );
    assert_eq!(
        failed_requests, 0,
        "requests must keep working through the survivor"
    );

    // The new leader repairs drift: the protection label comes back.
    let mut apiservice = apiservices.get(APISERVICE).await?;
    apiservice.metadata.labels = Some(Default::default());
    apiservices
        .replace(APISERVICE, &PostParams::default(), &apiservice)
        .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let current = apiservices.get(APISERVICE).await?;
        let protected = current
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get("vcluster.loft.sh/protected"))
            .is_some_and(|value| value == "resource-proxy");
        if protected {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the new leader did not repair the APIService"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    second.stop().await;
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_can_proxy_each_other() -> Result<()> {
    crproxy_kube::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let start = |name: &str| {
        devcluster::start(devcluster::DevClusterConfig {
            name: name.into(),
            data_dir: None,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
        })
    };
    let x = start("x").await?;
    let y = start("y").await?;
    let x_kubeconfig = dir.path().join("x.kubeconfig");
    let y_kubeconfig = dir.path().join("y.kubeconfig");
    std::fs::write(&x_kubeconfig, x.admin_kubeconfig())?;
    std::fs::write(&y_kubeconfig, y.admin_kubeconfig())?;
    let gadgets = ProxiedResource {
        group: "other.io".into(),
        version: "v1".into(),
        plural: "gadgets".into(),
        kind: "Gadget".into(),
    };
    // x uses widgets stored on y; y uses gadgets stored on x.
    let x_to_y = Link::prepare(LinkSpec {
        dir: dir.path().join("x-to-y"),
        client_name: "x".into(),
        client_kubeconfig: x_kubeconfig.clone(),
        target_name: "y".into(),
        target: &y,
        target_peers: vec![y.addr()],
        resources: vec![ProxiedResource::example()],
        proxy_port: 0,
        metrics_port: 0,
    })
    .await?;
    let y_to_x = Link::prepare(LinkSpec {
        dir: dir.path().join("y-to-x"),
        client_name: "y".into(),
        client_kubeconfig: y_kubeconfig.clone(),
        target_name: "x".into(),
        target: &x,
        target_peers: vec![x.addr()],
        resources: vec![gadgets.clone()],
        proxy_port: 0,
        metrics_port: 0,
    })
    .await?;
    let x_proxy = x_to_y.start_replica().await?;
    let y_proxy = y_to_x.start_replica().await?;
    let x_api = admin(&x)?;
    let y_api = admin(&y)?;
    wait_for_available(&x_api, "v1.example.com", Duration::from_secs(30)).await?;
    wait_for_available(&y_api, "v1.other.io", Duration::from_secs(30)).await?;
    let post = PostParams::default();
    for api in [&x_api, &y_api] {
        let mutual: Namespace = serde_json::from_value(json!({"metadata": {"name": "mutual"}}))?;
        Api::<Namespace>::all(api.clone())
            .create(&post, &mutual)
            .await?;
    }
    let widget: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "from-x"}}),
    )?;
    custom(&x_api, "example.com", "Widget", "widgets", "mutual")
        .create(&post, &widget)
        .await?;
    let gadget: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "other.io/v1", "kind": "Gadget", "metadata": {"name": "from-y"}}),
    )?;
    custom(&y_api, "other.io", "Gadget", "gadgets", "mutual")
        .create(&post, &gadget)
        .await?;
    // Each object is stored on the other cluster, owned by its creator.
    let owner = |object: &DynamicObject| {
        object
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get("vcluster.com/owner-vcluster").cloned())
    };
    let widget = custom(&y_api, "example.com", "Widget", "widgets", "mutual")
        .get("from-x")
        .await?;
    assert_eq!(owner(&widget).as_deref(), Some("x"));
    let gadget = custom(&x_api, "other.io", "Gadget", "gadgets", "mutual")
        .get("from-y")
        .await?;
    assert_eq!(owner(&gadget).as_deref(), Some("y"));
    // The two directions are told apart by the target label.
    let x_metrics = scrape(&x_proxy.metrics_url).await?;
    let y_metrics = scrape(&y_proxy.metrics_url).await?;
    assert!(
        x_metrics.contains("vcluster_proxy_request_total{target=\"default/y\""),
        "{x_metrics}"
    );
    assert!(
        y_metrics.contains("vcluster_proxy_request_total{target=\"default/x\""),
        "{y_metrics}"
    );
    x_proxy.stop().await;
    y_proxy.stop().await;
    x.shutdown().await;
    y.shutdown().await;
    Ok(())
}

async fn scrape(url: &str) -> Result<String> {
    let url = url.to_string();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-s", &url])
            .output()
    })
    .await??;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_objects_cannot_be_deleted_but_can_be_updated() -> Result<()> {
    crproxy_kube::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let env = DevEnv::start(DevOptions::ephemeral(dir.path(), 1, 1)).await?;
    let kubeconfig = &env.clients[0].kubeconfig;
    let denied = "deletion of vCluster-protected resources is denied; remove the corresponding entry from your vCluster configuration";
    for args in [
        vec!["delete", "apiservice", "v1.example.com"],
        vec![
            "-n",
            "kube-system",
            "delete",
            "service",
            "proxy-example-com-v1",
        ],
    ] {
        let out = test_support::kubectl_async(kubeconfig, &args).await;
        assert!(!out.success(), "{args:?} must be denied");
        assert!(out.stderr.contains(denied), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("ValidatingAdmissionPolicy 'vcluster-protected-apiservices' with binding 'vcluster-protected-resource-proxy' denied request"),
            "{}",
            out.stderr
        );
    }
    let update = test_support::kubectl_async(
        kubeconfig,
        &["annotate", "apiservice", "v1.example.com", "team=platform"],
    )
    .await;
    assert!(update.success(), "updates stay allowed: {}", update.stderr);
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_backend_turns_the_apiservice_unavailable_and_requests_503() -> Result<()> {
    crproxy_kube::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let mut env = DevEnv::start(DevOptions::ephemeral(dir.path(), 1, 1)).await?;
    let api = admin(&env.clients[0].cluster)?;
    let apiservices = Api::<APIService>::all(api.clone());
    env.clients[0].stop_proxy().await;
    // The availability controller re-checks every 30 s (and on changes).
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let apiservice = apiservices.get(APISERVICE).await?;
        if let Some((status, reason)) = availability(&apiservice) {
            if status == "False" {
                assert_eq!(reason, "FailedDiscoveryCheck", "{apiservice:?}");
                break;
            }
        }
        ensure!(Instant::now() < deadline, "the APIService stayed Available");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let err = custom(&api, "example.com", "Widget", "widgets", "default")
        .list(&ListParams::default())
        .await
        .expect_err("requests fail while the backend is down");
    let err = crproxy_kube::Error::from(err);
    assert_eq!(err.status(), Some(503), "{err}");
    env.shutdown().await;
    Ok(())
}
