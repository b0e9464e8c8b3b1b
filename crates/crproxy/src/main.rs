//! The `crproxy` command line: assembles the library crates, nothing more.

#[cfg(feature = "dev")]
mod dev;
use crproxy::run;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "crproxy",
    version,
    about = "Use custom resources stored in another Kubernetes cluster"
)]
struct Cli {
    /// Log as human-readable lines instead of JSON.
    #[arg(long, global = true)]
    human_logs: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a client and a target devcluster with the proxy wired between them.
    #[cfg(feature = "dev")]
    Dev(dev::DevArgs),
    /// Run the proxy against real clusters.
    Run {
        /// The crproxy configuration file (YAML).
        #[arg(long)]
        config: PathBuf,
    },
    /// Check a running installation piece by piece and print the verdict table.
    Doctor(crproxy::doctor::DoctorArgs),
    /// Validate a configuration file and print every problem found.
    CheckConfig {
        /// The crproxy configuration file (YAML).
        file: PathBuf,
    },
    /// Run one embedded Kubernetes-compatible API server.
    #[cfg(feature = "dev")]
    Devcluster {
        /// Where the CA, tokens, kubeconfig and database live.
        #[arg(long)]
        data_dir: PathBuf,
        /// Port on 127.0.0.1 (0 picks a free one).
        #[arg(long, default_value_t = 6443)]
        port: u16,
        /// Cluster name, used in the kubeconfig.
        #[arg(long, default_value = "devcluster")]
        name: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    crproxy::logging::init(cli.human_logs);
    // One crypto provider for the whole process: rustls panics when it has to pick
    // between several.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match crproxy::runtime::build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("crproxy: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            #[cfg(feature = "dev")]
            Command::Dev(args) => dev::run(args).await,
            Command::Run { config } => run::run(&config).await,
            Command::CheckConfig { file } => run::check_config(&file),
            Command::Doctor(args) => crproxy::doctor::run(args).await,
            #[cfg(feature = "dev")]
            Command::Devcluster {
                data_dir,
                port,
                name,
            } => dev::run_devcluster(data_dir, port, name).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("crproxy: {}", crproxy::report::error_line(&error));
            ExitCode::FAILURE
        }
    }
}
