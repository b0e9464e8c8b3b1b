//! Request routing: authentication, request attributes, authorization, then
//! non-resource paths (discovery, health, OpenAPI) or the resource verbs.

use super::auth;
use super::filters;
use super::http::{self as h, Body, DiscoveryVersion, Output};
use super::request_metrics::{CountWhenDropped, RequestLabels};
use super::rest::{self, ReqCtx};
use super::State;
use crate::discovery::{self, Extra};
use crate::error::ApiError;
use crate::registry::{ResourceInfo, Source};
use crate::request_info::{RequestInfo, Unresolvable};
use crate::store::{meta_str, Mutation};
use crate::types::RequestAttributes;
use crate::watch::write_value;
use bytes::Bytes;
use crproxy_core::locks;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// kube-apiserver's default request body limit.
const MAX_BODY: usize = 3 * 1024 * 1024;
/// kube's default for watches without timeoutSeconds is 30-60 minutes.
const DEFAULT_WATCH_TIMEOUT: u64 = 1800;

/// Objects every cluster starts with: the system namespaces and kube's bootstrap
/// RBAC policy (created when missing, never overwritten).
pub fn bootstrap(state: &Arc<State>) {
    for obj in crate::rbac::bootstrap_objects() {
        let resource = match obj.get("kind").and_then(Value::as_str) {
            Some("ClusterRole") => "clusterroles",
            Some("ClusterRoleBinding") => "clusterrolebindings",
            Some("Role") => "roles",
            Some("RoleBinding") => "rolebindings",
            _ => continue,
        };
        let gr = (
            "rbac.authorization.k8s.io".to_string(),
            resource.to_string(),
        );
        let ns = meta_str(&obj, "namespace").to_string();
        let name = meta_str(&obj, "name").to_string();
        let _ = state
            .store
            .mutate::<ApiError>(&gr, &ns, &name, false, |cur| {
                if let Some(cur) = cur {
                    return Ok(Mutation::Unchanged(cur.clone()));
                }
                let mut obj = obj.clone();
                if let Some(meta) = super::objects::metadata_mut(&mut obj) {
                    meta.insert("uid".into(), json!(super::objects::new_uid()));
                    meta.insert("creationTimestamp".into(), json!(super::objects::now()));
                }
                Ok(Mutation::Put(obj))
            });
    }

    let ns_gr = (String::new(), "namespaces".to_string());
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let _ = state
            .store
            .mutate::<ApiError>(&ns_gr, "", ns, false, |cur| {
                if let Some(cur) = cur {
                    return Ok(Mutation::Unchanged(cur.clone()));
                }
                Ok(Mutation::Put(json!({
                    "apiVersion": "v1", "kind": "Namespace",
                    "metadata": {
                        "name": ns, "uid": super::objects::new_uid(),
                        "creationTimestamp": super::objects::now(),
                        "labels": {"kubernetes.io/metadata.name": ns},
                    },
                    "spec": {"finalizers": ["kubernetes"]},
                    "status": {"phase": "Active"},
                })))
            });
    }
}

/// Aggregated groups to add to discovery (APIServices with a service).
fn extra_discovery(state: &State) -> Extra {
    match state.aggregator.get() {
        Some(aggregator) => Extra {
            groups: aggregator.discovery_groups(),
            discovery: aggregator.aggregated_discovery(),
        },
        None => Extra::default(),
    }
}

/// Answers one request, with the headers kube's outer filters put on every
/// answer (see `filters.rs`).
pub async fn handle(state: Arc<State>, mut req: Request<hyper::body::Incoming>) -> Response<Body> {
    let mut exchange = filters::Exchange::begin(req.headers_mut());
    let mut response = match route(state, req, &mut exchange).await {
        Ok(r) => r,
        Err(e) => h::error_response(&e),
    };
    filters::stamp(&mut response, &exchange);
    response
}

/// kube's authentication, impersonation, priority-and-fairness and
/// authorization filters, in that order: the request's attributes once it may
/// go on, its flow recorded in `exchange` once it passed impersonation.
fn authenticate_and_authorize(
    state: &State,
    headers: &http::HeaderMap,
    certs: Option<&auth::PeerCertificates>,
    exchange: &mut filters::Exchange,
    attrs_for: impl FnOnce(crate::types::UserInfo) -> RequestAttributes,
) -> Result<RequestAttributes, ApiError> {
    let user = auth::identify(&state.authn, &state.policy, &state.store, headers, certs)?;
    let attrs = attrs_for(user);
    exchange.flow = state.flow_schemas.classify(&attrs);
    auth::authorize(&state.policy, &state.store, attrs)
}

/// The parsed path of a resource request.
#[derive(Debug, Default)]
pub(crate) struct ResourcePath {
    pub core: bool,
    pub group: String,
    pub version: String,
    pub namespace: String,
    pub resource: String,
    pub name: String,
    pub subresource: String,
    pub extra_segments: bool,
}

impl ResourcePath {
    /// The resource path of a resource request, as kube's resolver split it.
    fn of(info: &RequestInfo) -> Option<ResourcePath> {
        info.resource_request.then(|| ResourcePath {
            core: info.prefix == "api",
            group: info.api_group.clone(),
            version: info.api_version.clone(),
            namespace: info.namespace.clone(),
            resource: info.resource.clone(),
            // The path's name: kube's resolver also names the object a list's
            // `fieldSelector=metadata.name=` selects, for authorization and
            // metrics, but such a list is still served as a list.
            name: info.parts.get(1).cloned().unwrap_or_default(),
            subresource: info.subresource.clone(),
            extra_segments: info.parts.len() > 3,
        })
    }
}

/// kube's `WithRequestInfo` filter refusing a path its resolver cannot
/// place, before authentication: `responsewriters.InternalError` through
/// Go's `http.Error` (plain text, nosniff, a trailing newline), the request
/// URI quoted as Go's `%q` does and `&`, `<`, `>` escaped for HTML.
fn unresolvable(request_uri: &str, e: &Unresolvable) -> Response<Body> {
    let text = format!(
        "Internal Server Error: {}: failed to create RequestInfo: {e}",
        crate::schema::go_quote(request_uri)
    )
    .replace('&', "&amp;")
    .replace('<', "&lt;")
    .replace('>', "&gt;");
    h::nosniff(h::text_response(500, &format!("{text}\n")))
}

async fn read_body(body: hyper::body::Incoming) -> Result<Bytes, ApiError> {
    let limited = http_body_util::Limited::new(body, MAX_BODY);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(_) => Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728",
        )),
    }
}

async fn route(
    state: Arc<State>,
    req: Request<hyper::body::Incoming>,
    exchange: &mut filters::Exchange,
) -> Result<Response<Body>, ApiError> {
    let (parts, body) = req.into_parts();
    let certs = parts.extensions.get::<auth::PeerCertificates>();
    let path = parts.uri.path().to_string();
    // kube's request-info filter runs before authentication and everything
    // after it: routing, authorization and metrics all read this.
    let info = match crate::request_info::resolve(parts.method.as_str(), &path, parts.uri.query()) {
        Ok(info) => info,
        Err(e) => {
            let uri = parts
                .uri
                .path_and_query()
                .map_or(path.as_str(), |pq| pq.as_str());
            return Ok(unresolvable(uri, &e));
        }
    };
    let attrs_for = |user| crate::rbac::attributes(info.clone(), &path, user);

    // Groups served by an APIService with a service go to their backend, after the
    // caller has been authorized here (kube-apiserver never forwards a request the
    // caller may not make).
    if let Some(aggregator) = state.aggregator.get() {
        // `/openapi/v3/apis/<g>/<v>` of an aggregated group is the backend's
        // document, fetched as the caller (as kube-apiserver does).
        let routed = match path.strip_prefix("/openapi/v3") {
            Some(rest) if rest.starts_with("/apis/") => aggregator.route(rest),
            Some(_) => None,
            None => aggregator.route(&path),
        };
        if let Some(api_route) = routed {
            let attrs =
                authenticate_and_authorize(&state, &parts.headers, certs, exchange, attrs_for)?;
            let response = aggregator
                .proxy(api_route, Request::from_parts(parts, body), &attrs.user)
                .await;
            return Ok(
                response.map(|b| b.map_err(|e| std::io::Error::other(e.to_string())).boxed())
            );
        }
    }
    let query = super::http::query_parameters(parts.uri.query());
    let segs = crate::request_info::segments(&path);
    let accept = parts
        .headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);

    // Authorization sees the request as kube's RequestInfo resolver does (for
    // example, a list with fieldSelector=metadata.name=x names x).
    let attrs = authenticate_and_authorize(&state, &parts.headers, certs, exchange, attrs_for)?;
    let resource_path = ResourcePath::of(&info);
    let verb = info.verb;
    match resource_path {
        Some(rp) => {
            let labels = RequestLabels::new(&verb, &rp, &parts.headers, &query);
            let answer = async {
                let body = read_body(body).await?;
                resource_request(
                    &state,
                    rp,
                    &verb,
                    parts.method,
                    parts.headers,
                    query,
                    accept,
                    attrs,
                    body,
                )
                .await
            };
            let answer = answer.await;
            Ok(match labels {
                Some(labels) => counted(&state, labels, answer),
                None => answer.unwrap_or_else(|e| h::error_response(&e)),
            })
        }
        None => {
            let checks = crate::health::kube_apiserver_checks;
            match crate::health::answer(&path, parts.uri.query(), checks) {
                Some(answer) => Ok(answer.map(h::full)),
                None => non_resource(&state, &segs, &parts.headers, accept.as_deref()),
            }
        }
    }
}

/// Counts a resource request in `apiserver_request_total`: at once, or for a
/// watch that started, when its stream ends.
fn counted(
    state: &State,
    labels: RequestLabels,
    answer: Result<Response<Body>, ApiError>,
) -> Response<Body> {
    let response = answer.unwrap_or_else(|e| h::error_response(&e));
    let code = response.status().as_u16();
    if code == 405 {
        // Every 405 here is one kube answers before an instrumented handler
        // runs: go-restful's router has no route for the method, or the
        // custom-resource handler refuses the verb without picking a handler.
        return response;
    }
    if !(labels.is_watch() && response.status().is_success()) {
        state.requests.record(labels, code);
        return response;
    }
    let guard = CountWhenDropped::new(state.requests.clone(), labels, code);
    response.map(|body| {
        body.map_frame(move |frame| {
            let _counted_at_the_end = &guard;
            frame
        })
        .boxed()
    })
}

fn discovery_response(
    doc: &Value,
    version: DiscoveryVersion,
    headers: &http::HeaderMap,
) -> Response<Body> {
    use sha2::Digest;
    let mut doc = doc.clone();
    let (api_version, ct) = match version {
        DiscoveryVersion::V2 => (
            "apidiscovery.k8s.io/v2",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        ),
        DiscoveryVersion::V2Beta1 => (
            "apidiscovery.k8s.io/v2beta1",
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
        ),
    };
    doc["apiVersion"] = json!(api_version);
    let bytes = serde_json::to_vec(&doc).unwrap_or_default();
    let etag = format!(
        "\"{}\"",
        sha2::Sha512::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<String>()
    );
    let matches = headers
        .get(http::header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == etag);
    let mut resp = if matches {
        let mut r = Response::new(h::empty());
        *r.status_mut() = http::StatusCode::NOT_MODIFIED;
        r
    } else {
        let mut r = Response::new(h::full(bytes));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(ct),
        );
        r
    };
    let hs = resp.headers_mut();
    if let Ok(v) = http::HeaderValue::from_str(&etag) {
        hs.insert(http::header::ETAG, v);
    }
    hs.insert(http::header::VARY, http::HeaderValue::from_static("Accept"));
    hs.insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("public"),
    );
    resp
}

fn non_resource(
    state: &Arc<State>,
    segs: &[String],
    headers: &http::HeaderMap,
    accept: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let aggregated_discovery = state
        .aggregated_discovery
        .load(std::sync::atomic::Ordering::Relaxed);
    let output = h::negotiate_for(accept, aggregated_discovery);
    let extra = extra_discovery(state);
    match s.as_slice() {
        [] => Ok(h::json_response(
            200,
            &json!({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/openapi/v2", "/openapi/v3", "/readyz", "/version"]}),
        )),
        ["version"] => Ok(h::json_response(200, &discovery::version_info())),
        ["metrics"] => {
            let mut r = h::text_response(200, &state.requests.render());
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            Ok(r)
        }
        ["api"] => match output {
            Some(Output::Discovery(v)) => Ok(discovery_response(
                &discovery::aggregated(&state.registry, true, "", &extra),
                v,
                headers,
            )),
            None => Err(h::not_acceptable()),
            Some(_) => {
                let addr = locks::lock(&state.server_address).clone();
                Ok(h::json_response(200, &discovery::api_versions(&addr)))
            }
        },
        ["apis"] => match output {
            Some(Output::Discovery(v)) => Ok(discovery_response(
                &discovery::aggregated(&state.registry, false, "", &extra),
                v,
                headers,
            )),
            None => Err(h::not_acceptable()),
            Some(_) => Ok(h::json_response(
                200,
                &discovery::api_group_list(&state.registry, &extra),
            )),
        },
        // Under `/api` and a built-in group go-restful answers a version it does
        // not serve (a JSON 404); elsewhere the not-found handler does.
        ["api", v] => match discovery::api_resource_list(&state.registry, "", v) {
            Some(doc) => Ok(h::json_response(200, &doc)),
            None => Err(ApiError::resource_not_found()),
        },
        // An empty segment is a path no handler of kube's serves: `/apis//v1`
        // is not the core group.
        ["apis", g] if !g.is_empty() => {
            match discovery::api_group_doc(&state.registry, g, &extra) {
                Some(doc) => Ok(h::json_response(200, &doc)),
                None => Ok(h::plain_not_found()),
            }
        }
        ["apis", g, v] if !g.is_empty() => {
            match discovery::api_resource_list(&state.registry, g, v) {
                Some(doc) => Ok(h::json_response(200, &doc)),
                None if state.registry.builtin_group(g) => Err(ApiError::resource_not_found()),
                None => Ok(h::plain_not_found()),
            }
        }
        ["openapi", "v2"] => Ok(h::with_content_length(
            crate::openapi::v2_response(
                &crate::openapi::v2_document(&openapi_resources(state)),
                headers,
            )
            .map(h::full),
        )),
        ["openapi", "v3"] => {
            let mut r = h::json_response(200, &openapi_v3_index(state));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            Ok(h::with_content_length(r))
        }
        ["openapi", "v3", "api", v] => match openapi_v3_gv(state, "", v) {
            Some(doc) => Ok(h::with_content_length(h::json_response(200, &doc))),
            None => Ok(h::plain_not_found()),
        },
        ["openapi", "v3", "apis", g, v] if !g.is_empty() => match openapi_v3_gv(state, g, v) {
            Some(doc) => Ok(h::with_content_length(h::json_response(200, &doc))),
            None => Ok(h::plain_not_found()),
        },
        _ => Ok(h::plain_not_found()),
    }
}

/// Every served resource version, as the OpenAPI builder describes it.
fn openapi_resources(state: &State) -> Vec<crate::openapi::CrdResource> {
    let mut out = Vec::new();
    for info in state.registry.all() {
        if info.source == Source::Review {
            continue;
        }
        for v in &info.versions {
            let schema = match info.source {
                Source::Crd(_) => v.schema.clone(),
                _ => crate::openapi::builtin_schema(&info.group, &v.name, &info.kind),
            };
            out.push(crate::openapi::CrdResource {
                group: info.group.clone(),
                version: v.name.clone(),
                kind: info.kind.clone(),
                list_kind: info.list_kind.clone(),
                plural: info.resource.clone(),
                singular: info.singular.clone(),
                namespaced: info.namespaced,
                schema,
            });
        }
    }
    out
}

/// `/openapi/v3`: one entry per served group/version, hashed by content.
fn openapi_v3_index(state: &State) -> Value {
    let resources = openapi_resources(state);
    let mut gvs: Vec<(String, String)> = resources
        .iter()
        .map(|r| (r.group.clone(), r.version.clone()))
        .collect();
    gvs.sort();
    gvs.dedup();
    let mut entries: Vec<(String, String)> = gvs
        .iter()
        .map(|(g, v)| {
            let doc = crate::openapi::v3_group_version(g, v, &resources);
            (
                crate::openapi::group_version_path(g, v),
                crate::openapi::document_hash(&doc),
            )
        })
        .collect();
    // Aggregated group/versions are listed too; their documents come from the
    // backend when a client asks for them.
    if let Some(aggregator) = state.aggregator.get() {
        for group in aggregator.discovery_groups() {
            let name = group["name"].as_str().unwrap_or_default();
            for version in group["versions"].as_array().into_iter().flatten() {
                let Some(v) = version["version"].as_str() else {
                    continue;
                };
                let hash = format!("{:016X}", state.registry.generation());
                entries.push((crate::openapi::group_version_path(name, v), hash));
            }
        }
    }
    crate::openapi::v3_index(&entries)
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/<g>/<v>`.
fn openapi_v3_gv(state: &State, group: &str, version: &str) -> Option<Value> {
    let resources = openapi_resources(state);
    resources
        .iter()
        .any(|r| r.group == group && r.version == version)
        .then(|| crate::openapi::v3_group_version(group, version, &resources))
}

#[allow(clippy::too_many_arguments)]
async fn resource_request(
    state: &Arc<State>,
    rp: ResourcePath,
    verb: &str,
    method: Method,
    headers: http::HeaderMap,
    query: HashMap<String, String>,
    accept: Option<String>,
    attrs: RequestAttributes,
    body: Bytes,
) -> Result<Response<Body>, ApiError> {
    // An empty group under `/apis` is no group: kube's director finds no
    // webservice for it, nor its custom-resource handler a resource, whatever
    // the resource is called (`/apis//v1/configmaps` is not the core group).
    let group_named = rp.core || !rp.group.is_empty();
    // The director hands a path under the core group's or a built-in group's
    // webservices to go-restful, whose 404 is a JSON Status; any other path
    // ends, past the custom-resource handler, at the plain 404.
    let not_found = || {
        if rp.core || (group_named && state.registry.builtin_group(&rp.group)) {
            Err(ApiError::resource_not_found())
        } else {
            Ok(h::plain_not_found())
        }
    };
    let found = group_named
        .then(|| state.registry.lookup(&rp.group, &rp.version, &rp.resource))
        .flatten();
    let Some(info) = found else {
        return not_found();
    };
    if rp.extra_segments {
        return not_found();
    }
    // A cluster-scoped resource under a namespace path does not exist (the
    // namespace object's own path is the exception).
    if !info.namespaced && !rp.namespace.is_empty() && info.resource != "namespaces" {
        return not_found();
    }
    if info.namespaced && rp.namespace.is_empty() && !rp.name.is_empty() {
        return not_found();
    }
    // kube's custom-resource handler (`crdHandler.ServeHTTP`) hands a namespaced
    // resource's all-namespaces path to its 404 delegate for every verb but list
    // and watch (`possiblyAcrossAllNamespacesVerbs`), and refuses a subresource
    // the CRD does not declare, or a verb a declared one does not serve, before
    // any handler looks at the Accept header.
    if info.is_crd() {
        if info.namespaced && rp.namespace.is_empty() && verb != "list" && verb != "watch" {
            return Ok(h::plain_not_found());
        }
        if !rp.subresource.is_empty() {
            crd_subresource_serves(&info, &rp, verb)?;
        }
    }
    // kube 1.32 serves the `proxy` verb's paths (`/<prefix>/proxy/...`) nowhere:
    // go-restful has no route for them, and the custom-resource handler
    // (`serveResource`) refuses a verb it does not know as MethodNotSupported.
    if verb == "proxy" {
        return if info.is_crd() {
            Err(ApiError::method_not_supported(
                &info.group,
                &info.resource,
                verb,
            ))
        } else {
            not_found()
        };
    }
    refused_by_route(&info, &rp, verb, &method, &headers)?;
    let output = h::negotiate(accept.as_deref()).ok_or_else(h::not_acceptable)?;
    let output = match output {
        Output::Discovery(_) => return Err(h::not_acceptable()),
        o => o,
    };
    let namespace = if info.is_namespace() {
        String::new()
    } else {
        rp.namespace.clone()
    };
    let ctx = ReqCtx {
        info: info.clone(),
        version: rp.version.clone(),
        namespace,
        name: rp.name.clone(),
        subresource: rp.subresource.clone(),
        query,
        output,
        user: attrs.user.clone(),
        attrs,
        headers,
    };
    if info.source == Source::Review {
        return reviews(state, &ctx, &body);
    }
    match verb {
        "watch" => watch(state, &ctx),
        "list" => rest::list(state, &ctx).await,
        "get" => rest::get(state, &ctx),
        "create" if rp.name.is_empty() => rest::create(state, &ctx, &body, None).await,
        "create" => rest::create(state, &ctx, &body, Some(&rp.name)).await,
        "update" => rest::update(state, &ctx, &body).await,
        "patch" => rest::patch(state, &ctx, &body).await,
        "delete" => rest::delete(state, &ctx, &body).await,
        "deletecollection" => rest::delete_collection(state, &ctx, &body).await,
        // kube's resolver makes no other verb, and the empty one and `proxy`
        // were refused above.
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// What kube refuses before it negotiates the answer's media type, so that an
/// unacceptable Accept header does not turn it into a 406: go-restful's router
/// has no route for the path (404) or the method (405), or the custom-resource
/// handler's UpdateResource or PatchResource finds no name on a collection
/// (400, after PatchResource checked the patch type, 415).
fn refused_by_route(
    info: &ResourceInfo,
    rp: &ResourcePath,
    verb: &str,
    method: &Method,
    headers: &http::HeaderMap,
) -> Result<(), ApiError> {
    // A `/watch/` path is a watch whatever the method, but go-restful
    // registers its routes for GET alone, so it refuses any other method (405)
    // for a built-in resource; the custom-resource handler serves a watch by
    // the verb alone.
    if verb == "watch" && *method != Method::GET && *method != Method::HEAD && !info.is_crd() {
        return Err(ApiError::method_not_allowed());
    }
    // A method with no verb is refused before the Accept header is looked at:
    // go-restful's router (RouterJSR311.detectRoute) matches the method (405)
    // before the media types (406), and the custom-resource handler's
    // MethodNotSupported (naming the empty verb) goes out through
    // ErrorNegotiated, as JSON whatever the client accepts.
    if verb.is_empty() {
        return Err(if info.is_crd() {
            ApiError::method_not_supported(&info.group, &info.resource, verb)
        } else {
            ApiError::method_not_allowed()
        });
    }
    if info.source == Source::Review {
        // The one route is a POST to the collection: a name is a path no route
        // matches, another method the route's.
        if !rp.name.is_empty() {
            return Err(ApiError::resource_not_found());
        }
        return if *method == Method::POST {
            Ok(())
        } else {
            Err(ApiError::method_not_allowed())
        };
    }
    let routed = match verb {
        "watch" | "list" | "deletecollection" => info.has_verb(verb),
        // A create names its object in the body; only the custom-resource
        // handler also takes a POST to an object's own path.
        "create" => rp.name.is_empty() || (info.is_crd() && rp.subresource.is_empty()),
        "update" | "patch" if rp.name.is_empty() => {
            if !info.is_crd() {
                return Err(ApiError::method_not_allowed());
            }
            if verb == "patch" {
                super::seams::PatchKind::from_content_type(&h::content_type(headers), true)?;
            }
            return Err(ApiError::bad_request("name must be provided"));
        }
        _ => true,
    };
    if routed {
        Ok(())
    } else {
        Err(ApiError::method_not_allowed())
    }
}

/// kube's custom-resource handler serves a CRD's `status` and `scale` (when the CRD
/// declares them) for get, update and patch only. Any other subresource is a 404
/// for the object's name, and any other verb on a declared one is a 405.
fn crd_subresource_serves(
    info: &ResourceInfo,
    rp: &ResourcePath,
    verb: &str,
) -> Result<(), ApiError> {
    let declared = match rp.subresource.as_str() {
        "status" => info.has_status(&rp.version),
        "scale" => info.scale(&rp.version).is_some(),
        _ => false,
    };
    if !declared {
        return Err(ApiError::not_found(&info.group, &info.resource, &rp.name));
    }
    match verb {
        "get" | "update" | "patch" => Ok(()),
        _ => Err(ApiError::method_not_supported(
            &info.group,
            &info.resource,
            verb,
        )),
    }
}

fn watch(state: &Arc<State>, ctx: &ReqCtx) -> Result<Response<Body>, ApiError> {
    use crate::watch::{Start, WatchSpec};
    let selectors = Arc::new(rest::Selectors::parse(ctx)?);
    let rv = rest::parse_rv(ctx.q("resourceVersion"))?;
    let send_initial = ctx.q("sendInitialEvents").is_some_and(|v| v == "true");
    let start = if send_initial {
        Start::InitialEvents
    } else {
        match rv {
            None | Some(0) => Start::CurrentState,
            Some(n) => Start::From(n),
        }
    };
    let timeout = ctx
        .q("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT)
        // Bounded so deadline arithmetic cannot overflow on absurd values.
        .min(7 * 24 * 3600);
    let info = ctx.info.clone();
    let version = ctx.version.clone();
    let api_version = ctx.api_version();
    let output = ctx.output;
    let include = match output {
        Output::Table => ctx.include_object()?,
        _ => crate::table::IncludeObject::default(),
    };
    let filter_sel = selectors.clone();
    let render: crate::watch::Render =
        Arc::new(move |obj: &Value, out: &mut Vec<u8>| match output {
            Output::PartialObjectMetadata | Output::PartialObjectMetadataList => {
                super::output::write_partial(obj, out)
            }
            Output::Table => write_value(
                out,
                &super::output::table(
                    &info,
                    &version,
                    &[Arc::new(obj.clone())],
                    json!({"resourceVersion": meta_str(obj, "resourceVersion")}),
                    include,
                ),
            ),
            _ => write_value(out, &super::output::convert(obj, &api_version)),
        });
    let spec = WatchSpec {
        group: ctx.info.group.clone(),
        resource: ctx.info.resource.clone(),
        namespace: (ctx.info.namespaced && !ctx.namespace.is_empty())
            .then(|| ctx.namespace.clone()),
        start,
        allow_bookmarks: ctx.q("allowWatchBookmarks").is_some_and(|v| v == "true"),
        timeout: std::time::Duration::from_secs(timeout),
        api_version: ctx.api_version(),
        kind: ctx.info.kind.clone(),
        list_kind: ctx.info.list_kind.clone(),
        filter: Arc::new(move |o: &Value| filter_sel.matches(o)),
        render,
        render_is_identity: matches!(output, Output::Json | Output::Yaml),
    };
    let rx = crate::watch::start(state.store.clone(), spec, state.shutdown.clone());
    use futures_util::StreamExt;
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx)
        .map(|b| Ok::<_, std::io::Error>(hyper::body::Frame::data(b)));
    let body = http_body_util::StreamBody::new(stream);
    let mut resp = Response::new(http_body_util::BodyExt::boxed(body));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    h::add_warnings(&mut resp, &ctx.warnings());
    Ok(resp)
}

/// The create-only review resources.
fn reviews(state: &Arc<State>, ctx: &ReqCtx, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let format = h::body_format(&ctx.headers)?;
    let mut obj = h::decode_body(body, format, &ctx.info.kind)?;
    if ctx.info.namespaced {
        if let Some(meta) = super::objects::metadata_mut(&mut obj) {
            meta.insert("namespace".into(), json!(ctx.namespace));
        }
    }
    let rbac = state.policy.rbac(&state.store);
    match crate::reviews::handle_review(&ctx.info.resource, &obj, &ctx.user, &rbac, &state.authn) {
        Ok(mut answer) => {
            // kube's field manager records the review's writer like any create
            // (except for SelfSubjectRulesReviews, reference 153).
            let mut tracked = obj.clone();
            if ctx.info.resource == "selfsubjectrulesreviews" {
                return Ok(h::json_response(201, &answer));
            }
            super::seams::managed_fields_update(ctx, None, &mut tracked, "");
            if let (Some(mf), Some(meta)) = (
                tracked.pointer("/metadata/managedFields").cloned(),
                super::objects::metadata_mut(&mut answer),
            ) {
                meta.insert("managedFields".into(), mf);
            }
            Ok(h::json_response(201, &answer))
        }
        Err(status) => Err(ApiError::from_status(&status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_paths_parse_like_kube_request_info() {
        let check = |p: &str, want: Option<(&str, &str, &str, &str, &str)>| {
            let info = crate::request_info::resolve("GET", p, None).expect("resolvable");
            let got = ResourcePath::of(&info)
                .map(|r| (r.group, r.namespace, r.resource, r.name, r.subresource));
            let want = want.map(|(g, n, r, name, s)| {
                (
                    g.to_string(),
                    n.to_string(),
                    r.to_string(),
                    name.to_string(),
                    s.to_string(),
                )
            });
            assert_eq!(got, want, "{p}");
        };
        check("/api/v1/namespaces", Some(("", "", "namespaces", "", "")));
        check(
            "/api/v1/namespaces/foo",
            Some(("", "foo", "namespaces", "foo", "")),
        );
        check(
            "/api/v1/namespaces/foo/finalize",
            Some(("", "foo", "namespaces", "foo", "finalize")),
        );
        check(
            "/api/v1/namespaces/foo/configmaps/x",
            Some(("", "foo", "configmaps", "x", "")),
        );
        check(
            "/apis/stable.example.io/v1/namespaces/ns/crontabs/c/scale",
            Some(("stable.example.io", "ns", "crontabs", "c", "scale")),
        );
        check(
            "/apis/g/v1/clusterthings",
            Some(("g", "", "clusterthings", "", "")),
        );
        check("/apis/g/v1", None);
        check("/api/v1", None);
        check("/version", None);
    }
}
