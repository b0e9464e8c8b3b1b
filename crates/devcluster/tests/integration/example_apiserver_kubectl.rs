//! The example extension API server (`gateways.example.net/v1`) registered on a
//! devcluster through an APIService, driven by real kubectl through the
//! aggregator: create, the 422 for a bad `spec.port`, get, list, watch replay,
//! conflicts, the status subresource, delete, and 503 once the server stops.

use std::path::Path;
use std::time::Duration;

use devcluster::example_apiserver::ExampleApiServer;
use serde_json::{json, Value};

fn gateway(name: &str, port: Value) -> String {
    json!({"apiVersion": "example.net/v1", "kind": "Gateway",
           "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
           "spec": {"port": port}})
    .to_string()
}

async fn create(kubeconfig: &Path, manifest: &str) -> test_support::KubectlOutput {
    test_support::kubectl_stdin_async(
        kubeconfig,
        &["create", "-f", "-"],
        manifest,
        Duration::from_secs(30),
    )
    .await
}

/// `kubectl apply --server-side -f -` of `manifest` as field manager `manager`.
async fn apply_server_side(
    kubeconfig: &Path,
    manager: &str,
    manifest: &str,
) -> test_support::KubectlOutput {
    let manager = format!("--field-manager={manager}");
    test_support::kubectl_stdin_async(
        kubeconfig,
        &["apply", "--server-side", &manager, "-f", "-"],
        manifest,
        Duration::from_secs(30),
    )
    .await
}

async fn get_json(kubeconfig: &Path, args: &[&str]) -> Value {
    test_support::kubectl_json_async(kubeconfig, args)
        .await
        .expect("kubectl answers with JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_are_served_through_the_aggregator() {
    let test = test_support::devcluster("example-apiserver").await;
    let admin = &test.kubeconfig;
    let server = ExampleApiServer::start(&test.cluster.front_proxy_ca_pem(), None)
        .await
        .expect("example server starts");
    server.register(&test.cluster).await.expect("registered");
    // Registering twice replaces the objects (a restarted server gets a new port).
    server
        .register(&test.cluster)
        .await
        .expect("registered again");

    // The aggregator marks the APIService available and fetches its discovery.
    let ready = crate::poll(crate::Polling::USUAL, move || async move {
        let out = test_support::kubectl_async(admin, &["get", "gateways"]).await;
        out.success().then_some(())
    })
    .await;
    assert!(ready.is_some(), "gateways are served");

    let out = create(admin, &gateway("web", json!(8080))).await;
    assert!(out.success(), "{}", out.stderr);
    let web = get_json(admin, &["get", "gateway", "web", "-o", "json"]).await;
    assert_eq!(web["spec"]["port"], 8080);
    assert_eq!(web["metadata"]["generation"], 1);
    assert!(web["metadata"]["uid"]
        .as_str()
        .is_some_and(|u| !u.is_empty()));

    // Out of range: 422 Invalid naming spec.port; nothing is stored.
    let out = create(admin, &gateway("bad", json!(70000))).await;
    assert!(!out.success());
    assert!(
        out.stderr.contains(
            "The Gateway \"bad\" is invalid: spec.port: Invalid value: 70000: must be between 1 and 65535, inclusive"
        ),
        "{}",
        out.stderr
    );
    let raw = test_support::kubectl_stdin_async(
        admin,
        &[
            "create",
            "-v=6",
            "--raw",
            "/apis/example.net/v1/namespaces/default/gateways",
            "-f",
            "-",
        ],
        &gateway("bad", json!(0)),
        Duration::from_secs(30),
    )
    .await;
    // The status code, as kubectl logs it.
    assert!(
        raw.stderr.contains(" 422 Unprocessable Entity"),
        "{}",
        raw.stderr
    );
    assert!(
        raw.stderr.contains("spec.port: Invalid value: 0"),
        "{}",
        raw.stderr
    );
    assert!(
        !test_support::kubectl_async(admin, &["get", "gateway", "bad"])
            .await
            .success(),
        "a rejected Gateway is not stored"
    );

    // List, then a watch from the list's resourceVersion replays what came after.
    let listed = test_support::kubectl_async(
        admin,
        &[
            "get",
            "--raw",
            "/apis/example.net/v1/namespaces/default/gateways?labelSelector=app%3Dweb",
        ],
    )
    .await;
    let listed: Value = serde_json::from_str(&listed.stdout).expect("list JSON");
    assert_eq!(listed["kind"], "GatewayList");
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(1));
    let list_rv = listed["metadata"]["resourceVersion"]
        .as_str()
        .expect("list resourceVersion")
        .to_string();
    let out = create(admin, &gateway("api", json!(443))).await;
    assert!(out.success(), "{}", out.stderr);
    let watched = test_support::kubectl_async(
        admin,
        &[
            "get",
            "--raw",
            &format!("/apis/example.net/v1/namespaces/default/gateways?watch=true&resourceVersion={list_rv}&timeoutSeconds=1"),
        ],
    )
    .await;
    assert!(watched.success(), "{}", watched.stderr);
    let events: Vec<Value> = watched
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(events.len(), 1, "{}", watched.stdout);
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "api");

    // A stale resourceVersion conflicts; a valid patch bumps the generation.
    let mut stale = web.clone();
    stale["spec"]["port"] = json!(9090);
    let out = test_support::kubectl_async(
        admin,
        &[
            "patch",
            "gateway",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"port":8081}}"#,
        ],
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    let out = test_support::kubectl_stdin_async(
        admin,
        &["replace", "-f", "-"],
        &stale.to_string(),
        Duration::from_secs(30),
    )
    .await;
    assert!(
        out.stderr.contains("the object has been modified; please apply your changes to the latest version and try again"),
        "{}",
        out.stderr
    );
    let out = test_support::kubectl_async(
        admin,
        &[
            "patch",
            "gateway",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"port":99999}}"#,
        ],
    )
    .await;
    assert!(
        out.stderr.contains("spec.port: Invalid value: 99999"),
        "{}",
        out.stderr
    );
    let web = get_json(admin, &["get", "gateway", "web", "-o", "json"]).await;
    assert_eq!(web["spec"]["port"], 8081);
    assert_eq!(web["metadata"]["generation"], 2);

    // Server-side apply creates and updates, and tracks who owns spec.port.
    let applied = json!({"apiVersion": "example.net/v1", "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "default"}, "spec": {"port": 8443}})
    .to_string();
    for _ in 0..2 {
        let out = apply_server_side(admin, "team-a", &applied).await;
        assert!(out.success(), "{}", out.stderr);
    }
    let takeover = applied.replace("8443", "9443");
    let out = apply_server_side(admin, "team-b", &takeover).await;
    assert!(
        out.stderr.contains("Apply failed with 1 conflict"),
        "{}",
        out.stderr
    );
    let edge = get_json(admin, &["get", "gateway", "edge", "-o", "json"]).await;
    assert_eq!(edge["spec"]["port"], 8443);
    // A configuration naming a uid applies to that object only: with none there,
    // it creates nothing (kube's patcher: "uid mismatch").
    let ghost = json!({"apiVersion": "example.net/v1", "kind": "Gateway",
        "metadata": {"name": "ghost", "namespace": "default",
                     "uid": "6d1c2a4e-0000-4000-8000-000000000002"},
        "spec": {"port": 8443}})
    .to_string();
    let out = apply_server_side(admin, "team-a", &ghost).await;
    assert!(
        !out.success() && out.stderr.contains("Operation cannot be fulfilled on gateways.example.net \"ghost\": uid mismatch: the provided object specified uid 6d1c2a4e-0000-4000-8000-000000000002, and no existing object was found"),
        "{}",
        out.stderr
    );
    let ghost = test_support::kubectl_async(admin, &["get", "gateway", "ghost"]).await;
    assert!(
        ghost
            .stderr
            .contains("gateways.example.net \"ghost\" not found"),
        "the apply created ghost: {ghost:?}"
    );
    let by_name = test_support::kubectl_async(
        admin,
        &[
            "get",
            "--raw",
            "/apis/example.net/v1/gateways?fieldSelector=metadata.name%3Dedge",
        ],
    )
    .await;
    let by_name: Value = serde_json::from_str(&by_name.stdout).expect("list JSON");
    assert_eq!(by_name["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(by_name["items"][0]["metadata"]["name"], "edge");

    // Status changes only through the status subresource.
    let out = test_support::kubectl_async(
        admin,
        &[
            "patch",
            "gateway",
            "web",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"ready":true}}"#,
        ],
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    let out = test_support::kubectl_async(
        admin,
        &[
            "patch",
            "gateway",
            "web",
            "--type=merge",
            "-p",
            r#"{"status":{"ready":false}}"#,
        ],
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    let web = get_json(admin, &["get", "gateway", "web", "-o", "json"]).await;
    assert_eq!(web["status"]["ready"], true);

    // Delete.
    let out = test_support::kubectl_async(admin, &["delete", "gateway", "api"]).await;
    assert!(out.success(), "{}", out.stderr);
    let out = test_support::kubectl_async(admin, &["get", "gateway", "api"]).await;
    assert!(
        out.stderr
            .contains("gateways.example.net \"api\" not found"),
        "{}",
        out.stderr
    );

    // The server stops: the aggregator answers 503.
    server.stop();
    let bounds = crate::Polling {
        attempts: 50,
        ..crate::Polling::USUAL
    };
    let unavailable = crate::poll(bounds, move || async move {
        let out = test_support::kubectl_async(
            admin,
            &[
                "get",
                "--raw",
                "/apis/example.net/v1/namespaces/default/gateways",
            ],
        )
        .await;
        (!out.success()).then_some(out.stderr)
    })
    .await
    .unwrap_or_default();
    assert!(
        unavailable.contains("ServiceUnavailable") || unavailable.contains("503"),
        "{unavailable}"
    );
}

/// Starts the example server with `state_file`, registers it and waits until the
/// aggregator serves it.
async fn start_served(test: &test_support::TestCluster, state_file: &Path) -> ExampleApiServer {
    let server = ExampleApiServer::start(
        &test.cluster.front_proxy_ca_pem(),
        Some(state_file.to_path_buf()),
    )
    .await
    .expect("example server starts");
    server.register(&test.cluster).await.expect("registered");
    let kubeconfig = &test.kubeconfig;
    let served = crate::poll(crate::Polling::USUAL, move || async move {
        let out = test_support::kubectl_async(kubeconfig, &["get", "gateways"]).await;
        out.success().then_some(())
    })
    .await;
    assert!(served.is_some(), "gateways are not served");
    server
}

/// With a state file, a restarted server serves the Gateways it acknowledged (same
/// uid and resourceVersion) and hands out later resourceVersions; a dry run saves
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_survive_a_restart_with_a_state_file() {
    let test = test_support::devcluster("example-apiserver-state").await;
    let admin = &test.kubeconfig;
    let dir = tempfile::tempdir().expect("tempdir");
    let state_file = dir.path().join("host").join("gateways.json");

    let server = start_served(&test, &state_file).await;
    let out = create(admin, &gateway("kept", json!(443))).await;
    assert!(out.success(), "{}", out.stderr);
    let out = test_support::kubectl_stdin_async(
        admin,
        &["create", "--dry-run=server", "-f", "-"],
        &gateway("dry", json!(443)),
        Duration::from_secs(30),
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    let before = get_json(admin, &["get", "gateway", "kept", "-o", "json"]).await;
    server.stop();
    drop(server);

    let server = start_served(&test, &state_file).await;
    let after = get_json(admin, &["get", "gateway", "kept", "-o", "json"]).await;
    assert_eq!(after, before, "the same object after the restart");
    let list = get_json(admin, &["get", "gateways", "-o", "json"]).await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1), "{list}");
    let out = create(admin, &gateway("later", json!(80))).await;
    assert!(out.success(), "{}", out.stderr);
    let later = get_json(admin, &["get", "gateway", "later", "-o", "json"]).await;
    let rv = |o: &Value| {
        o["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_default()
    };
    assert!(rv(&later) > rv(&before), "{later}");
    server.stop();

    // A damaged file stops the start with one line naming it.
    std::fs::write(&state_file, "{").expect("damaged");
    let err =
        match ExampleApiServer::start(&test.cluster.front_proxy_ca_pem(), Some(state_file.clone()))
            .await
        {
            Ok(_) => panic!("a damaged state file was accepted"),
            Err(e) => e.to_string(),
        };
    assert!(
        err.contains("gateways.json") && err.contains("not JSON"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
}

/// `method path` sent straight to the example server with the front proxy's
/// client certificate (what the aggregator presents); status, headers, body.
async fn example_server_request(
    test: &test_support::TestCluster,
    server: &ExampleApiServer,
    path: &str,
) -> (http::StatusCode, http::HeaderMap, bytes::Bytes) {
    use http_body_util::BodyExt;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let exchange = async {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(server.ca_pem().as_bytes()) {
            roots.add(cert.expect("pem")).expect("root");
        }
        let client = test.cluster.front_proxy_client();
        let chain = CertificateDer::pem_slice_iter(client.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("client chain");
        let key = PrivateKeyDer::from_pem_slice(client.key.as_bytes()).expect("client key");
        let provider = std::sync::Arc::new(crproxy_kube::crypto_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .expect("client auth");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let tcp = tokio::net::TcpStream::connect(server.addr())
            .await
            .expect("connect");
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
            .connect(name, tcp)
            .await
            .expect("tls");
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .expect("handshake");
        tokio::spawn(conn);
        let request = http::Request::get(path)
            .header("host", server.addr().to_string())
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("request");
        let response = sender.send_request(request).await.expect("response");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        (parts.status, parts.headers, body)
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the example server answers within 10 s")
}

/// The example server's health endpoints answer as kube's `handleRootHealth`
/// does, headers included; its checks have their own paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_server_health_has_kubes_headers() {
    let test = test_support::devcluster("example-health").await;
    let server = ExampleApiServer::start(&test.cluster.front_proxy_ca_pem(), None)
        .await
        .expect("example server starts");
    for endpoint in ["/healthz", "/livez", "/readyz"] {
        let (code, h, body) = example_server_request(&test, &server, endpoint).await;
        assert_eq!(code, 200, "{endpoint}");
        assert_eq!(body, "ok", "{endpoint}");
        let header = |name: &str| {
            h.get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        assert_eq!(
            header("content-type").as_deref(),
            Some("text/plain; charset=utf-8"),
            "{endpoint}"
        );
        assert_eq!(
            header("x-content-type-options").as_deref(),
            Some("nosniff"),
            "{endpoint}"
        );
        let (code, _, body) =
            example_server_request(&test, &server, &format!("{endpoint}/ping")).await;
        assert_eq!(
            (code.as_u16(), &body[..]),
            (200, &b"ok"[..]),
            "{endpoint}/ping"
        );
    }
    let (_, _, body) = example_server_request(&test, &server, "/readyz?verbose").await;
    assert_eq!(
        body,
        "[+]ping ok\n[+]log ok\n[+]informer-sync ok\n[+]shutdown ok\nreadyz check passed\n"
    );
    server.stop();
}
