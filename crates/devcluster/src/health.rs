//! `/healthz`, `/livez` and `/readyz` as kube's healthz package serves them
//! (`k8s.io/apiserver/pkg/server/healthz/healthz.go`), for devcluster and the
//! example API server alike.
//!
//! `InstallPathHandlerWithHealthyFunc` registers exact paths with the server's
//! path mux (`pkg/server/mux/pathrecorder.go`, which looks the request's
//! decoded path up as is before any prefix): the endpoint itself and
//! `<endpoint>/<check>` per check. Nothing else under an endpoint has a
//! handler, `/healthz/` and `/healthz//ping` included: those reach the
//! not-found handler. Every check here passes.

use crate::server::{go_not_found, text_plain};
use bytes::Bytes;
use http::{Response, StatusCode};
use std::collections::BTreeSet;

/// The three health endpoints.
const ENDPOINTS: [&str; 3] = ["healthz", "livez", "readyz"];

/// The checks a kube-apiserver registers on `/healthz`, `/livez` and `/readyz`
/// alike, in the order its verbose answer lists them: the generic server's
/// `ping` and `log` (`NewConfig`), `etcd` (the etcd options'
/// `AddHealthChecks`), then one `poststarthook/<name>` per post-start hook of
/// the aggregator chain (`AddPostStartHook`) and the aggregator's
/// `autoregister-completion`. The hooks' names and order are those of a recorded
/// 1.33 `/readyz?verbose` (no reference exchange covers them) less any that may
/// be newer than 1.32: an approximation of 1.32's list, not a record of it.
const HEALTH_CHECKS: &[&str] = &[
    "ping",
    "log",
    "etcd",
    "poststarthook/start-apiserver-admission-initializer",
    "poststarthook/generic-apiserver-start-informers",
    "poststarthook/priority-and-fairness-config-consumer",
    "poststarthook/priority-and-fairness-filter",
    "poststarthook/storage-object-count-tracker-hook",
    "poststarthook/start-apiextensions-informers",
    "poststarthook/start-apiextensions-controllers",
    "poststarthook/crd-informer-synced",
    "poststarthook/start-system-namespaces-controller",
    "poststarthook/start-cluster-authentication-info-controller",
    "poststarthook/start-kube-apiserver-identity-lease-controller",
    "poststarthook/start-kube-apiserver-identity-lease-garbage-collector",
    "poststarthook/start-legacy-token-tracking-controller",
    "poststarthook/start-service-ip-repair-controllers",
    "poststarthook/rbac/bootstrap-roles",
    "poststarthook/scheduling/bootstrap-system-priority-classes",
    "poststarthook/priority-and-fairness-config-producer",
    "poststarthook/bootstrap-controller",
    "poststarthook/aggregator-reload-proxy-client-cert",
    "poststarthook/start-kube-aggregator-informers",
    "poststarthook/apiservice-status-local-available-controller",
    "poststarthook/apiservice-status-remote-available-controller",
    "poststarthook/apiservice-registration-controller",
    "poststarthook/apiservice-discovery-controller",
    "poststarthook/kube-apiserver-autoregistration",
    "autoregister-completion",
    "poststarthook/apiservice-openapi-controller",
    "poststarthook/apiservice-openapiv3-controller",
];

/// The checks kube-apiserver registers on `endpoint` (`healthz`, `livez` or
/// `readyz`), in the order its verbose answer lists them. `/readyz` has three
/// more: the etcd options' `etcd-readiness` (`AddReadyzChecks`), the generic
/// server's `informer-sync`, and `shutdown`, which `installReadyz` adds last.
pub(crate) fn kube_apiserver_checks(endpoint: &str) -> Vec<&'static str> {
    let (first, rest) = HEALTH_CHECKS.split_at(3);
    let (readiness, last): (&[&str], &[&str]) = if endpoint == "readyz" {
        (&["etcd-readiness", "informer-sync"], &["shutdown"])
    } else {
        (&[], &[])
    };
    first
        .iter()
        .chain(readiness)
        .chain(rest)
        .chain(last)
        .copied()
        .collect()
}

/// The checks every generic API server registers (the example API server's):
/// `ping` and `log` (`NewConfig`'s defaults) on each endpoint; `/readyz` adds
/// `informer-sync` (`New`, with an informer factory) and `shutdown`
/// (`installReadyz`). Its post-start hooks are left out: the example server
/// has none of a generic server's.
pub(crate) fn generic_server_checks(endpoint: &str) -> Vec<&'static str> {
    if endpoint == "readyz" {
        vec!["ping", "log", "informer-sync", "shutdown"]
    } else {
        vec!["ping", "log"]
    }
}

/// The answer to `path?query` when `path` is a health endpoint or lies under
/// one; `None` for any other path. `checks` names the checks of an endpoint.
pub(crate) fn answer(
    path: &str,
    query: Option<&str>,
    checks: fn(&str) -> Vec<&'static str>,
) -> Option<Response<Bytes>> {
    // The mux matches Go's `URL.Path`, which is percent-decoded.
    let path = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
    let path = path.strip_prefix('/')?;
    ENDPOINTS.iter().find_map(|endpoint| {
        let rest = path.strip_prefix(endpoint)?;
        if rest.is_empty() {
            return Some(root(endpoint, &checks(endpoint), query));
        }
        let check = rest.strip_prefix('/')?;
        Some(if checks(endpoint).contains(&check) {
            check_passed()
        } else {
            go_not_found()
        })
    })
}

/// The endpoint itself, as `handleRootHealth` answers when every check that
/// is not excluded passes: `ok`, or with `verbose` in the query (any value) a
/// line per check and `<endpoint> check passed`. Each `exclude` value naming a
/// check skips it (`[+]<check> excluded: ok`); the values naming none are
/// listed, sorted and quoted, in a `warn:` line before the last. The handler
/// sets the content type and nosniff itself.
fn root(endpoint: &str, checks: &[&str], query: Option<&str>) -> Response<Bytes> {
    let pairs = crproxy_core::request::query_pairs(query);
    let verbose = pairs.iter().any(|(name, _)| name == "verbose");
    let mut excluded: BTreeSet<&str> = pairs
        .iter()
        .filter(|(name, _)| name == "exclude")
        .map(|(_, value)| value.as_str())
        .collect();
    let text = if verbose {
        let mut text = String::new();
        for check in checks {
            if excluded.remove(check) {
                text.push_str(&format!("[+]{check} excluded: ok\n"));
            } else {
                text.push_str(&format!("[+]{check} ok\n"));
            }
        }
        if !excluded.is_empty() {
            let names: Vec<String> = excluded
                .iter()
                .map(|name| crate::schema::go_quote(name))
                .collect();
            text.push_str(&format!(
                "warn: some health checks cannot be excluded: no matches for {}\n",
                names.join(",")
            ));
        }
        text.push_str(&format!("{endpoint} check passed\n"));
        text
    } else {
        "ok".to_string()
    };
    crate::server::nosniff(text_plain(StatusCode::OK, &text))
}

/// `<endpoint>/<check>`: `adaptCheckToHandler` only writes `ok`, which Go's
/// server sniffs as text/plain, without nosniff.
fn check_passed() -> Response<Bytes> {
    text_plain(StatusCode::OK, "ok")
}

#[cfg(test)]
mod tests;
