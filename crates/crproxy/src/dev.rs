//! `crproxy dev` and `crproxy devcluster`.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crproxy::devenv::{DevEnv, DevOptions};

#[derive(Args, Debug)]
pub struct DevArgs {
    /// Where kubeconfigs, dev.json and cluster state are written.
    #[arg(long, default_value = ".crproxy/dev")]
    dir: PathBuf,
    /// Client clusters sharing the one target.
    #[arg(long, default_value_t = 1, value_parser = count)]
    clients: usize,
    /// Listeners the target serves its one store on; each is a peer.
    #[arg(long, default_value_t = 1, value_parser = count)]
    target_replicas: usize,
    /// First target listener port (replicas take the next ones).
    #[arg(long, default_value_t = 7443)]
    target_port: u16,
    /// First client API port (further clients take the next ones).
    #[arg(long, default_value_t = 6443)]
    client_port: u16,
    /// First proxy port; each further client starts 10 higher.
    #[arg(long, default_value_t = 9100)]
    proxy_port: u16,
    /// Metrics port of the first client's proxy; further clients take the next ones.
    #[arg(long, default_value_t = 9090)]
    metrics_port: u16,
    /// API port of the `host` cluster the custom resource sync runs against.
    #[arg(long, default_value_t = 8443)]
    host_port: u16,
    /// Metrics port of the custom resource sync (`/metrics/syncer`).
    #[arg(long, default_value_t = 9190)]
    sync_metrics_port: u16,
}

/// `--clients` and `--target-replicas`: how many, at least one (there is no
/// environment without a client or a target listener).
fn count(value: &str) -> std::result::Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be 1 or more".to_owned()),
        Ok(count) => Ok(count),
        Err(error) => Err(error.to_string()),
    }
}

pub async fn run(args: DevArgs) -> Result<()> {
    let signals = crproxy::run::StopSignals::catch();
    let env = DevEnv::start(DevOptions {
        dir: args.dir.clone(),
        clients: args.clients,
        target_replicas: args.target_replicas,
        target_port: args.target_port,
        client_port: args.client_port,
        proxy_base_port: args.proxy_port,
        metrics_port: args.metrics_port,
        host_port: args.host_port,
        sync_metrics_port: args.sync_metrics_port,
        persistent: true,
        share_ports: false,
    })
    .await?;
    let sync = crproxy::devsync::start_for(&env).await?;
    print_tour(&env);
    crproxy::devsync::print_tour(&env, &sync);
    signals.wait().await;
    println!("\nstopping: the sync and proxies first, then the clusters");
    sync.shutdown().await;
    env.shutdown().await;
    Ok(())
}

fn print_tour(env: &DevEnv) {
    let dir = env.options.dir.display();
    let described = env.describe();
    println!("crproxy dev is up. Everything is in {dir}:");
    for client in &env.clients {
        let file = kubeconfig_name(&client.kubeconfig);
        println!(
            "  {file:<20} the {} cluster (where callers work)",
            client.name
        );
    }
    let target = kubeconfig_name(&env.target_kubeconfig);
    println!("  {target:<20} the target cluster (where objects are stored)");
    println!("  {:<20} every URL and port", "dev.json");
    println!();
    println!("  target API:  {}", env.target.url());
    for addr in &env.target_replicas {
        println!("  target peer: https://{addr}");
    }
    for client in &env.clients {
        println!("  {} API: {}", client.name, client.cluster.url());
        for (gv, addr) in client
            .proxy()
            .map(|p| p.servers.as_slice())
            .unwrap_or_default()
        {
            println!("  {} proxy for {gv}: https://{addr}", client.name);
        }
        println!("  {} metrics: {}", client.name, client.metrics_url());
    }
    let metrics = described["metrics_url"].as_str().unwrap_or("");
    println!(
        r#"
Try it:
  export KUBECONFIG={dir}/client.kubeconfig
  kubectl get apiservice v1.example.com
  kubectl api-resources --api-group=example.com
  kubectl create namespace demo
  kubectl -n demo create -f - <<'EOF'
apiVersion: example.com/v1
kind: Widget
metadata: {{name: hello}}
spec: {{size: 3}}
EOF
  kubectl -n demo get widgets
  kubectl --kubeconfig {dir}/target.kubeconfig -n demo get widgets --show-labels
  curl -s {metrics} | grep vcluster_proxy_request_total
  kubectl delete apiservice v1.example.com     # denied: the proxy objects are protected"#
    );
}

/// The file name of a kubeconfig the environment wrote (the banner names the
/// directory once).
fn kubeconfig_name(path: &std::path::Path) -> String {
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// `crproxy devcluster`: one API server until Ctrl-C.
pub async fn run_devcluster(data_dir: PathBuf, port: u16, name: String) -> Result<()> {
    let signals = crproxy::run::StopSignals::catch();
    let cluster = devcluster::start(devcluster::DevClusterConfig {
        name,
        data_dir: Some(data_dir.clone()),
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port,
    })
    .await
    .with_context(|| format!("starting devcluster in {}", data_dir.display()))?;
    println!("devcluster serving at {}", cluster.url());
    println!(
        "kubeconfig: {}",
        data_dir.join("admin.kubeconfig").display()
    );
    signals.wait().await;
    cluster.shutdown().await;
    Ok(())
}
