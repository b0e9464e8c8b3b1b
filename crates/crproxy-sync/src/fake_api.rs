//! A Kubernetes API server for one unit test: each answer comes from a plain
//! function of the request, and every request is recorded, so a test can check what
//! a reconcile or a write-through sent without a cluster (the end-to-end tests with
//! devclusters live in the crproxy crate).

use crproxy_core::locks;
use crproxy_core::status::status;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

/// How a [`FakeApi`] answers: code and JSON body for a method, path and request
/// body. A closure may count what it was sent, for a host whose answers change
/// as the test goes (a delete that conflicts until the third attempt, say).
pub trait Answer: Fn(&Method, &str, &Value) -> (u16, Value) + Send + Sync + 'static {}

impl<F> Answer for F where F: Fn(&Method, &str, &Value) -> (u16, Value) + Send + Sync + 'static {}

/// An [`Answer`] that keeps no state: a plain function, for tables of cases.
pub type AnswerFn = fn(&Method, &str, &Value) -> (u16, Value);

/// The code of an [`Answer`] that is none: the connection is closed once the
/// request has been read, as by a server that went away while handling it.
pub const HANG_UP: u16 = 0;

/// The code of an [`Answer`] that comes too late: the connection stays open and
/// silent for a minute, past any deadline of a test.
pub const STALL: u16 = 1;

/// One request a [`FakeApi`] received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: Method,
    pub path: String,
    pub body: Value,
}

pub struct FakeApi {
    /// A client with kube-rs's default retries (of 429, 503 and 504 answers).
    pub client: kube::Client,
    addr: std::net::SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
}

impl FakeApi {
    /// Listens on 127.0.0.1 until the test's runtime ends (at most a few connections,
    /// each accepted within 30 s).
    pub async fn start(answer: impl Answer) -> FakeApi {
        let answer = Arc::new(answer);
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let received = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&received);
        tokio::spawn(async move {
            for _ in 0..16 {
                let accepted =
                    tokio::time::timeout(Duration::from_secs(30), listener.accept()).await;
                let Ok(Ok((socket, _))) = accepted else { break };
                let seen = Arc::clone(&seen);
                let answer = Arc::clone(&answer);
                let service =
                    hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                        let seen = Arc::clone(&seen);
                        let answer = Arc::clone(&answer);
                        async move {
                            let method = request.method().clone();
                            let path = request.uri().path().to_owned();
                            let body = request
                                .into_body()
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                            let (code, answer) = answer(&method, &path, &body);
                            locks::lock(&seen).push(Received { method, path, body });
                            if code == STALL {
                                tokio::time::sleep(Duration::from_secs(60)).await;
                            }
                            if code == HANG_UP {
                                // hyper closes a connection whose service fails,
                                // without an answer.
                                return Err(std::io::Error::other("hanging up"));
                            }
                            let mut response =
                                Response::new(Full::new(Bytes::from(answer.to_string())));
                            *response.status_mut() = StatusCode::from_u16(code)
                                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                            response.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static("application/json"),
                            );
                            Ok::<_, std::io::Error>(response)
                        }
                    });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(socket), service),
                );
            }
        });
        let config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
        FakeApi {
            client: kube::Client::try_from(config).expect("client"),
            addr,
            received,
        }
    }

    /// A client without retries, as write-through's host client is: the host's
    /// 503 or 504 comes back at once.
    pub fn client_without_retries(&self) -> kube::Client {
        let mut config = kube::Config::new(format!("http://{}", self.addr).parse().expect("url"));
        config.default_retry = false;
        kube::Client::try_from(config).expect("client")
    }

    /// Every request so far, in order.
    pub fn received(&self) -> Vec<Received> {
        locks::lock(&self.received).clone()
    }

    /// The requests so far with `method`.
    pub fn with_method(&self, method: Method) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.method == method)
            .collect()
    }
}

/// A 404 Status.
pub fn not_found() -> (u16, Value) {
    (404, status(404, "NotFound", "not found"))
}

/// A 200 Status, as a delete answers.
pub fn success() -> (u16, Value) {
    (
        200,
        json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success", "code": 200}),
    )
}

/// An API server that refuses connections (nothing listens on 127.0.0.1:1).
pub fn unreachable_api() -> kube::Client {
    let config = kube::Config::new("http://127.0.0.1:1".parse().expect("url"));
    kube::Client::try_from(config).expect("client")
}

/// An API server that accepts connections and never answers; the listener task
/// holds the sockets (at most a few) until the test's runtime ends.
pub async fn silent_api() -> kube::Client {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let mut held = Vec::new();
        for _ in 0..8 {
            match tokio::time::timeout(Duration::from_secs(30), listener.accept()).await {
                Ok(Ok((socket, _))) => held.push(socket),
                _ => break,
            }
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
    let config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
    kube::Client::try_from(config).expect("client")
}

/// The toHost type most unit tests sync: `gateways.example.net/v1`, namespaced.
pub fn gateways_resource() -> crproxy_core::config::sync::SyncResource {
    use crproxy_core::config::sync::{Direction, Scope, SyncResource};
    SyncResource {
        direction: Direction::ToHost,
        key: "gateways.example.net/v1".into(),
        plural: "gateways".into(),
        group: "example.net".into(),
        version: Some("v1".into()),
        scope: Scope::Namespaced,
        patches: vec![],
        mappings: vec![],
    }
}

/// [`gateways_resource`] resolved, served by the host's extension API server
/// (`aggregated`) or not.
pub fn gateways_type(aggregated: bool) -> crate::crd::ResolvedType {
    crate::crd::ResolvedType {
        resource: gateways_resource(),
        api: kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("example.net", "v1", "Gateway"),
            "gateways",
        ),
        status_subresource: true,
        aggregated,
    }
}
