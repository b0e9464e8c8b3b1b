//! Leader election and registration against the fake HTTPS API server: real TLS, real
//! JSON, real 409s. Real time (paused time cannot drive real sockets), so durations are
//! short and every wait is bounded; the paused-time state machine tests are in
//! src/leader/tests.rs.

use anyhow::{anyhow, Context as _, Result};
use crproxy_kube::fake::FakeApiServer;
use crproxy_wiring::{
    register_all, spawn_registrar, spawn_wiring, LeaderElector, LeaderHandle, LeaseConfig,
    RegistrarConfig, Registration,
};
use serde_json::json;
use std::time::{Duration, Instant};

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/crproxy-leader";
const APISERVICES: &str = "/apis/apiregistration.k8s.io/v1/apiservices";
const SERVICES: &str = "/api/v1/namespaces/kube-system/services";

fn lease_config(identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(2),
        renew_interval: Duration::from_millis(300),
        retry_interval: Duration::from_millis(100),
        ..LeaseConfig::new("kube-system", "crproxy-leader", identity)
    }
}

/// A kube-rs client for the fake, built the way crproxy builds every kube client.
fn kube_client(srv: &FakeApiServer) -> kube::Client {
    let config = srv.config();
    let credentials = config.credentials().expect("credentials");
    crproxy_kube::kube_client_without_retries(&config, credentials, "default").expect("kube client")
}

async fn start() -> Result<FakeApiServer> {
    FakeApiServer::start().await.map_err(|e| anyhow!(e))
}

async fn wait_leader(h: &LeaderHandle, within: Duration) -> Result<Duration> {
    let t0 = Instant::now();
    let mut rx = h.changes();
    tokio::time::timeout(within, rx.wait_for(|l| *l))
        .await
        .context("no leadership in time")?
        .context("election ended")?;
    Ok(t0.elapsed())
}

#[tokio::test]
async fn election_over_the_wire() -> Result<()> {
    let srv = start().await?;
    let a = LeaderElector::spawn(kube_client(&srv), lease_config("replica-a"));
    wait_leader(&a, Duration::from_secs(5)).await?;
    let b = LeaderElector::spawn(kube_client(&srv), lease_config("replica-b"));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(a.is_leader() && !b.is_leader());

    let lease = srv.object(LEASE).context("lease stored")?;
    let spec = &lease["spec"];
    assert_eq!(lease["apiVersion"], "coordination.k8s.io/v1");
    assert_eq!(lease["kind"], "Lease");
    assert_eq!(spec["holderIdentity"], "replica-a");
    assert_eq!(spec["leaseDurationSeconds"], 2);
    assert_eq!(spec["leaseTransitions"], 0);
    for field in ["renewTime", "acquireTime"] {
        let t = spec[field].as_str().context("time")?;
        assert!(
            t.len() == 27 && t.ends_with('Z') && t.as_bytes()[19] == b'.',
            "{field} is a MicroTime: {t}"
        );
    }
    assert_ne!(spec["renewTime"], spec["acquireTime"], "a renewed");
    // Every write carried the resourceVersion it read: the fake answers 409 otherwise,
    // and b only reads while a holds the lease.
    let requests = srv.requests();
    assert!(
        requests.iter().any(|r| r.starts_with("PUT ")),
        "{requests:?}"
    );
    assert!(
        requests
            .iter()
            .all(|r| !r.starts_with("POST ") || r.ends_with("/leases")),
        "{requests:?}"
    );

    // a crashes: it neither renews nor releases. b waits out the lease.
    let crashed = Instant::now();
    a.abort();
    let took = wait_leader(&b, Duration::from_secs(6)).await?;
    assert!(
        crashed.elapsed() >= Duration::from_millis(1500),
        "b took over {took:?} after the crash, before the 2 s lease could expire"
    );
    let spec = srv.object(LEASE).context("lease")?["spec"].clone();
    assert_eq!(
        (
            spec["holderIdentity"].clone(),
            spec["leaseTransitions"].clone()
        ),
        (json!("replica-b"), json!(1))
    );

    // A clean shutdown hands over within a retry interval or so.
    let c = LeaderElector::spawn(kube_client(&srv), lease_config("replica-c"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!c.is_leader());
    let released = Instant::now();
    b.release().await;
    wait_leader(&c, Duration::from_secs(2)).await?;
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "{:?}",
        released.elapsed()
    );
    assert_eq!(
        srv.object(LEASE).context("lease")?["spec"]["leaseTransitions"],
        2
    );
    c.release().await;
    assert_eq!(
        srv.object(LEASE).context("lease")?["spec"]["holderIdentity"],
        ""
    );
    Ok(())
}

#[tokio::test]
async fn a_leader_that_cannot_renew_steps_down() -> Result<()> {
    let srv = start().await?;
    let a = LeaderElector::spawn(kube_client(&srv), lease_config("replica-a"));
    wait_leader(&a, Duration::from_secs(5)).await?;
    srv.set_unavailable(true);
    let down = Instant::now();
    let mut rx = a.changes();
    tokio::time::timeout(Duration::from_secs(4), rx.wait_for(|l| !*l))
        .await
        .context("still leading without renewals")??;
    let after = down.elapsed();
    assert!(
        after >= Duration::from_millis(1500) && after <= Duration::from_millis(2800),
        "stepped down {after:?} after renewals began failing (lease 2 s)"
    );
    srv.set_unavailable(false);
    wait_leader(&a, Duration::from_secs(3)).await?;
    Ok(())
}

fn regs() -> Vec<Registration> {
    vec![
        Registration {
            group: "example.com".into(),
            version: "v1".into(),
            port: 9100,
        },
        Registration {
            group: "stable.example.io".into(),
            version: "v1beta1".into(),
            port: 9101,
        },
    ]
}

fn writes(srv: &FakeApiServer) -> Vec<String> {
    srv.requests()
        .into_iter()
        .filter(|r| !r.starts_with("GET "))
        .collect()
}

#[tokio::test]
async fn registration_creates_repairs_and_never_deletes() -> Result<()> {
    let srv = start().await?;
    let client = kube_client(&srv);
    let cfg = RegistrarConfig::local(b"CA PEM".to_vec());
    register_all(&client, &cfg, &regs()).await?;
    assert_eq!(
        writes(&srv),
        [
            "POST /apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
            "POST /apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
            "POST /api/v1/namespaces/kube-system/services",
            "POST /apis/apiregistration.k8s.io/v1/apiservices",
            "POST /api/v1/namespaces/kube-system/services",
            "POST /apis/apiregistration.k8s.io/v1/apiservices",
        ]
    );
    let api = srv
        .object(&format!("{APISERVICES}/v1beta1.stable.example.io"))
        .context("apiservice")?;
    assert_eq!(
        api["spec"]["service"]["name"],
        "proxy-stable-example-io-v1beta1"
    );
    assert_eq!(api["spec"]["service"]["port"], 9101);
    assert_eq!(api["spec"]["caBundle"], "Q0EgUEVN");
    let svc = srv
        .object(&format!("{SERVICES}/proxy-example-com-v1"))
        .context("service")?;
    assert_eq!(svc["spec"]["externalName"], "localhost");
    assert_eq!(
        svc["metadata"]["labels"]["vcluster.loft.sh/protected"],
        "resource-proxy"
    );

    // Up to date: a second pass only reads.
    srv.clear_requests();
    register_all(&client, &cfg, &regs()).await?;
    assert_eq!(writes(&srv), Vec::<String>::new());

    // Someone strips the label and changes the CA; the service gets a foreign label.
    let mut api = srv
        .object(&format!("{APISERVICES}/v1.example.com"))
        .context("apiservice")?;
    api["metadata"]["labels"] = json!({});
    api["spec"]["caBundle"] = json!("b3RoZXI=");
    srv.client()
        .replace(&format!("{APISERVICES}/v1.example.com"), &api)
        .await?;
    let mut svc = srv
        .object(&format!("{SERVICES}/proxy-example-com-v1"))
        .context("service")?;
    svc["metadata"]["labels"]["team"] = json!("platform");
    srv.client()
        .replace(&format!("{SERVICES}/proxy-example-com-v1"), &svc)
        .await?;
    srv.clear_requests();
    register_all(&client, &cfg, &regs()).await?;
    assert_eq!(
        writes(&srv),
        ["PUT /apis/apiregistration.k8s.io/v1/apiservices/v1.example.com"]
    );
    let api = srv
        .object(&format!("{APISERVICES}/v1.example.com"))
        .context("apiservice")?;
    assert_eq!(api["spec"]["caBundle"], "Q0EgUEVN");
    assert_eq!(
        api["metadata"]["labels"]["vcluster.loft.sh/protected"],
        "resource-proxy"
    );

    // Dropping a group/version from the config leaves its objects alone.
    srv.clear_requests();
    register_all(&client, &cfg, &regs()[..1]).await?;
    assert_eq!(writes(&srv), Vec::<String>::new());
    assert!(srv
        .object(&format!("{APISERVICES}/v1beta1.stable.example.io"))
        .is_some());

    // A failing API server is reported, naming the object.
    srv.set_unavailable(true);
    let err = register_all(&client, &cfg, &regs())
        .await
        .expect_err("unavailable");
    assert!(err.to_string().contains("6 objects failed"), "{err}");
    assert!(
        srv.requests().iter().all(|r| !r.starts_with("DELETE ")),
        "never deletes"
    );
    Ok(())
}

#[tokio::test]
async fn only_the_leader_registers() -> Result<()> {
    let srv = start().await?;
    let cfg = RegistrarConfig::local(b"CA".to_vec());
    let follower = spawn_registrar(
        kube_client(&srv),
        cfg.clone(),
        regs(),
        LeaderHandle::fixed(false),
        Duration::from_millis(100),
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        srv.requests(),
        Vec::<String>::new(),
        "a follower touches nothing"
    );
    follower.abort();

    let leader = LeaderElector::spawn(kube_client(&srv), lease_config("replica-a"));
    let registrar = spawn_registrar(
        kube_client(&srv),
        cfg,
        regs(),
        leader.clone(),
        Duration::from_millis(200),
    );
    wait_leader(&leader, Duration::from_secs(5)).await?;
    let path = format!("{APISERVICES}/v1.example.com");
    let deadline = Instant::now() + Duration::from_secs(5);
    while srv.object(&path).is_none() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "not registered on leadership gain"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Repair on the interval: a deleted Service comes back (the fake has no admission).
    let svc_path = format!("{SERVICES}/proxy-example-com-v1");
    srv.client().delete(&svc_path).await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while srv.object(&svc_path).is_none() {
        anyhow::ensure!(Instant::now() < deadline, "not repaired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Releasing leadership ends the registrar with the election.
    leader.release().await;
    tokio::time::timeout(Duration::from_secs(2), registrar)
        .await
        .context("registrar outlived the election")??;
    Ok(())
}

#[tokio::test]
async fn wiring_stops_registering_before_it_releases() -> Result<()> {
    let srv = start().await?;
    let wiring = spawn_wiring(
        kube_client(&srv),
        lease_config("replica-a"),
        RegistrarConfig::local(b"CA".to_vec()),
        regs(),
        Duration::from_millis(100),
    );
    wait_leader(wiring.leader(), Duration::from_secs(5)).await?;
    let path = format!("{APISERVICES}/v1.example.com");
    let deadline = Instant::now() + Duration::from_secs(5);
    while srv.object(&path).is_none() {
        anyhow::ensure!(Instant::now() < deadline, "not registered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wiring.stop().await;
    assert_eq!(
        srv.object(LEASE).context("lease")?["spec"]["holderIdentity"],
        ""
    );
    srv.clear_requests();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        srv.requests(),
        Vec::<String>::new(),
        "nothing runs after stop"
    );
    Ok(())
}
