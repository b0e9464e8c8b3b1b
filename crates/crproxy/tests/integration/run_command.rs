//! `crproxy run --config FILE` as an operator runs it: a separate process that
//! registers itself, serves, and on SIGTERM stops cleanly and hands its lease back.

use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, PostParams};
use serde_json::Value;
use tokio::time::Instant;

use crproxy::devenv::{admin_client, wait_for_available, Link, LinkSpec, ProxiedResource};

/// A client and a target devcluster on 127.0.0.1, and the client admin's
/// kubeconfig written in `dir`.
async fn client_and_target(
    dir: &std::path::Path,
) -> Result<(
    devcluster::DevCluster,
    devcluster::DevCluster,
    std::path::PathBuf,
)> {
    let start = |name: &str| {
        devcluster::start(devcluster::DevClusterConfig {
            name: name.into(),
            data_dir: None,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
        })
    };
    let client = start("client").await?;
    let target = start("target").await?;
    let client_kubeconfig = dir.join("client.kubeconfig");
    std::fs::write(&client_kubeconfig, client.admin_kubeconfig())?;
    Ok((client, target, client_kubeconfig))
}

/// The link of one client and `target`, the example resource proxied to
/// `target_peers`, written in `dir/link`.
async fn link(
    dir: &std::path::Path,
    client_kubeconfig: std::path::PathBuf,
    target: &devcluster::DevCluster,
    target_peers: Vec<std::net::SocketAddr>,
    metrics_port: u16,
) -> Result<Link> {
    Link::prepare(LinkSpec {
        dir: dir.join("link"),
        client_name: "client".into(),
        client_kubeconfig,
        target_name: "target".into(),
        target,
        target_peers,
        resources: vec![ProxiedResource::example()],
        proxy_port: 0,
        metrics_port,
    })
    .await
}

/// `crproxy run --config <config>` as a child process with `CRPROXY_LOG=<log>`
/// (the default when `None`), and the reader of its stderr.
fn spawn_run(
    config: &std::path::Path,
    log: Option<&str>,
) -> Result<(test_support::KillOnDrop, Drained)> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_crproxy"));
    if let Some(log) = log {
        command.env("CRPROXY_LOG", log);
    }
    let mut child = command
        .args(["run", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr_reader = drain(child.stderr.take());
    Ok((test_support::KillOnDrop(child), stderr_reader))
}

/// The child's stderr as its JSON log lines, one event each.
fn json_log_lines(stderr: &str) -> Result<Vec<Value>> {
    let lines = stderr.lines().filter(|l| !l.trim().is_empty());
    Ok(lines
        .map(serde_json::from_str)
        .collect::<Result<Vec<Value>, _>>()?)
}

/// Sends the child SIGTERM and waits up to 20 s for it to exit.
async fn terminate(child: &mut test_support::KillOnDrop) -> Result<std::process::ExitStatus> {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    ensure!(status.success(), "kill -TERM failed");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(exit) = child.try_wait()? {
            return Ok(exit);
        }
        ensure!(
            Instant::now() < deadline,
            "crproxy run did not stop within 20s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_from_a_config_file_and_stops_cleanly_on_sigterm() -> Result<()> {
    crproxy_kube::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let (client, target, client_kubeconfig) = client_and_target(dir.path()).await?;
    let metrics_port = crproxy::devenv::free_port()?;
    let link = link(
        dir.path(),
        client_kubeconfig,
        &target,
        vec![target.addr()],
        metrics_port,
    )
    .await?;
    let (mut child, stderr_reader) =
        spawn_run(&link.config_path, Some("info,crproxy_proxy=debug"))?;

    let api = admin_client(&client)?;
    wait_for_available(&api, "v1.example.com", Duration::from_secs(30)).await?;
    ensure!(child.try_wait()?.is_none(), "crproxy run exited early");
    let list =
        http::Request::get("/apis/example.com/v1/namespaces/default/widgets").body(Vec::new())?;
    let listed: Value = api.request(list).await?;
    assert_eq!(listed["kind"], "WidgetList");
    // Trust loaded and peers listed: ready.
    let metrics = format!("127.0.0.1:{metrics_port}");
    assert_eq!(http_get(&metrics, "/readyz")?, (200, "ok".to_string()));
    assert_eq!(http_get(&metrics, "/healthz")?, (200, "ok".to_string()));

    let exit = terminate(&mut child).await?;
    let stderr = stderr_reader.join().unwrap_or_default();
    assert!(exit.success(), "exit {exit:?}: {stderr}");
    assert!(stderr.contains("Starting proxy server"), "{stderr}");
    assert!(stderr.contains("Starting target transport"), "{stderr}");
    assert!(stderr.contains("Connected to target"), "{stderr}");
    // Every line is one JSON object whose `target` key is the spec's field (the
    // target cluster), never also the module path.
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        assert!(line.matches("\"target\":").count() <= 1, "{line}");
        let parsed: serde_json::Value = serde_json::from_str(line)?;
        assert!(parsed["logger"].is_string(), "{line}");
        if parsed["message"] == "Starting proxy server" {
            assert_eq!(parsed["target"], "default/target", "{line}");
        }
    }
    // The lease was handed back so another replica can lead at once.
    let lease = Api::<Lease>::namespaced(api, "kube-system")
        .get("crproxy-client")
        .await?;
    let holder = lease
        .spec
        .and_then(|spec| spec.holder_identity)
        .unwrap_or_default();
    assert!(holder.is_empty(), "lease still held by {holder:?}");
    client.shutdown().await;
    target.shutdown().await;
    Ok(())
}

/// The spec's healthy startup, once for each group/version served: "Starting
/// proxy server", then "Starting target transport", each naming its
/// group/version, and at debug level "Connected to target" once that
/// group/version's first probe succeeds. Two resources of different groups and
/// versions make two sequences, one for each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_logs_the_startup_sequence_once_per_group_version() -> Result<()> {
    crproxy_kube::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let (client, target, client_kubeconfig) = client_and_target(dir.path()).await?;
    let gadgets = ProxiedResource {
        group: "other.io".into(),
        version: "v1alpha1".into(),
        plural: "gadgets".into(),
        kind: "Gadget".into(),
    };
    let link = Link::prepare(LinkSpec {
        dir: dir.path().join("link"),
        client_name: "client".into(),
        client_kubeconfig,
        target_name: "target".into(),
        target: &target,
        target_peers: vec![target.addr()],
        resources: vec![ProxiedResource::example(), gadgets],
        proxy_port: 0,
        metrics_port: 0,
    })
    .await?;
    let (mut child, stderr_reader) =
        spawn_run(&link.config_path, Some("info,crproxy_proxy=debug"))?;

    let api = admin_client(&client)?;
    for (api_service, path, list_kind) in [
        (
            "v1.example.com",
            "/apis/example.com/v1/namespaces/default/widgets",
            "WidgetList",
        ),
        (
            "v1alpha1.other.io",
            "/apis/other.io/v1alpha1/namespaces/default/gadgets",
            "GadgetList",
        ),
    ] {
        wait_for_available(&api, api_service, Duration::from_secs(30)).await?;
        let listed: Value = api
            .request(http::Request::get(path).body(Vec::new())?)
            .await?;
        assert_eq!(listed["kind"], list_kind, "{path}");
    }
    // Each probe runs on its own after its server starts: wait (30 s at most)
    // for both to have reported before stopping the process.
    let deadline = Instant::now() + Duration::from_secs(30);
    while stderr_reader
        .so_far()
        .matches("\"Connected to target\"")
        .count()
        < 2
        && Instant::now() < deadline
        && child.try_wait()?.is_none()
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let exit = terminate(&mut child).await?;
    let stderr = stderr_reader.join().unwrap_or_default();
    assert!(exit.success(), "exit {exit:?}: {stderr}");

    let events = json_log_lines(&stderr)?;
    // Where `message` was logged for `group_version`, in the order written.
    let at = |message: &str, group_version: &str| -> Vec<usize> {
        (0..events.len())
            .filter(|&i| {
                events[i]["message"] == message && events[i]["group_version"] == group_version
            })
            .collect()
    };
    let mut ports = Vec::new();
    for group_version in ["example.com/v1", "other.io/v1alpha1"] {
        let server = at("Starting proxy server", group_version);
        let transport = at("Starting target transport", group_version);
        let connected = at("Connected to target", group_version);
        for (message, lines) in [
            ("Starting proxy server", &server),
            ("Starting target transport", &transport),
            ("Connected to target", &connected),
        ] {
            assert_eq!(lines.len(), 1, "{message} for {group_version}: {stderr}");
        }
        assert!(
            server[0] < transport[0] && transport[0] < connected[0],
            "{group_version}'s startup lines out of order: {stderr}"
        );
        for line in [server[0], transport[0]] {
            assert_eq!(events[line]["target"], "default/target", "{stderr}");
        }
        ports.push(events[server[0]]["port"].clone());
    }
    assert_ne!(ports[0], ports[1], "one port per group/version: {stderr}");
    // No sequence for anything else: one of each line per group/version.
    for message in [
        "Starting proxy server",
        "Starting target transport",
        "Connected to target",
    ] {
        let count = events.iter().filter(|e| e["message"] == message).count();
        assert_eq!(count, 2, "{message}: {stderr}");
    }
    client.shutdown().await;
    target.shutdown().await;
    Ok(())
}

/// A kubeconfig for `cluster` whose user is an exec plugin that hands out a
/// `system:masters` token and appends a line to the returned file on each run
/// (appends from runs at once cannot lose a count). Both go in `dir`.
fn counting_exec_kubeconfig(
    cluster: &devcluster::DevCluster,
    dir: &std::path::Path,
) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir(dir)?;
    let token = cluster.issue_token("crproxy-by-plugin", &["system:masters"])?;
    std::fs::write(dir.join("token"), token)?;
    let plugin = dir.join("plugin.sh");
    std::fs::write(
        &plugin,
        "#!/bin/sh\necho run >> \"$1/runs\"\nprintf '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"%s\"}}\\n' \"$(cat \"$1/token\")\"\n",
    )?;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))?;
    let kubeconfig = dir.join("exec.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {plugin}\n      args: [{state}]\n      interactiveMode: Never\ncontexts:\n- name: ctx\n  context: {{cluster: c, user: u}}\ncurrent-context: ctx\n",
            url = cluster.url(),
            ca = base64::engine::general_purpose::STANDARD.encode(cluster.ca_pem()),
            plugin = plugin.display(),
            state = dir.display(),
        ),
    )?;
    Ok((kubeconfig, dir.join("runs")))
}

/// Each cluster is one identity with one credential provider, so each
/// kubeconfig's exec plugin runs once. The client's token serves the proxy (its
/// trust and namespace watches), the registration (Lease and APIService) and the
/// sync's check of the tenant for an old write-through webhook; the target's
/// serves the proxy's requests and the EndpointSlices its peers are read from
/// (`peers.endpointSlices` without a kubeconfig of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_runs_each_identitys_exec_plugin_once() -> Result<()> {
    crproxy_kube::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let (client, target, _) = client_and_target(dir.path()).await?;
    let (client_kubeconfig, client_runs) =
        counting_exec_kubeconfig(&client, &dir.path().join("client-plugin"))?;
    let (target_kubeconfig, target_runs) =
        counting_exec_kubeconfig(&target, &dir.path().join("target-plugin"))?;
    let peers = Api::<EndpointSlice>::namespaced(admin_client(&target)?, "default");
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "peers", "labels": {"kubernetes.io/service-name": "crproxy-peers"}},
        "addressType": "IPv4",
        "ports": [{"name": "https", "port": target.addr().port()}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
    }))?;
    peers.create(&PostParams::default(), &slice).await?;
    let metrics_port = crproxy::devenv::free_port()?;
    let link = link(
        dir.path(),
        client_kubeconfig,
        &target,
        vec![target.addr()],
        metrics_port,
    )
    .await?;
    // The target's identity becomes the plugin's, and its peers the slice.
    let config = std::fs::read_to_string(&link.config_path)?;
    let identity = dir.path().join("link").join("target-identity.kubeconfig");
    let config = config
        .replace(
            &format!("kubeconfig: \"{}\"", identity.display()),
            &format!("kubeconfig: \"{}\"", target_kubeconfig.display()),
        )
        .replace(
            &format!("static: [\"{}\"]", target.addr()),
            "endpointSlices: {namespace: default, service: crproxy-peers, portName: https}",
        );
    ensure!(
        config.contains("exec.kubeconfig") && config.contains("endpointSlices"),
        "{config}"
    );
    std::fs::write(&link.config_path, config)?;
    let (mut child, stderr_reader) = spawn_run(&link.config_path, None)?;

    let api = admin_client(&client)?;
    wait_for_available(&api, "v1.example.com", Duration::from_secs(30)).await?;
    let metrics = format!("127.0.0.1:{metrics_port}");
    assert_eq!(http_get(&metrics, "/readyz")?, (200, "ok".to_string()));
    // A request through the proxy: the target's credentials on the data path.
    let list =
        http::Request::get("/apis/example.com/v1/namespaces/default/widgets").body(Vec::new())?;
    let listed: Value = api.request(list).await?;
    assert_eq!(listed["kind"], "WidgetList");
    // The sync's check of the tenant starts with the process; give it time to
    // have asked for a token of its own, were it to.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let runs = |file: &std::path::Path| std::fs::read_to_string(file).unwrap_or_default();
    let (client_runs, target_runs) = (runs(&client_runs), runs(&target_runs));
    terminate(&mut child).await?;
    let stderr = stderr_reader.join().unwrap_or_default();
    assert_eq!(
        client_runs.lines().count(),
        1,
        "client plugin: {client_runs:?}\n{stderr}"
    );
    assert_eq!(
        target_runs.lines().count(),
        1,
        "target plugin: {target_runs:?}\n{stderr}"
    );
    client.shutdown().await;
    target.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_logs_a_failed_startup_probe_and_keeps_serving() -> Result<()> {
    crproxy_kube::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let (client, target, client_kubeconfig) = client_and_target(dir.path()).await?;
    // The only peer is a port nobody listens on.
    let refused = test_support::RefusedPort::bind();
    let link = link(
        dir.path(),
        client_kubeconfig,
        &target,
        vec![refused.addr],
        0,
    )
    .await?;
    let (mut child, stderr_reader) = spawn_run(&link.config_path, None)?;
    // Discovery keeps working from the local fallback, so the APIService turns
    // Available even though the target is unreachable.
    let api = admin_client(&client)?;
    wait_for_available(&api, "v1.example.com", Duration::from_secs(30)).await?;
    terminate(&mut child).await?;
    let stderr = stderr_reader.join().unwrap_or_default();
    assert!(
        stderr.contains("initial probe of proxy target failed, requests will keep retrying"),
        "{stderr}"
    );
    client.shutdown().await;
    target.shutdown().await;
    Ok(())
}

/// The other way the startup probe fails: the target is reached but answers the
/// probe's `GET /apis/<group>/<version>` with something other than 200 (here a
/// 401, its token being one the target never issued). The spec's line is
/// logged at warn, once, with the status code in place of an error, and the
/// process keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_logs_a_startup_probe_the_target_answers_with_an_error_status() -> Result<()> {
    const PROBE_FAILED: &str = "initial probe of proxy target failed, requests will keep retrying";
    crproxy_kube::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let (client, target, client_kubeconfig) = client_and_target(dir.path()).await?;
    let link = link(
        dir.path(),
        client_kubeconfig,
        &target,
        vec![target.addr()],
        0,
    )
    .await?;
    std::fs::write(
        dir.path()
            .join("link")
            .join(crproxy::devenv::IDENTITY_TOKEN_FILE),
        "not-a-token-the-target-issued\n",
    )?;
    let (mut child, stderr_reader) = spawn_run(&link.config_path, None)?;
    // The probe runs on its own after the server starts: wait (30 s at most).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !stderr_reader.so_far().contains(PROBE_FAILED)
        && Instant::now() < deadline
        && child.try_wait()?.is_none()
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let running = child.try_wait()?.is_none();
    let exit = terminate(&mut child).await?;
    let stderr = stderr_reader.join().unwrap_or_default();
    assert!(running, "crproxy run exited: {stderr}");
    assert!(exit.success(), "exit {exit:?}: {stderr}");
    let events = json_log_lines(&stderr)?;
    let probes: Vec<&Value> = events
        .iter()
        .filter(|e| e["message"] == PROBE_FAILED)
        .collect();
    assert_eq!(probes.len(), 1, "{stderr}");
    let probe = probes[0];
    assert_eq!(probe["level"], "WARN", "{probe}");
    assert_eq!(probe["code"], 401, "{probe}");
    assert_eq!(probe["group_version"], "example.com/v1", "{probe}");
    // The target's `<project>/<name>`, as on every line and metric series.
    assert_eq!(probe["target"], "default/target", "{probe}");
    assert!(probe.get("error").is_none(), "{probe}");
    client.shutdown().await;
    target.shutdown().await;
    Ok(())
}

/// Neither cluster reachable: the process runs, but `/readyz` and `/healthz`
/// answer 503 and say why; `/livez` says it is alive.
#[test]
fn run_is_not_ready_while_neither_cluster_is_reachable() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let refused = test_support::RefusedPort::bind();
    let nobody = refused.addr;
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\n\
         clusters: [{{name: c, cluster: {{server: \"https://{nobody}\", insecure-skip-tls-verify: true}}}}]\n\
         users: [{{name: u, user: {{token: t}}}}]\n\
         contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\n"
    );
    std::fs::write(dir.path().join("cluster.kubeconfig"), kubeconfig)?;
    let metrics_port = crproxy::devenv::free_port()?;
    let proxy_port = crproxy::devenv::free_port()?;
    let config = dir.path().join("crproxy.yaml");
    std::fs::write(
        &config,
        format!(
            "client: {{name: client, project: default, kubeconfig: cluster.kubeconfig}}\n\
             proxy: {{basePort: {proxy_port}, metricsAddress: \"127.0.0.1:{metrics_port}\"}}\n\
             targets:\n  - name: target\n    kubeconfig: cluster.kubeconfig\n    peers: {{file: peers.yaml}}\n\
             experimental:\n  proxy:\n    customResources:\n      widgets.example.com/v1:\n        enabled: true\n        targetVirtualCluster: {{name: target}}\n"
        ),
    )?;
    let (mut child, stderr_reader) = spawn_run(&config, None)?;
    let metrics = format!("127.0.0.1:{metrics_port}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let livez = loop {
        if let Ok(answer) = http_get(&metrics, "/livez") {
            break answer;
        }
        ensure!(child.try_wait()?.is_none(), "crproxy run exited");
        ensure!(std::time::Instant::now() < deadline, "no metrics listener");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(livez, (200, "ok".to_string()));
    for path in ["/readyz", "/healthz"] {
        let (code, body) = http_get(&metrics, path)?;
        assert_eq!(code, 503, "{path}: {body}");
        assert!(
            body.contains("front-proxy trust not loaded"),
            "{path}: {body}"
        );
        assert!(
            body.contains("no target's peer cache has synced yet (targets: default/target)"),
            "{path}: {body}"
        );
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = stderr_reader.join();
    Ok(())
}

/// `GET path` over plain HTTP/1.1: the status code and body.
fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no HTTP response: {response:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status in {head:?}"))?;
    Ok((code, body.to_string()))
}

/// A child's stderr, read as it is written so a chatty child never blocks on a
/// full pipe.
struct Drained {
    text: std::sync::Arc<std::sync::Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
}

impl Drained {
    /// What the child has written so far.
    fn so_far(&self) -> String {
        self.text.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// All the child wrote, once it has closed the pipe.
    fn join(self) -> std::thread::Result<String> {
        let Drained { text, reader } = self;
        reader.join()?;
        Ok(text.lock().map(|t| t.clone()).unwrap_or_default())
    }
}

fn drain(pipe: Option<std::process::ChildStderr>) -> Drained {
    use std::io::BufRead;
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let written = std::sync::Arc::clone(&text);
    let reader = std::thread::spawn(move || {
        let Some(pipe) = pipe else { return };
        let mut pipe = std::io::BufReader::new(pipe);
        let mut line = Vec::new();
        while matches!(pipe.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            if let Ok(mut text) = written.lock() {
                text.push_str(&String::from_utf8_lossy(&line));
            }
            line.clear();
        }
    });
    Drained { text, reader }
}

/// When an APIService never turns Available, the error carries the aggregator's
/// reason and message, which say what to fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_availability_reports_the_aggregators_reason() -> Result<()> {
    crproxy_kube::install_crypto_provider();
    let client = devcluster::start(devcluster::DevClusterConfig {
        name: "client".into(),
        data_dir: None,
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 0,
    })
    .await?;
    let api = admin_client(&client)?;
    let nowhere: APIService = serde_json::from_value(serde_json::json!({
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": "v1.example.com"},
            "spec": {
                "group": "example.com", "version": "v1",
                "groupPriorityMinimum": 1000, "versionPriority": 15,
                "insecureSkipTLSVerify": true,
                "service": {"namespace": "kube-system", "name": "nowhere", "port": 443}
            }
    }))?;
    Api::<APIService>::all(api.clone())
        .create(&PostParams::default(), &nowhere)
        .await?;
    let error = wait_for_available(&api, "v1.example.com", Duration::from_secs(2))
        .await
        .expect_err("no Service behind it");
    let text = error.to_string();
    assert!(
        text.contains("did not become Available within 2s"),
        "{text}"
    );
    assert!(text.contains("(ServiceNotFound: service/nowhere"), "{text}");
    client.shutdown().await;
    Ok(())
}

/// The proxy port a link picks is free when picked but held by nothing until the
/// first replica listens; another listener that takes it meanwhile (another
/// test's pick) makes that replica pick again and write the new port down, so
/// later replicas and `crproxy run` agree on it. A port the caller chose is
/// not replaced: its error stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_picked_proxy_port_taken_before_the_proxy_listens_is_picked_again() -> Result<()> {
    crproxy_kube::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let (_client, target, client_kubeconfig) = client_and_target(dir.path()).await?;
    let spec = |name: &str, proxy_port: u16| LinkSpec {
        dir: dir.path().join(name),
        client_name: "client".into(),
        client_kubeconfig: client_kubeconfig.clone(),
        target_name: "target".into(),
        target: &target,
        target_peers: vec![target.addr()],
        resources: vec![ProxiedResource::example()],
        proxy_port,
        metrics_port: 0,
    };
    let base_port = |link: &Link| -> Result<u16> {
        let text = std::fs::read_to_string(&link.config_path)?;
        let line = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("basePort: "))
            .ok_or_else(|| anyhow::anyhow!("no basePort in {text}"))?;
        Ok(line.parse()?)
    };

    let picked = Link::prepare(spec("picked", 0)).await?;
    let taken = base_port(&picked)?;
    let squatter = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, taken))?;
    let replica = picked.start_replica().await?;
    let listening = replica.proxy.servers[0].1.port();
    assert_ne!(listening, taken, "listened on the taken port");
    assert_eq!(
        base_port(&picked)?,
        listening,
        "the new port is written down"
    );
    replica.stop().await;

    let chosen = Link::prepare(spec("chosen", taken)).await?;
    let error =
        chosen.start_replica().await.err().ok_or_else(|| {
            anyhow::anyhow!("a replica listened on a port another listener holds")
        })?;
    assert!(
        format!("{error:#}").contains(&format!("cannot listen on 127.0.0.1:{taken}")),
        "{error:#}"
    );
    drop(squatter);
    Ok(())
}
