//! A write body read once, strictly, into the document the target will receive.
//!
//! Owned mode decides ownership and stamps labels on a parsed document and sends
//! that same document re-serialized as JSON, so the target reads exactly what the
//! proxy checked. Anything the proxy cannot read the way it will be sent is refused
//! instead of being forwarded as it came: a second reading by the target could see
//! what the proxy did not (a duplicate key whose other copy wins, a second YAML
//! document, bytes Go replaces with U+FFFD where this parser stops).

use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::ownership::BodyType;
use crate::status;

/// kube-apiserver's request body limit (`MaxRequestBodyBytes`, 3 MiB); the proxy
/// refuses larger bodies the same way before reading further.
pub const MAX_REQUEST_BODY: usize = 3 * 1024 * 1024;

/// Why a body is refused; each maps to the Status kube-apiserver would use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// A media type the proxy cannot read (protobuf, CBOR, text/plain, ...).
    #[error("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/merge-patch+json, application/json-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {0:?})")]
    UnsupportedMediaType(String),
    /// Larger than [`MAX_REQUEST_BODY`].
    #[error("Request entity too large: limit is {MAX_REQUEST_BODY}")]
    TooLarge,
    /// Not a single strictly valid document, or of a shape labels cannot go into.
    #[error("{0}")]
    Invalid(String),
}

impl BodyError {
    /// The HTTP status code kube-apiserver answers with.
    pub fn code(&self) -> u16 {
        match self {
            BodyError::UnsupportedMediaType(_) => 415,
            BodyError::TooLarge => 413,
            BodyError::Invalid(_) => 400,
        }
    }

    /// The `Status` body for the caller.
    pub fn status(&self) -> Value {
        let reason = match self {
            BodyError::UnsupportedMediaType(_) => "UnsupportedMediaType",
            BodyError::TooLarge => "RequestEntityTooLarge",
            BodyError::Invalid(_) => "BadRequest",
        };
        status::status(self.code(), reason, self.to_string())
    }
}

/// A write body as one parsed document plus the media type it came with.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteBody {
    pub body_type: BodyType,
    pub document: Value,
}

impl WriteBody {
    /// Reads a body strictly. A missing `Content-Type` is JSON, as kube-apiserver
    /// reads it. JSON (and JSON patch) bodies: valid UTF-8, no lone surrogate
    /// escapes, no duplicate keys, at most serde_json's nesting depth (128). YAML
    /// bodies (`application/yaml`, server-side apply): exactly one document, no
    /// duplicate keys, within the YAML parser's budgets.
    pub fn parse(content_type: Option<&str>, bytes: &[u8]) -> Result<WriteBody, BodyError> {
        if bytes.len() > MAX_REQUEST_BODY {
            return Err(BodyError::TooLarge);
        }
        let body_type = match content_type.map(str::trim).filter(|ct| !ct.is_empty()) {
            None => BodyType::Json,
            Some(ct) => BodyType::from_content_type(ct)
                .ok_or_else(|| BodyError::UnsupportedMediaType(ct.to_string()))?,
        };
        let document = match body_type {
            BodyType::Yaml | BodyType::ApplyPatchYaml => parse_yaml_strict(bytes)?,
            _ => parse_json_strict(bytes)?,
        };
        Ok(WriteBody {
            body_type,
            document,
        })
    }

    /// The document as JSON bytes, which every accepted media type (YAML included)
    /// reads the same way.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing a `Value` cannot fail: its keys are strings by construction.
        serde_json::to_vec(&self.document).unwrap_or_default()
    }
}

/// A generous estimate, in bytes, of the memory parsing `bytes` takes: the text
/// plus a parsed node's size for every byte that can start a node (`{ [ , : -`
/// and line breaks, inside strings or not). A plain 3 MiB string costs about
/// 3 MiB; 3 MiB of `0,0,0,...` costs some 50 MiB once parsed, and is
/// estimated above that. The proxy admits parses against a memory budget with it,
/// so many ordinary bodies parse at once while pathological ones take turns.
pub fn parse_cost(bytes: &[u8]) -> usize {
    const NODE: usize = 40;
    let nodes = bytes
        .iter()
        .filter(|b| matches!(b, b'{' | b'[' | b',' | b':' | b'-' | b'\n'))
        .count();
    bytes.len() + nodes * NODE
}

/// Parses JSON, refusing duplicate object keys (Go keeps the last one; a proxy
/// that looked at another copy would judge a different object).
pub fn parse_json_strict(bytes: &[u8]) -> Result<Value, BodyError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = StrictValue
        .deserialize(&mut deserializer)
        .and_then(|v| deserializer.end().map(|()| v))
        .map_err(|e| BodyError::Invalid(format!("request body is not valid JSON: {e}")))?;
    Ok(value)
}

fn parse_yaml_strict(bytes: &[u8]) -> Result<Value, BodyError> {
    // JSON is YAML; reading it with the JSON parser keeps JSON's exact number and
    // string rules. A body that is not JSON is read as YAML.
    if let Ok(value) = parse_json_strict(bytes) {
        return Ok(value);
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| BodyError::Invalid(format!("request body is not valid UTF-8: {e}")))?;
    // Read scalars the way kube-apiserver's YAML-to-JSON step (go-yaml v2, YAML 1.1)
    // does: `yes`/`on` are booleans and `0755` is octal. Duplicate keys, a second
    // document and anything past the parser's budgets are errors.
    let mut options = serde_saphyr::Options::default();
    options.legacy_octal_numbers = true;
    options.strict_booleans = false;
    serde_saphyr::from_str_with_options::<Value>(text, options).map_err(|e| {
        BodyError::Invalid(format!(
            "request body is not a single valid YAML document: {e}"
        ))
    })
}

/// Deserializes a `serde_json::Value`, failing on a repeated key in any object.
struct StrictValue;

impl<'de> DeserializeSeed<'de> for StrictValue {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number out of range"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(StrictValue)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!("duplicate key {key:?}")));
            }
            let value = map.next_value_seed(StrictValue)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn invalid(ct: Option<&str>, body: &[u8]) -> String {
        match WriteBody::parse(ct, body) {
            Err(BodyError::Invalid(message)) => message,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn missing_content_type_is_json() {
        let body = WriteBody::parse(None, br#"{"a":1}"#).expect("parses");
        assert_eq!(body.body_type, BodyType::Json);
        assert_eq!(body.document, json!({"a": 1}));
        let body = WriteBody::parse(Some(" "), br#"{"a":1}"#).expect("parses");
        assert_eq!(body.body_type, BodyType::Json);
    }

    #[test]
    fn bytes_the_target_would_read_differently_are_refused() {
        // A lone surrogate escape and a raw 0xFF byte: Go substitutes U+FFFD.
        invalid(None, br#"{"metadata":{"name":"\ud800"}}"#);
        invalid(None, b"{\"metadata\":{\"name\":\"a\xff\"}}");
        invalid(Some("application/merge-patch+json"), br#"{"a":"\udc00"}"#);
        // A duplicate key at any depth, in every JSON media type.
        for ct in [
            "application/json",
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
            "application/json-patch+json",
        ] {
            let message = invalid(Some(ct), br#"{"metadata":{"labels":{"a":"1","a":"2"}}}"#);
            assert!(message.contains("duplicate key \"a\""), "{message}");
        }
        invalid(None, br#"[{"op":"add","op":"remove","path":"/x"}]"#);
        // Deeper than the parser's budget.
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        invalid(None, deep.as_bytes());
        // Trailing data after the document.
        invalid(None, br#"{"a":1} {"b":2}"#);
    }

    #[test]
    fn yaml_must_be_one_strict_document() {
        for ct in ["application/yaml", "application/apply-patch+yaml"] {
            invalid(Some(ct), b"metadata:\n  name: a\n  name: b\n");
            invalid(
                Some(ct),
                b"metadata:\n  name: a\n---\nmetadata:\n  name: b\n",
            );
            invalid(Some(ct), b"a: \"\\ud800\"\n");
            invalid(Some(ct), b"a: b\xff\n");
            let deep: String = (0..70).map(|i| format!("{}k:\n", " ".repeat(i))).collect();
            invalid(
                Some(ct),
                format!("{deep}{}v: 1\n", " ".repeat(70)).as_bytes(),
            );
            let body = WriteBody::parse(
                Some(ct),
                b"metadata:\n  name: a\nspec:\n  on: yes\n  mode: 0755\n",
            )
            .expect("parses");
            assert_eq!(
                body.document,
                json!({"metadata": {"name": "a"}, "spec": {"on": true, "mode": 493}})
            );
        }
    }

    #[test]
    fn unreadable_media_types_and_oversized_bodies_get_kube_statuses() {
        let error = WriteBody::parse(Some("application/vnd.kubernetes.protobuf"), b"k8s\0")
            .expect_err("refused");
        assert_eq!(error.code(), 415);
        assert_eq!(error.status()["reason"], "UnsupportedMediaType");
        let error = WriteBody::parse(Some("application/cbor"), b"\xa0").expect_err("refused");
        assert_eq!(error.code(), 415);

        let big = vec![b' '; MAX_REQUEST_BODY + 1];
        let error = WriteBody::parse(None, &big).expect_err("refused");
        assert_eq!(error.code(), 413);
        assert_eq!(error.status()["reason"], "RequestEntityTooLarge");
        assert_eq!(
            error.status()["message"],
            "Request entity too large: limit is 3145728"
        );
        let error = invalid(None, b"{");
        assert!(
            error.starts_with("request body is not valid JSON"),
            "{error}"
        );
    }

    #[test]
    fn parse_cost_grows_with_the_nodes_not_just_the_bytes() {
        let string = format!(r#"{{"a":"{}"}}"#, "x".repeat(1000));
        let numbers = format!("[{}0]", "0,".repeat(500));
        assert!(parse_cost(string.as_bytes()) < 2 * string.len());
        assert!(parse_cost(numbers.as_bytes()) > 10 * numbers.len());
    }

    #[test]
    fn numbers_are_read_and_sent_exactly() {
        for text in [
            "6763E111",
            "6.763e114",
            "0.1",
            "1e-7",
            "123456789012345678e-300",
        ] {
            let exact: f64 = text.parse().expect("f64");
            let body =
                WriteBody::parse(None, format!(r#"{{"n":{text}}}"#).as_bytes()).expect("parses");
            assert_eq!(body.document["n"].as_f64(), Some(exact), "{text}");
            let sent: Value = serde_json::from_slice(&body.to_bytes()).expect("json");
            assert_eq!(sent["n"].as_f64(), Some(exact), "{text} as sent");
        }
    }

    #[test]
    fn the_sent_bytes_are_the_checked_document() {
        let body =
            WriteBody::parse(Some("application/yaml"), b"metadata:\n  name: a\n").expect("parses");
        assert_eq!(
            serde_json::from_slice::<Value>(&body.to_bytes()).expect("json"),
            body.document
        );
    }
}
