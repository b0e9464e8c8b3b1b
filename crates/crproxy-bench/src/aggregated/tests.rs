use super::*;

use http::{Method, StatusCode};

use crate::driver::{self, closed_loop};
use crate::workload::{collection_path, object_path, widget, ReadPath};
use crproxy_core::ownership::OWNER_VCLUSTER_LABEL;

#[test]
fn the_backend_is_a_selectorless_service_with_a_loopback_endpoint() {
    let objects = backend_objects("127.0.0.1:7443".parse().expect("addr"));
    let kinds: Vec<&str> = objects.iter().map(|(r, _)| r.kind.as_str()).collect();
    assert_eq!(kinds, ["Service", "EndpointSlice", "APIService"]);
    let (_, service) = &objects[0];
    assert!(service["spec"].get("selector").is_none(), "{service}");
    let (_, slice) = &objects[1];
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        service["metadata"]["name"]
    );
    assert_eq!(slice["endpoints"][0]["addresses"][0], "127.0.0.1");
    assert_eq!(slice["ports"][0]["port"], 7443);
    assert_eq!(
        slice["ports"][0]["name"],
        service["spec"]["ports"][0]["name"]
    );
    let (resource, apiservice) = &objects[2];
    assert_eq!(resource.api_version, "apiregistration.k8s.io/v1");
    assert_eq!(apiservice["metadata"]["name"], "v1.example.com");
    assert_eq!(
        apiservice["spec"]["service"]["name"],
        service["metadata"]["name"]
    );
    assert_eq!(apiservice["spec"]["service"]["port"], 443);
}

/// One write and a tiny read workload through a client devcluster whose
/// APIService points at the dev environment's crproxy: the write reaches crproxy
/// (it stamps the owner labels the body did not carry) and every read is
/// answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_through_the_aggregation_layer_reach_crproxy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = crate::test_env(dir.path()).await;
    let client = &env.clients[0];
    let proxy = client
        .proxy()
        .and_then(|p| p.servers.first())
        .map(|(_, addr)| *addr)
        .expect("the in-process proxy serves");
    let layer = AggregationLayer::start(
        &dir.path().join("front"),
        "front",
        &client.cluster.front_proxy_client(),
        proxy,
        Protocol::Http2,
    )
    .await
    .expect("aggregation layer");
    let namespace = "bench-agg";
    let admin_client = crproxy::devenv::admin_client(&client.cluster).expect("admin");
    let admin_target = crproxy::devenv::admin_client(&env.target).expect("admin");
    for admin in [&admin_client, &admin_target] {
        crate::bench::create_namespace(admin, namespace)
            .await
            .expect("namespace");
    }

    let endpoint = &layer.endpoint;
    let mut sender = endpoint.connect().await.expect("connect");
    let body = widget(namespace, "w-0", 0, None, None).to_string();
    let request = endpoint
        .request(
            Method::POST,
            &collection_path(namespace),
            Some(("application/json", bytes::Bytes::from(body))),
        )
        .expect("request");
    let answer = driver::exchange(&mut sender, request, true)
        .await
        .expect("create through the aggregator");
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");

    let widgets: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
        admin_target,
        namespace,
        &kube::api::ApiResource {
            group: GROUP.into(),
            version: VERSION.into(),
            api_version: format!("{GROUP}/{VERSION}"),
            kind: "Widget".into(),
            plural: "widgets".into(),
        },
    );
    let stored = widgets
        .get("w-0")
        .await
        .expect("the widget is on the target");
    assert_eq!(
        stored
            .metadata
            .labels
            .unwrap_or_default()
            .get(OWNER_VCLUSTER_LABEL),
        Some(&client.name),
        "crproxy stamped the owner"
    );

    let workers = endpoint
        .senders(2)
        .await
        .expect("senders")
        .into_iter()
        .map(|s| (s, ()))
        .collect();
    let read = Arc::new(ReadPath {
        path: object_path(namespace, "w-0"),
        min_bytes: 0,
    });
    let (result, _) = closed_loop(
        Arc::clone(endpoint),
        read,
        workers,
        6,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(result.errors, 0, "{:?}", result.first_error);
    assert_eq!(result.latencies.len(), 6);
    layer.shutdown().await;

    // nginx behind its own layer, when installed: it must accept the aggregator's
    // front-proxy certificate and reach the target with the token it was given.
    if let Some(binary) = crate::nginx::find_binary() {
        let token = env
            .target
            .issue_token("bench-nginx", &["system:masters"])
            .expect("token");
        let listen =
            SocketAddr::from(([127, 0, 0, 1], crproxy::devenv::free_port().expect("port")));
        let nginx = crate::nginx::Nginx::start(
            &binary,
            &dir.path().join("nginx"),
            listen,
            crate::nginx::Upstream::devcluster(env.target.addr(), env.target.ca_pem()),
            1,
            Some(crate::nginx::AggregatorBackend {
                front_proxy_ca_pem: client.cluster.front_proxy_ca_pem(),
                target_token: token.clone(),
            }),
        )
        .await
        .expect("nginx starts");
        let layer = AggregationLayer::start(
            &dir.path().join("front-nginx"),
            "front-nginx",
            &client.cluster.front_proxy_client(),
            nginx.addr,
            Protocol::Http2,
        )
        .await
        .expect("aggregation layer in front of nginx");
        let answer = get_object(&layer.endpoint, namespace, "w-0").await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        layer.shutdown().await;
        nginx.stop().await;

        // nginx checks the target's serving certificate, as crproxy does: trusting
        // another CA, it refuses the target instead of forwarding to it.
        let stranger =
            crproxy_core::pki::CertificateAuthority::generate("not-the-target-ca").expect("ca");
        let listen =
            SocketAddr::from(([127, 0, 0, 1], crproxy::devenv::free_port().expect("port")));
        let unverified = crate::nginx::Nginx::start(
            &binary,
            &dir.path().join("nginx-stranger"),
            listen,
            crate::nginx::Upstream::devcluster(env.target.addr(), stranger.pem().cert.clone()),
            1,
            None,
        )
        .await
        .expect("nginx starts");
        let endpoint = driver::Endpoint::new(
            "nginx-stranger",
            unverified.addr,
            Some(&unverified.ca_pem),
            &driver::Identity::Bearer(token),
            Protocol::Http1,
        )
        .expect("endpoint");
        let answer = get_object(&endpoint, namespace, "w-0").await;
        assert_eq!(answer.status, StatusCode::BAD_GATEWAY, "{answer:?}");
        unverified.stop().await;
    } else {
        eprintln!("nginx not installed: its lane behind the aggregator is not checked");
    }
    env.shutdown().await;
}

/// One GET of a widget through `endpoint`, on a connection of its own.
async fn get_object(endpoint: &driver::Endpoint, namespace: &str, name: &str) -> driver::Exchange {
    let mut sender = endpoint.connect().await.expect("connect");
    let request = endpoint
        .request(Method::GET, &object_path(namespace, name), None)
        .expect("request");
    driver::exchange(&mut sender, request, true)
        .await
        .expect("an answer")
}
