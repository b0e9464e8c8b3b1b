//! One request to a devcluster as its admin over a connection of the test's own,
//! for what kubectl cannot send or does not show: a method, headers, the
//! protocol, and the answer's exact framing.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// The protocol the request goes over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
}

/// `method` on `path` as the admin, with `extra` request headers, over
/// `protocol`; the answer's status, headers and whole body. Bounded by 10 s.
pub async fn admin_request(
    test: &test_support::TestCluster,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    protocol: Protocol,
) -> (http::StatusCode, http::HeaderMap, Bytes) {
    let token = test.cluster.admin_token();
    request_as(test, Some(&token), method, path, extra, protocol).await
}

/// [`admin_request`] with the bearer `token` instead of the admin's (`None`:
/// no credentials, so `system:anonymous`).
pub async fn request_as(
    test: &test_support::TestCluster,
    token: Option<&str>,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    protocol: Protocol,
) -> (http::StatusCode, http::HeaderMap, Bytes) {
    request_with_body(test, token, method, path, extra, protocol, Bytes::new()).await
}

/// [`request_as`] sending `body`.
async fn request_with_body(
    test: &test_support::TestCluster,
    token: Option<&str>,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    protocol: Protocol,
    body: Bytes,
) -> (http::StatusCode, http::HeaderMap, Bytes) {
    let exchange = async {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(test.cluster.ca_pem().as_bytes()) {
            roots.add(cert.expect("pem")).expect("root");
        }
        let provider = Arc::new(crproxy_kube::crypto_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = match protocol {
            Protocol::Http1 => vec![b"http/1.1".to_vec()],
            Protocol::Http2 => vec![b"h2".to_vec()],
        };
        let addr = test.cluster.addr();
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", addr.port()))
            .await
            .expect("connect");
        let server_name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(server_name, tcp)
            .await
            .expect("tls");
        let authority = format!("127.0.0.1:{}", addr.port());
        let mut request = match protocol {
            Protocol::Http1 => http::Request::builder().uri(path).header("host", authority),
            Protocol::Http2 => http::Request::builder().uri(format!("https://{authority}{path}")),
        }
        .method(method);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(body)).expect("request");
        let response = match protocol {
            Protocol::Http1 => {
                let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                    .await
                    .expect("handshake");
                tokio::spawn(conn);
                sender.send_request(request).await
            }
            Protocol::Http2 => {
                let (mut sender, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                        .await
                        .expect("handshake");
                tokio::spawn(conn);
                sender.send_request(request).await
            }
        }
        .expect("response");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        (parts.status, parts.headers, body)
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the cluster answers within 10 s")
}

/// A devcluster named `name` serving the CronTab custom resource, with one
/// CronTab, `default/kept`, applied through kubectl.
async fn cluster_with_a_crontab(name: &str) -> test_support::TestCluster {
    let test = test_support::devcluster(name).await;
    crate::kubectl_access::install_crontabs(&test.kubeconfig).await;
    let crontab = "apiVersion: stable.example.io/v1\nkind: CronTab\nmetadata:\n  name: kept\n  namespace: default\nspec:\n  cronSpec: '* * * * */5'\n";
    apply(&test, crontab).await;
    test
}

/// A HEAD is answered as kube's Go server answers it: the GET's status and
/// headers, a Content-Length exactly where the GET has one (a short answer, or
/// one whose length its handler named), and no body, over either protocol.
/// hyper's HTTP/2 server used to send the body, which Go's client refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_is_answered_as_its_get_without_a_body() {
    let test = test_support::devcluster("head").await;
    for protocol in [Protocol::Http1, Protocol::Http2] {
        for (path, status) in [
            ("/api/v1/namespaces/default", 200),
            ("/api/v1/namespaces/missing", 404),
            ("/api/v1/namespaces", 200),
            ("/apis", 200),
            // Longer than Go's buffer on either protocol: no Content-Length.
            ("/apis/rbac.authorization.k8s.io/v1/clusterroles", 200),
            ("/openapi/v2", 200),
        ] {
            let (get_status, get_headers, get_body) =
                admin_request(&test, "GET", path, &[], protocol).await;
            assert_eq!(get_status, status, "GET {path} over {protocol:?}");
            assert!(!get_body.is_empty(), "GET {path} over {protocol:?}");
            let (head_status, head_headers, head_body) =
                admin_request(&test, "HEAD", path, &[], protocol).await;
            assert_eq!(head_status, status, "HEAD {path} over {protocol:?}");
            assert!(
                head_body.is_empty(),
                "HEAD {path} over {protocol:?} had a body of {} bytes",
                head_body.len()
            );
            for header in ["content-type", "content-length"] {
                assert_eq!(
                    head_headers.get(header),
                    get_headers.get(header),
                    "HEAD {path} over {protocol:?}: {header}"
                );
            }
        }
    }
}

/// The values of header `name` in `headers`, as text.
pub fn values<'a>(headers: &'a http::HeaderMap, name: &str) -> Vec<&'a str> {
    headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("text header"))
        .collect()
}

/// The one value of header `name`, which must be there exactly once.
fn one(headers: &http::HeaderMap, name: &str, what: &str) -> String {
    let all = values(headers, name);
    assert_eq!(all.len(), 1, "{what}: {name} {all:?}");
    all.into_iter().next().unwrap_or_default().to_string()
}

const FLOW_SCHEMA: &str = "x-kubernetes-pf-flowschema-uid";
const PRIORITY_LEVEL: &str = "x-kubernetes-pf-prioritylevel-uid";
const NOSNIFF: &str = "x-content-type-options";

/// Every kind of answer carries an `Audit-Id`: the caller's when it sent one,
/// else a new UUID per request (kube's WithAuditInit). Objects, errors (401,
/// JSON and plain 404), a watch's stream and a HEAD, over either protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_the_callers_audit_id_or_a_new_one() {
    let test = test_support::devcluster("audit-id").await;
    let cases: [(Option<&str>, &str, &str, u16); 12] = [
        (None, "GET", "/api/v1/namespaces/default", 200),
        (None, "GET", "/api/v1/namespaces/missing", 404),
        (None, "GET", "/apis/nope.example.io/v1/things", 404),
        // An empty group is none, whatever follows it.
        (None, "GET", "/apis//v1/things", 404),
        (None, "GET", "/apis//v1/namespaces/default/configmaps", 404),
        (None, "GET", "/apis//v1", 404),
        (None, "GET", "/apis//apps", 404),
        (None, "GET", "/openapi/v3/apis//v1", 404),
        (None, "GET", "/apis/apps", 200),
        (
            None,
            "GET",
            "/api/v1/namespaces?watch=true&timeoutSeconds=1",
            200,
        ),
        (None, "HEAD", "/api/v1/namespaces/default", 200),
        (Some("not-a-real-token"), "GET", "/version", 401),
    ];
    for protocol in [Protocol::Http1, Protocol::Http2] {
        for (bad_token, method, path, status) in cases {
            let what = format!("{method} {path} over {protocol:?}");
            let admin = test.cluster.admin_token();
            let token = bad_token.unwrap_or(&admin);
            let sent = [("Audit-Id", "chosen-by-the-test")];
            let (code, headers, _) =
                request_as(&test, Some(token), method, path, &sent, protocol).await;
            assert_eq!(code.as_u16(), status, "{what}");
            assert_eq!(one(&headers, "audit-id", &what), "chosen-by-the-test");

            let (_, first, _) = request_as(&test, Some(token), method, path, &[], protocol).await;
            let (_, second, _) = request_as(&test, Some(token), method, path, &[], protocol).await;
            let (first, second) = (
                one(&first, "audit-id", &what),
                one(&second, "audit-id", &what),
            );
            for id in [&first, &second] {
                assert!(
                    uuid::Uuid::parse_str(id).is_ok() && id.len() == 36,
                    "{what}: {id}"
                );
            }
            assert_ne!(first, second, "{what}: a new ID per request");
        }
    }
}

/// The priority-and-fairness UIDs are there once a request passed
/// authentication and impersonation (a 403 from RBAC has them), not on a 401
/// or a refused impersonation; they are the same for every request of a flow
/// schema. `X-Content-Type-Options: nosniff` comes with kube's Forbidden
/// writer (RBAC and impersonation refusals) and Go's plain-text 404, not with
/// a 401 or a JSON 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_schema_uids_follow_authentication_and_nosniff_follows_forbidden() {
    let test = test_support::devcluster("flow-schemas").await;
    let alice = test
        .cluster
        .issue_token("alice", &["developers"])
        .expect("token");
    let admin = test.cluster.admin_token();
    let crontabs = "/apis/stable.example.io/v1/namespaces/default/crontabs";
    for protocol in [Protocol::Http1, Protocol::Http2] {
        let flow = |headers: &http::HeaderMap, what: &str| {
            (
                one(headers, FLOW_SCHEMA, what),
                one(headers, PRIORITY_LEVEL, what),
            )
        };
        let send = |token: Option<String>, path: &str, extra: Vec<(&'static str, &'static str)>| {
            let path = path.to_string();
            let test = &test;
            async move { request_as(test, token.as_deref(), "GET", &path, &extra, protocol).await }
        };

        // The admin (system:masters): the exempt schema, the same UIDs each time.
        let (code, h, _) = send(Some(admin.clone()), "/api/v1/namespaces", vec![]).await;
        assert_eq!(code, 200);
        let exempt = flow(&h, "admin");
        let (_, h, _) = send(Some(admin.clone()), "/version", vec![]).await;
        assert_eq!(flow(&h, "admin again"), exempt);
        assert!(h.get(NOSNIFF).is_none());

        // alice, refused by RBAC: classified (global-default) before authorization.
        let (code, h, _) = send(Some(alice.clone()), crontabs, vec![]).await;
        assert_eq!(code, 403);
        let global_default = flow(&h, "alice refused");
        assert_ne!(global_default.0, exempt.0);
        assert_ne!(global_default.1, exempt.1);
        assert_eq!(one(&h, NOSNIFF, "alice refused"), "nosniff");
        // Anonymous requests share alice's schema.
        let (code, h, _) = send(None, "/version", vec![]).await;
        assert_eq!(code, 200);
        assert_eq!(flow(&h, "anonymous"), global_default);
        // Health probes by anyone: the probes schema, at the exempt level.
        let (code, h, _) = send(Some(alice.clone()), "/healthz", vec![]).await;
        assert_eq!(code, 200);
        let probes = flow(&h, "alice's probe");
        assert_ne!(probes.0, global_default.0);
        assert_ne!(probes.0, exempt.0);
        assert_eq!(probes.1, exempt.1);
        // The admin, impersonating alice, is classified as alice.
        let (code, h, _) = send(
            Some(admin.clone()),
            crontabs,
            vec![("Impersonate-User", "alice")],
        )
        .await;
        assert_eq!(code, 403);
        assert_eq!(flow(&h, "admin as alice"), global_default);

        // Refused before priority and fairness: no flow UIDs.
        let (code, h, _) = send(Some("not-a-real-token".into()), crontabs, vec![]).await;
        assert_eq!(code, 401);
        for name in [FLOW_SCHEMA, PRIORITY_LEVEL, NOSNIFF] {
            assert!(h.get(name).is_none(), "401: {name}");
        }
        let (code, h, _) = send(
            Some(alice.clone()),
            crontabs,
            vec![("Impersonate-User", "bob")],
        )
        .await;
        assert_eq!(code, 403);
        for name in [FLOW_SCHEMA, PRIORITY_LEVEL] {
            assert!(h.get(name).is_none(), "refused impersonation: {name}");
        }
        assert_eq!(one(&h, NOSNIFF, "refused impersonation"), "nosniff");

        // 404s: nosniff on Go's plain-text one only.
        let (code, h, _) = send(Some(admin.clone()), "/nonexistent", vec![]).await;
        assert_eq!(code, 404);
        assert_eq!(one(&h, NOSNIFF, "plain 404"), "nosniff");
        let (code, h, _) = send(Some(admin.clone()), "/api/v1/namespaces/missing", vec![]).await;
        assert_eq!(code, 404);
        assert!(h.get(NOSNIFF).is_none(), "JSON 404");
    }
}

/// `Cache-Control: no-cache, private` on every answer the handler did not give
/// one: objects, lists, watches, errors and HEADs; aggregated discovery says
/// `public`, on its 304 too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_control_is_no_cache_private_except_on_aggregated_discovery() {
    let test = test_support::devcluster("cache-control").await;
    let admin = test.cluster.admin_token();
    let aggregated = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    for protocol in [Protocol::Http1, Protocol::Http2] {
        for (token, method, path, status) in [
            (admin.as_str(), "GET", "/api/v1/namespaces/default", 200),
            (admin.as_str(), "GET", "/api/v1/namespaces", 200),
            (
                admin.as_str(),
                "GET",
                "/api/v1/namespaces?watch=true&timeoutSeconds=1",
                200,
            ),
            (admin.as_str(), "HEAD", "/api/v1/namespaces/default", 200),
            (admin.as_str(), "GET", "/apis", 200),
            (admin.as_str(), "GET", "/nonexistent", 404),
            ("not-a-real-token", "GET", "/api/v1/namespaces", 401),
        ] {
            let what = format!("{method} {path} over {protocol:?}");
            let (code, h, _) = request_as(&test, Some(token), method, path, &[], protocol).await;
            assert_eq!(code.as_u16(), status, "{what}");
            assert_eq!(one(&h, "cache-control", &what), "no-cache, private");
        }
        let (code, h, _) =
            admin_request(&test, "GET", "/apis", &[("Accept", aggregated)], protocol).await;
        assert_eq!(code, 200);
        assert_eq!(one(&h, "cache-control", "aggregated discovery"), "public");
        let etag = one(&h, "etag", "aggregated discovery");
        let revalidate = [("Accept", aggregated), ("If-None-Match", etag.as_str())];
        let (code, h, _) = admin_request(&test, "GET", "/apis", &revalidate, protocol).await;
        assert_eq!(code, 304);
        assert_eq!(
            one(&h, "cache-control", "aggregated discovery 304"),
            "public"
        );
    }
}

/// The headers of the first answer with `status` to the admin's GET of `path`
/// with `sent` headers, asked up to 100 times 100 ms apart (the aggregator follows
/// the example server's start and stop with a delay); `None` if none came.
async fn first_answer_with(
    status: u16,
    test: &test_support::TestCluster,
    path: &str,
    sent: &[(&str, &str)],
    protocol: Protocol,
) -> Option<http::HeaderMap> {
    crate::poll(crate::Polling::USUAL, move || async move {
        let (code, h, _) = admin_request(test, "GET", path, sent, protocol).await;
        (code == status).then_some(h)
    })
    .await
}

/// An answer relayed from an aggregated API server (the example server, which
/// sends none of these headers itself) carries the front's: the caller's
/// Audit-Id, Cache-Control and the flow UIDs, once each. The aggregator's own
/// 503 once the server is gone carries them too, with nosniff (Go's
/// `http.Error`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_answers_carry_the_fronts_headers() {
    let test = test_support::devcluster("relayed-headers").await;
    let server = devcluster::example_apiserver::ExampleApiServer::start(
        &test.cluster.front_proxy_ca_pem(),
        None,
    )
    .await
    .expect("example server starts");
    server.register(&test.cluster).await.expect("registered");
    let path = "/apis/example.net/v1/namespaces/default/gateways";
    let sent = [("Audit-Id", "relayed-by-the-test")];
    let h = first_answer_with(200, &test, path, &sent, Protocol::Http2)
        .await
        .expect("the example server answers through the aggregator");
    let (_, local, _) = admin_request(&test, "GET", "/version", &[], Protocol::Http2).await;
    assert_eq!(one(&h, "audit-id", "relayed"), "relayed-by-the-test");
    assert_eq!(one(&h, "cache-control", "relayed"), "no-cache, private");
    assert_eq!(
        one(&h, FLOW_SCHEMA, "relayed"),
        one(&local, FLOW_SCHEMA, "local")
    );
    assert_eq!(
        one(&h, PRIORITY_LEVEL, "relayed"),
        one(&local, PRIORITY_LEVEL, "local")
    );

    server.stop();
    let h = first_answer_with(503, &test, path, &sent, Protocol::Http1)
        .await
        .expect("503 once the example server stopped");
    assert_eq!(one(&h, "audit-id", "503"), "relayed-by-the-test");
    assert_eq!(one(&h, "cache-control", "503"), "no-cache, private");
    assert_eq!(one(&h, NOSNIFF, "503"), "nosniff");
    assert!(h.get(FLOW_SCHEMA).is_some(), "503");
}

/// A method kube's RequestInfo has no verb for (OPTIONS, TRACE, CONNECT) on a
/// resource path goes through the filters like any other request, and only the
/// handler refuses it: a bad token gets 401 without flow UIDs; anonymous and
/// alice get RBAC's 403 for the empty verb, classified; the admin gets the
/// handler's 405, classified: go-restful's for a built-in resource (reference
/// 102's body), `crdHandler`'s MethodNotSupported naming the empty verb for a
/// custom resource, and its 404 delegate for a namespaced one's all-namespaces
/// path. CONNECT goes over HTTP/1.1 only (HTTP/2 has no CONNECT to a path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_without_a_verb_are_refused_after_the_filters() {
    let test = test_support::devcluster("no-verb").await;
    crate::kubectl_access::install_crontabs(&test.kubeconfig).await;
    let alice = test
        .cluster
        .issue_token("alice", &["developers"])
        .expect("token");
    let configmaps = "/api/v1/namespaces/default/configmaps";
    let crontabs = "/apis/stable.example.io/v1/namespaces/default/crontabs";
    let go_restful_405 = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "the server does not allow this method on the requested resource",
        "reason": "MethodNotAllowed", "details": {}, "code": 405,
    });
    let crd_405 = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": " is not supported on resources of kind \"crontabs.stable.example.io\"",
        "reason": "MethodNotAllowed",
        "details": {"group": "stable.example.io", "kind": "crontabs"}, "code": 405,
    });
    let json = |body: &Bytes, what: &str| -> serde_json::Value {
        serde_json::from_slice(body).unwrap_or_else(|e| panic!("{what}: {e}: {body:?}"))
    };
    let cases = [
        ("OPTIONS", Protocol::Http1),
        ("OPTIONS", Protocol::Http2),
        ("TRACE", Protocol::Http1),
        ("TRACE", Protocol::Http2),
        ("CONNECT", Protocol::Http1),
    ];
    for (method, protocol) in cases {
        let what = |who: &str| format!("{method} as {who} over {protocol:?}");
        let classified = |h: &http::HeaderMap, who: &str| {
            one(h, FLOW_SCHEMA, &what(who));
            one(h, PRIORITY_LEVEL, &what(who));
        };

        let bad = Some("not-a-real-token");
        let (code, h, _) = request_as(&test, bad, method, configmaps, &[], protocol).await;
        assert_eq!(code, 401, "{}", what("a bad token"));
        for name in [FLOW_SCHEMA, PRIORITY_LEVEL] {
            assert!(h.get(name).is_none(), "{}: {name}", what("a bad token"));
        }

        for (token, user) in [(None, "system:anonymous"), (Some(alice.as_str()), "alice")] {
            let (code, h, body) = request_as(&test, token, method, configmaps, &[], protocol).await;
            assert_eq!(code, 403, "{}", what(user));
            classified(&h, user);
            assert_eq!(
                json(&body, &what(user))["message"],
                format!(
                    "configmaps is forbidden: User \"{user}\" cannot  resource \"configmaps\" \
                     in API group \"\" in the namespace \"default\""
                ),
            );
        }

        // The method is refused before the Accept header is negotiated:
        // go-restful matches the method (405) before the media types (406),
        // and crdHandler writes its errors as JSON whatever the client accepts.
        for extra in [&[][..], &[("accept", UNACCEPTABLE)][..]] {
            let what = |who: &str| format!("{} with {extra:?}", what(who));
            let (code, h, body) = admin_request(&test, method, configmaps, extra, protocol).await;
            assert_eq!(code, 405, "{}", what("admin"));
            classified(&h, "admin");
            assert_eq!(one(&h, "content-type", &what("admin")), "application/json");
            assert_eq!(json(&body, &what("admin")), go_restful_405);

            let (code, h, body) = admin_request(&test, method, crontabs, extra, protocol).await;
            assert_eq!(code, 405, "{}", what("admin on crontabs"));
            classified(&h, "admin on crontabs");
            assert_eq!(json(&body, &what("admin on crontabs")), crd_405);

            let everywhere = "/apis/stable.example.io/v1/crontabs";
            let (code, h, body) = admin_request(&test, method, everywhere, extra, protocol).await;
            assert_eq!(code, 404, "{}", what("admin on all crontabs"));
            classified(&h, "admin on all crontabs");
            assert_eq!(body, "404 page not found\n");
        }
    }
    // The same Accept on a GET is refused, so the refusals above did not
    // simply accept it.
    for path in [configmaps, crontabs] {
        let accept = [("accept", UNACCEPTABLE)];
        let (code, _, _) = admin_request(&test, "GET", path, &accept, Protocol::Http1).await;
        assert_eq!(code, 406, "GET {path} accepting only {UNACCEPTABLE}");
    }
}

/// Routing, authorization and metrics share kube's RequestInfo resolution. A
/// `watch` or `proxy` segment with nothing after it is refused by kube's
/// request-info filter before authentication (500, `InternalError`'s text);
/// a `/watch/` path is a watch whatever the method, which go-restful refuses
/// for anything but GET on a built-in resource (405) where the custom-resource
/// handler serves it; `/proxy/` paths are served nowhere (404); an empty
/// namespace segment is kept, so the path names a list of every namespace's
/// objects, not the namespace after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_resolved_as_kubes_request_info_resolves_them() {
    let test = test_support::devcluster("request-info").await;
    crate::kubectl_access::install_crontabs(&test.kubeconfig).await;
    for (token, who) in [
        (Some("not-a-real-token"), "a bad token"),
        (None, "anonymous"),
    ] {
        let (code, h, body) = request_as(
            &test,
            token,
            "GET",
            "/api/v1/watch?a=1&b=2",
            &[],
            Protocol::Http1,
        )
        .await;
        assert_eq!(code, 500, "{who}");
        assert_eq!(one(&h, "content-type", who), "text/plain; charset=utf-8");
        assert_eq!(one(&h, NOSNIFF, who), "nosniff");
        assert_eq!(
            body,
            "Internal Server Error: \"/api/v1/watch?a=1&amp;b=2\": failed to create \
             RequestInfo: unable to determine kind and namespace from url, \
             /api/v1/watch?a=1&amp;b=2\n",
            "{who}"
        );
    }

    let watch = "/api/v1/watch/namespaces/default/configmaps?timeoutSeconds=1";
    let (code, _, body) = admin_request(&test, "POST", watch, &[], Protocol::Http1).await;
    assert_eq!(code, 405, "POST {watch}: {body:?}");
    let crontabs = "/apis/stable.example.io/v1/watch/namespaces/default/crontabs?timeoutSeconds=1";
    let (code, h, _) = admin_request(&test, "POST", crontabs, &[], Protocol::Http1).await;
    assert_eq!(code, 200, "POST {crontabs}");
    assert_eq!(one(&h, "content-type", crontabs), "application/json");

    let proxy = "/api/v1/proxy/namespaces/default/configmaps/x";
    let (code, _, body) = admin_request(&test, "GET", proxy, &[], Protocol::Http1).await;
    assert_eq!(code, 404, "GET {proxy}: {body:?}");

    let (code, _, body) = admin_request(
        &test,
        "GET",
        "/api/v1/namespaces//configmaps",
        &[],
        Protocol::Http1,
    )
    .await;
    assert_eq!(code, 200);
    let list: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(list["kind"], "ConfigMapList", "{list}");

    // A list across namespaces that selects a name by field is still a list:
    // the resolver names the object for authorization, not for the route.
    for (path, kind) in [
        ("/api/v1/configmaps", "ConfigMapList"),
        ("/apis/stable.example.io/v1/crontabs", "CronTabList"),
    ] {
        let selected = format!("{path}?fieldSelector=metadata.name%3Dnone");
        let (code, _, body) = admin_request(&test, "GET", &selected, &[], Protocol::Http1).await;
        let text = String::from_utf8_lossy(&body);
        assert_eq!(code, 200, "GET {selected}: {text}");
        let list: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(list["kind"], kind, "{list}");
        assert_eq!(list["items"], serde_json::json!([]), "{list}");
    }
}

/// A request kube's RequestInfo gives no verb (or the `proxy` verb) is refused
/// before any instrumented handler runs, so `apiserver_request_total` has no
/// series for it; nor for a watch of a built-in resource by any method but GET,
/// which go-restful's router refuses (405) before any route runs. A GET of the
/// same resources is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_no_handler_serves_are_not_counted() {
    let test = test_support::devcluster("no-verb-metrics").await;
    crate::kubectl_access::install_crontabs(&test.kubeconfig).await;
    let configmaps = "/api/v1/namespaces/default/configmaps";
    let crontabs = "/apis/stable.example.io/v1/namespaces/default/crontabs";
    for path in [configmaps, crontabs] {
        for method in ["OPTIONS", "TRACE"] {
            let (code, _, _) = admin_request(&test, method, path, &[], Protocol::Http1).await;
            assert_eq!(code, 405, "{method} {path}");
        }
    }
    for path in [
        "/api/v1/proxy/namespaces/default/configmaps/x",
        "/apis/stable.example.io/v1/proxy/namespaces/default/crontabs/x",
    ] {
        let (code, _, _) = admin_request(&test, "GET", path, &[], Protocol::Http1).await;
        assert!(code == 404 || code == 405, "GET {path}: {code}");
    }
    for method in ["POST", "DELETE"] {
        let path = "/api/v1/watch/namespaces/default/configmaps";
        let (code, _, _) = admin_request(&test, method, path, &[], Protocol::Http1).await;
        assert_eq!(code, 405, "{method} {path}");
    }
    for path in [configmaps, crontabs] {
        let (code, _, _) = admin_request(&test, "GET", path, &[], Protocol::Http1).await;
        assert_eq!(code, 200, "GET {path}");
    }
    let (code, _, body) = admin_request(&test, "GET", "/metrics", &[], Protocol::Http1).await;
    assert_eq!(code, 200);
    let text = String::from_utf8(body.to_vec()).expect("text");
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains("resource=\"configmaps\"") || l.contains("resource=\"crontabs\""))
        .collect();
    for resource in ["configmaps", "crontabs"] {
        assert!(
            series
                .iter()
                .any(|l| l.contains(&format!("resource=\"{resource}\""))
                    && l.contains("verb=\"LIST\"")
                    && l.contains("code=\"200\"")),
            "{series:#?}"
        );
    }
    for line in &series {
        assert!(
            line.contains("verb=\"LIST\"") && line.contains("code=\"200\""),
            "only the GETs are counted: {line}"
        );
    }
}

/// A media type no kube serializer writes.
const UNACCEPTABLE: &str = "application/x-unacceptable";

/// The health endpoints answer as kube's healthz handlers do: `/healthz`,
/// `/livez` and `/readyz` with `text/plain; charset=utf-8` and nosniff
/// (`handleRootHealth`), one named check with only the type Go's server sniffs
/// from `ok` (`adaptCheckToHandler`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_endpoints_carry_kubes_headers() {
    let test = test_support::devcluster("health").await;
    for endpoint in ["/healthz", "/livez", "/readyz"] {
        for protocol in [Protocol::Http1, Protocol::Http2] {
            let what = format!("{endpoint} over {protocol:?}");
            let (code, h, body) = request_as(&test, None, "GET", endpoint, &[], protocol).await;
            assert_eq!(code, 200, "{what}");
            assert_eq!(body, "ok", "{what}");
            assert_eq!(one(&h, "content-type", &what), "text/plain; charset=utf-8");
            assert_eq!(one(&h, NOSNIFF, &what), "nosniff");

            // Only `/healthz` itself is public (system:public-info-viewer).
            for name in ["ping", "log", "etcd", "poststarthook/rbac/bootstrap-roles"] {
                let check = format!("{endpoint}/{name}");
                let what = format!("{check} over {protocol:?}");
                let (code, h, body) = admin_request(&test, "GET", &check, &[], protocol).await;
                assert_eq!(code, 200, "{what}");
                assert_eq!(body, "ok", "{what}");
                assert_eq!(one(&h, "content-type", &what), "text/plain; charset=utf-8");
                assert!(h.get(NOSNIFF).is_none(), "{what}");
            }
        }
    }
}

/// A check kube-apiserver does not register on an endpoint has no path there
/// (kube's healthz installs one exact path per check): the not-found handler's
/// plain 404. `/readyz` alone has `etcd-readiness`, `informer-sync` and
/// `shutdown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_kube_does_not_have_are_not_found() {
    let test = test_support::devcluster("health-404").await;
    let readyz_only = ["etcd-readiness", "informer-sync", "shutdown"];
    for endpoint in ["/healthz", "/livez", "/readyz"] {
        for protocol in [Protocol::Http1, Protocol::Http2] {
            for name in readyz_only.iter().chain(&["no-such-check", "ping/extra"]) {
                let check = format!("{endpoint}/{name}");
                let what = format!("{check} over {protocol:?}");
                let (code, h, body) = admin_request(&test, "GET", &check, &[], protocol).await;
                if endpoint == "/readyz" && readyz_only.contains(name) {
                    assert_eq!(code, 200, "{what}");
                    assert_eq!(body, "ok", "{what}");
                    continue;
                }
                assert_eq!(code, 404, "{what}");
                assert_eq!(body, "404 page not found\n", "{what}");
                assert_eq!(one(&h, "content-type", &what), "text/plain; charset=utf-8");
                assert_eq!(one(&h, NOSNIFF, &what), "nosniff");
            }
        }
    }
}

/// `?verbose` (with any value or none) makes kube's handleRootHealth list
/// each check as `[+]<name> ok` and end with `<endpoint> check passed`; every
/// check it lists has its own path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbose_health_lists_each_check() {
    let test = test_support::devcluster("health-verbose").await;
    for endpoint in ["healthz", "livez", "readyz"] {
        for query in ["verbose", "verbose=false"] {
            let path = format!("/{endpoint}?{query}");
            let (code, h, body) = admin_request(&test, "GET", &path, &[], Protocol::Http1).await;
            assert_eq!(code, 200, "{path}");
            assert_eq!(one(&h, "content-type", &path), "text/plain; charset=utf-8");
            assert_eq!(one(&h, NOSNIFF, &path), "nosniff");
            let text = std::str::from_utf8(&body).expect("text");
            let last = format!("{endpoint} check passed\n");
            let Some(lines) = text.strip_suffix(&last) else {
                panic!("{path}: {text:?}");
            };
            assert!(
                lines.starts_with("[+]ping ok\n[+]log ok\n[+]etcd ok\n"),
                "{path}: {text}"
            );
            assert_eq!(
                lines.contains("[+]shutdown ok\n"),
                endpoint == "readyz",
                "{path}: {text}"
            );
            for line in lines.lines() {
                let name = line
                    .strip_prefix("[+]")
                    .and_then(|l| l.strip_suffix(" ok"))
                    .unwrap_or_else(|| panic!("{path}: line {line:?}"));
                let check = format!("/{endpoint}/{name}");
                let (code, _, body) =
                    admin_request(&test, "GET", &check, &[], Protocol::Http1).await;
                assert_eq!((code.as_u16(), &body[..]), (200, &b"ok"[..]), "{check}");
            }
        }
    }
}

/// Health paths match exactly, as kube's path mux does: a trailing or doubled
/// slash reaches the not-found handler. `?exclude=<check>` skips a check, and a
/// verbose answer says so and warns about names that match no check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_paths_match_exactly_and_checks_can_be_excluded() {
    let test = test_support::devcluster("health-exact").await;
    for path in ["/healthz/", "/livez//ping", "/readyz/ping/"] {
        let (code, h, body) = admin_request(&test, "GET", path, &[], Protocol::Http1).await;
        assert_eq!(code, 404, "{path}");
        assert_eq!(body, "404 page not found\n", "{path}");
        assert_eq!(one(&h, NOSNIFF, path), "nosniff");
    }
    let path = "/readyz?verbose&exclude=etcd&exclude=nope";
    let (code, h, body) = request_as(&test, None, "GET", path, &[], Protocol::Http1).await;
    assert_eq!(code, 200, "{path}");
    assert_eq!(one(&h, NOSNIFF, path), "nosniff");
    let text = std::str::from_utf8(&body).expect("text");
    assert!(text.contains("[+]log ok\n[+]etcd excluded: ok\n"), "{text}");
    assert!(
        text.ends_with(
            "warn: some health checks cannot be excluded: no matches for \"nope\"\n\
             readyz check passed\n"
        ),
        "{text}"
    );
}

/// A namespaced custom resource's all-namespaces path serves list and watch
/// only: kube's custom-resource handler hands every other verb to its 404
/// delegate (`possiblyAcrossAllNamespacesVerbs`), so a DELETE there removes
/// nothing, in any namespace, and a POST creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_list_and_watch_span_a_namespaced_custom_resources_namespaces() {
    let test = cluster_with_a_crontab("all-namespaces").await;
    let everywhere = "/apis/stable.example.io/v1/crontabs";
    for method in ["DELETE", "POST"] {
        for protocol in [Protocol::Http1, Protocol::Http2] {
            let what = format!("{method} over {protocol:?}");
            let (code, h, body) = admin_request(&test, method, everywhere, &[], protocol).await;
            assert_eq!(code, 404, "{what}: {body:?}");
            assert_eq!(body, "404 page not found\n", "{what}");
            assert_eq!(one(&h, NOSNIFF, &what), "nosniff");
        }
    }
    let (code, _, body) = admin_request(&test, "GET", everywhere, &[], Protocol::Http1).await;
    assert_eq!(code, 200, "{body:?}");
    let listed: serde_json::Value = serde_json::from_slice(&body).expect("list");
    assert_eq!(listed["items"][0]["metadata"]["name"], "kept", "{listed}");
}

/// A write to a collection with no name is refused where kube refuses it: for a
/// built-in resource go-restful has no PUT or PATCH route there (405, never
/// counted), for a custom resource the handler runs and finds no name (400,
/// counted) after a PATCH's type was checked (415). A review takes a POST to
/// its collection alone: a name is a path no route matches (404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_a_collection_are_refused_where_kube_refuses_them() {
    let test = test_support::devcluster("collection-writes").await;
    crate::kubectl_access::install_crontabs(&test.kubeconfig).await;
    let configmaps = "/api/v1/namespaces/default/configmaps";
    let crontabs = "/apis/stable.example.io/v1/namespaces/default/crontabs";
    let merge = [("content-type", "application/merge-patch+json")];
    let strategic = [("content-type", "application/strategic-merge-patch+json")];
    let reviews = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
    let named_review = format!("{reviews}/x");
    let none: &[(&str, &str)] = &[];
    let cases = [
        ("PUT", configmaps, none, 405, "MethodNotAllowed"),
        ("PATCH", configmaps, &merge[..], 405, "MethodNotAllowed"),
        ("PUT", crontabs, none, 400, "BadRequest"),
        ("PATCH", crontabs, &merge[..], 400, "BadRequest"),
        (
            "PATCH",
            crontabs,
            &strategic[..],
            415,
            "UnsupportedMediaType",
        ),
        ("POST", named_review.as_str(), none, 404, "NotFound"),
        ("GET", reviews, none, 405, "MethodNotAllowed"),
    ];
    // The same whatever the client accepts: each refusal comes before the
    // answer's media type is negotiated, and goes out as JSON.
    for accept in [None, Some(("accept", UNACCEPTABLE))] {
        for (method, path, extra, status, reason) in &cases {
            let extra: Vec<(&str, &str)> = extra.iter().copied().chain(accept).collect();
            let what = format!("{method} {path} {extra:?}");
            let (code, _, body) = admin_request(&test, method, path, &extra, Protocol::Http1).await;
            assert_eq!(code.as_u16(), *status, "{what}: {body:?}");
            let answer: serde_json::Value = serde_json::from_slice(&body).expect("a Status");
            assert_eq!(answer["reason"], *reason, "{what}: {answer}");
            if *status == 400 {
                assert_eq!(answer["message"], "name must be provided", "{what}");
            }
        }
    }
    let (_, _, body) = admin_request(&test, "GET", "/metrics", &[], Protocol::Http1).await;
    let text = String::from_utf8(body.to_vec()).expect("text");
    let counted = |verb: &str, resource: &str, code: &str| {
        text.lines().any(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains(&format!("code=\"{code}\""))
                && l.contains(&format!("resource=\"{resource}\""))
                && l.contains(&format!("verb=\"{verb}\""))
        })
    };
    assert!(counted("PUT", "crontabs", "400"), "{text}");
    assert!(counted("PATCH", "crontabs", "400"), "{text}");
    assert!(counted("PATCH", "crontabs", "415"), "{text}");
    assert!(!counted("PUT", "configmaps", "405"), "{text}");
}

/// A path under the core group or a built-in group that nothing serves is
/// go-restful's: kube's director hands it the group's webservices, and its 404
/// is a JSON Status. Under a custom resource's group, or no group, the answer is
/// the not-found handler's plain 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unserved_path_is_answered_by_whoever_kube_hands_it_to() {
    let test = test_support::devcluster("unserved-paths").await;
    crate::kubectl_access::install_crontabs(&test.kubeconfig).await;
    for path in [
        "/api/v9",
        "/api/v1/foos",
        "/apis/apps/v9",
        "/apis/apps/v9/deployments",
        "/apis/apps/v1/foos",
        "/apis/apps/v1/namespaces/default/deployments/d/status/extra",
    ] {
        let (code, h, body) = admin_request(&test, "GET", path, &[], Protocol::Http1).await;
        assert_eq!(code, 404, "{path}");
        assert_eq!(one(&h, "content-type", path), "application/json", "{path}");
        let status: serde_json::Value = serde_json::from_slice(&body).expect("a Status");
        assert_eq!(status["reason"], "NotFound", "{path}: {status}");
        assert_eq!(
            status["message"], "the server could not find the requested resource",
            "{path}"
        );
    }
    for path in [
        "/apis/stable.example.io/v2",
        "/apis/stable.example.io/v2/crontabs",
        "/apis/stable.example.io/v1/foos",
        "/apis/nope.example.io/v1/foos",
        "/apis//v1/configmaps",
    ] {
        let (code, _, body) = admin_request(&test, "GET", path, &[], Protocol::Http1).await;
        assert_eq!(code, 404, "{path}");
        assert_eq!(body, "404 page not found\n", "{path}");
    }
}

/// Some answers kube-apiserver makes only after it has read what was asked for,
/// so a missing object is still a 404: a Table with an unknown `includeObject`
/// (400, for a named GET, a list and a watch), and a list media type asked of
/// one custom resource (500 without a reason: kube reads it as an unstructured
/// object, which passes for a list until its items are looked for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_kube_makes_after_the_read_leave_a_missing_object_a_404() {
    const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
    const LIST_METADATA: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
    let test = cluster_with_a_crontab("after-the-read").await;
    let collection = "/apis/stable.example.io/v1/namespaces/default/crontabs";
    let bogus = "?includeObject=Bogus";
    let status =
        |body: &Bytes| -> serde_json::Value { serde_json::from_slice(body).expect("a Status") };

    let table_refused = "Unable to convert to Table as requested: includeObject: Invalid value: \"Bogus\": must be 'Metadata', 'Object', 'None', or empty";
    for path in [
        format!("{collection}/kept{bogus}"),
        format!("{collection}{bogus}"),
        format!("{collection}{bogus}&watch=true"),
    ] {
        let (code, _, body) =
            admin_request(&test, "GET", &path, &[("accept", TABLE)], Protocol::Http1).await;
        assert_eq!(code, 400, "{path}: {body:?}");
        let refused = status(&body);
        assert_eq!(refused["reason"], "BadRequest", "{path}");
        assert_eq!(refused["message"], table_refused, "{path}");
    }
    let (code, _, body) = admin_request(
        &test,
        "GET",
        &format!("{collection}/gone{bogus}"),
        &[("accept", TABLE)],
        Protocol::Http1,
    )
    .await;
    assert_eq!(code, 404, "{body:?}");
    for accepted in ["None", "Metadata", "Object", ""] {
        let path = format!("{collection}/kept?includeObject={accepted}");
        let (code, _, body) =
            admin_request(&test, "GET", &path, &[("accept", TABLE)], Protocol::Http1).await;
        assert_eq!(code, 200, "{path}: {body:?}");
    }

    let (code, _, body) = admin_request(
        &test,
        "GET",
        &format!("{collection}/kept"),
        &[("accept", LIST_METADATA)],
        Protocol::Http1,
    )
    .await;
    assert_eq!(code, 500, "{body:?}");
    let failed = status(&body);
    assert_eq!(failed["message"], "content is not a list");
    assert!(failed.get("reason").is_none(), "{failed}");
    let (code, _, body) = admin_request(
        &test,
        "GET",
        &format!("{collection}/gone"),
        &[("accept", LIST_METADATA)],
        Protocol::Http1,
    )
    .await;
    assert_eq!(code, 404, "{body:?}");
    let (code, _, body) = admin_request(
        &test,
        "GET",
        collection,
        &[("accept", LIST_METADATA)],
        Protocol::Http1,
    )
    .await;
    assert_eq!(code, 200, "{body:?}");
}

/// kube's Table media type.
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
/// One object as `PartialObjectMetadata`.
const PARTIAL: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
/// A list as `PartialObjectMetadataList`.
const PARTIAL_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
/// The content type of a JSON merge patch.
const MERGE_PATCH: (&str, &str) = ("content-type", "application/merge-patch+json");
/// The path of Deployment `default/d`'s Scale.
const DEPLOYMENT_SCALE: &str = "/apis/apps/v1/namespaces/default/deployments/d/scale";

/// GET `path` as the admin over HTTP/1.1, accepting `accept` (`None`: no
/// Accept header); the status and body.
async fn get(
    test: &test_support::TestCluster,
    path: &str,
    accept: Option<&str>,
) -> (http::StatusCode, Bytes) {
    let accept: Vec<_> = accept
        .map(|accept| ("accept", accept))
        .into_iter()
        .collect();
    let (code, _, body) = admin_request(test, "GET", path, &accept, Protocol::Http1).await;
    (code, body)
}

/// `method` on `path` as the admin over HTTP/1.1 with `headers`, sending
/// `body`; the status and body.
async fn send(
    test: &test_support::TestCluster,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (http::StatusCode, Bytes) {
    let token = test.cluster.admin_token();
    let body = Bytes::from(body.to_owned());
    let (code, _, body) = request_with_body(
        test,
        Some(&token),
        method,
        path,
        headers,
        Protocol::Http1,
        body,
    )
    .await;
    (code, body)
}

/// Each of `writes` (method, content type, body) to the Scale at `path` is
/// answered `code` with exactly `status`, and the Scale keeps `replicas`.
async fn check_refused_scale_writes(
    test: &test_support::TestCluster,
    path: &str,
    writes: &[(&str, &str, &str)],
    code: u16,
    status: &serde_json::Value,
    replicas: i64,
) {
    for (method, content_type, body) in writes {
        let (answered, answer) =
            send(test, method, path, &[("content-type", content_type)], body).await;
        assert_eq!(answered, code, "{method} {body}: {answer:?}");
        assert_eq!(&json(&answer), status, "{method} {body}");
    }
    let (answered, body) = get(test, path, None).await;
    assert_eq!(answered, 200, "{body:?}");
    assert_eq!(
        json(&body)["spec"],
        serde_json::json!({ "replicas": replicas })
    );
}

/// kube's `Status` for a failure: `code`, `reason` and `message`, with `details`
/// where kube gives them.
fn failure(
    code: u16,
    reason: &str,
    message: &str,
    details: Option<serde_json::Value>,
) -> serde_json::Value {
    let mut status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if let Some(details) = details {
        status["details"] = details;
    }
    status
}

/// An answer's body as JSON.
fn json(body: &Bytes) -> serde_json::Value {
    serde_json::from_slice(body).expect("json")
}

/// Sends a Scale write that must succeed; the Scale it answers with, whose
/// spec must be `replicas` and nothing else.
async fn scale_written(
    test: &test_support::TestCluster,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
    replicas: i64,
) -> serde_json::Value {
    let (code, answer) = send(test, method, path, headers, body).await;
    assert_eq!(code, 200, "{method} {path} {body}: {answer:?}");
    let scale = json(&answer);
    assert_eq!(
        scale["spec"],
        serde_json::json!({"replicas": replicas}),
        "{method} {path} {body}"
    );
    scale
}

/// Deployment `default/d` of `replicas` nginx pods.
fn deployment(replicas: u32) -> String {
    format!("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\n  namespace: default\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: d}}\n  template:\n    metadata:\n      labels: {{app: d}}\n    spec:\n      containers:\n      - {{name: c, image: nginx}}\n")
}

/// kube turns what it read into `PartialObjectMetadata` or its list only when
/// the shape fits: a list media type asked of one built-in (typed) object, or
/// the one-object media type asked of a list, is a 406 naming the Go type kube
/// read. It says so after the read, so a missing object is still a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_media_type_of_the_wrong_shape_is_not_acceptable() {
    let test = cluster_with_a_crontab("metadata-shapes").await;
    let not_a_list =
        "you requested PartialObjectMetadataList, but the requested object is not a list";
    let a_list = "you requested PartialObjectMetadata, but the requested object is a list";
    for (path, accept, message) in [
        (
            "/api/v1/namespaces/default",
            PARTIAL_LIST,
            format!("{not_a_list} (*core.Namespace)"),
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/cluster-admin",
            PARTIAL_LIST,
            format!("{not_a_list} (*rbac.ClusterRole)"),
        ),
        (
            "/api/v1/namespaces",
            PARTIAL,
            format!("{a_list} (*core.NamespaceList)"),
        ),
        (
            "/apis/stable.example.io/v1/namespaces/default/crontabs",
            PARTIAL,
            format!("{a_list} (*unstructured.UnstructuredList)"),
        ),
    ] {
        let (code, body) = get(&test, path, Some(accept)).await;
        assert_eq!(code, 406, "{path} as {accept}: {body:?}");
        let status = json(&body);
        assert_eq!(status["reason"], "NotAcceptable", "{path}");
        assert_eq!(status["message"], message, "{path}");
        assert_eq!(status["code"], 406, "{path}");
    }
    // The shapes that fit are served.
    for (path, accept) in [
        ("/api/v1/namespaces/default", PARTIAL),
        ("/api/v1/namespaces", PARTIAL_LIST),
    ] {
        let (code, body) = get(&test, path, Some(accept)).await;
        assert_eq!(code, 200, "{path} as {accept}: {body:?}");
    }
    let (code, body) = get(&test, "/api/v1/namespaces/missing", Some(PARTIAL_LIST)).await;
    assert_eq!(code, 404, "{body:?}");
}

/// The `/scale` subresource answers in the form asked for, as kube's handlers
/// answer for any object: a custom resource's Scale as a Table with the columns
/// apiextensions-apiserver gives every scale (Name, Desired, Available, Age), as
/// PartialObjectMetadata, and a list media type is a 406 naming the Scale's Go
/// type. Reads and writes alike; a built-in's Scale uses kube's Scale printer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scale_subresource_answers_in_the_form_asked_for() {
    let test = test_support::devcluster("scale-forms").await;
    apply(&test, &widget_crd(true)).await;
    apply(&test, &widget("w", "spec: {replicas: 2}\n")).await;
    let scale = &widget_scale("w");

    let (code, body) = get(&test, scale, Some(TABLE)).await;
    assert_eq!(code, 200, "{body:?}");
    let table = json(&body);
    assert_eq!(table["kind"], "Table", "{table}");
    let columns: Vec<_> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_string(),
                c["type"].as_str().unwrap_or_default().to_string(),
                c["description"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let described = |name: &str, type_: &str, description: &str| {
        (name.to_string(), type_.to_string(), description.to_string())
    };
    assert_eq!(
        columns,
        [
            described("Name", "string", devcluster::table::NAME_DESCRIPTION),
            described("Desired", "integer", "Number of desired replicas"),
            described("Available", "integer", "Number of actual replicas"),
            described(
                "Age",
                "date",
                devcluster::table::CREATION_TIMESTAMP_DESCRIPTION
            ),
        ]
    );
    let row = &table["rows"][0];
    assert_eq!(row["cells"][0], "w", "{table}");
    assert_eq!(row["cells"][1], 2, "{table}");
    assert_eq!(row["cells"][2], 0, "{table}");
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata", "{table}");
    assert_eq!(row["object"]["metadata"]["name"], "w", "{table}");
    assert!(table["metadata"]["resourceVersion"].is_string(), "{table}");

    let (code, body) = get(&test, scale, Some(PARTIAL)).await;
    assert_eq!(code, 200, "{body:?}");
    let partial = json(&body);
    assert_eq!(partial["kind"], "PartialObjectMetadata", "{partial}");
    assert_eq!(partial["metadata"]["name"], "w", "{partial}");
    assert!(partial.get("spec").is_none(), "{partial}");

    let (code, body) = get(&test, scale, Some(PARTIAL_LIST)).await;
    assert_eq!(code, 406, "{body:?}");
    let refused = json(&body);
    assert_eq!(refused["reason"], "NotAcceptable", "{refused}");
    assert_eq!(
        refused["message"],
        "you requested PartialObjectMetadataList, but the requested object is not a list (*v1.Scale)"
    );

    // A write answers the same way.
    let (code, body) = send(
        &test,
        "PATCH",
        scale,
        &[("accept", TABLE), MERGE_PATCH],
        r#"{"spec":{"replicas":4}}"#,
    )
    .await;
    assert_eq!(code, 200, "{body:?}");
    let table = json(&body);
    assert_eq!(table["kind"], "Table", "{table}");
    assert_eq!(table["rows"][0]["cells"][1], 4, "{table}");
    assert_eq!(table["columnDefinitions"][1]["name"], "Desired", "{table}");

    // A Deployment's Scale: kube's Scale printer, Name without a format.
    apply(&test, &deployment(3)).await;
    let (code, body) = get(&test, DEPLOYMENT_SCALE, Some(TABLE)).await;
    assert_eq!(code, 200, "{body:?}");
    let table = json(&body);
    let names: Vec<_> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| (c["name"].clone(), c["format"].clone()))
        .collect();
    assert_eq!(
        names,
        [
            (serde_json::json!("Name"), serde_json::json!("")),
            (serde_json::json!("Desired"), serde_json::json!("")),
            (serde_json::json!("Available"), serde_json::json!("")),
            (serde_json::json!("Age"), serde_json::json!("")),
        ]
    );
    assert_eq!(table["rows"][0]["cells"][1], 3, "{table}");
    let (code, body) = get(&test, DEPLOYMENT_SCALE, Some(PARTIAL_LIST)).await;
    assert_eq!(code, 406, "{body:?}");
    assert_eq!(
        json(&body)["message"],
        "you requested PartialObjectMetadataList, but the requested object is not a list (*autoscaling.Scale)"
    );
}

/// The Widget CRD (`scale.example.io`, any fields kept), with a status and a
/// scale subresource (selector at `.status.selector`) when `scale`. Its printer
/// column (Kind) is one a Scale's Table must not take.
fn widget_crd(scale: bool) -> String {
    let subresources = if scale {
        "    subresources:\n      status: {}\n      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, labelSelectorPath: .status.selector}\n"
    } else {
        ""
    };
    format!(
        r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.scale.example.io
spec:
  group: scale.example.io
  scope: Namespaced
  names: {{plural: widgets, singular: widget, kind: Widget}}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
{subresources}    additionalPrinterColumns:
    - {{name: Kind, type: string, jsonPath: .kind}}
"#
    )
}

/// `kubectl apply` of `manifest`, retried while the server is not ready for it
/// (a CRD just made is not served at once).
async fn apply(test: &test_support::TestCluster, manifest: &str) {
    let mut last = None;
    for _ in 0..50 {
        let out = test_support::kubectl_stdin_async(
            &test.kubeconfig,
            &["apply", "-f", "-"],
            manifest,
            Duration::from_secs(60),
        )
        .await;
        if out.success() {
            return;
        }
        last = Some(out);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{manifest} was not applied: {last:?}");
}

/// A Widget `default/<name>` with `fields` (YAML under the top level).
fn widget(name: &str, fields: &str) -> String {
    format!("apiVersion: scale.example.io/v1\nkind: Widget\nmetadata:\n  name: {name}\n  namespace: default\n{fields}")
}

/// The path of Widget `default/<name>`'s Scale.
fn widget_scale(name: &str) -> String {
    format!("/apis/scale.example.io/v1/namespaces/default/widgets/{name}/scale")
}

/// A custom resource's Scale is read as kube's `ScaleREST.Get` reads it
/// (`scaleFromCustomResource`): without spec replicas it is kube's internal
/// error; a replicas or selector of the wrong type is apimachinery's accessor
/// error, answered as 500 `Unknown`; a value beyond int32 wraps as Go's
/// conversion does; a missing status replicas or selector is 0 or left out.
/// kube refuses the odd values on writes once the CRD has a scale
/// subresource, so the Widgets are made before it has one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_resource_s_scale_is_read_as_kube_reads_it() {
    let test = test_support::devcluster("scale-read").await;
    apply(&test, &widget_crd(false)).await;
    apply(&test, &widget("none", "spec: {size: 1}\n")).await;
    apply(&test, &widget("text", "spec: {replicas: three}\n")).await;
    apply(&test, &widget("big", "spec: {replicas: 4294967298}\n")).await;
    apply(
        &test,
        &widget("selector", "spec: {replicas: 1}\nstatus: {selector: 5}\n"),
    )
    .await;
    apply(&test, &widget("bare", "spec: {replicas: 1}\n")).await;
    apply(&test, &widget_crd(true)).await;
    let read = |name: &str| {
        let path = widget_scale(name);
        let test = &test;
        async move {
            for _ in 0..50 {
                let (code, body) = get(test, &path, None).await;
                if code != 404 {
                    return (code, json(&body));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            panic!("{path} is not served");
        }
    };

    let (code, body) = read("none").await;
    assert_eq!(code, 500, "{body}");
    assert_eq!(
        body,
        failure(
            500,
            "InternalError",
            "Internal error occurred: the spec replicas field \".spec.replicas\" does not exist",
            Some(
                serde_json::json!({"causes": [{"message": "the spec replicas field \".spec.replicas\" does not exist"}]})
            )
        )
    );

    let (code, body) = read("text").await;
    assert_eq!(code, 500, "{body}");
    assert_eq!(
        body,
        failure(
            500,
            "Unknown",
            ".spec.replicas accessor error: three is of the type string, expected int64",
            None
        )
    );

    let (code, body) = read("selector").await;
    assert_eq!(code, 500, "{body}");
    assert_eq!(
        body["message"],
        ".status.selector accessor error: 5 is of the type int64, expected string"
    );

    let (code, body) = read("big").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["spec"], serde_json::json!({"replicas": 2}), "{body}");

    let (code, body) = read("bare").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], serde_json::json!({"replicas": 0}), "{body}");
}

/// autoscaling/v1's `ScaleSpec.replicas` is `omitempty` and `ScaleStatus.replicas`
/// is not: a Scale of 0 replicas is `"spec": {}` with `"status": {"replicas": 0}`,
/// for a custom resource and a built-in alike. In a Table, a custom resource's
/// Desired column (a JSONPath on the Scale) is then empty; kube's printer for a
/// built-in's Scale reads the Go field, 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_of_no_replicas_leaves_spec_replicas_out() {
    let test = test_support::devcluster("scale-zero").await;
    apply(&test, &widget_crd(true)).await;
    apply(&test, &widget("zero", "spec: {replicas: 0}\n")).await;
    apply(&test, &deployment(0)).await;
    for (path, empty_cell) in [
        (widget_scale("zero"), serde_json::Value::Null),
        (DEPLOYMENT_SCALE.to_string(), serde_json::json!(0)),
    ] {
        let (code, body) = get(&test, &path, None).await;
        assert_eq!(code, 200, "{body:?}");
        let scale = json(&body);
        assert_eq!(scale["spec"], serde_json::json!({}), "{scale}");
        assert_eq!(scale["status"]["replicas"], 0, "{scale}");
        let (code, body) = get(&test, &path, Some(TABLE)).await;
        assert_eq!(code, 200, "{body:?}");
        let table = json(&body);
        assert_eq!(table["rows"][0]["cells"][1], empty_cell, "{table}");
        assert_eq!(table["rows"][0]["cells"][2], 0, "{table}");
    }
}

/// A built-in's Scale carries its selector in `status.selector`, as kube's
/// `scaleFromDeployment` prints `spec.selector` (`LabelSelectorAsSelector`):
/// requirements sorted by key, on a read and in a write's answer. A selector
/// kube could not read (its validation keeps one out of storage, devcluster's
/// does not) is what kube's `ScaleREST` answers then: a GET's 400, a write's
/// bare error (500 `Unknown`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_built_in_s_scale_carries_its_selector() {
    let test = test_support::devcluster("scale-selector").await;
    let selector = "  selector:\n    matchLabels: {tier: web, app: d}\n    matchExpressions:\n    - {key: env, operator: NotIn, values: [prod, dev]}\n    - {key: canary, operator: DoesNotExist}\n";
    apply(&test, &deployment_with_selector(selector)).await;
    let expected = serde_json::json!({
        "replicas": 0,
        "selector": "app=d,!canary,env notin (dev,prod),tier=web",
    });
    for (code, answer) in read_and_patched_scale(&test, 4).await {
        assert_eq!(code, 200, "{answer}");
        assert_eq!(answer["status"], expected);
    }

    let selector =
        "  selector:\n    matchExpressions:\n    - {key: a, operator: Gt, values: ['1']}\n";
    apply(&test, &deployment_with_selector(selector)).await;
    let message = "\"Gt\" is not a valid label selector operator";
    let [read, patched] = read_and_patched_scale(&test, 5).await;
    assert_eq!(read, (400, failure(400, "BadRequest", message, None)));
    assert_eq!(patched, (500, failure(500, "Unknown", message, None)));
}

/// Deployment `default/d`'s Scale read, then patched to `replicas`: each
/// answer's code and body.
async fn read_and_patched_scale(
    test: &test_support::TestCluster,
    replicas: u32,
) -> [(u16, serde_json::Value); 2] {
    let (read_code, read) = get(test, DEPLOYMENT_SCALE, None).await;
    let patch = format!(r#"{{"spec":{{"replicas":{replicas}}}}}"#);
    let (patched_code, patched) =
        send(test, "PATCH", DEPLOYMENT_SCALE, &[MERGE_PATCH], &patch).await;
    [
        (read_code.as_u16(), json(&read)),
        (patched_code.as_u16(), json(&patched)),
    ]
}

/// Deployment `default/d` of 4 replicas with `selector` (YAML under `spec`).
fn deployment_with_selector(selector: &str) -> String {
    format!("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\n  namespace: default\nspec:\n  replicas: 4\n{selector}  template:\n    metadata:\n      labels: {{app: d, tier: web}}\n    spec:\n      containers:\n      - {{name: c, image: nginx}}\n")
}

/// Deployment `default/d` scaled to 3 through its Scale.
async fn scale_to_three(test: &test_support::TestCluster) {
    let patch = r#"{"spec":{"replicas":3}}"#;
    scale_written(test, "PATCH", DEPLOYMENT_SCALE, &[MERGE_PATCH], patch, 3).await;
}

/// A Deployment whose write leaves replicas unset has 1, as kube's apps/v1
/// defaulting (`SetDefaults_Deployment`) gives it while decoding: on create,
/// on a PUT and from a patch, and its Scale says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_without_replicas_has_one() {
    let test = test_support::devcluster("deployment-replicas").await;
    let path = "/apis/apps/v1/namespaces/default/deployments/d";
    let manifest = deployment(2).replace("  replicas: 2\n", "");
    assert!(!manifest.contains("replicas"), "{manifest}");
    apply(&test, &manifest).await;
    let (code, body) = get(&test, path, None).await;
    assert_eq!(code, 200, "{body:?}");
    assert_eq!(json(&body)["spec"]["replicas"], 1);
    let (code, body) = get(&test, DEPLOYMENT_SCALE, None).await;
    assert_eq!(code, 200, "{body:?}");
    assert_eq!(json(&body)["spec"], serde_json::json!({"replicas": 1}));

    scale_to_three(&test).await;
    let (_, body) = get(&test, path, None).await;
    let mut put = json(&body);
    assert_eq!(put["spec"]["replicas"], 3);
    if let Some(spec) = put["spec"].as_object_mut() {
        spec.remove("replicas");
    }
    let (code, body) = send(
        &test,
        "PUT",
        path,
        &[("content-type", "application/json")],
        &put.to_string(),
    )
    .await;
    assert_eq!(code, 200, "{body:?}");
    assert_eq!(json(&body)["spec"]["replicas"], 1);

    scale_to_three(&test).await;
    let (code, body) = send(
        &test,
        "PATCH",
        path,
        &[MERGE_PATCH],
        r#"{"spec":{"replicas":null}}"#,
    )
    .await;
    assert_eq!(code, 200, "{body:?}");
    assert_eq!(json(&body)["spec"]["replicas"], 1);
    let (_, body) = get(&test, DEPLOYMENT_SCALE, None).await;
    assert_eq!(json(&body)["spec"], serde_json::json!({"replicas": 1}));
}

/// A write to the Scale of a custom resource without spec replicas starts
/// from kube's mark for them (the smallest int32): a patch that does not set
/// replicas is kube's 400 `the spec replicas field ".spec.replicas" cannot be
/// empty`; one that sets them, or a PUT, writes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_write_must_give_a_custom_resource_replicas_it_lacks() {
    let test = test_support::devcluster("scale-unset").await;
    apply(&test, &widget_crd(true)).await;
    apply(&test, &widget("none", "spec: {size: 1}\n")).await;
    let path = widget_scale("none");
    let (code, body) = send(
        &test,
        "PATCH",
        &path,
        &[MERGE_PATCH],
        r#"{"metadata":{"labels":{"a":"b"}}}"#,
    )
    .await;
    assert_eq!(code, 400, "{body:?}");
    assert_eq!(
        json(&body),
        failure(
            400,
            "BadRequest",
            "the spec replicas field \".spec.replicas\" cannot be empty",
            None
        )
    );
    scale_written(
        &test,
        "PATCH",
        &path,
        &[MERGE_PATCH],
        r#"{"spec":{"replicas":2}}"#,
        2,
    )
    .await;

    apply(&test, &widget("put", "spec: {size: 1}\n")).await;
    let body = r#"{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"put","namespace":"default"},"spec":{"replicas":3}}"#;
    scale_written(
        &test,
        "PUT",
        &widget_scale("put"),
        &[("content-type", "application/json")],
        body,
        3,
    )
    .await;
}

/// A resourceVersion in the Scale a write makes, sent in a PUT or set by a
/// patch, is a precondition on the custom resource (kube sets it on the object
/// it writes): a stale one is the registry's 409, and the replicas stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_resource_version_in_a_scale_write_is_a_conflict() {
    let test = test_support::devcluster("scale-conflict").await;
    apply(&test, &widget_crd(true)).await;
    apply(&test, &widget("w", "spec: {replicas: 1}\n")).await;
    let path = widget_scale("w");
    let conflict = failure(
        409,
        "Conflict",
        "Operation cannot be fulfilled on widgets.scale.example.io \"w\": the object has been modified; please apply your changes to the latest version and try again",
        Some(serde_json::json!({"name": "w", "group": "scale.example.io", "kind": "widgets"})),
    );
    let writes = [
        (
            "PATCH",
            "application/merge-patch+json",
            r#"{"metadata":{"resourceVersion":"1"},"spec":{"replicas":3}}"#,
        ),
        (
            "PATCH",
            "application/json-patch+json",
            r#"[{"op":"replace","path":"/metadata/resourceVersion","value":"1"},{"op":"replace","path":"/spec/replicas","value":3}]"#,
        ),
        (
            "PUT",
            "application/json",
            r#"{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"w","namespace":"default","resourceVersion":"1"},"spec":{"replicas":3}}"#,
        ),
    ];
    check_refused_scale_writes(&test, &path, &writes, 409, &conflict, 1).await;
}

/// A custom resource with a scale subresource has its replicas and selector
/// checked on every write, as kube's `ValidateScaleSpec` and
/// `ValidateScaleStatus` do: of the right type, and replicas within
/// 0..=2147483647, each cause naming the path as the CRD wrote it. So negative
/// replicas through `/scale` are the custom resource's 422, and `/status`
/// checks the status fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_resource_s_scale_fields_are_validated_on_every_write() {
    let test = test_support::devcluster("scale-valid").await;
    apply(&test, &widget_crd(true)).await;
    apply(&test, &widget("w", "spec: {replicas: 1}\n")).await;
    let invalid = |name: &str, field: &str, message: &str| {
        failure(
            422,
            "Invalid",
            &format!("Widget.scale.example.io \"{name}\" is invalid: {field}: {message}"),
            Some(serde_json::json!({
                "name": name,
                "group": "scale.example.io",
                "kind": "Widget",
                "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field}],
            })),
        )
    };

    let (code, body) = send(
        &test,
        "PATCH",
        &widget_scale("w"),
        &[MERGE_PATCH],
        r#"{"spec":{"replicas":-1}}"#,
    )
    .await;
    assert_eq!(code, 422, "{body:?}");
    assert_eq!(
        json(&body),
        invalid(
            "w",
            ".spec.replicas",
            "Invalid value: -1: should be a non-negative integer"
        )
    );

    let widgets = "/apis/scale.example.io/v1/namespaces/default/widgets";
    for (name, replicas, message) in [
        (
            "text",
            r#""three""#,
            "Invalid value: 0: .spec.replicas accessor error: three is of the type string, expected int64",
        ),
        (
            "big",
            "4294967298",
            "Invalid value: 4294967298: should be less than or equal to 2147483647",
        ),
    ] {
        let widget = format!(
            r#"{{"apiVersion":"scale.example.io/v1","kind":"Widget","metadata":{{"name":"{name}","namespace":"default"}},"spec":{{"replicas":{replicas}}}}}"#
        );
        let (code, body) = send(
            &test,
            "POST",
            widgets,
            &[("content-type", "application/json")],
            &widget,
        )
        .await;
        assert_eq!(code, 422, "{name}: {body:?}");
        assert_eq!(json(&body), invalid(name, ".spec.replicas", message), "{name}");
    }

    let (code, body) = send(
        &test,
        "PATCH",
        &format!("{widgets}/w/status"),
        &[MERGE_PATCH],
        r#"{"status":{"replicas":1,"selector":5}}"#,
    )
    .await;
    assert_eq!(code, 422, "{body:?}");
    assert_eq!(
        json(&body),
        invalid(
            "w",
            ".status.selector",
            "Invalid value: \"\": .status.selector accessor error: 5 is of the type int64, expected string"
        )
    );
}

/// A built-in's Scale is validated before it is written, as kube's registry
/// does with `ValidateScale`: negative replicas are the Scale's 422
/// (`Scale.autoscaling`), through a patch or a PUT, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_replicas_in_a_built_in_s_scale_are_the_scale_s_422() {
    let test = test_support::devcluster("scale-builtin").await;
    apply(&test, &deployment(2)).await;
    let path = DEPLOYMENT_SCALE;
    let message = "Invalid value: -1: must be greater than or equal to 0";
    let invalid = failure(
        422,
        "Invalid",
        &format!("Scale.autoscaling \"d\" is invalid: spec.replicas: {message}"),
        Some(serde_json::json!({
            "name": "d",
            "group": "autoscaling",
            "kind": "Scale",
            "causes": [{"reason": "FieldValueInvalid", "message": message, "field": "spec.replicas"}],
        })),
    );
    let writes = [
        (
            "PATCH",
            "application/merge-patch+json",
            r#"{"spec":{"replicas":-1}}"#,
        ),
        (
            "PUT",
            "application/json",
            r#"{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"d","namespace":"default"},"spec":{"replicas":-1}}"#,
        ),
    ];
    check_refused_scale_writes(&test, path, &writes, 422, &invalid, 2).await;
}

/// kube's `ValidateScale` checks a built-in's Scale's metadata too
/// (`ValidateObjectMeta`), before anything is written: bad labels or
/// finalizers, sent in a PUT or patched in, are the Scale's 422 with kube's
/// causes, and the replicas stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_built_in_s_scale_metadata_is_validated() {
    let test = test_support::devcluster("scale-metadata").await;
    apply(&test, &deployment(2)).await;
    let name_part = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    let label = format!("Invalid value: \"bad key\": {name_part}");
    let finalizer = "Invalid value: \"custom\": name is neither a standard finalizer name nor is it fully qualified";
    let invalid = failure(
        422,
        "Invalid",
        &format!("Scale.autoscaling \"d\" is invalid: [metadata.labels: {label}, metadata.finalizers[0]: {finalizer}]"),
        Some(serde_json::json!({
            "name": "d",
            "group": "autoscaling",
            "kind": "Scale",
            "causes": [
                {"reason": "FieldValueInvalid", "message": label, "field": "metadata.labels"},
                {"reason": "FieldValueInvalid", "message": finalizer, "field": "metadata.finalizers[0]"},
            ],
        })),
    );
    let writes = [
        (
            "PATCH",
            "application/merge-patch+json",
            r#"{"metadata":{"labels":{"bad key":"v"},"finalizers":["custom"]},"spec":{"replicas":5}}"#,
        ),
        (
            "PUT",
            "application/json",
            r#"{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"d","namespace":"default","labels":{"bad key":"v"},"finalizers":["custom"]},"spec":{"replicas":5}}"#,
        ),
    ];
    check_refused_scale_writes(&test, DEPLOYMENT_SCALE, &writes, 422, &invalid, 2).await;

    scale_written(
        &test,
        "PATCH",
        DEPLOYMENT_SCALE,
        &[MERGE_PATCH],
        r#"{"metadata":{"labels":{"app":"d"},"finalizers":["example.com/f"]},"spec":{"replicas":5}}"#,
        5,
    )
    .await;
}

/// kube's handlers hold the Scale a write asks for to the request before its
/// registry sees it: a Scale without a namespace takes the request's (a PUT
/// or a patch that removes it is written), another namespace or another name
/// is a 400 and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_write_is_held_to_the_request_s_name_and_namespace() {
    let test = test_support::devcluster("scale-names").await;
    apply(&test, &deployment(2)).await;
    let put = |metadata: &str, replicas: i64| {
        format!(
            r#"{{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{{{metadata}}},"spec":{{"replicas":{replicas}}}}}"#
        )
    };
    let scale = scale_written(
        &test,
        "PUT",
        DEPLOYMENT_SCALE,
        &[("content-type", "application/json")],
        &put(r#""name":"d""#, 3),
        3,
    )
    .await;
    assert_eq!(scale["metadata"]["namespace"], "default");
    scale_written(
        &test,
        "PATCH",
        DEPLOYMENT_SCALE,
        &[MERGE_PATCH],
        r#"{"metadata":{"namespace":null},"spec":{"replicas":2}}"#,
        2,
    )
    .await;

    let namespace = failure(
        400,
        "BadRequest",
        "the namespace of the provided object does not match the namespace sent on the request",
        None,
    );
    let other_namespace = put(r#""name":"d","namespace":"kube-system""#, 5);
    let writes = [
        ("PUT", "application/json", other_namespace.as_str()),
        (
            "PATCH",
            "application/merge-patch+json",
            r#"{"metadata":{"namespace":"kube-system"},"spec":{"replicas":5}}"#,
        ),
    ];
    check_refused_scale_writes(&test, DEPLOYMENT_SCALE, &writes, 400, &namespace, 2).await;
    for (name, writes) in [
        (
            "other",
            [
                ("PUT", "application/json", put(r#""name":"other""#, 5)),
                (
                    "PATCH",
                    "application/merge-patch+json",
                    r#"{"metadata":{"name":"other"},"spec":{"replicas":5}}"#.to_string(),
                ),
            ],
        ),
        (
            "",
            [
                (
                    "PUT",
                    "application/json",
                    put(r#""namespace":"default""#, 5),
                ),
                (
                    "PATCH",
                    "application/json-patch+json",
                    r#"[{"op":"remove","path":"/metadata/name"}]"#.to_string(),
                ),
            ],
        ),
    ] {
        let message = if name.is_empty() {
            "the name of the object (d based on URL) was undeterminable: name must be provided"
                .to_owned()
        } else {
            format!("the name of the object ({name}) does not match the name on the URL (d)")
        };
        let writes: Vec<_> = writes
            .iter()
            .map(|(m, c, b)| (*m, *c, b.as_str()))
            .collect();
        let refused = failure(400, "BadRequest", &message, None);
        check_refused_scale_writes(&test, DEPLOYMENT_SCALE, &writes, 400, &refused, 2).await;
    }
}

/// kube's `checkName` holds what a PUT sends, or a patch makes, to the URL's
/// name: an object that names none is "undeterminable", another name a
/// mismatch; both are 400s and nothing is written. A namespace so refused
/// keeps its name label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_or_patch_that_leaves_the_object_nameless_is_refused() {
    let test = test_support::devcluster("nameless-writes").await;
    apply(
        &test,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: default}\ndata: {k: v}\n",
    )
    .await;
    apply(
        &test,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: named}\n",
    )
    .await;
    let nameless = |name: &str| {
        format!(
            "the name of the object ({name} based on URL) was undeterminable: name must be provided"
        )
    };
    let mismatch = "the name of the object (other) does not match the name on the URL (c)";
    let json_patch = ("content-type", "application/json-patch+json");
    let configmap = "/api/v1/namespaces/default/configmaps/c";
    let namespace = "/api/v1/namespaces/named";
    let writes = [
        (
            "PUT",
            configmap,
            ("content-type", "application/json"),
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"namespace":"default"},"data":{"k":"w"}}"#,
            nameless("c"),
        ),
        (
            "PUT",
            configmap,
            ("content-type", "application/json"),
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"other"},"data":{"k":"w"}}"#,
            mismatch.to_owned(),
        ),
        (
            "PATCH",
            configmap,
            MERGE_PATCH,
            r#"{"metadata":{"name":null},"data":{"k":"w"}}"#,
            nameless("c"),
        ),
        (
            "PATCH",
            configmap,
            json_patch,
            r#"[{"op":"remove","path":"/metadata/name"}]"#,
            nameless("c"),
        ),
        (
            "PATCH",
            namespace,
            json_patch,
            r#"[{"op":"remove","path":"/metadata/name"}]"#,
            nameless("named"),
        ),
    ];
    for (method, path, header, body, message) in &writes {
        let (code, answer) = send(&test, method, path, &[*header], body).await;
        assert_eq!(code, 400, "{method} {path} {body}: {answer:?}");
        assert_eq!(
            json(&answer),
            failure(400, "BadRequest", message, None),
            "{method} {path} {body}"
        );
    }
    let (_, stored) = get(&test, configmap, None).await;
    assert_eq!(json(&stored)["data"], serde_json::json!({"k": "v"}));
    let (_, stored) = get(&test, namespace, None).await;
    assert_eq!(
        json(&stored)["metadata"]["labels"]["kubernetes.io/metadata.name"],
        "named"
    );
}

/// A uid in a PUT's Scale is a precondition on the object, as kube's
/// `scaleUpdatedObjectInfo.Preconditions` passes it on to storage, for a custom
/// resource and a built-in alike: another uid is the registry's 409 wrapping
/// the storage error (with the object's etcd key), checked before the Scale is
/// validated, and the replicas stay. The object's own uid is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_put_naming_another_uid_is_a_conflict() {
    let test = test_support::devcluster("scale-uid").await;
    apply(&test, &widget_crd(true)).await;
    apply(&test, &widget("w", "spec: {replicas: 1}\n")).await;
    apply(&test, &deployment(2)).await;
    let widget_path = widget_scale("w");
    for (path, name, resource, group, key, replicas) in [
        (
            widget_path.as_str(),
            "w",
            "widgets",
            "scale.example.io",
            "/registry/scale.example.io/widgets/default/w",
            1,
        ),
        (
            DEPLOYMENT_SCALE,
            "d",
            "deployments",
            "apps",
            "/registry/deployments/default/d",
            2,
        ),
    ] {
        let (code, body) = get(&test, path, None).await;
        assert_eq!(code, 200, "{body:?}");
        let uid = json(&body)["metadata"]["uid"]
            .as_str()
            .expect("a uid")
            .to_string();
        let put = |uid: &str, replicas: i64| {
            format!(
                r#"{{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{{"name":"{name}","namespace":"default","uid":"{uid}"}},"spec":{{"replicas":{replicas}}}}}"#
            )
        };
        let conflict = failure(
            409,
            "Conflict",
            &format!("Operation cannot be fulfilled on {resource}.{group} \"{name}\": StorageError: invalid object, Code: 4, Key: {key}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: not-the-uid, UID in object meta: {uid}"),
            Some(serde_json::json!({"name": name, "group": group, "kind": resource})),
        );
        // Negative replicas too: the precondition is checked first.
        let other_uid = put("not-the-uid", -1);
        let writes = [("PUT", "application/json", other_uid.as_str())];
        check_refused_scale_writes(&test, path, &writes, 409, &conflict, replicas).await;

        scale_written(
            &test,
            "PUT",
            path,
            &[("content-type", "application/json")],
            &put(&uid, 5),
            5,
        )
        .await;
    }
}
