//! A write body read once, strictly, and sent as the text the proxy checked.
//!
//! Owned mode stamps labels and pins preconditions into a write body. The body is
//! read once: a walk over its whole text checks it and finds where `metadata`,
//! its labels and (for a JSON patch) the operations are; when it is sent, those
//! parts are rebuilt with the proxy's values and every other byte goes as it came.
//! Anything the proxy cannot read the way the target will is refused instead of
//! being forwarded: a second reading by the target could see what the proxy did
//! not (a duplicate key whose other copy wins, a second YAML document, bytes Go
//! replaces with U+FFFD where this reader stops).

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::ops::Range;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::ownership::BodyType;
use crate::skim::{Skim, SkimError};
use crate::status;

mod layout;
#[cfg(any(test, feature = "reference-model"))]
pub mod reference;
mod yaml_expansion;

use layout::{Edits, Field, Shape};

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
    /// Not a single strictly valid document.
    #[error("{0}")]
    Invalid(String),
    /// A document of a shape labels cannot go into.
    #[error("request body has an unexpected shape: {0}")]
    Shape(#[from] ShapeError),
}

impl BodyError {
    /// The HTTP status code kube-apiserver answers with.
    pub fn code(&self) -> u16 {
        match self {
            BodyError::UnsupportedMediaType(_) => 415,
            BodyError::TooLarge => 413,
            BodyError::Invalid(_) | BodyError::Shape(_) => 400,
        }
    }

    /// The `Status` body for the caller.
    pub fn status(&self) -> Value {
        let reason = match self {
            BodyError::UnsupportedMediaType(_) => "UnsupportedMediaType",
            BodyError::TooLarge => "RequestEntityTooLarge",
            BodyError::Invalid(_) | BodyError::Shape(_) => "BadRequest",
        };
        status::status(self.code(), reason, self.to_string())
    }
}

/// Where a body cannot take what the proxy sets in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("the body must be a JSON object")]
    NotAnObject,
    #[error("a JSON patch must be an array of operations")]
    NotOperations,
    #[error("metadata is not an object")]
    Metadata,
    #[error("metadata.labels is not an object")]
    Labels,
}

/// A body's own `metadata.resourceVersion`, as the caller sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallerValue<'b> {
    /// Absent or `null`.
    Missing,
    Text(Cow<'b, str>),
    /// Of another type.
    Other,
}

/// A write body: its media type, its text as JSON, where the parts the proxy
/// edits are in that text, and what it sets there.
#[derive(Debug, Clone)]
pub struct WriteBody {
    pub body_type: BodyType,
    /// The caller's text for the JSON media types; YAML written out as JSON.
    text: String,
    shape: Shape,
    edits: Edits,
}

impl WriteBody {
    /// [`admit`]s a body, then [`read`](WriteBody::read)s it.
    pub fn parse(content_type: Option<&str>, bytes: &[u8]) -> Result<WriteBody, BodyError> {
        WriteBody::read(content_type, bytes, &admit(content_type, bytes)?)
    }

    /// Reads a body strictly, once [`admit`] let it in. A missing `Content-Type`
    /// is JSON, as kube-apiserver reads it. JSON (and JSON patch) bodies: valid
    /// UTF-8, no lone surrogate escapes, no duplicate keys, numbers within f64,
    /// nesting within serde_json's limit (128). YAML bodies (`application/yaml`,
    /// server-side apply): exactly one document, no duplicate keys, within the
    /// YAML parser's budgets, and at most 3 MiB once written as JSON.
    pub fn read(
        content_type: Option<&str>,
        bytes: &[u8],
        _admitted: &Admitted,
    ) -> Result<WriteBody, BodyError> {
        let body_type = match content_type.map(str::trim).filter(|ct| !ct.is_empty()) {
            None => BodyType::Json,
            Some(ct) => BodyType::from_content_type(ct)
                .ok_or_else(|| BodyError::UnsupportedMediaType(ct.to_string()))?,
        };
        let text = match body_type {
            // Written out as JSON, the form the target is sent, and read as such.
            BodyType::Yaml | BodyType::ApplyPatchYaml => {
                let json = yaml_safe_json(&parse_yaml_strict(bytes)?)?;
                // The walk's count is a lower bound: the JSON sent is what the
                // target's own 3 MiB limit judges.
                if json.len() > MAX_REQUEST_BODY {
                    return Err(BodyError::TooLarge);
                }
                json
            }
            _ => std::str::from_utf8(bytes)
                .map_err(|e| BodyError::Invalid(format!("request body is not valid JSON: {e}")))?
                .to_owned(),
        };
        let shape = layout::read(&text).map_err(|e| match body_type {
            // Only its depth can refuse a YAML document written out as JSON.
            BodyType::Yaml | BodyType::ApplyPatchYaml => BodyError::Invalid(format!(
                "request body is not a single valid YAML document: {e}"
            )),
            _ => BodyError::Invalid(format!("request body is not valid JSON: {e}")),
        })?;
        Ok(WriteBody {
            body_type,
            text,
            shape,
            edits: Edits::default(),
        })
    }

    /// The body as sent: JSON, which every accepted media type (YAML included)
    /// reads the same way.
    pub fn to_bytes(&self) -> Vec<u8> {
        layout::render(&self.text, &self.shape, &self.edits)
    }

    /// The document the target reads from [`to_bytes`](WriteBody::to_bytes),
    /// read as strictly as a caller's body.
    pub fn document(&self) -> Result<Value, BodyError> {
        parse_json_strict(&self.to_bytes())
    }

    /// Sets `labels` in the body's own `metadata.labels`, over any value the
    /// caller gave them (including `null`). A missing or `null` `metadata` or
    /// `labels` becomes an object. Always the body's own: whatever its `kind`
    /// and `items` say, kube stores a write's body as one object, so labels put
    /// only on list items would leave the stored object's labels to the caller.
    pub fn set_labels(&mut self, labels: &[(&str, &str)]) -> Result<(), ShapeError> {
        let Shape::Object { body } = &self.shape else {
            return Err(ShapeError::NotAnObject);
        };
        match &body.metadata {
            Field::Other => return Err(ShapeError::Metadata),
            Field::Object(_, metadata) if matches!(metadata.labels, Field::Other) => {
                return Err(ShapeError::Labels)
            }
            _ => {}
        }
        self.edits.labels = labels
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        Ok(())
    }

    /// Sets (`Some`) or removes (`None`) a field of the body's own `metadata`.
    pub fn set_metadata_field(
        &mut self,
        name: &'static str,
        value: Option<&str>,
    ) -> Result<(), ShapeError> {
        match &self.shape {
            Shape::Object { body } => {
                if matches!(body.metadata, Field::Other) {
                    return Err(ShapeError::Metadata);
                }
            }
            _ => return Err(ShapeError::NotAnObject),
        }
        self.edits.fields.retain(|(set, _)| *set != name);
        self.edits.fields.push((name, value.map(str::to_string)));
        Ok(())
    }

    /// The caller's `metadata.resourceVersion`.
    pub fn resource_version(&self) -> Result<CallerValue<'_>, ShapeError> {
        self.metadata_string(|metadata| metadata.resource_version.clone())
    }

    /// The caller's `metadata.uid`.
    pub fn uid(&self) -> Result<CallerValue<'_>, ShapeError> {
        self.metadata_string(|metadata| metadata.uid.clone())
    }

    /// A field of the body's own metadata that kube reads as a string, where the
    /// layout found it.
    fn metadata_string(
        &self,
        field: impl FnOnce(&layout::Metadata) -> Option<Range<usize>>,
    ) -> Result<CallerValue<'_>, ShapeError> {
        let Some(metadata) = self.own_metadata()? else {
            return Ok(CallerValue::Missing);
        };
        Ok(match field(metadata) {
            Some(value) => {
                caller_value(Skim::new(self.text.get(value).unwrap_or_default()).optional_string())
            }
            None => CallerValue::Missing,
        })
    }

    /// The caller's value of the label `key` in the body's own
    /// `metadata.labels`, read from the layout without parsing the body again.
    pub fn label(&self, key: &str) -> Result<CallerValue<'_>, ShapeError> {
        let Some(metadata) = self.own_metadata()? else {
            return Ok(CallerValue::Missing);
        };
        let labels = match &metadata.labels {
            Field::Absent | Field::Null(_) => return Ok(CallerValue::Missing),
            Field::Object(labels, _) => labels.clone(),
            Field::Other => return Err(ShapeError::Labels),
        };
        // Skims only the labels object, which the walk has already checked; keys
        // are unique there (the walk refuses a repeated one).
        let mut skim = Skim::new(self.text.get(labels).unwrap_or_default());
        let found = (|| {
            let mut entries = skim.object()?;
            while let Some(found) = entries.next_key(&mut skim)? {
                if found == key {
                    return Ok(Some(skim.optional_string()));
                }
                skim.skip()?;
            }
            Ok::<_, SkimError>(None)
        })();
        Ok(match found {
            Ok(None) => CallerValue::Missing,
            Ok(Some(value)) => caller_value(value),
            // Not text (or, though checked already, not readable): no label value.
            Err(_) => CallerValue::Other,
        })
    }

    /// The body's own `metadata` as the walk found it; `None` when it is absent
    /// or `null`.
    fn own_metadata(&self) -> Result<Option<&layout::Metadata>, ShapeError> {
        let Shape::Object { body } = &self.shape else {
            return Err(ShapeError::NotAnObject);
        };
        match &body.metadata {
            Field::Absent | Field::Null(_) => Ok(None),
            Field::Object(_, metadata) => Ok(Some(metadata)),
            Field::Other => Err(ShapeError::Metadata),
        }
    }

    /// Puts operations before and after the caller's, in an array body (a JSON
    /// patch).
    pub fn add_operations(
        &mut self,
        before: Vec<Value>,
        after: Vec<Value>,
    ) -> Result<(), ShapeError> {
        if !matches!(self.shape, Shape::Array { .. }) {
            return Err(ShapeError::NotOperations);
        }
        self.edits.operations_before.splice(0..0, before);
        self.edits.operations_after.extend(after);
        Ok(())
    }
}

/// A caller's value read as an optional string.
fn caller_value(read: Result<Option<Cow<'_, str>>, SkimError>) -> CallerValue<'_> {
    match read {
        Ok(None) => CallerValue::Missing,
        Ok(Some(text)) => CallerValue::Text(text),
        Err(_) => CallerValue::Other,
    }
}

/// What one parsed node (a `serde_json::Value` and its place in its container)
/// is counted as, in memory estimates.
const PARSED_NODE_BYTES: usize = 40;

/// Reading a YAML document that would cost more than this (with its aliases
/// replayed) is refused: it is a whole group/version's read budget, and a
/// document that large could not be stored anyway (etcd's own limit is 1.5 MiB).
pub const MAX_EXPANDED_COST: usize = 64 * 1024 * 1024;

/// A generous estimate, in bytes, of the memory reading `bytes` takes: the text
/// plus a parsed node's size for every byte that can start a node (`{ [ , : -`
/// and line breaks, inside strings or not). A plain 3 MiB string costs about
/// 3 MiB; 3 MiB of `0,0,0,...` costs some 50 MiB once parsed as YAML, and is
/// estimated above that. The JSON walk keeps less than a node per key or item:
/// the keys of the objects it is inside (24 bytes each), the entries of
/// `metadata` and its labels (40 bytes each). The proxy admits reads against a memory budget with it, so many
/// ordinary bodies are read at once while pathological ones take turns.
pub fn parse_cost(bytes: &[u8]) -> usize {
    const NODE: usize = PARSED_NODE_BYTES;
    let nodes = bytes
        .iter()
        .filter(|b| matches!(b, b'{' | b'[' | b',' | b':' | b'-' | b'\n'))
        .count();
    bytes.len() + nodes * NODE
}

/// A write body let in for reading, and the memory reading it takes. Only
/// [`admit`] makes one, so [`WriteBody::read`] knows the body's size was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    cost: usize,
}

impl Admitted {
    /// [`parse_cost`] of the text, or for a YAML body with aliases, of the
    /// document they expand to (a small text can repeat a large node many times).
    pub fn cost(&self) -> usize {
        self.cost
    }
}

/// Judges a write body's size before it is read, so that reads are admitted
/// against a memory budget: bodies over 3 MiB are refused, and so is a YAML body
/// whose aliases alone take it past the body limit or [`MAX_EXPANDED_COST`],
/// without building it.
pub fn admit(content_type: Option<&str>, bytes: &[u8]) -> Result<Admitted, BodyError> {
    if bytes.len() > MAX_REQUEST_BODY {
        return Err(BodyError::TooLarge);
    }
    let yaml = content_type
        .and_then(BodyType::from_content_type)
        .is_some_and(|t| matches!(t, BodyType::Yaml | BodyType::ApplyPatchYaml));
    let text_cost = parse_cost(bytes);
    if !yaml {
        return Ok(Admitted { cost: text_cost });
    }
    match std::str::from_utf8(bytes).ok().and_then(alias_expansion) {
        Some(Ok(expanded)) => Ok(Admitted {
            cost: text_cost.max(expanded.cost),
        }),
        Some(Err(yaml_expansion::Stop::TooLarge)) => Err(BodyError::TooLarge),
        // No alias; or a text the read refuses for another reason.
        _ => Ok(Admitted { cost: text_cost }),
    }
}

/// A YAML text's size once its aliases are replayed: `None` when it holds no
/// alias (no `*`), so its text says what it costs; refused past the body limit,
/// the read budget or the nesting limit.
fn alias_expansion(text: &str) -> Option<Result<yaml_expansion::Expansion, yaml_expansion::Stop>> {
    let limits = yaml_expansion::Limits {
        json_bytes: MAX_REQUEST_BODY,
        cost: MAX_EXPANDED_COST,
        depth: layout::MAX_DEPTH,
    };
    text.contains('*')
        .then(|| yaml_expansion::expansion(text, limits))
}

/// What the expansion walk says a YAML text's JSON is at least, for the fuzz
/// target to hold against the JSON actually written.
#[cfg(any(test, feature = "reference-model"))]
pub fn yaml_json_lower_bound(text: &str) -> Option<usize> {
    let limits = yaml_expansion::Limits {
        json_bytes: usize::MAX,
        cost: usize::MAX,
        depth: layout::MAX_DEPTH,
    };
    yaml_expansion::expansion(text, limits)
        .ok()
        .map(|e| e.json_bytes)
}

/// Parses JSON, refusing duplicate object keys (Go keeps the last one; a proxy
/// that looked at another copy would judge a different object).
pub fn parse_json_strict(bytes: &[u8]) -> Result<Value, BodyError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = StrictValue(Syntax::Json)
        .deserialize(&mut deserializer)
        .and_then(|v| deserializer.end().map(|()| v))
        .map_err(|e| BodyError::Invalid(format!("request body is not valid JSON: {e}")))?;
    Ok(value)
}

/// A YAML body's document written as JSON text that a YAML parser reads back
/// the same way. The target reads the text as YAML (its media type stays YAML),
/// and YAML 1.1 takes U+0085, U+2028 and U+2029 for line breaks, folding them
/// to a space inside a quoted string; serde_json leaves them unescaped, so they
/// are written as `\u` escapes here.
fn yaml_safe_json(document: &Value) -> Result<String, BodyError> {
    struct YamlSafe;
    impl serde_json::ser::Formatter for YamlSafe {
        fn write_string_fragment<W: ?Sized + std::io::Write>(
            &mut self,
            writer: &mut W,
            fragment: &str,
        ) -> std::io::Result<()> {
            let mut plain = 0;
            for (at, ch) in fragment.char_indices() {
                if matches!(ch, '\u{85}' | '\u{2028}' | '\u{2029}') {
                    writer.write_all(fragment.get(plain..at).unwrap_or_default().as_bytes())?;
                    write!(writer, "\\u{:04x}", u32::from(ch))?;
                    plain = at + ch.len_utf8();
                }
            }
            writer.write_all(fragment.get(plain..).unwrap_or_default().as_bytes())
        }
    }
    let unwritable = |e: &dyn std::fmt::Display| {
        BodyError::Invalid(format!("request body could not be written as JSON: {e}"))
    };
    let mut text = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut text, YamlSafe);
    serde::Serialize::serialize(document, &mut serializer).map_err(|e| unwritable(&e))?;
    String::from_utf8(text).map_err(|e| unwritable(&e))
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
    serde_saphyr::from_str_with_options::<StrictDocument>(text, options)
        .map(|document| document.0)
        .map_err(|e| {
            BodyError::Invalid(format!(
                "request body is not a single valid YAML document: {}",
                crate::yaml_error::one_line(&e)
            ))
        })
}

/// A YAML document read with [`StrictValue`]: the YAML parser refuses a key
/// repeated as written, and this a second key that JSON writes the same way
/// (`!a k` and `!b k`, or `1` and `"1"`), whose first value would be dropped.
struct StrictDocument(Value);

impl<'de> serde::Deserialize<'de> for StrictDocument {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        StrictValue(Syntax::Yaml)
            .deserialize(deserializer)
            .map(StrictDocument)
    }
}

/// Deserializes a `serde_json::Value`, failing on a repeated key in any object.
#[derive(Clone, Copy)]
struct StrictValue(Syntax);

/// What the document is written in: the two parsers place errors differently.
#[derive(Clone, Copy)]
enum Syntax {
    Json,
    Yaml,
}

impl<'de> DeserializeSeed<'de> for StrictValue {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(StrictVisitor(self.0))
    }
}

struct StrictVisitor(Syntax);

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
        while let Some(item) = seq.next_element_seed(StrictValue(self.0))? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(match self.0 {
                    // serde_json adds the line and column to any error.
                    Syntax::Json => serde::de::Error::custom(format!("duplicate key {key:?}")),
                    Syntax::Yaml => crate::yaml_error::duplicate_key(&key),
                });
            }
            let value = map.next_value_seed(StrictValue(self.0))?;
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
        assert_eq!(body.document().expect("strict JSON"), json!({"a": 1}));
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
                body.document().expect("strict JSON"),
                json!({"metadata": {"name": "a"}, "spec": {"on": true, "mode": 493}})
            );
        }
    }

    #[test]
    fn yaml_errors_are_one_line_naming_where() {
        // A Status message, not the parser's source snippet or its settings.
        for (text, names) in [
            ("a: 1\na: 2\n", "line 2, column 1"),
            ("a: [\n", "line 1"),
            ("a: !bool maybe\n", "line 1, column"),
            ("a: 1\n---\nb: 2\n", "line 3"),
        ] {
            let message = invalid(Some("application/yaml"), text.as_bytes());
            assert!(!message.contains('\n'), "{text:?}: {message}");
            assert!(message.contains(names), "{text:?}: {message}");
            assert!(!message.contains("Options"), "{text:?}: {message}");
        }
    }

    #[test]
    fn yaml_keys_that_are_one_json_key_are_refused() {
        // Distinct YAML keys (other tags, or a number and a string) that are
        // written as the same JSON key: one copy would be dropped unseen.
        // The message names the key and where its second copy is.
        for (text, key, place) in [
            ("!a k: 1\n!b k: 2\n", "k", "line 2, column 4"),
            ("1: a\n\"1\": b\n", "1", "line 2, column 1"),
            (
                "spec:\n  !x on: 1\n  !!str on: 2\n",
                "on",
                "line 3, column 9",
            ),
        ] {
            for ct in ["application/yaml", "application/apply-patch+yaml"] {
                let message = invalid(Some(ct), text.as_bytes());
                assert!(
                    message.contains(&format!("duplicate key {key:?}")) && message.contains(place),
                    "{text:?}: {message}"
                );
                // Not serde's framing of the kind of error it is raised as.
                assert!(!message.contains("invalid value"), "{text:?}: {message}");
                assert!(message.contains("same key in JSON"), "{text:?}: {message}");
            }
        }
        // A merge key's entries are not repeats: the mapping's own win.
        let merged = WriteBody::parse(
            Some("application/yaml"),
            b"base: &b {a: 1, b: 2}\nm: {<<: *b, a: 4}\n",
        )
        .expect("parses");
        assert_eq!(
            merged.document().expect("strict JSON"),
            json!({"base": {"a": 1, "b": 2}, "m": {"a": 4, "b": 2}})
        );
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
            assert_eq!(
                body.document().expect("strict JSON")["n"].as_f64(),
                Some(exact),
                "{text}"
            );
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
            body.document().expect("strict JSON")
        );
    }

    const OWNER_LABELS: [(&str, &str); 2] = [
        ("vcluster.com/owner-vcluster", "client"),
        ("vcluster.com/owner-project", "project"),
    ];

    fn stamped(text: &str) -> String {
        let mut body = WriteBody::parse(None, text.as_bytes()).expect("parses");
        body.set_labels(&OWNER_LABELS).expect("labels");
        String::from_utf8(body.to_bytes()).expect("utf-8")
    }

    #[test]
    fn what_the_proxy_does_not_set_is_sent_byte_for_byte() {
        let spec = r#""spec" : {"n": 1.0, "big": 123456789012345678901234567890, "e": 1E5, "s": "caf\u00e9 \/"}"#;
        let text = format!(
            r#"{{ "apiVersion":"v1",{spec}, "metadata": {{"name": "a", "annotations": {{"k": "v"}}, "labels": {{"app": "x"}}}} }}"#
        );
        let out = stamped(&text);
        assert!(out.contains(spec), "{out}");
        assert!(out.contains(r#""name": "a""#), "{out}");
        assert!(out.contains(r#""annotations": {"k": "v"}"#), "{out}");
        assert!(out.contains(r#""app": "x""#), "{out}");
        assert_eq!(
            parse_json_strict(out.as_bytes()).expect("strict JSON")["metadata"]["labels"],
            json!({"app": "x", "vcluster.com/owner-vcluster": "client", "vcluster.com/owner-project": "project"})
        );
    }

    #[test]
    fn what_the_walk_keeps_stays_within_the_read_budget() {
        // The sizes `parse_cost` documents; it estimates 40 bytes a node.
        assert_eq!(std::mem::size_of::<Cow<'_, str>>(), 24);
        assert!(std::mem::size_of::<layout::Entry>() <= 40);
        assert!(std::mem::size_of::<layout::Site>() <= 48);
    }

    #[test]
    fn a_body_whose_kind_names_a_list_is_labelled_as_the_object_it_is() {
        // kube stores a write's body as one object whatever its `kind` and
        // `items` say (a CRD's kind may end in "List"): the owner labels go on
        // the body's own metadata, over the caller's, and `items` is data.
        let text = r#"{"kind":"AllowList","metadata":{"labels":{"vcluster.com/owner-vcluster":"victim","vcluster.com/owner-project":"vp"}},"items":[{"metadata":{"name":"a"}},1]}"#;
        let mut body = WriteBody::parse(None, text.as_bytes()).expect("parses");
        body.set_labels(&OWNER_LABELS).expect("labels");
        let sent = parse_json_strict(&body.to_bytes()).expect("strict JSON");
        assert_eq!(
            sent["metadata"]["labels"],
            json!({"vcluster.com/owner-vcluster": "client", "vcluster.com/owner-project": "project"})
        );
        assert_eq!(sent["items"], json!([{"metadata": {"name": "a"}}, 1]));
    }

    #[test]
    fn yaml_bodies_are_sent_without_characters_yaml_reads_as_line_breaks() {
        for ct in ["application/yaml", "application/apply-patch+yaml"] {
            let body = WriteBody::parse(
                Some(ct),
                "metadata:\n  name: a\nspec:\n  note: \"x\\u2028y\\u2029z\\u0085w\\u00e9\"\n"
                    .as_bytes(),
            )
            .expect("parses");
            let sent = String::from_utf8(body.to_bytes()).expect("utf-8");
            assert!(sent.contains(r#""x\u2028y\u2029z\u0085wé""#), "{sent}");
            assert_eq!(
                body.document().expect("strict JSON")["spec"]["note"],
                "x\u{2028}y\u{2029}z\u{85}w\u{e9}"
            );
        }
    }

    #[test]
    fn values_the_proxy_sets_are_written_as_json_strings() {
        let odd = "q\"b\\s\n\r\t\u{1}\u{1f} é/";
        let mut body = WriteBody::parse(None, b"{}").expect("parses");
        body.set_labels(&[(odd, odd)]).expect("labels");
        body.set_metadata_field("uid", Some(odd)).expect("uid");
        let sent = parse_json_strict(&body.to_bytes()).expect("strict JSON");
        assert_eq!(
            sent,
            json!({"metadata": {"labels": {odd: odd}, "uid": odd}})
        );
    }

    #[test]
    fn keys_are_recognised_through_escapes_and_never_sent_twice() {
        // `\u006d` is `m`, `\/` is `/`: Go reads these keys as metadata, labels
        // and the owner label, so they are replaced, not repeated.
        let out = stamped(
            r#"{"\u006detadata":{"la\u0062els":{"vcluster.com\/owner-vcluster":"other","app":"x"}}}"#,
        );
        let sent = parse_json_strict(out.as_bytes()).expect("no duplicate keys in what is sent");
        assert_eq!(
            sent,
            json!({"metadata": {"labels": {"app": "x", "vcluster.com/owner-vcluster": "client", "vcluster.com/owner-project": "project"}}})
        );
        let message = invalid(None, br#"{"metadata":{"a":1,"\u0061":2}}"#);
        assert!(message.contains(r#"duplicate key "a""#), "{message}");
        // Read by serde_json (a delete's options are), the message is the key
        // and where, in serde_json's words.
        let error = parse_json_strict(br#"{"dryRun":["All"],"dryRun":[]}"#).expect_err("repeated");
        assert_eq!(
            error.to_string(),
            r#"request body is not valid JSON: duplicate key "dryRun" at line 1 column 26"#
        );
    }

    #[test]
    fn numbers_beyond_f64_are_refused_like_the_parser_refused_them() {
        let long = "9".repeat(400);
        for number in ["1e400", "-1e400", "1E+309", long.as_str()] {
            let text = format!(r#"{{"spec":{{"n":{number}}}}}"#);
            let message = invalid(None, text.as_bytes());
            assert!(
                message.contains("number out of range"),
                "{number}: {message}"
            );
            assert!(parse_json_strict(text.as_bytes()).is_err(), "{number}");
        }
        for number in ["1e-400", "1e308", "-0", "18446744073709551616"] {
            let text = format!(r#"{{"spec":{{"n":{number}}}}}"#);
            assert!(WriteBody::parse(None, text.as_bytes()).is_ok(), "{number}");
            assert!(parse_json_strict(text.as_bytes()).is_ok(), "{number}");
        }
    }

    #[test]
    fn nesting_is_limited_where_the_parser_limited_it() {
        for depth in 120..136 {
            for (open, close) in [("[", "]"), (r#"{"a":"#, "}")] {
                let text = format!(
                    r#"{{"spec":{}1{}}}"#,
                    open.repeat(depth),
                    close.repeat(depth)
                );
                assert_eq!(
                    WriteBody::parse(None, text.as_bytes()).is_ok(),
                    parse_json_strict(text.as_bytes()).is_ok(),
                    "{depth} levels of {open}"
                );
            }
        }
    }

    #[test]
    fn operations_go_around_the_callers_own() {
        for (text, want) in [
            ("[]", json!([{"op": "test"}, {"op": "add"}])),
            (
                " [ {\"op\":\"remove\"} ] ",
                json!([{"op": "test"}, {"op": "remove"}, {"op": "add"}]),
            ),
        ] {
            let mut body = WriteBody::parse(Some("application/json-patch+json"), text.as_bytes())
                .expect("parses");
            body.add_operations(Vec::new(), vec![json!({"op": "add"})])
                .expect("array");
            body.add_operations(vec![json!({"op": "test"})], Vec::new())
                .expect("array");
            assert_eq!(body.document().expect("strict JSON"), want, "{text}");
        }
        let mut body = WriteBody::parse(None, b"{}").expect("parses");
        assert_eq!(
            body.add_operations(Vec::new(), Vec::new()),
            Err(ShapeError::NotOperations)
        );
    }

    #[test]
    fn the_callers_uid_is_read_as_sent() {
        let read = |text: &str| {
            let body = WriteBody::parse(None, text.as_bytes()).expect("parses");
            body.uid().map(|found| format!("{found:?}"))
        };
        assert_eq!(read("{}"), Ok("Missing".into()));
        assert_eq!(read(r#"{"metadata":{"uid":null}}"#), Ok("Missing".into()));
        assert_eq!(
            read(r#"{"metadata":{"resourceVersion":"7","uid":"u\u0031"}}"#),
            Ok(r#"Text("u1")"#.into())
        );
        assert_eq!(read(r#"{"metadata":{"uid":[]}}"#), Ok("Other".into()));
        assert_eq!(
            read(r#"{"spec":{"metadata":{"uid":"u1"}}}"#),
            Ok("Missing".into())
        );
    }

    #[test]
    fn the_callers_resource_version_is_read_as_sent() {
        let read = |text: &str| {
            let body = WriteBody::parse(None, text.as_bytes()).expect("parses");
            body.resource_version().map(|found| format!("{found:?}"))
        };
        assert_eq!(read("{}"), Ok("Missing".into()));
        assert_eq!(read(r#"{"metadata":null}"#), Ok("Missing".into()));
        assert_eq!(
            read(r#"{"metadata":{"resourceVersion":null}}"#),
            Ok("Missing".into())
        );
        assert_eq!(
            read(r#"{"metadata":{"resourceVersion":"7"}}"#),
            Ok(r#"Text("7")"#.into())
        );
        assert_eq!(
            read(r#"{"metadata":{"resourceVersion":"\u0037"}}"#),
            Ok(r#"Text("7")"#.into())
        );
        assert_eq!(
            read(r#"{"metadata":{"resourceVersion":7}}"#),
            Ok("Other".into())
        );
        assert_eq!(read(r#"{"metadata":7}"#), Err(ShapeError::Metadata));
        assert_eq!(read("[]"), Err(ShapeError::NotAnObject));
    }

    /// A 64 KiB string anchored once and aliased `aliases` times.
    fn alias_bomb(aliases: usize) -> String {
        format!(
            "kind: Widget\nspec:\n  big: &b \"{}\"\n  copies: [{}0]\n",
            "x".repeat(64 * 1024),
            "*b, ".repeat(aliases)
        )
    }

    #[test]
    fn yaml_aliases_that_outgrow_the_body_limit_are_refused() {
        // 1000 copies: 64 MiB of JSON from a 69 KB text, over the 3 MiB limit
        // the target would refuse the written-out body with. The cost asked
        // before the read refuses it unbuilt; the read itself refuses its JSON.
        let bomb = alias_bomb(1000);
        for media_type in ["application/yaml", "application/apply-patch+yaml"] {
            assert_eq!(
                admit(Some(media_type), bomb.as_bytes()).map(|a| a.cost()),
                Err(BodyError::TooLarge),
                "{media_type}"
            );
            assert_eq!(
                WriteBody::parse(Some(media_type), bomb.as_bytes()).err(),
                Some(BodyError::TooLarge),
                "{media_type}"
            );
        }
        // Ten copies fit: read, and admitted for what they expand to.
        let modest = alias_bomb(10);
        let body = WriteBody::parse(Some("application/yaml"), modest.as_bytes()).expect("fits");
        let expanded = body.to_bytes().len();
        assert!(expanded > 10 * 64 * 1024, "{expanded}");
        let cost = admit(Some("application/yaml"), modest.as_bytes())
            .expect("fits")
            .cost();
        assert!(
            cost >= expanded,
            "admitted for {cost} bytes, read {expanded}"
        );
        assert_eq!(
            admit(Some("application/json"), modest.as_bytes()).map(|a| a.cost()),
            Ok(parse_cost(modest.as_bytes())),
            "a JSON body has no aliases"
        );
    }

    #[test]
    fn yaml_whose_written_json_is_over_the_body_limit_is_refused() {
        // Merged entries are not counted by the alias walk (a mapping may
        // override them): this passes the walk, and its JSON (four copies of a
        // 1 MiB string) is still refused.
        let text = format!(
            "base: &b {{k: \"{}\"}}\nm: [{{<<: *b}}, {{<<: *b}}, {{<<: *b}}, {{<<: *b}}]\n",
            "x".repeat(1024 * 1024)
        );
        assert!(alias_expansion(&text).is_some_and(|walked| walked.is_ok()));
        assert_eq!(
            WriteBody::parse(Some("application/yaml"), text.as_bytes()).err(),
            Some(BodyError::TooLarge)
        );
    }

    #[test]
    fn the_callers_labels_are_read_as_sent() {
        let read = |text: &str| {
            let body = WriteBody::parse(None, text.as_bytes()).expect("parses");
            body.label("a/b").map(|found| format!("{found:?}"))
        };
        assert_eq!(read("{}"), Ok("Missing".into()));
        assert_eq!(
            read(r#"{"metadata":{"labels":null}}"#),
            Ok("Missing".into())
        );
        assert_eq!(
            read(r#"{"metadata":{"labels":{"a/c":"x"}}}"#),
            Ok("Missing".into())
        );
        assert_eq!(
            read(r#"{"metadata":{"labels":{"a/b" : "x"}}}"#),
            Ok(r#"Text("x")"#.into())
        );
        // An escaped key is the key it decodes to, and so is an escaped value.
        assert_eq!(
            read(r#"{"metadata":{"labels":{"a\u002fb":"\u0078"}}}"#),
            Ok(r#"Text("x")"#.into())
        );
        assert_eq!(
            read(r#"{"metadata":{"labels":{"a/b":null}}}"#),
            Ok("Missing".into())
        );
        assert_eq!(
            read(r#"{"metadata":{"labels":{"a/b":1}}}"#),
            Ok("Other".into())
        );
        assert_eq!(
            read(r#"{"metadata":{"labels":[]}}"#),
            Err(ShapeError::Labels)
        );
        assert_eq!(read(r#"{"metadata":"x"}"#), Err(ShapeError::Metadata));
        assert_eq!(read("[]"), Err(ShapeError::NotAnObject));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// JSON text built from the keys and values the edits depend on, with
        /// escapes, repeated keys, lone surrogates and numbers past f64 mixed in.
        fn text_strategy() -> impl Strategy<Value = String> {
            let key = prop::sample::select(vec![
                r#""metadata""#,
                r#""\u006detadata""#,
                r#""labels""#,
                r#""resourceVersion""#,
                r#""uid""#,
                r#""kind""#,
                r#""items""#,
                r#""vcluster.com/owner-vcluster""#,
                r#""vcluster.com\/owner-project""#,
                r#""a""#,
                r#""\ud800""#,
            ]);
            let leaf = prop::sample::select(vec![
                r#""x""#,
                r#""7""#,
                r#""WidgetList""#,
                r#""\ud83d\ude00""#,
                r#""\udc00""#,
                "1",
                "-0.5e3",
                "1e400",
                "true",
                "null",
                "[]",
                "{}",
            ])
            .prop_map(str::to_owned);
            let value = leaf.prop_recursive(5, 48, 5, move |inner| {
                prop_oneof![
                    prop::collection::vec((space(), inner.clone(), space()), 0..4).prop_map(
                        |items| {
                            let items: Vec<String> = items
                                .into_iter()
                                .map(|(before, item, after)| format!("{before}{item}{after}"))
                                .collect();
                            format!("[{}]", items.join(","))
                        }
                    ),
                    prop::collection::vec((space(), key.clone(), space(), inner), 0..5).prop_map(
                        |entries| {
                            let entries: Vec<String> = entries
                                .into_iter()
                                .map(|(before, key, after, value)| {
                                    format!("{before}{key}{after}:{after}{value}{before}")
                                })
                                .collect();
                            format!("{{{}}}", entries.join(","))
                        }
                    ),
                ]
            });
            (space(), value, space())
                .prop_map(|(before, value, after)| format!("{before}{value}{after}"))
        }

        fn space() -> impl Strategy<Value = &'static str> {
            prop::sample::select(vec!["", "", " ", "\n\t", "\r\n "])
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            /// The walk accepts exactly what the strict parser accepted, and the
            /// text it sends reads as the document the parser's edits made.
            #[test]
            fn text_edits_match_edits_of_the_parsed_document(text in text_strategy(), pin in any::<bool>()) {
                let parsed = parse_json_strict(text.as_bytes());
                let body = WriteBody::parse(None, text.as_bytes());
                prop_assert_eq!(parsed.is_ok(), body.is_ok(), "{}: {:?}", text, body.as_ref().err());
                let (Ok(parsed), Ok(mut body)) = (parsed, body) else {
                    return Ok(());
                };
                let fields: &[(&'static str, Option<&str>)] = if pin {
                    &[("uid", Some("u1")), ("resourceVersion", None)]
                } else {
                    &[]
                };
                let edited = body.set_labels(&OWNER_LABELS).and_then(|()| {
                    for (name, value) in fields {
                        body.set_metadata_field(name, *value)?;
                    }
                    Ok(())
                });
                let want = reference::edited(parsed, &OWNER_LABELS, fields);
                prop_assert_eq!(edited.is_ok(), want.is_some(), "{}", text);
                if let Some(want) = want {
                    prop_assert_eq!(body.document(), Ok(want), "{}", text);
                }
            }

            /// Operations put around a JSON patch's own, whatever its spacing.
            #[test]
            fn operations_match_operations_added_to_the_parsed_patch(text in text_strategy()) {
                let Ok(parsed) = parse_json_strict(text.as_bytes()) else {
                    return Ok(());
                };
                let mut body = WriteBody::parse(Some("application/json-patch+json"), text.as_bytes())
                    .expect("what the strict parse accepts is read");
                let before = [json!({"op": "test", "path": "/metadata/uid", "value": "u1"})];
                let after = [json!({"op": "add", "path": "/metadata/labels/a", "value": "b"})];
                let added = body.add_operations(before.to_vec(), after.to_vec());
                let want = reference::with_operations(parsed, &before, &after);
                prop_assert_eq!(added.is_ok(), want.is_some(), "{}", text);
                if let Some(want) = want {
                    prop_assert_eq!(body.document(), Ok(want), "{}", text);
                }
            }
        }
    }
}
