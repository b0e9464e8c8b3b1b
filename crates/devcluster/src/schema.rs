//! Structural schemas of custom resources: validation, pruning and defaulting.
//!
//! A CRD version's `schema.openAPIV3Schema` is parsed once into a
//! [`StructuralSchema`]; the request pipeline then
//! 1. prunes unknown fields ([`StructuralSchema::prune`]) and reports them as a
//!    `Warning: 299` header or, with `fieldValidation=Strict`, as a 400
//!    ([`strict_decoding_error`]),
//! 2. applies `default`s ([`StructuralSchema::apply_defaults`]),
//! 3. validates ([`StructuralSchema::validate`] on create,
//!    [`StructuralSchema::validate_update`] with the stored object on update, so
//!    CEL transition rules see `oldSelf`) and answers 422 with [`invalid_status`]
//!    when causes remain.
//!
//! Before any of that, `metadata` must decode as kube's decoder reads it into an
//! ObjectMeta ([`objectmeta`]: labels and annotations are maps of strings).
//!
//! Validation covers the OpenAPI keywords structural schemas allow, string
//! formats, `x-kubernetes-list-type` uniqueness and `x-kubernetes-validations`
//! CEL rules (see the `cel` submodule).
//!
//! Messages follow kube-apiserver 1.32 byte for byte where a client can see them
//! (kubectl prints them verbatim), which is why the formatting helpers below mimic
//! Go's `%v`/`%q` rendering of values.

use std::collections::BTreeMap;
use std::sync::Arc;

use regex::Regex;
use serde_json::{json, Map, Value};

/// Why a CRD schema could not be turned into a [`StructuralSchema`].
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A schema node (or `properties` / `items` entry) is not a JSON object.
    /// Fix the CRD: every schema node must be an object.
    #[error("schema at {path:?} must be an object")]
    NotAnObject { path: String },
    /// A keyword has a value of the wrong JSON type (for example `maximum: "ten"`).
    #[error("schema at {path:?}: keyword {keyword:?} has a value of the wrong type")]
    BadKeyword { path: String, keyword: String },
    /// An `x-kubernetes-validations` rule (or message expression) is not valid
    /// CEL. Fix the rule in the CRD.
    #[error("schema at {path:?}: validation rule {rule:?} does not compile: {message}")]
    BadRule {
        path: String,
        rule: String,
        message: String,
    },
    /// A `pattern` is not a regular expression the server can evaluate.
    #[error("schema at {path:?}: pattern {pattern:?} does not compile")]
    BadPattern {
        path: String,
        pattern: String,
        #[source]
        source: regex::Error,
    },
}

/// One field-level problem, as a Kubernetes `StatusCause`.
///
/// `reason` is the cause type (`FieldValueInvalid`, `FieldValueTypeInvalid`,
/// `FieldValueRequired`, `FieldValueNotSupported`, `FieldValueTooLong`,
/// `FieldValueTooMany`, ...), `message` the error body without the field
/// (`Invalid value: 11: spec.replicas in body should be less than or equal to 10`)
/// and `field` the dotted path (`spec.replicas`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

impl Cause {
    /// `<field>: <message>`, the form used inside a Status message.
    pub fn full_message(&self) -> String {
        if self.field.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.field, self.message)
        }
    }

    /// The cause as JSON (`{reason, message, field}`, empty members left out as
    /// kube's `omitempty` does).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if !self.reason.is_empty() {
            m.insert("reason".into(), Value::String(self.reason.clone()));
        }
        if !self.message.is_empty() {
            m.insert("message".into(), Value::String(self.message.clone()));
        }
        if !self.field.is_empty() {
            m.insert("field".into(), Value::String(self.field.clone()));
        }
        Value::Object(m)
    }

    /// `FieldValueInvalid`: `Invalid value: <value>: <detail>`.
    pub fn invalid(field: &str, value: &Value, detail: &str) -> Cause {
        Cause::with_value("FieldValueInvalid", "Invalid value", field, value, detail)
    }

    /// `FieldValueRequired`: `Required value[: detail]`.
    pub fn required(field: &str, detail: &str) -> Cause {
        Cause::without_value("FieldValueRequired", "Required value", field, detail)
    }

    /// `FieldValueForbidden`: `Forbidden[: detail]`.
    pub fn forbidden(field: &str, detail: &str) -> Cause {
        Cause::without_value("FieldValueForbidden", "Forbidden", field, detail)
    }

    /// `FieldValueNotSupported`: `Unsupported value: "x": supported values: "a", "b"`.
    pub fn not_supported(field: &str, value: &Value, supported: &[String]) -> Cause {
        let detail = if supported.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Cause::with_value(
            "FieldValueNotSupported",
            "Unsupported value",
            field,
            value,
            &detail,
        )
    }

    /// `FieldValueTooLong`: `Too long: may not be more than <max> bytes` (kube
    /// leaves the value out).
    pub fn too_long(field: &str, max: u64) -> Cause {
        let unit = if max == 1 { "byte" } else { "bytes" };
        Cause::without_value(
            "FieldValueTooLong",
            "Too long",
            field,
            &format!("may not be more than {max} {unit}"),
        )
    }

    /// `FieldValueDuplicate`: `Duplicate value: <value>`.
    pub fn duplicate(field: &str, value: &Value) -> Cause {
        Cause::with_value("FieldValueDuplicate", "Duplicate value", field, value, "")
    }

    /// `FieldValueNotFound`: `Not found: <value>`.
    pub fn not_found(field: &str, value: &Value) -> Cause {
        Cause::with_value("FieldValueNotFound", "Not found", field, value, "")
    }

    fn with_value(reason: &str, kind: &str, field: &str, value: &Value, detail: &str) -> Cause {
        let mut message = format!("{kind}: {}", go_value(value));
        if !detail.is_empty() {
            message.push_str(": ");
            message.push_str(detail);
        }
        Cause {
            reason: reason.into(),
            message,
            field: field.into(),
        }
    }

    fn without_value(reason: &str, kind: &str, field: &str, detail: &str) -> Cause {
        let message = if detail.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}: {detail}")
        };
        Cause {
            reason: reason.into(),
            message,
            field: field.into(),
        }
    }
}

/// Builds the 422 `Invalid` Status kube-apiserver returns for `causes`.
///
/// `kind` is the Kind (`CronTab`), `group` the API group (empty for the core
/// group). The message is `CronTab.stable.example.io "bad-crontab" is invalid: <c>`
/// with `[c1, c2]` brackets only when several distinct causes exist; duplicates
/// are dropped from the message but kept in `details.causes`, as kube does.
pub fn invalid_status(kind: &str, group: &str, name: &str, causes: &[Cause]) -> Value {
    let qualified = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    let mut seen: Vec<String> = Vec::new();
    for c in causes {
        let m = c.full_message();
        if !seen.contains(&m) {
            seen.push(m);
        }
    }
    let message = match seen.len() {
        0 => format!("{qualified} {} is invalid", go_quote(name)),
        1 => format!("{qualified} {} is invalid: {}", go_quote(name), seen[0]),
        _ => format!(
            "{qualified} {} is invalid: [{}]",
            go_quote(name),
            seen.join(", ")
        ),
    };
    let mut details = Map::new();
    if !name.is_empty() {
        details.insert("name".into(), Value::String(name.into()));
    }
    if !group.is_empty() {
        details.insert("group".into(), Value::String(group.into()));
    }
    if !kind.is_empty() {
        details.insert("kind".into(), Value::String(kind.into()));
    }
    if !causes.is_empty() {
        details.insert(
            "causes".into(),
            Value::Array(causes.iter().map(Cause::to_json).collect()),
        );
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Invalid",
        "details": Value::Object(details),
        "code": 422,
    })
}

/// Builds the 400 `BadRequest` Status of `fieldValidation=Strict` when unknown
/// fields were found: `CronTab in version "v1" cannot be handled as a CronTab:
/// strict decoding error: unknown field "spec.colour", ...`.
pub fn strict_decoding_error(kind: &str, version: &str, unknown: &[String]) -> Value {
    let fields: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field {}", go_quote(f)))
        .collect();
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "{kind} in version {} cannot be handled as a {kind}: strict decoding error: {}",
            go_quote(version),
            fields.join(", ")
        ),
        "reason": "BadRequest",
        "code": 400,
    })
}

/// The `Warning` header value for one pruned field: `299 - "unknown field \"spec.colour\""`.
pub fn unknown_field_warning(path: &str) -> String {
    format!(
        "299 - {}",
        go_quote(&format!("unknown field {}", go_quote(path)))
    )
}

/// The fields of `ObjectMeta`; anything else under `metadata` is unknown.
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// A parsed structural schema (one node per schema object).
#[derive(Clone, Debug, Default)]
pub struct StructuralSchema {
    root: Node,
    /// Whether any node carries `x-kubernetes-validations`.
    has_rules: bool,
}

#[derive(Clone, Debug, Default)]
struct Node {
    type_: Option<String>,
    format: Option<String>,
    nullable: bool,
    int_or_string: bool,
    preserve_unknown: bool,
    embedded_resource: bool,
    properties: BTreeMap<String, Node>,
    /// `additionalProperties` given as a schema.
    additional: Option<Box<Node>>,
    /// `additionalProperties: true` (keeps unknown keys, no schema).
    additional_allowed: bool,
    items: Option<Box<Node>>,
    required: Vec<String>,
    enum_: Option<Vec<Value>>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    exclusive_minimum: bool,
    exclusive_maximum: bool,
    multiple_of: Option<f64>,
    pattern: Option<(String, Regex)>,
    max_length: Option<u64>,
    min_length: Option<u64>,
    max_items: Option<u64>,
    min_items: Option<u64>,
    unique_items: bool,
    max_properties: Option<u64>,
    min_properties: Option<u64>,
    default: Option<Value>,
    list_type: Option<String>,
    list_map_keys: Vec<String>,
    rules: Vec<Arc<cel::Rule>>,
}

impl StructuralSchema {
    /// Parses `schema.openAPIV3Schema` of a CRD version.
    ///
    /// Keywords devcluster does not evaluate (`allOf`, `x-kubernetes-validations`,
    /// `description`, ...) are accepted and ignored.
    pub fn from_json(schema: &Value) -> Result<Self, SchemaError> {
        let root = Node::parse(schema, "")?;
        Ok(StructuralSchema {
            has_rules: root.has_rules(),
            root,
        })
    }

    /// The schema of one element of a CRD's `spec.versions`
    /// (`schema.openAPIV3Schema`); a version without one accepts and keeps
    /// everything.
    pub fn from_crd_version(version: &Value) -> Result<Self, SchemaError> {
        match version.pointer("/schema/openAPIV3Schema") {
            Some(s) => StructuralSchema::from_json(s),
            None => Ok(StructuralSchema::preserve_all()),
        }
    }

    /// A schema that accepts and keeps everything (CRDs without a schema).
    pub fn preserve_all() -> Self {
        StructuralSchema {
            root: Node {
                type_: Some("object".into()),
                preserve_unknown: true,
                ..Node::default()
            },
            has_rules: false,
        }
    }

    /// Validates `object` (a whole custom resource) and returns kube's causes in
    /// kube's order. An empty vector means valid.
    pub fn validate(&self, object: &Value) -> Vec<Cause> {
        self.validate_update(object, None)
    }

    /// [`validate`](Self::validate) for an update from `old`: transition rules
    /// (`x-kubernetes-validations` reading `oldSelf`) run too, with `oldSelf`
    /// taken from the same field of `old`.
    ///
    /// Order as in kube: schema errors, duplicate items of `set`/`map` lists,
    /// then rule failures. Rules are skipped, with a single `<nil>` cause saying
    /// so, when a type, required, enum or size error was found first.
    pub fn validate_update(&self, object: &Value, old: Option<&Value>) -> Vec<Cause> {
        let mut out = Vec::new();
        self.root.validate(object, "", &mut out);
        self.root.validate_list_types(object, "", &mut out);
        if self.has_rules {
            let blocking = out.iter().any(|c| {
                matches!(
                    c.reason.as_str(),
                    "FieldValueNotSupported"
                        | "FieldValueRequired"
                        | "FieldValueTooLong"
                        | "FieldValueTooMany"
                        | "FieldValueTypeInvalid"
                )
            });
            if blocking {
                out.push(Cause::invalid(
                    "<nil>",
                    &Value::Null,
                    "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
                ));
            } else {
                self.root.validate_rules(object, old, "", &mut out);
            }
        }
        out
    }

    /// Removes fields the schema does not know, returning their dotted paths in
    /// document order (`spec.colour`, `metadata.bogus`, `extra`,
    /// `spec.items[0].x`). At the root (and in embedded resources) `apiVersion`,
    /// `kind` and `metadata` are always known; unknown `metadata` members are
    /// pruned too.
    pub fn prune(&self, object: &mut Value) -> Vec<String> {
        let mut pruned = Vec::new();
        self.root.prune(object, "", true, &mut pruned);
        pruned
    }

    /// Fills in `default` values of absent fields, and of null fields that are
    /// not nullable. Null non-nullable fields without a default are removed, as
    /// kube's decoder does, so validation then reports them as missing.
    pub fn apply_defaults(&self, object: &mut Value) {
        self.root.default_into(object);
    }

    /// `x-kubernetes-list-type` (`atomic`, `set` or `map`) and
    /// `x-kubernetes-list-map-keys` of the list reached by the field names
    /// `fields` (list positions left out: `["status", "conditions"]`). None when
    /// the path leaves the schema or the list declares no type.
    pub fn list_type(&self, fields: &[&str]) -> Option<(&str, &[String])> {
        let mut node = &self.root;
        for f in fields {
            while let Some(items) = &node.items {
                node = items;
            }
            node = match node.properties.get(*f) {
                Some(n) => n,
                None => node.additional.as_deref()?,
            };
        }
        node.list_type
            .as_deref()
            .map(|t| (t, node.list_map_keys.as_slice()))
    }

    /// Whether the root keeps arbitrary fields (`x-kubernetes-preserve-unknown-fields`
    /// at the top), in which case pruning can only touch `metadata`.
    pub fn preserves_unknown_fields(&self) -> bool {
        self.root.preserve_unknown
    }
}

fn child_path(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn get_u64(m: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u64>, SchemaError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| SchemaError::BadKeyword {
            path: path.into(),
            keyword: key.into(),
        }),
    }
}

fn get_f64(m: &Map<String, Value>, key: &str, path: &str) -> Result<Option<f64>, SchemaError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| SchemaError::BadKeyword {
            path: path.into(),
            keyword: key.into(),
        }),
    }
}

fn get_bool(m: &Map<String, Value>, key: &str) -> bool {
    m.get(key).and_then(Value::as_bool).unwrap_or(false)
}

impl Node {
    fn parse(v: &Value, path: &str) -> Result<Node, SchemaError> {
        let m = v
            .as_object()
            .ok_or_else(|| SchemaError::NotAnObject { path: path.into() })?;
        let mut n = Node {
            type_: m.get("type").and_then(Value::as_str).map(str::to_string),
            format: m.get("format").and_then(Value::as_str).map(str::to_string),
            nullable: get_bool(m, "nullable"),
            int_or_string: get_bool(m, "x-kubernetes-int-or-string"),
            preserve_unknown: get_bool(m, "x-kubernetes-preserve-unknown-fields"),
            embedded_resource: get_bool(m, "x-kubernetes-embedded-resource"),
            minimum: get_f64(m, "minimum", path)?,
            maximum: get_f64(m, "maximum", path)?,
            exclusive_minimum: get_bool(m, "exclusiveMinimum"),
            exclusive_maximum: get_bool(m, "exclusiveMaximum"),
            multiple_of: get_f64(m, "multipleOf", path)?,
            max_length: get_u64(m, "maxLength", path)?,
            min_length: get_u64(m, "minLength", path)?,
            max_items: get_u64(m, "maxItems", path)?,
            min_items: get_u64(m, "minItems", path)?,
            unique_items: get_bool(m, "uniqueItems"),
            max_properties: get_u64(m, "maxProperties", path)?,
            min_properties: get_u64(m, "minProperties", path)?,
            default: m.get("default").cloned(),
            ..Node::default()
        };
        if let Some(p) = m.get("pattern") {
            let p = p.as_str().ok_or_else(|| SchemaError::BadKeyword {
                path: path.into(),
                keyword: "pattern".into(),
            })?;
            let re = Regex::new(p).map_err(|source| SchemaError::BadPattern {
                path: path.into(),
                pattern: p.into(),
                source,
            })?;
            n.pattern = Some((p.to_string(), re));
        }
        if let Some(props) = m.get("properties") {
            let props = props.as_object().ok_or_else(|| SchemaError::BadKeyword {
                path: path.into(),
                keyword: "properties".into(),
            })?;
            for (k, sub) in props {
                n.properties
                    .insert(k.clone(), Node::parse(sub, &child_path(path, k))?);
            }
        }
        match m.get("additionalProperties") {
            Some(Value::Bool(b)) => n.additional_allowed = *b,
            Some(sub @ Value::Object(_)) => {
                n.additional = Some(Box::new(Node::parse(sub, &child_path(path, "*"))?));
            }
            _ => {}
        }
        if let Some(items) = m.get("items") {
            n.items = Some(Box::new(Node::parse(items, &format!("{path}[*]"))?));
        }
        if let Some(req) = m.get("required").and_then(Value::as_array) {
            n.required = req
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
        }
        n.list_type = m
            .get("x-kubernetes-list-type")
            .and_then(Value::as_str)
            .map(str::to_string);
        if let Some(keys) = m
            .get("x-kubernetes-list-map-keys")
            .and_then(Value::as_array)
        {
            n.list_map_keys = keys
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
        }
        n.rules = cel::Rule::parse_all(m.get("x-kubernetes-validations"), path)?
            .into_iter()
            .map(Arc::new)
            .collect();
        if let Some(e) = m.get("enum").and_then(Value::as_array) {
            n.enum_ = Some(e.clone());
        }
        Ok(n)
    }

    fn validate(&self, v: &Value, path: &str, out: &mut Vec<Cause>) {
        // kube-openapi's order: type, string, format, number, list, enum, object.
        // Value checks only apply to values of the right type, but the enum check
        // runs even after a type error.
        let type_ok = self.check_type(v, path, out);
        if type_ok {
            match v {
                Value::String(s) => self.validate_string(s, v, path, out),
                Value::Number(_) => self.validate_number(v, path, out),
                Value::Array(items) => self.validate_array(items, v, path, out),
                _ => {}
            }
        }
        if let Some(allowed) = &self.enum_ {
            if !allowed.iter().any(|a| json_equal(a, v)) {
                let names: Vec<String> = allowed
                    .iter()
                    .map(|a| match a {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect();
                out.push(Cause::not_supported(path, v, &names));
            }
        }
        if let (true, Value::Object(m)) = (type_ok, v) {
            self.validate_object(m, path, out);
        }
    }

    /// Pushes a type cause and returns false when `v` does not have the
    /// schema's type (null counts as a type unless the node is nullable).
    fn check_type(&self, v: &Value, path: &str, out: &mut Vec<Cause>) -> bool {
        if v.is_null() {
            if self.nullable || (self.type_.is_none() && !self.int_or_string) {
                return true;
            }
            out.push(type_cause(path, &self.type_name(), "null"));
            return false;
        }
        let actual = json_type(v);
        let ok = if self.int_or_string {
            actual == "integer" || actual == "string"
        } else {
            match &self.type_ {
                Some(t) => t == actual || (t == "number" && actual == "integer"),
                None => true,
            }
        };
        if !ok {
            out.push(type_cause(path, &self.type_name(), actual));
        }
        ok
    }

    fn has_rules(&self) -> bool {
        !self.rules.is_empty()
            || self.properties.values().any(Node::has_rules)
            || self.additional.as_ref().is_some_and(|n| n.has_rules())
            || self.items.as_ref().is_some_and(|n| n.has_rules())
    }

    /// Children of an object value with their schemas, properties first (in
    /// name order), then `additionalProperties` entries.
    fn children<'v>(&'v self, m: &'v Map<String, Value>) -> Vec<(&'v String, &'v Node, &'v Value)> {
        let mut out: Vec<(&String, &Node, &Value)> = self
            .properties
            .iter()
            .filter_map(|(k, n)| m.get(k).map(|v| (k, n, v)))
            .collect();
        if let Some(add) = &self.additional {
            out.extend(
                m.iter()
                    .filter(|(k, _)| !self.properties.contains_key(*k))
                    .map(|(k, v)| (k, add.as_ref(), v)),
            );
        }
        out
    }

    /// Duplicate items of `x-kubernetes-list-type: set` lists and duplicate
    /// keys of `map` lists.
    fn validate_list_types(&self, v: &Value, path: &str, out: &mut Vec<Cause>) {
        match v {
            Value::Object(m) => {
                for (k, n, c) in self.children(m) {
                    n.validate_list_types(c, &child_path(path, k), out);
                }
            }
            Value::Array(items) => {
                let identity = |item: &Value| -> Option<Value> {
                    match self.list_type.as_deref() {
                        Some("set") => Some(item.clone()),
                        Some("map") => {
                            let mut key = Map::new();
                            for k in &self.list_map_keys {
                                if let Some(x) = item.get(k.as_str()) {
                                    key.insert(k.clone(), x.clone());
                                }
                            }
                            Some(Value::Object(key))
                        }
                        _ => None,
                    }
                };
                let ids: Vec<Option<Value>> = items.iter().map(identity).collect();
                for (i, id) in ids.iter().enumerate() {
                    if let Some(id) = id {
                        if ids[..i]
                            .iter()
                            .any(|p| p.as_ref().is_some_and(|p| json_equal(p, id)))
                        {
                            out.push(Cause::duplicate(&format!("{path}[{i}]"), id));
                        }
                    }
                }
                if let Some(item_schema) = &self.items {
                    for (i, item) in items.iter().enumerate() {
                        item_schema.validate_list_types(item, &format!("{path}[{i}]"), out);
                    }
                }
            }
            _ => {}
        }
    }

    /// Runs `x-kubernetes-validations` rules, the node's own before its
    /// children's.
    fn validate_rules(&self, v: &Value, old: Option<&Value>, path: &str, out: &mut Vec<Cause>) {
        if v.is_null() {
            return;
        }
        let type_value = Value::String(
            self.type_
                .clone()
                .unwrap_or_else(|| json_type(v).to_string()),
        );
        for rule in &self.rules {
            if rule.transition && old.is_none() {
                continue;
            }
            let Err(failure) = rule.check(v, old) else {
                continue;
            };
            // kube's root field path is nil, printed `<nil>`.
            let field = match &rule.field_path {
                Some(fp) => child_path(path, fp.trim().trim_start_matches('.')),
                None if path.is_empty() => "<nil>".to_string(),
                None => path.to_string(),
            };
            out.push(match failure {
                cel::Failure::Error(msg) => Cause::invalid(&field, &type_value, &msg),
                cel::Failure::False(detail) => match rule.reason.as_deref() {
                    Some("FieldValueForbidden") => Cause::forbidden(&field, &detail),
                    Some("FieldValueRequired") => Cause::required(&field, &detail),
                    Some("FieldValueDuplicate") => Cause::duplicate(&field, &type_value),
                    _ => Cause::invalid(&field, &type_value, &detail),
                },
            });
        }
        match v {
            Value::Object(m) => {
                for (k, n, c) in self.children(m) {
                    let old_child = old.and_then(|o| o.get(k.as_str()));
                    n.validate_rules(c, old_child, &child_path(path, k), out);
                }
            }
            Value::Array(items) => {
                if let Some(item_schema) = &self.items {
                    for (i, item) in items.iter().enumerate() {
                        item_schema.validate_rules(item, None, &format!("{path}[{i}]"), out);
                    }
                }
            }
            _ => {}
        }
    }

    fn type_name(&self) -> String {
        if self.int_or_string {
            "integer-or-string".into()
        } else {
            self.type_.clone().unwrap_or_default()
        }
    }

    fn validate_string(&self, s: &str, v: &Value, path: &str, out: &mut Vec<Cause>) {
        let len = s.chars().count() as u64;
        if let Some(max) = self.max_length {
            if len > max {
                out.push(Cause::too_long(path, max));
            }
        }
        if let Some(min) = self.min_length {
            if len < min {
                out.push(Cause::invalid(
                    path,
                    v,
                    &format!("{path} in body should be at least {min} chars long"),
                ));
            }
        }
        if let Some((src, re)) = &self.pattern {
            if !re.is_match(s) {
                out.push(Cause::invalid(
                    path,
                    v,
                    &format!("{path} in body should match '{src}'"),
                ));
            }
        }
        if let Some(f) = &self.format {
            if !format_ok(f, s) {
                out.push(Cause {
                    reason: "FieldValueTypeInvalid".into(),
                    message: format!(
                        "Invalid value: {}: {path} in body must be of type {f}: {}",
                        go_quote(s),
                        go_quote(s)
                    ),
                    field: path.into(),
                });
            }
        }
    }

    fn validate_number(&self, v: &Value, path: &str, out: &mut Vec<Cause>) {
        let Some(x) = v.as_f64() else { return };
        if let Some(m) = self.multiple_of {
            if m > 0.0 && (x / m).fract().abs() > f64::EPSILON {
                out.push(Cause::invalid(
                    path,
                    v,
                    &format!("{path} in body should be a multiple of {}", go_float(m)),
                ));
            }
        }
        if let Some(max) = self.maximum {
            let bad = if self.exclusive_maximum {
                x >= max
            } else {
                x > max
            };
            if bad {
                let rel = if self.exclusive_maximum {
                    "less than"
                } else {
                    "less than or equal to"
                };
                out.push(Cause::invalid(
                    path,
                    v,
                    &format!("{path} in body should be {rel} {}", go_float(max)),
                ));
            }
        }
        if let Some(min) = self.minimum {
            let bad = if self.exclusive_minimum {
                x <= min
            } else {
                x < min
            };
            if bad {
                let rel = if self.exclusive_minimum {
                    "greater than"
                } else {
                    "greater than or equal to"
                };
                out.push(Cause::invalid(
                    path,
                    v,
                    &format!("{path} in body should be {rel} {}", go_float(min)),
                ));
            }
        }
    }

    fn validate_array(&self, items: &[Value], _v: &Value, path: &str, out: &mut Vec<Cause>) {
        // Items first, then the list's own bounds, as kube-openapi orders them.
        if let Some(item_schema) = &self.items {
            for (i, item) in items.iter().enumerate() {
                item_schema.validate(item, &format!("{path}[{i}]"), out);
            }
        }
        let n = items.len() as u64;
        if let Some(min) = self.min_items {
            if n < min {
                out.push(Cause::invalid(
                    path,
                    &json!(n),
                    &format!("{path} in body should have at least {min} items"),
                ));
            }
        }
        if let Some(max) = self.max_items {
            if n > max {
                out.push(too_many(path, n, max));
            }
        }
        if self.unique_items {
            let dup = items
                .iter()
                .enumerate()
                .any(|(i, a)| items[..i].iter().any(|b| json_equal(a, b)));
            if dup {
                out.push(Cause::invalid(
                    path,
                    &json!(""),
                    &format!("{path} in body shouldn't contain duplicates"),
                ));
            }
        }
    }

    fn validate_object(&self, m: &Map<String, Value>, path: &str, out: &mut Vec<Cause>) {
        let n = m.len() as u64;
        if let Some(min) = self.min_properties {
            if n < min {
                out.push(Cause::invalid(
                    path,
                    &json!(min),
                    &format!("{path} in body should have at least {min} properties"),
                ));
                return;
            }
        }
        if let Some(max) = self.max_properties {
            if n > max {
                out.push(too_many(path, n, max));
                return;
            }
        }
        if let Some(add) = &self.additional {
            for (k, v) in m {
                if !self.properties.contains_key(k) {
                    add.validate(v, &child_path(path, k), out);
                }
            }
        }
        for (k, sub) in &self.properties {
            if let Some(v) = m.get(k) {
                sub.validate(v, &child_path(path, k), out);
            }
        }
        for k in &self.required {
            if !m.contains_key(k) {
                out.push(Cause::required(&child_path(path, k), ""));
            }
        }
    }

    /// Whether unknown keys of an object at this node survive pruning.
    fn keeps_unknown(&self) -> bool {
        self.preserve_unknown || self.additional_allowed
    }

    fn prune(&self, v: &mut Value, path: &str, is_root: bool, pruned: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                let meta_level = is_root || self.embedded_resource;
                let keys: Vec<String> = m.keys().cloned().collect();
                for k in keys {
                    let p = child_path(path, &k);
                    if meta_level && (k == "apiVersion" || k == "kind") {
                        continue;
                    }
                    if meta_level && k == "metadata" {
                        if let Some(Value::Object(meta)) = m.get_mut("metadata") {
                            prune_object_meta(meta, &p, pruned);
                        }
                        continue;
                    }
                    if let Some(sub) = self.properties.get(&k) {
                        if let Some(child) = m.get_mut(&k) {
                            sub.prune(child, &p, false, pruned);
                        }
                    } else if let Some(add) = &self.additional {
                        if let Some(child) = m.get_mut(&k) {
                            add.prune(child, &p, false, pruned);
                        }
                    } else if !self.keeps_unknown() {
                        m.remove(&k);
                        pruned.push(p);
                    }
                }
            }
            Value::Array(items) => {
                if let Some(item_schema) = &self.items {
                    for (i, item) in items.iter_mut().enumerate() {
                        item_schema.prune(item, &format!("{path}[{i}]"), false, pruned);
                    }
                }
            }
            _ => {}
        }
    }

    fn default_into(&self, v: &mut Value) {
        match v {
            Value::Object(m) => {
                for (k, sub) in &self.properties {
                    let absent = match m.get(k) {
                        None => true,
                        Some(Value::Null) => !sub.nullable,
                        Some(_) => false,
                    };
                    if absent {
                        match &sub.default {
                            Some(d) => {
                                m.insert(k.clone(), d.clone());
                            }
                            // kube drops nulls of non-nullable fields without a
                            // default, so they read as absent (`Required value`
                            // rather than a type error).
                            None => {
                                m.remove(k);
                            }
                        }
                    }
                    if let Some(child) = m.get_mut(k) {
                        sub.default_into(child);
                    }
                }
                if let Some(add) = &self.additional {
                    if !add.nullable {
                        m.retain(|k, v| self.properties.contains_key(k) || !v.is_null());
                    }
                    for (k, child) in m.iter_mut() {
                        if !self.properties.contains_key(k) {
                            add.default_into(child);
                        }
                    }
                }
            }
            Value::Array(items) => {
                if let Some(item_schema) = &self.items {
                    for item in items.iter_mut() {
                        item_schema.default_into(item);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Checks the string formats kube validates for custom resources; other
/// formats are accepted as kube ignores them.
fn format_ok(format: &str, s: &str) -> bool {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    match format {
        "date-time" | "datetime" => {
            chrono::DateTime::parse_from_rfc3339(s).is_ok()
                || chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f").is_ok()
        }
        "date" => chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok(),
        "uuid" | "uuid3" | "uuid4" | "uuid5" => uuid::Uuid::try_parse(s).is_ok(),
        "byte" => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(s).is_ok()
        }
        "ipv4" => s.parse::<Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<Ipv6Addr>().is_ok(),
        "cidr" => s.split_once('/').is_some_and(|(ip, bits)| {
            match (ip.parse::<IpAddr>(), bits.parse::<u8>()) {
                (Ok(IpAddr::V4(_)), Ok(b)) => b <= 32,
                (Ok(IpAddr::V6(_)), Ok(b)) => b <= 128,
                _ => false,
            }
        }),
        _ => true,
    }
}

fn prune_object_meta(meta: &mut Map<String, Value>, path: &str, pruned: &mut Vec<String>) {
    let keys: Vec<String> = meta.keys().cloned().collect();
    for k in keys {
        if !OBJECT_META_FIELDS.contains(&k.as_str()) {
            meta.remove(&k);
            pruned.push(child_path(path, &k));
        }
    }
}

fn type_cause(path: &str, want: &str, actual: &str) -> Cause {
    Cause {
        reason: "FieldValueTypeInvalid".into(),
        message: format!(
            "Invalid value: {}: {path} in body must be of type {want}: {}",
            go_quote(actual),
            go_quote(actual)
        ),
        field: path.into(),
    }
}

fn too_many(path: &str, actual: u64, max: u64) -> Cause {
    let unit = if max == 1 { "item" } else { "items" };
    Cause {
        reason: "FieldValueTooMany".into(),
        message: format!("Too many: {actual}: must have at most {max} {unit}"),
        field: path.into(),
    }
}

/// The OpenAPI type name of a JSON value; integral floats count as integers, as
/// they do after kube's JSON decoding.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
        Value::Number(n) => {
            let integral = n.is_i64()
                || n.is_u64()
                || n.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.abs() < 9.0e15);
            if integral {
                "integer"
            } else {
                "number"
            }
        }
    }
}

/// Equality where `1` and `1.0` are the same number.
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| json_equal(p, q)))
        }
        _ => a == b,
    }
}

/// Go's `%q` for a string.
pub(crate) use crproxy_core::go_text::quoted as go_quote;

/// Go's `%v` for a float64: integral values print without a fraction.
pub(crate) fn go_float(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e21 {
        format!("{}", f as i128)
    } else {
        format!("{f}")
    }
}

/// How kube's field errors print a bad value: numbers and booleans plain,
/// strings quoted, anything else as JSON.
pub(crate) fn go_value(v: &Value) -> String {
    match v {
        Value::String(s) => go_quote(s),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.to_string()
            } else if let Some(u) = n.as_u64() {
                u.to_string()
            } else {
                go_float(n.as_f64().unwrap_or(0.0))
            }
        }
        Value::Bool(b) => b.to_string(),
        other => other.to_string(),
    }
}

mod cel;
pub mod objectmeta;

#[cfg(test)]
mod tests;
