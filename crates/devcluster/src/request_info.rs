//! What a request is, as kube-apiserver's `RequestInfoFactory` works it out
//! (`k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`): resource or
//! not, verb, group, version, namespace, resource, name and subresource.
//!
//! Architecture invariant: this is the only place a verb is derived from a
//! method and a path. Routing, authorization and `apiserver_request_total`
//! all read the [`RequestInfo`] made here, so the attributes a request is
//! authorized with are the ones it is served and counted with.
//!
//! One deliberate departure from kube, in how the path is split: segments are
//! percent-decoded one by one (Go decodes the whole path before splitting, so
//! an encoded `/` would split a segment there, while devcluster's handlers act
//! on the segment as sent and must be authorized for the same names).

use std::collections::HashMap;

/// One request as kube's resolver sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// `/api/<v>/...` or `/apis/<g>/<v>/...` with something after the version.
    pub resource_request: bool,
    /// For resource requests kube's verb (`get`, `list`, `watch`, `create`,
    /// `update`, `patch`, `delete`, `deletecollection`, `proxy`, or empty for
    /// any other method); otherwise the lower-cased HTTP method.
    pub verb: String,
    /// `api` or `apis` for resource requests, empty otherwise.
    pub prefix: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub name: String,
    pub subresource: String,
    /// The segments from the resource on: `resource/name/subresource/...`.
    pub parts: Vec<String>,
}

/// A resource path kube's resolver refuses: a `watch` or `proxy` segment with
/// nothing after it. kube's `WithRequestInfo` filter answers it with a 500
/// before authentication.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unable to determine kind and namespace from url, {url}")]
pub struct Unresolvable {
    /// The request's path and query, as Go prints a request URL.
    pub url: String,
    /// What kube knows of the request when it gives up (its resolver returns
    /// it with the error): a resource request with the method's verb and no
    /// resource.
    pub partial: Box<RequestInfo>,
}

/// kube's `splitPath`, each segment percent-decoded: leading and trailing
/// slashes are dropped, empty segments in between are kept.
pub fn segments(path: &str) -> Vec<String> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return Vec::new();
    }
    trimmed
        .split('/')
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect()
}

/// Resolves `method path?query` as kube's `RequestInfoFactory.NewRequestInfo`.
///
/// `/api/<v>/...` and `/apis/<g>/<v>/...` with at least one segment after the
/// version are resource requests; anything else is a non-resource request
/// whose verb is the lower-cased method. For resources, a leading `watch` or
/// `proxy` segment is the verb whatever the method; otherwise POST is create,
/// GET and HEAD get (list without a name, watch when `?watch` is neither `0`
/// nor `false`), PUT update, PATCH patch, DELETE delete (deletecollection
/// without a name), and any other method has an empty verb. A list or watch
/// whose `fieldSelector` is `metadata.name=<x>` names `<x>`.
pub fn resolve(method: &str, path: &str, query: Option<&str>) -> Result<RequestInfo, Unresolvable> {
    let mut info = RequestInfo {
        verb: method.to_ascii_lowercase(),
        ..RequestInfo::default()
    };
    let segs = segments(path);
    let (prefix, group, version, mut rest) = match segs.as_slice() {
        // By the number of segments alone: kube takes an empty group or version
        // (`/apis//v1/x`) as it comes, and answers it as a resource it does not
        // serve.
        [p, version, rest @ ..] if p == "api" && !rest.is_empty() => {
            ("api", "", version.as_str(), rest)
        }
        [p, group, version, rest @ ..] if p == "apis" && !rest.is_empty() => {
            ("apis", group.as_str(), version.as_str(), rest)
        }
        _ => return Ok(info),
    };
    info.resource_request = true;
    info.prefix = prefix.to_string();
    info.api_group = group.to_string();
    info.api_version = version.to_string();

    let special = rest[0].as_str();
    if special == "watch" || special == "proxy" {
        if rest.len() < 2 {
            let url = match query {
                Some(q) if !q.is_empty() => format!("{path}?{q}"),
                _ => path.to_string(),
            };
            return Err(Unresolvable {
                url,
                partial: Box::new(info),
            });
        }
        info.verb = special.to_string();
        rest = &rest[1..];
    } else {
        info.verb = match method {
            "POST" => "create",
            "GET" | "HEAD" => "get",
            "PUT" => "update",
            "PATCH" => "patch",
            "DELETE" => "delete",
            _ => "",
        }
        .to_string();
    }

    if rest[0] == "namespaces" && rest.len() > 1 {
        info.namespace = rest[1].clone();
        // `/namespaces/<ns>/status|finalize` are subresources of the namespace
        // itself; anything else after the name is a namespaced resource.
        if rest.len() > 2 && rest[2] != "status" && rest[2] != "finalize" {
            rest = &rest[2..];
        }
    }
    info.parts = rest.to_vec();
    info.resource = rest[0].clone();
    info.name = rest.get(1).cloned().unwrap_or_default();
    if rest.len() >= 3 && info.verb != "proxy" {
        info.subresource = rest[2].clone();
    }

    if info.name.is_empty() && info.verb == "get" {
        let params = query_parameters(query);
        let watch = params
            .get("watch")
            .is_some_and(|v| crproxy_core::request::query_bool(v));
        info.verb = if watch { "watch" } else { "list" }.to_string();
        if let Some(name) = params.get("fieldSelector").and_then(|s| selected_name(s)) {
            info.name = name;
        }
    }
    if info.name.is_empty() && info.verb == "delete" {
        info.verb = "deletecollection".to_string();
    }
    Ok(info)
}

/// A query's parameters by name, each with its first value: kube-apiserver
/// reads a parameter that is not a list with Go's `url.Values.Get`, which
/// takes the first of repeated values.
pub(crate) fn query_parameters(query: Option<&str>) -> HashMap<String, String> {
    let mut parameters = HashMap::new();
    for (name, value) in crproxy_core::request::query_pairs(query) {
        parameters.entry(name).or_insert(value);
    }
    parameters
}

/// The object a field selector requires by `metadata.name`, read as kube reads
/// it: a selector that does not parse names nothing; otherwise the first `=` or
/// `==` clause on the field, in the sorted order of the clauses, names its
/// (unescaped) value when that could be a path segment (not `.` or `..`, no `/` or
/// `%`).
fn selected_name(selector: &str) -> Option<String> {
    let selector = crproxy_core::selector::FieldSelector::parse(selector).ok()?;
    let name = selector.requires_exact_match("metadata.name")?;
    let path_segment = !matches!(name, "." | "..") && !name.contains(['/', '%']);
    path_segment.then(|| name.to_owned())
}

#[cfg(test)]
mod tests;
