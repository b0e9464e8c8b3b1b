//! The control plane through API server faults, on real devclusters over real TLS:
//! the wiring (leader election and registration), the client namespace cache and
//! the EndpointSlice peer source survive an API server that stops and starts
//! again on the same port and data, and a watch whose connection stalls without
//! closing stops being trusted, then recovers.
//!
//! Real time: the watches ask for a 3 s server-side lifetime, so a stall is
//! noticed after 5 s; the lease lasts 15 s. Every wait is bounded; the two tests take about a minute
//! together, most of it the stalled connection waiting for HTTP/2 keep-alive to
//! give it up.
//!
//! In the real-time group (tests that mostly wait on real clocks): a plain
//! `cargo test` lists them as ignored; `scripts/test` runs them with `--ignored`
//! beside the rest of the suite.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::Api;
use serde_json::json;
use tokio::task::JoinHandle;

use crproxy_kube::{Auth, ClusterConfig};
use crproxy_proxy::dial::Dialer;
use crproxy_proxy::metrics::Metrics;
use crproxy_proxy::namespaces::{ClientNamespaces, NamespaceState};
use crproxy_proxy::pool::PeerPool;
use crproxy_proxy::sources::{self, PeerSourceConfig};
use crproxy_proxy::watches::WatchClient;
use devcluster::{DevCluster, DevClusterConfig};
use test_support::relay::Relay;

/// Server-side lifetime of the watches under test; stalls count after 5 s.
const LIFETIME_SECONDS: u32 = 3;
const SERVICE: &str = "crproxy-peers";

/// Polls `check` every 100 ms until it holds, for at most `limit`.
async fn eventually(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within {limit:?}");
}

fn cluster_config(cluster: &DevCluster, addr: SocketAddr) -> ClusterConfig {
    let url = url_for(addr);
    let mut config = ClusterConfig::new(url);
    config.ca_pem = Some(cluster.ca_pem().into_bytes());
    config.auth = Auth::Token(cluster.admin_token());
    config
}

fn url_for(addr: SocketAddr) -> url::Url {
    url::Url::parse(&format!("https://{addr}")).expect("url")
}

fn admin(cluster: &DevCluster) -> kube::Client {
    let config = cluster_config(cluster, cluster.addr());
    let credentials = config.credentials().expect("credentials");
    crproxy_kube::kube_client(&config, credentials, "default").expect("client")
}

fn watch_client(config: &ClusterConfig) -> WatchClient {
    let access = crproxy_kube::ClusterAccess::new(config.clone()).expect("credentials");
    WatchClient::with_lifetime(&access, LIFETIME_SECONDS).expect("watch client")
}

async fn create_namespace(client: &kube::Client, name: &str) {
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace created");
}

/// Creates or replaces the one EndpointSlice of [`SERVICE`], with one ready
/// endpoint at `address`.
async fn set_peer(client: &kube::Client, address: &str) {
    let api = Api::<EndpointSlice>::namespaced(client.clone(), "default");
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "peers", "labels": {"kubernetes.io/service-name": SERVICE}},
        "addressType": "IPv4",
        "ports": [{"name": "https", "port": 6443}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": true}}],
    }))
    .expect("slice");
    let _ = api.delete("peers", &DeleteParams::default()).await;
    api.create(&PostParams::default(), &slice)
        .await
        .expect("slice created");
}

/// A pool fed by the EndpointSlice source over `watch`.
fn peer_pool(watch: WatchClient) -> (Arc<PeerPool>, JoinHandle<()>) {
    let tls = test_support::client_config_without_roots();
    let dialer = Dialer::new(
        Arc::new(tls),
        rustls::pki_types::ServerName::try_from("target.example").expect("name"),
    );
    let pool = PeerPool::new(
        "example.com/v1".into(),
        dialer,
        Metrics::new().target("p-default/target"),
    );
    let task = sources::spawn(
        PeerSourceConfig::EndpointSlices {
            client: watch,
            namespace: "default".into(),
            service: SERVICE.into(),
            port_name: Some("https".into()),
        },
        vec![Arc::clone(&pool)],
    );
    (pool, task)
}

/// Leader election and registration of one group/version, as `crproxy run` starts
/// them, with a 1 s renewal and registration interval.
fn start_wiring(config: &ClusterConfig) -> (crproxy_wiring::LeaderHandle, JoinHandle<()>) {
    let client = crproxy_kube::kube_client_without_retries(
        config,
        config.credentials().expect("credentials"),
        "default",
    )
    .expect("wiring client");
    let leader = crproxy_wiring::LeaderElector::spawn(
        client.clone(),
        crproxy_wiring::LeaseConfig {
            renew_interval: Duration::from_secs(1),
            retry_interval: Duration::from_secs(1),
            ..crproxy_wiring::LeaseConfig::new("kube-system", "crproxy-client", "replica-1")
        },
    );
    let ca = config.ca_pem.clone().unwrap_or_default();
    let registrar = crproxy_wiring::spawn_registrar(
        client,
        crproxy_wiring::RegistrarConfig::local(ca),
        vec![crproxy_wiring::Registration {
            group: "example.com".into(),
            version: "v1".into(),
            port: 1,
        }],
        leader.clone(),
        Duration::from_secs(1),
    );
    (leader, registrar)
}

fn apiservice_api(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "apiregistration.k8s.io",
            "v1",
            "APIService",
        )),
    )
}

/// The registered APIService's service port (the registrar writes 1).
async fn apiservice_port(apiservices: &Api<DynamicObject>) -> Option<u64> {
    apiservices
        .get("v1.example.com")
        .await
        .ok()
        .and_then(|a| a.data["spec"]["service"]["port"].as_u64())
}

/// Edits the APIService behind the registrar's back. Deleting it is refused (the
/// protection policy); an edit the registrar undoes shows it at work.
async fn edit_apiservice(apiservices: &Api<DynamicObject>) {
    apiservices
        .patch(
            "v1.example.com",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"service": {"port": 2}}})),
        )
        .await
        .expect("APIService edited");
    assert_eq!(apiservice_port(apiservices).await, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real-time group: scripts/test runs it beside the rest"]
async fn the_control_plane_rides_out_an_api_server_restart() {
    test_support::init_crypto();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = DevClusterConfig::in_memory("client");
    config.data_dir = Some(dir.path().join("client"));
    let cluster = devcluster::start(config.clone()).await.expect("devcluster");
    config.port = cluster.addr().port();
    let admin_client = admin(&cluster);
    create_namespace(&admin_client, "before").await;
    set_peer(&admin_client, "10.0.0.1").await;

    let watches = watch_client(&cluster_config(&cluster, cluster.addr()));
    let namespaces = ClientNamespaces::new();
    let namespace_task = namespaces.spawn_sync(watches.clone());
    let (pool, peer_task) = peer_pool(watches);
    let (leader, registrar) = start_wiring(&cluster_config(&cluster, cluster.addr()));
    let apiservices = apiservice_api(&admin_client);
    let limit = Duration::from_secs(30);
    eventually("everything in step", limit, async || {
        namespaces.state("before") == Some(NamespaceState::Active)
            && pool.hosts() == ["10.0.0.1:6443"]
            && leader.is_leader()
            && apiservices
                .get_opt("v1.example.com")
                .await
                .ok()
                .flatten()
                .is_some()
    })
    .await;

    // The API server stops: the cache notices and stops answering.
    cluster.shutdown().await;
    eventually("the cache gave up", limit, async || {
        namespaces.state("before").is_none()
    })
    .await;
    assert_eq!(
        pool.hosts(),
        ["10.0.0.1:6443"],
        "the last peer list is kept"
    );

    // It starts again on the same port and data; meanwhile-style changes follow.
    let cluster = devcluster::start(config).await.expect("devcluster again");
    let admin_client = admin(&cluster);
    create_namespace(&admin_client, "after").await;
    set_peer(&admin_client, "10.0.0.2").await;
    let apiservices = apiservice_api(&admin_client);
    edit_apiservice(&apiservices).await;
    let leases = Api::<Lease>::namespaced(admin_client.clone(), "kube-system");
    let renewed_before = leases
        .get("crproxy-client")
        .await
        .expect("lease")
        .spec
        .and_then(|s| s.renew_time);
    eventually("everything in step again", limit, async || {
        let lease = leases.get("crproxy-client").await.ok().and_then(|l| l.spec);
        namespaces.state("before") == Some(NamespaceState::Active)
            && namespaces.state("after") == Some(NamespaceState::Active)
            && pool.hosts() == ["10.0.0.2:6443"]
            && pool.snapshot().synced
            && leader.is_leader()
            && lease.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some("replica-1")
            && lease.and_then(|s| s.renew_time) > renewed_before
            && apiservice_port(&apiservices).await == Some(1)
    })
    .await;

    namespace_task.abort();
    peer_task.abort();
    registrar.abort();
    leader.abort();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real-time group: scripts/test runs it beside the rest"]
async fn a_watch_that_stalls_without_closing_stops_being_trusted() {
    let cluster = test_support::devcluster("client").await;
    let admin_client = admin(&cluster.cluster);
    create_namespace(&admin_client, "before").await;
    set_peer(&admin_client, "10.0.0.1").await;
    let relay = Relay::start(cluster.cluster.addr()).await;
    let watches = watch_client(&cluster_config(&cluster.cluster, relay.addr));
    let namespaces = ClientNamespaces::new();
    let namespace_task = namespaces.spawn_sync(watches.clone());
    let (pool, peer_task) = peer_pool(watches);
    let (leader, registrar) = start_wiring(&cluster_config(&cluster.cluster, relay.addr));
    let apiservices = apiservice_api(&admin_client);
    eventually("in step", Duration::from_secs(30), async || {
        namespaces.state("before") == Some(NamespaceState::Active)
            && pool.hosts() == ["10.0.0.1:6443"]
            && leader.is_leader()
            && apiservice_port(&apiservices).await == Some(1)
    })
    .await;

    // The connection stalls; the cluster changes behind it. Within the idle limit
    // the cache stops answering rather than deny the new namespace from stale state.
    relay.freeze();
    create_namespace(&admin_client, "during").await;
    set_peer(&admin_client, "10.0.0.2").await;
    edit_apiservice(&apiservices).await;
    eventually("the cache gave up", Duration::from_secs(15), async || {
        namespaces.state("during").is_none()
    })
    .await;
    assert_eq!(
        pool.hosts(),
        ["10.0.0.1:6443"],
        "the last peer list is kept"
    );

    // A leader cut off from the API server steps down before its lease runs out.
    eventually(
        "the leader stepped down",
        Duration::from_secs(30),
        async || !leader.is_leader(),
    )
    .await;

    // The path heals (new connections work; the frozen one is given up by HTTP/2
    // keep-alive): everything follows the cluster again.
    relay.thaw();
    eventually("in step again", Duration::from_secs(120), async || {
        namespaces.state("during") == Some(NamespaceState::Active)
            && pool.hosts() == ["10.0.0.2:6443"]
            && leader.is_leader()
            && apiservice_port(&apiservices).await == Some(1)
    })
    .await;
    namespace_task.abort();
    peer_task.abort();
    registrar.abort();
    leader.abort();
}
