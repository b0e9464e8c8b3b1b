//! Aggregated types end to end: `gateways.example.net/v1` served on the host by the
//! example extension API server, synced toHost with write-through, driven with
//! kubectl on the tenant as a user would.

#[path = "support/sync_env.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use serde_json::Value;
use support::*;
use test_support::{kubectl_stdin, KubectlOutput, KUBECTL_TIMEOUT};

/// The process's log lines (JSON), for the spec's messages.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// The buffer of this test binary's one subscriber (tests run in parallel and a
    /// subscriber is process-wide).
    fn installed() -> Logs {
        static LOGS: std::sync::OnceLock<Logs> = std::sync::OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = Logs::default();
            let writer = logs.clone();
            let _ = tracing_subscriber::fmt()
                .json()
                .with_env_filter("crproxy_sync=info")
                .with_writer(move || writer.clone())
                .try_init();
            logs
        })
        .clone()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    /// Whether one line contains every one of `parts`.
    fn has(&self, parts: &[&str]) -> bool {
        self.text()
            .lines()
            .any(|l| parts.iter().all(|p| l.contains(p)))
    }
}

const HOST_NS: &str = crproxy::devsync::HOST_NAMESPACE;

/// kubectl off the runtime's threads: the webhook it triggers is served by this
/// process.
async fn kc(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> KubectlOutput {
    kc_within(kubeconfig, args, stdin, KUBECTL_TIMEOUT).await
}

async fn kc_within(
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
    timeout: Duration,
) -> KubectlOutput {
    let kubeconfig: PathBuf = kubeconfig.to_path_buf();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kubectl_stdin(&kubeconfig, &args, stdin.as_deref(), timeout)
    })
    .await
    .expect("kubectl thread")
}

fn gateway(name: &str, port: u32, labels: &str) -> String {
    format!(
        "apiVersion: example.net/v1\nkind: Gateway\nmetadata:\n  name: {name}\n  namespace: team\n  labels: {{{labels}}}\nspec:\n  port: {port}\n"
    )
}

/// The tenant's write-through registration (of the tenant `client`), or `None`.
fn registration(tenant: &Path) -> Option<Value> {
    let name = crproxy_sync::writethrough::configuration_name("client");
    get(tenant, &["validatingwebhookconfiguration", &name])
}

/// Waits until the tenant has no write-through registration.
async fn until_unregistered(tenant: &Path, what: &str) {
    eventually(what, || registration(tenant).is_none().then_some(())).await
}

async fn get_json(kubeconfig: &Path, args: &[&str]) -> Option<Value> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend(["-o", "json"]);
    let out = kc(kubeconfig, &all, None).await;
    if out.success() {
        serde_json::from_str(&out.stdout).ok()
    } else {
        assert!(
            out.stderr.contains("NotFound"),
            "kubectl {all:?}: {}",
            out.stderr
        );
        None
    }
}

/// A tenant webhook that fails every create of a Gateway labelled `doomed: "yes"`
/// (it is unreachable, failurePolicy Fail): a tenant store failure after the host
/// accepted the write.
const FAILING_WEBHOOK: &str = "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {name: always-fails}\nwebhooks:\n- name: fails.example.com\n  clientConfig: {url: \"https://127.0.0.1:1/\"}\n  rules: [{apiGroups: [example.net], apiVersions: [\"*\"], resources: [gateways], operations: [CREATE]}]\n  objectSelector: {matchLabels: {doomed: \"yes\"}}\n  sideEffects: None\n  failurePolicy: Fail\n  admissionReviewVersions: [v1]\n";

/// Creates `object` on the tenant, retrying while write-through is not ready yet
/// (it answers "not synced its caches" until then); any other failure fails the
/// test.
async fn create_once_ready(tenant: &Path, object: &str) {
    for _ in 0..100 {
        let out = kc(tenant, &["create", "-f", "-"], Some(object)).await;
        if out.success() {
            return;
        }
        assert!(
            out.stderr.contains("not synced its caches"),
            "create failed: {}",
            out.stderr
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("write-through never became ready");
}

/// Creates the `doomed` Gateway until write-through is ready (until then it
/// answers "not synced its caches"); the create always fails, the last time
/// after the host accepted it.
async fn create_doomed_once_ready(tenant: &Path) {
    for _ in 0..100 {
        let out = kc(
            tenant,
            &["create", "-f", "-"],
            Some(&gateway("doomed", 443, "doomed: \"yes\"")),
        )
        .await;
        assert!(!out.success(), "the failing webhook let it through");
        if !out.stderr.contains("not synced its caches") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("write-through never became ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_writes_of_an_aggregated_type_are_validated_by_the_host_before_they_return(
) -> Result<()> {
    let logs = Logs::installed();
    let env = Env::new().await;
    let metrics = crproxy_sync::SyncMetrics::new();
    let sync = env
        .start_full(
            "client",
            &env.tenant.kubeconfig,
            HOST_NS,
            None,
            std::sync::Arc::clone(&metrics),
        )
        .await?;
    let tenant = env.tenant.kubeconfig.clone();
    let host = env.host.kubeconfig.clone();

    // The generated CRD.
    let crd = get_json(&tenant, &["crd", "gateways.example.net"])
        .await
        .expect("generated CRD");
    assert_eq!(
        crd["metadata"]["annotations"]["vcluster.loft.sh/generated-from"],
        "aggregated-apiserver"
    );
    assert_eq!(crd["spec"]["names"]["singular"], "gateway");
    assert_eq!(crd["spec"]["names"]["listKind"], "GatewayList");
    assert_eq!(
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            ["x-kubernetes-preserve-unknown-fields"],
        true
    );
    assert!(crd["spec"]["versions"][0]["subresources"]["status"].is_object());
    assert!(sync.webhook.is_some());
    ns(&tenant, "team");
    // The leader registers the webhook once it leads; wait for it.
    eventually("the write-through webhook registered", || {
        registration(&tenant)
    })
    .await;
    // Writes before the syncer's caches are synced get 503; wait until they pass.
    create_once_ready(&tenant, &gateway("probe", 80, "")).await;

    // Watches opened before the rejected write.
    let watch = |kubeconfig: PathBuf, ns: &'static str| {
        tokio::spawn(async move {
            kc_within(
                &kubeconfig,
                &[
                    "get",
                    "gateways",
                    "-n",
                    ns,
                    "--watch-only",
                    "--output-watch-events",
                    "-o",
                    "json",
                ],
                None,
                Duration::from_secs(6),
            )
            .await
        })
    };
    let tenant_watch = watch(tenant.clone(), "team");
    let host_watch = watch(host.clone(), HOST_NS);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Rejected: the host's 422 naming spec.port, stored nowhere.
    let out = kc(
        &tenant,
        &["create", "-f", "-"],
        Some(&gateway("edge", 70000, "")),
    )
    .await;
    assert!(!out.success());
    assert!(out.stderr.contains("spec.port"), "{}", out.stderr);
    assert!(
        out.stderr.contains("Invalid") || out.stderr.contains("invalid"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("edge-x-team-x-client"),
        "host name leaked: {}",
        out.stderr
    );
    assert!(get_json(&tenant, &["gateway", "-n", "team", "edge"])
        .await
        .is_none());
    assert!(
        get_json(&host, &["gateway", "-n", HOST_NS, "edge-x-team-x-client"])
            .await
            .is_none()
    );
    let (tenant_seen, host_seen) = (tenant_watch.await?, host_watch.await?);
    assert!(
        !tenant_seen.stdout.contains("\"edge\""),
        "{}",
        tenant_seen.stdout
    );
    assert!(
        logs.has(&[
            "write-through: rejecting write, rolling back",
            r#""reason":"host_rejected""#,
            "team/edge"
        ]),
        "{}",
        logs.text()
    );
    assert!(
        !host_seen.stdout.contains("edge-x-team-x-client"),
        "{}",
        host_seen.stdout
    );

    // Dry run: reaches nothing.
    let out = kc(
        &tenant,
        &["create", "--dry-run=server", "-f", "-"],
        Some(&gateway("edge", 443, "")),
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    assert!(
        get_json(&host, &["gateway", "-n", HOST_NS, "edge-x-team-x-client"])
            .await
            .is_none()
    );
    assert!(get_json(&tenant, &["gateway", "-n", "team", "edge"])
        .await
        .is_none());

    // Accepted: on the host under its translated name when create returns.
    let out = kc(
        &tenant,
        &["create", "-f", "-"],
        Some(&gateway("edge", 443, "")),
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    let mirror = get_json(&host, &["gateway", "-n", HOST_NS, "edge-x-team-x-client"])
        .await
        .expect("mirror on the host before create returned");
    assert_eq!(mirror["spec"]["port"], 443);
    let tenant_uid = get_json(&tenant, &["gateway", "-n", "team", "edge"])
        .await
        .expect("tenant object")["metadata"]["uid"]
        .clone();
    assert_eq!(
        mirror["metadata"]["annotations"]["vcluster.loft.sh/object-uid"],
        tenant_uid
    );

    // Patches: rejected ones change nothing, accepted ones are on the host at once.
    let out = kc(
        &tenant,
        &[
            "-n",
            "team",
            "patch",
            "gateway",
            "edge",
            "--type=merge",
            "-p",
            r#"{"spec":{"port":0}}"#,
        ],
        None,
    )
    .await;
    assert!(!out.success());
    assert!(out.stderr.contains("spec.port"), "{}", out.stderr);
    let t = get_json(&tenant, &["gateway", "-n", "team", "edge"])
        .await
        .expect("tenant");
    assert_eq!(t["spec"]["port"], 443);
    let out = kc(
        &tenant,
        &[
            "-n",
            "team",
            "patch",
            "gateway",
            "edge",
            "--type=merge",
            "-p",
            r#"{"spec":{"port":8443}}"#,
        ],
        None,
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    let mirror = get_json(&host, &["gateway", "-n", HOST_NS, "edge-x-team-x-client"])
        .await
        .expect("mirror");
    assert_eq!(mirror["spec"]["port"], 8443);
    // Update (replace) rejected. The syncer may still be writing the host's status
    // back after the patch, and a replace of an older resourceVersion is a 409
    // before any webhook runs: read again then (bounded: 5 tries).
    let mut out = None;
    for _ in 0..5 {
        let mut invalid = get_json(&tenant, &["gateway", "-n", "team", "edge"])
            .await
            .expect("tenant");
        invalid["spec"]["port"] = 65536.into();
        let replaced = kc(&tenant, &["replace", "-f", "-"], Some(&invalid.to_string())).await;
        let conflict = replaced.stderr.contains("(Conflict)");
        out = Some(replaced);
        if !conflict {
            break;
        }
    }
    let out = out.expect("one replace");
    assert!(!out.success());
    assert!(out.stderr.contains("spec.port"), "{}", out.stderr);

    // A status write in the tenant skips write-through (the host's status wins
    // again through the syncer).
    let out = kc(
        &tenant,
        &[
            "-n",
            "team",
            "patch",
            "gateway",
            "edge",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"ready":true}}"#,
        ],
        None,
    )
    .await;
    assert!(out.success(), "{}", out.stderr);

    // Delete: asynchronous, the syncer removes the mirror.
    run(&tenant, &["-n", "team", "delete", "gateway", "edge"]);
    eventually("the mirror deleted", || {
        get(&host, &["gateway", "-n", HOST_NS, "edge-x-team-x-client"])
            .is_none()
            .then_some(())
    })
    .await;

    // A tenant store failure after the host accepted: another webhook of the tenant
    // fails (it is unreachable, failurePolicy Fail) for labelled Gateways. Its
    // mirror is removed; the rollback-failure metric stays 0.
    apply(&tenant, FAILING_WEBHOOK);
    let out = kc(
        &tenant,
        &["create", "-f", "-"],
        Some(&gateway("doomed", 443, "doomed: \"yes\"")),
    )
    .await;
    assert!(!out.success(), "the failing webhook let it through");
    assert!(get_json(&tenant, &["gateway", "-n", "team", "doomed"])
        .await
        .is_none());
    eventually("the accepted mirror of the unstored create removed", || {
        get(&host, &["gateway", "-n", HOST_NS, "doomed-x-team-x-client"])
            .is_none()
            .then_some(())
    })
    .await;
    run(
        &tenant,
        &["delete", "validatingwebhookconfiguration", "always-fails"],
    );
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    assert!(
        !text.contains("vcluster_writethrough_rollback_failures_total{"),
        "a rollback failed: {text}"
    );

    // The extension server down: 503, nothing left behind.
    env.example.stop();
    let out = kc(
        &tenant,
        &["create", "-f", "-"],
        Some(&gateway("down", 443, "")),
    )
    .await;
    assert!(!out.success());
    assert!(out.stderr.contains("ServiceUnavailable"), "{}", out.stderr);
    assert!(get_json(&tenant, &["gateway", "-n", "team", "down"])
        .await
        .is_none());
    assert!(
        logs.has(&[
            "write-through: rejecting write, rolling back",
            r#""reason":"unparseable_response""#,
            "team/down"
        ]),
        "{}",
        logs.text()
    );

    sync.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_crd_not_generated_for_the_aggregated_type_fails_start_up_in_one_line(
) -> Result<()> {
    let env = Env::new().await;
    let tenant = env.tenant.kubeconfig.clone();
    let theirs = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: gateways.example.net}\nspec:\n  group: example.net\n  scope: Namespaced\n  names: {plural: gateways, singular: gateway, kind: Gateway, listKind: GatewayList}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}\n";
    let out = kc(&tenant, &["create", "-f", "-"], Some(theirs)).await;
    assert!(out.success(), "{}", out.stderr);
    let err = match env.start("client").await {
        Ok(_) => panic!("start-up took over a CRD it did not generate"),
        Err(e) => e.to_string(),
    };
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(r#"sync.toHost.customResources["gateways.example.net/v1"]"#),
        "{err}"
    );
    assert!(
        err.contains(
            "without the annotation vcluster.loft.sh/generated-from: aggregated-apiserver"
        ),
        "{err}"
    );
    // Left as it was.
    let crd = get_json(&tenant, &["crd", "gateways.example.net"])
        .await
        .expect("CRD");
    assert!(crd["metadata"]["annotations"]["vcluster.loft.sh/generated-from"].is_null());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_synced_version_keeps_the_old_one_stored_but_unserved() -> Result<()> {
    let env = Env::new().await;
    let tenant = env.tenant.kubeconfig.clone();
    // As if an earlier start had synced v1alpha1 and stored objects in it.
    let earlier = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: gateways.example.net\n  annotations: {vcluster.loft.sh/generated-from: aggregated-apiserver}\nspec:\n  group: example.net\n  scope: Namespaced\n  names: {plural: gateways, singular: gateway, kind: Gateway, listKind: GatewayList}\n  versions:\n  - name: v1alpha1\n    served: true\n    storage: true\n    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}\n    subresources: {status: {}}\n";
    let out = kc(&tenant, &["create", "-f", "-"], Some(earlier)).await;
    assert!(out.success(), "{}", out.stderr);
    let sync = env.start("client").await?;
    let crd = get_json(&tenant, &["crd", "gateways.example.net"])
        .await
        .expect("CRD");
    let versions = crd["spec"]["versions"].as_array().expect("versions");
    let by_name = |n: &str| versions.iter().find(|v| v["name"] == n).cloned();
    let old = by_name("v1alpha1").expect("v1alpha1 kept");
    let new = by_name("v1").expect("v1 added");
    assert_eq!(old["served"], false);
    assert_eq!(old["storage"], false);
    assert_eq!(new["served"], true);
    assert_eq!(new["storage"], true);
    let stored = crd["status"]["storedVersions"].to_string();
    assert!(stored.contains("v1alpha1"), "{stored}");
    sync.stop().await;
    Ok(())
}

/// A create the tenant fails to store after the host accepted it, when the host then
/// cannot delete the mirror (the extension API server went down meanwhile): the
/// failure is counted as `host_delete` and logged with the spec's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_the_host_refuses_counts_host_delete() -> Result<()> {
    let logs = Logs::installed();
    let env = Env::new().await;
    let tenant = env.tenant.kubeconfig.clone();
    let metrics = crproxy_sync::SyncMetrics::new();
    let sync = env
        .start_full(
            "client",
            &tenant,
            HOST_NS,
            None,
            std::sync::Arc::clone(&metrics),
        )
        .await?;
    ns(&tenant, "team");
    apply(&tenant, FAILING_WEBHOOK);
    create_doomed_once_ready(&tenant).await;
    // Down before the rollback (5 s after the accepted create in these tests).
    env.example.stop();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut found = false;
    for _ in 0..100 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)?;
        if text.contains(r#"vcluster_writethrough_rollback_failures_total{resource="gateways.example.net/v1",reason="host_delete"} 1"#) {
            found = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        found,
        "no host_delete rollback failure counted; logs: {}",
        logs.text()
    );
    assert!(
        logs.has(&["write-through: rollback host delete failed", "team/doomed"]),
        "{}",
        logs.text()
    );
    sync.stop().await;
    Ok(())
}

/// A restart between the host accepting a create and its confirmation: the pending
/// state is gone with the process, and the restarted syncer finds a mirror without
/// its tenant object and removes it, so the result is the same as without the crash.
/// Write-through works again after the restart (the new leader re-registers itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_a_write_through_converges() -> Result<()> {
    let env = Env::new().await;
    let tenant = env.tenant.kubeconfig.clone();
    let host = env.host.kubeconfig.clone();
    let sync = env.start("client").await?;
    ns(&tenant, "team");
    apply(&tenant, FAILING_WEBHOOK);
    create_doomed_once_ready(&tenant).await;
    // The host accepted it; crash before the confirmation gives up on it.
    assert!(
        get_json(&host, &["gateway", "-n", HOST_NS, "doomed-x-team-x-client"])
            .await
            .is_some(),
        "write-through wrote the mirror"
    );
    sync.crash();
    let sync = env.start("client").await?;
    eventually("the orphaned mirror removed after the restart", || {
        get(&host, &["gateway", "-n", HOST_NS, "doomed-x-team-x-client"])
            .is_none()
            .then_some(())
    })
    .await;
    // Write-through answers again through the restarted replica.
    let mut attempts = 0;
    loop {
        let out = kc(
            &tenant,
            &["create", "-f", "-"],
            Some(&gateway("after", 70000, "")),
        )
        .await;
        assert!(!out.success(), "an invalid Gateway was stored");
        if out.stderr.contains("spec.port") {
            break;
        }
        attempts += 1;
        assert!(
            attempts < 100,
            "no host answer after the restart: {}",
            out.stderr
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sync.stop().await;
    Ok(())
}

/// The extension API server came back with an empty store while no syncer ran (what
/// `crproxy dev` did before it kept its Gateways): no DELETED event was seen, so the
/// tenant's Gateway is kept and its mirror created again. A mirror deleted on the
/// host while the syncer watches still takes the tenant object with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_a_host_lost_while_no_syncer_ran_are_created_again() -> Result<()> {
    let mut env = Env::new().await;
    let tenant = env.tenant.kubeconfig.clone();
    let host = env.host.kubeconfig.clone();
    let sync = env.start("client").await?;
    ns(&tenant, "team");
    create_once_ready(&tenant, &gateway("kept", 443, "")).await;
    let recorded = |mirror_uid: Option<String>| {
        let tenant = tenant.clone();
        move || {
            get(&tenant, &["gateway", "-n", "team", "kept"]).filter(|o| {
                let record = o["metadata"]["annotations"]["crproxy.dev/host-mirror"]
                    .as_str()
                    .unwrap_or_default();
                match &mirror_uid {
                    Some(uid) => record.ends_with(&format!("/{uid}")),
                    None => !record.is_empty(),
                }
            })
        }
    };
    let before = eventually("the mirror recorded", recorded(None)).await;
    sync.stop().await;

    env.example.stop();
    env.example = crproxy::devsync::start_example_apiserver(&env.host.cluster, None).await?;
    // kubectl's discovery catches up with the re-registered APIService.
    let listed = eventually("the host serves Gateways again", || {
        let out = test_support::kubectl(&host, &["get", "gateways", "-n", HOST_NS, "-o", "json"]);
        out.success()
            .then(|| serde_json::from_str::<Value>(&out.stdout).ok())
            .flatten()
    })
    .await;
    assert_eq!(
        listed["items"].as_array().map(Vec::len),
        Some(0),
        "the new extension server starts empty"
    );

    let sync = env.start("client").await?;
    let mirror = eventually("the lost mirror created again", || {
        get(&host, &["gateway", "-n", HOST_NS, "kept-x-team-x-client"])
    })
    .await;
    assert_eq!(
        mirror["metadata"]["annotations"]["vcluster.loft.sh/object-uid"],
        before["metadata"]["uid"]
    );
    assert_eq!(mirror["spec"]["port"], 443);
    let mirror_uid = mirror["metadata"]["uid"].as_str().map(str::to_owned);
    eventually("the new mirror recorded", recorded(mirror_uid)).await;
    let after = get(&tenant, &["gateway", "-n", "team", "kept"]);
    assert_eq!(
        after.map(|o| o["metadata"]["uid"].clone()),
        Some(before["metadata"]["uid"].clone()),
        "the tenant Gateway survived"
    );

    // Deleted on the host while the syncer watches: the tenant object goes too.
    run(
        &host,
        &["delete", "gateway", "-n", HOST_NS, "kept-x-team-x-client"],
    );
    eventually("the tenant Gateway deleted after its mirror", || {
        get(&tenant, &["gateway", "-n", "team", "kept"])
            .is_none()
            .then_some(())
    })
    .await;
    sync.stop().await;
    Ok(())
}

/// Creates an invalid and a valid Gateway through the tenant and checks that the
/// host's extension server decided both (retrying while the syncer is not ready).
async fn written_through(tenant: &Path, host: &Path, name: &str) {
    let mut attempts = 0;
    loop {
        let out = kc(
            tenant,
            &["create", "-f", "-"],
            Some(&gateway(&format!("{name}-bad"), 70000, "")),
        )
        .await;
        assert!(!out.success(), "an invalid Gateway was stored");
        if out.stderr.contains("spec.port") {
            break;
        }
        attempts += 1;
        assert!(attempts < 100, "the host never answered: {}", out.stderr);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = kc(
        tenant,
        &["create", "-f", "-"],
        Some(&gateway(name, 443, "")),
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    assert!(
        get_json(
            host,
            &["gateway", "-n", HOST_NS, &format!("{name}-x-team-x-client")]
        )
        .await
        .is_some(),
        "written to the host before the create returned"
    );
}

/// `sync.writeThrough.url` tells the tenant where the webhook is
/// (`clientConfig.url`); the Service form is
/// `the_write_through_service_leads_only_to_the_leader`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_reaches_the_webhook_by_url() -> Result<()> {
    let env = Env::new().await;
    let tenant = env.tenant.kubeconfig.clone();
    let host = env.host.kubeconfig.clone();
    ns(&tenant, "team");
    let base = crproxy::devsync::sync_only_config("client", &tenant, &host);
    let configuration = || registration(&tenant).expect("registered");

    let port = crproxy::devenv::free_port()?;
    let yaml = format!(
        "{base}  writeThrough:\n    listenAddress: 127.0.0.1:{port}\n    url: https://localhost:{port}/\n"
    );
    let sync = env
        .start_with("client", &tenant, HOST_NS, Some(yaml))
        .await?;
    let client_config = &configuration()["webhooks"][0]["clientConfig"];
    // The registered path carries the leader's token: the listener answers no other.
    let url = client_config["url"].as_str().unwrap_or_default();
    let token = url
        .strip_prefix(&format!("https://localhost:{port}/validate/"))
        .unwrap_or_default();
    assert_eq!(token.len(), 32, "{url}");
    written_through(&tenant, &host, "by-url").await;
    sync.stop().await;
    Ok(())
}

/// With a Service as the way in, the Service leads only to the leader: it has no
/// selector and the leader writes its EndpointSlice (here 127.0.0.1 and the leader's
/// port), so reviews never reach a standby, which would answer 503. Tenant writes
/// are decided by the host through it. Without its own address the Service form
/// refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_through_service_leads_only_to_the_leader() -> Result<()> {
    let env = Env::new().await;
    let tenant = env.tenant.kubeconfig.clone();
    let host = env.host.kubeconfig.clone();
    ns(&tenant, "team");
    apply(
        &tenant,
        "apiVersion: v1\nkind: Service\nmetadata: {name: crproxy-writethrough, namespace: kube-system}\nspec:\n  ports: [{name: https, port: 443}]\n",
    );
    let base = crproxy::devsync::sync_only_config("client", &tenant, &host);
    let config = |port: u16| {
        format!(
            "{base}  writeThrough:\n    listenAddress: 127.0.0.1:{port}\n    service: {{namespace: kube-system, name: crproxy-writethrough}}\n"
        )
    };
    let err = match env
        .start_with(
            "client",
            &tenant,
            HOST_NS,
            Some(config(crproxy::devenv::free_port()?)),
        )
        .await
    {
        Ok(_) => panic!("the Service form started without knowing its address"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("POD_IP") && err.contains("sync.writeThrough.service"),
        "{err}"
    );

    let replica = |leading: bool, port: u16| -> Result<crproxy_sync::SyncOptions> {
        let mut options = env.options(
            "client",
            &tenant,
            HOST_NS,
            Some(config(port)),
            crproxy_sync::SyncMetrics::new(),
        )?;
        options.leader = crproxy_wiring::LeaderHandle::fixed(leading);
        options.pod_ip = Some(std::net::IpAddr::from([127, 0, 0, 1]));
        Ok(options)
    };
    let (standby_port, leader_port) =
        (crproxy::devenv::free_port()?, crproxy::devenv::free_port()?);
    let standby = crproxy_sync::start(replica(false, standby_port)?).await?;
    let leader = crproxy_sync::start(replica(true, leader_port)?).await?;
    let leader_slice = || {
        get(
            &tenant,
            &[
                "endpointslice",
                "-n",
                "kube-system",
                "crproxy-writethrough-leader",
            ],
        )
    };
    let slice = eventually("the leader's EndpointSlice", leader_slice).await;
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        "crproxy-writethrough"
    );
    assert_eq!(slice["endpoints"][0]["addresses"][0], "127.0.0.1");
    assert_eq!(
        slice["ports"],
        serde_json::json!([{"name": "https", "port": leader_port, "protocol": "TCP"}])
    );
    written_through(&tenant, &host, "via-leader").await;

    // A successor points the Service at itself; the old leader's stop must leave the
    // successor's endpoint in place, and the successor's stop empties the slice.
    let slice_port = |slice: &Value| slice["ports"][0]["port"].as_u64();
    let successor_port = crproxy::devenv::free_port()?;
    let successor = crproxy_sync::start(replica(true, successor_port)?).await?;
    eventually("the successor's EndpointSlice", || {
        leader_slice().filter(|s| slice_port(s) == Some(u64::from(successor_port)))
    })
    .await;
    leader.stop().await;
    let slice = leader_slice().expect("the slice is still there");
    assert_eq!(
        slice_port(&slice),
        Some(u64::from(successor_port)),
        "{slice}"
    );
    assert_eq!(
        slice["endpoints"][0]["addresses"][0], "127.0.0.1",
        "{slice}"
    );
    successor.stop().await;
    let slice = leader_slice().expect("the slice is still there");
    assert_eq!(slice["endpoints"], serde_json::json!([]), "{slice}");
    standby.stop().await;
    Ok(())
}

/// Disabling the aggregated type removes its write-through webhook: left in
/// place, it would point at a listener no longer there and, failing closed,
/// refuse every tenant write of Gateways. The type disabled beside others still
/// synced: the leader removes it. Every entry disabled: no syncer runs and
/// nothing leads, so the replica removes it at start. A Gateway is then stored
/// with no host validation, as the spec says of a disabled type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabling_the_aggregated_type_removes_its_webhook() -> Result<()> {
    let env = Env::new().await;
    let tenant = env.tenant.kubeconfig.clone();
    let host = env.host.kubeconfig.clone();
    ns(&tenant, "team");
    let configuration = || registration(&tenant);
    let enabled = crproxy::devsync::sync_only_config("client", &tenant, &host);
    let gateways = "      gateways.example.net/v1:\n        enabled: true";
    assert!(enabled.contains(gateways));
    let gateways_disabled = enabled.replacen(
        gateways,
        "      gateways.example.net/v1:\n        enabled: false",
        1,
    );
    let all_disabled = enabled.replace("enabled: true", "enabled: false");

    let sync = env.start("client").await?;
    eventually("the write-through webhook registered", configuration).await;
    sync.stop().await;
    let sync = env
        .start_with("client", &tenant, HOST_NS, Some(gateways_disabled))
        .await?;
    assert!(sync.webhook.is_none());
    until_unregistered(&tenant, "the webhook removed by the leader").await;
    let out = kc(
        &tenant,
        &["create", "-f", "-"],
        Some(&gateway("unvalidated", 70000, "")),
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    sync.stop().await;

    let sync = env.start("client").await?;
    eventually("the write-through webhook registered again", configuration).await;
    sync.stop().await;
    let started = Env::start_from_yaml(&all_disabled, "disabled", Duration::from_secs(3)).await?;
    assert!(started.is_none(), "nothing to sync");
    until_unregistered(&tenant, "the webhook removed at start").await;
    Ok(())
}

/// A type newly written through never goes without its webhook: while a leader
/// of an earlier configuration, whose registration lacks the type, still leads,
/// a starting replica adds the type's webhook to it. It points at that standby,
/// which answers reviews only once it leads, so until then writes of the type
/// fail closed instead of being stored without the host's validation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newly_synced_type_gets_its_webhook_before_this_replica_leads() -> Result<()> {
    let env = Env::new().await;
    let tenant = env.tenant.kubeconfig.clone();
    ns(&tenant, "team");
    let earlier = serde_json::json!({"apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": crproxy_sync::writethrough::configuration_name("client")},
        "webhooks": []})
    .to_string();
    let out = kc(&tenant, &["create", "-f", "-"], Some(&earlier)).await;
    assert!(out.success(), "{}", out.stderr);
    let mut options = env.options(
        "client",
        &tenant,
        HOST_NS,
        None,
        crproxy_sync::SyncMetrics::new(),
    )?;
    options.leader = crproxy_wiring::LeaderHandle::fixed(false);
    let sync = crproxy_sync::start(options).await?;
    let configuration = registration(&tenant).expect("kept");
    let names: Vec<&str> = crproxy_sync::writethrough::webhook_names(&configuration).collect();
    assert_eq!(
        names,
        ["writethrough.gateways.example.net"],
        "{configuration}"
    );
    // A Gateway the host would refuse is not stored: the standby's webhook
    // fails closed.
    let out = kc(
        &tenant,
        &["create", "-f", "-"],
        Some(&gateway("edge", 70000, "")),
    )
    .await;
    assert!(!out.success(), "stored without the host's validation");
    assert!(get(&tenant, &["gateway", "-n", "team", "edge"]).is_none());
    sync.stop().await;
    Ok(())
}

/// A replica with no sync entry enabled leaves the registration alone while a
/// sync leader (of another configuration, during a rolling update) holds the
/// Lease, and removes it once none does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_sync_removes_the_webhook_only_once_no_sync_leads() -> Result<()> {
    let env = Env::new().await;
    let tenant = env.tenant.kubeconfig.clone();
    let host = env.host.kubeconfig.clone();
    let configuration = || registration(&tenant);
    // Long enough that a loaded machine does not make the leader miss a renewal.
    let lease = Duration::from_secs(5);
    let enabled = crproxy::devsync::sync_only_config("client", &tenant, &host);
    let leading = Env::start_from_yaml(&enabled, "old", lease)
        .await?
        .expect("a sync");
    eventually("the leader's registration", configuration).await;
    let disabled = enabled.replace("enabled: true", "enabled: false");
    assert!(
        Env::start_from_yaml(&disabled, "new", lease)
            .await?
            .is_none(),
        "nothing to sync"
    );
    // Several looks (one per lease duration) while the old replica leads.
    tokio::time::sleep(lease * 3).await;
    assert!(configuration().is_some(), "removed while a sync leads");
    leading.stop().await;
    until_unregistered(&tenant, "the registration removed once no sync leads").await;
    Ok(())
}

/// A registration removed while a leader leads (by a replica that judged the
/// Lease free just before the term began, or by hand) is put back by the
/// leader, which looks at it again every 15 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_removed_under_its_leader_is_put_back() -> Result<()> {
    let env = Env::new().await;
    let tenant = env.tenant.kubeconfig.clone();
    let configuration = || registration(&tenant);
    let sync = env.start("client").await?;
    eventually("the leader's registration", configuration).await;
    let out = kc(
        &tenant,
        &[
            "delete",
            "validatingwebhookconfiguration",
            &crproxy_sync::writethrough::configuration_name("client"),
        ],
        None,
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    assert!(configuration().is_none());
    let put_back = eventually("the registration put back", configuration).await;
    assert_eq!(
        put_back["webhooks"][0]["name"], "writethrough.gateways.example.net",
        "{put_back}"
    );
    sync.stop().await;
    Ok(())
}
