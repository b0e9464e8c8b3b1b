//! Latency statistics: percentiles of one round, and medians across rounds.
//!
//! Each round is summarised on its own (p50, p99, throughput); the report shows the
//! median of those per-round figures, so one disturbed round (another process
//! waking up on this shared 2-core machine) moves nothing.

use std::time::Duration;

use serde::Serialize;

/// The nearest-rank percentile of ascending `sorted` samples: the smallest sample
/// with at least `p` percent of all samples at or below it. `None` when empty.
///
/// Nearest rank (rather than interpolation) always returns a latency that was
/// actually observed, which is what a p99 in a latency report should be.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    let index = rank.clamp(1, sorted.len()) - 1;
    sorted.get(index).copied()
}

/// The median of `values`: the middle one, or the mean of the two middle ones.
/// NaN values are ignored; `None` when nothing is left.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// `total` per item in µs, over `count` items; `None` for none.
pub fn micros_each(total: Duration, count: usize) -> Option<f64> {
    (count > 0).then(|| total.as_secs_f64() * 1e6 / count as f64)
}

/// `value / baseline`, when both are known and the baseline is positive.
pub fn ratio(value: Option<f64>, baseline: Option<f64>) -> Option<f64> {
    match (value, baseline) {
        (Some(v), Some(b)) if b > 0.0 && v.is_finite() => Some(v / b),
        _ => None,
    }
}

/// One round of one scenario on one path.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoundStats {
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Completed requests per second of wall time; `None` where it means nothing
    /// (watch delivery).
    pub throughput: Option<f64>,
    /// Successful samples.
    pub samples: usize,
    /// Requests that failed or answered an unexpected status.
    pub errors: u64,
}

impl RoundStats {
    /// Summarises the successful latencies of a round that took `wall`.
    /// `None` when no request succeeded.
    pub fn from_samples(
        mut latencies: Vec<Duration>,
        errors: u64,
        wall: Option<Duration>,
    ) -> Option<Self> {
        latencies.sort_unstable();
        let p50 = percentile(&latencies, 50.0)?;
        let p99 = percentile(&latencies, 99.0)?;
        let throughput = wall
            .filter(|w| !w.is_zero())
            .map(|w| latencies.len() as f64 / w.as_secs_f64());
        Some(Self {
            p50_ms: ms(p50),
            p99_ms: ms(p99),
            throughput,
            samples: latencies.len(),
            errors,
        })
    }
}

/// The medians of a scenario's rounds on one path.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub throughput: Option<f64>,
    pub rounds: usize,
    /// Successful samples over all rounds.
    pub samples: usize,
    /// Failed requests over all rounds: a summary with errors is suspect.
    pub errors: u64,
}

impl Summary {
    /// Medians of the per-round figures; `None` when no round produced any.
    pub fn of(rounds: &[RoundStats]) -> Option<Self> {
        let p50: Vec<f64> = rounds.iter().map(|r| r.p50_ms).collect();
        let p99: Vec<f64> = rounds.iter().map(|r| r.p99_ms).collect();
        let throughput: Vec<f64> = rounds.iter().filter_map(|r| r.throughput).collect();
        Some(Self {
            p50_ms: median(&p50)?,
            p99_ms: median(&p99)?,
            throughput: median(&throughput),
            rounds: rounds.len(),
            samples: rounds.iter().map(|r| r.samples).sum(),
            errors: rounds.iter().map(|r| r.errors).sum(),
        })
    }
}

/// Milliseconds with microsecond resolution.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
#[path = "stats/tests.rs"]
mod tests;
