//! `cargo run --release -p crproxy-bench -- [--quick] [--out FILE.json]`
//!
//! Measures crproxy against direct access and nginx on this machine and prints a
//! table; the same figures go to a JSON file for comparison across commits.

use std::num::NonZeroUsize;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;

use crproxy_bench::bench::{self, Options};
use crproxy_bench::driver::Protocol;

/// Proxy overhead benchmark: direct vs crproxy (owned mode) vs nginx.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// A short run (2 rounds, fewer requests, smaller memory phases).
    #[arg(long)]
    quick: bool,
    /// Where to write the JSON report [default: target/crproxy-bench.json].
    #[arg(long, value_name = "FILE.json")]
    out: Option<PathBuf>,
    /// Speak HTTP/1.1 keep-alive (one connection per worker) instead of HTTP/2.
    #[arg(long)]
    http1: bool,
    /// The crproxy binary to run as a child process [default: next to this one].
    #[arg(long, value_name = "PATH")]
    proxy_binary: Option<PathBuf>,
    /// Measure the dev environment's in-process proxy (no memory/CPU figures).
    #[arg(long)]
    in_process: bool,
    /// Leave out the nginx column.
    #[arg(long)]
    no_nginx: bool,
    /// Run only scenarios whose name contains this (e.g. "get", "watch",
    /// "cache events"; "memory" for the memory phase alone).
    #[arg(long, value_name = "TEXT")]
    only: Option<String>,
    /// Skip the memory phase (idle watches, large lists).
    #[arg(long)]
    no_memory: bool,
    /// Skip the comparison through a client cluster's aggregation layer.
    #[arg(long)]
    no_aggregator: bool,
    /// Tokio worker threads for the crproxy child (its TOKIO_WORKER_THREADS)
    /// [default: crproxy's own, one per CPU]. The benchmark's own threads stay.
    #[arg(long, value_name = "N")]
    proxy_worker_threads: Option<NonZeroUsize>,
    /// Measured rounds per scenario [default: 5, 2 with --quick]. More rounds give
    /// steadier medians and rows long enough to profile; past some 40 rounds of the
    /// full plan the owned objects outgrow the ownership cache (the report's cache
    /// note then shows misses).
    #[arg(long, value_name = "N")]
    rounds: Option<NonZeroUsize>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let options = Options {
        quick: args.quick,
        out: args.out.unwrap_or_else(bench::default_out),
        protocol: if args.http1 {
            Protocol::Http1
        } else {
            Protocol::Http2
        },
        proxy_binary: args.proxy_binary,
        in_process: args.in_process,
        skip_nginx: args.no_nginx,
        only: args.only,
        skip_memory: args.no_memory,
        skip_aggregator: args.no_aggregator,
        proxy_worker_threads: args.proxy_worker_threads,
        rounds: args.rounds,
    };
    crproxy_bench::run_and_report(&options).context("benchmark failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count flag takes a number above zero, names itself when refused, and is
    /// absent by default.
    fn check_count_flag(flag: &str, read: fn(&Args) -> Option<NonZeroUsize>) {
        let parse = |n: &str| Args::try_parse_from(["crproxy-bench".into(), format!("{flag}={n}")]);
        let args = parse("12").expect("12 is a count");
        assert_eq!(read(&args), NonZeroUsize::new(12), "{flag}");
        for bad in ["0", "two", "-1"] {
            let error = parse(bad).expect_err(bad).to_string();
            assert!(error.contains(flag), "{flag}={bad}: {error}");
        }
        let default = Args::try_parse_from(["crproxy-bench"]).expect("no flags");
        assert_eq!(read(&default), None, "{flag}");
    }

    #[test]
    fn proxy_worker_threads_must_be_above_zero() {
        check_count_flag("--proxy-worker-threads", |args| args.proxy_worker_threads);
    }

    #[test]
    fn rounds_must_be_above_zero() {
        check_count_flag("--rounds", |args| args.rounds);
    }
}
