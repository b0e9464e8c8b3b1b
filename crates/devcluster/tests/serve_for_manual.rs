//! `cargo test -p devcluster --test serve_for_manual -- --ignored` serves a
//! devcluster for manual poking: kubeconfig at $DEVCLUSTER_KUBECONFIG (default
//! /tmp/devcluster.kubeconfig), for $DEVCLUSTER_SECONDS (default 120).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "manual: serves a cluster for a while"]
async fn serve_for_manual_testing() {
    let tc = test_support::devcluster("target").await;
    let path = std::env::var("DEVCLUSTER_KUBECONFIG")
        .unwrap_or_else(|_| "/tmp/devcluster.kubeconfig".to_string());
    std::fs::write(&path, tc.cluster.admin_kubeconfig()).expect("write kubeconfig");
    let secs: u64 = std::env::var("DEVCLUSTER_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    eprintln!(
        "serving {} for {secs}s, kubeconfig {path}",
        tc.cluster.url()
    );
    tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
}
