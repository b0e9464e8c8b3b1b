//! devcluster driven by the real kubectl.

use serde_json::{json, Value};
use std::time::Duration;
use test_support::{devcluster, kubectl_async, kubectl_json_async, kubectl_stdin_async};

const CRONTAB_CRD: &str = r#"
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
            properties:
              cronSpec: {type: string}
              replicas: {type: integer, minimum: 1, maximum: 10}
              image: {type: string}
          status:
            type: object
            properties:
              replicas: {type: integer}
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}
    additionalPrinterColumns:
    - {name: Spec, type: string, jsonPath: .spec.cronSpec}
"#;

fn crontab(name: &str, app: &str) -> String {
    format!(
        "apiVersion: stable.example.io/v1\nkind: CronTab\nmetadata:\n  name: {name}\n  namespace: demo\n  labels:\n    app: {app}\nspec:\n  cronSpec: '* * * * */5'\n  image: img\n  replicas: 1\n"
    )
}

async fn ok(kc: &std::path::Path, args: &[&str]) -> String {
    let out = kubectl_async(kc, args).await;
    assert!(out.success(), "kubectl {args:?}: {out:?}");
    out.stdout
}

/// `kubectl <flags> -n demo patch crontab one --type=merge -p <patch>`.
async fn merge_patch_one(
    kc: &std::path::Path,
    flags: &[&str],
    patch: &str,
) -> test_support::KubectlOutput {
    let patch_one = [
        "-n",
        "demo",
        "patch",
        "crontab",
        "one",
        "--type=merge",
        "-p",
        patch,
    ];
    kubectl_async(kc, &[flags, &patch_one[..]].concat()).await
}

async fn apply(kc: &std::path::Path, yaml: &str) {
    let out = kubectl_stdin_async(kc, &["apply", "-f", "-"], yaml, Duration::from_secs(60)).await;
    assert!(out.success(), "apply: {out:?}");
}

/// A target devcluster with the namespace `demo` and the CronTab CRD established.
async fn crontab_cluster() -> test_support::TestCluster {
    let tc = devcluster("target").await;
    ok(&tc.kubeconfig, &["create", "namespace", "demo"]).await;
    install_crd(&tc.kubeconfig).await;
    tc
}

async fn install_crd(kc: &std::path::Path) {
    apply(kc, CRONTAB_CRD).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_with_kubectl() {
    let tc = crontab_cluster().await;
    let kc = &tc.kubeconfig;

    apply(kc, &crontab("one", "cron")).await;
    apply(kc, &crontab("two", "other")).await;

    let got = kubectl_json_async(kc, &["-n", "demo", "get", "crontab", "one"])
        .await
        .expect("get");
    assert_eq!(got["spec"]["image"], "img");
    assert_eq!(got["metadata"]["generation"], 1);

    let listed = kubectl_json_async(kc, &["-n", "demo", "get", "ct", "-l", "app=cron"])
        .await
        .expect("list");
    let names: Vec<&str> = listed["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, vec!["one"]);

    // The default (Table) output shows the printer column.
    let table = ok(kc, &["-n", "demo", "get", "crontabs"]).await;
    assert!(table.contains("SPEC"), "{table}");
    assert!(table.contains("one") && table.contains("two"), "{table}");

    let yaml = ok(kc, &["-n", "demo", "get", "crontab", "one", "-o", "yaml"]).await;
    assert!(yaml.contains("kind: CronTab"), "{yaml}");

    let patched = merge_patch_one(kc, &[], r#"{"spec":{"replicas":3}}"#).await;
    assert!(patched.success(), "{patched:?}");
    ok(
        kc,
        &[
            "-n",
            "demo",
            "patch",
            "crontab",
            "one",
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/spec/image","value":"img2"}]"#,
        ],
    )
    .await;
    ok(
        kc,
        &["-n", "demo", "label", "crontab", "one", "tier=backend"],
    )
    .await;
    let got = kubectl_json_async(kc, &["-n", "demo", "get", "crontab", "one"])
        .await
        .expect("get");
    assert_eq!(got["spec"]["replicas"], 3);
    assert_eq!(got["spec"]["image"], "img2");
    assert_eq!(got["metadata"]["labels"]["tier"], "backend");
    assert_eq!(
        got["metadata"]["generation"], 3,
        "labels do not bump generation"
    );

    // replace with the current object works; with a stale resourceVersion it conflicts.
    let mut stale = got.clone();
    stale["spec"]["replicas"] = json!(4);
    let out = kubectl_stdin_async(
        kc,
        &["replace", "-f", "-"],
        &stale.to_string(),
        Duration::from_secs(60),
    )
    .await;
    assert!(out.success(), "replace: {out:?}");
    let out = kubectl_stdin_async(
        kc,
        &["replace", "-f", "-"],
        &stale.to_string(),
        Duration::from_secs(60),
    )
    .await;
    assert!(!out.success());
    assert!(
        out.stderr.contains("the object has been modified"),
        "{}",
        out.stderr
    );

    // scale subresource
    ok(
        kc,
        &["-n", "demo", "scale", "crontab", "one", "--replicas=5"],
    )
    .await;
    let got = kubectl_json_async(kc, &["-n", "demo", "get", "crontab", "one"])
        .await
        .expect("get");
    assert_eq!(got["spec"]["replicas"], 5);

    ok(kc, &["-n", "demo", "delete", "crontab", "one"]).await;
    ok(
        kc,
        &["-n", "demo", "delete", "crontab", "two", "--wait=false"],
    )
    .await;
    ok(
        kc,
        &[
            "-n",
            "demo",
            "wait",
            "--for=delete",
            "--timeout=10s",
            "crontab/two",
        ],
    )
    .await;
    let out = kubectl_async(kc, &["-n", "demo", "get", "crontab", "one"]).await;
    assert!(!out.success());
    assert!(out.stderr.contains("not found"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_sees_added_modified_deleted() {
    let tc = crontab_cluster().await;
    let kc = tc.kubeconfig.clone();
    let watcher = {
        let kc = kc.clone();
        tokio::task::spawn_blocking(move || {
            test_support::kubectl_with_timeout(
                &kc,
                &[
                    "-n",
                    "demo",
                    "get",
                    "crontabs",
                    "-w",
                    "--output-watch-events",
                    "-o",
                    "json",
                ],
                // Long enough for the writes below even on a loaded machine.
                Duration::from_secs(12),
            )
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    apply(&kc, &crontab("w", "cron")).await;
    ok(&kc, &["-n", "demo", "label", "crontab", "w", "x=y"]).await;
    ok(&kc, &["-n", "demo", "delete", "crontab", "w"]).await;
    let out = watcher.await.expect("watcher");
    let types: Vec<String> = serde_json::Deserializer::from_str(&out.stdout)
        .into_iter::<Value>()
        .filter_map(Result::ok)
        .filter_map(|v| v["type"].as_str().map(str::to_string))
        .collect();
    assert_eq!(types, vec!["ADDED", "MODIFIED", "DELETED"], "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_resources_and_namespace_deletion() {
    let tc = devcluster("target").await;
    let kc = &tc.kubeconfig;
    install_crd(kc).await;
    let out = ok(kc, &["api-resources"]).await;
    assert!(out.contains("crontabs"), "{out}");
    assert!(out.contains("leases"), "{out}");
    ok(kc, &["create", "namespace", "doomed"]).await;
    ok(
        kc,
        &[
            "-n",
            "doomed",
            "create",
            "configmap",
            "c1",
            "--from-literal=a=b",
        ],
    )
    .await;
    ok(kc, &["delete", "namespace", "doomed", "--timeout=20s"]).await;
    let out = kubectl_async(kc, &["get", "namespace", "doomed"]).await;
    assert!(out.stderr.contains("not found"), "{out:?}");
    let out = kubectl_async(kc, &["delete", "namespace", "default"]).await;
    assert!(
        out.stderr.contains("this namespace may not be deleted"),
        "{out:?}"
    );
    let out = kubectl_async(kc, &["-n", "nowhere", "create", "configmap", "c1"]).await;
    assert!(
        out.stderr.contains("namespaces \"nowhere\" not found"),
        "{out:?}"
    );
}

/// Gives namespace `name` a finalizer of someone else's (`example.com/hold`),
/// then deletes it without waiting.
async fn delete_held(kc: &std::path::Path, name: &str) {
    let hold = r#"{"metadata":{"finalizers":["example.com/hold"]}}"#;
    ok(
        kc,
        &["patch", "namespace", name, "--type=merge", "-p", hold],
    )
    .await;
    ok(kc, &["delete", "namespace", name, "--wait=false"]).await;
}

/// A namespace whose metadata carries a finalizer of someone else's stays
/// Terminating once its content is gone, its own `kubernetes` finalizer removed,
/// until that finalizer is removed too; as on kube, where the namespace
/// controller finalizes it and storage keeps it for its metadata finalizers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_held_by_a_metadata_finalizer_stays_terminating() {
    let tc = devcluster("target").await;
    let kc = &tc.kubeconfig;
    ok(kc, &["create", "namespace", "held"]).await;
    ok(kc, &["-n", "held", "create", "configmap", "c1"]).await;
    delete_held(kc, "held").await;
    // The content goes (bounded: 10 s).
    let emptied = crate::poll(crate::Polling::USUAL, move || async move {
        let out = kubectl_async(kc, &["-n", "held", "get", "configmap", "c1"]).await;
        out.stderr.contains("not found").then_some(())
    })
    .await;
    assert!(
        emptied.is_some(),
        "the namespace's content was never removed"
    );
    // Past the controller's last pass, the namespace is still there, finalized.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let ns = kubectl_json_async(kc, &["get", "namespace", "held", "-o", "json"])
        .await
        .expect("the namespace is still there");
    assert_eq!(ns["status"]["phase"], "Terminating", "{ns}");
    assert_eq!(
        ns["metadata"]["finalizers"],
        json!(["example.com/hold"]),
        "{ns}"
    );
    assert!(
        ns["spec"].get("finalizers").is_none(),
        "not finalized: {ns}"
    );
    // Deleting it again changes nothing: it is not finalized a second time.
    ok(kc, &["delete", "namespace", "held", "--wait=false"]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = kubectl_json_async(kc, &["get", "namespace", "held", "-o", "json"])
        .await
        .expect("the namespace is still there");
    assert_eq!(
        again["metadata"]["resourceVersion"], ns["metadata"]["resourceVersion"],
        "written again: {again}"
    );
    // Its last finalizer's removal removes it.
    let release = r#"{"metadata":{"finalizers":null}}"#;
    ok(
        kc,
        &["patch", "namespace", "held", "--type=merge", "-p", release],
    )
    .await;
    let out = kubectl_async(kc, &["get", "namespace", "held"]).await;
    assert!(out.stderr.contains("not found"), "{out:?}");
}

/// Removing a namespace's metadata finalizers does not remove it while its own
/// finalizer (`kubernetes`) is still there, as kube's
/// ShouldDeleteNamespaceDuringUpdate has it: its content is removed first. An
/// update cannot remove that one (only /finalize does), nor can a foreground
/// deletion's garbage collection skip it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinalized_namespace_outlives_its_metadata_finalizers() {
    let tc = devcluster("target").await;
    tc.cluster.stop_namespace_controller();
    let kc = &tc.kubeconfig;
    ok(kc, &["create", "namespace", "held"]).await;
    delete_held(kc, "held").await;
    let release = r#"{"metadata":{"finalizers":null},"spec":{"finalizers":[]}}"#;
    ok(
        kc,
        &["patch", "namespace", "held", "--type=merge", "-p", release],
    )
    .await;
    let ns = kubectl_json_async(kc, &["get", "namespace", "held", "-o", "json"])
        .await
        .expect("the namespace is still there");
    assert_eq!(ns["status"]["phase"], "Terminating", "{ns}");
    assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]), "{ns}");
    // Past the foreground deletion's garbage collection (50 ms after it).
    ok(kc, &["create", "namespace", "cascaded"]).await;
    ok(
        kc,
        &[
            "delete",
            "namespace",
            "cascaded",
            "--cascade=foreground",
            "--wait=false",
        ],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ns = kubectl_json_async(kc, &["get", "namespace", "cascaded", "-o", "json"])
        .await
        .expect("the namespace is still there");
    assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]), "{ns}");
}

/// The last response body kubectl logged (`-v=9` prints each one whole, quoted).
fn logged_status(stderr: &str) -> Value {
    let quoted = stderr
        .lines()
        .filter_map(|l| l.split_once("\"Response Body\" body=").map(|(_, b)| b))
        .next_back()
        .unwrap_or_else(|| panic!("no response body logged: {stderr}"));
    let body: String =
        serde_json::from_str(quoted.trim()).unwrap_or_else(|e| panic!("{e}: {quoted}"));
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// metadata.uid cannot change: a merge patch or server-side apply that sets another
/// uid is refused as kube-apiserver 1.32 refuses it (`ValidateObjectMetaUpdate`:
/// 422 "field is immutable"), and a PUT carrying another uid fails its uid
/// precondition (409). The expected bodies are kube's, field for field; the
/// crproxy owned mode relies on this to pin a write to the object it checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_uid_is_immutable_as_on_kube() {
    let tc = crontab_cluster().await;
    let kc = &tc.kubeconfig;
    apply(kc, &crontab("one", "cron")).await;
    let before = kubectl_json_async(kc, &["-n", "demo", "get", "crontab", "one", "-o", "json"])
        .await
        .expect("get");
    let uid = before["metadata"]["uid"].as_str().expect("uid").to_string();
    let other = "00000000-0000-0000-0000-000000000000";

    let patch = format!(r#"{{"metadata":{{"uid":"{other}"}}}}"#);
    let out = merge_patch_one(kc, &["-v=9"], &patch).await;
    assert!(!out.success(), "{out:?}");
    let invalid = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("CronTab.stable.example.io \"one\" is invalid: metadata.uid: Invalid value: \"{other}\": field is immutable"),
        "reason": "Invalid",
        "details": {"name": "one", "group": "stable.example.io", "kind": "CronTab", "causes": [
            {"reason": "FieldValueInvalid", "message": format!("Invalid value: \"{other}\": field is immutable"), "field": "metadata.uid"}
        ]},
        "code": 422,
    });
    assert_eq!(logged_status(&out.stderr), invalid);

    let applied = format!(
        "apiVersion: stable.example.io/v1\nkind: CronTab\nmetadata:\n  name: one\n  namespace: demo\n  uid: {other}\nspec:\n  replicas: 2\n"
    );
    let out = kubectl_stdin_async(
        kc,
        &[
            "-v=9",
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
        ],
        &applied,
        Duration::from_secs(60),
    )
    .await;
    assert!(!out.success(), "{out:?}");
    assert_eq!(logged_status(&out.stderr), invalid);

    let mut replaced = before.clone();
    replaced["metadata"]["uid"] = json!(other);
    let out = kubectl_stdin_async(
        kc,
        &["-v=9", "replace", "-f", "-"],
        &replaced.to_string(),
        Duration::from_secs(60),
    )
    .await;
    assert!(!out.success(), "{out:?}");
    assert_eq!(
        logged_status(&out.stderr),
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("Operation cannot be fulfilled on crontabs.stable.example.io \"one\": StorageError: invalid object, Code: 4, Key: /registry/stable.example.io/crontabs/demo/one, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: {other}, UID in object meta: {uid}"),
            "reason": "Conflict",
            "details": {"name": "one", "group": "stable.example.io", "kind": "crontabs"},
            "code": 409,
        })
    );

    let after = kubectl_json_async(kc, &["-n", "demo", "get", "crontab", "one", "-o", "json"])
        .await
        .expect("get");
    assert_eq!(after["metadata"]["uid"], json!(uid));
    assert_eq!(after["spec"], before["spec"]);
}

/// Delete options come from the body, or from the query when the body is empty,
/// as kube-apiserver reads them: both kinds of dry run leave the object, a
/// dry-run value kube does not know is refused, and a query's uid or
/// resourceVersion is a precondition; of a parameter given twice, the first
/// value counts, as in Go's `url.Values.Get`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_options_from_the_body_and_from_the_query() {
    let tc = crontab_cluster().await;
    let kc = &tc.kubeconfig;
    apply(kc, &crontab("kept", "cron")).await;
    let path = "/apis/stable.example.io/v1/namespaces/demo/crontabs/kept";
    // kubectl sends DeleteOptions with dryRun in the body.
    ok(
        kc,
        &[
            "-n",
            "demo",
            "delete",
            "crontab",
            "kept",
            "--dry-run=server",
        ],
    )
    .await;
    // A raw delete sends no body: the query's dryRun counts.
    ok(kc, &["delete", "--raw", &format!("{path}?dryRun=All")]).await;
    let refused = kubectl_async(kc, &["delete", "--raw", &format!("{path}?dryRun=Maybe")]).await;
    assert!(!refused.success(), "{refused:?}");
    assert!(
        refused
            .stderr
            .contains(r#"dryRun: Unsupported value: []string{"Maybe"}: supported values: "All""#),
        "{refused:?}"
    );
    let got = kubectl_json_async(kc, &["-n", "demo", "get", "crontab", "kept"]).await;
    assert!(got.is_ok(), "a dry run deleted the object: {got:?}");
    let got = got.expect("kept");
    let uid = got["metadata"]["uid"].as_str().expect("uid");
    let other_uid = "00000000-0000-0000-0000-000000000000";
    for stale in [
        "resourceVersion=1".to_owned(),
        format!("uid={other_uid}"),
        format!("uid={other_uid}&uid={uid}"),
    ] {
        let out = kubectl_async(kc, &["-v=9", "delete", "--raw", &format!("{path}?{stale}")]).await;
        assert!(!out.success(), "{stale}: {out:?}");
        assert_eq!(logged_status(&out.stderr)["code"], 409, "{stale}: {out:?}");
    }
    let current = format!("{path}?resourceVersion=&uid={uid}&uid={other_uid}&resourceVersion=1");
    let got = kubectl_json_async(kc, &["-n", "demo", "get", "crontab", "kept"]).await;
    assert!(
        got.is_ok(),
        "a failed precondition deleted the object: {got:?}"
    );
    ok(kc, &["delete", "--raw", &current]).await;
    let gone = kubectl_async(kc, &["-n", "demo", "get", "crontab", "kept"]).await;
    assert!(!gone.success(), "{gone:?}");
}

/// Labels and annotations must be maps of strings on a custom resource, as
/// kube-apiserver 1.32 reads them (apiextensions-apiserver decodes `metadata` into
/// an ObjectMeta): a create or update whose body does not decode is a 400, a merge
/// or JSON patch whose result does not decode a 422 on `patch`, and a server-side
/// apply fails its typed conversion with a 500. Nothing is written; a null value
/// is stored as "".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_maps_of_the_wrong_type_are_refused_as_on_kube() {
    let tc = crontab_cluster().await;
    let kc = &tc.kubeconfig;
    apply(kc, &crontab("one", "cron")).await;
    // The whole object, managedFields too: a refused patch shows all of it.
    let get = || {
        kubectl_json_async(
            kc,
            &[
                "-n",
                "demo",
                "get",
                "crontab",
                "one",
                "-o",
                "json",
                "--show-managed-fields",
            ],
        )
    };
    let before = get().await.expect("get");
    let collection = "/apis/stable.example.io/v1/namespaces/demo/crontabs";
    let undecodable = |what: &str| {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("CronTab in version \"v1\" cannot be handled as a CronTab: json: cannot unmarshal {what}"),
            "reason": "BadRequest", "code": 400})
    };
    let refused = |out: test_support::KubectlOutput| {
        assert!(!out.success(), "{out:?}");
        logged_status(&out.stderr)
    };

    // Create and update: the body does not decode.
    let body = tc.dir.path().join("body.json");
    let new = |labels: Value| {
        json!({"apiVersion": "stable.example.io/v1", "kind": "CronTab",
            "metadata": {"name": "bad", "labels": labels}, "spec": {"cronSpec": "* * * * */5"}})
    };
    let mut replaced = before.clone();
    replaced["metadata"]["labels"] = json!(["app", "cron"]);
    replaced["metadata"]["annotations"] = json!({"note": true});
    let one = format!("{collection}/one");
    let writes = [
        (
            "create",
            collection,
            new(json!("x")),
            "string into Go struct field ObjectMeta.labels of type map[string]string",
        ),
        (
            "create",
            collection,
            new(json!({"app": 1})),
            "number into Go struct field ObjectMeta.labels of type string",
        ),
        // Annotations first: Go marshals metadata with sorted keys before decoding.
        (
            "replace",
            one.as_str(),
            replaced,
            "bool into Go struct field ObjectMeta.annotations of type string",
        ),
    ];
    for (verb, path, object, what) in writes {
        std::fs::write(&body, object.to_string()).expect("body");
        let file = body.to_string_lossy();
        let out = kubectl_async(kc, &["-v=9", verb, "--raw", path, "-f", &file]).await;
        assert_eq!(refused(out), undecodable(what), "{verb} {object}");
    }

    // Merge and JSON patches: the patched object does not decode.
    let patches = [
        (
            "merge",
            r#"{"metadata":{"labels":"x"}}"#,
            json!("x"),
            "string into Go struct field ObjectMeta.labels of type map[string]string",
        ),
        (
            "json",
            r#"[{"op":"add","path":"/metadata/labels/n","value":5}]"#,
            json!({"app": "cron", "n": 5}),
            "number into Go struct field ObjectMeta.labels of type string",
        ),
    ];
    for (kind, patch, labels, what) in patches {
        let out = kubectl_async(
            kc,
            &[
                "-v=9",
                "-n",
                "demo",
                "patch",
                "crontab",
                "one",
                &format!("--type={kind}"),
                "-p",
                patch,
            ],
        )
        .await;
        let got = refused(out);
        let cause = got["details"]["causes"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let suffix = format!(": json: cannot unmarshal {what}");
        assert_eq!(
            (
                got["code"].clone(),
                got["reason"].clone(),
                got["details"]["causes"][0]["field"].clone()
            ),
            (json!(422), json!("Invalid"), json!("patch")),
            "{got}"
        );
        assert_eq!(
            got["message"],
            format!(" \"\" is invalid: patch: {cause}"),
            "{got}"
        );
        // `Invalid value: "<the patched object as JSON>": <why>`
        let shown = cause
            .strip_prefix("Invalid value: ")
            .and_then(|c| c.strip_suffix(&suffix))
            .unwrap_or_else(|| panic!("{kind}: {cause}"));
        let shown: String = serde_json::from_str(shown).expect("a quoted string");
        let shown: Value = serde_json::from_str(&shown).expect("the patched object");
        let mut patched = before.clone();
        patched["metadata"]["labels"] = labels;
        assert_eq!(shown, patched, "{kind}");
    }

    // Server-side apply (creating or updating): the typed conversion fails.
    let applies = [
        (
            "one",
            "labels: x",
            ".metadata.labels: expected map, got &{x}",
        ),
        (
            "new",
            "labels: {app: 1}",
            ".metadata.labels.app: expected string, got &value.valueUnstructured{Value:1}",
        ),
    ];
    for (name, metadata, why) in applies {
        let yaml = format!(
            "apiVersion: stable.example.io/v1\nkind: CronTab\nmetadata:\n  name: {name}\n  namespace: demo\n  {metadata}\nspec:\n  cronSpec: '* * * * */5'\n"
        );
        let path = format!("{collection}/{name}?fieldManager=test");
        let (code, got) = raw_apply(&tc, &path, yaml).await;
        // Not a Status error inside kube: a 500 without a reason.
        let expected = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("failed to create typed patch object (demo/{name}; stable.example.io/v1, Kind=CronTab): {why}"),
            "code": 500});
        assert_eq!((code, got), (500, expected), "{metadata}");
    }

    assert_eq!(get().await.expect("get"), before, "nothing was written");
    for name in ["bad", "new"] {
        let gone = kubectl_async(kc, &["-n", "demo", "get", "crontab", name]).await;
        assert!(!gone.success(), "{name} was created: {gone:?}");
    }

    // A null value decodes, as "".
    ok(
        kc,
        &[
            "-n",
            "demo",
            "patch",
            "crontab",
            "one",
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/metadata/labels/empty","value":null}]"#,
        ],
    )
    .await;
    let after = get().await.expect("get");
    assert_eq!(
        after["metadata"]["labels"],
        json!({"app": "cron", "empty": ""})
    );
}

/// Server-side apply holds to what its configuration pins, as kube's patcher and
/// registry do: a uid makes it apply to that object only, so with no object there
/// it creates nothing (409 "uid mismatch"); a resourceVersion does not stop it
/// creating, but against a stored object it must be that object's (409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_naming_a_uid_never_creates_and_a_resource_version_pins_only_a_stored_object() {
    let tc = crontab_cluster().await;
    let kc = tc.kubeconfig.clone();
    let collection = "/apis/stable.example.io/v1/namespaces/demo/crontabs";
    let config = |name: &str, pin: &str| {
        format!(
            "apiVersion: stable.example.io/v1\nkind: CronTab\nmetadata:\n  name: {name}\n  namespace: demo\n  {pin}\nspec:\n  cronSpec: '* * * * */5'\n"
        )
    };
    let (code, got) = raw_apply(
        &tc,
        &format!("{collection}/ghost?fieldManager=test"),
        config("ghost", "uid: 6d1c2a4e-0000-4000-8000-000000000001"),
    )
    .await;
    let expected = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Operation cannot be fulfilled on crontabs.stable.example.io \"ghost\": uid mismatch: the provided object specified uid 6d1c2a4e-0000-4000-8000-000000000001, and no existing object was found",
        "reason": "Conflict",
        "details": {"name": "ghost", "group": "stable.example.io", "kind": "crontabs"},
        "code": 409});
    assert_eq!((code, got), (409, expected));
    let ghost = kubectl_async(&kc, &["-n", "demo", "get", "crontab", "ghost"]).await;
    assert!(!ghost.success(), "the apply created ghost: {ghost:?}");
    // The configuration's kind is checked before its uid.
    let (code, got) = raw_apply(
        &tc,
        &format!("{collection}/ghost?fieldManager=test"),
        config("ghost", "uid: 6d1c2a4e-0000-4000-8000-000000000001")
            .replace("kind: CronTab", "kind: Other"),
    )
    .await;
    assert_eq!(code, 400, "{got}");

    let pinned = config("pinned", "resourceVersion: \"18446744073709551615\"");
    let path = format!("{collection}/pinned?fieldManager=test");
    let (code, created) = raw_apply(&tc, &path, pinned.clone()).await;
    assert_eq!(code, 201, "{created}");
    assert_ne!(
        created["metadata"]["resourceVersion"],
        "18446744073709551615"
    );
    let (code, got) = raw_apply(&tc, &path, pinned).await;
    assert_eq!(code, 409, "{got}");
    assert_eq!(
        got["message"],
        "Operation cannot be fulfilled on crontabs.stable.example.io \"pinned\": the object has been modified; please apply your changes to the latest version and try again"
    );
}

/// Sends a server-side apply body as it is: kubectl decodes apply bodies into
/// typed metadata first, so it cannot send labels of the wrong type.
async fn raw_apply(tc: &test_support::TestCluster, path: &str, yaml: String) -> (u16, Value) {
    use http_body_util::BodyExt;
    let kubeconfig =
        crproxy_kube::Kubeconfig::from_yaml(&tc.cluster.admin_kubeconfig()).expect("kubeconfig");
    let config = crproxy_kube::ClusterConfig::from_kubeconfig(&kubeconfig, None).expect("config");
    let credentials = config.credentials().expect("credentials");
    let client =
        crproxy_kube::kube_client_without_retries(&config, credentials, "demo").expect("client");
    let request = http::Request::patch(path)
        .header(http::header::CONTENT_TYPE, "application/apply-patch+yaml")
        .body(kube::client::Body::from(yaml.into_bytes()))
        .expect("request");
    let response = client.send(request).await.expect("answered");
    let code = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (code, serde_json::from_slice(&body).expect("a Status"))
}

/// `/metrics` counts requests in kube's `apiserver_request_total`: kubectl's
/// merge patches and a refused one appear under their verb, resource, scope and
/// code, and a list under LIST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_on_metrics_as_kube_counts_them() {
    let tc = crontab_cluster().await;
    let kc = tc.kubeconfig.clone();
    apply(&kc, &crontab("one", "cron")).await;
    for replicas in [2, 3] {
        let patch = format!(r#"{{"spec":{{"replicas":{replicas}}}}}"#);
        let patched = merge_patch_one(&kc, &[], &patch).await;
        assert!(patched.success(), "{patched:?}");
    }
    let refused = merge_patch_one(&kc, &[], r#"{"spec":{"replicas":99}}"#).await;
    assert!(!refused.success(), "{refused:?}");
    ok(&kc, &["-n", "demo", "get", "crontabs"]).await;

    let text = ok(&kc, &["get", "--raw", "/metrics"]).await;
    let count = |code: &str, scope: &str, verb: &str| -> Option<u64> {
        let series = format!(
            "apiserver_request_total{{code=\"{code}\",component=\"apiserver\",dry_run=\"\",\
             group=\"stable.example.io\",resource=\"crontabs\",scope=\"{scope}\",\
             subresource=\"\",verb=\"{verb}\",version=\"v1\"}} "
        );
        text.lines()
            .find_map(|line| line.strip_prefix(&series)?.parse().ok())
    };
    assert_eq!(count("200", "resource", "PATCH"), Some(2), "{text}");
    assert_eq!(count("422", "resource", "PATCH"), Some(1), "{text}");
    assert!(
        count("200", "namespace", "LIST").is_some_and(|n| n >= 1),
        "{text}"
    );
    assert!(
        count("201", "namespace", "POST").is_some_and(|n| n >= 1),
        "{text}"
    );
    assert!(
        text.contains("# TYPE apiserver_request_total counter"),
        "{text}"
    );
}

/// A CronTab's `status` and `scale` serve get, update and patch only: a create or a
/// delete of either is kube's 405 naming the verb and the resource, and a
/// subresource the CRD does not declare is a 404 for the object. The object stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_subresource_refuses_create_and_delete_as_kube_does() {
    let tc = crontab_cluster().await;
    let kc = tc.kubeconfig.clone();
    apply(&kc, &crontab("one", "cron")).await;
    let object = "/apis/stable.example.io/v1/namespaces/demo/crontabs/one";

    let status = format!("{object}/status");
    let created = kubectl_stdin_async(
        &kc,
        &["create", "--raw", &status, "-f", "-"],
        "{}",
        Duration::from_secs(60),
    )
    .await;
    assert!(!created.success(), "{created:?}");
    assert!(
        created.stderr.contains(
            "Error from server (MethodNotAllowed): create is not supported on resources of kind \"crontabs.stable.example.io\""
        ),
        "{created:?}"
    );

    let scale = format!("{object}/scale");
    let deleted = kubectl_async(&kc, &["delete", "--raw", &scale]).await;
    assert!(!deleted.success(), "{deleted:?}");
    assert!(
        deleted.stderr.contains(
            "Error from server (MethodNotAllowed): delete is not supported on resources of kind \"crontabs.stable.example.io\""
        ),
        "{deleted:?}"
    );

    let undeclared = format!("{object}/logs");
    for args in [
        vec!["get", "--raw", undeclared.as_str()],
        vec!["delete", "--raw", undeclared.as_str()],
    ] {
        let out = kubectl_async(&kc, &args).await;
        assert!(!out.success(), "{args:?}: {out:?}");
        assert!(
            out.stderr.contains(
                "Error from server (NotFound): crontabs.stable.example.io \"one\" not found"
            ),
            "{args:?}: {out:?}"
        );
    }

    ok(&kc, &["-n", "demo", "get", "crontab", "one"]).await;
}

/// A create whose body carries a resourceVersion is refused by kube's storage with
/// a reasonless 500 and stores nothing; a server-side dry run never gets that far,
/// and a version of 0 means none. (`kubectl create -f` clears the version before
/// it sends; `--raw` sends the body as it is.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_carrying_a_resource_version_is_refused_as_kube_refuses_it() {
    let tc = crontab_cluster().await;
    let kc = tc.kubeconfig.clone();
    let collection = "/apis/stable.example.io/v1/namespaces/demo/crontabs";
    let create = |query: &str, name: &str, version: &str| {
        let kc = kc.clone();
        let path = format!("{collection}{query}");
        let body = json!({
            "apiVersion": "stable.example.io/v1",
            "kind": "CronTab",
            "metadata": {"name": name, "resourceVersion": version},
            "spec": {"cronSpec": "* * * * */5", "image": "img", "replicas": 1},
        })
        .to_string();
        async move {
            kubectl_stdin_async(
                &kc,
                &["create", "--raw", &path, "-f", "-"],
                &body,
                Duration::from_secs(60),
            )
            .await
        }
    };

    let refused = create("", "pinned", "5").await;
    assert!(!refused.success(), "{refused:?}");
    assert!(
        refused.stderr.contains(
            "Error from server: resourceVersion should not be set on objects to be created"
        ),
        "{refused:?}"
    );
    let missing = kubectl_async(&kc, &["-n", "demo", "get", "crontab", "pinned"]).await;
    assert!(!missing.success(), "nothing was stored: {missing:?}");

    let dry_run = create("?dryRun=All", "pinned", "5").await;
    assert!(dry_run.success(), "{dry_run:?}");
    // Neither 0 nor what Go does not read as a number (it takes no `+`).
    for (name, version) in [("zero", "0"), ("plus", "+5"), ("word", "abc")] {
        let created = create("", name, version).await;
        assert!(created.success(), "{version}: {created:?}");
    }
}

/// v1 declares the status and scale subresources, v1beta1 none (kube allows
/// that in apiextensions v1: subresources are per version).
const WIDGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.per.example.io
spec:
  group: per.example.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}
  - name: v1beta1
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

/// kube's CRD handler takes a CRD's subresources per served version
/// (`GetSubresourcesForVersion`): a version without `status` answers 404 for
/// `/status` and `/scale`, lists neither in discovery, and writes status with the
/// rest of the object (its strategy resets status only where the version has the
/// subresource, and then status changes bump the generation too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_subresources_are_served_per_version() {
    let tc = devcluster("target").await;
    let kc = tc.kubeconfig.clone();
    apply(&kc, WIDGET_CRD).await;
    ok(
        &kc,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=20s",
            "crd/widgets.per.example.io",
        ],
    )
    .await;

    for (version, expected) in [
        ("v1", vec!["widgets", "widgets/status", "widgets/scale"]),
        ("v1beta1", vec!["widgets"]),
    ] {
        let list: Value = serde_json::from_str(
            &ok(
                &kc,
                &["get", "--raw", &format!("/apis/per.example.io/{version}")],
            )
            .await,
        )
        .expect("json");
        let names: Vec<&str> = list["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert_eq!(names, expected, "{version}");
    }

    // Create: only a version with the status subresource drops the status sent.
    let create = |version: &str, name: &str| {
        let kc = kc.clone();
        let path = format!("/apis/per.example.io/{version}/namespaces/default/widgets");
        let body = json!({
            "apiVersion": format!("per.example.io/{version}"), "kind": "Widget",
            "metadata": {"name": name},
            "spec": {"replicas": 2}, "status": {"phase": "sent"},
        })
        .to_string();
        async move {
            let out = kubectl_stdin_async(
                &kc,
                &["create", "--raw", &path, "-f", "-"],
                &body,
                Duration::from_secs(60),
            )
            .await;
            assert!(out.success(), "{out:?}");
            serde_json::from_str::<Value>(&out.stdout).expect("json")
        }
    };
    assert_eq!(create("v1beta1", "beta").await["status"]["phase"], "sent");
    assert!(create("v1", "ga").await.get("status").is_none());

    // Routing: /status and /scale exist in v1 only.
    let object =
        |version: &str| format!("/apis/per.example.io/{version}/namespaces/default/widgets/beta");
    let status: Value = serde_json::from_str(
        &ok(&kc, &["get", "--raw", &format!("{}/status", object("v1"))]).await,
    )
    .expect("json");
    assert_eq!(status["status"]["phase"], "sent");
    let scale: Value =
        serde_json::from_str(&ok(&kc, &["get", "--raw", &format!("{}/scale", object("v1"))]).await)
            .expect("json");
    assert_eq!(scale["spec"]["replicas"], 2);
    for sub in ["status", "scale"] {
        let out = kubectl_async(
            &kc,
            &["get", "--raw", &format!("{}/{sub}", object("v1beta1"))],
        )
        .await;
        assert!(!out.success(), "{sub}: {out:?}");
        assert!(
            out.stderr.contains(
                "Error from server (NotFound): widgets.per.example.io \"beta\" not found"
            ),
            "{sub}: {out:?}"
        );
    }

    // Writes to the main resource: status goes with the rest in v1beta1 (and
    // bumps the generation), and is ignored in v1.
    let patch = |version: &str, phase: &str| {
        let kc = kc.clone();
        let resource = format!("widgets.{version}.per.example.io");
        let patch = json!({"status": {"phase": phase}}).to_string();
        async move {
            let out = kubectl_async(
                &kc,
                &[
                    "patch",
                    &resource,
                    "beta",
                    "--type=merge",
                    "-p",
                    &patch,
                    "-o",
                    "json",
                ],
            )
            .await;
            assert!(out.success(), "{out:?}");
            serde_json::from_str::<Value>(&out.stdout).expect("json")
        }
    };
    let patched = patch("v1beta1", "patched").await;
    assert_eq!(patched["status"]["phase"], "patched");
    assert_eq!(patched["metadata"]["generation"], 2);
    let ignored = patch("v1", "ignored").await;
    assert_eq!(ignored["status"]["phase"], "patched");
    assert_eq!(ignored["metadata"]["generation"], 2);

    let replace = |version: &str, phase: &str| {
        let kc = kc.clone();
        let path = object(version);
        let phase = phase.to_string();
        async move {
            let mut current: Value =
                serde_json::from_str(&ok(&kc, &["get", "--raw", &path]).await).expect("json");
            current["status"]["phase"] = json!(phase);
            let out = kubectl_stdin_async(
                &kc,
                &["replace", "--raw", &path, "-f", "-"],
                &current.to_string(),
                Duration::from_secs(60),
            )
            .await;
            assert!(out.success(), "{out:?}");
            serde_json::from_str::<Value>(&out.stdout).expect("json")
        }
    };
    assert_eq!(
        replace("v1beta1", "replaced").await["status"]["phase"],
        "replaced"
    );
    assert_eq!(
        replace("v1", "ignored").await["status"]["phase"],
        "replaced"
    );
}
