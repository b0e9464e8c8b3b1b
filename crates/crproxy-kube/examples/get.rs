//! GET a path, or follow a watch, with the credentials kubectl would use.
//!
//! ```text
//! cargo run -p crproxy-kube --example get -- /api/v1/namespaces
//! cargo run -p crproxy-kube --example get -- --watch /api/v1/namespaces/default/configmaps
//! ```

use anyhow::Context as _;
use crproxy_kube::{Client, ClusterConfig};
use futures_util::StreamExt as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let watch = args.first().is_some_and(|a| a == "--watch");
    if watch {
        args.remove(0);
    }
    let path = args
        .first()
        .cloned()
        .unwrap_or_else(|| "/version".to_owned());
    let client = Client::new(ClusterConfig::infer().context("loading cluster config")?)?;
    if watch {
        let mut events = Box::pin(client.watch(&path).await?);
        while let Some(ev) = events.next().await {
            let ev = ev?;
            let name = ev.object["metadata"]["name"].as_str().unwrap_or("?");
            println!("{} {name}", ev.event_type);
        }
    } else {
        let v = client.get(&path).await?;
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}
