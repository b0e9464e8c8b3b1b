//! `crproxy run --config FILE` as an operator runs it: a separate process that
//! registers itself, serves, and on SIGTERM stops cleanly and hands its lease back.

use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Result};
use tokio::time::Instant;

use crproxy::devenv::{admin_client, condition_status, Link, LinkSpec, ProxiedResource};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_from_a_config_file_and_stops_cleanly_on_sigterm() -> Result<()> {
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
    let client = start("client").await?;
    let target = start("target").await?;
    let client_kubeconfig = dir.path().join("client.kubeconfig");
    std::fs::write(&client_kubeconfig, client.admin_kubeconfig())?;
    let link = Link::prepare(LinkSpec {
        dir: dir.path().join("link"),
        client_name: "client".into(),
        client_kubeconfig,
        target_name: "target".into(),
        target: &target,
        target_peers: vec![target.addr()],
        resource: ProxiedResource::example(),
        proxy_port: 0,
        metrics_port: 0,
        persistent: false,
    })
    .await?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_crproxy"))
        .args(["run", "--config"])
        .arg(&link.config_path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;

    let api = admin_client(&client)?;
    let apiservice = "/apis/apiregistration.k8s.io/v1/apiservices/v1.example.com";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let available = api
            .get(apiservice)
            .await
            .ok()
            .and_then(|a| condition_status(&a, "Available"))
            .as_deref()
            == Some("True");
        if available {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "crproxy run never became Available"
        );
        ensure!(child.try_wait()?.is_none(), "crproxy run exited early");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let listed = api
        .get("/apis/example.com/v1/namespaces/default/widgets")
        .await?;
    assert_eq!(listed["kind"], "WidgetList");

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    ensure!(status.success(), "kill -TERM failed");
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(exit) = child.try_wait()? {
            break exit;
        }
        ensure!(
            Instant::now() < deadline,
            "crproxy run did not stop within 20s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        use std::io::Read;
        let _ = pipe.read_to_string(&mut stderr);
    }
    assert!(exit.success(), "exit {exit:?}: {stderr}");
    assert!(stderr.contains("Starting proxy server"), "{stderr}");
    assert!(stderr.contains("Starting target transport"), "{stderr}");
    // The lease was handed back so another replica can lead at once.
    let lease = api
        .get("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/crproxy-client")
        .await?;
    let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or_default();
    assert!(holder.is_empty(), "lease still held by {holder:?}");
    client.shutdown().await;
    target.shutdown().await;
    Ok(())
}
