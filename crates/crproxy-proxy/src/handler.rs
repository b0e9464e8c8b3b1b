//! One proxied request, top to bottom: who is calling → what is asked → the owned
//! mode's rules and namespace mirroring → the target → the response the caller sees
//! → metrics.
//!
//! Every path returns an [`Outcome`] (a response and the reason it is counted
//! under); [`GroupVersionProxy::handle`] records it once and wraps the body with the
//! deadline or watch accounting.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Namespace;
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crproxy_core::config::{AccessMode, ResourceSet};
use crproxy_core::ownership::{self, BodyType, Owner, Visibility};
use crproxy_core::precondition::{self, DeleteOptions, Pin, PinnedRequest, PreconditionError};
use crproxy_core::reason::Reason;
use crproxy_core::request::{self, RequestKind, ResourcePath, Verb};
use crproxy_core::request_body::{self, BodyError, CallerValue, WriteBody, MAX_REQUEST_BODY};
use crproxy_core::status;

use crate::fallback::{self, AggregatedAnswer};
use crate::frontproxy::{FrontProxyTrust, PeerCertificate};
use crate::metrics::TargetMetrics;
use crate::namespaces::{ClientNamespaces, NamespaceState};
use crate::not_found;
use crate::ownership_cache::{Lookup, OwnershipCache};
use crate::pool::ProxyBody;
use crate::served_openapi;
use crate::transport::{
    self, DeadlineBody, ForwardError, Inspected, TargetConnection, TargetPath, WatchBody,
    WatchFraming, MAX_BUFFERED_BODY, REQUEST_DEADLINE,
};
use crproxy_core::locks;

/// Everything one group/version server needs to serve requests.
pub struct GroupVersionProxy {
    pub group: String,
    pub version: String,
    /// `group/version`, the `group_version` metric label (shared with every
    /// request's metric labels, so counting one allocates nothing).
    pub group_version: Arc<str>,
    /// Configured resources, for the discovery fallback.
    pub resources: ResourceSet,
    pub access: AccessMode,
    /// The client, as the ownership labels name it.
    pub owner: Owner,
    /// `targetVirtualCluster.name`, as error messages name it.
    pub target_name: String,
    /// The target's placeholder host (`kube.<name>.<project>.vcluster.invalid:443`),
    /// as the startup log and every failed request's log line name it, so operators
    /// can match one string for the target.
    pub upstream: String,
    pub target: TargetConnection,
    pub metrics: TargetMetrics,
    /// The client cluster, for namespace existence checks; without retries, as the
    /// request's deadline bounds the check.
    pub client: kube::Client,
    /// The client's namespaces as a watch last saw them.
    pub client_namespaces: Arc<ClientNamespaces>,
    pub trust: Arc<FrontProxyTrust>,
    /// The target's last successful discovery answer, so the fallback can keep
    /// kinds and scopes.
    last_discovery: Mutex<Option<Value>>,
    /// Namespaces known to exist on the target; a miss costs one GET.
    target_namespaces: Mutex<HashSet<String>>,
    /// Places under [`MAX_IN_FLIGHT`].
    in_flight: Arc<Semaphore>,
    /// Bytes under [`PARSE_MEMORY_BUDGET`], one permit per byte.
    parse_budget: Arc<Semaphore>,
    /// Owned objects as a watch saw them, so most owned mutations skip the GET.
    ownership_cache: OwnershipCache,
}

/// Non-watch requests one group/version server works on at once (kube-apiserver's
/// default `--max-requests-inflight`). Past it a caller gets 429 with Retry-After,
/// as from kube's own limit, instead of queueing without bound. Watches are
/// long-running and exempt, as on kube.
pub const MAX_IN_FLIGHT: usize = 400;

/// Memory one group/version server may spend on reading write bodies at once, as
/// estimated by `request_body::admit`. A parsed document can take many times
/// its text (3 MiB of small numbers become some 50 MiB, and YAML aliases repeat
/// whole nodes), so such writes wait for room instead of all running at once;
/// ordinary bodies cost about their size.
/// A YAML document whose reading alone would take all of it is refused.
pub const PARSE_MEMORY_BUDGET: usize = request_body::MAX_EXPANDED_COST;

/// How many times a pinned mutation (owned mode's, and all mode's apply into a
/// namespace being deleted) is checked and sent: once, and once more when the
/// target refused it in a way the pin may have caused.
const PINNED_ATTEMPTS: u32 = 2;

/// What the ownership check of a named mutation found.
#[derive(PartialEq)]
enum Checked {
    /// Owned, in this state.
    Owned(Pin),
    /// Missing, and the request (server-side apply) may create it.
    Absent,
}

/// What a request ended with, and the reason it is counted under.
struct Outcome {
    response: Response<ProxyBody>,
    reason: Reason,
}

impl Outcome {
    fn new(response: Response<ProxyBody>, reason: Reason) -> Self {
        Self { response, reason }
    }
}

/// Per-request facts the flows share.
struct Exchange {
    method: Method,
    /// The raw path and query, still percent-encoded as the caller sent them.
    path_and_query: Option<PathAndQuery>,
    /// The namespace a write's path names, decoded (as mirroring keys it); `None`
    /// for a read (GET, and HEAD sent as GET), whose answer never changes what the
    /// proxy knows of the target's namespaces.
    namespace: Option<String>,
    headers: HeaderMap,
    deadline: Instant,
}

impl Exchange {
    fn path(&self) -> &str {
        self.path_and_query.as_ref().map_or("", PathAndQuery::path)
    }

    fn query(&self) -> Option<&str> {
        self.path_and_query.as_ref().and_then(PathAndQuery::query)
    }

    /// The caller's path and query for the target, without a `?` that
    /// introduces nothing. The caller's own is passed on as parsed when its
    /// request was read.
    fn target_path(&self) -> TargetPath<'_> {
        match &self.path_and_query {
            Some(parsed) if parsed.query() != Some("") => TargetPath::Caller(parsed),
            _ => TargetPath::Written(self.path()),
        }
    }
}

impl GroupVersionProxy {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        group: String,
        version: String,
        resources: ResourceSet,
        access: AccessMode,
        owner: Owner,
        target_name: String,
        upstream: String,
        target: TargetConnection,
        metrics: TargetMetrics,
        client: kube::Client,
        client_namespaces: Arc<ClientNamespaces>,
        trust: Arc<FrontProxyTrust>,
    ) -> Arc<Self> {
        let group_version: Arc<str> = Arc::from(format!("{group}/{version}"));
        let ownership_cache = OwnershipCache::new(&group, &version, owner.clone(), &target);
        Arc::new(Self {
            group,
            version,
            group_version,
            resources,
            access,
            owner,
            target_name,
            upstream,
            target,
            metrics,
            client,
            client_namespaces,
            trust,
            last_discovery: Mutex::new(None),
            target_namespaces: Mutex::new(HashSet::new()),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            parse_budget: Arc::new(Semaphore::new(PARSE_MEMORY_BUDGET)),
            ownership_cache,
        })
    }

    /// How many namespaces this server believes the target has (see
    /// `RunningProxy::known_target_namespaces`).
    pub fn known_target_namespaces(&self) -> usize {
        locks::lock(&self.target_namespaces).len()
    }

    /// Serves one request that arrived on a connection which presented the client
    /// certificate `peer` (if any).
    pub async fn handle(
        self: Arc<Self>,
        request: Request<hyper::body::Incoming>,
        peer: Option<Arc<PeerCertificate>>,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let (mut parts, body) = request.into_parts();
        // kube serves HEAD as GET (its request info and metrics read it as a get,
        // list or watch) and sends no body. The target is asked with GET, so an
        // owned object's answer is still read for its labels; the body is left
        // out only at the end.
        let head = parts.method == Method::HEAD;
        if head {
            parts.method = Method::GET;
        }
        let kind = request::classify(
            parts.method.as_str(),
            parts.uri.path(),
            parts.uri.query(),
            wants_upgrade(&parts.headers),
            &self.group,
            &self.version,
        );
        let verb_label = match &kind {
            Ok(RequestKind::Resource { verb, .. }) => verb.metric_label(),
            Ok(RequestKind::Upgrade) => "CONNECT",
            _ => method_label(&parts.method),
        };
        let is_watch = matches!(
            kind,
            Ok(RequestKind::Resource {
                verb: Verb::Watch,
                ..
            })
        );
        // Only authenticated callers take places under the in-flight limit, so
        // strangers on the port cannot crowd the aggregator out.
        let admitted = self.trust.admits(peer.as_deref(), &parts.headers);
        let permit = if is_watch || !admitted {
            None
        } else {
            match Arc::clone(&self.in_flight).try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => return without_body_if(head, self.too_many_requests(verb_label)),
            }
        };
        let inflight = (!is_watch).then(|| self.metrics.inflight());

        let namespace = match &kind {
            Ok(RequestKind::Resource { path, .. }) if parts.method != Method::GET => {
                path.namespace.as_deref().map(str::to_owned)
            }
            _ => None,
        };
        let exchange = Exchange {
            method: parts.method.clone(),
            path_and_query: parts.uri.path_and_query().cloned(),
            namespace,
            headers: parts.headers,
            deadline: started + REQUEST_DEADLINE,
        };
        // Counted as `canceled` if the caller goes away first: hyper then drops
        // this future, and nothing below the match runs.
        let unanswered = Unanswered {
            proxy: &self,
            verb: verb_label,
        };
        let outcome = match admitted {
            false => Outcome::new(
                json_response(StatusCode::UNAUTHORIZED, &status::unauthorized()),
                Reason::Upstream,
            ),
            true if exchange.method == Method::GET && exchange.path() == "/apis" => {
                match fallback::aggregated_discovery_version(accept_of(&exchange.headers)) {
                    Some(version) => self.aggregated_discovery(&exchange, version).await,
                    // Only aggregated discovery is answered here; the legacy group
                    // list is the client API server's own.
                    None => path_error(&request::PathError::NotFound),
                }
            }
            true if exchange.method == Method::GET && self.is_openapi_index(exchange.path()) => {
                self.openapi_index()
            }
            true if exchange.method == Method::GET && self.is_openapi_document(exchange.path()) => {
                self.openapi_document(&exchange).await
            }
            // A resource of the group/version the configuration does not enable
            // is not there, as kube answers a resource it does not have, before
            // anything else is said of the request.
            true if requested_resource(&kind, exchange.path(), &self.group, &self.version)
                .is_some_and(|r| !self.resources.serves(&r)) =>
            {
                path_error(&request::PathError::NotFound)
            }
            true => match kind {
                Err(error) => path_error(&error),
                Ok(RequestKind::Upgrade) => self.reject_upgrade(),
                Ok(RequestKind::Discovery) => self.discovery(&exchange).await,
                Ok(RequestKind::Resource { verb, path }) => {
                    self.resource(&exchange, verb, &path, body).await
                }
            },
        };

        unanswered.answered();
        let Outcome {
            mut response,
            reason,
        } = if admitted && outcome.response.status() == StatusCode::UNAUTHORIZED {
            // Only the target answers 401 to an admitted caller: its refusal of the
            // proxy's identity, which the caller must not read as its own.
            self.target_auth_failed(outcome.reason)
        } else {
            outcome
        };
        transport::prepare_response_headers(response.headers_mut());
        self.metrics.request(
            &self.group_version,
            verb_label,
            response.status().as_u16(),
            reason,
        );
        let streaming_watch = is_watch && response.status().is_success();
        let (parts, body) = response.into_parts();
        let body: ProxyBody = match inflight {
            Some(inflight) => http_body_util::BodyExt::boxed(
                DeadlineBody::new(
                    body,
                    exchange.deadline,
                    started,
                    self.metrics.clone(),
                    verb_label,
                    inflight,
                )
                .holding(permit),
            ),
            None if streaming_watch => {
                let framing = WatchFraming::of(&parts.headers);
                http_body_util::BodyExt::boxed(WatchBody::new(body, self.metrics.clone(), framing))
            }
            None => body,
        };
        without_body_if(head, Response::from_parts(parts, body))
    }

    /// 429 past [`MAX_IN_FLIGHT`], in kube's words, before any work is done.
    fn too_many_requests(&self, verb_label: &'static str) -> Response<ProxyBody> {
        let mut response = json_response(
            StatusCode::TOO_MANY_REQUESTS,
            &status::status(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
            ),
        );
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        self.metrics
            .request(&self.group_version, verb_label, 429, Reason::Upstream);
        response
    }

    fn reject_upgrade(&self) -> Outcome {
        self.metrics.termination(Reason::UpgradeRejected);
        Outcome::new(
            json_response(
                StatusCode::NOT_IMPLEMENTED,
                &status::upgrade_not_supported(),
            ),
            Reason::UpgradeRejected,
        )
    }

    // ---------------------------------------------------------------- discovery

    /// Forwards `/apis/<group>/<version>`; serves the local document when no peer
    /// is usable or the target answers 401, 404 or 5xx.
    async fn discovery(&self, exchange: &Exchange) -> Outcome {
        // Under explicit keys the target's document is cut down to the enabled
        // resources, so it is asked for as JSON, and its ETag would not describe
        // what the caller gets.
        let explicit = self.resources.is_explicit();
        let inspected = explicit.then(Inspected::rewritten_json);
        let (parts, bytes) = match self.fetch_discovery(exchange, inspected).await {
            Err(ForwardError::Pool(e)) if is_availability(e.reason()) => {
                return self.discovery_fallback(e.reason(), e.reason())
            }
            Err(e) => return self.discovery_fallback(e.reason(), Reason::UpstreamError),
            Ok(fetched) => fetched,
        };
        let code = parts.status;
        if code == StatusCode::UNAUTHORIZED
            || code == StatusCode::NOT_FOUND
            || code.is_server_error()
        {
            return self.discovery_fallback(Reason::UpstreamError, Reason::UpstreamError);
        }
        if code.is_success() {
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(document) if code == StatusCode::OK => {
                    let document = fallback::served_resource_list(document, &self.resources);
                    let rewritten = explicit.then(|| json_response(code, &document));
                    *locks::lock(&self.last_discovery) = Some(document);
                    if let Some(response) = rewritten {
                        return Outcome::new(response, Reason::Upstream);
                    }
                }
                // Under explicit keys nothing the target lists of other resources
                // is passed on: an answer that cannot be cut down (anything but a
                // 200 of the JSON document asked for) is the target's failure.
                _ if explicit => {
                    return self.discovery_fallback(Reason::UpstreamError, Reason::UpstreamError)
                }
                _ => {}
            }
        }
        Outcome::new(
            Response::from_parts(parts, transport::full(bytes)),
            Reason::Upstream,
        )
    }

    // ---------------------------------------------------------------- OpenAPI

    fn is_openapi_index(&self, path: &str) -> bool {
        path == "/openapi/v3"
    }

    fn is_openapi_document(&self, path: &str) -> bool {
        is_openapi_document_of(path, &self.group, &self.version)
    }

    /// `/openapi/v3`: the aggregator asks which documents this server has; it has
    /// exactly one, its own group/version's.
    fn openapi_index(&self) -> Outcome {
        let key = format!("apis/{}/{}", self.group, self.version);
        let document = serde_json::json!({
            "paths": { key.clone(): {"serverRelativeURL": format!("/openapi/v3/{key}")} }
        });
        Outcome::new(json_response(StatusCode::OK, &document), Reason::Upstream)
    }

    /// `/openapi/v3/apis/<group>/<version>`: the target's schema document, so
    /// clients of the client cluster validate and explain proxied kinds exactly as
    /// the target defines them. Schemas describe types, not objects, so nothing is
    /// masked.
    async fn openapi_document(&self, exchange: &Exchange) -> Outcome {
        // The caller's headers as they are, but the answer uncompressed; under
        // explicit keys it is cut down to the enabled resources, so it is asked
        // for as JSON and its ETag would not describe what the caller gets.
        let explicit = self.resources.is_explicit();
        let inspected = if explicit {
            Inspected::rewritten_json()
        } else {
            Inspected::default()
        };
        let response = match self.get_from_target(exchange, Some(&inspected)).await {
            Ok(response) if response.status().is_server_error() => {
                return self.server_error(response.status())
            }
            Ok(response) => response,
            Err(e) => return self.unavailable(e),
        };
        let (parts, body) = response.into_parts();
        // Under explicit keys no document goes out uncut: any success (a 206 for a
        // range, should one get through) is read and cut down, or refused.
        if !explicit || !parts.status.is_success() {
            return Outcome::new(Response::from_parts(parts, body), Reason::Upstream);
        }
        let read = transport::read_limited(body, transport::MAX_BUFFERED_BODY);
        let bytes = match transport::within(exchange.deadline, read).await {
            Ok(bytes) => bytes,
            Err(e) => return self.unavailable(e),
        };
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(document) => {
                let served = served_openapi::served_document(
                    document,
                    &self.group,
                    &self.version,
                    &self.resources,
                );
                Outcome::new(json_response(StatusCode::OK, &served), Reason::Upstream)
            }
            // Not the JSON asked for: nothing to cut down, and nothing to pass on.
            Err(_) => self.upstream_failure("the target's OpenAPI document is not JSON"),
        }
    }

    /// `GET /apis` asking for aggregated discovery (what an aggregator sends every
    /// 60 s): the target's entry for this group/version, or the local fallback in
    /// aggregated form under the same rules as `/apis/<group>/<version>`; a 406
    /// when the target has no aggregated discovery, so that the aggregator reads
    /// the legacy document (see [`AggregatedAnswer`]).
    async fn aggregated_discovery(&self, exchange: &Exchange, version: &'static str) -> Outcome {
        // The filtered document differs from the target's, so its ETag would lie.
        let inspected = Inspected {
            accept: None,
            rewritten: true,
        };
        let (parts, bytes) = match self.fetch_discovery(exchange, Some(inspected)).await {
            Err(ForwardError::Pool(e)) if is_availability(e.reason()) => {
                return self.aggregated_fallback(version, e.reason(), e.reason())
            }
            Err(e) => return self.aggregated_fallback(version, e.reason(), Reason::UpstreamError),
            Ok(fetched) => fetched,
        };
        let answer = fallback::aggregated_answer(
            parts.status.as_u16(),
            &bytes,
            &self.group,
            &self.version,
            &self.resources,
        );
        match answer {
            AggregatedAnswer::Entry(document) => {
                let mut response = json_response(StatusCode::OK, &document);
                if let Ok(value) =
                    HeaderValue::from_str(&fallback::aggregated_discovery_content_type(version))
                {
                    response
                        .headers_mut()
                        .insert(http::header::CONTENT_TYPE, value);
                }
                Outcome::new(response, Reason::Upstream)
            }
            AggregatedAnswer::Fallback => {
                self.aggregated_fallback(version, Reason::UpstreamError, Reason::UpstreamError)
            }
            AggregatedAnswer::NotAggregated => Outcome::new(
                json_response(StatusCode::NOT_ACCEPTABLE, &status::not_acceptable()),
                Reason::Upstream,
            ),
            AggregatedAnswer::AsIs => Outcome::new(
                Response::from_parts(parts, transport::full(bytes)),
                Reason::Upstream,
            ),
        }
    }

    fn aggregated_fallback(
        &self,
        version: &'static str,
        request_reason: Reason,
        fallback_reason: Reason,
    ) -> Outcome {
        self.count_fallback(request_reason, fallback_reason);
        let last_good = locks::lock(&self.last_discovery).clone();
        let document = fallback::aggregated_fallback_document(
            &self.group,
            &self.version,
            version,
            &self.resources,
            last_good.as_ref(),
        );
        let mut response = json_response(StatusCode::OK, &document);
        if let Ok(value) =
            HeaderValue::from_str(&fallback::aggregated_discovery_content_type(version))
        {
            response
                .headers_mut()
                .insert(http::header::CONTENT_TYPE, value);
        }
        Outcome::new(response, request_reason)
    }

    fn discovery_fallback(&self, request_reason: Reason, fallback_reason: Reason) -> Outcome {
        self.count_fallback(request_reason, fallback_reason);
        let last_good = locks::lock(&self.last_discovery).clone();
        let document = fallback::fallback_document(
            &self.group,
            &self.version,
            &self.resources,
            last_good.as_ref(),
        );
        Outcome::new(json_response(StatusCode::OK, &document), request_reason)
    }

    /// A discovery document from the target, read whole, or why not within
    /// [`DISCOVERY_WAIT`]. The exchange runs in a task of its own under the
    /// request's full deadline: when the caller stops waiting, the dial still
    /// ends as it would for any request (a silent peer is timed out and counted
    /// toward its quarantine), instead of ending as this request's deadline.
    async fn fetch_discovery(
        &self,
        exchange: &Exchange,
        inspected: Option<Inspected>,
    ) -> Result<(http::response::Parts, Bytes), ForwardError> {
        let target = self.target.clone();
        let deadline = exchange.deadline;
        let path_and_query = exchange.target_path().as_str().to_owned();
        let headers = exchange.headers.clone();
        let fetch = tokio::spawn(async move {
            let path_and_query = TargetPath::Written(&path_and_query);
            let response = target
                .send_get(deadline, path_and_query, &headers, inspected.as_ref())
                .await?;
            let (parts, body) = response.into_parts();
            let bytes =
                transport::within(deadline, transport::read_limited(body, MAX_BUFFERED_BODY))
                    .await?;
            Ok((parts, bytes))
        });
        match tokio::time::timeout(DISCOVERY_WAIT, fetch).await {
            Ok(Ok(fetched)) => fetched,
            Ok(Err(failed)) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
            Ok(Err(_)) => Err(ForwardError::Send("discovery exchange cancelled".into())),
            Err(_) => Err(ForwardError::Deadline),
        }
    }

    /// A discovery answered from the fallback; one cut off by the discovery
    /// deadline is also a termination the proxy made.
    fn count_fallback(&self, request_reason: Reason, fallback_reason: Reason) {
        if request_reason == Reason::Deadline {
            self.metrics.termination(Reason::Deadline);
        }
        self.metrics
            .discovery_fallback(&self.group_version, fallback_reason);
    }

    // ---------------------------------------------------------------- resources

    async fn resource(
        &self,
        exchange: &Exchange,
        verb: Verb,
        path: &ResourcePath<'_>,
        body: hyper::body::Incoming,
    ) -> Outcome {
        let owned = self.access == AccessMode::Owned;
        // A body announced larger than kube-apiserver accepts is refused before any
        // of it is read; one without a length is cut off while it is read.
        let declared_length = exchange
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared_length.is_some_and(|length| length > MAX_REQUEST_BODY as u64) {
            return refused_body(&BodyError::TooLarge);
        }
        // Every path but a plain forward is boxed below. This future is as large as
        // its largest path, and each request's future stays allocated whole until its
        // response head is out: unboxed, 10 000 watches opening at once would each
        // hold room for an owned mutation they never make.
        let writes_into_namespace = matches!(verb, Verb::Create | Verb::Update | Verb::Patch);
        // Whether this write may not create its object: its namespace is being
        // deleted, and it is a create or a server-side apply (which creates a
        // missing object, and kube's lifecycle admission judges it as a create).
        let creates_refused = match path.namespace.as_ref().filter(|_| writes_into_namespace) {
            None => false,
            Some(namespace) => {
                let may_create = verb == Verb::Create || is_apply(exchange, path);
                let ensured = self.ensure_namespace(namespace, may_create, exchange.deadline);
                match Box::pin(ensured).await {
                    Ok(refused) => refused,
                    Err(outcome) => return outcome,
                }
            }
        };
        if creates_refused && verb == Verb::Create {
            return Box::pin(self.refuse_create_while_terminating(exchange, path, body)).await;
        }
        // An apply: owned mode decides on its ownership check (`owned_mutation`);
        // all mode, which checks no ownership, looks and pins here.
        if creates_refused && !owned {
            return Box::pin(self.apply_while_terminating(exchange, path, body)).await;
        }
        match verb {
            Verb::DeleteCollection if owned => {
                let bytes = match self.request_body(exchange, body).await {
                    Ok(bytes) => bytes,
                    Err(outcome) => return outcome,
                };
                Box::pin(self.owned_delete_collection(exchange, path, &bytes)).await
            }
            Verb::List | Verb::Watch if owned => {
                let query = match ownership::scoped_query(exchange.query(), &self.owner) {
                    Ok(query) => query,
                    Err(e) => return scope_error(&e),
                };
                let target_path = with_query(exchange.path(), &query);
                self.forward(
                    exchange,
                    None,
                    TargetPath::Written(&target_path),
                    transport::stream(body),
                    verb == Verb::Watch,
                )
                .await
            }
            Verb::Get if owned => {
                let outcome = Box::pin(self.named_get(exchange, path)).await;
                self.not_found_as_masked(exchange, path, outcome).await
            }
            Verb::Update | Verb::Patch | Verb::Delete if owned => {
                let outcome =
                    Box::pin(self.owned_mutation(exchange, verb, path, body, creates_refused))
                        .await;
                self.not_found_as_masked(exchange, path, outcome).await
            }
            // Creates are stamped in both modes, so every object on the target names
            // the client that made it.
            Verb::Create => Box::pin(self.create(exchange, path, body)).await,
            // In all mode a replace of the object itself is stamped only when its
            // body names no owner: one sent back as it was read keeps its owner
            // (this client sees every client's objects), one without labels does not
            // lose them. All-mode patches and subresource writes go as they came:
            // what a patch does not mention keeps its labels, and stamping it would
            // move another client's object out of that client's view on a mere
            // annotate, or fail a JSON patch on an unlabelled object.
            Verb::Update if path.subresource.is_none() => {
                Box::pin(self.stamped_write(exchange, body, Stamp::UnlessOwnerNamed)).await
            }
            _ => {
                let watch = verb == Verb::Watch;
                self.forward(
                    exchange,
                    None,
                    exchange.target_path(),
                    transport::limited_stream(body, MAX_REQUEST_BODY),
                    watch,
                )
                .await
            }
        }
    }

    /// A create, stamped in both modes; in owned mode the ownership cache learns
    /// the created object from the answer.
    async fn create(
        &self,
        exchange: &Exchange,
        path: &ResourcePath<'_>,
        body: hyper::body::Incoming,
    ) -> Outcome {
        let created = self.stamped_write(exchange, body, Stamp::Always).await;
        if self.access == AccessMode::Owned {
            self.remember_write(exchange, Verb::Create, path, None, None, created)
                .await
        } else {
            created
        }
    }

    /// A create, or an all-mode replace, labelled as `stamp` says and forwarded. In
    /// owned mode a body that cannot be labelled is refused; in all mode it goes as
    /// it came (the spec's "continue without labels": nothing is hidden from this
    /// client anyway), and the failed injection is logged.
    async fn stamped_write(
        &self,
        exchange: &Exchange,
        body: hyper::body::Incoming,
        stamp: Stamp,
    ) -> Outcome {
        let owned = self.access == AccessMode::Owned;
        let bytes = match self.request_body(exchange, body).await {
            Ok(bytes) => bytes,
            Err(outcome) => return outcome,
        };
        let labelled = match self.labelled_body(exchange, &bytes, stamp).await {
            Ok(labelled) => labelled,
            Err(outcome) => return outcome,
        };
        let (media_type, body) = match labelled {
            Ok((write, _room)) => (Some(write.body_type.media_type()), write.to_bytes()),
            Err(error) if owned => return refused_body(&error),
            Err(error) => {
                tracing::warn!(group_version = %self.group_version, target = %self.metrics.target_label(), %error, "inject source labels failed");
                (None, bytes.to_vec())
            }
        };
        self.forward_write(exchange, media_type, Bytes::from(body))
            .await
    }

    /// Named GET in owned mode: the object itself decides whether the caller may
    /// see it, in whichever JSON representation the caller asked for. A subresource
    /// answer (a Scale, say) may carry no labels of its own: its object is checked
    /// first, and the answer is shown only when it is owned itself or is the very
    /// state that was checked (same uid and resourceVersion).
    async fn named_get(&self, exchange: &Exchange, path: &ResourcePath<'_>) -> Outcome {
        let mut attempt = 1;
        loop {
            match self.named_get_once(exchange, path).await {
                // The object changed between the check and the read (an update by
                // its controller, say): the answer is another state than the one
                // checked, so it is checked again rather than masked as missing.
                Err(SubresourceMoved) if attempt < SUBRESOURCE_READS => attempt += 1,
                Err(SubresourceMoved) => return self.masked(path, Reason::OwnershipMasked),
                Ok(outcome) => return outcome,
            }
        }
    }

    /// One named GET; `Err` when a subresource answer neither is owned nor shows
    /// the state that was checked, while the object was owned when checked.
    async fn named_get_once(
        &self,
        exchange: &Exchange,
        path: &ResourcePath<'_>,
    ) -> Result<Outcome, SubresourceMoved> {
        let checked = match &path.subresource {
            None => None,
            Some(_) => match self.check_ownership(exchange, path).await {
                Ok(Checked::Owned(pin)) => Some(pin),
                Ok(Checked::Absent) => return Ok(self.masked(path, Reason::OwnershipMasked)),
                Err(outcome) => return Ok(outcome),
            },
        };
        let inspected = Inspected {
            accept: Some(inspectable_accept_header(
                exchange.headers.get(http::header::ACCEPT),
            )),
            rewritten: false,
        };
        let response = match self.get_from_target(exchange, Some(&inspected)).await {
            Ok(response) => response,
            Err(e) => return Ok(self.unavailable(e)),
        };
        let code = response.status();
        // A 5xx is answered with the proxy's own 503: its body is not read, and
        // its connection goes back before any check takes one.
        let answer = if code.is_server_error() {
            drop(response);
            None
        } else {
            let (parts, body) = response.into_parts();
            let read = transport::read_limited(body, MAX_BUFFERED_BODY);
            match transport::within(exchange.deadline, read).await {
                Ok(bytes) => Some((parts, bytes)),
                Err(e) => return Ok(self.unavailable(e)),
            }
        };
        // An object that was not checked first (no subresource) may be shown
        // only when owned, and so may a failure that kube-apiserver makes only
        // after reading the object.
        if checked.is_none() && !decided_before_the_object_is_read(code) {
            if let Err(outcome) = self.confirm_owned(exchange, path).await {
                return Ok(outcome);
            }
        }
        let Some((parts, bytes)) = answer else {
            return Ok(self.server_error(code));
        };
        if code != StatusCode::OK {
            return Ok(Outcome::new(
                Response::from_parts(parts, transport::full(bytes)),
                Reason::Upstream,
            ));
        }
        let visibility = ownership::response_visibility(&self.owner, &bytes);
        let is_checked_state = || {
            checked.as_ref().is_some_and(|pin| {
                serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .and_then(|answer| Pin::of(&answer))
                    .as_ref()
                    == Some(pin)
            })
        };
        match visibility {
            Visibility::Owned => {}
            _ if is_checked_state() => {}
            Visibility::NotOwned if checked.is_some() => return Err(SubresourceMoved),
            Visibility::NotOwned => return Ok(self.masked(path, Reason::OwnershipMasked)),
            Visibility::Undecodable => return Ok(self.masked(path, Reason::OwnershipCheckFailed)),
        }
        Ok(Outcome::new(
            Response::from_parts(parts, transport::full(bytes)),
            Reason::Upstream,
        ))
    }

    /// PUT, PATCH or DELETE of a named object in owned mode: the body is read once
    /// and labelled, ownership is checked, and the mutation is sent pinned to the
    /// checked state (see `crproxy_core::precondition`). A pinned write the target
    /// refuses with 409 or 422 may have been refused because the object changed
    /// after the check, so it is checked and sent once more: an object that lost
    /// its labels is then masked, one that is still owned gets a fresh pin. Not
    /// when the body names a uid other than the checked one: kube refuses that
    /// for the uid alone. (Should the object also change between check and
    /// write, a merge patch's refusal then reads 409 where kube's would read
    /// 422; either way nothing is written.) A refusal that ends the request is
    /// judged by one more check ([`Self::final_refusal`]).
    async fn owned_mutation(
        &self,
        exchange: &Exchange,
        verb: Verb,
        path: &ResourcePath<'_>,
        body: hyper::body::Incoming,
        creates_refused: bool,
    ) -> Outcome {
        let bytes = match self.request_body(exchange, body).await {
            Ok(bytes) => bytes,
            Err(outcome) => return outcome,
        };
        // A view of the object gets no labels and is pinned by what it carries.
        let view = !body_is_the_object(path);
        let stamp = if view { Stamp::Never } else { Stamp::Always };
        // A delete's options are read once (a body as a tree, under the parse
        // budget) and kept as text for every attempt (the cached one, each checked
        // one): the budget's room is given back before the first round trip, and
        // the caller's headers go out as they came. A write's document stays a
        // tree until an attempt takes it, and keeps its room.
        let (mut mutation, _room) = if verb == Verb::Delete {
            let room = match self
                .parse_room(exchange, request_body::parse_cost(&bytes))
                .await
            {
                Ok(room) => room,
                Err(outcome) => return outcome,
            };
            let options = DeleteOptions::read(&bytes, exchange.query());
            drop(room);
            (Mutation::Delete(options), None)
        } else {
            match self.labelled_body(exchange, &bytes, stamp).await {
                Ok(Ok((document, room))) => {
                    let mutation = Mutation::Write {
                        media_type: document.body_type.media_type(),
                        bytes,
                        stamp,
                        first: Some(document),
                    };
                    (mutation, Some(room))
                }
                Ok(Err(error)) => return refused_body(&error),
                Err(outcome) => return outcome,
            }
        };
        if let Some(outcome) = self
            .cached_mutation(exchange, verb, path, &mut mutation)
            .await
        {
            return outcome;
        }
        let media_type = Some(mutation.media_type());
        for attempt in 1..=PINNED_ATTEMPTS {
            let last = attempt == PINNED_ATTEMPTS;
            // Every attempt after the one that pinned the first document (the
            // cached one's, or the first checked one's) reads the bytes again
            // here, before its check, so that the parse does not widen the time
            // between the check and the write.
            let request = match self.attempt(&exchange.headers, &mut mutation) {
                Ok(request) => request,
                Err(error) => return refused_body(&error),
            };
            let checked = match self.check_ownership(exchange, path).await {
                Ok(checked) => checked,
                Err(outcome) => return outcome,
            };
            // A body naming another uid than the checked one is refused for that
            // uid, whatever the pin: its first answer is final.
            let mut refused_for_its_uid = false;
            let pinned = match request {
                Attempt::Delete(options) => match &checked {
                    Checked::Owned(pin) => pinned_delete(options, pin),
                    Checked::Absent => return self.masked(path, Reason::OwnershipMasked),
                },
                Attempt::Write(mut document) => {
                    refused_for_its_uid = match &checked {
                        Checked::Owned(pin) => precondition::names_another_uid(&document, pin),
                        // An apply naming a uid finds no object to carry it.
                        Checked::Absent => precondition::names_a_uid(&document),
                    };
                    // An apply of a missing object creates it, which a namespace
                    // being deleted refuses, as kube's lifecycle admission does;
                    // one naming a uid is refused for the uid first, as kube's
                    // patcher checks it before admission.
                    if creates_refused && matches!(checked, Checked::Absent) && !refused_for_its_uid
                    {
                        return self.apply_create_refused(path);
                    }
                    match &checked {
                        Checked::Owned(pin) if view => {
                            precondition::pin_view_write(&mut document, pin)
                                .map(|()| PinnedRequest::Body(document.to_bytes()))
                        }
                        Checked::Owned(pin) => {
                            precondition::pin_write(&self.owner, &mut document, pin)
                                .map(|()| PinnedRequest::Body(document.to_bytes()))
                        }
                        Checked::Absent => precondition::pin_apply_create(&mut document)
                            .map(|()| PinnedRequest::Body(document.to_bytes())),
                    }
                }
            };
            let pinned = match pinned {
                Ok(pinned) => pinned,
                Err(PreconditionError::Stale) if !last => continue,
                Err(PreconditionError::Stale) => {
                    return self.stale(path, path.name.as_deref().unwrap_or(""));
                }
                // Refused after the check, as kube finds the object (or not)
                // before it judges the update.
                Err(PreconditionError::NoResourceVersion) => {
                    return self.resource_version_required(path);
                }
                Err(e) => return precondition_refused(&e),
            };
            let mut outcome = self.forward_pinned(exchange, media_type, pinned).await;
            if matches!(checked, Checked::Absent) && request::is_dry_run(exchange.query()) {
                outcome = self.without_create_pin(exchange, outcome).await;
            }
            if !last && pin_may_have_refused(outcome.response.status()) && !refused_for_its_uid {
                continue;
            }
            let (outcome, judged) = self.may_describe_the_object_found(exchange, outcome).await;
            if judged {
                return self.final_refusal(exchange, path, &checked, outcome).await;
            }
            let sent_with = match &checked {
                Checked::Owned(pin) => Some(pin),
                Checked::Absent => None,
            };
            return self
                .remember_write(
                    exchange,
                    verb,
                    path,
                    mutation.delete_options(),
                    sent_with,
                    outcome,
                )
                .await;
        }
        // The loop returns on its last attempt.
        self.upstream_failure("no attempt left for the pinned write")
    }

    /// What one attempt of an owned mutation pins: the delete's options, or the
    /// write's document, the one read first and then the caller's bytes read
    /// again for each later attempt (a document is consumed by its pin).
    fn attempt<'m>(
        &self,
        headers: &HeaderMap,
        mutation: &'m mut Mutation,
    ) -> Result<Attempt<'m>, BodyError> {
        match mutation {
            Mutation::Delete(options) => Ok(Attempt::Delete(options)),
            Mutation::Write {
                bytes,
                stamp,
                first,
                ..
            } => match first.take() {
                Some(document) => Ok(Attempt::Write(document)),
                None => self.label(headers, bytes, *stamp).map(Attempt::Write),
            },
        }
    }

    /// A pinned write's refusal that ends the request. kube judges a write on
    /// the object it finds under the name (admission, field ownership,
    /// validation, preconditions), which after the check may be another
    /// client's: its words for a failed uid precondition name that object's
    /// uid, an apply's conflicts name its field managers, a webhook's denial
    /// may quote it. So the name is checked once more. Still in the checked
    /// state (or still missing, for an apply that would create), the refusal
    /// is the request's own and goes back as kube wrote it; otherwise the
    /// caller gets kube's "the object has been modified" conflict in the
    /// proxy's words, or the 404 of an object that is not its own.
    async fn final_refusal(
        &self,
        exchange: &Exchange,
        path: &ResourcePath<'_>,
        checked: &Checked,
        refusal: Outcome,
    ) -> Outcome {
        match self.check_ownership(exchange, path).await {
            Ok(now) if now == *checked => refusal,
            Ok(_) => self.stale(path, path.name.as_deref().unwrap_or("")),
            Err(outcome) => outcome,
        }
    }

    /// Whether a pinned write's answer may describe the object the target found
    /// under the name rather than the request alone, with the answer to pass on.
    /// Any refusal may (unlike a GET's, see [`decided_before_the_object_is_read`],
    /// a write's 403 may be a webhook's), but for three. A 401 is replaced by the
    /// proxy's own answer; kube's own 404 says only that there is no object, as
    /// the masked answer does, and its own 429 (priority and fairness) comes
    /// before any object is read: neither needs another read of a target that may
    /// be throttling. A webhook, though, may deny with any code from 400 up, and
    /// kube words every such denial "admission webhook ... denied the request":
    /// a 404 or 429 so worded (or one that cannot be read to tell) is judged too.
    async fn may_describe_the_object_found(
        &self,
        exchange: &Exchange,
        outcome: Outcome,
    ) -> (Outcome, bool) {
        let code = outcome.response.status();
        if !code.is_client_error() || code == StatusCode::UNAUTHORIZED {
            return (outcome, false);
        }
        if code != StatusCode::NOT_FOUND && code != StatusCode::TOO_MANY_REQUESTS {
            return (outcome, true);
        }
        match self.read_json_answer(exchange, outcome).await {
            Ok((parts, bytes, reason)) => {
                let webhooks = is_a_webhooks_denial(&bytes);
                let answer = Response::from_parts(parts, transport::full(bytes));
                (Outcome::new(answer, reason), webhooks)
            }
            Err(outcome) => (outcome, true),
        }
    }

    /// A dry run answers with the object as the apply left it, and kube's dry-run
    /// storage does not replace its resourceVersion as a real write does: an apply
    /// pinned so that it can only create ([`precondition::pin_apply_create`])
    /// would show the caller a resourceVersion it never sent. It is taken out of
    /// a plain JSON answer; any other answer goes back as it came.
    async fn without_create_pin(&self, exchange: &Exchange, outcome: Outcome) -> Outcome {
        if !outcome.response.status().is_success() {
            return outcome;
        }
        let (mut parts, bytes, reason) = match self.read_json_answer(exchange, outcome).await {
            Ok(read) => read,
            Err(outcome) => return outcome,
        };
        // Read as a write body is, so that every other byte goes back as sent.
        let rewritten = WriteBody::parse(Some("application/json"), &bytes)
            .ok()
            .and_then(|mut answer| {
                let pinned = matches!(
                    answer.resource_version(),
                    Ok(CallerValue::Text(rv)) if rv == precondition::NO_OBJECT_RESOURCE_VERSION
                );
                (pinned && answer.set_metadata_field("resourceVersion", None).is_ok())
                    .then(|| answer.to_bytes())
            });
        let body = match rewritten {
            Some(rewritten) => {
                parts.headers.remove(http::header::CONTENT_LENGTH);
                transport::full(rewritten)
            }
            None => transport::full(bytes),
        };
        Outcome::new(Response::from_parts(parts, body), reason)
    }

    /// A plain JSON object answer read whole, within the request's deadline: its
    /// head, its bytes and its reason. `Err` gives any other answer back as it
    /// streams (a Table, YAML, compressed), or the 503 of one that could not be
    /// read.
    async fn read_json_answer(
        &self,
        exchange: &Exchange,
        outcome: Outcome,
    ) -> Result<(http::response::Parts, Bytes, Reason), Outcome> {
        if !is_plain_json_object(outcome.response.headers()) {
            return Err(outcome);
        }
        let Outcome { response, reason } = outcome;
        let (parts, body) = response.into_parts();
        let read = transport::read_limited(body, MAX_BUFFERED_BODY);
        match transport::within(exchange.deadline, read).await {
            Ok(bytes) => Ok((parts, bytes, reason)),
            Err(e) => Err(self.unavailable(e)),
        }
    }

    /// The fast path of an owned mutation: when the ownership cache knows the
    /// object, the write is pinned to the cached state and sent at once, without
    /// the ownership GET. `None` sends the request down the checked path: the
    /// cache did not know the object, the caller's own resourceVersion or uid
    /// differs from the cached one, or the target refused the write without
    /// writing (4xx other than 429, or any error for an idempotent server-side
    /// apply; usually the pin failing because the cache was stale). The checked
    /// path then gives exactly the answer the caller would get without the cache.
    /// Subresources always take the checked path.
    async fn cached_mutation(
        &self,
        exchange: &Exchange,
        verb: Verb,
        path: &ResourcePath<'_>,
        mutation: &mut Mutation,
    ) -> Option<Outcome> {
        let name = path
            .name
            .as_deref()
            .filter(|_| path.subresource.is_none())?;
        let lookup = self
            .ownership_cache
            .lookup(&path.resource, path.namespace.as_deref(), name);
        let pin = match lookup {
            Lookup::Hit(pin) => pin,
            Lookup::Miss => return self.cache_result("miss"),
            Lookup::Unsynced => return self.cache_result("unsynced"),
        };
        let request = match self.attempt(&exchange.headers, mutation) {
            Ok(request) => request,
            Err(error) => return Some(refused_body(&error)),
        };
        let pinned = match request {
            Attempt::Delete(options) => pinned_delete(options, &pin),
            // A caller's uid other than the cached one: either the cache is behind
            // (the caller read a newer incarnation) or the target refuses the
            // write; a write pinned to the cached state would fail either way.
            Attempt::Write(document) if precondition::names_another_uid(&document, &pin) => {
                return self.cache_result("stale");
            }
            Attempt::Write(mut document) => {
                precondition::pin_write(&self.owner, &mut document, &pin)
                    .map(|()| PinnedRequest::Body(document.to_bytes()))
            }
        };
        // A caller precondition the cached state does not meet, or a body that
        // cannot carry the pin: the checked path answers it as it always did.
        let Ok(pinned) = pinned else {
            return self.cache_result("stale");
        };
        let outcome = self
            .forward_pinned(exchange, Some(mutation.media_type()), pinned)
            .await;
        let code = outcome.response.status();
        let refused = code.is_client_error() && code != StatusCode::TOO_MANY_REQUESTS;
        // Server-side apply is idempotent, so it may also be checked and sent again
        // after a server error: an apply of an object deleted behind the cache's
        // back must create it, as it would without the cache. Not after the
        // request's own deadline ended it: that was its one answer, already
        // counted as a termination.
        let is_apply = content_type(&exchange.headers).and_then(BodyType::from_content_type)
            == Some(BodyType::ApplyPatchYaml);
        let retriable = is_apply && code.is_server_error() && outcome.reason != Reason::Deadline;
        if refused || retriable {
            return self.cache_result("stale");
        }
        self.metrics.ownership_cache(&self.group_version, "hit");
        Some(
            self.remember_write(
                exchange,
                verb,
                path,
                mutation.delete_options(),
                Some(&pin),
                outcome,
            )
            .await,
        )
    }

    fn cache_result(&self, result: &'static str) -> Option<Outcome> {
        self.metrics.ownership_cache(&self.group_version, result);
        None
    }

    /// Tells the ownership cache what a successful mutation left behind: a deleted
    /// object, or one written through a view of it (`/scale`), is forgotten (its
    /// pin is superseded), an updated or created one is remembered in its new
    /// state (read from the answer, which is passed on unchanged), so that a write
    /// right after it need not wait for the cache's watch. Dry runs change nothing:
    /// a delete's options (`delete`) say whether it is one, any other write's
    /// query does. `sent_with` is the state the write was pinned to, if it was.
    async fn remember_write(
        &self,
        exchange: &Exchange,
        verb: Verb,
        path: &ResourcePath<'_>,
        delete: Option<&Result<DeleteOptions, PreconditionError>>,
        sent_with: Option<&Pin>,
        outcome: Outcome,
    ) -> Outcome {
        // A create's path names no object: its answer does.
        let name = path.name.as_deref();
        if name.is_none() && verb != Verb::Create {
            return outcome;
        }
        let dry_run = match delete {
            Some(Ok(options)) => options.is_dry_run(),
            // Options that cannot be read are refused before anything is sent.
            Some(Err(_)) => true,
            None => request::is_dry_run(exchange.query()),
        };
        if !outcome.response.status().is_success() || dry_run {
            return outcome;
        }
        let namespace = path.namespace.as_deref();
        let forget = || {
            if let Some(name) = name {
                self.ownership_cache
                    .forget(&path.resource, namespace, name, sent_with);
            }
        };
        // A delete leaves no state to pin, and a write through a view answers
        // with the view (a Scale, without labels): either way the object moved
        // past what the cache knew. A status write answers with the object.
        if verb == Verb::Delete || !body_is_the_object(path) {
            forget();
            return outcome;
        }
        // Only an object in plain JSON can be read for the cache; what it knew of
        // an object written with any other answer is superseded.
        let (parts, bytes, reason) = match self.read_json_answer(exchange, outcome).await {
            Ok(read) => read,
            Err(outcome) => {
                forget();
                return outcome;
            }
        };
        self.ownership_cache
            .remember(&path.resource, namespace, name, sent_with, &bytes);
        Outcome::new(Response::from_parts(parts, transport::full(bytes)), reason)
    }

    /// Owned-mode deletecollection as list-owned + pinned deletes: the target's own
    /// deletecollection lists and deletes in two steps, so an object that loses its
    /// labels in between would still be deleted. Each owned object is deleted by
    /// name with uid and resourceVersion preconditions; one that changed after the
    /// list (409) or is already gone (404) is left alone. The answer is a list of the
    /// deleted objects, as kube's. A request without a namespace deletes across
    /// namespaces, as kube's does: each object at its own namespace's path.
    ///
    /// The owned objects are listed in pages of [`DELETE_COLLECTION_PAGE`], as
    /// metadata only, and each page is deleted before the next is asked for, so no
    /// answer the proxy reads whole grows with the collection. The first page is one
    /// object in full: its list envelope (kind, apiVersion, resourceVersion) is the
    /// answer's, as the target would write it. A continue token that expired (410)
    /// starts the list over, at most [`DELETE_COLLECTION_RESTARTS`] times.
    async fn owned_delete_collection(
        &self,
        exchange: &Exchange,
        path: &ResourcePath<'_>,
        options: &[u8],
    ) -> Outcome {
        let (list_query, delete_query) = split_delete_collection_query(exchange.query());
        let mut list_query = match ownership::scoped_query(Some(&list_query), &self.owner) {
            Ok(query) => query,
            Err(e) => return scope_error(&e),
        };
        let exact = request::query_pairs(Some(&list_query))
            .iter()
            .any(|(name, value)| name == "resourceVersionMatch" && value == "Exact");
        // Read once, before anything is listed or deleted, as kube reads them. A
        // body is read as a tree, under the parse budget; what is kept is text.
        let options = {
            let _room = match self
                .parse_room(exchange, request_body::parse_cost(options))
                .await
            {
                Ok(room) => room,
                Err(outcome) => return outcome,
            };
            match DeleteOptions::read(options, Some(&delete_query)) {
                Ok(options) => options,
                Err(e) => return precondition_refused(&e),
            }
        };
        let mut envelope: Option<Value> = None;
        // Deleted objects as the target answered them, kept as text, until they
        // would hold more than one answer may; then as they were listed (metadata).
        let mut deleted: Vec<Bytes> = Vec::new();
        let mut held = 0;
        let mut object_type: Option<ObjectType> = None;
        // An object deleted with a finalizer stays listed; after a restart it is
        // not deleted (and answered) twice.
        let mut deleted_uids: HashSet<String> = HashSet::new();
        let mut token: Option<String> = None;
        let mut restarts = 0;
        loop {
            // Answers that come at once never let a timeout fire: the loop checks.
            if Instant::now() >= exchange.deadline {
                return self.unavailable(ForwardError::Deadline);
            }
            let (accept, limit) = match envelope {
                None => ("application/json", 1),
                Some(_) => (METADATA_LIST, DELETE_COLLECTION_PAGE),
            };
            let page_path = with_query(
                exchange.path(),
                &page_query(&list_query, limit, token.as_deref()),
            );
            let attempt = self
                .target
                .call_accepting(exchange.deadline, Method::GET, &page_path, accept, None)
                .await;
            let (code, bytes) = match attempt {
                Ok(answer) => answer,
                Err(e) => return self.unavailable(e),
            };
            match list_step(code, token.is_some(), restarts, exact) {
                ListStep::Page => {}
                ListStep::Restart => {
                    tracing::debug!(group_version = %self.group_version, "deletecollection list expired between pages; listing again");
                    restarts += 1;
                    token = None;
                    // The caller's resourceVersion is what expired: list what is current.
                    list_query = without_resource_version(&list_query);
                    continue;
                }
                ListStep::Unavailable => return self.server_error(code),
                ListStep::PassOn => {
                    return Outcome::new(json_bytes_response(code, bytes), Reason::Upstream)
                }
            }
            let Ok(mut page) = serde_json::from_slice::<Value>(&bytes) else {
                return self.upstream_failure("the target's list page is not JSON");
            };
            drop(bytes);
            let items = match page.get_mut("items").map(Value::take) {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            };
            token = page
                .pointer("/metadata/continue")
                .and_then(Value::as_str)
                .filter(|token| !token.is_empty())
                .map(str::to_string);
            let envelope = envelope.get_or_insert(page);
            // The first page lists whole objects: their kind and apiVersion (a
            // CRD's listKind need not be the kind and "List").
            if object_type.is_none() {
                object_type = Some(ObjectType::of(items.first(), envelope));
            }
            for item in items {
                let uid = item.pointer("/metadata/uid").and_then(Value::as_str);
                if uid.is_some_and(|uid| deleted_uids.contains(uid)) {
                    continue;
                }
                let uid = uid.map(str::to_string);
                let answer = match self.delete_listed(exchange, path, &options, &item).await {
                    Ok(Some(answer)) => answer,
                    Ok(None) => continue,
                    Err(outcome) => return outcome,
                };
                let object = match answer {
                    Some(object) if held + object.len() <= MAX_BUFFERED_BODY => object,
                    // A Status instead of the object, or past the bound: the listed
                    // state stands for it.
                    _ => match serde_json::to_vec(&listed_as_object(item, object_type.as_ref())) {
                        Ok(listed) => Bytes::from(listed),
                        Err(_) => {
                            return self.upstream_failure("a listed object could not be encoded")
                        }
                    },
                };
                held += object.len();
                deleted.push(object);
                deleted_uids.extend(uid);
            }
            if token.is_none() {
                break;
            }
        }
        let mut envelope = match envelope {
            Some(Value::Object(envelope)) => envelope,
            _ => serde_json::Map::new(),
        };
        if let Some(metadata) = envelope.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.remove("continue");
            metadata.remove("remainingItemCount");
        }
        match list_body(&envelope, &deleted) {
            Ok(body) => Outcome::new(
                json_bytes_response(StatusCode::OK, Bytes::from(body)),
                Reason::Upstream,
            ),
            Err(_) => self.upstream_failure("the list of deleted objects could not be encoded"),
        }
    }

    /// Deletes one object a deletecollection listed, if it is owned, pinned to the
    /// listed state: `Some(answer)` when it was deleted, with the object the target
    /// answered (`None` when it answered a Status); `None` when it was not owned or
    /// changed or went meanwhile; or the answer to send instead.
    async fn delete_listed(
        &self,
        exchange: &Exchange,
        path: &ResourcePath<'_>,
        options: &DeleteOptions,
        item: &Value,
    ) -> Result<Option<Option<Bytes>>, Outcome> {
        // The list was narrowed by the owner selector; judge each item anyway.
        let (true, Some(pin), Some(name)) = (
            self.owner.owns(item),
            Pin::of(item),
            item.pointer("/metadata/name").and_then(Value::as_str),
        ) else {
            return Ok(None);
        };
        // A caller's uid or resourceVersion precondition that is not this
        // object's: kube sends the delete anyway and the object's conflict fails
        // the collection.
        let pinned = options.pinned(&pin).map_err(|e| match e {
            PreconditionError::Stale => self.stale(path, name),
            e => precondition_refused(&e),
        })?;
        let Some((namespace, item_path)) = self.item_location(path, item, name) else {
            return Ok(None);
        };
        // The options travel in the pinned body (kube reads the query's only
        // when the body is empty).
        let (code, answer) = self
            .target
            .call(
                exchange.deadline,
                Method::DELETE,
                &item_path,
                Some(Bytes::from(pinned)),
            )
            .await
            .map_err(|e| self.unavailable(e))?;
        match code {
            StatusCode::OK | StatusCode::ACCEPTED => {
                // As after a single delete: the state the cache knew is gone (or
                // is going, with a finalizer), before its watch says so.
                if !options.is_dry_run() {
                    self.ownership_cache
                        .forget(&path.resource, namespace, name, Some(&pin));
                }
                let is_object = serde_json::from_slice::<Value>(&answer).is_ok_and(|a| {
                    a.is_object() && a.get("kind").and_then(Value::as_str) != Some("Status")
                });
                // Copied: the read buffer may be larger than the object, and
                // every deleted object is held until the answer is sent.
                Ok(Some(is_object.then(|| Bytes::copy_from_slice(&answer))))
            }
            StatusCode::NOT_FOUND | StatusCode::CONFLICT => Ok(None),
            code if code.is_server_error() => Err(self.server_error(code)),
            code => Err(Outcome::new(
                json_bytes_response(code, answer),
                Reason::Upstream,
            )),
        }
    }

    /// Where the pinned delete of `name`, listed by a deletecollection, goes: its
    /// namespace and path, next to the collection the caller named, or, when that
    /// collection spans namespaces, in the item's own namespace (a namespaced
    /// object has no path without one). `None` for a name or namespace that cannot
    /// be one path segment (kube never stores one; a target that did is not
    /// followed elsewhere).
    fn item_location<'a>(
        &self,
        path: &'a ResourcePath<'a>,
        item: &'a Value,
        name: &str,
    ) -> Option<(Option<&'a str>, String)> {
        let item_namespace = item
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|namespace| !namespace.is_empty());
        if !is_path_segment(name) || !item_namespace.is_none_or(is_path_segment) {
            return None;
        }
        // The caller's namespace, or the item's when the collection spans them.
        let namespace = path.namespace.as_deref().or(item_namespace);
        let item_path = resource_path(
            &self.group,
            &self.version,
            namespace,
            &path.resource,
            Some(name),
        );
        Some((namespace, item_path))
    }

    /// The preliminary GET of an owned-mode mutation: `Owned(pin)` for an owned
    /// object, `Absent` when it does not exist and the verb may create it
    /// (server-side apply), otherwise the response to send instead.
    async fn check_ownership(
        &self,
        exchange: &Exchange,
        path: &ResourcePath<'_>,
    ) -> Result<Checked, Outcome> {
        let (code, bytes) = self
            .read_object(
                exchange,
                path,
                "ownership check",
                Reason::OwnershipCheckFailed,
            )
            .await?;
        if code == StatusCode::OK {
            let object: Value = serde_json::from_slice(&bytes)
                .map_err(|_| self.masked(path, Reason::OwnershipCheckFailed))?;
            if !self.owner.owns(&object) {
                return Err(self.masked(path, Reason::OwnershipMasked));
            }
            return Pin::of(&object)
                .map(Checked::Owned)
                .ok_or_else(|| self.masked(path, Reason::OwnershipCheckFailed));
        }
        if code == StatusCode::NOT_FOUND {
            // Only server-side apply creates a missing object; it is then pinned so
            // that it can only create (see `precondition::pin_apply_create`).
            if is_apply(exchange, path) {
                return Ok(Checked::Absent);
            }
            return Err(Outcome::new(
                json_bytes_response(code, bytes),
                Reason::Upstream,
            ));
        }
        // 401, 403 or any other 4xx: the client may not see it, so it does not exist.
        Err(self.masked(path, Reason::OwnershipMasked))
    }

    /// `Ok` when the object at `path` is owned, so that an answer about it may
    /// be shown; otherwise what the caller gets instead, the same masked 404 for
    /// another client's object as for a missing one.
    async fn confirm_owned(
        &self,
        exchange: &Exchange,
        path: &ResourcePath<'_>,
    ) -> Result<(), Outcome> {
        match self.check_ownership(exchange, path).await? {
            Checked::Owned(_) => Ok(()),
            Checked::Absent => Err(self.masked(path, Reason::OwnershipMasked)),
        }
    }

    /// The object at `path` read on the target, for a decision that depends on
    /// it. A target that answers 5xx or 429 says nothing about the object: that
    /// is a retryable 503 under `unanswered` (`check` names the decision in the
    /// log), never the 404 a controller takes for "already gone", nor a
    /// go-ahead. A target that cannot be reached is the 503 of any forwarded
    /// request, under its own reason.
    async fn read_object(
        &self,
        exchange: &Exchange,
        path: &ResourcePath<'_>,
        check: &str,
        unanswered: Reason,
    ) -> Result<(StatusCode, Bytes), Outcome> {
        let object_path = object_path(&self.group, &self.version, path);
        let (code, bytes) = self
            .target
            .call(exchange.deadline, Method::GET, &object_path, None)
            .await
            .map_err(|e| self.unavailable(e))?;
        if code.is_server_error() || code == StatusCode::TOO_MANY_REQUESTS {
            self.log_failure(
                unanswered,
                &format!("the {check} was answered {}", code.as_u16()),
            );
            return Err(Outcome::new(self.unavailable_response(None), unanswered));
        }
        Ok((code, bytes))
    }

    /// A write body read strictly and labelled for this client: exactly what the
    /// target will receive. The parse waits for room under
    /// [`PARSE_MEMORY_BUDGET`] (within the request deadline); the room is held until
    /// the returned permit is dropped, after the write is sent. The outer error is the answer when no room came
    /// before the deadline.
    async fn labelled_body(
        &self,
        exchange: &Exchange,
        bytes: &[u8],
        stamp: Stamp,
    ) -> Result<Result<(WriteBody, OwnedSemaphorePermit), BodyError>, Outcome> {
        let media_type = content_type(&exchange.headers);
        let admitted = match request_body::admit(media_type, bytes) {
            Ok(admitted) => admitted,
            Err(refused) => return Ok(Err(refused)),
        };
        let room = self.parse_room(exchange, admitted.cost()).await?;
        Ok(WriteBody::read(media_type, bytes, &admitted)
            .and_then(|write| self.stamped(write, stamp))
            .map(|write| (write, room)))
    }

    /// kube's 422 for a replacement of a custom resource without a resourceVersion.
    fn resource_version_required(&self, path: &ResourcePath<'_>) -> Outcome {
        let name = path.name.as_deref().unwrap_or_default();
        Outcome::new(
            json_response(
                StatusCode::UNPROCESSABLE_ENTITY,
                &status::resource_version_required(&path.resource, &self.group, name),
            ),
            Reason::Upstream,
        )
    }

    /// kube's 409 for a write whose caller's resourceVersion precondition (or,
    /// for a delete, uid precondition) is not the object's.
    fn stale(&self, path: &ResourcePath<'_>, name: &str) -> Outcome {
        let why = PreconditionError::Stale.to_string();
        Outcome::new(
            json_response(
                StatusCode::CONFLICT,
                &status::conflict(&path.resource, &self.group, name, &why),
            ),
            Reason::Upstream,
        )
    }

    /// Room under [`PARSE_MEMORY_BUDGET`] for a read that takes `cost` bytes,
    /// waited for within the request deadline; held until the permit is dropped.
    /// A read costlier than the whole budget waits for all of it.
    async fn parse_room(
        &self,
        exchange: &Exchange,
        cost: usize,
    ) -> Result<OwnedSemaphorePermit, Outcome> {
        let permits = u32::try_from(cost.min(PARSE_MEMORY_BUDGET)).unwrap_or(u32::MAX);
        let room = tokio::time::timeout_at(
            exchange.deadline,
            Arc::clone(&self.parse_budget).acquire_many_owned(permits),
        )
        .await;
        match room {
            Ok(Ok(room)) => Ok(room),
            _ => Err(self.unavailable(ForwardError::Deadline)),
        }
    }

    /// The caller's whole body, read within the request's deadline (see
    /// [`read_request`]).
    async fn request_body(
        &self,
        exchange: &Exchange,
        body: hyper::body::Incoming,
    ) -> Result<Bytes, Outcome> {
        read_request(transport::stream(body), exchange.deadline, &self.metrics).await
    }

    /// Reads a write body strictly and labels it as `stamp` says (no budget: see
    /// `labelled_body`).
    fn label(
        &self,
        headers: &HeaderMap,
        bytes: &[u8],
        stamp: Stamp,
    ) -> Result<WriteBody, BodyError> {
        WriteBody::parse(content_type(headers), bytes).and_then(|write| self.stamped(write, stamp))
    }

    /// A body read, labelled as `stamp` says.
    fn stamped(&self, mut write: WriteBody, stamp: Stamp) -> Result<WriteBody, BodyError> {
        match stamp {
            Stamp::Never => return Ok(write),
            Stamp::UnlessOwnerNamed if ownership::names_an_owner(&write)? => return Ok(write),
            Stamp::Always | Stamp::UnlessOwnerNamed => {}
        }
        ownership::stamp_owner_labels(&self.owner, &mut write)?;
        Ok(write)
    }

    // ---------------------------------------------------------------- namespaces

    /// A namespaced write needs its namespace on the client (else 404) and mirrors it
    /// onto the target when missing there. `true` when the write `may_create` its
    /// object and the namespace is being deleted: kube refuses that creation (see
    /// `refuse_create_while_terminating`), and nothing is mirrored. A name that is no DNS-1123 label
    /// names no namespace anywhere: it is answered as missing at once, as kube's
    /// admission answers it, without asking either cluster about it (`default?x`
    /// would ask them about `default`) and without entering the known-namespace set.
    async fn ensure_namespace(
        &self,
        namespace: &str,
        may_create: bool,
        deadline: Instant,
    ) -> Result<bool, Outcome> {
        if !crproxy_core::config::is_dns_label(namespace) {
            return Err(namespace_missing(namespace));
        }
        // The watch-fed cache answers from memory; a miss may only mean the
        // namespace was created a moment ago, so it is confirmed with a GET, and so
        // is a namespace it shows terminating when that would refuse a create.
        let state = match self.client_namespaces.state(namespace) {
            Some(NamespaceState::Active) => NamespaceState::Active,
            Some(NamespaceState::Terminating) if !may_create => NamespaceState::Terminating,
            _ => self.confirm_client_namespace(namespace, deadline).await?,
        };
        let creates_refused = state == NamespaceState::Terminating && may_create;
        if !creates_refused {
            self.ensure_target_namespace(namespace, deadline).await?;
        }
        Ok(creates_refused)
    }

    async fn confirm_client_namespace(
        &self,
        namespace: &str,
        deadline: Instant,
    ) -> Result<NamespaceState, Outcome> {
        let namespaces = kube::Api::<Namespace>::all(self.client.clone());
        let check = tokio::time::timeout_at(deadline, namespaces.get(namespace)).await;
        match check.map(|r| r.map_err(crproxy_kube::Error::from)) {
            Err(_) => Err(self.unavailable(ForwardError::Deadline)),
            Ok(Err(e)) if e.is_not_found() => Err(namespace_missing(namespace)),
            Ok(Err(e)) => {
                tracing::warn!(%namespace, error = %e, "checking the namespace on the client cluster failed");
                Err(Outcome::new(
                    self.unavailable_response(Some(&format!(
                        "checking namespace {namespace:?} on the client cluster: {e}"
                    ))),
                    Reason::Upstream,
                ))
            }
            Ok(Ok(found)) => Ok(NamespaceState::of(&found)),
        }
    }

    /// kube's namespace lifecycle admission refuses to create anything in a
    /// namespace being deleted, so that its deletion can finish: a 403 naming the
    /// object, with a `NamespaceTerminating` cause. The body is read first (under
    /// the parse budget, as every write's), as kube decodes it before admission:
    /// an unreadable one gets the same 400 or 415 as any other write. The object
    /// is named as kube's admission names it: its name, else its generateName,
    /// else "Unknown".
    async fn refuse_create_while_terminating(
        &self,
        exchange: &Exchange,
        path: &ResourcePath<'_>,
        body: hyper::body::Incoming,
    ) -> Outcome {
        let bytes = match self.request_body(exchange, body).await {
            Ok(bytes) => bytes,
            Err(outcome) => return outcome,
        };
        let document = match self.labelled_body(exchange, &bytes, Stamp::Never).await {
            Ok(Ok((write, _room))) => write.document(),
            Ok(Err(error)) => Err(error),
            Err(outcome) => return outcome,
        };
        let document = match document {
            Ok(document) => document,
            Err(error) => return refused_body(&error),
        };
        let metadata = &document["metadata"];
        let name = [&metadata["name"], &metadata["generateName"]]
            .into_iter()
            .filter_map(Value::as_str)
            .find(|name| !name.is_empty())
            .unwrap_or("Unknown");
        self.namespace_terminating(path, name)
    }

    /// An all-mode server-side apply into a namespace being deleted. kube's
    /// lifecycle admission judges an apply of a missing object as a create, so the
    /// object is looked for on the target first: missing, the apply is refused as
    /// a create; there, the apply goes pinned to the uid the look found, so that
    /// an object deleted between the look and the apply makes kube refuse it (409,
    /// "uid mismatch"; 422 for an object made again with another uid) instead of
    /// creating it, and the look is made again, [`PINNED_ATTEMPTS`] times in all;
    /// a refusal whose object the next look finds unchanged is the apply's own. A body naming a uid of its own goes as it
    /// came: it can never create. A target that cannot say whether the object
    /// exists gets a retryable 503 ([`Self::read_object`]); one whose look answers
    /// anything but 200 or 404 gets the apply unpinned, as before there was a look.
    /// The body is read as owned mode reads every write (docs/operations.md), so
    /// one that reading refuses is refused here rather than forwarded.
    async fn apply_while_terminating(
        &self,
        exchange: &Exchange,
        path: &ResourcePath<'_>,
        body: hyper::body::Incoming,
    ) -> Outcome {
        let bytes = match self.request_body(exchange, body).await {
            Ok(bytes) => bytes,
            Err(outcome) => return outcome,
        };
        // The document keeps its room under the parse budget until it is sent.
        let (mut document, _room) = match self.labelled_body(exchange, &bytes, Stamp::Never).await {
            Ok(Ok((document, room))) => (document, room),
            Ok(Err(error)) => return refused_body(&error),
            Err(outcome) => return outcome,
        };
        if precondition::names_a_uid(&document) {
            return self.forward_write(exchange, None, bytes.clone()).await;
        }
        let media_type = Some(document.body_type.media_type());
        // The uid the last attempt was pinned to, and the target's refusal of it.
        let mut refused: Option<(String, Outcome)> = None;
        for _ in 0..PINNED_ATTEMPTS {
            let found = self
                .read_object(exchange, path, "existence check", Reason::Upstream)
                .await;
            let uid = match found {
                Err(outcome) => return outcome,
                Ok((code, _)) if code == StatusCode::NOT_FOUND => {
                    return self.apply_create_refused(path)
                }
                Ok((code, object)) if code == StatusCode::OK => {
                    serde_json::from_slice::<Value>(&object)
                        .ok()
                        .as_ref()
                        .and_then(Pin::of)
                        .map(|pin| pin.uid)
                }
                Ok(_) => None,
            };
            let Some(uid) = uid else {
                return self.forward_write(exchange, None, bytes.clone()).await;
            };
            // The object the apply was refused for is still there: the refusal
            // was the apply's own (a field conflict, say), not the pin's.
            match refused {
                Some((refused_uid, outcome)) if refused_uid == uid => return outcome,
                _ => {}
            }
            if let Err(error) = precondition::pin_uid(&mut document, &uid) {
                return precondition_refused(&error);
            }
            let outcome = self
                .forward_pinned(
                    exchange,
                    media_type,
                    PinnedRequest::Body(document.to_bytes()),
                )
                .await;
            if !pin_may_have_refused(outcome.response.status()) {
                return outcome;
            }
            refused = Some((uid, outcome));
        }
        match refused {
            Some((_, outcome)) => outcome,
            // The loop runs at least once.
            None => self.upstream_failure("no attempt left for the pinned apply"),
        }
    }

    /// The 403 for a server-side apply that would create its object (named by the
    /// path) in a namespace being deleted.
    fn apply_create_refused(&self, path: &ResourcePath<'_>) -> Outcome {
        self.namespace_terminating(path, path.name.as_deref().unwrap_or_default())
    }

    fn namespace_terminating(&self, path: &ResourcePath<'_>, name: &str) -> Outcome {
        let namespace = path.namespace.as_deref().unwrap_or_default();
        Outcome::new(
            json_response(
                StatusCode::FORBIDDEN,
                &status::namespace_terminating(&path.resource, &self.group, name, namespace),
            ),
            Reason::Upstream,
        )
    }

    /// Mirrors the namespace (a DNS-1123 label, which needs no escaping) onto the
    /// target unless it is known to be there.
    async fn ensure_target_namespace(
        &self,
        namespace: &str,
        deadline: Instant,
    ) -> Result<(), Outcome> {
        if locks::lock(&self.target_namespaces).contains(namespace) {
            return Ok(());
        }
        let path = format!("/api/v1/namespaces/{namespace}");
        let (code, _) = self
            .target
            .call(deadline, Method::GET, &path, None)
            .await
            .map_err(|e| self.unavailable(e))?;
        if code.is_server_error() {
            return Err(self.server_error(code));
        }
        // Only a namespace the target shows is known to be there. Any other
        // answer (404; or 401, 403, 429 from an identity that may create
        // namespaces but not read them, or was throttled) leaves the create to
        // tell: its 409 says the namespace exists.
        if !code.is_success() {
            let manifest = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace},
            });
            let (created, body) = self
                .target
                .call(
                    deadline,
                    Method::POST,
                    "/api/v1/namespaces",
                    Some(Bytes::from(manifest.to_string())),
                )
                .await
                .map_err(|e| self.unavailable(e))?;
            // An identity that may neither read nor create namespaces writes only
            // into namespaces made for it: the write itself tells whether this
            // one is there (a 404 takes it out of the known set again).
            let neither_allowed = code == StatusCode::FORBIDDEN && created == StatusCode::FORBIDDEN;
            // Logged only when the namespace was made: after a GET the identity
            // may not make, the create's 409 says it was there all along.
            if created.is_success() {
                tracing::info!(%namespace, target = %self.metrics.target_label(), "creating namespace on target cluster");
            }
            if !(created.is_success() || created == StatusCode::CONFLICT || neither_allowed) {
                tracing::warn!(%namespace, target = %self.metrics.target_label(), code = created.as_u16(), body = %String::from_utf8_lossy(&body), "creating namespace on target cluster failed");
                // The target refused the proxy's identity itself: said as any
                // request's 401 is.
                if created == StatusCode::UNAUTHORIZED {
                    return Err(self.target_auth_failed(Reason::Upstream));
                }
                return Err(Outcome::new(
                    self.unavailable_response(Some(&format!(
                        "creating namespace {namespace:?} on the target failed with {created}"
                    ))),
                    Reason::Upstream,
                ));
            }
        }
        locks::lock(&self.target_namespaces).insert(namespace.to_string());
        Ok(())
    }

    // ---------------------------------------------------------------- forwarding

    /// GETs the request's own path and query from the target within the request
    /// deadline, with the caller's headers changed as `inspected` says when the
    /// proxy reads or rewrites the answer; the response body is left to the caller.
    async fn get_from_target(
        &self,
        exchange: &Exchange,
        inspected: Option<&Inspected>,
    ) -> Result<Response<ProxyBody>, ForwardError> {
        self.target
            .send_get(
                exchange.deadline,
                exchange.target_path(),
                &exchange.headers,
                inspected,
            )
            .await
    }

    /// Sends a mutation pinned to a checked state: its body at the caller's path
    /// and query, or a delete without a body at the caller's path with the
    /// pinning query.
    async fn forward_pinned(
        &self,
        exchange: &Exchange,
        media_type: Option<&'static str>,
        pinned: PinnedRequest,
    ) -> Outcome {
        match pinned {
            PinnedRequest::Body(body) => {
                self.forward_write(exchange, media_type, Bytes::from(body))
                    .await
            }
            PinnedRequest::Query(query) => {
                let path = with_query(exchange.path(), &query);
                let path = TargetPath::Written(&path);
                self.forward(exchange, None, path, transport::empty(), false)
                    .await
            }
        }
    }

    /// A write whose body is in hand, forwarded to the caller's path. A namespace
    /// deleted on the target after it was mirrored is mirrored again: the target
    /// refuses a create into it with 404 `namespaces "<ns>" not found`, which
    /// would tell the caller its namespace is missing on the client; the write
    /// is then sent once more.
    async fn forward_write(
        &self,
        exchange: &Exchange,
        media_type: Option<&'static str>,
        body: Bytes,
    ) -> Outcome {
        let send = |body: Bytes| {
            self.forward(
                exchange,
                media_type,
                exchange.target_path(),
                transport::full(body),
                false,
            )
        };
        let outcome = send(body.clone()).await;
        let Some(namespace) = exchange.namespace.as_deref() else {
            return outcome;
        };
        if outcome.response.status() != StatusCode::NOT_FOUND {
            return outcome;
        }
        let (parts, answer, reason) = match self.read_json_answer(exchange, outcome).await {
            Ok(read) => read,
            Err(outcome) => return outcome,
        };
        if !not_found::names_missing_namespace(&answer, namespace) {
            return Outcome::new(Response::from_parts(parts, transport::full(answer)), reason);
        }
        // `forward` forgot the namespace on the 404: this mirrors it again.
        if let Err(outcome) = self
            .ensure_target_namespace(namespace, exchange.deadline)
            .await
        {
            return outcome;
        }
        send(body).await
    }

    /// Sends a request to the target with the caller's headers (and, for a body
    /// the proxy wrote, `media_type` as its `Content-Type`) and maps its response:
    /// 5xx on non-watch requests becomes the retryable 503; everything else
    /// streams back unchanged.
    async fn forward(
        &self,
        exchange: &Exchange,
        media_type: Option<&'static str>,
        path_and_query: TargetPath<'_>,
        body: ProxyBody,
        watch: bool,
    ) -> Outcome {
        let response = self
            .target
            .send_before(
                (!watch).then_some(exchange.deadline),
                exchange.method.clone(),
                path_and_query,
                &exchange.headers,
                media_type,
                body,
            )
            .await;
        let response = match response {
            Ok(response) => response,
            Err(e) => return self.unavailable(e),
        };
        if !watch && response.status().is_server_error() {
            return self.server_error(response.status());
        }
        if exchange.method != Method::GET && response.status() == StatusCode::NOT_FOUND {
            // The target lost a namespace we believed it had: check again next time.
            if let Some(namespace) = &exchange.namespace {
                locks::lock(&self.target_namespaces).remove(namespace);
            }
        }
        let (parts, body) = response.into_parts();
        Outcome::new(Response::from_parts(parts, body), Reason::Upstream)
    }

    // ---------------------------------------------------------------- responses

    fn target_auth_failed(&self, reason: Reason) -> Outcome {
        Outcome::new(
            json_response(
                StatusCode::UNAUTHORIZED,
                &status::target_auth_failed(&self.target_name, &self.group, &self.version),
            ),
            reason,
        )
    }

    fn masked(&self, path: &ResourcePath<'_>, reason: Reason) -> Outcome {
        let name = path.name.as_deref().unwrap_or("");
        Outcome::new(
            json_response(
                StatusCode::NOT_FOUND,
                &status::not_found(&path.resource, &self.group, name),
            ),
            reason,
        )
    }

    /// A named request's 404 from the target, answered exactly as a masked object
    /// is ([`Self::masked`]): were the target's own answer passed on, its headers
    /// and bytes would tell a caller whether a name it may not see belongs to
    /// another tenant's object or to none. Left as the target wrote it only when it
    /// is a JSON `Status` about something else than this object (a resource or a
    /// namespace the target does not have), which no object's presence changes.
    /// The request stays counted as the target's answer.
    async fn not_found_as_masked(
        &self,
        exchange: &Exchange,
        path: &ResourcePath<'_>,
        outcome: Outcome,
    ) -> Outcome {
        if outcome.reason != Reason::Upstream || outcome.response.status() != StatusCode::NOT_FOUND
        {
            return outcome;
        }
        let (parts, body) = outcome.response.into_parts();
        let read = transport::read_limited(body, MAX_BUFFERED_BODY);
        let bytes = match transport::within(exchange.deadline, read).await {
            Ok(bytes) => bytes,
            Err(e) => return self.unavailable(e),
        };
        let name = path.name.as_deref().unwrap_or_default();
        if is_plain_json_object(&parts.headers)
            && !not_found::may_be_about(&bytes, &path.resource, name)
        {
            return Outcome::new(
                Response::from_parts(parts, transport::full(bytes)),
                outcome.reason,
            );
        }
        self.masked(path, Reason::Upstream)
    }

    fn unavailable(&self, error: ForwardError) -> Outcome {
        if error.reason() == Reason::Deadline {
            self.metrics.termination(Reason::Deadline);
        }
        let cause = match &error {
            ForwardError::Pool(e) if !is_availability(e.reason()) => Some(e.to_string()),
            ForwardError::Send(message) => Some(message.clone()),
            ForwardError::Deadline => Some(error.to_string()),
            _ => None,
        };
        let reason = error.reason();
        self.log_failure(reason, &error);
        Outcome::new(self.unavailable_response(cause.as_deref()), reason)
    }

    /// The 503 for a target that answered `code` (a 5xx) where the proxy needed an
    /// answer it could use.
    fn server_error(&self, code: StatusCode) -> Outcome {
        self.upstream_failure(&format!("target answered {}", code.as_u16()))
    }

    /// The 503 for a request the proxy could not complete for `cause` although the
    /// target was reached.
    fn upstream_failure(&self, cause: &str) -> Outcome {
        self.log_failure(Reason::Upstream, &cause);
        Outcome::new(self.unavailable_response(None), Reason::Upstream)
    }

    /// One warn line per request answered 503/504 for want of a usable target, at
    /// the default level, so log-based alerts see every one. The error names the
    /// placeholder upstream first, as the spec's alerting advice matches on it.
    fn log_failure(&self, reason: Reason, error: &dyn std::fmt::Display) {
        tracing::warn!(
            target = %self.metrics.target_label(),
            group_version = %self.group_version,
            %reason,
            error = %format_args!("{}: {error}", self.upstream),
            "request to target failed"
        );
    }

    fn unavailable_response(&self, cause: Option<&str>) -> Response<ProxyBody> {
        let body = status::target_unavailable(&self.target_name, &self.group, &self.version, cause);
        let mut response = json_response(StatusCode::SERVICE_UNAVAILABLE, &body);
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        response
    }
}

/// A request that has no answer yet. Dropped before one is made (the caller
/// went away, so hyper dropped the handler's future), it counts the request
/// with reason `canceled` and the 503 a failed proxied request gets: without
/// it, such requests were in no `vcluster_proxy_request_total` series at all.
struct Unanswered<'p> {
    proxy: &'p GroupVersionProxy,
    verb: &'static str,
}

impl Unanswered<'_> {
    /// The request has its answer: it is counted with it, not here.
    fn answered(self) {
        // Only a borrow inside: forgetting it frees nothing and skips the count.
        std::mem::forget(self);
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        self.proxy.metrics.request(
            &self.proxy.group_version,
            self.verb,
            StatusCode::SERVICE_UNAVAILABLE.as_u16(),
            Reason::Canceled,
        );
    }
}

/// How long a discovery request waits for the target's whole answer before it
/// is answered from the fallback document: kube-aggregator's availability check
/// gives a discovery GET 5 s, then marks the APIService unavailable
/// (`FailedDiscoveryCheck`), so a target that accepts and never answers (or
/// stalls in its body) must not hold discovery for the whole request deadline.
const DISCOVERY_WAIT: std::time::Duration = std::time::Duration::from_secs(4);

/// Whether kube-apiserver answers a named GET with `code` before it reads the
/// object, so that the answer is the same whether the object exists or not:
/// authentication (401), authorization (403) and priority and fairness (429) run
/// first, and 200 and 404 are the read's own answers (judged by their labels,
/// and masked, elsewhere). Any other code may come from turning the read object
/// into the answer (a 400 for a Table's `includeObject`; for a list media type
/// asked of one object, a 500 for a custom resource and a 406 for a typed one),
/// and would tell a caller that another client's object exists. (A write's
/// answers are judged otherwise: see `may_describe_the_object_found`.)
fn decided_before_the_object_is_read(code: StatusCode) -> bool {
    matches!(
        code,
        StatusCode::OK
            | StatusCode::NOT_FOUND
            | StatusCode::UNAUTHORIZED
            | StatusCode::FORBIDDEN
            | StatusCode::TOO_MANY_REQUESTS
    )
}

/// Whether `status` is a Status written by kube for an admission webhook's
/// denial (`webhookerrors.ToStatusErr`), which keeps the webhook's own code.
fn is_a_webhooks_denial(status: &[u8]) -> bool {
    serde_json::from_slice::<Value>(status).is_ok_and(|status| {
        status["message"]
            .as_str()
            .is_some_and(|message| message.starts_with("admission webhook "))
    })
}

/// Whether the target's answer to a pinned write may be the pin's refusal: a
/// precondition that failed (409), or a uid the object no longer has (422, the
/// uid is immutable).
fn pin_may_have_refused(code: StatusCode) -> bool {
    code == StatusCode::CONFLICT || code == StatusCode::UNPROCESSABLE_ENTITY
}

/// Peer-availability reasons: the pool refused before any dial.
fn is_availability(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::NoPeer | Reason::StalePeers | Reason::AllQuarantined
    )
}

/// Which owner labels a write body gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stamp {
    /// This client's, over whatever the body says.
    Always,
    /// This client's when the body names no owner (all-mode replaces).
    UnlessOwnerNamed,
    /// None: the body is a view of the object that has no labels (a Scale).
    Never,
}

/// An owned mutation's request as read, once, from the caller's body.
enum Mutation {
    /// A delete's options (or why they cannot be read), kept as text for every
    /// attempt.
    Delete(Result<DeleteOptions, PreconditionError>),
    /// A write: the caller's bytes, how they are labelled and sent, and the
    /// document read from them until an attempt takes it.
    Write {
        bytes: Bytes,
        stamp: Stamp,
        media_type: &'static str,
        first: Option<WriteBody>,
    },
}

impl Mutation {
    /// The media type of what every attempt sends: a delete's pin is in the
    /// proxy's JSON, whatever the caller's Content-Type said of the body it did
    /// not send; a write goes as its document was read.
    fn media_type(&self) -> &'static str {
        match self {
            Mutation::Delete(_) => BodyType::Json.media_type(),
            Mutation::Write { media_type, .. } => media_type,
        }
    }

    fn delete_options(&self) -> Option<&Result<DeleteOptions, PreconditionError>> {
        match self {
            Mutation::Delete(options) => Some(options),
            Mutation::Write { .. } => None,
        }
    }
}

/// What one attempt of an owned mutation pins (see `GroupVersionProxy::attempt`).
enum Attempt<'m> {
    Delete(&'m Result<DeleteOptions, PreconditionError>),
    Write(WriteBody),
}

/// Whether a write's body is the object itself, labels and all: a write of the
/// resource or of its `/status`. Other subresources (`/scale`) take a view of
/// the object, which carries its uid and resourceVersion and no labels.
fn body_is_the_object(path: &ResourcePath<'_>) -> bool {
    path.subresource
        .as_deref()
        .is_none_or(|sub| sub == "status")
}

/// A delete's body pinned to `pin`, or why its options (read once, see
/// `owned_mutation`) cannot carry the pin.
fn pinned_delete(
    options: &Result<DeleteOptions, PreconditionError>,
    pin: &Pin,
) -> Result<PinnedRequest, PreconditionError> {
    options.as_ref().map_err(Clone::clone)?.pinned_delete(pin)
}

/// Reads a request body whole, at most [`MAX_REQUEST_BODY`] bytes and within the
/// request's deadline: a body that never completes ends like any request past its
/// 60 s cap, counted as a `deadline` termination here (the 504 it gets is a whole
/// body, so the response's own deadline never counts it again).
async fn read_request(
    body: ProxyBody,
    deadline: Instant,
    metrics: &TargetMetrics,
) -> Result<Bytes, Outcome> {
    let read = transport::read_limited(body, MAX_REQUEST_BODY);
    let Ok(read) = tokio::time::timeout_at(deadline, read).await else {
        metrics.termination(Reason::Deadline);
        return Err(Outcome::new(
            json_response(
                StatusCode::GATEWAY_TIMEOUT,
                &status::timeout("request did not complete within the allotted timeout: the request body did not arrive"),
            ),
            Reason::Deadline,
        ));
    };
    read.map_err(|e| match e {
        ForwardError::TooLarge => refused_body(&BodyError::TooLarge),
        _ => Outcome::new(
            json_response(
                StatusCode::BAD_REQUEST,
                &status::bad_request(format!("reading the request body: {e}")),
            ),
            Reason::Upstream,
        ),
    })
}

/// A write body refused because it cannot be read the way it would be sent.
fn refused_body(error: &BodyError) -> Outcome {
    let code = StatusCode::from_u16(error.code()).unwrap_or(StatusCode::BAD_REQUEST);
    Outcome::new(json_response(code, &error.status()), Reason::Upstream)
}

fn scope_error(error: &ownership::ScopeError) -> Outcome {
    Outcome::new(
        json_response(
            StatusCode::BAD_REQUEST,
            // A selector error carries kube's own prefix.
            &status::bad_request(error.to_string()),
        ),
        Reason::Upstream,
    )
}

/// A target answer already read whole, passed on as JSON.
fn json_bytes_response(code: StatusCode, bytes: Bytes) -> Response<ProxyBody> {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(transport::full(bytes))
        .unwrap_or_else(|_| fallback_500())
}

/// Objects one page of an owned deletecollection's list asks for (as kube's own
/// clients page). As metadata, a page stays far below [`MAX_BUFFERED_BODY`].
const DELETE_COLLECTION_PAGE: usize = 500;

/// Times an owned deletecollection lists again from the start when its continue
/// token expired (410) between pages.
const DELETE_COLLECTION_RESTARTS: u32 = 3;

/// The pages of an owned deletecollection's list: metadata only (what the
/// ownership judgement and the pin read), or whole objects from a target that
/// cannot answer so.
const METADATA_LIST: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

/// What an owned deletecollection does with one answer to its list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListStep {
    /// A page: delete its owned objects.
    Page,
    /// The continue token expired: list again from the start.
    Restart,
    /// The retryable 503: the target failed, or the list kept expiring.
    Unavailable,
    /// The target's answer goes to the caller as it is (400 for bad list options,
    /// say).
    PassOn,
}

/// The step after a list answer with `code`, for a page asked for with a continue
/// token (`continuing`) after `restarts` restarts. A caller that asked for one
/// exact resourceVersion (`exact`) gets the 410: listing what is current instead
/// would delete objects its list never held.
fn list_step(code: StatusCode, continuing: bool, restarts: u32, exact: bool) -> ListStep {
    match code {
        StatusCode::OK => ListStep::Page,
        StatusCode::GONE if continuing && exact => ListStep::PassOn,
        StatusCode::GONE if continuing && restarts < DELETE_COLLECTION_RESTARTS => {
            ListStep::Restart
        }
        StatusCode::GONE if continuing => ListStep::Unavailable,
        code if code.is_server_error() => ListStep::Unavailable,
        _ => ListStep::PassOn,
    }
}

/// The resource a request names, whether it was classified as a resource request
/// or refused for its shape or method (read from its path then; only such
/// requests pay for a second reading).
fn requested_resource<'a>(
    kind: &'a Result<RequestKind, request::PathError>,
    path: &str,
    group: &str,
    version: &str,
) -> Option<Cow<'a, str>> {
    match kind {
        Ok(RequestKind::Resource { path, .. }) => Some(Cow::Borrowed(&path.resource)),
        Ok(RequestKind::Discovery) => None,
        Ok(RequestKind::Upgrade) | Err(_) => {
            request::path_resource(path, group, version).map(Cow::Owned)
        }
    }
}

/// A body or delete options the pin cannot go with (kube would refuse them too): 400.
fn precondition_refused(error: &PreconditionError) -> Outcome {
    Outcome::new(
        json_response(
            StatusCode::BAD_REQUEST,
            &status::bad_request(error.to_string()),
        ),
        Reason::Upstream,
    )
}

/// The kind and apiVersion of the objects a deletecollection lists.
struct ObjectType {
    kind: Value,
    api_version: Value,
}

impl ObjectType {
    /// From the first listed object, which says; else (an empty first page) the
    /// list's kind without "List".
    fn of(first: Option<&Value>, list: &Value) -> ObjectType {
        match first.filter(|object| object.get("kind").is_some_and(Value::is_string)) {
            Some(object) => ObjectType {
                kind: object["kind"].clone(),
                api_version: object.get("apiVersion").cloned().unwrap_or(Value::Null),
            },
            None => ObjectType {
                kind: list
                    .get("kind")
                    .and_then(Value::as_str)
                    .and_then(|kind| kind.strip_suffix("List"))
                    .map_or(Value::Null, Value::from),
                api_version: list.get("apiVersion").cloned().unwrap_or(Value::Null),
            },
        }
    }
}

/// A listed item standing for a deleted object in a deletecollection's answer:
/// pages after the first list metadata only (`PartialObjectMetadata`), so the
/// item takes the kind and apiVersion of the objects listed. Its managedFields
/// go: every stand-in is held until the answer is sent.
fn listed_as_object(mut item: Value, object_type: Option<&ObjectType>) -> Value {
    let Some(object) = item.as_object_mut() else {
        return item;
    };
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("managedFields");
    }
    if let Some(object_type) = object_type.filter(|known| known.kind.is_string()) {
        object.insert("kind".into(), object_type.kind.clone());
        object.insert("apiVersion".into(), object_type.api_version.clone());
    }
    item
}

/// `list_query` without the caller's resourceVersion: it goes with the first
/// page of a listing only (kube refuses it beside a continue token, and after a
/// 410 it is what expired).
fn without_resource_version(list_query: &str) -> String {
    request::retain_query(list_query, |name| {
        !matches!(name, "resourceVersion" | "resourceVersionMatch")
    })
}

/// The query of one page of an owned deletecollection's list: the caller's list
/// options, `limit`, and the continue token after the first page (kube refuses a
/// resourceVersion next to one: the token carries the list's own).
fn page_query(list_query: &str, limit: usize, token: Option<&str>) -> String {
    let list_query = match token {
        Some(_) => without_resource_version(list_query),
        None => list_query.to_string(),
    };
    let mut parts: Vec<String> = list_query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    parts.push(format!("limit={limit}"));
    if let Some(token) = token {
        parts.push(format!("continue={}", request::encode_query_value(token)));
    }
    parts.join("&")
}

/// A list answer written from its envelope (without items) and items already JSON
/// text, without building one value of them all.
fn list_body(
    envelope: &serde_json::Map<String, Value>,
    items: &[Bytes],
) -> Result<Vec<u8>, serde_json::Error> {
    let size = items.iter().map(|item| item.len() + 1).sum::<usize>() + 256;
    let mut out = Vec::with_capacity(size);
    out.push(b'{');
    for (key, value) in envelope.iter().filter(|(key, _)| *key != "items") {
        serde_json::to_writer(&mut out, key)?;
        out.push(b':');
        serde_json::to_writer(&mut out, value)?;
        out.push(b',');
    }
    out.extend_from_slice(b"\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.extend_from_slice(b"]}");
    Ok(out)
}

/// Splits a deletecollection query into the list options (kept for the owned
/// list, without the caller's paging: every matching object is deleted, in the
/// proxy's own pages) and the delete options (sent with each pinned delete).
fn split_delete_collection_query(query: Option<&str>) -> (String, String) {
    const DELETE_OPTIONS: &[&str] = &[
        "dryRun",
        "gracePeriodSeconds",
        "propagationPolicy",
        "orphanDependents",
        "ignoreStoreReadErrorWithClusterBreakingPotential",
    ];
    const PAGING: &[&str] = &["limit", "continue"];
    // kube's deletecollection lists with the query's list options and never
    // watches: `watch` must not turn the proxy's own list into a watch. The other
    // watch options stay, so the target's list judges them as kube's validation
    // would (`sendInitialEvents` is refused for a list; bookmarks are ignored).
    let query = query.unwrap_or("");
    let list = request::retain_query(query, |name| {
        !DELETE_OPTIONS.contains(&name) && !PAGING.contains(&name) && name != "watch"
    });
    (
        list,
        request::retain_query(query, |name| DELETE_OPTIONS.contains(&name)),
    )
}

/// Whether the request is a server-side apply of an object (not of a subresource):
/// the one PATCH that creates a missing object.
fn is_apply(exchange: &Exchange, path: &ResourcePath<'_>) -> bool {
    exchange.method == Method::PATCH
        && path.subresource.is_none()
        && content_type(&exchange.headers).and_then(BodyType::from_content_type)
            == Some(BodyType::ApplyPatchYaml)
}

/// How many times a subresource GET is checked and read while its object keeps
/// changing in between, before it is answered as not found.
const SUBRESOURCE_READS: u32 = 3;

/// A subresource answer showed another state of its object than the one checked.
struct SubresourceMoved;

/// 404 for a write into a namespace the client does not have, in kube's words.
fn namespace_missing(namespace: &str) -> Outcome {
    Outcome::new(
        json_response(
            StatusCode::NOT_FOUND,
            &status::namespace_not_found(namespace),
        ),
        Reason::NamespaceMissing,
    )
}

fn path_error(error: &request::PathError) -> Outcome {
    if matches!(error, request::PathError::NotFound) {
        // What an API server answers for a path it does not serve.
        let response = Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .header("x-content-type-options", "nosniff")
            .body(transport::full("404 page not found\n"))
            .unwrap_or_else(|_| fallback_500());
        return Outcome::new(response, Reason::Upstream);
    }
    let code = StatusCode::from_u16(error.status_code()).unwrap_or(StatusCode::BAD_REQUEST);
    Outcome::new(json_response(code, &error.status()), Reason::Upstream)
}

/// A JSON answer the proxy writes itself, ended by a newline as kube's encoder
/// ends every JSON answer (`json.NewEncoder(w).Encode`).
fn json_response(code: StatusCode, body: &Value) -> Response<ProxyBody> {
    let mut text = body.to_string();
    text.push('\n');
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(transport::full(text))
        .unwrap_or_else(|_| fallback_500())
}

fn fallback_500() -> Response<ProxyBody> {
    let mut response = Response::new(transport::empty());
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
}

fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(http::header::UPGRADE)
        || headers
            .get_all(http::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
}

/// The answer to a HEAD: `response`'s status and headers, with the
/// `Content-Length` of the body a GET gets when it is known (as Go's server
/// gives it), and no body. Dropping the body lets go of the target's answer at
/// once.
fn without_body_if(head: bool, response: Response<ProxyBody>) -> Response<ProxyBody> {
    if !head {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    if let Some(length) = hyper::body::Body::size_hint(&body).exact() {
        parts
            .headers
            .entry(http::header::CONTENT_LENGTH)
            .or_insert_with(|| HeaderValue::from(length));
    }
    Response::from_parts(parts, transport::empty())
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

/// The `Accept` a named GET asks the target with ([`ownership::inspectable_accept`]):
/// the caller's own value, shared rather than copied, when it needs no change.
fn inspectable_accept_header(caller: Option<&HeaderValue>) -> HeaderValue {
    const JSON: &str = "application/json";
    let text = caller.and_then(|value| value.to_str().ok());
    match (ownership::inspectable_accept(text), caller) {
        (Cow::Borrowed(kept), Some(caller)) if kept.as_bytes() == caller.as_bytes() => {
            caller.clone()
        }
        (kept, _) if kept == JSON => HeaderValue::from_static(JSON),
        (kept, _) => {
            HeaderValue::from_str(&kept).unwrap_or_else(|_| HeaderValue::from_static(JSON))
        }
    }
}

fn accept_of(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
}

fn content_type(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
}

/// Whether an answer's headers say it is an object as JSON, uncompressed: not a
/// Table or another `as=` rendering, not YAML or CBOR.
fn is_plain_json_object(headers: &HeaderMap) -> bool {
    let Some(content_type) = content_type(headers) else {
        return false;
    };
    BodyType::from_content_type(content_type) == Some(BodyType::Json)
        && !content_type
            .split(';')
            .skip(1)
            .any(|parameter| parameter.trim().to_ascii_lowercase().starts_with("as="))
        && !headers.contains_key(http::header::CONTENT_ENCODING)
}

fn with_query(path: &str, query: &str) -> String {
    if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    }
}

/// Whether `path` is `/openapi/v3/apis/<group>/<version>`. Asked of every GET, so
/// compared piece by piece rather than against a formatted path.
fn is_openapi_document_of(path: &str, group: &str, version: &str) -> bool {
    path.strip_prefix("/openapi/v3/apis/")
        .and_then(|rest| rest.strip_prefix(group))
        .and_then(|rest| rest.strip_prefix('/'))
        == Some(version)
}

/// The object a named request is about, without any subresource: ownership is a
/// property of the object, so `/status` and `/scale` are checked on the object.
fn object_path(group: &str, version: &str, path: &ResourcePath<'_>) -> String {
    resource_path(
        group,
        version,
        path.namespace.as_deref(),
        &path.resource,
        path.name.as_deref(),
    )
}

/// `/apis/<group>/<version>[/namespaces/<namespace>]/<resource>[/<name>]` from
/// decoded segments, each escaped again.
fn resource_path(
    group: &str,
    version: &str,
    namespace: Option<&str>,
    resource: &str,
    name: Option<&str>,
) -> String {
    let mut out = format!("/apis/{group}/{version}");
    if let Some(namespace) = namespace {
        out.push_str("/namespaces/");
        out.push_str(&request::encode_segment(namespace));
    }
    out.push('/');
    out.push_str(&request::encode_segment(resource));
    if let Some(name) = name {
        out.push('/');
        out.push_str(&request::encode_segment(name));
    }
    out
}

/// Whether `segment` (a name a target listed) is a name kube can store: not
/// empty, not `.` or `..`, without `/` or `%`. Anything else, `?` and `#`
/// included, is escaped when the path is built ([`request::encode_segment`]).
fn is_path_segment(segment: &str) -> bool {
    !segment.is_empty() && segment != "." && segment != ".." && !segment.contains(['/', '%'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_gets_accept_is_the_callers_own_value_when_it_needs_no_change() {
        let sent =
            HeaderValue::from_str("application/json;as=Table;v=v1;g=meta.k8s.io").expect("valid");
        let asked = inspectable_accept_header(Some(&sent));
        assert_eq!(asked, sent);
        assert_eq!(
            asked.as_bytes().as_ptr(),
            sent.as_bytes().as_ptr(),
            "shared, not copied"
        );
        for (sent, asked) in [
            (
                Some("application/vnd.kubernetes.protobuf, application/json"),
                "application/json",
            ),
            (
                Some("application/json, application/yaml;q=0.5, application/json;as=Table"),
                "application/json,application/json;as=Table",
            ),
            (Some("*/*"), "application/json"),
            (None, "application/json"),
        ] {
            let sent = sent.map(|text| HeaderValue::from_str(text).expect("valid"));
            assert_eq!(inspectable_accept_header(sent.as_ref()), asked, "{sent:?}");
        }
    }

    #[test]
    fn only_uncompressed_json_objects_are_read_for_the_cache() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(*name, HeaderValue::from_static(value));
            }
            headers
        };
        for plain in [
            headers(&[("content-type", "application/json")]),
            headers(&[("content-type", "Application/JSON; charset=utf-8")]),
        ] {
            assert!(is_plain_json_object(&plain), "{plain:?}");
        }
        for other in [
            headers(&[]),
            headers(&[(
                "content-type",
                "application/json;as=Table;v=v1;g=meta.k8s.io",
            )]),
            headers(&[("content-type", "application/json; AS=PartialObjectMetadata")]),
            headers(&[("content-type", "application/yaml")]),
            headers(&[("content-type", "application/cbor")]),
            headers(&[
                ("content-type", "application/json"),
                ("content-encoding", "gzip"),
            ]),
        ] {
            assert!(!is_plain_json_object(&other), "{other:?}");
        }
    }

    #[test]
    fn upgrade_is_detected_from_either_header() {
        let mut headers = HeaderMap::new();
        assert!(!wants_upgrade(&headers));
        headers.insert(
            http::header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        assert!(wants_upgrade(&headers));
        let mut headers = HeaderMap::new();
        headers.insert(http::header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
        assert!(wants_upgrade(&headers));
    }

    #[test]
    fn the_callers_path_goes_to_the_target_as_sent_but_for_an_empty_query() {
        let exchange = |uri: &'static str| Exchange {
            method: Method::GET,
            path_and_query: Some(PathAndQuery::from_static(uri)),
            namespace: None,
            headers: HeaderMap::new(),
            deadline: Instant::now(),
        };
        for (sent, forwarded, as_parsed) in [
            (
                "/apis/g/v1/widgets?limit=1&x=%2F",
                "/apis/g/v1/widgets?limit=1&x=%2F",
                true,
            ),
            ("/apis/g/v1/widgets", "/apis/g/v1/widgets", true),
            ("/apis/g/v1/widgets?", "/apis/g/v1/widgets", false),
        ] {
            let exchange = exchange(sent);
            let target = exchange.target_path();
            assert_eq!(target.as_str(), forwarded, "{sent}");
            assert_eq!(matches!(target, TargetPath::Caller(_)), as_parsed, "{sent}");
        }
        let none = Exchange {
            path_and_query: None,
            ..exchange("/")
        };
        assert_eq!((none.path(), none.query()), ("", None));
    }

    #[test]
    fn ownership_is_checked_on_the_object_not_the_subresource() {
        let path = ResourcePath {
            namespace: Some("ns".into()),
            resource: "widgets".into(),
            name: Some("w".into()),
            subresource: Some("status".into()),
        };
        assert_eq!(
            object_path("example.com", "v1", &path),
            "/apis/example.com/v1/namespaces/ns/widgets/w"
        );
    }

    #[test]
    fn decoded_segments_are_escaped_back_into_one_segment_each() {
        let path = ResourcePath {
            namespace: Some("default?x".into()),
            resource: "widgets".into(),
            name: Some("w#1/a%".into()),
            subresource: None,
        };
        assert_eq!(
            object_path("example.com", "v1", &path),
            "/apis/example.com/v1/namespaces/default%3Fx/widgets/w%231%2Fa%25"
        );
    }

    /// A body whose first bytes arrive and whose end never does.
    fn endless_body() -> ProxyBody {
        let first = futures_util::stream::once(async {
            Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from_static(b"{")))
        });
        let stream = futures_util::StreamExt::chain(first, futures_util::stream::pending());
        http_body_util::BodyExt::boxed(http_body_util::BodyExt::map_err(
            http_body_util::StreamBody::new(stream),
            |e| -> crate::pool::BoxError { Box::new(e) },
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_never_completes_ends_at_the_request_deadline() {
        let metrics = crate::metrics::Metrics::new();
        let target = metrics.target("default/target");
        let started = Instant::now();
        let deadline = started + REQUEST_DEADLINE;
        // Bounded: without the deadline the read would wait forever.
        let outcome = tokio::time::timeout(
            REQUEST_DEADLINE * 2,
            read_request(endless_body(), deadline, &target),
        )
        .await
        .expect("the read ends by the deadline")
        .expect_err("no body");
        assert_eq!(outcome.response.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(outcome.reason, Reason::Deadline);
        assert_eq!(started.elapsed(), REQUEST_DEADLINE);
        let terminations: Vec<String> = metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("vcluster_proxy_request_terminations_total{"))
            .map(str::to_string)
            .collect();
        assert_eq!(terminations.len(), 1, "{terminations:?}");
        assert!(
            terminations[0].contains("reason=\"deadline\"") && terminations[0].ends_with(" 1"),
            "counted once: {terminations:?}"
        );
    }

    #[tokio::test]
    async fn a_body_over_three_mebibytes_is_refused_in_kubes_words() {
        let metrics = crate::metrics::Metrics::new();
        let target = metrics.target("default/target");
        let big = transport::full(vec![b' '; MAX_REQUEST_BODY + 1]);
        let far = Instant::now() + REQUEST_DEADLINE;
        let outcome = read_request(big, far, &target)
            .await
            .expect_err("too large");
        assert_eq!(outcome.response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let exact = transport::full(vec![b' '; MAX_REQUEST_BODY]);
        assert_eq!(
            read_request(exact, far, &target)
                .await
                .map(|b| b.len())
                .ok(),
            Some(MAX_REQUEST_BODY)
        );
    }

    #[test]
    fn deletecollection_query_splits_into_list_and_delete_options() {
        let (list, delete) = split_delete_collection_query(Some(
            "labelSelector=a%3Db&dryRun=All&limit=5&continue=x&propagationPolicy=Foreground&fieldSelector=metadata.name%3Dw&gracePeriodSeconds=0&watch=true&sendInitialEvents=true",
        ));
        assert_eq!(
            list,
            "labelSelector=a%3Db&fieldSelector=metadata.name%3Dw&sendInitialEvents=true"
        );
        assert_eq!(
            delete,
            "dryRun=All&propagationPolicy=Foreground&gracePeriodSeconds=0"
        );
        assert_eq!(
            split_delete_collection_query(None),
            (String::new(), String::new())
        );
    }

    #[test]
    fn only_this_group_versions_openapi_document_is_recognised() {
        let is = |path| is_openapi_document_of(path, "example.com", "v1");
        assert!(is("/openapi/v3/apis/example.com/v1"));
        for other in [
            "/openapi/v3/apis/example.com/v1/",
            "/openapi/v3/apis/example.com/v10",
            "/openapi/v3/apis/example.com/v",
            "/openapi/v3/apis/example.co/v1",
            "/openapi/v3/apis/example.comm/v1",
            "/openapi/v3/apis/example.com",
            "/openapi/v3/example.com/v1",
            "/apis/example.com/v1",
            "/openapi/v3",
        ] {
            assert!(!is(other), "{other}");
        }
    }

    #[test]
    fn a_deletecollection_list_restarts_only_on_an_expired_continue_token_a_few_times() {
        let check = |code: u16, continuing: bool, restarts: u32, expected: ListStep| {
            let code = StatusCode::from_u16(code).expect("status code");
            assert_eq!(
                list_step(code, continuing, restarts, false),
                expected,
                "{code} continuing={continuing} restarts={restarts}"
            );
        };
        check(200, false, 0, ListStep::Page);
        check(200, true, DELETE_COLLECTION_RESTARTS, ListStep::Page);
        check(410, true, 0, ListStep::Restart);
        check(410, true, DELETE_COLLECTION_RESTARTS - 1, ListStep::Restart);
        check(410, true, DELETE_COLLECTION_RESTARTS, ListStep::Unavailable);
        // Without a token, 410 is about the caller's own resourceVersion.
        check(410, false, 0, ListStep::PassOn);
        check(400, true, 0, ListStep::PassOn);
        check(403, false, 0, ListStep::PassOn);
        check(500, false, 0, ListStep::Unavailable);
        check(503, true, 0, ListStep::Unavailable);
        // A caller that asked for one exact resourceVersion gets the 410.
        assert_eq!(list_step(StatusCode::GONE, true, 0, true), ListStep::PassOn);
    }

    #[test]
    fn deletecollection_pages_carry_the_list_options_limit_and_token() {
        let options = "labelSelector=a%3Db&resourceVersion=5&resourceVersionMatch=NotOlderThan";
        assert_eq!(page_query(options, 1, None), format!("{options}&limit=1"));
        assert_eq!(
            page_query(options, 500, Some("eyJ2Ijo+/=")),
            "labelSelector=a%3Db&limit=500&continue=eyJ2Ijo%2B%2F%3D"
        );
        assert_eq!(page_query("", 500, None), "limit=500");
        // After a 410 the listing starts over without the caller's resourceVersion.
        assert_eq!(without_resource_version(options), "labelSelector=a%3Db");
        assert_eq!(without_resource_version("resourceVersion=5"), "");
    }

    #[test]
    fn a_listed_item_standing_for_a_deleted_object_takes_the_objects_kind() {
        let envelope = serde_json::json!({"apiVersion": "example.com/v1", "kind": "WidgetList"});
        let item = serde_json::json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": "a", "namespace": "demo"},
        });
        assert_eq!(
            listed_as_object(item.clone(), Some(&ObjectType::of(None, &envelope))),
            serde_json::json!({"apiVersion": "example.com/v1", "kind": "Widget",
                               "metadata": {"name": "a", "namespace": "demo"}})
        );
        // A CRD whose listKind is not its kind and "List": the first page's object
        // says; managedFields are not held.
        let first = serde_json::json!({"apiVersion": "example.com/v1", "kind": "Gadget"});
        let mut managed = item;
        managed["metadata"]["managedFields"] = serde_json::json!([{"manager": "kubectl"}]);
        assert_eq!(
            listed_as_object(managed, Some(&ObjectType::of(Some(&first), &envelope))),
            serde_json::json!({"apiVersion": "example.com/v1", "kind": "Gadget",
                               "metadata": {"name": "a", "namespace": "demo"}})
        );
    }

    #[test]
    fn a_deletecollection_answer_is_its_envelope_with_the_deleted_objects() {
        let envelope = serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "WidgetList",
            "metadata": {"resourceVersion": "7"}, "items": [{"stale": true}],
        });
        let envelope = envelope.as_object().expect("object");
        let items = [
            Bytes::from_static(br#"{"metadata":{"name":"a"}}"#),
            Bytes::from_static(br#"{"metadata":{"name":"b"}}"#),
        ];
        let body = list_body(envelope, &items).expect("written");
        let answer: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(
            answer,
            serde_json::json!({
                "apiVersion": "example.com/v1", "kind": "WidgetList",
                "metadata": {"resourceVersion": "7"},
                "items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}],
            })
        );
        let empty = list_body(&serde_json::Map::new(), &[]).expect("written");
        assert_eq!(empty, br#"{"items":[]}"#);
    }

    #[test]
    fn only_single_path_segments_are_used_as_names() {
        // kube stores custom resource names with `?`, `#` or spaces: escaped.
        for good in ["w", "my-widget.v2", "a..b", "a?dryRun=All", "a#b", "a b"] {
            assert!(is_path_segment(good), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a%2Fb"] {
            assert!(!is_path_segment(bad), "{bad}");
        }
    }
}
