//! Admission webhooks through the real server and real kubectl: a tiny HTTPS
//! webhook server on 127.0.0.1 allows (with a warning), denies (with its message
//! and code), mutates (with a JSON patch) or answers too slowly, reached through a
//! Service (`<service>.<namespace>.svc` checked against the caBundle) or a URL.

use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};

use crproxy_core::pki::CertificateAuthority;

const SERVICE: &str = "hooks";
const NAMESPACE: &str = "default";

/// The answer of the test webhook for one path.
fn answer(path: &str, request: &Value) -> Value {
    let uid = request["uid"].clone();
    match path {
        "/allow" => {
            json!({"uid": uid, "allowed": true, "warnings": ["the webhook looked at this"]})
        }
        "/deny" => json!({"uid": uid, "allowed": false, "warnings": ["denials can warn too"],
            "status": {"code": 403, "reason": "Forbidden", "message": "no thanks"}}),
        "/deny-plain" => json!({"uid": uid, "allowed": false}),
        "/mutate" => {
            let patch = json!([{"op": "add", "path": "/data/added-by", "value": "webhook"}]);
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
                   "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string())})
        }
        // Records how many data keys it saw.
        "/count" => {
            let keys = request["object"]["data"].as_object().map_or(0, |d| d.len());
            let patch =
                json!([{"op": "add", "path": "/data/keys-seen", "value": keys.to_string()}]);
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
                   "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string())})
        }
        _ => json!({"uid": uid, "allowed": true}),
    }
}

/// A TLS webhook server for `hooks.default.svc` and 127.0.0.1. Returns its
/// address, its CA and the reviews it received as `(path, review)`.
async fn webhook_server() -> (
    std::net::SocketAddr,
    String,
    Arc<Mutex<Vec<(String, Value)>>>,
) {
    let ca = CertificateAuthority::generate("webhook-ca").expect("ca");
    let serving = ca
        .issue_server(
            &[&format!("{SERVICE}.{NAMESPACE}.svc")],
            &["127.0.0.1".parse().expect("ip")],
        )
        .expect("serving cert");
    let provider = Arc::new(crproxy_kube::crypto_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(serving.cert.as_bytes()).expect("cert")],
            PrivateKeyDer::from_pem_slice(serving.key.as_bytes()).expect("key"),
        )
        .expect("tls");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let log = Arc::clone(&log);
                    async move {
                        let path = request.uri().path().to_string();
                        let body = request.into_body().collect().await.map(|b| b.to_bytes());
                        let review: Value = body
                            .ok()
                            .and_then(|b| serde_json::from_slice(&b).ok())
                            .unwrap_or(Value::Null);
                        log.lock()
                            .expect("log")
                            .push((path.clone(), review.clone()));
                        if path == "/slow" {
                            tokio::time::sleep(Duration::from_secs(3)).await;
                        }
                        let reply = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                           "response": answer(&path, &review["request"])});
                        Ok::<_, Infallible>(
                            http::Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(reply.to_string())))
                                .expect("response"),
                        )
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, ca.pem().cert.clone(), seen)
}

/// A webhook on ConfigMaps labelled `hook=<selector>` in the given configuration
/// kind, reached through the `hooks` Service at `path`.
fn configuration(kind: &str, name: &str, selector: &str, hook: Value) -> Value {
    let mut hook = hook;
    hook["name"] = json!(name);
    hook["sideEffects"] = hook.get("sideEffects").cloned().unwrap_or(json!("None"));
    hook["admissionReviewVersions"] = json!(["v1"]);
    hook["objectSelector"] = json!({"matchLabels": {"hook": selector}});
    hook["rules"] = hook.get("rules").cloned().unwrap_or(json!([{
        "operations": ["CREATE", "UPDATE", "DELETE"], "apiGroups": [""], "apiVersions": ["v1"],
        "resources": ["configmaps"]}]));
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
           "metadata": {"name": name}, "webhooks": [hook]})
}

fn service_client(port: u16, path: &str, ca: &str) -> Value {
    json!({"service": {"namespace": NAMESPACE, "name": SERVICE, "port": port, "path": path},
           "caBundle": base64::engine::general_purpose::STANDARD.encode(ca)})
}

fn configmap(name: &str, hook: &str) -> String {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"hook": hook}},
           "data": {"k": "v"}})
    .to_string()
}

async fn create(kubeconfig: &Path, manifest: &str, extra: &[&str]) -> test_support::KubectlOutput {
    let mut args = vec!["create", "-f", "-"];
    args.extend_from_slice(extra);
    test_support::kubectl_stdin_async(kubeconfig, &args, manifest, Duration::from_secs(30)).await
}

async fn exists(kubeconfig: &Path, name: &str) -> bool {
    test_support::kubectl_async(kubeconfig, &["-n", NAMESPACE, "get", "configmap", name])
        .await
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_allow_deny_mutate_and_fail_as_kube_apiserver_does() {
    let test = test_support::devcluster("webhooks").await;
    let admin = &test.kubeconfig;
    let (addr, ca, seen) = webhook_server().await;
    let port = addr.port();
    let other_ca = CertificateAuthority::generate("someone-else")
        .expect("ca")
        .pem()
        .cert
        .clone();
    // A port where nobody listens, held for the test.
    let refused = test_support::RefusedPort::bind();
    let closed = refused.addr.port();

    let service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": "localhost",
                 "ports": [{"port": port, "protocol": "TCP"}]}});
    let url = |path: &str| {
        json!({"url": format!("https://127.0.0.1:{port}{path}"),
               "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca)})
    };
    let v = "ValidatingWebhookConfiguration";
    let m = "MutatingWebhookConfiguration";
    let configurations = [
        configuration(
            v,
            "allow.hooks.test",
            "allow",
            json!({"clientConfig": service_client(port, "/allow", &ca)}),
        ),
        configuration(
            v,
            "deny.hooks.test",
            "deny",
            json!({"clientConfig": service_client(port, "/deny", &ca)}),
        ),
        configuration(
            v,
            "deny-plain.hooks.test",
            "deny-plain",
            json!({"clientConfig": url("/deny-plain")}),
        ),
        configuration(
            v,
            "frozen.hooks.test",
            "frozen",
            json!({"clientConfig": service_client(port, "/deny", &ca),
            "rules": [{"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}]}),
        ),
        configuration(
            m,
            "mutate.hooks.test",
            "mutate",
            json!({"clientConfig": service_client(port, "/mutate", &ca)}),
        ),
        // Sorted before mutate-too.hooks.test, so they see the object before its change.
        configuration(
            m,
            "count-again.hooks.test",
            "reinvoke",
            json!({"reinvocationPolicy": "IfNeeded",
            "clientConfig": service_client(port, "/count", &ca)}),
        ),
        configuration(
            m,
            "count-once.hooks.test",
            "reinvoke",
            json!({"clientConfig": service_client(port, "/count", &ca)}),
        ),
        configuration(
            m,
            "mutate-too.hooks.test",
            "reinvoke",
            json!({"clientConfig": service_client(port, "/mutate", &ca)}),
        ),
        configuration(
            v,
            "down-fail.hooks.test",
            "down-fail",
            json!({"clientConfig":
            {"url": format!("https://127.0.0.1:{closed}/allow"),
             "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca)}}),
        ),
        configuration(
            v,
            "down-ignore.hooks.test",
            "down-ignore",
            json!({"failurePolicy": "Ignore", "clientConfig":
            {"url": format!("https://127.0.0.1:{closed}/allow"),
             "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca)}}),
        ),
        configuration(
            v,
            "slow.hooks.test",
            "slow",
            json!({"timeoutSeconds": 1, "clientConfig": url("/slow")}),
        ),
        configuration(
            v,
            "wrong-ca.hooks.test",
            "wrong-ca",
            json!({"clientConfig": service_client(port, "/allow", &other_ca)}),
        ),
    ];
    let created = create(admin, &service.to_string(), &[]).await;
    assert!(created.success(), "{}", created.stderr);
    for c in &configurations {
        let created = create(admin, &c.to_string(), &[]).await;
        assert!(created.success(), "{}", created.stderr);
    }

    // Allowed, with the webhook's warning shown by kubectl.
    let out = create(admin, &configmap("a", "allow"), &[]).await;
    assert!(out.success(), "{}", out.stderr);
    assert!(
        out.stderr.contains("Warning: the webhook looked at this"),
        "{}",
        out.stderr
    );
    let review = seen
        .lock()
        .expect("log")
        .iter()
        .find(|(p, r)| p == "/allow" && r["request"]["name"] == "a")
        .map(|(_, r)| r.clone())
        .expect("the allow webhook was called");
    let request = &review["request"];
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(request["operation"], "CREATE");
    assert_eq!(request["namespace"], NAMESPACE);
    assert_eq!(
        request["kind"],
        json!({"group": "", "version": "v1", "kind": "ConfigMap"})
    );
    assert_eq!(
        request["resource"],
        json!({"group": "", "version": "v1", "resource": "configmaps"})
    );
    assert_eq!(request["object"]["data"]["k"], "v");
    assert_eq!(request["dryRun"], false);
    assert_eq!(request["options"]["kind"], "CreateOptions");
    assert_eq!(request["userInfo"]["username"], "admin");
    assert!(request["userInfo"]["groups"]
        .as_array()
        .is_some_and(|g| g.contains(&json!("system:masters"))));

    // Denied with the webhook's message and code; nothing is stored.
    let out = create(admin, &configmap("d", "deny"), &[]).await;
    assert!(!out.success());
    assert!(
        out.stderr.contains(
            "Error from server (Forbidden): error when creating \"STDIN\": admission webhook \"deny.hooks.test\" denied the request: no thanks"
        ),
        "{}",
        out.stderr
    );
    // The denying webhook's warnings still reach the client.
    assert!(
        out.stderr.contains("Warning: denials can warn too"),
        "{}",
        out.stderr
    );
    assert!(!exists(admin, "d").await);
    // Without a status: 400 without a reason, and "without explanation".
    let out = create(admin, &configmap("dp", "deny-plain"), &[]).await;
    assert!(
        out.stderr.contains(
            "Error from server: error when creating \"STDIN\": admission webhook \"deny-plain.hooks.test\" denied the request without explanation"
        ),
        "{}",
        out.stderr
    );

    // Mutated before it is stored.
    let out = create(admin, &configmap("mu", "mutate"), &[]).await;
    assert!(out.success(), "{}", out.stderr);
    let stored = test_support::kubectl_json_async(
        admin,
        &["-n", NAMESPACE, "get", "configmap", "mu", "-o", "json"],
    )
    .await
    .expect("mutated configmap");
    assert_eq!(stored["data"]["added-by"], "webhook");

    // reinvocationPolicy IfNeeded: called again after a later webhook's change.
    let out = create(admin, &configmap("re", "reinvoke"), &[]).await;
    assert!(out.success(), "{}", out.stderr);
    let stored = test_support::kubectl_json_async(
        admin,
        &["-n", NAMESPACE, "get", "configmap", "re", "-o", "json"],
    )
    .await
    .expect("reinvoked configmap");
    assert_eq!(stored["data"]["added-by"], "webhook");
    // count-again ran first (k), count-once then (k, keys-seen), mutate-too added
    // added-by, and count-again ran once more (k, keys-seen, added-by).
    assert_eq!(stored["data"]["keys-seen"], "3");
    let counted = seen
        .lock()
        .expect("log")
        .iter()
        .filter(|(p, r)| p == "/count" && r["request"]["name"] == "re")
        .count();
    assert_eq!(counted, 3);

    // Updates see the old object; a webhook on UPDATE only does not stop create or delete.
    let out = create(admin, &configmap("fr", "frozen"), &[]).await;
    assert!(out.success(), "{}", out.stderr);
    let out = test_support::kubectl_async(
        admin,
        &["-n", NAMESPACE, "label", "configmap", "fr", "extra=1"],
    )
    .await;
    assert!(
        out.stderr
            .contains("admission webhook \"frozen.hooks.test\" denied the request: no thanks"),
        "{}",
        out.stderr
    );
    let update_review = seen
        .lock()
        .expect("log")
        .iter()
        .rev()
        .find(|(_, r)| r["request"]["name"] == "fr")
        .map(|(_, r)| r.clone())
        .expect("the frozen webhook saw the update");
    assert_eq!(update_review["request"]["operation"], "UPDATE");
    assert_eq!(update_review["request"]["options"]["kind"], "PatchOptions");
    assert_eq!(
        update_review["request"]["oldObject"]["metadata"]["name"],
        "fr"
    );
    assert_eq!(
        update_review["request"]["object"]["metadata"]["labels"]["extra"],
        "1"
    );
    let out =
        test_support::kubectl_async(admin, &["-n", NAMESPACE, "delete", "configmap", "fr"]).await;
    assert!(out.success(), "{}", out.stderr);

    // Deletes go to webhooks too, with the stored object as oldObject.
    let out = create(admin, &configmap("del", "allow"), &[]).await;
    assert!(out.success(), "{}", out.stderr);
    let out =
        test_support::kubectl_async(admin, &["-n", NAMESPACE, "delete", "configmap", "del"]).await;
    assert!(out.success(), "{}", out.stderr);
    assert!(
        out.stderr.contains("Warning: the webhook looked at this"),
        "{}",
        out.stderr
    );
    assert!(seen.lock().expect("log").iter().any(|(_, r)| {
        r["request"]["operation"] == "DELETE"
            && r["request"]["oldObject"]["metadata"]["name"] == "del"
            && r["request"].get("object").is_none()
    }));

    // A deletecollection sends one DELETE review per object, each named.
    let out = create(admin, &configmap("dc1", "allow"), &[]).await;
    assert!(out.success(), "{}", out.stderr);
    let out = test_support::kubectl_async(
        admin,
        &[
            "delete",
            "--raw",
            "/api/v1/namespaces/default/configmaps?labelSelector=hook%3Dallow",
        ],
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    assert!(seen
        .lock()
        .expect("log")
        .iter()
        .any(|(_, r)| { r["request"]["operation"] == "DELETE" && r["request"]["name"] == "dc1" }));
    assert!(!exists(admin, "dc1").await);

    // Dry run: the (side-effect free) webhook is told, nothing is stored.
    let out = create(admin, &configmap("dry", "allow"), &["--dry-run=server"]).await;
    assert!(out.success(), "{}", out.stderr);
    assert!(!exists(admin, "dry").await);
    assert!(seen
        .lock()
        .expect("log")
        .iter()
        .any(|(_, r)| r["request"]["name"] == "dry" && r["request"]["dryRun"] == true));

    // The webhook server is down: Fail answers 500, Ignore lets the write through.
    let out = create(admin, &configmap("df", "down-fail"), &[]).await;
    let expected = format!(
        "Error from server (InternalError): error when creating \"STDIN\": Internal error occurred: failed calling webhook \"down-fail.hooks.test\": failed to call webhook: Post \"https://127.0.0.1:{closed}/allow?timeout=10s\": dial tcp 127.0.0.1:{closed}: connect: connection refused"
    );
    assert!(out.stderr.contains(&expected), "{}", out.stderr);
    assert!(!exists(admin, "df").await);
    let out = create(admin, &configmap("di", "down-ignore"), &[]).await;
    assert!(out.success(), "{}", out.stderr);

    // Too slow for its timeoutSeconds.
    let out = create(admin, &configmap("sl", "slow"), &[]).await;
    let expected = format!(
        "failed calling webhook \"slow.hooks.test\": failed to call webhook: Post \"https://127.0.0.1:{port}/slow?timeout=1s\": context deadline exceeded"
    );
    assert!(out.stderr.contains(&expected), "{}", out.stderr);
    assert!(!exists(admin, "sl").await);

    // A caBundle that did not sign the serving certificate.
    let out = create(admin, &configmap("ca", "wrong-ca"), &[]).await;
    let expected = format!(
        "failed calling webhook \"wrong-ca.hooks.test\": failed to call webhook: Post \"https://{SERVICE}.{NAMESPACE}.svc:{port}/allow?timeout=10s\": tls: failed to verify certificate: x509: certificate signed by unknown authority"
    );
    assert!(out.stderr.contains(&expected), "{}", out.stderr);
    assert!(!exists(admin, "ca").await);

    // A create in a missing namespace is refused before any webhook sees it.
    let before = seen.lock().expect("log").len();
    let missing = configmap("nowhere", "mutate")
        .replace("\"namespace\":\"default\"", "\"namespace\":\"missing\"");
    let out = create(admin, &missing, &[]).await;
    assert!(
        out.stderr.contains("namespaces \"missing\" not found"),
        "{}",
        out.stderr
    );
    assert_eq!(seen.lock().expect("log").len(), before);

    // Objects without a matching label are never sent.
    let before = seen.lock().expect("log").len();
    let out = create(admin, &configmap("plain", "none"), &[]).await;
    assert!(out.success(), "{}", out.stderr);
    assert_eq!(seen.lock().expect("log").len(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_configurations_are_served_defaulted_and_validated() {
    let test = test_support::devcluster("webhook-config").await;
    let admin = &test.kubeconfig;
    let hook = configuration(
        "ValidatingWebhookConfiguration",
        "one.hooks.test",
        "x",
        json!({"clientConfig": {"service": {"namespace": "default", "name": "hooks"}}}),
    );
    let out = create(admin, &hook.to_string(), &[]).await;
    assert!(out.success(), "{}", out.stderr);
    let stored = test_support::kubectl_json_async(
        admin,
        &[
            "get",
            "validatingwebhookconfiguration",
            "one.hooks.test",
            "-o",
            "json",
        ],
    )
    .await
    .expect("stored");
    let webhook = &stored["webhooks"][0];
    assert_eq!(webhook["failurePolicy"], "Fail");
    assert_eq!(webhook["matchPolicy"], "Equivalent");
    assert_eq!(webhook["timeoutSeconds"], 10);
    assert_eq!(webhook["namespaceSelector"], json!({}));
    assert_eq!(webhook["clientConfig"]["service"]["port"], 443);
    assert_eq!(webhook["rules"][0]["scope"], "*");
    assert_eq!(stored["metadata"]["generation"], 1);

    let table =
        test_support::kubectl_async(admin, &["get", "validatingwebhookconfigurations"]).await;
    assert!(table.success(), "{}", table.stderr);
    let header: Vec<&str> = table
        .stdout
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "WEBHOOKS", "AGE"]);
    assert!(
        table.stdout.contains("one.hooks.test   1"),
        "{}",
        table.stdout
    );

    let explained = test_support::kubectl_async(
        admin,
        &[
            "explain",
            "mutatingwebhookconfiguration.webhooks.reinvocationPolicy",
        ],
    )
    .await;
    assert!(explained.success(), "{}", explained.stderr);

    let mut bad = configuration(
        "MutatingWebhookConfiguration",
        "bad",
        "x",
        json!({"timeoutSeconds": 31, "sideEffects": "Some",
               "clientConfig": {"url": "http://127.0.0.1/x"}}),
    );
    bad["metadata"]["name"] = json!("bad");
    let out = create(admin, &bad.to_string(), &[]).await;
    assert!(!out.success());
    for expected in [
        "The MutatingWebhookConfiguration \"bad\" is invalid",
        "webhooks[0].name: Invalid value: \"bad\": should be a domain with at least three segments separated by dots",
        "webhooks[0].sideEffects: Unsupported value: \"Some\": supported values: \"None\", \"NoneOnDryRun\"",
        "webhooks[0].timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30 seconds",
        "webhooks[0].clientConfig.url: Invalid value: \"http://127.0.0.1/x\": 'https' is the only allowed URL scheme",
    ] {
        assert!(out.stderr.contains(expected), "{expected}\n{}", out.stderr);
    }
}

/// A namespaced custom resource with a status subresource.
const WIDGET_CRD: &str = r#"{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "widgets.example.com"},
  "spec": {"group": "example.com", "scope": "Namespaced",
    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
    "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {},
        "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
      "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_tell_a_resource_from_its_status_and_scale_subresources() {
    let test = test_support::devcluster("webhook-subresources").await;
    let admin = &test.kubeconfig;
    let (addr, ca, seen) = webhook_server().await;
    let out = create(admin, WIDGET_CRD, &[]).await;
    assert!(out.success(), "{}", out.stderr);
    let out = test_support::kubectl_async(
        admin,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=20s",
            "crd/widgets.example.com",
        ],
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    let client = |path: &str| {
        json!({"url": format!("https://127.0.0.1:{}{path}", addr.port()),
               "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca)})
    };
    let rule = |resources: &str| {
        json!([{"operations": ["UPDATE"], "apiGroups": ["example.com"], "apiVersions": ["v1"],
                "resources": [resources], "scope": "Namespaced"}])
    };
    let v = "ValidatingWebhookConfiguration";
    for c in [
        configuration(
            v,
            "main.hooks.test",
            "w",
            json!({"clientConfig": client("/deny"), "rules": rule("widgets")}),
        ),
        configuration(
            v,
            "status.hooks.test",
            "w",
            json!({"clientConfig": client("/allow"), "rules": rule("widgets/status")}),
        ),
        configuration(
            v,
            "scale.hooks.test",
            "w",
            json!({"clientConfig": client("/deny"), "rules": rule("widgets/scale")}),
        ),
    ] {
        // A Scale carries no labels: an objectSelector would never match it.
        let mut c = c;
        if c["metadata"]["name"] == "scale.hooks.test" {
            c["webhooks"][0]["objectSelector"] = json!({});
        }
        let out = create(admin, &c.to_string(), &[]).await;
        assert!(out.success(), "{}", out.stderr);
    }
    let widget = json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1", "namespace": NAMESPACE, "labels": {"hook": "w"}}, "spec": {"size": 1, "replicas": 1}});
    let out = create(admin, &widget.to_string(), &[]).await;
    assert!(out.success(), "{}", out.stderr);

    // The status subresource goes only to the `widgets/status` webhook.
    let out = test_support::kubectl_async(
        admin,
        &[
            "-n",
            NAMESPACE,
            "patch",
            "widget",
            "w1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"ok":true}}"#,
        ],
    )
    .await;
    assert!(out.success(), "{}", out.stderr);
    assert!(
        out.stderr.contains("Warning: the webhook looked at this"),
        "{}",
        out.stderr
    );
    let status_review = seen
        .lock()
        .expect("log")
        .last()
        .map(|(_, r)| r.clone())
        .expect("a review");
    assert_eq!(status_review["request"]["subResource"], "status");
    assert_eq!(status_review["request"]["kind"]["kind"], "Widget");
    assert_eq!(status_review["request"]["object"]["status"]["ok"], true);

    // The main resource goes only to the `widgets` webhook, which denies.
    let out = test_support::kubectl_async(
        admin,
        &["-n", NAMESPACE, "label", "widget", "w1", "more=yes"],
    )
    .await;
    assert!(
        out.stderr
            .contains("admission webhook \"main.hooks.test\" denied the request: no thanks"),
        "{}",
        out.stderr
    );
    // The scale subresource sends the Scale (autoscaling/v1) to `widgets/scale`.
    let out = test_support::kubectl_async(
        admin,
        &["-n", NAMESPACE, "scale", "widget", "w1", "--replicas=3"],
    )
    .await;
    assert!(
        out.stderr
            .contains("admission webhook \"scale.hooks.test\" denied the request: no thanks"),
        "{}",
        out.stderr
    );
    let scale_review = seen
        .lock()
        .expect("log")
        .iter()
        .rev()
        .find(|(_, r)| r["request"]["subResource"] == "scale")
        .map(|(_, r)| r.clone())
        .expect("the scale webhook was called");
    let request = &scale_review["request"];
    assert_eq!(
        request["kind"],
        json!({"group": "autoscaling", "version": "v1", "kind": "Scale"})
    );
    assert_eq!(
        request["resource"],
        json!({"group": "example.com", "version": "v1", "resource": "widgets"})
    );
    assert_eq!(request["object"]["kind"], "Scale");
    assert_eq!(request["object"]["spec"]["replicas"], 3);
    assert_eq!(request["oldObject"]["spec"]["replicas"], 1);
    let stored = test_support::kubectl_json_async(
        admin,
        &["-n", NAMESPACE, "get", "widget", "w1", "-o", "json"],
    )
    .await
    .expect("widget");
    assert_eq!(stored["status"]["ok"], true);
    assert_eq!(stored["spec"]["replicas"], 1);
    assert!(stored["metadata"]["labels"].get("more").is_none());
}
