//! CustomResourceDefinitions: defaults and validation of the CRD object, the
//! [`ResourceInfo`] a CRD serves, and the status the (inline) establishing
//! controller writes: `NamesAccepted` and `Established` with `acceptedNames`.

use crate::error::Cause;
use crate::registry::{ResourceInfo, ScaleSpec, Source, VersionInfo, CR_VERBS};
use crate::schema::StructuralSchema;
use serde_json::{json, Value};

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(x) => cur = x,
            None => return "",
        }
    }
    cur.as_str().unwrap_or("")
}

fn versions(crd: &Value) -> Vec<&Value> {
    crd.get("spec")
        .and_then(|s| s.get("versions"))
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn storage_version(crd: &Value) -> String {
    versions(crd)
        .into_iter()
        .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .map(|v| s(v, &["name"]).to_string())
        .unwrap_or_default()
}

/// What the API server sets on a new CRD: conversion strategy None and an empty
/// status (`conditions: null`, as kube's POST response shows).
pub fn defaults_on_create(crd: &mut Value) {
    let storage = storage_version(crd);
    let Some(m) = crd.as_object_mut() else { return };
    if let Some(spec) = m.get_mut("spec").and_then(Value::as_object_mut) {
        spec.entry("conversion")
            .or_insert_with(|| json!({"strategy": "None"}));
    }
    m.insert(
        "status".into(),
        json!({
            "conditions": null,
            "acceptedNames": {"plural": "", "kind": ""},
            "storedVersions": [storage],
        }),
    );
}

/// Structural checks kube makes on a CRD (a subset).
pub fn validate(crd: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let name = s(crd, &["metadata", "name"]);
    let group = s(crd, &["spec", "group"]);
    let plural = s(crd, &["spec", "names", "plural"]);
    let kind = s(crd, &["spec", "names", "kind"]);
    if group.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "Required value",
            "spec.group",
        ));
    }
    if plural.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "Required value",
            "spec.names.plural",
        ));
    }
    if kind.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "Required value",
            "spec.names.kind",
        ));
    }
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause::new(
            "FieldValueInvalid",
            format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"),
            "metadata.name",
        ));
    }
    let scope = s(crd, &["spec", "scope"]);
    if scope != "Namespaced" && scope != "Cluster" {
        causes.push(Cause::new(
            "FieldValueNotSupported",
            format!("Unsupported value: {scope:?}: supported values: \"Cluster\", \"Namespaced\""),
            "spec.scope",
        ));
    }
    let vs = versions(crd);
    if vs.is_empty() {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "Invalid value: \"null\": must have exactly one version marked as storage version",
            "spec.versions",
        ));
    } else {
        let storage = vs
            .iter()
            .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
            .count();
        if storage != 1 {
            causes.push(Cause::new(
                "FieldValueInvalid",
                format!("Invalid value: \"{storage}\": must have exactly one version marked as storage version"),
                "spec.versions",
            ));
        }
    }
    for (i, v) in vs.iter().enumerate() {
        if let Some(schema) = v.get("schema").and_then(|s| s.get("openAPIV3Schema")) {
            if let Err(e) = StructuralSchema::from_json(schema) {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    format!("Invalid value: \"object\": {e}"),
                    format!("spec.versions[{i}].schema.openAPIV3Schema"),
                ));
            }
        }
    }
    causes
}

/// The resource a CRD serves (`None` when it serves no version).
pub fn resource_info(crd: &Value) -> Option<ResourceInfo> {
    let name = s(crd, &["metadata", "name"]).to_string();
    let group = s(crd, &["spec", "group"]).to_string();
    let names = crd.get("spec")?.get("names")?;
    let plural = s(names, &["plural"]).to_string();
    let kind = s(names, &["kind"]).to_string();
    if group.is_empty() || plural.is_empty() || kind.is_empty() {
        return None;
    }
    let singular = match s(names, &["singular"]) {
        "" => kind.to_lowercase(),
        x => x.to_string(),
    };
    let list_kind = match s(names, &["listKind"]) {
        "" => format!("{kind}List"),
        x => x.to_string(),
    };
    let strings = |key: &str| -> Vec<String> {
        names
            .get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut served: Vec<&Value> = versions(crd)
        .into_iter()
        .filter(|v| v.get("served").and_then(Value::as_bool) != Some(false))
        .collect();
    if served.is_empty() {
        return None;
    }
    // kube prefers versions by "version priority" (v1 > v1beta1 > v1alpha1 > other).
    served.sort_by_key(|v| version_priority(s(v, &["name"])));
    let versions = served
        .iter()
        .map(|v| {
            let vname = s(v, &["name"]).to_string();
            let deprecated = v.get("deprecated").and_then(Value::as_bool) == Some(true);
            let warning =
                deprecated.then(
                    || match v.get("deprecationWarning").and_then(Value::as_str) {
                        Some(w) => w.to_string(),
                        None => format!("{group}/{vname} {kind} is deprecated"),
                    },
                );
            let schema = v.get("schema").and_then(|s| s.get("openAPIV3Schema"));
            let structural = match schema {
                Some(s) => StructuralSchema::from_json(s).ok(),
                None => Some(StructuralSchema::preserve_all()),
            };
            // apiextensions v1 declares subresources per version (v1 has no
            // spec-level `subresources`), and kube's CRD handler serves, and its
            // strategy resets status, per version (GetSubresourcesForVersion).
            let declared = |name: &str| {
                v.get("subresources")
                    .and_then(|sub| sub.get(name))
                    .filter(|x| !x.is_null())
            };
            let scale = declared("scale").map(|sc| ScaleSpec {
                spec_replicas_path: s(sc, &["specReplicasPath"]).to_string(),
                status_replicas_path: s(sc, &["statusReplicasPath"]).to_string(),
                label_selector_path: sc
                    .get("labelSelectorPath")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            });
            VersionInfo {
                status_subresource: declared("status").is_some(),
                scale,
                structural: structural.map(std::sync::Arc::new),
                name: vname,
                storage: v.get("storage").and_then(Value::as_bool) == Some(true),
                deprecation_warning: warning,
                schema: v
                    .get("schema")
                    .and_then(|s| s.get("openAPIV3Schema"))
                    .cloned(),
                printer_columns: v
                    .get("additionalPrinterColumns")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            }
        })
        .collect::<Vec<_>>();
    // kube's default deprecation text points at the preferred version.
    let preferred = versions
        .iter()
        .find(|v| v.deprecation_warning.is_none())
        .map(|v| v.name.clone());
    let versions = versions
        .into_iter()
        .map(|mut v| {
            if let (Some(w), Some(p)) = (&v.deprecation_warning, &preferred) {
                if w == &format!("{group}/{} {kind} is deprecated", v.name) {
                    v.deprecation_warning = Some(format!("{w}; use {group}/{p} {kind}"));
                }
            }
            v
        })
        .collect();
    Some(ResourceInfo {
        group,
        versions,
        resource: plural,
        singular,
        kind,
        list_kind,
        namespaced: s(crd, &["spec", "scope"]) != "Cluster",
        verbs: CR_VERBS.iter().map(|v| v.to_string()).collect(),
        short_names: strings("shortNames"),
        categories: strings("categories"),
        source: Source::Crd(name),
        has_generation: true,
        unconditional_update: false,
        extra_subresources: Vec::new(),
    })
}

/// Kubernetes version priority: GA before beta before alpha, higher numbers first,
/// then anything else alphabetically.
pub fn version_priority(v: &str) -> (u8, i64, i64, String) {
    let parse = |v: &str| -> Option<(u8, i64, i64)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let major: i64 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((0, -major, 0));
        }
        for (label, rank) in [("beta", 1u8), ("alpha", 2u8)] {
            if let Some(n) = tail.strip_prefix(label) {
                let minor: i64 = n.parse().ok()?;
                return Some((rank, -major, -minor));
            }
        }
        None
    };
    match parse(v) {
        Some((r, a, b)) => (r, a, b, String::new()),
        None => (3, 0, 0, v.to_string()),
    }
}

/// The CRD with `NamesAccepted` and `Established` true and `acceptedNames` set.
pub fn established(crd: &Value, now: &str) -> Value {
    let mut out = crd.clone();
    let names = crd
        .get("spec")
        .and_then(|s| s.get("names"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut accepted = serde_json::Map::new();
    for key in [
        "plural",
        "singular",
        "shortNames",
        "kind",
        "listKind",
        "categories",
    ] {
        if let Some(v) = names.get(key) {
            accepted.insert(key.into(), v.clone());
        }
    }
    if !accepted.contains_key("listKind") {
        accepted.insert(
            "listKind".into(),
            json!(format!("{}List", s(&names, &["kind"]))),
        );
    }
    if !accepted.contains_key("singular") {
        accepted.insert(
            "singular".into(),
            json!(s(&names, &["kind"]).to_lowercase()),
        );
    }
    let stored = crd
        .get("status")
        .and_then(|s| s.get("storedVersions"))
        .cloned()
        .unwrap_or_else(|| json!([storage_version(crd)]));
    if let Some(m) = out.as_object_mut() {
        m.insert(
            "status".into(),
            json!({
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "lastTransitionTime": now,
                     "reason": "NoConflicts", "message": "no conflicts found"},
                    {"type": "Established", "status": "True", "lastTransitionTime": now,
                     "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"},
                ],
                "acceptedNames": accepted,
                "storedVersions": stored,
            }),
        );
    }
    out
}

/// Whether the CRD's status already says Established.
pub fn is_established(crd: &Value) -> bool {
    crd.get("status")
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .any(|c| s(c, &["type"]) == "Established" && s(c, &["status"]) == "True")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crontab() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "crontabs.stable.example.io"},
            "spec": {"group": "stable.example.io", "scope": "Namespaced",
                "names": {"plural": "crontabs", "singular": "crontab", "kind": "CronTab", "shortNames": ["ct"]},
                "versions": [
                    {"name": "v1beta1", "served": true, "storage": false, "deprecated": true},
                    {"name": "v1", "served": true, "storage": true,
                     "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}},
                ]}
        })
    }

    #[test]
    fn a_crd_serves_its_resource_with_preferred_version_first() {
        let info = resource_info(&crontab()).expect("info");
        assert_eq!(info.resource, "crontabs");
        assert_eq!(info.list_kind, "CronTabList");
        assert!(info.namespaced);
        assert_eq!(info.versions[0].name, "v1");
        assert_eq!(info.storage_version(), "v1");
        // Subresources are per version: crontab()'s v1beta1 declares none.
        assert!(info.has_status("v1"));
        assert!(!info.has_status("v1beta1"));
        assert_eq!(
            info.scale("v1").map(|sc| sc.spec_replicas_path.as_str()),
            Some(".spec.replicas")
        );
        assert_eq!(info.scale("v1beta1"), None);
        assert_eq!(
            info.version("v1beta1")
                .and_then(|v| v.deprecation_warning.clone())
                .as_deref(),
            Some(
                "stable.example.io/v1beta1 CronTab is deprecated; use stable.example.io/v1 CronTab"
            )
        );
        assert_eq!(info.short_names, vec!["ct"]);
    }

    #[test]
    fn validation_and_establishing() {
        assert!(validate(&crontab()).is_empty());
        let mut bad = crontab();
        bad["metadata"]["name"] = json!("wrong");
        assert_eq!(validate(&bad)[0].field, "metadata.name");
        let mut c = crontab();
        defaults_on_create(&mut c);
        assert_eq!(c["status"]["conditions"], Value::Null);
        assert_eq!(c["status"]["storedVersions"], json!(["v1"]));
        assert!(!is_established(&c));
        let e = established(&c, "2024-01-01T00:00:00Z");
        assert!(is_established(&e));
        assert_eq!(e["status"]["acceptedNames"]["listKind"], "CronTabList");
    }

    #[test]
    fn version_priority_orders_like_kube() {
        let mut v = vec!["v1alpha1", "foo", "v2", "v1beta2", "v1", "v1beta1", "v10"];
        v.sort_by_key(|x| version_priority(x));
        assert_eq!(
            v,
            vec!["v10", "v2", "v1", "v1beta2", "v1beta1", "v1alpha1", "foo"]
        );
    }
}
