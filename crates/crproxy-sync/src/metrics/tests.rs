//! The dashboard shipped in deploy/monitoring queries the sync's series by name and
//! label: each query must find series this registry really exposes, or its panel
//! stays empty in production.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::SyncMetrics;

const SYNC_PREFIXES: [&str; 2] = ["vcluster_syncer_", "vcluster_writethrough_"];

/// The exposition after one event of every kind.
fn exposition() -> String {
    let metrics = SyncMetrics::new();
    let resource = "backups.example.org/v1";
    metrics.synced(resource, "toHost", "create_host");
    metrics.error(resource, "toHost", "conflict");
    metrics.queue_depth(resource, "toHost", 3);
    metrics.converged(resource, "toHost", 0.2);
    metrics.resolved(resource, "toHost", "Backup", "v1", false);
    metrics.rollback_failed(resource, "host_delete");
    let _leading = metrics.leading();
    metrics.exposition()
}

/// Sample name → the label names its samples carry.
fn series(exposition: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut series: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in exposition.lines().filter(|l| !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = series.entry(line[..name_end].to_owned()).or_default();
        if let Some(inside) = line[name_end..]
            .strip_prefix('{')
            .and_then(|rest| rest.split('}').next())
        {
            labels.extend(
                inside
                    .split(',')
                    .filter_map(|pair| pair.split('=').next())
                    .map(str::to_owned),
            );
        }
    }
    series
}

/// Every PromQL expression of the dashboard that reads a sync series.
fn sync_queries() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/monitoring/crproxy-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard is in the repository");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let panels = dashboard["panels"].as_array().cloned().unwrap_or_default();
    panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .filter(|e| SYNC_PREFIXES.iter().any(|p| e.contains(p)))
        .collect()
}

fn names_in(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for prefix in SYNC_PREFIXES {
        let mut rest = expr;
        while let Some(start) = rest.find(prefix) {
            let tail = &rest[start..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    names
}

/// Labels a query groups by (`pod` comes from the scrape, not the registry).
fn grouped_by(expr: &str) -> BTreeSet<String> {
    expr.split("by (")
        .skip(1)
        .filter_map(|part| part.split(')').next())
        .flat_map(|inside| inside.split(','))
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty() && l != "pod")
        .collect()
}

#[test]
fn every_dashboard_sync_query_reads_exposed_series_and_labels() {
    let series = series(&exposition());
    let queries = sync_queries();
    let mut used = BTreeSet::new();
    for expr in &queries {
        let mut labels: BTreeSet<String> = ["le".to_owned()].into();
        for name in names_in(expr) {
            let carried = series
                .get(&name)
                .unwrap_or_else(|| panic!("dashboard query reads {name}, not exposed: {expr}"));
            labels.extend(carried.iter().cloned());
            used.insert(name);
        }
        for label in grouped_by(expr) {
            assert!(
                labels.contains(&label),
                "dashboard query groups by {label}, which its series lack: {expr}"
            );
        }
    }
    // Every sync family has a panel.
    for name in [
        "vcluster_syncer_objects_synced_total",
        "vcluster_syncer_errors_total",
        "vcluster_syncer_queue_depth",
        "vcluster_syncer_converge_seconds_bucket",
        "vcluster_syncer_leader",
        "vcluster_syncer_resolved_resources",
        "vcluster_writethrough_rollback_failures_total",
    ] {
        assert!(used.contains(name), "the dashboard does not show {name}");
    }
}

#[test]
fn a_misspelt_query_is_caught() {
    let series = series(&exposition());
    assert!(!series.contains_key("vcluster_syncer_object_synced_total"));
    assert!(
        names_in("rate(vcluster_syncer_errors_total[5m])").contains("vcluster_syncer_errors_total")
    );
    assert_eq!(
        grouped_by("sum by (resource, pod) (x)"),
        ["resource".to_owned()].into()
    );
}

/// The leader gauge reads 1 while this replica's term lasts and 0 once it ends,
/// whichever way it ends: the supervisor holds the guard for the term.
#[test]
fn the_leader_gauge_falls_when_the_term_ends() {
    let metrics = SyncMetrics::new();
    let leader_line = |m: &SyncMetrics| {
        m.exposition()
            .lines()
            .find(|l| l.starts_with("vcluster_syncer_leader "))
            .map(str::to_owned)
    };
    assert_eq!(
        leader_line(&metrics).as_deref(),
        Some("vcluster_syncer_leader 0")
    );
    let term = metrics.leading();
    assert_eq!(
        leader_line(&metrics).as_deref(),
        Some("vcluster_syncer_leader 1")
    );
    drop(term);
    assert_eq!(
        leader_line(&metrics).as_deref(),
        Some("vcluster_syncer_leader 0")
    );
}
