//! Which namespaces exist on the client cluster, and which of them are being
//! deleted, kept current by a watch.
//!
//! Every namespaced write must first confirm that its namespace exists on the
//! client, and a create that it is not being deleted (kube's namespace lifecycle
//! admission refuses new content in a Terminating namespace). Asking the client API server each time would add a round trip to every
//! write; a list-then-watch cache answers from memory. Until the cache has synced
//! (and again from a failure of its watch until the next list has ended) it answers
//! "unknown" and the caller asks the API server directly, so a cold or broken cache
//! costs latency, never correctness. A watch that stays silent past
//! [`WATCH_IDLE_LIMIT`](crate::watches::WATCH_IDLE_LIMIT) (bookmarks included)
//! counts as failed: a stalled connection must not keep answering from stale state.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::watcher::Event;
use kube::{Api, ResourceExt};

use crate::watches::{self, WatchClient, WatchUpdate};
use crproxy_core::locks;

/// What the cache knows of one client namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamespaceState {
    Missing,
    Active,
    /// Being deleted (phase `Terminating`): updates still go through, creates do not.
    Terminating,
}

impl NamespaceState {
    /// The state of a namespace the client has, by its phase, as kube's lifecycle
    /// admission reads it.
    pub fn of(namespace: &Namespace) -> Self {
        let phase = namespace.status.as_ref().and_then(|s| s.phase.as_deref());
        if phase == Some("Terminating") {
            NamespaceState::Terminating
        } else {
            NamespaceState::Active
        }
    }
}

/// The client's namespaces, as last seen by the watch.
#[derive(Debug, Default)]
pub struct ClientNamespaces {
    state: RwLock<CacheState>,
}

#[derive(Debug, Default)]
struct CacheState {
    synced: bool,
    namespaces: HashMap<String, NamespaceState>,
    /// The namespaces of a list in progress, installed whole when it ends.
    listing: Option<HashMap<String, NamespaceState>>,
}

impl ClientNamespaces {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// `Some(state)` when the cache is in sync with the client, `None` when the
    /// caller must ask the API server.
    pub fn state(&self, namespace: &str) -> Option<NamespaceState> {
        let state = locks::read(&self.state);
        state.synced.then(|| {
            state
                .namespaces
                .get(namespace)
                .copied()
                .unwrap_or(NamespaceState::Missing)
        })
    }

    /// Keeps the cache in step with the client cluster.
    pub fn spawn_sync(self: &Arc<Self>, watch: WatchClient) -> tokio::task::JoinHandle<()> {
        let cache = Arc::clone(self);
        let api: Api<Namespace> = Api::all(watch.client().clone());
        let config = watch.config();
        tokio::spawn(
            async move { watches::follow(api, config, |update| cache.update(update)).await },
        )
    }

    fn update(&self, update: WatchUpdate<Namespace>) {
        let mut state = locks::write(&self.state);
        match update {
            WatchUpdate::Event(Event::Init) => state.listing = Some(HashMap::new()),
            WatchUpdate::Event(Event::InitApply(namespace)) => {
                if let Some(listing) = &mut state.listing {
                    listing.insert(namespace.name_any(), NamespaceState::of(&namespace));
                }
            }
            WatchUpdate::Event(Event::InitDone) => {
                state.namespaces = state.listing.take().unwrap_or_default();
                state.synced = true;
            }
            WatchUpdate::Event(Event::Apply(namespace)) => {
                let known = NamespaceState::of(&namespace);
                state.namespaces.insert(namespace.name_any(), known);
            }
            WatchUpdate::Event(Event::Delete(namespace)) => {
                state.namespaces.remove(&namespace.name_any());
            }
            WatchUpdate::Failed(error) => {
                state.synced = false;
                state.listing = None;
                tracing::debug!(%error, "client namespace watch failed; answering unknown until the next list");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::NamespaceState::{Active, Missing, Terminating};
    use super::*;
    use crate::scripted_api::{settle, ScriptedApi};
    use crate::watches::{MAX_RELIST_PAUSE, WATCH_IDLE_LIMIT, WATCH_TIMEOUT_SECONDS};
    use serde_json::{json, Value};
    use std::time::Duration;

    /// Longer than any relist pause (the cap, jittered up to twice that).
    const LONGEST_PAUSE: Duration = Duration::from_secs(2 * MAX_RELIST_PAUSE.as_secs() + 1);

    fn namespace(name: &str, rv: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "resourceVersion": rv}})
    }

    fn event(kind: &str, name: &str, rv: &str) -> Value {
        json!({"type": kind, "object": namespace(name, rv)})
    }

    fn bookmark(rv: &str) -> Value {
        json!({"type": "BOOKMARK", "object": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"resourceVersion": rv}}})
    }

    fn list(rv: &str, names: &[&str]) -> Value {
        let items: Vec<Value> = names.iter().map(|n| namespace(n, "1")).collect();
        json!({"apiVersion": "v1", "kind": "NamespaceList", "metadata": {"resourceVersion": rv}, "items": items})
    }

    fn start(api: &ScriptedApi) -> (Arc<ClientNamespaces>, tokio::task::JoinHandle<()>) {
        let cache = ClientNamespaces::new();
        let task = cache.spawn_sync(WatchClient::from_client(
            api.client(WATCH_IDLE_LIMIT),
            WATCH_TIMEOUT_SECONDS,
        ));
        (cache, task)
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_the_server_ends_is_resumed_without_a_list() {
        let api = ScriptedApi::default();
        let first = api.push(list("5", &["a"]));
        let (cache, task) = start(&api);
        settle().await;
        first.send(event("ADDED", "b", "6")).expect("send");
        first.send(bookmark("8")).expect("send");
        settle().await;
        // The server ends the watch (its timeoutSeconds): the next one resumes.
        let _second = api.push_watch();
        drop(first);
        settle().await;
        let requests = api.requests();
        assert_eq!(requests.len(), 3, "{requests:?}");
        assert!(
            requests[2].starts_with("WATCH ") && requests[2].contains("resourceVersion=8"),
            "{requests:?}"
        );
        assert_eq!(cache.state("b"), Some(Active), "still in sync");
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_watch_unsyncs_the_cache_and_lists_again() {
        let api = ScriptedApi::default();
        let watch = api.push(list("5", &["a"]));
        let (cache, task) = start(&api);
        settle().await;
        assert_eq!(cache.state("a"), Some(Active));
        let requests = api.requests();
        assert!(
            requests[0].starts_with("LIST /api/v1/namespaces?")
                && requests[1].starts_with("WATCH /api/v1/namespaces?"),
            "{requests:?}"
        );
        assert!(
            requests[1].contains("allowWatchBookmarks=true")
                && requests[1].contains(&format!("timeoutSeconds={WATCH_TIMEOUT_SECONDS}"))
                && requests[1].contains("resourceVersion=5"),
            "{requests:?}"
        );

        // Bookmarks keep a quiet watch alive.
        tokio::time::advance(WATCH_IDLE_LIMIT - Duration::from_secs(1)).await;
        watch.send(bookmark("9")).expect("send");
        settle().await;
        tokio::time::advance(WATCH_IDLE_LIMIT - Duration::from_secs(1)).await;
        settle().await;
        assert_eq!(
            cache.state("a"),
            Some(Active),
            "a bookmark reset the idle limit"
        );

        // Then silence, without the connection closing: the cache stops answering.
        let _relisted = api.push(list("7", &["a", "b"]));
        tokio::time::advance(Duration::from_secs(2)).await;
        settle().await;
        assert_eq!(cache.state("b"), None, "stale state is not answered from");
        tokio::time::advance(LONGEST_PAUSE).await;
        settle().await;
        assert_eq!(cache.state("b"), Some(Active));
        assert_eq!(api.requests().len(), 4, "{:?}", api.requests());
        drop(watch);
        task.abort();
    }

    /// However long the API server was gone, the cache lists again within one
    /// capped pause (jittered: twice [`MAX_RELIST_PAUSE`]) of its return. The
    /// peer list and the front-proxy trust follow their watches the same way.
    #[tokio::test(start_paused = true)]
    async fn after_a_long_outage_the_cache_lists_again_soon_after_the_server_returns() {
        let api = ScriptedApi::default();
        let watch = api.push(list("5", &["a"]));
        let (cache, task) = start(&api);
        settle().await;
        assert_eq!(cache.state("a"), Some(Active));
        drop(watch);
        // Ten minutes of refused connections, one second at a time (bounded).
        let mut lists_at_half_time = 0;
        for second in 1..=600 {
            tokio::time::advance(Duration::from_secs(1)).await;
            settle().await;
            if second == 300 {
                lists_at_half_time = api.requests().len();
            }
        }
        assert_eq!(cache.state("a"), None);
        // Long past the ramp, one list per pause of one to two times the cap: no
        // longer apart (kube-runtime's default would be 30 to 60 s), nor closer.
        let late_lists = api.requests().len() - lists_at_half_time;
        let cap = MAX_RELIST_PAUSE.as_secs() as usize;
        assert!(
            (300 / (2 * cap) - 1..=300 / cap + 1).contains(&late_lists),
            "{late_lists} lists in the outage's last five minutes"
        );
        let _back = api.push(list("9", &["a", "b"]));
        for _ in 0..(2 * MAX_RELIST_PAUSE.as_secs() + 1) {
            tokio::time::advance(Duration::from_secs(1)).await;
            settle().await;
        }
        assert_eq!(
            cache.state("b"),
            Some(Active),
            "listed again within {:?} of the server's return",
            2 * MAX_RELIST_PAUSE
        );
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_api_server_restart_is_ridden_out_with_a_relist() {
        let api = ScriptedApi::default();
        let watch = api.push(list("5", &["a"]));
        let (cache, task) = start(&api);
        settle().await;
        watch.send(event("ADDED", "b", "6")).expect("send");
        settle().await;
        assert_eq!(cache.state("b"), Some(Active));

        // The server goes away: the watch closes and the next requests fail.
        drop(watch);
        settle().await;
        assert_eq!(cache.state("a"), None);
        tokio::time::advance(LONGEST_PAUSE).await;
        settle().await;
        assert_eq!(cache.state("a"), None, "still down");

        // Back, with a namespace deleted meanwhile.
        let _watch = api.push(list("9", &["b"]));
        tokio::time::advance(LONGEST_PAUSE).await;
        settle().await;
        assert_eq!(cache.state("a"), Some(Missing));
        assert_eq!(cache.state("b"), Some(Active));
        task.abort();
    }

    #[test]
    fn unknown_until_a_list_ends_then_follows_events() {
        let typed = |name: &str| -> Namespace {
            serde_json::from_value(namespace(name, "1")).expect("namespace")
        };
        let cache = ClientNamespaces::new();
        cache.update(WatchUpdate::Event(Event::Init));
        cache.update(WatchUpdate::Event(Event::InitApply(typed("a"))));
        assert_eq!(cache.state("a"), None, "the list has not ended");
        cache.update(WatchUpdate::Event(Event::InitDone));
        assert_eq!(cache.state("a"), Some(Active));
        assert_eq!(cache.state("b"), Some(Missing));
        cache.update(WatchUpdate::Event(Event::Apply(typed("b"))));
        cache.update(WatchUpdate::Event(Event::Delete(typed("a"))));
        assert_eq!(cache.state("a"), Some(Missing));
        assert_eq!(cache.state("b"), Some(Active));
        cache.update(WatchUpdate::Failed(
            kube::runtime::watcher::Error::NoResourceVersion,
        ));
        assert_eq!(cache.state("b"), None);
    }

    #[test]
    fn a_namespace_being_deleted_is_terminating_until_it_is_gone() {
        let with_phase = |name: &str, phase: &str| -> Namespace {
            let mut v = namespace(name, "1");
            v["status"] = json!({"phase": phase});
            serde_json::from_value(v).expect("namespace")
        };
        let cache = ClientNamespaces::new();
        cache.update(WatchUpdate::Event(Event::Init));
        cache.update(WatchUpdate::Event(Event::InitApply(with_phase(
            "a", "Active",
        ))));
        cache.update(WatchUpdate::Event(Event::InitApply(with_phase(
            "b",
            "Terminating",
        ))));
        cache.update(WatchUpdate::Event(Event::InitDone));
        assert_eq!(cache.state("a"), Some(Active));
        assert_eq!(
            cache.state("b"),
            Some(Terminating),
            "listed while terminating"
        );
        cache.update(WatchUpdate::Event(Event::Apply(with_phase(
            "a",
            "Terminating",
        ))));
        assert_eq!(
            cache.state("a"),
            Some(Terminating),
            "deleted after the list"
        );
        cache.update(WatchUpdate::Event(Event::Delete(with_phase(
            "a",
            "Terminating",
        ))));
        assert_eq!(cache.state("a"), Some(Missing));
    }
}
