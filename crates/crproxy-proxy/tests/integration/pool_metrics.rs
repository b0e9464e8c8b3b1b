//! The exposition: every documented `vcluster_proxy_*` and `crproxy_*` series with its type and label
//! set, checked against a live scrape; promtool accepting the output; the alert rules
//! evaluating over series with exactly these names.

use crate::pool_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use crproxy_core::reason::Reason;
use crproxy_proxy::metrics::Metrics;
use pool_support::*;

/// The metrics reference: series name, type, labels besides `target`.
const SPEC: &[(&str, &str, &[&str])] = &[
    (
        "vcluster_proxy_request_total",
        "counter",
        &["group_version", "verb", "code", "reason"],
    ),
    (
        "vcluster_proxy_request_duration_seconds",
        "histogram",
        &["verb"],
    ),
    (
        "vcluster_proxy_request_terminations_total",
        "counter",
        &["reason"],
    ),
    ("vcluster_proxy_inflight_requests", "gauge", &[]),
    (
        "vcluster_proxy_discovery_fallbacks_total",
        "counter",
        &["group_version", "reason"],
    ),
    ("vcluster_proxy_peers", "gauge", &["group_version", "state"]),
    (
        "vcluster_proxy_peer_cache_synced",
        "gauge",
        &["group_version"],
    ),
    (
        "vcluster_proxy_peer_list_age_seconds",
        "gauge",
        &["group_version"],
    ),
    ("vcluster_proxy_peer_quarantines_total", "counter", &[]),
    (
        "vcluster_proxy_target_all_peers_quarantined_total",
        "counter",
        &[],
    ),
    ("vcluster_proxy_peer_recoveries_total", "counter", &[]),
    (
        "vcluster_proxy_peer_dial_failures_total",
        "counter",
        &["reason"],
    ),
    (
        "vcluster_proxy_peer_dial_duration_seconds",
        "histogram",
        &[],
    ),
    ("vcluster_proxy_active_watches", "gauge", &[]),
    ("vcluster_proxy_watch_events_total", "counter", &[]),
    (
        "crproxy_ownership_cache_lookups_total",
        "counter",
        &["group_version", "result"],
    ),
];

/// Touches every series once, including a pool with a published list.
fn exercise(h: &Harness) {
    let t = &h.target;
    let group_version = std::sync::Arc::from(GROUP_VERSION);
    t.request(&group_version, "get", 200, Reason::Upstream);
    t.request(&group_version, "list", 503, Reason::StalePeers);
    t.request_duration("get", 0.02);
    t.termination(Reason::Deadline);
    t.discovery_fallback(GROUP_VERSION, Reason::UpstreamError);
    t.watch_events(3);
    t.peer_quarantined();
    t.all_peers_quarantined();
    t.peer_recovered();
    t.dial_failure(Reason::Timeout);
    t.dial_duration(0.004);
    t.ownership_cache(&group_version, "hit");
    h.pool.publish(vec!["127.0.0.1:1".to_owned()]);
}

/// Label keys per series name (histogram samples keep their suffixes).
fn label_keys(scrape: &Scrape) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, samples) in &scrape.samples {
        for (labels, _) in samples {
            out.entry(name.clone())
                .or_default()
                .extend(labels.keys().cloned());
        }
    }
    out
}

fn expected_samples() -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for (name, kind, labels) in SPEC {
        let mut keys: BTreeSet<String> = labels.iter().map(|l| (*l).to_owned()).collect();
        keys.insert("target".to_owned());
        if *kind == "histogram" {
            out.insert(format!("{name}_sum"), keys.clone());
            out.insert(format!("{name}_count"), keys.clone());
            keys.insert("le".to_owned());
            out.insert(format!("{name}_bucket"), keys);
        } else {
            out.insert((*name).to_owned(), keys);
        }
    }
    out
}

// Paused so the list age is identical in the two scrapes compared below.
#[tokio::test(start_paused = true)]
async fn every_documented_series_has_its_type_and_labels() {
    let h = Harness::new();
    let _inflight = h.target.inflight();
    let _watch = h.target.active_watch();
    exercise(&h);
    let scrape = h.scrape();

    assert_eq!(label_keys(&scrape), expected_samples(), "{}", scrape.text);

    // OpenMetrics names counter families without `_total`; samples carry it.
    let mut expected_types = BTreeMap::new();
    for (name, kind, _) in SPEC {
        let family = name.strip_suffix("_total").unwrap_or(name);
        expected_types.insert(family.to_owned(), (*kind).to_owned());
    }
    assert_eq!(scrape.types, expected_types);
    assert!(scrape.text.ends_with("# EOF\n"));

    // The Prometheus text variant names counter families with `_total`.
    let text = Scrape::parse(&h.metrics.encode_prometheus_text());
    let prometheus_types: BTreeMap<String, String> = SPEC
        .iter()
        .map(|(name, kind, _)| ((*name).to_owned(), (*kind).to_owned()))
        .collect();
    assert_eq!(text.types, prometheus_types);
    assert_eq!(text.samples, scrape.samples);
}

#[tokio::test]
async fn values_land_on_the_right_series() {
    let h = Harness::new();
    exercise(&h);
    {
        let _a = h.target.inflight();
        let _b = h.target.inflight();
        let _w = h.target.active_watch();
        let s = h.scrape();
        assert_eq!(s.value("vcluster_proxy_inflight_requests", &[]), 2.0);
        assert_eq!(s.value("vcluster_proxy_active_watches", &[]), 1.0);
    }
    let s = h.scrape();
    assert_eq!(s.value("vcluster_proxy_inflight_requests", &[]), 0.0);
    assert_eq!(s.value("vcluster_proxy_active_watches", &[]), 0.0);
    assert_eq!(
        s.value(
            "vcluster_proxy_request_total",
            &[
                ("group_version", GROUP_VERSION),
                ("verb", "list"),
                ("code", "503"),
                ("reason", "stale_peers"),
            ]
        ),
        1.0
    );
    assert_eq!(
        s.value(
            "vcluster_proxy_request_terminations_total",
            &[("reason", "deadline")]
        ),
        1.0
    );
    assert_eq!(
        s.value(
            "vcluster_proxy_discovery_fallbacks_total",
            &[
                ("group_version", GROUP_VERSION),
                ("reason", "upstream_error")
            ]
        ),
        1.0
    );
    assert_eq!(s.value("vcluster_proxy_watch_events_total", &[]), 3.0);
    assert_eq!(
        s.value(
            "crproxy_ownership_cache_lookups_total",
            &[("group_version", GROUP_VERSION), ("result", "hit")]
        ),
        1.0
    );
    assert_eq!(
        s.value(
            "vcluster_proxy_request_duration_seconds_bucket",
            &[("verb", "get"), ("le", "0.025")]
        ),
        1.0
    );
    assert_eq!(
        s.value(
            "vcluster_proxy_request_duration_seconds_bucket",
            &[("verb", "get"), ("le", "60.0")]
        ),
        1.0,
        "the last finite bucket is the 60 s request cap"
    );
    assert_eq!(s.peers("healthy"), 1.0);
}

#[tokio::test]
async fn counters_appear_only_after_their_first_event() {
    let metrics = Metrics::new();
    let _target = metrics.target(TARGET);
    let s = Scrape::parse(&metrics.encode());
    let names: BTreeSet<&str> = s.samples.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "vcluster_proxy_active_watches",
            "vcluster_proxy_inflight_requests"
        ]),
        "{}",
        s.text
    );
}

#[tokio::test]
async fn targets_and_pools_are_kept_apart() {
    let h = Harness::new();
    let other = h.metrics.target("p-other/second");
    other.dial_failure(Reason::NoPeer);
    let second_pool = crproxy_proxy::pool::PeerPool::new(
        "other.example.com/v1".to_owned(),
        h.pki.dialer(),
        other.clone(),
    );
    second_pool.publish(Vec::new());
    let s = h.scrape();
    assert_eq!(s.dial_failures("no_peer"), 0.0);
    assert_eq!(
        s.get(
            "vcluster_proxy_peer_dial_failures_total",
            &[("target", "p-other/second"), ("reason", "no_peer")]
        ),
        Some(1.0)
    );
    let synced = |target: &str, gv: &str| {
        s.get(
            "vcluster_proxy_peer_cache_synced",
            &[("target", target), ("group_version", gv)],
        )
    };
    assert_eq!(synced(TARGET, GROUP_VERSION), Some(0.0));
    assert_eq!(synced("p-other/second", "other.example.com/v1"), Some(1.0));

    // Registering again (as an assembler might) does not duplicate series.
    h.metrics
        .register_pool("p-other/second", "other.example.com/v1", &second_pool);
    let s = h.scrape();
    let peer_series = s.samples["vcluster_proxy_peers"].len();
    assert_eq!(peer_series, 6, "three states for each of two pools");

    // A dropped pool leaves the scrape.
    drop(second_pool);
    let s = h.scrape();
    assert_eq!(
        s.get(
            "vcluster_proxy_peer_cache_synced",
            &[
                ("target", "p-other/second"),
                ("group_version", "other.example.com/v1")
            ]
        ),
        None
    );
}

// ---- promtool ---------------------------------------------------------------------

/// The shipped alert rules and their promtool unit tests live with the deploy
/// manifests, so the rules operators install are the rules tested here.
fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/prometheus")
}

/// Where promtool comes from, for the failure a CI run without it gets.
const PROMTOOL_HINT: &str = "Debian package `prometheus`, which scripts/test installs";

/// Runs promtool with `args` in `dir`; the run must succeed.
fn promtool(dir: &Path, args: &[&str]) -> std::process::Output {
    let promtool = test_support::tool::require("promtool", PROMTOOL_HINT);
    let out = Command::new(&promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[tokio::test]
#[cfg_attr(
    promtool_missing,
    ignore = "promtool is not on PATH (CI=true requires it)"
)]
async fn promtool_accepts_the_exposition() {
    let h = Harness::new();
    let _inflight = h.target.inflight();
    exercise(&h);
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("metrics.txt"),
        h.metrics.encode_prometheus_text(),
    )
    .expect("write");
    // `check metrics` reads the exposition from stdin.
    let promtool = test_support::tool::require("promtool", PROMTOOL_HINT);
    let out = Command::new("sh")
        .arg("-c")
        .arg("\"$1\" check metrics < metrics.txt")
        .arg("sh")
        .arg(&promtool)
        .current_dir(dir.path())
        .output()
        .expect("run promtool");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every rule file in deploy/prometheus passes `promtool check rules`, and every
/// `*_test.yaml` there passes `promtool test rules`: a new file is picked up
/// without touching this test.
#[test]
#[cfg_attr(
    promtool_missing,
    ignore = "promtool is not on PATH (CI=true requires it)"
)]
fn promtool_alert_rules_pass_their_unit_tests() {
    let dir = data_dir();
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("deploy/prometheus")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml") || name.ends_with(".yml"))
        .collect();
    files.sort();
    let (tests, rules): (Vec<&String>, Vec<&String>) = files
        .iter()
        .partition(|name| name.ends_with("_test.yaml") || name.ends_with("_test.yml"));
    assert!(!rules.is_empty(), "no rule files in {}", dir.display());
    assert!(!tests.is_empty(), "no *_test.yaml in {}", dir.display());
    for file in rules {
        promtool(&dir, &["check", "rules", file]);
    }
    for file in tests {
        promtool(&dir, &["test", "rules", file]);
    }
}

/// The rules and their unit tests must speak about the series crproxy really
/// exposes: every `vcluster_proxy_*` name in them is a documented series, and every
/// input series carries exactly the labels crproxy puts on it (plus `pod`, which
/// the scrape adds).
#[test]
fn alert_files_use_the_exposed_names_and_labels() {
    let expected = expected_samples();
    let rules = std::fs::read_to_string(data_dir().join("alerts.yaml")).expect("rules");
    let tests = std::fs::read_to_string(data_dir().join("alerts_test.yaml")).expect("tests");

    let names = |text: &str| -> BTreeSet<String> {
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("vcluster_proxy_"))
            .map(str::to_owned)
            .collect()
    };
    for name in names(&rules).union(&names(&tests)) {
        assert!(expected.contains_key(name), "unknown series {name}");
    }

    let mut checked = 0;
    for line in tests.lines() {
        let Some(series) = line.trim().strip_prefix("- series: '") else {
            continue;
        };
        let series = series.trim_end_matches('\'');
        let (name, labels) = series.split_once('{').expect("series with labels");
        let mut keys: BTreeSet<String> = labels
            .trim_end_matches('}')
            .split(',')
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_owned()))
            .collect();
        assert!(keys.remove("pod"), "{series}: scrape label missing");
        assert_eq!(Some(&keys), expected.get(name), "{series}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} input series found");
}
