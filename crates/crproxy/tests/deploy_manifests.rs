//! deploy/ renders with kustomize and a server-side dry run of the result is
//! accepted by an API server.

use std::path::Path;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_manifests_pass_a_server_side_dry_run() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let cluster = test_support::devcluster("deploy-check").await;
    let rendered = test_support::kubectl_async(
        &cluster.kubeconfig,
        &["kustomize", deploy.to_str().expect("utf8 path")],
    )
    .await;
    assert!(rendered.success(), "kustomize failed: {}", rendered.stderr);
    assert!(rendered.stdout.contains("kind: Deployment"));
    assert!(rendered.stdout.contains("replicas: 2"));
    // A dry run creates nothing, so the namespace the manifests live in must
    // exist first, as on any cluster.
    let namespace = test_support::kubectl_async(
        &cluster.kubeconfig,
        &["create", "namespace", "crproxy-system"],
    )
    .await;
    assert!(namespace.success(), "{}", namespace.stderr);
    let applied = test_support::kubectl_stdin_async(
        &cluster.kubeconfig,
        &["apply", "--dry-run=server", "-f", "-"],
        &rendered.stdout,
        Duration::from_secs(60),
    )
    .await;
    assert!(applied.success(), "dry run failed: {}", applied.stderr);
    assert!(
        applied
            .stdout
            .contains("deployment.apps/crproxy created (server dry run)"),
        "{}",
        applied.stdout
    );
    // Nothing was stored.
    let get = test_support::kubectl_async(
        &cluster.kubeconfig,
        &["-n", "crproxy-system", "get", "deployment", "crproxy"],
    )
    .await;
    assert!(!get.success(), "a dry run must not create objects");
}
