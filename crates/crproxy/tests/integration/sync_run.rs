//! `crproxy run` and `crproxy check-config` with `sync` keys, as an operator runs them.

use crate::support;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Result};
use support::*;

fn crproxy(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_crproxy"))
        .args(args)
        .output()
        .expect("crproxy runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A plain HTTP GET on loopback.
fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    Ok(body)
}

#[test]
fn check_config_validates_sync_keys_and_warns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "client: {name: client, project: default}\nsync:\n  host: {kubeconfig: h, namespace: vcluster-client}\n  toHost:\n    customResources:\n      backups.example.org/v1: {enabled: true, scope: Cluster}\n  fromHost:\n    customResources:\n      stores.example.org: {enabled: true, scope: Namespaced}\n",
    )
    .expect("write");
    let (ok, stdout, _) = crproxy(&["check-config", bad.to_str().expect("utf-8")]);
    assert!(!ok);
    assert!(
        stdout.contains("sync.toHost.customResources[\"backups.example.org/v1\"].scope: "),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "sync.fromHost.customResources[\"stores.example.org\"].mappings: is required"
        ),
        "{stdout}"
    );
    // The host kubeconfig the file names is read too.
    assert!(
        stdout.contains("sync.host.kubeconfig: ") && stdout.contains("does not exist"),
        "{stdout}"
    );
    std::fs::write(
        dir.path().join("h"),
        "apiVersion: v1\nkind: Config\nclusters: [{name: h, cluster: {server: \"https://127.0.0.1:1\", insecure-skip-tls-verify: true}}]\nusers: [{name: h, user: {token: t}}]\ncontexts: [{name: h, context: {cluster: h, user: h}}]\ncurrent-context: h\n",
    )
    .expect("write");

    let both = dir.path().join("both.yaml");
    std::fs::write(
        &both,
        "client: {name: client, project: default}\nsync:\n  host: {kubeconfig: h, namespace: vcluster-client}\n  toHost:\n    customResources:\n      backups.example.org/v1: {enabled: true}\n  fromHost:\n    customResources:\n      backups.example.org: {enabled: true}\n      sharedstores.example.org: {enabled: true}\n",
    )
    .expect("write");
    let (ok, stdout, stderr) = crproxy(&["check-config", both.to_str().expect("utf-8")]);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "ok: sync toHost backups.example.org/v1 (Namespaced) -> host namespace vcluster-client"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok: sync fromHost sharedstores.example.org (Cluster) <- host"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("ok: sync fromHost backups.example.org"),
        "{stdout}"
    );
    assert!(
        stdout.contains("warning: sync.fromHost.customResources[\"backups.example.org\"]: backups.example.org is also synced toHost"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_only_sync_keys_syncs_logs_and_serves_metrics_syncer() -> Result<()> {
    let env = Env::new().await;
    let dir = tempfile::tempdir()?;
    let port = crproxy::devenv::free_port()?;
    let config = dir.path().join("sync.yaml");
    let text = format!(
        "{}proxy:\n  metricsAddress: 127.0.0.1:{port}\n",
        crproxy::devsync::sync_only_config("client", &env.tenant.kubeconfig, &env.host.kubeconfig)
    );
    std::fs::write(&config, text)?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_crproxy"))
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = stderr {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let mut child = test_support::KillOnDrop(child);
    let (host, tenant) = (&env.host.kubeconfig, &env.tenant.kubeconfig);
    ns(tenant, "team");
    apply(tenant, &backup("db", "team", "@daily"));
    eventually("mirror", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "db-x-team-x-client"],
        )
    })
    .await;
    let addr = format!("127.0.0.1:{port}");
    let metrics = http_get(&addr, "/metrics/syncer")?;
    for series in [
        "vcluster_syncer_objects_synced_total{resource=\"backups.example.org/v1\",direction=\"toHost\",action=\"create_host\"} 1",
        "vcluster_syncer_resolved_resources{resource=\"backups.example.org/v1\",direction=\"toHost\",source=\"crd\",kind=\"Backup\",version=\"v1\"} 1",
        "vcluster_syncer_resolved_resources{resource=\"sharedstores.example.org/v1\",direction=\"fromHost\",source=\"crd\",kind=\"SharedStore\",version=\"v1\"} 1",
        "vcluster_syncer_queue_depth{resource=\"backups.example.org/v1\",direction=\"toHost\"} 0",
        "vcluster_syncer_converge_seconds_count{resource=\"backups.example.org/v1\",direction=\"toHost\"}",
        "vcluster_syncer_leader 1",
    ] {
        assert!(metrics.contains(series), "missing {series}:\n{metrics}");
    }
    promtool_accepts(&metrics);
    // A foreign object under a mirror's name is reported as a sync error.
    apply(
        host,
        &backup("taken-x-team-x-client", "vcluster-client", "@yearly"),
    );
    apply(tenant, &backup("taken", "team", "@daily"));
    eventually("foreign_object error counted", || {
        http_get(&addr, "/metrics/syncer").ok().filter(|m| {
            m.contains("vcluster_syncer_errors_total{resource=\"backups.example.org/v1\",direction=\"toHost\",reason=\"foreign_object\"}")
        })
    })
    .await;

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    ensure!(status.success(), "kill -TERM failed");
    let exit = eventually_within(Duration::from_secs(20), "exit after SIGTERM", || {
        child.try_wait().ok().flatten()
    })
    .await;
    let log = reader.join().unwrap_or_default();
    assert!(exit.success(), "{log}");
    assert!(
        log.contains("resolved synced type against the host"),
        "{log}"
    );
    let synced = log
        .lines()
        .find(|l| l.contains("\"message\":\"synced\"") && l.contains("create_host"))
        .unwrap_or_default();
    for field in [
        "\"resource\":\"backups.example.org/v1\"",
        "\"tenant_object\":\"team/db\"",
        "\"host_object\":\"vcluster-client/db-x-team-x-client\"",
        "\"action\":\"create_host\"",
    ] {
        assert!(synced.contains(field), "{field} missing in {synced:?}");
    }
    assert!(
        log.contains("does not belong to this tenant object"),
        "{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_fails_at_start_up_with_one_line_naming_an_unserved_type() -> Result<()> {
    let env = Env::new().await;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("sync.yaml");
    // A free metrics port: the default one may be taken on the machine (by a
    // `crproxy dev`, say), and binding it comes before the check under test.
    let port = crproxy::devenv::free_port()?;
    let text = format!(
        "{}proxy:\n  metricsAddress: 127.0.0.1:{port}\n",
        crproxy::devsync::sync_only_config("client", &env.tenant.kubeconfig, &env.host.kubeconfig)
            .replace("sharedstores.example.org/v1", "gadgets.example.org/v1")
    );
    std::fs::write(&config, text)?;
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_crproxy"))
            .args(["run", "--config"])
            .arg(&config)
            .env("CRPROXY_LOG", "error")
            .output()
    })
    .await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("sync.fromHost.customResources[\"gadgets.example.org/v1\"]"),
        "{stderr}"
    );
    assert!(
        last.contains("the host does not serve gadgets.example.org"),
        "{stderr}"
    );
    Ok(())
}

/// What the reviewer does: `crproxy dev`, then kubectl against the client
/// (the tenant) and the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_runs_the_sync_between_the_client_and_a_host_cluster() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let free = || crproxy::devenv::free_port().map(|p| p.to_string());
    let child = Command::new(env!("CARGO_BIN_EXE_crproxy"))
        .args(["dev", "--dir"])
        .arg(dir.path())
        .args(["--target-port", &free()?, "--client-port", &free()?])
        .args(["--proxy-port", &free()?, "--metrics-port", &free()?])
        .args(["--host-port", &free()?, "--sync-metrics-port", &free()?])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut child = test_support::KillOnDrop(child);
    let dev_json = dir.path().join("dev.json");
    let described: serde_json::Value = eventually("dev.json with the host", || {
        let text = std::fs::read_to_string(&dev_json).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v.get("host").is_some().then_some(v)
    })
    .await;
    let host = dir.path().join("host.kubeconfig");
    let tenant = dir.path().join("client.kubeconfig");
    assert_eq!(described["host"]["kubeconfig"], host.display().to_string());
    assert_eq!(described["host"]["namespace"], "vcluster-client");

    ns(&tenant, "team");
    apply(&tenant, &backup("nightly", "team", "@daily"));
    let mirror = eventually("Backup mirrored to the host", || {
        get(
            &host,
            &["backup", "-n", "vcluster-client", "nightly-x-team-x-client"],
        )
    })
    .await;
    assert_eq!(
        mirror["metadata"]["annotations"]["vcluster.loft.sh/object-name"],
        "nightly"
    );
    apply(&host, &store("eu-store", "eu", 1));
    eventually("SharedStore copied to the tenant", || {
        get(&tenant, &["sharedstore", "eu-store"])
    })
    .await;

    // Issue 14's check: the aggregated Gateway is validated by the host's extension
    // API server before the tenant's create returns.
    eventually("the write-through webhook registered in the tenant", || {
        get(
            &tenant,
            &[
                "validatingwebhookconfiguration",
                "crproxy-writethrough-client",
            ],
        )
    })
    .await;
    let gateway = |port: u32| {
        format!("apiVersion: example.net/v1\nkind: Gateway\nmetadata: {{name: edge, namespace: team}}\nspec: {{port: {port}}}\n")
    };
    let rejected = eventually("the host's answer (write-through ready)", || {
        let out = test_support::kubectl_stdin(
            &tenant,
            &["create", "-f", "-"],
            Some(&gateway(70000)),
            test_support::KUBECTL_TIMEOUT,
        );
        assert!(!out.success(), "an invalid Gateway was stored");
        (!out.stderr.contains("not synced its caches")).then_some(out.stderr)
    })
    .await;
    assert!(rejected.contains("spec.port"), "{rejected}");
    assert!(get(&tenant, &["gateway", "-n", "team", "edge"]).is_none());
    assert!(get(
        &host,
        &["gateway", "-n", "vcluster-client", "edge-x-team-x-client"]
    )
    .is_none());
    apply(&tenant, &gateway(443));
    let mirror = get(
        &host,
        &["gateway", "-n", "vcluster-client", "edge-x-team-x-client"],
    )
    .expect("on the host when create returned");
    assert_eq!(mirror["spec"]["port"], 443);

    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let exit = eventually_within(Duration::from_secs(30), "dev stops", || {
        child.try_wait().ok().flatten()
    })
    .await;
    let mut banner = String::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_string(&mut banner)?;
    }
    assert!(exit.success(), "clean stop: {exit}");
    assert!(banner.contains("host.kubeconfig"), "{banner}");
    assert!(banner.contains("/metrics/syncer"), "{banner}");
    Ok(())
}

/// `promtool check metrics` accepts the scrape (a full HTTP response). Outside CI a
/// missing promtool skips the check with a note; under `CI=true` it fails.
fn promtool_accepts(response: &str) {
    let found = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "promtool is required in CI (Debian package `prometheus`)"
        );
        eprintln!("note: promtool not on PATH; skipping the promtool check");
        return;
    }
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    assert!(
        body.contains("# TYPE vcluster_syncer_objects_synced_total counter"),
        "{body}"
    );
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(body.as_bytes()).expect("write to promtool");
    }
    let out = child.wait_with_output().expect("promtool output");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One file with both `experimental.proxy` and `sync`: one `crproxy run` serves the
/// proxy and syncs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_proxy_and_sync_keys_runs_both() -> Result<()> {
    use crproxy::devenv::{admin_client, wait_for_available, Link, LinkSpec, ProxiedResource};
    let env = Env::new().await;
    let target = test_support::devcluster("target").await;
    let dir = tempfile::tempdir()?;
    let link = Link::prepare(LinkSpec {
        dir: dir.path().join("link"),
        client_name: "client".into(),
        client_kubeconfig: env.tenant.kubeconfig.clone(),
        target_name: "target".into(),
        target: &target.cluster,
        target_peers: vec![target.cluster.addr()],
        resources: vec![ProxiedResource::example()],
        proxy_port: 0,
        metrics_port: 0,
    })
    .await?;
    let mut text = std::fs::read_to_string(&link.config_path)?;
    text.push_str(&crproxy::devsync::sync_section(
        &env.host.kubeconfig.display().to_string(),
    ));
    std::fs::write(&link.config_path, text)?;
    let child = Command::new(env!("CARGO_BIN_EXE_crproxy"))
        .args(["run", "--config"])
        .arg(&link.config_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let mut child = test_support::KillOnDrop(child);
    let api = admin_client(&env.tenant.cluster)?;
    wait_for_available(&api, "v1.example.com", Duration::from_secs(30)).await?;
    let (host, tenant) = (&env.host.kubeconfig, &env.tenant.kubeconfig);
    ns(tenant, "team");
    apply(tenant, &backup("db", "team", "@daily"));
    eventually("mirror", || {
        get(
            host,
            &["backup", "-n", "vcluster-client", "db-x-team-x-client"],
        )
    })
    .await;
    ensure!(child.try_wait()?.is_none(), "crproxy run exited early");
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    ensure!(status.success(), "kill -TERM failed");
    let exit = eventually_within(Duration::from_secs(20), "exit after SIGTERM", || {
        child.try_wait().ok().flatten()
    })
    .await;
    assert!(exit.success(), "{exit}");
    Ok(())
}
