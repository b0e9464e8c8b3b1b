//! The protobuf form of the swagger 2.0 document, as kube-apiserver serves
//! `/openapi/v2` to clients that ask for
//! `application/com.github.proto-openapi.spec.v2.v1.0+protobuf`.
//!
//! kube converts its JSON document into gnostic's `openapi.v2.Document` message
//! and marshals that. kubectl asks for this form whenever a group/version is
//! missing from `/openapi/v3` (a manifest with a mistyped `apiVersion`, say), and
//! `kubectl explain --output=plaintext-openapiv2` always does, so an answer in
//! JSON there makes kubectl fail with a protobuf parse error instead of the
//! error kube users know.
//!
//! The encoder below writes the message by hand: field numbers follow gnostic's
//! `OpenAPIv2.proto`. Values gnostic keeps as `Any` (defaults, examples, enums,
//! `x-` extensions) carry their YAML text; a JSON text is valid YAML, which is
//! all readers (kube-openapi's `proto` package) need. Keys swagger 2.0 has no
//! field for are left out, as kube's own v2 publishing leaves out what swagger
//! cannot say.

use serde_json::{Map, Value};

/// A part of the document that has the wrong JSON type for its swagger field.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("openapi v2 document at {at}: {problem}")]
pub struct EncodeError {
    pub at: String,
    pub problem: String,
}

type Result<T> = std::result::Result<T, EncodeError>;

/// The document as the bytes of a gnostic `openapi.v2.Document`.
pub fn encode_document(document: &Value) -> Result<Vec<u8>> {
    let at = Path::root();
    let doc = object(document, &at)?;
    let mut m = Message::default();
    m.string(1, text(doc, "swagger", &at)?);
    if let Some(info) = doc.get("info") {
        m.message(2, info_message(info, &at.key("info"))?);
    }
    m.string(3, text(doc, "host", &at)?);
    m.string(4, text(doc, "basePath", &at)?);
    m.strings(5, doc.get("schemes"), &at.key("schemes"))?;
    m.strings(6, doc.get("consumes"), &at.key("consumes"))?;
    m.strings(7, doc.get("produces"), &at.key("produces"))?;
    if let Some(paths) = doc.get("paths") {
        m.message(8, paths_message(paths, &at.key("paths"))?);
    }
    if let Some(definitions) = doc.get("definitions") {
        let at = at.key("definitions");
        m.message(9, named_map(definitions, &at, schema)?);
    }
    if let Some(parameters) = doc.get("parameters") {
        let at = at.key("parameters");
        m.message(10, named_map(parameters, &at, parameter)?);
    }
    if let Some(responses) = doc.get("responses") {
        let at = at.key("responses");
        m.message(11, named_map(responses, &at, response)?);
    }
    for (i, requirement) in array(doc.get("security"), &at.key("security"))?
        .iter()
        .enumerate()
    {
        m.message(
            12,
            security_requirement(requirement, &at.key("security").index(i))?,
        );
    }
    if let Some(definitions) = doc.get("securityDefinitions") {
        let at = at.key("securityDefinitions");
        m.message(13, named_map(definitions, &at, security_definition)?);
    }
    for (i, tag) in array(doc.get("tags"), &at.key("tags"))?.iter().enumerate() {
        m.message(14, tag_message(tag, &at.key("tags").index(i))?);
    }
    if let Some(docs) = doc.get("externalDocs") {
        m.message(15, external_docs(docs, &at.key("externalDocs"))?);
    }
    m.extensions(16, doc)?;
    Ok(m.0)
}

/// Where in the document a value sits, for error messages.
#[derive(Clone)]
struct Path(String);

impl Path {
    fn root() -> Path {
        Path(String::from("$"))
    }
    fn key(&self, key: &str) -> Path {
        Path(format!("{}.{key}", self.0))
    }
    fn index(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }
    fn error(&self, problem: impl Into<String>) -> EncodeError {
        EncodeError {
            at: self.0.clone(),
            problem: problem.into(),
        }
    }
}

/// One protobuf message being written; fields are appended in the order the
/// caller writes them (here: ascending field numbers, as Go's marshaller does).
#[derive(Default)]
struct Message(Vec<u8>);

const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LENGTH_DELIMITED: u64 = 2;

impl Message {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire_type: u64) {
        self.varint((u64::from(field) << 3) | wire_type);
    }

    fn bytes(&mut self, field: u32, bytes: &[u8]) {
        self.key(field, LENGTH_DELIMITED);
        self.varint(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    /// A proto3 scalar string: left out when empty.
    fn string(&mut self, field: u32, s: Option<&str>) {
        if let Some(s) = s.filter(|s| !s.is_empty()) {
            self.bytes(field, s.as_bytes());
        }
    }

    fn strings(&mut self, field: u32, v: Option<&Value>, at: &Path) -> Result<()> {
        for (i, item) in array(v, at)?.iter().enumerate() {
            let s = item
                .as_str()
                .ok_or_else(|| at.index(i).error("expected a string"))?;
            self.bytes(field, s.as_bytes());
        }
        Ok(())
    }

    fn message(&mut self, field: u32, m: Message) {
        self.bytes(field, &m.0);
    }

    /// A proto3 scalar bool: left out when false.
    fn bool(&mut self, field: u32, b: Option<bool>) {
        if b == Some(true) {
            self.key(field, VARINT);
            self.varint(1);
        }
    }

    /// A proto3 scalar int64: left out when zero.
    fn int64(&mut self, field: u32, v: Option<i64>) {
        if let Some(v) = v.filter(|v| *v != 0) {
            self.key(field, VARINT);
            // Negative int64s are ten-byte varints of their two's complement.
            self.varint(v as u64);
        }
    }

    /// A proto3 scalar double: left out when zero.
    fn double(&mut self, field: u32, v: Option<f64>) {
        if let Some(v) = v.filter(|v| *v != 0.0) {
            self.key(field, FIXED64);
            self.0.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// The object's `x-` keys as repeated `NamedAny`, in document order.
    fn extensions(&mut self, field: u32, obj: &Map<String, Value>) -> Result<()> {
        for (name, value) in obj.iter().filter(|(k, _)| k.starts_with("x-")) {
            let mut named = Message::default();
            named.string(1, Some(name));
            named.message(2, any(value));
            self.message(field, named);
        }
        Ok(())
    }
}

fn object<'a>(v: &'a Value, at: &Path) -> Result<&'a Map<String, Value>> {
    v.as_object().ok_or_else(|| at.error("expected an object"))
}

fn array<'a>(v: Option<&'a Value>, at: &Path) -> Result<&'a [Value]> {
    match v {
        None => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(at.error("expected an array")),
    }
}

fn text<'a>(obj: &'a Map<String, Value>, key: &str, at: &Path) -> Result<Option<&'a str>> {
    match obj.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(at.key(key).error("expected a string")),
    }
}

fn flag(obj: &Map<String, Value>, key: &str, at: &Path) -> Result<Option<bool>> {
    match obj.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(at.key(key).error("expected a boolean")),
    }
}

fn integer(obj: &Map<String, Value>, key: &str, at: &Path) -> Result<Option<i64>> {
    match obj.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| at.key(key).error("expected an integer")),
    }
}

fn number(obj: &Map<String, Value>, key: &str, at: &Path) -> Result<Option<f64>> {
    match obj.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| at.key(key).error("expected a number")),
    }
}

/// gnostic's `Any`: the value's YAML text (field 2).
fn any(v: &Value) -> Message {
    let mut m = Message::default();
    m.string(2, Some(&v.to_string()));
    m
}

/// A JSON object of named entries as gnostic's `Named*` list in field 1 (the
/// shape of `Definitions`, `Properties`, `ParameterDefinitions`, ...).
fn named_map(
    v: &Value,
    at: &Path,
    encode: fn(&Value, &Path) -> Result<Message>,
) -> Result<Message> {
    let mut m = Message::default();
    for (name, value) in object(v, at)? {
        let mut named = Message::default();
        named.string(1, Some(name));
        named.message(2, encode(value, &at.key(name))?);
        m.message(1, named);
    }
    Ok(m)
}

fn info_message(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let mut m = Message::default();
    m.string(1, text(obj, "title", at)?);
    m.string(2, text(obj, "version", at)?);
    m.string(3, text(obj, "description", at)?);
    m.string(4, text(obj, "termsOfService", at)?);
    if let Some(contact) = obj.get("contact") {
        let at = at.key("contact");
        let c = object(contact, &at)?;
        let mut cm = Message::default();
        cm.string(1, text(c, "name", &at)?);
        cm.string(2, text(c, "url", &at)?);
        cm.string(3, text(c, "email", &at)?);
        cm.extensions(4, c)?;
        m.message(5, cm);
    }
    if let Some(license) = obj.get("license") {
        let at = at.key("license");
        let l = object(license, &at)?;
        let mut lm = Message::default();
        lm.string(1, text(l, "name", &at)?);
        lm.string(2, text(l, "url", &at)?);
        lm.extensions(3, l)?;
        m.message(6, lm);
    }
    m.extensions(7, obj)?;
    Ok(m)
}

fn external_docs(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let mut m = Message::default();
    m.string(1, text(obj, "description", at)?);
    m.string(2, text(obj, "url", at)?);
    m.extensions(3, obj)?;
    Ok(m)
}

fn tag_message(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let mut m = Message::default();
    m.string(1, text(obj, "name", at)?);
    m.string(2, text(obj, "description", at)?);
    if let Some(docs) = obj.get("externalDocs") {
        m.message(3, external_docs(docs, &at.key("externalDocs"))?);
    }
    m.extensions(4, obj)?;
    Ok(m)
}

fn json_reference(obj: &Map<String, Value>, at: &Path) -> Result<Message> {
    let mut m = Message::default();
    m.string(1, text(obj, "$ref", at)?);
    m.string(2, text(obj, "description", at)?);
    Ok(m)
}

fn paths_message(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let mut m = Message::default();
    m.extensions(1, obj)?;
    for (path, item) in obj.iter().filter(|(k, _)| !k.starts_with("x-")) {
        let mut named = Message::default();
        named.string(1, Some(path));
        named.message(2, path_item(item, &at.key(path))?);
        m.message(2, named);
    }
    Ok(m)
}

fn path_item(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let mut m = Message::default();
    m.string(1, text(obj, "$ref", at)?);
    for (field, verb) in [
        (2, "get"),
        (3, "put"),
        (4, "post"),
        (5, "delete"),
        (6, "options"),
        (7, "head"),
        (8, "patch"),
    ] {
        if let Some(op) = obj.get(verb) {
            m.message(field, operation(op, &at.key(verb))?);
        }
    }
    parameters_items(&mut m, 9, obj, at)?;
    m.extensions(10, obj)?;
    Ok(m)
}

fn operation(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let mut m = Message::default();
    m.strings(1, obj.get("tags"), &at.key("tags"))?;
    m.string(2, text(obj, "summary", at)?);
    m.string(3, text(obj, "description", at)?);
    if let Some(docs) = obj.get("externalDocs") {
        m.message(4, external_docs(docs, &at.key("externalDocs"))?);
    }
    m.string(5, text(obj, "operationId", at)?);
    m.strings(6, obj.get("produces"), &at.key("produces"))?;
    m.strings(7, obj.get("consumes"), &at.key("consumes"))?;
    parameters_items(&mut m, 8, obj, at)?;
    if let Some(responses) = obj.get("responses") {
        m.message(9, responses_message(responses, &at.key("responses"))?);
    }
    m.strings(10, obj.get("schemes"), &at.key("schemes"))?;
    m.bool(11, flag(obj, "deprecated", at)?);
    for (i, requirement) in array(obj.get("security"), &at.key("security"))?
        .iter()
        .enumerate()
    {
        m.message(
            12,
            security_requirement(requirement, &at.key("security").index(i))?,
        );
    }
    m.extensions(13, obj)?;
    Ok(m)
}

/// `parameters` as repeated `ParametersItem`: a `$ref` or a parameter.
fn parameters_items(
    m: &mut Message,
    field: u32,
    obj: &Map<String, Value>,
    at: &Path,
) -> Result<()> {
    let at = at.key("parameters");
    for (i, item) in array(obj.get("parameters"), &at)?.iter().enumerate() {
        let at = at.index(i);
        let item_obj = object(item, &at)?;
        let mut wrapper = Message::default();
        if item_obj.contains_key("$ref") {
            wrapper.message(2, json_reference(item_obj, &at)?);
        } else {
            wrapper.message(1, parameter(item, &at)?);
        }
        m.message(field, wrapper);
    }
    Ok(())
}

/// gnostic's `Parameter`: a body parameter, or one of the four non-body kinds.
fn parameter(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let location = text(obj, "in", at)?.unwrap_or_default();
    let mut m = Message::default();
    if location == "body" {
        let mut body = Message::default();
        body.string(1, text(obj, "description", at)?);
        body.string(2, text(obj, "name", at)?);
        body.string(3, Some(location));
        body.bool(4, flag(obj, "required", at)?);
        if let Some(s) = obj.get("schema") {
            body.message(5, schema(s, &at.key("schema"))?);
        }
        body.extensions(6, obj)?;
        m.message(1, body);
        return Ok(m);
    }
    // NonBodyParameter's oneof, and whether the kind has `allowEmptyValue`
    // (which shifts every later field number by one).
    let (variant, allows_empty) = match location {
        "header" => (1, false),
        "formData" => (2, true),
        "query" => (3, true),
        "path" => (4, false),
        other => {
            return Err(at
                .key("in")
                .error(format!("unknown parameter location {other:?}")))
        }
    };
    let mut sub = Message::default();
    sub.bool(1, flag(obj, "required", at)?);
    sub.string(2, Some(location));
    sub.string(3, text(obj, "description", at)?);
    sub.string(4, text(obj, "name", at)?);
    let base = if allows_empty {
        sub.bool(5, flag(obj, "allowEmptyValue", at)?);
        6
    } else {
        5
    };
    primitive_fields(&mut sub, base, obj, at)?;
    sub.extensions(base + 17, obj)?;
    let mut non_body = Message::default();
    non_body.message(variant, sub);
    m.message(2, non_body);
    Ok(m)
}

/// The run of fields that `PrimitivesItems`, `Header` and the non-body
/// parameter kinds share, from `type` (at `base`) to `multipleOf` (`base + 16`).
fn primitive_fields(m: &mut Message, base: u32, obj: &Map<String, Value>, at: &Path) -> Result<()> {
    m.string(base, text(obj, "type", at)?);
    m.string(base + 1, text(obj, "format", at)?);
    if let Some(items) = obj.get("items") {
        m.message(base + 2, primitives_items(items, &at.key("items"))?);
    }
    m.string(base + 3, text(obj, "collectionFormat", at)?);
    if let Some(default) = obj.get("default") {
        m.message(base + 4, any(default));
    }
    m.double(base + 5, number(obj, "maximum", at)?);
    m.bool(base + 6, flag(obj, "exclusiveMaximum", at)?);
    m.double(base + 7, number(obj, "minimum", at)?);
    m.bool(base + 8, flag(obj, "exclusiveMinimum", at)?);
    m.int64(base + 9, integer(obj, "maxLength", at)?);
    m.int64(base + 10, integer(obj, "minLength", at)?);
    m.string(base + 11, text(obj, "pattern", at)?);
    m.int64(base + 12, integer(obj, "maxItems", at)?);
    m.int64(base + 13, integer(obj, "minItems", at)?);
    m.bool(base + 14, flag(obj, "uniqueItems", at)?);
    for value in array(obj.get("enum"), &at.key("enum"))? {
        m.message(base + 15, any(value));
    }
    m.double(base + 16, number(obj, "multipleOf", at)?);
    Ok(())
}

fn primitives_items(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let mut m = Message::default();
    primitive_fields(&mut m, 1, obj, at)?;
    m.extensions(18, obj)?;
    Ok(m)
}

fn header(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let mut m = Message::default();
    primitive_fields(&mut m, 1, obj, at)?;
    m.string(18, text(obj, "description", at)?);
    m.extensions(19, obj)?;
    Ok(m)
}

fn responses_message(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let mut m = Message::default();
    for (code, value) in obj.iter().filter(|(k, _)| !k.starts_with("x-")) {
        let at = at.key(code);
        let value_obj = object(value, &at)?;
        let mut response_value = Message::default();
        if value_obj.contains_key("$ref") {
            response_value.message(2, json_reference(value_obj, &at)?);
        } else {
            response_value.message(1, response(value, &at)?);
        }
        let mut named = Message::default();
        named.string(1, Some(code));
        named.message(2, response_value);
        m.message(1, named);
    }
    m.extensions(2, obj)?;
    Ok(m)
}

fn response(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let mut m = Message::default();
    m.string(1, text(obj, "description", at)?);
    if let Some(s) = obj.get("schema") {
        let at = at.key("schema");
        let mut item = Message::default();
        if s.get("type").and_then(Value::as_str) == Some("file") {
            item.message(2, file_schema(s, &at)?);
        } else {
            item.message(1, schema(s, &at)?);
        }
        m.message(2, item);
    }
    if let Some(headers) = obj.get("headers") {
        m.message(3, named_map(headers, &at.key("headers"), header)?);
    }
    if let Some(examples) = obj.get("examples") {
        let at = at.key("examples");
        let mut em = Message::default();
        for (name, value) in object(examples, &at)? {
            let mut named = Message::default();
            named.string(1, Some(name));
            named.message(2, any(value));
            em.message(1, named);
        }
        m.message(4, em);
    }
    m.extensions(5, obj)?;
    Ok(m)
}

fn file_schema(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let mut m = Message::default();
    m.string(1, text(obj, "format", at)?);
    m.string(2, text(obj, "title", at)?);
    m.string(3, text(obj, "description", at)?);
    if let Some(default) = obj.get("default") {
        m.message(4, any(default));
    }
    m.strings(5, obj.get("required"), &at.key("required"))?;
    m.string(6, text(obj, "type", at)?);
    m.bool(7, flag(obj, "readOnly", at)?);
    if let Some(docs) = obj.get("externalDocs") {
        m.message(8, external_docs(docs, &at.key("externalDocs"))?);
    }
    if let Some(example) = obj.get("example") {
        m.message(9, any(example));
    }
    m.extensions(10, obj)?;
    Ok(m)
}

fn schema(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let mut m = Message::default();
    m.string(1, text(obj, "$ref", at)?);
    m.string(2, text(obj, "format", at)?);
    m.string(3, text(obj, "title", at)?);
    m.string(4, text(obj, "description", at)?);
    if let Some(default) = obj.get("default") {
        m.message(5, any(default));
    }
    m.double(6, number(obj, "multipleOf", at)?);
    m.double(7, number(obj, "maximum", at)?);
    m.bool(8, flag(obj, "exclusiveMaximum", at)?);
    m.double(9, number(obj, "minimum", at)?);
    m.bool(10, flag(obj, "exclusiveMinimum", at)?);
    m.int64(11, integer(obj, "maxLength", at)?);
    m.int64(12, integer(obj, "minLength", at)?);
    m.string(13, text(obj, "pattern", at)?);
    m.int64(14, integer(obj, "maxItems", at)?);
    m.int64(15, integer(obj, "minItems", at)?);
    m.bool(16, flag(obj, "uniqueItems", at)?);
    m.int64(17, integer(obj, "maxProperties", at)?);
    m.int64(18, integer(obj, "minProperties", at)?);
    m.strings(19, obj.get("required"), &at.key("required"))?;
    for value in array(obj.get("enum"), &at.key("enum"))? {
        m.message(20, any(value));
    }
    match obj.get("additionalProperties") {
        None => {}
        // A oneof member is written even when it holds the default value.
        Some(Value::Bool(b)) => {
            let mut item = Message::default();
            item.key(2, VARINT);
            item.varint(u64::from(*b));
            m.message(21, item);
        }
        Some(s) => {
            let mut item = Message::default();
            item.message(1, schema(s, &at.key("additionalProperties"))?);
            m.message(21, item);
        }
    }
    match obj.get("type") {
        None => {}
        Some(Value::String(t)) => {
            let mut item = Message::default();
            item.bytes(1, t.as_bytes());
            m.message(22, item);
        }
        Some(types @ Value::Array(_)) => {
            let mut item = Message::default();
            item.strings(1, Some(types), &at.key("type"))?;
            m.message(22, item);
        }
        Some(_) => return Err(at.key("type").error("expected a string or an array")),
    }
    match obj.get("items") {
        None => {}
        Some(Value::Array(schemas)) => {
            let mut item = Message::default();
            for (i, s) in schemas.iter().enumerate() {
                item.message(1, schema(s, &at.key("items").index(i))?);
            }
            m.message(23, item);
        }
        Some(s) => {
            let mut item = Message::default();
            item.message(1, schema(s, &at.key("items"))?);
            m.message(23, item);
        }
    }
    for (i, s) in array(obj.get("allOf"), &at.key("allOf"))?
        .iter()
        .enumerate()
    {
        m.message(24, schema(s, &at.key("allOf").index(i))?);
    }
    if let Some(properties) = obj.get("properties") {
        m.message(25, named_map(properties, &at.key("properties"), schema)?);
    }
    m.string(26, text(obj, "discriminator", at)?);
    m.bool(27, flag(obj, "readOnly", at)?);
    if let Some(xml) = obj.get("xml") {
        let at = at.key("xml");
        let x = object(xml, &at)?;
        let mut xm = Message::default();
        xm.string(1, text(x, "name", &at)?);
        xm.string(2, text(x, "namespace", &at)?);
        xm.string(3, text(x, "prefix", &at)?);
        xm.bool(4, flag(x, "attribute", &at)?);
        xm.bool(5, flag(x, "wrapped", &at)?);
        xm.extensions(6, x)?;
        m.message(28, xm);
    }
    if let Some(docs) = obj.get("externalDocs") {
        m.message(29, external_docs(docs, &at.key("externalDocs"))?);
    }
    if let Some(example) = obj.get("example") {
        m.message(30, any(example));
    }
    m.extensions(31, obj)?;
    Ok(m)
}

/// `{"<scheme name>": ["scope", ...]}` as `SecurityRequirement`.
fn security_requirement(v: &Value, at: &Path) -> Result<Message> {
    let mut m = Message::default();
    for (name, scopes) in object(v, at)? {
        let mut list = Message::default();
        list.strings(1, Some(scopes), &at.key(name))?;
        let mut named = Message::default();
        named.string(1, Some(name));
        named.message(2, list);
        m.message(1, named);
    }
    Ok(m)
}

/// A `securityDefinitions` entry: gnostic's oneof over the scheme kinds.
fn security_definition(v: &Value, at: &Path) -> Result<Message> {
    let obj = object(v, at)?;
    let kind = text(obj, "type", at)?.unwrap_or_default();
    let flow = text(obj, "flow", at)?.unwrap_or_default();
    let mut scheme = Message::default();
    scheme.string(1, Some(kind));
    let variant = match (kind, flow) {
        ("basic", _) => {
            scheme.string(2, text(obj, "description", at)?);
            scheme.extensions(3, obj)?;
            1
        }
        ("apiKey", _) => {
            scheme.string(2, text(obj, "name", at)?);
            scheme.string(3, text(obj, "in", at)?);
            scheme.string(4, text(obj, "description", at)?);
            scheme.extensions(5, obj)?;
            2
        }
        ("oauth2", "implicit" | "password" | "application" | "accessCode") => {
            scheme.string(2, Some(flow));
            if let Some(scopes) = obj.get("scopes") {
                let at = at.key("scopes");
                let mut sm = Message::default();
                for (name, value) in object(scopes, &at)? {
                    let mut named = Message::default();
                    named.string(1, Some(name));
                    named.string(2, value.as_str());
                    sm.message(1, named);
                }
                scheme.message(3, sm);
            }
            let mut next = 4;
            if matches!(flow, "implicit" | "accessCode") {
                scheme.string(next, text(obj, "authorizationUrl", at)?);
                next += 1;
            }
            if flow != "implicit" {
                scheme.string(next, text(obj, "tokenUrl", at)?);
                next += 1;
            }
            scheme.string(next, text(obj, "description", at)?);
            scheme.extensions(next + 1, obj)?;
            match flow {
                "implicit" => 3,
                "password" => 4,
                "application" => 5,
                _ => 6,
            }
        }
        _ => return Err(at.error(format!("unknown security scheme {kind:?} {flow:?}"))),
    };
    let mut m = Message::default();
    m.message(variant, scheme);
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_minimal_document_encodes_field_by_field() {
        let bytes = encode_document(&json!({
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": "v1.32.0"},
        }))
        .expect("encodes");
        // swagger (1), then info (2) holding title (1) and version (2).
        let expected: Vec<u8> = [
            &[0x0a, 3][..],
            b"2.0",
            &[0x12, 21, 0x0a, 10],
            b"Kubernetes",
            &[0x12, 7],
            b"v1.32.0",
        ]
        .concat();
        assert_eq!(bytes, expected);
    }

    #[test]
    fn schema_fields_use_gnostic_numbers() {
        let s = schema(
            &json!({
                "type": "object",
                "required": ["spec"],
                "additionalProperties": false,
                "x-kubernetes-preserve-unknown-fields": true,
            }),
            &Path::root(),
        )
        .expect("encodes");
        let required = [0x9a, 0x01, 4, b's', b'p', b'e', b'c'];
        let additional_false = [0xaa, 0x01, 2, 0x10, 0x00];
        let type_object = [0xb2, 0x01, 8, 0x0a, 6];
        assert!(s.0.starts_with(&required), "{:x?}", s.0);
        assert_eq!(s.0[7..12], additional_false);
        assert_eq!(s.0[12..17], type_object);
        // The extension: NamedAny (31) with the name and the YAML text `true`.
        let ext_at = 17 + 6;
        assert_eq!(s.0[ext_at..ext_at + 2], [0xfa, 0x01]);
        assert!(s.0.ends_with(b"\x12\x06\x12\x04true"));
    }

    #[test]
    fn a_value_of_the_wrong_type_is_named_with_its_place() {
        let err = encode_document(&json!({
            "swagger": "2.0",
            "definitions": {"a.B": {"properties": {"x": {"maxLength": "long"}}}},
        }))
        .expect_err("refused");
        assert_eq!(err.at, "$.definitions.a.B.properties.x.maxLength");
        assert_eq!(err.problem, "expected an integer");
    }

    #[test]
    fn negative_integers_are_ten_byte_varints() {
        let mut m = Message::default();
        m.int64(11, Some(-1));
        assert_eq!(m.0.len(), 1 + 10);
    }
}
