//! The example extension API server of the dev environment: `gateways.example.net/v1`
//! (namespaced, kind Gateway), served over TLS behind an APIService.
//!
//! It keeps Gateways in memory with kube's rules a client can observe: create,
//! get, list, watch (with replay from a resourceVersion), update and patch (merge
//! and JSON patch, server-side apply) with resourceVersion conflicts, delete,
//! the `status` subresource, label and field selectors and dry run. A Gateway whose `spec.port` is not an
//! integer from 1 to 65535 is refused with a 422 Invalid Status naming
//! `spec.port`, as an aggregated server with its own validation would.
//!
//! With a state file (`crproxy dev` keeps it in `<dir>/host/gateways.json`) the
//! Gateways survive a restart: see [`state_file`].
//!
//! Only the aggregator may call it: clients must present a certificate signed by
//! the front-proxy CA (the identity is in `X-Remote-User`, as kube's request-header
//! authentication has it). [`ExampleApiServer::register`] creates the Service and
//! APIService on a devcluster so that its aggregator forwards `example.net/v1`.

use crate::DevCluster;
use bytes::Bytes;
use crproxy_core::locks;
use crproxy_core::pki::CertificateAuthority;
use crproxy_core::selector::LabelSelector;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, PostParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, watch};

mod state_file;
pub use state_file::StateFileError;

pub const GROUP: &str = "example.net";
pub const VERSION: &str = "v1";
pub const RESOURCE: &str = "gateways";
pub const KIND: &str = "Gateway";
/// The Service (in `kube-system`) the APIService points at.
pub const SERVICE_NAME: &str = "example-apiserver";
pub const SERVICE_NAMESPACE: &str = "kube-system";
/// Watch events kept for watches that resume from a resourceVersion.
const HISTORY: usize = 1000;
/// Largest request body accepted.
const MAX_BODY: usize = 3 * 1024 * 1024;

/// Why the example server could not start or register.
#[derive(Debug, thiserror::Error)]
pub enum ExampleServerError {
    /// Binding 127.0.0.1 failed.
    #[error("cannot listen on 127.0.0.1: {0}")]
    Bind(#[source] std::io::Error),
    /// The serving certificate could not be made.
    #[error("certificates: {0}")]
    Pki(#[from] crproxy_core::pki::PkiError),
    /// The TLS configuration was rejected (bad front-proxy CA).
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// The devcluster refused the Service or APIService.
    #[error("registering on the devcluster: {0}")]
    Register(String),
    /// The saved Gateways cannot be read.
    #[error(transparent)]
    StateFile(#[from] StateFileError),
}

type Body = BoxBody<Bytes, Infallible>;

/// A running example API server. [`ExampleApiServer::stop`] (or dropping it)
/// stops listening and ends every connection.
pub struct ExampleApiServer {
    addr: SocketAddr,
    ca_pem: String,
    stop: watch::Sender<bool>,
}

impl ExampleApiServer {
    /// Starts the server on a free 127.0.0.1 port, trusting client certificates
    /// of `front_proxy_ca_pem` (a devcluster's [`DevCluster::front_proxy_ca_pem`]).
    /// With `state_file` the Gateways saved there are served and every change is
    /// saved there before it is acknowledged; without, they live in memory only.
    pub async fn start(
        front_proxy_ca_pem: &str,
        state_file: Option<std::path::PathBuf>,
    ) -> Result<Self, ExampleServerError> {
        let ca = CertificateAuthority::generate("example-apiserver-ca")?;
        let service_host = format!("{SERVICE_NAME}.{SERVICE_NAMESPACE}.svc");
        let serving = ca.issue_server(
            &[&service_host, "localhost"],
            &[std::net::IpAddr::from([127, 0, 0, 1])],
        )?;
        let tls = |e: &dyn std::fmt::Display| ExampleServerError::Tls(e.to_string());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(front_proxy_ca_pem.as_bytes()) {
            roots.add(cert.map_err(|e| tls(&e))?).map_err(|e| tls(&e))?;
        }
        let provider = Arc::new(crproxy_kube::crypto_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| tls(&e))?;
        let chain = CertificateDer::pem_slice_iter(serving.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls(&e))?;
        let key = PrivateKeyDer::from_pem_slice(serving.key.as_bytes()).map_err(|e| tls(&e))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls(&e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| tls(&e))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(ExampleServerError::Bind)?;
        let addr = listener.local_addr().map_err(ExampleServerError::Bind)?;
        let (stop, stopped) = watch::channel(false);
        let store = match state_file {
            None => Arc::new(Gateways::new(state_file::Saved::default(), None)),
            Some(path) => {
                let saved = state_file::load(&path).await?;
                let (requests, requested) = watch::channel(saved.rv);
                let (done, saved_state) = watch::channel(state_file::SaveState {
                    rv: saved.rv,
                    error: None,
                });
                let store = Arc::new(Gateways::new(saved, Some((requests, saved_state))));
                // Weak: the writer ends with the store (its request channel closes).
                let weak = Arc::downgrade(&store);
                tokio::spawn(state_file::writer(path, requested, done, move || {
                    let store = weak.upgrade()?;
                    let inner = store.lock();
                    let items: Vec<&Value> = inner.objects.values().collect();
                    Some((inner.rv, state_file::encode(inner.rv, &items)))
                }));
                store
            }
        };
        tokio::spawn(crproxy_serve::serve_tls(
            listener,
            acceptor,
            move |request| {
                let store = Arc::clone(&store);
                async move { handle(&store, request).await }
            },
            stopped,
        ));
        Ok(ExampleApiServer {
            addr,
            ca_pem: ca.pem().cert.clone(),
            stop,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA of the serving certificate (the APIService `caBundle`).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Creates (or replaces) the `kube-system/example-apiserver` Service (an
    /// ExternalName for localhost on this server's port) and the
    /// `v1.example.net` APIService on `cluster`.
    pub async fn register(&self, cluster: &DevCluster) -> Result<(), ExampleServerError> {
        use base64::Engine;
        let register = |e: &dyn std::fmt::Display| ExampleServerError::Register(e.to_string());
        let kubeconfig = crproxy_kube::Kubeconfig::from_yaml(&cluster.admin_kubeconfig())
            .map_err(|e| register(&e))?;
        let config = crproxy_kube::ClusterConfig::from_kubeconfig(&kubeconfig, None)
            .map_err(|e| register(&e))?;
        let credentials = config.credentials().map_err(|e| register(&e))?;
        let client = crproxy_kube::kube_client(&config, credentials, SERVICE_NAMESPACE)
            .map_err(|e| register(&e))?;
        let service = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": SERVICE_NAME, "namespace": SERVICE_NAMESPACE},
            "spec": {"type": "ExternalName", "externalName": "localhost",
                     "ports": [{"name": "https", "port": self.addr.port(), "protocol": "TCP"}]}});
        let apiservice = json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": format!("{VERSION}.{GROUP}")},
            "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 1000, "versionPriority": 15,
                     "service": {"namespace": SERVICE_NAMESPACE, "name": SERVICE_NAME, "port": self.addr.port()},
                     "caBundle": base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)}});
        let service: Service = serde_json::from_value(service).map_err(|e| register(&e))?;
        let apiservice: APIService =
            serde_json::from_value(apiservice).map_err(|e| register(&e))?;
        create_or_replace(&Api::namespaced(client.clone(), SERVICE_NAMESPACE), service).await?;
        create_or_replace(&Api::all(client), apiservice).await?;
        Ok(())
    }

    /// Stops listening and ends open connections (watches included).
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

/// Creates `object`, or replaces the one of the same name with it (a server started
/// again registers its new port and CA).
async fn create_or_replace<K>(api: &Api<K>, mut object: K) -> Result<(), ExampleServerError>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let register =
        |e: kube::Error| ExampleServerError::Register(crproxy_kube::Error::from(e).to_string());
    let post = PostParams::default();
    match api.create(&post, &object).await {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(status)) if status.reason == "AlreadyExists" => {}
        Err(e) => return Err(register(e)),
    }
    // The aggregator writes the APIService's status meanwhile, so a replace can
    // meet a newer version: read it again and retry, a few times.
    let name = object.meta().name.clone().unwrap_or_default();
    let mut attempts = 0;
    loop {
        let current = api.get(&name).await.map_err(register)?;
        object.meta_mut().resource_version = current.meta().resource_version.clone();
        match api.replace(&name, &post, &object).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.reason == "Conflict" && attempts < 5 => {
                attempts += 1;
            }
            Err(e) => return Err(register(e)),
        }
    }
}

impl Drop for ExampleApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---------- storage ----------

/// One change, as a watch event.
#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    kind: &'static str,
    object: Value,
}

struct Inner {
    objects: BTreeMap<(String, String), Value>,
    rv: u64,
    history: VecDeque<Change>,
}

struct Gateways {
    inner: Mutex<Inner>,
    changes: broadcast::Sender<Change>,
    /// With a state file: where saves are requested (by resourceVersion) and how
    /// the latest one went.
    saving: Option<(watch::Sender<u64>, watch::Receiver<state_file::SaveState>)>,
}

impl Gateways {
    fn new(
        saved: state_file::Saved,
        saving: Option<(watch::Sender<u64>, watch::Receiver<state_file::SaveState>)>,
    ) -> Self {
        Gateways {
            inner: Mutex::new(Inner {
                objects: saved.items.into_iter().map(|o| (key_of(&o), o)).collect(),
                rv: saved.rv.max(1),
                history: VecDeque::new(),
            }),
            changes: broadcast::channel(256).0,
            saving,
        }
    }

    /// Waits until the store as it is now is saved (at once without a state file).
    async fn saved(&self) -> Result<(), String> {
        let Some((requests, saved)) = &self.saving else {
            return Ok(());
        };
        let rv = self.lock().rv;
        requests.send_replace(rv);
        let mut saved = saved.clone();
        let state = saved
            .wait_for(|s| s.rv >= rv)
            .await
            .map_err(|_| "the state file writer stopped".to_string())?;
        match &state.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        locks::lock(&self.inner)
    }

    /// Stores (or removes, for DELETED) under the lock and announces the change.
    fn commit(
        inner: &mut Inner,
        changes: &broadcast::Sender<Change>,
        kind: &'static str,
        mut object: Value,
    ) -> Value {
        inner.rv += 1;
        let rv = inner.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = key_of(&object);
        if kind == "DELETED" {
            inner.objects.remove(&key);
        } else {
            inner.objects.insert(key, object.clone());
        }
        let change = Change {
            rv,
            kind,
            object: object.clone(),
        };
        inner.history.push_back(change.clone());
        if inner.history.len() > HISTORY {
            inner.history.pop_front();
        }
        let _ = changes.send(change);
        object
    }
}

fn key_of(object: &Value) -> (String, String) {
    (
        object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

// ---------- HTTP ----------

fn full(status: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// A request refused with a kube `Status` (answered by `Response::from`).
struct Refusal {
    code: u16,
    status: Box<Value>,
}

impl From<Refusal> for Response<Body> {
    fn from(r: Refusal) -> Self {
        full(
            StatusCode::from_u16(r.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &r.status,
        )
    }
}

fn status_error(code: u16, reason: &str, message: &str, details: Value) -> Refusal {
    let mut body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    if !details.is_null() {
        body["details"] = details;
    }
    Refusal {
        code,
        status: Box::new(body),
    }
}

fn not_found(name: &str) -> Refusal {
    status_error(
        404,
        "NotFound",
        &format!("{RESOURCE}.{GROUP} {name:?} not found"),
        json!({"name": name, "group": GROUP, "kind": RESOURCE}),
    )
}

fn conflict(name: &str) -> Refusal {
    conflict_because(
        name,
        "the object has been modified; please apply your changes to the latest version and try again",
    )
}

fn conflict_because(name: &str, why: &str) -> Refusal {
    Refusal {
        code: 409,
        status: Box::new(crproxy_core::status::conflict(RESOURCE, GROUP, name, why)),
    }
}

fn bad_request(message: &str) -> Refusal {
    status_error(400, "BadRequest", message, Value::Null)
}

/// The 422 for invalid Gateways, with one cause per field.
fn invalid(name: &str, causes: Vec<(String, String, String)>) -> Refusal {
    let summary: Vec<String> = causes
        .iter()
        .map(|(_, message, field)| format!("{field}: {message}"))
        .collect();
    let message = if summary.len() == 1 {
        format!("{KIND}.{GROUP} {name:?} is invalid: {}", summary[0])
    } else {
        format!(
            "{KIND}.{GROUP} {name:?} is invalid: [{}]",
            summary.join(", ")
        )
    };
    let causes: Vec<Value> = causes
        .into_iter()
        .map(|(reason, message, field)| json!({"reason": reason, "message": message, "field": field}))
        .collect();
    status_error(
        422,
        "Invalid",
        &message,
        json!({"name": name, "group": GROUP, "kind": KIND, "causes": causes}),
    )
}

/// The Gateway's own rule: `spec.port` is an integer from 1 to 65535.
pub fn validation_errors(gateway: &Value) -> Vec<(String, String, String)> {
    let field = "spec.port".to_string();
    match &gateway["spec"]["port"] {
        Value::Null => vec![("FieldValueRequired".into(), "Required value".into(), field)],
        Value::Number(n) if n.as_i64().is_some_and(|p| (1..=65535).contains(&p)) => Vec::new(),
        other => vec![(
            "FieldValueInvalid".into(),
            format!("Invalid value: {other}: must be between 1 and 65535, inclusive"),
            field,
        )],
    }
}

fn query(request: &Request<hyper::body::Incoming>) -> HashMap<String, String> {
    crate::server::query_parameters(request.uri().query())
}

/// Answers a request; a change is answered only once it is saved (when the server
/// keeps a state file).
async fn handle(store: &Gateways, request: Request<hyper::body::Incoming>) -> Response<Body> {
    let changes =
        request.method() != Method::GET && query(&request).get("dryRun").is_none_or(|v| v != "All");
    let response = dispatch(store, request).await;
    if changes && response.status().is_success() {
        store_saved(store, response).await
    } else {
        response
    }
}

/// `response` once the store is saved, or the 500 saying it could not be.
async fn store_saved(store: &Gateways, response: Response<Body>) -> Response<Body> {
    match store.saved().await {
        Ok(()) => response,
        Err(e) => status_error(
            500,
            "InternalError",
            &format!("the change was made but could not be saved: {e}"),
            Value::Null,
        )
        .into(),
    }
}

async fn dispatch(store: &Gateways, request: Request<hyper::body::Incoming>) -> Response<Body> {
    let path = request.uri().path().to_string();
    // A generic API server's health endpoints, with kube's headers.
    let checks = crate::health::generic_server_checks;
    if let Some(answer) = crate::health::answer(&path, request.uri().query(), checks) {
        return answer.map(|text| Full::new(text).boxed());
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let discovery = match segments.as_slice() {
        ["apis"] => {
            Some(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]}))
        }
        ["apis", GROUP] => Some(api_group()),
        ["apis", GROUP, VERSION] => Some(resource_list()),
        // kubectl reads these for `explain` and to leave validation to the server.
        ["openapi", "v2"] => {
            let document = crate::openapi::v2_document(&[openapi_resource()]);
            return crate::openapi::v2_response(&document, request.headers())
                .map(|bytes| Full::new(bytes).boxed());
        }
        ["openapi", "v3"] => {
            let document = crate::openapi::v3_group_version(GROUP, VERSION, &[openapi_resource()]);
            let path = crate::openapi::group_version_path(GROUP, VERSION);
            Some(crate::openapi::v3_index(&[(
                path,
                crate::openapi::document_hash(&document),
            )]))
        }
        ["openapi", "v3", "apis", GROUP, VERSION] => Some(crate::openapi::v3_group_version(
            GROUP,
            VERSION,
            &[openapi_resource()],
        )),
        _ => None,
    };
    if let Some(document) = discovery {
        return full(StatusCode::OK, &document);
    }
    let q = query(&request);
    let route = match segments.as_slice() {
        ["apis", GROUP, VERSION, RESOURCE] => Route {
            namespace: None,
            name: None,
            status: false,
        },
        ["apis", GROUP, VERSION, "namespaces", ns, RESOURCE] => Route {
            namespace: Some(ns.to_string()),
            name: None,
            status: false,
        },
        ["apis", GROUP, VERSION, "namespaces", ns, RESOURCE, name] => Route {
            namespace: Some(ns.to_string()),
            name: Some(name.to_string()),
            status: false,
        },
        ["apis", GROUP, VERSION, "namespaces", ns, RESOURCE, name, "status"] => Route {
            namespace: Some(ns.to_string()),
            name: Some(name.to_string()),
            status: true,
        },
        _ => {
            return status_error(
                404,
                "NotFound",
                "the server could not find the requested resource",
                Value::Null,
            )
            .into()
        }
    };
    let method = request.method().clone();
    let content_type = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let body = match http_body_util::Limited::new(request.into_body(), MAX_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => return bad_request(&format!("reading the body: {e}")).into(),
    };
    let dry_run = q.get("dryRun").is_some_and(|v| v == "All");
    let is_watch = q.get("watch").is_some_and(|v| v == "true" || v == "1");
    match (method, &route.name) {
        (Method::GET, None) if is_watch => watch_gateways(store, &route, &q),
        (Method::GET, None) => list(store, &route, &q),
        (Method::POST, None) if route.namespace.is_some() && !route.status => {
            create(store, &route, &body, dry_run)
        }
        (Method::GET, Some(name)) => match store.lock().objects.get(&route.key(name)) {
            Some(object) => full(StatusCode::OK, object),
            None => not_found(name).into(),
        },
        (Method::PUT, Some(name)) => match decode(&body) {
            Ok(object) => update(store, &route, name, |_| Ok(object.clone()), true, dry_run),
            Err(e) => e.into(),
        },
        (Method::PATCH, Some(name)) if content_type == "application/apply-patch+yaml" => {
            server_side_apply(store, &route, name, &body, &q, dry_run)
        }
        (Method::PATCH, Some(name)) => {
            let patch = match decode(&body) {
                Ok(p) => p,
                Err(e) => return e.into(),
            };
            let apply = |current: &Value| -> Result<Value, Refusal> {
                let mut doc = current.clone();
                match content_type.as_str() {
                    "application/merge-patch+json" => json_patch::merge(&mut doc, &patch),
                    "application/json-patch+json" => {
                        let p: json_patch::Patch = serde_json::from_value(patch.clone())
                            .map_err(|e| bad_request(&format!("invalid JSON patch: {e}")))?;
                        json_patch::patch(&mut doc, &p)
                            .map_err(|e| status_error(422, "Invalid", &e.to_string(), Value::Null))?;
                    }
                    _ => {
                        return Err(status_error(
                            415,
                            "UnsupportedMediaType",
                            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                            Value::Null,
                        ))
                    }
                }
                if doc["metadata"]["resourceVersion"].is_null() {
                    doc["metadata"]["resourceVersion"] =
                        current["metadata"]["resourceVersion"].clone();
                }
                Ok(doc)
            };
            update(store, &route, name, apply, false, dry_run)
        }
        (Method::DELETE, Some(name)) if !route.status => delete(store, &route, name, dry_run),
        _ => status_error(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            Value::Null,
        )
        .into(),
    }
}

struct Route {
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

impl Route {
    fn key(&self, name: &str) -> (String, String) {
        (self.namespace.clone().unwrap_or_default(), name.to_string())
    }
}

/// The Gateway as OpenAPI publishes it.
fn openapi_resource() -> crate::openapi::CrdResource {
    crate::openapi::CrdResource {
        group: GROUP.into(),
        version: VERSION.into(),
        kind: KIND.into(),
        list_kind: format!("{KIND}List"),
        plural: RESOURCE.into(),
        singular: "gateway".into(),
        namespaced: true,
        schema: Some(
            json!({"description": "Gateway is the example aggregated resource of the dev environment.",
            "type": "object", "properties": {
                "spec": {"description": "Where the gateway listens.", "type": "object", "properties": {
                    "port": {"description": "The port, 1 to 65535.", "type": "integer", "format": "int32",
                             "minimum": 1, "maximum": 65535}},
                    "x-kubernetes-preserve-unknown-fields": true},
                "status": {"description": "Observed state, written through the status subresource.",
                           "type": "object", "x-kubernetes-preserve-unknown-fields": true}}}),
        ),
    }
}

fn api_group() -> Value {
    let gv = json!({"groupVersion": format!("{GROUP}/{VERSION}"), "version": VERSION});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [gv], "preferredVersion": gv})
}

fn resource_list() -> Value {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/{VERSION}"),
        "resources": [
            {"name": RESOURCE, "singularName": "gateway", "namespaced": true, "kind": KIND,
             "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]},
            {"name": format!("{RESOURCE}/status"), "singularName": "", "namespaced": true, "kind": KIND,
             "verbs": ["get", "patch", "update"]}]})
}

fn decode(body: &[u8]) -> Result<Value, Refusal> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err(bad_request("the body must be a JSON object")),
        Err(e) => Err(bad_request(&format!("the body is not JSON: {e}"))),
    }
}

/// Label selector plus `metadata.name`/`metadata.namespace` field terms
/// `(field, equal?, value)`.
struct Selectors {
    labels: LabelSelector,
    fields: Vec<(String, bool, String)>,
}

fn selector(q: &HashMap<String, String>) -> Result<Selectors, Refusal> {
    let labels = LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
        .map_err(|e| bad_request(e.message()))?;
    let parsed = crproxy_core::selector::FieldSelector::parse(
        q.get("fieldSelector").map(String::as_str).unwrap_or(""),
    )
    .map_err(|e| bad_request(e.message()))?;
    let mut fields = Vec::new();
    for r in parsed.requirements() {
        if r.field != "metadata.name" && r.field != "metadata.namespace" {
            return Err(bad_request(&format!(
                "field label not supported: {}",
                r.field
            )));
        }
        fields.push((r.field.clone(), !r.negated, r.value.clone()));
    }
    Ok(Selectors { labels, fields })
}

fn in_scope(route: &Route, sel: &Selectors, object: &Value) -> bool {
    let meta = &object["metadata"];
    route
        .namespace
        .as_deref()
        .is_none_or(|ns| meta["namespace"] == ns)
        && sel.labels.matches_json(meta.get("labels"))
        && sel.fields.iter().all(|(field, equal, value)| {
            let key = field.trim_start_matches("metadata.");
            (meta[key].as_str().unwrap_or_default() == value) == *equal
        })
}

fn list(store: &Gateways, route: &Route, q: &HashMap<String, String>) -> Response<Body> {
    let sel = match selector(q) {
        Ok(s) => s,
        Err(e) => return e.into(),
    };
    let inner = store.lock();
    let items: Vec<&Value> = inner
        .objects
        .values()
        .filter(|o| in_scope(route, &sel, o))
        .collect();
    full(
        StatusCode::OK,
        &json!({"kind": format!("{KIND}List"), "apiVersion": format!("{GROUP}/{VERSION}"),
                "metadata": {"resourceVersion": inner.rv.to_string()}, "items": items}),
    )
}

fn create(store: &Gateways, route: &Route, body: &[u8], dry_run: bool) -> Response<Body> {
    match decode(body) {
        Ok(object) => create_object(store, route, object, dry_run),
        Err(e) => e.into(),
    }
}

fn create_object(
    store: &Gateways,
    route: &Route,
    mut object: Value,
    dry_run: bool,
) -> Response<Body> {
    let namespace = route.namespace.clone().unwrap_or_default();
    if let Err(e) = check_type(&mut object) {
        return e.into();
    }
    let meta = &mut object["metadata"];
    if !meta.is_object() {
        *meta = json!({});
    }
    match meta["namespace"].as_str() {
        Some(ns) if !ns.is_empty() && ns != namespace => return bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )
        .into(),
        _ => meta["namespace"] = json!(namespace),
    }
    let mut name = meta["name"].as_str().unwrap_or_default().to_string();
    if name.is_empty() {
        if let Some(prefix) = meta["generateName"].as_str().filter(|p| !p.is_empty()) {
            let suffix: String = uuid::Uuid::new_v4()
                .simple()
                .to_string()
                .chars()
                .take(5)
                .collect();
            name = format!("{prefix}{suffix}");
        }
    }
    if name.is_empty() {
        return invalid(
            "",
            vec![(
                "FieldValueRequired".into(),
                "Required value: name or generateName is required".into(),
                "metadata.name".into(),
            )],
        )
        .into();
    }
    meta["name"] = json!(name);
    meta["uid"] = json!(uuid::Uuid::new_v4().to_string());
    meta["creationTimestamp"] = json!(chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string());
    meta["generation"] = json!(1);
    if let Some(m) = object.as_object_mut() {
        // Status is written through the status subresource only.
        m.remove("status");
    }
    let errors = validation_errors(&object);
    if !errors.is_empty() {
        return invalid(&name, errors).into();
    }
    let mut inner = store.lock();
    if inner.objects.contains_key(&(namespace, name.clone())) {
        return status_error(
            409,
            "AlreadyExists",
            &format!("{RESOURCE}.{GROUP} {name:?} already exists"),
            json!({"name": name, "group": GROUP, "kind": RESOURCE}),
        )
        .into();
    }
    if dry_run {
        return full(StatusCode::CREATED, &object);
    }
    let stored = Gateways::commit(&mut inner, &store.changes, "ADDED", object);
    full(StatusCode::CREATED, &stored)
}

/// Server-side apply with devcluster's field ownership (conflicts answer 409
/// unless `force=true`); applying to a missing Gateway creates it.
fn server_side_apply(
    store: &Gateways,
    route: &Route,
    name: &str,
    body: &[u8],
    q: &HashMap<String, String>,
    dry_run: bool,
) -> Response<Body> {
    let Some(manager) = q.get("fieldManager").filter(|m| !m.is_empty()) else {
        return status_error(
            422,
            "Invalid",
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            json!({"group": "meta.k8s.io", "kind": "PatchOptions",
                   "causes": [{"reason": "FieldValueRequired", "message": "Required value: is required for apply patch", "field": "fieldManager"}]}),
        )
        .into();
    };
    let applied = match crate::server::decode_yaml(body) {
        Ok(v) if v.is_object() => v,
        Ok(_) => return bad_request("the applied configuration must be an object").into(),
        Err(e) => return bad_request(&format!("error decoding YAML: {e}")).into(),
    };
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let api_version = format!("{GROUP}/{VERSION}");
    let options = crate::patch::ApplyOptions {
        manager,
        force: q.get("force").is_some_and(|f| f == "true"),
        api_version: &api_version,
        subresource: route.status.then_some("status"),
        now: &now,
        schema: None,
    };
    let apply = |live: Option<&Value>| {
        crate::patch::apply_with(live, &applied, &options).map_err(|e| match e {
            crate::patch::ApplyError::Conflicts(c) => {
                let status = crate::patch::apply_conflict_status(&c);
                Refusal {
                    code: 409,
                    status: Box::new(status),
                }
            }
            other => bad_request(&other.to_string()),
        })
    };
    let exists = store.lock().objects.contains_key(&route.key(name));
    if !exists {
        if route.status {
            return not_found(name).into();
        }
        // kube's patcher: a configuration naming a uid applies to that object only.
        if let Some(uid) = applied["metadata"]["uid"]
            .as_str()
            .filter(|u| !u.is_empty())
        {
            return conflict_because(name, &crate::server::seams::uid_mismatch(uid)).into();
        }
        return match apply(None) {
            Ok(mut object) => {
                object["metadata"]["name"] = json!(name);
                create_object(store, route, object, dry_run)
            }
            Err(e) => e.into(),
        };
    }
    update(
        store,
        route,
        name,
        |current| {
            let mut new = apply(Some(current))?;
            if new["metadata"]["resourceVersion"].is_null() {
                new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
            }
            Ok(new)
        },
        false,
        dry_run,
    )
}

fn check_type(object: &mut Value) -> Result<(), Refusal> {
    let api_version = format!("{GROUP}/{VERSION}");
    match object["apiVersion"].as_str() {
        Some(v) if v != api_version => {
            return Err(bad_request(&format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )))
        }
        _ => object["apiVersion"] = json!(api_version),
    }
    match object["kind"].as_str() {
        Some(k) if k != KIND => {
            return Err(bad_request(&format!(
                "the kind in the data ({k}) does not match the expected kind ({KIND})"
            )))
        }
        _ => object["kind"] = json!(KIND),
    }
    Ok(())
}

/// Update, status update and patch: `build` makes the new object from the stored one.
fn update(
    store: &Gateways,
    route: &Route,
    name: &str,
    build: impl FnOnce(&Value) -> Result<Value, Refusal>,
    require_rv: bool,
    dry_run: bool,
) -> Response<Body> {
    let mut inner = store.lock();
    let Some(current) = inner.objects.get(&route.key(name)).cloned() else {
        return not_found(name).into();
    };
    let mut object = match build(&current) {
        Ok(o) => o,
        Err(e) => return e.into(),
    };
    if let Err(e) = check_type(&mut object) {
        return e.into();
    }
    if object["metadata"]["name"]
        .as_str()
        .is_some_and(|n| n != name)
    {
        return bad_request(&format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            object["metadata"]["name"].as_str().unwrap_or_default()
        ))
        .into();
    }
    match object["metadata"]["resourceVersion"].as_str() {
        None | Some("") if require_rv => {
            return invalid(
                name,
                vec![(
                    "FieldValueInvalid".into(),
                    "Invalid value: 0x0: must be specified for an update".into(),
                    "metadata.resourceVersion".into(),
                )],
            )
            .into()
        }
        Some(rv) if rv != current["metadata"]["resourceVersion"] => return conflict(name).into(),
        _ => {}
    }
    let mut new = if route.status {
        // Only status changes through /status.
        let mut new = current.clone();
        new["status"] = object.get("status").cloned().unwrap_or(Value::Null);
        if new["status"].is_null() {
            if let Some(m) = new.as_object_mut() {
                m.remove("status");
            }
        }
        new
    } else {
        // The main resource keeps status and the server-owned metadata.
        let mut new = object;
        match current.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        for key in [
            "uid",
            "creationTimestamp",
            "namespace",
            "name",
            "generation",
        ] {
            new["metadata"][key] = current["metadata"][key].clone();
        }
        if new.get("spec") != current.get("spec") {
            let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
            new["metadata"]["generation"] = json!(generation + 1);
        }
        new
    };
    let errors = validation_errors(&new);
    if !errors.is_empty() {
        return invalid(name, errors).into();
    }
    new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    if new == current || dry_run {
        return full(StatusCode::OK, &new);
    }
    let stored = Gateways::commit(&mut inner, &store.changes, "MODIFIED", new);
    full(StatusCode::OK, &stored)
}

fn delete(store: &Gateways, route: &Route, name: &str, dry_run: bool) -> Response<Body> {
    let mut inner = store.lock();
    let Some(current) = inner.objects.get(&route.key(name)).cloned() else {
        return not_found(name).into();
    };
    let uid = current["metadata"]["uid"].clone();
    if !dry_run {
        Gateways::commit(&mut inner, &store.changes, "DELETED", current);
    }
    full(
        StatusCode::OK,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": GROUP, "kind": RESOURCE, "uid": uid}}),
    )
}

fn watch_gateways(store: &Gateways, route: &Route, q: &HashMap<String, String>) -> Response<Body> {
    let sel = match selector(q) {
        Ok(s) => s,
        Err(e) => return e.into(),
    };
    let from = q
        .get("resourceVersion")
        .filter(|v| !v.is_empty() && *v != "0");
    let from = match from.map(|v| v.parse::<u64>()) {
        None => None,
        Some(Ok(rv)) => Some(rv),
        Some(Err(_)) => return bad_request("resourceVersion must be a number").into(),
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(std::time::Duration::from_secs);
    // Snapshot and subscription under one lock: nothing is missed or repeated.
    let (initial, mut live, expired) = {
        let inner = store.lock();
        let live = store.changes.subscribe();
        match from {
            None => {
                let initial: Vec<Change> = inner
                    .objects
                    .values()
                    .map(|o| Change {
                        rv: 0,
                        kind: "ADDED",
                        object: o.clone(),
                    })
                    .collect();
                (initial, live, false)
            }
            Some(rv) => {
                let oldest = inner.history.front().map_or(inner.rv, |c| c.rv);
                let expired = rv + 1 < oldest && rv < inner.rv;
                let replay = inner
                    .history
                    .iter()
                    .filter(|c| c.rv > rv)
                    .cloned()
                    .collect();
                (replay, live, expired)
            }
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    let scope = Route {
        namespace: route.namespace.clone(),
        name: None,
        status: false,
    };
    tokio::spawn(async move {
        let line = |kind: &str, object: &Value| {
            Ok(Frame::data(Bytes::from(format!(
                "{}\n",
                json!({"type": kind, "object": object})
            ))))
        };
        if expired {
            let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "too old resource version", "reason": "Expired", "code": 410});
            let _ = tx.send(line("ERROR", &status)).await;
            return;
        }
        for change in initial.iter().filter(|c| in_scope(&scope, &sel, &c.object)) {
            if tx.send(line(change.kind, &change.object)).await.is_err() {
                return;
            }
        }
        let last_sent = initial.last().map_or(0, |c| c.rv);
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            let next = async {
                match deadline {
                    Some(d) => tokio::time::timeout_at(d, live.recv()).await.ok(),
                    None => Some(live.recv().await),
                }
            };
            match next.await {
                Some(Ok(change))
                    if change.rv > last_sent && in_scope(&scope, &sel, &change.object) =>
                {
                    if tx.send(line(change.kind, &change.object)).await.is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                // A watcher that fell behind must relist, as kube's would.
                Some(Err(broadcast::error::RecvError::Lagged(_))) => {
                    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "too old resource version", "reason": "Expired", "code": 410});
                    let _ = tx.send(line("ERROR", &status)).await;
                    return;
                }
                Some(Err(broadcast::error::RecvError::Closed)) | None => return,
            }
        }
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut response = Response::new(BodyExt::boxed(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_outside_1_to_65535_are_invalid() {
        for (port, field_error) in [
            (json!(1), None),
            (json!(65535), None),
            (
                json!(0),
                Some("Invalid value: 0: must be between 1 and 65535, inclusive"),
            ),
            (
                json!(70000),
                Some("Invalid value: 70000: must be between 1 and 65535, inclusive"),
            ),
            (
                json!("80"),
                Some("Invalid value: \"80\": must be between 1 and 65535, inclusive"),
            ),
            (Value::Null, Some("Required value")),
        ] {
            let errors = validation_errors(&json!({"spec": {"port": port}}));
            let got = errors.first().map(|(_, m, f)| {
                assert_eq!(f, "spec.port");
                m.as_str()
            });
            assert_eq!(got, field_error, "{port}");
        }
    }
}
