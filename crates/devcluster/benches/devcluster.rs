//! A small throughput check of devcluster over real TLS: create, get, list and
//! watch fan-out (full objects and metadata only). `cargo bench -p devcluster
//! --bench devcluster` prints one line per measurement; `DEVCLUSTER_BENCH_N` sets
//! the object count (default 500).

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, ObjectMeta, PostParams, WatchParams};
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
    crproxy_kube::install_crypto_provider();
    let n: usize = std::env::var("DEVCLUSTER_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let cluster = devcluster::start(devcluster::DevClusterConfig::in_memory("bench")).await?;
    let kc = crproxy_kube::Kubeconfig::from_yaml(&cluster.admin_kubeconfig())?;
    let config = crproxy_kube::ClusterConfig::from_kubeconfig(&kc, None)?;
    let client = crproxy_kube::kube_client(&config, config.credentials()?, "bench")?;
    let post = PostParams::default();
    Api::<Namespace>::all(client.clone())
        .create(&post, &named("bench"))
        .await?;
    let cms = Api::<ConfigMap>::namespaced(client, "bench");

    let start = Instant::now();
    for i in 0..n {
        cms.create(&post, &config_map(format!("seq-{i}"))).await?;
    }
    rate("create (sequential)", n, start.elapsed());

    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..8 {
        let cms = cms.clone();
        let post = post.clone();
        let per = n / 8;
        tasks.push(tokio::spawn(async move {
            for i in 0..per {
                cms.create(&post, &config_map(format!("par-{t}-{i}")))
                    .await?;
            }
            Ok::<_, kube::Error>(per)
        }));
    }
    let mut done = 0;
    for t in tasks {
        done += t.await??;
    }
    rate("create (8 concurrent clients)", done, start.elapsed());

    let start = Instant::now();
    for i in 0..n {
        cms.get(&format!("seq-{i}")).await?;
    }
    rate("get", n, start.elapsed());

    let lists = 20;
    let start = Instant::now();
    let mut items = 0;
    for _ in 0..lists {
        items = cms.list(&ListParams::default()).await?.items.len();
    }
    rate(&format!("list of {items} objects"), lists, start.elapsed());

    // Watch fan-out: W watchers all see E events, as full objects and as
    // metadata only (PartialObjectMetadata, what metadata informers and crproxy's
    // ownership cache open), where every event is rendered for each watcher.
    fan_out(&cms, WatchKind::Full, 50, 100).await?;
    fan_out(&cms, WatchKind::Metadata, 50, 100).await?;
    cluster.shutdown().await;
    Ok(())
}

/// What a fan-out's watchers ask for.
#[derive(Clone, Copy, PartialEq)]
enum WatchKind {
    Full,
    Metadata,
}

/// `watchers` watches of `cms` from its current resourceVersion, then `events`
/// creates, each of which every watcher must receive.
async fn fan_out(
    cms: &Api<ConfigMap>,
    kind: WatchKind,
    watchers: usize,
    events: usize,
) -> anyhow::Result<()> {
    let list = cms.list(&ListParams::default()).await?;
    let rv = list
        .metadata
        .resource_version
        .unwrap_or_else(|| "0".to_owned());
    let params = WatchParams::default().timeout(60);
    let mut handles = Vec::new();
    for _ in 0..watchers {
        handles.push(match kind {
            WatchKind::Full => count_events(cms.watch(&params, &rv).await?, events),
            WatchKind::Metadata => count_events(cms.watch_metadata(&params, &rv).await?, events),
        });
    }
    let (what, prefix) = match kind {
        WatchKind::Full => ("watch fan-out", "w"),
        WatchKind::Metadata => ("metadata watch fan-out", "m"),
    };
    let start = Instant::now();
    for i in 0..events {
        cms.create(&PostParams::default(), &config_map(format!("{prefix}-{i}")))
            .await?;
    }
    let mut delivered = 0;
    for h in handles {
        delivered += h.await?;
    }
    rate(
        &format!("{what} ({watchers} x {events})"),
        delivered,
        start.elapsed(),
    );
    anyhow::ensure!(
        delivered == watchers * events,
        "{what}: lost events: {delivered}"
    );
    Ok(())
}

/// Counts up to `events` events of a watch, waiting at most 30 s for each.
fn count_events<T: Send + 'static, E: Send + 'static>(
    stream: impl futures_util::Stream<Item = Result<T, E>> + Send + 'static,
    events: usize,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut stream = Box::pin(stream);
        let mut seen = 0;
        while seen < events {
            match tokio::time::timeout(Duration::from_secs(30), stream.next()).await {
                Ok(Some(Ok(_))) => seen += 1,
                _ => break,
            }
        }
        seen
    })
}

fn config_map(name: String) -> ConfigMap {
    let mut config_map: ConfigMap = named(&name);
    config_map.data = Some([("k".to_owned(), "v".to_owned())].into());
    config_map
}

/// An object with only a name, of any type with metadata.
fn named<K: kube::Resource + Default>(name: &str) -> K {
    let mut object = K::default();
    *object.meta_mut() = ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    };
    object
}
