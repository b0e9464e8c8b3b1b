//! The HTTP client: JSON in, JSON out, plus a raw escape hatch and watch streams.

use crate::cluster::ClusterConfig;
use crate::connector::Connector;
use crate::credentials::Credentials;
use crate::error::chain;
use crate::watch::{LineDecoder, WatchEvent};
use crate::Error;
use bytes::Bytes;
use futures_util::Stream;
use http::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, USER_AGENT};
use http::{Method, Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// How long a non-watch request (including reading its body) may take by default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// `User-Agent` sent unless the request sets one, so API server audit logs name us.
pub const USER_AGENT_VALUE: &str = concat!("crproxy/", env!("CARGO_PKG_VERSION"));
/// How long TCP connect and the TLS handshake may each take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The kinds of PATCH kube-apiserver accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/strategic-merge-patch+json` (built-in types only).
    Strategic,
    /// Server-side apply, `application/apply-patch+yaml` (JSON is valid YAML).
    Apply { field_manager: String, force: bool },
}

impl PatchType {
    fn content_type(&self) -> &'static str {
        match self {
            PatchType::Merge => "application/merge-patch+json",
            PatchType::Json => "application/json-patch+json",
            PatchType::Strategic => "application/strategic-merge-patch+json",
            PatchType::Apply { .. } => "application/apply-patch+yaml",
        }
    }
}

/// A Kubernetes REST client for one API server. Cloning is cheap and clones share the
/// connection pool.
#[derive(Clone)]
pub struct Client {
    http: HyperClient<Connector, Full<Bytes>>,
    /// Server URL without a trailing slash; request paths are appended to it.
    base: Arc<str>,
    credentials: Arc<Credentials>,
    request_timeout: Option<Duration>,
    config: Arc<ClusterConfig>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.base)
            .finish()
    }
}

impl Client {
    /// A client for `config`. Does not contact the server.
    pub fn new(config: ClusterConfig) -> Result<Client, Error> {
        let credentials = config.credentials()?;
        Self::with_credentials(config, credentials)
    }

    /// A client for `config` that authenticates with `credentials` (shared with other
    /// clients or pools of the same identity, so a rotation is read once).
    pub fn with_credentials(
        config: ClusterConfig,
        credentials: Arc<Credentials>,
    ) -> Result<Client, Error> {
        let tls = config.rustls_config(&[b"h2", b"http/1.1"], &credentials)?;
        let connector = Connector::new(
            Arc::new(tls),
            config.server_name()?,
            DEFAULT_CONNECT_TIMEOUT,
        );
        let http = HyperClient::builder(TokioExecutor::new())
            // The idle timeout only takes effect with a pool timer.
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            // HTTP/2 pings find connections that died silently (a rebooted node, a
            // dropped NAT entry), which would otherwise hang a watch forever.
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(Duration::from_secs(30))
            .http2_keep_alive_timeout(Duration::from_secs(10))
            .http2_keep_alive_while_idle(true)
            .build(connector);
        let base: Arc<str> = config.server.as_str().trim_end_matches('/').into();
        Ok(Client {
            http,
            base,
            credentials,
            request_timeout: Some(DEFAULT_REQUEST_TIMEOUT),
            config: Arc::new(config),
        })
    }

    /// The same client with another timeout for non-watch requests (`None`: no limit).
    pub fn with_request_timeout(mut self, timeout: Option<Duration>) -> Client {
        self.request_timeout = timeout;
        self
    }

    /// The configuration this client was built from.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// The credentials this client authenticates with.
    pub fn credentials(&self) -> &Arc<Credentials> {
        &self.credentials
    }

    /// GET an object.
    pub async fn get(&self, path: &str) -> Result<Value, Error> {
        self.json(Method::GET, path, None).await
    }

    /// GET an object; `None` when it does not exist (404).
    pub async fn get_opt(&self, path: &str) -> Result<Option<Value>, Error> {
        match self.get(path).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// GET a list.
    pub async fn list(&self, path: &str) -> Result<Value, Error> {
        self.json(Method::GET, path, None).await
    }

    /// POST `body` to a collection path.
    pub async fn create(&self, path: &str, body: &Value) -> Result<Value, Error> {
        self.json(
            Method::POST,
            path,
            Some(("application/json", to_vec(body)?)),
        )
        .await
    }

    /// PUT `body` (which should carry `metadata.resourceVersion` for optimistic
    /// concurrency) to an object path.
    pub async fn replace(&self, path: &str, body: &Value) -> Result<Value, Error> {
        self.json(Method::PUT, path, Some(("application/json", to_vec(body)?)))
            .await
    }

    /// PATCH an object.
    pub async fn patch(&self, path: &str, patch: PatchType, body: &Value) -> Result<Value, Error> {
        let path = match &patch {
            PatchType::Apply {
                field_manager,
                force,
            } => {
                let fm = percent_encoding::utf8_percent_encode(
                    field_manager,
                    percent_encoding::NON_ALPHANUMERIC,
                );
                let mut p = with_query(path, &format!("fieldManager={fm}"));
                if *force {
                    p = with_query(&p, "force=true");
                }
                p
            }
            _ => path.to_owned(),
        };
        self.json(
            Method::PATCH,
            &path,
            Some((patch.content_type(), to_vec(body)?)),
        )
        .await
    }

    /// DELETE an object; returns the deleted object or a `Status`, as the server does.
    pub async fn delete(&self, path: &str) -> Result<Value, Error> {
        self.json(Method::DELETE, path, None).await
    }

    /// Sends a request as is, except that the URI's path and query are appended to the
    /// server URL, the `Authorization` header is set (unless present), and `Accept`
    /// defaults to JSON. Any status is returned, not turned into an error.
    pub async fn request(&self, req: Request<Bytes>) -> Result<Response<Bytes>, Error> {
        let fut = async {
            let resp = self.send(req).await?;
            let (parts, body) = resp.into_parts();
            let bytes = body
                .collect()
                .await
                .map_err(|e| Error::Transport(format!("reading the response body: {}", chain(&e))))?
                .to_bytes();
            Ok(Response::from_parts(parts, bytes))
        };
        match self.request_timeout {
            Some(t) => tokio::time::timeout(t, fut)
                .await
                .map_err(|_| Error::Timeout(format!("no complete response within {t:?}")))?,
            None => fut.await,
        }
    }

    /// Starts a watch and returns its events as they arrive. `watch=true` is added to
    /// the query unless a `watch` parameter is present. An `ERROR` event (such as 410
    /// Expired) is yielded as `Err(Error::Api { .. })`; the stream ends when the server
    /// closes it. The request has no timeout; put `timeoutSeconds` in the query to bound
    /// it server-side.
    pub async fn watch(
        &self,
        path_and_query: &str,
    ) -> Result<impl Stream<Item = Result<WatchEvent, Error>> + Send + 'static, Error> {
        let has_watch = path_and_query
            .split_once('?')
            .map(|(_, q)| {
                q.split('&')
                    .any(|kv| kv == "watch" || kv.starts_with("watch="))
            })
            .unwrap_or(false);
        let path = if has_watch {
            path_and_query.to_owned()
        } else {
            with_query(path_and_query, "watch=true")
        };
        let req = Request::get(path)
            .body(Bytes::new())
            .map_err(|e| Error::Transport(format!("invalid request: {e}")))?;
        let connect = self.send(req);
        let resp = match self.request_timeout {
            Some(t) => tokio::time::timeout(t, connect)
                .await
                .map_err(|_| Error::Timeout(format!("no response headers within {t:?}")))??,
            None => connect.await?,
        };
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err(Error::from_response(status, &body));
        }
        struct State {
            body: Incoming,
            decoder: LineDecoder,
            pending: VecDeque<Result<WatchEvent, Error>>,
            done: bool,
        }
        let state = State {
            body: resp.into_body(),
            decoder: LineDecoder::default(),
            pending: VecDeque::new(),
            done: false,
        };
        Ok(futures_util::stream::unfold(state, |mut st| async move {
            loop {
                if let Some(ev) = st.pending.pop_front() {
                    return Some((ev, st));
                }
                if st.done {
                    return None;
                }
                match st.body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            st.pending.extend(st.decoder.push(&data));
                        }
                    }
                    Some(Err(e)) => {
                        st.done = true;
                        st.pending.push_back(Err(Error::Transport(format!(
                            "watch stream broke: {}",
                            chain(&e)
                        ))));
                    }
                    None => {
                        st.done = true;
                        st.pending.extend(st.decoder.finish());
                    }
                }
            }
        }))
    }

    /// Builds the absolute request and sends it; the response body is not read.
    async fn send(&self, req: Request<Bytes>) -> Result<Response<Incoming>, Error> {
        let (mut parts, body) = req.into_parts();
        let pq = parts
            .uri
            .path_and_query()
            .map(|pq| pq.as_str())
            .unwrap_or("/");
        let pq = if pq.starts_with('/') {
            pq.to_owned()
        } else {
            format!("/{pq}")
        };
        parts.uri = format!("{}{}", self.base, pq)
            .parse::<Uri>()
            .map_err(|e| Error::Transport(format!("invalid request path {pq:?}: {e}")))?;
        if !parts.headers.contains_key(AUTHORIZATION) {
            if let Some(auth) = self.credentials.authorization().await? {
                parts.headers.insert(AUTHORIZATION, auth);
            }
        }
        let sent_authorization = parts.headers.get(AUTHORIZATION).cloned();
        parts
            .headers
            .entry(ACCEPT)
            .or_insert(HeaderValue::from_static("application/json"));
        parts
            .headers
            .entry(USER_AGENT)
            .or_insert(HeaderValue::from_static(USER_AGENT_VALUE));
        let req = Request::from_parts(parts, Full::new(body));
        let resp = self
            .http
            .request(req)
            .await
            .map_err(|e| crate::error::from_client_error(&e))?;
        if resp.status() == http::StatusCode::UNAUTHORIZED {
            // Read rotated files or run the plugin again for the next request.
            self.credentials
                .invalidate(sent_authorization.as_ref())
                .await;
        }
        Ok(resp)
    }

    async fn json(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, Vec<u8>)>,
    ) -> Result<Value, Error> {
        let mut builder = Request::builder().method(method).uri(path);
        let bytes = match body {
            Some((ct, b)) => {
                builder = builder.header(CONTENT_TYPE, ct);
                Bytes::from(b)
            }
            None => Bytes::new(),
        };
        let req = builder
            .body(bytes)
            .map_err(|e| Error::Transport(format!("invalid request for {path:?}: {e}")))?;
        let resp = self.request(req).await?;
        let status = resp.status();
        if !status.is_success() {
            return Err(Error::from_response(status.as_u16(), resp.body()));
        }
        if resp.body().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(resp.body())
            .map_err(|e| Error::Decode(format!("{path}: response is not JSON: {e}")))
    }
}

fn to_vec(v: &Value) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(v).map_err(|e| Error::Decode(format!("cannot encode the request body: {e}")))
}

/// Appends `kv` to the query of `path`.
fn with_query(path: &str, kv: &str) -> String {
    if path.contains('?') {
        format!("{path}&{kv}")
    } else {
        format!("{path}?{kv}")
    }
}
