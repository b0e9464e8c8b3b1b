//! The one place a cluster identity becomes a kube-rs [`kube::Client`]: for the
//! control plane (registration, the Lease, the client-side watches, the sync), with
//! the same credentials, TLS and rotation as the data path.
//!
//! kube-rs reads kubeconfigs itself, but it keeps a client certificate for the life of
//! the client and knows nothing of crproxy's [`Credentials`]. Building the client from
//! a plain tower service keeps a single credential provider per identity: the service
//! asks [`Credentials::authorization`] before each request and dials with the
//! connector whose TLS handshakes present the current client certificate.

use crate::cluster::ClusterConfig;
use crate::connector::Connector;
use crate::credentials::Credentials;
use crate::error::from_client_error;
use crate::read_timeout::ReadTimeoutLayer;
use crate::stand_ins;
use crate::{Error, DEFAULT_CONNECT_TIMEOUT, USER_AGENT_VALUE};
use http::header::{HeaderValue, AUTHORIZATION, USER_AGENT};
use http::{Request, StatusCode, Uri};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::Arc;
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One cluster as one identity: its configuration and the one credential provider
/// that every client and pool of that identity shares, so that a token file is
/// read, a certificate reloaded and an exec plugin run once for all of them.
#[derive(Clone)]
pub struct ClusterAccess {
    pub cluster: ClusterConfig,
    pub credentials: Arc<Credentials>,
}

impl ClusterAccess {
    pub fn new(cluster: ClusterConfig) -> Result<ClusterAccess, Error> {
        let credentials = cluster.credentials()?;
        Ok(ClusterAccess {
            cluster,
            credentials,
        })
    }

    /// [`kube_client`] for this identity, `default` as its default namespace.
    pub fn kube_client(&self) -> Result<kube::Client, Error> {
        kube_client(&self.cluster, Arc::clone(&self.credentials), "default")
    }

    /// [`kube_client_without_retries`] for this identity, `default` as its default
    /// namespace.
    pub fn kube_client_without_retries(&self) -> Result<kube::Client, Error> {
        kube_client_without_retries(&self.cluster, Arc::clone(&self.credentials), "default")
    }
}

/// A kube-rs client for `config` that authenticates with `credentials` and uses
/// `default_namespace` for namespaced APIs built without one. Like kube-rs's own
/// clients, it retries 429, 503 and 504 answers with backoff. Does not contact the
/// server.
pub fn kube_client(
    config: &ClusterConfig,
    credentials: Arc<Credentials>,
    default_namespace: &str,
) -> Result<kube::Client, Error> {
    build(config, credentials, default_namespace, true, None)
}

/// [`kube_client`] without the retries: for callers that hand the server's answer
/// on at once (write-through answers inside a webhook timeout).
pub fn kube_client_without_retries(
    config: &ClusterConfig,
    credentials: Arc<Credentials>,
    default_namespace: &str,
) -> Result<kube::Client, Error> {
    build(config, credentials, default_namespace, false, None)
}

/// [`kube_client`] whose responses fail with [`Error::Timeout`] when their head or
/// the next piece of their body takes longer than `read_timeout` (see
/// [`crate::ReadTimeoutLayer`]): for watches that must notice a connection that
/// stalled without closing. `read_timeout` must exceed the server-side lifetime of
/// every watch made with the client.
pub fn kube_client_with_read_timeout(
    config: &ClusterConfig,
    credentials: Arc<Credentials>,
    default_namespace: &str,
    read_timeout: Duration,
) -> Result<kube::Client, Error> {
    build(
        config,
        credentials,
        default_namespace,
        true,
        Some(read_timeout),
    )
}

fn build(
    config: &ClusterConfig,
    credentials: Arc<Credentials>,
    default_namespace: &str,
    retry: bool,
    read_timeout: Option<Duration>,
) -> Result<kube::Client, Error> {
    let tls = config.rustls_config(&[b"h2", b"http/1.1"], &credentials)?;
    let connector = Connector::new(
        Arc::new(tls),
        config.server_name()?,
        DEFAULT_CONNECT_TIMEOUT,
    );
    let http: HyperClient<Connector, kube::client::Body> =
        HyperClient::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            // As crate::Client: pings find connections that died silently under a
            // long watch.
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(Duration::from_secs(30))
            .http2_keep_alive_timeout(Duration::from_secs(10))
            .http2_keep_alive_while_idle(true)
            .build(connector);
    let base: Arc<str> = config.server.as_str().trim_end_matches('/').into();
    let service = tower::service_fn(move |request: Request<kube::client::Body>| {
        let http = http.clone();
        let credentials = Arc::clone(&credentials);
        let base = Arc::clone(&base);
        async move {
            let (mut parts, body) = request.into_parts();
            // kube-rs sends the path and query; the server (with any path prefix)
            // goes in front.
            let path_and_query = parts
                .uri
                .path_and_query()
                .map_or("/", |pq| pq.as_str())
                .to_owned();
            parts.uri = format!("{base}{path_and_query}")
                .parse::<Uri>()
                .map_err(|e| Error::Transport(format!("invalid request path: {e}")))?;
            if !parts.headers.contains_key(AUTHORIZATION) {
                if let Some(value) = credentials.authorization().await? {
                    parts.headers.insert(AUTHORIZATION, value);
                }
            }
            let sent_authorization = parts.headers.get(AUTHORIZATION).cloned();
            let method = parts.method.clone();
            parts
                .headers
                .entry(USER_AGENT)
                .or_insert(HeaderValue::from_static(USER_AGENT_VALUE));
            let response = http
                .request(Request::from_parts(parts, body))
                .await
                .map_err(|e| from_client_error(&e))?;
            if response.status() == StatusCode::UNAUTHORIZED {
                credentials.invalidate(sent_authorization.as_ref()).await;
            }
            Ok::<_, BoxError>(stand_ins::guard(&method, &path_and_query, response))
        }
    });
    let retries = retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    // The read timeout sits under the retries, so a retried request gets a fresh one.
    let client = match read_timeout {
        Some(limit) => kube::Client::new(
            tower::ServiceBuilder::new()
                .option_layer(retries)
                .layer(ReadTimeoutLayer::new(limit))
                .service(service),
            default_namespace,
        ),
        None => kube::Client::new(
            tower::ServiceBuilder::new()
                .option_layer(retries)
                .service(service),
            default_namespace,
        ),
    };
    Ok(client)
}

/// The `reason` kube-rs gives the `Status` it makes up for an error response whose
/// body is not a `Status`, with the body as the message.
const NOT_A_STATUS: &str = "Failed to parse error data";

/// A kube-rs error as this crate's [`Error`], so code moving to kube-rs keeps its
/// error handling (`is_not_found`, `is_conflict`, ...). Failures of the transport
/// underneath come back as the typed errors the service produced.
impl From<kube::Error> for Error {
    fn from(err: kube::Error) -> Error {
        match err {
            // kube-rs's marker for an error body that is not a Status (an
            // aggregator's plain-text 503, a proxy's HTML page): read it as
            // `Error::from_response` reads such a body, so the text is the same.
            kube::Error::Api(status) if status.reason == NOT_A_STATUS => {
                Error::from_response(status.code, status.message.as_bytes())
            }
            kube::Error::Api(status) => Error::Api {
                status: status.code,
                reason: status.reason.clone(),
                message: status.message.clone(),
                body: serde_json::to_value(&*status).unwrap_or(serde_json::Value::Null),
            },
            // A watch stream's body failing (the read timeout, a reset): kube-rs
            // wraps the error the service produced in an io::Error; unwrap it so a
            // stalled watch reads as the Timeout it is.
            kube::Error::ReadEvents(io) if io.get_ref().is_some_and(|e| e.is::<kube::Error>()) => {
                match io.into_inner().map(|e| e.downcast::<kube::Error>()) {
                    Some(Ok(inner)) => Error::from(*inner),
                    Some(Err(other)) => Error::Transport(crate::error::chain(other.as_ref())),
                    None => Error::Transport("reading a watch failed".to_owned()),
                }
            }
            kube::Error::Service(source) => match source.downcast::<Error>() {
                Ok(ours) => *ours,
                Err(other) => Error::Transport(crate::error::chain(other.as_ref())),
            },
            kube::Error::SerdeError(e) => Error::Decode(e.to_string()),
            other => Error::Transport(crate::error::chain(&other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_that_is_not_a_status_reads_as_before() {
        // What kube-rs makes of an aggregator's plain-text 503.
        let made_up = kube::core::Status::failure("service unavailable\n", NOT_A_STATUS)
            .with_code(503)
            .boxed();
        let err = Error::from(kube::Error::Api(made_up));
        assert_eq!(err.status(), Some(503));
        assert_eq!(err.reason(), Some("ServiceUnavailable"));
        assert_eq!(
            err.to_string(),
            Error::from_response(503, b"service unavailable\n").to_string()
        );
    }

    #[test]
    fn a_watch_body_error_keeps_its_type() {
        // What kube-rs makes of the read timeout failing a watch's body.
        let ours = Error::Timeout("nothing read from the response for 1s".to_owned());
        let read_events =
            kube::Error::ReadEvents(std::io::Error::other(kube::Error::Service(Box::new(ours))));
        let err = Error::from(read_events);
        assert!(matches!(err, Error::Timeout(_)), "{err:?}");
        let plain = kube::Error::ReadEvents(std::io::Error::other("connection reset"));
        assert!(
            matches!(Error::from(plain), Error::Transport(ref t) if t.contains("connection reset"))
        );
    }

    #[test]
    fn a_status_keeps_its_reason_and_message() {
        let status = kube::core::Status::failure("widgets \"a\" not found", "NotFound")
            .with_code(404)
            .boxed();
        let err = Error::from(kube::Error::Api(status));
        assert!(err.is_not_found());
        assert_eq!(
            err.to_string(),
            "the API server answered 404 NotFound: widgets \"a\" not found"
        );
    }
}
