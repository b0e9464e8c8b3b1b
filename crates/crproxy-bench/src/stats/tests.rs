use super::*;

fn micros(values: &[u64]) -> Vec<Duration> {
    values.iter().map(|v| Duration::from_micros(*v)).collect()
}

fn check_percentile(samples: &[u64], p: f64, expected: Option<u64>) {
    let mut sorted = micros(samples);
    sorted.sort_unstable();
    assert_eq!(
        percentile(&sorted, p),
        expected.map(Duration::from_micros),
        "p{p} of {samples:?}"
    );
}

#[test]
fn percentile_uses_the_nearest_rank() {
    check_percentile(&[], 50.0, None);
    check_percentile(&[7], 50.0, Some(7));
    check_percentile(&[7], 99.0, Some(7));
    check_percentile(&[1, 2, 3, 4], 50.0, Some(2));
    check_percentile(&[1, 2, 3, 4, 5], 50.0, Some(3));
    check_percentile(&[1, 2, 3, 4], 0.0, Some(1));
    check_percentile(&[1, 2, 3, 4], 100.0, Some(4));
    check_percentile(&[1, 2, 3, 4], 101.0, None);
    check_percentile(&[1, 2, 3, 4], -1.0, None);
    // 100 samples 1..=100: p99 is the 99th, not the maximum.
    let hundred: Vec<u64> = (1..=100).collect();
    check_percentile(&hundred, 99.0, Some(99));
    check_percentile(&hundred, 50.0, Some(50));
    // 1000 samples: p99 is the 990th.
    let thousand: Vec<u64> = (1..=1000).collect();
    check_percentile(&thousand, 99.0, Some(990));
}

fn check_median(values: &[f64], expected: Option<f64>) {
    assert_eq!(median(values), expected, "median of {values:?}");
}

#[test]
fn median_of_odd_even_and_empty_inputs() {
    check_median(&[], None);
    check_median(&[f64::NAN], None);
    check_median(&[3.0], Some(3.0));
    check_median(&[5.0, 1.0, 3.0], Some(3.0));
    check_median(&[4.0, 1.0, 3.0, 2.0], Some(2.5));
    check_median(&[1.0, f64::NAN, 9.0, 5.0], Some(5.0));
}

#[test]
fn ratio_needs_both_sides_and_a_positive_baseline() {
    assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
    assert_eq!(ratio(None, Some(2.0)), None);
    assert_eq!(ratio(Some(3.0), None), None);
    assert_eq!(ratio(Some(3.0), Some(0.0)), None);
}

#[test]
fn a_round_reports_percentiles_and_throughput() {
    let latencies = micros(&(1..=100).map(|v| v * 1000).collect::<Vec<_>>());
    let round =
        RoundStats::from_samples(latencies, 2, Some(Duration::from_secs(2))).expect("stats");
    assert_eq!(round.p50_ms, 50.0);
    assert_eq!(round.p99_ms, 99.0);
    assert_eq!(round.throughput, Some(50.0));
    assert_eq!(round.samples, 100);
    assert_eq!(round.errors, 2);
    assert_eq!(RoundStats::from_samples(Vec::new(), 5, None), None);
    let no_wall = RoundStats::from_samples(micros(&[1000]), 0, None).expect("stats");
    assert_eq!(no_wall.throughput, None);
}

#[test]
fn a_summary_takes_medians_across_rounds() {
    let round = |p50: f64, p99: f64, tp: Option<f64>| RoundStats {
        p50_ms: p50,
        p99_ms: p99,
        throughput: tp,
        samples: 10,
        errors: 1,
    };
    let rounds = [
        round(1.0, 10.0, Some(100.0)),
        round(9.0, 90.0, Some(10.0)), // the disturbed round
        round(2.0, 20.0, Some(90.0)),
    ];
    let summary = Summary::of(&rounds).expect("summary");
    assert_eq!(summary.p50_ms, 2.0);
    assert_eq!(summary.p99_ms, 20.0);
    assert_eq!(summary.throughput, Some(90.0));
    assert_eq!(summary.samples, 30);
    assert_eq!(summary.errors, 3);
    assert_eq!(Summary::of(&[]), None);
    let watch = Summary::of(&[round(1.0, 2.0, None)]).expect("summary");
    assert_eq!(watch.throughput, None);
}

#[test]
fn a_total_per_item_is_in_microseconds_and_none_for_no_items() {
    assert_eq!(micros_each(Duration::from_millis(3), 1000), Some(3.0));
    assert_eq!(micros_each(Duration::from_millis(3), 0), None);
}
