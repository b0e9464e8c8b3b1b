use super::*;
use crate::dial::Dialer;
use crate::frontproxy::TrustSettings;
use crate::metrics::Metrics;
use crproxy_core::pki::CertificateAuthority;
use rustls::pki_types::ServerName;

fn pool(target: &str) -> Arc<PeerPool> {
    let config = test_support::client_config_without_roots();
    let dialer = Dialer::new(
        Arc::new(config),
        ServerName::try_from("target.example").expect("name"),
    );
    PeerPool::new(
        "example.com/v1".into(),
        dialer,
        Metrics::new().target(target),
    )
}

fn load(trust: &FrontProxyTrust) {
    let ca = CertificateAuthority::generate("front-proxy-ca").expect("ca");
    let configmap: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(
        serde_json::json!({"data": {"requestheader-client-ca-file": ca.pem().cert}}),
    )
    .expect("ConfigMap");
    trust.set(TrustSettings::from_configmap(&configmap).expect("settings"));
}

/// 503 with the reason in the body until the trust is loaded and a peer list
/// arrived for at least one target; then 200 `ok`.
#[test]
fn ready_once_the_trust_is_loaded_and_a_peer_cache_synced() {
    let trust = FrontProxyTrust::new();
    let (first, second) = (pool("p/one"), pool("p/two"));
    let readiness = Readiness::new(
        Arc::clone(&trust),
        vec![
            ("p/one".into(), Arc::clone(&first)),
            ("p/two".into(), Arc::clone(&second)),
        ],
    );

    let (code, body) = readiness.answer();
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("front-proxy trust not loaded"), "{body}");
    assert!(
        body.contains("no target's peer cache has synced yet (targets: p/one, p/two)"),
        "{body}"
    );
    assert_eq!(body.lines().count(), 2, "{body}");

    load(&trust);
    let (code, body) = readiness.answer();
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!body.contains("front-proxy"), "{body}");
    assert!(body.contains("peer cache"), "{body}");

    // One target is enough, and an empty list is still a synced cache.
    second.publish(Vec::new());
    assert_eq!(readiness.answer(), (StatusCode::OK, READY_BODY.to_string()));
}

#[test]
fn a_synced_cache_without_the_trust_is_not_ready() {
    let trust = FrontProxyTrust::new();
    let only = pool("p/one");
    only.publish(vec!["127.0.0.1:1".into()]);
    let readiness = Readiness::new(trust, vec![("p/one".into(), only)]);
    let (code, body) = readiness.answer();
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body.starts_with("not ready: front-proxy trust not loaded"),
        "{body}"
    );
    assert_eq!(body.lines().count(), 1, "{body}");
}

#[test]
fn a_process_without_a_proxy_has_no_proxy_condition() {
    let readiness = Readiness::without_proxy();
    assert_eq!(readiness.answer(), (StatusCode::OK, READY_BODY.to_string()));
}
