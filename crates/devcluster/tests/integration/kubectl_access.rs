//! devcluster with kubectl: server-side apply, schema validation, explain, RBAC,
//! client certificates, restart persistence and extra listeners.

use std::path::Path;
use std::time::Duration;
use test_support::{devcluster, kubectl_async, kubectl_json_async, kubectl_stdin_async};

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: crontabs.stable.example.io
spec:
  group: stable.example.io
  scope: Namespaced
  names: {plural: crontabs, singular: crontab, kind: CronTab, shortNames: [ct]}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            description: The desired schedule.
            required: [cronSpec]
            properties:
              cronSpec: {type: string, description: When to run.}
              replicas: {type: integer, minimum: 1, maximum: 10}
              image: {type: string}
"#;

async fn ok(kc: &Path, args: &[&str]) -> String {
    let out = kubectl_async(kc, args).await;
    assert!(out.success(), "kubectl {args:?}: {out:?}");
    out.stdout
}

async fn apply(kc: &Path, args: &[&str], yaml: &str) -> test_support::KubectlOutput {
    let mut all = vec!["apply", "-f", "-"];
    all.extend_from_slice(args);
    kubectl_stdin_async(kc, &all, yaml, Duration::from_secs(60)).await
}

async fn setup(kc: &Path) {
    ok(kc, &["create", "namespace", "demo"]).await;
    install_crontabs(kc).await;
}

/// Creates the CronTab CRD ([`CRD`], namespaced) and waits until it is established.
pub(crate) async fn install_crontabs(kc: &Path) {
    let out = apply(kc, &[], CRD).await;
    assert!(out.success(), "{out:?}");
    ok(
        kc,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=20s",
            "crd/crontabs.stable.example.io",
        ],
    )
    .await;
}

fn crontab(name: &str, replicas: i64, extra: &str) -> String {
    format!(
        "apiVersion: stable.example.io/v1\nkind: CronTab\nmetadata:\n  name: {name}\n  namespace: demo\nspec:\n  cronSpec: '* * * * */5'\n  replicas: {replicas}\n{extra}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_tracks_owners_and_conflicts() {
    let tc = devcluster("target").await;
    let kc = &tc.kubeconfig;
    setup(kc).await;
    let out = apply(
        kc,
        &["--server-side", "--field-manager=alpha"],
        &crontab("ssa", 2, ""),
    )
    .await;
    assert!(out.success(), "{out:?}");
    let out = apply(
        kc,
        &["--server-side", "--field-manager=beta"],
        &crontab("ssa", 3, ""),
    )
    .await;
    assert!(!out.success(), "conflicting apply must fail: {out:?}");
    assert!(out.stderr.contains("conflict"), "{}", out.stderr);
    let out = apply(
        kc,
        &["--server-side", "--field-manager=beta", "--force-conflicts"],
        &crontab("ssa", 3, ""),
    )
    .await;
    assert!(out.success(), "{out:?}");
    let obj = kubectl_json_async(
        kc,
        &[
            "-n",
            "demo",
            "get",
            "crontab",
            "ssa",
            "--show-managed-fields",
        ],
    )
    .await
    .expect("get");
    assert_eq!(obj["spec"]["replicas"], 3);
    let managers: Vec<&str> = obj["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert!(
        managers.contains(&"alpha") && managers.contains(&"beta"),
        "{managers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_violations_and_unknown_fields_are_refused() {
    let tc = devcluster("target").await;
    let kc = &tc.kubeconfig;
    setup(kc).await;
    let out = apply(kc, &[], &crontab("big", 11, "")).await;
    assert!(!out.success());
    assert!(
        out.stderr
            .contains("spec.replicas in body should be less than or equal to 10"),
        "{}",
        out.stderr
    );
    let out = apply(kc, &[], &crontab("colour", 1, "  colour: blue\n")).await;
    assert!(
        !out.success(),
        "strict validation refuses unknown fields: {out:?}"
    );
    assert!(
        out.stderr.contains("unknown field \"spec.colour\""),
        "{}",
        out.stderr
    );
    let out = apply(
        kc,
        &["--validate=false"],
        &crontab("colour", 1, "  colour: blue\n"),
    )
    .await;
    assert!(out.success(), "{out:?}");
    let obj = kubectl_json_async(kc, &["-n", "demo", "get", "crontab", "colour"])
        .await
        .expect("get");
    assert!(obj["spec"].get("colour").is_none(), "pruned: {obj}");
    let explain = ok(kc, &["explain", "crontab.spec"]).await;
    assert!(explain.contains("cronSpec"), "{explain}");
    // The swagger 2.0 document, which kubectl only reads as protobuf.
    let explain = ok(
        kc,
        &["explain", "crontab.spec", "--output=plaintext-openapiv2"],
    )
    .await;
    assert!(
        explain.contains("cronSpec") && explain.contains("replicas"),
        "{explain}"
    );
    // A group/version missing from /openapi/v3 sends kubectl's validation to the
    // protobuf /openapi/v2, then to the mapping error kube users know.
    let out = apply(
        kc,
        &[],
        &crontab("typo", 1, "").replace("stable.example.io/v1", "stable.example.io/v9"),
    )
    .await;
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr
            .contains("no matches for kind \"CronTab\" in version \"stable.example.io/v9\""),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_decides_what_users_may_do() {
    let tc = devcluster("target").await;
    let kc = &tc.kubeconfig;
    setup(kc).await;
    let alice = tc.kubeconfig_for("alice", &["developers"]).expect("alice");
    let out = kubectl_async(&alice, &["-n", "demo", "get", "crontabs"]).await;
    assert!(!out.success());
    assert!(
        out.stderr.contains("User \"alice\" cannot list resource \"crontabs\" in API group \"stable.example.io\" in the namespace \"demo\""),
        "{}",
        out.stderr
    );
    ok(
        kc,
        &[
            "-n",
            "demo",
            "create",
            "role",
            "reader",
            "--verb=get,list,watch",
            "--resource=crontabs.stable.example.io",
        ],
    )
    .await;
    ok(
        kc,
        &[
            "-n",
            "demo",
            "create",
            "rolebinding",
            "alice-reader",
            "--role=reader",
            "--user=alice",
        ],
    )
    .await;
    ok(&alice, &["-n", "demo", "get", "crontabs"]).await;
    let can = kubectl_async(
        &alice,
        &[
            "-n",
            "demo",
            "auth",
            "can-i",
            "delete",
            "crontabs.stable.example.io",
        ],
    )
    .await;
    assert_eq!(can.stdout.trim(), "no", "{can:?}");
    let whoami = ok(&alice, &["auth", "whoami", "-o", "json"]).await;
    assert!(whoami.contains("\"username\": \"alice\""), "{whoami}");

    // A client certificate names the user (CN) and groups (O).
    let carol = tc
        .kubeconfig_with_cert("carol", &["system:masters"])
        .expect("cert");
    let whoami = ok(&carol, &["auth", "whoami", "-o", "json"]).await;
    assert!(whoami.contains("\"username\": \"carol\""), "{whoami}");
    ok(&carol, &["get", "namespaces"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_survive_a_restart_and_listeners_share_the_store() {
    test_support::init_crypto();
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = devcluster::DevClusterConfig {
        name: "target".into(),
        data_dir: Some(dir.path().to_path_buf()),
        bind: "127.0.0.1".parse().expect("ip"),
        port: 0,
    };
    let first = devcluster::start(cfg.clone()).await.expect("start");
    let kc = dir.path().join("admin.kubeconfig");
    ok(&kc, &["create", "namespace", "keep"]).await;
    ok(
        &kc,
        &[
            "-n",
            "keep",
            "create",
            "configmap",
            "c1",
            "--from-literal=a=b",
        ],
    )
    .await;
    let rv_before = kubectl_json_async(&kc, &["-n", "keep", "get", "configmap", "c1"])
        .await
        .expect("get")["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .parse::<u64>()
        .expect("rv");
    let token = first.admin_token();
    first.shutdown().await;

    let second = devcluster::start(cfg).await.expect("restart");
    assert_eq!(second.admin_token(), token, "the token file is reused");
    let kc = dir.path().join("admin.kubeconfig");
    let cm = kubectl_json_async(&kc, &["-n", "keep", "get", "configmap", "c1"])
        .await
        .expect("configmap survives");
    assert_eq!(cm["data"]["a"], "b");
    ok(&kc, &["-n", "keep", "create", "configmap", "c2"]).await;
    let rv_after = kubectl_json_async(&kc, &["-n", "keep", "get", "configmap", "c2"])
        .await
        .expect("get")["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .parse::<u64>()
        .expect("rv");
    assert!(
        rv_after > rv_before,
        "resourceVersion keeps growing: {rv_before} -> {rv_after}"
    );

    // Another listener ("replica") serves the same objects until it is stopped.
    let addr = second.add_listener(0).await.expect("listener");
    let replica_kc = dir.path().join("replica.kubeconfig");
    std::fs::write(
        &replica_kc,
        second
            .admin_kubeconfig()
            .replace(&second.url(), &format!("https://{addr}")),
    )
    .expect("write");
    ok(&replica_kc, &["-n", "keep", "get", "configmap", "c2"]).await;
    second.stop_listener(addr).expect("stop");
    let out = kubectl_async(
        &replica_kc,
        &[
            "-n",
            "keep",
            "get",
            "configmap",
            "c2",
            "--request-timeout=5s",
        ],
    )
    .await;
    assert!(
        !out.success(),
        "a stopped listener refuses connections: {out:?}"
    );
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_subcommands_work_with_protobuf_bodies() {
    let tc = devcluster("target").await;
    let kc = &tc.kubeconfig;
    ok(kc, &["create", "namespace", "apps"]).await;
    ok(
        kc,
        &[
            "-n",
            "apps",
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=2",
            "--port=80",
        ],
    )
    .await;
    let d = kubectl_json_async(kc, &["-n", "apps", "get", "deployment", "web"])
        .await
        .expect("deployment");
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx"
    );
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"],
        80
    );
    ok(
        kc,
        &[
            "-n",
            "apps",
            "create",
            "service",
            "clusterip",
            "web",
            "--tcp=80:8080",
        ],
    )
    .await;
    let s = kubectl_json_async(kc, &["-n", "apps", "get", "service", "web"])
        .await
        .expect("service");
    assert_eq!(s["spec"]["ports"][0]["port"], 80);
    assert_eq!(s["spec"]["ports"][0]["targetPort"], 8080);
    assert_eq!(s["spec"]["ports"][0]["protocol"], "TCP");
    assert!(
        s["spec"]["clusterIP"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.96.")),
        "{s}"
    );
    ok(
        kc,
        &[
            "-n",
            "apps",
            "create",
            "secret",
            "generic",
            "s1",
            "--from-literal=k=v",
        ],
    )
    .await;
    let secret = kubectl_json_async(kc, &["-n", "apps", "get", "secret", "s1"])
        .await
        .expect("secret");
    assert_eq!(secret["data"]["k"], "dg==");
    assert_eq!(secret["type"], "Opaque");
    ok(kc, &["-n", "apps", "create", "serviceaccount", "robot"]).await;
    ok(
        kc,
        &["-n", "apps", "scale", "deployment", "web", "--replicas=3"],
    )
    .await;
    let d = kubectl_json_async(kc, &["-n", "apps", "get", "deployment", "web"])
        .await
        .expect("deployment");
    assert_eq!(d["spec"]["replicas"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_owner_collects_its_dependents_unless_orphaned() {
    let tc = devcluster("target").await;
    let kc = &tc.kubeconfig;
    ok(kc, &["create", "namespace", "gc"]).await;
    for owner in ["owner-a", "owner-b"] {
        ok(kc, &["-n", "gc", "create", "configmap", owner]).await;
        let uid = kubectl_json_async(kc, &["-n", "gc", "get", "configmap", owner])
            .await
            .expect("owner")["metadata"]["uid"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let dependent = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("{owner}-dep"), "namespace": "gc",
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner, "uid": uid}]},
        });
        let out = apply(kc, &[], &dependent.to_string()).await;
        assert!(out.success(), "{out:?}");
    }
    ok(kc, &["-n", "gc", "delete", "configmap", "owner-a"]).await;
    ok(
        kc,
        &[
            "-n",
            "gc",
            "wait",
            "--for=delete",
            "--timeout=10s",
            "configmap/owner-a-dep",
        ],
    )
    .await;

    ok(
        kc,
        &[
            "-n",
            "gc",
            "delete",
            "configmap",
            "owner-b",
            "--cascade=orphan",
        ],
    )
    .await;
    ok(
        kc,
        &[
            "-n",
            "gc",
            "wait",
            "--for=delete",
            "--timeout=10s",
            "configmap/owner-b",
        ],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let kept = kubectl_json_async(kc, &["-n", "gc", "get", "configmap", "owner-b-dep"])
        .await
        .expect("an orphaned dependent stays");
    assert_eq!(kept["metadata"]["name"], "owner-b-dep");
}
