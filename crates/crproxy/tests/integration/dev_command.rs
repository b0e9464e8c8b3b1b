//! `crproxy dev` as a new user meets it: the README's command run twice on the
//! same directory (after Ctrl-C/SIGTERM and after a crash), with ports taken, and
//! with several clients. Each test runs the real binary and the real kubectl.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Result};
use test_support::{kubectl, kubectl_stdin, KillOnDrop, KUBECTL_TIMEOUT};

/// How long one `crproxy dev` may take to print its banner (debug build, two
/// cores shared with other tests).
const START_LIMIT: Duration = Duration::from_secs(90);
/// The banner's last line.
const BANNER_END: &str = "Press Ctrl-C to stop.";

/// The port flags of `crproxy dev`, with the values to pass.
#[derive(Clone, Copy)]
struct Ports {
    target: u16,
    client: u16,
    proxy: u16,
    metrics: u16,
    host: u16,
    sync_metrics: u16,
}

impl Ports {
    /// Ports that were free a moment ago (`0` everywhere would pick new ones on
    /// each start, which is not what a user restarting the same command gets).
    fn free() -> Result<Self> {
        Ok(Self::held()?.0)
    }

    /// Free ports with the listeners that hold them, in the fields' order, so a
    /// test that wants some of them busy keeps those bound instead of binding them
    /// again (by which time a parallel test may have taken one).
    fn held() -> Result<(Self, Vec<std::net::TcpListener>)> {
        // Held together so they are distinct; from below the ephemeral range so
        // that no outgoing connection takes one before `crproxy dev` binds it.
        let listeners = (0..6)
            .map(|_| crproxy::devenv::free_listener())
            .collect::<std::io::Result<Vec<_>>>()?;
        let port = |i: usize| -> Result<u16> { Ok(listeners[i].local_addr()?.port()) };
        let ports = Self {
            target: port(0)?,
            client: port(1)?,
            proxy: port(2)?,
            metrics: port(3)?,
            host: port(4)?,
            sync_metrics: port(5)?,
        };
        Ok((ports, listeners))
    }

    fn any() -> Self {
        Self {
            target: 0,
            client: 0,
            proxy: 0,
            metrics: 0,
            host: 0,
            sync_metrics: 0,
        }
    }

    fn args(&self) -> Vec<String> {
        [
            ("--target-port", self.target),
            ("--client-port", self.client),
            ("--proxy-port", self.proxy),
            ("--metrics-port", self.metrics),
            ("--host-port", self.host),
            ("--sync-metrics-port", self.sync_metrics),
        ]
        .into_iter()
        .flat_map(|(flag, port)| [flag.to_string(), port.to_string()])
        .collect()
    }
}

fn dev_command(dir: &Path, ports: &Ports, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_crproxy"));
    command
        .arg("dev")
        .arg("--dir")
        .arg(dir)
        .args(ports.args())
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// A running `crproxy dev`.
struct Dev {
    child: KillOnDrop,
    banner: String,
    stderr: std::thread::JoinHandle<String>,
}

impl Dev {
    /// Starts `crproxy dev` and returns once its banner is printed (it prints
    /// it after every client's APIService is Available and discovery lists the
    /// resource).
    fn start(dir: &Path, ports: &Ports, extra: &[&str]) -> Result<Dev> {
        let mut child = KillOnDrop(dev_command(dir, ports, extra).spawn()?);
        let stderr = drain(child.stderr.take());
        let (lines, banner_lines) = mpsc::channel();
        let stdout = child.stdout.take();
        std::thread::spawn(move || {
            use std::io::BufRead;
            if let Some(stdout) = stdout {
                for line in std::io::BufReader::new(stdout)
                    .lines()
                    .map_while(|l| l.ok())
                {
                    if lines.send(line).is_err() {
                        break;
                    }
                }
            }
        });
        let deadline = Instant::now() + START_LIMIT;
        let mut banner = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match banner_lines.recv_timeout(left) {
                Ok(line) => {
                    banner.push_str(&line);
                    banner.push('\n');
                    if line.contains(BANNER_END) {
                        return Ok(Dev {
                            child,
                            banner,
                            stderr,
                        });
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    bail!("crproxy dev printed no banner within {START_LIMIT:?}")
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait()?;
                    let stderr = stderr.join().unwrap_or_default();
                    bail!("crproxy dev exited ({status}) before it was up: {stderr}");
                }
            }
        }
    }

    /// Sends `signal` and waits (bounded) for the process to end.
    fn stop(mut self, signal: &str) -> Result<(std::process::ExitStatus, String)> {
        let sent = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()?;
        ensure!(sent.success(), "kill -{signal} failed");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            ensure!(
                Instant::now() < deadline,
                "crproxy dev still running 30s after SIG{signal}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        Ok((status, self.stderr.join().unwrap_or_default()))
    }
}

fn drain<R: std::io::Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    })
}

fn widget(name: &str) -> String {
    format!(
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: {name}}}\nspec: {{size: 3}}\n"
    )
}

/// Writes a widget through the client (one attempt: the environment says it is
/// up, so it must work now).
fn write_widget(kubeconfig: &Path, namespace: &str, name: &str) -> Result<()> {
    let out = kubectl_stdin(
        kubeconfig,
        &["-n", namespace, "create", "-f", "-"],
        Some(&widget(name)),
        KUBECTL_TIMEOUT,
    );
    ensure!(out.success(), "creating widget {name}: {}", out.stderr);
    Ok(())
}

fn read_widget(kubeconfig: &Path, namespace: &str, name: &str) -> Result<()> {
    let out = kubectl(kubeconfig, &["-n", namespace, "get", "widget", name]);
    ensure!(out.success(), "reading widget {name}: {}", out.stderr);
    Ok(())
}

/// The uids of the tenant Gateway `demo/edge` and of its mirror on the host.
fn read_gateway(kubeconfig: &Path, dir: &Path) -> Result<(String, String)> {
    let uid = |kubeconfig: &Path, namespace: &str, name: &str| -> Result<String> {
        let out = kubectl(
            kubeconfig,
            &[
                "-n",
                namespace,
                "get",
                "gateway",
                name,
                "-o",
                "jsonpath={.metadata.uid}",
            ],
        );
        ensure!(
            out.success() && !out.stdout.is_empty(),
            "reading gateway {namespace}/{name}: {}",
            out.stderr
        );
        Ok(out.stdout)
    };
    Ok((
        uid(kubeconfig, "demo", "edge")?,
        uid(
            &dir.join("host.kubeconfig"),
            crproxy::devsync::HOST_NAMESPACE,
            "edge-x-demo-x-client",
        )?,
    ))
}

/// Creates the Gateway `demo/edge` in the tenant (written through to the host
/// before the create returns) and waits (bounded) until the tenant object records
/// its mirror, so a restart finds a mirrored object.
fn write_gateway(kubeconfig: &Path, dir: &Path) -> Result<(String, String)> {
    let out = kubectl_stdin(
        kubeconfig,
        &["-n", "demo", "create", "-f", "-"],
        Some("apiVersion: example.net/v1\nkind: Gateway\nmetadata: {name: edge}\nspec: {port: 443}\n"),
        KUBECTL_TIMEOUT,
    );
    ensure!(out.success(), "creating the Gateway: {}", out.stderr);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = kubectl(
            kubeconfig,
            &[
                "-n",
                "demo",
                "get",
                "gateway",
                "edge",
                "-o",
                "jsonpath={.metadata.annotations.crproxy\\.dev/host-mirror}",
            ],
        );
        if out.success() && !out.stdout.is_empty() {
            return read_gateway(kubeconfig, dir);
        }
        ensure!(
            Instant::now() < deadline,
            "the Gateway's mirror was not recorded within 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Start, write, stop with `signal`, start again on the same directory and
/// ports: the first read and write after the second start succeed.
fn restart_keeps_serving(signal: &str) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("dev");
    let ports = Ports::free()?;
    let kubeconfig = dir.join("client.kubeconfig");

    let first = Dev::start(&dir, &ports, &[])?;
    let out = kubectl(&kubeconfig, &["create", "namespace", "demo"]);
    ensure!(out.success(), "{}", out.stderr);
    write_widget(&kubeconfig, "demo", "before")?;
    let gateway_before = write_gateway(&kubeconfig, &dir)?;
    let (status, stderr) = first.stop(signal)?;
    if signal == "TERM" {
        ensure!(status.success(), "exit {status} after SIGTERM: {stderr}");
    }

    let second = Dev::start(&dir, &ports, &[])?;
    read_widget(&kubeconfig, "demo", "before")?;
    // The tenant's Gateway and its mirror on the host (the same object, kept by
    // the example extension server) are still there.
    let gateway_after = read_gateway(&kubeconfig, &dir)?;
    ensure!(
        gateway_after == gateway_before,
        "the Gateway or its host mirror changed across the restart: {gateway_before:?} -> {gateway_after:?}"
    );
    write_widget(&kubeconfig, "demo", "after")?;
    // A namespace that is new since the restart is mirrored too.
    let out = kubectl(&kubeconfig, &["create", "namespace", "later"]);
    ensure!(out.success(), "{}", out.stderr);
    write_widget(&kubeconfig, "later", "fresh")?;
    let (status, stderr) = second.stop("TERM")?;
    ensure!(status.success(), "exit {status}: {stderr}");
    Ok(())
}

#[test]
fn restart_on_the_same_directory_after_sigterm_serves_at_once() -> Result<()> {
    restart_keeps_serving("TERM")
}

#[test]
fn restart_on_the_same_directory_after_sigkill_serves_at_once() -> Result<()> {
    restart_keeps_serving("KILL")
}

/// Two busy ports: one line naming both and their flags, nothing written, and
/// once the ports are free the same command on the same directory works.
#[test]
fn busy_ports_are_named_on_one_line_and_the_directory_stays_usable() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("dev");
    let (ports, mut listeners) = Ports::held()?;
    // Keep the client (index 1) and metrics (index 3) ports busy, free the rest.
    let metrics_taken = listeners.remove(3);
    let client_taken = listeners.remove(1);
    drop(listeners);

    let mut child = KillOnDrop(dev_command(&dir, &ports, &[]).spawn()?);
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + START_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        ensure!(Instant::now() < deadline, "crproxy dev did not fail");
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = stderr.join().map_err(|_| anyhow!("stderr reader"))?;
    let _ = stdout.join();
    assert!(!status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    let line = stderr.trim_end();
    assert!(line.starts_with("crproxy: "), "{line}");
    assert!(
        line.contains(&format!("{} (move it with --client-port)", ports.client)),
        "{line}"
    );
    assert!(
        line.contains(&format!("{} (move it with --metrics-port)", ports.metrics)),
        "{line}"
    );
    assert!(
        !line.contains(&ports.target.to_string()),
        "free ports are not named: {line}"
    );
    assert!(!dir.exists(), "nothing written to {}", dir.display());

    drop((client_taken, metrics_taken));
    let dev = Dev::start(&dir, &ports, &[])?;
    let kubeconfig = dir.join("client.kubeconfig");
    write_widget(&kubeconfig, "default", "works")?;
    let (status, stderr) = dev.stop("TERM")?;
    ensure!(status.success(), "exit {status}: {stderr}");
    Ok(())
}

/// `--clients 2`: the banner names every client kubeconfig it wrote.
#[test]
fn the_banner_names_every_client_kubeconfig() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("dev");
    let dev = Dev::start(&dir, &Ports::any(), &["--clients", "2"])?;
    for file in [
        "client.kubeconfig",
        "client-2.kubeconfig",
        "target.kubeconfig",
    ] {
        assert!(dev.banner.contains(file), "{file} missing: {}", dev.banner);
        let path: PathBuf = dir.join(file);
        assert!(path.exists(), "{} not written", path.display());
    }
    let second = dir.join("client-2.kubeconfig");
    write_widget(&second, "default", "from-second")?;
    let (status, stderr) = dev.stop("TERM")?;
    ensure!(status.success(), "exit {status}: {stderr}");
    Ok(())
}

/// A second `crproxy dev` on a directory in use says so on one line (whatever
/// ports it is given) and leaves the running one alone.
#[test]
fn a_second_dev_on_the_same_directory_says_it_is_in_use() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("dev");
    let first = Dev::start(&dir, &Ports::any(), &[])?;
    let output = dev_command(&dir, &Ports::any(), &[]).output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "is in use by another running crproxy dev (pid {})",
            first.child.id()
        )),
        "{stderr}"
    );
    write_widget(&dir.join("client.kubeconfig"), "default", "still-served")?;
    let (status, stderr) = first.stop("TERM")?;
    ensure!(status.success(), "exit {status}: {stderr}");
    Ok(())
}
