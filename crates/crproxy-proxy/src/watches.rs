//! The proxy's client-side watches (client namespaces, EndpointSlice peers, the
//! front-proxy trust ConfigMap) on kube-runtime's watcher, with one policy:
//!
//! * Each watch asks the server to end it after [`WATCH_TIMEOUT_SECONDS`]; the
//!   watcher then resumes from the last resourceVersion it saw (bookmarks
//!   included), which costs no list and tells the consumer nothing.
//! * The client the watches use ([`WatchClient`]) has a read timeout of
//!   [`WATCH_IDLE_LIMIT`], a little
//!   above that lifetime: a watch that goes silent longer has stalled without
//!   closing. kube-runtime's own idle timeout (5 s later still) would reconnect
//!   without a word; the read timeout makes the stall an error instead, so the
//!   consumer stops trusting what it holds.
//! * After any error the consumer is told ([`WatchUpdate::Failed`]) and, after a
//!   pause ([`relist_backoff`]: 0.8 s doubling to [`MAX_RELIST_PAUSE`], jittered
//!   up to twice that), a fresh watcher lists again. Only the list's end
//!   ([`watcher::Event::InitDone`]) makes the consumer's state whole again.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::runtime::utils::{Backoff, ResetTimerBackoff};
use kube::runtime::watcher::{self, ExponentialBackoff};
use kube::Api;
use serde::de::DeserializeOwned;

/// Server-side lifetime of one watch. kube-client 4 refuses 295 s or more (its
/// `WatchParams` validation); 290 s is kube-runtime's own default.
pub const WATCH_TIMEOUT_SECONDS: u32 = 290;

/// How much longer than its lifetime a watch may stay silent before it counts as
/// stalled: room for the server's closing bytes to arrive, well under the 5 s
/// that kube-runtime 5 waits before reconnecting on its own.
const IDLE_MARGIN: Duration = Duration::from_secs(2);

/// Read timeout of the watch client: a watch silent this long (bookmarks included)
/// has stalled. Above [`WATCH_TIMEOUT_SECONDS`], within which the server ends every
/// healthy watch, and below kube-runtime's own idle timeout (the lifetime plus 5 s),
/// which would otherwise reconnect first and hide the stall.
pub const WATCH_IDLE_LIMIT: Duration = idle_limit(WATCH_TIMEOUT_SECONDS);

/// Longest pause, before jitter, between a failed watch and the next list.
/// kube-runtime's default (30 s, jittered up to 60 s) would leave the peer list
/// stale, past its 60 s tolerance, for up to a minute after the API server came
/// back; three watches a cluster relisting every few seconds in an outage cost
/// it nothing.
pub const MAX_RELIST_PAUSE: Duration = Duration::from_secs(5);

/// The pauses between failed watches: 0.8 s doubling to [`MAX_RELIST_PAUSE`],
/// each jittered up to twice its length, from the start again once a list has
/// ended (or after two quiet minutes).
pub fn relist_backoff() -> impl Backoff {
    let pauses = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(800))
        .with_max_delay(MAX_RELIST_PAUSE)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(ExponentialBackoff::from(pauses), Duration::from_secs(120))
}

/// The idle limit of watches that live `lifetime_seconds`.
pub const fn idle_limit(lifetime_seconds: u32) -> Duration {
    Duration::from_secs(lifetime_seconds as u64).saturating_add(IDLE_MARGIN)
}

/// A kube-rs client for the proxy's watches of one cluster, with the lifetime its
/// watches ask for and the matching read timeout.
#[derive(Clone)]
pub struct WatchClient {
    client: kube::Client,
    lifetime_seconds: u32,
}

impl WatchClient {
    /// Watches that live [`WATCH_TIMEOUT_SECONDS`], stalled after
    /// [`WATCH_IDLE_LIMIT`].
    pub fn new(access: &crproxy_kube::ClusterAccess) -> Result<Self, crproxy_kube::Error> {
        Self::with_lifetime(access, WATCH_TIMEOUT_SECONDS)
    }

    /// Watches that live `lifetime_seconds`: for tests that must see a stall
    /// noticed within seconds.
    pub fn with_lifetime(
        access: &crproxy_kube::ClusterAccess,
        lifetime_seconds: u32,
    ) -> Result<Self, crproxy_kube::Error> {
        let client = crproxy_kube::kube_client_with_read_timeout(
            &access.cluster,
            Arc::clone(&access.credentials),
            "default",
            idle_limit(lifetime_seconds),
        )?;
        Ok(Self {
            client,
            lifetime_seconds,
        })
    }

    /// Over `client`, whose responses must have a read timeout of
    /// [`idle_limit`]`(lifetime_seconds)` (a [`crproxy_kube::ReadTimeoutLayer`]):
    /// for tests over an in-memory API server.
    pub fn from_client(client: kube::Client, lifetime_seconds: u32) -> Self {
        Self {
            client,
            lifetime_seconds,
        }
    }

    /// The client, for single requests.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The watcher settings: bookmarks (the watcher's default) and the lifetime.
    pub fn config(&self) -> watcher::Config {
        watcher::Config::default().timeout(self.lifetime_seconds)
    }
}

/// What a consumer of [`follow`] is told.
#[derive(Debug)]
pub enum WatchUpdate<K> {
    /// An event from the watcher: a list starting (`Init`), its objects
    /// (`InitApply`), its end (`InitDone`), then changes (`Apply`, `Delete`).
    Event(watcher::Event<K>),
    /// The watch failed (the API server down, a stall past the idle limit, an
    /// expired resourceVersion, ...). What the consumer holds may be stale until the
    /// next `InitDone`.
    Failed(watcher::Error),
}

/// Watches `api` with `config` for ever, handing every event and failure to
/// `consume`; after a failure, lists again after a backoff pause. Runs until the
/// surrounding task is aborted.
pub async fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    mut consume: impl FnMut(WatchUpdate<K>) + Send,
) where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut backoff = relist_backoff();
    // Bounded: runs until the task is aborted.
    loop {
        let mut events = watcher::watcher(api.clone(), config.clone()).boxed();
        while let Some(item) = events.next().await {
            match item {
                Ok(event) => {
                    if matches!(event, watcher::Event::InitDone) {
                        backoff.reset();
                    }
                    consume(WatchUpdate::Event(event));
                }
                Err(error) => {
                    consume(WatchUpdate::Failed(error));
                    break;
                }
            }
        }
        // The backoff never runs out; the fallback is its ceiling.
        let pause = backoff.next().unwrap_or(MAX_RELIST_PAUSE);
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_idle_limit_sits_between_the_server_lifetime_and_kube_runtimes_own_timeout() {
        for seconds in [1, 3, WATCH_TIMEOUT_SECONDS] {
            let lifetime = Duration::from_secs(u64::from(seconds));
            assert!(idle_limit(seconds) > lifetime);
            // kube-runtime 5 reconnects silently after the lifetime plus 5 s.
            assert!(idle_limit(seconds) < lifetime + Duration::from_secs(5));
        }
        let client = kube::Client::new(
            tower::service_fn(|_: http::Request<kube::client::Body>| async {
                Err::<http::Response<http_body_util::Empty<bytes::Bytes>>, std::io::Error>(
                    std::io::Error::other("unused"),
                )
            }),
            "default",
        );
        let config = WatchClient::from_client(client, 7).config();
        assert_eq!(config.timeout, Some(7));
        assert!(config.bookmarks);
    }
}
