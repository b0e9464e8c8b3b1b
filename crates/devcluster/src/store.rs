//! Object storage: every object in memory (for fast get/list/watch), written through
//! to redb when the cluster has a data directory.
//!
//! One global resourceVersion counts every write, as etcd's revision does. Each write
//! happens under one short, synchronous lock (never held across an await), which
//! makes "compare resourceVersion, then write" atomic and gives every event its place
//! in one total order. Events go to a broadcast channel for live watches and into a
//! bounded per-resource history, so a watch can resume from a recent resourceVersion.
//!
//! Persistence is asynchronous: a writer thread commits batches of changes (group
//! commit), and `shutdown` drains it. A crash may lose the last few milliseconds of
//! writes, which is acceptable for a development server and keeps writes fast.

use crate::error::Error;
use crate::registry::GroupResource;
use crproxy_core::locks;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::broadcast;

/// Events kept per resource for watches that resume from an older resourceVersion.
pub const HISTORY_PER_RESOURCE: usize = 4096;
/// Live events buffered per watcher before it is considered too slow and ended.
const BROADCAST_CAPACITY: usize = 16384;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventType,
    pub group: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
    /// The object after the change (for DELETED: the last state, with the deletion's
    /// resourceVersion).
    pub object: Arc<Value>,
    /// The object before the change (MODIFIED and DELETED), so watches with selectors
    /// can tell objects that leave or enter the selection.
    pub prev: Option<Arc<Value>>,
    /// `object` serialized once, shared by every watcher that sends it as is.
    pub object_json: std::sync::OnceLock<bytes::Bytes>,
}

impl Event {
    /// The object as JSON bytes (serialized on first use).
    pub fn object_bytes(&self) -> &bytes::Bytes {
        self.object_json.get_or_init(|| {
            bytes::Bytes::from(serde_json::to_vec(self.object.as_ref()).unwrap_or_default())
        })
    }
}

/// Live events of every resource.
pub type EventReceiver = broadcast::Receiver<Arc<Event>>;

/// What a mutation closure decided.
pub enum Mutation {
    /// Store this object (create or update). The store sets `resourceVersion`.
    Put(Value),
    /// Remove the object.
    Delete,
    /// Remove the object; this is its final state (an update that removed the last
    /// finalizer of an object being deleted).
    DeleteFinal(Value),
    /// Change nothing; answer with this object.
    Unchanged(Arc<Value>),
}

/// The outcome of [`Store::mutate`].
#[derive(Debug)]
pub struct Written {
    /// The stored object (or, for a delete, its final state).
    pub object: Arc<Value>,
    pub created: bool,
    pub deleted: bool,
}

/// A watch asked for a resourceVersion older than the retained history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooOld {
    pub requested: u64,
    pub oldest: u64,
}

type ObjectKey = (String, String);

#[derive(Default)]
struct ResourceData {
    objects: BTreeMap<ObjectKey, Arc<Value>>,
    history: VecDeque<Arc<Event>>,
    /// Events with rv <= floor may be missing from `history`.
    floor: u64,
}

struct State {
    rv: u64,
    /// The rv at open: history before it was not kept.
    start_rv: u64,
    resources: HashMap<GroupResource, ResourceData>,
}

enum PersistOp {
    /// Serialized on the writer thread, not under the store lock.
    Put {
        key: String,
        object: Arc<Value>,
        rv: u64,
    },
    Delete {
        key: String,
        rv: u64,
    },
    Flush(std::sync::mpsc::Sender<()>),
}

struct Persister {
    tx: Mutex<Option<std::sync::mpsc::Sender<PersistOp>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The object store. Cheap to share behind an `Arc`.
pub struct Store {
    state: RwLock<State>,
    events: broadcast::Sender<Arc<Event>>,
    persister: Option<Persister>,
}

const OBJECTS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("objects");
const META: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("meta");

fn db_key(gr: &GroupResource, ns: &str, name: &str) -> String {
    format!("{}\u{1}{}\u{1}{}\u{1}{}", gr.0, gr.1, ns, name)
}

fn store_err(e: impl std::fmt::Display) -> Error {
    Error::Store(e.to_string())
}

impl Store {
    /// An empty store that lives only in memory.
    pub fn in_memory() -> Self {
        Self::from_parts(1, HashMap::new(), None)
    }

    /// Opens (or creates) the redb file and loads every object into memory.
    pub fn open(path: &Path) -> Result<Self, Error> {
        let db = redb::Database::create(path).map_err(store_err)?;
        let mut resources: HashMap<GroupResource, ResourceData> = HashMap::new();
        let mut rv = 1;
        {
            let txn = db.begin_write().map_err(store_err)?;
            {
                txn.open_table(OBJECTS).map_err(store_err)?;
                txn.open_table(META).map_err(store_err)?;
            }
            txn.commit().map_err(store_err)?;
        }
        {
            use redb::{ReadableDatabase, ReadableTable};
            let txn = db.begin_read().map_err(store_err)?;
            let meta = txn.open_table(META).map_err(store_err)?;
            if let Some(v) = meta.get("rv").map_err(store_err)? {
                rv = v.value();
            }
            let objects = txn.open_table(OBJECTS).map_err(store_err)?;
            for entry in objects.iter().map_err(store_err)? {
                let (k, v) = entry.map_err(store_err)?;
                let key = k.value().to_string();
                let mut parts = key.split('\u{1}');
                let (Some(g), Some(r), Some(ns), Some(name)) =
                    (parts.next(), parts.next(), parts.next(), parts.next())
                else {
                    continue;
                };
                let Ok(obj) = serde_json::from_slice::<Value>(v.value()) else {
                    continue;
                };
                resources
                    .entry((g.to_string(), r.to_string()))
                    .or_default()
                    .objects
                    .insert((ns.to_string(), name.to_string()), Arc::new(obj));
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("devcluster-store".into())
            .spawn(move || persist_loop(db, rx))
            .map_err(|e| Error::io(path, e))?;
        let persister = Persister {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        };
        Ok(Self::from_parts(rv, resources, Some(persister)))
    }

    fn from_parts(
        rv: u64,
        mut resources: HashMap<GroupResource, ResourceData>,
        persister: Option<Persister>,
    ) -> Self {
        for data in resources.values_mut() {
            data.floor = rv;
        }
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        Store {
            state: RwLock::new(State {
                rv,
                start_rv: rv,
                resources,
            }),
            events,
            persister,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        locks::read(&self.state)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        locks::write(&self.state)
    }

    /// The newest resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.read().rv
    }

    pub fn get(&self, gr: &GroupResource, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.read()
            .resources
            .get(gr)?
            .objects
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Every object of a resource (in one namespace, or all), ordered by namespace
    /// then name, with the resourceVersion the snapshot was taken at.
    pub fn list(&self, gr: &GroupResource, ns: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let state = self.read();
        (list_locked(&state, gr, ns), state.rv)
    }

    /// Names of every namespaced object in `ns`, across resources.
    pub fn objects_in_namespace(&self, ns: &str) -> Vec<(GroupResource, String)> {
        let state = self.read();
        let mut out = Vec::new();
        for (gr, data) in &state.resources {
            for (k, _) in data
                .objects
                .range((ns.to_string(), String::new())..)
                .take_while(|(k, _)| k.0 == ns)
            {
                out.push((gr.clone(), k.1.clone()));
            }
        }
        out
    }

    /// Objects whose `metadata.ownerReferences` name `owner_uid`: in `namespace`
    /// (a namespaced owner), or anywhere (a cluster-scoped owner).
    pub fn dependents_of(
        &self,
        owner_uid: &str,
        namespace: Option<&str>,
    ) -> Vec<(GroupResource, String, String)> {
        let state = self.read();
        let mut out = Vec::new();
        for (gr, data) in &state.resources {
            let objects: Box<dyn Iterator<Item = (&ObjectKey, &Arc<Value>)>> = match namespace {
                Some(ns) => Box::new(
                    data.objects
                        .range((ns.to_string(), String::new())..)
                        .take_while(move |(k, _)| k.0 == ns),
                ),
                None => Box::new(data.objects.iter()),
            };
            for (key, obj) in objects {
                let owned = obj
                    .get("metadata")
                    .and_then(|m| m.get("ownerReferences"))
                    .and_then(Value::as_array)
                    .is_some_and(|refs| {
                        refs.iter()
                            .any(|r| r.get("uid").and_then(Value::as_str) == Some(owner_uid))
                    });
                if owned {
                    out.push((gr.clone(), key.0.clone(), key.1.clone()));
                }
            }
        }
        out
    }

    /// Atomically reads the current object, lets `f` decide, and applies the decision.
    /// `f` runs under the store lock: keep it short and synchronous. With `dry_run`
    /// nothing is stored and the returned object has no new resourceVersion.
    pub fn mutate<E>(
        &self,
        gr: &GroupResource,
        ns: &str,
        name: &str,
        dry_run: bool,
        f: impl FnOnce(Option<&Arc<Value>>) -> Result<Mutation, E>,
    ) -> Result<Written, E> {
        let mut state = self.write();
        let key = (ns.to_string(), name.to_string());
        let current = state
            .resources
            .get(gr)
            .and_then(|d| d.objects.get(&key))
            .cloned();
        let decision = f(current.as_ref())?;
        Ok(self.apply_locked(&mut state, gr, ns, name, dry_run, current, decision))
    }

    /// Commits `decision` only if the stored object is still exactly `expected`
    /// (the one the decision was made from, e.g. before calling webhooks); None
    /// when someone wrote it meanwhile.
    pub fn mutate_if_unchanged(
        &self,
        gr: &GroupResource,
        ns: &str,
        name: &str,
        dry_run: bool,
        expected: &Arc<Value>,
        decision: Mutation,
    ) -> Option<Written> {
        self.mutate(gr, ns, name, dry_run, |now| match now {
            Some(now) if Arc::ptr_eq(now, expected) => Ok(decision),
            _ => Err(()),
        })
        .ok()
    }

    /// Like [`Store::mutate`], but runs `f` outside the lock: it reads the current
    /// object, decides, and commits only if nobody wrote the object meanwhile
    /// (retrying a few times, then deciding under the lock). Use it where deciding
    /// is expensive (patches, schema validation, admission), so reads and other
    /// writes are not held up.
    pub fn mutate_optimistic<E>(
        &self,
        gr: &GroupResource,
        ns: &str,
        name: &str,
        dry_run: bool,
        mut f: impl FnMut(Option<&Arc<Value>>) -> Result<Mutation, E>,
    ) -> Result<Written, E> {
        let key = (ns.to_string(), name.to_string());
        for _ in 0..3 {
            let current = self.get(gr, ns, name);
            let decision = f(current.as_ref())?;
            let mut state = self.write();
            let now = state
                .resources
                .get(gr)
                .and_then(|d| d.objects.get(&key))
                .cloned();
            let unchanged = match (&current, &now) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            };
            if unchanged {
                return Ok(self.apply_locked(&mut state, gr, ns, name, dry_run, current, decision));
            }
        }
        self.mutate(gr, ns, name, dry_run, f)
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_locked(
        &self,
        state: &mut State,
        gr: &GroupResource,
        ns: &str,
        name: &str,
        dry_run: bool,
        current: Option<Arc<Value>>,
        decision: Mutation,
    ) -> Written {
        let key = (ns.to_string(), name.to_string());
        match decision {
            Mutation::Unchanged(obj) => Written {
                object: obj,
                created: false,
                deleted: false,
            },
            Mutation::Put(mut obj) => {
                let created = current.is_none();
                if dry_run {
                    return Written {
                        object: Arc::new(obj),
                        created,
                        deleted: false,
                    };
                }
                let rv = state.rv + 1;
                state.rv = rv;
                set_rv(&mut obj, rv);
                let obj = Arc::new(obj);
                let kind = if created {
                    EventType::Added
                } else {
                    EventType::Modified
                };
                let data = state.resources.entry(gr.clone()).or_default();
                data.objects.insert(key, obj.clone());
                self.persist_put(gr, ns, name, &obj, rv);
                self.emit(state, gr, ns, name, kind, obj.clone(), current, rv);
                Written {
                    object: obj,
                    created,
                    deleted: false,
                }
            }
            Mutation::Delete | Mutation::DeleteFinal(_) => {
                let final_state = match decision {
                    Mutation::DeleteFinal(v) => Some(v),
                    _ => None,
                };
                let Some(prev) = current else {
                    // Nothing to delete: the closure should have refused; answer with
                    // an empty object rather than panic.
                    return Written {
                        object: Arc::new(Value::Null),
                        created: false,
                        deleted: false,
                    };
                };
                if dry_run {
                    return Written {
                        object: final_state.map(Arc::new).unwrap_or(prev),
                        created: false,
                        deleted: true,
                    };
                }
                let rv = state.rv + 1;
                state.rv = rv;
                let mut last = final_state.unwrap_or_else(|| (*prev).clone());
                set_rv(&mut last, rv);
                let last = Arc::new(last);
                if let Some(data) = state.resources.get_mut(gr) {
                    data.objects.remove(&key);
                }
                self.persist_delete(gr, ns, name, rv);
                self.emit(
                    state,
                    gr,
                    ns,
                    name,
                    EventType::Deleted,
                    last.clone(),
                    Some(prev),
                    rv,
                );
                Written {
                    object: last,
                    created: false,
                    deleted: true,
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn emit(
        &self,
        state: &mut State,
        gr: &GroupResource,
        ns: &str,
        name: &str,
        kind: EventType,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
        rv: u64,
    ) {
        let start = state.start_rv;
        let event = Arc::new(Event {
            rv,
            kind,
            group: gr.0.clone(),
            resource: gr.1.clone(),
            namespace: ns.to_string(),
            name: name.to_string(),
            object,
            prev,
            object_json: std::sync::OnceLock::new(),
        });
        let data = state.resources.entry(gr.clone()).or_default();
        if data.floor == 0 {
            data.floor = start;
        }
        data.history.push_back(event.clone());
        while data.history.len() > HISTORY_PER_RESOURCE {
            if let Some(old) = data.history.pop_front() {
                data.floor = old.rv;
            }
        }
        // No receivers is fine: nobody watches.
        let _ = self.events.send(event);
    }

    /// Forgets the watch history: watches must start at the current version or later
    /// (used after bootstrap writes, so a fresh cluster behaves like a compacted one).
    pub fn compact_history(&self) {
        let mut state = self.write();
        let rv = state.rv;
        state.start_rv = rv;
        for data in state.resources.values_mut() {
            data.history.clear();
            data.floor = rv;
        }
    }

    /// The resourceVersion of the last change to a resource (or the version the
    /// store opened at): caches of derived data compare it to know when to rebuild.
    pub fn last_change(&self, gr: &GroupResource) -> u64 {
        let state = self.read();
        state
            .resources
            .get(gr)
            .and_then(|d| d.history.back().map(|e| e.rv).or(Some(d.floor)))
            .unwrap_or(state.start_rv)
    }

    /// Number of objects of a resource.
    pub fn count(&self, gr: &GroupResource) -> usize {
        self.read()
            .resources
            .get(gr)
            .map(|d| d.objects.len())
            .unwrap_or(0)
    }

    /// Subscribes to live events after replaying the retained ones newer than `rv`.
    pub fn watch_from(
        &self,
        gr: &GroupResource,
        rv: u64,
    ) -> Result<(Vec<Arc<Event>>, EventReceiver), TooOld> {
        let state = self.read();
        let floor = state
            .resources
            .get(gr)
            .map(|d| {
                if d.floor == 0 {
                    state.start_rv
                } else {
                    d.floor
                }
            })
            .unwrap_or(state.start_rv);
        if rv < floor {
            return Err(TooOld {
                requested: rv,
                oldest: floor,
            });
        }
        let replay = state
            .resources
            .get(gr)
            .map(|d| d.history.iter().filter(|e| e.rv > rv).cloned().collect())
            .unwrap_or_default();
        Ok((replay, self.events.subscribe()))
    }

    /// A consistent snapshot plus a subscription to everything after it.
    pub fn snapshot_and_watch(
        &self,
        gr: &GroupResource,
        ns: Option<&str>,
    ) -> (Vec<Arc<Value>>, u64, broadcast::Receiver<Arc<Event>>) {
        let state = self.read();
        let items = list_locked(&state, gr, ns);
        (items, state.rv, self.events.subscribe())
    }

    /// How many live subscriptions (watches, controllers) exist.
    pub fn subscriber_count(&self) -> usize {
        self.events.receiver_count()
    }

    /// A subscription to all live events (controllers use it to wake up).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }

    fn persist_put(&self, gr: &GroupResource, ns: &str, name: &str, obj: &Arc<Value>, rv: u64) {
        if let Some(p) = &self.persister {
            p.send(PersistOp::Put {
                key: db_key(gr, ns, name),
                object: obj.clone(),
                rv,
            });
        }
    }

    fn persist_delete(&self, gr: &GroupResource, ns: &str, name: &str, rv: u64) {
        if let Some(p) = &self.persister {
            p.send(PersistOp::Delete {
                key: db_key(gr, ns, name),
                rv,
            });
        }
    }

    /// Waits until every write so far is committed to disk.
    pub fn flush(&self) {
        if let Some(p) = &self.persister {
            let (tx, rx) = std::sync::mpsc::channel();
            p.send(PersistOp::Flush(tx));
            let _ = rx.recv_timeout(std::time::Duration::from_secs(30));
        }
    }

    /// Flushes and stops the writer thread. Later writes stay in memory only.
    pub fn close(&self) {
        if let Some(p) = &self.persister {
            let tx = locks::lock(&p.tx).take();
            drop(tx);
            let thread = locks::lock(&p.thread).take();
            if let Some(t) = thread {
                let _ = t.join();
            }
        }
    }
}

impl Persister {
    fn send(&self, op: PersistOp) {
        if let Some(tx) = locks::lock(&self.tx).as_ref() {
            let _ = tx.send(op);
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.close();
    }
}

fn list_locked(state: &State, gr: &GroupResource, ns: Option<&str>) -> Vec<Arc<Value>> {
    let Some(data) = state.resources.get(gr) else {
        return Vec::new();
    };
    match ns {
        Some(ns) => data
            .objects
            .range((ns.to_string(), String::new())..)
            .take_while(|(k, _)| k.0 == ns)
            .map(|(_, v)| v.clone())
            .collect(),
        None => data.objects.values().cloned().collect(),
    }
}

fn persist_loop(db: redb::Database, rx: std::sync::mpsc::Receiver<PersistOp>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < 1024 {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let mut flushes = Vec::new();
        let result = (|| -> Result<(), redb::Error> {
            let txn = db.begin_write()?;
            {
                let mut objects = txn.open_table(OBJECTS)?;
                let mut meta = txn.open_table(META)?;
                let mut max_rv = 0;
                for op in batch {
                    match op {
                        PersistOp::Put { key, object, rv } => {
                            let bytes = serde_json::to_vec(object.as_ref()).unwrap_or_default();
                            objects.insert(key.as_str(), bytes.as_slice())?;
                            max_rv = max_rv.max(rv);
                        }
                        PersistOp::Delete { key, rv } => {
                            objects.remove(key.as_str())?;
                            max_rv = max_rv.max(rv);
                        }
                        PersistOp::Flush(tx) => flushes.push(tx),
                    }
                }
                if max_rv > 0 {
                    meta.insert("rv", max_rv)?;
                }
            }
            txn.commit()?;
            Ok(())
        })();
        if let Err(e) = result {
            tracing::error!(error = %e, "devcluster store: commit failed");
        }
        for f in flushes {
            let _ = f.send(());
        }
    }
}

// ---- small helpers over object JSON ----

/// `metadata.<field>` as a string, or "".
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The object's resourceVersion as a number (0 when absent or malformed).
pub fn object_rv(obj: &Value) -> u64 {
    meta_str(obj, "resourceVersion").parse().unwrap_or(0)
}

pub fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

/// `metadata.labels` of an object.
pub fn labels(obj: &Value) -> Option<&Value> {
    obj.get("metadata").and_then(|m| m.get("labels"))
}

#[cfg(test)]
mod tests;
