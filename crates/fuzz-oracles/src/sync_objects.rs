//! The custom resource sync turns tenant objects, whose content any tenant user
//! controls, into host mirrors, and host objects into tenant copies
//! (`crproxy_sync`). Whatever the input: never a panic, and
//!
//! * names: a host name is at most 63 bytes: `<name>-x-<namespace>-x-<tenant>` when
//!   that fits, else its first 52 bytes (without a trailing `-` or `.`), `-` and 10
//!   hex digits of a hash of the whole; valid DNS names give a valid DNS name;
//!   `tenant_name_of` gives a name back from its unshortened host name, and any name
//!   it gives translates to its input; an empty reference stays empty; another is
//!   translated (`reference_host_name`)
//!   exactly when `ambiguity` finds nothing and its host name is not shortened, and
//!   comes back (`reference_name_of`) exactly when it was translated; a label value is at most 63 bytes, the value
//!   itself when it fits, valid when the value is valid but for its length, and then
//!   the host watch's selector matches it; the kind annotation and the mirror record
//!   split back into their parts; `same_mirror` is symmetric and holds exactly when
//!   the four identity keys are strings and agree;
//! * managed keys: a record lists the object's keys sorted, one a line, and changes
//!   nothing else; nothing differs from itself; a replace keeps the desired keys and
//!   the current object's unrecorded ones, its resourceVersion, finalizers and owners,
//!   drops the recorded keys the desired object no longer has, is idempotent and
//!   needs no further write; keys the current object does not record decide no write;
//! * the three-way merge: an unchanged host keeps the tenant's fields, an unedited
//!   copy follows the host, agreeing sides stay, without a base the host wins, merging
//!   the result again changes nothing, mappings merge key by key, and every value of
//!   the result is the host's or the tenant's at the same place;
//! * patches: exactly the strings the path reaches (decided by a walk of the whole
//!   document) are rewritten, and names translated to the host come back;
//! * toHost mirrors: named and labelled for this tenant, with the identity of the
//!   tenant object (which the tenant's own labels and annotations cannot change), the
//!   tenant's other keys and fields, the names on the patch paths translated, no
//!   status; refused exactly when a reference on them is not translated; another incarnation's or another tenant's mirror is never the same
//!   mirror; a replace of any host object keeps its status, is the same mirror and
//!   needs no further write; the status comes back with host names translated back;
//! * fromHost copies: the host's fields (merged with the tenant's edits), labels and
//!   state as last synced; a copy as written needs no further write.
//!
//! The input is up to seven parts separated by 0xFF (never in UTF-8 text): a name, a
//! namespace, a tenant, a field path, then three JSON documents (the tenant object
//! or merge base, the host object, the tenant copy); a missing or unreadable part is
//! empty or absent.

use std::collections::{BTreeMap, BTreeSet};

use crproxy_core::config::sync::{Direction, FieldPath, PathStep, Scope, SyncResource};
use crproxy_core::selector::LabelSelector;
use crproxy_sync::crd::ResolvedType;
use crproxy_sync::from_host::{copy_differs, desired_copy, fields};
use crproxy_sync::managed::{carry_over, metadata_differs, record, Keys};
use crproxy_sync::merge::three_way;
use crproxy_sync::names::{
    self, host_name, kind_annotation, label_value, reference_host_name, reference_name_of,
    same_mirror, tenant_name_of,
};
use crproxy_sync::patches::rewrite_strings;
use crproxy_sync::run::Key;
use crproxy_sync::to_host::{
    self, desired_mirror, host_selector, mirror_differs, replacement, status_from_mirror,
};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Map, Value};

const SEPARATOR: u8 = 0xFF;
/// Longest object name (a DNS-1123 label) and label value Kubernetes accepts.
const MAX_NAME: usize = 63;
const HOST_NAMESPACE: &str = "vcluster-host";
/// The tenant's Platform project the mirrors record.
const PROJECT: &str = "default";
const API_VERSION: &str = "example.com/v1";
const KIND: &str = "Widget";
const BOTH: [Keys; 2] = [Keys::Labels, Keys::Annotations];

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    let parts: Vec<&[u8]> = data.split(|b| *b == SEPARATOR).collect();
    let text = |i: usize| -> String {
        parts
            .get(i)
            .map(|part| String::from_utf8_lossy(part).into_owned())
            .unwrap_or_default()
    };
    let doc = |i: usize| -> Option<Value> {
        parts
            .get(i)
            .and_then(|part| serde_json::from_slice(part).ok())
    };
    let (name, namespace, tenant, path) = (text(0), text(1), text(2), text(3));
    let docs = [doc(4), doc(5), doc(6)];

    check_names(&name, &namespace, &tenant);
    // The same, made valid: what real objects are named.
    check_names(
        &dns_subdomain(&name),
        &dns_label(&namespace),
        &dns_label(&tenant),
    );
    check_reverse(&name, &namespace, &tenant);
    for text in [&name, &namespace, &tenant, &path] {
        check_label_value(text);
        check_label_value(&label_chars(text));
    }
    check_kind_and_record(&name, &namespace);

    let present: Vec<&Value> = docs.iter().flatten().collect();
    for x in &present {
        check_mirror_record_of(x);
        for y in &present {
            check_same_mirror(x, y);
        }
    }
    let [a, b, c] = docs.each_ref().map(Option::as_ref);
    check_merge(a, b, c);
    for desired in present.iter().filter_map(|d| as_desired(d)) {
        let recorded = check_record(&desired);
        assert!(!metadata_differs(&desired, &desired));
        assert!(!metadata_differs(&recorded, &recorded));
        for current in present.iter().copied().chain([&Value::Null]) {
            check_replace(&recorded, current);
            check_writes_decided(&desired, current, &name);
            check_writes_decided(&recorded, current, &name);
        }
    }
    for x in &present {
        assert!(!metadata_differs(x, x), "{x} differs from itself");
    }

    let path = FieldPath::parse(&path).ok();
    if let Some(path) = &path {
        assert_eq!(path.text, text(3));
        assert!(
            matches!(path.steps.first(), Some(PathStep::Key(_))),
            "{path:?} starts with a field name"
        );
        for object in &present {
            check_patch(object, path, &namespace, &tenant);
        }
    }
    // The configuration refuses patches into metadata.
    let patches: Vec<FieldPath> = path
        .into_iter()
        .filter(|p| p.steps.first() != Some(&PathStep::Key("metadata".into())))
        .collect();
    if let Some(object) = a {
        let host = b.unwrap_or(&Value::Null);
        check_mirror(&widgets(Direction::ToHost, patches), &tenant, object, host);
    }
    if let Some(host) = b {
        let key = Key {
            namespace: namespace.clone(),
            name: name.clone(),
        };
        check_copy(&widgets(Direction::FromHost, Vec::new()), &key, host, c);
    }
}

// ---------------------------------------------------------------------------------
// Names.

fn check_names(name: &str, namespace: &str, tenant: &str) {
    let full = format!("{name}-x-{namespace}-x-{tenant}");
    let host = host_name(name, namespace, tenant);
    assert_eq!(host, host_name(name, namespace, tenant), "stable");
    assert!(host.len() <= MAX_NAME, "{host:?} is over 63 bytes");
    if full.len() <= MAX_NAME {
        assert_eq!(host, full);
        let back = tenant_name_of(&host, namespace, tenant);
        assert_eq!(
            back,
            (!name.is_empty()).then_some(name),
            "{host:?} back in {namespace:?}"
        );
    } else {
        // Refused as a reference (below: an ambiguous name says so first).
        check_shortened(&full, &host);
        // The hash covers the whole name: the same name of another tenant is
        // another host name.
        assert_ne!(host, host_name(name, namespace, &format!("{tenant}0")));
    }
    // A reference: translated when its host name is one-to-one, and back. An
    // empty one names nothing and stays empty, whatever the namespace and tenant.
    if name.is_empty() {
        assert_eq!(
            reference_host_name(name, namespace, tenant),
            Ok(String::new())
        );
    } else {
        match reference_host_name(name, namespace, tenant) {
            Ok(translated) => {
                assert!(names::ambiguity(name, namespace, tenant).is_none());
                assert_eq!(translated, full);
                assert_eq!(reference_name_of(&full, namespace, tenant), Some(name));
            }
            Err(why) => {
                let ambiguity = names::ambiguity(name, namespace, tenant);
                assert!(
                    ambiguity == Some(why) || (ambiguity.is_none() && full.len() > MAX_NAME),
                    "{full:?} refused: {why}"
                );
                assert_eq!(reference_name_of(&full, namespace, tenant), None);
            }
        }
    }
    if is_dns_subdomain(name) && is_dns_label(namespace) && is_dns_label(tenant) {
        assert!(is_dns_subdomain(&host), "{host:?} is not a DNS subdomain");
        if is_dns_label(name) {
            assert!(is_dns_label(&host), "{host:?} is not a DNS label");
        }
    }
}

/// `short` is `full` shortened: its first 52 bytes (cut on a character boundary,
/// without a trailing `-` or `.`), `-` and 10 hex digits.
fn check_shortened(full: &str, short: &str) {
    let mut cut = MAX_NAME - 11;
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    let prefix = full[..cut].trim_end_matches(['-', '.']);
    let hash = short
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('-'));
    let is_hash = |h: &str| {
        h.len() == 10
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    assert!(
        hash.is_some_and(is_hash),
        "{short:?} is not {prefix:?}, '-' and 10 hex digits"
    );
}

/// `tenant_name_of` on any text: a name it gives translates back to the text, and
/// it gives one whenever the text is a translation of a non-empty name;
/// `reference_name_of` gives the same name when the way there translates it.
fn check_reverse(host: &str, namespace: &str, tenant: &str) {
    let suffix = format!("-x-{namespace}-x-{tenant}");
    let back = tenant_name_of(host, namespace, tenant);
    assert_eq!(
        reference_name_of(host, namespace, tenant),
        back.filter(|name| reference_host_name(name, namespace, tenant).as_deref() == Ok(host))
    );
    match back {
        Some(name) => {
            assert!(!name.is_empty());
            assert_eq!(format!("{name}{suffix}"), host);
            if host.len() <= MAX_NAME {
                assert_eq!(host_name(name, namespace, tenant), host);
            }
        }
        None => assert!(
            !(host.len() > suffix.len() && host.ends_with(&suffix)),
            "{host:?} ends in {suffix:?} but gave no name"
        ),
    }
}

fn check_label_value(value: &str) {
    let got = label_value(value);
    assert_eq!(got, label_value(value), "stable");
    assert!(got.len() <= MAX_NAME, "{got:?} is over 63 bytes");
    if value.len() <= MAX_NAME {
        assert_eq!(got, value);
    } else {
        check_shortened(value, &got);
    }
    if is_label_value(value, usize::MAX) {
        assert!(is_label_value(&got, MAX_NAME), "{got:?} is no label value");
        // The host watch sees exactly the mirrors labelled for this tenant.
        let selector = host_selector(value);
        let selector = LabelSelector::parse(&selector)
            .unwrap_or_else(|e| panic!("{selector:?}: {}", e.message()));
        let labelled = |v: String| BTreeMap::from([(names::MANAGED_BY.to_owned(), v)]);
        assert!(selector.matches(&labelled(got.clone())));
        assert!(!selector.matches(&labelled(format!("{got}0"))));
    }
}

fn check_kind_and_record(a: &str, b: &str) {
    let kind = kind_annotation(a, b);
    if !a.contains(", Kind=") {
        assert_eq!(kind.split_once(", Kind="), Some((a, b)), "{kind:?}");
    }
    // Uids never hold a '/'.
    if a.contains('/') {
        return;
    }
    let record = names::mirror_record(a, b);
    assert_eq!(record.split_once('/'), Some((a, b)), "{record:?}");
    let object =
        |uid: String| json!({"metadata": {"uid": uid, "annotations": {names::MIRROR_UID: record}}});
    assert_eq!(
        to_host::mirror_record(&object(a.to_owned())),
        Some(record.clone())
    );
    // Copied onto another object: no record of that one.
    assert_eq!(to_host::mirror_record(&object(format!("{a}-copy"))), None);
}

/// A mirror record read from any object is the object's annotation, and names the
/// object's own uid.
fn check_mirror_record_of(object: &Value) {
    if let Some(record) = to_host::mirror_record(object) {
        let metadata = &object["metadata"];
        assert_eq!(
            metadata["annotations"][names::MIRROR_UID].as_str(),
            Some(record.as_str())
        );
        let uid = metadata["uid"].as_str().unwrap_or_default();
        assert_eq!(record.split_once('/').map(|(u, _)| u), Some(uid));
    }
}

fn identity(object: &Value) -> [&Value; 4] {
    let metadata = &object["metadata"];
    [
        &metadata["labels"][names::MANAGED_BY],
        &metadata["annotations"][names::OBJECT_NAME],
        &metadata["annotations"][names::OBJECT_NAMESPACE],
        &metadata["annotations"][names::OBJECT_UID],
    ]
}

fn check_same_mirror(x: &Value, y: &Value) {
    let strings = identity(y).iter().all(|v| v.is_string());
    // A mirror that records no project predates the record, and is of any.
    let px = &x["metadata"]["annotations"][names::TENANT_PROJECT];
    let py = &y["metadata"]["annotations"][names::TENANT_PROJECT];
    let projects = px.is_null() || py.is_null() || px == py;
    assert_eq!(
        same_mirror(x, y),
        strings && identity(x) == identity(y) && projects,
        "{x}\n{y}"
    );
    assert_eq!(same_mirror(x, y), same_mirror(y, x), "symmetric");
}

// ---------------------------------------------------------------------------------
// The three-way merge.

fn check_merge(base: Option<&Value>, host: Option<&Value>, tenant: Option<&Value>) {
    let merged = three_way(base, host, tenant);
    assert_eq!(
        three_way(base, base, tenant).as_ref(),
        tenant,
        "host unchanged"
    );
    assert_eq!(three_way(base, host, base).as_ref(), host, "copy unedited");
    assert_eq!(three_way(base, host, host).as_ref(), host, "sides agree");
    if host.is_some() {
        assert_eq!(three_way(None, host, tenant).as_ref(), host, "no base");
    }
    assert_eq!(
        three_way(base, host, merged.as_ref()),
        merged,
        "merging again changes something"
    );
    if let Some(merged) = &merged {
        check_sources(merged, host, tenant, &mut Vec::new());
    }
    if host == base {
        return;
    }
    let (Some(Value::Object(b)), Some(Value::Object(h)), Some(Value::Object(t))) =
        (base, host, tenant)
    else {
        assert_eq!(
            merged.as_ref(),
            host,
            "a field the host changed is the host's"
        );
        return;
    };
    let Some(Value::Object(m)) = &merged else {
        panic!("mappings merged into {merged:?}");
    };
    for key in b.keys().chain(h.keys()).chain(t.keys()) {
        let (bk, hk, tk) = (b.get(key), h.get(key), t.get(key));
        if hk == bk {
            assert_eq!(
                m.get(key),
                tk,
                "{key}: the host left it, the tenant's stays"
            );
        } else if [bk, hk, tk].iter().all(|v| v.is_some_and(Value::is_object)) {
            assert!(m.get(key).is_some_and(Value::is_object), "{key}");
        } else {
            assert_eq!(
                m.get(key),
                hk,
                "{key}: the host changed it, the host's wins"
            );
        }
    }
    for key in m.keys() {
        assert!(
            h.contains_key(key) || t.contains_key(key),
            "{key} from nowhere"
        );
    }
}

/// Every value of `merged` that is not a mapping is the host's or the tenant's at
/// the same place, and every mapping stands where one of them has a mapping.
fn check_sources(
    merged: &Value,
    host: Option<&Value>,
    tenant: Option<&Value>,
    at: &mut Vec<String>,
) {
    match merged {
        Value::Object(members) => {
            assert!(
                [host, tenant]
                    .iter()
                    .any(|v| v.is_some_and(Value::is_object)),
                "a mapping at {at:?} from nowhere"
            );
            for (key, value) in members {
                at.push(key.clone());
                let (host, tenant) = (
                    host.and_then(|v| v.get(key)),
                    tenant.and_then(|v| v.get(key)),
                );
                check_sources(value, host, tenant, at);
                at.pop();
            }
        }
        value => assert!(
            host == Some(value) || tenant == Some(value),
            "{value} at {at:?} from nowhere"
        ),
    }
}

// ---------------------------------------------------------------------------------
// Managed keys.

/// A record's own annotation (a label of that name is an ordinary label).
fn is_record(keys: Keys, key: &str) -> bool {
    keys == Keys::Annotations && (key == names::MANAGED_LABELS || key == names::MANAGED_ANNOTATIONS)
}

fn map(object: &Value, keys: Keys) -> Map<String, Value> {
    object["metadata"][keys.field()]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

/// The keys `object`'s record lists, one a line.
fn recorded(object: &Value, keys: Keys) -> BTreeSet<String> {
    let record = object["metadata"]["annotations"][keys.record()].as_str();
    let lines = record.into_iter().flat_map(str::lines);
    lines.filter(|k| !k.is_empty()).map(str::to_owned).collect()
}

/// The record of `object`'s keys: sorted, newline-separated, without the records.
fn record_of(object: &Value, keys: Keys) -> String {
    let map = map(object, keys);
    let mut listed: Vec<&str> = map.keys().map(String::as_str).collect();
    listed.retain(|k| !is_record(keys, k));
    listed.sort_unstable();
    listed.join("\n")
}

/// Whether no label or annotation key of `object` holds a line break, which the
/// newline-separated records cannot list (Kubernetes refuses such keys).
fn line_safe(object: &Value) -> bool {
    BOTH.iter().all(|keys| {
        let keys = map(object, *keys);
        keys.keys().all(|k| !k.contains(['\n', '\r']))
    })
}

/// `doc` as an object crproxy writes: an object whose metadata is a mapping.
fn as_desired(doc: &Value) -> Option<Value> {
    let mut object = doc.as_object()?.clone();
    if !object.get("metadata").is_some_and(Value::is_object) {
        object.insert("metadata".into(), json!({}));
    }
    Some(Value::Object(object))
}

/// A record changes only the record, twice as once; returns `desired` with both.
fn check_record(desired: &Value) -> Value {
    for keys in BOTH {
        let mut once = desired.clone();
        record(&mut once, keys);
        let mut expected = desired.clone();
        let metadata = &mut expected["metadata"];
        if !metadata["annotations"].is_object() {
            metadata["annotations"] = json!({});
        }
        metadata["annotations"][keys.record()] = json!(record_of(desired, keys));
        assert_eq!(once, expected, "{keys:?} recorded");
        let mut twice = once.clone();
        record(&mut twice, keys);
        assert_eq!(twice, once, "{keys:?} recorded twice");
    }
    let mut both = desired.clone();
    record(&mut both, Keys::Labels);
    record(&mut both, Keys::Annotations);
    both
}

/// `desired` (recorded) carried over onto `current`, as a replace.
fn check_replace(desired: &Value, current: &Value) {
    let mut replaced = desired.clone();
    carry_over(&mut replaced, current);
    let mut again = replaced.clone();
    carry_over(&mut again, current);
    assert_eq!(again, replaced, "a second carry-over changed it");
    for keys in BOTH {
        let (want, have, theirs) = (map(desired, keys), map(&replaced, keys), map(current, keys));
        let ours = recorded(current, keys);
        for (k, v) in &want {
            assert_eq!(have.get(k), Some(v), "{keys:?} {k}: the desired value");
        }
        for (k, v) in theirs.iter().filter(|(k, _)| !want.contains_key(*k)) {
            let kept = !ours.contains(k) && !is_record(keys, k);
            assert_eq!(have.get(k), kept.then_some(v), "{keys:?} {k} of {current}");
        }
        for k in have.keys() {
            assert!(want.contains_key(k) || theirs.contains_key(k), "{k}");
        }
    }
    let carried = ["resourceVersion", "finalizers", "ownerReferences"];
    for name in carried {
        let theirs = &current["metadata"][name];
        let expected = match theirs {
            Value::Null => &desired["metadata"][name],
            theirs => theirs,
        };
        assert_eq!(&replaced["metadata"][name], expected, "{name}");
    }
    let rest = |object: &Value| {
        let mut object = object.clone();
        if let Some(metadata) = object["metadata"].as_object_mut() {
            for name in carried.iter().chain(&["labels", "annotations"]) {
                metadata.remove(*name);
            }
        }
        object
    };
    assert_eq!(
        rest(&replaced),
        rest(desired),
        "the rest is the desired object's"
    );
    if line_safe(desired) {
        assert!(
            !metadata_differs(desired, &replaced),
            "a replace needs another: {desired}\n{replaced}"
        );
    }
}

/// Whether a write is needed: exactly when `current` lacks a key `desired` sets
/// (or has another value under it), or still has a key it records that `desired`
/// no longer sets; a key of `current` that it does not record never decides it.
fn check_writes_decided(desired: &Value, current: &Value, other_key: &str) {
    let differs = metadata_differs(desired, current);
    let lacks = BOTH.iter().any(|keys| {
        let have = map(current, *keys);
        map(desired, *keys)
            .iter()
            .any(|(k, v)| have.get(k) != Some(v))
    });
    let stale = BOTH.iter().any(|keys| {
        let (want, have) = (map(desired, *keys), map(current, *keys));
        let ours = recorded(current, *keys);
        ours.iter()
            .any(|k| !want.contains_key(k) && have.contains_key(k))
    });
    assert_eq!(
        differs,
        lacks || stale,
        "a write decided: {desired}\n{current}"
    );
    for keys in BOTH {
        // The key is someone else's: not set by `desired`, not recorded, not a record.
        let ours = map(desired, keys).contains_key(other_key)
            || recorded(current, keys).contains(other_key)
            || is_record(keys, other_key);
        if let Some(with) = (!ours)
            .then(|| with_key(current, keys, other_key))
            .flatten()
        {
            assert_eq!(
                metadata_differs(desired, &with),
                differs,
                "{keys:?} {other_key:?} of someone else"
            );
        }
    }
}

/// `object` with one more key in its labels or annotations, when it has the shape.
fn with_key(object: &Value, keys: Keys, key: &str) -> Option<Value> {
    let mut with = object.clone();
    let metadata = with.as_object_mut()?.entry("metadata").or_insert(json!({}));
    let map = metadata
        .as_object_mut()?
        .entry(keys.field())
        .or_insert(json!({}));
    map.as_object_mut()?.insert(key.to_owned(), json!("theirs"));
    Some(with)
}

// ---------------------------------------------------------------------------------
// Patches.

/// A place in a document.
enum Place {
    Key(String),
    Index(usize),
}

fn reaches(steps: &[PathStep], at: &[Place]) -> bool {
    steps.len() == at.len()
        && steps
            .iter()
            .zip(at)
            .all(|(step, place)| match (step, place) {
                (PathStep::Key(k), Place::Key(q)) => k == q,
                (PathStep::Each, Place::Index(_)) => true,
                (PathStep::Index(i), Place::Index(j)) => i == j,
                _ => false,
            })
}

/// `value` with `rewrite` applied to each string at a place the path reaches,
/// found by walking the whole document; the strings found go to `reached`.
fn reference_rewrite(
    value: &Value,
    steps: &[PathStep],
    at: &mut Vec<Place>,
    reached: &mut Vec<String>,
    rewrite: &dyn Fn(&str) -> String,
) -> Value {
    match value {
        Value::String(s) if reaches(steps, at) => {
            reached.push(s.clone());
            Value::String(rewrite(s))
        }
        Value::Object(members) => {
            let mut out = Map::new();
            for (key, member) in members {
                at.push(Place::Key(key.clone()));
                out.insert(
                    key.clone(),
                    reference_rewrite(member, steps, at, reached, rewrite),
                );
                at.pop();
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                at.push(Place::Index(i));
                out.push(reference_rewrite(item, steps, at, reached, rewrite));
                at.pop();
            }
            Value::Array(out)
        }
        other => other.clone(),
    }
}

/// Whether every string is a name a reference translates to the host. ("" is
/// left out: `check_patch` sends the strings there with `host_name`, which
/// names "" too, where a reference keeps it empty.)
fn all_translate_back(reached: &[String], namespace: &str, tenant: &str) -> bool {
    reached
        .iter()
        .all(|s| !s.is_empty() && reference_host_name(s, namespace, tenant).is_ok())
}

fn to_tenant<'a>(namespace: &'a str, tenant: &'a str) -> impl Fn(&str) -> String + 'a {
    move |s| {
        reference_name_of(s, namespace, tenant)
            .unwrap_or(s)
            .to_owned()
    }
}

fn check_patch(object: &Value, path: &FieldPath, namespace: &str, tenant: &str) {
    let mark = |s: &str| format!("{s}\u{0}rewritten");
    let mut got = object.clone();
    rewrite_strings(&mut got, path, &mark);
    let mut reached = Vec::new();
    let expected = reference_rewrite(object, &path.steps, &mut Vec::new(), &mut reached, &mark);
    assert_eq!(got, expected, "{}", path.text);
    // There and back.
    let mut there = object.clone();
    rewrite_strings(&mut there, path, &|s| host_name(s, namespace, tenant));
    rewrite_strings(&mut there, path, &to_tenant(namespace, tenant));
    if all_translate_back(&reached, namespace, tenant) {
        assert_eq!(&there, object, "{} there and back", path.text);
    }
}

// ---------------------------------------------------------------------------------
// Mirrors and copies.

fn widgets(direction: Direction, patches: Vec<FieldPath>) -> ResolvedType {
    ResolvedType {
        resource: SyncResource {
            direction,
            key: "widgets.example.com/v1".into(),
            plural: "widgets".into(),
            group: "example.com".into(),
            version: Some("v1".into()),
            scope: Scope::Namespaced,
            patches,
            mappings: Vec::new(),
        },
        api: ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("example.com", "v1", KIND),
            "widgets",
        ),
        status_subresource: true,
        aggregated: false,
    }
}

fn meta<'a>(object: &'a Value, name: &str) -> &'a str {
    object["metadata"][name].as_str().unwrap_or_default()
}

fn in_status(path: &FieldPath) -> bool {
    path.steps.first() == Some(&PathStep::Key("status".into()))
}

/// `object` with `translate` on every string the type's patch paths reach (those
/// under status when `status`, the others when not); the strings go to `reached`.
fn translated(
    ty: &ResolvedType,
    object: &Value,
    status: bool,
    translate: &dyn Fn(&str) -> String,
    reached: &mut Vec<String>,
) -> Value {
    let paths = ty.resource.patches.iter();
    paths
        .filter(|p| in_status(p) == status)
        .fold(object.clone(), |object, path| {
            reference_rewrite(&object, &path.steps, &mut Vec::new(), reached, translate)
        })
}

fn check_mirror(ty: &ResolvedType, tenant: &str, object: &Value, host: &Value) {
    let (name, namespace, uid) = (
        meta(object, "name"),
        meta(object, "namespace"),
        meta(object, "uid"),
    );
    // The mirror's own fields: the tenant's but metadata and status (the
    // configuration refuses patches into metadata).
    let mut own = Map::new();
    own.insert("apiVersion".into(), json!(API_VERSION));
    own.insert("kind".into(), json!(KIND));
    for (k, v) in object.as_object().into_iter().flatten() {
        if !matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
            own.insert(k.clone(), v.clone());
        }
    }
    let own = Value::Object(own);
    // Refused exactly when a reference among them has no one-to-one host name.
    let mut references = Vec::new();
    translated(ty, &own, false, &|s| s.to_owned(), &mut references);
    let refused_for = |tenant: &str| {
        references
            .iter()
            .any(|r| reference_host_name(r, namespace, tenant).is_err())
    };
    let ambiguous = refused_for(tenant);
    let desired = match desired_mirror(ty, tenant, PROJECT, HOST_NAMESPACE, object) {
        Ok(desired) => {
            assert!(!ambiguous, "an ambiguous reference translated");
            desired
        }
        Err(refused) => {
            assert!(
                ambiguous,
                "refused without an ambiguous reference: {refused}"
            );
            return;
        }
    };
    let metadata = &desired["metadata"];
    let host_name = host_name(name, namespace, tenant);
    assert_eq!(metadata["name"], host_name);
    assert_eq!(metadata["namespace"], HOST_NAMESPACE);
    let (labels, annotations) = (
        map(&desired, Keys::Labels),
        map(&desired, Keys::Annotations),
    );
    // The identity, whatever the tenant put under those keys.
    let identity_labels = BTreeMap::from([
        (names::MANAGED_BY, label_value(tenant)),
        (names::NAMESPACE_LABEL, label_value(namespace)),
    ]);
    let identity_annotations = BTreeMap::from([
        (names::OBJECT_NAME, name.to_owned()),
        (names::OBJECT_NAMESPACE, namespace.to_owned()),
        (names::OBJECT_UID, uid.to_owned()),
        (names::TENANT_PROJECT, PROJECT.to_owned()),
        (names::OBJECT_KIND, kind_annotation(API_VERSION, KIND)),
        (names::OBJECT_HOST_NAME, host_name.clone()),
        (names::OBJECT_HOST_NAMESPACE, HOST_NAMESPACE.to_owned()),
    ]);
    for (map, identity) in [
        (&labels, &identity_labels),
        (&annotations, &identity_annotations),
    ] {
        for (k, v) in identity {
            assert_eq!(map.get(*k), Some(&json!(v)), "{k}");
        }
    }
    // The tenant's other keys, and no others.
    for (k, v) in map(object, Keys::Labels) {
        if !identity_labels.contains_key(k.as_str()) {
            assert_eq!(labels.get(&k), Some(&v), "label {k}");
        }
    }
    let theirs = map(object, Keys::Annotations);
    for (k, v) in &theirs {
        let ours = identity_annotations.contains_key(k.as_str())
            || names::NOT_COPIED.contains(&k.as_str())
            || is_record(Keys::Annotations, k);
        if !ours {
            assert_eq!(annotations.get(k), Some(v), "annotation {k}");
        }
    }
    for k in names::NOT_COPIED {
        assert!(!annotations.contains_key(k), "{k} copied");
    }
    let tenants = map(object, Keys::Labels);
    assert!(labels
        .keys()
        .all(|k| tenants.contains_key(k) || identity_labels.contains_key(k.as_str())));
    assert!(annotations.keys().all(|k| theirs.contains_key(k)
        || identity_annotations.contains_key(k.as_str())
        || is_record(Keys::Annotations, k)));
    for keys in BOTH {
        assert_eq!(
            desired["metadata"]["annotations"][keys.record()],
            json!(record_of(&desired, keys)),
            "{keys:?} recorded"
        );
    }
    // The fields: the tenant's but status, names translated on the paths outside it.
    // (An empty reference names nothing and stays empty.)
    let to_host_name = |s: &str| match s {
        "" => String::new(),
        s => names::host_name(s, namespace, tenant),
    };
    let expected = translated(ty, &own, false, &to_host_name, &mut Vec::new());
    let mut got = desired.clone();
    if let Some(got) = got.as_object_mut() {
        got.remove("metadata");
    }
    assert_eq!(got, expected, "the mirror's fields");

    // Only this incarnation's mirror, and only this tenant's.
    assert!(same_mirror(&desired, &desired));
    if object["metadata"].is_object() {
        let mut reborn = object.clone();
        reborn["metadata"]["uid"] = json!(format!("{uid}-2"));
        let reborn = desired_mirror(ty, tenant, PROJECT, HOST_NAMESPACE, &reborn)
            .expect("its references are the same");
        assert!(!same_mirror(&desired, &reborn) && !same_mirror(&reborn, &desired));
    }
    let other_tenant = format!("{tenant}0");
    match desired_mirror(ty, &other_tenant, PROJECT, HOST_NAMESPACE, object) {
        Ok(other) => {
            assert!(!refused_for(&other_tenant));
            assert!(!same_mirror(&desired, &other) && !same_mirror(&other, &desired));
        }
        // One character longer, a reference's host name may be shortened.
        Err(refused) => assert!(refused_for(&other_tenant), "{refused}"),
    }
    // Nor that of the tenant of this name in another project.
    let elsewhere = desired_mirror(ty, tenant, "other-project", HOST_NAMESPACE, object)
        .expect("the references do not depend on the project");
    assert!(!same_mirror(&desired, &elsewhere) && !same_mirror(&elsewhere, &desired));

    // A replace of whatever the host has: the host's status stays, it is this
    // mirror, and it needs no further write.
    assert!(!mirror_differs(&desired, &desired));
    let replaced = replacement(&desired, host);
    assert_eq!(
        replaced.get("status"),
        host.get("status").filter(|s| !s.is_null())
    );
    assert!(same_mirror(&replaced, &desired), "{replaced}");
    if line_safe(&desired) {
        assert!(
            !mirror_differs(&desired, &replaced),
            "{desired}\n{replaced}"
        );
    }

    // The status back: host names on the status paths translated back.
    let to_tenant = to_tenant(namespace, tenant);
    let status = json!({"status": host["status"]});
    let expected = translated(ty, &status, true, &to_tenant, &mut Vec::new());
    assert_eq!(
        status_from_mirror(ty, tenant, namespace, host),
        expected["status"]
    );
    // The tenant's status as the host would write it comes back as it was.
    let mut reached = Vec::new();
    let status = json!({"status": object["status"]});
    let on_host = translated(ty, &status, true, &to_host_name, &mut reached);
    if all_translate_back(&reached, namespace, tenant) {
        assert_eq!(
            status_from_mirror(ty, tenant, namespace, &on_host),
            object["status"]
        );
    }
}

fn check_copy(ty: &ResolvedType, key: &Key, host: &Value, tenant: Option<&Value>) {
    let copy = desired_copy(ty, key, host, tenant);
    let host_fields = fields(host);
    assert_eq!(copy["apiVersion"], API_VERSION);
    assert_eq!(copy["kind"], KIND);
    let metadata = &copy["metadata"];
    assert_eq!(metadata["name"], key.name);
    let namespace = (!key.namespace.is_empty()).then(|| json!(key.namespace));
    assert_eq!(metadata.get("namespace"), namespace.as_ref());
    let annotations = &metadata["annotations"];
    let last = annotations[names::LAST_HOST_STATE]
        .as_str()
        .unwrap_or_default();
    let last: Value = serde_json::from_str(last).expect("the last host state is JSON");
    assert_eq!(last, host_fields, "the last host state");
    assert_eq!(
        annotations[names::OBJECT_HOST_NAME],
        host["metadata"]["name"]
    );
    let labels = map(host, Keys::Labels);
    assert_eq!(map(&copy, Keys::Labels), labels, "the host's labels");
    let mut listed: Vec<&str> = labels.keys().map(String::as_str).collect();
    listed.sort_unstable();
    assert_eq!(annotations[names::MANAGED_LABELS], json!(listed.join("\n")));
    match tenant {
        None => assert_eq!(fields(&copy), host_fields, "a new copy"),
        Some(t) => {
            let base: Option<Value> = t["metadata"]["annotations"][names::LAST_HOST_STATE]
                .as_str()
                .and_then(|s| serde_json::from_str(s).ok());
            if base.is_none() {
                assert_eq!(fields(&copy), host_fields, "without a base the host wins");
            } else if base.as_ref() == Some(&host_fields) {
                assert_eq!(fields(&copy), fields(t), "the host left it: the tenant's");
            }
        }
    }
    // The copy as written (replacing the tenant's) needs no further write.
    let mut stored = copy.clone();
    if let Some(t) = tenant {
        carry_over(&mut stored, t);
    }
    let next = desired_copy(ty, key, host, Some(&stored));
    if line_safe(host) {
        assert!(!copy_differs(&next, &stored), "{next}\n{stored}");
    }
}

// ---------------------------------------------------------------------------------
// Kubernetes' name rules, and inputs made to follow them.

/// A DNS-1123 label: 1 to 63 lower-case letters, digits and `-`, a letter or digit
/// at either end.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=MAX_NAME).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A DNS-1123 subdomain: at most 253 characters, labels separated by dots.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A label value of at most `max` characters: empty, or letters, digits, `-`, `_`
/// and `.` with a letter or digit at either end.
fn is_label_value(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || b"-_.".contains(c);
    b.len() <= max
        && (b.is_empty()
            || (b.iter().all(inner)
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()))
}

/// `text` as a DNS-1123 label.
fn dns_label(text: &str) -> String {
    let mapped: String = text
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .take(MAX_NAME)
        .collect();
    match mapped.trim_matches('-') {
        "" => "a".to_owned(),
        label => label.to_owned(),
    }
}

/// `text` as a DNS-1123 subdomain of up to three labels.
fn dns_subdomain(text: &str) -> String {
    let labels: Vec<String> = text.split('.').take(3).map(dns_label).collect();
    labels.join(".")
}

/// `text` in the characters of a label value, of any length.
fn label_chars(text: &str) -> String {
    let mapped: String = text
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
            _ => '-',
        })
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}
