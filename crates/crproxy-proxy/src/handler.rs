//! One proxied request, top to bottom: who is calling → what is asked → the owned
//! mode's rules and namespace mirroring → the target → the response the caller sees
//! → metrics.
//!
//! Every path returns an [`Outcome`] (a response and the reason it is counted
//! under); [`GroupVersionProxy::handle`] records it once and wraps the body with the
//! deadline or watch accounting.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use serde_json::Value;
use tokio::time::Instant;

use crproxy_core::config::{AccessMode, ResourceSet};
use crproxy_core::ownership::{self, BodyType, Owner, Visibility};
use crproxy_core::precondition;
use crproxy_core::reason::Reason;
use crproxy_core::request::{self, RequestKind, ResourcePath, Verb};
use crproxy_core::status;

use crate::fallback;
use crate::frontproxy::{FrontProxyTrust, PeerCertificate};
use crate::metrics::TargetMetrics;
use crate::namespaces::ClientNamespaces;
use crate::pool::ProxyBody;
use crate::transport::{
    self, DeadlineBody, ForwardError, TargetConnection, WatchBody, WatchFraming, MAX_BUFFERED_BODY,
    REQUEST_DEADLINE,
};

/// Everything one group/version server needs to serve requests.
pub struct GroupVersionProxy {
    pub group: String,
    pub version: String,
    /// `group/version`, the `group_version` metric label.
    pub group_version: String,
    /// Configured resources, for the discovery fallback.
    pub resources: ResourceSet,
    pub access: AccessMode,
    /// The client, as the ownership labels name it.
    pub owner: Owner,
    /// `targetVirtualCluster.name`, as error messages name it.
    pub target_name: String,
    pub target: TargetConnection,
    pub metrics: TargetMetrics,
    /// The client cluster, for namespace existence checks.
    pub client: crproxy_kube::Client,
    /// The client's namespaces as a watch last saw them.
    pub client_namespaces: Arc<ClientNamespaces>,
    pub trust: Arc<FrontProxyTrust>,
    /// The target's last successful discovery answer, so the fallback can keep
    /// kinds and scopes.
    last_discovery: Mutex<Option<Value>>,
    /// Namespaces known to exist on the target; a miss costs one GET.
    target_namespaces: Mutex<HashSet<String>>,
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
    path: String,
    query: Option<String>,
    headers: HeaderMap,
    deadline: Instant,
}

impl Exchange {
    fn path_and_query(&self) -> String {
        match &self.query {
            Some(q) if !q.is_empty() => format!("{}?{}", self.path, q),
            _ => self.path.clone(),
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
        target: TargetConnection,
        metrics: TargetMetrics,
        client: crproxy_kube::Client,
        client_namespaces: Arc<ClientNamespaces>,
        trust: Arc<FrontProxyTrust>,
    ) -> Arc<Self> {
        let group_version = format!("{group}/{version}");
        Arc::new(Self {
            group,
            version,
            group_version,
            resources,
            access,
            owner,
            target_name,
            target,
            metrics,
            client,
            client_namespaces,
            trust,
            last_discovery: Mutex::new(None),
            target_namespaces: Mutex::new(HashSet::new()),
        })
    }

    /// Serves one request that arrived on a connection which presented the client
    /// certificate `peer` (if any).
    pub async fn handle(
        self: Arc<Self>,
        request: Request<hyper::body::Incoming>,
        peer: Option<Arc<PeerCertificate>>,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let (parts, body) = request.into_parts();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().map(str::to_string);
        let kind = request::classify(
            parts.method.as_str(),
            &path,
            query.as_deref(),
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
        let inflight = (!is_watch).then(|| self.metrics.inflight());

        let exchange = Exchange {
            method: parts.method.clone(),
            path,
            query,
            headers: parts.headers,
            deadline: started + REQUEST_DEADLINE,
        };
        let outcome = match self.trust.authenticate(peer.as_deref(), &exchange.headers) {
            None => Outcome::new(
                json_response(StatusCode::UNAUTHORIZED, &status::unauthorized()),
                Reason::Upstream,
            ),
            Some(_caller) if exchange.method == Method::GET && exchange.path == "/apis" => {
                match fallback::aggregated_discovery_version(accept_of(&exchange.headers)) {
                    Some(version) => self.aggregated_discovery(&exchange, version).await,
                    // Only aggregated discovery is answered here; the legacy group
                    // list is the client API server's own.
                    None => path_error(&request::PathError::NotFound),
                }
            }
            Some(_caller)
                if exchange.method == Method::GET && self.is_openapi_index(&exchange.path) =>
            {
                self.openapi_index()
            }
            Some(_caller)
                if exchange.method == Method::GET && self.is_openapi_document(&exchange.path) =>
            {
                self.openapi_document(&exchange).await
            }
            Some(_caller) => match kind {
                Err(error) => path_error(&error),
                Ok(RequestKind::Upgrade) => self.reject_upgrade(),
                Ok(RequestKind::Discovery) => self.discovery(&exchange).await,
                Ok(RequestKind::Resource { verb, path }) => {
                    self.resource(&exchange, verb, &path, body).await
                }
            },
        };

        let Outcome {
            mut response,
            reason,
        } = outcome;
        transport::clean_response_headers(response.headers_mut());
        self.metrics.request(
            &self.group_version,
            verb_label,
            response.status().as_u16(),
            reason,
        );
        let streaming_watch = is_watch && response.status().is_success();
        let (parts, body) = response.into_parts();
        let body: ProxyBody = match inflight {
            Some(inflight) => http_body_util::BodyExt::boxed(DeadlineBody::new(
                body,
                exchange.deadline,
                started,
                self.metrics.clone(),
                verb_label,
                inflight,
            )),
            None if streaming_watch => {
                let framing = WatchFraming::of(&parts.headers);
                http_body_util::BodyExt::boxed(WatchBody::new(body, self.metrics.clone(), framing))
            }
            None => body,
        };
        Response::from_parts(parts, body)
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
        let response = match self.get_from_target(exchange, &exchange.headers).await {
            Err(ForwardError::Pool(e)) if is_availability(e.reason()) => {
                return self.discovery_fallback(e.reason(), e.reason())
            }
            Err(e) => return self.discovery_fallback(e.reason(), Reason::UpstreamError),
            Ok(response) => response,
        };
        let code = response.status();
        if code == StatusCode::UNAUTHORIZED
            || code == StatusCode::NOT_FOUND
            || code.is_server_error()
        {
            return self.discovery_fallback(Reason::UpstreamError, Reason::UpstreamError);
        }
        let (parts, body) = response.into_parts();
        let bytes = match transport::read_limited(body, MAX_BUFFERED_BODY).await {
            Ok(bytes) => bytes,
            Err(e) => return self.discovery_fallback(e.reason(), Reason::UpstreamError),
        };
        if code == StatusCode::OK {
            if let Ok(document) = serde_json::from_slice::<Value>(&bytes) {
                *lock(&self.last_discovery) = Some(document);
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
        path.strip_prefix("/openapi/v3")
            == Some(format!("/apis/{}/{}", self.group, self.version).as_str())
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
        let mut headers = exchange.headers.clone();
        headers.remove(http::header::ACCEPT_ENCODING);
        match self.get_from_target(exchange, &headers).await {
            Ok(response) if response.status().is_server_error() => self.upstream_failure(),
            Ok(response) => {
                let (parts, body) = response.into_parts();
                Outcome::new(Response::from_parts(parts, body), Reason::Upstream)
            }
            Err(e) => self.unavailable(e),
        }
    }

    /// `GET /apis` asking for aggregated discovery (what an aggregator sends every
    /// 60 s): the target's entry for this group/version, or the local fallback in
    /// aggregated form under the same rules as `/apis/<group>/<version>`.
    async fn aggregated_discovery(&self, exchange: &Exchange, version: &'static str) -> Outcome {
        let mut headers = exchange.headers.clone();
        headers.remove(http::header::ACCEPT_ENCODING);
        // The filtered document differs from the target's, so its ETag would lie.
        headers.remove(http::header::IF_NONE_MATCH);
        let response = match self.get_from_target(exchange, &headers).await {
            Err(ForwardError::Pool(e)) if is_availability(e.reason()) => {
                return self.aggregated_fallback(version, e.reason(), e.reason())
            }
            Err(e) => return self.aggregated_fallback(version, e.reason(), Reason::UpstreamError),
            Ok(response) => response,
        };
        let code = response.status();
        if code != StatusCode::OK {
            return self.aggregated_fallback(version, Reason::UpstreamError, Reason::UpstreamError);
        }
        let filtered = match transport::read_limited(response.into_body(), MAX_BUFFERED_BODY).await
        {
            Ok(bytes) => serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|doc| fallback::filter_aggregated(&doc, &self.group, &self.version)),
            Err(e) => return self.aggregated_fallback(version, e.reason(), Reason::UpstreamError),
        };
        match filtered {
            Some(document) => {
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
            // The target does not serve this group/version (yet): the same as a 404.
            None => self.aggregated_fallback(version, Reason::UpstreamError, Reason::UpstreamError),
        }
    }

    fn aggregated_fallback(
        &self,
        version: &'static str,
        request_reason: Reason,
        fallback_reason: Reason,
    ) -> Outcome {
        self.metrics
            .discovery_fallback(&self.group_version, fallback_reason);
        let last_good = lock(&self.last_discovery).clone();
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
        self.metrics
            .discovery_fallback(&self.group_version, fallback_reason);
        let last_good = lock(&self.last_discovery).clone();
        let document = fallback::fallback_document(
            &self.group,
            &self.version,
            &self.resources,
            last_good.as_ref(),
        );
        Outcome::new(json_response(StatusCode::OK, &document), request_reason)
    }

    // ---------------------------------------------------------------- resources

    async fn resource(
        &self,
        exchange: &Exchange,
        verb: Verb,
        path: &ResourcePath,
        body: hyper::body::Incoming,
    ) -> Outcome {
        let owned = self.access == AccessMode::Owned;
        let writes_into_namespace = matches!(verb, Verb::Create | Verb::Update | Verb::Patch);
        if writes_into_namespace {
            if let Some(namespace) = &path.namespace {
                if let Err(outcome) = self.ensure_namespace(namespace, exchange.deadline).await {
                    return outcome;
                }
            }
        }
        match verb {
            Verb::List | Verb::Watch | Verb::DeleteCollection if owned => {
                let query = match ownership::scoped_query(exchange.query.as_deref(), &self.owner) {
                    Ok(query) => query,
                    Err(e) => {
                        return Outcome::new(
                            json_response(
                                StatusCode::BAD_REQUEST,
                                // The selector error carries kube's own prefix.
                                &status::bad_request(e.to_string()),
                            ),
                            Reason::Upstream,
                        );
                    }
                };
                let target_path = with_query(&exchange.path, &query);
                self.forward(
                    exchange,
                    &target_path,
                    transport::stream(body),
                    verb == Verb::Watch,
                )
                .await
            }
            Verb::Get if owned => self.named_get(exchange, path).await,
            Verb::Create => {
                // Creates are stamped in both modes so every object on the target
                // names the client that made it.
                let bytes = match read_request(body).await {
                    Ok(bytes) => bytes,
                    Err(outcome) => return outcome,
                };
                let stamped = self.stamp_labels(&exchange.headers, bytes);
                self.forward(
                    exchange,
                    &exchange.path_and_query(),
                    transport::full(stamped),
                    false,
                )
                .await
            }
            Verb::Update | Verb::Patch | Verb::Delete if owned => {
                self.owned_mutation(exchange, verb, path, body).await
            }
            _ => {
                let watch = verb == Verb::Watch;
                self.forward(
                    exchange,
                    &exchange.path_and_query(),
                    transport::stream(body),
                    watch,
                )
                .await
            }
        }
    }

    /// Named GET in owned mode: the object itself decides whether the caller may
    /// see it, in whichever JSON representation the caller asked for.
    async fn named_get(&self, exchange: &Exchange, path: &ResourcePath) -> Outcome {
        if path.subresource.is_some() {
            // A subresource (a Scale, say) carries no ownership labels of its own:
            // ownership is the object's, checked first.
            if let Err(outcome) = self.check_ownership(exchange, path).await {
                return outcome;
            }
            return self
                .forward(
                    exchange,
                    &exchange.path_and_query(),
                    transport::full(Bytes::new()),
                    false,
                )
                .await;
        }
        let mut headers = exchange.headers.clone();
        let accept = headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let inspectable = ownership::inspectable_accept(accept.as_deref());
        match HeaderValue::from_str(&inspectable) {
            Ok(value) => {
                headers.insert(http::header::ACCEPT, value);
            }
            Err(_) => {
                headers.insert(
                    http::header::ACCEPT,
                    HeaderValue::from_static("application/json"),
                );
            }
        }
        // The body is inspected, so it must arrive uncompressed.
        headers.remove(http::header::ACCEPT_ENCODING);
        let response = match self.get_from_target(exchange, &headers).await {
            Ok(response) => response,
            Err(e) => return self.unavailable(e),
        };
        if response.status().is_server_error() {
            return self.upstream_failure();
        }
        let (parts, body) = response.into_parts();
        let read = tokio::time::timeout_at(
            exchange.deadline,
            transport::read_limited(body, MAX_BUFFERED_BODY),
        )
        .await;
        let bytes = match flatten(read) {
            Ok(bytes) => bytes,
            Err(e) => return self.unavailable(e),
        };
        if parts.status != StatusCode::OK {
            return Outcome::new(
                Response::from_parts(parts, transport::full(bytes)),
                Reason::Upstream,
            );
        }
        match ownership::response_visibility(&self.owner, &bytes) {
            Visibility::Owned => Outcome::new(
                Response::from_parts(parts, transport::full(bytes)),
                Reason::Upstream,
            ),
            Visibility::NotOwned => self.masked(path, Reason::OwnershipMasked),
            Visibility::Undecodable => self.masked(path, Reason::OwnershipCheckFailed),
        }
    }

    /// PUT, PATCH or DELETE of a named object in owned mode: check ownership first,
    /// then send the mutation pinned to the uid that was checked.
    async fn owned_mutation(
        &self,
        exchange: &Exchange,
        verb: Verb,
        path: &ResourcePath,
        body: hyper::body::Incoming,
    ) -> Outcome {
        let bytes = match read_request(body).await {
            Ok(bytes) => bytes,
            Err(outcome) => return outcome,
        };
        let body_type = content_type(&exchange.headers).and_then(BodyType::from_content_type);
        let uid = match self.check_ownership(exchange, path).await {
            Ok(uid) => uid,
            Err(outcome) => return outcome,
        };
        let body = match (verb, uid) {
            (Verb::Delete, Some(uid)) => match precondition::pin_delete(&bytes, &uid) {
                Ok(pinned) => pinned.into(),
                Err(e) => {
                    return Outcome::new(
                        json_response(StatusCode::BAD_REQUEST, &status::bad_request(e.to_string())),
                        Reason::Upstream,
                    )
                }
            },
            (Verb::Delete, None) => bytes,
            (_, uid) => {
                let stamped = self.stamp_labels(&exchange.headers, bytes);
                match (uid, body_type) {
                    (Some(uid), Some(body_type)) => {
                        match precondition::pin_write(body_type, &stamped, &uid) {
                            Ok(pinned) => pinned.into(),
                            // An unparsable body is refused by the target anyway;
                            // sending it unpinned cannot hit another object.
                            Err(_) => stamped,
                        }
                    }
                    _ => stamped,
                }
            }
        };
        self.forward(
            exchange,
            &exchange.path_and_query(),
            transport::full(body),
            false,
        )
        .await
    }

    /// The preliminary GET of an owned-mode mutation. `Ok(Some(uid))` for an owned
    /// object, `Ok(None)` when it does not exist and the verb may create it
    /// (server-side apply), otherwise the response to send instead.
    async fn check_ownership(
        &self,
        exchange: &Exchange,
        path: &ResourcePath,
    ) -> Result<Option<String>, Outcome> {
        let object_path = object_path(&self.group, &self.version, path);
        let attempt = tokio::time::timeout_at(
            exchange.deadline,
            self.target
                .call(exchange.deadline, Method::GET, &object_path, None),
        )
        .await;
        let (code, bytes) = flatten(attempt).map_err(|e| self.unavailable(e))?;
        if code == StatusCode::OK {
            let object: Value = serde_json::from_slice(&bytes)
                .map_err(|_| self.masked(path, Reason::OwnershipCheckFailed))?;
            if !self.owner.owns(&object) {
                return Err(self.masked(path, Reason::OwnershipMasked));
            }
            let uid = object
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(str::to_string);
            return Ok(uid);
        }
        if code == StatusCode::NOT_FOUND {
            // Only server-side apply creates a missing object. Nothing was checked,
            // so nothing can be pinned: a concurrent create of the same name by
            // another client in the instant between this GET and the apply is the
            // one window the uid precondition cannot close.
            let is_apply = content_type(&exchange.headers).and_then(BodyType::from_content_type)
                == Some(BodyType::ApplyPatchYaml);
            if exchange.method == Method::PATCH && is_apply {
                return Ok(None);
            }
            return Err(Outcome::new(
                Response::builder()
                    .status(code)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(transport::full(bytes))
                    .unwrap_or_else(|_| fallback_500()),
                Reason::Upstream,
            ));
        }
        if code.is_server_error() {
            return Err(Outcome::new(
                self.unavailable_response(None),
                Reason::OwnershipCheckFailed,
            ));
        }
        // 401, 403 or anything else: the client may not see it, so it does not exist.
        Err(self.masked(path, Reason::OwnershipMasked))
    }

    /// Adds the ownership labels to a write body; a body that cannot be parsed is
    /// sent unchanged, as the spec requires, and the failure is logged.
    fn stamp_labels(&self, headers: &HeaderMap, bytes: Bytes) -> Bytes {
        if bytes.is_empty() {
            return bytes;
        }
        let body_type = content_type(headers).and_then(BodyType::from_content_type);
        let injected = match body_type {
            Some(body_type) => ownership::inject_owner_labels(&self.owner, body_type, &bytes)
                .map_err(|e| e.to_string()),
            None => Err(format!(
                "unsupported content type {:?}",
                content_type(headers).unwrap_or("")
            )),
        };
        match injected {
            Ok(stamped) => stamped.into(),
            Err(error) => {
                tracing::warn!(
                    group_version = %self.group_version,
                    %error,
                    "inject source labels failed"
                );
                bytes
            }
        }
    }

    // ---------------------------------------------------------------- namespaces

    /// A namespaced write needs its namespace on the client (else 404) and mirrors it
    /// onto the target when missing there.
    async fn ensure_namespace(&self, namespace: &str, deadline: Instant) -> Result<(), Outcome> {
        let client_path = format!("/api/v1/namespaces/{namespace}");
        // The watch-fed cache answers "exists" from memory; a miss may only mean the
        // namespace was created a moment ago, so it is confirmed with a GET.
        if self.client_namespaces.exists(namespace) != Some(true) {
            self.confirm_client_namespace(namespace, &client_path, deadline)
                .await?;
        }
        self.ensure_target_namespace(namespace, &client_path, deadline)
            .await
    }

    async fn confirm_client_namespace(
        &self,
        namespace: &str,
        client_path: &str,
        deadline: Instant,
    ) -> Result<(), Outcome> {
        match tokio::time::timeout_at(deadline, self.client.get(client_path)).await {
            Err(_) => Err(self.unavailable(ForwardError::Deadline)),
            Ok(Err(e)) if e.is_not_found() => Err(Outcome::new(
                json_response(
                    StatusCode::NOT_FOUND,
                    &status::namespace_not_found(namespace),
                ),
                Reason::NamespaceMissing,
            )),
            Ok(Err(e)) => {
                tracing::warn!(%namespace, error = %e, "checking the namespace on the client cluster failed");
                Err(Outcome::new(
                    self.unavailable_response(Some(&format!(
                        "checking namespace {namespace:?} on the client cluster: {e}"
                    ))),
                    Reason::Upstream,
                ))
            }
            Ok(Ok(_)) => Ok(()),
        }
    }

    /// Mirrors the namespace onto the target unless it is known to be there.
    async fn ensure_target_namespace(
        &self,
        namespace: &str,
        client_path: &str,
        deadline: Instant,
    ) -> Result<(), Outcome> {
        if lock(&self.target_namespaces).contains(namespace) {
            return Ok(());
        }
        let attempt = tokio::time::timeout_at(
            deadline,
            self.target.call(deadline, Method::GET, client_path, None),
        )
        .await;
        let (code, _) = flatten(attempt).map_err(|e| self.unavailable(e))?;
        if code == StatusCode::NOT_FOUND {
            tracing::info!(%namespace, target = %self.target_name, "creating namespace on target cluster");
            let manifest = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace},
            });
            let attempt = tokio::time::timeout_at(
                deadline,
                self.target.call(
                    deadline,
                    Method::POST,
                    "/api/v1/namespaces",
                    Some(Bytes::from(manifest.to_string())),
                ),
            )
            .await;
            let (created, body) = flatten(attempt).map_err(|e| self.unavailable(e))?;
            if !(created.is_success() || created == StatusCode::CONFLICT) {
                tracing::warn!(%namespace, code = created.as_u16(), body = %String::from_utf8_lossy(&body), "creating namespace on target cluster failed");
                return Err(Outcome::new(
                    self.unavailable_response(Some(&format!(
                        "creating namespace {namespace:?} on the target failed with {created}"
                    ))),
                    Reason::Upstream,
                ));
            }
        } else if code.is_server_error() {
            return Err(self.upstream_failure());
        }
        lock(&self.target_namespaces).insert(namespace.to_string());
        Ok(())
    }

    // ---------------------------------------------------------------- forwarding

    /// GETs the request's own path and query from the target with `headers`,
    /// within the request deadline; the response body is left to the caller.
    async fn get_from_target(
        &self,
        exchange: &Exchange,
        headers: &HeaderMap,
    ) -> Result<Response<ProxyBody>, ForwardError> {
        let path_and_query = exchange.path_and_query();
        let sent = self.target.send_before(
            Some(exchange.deadline),
            Method::GET,
            &path_and_query,
            headers,
            transport::full(Bytes::new()),
        );
        flatten(tokio::time::timeout_at(exchange.deadline, sent).await)
    }

    /// Sends a request to the target and maps its response: 5xx on non-watch
    /// requests becomes the retryable 503; everything else streams back unchanged.
    async fn forward(
        &self,
        exchange: &Exchange,
        path_and_query: &str,
        body: ProxyBody,
        watch: bool,
    ) -> Outcome {
        let sent = self.target.send_before(
            (!watch).then_some(exchange.deadline),
            exchange.method.clone(),
            path_and_query,
            &exchange.headers,
            body,
        );
        let response = if watch {
            sent.await
        } else {
            flatten(tokio::time::timeout_at(exchange.deadline, sent).await)
        };
        let response = match response {
            Ok(response) => response,
            Err(e) => return self.unavailable(e),
        };
        if !watch && response.status().is_server_error() {
            return self.upstream_failure();
        }
        if exchange.method != Method::GET && response.status() == StatusCode::NOT_FOUND {
            // The target lost a namespace we believed it had: check again next time.
            if let Some(namespace) = namespace_of(&exchange.path) {
                lock(&self.target_namespaces).remove(namespace);
            }
        }
        let (parts, body) = response.into_parts();
        Outcome::new(Response::from_parts(parts, body), Reason::Upstream)
    }

    // ---------------------------------------------------------------- responses

    fn masked(&self, path: &ResourcePath, reason: Reason) -> Outcome {
        let name = path.name.as_deref().unwrap_or("");
        Outcome::new(
            json_response(
                StatusCode::NOT_FOUND,
                &status::not_found(&path.resource, &self.group, name),
            ),
            reason,
        )
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
        tracing::debug!(target = %self.target_name, group_version = %self.group_version, %reason, error = %error, "request to target failed");
        Outcome::new(self.unavailable_response(cause.as_deref()), reason)
    }

    fn upstream_failure(&self) -> Outcome {
        Outcome::new(self.unavailable_response(None), Reason::Upstream)
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

/// Peer-availability reasons: the pool refused before any dial.
fn is_availability(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::NoPeer | Reason::StalePeers | Reason::AllQuarantined
    )
}

fn flatten<T>(
    attempt: Result<Result<T, ForwardError>, tokio::time::error::Elapsed>,
) -> Result<T, ForwardError> {
    match attempt {
        Ok(result) => result,
        Err(_) => Err(ForwardError::Deadline),
    }
}

async fn read_request(body: hyper::body::Incoming) -> Result<Bytes, Outcome> {
    transport::read_limited(transport::stream(body), MAX_BUFFERED_BODY)
        .await
        .map_err(|e| {
            let (code, reason) = match e {
                ForwardError::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge"),
                _ => (StatusCode::BAD_REQUEST, "BadRequest"),
            };
            Outcome::new(
                json_response(
                    code,
                    &status::status(
                        code.as_u16(),
                        reason,
                        format!("reading the request body: {e}"),
                    ),
                ),
                Reason::Upstream,
            )
        })
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
    Outcome::new(
        json_response(
            code,
            &status::status(code.as_u16(), error.reason(), error.to_string()),
        ),
        Reason::Upstream,
    )
}

fn json_response(code: StatusCode, body: &Value) -> Response<ProxyBody> {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(transport::full(body.to_string()))
        .unwrap_or_else(|_| fallback_500())
}

fn fallback_500() -> Response<ProxyBody> {
    let mut response = Response::new(transport::full(Bytes::new()));
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

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
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

fn with_query(path: &str, query: &str) -> String {
    if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    }
}

/// The object a named request is about, without any subresource: ownership is a
/// property of the object, so `/status` and `/scale` are checked on the object.
fn object_path(group: &str, version: &str, path: &ResourcePath) -> String {
    let mut out = format!("/apis/{group}/{version}");
    if let Some(namespace) = &path.namespace {
        out.push_str("/namespaces/");
        out.push_str(namespace);
    }
    out.push('/');
    out.push_str(&path.resource);
    if let Some(name) = &path.name {
        out.push('/');
        out.push_str(name);
    }
    out
}

fn namespace_of(path: &str) -> Option<&str> {
    let rest = path.split("/namespaces/").nth(1)?;
    rest.split('/').next()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn namespace_is_read_from_a_resource_path() {
        assert_eq!(
            namespace_of("/apis/example.com/v1/namespaces/team-a/widgets"),
            Some("team-a")
        );
        assert_eq!(namespace_of("/apis/example.com/v1/widgets"), None);
    }
}
