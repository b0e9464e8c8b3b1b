use super::*;
use crproxy_core::pki::CertificateAuthority;
use http::HeaderValue;

fn configmap(ca_pem: &str, allowed: &str) -> ConfigMap {
    serde_json::from_value(configmap_json(ca_pem, allowed)).expect("ConfigMap")
}

fn configmap_json(ca_pem: &str, allowed: &str) -> serde_json::Value {
    serde_json::json!({
        "data": {
            "requestheader-client-ca-file": ca_pem,
            "requestheader-allowed-names": allowed,
            "requestheader-username-headers": "[\"X-Remote-User\"]",
            "requestheader-group-headers": "[\"X-Remote-Group\"]",
            "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
        }
    })
}

fn der(pem: &str) -> PeerCertificate {
    PeerCertificate::from_der(&CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem"))
}

fn identity_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("x-remote-user", HeaderValue::from_static("alice"));
    headers.append("x-remote-group", HeaderValue::from_static("developers"));
    headers.append(
        "x-remote-group",
        HeaderValue::from_static("system:authenticated"),
    );
    headers.append(
        "x-remote-extra-acme.com%2fproject",
        HeaderValue::from_static("p1"),
    );
    headers
}

#[test]
fn caller_comes_from_headers_when_the_certificate_name_is_allowed() {
    let ca = CertificateAuthority::generate("front-proxy-ca").expect("ca");
    let cert = ca.issue_client("front-proxy-client", &[]).expect("cert");
    let trust = FrontProxyTrust::new();
    trust.set(
        TrustSettings::from_configmap(&configmap(&ca.pem().cert, "[\"front-proxy-client\"]"))
            .expect("settings"),
    );
    let caller = trust
        .authenticate(Some(&der(&cert.cert)), &identity_headers())
        .expect("caller");
    assert_eq!(caller.user, "alice");
    assert_eq!(caller.groups, ["developers", "system:authenticated"]);
    assert_eq!(caller.extra["acme.com/project"], ["p1"]);
}

#[test]
fn refused_without_certificate_with_wrong_name_or_without_user() {
    let ca = CertificateAuthority::generate("front-proxy-ca").expect("ca");
    let wrong = ca.issue_client("someone-else", &[]).expect("cert");
    let right = ca.issue_client("front-proxy-client", &[]).expect("cert");
    let trust = FrontProxyTrust::new();
    // Nothing loaded yet: nobody is trusted.
    assert!(trust
        .authenticate(Some(&der(&right.cert)), &identity_headers())
        .is_none());
    trust.set(
        TrustSettings::from_configmap(&configmap(&ca.pem().cert, "[\"front-proxy-client\"]"))
            .expect("settings"),
    );
    assert!(trust.authenticate(None, &identity_headers()).is_none());
    assert!(trust
        .authenticate(Some(&der(&wrong.cert)), &identity_headers())
        .is_none());
    assert!(trust
        .authenticate(Some(&der(&right.cert)), &HeaderMap::new())
        .is_none());
}

#[test]
fn admits_gives_the_verdict_authenticate_gives() {
    let ca = CertificateAuthority::generate("front-proxy-ca").expect("ca");
    let wrong = ca.issue_client("someone-else", &[]).expect("cert");
    let right = ca.issue_client("front-proxy-client", &[]).expect("cert");
    let trust = FrontProxyTrust::new();
    let cases = |trust: &FrontProxyTrust| {
        let (wrong, right) = (der(&wrong.cert), der(&right.cert));
        let headers = identity_headers();
        let empty = HeaderMap::new();
        [
            (None, &headers),
            (Some(&wrong), &headers),
            (Some(&right), &empty),
            (Some(&right), &headers),
        ]
        .map(|(peer, headers)| {
            let verdict = trust.admits(peer, headers);
            assert_eq!(verdict, trust.authenticate(peer, headers).is_some());
            verdict
        })
    };
    // Nothing loaded yet: nobody is admitted.
    assert_eq!(cases(&trust), [false; 4]);
    trust.set(
        TrustSettings::from_configmap(&configmap(&ca.pem().cert, "[\"front-proxy-client\"]"))
            .expect("settings"),
    );
    assert_eq!(cases(&trust), [false, false, false, true]);
}

#[test]
fn empty_allowed_names_accepts_any_name_signed_by_the_ca() {
    let ca = CertificateAuthority::generate("front-proxy-ca").expect("ca");
    let cert = ca.issue_client("anything", &[]).expect("cert");
    let trust = FrontProxyTrust::new();
    trust.set(TrustSettings::from_configmap(&configmap(&ca.pem().cert, "")).expect("settings"));
    assert!(trust
        .authenticate(Some(&der(&cert.cert)), &identity_headers())
        .is_some());
}

#[test]
fn configmap_errors_name_the_problem() {
    let missing = TrustSettings::from_configmap(&ConfigMap::default());
    assert!(matches!(missing, Err(TrustError::NoRequestHeaderCa)));
    let ca = CertificateAuthority::generate("ca").expect("ca");
    let bad_list = TrustSettings::from_configmap(&configmap(&ca.pem().cert, "not json"));
    assert!(
        matches!(bad_list, Err(TrustError::BadList { key, .. }) if key == "requestheader-allowed-names")
    );
    let bad_ca = TrustSettings::from_configmap(&configmap("garbage", "[]"));
    assert!(matches!(bad_ca, Err(TrustError::BadCa(_))));
}

#[tokio::test(start_paused = true)]
async fn the_configmap_is_watched_and_a_stalled_watch_is_replaced() {
    use crate::scripted_api::{settle, ScriptedApi};
    use crate::watches::{WatchClient, WATCH_IDLE_LIMIT, WATCH_TIMEOUT_SECONDS};
    use serde_json::{json, Value};
    use std::time::Duration;
    let ca = CertificateAuthority::generate("front-proxy-ca").expect("ca");
    let original = ca.issue_client("front-proxy-client", &[]).expect("cert");
    let renamed = ca.issue_client("renamed-proxy", &[]).expect("cert");
    let accepts = |trust: &FrontProxyTrust, cert: &str| {
        trust
            .authenticate(Some(&der(cert)), &identity_headers())
            .is_some()
    };
    let metadata = |rv: &str| json!({"name": "extension-apiserver-authentication", "namespace": "kube-system", "resourceVersion": rv});
    let named = |allowed: &str, rv: &str| {
        let mut cm = configmap_json(&ca.pem().cert, allowed);
        cm["apiVersion"] = json!("v1");
        cm["kind"] = json!("ConfigMap");
        cm["metadata"] = metadata(rv);
        cm
    };
    let list = |rv: &str, item: Value| json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"resourceVersion": rv}, "items": [item]});
    let modified = |object: Value| json!({"type": "MODIFIED", "object": object});
    let api = ScriptedApi::default();
    let watch = api.push(list("3", named("[\"front-proxy-client\"]", "2")));
    let trust = FrontProxyTrust::new();
    let task = spawn_trust_watch(
        WatchClient::from_client(api.client(WATCH_IDLE_LIMIT), WATCH_TIMEOUT_SECONDS),
        Arc::clone(&trust),
        false,
    );
    settle().await;
    assert!(accepts(&trust, &original.cert));
    let requests = api.requests();
    assert!(
        requests[0].starts_with("LIST /api/v1/namespaces/kube-system/configmaps?")
            && requests[1].starts_with("WATCH /api/v1/namespaces/kube-system/configmaps?"),
        "{requests:?}"
    );
    assert!(
        requests[1].contains("fieldSelector=metadata.name%3Dextension-apiserver-authentication")
            && requests[1].contains("allowWatchBookmarks=true")
            && requests[1].contains("resourceVersion=3"),
        "{requests:?}"
    );

    // An edit is installed as it happens, without polling.
    watch
        .send(modified(named("[\"renamed-proxy\"]", "4")))
        .expect("send");
    settle().await;
    assert!(!accepts(&trust, &original.cert));
    assert!(accepts(&trust, &renamed.cert));
    // A broken edit keeps the last good settings.
    watch
        .send(modified(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata("5"), "data": {}}),
        ))
        .expect("send");
    settle().await;
    assert!(accepts(&trust, &renamed.cert));

    // The server ends the watch: the next one resumes, without a list.
    let resumed = api.push_watch();
    drop(watch);
    settle().await;
    let requests = api.requests();
    assert!(
        requests[2].starts_with("WATCH ") && requests[2].contains("resourceVersion=5"),
        "{requests:?}"
    );
    assert!(accepts(&trust, &renamed.cert));

    // Silence past the idle limit, the connection still open: listed again.
    let _next = api.push(list("8", named("[\"front-proxy-client\"]", "7")));
    tokio::time::advance(WATCH_IDLE_LIMIT + Duration::from_secs(1)).await;
    settle().await;
    tokio::time::advance(Duration::from_secs(61)).await;
    settle().await;
    assert!(accepts(&trust, &original.cert));
    assert_eq!(api.requests().len(), 5, "{:?}", api.requests());
    drop(resumed);
    task.abort();
}

/// A self-signed certificate whose subject holds two CN attributes, in this order.
/// rcgen keeps one value per attribute type, so the second CN is written under the
/// CN object identifier (2.5.4.3) as a custom type.
fn two_common_names(first: &str, last: &str) -> PeerCertificate {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::CommonName, first);
    name.push(rcgen::DnType::CustomDnType(vec![2, 5, 4, 3]), last);
    params.distinguished_name = name;
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("cert");
    PeerCertificate::from_der(cert.der())
}

#[test]
fn the_last_common_name_names_the_front_proxy_as_go_reads_it() {
    let cert = two_common_names("front-proxy-client", "intruder");
    assert_eq!(cert.common_name.as_deref(), Some("intruder"));
    let cert = two_common_names("intruder", "front-proxy-client");
    assert_eq!(cert.common_name.as_deref(), Some("front-proxy-client"));
}

#[tokio::test(start_paused = true)]
async fn loading_the_trust_gives_up_on_a_silent_api_server() {
    let silent = tower::service_fn(|_: http::Request<kube::client::Body>| async {
        std::future::pending::<
            Result<http::Response<http_body_util::Empty<bytes::Bytes>>, std::io::Error>,
        >()
        .await
    });
    let client = kube::Client::new(silent, "default");
    let trust = FrontProxyTrust::new();
    let started = tokio::time::Instant::now();
    let error = load_trust(&client, &trust).await.expect_err("a timeout");
    assert!(error.contains("no answer within 30s"), "{error}");
    assert_eq!(started.elapsed(), crproxy_kube::DEFAULT_REQUEST_TIMEOUT);
    assert!(!trust.is_loaded());
}
