//! The one error type of this crate.

use serde_json::Value;
use std::path::{Path, PathBuf};

/// Everything that can go wrong talking to a Kubernetes API server.
///
/// Variants carry rendered strings rather than sources where the underlying error types
/// are private plumbing (hyper, rustls) whose top-level `Display` alone says little; the
/// string already holds the whole cause chain, so a log line is self-explanatory.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server answered with a non-2xx status. `reason` and `message` come from
    /// the `Status` body when there is one; otherwise `reason` is derived from the HTTP
    /// status (`NotFound`, `Conflict`, ...) and `message` is the (truncated) body text.
    /// `body` is the parsed JSON body, or the body text as a JSON string.
    #[error("the API server answered {status} {reason}: {message}")]
    Api {
        status: u16,
        reason: String,
        message: String,
        body: Value,
    },
    /// No connection could be made: the address refused or could not be reached.
    /// Check the server URL and network reachability.
    #[error("cannot connect to the API server: {0}")]
    Connect(String),
    /// The TLS handshake failed: the server's certificate is not trusted or does not
    /// name the server, or the server refused the client certificate.
    #[error("TLS handshake with the API server failed: {0}")]
    TlsHandshake(String),
    /// No answer in time: connecting, the response, or a watch that stayed silent
    /// past its idle limit.
    #[error("the API server did not answer in time: {0}")]
    Timeout(String),
    /// The exchange failed after the connection was made (an HTTP protocol error, a
    /// connection reset, a broken watch stream), or the request could not be built.
    #[error("request to the API server failed: {0}")]
    Transport(String),
    /// A kubeconfig file could not be used at all, see [`KubeconfigFileError`]. Shown
    /// as that error is, so `?` from `Kubeconfig::load` changes no message.
    #[error(transparent)]
    KubeconfigFile(#[from] KubeconfigFileError),
    /// The kubeconfig (or in-cluster service account files) is incomplete or names
    /// something unusable: unknown context/cluster/user, bad base64, an unreadable
    /// certificate or token file; or kubeconfig text given without a file
    /// (`Kubeconfig::from_yaml`) is not YAML.
    #[error("invalid kubeconfig: {0}")]
    Kubeconfig(String),
    /// A kubeconfig cluster names no CA (`certificate-authority` or
    /// `certificate-authority-data`) and does not set `insecure-skip-tls-verify`.
    /// crproxy has no system roots to fall back on, so it could not verify the API
    /// server: add the cluster's CA to the kubeconfig. The message names the cluster;
    /// callers name the kubeconfig file.
    #[error(
        "cluster {cluster:?} names no certificate-authority: crproxy trusts only the CAs its \
         kubeconfigs give; add the API server's CA as certificate-authority-data (or \
         certificate-authority), or set insecure-skip-tls-verify: true for development only"
    )]
    NoCertificateAuthority { cluster: String },
    /// The TLS material could not be used: unparseable PEM certificate or key, a key
    /// that does not match, or an invalid server name.
    #[error("invalid TLS configuration: {0}")]
    Tls(String),
    /// The current credentials could not be obtained: a token or certificate file
    /// became unreadable, or an exec plugin failed or printed no usable credential.
    #[error("cannot get credentials: {0}")]
    Credentials(String),
    /// A response (or a watch event) was not the JSON we expected.
    #[error("cannot decode the API server response: {0}")]
    Decode(String),
}

/// The kubeconfig file at `path` could not be used at all: it could not be read, or it
/// is not a kubeconfig. The only way [`Kubeconfig::load`](crate::Kubeconfig::load) fails,
/// so its callers need not handle the rest of [`Error`]. Fields rather than one string
/// so a caller that already names the file (`crproxy check-config`) can say what is
/// wrong without repeating it.
#[derive(Debug, thiserror::Error)]
#[error("invalid kubeconfig: {}", file_problem(.path, .problem))]
pub struct KubeconfigFileError {
    pub path: PathBuf,
    pub problem: KubeconfigFileProblem,
}

/// Why a kubeconfig file could not be used, see [`KubeconfigFileError`].
///
/// Texts rather than sources: the io error's own message is all a user needs, and a
/// source would be printed twice by renderers that follow the cause chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeconfigFileProblem {
    /// The file could not be read (missing, no permission, not UTF-8): the io error's
    /// text.
    Unreadable(String),
    /// The file was read but is not a kubeconfig, on one line: `bad YAML: ... at line
    /// L, column C`.
    Invalid(String),
}

/// The rendering of [`KubeconfigFileError`] after `invalid kubeconfig: `, naming the
/// file once.
fn file_problem(path: &Path, problem: &KubeconfigFileProblem) -> String {
    match problem {
        KubeconfigFileProblem::Unreadable(e) => format!("cannot read {}: {e}", path.display()),
        KubeconfigFileProblem::Invalid(problem) => format!("{}: {problem}", path.display()),
    }
}

impl Error {
    /// The HTTP status of an [`Error::Api`].
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The `reason` of an [`Error::Api`] (`NotFound`, `Conflict`, `AlreadyExists`, ...).
    pub fn reason(&self) -> Option<&str> {
        match self {
            Error::Api { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// 404, as kube-apiserver reports a missing object (or an unknown path).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Api { status: 404, .. }) || self.reason() == Some("NotFound")
    }

    /// 409 Conflict: a write carried a stale `metadata.resourceVersion`. Does not include
    /// `AlreadyExists`, which shares the status code.
    pub fn is_conflict(&self) -> bool {
        self.reason() == Some("Conflict")
    }

    /// 409 AlreadyExists: a create for a name that is taken.
    pub fn is_already_exists(&self) -> bool {
        self.reason() == Some("AlreadyExists")
    }

    /// Builds an [`Error::Api`] from a response status and body.
    pub fn from_response(status: u16, body: &[u8]) -> Error {
        let text = String::from_utf8_lossy(body);
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        match parsed {
            Some(v) if v.get("kind").and_then(Value::as_str) == Some("Status") => {
                let reason = v
                    .get("reason")
                    .and_then(Value::as_str)
                    .filter(|r| !r.is_empty())
                    .map(str::to_owned)
                    .unwrap_or_else(|| reason_for_status(status).to_owned());
                let message = v
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                Error::Api {
                    status,
                    reason,
                    message,
                    body: v,
                }
            }
            other => Error::Api {
                status,
                reason: reason_for_status(status).to_owned(),
                message: truncate(&text, 512),
                body: other.unwrap_or_else(|| Value::String(text.into_owned())),
            },
        }
    }

    /// Builds an [`Error::Api`] from the `Status` object of a watch `ERROR` event.
    pub fn from_status(status_obj: Value) -> Error {
        let code = status_obj
            .get("code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or(500);
        let reason = status_obj
            .get("reason")
            .and_then(Value::as_str)
            .filter(|r| !r.is_empty())
            .map(str::to_owned)
            .unwrap_or_else(|| reason_for_status(code).to_owned());
        let message = status_obj
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        Error::Api {
            status: code,
            reason,
            message,
            body: status_obj,
        }
    }
}

/// The `metav1.StatusReason` kube-apiserver uses for a bare HTTP status, so callers can
/// match on reasons even when a body is not a `Status` (for example a proxy in between).
pub fn reason_for_status(status: u16) -> &'static str {
    match status {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// Sorts a failed exchange by cause, so callers can tell a timeout from a refused
/// connection or an untrusted certificate. The message keeps the whole cause chain.
pub(crate) fn from_client_error(err: &hyper_util::client::legacy::Error) -> Error {
    let text = chain(err);
    if !err.is_connect() {
        return Error::Transport(text);
    }
    let mut cause = std::error::Error::source(err);
    while let Some(current) = cause {
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return Error::Timeout(text);
            }
            // tokio-rustls reports handshake failures as an io::Error around the
            // rustls error.
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
            {
                return Error::TlsHandshake(text);
            }
        }
        if current.is::<rustls::Error>() {
            return Error::TlsHandshake(text);
        }
        cause = current.source();
    }
    Error::Connect(text)
}

/// Renders an error with its whole `source()` chain, `a: b: c`.
pub(crate) fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(status: u16, body: &str, expected: (&str, &str, bool, bool, bool)) {
        let e = Error::from_response(status, body.as_bytes());
        let Error::Api {
            reason, message, ..
        } = &e
        else {
            panic!("not an Api error: {e:?}");
        };
        assert_eq!(
            (
                reason.as_str(),
                message.as_str(),
                e.is_not_found(),
                e.is_conflict(),
                e.is_already_exists()
            ),
            expected,
            "status {status} body {body}"
        );
    }

    #[test]
    fn api_errors_are_classified_like_client_go() {
        check(
            404,
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"leases.coordination.k8s.io \"x\" not found","reason":"NotFound","code":404}"#,
            (
                "NotFound",
                "leases.coordination.k8s.io \"x\" not found",
                true,
                false,
                false,
            ),
        );
        check(
            409,
            r#"{"kind":"Status","status":"Failure","message":"the object has been modified","reason":"Conflict","code":409}"#,
            (
                "Conflict",
                "the object has been modified",
                false,
                true,
                false,
            ),
        );
        check(
            409,
            r#"{"kind":"Status","status":"Failure","message":"exists","reason":"AlreadyExists","code":409}"#,
            ("AlreadyExists", "exists", false, false, true),
        );
        check(
            404,
            "404 page not found",
            ("NotFound", "404 page not found", true, false, false),
        );
        check(409, "", ("Conflict", "", false, true, false));
        check(
            500,
            r#"{"kind":"Status","status":"Failure","message":"boom","code":500}"#,
            ("InternalError", "boom", false, false, false),
        );
    }
}
