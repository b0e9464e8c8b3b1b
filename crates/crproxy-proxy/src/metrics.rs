//! The `vcluster_proxy_*` Prometheus series.
//!
//! Names, types and label sets are part of the compatibility surface: operators reuse
//! documented dashboards and alert rules unchanged, so every series here matches the
//! operations guide exactly. One [`Metrics`] exists per process; each proxy target gets
//! a cheap [`TargetMetrics`] handle that stamps `target="<project>/<name>"` on every
//! series it touches.
//!
//! Counters live in label families, so a counter series only exists after its first
//! event (the guide tells operators not to alert on counter absence). The peer gauges
//! are different: they are computed from the live pools at scrape time by
//! a custom collector, so an expired quarantine already shows as `half_open` without any
//! request having touched the pool.

use std::hash::Hash;
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use crproxy_core::reason::Reason;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::pool::PeerPool;
use crproxy_core::locks;

/// The content type to serve [`Metrics::encode`] output with.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type to serve [`Metrics::encode_prometheus_text`] output with.
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Request latency buckets: fine-grained below a second, then up to the 60 s cap on
/// non-watch requests, so requests killed by the deadline land in the last bucket.
pub const REQUEST_DURATION_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
];

/// Dial latency buckets, up to the 5 s dial timeout.
pub const DIAL_DURATION_BUCKETS: [f64; 11] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    target: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    target: Arc<str>,
    group_version: Arc<str>,
    verb: &'static str,
    code: u16,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabels {
    target: Arc<str>,
    verb: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    target: Arc<str>,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupVersionReasonLabels {
    target: Arc<str>,
    group_version: Arc<str>,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupVersionLabels {
    target: Arc<str>,
    group_version: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheResultLabels {
    target: Arc<str>,
    group_version: Arc<str>,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerStateLabels {
    target: Arc<str>,
    group_version: Arc<str>,
    state: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn request_duration_histogram() -> Histogram {
    Histogram::new(REQUEST_DURATION_BUCKETS)
}

fn dial_duration_histogram() -> Histogram {
    Histogram::new(DIAL_DURATION_BUCKETS)
}

/// Every family, shared by all target handles.
#[derive(Debug)]
struct Families {
    request: Family<RequestLabels, Counter>,
    request_duration: HistogramFamily<VerbLabels>,
    terminations: Family<ReasonLabels, Counter>,
    inflight: Family<TargetLabels, Gauge>,
    discovery_fallbacks: Family<GroupVersionReasonLabels, Counter>,
    active_watches: Family<TargetLabels, Gauge>,
    watch_events: Family<TargetLabels, Counter>,
    peer_quarantines: Family<TargetLabels, Counter>,
    all_peers_quarantined: Family<TargetLabels, Counter>,
    peer_recoveries: Family<TargetLabels, Counter>,
    dial_failures: Family<ReasonLabels, Counter>,
    dial_duration: HistogramFamily<TargetLabels>,
    ownership_cache: Family<CacheResultLabels, Counter>,
}

/// The process-wide metrics registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    families: Arc<Families>,
    pools: Arc<PoolCollector>,
}

impl Metrics {
    /// Creates the registry with every `vcluster_proxy_*` family registered.
    pub fn new() -> Arc<Metrics> {
        Self::with_extra(|_| {})
    }

    /// [`Metrics::new`], letting another component (the custom resource sync) add its
    /// families to the same registry, so one listener serves every series.
    pub fn with_extra(extra: impl FnOnce(&mut Registry)) -> Arc<Metrics> {
        let families = Arc::new(Families {
            request: Family::default(),
            request_duration: Family::new_with_constructor(request_duration_histogram),
            terminations: Family::default(),
            inflight: Family::default(),
            discovery_fallbacks: Family::default(),
            active_watches: Family::default(),
            watch_events: Family::default(),
            peer_quarantines: Family::default(),
            all_peers_quarantined: Family::default(),
            peer_recoveries: Family::default(),
            dial_failures: Family::default(),
            dial_duration: Family::new_with_constructor(dial_duration_histogram),
            ownership_cache: Family::default(),
        });
        let mut registry = Registry::default();
        let f = &families;
        // Counters are registered without the `_total` suffix: the OpenMetrics encoder
        // appends it to the sample name, which gives the documented series names.
        // Help texts have no final period because the registry adds one.
        registry.register(
            "vcluster_proxy_request",
            "Proxied requests by group/version, verb, HTTP status code and outcome reason",
            f.request.clone(),
        );
        registry.register(
            "vcluster_proxy_request_duration_seconds",
            "Latency of non-watch proxied requests, up to the 60 second request cap",
            f.request_duration.clone(),
        );
        registry.register(
            "vcluster_proxy_request_terminations",
            "Requests ended by the proxy itself (deadline, upgrade_rejected) rather than the target",
            f.terminations.clone(),
        );
        registry.register(
            "vcluster_proxy_inflight_requests",
            "Non-watch requests being served right now",
            f.inflight.clone(),
        );
        registry.register(
            "vcluster_proxy_discovery_fallbacks",
            "Discovery requests answered with the locally built fallback document",
            f.discovery_fallbacks.clone(),
        );
        registry.register(
            "vcluster_proxy_active_watches",
            "Watch streams open right now",
            f.active_watches.clone(),
        );
        registry.register(
            "vcluster_proxy_watch_events",
            "Events relayed on JSON and CBOR-sequence watch streams",
            f.watch_events.clone(),
        );
        registry.register(
            "vcluster_proxy_peer_quarantines",
            "Times a peer left rotation after consecutive dial failures (including failed trial dials)",
            f.peer_quarantines.clone(),
        );
        registry.register(
            "vcluster_proxy_target_all_peers_quarantined",
            "Times a quarantine left the target with no selectable peer",
            f.all_peers_quarantined.clone(),
        );
        registry.register(
            "vcluster_proxy_peer_recoveries",
            "Times a peer that had failed dials was dialled successfully again",
            f.peer_recoveries.clone(),
        );
        registry.register(
            "vcluster_proxy_peer_dial_failures",
            "Failed peer dials, plus requests rejected before any peer was dialled, by reason",
            f.dial_failures.clone(),
        );
        registry.register(
            "vcluster_proxy_peer_dial_duration_seconds",
            "Latency of attempted peer dials (TCP connect and TLS handshake), up to the 5 second dial timeout",
            f.dial_duration.clone(),
        );
        registry.register(
            "crproxy_ownership_cache_lookups",
            "Owned-mode PUT, PATCH and DELETE by what the ownership cache did for them (hit: one exchange; stale: refused by its pin or not the state the caller named, then checked; miss, unsynced: checked)",
            f.ownership_cache.clone(),
        );
        let pools = Arc::new(PoolCollector::default());
        registry.register_collector(Box::new(pools.clone()));
        extra(&mut registry);
        Arc::new(Metrics {
            registry,
            families,
            pools,
        })
    }

    /// The handle for one proxy target, `target` being `<project>/<name>`.
    ///
    /// The two gauges of the target start at zero here so a dashboard sees them before
    /// the first request; counters still wait for their first event.
    pub fn target(&self, target: &str) -> TargetMetrics {
        let target: Arc<str> = Arc::from(target);
        let labels = TargetLabels {
            target: Arc::clone(&target),
        };
        TargetMetrics {
            shared: Arc::new(TargetShared {
                families: self.families.clone(),
                pools: self.pools.clone(),
                inflight: self.families.inflight.get_or_create_owned(&labels),
                active_watches: self.families.active_watches.get_or_create_owned(&labels),
                watch_events: OnceLock::new(),
                requests: ResolvedSeries::default(),
                request_durations: ResolvedSeries::default(),
                ownership_cache: ResolvedSeries::default(),
                target,
            }),
        }
    }

    /// Reports `pool` in the scrape-time peer gauges. [`PeerPool::new`] already
    /// registers every pool under its own target and group/version, so this is only
    /// needed for a pool built some other way; registering the same pool twice is
    /// harmless (it is listed once).
    pub fn register_pool(&self, target: &str, group_version: &str, pool: &Arc<PeerPool>) {
        self.pools
            .register(target, group_version, Arc::downgrade(pool));
    }

    /// The OpenMetrics text exposition of every series, ending with `# EOF`.
    /// Serve it with [`OPENMETRICS_CONTENT_TYPE`].
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error here could only come from a
        // collector, and a partial scrape is more useful than none.
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            tracing::warn!("encoding metrics failed; serving a partial scrape");
        }
        out
    }

    /// The same series in the Prometheus text format (0.0.4), for scrapers and tools
    /// that do not speak OpenMetrics (`promtool check metrics`, plain `curl | grep`).
    /// Sample lines are identical; only the metadata differs: counter families are
    /// named with their `_total` suffix, and the OpenMetrics-only `# UNIT` and
    /// `# EOF` lines are dropped.
    pub fn encode_prometheus_text(&self) -> String {
        openmetrics_to_prometheus_text(&self.encode())
    }

    /// Picks the format from an `Accept` header: OpenMetrics when the scraper asks
    /// for it, the Prometheus text format otherwise. Returns the body and its
    /// content type.
    pub fn encode_for_accept(&self, accept: Option<&str>) -> (String, &'static str) {
        let wants_openmetrics = accept.is_some_and(|a| a.contains("application/openmetrics-text"));
        if wants_openmetrics {
            (self.encode(), OPENMETRICS_CONTENT_TYPE)
        } else {
            (self.encode_prometheus_text(), PROMETHEUS_TEXT_CONTENT_TYPE)
        }
    }
}

/// Rewrites OpenMetrics text from [`Metrics::encode`] into the Prometheus text format.
fn openmetrics_to_prometheus_text(openmetrics: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for line in openmetrics.lines() {
        if let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.strip_suffix(" counter"))
        {
            counters.insert(name.to_owned());
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|prefix| line.strip_prefix(prefix).map(|rest| (prefix, rest)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                out.push(' ');
                out.push_str(tail);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// A per-target handle on [`Metrics`]. Clone it freely.
///
/// Label values are shared (`Arc<str>`, `&'static str`), so counting a request
/// allocates nothing; the series touched on every request or watch event are
/// kept resolved per target (see [`TargetShared`]).
#[derive(Clone, Debug)]
pub struct TargetMetrics {
    /// One reference for all of it: a request's body and its watchdog each hold
    /// a clone, and every reference count changed is a cache line the worker
    /// threads pass between them.
    shared: Arc<TargetShared>,
}

/// What every handle of one target shares: its label, the families, and the
/// series it touches on every request or watch event, resolved instead of being
/// looked up in their family each time (once for those whose labels never vary,
/// as they first occur for the others). A metric handle shares its value with
/// the family's series.
#[derive(Debug)]
struct TargetShared {
    target: Arc<str>,
    families: Arc<Families>,
    pools: Arc<PoolCollector>,
    inflight: Gauge,
    active_watches: Gauge,
    /// Resolved on the first event: a counter series only exists after its
    /// first event.
    watch_events: OnceLock<Counter>,
    requests: ResolvedSeries<RequestLabels, Counter>,
    request_durations: ResolvedSeries<VerbLabels, Histogram>,
    ownership_cache: ResolvedSeries<CacheResultLabels, Counter>,
}

/// How many series of one family a target keeps resolved; past that its family
/// is asked directly, so a peer answering with ever new status codes cannot
/// make the list long.
const MAX_RESOLVED_SERIES: usize = 32;

/// The series of one family that a target has touched, found again by comparing
/// a few words of their labels. A family finds a series by hashing the whole
/// label set with SipHash (the target and group/version strings included),
/// about 900 instructions a request for `vcluster_proxy_request` alone; a
/// target touches only a handful of series per family in steady state.
#[derive(Debug)]
struct ResolvedSeries<L, M> {
    series: RwLock<Vec<(L, M)>>,
}

impl<L, M> Default for ResolvedSeries<L, M> {
    fn default() -> Self {
        ResolvedSeries {
            series: RwLock::new(Vec::new()),
        }
    }
}

impl<L: Clone + Eq + Hash, M: Clone> ResolvedSeries<L, M> {
    /// Applies `record` to the series whose labels `matches`, creating it in
    /// `family` under `labels()` the first time (a counter series still appears
    /// with its first event).
    fn record<C: MetricConstructor<M>>(
        &self,
        family: &Family<L, M, C>,
        matches: impl Fn(&L) -> bool,
        labels: impl FnOnce() -> L,
        record: impl FnOnce(&M),
    ) {
        let full = {
            let series = locks::read(&self.series);
            if let Some((_, metric)) = series.iter().find(|(found, _)| matches(found)) {
                return record(metric);
            }
            series.len() >= MAX_RESOLVED_SERIES
        };
        let labels = labels();
        let metric = family.get_or_create_owned(&labels);
        record(&metric);
        if full {
            // The write lock would only find the list full again.
            return;
        }
        let mut series = locks::write(&self.series);
        if series.len() < MAX_RESOLVED_SERIES && !series.iter().any(|(found, _)| matches(found)) {
            series.push((labels, metric));
        }
    }
}

impl TargetMetrics {
    /// The `target` label value this handle stamps.
    pub fn target_label(&self) -> &str {
        &self.shared.target
    }

    fn labels(&self) -> TargetLabels {
        TargetLabels {
            target: Arc::clone(&self.shared.target),
        }
    }

    fn reason_labels(&self, reason: Reason) -> ReasonLabels {
        ReasonLabels {
            target: Arc::clone(&self.shared.target),
            reason: reason.as_str(),
        }
    }

    /// Counts one finished request.
    pub fn request(&self, group_version: &Arc<str>, verb: &'static str, code: u16, reason: Reason) {
        let reason = reason.as_str();
        self.shared.requests.record(
            &self.shared.families.request,
            |labels| {
                labels.code == code
                    && labels.verb == verb
                    && labels.reason == reason
                    && labels.group_version == *group_version
            },
            || RequestLabels {
                target: Arc::clone(&self.shared.target),
                group_version: Arc::clone(group_version),
                verb,
                code,
                reason,
            },
            |counter| {
                counter.inc();
            },
        );
    }

    /// Observes the latency of one non-watch request.
    pub fn request_duration(&self, verb: &'static str, seconds: f64) {
        self.shared.request_durations.record(
            &self.shared.families.request_duration,
            |labels| labels.verb == verb,
            || VerbLabels {
                target: Arc::clone(&self.shared.target),
                verb,
            },
            |histogram| histogram.observe(seconds),
        );
    }

    /// Counts a request the proxy itself ended (`deadline`, `upgrade_rejected`).
    pub fn termination(&self, reason: Reason) {
        self.shared
            .families
            .terminations
            .get_or_create(&self.reason_labels(reason))
            .inc();
    }

    /// Marks one non-watch request in flight until the guard drops.
    pub fn inflight(&self) -> InflightGuard {
        let gauge = self.shared.inflight.clone();
        gauge.inc();
        InflightGuard { gauge }
    }

    /// Counts a discovery request answered from the local fallback document.
    pub fn discovery_fallback(&self, group_version: &str, reason: Reason) {
        self.shared
            .families
            .discovery_fallbacks
            .get_or_create(&GroupVersionReasonLabels {
                target: Arc::clone(&self.shared.target),
                group_version: Arc::from(group_version),
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Marks one watch stream open until the guard drops.
    pub fn active_watch(&self) -> WatchGuard {
        let gauge = self.shared.active_watches.clone();
        gauge.inc();
        WatchGuard { gauge }
    }

    /// Counts `n` relayed watch events.
    pub fn watch_events(&self, n: u64) {
        self.shared
            .watch_events
            .get_or_init(|| {
                self.shared
                    .families
                    .watch_events
                    .get_or_create_owned(&self.labels())
            })
            .inc_by(n);
    }

    /// Counts a peer entering quarantine.
    pub fn peer_quarantined(&self) {
        self.shared
            .families
            .peer_quarantines
            .get_or_create(&self.labels())
            .inc();
    }

    /// Counts a quarantine that left no selectable peer.
    pub fn all_peers_quarantined(&self) {
        self.shared
            .families
            .all_peers_quarantined
            .get_or_create(&self.labels())
            .inc();
    }

    /// Counts a failing peer dialled successfully again.
    pub fn peer_recovered(&self) {
        self.shared
            .families
            .peer_recoveries
            .get_or_create(&self.labels())
            .inc();
    }

    /// Counts one failed dial, or one request rejected before any dial.
    pub fn dial_failure(&self, reason: Reason) {
        self.shared
            .families
            .dial_failures
            .get_or_create(&self.reason_labels(reason))
            .inc();
    }

    /// Counts one owned-mode named mutation by its ownership cache `result`:
    /// `hit`, `stale`, `miss` or `unsynced`.
    pub fn ownership_cache(&self, group_version: &Arc<str>, result: &'static str) {
        self.shared.ownership_cache.record(
            &self.shared.families.ownership_cache,
            |labels| labels.result == result && labels.group_version == *group_version,
            || CacheResultLabels {
                target: Arc::clone(&self.shared.target),
                group_version: Arc::clone(group_version),
                result,
            },
            |counter| {
                counter.inc();
            },
        );
    }

    /// Observes the latency of one attempted dial, successful or not.
    pub fn dial_duration(&self, seconds: f64) {
        self.shared
            .families
            .dial_duration
            .get_or_create(&self.labels())
            .observe(seconds);
    }

    /// Reports `pool` in the scrape-time peer gauges under this target and
    /// `group_version`. [`PeerPool::new`] calls this itself; the registration ends
    /// when the pool is dropped.
    pub fn register_pool(&self, group_version: &str, pool: Weak<PeerPool>) {
        self.shared
            .pools
            .register(&self.shared.target, group_version, pool);
    }
}

/// Decrements `vcluster_proxy_inflight_requests` when dropped.
#[derive(Debug)]
pub struct InflightGuard {
    gauge: Gauge,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Decrements `vcluster_proxy_active_watches` when dropped.
#[derive(Debug)]
pub struct WatchGuard {
    gauge: Gauge,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

#[derive(Debug)]
struct RegisteredPool {
    target: Arc<str>,
    group_version: Arc<str>,
    pool: Weak<PeerPool>,
}

/// Computes the peer gauges from the live pools on every scrape.
#[derive(Debug, Default)]
struct PoolCollector {
    pools: Mutex<Vec<RegisteredPool>>,
}

impl PoolCollector {
    fn register(&self, target: &str, group_version: &str, pool: Weak<PeerPool>) {
        let mut pools = locks::lock(&self.pools);
        pools.retain(|p| p.pool.strong_count() > 0);
        let known = pools.iter().any(|p| {
            p.pool.ptr_eq(&pool) && &*p.target == target && &*p.group_version == group_version
        });
        if !known {
            pools.push(RegisteredPool {
                target: Arc::from(target),
                group_version: Arc::from(group_version),
                pool,
            });
        }
    }
}

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Snapshot first, then encode, so no pool lock is held while writing.
        let snapshots: Vec<(GroupVersionLabels, crate::pool::PoolSnapshot)> = {
            let pools = locks::lock(&self.pools);
            pools
                .iter()
                .filter_map(|p| {
                    p.pool.upgrade().map(|pool| {
                        (
                            GroupVersionLabels {
                                target: p.target.clone(),
                                group_version: p.group_version.clone(),
                            },
                            pool.snapshot(),
                        )
                    })
                })
                .collect()
        };

        {
            let mut metric = encoder.encode_descriptor(
                "vcluster_proxy_peers",
                "Peers of the target by health state, computed at scrape time.",
                None,
                MetricType::Gauge,
            )?;
            for (labels, snap) in &snapshots {
                for (state, count) in [
                    ("healthy", snap.healthy),
                    ("quarantined", snap.quarantined),
                    ("half_open", snap.half_open),
                ] {
                    let labels = PeerStateLabels {
                        target: labels.target.clone(),
                        group_version: labels.group_version.clone(),
                        state,
                    };
                    let value = i64::try_from(count).unwrap_or(i64::MAX);
                    metric.encode_family(&labels)?.encode_gauge(&value)?;
                }
            }
        }
        {
            let mut metric = encoder.encode_descriptor(
                "vcluster_proxy_peer_cache_synced",
                "1 while the pool holds a current, trusted peer list; 0 before the first list or once it went stale.",
                None,
                MetricType::Gauge,
            )?;
            for (labels, snap) in &snapshots {
                let value: i64 = if snap.synced { 1 } else { 0 };
                metric.encode_family(labels)?.encode_gauge(&value)?;
            }
        }
        {
            let mut metric = encoder.encode_descriptor(
                "vcluster_proxy_peer_list_age_seconds",
                "Seconds since the last peer list was published; absent before the first one.",
                None,
                MetricType::Gauge,
            )?;
            for (labels, snap) in &snapshots {
                if let Some(age) = snap.list_age {
                    metric
                        .encode_family(labels)?
                        .encode_gauge(&age.as_secs_f64())?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
