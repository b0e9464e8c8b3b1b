//! `cargo bench -p crproxy-bench [-- --quick]`: the same run as the command, with
//! its defaults.

fn main() -> anyhow::Result<()> {
    let options = crproxy_bench::bench::Options {
        quick: std::env::args().any(|a| a == "--quick"),
        ..Default::default()
    };
    crproxy_bench::run_and_report(&options)
}
