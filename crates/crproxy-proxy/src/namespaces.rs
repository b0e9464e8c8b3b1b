//! Which namespaces exist on the client cluster, kept current by a watch.
//!
//! Every namespaced write must first confirm that its namespace exists on the
//! client. Asking the client API server each time would add a round trip to every
//! write; a list-then-watch cache answers from memory. Until the cache has synced
//! (or while its watch is re-established) it answers "unknown" and the caller asks
//! the API server directly, so a cold or broken cache costs latency, never
//! correctness.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;

/// The client's namespaces, as last seen by the watch.
#[derive(Debug, Default)]
pub struct ClientNamespaces {
    state: RwLock<CacheState>,
}

#[derive(Debug, Default)]
struct CacheState {
    synced: bool,
    names: HashSet<String>,
}

impl ClientNamespaces {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// `Some(exists)` when the cache is in sync with the client, `None` when the
    /// caller must ask the API server.
    pub fn exists(&self, namespace: &str) -> Option<bool> {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        state.synced.then(|| state.names.contains(namespace))
    }

    fn replace_all(&self, names: HashSet<String>) {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        state.names = names;
        state.synced = true;
    }

    fn apply(&self, event_type: &str, name: &str) {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        match event_type {
            "ADDED" | "MODIFIED" => {
                state.names.insert(name.to_string());
            }
            "DELETED" => {
                state.names.remove(name);
            }
            _ => {}
        }
    }

    fn unsync(&self) {
        self.state.write().unwrap_or_else(|p| p.into_inner()).synced = false;
    }

    /// Keeps the cache in step with the client cluster: list, then watch from the
    /// list's resourceVersion; on any interruption mark it unsynced and start over.
    pub fn spawn_sync(
        self: &Arc<Self>,
        client: crproxy_kube::Client,
    ) -> tokio::task::JoinHandle<()> {
        let cache = Arc::clone(self);
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(200);
            loop {
                match cache.sync_once(&client).await {
                    Ok(()) => backoff = Duration::from_millis(200),
                    Err(error) => {
                        tracing::debug!(%error, "client namespace watch interrupted; re-listing");
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                }
                cache.unsync();
                tokio::time::sleep(backoff).await;
            }
        })
    }

    async fn sync_once(&self, client: &crproxy_kube::Client) -> Result<(), crproxy_kube::Error> {
        let list = client.list("/api/v1/namespaces").await?;
        let names = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(name_of)
            .map(str::to_string)
            .collect();
        self.replace_all(names);
        let resource_version = list
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("0");
        let mut events = Box::pin(
            client
                .watch(&format!(
                    "/api/v1/namespaces?watch=true&allowWatchBookmarks=true&resourceVersion={resource_version}"
                ))
                .await?,
        );
        while let Some(event) = events.next().await {
            let event = event?;
            if let Some(name) = name_of(&event.object) {
                self.apply(&event.event_type, name);
            }
        }
        Ok(())
    }
}

fn name_of(object: &Value) -> Option<&str> {
    object.pointer("/metadata/name").and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_until_synced_then_follows_events() {
        let cache = ClientNamespaces::new();
        assert_eq!(cache.exists("a"), None);
        cache.replace_all(HashSet::from(["a".to_string()]));
        assert_eq!(cache.exists("a"), Some(true));
        assert_eq!(cache.exists("b"), Some(false));
        cache.apply("ADDED", "b");
        cache.apply("DELETED", "a");
        assert_eq!(cache.exists("a"), Some(false));
        assert_eq!(cache.exists("b"), Some(true));
        cache.unsync();
        assert_eq!(cache.exists("b"), None);
    }
}
