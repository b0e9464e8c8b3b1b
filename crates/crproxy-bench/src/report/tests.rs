use std::time::Duration;

use super::*;

fn summary(p50: f64, p99: f64, tp: Option<f64>) -> Summary {
    Summary {
        p50_ms: p50,
        p99_ms: p99,
        throughput: tp,
        rounds: 5,
        samples: 100,
        errors: 0,
    }
}

fn row(scenario: &str, direct: Summary, crproxy: Summary, nginx: Option<Summary>) -> Row {
    Row::new(scenario, 16, Some(direct), Some(crproxy), nginx)
}

#[test]
fn ratios_are_relative_to_direct() {
    let r = Ratios::of(
        Some(&summary(2.0, 5.0, Some(800.0))),
        Some(&summary(1.0, 4.0, Some(1000.0))),
    )
    .expect("ratios");
    assert_eq!(r.p50, 2.0);
    assert_eq!(r.p99, 1.25);
    assert_eq!(r.throughput, Some(0.8));
    assert_eq!(Ratios::of(None, Some(&summary(1.0, 1.0, None))), None);
    let watch = Ratios::of(
        Some(&summary(2.0, 2.0, None)),
        Some(&summary(1.0, 1.0, None)),
    )
    .expect("ratios");
    assert_eq!(watch.throughput, None);
}

fn check_latency(rows: &[Row], expected: &[(&str, bool, &str)]) {
    let checks = latency_targets(rows);
    let got: Vec<(&str, bool, &str)> = checks
        .iter()
        .map(|c| (c.target.as_str(), c.met, c.measured.as_str()))
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn the_worst_row_decides_each_latency_target() {
    let direct = summary(1.0, 2.0, Some(1000.0));
    check_latency(
        &[
            row("get", direct.clone(), summary(1.05, 2.2, Some(950.0)), None),
            row(
                "create",
                direct.clone(),
                summary(1.5, 2.4, Some(700.0)),
                None,
            ),
        ],
        &[
            ("<= 1.10x", false, "worst 1.50x (create c=16)"),
            ("<= 1.25x", true, "worst 1.20x (create c=16)"),
            (">= 0.90x", false, "worst 0.70x (create c=16)"),
        ],
    );
    check_latency(
        &[row(
            "get",
            direct.clone(),
            summary(1.0, 2.0, Some(950.0)),
            Some(summary(1.0, 2.0, Some(990.0))),
        )],
        &[
            ("<= 1.10x", true, "worst 1.00x (get c=16)"),
            ("<= 1.25x", true, "worst 1.00x (get c=16)"),
            (">= 0.90x", true, "worst 0.95x (get c=16)"),
            (">= nginx", false, "below in get c=16 (0.95x < nginx 0.99x)"),
        ],
    );
    check_latency(&[], &[]);
}

#[test]
fn memory_targets_judge_idle_watches_and_list_growth() {
    let checks = memory_targets(
        Some((10_000, 120.0)),
        Some(((10_000, 40.0), (100_000, 60.0))),
    );
    assert_eq!(checks.len(), 2);
    assert!(checks[0].met, "{:?}", checks[0]);
    assert!(!checks[1].met, "{:?}", checks[1]);
    assert_eq!(checks[1].measured, "60.0 vs 40.0 MiB (1.50x)");
    let flat = memory_targets(None, Some(((10_000, 40.0), (100_000, 44.0))));
    assert!(flat[0].met);
    assert!(!memory_targets(Some((10_000, 151.0)), None)[0].met);
}

#[test]
fn the_table_shows_missing_columns_as_dashes() {
    let report = Report {
        finished_at_unix: 0,
        commit: None,
        machine: Machine {
            cpus: 2,
            cpu_model: None,
            kernel: None,
        },
        settings: serde_json::json!({}),
        rows: vec![row(
            "get",
            summary(0.5, 1.0, Some(2000.0)),
            summary(0.75, 1.5, Some(1500.0)),
            None,
        )],
        aggregated: vec![with_cpu(
            Row::new(
                "get",
                16,
                None,
                Some(summary(0.8, 1.6, Some(1000.0))),
                Some(summary(0.4, 0.8, Some(2000.0))),
            ),
            146.3,
            75.5,
        )],
        cache_events: vec![CacheEventCost::new(
            16,
            (Duration::from_micros(8_000), 1_000),
            (Duration::from_micros(3_000), 1_000),
        )],
        memory: vec![MemoryFigure {
            name: "crproxy idle".into(),
            mib: 12.5,
            note: String::new(),
        }],
        targets: memory_targets(Some((10, 1.0)), None),
        goals: goal_checks(&[], Some((10, 1.0))),
        notes: vec!["nginx not installed".into()],
    };
    let table = render_table(&report);
    let line = table
        .lines()
        .find(|l| l.starts_with("get"))
        .expect("get row");
    assert!(line.contains("0.50     1.00     2000"), "{line}");
    assert!(line.contains("1.50   1.50   0.75     250"), "{line}");
    assert!(line.contains("-      -      -"), "{line}");
    assert!(table.contains("crproxy idle"));
    // Through the aggregation layer: both paths' figures, crproxy over nginx, and
    // CPU to a tenth of a microsecond.
    let section = table
        .split("through the aggregation layer")
        .nth(1)
        .expect("aggregated section");
    let line = section
        .lines()
        .find(|l| l.starts_with("get"))
        .expect("aggregated get row");
    assert!(line.contains("0.80     1.60     1000"), "{line}");
    assert!(line.contains("0.40     0.80     2000"), "{line}");
    assert!(line.contains("0.50   2.00"), "{line}");
    assert!(line.contains("146.3    75.5"), "{line}");
    let line = table
        .lines()
        .find(|l| l.starts_with("get"))
        .expect("get row");
    let header = table.lines().next().expect("header");
    assert_eq!(
        header.find(" | "),
        line.find(" | "),
        "header and rows line up:\n{header}\n{line}"
    );
    assert!(header.contains("+p50us"));
    // Cache events: each kind's writes and CPU per write, and the difference.
    let section = table
        .split("ownership cache events")
        .nth(1)
        .expect("cache events section");
    let line = section
        .lines()
        .find(|l| l.trim_start().starts_with("16 |"))
        .expect("cache events row");
    assert!(
        line.contains("1000          8.0 |     1000          3.0 |       5.0"),
        "{line}"
    );
    assert!(table.contains("[met] crproxy RSS with 10 idle watches"));
    assert!(table.contains("- nginx not installed"));
    assert!(
        table.contains("goals of issue 15 (owned mode vs nginx, this run): 1 of 30 met"),
        "{table}"
    );
    assert!(table.contains("[MISSED] get c=1 throughput"), "{table}");
    assert!(
        table.contains("  29 of them not measured in this run, so missed"),
        "{table}"
    );
    let json = serde_json::to_value(&report).expect("json");
    assert_eq!(json["rows"][0]["crproxy_ratio"]["p50"], 1.5);
    assert!(json["rows"][0]["nginx"].is_null());
    assert_eq!(json["cache_events"][0]["event_cpu_us"], 5.0);
    // With every goal row measured, nothing is said of unmeasured ones.
    let mut report = report;
    report.goals.retain(|g| g.measured != "not measured");
    let table = render_table(&report);
    assert!(table.contains("this run): 1 of 1 met"), "{table}");
    assert!(!table.contains("not measured"), "{table}");
}

fn with_cpu(mut row: Row, crproxy: f64, nginx: f64) -> Row {
    row.crproxy_cpu_us = Some(crproxy);
    row.nginx_cpu_us = Some(nginx);
    row
}

fn at(mut row: Row, c: usize) -> Row {
    row.concurrency = c;
    row
}

fn goal<'a>(checks: &'a [TargetCheck], what: &str) -> &'a TargetCheck {
    checks
        .iter()
        .find(|c| c.what == what)
        .unwrap_or_else(|| panic!("no goal {what:?} in {checks:?}"))
}

#[test]
fn goals_compare_crproxy_with_nginx_row_by_row() {
    let direct = summary(1.0, 2.0, Some(1000.0));
    let rows = vec![
        // Reads: at least nginx's throughput and at most its CPU per request.
        at(
            with_cpu(
                row(
                    "get",
                    direct.clone(),
                    summary(1.0, 2.0, Some(1000.0)),
                    Some(summary(1.0, 2.0, Some(1000.0))),
                ),
                60.0,
                60.0,
            ),
            1,
        ),
        at(
            with_cpu(
                row(
                    "get",
                    direct.clone(),
                    summary(1.0, 2.0, Some(999.0)),
                    Some(summary(1.0, 2.0, Some(1000.0))),
                ),
                61.0,
                60.0,
            ),
            16,
        ),
        // Writes: 95 % of nginx's throughput is enough.
        at(
            row(
                "patch (seeded)",
                direct.clone(),
                summary(1.0, 2.0, Some(950.0)),
                Some(summary(1.0, 2.0, Some(1000.0))),
            ),
            1,
        ),
        at(
            row(
                "delete (seeded)",
                direct.clone(),
                summary(1.0, 2.0, Some(940.0)),
                Some(summary(1.0, 2.0, Some(1000.0))),
            ),
            64,
        ),
        // Watches: delivery p50 at most nginx's.
        Row::new(
            "watch 1",
            1,
            Some(summary(0.1, 0.2, None)),
            Some(summary(0.2, 0.3, None)),
            Some(summary(0.2, 0.4, None)),
        ),
        Row::new(
            "watch 1000",
            1000,
            Some(summary(5.0, 9.0, None)),
            Some(summary(6.1, 9.0, None)),
            Some(summary(6.0, 9.0, None)),
        ),
        // No nginx figures: the goal cannot be met.
        at(
            row(
                "update (PUT)",
                direct.clone(),
                summary(1.0, 2.0, Some(2000.0)),
                None,
            ),
            16,
        ),
    ];
    let checks = goal_checks(&rows, Some((10_000, 150.0)));
    let verdict = |what: &str| goal(&checks, what).met;
    assert!(verdict("get c=1 throughput"));
    assert!(verdict("get c=1 CPU per request"));
    assert!(!verdict("get c=16 throughput"));
    assert_eq!(
        goal(&checks, "get c=16 throughput").measured,
        "0.999x (999 vs 1000 req/s)",
        "a miss never reads as the goal"
    );
    assert!(!verdict("get c=16 CPU per request"));
    assert_eq!(
        goal(&checks, "get c=16 CPU per request").measured,
        "61 vs 60 us"
    );
    assert!(
        !verdict("get c=64 throughput"),
        "unmeasured rows are missed"
    );
    assert_eq!(
        goal(&checks, "get c=64 throughput").measured,
        "not measured"
    );
    assert!(verdict("patch (seeded) c=1 throughput"));
    assert_eq!(
        goal(&checks, "patch (seeded) c=1 throughput").measured,
        "0.95x (950 vs 1000 req/s)"
    );
    assert!(!verdict("delete (seeded) c=64 throughput"));
    assert!(!verdict("update (PUT) c=16 throughput"));
    assert!(verdict("watch 1 delivery p50"));
    assert!(!verdict("watch 1000 delivery p50"));
    assert!(verdict("crproxy RSS with 10000 idle watches"));
    assert!(!goal_checks(&rows, Some((10_000, 150.1)))
        .iter()
        .any(|c| c.what.contains("idle watches") && c.met));
    assert!(!goal_checks(&rows, None)
        .iter()
        .any(|c| c.what.contains("idle watches") && c.met));
    // Every goal row of the issue is there: reads 2 x 3 x 2, writes 5 x 3,
    // watches 2, memory 1.
    assert_eq!(checks.len(), 12 + 15 + 2 + 1);
}

#[test]
fn rounds_are_paired_in_order_and_their_range_is_printed() {
    // A round either lane measured nothing in is left out, not shifted onto the
    // next one.
    let ratios = paired_round_ratios(
        &[Some(900.0), None, Some(1000.0), Some(800.0)],
        &[Some(1000.0), Some(1000.0), None, Some(1000.0)],
    );
    assert_eq!(ratios, [0.9, 0.8]);
    assert!(paired_round_ratios(&[Some(1.0)], &[Some(0.0)]).is_empty());

    let direct = summary(1.0, 2.0, Some(1000.0));
    let mut rows = vec![
        at(
            row(
                "delete",
                direct.clone(),
                summary(1.0, 2.0, Some(900.0)),
                Some(summary(1.0, 2.0, Some(1000.0))),
            ),
            1,
        ),
        at(
            row(
                "delete",
                direct.clone(),
                summary(1.0, 2.0, Some(960.0)),
                Some(summary(1.0, 2.0, Some(1000.0))),
            ),
            16,
        ),
    ];
    rows[0].crproxy_vs_nginx_round_throughput = vec![0.93, 0.871, 0.9, 0.96];
    // One paired round is no range.
    rows[1].crproxy_vs_nginx_round_throughput = vec![0.96];
    let checks = goal_checks(&rows, None);
    let c1 = goal(&checks, "delete c=1 throughput");
    assert_eq!(
        c1.measured,
        "0.90x (900 vs 1000 req/s; rounds 0.87x to 0.96x)"
    );
    assert!(!c1.met, "the verdict stays the medians'");
    assert_eq!(
        goal(&checks, "delete c=16 throughput").measured,
        "0.96x (960 vs 1000 req/s)"
    );
}

#[test]
fn printed_figures_give_the_measured_verdict() {
    let at_least = |goal: f64| move |f: &[f64]| f[0] >= goal;
    let check =
        |figures: &[f64], decimals: usize, verdict: &dyn Fn(&[f64]) -> bool, want: usize| {
            assert_eq!(
                verdict_decimals(figures, decimals, verdict),
                want,
                "{figures:?} at {decimals}"
            );
        };
    // Rounding does not tip the verdict: the usual decimals.
    check(&[0.94], 2, &at_least(0.95), 2);
    check(&[0.951], 2, &at_least(0.95), 2);
    check(&[1.2], 2, &at_least(1.0), 2);
    // 0.948 reads "0.95" and 0.9999 reads "1.000": more decimals until it does not.
    check(&[0.948], 2, &at_least(0.95), 3);
    check(&[0.9999], 2, &at_least(1.0), 4);
    // Two measured figures: 60.4 against 60.0 would read "60 vs 60".
    let at_most = |f: &[f64]| f[0] <= f[1];
    check(&[60.4, 60.0], 0, &at_most, 1);
    check(&[61.0, 60.0], 0, &at_most, 0);
    // A difference below what the most decimals show stops there.
    check(&[60.00001, 60.0], 0, &at_most, 3);
}

#[test]
fn a_cache_event_costs_the_difference_between_own_and_other_writes() {
    let cost = CacheEventCost::new(
        16,
        (Duration::from_micros(9_000), 1_000),
        (Duration::from_micros(3_000), 1_500),
    );
    assert_eq!(cost.own_cpu_us, Some(9.0));
    assert_eq!(cost.other_cpu_us, Some(2.0));
    assert_eq!(cost.event_cpu_us, Some(7.0));
    // Without writes of one kind there is nothing to divide by, and no difference.
    let none = CacheEventCost::new(1, (Duration::from_micros(9_000), 0), (Duration::ZERO, 10));
    assert_eq!(none.own_cpu_us, None);
    assert_eq!(none.other_cpu_us, Some(0.0));
    assert_eq!(none.event_cpu_us, None);
}
