//! Which namespaces exist on the client cluster, kept current by a watch.
//!
//! Every namespaced write must first confirm that its namespace exists on the
//! client. Asking the client API server each time would add a round trip to every
//! write; a list-then-watch cache answers from memory. Until the cache has synced
//! (or while its watch is re-established) it answers "unknown" and the caller asks
//! the API server directly, so a cold or broken cache costs latency, never
//! correctness. A watch that stays silent past [`WATCH_IDLE_LIMIT`] (bookmarks
//! included) counts as broken: a stalled connection must not keep answering from
//! stale state.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use futures_util::StreamExt;
use serde_json::Value;

use crate::sources::{RelistBackoff, WatchFeed, WATCH_IDLE_LIMIT, WATCH_TIMEOUT_SECONDS};

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
    /// list's resourceVersion; on any interruption (an error, the server closing the
    /// watch, no event within the idle limit) mark it unsynced and start over.
    pub fn spawn_sync<F: WatchFeed>(self: &Arc<Self>, feed: F) -> tokio::task::JoinHandle<()> {
        let cache = Arc::clone(self);
        tokio::spawn(async move {
            let mut backoff = RelistBackoff::default();
            loop {
                let Err(error) = cache.sync_once(&feed, &mut backoff).await;
                cache.unsync();
                tracing::debug!(%error, "client namespace watch interrupted; re-listing");
                tokio::time::sleep(backoff.next_pause()).await;
            }
        })
    }

    /// Lists, then watches for as long as watches work; returns only on a failure
    /// (including a stall or an expired resourceVersion), after which the caller
    /// lists again. A successful list resets `backoff`.
    async fn sync_once(
        &self,
        feed: &impl WatchFeed,
        backoff: &mut RelistBackoff,
    ) -> Result<std::convert::Infallible, crproxy_kube::Error> {
        let list = feed.list("/api/v1/namespaces").await?;
        backoff.reset();
        let names = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(name_of)
            .map(str::to_string)
            .collect();
        self.replace_all(names);
        let mut resource_version = list
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("0")
            .to_string();
        // The server ends each watch after timeoutSeconds; the next one resumes from
        // the last resourceVersion seen (bookmarks included), so that costs no list
        // and the cache stays in sync. Bookmarks also keep a healthy watch from ever
        // being silent for the idle limit.
        loop {
            let mut events = feed
                .watch(&format!(
                    "/api/v1/namespaces?watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_TIMEOUT_SECONDS}&resourceVersion={resource_version}"
                ))
                .await?;
            loop {
                let event = match tokio::time::timeout(WATCH_IDLE_LIMIT, events.next()).await {
                    Ok(Some(event)) => event?,
                    Ok(None) => break,
                    Err(_) => {
                        return Err(crproxy_kube::Error::Timeout(format!(
                            "no watch event within {WATCH_IDLE_LIMIT:?}"
                        )))
                    }
                };
                if let Some(rv) = event
                    .object
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                {
                    resource_version = rv.to_string();
                }
                if let Some(name) = name_of(&event.object) {
                    self.apply(&event.event_type, name);
                }
            }
        }
    }
}

fn name_of(object: &Value) -> Option<&str> {
    object.pointer("/metadata/name").and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripted_feed::{event, Script};
    use crate::sources::RELIST_BACKOFF;
    use serde_json::json;
    use std::time::Duration;

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_the_server_ends_is_resumed_without_a_list() {
        let script = Script::default();
        let first = script.push(list("5", &["a"]));
        let cache = ClientNamespaces::new();
        let task = cache.spawn_sync(script.clone());
        settle().await;
        first
            .send(event(
                "ADDED",
                json!({"metadata": {"name": "b", "resourceVersion": "6"}}),
            ))
            .expect("send");
        first
            .send(event(
                "BOOKMARK",
                json!({"metadata": {"resourceVersion": "8"}}),
            ))
            .expect("send");
        settle().await;
        // The server ends the watch (its timeoutSeconds): the next one resumes.
        let _second = script.push_watch();
        drop(first);
        settle().await;
        let requests = script.requests();
        assert_eq!(requests.len(), 3, "{requests:?}");
        assert!(
            requests[2].starts_with("WATCH ") && requests[2].contains("resourceVersion=8"),
            "{requests:?}"
        );
        assert_eq!(cache.exists("b"), Some(true), "still in sync");
        task.abort();
    }

    fn list(rv: &str, names: &[&str]) -> Value {
        let items: Vec<Value> = names
            .iter()
            .map(|n| json!({"metadata": {"name": n}}))
            .collect();
        json!({"metadata": {"resourceVersion": rv}, "items": items})
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_watch_unsyncs_the_cache_and_lists_again() {
        let script = Script::default();
        let watch = script.push(list("5", &["a"]));
        let cache = ClientNamespaces::new();
        let task = cache.spawn_sync(script.clone());
        settle().await;
        assert_eq!(cache.exists("a"), Some(true));
        let requests = script.requests();
        assert!(
            requests[1].contains("allowWatchBookmarks=true")
                && requests[1].contains(&format!("timeoutSeconds={WATCH_TIMEOUT_SECONDS}"))
                && requests[1].contains("resourceVersion=5"),
            "{requests:?}"
        );

        // Bookmarks keep a quiet watch alive.
        tokio::time::advance(WATCH_IDLE_LIMIT - Duration::from_secs(1)).await;
        watch
            .send(event(
                "BOOKMARK",
                json!({"metadata": {"resourceVersion": "9"}}),
            ))
            .expect("send");
        settle().await;
        tokio::time::advance(WATCH_IDLE_LIMIT - Duration::from_secs(1)).await;
        settle().await;
        assert_eq!(
            cache.exists("a"),
            Some(true),
            "a bookmark reset the idle limit"
        );

        // Then silence, without the connection closing: the cache stops answering.
        let _relisted = script.push(list("7", &["a", "b"]));
        tokio::time::advance(Duration::from_secs(2)).await;
        settle().await;
        assert_eq!(cache.exists("b"), None, "stale state is not answered from");
        tokio::time::advance(RELIST_BACKOFF.1).await;
        settle().await;
        assert_eq!(cache.exists("b"), Some(true));
        assert_eq!(script.requests().len(), 4, "{:?}", script.requests());
        drop(watch);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_api_server_restart_is_ridden_out_with_a_relist() {
        let script = Script::default();
        let watch = script.push(list("5", &["a"]));
        let cache = ClientNamespaces::new();
        let task = cache.spawn_sync(script.clone());
        settle().await;
        watch
            .send(event("ADDED", json!({"metadata": {"name": "b"}})))
            .expect("send");
        settle().await;
        assert_eq!(cache.exists("b"), Some(true));

        // The server goes away: the watch closes and the next lists fail.
        drop(watch);
        settle().await;
        assert_eq!(cache.exists("a"), None);
        tokio::time::advance(RELIST_BACKOFF.1).await;
        settle().await;
        assert_eq!(cache.exists("a"), None, "still down");

        // Back, with a namespace deleted meanwhile.
        let _watch = script.push(list("9", &["b"]));
        tokio::time::advance(RELIST_BACKOFF.1).await;
        settle().await;
        assert_eq!(cache.exists("a"), Some(false));
        assert_eq!(cache.exists("b"), Some(true));
        task.abort();
    }

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
