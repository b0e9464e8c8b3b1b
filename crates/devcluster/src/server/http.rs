//! HTTP plumbing: body types, response builders, content negotiation and request
//! body decoding, with kube-apiserver's error texts.
//!
//! Formats: JSON and YAML both ways; Kubernetes protobuf only as a request body
//! for the kinds kubectl's typed clients send (see `protobuf.rs`), answered in
//! JSON; CBOR (`application/cbor`) not at all: such bodies get 415, and an
//! `Accept` that lists nothing but CBOR gets 406.

use crate::error::ApiError;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, Version};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use serde_json::Value;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A query's parameters by name, each with its first value (see
/// [`crate::request_info::query_parameters`]).
pub(crate) use crate::request_info::query_parameters;

/// Every response body: a full buffer or a stream (watches).
pub type Body = BoxBody<Bytes, std::io::Error>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

pub fn empty() -> Body {
    full(Bytes::new())
}

/// The representation a client asked for with `Accept`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Json,
    Yaml,
    Table,
    PartialObjectMetadata,
    PartialObjectMetadataList,
    /// Aggregated discovery (`as=APIGroupDiscoveryList`), v2 or v2beta1.
    Discovery(DiscoveryVersion),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiscoveryVersion {
    V2,
    V2Beta1,
}

struct MediaRange<'a> {
    essence: String,
    params: Vec<(&'a str, &'a str)>,
}

fn parse_accept(accept: &str) -> Vec<MediaRange<'_>> {
    accept
        .split(',')
        .filter_map(|part| {
            let mut pieces = part.split(';');
            let essence = pieces.next()?.trim().to_ascii_lowercase();
            if essence.is_empty() {
                return None;
            }
            let params = pieces
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((k.trim(), v.trim().trim_matches('"')))
                })
                .collect();
            Some(MediaRange { essence, params })
        })
        .collect()
}

/// Picks the response representation; `None` means nothing acceptable (406).
/// Protobuf is answered with JSON, as kube's clients all accept JSON too.
pub fn negotiate(accept: Option<&str>) -> Option<Output> {
    negotiate_for(accept, true)
}

/// [`negotiate`] for a server with or without aggregated discovery: without,
/// its media ranges are unknown ones, as to a kube-apiserver before 1.26.
pub fn negotiate_for(accept: Option<&str>, aggregated_discovery: bool) -> Option<Output> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(Output::Json);
    };
    let mut protobuf = false;
    for range in parse_accept(accept) {
        let param = |name: &str| {
            range
                .params
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| *v)
        };
        let out = match range.essence.as_str() {
            "application/json" | "application/*" | "*/*" => match param("as") {
                None => Some(Output::Json),
                Some("Table") if param("g") == Some("meta.k8s.io") => Some(Output::Table),
                Some("PartialObjectMetadata") if param("g") == Some("meta.k8s.io") => {
                    Some(Output::PartialObjectMetadata)
                }
                Some("PartialObjectMetadataList") if param("g") == Some("meta.k8s.io") => {
                    Some(Output::PartialObjectMetadataList)
                }
                Some("APIGroupDiscoveryList")
                    if aggregated_discovery && param("g") == Some("apidiscovery.k8s.io") =>
                {
                    match param("v") {
                        Some("v2") => Some(Output::Discovery(DiscoveryVersion::V2)),
                        Some("v2beta1") => Some(Output::Discovery(DiscoveryVersion::V2Beta1)),
                        _ => None,
                    }
                }
                Some(_) => None,
            },
            "application/yaml" => param("as").is_none().then_some(Output::Yaml),
            "application/vnd.kubernetes.protobuf" => {
                protobuf = true;
                None
            }
            _ => None,
        };
        if out.is_some() {
            return out;
        }
    }
    protobuf.then_some(Output::Json)
}

pub fn not_acceptable() -> ApiError {
    ApiError::new(
        406,
        "NotAcceptable",
        "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf",
    )
}

/// The format of a request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFormat {
    Json,
    Yaml,
    /// Kubernetes protobuf (only the few types kubectl's typed clients send).
    Protobuf,
}

/// Reads `Content-Type` for create/update bodies.
pub fn body_format(headers: &HeaderMap) -> Result<BodyFormat, ApiError> {
    let ct = content_type(headers);
    match ct.as_str() {
        "" | "application/json" => Ok(BodyFormat::Json),
        "application/yaml" => Ok(BodyFormat::Yaml),
        "application/vnd.kubernetes.protobuf" => Ok(BodyFormat::Protobuf),
        _ => Err(ApiError::unsupported_media_type(
            "application/json, application/yaml, application/vnd.kubernetes.protobuf",
        )),
    }
}

/// The media type of `Content-Type` without parameters, lower-cased.
pub fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

/// Parses a JSON or YAML body into a value. `kind` names the expected kind in the
/// error message as kube does.
pub fn decode_body(bytes: &[u8], format: BodyFormat, kind: &str) -> Result<Value, ApiError> {
    match format {
        BodyFormat::Json => serde_json::from_slice(bytes).map_err(|e| {
            let text = String::from_utf8_lossy(bytes);
            let excerpt: String = text.chars().take(100).collect();
            ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {kind}): couldn't get version/kind; json parse error: {} ({excerpt})",
                go_json_error(&e, bytes)
            ))
        }),
        BodyFormat::Protobuf => super::protobuf::decode(bytes).map_err(|e| {
            ApiError::unsupported_media_type(&format!(
                "application/json, application/yaml ({e})"
            ))
        }),
        BodyFormat::Yaml => decode_yaml(bytes).map_err(|e| {
            ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {kind}): couldn't get version/kind; yaml parse error: {e}"
            ))
        }),
    }
}

/// Go's encoding/json wording for the common syntax errors (clients and tests
/// match on it); other errors keep serde's text.
fn go_json_error(e: &serde_json::Error, bytes: &[u8]) -> String {
    use serde_json::error::Category;
    if e.classify() == Category::Eof {
        return "unexpected end of JSON input".into();
    }
    // serde reports 1-based line/column; find the offending character.
    let offset = bytes
        .split(|b| *b == b'\n')
        .take(e.line().saturating_sub(1))
        .map(|l| l.len() + 1)
        .sum::<usize>()
        + e.column().saturating_sub(1);
    let ch = bytes.get(offset).map(|b| *b as char);
    let text = e.to_string();
    match ch {
        Some(c) if text.starts_with("key must be a string") => {
            format!("invalid character '{c}' looking for beginning of object key string")
        }
        Some(c) if text.starts_with("expected value") => {
            format!("invalid character '{c}' looking for beginning of value")
        }
        _ => text,
    }
}

/// YAML (which includes JSON) into a JSON value.
pub fn decode_yaml(bytes: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    // JSON is valid YAML, but the JSON parser keeps numbers exact.
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Ok(v);
    }
    serde_saphyr::from_str::<Value>(text).map_err(|e| crproxy_core::yaml_error::one_line(&e))
}

/// A JSON or YAML response with the given status.
pub fn object_response(status: u16, value: &Value, output: Output) -> Response<Body> {
    let (bytes, ct) = match output {
        Output::Yaml => (
            serde_saphyr::to_string(value)
                .map(Bytes::from)
                .unwrap_or_else(|_| Bytes::from(value.to_string())),
            "application/yaml",
        ),
        _ => (
            Bytes::from(serde_json::to_vec(value).unwrap_or_default()),
            "application/json",
        ),
    };
    let mut resp = Response::new(full(bytes));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    resp.headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static(ct));
    resp
}

pub fn json_response(status: u16, value: &Value) -> Response<Body> {
    object_response(status, value, Output::Json)
}

/// A `Status` failure, with the error's own headers.
pub fn error_response(err: &ApiError) -> Response<Body> {
    let mut resp = json_response(err.code, &err.to_status());
    for (k, v) in &err.headers {
        if let (Ok(name), Ok(value)) = (
            http::header::HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            resp.headers_mut().append(name, value);
        }
    }
    resp
}

/// kube's plain-text 404 for paths nothing is registered at, as Go's
/// `http.NotFound` writes it (with `X-Content-Type-Options: nosniff`).
pub fn plain_not_found() -> Response<Body> {
    go_not_found().map(full)
}

/// Go's `http.NotFound`: the plain 404 at the end of kube's server chain.
pub fn go_not_found() -> Response<Bytes> {
    nosniff(text_plain(StatusCode::NOT_FOUND, "404 page not found\n"))
}

/// `text` as `text/plain; charset=utf-8` with `status`.
pub fn text_plain(status: StatusCode, text: &str) -> Response<Bytes> {
    let mut resp = Response::new(Bytes::from(text.to_owned()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// `resp` with `X-Content-Type-Options: nosniff`, as Go's `http.Error` and
/// `http.NotFound` and kube's health endpoints send their text. Any body: the
/// aggregator's answers use it too.
pub fn nosniff<B>(mut resp: Response<B>) -> Response<B> {
    resp.headers_mut().insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// `error` answered with [`nosniff`]'s header, as kube's Forbidden writer
/// sends it.
pub fn nosniff_error(error: ApiError) -> ApiError {
    error.header(http::header::X_CONTENT_TYPE_OPTIONS.as_str(), "nosniff")
}

pub fn text_response(status: u16, text: &str) -> Response<Body> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    text_plain(status, text).map(full)
}

/// Adds a `Warning: 299 - "..."` header per message.
pub fn add_warnings(resp: &mut Response<Body>, warnings: &[String]) {
    for w in warnings {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            resp.headers_mut().append(http::header::WARNING, v);
        }
    }
}

/// How much of an answer Go's net/http keeps before it has to send the head
/// (`bufferBeforeChunkingSize`): a handler that finished within it gets a
/// Content-Length, a longer answer goes out chunked.
const GO_HTTP1_BUFFER: u64 = 2048;
/// The same for golang.org/x/net/http2 (`handlerChunkWriteSize`): a longer
/// answer goes out in DATA frames with no content-length.
const GO_HTTP2_BUFFER: u64 = 4096;

/// Frames `response` as kube-apiserver's Go server frames an answer it wrote
/// whole: a body up to Go's buffer with its length, a longer one without
/// (chunked over HTTP/1.1). The recordings show it: a named CronTab (600 bytes)
/// comes with a Content-Length, a CRD or a table of a few KiB chunked. A proxy
/// in front of kube has to handle both, so devcluster answers both ways too.
/// A response that already names its length (an aggregated server's, passed
/// through as Go's reverse proxy does) keeps it.
pub fn framed_like_go(version: Version, response: Response<Body>) -> Response<Body> {
    let buffer = match version {
        Version::HTTP_2 => GO_HTTP2_BUFFER,
        _ => GO_HTTP1_BUFFER,
    };
    let announced = response
        .headers()
        .contains_key(http::header::CONTENT_LENGTH);
    let longer = http_body::Body::size_hint(response.body())
        .exact()
        .is_some_and(|length| length > buffer);
    if announced || !longer {
        return response;
    }
    response.map(|body| BoxBody::new(Unannounced(body)))
}

/// The answer to a HEAD as Go's server gives it, from the GET's answer framed by
/// [`framed_like_go`]: its status and headers, no body, and a Content-Length
/// where the GET would have one (a body that fits Go's buffer, or one whose
/// length the handler named). hyper's HTTP/2 server would send the body.
pub fn headed_like_go(response: Response<Body>) -> Response<Body> {
    let (mut parts, body) = response.into_parts();
    if let Some(length) = http_body::Body::size_hint(&body).exact() {
        parts
            .headers
            .entry(http::header::CONTENT_LENGTH)
            .or_insert_with(|| HeaderValue::from(length));
    }
    Response::from_parts(parts, empty())
}

/// Names the body's length in a Content-Length header, as kube's OpenAPI
/// handlers do (they answer a document through Go's `http.ServeContent`): such
/// an answer is never chunked, however long. Other answers (304, 406) are left
/// alone.
pub fn with_content_length(mut response: Response<Body>) -> Response<Body> {
    let length = http_body::Body::size_hint(response.body()).exact();
    if let (StatusCode::OK, Some(length)) = (response.status(), length) {
        response
            .headers_mut()
            .insert(http::header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    response
}

/// A body that does not say how long it is, so hyper sends it chunked over
/// HTTP/1.1 and without a content-length over HTTP/2.
struct Unannounced(Body);

impl http_body::Body for Unannounced {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(accept: Option<&str>, expected: Option<Output>) {
        assert_eq!(negotiate(accept), expected, "{accept:?}");
    }

    #[test]
    fn without_aggregated_discovery_its_media_types_are_unknown() {
        let aggregator = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
        assert_eq!(negotiate_for(Some(aggregator), false), None);
        assert_eq!(
            negotiate_for(Some(&format!("{aggregator},application/json")), false),
            Some(Output::Json)
        );
        assert_eq!(negotiate_for(None, false), Some(Output::Json));
    }

    #[test]
    fn accept_headers_pick_kube_representations() {
        check(None, Some(Output::Json));
        check(Some("application/json"), Some(Output::Json));
        check(Some("*/*"), Some(Output::Json));
        check(Some("application/yaml"), Some(Output::Yaml));
        check(
            Some("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"),
            Some(Output::Table),
        );
        check(
            Some("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"),
            Some(Output::PartialObjectMetadataList),
        );
        check(
            Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"),
            Some(Output::Discovery(DiscoveryVersion::V2)),
        );
        check(
            Some("application/vnd.kubernetes.protobuf, */*"),
            Some(Output::Json),
        );
        check(
            Some("application/vnd.kubernetes.protobuf"),
            Some(Output::Json),
        );
        check(Some("text/html"), None);
        check(Some("application/json;as=Bogus;g=x"), None);
    }

    /// The length `framed_like_go` lets hyper announce, if any.
    fn announced_length(version: Version, body_len: usize, named: bool) -> Option<u64> {
        let mut response = Response::new(full(vec![b'x'; body_len]));
        if named {
            response.headers_mut().insert(
                http::header::CONTENT_LENGTH,
                HeaderValue::from(body_len as u64),
            );
        }
        http_body::Body::size_hint(framed_like_go(version, response).body()).exact()
    }

    #[test]
    fn answers_longer_than_gos_buffer_go_without_a_length() {
        // (version, body length, length header already set, announced length)
        let cases = [
            (Version::HTTP_11, 0, false, Some(0)),
            (Version::HTTP_11, 2048, false, Some(2048)),
            (Version::HTTP_11, 2049, false, None),
            (Version::HTTP_10, 2049, false, None),
            (Version::HTTP_2, 2049, false, Some(2049)),
            (Version::HTTP_2, 4096, false, Some(4096)),
            (Version::HTTP_2, 4097, false, None),
            (Version::HTTP_11, 100_000, true, Some(100_000)),
            (Version::HTTP_2, 100_000, true, Some(100_000)),
        ];
        for (version, len, named, expected) in cases {
            assert_eq!(
                announced_length(version, len, named),
                expected,
                "{version:?}, {len} bytes, length header {named}"
            );
        }
    }

    #[tokio::test]
    async fn an_unannounced_body_keeps_its_bytes() {
        let text: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let response = framed_like_go(Version::HTTP_11, Response::new(full(text.clone())));
        let collected = response.into_body().collect().await.expect("body");
        assert_eq!(collected.to_bytes(), text);
    }

    #[test]
    fn yaml_and_json_bodies_decode() {
        assert_eq!(
            decode_yaml(b"a: 1\nb: [x]\n").expect("yaml"),
            serde_json::json!({"a": 1, "b": ["x"]})
        );
        assert_eq!(
            decode_yaml(b"{\"a\": 1}").expect("json"),
            serde_json::json!({"a": 1})
        );
        // A YAML error is one line saying where, as an API server's message is,
        // not the parser's multi-line source snippet.
        let err = decode_yaml(b"a: 1\nb: [x\n").expect_err("unclosed");
        assert!(!err.contains('\n') && err.contains("line 2"), "{err}");
        let err = decode_yaml(b"a: 1\na: 2\n").expect_err("repeated");
        assert!(!err.contains('\n') && err.contains("line 2"), "{err}");
        let err = decode_body(b"{not json", BodyFormat::Json, "CronTab").expect_err("bad");
        assert_eq!(
            err.message,
            "the object provided is unrecognized (must be of type CronTab): couldn't get version/kind; json parse error: invalid character 'n' looking for beginning of object key string ({not json)"
        );
        let err = decode_body(b"{\"a\": ", BodyFormat::Json, "K").expect_err("eof");
        assert!(err
            .message
            .contains("json parse error: unexpected end of JSON input"));
    }
}
