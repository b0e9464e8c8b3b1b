//! crproxy-bench: how much crproxy costs compared with talking to the target
//! directly and with a plain reverse proxy (nginx), on one machine, in one run.
//!
//! The pieces, bottom up: [`stats`] (percentiles, medians), [`rss`] (memory and
//! CPU from `/proc`), [`driver`] (the one load driver all paths share),
//! [`nginx`] (the comparison proxy), [`aggregated`] (the same comparison behind a
//! client API server's aggregation layer), [`report`] (table and JSON).

pub mod aggregated;
pub mod bench;
pub mod child;
pub mod driver;
pub mod nginx;
pub mod report;
pub mod rss;
pub mod stats;
pub mod watch;
pub mod workload;

/// A dev environment for the benchmark's own tests: one client cluster and one
/// target replica, kept under `dir`, with the process's crypto provider set.
#[cfg(test)]
pub(crate) async fn test_env(dir: &std::path::Path) -> crproxy::devenv::DevEnv {
    crproxy_kube::install_crypto_provider();
    crproxy::devenv::DevEnv::start(crproxy::devenv::DevOptions::ephemeral(
        &dir.join("dev"),
        1,
        1,
    ))
    .await
    .expect("dev environment")
}

/// Runs the benchmark, prints the table and writes the JSON report.
pub fn run_and_report(options: &bench::Options) -> anyhow::Result<()> {
    use anyhow::Context;
    // One crypto provider for the whole process: the proxy, the devclusters and
    // the driver all use rustls with crproxy_kube::crypto_provider().
    crproxy_kube::install_crypto_provider();
    // crproxy's own builder: a bad TOKIO_WORKER_THREADS is an error, not tokio's panic.
    let runtime = crproxy::runtime::build().context("starting the tokio runtime")?;
    // On Ctrl-C or SIGTERM the run is dropped, and with it the crproxy child
    // (killed) and nginx (asked to stop), so nothing outlives the benchmark.
    let report = runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("listening for SIGTERM")?;
        tokio::select! {
            report = bench::run(options) => report,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
            _ = term.recv() => Err(anyhow::anyhow!("terminated")),
        }
    })?;
    print!("{}", report::render_table(&report));
    if let Some(parent) = options.out.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(&options.out, json)
        .with_context(|| format!("writing {}", options.out.display()))?;
    println!("\nJSON report: {}", options.out.display());
    Ok(())
}
