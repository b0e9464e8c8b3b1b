//! Discovery documents built from the registry: `/version`, legacy discovery
//! (`/api`, `/api/v1`, `/apis`, `/apis/<g>`, `/apis/<g>/<v>`) and aggregated
//! discovery (`apidiscovery.k8s.io` v2 and v2beta1).
//!
//! Groups served by APIServices elsewhere are passed in as [`Extra`] so that
//! aggregation can add them without this module knowing how they are found.

use crate::crd::version_priority;
use crate::registry::{Registry, ResourceInfo, Source};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Groups served by aggregated API servers, to list next to our own.
#[derive(Clone, Debug, Default)]
pub struct Extra {
    /// Legacy `APIGroup` objects.
    pub groups: Vec<Value>,
    /// Aggregated `APIGroupDiscovery` objects.
    pub discovery: Vec<Value>,
}

/// kube's built-in group order; CRD groups follow alphabetically.
const GROUP_ORDER: &[&str] = &[
    "apiregistration.k8s.io",
    "apps",
    "events.k8s.io",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "networking.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "storage.k8s.io",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "scheduling.k8s.io",
    "coordination.k8s.io",
    "node.k8s.io",
    "discovery.k8s.io",
    "flowcontrol.apiserver.k8s.io",
];

pub fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0-devcluster",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2024-12-11T00:00:00Z",
        "goVersion": "go1.23.4",
        "compiler": "gc",
        "platform": format!("{}/{}", std::env::consts::OS, arch()),
    })
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

/// group → versions (by priority) → resources.
fn grouped(registry: &Registry) -> BTreeMap<String, BTreeMap<String, Vec<Arc<ResourceInfo>>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Vec<Arc<ResourceInfo>>>> = BTreeMap::new();
    for info in registry.all() {
        for v in &info.versions {
            out.entry(info.group.clone())
                .or_default()
                .entry(v.name.clone())
                .or_default()
                .push(info.clone());
        }
    }
    out
}

fn sorted_groups(groups: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = groups.filter(|g| !g.is_empty()).collect();
    v.sort_by_key(|g| {
        (
            GROUP_ORDER
                .iter()
                .position(|x| x == g)
                .unwrap_or(GROUP_ORDER.len()),
            g.clone(),
        )
    });
    v
}

fn sorted_versions(versions: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = versions.collect();
    v.sort_by_key(|x| version_priority(x));
    v
}

fn gv(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

fn api_group(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": gv(group, v), "version": v}))
        .collect();
    json!({
        "name": group,
        "versions": vs,
        "preferredVersion": vs.first().cloned().unwrap_or(Value::Null),
    })
}

/// `/apis` (legacy `APIGroupList`).
pub fn api_group_list(registry: &Registry, extra: &Extra) -> Value {
    let all = grouped(registry);
    let mut groups: Vec<Value> = sorted_groups(all.keys().cloned())
        .into_iter()
        .map(|g| api_group(&g, &sorted_versions(all[&g].keys().cloned())))
        .collect();
    groups.extend(extra.groups.iter().cloned());
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>` (`None`: unknown group).
pub fn api_group_doc(registry: &Registry, group: &str, extra: &Extra) -> Option<Value> {
    if let Some(g) = extra
        .groups
        .iter()
        .find(|g| g.get("name").and_then(Value::as_str) == Some(group))
    {
        let mut g = g.clone();
        if let Some(m) = g.as_object_mut() {
            m.insert("kind".into(), json!("APIGroup"));
            m.insert("apiVersion".into(), json!("v1"));
        }
        return Some(g);
    }
    let all = grouped(registry);
    let versions = all.get(group)?;
    let mut doc = api_group(group, &sorted_versions(versions.keys().cloned()));
    if let Some(m) = doc.as_object_mut() {
        m.insert("kind".into(), json!("APIGroup"));
        m.insert("apiVersion".into(), json!("v1"));
    }
    // kube puts kind/apiVersion first; key order is not significant to clients.
    Some(doc)
}

/// The APIResourceList entries of `info` in `version`: the resource, then the
/// subresources that version serves (a CRD declares them per version).
fn resource_entries(info: &ResourceInfo, version: &str) -> Vec<Value> {
    let mut main = Map::new();
    main.insert("name".into(), json!(info.resource));
    main.insert("singularName".into(), json!(info.singular));
    main.insert("namespaced".into(), json!(info.namespaced));
    main.insert("kind".into(), json!(info.kind));
    main.insert("verbs".into(), json!(info.verbs));
    if !info.short_names.is_empty() {
        main.insert("shortNames".into(), json!(info.short_names));
    }
    if !info.categories.is_empty() {
        main.insert("categories".into(), json!(info.categories));
    }
    if info.source != Source::Review {
        main.insert(
            "storageVersionHash".into(),
            json!(storage_version_hash(info)),
        );
    }
    let mut out = vec![Value::Object(main)];
    if info.has_status(version) {
        out.push(json!({
            "name": format!("{}/status", info.resource), "singularName": "",
            "namespaced": info.namespaced, "kind": info.kind, "verbs": ["get", "patch", "update"],
        }));
    }
    if info.scale(version).is_some() {
        out.push(json!({
            "name": format!("{}/scale", info.resource), "singularName": "",
            "namespaced": info.namespaced, "group": "autoscaling", "version": "v1",
            "kind": "Scale", "verbs": ["get", "patch", "update"],
        }));
    }
    for (sub, kind, verbs) in &info.extra_subresources {
        out.push(json!({
            "name": format!("{}/{sub}", info.resource), "singularName": "",
            "namespaced": info.namespaced, "kind": kind, "verbs": verbs,
        }));
    }
    out
}

/// kube's `storageVersionHash`: base64 of the first 8 bytes of
/// sha256("<group>/<storage version>/<Kind>").
fn storage_version_hash(info: &ResourceInfo) -> String {
    use base64::Engine;
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!(
        "{}/{}/{}",
        info.group,
        info.storage_version(),
        info.kind
    ));
    base64::engine::general_purpose::STANDARD.encode(&digest[..8])
}

/// `/api/v1` or `/apis/<g>/<v>` (`None`: not served).
pub fn api_resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let all = grouped(registry);
    let infos = all.get(group)?.get(version)?;
    let resources: Vec<Value> = infos
        .iter()
        .flat_map(|i| resource_entries(i, version))
        .collect();
    Some(if group.is_empty() {
        json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources})
    } else {
        json!({
            "kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": gv(group, version), "resources": resources,
        })
    })
}

fn discovery_resource(info: &ResourceInfo, version: &str) -> Value {
    let response_kind = match info.source {
        Source::Crd(_) => json!({"group": info.group, "version": version, "kind": info.kind}),
        _ => json!({"group": "", "version": "", "kind": info.kind}),
    };
    let mut m = Map::new();
    m.insert("resource".into(), json!(info.resource));
    m.insert("responseKind".into(), response_kind.clone());
    m.insert(
        "scope".into(),
        json!(if info.namespaced {
            "Namespaced"
        } else {
            "Cluster"
        }),
    );
    m.insert("singularResource".into(), json!(info.singular));
    m.insert("verbs".into(), json!(info.verbs));
    if !info.short_names.is_empty() {
        m.insert("shortNames".into(), json!(info.short_names));
    }
    if !info.categories.is_empty() {
        m.insert("categories".into(), json!(info.categories));
    }
    let mut subs = Vec::new();
    if info.has_status(version) {
        subs.push(json!({"subresource": "status", "responseKind": response_kind, "verbs": ["get", "patch", "update"]}));
    }
    if info.scale(version).is_some() {
        subs.push(json!({"subresource": "scale", "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}, "verbs": ["get", "patch", "update"]}));
    }
    for (sub, kind, verbs) in &info.extra_subresources {
        subs.push(json!({"subresource": sub, "responseKind": {"group": "", "version": "", "kind": kind}, "verbs": verbs}));
    }
    if !subs.is_empty() {
        m.insert("subresources".into(), Value::Array(subs));
    }
    Value::Object(m)
}

fn group_discovery(group: &str, versions: &BTreeMap<String, Vec<Arc<ResourceInfo>>>) -> Value {
    let vs: Vec<Value> = sorted_versions(versions.keys().cloned())
        .into_iter()
        .map(|v| {
            let mut infos = versions[&v].clone();
            infos.sort_by(|a, b| a.resource.cmp(&b.resource));
            let resources: Vec<Value> = infos.iter().map(|i| discovery_resource(i, &v)).collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    let metadata = if group.is_empty() {
        json!({"creationTimestamp": null})
    } else {
        json!({"name": group, "creationTimestamp": null})
    };
    json!({"metadata": metadata, "versions": vs})
}

/// Aggregated discovery for `/api` (`core == true`) or `/apis`.
pub fn aggregated(registry: &Registry, core: bool, api_version: &str, extra: &Extra) -> Value {
    let all = grouped(registry);
    let items: Vec<Value> = if core {
        all.get("")
            .map(|v| vec![group_discovery("", v)])
            .unwrap_or_default()
    } else {
        let mut items: Vec<Value> = sorted_groups(all.keys().cloned())
            .into_iter()
            .map(|g| group_discovery(&g, &all[&g]))
            .collect();
        items.extend(extra.discovery.iter().cloned());
        items
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": api_version,
        "metadata": {},
        "items": items,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_and_group_documents_list_built_ins() {
        let r = Registry::new();
        let core = api_resource_list(&r, "", "v1").expect("core");
        let names: Vec<&str> = core["resources"]
            .as_array()
            .expect("array")
            .iter()
            .filter_map(|x| x["name"].as_str())
            .collect();
        assert!(names.contains(&"configmaps"));
        assert!(names.contains(&"namespaces/finalize"));
        assert!(core.get("apiVersion").is_none());
        let groups = api_group_list(&r, &Extra::default());
        let first = &groups["groups"][0];
        assert_eq!(first["name"], "apiregistration.k8s.io");
        assert!(api_group_doc(&r, "nope.example.io", &Extra::default()).is_none());
        let agg = aggregated(&r, false, "apidiscovery.k8s.io/v2", &Extra::default());
        let lease_group = agg["items"]
            .as_array()
            .expect("items")
            .iter()
            .find(|i| i["metadata"]["name"] == "coordination.k8s.io")
            .expect("coordination");
        assert_eq!(
            lease_group["versions"][0]["resources"][0]["responseKind"],
            json!({"group": "", "version": "", "kind": "Lease"})
        );
    }

    /// kube's CRD discovery lists, per version, the subresources that version
    /// declares (`spec.versions[i].subresources`), legacy and aggregated alike.
    #[test]
    fn crd_subresources_are_listed_per_version() {
        let r = Registry::new();
        let crd = json!({
            "metadata": {"name": "widgets.per.example.io"},
            "spec": {"group": "per.example.io", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget"},
                "versions": [
                    {"name": "v1", "served": true, "storage": true,
                     "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}},
                    {"name": "v1beta1", "served": true, "storage": false},
                    {"name": "v1alpha1", "served": true, "storage": false,
                     "subresources": {"status": {}}},
                ]}
        });
        r.put_crd(crate::crd::resource_info(&crd).expect("served"));
        let legacy = |version: &str| -> Vec<String> {
            api_resource_list(&r, "per.example.io", version).expect("served")["resources"]
                .as_array()
                .expect("array")
                .iter()
                .filter_map(|x| x["name"].as_str().map(str::to_string))
                .collect()
        };
        assert_eq!(legacy("v1"), ["widgets", "widgets/status", "widgets/scale"]);
        assert_eq!(legacy("v1beta1"), ["widgets"]);
        assert_eq!(legacy("v1alpha1"), ["widgets", "widgets/status"]);

        let agg = aggregated(&r, false, "apidiscovery.k8s.io/v2", &Extra::default());
        let group = agg["items"]
            .as_array()
            .expect("items")
            .iter()
            .find(|i| i["metadata"]["name"] == "per.example.io")
            .expect("group");
        let subresources = |version: &str| -> Vec<String> {
            let v = group["versions"]
                .as_array()
                .expect("versions")
                .iter()
                .find(|v| v["version"] == version)
                .expect("version");
            v["resources"][0]["subresources"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s["subresource"].as_str().map(str::to_string))
                .collect()
        };
        assert_eq!(subresources("v1"), ["status", "scale"]);
        assert!(subresources("v1beta1").is_empty());
        assert_eq!(subresources("v1alpha1"), ["status"]);
    }
}
