//! Where the request pipeline calls into the modules other helpers own (selectors,
//! schema validation, patch semantics, managedFields). Until those land, the
//! simple stand-ins here keep the server usable; each function is the one place to
//! switch over.

use super::http as h;
use super::rest::ReqCtx;
use crate::error::{ApiError, Cause};
use crate::registry::ResourceInfo;
use serde_json::{json, Value};
use std::collections::BTreeMap;

// ---------- selectors ----------

#[derive(Clone, Debug, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A label selector (stand-in until `crproxy_core::selector` is merged).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<Req>,
}

fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' || c == '/')
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector { reqs });
        }
        for part in split_top(s) {
            let part = part.trim();
            if part.is_empty() {
                return Err(format!("found '', expected: identifier in '{s}'"));
            }
            let req = if let Some(k) = part.strip_prefix('!') {
                Req::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                Req::NotEq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().to_string(), set(rest)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Req::In(k.trim().to_string(), set(rest)?)
            } else {
                Req::Exists(part.to_string())
            };
            let (key, values): (&str, Vec<&str>) = match &req {
                Req::Eq(k, v) | Req::NotEq(k, v) => (k, vec![v.as_str()]),
                Req::In(k, vs) | Req::NotIn(k, vs) => (k, vs.iter().map(String::as_str).collect()),
                Req::Exists(k) | Req::NotExists(k) => (k, vec![]),
            };
            if !valid_key(key) {
                return Err(format!(
                    "unable to parse requirement: invalid label key {key:?}"
                ));
            }
            if let Some(bad) = values.iter().find(|v| !valid_value(v)) {
                let word = bad.split_whitespace().nth(1).unwrap_or(bad);
                return Err(format!("found '{word}', expected: ',' or 'end of string'"));
            }
            reqs.push(req);
        }
        Ok(LabelSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.reqs.iter().all(|r| match r {
            Req::Eq(k, v) => labels.get(k) == Some(v),
            Req::NotEq(k, v) => labels.get(k) != Some(v),
            Req::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Req::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Req::Exists(k) => labels.contains_key(k),
            Req::NotExists(k) => !labels.contains_key(k),
        })
    }

    pub fn matches_json(&self, labels: Option<&Value>) -> bool {
        if self.reqs.is_empty() {
            return true;
        }
        let map: BTreeMap<String, String> = labels
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        self.matches(&map)
    }
}

fn set(rest: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| "unable to parse requirement: found '', expected: ',' or ')'".to_string())?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

/// Field selector terms `(field, equal?, value)`.
pub fn parse_field_selector(s: &str) -> Result<Vec<(String, bool, String)>, String> {
    let mut out = Vec::new();
    if s.trim().is_empty() {
        return Ok(out);
    }
    for part in s.split(',') {
        let part = part.trim();
        let (f, eq, v) = if let Some((f, v)) = part.split_once("!=") {
            (f, false, v)
        } else if let Some((f, v)) = part.split_once("==") {
            (f, true, v)
        } else if let Some((f, v)) = part.split_once('=') {
            (f, true, v)
        } else {
            return Err(format!(
                "invalid selector: '{s}'; can't understand '{part}'"
            ));
        };
        out.push((f.trim().to_string(), eq, v.trim().to_string()));
    }
    Ok(out)
}

// ---------- patches ----------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchKind {
    pub fn from_content_type(ct: &str, is_cr: bool) -> Result<Self, ApiError> {
        let accepted = if is_cr {
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        } else {
            "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml"
        };
        match ct {
            "application/merge-patch+json" => Ok(PatchKind::Merge),
            "application/json-patch+json" => Ok(PatchKind::Json),
            "application/strategic-merge-patch+json" if !is_cr => Ok(PatchKind::Strategic),
            "application/apply-patch+yaml" => Ok(PatchKind::Apply),
            _ => Err(ApiError::unsupported_media_type(accepted)),
        }
    }
}

fn rejected() -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
    )
    .with_empty_details()
}

/// Applies a patch body to the current object.
pub fn apply_patch(
    _ctx: &ReqCtx,
    kind: PatchKind,
    current: &Value,
    body: &[u8],
) -> Result<Value, ApiError> {
    let mut doc = current.clone();
    match kind {
        PatchKind::Merge | PatchKind::Strategic => {
            let patch: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::merge(&mut doc, &patch);
        }
        PatchKind::Json => {
            let patch: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::patch(&mut doc, &patch).map_err(|_| rejected())?;
        }
        PatchKind::Apply => {
            let applied = h::decode_yaml(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
            json_patch::merge(&mut doc, &applied);
        }
    }
    Ok(doc)
}

// ---------- defaults, validation, managedFields ----------

/// Server-side defaults that kube's built-in strategies set on create.
pub fn defaults_on_create(info: &ResourceInfo, obj: &mut Value) {
    let Some(m) = obj.as_object_mut() else { return };
    match (info.group.as_str(), info.resource.as_str()) {
        ("", "namespaces") => {
            let name = m
                .get("metadata")
                .and_then(|x| x.get("name"))
                .cloned()
                .unwrap_or(json!(""));
            if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
                let labels = meta.entry("labels").or_insert_with(|| json!({}));
                if let Some(l) = labels.as_object_mut() {
                    l.insert("kubernetes.io/metadata.name".into(), name);
                }
            }
            m.insert("spec".into(), json!({"finalizers": ["kubernetes"]}));
            m.insert("status".into(), json!({"phase": "Active"}));
        }
        ("", "secrets") => {
            m.entry("type").or_insert_with(|| json!("Opaque"));
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            crate::crd::defaults_on_create(obj);
        }
        _ => {}
    }
}

/// Validates (and prunes) an object about to be stored. Returns warnings.
pub fn validate(
    ctx: &ReqCtx,
    obj: &mut Value,
    _old: Option<&Value>,
) -> Result<Vec<String>, ApiError> {
    let info = &ctx.info;
    let name = crate::store::meta_str(obj, "name").to_string();
    let mut causes = Vec::new();
    match (info.group.as_str(), info.resource.as_str()) {
        ("coordination.k8s.io", "leases") => {
            if let Some(d) = obj
                .get("spec")
                .and_then(|s| s.get("leaseDurationSeconds"))
                .and_then(Value::as_i64)
            {
                if d <= 0 {
                    causes.push(Cause::new(
                        "FieldValueInvalid",
                        format!("Invalid value: {d}: must be greater than 0"),
                        "spec.leaseDurationSeconds",
                    ));
                }
            }
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            causes.extend(crate::crd::validate(obj));
        }
        _ => {}
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(&info.group, &info.kind, &name, causes));
    }
    Ok(Vec::new())
}

/// Records the writer in managedFields for an Update operation (stand-in: keeps
/// whatever the object had).
pub fn managed_fields_update(_ctx: &ReqCtx, _old: Option<&Value>, _new: &mut Value, _sub: &str) {}

/// Records the applier in managedFields for an apply that creates the object.
pub fn managed_fields_apply_create(_ctx: &ReqCtx, _obj: &mut Value) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors_match() {
        let labels: BTreeMap<String, String> = [("app", "cron"), ("tier", "backend")]
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let check = |sel: &str, want: bool| {
            let s = LabelSelector::parse(sel).expect(sel);
            assert_eq!(s.matches(&labels), want, "{sel}");
        };
        check("", true);
        check("app=cron", true);
        check("app==cron,tier!=frontend", true);
        check("app in (cron,other),tier notin (frontend),!env", true);
        check("app in (other)", false);
        check("env", false);
        check("!app", false);
        assert!(LabelSelector::parse("app in (cron").is_err());
        assert!(LabelSelector::parse("app=bad value!").is_err());
    }

    #[test]
    fn field_selectors_parse() {
        assert_eq!(
            parse_field_selector("metadata.name=x,metadata.namespace!=y").expect("ok"),
            vec![
                ("metadata.name".to_string(), true, "x".to_string()),
                ("metadata.namespace".to_string(), false, "y".to_string())
            ]
        );
        assert_eq!(
            parse_field_selector("metadata.name").expect_err("bad"),
            "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
        );
    }
}
