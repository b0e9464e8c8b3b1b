//! The ownership cache against a real target (devcluster over TLS): owned PUT,
//! PATCH and DELETE go out in one exchange when the cache knows the object, and a
//! cache that is stale by the time of the write can only send the request down
//! the checked path, never let it land on an object that is not owned.
//!
//! Each race round first makes the cache hot for its object (a write through the
//! proxy that the cache answered), then races the verb under test against an admin
//! change straight on the target: the owner labels removed, or the object deleted
//! and created again by someone else. Every racing write must have consulted a
//! synced cache (`hit`, `stale`, or `miss` when its watch already saw the admin's
//! change, in `crproxy_ownership_cache_lookups_total`), some must have taken the
//! fast path, and none may touch the object once it is not owned. The rounds
//! sweep the admin's change across the proxy's write; with the pins removed from
//! the fast path, most of these tests fail (PUT excepted: its caller-given
//! resourceVersion already rejects another state).

use crate::target_support;

use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

use crproxy_core::config::AccessMode;
use target_support::{
    harness, json_of, on_target, send, widget, widget_object, Harness, Reply, OWNER_LABELS, WIDGETS,
};

/// Rounds per race test.
const RACE_ROUNDS: usize = 80;

fn owned_labels() -> Value {
    serde_json::from_str(OWNER_LABELS).expect("labels")
}

fn is_owned(object: &Value) -> bool {
    let labels = &object["metadata"]["labels"];
    labels["vcluster.com/owner-vcluster"] == "client"
        && labels["vcluster.com/owner-project"] == "default"
}

fn rv(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// How long the proxy's write and the admin's change each wait in `round`: the
/// rounds sweep the admin's change from 1 ms before to 1 ms after the proxy's
/// write in 50 µs steps, so some land between the cache lookup and the write.
fn stagger(round: usize) -> (Duration, Duration) {
    let offset = (round % 40) as i64 * 50 - 1000;
    let delay = Duration::from_micros(offset.unsigned_abs());
    if offset < 0 {
        (delay, Duration::ZERO)
    } else {
        (Duration::ZERO, delay)
    }
}

/// `crproxy_ownership_cache_lookups_total` for `result`, from the registry.
fn lookups(h: &Harness, result: &str) -> u64 {
    let text = h.metrics.encode();
    text.lines()
        .filter(|line| {
            line.starts_with("crproxy_ownership_cache_lookups_total{")
                && line.contains("group_version=\"example.com/v1\"")
                && line.contains("target=\"default/target\"")
                && line.contains(&format!("result=\"{result}\""))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[derive(Debug, Clone, Copy)]
struct Counts {
    hit: u64,
    stale: u64,
    miss: u64,
    unsynced: u64,
}

fn counts(h: &Harness) -> Counts {
    Counts {
        hit: lookups(h, "hit"),
        stale: lookups(h, "stale"),
        miss: lookups(h, "miss"),
        unsynced: lookups(h, "unsynced"),
    }
}

/// What the counters moved by since `before`.
fn since(h: &Harness, before: Counts) -> Counts {
    let now = counts(h);
    Counts {
        hit: now.hit - before.hit,
        stale: now.stale - before.stale,
        miss: now.miss - before.miss,
        unsynced: now.unsynced - before.unsynced,
    }
}

/// A merge patch of `name` through the proxy, and the cache lookups it counted.
async fn counted_patch(h: &Harness, name: &str) -> (Reply, Counts) {
    let before = counts(h);
    let patched = Write::MergePatch.send(h, name, &Value::Null).await;
    (patched, since(h, before))
}

/// Patches `name` and checks that the write went through without the cache
/// pinning it to a state the target refused; returns how the cache answered.
async fn patched_without_a_stale_pin(h: &Harness, name: &str, round: usize) -> Counts {
    let (patched, moved) = counted_patch(h, name).await;
    assert_eq!(patched.status, 200, "round {round}: {patched:?}");
    assert_eq!(moved.stale, 0, "round {round}: {moved:?}");
    moved
}

/// Creates `name` owned by the client straight on the target, then writes it
/// through the proxy until the cache answers for it (bounded: 10 s), so the next
/// write finds a hot cache. Returns the object as last written.
async fn hot_owned_widget(h: &Harness, name: &str) -> Value {
    h.widgets
        .create(&PostParams::default(), &widget_object(name, owned_labels()))
        .await
        .expect("created");
    let path = format!("{WIDGETS}/{name}");
    for attempt in 0..200 {
        let before = counts(h);
        let warmed = send(
            h,
            "PATCH",
            &path,
            Some("application/merge-patch+json"),
            json!({"metadata": {"annotations": {"warm": attempt.to_string()}}}).to_string(),
        )
        .await;
        assert_eq!(warmed.status, 200, "{}", warmed.body);
        if since(h, before).hit == 1 {
            return warmed.body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the ownership cache never answered for {name}");
}

/// The verbs under test, each writing `replicas: 7` (or deleting).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Write {
    Put,
    MergePatch,
    JsonPatch,
    Apply,
    /// Without a body, as curl sends it: pinned in the query.
    Delete,
    /// With DeleteOptions, as kubectl and client-go send it: pinned in the body.
    DeleteWithOptions,
}

impl Write {
    fn deletes(self) -> bool {
        matches!(self, Write::Delete | Write::DeleteWithOptions)
    }

    async fn send_after(self, delay: Duration, h: &Harness, name: &str, current: &Value) -> Reply {
        tokio::time::sleep(delay).await;
        self.send(h, name, current).await
    }

    async fn send(self, h: &Harness, name: &str, current: &Value) -> Reply {
        let path = format!("{WIDGETS}/{name}");
        match self {
            Write::Put => {
                let mut body = current.clone();
                body["spec"]["replicas"] = json!(7);
                send(h, "PUT", &path, Some("application/json"), body.to_string()).await
            }
            Write::MergePatch => {
                send(
                    h,
                    "PATCH",
                    &path,
                    Some("application/merge-patch+json"),
                    r#"{"spec":{"replicas":7}}"#,
                )
                .await
            }
            Write::JsonPatch => {
                send(
                    h,
                    "PATCH",
                    &path,
                    Some("application/json-patch+json"),
                    r#"[{"op":"replace","path":"/spec/replicas","value":7}]"#,
                )
                .await
            }
            Write::Apply => {
                let body = format!(
                    "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: {name}\n  namespace: demo\nspec:\n  replicas: 7\n"
                );
                send(
                    h,
                    "PATCH",
                    &format!("{path}?fieldManager=tenant&force=true"),
                    Some("application/apply-patch+yaml"),
                    body,
                )
                .await
            }
            Write::Delete => send(h, "DELETE", &path, None, Bytes::new()).await,
            Write::DeleteWithOptions => send(
                h,
                "DELETE",
                &path,
                Some("application/json"),
                r#"{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}"#,
            )
            .await,
        }
    }
}

/// The admin removes the owner labels of `name` after `delay`.
async fn unlabel_after(h: &Harness, name: &str, delay: Duration) -> Option<Value> {
    tokio::time::sleep(delay).await;
    let patch = json!({"metadata": {"labels": {
        "vcluster.com/owner-vcluster": null, "vcluster.com/owner-project": null}}});
    h.widgets
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .ok()
        .map(|object| json_of(&object))
}

/// Someone else deletes `name` after `delay` and creates their own object under
/// the same name; returns it when the create won the name.
async fn recreate_after(h: &Harness, name: &str, delay: Duration) -> Option<Value> {
    tokio::time::sleep(delay).await;
    h.widgets
        .delete(name, &DeleteParams::default())
        .await
        .ok()?;
    h.widgets
        .create(
            &PostParams::default(),
            &widget_object(name, json!({"team": "admin"})),
        )
        .await
        .ok()
        .map(|object| json_of(&object))
}

/// Races `write` against the removal of the owner labels.
async fn race_label_removal(write: Write) {
    let h = harness(AccessMode::Owned).await;
    let mut violations = Vec::new();
    let mut fast = 0;
    for round in 0..RACE_ROUNDS {
        let name = format!("l{round}");
        let current = hot_owned_widget(&h, &name).await;
        let before = counts(&h);
        let (proxy_delay, admin_delay) = stagger(round);
        let (written, unlabelled) = tokio::join!(
            write.send_after(proxy_delay, &h, &name, &current),
            unlabel_after(&h, &name, admin_delay)
        );
        let moved = since(&h, before);
        // The cache was hot when the round began; by the time of the lookup its
        // watch may already have seen the admin's change (a miss).
        assert_eq!(
            (moved.hit + moved.stale + moved.miss, moved.unsynced),
            (1, 0),
            "round {round}: the write consulted a synced cache: {moved:?}"
        );
        fast += moved.hit;
        assert!(
            matches!(written.status, 200 | 201 | 404 | 409),
            "{write:?} round {round}: {written:?}"
        );
        let Some(unlabelled) = unlabelled else {
            // The delete won; the admin had nothing left to unlabel.
            assert!(write.deletes(), "{write:?} round {round}");
            continue;
        };
        match write {
            Write::Delete | Write::DeleteWithOptions => {
                if on_target(&h, &name).await.is_none() {
                    violations.push(name.clone());
                }
            }
            _ => {
                if written.status == 200 && rv(&written.body) > rv(&unlabelled) {
                    violations.push(format!("{name} (answer)"));
                }
                let stored = on_target(&h, &name).await.expect("stored");
                if rv(&stored) > rv(&unlabelled) {
                    violations.push(format!("{name} (stored: {stored})"));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "{write:?} touched an object after its labels were removed: {violations:?}"
    );
    assert!(fast > 0, "{write:?}: no round took the fast path");
    h.proxy.shutdown().await;
}

/// Races `write` against a delete and a create under the same name by someone
/// else.
async fn race_recreate(write: Write) {
    let h = harness(AccessMode::Owned).await;
    let mut violations = Vec::new();
    let mut fast = 0;
    for round in 0..RACE_ROUNDS {
        let name = format!("r{round}");
        let current = hot_owned_widget(&h, &name).await;
        let before = counts(&h);
        let (proxy_delay, admin_delay) = stagger(round);
        let (written, foreign) = tokio::join!(
            write.send_after(proxy_delay, &h, &name, &current),
            recreate_after(&h, &name, admin_delay)
        );
        let moved = since(&h, before);
        // The cache was hot when the round began; by the time of the lookup its
        // watch may already have seen the admin's change (a miss).
        assert_eq!(
            (moved.hit + moved.stale + moved.miss, moved.unsynced),
            (1, 0),
            "round {round}: the write consulted a synced cache: {moved:?}"
        );
        fast += moved.hit;
        let Some(foreign) = foreign else {
            // The proxy's write won the name or removed the object first.
            continue;
        };
        match on_target(&h, &name).await {
            None => violations.push(format!("{name} (foreign object deleted)")),
            Some(stored) => {
                if stored["metadata"]["uid"] == foreign["metadata"]["uid"]
                    && (rv(&stored) != rv(&foreign) || is_owned(&stored))
                {
                    violations.push(format!("{name} (foreign object written: {stored})"));
                }
            }
        }
        if written.status == 200 && written.body["metadata"]["uid"] == foreign["metadata"]["uid"] {
            violations.push(format!("{name} (answer shows the foreign object)"));
        }
    }
    assert!(
        violations.is_empty(),
        "{write:?} touched someone else's object: {violations:?}"
    );
    assert!(fast > 0, "{write:?}: no round took the fast path");
    h.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_put_never_lands_after_the_labels_are_removed() {
    race_label_removal(Write::Put).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_merge_patch_never_lands_after_the_labels_are_removed() {
    race_label_removal(Write::MergePatch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_json_patch_never_lands_after_the_labels_are_removed() {
    race_label_removal(Write::JsonPatch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_apply_never_lands_after_the_labels_are_removed() {
    race_label_removal(Write::Apply).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_delete_never_removes_an_object_whose_labels_were_removed() {
    race_label_removal(Write::Delete).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_delete_with_options_never_removes_an_object_whose_labels_were_removed() {
    race_label_removal(Write::DeleteWithOptions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_put_never_lands_on_an_object_recreated_by_someone_else() {
    race_recreate(Write::Put).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_merge_patch_never_lands_on_an_object_recreated_by_someone_else() {
    race_recreate(Write::MergePatch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_json_patch_never_lands_on_an_object_recreated_by_someone_else() {
    race_recreate(Write::JsonPatch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_apply_never_lands_on_an_object_recreated_by_someone_else() {
    race_recreate(Write::Apply).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_delete_never_removes_an_object_recreated_by_someone_else() {
    race_recreate(Write::Delete).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_delete_with_options_never_removes_an_object_recreated_by_someone_else() {
    race_recreate(Write::DeleteWithOptions).await;
}

/// A write pinned to a cached state that changed meanwhile (still owned) is
/// refused by the target and succeeds through the checked path: the caller never
/// sees the stale cache. The admin's change and the proxy's write are sent at the
/// same moment, so in some rounds the cache has not seen the change yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_cache_entry_costs_a_check_never_the_write() {
    let h = harness(AccessMode::Owned).await;
    let mut stale = 0;
    for round in 0..RACE_ROUNDS {
        let name = format!("s{round}");
        hot_owned_widget(&h, &name).await;
        let before = counts(&h);
        let change = json!({"metadata": {"annotations": {"admin": round.to_string()}}});
        let (params, patch) = (PatchParams::default(), Patch::Merge(&change));
        let admin_change = h.widgets.patch(&name, &params, &patch);
        let (written, changed) = tokio::join!(
            Write::MergePatch.send(&h, &name, &Value::Null),
            admin_change
        );
        changed.expect("admin change");
        assert_eq!(written.status, 200, "round {round}: {written:?}");
        assert_eq!(written.body["spec"]["replicas"], 7);
        let moved = since(&h, before);
        assert_eq!(moved.hit + moved.stale, 1, "round {round}: {moved:?}");
        stale += moved.stale;
    }
    assert!(stale > 0, "no round found the cache stale");
    // The series is exported with the documented labels.
    let text = h.metrics.encode();
    assert!(
        text.contains("# TYPE crproxy_ownership_cache_lookups counter"),
        "{text}"
    );
    h.proxy.shutdown().await;
}

/// Writes answered in a form the cache does not read (YAML here) leave nothing
/// of the object's earlier states in the cache, though the watch still brings
/// them: the next write is a miss (or a hit on the state the watch delivered
/// since), never a pin to a superseded state that the target refuses. Two such
/// writes in a row: the second one's pin (from the cache or the ownership GET)
/// says what it went past.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_answered_in_another_form_leaves_no_stale_entry() {
    let h = harness(AccessMode::Owned).await;
    for round in 0..20 {
        let name = format!("y{round}");
        hot_owned_widget(&h, &name).await;
        for replicas in [3, 4] {
            let request = target_support::as_alice("PATCH", &format!("{WIDGETS}/{name}"))
                .header("accept", "application/yaml")
                .header("content-type", "application/merge-patch+json")
                .body(Bytes::from(format!(
                    r#"{{"spec":{{"replicas":{replicas}}}}}"#
                )))
                .expect("request");
            let answered = target_support::exchange(&h.aggregator, request).await;
            assert_eq!(answered.status, 200, "round {round}: {answered:?}");
        }
        patched_without_a_stale_pin(&h, &name, round).await;
    }
    h.proxy.shutdown().await;
}

/// A status write answers with the object: the next write is pinned to that
/// state. A scale write answers with a Scale, which the cache does not read for
/// a pin: the next write is a miss (or a hit on the state the watch delivered
/// since), never a pin to the state before the scale write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subresource_writes_leave_no_stale_entry() {
    let h = harness(AccessMode::Owned).await;
    for round in 0..20 {
        let name = format!("st{round}");
        hot_owned_widget(&h, &name).await;
        let subresource = |sub: &str, body: Value| {
            let path = format!("{WIDGETS}/{name}/{sub}");
            let h = &h;
            async move {
                let patch = Some("application/merge-patch+json");
                send(h, "PATCH", &path, patch, body.to_string()).await
            }
        };
        let status = subresource("status", json!({"status": {"round": round}})).await;
        assert_eq!(status.status, 200, "round {round}: {status:?}");
        assert_eq!(status.body["status"]["round"], round);
        let moved = patched_without_a_stale_pin(&h, &name, round).await;
        assert_eq!(moved.hit, 1, "round {round}: {moved:?}");
        let scale = subresource("scale", json!({"spec": {"replicas": 5}})).await;
        assert_eq!(scale.status, 200, "round {round}: {scale:?}");
        assert_eq!(scale.body["kind"], "Scale", "round {round}: {scale:?}");
        patched_without_a_stale_pin(&h, &name, round).await;
    }
    h.proxy.shutdown().await;
}

/// An owned deletecollection deletes each object pinned to its listed state and
/// tells the cache, as a single delete does: an object created again under a
/// deleted one's name, straight on the target, is written through the checked
/// path (a miss, or a hit once the watch brought it), never pinned to the
/// incarnation the collection deleted. A dry run leaves the cache as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletecollection_leaves_no_stale_entry() {
    let h = harness(AccessMode::Owned).await;
    for round in 0..20 {
        let name = format!("dc{round}");
        hot_owned_widget(&h, &name).await;
        let rehearsed = send(
            &h,
            "DELETE",
            &format!("{WIDGETS}?dryRun=All"),
            None,
            Bytes::new(),
        )
        .await;
        assert_eq!(rehearsed.status, 200, "round {round}: {rehearsed:?}");
        let moved = patched_without_a_stale_pin(&h, &name, round).await;
        assert_eq!(
            moved.hit, 1,
            "round {round}: a dry run forgot the pin: {moved:?}"
        );
        let swept = send(&h, "DELETE", WIDGETS, None, Bytes::new()).await;
        assert_eq!(swept.status, 200, "round {round}: {swept:?}");
        assert!(
            swept.body["items"]
                .as_array()
                .expect("items")
                .iter()
                .any(|item| item["metadata"]["name"] == name.as_str()),
            "round {round}: {swept:?}"
        );
        h.widgets
            .create(
                &PostParams::default(),
                &widget_object(&name, owned_labels()),
            )
            .await
            .expect("created again by an admin");
        patched_without_a_stale_pin(&h, &name, round).await;
    }
    h.proxy.shutdown().await;
}

/// An object someone else deleted while the cache still knew it: a server-side
/// apply creates it again, labelled, and a patch is the target's 404, exactly as
/// without the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_an_object_deleted_behind_the_caches_back_answer_as_before() {
    let h = harness(AccessMode::Owned).await;
    for round in 0..20 {
        let name = format!("g{round}");
        hot_owned_widget(&h, &name).await;
        h.widgets
            .delete(&name, &DeleteParams::default())
            .await
            .expect("admin deletes");
        let patched = Write::MergePatch.send(&h, &name, &Value::Null).await;
        assert_eq!(patched.status, 404, "round {round}: {patched:?}");
        let applied = Write::Apply.send(&h, &name, &Value::Null).await;
        assert_eq!(applied.status, 201, "round {round}: {applied:?}");
        assert!(is_owned(&applied.body), "{}", applied.body);
        assert_eq!(applied.body["spec"]["replicas"], 7);
    }
    h.proxy.shutdown().await;
}

/// A caller's own uid is its precondition, as kube reads it: a PUT or merge
/// PATCH carrying the uid of an earlier incarnation of an owned object is refused
/// (409, 422) and changes nothing, whether or not the cache has seen the object
/// recreated; the current incarnation's uid writes; a server-side apply carrying
/// one once no object exists is refused (409) and creates nothing. Pinning must
/// not write the checked uid over the caller's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_uid_from_an_earlier_incarnation_is_refused_as_by_kube() {
    let h = harness(AccessMode::Owned).await;
    for round in 0..5 {
        let name = format!("u{round}");
        let earlier = hot_owned_widget(&h, &name).await;
        let earlier_uid = earlier["metadata"]["uid"].clone();
        h.widgets
            .delete(&name, &DeleteParams::default())
            .await
            .expect("admin deletes");
        let current = h
            .widgets
            .create(
                &PostParams::default(),
                &widget_object(&name, owned_labels()),
            )
            .await
            .map(|object| json_of(&object))
            .expect("admin creates it again, owned");
        assert_ne!(current["metadata"]["uid"], earlier_uid);
        let path = format!("{WIDGETS}/{name}");

        let put = unconditional_put(&earlier);
        let before = target_exchanges(&h).await;
        let refused = send(&h, "PUT", &path, Some("application/json"), put).await;
        assert_eq!(refused.status, 409, "round {round}: {refused:?}");
        target_exchanges(&h)
            .await
            .since(before)
            .is_one_write("PUT", round);
        assert!(
            refused.body["message"]
                .as_str()
                .is_some_and(|m| m.contains("Precondition failed: UID in precondition")),
            "round {round}: {refused:?}"
        );

        let patch = json!({"metadata": {"uid": earlier_uid}, "spec": {"replicas": 7}});
        let before = target_exchanges(&h).await;
        let refused = send(
            &h,
            "PATCH",
            &path,
            Some("application/merge-patch+json"),
            patch.to_string(),
        )
        .await;
        assert_eq!(refused.status, 422, "round {round}: {refused:?}");
        target_exchanges(&h)
            .await
            .since(before)
            .is_one_write("PATCH", round);
        let now = on_target(&h, &name).await.expect("still there");
        assert_eq!(now["metadata"]["uid"], current["metadata"]["uid"]);
        assert_eq!(
            now["metadata"]["resourceVersion"], current["metadata"]["resourceVersion"],
            "round {round}: a refused write changed the object"
        );

        // A replacement without a resourceVersion is refused as kube refuses it
        // for a custom resource, after the check, and nothing is written: pinned
        // to the checked state it would overwrite whatever the caller never saw.
        let before = target_exchanges(&h).await;
        let put = unconditional_put(&current);
        let refused = send(&h, "PUT", &path, Some("application/json"), put).await;
        assert_eq!(refused.status, 422, "round {round}: {refused:?}");
        assert_eq!(
            refused.body["message"],
            format!("widgets.example.com \"{name}\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"),
            "round {round}"
        );
        assert_eq!(
            refused.body["details"]["causes"][0]["field"], "metadata.resourceVersion",
            "round {round}"
        );
        // The check (a cache hit falls back to it), and no write.
        let exchanges = target_exchanges(&h).await.since(before);
        assert_eq!(
            exchanges.0.get("GET"),
            Some(&1),
            "round {round}: {exchanges:?}"
        );
        assert_eq!(exchanges.0.len(), 1, "round {round}: {exchanges:?}");
        let now = on_target(&h, &name).await.expect("still there");
        assert_eq!(
            now["metadata"]["resourceVersion"], current["metadata"]["resourceVersion"],
            "round {round}: a refused replacement changed the object"
        );

        // A server-side apply naming a uid applies to that incarnation only:
        // with no object there, kube's patcher refuses it (409 "uid mismatch")
        // and creates nothing, through the proxy as directly, in one check.
        h.widgets
            .delete(&name, &DeleteParams::default())
            .await
            .expect("admin deletes");
        let earlier_uid = earlier_uid.as_str().expect("uid");
        let apply = format!(
            "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: {name}\n  \
             namespace: demo\n  uid: {earlier_uid}\nspec:\n  replicas: 7\n"
        );
        let before = target_exchanges(&h).await;
        let refused = send(
            &h,
            "PATCH",
            &format!("{path}?fieldManager=test"),
            Some("application/apply-patch+yaml"),
            apply,
        )
        .await;
        assert_eq!(refused.status, 409, "round {round}: {refused:?}");
        assert_eq!(
            refused.body["message"],
            format!(
                "Operation cannot be fulfilled on widgets.example.com \"{name}\": uid mismatch: \
                 the provided object specified uid {earlier_uid}, and no existing object was found"
            ),
            "round {round}"
        );
        // kube counts a server-side apply under its own verb.
        target_exchanges(&h)
            .await
            .since(before)
            .is_one_write("APPLY", round);
        assert!(on_target(&h, &name).await.is_none(), "round {round}");
    }
    h.proxy.shutdown().await;
}

/// The target's `apiserver_request_total` for single widgets (scope
/// `resource`), by verb, summed over codes: the exchanges the proxy made.
#[derive(Debug, Default, Clone)]
struct TargetExchanges(std::collections::BTreeMap<String, u64>);

async fn target_exchanges(h: &Harness) -> TargetExchanges {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = h.admin.request_text(request).await.expect("target metrics");
    let mut counts = TargetExchanges::default();
    for line in text.lines().filter(|line| {
        line.starts_with("apiserver_request_total{")
            && line.contains("group=\"example.com\"")
            && line.contains("resource=\"widgets\"")
            && line.contains("scope=\"resource\"")
    }) {
        let verb = line
            .split("verb=\"")
            .nth(1)
            .and_then(|v| v.split('"').next());
        let count = line.rsplit(' ').next().and_then(|n| n.parse::<u64>().ok());
        if let (Some(verb), Some(count)) = (verb, count) {
            *counts.0.entry(verb.to_string()).or_default() += count;
        }
    }
    counts
}

impl TargetExchanges {
    fn since(&self, before: TargetExchanges) -> TargetExchanges {
        let moved = self
            .0
            .iter()
            .map(|(verb, n)| (verb.clone(), n - before.0.get(verb).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        TargetExchanges(moved)
    }

    /// One ownership GET and one write of `verb` after it, plus at most the one
    /// write the cache's fast path sent when it had not yet seen the object
    /// recreated. A refusal for the caller's uid is not sent again, only
    /// judged by one more GET (whether the name still holds the checked state).
    fn is_one_write(&self, verb: &str, round: usize) {
        let get = self.0.get("GET").copied().unwrap_or(0);
        let writes = self.0.get(verb).copied().unwrap_or(0);
        assert_eq!(get, 2, "round {round}: {self:?}");
        assert!((1..=2).contains(&writes), "round {round}: {self:?}");
        assert_eq!(self.0.len(), 2, "round {round}: {self:?}");
    }
}

/// `object` with `replicas: 7` and without a resourceVersion: a PUT whose only
/// precondition is the object's uid, which kube refuses for a custom resource.
fn unconditional_put(object: &Value) -> String {
    let mut put = object.clone();
    put["spec"]["replicas"] = json!(7);
    if let Some(metadata) = put["metadata"].as_object_mut() {
        metadata.remove("resourceVersion");
    }
    put.to_string()
}

/// The cache's list reads every page (2000 objects each): objects that existed
/// before the cache started and were never written through the proxy are hits,
/// an unowned object under the same selector-less collection is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_started_on_many_objects_knows_every_owned_one() {
    let h = harness(AccessMode::Owned).await;
    for i in 0..2100 {
        h.widgets
            .create(
                &PostParams::default(),
                &widget_object(&format!("m{i}"), owned_labels()),
            )
            .await
            .expect("created");
    }
    h.widgets
        .create(
            &PostParams::default(),
            &widget_object("foreign", json!({"team": "admin"})),
        )
        .await
        .expect("created");
    // The first owned write starts the cache; once it answers, it has listed.
    hot_owned_widget(&h, "starter").await;
    for name in ["m0", "m1999", "m2000", "m2099"] {
        let before = counts(&h);
        let deleted = Write::Delete.send(&h, name, &Value::Null).await;
        assert_eq!(deleted.status, 200, "{name}: {deleted:?}");
        assert_eq!(since(&h, before).hit, 1, "{name} was known to the cache");
    }
    let before = counts(&h);
    let foreign = Write::Delete.send(&h, "foreign", &Value::Null).await;
    assert_eq!(foreign.status, 404, "{foreign:?}");
    assert_eq!(since(&h, before).miss, 1);
    assert!(on_target(&h, "foreign").await.is_some());
    h.proxy.shutdown().await;
}

/// Read-your-writes: a create through the proxy followed at once by a patch, a
/// PUT of the created object and a delete all succeed, whatever the cache knew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_followed_at_once_by_writes_succeeds() {
    let h = harness(AccessMode::Owned).await;
    for round in 0..10 {
        let name = format!("c{round}");
        create_through(&h, &widget(&name, json!({}))).await;
        let patched = Write::MergePatch.send(&h, &name, &Value::Null).await;
        assert_eq!(patched.status, 200, "{}", patched.body);
        let mut next = patched.body.clone();
        next["spec"]["replicas"] = json!(8);
        let put = send(
            &h,
            "PUT",
            &format!("{WIDGETS}/{name}"),
            Some("application/json"),
            next.to_string(),
        )
        .await;
        assert_eq!(put.status, 200, "{}", put.body);
        assert_eq!(put.body["spec"]["replicas"], 8);
        let deleted = Write::Delete.send(&h, &name, &Value::Null).await;
        assert_eq!(deleted.status, 200, "{}", deleted.body);
    }
    h.proxy.shutdown().await;
}

/// POST of `object` through the proxy; the answer must be `201 Created`.
async fn create_through(h: &Harness, object: &Value) -> Reply {
    let created = send(
        h,
        "POST",
        WIDGETS,
        Some("application/json"),
        object.to_string(),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    created
}

/// A create through the proxy tells the cache about the object: the write right
/// after it is a hit, one exchange with the target, without waiting for the
/// cache's watch (which reads its events after a pause of 10 ms). A generated
/// name counts as the caller's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_right_after_a_create_takes_one_exchange() {
    let h = harness(AccessMode::Owned).await;
    hot_owned_widget(&h, "starter").await;
    for round in 0..20 {
        let object = if round % 2 == 0 {
            widget(&format!("fresh{round}"), json!({}))
        } else {
            json!({"apiVersion": "example.com/v1", "kind": "Widget",
                   "metadata": {"generateName": "gen-", "namespace": "demo"},
                   "spec": {"replicas": 1}})
        };
        // Counted before the create, so that nothing but the create's answer
        // comes between it and the write (the target's counts leave POST out).
        let before = (counts(&h), target_exchanges(&h).await);
        let created = create_through(&h, &object).await;
        let name = created.body["metadata"]["name"]
            .as_str()
            .expect("a created name")
            .to_string();
        let patched = Write::MergePatch.send(&h, &name, &Value::Null).await;
        assert_eq!(patched.status, 200, "{}", patched.body);
        let lookups = since(&h, before.0);
        assert_eq!(lookups.hit, 1, "round {round} ({name}): {lookups:?}");
        let exchanges = target_exchanges(&h).await.since(before.1);
        assert_eq!(
            exchanges.0,
            [("PATCH".to_string(), 1)].into(),
            "round {round} ({name})"
        );
    }
    h.proxy.shutdown().await;
}

/// A dry-run create leaves nothing behind, in the cache either: a write of its
/// name is checked, and answered as for any object that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_create_is_not_remembered() {
    let h = harness(AccessMode::Owned).await;
    hot_owned_widget(&h, "starter").await;
    let tried = send(
        &h,
        "POST",
        &format!("{WIDGETS}?dryRun=All"),
        Some("application/json"),
        widget("imagined", json!({})).to_string(),
    )
    .await;
    assert_eq!(tried.status, 201, "{}", tried.body);
    // As kube's, the answer of a dry run stored nothing: no resourceVersion to
    // pin a write to, whether or not the proxy read it.
    assert_eq!(
        tried.body["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or(""),
        "",
        "{}",
        tried.body
    );
    let (patched, lookups) = counted_patch(&h, "imagined").await;
    assert_eq!(patched.status, 404, "{}", patched.body);
    assert_eq!(
        (lookups.miss, lookups.hit, lookups.stale),
        (1, 0, 0),
        "{lookups:?}"
    );
    assert!(on_target(&h, "imagined").await.is_none());
    h.proxy.shutdown().await;
}

/// A dry-run delete removes nothing, from the cache either: the next write of the
/// object is still decided from the cache, in one exchange. kube reads a dry run
/// from the query of a delete without a body (curl) and from the body's
/// DeleteOptions otherwise (kubectl's `--dry-run=server`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_delete_leaves_the_object_remembered() {
    let h = harness(AccessMode::Owned).await;
    hot_owned_widget(&h, "kept").await;
    let in_the_body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]});
    for (path, body) in [
        (format!("{WIDGETS}/kept?dryRun=All"), Bytes::new()),
        (
            format!("{WIDGETS}/kept"),
            Bytes::from(in_the_body.to_string()),
        ),
    ] {
        // The last write's own events reach the cache up to a batch pause later;
        // let them land first, so that none can put back an entry a wrong forget
        // dropped.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let content_type = (!body.is_empty()).then_some("application/json");
        let tried = send(&h, "DELETE", &path, content_type, body).await;
        assert_eq!(tried.status, 200, "{path}: {}", tried.body);
        assert!(
            on_target(&h, "kept").await.is_some(),
            "{path}: deleted by a dry run"
        );
        let (patched, lookups) = counted_patch(&h, "kept").await;
        assert_eq!(patched.status, 200, "{path}: {}", patched.body);
        assert_eq!(
            (lookups.hit, lookups.miss, lookups.stale),
            (1, 0, 0),
            "{path}: {lookups:?}"
        );
    }
    h.proxy.shutdown().await;
}

/// A create the caller wants answered as a Table gets the target's Table (the
/// proxy reads only plain JSON objects for the cache; a Table names no object),
/// and the object it made can be written at once. Whether that write is a hit
/// depends on how soon the watch brings the event, so it is not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_answered_as_a_table_gets_the_table() {
    let h = harness(AccessMode::Owned).await;
    hot_owned_widget(&h, "starter").await;
    let request = target_support::as_alice("POST", WIDGETS)
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .header("content-type", "application/json")
        .body(Bytes::from(widget("tabled", json!({})).to_string()))
        .expect("request");
    let created = target_support::exchange(&h.aggregator, request).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["kind"], "Table", "{}", created.body);
    assert_eq!(
        created.body["rows"][0]["object"]["metadata"]["name"], "tabled",
        "{}",
        created.body
    );
    let patched = Write::MergePatch.send(&h, "tabled", &Value::Null).await;
    assert_eq!(patched.status, 200, "{}", patched.body);
    assert_eq!(patched.body["spec"]["replicas"], 7);
    h.proxy.shutdown().await;
}
