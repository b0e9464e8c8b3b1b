//! The supervisor's hand-over, against clusters that are not there: a tenant that
//! accepts connections and never answers, a host that refuses them.

use super::*;
use crproxy_core::config::sync::WriteThroughPlan;
use prometheus_client::registry::Registry;

/// A tenant API server that accepts connections and never answers; the listener task
/// holds the sockets (at most a few) until the test's runtime ends.
async fn silent_tenant() -> kube::Client {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let mut held = Vec::new();
        for _ in 0..8 {
            match tokio::time::timeout(Duration::from_secs(30), listener.accept()).await {
                Ok(Ok((socket, _))) => held.push(socket),
                _ => break,
            }
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
    let config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
    kube::Client::try_from(config).expect("client")
}

fn unreachable_host() -> kube::Client {
    let config = kube::Config::new("http://127.0.0.1:1".parse().expect("url"));
    kube::Client::try_from(config).expect("client")
}

fn leading(metrics: &SyncMetrics) -> bool {
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    text.lines().any(|l| l == "vcluster_syncer_leader 1")
}

/// A leader that stops closes write-through at once: a review arriving while it
/// takes itself out of the Service (up to 5 s against a tenant that does not answer)
/// gets 503 instead of being accepted by a replica whose syncers are stopping, whose
/// frozen cache could then never confirm it.
#[tokio::test]
async fn a_stopping_leader_closes_write_through_before_it_withdraws_its_endpoint() {
    let gate = Gate::new();
    let metrics = SyncMetrics::new();
    let supervisor = Supervisor {
        host: unreachable_host(),
        tenant: silent_tenant().await,
        plan: SyncPlan {
            tenant: "client".into(),
            host_kubeconfig: String::new(),
            host_namespace: "vcluster-client".into(),
            resources: vec![],
            write_through: WriteThroughPlan {
                listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
                endpoint: WebhookEndpoint::Service {
                    namespace: "kube-system".into(),
                    name: "crproxy-writethrough".into(),
                    port: 443,
                },
            },
        },
        resolved: vec![],
        metrics: Arc::clone(&metrics),
        resync: DEFAULT_RESYNC,
        gates: HashMap::from([("gateways.example.net/v1".to_owned(), Arc::clone(&gate))]),
        registration: None,
        leader_endpoint: Some(LeaderEndpoint {
            namespace: "kube-system".into(),
            name: "crproxy-writethrough".into(),
            service_port: 443,
            ip: IpAddr::from([127, 0, 0, 1]),
            listen_port: 9443,
        }),
    };
    let (shutdown, shutdown_rx) = watch::channel(false);
    let _task = AbortOnDrop(tokio::spawn(
        supervisor.run(LeaderHandle::fixed(true), shutdown_rx),
    ));
    let mut led = false;
    for _ in 0..100 {
        if leading(&metrics) {
            led = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(led, "the supervisor never started leading");
    // As the syncer does once its caches are synced.
    gate.open_term().caches_synced(
        store(&ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("example.net", "v1", "Gateway"),
            "gateways",
        ))
        .0,
    );
    assert!(gate.is_synced());

    shutdown.send(true).expect("the supervisor listens");
    let mut closed = false;
    for _ in 0..50 {
        if !gate.is_synced() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        closed,
        "write-through still answered 1 s after the stop (while withdrawing the endpoint)"
    );
}
