//! `cargo run --release -p crproxy-bench -- [--quick] [--out FILE.json]`
//!
//! Measures crproxy against direct access and nginx on this machine and prints a
//! table; the same figures go to a JSON file for comparison across commits.

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
    /// Run only scenarios whose name contains this (e.g. "get", "watch"; "memory"
    /// for the memory phase alone).
    #[arg(long, value_name = "TEXT")]
    only: Option<String>,
    /// Skip the memory phase (idle watches, large lists).
    #[arg(long)]
    no_memory: bool,
    /// Skip the comparison through a client cluster's aggregation layer.
    #[arg(long)]
    no_aggregator: bool,
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
    };
    crproxy_bench::run_and_report(&options).context("benchmark failed")
}
