//! crproxy as its own process (`crproxy run --config`), started from the
//! configuration file the dev environment wrote for its in-process proxy.
//!
//! A separate process gives crproxy's own memory and CPU without the benchmark's
//! devclusters and load driver mixed in; it is the same binary and the same
//! configuration an operator runs. The in-process proxy of the dev environment
//! keeps running (it holds the leader lease and did the registration); the child
//! is a second replica, which serves but never registers.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crproxy::runtime::WORKER_THREADS_VAR;

/// The child could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// Reading or writing a file, or spawning, failed.
    #[error("crproxy child: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The configuration has no `basePort:`/`metricsAddress:` line to rewrite.
    #[error("crproxy child: the configuration has no {0} line to point at a free port")]
    Config(&'static str),
    /// The process exited during start.
    #[error("crproxy child exited during start ({status}); its log ends with: {log}")]
    Exited { status: String, log: String },
    /// It did not listen in time.
    #[error("crproxy child did not listen on {addr} within {seconds}s; see {log}")]
    NotReady {
        addr: SocketAddr,
        seconds: u64,
        log: PathBuf,
    },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ChildError {
    let context = context.into();
    move |source| ChildError::Io { context, source }
}

/// Rewrites `proxy.basePort` and `proxy.metricsAddress` of a configuration
/// written by `crproxy dev`, keeping everything else as it is.
pub fn rewrite_ports(
    config: &str,
    base_port: u16,
    metrics: SocketAddr,
) -> Result<String, ChildError> {
    let config = crproxy::devenv::with_config_line(config, "basePort", &base_port.to_string())
        .ok_or(ChildError::Config("basePort"))?;
    crproxy::devenv::with_config_line(&config, "metricsAddress", &metrics.to_string())
        .ok_or(ChildError::Config("metricsAddress"))
}

/// The `crproxy` binary built next to this one (`target/<profile>/crproxy`);
/// benches run from `target/<profile>/deps`, so its parent is looked at too.
pub fn sibling_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join("crproxy"), dir.parent()?.join("crproxy")]
        .into_iter()
        .find(|p| p.is_file())
}

/// A running `crproxy run`.
pub struct ChildProxy {
    child: Option<tokio::process::Child>,
    pub pid: u32,
    /// The first (only) group/version server.
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    /// The serving CA the child created next to its configuration.
    pub ca_pem: String,
    pub log: PathBuf,
    /// Its tokio worker threads, as the report states them.
    pub worker_threads: String,
    /// How it was optimised, as its `--version` says ([`build_of`]).
    pub build: String,
}

impl ChildProxy {
    /// Copies `config` into `dir` with free ports (and each `(from, to)` text
    /// replacement applied) and starts `binary run` on it. Returns once the proxy
    /// port accepts TCP connections; the caller checks that requests go through.
    pub async fn start(
        binary: &Path,
        config: &Path,
        dir: &Path,
        replacements: &[(String, String)],
        worker_threads: Option<NonZeroUsize>,
    ) -> Result<Self, ChildError> {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let mut text =
            std::fs::read_to_string(config).map_err(io(format!("reading {}", config.display())))?;
        for (from, to) in replacements {
            text = text.replace(from.as_str(), to);
        }
        let port = crproxy::devenv::free_port().map_err(io("finding a free port"))?;
        let metrics_port = crproxy::devenv::free_port().map_err(io("finding a free port"))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let metrics_addr = SocketAddr::from(([127, 0, 0, 1], metrics_port));
        let copy = dir.join("crproxy.yaml");
        std::fs::write(&copy, rewrite_ports(&text, port, metrics_addr)?)
            .map_err(io(format!("writing {}", copy.display())))?;
        let log = dir.join("crproxy.log");
        let log_file = std::fs::File::create(&log).map_err(io("creating the child's log"))?;
        let mut child = run_command(binary, &copy, worker_threads)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .map_err(io(format!("starting {}", binary.display())))?;
        let pid = child.id().unwrap_or(0);
        let within = Duration::from_secs(30);
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let start = text.len().saturating_sub(1500);
                let start = (start..text.len())
                    .find(|i| text.is_char_boundary(*i))
                    .unwrap_or(text.len());
                return Err(ChildError::Exited {
                    status: status.to_string(),
                    log: text[start..].trim().to_string(),
                });
            }
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ChildError::NotReady {
                    addr,
                    seconds: within.as_secs(),
                    log,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ca_path = dir.join("serving-ca").join("ca.crt");
        let ca_pem = std::fs::read_to_string(&ca_path)
            .map_err(io(format!("reading {}", ca_path.display())))?;
        Ok(Self {
            child: Some(child),
            pid,
            addr,
            metrics_addr,
            ca_pem,
            log,
            worker_threads: worker_threads_setting(worker_threads),
            build: build_of(binary).await,
        })
    }

    /// SIGTERM (graceful shutdown), then SIGKILL after the proxy's own grace.
    pub async fn stop(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(self.pid.to_string())
                .status();
            if tokio::time::timeout(Duration::from_secs(12), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }
}

/// `binary run --config <config>`, logging warnings only, with `worker_threads`
/// tokio worker threads when given (otherwise the child keeps crproxy's default,
/// or a `TOKIO_WORKER_THREADS` this process was started with).
fn run_command(
    binary: &Path,
    config: &Path,
    worker_threads: Option<NonZeroUsize>,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(binary);
    command
        .arg("run")
        .arg("--config")
        .arg(config)
        .env("CRPROXY_LOG", "warn");
    if let Some(threads) = worker_threads {
        command.env(WORKER_THREADS_VAR, threads.to_string());
    }
    command
}

/// How `binary` says the compiler optimised it (`crproxy::build_kind`), from
/// its `--version`; or why that could not be read.
async fn build_of(binary: &Path) -> String {
    let within = Duration::from_secs(10);
    let asked = tokio::process::Command::new(binary)
        .arg("--version")
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(within, asked).await {
        Ok(Ok(output)) if output.status.success() => output,
        Ok(Ok(output)) => return format!("unknown (--version exited {})", output.status),
        Ok(Err(e)) => return format!("unknown (--version did not run: {e})"),
        Err(_) => return format!("unknown (--version did not answer within {within:?})"),
    };
    let line = String::from_utf8_lossy(&output.stdout);
    match build_in_version(&line) {
        Some(kind) => kind.to_owned(),
        None => format!("unknown (--version said {:?})", line.trim()),
    }
}

/// The build in `crproxy 0.1.0 (profile-guided build)`.
fn build_in_version(line: &str) -> Option<&str> {
    let (_, kind) = line.trim().strip_suffix(" build)")?.rsplit_once(" (")?;
    Some(kind)
}

/// How many worker threads the child runs, as the report states it.
fn worker_threads_setting(worker_threads: Option<NonZeroUsize>) -> String {
    match (worker_threads, std::env::var(WORKER_THREADS_VAR)) {
        (Some(threads), _) => threads.to_string(),
        (None, Ok(inherited)) => format!("{inherited} (inherited {WORKER_THREADS_VAR})"),
        (None, Err(_)) => "one per CPU (crproxy's default)".into(),
    }
}

#[cfg(test)]
#[path = "child/tests.rs"]
mod tests;
