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
//!   Service with kube-runtime's watcher ([`crate::watches`]); a failed watch
//!   drops the subscription until the next list has ended, and the last good list
//!   stays in use meanwhile.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use kube::{Api, ResourceExt};
use tokio::task::JoinHandle;

use crate::pool::PeerPool;
use crate::watches::{self, WatchUpdate};

/// How often the file source looks at its file.
pub const FILE_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Upper bound for one DNS lookup; a hanging resolver counts as a failed lookup.
pub const DNS_LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest DNS re-resolution interval accepted, so a zero does not spin.
pub const DNS_MIN_INTERVAL: Duration = Duration::from_secs(1);
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
        client: watches::WatchClient,
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
    #[error("peer {entry:?} is not \"host:port\" with a host name or address and a port from 1 to 65535")]
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
}

/// Starts the source for `pools` (all group/version pools of one target). The task
/// runs until aborted through the returned handle; the static source publishes and
/// ends at once.
pub fn spawn(config: PeerSourceConfig, pools: Vec<Arc<PeerPool>>) -> JoinHandle<()> {
    let publisher = Publisher::new(pools);
    match config {
        // The configuration's checks (`config::peer`) already refused a bad entry.
        PeerSourceConfig::Static(list) => tokio::spawn(async move {
            publisher.publish(normalize(list));
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

/// Checks `host:port` as every peer source does
/// ([`crproxy_core::config::peer::is_host_port`]), when the file is read (and by
/// `crproxy check-config`).
fn validate_peer(entry: &str) -> Result<(), SourceError> {
    if crproxy_core::config::peer::is_host_port(entry) {
        Ok(())
    } else {
        Err(SourceError::InvalidPeer {
            entry: entry.to_owned(),
        })
    }
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
                    detail: format!(
                        "as JSON: {json_err}; as YAML: {}",
                        crproxy_core::yaml_error::one_line(&yaml_err)
                    ),
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

/// Starts the EndpointSlice source of `namespace/service` over `watch`.
pub fn spawn_endpoint_slices(
    watch: watches::WatchClient,
    namespace: String,
    service: String,
    port_name: Option<String>,
    pools: Vec<Arc<PeerPool>>,
) -> JoinHandle<()> {
    let api: Api<EndpointSlice> = Api::namespaced(watch.client().clone(), &namespace);
    let config = watch.config().labels(&service_selector(&service));
    let mut source = SliceSource {
        service,
        port_name,
        publisher: Publisher::new(pools),
        slices: BTreeMap::new(),
        listing: None,
    };
    tokio::spawn(
        async move { watches::follow(api, config, move |update| source.update(update)).await },
    )
}

/// The label selector of a Service's EndpointSlices: Kubernetes labels each slice
/// with the Service's name.
pub fn service_selector(service: &str) -> String {
    format!("kubernetes.io/service-name={service}")
}

struct SliceSource {
    service: String,
    port_name: Option<String>,
    publisher: Publisher,
    /// The slices as last listed and watched, by name.
    slices: BTreeMap<String, EndpointSlice>,
    /// The slices of a list in progress, installed whole when it ends.
    listing: Option<BTreeMap<String, EndpointSlice>>,
}

impl SliceSource {
    fn update(&mut self, update: WatchUpdate<EndpointSlice>) {
        match update {
            WatchUpdate::Event(Event::Init) => self.listing = Some(BTreeMap::new()),
            WatchUpdate::Event(Event::InitApply(slice)) => {
                if self.is_ours(&slice) {
                    if let Some(listing) = &mut self.listing {
                        listing.insert(slice.name_any(), slice);
                    }
                }
            }
            WatchUpdate::Event(Event::InitDone) => {
                self.slices = self.listing.take().unwrap_or_default();
                self.publish();
            }
            WatchUpdate::Event(Event::Apply(slice)) => {
                if self.is_ours(&slice) {
                    self.slices.insert(slice.name_any(), slice);
                    self.publish();
                }
            }
            WatchUpdate::Event(Event::Delete(slice)) => {
                if self.slices.remove(&slice.name_any()).is_some() {
                    self.publish();
                }
            }
            WatchUpdate::Failed(error) => {
                self.listing = None;
                if self.publisher.dropped() {
                    tracing::warn!(%error, service = %self.service, "peer watch subscription failed; keeping the last peer list and listing again");
                } else {
                    tracing::debug!(%error, service = %self.service, "peer watch subscription still failing");
                }
            }
        }
    }

    /// The selector is applied server-side; checking again keeps a server that
    /// ignores it from mixing in another Service's endpoints.
    fn is_ours(&self, slice: &EndpointSlice) -> bool {
        slice.labels().get("kubernetes.io/service-name") == Some(&self.service)
    }

    fn publish(&mut self) {
        let peers = peers_from_slices(self.slices.values(), self.port_name.as_deref());
        self.publisher.update(peers);
    }
}

/// The `host:port` list of ready endpoints across `slices`: the port named
/// `port_name` (or each slice's first port); endpoints whose `ready` condition is
/// explicitly false are left out (an absent condition means ready).
pub fn peers_from_slices<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    port_name: Option<&str>,
) -> Vec<String> {
    let mut peers = Vec::new();
    for slice in slices {
        let ports = slice.ports.as_deref().unwrap_or_default();
        let port = match port_name {
            Some(name) => ports.iter().find(|p| p.name.as_deref() == Some(name)),
            None => ports.first(),
        };
        let Some(port) = port.and_then(|p| p.port) else {
            continue;
        };
        let ipv6 = slice.address_type == "IPv6";
        for endpoint in &slice.endpoints {
            let ready = endpoint.conditions.as_ref().and_then(|c| c.ready);
            if ready == Some(false) {
                continue;
            }
            for address in &endpoint.addresses {
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
