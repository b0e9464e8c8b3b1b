//! `cargo test -p devcluster --test integration serve_for_manual -- --ignored` serves a
//! devcluster for manual poking and for the reference replay
//! (`../shared/reference/kube-apiserver-1.32/record.py`):
//! - `DEVCLUSTER_DATA`: data directory (default: a temp dir). It gets tokens for
//!   the reference users alice (developers) and bob (viewers) in `tokens.csv`, and
//!   the admin kubeconfig `admin.kubeconfig` (cluster `target`, user `target-admin`).
//! - `DEVCLUSTER_PORT`: port (default 0, printed), `DEVCLUSTER_SECONDS`: how long
//!   (default 120).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "manual: serves a cluster for a while"]
async fn serve_for_manual_testing() {
    test_support::init_crypto();
    let temp = tempfile::tempdir().expect("temp dir");
    let dir = std::env::var("DEVCLUSTER_DATA")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| temp.path().to_path_buf());
    let port: u16 = std::env::var("DEVCLUSTER_PORT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let cluster = devcluster::start(devcluster::DevClusterConfig {
        name: "target".into(),
        data_dir: Some(dir.clone()),
        bind: "127.0.0.1".parse().expect("ip"),
        port,
    })
    .await
    .expect("start");
    let tokens = std::fs::read_to_string(dir.join("tokens.csv")).unwrap_or_default();
    for (user, group) in [("alice", "developers"), ("bob", "viewers")] {
        if !tokens.contains(&format!(",{user},")) {
            cluster.issue_token(user, &[group]).expect("token");
        }
    }
    std::fs::write(dir.join("ca.crt"), cluster.ca_pem()).expect("ca");
    let secs: u64 = std::env::var("DEVCLUSTER_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    eprintln!(
        "serving {} for {secs}s, data in {}",
        cluster.url(),
        dir.display()
    );
    tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
    cluster.shutdown().await;
}
