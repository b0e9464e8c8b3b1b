//! Classification of a request that reached one per-group/version proxy server.
//!
//! The aggregation layer only routes `/apis/<group>/<version>/...` here, but the proxy
//! listens on a socket and must not trust that: anything outside its own group/version
//! is 404, and anything whose meaning could differ between us and the target
//! (dot segments, encoded slashes, empty segments, unclear `watch` values) is refused
//! with 400 instead of being forwarded. The URL grammar follows kube-apiserver's
//! `RequestInfoFactory` for resource requests.

use std::borrow::Cow;
use std::fmt;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

#[cfg(test)]
mod tests;

/// What the caller wants to do, in kube-apiserver's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    /// The `verb` label value used by `apiserver_request_total` (HTTP-style, upper case).
    pub fn metric_label(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::List => "LIST",
            Verb::Watch => "WATCH",
            Verb::Create => "POST",
            Verb::Update => "PUT",
            Verb::Patch => "PATCH",
            Verb::Delete => "DELETE",
            Verb::DeleteCollection => "DELETECOLLECTION",
        }
    }

    /// Lower-case kube verb (`get`, `list`, ..., `deletecollection`), as RBAC names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }

    /// Whether the verb streams indefinitely (exempt from the non-watch deadline).
    pub fn is_watch(self) -> bool {
        self == Verb::Watch
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The resource part of a URL, percent-decoded: a value goes back into a URL only
/// through [`encode_segment`], or `default%3Fx` (the namespace `default?x`) becomes
/// the namespace `default` with a query.
///
/// Each part borrows the request's path unless its segment was escaped, so
/// classifying a request copies none of the usual ones.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourcePath<'a> {
    pub namespace: Option<Cow<'a, str>>,
    pub resource: Cow<'a, str>,
    pub name: Option<Cow<'a, str>>,
    pub subresource: Option<Cow<'a, str>>,
}

impl ResourcePath<'_> {
    /// True for a collection URL (no object name).
    pub fn is_collection(&self) -> bool {
        self.name.is_none()
    }
}

/// What a request is, for the proxy's purposes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestKind<'a> {
    /// `GET /apis/<group>/<version>`: the APIResourceList.
    Discovery,
    /// A resource request under this group/version.
    Resource { verb: Verb, path: ResourcePath<'a> },
    /// A connection upgrade or a connect-style subresource (exec, attach,
    /// portforward, proxy); the proxy refuses these with 501.
    Upgrade,
}

/// Why a request was not classified. [`PathError::status_code`] is the HTTP status to
/// answer with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Not under `/apis/<group>/<version>` of this server, or not a URL shape this
    /// group serves. kube-apiserver answers these with a plain `404 page not found`.
    #[error("404 page not found")]
    NotFound,
    /// Malformed or ambiguous URL, or a method that needs a name on a collection URL.
    #[error("{0}")]
    BadRequest(String),
    /// A method this URL never accepts (for example POST on discovery).
    #[error("{0}")]
    MethodNotAllowed(String),
    /// A verb a custom resource's subresource never serves (a create or a delete
    /// of `status` or `scale`), worded as kube's custom-resource handler words it,
    /// with `details` naming the group and the resource.
    #[error("{verb} is not supported on resources of kind \"{resource}.{group}\"")]
    VerbNotSupported {
        verb: &'static str,
        resource: String,
        group: String,
    },
    /// A create or a delete of a subresource no custom resource can declare (a
    /// CRD declares only `status` and `scale`): kube's custom-resource handler
    /// answers such a subresource as a missing object, whatever the verb.
    #[error("{resource}.{group} \"{name}\" not found")]
    ObjectNotFound {
        resource: String,
        group: String,
        name: String,
    },
}

impl PathError {
    /// The HTTP status code for this error.
    pub fn status_code(&self) -> u16 {
        match self {
            PathError::NotFound => 404,
            PathError::BadRequest(_) => 400,
            PathError::MethodNotAllowed(_) | PathError::VerbNotSupported { .. } => 405,
            PathError::ObjectNotFound { .. } => 404,
        }
    }

    /// The kube `Status.reason` matching [`PathError::status_code`].
    pub fn reason(&self) -> &'static str {
        match self {
            PathError::NotFound => "NotFound",
            PathError::BadRequest(_) => "BadRequest",
            PathError::MethodNotAllowed(_) | PathError::VerbNotSupported { .. } => {
                "MethodNotAllowed"
            }
            PathError::ObjectNotFound { .. } => "NotFound",
        }
    }

    /// The `Status` body kube sends for this error (a plain-text `404 page not
    /// found` is what kube sends for [`PathError::NotFound`], not a `Status`).
    pub fn status(&self) -> serde_json::Value {
        match self {
            PathError::VerbNotSupported {
                resource, group, ..
            } => crate::status::status_with_details(
                self.status_code(),
                self.reason(),
                self.to_string(),
                None,
                group,
                resource,
            ),
            PathError::ObjectNotFound {
                resource,
                group,
                name,
            } => crate::status::not_found(resource, group, name),
            _ => crate::status::status(self.status_code(), self.reason(), self.to_string()),
        }
    }
}

/// Subresources that open a stream to a container or a port rather than read or
/// write an object. They only ever work over an upgraded connection.
const CONNECT_SUBRESOURCES: [&str; 4] = ["exec", "attach", "portforward", "proxy"];

fn bad(msg: impl Into<String>) -> PathError {
    PathError::BadRequest(msg.into())
}

/// Splits a raw (still percent-encoded) path into decoded segments, refusing every
/// form whose meaning depends on who normalises it.
fn segments(path: &str) -> Result<Vec<Cow<'_, str>>, PathError> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(bad(format!(
            "invalid request path {path:?}: must start with '/'"
        )));
    };
    if rest.is_empty() {
        return Err(PathError::NotFound);
    }
    // Borrowed unless escaped: classifying a request allocated once per segment.
    let mut out = Vec::with_capacity(8);
    for raw in rest.split('/') {
        if raw.is_empty() {
            return Err(bad(format!(
                "invalid request path {path:?}: empty path segment"
            )));
        }
        // Most segments have no escapes at all; only those that do need the checks
        // for escapes and the decoding (every check below passes on them trivially).
        let escaped = raw.contains('%');
        if escaped {
            let lower = raw.to_ascii_lowercase();
            for (enc, what) in [
                ("%2f", "an encoded '/'"),
                ("%5c", "an encoded '\\'"),
                ("%2e", "an encoded '.'"),
                ("%00", "an encoded NUL"),
                ("%25", "an encoded '%'"),
            ] {
                if lower.contains(enc) {
                    return Err(bad(format!(
                        "invalid request path {path:?}: contains {what}"
                    )));
                }
            }
        }
        if raw.contains('\\') {
            return Err(bad(format!("invalid request path {path:?}: contains '\\'")));
        }
        let decoded = if escaped {
            Cow::Owned(
                percent_decode_str(raw)
                    .decode_utf8()
                    .map_err(|_| bad(format!("invalid request path {path:?}: not UTF-8")))?
                    .into_owned(),
            )
        } else {
            Cow::Borrowed(raw)
        };
        if decoded == "." || decoded == ".." {
            return Err(bad(format!(
                "invalid request path {path:?}: '.' and '..' segments are not allowed"
            )));
        }
        if decoded.chars().any(char::is_control) {
            return Err(bad(format!(
                "invalid request path {path:?}: control character in path"
            )));
        }
        out.push(decoded);
    }
    Ok(out)
}

/// Everything but RFC 3986's unreserved characters is escaped: what is left can be
/// neither a path nor a query delimiter, nor start an escape.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `segment` (a decoded namespace, name or resource) escaped to be exactly one path
/// segment again: `/`, `?`, `#` and `%` cannot end the segment or the path, or start
/// an escape, wherever the result is put. Borrowed when nothing needs escaping.
pub fn encode_segment(segment: &str) -> Cow<'_, str> {
    utf8_percent_encode(segment, UNRESERVED).into()
}

/// `value` escaped to be one query parameter value (`&`, `=`, `+` and `#` included),
/// e.g. a label selector or a continue token. Borrowed when nothing needs escaping.
pub fn encode_query_value(value: &str) -> Cow<'_, str> {
    utf8_percent_encode(value, UNRESERVED).into()
}

/// The decoded `(name, value)` pairs of a query string, in order, as Go's
/// `url.ParseQuery` reads it, which kube-apiserver does: a pair Go drops is not
/// among them ([`go_query_pairs`]).
pub fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    go_query_pairs(query)
        .map(|pair| (pair.name, pair.value))
        .collect()
}

/// One pair of a query, as it was written and as Go decodes it.
pub struct QueryPair<'q> {
    pub raw: &'q str,
    pub name: String,
    pub value: String,
}

/// The pairs of `query` that Go's `url.ParseQuery` keeps, in order: it drops an
/// empty one, one holding a `;`, and one whose name or value has a `%` not
/// followed by two hex digits.
pub fn go_query_pairs(query: Option<&str>) -> impl Iterator<Item = QueryPair<'_>> {
    query.unwrap_or("").split('&').filter_map(|raw| {
        if raw.is_empty() || raw.contains(';') {
            return None;
        }
        let (name, value) = raw.split_once('=').unwrap_or((raw, ""));
        Some(QueryPair {
            raw,
            name: go_query_unescape(name)?,
            value: go_query_unescape(value)?,
        })
    })
}

/// Go's `url.QueryUnescape`: `+` is a space and every `%` starts two hex
/// digits; `None` for a malformed escape.
pub fn go_query_unescape(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        rest = tail;
        match byte {
            b'+' => bytes.push(b' '),
            b'%' => {
                let (hex, tail) = rest.split_at_checked(2)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                let hex = std::str::from_utf8(hex).ok()?;
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
                rest = tail;
            }
            _ => bytes.push(byte),
        }
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// A boolean query parameter as kube's parameter codec reads it: only `0` and
/// `false` in any case are false, anything else (the empty string too) is true.
/// "Any case" is Go's `strings.EqualFold`, Unicode's simple case folding, under
/// which the long s (`ſ`, U+017F) is an `s`; no other character folds to a
/// letter of `false`.
pub fn query_bool(value: &str) -> bool {
    let mut chars = value.chars();
    let folds_to_false = "false".chars().all(|letter| {
        chars
            .next()
            .is_some_and(|c| c.to_ascii_lowercase() == letter || (letter == 's' && c == 'ſ'))
    }) && chars.next().is_none();
    !(value == "0" || folds_to_false)
}

/// The pairs of `query` Go keeps ([`go_query_pairs`]) whose decoded name `keep`
/// accepts, as they were written (still encoded), joined again with `&`.
pub fn retain_query(query: &str, keep: impl Fn(&str) -> bool) -> String {
    go_query_pairs(Some(query))
        .filter(|pair| keep(&pair.name))
        .map(|pair| pair.raw)
        .collect::<Vec<_>>()
        .join("&")
}

/// Whether a write with this query may leave stored state unchanged although it
/// succeeds: true whenever the query names `dryRun`. kube-apiserver reads every
/// `dryRun` value of the query as a list, dry-runs the request when they are all
/// `All` and refuses it for any other value, an empty one included; so a request
/// that names `dryRun` is either a dry run or fails. An answer it gets describes
/// a state that need not exist.
pub fn is_dry_run(query: Option<&str>) -> bool {
    query_pairs(query).iter().any(|(name, _)| name == "dryRun")
}

/// Whether the query asks for a watch, as the target's parameter codec reads
/// `watch` ([`query_bool`]: `f`, `yes` and an empty value are watches). Repeated
/// parameters that disagree are refused rather than guessed (kube takes the
/// first).
fn watch_param(query: Option<&str>) -> Result<bool, PathError> {
    let mut result: Option<bool> = None;
    for (k, v) in query_pairs(query) {
        if k != "watch" {
            continue;
        }
        let b = query_bool(&v);
        match result {
            Some(prev) if prev != b => {
                return Err(bad("conflicting values for query parameter \"watch\""));
            }
            _ => result = Some(b),
        }
    }
    Ok(result.unwrap_or(false))
}

/// Classifies one request for the server of `group`/`version`.
///
/// `path` is the raw request path (percent-encoded as received, without the query);
/// `query` is the raw query string without `?`; `wants_upgrade` is true when the
/// request carries `Connection: upgrade` or an `Upgrade` header.
pub fn classify<'a>(
    method: &str,
    path: &'a str,
    query: Option<&str>,
    wants_upgrade: bool,
    group: &str,
    version: &str,
) -> Result<RequestKind<'a>, PathError> {
    let segs = segments(path)?;
    let (legacy_watch, path_parts) = match locate(&segs, path, group, version)? {
        Located::GroupVersion if wants_upgrade => return Ok(RequestKind::Upgrade),
        Located::GroupVersion => {
            return match method {
                "GET" => Ok(RequestKind::Discovery),
                _ => Err(PathError::MethodNotAllowed(format!(
                "the server does not allow this method on the requested resource: {method} {path}"
            ))),
            }
        }
        Located::Resource { legacy_watch, path } => (legacy_watch, path),
    };

    let connect_sub = path_parts
        .subresource
        .as_deref()
        .is_some_and(|s| CONNECT_SUBRESOURCES.contains(&s));
    if wants_upgrade || connect_sub {
        return Ok(RequestKind::Upgrade);
    }

    let named = path_parts.name.is_some();
    let has_sub = path_parts.subresource.is_some();
    if legacy_watch && has_sub {
        // kube has no watch of a subresource; refuse rather than guess what the
        // target would do with it.
        return Err(bad(format!(
            "invalid request path {path:?}: subresources cannot be watched"
        )));
    }
    if legacy_watch && method != "GET" {
        return Err(PathError::MethodNotAllowed(format!(
            "the server does not allow this method on the requested resource: {method} {path}"
        )));
    }
    let verb = match method {
        "GET" if legacy_watch => Verb::Watch,
        "GET" if named => Verb::Get,
        "GET" => {
            if watch_param(query)? {
                Verb::Watch
            } else {
                Verb::List
            }
        }
        // A POST to a named custom-resource path is a create (kube answers 201 or
        // 409 AlreadyExists); subresources of custom resources cannot be created,
        // nor deleted. Whether the CRD declares `status` or `scale` is the
        // target's to know; kube's 405 for a declared one is the answer here.
        "POST" | "DELETE" if has_sub => {
            let ResourcePath {
                resource,
                name,
                subresource,
                ..
            } = path_parts;
            return Err(match subresource.as_deref() {
                Some("status" | "scale") => PathError::VerbNotSupported {
                    verb: if method == "POST" { "create" } else { "delete" },
                    resource: resource.into_owned(),
                    group: group.to_owned(),
                },
                _ => PathError::ObjectNotFound {
                    resource: resource.into_owned(),
                    group: group.to_owned(),
                    name: name.map(Cow::into_owned).unwrap_or_default(),
                },
            });
        }
        "POST" => Verb::Create,
        "PUT" | "PATCH" if !named => return Err(bad("name must be provided")),
        "PUT" => Verb::Update,
        "PATCH" => Verb::Patch,
        "DELETE" if named => Verb::Delete,
        "DELETE" => Verb::DeleteCollection,
        _ => {
            return Err(PathError::MethodNotAllowed(format!(
                "the server does not allow this method on the requested resource: {method} {path}"
            )))
        }
    };
    Ok(RequestKind::Resource {
        verb,
        path: path_parts,
    })
}

/// Where a path under `/apis/<group>/<version>` points.
enum Located<'a> {
    /// The group/version itself (its discovery document).
    GroupVersion,
    /// A resource, its collection or one of its objects; `legacy_watch` for a
    /// path under kube's `/watch/` prefix.
    Resource {
        legacy_watch: bool,
        path: ResourcePath<'a>,
    },
}

/// The resource a request's path names (`gadgets` of
/// `/apis/<group>/<version>/namespaces/ns/gadgets/g1/status`), whatever the
/// method, query and headers: a server that has only some resources of the
/// group/version answers for the others before judging the rest of the request.
pub fn path_resource(path: &str, group: &str, version: &str) -> Option<String> {
    let segs = segments(path).ok()?;
    match locate(&segs, path, group, version).ok()? {
        Located::Resource { path, .. } => Some(path.resource.into_owned()),
        Located::GroupVersion => None,
    }
}

/// Reads the decoded segments of `path` as a place under `/apis/<group>/<version>`.
fn locate<'a>(
    segs: &[Cow<'a, str>],
    path: &str,
    group: &str,
    version: &str,
) -> Result<Located<'a>, PathError> {
    let rest = match segs {
        [apis, g, v, rest @ ..] if apis == "apis" && g == group && v == version => rest,
        _ => return Err(PathError::NotFound),
    };
    if rest.is_empty() {
        return Ok(Located::GroupVersion);
    }

    // kube's legacy verb prefixes: `/watch/...` and `/proxy/...`.
    let (legacy_watch, rest) = match rest.first().map(Cow::as_ref) {
        Some("watch") => (true, &rest[1..]),
        Some("proxy") => {
            return Err(bad(format!(
                "invalid request path {path:?}: legacy proxy paths are not supported"
            )))
        }
        _ => (false, rest),
    };

    let (namespace, tail) = match rest {
        [ns_kw, ..] if ns_kw == "namespaces" => match rest {
            // `/namespaces` and `/namespaces/<ns>[/status|/finalize]` address core
            // Namespaces, which this group does not serve.
            [_] | [_, _] => return Err(PathError::NotFound),
            [_, _, sub] if sub == "status" || sub == "finalize" => return Err(PathError::NotFound),
            [_, ns, tail @ ..] => (Some(ns.clone()), tail),
            [] => return Err(PathError::NotFound),
        },
        _ => (None, rest),
    };

    let (resource, name, subresource) = match tail {
        [r] => (r.clone(), None, None),
        [r, n] => (r.clone(), Some(n.clone()), None),
        [r, n, s] => (r.clone(), Some(n.clone()), Some(s.clone())),
        _ => return Err(PathError::NotFound),
    };
    Ok(Located::Resource {
        legacy_watch,
        path: ResourcePath {
            namespace,
            resource,
            name,
            subresource,
        },
    })
}
