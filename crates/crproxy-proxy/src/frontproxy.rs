//! Who is calling: only the client cluster's aggregation layer may use the proxy.
//!
//! The aggregator presents a front-proxy client certificate and names the real caller
//! in `X-Remote-*` headers. Both the CA that signs that certificate and the header
//! names are published by the client API server in
//! `kube-system/extension-apiserver-authentication`; [`FrontProxyTrust`] holds the
//! current values and [`spawn_trust_watch`] keeps them in step with the ConfigMap.
//!
//! The TLS layer verifies the certificate chain (so a connection without a valid
//! front-proxy certificate never carries identity headers we believe); the HTTP
//! layer then checks the certificate's common name against the allowed names and
//! reads the caller from the headers. Anything else is answered 401.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use http::HeaderMap;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::Event;
use kube::Api;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::watches::{self, WatchClient, WatchUpdate};
use crproxy_core::locks;

/// Namespace of the ConfigMap the client API server publishes.
pub const AUTHENTICATION_CONFIGMAP_NAMESPACE: &str = "kube-system";
/// Name of the ConfigMap the client API server publishes.
pub const AUTHENTICATION_CONFIGMAP_NAME: &str = "extension-apiserver-authentication";

/// The ConfigMap could not be turned into a trust configuration.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// The ConfigMap does not exist (yet): the client API server publishes it at
    /// start.
    #[error("ConfigMap kube-system/extension-apiserver-authentication does not exist on the client cluster")]
    Missing,
    /// `requestheader-client-ca-file` is missing: the client API server has no
    /// front-proxy configured, so no request can be trusted.
    #[error("ConfigMap kube-system/extension-apiserver-authentication has no requestheader-client-ca-file: the client API server has no front-proxy (aggregation) CA configured")]
    NoRequestHeaderCa,
    /// The CA bundle holds no usable certificate.
    #[error("requestheader-client-ca-file holds no usable certificate: {0}")]
    BadCa(String),
    /// A header-name list is not a JSON array of strings.
    #[error("{key} is not a JSON list of strings: {source}")]
    BadList {
        key: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// What the aggregation layer told us about the caller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The front-proxy trust settings in force.
#[derive(Clone, Debug)]
pub struct TrustSettings {
    /// Empty means any certificate signed by the CA is accepted (as Kubernetes does).
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_prefixes: Vec<String>,
    verifier: Arc<dyn ClientCertVerifier>,
}

impl TrustSettings {
    /// Parses the data of `extension-apiserver-authentication`.
    pub fn from_configmap(configmap: &ConfigMap) -> Result<Self, TrustError> {
        let field = |key: &str| {
            configmap
                .data
                .as_ref()
                .and_then(|data| data.get(key))
                .map(String::as_str)
        };
        let ca_pem = field("requestheader-client-ca-file").ok_or(TrustError::NoRequestHeaderCa)?;
        let list = |key: &'static str, default: &[&str]| -> Result<Vec<String>, TrustError> {
            match field(key) {
                None | Some("") => Ok(default.iter().map(|s| s.to_string()).collect()),
                Some(raw) => {
                    serde_json::from_str(raw).map_err(|source| TrustError::BadList { key, source })
                }
            }
        };
        Ok(Self {
            allowed_names: list("requestheader-allowed-names", &[])?,
            username_headers: list("requestheader-username-headers", &["X-Remote-User"])?,
            group_headers: list("requestheader-group-headers", &["X-Remote-Group"])?,
            // Header names arrive lower-cased; compare against lower-cased prefixes.
            extra_prefixes: list("requestheader-extra-headers-prefix", &["X-Remote-Extra-"])?
                .into_iter()
                .map(|prefix| prefix.to_ascii_lowercase())
                .collect(),
            verifier: webpki_verifier(ca_pem)?,
        })
    }
}

fn webpki_verifier(ca_pem: &str) -> Result<Arc<dyn ClientCertVerifier>, TrustError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| TrustError::BadCa(e.to_string()))?;
        roots
            .add(cert)
            .map_err(|e| TrustError::BadCa(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(TrustError::BadCa("no PEM certificate found".into()));
    }
    WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(crproxy_kube::crypto_provider()),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| TrustError::BadCa(e.to_string()))
}

/// The current trust settings, shared by the TLS verifier and the request handler
/// and replaced as a whole when the ConfigMap changes.
#[derive(Debug, Default)]
pub struct FrontProxyTrust {
    current: RwLock<Option<Arc<TrustSettings>>>,
}

impl FrontProxyTrust {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Installs new settings; connections made from now on use them.
    pub fn set(&self, settings: TrustSettings) {
        *locks::write(&self.current) = Some(Arc::new(settings));
    }

    /// Whether settings have been loaded at least once.
    pub fn is_loaded(&self) -> bool {
        self.get().is_some()
    }

    fn get(&self) -> Option<Arc<TrustSettings>> {
        locks::read(&self.current).clone()
    }

    /// A rustls verifier that always consults the latest settings.
    pub fn verifier(self: &Arc<Self>) -> Arc<dyn ClientCertVerifier> {
        Arc::new(DynamicVerifier {
            trust: Arc::clone(self),
            algorithms: crproxy_kube::crypto_provider().signature_verification_algorithms,
        })
    }

    /// The caller of a request whose connection presented the client certificate
    /// `peer` (already chain-verified by TLS; `None` when it presented none), or
    /// `None` when the request must be refused with 401.
    pub fn authenticate(
        &self,
        peer: Option<&PeerCertificate>,
        headers: &HeaderMap,
    ) -> Option<Caller> {
        let settings = self.get()?;
        let user = admitted_user(&settings, peer?, headers)?.to_string();
        let groups = settings
            .group_headers
            .iter()
            .flat_map(|h| headers.get_all(h.as_str()).iter())
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in headers {
            let lower = name.as_str();
            for prefix in &settings.extra_prefixes {
                if let Some(key) = lower.strip_prefix(prefix.as_str()) {
                    let key = percent_encoding::percent_decode_str(key)
                        .decode_utf8_lossy()
                        .to_lowercase();
                    if let Ok(v) = value.to_str() {
                        extra.entry(key).or_default().push(v.to_string());
                    }
                }
            }
        }
        Some(Caller {
            user,
            groups,
            extra,
        })
    }

    /// Whether [`authenticate`](Self::authenticate) would name a caller, without
    /// copying the caller's identity out of the headers: the request path only
    /// needs the verdict, and this runs on every request.
    pub fn admits(&self, peer: Option<&PeerCertificate>, headers: &HeaderMap) -> bool {
        match (self.get(), peer) {
            (Some(settings), Some(peer)) => admitted_user(&settings, peer, headers).is_some(),
            _ => false,
        }
    }
}

/// The user a request names, if its connection's certificate is one of the allowed
/// front proxies and a username header is set: the rule both
/// [`FrontProxyTrust::authenticate`] and [`FrontProxyTrust::admits`] apply.
fn admitted_user<'h>(
    settings: &TrustSettings,
    peer: &PeerCertificate,
    headers: &'h HeaderMap,
) -> Option<&'h str> {
    if !settings.allowed_names.is_empty() {
        let name = peer.common_name.as_deref()?;
        if !settings.allowed_names.iter().any(|allowed| allowed == name) {
            return None;
        }
    }
    settings
        .username_headers
        .iter()
        .find_map(|h| headers.get(h.as_str()).and_then(|v| v.to_str().ok()))
        .filter(|u| !u.is_empty())
}

/// What the proxy keeps of a connection's verified client certificate: read once
/// per connection, not per request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCertificate {
    pub common_name: Option<String>,
}

impl PeerCertificate {
    pub fn from_der(cert: &CertificateDer<'_>) -> Self {
        Self {
            common_name: common_name(cert),
        }
    }
}

/// The subject's common name as kube-apiserver reads it: Go's
/// `pkix.Name.FillFromRDNSequence` overwrites `CommonName` for every CN attribute,
/// so with several CNs the LAST one names the front proxy. Taking the first would let
/// a certificate carrying `CN=<allowed>, CN=<other>` pass here while the client API
/// server knows it as `<other>`. An unreadable last CN gives no name (refused).
fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed
        .subject()
        .iter_common_name()
        .last()?
        .as_str()
        .ok()?
        .to_string();
    Some(cn)
}

/// Delegates to whatever verifier the current settings hold. Client certificates are
/// optional at the TLS layer so that a caller without one gets a readable 401 rather
/// than a handshake failure.
#[derive(Debug)]
struct DynamicVerifier {
    trust: Arc<FrontProxyTrust>,
    /// Read once from the provider: a provider is two vectors built per call, and
    /// these checks run on every handshake that presents a certificate.
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for DynamicVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints are optional; aggregators send their one certificate regardless.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match self.trust.get() {
            Some(settings) => settings
                .verifier
                .verify_client_cert(end_entity, intermediates, now),
            None => Err(rustls::Error::General(
                "front-proxy CA not loaded yet from the client cluster".into(),
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Reads the trust settings from the client cluster once and installs them; gives
/// up after [`crproxy_kube::DEFAULT_REQUEST_TIMEOUT`], so a hanging client API
/// server does not hold up the start (the watch keeps trying).
pub async fn load_trust(client: &kube::Client, trust: &FrontProxyTrust) -> Result<(), String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), AUTHENTICATION_CONFIGMAP_NAMESPACE);
    let limit = crproxy_kube::DEFAULT_REQUEST_TIMEOUT;
    let configmap = tokio::time::timeout(limit, api.get(AUTHENTICATION_CONFIGMAP_NAME))
        .await
        .map_err(|_| read_error(&format!("no answer within {limit:?}")))?
        .map_err(|e| read_error(&e))?;
    let settings = TrustSettings::from_configmap(&configmap).map_err(|e| e.to_string())?;
    trust.set(settings);
    Ok(())
}

fn read_error(error: &dyn std::fmt::Display) -> String {
    format!(
        "reading kube-system/extension-apiserver-authentication from the client cluster: {error}"
    )
}

/// Follows the ConfigMap with a watch ([`crate::watches`]), so a rotated
/// front-proxy CA is installed as soon as the client API server publishes it. The
/// last good settings stay in force through failures, bad edits and a deleted
/// ConfigMap. Logs only when the outcome changes, so a client cluster that is slow
/// to publish the ConfigMap does not flood the log. `client` is made by
/// `loaded` says whether settings are installed already.
pub fn spawn_trust_watch(
    watch: WatchClient,
    trust: Arc<FrontProxyTrust>,
    loaded: bool,
) -> tokio::task::JoinHandle<()> {
    let api: Api<ConfigMap> =
        Api::namespaced(watch.client().clone(), AUTHENTICATION_CONFIGMAP_NAMESPACE);
    let config = watch
        .config()
        .fields(&format!("metadata.name={AUTHENTICATION_CONFIGMAP_NAME}"));
    let mut follower = TrustFollower {
        trust,
        loaded,
        failing: false,
        found_in_list: false,
    };
    tokio::spawn(async move {
        watches::follow(api, config, move |update| follower.update(update)).await
    })
}

/// Installs what the watch of the ConfigMap delivers; remembers what the log last
/// said, to log changes only.
struct TrustFollower {
    trust: Arc<FrontProxyTrust>,
    loaded: bool,
    failing: bool,
    /// Whether the list in progress held the ConfigMap.
    found_in_list: bool,
}

impl TrustFollower {
    fn update(&mut self, update: WatchUpdate<ConfigMap>) {
        match update {
            WatchUpdate::Event(Event::Init) => self.found_in_list = false,
            WatchUpdate::Event(Event::InitApply(configmap)) => {
                self.found_in_list = true;
                self.install(&configmap);
            }
            WatchUpdate::Event(Event::InitDone) => {
                if !self.found_in_list {
                    self.failed(&TrustError::Missing.to_string());
                }
            }
            // A bad edit is reported and the last good settings kept; the next edit
            // may fix it.
            WatchUpdate::Event(Event::Apply(configmap)) => self.install(&configmap),
            WatchUpdate::Event(Event::Delete(_)) => self.failed(&TrustError::Missing.to_string()),
            WatchUpdate::Failed(error) => self.failed(&read_error(&error)),
        }
    }

    fn install(&mut self, configmap: &ConfigMap) {
        match TrustSettings::from_configmap(configmap) {
            Ok(settings) => {
                self.trust.set(settings);
                if self.failing || !self.loaded {
                    tracing::info!("front-proxy trust loaded from the client cluster");
                }
                self.loaded = true;
                self.failing = false;
            }
            Err(error) => self.failed(&error.to_string()),
        }
    }

    fn failed(&mut self, error: &str) {
        if !self.failing {
            tracing::warn!(%error, "cannot refresh the client's front-proxy trust; keeping the last settings");
        }
        self.failing = true;
    }
}

#[cfg(test)]
#[path = "frontproxy/tests.rs"]
mod tests;
