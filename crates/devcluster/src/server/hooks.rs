//! What kube's controllers would do after a write, done inline: CRDs become served
//! and Established, terminating namespaces are emptied and removed, and the
//! garbage collector's `foregroundDeletion`/`orphan` finalizers are released (no
//! object here tracks dependents, so there is nothing to wait for).

use super::objects::{self as o, metadata_mut};
use super::rest::ReqCtx;
use super::State;
use crate::error::ApiError;
use crate::registry::GroupResource;
use crate::store::{meta_str, Mutation, Written};
use crproxy_core::locks;
use http::Response;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

fn crd_gr() -> GroupResource {
    (
        "apiextensions.k8s.io".to_string(),
        "customresourcedefinitions".to_string(),
    )
}

fn ns_gr() -> GroupResource {
    (String::new(), "namespaces".to_string())
}

/// Runs after every successful (non-dry-run) write through the REST verbs.
pub fn after_write(state: &Arc<State>, ctx: &ReqCtx, written: &Written) {
    if ctx.dry_run() {
        return;
    }
    let gr = ctx.gr();
    if gr == crd_gr() {
        crd_changed(state, &written.object, written.deleted);
        return;
    }
    let has_owners = written
        .object
        .get("metadata")
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if has_owners {
        state
            .owners_seen
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if written.deleted {
        collect_dependents(state, &written.object);
    }
    if gr == ns_gr() && o::is_deleting(&written.object) && !written.deleted {
        spawn_namespace_cleanup(state.clone(), meta_str(&written.object, "name").to_string());
    }
    if !written.deleted && o::is_deleting(&written.object) {
        let holds_gc = written
            .object
            .get("metadata")
            .and_then(|m| m.get("finalizers"))
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|f| f == "foregroundDeletion" || f == "orphan"));
        if holds_gc {
            spawn_gc_release(
                state.clone(),
                gr,
                meta_str(&written.object, "namespace").to_string(),
                meta_str(&written.object, "name").to_string(),
            );
        }
    }
}

/// The garbage collector's background propagation: objects owned by a deleted
/// object lose that owner reference, and are deleted when it was their last.
pub fn collect_dependents(state: &Arc<State>, deleted: &Value) {
    if !state.owners_seen.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let uid = meta_str(deleted, "uid").to_string();
    let ns = meta_str(deleted, "namespace").to_string();
    if uid.is_empty() {
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        // Deleted dependents may own objects too: work through a queue.
        let mut queue = vec![(uid, ns)];
        let mut budget = 100_000usize;
        while let Some((owner, ns)) = queue.pop() {
            let scope = (!ns.is_empty()).then_some(ns.as_str());
            for (gr, dns, name) in state.store.dependents_of(&owner, scope) {
                budget = budget.saturating_sub(1);
                if budget == 0 {
                    return;
                }
                let written = state
                    .store
                    .mutate::<ApiError>(&gr, &dns, &name, false, |cur| {
                        let Some(cur) = cur else {
                            return Ok(Mutation::Unchanged(Arc::new(Value::Null)));
                        };
                        let mut new = (**cur).clone();
                        let mut remaining = 0;
                        if let Some(meta) = metadata_mut(&mut new) {
                            if let Some(refs) = meta
                                .get_mut("ownerReferences")
                                .and_then(Value::as_array_mut)
                            {
                                refs.retain(|r| {
                                    r.get("uid").and_then(Value::as_str) != Some(&owner)
                                });
                                remaining = refs.len();
                            }
                            if remaining == 0 {
                                meta.remove("ownerReferences");
                            }
                        }
                        if remaining > 0 {
                            return Ok(Mutation::Put(new));
                        }
                        if !o::has_finalizers(&new) {
                            return Ok(Mutation::Delete);
                        }
                        if !o::is_deleting(&new) {
                            if let Some(meta) = metadata_mut(&mut new) {
                                meta.insert("deletionTimestamp".into(), json!(o::now()));
                                meta.insert("deletionGracePeriodSeconds".into(), json!(0));
                            }
                        }
                        Ok(Mutation::Put(new))
                    });
                if let Ok(w) = written {
                    if w.deleted {
                        queue.push((meta_str(&w.object, "uid").to_string(), dns.clone()));
                    }
                }
            }
        }
    });
}

/// Serves (or stops serving) a CRD's resource and marks it Established.
pub fn crd_changed(state: &Arc<State>, crd: &Value, deleted: bool) {
    let name = meta_str(crd, "name").to_string();
    if deleted {
        if let Some(info) = state.registry.remove_crd(&name) {
            // Deleting a CRD deletes its objects.
            let gr = (info.group.clone(), info.resource.clone());
            let (items, _) = state.store.list(&gr, None);
            for obj in items {
                let _ = state.store.mutate::<ApiError>(
                    &gr,
                    meta_str(&obj, "namespace"),
                    meta_str(&obj, "name"),
                    false,
                    |_| Ok(Mutation::Delete),
                );
            }
        }
        state.discovery_changed();
        return;
    }
    if o::is_deleting(crd) {
        return;
    }
    match crate::crd::resource_info(crd) {
        Some(info) => state.registry.put_crd(info),
        None => {
            state.registry.remove_crd(&name);
        }
    }
    state.discovery_changed();
    if !crate::crd::is_established(crd) {
        // kube answers the POST before its controllers accept the names; do the
        // same, a moment later.
        let state = state.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = o::now();
            let _ = state
                .store
                .mutate::<ApiError>(&crd_gr(), "", &name, false, |cur| match cur {
                    Some(cur) if !crate::crd::is_established(cur) && !o::is_deleting(cur) => {
                        let mut new = crate::crd::established(cur, &now);
                        crate::patch::update_managed_fields(
                            Some(cur),
                            &mut new,
                            "kube-apiserver",
                            "Update",
                            "apiextensions.k8s.io/v1",
                            Some("status"),
                            &now,
                        );
                        Ok(Mutation::Put(new))
                    }
                    Some(cur) => Ok(Mutation::Unchanged(cur.clone())),
                    None => Ok(Mutation::Unchanged(Arc::new(Value::Null))),
                });
        });
    }
}

/// Registers every stored CRD (at start).
pub fn load_crds(state: &Arc<State>) {
    let (mut crds, _) = state.store.list(&crd_gr(), None);
    crds.sort_by(|a, b| {
        (meta_str(a, "creationTimestamp"), meta_str(a, "name"))
            .cmp(&(meta_str(b, "creationTimestamp"), meta_str(b, "name")))
    });
    for crd in crds {
        if let Some(info) = crate::crd::resource_info(&crd) {
            state.registry.put_crd(info);
        }
    }
    state.discovery_changed();
}

/// Resumes cleanup of namespaces that were terminating when the server stopped.
pub fn resume_namespace_cleanup(state: &Arc<State>) {
    let (all, _) = state.store.list(&ns_gr(), None);
    for ns in all.iter().filter(|n| o::is_deleting(n)) {
        spawn_namespace_cleanup(state.clone(), meta_str(ns, "name").to_string());
    }
}

fn spawn_gc_release(state: Arc<State>, gr: GroupResource, ns: String, name: String) {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut foreground = false;
        let released = state
            .store
            .mutate::<ApiError>(&gr, &ns, &name, false, |cur| {
                let Some(cur) = cur else {
                    return Ok(Mutation::Unchanged(Arc::new(Value::Null)));
                };
                let mut new = (**cur).clone();
                if let Some(meta) = metadata_mut(&mut new) {
                    if let Some(a) = meta.get_mut("finalizers").and_then(Value::as_array_mut) {
                        foreground = a.iter().any(|f| f == "foregroundDeletion");
                        a.retain(|f| f != "foregroundDeletion" && f != "orphan");
                        if a.is_empty() {
                            meta.remove("finalizers");
                        }
                    }
                }
                // A namespace also waits for its own finalizers (the namespace
                // controller removes its content first).
                if o::may_go(&new, gr == ns_gr()) {
                    return Ok(Mutation::Delete);
                }
                Ok(Mutation::Put(new))
            });
        // Foreground deletion removes the dependents too (orphaning keeps them).
        if let Ok(w) = &released {
            if w.deleted && foreground {
                collect_dependents(&state, &w.object);
            }
        }
    });
}

/// How long a deleted namespace stays Terminating, its contents in place, before
/// the namespace controller empties and removes it: kube-controller-manager's
/// controller acts a moment later too, from its informer.
const NAMESPACE_CLEANUP_DELAY: Duration = Duration::from_millis(100);

/// The namespace controller: delete everything in the namespace, wait for
/// finalizers, then remove the namespace.
fn spawn_namespace_cleanup(state: Arc<State>, ns: String) {
    if !state
        .namespace_controller
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        return;
    }
    {
        let mut running = locks::lock(&state.ns_cleanups);
        if !running.insert(ns.clone()) {
            return;
        }
    }
    tokio::spawn(async move {
        let mut shutdown = state.shutdown.clone();
        tokio::time::sleep(NAMESPACE_CLEANUP_DELAY).await;
        while let Some(current) = state.store.get(&ns_gr(), "", &ns) {
            if !o::is_deleting(&current) {
                break;
            }
            let contents = state.store.objects_in_namespace(&ns);
            for (gr, name) in &contents {
                let _ = state.store.mutate::<ApiError>(gr, &ns, name, false, |cur| {
                    let Some(cur) = cur else {
                        return Ok(Mutation::Unchanged(Arc::new(Value::Null)));
                    };
                    if !o::has_finalizers(cur) {
                        return Ok(Mutation::Delete);
                    }
                    if o::is_deleting(cur) {
                        return Ok(Mutation::Unchanged(cur.clone()));
                    }
                    let mut new = (**cur).clone();
                    if let Some(meta) = metadata_mut(&mut new) {
                        meta.insert("deletionTimestamp".into(), json!(o::now()));
                        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
                    }
                    Ok(Mutation::Put(new))
                });
            }
            let aggregated_gone = super::aggregated::empty_aggregated_resources(&state, &ns).await;
            if aggregated_gone
                && (contents.is_empty() || state.store.objects_in_namespace(&ns).is_empty())
            {
                // Finalized, as kube's controller does through /finalize: the
                // namespace goes now unless finalizers of its own metadata hold
                // it, Terminating and empty, until their owners remove them.
                let _ = state
                    .store
                    .mutate::<ApiError>(&ns_gr(), "", &ns, false, |cur| match cur {
                        Some(cur) if o::is_deleting(cur) => {
                            let mut finalized = Value::clone(cur);
                            o::set_namespace_finalizers(&mut finalized, None);
                            if o::may_go(&finalized, true) {
                                Ok(Mutation::Delete)
                            } else if o::namespace_finalized(cur) {
                                // Finalized before: nothing to write again.
                                Ok(Mutation::Unchanged(cur.clone()))
                            } else {
                                Ok(Mutation::Put(finalized))
                            }
                        }
                        Some(cur) => Ok(Mutation::Unchanged(cur.clone())),
                        None => Ok(Mutation::Unchanged(Arc::new(Value::Null))),
                    });
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = shutdown.changed() => break,
            }
        }
        locks::lock(&state.ns_cleanups).remove(&ns);
    });
}

/// `PUT /api/v1/namespaces/<name>/finalize`: sets `spec.finalizers`; a terminating
/// namespace with none left is removed.
pub fn finalize_namespace(
    state: &Arc<State>,
    ctx: &ReqCtx,
    body: Value,
) -> Result<Response<super::http::Body>, ApiError> {
    let finalizers = body
        .get("spec")
        .and_then(|s| s.get("finalizers"))
        .cloned()
        .unwrap_or_else(|| json!([]));
    let mut previous_rv: Option<String> = None;
    let written = state
        .store
        .mutate(&ns_gr(), "", &ctx.name, ctx.dry_run(), |cur| {
            let Some(cur) = cur else {
                return Err(ApiError::not_found("", "namespaces", &ctx.name));
            };
            previous_rv = Some(meta_str(cur, "resourceVersion").to_string());
            let mut new = Value::clone(cur);
            o::set_namespace_finalizers(&mut new, Some(finalizers.clone()));
            if o::may_go(&new, true) {
                return Ok(Mutation::Delete);
            }
            Ok(Mutation::Put(new))
        })?;
    let mut obj = (*written.object).clone();
    if written.deleted {
        // kube answers with the finalized object as it was just before removal.
        if let Some(prev) = &previous_rv {
            crate::store::set_rv(&mut obj, prev.parse().unwrap_or(0));
        }
        if let Some(m) = obj.as_object_mut() {
            m.insert("spec".into(), json!({}));
        }
    }
    Ok(super::http::json_response(200, &obj))
}
