//! The toHost syncer: tenant objects mirrored into the tenant's namespace on the host.
//!
//! Work is keyed by the tenant object's `(namespace, name)`. A reconcile compares the
//! tenant object with its mirror (both from reflector caches) and makes one step
//! towards agreement:
//!
//! | tenant object | mirror | step |
//! |---|---|---|
//! | exists | missing, never mirrored | create the mirror, remember its uid on the tenant object |
//! | exists, was mirrored | missing (confirmed live), its DELETED event seen and the mirror not seen since | the host deleted it: delete the tenant object |
//! | exists, was mirrored | missing (confirmed live), no DELETED event seen (or the mirror seen again after it) | the host lost it: create the mirror again |
//! | exists | this tenant object's | update spec down, status up |
//! | exists | ours, older uid | stale mirror of a deleted object: delete it, then create |
//! | exists | not ours | never touched; reported as `foreign_object` |
//! | missing (confirmed live) | ours | tenant object deleted: delete the mirror |
//!
//! "Ours" means the mirror's `managed-by` label is this tenant and its name/namespace
//! annotations are this tenant object's; the uid annotation tells incarnations apart.
//! Nothing is deleted on the word of a cache alone: a live read confirms first, and
//! deletes carry a uid precondition.
//!
//! A mirror is written whole, but only what crproxy sets is crproxy's: labels and
//! annotations others add, finalizers and owner references survive every replace and
//! never cause one ([`crate::managed`]). Nor do fields the host fills in or changes
//! on a write (its defaults, a mutating webhook): a mirror still as this syncer's
//! last write left it is not written again ([`LastWrite`]).

use crproxy_core::locks;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crproxy_core::config::sync::{FieldPath, PathStep};
use crproxy_core::go_text::quoted;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::{json, Map, Value};

use crate::crd::ResolvedType;
use crate::managed::{self, Keys};
use crate::names::{self, MirrorIdentity};
use crate::patches::{rewrite_strings, try_rewrite_strings};
use crate::run::{too_deep, Key, Outcome, Reconciler, StepError};
use crate::writethrough::TermGate;
use crate::SyncMetrics;

/// One toHost type between one tenant and the host.
pub struct ToHost {
    pub ty: ResolvedType,
    pub tenant: String,
    /// The tenant's Platform project ([`names::TENANT_PROJECT`]).
    pub tenant_project: String,
    pub host_namespace: String,
    pub tenant_client: kube::Client,
    pub host_client: kube::Client,
    pub tenant_store: Store<DynamicObject>,
    pub host_store: Store<DynamicObject>,
    pub metrics: Arc<SyncMetrics>,
    /// For an aggregated type: shared with write-through, which holds the keys of
    /// writes it has accepted on the host but not yet seen stored in the tenant.
    pub gate: Option<TermGate>,
    /// By key: the uid of the last mirror whose DELETED event this syncer's host
    /// watch delivered. The only evidence that the host deleted a mirror, as opposed
    /// to losing it (a restored backup, an extension server with a fresh store).
    pub observed_host_deletes: Mutex<HashMap<Key, String>>,
    /// By key: this syncer's last write of the mirror.
    pub last_writes: Mutex<HashMap<Key, LastWrite>>,
}

/// A write of a mirror: a digest of the mirror it was meant to make, and the
/// mirror the host answered with, by resourceVersion and by a digest of what
/// decides whether it needs a write ([`mirror_differs`]: its synced fields and
/// crproxy's labels and annotations, [`managed::ours`]). While the tenant object asks for the same
/// mirror and the mirror is still the answer (by either measure), the mirror is as
/// that write left it, even where it differs from what was sent: the host's
/// defaults or a mutating webhook changed it. Writing it again would only be
/// turned into the same object, at every resync and every change of the mirror's
/// status or of others' keys on it.
///
/// Both measures, because each alone misses a case: a status write moves the
/// resourceVersion, and an extension server may answer a write in another shape
/// than it lists the object in.
pub struct LastWrite {
    desired: u64,
    resource_version: String,
    answered: u64,
}

impl LastWrite {
    fn of(desired: &Value, mirror: &Value) -> LastWrite {
        let decides = (synced_fields(mirror), managed::ours(desired, mirror));
        LastWrite {
            desired: digest(desired),
            resource_version: meta(mirror, "resourceVersion").to_owned(),
            answered: digest(&decides),
        }
    }

    /// Whether `now` (of the mirror as it is) is still this write's.
    fn holds(&self, now: &LastWrite) -> bool {
        self.desired == now.desired
            && (self.resource_version == now.resource_version || self.answered == now.answered)
    }
}

fn digest(value: &impl serde::Serialize) -> u64 {
    // serde_json's maps are ordered by key, so equal values print alike.
    let mut hasher = DefaultHasher::new();
    serde_json::to_vec(value)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// The fields of an object that a mirror copies from its tenant object: all but
/// apiVersion, kind, metadata and status.
fn synced_fields(object: &Value) -> Map<String, Value> {
    object
        .as_object()
        .map(|fields| {
            fields
                .iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The label selector of the host watch: only this tenant's mirrors.
pub fn host_selector(tenant: &str) -> String {
    format!("{}={}", names::MANAGED_BY, names::label_value(tenant))
}

fn annotations(v: &Value) -> BTreeMap<String, String> {
    v["metadata"]["annotations"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

fn meta<'a>(v: &'a Value, field: &str) -> &'a str {
    v["metadata"][field].as_str().unwrap_or_default()
}

/// `desired` as the replace of `mirror`: what others put on the mirror stays
/// (their keys, a host controller's finalizer that must still hold a mirror being
/// deleted, owners), and so does its status, which the host owns (a PUT ignores
/// it where `/status` is a subresource). The syncer and write-through replace
/// mirrors alike.
pub fn replacement(desired: &Value, mirror: &Value) -> Value {
    let mut replacement = desired.clone();
    managed::carry_over(&mut replacement, mirror);
    if !mirror["status"].is_null() {
        replacement["status"] = mirror["status"].clone();
    }
    replacement
}

/// A `patches` field of a tenant object naming an object whose host name could
/// also be another object's ([`names::reference_host_name`]: ambiguous, or
/// shortened): the object has no mirror until the field or the object moves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {}", self.detail())]
pub struct AmbiguousReference {
    /// The `patches` path, as configured.
    pub field: String,
    /// The reference, cut to [`MAX_ECHOED`] characters and `…`: the tenant
    /// chooses it, and it is echoed in the answer and the log on every retry.
    pub value: String,
    pub namespace: String,
    pub why: &'static str,
}

impl AmbiguousReference {
    /// What is wrong with the reference, without the field, in the words of
    /// kube-apiserver's field errors (`Invalid value: "<value>": <why>`, quoted
    /// as Go quotes), so that it reads as the tenant API server's own refusals do.
    pub fn detail(&self) -> String {
        let AmbiguousReference {
            value,
            namespace,
            why,
            ..
        } = self;
        format!(
            "Invalid value: {}: in namespace {} the reference cannot be translated to a host name: {why}, \
             so its host name could also be another object's; references need a name without \"-x-\" that \
             does not end in \"-x\", in a namespace without \"-x-\" that neither starts with \"x-\" nor ends \
             in \"-x\", and a host name <name>-x-<namespace>-x-<tenant> of at most 63 characters",
            quoted(value),
            quoted(namespace)
        )
    }
}

/// Most characters of a tenant's reference an [`AmbiguousReference`] repeats:
/// the longest object name Kubernetes accepts.
pub const MAX_ECHOED: usize = 253;

/// `value`, or its first [`MAX_ECHOED`] characters and `…`.
fn echoed(value: &str) -> String {
    match value.char_indices().nth(MAX_ECHOED) {
        Some((cut, _)) => format!("{}…", &value[..cut]),
        None => value.to_owned(),
    }
}

/// The mirror `tenant_object` should have on the host. Status is not part of it.
/// Refused when a reference in it cannot be translated one-to-one.
pub fn desired_mirror(
    ty: &ResolvedType,
    tenant: &str,
    tenant_project: &str,
    host_namespace: &str,
    tenant_object: &Value,
) -> Result<Value, AmbiguousReference> {
    let name = meta(tenant_object, "name");
    let namespace = meta(tenant_object, "namespace");
    let host_name = names::host_name(name, namespace, tenant);
    let identity = MirrorIdentity {
        tenant,
        project: tenant_project,
        name,
        namespace,
        uid: meta(tenant_object, "uid"),
        api_version: &ty.api.api_version,
        kind: &ty.api.kind,
        host_name: &host_name,
        host_namespace,
    };
    let mut labels: Map<String, Value> = tenant_object["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (k, v) in identity.labels() {
        labels.insert(k, Value::String(v));
    }
    let mut annotations: Map<String, Value> = tenant_object["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for k in names::NOT_COPIED {
        annotations.remove(k);
    }
    for (k, v) in identity.annotations() {
        annotations.insert(k, Value::String(v));
    }
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!(ty.api.api_version));
    out.insert("kind".into(), json!(ty.api.kind));
    out.insert(
        "metadata".into(),
        json!({"name": host_name, "namespace": host_namespace, "labels": labels, "annotations": annotations}),
    );
    out.extend(synced_fields(tenant_object));
    let mut out = Value::Object(out);
    for path in &ty.resource.patches {
        if !in_status(path) {
            try_rewrite_strings(&mut out, path, &|s| {
                names::reference_host_name(s, namespace, tenant).map_err(|why| AmbiguousReference {
                    field: path.text.clone(),
                    value: echoed(s),
                    namespace: namespace.to_owned(),
                    why,
                })
            })?;
        }
    }
    managed::record(&mut out, Keys::Labels);
    managed::record(&mut out, Keys::Annotations);
    Ok(out)
}

/// The mirror record of a tenant object, when it was mirrored as this very object: a
/// record carrying another uid was copied from another object (e.g. by
/// `kubectl get -o yaml | kubectl apply`) and says nothing about this one.
pub fn mirror_record(tenant_object: &Value) -> Option<String> {
    let record = annotations(tenant_object).remove(names::MIRROR_UID)?;
    let (tenant_uid, _) = record.split_once('/')?;
    (tenant_uid == meta(tenant_object, "uid")).then_some(record)
}

/// Whether a patch path points into status (translated host → tenant) rather than
/// the fields that flow down (tenant → host).
fn in_status(path: &FieldPath) -> bool {
    matches!(path.steps.first(), Some(PathStep::Key(k)) if k == "status")
}

/// Whether the mirror differs from what it should be: the fields other than metadata
/// and status, and the labels and annotations crproxy sets (others' keys on the
/// mirror do not count, see [`managed`]).
pub fn mirror_differs(desired: &Value, current: &Value) -> bool {
    synced_fields(desired) != synced_fields(current) || managed::metadata_differs(desired, current)
}

/// The tenant's status translated from the mirror's: `patches` under `status` map
/// host names back to tenant names, those [`names::reference_host_name`] would
/// translate there (any other string stays as the host wrote it).
pub fn status_from_mirror(
    ty: &ResolvedType,
    tenant: &str,
    namespace: &str,
    mirror: &Value,
) -> Value {
    let mut status = json!({"status": mirror["status"].clone()});
    for path in &ty.resource.patches {
        if in_status(path) {
            rewrite_strings(&mut status, path, &|s| {
                names::reference_name_of(s, namespace, tenant)
                    .unwrap_or(s)
                    .to_owned()
            });
        }
    }
    status["status"].take()
}

impl ToHost {
    fn tenant_api(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.tenant_client.clone(), namespace, &self.ty.api)
    }

    fn host_api(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.host_client.clone(), &self.host_namespace, &self.ty.api)
    }

    fn observed_host_deletes(&self) -> MutexGuard<'_, HashMap<Key, String>> {
        locks::lock(&self.observed_host_deletes)
    }

    /// Whether this syncer's host watch saw the mirror `mirror_uid` of `key` deleted.
    fn saw_host_delete(&self, key: &Key, mirror_uid: &str) -> bool {
        self.observed_host_deletes().get(key).map(String::as_str) == Some(mirror_uid)
    }

    /// The mirror `mirror_uid` of `key` was seen on the host after its DELETED
    /// event: that event was not its delete (the watch's label selector stopped
    /// matching it, and matches again), so a later loss of that mirror must not
    /// pass for a delete and take the tenant object with it.
    fn forget_host_delete(&self, key: &Key, mirror_uid: &str) {
        let mut observed = self.observed_host_deletes();
        if observed.get(key).map(String::as_str) == Some(mirror_uid) {
            observed.remove(key);
        }
    }

    fn last_writes(&self) -> MutexGuard<'_, HashMap<Key, LastWrite>> {
        locks::lock(&self.last_writes)
    }

    /// Whether `mirror` still holds what this syncer's last write of `desired` left.
    fn as_last_written(&self, key: &Key, desired: &Value, mirror: &Value) -> bool {
        self.last_writes()
            .get(key)
            .is_some_and(|last| last.holds(&LastWrite::of(desired, mirror)))
    }

    fn host_name(&self, key: &Key) -> String {
        names::host_name(&key.name, &key.namespace, &self.tenant)
    }

    /// Whether `mirror` belongs to the tenant object at `key` (any incarnation).
    fn is_ours(&self, key: &Key, mirror: &Value) -> bool {
        names::mirrors(
            mirror,
            &self.tenant,
            &self.tenant_project,
            &key.namespace,
            &key.name,
        )
    }

    fn log(&self, key: &Key, action: &'static str) {
        tracing::info!(
            resource = %self.ty.resource.key,
            direction = "toHost",
            tenant_object = %format!("{}/{}", key.namespace, key.name),
            host_object = %format!("{}/{}", self.host_namespace, self.host_name(key)),
            action,
            "synced"
        );
        self.metrics.synced(&self.ty.resource.key, "toHost", action);
    }

    async fn reconcile_key(&self, key: &Key) -> Result<Outcome, StepError> {
        // Write-through owns the key until the tenant stored its write (or it was
        // rolled back): a mirror without its tenant object is expected meanwhile.
        if self.gate.as_ref().is_some_and(|g| g.is_pending(key)) {
            return Ok(Outcome::Requeue(Duration::from_millis(500)));
        }
        let host_name = self.host_name(key);
        let tenant = self
            .tenant_store
            .get(&ObjectRef::new_with(&key.name, self.ty.api.clone()).within(&key.namespace))
            .map(|o| to_value(&o))
            .transpose()?
            .filter(|t| t["metadata"]["deletionTimestamp"].is_null());
        let mirror = self
            .host_store
            .get(&ObjectRef::new_with(&host_name, self.ty.api.clone()).within(&self.host_namespace))
            .map(|o| to_value(&o))
            .transpose()?;
        too_deep(("tenant", &tenant), ("host", &mirror))?;
        match (tenant, mirror) {
            (None, None) => {
                self.observed_host_deletes().remove(key);
                self.last_writes().remove(key);
                Ok(Outcome::Done)
            }
            (None, Some(mirror)) => self.collect(key, &mirror).await,
            (Some(tenant), None) => self.mirror_missing(key, &tenant).await,
            (Some(tenant), Some(mirror)) => self.update(key, &tenant, &mirror).await,
        }
    }

    /// The tenant object is gone from the cache: delete its mirror once a live read
    /// agrees.
    async fn collect(&self, key: &Key, mirror: &Value) -> Result<Outcome, StepError> {
        if !self.is_ours(key, mirror) {
            return Ok(Outcome::Done);
        }
        if !names::records_project(mirror, &self.tenant_project) {
            // Written before mirrors recorded their project: maybe the orphan of a
            // namesake tenant in another project. Left for an operator.
            return Err(StepError::Foreign);
        }
        let live = self.tenant_api(&key.namespace).get_opt(&key.name).await?;
        let owner_uid = annotations(mirror).get(names::OBJECT_UID).cloned();
        if let Some(live) = live {
            if live.metadata.deletion_timestamp.is_none() && live.metadata.uid == owner_uid {
                // The cache was behind; the tenant object still exists.
                return Ok(Outcome::Requeue(Duration::from_millis(500)));
            }
        }
        self.delete_mirror(key, mirror, "delete_host").await
    }

    async fn delete_mirror(
        &self,
        key: &Key,
        mirror: &Value,
        action: &'static str,
    ) -> Result<Outcome, StepError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(meta(mirror, "uid").to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.host_api().delete(meta(mirror, "name"), &params).await {
            Ok(_) => {}
            Err(e) if is_code(&e, 404) => {}
            Err(e) => return Err(e.into()),
        }
        self.log(key, action);
        Ok(Outcome::Done)
    }

    async fn mirror_missing(&self, key: &Key, tenant: &Value) -> Result<Outcome, StepError> {
        let host_name = self.host_name(key);
        let mut action = "create_host";
        if let Some(mirrored) = mirror_record(tenant) {
            // Mirrored before: the host deleted the mirror, the host lost it, or the
            // cache is behind. A live read tells the last apart; only a DELETED event
            // this syncer saw for that very mirror tells a delete from a loss.
            let mirror_uid = mirrored.split_once('/').map_or("", |(_, m)| m);
            match self.host_api().get_opt(&host_name).await? {
                Some(live) => {
                    let live = to_value(&live)?;
                    // Still there: any DELETED event seen for it was not its delete.
                    self.forget_host_delete(key, meta(&live, "uid"));
                    return self.update(key, tenant, &live).await;
                }
                None if !self.saw_host_delete(key, mirror_uid) => {
                    tracing::warn!(
                        resource = %self.ty.resource.key,
                        direction = "toHost",
                        tenant_object = %format!("{}/{}", key.namespace, key.name),
                        host_object = %format!("{}/{}", self.host_namespace, host_name),
                        mirror_uid,
                        "the host mirror is gone without a delete this syncer saw (the host may have lost its state); creating it again from the tenant object"
                    );
                    action = "recreate_host";
                }
                None => {
                    let live = self.tenant_api(&key.namespace).get_opt(&key.name).await?;
                    let Some(live) = live else {
                        return Ok(Outcome::Done);
                    };
                    if live.metadata.uid.as_deref() != Some(meta(tenant, "uid"))
                        || live
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(names::MIRROR_UID))
                            != Some(&mirrored)
                    {
                        return Ok(Outcome::Requeue(Duration::from_millis(200)));
                    }
                    // Pinned to the version read too: a write-through of this key
                    // may land between the pending check and here (it creates a
                    // new mirror); its update must not be deleted with the object.
                    let api = self.tenant_api(&key.namespace);
                    if !delete_as_read(&api, &key.name, &live.metadata).await? {
                        return Ok(Outcome::Requeue(Duration::from_millis(100)));
                    }
                    self.observed_host_deletes().remove(key);
                    self.log(key, "delete_tenant");
                    return Ok(Outcome::Done);
                }
            }
        }
        let desired = desired_mirror(
            &self.ty,
            &self.tenant,
            &self.tenant_project,
            &self.host_namespace,
            tenant,
        )?;
        let object: DynamicObject = from_value(desired.clone())?;
        match self
            .host_api()
            .create(&PostParams::default(), &object)
            .await
        {
            Ok(created) => {
                self.log(key, action);
                let created = to_value(&created)?;
                self.last_writes()
                    .insert(key.clone(), LastWrite::of(&desired, &created));
                self.remember_mirror(key, tenant, meta(&created, "uid"))
                    .await?;
                if !created["status"].is_null() || !tenant["status"].is_null() {
                    self.status_up(key, tenant, &created).await?;
                }
                Ok(Outcome::Done)
            }
            Err(e) if is_code(&e, 409) => {
                // Someone holds the name: ours (cache behind) or another's.
                let live = name_holder(&self.host_api(), &host_name, e).await?;
                self.update(key, tenant, &to_value(&live)?).await
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn remember_mirror(
        &self,
        key: &Key,
        tenant: &Value,
        mirror_uid: &str,
    ) -> Result<(), StepError> {
        let record = names::mirror_record(meta(tenant, "uid"), mirror_uid);
        if mirror_record(tenant).as_ref() == Some(&record) {
            return Ok(());
        }
        let patch = json!({"metadata": {"annotations": {names::MIRROR_UID: record}}});
        self.tenant_api(&key.namespace)
            .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// [`StepError::Foreign`] for the host object `mirror` under `key`'s mirror
    /// name, logged with `why` it is left alone.
    fn foreign(&self, key: &Key, mirror: &Value, why: &'static str) -> StepError {
        tracing::warn!(
            resource = %self.ty.resource.key,
            direction = "toHost",
            tenant_object = %format!("{}/{}", key.namespace, key.name),
            host_object = %format!("{}/{}", self.host_namespace, meta(mirror, "name")),
            action = "skip",
            "{why}"
        );
        StepError::Foreign
    }

    async fn update(
        &self,
        key: &Key,
        tenant: &Value,
        mirror: &Value,
    ) -> Result<Outcome, StepError> {
        if !self.is_ours(key, mirror) {
            return Err(self.foreign(
                key,
                mirror,
                "a host object with the mirror's name exists and does not belong to this tenant object; leaving it alone",
            ));
        }
        if annotations(mirror)
            .get(names::OBJECT_UID)
            .map(String::as_str)
            != Some(meta(tenant, "uid"))
        {
            // A mirror of an earlier object with the same name, unless our cached
            // tenant object is the old one: the live object decides.
            if mirror["metadata"]["deletionTimestamp"].is_string() {
                // Already being deleted, held by a host controller's finalizer:
                // deleting it again changes nothing, and its removal (a host watch
                // event) brings the key back to create the new object's mirror.
                return Ok(Outcome::Done);
            }
            if !names::records_project(mirror, &self.tenant_project) {
                // Written before mirrors recorded their project: an earlier
                // incarnation's, or a namesake tenant's in another project (or
                // our cache is behind: looked at again, it is replaced).
                return Err(self.foreign(
                    key,
                    mirror,
                    "a host object with the mirror's name records no tenant project and mirrors another object; leaving it alone",
                ));
            }
            let live = self.tenant_api(&key.namespace).get_opt(&key.name).await?;
            let live_uid = live.as_ref().and_then(|l| l.metadata.uid.as_deref());
            if live_uid.is_some()
                && live_uid
                    == annotations(mirror)
                        .get(names::OBJECT_UID)
                        .map(String::as_str)
            {
                return Ok(Outcome::Requeue(Duration::from_millis(200)));
            }
            self.delete_mirror(key, mirror, "delete_stale_host").await?;
            return Ok(Outcome::Requeue(Duration::from_millis(100)));
        }
        let desired = desired_mirror(
            &self.ty,
            &self.tenant,
            &self.tenant_project,
            &self.host_namespace,
            tenant,
        )?;
        let mut mirror = mirror.clone();
        if mirror_differs(&desired, &mirror) && !self.as_last_written(key, &desired, &mirror) {
            let object: DynamicObject = from_value(replacement(&desired, &mirror))?;
            let replaced = self
                .host_api()
                .replace(meta(&mirror, "name"), &PostParams::default(), &object)
                .await?;
            mirror = to_value(&replaced)?;
            self.last_writes()
                .insert(key.clone(), LastWrite::of(&desired, &mirror));
            self.log(key, "update_host");
        }
        self.remember_mirror(key, tenant, meta(&mirror, "uid"))
            .await?;
        self.status_up(key, tenant, &mirror).await?;
        Ok(Outcome::Done)
    }

    /// Copies the mirror's status to the tenant object when they differ.
    async fn status_up(&self, key: &Key, tenant: &Value, mirror: &Value) -> Result<(), StepError> {
        let status = status_from_mirror(&self.ty, &self.tenant, &key.namespace, mirror);
        if status == tenant["status"] {
            return Ok(());
        }
        let api = self.tenant_api(&key.namespace);
        // Re-read so the write carries the latest resourceVersion (the marker patch
        // above may have moved it).
        let Some(live) = api.get_opt(&key.name).await? else {
            return Ok(());
        };
        let mut live = to_value(&live)?;
        if live["metadata"]["uid"] != tenant["metadata"]["uid"] {
            return Ok(());
        }
        live["status"] = status;
        let object: DynamicObject = from_value(live)?;
        if self.ty.status_subresource {
            api.replace_status(&key.name, &PostParams::default(), &object)
                .await?;
        } else {
            api.replace(&key.name, &PostParams::default(), &object)
                .await?;
        }
        self.log(key, "update_tenant_status");
        Ok(())
    }
}

impl Reconciler for ToHost {
    fn resource(&self) -> &ResolvedType {
        &self.ty
    }

    fn metrics(&self) -> &Arc<SyncMetrics> {
        &self.metrics
    }

    fn caches_synced(&self) {
        if let Some(gate) = &self.gate {
            gate.caches_synced(self.tenant_store.clone());
        }
    }

    fn key_of_tenant(&self, object: &DynamicObject) -> Option<Key> {
        Some(Key {
            namespace: object.metadata.namespace.clone()?,
            name: object.metadata.name.clone()?,
        })
    }

    fn host_deleted(&self, object: &DynamicObject) {
        if let (Some(key), Some(uid)) = (self.key_of_host(object), object.metadata.uid.clone()) {
            self.observed_host_deletes().insert(key, uid);
        }
    }

    fn host_seen(&self, object: &DynamicObject) {
        if let (Some(key), Some(uid)) = (self.key_of_host(object), object.metadata.uid.as_deref()) {
            self.forget_host_delete(&key, uid);
        }
    }

    fn key_of_host(&self, object: &DynamicObject) -> Option<Key> {
        let a = object.metadata.annotations.as_ref()?;
        let recorded = a.get(names::TENANT_PROJECT).map(String::as_str);
        if !names::recorded_project_admits(recorded, &self.tenant_project) {
            return None;
        }
        Some(Key {
            namespace: a.get(names::OBJECT_NAMESPACE)?.clone(),
            name: a.get(names::OBJECT_NAME)?.clone(),
        })
    }

    fn all_keys(&self) -> BTreeSet<Key> {
        let mut keys: BTreeSet<Key> = self
            .tenant_store
            .state()
            .iter()
            .filter_map(|o| self.key_of_tenant(o))
            .collect();
        keys.extend(
            self.host_store
                .state()
                .iter()
                .filter_map(|o| self.key_of_host(o)),
        );
        // An object removed from both clusters while a watch was down leaves no
        // event behind, only a relist without it: looked at again, the key finds
        // nothing on either side and its entries go.
        keys.extend(self.observed_host_deletes().keys().cloned());
        keys.extend(self.last_writes().keys().cloned());
        keys
    }

    async fn reconcile(&self, key: &Key) -> Result<Outcome, StepError> {
        self.reconcile_key(key).await
    }
}

pub(crate) fn to_value(object: &DynamicObject) -> Result<Value, StepError> {
    serde_json::to_value(object).map_err(|e| StepError::Encode(e.to_string()))
}

pub(crate) fn from_value(value: Value) -> Result<DynamicObject, StepError> {
    serde_json::from_value(value).map_err(|e| StepError::Encode(e.to_string()))
}

pub(crate) fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Deletes `name` through `api` pinned to the uid and resourceVersion of `read`,
/// a live read of it: `Ok(true)` when it is gone (a 404 too), `Ok(false)` when
/// it changed since the read (409), and the step decides again.
pub(crate) async fn delete_as_read(
    api: &Api<DynamicObject>,
    name: &str,
    read: &kube::api::ObjectMeta,
) -> Result<bool, StepError> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: read.uid.clone(),
            resource_version: read.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(e) if is_code(&e, 404) => Ok(true),
        Err(e) if is_code(&e, 409) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// How many times [`again_on_conflict`] runs a write.
const WRITE_ATTEMPTS: u32 = 3;

/// Runs `write` (a read, a decision on it and a write) again while it fails with
/// an error `conflict` calls a 409: another writer got in between the read and
/// the write, and a fresh read decides again. Three attempts in all.
pub(crate) async fn again_on_conflict<T, E, Fut>(
    mut write: impl FnMut() -> Fut,
    conflict: impl Fn(&E) -> bool,
) -> Result<T, E>
where
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut attempt = 1;
    loop {
        match write().await {
            Err(e) if conflict(&e) && attempt < WRITE_ATTEMPTS => attempt += 1,
            result => return result,
        }
    }
}

/// After a create of `name` was refused with `conflict` (a 409): the object that
/// holds the name, by a live read. Nothing under the name means the 409 was about
/// something else (an admission webhook's, say), so the refusal is the step's
/// error, retried with the queue's backoff and counted as any failure. A read
/// without `get` on the type cannot tell: the refusal stands too.
pub(crate) async fn name_holder(
    api: &Api<DynamicObject>,
    name: &str,
    conflict: kube::Error,
) -> Result<DynamicObject, StepError> {
    match api.get_opt(name).await {
        Ok(Some(holder)) => Ok(holder),
        Ok(None) => Err(conflict.into()),
        Err(read) if is_code(&read, 403) => Err(conflict.into()),
        Err(read) => Err(read.into()),
    }
}

#[cfg(test)]
mod tests;
