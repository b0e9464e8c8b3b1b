//! Start-up resolution of a synced type the host serves through API aggregation (an
//! extension API server behind an APIService) rather than a CRD.
//!
//! The tenant has no extension API server, so it gets a generated, schemaless CRD
//! instead: every field is preserved and none validated there (validation happens on
//! the host, through write-through). It has a status subresource exactly when the
//! host serves `<plural>/status`, so status is written through `/status` on both
//! sides or on neither. The CRD carries
//! [`GENERATED_FROM`]`: aggregated-apiserver` so that a CRD of the same name that
//! somebody else made is never taken over. When the synced version changes, versions
//! the CRD had before are kept (objects stored in them stay readable and
//! `status.storedVersions` stays valid) but are no longer served.

use crproxy_core::config::sync::{Scope, SyncResource};
use serde_json::{json, Value};

/// The annotation that marks a tenant CRD as generated for an aggregated type.
pub const GENERATED_FROM: &str = "vcluster.loft.sh/generated-from";
/// Its value.
pub const AGGREGATED_APISERVER: &str = "aggregated-apiserver";

/// What host discovery says about the synced version of an aggregated type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    pub version: String,
    pub kind: String,
    pub scope: Scope,
    /// Whether the host serves `<plural>/status`.
    pub status_subresource: bool,
}

/// Asks the host's discovery which version of `resource` is synced (the configured
/// one, else the group's preferred version) and what kind and scope it has there.
pub async fn discover(host: &kube::Client, resource: &SyncResource) -> Result<Discovered, String> {
    let version = match &resource.version {
        Some(v) => v.clone(),
        None => {
            let groups = host
                .list_api_groups()
                .await
                .map_err(|e| format!("reading the host's API groups: {e}"))?;
            groups
                .groups
                .iter()
                .find(|g| g.name == resource.group)
                .and_then(|g| g.preferred_version.as_ref())
                .map(|v| v.version.clone())
                .ok_or_else(|| {
                    format!(
                        "the host's discovery has no preferred version for group {}",
                        resource.group
                    )
                })?
        }
    };
    let group_version = format!("{}/{version}", resource.group);
    let list = host
        .list_api_group_resources(&group_version)
        .await
        .map_err(|e| format!("reading the host's discovery for {group_version}: {e}"))?;
    let Some(main) = list.resources.iter().find(|r| r.name == resource.plural) else {
        return Err(format!(
            "the host's {group_version} has no resource {}",
            resource.plural
        ));
    };
    let scope = if main.namespaced {
        Scope::Namespaced
    } else {
        Scope::Cluster
    };
    let status = format!("{}/status", resource.plural);
    Ok(Discovered {
        version,
        kind: main.kind.clone(),
        scope,
        status_subresource: list.resources.iter().any(|r| r.name == status),
    })
}

/// The generated tenant CRD for `found`, given the tenant's current CRD of that name.
/// Refuses a CRD that was not generated for an aggregated type.
pub fn generated_crd(
    resource: &SyncResource,
    found: &Discovered,
    existing: Option<&Value>,
) -> Result<Value, String> {
    let name = format!("{}.{}", resource.plural, resource.group);
    let mut synced = json!({
        "name": found.version,
        "served": true,
        "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
    });
    // As the host: the syncer writes status through `/status` on both sides or on
    // neither (`ResolvedType::status_subresource`).
    if found.status_subresource {
        synced["subresources"] = json!({"status": {}});
    }
    let spec = json!({
        "group": resource.group,
        "names": {
            "plural": resource.plural,
            "singular": found.kind.to_lowercase(),
            "kind": found.kind,
            "listKind": format!("{}List", found.kind),
        },
        "scope": found.scope.as_str(),
        "conversion": {"strategy": "None"},
    });
    let Some(existing) = existing else {
        let mut spec = spec;
        spec["versions"] = json!([synced]);
        return Ok(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": name, "annotations": {GENERATED_FROM: AGGREGATED_APISERVER}},
            "spec": spec,
        }));
    };
    if existing["metadata"]["annotations"][GENERATED_FROM] != AGGREGATED_APISERVER {
        return Err(format!(
            "the tenant already has a CustomResourceDefinition {name} without the annotation \
             {GENERATED_FROM}: {AGGREGATED_APISERVER}; crproxy does not take over a CRD it did \
             not generate: delete it or disable this entry"
        ));
    }
    let mut versions: Vec<Value> = existing["spec"]["versions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for v in &mut versions {
        // Kept so that objects stored in it stay readable, but no longer served.
        v["served"] = json!(false);
        v["storage"] = json!(false);
    }
    match versions
        .iter_mut()
        .find(|v| v["name"] == found.version.as_str())
    {
        Some(v) => *v = synced,
        None => versions.push(synced),
    }
    let mut out = existing.clone();
    let mut spec = spec;
    spec["versions"] = Value::Array(versions);
    out["spec"] = spec;
    if let Some(m) = out["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
