use super::*;
use crate::store::{Mutation, Store};
use serde_json::json;

fn put(store: &Store, r: &str, ns: &str, name: &str, app: &str) -> u64 {
    let w = store
        .mutate::<()>(&("g".into(), r.into()), ns, name, false, |_| {
            Ok(Mutation::Put(
                json!({"metadata": {"name": name, "namespace": ns, "labels": {"app": app}}}),
            ))
        })
        .expect("put");
    crate::store::object_rv(&w.object)
}

fn del(store: &Store, r: &str, ns: &str, name: &str) {
    store
        .mutate::<()>(&("g".into(), r.into()), ns, name, false, |_| {
            Ok(Mutation::Delete)
        })
        .expect("delete");
}

fn spec(start: Start, bookmarks: bool, timeout_s: u64, app: Option<&'static str>) -> WatchSpec {
    WatchSpec {
        group: "g".into(),
        resource: "things".into(),
        namespace: Some("ns".into()),
        start,
        allow_bookmarks: bookmarks,
        timeout: Duration::from_secs(timeout_s),
        api_version: "g/v1".into(),
        kind: "Thing".into(),
        list_kind: "ThingList".into(),
        filter: Arc::new(move |o: &Value| match app {
            Some(a) => o["metadata"]["labels"]["app"] == a,
            None => true,
        }),
        render: Arc::new(|o: &Value, out: &mut Vec<u8>| write_value(out, o)),
        render_is_identity: false,
    }
}

/// Reads events until the stream ends or `max` arrive (bounded by paused time).
async fn collect(rx: &mut mpsc::Receiver<Bytes>, max: usize) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    while out.len() < max {
        match tokio::time::timeout(Duration::from_secs(600), rx.recv()).await {
            Ok(Some(b)) => {
                let v: Value = serde_json::from_slice(&b).expect("json line");
                out.push((
                    v["type"].as_str().unwrap_or("").to_string(),
                    v["object"].clone(),
                ));
            }
            _ => break,
        }
    }
    out
}

fn types(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(t, _)| t.as_str()).collect()
}

#[tokio::test(start_paused = true)]
async fn current_state_then_live_events_in_order() {
    let store = Arc::new(Store::in_memory());
    put(&store, "things", "ns", "existing", "cron");
    put(&store, "things", "other", "elsewhere", "cron");
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let mut rx = start(
        store.clone(),
        spec(Start::CurrentState, false, 30, None),
        stop,
    );
    let first = collect(&mut rx, 1).await;
    assert_eq!(types(&first), vec!["ADDED"]);
    put(&store, "things", "ns", "watched", "cron");
    put(&store, "things", "ns", "watched", "cron2");
    del(&store, "things", "ns", "watched");
    let rest = collect(&mut rx, 3).await;
    assert_eq!(types(&rest), vec!["ADDED", "MODIFIED", "DELETED"]);
    let rvs: Vec<u64> = rest
        .iter()
        .map(|(_, o)| crate::store::object_rv(o))
        .collect();
    assert!(rvs.windows(2).all(|w| w[0] < w[1]), "{rvs:?}");
    assert_eq!(
        rvs[2],
        store.current_rv(),
        "DELETED carries the deletion's version"
    );
}

#[tokio::test(start_paused = true)]
async fn resuming_from_a_version_replays_without_loss_or_duplicates() {
    let store = Arc::new(Store::in_memory());
    let rv1 = put(&store, "things", "ns", "a", "x");
    put(&store, "things", "ns", "b", "x");
    put(&store, "things", "ns", "a", "y");
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let mut rx = start(store.clone(), spec(Start::From(rv1), false, 30, None), stop);
    put(&store, "things", "ns", "c", "x");
    let events = collect(&mut rx, 3).await;
    assert_eq!(types(&events), vec!["ADDED", "MODIFIED", "ADDED"]);
    let names: Vec<&str> = events
        .iter()
        .map(|(_, o)| o["metadata"]["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, vec!["b", "a", "c"]);
}

#[tokio::test(start_paused = true)]
async fn a_version_before_the_window_gets_one_expired_error() {
    let store = Arc::new(Store::in_memory());
    for i in 0..(crate::store::HISTORY_PER_RESOURCE + 2) {
        put(&store, "things", "ns", "a", &format!("v{i}"));
    }
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let mut rx = start(store.clone(), spec(Start::From(1), false, 30, None), stop);
    let events = collect(&mut rx, 5).await;
    assert_eq!(types(&events), vec!["ERROR"]);
    assert_eq!(events[0].1["code"], 410);
    assert_eq!(events[0].1["reason"], "Expired");
    assert!(events[0].1["message"]
        .as_str()
        .unwrap_or("")
        .starts_with("too old resource version: 1 ("));
}

#[tokio::test(start_paused = true)]
async fn objects_leaving_the_selector_are_deleted_for_the_watcher() {
    let store = Arc::new(Store::in_memory());
    put(&store, "things", "ns", "a", "cron");
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let mut rx = start(
        store.clone(),
        spec(Start::CurrentState, false, 30, Some("cron")),
        stop,
    );
    let first = collect(&mut rx, 1).await;
    put(&store, "things", "ns", "a", "other");
    put(&store, "things", "ns", "a", "cron");
    put(&store, "things", "ns", "b", "other");
    put(&store, "things", "ns", "a", "cron");
    let events = collect(&mut rx, 3).await;
    assert_eq!(types(&first), vec!["ADDED"]);
    assert_eq!(types(&events), vec!["DELETED", "ADDED", "MODIFIED"]);
}

#[tokio::test(start_paused = true)]
async fn bookmarks_only_when_the_version_moved_and_the_watch_times_out() {
    let store = Arc::new(Store::in_memory());
    let rv = put(&store, "things", "ns", "a", "x");
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let mut idle = start(
        store.clone(),
        spec(Start::From(rv), true, 3, None),
        stop.clone(),
    );
    let events = collect(&mut idle, 10).await;
    assert!(events.is_empty(), "idle watch got {events:?}");

    let mut busy = start(store.clone(), spec(Start::From(rv), true, 3, None), stop);
    tokio::task::yield_now().await;
    let other_rv = put(&store, "others", "ns", "z", "x");
    let events = collect(&mut busy, 10).await;
    assert_eq!(types(&events), vec!["BOOKMARK"]);
    assert_eq!(
        events[0].1["metadata"]["resourceVersion"],
        other_rv.to_string()
    );
}

#[tokio::test(start_paused = true)]
async fn watch_list_ends_initial_events_with_an_annotated_bookmark() {
    let store = Arc::new(Store::in_memory());
    put(&store, "things", "ns", "a", "x");
    let rv = put(&store, "things", "ns", "b", "x");
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let mut rx = start(
        store.clone(),
        spec(Start::InitialEvents, true, 30, None),
        stop.clone(),
    );
    let events = collect(&mut rx, 3).await;
    assert_eq!(types(&events), vec!["ADDED", "ADDED", "BOOKMARK"]);
    let meta = &events[2].1["metadata"];
    assert_eq!(meta["resourceVersion"], rv.to_string());
    assert_eq!(meta["annotations"]["k8s.io/initial-events-end"], "true");
    let blueprint = base64::engine::general_purpose::STANDARD
        .decode(
            meta["annotations"]["kubernetes.io/initial-events-list-blueprint"]
                .as_str()
                .unwrap_or(""),
        )
        .expect("base64");
    assert_eq!(
        String::from_utf8_lossy(&blueprint),
        "{\"apiVersion\":\"g/v1\",\"items\":[],\"kind\":\"ThingList\"}\n"
    );
    // Without bookmarks the initial events simply end.
    let mut plain = start(
        store.clone(),
        spec(Start::InitialEvents, false, 1, None),
        stop,
    );
    assert_eq!(types(&collect(&mut plain, 5).await), vec!["ADDED", "ADDED"]);
}

#[tokio::test(start_paused = true)]
async fn a_watch_ends_when_its_client_goes_away() {
    let store = Arc::new(Store::in_memory());
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let before = store.subscriber_count();
    let rx = start(
        store.clone(),
        spec(Start::CurrentState, false, 1800, None),
        stop,
    );
    tokio::task::yield_now().await;
    drop(rx);
    // The task notices without any event arriving and drops its subscription.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(store.subscriber_count(), before);
}

#[tokio::test(start_paused = true)]
async fn shared_serialization_sends_the_same_events() {
    let store = Arc::new(Store::in_memory());
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let mut identity = spec(Start::CurrentState, false, 30, None);
    identity.render_is_identity = true;
    let mut shared = start(store.clone(), identity, stop.clone());
    let mut rendered = start(
        store.clone(),
        spec(Start::CurrentState, false, 30, None),
        stop,
    );
    tokio::task::yield_now().await;
    let obj = json!({"apiVersion": "g/v1", "kind": "Thing", "metadata": {"name": "a", "namespace": "ns"}});
    store
        .mutate::<()>(&("g".into(), "things".into()), "ns", "a", false, |_| {
            Ok(Mutation::Put(obj.clone()))
        })
        .expect("put");
    let a = collect(&mut shared, 1).await;
    let b = collect(&mut rendered, 1).await;
    assert_eq!(a, b);
    assert_eq!(types(&a), vec!["ADDED"]);
    assert_eq!(a[0].1["metadata"]["name"], "a");
}

#[test]
fn an_event_line_is_type_then_object_and_a_newline() {
    let text = line("MODIFIED", &json!({"metadata": {"name": "a"}}));
    assert_eq!(
        &text[..],
        b"{\"type\":\"MODIFIED\",\"object\":{\"metadata\":{\"name\":\"a\"}}}\n"
    );
}
