//! Watch streams: initial state (synthetic ADDED or replayed history), then live
//! events in resourceVersion order, with bookmarks, timeouts and selector
//! transitions (an object leaving the selection is sent as DELETED, one entering it
//! as ADDED), as kube's watch cache does.

use crate::store::{Event, EventType, Store, TooOld};
use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

/// Decides whether an object belongs to the watch (namespace and selectors).
pub type Filter = Arc<dyn Fn(&Value) -> bool + Send + Sync>;
/// Writes a stored object as the client asked for it (version,
/// PartialObjectMetadata, Table) onto the end of an event's text, as JSON.
pub type Render = Arc<dyn Fn(&Value, &mut Vec<u8>) + Send + Sync>;

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Synthetic ADDED events for the current state, then live (rv unset or "0").
    CurrentState,
    /// Replay retained events after this resourceVersion, then live.
    From(u64),
    /// Watch-list: current state, then (with bookmarks allowed) the
    /// `k8s.io/initial-events-end` bookmark, then live.
    InitialEvents,
}

/// Everything a watch needs besides the store.
pub struct WatchSpec {
    pub group: String,
    pub resource: String,
    /// Only this namespace (namespaced watches).
    pub namespace: Option<String>,
    pub start: Start,
    pub allow_bookmarks: bool,
    pub timeout: Duration,
    /// `apiVersion`/`kind` of bookmark objects.
    pub api_version: String,
    pub kind: String,
    pub list_kind: String,
    pub filter: Filter,
    pub render: Render,
    /// The rendering is the stored object itself whenever its apiVersion is
    /// `api_version` (plain JSON watches): events are then serialized once and
    /// shared by all such watchers.
    pub render_is_identity: bool,
}

/// How often a long watch gets a progress bookmark.
const BOOKMARK_PERIOD: Duration = Duration::from_secs(60);

/// Writes `value` as JSON onto the end of `out`.
pub fn write_value(out: &mut Vec<u8>, value: &Value) {
    // A `Value` has only string keys and finite numbers, and a `Vec` takes every
    // write, so this cannot fail.
    let _ = serde_json::to_writer(out, value);
}

/// One line of a watch response: `{"type":…,"object":…}` in kube's key order, the
/// object written in place by `write_object` (no tree is built to hold it).
fn event_line(kind: &str, object_len: usize, write_object: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    let mut out = Vec::with_capacity(object_len + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    write_object(&mut out);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn line(kind: &str, object: &Value) -> Bytes {
    event_line(kind, 256, |out| write_value(out, object))
}

/// The event for `object` as `spec` renders it.
fn rendered_line(spec: &WatchSpec, kind: &str, object: &Value) -> Bytes {
    event_line(kind, 512, |out| (spec.render)(object, out))
}

/// The ERROR event kube sends when a watch starts before the retained history.
pub fn too_old_event(err: TooOld) -> Bytes {
    line(
        "ERROR",
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {} ({})", err.requested, err.oldest),
            "reason": "Expired", "code": 410,
        }),
    )
}

/// Starts a watch; the returned channel yields one JSON line per event and closes
/// when the watch ends (timeout, too old, slow consumer, shutdown).
pub fn start(
    store: Arc<Store>,
    spec: WatchSpec,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> mpsc::Receiver<Bytes> {
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let gr = (spec.group.clone(), spec.resource.clone());
    tokio::spawn(async move {
        let in_scope = |ns: &str| spec.namespace.as_deref().is_none_or(|want| want == ns);
        let (mut live, start_rv) = match spec.start {
            Start::CurrentState | Start::InitialEvents => {
                let (items, rv, live) = store.snapshot_and_watch(&gr, spec.namespace.as_deref());
                for obj in items.iter().filter(|o| (spec.filter)(o)) {
                    if tx.send(rendered_line(&spec, "ADDED", obj)).await.is_err() {
                        return;
                    }
                }
                if spec.start == Start::InitialEvents && spec.allow_bookmarks {
                    let blueprint = format!(
                        "{}\n",
                        json!({"apiVersion": spec.api_version, "items": [], "kind": spec.list_kind})
                    );
                    let bookmark = json!({
                        "apiVersion": spec.api_version, "kind": spec.kind,
                        "metadata": {
                            "annotations": {
                                "k8s.io/initial-events-end": "true",
                                "kubernetes.io/initial-events-list-blueprint":
                                    base64::engine::general_purpose::STANDARD.encode(blueprint),
                            },
                            "resourceVersion": rv.to_string(),
                        }
                    });
                    if tx.send(line("BOOKMARK", &bookmark)).await.is_err() {
                        return;
                    }
                }
                (live, rv)
            }
            Start::From(rv) => match store.watch_from(&gr, rv) {
                Ok((replay, live)) => {
                    let mut last = rv;
                    for e in replay {
                        last = e.rv;
                        if !in_scope(&e.namespace) {
                            continue;
                        }
                        if let Some(bytes) = encode(&spec, &e) {
                            if tx.send(bytes).await.is_err() {
                                return;
                            }
                        }
                    }
                    (live, last)
                }
                Err(too_old) => {
                    let _ = tx.send(too_old_event(too_old)).await;
                    return;
                }
            },
        };
        let deadline = Instant::now() + spec.timeout;
        let mut seen_rv = start_rv;
        let mut bookmarked_rv = start_rv;
        let mut next_bookmark = next_bookmark_at(Instant::now(), deadline);
        loop {
            tokio::select! {
                ev = live.recv() => match ev {
                    Ok(e) => {
                        if e.rv <= seen_rv {
                            continue;
                        }
                        seen_rv = e.rv;
                        if e.group != gr.0 || e.resource != gr.1 || !in_scope(&e.namespace) {
                            continue;
                        }
                        if let Some(bytes) = encode(&spec, &e) {
                            if tx.send(bytes).await.is_err() {
                                return;
                            }
                        }
                    }
                    // A watcher that falls this far behind ends; its client resumes
                    // from the last resourceVersion it saw, which is still retained.
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tokio::time::sleep_until(next_bookmark), if spec.allow_bookmarks => {
                    if seen_rv > bookmarked_rv {
                        bookmarked_rv = seen_rv;
                        let bm = json!({
                            "apiVersion": spec.api_version, "kind": spec.kind,
                            "metadata": {"resourceVersion": seen_rv.to_string()},
                        });
                        if tx.send(line("BOOKMARK", &bm)).await.is_err() {
                            return;
                        }
                    }
                    next_bookmark = Instant::now() + BOOKMARK_PERIOD;
                    if next_bookmark > deadline {
                        next_bookmark = deadline + Duration::from_secs(3600);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return,
                _ = shutdown.changed() => return,
                // The client went away: stop now rather than at the next event.
                _ = tx.closed() => return,
            }
        }
    });
    rx
}

/// kube schedules a bookmark 2 s before the watch's deadline (or after a minute
/// for long watches).
fn next_bookmark_at(now: Instant, deadline: Instant) -> Instant {
    let early = deadline.checked_sub(Duration::from_secs(2)).unwrap_or(now);
    let at = early.max(now + Duration::from_millis(200));
    at.min(now + BOOKMARK_PERIOD)
}

/// The event to send for a change, after selector transitions; `None` to skip.
fn encode(spec: &WatchSpec, e: &Event) -> Option<Bytes> {
    let now_in = (spec.filter)(&e.object);
    let was_in = e.prev.as_ref().is_some_and(|p| (spec.filter)(p));
    let kind = match e.kind {
        EventType::Added => now_in.then_some("ADDED"),
        EventType::Modified => match (was_in, now_in) {
            (true, true) => Some("MODIFIED"),
            (false, true) => Some("ADDED"),
            (true, false) => Some("DELETED"),
            (false, false) => None,
        },
        EventType::Deleted => (was_in || now_in).then_some("DELETED"),
    }?;
    let same_version =
        e.object.get("apiVersion").and_then(Value::as_str) == Some(spec.api_version.as_str());
    if spec.render_is_identity && same_version {
        let object = e.object_bytes();
        return Some(event_line(kind, object.len(), |out| {
            out.extend_from_slice(object)
        }));
    }
    Some(rendered_line(spec, kind, &e.object))
}

#[cfg(test)]
mod tests;
