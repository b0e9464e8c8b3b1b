//! Errors: [`Error`] for the embedding API (`start`, listeners, files) and
//! [`ApiError`], a Kubernetes `Status` failure that a request handler returns to the
//! client with kube-apiserver's exact code, reason, message and details.

use serde_json::{json, Map, Value};
use std::path::PathBuf;

/// Starting, stopping or configuring a devcluster failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file in the data directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Binding a listener failed (port in use, address not local).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// A certificate could not be generated or a stored one could not be loaded.
    #[error("certificates: {0}")]
    Pki(#[from] crproxy_core::pki::PkiError),
    /// The TLS configuration was rejected (bad key or certificate).
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The embedded database could not be opened, read or written; delete the data
    /// directory's `store.redb` if it is corrupt.
    #[error("store: {0}")]
    Store(String),
    /// A stored file had unexpected content (for example a malformed tokens.csv line).
    #[error("{path}: {message}")]
    Format { path: PathBuf, message: String },
    /// The aggregation layer could not start (its front-proxy certificate is unusable).
    #[error("aggregation: {0}")]
    Aggregation(String),
    /// The named listener does not exist (already stopped, or never added).
    #[error("no listener on {0}")]
    NoListener(std::net::SocketAddr),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// A request failed: rendered as a `v1 Status` object with HTTP status `code`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    /// Empty for the few failures that kube sends without a reason (500 on a bad
    /// resourceVersion).
    pub reason: String,
    pub message: String,
    /// `None` omits the field; `Some(empty)` sends `details: {}`.
    pub details: Option<Map<String, Value>>,
    /// Extra response headers (for example `Retry-After`).
    pub headers: Vec<(String, String)>,
}

/// One entry of `details.causes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

impl Cause {
    pub fn new(reason: &str, message: impl Into<String>, field: impl Into<String>) -> Self {
        Cause {
            reason: reason.to_string(),
            message: message.into(),
            field: field.into(),
        }
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("reason".into(), json!(self.reason));
        m.insert("message".into(), json!(self.message));
        if !self.field.is_empty() {
            m.insert("field".into(), json!(self.field));
        }
        Value::Object(m)
    }
}

/// `details` of a Status: which object the failure is about.
#[derive(Clone, Debug, Default)]
pub struct Details<'a> {
    pub name: &'a str,
    pub group: &'a str,
    pub kind: &'a str,
    pub uid: &'a str,
    pub causes: Vec<Cause>,
}

impl Details<'_> {
    pub fn to_map(&self) -> Map<String, Value> {
        let mut m = Map::new();
        if !self.name.is_empty() {
            m.insert("name".into(), json!(self.name));
        }
        if !self.group.is_empty() {
            m.insert("group".into(), json!(self.group));
        }
        if !self.kind.is_empty() {
            m.insert("kind".into(), json!(self.kind));
        }
        if !self.uid.is_empty() {
            m.insert("uid".into(), json!(self.uid));
        }
        if !self.causes.is_empty() {
            m.insert(
                "causes".into(),
                Value::Array(self.causes.iter().map(Cause::to_json).collect()),
            );
        }
        m
    }
}

/// `<resource>.<group>` as kube prints a group resource (`crontabs.stable.example.io`,
/// or just `configmaps` for the core group).
pub fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
            headers: Vec::new(),
        }
    }

    pub fn with_details(mut self, details: Details<'_>) -> Self {
        self.details = Some(details.to_map());
        self
    }

    pub fn with_empty_details(mut self) -> Self {
        self.details = Some(Map::new());
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(500, "InternalError", message)
    }

    /// kube's `errors.NewInternalError(err)`: 500 `InternalError`, the message
    /// prefixed, and the bare error as the one cause (no reason, no field).
    pub fn internal_error(error: &str) -> Self {
        let mut details = Map::new();
        details.insert("causes".into(), json!([{ "message": error }]));
        ApiError {
            details: Some(details),
            ..ApiError::new(
                500,
                "InternalError",
                format!("Internal error occurred: {error}"),
            )
        }
    }

    /// What kube's handlers answer for an error a registry returned that is not
    /// a Status (`ErrorToAPIStatus`): 500, reason `Unknown`, the error's text.
    pub fn unknown(error: impl Into<String>) -> Self {
        ApiError::new(500, "Unknown", error)
    }

    /// A missing object: `crontabs.stable.example.io "x" not found`.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(resource, group)),
        )
        .with_details(Details {
            name,
            group,
            kind: resource,
            ..Default::default()
        })
    }

    /// An unknown resource under `/api/v1`.
    pub fn resource_not_found() -> Self {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_empty_details()
    }

    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(resource, group)),
        )
        .with_details(Details {
            name,
            group,
            kind: resource,
            ..Default::default()
        })
    }

    /// Stale resourceVersion on update.
    pub fn conflict_modified(group: &str, resource: &str, name: &str) -> Self {
        Self::conflict(
            group,
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// kube's 409 for a write the registry could not make (`errors.NewConflict`
    /// of the resource): `Operation cannot be fulfilled on <resource>.<group>
    /// "<name>": <why>`, the details naming the resource as the kind.
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(resource, group)
            ),
        )
        .with_details(Details {
            name,
            group,
            kind: resource,
            ..Default::default()
        })
    }

    /// 422 Invalid in kube's format: `<Kind>.<group> "name" is invalid: c1` or
    /// `[c1, c2]` with several causes. `kind` is the Kind (or plural, as the caller
    /// needs: kube is not consistent).
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        // kube's aggregate error prints identical causes once.
        let mut rendered: Vec<String> = Vec::new();
        for c in &causes {
            let r = if c.field.is_empty() {
                c.message.clone()
            } else {
                format!("{}: {}", c.field, c.message)
            };
            if !rendered.contains(&r) {
                rendered.push(r);
            }
        }
        let list = if rendered.len() == 1 {
            rendered[0].clone()
        } else {
            format!("[{}]", rendered.join(", "))
        };
        ApiError::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {list}", qualified(kind, group)),
        )
        .with_details(Details {
            name,
            group,
            kind,
            causes,
            ..Default::default()
        })
    }

    pub fn method_not_allowed() -> Self {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_empty_details()
    }

    /// A verb a custom resource's subresource does not serve, as kube's
    /// custom-resource handler answers it (`create is not supported on resources of
    /// kind "crontabs.stable.example.io"`).
    pub fn method_not_supported(group: &str, resource: &str, verb: &str) -> Self {
        ApiError::new(
            405,
            "MethodNotAllowed",
            format!(
                "{verb} is not supported on resources of kind \"{}\"",
                qualified(resource, group)
            ),
        )
        .with_details(Details {
            group,
            kind: resource,
            ..Default::default()
        })
    }

    pub fn unsupported_media_type(accepted: &str) -> Self {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: {accepted}"),
        )
    }

    /// A failure given as a `Status` object (what the authn, RBAC, schema and
    /// admission modules return).
    pub fn from_status(status: &Value) -> Self {
        let code = status
            .get("code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or(500);
        ApiError {
            code,
            reason: status
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            message: status
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            details: status.get("details").and_then(Value::as_object).cloned(),
            // kube's error writer turns details.retryAfterSeconds into Retry-After
            // (a webhook denying with 503 and a retry delay reaches the client so).
            headers: status
                .pointer("/details/retryAfterSeconds")
                .and_then(Value::as_u64)
                .filter(|s| *s > 0)
                .map(|s| vec![("Retry-After".to_string(), s.to_string())])
                .unwrap_or_default(),
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut m = Map::new();
        m.insert("kind".into(), json!("Status"));
        m.insert("apiVersion".into(), json!("v1"));
        m.insert("metadata".into(), json!({}));
        m.insert("status".into(), json!("Failure"));
        m.insert("message".into(), json!(self.message));
        if !self.reason.is_empty() {
            m.insert("reason".into(), json!(self.reason));
        }
        if let Some(d) = &self.details {
            m.insert("details".into(), Value::Object(d.clone()));
        }
        m.insert("code".into(), json!(self.code));
        Value::Object(m)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(err: ApiError, expected: Value) {
        assert_eq!(err.to_status(), expected);
    }

    #[test]
    fn statuses_render_as_kube_does() {
        check(
            ApiError::not_found("stable.example.io", "crontabs", "x"),
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                "message":"crontabs.stable.example.io \"x\" not found","reason":"NotFound",
                "details":{"name":"x","group":"stable.example.io","kind":"crontabs"},"code":404}),
        );
        check(
            ApiError::invalid(
                "stable.example.io",
                "CronTab",
                "b",
                vec![
                    Cause::new("FieldValueInvalid", "Invalid value: 11: too big", "spec.r"),
                    Cause::new("FieldValueRequired", "Required value", "spec.c"),
                ],
            ),
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                "message":"CronTab.stable.example.io \"b\" is invalid: [spec.r: Invalid value: 11: too big, spec.c: Required value]",
                "reason":"Invalid",
                "details":{"name":"b","group":"stable.example.io","kind":"CronTab","causes":[
                    {"reason":"FieldValueInvalid","message":"Invalid value: 11: too big","field":"spec.r"},
                    {"reason":"FieldValueRequired","message":"Required value","field":"spec.c"}]},
                "code":422}),
        );
        check(
            ApiError::new(500, "", "boom"),
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"boom","code":500}),
        );
    }
}
