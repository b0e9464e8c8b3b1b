//! `crproxy doctor` against a dev environment: all green when everything works,
//! then each piece broken on purpose, one at a time, and the doctor must name it
//! (its check fails, the JSON says so, the exit code is non-zero).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{json, Value};

use crproxy::devenv::{self, DevEnv, DevOptions, LinkSpec, ProxiedResource};
use crproxy_core::names;

/// What one run of the binary produced.
struct Run {
    success: bool,
    /// The exit code (`None`: killed by a signal).
    code: Option<i32>,
    report: Value,
    stderr: String,
}

impl Run {
    /// The `field` of the report's check `check` of `group_version`, "absent"
    /// when there is none.
    fn field_of(&self, group_version: &str, check: &str, field: &str) -> String {
        self.report["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["group_version"] == group_version && c["check"] == check)
            .and_then(|c| c[field].as_str())
            .unwrap_or("absent")
            .to_owned()
    }

    fn status_of(&self, group_version: &str, check: &str) -> String {
        self.field_of(group_version, check, "status")
    }

    fn evidence_of(&self, group_version: &str, check: &str) -> String {
        self.field_of(group_version, check, "evidence")
    }

    fn runbook_of(&self, group_version: &str, check: &str) -> String {
        self.field_of(group_version, check, "runbook")
    }

    fn not_ok(&self) -> Vec<String> {
        self.report["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["status"] != "ok")
            .map(|c| format!("{} {}: {}", c["group_version"], c["check"], c["evidence"]))
            .collect()
    }
}

/// Runs `crproxy doctor -o json` with the given inputs.
async fn doctor(kubeconfig: &Path, target: Option<&Path>, metrics: Option<&str>) -> Result<Run> {
    doctor_with(kubeconfig, target, metrics, &[]).await
}

/// [`doctor`] with more arguments.
async fn doctor_with(
    kubeconfig: &Path,
    target: Option<&Path>,
    metrics: Option<&str>,
    extra: &[&str],
) -> Result<Run> {
    let mut args: Vec<String> = vec![
        "doctor".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "-o".into(),
        "json".into(),
    ];
    if let Some(target) = target {
        args.extend(["--target-kubeconfig".into(), target.display().to_string()]);
    }
    if let Some(url) = metrics {
        args.extend(["--metrics-url".into(), url.to_owned()]);
    }
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_crproxy"))
            .args(&args)
            .env("CRPROXY_LOG", "error")
            .output()
    })
    .await??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: Value = serde_json::from_str(&stdout)
        .with_context(|| format!("doctor printed no JSON: {stdout}"))?;
    Ok(Run {
        success: output.status.success(),
        code: output.status.code(),
        report,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

/// A `gadgets` CRD in the example group on the target, waited for (at most 10 s)
/// until the target's discovery lists it.
async fn add_unproxied_gadgets(target_admin: &kube::Client) -> Result<()> {
    let group = devenv::EXAMPLE_GROUP;
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": format!("gadgets.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "versions": [{
                "name": devenv::EXAMPLE_VERSION, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))?;
    Api::<CustomResourceDefinition>::all(target_admin.clone())
        .create(&PostParams::default(), &crd)
        .await
        .context("creating the gadgets CRD")?;
    let path = format!("/apis/{}", gv());
    for _ in 0..100 {
        let request = http::Request::get(&path).body(Vec::new())?;
        let listed = target_admin
            .request::<Value>(request)
            .await
            .is_ok_and(|document| document.to_string().contains("\"gadgets\""));
        if listed {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the target never listed gadgets in {path}")
}

/// Four widget lists through the client cluster, each of which must fail: the
/// proxy dials its one peer, which does not answer, until it is quarantined
/// (3 failures). Not kubectl, nor a retrying client: they repeat every 503.
async fn quarantine_the_only_peer(client_kubeconfig: &Path) -> Result<()> {
    let admin = crproxy_kube::Kubeconfig::load(client_kubeconfig)?;
    let admin = crproxy_kube::ClusterConfig::from_kubeconfig(&admin, None)?;
    let once = crproxy_kube::kube_client_without_retries(&admin, admin.credentials()?, "default")?;
    for _ in 0..4 {
        let request = http::Request::get("/apis/example.com/v1/namespaces/default/widgets")
            .body(Vec::new())?;
        let failed = once.request::<Value>(request).await;
        assert!(
            failed.is_err(),
            "a request to an unanswering peer succeeded"
        );
    }
    Ok(())
}

fn gv() -> String {
    format!("{}/{}", devenv::EXAMPLE_GROUP, devenv::EXAMPLE_VERSION)
}

fn identity_kubeconfig(config_path: &Path) -> PathBuf {
    config_path
        .parent()
        .map(|d| d.join("target-identity.kubeconfig"))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_green_then_each_broken_piece_is_named() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut env = DevEnv::start(DevOptions::ephemeral(dir.path(), 1, 1)).await?;
    let client_kubeconfig = env.clients[0].kubeconfig.clone();
    let identity = identity_kubeconfig(&env.clients[0].link.config_path);
    let metrics = env.clients[0].metrics_url();
    let gv = gv();

    // Everything works: every check ok, exit 0, nothing skipped.
    let run = doctor(&client_kubeconfig, Some(&identity), Some(&metrics)).await?;
    assert!(run.success, "{}\n{:?}", run.stderr, run.not_ok());
    assert_eq!(run.report["status"], "ok", "{:?}", run.not_ok());
    assert!(run.not_ok().is_empty(), "{:?}", run.not_ok());
    assert_eq!(run.report["skipped"], json!([]));
    for check in [
        "apiservice",
        "service",
        "discovery",
        "protection-label",
        "target-credentials",
        "target-rbac",
        "peer-cache",
        "peers",
        "peer-list-age",
        "quarantines",
        "request-reasons",
        "request-deadline",
    ] {
        assert_eq!(run.status_of(&gv, check), "ok", "{check}");
    }
    assert_eq!(run.status_of("", "leader"), "ok");
    assert_eq!(run.status_of("", "protection"), "ok");

    // The text form carries the same verdict.
    let text = Command::new(env!("CARGO_BIN_EXE_crproxy"))
        .args(["doctor", "--kubeconfig"])
        .arg(&client_kubeconfig)
        .output()?;
    let text_out = String::from_utf8_lossy(&text.stdout);
    assert!(text.status.success());
    assert!(text_out.contains("verdict: ok"), "{text_out}");
    assert_eq!(run.report["verdict"], "healthy");
    assert!(text_out.contains("skip  metrics checks"), "{text_out}");

    // Target credentials: a token the target does not know.
    let mut bad: Value = serde_json::from_str(&std::fs::read_to_string(&identity)?)?;
    bad["users"][0]["user"] = json!({"token": "not-a-valid-token"});
    let bad_path = dir.path().join("bad-target.kubeconfig");
    std::fs::write(&bad_path, bad.to_string())?;
    let run = doctor(&client_kubeconfig, Some(&bad_path), None).await?;
    assert!(!run.success);
    assert!(run.stderr.contains("target-credentials"), "{}", run.stderr);
    assert_eq!(run.status_of(&gv, "target-credentials"), "fail");
    assert_eq!(run.status_of(&gv, "apiservice"), "ok");
    assert!(
        run.report["verdict"]
            .as_str()
            .unwrap_or_default()
            .contains("credentials"),
        "{}",
        run.report["verdict"]
    );

    // A second resource of the group, which the configuration does not enable and
    // the identity may not use: the proxy does not serve it, so the doctor does
    // not ask for rights on it.
    let target_admin = devenv::admin_client(&env.target)?;
    add_unproxied_gadgets(&target_admin).await?;
    let role = format!("crproxy-client-{}", devenv::EXAMPLE_GROUP.replace('.', "-"));
    let widgets_only: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": role},
        "rules": [
            {"apiGroups": [devenv::EXAMPLE_GROUP], "resources": ["widgets"], "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch", "create"]}
        ]
    }))?;
    Api::<ClusterRole>::all(target_admin.clone())
        .replace(&role, &PostParams::default(), &{
            let mut current = Api::<ClusterRole>::all(target_admin.clone())
                .get(&role)
                .await?;
            current.rules = widgets_only.rules;
            current
        })
        .await
        .context("narrowing the identity's role to widgets")?;
    let run = doctor(&client_kubeconfig, Some(&identity), None).await?;
    assert!(run.success, "{}\n{:?}", run.stderr, run.not_ok());
    assert_eq!(run.status_of(&gv, "target-rbac"), "ok");
    let evidence = run.evidence_of(&gv, "target-rbac");
    assert!(
        evidence.contains("widgets") && !evidence.contains("gadgets"),
        "{evidence}"
    );

    // Target RBAC: the identity's binding is gone.
    let binding = format!(
        "crproxy-client-example-com-{}",
        names::target_identity("p-default", "client").replace(':', "-")
    );
    Api::<ClusterRoleBinding>::all(target_admin)
        .delete(&binding, &DeleteParams::default())
        .await
        .context("deleting the identity's binding")?;
    let run = doctor(&client_kubeconfig, Some(&identity), None).await?;
    assert!(!run.success);
    assert_eq!(run.status_of(&gv, "target-credentials"), "ok");
    assert_eq!(run.status_of(&gv, "target-rbac"), "fail");

    // No leader: the wiring stops (the Lease is handed back) while the proxy
    // keeps serving, so nothing repairs what is broken next.
    let replica = env.clients[0].replica.take().context("replica")?;
    let devenv::ProxyReplica { proxy, wiring, .. } = replica;
    wiring.stop().await;
    let run = doctor(&client_kubeconfig, None, None).await?;
    assert!(!run.success);
    assert_eq!(run.status_of("", "leader"), "fail", "{:?}", run.not_ok());
    assert_eq!(run.status_of(&gv, "service"), "ok");

    // The protection policy gets a match condition that never holds: it still
    // exists and is bound, but protects nothing.
    let client_admin = devenv::admin_client(&env.clients[0].cluster)?;
    let policies = Api::<ValidatingAdmissionPolicy>::all(client_admin.clone());
    let mut policy = policies.get(names::POLICY_NAME).await?;
    if let Some(spec) = policy.spec.as_mut() {
        spec.match_conditions = Some(vec![MatchCondition {
            name: "never".into(),
            expression: "false".into(),
        }]);
    }
    policies
        .replace(names::POLICY_NAME, &PostParams::default(), &policy)
        .await
        .context("adding a never-true matchConditions entry to the policy")?;
    let run = doctor(&client_kubeconfig, None, None).await?;
    assert!(!run.success);
    assert_eq!(run.status_of("", "protection"), "fail");
    let evidence = run.evidence_of("", "protection");
    assert!(
        evidence.contains(&format!(
            "policy {} differs from the one crproxy installs",
            names::POLICY_NAME
        )) && !evidence.contains("binding"),
        "{evidence}"
    );

    // The binding selects one label more than the protected objects carry.
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client_admin.clone());
    let mut binding = bindings.get(names::POLICY_BINDING_NAME).await?;
    if let Some(labels) = binding
        .spec
        .as_mut()
        .and_then(|s| s.match_resources.as_mut())
        .and_then(|m| m.object_selector.as_mut())
        .and_then(|s| s.match_labels.as_mut())
    {
        labels.insert("nothing-has".into(), "this".into());
    }
    bindings
        .replace(names::POLICY_BINDING_NAME, &PostParams::default(), &binding)
        .await
        .context("adding a selector label to the binding")?;
    let run = doctor(&client_kubeconfig, None, None).await?;
    assert_eq!(run.status_of("", "protection"), "fail");
    let evidence = run.evidence_of("", "protection");
    assert!(
        evidence.contains(&format!(
            "binding {} differs from the one crproxy installs",
            names::POLICY_BINDING_NAME
        )),
        "{evidence}"
    );

    // The protection policy's binding is deleted.
    Api::<ValidatingAdmissionPolicyBinding>::all(client_admin.clone())
        .delete(names::POLICY_BINDING_NAME, &DeleteParams::default())
        .await?;
    let run = doctor(&client_kubeconfig, None, None).await?;
    assert_eq!(run.status_of("", "protection"), "fail");
    assert_eq!(run.status_of(&gv, "service"), "ok");

    // The Service is deleted (the runbook's way: label off, then delete).
    let services = Api::<Service>::namespaced(client_admin, names::SERVICE_NAMESPACE);
    let service = names::service_name(devenv::EXAMPLE_GROUP, devenv::EXAMPLE_VERSION);
    let mut live = services.get(&service).await?;
    if let Some(labels) = live.metadata.labels.as_mut() {
        labels.remove(names::PROTECTION_LABEL_KEY);
    }
    services
        .replace(&service, &PostParams::default(), &live)
        .await?;
    let run = doctor(&client_kubeconfig, None, None).await?;
    assert!(!run.success);
    assert_eq!(run.status_of(&gv, "protection-label"), "fail");
    assert_eq!(run.status_of(&gv, "service"), "ok");
    services.delete(&service, &DeleteParams::default()).await?;
    let run = doctor(&client_kubeconfig, None, None).await?;
    assert!(!run.success);
    assert_eq!(run.status_of(&gv, "service"), "fail", "{:?}", run.not_ok());
    let evidence = run.report["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["check"] == "service")
        .map(|c| c["evidence"].to_string())
        .unwrap_or_default();
    assert!(evidence.contains("does not exist"), "{evidence}");

    proxy.shutdown().await;
    env.shutdown().await;
    Ok(())
}

/// A proxy whose only peer never answers: after three failed dials the peer is
/// quarantined, and the doctor names the peers (and the fallback discovery).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_peers_are_named() -> Result<()> {
    test_support::init_crypto();
    let dir = tempfile::tempdir()?;
    let root = std::fs::canonicalize(dir.path())?;
    let target = test_support::devcluster("target").await;
    let client = test_support::devcluster("client").await;
    // A port that was free a moment ago: dials are refused at once.
    let dead = std::net::SocketAddr::from(([127, 0, 0, 1], devenv::free_port()?));
    let link = devenv::Link::prepare(LinkSpec {
        dir: root.join("client"),
        client_name: "client".into(),
        client_kubeconfig: client.kubeconfig.clone(),
        target_name: "target".into(),
        target: &target.cluster,
        target_peers: vec![dead],
        resources: vec![ProxiedResource::example()],
        proxy_port: 0,
        metrics_port: devenv::free_port()?,
    })
    .await?;
    let replica = link.start_replica().await?;
    let api = devenv::admin_client(&client.cluster)?;
    let apiservice = names::apiservice_name(devenv::EXAMPLE_GROUP, devenv::EXAMPLE_VERSION);
    // Discovery falls back locally, so the APIService still turns Available.
    devenv::wait_for_available(&api, &apiservice, Duration::from_secs(30)).await?;
    // Requests dial the dead peer until it is quarantined (3 failures).
    quarantine_the_only_peer(&client.kubeconfig).await?;
    let identity = identity_kubeconfig(&link.config_path);
    let run = doctor(
        &client.kubeconfig,
        Some(&identity),
        Some(&replica.metrics_url),
    )
    .await?;
    let gv = gv();
    assert!(!run.success);
    assert_eq!(run.status_of(&gv, "peers"), "fail", "{:?}", run.not_ok());
    assert!(
        run.report["verdict"]
            .as_str()
            .unwrap_or_default()
            .starts_with("proxy-path degradation"),
        "{}",
        run.report["verdict"]
    );
    assert_eq!(run.status_of(&gv, "quarantines"), "warn");
    assert_eq!(run.status_of(&gv, "request-reasons"), "warn");
    // No peer left: the runbook step is the quarantine's.
    let evidence = run.evidence_of(&gv, "request-reasons");
    assert!(evidence.contains("all_quarantined="), "{evidence}");
    assert_eq!(
        run.runbook_of(&gv, "request-reasons"),
        "all_quarantined: every peer failed 3 dials; see the peers check"
    );
    assert_eq!(run.status_of(&gv, "discovery"), "warn");
    // The target itself is fine: the doctor does not blame it.
    assert_eq!(run.status_of(&gv, "target-credentials"), "ok");
    assert_eq!(run.status_of(&gv, "peer-cache"), "ok");
    replica.stop().await;
    Ok(())
}

/// The verdict table's first row: the target is down. Its API server stops
/// listening (dials are refused), so the doctor cannot reach it with the proxy's
/// credentials and the proxy's peers are quarantined too; whatever the metrics
/// say, the verdict is the target's, with the runbook step for an unreachable
/// server rather than for rejected credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_target_is_the_target_down_verdict() -> Result<()> {
    const TARGET_DOWN: &str =
        "the target is down or refuses the proxy's credentials: fix the target or the Secret";
    let dir = tempfile::tempdir()?;
    let env = DevEnv::start(DevOptions::ephemeral(dir.path(), 1, 1)).await?;
    let client_kubeconfig = env.clients[0].kubeconfig.clone();
    let identity = identity_kubeconfig(&env.clients[0].link.config_path);
    let metrics = env.clients[0].metrics_url();
    let gv = gv();
    env.target.stop_listener(env.target_replicas[0])?;
    // Requests dial the stopped target until its only peer is quarantined (3
    // failures), so the metrics show proxy-path degradation as well.
    quarantine_the_only_peer(&client_kubeconfig).await?;

    let run = doctor(&client_kubeconfig, Some(&identity), Some(&metrics)).await?;
    assert_eq!(run.code, Some(1), "{}\n{:?}", run.stderr, run.not_ok());
    assert_eq!(run.report["status"], "fail");
    assert_eq!(run.report["verdict"], TARGET_DOWN, "{:?}", run.not_ok());
    assert_eq!(run.status_of(&gv, "target-credentials"), "fail");
    assert_eq!(
        run.runbook_of(&gv, "target-credentials"),
        "the target's API server is unreachable with these credentials: check the server URL \
         and CA in the crproxy-target-kubeconfig Secret and the network"
    );
    assert!(
        run.stderr.contains(&format!("{gv} target-credentials")),
        "{}",
        run.stderr
    );
    // The other column of the row: the peers are gone as well, and discovery is
    // the fallback; the registration is fine.
    assert_eq!(run.status_of(&gv, "peers"), "fail", "{:?}", run.not_ok());
    assert_eq!(run.status_of(&gv, "discovery"), "warn");
    assert_eq!(run.status_of(&gv, "apiservice"), "ok");
    assert_eq!(run.status_of(&gv, "peer-cache"), "ok");

    // The text form ends with the same verdict. (Off the runtime: the clusters
    // and the proxy it asks run on it.)
    let text = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_crproxy"))
            .args(["doctor", "--kubeconfig"])
            .arg(&client_kubeconfig)
            .arg("--target-kubeconfig")
            .arg(&identity)
            .args(["--metrics-url", &metrics])
            .env("CRPROXY_LOG", "error")
            .output()
    })
    .await??;
    let text_out = String::from_utf8_lossy(&text.stdout);
    assert_eq!(text.status.code(), Some(1), "{text_out}");
    let verdict = text_out
        .lines()
        .find(|l| l.starts_with("verdict: "))
        .unwrap_or_default();
    assert!(
        verdict.starts_with("verdict: fail (")
            && verdict.ends_with(&format!(" failed): {TARGET_DOWN}")),
        "{text_out}"
    );
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_metrics_url_fails_and_a_bare_cluster_has_nothing_registered() -> Result<()>
{
    let cluster = test_support::devcluster("bare").await;
    let unused = format!("http://127.0.0.1:{}/metrics", devenv::free_port()?);
    let run = doctor(&cluster.kubeconfig, None, Some(&unused)).await?;
    assert!(!run.success);
    assert_eq!(run.report["status"], "fail");
    assert_eq!(run.status_of("", "apiservice"), "fail");
    assert_eq!(run.status_of("", "metrics"), "fail");
    assert_eq!(run.status_of("", "leader"), "fail");
    assert_eq!(run.status_of("", "protection"), "fail");
    Ok(())
}

/// The client's sync elects its leader on a Lease of its own, which sorts before the
/// registration Lease here (`crproxy-sync-zeta` < `crproxy-zeta`): the leader check
/// reports the registration Lease's holder, with the client's name and without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_is_the_registration_lease_not_the_sync_lease() -> Result<()> {
    let cluster = test_support::devcluster("client").await;
    let leases = Api::<Lease>::namespaced(devenv::admin_client(&cluster.cluster)?, "kube-system");
    let sync_lease = names::sync_lease_name("zeta");
    let registration_lease = names::registration_lease_name("zeta");
    assert!(sync_lease < registration_lease);
    for (name, holder) in [
        (&sync_lease, "zeta-sync-replica_1"),
        (&registration_lease, "zeta-proxy-replica_2"),
    ] {
        leases
            .create(&PostParams::default(), &renewed_lease(name, holder))
            .await?;
    }
    for extra in [&["--client-name", "zeta"][..], &[]] {
        let run = doctor_with(&cluster.kubeconfig, None, None, extra).await?;
        assert_eq!(
            run.status_of("", "leader"),
            "ok",
            "{extra:?}: {:?}",
            run.not_ok()
        );
        let evidence = run.evidence_of("", "leader");
        assert!(
            evidence.starts_with(&format!(
                "Lease kube-system/{registration_lease} held by zeta-proxy-replica_2"
            )),
            "{extra:?}: {evidence}"
        );
    }
    // Only the sync's Lease: no leader, whichever way the doctor looks.
    leases
        .delete(&registration_lease, &DeleteParams::default())
        .await?;
    for extra in [&["--client-name", "zeta"][..], &[]] {
        let run = doctor_with(&cluster.kubeconfig, None, None, extra).await?;
        assert_eq!(run.status_of("", "leader"), "fail", "{extra:?}");
        let evidence = run.evidence_of("", "leader");
        assert!(!evidence.contains(&sync_lease), "{extra:?}: {evidence}");
    }
    Ok(())
}

/// A renamed client leaves its old registration Lease behind: without the client's
/// name the doctor cannot tell which Lease is current, so it fails naming both and
/// asks for `--client-name`, which then picks the right one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_registration_leases_need_the_client_name() -> Result<()> {
    let cluster = test_support::devcluster("client").await;
    let leases = Api::<Lease>::namespaced(devenv::admin_client(&cluster.cluster)?, "kube-system");
    let stale_lease = names::registration_lease_name("old-zeta");
    let registration_lease = names::registration_lease_name("zeta");
    for (name, holder) in [
        (&names::sync_lease_name("zeta"), "zeta-sync-replica_1"),
        (&stale_lease, "old-zeta-proxy-replica_1"),
        (&registration_lease, "zeta-proxy-replica_2"),
    ] {
        leases
            .create(&PostParams::default(), &renewed_lease(name, holder))
            .await?;
    }

    let run = doctor_with(&cluster.kubeconfig, None, None, &[]).await?;
    assert_eq!(run.status_of("", "leader"), "fail");
    let evidence = run.evidence_of("", "leader");
    for name in [&stale_lease, &registration_lease] {
        assert!(evidence.contains(name.as_str()), "{name}: {evidence}");
    }
    assert!(!evidence.contains("crproxy-sync-"), "{evidence}");
    let runbook = run.report["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["group_version"] == "" && c["check"] == "leader")
        .and_then(|c| c["runbook"].as_str())
        .unwrap_or_default();
    assert!(runbook.contains("--client-name"), "{runbook}");

    let run = doctor_with(&cluster.kubeconfig, None, None, &["--client-name", "zeta"]).await?;
    assert_eq!(run.status_of("", "leader"), "ok", "{:?}", run.not_ok());
    let evidence = run.evidence_of("", "leader");
    assert!(
        evidence.starts_with(&format!(
            "Lease kube-system/{registration_lease} held by zeta-proxy-replica_2"
        )),
        "{evidence}"
    );
    Ok(())
}

/// A Lease named `name`, held by `holder` and renewed just now.
fn renewed_lease(name: &str, holder: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    }
}

/// `--target-kubeconfig` with no proxied group/version in the client cluster:
/// the target is still asked whether it accepts the credentials (one
/// `target-credentials` check), and the per-group/version checks are named as
/// skipped, with why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_kubeconfig_is_checked_even_with_nothing_registered() -> Result<()> {
    let client = test_support::devcluster("bare").await;
    let target = test_support::devcluster("target").await;
    let skipped = |run: &Run| -> Vec<String> {
        run.report["skipped"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };

    let identity = target.kubeconfig_for("loft:vcluster:p-default:client", &[])?;
    let run = doctor(&client.kubeconfig, Some(&identity), None).await?;
    assert_eq!(run.status_of("", "apiservice"), "fail");
    assert_eq!(
        run.status_of("", "target-credentials"),
        "ok",
        "{:?}",
        run.not_ok()
    );
    assert!(
        run.evidence_of("", "target-credentials")
            .ends_with("as loft:vcluster:p-default:client"),
        "{}",
        run.evidence_of("", "target-credentials")
    );
    assert!(
        skipped(&run)
            .iter()
            .any(|s| s.contains("no proxied group/version found")),
        "{:?}",
        skipped(&run)
    );

    // Credentials the target does not know, and a target that is not there.
    let unknown = target.dir.path().join("unknown.kubeconfig");
    std::fs::write(
        &unknown,
        target.cluster.kubeconfig("nobody", "not-a-token-it-issued"),
    )?;
    let refused = test_support::RefusedPort::bind();
    let away = target.kubeconfig_at(refused.addr)?;
    for kubeconfig in [&unknown, &away] {
        let run = doctor(&client.kubeconfig, Some(kubeconfig), None).await?;
        assert!(!run.success);
        assert_eq!(
            run.status_of("", "target-credentials"),
            "fail",
            "{}: {}",
            kubeconfig.display(),
            run.stderr
        );
    }
    Ok(())
}
