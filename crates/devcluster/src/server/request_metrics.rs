//! `apiserver_request_total` on `/metrics`, as kube-apiserver counts it: one
//! series per canonical verb, dryRun value, group, version, resource,
//! subresource, scope, component and response code. Tests read it to count the
//! exchanges a client made with the cluster (the target of a proxy, say), which
//! nothing else a client can see reveals for a refused write.
//!
//! Simplifications: every authorized request for a resource path is counted,
//! whether or not the resource is served (kube counts only the routes it
//! installed), and requests refused by authentication or authorization are not.
//!
//! A request with no verb (OPTIONS, TRACE, CONNECT or any other method kube's
//! RequestInfo resolver has no verb for) or with the `proxy` verb is never
//! counted, as in kube: only the handlers kube installs count
//! (`metrics.InstrumentRouteFunc` on go-restful's routes,
//! `metrics.InstrumentHandlerFunc` on the handler `crdHandler.ServeHTTP` picks),
//! and no handler serves such a request. go-restful's router refuses it with
//! its 405 (or 404) before any route runs, and the custom-resource handler's
//! `serveResource` writes its MethodNotSupported itself and returns no handler
//! to instrument. For the same reason no 405 is counted: a verb a resource or
//! subresource does not serve (a POST to a built-in resource's `/watch/` path,
//! say) meets the same two refusals.

use crproxy_core::locks;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use http::HeaderMap;

use super::handlers::ResourcePath;

/// The labels of one request, apart from its code.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct RequestLabels {
    verb: &'static str,
    dry_run: &'static str,
    group: String,
    version: String,
    resource: String,
    subresource: String,
    scope: &'static str,
}

impl RequestLabels {
    /// `verb` is the request's RequestInfo verb (`get`, `list`, `watch`,
    /// `create`, ...); kube reports the HTTP-style canonical one, and `APPLY` for
    /// a server-side apply patch. `None` for a verb no handler serves (the
    /// empty one, `proxy`): kube does not count such a request.
    pub(crate) fn new(
        verb: &str,
        path: &ResourcePath,
        headers: &HeaderMap,
        query: &HashMap<String, String>,
    ) -> Option<RequestLabels> {
        let is_apply = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/apply-patch"));
        let verb = match verb {
            "get" => "GET",
            "list" => "LIST",
            "watch" => "WATCH",
            "create" => "POST",
            "update" => "PUT",
            "patch" if is_apply => "APPLY",
            "patch" => "PATCH",
            "delete" => "DELETE",
            "deletecollection" => "DELETECOLLECTION",
            _ => return None,
        };
        // kube reports an invalid dryRun value as such rather than echoing it.
        let dry_run = match query.get("dryRun").map(String::as_str) {
            None | Some("") => "",
            Some("All") => "All",
            Some(_) => "invalid",
        };
        let scope = if !path.name.is_empty() {
            "resource"
        } else if !path.namespace.is_empty() {
            "namespace"
        } else {
            "cluster"
        };
        Some(RequestLabels {
            verb,
            dry_run,
            group: path.group.clone(),
            version: path.version.clone(),
            resource: path.resource.clone(),
            subresource: path.subresource.clone(),
            scope,
        })
    }

    pub(crate) fn is_watch(&self) -> bool {
        self.verb == "WATCH"
    }
}

/// The counters of one cluster.
#[derive(Debug, Default)]
pub(crate) struct RequestMetrics {
    counts: Mutex<BTreeMap<(RequestLabels, u16), u64>>,
}

impl RequestMetrics {
    pub(crate) fn record(&self, labels: RequestLabels, code: u16) {
        let mut counts = locks::lock(&self.counts);
        *counts.entry((labels, code)).or_default() += 1;
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub(crate) fn render(&self) -> String {
        let counts = locks::lock(&self.counts);
        let mut out = String::from(
            "# HELP apiserver_request_total [STABLE] Requests served, by verb, dry run \
             value, group, version, resource, scope, component and HTTP response code.\n\
             # TYPE apiserver_request_total counter\n",
        );
        for ((l, code), count) in counts.iter() {
            // Label values are API path segments and fixed words: Prometheus
            // escaping is only needed for `\`, `"` and newlines, which a
            // percent-decoded segment may hold.
            let _ = writeln!(
                out,
                "apiserver_request_total{{code=\"{code}\",component=\"apiserver\",\
                 dry_run=\"{}\",group=\"{}\",resource=\"{}\",scope=\"{}\",\
                 subresource=\"{}\",verb=\"{}\",version=\"{}\"}} {count}",
                l.dry_run,
                escaped(&l.group),
                escaped(&l.resource),
                l.scope,
                escaped(&l.subresource),
                l.verb,
                escaped(&l.version),
            );
        }
        out
    }
}

/// Counts a watch when it ends, as kube does: the guard lives in the response
/// body and records on drop.
pub(crate) struct CountWhenDropped {
    metrics: Arc<RequestMetrics>,
    labels: Option<RequestLabels>,
    code: u16,
}

impl CountWhenDropped {
    pub(crate) fn new(metrics: Arc<RequestMetrics>, labels: RequestLabels, code: u16) -> Self {
        CountWhenDropped {
            metrics,
            labels: Some(labels),
            code,
        }
    }
}

impl Drop for CountWhenDropped {
    fn drop(&mut self) {
        if let Some(labels) = self.labels.take() {
            self.metrics.record(labels, self.code);
        }
    }
}

fn escaped(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests;
