//! The owned-mode rules (`accessResources: owned`): which objects belong to a client,
//! how the ownership labels get into write bodies, how list/watch queries are narrowed
//! to owned objects, and how a named GET response is judged before it is shown.
//!
//! Invariant: a caller can narrow what it sees but never widen it. Selectors are ANDed
//! with the owner selector, never replaced by the caller's; write bodies get the labels
//! set last, overriding whatever the caller sent; a response we cannot read is treated
//! as not owned.

use std::borrow::Cow;

use serde_json::Value;

use crate::request::go_query_pairs;
use crate::request_body::{BodyError, CallerValue, ShapeError, WriteBody};
use crate::selector::{LabelSelector, Operator, Requirement, SelectorError};

mod scan;
#[cfg(test)]
mod tests;

/// Label naming the client virtual cluster that owns an object on the target.
pub const OWNER_VCLUSTER_LABEL: &str = "vcluster.com/owner-vcluster";
/// Label naming the client's Platform project (the project name, not its namespace).
pub const OWNER_PROJECT_LABEL: &str = "vcluster.com/owner-project";

/// The client on whose behalf the proxy acts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    /// Client virtual cluster name.
    pub name: String,
    /// Client Platform project name.
    pub project: String,
}

impl Owner {
    pub fn new(name: impl Into<String>, project: impl Into<String>) -> Owner {
        Owner {
            name: name.into(),
            project: project.into(),
        }
    }

    /// `vcluster.com/owner-project=<project>,vcluster.com/owner-vcluster=<name>`.
    ///
    /// Built without validation so an odd name still yields a selector that matches
    /// nothing else; the config validation rejects such names up front.
    pub fn selector(&self) -> LabelSelector {
        LabelSelector::from_requirements(vec![
            Requirement {
                key: OWNER_VCLUSTER_LABEL.to_owned(),
                operator: Operator::Equals,
                values: vec![self.name.clone()],
            },
            Requirement {
                key: OWNER_PROJECT_LABEL.to_owned(),
                operator: Operator::Equals,
                values: vec![self.project.clone()],
            },
        ])
    }

    /// True when the object carries both ownership labels with exactly this owner's
    /// values.
    pub fn owns(&self, object: &Value) -> bool {
        let labels = object.get("metadata").and_then(|m| m.get("labels"));
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        label(OWNER_VCLUSTER_LABEL) == Some(self.name.as_str())
            && label(OWNER_PROJECT_LABEL) == Some(self.project.as_str())
    }
}

/// How a request body is encoded, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BodyType {
    /// `application/json` (create, update).
    Json,
    /// `application/yaml` (create, update).
    Yaml,
    /// `application/merge-patch+json`.
    MergePatch,
    /// `application/json-patch+json`.
    JsonPatch,
    /// `application/apply-patch+yaml` (server-side apply; YAML or JSON text).
    ApplyPatchYaml,
    /// `application/strategic-merge-patch+json`.
    StrategicMergePatch,
}

impl BodyType {
    /// Parses a `Content-Type` value; parameters (`; charset=utf-8`) and case are
    /// ignored. Protobuf, CBOR and anything else give `None`: the proxy cannot read
    /// them, so it cannot stamp ownership labels into them.
    pub fn from_content_type(ct: &str) -> Option<BodyType> {
        let essence = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        Some(match essence.as_str() {
            "application/json" => BodyType::Json,
            "application/yaml" => BodyType::Yaml,
            "application/merge-patch+json" => BodyType::MergePatch,
            "application/json-patch+json" => BodyType::JsonPatch,
            "application/apply-patch+yaml" => BodyType::ApplyPatchYaml,
            "application/strategic-merge-patch+json" => BodyType::StrategicMergePatch,
            _ => return None,
        })
    }

    /// The canonical media type.
    pub fn media_type(self) -> &'static str {
        match self {
            BodyType::Json => "application/json",
            BodyType::Yaml => "application/yaml",
            BodyType::MergePatch => "application/merge-patch+json",
            BodyType::JsonPatch => "application/json-patch+json",
            BodyType::ApplyPatchYaml => "application/apply-patch+yaml",
            BodyType::StrategicMergePatch => "application/strategic-merge-patch+json",
        }
    }
}

/// Same as [`BodyType::from_content_type`].
pub fn from_content_type(ct: &str) -> Option<BodyType> {
    BodyType::from_content_type(ct)
}

/// Returns the body with both ownership labels set to `owner`'s values, as JSON.
///
/// The body is read strictly ([`WriteBody::parse`]) and labelled by
/// [`stamp_owner_labels`]; see there for what each media type gets.
pub fn inject_owner_labels(
    owner: &Owner,
    body_type: BodyType,
    body: &[u8],
) -> Result<Vec<u8>, BodyError> {
    let mut body = WriteBody::parse(Some(body_type.media_type()), body)?;
    stamp_owner_labels(owner, &mut body)?;
    Ok(body.to_bytes())
}

/// Sets both ownership labels to `owner`'s values in a write body.
///
/// - JSON, YAML, merge patch, strategic merge patch and server-side apply:
///   `metadata.labels` is created when missing or `null` and both labels are set,
///   overriding any caller value (including `null`, which in a patch would delete
///   the label). Always on the body's own `metadata`, even when its `kind` ends
///   in `List` and it has `items`: kube stores the body as one object.
/// - JSON patch: two `add` operations are appended, so they win over any earlier
///   operation of the caller. They do not create `/metadata/labels`: the proxy only
///   sends a named PATCH after its ownership GET found both labels on the object, so
///   the map exists; if the caller's own operations remove it, the target rejects the
///   patch, which fails closed.
///
/// A shape that cannot carry labels (an array for a create, `metadata` that is a
/// string) is an error: the request must then be refused, never sent unlabelled.
pub fn stamp_owner_labels(owner: &Owner, body: &mut WriteBody) -> Result<(), BodyError> {
    if body.body_type != BodyType::JsonPatch {
        return Ok(body.set_labels(&owner_labels(owner))?);
    }
    let adds = owner_labels(owner)
        .into_iter()
        .map(|(key, value)| {
            serde_json::json!({
                "op": "add",
                "path": label_pointer(key),
                "value": value,
            })
        })
        .collect();
    Ok(body.add_operations(Vec::new(), adds)?)
}

/// Whether a write's body names an owner itself: either ownership label set to a
/// string (an object read from the target and sent back keeps its owner's labels).
/// A body whose `metadata` or labels cannot carry labels is the error stamping
/// it would meet.
pub fn names_an_owner(body: &WriteBody) -> Result<bool, ShapeError> {
    for key in [OWNER_VCLUSTER_LABEL, OWNER_PROJECT_LABEL] {
        if matches!(body.label(key)?, CallerValue::Text(_)) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The JSON pointer of a label, `/metadata/labels/<key>` with RFC 6901 escaping.
pub fn label_pointer(key: &str) -> String {
    format!(
        "/metadata/labels/{}",
        key.replace('~', "~0").replace('/', "~1")
    )
}

/// Both ownership labels of `owner`, as (key, value).
pub fn owner_labels(owner: &Owner) -> [(&'static str, &str); 2] {
    [
        (OWNER_VCLUSTER_LABEL, owner.name.as_str()),
        (OWNER_PROJECT_LABEL, owner.project.as_str()),
    ]
}

/// Most parameters a scoped query may have, the owner selector included.
///
/// The owner selector holds only while the target reads the query at all. Go
/// (1.24.12 and 1.25.6 on, GODEBUG `urlmaxqueryparams`, 10 000 unless an
/// operator lowers it) drops a query of too many parameters whole and kube
/// ignores the error, so a caller's padding would turn an owned list into a
/// list of every tenant's objects. A list or watch of kubectl or client-go
/// sends a dozen at most. The bound is on the scoped query; a paged read of a
/// deletecollection adds `limit` and `continue` to it, 102 at most.
pub const MAX_SCOPED_QUERY_PARAMS: usize = 100;

/// Why a query cannot be scoped to an owner.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// A caller's label selector kube would refuse; its message is kube's.
    #[error(transparent)]
    Selector(#[from] SelectorError),
    /// More parameters than [`MAX_SCOPED_QUERY_PARAMS`].
    #[error("the query has {count} parameters; a list or watch may have at most {max}")]
    TooManyParameters { count: usize, max: usize },
}

/// Rewrites a query so every list or watch only sees this owner's objects.
///
/// The caller's selector is the one kube reads: the first `labelSelector` parameter
/// Go's query parser keeps ([`go_query_pairs`]; the pairs it drops are left out), as
/// kube ignores the others. It is ANDed with the owner selector, and every
/// `labelSelector` parameter is replaced by that one at the position of the first;
/// without one, it is appended. Other parameters keep their order and their original
/// encoding; empty ones go. A caller selector that fails to parse is returned as the
/// error kube would give (a 400 for the caller), never dropped, and so is a query
/// longer than [`MAX_SCOPED_QUERY_PARAMS`].
pub fn scoped_query(query: Option<&str>, owner: &Owner) -> Result<String, ScopeError> {
    let mut combined = owner.selector();
    let mut read_caller_selector = false;
    let mut parts: Vec<Option<&str>> = Vec::new();
    let mut slot: Option<usize> = None;
    // A pair the target's Go drops is not sent to it at all, so that nothing
    // between the two can read it differently.
    for pair in go_query_pairs(query) {
        if pair.name == "labelSelector" {
            if !read_caller_selector {
                combined = combined.and(LabelSelector::parse(&pair.value)?);
                read_caller_selector = true;
            }
            if slot.is_none() {
                slot = Some(parts.len());
                parts.push(None);
            }
        } else {
            parts.push(Some(pair.raw));
        }
    }
    let encoded = format!(
        "labelSelector={}",
        crate::request::encode_query_value(&combined.to_string())
    );
    if slot.is_none() {
        parts.push(None);
    }
    if parts.len() > MAX_SCOPED_QUERY_PARAMS {
        return Err(ScopeError::TooManyParameters {
            count: parts.len(),
            max: MAX_SCOPED_QUERY_PARAMS,
        });
    }
    let out: Vec<&str> = parts
        .iter()
        .map(|p| p.unwrap_or(encoded.as_str()))
        .collect();
    Ok(out.join("&"))
}

/// Whether a named GET response may be shown to the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// Carries both ownership labels with this owner's values.
    Owned,
    /// Readable, but not this owner's: mask as 404.
    NotOwned,
    /// Could not be judged (not JSON, no metadata, a Table without row objects):
    /// mask as 404 as well.
    Undecodable,
}

/// Judges a JSON named-GET response: a plain object, a `PartialObjectMetadata`, or a
/// `meta.k8s.io` `Table` whose rows carry `object.metadata` (kubectl's default
/// `includeObject=Metadata`). Every row must be owned. The body must be valid JSON
/// (UTF-8) throughout; only the fields that decide are looked at (see `scan`).
pub fn response_visibility(owner: &Owner, body: &[u8]) -> Visibility {
    scan::visibility(owner, body)
}

/// Rewrites an `Accept` header so the target answers a named GET in JSON the proxy
/// can inspect: JSON media ranges (including the `as=Table` and
/// `as=PartialObjectMetadata` forms) are kept in order, everything else (protobuf,
/// CBOR, YAML, wildcards) is dropped, and `application/json` is used when nothing
/// remains. Borrowed when nothing changes: most callers ask for JSON alone, written
/// without spaces, and their value goes on as it came, without a copy.
pub fn inspectable_accept(accept: Option<&str>) -> Cow<'_, str> {
    let accept = accept.unwrap_or("");
    if accept
        .split(',')
        .all(|range| range == range.trim() && is_inspectable_range(range))
    {
        return Cow::Borrowed(accept);
    }
    let kept: Vec<&str> = accept
        .split(',')
        .map(str::trim)
        .filter(|range| is_inspectable_range(range))
        .collect();
    if kept.is_empty() {
        Cow::Borrowed("application/json")
    } else {
        Cow::Owned(kept.join(","))
    }
}

/// Whether one media range of an `Accept` header asks for JSON and is acceptable.
fn is_inspectable_range(range: &str) -> bool {
    let mut params = range.split(';').map(str::trim);
    let essence = params.next().unwrap_or("");
    // `q=0` means "not acceptable"; keeping it would leave nothing usable.
    let refused = params.any(|p| {
        p.split_once('=').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("q") && v.trim().parse::<f32>().is_ok_and(|q| q <= 0.0)
        })
    });
    essence.eq_ignore_ascii_case("application/json") && !refused
}
