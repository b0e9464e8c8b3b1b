//! An in-memory, HTTPS, kube-apiserver-shaped object store for tests (feature `fake`).
//!
//! It is not devcluster: no schemas, no admission, no discovery. It stores any JSON
//! object under its path, assigns `resourceVersion`s from one counter, enforces
//! optimistic concurrency on PUT (409 Conflict), refuses duplicate creates (409
//! AlreadyExists), answers 404 with kube-shaped `Status` bodies, and streams watch
//! events. That is enough to test clients of the API (leader election, registration,
//! ConfigMap readers, EndpointSlice watchers) over real TLS sockets without a cluster.

use crate::{Auth, Client, ClusterConfig};
use bytes::Bytes;
use crproxy_core::pki::CertificateAuthority;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

type Body = BoxBody<Bytes, Infallible>;

/// The bearer token the fake accepts.
pub const FAKE_TOKEN: &str = "fake-token";

/// Where an object lives: API prefix (`api/v1`, `apis/g/v`), namespace, resource, name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    prefix: String,
    namespace: Option<String>,
    resource: String,
    name: String,
}

/// A parsed request path.
#[derive(Debug)]
struct Target {
    prefix: String,
    namespace: Option<String>,
    resource: String,
    name: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (prefix, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => (format!("api/{v}"), rest),
        ["apis", g, v, rest @ ..] => (format!("apis/{g}/{v}"), rest),
        _ => return None,
    };
    match rest {
        ["namespaces", ns, resource, tail @ ..] => Some(Target {
            prefix,
            namespace: Some((*ns).to_owned()),
            resource: (*resource).to_owned(),
            name: tail.first().map(|s| (*s).to_owned()),
        }),
        [resource, tail @ ..] => Some(Target {
            prefix,
            namespace: None,
            resource: (*resource).to_owned(),
            name: tail.first().map(|s| (*s).to_owned()),
        }),
        [] => None,
    }
}

#[derive(Clone, Debug)]
struct Event {
    rv: u64,
    key: Key,
    event_type: &'static str,
    object: Value,
}

/// Events kept for watches that start from a resourceVersion; older ones are answered
/// with 410 Expired, as etcd compaction makes kube-apiserver do.
const HISTORY: usize = 10_000;

#[derive(Default)]
struct State {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    log: Vec<String>,
    unavailable: bool,
    history: std::collections::VecDeque<Event>,
}

impl State {
    /// Records and publishes an event for `object` (whose resourceVersion is current).
    fn emit(
        &mut self,
        events: &broadcast::Sender<Event>,
        key: Key,
        event_type: &'static str,
        object: Value,
    ) {
        let ev = Event {
            rv: self.rv,
            key,
            event_type,
            object,
        };
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(ev.clone());
        let _ = events.send(ev);
    }
}

/// A running fake API server; stops when dropped.
pub struct FakeApiServer {
    addr: SocketAddr,
    ca_pem: String,
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<Event>,
    task: JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panicking test thread must not hide the state from the rest of the test.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl FakeApiServer {
    /// Starts the server on 127.0.0.1 with a fresh CA.
    pub async fn start() -> Result<FakeApiServer, Box<dyn std::error::Error + Send + Sync>> {
        let ca = CertificateAuthority::generate("fake-apiserver-ca")?;
        let serving = ca.issue_server(&["localhost"], &["127.0.0.1".parse()?])?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(serving.cert.as_bytes())?],
                PrivateKeyDer::from_pem_slice(serving.key.as_bytes())?,
            )?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let (events, _) = broadcast::channel(1024);
        let (st, ev) = (state.clone(), events.clone());
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, st, ev) = (acceptor.clone(), st.clone(), ev.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(move |req| {
                        let (st, ev) = (st.clone(), ev.clone());
                        async move { Ok::<_, Infallible>(handle(req, &st, &ev).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        Ok(FakeApiServer {
            addr,
            ca_pem: ca.pem().cert.clone(),
            state,
            events,
            task,
        })
    }

    /// A config that trusts the fake's CA and authenticates with [`FAKE_TOKEN`].
    pub fn config(&self) -> ClusterConfig {
        // A SocketAddr always renders as a valid URL authority.
        let server = match url::Url::parse(&format!("https://{}", self.addr)) {
            Ok(u) => u,
            Err(e) => panic!("fake API server URL: {e}"),
        };
        let mut cfg = ClusterConfig::new(server);
        cfg.ca_pem = Some(self.ca_pem.clone().into_bytes());
        cfg.auth = Auth::Token(FAKE_TOKEN.to_owned());
        cfg
    }

    /// A client for this server.
    pub fn client(&self) -> Client {
        // Building a client from our own well-formed config cannot fail; if it somehow
        // did, the test using it fails on its first request instead.
        match Client::new(self.config()) {
            Ok(c) => c,
            Err(e) => panic!("fake API client: {e}"),
        }
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stores `object` at `path` (collection path, name from `metadata.name`) as if
    /// created, emitting an ADDED event. Returns the stored object.
    pub fn insert(&self, collection_path: &str, object: Value) -> Option<Value> {
        let t = parse_path(collection_path)?;
        let name = object["metadata"]["name"].as_str()?.to_owned();
        let key = Key {
            prefix: t.prefix,
            namespace: t.namespace,
            resource: t.resource,
            name,
        };
        let mut st = lock(&self.state);
        let stored = store(&mut st, &key, object);
        st.emit(&self.events, key, "ADDED", stored.clone());
        Some(stored)
    }

    /// The object at `path`, if any.
    pub fn object(&self, path: &str) -> Option<Value> {
        let t = parse_path(path)?;
        let key = Key {
            prefix: t.prefix,
            namespace: t.namespace,
            resource: t.resource,
            name: t.name?,
        };
        lock(&self.state).objects.get(&key).cloned()
    }

    /// Every request so far as `METHOD path?query`.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.state).log.clone()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        lock(&self.state).log.clear();
    }

    /// While set, every request is answered 503.
    pub fn set_unavailable(&self, unavailable: bool) {
        lock(&self.state).unavailable = unavailable;
    }
}

fn store(st: &mut State, key: &Key, mut object: Value) -> Value {
    st.rv += 1;
    let rv = st.rv;
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    let meta = &mut object["metadata"];
    meta["resourceVersion"] = json!(rv.to_string());
    meta["name"] = json!(key.name);
    if let Some(ns) = &key.namespace {
        meta["namespace"] = json!(ns);
    }
    if meta.get("uid").is_none() {
        meta["uid"] = json!(format!("uid-{rv}"));
    }
    if meta.get("creationTimestamp").is_none() {
        meta["creationTimestamp"] = json!("2024-01-01T00:00:00Z");
    }
    st.objects.insert(key.clone(), object.clone());
    object
}

fn qualified(t_prefix: &str, resource: &str) -> String {
    match t_prefix.split('/').collect::<Vec<_>>().as_slice() {
        ["apis", g, _] => format!("{resource}.{g}"),
        _ => resource.to_owned(),
    }
}

async fn handle(
    req: Request<Incoming>,
    state: &Mutex<State>,
    events: &broadcast::Sender<Event>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().unwrap_or("").to_owned();
    {
        let mut st = lock(state);
        st.log.push(match query.is_empty() {
            true => format!("{} {}", parts.method, path),
            false => format!("{} {}?{}", parts.method, path, query),
        });
        if st.unavailable {
            return status(
                503,
                "ServiceUnavailable",
                "the fake API server is unavailable",
            );
        }
    }
    let authorized = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {FAKE_TOKEN}"));
    if !authorized {
        return status(401, "Unauthorized", "Unauthorized");
    }
    let Some(t) = parse_path(&path) else {
        return status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
    };
    let kind = qualified(&t.prefix, &t.resource);
    let params = Params::parse(&query);
    let selector = match Selector::parse(params.label_selector.as_deref().unwrap_or("")) {
        Ok(sel) => sel,
        Err(msg) => return status(400, "BadRequest", &msg),
    };
    match (parts.method.clone(), t.name.clone()) {
        (Method::GET, None) if params.watch => {
            watch(t, selector, params.resource_version, state, events)
        }
        (Method::GET, None) => {
            let st = lock(state);
            let items: Vec<Value> = st
                .objects
                .iter()
                .filter(|(k, v)| in_collection(k, &t) && selector.matches(v))
                .map(|(_, v)| v.clone())
                .collect();
            ok(
                200,
                json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}),
            )
        }
        (Method::GET, Some(name)) => {
            let key = key_of(&t, name.clone());
            match lock(state).objects.get(&key) {
                Some(v) => ok(200, v.clone()),
                None => not_found(&kind, &name),
            }
        }
        (Method::POST, None) => {
            let Ok(obj) = serde_json::from_slice::<Value>(&body) else {
                return status(400, "BadRequest", "the body is not JSON");
            };
            let Some(name) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
                return status(422, "Invalid", "metadata.name: Required value");
            };
            let key = key_of(&t, name.clone());
            let mut st = lock(state);
            if st.objects.contains_key(&key) {
                return status(
                    409,
                    "AlreadyExists",
                    &format!("{kind} \"{name}\" already exists"),
                );
            }
            let stored = store(&mut st, &key, obj);
            st.emit(events, key, "ADDED", stored.clone());
            ok(201, stored)
        }
        (Method::PUT, Some(name)) => {
            let Ok(obj) = serde_json::from_slice::<Value>(&body) else {
                return status(400, "BadRequest", "the body is not JSON");
            };
            let key = key_of(&t, name.clone());
            let mut st = lock(state);
            let Some(current) = st.objects.get(&key) else {
                return not_found(&kind, &name);
            };
            let sent_rv = obj["metadata"]["resourceVersion"].as_str().unwrap_or("");
            if !sent_rv.is_empty()
                && Some(sent_rv) != current["metadata"]["resourceVersion"].as_str()
            {
                return status(
                    409,
                    "Conflict",
                    &format!("Operation cannot be fulfilled on {kind} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
                );
            }
            let mut obj = obj;
            for keep in ["uid", "creationTimestamp"] {
                obj["metadata"][keep] = current["metadata"][keep].clone();
            }
            let stored = store(&mut st, &key, obj);
            st.emit(events, key, "MODIFIED", stored.clone());
            ok(200, stored)
        }
        (Method::DELETE, Some(name)) => {
            let key = key_of(&t, name.clone());
            let mut st = lock(state);
            match st.objects.remove(&key) {
                Some(mut obj) => {
                    // A deletion is a write: it gets its own resourceVersion.
                    st.rv += 1;
                    obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
                    st.emit(events, key, "DELETED", obj.clone());
                    ok(200, obj)
                }
                None => not_found(&kind, &name),
            }
        }
        _ => status(
            405,
            "MethodNotAllowed",
            "the fake API server does not support this request",
        ),
    }
}

fn key_of(t: &Target, name: String) -> Key {
    Key {
        prefix: t.prefix.clone(),
        namespace: t.namespace.clone(),
        resource: t.resource.clone(),
        name,
    }
}

/// A collection path without a namespace covers all namespaces, as in kube.
fn in_collection(k: &Key, t: &Target) -> bool {
    k.prefix == t.prefix
        && k.resource == t.resource
        && (t.namespace.is_none() || k.namespace == t.namespace)
}

fn watch(
    t: Target,
    selector: Selector,
    from_rv: Option<u64>,
    state: &Mutex<State>,
    events: &broadcast::Sender<Event>,
) -> Response<Body> {
    // Subscribe before reading the state so nothing falls in between; duplicates
    // between the replay and the live feed are dropped by resourceVersion.
    let rx = events.subscribe();
    let st = lock(state);
    let replay: Vec<(u64, Bytes)> = match from_rv {
        // No (or "0") resourceVersion: the current objects as ADDED, as kube does.
        None | Some(0) => st
            .objects
            .iter()
            .filter(|(k, v)| in_collection(k, &t) && selector.matches(v))
            .map(|(_, v)| (st.rv, line("ADDED", v)))
            .collect(),
        Some(rv) => {
            let oldest = st.history.front().map(|e| e.rv).unwrap_or(st.rv + 1);
            if st.history.len() == HISTORY && rv < oldest {
                let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": format!("too old resource version: {rv} ({})", oldest - 1), "reason": "Expired", "code": 410});
                vec![(st.rv, line("ERROR", &status))]
            } else {
                st.history
                    .iter()
                    .filter(|e| {
                        e.rv > rv && in_collection(&e.key, &t) && selector.matches(&e.object)
                    })
                    .map(|e| (e.rv, line(e.event_type, &e.object)))
                    .collect()
            }
        }
    };
    let seen = st.rv;
    drop(st);
    let replay = futures_util::stream::iter(replay.into_iter().map(|(_, b)| Ok(Frame::data(b))));
    let live =
        futures_util::stream::unfold((rx, t, selector), move |(mut rx, t, selector)| async move {
            loop {
                match rx.recv().await {
                    Ok(ev)
                        if ev.rv > seen
                            && in_collection(&ev.key, &t)
                            && selector.matches(&ev.object) =>
                    {
                        return Some((
                            Ok(Frame::data(line(ev.event_type, &ev.object))),
                            (rx, t, selector),
                        ))
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
    use futures_util::StreamExt as _;
    Response::builder()
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(BodyExt::boxed(StreamBody::new(replay.chain(live))))
        .unwrap_or_else(|_| Response::new(empty()))
}

/// The query parameters the fake honours.
#[derive(Default)]
struct Params {
    watch: bool,
    resource_version: Option<u64>,
    label_selector: Option<String>,
}

impl Params {
    fn parse(query: &str) -> Params {
        let mut p = Params::default();
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let v = percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned();
            match k {
                "watch" => p.watch = v == "true" || v == "1",
                "resourceVersion" => p.resource_version = v.parse().ok(),
                "labelSelector" => p.label_selector = Some(v),
                _ => {}
            }
        }
        p
    }
}

/// Equality-based label selectors: `k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated.
/// Set-based terms (`in`, `notin`) are refused with 400 rather than misread.
struct Selector(Vec<Term>);

enum Term {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
}

impl Selector {
    fn parse(s: &str) -> Result<Selector, String> {
        let mut terms = Vec::new();
        for raw in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if raw.contains(" in ") || raw.contains(" notin ") || raw.contains('(') {
                return Err(format!(
                    "the fake API server supports only equality-based selectors, not {raw:?}"
                ));
            }
            let term = if let Some((k, v)) = raw.split_once("!=") {
                Term::Ne(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = raw.split_once("==").or_else(|| raw.split_once('=')) {
                Term::Eq(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some(k) = raw.strip_prefix('!') {
                Term::Absent(k.trim().to_owned())
            } else {
                Term::Exists(raw.to_owned())
            };
            terms.push(term);
        }
        Ok(Selector(terms))
    }

    fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|t| match t {
            Term::Eq(k, v) => get(k) == Some(v.as_str()),
            Term::Ne(k, v) => get(k) != Some(v.as_str()),
            Term::Exists(k) => get(k).is_some(),
            Term::Absent(k) => get(k).is_none(),
        })
    }
}

fn line(event_type: &str, object: &Value) -> Bytes {
    let mut s = json!({"type": event_type, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

fn empty() -> Body {
    BodyExt::boxed(Full::new(Bytes::new()))
}

fn ok(code: u16, v: Value) -> Response<Body> {
    let mut resp = Response::new(BodyExt::boxed(Full::new(Bytes::from(v.to_string()))));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

fn not_found(kind: &str, name: &str) -> Response<Body> {
    status(404, "NotFound", &format!("{kind} \"{name}\" not found"))
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    ok(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}),
    )
}
