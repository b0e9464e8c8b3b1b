//! Peer sources: where the peer lists of a target come from.
//!
//! Every source publishes *complete* lists into the pools of one target (each
//! group/version proxy of the target keeps its own pool, but they all see the same
//! peers). A source that loses its feed reports the subscription as dropped, which
//! starts the pools' staleness clock; the next successful publication resets it.
//!
//! * [`PeerSourceConfig::Static`]: published once, never stale.
//! * [`PeerSourceConfig::Dns`]: resolved on an interval, published when the answer
//!   changes; a failed lookup drops the subscription.
//! * [`PeerSourceConfig::File`]: a JSON or YAML list of `host:port`, re-read when it
//!   changes; an unreadable or invalid file drops the subscription and the last good
//!   list stays in use.
//! * [`PeerSourceConfig::EndpointSlices`]: list and watch the EndpointSlices of a
//!   Service; the watch stream is the subscription.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::pool::PeerPool;

/// How often the file source looks at its file.
pub const FILE_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Upper bound for one DNS lookup; a hanging resolver counts as a failed lookup.
pub const DNS_LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest DNS re-resolution interval accepted, so a zero does not spin.
pub const DNS_MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Server-side lifetime of one EndpointSlice watch; the source re-lists afterwards.
pub const WATCH_TIMEOUT_SECONDS: u64 = 300;
/// A watch that delivers nothing (not even a bookmark) for this long is treated as
/// dead, so a silently broken connection cannot keep a stale list trusted forever.
pub const WATCH_IDLE_LIMIT: Duration = Duration::from_secs(WATCH_TIMEOUT_SECONDS + 60);
/// First and largest step between re-list attempts of a client-side watch.
pub const RELIST_BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));

/// The pause before a client-side watch (EndpointSlices, client namespaces,
/// front-proxy ConfigMap) lists again after a failure: the step doubles from
/// `RELIST_BACKOFF.0` to `RELIST_BACKOFF.1`, and each pause is drawn between half
/// and all of it, so replicas that lost the API server together do not all come
/// back in the same instant.
#[derive(Debug)]
pub struct RelistBackoff {
    step: Duration,
}

impl Default for RelistBackoff {
    fn default() -> Self {
        Self {
            step: RELIST_BACKOFF.0,
        }
    }
}

impl RelistBackoff {
    /// Back to the first step, after a watch that worked.
    pub fn reset(&mut self) {
        self.step = RELIST_BACKOFF.0;
    }

    /// The next pause, and the step after it doubled.
    pub fn next_pause(&mut self) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(RELIST_BACKOFF.1);
        let half = step / 2;
        half + half.mul_f64(random_fraction())
    }
}

/// A fraction in [0, 1) from the standard library's per-instance random hash keys:
/// enough to spread retries, no random-number crate needed.
fn random_fraction() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// Where a target's peers come from.
// Built once per target at startup and moved into its task: the size difference
// between variants costs nothing worth an extra box in the constructor API.
#[allow(clippy::large_enum_variant)]
pub enum PeerSourceConfig {
    /// A fixed list of `host:port`.
    Static(Vec<String>),
    /// Every address `name` resolves to, with `port`, re-resolved every `interval`.
    Dns {
        name: String,
        port: u16,
        interval: Duration,
    },
    /// Ready endpoints of the EndpointSlices of `namespace/service`, on the port
    /// named `port_name` (or the first port).
    EndpointSlices {
        client: crproxy_kube::Client,
        namespace: String,
        service: String,
        port_name: Option<String>,
    },
    /// A file holding a JSON or YAML list of `host:port`.
    File(PathBuf),
}

impl std::fmt::Debug for PeerSourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerSourceConfig::Static(list) => f.debug_tuple("Static").field(list).finish(),
            PeerSourceConfig::Dns {
                name,
                port,
                interval,
            } => f
                .debug_struct("Dns")
                .field("name", name)
                .field("port", port)
                .field("interval", interval)
                .finish(),
            PeerSourceConfig::EndpointSlices {
                namespace,
                service,
                port_name,
                ..
            } => f
                .debug_struct("EndpointSlices")
                .field("namespace", namespace)
                .field("service", service)
                .field("port_name", port_name)
                .finish_non_exhaustive(),
            PeerSourceConfig::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

/// Why a peer list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The peer file could not be read.
    #[error("reading peer file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The peer file is neither a JSON nor a YAML list of strings.
    #[error("peer file {path} is not a JSON or YAML list of \"host:port\" strings: {detail}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What the parsers said.
        detail: String,
    },
    /// An entry is not `host:port`.
    #[error("peer {entry:?} is not \"host:port\" with a numeric port")]
    InvalidPeer {
        /// The offending entry.
        entry: String,
    },
    /// The DNS lookup failed or timed out.
    #[error("resolving {name}: {detail}")]
    Dns {
        /// The name looked up.
        name: String,
        /// The resolver's error.
        detail: String,
    },
    /// Listing or watching EndpointSlices failed.
    #[error("endpointslices {path}: {source}")]
    Kube {
        /// The list or watch path.
        path: String,
        /// The client's error.
        #[source]
        source: crproxy_kube::Error,
    },
}

/// Starts the source for `pools` (all group/version pools of one target). The task
/// runs until aborted through the returned handle; the static source publishes and
/// ends at once.
pub fn spawn(config: PeerSourceConfig, pools: Vec<Arc<PeerPool>>) -> JoinHandle<()> {
    let publisher = Publisher::new(pools);
    match config {
        PeerSourceConfig::Static(list) => tokio::spawn(async move {
            let list = normalize(list);
            for entry in &list {
                // Kept anyway: a bad entry fails its dials and is quarantined, which
                // the metrics show; the line says why.
                if let Err(err) = validate_peer(entry) {
                    tracing::warn!(error = %err, "static peer list entry is not host:port");
                }
            }
            publisher.publish(list);
        }),
        PeerSourceConfig::Dns {
            name,
            port,
            interval,
        } => tokio::spawn(run_dns(publisher, name, port, interval)),
        PeerSourceConfig::File(path) => tokio::spawn(run_file(publisher, path)),
        PeerSourceConfig::EndpointSlices {
            client,
            namespace,
            service,
            port_name,
        } => spawn_endpoint_slices(client, namespace, service, port_name, publisher.pools),
    }
}

/// Fans lists and subscription state out to every pool of a target.
struct Publisher {
    pools: Vec<Arc<PeerPool>>,
    /// The last list published, to publish only on change.
    last: Option<Vec<String>>,
    /// Whether the subscription is currently reported as down.
    down: bool,
}

impl Publisher {
    fn new(pools: Vec<Arc<PeerPool>>) -> Publisher {
        Publisher {
            pools,
            last: None,
            down: false,
        }
    }

    fn publish(&self, list: Vec<String>) {
        for pool in &self.pools {
            pool.publish(list.clone());
        }
    }

    /// Publishes when the list changed or the subscription just came back (a
    /// publication is what makes the pools trust their list again).
    fn update(&mut self, list: Vec<String>) {
        if self.down || self.last.as_ref() != Some(&list) {
            tracing::info!(peers = ?list, "peer list updated");
            self.publish(list.clone());
            self.last = Some(list);
        }
        self.down = false;
    }

    /// Reports the feed as lost; returns true on the transition (for logging once).
    fn dropped(&mut self) -> bool {
        for pool in &self.pools {
            pool.subscription_dropped();
        }
        !std::mem::replace(&mut self.down, true)
    }
}

/// Sorted, de-duplicated, trimmed, empty entries removed: two lists with the same
/// peers compare equal whatever order the feed produced them in.
fn normalize(mut list: Vec<String>) -> Vec<String> {
    for entry in &mut list {
        *entry = entry.trim().to_owned();
    }
    list.retain(|e| !e.is_empty());
    list.sort();
    list.dedup();
    list
}

/// Checks `host:port` (IPv6 hosts in brackets).
fn validate_peer(entry: &str) -> Result<(), SourceError> {
    let invalid = || SourceError::InvalidPeer {
        entry: entry.to_owned(),
    };
    let (host, port) = entry.rsplit_once(':').ok_or_else(invalid)?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(invalid());
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(invalid());
    }
    Ok(())
}

// ---- DNS ----------------------------------------------------------------------------

async fn run_dns(mut publisher: Publisher, name: String, port: u16, interval: Duration) {
    let interval = interval.max(DNS_MIN_INTERVAL);
    // Bounded: runs until the task is aborted.
    loop {
        match resolve(&name, port).await {
            Ok(list) => publisher.update(list),
            Err(err) => {
                if publisher.dropped() {
                    tracing::warn!(error = %err, "peer DNS lookup failed; keeping the last peer list for now");
                }
            }
        }
        tokio::time::sleep(interval).await;
    }
}

async fn resolve(name: &str, port: u16) -> Result<Vec<String>, SourceError> {
    let lookup = tokio::net::lookup_host((name, port));
    let addrs = match tokio::time::timeout(DNS_LOOKUP_TIMEOUT, lookup).await {
        Ok(Ok(addrs)) => addrs,
        Ok(Err(e)) => {
            return Err(SourceError::Dns {
                name: name.to_owned(),
                detail: e.to_string(),
            })
        }
        Err(_) => {
            return Err(SourceError::Dns {
                name: name.to_owned(),
                detail: format!("no answer within {DNS_LOOKUP_TIMEOUT:?}"),
            })
        }
    };
    Ok(normalize(addrs.map(|a| a.to_string()).collect()))
}

// ---- file ---------------------------------------------------------------------------

async fn run_file(mut publisher: Publisher, path: PathBuf) {
    let mut last_content: Option<Vec<u8>> = None;
    let mut last_error: Option<String> = None;
    // Bounded: runs until the task is aborted.
    loop {
        let read = tokio::fs::read(&path)
            .await
            .map_err(|source| SourceError::Read {
                path: path.clone(),
                source,
            });
        let outcome = match read {
            // Unchanged and already published: nothing to do.
            Ok(content) if !publisher.down && last_content.as_ref() == Some(&content) => Ok(None),
            Ok(content) => parse_peer_file(&path, &content).map(|list| Some((content, list))),
            Err(err) => Err(err),
        };
        match outcome {
            Ok(None) => {}
            Ok(Some((content, list))) => {
                publisher.update(list);
                last_content = Some(content);
                last_error = None;
            }
            Err(err) => {
                publisher.dropped();
                let text = err.to_string();
                // Once per distinct problem, not once per poll.
                if last_error.as_deref() != Some(&text) {
                    tracing::warn!(error = %text, "peer file unusable; keeping the last peer list for now");
                    last_error = Some(text);
                }
            }
        }
        tokio::time::sleep(FILE_POLL_INTERVAL).await;
    }
}

/// Parses a peer file: a JSON array or a YAML sequence of `host:port` strings.
pub fn parse_peer_file(path: &std::path::Path, content: &[u8]) -> Result<Vec<String>, SourceError> {
    let list: Vec<String> = match serde_json::from_slice(content) {
        Ok(list) => list,
        Err(json_err) => {
            let text = std::str::from_utf8(content).map_err(|e| SourceError::Format {
                path: path.to_owned(),
                detail: e.to_string(),
            })?;
            // An empty YAML document is an empty list, not an error.
            if text.trim().is_empty() {
                Vec::new()
            } else {
                serde_saphyr::from_str(text).map_err(|yaml_err| SourceError::Format {
                    path: path.to_owned(),
                    detail: format!("as JSON: {json_err}; as YAML: {yaml_err}"),
                })?
            }
        }
    };
    let list = normalize(list);
    for entry in &list {
        validate_peer(entry)?;
    }
    Ok(list)
}

// ---- EndpointSlices -------------------------------------------------------------------

/// What a list-then-watch loop (the EndpointSlice source, the client namespace cache)
/// needs from a Kubernetes client. Implemented for [`crproxy_kube::Client`]; tests
/// script it.
pub trait WatchFeed: Send + Sync + 'static {
    /// GETs a list.
    fn list<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Value, crproxy_kube::Error>>;
    /// Starts a watch.
    #[allow(clippy::type_complexity)]
    fn watch<'a>(
        &'a self,
        path_and_query: &'a str,
    ) -> BoxFuture<
        'a,
        Result<
            BoxStream<'static, Result<crproxy_kube::WatchEvent, crproxy_kube::Error>>,
            crproxy_kube::Error,
        >,
    >;
}

impl WatchFeed for crproxy_kube::Client {
    fn list<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Value, crproxy_kube::Error>> {
        Box::pin(crproxy_kube::Client::list(self, path))
    }

    fn watch<'a>(
        &'a self,
        path_and_query: &'a str,
    ) -> BoxFuture<
        'a,
        Result<
            BoxStream<'static, Result<crproxy_kube::WatchEvent, crproxy_kube::Error>>,
            crproxy_kube::Error,
        >,
    > {
        Box::pin(async move {
            let stream = crproxy_kube::Client::watch(self, path_and_query).await?;
            Ok(stream.boxed())
        })
    }
}

/// Starts the EndpointSlice source over any feed.
pub fn spawn_endpoint_slices<F: WatchFeed>(
    feed: F,
    namespace: String,
    service: String,
    port_name: Option<String>,
    pools: Vec<Arc<PeerPool>>,
) -> JoinHandle<()> {
    let source = SliceSource {
        feed,
        list_path: endpoint_slices_path(&namespace, &service),
        service,
        port_name,
        publisher: Publisher::new(pools),
    };
    tokio::spawn(source.run())
}

/// Query-value escaping: everything but RFC 3986 unreserved characters.
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The list path of a Service's EndpointSlices, selected by the label Kubernetes
/// puts on them.
pub fn endpoint_slices_path(namespace: &str, service: &str) -> String {
    let selector = format!("kubernetes.io/service-name={service}");
    let selector = percent_encoding::utf8_percent_encode(&selector, QUERY_VALUE);
    format!(
        "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices?labelSelector={selector}"
    )
}

struct SliceSource<F> {
    feed: F,
    list_path: String,
    service: String,
    port_name: Option<String>,
    publisher: Publisher,
}

impl<F: WatchFeed> SliceSource<F> {
    async fn run(mut self) {
        let mut backoff = RelistBackoff::default();
        // Bounded: runs until the task is aborted.
        loop {
            let Err(err) = self.list_and_watch(&mut backoff).await;
            let pause = backoff.next_pause();
            tracing::warn!(error = %err, service = %self.service, retry_in = ?pause, "peer watch subscription failed");
            tokio::time::sleep(pause).await;
        }
    }

    /// One list, then watches for as long as they work. Returns on a failure (a
    /// stall or an expired resourceVersion included), after reporting the
    /// subscription dropped.
    async fn list_and_watch(
        &mut self,
        backoff: &mut RelistBackoff,
    ) -> Result<std::convert::Infallible, SourceError> {
        let kube_err = |path: &str| {
            let path = path.to_owned();
            move |source| SourceError::Kube { path, source }
        };
        let list = match self.feed.list(&self.list_path).await {
            Ok(list) => list,
            Err(e) => {
                self.publisher.dropped();
                return Err(kube_err(&self.list_path)(e));
            }
        };
        backoff.reset();
        let mut slices: BTreeMap<String, Value> = BTreeMap::new();
        if let Some(items) = list["items"].as_array() {
            for item in items {
                self.apply(&mut slices, "ADDED", item.clone());
            }
        }
        self.publisher.update(peers_from_slices(
            slices.values(),
            self.port_name.as_deref(),
        ));
        let mut resource_version = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        // Each watch the server ends (timeoutSeconds) is resumed from the last
        // resourceVersion seen, bookmarks included: no list, and the subscription
        // is not reported dropped. Only a failure ends the cycle.
        let result = 'watches: loop {
            let watch_path = format!(
                "{}&watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_TIMEOUT_SECONDS}&resourceVersion={}",
                self.list_path,
                percent_encoding::utf8_percent_encode(&resource_version, QUERY_VALUE)
            );
            let mut stream = match self.feed.watch(&watch_path).await {
                Ok(stream) => stream,
                Err(e) => break Err(kube_err(&watch_path)(e)),
            };
            loop {
                let event = match tokio::time::timeout(WATCH_IDLE_LIMIT, stream.next()).await {
                    Err(_) => {
                        break 'watches Err(SourceError::Kube {
                            path: watch_path.clone(),
                            source: crproxy_kube::Error::Timeout(format!(
                                "no watch event within {WATCH_IDLE_LIMIT:?}"
                            )),
                        })
                    }
                    Ok(None) => break,
                    Ok(Some(Err(e))) => break 'watches Err(kube_err(&watch_path)(e)),
                    Ok(Some(Ok(event))) => event,
                };
                if let Some(rv) = event.object["metadata"]["resourceVersion"].as_str() {
                    resource_version = rv.to_owned();
                }
                if self.apply(&mut slices, &event.event_type, event.object) {
                    self.publisher.update(peers_from_slices(
                        slices.values(),
                        self.port_name.as_deref(),
                    ));
                }
            }
        };
        self.publisher.dropped();
        result
    }

    /// Applies one event to the slice set; returns whether it changed anything.
    fn apply(&self, slices: &mut BTreeMap<String, Value>, event_type: &str, object: Value) -> bool {
        let Some(name) = object["metadata"]["name"].as_str().map(str::to_owned) else {
            return false;
        };
        // The selector is applied server-side; checking again keeps a server that
        // ignores it from mixing in another Service's endpoints.
        let service = object["metadata"]["labels"]["kubernetes.io/service-name"].as_str();
        if service.is_some_and(|s| s != self.service) {
            return false;
        }
        match event_type {
            "ADDED" | "MODIFIED" => {
                slices.insert(name, object);
                true
            }
            "DELETED" => slices.remove(&name).is_some(),
            // BOOKMARK and anything unknown carry no endpoint change.
            _ => false,
        }
    }
}

/// The `host:port` list of ready endpoints across `slices`: the port named
/// `port_name` (or each slice's first port); endpoints whose `ready` condition is
/// explicitly false are left out (an absent condition means ready).
pub fn peers_from_slices<'a>(
    slices: impl IntoIterator<Item = &'a Value>,
    port_name: Option<&str>,
) -> Vec<String> {
    let mut peers = Vec::new();
    for slice in slices {
        let Some(ports) = slice["ports"].as_array() else {
            continue;
        };
        let port = match port_name {
            Some(name) => ports.iter().find(|p| p["name"].as_str() == Some(name)),
            None => ports.first(),
        };
        let Some(port) = port.and_then(|p| p["port"].as_u64()) else {
            continue;
        };
        let ipv6 = slice["addressType"].as_str() == Some("IPv6");
        for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
            if endpoint["conditions"]["ready"].as_bool() == Some(false) {
                continue;
            }
            for address in endpoint["addresses"].as_array().into_iter().flatten() {
                let Some(address) = address.as_str() else {
                    continue;
                };
                peers.push(if ipv6 {
                    format!("[{address}]:{port}")
                } else {
                    format!("{address}:{port}")
                });
            }
        }
    }
    normalize(peers)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod backoff_tests {
    use super::*;

    #[test]
    fn relist_pauses_double_with_jitter_up_to_the_limit() {
        let mut backoff = RelistBackoff::default();
        let mut step = RELIST_BACKOFF.0;
        for _ in 0..8 {
            let pause = backoff.next_pause();
            assert!(
                pause >= step / 2 && pause <= step,
                "{pause:?} for step {step:?}"
            );
            step = (step * 2).min(RELIST_BACKOFF.1);
        }
        assert_eq!(step, RELIST_BACKOFF.1);
        backoff.reset();
        assert!(backoff.next_pause() <= RELIST_BACKOFF.0);
        // Jitter: twenty pauses of one step are not all the same.
        let pauses: std::collections::HashSet<Duration> = (0..20)
            .map(|_| {
                let mut b = RelistBackoff::default();
                b.next_pause()
            })
            .collect();
        assert!(pauses.len() > 1, "{pauses:?}");
    }
}
