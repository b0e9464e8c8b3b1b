//! The `crproxy` command line: assembles the library crates, nothing more.

#[cfg(feature = "dev")]
mod dev;
use crproxy::run;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand};

/// `crproxy --version`: the version and how the compiler optimised the binary
/// (`crproxy::build_kind`), e.g. `crproxy 0.1.0 (profile-guided build)`.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("CRPROXY_OPTIMISATION"),
    " build)"
);

#[derive(Parser)]
#[command(
    name = "crproxy",
    version = VERSION,
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
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage(&error),
    };
    crproxy::logging::init(cli.human_logs);
    // One crypto provider for the whole process: rustls panics when it has to pick
    // between several.
    crproxy_kube::install_crypto_provider();
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

/// What a command line clap refused ends with: `--help` and `--version` print as
/// usual (stdout, exit 0); anything else is a usage error, one line on stderr
/// like every other failure of the command, with clap's exit code (2).
fn usage(error: &clap::Error) -> ExitCode {
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            // A closed stdout (`crproxy --help | head -1`) is not a failure.
            let _ = error.print();
            ExitCode::SUCCESS
        }
        _ => {
            let args: Vec<OsString> = std::env::args_os().skip(1).collect();
            eprintln!("crproxy: {}", usage_line(error, &args));
            ExitCode::from(2)
        }
    }
}

/// The problem clap found, on one line: its message without the `error: `
/// prefix, any tip it offers (`a similar argument exists: '--config'`), and
/// where the help is. Its usage and "For more information" lines are left out.
fn usage_line(error: &clap::Error, args: &[OsString]) -> String {
    let command = Cli::command();
    let subcommand = args
        .iter()
        .filter_map(|arg| arg.to_str())
        .find(|arg| !arg.starts_with('-'))
        .and_then(|arg| command.find_subcommand(arg))
        .map(|subcommand| subcommand.get_name().to_owned());
    let help = match &subcommand {
        Some(name) => format!("see crproxy {name} --help"),
        None => "see crproxy --help".to_owned(),
    };
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand
    ) {
        // A bare `crproxy` (clap would print the whole help as the error), or
        // one with only global flags.
        let commands: Vec<&str> = command
            .get_subcommands()
            .filter(|c| !c.is_hide_set())
            .map(|c| c.get_name())
            .collect();
        return format!(
            "no command given: use one of {} ({help})",
            commands.join(", ")
        );
    }
    let rendered = error.render().to_string();
    let mut paragraphs = rendered.split("\n\n");
    let message = paragraphs.next().unwrap_or_default();
    let message = message.strip_prefix("error: ").unwrap_or(message);
    let mut line = crproxy::report::one_line(message);
    for tip in paragraphs
        .flat_map(str::lines)
        .filter_map(|l| l.trim().strip_prefix("tip: "))
    {
        line.push_str("; ");
        line.push_str(&crproxy::report::one_line(tip));
    }
    format!("{line} ({help})")
}
