use super::*;
use serde_json::json;

fn gr(r: &str) -> GroupResource {
    ("g.io".to_string(), r.to_string())
}

fn put(store: &Store, r: &str, ns: &str, name: &str, v: i64) -> Written {
    store
        .mutate::<()>(&gr(r), ns, name, false, |_| {
            Ok(Mutation::Put(
                json!({"metadata": {"name": name, "namespace": ns}, "v": v}),
            ))
        })
        .expect("put")
}

#[test]
fn every_write_gets_the_next_resource_version() {
    let store = Store::in_memory();
    let start = store.current_rv();
    let a = put(&store, "things", "ns", "a", 1);
    let b = put(&store, "others", "ns", "b", 1);
    let a2 = put(&store, "things", "ns", "a", 2);
    assert!(a.created && !a2.created);
    assert_eq!(object_rv(&a.object), start + 1);
    assert_eq!(object_rv(&b.object), start + 2);
    assert_eq!(object_rv(&a2.object), start + 3);
    assert_eq!(store.current_rv(), start + 3);
}

#[test]
fn dry_run_stores_nothing() {
    let store = Store::in_memory();
    let rv = store.current_rv();
    store
        .mutate::<()>(&gr("things"), "ns", "a", true, |_| {
            Ok(Mutation::Put(json!({"metadata": {"name": "a"}})))
        })
        .expect("dry run");
    assert_eq!(store.current_rv(), rv);
    assert!(store.get(&gr("things"), "ns", "a").is_none());
}

#[test]
fn watch_replays_history_after_the_requested_version_only() {
    let store = Store::in_memory();
    let start = store.current_rv();
    put(&store, "things", "ns", "a", 1);
    put(&store, "things", "ns", "b", 1);
    put(&store, "others", "ns", "x", 1);
    put(&store, "things", "ns", "a", 2);
    let (replay, _rx) = store
        .watch_from(&gr("things"), start + 1)
        .expect("in window");
    let rvs: Vec<u64> = replay.iter().map(|e| e.rv).collect();
    assert_eq!(rvs, vec![start + 2, start + 4]);
    assert_eq!(replay[1].kind, EventType::Modified);
}

#[test]
fn watch_from_before_the_window_is_too_old() {
    let store = Store::in_memory();
    for i in 0..(HISTORY_PER_RESOURCE as i64 + 10) {
        put(&store, "things", "ns", "a", i);
    }
    let err = store.watch_from(&gr("things"), 1).expect_err("too old");
    assert_eq!(err.requested, 1);
    assert!(err.oldest > 1);
    // The newest part of the window is still served.
    let (replay, _) = store
        .watch_from(&gr("things"), store.current_rv() - 5)
        .expect("recent");
    assert_eq!(replay.len(), 5);
    // A quiet resource can be watched from any version since start.
    assert!(store.watch_from(&gr("quiet"), 1).is_ok());
}

#[test]
fn deletes_emit_the_last_state_with_a_new_version() {
    let store = Store::in_memory();
    put(&store, "things", "ns", "a", 1);
    let mut rx = store.subscribe();
    let w = store
        .mutate::<()>(&gr("things"), "ns", "a", false, |_| Ok(Mutation::Delete))
        .expect("delete");
    assert!(w.deleted);
    let ev = rx.try_recv().expect("event");
    assert_eq!(ev.kind, EventType::Deleted);
    assert_eq!(ev.rv, store.current_rv());
    assert_eq!(object_rv(&ev.object), ev.rv);
    assert!(store.get(&gr("things"), "ns", "a").is_none());
}

#[test]
fn objects_and_resource_version_survive_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.redb");
    let rv;
    {
        let store = Store::open(&path).expect("open");
        put(&store, "things", "ns", "a", 1);
        put(&store, "things", "ns2", "b", 2);
        store
            .mutate::<()>(&gr("things"), "ns2", "b", false, |_| Ok(Mutation::Delete))
            .expect("delete");
        rv = store.current_rv();
        store.close();
    }
    let store = Store::open(&path).expect("reopen");
    assert_eq!(store.current_rv(), rv);
    assert!(store.get(&gr("things"), "ns", "a").is_some());
    assert!(store.get(&gr("things"), "ns2", "b").is_none());
    // History before the restart is gone: older versions are too old, current is fine.
    assert!(store.watch_from(&gr("things"), rv - 1).is_err());
    assert!(store.watch_from(&gr("things"), rv).is_ok());
    let (items, _) = store.list(&gr("things"), Some("ns"));
    assert_eq!(items.len(), 1);
}

#[test]
fn optimistic_mutations_retry_when_someone_else_wrote_meanwhile() {
    let store = Store::in_memory();
    put(&store, "things", "ns", "a", 1);
    let mut calls = 0;
    let w = store
        .mutate_optimistic::<()>(&gr("things"), "ns", "a", false, |cur| {
            calls += 1;
            let seen = cur.map(|c| c["v"].as_i64().unwrap_or(0)).unwrap_or(0);
            if calls == 1 {
                // A concurrent writer sneaks in between decide and commit.
                put(&store, "things", "ns", "a", 10);
            }
            Ok(Mutation::Put(
                json!({"metadata": {"name": "a"}, "v": seen + 1}),
            ))
        })
        .expect("mutate");
    assert_eq!(calls, 2, "the first decision was made on a stale object");
    assert_eq!(w.object["v"], 11);
    assert_eq!(store.get(&gr("things"), "ns", "a").expect("a")["v"], 11);
}
