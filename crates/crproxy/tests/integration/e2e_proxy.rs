//! End to end: real kubectl → client devcluster → aggregation → crproxy → target
//! devcluster, started exactly as `crproxy dev` starts them.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::{json, Value};

use crproxy::devenv::{DevEnv, DevOptions};

const OWNER_VCLUSTER: &str = "vcluster.com/owner-vcluster";
const OWNER_PROJECT: &str = "vcluster.com/owner-project";

async fn env(clients: usize, replicas: usize) -> Result<(DevEnv, tempfile::TempDir)> {
    crproxy_kube::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let env = DevEnv::start(DevOptions::ephemeral(dir.path(), clients, replicas)).await?;
    Ok((env, dir))
}

/// Runs kubectl off the runtime and returns (success, stdout, stderr).
async fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let output = match stdin {
        Some(input) => {
            test_support::kubectl_stdin_async(kubeconfig, args, input, Duration::from_secs(30))
                .await
        }
        None => test_support::kubectl_async(kubeconfig, args).await,
    };
    (output.success(), output.stdout, output.stderr)
}

async fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let (ok, out, err) = kubectl(kubeconfig, args, None).await;
    anyhow::ensure!(ok, "kubectl {args:?} failed: {err}");
    Ok(out)
}

async fn kubectl_apply(kubeconfig: &Path, namespace: &str, manifest: &Value) -> Result<String> {
    let text = manifest.to_string();
    let (ok, out, err) = kubectl(
        kubeconfig,
        &["-n", namespace, "create", "-f", "-"],
        Some(&text),
    )
    .await;
    anyhow::ensure!(ok, "kubectl create failed: {err}");
    Ok(out)
}

fn widget(name: &str, size: i64) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": {"size": size}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_through_the_client_lands_on_the_target_with_owner_labels() -> Result<()> {
    let (env, _dir) = env(1, 1).await?;
    let client = &env.clients[0].kubeconfig;
    let target = &env.target_kubeconfig;
    kubectl_ok(client, &["create", "namespace", "demo"]).await?;
    kubectl_apply(client, "demo", &widget("w1", 1)).await?;

    // On the target, with both labels.
    let on_target: Value = serde_json::from_str(
        &kubectl_ok(
            target,
            &["-n", "demo", "get", "widgets", "w1", "-o", "json"],
        )
        .await?,
    )?;
    assert_eq!(on_target["metadata"]["labels"][OWNER_VCLUSTER], "client");
    assert_eq!(on_target["metadata"]["labels"][OWNER_PROJECT], "default");

    // get, list (Table), merge and json patch, label, delete through the client.
    let got = kubectl_ok(
        client,
        &[
            "-n",
            "demo",
            "get",
            "widget",
            "w1",
            "-o",
            "jsonpath={.spec.size}",
        ],
    )
    .await?;
    assert_eq!(got, "1");
    let table = kubectl_ok(client, &["-n", "demo", "get", "widgets"]).await?;
    assert!(table.contains("w1"), "{table}");
    kubectl_ok(
        client,
        &[
            "-n",
            "demo",
            "patch",
            "widget",
            "w1",
            "--type=merge",
            "-p",
            r#"{"spec":{"size":2}}"#,
        ],
    )
    .await?;
    kubectl_ok(
        client,
        &[
            "-n",
            "demo",
            "patch",
            "widget",
            "w1",
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/spec/size","value":3}]"#,
        ],
    )
    .await?;
    kubectl_ok(
        client,
        &["-n", "demo", "label", "widget", "w1", "color=blue"],
    )
    .await?;
    let labelled = kubectl_ok(
        client,
        &[
            "-n",
            "demo",
            "get",
            "widgets",
            "-l",
            "color=blue",
            "-o",
            "name",
        ],
    )
    .await?;
    assert_eq!(labelled.trim(), "widget.example.com/w1");
    // A caller cannot strip ownership: the labels come back on every write.
    kubectl_ok(
        client,
        &[
            "-n",
            "demo",
            "label",
            "widget",
            "w1",
            &format!("{OWNER_VCLUSTER}=someone-else"),
            "--overwrite",
        ],
    )
    .await?;
    let relabelled: Value = serde_json::from_str(
        &kubectl_ok(
            target,
            &["-n", "demo", "get", "widgets", "w1", "-o", "json"],
        )
        .await?,
    )?;
    assert_eq!(relabelled["metadata"]["labels"][OWNER_VCLUSTER], "client");
    assert_eq!(relabelled["spec"]["size"], 3);

    // The status subresource of an owned object is readable (a subresource has
    // no labels of its own; ownership is the object's).
    kubectl_ok(
        client,
        &[
            "-n",
            "demo",
            "get",
            "widget",
            "w1",
            "--subresource=status",
            "-o",
            "name",
        ],
    )
    .await?;
    // A Scale carries no labels at all: reading and writing it must still work.
    kubectl_ok(
        client,
        &["-n", "demo", "scale", "widget", "w1", "--replicas=4"],
    )
    .await?;
    let scaled: Value = serde_json::from_str(
        &kubectl_ok(
            target,
            &["-n", "demo", "get", "widgets", "w1", "-o", "json"],
        )
        .await?,
    )?;
    assert_eq!(scaled["spec"]["replicas"], 4);
    let scale: Value = serde_json::from_str(
        &kubectl_ok(
            client,
            &[
                "get",
                "--raw",
                "/apis/example.com/v1/namespaces/demo/widgets/w1/scale",
            ],
        )
        .await?,
    )?;
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 4);
    kubectl_ok(
        client,
        &["-n", "demo", "delete", "widget", "w1", "--wait=false"],
    )
    .await?;
    let (gone, _, err) = kubectl(target, &["-n", "demo", "get", "widgets", "w1"], None).await;
    assert!(!gone && err.contains("NotFound"), "{err}");
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_the_client_does_not_own_are_invisible_and_immutable() -> Result<()> {
    let (env, _dir) = env(1, 1).await?;
    let client = &env.clients[0].kubeconfig;
    let target = &env.target_kubeconfig;
    kubectl_ok(client, &["create", "namespace", "demo"]).await?;
    kubectl_ok(target, &["create", "namespace", "demo"]).await?;
    kubectl_apply(target, "demo", &widget("foreign", 7)).await?;
    kubectl_apply(client, "demo", &widget("mine", 1)).await?;

    let listed = kubectl_ok(client, &["-n", "demo", "get", "widgets", "-o", "name"]).await?;
    assert_eq!(
        listed.trim(),
        "widget.example.com/mine",
        "list must hide foreign objects"
    );
    for args in [
        vec!["-n", "demo", "get", "widget", "foreign"],
        vec!["-n", "demo", "get", "widget", "foreign", "-o", "json"],
        vec![
            "-n",
            "demo",
            "patch",
            "widget",
            "foreign",
            "--type=merge",
            "-p",
            r#"{"spec":{"size":1}}"#,
        ],
        vec!["-n", "demo", "label", "widget", "foreign", "x=y"],
        vec!["-n", "demo", "delete", "widget", "foreign"],
    ] {
        let (ok, _, err) = kubectl(client, &args, None).await;
        assert!(!ok && err.contains("NotFound"), "{args:?}: {err}");
    }
    // Untouched on the target.
    let foreign: Value = serde_json::from_str(
        &kubectl_ok(
            target,
            &["-n", "demo", "get", "widget", "foreign", "-o", "json"],
        )
        .await?,
    )?;
    assert_eq!(foreign["spec"]["size"], 7);
    assert!(foreign["metadata"]["labels"].get("x").is_none());
    // Creating a name that exists on the target surfaces the target's conflict.
    let (ok, _, err) = kubectl(
        client,
        &["-n", "demo", "create", "-f", "-"],
        Some(&widget("foreign", 1).to_string()),
    )
    .await;
    assert!(!ok && err.contains("AlreadyExists"), "{err}");
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_on_one_target_see_only_their_own_objects() -> Result<()> {
    let (env, _dir) = env(2, 1).await?;
    let first = &env.clients[0].kubeconfig;
    let second = &env.clients[1].kubeconfig;
    for kubeconfig in [first, second] {
        kubectl_ok(kubeconfig, &["create", "namespace", "shared"]).await?;
    }
    kubectl_apply(first, "shared", &widget("from-first", 1)).await?;
    kubectl_apply(second, "shared", &widget("from-second", 2)).await?;
    let seen_by_first =
        kubectl_ok(first, &["-n", "shared", "get", "widgets", "-o", "name"]).await?;
    let seen_by_second =
        kubectl_ok(second, &["-n", "shared", "get", "widgets", "-o", "name"]).await?;
    assert_eq!(seen_by_first.trim(), "widget.example.com/from-first");
    assert_eq!(seen_by_second.trim(), "widget.example.com/from-second");
    let (ok, _, err) = kubectl(
        second,
        &["-n", "shared", "get", "widget", "from-first"],
        None,
    )
    .await;
    assert!(!ok && err.contains("NotFound"), "{err}");
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_must_exist_on_the_client_and_are_mirrored_to_the_target() -> Result<()> {
    let (env, _dir) = env(1, 1).await?;
    let client = &env.clients[0].kubeconfig;
    let target = &env.target_kubeconfig;
    // Missing on the client: 404, nothing created on the target.
    let (ok, _, err) = kubectl(
        client,
        &["-n", "nowhere", "create", "-f", "-"],
        Some(&widget("w", 1).to_string()),
    )
    .await;
    assert!(!ok && err.contains("NotFound"), "{err}");
    let (exists, _, _) = kubectl(target, &["get", "namespace", "nowhere"], None).await;
    assert!(!exists, "namespace must not be created on the target");
    // Present on the client only: created on the target by the proxy.
    kubectl_ok(client, &["create", "namespace", "mirrored"]).await?;
    kubectl_apply(client, "mirrored", &widget("w", 1)).await?;
    kubectl_ok(target, &["get", "namespace", "mirrored"]).await?;
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_through_the_client_sees_added_modified_deleted() -> Result<()> {
    let (env, _dir) = env(1, 1).await?;
    let client = env.clients[0].kubeconfig.clone();
    kubectl_ok(&client, &["create", "namespace", "watched"]).await?;
    let watcher = {
        let client = client.clone();
        tokio::task::spawn_blocking(move || {
            test_support::kubectl_with_timeout(
                &client,
                &[
                    "-n",
                    "watched",
                    "get",
                    "widgets",
                    "-w",
                    "--output-watch-events",
                    "-o",
                    "custom-columns=EVENT:.type,NAME:.object.metadata.name",
                ],
                Duration::from_secs(8),
            )
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    kubectl_apply(&client, "watched", &widget("w", 1)).await?;
    kubectl_ok(
        &client,
        &[
            "-n",
            "watched",
            "patch",
            "widget",
            "w",
            "--type=merge",
            "-p",
            r#"{"spec":{"size":9}}"#,
        ],
    )
    .await?;
    kubectl_ok(&client, &["-n", "watched", "delete", "widget", "w"]).await?;
    let output = watcher.await.context("watch task")?;
    for event in ["ADDED", "MODIFIED", "DELETED"] {
        assert!(
            output.stdout.contains(event),
            "missing {event}: {}",
            output.stdout
        );
    }
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_down_keeps_discovery_and_fails_requests_with_retryable_503() -> Result<()> {
    let (env, _dir) = env(1, 1).await?;
    let client = &env.clients[0].kubeconfig;
    kubectl_ok(client, &["create", "namespace", "demo"]).await?;
    env.target.stop_listener(env.target_replicas[0])?;
    let resources = kubectl_ok(
        client,
        &["api-resources", "--api-group=example.com", "-o", "name"],
    )
    .await?;
    assert!(resources.contains("widgets.example.com"), "{resources}");
    let (ok, _, err) = kubectl(client, &["-n", "demo", "get", "widgets", "-v=6"], None).await;
    assert!(!ok, "get must fail while the target is down");
    assert!(err.contains("503"), "{err}");
    let raw = kubectl(
        client,
        &[
            "get",
            "--raw",
            "/apis/example.com/v1/namespaces/demo/widgets",
        ],
        None,
    )
    .await;
    assert!(
        raw.2
            .contains("target tenant cluster \\\"target\\\" for example.com/v1 is unavailable")
            || raw.2.contains("is unavailable"),
        "{}",
        raw.2
    );
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_callers_without_the_front_proxy_certificate_get_401() -> Result<()> {
    let (env, _dir) = env(1, 1).await?;
    let (_, addr) = &env.clients[0].proxy().expect("proxy running").servers[0];
    let url = format!("https://{addr}/apis/example.com/v1/namespaces/demo/widgets");
    let output = std::process::Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "X-Remote-User: admin",
            "-H",
            "X-Remote-Group: system:masters",
            &url,
        ])
        .output()?;
    assert_eq!(String::from_utf8_lossy(&output.stdout), "401");
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_without_client_rbac_are_refused_by_the_client_api_server() -> Result<()> {
    let (env, dir) = env(1, 1).await?;
    let cluster = &env.clients[0].cluster;
    let token = cluster.issue_token("mallory", &[])?;
    let kubeconfig = dir.path().join("mallory.kubeconfig");
    let admin = std::fs::read_to_string(&env.clients[0].kubeconfig)?;
    let mut doc: Value = parse_kubeconfig(&admin)?;
    doc["users"][0]["user"] = json!({"token": token});
    std::fs::write(&kubeconfig, doc.to_string())?;
    let (ok, _, err) = kubectl(&kubeconfig, &["-n", "default", "get", "widgets"], None).await;
    assert!(
        !ok && err.contains("Forbidden") && err.contains("mallory"),
        "{err}"
    );
    env.shutdown().await;
    Ok(())
}

fn parse_kubeconfig(text: &str) -> Result<Value> {
    serde_json::from_str(text)
        .or_else(|_| serde_saphyr::from_str(text))
        .context("parsing kubeconfig")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_of_three_target_replicas_under_load_costs_callers_nothing() -> Result<()> {
    let (env, _dir) = env(1, 3).await?;
    // No retries: a caller-visible error must not be hidden by a second try.
    let api = crproxy::devenv::admin_client_without_retries(&env.clients[0].cluster)?;
    let post = PostParams::default();
    let load: Namespace = serde_json::from_value(json!({"metadata": {"name": "load"}}))?;
    Api::<Namespace>::all(api.clone())
        .create(&post, &load)
        .await?;
    let widgets = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    );
    let widgets = Api::<DynamicObject>::namespaced_with(api, "load", &widgets);
    widgets
        .create(&post, &serde_json::from_value(widget("w", 1))?)
        .await?;

    // Four callers, each making requests back to back for six seconds.
    let stop_at = tokio::time::Instant::now() + Duration::from_secs(6);
    let mut workers = Vec::new();
    for _ in 0..4 {
        let widgets = widgets.clone();
        workers.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            while tokio::time::Instant::now() < stop_at {
                match widgets.list(&ListParams::default()).await {
                    Ok(_) => ok += 1,
                    Err(e) => failed.push(crproxy_kube::Error::from(e).to_string()),
                }
            }
            (ok, failed)
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.target.stop_listener(env.target_replicas[1])?;
    let (mut total_ok, mut failures) = (0, Vec::new());
    for worker in workers {
        let (ok, failed) = worker.await?;
        total_ok += ok;
        failures.extend(failed);
    }
    assert!(
        total_ok > 20,
        "the load must actually run: {total_ok} requests"
    );
    assert!(
        failures.is_empty(),
        "{} caller-visible errors: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_client_namespace_removes_only_the_clients_objects() -> Result<()> {
    let (env, _dir) = env(1, 1).await?;
    let client = &env.clients[0].kubeconfig;
    let target = &env.target_kubeconfig;
    kubectl_ok(client, &["create", "namespace", "doomed"]).await?;
    kubectl_apply(client, "doomed", &widget("mine", 1)).await?;
    // Mirrored by the write above; another tenant's object lives beside ours.
    kubectl_apply(target, "doomed", &widget("theirs", 2)).await?;
    // The namespace controller lists proxied resources as metadata and deletes
    // what it sees: only the client's own objects.
    kubectl_ok(client, &["delete", "namespace", "doomed", "--timeout=60s"]).await?;
    let (exists, _, _) = kubectl(client, &["get", "namespace", "doomed"], None).await;
    assert!(!exists, "the namespace is gone from the client");
    let left = kubectl_ok(target, &["-n", "doomed", "get", "widgets", "-o", "name"]).await?;
    assert_eq!(
        left.trim(),
        "widget.example.com/theirs",
        "only the client's object is deleted"
    );
    env.shutdown().await;
    Ok(())
}

/// Where `crproxy dev` keeps the client identity's token on the target.
fn identity_token_file(env: &DevEnv) -> Result<std::path::PathBuf> {
    Ok(env.clients[0]
        .link
        .config_path
        .parent()
        .context("link directory")?
        .join(crproxy::devenv::IDENTITY_TOKEN_FILE))
}

/// Rotates the client identity's token the way the kubelet rotates a projected
/// token: a new token is issued and renamed over the file, requests keep flowing
/// while the proxy's credentials are read again (`refreshed`), then the old token is
/// revoked on the target. Every request through the client must succeed.
async fn rotate_identity_token(env: &DevEnv, refreshed: Duration) -> Result<()> {
    let client = &env.clients[0].kubeconfig;
    let token_file = identity_token_file(env)?;
    let identity = crproxy_core::names::target_identity("p-default", &env.clients[0].name);
    kubectl_ok(client, &["create", "namespace", "demo"]).await?;
    kubectl_apply(client, "demo", &widget("w1", 1)).await?;

    let old_token = std::fs::read_to_string(&token_file)?.trim().to_string();
    let new_token = env.target.issue_token(&identity, &[])?;
    let tmp = token_file.with_extension("new");
    std::fs::write(&tmp, format!("{new_token}\n"))?;
    std::fs::rename(&tmp, &token_file)?;

    // Paced so that requests span the whole window, the proxy's re-read of the
    // file included, however fast the machine: REQUESTS paced requests take the
    // window at least, so the loop ends with it.
    const REQUESTS: u32 = 100;
    let pace = refreshed / REQUESTS;
    let until = tokio::time::Instant::now() + refreshed;
    for request in 0..REQUESTS {
        if tokio::time::Instant::now() >= until {
            break;
        }
        kubectl_ok(client, &["-n", "demo", "get", "widgets", "w1"])
            .await
            .with_context(|| format!("request {request} before the old token is revoked"))?;
        tokio::time::sleep(pace).await;
    }
    env.target.revoke_token(&old_token)?;
    for i in 0..5 {
        kubectl_ok(client, &["-n", "demo", "get", "widgets", "w1"])
            .await
            .with_context(|| format!("request {i} after the old token was revoked"))?;
        kubectl_apply(client, "demo", &widget(&format!("after-{i}"), i)).await?;
    }
    Ok(())
}

/// A target that no longer accepts the proxy's identity (its token revoked) is
/// told to kubectl, through the client's aggregation layer, as the runbook's 401
/// "auth failed" naming the target, not as the caller's own login failing: for
/// a read, and for a create whose namespace the target must first be given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_target_identity_is_a_401_auth_failed_through_kubectl() -> Result<()> {
    let (env, _dir) = env(1, 1).await?;
    let client = &env.clients[0].kubeconfig;
    kubectl_ok(client, &["create", "namespace", "demo"]).await?;
    kubectl_apply(client, "demo", &widget("w1", 1)).await?;
    kubectl_ok(client, &["create", "namespace", "fresh"]).await?;
    let token = std::fs::read_to_string(identity_token_file(&env)?)?;
    env.target.revoke_token(token.trim())?;
    let read = kubectl(client, &["-n", "demo", "get", "widgets", "w1"], None).await;
    let created = kubectl(
        client,
        &["-n", "fresh", "create", "-f", "-"],
        Some(&widget("w2", 1).to_string()),
    )
    .await;
    for (what, (ok, _, stderr)) in [("read", read), ("create", created)] {
        assert!(!ok, "{what} succeeded");
        assert!(
            stderr.contains("auth failed: target tenant cluster")
                && stderr.contains("rejected the proxy's credentials"),
            "{what}: {stderr}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_target_token_file_costs_callers_nothing() -> Result<()> {
    // `crproxy dev` gives the identity a tokenFile kubeconfig: read again at the
    // next recheck.
    let (env, _dir) = env(1, 1).await?;
    rotate_identity_token(
        &env,
        crproxy_kube::DEFAULT_FILE_RECHECK + Duration::from_secs(2),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_plugin_identity_serves_through_a_rotation() -> Result<()> {
    // The target identity's kubeconfig runs an exec plugin (as EKS, GKE and AKS
    // kubeconfigs do) that prints the token file's token with a 40 s lifetime: the
    // proxy runs it again 30 s before expiry, so within about 10 s. The client
    // cluster's kubeconfig (leader election, registration, namespace checks) reads a
    // token file that is rotated at the same time.
    let (mut env, _dir) = env(1, 1).await?;
    env.clients[0].stop_proxy().await;
    let token_file = identity_token_file(&env)?;
    let link_dir = token_file.parent().context("link directory")?.to_path_buf();
    let plugin = link_dir.join("identity-plugin.sh");
    std::fs::write(
        &plugin,
        "#!/bin/sh\nset -e\nexpiry=$(date -u -d '+40 seconds' +%Y-%m-%dT%H:%M:%SZ)\nprintf '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"%s\",\"expirationTimestamp\":\"%s\"}}' \"$(cat \"$1\")\" \"$expiry\"\n",
    )?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))?;
    }
    let kubeconfig_path = link_dir.join("target-identity.kubeconfig");
    let mut kubeconfig: Value = parse_kubeconfig(&std::fs::read_to_string(&kubeconfig_path)?)?;
    kubeconfig["users"][0]["user"] = json!({"exec": {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "./identity-plugin.sh",
        "args": [token_file],
        "interactiveMode": "Never",
    }});
    std::fs::write(&kubeconfig_path, kubeconfig.to_string())?;

    // The proxy's own kubeconfig for the client cluster, on a token file.
    let client_token_file = link_dir.join("client-control.token");
    let old_client_token = env.clients[0]
        .cluster
        .issue_token("crproxy-control", &["system:masters"])?;
    std::fs::write(&client_token_file, &old_client_token)?;
    let admin_path = env.clients[0].kubeconfig.clone();
    let admin = &admin_path;
    let mut control: Value = parse_kubeconfig(&std::fs::read_to_string(admin)?)?;
    control["users"][0]["user"] = json!({"tokenFile": client_token_file});
    let control_path = link_dir.join("client-control.kubeconfig");
    std::fs::write(&control_path, control.to_string())?;
    let config_path = env.clients[0].link.config_path.clone();
    let config = std::fs::read_to_string(&config_path)?;
    let admin_line = format!("kubeconfig: \"{}\"", admin.display());
    anyhow::ensure!(
        config.contains(&admin_line),
        "client kubeconfig line in {config}"
    );
    std::fs::write(
        &config_path,
        config.replace(
            &admin_line,
            &format!("kubeconfig: \"{}\"", control_path.display()),
        ),
    )?;
    env.clients[0].replica = Some(env.clients[0].link.start_replica().await?);

    let new_client_token = env.clients[0]
        .cluster
        .issue_token("crproxy-control", &["system:masters"])?;
    std::fs::write(client_token_file.with_extension("new"), &new_client_token)?;
    std::fs::rename(client_token_file.with_extension("new"), &client_token_file)?;
    rotate_identity_token(&env, Duration::from_secs(14)).await?;
    env.clients[0].cluster.revoke_token(&old_client_token)?;

    // The control plane goes on with the new client token: the lease is renewed
    // and requests that check namespaces on the client keep succeeding.
    let lease = |out: String| -> Result<String> {
        let lease: Value = serde_json::from_str(&out)?;
        Ok(lease["spec"]["renewTime"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    };
    let lease_args = [
        "-n",
        "kube-system",
        "get",
        "lease",
        "crproxy-client",
        "-o",
        "json",
    ];
    let before = lease(kubectl_ok(admin, &lease_args).await?)?;
    let mut renewed = false;
    for _ in 0..40 {
        kubectl_ok(admin, &["-n", "demo", "get", "widgets", "w1"]).await?;
        if lease(kubectl_ok(admin, &lease_args).await?)? != before {
            renewed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    anyhow::ensure!(
        renewed,
        "the lease was not renewed after the old client token was revoked"
    );
    kubectl_apply(admin, "demo", &widget("after-client-rotation", 9)).await?;
    Ok(())
}
