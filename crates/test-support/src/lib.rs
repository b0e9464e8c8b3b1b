//! Test harness: start devclusters and drive them with the real `kubectl`.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let cluster = test_support::devcluster("target").await;
//! let out = test_support::kubectl_json_async(&cluster.kubeconfig, &["get", "ns", "default"]).await?;
//! assert_eq!(out["metadata"]["name"], "default");
//! # Ok(()) }
//! ```

pub mod relay;
pub mod tool;

use devcluster::{DevCluster, DevClusterConfig};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The kubectl every test uses.
pub const KUBECTL: &str = "/usr/bin/kubectl";
/// No kubectl call in a test may take longer than this.
pub const KUBECTL_TIMEOUT: Duration = Duration::from_secs(60);

/// A loopback port that refuses connections for as long as this value lives. A
/// listener bound and dropped at once frees its port for the next bind of port 0
/// (a server of a test running alongside), and dials meant to be refused would
/// reach that server. This port stays bound, without listening (a connection gets
/// a reset) and without `SO_REUSEADDR`, so no listener can be given it.
pub struct RefusedPort {
    pub addr: std::net::SocketAddr,
    socket: tokio::net::TcpSocket,
}

impl RefusedPort {
    pub fn bind() -> RefusedPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("bind a loopback port");
        let addr = socket.local_addr().expect("bound address");
        RefusedPort { addr, socket }
    }

    /// Starts listening on the port, with no moment in which another socket
    /// could take it: for a peer that comes back.
    pub fn listen(self) -> tokio::net::TcpListener {
        self.socket.listen(1024).expect("listen on the held port")
    }
}

/// A running in-memory devcluster with an admin kubeconfig on disk.
pub struct TestCluster {
    pub cluster: DevCluster,
    /// Admin kubeconfig (user `<name>-admin`).
    pub kubeconfig: PathBuf,
    /// Holds the kubeconfig directory alive.
    pub dir: tempfile::TempDir,
}

impl TestCluster {
    /// A kubeconfig for another user (new token) in this cluster's temp dir.
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> anyhow::Result<PathBuf> {
        let path = self.dir.path().join(format!("{user}.kubeconfig"));
        self.cluster.write_kubeconfig(&path, user, groups)?;
        Ok(path)
    }

    /// A kubeconfig that authenticates `user` (in `groups`) with a client
    /// certificate signed by the cluster CA.
    pub fn kubeconfig_with_cert(&self, user: &str, groups: &[&str]) -> anyhow::Result<PathBuf> {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let cert = self.cluster.client_cert(user, groups)?;
        let name = self.cluster.name();
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {user}\ncurrent-context: {name}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {crt}\n    client-key-data: {key}\n",
            url = self.cluster.url(),
            ca = b64(&self.cluster.ca_pem()),
            crt = b64(&cert.cert),
            key = b64(&cert.key),
        );
        let path = self.dir.path().join(format!("{user}-cert.kubeconfig"));
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// The admin kubeconfig pointed at another listener of the same cluster.
    pub fn kubeconfig_at(&self, addr: std::net::SocketAddr) -> anyhow::Result<PathBuf> {
        let text = self
            .cluster
            .admin_kubeconfig()
            .replace(&self.cluster.url(), &format!("https://{addr}"));
        let path = self
            .dir
            .path()
            .join(format!("admin-{}.kubeconfig", addr.port()));
        std::fs::write(&path, text)?;
        Ok(path)
    }
}

/// Installs crproxy's crypto provider as the process default, once (rustls
/// cannot choose between several compiled in).
pub fn init_crypto() {
    crproxy_kube::install_crypto_provider();
}

/// A TLS client configuration that trusts no certificate: for a dialer whose
/// target is never reached (a name that does not resolve, a pool whose peers
/// come from a source under test).
pub fn client_config_without_roots() -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(
        std::sync::Arc::new(crproxy_kube::crypto_provider()),
    )
    .with_safe_default_protocol_versions()
    .expect("rustls supports its own default protocol versions")
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth()
}

/// The tasks alive on the calling test's runtime, after a few turns for a task
/// just woken or aborted to end (bounded: ten yields).
pub async fn tasks_alive() -> usize {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Starts an in-memory devcluster on an ephemeral 127.0.0.1 port.
///
/// # Panics
/// When the cluster cannot start: a test cannot go on without it.
pub async fn devcluster(name: &str) -> TestCluster {
    init_crypto();
    #[allow(clippy::expect_used)]
    let cluster = devcluster::start(DevClusterConfig::in_memory(name))
        .await
        .expect("devcluster starts");
    #[allow(clippy::expect_used)]
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("admin.kubeconfig");
    #[allow(clippy::expect_used)]
    std::fs::write(&kubeconfig, cluster.admin_kubeconfig()).expect("write kubeconfig");
    TestCluster {
        cluster,
        kubeconfig,
        dir,
    }
}

/// What a kubectl run produced.
#[derive(Debug, Clone)]
pub struct KubectlOutput {
    /// Exit code (`None`: killed by the timeout or a signal).
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl KubectlOutput {
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }
}

/// Runs kubectl with `--kubeconfig` and `args`, killing it after
/// [`KUBECTL_TIMEOUT`]. Blocking: from async code use [`kubectl_async`].
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> KubectlOutput {
    kubectl_with_timeout(kubeconfig, args, KUBECTL_TIMEOUT)
}

/// [`kubectl`] with an explicit time limit (for `get -w` style commands).
pub fn kubectl_with_timeout(kubeconfig: &Path, args: &[&str], timeout: Duration) -> KubectlOutput {
    kubectl_stdin(kubeconfig, args, None, timeout)
}

/// [`kubectl`] with `stdin` fed to the process (for `apply -f -`).
pub fn kubectl_stdin(
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
    timeout: Duration,
) -> KubectlOutput {
    let mut cmd = Command::new(KUBECTL);
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return KubectlOutput {
                status: None,
                stdout: String::new(),
                stderr: format!("cannot run {KUBECTL}: {e}"),
            }
        }
    };
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write;
        let _ = pipe.write_all(input.as_bytes());
    }
    // Read pipes on threads so a chatty process cannot block on a full pipe.
    let out = child.stdout.take();
    let err = child.stderr.take();
    let read = |p: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut p) = p {
                let _ = p.read_to_string(&mut s);
            }
            s
        })
    };
    let out_t = read(out.map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
    let err_t = read(err.map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s.code(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    KubectlOutput {
        status,
        stdout: out_t.join().unwrap_or_default(),
        stderr: err_t.join().unwrap_or_default(),
    }
}

/// Runs kubectl with `-o json` appended and parses stdout; fails on a non-zero
/// exit.
pub fn kubectl_json(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Value> {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["-o", "json"]);
    let out = kubectl(kubeconfig, &all);
    if !out.success() {
        anyhow::bail!(
            "kubectl {} failed ({:?}): {}",
            args.join(" "),
            out.status,
            out.stderr
        );
    }
    Ok(serde_json::from_str(&out.stdout)?)
}

/// [`kubectl`] from async code (runs on the blocking pool).
pub async fn kubectl_async(kubeconfig: &Path, args: &[&str]) -> KubectlOutput {
    let kc = kubeconfig.to_path_buf();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        kubectl(&kc, &refs)
    })
    .await
    .unwrap_or_else(|e| KubectlOutput {
        status: None,
        stdout: String::new(),
        stderr: e.to_string(),
    })
}

/// [`kubectl_stdin`] from async code.
pub async fn kubectl_stdin_async(
    kubeconfig: &Path,
    args: &[&str],
    stdin: &str,
    timeout: Duration,
) -> KubectlOutput {
    let kc = kubeconfig.to_path_buf();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let input = stdin.to_string();
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        kubectl_stdin(&kc, &refs, Some(&input), timeout)
    })
    .await
    .unwrap_or_else(|e| KubectlOutput {
        status: None,
        stdout: String::new(),
        stderr: e.to_string(),
    })
}

/// [`kubectl_json`] from async code.
pub async fn kubectl_json_async(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Value> {
    let kc = kubeconfig.to_path_buf();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        kubectl_json(&kc, &refs)
    })
    .await?
}

/// A child process that is killed if the test ends before it does (a failed
/// assertion), so no server started by a test outlives it.
pub struct KillOnDrop(pub std::process::Child);

impl std::ops::Deref for KillOnDrop {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
