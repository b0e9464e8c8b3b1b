//! Patch semantics: JSON merge patch, JSON patch, strategic merge patch, and
//! server-side apply with `metadata.managedFields` bookkeeping.
//!
//! Everything here is pure: the REST layer reads the live object, calls one of
//! these functions, then validates and stores the result.
//!
//! Field ownership follows kube's structured-merge-diff closely enough for
//! kubectl (`apply --server-side`, `label`, `annotate`, `patch`) and for leader
//! election clients that apply Leases:
//! * a field set is a set of paths (`.spec.replicas`, `.metadata.finalizers[=..]`,
//!   `.spec.containers[name="c"]`), encoded as kube's `FieldsV1`;
//! * Update operations own what they changed (added or modified), taking it away
//!   from other managers without conflict;
//! * Apply operations own what their configuration sets, conflict with other
//!   managers whose fields they would change, and remove fields they applied
//!   before but no longer apply unless someone else owns them.
//!
//! Lists need a schema to know whether they are atomic, sets or keyed maps. This
//! module has no schema, so it uses kube's list types for the built-in fields
//! that matter (finalizers, ownerReferences, containers, ports, env, volumes,
//! conditions of built-ins) and treats every other list as atomic, which is also
//! what a CRD list without `x-kubernetes-list-type` is.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use crate::schema::{go_quote, StructuralSchema};

/// Why a patch or an apply could not be carried out.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatchError {
    /// The patch document itself is malformed (not a JSON patch array, a
    /// directive with the wrong type, ...). Answer 400 BadRequest with this text.
    #[error("{0}")]
    Malformed(String),
    /// A JSON patch operation could not be applied (including a failing `test`).
    /// kube answers a bare 422 (see [`PatchError::status`]).
    #[error("json patch operation failed: {0}")]
    OperationFailed(String),
}

impl PatchError {
    /// The Status kube-apiserver answers for this error.
    pub fn status(&self) -> Value {
        match self {
            PatchError::Malformed(msg) => json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": msg, "reason": "BadRequest", "code": 400,
            }),
            // kube passes no server message here, so the body carries only the
            // generic text and empty details (reference 033).
            PatchError::OperationFailed(_) => json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "the server rejected our request due to an error in our request",
                "reason": "Invalid", "details": {}, "code": 422,
            }),
        }
    }
}

/// Applies an RFC 7386 JSON merge patch (`application/merge-patch+json`).
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// Applies an RFC 6902 JSON patch (`application/json-patch+json`). The target is
/// left untouched when any operation fails.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| PatchError::Malformed(format!("invalid JSON patch: {e}")))?;
    // Work on a copy instead of using the crate's undo-on-failure: undoing a
    // `move` into its own parent hits an `unreachable!` in json-patch 4.2, and
    // the operations come straight from clients. The panic guard covers any
    // other such path.
    let mut work = target.clone();
    let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        json_patch::patch_unsafe(&mut work, &ops.0)
    }));
    match applied {
        Ok(Ok(())) => {
            *target = work;
            Ok(())
        }
        Ok(Err(e)) => Err(PatchError::OperationFailed(e.to_string())),
        Err(_) => Err(PatchError::OperationFailed(
            "the patch could not be applied".into(),
        )),
    }
}

/// How a list is merged and tracked.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ListType {
    /// Replaced as a whole and owned as one field.
    Atomic,
    /// A set of scalars (`finalizers`).
    Set,
    /// A list of objects identified by these keys (`containers` by `name`).
    Map(Vec<String>),
}

/// Whether `api_version` belongs to a built-in API group (core, `apps`,
/// `*.k8s.io`), whose list types this module knows.
fn is_builtin(api_version: &str) -> bool {
    match api_version.split_once('/') {
        None => true,
        Some((group, _)) => !group.contains('.') || group.ends_with(".k8s.io"),
    }
}

/// The list type of the list at `fields` (field names from the root, list
/// positions left out).
fn keys(k: &[&str]) -> ListType {
    ListType::Map(k.iter().map(|s| s.to_string()).collect())
}

fn list_type(fields: &[&str], builtin: bool, kind: &str) -> ListType {
    match fields {
        ["metadata", "finalizers"] => return ListType::Set,
        ["metadata", "ownerReferences"] => return keys(&["uid"]),
        _ => {}
    }
    if !builtin {
        return ListType::Atomic;
    }
    let last = fields.last().copied().unwrap_or("");
    let parent = if fields.len() >= 2 {
        fields[fields.len() - 2]
    } else {
        ""
    };
    match last {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "imagePullSecrets" => keys(&["name"]),
        "env" if parent.ends_with("ontainers") => keys(&["name"]),
        "volumeMounts" => keys(&["mountPath"]),
        "conditions" => keys(&["type"]),
        "ports" if parent.ends_with("ontainers") => keys(&["containerPort", "protocol"]),
        "ports" if kind == "Service" && fields == ["spec", "ports"] => keys(&["port", "protocol"]),
        _ => ListType::Atomic,
    }
}

/// The merge key strategic merge patch uses for a list (its patchMergeKey).
fn smp_list(fields: &[&str], kind: &str) -> ListType {
    match list_type(fields, true, kind) {
        // SMP merges these by a single key.
        ListType::Map(keys) if keys.len() > 1 => ListType::Map(keys[..1].to_vec()),
        other => other,
    }
}

/// Applies a strategic merge patch (`application/strategic-merge-patch+json`) to
/// a built-in object of kind `kind`: a merge patch in which known lists merge by
/// key (`containers` by name, Service `ports` by port, `finalizers` as a set,
/// `ownerReferences` by uid) and the directives `$patch: replace|delete|merge`,
/// `$deleteFromPrimitiveList/<f>` and `$setElementOrder/<f>` are honoured
/// (`$retainKeys` is accepted and ignored).
pub fn strategic_merge_patch(
    target: &mut Value,
    patch: &Value,
    kind: &str,
) -> Result<(), PatchError> {
    if !patch.is_object() {
        return Err(PatchError::Malformed(
            "strategic merge patch must be a JSON object".into(),
        ));
    }
    let mut path = Vec::new();
    if smp_object(target, patch, &mut path, kind)? {
        *target = Value::Object(Map::new());
    }
    Ok(())
}

/// Merges `patch` into `target`; returns true when the patch asks to delete the
/// whole object (`$patch: delete`).
fn smp_object(
    target: &mut Value,
    patch: &Value,
    path: &mut Vec<String>,
    kind: &str,
) -> Result<bool, PatchError> {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return Ok(false);
    };
    match p.get("$patch").map(|v| v.as_str()) {
        None | Some(Some("merge")) => {}
        Some(Some("delete")) => return Ok(true),
        Some(Some("replace")) => {
            let mut clean = p.clone();
            clean.remove("$patch");
            *target = Value::Object(clean);
            return Ok(false);
        }
        Some(other) => {
            return Err(PatchError::Malformed(format!(
                "unknown patch type: {}",
                other.map_or_else(|| "non-string".to_string(), |s| s.to_string())
            )))
        }
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return Ok(false);
    };
    for (k, v) in p {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let remove = v
                .as_array()
                .ok_or_else(|| PatchError::Malformed(format!("{k} must be a list")))?;
            if let Some(Value::Array(list)) = t.get_mut(field) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        path.push(k.clone());
        let result = match v {
            Value::Object(_) => {
                let slot = t.entry(k.clone()).or_insert(Value::Null);
                if smp_object(slot, v, path, kind)? {
                    t.remove(k);
                }
                Ok(())
            }
            Value::Array(items) => {
                let fields: Vec<&str> = path.iter().map(String::as_str).collect();
                let lt = smp_list(&fields, kind);
                let slot = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                smp_list_merge(slot, items, lt, path, kind)
            }
            _ => {
                t.insert(k.clone(), v.clone());
                Ok(())
            }
        };
        path.pop();
        result?;
    }
    Ok(false)
}

fn smp_list_merge(
    target: &mut Value,
    items: &[Value],
    lt: ListType,
    path: &mut Vec<String>,
    kind: &str,
) -> Result<(), PatchError> {
    // `{"$patch": "replace"}` as an element replaces the whole list.
    let replace = items
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"));
    let plain: Vec<Value> = items
        .iter()
        .filter(|i| i.get("$patch").and_then(Value::as_str) != Some("replace"))
        .cloned()
        .collect();
    if replace || !target.is_array() || lt == ListType::Atomic {
        *target = Value::Array(plain);
        return Ok(());
    }
    let Value::Array(list) = target else {
        return Ok(());
    };
    match lt {
        ListType::Atomic => {}
        ListType::Set => {
            for item in plain {
                if !list.contains(&item) {
                    list.push(item);
                }
            }
        }
        ListType::Map(keys) => {
            let Some(key) = keys.first().map(String::as_str) else {
                *target = Value::Array(plain);
                return Ok(());
            };
            for item in plain {
                let Some(kv) = item.get(key).cloned() else {
                    return Err(PatchError::Malformed(format!(
                        "map: {item} does not contain declared merge key: {key}"
                    )));
                };
                let pos = list.iter().position(|e| e.get(key) == Some(&kv));
                let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(i), true) => {
                        list.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => {
                        if smp_object(&mut list[i], &item, path, kind)? {
                            list.remove(i);
                        }
                    }
                    (None, false) => {
                        let mut fresh = Value::Object(Map::new());
                        if !smp_object(&mut fresh, &item, path, kind)? {
                            list.push(fresh);
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Field sets
// ---------------------------------------------------------------------------

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Pe {
    /// `f:<name>`, printed `.name`.
    Field(String),
    /// `k:{"name":"c"}` (canonical compact JSON with sorted keys), printed `[name="c"]`.
    Key(String),
    /// `v:<json>`, printed `[=<json>]`.
    Value(String),
    /// `i:<n>`, printed `[n]`.
    Index(usize),
}

type FPath = Vec<Pe>;
type FieldSet = BTreeSet<FPath>;

impl Pe {
    fn encode(&self) -> String {
        match self {
            Pe::Field(f) => format!("f:{f}"),
            Pe::Key(k) => format!("k:{k}"),
            Pe::Value(v) => format!("v:{v}"),
            Pe::Index(i) => format!("i:{i}"),
        }
    }

    fn decode(s: &str) -> Option<Pe> {
        let (prefix, rest) = s.split_at_checked(2)?;
        match prefix {
            "f:" => Some(Pe::Field(rest.to_string())),
            "k:" => {
                // Re-serialize so key order is canonical.
                let v: Value = serde_json::from_str(rest).ok()?;
                v.is_object().then(|| Pe::Key(v.to_string()))
            }
            "v:" => {
                let v: Value = serde_json::from_str(rest).ok()?;
                Some(Pe::Value(v.to_string()))
            }
            "i:" => rest.parse().ok().map(Pe::Index),
            _ => None,
        }
    }

    fn display(&self) -> String {
        match self {
            Pe::Field(f) => format!(".{f}"),
            Pe::Key(k) => {
                let parts: Vec<String> = serde_json::from_str::<Map<String, Value>>(k)
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
                    .unwrap_or_default();
                format!("[{}]", parts.join(","))
            }
            Pe::Value(v) => format!("[={v}]"),
            Pe::Index(i) => format!("[{i}]"),
        }
    }
}

fn display_path(p: &FPath) -> String {
    p.iter().map(Pe::display).collect()
}

/// Encodes a field set as kube's `FieldsV1` JSON.
fn encode_set(set: &FieldSet) -> Value {
    #[derive(Default)]
    struct Node {
        member: bool,
        children: BTreeMap<String, Node>,
    }
    let mut root = Node::default();
    for path in set {
        let mut n = &mut root;
        for pe in path {
            n = n.children.entry(pe.encode()).or_default();
        }
        n.member = true;
    }
    fn to_json(n: &Node) -> Value {
        let mut m = Map::new();
        if n.member && !n.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, c) in &n.children {
            m.insert(k.clone(), to_json(c));
        }
        Value::Object(m)
    }
    to_json(&root)
}

/// Decodes kube's `FieldsV1` JSON into a field set; unknown keys are skipped.
fn decode_set(v: &Value) -> FieldSet {
    fn walk(v: &Value, path: &mut FPath, out: &mut FieldSet) {
        let Some(m) = v.as_object() else { return };
        if m.is_empty() && !path.is_empty() {
            out.insert(path.clone());
            return;
        }
        for (k, c) in m {
            if k == "." {
                if !path.is_empty() {
                    out.insert(path.clone());
                }
                continue;
            }
            if let Some(pe) = Pe::decode(k) {
                path.push(pe);
                walk(c, path, out);
                path.pop();
            }
        }
    }
    let mut out = FieldSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// metadata members that no manager ever owns (the server sets them).
const STRIPPED_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "managedFields",
];

/// Whether the child `k` of the node at `path` is left out of field tracking.
fn stripped(path: &FPath, k: &str) -> bool {
    match path.as_slice() {
        [] => k == "apiVersion" || k == "kind",
        [Pe::Field(m)] if m == "metadata" => STRIPPED_META.contains(&k),
        _ => false,
    }
}

fn field_names(path: &FPath) -> Vec<&str> {
    path.iter()
        .filter_map(|pe| match pe {
            Pe::Field(f) => Some(f.as_str()),
            _ => None,
        })
        .collect()
}

/// The path element of a list item: its value in a set, its keys in a keyed
/// list (its position when it has none of them), its position otherwise.
fn item_pe(lt: &ListType, item: &Value, index: usize) -> Pe {
    match lt {
        ListType::Set => Pe::Value(item.to_string()),
        ListType::Map(keys) => {
            let mut k = Map::new();
            for key in keys {
                if let Some(v) = item.get(key.as_str()) {
                    k.insert(key.clone(), v.clone());
                }
            }
            if k.is_empty() {
                Pe::Index(index)
            } else {
                Pe::Key(Value::Object(k).to_string())
            }
        }
        ListType::Atomic => Pe::Index(index),
    }
}

/// Context for walking objects: which list types apply.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    builtin: bool,
    kind: &'a str,
    schema: Option<&'a StructuralSchema>,
}

impl Ctx<'_> {
    fn of<'a>(
        obj: &'a Value,
        api_version: &'a str,
        schema: Option<&'a StructuralSchema>,
    ) -> Ctx<'a> {
        let av = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or(api_version);
        Ctx {
            builtin: is_builtin(av),
            kind: obj.get("kind").and_then(Value::as_str).unwrap_or(""),
            schema,
        }
    }

    fn list_type(&self, path: &FPath) -> ListType {
        let fields = field_names(path);
        if fields.first() != Some(&"metadata") {
            if let Some((t, k)) = self.schema.and_then(|s| s.list_type(&fields)) {
                return match t {
                    "set" => ListType::Set,
                    "map" if !k.is_empty() => ListType::Map(k.to_vec()),
                    _ => ListType::Atomic,
                };
            }
        }
        list_type(&fields, self.builtin, self.kind)
    }
}

/// The set an applied configuration claims: every scalar, every list item,
/// every atomic list, and every map that is empty or null.
fn applied_set(v: &Value, ctx: Ctx) -> FieldSet {
    fn walk(v: &Value, path: &mut FPath, ctx: Ctx, out: &mut FieldSet) {
        match v {
            Value::Object(m) => {
                for (k, c) in m {
                    if stripped(path, k) {
                        continue;
                    }
                    let is_meta = path.is_empty() && k == "metadata";
                    path.push(Pe::Field(k.clone()));
                    if !is_meta && (c.is_null() || c.as_object().is_some_and(Map::is_empty)) {
                        out.insert(path.clone());
                    }
                    walk(c, path, ctx, out);
                    path.pop();
                }
            }
            Value::Array(items) => {
                let lt = ctx.list_type(path);
                if lt == ListType::Atomic {
                    out.insert(path.clone());
                    return;
                }
                for (i, item) in items.iter().enumerate() {
                    path.push(item_pe(&lt, item, i));
                    out.insert(path.clone());
                    if lt != ListType::Set {
                        walk(item, path, ctx, out);
                    }
                    path.pop();
                }
            }
            _ => {
                if !path.is_empty() {
                    out.insert(path.clone());
                }
            }
        }
    }
    let mut out = FieldSet::new();
    walk(v, &mut Vec::new(), ctx, &mut out);
    out
}

/// A node of a flattened object: a leaf value or a container (map, keyed list).
#[derive(Debug, PartialEq)]
enum Flat<'a> {
    Leaf(&'a Value),
    Container,
}

fn flatten<'a>(v: &'a Value, ctx: Ctx) -> BTreeMap<FPath, Flat<'a>> {
    fn walk<'a>(v: &'a Value, path: &mut FPath, ctx: Ctx, out: &mut BTreeMap<FPath, Flat<'a>>) {
        let is_meta = matches!(path.as_slice(), [Pe::Field(m)] if m == "metadata");
        match v {
            Value::Object(m) => {
                if !path.is_empty() && !is_meta {
                    out.insert(path.clone(), Flat::Container);
                }
                for (k, c) in m {
                    if stripped(path, k) {
                        continue;
                    }
                    path.push(Pe::Field(k.clone()));
                    walk(c, path, ctx, out);
                    path.pop();
                }
            }
            Value::Array(items) => {
                let lt = ctx.list_type(path);
                if lt == ListType::Atomic {
                    out.insert(path.clone(), Flat::Leaf(v));
                    return;
                }
                out.insert(path.clone(), Flat::Container);
                for (i, item) in items.iter().enumerate() {
                    path.push(item_pe(&lt, item, i));
                    if lt == ListType::Set || !item.is_object() {
                        out.insert(path.clone(), Flat::Leaf(item));
                    } else {
                        walk(item, path, ctx, out);
                    }
                    path.pop();
                }
            }
            _ => {
                if !path.is_empty() {
                    out.insert(path.clone(), Flat::Leaf(v));
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(v, &mut Vec::new(), ctx, &mut out);
    out
}

/// What changed between two objects, as field sets.
#[derive(Debug, Default)]
struct Comparison {
    added: FieldSet,
    modified: FieldSet,
    removed: FieldSet,
}

fn compare(old: &Value, new: &Value, ctx: Ctx) -> Comparison {
    let a = flatten(old, ctx);
    let b = flatten(new, ctx);
    let mut c = Comparison::default();
    for (p, nb) in &b {
        match a.get(p) {
            None => {
                c.added.insert(p.clone());
            }
            Some(na) => {
                let same = match (na, nb) {
                    (Flat::Container, Flat::Container) => true,
                    (Flat::Leaf(x), Flat::Leaf(y)) => x == y,
                    _ => false,
                };
                if !same {
                    c.modified.insert(p.clone());
                }
            }
        }
    }
    for p in a.keys() {
        if !b.contains_key(p) {
            c.removed.insert(p.clone());
        }
    }
    c
}

// ---------------------------------------------------------------------------
// managedFields entries
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: Option<String>,
    subresource: Option<String>,
    set: FieldSet,
}

impl Entry {
    /// kube's manager identity: Apply entries are one per manager (and
    /// subresource) whatever the version; Update entries also per apiVersion.
    fn same_identity(
        &self,
        manager: &str,
        operation: &str,
        api_version: &str,
        sub: Option<&str>,
    ) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == sub
            && (operation == "Apply" || self.api_version == api_version)
    }

    /// How conflicts name this manager: `"m"`, `"m" with subresource "s"`,
    /// `... using <apiVersion>` for Update managers.
    fn describe(&self) -> String {
        let mut s = go_quote(&self.manager);
        if let Some(sub) = &self.subresource {
            s.push_str(&format!(" with subresource {}", go_quote(sub)));
        }
        if self.operation == "Update" {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }

    /// kube sorts managers by their JSON-encoded identity; this key orders the
    /// same way for the names that occur in practice.
    fn identity_key(&self) -> String {
        // Field order of kube's ManagedFieldsEntry encoding.
        let mut key = format!(
            "{{\"manager\":{},\"operation\":{}",
            go_quote(&self.manager),
            go_quote(&self.operation)
        );
        if self.operation != "Apply" {
            key.push_str(&format!(",\"apiVersion\":{}", go_quote(&self.api_version)));
        }
        if let Some(s) = &self.subresource {
            key.push_str(&format!(",\"subresource\":{}", go_quote(s)));
        }
        key.push('}');
        key
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), json!(self.manager));
        m.insert("operation".into(), json!(self.operation));
        m.insert("apiVersion".into(), json!(self.api_version));
        if let Some(t) = &self.time {
            m.insert("time".into(), json!(t));
        }
        m.insert("fieldsType".into(), json!("FieldsV1"));
        m.insert("fieldsV1".into(), encode_set(&self.set));
        if let Some(s) = &self.subresource {
            m.insert("subresource".into(), json!(s));
        }
        Value::Object(m)
    }
}

fn decode_entries(obj: Option<&Value>) -> Vec<Entry> {
    let Some(list) = obj
        .and_then(|o| o.pointer("/metadata/managedFields"))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
            Some(Entry {
                manager: s("manager").unwrap_or_default(),
                operation: s("operation")?,
                api_version: s("apiVersion").unwrap_or_default(),
                time: s("time"),
                subresource: s("subresource").filter(|x| !x.is_empty()),
                set: e.get("fieldsV1").map(decode_set).unwrap_or_default(),
            })
        })
        .collect()
}

/// Writes `entries` into `obj.metadata.managedFields` in kube's order:
/// Apply before Update, then by time (entries without time first), manager,
/// apiVersion and subresource. Empty sets are dropped.
fn store_entries(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.set.is_empty());
    entries.sort_by(|a, b| {
        a.operation
            .cmp(&b.operation)
            .then_with(|| time_secs(&a.time).cmp(&time_secs(&b.time)))
            .then_with(|| a.manager.cmp(&b.manager))
            .then_with(|| a.api_version.cmp(&b.api_version))
            .then_with(|| a.subresource.cmp(&b.subresource))
    });
    let list: Vec<Value> = entries.iter().map(Entry::to_json).collect();
    if !obj.is_object() {
        *obj = json!({});
    }
    let Some(o) = obj.as_object_mut() else { return };
    let meta = o.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    if let Some(m) = meta.as_object_mut() {
        if list.is_empty() {
            m.remove("managedFields");
        } else {
            m.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Seconds since the epoch of an RFC 3339 time (0 when absent), the
/// granularity kube compares managedFields times at.
fn time_secs(t: &Option<String>) -> i64 {
    t.as_deref()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
        .map_or(0, |d| d.timestamp())
}

fn without_managed_fields(v: &Value) -> Value {
    let mut c = v.clone();
    if let Some(m) = c.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    c
}

/// Records a non-apply write (create, update, patch) in `new`'s managedFields.
///
/// * `old` is the stored object before the write (`None` for a create).
/// * `new` is the object about to be stored. When the client sent non-empty
///   `managedFields` on a main-resource write, those are taken as the starting
///   point, as kube does; otherwise `old`'s are.
/// * `manager` is the `fieldManager` query parameter or, without it, the
///   program name of the User-Agent (`reference-recorder` for
///   `reference-recorder/1.0`); `operation` is `"Update"`.
/// * For `/status` writes pass `new` with the spec already restored from `old`
///   (kube resets it before tracking) but the request's metadata: kube then
///   credits label changes to the status manager even though it drops them.
/// * `/scale` entries carry no `time` (kube loses it converting through Scale).
pub fn update_managed_fields(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    operation: &str,
    api_version: &str,
    subresource: Option<&str>,
    now: &str,
) {
    update_managed_fields_with(
        old,
        new,
        &UpdateOptions {
            manager,
            operation,
            api_version,
            subresource,
            now,
            schema: None,
        },
    );
}

/// The parameters of [`update_managed_fields_with`].
#[derive(Clone, Copy, Debug)]
pub struct UpdateOptions<'a> {
    pub manager: &'a str,
    /// `"Update"`.
    pub operation: &'a str,
    pub api_version: &'a str,
    pub subresource: Option<&'a str>,
    /// RFC 3339 time of the write.
    pub now: &'a str,
    /// The custom resource's schema, whose `x-kubernetes-list-type`s decide how
    /// lists are tracked (atomic when absent).
    pub schema: Option<&'a StructuralSchema>,
}

/// [`update_managed_fields`] with a schema for list types.
pub fn update_managed_fields_with(old: Option<&Value>, new: &mut Value, o: &UpdateOptions) {
    let UpdateOptions {
        manager,
        operation,
        api_version,
        subresource,
        now,
        schema,
    } = *o;
    let ctx = Ctx::of(new, api_version, schema);
    let sent = decode_entries(Some(new));
    let mut entries = if !sent.is_empty() && subresource.is_none() {
        sent
    } else {
        decode_entries(old)
    };
    let empty = json!({});
    let old_plain = old.map(without_managed_fields).unwrap_or(empty);
    let new_plain = without_managed_fields(new);
    let cmp = compare(&old_plain, &new_plain, ctx);
    let mut changed: FieldSet = cmp.added.union(&cmp.modified).cloned().collect();
    if ctx.builtin {
        // Built-in types compare against their zero value, in which the
        // `spec`/`status` structs already exist; so they are never "added".
        changed.retain(|p| !matches!(p.as_slice(), [Pe::Field(f)] if f == "spec" || f == "status"));
    }

    for e in entries.iter_mut() {
        e.set
            .retain(|p| !changed.contains(p) && !cmp.removed.contains(p));
    }
    if !changed.is_empty() {
        let time = if subresource == Some("scale") {
            None
        } else {
            Some(now.to_string())
        };
        match entries
            .iter_mut()
            .find(|e| e.same_identity(manager, operation, api_version, subresource))
        {
            Some(e) => {
                e.set.extend(changed);
                e.time = time;
            }
            None => entries.push(Entry {
                manager: manager.into(),
                operation: operation.into(),
                api_version: api_version.into(),
                time,
                subresource: subresource.map(str::to_string),
                set: changed,
            }),
        }
    }
    store_entries(new, entries);
}

/// The program name kube derives a default field manager from:
/// `kubectl/v1.32.0 (linux/amd64) kubernetes/abc` → `kubectl`.
pub fn manager_from_user_agent(user_agent: &str) -> String {
    let first = user_agent.split('/').next().unwrap_or("");
    // kube keeps at most 128 characters and only printable ones.
    first
        .chars()
        .filter(|c| !c.is_control())
        .take(128)
        .collect()
}

// ---------------------------------------------------------------------------
// Server-side apply
// ---------------------------------------------------------------------------

/// A field another manager owns that an apply would change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// How kube names the owner: `"test"`, or
    /// `"reference-recorder" using coordination.k8s.io/v1` for an Update manager.
    pub manager: String,
    /// The field, dotted with a leading dot: `.spec.replicas`.
    pub field: String,
    sort_key: String,
}

/// Why a server-side apply failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApplyError {
    /// Fields owned by other managers would change; answer 409 with
    /// [`apply_conflict_status`], or retry with `force=true` to take them over.
    #[error("apply failed with {} conflict(s)", .0.len())]
    Conflicts(Vec<Conflict>),
    /// The applied configuration is not a JSON object. Answer 400.
    #[error("the applied configuration must be an object")]
    NotAnObject,
}

/// The 409 Status for apply conflicts, with kube's one-line message for a single
/// conflict and its grouped multi-line message for several.
pub fn apply_conflict_status(conflicts: &[Conflict]) -> Value {
    let message = if conflicts.len() == 1 {
        format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            conflicts[0].manager, conflicts[0].field
        )
    } else {
        let mut groups: BTreeMap<&str, (&str, Vec<&str>)> = BTreeMap::new();
        for c in conflicts {
            groups
                .entry(c.sort_key.as_str())
                .or_insert((c.manager.as_str(), Vec::new()))
                .1
                .push(c.field.as_str());
        }
        let mut lines = Vec::new();
        for (manager, fields) in groups.values() {
            lines.push(format!("conflicts with {manager}:"));
            lines.extend(fields.iter().map(|f| format!("- {f}")));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| {
            json!({
                "reason": "FieldManagerConflict",
                "message": format!("conflict with {}", c.manager),
                "field": c.field,
            })
        })
        .collect();
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": "Conflict",
        "details": {"causes": causes}, "code": 409,
    })
}

/// Server-side apply (`application/apply-patch+yaml`, already parsed to JSON).
///
/// Returns the object to store, with managedFields updated. When the result
/// equals `live` the apply was a no-op: do not write or bump resourceVersion.
/// Call this before checking a `metadata.resourceVersion` the configuration
/// carries: kube reports field conflicts first (reference 138) and the stale
/// version only once conflicts are forced (139). The returned object keeps the
/// configuration's `metadata.resourceVersion` for that check.
///
/// For resources with a status subresource, reset what the endpoint may not
/// change before calling (drop `status` from a main-resource configuration,
/// everything but `status` and metadata from a `/status` one), as kube's
/// strategies do; otherwise the ignored part would be owned and merged.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    subresource: Option<&str>,
    now: &str,
) -> Result<Value, ApplyError> {
    apply_with(
        live,
        applied,
        &ApplyOptions {
            manager,
            force,
            api_version,
            subresource,
            now,
            schema: None,
        },
    )
}

/// The parameters of [`apply_with`].
#[derive(Clone, Copy, Debug)]
pub struct ApplyOptions<'a> {
    pub manager: &'a str,
    /// `force=true`: take over conflicting fields instead of failing.
    pub force: bool,
    pub api_version: &'a str,
    pub subresource: Option<&'a str>,
    /// RFC 3339 time of the write.
    pub now: &'a str,
    /// The custom resource's schema, whose `x-kubernetes-list-type`s decide how
    /// lists merge and are owned (atomic when absent).
    pub schema: Option<&'a StructuralSchema>,
}

/// [`apply`] with a schema for list types.
pub fn apply_with(
    live: Option<&Value>,
    applied: &Value,
    o: &ApplyOptions,
) -> Result<Value, ApplyError> {
    let ApplyOptions {
        manager,
        force,
        api_version,
        subresource,
        now,
        schema,
    } = *o;
    if !applied.is_object() {
        return Err(ApplyError::NotAnObject);
    }
    let config = without_managed_fields(applied);
    let ctx = Ctx::of(&config, api_version, schema);
    let live_plain = live
        .map(without_managed_fields)
        .unwrap_or_else(|| json!({}));
    let mut entries = decode_entries(live);
    let set = applied_set(&config, ctx);

    let own = entries
        .iter()
        .position(|e| e.same_identity(manager, "Apply", api_version, subresource));
    let last_set = own.map(|i| entries[i].set.clone()).unwrap_or_default();

    let mut merged = live_plain.clone();
    merge_apply(&mut merged, &config, &mut Vec::new(), ctx);

    // Fields this manager applied before and dropped now go away unless another
    // manager still owns them (or something below them).
    let others: Vec<&FieldSet> = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != own)
        .map(|(_, e)| &e.set)
        .collect();
    let mut dropped: Vec<&FPath> = last_set
        .iter()
        .filter(|p| !set.iter().any(|q| q.starts_with(p)))
        .filter(|p| !others.iter().any(|s| s.iter().any(|q| q.starts_with(p))))
        .collect();
    dropped.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in dropped {
        remove_path(&mut merged, p, ctx);
        // Parents emptied by the removal go too, unless someone claims them (kube
        // treats named parent fields of dropped fields as dropped).
        let mut parent: FPath = p[..p.len().saturating_sub(1)].to_vec();
        while parent.len() > 1 || matches!(parent.as_slice(), [Pe::Field(f)] if f != "metadata") {
            let empty = get_path(&merged, &parent, ctx)
                .is_some_and(|v| v.as_object().is_some_and(Map::is_empty));
            let claimed = set.contains(&parent) || others.iter().any(|s| s.contains(&parent));
            if !empty || claimed {
                break;
            }
            remove_path(&mut merged, &parent, ctx);
            parent.pop();
        }
    }

    let cmp = compare(&live_plain, &merged, ctx);
    let changed: FieldSet = cmp.added.union(&cmp.modified).cloned().collect();
    let mut conflicts = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if Some(i) == own {
            continue;
        }
        for p in e.set.intersection(&changed) {
            conflicts.push(Conflict {
                manager: e.describe(),
                field: display_path(p),
                sort_key: e.identity_key(),
            });
        }
    }
    if !conflicts.is_empty() && !force {
        conflicts.sort_by(|a, b| a.sort_key.cmp(&b.sort_key));
        return Err(ApplyError::Conflicts(conflicts));
    }
    for (i, e) in entries.iter_mut().enumerate() {
        if Some(i) == own {
            continue;
        }
        e.set
            .retain(|p| !changed.contains(p) && !cmp.removed.contains(p));
    }

    let noop = live.is_some() && merged == live_plain;
    match own {
        Some(i) => {
            entries[i].set = set;
            entries[i].api_version = api_version.into();
            if !noop {
                entries[i].time = Some(now.into());
            }
        }
        None => entries.push(Entry {
            manager: manager.into(),
            operation: "Apply".into(),
            api_version: api_version.into(),
            time: Some(now.into()),
            subresource: subresource.map(str::to_string),
            set,
        }),
    }
    store_entries(&mut merged, entries);
    Ok(merged)
}

/// Merges an applied configuration into the live object: maps recursively,
/// keyed lists item by item, sets as unions, everything else replaced. A null
/// in the configuration removes the field.
fn merge_apply(target: &mut Value, config: &Value, path: &mut FPath, ctx: Ctx) {
    match config {
        Value::Object(c) => {
            if !target.is_object() {
                *target = json!({});
            }
            let Some(t) = target.as_object_mut() else {
                return;
            };
            for (k, v) in c {
                if v.is_null() {
                    t.remove(k);
                    continue;
                }
                path.push(Pe::Field(k.clone()));
                merge_apply(t.entry(k.clone()).or_insert(Value::Null), v, path, ctx);
                path.pop();
            }
        }
        Value::Array(items) => {
            let lt = ctx.list_type(path);
            let Some(list) = target.as_array_mut() else {
                *target = config.clone();
                return;
            };
            match lt {
                ListType::Atomic => *target = config.clone(),
                ListType::Set => {
                    for item in items {
                        if !list.contains(item) {
                            list.push(item.clone());
                        }
                    }
                }
                ListType::Map(_) => {
                    for (i, item) in items.iter().enumerate() {
                        let pe = item_pe(&lt, item, i);
                        let pos = list
                            .iter()
                            .enumerate()
                            .position(|(j, e)| item_pe(&lt, e, j) == pe);
                        path.push(pe);
                        match pos {
                            Some(j) => merge_apply(&mut list[j], item, path, ctx),
                            None => list.push(item.clone()),
                        }
                        path.pop();
                    }
                }
            }
        }
        _ => *target = config.clone(),
    }
}

/// The node at `path`, if present.
fn get_path<'v>(obj: &'v Value, path: &FPath, ctx: Ctx) -> Option<&'v Value> {
    let mut cur = obj;
    for (i, pe) in path.iter().enumerate() {
        cur = match (pe, cur) {
            (Pe::Field(f), Value::Object(m)) => m.get(f)?,
            (pe, Value::Array(a)) => {
                let lt = ctx.list_type(&path[..i].to_vec());
                a.iter()
                    .enumerate()
                    .find(|(j, e)| &item_pe(&lt, e, *j) == pe)
                    .map(|(_, e)| e)?
            }
            _ => return None,
        };
    }
    Some(cur)
}

/// Removes the node at `path` from `obj` (no-op when absent).
fn remove_path(obj: &mut Value, path: &FPath, ctx: Ctx) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    let mut walked: FPath = Vec::new();
    for pe in parents {
        let next = match (pe, cur) {
            (Pe::Field(f), Value::Object(m)) => m.get_mut(f),
            (pe, Value::Array(a)) => {
                let lt = ctx.list_type(&walked);
                let pos = a
                    .iter()
                    .enumerate()
                    .position(|(i, e)| &item_pe(&lt, e, i) == pe);
                match pos {
                    Some(i) => a.get_mut(i),
                    None => None,
                }
            }
            _ => None,
        };
        let Some(n) = next else { return };
        walked.push(pe.clone());
        cur = n;
    }
    match (last, cur) {
        (Pe::Field(f), Value::Object(m)) => {
            m.remove(f);
        }
        (pe, Value::Array(a)) => {
            let lt = ctx.list_type(&walked);
            if let Some(i) = a
                .iter()
                .enumerate()
                .position(|(i, e)| &item_pe(&lt, e, i) == pe)
            {
                a.remove(i);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
