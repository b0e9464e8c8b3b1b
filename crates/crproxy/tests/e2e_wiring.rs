//! Control-plane wiring end to end: several replicas of one proxy (only the leader
//! registers; leadership moves when it dies and the APIService stays Available),
//! and two clusters proxying each other.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::json;
use tokio::time::Instant;

use crproxy::devenv::{
    self, admin_client, admin_rest_client, condition_status, wait_for_available, DevEnv,
    DevOptions, Link, LinkSpec, ProxiedResource, ReplicaOptions,
};

const APISERVICE: &str = "/apis/apiregistration.k8s.io/v1/apiservices/v1.example.com";
const SERVICE: &str = "/api/v1/namespaces/kube-system/services/proxy-example-com-v1";

async fn available(client: &crproxy_kube::Client, path: &str) -> bool {
    client
        .get(path)
        .await
        .ok()
        .and_then(|s| condition_status(&s, "Available"))
        .as_deref()
        == Some("True")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_registers_and_leadership_moves_when_it_dies() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir()?;
    let mut env = DevEnv::start(DevOptions {
        share_ports: true,
        ..DevOptions::ephemeral(dir.path(), 1, 1)
    })
    .await?;
    let api = admin_rest_client(&env.clients[0].cluster)?;
    let first_is_leader = env.clients[0]
        .replica
        .as_ref()
        .is_some_and(|r| r.is_leader());
    ensure!(first_is_leader, "the first replica must lead");
    let service_rv = api.get(SERVICE).await?["metadata"]["resourceVersion"].clone();

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
    let lease = api
        .get("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/crproxy-client")
        .await?;
    ensure!(
        lease["spec"]["holderIdentity"].is_string(),
        "lease held: {lease}"
    );
    ensure!(
        api.get(SERVICE).await?["metadata"]["resourceVersion"] == service_rv,
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
        if !available(&api, APISERVICE).await {
            unavailable_seen += 1;
        }
        let listed = api
            .get("/apis/example.com/v1/namespaces/default/widgets")
            .await;
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
    let mut apiservice = api.get(APISERVICE).await?;
    apiservice["metadata"]["labels"] = json!({});
    api.replace(APISERVICE, &apiservice).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let current = api.get(APISERVICE).await?;
        if current["metadata"]["labels"]["vcluster.loft.sh/protected"] == "resource-proxy" {
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
    let _ = rustls::crypto::ring::default_provider().install_default();
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
        resource: ProxiedResource::example(),
        proxy_port: 0,
        metrics_port: 0,
        persistent: false,
    })
    .await?;
    let y_to_x = Link::prepare(LinkSpec {
        dir: dir.path().join("y-to-x"),
        client_name: "y".into(),
        client_kubeconfig: y_kubeconfig.clone(),
        target_name: "x".into(),
        target: &x,
        target_peers: vec![x.addr()],
        resource: gadgets.clone(),
        proxy_port: 0,
        metrics_port: 0,
        persistent: false,
    })
    .await?;
    let x_proxy = x_to_y.start_replica().await?;
    let y_proxy = y_to_x.start_replica().await?;
    let x_api = admin_rest_client(&x)?;
    let y_api = admin_rest_client(&y)?;
    wait_for_available(
        &admin_client(&x)?,
        "v1.example.com",
        Duration::from_secs(30),
    )
    .await?;
    wait_for_available(&admin_client(&y)?, "v1.other.io", Duration::from_secs(30)).await?;
    for api in [&x_api, &y_api] {
        api.create(
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "mutual"}}),
        )
        .await?;
    }
    x_api
        .create(
            "/apis/example.com/v1/namespaces/mutual/widgets",
            &json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "from-x"}}),
        )
        .await?;
    y_api
        .create(
            "/apis/other.io/v1/namespaces/mutual/gadgets",
            &json!({"apiVersion": "other.io/v1", "kind": "Gadget", "metadata": {"name": "from-y"}}),
        )
        .await?;
    // Each object is stored on the other cluster, owned by its creator.
    let widget = y_api
        .get("/apis/example.com/v1/namespaces/mutual/widgets/from-x")
        .await?;
    assert_eq!(
        widget["metadata"]["labels"]["vcluster.com/owner-vcluster"],
        "x"
    );
    let gadget = x_api
        .get("/apis/other.io/v1/namespaces/mutual/gadgets/from-y")
        .await?;
    assert_eq!(
        gadget["metadata"]["labels"]["vcluster.com/owner-vcluster"],
        "y"
    );
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
    let _ = rustls::crypto::ring::default_provider().install_default();
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
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir()?;
    let mut env = DevEnv::start(DevOptions::ephemeral(dir.path(), 1, 1)).await?;
    let api = admin_rest_client(&env.clients[0].cluster)?;
    env.clients[0].stop_proxy().await;
    // The availability controller re-checks every 30 s (and on changes).
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let apiservice = api.get(APISERVICE).await?;
        if condition_status(&apiservice, "Available").as_deref() == Some("False") {
            let reason = apiservice["status"]["conditions"][0]["reason"].clone();
            assert_eq!(reason, "FailedDiscoveryCheck", "{apiservice}");
            break;
        }
        ensure!(Instant::now() < deadline, "the APIService stayed Available");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let err = api
        .get("/apis/example.com/v1/namespaces/default/widgets")
        .await
        .expect_err("requests fail while the backend is down");
    assert_eq!(err.status(), Some(503), "{err}");
    env.shutdown().await;
    Ok(())
}
