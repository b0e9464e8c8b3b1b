//! Start-up resolution of each synced type against the host, and the CRD copy into
//! the tenant.
//!
//! A type backed by a CRD on the host gets that CRD copied into the tenant (schema,
//! printer columns, subresources of the synced version). Conversion webhooks are not
//! copied: the copy always uses `strategy: None`, since a webhook configured for the
//! host's services is unreachable from, and unsafe for, the tenant. When the synced
//! version changes, the tenant CRD gains the new version and it becomes the storage
//! version; the `served` flag of every other version stays as it was.

use std::time::Duration;

use crproxy_core::config::sync::{Direction, Scope, SyncResource};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

use crate::to_host::{again_on_conflict, is_code};
use crate::{aggregated, SyncError};

/// Set on tenant CRDs the syncer created or updated.
pub const COPIED_FROM_HOST: &str = "crproxy.dev/copied-from-host";

/// A synced type as the host serves it.
#[derive(Debug, Clone)]
pub struct ResolvedType {
    pub resource: SyncResource,
    pub api: ApiResource,
    /// Whether the synced version has a status subresource (status then goes
    /// through `/status`).
    pub status_subresource: bool,
    /// Served on the host by an extension API server (the tenant has a generated
    /// schemaless CRD, and toHost writes go through write-through).
    pub aggregated: bool,
}

impl ResolvedType {
    pub fn direction(&self) -> &'static str {
        self.resource.direction.as_str()
    }
}

pub(crate) fn crd_api() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    )
}

fn apiservice_api() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
        "apiservices",
    )
}

/// Where a synced type comes from, which decides the tenant CRD: a copy of the
/// host's CRD, or one generated for a type the host serves through aggregation.
enum Source {
    Crd(Value),
    Aggregated(aggregated::Discovered),
}

/// Resolves `resource` against the host and copies its CRD into the tenant.
pub async fn resolve(
    host: &kube::Client,
    tenant: &kube::Client,
    resource: &SyncResource,
) -> Result<ResolvedType, SyncError> {
    let fail = |message: String| SyncError::Resolution {
        key: format!(
            "sync.{}.customResources[{:?}]",
            resource.direction.as_str(),
            resource.key
        ),
        message,
    };
    let crd_name = format!("{}.{}", resource.plural, resource.group);
    let host_crds: Api<DynamicObject> = Api::all_with(host.clone(), &crd_api());
    let host_crd = host_crds
        .get_opt(&crd_name)
        .await
        .map_err(SyncError::api(format!(
            "reading CRD {crd_name} on the host"
        )))?;
    let source = match host_crd {
        Some(crd) => {
            Source::Crd(serde_json::to_value(&crd).map_err(|e| fail(format!("host CRD: {e}")))?)
        }
        None if served_by_aggregation(host, &resource.group).await? => {
            let found = aggregated::discover(host, resource).await.map_err(fail)?;
            check_scope(found.scope, resource).map_err(fail)?;
            Source::Aggregated(found)
        }
        None => {
            return Err(fail(format!("the host does not serve {crd_name}: no CustomResourceDefinition {crd_name} on the host; install it there or disable this entry")));
        }
    };
    let plan = match &source {
        Source::Crd(crd) => plan_version(crd, resource).map_err(fail)?,
        Source::Aggregated(found) => VersionPlan {
            version: found.version.clone(),
            kind: found.kind.clone(),
            // The host's answer, which the generated CRD follows: without a host
            // `/status`, a mirror's status is the host's own and a replace of the
            // mirror must carry it, or it would be wiped.
            status_subresource: found.status_subresource,
        },
    };
    let is_aggregated = matches!(source, Source::Aggregated(_));

    let tenant_crds: Api<DynamicObject> = Api::all_with(tenant.clone(), &crd_api());
    // Replicas starting together race for the tenant CRD: the loser's create is
    // refused as already there, or its replace as a conflict. It reads the
    // winner's CRD and decides again, rather than failing `crproxy run`.
    let write = || {
        write_tenant_crd(
            &tenant_crds,
            &crd_name,
            &source,
            &plan.version,
            resource,
            &fail,
        )
    };
    let conflict =
        |e: &SyncError| matches!(e, SyncError::Api { source, .. } if is_code(source, 409));
    let action = again_on_conflict(write, conflict).await?;
    if let Some(action) = action {
        if is_aggregated {
            tracing::info!(resource = %resource.key, crd = %crd_name, version = %plan.version, action, "generated a schemaless CRD in the tenant for a type the host serves through API aggregation");
        } else {
            tracing::info!(resource = %resource.key, crd = %crd_name, version = %plan.version, action, "copied CRD from the host into the tenant");
        }
    }
    wait_established(&tenant_crds, &crd_name)
        .await
        .map_err(fail)?;
    let api = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&resource.group, &plan.version, &plan.kind),
        &resource.plural,
    );
    Ok(ResolvedType {
        resource: resource.clone(),
        api,
        status_subresource: plan.status_subresource,
        aggregated: is_aggregated,
    })
}

/// Brings the tenant's CRD `crd_name` to what `source` says, from what the tenant
/// holds now: `Some("created")` or `Some("updated")` when it was written, `None`
/// when it already was.
async fn write_tenant_crd(
    tenant_crds: &Api<DynamicObject>,
    crd_name: &str,
    source: &Source,
    version: &str,
    resource: &SyncResource,
    fail: &impl Fn(String) -> SyncError,
) -> Result<Option<&'static str>, SyncError> {
    let existing = tenant_crds
        .get_opt(crd_name)
        .await
        .map_err(SyncError::api(format!(
            "reading CRD {crd_name} in the tenant"
        )))?;
    let existing = existing
        .map(|e| serde_json::to_value(&e))
        .transpose()
        .map_err(|e| fail(format!("tenant CRD: {e}")))?;
    let desired = match source {
        Source::Crd(crd) => tenant_crd(crd, version, existing.as_ref()),
        Source::Aggregated(found) => aggregated::generated_crd(resource, found, existing.as_ref()),
    }
    .map_err(fail)?;
    if existing.as_ref().map(|e| &e["spec"]) == Some(&desired["spec"]) {
        return Ok(None);
    }
    let object: DynamicObject =
        serde_json::from_value(desired).map_err(|e| fail(format!("tenant CRD: {e}")))?;
    if existing.is_some() {
        tenant_crds
            .replace(crd_name, &PostParams::default(), &object)
            .await
            .map_err(SyncError::api(format!(
                "updating CRD {crd_name} in the tenant"
            )))?;
        Ok(Some("updated"))
    } else {
        tenant_crds
            .create(&PostParams::default(), &object)
            .await
            .map_err(SyncError::api(format!(
                "creating CRD {crd_name} in the tenant"
            )))?;
        Ok(Some("created"))
    }
}

async fn served_by_aggregation(host: &kube::Client, group: &str) -> Result<bool, SyncError> {
    let apiservices: Api<DynamicObject> = Api::all_with(host.clone(), &apiservice_api());
    let list = match apiservices.list(&Default::default()).await {
        Ok(list) => list,
        // Not allowed to look: say "does not serve" rather than failing differently.
        Err(kube::Error::Api(s)) if s.code == 403 => return Ok(false),
        Err(e) => return Err(SyncError::api("listing APIServices on the host")(e)),
    };
    Ok(list.items.iter().any(|a| {
        a.data["spec"]["group"] == group
            && a.data["spec"].get("service").is_some_and(|s| !s.is_null())
    }))
}

async fn wait_established(crds: &Api<DynamicObject>, name: &str) -> Result<(), String> {
    for _ in 0..100 {
        if let Ok(Some(crd)) = crds.get_opt(name).await {
            let established = crd.data["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Established" && c["status"] == "True")
                });
            if established {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "the tenant CRD {name} did not become Established within 10 s"
    ))
}

/// Which version of the host CRD is synced, and what it looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionPlan {
    pub version: String,
    pub kind: String,
    pub status_subresource: bool,
}

/// Picks the configured version (or the host's storage version) and checks that the
/// host serves it with the configured scope.
pub fn plan_version(crd: &Value, resource: &SyncResource) -> Result<VersionPlan, String> {
    let spec = &crd["spec"];
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let chosen = match &resource.version {
        Some(v) => versions.iter().find(|x| x["name"] == v.as_str()),
        None => versions.iter().find(|x| x["storage"] == true),
    };
    let Some(chosen) = chosen else {
        let names: Vec<&str> = versions.iter().filter_map(|v| v["name"].as_str()).collect();
        return Err(format!(
            "the host's CRD has no version {}; it has {}",
            resource.version.as_deref().unwrap_or("marked as storage"),
            names.join(", ")
        ));
    };
    let version = chosen["name"].as_str().unwrap_or_default().to_owned();
    if chosen["served"] != true {
        return Err(format!("the host does not serve version {version}"));
    }
    let host_scope = match spec["scope"].as_str() {
        Some("Cluster") => Scope::Cluster,
        _ => Scope::Namespaced,
    };
    check_scope(host_scope, resource)?;
    Ok(VersionPlan {
        version,
        kind: spec["names"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        status_subresource: chosen["subresources"]["status"].is_object(),
    })
}

/// The host's scope of the type must be the configured one.
fn check_scope(host_scope: Scope, resource: &SyncResource) -> Result<(), String> {
    if host_scope != resource.scope {
        let hint = match resource.direction {
            Direction::ToHost => "toHost syncs namespaced types only",
            Direction::FromHost => "set scope to match the host",
        };
        return Err(format!(
            "the host's type is {} but the entry says {}; {hint}",
            host_scope.as_str(),
            resource.scope.as_str()
        ));
    }
    Ok(())
}

/// The tenant CRD for syncing `version` of `host_crd`, given the tenant's current CRD.
pub fn tenant_crd(
    host_crd: &Value,
    version: &str,
    existing: Option<&Value>,
) -> Result<Value, String> {
    let spec = &host_crd["spec"];
    let Some(mut synced) = spec["versions"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == version))
        .cloned()
    else {
        return Err(format!("the host's CRD has no version {version}"));
    };
    synced["served"] = json!(true);
    synced["storage"] = json!(true);
    let name = host_crd["metadata"]["name"].clone();
    let mut out = match existing {
        None => json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": name, "annotations": {COPIED_FROM_HOST: "true"}},
            "spec": {
                "group": spec["group"],
                "names": spec["names"],
                "scope": spec["scope"],
                "versions": [synced],
            },
        }),
        Some(existing) => {
            let mut out = existing.clone();
            let mut versions: Vec<Value> = out["spec"]["versions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for v in &mut versions {
                // Other versions keep `served` as it was; only storage moves.
                v["storage"] = json!(false);
            }
            match versions.iter_mut().find(|v| v["name"] == version) {
                // The synced version itself takes the host's definition whole.
                Some(v) => *v = synced,
                None => versions.push(synced),
            }
            out["spec"]["versions"] = Value::Array(versions);
            out["metadata"]["annotations"][COPIED_FROM_HOST] = json!("true");
            out
        }
    };
    out["spec"]["conversion"] = json!({"strategy": "None"});
    if let Some(m) = out["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
