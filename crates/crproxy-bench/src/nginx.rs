//! nginx as the plain TLS reverse proxy to compare against: same target, same load,
//! none of crproxy's rules. The configuration is what one would write for a
//! Kubernetes API server behind nginx: HTTP/2 towards the caller, HTTP/1.1
//! keep-alive towards the target (nginx cannot proxy to an HTTP/2 upstream), no
//! buffering so lists and watches stream, long read timeouts for watches.
//!
//! As the backend of an APIService ([`AggregatorBackend`]) the same configuration
//! gains what such a backend needs and crproxy does too: it verifies the
//! aggregator's front-proxy client certificate, and since the aggregator drops
//! the caller's `Authorization`, it sends the credentials crproxy uses on the
//! target instead (and drops the aggregator's `X-Remote-*` identity headers).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crproxy_core::pki::{CertPem, CertificateAuthority, PkiError};

/// nginx could not be set up or did not come up.
#[derive(Debug, thiserror::Error)]
pub enum NginxError {
    /// Writing the configuration or starting the process failed.
    #[error("nginx: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The TLS certificate for the listener could not be generated.
    #[error("nginx: generating its certificate: {0}")]
    Pki(#[from] PkiError),
    /// nginx exited during start; its error log says why.
    #[error("nginx exited during start ({status}); its log says: {log}")]
    Exited { status: String, log: String },
    /// nginx did not accept connections in time.
    #[error("nginx did not listen on {addr} within {seconds}s; see {log}")]
    NotReady {
        addr: SocketAddr,
        seconds: u64,
        log: PathBuf,
    },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> NginxError {
    let context = context.into();
    move |source| NginxError::Io { context, source }
}

/// The nginx binary: `$PATH` first, then where Debian installs it.
pub fn find_binary() -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("nginx"))
            .find(|candidate| candidate.is_file())
    });
    from_path.or_else(|| {
        [
            "/usr/sbin/nginx",
            "/usr/local/sbin/nginx",
            "/usr/local/nginx/sbin/nginx",
        ]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
    })
}

/// What goes into nginx.conf.
#[derive(Clone, Debug)]
pub struct NginxConfig {
    /// Prefix directory: configuration, certificates, logs, temp files.
    pub dir: PathBuf,
    pub listen: SocketAddr,
    pub upstream: SocketAddr,
    /// The name the target's certificate is checked against.
    pub upstream_name: String,
    /// Worker processes; the same number of cores crproxy's runtime may use.
    pub workers: usize,
    /// Whether nginx starts as root, which needs `user root` so the workers can
    /// write the temp directories created by this (root) process.
    pub as_root: bool,
    /// Set when nginx serves an aggregation layer instead of the load driver.
    pub aggregator: Option<AggregatorBackend>,
}

/// The target nginx proxies to: where it listens and how its serving certificate
/// is checked. crproxy checks the target against its kubeconfig's CA on every
/// full handshake, so nginx does too: otherwise each of nginx's upstream
/// handshakes would cost it less than crproxy's, and the comparison would not be
/// like for like.
#[derive(Clone, Debug)]
pub struct Upstream {
    pub addr: SocketAddr,
    /// The CA that signs the target's serving certificate.
    pub ca_pem: String,
    /// A name in the target's serving certificate.
    pub server_name: String,
}

impl Upstream {
    /// A devcluster target: its serving certificate names `localhost`.
    pub fn devcluster(addr: SocketAddr, ca_pem: String) -> Self {
        Upstream {
            addr,
            ca_pem,
            server_name: "localhost".into(),
        }
    }
}

/// What nginx needs to be the backend of an APIService.
#[derive(Clone, Debug)]
pub struct AggregatorBackend {
    /// The CA that signs the aggregator's front-proxy client certificate.
    pub front_proxy_ca_pem: String,
    /// The bearer token of the identity crproxy forwards with on the target.
    pub target_token: String,
}

/// Where the front-proxy CA goes in nginx's directory.
const FRONT_PROXY_CA_FILE: &str = "front-proxy-ca.crt";
/// Where the target's CA is written, for `proxy_ssl_trusted_certificate`.
const UPSTREAM_CA_FILE: &str = "upstream-ca.crt";

impl NginxConfig {
    /// The nginx.conf text. `daemon off` is passed on the command line instead, as
    /// the brief of this benchmark asks, so the file also works for a manual start.
    pub fn render(&self) -> String {
        let dir = self.dir.display();
        let user = if self.as_root { "user root;\n" } else { "" };
        let (client_auth, identity) = match &self.aggregator {
            None => (String::new(), String::new()),
            Some(backend) => (
                format!(
                    "        ssl_client_certificate {dir}/{FRONT_PROXY_CA_FILE};\n        ssl_verify_client on;\n"
                ),
                format!(
                    "            proxy_set_header Authorization \"Bearer {token}\";
            proxy_set_header X-Remote-User \"\";
            proxy_set_header X-Remote-Group \"\";
            proxy_set_header X-Remote-Uid \"\";
",
                    token = backend.target_token
                ),
            ),
        };
        format!(
            "# Written by crproxy-bench: a plain TLS reverse proxy in front of the target.
{user}worker_processes {workers};
worker_rlimit_nofile 65536;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{
    worker_connections 32768;
}}
http {{
    access_log off;
    client_body_temp_path {dir}/tmp-body;
    proxy_temp_path {dir}/tmp-proxy;
    fastcgi_temp_path {dir}/tmp-fastcgi;
    uwsgi_temp_path {dir}/tmp-uwsgi;
    scgi_temp_path {dir}/tmp-scgi;
    upstream target {{
        server {upstream};
        keepalive 256;
        keepalive_requests 1000000;
        keepalive_timeout 300s;
    }}
    server {{
        listen {listen} ssl http2;
        ssl_certificate {dir}/tls.crt;
        ssl_certificate_key {dir}/tls.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        http2_max_concurrent_streams 1000;
        keepalive_requests 1000000;
        keepalive_timeout 300s;
        client_max_body_size 16m;
{client_auth}        location / {{
            proxy_pass https://target;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
{identity}            proxy_ssl_session_reuse on;
            # Checked as crproxy checks it: against the target's CA and name.
            proxy_ssl_verify on;
            proxy_ssl_verify_depth 2;
            proxy_ssl_trusted_certificate {dir}/{UPSTREAM_CA_FILE};
            proxy_ssl_name {upstream_name};
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
        }}
    }}
}}
",
            workers = self.workers.max(1),
            upstream = self.upstream,
            upstream_name = self.upstream_name,
            listen = self.listen,
        )
    }
}

/// A running nginx; stopped (master and workers) on [`Nginx::stop`] or drop.
pub struct Nginx {
    child: Option<tokio::process::Child>,
    pub pid: u32,
    pub addr: SocketAddr,
    /// The CA of nginx's serving certificate, for the load driver.
    pub ca_pem: String,
    pub dir: PathBuf,
}

impl Nginx {
    /// Writes a configuration for `upstream` into `dir`, starts `binary` and waits
    /// until it accepts connections. With `aggregator`, it is configured as the
    /// backend of an APIService.
    pub async fn start(
        binary: &Path,
        dir: &Path,
        listen: SocketAddr,
        upstream: Upstream,
        workers: usize,
        aggregator: Option<AggregatorBackend>,
    ) -> Result<Self, NginxError> {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let ca = CertificateAuthority::generate("crproxy-bench-nginx-ca")?;
        let leaf: CertPem = ca.issue_server(&["localhost"], &[listen.ip()])?;
        write(&dir.join("tls.crt"), &leaf.cert)?;
        write(&dir.join("tls.key"), &leaf.key)?;
        write(&dir.join(UPSTREAM_CA_FILE), &upstream.ca_pem)?;
        if let Some(backend) = &aggregator {
            write(&dir.join(FRONT_PROXY_CA_FILE), &backend.front_proxy_ca_pem)?;
        }
        let config = NginxConfig {
            dir: dir.to_path_buf(),
            listen,
            upstream: upstream.addr,
            upstream_name: upstream.server_name,
            workers,
            as_root: running_as_root(),
            aggregator,
        };
        let conf_path = dir.join("nginx.conf");
        write(&conf_path, &config.render())?;
        let log = dir.join("error.log");
        let stderr = std::fs::File::create(dir.join("stderr.log"))
            .map_err(io("creating nginx's stderr log"))?;
        let mut child = tokio::process::Command::new(binary)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf_path)
            .arg("-g")
            .arg("daemon off;")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(io(format!("starting {}", binary.display())))?;
        let pid = child.id().unwrap_or(0);
        let ready_within = Duration::from_secs(15);
        let deadline = tokio::time::Instant::now() + ready_within;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let mut log_text = std::fs::read_to_string(&log).unwrap_or_default();
                log_text
                    .push_str(&std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default());
                return Err(NginxError::Exited {
                    status: status.to_string(),
                    log: tail(&log_text, 800),
                });
            }
            if tokio::net::TcpStream::connect(listen).await.is_ok() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(NginxError::NotReady {
                    addr: listen,
                    seconds: ready_within.as_secs(),
                    log,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self {
            child: Some(child),
            pid,
            addr: listen,
            ca_pem: ca.pem().cert.clone(),
            dir: dir.to_path_buf(),
        })
    }

    /// Asks the master to stop (it takes its workers along), waits a little, then
    /// kills it.
    pub async fn stop(mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(self.pid);
            let exited = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
            if exited.is_err() {
                let _ = child.kill().await;
            }
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGKILL on the master alone (kill_on_drop) would orphan the workers with
        // the listening socket still open, so ask politely first.
        if self.child.is_some() {
            terminate(self.pid);
        }
    }
}

/// SIGTERM without libc: the process is ours, `kill` is in every base system.
fn terminate(pid: u32) {
    if pid > 0 {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|rest| rest.split_whitespace().next().map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

fn write(path: &Path, text: &str) -> Result<(), NginxError> {
    std::fs::write(path, text).map_err(io(format!("writing {}", path.display())))
}

fn tail(text: &str, max: usize) -> String {
    let start = text.len().saturating_sub(max);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    text[start..].trim().to_string()
}

#[cfg(test)]
#[path = "nginx/tests.rs"]
mod tests;
