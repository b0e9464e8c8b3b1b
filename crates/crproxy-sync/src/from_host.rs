//! The fromHost syncer: host objects copied into the tenant.
//!
//! Work is keyed by the tenant copy's `(namespace, name)`; cluster-scoped types use the
//! same name on both sides, namespaced ones go through `mappings.byName`.
//!
//! | host object | tenant object | step |
//! |---|---|---|
//! | exists | missing | create the copy (also after a tenant deleted it) |
//! | exists | exists | three-way merge: the host's changed fields overwrite, tenant edits of other fields stay |
//! | missing (confirmed live) | exists | delete it: a copy of a deleted host object, or created in the tenant |
//! | no mapping covers the tenant's key | a copy (confirmed live) | delete it, pinned to the version read: an earlier mapping's copy (the mapping was removed, or an object mapping took the name) |
//! | no mapping covers the tenant's key | the tenant's own | leave it: a namespaced type's object outside every mapped namespace is the tenant's |
//!
//! Host objects that are toHost mirrors of some tenant (they carry the `managed-by`
//! label) are skipped. The copy keeps the host fields as last synced in an annotation:
//! the base of the merge. The copy's labels are the host's plus any a tenant
//! controller added; those, and its finalizers and owner references, survive every
//! replace and never cause one ([`crate::managed`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crproxy_core::config::sync::{Mapping, Scope, SyncResource};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::{json, Map, Value};

use crate::crd::ResolvedType;
use crate::managed::{self, Keys};
use crate::merge::three_way;
use crate::names;
use crate::run::{ensure_namespace, too_deep, Key, Outcome, Reconciler, StepError};
use crate::to_host::{delete_as_read, from_value, is_code, name_holder, to_value};
use crate::SyncMetrics;

/// One fromHost type.
pub struct FromHost {
    pub ty: ResolvedType,
    pub tenant_client: kube::Client,
    pub host_client: kube::Client,
    pub tenant_store: Store<DynamicObject>,
    /// One cache per watched host namespace (`None`: cluster-scoped, all).
    pub host_stores: Vec<(Option<String>, Store<DynamicObject>)>,
    pub metrics: Arc<SyncMetrics>,
}

/// The synced fields of an object: everything but `apiVersion`, `kind` and `metadata`.
pub fn fields(object: &Value) -> Value {
    let mut out = Map::new();
    if let Some(m) = object.as_object() {
        for (k, v) in m {
            if !matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// The tenant key of a host object, `None` when no mapping covers it.
pub fn tenant_key(
    resource: &SyncResource,
    host_namespace: Option<&str>,
    host_name: &str,
) -> Option<Key> {
    if resource.scope == Scope::Cluster {
        return Some(Key {
            namespace: String::new(),
            name: host_name.to_owned(),
        });
    }
    let host_namespace = host_namespace?;
    // An exact object mapping wins over its namespace's wildcard.
    let exact = resource.mappings.iter().find_map(|m| match m {
        Mapping::Object {
            host_namespace: hn,
            host_name: n,
            tenant_namespace,
            tenant_name,
        } if hn == host_namespace && n == host_name => Some(Key {
            namespace: tenant_namespace.clone(),
            name: tenant_name.clone(),
        }),
        _ => None,
    });
    exact.or_else(|| {
        resource.mappings.iter().find_map(|m| match m {
            Mapping::Namespace {
                host_namespace: hn,
                tenant_namespace,
            } if hn == host_namespace => Some(Key {
                namespace: tenant_namespace.clone(),
                name: host_name.to_owned(),
            }),
            _ => None,
        })
    })
}

/// The host `(namespace, name)` a tenant key is a copy of, `None` when unmapped.
pub fn host_key(resource: &SyncResource, key: &Key) -> Option<(Option<String>, String)> {
    if resource.scope == Scope::Cluster {
        return Some((None, key.name.clone()));
    }
    let exact = resource.mappings.iter().find_map(|m| match m {
        Mapping::Object {
            host_namespace,
            host_name,
            tenant_namespace,
            tenant_name,
        } if *tenant_namespace == key.namespace && *tenant_name == key.name => {
            Some((Some(host_namespace.clone()), host_name.clone()))
        }
        _ => None,
    });
    exact.or_else(|| {
        resource.mappings.iter().find_map(|m| match m {
            Mapping::Namespace { host_namespace, tenant_namespace } if *tenant_namespace == key.namespace => {
                // Objects mapped one by one elsewhere are not also copied under their
                // own name.
                let taken = resource.mappings.iter().any(|o| matches!(o,
                    Mapping::Object { host_namespace: hn, host_name, .. } if hn == host_namespace && *host_name == key.name));
                (!taken).then(|| (Some(host_namespace.clone()), key.name.clone()))
            }
            _ => None,
        })
    })
}

/// The tenant copy for `host` given the tenant's current object (if any): host
/// metadata labels, the three-way merged fields, and the bookkeeping annotations.
pub fn desired_copy(ty: &ResolvedType, key: &Key, host: &Value, tenant: Option<&Value>) -> Value {
    let host_fields = fields(host);
    let merged = match tenant {
        Some(t) => {
            let base: Option<Value> = t["metadata"]["annotations"][names::LAST_HOST_STATE]
                .as_str()
                .and_then(|s| serde_json::from_str(s).ok());
            three_way(base.as_ref(), Some(&host_fields), Some(&fields(t))).unwrap_or(json!({}))
        }
        None => host_fields.clone(),
    };
    // Only the bookkeeping: the tenant's own keys stay through `managed::carry_over`
    // when the copy is replaced.
    let mut annotations = Map::new();
    annotations.insert(
        names::LAST_HOST_STATE.into(),
        json!(host_fields.to_string()),
    );
    annotations.insert(
        names::OBJECT_HOST_NAME.into(),
        host["metadata"]["name"].clone(),
    );
    if let Some(ns) = host["metadata"]["namespace"].as_str() {
        annotations.insert(names::OBJECT_HOST_NAMESPACE.into(), json!(ns));
    }
    let mut metadata = json!({
        "name": key.name,
        "labels": host["metadata"]["labels"].as_object().cloned().unwrap_or_default(),
        "annotations": annotations,
    });
    if !key.namespace.is_empty() {
        metadata["namespace"] = json!(key.namespace);
    }
    if let Some(t) = tenant {
        metadata["resourceVersion"] = t["metadata"]["resourceVersion"].clone();
        metadata["uid"] = t["metadata"]["uid"].clone();
    }
    let mut out = merged.as_object().cloned().unwrap_or_default();
    out.insert("apiVersion".into(), json!(ty.api.api_version));
    out.insert("kind".into(), json!(ty.api.kind));
    out.insert("metadata".into(), metadata);
    let mut out = Value::Object(out);
    managed::record(&mut out, Keys::Labels);
    out
}

/// Whether the copy must be written: fields, the host's labels or the bookkeeping
/// differ (labels a tenant controller added do not count, see [`managed`]).
pub fn copy_differs(desired: &Value, current: &Value) -> bool {
    fields(desired) != fields(current) || managed::metadata_differs(desired, current)
}

impl FromHost {
    /// The host namespaces to watch (`[None]` for a cluster-scoped type).
    pub fn host_namespaces(resource: &SyncResource) -> Vec<Option<String>> {
        if resource.scope == Scope::Cluster {
            return vec![None];
        }
        let mut out: Vec<Option<String>> = resource
            .mappings
            .iter()
            .map(|m| match m {
                Mapping::Namespace { host_namespace, .. }
                | Mapping::Object { host_namespace, .. } => Some(host_namespace.clone()),
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    fn tenant_api(&self, key: &Key) -> Api<DynamicObject> {
        if key.namespace.is_empty() {
            Api::all_with(self.tenant_client.clone(), &self.ty.api)
        } else {
            Api::namespaced_with(self.tenant_client.clone(), &key.namespace, &self.ty.api)
        }
    }

    fn host_api(&self, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) => Api::namespaced_with(self.host_client.clone(), ns, &self.ty.api),
            None => Api::all_with(self.host_client.clone(), &self.ty.api),
        }
    }

    fn host_cached(&self, namespace: Option<&str>, name: &str) -> Option<Arc<DynamicObject>> {
        let (_, store) = self
            .host_stores
            .iter()
            .find(|(ns, _)| ns.as_deref() == namespace)?;
        let mut r = ObjectRef::new_with(name, self.ty.api.clone());
        if let Some(ns) = namespace {
            r = r.within(ns);
        }
        store.get(&r)
    }

    fn log(&self, key: &Key, host: &str, action: &'static str) {
        tracing::info!(
            resource = %self.ty.resource.key,
            direction = "fromHost",
            tenant_object = %shown(key),
            host_object = %host,
            action,
            "synced"
        );
        self.metrics
            .synced(&self.ty.resource.key, "fromHost", action);
    }

    /// Deletes the tenant object `tenant` at `key` (this incarnation only), whose
    /// host object `host_shown` is gone: logged as a copy's deletion, or as that
    /// of an object the tenant made under a host object's name.
    async fn delete_tenant(
        &self,
        key: &Key,
        tenant: &Value,
        host_shown: &str,
    ) -> Result<Outcome, StepError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: tenant["metadata"]["uid"].as_str().map(str::to_owned),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.tenant_api(key).delete(&key.name, &params).await {
            Ok(_) => {}
            Err(e) if is_code(&e, 404) => {}
            Err(e) => return Err(e.into()),
        }
        let action = if is_copy(tenant) {
            "delete_tenant"
        } else {
            "delete_tenant_created"
        };
        self.log(key, host_shown, action);
        Ok(Outcome::Done)
    }

    /// Deletes the copy at `key`, which no mapping covers any more, if a live read
    /// still shows a copy there: the cache may be behind a tenant's removal of the
    /// marker. The delete is pinned to that read (uid and resourceVersion), so an
    /// object changed since (the marker removed, say) is decided on again. The
    /// marker is all that tells a copy from the tenant's own object, and a tenant
    /// user who may update the object can write it (docs/operations.md).
    async fn delete_unmapped_copy(&self, key: &Key) -> Result<Outcome, StepError> {
        let Some(live) = self.tenant_api(key).get_opt(&key.name).await? else {
            return Ok(Outcome::Done);
        };
        if live.metadata.deletion_timestamp.is_some() || !is_copy(&to_value(&live)?) {
            return Ok(Outcome::Done);
        }
        // Changed since the read: looked at again.
        if !delete_as_read(&self.tenant_api(key), &key.name, &live.metadata).await? {
            return Ok(Outcome::Requeue(Duration::from_millis(100)));
        }
        self.log(key, "-", "delete_tenant");
        Ok(Outcome::Done)
    }

    async fn reconcile_key(&self, key: &Key) -> Result<Outcome, StepError> {
        let mut r = ObjectRef::new_with(&key.name, self.ty.api.clone());
        if !key.namespace.is_empty() {
            r = r.within(&key.namespace);
        }
        let tenant = self
            .tenant_store
            .get(&r)
            .map(|t| to_value(&t))
            .transpose()?;
        // No mapping covers the key (the tenant is watched cluster-wide): a copy
        // an earlier mapping made there has no host object any more and goes; any
        // other object there is the tenant's own and is never touched.
        let Some((host_namespace, host_name)) = host_key(&self.ty.resource, key) else {
            return match tenant {
                Some(copy) if is_copy(&copy) && copy["metadata"]["deletionTimestamp"].is_null() => {
                    self.delete_unmapped_copy(key).await
                }
                _ => Ok(Outcome::Done),
            };
        };
        let host = self
            .host_cached(host_namespace.as_deref(), &host_name)
            .filter(|h| !is_mirror(h))
            .map(|h| to_value(&h))
            .transpose()?;
        let host_shown = match &host_namespace {
            Some(ns) => format!("{ns}/{host_name}"),
            None => host_name.clone(),
        };
        too_deep(("host", &host), ("tenant", &tenant))?;
        match (host, tenant) {
            (None, None) => Ok(Outcome::Done),
            (None, Some(tenant)) => {
                if !tenant["metadata"]["deletionTimestamp"].is_null() {
                    return Ok(Outcome::Done);
                }
                // Confirm live that the host object is gone before deleting.
                let host_api = self.host_api(host_namespace.as_deref());
                let live = host_api.get_opt(&host_name).await?;
                if live.is_some_and(|live| !is_mirror(&live)) {
                    return Ok(Outcome::Requeue(Duration::from_millis(500)));
                }
                self.delete_tenant(key, &tenant, &host_shown).await
            }
            (Some(host), None) => {
                if !key.namespace.is_empty() {
                    ensure_namespace(&self.tenant_client, &key.namespace).await?;
                }
                let desired = desired_copy(&self.ty, key, &host, None);
                let object: DynamicObject = from_value(desired.clone())?;
                let created = match self
                    .tenant_api(key)
                    .create(&PostParams::default(), &object)
                    .await
                {
                    Ok(c) => c,
                    // The name is taken: the cache is behind, looked at again soon.
                    Err(e) if is_code(&e, 409) => {
                        name_holder(&self.tenant_api(key), &key.name, e).await?;
                        return Ok(Outcome::Requeue(Duration::from_millis(200)));
                    }
                    Err(e) => return Err(e.into()),
                };
                self.log(key, &host_shown, "create_tenant");
                self.write_status(key, &to_value(&created)?, &desired)
                    .await?;
                Ok(Outcome::Done)
            }
            (Some(host), Some(tenant)) => {
                let mut desired = desired_copy(&self.ty, key, &host, Some(&tenant));
                let mut current = tenant.clone();
                if copy_differs(&desired, &tenant) {
                    // Keeps the tenant's own labels, finalizers and owners on the copy.
                    managed::carry_over(&mut desired, &tenant);
                    let object: DynamicObject = from_value(desired.clone())?;
                    let replaced = self
                        .tenant_api(key)
                        .replace(&key.name, &PostParams::default(), &object)
                        .await?;
                    current = to_value(&replaced)?;
                    self.log(key, &host_shown, "update_tenant");
                }
                self.write_status(key, &current, &desired).await?;
                Ok(Outcome::Done)
            }
        }
    }

    /// With a status subresource, the main write ignores status: write it separately.
    async fn write_status(
        &self,
        key: &Key,
        current: &Value,
        desired: &Value,
    ) -> Result<(), StepError> {
        if !self.ty.status_subresource || current["status"] == desired["status"] {
            return Ok(());
        }
        let mut object = current.clone();
        object["status"] = desired["status"].clone();
        let object: DynamicObject = from_value(object)?;
        self.tenant_api(key)
            .replace_status(&key.name, &PostParams::default(), &object)
            .await?;
        Ok(())
    }
}

fn shown(key: &Key) -> String {
    if key.namespace.is_empty() {
        key.name.clone()
    } else {
        format!("{}/{}", key.namespace, key.name)
    }
}

/// Whether the tenant object `tenant` is a copy the syncer made (it keeps the
/// host fields it was made from), not one the tenant made itself.
fn is_copy(tenant: &Value) -> bool {
    !tenant["metadata"]["annotations"][names::LAST_HOST_STATE].is_null()
}

fn is_mirror(object: &DynamicObject) -> bool {
    object
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(names::MANAGED_BY))
}

impl Reconciler for FromHost {
    fn resource(&self) -> &ResolvedType {
        &self.ty
    }

    fn metrics(&self) -> &Arc<SyncMetrics> {
        &self.metrics
    }

    fn key_of_tenant(&self, object: &DynamicObject) -> Option<Key> {
        Some(Key {
            namespace: object.metadata.namespace.clone().unwrap_or_default(),
            name: object.metadata.name.clone()?,
        })
    }

    fn key_of_host(&self, object: &DynamicObject) -> Option<Key> {
        if is_mirror(object) {
            return None;
        }
        tenant_key(
            &self.ty.resource,
            object.metadata.namespace.as_deref(),
            object.metadata.name.as_deref()?,
        )
    }

    fn all_keys(&self) -> BTreeSet<Key> {
        let mut keys: BTreeSet<Key> = self
            .tenant_store
            .state()
            .iter()
            .filter_map(|o| self.key_of_tenant(o))
            .collect();
        for (_, store) in &self.host_stores {
            keys.extend(store.state().iter().filter_map(|o| self.key_of_host(o)));
        }
        keys
    }

    async fn reconcile(&self, key: &Key) -> Result<Outcome, StepError> {
        self.reconcile_key(key).await
    }
}

#[cfg(test)]
mod tests;
