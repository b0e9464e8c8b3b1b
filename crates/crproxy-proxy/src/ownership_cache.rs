//! What this client owns on the target, per resource, as a label-selected metadata
//! watch last saw it: the uid and resourceVersion of every owned object.
//!
//! Owned-mode PUT, PATCH and DELETE use it to skip the ownership GET: a hit gives
//! the pin (`crproxy_core::precondition::Pin`) the mutation carries, so the write
//! goes out in one exchange. The pin is what keeps this safe, not the cache: the
//! target applies the write only if the object still has the pinned uid and
//! resourceVersion (or, for a JSON patch, still passes the `test` operations on uid
//! and owner labels), and the cache only ever holds states that carried both owner
//! labels. A stale entry therefore makes the target refuse the write, and the
//! handler falls back to the GET-then-write path; it can never make a write land on
//! a state that was not owned.
//!
//! Each resource's watch starts on the first lookup (that request takes the slow
//! path), runs through the data path's own pool with the client's credentials,
//! on an HTTP/1.1 connection of its own that the watch's task reads itself (no
//! connection task to hand each event over), reads its events in batches
//! ([`EVENT_BATCH_PAUSE`] apart, its socket resting in between),
//! asks for `PartialObjectMetadata` so only metadata crosses the wire, and stops
//! when no request has looked at the resource for [`IDLE_DROP`]. A resource with
//! more than [`MAX_OBJECTS`] owned objects is not cached (every write takes the
//! slow path) so memory stays bounded. Successful writes record their answer
//! ([`OwnershipCache::remember`]), so a write right after another one through this
//! proxy finds the new resourceVersion without waiting for the watch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt as _;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crproxy_core::ownership::{self, Owner};
use crproxy_core::precondition::Pin;
use crproxy_core::request;

use crate::pool::{BoxError, ConnectionSocket, ProxyBody};
use crate::resting_socket::RestingSocket;
use crate::transport::{self, ForwardError, TargetConnection, TargetPath, MAX_BUFFERED_BODY};
use crate::watch_lines::WatchLines;
use crate::watches::{WATCH_IDLE_LIMIT, WATCH_TIMEOUT_SECONDS};
use crproxy_core::locks;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::DefaultBackoff;
use meta::{Event, MetaList, ObjectMeta};

/// A resource nobody wrote to for this long loses its watch and its entries.
pub const IDLE_DROP: Duration = Duration::from_secs(600);
/// More owned objects than this in one resource and the resource is not cached.
pub const MAX_OBJECTS: usize = 50_000;
/// Resources watched at once per group/version. Resource names come from request
/// paths, so without a bound callers could start a watch per made-up name; past it
/// a new resource's writes take the checked path until an idle one is dropped.
pub const MAX_RESOURCES: usize = 64;
/// After a resource proved too large, how long until it is listed again.
pub const OVERFLOW_PAUSE: Duration = Duration::from_secs(300);
/// Objects per page of a list: large pages keep the list short, so it completes
/// (and its resourceVersion is still watchable) while the resource is written to
/// heavily; a page stays far below the 16 MiB a response may take.
const LIST_PAGE: usize = 2000;

/// How long the watch rests after reading what had arrived. Events of owned
/// writes come as fast as the writes; reading each as it lands costs a wake-up of
/// a worker thread per event, often one that was idle. Resting lets them gather
/// in the socket and be read together. A cache this much further behind only
/// sends more writes down the checked path. This replica's own creates, updates
/// and patches do not wait for it (their answers are remembered at once); writes
/// made elsewhere (another replica, or straight on the target) do, so a write
/// through this replica within this pause of one of those takes the checked
/// path. 10 ms rather than 2: at most
/// 100 reads a second instead of 500 under a steady stream of writes, a few µs
/// less CPU per DELETE (docs/performance.md, twenty-first pass). The socket rests
/// too ([`crate::resting_socket`]): arrivals during the pause wake no thread.
const EVENT_BATCH_PAUSE: Duration = Duration::from_millis(10);

/// Upper bound for one list page or one request of the cache's own.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

const LIST_ACCEPT: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
const WATCH_ACCEPT: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// What the cache knows about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Owned, last seen in this state.
    Hit(Pin),
    /// Not among the owned objects the cache knows of.
    Miss,
    /// The resource's watch has not (or no longer) synced: nothing is known.
    Unsynced,
}

/// The owned objects of one group/version's resources.
pub struct OwnershipCache {
    shared: Arc<Shared>,
}

struct Shared {
    /// `/apis/<group>/<version>`.
    prefix: String,
    owner: Owner,
    target: TargetConnection,
    resources: Mutex<HashMap<String, Watched>>,
}

struct Watched {
    objects: Arc<Objects>,
    task: AbortHandle,
}

/// One resource's owned objects, keyed by `namespace/name` (`name` when cluster
/// scoped).
#[derive(Default)]
struct Objects {
    state: RwLock<State>,
    last_used: Mutex<Option<Instant>>,
}

#[derive(Default)]
struct State {
    /// Listed at least once, and not out of step for longer than the idle limit.
    synced: bool,
    pins: HashMap<String, Pin>,
    /// For objects this proxy wrote or deleted without learning the state the
    /// write left (a delete, an answer in another form than JSON, an object no
    /// longer owned): the resourceVersion of the latest state the write went
    /// past. The watch, behind the writes, may still bring that state or an
    /// earlier one, and must not make it a pin again: a pin to it is sure to be
    /// refused. (A JSON patch is pinned by its tests, not to a resourceVersion:
    /// a state it found past its pin is not known here and may still become a
    /// pin, for one refused write.) An entry goes once the watch is past it, a
    /// list at or past it completes, a write answers with a later state, or the
    /// cache unsyncs; at most [`MAX_OBJECTS`] are kept.
    superseded: HashMap<String, String>,
    /// The resourceVersion the watch has delivered everything up to (the last
    /// list's, then the last read's). A write's answer at or before it is older
    /// news than the watch's.
    watched_at: String,
    /// When the cache was last known to follow the target (a list completed or a
    /// read of the watch brought events).
    in_step_at: Option<Instant>,
}

impl OwnershipCache {
    /// A cache that watches through `target` (its pool and credentials).
    pub fn new(group: &str, version: &str, owner: Owner, target: &TargetConnection) -> Self {
        let target = target.clone();
        Self {
            shared: Arc::new(Shared {
                prefix: format!("/apis/{group}/{version}"),
                owner,
                target,
                resources: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Looks an object up, starting the resource's watch on first use.
    pub fn lookup(&self, resource: &str, namespace: Option<&str>, name: &str) -> Lookup {
        let objects = self.objects(resource);
        *locks::lock(&objects.last_used) = Some(Instant::now());
        let state = locks::read(&objects.state);
        if !state.synced {
            return Lookup::Unsynced;
        }
        match state.pins.get(&key(namespace, name)) {
            Some(pin) => Lookup::Hit(pin.clone()),
            None => Lookup::Miss,
        }
    }

    /// Records the object a successful write answered with, if it is owned: the
    /// next write of it through this proxy then finds its new resourceVersion,
    /// without waiting for the watch to bring it. `name` is the object the write
    /// addressed; `None` for a create, whose object the answer names (it may have
    /// asked for a generated name). `sent_with` is the state the write was
    /// pinned to, if it was. An answer that cannot be read, or that names another
    /// object, still says the addressed object changed: see [`Self::forget`].
    pub fn remember(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
        sent_with: Option<&Pin>,
        answer: &[u8],
    ) {
        let Some(answered) = read_write_answer(&self.shared.owner, namespace, name, answer) else {
            if let Some(name) = name {
                self.forget(resource, namespace, name, sent_with);
            }
            return;
        };
        let Some(objects) = self.running(resource) else {
            return;
        };
        let mut state = locks::write(&objects.state);
        match answered {
            // A new entry only into a synced cache under its limit: an unsynced
            // one answers no lookup, and in the pause after it outgrew the limit
            // nothing else would bound what creates add.
            WriteAnswer::Owned { key, pin } => {
                if state.pins.contains_key(&key) || state.admits_new_entry() {
                    state.record_answer(key, pin, sent_with);
                }
            }
            WriteAnswer::NotOwned { key } => state.supersede(&key, sent_with),
        }
    }

    /// Drops what is known about an object this proxy just deleted, or wrote
    /// without learning its new state (`sent_with`: the state the write was
    /// pinned to, if it was). Its next write takes the checked path rather than a
    /// pin that is sure to fail, until a later state of it arrives.
    pub fn forget(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
        sent_with: Option<&Pin>,
    ) {
        if let Some(objects) = self.running(resource) {
            locks::write(&objects.state).supersede(&key(namespace, name), sent_with);
        }
    }

    fn running(&self, resource: &str) -> Option<Arc<Objects>> {
        locks::lock(&self.shared.resources)
            .get(resource)
            .map(|watched| Arc::clone(&watched.objects))
    }

    fn objects(&self, resource: &str) -> Arc<Objects> {
        let mut resources = locks::lock(&self.shared.resources);
        if let Some(watched) = resources.get(resource) {
            return Arc::clone(&watched.objects);
        }
        // Resource names are DNS labels (a CRD's plural is one); any other name,
        // which a caller can put in a path, gets no watch of its own and no slot:
        // never synced and not kept, the lookup answers Unsynced.
        if resources.len() >= MAX_RESOURCES || !crproxy_core::config::is_dns_label(resource) {
            return Arc::new(Objects::default());
        }
        let objects = Arc::new(Objects::default());
        let task = tokio::spawn(watch_resource(
            Arc::downgrade(&self.shared),
            resource.to_string(),
            Arc::clone(&objects),
        ));
        resources.insert(
            resource.to_string(),
            Watched {
                objects: Arc::clone(&objects),
                task: task.abort_handle(),
            },
        );
        objects
    }
}

impl Drop for OwnershipCache {
    fn drop(&mut self) {
        for watched in locks::lock(&self.shared.resources).values() {
            watched.task.abort();
        }
    }
}

impl State {
    /// Whether one more object stays within [`MAX_OBJECTS`].
    fn has_room(&self) -> bool {
        self.pins.len() < MAX_OBJECTS
    }

    fn admits_new_entry(&self) -> bool {
        self.synced && self.has_room()
    }

    /// Keeps the newer of two states of an object, of one incarnation or of two
    /// (a late event of a deleted object's must not replace its successor's
    /// remembered create), and never a state known to be superseded.
    fn record(&mut self, key: String, pin: Pin) {
        let superseded = self
            .superseded
            .get(&key)
            .is_some_and(|past| is_no_later(&pin.resource_version, past));
        let older = self
            .pins
            .get(&key)
            .is_some_and(|current| is_earlier(&pin.resource_version, &current.resource_version));
        if !superseded && !older {
            self.pins.insert(key, pin);
        }
    }

    /// Replaces the pins with those of a list completed at `listed_at`, and
    /// marks the cache synced.
    fn take_list(&mut self, mut listed: HashMap<String, Pin>, listed_at: &str) {
        // A list that began before this proxy wrote past a state may still hold
        // it. The watch resumes from the list, so once the list is at or past
        // the superseded state, no event can bring that state back.
        for (key, past) in &self.superseded {
            if listed
                .get(key)
                .is_some_and(|pin| is_no_later(&pin.resource_version, past))
            {
                listed.remove(key);
            }
        }
        // The watch goes on from the list.
        self.watched_to(listed_at);
        // Keep only what is newer than the list (which assumes one counter for
        // the collection and its objects, as above): written through this
        // proxy while it ran (a later state of a listed object, another
        // incarnation of its name, an object created after the list began),
        // within the bound on entries.
        let previous = std::mem::replace(&mut self.pins, listed);
        for (key, pin) in previous {
            if is_earlier(listed_at, &pin.resource_version)
                && (self.pins.contains_key(&key) || self.has_room())
            {
                self.record(key, pin);
            }
        }
        self.synced = true;
    }

    /// Records a successful write's answer (`sent_with`: the state the write was
    /// pinned to, if it was): the object's state right after the write, unless
    /// the watch has already delivered it or a later state (a late answer; the
    /// object may be gone since). It ends a superseded entry it is later than; a
    /// write that changed nothing answers with the very state it was pinned to,
    /// which is then current. That cannot be told from a late answer of a write
    /// that changed nothing, superseded since by another write that has not yet
    /// reached the watch: that case pins a superseded state, for one refused
    /// write.
    fn record_answer(&mut self, key: String, pin: Pin, sent_with: Option<&Pin>) {
        if is_no_later(&pin.resource_version, &self.watched_at) {
            return;
        }
        let unchanged = sent_with.is_some_and(|sent| sent.resource_version == pin.resource_version);
        if self.superseded.get(&key).is_some_and(|past| {
            is_earlier(past, &pin.resource_version) || (unchanged && *past == pin.resource_version)
        }) {
            self.superseded.remove(&key);
        }
        self.record(key, pin);
    }

    /// The object under `key` has moved past what is known of it and past the
    /// state a write was pinned to (`sent_with`), whichever is later. A known
    /// state later than the pin may be what the write left (the watch brought it
    /// first) or what it found (a JSON patch is pinned by its tests, not to a
    /// resourceVersion): it is superseded too, at the cost of a hit.
    fn supersede(&mut self, key: &str, sent_with: Option<&Pin>) {
        let known = [
            self.pins.remove(key).map(|pin| pin.resource_version),
            sent_with.map(|pin| pin.resource_version.clone()),
            self.superseded.remove(key),
        ];
        let latest = known
            .into_iter()
            .flatten()
            .reduce(|a, b| if is_earlier(&a, &b) { b } else { a });
        // Past the bound (a resource written faster than its watch follows, or
        // not watched while it is too large), a superseded state may become a
        // pin again: one refused write.
        if let Some(past) = latest.filter(|_| self.superseded.len() < MAX_OBJECTS) {
            self.superseded.insert(key.to_string(), past);
        }
    }

    /// The watch has delivered everything up to `resource_version` (or a list
    /// was taken there): the cache is in step now, and the states superseded at
    /// or before it can no longer come from it. `resource_version` is read once,
    /// not once an entry (see [`is_earlier`]: one that is not a number ends them
    /// all).
    fn watched_to(&mut self, resource_version: &str) {
        self.in_step_at = Some(Instant::now());
        resource_version.clone_into(&mut self.watched_at);
        if self.superseded.is_empty() {
            return;
        }
        match resource_version.parse::<u64>() {
            Ok(position) => self
                .superseded
                .retain(|_, past| past.parse::<u64>().is_ok_and(|past| position < past)),
            Err(_) => self.superseded.clear(),
        }
    }
}

/// resourceVersions are opaque to clients; the cache compares them as numbers
/// (what etcd and devcluster hand out, one counter for every object) only to
/// order the states of one object it hears of from the watch, lists and write
/// answers. A wrong guess costs one refused write and the checked path, or a
/// lost hit, never safety. A version that is not a number is never earlier nor
/// later than another: recorded, it replaces what was known; superseded, it
/// ends after the watch's next read.
fn is_earlier(resource_version: &str, than: &str) -> bool {
    matches!(
        (resource_version.parse::<u64>(), than.parse::<u64>()),
        (Ok(a), Ok(b)) if a < b
    )
}

/// `resource_version` is `than` or earlier (see [`is_earlier`]).
fn is_no_later(resource_version: &str, than: &str) -> bool {
    resource_version == than || is_earlier(resource_version, than)
}

fn key(namespace: Option<&str>, name: &str) -> String {
    // Built by hand: `format!` cost about a thousand instructions a key, once per
    // write and once per watch event (callgrind).
    let Some(namespace) = namespace else {
        return name.to_string();
    };
    let mut key = String::with_capacity(namespace.len() + 1 + name.len());
    key.push_str(namespace);
    key.push('/');
    key.push_str(name);
    key
}

/// Keeps one resource's objects in step with the target until nobody has used
/// them for [`IDLE_DROP`], then removes them from the cache.
async fn watch_resource(shared: Weak<Shared>, resource: String, objects: Arc<Objects>) {
    tokio::select! {
        () = sync_forever(&shared, &resource, &objects) => {}
        () = idle(&objects) => {}
    }
    if let Some(shared) = shared.upgrade() {
        let mut resources = locks::lock(&shared.resources);
        if resources
            .get(&resource)
            .is_some_and(|w| Arc::ptr_eq(&w.objects, &objects))
        {
            resources.remove(&resource);
        }
    }
    tracing::debug!(%resource, "ownership cache dropped after being idle");
}

async fn idle(objects: &Objects) {
    loop {
        let since = (*locks::lock(&objects.last_used)).unwrap_or_else(Instant::now);
        let idle_for = since.elapsed();
        if idle_for >= IDLE_DROP {
            return;
        }
        tokio::time::sleep(IDLE_DROP - idle_for).await;
    }
}

/// Why a sync attempt ended.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    /// The request did not complete (no peer, connection lost, deadline).
    #[error("{0}")]
    Forward(#[from] ForwardError),
    /// The target refused the list or watch (for example 403 without cluster-wide
    /// list/watch on the resource).
    #[error("the target answered {0}")]
    Status(StatusCode),
    /// A list page or watch event that is not what the target should send.
    #[error("undecodable answer: {0}")]
    Decode(String),
    /// An ERROR event, such as 410 Expired for a resourceVersion too old.
    #[error("watch ended with an error: {0}")]
    WatchError(String),
    /// Nothing arrived, not even a bookmark, for the idle limit.
    #[error("no watch event within {WATCH_IDLE_LIMIT:?}")]
    Stalled,
    /// The resource holds more owned objects than the cache keeps.
    #[error("more than {MAX_OBJECTS} owned objects")]
    TooMany,
    /// The cache itself is gone (its proxy shut down).
    #[error("the cache was dropped")]
    Dropped,
}

/// Lists and watches until the cache is dropped. An interrupted watch keeps the
/// entries in use while the resource is listed again: an entry that went stale
/// meanwhile only sends its write down the checked path, and under heavy writes a
/// watch can fall out of the target's event window (410) again and again. Entries
/// are dropped when the cache has been out of step for the idle limit, or the
/// resource is too large to keep.
async fn sync_forever(shared: &Weak<Shared>, resource: &str, objects: &Objects) {
    // kube-runtime's default backoff (jittered, 0.8 s doubling to 30 s), not the
    // client-side watches' shorter one: up to 64 resources relist here, against a
    // target that may be struggling, and until they have the writes take the
    // checked path, which is slower but correct.
    let mut backoff = DefaultBackoff::default();
    loop {
        let error = sync_once(shared, resource, objects, &mut backoff).await;
        let pause = match error {
            SyncError::Dropped => return,
            SyncError::TooMany => {
                objects.unsync();
                OVERFLOW_PAUSE
            }
            _ => {
                objects.unsync_if_out_of_step();
                // The default backoff never runs out; the fallback is its ceiling.
                backoff.next().unwrap_or(Duration::from_secs(30))
            }
        };
        tracing::debug!(%resource, %error, "ownership cache watch interrupted; listing again");
        tokio::time::sleep(pause).await;
    }
}

impl Objects {
    fn unsync(&self) {
        let mut state = locks::write(&self.state);
        state.synced = false;
        state.pins = HashMap::new();
        state.superseded = HashMap::new();
    }

    fn unsync_if_out_of_step(&self) {
        let out_of_step = {
            let state = locks::read(&self.state);
            state
                .in_step_at
                .is_none_or(|at| at.elapsed() > WATCH_IDLE_LIMIT)
        };
        if out_of_step {
            self.unsync();
        }
    }
}

/// Lists, then watches for as long as watches work; returns why it stopped.
async fn sync_once(
    shared: &Weak<Shared>,
    resource: &str,
    objects: &Objects,
    backoff: &mut DefaultBackoff,
) -> SyncError {
    let Some(strong) = shared.upgrade() else {
        return SyncError::Dropped;
    };
    let (target, owner, collection) = (
        strong.target.clone(),
        strong.owner.clone(),
        format!("{}/{}", strong.prefix, request::encode_segment(resource)),
    );
    drop(strong);
    let mut resource_version = match list(&target, &owner, &collection, objects).await {
        Ok(rv) => rv,
        Err(error) => return error,
    };
    backoff.reset();
    loop {
        let query = format!(
            "watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_TIMEOUT_SECONDS}&resourceVersion={resource_version}"
        );
        let mut response =
            match get(&target, &owner, &collection, &query, CacheRequest::Watch).await {
                Ok(response) => response,
                Err(error) => return error,
            };
        let socket = response
            .extensions_mut()
            .remove::<ConnectionSocket>()
            .map(|ConnectionSocket(socket)| RestingSocket::new(socket));
        let body = response.into_body();
        match follow(body, socket, &owner, objects, &mut resource_version).await {
            // The server ended the watch (timeoutSeconds): resume without a list.
            Ok(()) => continue,
            Err(error) => return error,
        }
    }
}

/// Lists the owned objects page by page, replaces the cache with them and returns
/// the list's resourceVersion.
async fn list(
    target: &TargetConnection,
    owner: &Owner,
    collection: &str,
    objects: &Objects,
) -> Result<String, SyncError> {
    let mut pins = HashMap::new();
    let mut continue_token = String::new();
    loop {
        let mut query = format!("limit={LIST_PAGE}");
        if !continue_token.is_empty() {
            query.push_str("&continue=");
            query.push_str(&crproxy_core::request::encode_query_value(&continue_token));
        }
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let body = get(
            target,
            owner,
            collection,
            &query,
            CacheRequest::ListPage { deadline },
        )
        .await?
        .into_body();
        let read =
            transport::within(deadline, transport::read_limited(body, MAX_BUFFERED_BODY)).await?;
        let page = MetaList::decode(&read).map_err(|e| SyncError::Decode(e.to_string()))?;
        for meta in page.items {
            if let (Some(name), Some(pin)) = (meta.name(), meta.owned_pin(owner)) {
                pins.insert(key(meta.namespace(), name), pin);
            }
        }
        if pins.len() > MAX_OBJECTS {
            return Err(SyncError::TooMany);
        }
        let next = page.metadata.continue_token.as_deref().unwrap_or("");
        if next.is_empty() {
            let Some(listed_at) = page.metadata.resource_version.map(|rv| rv.into_owned()) else {
                return Err(SyncError::Decode("list without resourceVersion".into()));
            };
            locks::write(&objects.state).take_list(pins, &listed_at);
            return Ok(listed_at);
        }
        continue_token = next.to_string();
    }
}

/// The two kinds of request the cache sends, each with its media type and its
/// way to the target.
#[derive(Clone, Copy)]
enum CacheRequest {
    /// One page of the owned objects: a bounded exchange, ended at the deadline.
    ListPage { deadline: Instant },
    /// The watch: for as long as the target keeps it open, on an HTTP/1.1
    /// connection of its own that the reading task drives.
    Watch,
}

impl CacheRequest {
    fn accept(self) -> &'static str {
        match self {
            CacheRequest::ListPage { .. } => LIST_ACCEPT,
            CacheRequest::Watch => WATCH_ACCEPT,
        }
    }
}

/// GETs the owned objects of `collection` with `query`; the body is the caller's.
async fn get(
    target: &TargetConnection,
    owner: &Owner,
    collection: &str,
    query: &str,
    request: CacheRequest,
) -> Result<Response<ProxyBody>, SyncError> {
    let scoped = ownership::scoped_query(Some(query), owner)
        .map_err(|e| SyncError::Decode(e.to_string()))?;
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::ACCEPT,
        HeaderValue::from_static(request.accept()),
    );
    let path = format!("{collection}?{scoped}");
    let path = TargetPath::Written(&path);
    let response = match request {
        CacheRequest::ListPage { deadline } => {
            target.send_get(deadline, path, &headers, None).await?
        }
        CacheRequest::Watch => target.send_own_watch(path, &headers).await?,
    };
    if response.status() != StatusCode::OK {
        return Err(SyncError::Status(response.status()));
    }
    Ok(response)
}

/// Applies the events of one watch response until the server ends it (`Ok`) or
/// it fails, stalls or expires (`Err`). An event cut short by the end of the
/// response is dropped: `resource_version` only moves with applied events, so the
/// next watch starts before it and the target sends it again. After each read
/// the watch rests for [`EVENT_BATCH_PAUSE`], and so does its `socket` (when the
/// watch has an HTTP/1.1 connection of its own): events arriving meanwhile wake
/// nobody.
async fn follow(
    mut body: ProxyBody,
    mut socket: Option<RestingSocket>,
    owner: &Owner,
    objects: &Objects,
    resource_version: &mut String,
) -> Result<(), SyncError> {
    let mut lines = WatchLines::new(MAX_BUFFERED_BODY);
    let mut apply = |frame: Result<hyper::body::Frame<Bytes>, BoxError>| {
        let frame = frame.map_err(|e| SyncError::Forward(ForwardError::Send(e.to_string())))?;
        if let Ok(data) = frame.into_data() {
            lines.push(&data);
            apply_lines(&mut lines, owner, objects, resource_version)?;
        }
        Ok::<(), SyncError>(())
    };
    loop {
        match tokio::time::timeout(WATCH_IDLE_LIMIT, body.frame()).await {
            Err(_) => return Err(SyncError::Stalled),
            Ok(None) => return Ok(()),
            Ok(Some(frame)) => apply(frame)?,
        }
        // Every event that has already arrived is read now; then the watch rests.
        while let Some(frame) = body.frame().now_or_never() {
            match frame {
                None => return Ok(()),
                Some(frame) => apply(frame)?,
            }
        }
        if let Some(socket) = socket.as_mut() {
            socket.rest();
        }
        tokio::time::sleep(EVENT_BATCH_PAUSE).await;
        if let Some(socket) = socket.as_mut() {
            socket.wake();
        }
    }
}

/// Decodes and applies every event `lines` holds finished. This is all the
/// cache does with what the target sends on a watch.
fn apply_lines(
    lines: &mut WatchLines,
    owner: &Owner,
    objects: &Objects,
    resource_version: &mut String,
) -> Result<(), SyncError> {
    let mut applied = false;
    while let Some(line) = lines
        .next_line()
        .map_err(|e| SyncError::Decode(e.to_string()))?
    {
        let event = Event::decode(&line).map_err(|e| SyncError::Decode(e.to_string()))?;
        apply(event, owner, objects, resource_version)?;
        applied = true;
    }
    // Once per read, after its events were judged (an event may be a
    // superseded state itself, so the position must not pass it first).
    if applied {
        locks::write(&objects.state).watched_to(resource_version);
    }
    Ok(())
}

/// What one watch response left in a cache that started empty; see [`replay_watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// The pins held at the end, keyed by `namespace/name` (`name` when cluster
    /// scoped).
    pub pins: HashMap<String, Pin>,
    /// Where the next watch would resume.
    pub resource_version: String,
    /// Why the watch would have ended early, if it would.
    pub error: Option<String>,
}

/// What a write's answer says about the object the write addressed, as
/// [`OwnershipCache::remember`] reads it.
#[derive(Debug, PartialEq, Eq)]
pub enum WriteAnswer {
    /// The object, carrying both owner labels with the owner's values, in the
    /// state `pin` names: the next write of it may be pinned to that state.
    Owned { key: String, pin: Pin },
    /// The object, not owned (or without a uid and resourceVersion to pin): any
    /// entry for it is dropped.
    NotOwned { key: String },
}

/// Reads a write's answer: `None` unless it is one JSON object whose metadata
/// names the object the write addressed (`name`, or any name for a create) in
/// `namespace`. The answer is the target's text, and a pin taken from it lets
/// the next write skip the ownership GET: the `write_answer` fuzz target checks
/// that this pins only what a JSON parser reads as the addressed, owned object.
pub fn read_write_answer(
    owner: &Owner,
    namespace: Option<&str>,
    name: Option<&str>,
    answer: &[u8],
) -> Option<WriteAnswer> {
    let meta = ObjectMeta::of_answer(answer).ok()?;
    let answered = meta.name()?;
    if name.is_some_and(|name| name != answered) || meta.namespace() != namespace {
        return None;
    }
    let key = key(namespace, answered);
    Some(match meta.owned_pin(owner) {
        Some(pin) => WriteAnswer::Owned { key, pin },
        None => WriteAnswer::NotOwned { key },
    })
}

/// Runs the chunks of a watch response through the cache's own decoding and
/// bookkeeping, as a watch of `owner`'s objects would, with no I/O. The fuzz
/// target uses it to feed the cache what a hostile target could send.
pub fn replay_watch<'c>(owner: &Owner, chunks: impl IntoIterator<Item = &'c [u8]>) -> Replay {
    let objects = Objects::default();
    let mut resource_version = String::new();
    let mut lines = WatchLines::new(MAX_BUFFERED_BODY);
    let mut error = None;
    for chunk in chunks {
        lines.push(chunk);
        if let Err(e) = apply_lines(&mut lines, owner, &objects, &mut resource_version) {
            error = Some(e.to_string());
            break;
        }
    }
    let state = locks::into_inner(objects.state);
    Replay {
        pins: state.pins,
        resource_version,
        error,
    }
}

fn apply(
    event: Event,
    owner: &Owner,
    objects: &Objects,
    resource_version: &mut String,
) -> Result<(), SyncError> {
    let meta = event.object.metadata;
    if event.event_type == "ERROR" {
        let message = event.object.message.as_deref().unwrap_or("no message");
        return Err(SyncError::WatchError(message.to_string()));
    }
    if let Some(rv) = &meta.resource_version {
        resource_version.replace_range(.., rv);
    }
    let mut state = locks::write(&objects.state);
    let Some(name) = meta.name() else {
        return Ok(());
    };
    let key = key(meta.namespace(), name);
    match (event.event_type.as_ref(), meta.owned_pin(owner)) {
        ("ADDED" | "MODIFIED", Some(pin)) => {
            state.record(key, pin);
            if state.pins.len() > MAX_OBJECTS {
                return Err(SyncError::TooMany);
            }
        }
        // Deleted, or no longer carrying the owner labels. An entry of another
        // incarnation (recreated meanwhile and remembered from a write) stays.
        ("ADDED" | "MODIFIED" | "DELETED", _)
            if state
                .pins
                .get(&key)
                .is_some_and(|pin| Some(pin.uid.as_str()) == meta.uid()) =>
        {
            state.pins.remove(&key);
        }
        _ => {}
    }
    Ok(())
}

mod meta;
#[cfg(test)]
mod tests;
