//! GET a path, or follow a watch, with the credentials kubectl would use, through the
//! kube-rs client this crate builds.
//!
//! ```text
//! cargo run -p crproxy-kube --features kube --example get -- /api/v1/namespaces
//! cargo run -p crproxy-kube --features kube --example get -- --watch /api/v1/namespaces/default/configmaps
//! ```

use anyhow::Context as _;
use crproxy_kube::{kube_client, ClusterConfig};
use futures_util::TryStreamExt as _;
use kube::api::DynamicObject;
use kube::core::WatchEvent;
use serde_json::Value;

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
    let config = ClusterConfig::infer().context("loading cluster config")?;
    let client = kube_client(&config, config.credentials()?, "default")?;
    if watch {
        let separator = if path.contains('?') { '&' } else { '?' };
        let request = http::Request::get(format!("{path}{separator}watch=true")).body(Vec::new())?;
        let events = client.request_events::<DynamicObject>(request).await?;
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.try_next().await? {
            let (kind, object) = match event {
                WatchEvent::Added(o) => ("ADDED", o),
                WatchEvent::Modified(o) => ("MODIFIED", o),
                WatchEvent::Deleted(o) => ("DELETED", o),
                WatchEvent::Bookmark(_) => continue,
                WatchEvent::Error(status) => {
                    return Err(crproxy_kube::Error::from(kube::Error::Api(status)).into())
                }
            };
            println!("{kind} {}", object.metadata.name.as_deref().unwrap_or("?"));
        }
    } else {
        let request = http::Request::get(path).body(Vec::new())?;
        let answer: Value = client
            .request(request)
            .await
            .map_err(crproxy_kube::Error::from)?;
        println!("{}", serde_json::to_string_pretty(&answer)?);
    }
    Ok(())
}
