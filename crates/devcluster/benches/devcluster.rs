//! A small throughput check of devcluster over real TLS: create, get, list and
//! watch fan-out. `cargo bench -p devcluster --bench devcluster` prints one line
//! per measurement; `DEVCLUSTER_BENCH_N` sets the object count (default 500).

use futures_util::StreamExt;
use serde_json::json;
use std::time::{Duration, Instant};

fn rate(what: &str, n: usize, elapsed: Duration) {
    println!(
        "{what:<40} {n:>6} ops in {:>8.1} ms = {:>9.0} ops/s",
        elapsed.as_secs_f64() * 1000.0,
        n as f64 / elapsed.as_secs_f64().max(1e-9)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let n: usize = std::env::var("DEVCLUSTER_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let cluster = devcluster::start(devcluster::DevClusterConfig::in_memory("bench")).await?;
    let kc = crproxy_kube::Kubeconfig::from_yaml(&cluster.admin_kubeconfig())?;
    let client =
        crproxy_kube::Client::new(crproxy_kube::ClusterConfig::from_kubeconfig(&kc, None)?)?;
    client
        .create(
            "/api/v1/namespaces",
            &json!({"metadata": {"name": "bench"}}),
        )
        .await?;
    let cms = "/api/v1/namespaces/bench/configmaps";

    let start = Instant::now();
    for i in 0..n {
        client
            .create(
                cms,
                &json!({"metadata": {"name": format!("seq-{i}")}, "data": {"k": "v"}}),
            )
            .await?;
    }
    rate("create (sequential)", n, start.elapsed());

    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..8 {
        let client = client.clone();
        let per = n / 8;
        tasks.push(tokio::spawn(async move {
            for i in 0..per {
                let body =
                    json!({"metadata": {"name": format!("par-{t}-{i}")}, "data": {"k": "v"}});
                client.create(cms, &body).await?;
            }
            Ok::<_, crproxy_kube::Error>(per)
        }));
    }
    let mut done = 0;
    for t in tasks {
        done += t.await??;
    }
    rate("create (8 concurrent clients)", done, start.elapsed());

    let start = Instant::now();
    for i in 0..n {
        client.get(&format!("{cms}/seq-{i}")).await?;
    }
    rate("get", n, start.elapsed());

    let lists = 20;
    let start = Instant::now();
    let mut items = 0;
    for _ in 0..lists {
        let list = client.list(cms).await?;
        items = list["items"].as_array().map(Vec::len).unwrap_or(0);
    }
    rate(&format!("list of {items} objects"), lists, start.elapsed());

    // Watch fan-out: W watchers all see E events.
    let (watchers, events) = (50, 100);
    let list = client.list(cms).await?;
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("0")
        .to_string();
    let mut handles = Vec::new();
    for _ in 0..watchers {
        let stream = client
            .watch(&format!("{cms}?resourceVersion={rv}&timeoutSeconds=60"))
            .await?;
        handles.push(tokio::spawn(async move {
            let mut stream = Box::pin(stream);
            let mut seen = 0;
            while seen < events {
                match tokio::time::timeout(Duration::from_secs(30), stream.next()).await {
                    Ok(Some(Ok(_))) => seen += 1,
                    _ => break,
                }
            }
            seen
        }));
    }
    let start = Instant::now();
    for i in 0..events {
        client
            .create(cms, &json!({"metadata": {"name": format!("w-{i}")}}))
            .await?;
    }
    let mut delivered = 0;
    for h in handles {
        delivered += h.await?;
    }
    rate(
        &format!("watch fan-out ({watchers} watchers x {events} events)"),
        delivered,
        start.elapsed(),
    );
    anyhow::ensure!(delivered == watchers * events, "lost events: {delivered}");
    cluster.shutdown().await;
    Ok(())
}
