use super::meta::ObjectMeta;
use super::*;
use crproxy_core::skim::{Skim, SkimError};

fn owner() -> Owner {
    Owner::new("client", "proj")
}

fn pin(uid: &str, rv: &str) -> Pin {
    Pin {
        uid: uid.into(),
        resource_version: rv.into(),
    }
}

fn event(line: &str) -> Event<'_> {
    Event::decode(line.as_bytes()).expect("event")
}

/// Reads a whole text that is one `metadata` object.
fn metadata(text: &str) -> Result<ObjectMeta<'_>, SkimError> {
    let mut skim = Skim::new(text);
    let meta = ObjectMeta::read(&mut skim)?;
    skim.end().map(|()| meta)
}

const OWNED: &str =
    r#""labels":{"vcluster.com/owner-vcluster":"client","vcluster.com/owner-project":"proj"}"#;

fn owned_pin(metadata_text: &str) -> Option<Pin> {
    let meta = metadata(metadata_text).expect("metadata");
    meta.owned_pin(&owner())
}

#[test]
fn only_states_carrying_both_owner_labels_are_pins() {
    let owned = format!(r#"{{"name":"a","uid":"u","resourceVersion":"3",{OWNED}}}"#);
    assert_eq!(owned_pin(&owned), Some(pin("u", "3")));
    let half = r#"{"name":"a","uid":"u","resourceVersion":"3","labels":{"vcluster.com/owner-vcluster":"client"}}"#;
    assert_eq!(owned_pin(half), None);
    let other = format!(
        r#"{{"name":"a","uid":"u","resourceVersion":"3",{}}}"#,
        OWNED.replace("proj", "other")
    );
    assert_eq!(owned_pin(&other), None);
    let no_uid = format!(r#"{{"name":"a","resourceVersion":"3",{OWNED}}}"#);
    assert_eq!(owned_pin(&no_uid), None);
}

#[test]
fn labels_are_read_as_a_parsed_document_would_read_them() {
    // Escapes in keys and values decode before they are compared.
    let escaped = r#"{"uid":"\u0075","resourceVersion":"3","labels":{"vcluster.com\/owner-vcluster":"cli\u0065nt","vcluster.com/owner-project":"proj"}}"#;
    assert_eq!(owned_pin(escaped), Some(pin("u", "3")));
    // A key given twice counts with its last value, either way round.
    let overridden = r#"{"uid":"u","resourceVersion":"3","labels":{"vcluster.com/owner-project":"proj","vcluster.com/owner-vcluster":"client","vcluster.com/owner-vcluster":"intruder"}}"#;
    assert_eq!(owned_pin(overridden), None);
    let restored = r#"{"uid":"u","resourceVersion":"3","labels":{"vcluster.com/owner-project":"proj","vcluster.com/owner-vcluster":"intruder","vcluster.com/owner-vcluster":"client"}}"#;
    assert_eq!(owned_pin(restored), Some(pin("u", "3")));
    // Other labels are not read, whatever their values; an owner label that is no
    // string makes the metadata undecodable.
    let others = r#"{"uid":"u","resourceVersion":"3","labels":{"a":{"b":[1]},"vcluster.com/owner-vcluster":"client","vcluster.com/owner-project":"proj"}}"#;
    assert_eq!(owned_pin(others), Some(pin("u", "3")));
    let not_a_string = r#"{"uid":"u","resourceVersion":"3","labels":{"vcluster.com/owner-vcluster":1,"vcluster.com/owner-project":"proj"}}"#;
    assert!(metadata(not_a_string).is_err());
}

#[test]
fn a_late_event_never_replaces_a_newer_state_of_the_object_under_the_name() {
    let mut state = State::default();
    state.record("ns/a".into(), pin("u", "10"));
    state.record("ns/a".into(), pin("u", "9"));
    assert_eq!(state.pins["ns/a"], pin("u", "10"));
    state.record("ns/a".into(), pin("u", "11"));
    assert_eq!(state.pins["ns/a"], pin("u", "11"));
    // A later incarnation (deleted and created again) replaces it; a late event
    // of the deleted one does not replace its successor.
    state.record("ns/a".into(), pin("v", "20"));
    assert_eq!(state.pins["ns/a"], pin("v", "20"));
    state.record("ns/a".into(), pin("u", "12"));
    assert_eq!(state.pins["ns/a"], pin("v", "20"));
}

/// States a write went past (answered in YAML, say, or deleted) never become
/// pins again, from the watch or a list: a pin to one is sure to be refused.
#[test]
fn a_state_written_past_never_becomes_a_pin_again() {
    let mut state = State::default();
    // Known at 10 (a write's answer, ahead of the watch), then written again
    // unpinned: 10 is superseded, and its late event is not taken.
    state.record_answer("ns/a".into(), pin("u", "10"), None);
    state.supersede("ns/a", None);
    assert!(state.pins.is_empty());
    state.record("ns/a".into(), pin("u", "9"));
    state.record("ns/a".into(), pin("u", "10"));
    assert!(state.pins.is_empty(), "{:?}", state.pins);
    state.record("ns/a".into(), pin("u", "12"));
    assert_eq!(state.pins["ns/a"], pin("u", "12"));
    // The entry lasts until the watch's read is over.
    assert_eq!(state.superseded["ns/a"], "10");
    state.watched_to("12");
    assert!(state.superseded.is_empty());
    // A write pinned to a state later than the one known supersedes that state.
    state.supersede("ns/a", Some(&pin("u", "14")));
    state.record("ns/a".into(), pin("u", "13"));
    state.record("ns/a".into(), pin("u", "14"));
    assert!(state.pins.is_empty(), "{:?}", state.pins);
    // A known state later than the pin goes too (a JSON patch's pin does not say
    // which state the write found).
    state.record("ns/a".into(), pin("u", "16"));
    state.supersede("ns/a", Some(&pin("u", "15")));
    state.record("ns/a".into(), pin("u", "16"));
    assert!(state.pins.is_empty(), "{:?}", state.pins);
    // A late answer of an earlier write, at the superseded state, ends nothing.
    state.record_answer("ns/a".into(), pin("u", "16"), Some(&pin("u", "12")));
    assert!(state.pins.is_empty(), "{:?}", state.pins);
    // A write that changed nothing answers with the very state it was pinned
    // to: current, whatever the cache thought.
    state.record_answer("ns/a".into(), pin("u", "16"), Some(&pin("u", "16")));
    assert_eq!(state.pins["ns/a"], pin("u", "16"));
    assert!(state.superseded.is_empty());
    // An answer later than the superseded state ends it.
    state.supersede("ns/a", None);
    state.record_answer("ns/a".into(), pin("u", "17"), Some(&pin("u", "16")));
    assert_eq!(state.pins["ns/a"], pin("u", "17"));
    assert!(state.superseded.is_empty());
    // Nothing known and no pin: nothing to supersede. A pin alone is enough.
    state.supersede("ns/b", None);
    assert!(state.superseded.is_empty());
    state.supersede("ns/b", Some(&pin("v", "3")));
    state.record("ns/b".into(), pin("v", "3"));
    assert!(!state.pins.contains_key("ns/b"));
    // Two writes, told in the other order: the later state stays superseded.
    state.supersede("ns/b", Some(&pin("v", "20")));
    state.supersede("ns/b", Some(&pin("v", "14")));
    state.record("ns/b".into(), pin("v", "17"));
    assert!(!state.pins.contains_key("ns/b"));
    // Versions that are not numbers cannot be ordered: a new one is taken.
    state.record("ns/c".into(), pin("w", "x"));
    state.supersede("ns/c", None);
    state.record("ns/c".into(), pin("w", "y"));
    assert_eq!(state.pins["ns/c"], pin("w", "y"));
    // Superseded, such a version ends at the watch's next read; a later number
    // stays.
    state.supersede("ns/c", None);
    state.watched_to("15");
    assert_eq!(
        state.superseded,
        HashMap::from([("ns/b".to_string(), "20".to_string())])
    );
}

#[test]
fn superseded_states_are_bounded() {
    let mut state = State::default();
    for i in 0..MAX_OBJECTS {
        state.supersede(&format!("ns/{i}"), Some(&pin("u", "5")));
    }
    state.supersede("ns/one-more", Some(&pin("u", "5")));
    assert_eq!(state.superseded.len(), MAX_OBJECTS);
    assert!(!state.superseded.contains_key("ns/one-more"));
    // An entry it has still moves on.
    state.supersede("ns/0", Some(&pin("u", "9")));
    assert_eq!(state.superseded["ns/0"], "9");
}

/// The race of a write answered in YAML with the watch: the watch, behind the
/// writes, brings the state the write went past, then the write's own.
#[test]
fn the_watch_ends_what_it_can_no_longer_bring() {
    let objects = Objects::default();
    let mut rv = "9".to_string();
    let mut lines = WatchLines::new(MAX_BUFFERED_BODY);
    let mut read = |text: String| {
        lines.push(text.as_bytes());
        apply_lines(&mut lines, &owner(), &objects, &mut rv).expect("applied");
    };
    let write = |f: &dyn Fn(&mut State)| f(&mut objects.state.write().expect("lock"));
    write(&|state| state.record_answer("ns/a".into(), pin("u", "10"), None));
    write(&|state| state.supersede("ns/a", Some(&pin("u", "10"))));
    read(watch_line("MODIFIED", "a", "u", "10", OWNED) + "\n");
    assert!(pins_of(&objects).is_empty());
    read(watch_line("MODIFIED", "a", "u", "11", OWNED) + "\n");
    assert_eq!(pins_of(&objects)["ns/a"], pin("u", "11"));
    // A delete through the proxy, then its event: nothing is left behind.
    write(&|state| state.supersede("ns/a", Some(&pin("u", "11"))));
    read(watch_line("DELETED", "a", "u", "12", OWNED) + "\n");
    assert!(pins_of(&objects).is_empty());
    assert!(superseded_of(&objects).is_empty());
    // One read of several events: the position moves past them only once they
    // are judged.
    write(&|state| state.supersede("ns/b", Some(&pin("v", "14"))));
    read(
        watch_line("MODIFIED", "c", "w", "13", OWNED)
            + "\n"
            + &watch_line("MODIFIED", "b", "v", "14", OWNED)
            + "\n",
    );
    assert_eq!(pins_of(&objects).keys().collect::<Vec<_>>(), ["ns/c"]);
    assert!(
        superseded_of(&objects).is_empty(),
        "the watch brought the superseded state: it cannot come again"
    );
    // Any event (a bookmark will do) past a superseded state ends it: the watch
    // only brings later ones.
    write(&|state| state.supersede("ns/d", Some(&pin("x", "16"))));
    read(
        r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"15"}}}"#.to_string() + "\n",
    );
    assert_eq!(superseded_of(&objects).keys().collect::<Vec<_>>(), ["ns/d"]);
    // A write's answer the watch has gone past is old news: the object, pinned
    // at 17 by the watch, was deleted through the proxy by a second write, and
    // the first write's answer (at 18) is read only after the DELETED at 19.
    read(watch_line("MODIFIED", "e", "y", "17", OWNED) + "\n");
    write(&|state| state.supersede("ns/e", Some(&pin("y", "18"))));
    read(watch_line("MODIFIED", "e", "y", "18", OWNED) + "\n");
    read(watch_line("DELETED", "e", "y", "19", OWNED) + "\n");
    write(&|state| state.record_answer("ns/e".into(), pin("y", "18"), Some(&pin("y", "17"))));
    assert!(!pins_of(&objects).contains_key("ns/e"));
    // An answer the watch has not reached is taken.
    write(&|state| state.record_answer("ns/f".into(), pin("z", "20"), None));
    assert_eq!(pins_of(&objects)["ns/f"], pin("z", "20"));
}

#[test]
fn a_list_never_brings_back_a_state_written_past() {
    let mut state = State::default();
    state.record_answer("ns/a".into(), pin("u", "10"), None);
    state.record_answer("ns/b".into(), pin("v", "20"), None);
    state.supersede("ns/a", None);
    state.supersede("ns/b", None);
    // Known from before the list: an object it no longer has is gone.
    state.record("ns/g".into(), pin("q", "12"));
    // Written through the proxy while the list ran: a later state of a listed
    // object, another incarnation of a listed name, an object the list began
    // too early to see.
    state.record_answer("ns/d".into(), pin("x", "17"), None);
    state.record_answer("ns/e".into(), pin("y", "18"), None);
    state.record_answer("ns/f".into(), pin("z", "19"), None);
    // A list at 15, begun before the writes: the superseded states stay out,
    // and what the watch from 15 could still bring stays superseded.
    let listed = HashMap::from([
        ("ns/a".to_string(), pin("u", "10")),
        ("ns/b".to_string(), pin("v", "12")),
        ("ns/c".to_string(), pin("w", "14")),
        ("ns/d".to_string(), pin("x", "13")),
        ("ns/e".to_string(), pin("other", "11")),
    ]);
    state.take_list(listed, "15");
    assert!(state.synced);
    assert_eq!(
        state.pins,
        HashMap::from([
            ("ns/c".into(), pin("w", "14")),
            ("ns/d".into(), pin("x", "17")),
            ("ns/e".into(), pin("y", "18")),
            ("ns/f".into(), pin("z", "19")),
        ])
    );
    assert_eq!(state.superseded.keys().collect::<Vec<_>>(), ["ns/b"]);
    // An answer the list has gone past is old news.
    state.record_answer("ns/i".into(), pin("s", "14"), None);
    assert!(!state.pins.contains_key("ns/i"));
    // A listed state later than what was known of the object is taken.
    let listed = HashMap::from([("ns/c".to_string(), pin("w", "21"))]);
    state.take_list(listed, "21");
    assert_eq!(state.pins["ns/c"], pin("w", "21"));
    // A list at or past a superseded state leaves the watch nothing older.
    assert!(state.superseded.is_empty());
    // A list at a version that is not a number cannot be ordered: it keeps
    // nothing from before it.
    state.supersede("ns/c", None);
    state.record_answer("ns/h".into(), pin("r", "30"), None);
    state.take_list(HashMap::new(), "opaque");
    assert!(state.pins.is_empty() && state.superseded.is_empty());
}

#[test]
fn a_list_keeps_what_is_newer_only_within_the_bound() {
    let mut state = State::default();
    state.record_answer("ns/new".into(), pin("n", "20"), None);
    state.record_answer("ns/0".into(), pin("u", "20"), None);
    let listed = (0..MAX_OBJECTS)
        .map(|i| (format!("ns/{i}"), pin("u", "5")))
        .collect();
    state.take_list(listed, "10");
    assert_eq!(state.pins.len(), MAX_OBJECTS);
    assert!(!state.pins.contains_key("ns/new"));
    assert_eq!(
        state.pins["ns/0"],
        pin("u", "20"),
        "a listed object moves on"
    );
}

#[test]
fn watch_events_add_update_and_remove_owned_objects() {
    let objects = Objects::default();
    objects.state.write().expect("lock").synced = true;
    let mut rv = "1".to_string();
    let line = |t: &str, uid: &str, rv: &str, labels: &str| {
        format!(
            r#"{{"type":"{t}","object":{{"kind":"PartialObjectMetadata","metadata":{{"name":"a","namespace":"ns","uid":"{uid}","resourceVersion":"{rv}",{labels}}}}}}}"#
        )
    };
    apply(
        event(&line("ADDED", "u", "2", OWNED)),
        &owner(),
        &objects,
        &mut rv,
    )
    .expect("ok");
    assert_eq!(rv, "2");
    assert_eq!(
        objects.state.read().expect("lock").pins["ns/a"],
        pin("u", "2")
    );
    // Leaving the selection (owner labels removed) arrives as DELETED.
    apply(
        event(&line("DELETED", "u", "3", r#""labels":{}"#)),
        &owner(),
        &objects,
        &mut rv,
    )
    .expect("ok");
    assert!(objects.state.read().expect("lock").pins.is_empty());
    // A DELETED of an older incarnation leaves a newer one alone.
    apply(
        event(&line("ADDED", "w", "5", OWNED)),
        &owner(),
        &objects,
        &mut rv,
    )
    .expect("ok");
    apply(
        event(&line("DELETED", "u", "6", OWNED)),
        &owner(),
        &objects,
        &mut rv,
    )
    .expect("ok");
    assert_eq!(
        objects.state.read().expect("lock").pins["ns/a"],
        pin("w", "5")
    );
    // Bookmarks move the resume point only.
    apply(
        event(r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}"#),
        &owner(),
        &objects,
        &mut rv,
    )
    .expect("ok");
    assert_eq!(rv, "9");
    let expired = event(
        r#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version"}}"#,
    );
    assert!(matches!(
        apply(expired, &owner(), &objects, &mut rv),
        Err(SyncError::WatchError(message)) if message == "too old resource version"
    ));
}

fn watch_line(event_type: &str, name: &str, uid: &str, rv: &str, labels: &str) -> String {
    format!(
        r#"{{"type":"{event_type}","object":{{"kind":"PartialObjectMetadata","metadata":{{"name":"{name}","namespace":"ns","uid":"{uid}","resourceVersion":"{rv}",{labels}}}}}}}"#
    ) + "\n"
}

#[test]
fn a_watch_stream_is_applied_the_same_however_it_is_chunked() {
    let stream = [
        watch_line("ADDED", "a", "u", "2", OWNED),
        "\n".into(),
        watch_line(
            "ADDED",
            "b",
            "v",
            "3",
            r#""labels":{"vcluster.com/owner-vcluster":"client"}"#,
        ),
        watch_line("MODIFIED", "a", "u", "4", OWNED),
    ]
    .concat();
    let whole = replay_watch(&owner(), [stream.as_bytes()]);
    assert_eq!(whole.pins, HashMap::from([("ns/a".into(), pin("u", "4"))]));
    assert_eq!(whole.resource_version, "4");
    assert_eq!(whole.error, None);
    for size in [1, 2, 7, 64] {
        assert_eq!(
            replay_watch(&owner(), stream.as_bytes().chunks(size)),
            whole
        );
    }
}

#[test]
fn an_event_cut_short_by_the_end_of_the_watch_is_not_applied() {
    let first = watch_line("ADDED", "a", "u", "2", OWNED);
    let cut = watch_line("ADDED", "b", "v", "3", OWNED);
    let cut = cut.trim_end();
    let replay = replay_watch(&owner(), [first.as_bytes(), cut.as_bytes()]);
    assert_eq!(replay.pins, HashMap::from([("ns/a".into(), pin("u", "2"))]));
    // The next watch resumes before the lost event, so the target sends it again.
    assert_eq!(replay.resource_version, "2");
    assert_eq!(replay.error, None);
}

#[test]
fn a_line_that_is_no_event_ends_the_watch() {
    let first = watch_line("ADDED", "a", "u", "2", OWNED);
    let replay = replay_watch(&owner(), [first.as_bytes(), b"not json\n"]);
    assert_eq!(replay.pins.len(), 1);
    assert!(replay
        .error
        .is_some_and(|e| e.starts_with("undecodable answer")));
}

#[test]
fn lines_that_are_not_whole_events_end_the_watch() {
    let first = watch_line("ADDED", "a", "u", "2", OWNED);
    // An owned state, but a byte that is not UTF-8 in a field the cache skips.
    let mut owned_but_not_utf8 = watch_line("MODIFIED", "a", "u", "3", OWNED).into_bytes();
    let kind = owned_but_not_utf8
        .windows(7)
        .position(|w| w == b"Partial")
        .expect("a kind");
    owned_but_not_utf8.insert(kind, 0xff);
    owned_but_not_utf8.pop();
    for bad in [
        owned_but_not_utf8,
        br#"{"object":{"metadata":{"name":"a"}}}"#.to_vec(),
        br#"{"type":"ADDED","object":{"metadata":{"name":1}}}"#.to_vec(),
        br#"{"type":"ADDED","object":null}"#.to_vec(),
        br#"{"type":"ADDED","object":{}} trailing"#.to_vec(),
        br#"{"type":"ADDED","object":{"metadata":{"labels":[]}}}"#.to_vec(),
    ] {
        let mut stream = bad.clone();
        stream.push(b'\n');
        let replay = replay_watch(&owner(), [first.as_bytes(), &stream]);
        assert_eq!(replay.pins, HashMap::from([("ns/a".into(), pin("u", "2"))]));
        assert!(
            replay
                .error
                .is_some_and(|e| e.starts_with("undecodable answer")),
            "{}",
            String::from_utf8_lossy(&bad)
        );
    }
}

#[test]
fn a_key_given_twice_counts_with_its_last_value() {
    let owned_then_null = format!(r#"{{"uid":"u","resourceVersion":"3",{OWNED},"labels":null}}"#);
    assert_eq!(owned_pin(&owned_then_null), None);
    let null_then_owned = format!(r#"{{"uid":"u","resourceVersion":"3","labels":null,{OWNED}}}"#);
    assert_eq!(owned_pin(&null_then_owned), Some(pin("u", "3")));
    // A second `metadata` whose state carries no labels replaces the owned one.
    let line = format!(
        r#"{{"type":"ADDED","object":{{"metadata":{{"name":"a","namespace":"ns","uid":"u","resourceVersion":"2",{OWNED}}},"metadata":{{"name":"a","namespace":"ns","uid":"u","resourceVersion":"2"}}}}}}"#
    ) + "\n";
    let replay = replay_watch(&owner(), [line.as_bytes()]);
    assert_eq!(replay.error, None);
    assert!(replay.pins.is_empty(), "{line}");
}

#[test]
fn null_labels_are_no_labels() {
    let line = watch_line("ADDED", "a", "u", "2", r#""labels":null"#);
    let replay = replay_watch(&owner(), [line.as_bytes()]);
    assert!(replay.pins.is_empty());
    assert_eq!(replay.error, None);
    assert_eq!(replay.resource_version, "2");
}

/// A target connection whose pool has no peers: every request of the cache fails
/// before any dial, so its watch keeps retrying and never syncs.
fn unreachable_target() -> TargetConnection {
    use crate::dial::Dialer;
    use crate::metrics::Metrics;
    use crate::pool::PeerPool;
    let config = test_support::client_config_without_roots();
    let dialer = Dialer::new(
        Arc::new(config),
        rustls::pki_types::ServerName::try_from("target.example").expect("name"),
    );
    TargetConnection {
        pool: PeerPool::new(
            "example.com/v1".into(),
            dialer,
            Metrics::new().target("p/t"),
        ),
        host: http::HeaderValue::from_static("target.example"),
        credentials: Arc::new(
            crproxy_kube::Credentials::new(
                crproxy_kube::Auth::Token("t".into()),
                serde_json::Value::Null,
            )
            .expect("credentials"),
        ),
    }
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_resource_starts_on_first_use_and_is_dropped_when_idle() {
    let cache = OwnershipCache::new("example.com", "v1", owner(), &unreachable_target());
    assert!(
        cache.running("widgets").is_none(),
        "nothing before first use"
    );
    assert_eq!(cache.lookup("widgets", Some("ns"), "a"), Lookup::Unsynced);
    settle().await;
    assert!(cache.running("widgets").is_some());
    // Used again just before the idle limit: kept.
    tokio::time::advance(IDLE_DROP - Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(cache.lookup("widgets", Some("ns"), "a"), Lookup::Unsynced);
    tokio::time::advance(IDLE_DROP - Duration::from_secs(1)).await;
    settle().await;
    assert!(cache.running("widgets").is_some(), "still in use");
    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    assert!(cache.running("widgets").is_none(), "dropped after idling");
    // Remembering a write of a resource nobody watches keeps nothing.
    cache.remember(
        "widgets",
        Some("ns"),
        Some("a"),
        None,
        format!(r#"{{"metadata":{{"name":"a","namespace":"ns","uid":"u","resourceVersion":"1",{OWNED}}}}}"#)
            .as_bytes(),
    );
    assert!(cache.running("widgets").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_resource_name_that_is_no_dns_label_gets_no_watch() {
    let cache = OwnershipCache::new("example.com", "v1", owner(), &unreachable_target());
    // Decoded from `widgets%3FlabelSelector%3D%26x`: as a URL it would list
    // other owners' objects; as a name it is no resource of any API.
    for resource in ["widgets?labelSelector=&x", "Widgets", "widgets.v2", ""] {
        assert_eq!(cache.lookup(resource, Some("ns"), "a"), Lookup::Unsynced);
        settle().await;
        assert!(cache.running(resource).is_none(), "{resource:?}");
    }
    assert!(locks::lock(&cache.shared.resources).is_empty());
}

/// Runs `test` on a paused runtime with a cache whose `widgets` watch has started
/// (against an unreachable target, so it never syncs by itself).
fn with_widgets_cache<F, T>(test: F)
where
    F: FnOnce(OwnershipCache, Arc<Objects>) -> T,
    T: std::future::Future<Output = ()>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let cache = OwnershipCache::new("example.com", "v1", owner(), &unreachable_target());
        let _ = cache.lookup("widgets", Some("ns"), "a");
        let objects = cache.running("widgets").expect("running");
        test(cache, objects).await;
    });
}

/// A write's answer: object `name` in namespace `ns`, uid `u`.
fn write_answer(name: &str, resource_version: &str, labels: &str) -> String {
    format!(
        r#"{{"metadata":{{"name":"{name}","namespace":"ns","uid":"u","resourceVersion":"{resource_version}",{labels}}}}}"#
    )
}

#[test]
fn a_write_answer_is_remembered_only_for_its_own_owned_object() {
    with_widgets_cache(|cache, objects| async move {
        objects.state.write().expect("lock").synced = true;
        let remember = |namespace: &str, name: Option<&str>, answer: &[u8]| {
            cache.remember("widgets", Some(namespace), name, None, answer);
        };
        let lookup = |namespace: &str, name: &str| cache.lookup("widgets", Some(namespace), name);
        let owned_at = |name: &str, rv: &str| write_answer(name, rv, OWNED);
        let owned = |name: &str| owned_at(name, "4");
        let unlabelled = |name: &str| write_answer(name, "4", r#""labels":{}"#);
        remember("ns", Some("a"), owned("a").as_bytes());
        assert_eq!(lookup("ns", "a"), Lookup::Hit(pin("u", "4")));
        // An answer about another object records nothing; it, or an answer
        // that is not JSON, drops the object the write addressed, which changed.
        remember("ns", Some("c"), owned("c").as_bytes());
        remember("ns", Some("b"), owned("a").as_bytes());
        assert_eq!(lookup("ns", "b"), Lookup::Miss);
        assert_eq!(lookup("ns", "a"), Lookup::Hit(pin("u", "4")));
        remember("ns", Some("c"), owned("a").as_bytes());
        assert_eq!(lookup("ns", "c"), Lookup::Miss);
        assert_eq!(lookup("ns", "a"), Lookup::Hit(pin("u", "4")));
        remember("ns", Some("a"), b"not json");
        assert_eq!(lookup("ns", "a"), Lookup::Miss);
        remember("ns", Some("a"), owned_at("a", "5").as_bytes());
        assert_eq!(lookup("ns", "a"), Lookup::Hit(pin("u", "5")));
        // A write whose answer no longer carries the labels drops the entry.
        remember(
            "ns",
            Some("a"),
            write_answer("a", "6", r#""labels":{}"#).as_bytes(),
        );
        assert_eq!(lookup("ns", "a"), Lookup::Miss);
        remember("ns", Some("a"), owned_at("a", "7").as_bytes());
        assert_eq!(lookup("ns", "a"), Lookup::Hit(pin("u", "7")));
        cache.forget("widgets", Some("ns"), "a", None);
        assert_eq!(lookup("ns", "a"), Lookup::Miss);
        // The next write changed nothing: its answer is the state it was
        // pinned to.
        let answer = owned_at("a", "7");
        let sent_with = pin("u", "7");
        cache.remember(
            "widgets",
            Some("ns"),
            Some("a"),
            Some(&sent_with),
            answer.as_bytes(),
        );
        assert_eq!(lookup("ns", "a"), Lookup::Hit(pin("u", "7")));
        // A create's answer names its object (a generated name, say) itself; it
        // is kept only for the namespace the create was sent to.
        remember("ns", None, owned("gen-x7").as_bytes());
        assert_eq!(lookup("ns", "gen-x7"), Lookup::Hit(pin("u", "4")));
        remember("other", None, owned("c").as_bytes());
        assert_eq!(lookup("ns", "c"), Lookup::Miss);
        assert_eq!(lookup("other", "c"), Lookup::Miss);
        remember("ns", None, unlabelled("d").as_bytes());
        assert_eq!(lookup("ns", "d"), Lookup::Miss);
    });
}

#[test]
fn a_write_answer_is_read_for_the_object_the_write_addressed() {
    let read = |namespace: Option<&str>, name: Option<&str>, answer: &str| {
        read_write_answer(&owner(), namespace, name, answer.as_bytes())
    };
    let owned = |key: &str, rv: &str| {
        Some(WriteAnswer::Owned {
            key: key.into(),
            pin: pin("u", rv),
        })
    };
    let not_owned = |key: &str| Some(WriteAnswer::NotOwned { key: key.into() });
    assert_eq!(
        read(Some("ns"), Some("a"), &write_answer("a", "4", OWNED)),
        owned("ns/a", "4")
    );
    assert_eq!(
        read(Some("ns"), None, &write_answer("gen-x7", "5", OWNED)),
        owned("ns/gen-x7", "5")
    );
    let cluster_scoped =
        format!(r#"{{"metadata":{{"name":"c","uid":"u","resourceVersion":"6",{OWNED}}}}}"#);
    assert_eq!(read(None, Some("c"), &cluster_scoped), owned("c", "6"));
    // Not owned: other labels, or no state to pin a write to.
    assert_eq!(
        read(
            Some("ns"),
            Some("a"),
            &write_answer("a", "4", r#""labels":{}"#)
        ),
        not_owned("ns/a")
    );
    assert_eq!(
        read(Some("ns"), Some("a"), &write_answer("a", "", OWNED)),
        not_owned("ns/a")
    );
    // Not the addressed object, or no object at all: nothing to learn.
    assert_eq!(
        read(Some("ns"), Some("b"), &write_answer("a", "4", OWNED)),
        None
    );
    assert_eq!(
        read(Some("other"), Some("a"), &write_answer("a", "4", OWNED)),
        None
    );
    assert_eq!(read(None, Some("a"), &write_answer("a", "4", OWNED)), None);
    assert_eq!(read(Some("ns"), Some("c"), &cluster_scoped), None);
    let odd_namespace =
        write_answer("a", "4", OWNED).replace(r#""namespace":"ns""#, r#""namespace":1"#);
    assert_eq!(read(Some("ns"), Some("a"), &odd_namespace), None);
    assert_eq!(
        read(Some("ns"), Some("a"), r#"{"kind":"Status","metadata":{}}"#),
        None
    );
    assert_eq!(
        read(
            Some("ns"),
            Some("a"),
            &format!("{} {{}}", write_answer("a", "4", OWNED))
        ),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn entries_outlive_an_interrupted_watch_until_the_idle_limit() {
    let objects = Objects::default();
    {
        let mut state = objects.state.write().expect("lock");
        state.synced = true;
        state.in_step_at = Some(Instant::now());
        state.pins.insert("ns/a".into(), pin("u", "1"));
        state.superseded.insert("ns/b".into(), "1".into());
    }
    tokio::time::advance(WATCH_IDLE_LIMIT - Duration::from_secs(1)).await;
    objects.unsync_if_out_of_step();
    assert_eq!(
        objects.state.read().expect("lock").pins.get("ns/a"),
        Some(&pin("u", "1")),
        "still used while the watch is re-established"
    );
    // A read of the watch that brings an event (a bookmark will do) puts the
    // cache back in step.
    let mut rv = String::new();
    let mut lines = WatchLines::new(MAX_BUFFERED_BODY);
    lines.push(b"{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"9\"}}}\n");
    apply_lines(&mut lines, &owner(), &objects, &mut rv).expect("ok");
    tokio::time::advance(WATCH_IDLE_LIMIT - Duration::from_secs(1)).await;
    objects.unsync_if_out_of_step();
    assert!(objects.state.read().expect("lock").synced);
    tokio::time::advance(Duration::from_secs(2)).await;
    objects.unsync_if_out_of_step();
    let state = objects.state.read().expect("lock");
    assert!(
        !state.synced && state.pins.is_empty() && state.superseded.is_empty(),
        "dropped once out of step too long"
    );
}

#[tokio::test(start_paused = true)]
async fn at_most_a_bounded_number_of_resources_is_watched() {
    let cache = OwnershipCache::new("example.com", "v1", owner(), &unreachable_target());
    for i in 0..MAX_RESOURCES {
        let _ = cache.lookup(&format!("r{i}"), None, "a");
    }
    assert_eq!(cache.lookup("one-too-many", None, "a"), Lookup::Unsynced);
    assert!(cache.running("one-too-many").is_none());
    assert!(cache.running("r0").is_some());
    // Once idle ones are dropped, there is room again.
    tokio::time::advance(IDLE_DROP + Duration::from_secs(1)).await;
    settle().await;
    let _ = cache.lookup("one-too-many", None, "a");
    assert!(cache.running("one-too-many").is_some());
}

/// The pins `objects` holds now.
fn pins_of(objects: &Objects) -> HashMap<String, Pin> {
    objects.state.read().expect("state").pins.clone()
}

/// The superseded states held, keyed as [`pins_of`]'s pins.
fn superseded_of(objects: &Objects) -> HashMap<String, String> {
    objects.state.read().expect("state").superseded.clone()
}

/// A watch body fed by hand: each line sent is one frame of it.
fn watch_body() -> (
    tokio::sync::mpsc::UnboundedSender<Result<hyper::body::Frame<Bytes>, crate::pool::BoxError>>,
    ProxyBody,
) {
    use http_body_util::{BodyExt as _, StreamBody};
    let (events, received) = tokio::sync::mpsc::unbounded_channel();
    let body = StreamBody::new(tokio_stream::wrappers::UnboundedReceiverStream::new(
        received,
    ));
    (events, body.boxed())
}

fn send_line(
    events: &tokio::sync::mpsc::UnboundedSender<
        Result<hyper::body::Frame<Bytes>, crate::pool::BoxError>,
    >,
    line: String,
) {
    events
        .send(Ok(hyper::body::Frame::data(Bytes::from(line))))
        .expect("send");
}

/// Events that arrived together are applied together; the watch then rests for
/// the batch pause before it reads again, and applies what came meanwhile.
#[tokio::test(start_paused = true)]
async fn a_watch_reads_what_has_arrived_then_rests() {
    let (events, body) = watch_body();
    let send = |line: String| send_line(&events, line);
    for (name, rv) in [("a", "2"), ("b", "3"), ("c", "4")] {
        send(watch_line("ADDED", name, "u", rv, OWNED));
    }
    let objects = Arc::new(Objects::default());
    let following = {
        let objects = Arc::clone(&objects);
        tokio::spawn(async move {
            let mut rv = String::new();
            let ended = follow(body, None, &owner(), &objects, &mut rv).await;
            (ended, rv)
        })
    };
    settle().await;
    assert_eq!(
        pins_of(&objects).len(),
        3,
        "all three arrived before the first read"
    );

    send(watch_line("ADDED", "d", "u", "5", OWNED));
    settle().await;
    assert_eq!(pins_of(&objects).len(), 3, "resting: not read yet");
    tokio::time::advance(EVENT_BATCH_PAUSE).await;
    settle().await;
    assert_eq!(pins_of(&objects).get("ns/d"), Some(&pin("u", "5")));

    drop(events);
    tokio::time::advance(EVENT_BATCH_PAUSE).await;
    let (ended, rv) = following.await.expect("follow");
    assert!(ended.is_ok(), "{ended:?}");
    assert_eq!(rv, "5");
}

/// The watch's socket rests through each pause and only then: its low-water mark
/// is raised once the watch has read what had arrived, back at 1 when it reads
/// again, and back at 1 when the watch is dropped in the middle of a pause.
#[cfg(target_os = "linux")]
#[tokio::test(start_paused = true)]
async fn the_watch_socket_rests_only_through_the_pause() {
    use std::os::fd::AsFd;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    let watched = std::net::TcpStream::connect(address).expect("connect");
    let mark = || crproxy_sockopt::receive_low_water(watched.as_fd()).expect("mark");
    let socket = RestingSocket::new(Arc::new(
        watched.as_fd().try_clone_to_owned().expect("duplicate"),
    ));
    let (events, body) = watch_body();
    let send = |line: String| send_line(&events, line);
    send(watch_line("ADDED", "a", "u", "2", OWNED));
    let objects = Arc::new(Objects::default());
    let following = {
        let objects = Arc::clone(&objects);
        tokio::spawn(async move {
            let mut rv = String::new();
            follow(body, Some(socket), &owner(), &objects, &mut rv).await
        })
    };
    settle().await;
    assert_eq!(pins_of(&objects).len(), 1);
    assert!(mark() > 1, "resting after a read: {}", mark());

    tokio::time::advance(EVENT_BATCH_PAUSE).await;
    settle().await;
    assert_eq!(mark(), 1, "awake, waiting for the next event");

    send(watch_line("ADDED", "b", "u", "3", OWNED));
    settle().await;
    assert_eq!(pins_of(&objects).len(), 2);
    assert!(mark() > 1, "resting again: {}", mark());

    following.abort();
    let _ = following.await;
    assert_eq!(
        mark(),
        1,
        "a watch dropped mid-pause leaves its socket awake"
    );
}

#[test]
fn a_write_answer_adds_no_entry_to_an_unsynced_or_full_cache() {
    with_widgets_cache(|cache, objects| async move {
        let answer = |name: &str, rv: &str| write_answer(name, rv, OWNED);
        // Unsynced (as while it lists, or paused after outgrowing its limit): the
        // answers of creates are not kept.
        cache.remember(
            "widgets",
            Some("ns"),
            None,
            None,
            answer("a", "1").as_bytes(),
        );
        assert!(objects.state.read().expect("lock").pins.is_empty());
        // Synced and full: no new entry, but an entry it has follows the write.
        {
            let mut state = objects.state.write().expect("lock");
            state.synced = true;
            for i in 0..MAX_OBJECTS - 1 {
                state
                    .pins
                    .insert(key(Some("ns"), &format!("o{i}")), pin("u", "1"));
            }
            state.pins.insert(key(Some("ns"), "kept"), pin("u", "1"));
        }
        cache.remember(
            "widgets",
            Some("ns"),
            None,
            None,
            answer("new", "2").as_bytes(),
        );
        cache.remember(
            "widgets",
            Some("ns"),
            Some("kept"),
            None,
            answer("kept", "2").as_bytes(),
        );
        let state = objects.state.read().expect("lock");
        assert_eq!(state.pins.len(), MAX_OBJECTS);
        assert!(!state.pins.contains_key(&key(Some("ns"), "new")));
        assert_eq!(
            state.pins.get(&key(Some("ns"), "kept")),
            Some(&pin("u", "2"))
        );
    });
}
