//! The admission decisions that need no cluster, against a host that is not there
//! (127.0.0.1:1 refuses connections): what is skipped, the 503/429/415 answers, and
//! an unreachable host's cleanup that cannot tell whether the write reached it; and
//! against a host that never answers, a review its caller gave up on.

use crproxy_core::locks;
use crproxy_core::status::status;
use std::io::Write;
use std::sync::Mutex as StdMutex;

use super::*;
use crate::fake_api::{
    gateways_type, not_found, silent_api, success, unreachable_api, Answer, AnswerFn, FakeApi,
    HANG_UP, STALL,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::reflector::store::Writer;
use std::sync::atomic::{AtomicUsize, Ordering};

fn write_through(permits: usize) -> (Arc<WriteThrough>, Arc<Gate>, Arc<SyncMetrics>) {
    let gate = Gate::new();
    let metrics = SyncMetrics::new();
    let types = types_by_resource([(gateways_type(true), Arc::clone(&gate))]);
    let wt = Arc::new(WriteThrough {
        tenant: "client".into(),
        tenant_project: "default".into(),
        host_namespace: "vcluster-client".into(),
        host: unreachable_api(),
        tenant_client: unreachable_api(),
        types,
        metrics: Arc::clone(&metrics),
        in_flight: Arc::new(Semaphore::new(permits)),
        waiting: Arc::new(Semaphore::new(MAX_WAITING)),
        timeout: Duration::from_secs(5),
        confirm_within: Duration::from_secs(1),
    });
    (wt, gate, metrics)
}

fn synced(gate: &Arc<Gate>) {
    gate.open_term()
        .caches_synced(Writer::<DynamicObject>::new(gateways_type(true).api).as_reader());
}

/// `wt` changed by `change` (its clusters, its timeouts, its types).
fn configured(wt: Arc<WriteThrough>, change: impl FnOnce(&mut WriteThrough)) -> Arc<WriteThrough> {
    let mut wt = Arc::into_inner(wt).expect("the only reference");
    change(&mut wt);
    Arc::new(wt)
}

/// `wt` with `host` as its host cluster.
fn writing_to(wt: Arc<WriteThrough>, host: kube::Client) -> Arc<WriteThrough> {
    configured(wt, |wt| wt.host = host)
}

/// An UPDATE review of the gateway from resourceVersion 7 to `port`.
fn port_update(port: u16) -> Value {
    let mut old = gateway();
    old["metadata"]["resourceVersion"] = json!("7");
    let mut object = old.clone();
    object["spec"]["port"] = json!(port);
    let mut update = review("UPDATE", object);
    update["request"]["oldObject"] = old;
    update
}

fn review(operation: &str, object: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "req-1", "operation": operation,
            "resource": {"group": "example.net", "version": "v1", "resource": "gateways"},
            "subResource": "", "dryRun": false, "namespace": "team", "name": "edge",
            "object": object, "oldObject": null,
        },
    })
}

fn gateway() -> Value {
    json!({"apiVersion": "example.net/v1", "kind": "Gateway",
           "metadata": {"name": "edge", "namespace": "team", "uid": "u-1"},
           "spec": {"port": 443}})
}

fn response(answer: &Value) -> &Value {
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["uid"], "req-1");
    &answer["response"]
}

#[tokio::test]
async fn dry_runs_subresources_and_deletes_are_allowed_without_touching_the_host() {
    // Not even synced: these never reach the readiness check.
    let (wt, _, _) = write_through(0);
    let mut dry = review("CREATE", gateway());
    dry["request"]["dryRun"] = json!(true);
    let mut status = review("UPDATE", gateway());
    status["request"]["subResource"] = json!("status");
    let delete = review("DELETE", Value::Null);
    for r in [dry, status, delete] {
        let answer = wt.admit(r.clone()).await.expect("a review");
        assert_eq!(response(&answer)["allowed"], true, "{r}");
    }
}

#[tokio::test]
async fn before_the_caches_synced_writes_get_503_with_retry_after_1() {
    let (wt, _, _) = write_through(MAX_IN_FLIGHT);
    let answer = wt
        .admit(review("CREATE", gateway()))
        .await
        .expect("a review");
    assert_retryable_503(&answer, "not synced its caches");
}

/// `answer` denies the write with a 503 that asks for a retry in a second, and
/// its message says `why`.
fn assert_retryable_503(answer: &Value, why: &str) {
    let r = response(answer);
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 503);
    assert_eq!(r["status"]["reason"], "ServiceUnavailable");
    assert_eq!(r["status"]["details"]["retryAfterSeconds"], 1);
    assert!(
        r["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(why)),
        "{r}"
    );
}

/// A review of a type this replica does not write through comes only from a
/// webhook another configuration registered: the write fails closed, retryably,
/// rather than reaching the tenant's store without the host's validation.
#[tokio::test]
async fn a_type_this_configuration_does_not_write_through_gets_503() {
    let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
    synced(&gate);
    let mut other = review("CREATE", gateway());
    other["request"]["resource"]["resource"] = json!("routes");
    let answer = wt.admit(other).await.expect("a review");
    assert_retryable_503(&answer, "routes.example.net is not configured");
}

#[tokio::test]
async fn past_the_in_flight_limit_writes_get_429() {
    let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
    synced(&gate);
    // Every permit taken, as 50 write-throughs in flight would.
    let _held = Arc::clone(&wt.in_flight)
        .acquire_many_owned(MAX_IN_FLIGHT as u32)
        .await
        .expect("permits");
    let answer = wt
        .admit(review("CREATE", gateway()))
        .await
        .expect("a review");
    let r = response(&answer);
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 429);
    assert_eq!(r["status"]["reason"], "TooManyRequests");
    assert_eq!(r["status"]["details"]["retryAfterSeconds"], 1);
    // The key is taken before the place of a host write: a refused write frees it.
    assert!(!gate.is_pending(&Key {
        namespace: "team".into(),
        name: "edge".into(),
    }));
}

/// Whether `key` stops being pending within `limit` (polled every 50 ms): the
/// decision or rollback that holds it runs after the review's answer.
async fn released_within(gate: &Gate, key: &Key, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while gate.is_pending(key) {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// Collects log lines of the current thread (the tests run on a current-thread
/// runtime, so spawned tasks log here too).
#[derive(Clone, Default)]
struct Logs(Arc<StdMutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        locks::lock(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

thread_local! {
    static CAPTURING: std::cell::RefCell<Option<Logs>> = const { std::cell::RefCell::new(None) };
}

/// Ends a capture when dropped.
struct Capture(());

impl Drop for Capture {
    fn drop(&mut self) {
        CAPTURING.with(|capturing| capturing.borrow_mut().take());
    }
}

impl Logs {
    /// Sends this thread's events here until the guard is dropped. One JSON
    /// subscriber serves every test of the binary, installed as the global default
    /// on first use: a subscriber per test (`set_default`) is not reliable while
    /// tests run in parallel, since tracing caches per call site whether anyone
    /// listens.
    fn install(&self) -> Capture {
        static INSTALLED: std::sync::Once = std::sync::Once::new();
        INSTALLED.call_once(|| {
            let subscriber = tracing_subscriber::fmt()
                .json()
                .with_writer(|| -> Box<dyn Write> {
                    match CAPTURING.with(|capturing| capturing.borrow().clone()) {
                        Some(logs) => Box::new(logs),
                        None => Box::new(std::io::sink()),
                    }
                })
                .finish();
            // Another global subscriber would only mean no capture: the log
            // assertions then fail, loudly.
            let _ = tracing::subscriber::set_global_default(subscriber);
        });
        CAPTURING.with(|capturing| *capturing.borrow_mut() = Some(self.clone()));
        Capture(())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&locks::lock(&self.0)).into_owned()
    }
}

#[tokio::test]
async fn an_untranslatable_object_gets_415_and_the_translate_error_log_line() {
    let logs = Logs::default();
    let _guard = logs.install();
    let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
    synced(&gate);
    let mut object = gateway();
    object["metadata"]["uid"] = json!(null);
    let answer = wt.admit(review("CREATE", object)).await.expect("a review");
    let r = response(&answer);
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 415);
    assert_eq!(r["status"]["reason"], "UnsupportedMediaType");
    let text = logs.text();
    assert!(
        text.contains("write-through: rejecting write, rolling back")
            && text.contains(r#""reason":"translate_error""#),
        "{text}"
    );
    // Nothing was held: the syncer is free to look at the key.
    assert!(!gate.is_pending(&Key {
        namespace: "team".into(),
        name: "edge".into()
    }));
}

/// A Gateway naming its Secret in `spec.secretRef.name`, in namespace `b-x-c`:
/// the Secret's host name, `a-x-b-x-c-x-client`, is also that of Secret `a-x-b`
/// in namespace `c`. The write is refused as invalid before the host is asked
/// (127.0.0.1:1 would have answered 503) and nothing is held.
#[tokio::test]
async fn a_reference_whose_host_name_is_ambiguous_gets_422() {
    let (wt, _, _) = write_through(MAX_IN_FLIGHT);
    let gate = Gate::new();
    let mut ty = gateways_type(true);
    ty.resource.patches =
        vec![crproxy_core::config::sync::FieldPath::parse("spec.secretRef.name").expect("a path")];
    let wt = configured(wt, |wt| {
        wt.types = types_by_resource([(ty, Arc::clone(&gate))]);
    });
    synced(&gate);
    let mut object = gateway();
    object["metadata"]["namespace"] = json!("b-x-c");
    object["spec"]["secretRef"] = json!({"name": "a"});
    let answer = wt.admit(review("CREATE", object)).await.expect("a review");
    let r = response(&answer);
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 422, "{answer}");
    assert_eq!(r["status"]["reason"], "Invalid");
    let message = r["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(
            "Gateway.example.net \"edge\" is invalid: spec.secretRef.name: Invalid value: \"a\": in namespace \"b-x-c\""
        )
            && message.contains("the namespace contains \"-x-\""),
        "{message}"
    );
    let details = &r["status"]["details"];
    assert_eq!(
        (&details["name"], &details["kind"], &details["group"]),
        (&json!("edge"), &json!("Gateway"), &json!("example.net")),
        "{answer}"
    );
    assert_eq!(details["causes"][0]["field"], "spec.secretRef.name");
    assert_eq!(details["causes"][0]["reason"], "FieldValueInvalid");
    let cause = details["causes"][0]["message"].as_str().unwrap_or_default();
    assert!(
        cause.starts_with("Invalid value: \"a\": in namespace \"b-x-c\""),
        "{cause}"
    );
    assert!(!gate.is_pending(&key("b-x-c", "edge")));
    // The same reference from an unambiguous namespace goes to the host.
    let mut object = gateway();
    object["spec"]["secretRef"] = json!({"name": "a"});
    let answer = wt.admit(review("CREATE", object)).await.expect("a review");
    assert_eq!(response(&answer)["status"]["code"], 503, "{answer}");
}

/// A host that stores the Gateway's mirror (at first as [`stored_mirror`]) as
/// it is written, moving its resourceVersion.
fn storing_host() -> (impl Answer, Arc<StdMutex<Value>>) {
    let mut first = stored_mirror();
    first["metadata"]["resourceVersion"] = json!("3");
    let stored = Arc::new(StdMutex::new(first));
    let held = Arc::clone(&stored);
    let answer = move |method: &Method, path: &str, body: &Value| {
        let mut stored = locks::lock(&held);
        match *method {
            Method::GET if path == MIRROR_OBJECT_PATH => (200, stored.clone()),
            Method::PUT if path == MIRROR_OBJECT_PATH => {
                let version = stored["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or_default();
                *stored = body.clone();
                stored["metadata"]["resourceVersion"] = json!((version + 1).to_string());
                (200, stored.clone())
            }
            _ => not_found(),
        }
    };
    (answer, stored)
}

/// An UPDATE review of the gateway from `old` to `object`.
fn update_of(old: Value, object: Value) -> Value {
    let mut update = review("UPDATE", object);
    update["request"]["oldObject"] = old;
    update
}

/// A tenant writes crproxy's stand-in marker on its object and takes it off
/// again. Adding it is refused (422) and never reaches the mirror; taking it
/// off (from an object that carries it all the same, e.g. stored while the
/// webhook was not registered) is written through, rather than refused for good
/// as the update of a stand-in.
#[tokio::test]
async fn the_stand_in_marker_is_refused_and_taking_it_off_is_written_through() {
    use crproxy_core::deep_objects::{is_stand_in, TOO_DEEP_ANNOTATION};
    let (host_answer, stored) = storing_host();
    let host = FakeApi::start(host_answer).await;
    let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
    let wt = configured(writing_to(wt, host.client.clone()), |wt| {
        wt.confirm_within = Duration::from_millis(100);
    });
    synced(&gate);
    let mut plain = gateway();
    plain["metadata"]["resourceVersion"] = json!("7");
    let mut marked = plain.clone();
    marked["metadata"]["annotations"] = json!({TOO_DEEP_ANNOTATION: "mine"});
    marked["spec"]["port"] = json!(8443);

    let answer = wt
        .admit(update_of(plain.clone(), marked.clone()))
        .await
        .expect("a review");
    let r = response(&answer);
    assert_eq!(r["allowed"], false, "{answer}");
    assert_eq!(r["status"]["code"], 422, "{answer}");
    let message = r["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(TOO_DEEP_ANNOTATION) && message.contains("cannot be set"),
        "{message}"
    );
    // The details kube-apiserver gives a field error.
    let details = &r["status"]["details"];
    assert_eq!(details["name"], "edge", "{answer}");
    assert_eq!(
        details["causes"],
        json!([{
            "reason": "FieldValueForbidden",
            "field": format!("metadata.annotations[{TOO_DEEP_ANNOTATION}]"),
            "message": "Forbidden: the annotation is crproxy's own (it marks an object nested too deeply to be read) and cannot be set; remove it",
        }]),
        "{answer}"
    );
    assert!(
        !is_stand_in(&locks::lock(&stored)),
        "the marker reached the host"
    );

    let mut unmarked = plain.clone();
    unmarked["spec"]["port"] = json!(9443);
    marked["metadata"]["resourceVersion"] = json!("8");
    let answer = wt
        .admit(update_of(marked, unmarked))
        .await
        .expect("a review");
    assert_eq!(response(&answer)["allowed"], true, "{answer}");
    let mirror = locks::lock(&stored).clone();
    assert_eq!(mirror["spec"]["port"], 9443, "{mirror}");
    assert!(!is_stand_in(&mirror), "{mirror}");
}

/// A host that cannot be reached fails the read before any write: the tenant
/// gets a retryable 503, and nothing having been written, the key is free at
/// once, with no mirror looked for and no rollback failure counted.
#[tokio::test]
async fn a_host_that_cannot_be_reached_gets_503_and_nothing_is_looked_for() {
    let logs = Logs::default();
    let _guard = logs.install();
    let (wt, gate, metrics) = write_through(MAX_IN_FLIGHT);
    synced(&gate);
    let answer = wt
        .admit(review("CREATE", gateway()))
        .await
        .expect("a review");
    let r = response(&answer);
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 503);
    assert_eq!(r["status"]["details"]["retryAfterSeconds"], 1, "{answer}");
    assert!(
        !gate.is_pending(&key("team", "edge")),
        "the key is held for a write that never happened"
    );
    let text = metrics.exposition();
    assert!(!text.contains(r#"reason="host_lookup""#), "{text}");
    let logged = logs.text();
    assert!(logged.contains(r#""reason":"response_error""#), "{logged}");
    assert!(
        !logged.contains("write-through: rollback cannot tell"),
        "{logged}"
    );
}

#[tokio::test]
async fn an_update_of_an_object_being_deleted_is_allowed_without_writing_to_the_host() {
    // A tenant controller removes its finalizer from a terminating object: the
    // syncer owns the delete, and a host write could re-create a removed mirror.
    let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
    synced(&gate);
    let mut old = gateway();
    old["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
    old["metadata"]["finalizers"] = json!(["example.net/cleanup"]);
    let mut object = old.clone();
    object["metadata"]["finalizers"] = json!([]);
    let mut update = review("UPDATE", object);
    update["request"]["oldObject"] = old;
    let answer = wt.admit(update).await.expect("a review");
    // The host (127.0.0.1:1) would have answered 503 had it been tried.
    assert_eq!(response(&answer)["allowed"], true, "{answer}");
    assert!(!gate.is_pending(&Key {
        namespace: "team".into(),
        name: "edge".into()
    }));
}

#[tokio::test]
async fn a_review_dropped_by_its_caller_still_releases_its_key() {
    let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
    let host = silent_api().await;
    let wt = configured(wt, |wt| {
        wt.host = host;
        wt.timeout = Duration::from_secs(2);
    });
    synced(&gate);
    let key = Key {
        namespace: "team".into(),
        name: "edge".into(),
    };
    // The tenant API server gives up on the webhook call while the host write hangs:
    // hyper drops the review's future.
    let review = review("CREATE", gateway());
    let dropped = tokio::time::timeout(Duration::from_millis(200), wt.admit(review)).await;
    assert!(dropped.is_err(), "the silent host answered");
    let released = released_within(&gate, &key, Duration::from_secs(10)).await;
    assert!(
        released,
        "the key stayed pending after its review was dropped"
    );
}

#[tokio::test]
async fn a_body_that_is_not_a_review_is_refused() {
    let (wt, _, _) = write_through(MAX_IN_FLIGHT);
    assert!(wt.admit(json!({"kind": "Pod"})).await.is_none());
}

#[test]
fn the_configuration_matches_only_the_main_resource_fails_closed_and_skips_dry_runs() {
    let listening = SocketAddr::from(([127, 0, 0, 1], 9443));
    let client = client_config(
        &WebhookEndpoint::Listener,
        listening,
        "/validate/t0k",
        "PEM",
    );
    let c = webhook_configuration("client", &client, &[gateways_type(true)]);
    assert_eq!(c["kind"], "ValidatingWebhookConfiguration");
    assert_eq!(c["metadata"]["name"], "crproxy-writethrough-client");
    let w = &c["webhooks"][0];
    assert_eq!(w["sideEffects"], "NoneOnDryRun");
    assert_eq!(w["failurePolicy"], "Fail");
    assert_eq!(w["timeoutSeconds"], 30);
    // A decision ends before the tenant gives up, with room for the connection,
    // TLS and the body before it starts.
    assert_eq!(w["timeoutSeconds"], TIMEOUT.as_secs());
    assert!(DECIDE_WITHIN + Duration::from_secs(5) <= TIMEOUT);
    assert_eq!(w["rules"][0]["resources"], json!(["gateways"]));
    assert_eq!(w["rules"][0]["apiGroups"], json!(["example.net"]));
    assert_eq!(w["rules"][0]["operations"], json!(["CREATE", "UPDATE"]));
    assert_eq!(
        w["clientConfig"]["url"],
        "https://127.0.0.1:9443/validate/t0k"
    );
    assert_eq!(w["clientConfig"]["caBundle"], "UEVN");
}

#[test]
fn the_client_config_follows_how_the_tenant_reaches_the_webhook() {
    let listening = SocketAddr::from(([0, 0, 0, 0], 9443));
    let service = WebhookEndpoint::Service {
        namespace: "kube-system".into(),
        name: "crproxy-writethrough".into(),
        port: 443,
    };
    assert_eq!(
        client_config(&service, listening, "/validate/t0k", "PEM"),
        json!({"service": {"namespace": "kube-system", "name": "crproxy-writethrough", "port": 443, "path": "/validate/t0k"},
               "caBundle": "UEVN"})
    );
    let url = WebhookEndpoint::Url {
        url: "https://crproxy.example.com:9443/hooks".into(),
        host: "crproxy.example.com".into(),
    };
    assert_eq!(
        client_config(&url, listening, "/validate/t0k", "PEM"),
        json!({"url": "https://crproxy.example.com:9443/hooks/validate/t0k", "caBundle": "UEVN"})
    );
    let c = webhook_configuration(
        "client",
        &client_config(&service, listening, "/validate/t0k", "PEM"),
        &[gateways_type(true)],
    );
    assert_eq!(
        c["webhooks"][0]["clientConfig"]["service"]["name"],
        "crproxy-writethrough"
    );
    assert!(c["webhooks"][0]["clientConfig"].get("url").is_none());
}

/// One HTTPS request to the webhook server, trusting only its CA.
async fn https(server: &WebhookServer, method: &str, path: &str, body: &str) -> (u16, Value) {
    https_as(server, "127.0.0.1", method, path, body).await
}

/// [`https`], verifying the serving certificate for `server_name`.
async fn https_as(
    server: &WebhookServer,
    server_name: &str,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, Value) {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(server.ca_pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("CA");
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(crproxy_kube::crypto_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from(server_name.to_owned()).expect("name");
    let tls = connector
        .connect(name, tcp)
        .await
        .expect("TLS with the server's own CA");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let code = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (code, serde_json::from_slice(&body).expect("JSON answer"))
}

#[tokio::test]
async fn the_webhook_answers_reviews_over_tls_and_refuses_anything_else() {
    let (wt, _, _) = write_through(MAX_IN_FLIGHT);
    let server = WebhookServer::start(SocketAddr::from(([127, 0, 0, 1], 0)), &[], wt)
        .await
        .expect("server");
    let path = server.review_path.clone();
    let token = path.strip_prefix(REVIEW_PATH_PREFIX).expect("the prefix");
    assert_eq!(token.len(), 32, "{path}");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{path}");
    // A review: answered (here 503, the type's syncer is not synced).
    let review = review("CREATE", gateway()).to_string();
    let (code, answer) = https(&server, "POST", &path, &review).await;
    assert_eq!(code, 200);
    assert_eq!(answer["response"]["uid"], "req-1");
    assert_eq!(answer["response"]["status"]["code"], 503);
    // Not a review, not JSON, another path: a Status saying so.
    let (code, answer) = https(&server, "POST", &path, r#"{"kind":"Pod"}"#).await;
    assert_eq!((code, answer["reason"].as_str()), (400, Some("BadRequest")));
    let (code, _) = https(&server, "POST", &path, "not json").await;
    assert_eq!(code, 400);
    let (code, answer) = https(&server, "GET", &path, "").await;
    assert_eq!((code, answer["reason"].as_str()), (404, Some("NotFound")));
    // A review at any path but the registered one is not decided: whoever sent
    // it did not read the configuration.
    let longer = format!("{path}x");
    // All of the token but its last character.
    let last = if path.ends_with('0') { '1' } else { '0' };
    let near = format!("{}{last}", &path[..path.len() - 1]);
    for elsewhere in [
        "/validate",
        "/validate/",
        longer.as_str(),
        near.as_str(),
        "/validate/00000000000000000000000000000000",
    ] {
        let (code, answer) = https(&server, "POST", elsewhere, &review).await;
        assert_eq!(
            (code, answer["reason"].as_str()),
            (404, Some("NotFound")),
            "{elsewhere}"
        );
    }
    // Each server has a token of its own.
    let (other_wt, _, _) = write_through(MAX_IN_FLIGHT);
    let other = WebhookServer::start(SocketAddr::from(([127, 0, 0, 1], 0)), &[], other_wt)
        .await
        .expect("server");
    assert_ne!(other.review_path, server.review_path);
    other.stop();
    server.stop();
}

/// The serving certificate covers the name the tenant verifies (a Service's
/// `<name>.<namespace>.svc`, a URL's host) besides the loopback names.
#[tokio::test]
async fn the_serving_certificate_covers_the_configured_host() {
    let (wt, _, _) = write_through(MAX_IN_FLIGHT);
    let server = WebhookServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        &[
            "crproxy-writethrough.kube-system.svc".into(),
            "10.0.0.7".into(),
        ],
        wt,
    )
    .await
    .expect("server");
    for name in [
        "crproxy-writethrough.kube-system.svc",
        "10.0.0.7",
        "localhost",
        "127.0.0.1",
    ] {
        let (code, _) = https_as(&server, name, "GET", "/validate", "").await;
        assert_eq!(code, 404, "{name}");
    }
    server.stop();
}

const MIRROR_PATH: &str = "/apis/example.net/v1/namespaces/vcluster-client/gateways";
/// The Gateway's mirror, under [`MIRROR_PATH`].
const MIRROR_OBJECT_PATH: &str =
    "/apis/example.net/v1/namespaces/vcluster-client/gateways/edge-x-team-x-client";
const TENANT_PATH: &str = "/apis/example.net/v1/namespaces/team/gateways/edge";

/// The host: the mirror is created (uid `m-1`), and deleted when asked.
fn host_answers(method: &Method, path: &str, body: &Value) -> (u16, Value) {
    match *method {
        Method::POST if path == MIRROR_PATH => {
            let mut body = body.clone();
            body["metadata"]["uid"] = json!("m-1");
            body["metadata"]["resourceVersion"] = json!("1");
            (201, body)
        }
        Method::DELETE => success(),
        _ => not_found(),
    }
}

/// An accepted create that the syncer's tenant cache never shows: the cache of a
/// syncer stopped by a lost Lease is frozen, so "not seen" alone proves nothing.
/// The mirror is deleted only when a live read of the tenant says the object with
/// the admitted uid is not there; a tenant that cannot be read keeps the mirror and
/// counts `host_lookup` (nothing is deleted on a cache's word).
#[tokio::test]
async fn an_unconfirmed_create_is_rolled_back_only_when_the_tenant_does_not_hold_it() {
    struct Case {
        tenant: &'static str,
        answer: Option<AnswerFn>,
        deleted: bool,
        host_lookup: bool,
    }
    let cases = [
        Case {
            tenant: "stored it (the admitted uid)",
            answer: Some(|_, path, _| {
                if path == TENANT_PATH {
                    (200, gateway())
                } else {
                    not_found()
                }
            }),
            deleted: false,
            host_lookup: false,
        },
        Case {
            tenant: "does not have it",
            answer: Some(|_, _, _| not_found()),
            deleted: true,
            host_lookup: false,
        },
        Case {
            tenant: "holds another incarnation",
            answer: Some(|_, path, _| {
                let mut other = gateway();
                other["metadata"]["uid"] = json!("u-2");
                if path == TENANT_PATH {
                    (200, other)
                } else {
                    not_found()
                }
            }),
            deleted: true,
            host_lookup: false,
        },
        Case {
            tenant: "cannot be reached",
            answer: None,
            deleted: false,
            host_lookup: true,
        },
    ];
    for case in cases {
        let host = FakeApi::start(host_answers).await;
        let tenant = match case.answer {
            Some(answer) => Some(FakeApi::start(answer).await),
            None => None,
        };
        let (wt, gate, metrics) = write_through(MAX_IN_FLIGHT);
        let wt = configured(wt, |wt| {
            wt.host = host.client.clone();
            wt.tenant_client = tenant
                .as_ref()
                .map_or_else(unreachable_api, |t| t.client.clone());
        });
        // A cache that never shows the object.
        synced(&gate);
        let answer = wt
            .admit(review("CREATE", gateway()))
            .await
            .expect("a review");
        assert_eq!(
            response(&answer)["allowed"],
            true,
            "{}: {answer}",
            case.tenant
        );
        let key = Key {
            namespace: "team".into(),
            name: "edge".into(),
        };
        let released = released_within(&gate, &key, Duration::from_secs(5)).await;
        assert!(released, "{}: the key stayed pending", case.tenant);
        assert_eq!(
            !host.with_method(Method::DELETE).is_empty(),
            case.deleted,
            "{}: host requests {:?}",
            case.tenant,
            host.received()
        );
        if let Some(tenant) = &tenant {
            assert!(
                tenant
                    .with_method(Method::GET)
                    .iter()
                    .any(|r| r.path == TENANT_PATH),
                "{}: the tenant was not read live: {:?}",
                case.tenant,
                tenant.received()
            );
        }
        let text = metrics.exposition();
        assert_eq!(
            text.contains(r#"reason="host_lookup"} 1"#),
            case.host_lookup,
            "{}: {text}",
            case.tenant
        );
    }
}

/// kube's 409 for a delete whose resourceVersion precondition no longer holds.
fn delete_precondition_conflict() -> (u16, Value) {
    (
        409,
        status(409, "Conflict", "Operation cannot be fulfilled on gateways.example.net \"edge-x-team-x-client\": Precondition failed: ResourceVersion in precondition: 1, ResourceVersion in object meta: 2"),
    )
}

/// The host creates the mirror (uid `m-1`, resourceVersion 1), and its controller
/// updates the mirror's status before every pinned delete lands: each DELETE is
/// answered 409, and a read after it finds the same write one resourceVersion
/// later. With `taken_over_after`, once that many deletes have conflicted, a
/// later write has also taken the mirror over: the read finds another spec.
fn conflicting_host(taken_over_after: Option<usize>) -> impl Answer {
    let deletes = AtomicUsize::new(0);
    move |method: &Method, path: &str, body: &Value| {
        let conflicted = deletes.load(Ordering::SeqCst);
        match *method {
            // Only once a delete was tried: write-through's read before its create
            // must find nothing, or it would create nothing to roll back.
            Method::GET if path == MIRROR_OBJECT_PATH && conflicted > 0 => {
                let mut mirror = stored_mirror();
                mirror["metadata"]["resourceVersion"] = json!((conflicted + 1).to_string());
                mirror["status"] = json!({"ready": true});
                if taken_over_after == Some(conflicted) {
                    mirror["spec"]["port"] = json!(8443);
                }
                (200, mirror)
            }
            Method::DELETE => {
                deletes.fetch_add(1, Ordering::SeqCst);
                delete_precondition_conflict()
            }
            _ => creating_host(method, path, body),
        }
    }
}

/// The exposition's line of one rollback failure of the Gateway's type, for `reason`.
fn one_rollback_failure(reason: &str) -> String {
    format!(
        r#"vcluster_writethrough_rollback_failures_total{{resource="gateways.example.net/v1",reason="{reason}"}} 1"#
    )
}

/// What an accepted create that the tenant did not store left behind: the host's
/// requests, the metrics' text and the log, once its key was released.
struct RolledBack {
    host: FakeApi,
    metrics: String,
    logs: String,
}

impl RolledBack {
    /// The rollback ended without counting or logging a failure.
    fn assert_quiet(&self) {
        assert!(
            !self
                .metrics
                .contains("vcluster_writethrough_rollback_failures_total{"),
            "{}",
            self.metrics
        );
        assert!(
            !self.logs.contains("write-through: rollback"),
            "{}",
            self.logs
        );
    }
}

/// Admits a create against `host` whose tenant answers 404 for the object and whose
/// syncer's cache never shows it, and waits (5 s at most) for the rollback to end.
async fn unstored_create(host: impl Answer) -> RolledBack {
    let logs = Logs::default();
    let _guard = logs.install();
    let host = FakeApi::start(host).await;
    let tenant = FakeApi::start(|_, _, _| not_found()).await;
    let (wt, gate, metrics) = write_through(MAX_IN_FLIGHT);
    let wt = configured(wt, |wt| {
        wt.host = host.client.clone();
        wt.tenant_client = tenant.client.clone();
        // Bounds each of the rollback's host requests well within the wait below.
        wt.timeout = Duration::from_secs(2);
    });
    synced(&gate);
    let answer = wt
        .admit(review("CREATE", gateway()))
        .await
        .expect("a review");
    assert_eq!(response(&answer)["allowed"], true, "{answer}");
    // The rollback runs after the answer: confirm_within (1 s), the tenant's live
    // read, then the host deletes; the key is released when it ends.
    let key = Key {
        namespace: "team".into(),
        name: "edge".into(),
    };
    let released = released_within(&gate, &key, Duration::from_secs(5)).await;
    assert!(released, "the key stayed pending: {:?}", host.received());
    assert!(
        tenant
            .with_method(Method::GET)
            .iter()
            .any(|r| r.path == TENANT_PATH),
        "the tenant was not read live: {:?}",
        tenant.received()
    );
    let text = metrics.exposition();
    RolledBack {
        host,
        metrics: text,
        logs: logs.text(),
    }
}

/// A rollback delete pinned to the mirror's uid and resourceVersion that keeps
/// losing to host status updates is retried with the version read again, three
/// times in all, and then counted and logged as `host_delete`, not worded "gave
/// up" (which operators read as a tenant-side failure).
#[tokio::test]
async fn a_rollback_delete_still_conflicting_after_three_attempts_counts_host_delete() {
    let rolled_back = unstored_create(conflicting_host(None)).await;
    let host = &rolled_back.host;
    let deletes = host.with_method(Method::DELETE);
    assert_eq!(deletes.len(), 3, "{:?}", host.received());
    let pinned: Vec<_> = deletes
        .iter()
        .map(|d| {
            let p = &d.body["preconditions"];
            (p["uid"].as_str(), p["resourceVersion"].as_str())
        })
        .collect();
    // The created version first, then each re-read's.
    assert_eq!(
        pinned,
        [
            (Some("m-1"), Some("1")),
            (Some("m-1"), Some("2")),
            (Some("m-1"), Some("3"))
        ],
        "{deletes:?}"
    );
    assert!(
        rolled_back
            .metrics
            .contains(&one_rollback_failure("host_delete")),
        "{}",
        rolled_back.metrics
    );
    let logged = &rolled_back.logs;
    assert!(
        logged.contains("write-through: rollback host delete failed"),
        "{logged}"
    );
    assert!(
        logged.contains("still conflicting after 3 attempts"),
        "{logged}"
    );
    assert!(!logged.contains("gave up"), "{logged}");
}

/// After the last conflicting delete the mirror is read once more: one a later
/// write has taken over is no longer the rolled-back create's, and the rollback
/// ends without counting a failure (a `host_delete` there would send operators
/// after a mirror that is as it should be).
#[tokio::test]
async fn a_mirror_taken_over_after_the_last_conflicting_delete_ends_the_rollback_quietly() {
    let rolled_back = unstored_create(conflicting_host(Some(3))).await;
    let host = &rolled_back.host;
    assert_eq!(
        host.with_method(Method::DELETE).len(),
        3,
        "{:?}",
        host.received()
    );
    let reads_after_the_first_delete = host
        .received()
        .iter()
        .skip_while(|r| r.method != Method::DELETE)
        .filter(|r| r.method == Method::GET)
        .count();
    assert_eq!(reads_after_the_first_delete, 3, "{:?}", host.received());
    rolled_back.assert_quiet();
}

/// A rollback delete answered 404 finds nothing of the write left (deleted already,
/// or another incarnation): the rollback ends without counting a failure.
#[tokio::test]
async fn a_rollback_delete_of_a_mirror_already_gone_ends_quietly() {
    // Creates the mirror; every other request, the delete included, finds nothing.
    let rolled_back = unstored_create(creating_host).await;
    let host = &rolled_back.host;
    let deletes = host.with_method(Method::DELETE);
    assert_eq!(deletes.len(), 1, "{:?}", host.received());
    assert_eq!(deletes[0].body["preconditions"]["uid"], "m-1");
    assert_eq!(deletes[0].body["preconditions"]["resourceVersion"], "1");
    rolled_back.assert_quiet();
}

/// The host creates the mirror and then stops answering: the rollback's delete
/// never gets an answer.
fn stalling_delete_host(method: &Method, path: &str, body: &Value) -> (u16, Value) {
    match *method {
        Method::DELETE => (STALL, Value::Null),
        _ => creating_host(method, path, body),
    }
}

/// A rollback delete the host never answers is given up after `timeout`, counted
/// and logged as `host_delete`, and the object's key is freed: before, only the
/// cleanup after an unknown outcome bounded its delete, and a silent host held a
/// rolled-back create's key for as long as it kept the connection open.
#[tokio::test]
async fn a_rollback_delete_the_host_never_answers_ends_at_the_timeout() {
    let rolled_back = unstored_create(stalling_delete_host).await;
    let host = &rolled_back.host;
    assert_eq!(
        host.with_method(Method::DELETE).len(),
        1,
        "{:?}",
        host.received()
    );
    assert!(
        rolled_back
            .metrics
            .contains(&one_rollback_failure("host_delete")),
        "{}",
        rolled_back.metrics
    );
    let logged = &rolled_back.logs;
    assert!(
        logged.contains("write-through: rollback host delete failed")
            && logged.contains("timed out"),
        "{logged}"
    );
}

/// The Gateway's mirror as a fake host stores it: what write-through writes, with
/// the host's uid `m-1`.
fn stored_mirror() -> Value {
    let mut mirror = desired_mirror(
        &gateways_type(true),
        "client",
        "default",
        "vcluster-client",
        &gateway(),
    )
    .expect("translatable");
    mirror["metadata"]["uid"] = json!("m-1");
    mirror
}

/// The host holds this Gateway's mirror with what others put on it: a host
/// controller's annotation, its finalizer, an owner. A replace is stored as sent.
fn annotated_host(method: &Method, path: &str, body: &Value) -> (u16, Value) {
    match *method {
        Method::GET if path == MIRROR_OBJECT_PATH => {
            let mut mirror = stored_mirror();
            let m = &mut mirror["metadata"];
            m["resourceVersion"] = json!("3");
            m["annotations"]["host.example/audited"] = json!("yes");
            m["finalizers"] = json!(["host.example/cleanup"]);
            m["ownerReferences"] =
                json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "o-1"}]);
            (200, mirror)
        }
        Method::PUT => (200, body.clone()),
        _ => not_found(),
    }
}

/// An update written through replaces the mirror keeping others' keys, finalizers
/// and owners; an update that changes nothing crproxy writes leaves the mirror alone
/// even though others annotated it.
#[tokio::test]
async fn an_update_written_through_keeps_what_others_put_on_the_mirror() {
    for (port, replaced) in [(443, false), (8443, true)] {
        let host = FakeApi::start(annotated_host).await;
        let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
        let wt = writing_to(wt, host.client.clone());
        synced(&gate);
        let answer = wt.admit(port_update(port)).await.expect("a review");
        assert_eq!(response(&answer)["allowed"], true, "{answer}");
        let puts = host.with_method(Method::PUT);
        assert_eq!(
            puts.len(),
            usize::from(replaced),
            "port {port}: {:?}",
            host.received()
        );
        if let Some(put) = puts.first() {
            let m = &put.body["metadata"];
            assert_eq!(put.body["spec"]["port"], port);
            assert_eq!(m["resourceVersion"], "3", "{m}");
            assert_eq!(m["finalizers"], json!(["host.example/cleanup"]), "{m}");
            assert_eq!(m["ownerReferences"][0]["uid"], "o-1", "{m}");
            assert_eq!(m["annotations"]["host.example/audited"], "yes", "{m}");
        }
    }
}

/// A host that answers a create of a Gateway on port 443 with a 504 (kube: "may
/// still be processing the request"), and refuses one on any other port as
/// invalid (422); it holds no mirror.
fn late_or_refusing_host(method: &Method, path: &str, body: &Value) -> (u16, Value) {
    match *method {
        Method::POST if path == MIRROR_PATH && body["spec"]["port"] == 443 => {
            (504, status(504, "Timeout", "Timeout"))
        }
        Method::POST => (422, status(422, "Invalid", "Invalid")),
        _ => not_found(),
    }
}

/// A host that throttles creates (kube's API priority and fairness): 429 with
/// a Status; it holds no mirror.
fn throttling_host(method: &Method, _: &str, _: &Value) -> (u16, Value) {
    match *method {
        Method::POST => (
            429,
            status(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
            ),
        ),
        _ => not_found(),
    }
}

/// A host whose extension API server is down: its aggregator answers every
/// request 503 (a Status), the read before any write too.
fn unavailable_host(_: &Method, _: &str, _: &Value) -> (u16, Value) {
    (
        503,
        status(503, "ServiceUnavailable", "service unavailable"),
    )
}

/// A host that goes away while handling a create: the connection closes with
/// no answer (the create may have been stored). It holds no mirror.
fn hanging_up_host(method: &Method, _: &str, _: &Value) -> (u16, Value) {
    match *method {
        Method::POST => (HANG_UP, Value::Null),
        _ => not_found(),
    }
}

/// A host whose every read stalls: the write is never sent.
fn stalling_read_host(method: &Method, _: &str, _: &Value) -> (u16, Value) {
    match *method {
        Method::GET => (STALL, Value::Null),
        _ => not_found(),
    }
}

/// A host that reads at once and never answers a create (which it may store).
fn stalling_create_host(method: &Method, _: &str, _: &Value) -> (u16, Value) {
    match *method {
        Method::POST => (STALL, Value::Null),
        _ => not_found(),
    }
}

/// A host behind a gateway that answers a create 502 with a JSON body that is
/// no Status (kube-rs reads it as one, code 0, which the tenant is told as a
/// 502); it holds no mirror.
fn gateway_failing_host(method: &Method, _: &str, _: &Value) -> (u16, Value) {
    match *method {
        Method::POST => (
            502,
            json!({"reason": "UpstreamTimeout", "message": "upstream timed out"}),
        ),
        _ => not_found(),
    }
}

/// A create the host answered with a 5xx (or with a code the answer does not
/// name) may be stored there all the same: the tenant is told it failed, so the
/// mirror it may have left is looked for (and removed, as after a create that
/// got no answer: see the rollback tests). A 4xx is a refusal, and a failed
/// read before any write wrote nothing: nothing is looked for then, and no
/// rollback failure is counted for a write that never happened. A create that
/// got no answer at all is looked for too (503 to the tenant, retryable), and
/// so is one the deadline ended once it was sent (504); a deadline that ended
/// the read before it (504 too) sent nothing. Only the host's refusal of the
/// object (the 422) is logged as `host_rejected`: the runbook sends operators
/// to the host to look for it; throttling (429) and failures on the way are a
/// `response_error`.
#[tokio::test]
async fn a_create_answered_with_a_5xx_has_its_mirror_looked_for() {
    // The host, the gateway's port, the tenant's answer, the host reads made,
    // the review's deadline in seconds (short only for the stalling hosts), and
    // the reason logged.
    let cases: [(AnswerFn, u16, u16, usize, u64, &str); 8] = [
        (late_or_refusing_host, 443, 504, 2, 5, "response_error"),
        (late_or_refusing_host, 8443, 422, 1, 5, "host_rejected"),
        (throttling_host, 443, 429, 1, 5, "response_error"),
        (unavailable_host, 443, 503, 1, 5, "response_error"),
        (gateway_failing_host, 443, 502, 2, 5, "response_error"),
        (hanging_up_host, 443, 503, 2, 5, "response_error"),
        (stalling_create_host, 443, 504, 2, 1, "response_error"),
        (stalling_read_host, 443, 504, 1, 1, "response_error"),
    ];
    for (answer, port, code, lookups, deadline, logged_reason) in cases {
        let logs = Logs::default();
        let _guard = logs.install();
        let host = FakeApi::start(answer).await;
        let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
        let client = host.client_without_retries();
        let wt = configured(wt, |wt| {
            wt.host = client;
            wt.timeout = Duration::from_secs(deadline);
        });
        synced(&gate);
        let mut gateway = gateway();
        gateway["spec"]["port"] = json!(port);
        let answer = wt.admit(review("CREATE", gateway)).await.expect("a review");
        let r = response(&answer);
        assert_eq!(r["allowed"], false, "{code}: {answer}");
        assert_eq!(r["status"]["code"], code, "{code}: {answer}");
        // kube's reason for the code: a gateway's own word for it is no reason
        // the tenant's API server knows.
        assert_eq!(r["status"]["reason"], reason_for(code), "{code}: {answer}");
        assert!(
            released_within(&gate, &key("team", "edge"), Duration::from_secs(5)).await,
            "{code}: the key stayed pending"
        );
        // The read before the create, and for an open outcome the cleanup's.
        assert_eq!(
            host.with_method(Method::GET).len(),
            lookups,
            "{code}: {:?}",
            host.received()
        );
        let logged = logs.text();
        let rejection = logged
            .lines()
            .find(|line| line.contains("write-through: rejecting write, rolling back"))
            .unwrap_or_else(|| panic!("{code}: no rejection logged: {logged}"));
        assert!(
            rejection.contains(&format!(r#""reason":"{logged_reason}""#)),
            "{code}: {rejection}"
        );
    }
}

/// A CREATE review of the gateway written through to a host answering with
/// `answer` (without retries), once the review's key is released (within
/// 5 s, a cleanup included): the host, the review's answer and the metrics.
async fn create_written_to(answer: impl Answer) -> (FakeApi, Value, Arc<SyncMetrics>) {
    let host = FakeApi::start(answer).await;
    let (wt, gate, metrics) = write_through(MAX_IN_FLIGHT);
    let wt = writing_to(wt, host.client_without_retries());
    synced(&gate);
    let answer = wt
        .admit(review("CREATE", gateway()))
        .await
        .expect("a review");
    assert!(
        released_within(&gate, &key("team", "edge"), Duration::from_secs(5)).await,
        "the key stayed pending"
    );
    (host, answer, metrics)
}

/// A host that goes away during a create: it hangs up on the create and on
/// every request after it, so whether the create was stored cannot be told.
fn vanishing_host() -> impl Answer {
    let created = std::sync::atomic::AtomicBool::new(false);
    move |method: &Method, _: &str, _: &Value| {
        if *method == Method::POST {
            created.store(true, Ordering::SeqCst);
        }
        if created.load(Ordering::SeqCst) {
            return (HANG_UP, Value::Null);
        }
        not_found()
    }
}

/// A create that got no answer from a host that then cannot be read: the
/// mirror it may have left is kept (nothing is deleted unseen), and the rollback
/// says it cannot tell, counted as `host_lookup`.
#[tokio::test]
async fn a_create_whose_host_vanished_counts_host_lookup() {
    let logs = Logs::default();
    let _guard = logs.install();
    let (host, answer, metrics) = create_written_to(vanishing_host()).await;
    assert_eq!(response(&answer)["status"]["code"], 503, "{answer}");
    assert!(
        host.with_method(Method::DELETE).is_empty(),
        "{:?}",
        host.received()
    );
    let text = metrics.exposition();
    assert!(
        text.contains(&one_rollback_failure("host_lookup")),
        "{text}"
    );
    let logged = logs.text();
    assert!(
        logged.contains("write-through: rollback cannot tell whether the object reached the host"),
        "{logged}"
    );
}

/// A host that answers the create 504 yet stores the mirror, and whose every
/// delete of it conflicts (a host controller keeps writing its status): each
/// read after the create finds the mirror at a newer version.
fn late_and_busy_host() -> impl Answer {
    let (creates, reads) = (AtomicUsize::new(0), AtomicUsize::new(0));
    move |method: &Method, path: &str, _: &Value| match *method {
        Method::POST if path == MIRROR_PATH => {
            creates.fetch_add(1, Ordering::SeqCst);
            (504, status(504, "Timeout", "Timeout"))
        }
        // Nothing before the create (write-through reads first), the mirror after.
        Method::GET if path == MIRROR_OBJECT_PATH && creates.load(Ordering::SeqCst) > 0 => {
            let reads = reads.fetch_add(1, Ordering::SeqCst) + 1;
            let mut mirror = stored_mirror();
            mirror["metadata"]["resourceVersion"] = json!((6 + reads).to_string());
            (200, mirror)
        }
        Method::DELETE => delete_precondition_conflict(),
        _ => not_found(),
    }
}

/// The mirror a create may have left (its answer was a 504) is read again after
/// each conflicting delete, three attempts in all, then counted and logged as
/// `host_delete`: before, the first conflict ended the cleanup without a word.
#[tokio::test]
async fn a_leftover_mirror_whose_delete_keeps_conflicting_counts_host_delete() {
    let logs = Logs::default();
    let _guard = logs.install();
    let (host, answer, metrics) = create_written_to(late_and_busy_host()).await;
    assert_eq!(response(&answer)["status"]["code"], 504, "{answer}");
    // Each delete follows a read of its own and is pinned to what that read found.
    let deletes = host.with_method(Method::DELETE);
    assert_eq!(deletes.len(), 3, "{:?}", host.received());
    let pinned: Vec<&Value> = deletes.iter().map(|d| &d.body["preconditions"]).collect();
    assert_eq!(
        pinned,
        [
            &json!({"uid": "m-1", "resourceVersion": "7"}),
            &json!({"uid": "m-1", "resourceVersion": "8"}),
            &json!({"uid": "m-1", "resourceVersion": "9"}),
        ],
        "{deletes:?}"
    );
    let text = metrics.exposition();
    assert!(
        text.contains(&one_rollback_failure("host_delete")),
        "{text}"
    );
    let logged = logs.text();
    assert!(
        logged.contains("write-through: rollback host delete failed")
            && logged.contains("still conflicting after 3 attempts"),
        "{logged}"
    );
}

/// The host's extension server defaults the Gateway's `mode`, which the tenant's
/// object never carries: the stored mirror differs from what write-through
/// writes, and every replace is stored with the default added again.
fn defaulting_host(method: &Method, path: &str, body: &Value) -> (u16, Value) {
    let defaulted = |mut mirror: Value, resource_version: &str| {
        mirror["spec"]["mode"] = json!("auto");
        mirror["metadata"]["uid"] = json!("m-1");
        mirror["metadata"]["resourceVersion"] = json!(resource_version);
        mirror
    };
    match *method {
        Method::GET if path == MIRROR_OBJECT_PATH => (200, defaulted(stored_mirror(), "3")),
        Method::PUT => (200, defaulted(body.clone(), "4")),
        _ => not_found(),
    }
}

/// The tenant, read live, holding the Gateway at `resource_version`.
fn tenant_holding(resource_version: &'static str) -> impl Answer {
    move |method: &Method, path: &str, _: &Value| {
        let mut stored = gateway();
        stored["metadata"]["resourceVersion"] = json!(resource_version);
        match *method {
            Method::GET if path == TENANT_PATH => (200, stored),
            _ => not_found(),
        }
    }
}

/// An update computed on a tenant state another write has replaced cannot be
/// stored (kube's compare-and-swap refuses it, and kube admits it again on the
/// newer state): it is allowed without a host write, which would only show its
/// older spec on the host meanwhile. An update of the current state is written.
#[tokio::test]
async fn an_update_of_a_replaced_tenant_state_writes_nothing_to_the_host() {
    // At the state `port_update` was computed on, and after another write replaced it.
    for (tenant_answer, writes) in [(tenant_holding("7"), 1), (tenant_holding("9"), 0)] {
        let host = FakeApi::start(defaulting_host).await;
        let tenant = FakeApi::start(tenant_answer).await;
        let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
        let wt = configured(writing_to(wt, host.client.clone()), |wt| {
            wt.tenant_client = tenant.client.clone();
        });
        synced(&gate);
        let answer = wt.admit(port_update(8443)).await.expect("a review");
        assert_eq!(response(&answer)["allowed"], true, "{answer}");
        assert_eq!(
            host.with_method(Method::PUT).len(),
            writes,
            "host writes: {:?}",
            host.received()
        );
        assert!(
            tenant
                .with_method(Method::GET)
                .iter()
                .any(|r| r.path == TENANT_PATH),
            "the tenant was not read live: {:?}",
            tenant.received()
        );
        if writes == 0 {
            assert!(
                !gate.is_pending(&key("team", "edge")),
                "nothing to wait for"
            );
        }
    }
}

/// A no-op update (the tenant stores it without a new resourceVersion) of an
/// object whose mirror the host defaults is written through, but does not hold
/// the object's key for the whole confirmation time waiting for a resourceVersion
/// that never comes, which would turn the object's next writes into conflicts. An
/// update that changes the mirror still waits for the tenant to store it.
#[tokio::test]
async fn a_no_op_update_of_a_defaulted_mirror_does_not_hold_its_object() {
    for (port, held) in [(443, false), (8443, true)] {
        let host = FakeApi::start(defaulting_host).await;
        let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
        let wt = configured(writing_to(wt, host.client.clone()), |wt| {
            wt.confirm_within = Duration::from_secs(30)
        });
        synced(&gate);
        let answer = wt.admit(port_update(port)).await.expect("a review");
        assert_eq!(response(&answer)["allowed"], true, "{answer}");
        assert_eq!(
            host.with_method(Method::PUT).len(),
            1,
            "port {port}: {:?}",
            host.received()
        );
        assert_eq!(
            gate.is_pending(&key("team", "edge")),
            held,
            "port {port}: the key's hold after the answer"
        );
    }
}

/// A no-op update of an object whose mirror the host lost creates the mirror
/// again, and, the tenant storing it without a new resourceVersion, does not
/// hold the object's key waiting for one either.
#[tokio::test]
async fn a_no_op_update_that_creates_the_mirror_again_does_not_hold_its_object() {
    let host = FakeApi::start(creating_host).await;
    let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
    let wt = configured(writing_to(wt, host.client.clone()), |wt| {
        wt.confirm_within = Duration::from_secs(30)
    });
    synced(&gate);
    let answer = wt.admit(port_update(443)).await.expect("a review");
    assert_eq!(response(&answer)["allowed"], true, "{answer}");
    assert_eq!(
        host.with_method(Method::POST).len(),
        1,
        "{:?}",
        host.received()
    );
    assert!(
        !gate.is_pending(&key("team", "edge")),
        "the key is held for a resourceVersion that never comes"
    );
}

#[test]
fn a_syncer_of_a_closed_term_cannot_open_the_gate_again() {
    // An aborted syncer runs until its next await: it may report its caches
    // synced after the supervisor closed the gate on losing leadership.
    let gate = Gate::new();
    let store = || Writer::<DynamicObject>::new(gateways_type(true).api).as_reader();
    let first = gate.open_term();
    first.caches_synced(store());
    assert!(gate.is_synced());
    gate.close();
    assert!(!gate.is_synced());
    first.caches_synced(store());
    assert!(!gate.is_synced(), "a closed term's syncer opened the gate");
    // The next term's syncer does.
    let second = gate.open_term();
    first.caches_synced(store());
    assert!(!gate.is_synced());
    second.caches_synced(store());
    assert!(gate.is_synced());
}

/// The host holds this Gateway's mirror; its controller updates the status between
/// write-through's read and its replace once, so the first replace (pinned to
/// resourceVersion 3) gets 409 and the mirror is at 4 by the next read.
fn status_race_host() -> impl Answer {
    let puts = AtomicUsize::new(0);
    move |method: &Method, path: &str, body: &Value| {
        let replaced = puts.load(Ordering::SeqCst);
        match *method {
            Method::GET if path == MIRROR_OBJECT_PATH => {
                let mut mirror = stored_mirror();
                mirror["metadata"]["resourceVersion"] =
                    json!(if replaced == 0 { "3" } else { "4" });
                mirror["status"] = json!({"ready": replaced > 0});
                (200, mirror)
            }
            Method::PUT if path == MIRROR_OBJECT_PATH => {
                puts.fetch_add(1, Ordering::SeqCst);
                if replaced == 0 {
                    (
                        409,
                        status(409, "Conflict", "Operation cannot be fulfilled on gateways.example.net \"edge-x-team-x-client\": the object has been modified; please apply your changes to the latest version and try again"),
                    )
                } else {
                    (200, body.clone())
                }
            }
            _ => not_found(),
        }
    }
}

/// A host status update between write-through's read and its replace makes the
/// replace fail with 409; that is no rejection of the tenant's write: the mirror is
/// read again and the replace retried, and the write is allowed.
#[tokio::test]
async fn a_replace_that_loses_a_race_on_the_host_is_read_again_and_retried() {
    let host = FakeApi::start(status_race_host()).await;
    let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
    let wt = writing_to(wt, host.client.clone());
    synced(&gate);
    let answer = wt.admit(port_update(8443)).await.expect("a review");
    assert_eq!(response(&answer)["allowed"], true, "{answer}");
    let puts = host.with_method(Method::PUT);
    assert_eq!(puts.len(), 2, "{:?}", host.received());
    let last = &puts[1].body;
    assert_eq!(
        last["metadata"]["resourceVersion"], "4",
        "the re-read's version"
    );
    assert_eq!(
        last["status"],
        json!({"ready": true}),
        "the host's newer status kept"
    );
    assert_eq!(last["spec"]["port"], 8443);
    assert_eq!(
        host.with_method(Method::GET).len(),
        2,
        "read again after the conflict"
    );
}

/// `gateways` of another group, aggregated on the same host.
fn other_gateways() -> ResolvedType {
    let mut ty = gateways_type(true);
    ty.resource.key = "gateways.example.org/v1".into();
    ty.resource.group = "example.org".into();
    ty.api = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.org", "v1", "Gateway"),
        "gateways",
    );
    ty
}

/// Two aggregated types with one plural in different groups get a webhook each,
/// under distinct names of the form `<something>.<group>` (a DNS subdomain of at
/// least three segments, as Kubernetes requires of webhook names).
#[test]
fn types_with_one_plural_in_two_groups_get_distinct_webhooks() {
    let listening = SocketAddr::from(([127, 0, 0, 1], 9443));
    let client = client_config(&WebhookEndpoint::Listener, listening, "/validate/t", "PEM");
    let c = webhook_configuration("client", &client, &[gateways_type(true), other_gateways()]);
    let names: Vec<&str> = webhook_names(&c).collect();
    assert_eq!(names.len(), 2, "{c}");
    assert_ne!(
        names[0], names[1],
        "webhook names must be unique: {names:?}"
    );
    for (name, group) in names.iter().zip(["example.net", "example.org"]) {
        assert!(name.ends_with(&format!(".{group}")), "{name}");
        assert!(name.split('.').count() >= 3, "{name}");
    }
}

/// The host creates whatever it is sent.
fn creating_host(method: &Method, _: &str, body: &Value) -> (u16, Value) {
    match *method {
        Method::POST => {
            let mut body = body.clone();
            body["metadata"]["uid"] = json!("m-1");
            body["metadata"]["resourceVersion"] = json!("1");
            (201, body)
        }
        _ => not_found(),
    }
}

/// A review is written through as the type of its group: with `gateways` in two
/// groups, each group's write reaches its own type on the host.
#[tokio::test]
async fn a_review_is_written_through_as_the_type_of_its_group() {
    for group in ["example.net", "example.org"] {
        let host = FakeApi::start(creating_host).await;
        let (gate, other_gate) = (Gate::new(), Gate::new());
        let (wt, _, _) = write_through(MAX_IN_FLIGHT);
        let wt = configured(wt, |wt| {
            wt.host = host.client.clone();
            wt.types = types_by_resource([
                (gateways_type(true), Arc::clone(&gate)),
                (other_gateways(), Arc::clone(&other_gate)),
            ]);
        });
        synced(&gate);
        synced(&other_gate);
        let mut create = review("CREATE", gateway());
        create["request"]["resource"]["group"] = json!(group);
        let answer = wt.admit(create).await.expect("a review");
        assert_eq!(response(&answer)["allowed"], true, "{group}: {answer}");
        let posts = host.with_method(Method::POST);
        assert_eq!(posts.len(), 1, "{group}: {:?}", host.received());
        assert_eq!(
            posts[0].path,
            format!("/apis/{group}/v1/namespaces/vcluster-client/gateways"),
            "{group}"
        );
    }
}

/// A create the host accepted but the tenant then refused after its webhooks
/// (ResourceQuota runs after ValidatingAdmissionWebhook; or the name is still held
/// by a terminating object whose mirror the syncer already deleted, so storage
/// answers AlreadyExists) leaves its key pending for `confirm_within` (40 s in
/// production), and any tenant user can cause that at will. Writes of that object
/// wait for the key (up to `DECIDE_WITHIN`, 25 s) without a place of the
/// `MAX_IN_FLIGHT` host writes: `MAX_IN_FLIGHT` concurrent writes of the one held
/// object must not lock everyone else out of write-through (429) for every
/// aggregated type of the tenant.
#[tokio::test]
async fn writes_of_one_held_object_never_take_the_places_of_writes_of_other_objects() {
    let host = FakeApi::start(creating_host).await;
    let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
    let wt = configured(wt, |wt| {
        wt.host = host.client.clone();
        // Long enough that the unconfirmed create still holds its key during the test.
        wt.confirm_within = Duration::from_secs(20);
    });
    // A cache that never shows the object: the tenant refused it after the webhook.
    synced(&gate);
    let answer = wt
        .admit(review("CREATE", gateway()))
        .await
        .expect("a review");
    assert_eq!(response(&answer)["allowed"], true, "{answer}");
    let held = Key {
        namespace: "team".into(),
        name: "edge".into(),
    };
    assert!(gate.is_pending(&held));
    // The attacker: MAX_IN_FLIGHT concurrent writes of the held object.
    let mut waiters = Vec::new();
    for _ in 0..MAX_IN_FLIGHT {
        let wt = Arc::clone(&wt);
        waiters.push(tokio::spawn(async move {
            wt.admit(review("CREATE", gateway())).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Someone else, another object in another namespace.
    let mut other = gateway();
    other["metadata"]["name"] = json!("unrelated");
    other["metadata"]["namespace"] = json!("other-team");
    other["metadata"]["uid"] = json!("u-9");
    let answer = wt.admit(review("CREATE", other)).await.expect("a review");
    let r = response(&answer);
    assert_ne!(
        r["status"]["code"], 429,
        "a write of an unrelated object was refused because another user's writes wait for their own held key: {answer}"
    );
    assert_eq!(r["allowed"], true, "{answer}");
    for w in waiters {
        w.abort();
    }
}

fn key(namespace: &str, name: &str) -> Key {
    Key {
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// A CREATE review of a gateway `namespace/name`.
fn create_of(namespace: &str, name: &str) -> Value {
    let mut object = gateway();
    object["metadata"]["namespace"] = json!(namespace);
    object["metadata"]["name"] = json!(name);
    object["metadata"]["uid"] = json!(format!("u-{namespace}-{name}"));
    review("CREATE", object)
}

/// How many writes wait for `key`.
fn waiting_for(gate: &Gate, key: &Key) -> usize {
    locks::lock(&gate.pending)
        .waiting
        .get(key)
        .copied()
        .unwrap_or_default()
}

/// Polls `holds` every 10 ms for up to 5 s.
async fn eventually(holds: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !holds() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// The wait for another write of the same object is kept: once the first write
/// releases the key, the second is written through.
#[tokio::test]
async fn a_write_of_a_held_object_waits_for_the_key_and_is_then_written_through() {
    let host = FakeApi::start(creating_host).await;
    let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
    let wt = writing_to(wt, host.client.clone());
    synced(&gate);
    let edge = key("team", "edge");
    assert!(gate.hold(&edge), "a free key");
    let second = tokio::spawn({
        let wt = Arc::clone(&wt);
        async move { wt.admit(review("CREATE", gateway())).await }
    });
    assert!(eventually(|| waiting_for(&gate, &edge) == 1).await);
    assert!(!second.is_finished(), "answered while the key was held");
    assert!(host.received().is_empty(), "written while the key was held");
    gate.release(&edge);
    let answer = second.await.expect("the review").expect("a review");
    assert_eq!(response(&answer)["allowed"], true, "{answer}");
    assert_eq!(host.with_method(Method::POST).len(), 1);
    assert_eq!(waiting_for(&gate, &edge), 0, "the waiter still counted");
}

/// Writes of one object queue behind its held key only up to
/// `MAX_WAITING_PER_OBJECT`; the next gets the 409 of a key still held at once,
/// naming the object, instead of a waiting place for the whole decision.
#[tokio::test]
async fn a_write_of_a_held_object_beyond_its_waiters_gets_409_at_once() {
    let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
    synced(&gate);
    let edge = key("team", "edge");
    assert!(gate.hold(&edge), "a free key");
    let mut waiters = Vec::new();
    for _ in 0..MAX_WAITING_PER_OBJECT {
        let wt = Arc::clone(&wt);
        waiters.push(tokio::spawn(async move {
            wt.admit(review("CREATE", gateway())).await
        }));
    }
    assert!(eventually(|| waiting_for(&gate, &edge) == MAX_WAITING_PER_OBJECT).await);
    let started = tokio::time::Instant::now();
    let answer = wt
        .admit(review("CREATE", gateway()))
        .await
        .expect("a review");
    assert!(
        started.elapsed() < wt.timeout / 2,
        "waited {:?} for a place that was not there",
        started.elapsed()
    );
    let r = response(&answer);
    assert_eq!(r["allowed"], false, "{answer}");
    assert_eq!(r["status"]["code"], 409, "{answer}");
    assert_eq!(r["status"]["reason"], "Conflict");
    assert_eq!(r["status"]["details"]["retryAfterSeconds"], 1);
    assert_eq!(
        r["status"]["message"],
        "another write of team/edge is being written through; retry"
    );
    for w in waiters {
        w.abort();
    }
}

/// Held keys of many objects (each one refused create away), each with its
/// waiter: the waiting places are full, yet a write of a free object still gets a
/// place of the host writes, and only a write that would have to wait as well is
/// answered 409 at once.
#[tokio::test]
async fn with_every_waiting_place_taken_only_writes_of_held_objects_are_refused() {
    let host = FakeApi::start(creating_host).await;
    let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
    let wt = writing_to(wt, host.client.clone());
    synced(&gate);
    let mut waiters = Vec::new();
    for i in 0..MAX_WAITING {
        assert!(gate.hold(&key("team", &format!("held-{i}"))), "a free key");
        let wt = Arc::clone(&wt);
        waiters.push(tokio::spawn(async move {
            wt.admit(create_of("team", &format!("held-{i}"))).await
        }));
    }
    assert!(eventually(|| wt.waiting.available_permits() == 0).await);
    assert_eq!(wt.in_flight.available_permits(), MAX_IN_FLIGHT);
    let answer = wt
        .admit(create_of("other-team", "unrelated"))
        .await
        .expect("a review");
    assert_eq!(response(&answer)["allowed"], true, "{answer}");
    assert!(gate.hold(&key("team", "one-more")), "a free key");
    let answer = wt
        .admit(create_of("team", "one-more"))
        .await
        .expect("a review");
    let r = response(&answer);
    assert_eq!(r["status"]["code"], 409, "{answer}");
    assert_eq!(
        r["status"]["message"],
        "another write of team/one-more is being written through; retry"
    );
    for w in waiters {
        w.abort();
    }
}

#[test]
fn only_the_review_path_itself_is_the_review_path() {
    let path = "/validate/0123456789abcdef0123456789abcdef";
    assert!(is_review_path(path, path));
    for other in [
        "/validate/0123456789abcdef0123456789abcdee",
        "/validate/1123456789abcdef0123456789abcdef",
        "/validate/0123456789abcdef0123456789abcde",
        "/validate/0123456789abcdef0123456789abcdef0",
        "/validate/",
        "",
    ] {
        assert!(!is_review_path(other, path), "{other}");
    }
}

/// A registration of an earlier configuration gains only the webhooks it has
/// none of the name of; its own stay as they are (the leader's address and CA).
#[test]
fn a_registration_gains_only_the_webhooks_it_lacks() {
    let ours = |name: &str, url: &str| json!({"name": name, "clientConfig": {"url": url}});
    let wanted = json!({"webhooks": [ours("a.x", "https://me"), ours("b.x", "https://me")]});
    let mut current =
        json!({"metadata": {"name": "c"}, "webhooks": [ours("a.x", "https://leader")]});
    assert_eq!(
        with_missing_webhooks(&mut current, &wanted),
        Some(vec!["b.x".to_owned()])
    );
    assert_eq!(
        current["webhooks"],
        json!([ours("a.x", "https://leader"), ours("b.x", "https://me")])
    );
    assert_eq!(with_missing_webhooks(&mut current, &wanted), None);
    // Registered with no webhooks at all (kube omits an empty list).
    let mut bare = json!({"metadata": {"name": "c"}});
    assert_eq!(
        with_missing_webhooks(&mut bare, &wanted),
        Some(vec!["a.x".to_owned(), "b.x".to_owned()])
    );
    assert_eq!(bare["webhooks"], wanted["webhooks"]);
}

/// The leader's check puts back each of its webhooks that someone changed, and
/// one that is missing; what the API server defaulted beside its fields, and a
/// webhook of another name, are not a change and stay.
#[test]
fn the_leader_puts_back_its_changed_webhooks_and_keeps_the_servers_defaults() {
    let ours = |name: &str, url: &str| {
        json!({"name": name, "clientConfig": {"url": url},
               "rules": [{"apiGroups": ["x"], "operations": ["CREATE"]}]})
    };
    let wanted =
        json!({"webhooks": [ours("a.x", "https://leader"), ours("b.x", "https://leader")]});
    let mut defaulted = ours("a.x", "https://leader");
    defaulted["timeoutSeconds"] = json!(10);
    defaulted["namespaceSelector"] = json!({});
    defaulted["objectSelector"] = json!({"matchLabels": {}, "matchExpressions": []});
    defaulted["matchConditions"] = json!([]);
    defaulted["rules"][0]["scope"] = json!("*");
    let other = json!({"name": "c.x", "clientConfig": {"url": "https://someone"}});
    let mut current = json!({"metadata": {"name": "c"},
        "webhooks": [defaulted.clone(), ours("b.x", "https://leader"), other.clone()]});
    assert_eq!(with_leaders_webhooks(&mut current, &wanted), None);

    let mut edited = current.clone();
    edited["webhooks"][1]["clientConfig"]["url"] = json!("https://elsewhere");
    assert_eq!(
        with_leaders_webhooks(&mut edited, &wanted),
        Some(vec!["b.x".to_owned()])
    );
    assert_eq!(edited, current);

    // What narrows the requests a webhook is sent is an edit too.
    let narrowings = [
        ("objectSelector", json!({"matchLabels": {"never": "x"}})),
        (
            "namespaceSelector",
            json!({"matchExpressions": [{"key": "k", "operator": "Exists"}]}),
        ),
        (
            "matchConditions",
            json!([{"name": "none", "expression": "false"}]),
        ),
    ];
    for (key, narrowing) in narrowings {
        let mut narrowed = current.clone();
        narrowed["webhooks"][1][key] = narrowing;
        assert_eq!(
            with_leaders_webhooks(&mut narrowed, &wanted),
            Some(vec!["b.x".to_owned()]),
            "{key}"
        );
        assert_eq!(narrowed, current, "{key}");
    }
    // A selector the leader sets itself is held like any other member.
    let mut selective = ours("a.x", "https://leader");
    selective["objectSelector"] = json!({"matchLabels": {"tier": "gold"}});
    let selective_wanted = json!({"webhooks": [selective.clone()]});
    let mut holding = json!({"webhooks": [selective]});
    assert_eq!(with_leaders_webhooks(&mut holding, &selective_wanted), None);

    let mut emptied = current.clone();
    emptied["webhooks"][0]["rules"] = json!([]);
    emptied["webhooks"].as_array_mut().map(|w| w.remove(1));
    assert_eq!(
        with_leaders_webhooks(&mut emptied, &wanted),
        Some(vec!["a.x".to_owned(), "b.x".to_owned()])
    );
    assert_eq!(
        emptied["webhooks"],
        json!([
            ours("a.x", "https://leader"),
            other,
            ours("b.x", "https://leader")
        ])
    );
}

/// A host object under the mirror's name that names this tenant object's uid but
/// is not this tenant's mirror (another tenant's `managed-by`, or another tenant
/// object's namespace) is never replaced: the host's own create decides, and its
/// AlreadyExists denies the write.
#[tokio::test]
async fn an_object_under_the_mirrors_name_that_is_not_its_mirror_is_never_replaced() {
    type Forge = fn(&mut Value);
    let forgeries: [(&str, Forge); 2] = [
        ("another tenant's", |m| {
            m["labels"][names::MANAGED_BY] = json!("other");
        }),
        ("another namespace's", |m| {
            m["annotations"][names::OBJECT_NAMESPACE] = json!("elsewhere");
        }),
    ];
    for (whose, forge) in forgeries {
        let host = FakeApi::start(
            move |method: &Method, path: &str, body: &Value| match *method {
                Method::GET if path == MIRROR_OBJECT_PATH => {
                    let mut held = stored_mirror();
                    held["metadata"]["resourceVersion"] = json!("3");
                    forge(&mut held["metadata"]);
                    (200, held)
                }
                Method::POST => (
                    409,
                    status(
                        409,
                        "AlreadyExists",
                        "gateways.example.net \"edge-x-team-x-client\" already exists",
                    ),
                ),
                Method::PUT => (200, body.clone()),
                _ => not_found(),
            },
        )
        .await;
        let (wt, gate, _) = write_through(MAX_IN_FLIGHT);
        let wt = writing_to(wt, host.client_without_retries());
        synced(&gate);
        let answer = wt.admit(port_update(8443)).await.expect("a review");
        assert_eq!(response(&answer)["allowed"], false, "{whose}: {answer}");
        assert!(
            host.with_method(Method::PUT).is_empty(),
            "{whose}: replaced"
        );
        assert_eq!(host.with_method(Method::POST).len(), 1, "{whose}");
    }
}
