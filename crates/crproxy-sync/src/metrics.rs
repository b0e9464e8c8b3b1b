//! The sync's Prometheus series, served under `/metrics/syncer` (and `/metrics`).
//!
//! Every series carries `resource` (the config key, e.g. `backups.example.org/v1`) and
//! `direction` (`toHost` or `fromHost`).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Buckets of the time from a change being seen to both sides agreeing.
pub const CONVERGE_BUCKETS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    resource: String,
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    resource: String,
    direction: &'static str,
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    resource: String,
    direction: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RollbackLabels {
    resource: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResolvedLabels {
    resource: String,
    direction: &'static str,
    source: &'static str,
    kind: String,
    version: String,
}

/// The sync's metric families; cheap to clone.
#[derive(Clone, Debug)]
pub struct SyncMetrics {
    synced: Family<ActionLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    queue_depth: Family<TypeLabels, Gauge>,
    converge: Family<TypeLabels, Histogram, fn() -> Histogram>,
    resolved: Family<ResolvedLabels, Gauge>,
    leader: Gauge,
    rollback_failures: Family<RollbackLabels, Counter>,
}

fn converge_histogram() -> Histogram {
    Histogram::new(CONVERGE_BUCKETS)
}

impl SyncMetrics {
    pub fn new() -> Arc<SyncMetrics> {
        Arc::new(SyncMetrics {
            synced: Family::default(),
            errors: Family::default(),
            queue_depth: Family::default(),
            converge: Family::new_with_constructor(converge_histogram),
            resolved: Family::default(),
            leader: Gauge::default(),
            rollback_failures: Family::default(),
        })
    }

    /// The Prometheus text exposition of these metrics alone, for tests.
    #[cfg(test)]
    pub(crate) fn exposition(&self) -> String {
        let mut registry = Registry::default();
        self.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .expect("encoding into a String cannot fail");
        text
    }

    /// Adds every family to `registry` (the process-wide one the metrics listener
    /// serves). Counters are registered without `_total`; the encoder appends it.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "vcluster_syncer_objects_synced",
            "Objects written by the syncer, by action",
            self.synced.clone(),
        );
        registry.register(
            "vcluster_syncer_errors",
            "Failed sync attempts by reason",
            self.errors.clone(),
        );
        registry.register(
            "vcluster_syncer_queue_depth",
            "Objects waiting to be synced",
            self.queue_depth.clone(),
        );
        registry.register(
            "vcluster_syncer_converge_seconds",
            "Time from a change being seen to both clusters agreeing",
            self.converge.clone(),
        );
        registry.register(
            "vcluster_syncer_resolved_resources",
            "Synced types resolved at start-up (1 per type), by what serves them on the host",
            self.resolved.clone(),
        );
        registry.register(
            "vcluster_writethrough_rollback_failures",
            "Write-through rollbacks that failed or gave up, by reason",
            self.rollback_failures.clone(),
        );
        registry.register(
            "vcluster_syncer_leader",
            "1 while this replica is the elected syncer",
            self.leader.clone(),
        );
    }

    /// A write-through rollback failed; `reason` is one of the spec's reasons.
    pub(crate) fn rollback_failed(&self, resource: &str, reason: &'static str) {
        self.rollback_failures
            .get_or_create(&RollbackLabels {
                resource: resource.to_owned(),
                reason,
            })
            .inc();
    }

    pub(crate) fn synced(&self, resource: &str, direction: &'static str, action: &'static str) {
        self.synced
            .get_or_create(&ActionLabels {
                resource: resource.to_owned(),
                direction,
                action,
            })
            .inc();
    }

    pub(crate) fn error(&self, resource: &str, direction: &'static str, reason: &'static str) {
        self.errors
            .get_or_create(&ErrorLabels {
                resource: resource.to_owned(),
                direction,
                reason,
            })
            .inc();
    }

    pub(crate) fn queue_depth(&self, resource: &str, direction: &'static str, depth: usize) {
        self.queue_depth
            .get_or_create(&TypeLabels {
                resource: resource.to_owned(),
                direction,
            })
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    pub(crate) fn converged(&self, resource: &str, direction: &'static str, seconds: f64) {
        self.converge
            .get_or_create(&TypeLabels {
                resource: resource.to_owned(),
                direction,
            })
            .observe(seconds);
    }

    pub(crate) fn resolved(
        &self,
        resource: &str,
        direction: &'static str,
        kind: &str,
        version: &str,
        aggregated: bool,
    ) {
        self.resolved
            .get_or_create(&ResolvedLabels {
                resource: resource.to_owned(),
                direction,
                source: if aggregated {
                    "aggregated-apiserver"
                } else {
                    "crd"
                },
                kind: kind.to_owned(),
                version: version.to_owned(),
            })
            .set(1);
    }

    /// Sets `vcluster_syncer_leader` to 1 until the returned guard is dropped,
    /// however this replica's term ends (lost, stopped, or its task aborted).
    pub(crate) fn leading(&self) -> LeaderGauge {
        self.leader.set(1);
        LeaderGauge(self.leader.clone())
    }
}

/// `vcluster_syncer_leader` at 1 while it lives; see [`SyncMetrics::leading`].
#[must_use = "the gauge reads 0 again once this is dropped"]
pub(crate) struct LeaderGauge(Gauge);

impl Drop for LeaderGauge {
    fn drop(&mut self) {
        self.0.set(0);
    }
}

#[cfg(test)]
mod tests;
