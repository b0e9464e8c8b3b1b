//! The headers kube-apiserver's outer filters put on every answer, whichever
//! handler wrote it, applied in one place ([`stamp`]) to everything the request
//! pipeline answers: objects, errors from authentication and authorization,
//! watches (their head goes out before the first event), HEAD answers (derived
//! from the GET's answer afterwards) and answers relayed from aggregated API
//! servers.
//!
//! - `Audit-Id` (k8s.io/apiserver `endpoints/filters/audit_init.go`): the
//!   caller's own `Audit-Id` when it sent one, else a new UUID; on every answer.
//! - `Cache-Control: no-cache, private` (`endpoints/filters/cachecontrol.go`):
//!   set before the handler runs, so a handler's own value wins (aggregated
//!   discovery answers `public`, its 304 too).
//! - `X-Kubernetes-Pf-Flowschema-Uid` and `X-Kubernetes-Pf-Prioritylevel-Uid`
//!   (`server/filters/priority-and-fairness.go`): the UIDs of the FlowSchema and
//!   PriorityLevelConfiguration the request was classified into. The filter runs
//!   after authentication and impersonation and before authorization, so a 401
//!   or a refused impersonation has neither header and a 403 from RBAC has both.
//!
//! `X-Content-Type-Options: nosniff` is not a filter's: kube's Forbidden writer
//! and Go's `http.Error` add it, and so do devcluster's equivalents (see
//! `auth.rs` and `http::plain_not_found`), as do kube's health endpoints
//! (`/healthz`, `/livez`, `/readyz` in `health.rs`).

use crate::aggregation::Relayed;
use crate::types::RequestAttributes;
use http::{HeaderMap, HeaderName, HeaderValue, Response};

use super::http::Body;

const AUDIT_ID: HeaderName = HeaderName::from_static("audit-id");
const FLOW_SCHEMA_UID: HeaderName = HeaderName::from_static("x-kubernetes-pf-flowschema-uid");
const PRIORITY_LEVEL_UID: HeaderName = HeaderName::from_static("x-kubernetes-pf-prioritylevel-uid");
/// What kube's cache-control filter sets when the handler sets nothing: every
/// answer is protected by authentication and authorization.
const NO_CACHE_PRIVATE: HeaderValue = HeaderValue::from_static("no-cache, private");

/// A new random UUID in Go's `uuid.New().String()` form, as objects' uids are:
/// the flow UIDs and every audit ID devcluster makes (here and in the
/// aggregator, for a request that reached it without one).
pub(crate) fn new_uuid() -> HeaderValue {
    HeaderValue::from_str(&super::objects::new_uid())
        .expect("hex digits and dashes are a valid header value")
}

/// The FlowSchema and PriorityLevelConfiguration UIDs one request was
/// classified into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Flow {
    schema: HeaderValue,
    priority_level: HeaderValue,
}

/// The part of kube's bootstrap API Priority and Fairness configuration
/// (k8s.io/apiserver `apis/flowcontrol/bootstrap/default.go`) that devcluster's
/// users match, with UIDs chosen when the cluster starts: kube creates these
/// objects at start too, so every real cluster has UIDs of its own, and they stay
/// the same for the life of the server. Only the UIDs are ever shown (kube sends
/// no names, so that they reveal nothing).
///
/// Modelled, in kube's matching order:
/// - `exempt` (precedence 1, priority level `exempt`): the `system:masters`
///   group: devcluster's admin.
/// - `probes` (precedence 2, priority level `exempt`): `GET /healthz`,
///   `/readyz` and `/livez` by anyone else.
/// - `global-default` (precedence 9900, priority level `global-default`):
///   everything else by any authenticated or anonymous user: alice, bob,
///   `system:anonymous`, tokens issued by tests.
///
/// Not modelled: the suggested schemas for nodes, kube-controller-manager,
/// kube-scheduler, leader election and service accounts, whose subjects
/// devcluster has no component for (a service account only appears by
/// impersonation, and then gets global-default's UIDs here), and the mandatory
/// `catch-all`, which global-default always matches first.
#[derive(Debug)]
pub(crate) struct FlowSchemas {
    exempt: Flow,
    probes: Flow,
    global_default: Flow,
}

/// Subresources kube's long-running check names (`BasicLongRunningRequestCheck`
/// as kube-apiserver configures it): priority and fairness does not classify
/// such requests, so their answers carry no flow headers. Watches are long
/// running too but are classified.
const LONG_RUNNING_SUBRESOURCES: &[&str] = &["attach", "exec", "proxy", "log", "portforward"];

impl FlowSchemas {
    pub(crate) fn new() -> FlowSchemas {
        let exempt_level = new_uuid();
        FlowSchemas {
            exempt: Flow {
                schema: new_uuid(),
                priority_level: exempt_level.clone(),
            },
            probes: Flow {
                schema: new_uuid(),
                priority_level: exempt_level,
            },
            global_default: Flow {
                schema: new_uuid(),
                priority_level: new_uuid(),
            },
        }
    }

    /// The flow of a request that passed authentication and impersonation, as
    /// kube's priority-and-fairness filter classifies it; `None` for a
    /// long-running request it leaves alone.
    pub(crate) fn classify(&self, attrs: &RequestAttributes) -> Option<Flow> {
        let long_running = attrs.verb == "proxy"
            || (attrs.resource_request
                && LONG_RUNNING_SUBRESOURCES.contains(&attrs.subresource.as_str()));
        if long_running {
            return None;
        }
        let flow = if attrs.user.in_system_masters() {
            &self.exempt
        } else if !attrs.resource_request
            && attrs.verb == "get"
            && matches!(attrs.path.as_str(), "/healthz" | "/readyz" | "/livez")
        {
            &self.probes
        } else {
            &self.global_default
        };
        Some(flow.clone())
    }
}

/// What the filters learned about one request, for [`stamp`].
#[derive(Debug)]
pub(crate) struct Exchange {
    audit_id: HeaderValue,
    /// How priority and fairness classified the request; set once it passed
    /// authentication and impersonation.
    pub(super) flow: Option<Flow>,
}

impl Exchange {
    /// Starts the exchange for a request with these headers, choosing its audit
    /// ID as kube's WithAuditInit does: the first `Audit-Id` the caller sent
    /// when it is not empty (Go's `Header.Get`), kept as sent, else a new UUID.
    /// The request's `Audit-Id` is then set to it (the only value), so that an
    /// aggregated backend sees the same ID, as kube's proxy sends it
    /// (`NewRequestForProxy`).
    pub(crate) fn begin(request_headers: &mut HeaderMap) -> Exchange {
        let audit_id = match request_headers.get(AUDIT_ID) {
            Some(sent) if !sent.is_empty() => sent.clone(),
            _ => new_uuid(),
        };
        request_headers.insert(AUDIT_ID, audit_id.clone());
        Exchange {
            audit_id,
            flow: None,
        }
    }
}

/// Puts the filters' headers on the answer to the request of `exchange`.
///
/// An answer relayed from an aggregated API server (marked [`Relayed`] by the
/// aggregator) gets them as kube's proxy gives them:
/// - an ordinary answer: the filters set their headers before the handler runs,
///   and Go's reverse proxy then *adds* the backend's headers to them
///   (`httputil.ReverseProxy` copies with `Header.Add`), so the front's
///   `Audit-Id`, `Cache-Control` and flow UIDs come first, then the backend's
///   own if it sent any (a kube-style backend echoes the same `Audit-Id` and
///   sets a `Cache-Control` and flow UIDs of its own);
/// - the answer to an upgrade request: kube hijacks the connection and writes
///   the backend's answer as it came (`proxy.UpgradeAwareHandler`), so none of
///   the front's headers go out.
pub(crate) fn stamp(response: &mut Response<Body>, exchange: &Exchange) {
    let relayed = response.extensions().get::<Relayed>().copied();
    let set: fn(&mut HeaderMap, HeaderName, HeaderValue) = match relayed {
        Some(Relayed::Upgrade) => return,
        Some(Relayed::Answer) => put_first,
        None => |headers, name, value| {
            headers.insert(name, value);
        },
    };
    let headers = response.headers_mut();
    set(headers, AUDIT_ID, exchange.audit_id.clone());
    // A handler's own value stands (aggregated discovery's `public`); a
    // backend's comes after the front's.
    if relayed.is_some() || !headers.contains_key(http::header::CACHE_CONTROL) {
        set(headers, http::header::CACHE_CONTROL, NO_CACHE_PRIVATE);
    }
    if let Some(flow) = &exchange.flow {
        set(headers, FLOW_SCHEMA_UID, flow.schema.clone());
        set(headers, PRIORITY_LEVEL_UID, flow.priority_level.clone());
    }
}

/// `value` as the first value of `name`, before any the backend sent.
fn put_first(headers: &mut HeaderMap, name: HeaderName, value: HeaderValue) {
    let backend: Vec<HeaderValue> = headers.get_all(&name).iter().cloned().collect();
    headers.insert(name.clone(), value);
    for later in backend {
        headers.append(name.clone(), later);
    }
}

#[cfg(test)]
mod tests;
