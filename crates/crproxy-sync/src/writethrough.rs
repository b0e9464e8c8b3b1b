//! Synchronous write-through of toHost aggregated types, as a validating admission
//! webhook of the tenant.
//!
//! The tenant has only a schemaless CRD for an aggregated type, so the host's
//! extension API server must see a write before the tenant stores it. The leader
//! registers a `ValidatingWebhookConfiguration` in the tenant ([`webhook_configuration`])
//! that sends create and update of the generated types' main resource here. On each
//! review the object is translated as the toHost syncer translates it and written to
//! the host at once: the tenant request is allowed only if the host accepted, and
//! otherwise denied with the host's code, reason and message (host names rewritten to
//! tenant names). A rejected write is therefore never stored in the tenant. A replace
//! that loses to a host write made since its read (409, e.g. the extension server
//! updating the status) is no rejection: the mirror is read again and the replace
//! retried, a few times at most, within the review's deadline. An update
//! of an object being deleted (`deletionTimestamp` set) is allowed without a host
//! write: the syncer owns the delete, and a write could re-create a removed mirror.
//!
//! Validating webhooks run before the tenant stores the object, so the tenant can
//! still fail after the host accepted (another webhook denies, a conflict, a
//! timeout). Each accepted write is held as *pending* on its key: the syncer leaves
//! the key alone, and a check waits (bounded) for the tenant object to appear in the
//! syncer's cache. A create that never appears has its mirror deleted, pinned to the
//! uid and resourceVersion write-through wrote, so that a later valid write is never
//! undone, and only after a live read of the tenant finds no object with the admitted
//! uid: the cache may be behind, or frozen because the syncer stopped (a lost Lease). An update that never appears needs no explicit revert: once the key is
//! released, the level-based syncer writes the tenant's (unchanged) object down again.
//! Each review is decided in a task of its own, so a held key is released, confirmed
//! or cleaned up even when the tenant API server gives up on the call; waiting for the
//! key and the host write share one deadline, `timeout` ([`DECIDE_WITHIN`] in
//! production) after the decision starts. A write waiting for a held key takes no
//! place of the host writes ([`MAX_IN_FLIGHT`]), only a waiting place
//! ([`MAX_WAITING`], one per object): a tenant user can keep a key held at will
//! (a write the webhook allowed and storage refused), and waiting writes of that
//! one object must not deny writes of every other.
//!
//! Only the leader's syncer has synced caches and pending keys, so reviews must reach
//! the leader: the tenant calls the listener itself, a URL, or a selector-less Service
//! whose EndpointSlice the leader points at itself ([`publish_leader_endpoint`]).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use crproxy_core::config::sync::WebhookEndpoint;
use crproxy_core::go_text::quoted;
use crproxy_core::locks;
use crproxy_core::pki::CertificateAuthority;
use crproxy_core::status::qualified_resource;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};

use crate::crd::ResolvedType;
use crate::names;
use crate::run::Key;
use crate::to_host::{desired_mirror, mirror_differs, replacement};
use crate::SyncMetrics;

/// Write-throughs writing to the host at once per replica; more are answered 429.
/// A place is taken only once the write holds its object's key: a write waiting
/// for another write of its object must never deny writes of other objects.
pub const MAX_IN_FLIGHT: usize = 50;
/// Writes waiting for another write of their object, per replica; a write that
/// finds its object's key held and no waiting place free is answered 409 at once.
/// Bounds what waiting reviews keep in memory apart from [`MAX_IN_FLIGHT`].
pub const MAX_WAITING: usize = 50;
/// Writes waiting for another write of the same object: a small queue, since
/// concurrent writes of one object mostly conflict in the tenant anyway, and so
/// that the writes of one object cannot take every waiting place.
const MAX_WAITING_PER_OBJECT: usize = 1;
/// How long the tenant API server waits for a review (the webhook's
/// `timeoutSeconds`).
pub const TIMEOUT: Duration = Duration::from_secs(30);
/// How long one write-through may take, from the start of its decision: less
/// than [`TIMEOUT`], whose count started earlier (connection, TLS, the body),
/// so that crproxy's own answer (a 409 for a key still held, a 504 for a host
/// that did not answer) reaches the tenant's caller instead of the tenant's
/// generic "failed calling webhook".
pub const DECIDE_WITHIN: Duration = Duration::from_secs(25);
/// How long an accepted write may take to appear in the tenant before it is taken
/// as failed there. Longer than the tenant's own webhook timeout, so a tenant request
/// still in flight is never mistaken for a failed one.
pub const CONFIRM_WITHIN: Duration = Duration::from_secs(40);
/// Attempts at the pinned rollback delete when the mirror keeps changing under it.
const ROLLBACK_ATTEMPTS: usize = 3;
/// Reads and replaces of a mirror that keeps changing under a write-through (its
/// status updated by the host between the read and the replace).
const WRITE_ATTEMPTS: usize = 3;
/// The name of the ValidatingWebhookConfiguration in the tenant.
pub fn configuration_name(tenant: &str) -> String {
    format!("crproxy-writethrough-{tenant}")
}

/// What a toHost aggregated type's syncer shares with write-through.
#[derive(Default)]
pub struct Gate {
    /// The syncer's tenant cache while its caches are synced (`None` before:
    /// reviews are answered 503), and the leadership term it belongs to.
    synced: Mutex<Synced>,
    /// Keys with an accepted write-through not yet seen in the tenant (the syncer
    /// leaves them alone), and the writes waiting for them.
    pending: Mutex<Pending>,
    /// Woken whenever a key is released.
    released: tokio::sync::Notify,
}

#[derive(Default)]
struct Pending {
    held: HashSet<Key>,
    /// Writes waiting for a held key, by key; a key that nobody waits for has no
    /// entry. Apart from `held`: a waiter still waits after the key was released
    /// and taken again by a write that came later.
    waiting: HashMap<Key, usize>,
}

#[derive(Default)]
struct Synced {
    store: Option<Store<DynamicObject>>,
    /// Counts the terms opened and closed: a syncer of an earlier term may still
    /// report its caches synced after its term was closed (an aborted task runs
    /// until its next await), and must not open the gate again.
    term: u64,
}

/// A gate as one leadership term's syncer holds it.
#[derive(Clone)]
pub struct TermGate {
    gate: Arc<Gate>,
    term: u64,
}

impl TermGate {
    /// The syncer's caches are synced: reviews are answered from `store`, unless
    /// the term has been closed meanwhile.
    pub fn caches_synced(&self, store: Store<DynamicObject>) {
        let mut synced = locks::lock(&self.gate.synced);
        if synced.term == self.term {
            synced.store = Some(store);
        }
    }

    pub fn is_pending(&self, key: &Key) -> bool {
        self.gate.is_pending(key)
    }
}

impl Gate {
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate::default())
    }

    /// The gate a syncer of the current leadership term holds ([`Gate::close`]
    /// ends the term).
    pub fn open_term(self: &Arc<Self>) -> TermGate {
        TermGate {
            gate: Arc::clone(self),
            term: locks::lock(&self.synced).term,
        }
    }

    /// Ends the current term: reviews are answered 503 until a syncer of a later
    /// term has synced its caches. The only place a term advances.
    pub fn close(&self) {
        let mut synced = locks::lock(&self.synced);
        synced.term += 1;
        synced.store = None;
    }

    pub fn is_synced(&self) -> bool {
        locks::lock(&self.synced).store.is_some()
    }

    fn store(&self) -> Option<Store<DynamicObject>> {
        locks::lock(&self.synced).store.clone()
    }

    pub fn is_pending(&self, key: &Key) -> bool {
        locks::lock(&self.pending).held.contains(key)
    }

    /// Marks `key` pending; `false` if it already was (a concurrent write-through).
    fn hold(&self, key: &Key) -> bool {
        locks::lock(&self.pending).held.insert(key.clone())
    }

    fn release(&self, key: &Key) {
        locks::lock(&self.pending).held.remove(key);
        self.released.notify_waiters();
    }

    /// Holds `key` once no other write-through holds it (a write right after another
    /// on the same object waits for the first to be seen stored), waiting until
    /// `deadline` at most, and only in a place of `places` and within
    /// [`MAX_WAITING_PER_OBJECT`]. `false`: still held at `deadline`, or held and no
    /// place to wait in.
    async fn hold_until(
        &self,
        key: &Key,
        places: &Semaphore,
        deadline: tokio::time::Instant,
    ) -> bool {
        let _waiting = {
            let mut pending = locks::lock(&self.pending);
            if pending.held.insert(key.clone()) {
                return true;
            }
            if pending.waiting.get(key).copied().unwrap_or_default() >= MAX_WAITING_PER_OBJECT {
                return false;
            }
            let Ok(place) = places.try_acquire() else {
                return false;
            };
            *pending.waiting.entry(key.clone()).or_default() += 1;
            Waiting {
                gate: self,
                key,
                _place: place,
            }
        };
        loop {
            // Armed before the look at the key, so that a release between the look
            // and the wait still wakes this waiter.
            let released = self.released.notified();
            if self.hold(key) {
                return true;
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return false;
            }
        }
    }
}

/// A write waiting for its object's key: counted against the object's
/// [`MAX_WAITING_PER_OBJECT`] and holding a place of [`MAX_WAITING`] until it stops
/// waiting, however it stops.
struct Waiting<'a> {
    gate: &'a Gate,
    key: &'a Key,
    _place: tokio::sync::SemaphorePermit<'a>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut pending = locks::lock(&self.gate.pending);
        if let Some(n) = pending.waiting.get_mut(self.key) {
            *n -= 1;
            if *n == 0 {
                pending.waiting.remove(self.key);
            }
        }
    }
}

/// The write-through of every toHost aggregated type of one tenant.
pub struct WriteThrough {
    pub tenant: String,
    /// The tenant's Platform project (`names::TENANT_PROJECT`).
    pub tenant_project: String,
    pub host_namespace: String,
    pub host: kube::Client,
    /// The tenant, read live before a rollback deletes anything: the syncer's cache
    /// can be behind, or frozen when the syncer stopped.
    pub tenant_client: kube::Client,
    /// By group and plural ([`types_by_resource`]): the type and its gate.
    pub types: Types,
    pub metrics: Arc<SyncMetrics>,
    /// Places of writes to the host ([`MAX_IN_FLIGHT`] in production).
    pub in_flight: Arc<Semaphore>,
    /// Places of writes waiting for another write of their object ([`MAX_WAITING`]
    /// in production).
    pub waiting: Arc<Semaphore>,
    /// The budget of one decision ([`DECIDE_WITHIN`] in production).
    pub timeout: Duration,
    pub confirm_within: Duration,
}

/// The write-through types by group and plural, as a review names its resource: one
/// plural may be served in several groups.
pub type Types = HashMap<(String, String), (ResolvedType, Arc<Gate>)>;

/// [`Types`] of `types`.
pub fn types_by_resource(types: impl IntoIterator<Item = (ResolvedType, Arc<Gate>)>) -> Types {
    types
        .into_iter()
        .map(|(ty, gate)| {
            let key = (ty.resource.group.clone(), ty.resource.plural.clone());
            (key, (ty, gate))
        })
        .collect()
}

/// A denial: the Status the tenant's client receives.
#[derive(Debug, Clone, PartialEq)]
pub struct Denial {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub retry_after: Option<u32>,
    /// The host's `details` (causes), names rewritten.
    pub details: Option<Value>,
}

impl Denial {
    fn new(code: u16, reason: &str, message: impl Into<String>) -> Denial {
        Denial {
            code,
            reason: reason.into(),
            message: message.into(),
            retry_after: None,
            details: None,
        }
    }

    fn status(&self) -> Value {
        let mut status = json!({
            "metadata": {}, "status": "Failure",
            "code": self.code, "reason": self.reason, "message": self.message,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        if let Some(after) = self.retry_after {
            status["details"]["retryAfterSeconds"] = json!(after);
        }
        status
    }
}

/// The fields of an AdmissionReview request write-through uses, owned so that the
/// decision can run as a task of its own.
struct Review {
    uid: String,
    group: String,
    plural: String,
    sub_resource: String,
    operation: String,
    dry_run: bool,
    object: Value,
    old_object: Value,
}

fn parse(mut review: Value) -> Option<Review> {
    let request = review.get_mut("request")?;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let uid = request["uid"].as_str()?.to_owned();
    let mut take = |field: &str| request.get_mut(field).map(Value::take).unwrap_or_default();
    let object = take("object");
    let old_object = take("oldObject");
    Some(Review {
        uid,
        group: text(&request["resource"]["group"]),
        plural: text(&request["resource"]["resource"]),
        sub_resource: text(&request["subResource"]),
        operation: text(&request["operation"]),
        dry_run: request["dryRun"] == true,
        object,
        old_object,
    })
}

fn meta<'a>(v: &'a Value, field: &str) -> &'a str {
    v["metadata"][field].as_str().unwrap_or_default()
}

impl WriteThrough {
    /// Answers one AdmissionReview (v1): the response review. `None`: the body is not
    /// an AdmissionReview request (the HTTP layer answers 400).
    pub async fn admit(self: &Arc<Self>, review: Value) -> Option<Value> {
        let request = parse(review)?;
        let uid = request.uid.clone();
        // A task of its own: the tenant API server may give up on this call (hyper
        // then drops this future), and a key once held must still be released,
        // confirmed or cleaned up.
        let this = Arc::clone(self);
        let decided = tokio::spawn(async move { this.decide(&request).await }).await;
        let decision = match decided {
            Ok(decision) => decision,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Only when the runtime shuts down.
            Err(_) => Err(Denial::new(
                500,
                "InternalError",
                "write-through: the review was cancelled while crproxy shuts down; retry",
            )),
        };
        let response = match decision {
            Ok(()) => json!({"uid": uid, "allowed": true}),
            Err(denial) => json!({"uid": uid, "allowed": false, "status": denial.status()}),
        };
        Some(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        }))
    }

    async fn decide(self: &Arc<Self>, request: &Review) -> Result<(), Denial> {
        // Waiting for the key and the host write share one deadline: the answer never
        // comes later than `timeout` after the decision started.
        let deadline = tokio::time::Instant::now() + self.timeout;
        // Dry runs reach nothing (the configuration says NoneOnDryRun); status and
        // other subresources, and deletes, are the syncer's. So is an update of an
        // object being deleted (a controller removing its finalizer): the syncer may
        // already have removed the mirror, and writing it would create it again.
        let terminating =
            request.operation == "UPDATE" && !meta(&request.object, "deletionTimestamp").is_empty();
        if request.dry_run
            || !request.sub_resource.is_empty()
            || !matches!(request.operation.as_str(), "CREATE" | "UPDATE")
            || terminating
        {
            return Ok(());
        }
        let resource = (request.group.clone(), request.plural.clone());
        // Only a webhook this configuration did not register sends such a review:
        // one a replica of a newer configuration added during a rollout (with the
        // Service form, its reviews reach whichever replica leads), or one of a
        // type just disabled that the leader has yet to remove. Neither may let a
        // write go unvalidated to the tenant's generated CRD: it fails closed.
        let Some((ty, gate)) = self.types.get(&resource) else {
            let mut d = Denial::new(
                503,
                "ServiceUnavailable",
                format!(
                    "write-through of {}.{} is not configured on the leading replica (a \
                     configuration being rolled out, or the type being disabled)",
                    request.plural, request.group
                ),
            );
            d.retry_after = Some(1);
            return Err(d);
        };
        let Some(store) = gate.store() else {
            let mut d = Denial::new(
                503,
                "ServiceUnavailable",
                format!(
                    "write-through of {} is not ready: the syncer has not synced its caches yet",
                    ty.resource.key
                ),
            );
            d.retry_after = Some(1);
            return Err(d);
        };
        let object = &request.object;
        let key = Key {
            namespace: meta(object, "namespace").to_owned(),
            name: meta(object, "name").to_owned(),
        };
        let translatable = object.is_object()
            && !key.name.is_empty()
            && !key.namespace.is_empty()
            && !meta(object, "uid").is_empty();
        if !translatable {
            self.log_rejected(
                ty,
                &key,
                "translate_error",
                "the object has no name, namespace or uid",
            );
            return Err(Denial::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "write-through of {} cannot translate this object: it needs a name, a namespace and a uid",
                    ty.resource.key
                ),
            ));
        }
        // The stand-in marker is crproxy's own: a review's object is the object
        // as sent, so one carrying it was marked by its writer, whose mirror
        // would look unreadable (the marker itself is never copied; refusing it
        // tells the writer so rather than storing what the host will not have).
        if crproxy_core::deep_objects::is_stand_in(object) {
            let field = format!(
                "metadata.annotations[{}]",
                crproxy_core::deep_objects::TOO_DEEP_ANNOTATION
            );
            let detail = "Forbidden: the annotation is crproxy's own (it marks an object nested too deeply to be read) and cannot be set; remove it";
            return Err(self.invalid(ty, &key, "FieldValueForbidden", &field, detail));
        }
        // A reference that cannot be translated one-to-one is the tenant object's
        // fault, whatever the host holds: refused before anything is held.
        let desired = match desired_mirror(
            ty,
            &self.tenant,
            &self.tenant_project,
            &self.host_namespace,
            object,
        ) {
            Ok(desired) => desired,
            Err(ambiguous) => {
                let detail = ambiguous.detail();
                return Err(self.invalid(ty, &key, "FieldValueInvalid", &ambiguous.field, &detail));
            }
        };
        // The key first, the place of a host write after: a write waiting for
        // another write of its object (up to the deadline, when the tenant never
        // stores an accepted write) takes no place of writes of other objects.
        if !gate.hold_until(&key, &self.waiting, deadline).await {
            let mut d = Denial::new(
                409,
                "Conflict",
                format!(
                    "another write of {}/{} is being written through; retry",
                    key.namespace, key.name
                ),
            );
            d.retry_after = Some(1);
            return Err(d);
        }
        let Ok(_permit) = Arc::clone(&self.in_flight).try_acquire_owned() else {
            gate.release(&key);
            let mut d = Denial::new(
                429,
                "TooManyRequests",
                format!("too many write-throughs in flight (at most {MAX_IN_FLIGHT} per replica)"),
            );
            d.retry_after = Some(1);
            return Err(d);
        };
        if request.operation == "UPDATE" && self.superseded(ty, &key, request, deadline).await {
            gate.release(&key);
            return Ok(());
        }
        // Whether the last attempt's create or replace went out (a replace
        // refused with 409 stored nothing, and the next attempt starts with a
        // read): a failure, or a deadline that ends the write, leaves only this
        // to say whether the host may have stored something.
        let write_sent = AtomicBool::new(false);
        let written =
            tokio::time::timeout_at(deadline, self.write(ty, &desired, &write_sent)).await;
        let written = match written.unwrap_or(Err(HostError::TimedOut)) {
            Ok(written) => written,
            Err(error) => {
                let sent = write_sent.load(Ordering::Acquire);
                return Err(self.refuse(ty, gate, key, request, error, sent));
            }
        };
        match written {
            // Nothing changed on the host: nothing to confirm or roll back.
            None => gate.release(&key),
            // An update that changes nothing a mirror is made of (a no-op update,
            // which the tenant stores without a new resourceVersion, so waiting for
            // one would hold the key for the whole confirmation time), whose mirror
            // was written only because the host keeps it otherwise (defaults its
            // server adds) or had lost it (created again): a syncer reading either
            // version of the tenant object writes the same mirror, so there is
            // nothing to wait for. Nor to roll back: the object being updated
            // exists, and a rollback keeps the mirror of an object the tenant holds.
            Some(_)
                if request.operation == "UPDATE"
                    && desired_mirror(
                        ty,
                        &self.tenant,
                        &self.tenant_project,
                        &self.host_namespace,
                        &request.old_object,
                    )
                    .is_ok_and(|old| old == desired) =>
            {
                gate.release(&key)
            }
            Some(w) => self.spawn_confirm(ty, gate, store, key, request, w),
        }
        Ok(())
    }

    fn host_api(&self, ty: &ResolvedType) -> Api<DynamicObject> {
        Api::namespaced_with(self.host.clone(), &self.host_namespace, &ty.api)
    }

    /// Writes `desired` to the host: creates the mirror, or updates it when it is this
    /// tenant object's. `Some`: what was written (uid, resourceVersion, created).
    ///
    /// A replace pinned to the mirror's resourceVersion loses to any host write
    /// between the read and the replace (the extension server updating the status):
    /// that 409 says nothing about the tenant's write, so the mirror is read again
    /// and the replace retried, [`WRITE_ATTEMPTS`] times at most; the caller bounds
    /// all of it by the review's deadline.
    async fn write(
        &self,
        ty: &ResolvedType,
        desired: &Value,
        write_sent: &AtomicBool,
    ) -> Result<Option<Written>, HostError> {
        let mut attempt = 1;
        loop {
            match self.write_once(ty, desired, write_sent).await? {
                Attempt::Written(written) => return Ok(written),
                Attempt::ReplaceConflict(status) if attempt >= WRITE_ATTEMPTS => {
                    return Err(HostError::Rejected(status))
                }
                Attempt::ReplaceConflict(_) => attempt += 1,
            }
        }
    }

    /// One read and, when needed, one create or replace; `write_sent` is
    /// cleared first and set just before the create or replace goes out.
    async fn write_once(
        &self,
        ty: &ResolvedType,
        desired: &Value,
        write_sent: &AtomicBool,
    ) -> Result<Attempt, HostError> {
        write_sent.store(false, Ordering::Release);
        let api = self.host_api(ty);
        let name = meta(desired, "name");
        let current = api.get_opt(name).await.map_err(HostError::from)?;
        let current = current
            .map(|c| serde_json::to_value(&c))
            .transpose()
            .map_err(|e| HostError::Unparseable(e.to_string()))?;
        // Only the stand-in of a host object nested too deeply was read: what a
        // replace would keep of it is not known.
        if current
            .as_ref()
            .is_some_and(crproxy_core::deep_objects::is_stand_in)
        {
            return Err(HostError::Unparseable(format!(
                "the host object nests deeper than {} levels",
                crproxy_core::deep_objects::MAX_OBJECT_NESTING
            )));
        }
        let object = |v: Value| -> Result<DynamicObject, HostError> {
            serde_json::from_value(v).map_err(|e| HostError::Unparseable(e.to_string()))
        };
        let created = match &current {
            // Someone else's object under the mirror's name, or an older incarnation's
            // mirror: the host's own create decides (AlreadyExists), never an overwrite.
            Some(c) if !names::same_mirror(c, desired) => {
                let object = object(desired.clone())?;
                write_sent.store(true, Ordering::Release);
                api.create(&PostParams::default(), &object).await
            }
            Some(c) if !mirror_differs(desired, c) => return Ok(Attempt::Written(None)),
            Some(c) => {
                let object = object(replacement(desired, c))?;
                write_sent.store(true, Ordering::Release);
                let replaced = match api.replace(name, &PostParams::default(), &object).await {
                    Ok(replaced) => replaced,
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        return Ok(Attempt::ReplaceConflict(s))
                    }
                    Err(e) => return Err(e.into()),
                };
                return Written::of(&replaced, false).map(|w| Attempt::Written(Some(w)));
            }
            None => {
                let object = object(desired.clone())?;
                write_sent.store(true, Ordering::Release);
                api.create(&PostParams::default(), &object).await
            }
        }
        .map_err(HostError::from)?;
        Written::of(&created, true).map(|w| Attempt::Written(Some(w)))
    }

    /// Denies a review whose host write failed with `error` (`write_sent`: a
    /// create or replace had gone out): logs it, frees its key (once a mirror
    /// the host may have stored all the same is looked for and removed), and
    /// returns the tenant's denial.
    fn refuse(
        self: &Arc<Self>,
        ty: &ResolvedType,
        gate: &Arc<Gate>,
        key: Key,
        request: &Review,
        error: HostError,
        write_sent: bool,
    ) -> Denial {
        let outcome_open = write_sent && error.may_have_been_stored();
        let (reason, detail, denial) = self.refusal(&key, error);
        self.log_rejected(ty, &key, reason, &detail);
        if outcome_open {
            self.spawn_cleanup_unknown(ty, gate, key, request);
        } else {
            gate.release(&key);
        }
        denial
    }

    /// What the tenant is told of a failed host write: the log's reason and
    /// detail, and the review's denial.
    fn refusal(&self, key: &Key, error: HostError) -> (&'static str, String, Denial) {
        match error {
            HostError::Rejected(status) => {
                let rejected = rejects_the_object(status.code);
                let denial = self.rewrite(key, status);
                let reason = if rejected {
                    "host_rejected"
                } else {
                    "response_error"
                };
                (reason, denial.message.clone(), denial)
            }
            HostError::NotStatus { code, body } => {
                let mut denial = Denial::new(
                    code,
                    reason_for(code),
                    format!("write-through: the host answered {code} without a Status: {body}"),
                );
                if matches!(code, 429 | 503) {
                    denial.retry_after = Some(1);
                }
                ("unparseable_response", body, denial)
            }
            HostError::Unparseable(e) => {
                let denial = Denial::new(
                    500,
                    "InternalError",
                    format!("write-through: the host's answer could not be read: {e}"),
                );
                ("unparseable_response", e, denial)
            }
            HostError::Transport(e) => {
                let mut denial = Denial::new(
                    503,
                    "ServiceUnavailable",
                    format!("write-through: the host could not be reached: {e}"),
                );
                denial.retry_after = Some(1);
                ("response_error", e, denial)
            }
            HostError::TimedOut => {
                let denial = Denial::new(
                    504,
                    "Timeout",
                    format!(
                        "write-through: no answer from the host within {} s of the decision (waiting for another write of the object included)",
                        self.timeout.as_secs()
                    ),
                );
                ("response_error", "timed out".to_owned(), denial)
            }
        }
    }

    /// The host's Status with its names turned into the tenant's.
    fn rewrite(&self, key: &Key, status: Box<kube::core::Status>) -> Denial {
        let host_name = names::host_name(&key.name, &key.namespace, &self.tenant);
        let rewrite = |s: &str| {
            s.replace(&host_name, &key.name)
                .replace(&self.host_namespace, &key.namespace)
        };
        let (code, reason) = match status.code {
            code if status.reason.is_empty() => (code, reason_for(code)),
            code => (code, status.reason.as_str()),
        };
        let mut denial = Denial::new(code, reason, rewrite(&status.message));
        if let Some(details) = &status.details {
            denial.retry_after =
                (details.retry_after_seconds > 0).then_some(details.retry_after_seconds);
            // The causes (which field, and why) are the host's; only names change.
            let details = serde_json::to_string(details).unwrap_or_default();
            denial.details = serde_json::from_str(&rewrite(&details)).ok();
        }
        denial
    }

    /// The refusal of a tenant object with an invalid field, logged as a
    /// `translate_error` (the write-through path cannot translate it; the host
    /// was not asked): a 422 `Invalid` Status with the details kube-apiserver
    /// gives a field error (the object's name, group and kind, and the field and
    /// what is wrong with it, as a cause of type `cause`), so that clients show
    /// it as they show the tenant API server's own.
    fn invalid(
        &self,
        ty: &ResolvedType,
        key: &Key,
        cause: &str,
        field: &str,
        detail: &str,
    ) -> Denial {
        // kube-apiserver's words for an invalid object: `<Kind>.<group> "<name>"
        // is invalid: <field>: <detail>`.
        let message = format!(
            "{} {} is invalid: {field}: {detail}",
            qualified_resource(&ty.api.kind, &ty.api.group),
            quoted(&key.name)
        );
        self.log_rejected(ty, key, "translate_error", &message);
        let mut denial = Denial::new(422, "Invalid", message);
        denial.details = Some(json!({
            "name": key.name, "group": ty.api.group, "kind": ty.api.kind,
            "causes": [{"reason": cause, "field": field, "message": detail}],
        }));
        denial
    }

    fn log_rejected(&self, ty: &ResolvedType, key: &Key, reason: &str, error: &str) {
        tracing::warn!(
            resource = %ty.resource.key,
            object = %format!("{}/{}", key.namespace, key.name),
            reason,
            error,
            "write-through: rejecting write, rolling back"
        );
    }

    /// Whether an update was computed on a tenant state that another write has
    /// replaced since, read live (a consistent read). kube stores an update only
    /// on the state it was computed on: this one fails its compare-and-swap, and
    /// kube computes and admits it again on the newer state. Its host write would
    /// only show the older spec on the host until then (another write of the
    /// object may have waited for the key meanwhile), so it is allowed without
    /// one. `false` when the read fails: the write goes as before.
    async fn superseded(
        &self,
        ty: &ResolvedType,
        key: &Key,
        request: &Review,
        deadline: tokio::time::Instant,
    ) -> bool {
        let old_rv = meta(&request.old_object, "resourceVersion");
        if old_rv.is_empty() {
            return false;
        }
        let Ok(live) = self.tenant_live(ty, key, deadline).await else {
            return false;
        };
        let superseded = live.is_none_or(|live| {
            live.metadata.uid.as_deref() != Some(meta(&request.object, "uid"))
                || live.metadata.resource_version.as_deref() != Some(old_rv)
        });
        if superseded {
            tracing::debug!(resource = %ty.resource.key, object = %format!("{}/{}", key.namespace, key.name), "write-through: an update of a replaced tenant state is left to kube's retry; no host write");
        }
        superseded
    }

    /// After an accepted write: wait for the tenant object to show up in the syncer's
    /// cache; if it never does, the tenant did not store it: undo a create.
    fn spawn_confirm(
        self: &Arc<Self>,
        ty: &ResolvedType,
        gate: &Arc<Gate>,
        store: Store<DynamicObject>,
        key: Key,
        request: &Review,
        written: Written,
    ) {
        let this = Arc::clone(self);
        let ty = ty.clone();
        let gate = Arc::clone(gate);
        let uid = meta(&request.object, "uid").to_owned();
        let old_rv = meta(&request.old_object, "resourceVersion").to_owned();
        tokio::spawn(async move {
            let seen = this.wait_stored(&ty, &store, &key, &uid, &old_rv).await;
            tracing::debug!(resource = %ty.resource.key, object = %format!("{}/{}", key.namespace, key.name), seen, "write-through: confirmation of an accepted write");
            if !seen && written.created {
                this.rollback_create(&ty, &key, &uid, &written).await;
            }
            gate.release(&key);
        });
    }

    /// Whether the tenant object with `uid` (and, for an update, a resourceVersion
    /// other than `old_rv`) appears in the cache within `confirm_within`.
    async fn wait_stored(
        &self,
        ty: &ResolvedType,
        store: &Store<DynamicObject>,
        key: &Key,
        uid: &str,
        old_rv: &str,
    ) -> bool {
        let reference = ObjectRef::new_with(&key.name, ty.api.clone()).within(&key.namespace);
        let deadline = tokio::time::Instant::now() + self.confirm_within;
        loop {
            if let Some(o) = store.get(&reference) {
                let stored_uid = o.metadata.uid.as_deref().unwrap_or_default();
                let rv = o.metadata.resource_version.as_deref().unwrap_or_default();
                if stored_uid == uid && (old_rv.is_empty() || rv != old_rv) {
                    return true;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes the mirror a create wrote, only when a live read of the tenant finds no
    /// object with the admitted `uid`, and only while the mirror is still that very
    /// write (uid, and resourceVersion unless only its status moved since).
    async fn rollback_create(&self, ty: &ResolvedType, key: &Key, uid: &str, written: &Written) {
        // The cache's "not stored" is no proof: a syncer stopped by a lost Lease
        // leaves a cache that never moves again, and deleting the mirror of an object
        // the tenant did store makes the next leader take that for a host-side delete
        // and delete the tenant object too.
        match self.tenant_holds(ty, key, uid).await {
            Ok(false) => {}
            Ok(true) => {
                tracing::info!(resource = %ty.resource.key, object = %format!("{}/{}", key.namespace, key.name), "write-through: the tenant stored an accepted create its syncer's cache did not show; keeping its host mirror");
                return;
            }
            Err(e) => {
                // The mirror stays; if the tenant really has no such object, the next
                // syncer collects it as an orphan after its own live read.
                return self.rollback_failed(
                    ty,
                    key,
                    RollbackStep::Lookup,
                    &format!("reading the tenant object failed, its host mirror is kept: {e}"),
                );
            }
        }
        let created = Preconditions {
            uid: Some(written.uid.clone()),
            resource_version: Some(written.resource_version.clone()),
        };
        // Changed since (a 409): still this write if only its status moved.
        let still_this_write = |now: &DynamicObject| {
            now.metadata.uid.as_deref() == Some(written.uid.as_str())
                && serde_json::to_value(now).is_ok_and(|v| !mirror_differs(&written.object, &v))
        };
        let deleted = self
            .delete_mirror(ty, key, &written.name, Some(created), still_this_write)
            .await;
        if deleted {
            tracing::info!(resource = %ty.resource.key, object = %format!("{}/{}", key.namespace, key.name), "write-through: the tenant did not store an accepted create; removed its host mirror");
        }
    }

    /// Deletes the host mirror `host_name`, pinned to `pin` or, without one, to the
    /// state a read finds, while `still_this_write` holds of that state. A conflict
    /// (the mirror changed since the pin) reads it again: [`ROLLBACK_ATTEMPTS`]
    /// deletes in all, and a last read after the last conflict, so that a mirror a
    /// later write took over meanwhile is not reported as a failed rollback. Each
    /// read and each delete is bounded by `timeout`, so a host that stops answering
    /// cannot hold the object's key. A failure is counted and logged here; `true`
    /// when the mirror was deleted.
    async fn delete_mirror(
        &self,
        ty: &ResolvedType,
        key: &Key,
        host_name: &str,
        pin: Option<Preconditions>,
        still_this_write: impl Fn(&DynamicObject) -> bool,
    ) -> bool {
        let api = self.host_api(ty);
        let read_pin = || self.mirror_pin(ty, key, &api, host_name, &still_this_write);
        let Some(mut pin) = (match pin {
            Some(pin) => Some(pin),
            None => read_pin().await,
        }) else {
            return false;
        };
        for _ in 0..ROLLBACK_ATTEMPTS {
            let params = DeleteParams {
                preconditions: Some(pin),
                ..DeleteParams::default()
            };
            let error =
                match tokio::time::timeout(self.timeout, api.delete(host_name, &params)).await {
                    Ok(Ok(_)) => return true,
                    // Gone already, or another incarnation: nothing of this write is left.
                    Ok(Err(e)) if crate::to_host::is_code(&e, 404) => return false,
                    // Changed since the pin: read again.
                    Ok(Err(e)) if crate::to_host::is_code(&e, 409) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some("timed out".to_string()),
                };
            if let Some(error) = error {
                self.rollback_failed(ty, key, RollbackStep::Delete, &error);
                return false;
            }
            pin = match read_pin().await {
                Some(pin) => pin,
                None => return false,
            };
        }
        // Still this write after a conflict on every attempt. Not worded "gave
        // up": operators read that as a tenant-side rollback failure, and this one
        // is on the host.
        let error = format!("still conflicting after {ROLLBACK_ATTEMPTS} attempts");
        self.rollback_failed(ty, key, RollbackStep::Delete, &error);
        false
    }

    /// The state of host mirror `host_name` to pin a rollback's delete to, read
    /// live. `None` when nothing of this write is there (gone, or taken over by a
    /// later write: never undone), or when the read failed (counted and logged).
    async fn mirror_pin(
        &self,
        ty: &ResolvedType,
        key: &Key,
        api: &Api<DynamicObject>,
        host_name: &str,
        still_this_write: &impl Fn(&DynamicObject) -> bool,
    ) -> Option<Preconditions> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        match read_live(api, host_name, deadline).await {
            Ok(Some(mirror)) if still_this_write(&mirror) => Some(Preconditions {
                uid: mirror.metadata.uid,
                resource_version: mirror.metadata.resource_version,
            }),
            Ok(_) => None,
            Err(error) => {
                self.rollback_failed(ty, key, RollbackStep::Lookup, &error);
                None
            }
        }
    }

    /// Whether the tenant holds the object at `key` with `uid`, read live (bounded by
    /// `timeout`).
    async fn tenant_holds(&self, ty: &ResolvedType, key: &Key, uid: &str) -> Result<bool, String> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let live = self.tenant_live(ty, key, deadline).await?;
        Ok(live.is_some_and(|o| o.metadata.uid.as_deref() == Some(uid)))
    }

    /// The tenant object at `key`, read live (a consistent read) by `deadline`.
    async fn tenant_live(
        &self,
        ty: &ResolvedType,
        key: &Key,
        deadline: tokio::time::Instant,
    ) -> Result<Option<DynamicObject>, String> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.tenant_client.clone(), &key.namespace, &ty.api);
        read_live(&api, &key.name, deadline).await
    }

    /// After a host write of `request` whose outcome is unknown (no answer, a 5xx,
    /// an answer that cannot be read): if the mirror of this very tenant object (by
    /// uid) exists, a create reached the host and is removed; the tenant request
    /// was denied, so no tenant object will ever claim it. Then `key` is free.
    fn spawn_cleanup_unknown(
        self: &Arc<Self>,
        ty: &ResolvedType,
        gate: &Arc<Gate>,
        key: Key,
        request: &Review,
    ) {
        let this = Arc::clone(self);
        let ty = ty.clone();
        let gate = Arc::clone(gate);
        let uid = meta(&request.object, "uid").to_owned();
        let create = request.operation == "CREATE";
        tokio::spawn(async move {
            if create {
                this.cleanup_unknown(&ty, &key, &uid).await;
            }
            // An update's mirror is set back by the syncer from the tenant object.
            gate.release(&key);
        });
    }

    /// After a create the tenant was told failed but the host may have stored:
    /// removes the mirror that carries the create's tenant uid, pinned to the state
    /// read; a conflict reads it again, [`ROLLBACK_ATTEMPTS`] times in all. (The
    /// syncer would collect it too, after its own live read; this does it at once.)
    async fn cleanup_unknown(&self, ty: &ResolvedType, key: &Key, uid: &str) {
        let host_name = names::host_name(&key.name, &key.namespace, &self.tenant);
        // A mirror carrying the uid of a create the tenant never stored is this
        // write's leftover, whatever changed on it since (a host controller's
        // status, say).
        let carries_the_uid = |mirror: &DynamicObject| {
            mirror
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(names::OBJECT_UID))
                .map(String::as_str)
                == Some(uid)
        };
        self.delete_mirror(ty, key, &host_name, None, carries_the_uid)
            .await;
    }

    /// Counts a rollback that did not finish and logs it in the words the spec's
    /// troubleshooting matches.
    fn rollback_failed(&self, ty: &ResolvedType, key: &Key, step: RollbackStep, error: &str) {
        self.metrics
            .rollback_failed(&ty.resource.key, step.reason());
        let object = format!("{}/{}", key.namespace, key.name);
        match step {
            RollbackStep::Delete => {
                tracing::error!(resource = %ty.resource.key, object, error, "write-through: rollback host delete failed")
            }
            RollbackStep::Lookup => {
                tracing::error!(resource = %ty.resource.key, object, error, "write-through: rollback cannot tell whether the object reached the host")
            }
        }
    }
}

/// `name` read from `api` by `deadline` (a consistent read); an error or the
/// deadline is a message for the rollback's log.
async fn read_live(
    api: &Api<DynamicObject>,
    name: &str,
    deadline: tokio::time::Instant,
) -> Result<Option<DynamicObject>, String> {
    match tokio::time::timeout_at(deadline, api.get_opt(name)).await {
        Ok(found) => found.map_err(|e| e.to_string()),
        Err(_) => Err("timed out".into()),
    }
}

/// Kubernetes' reason for an HTTP code, for a host answer that had none.
fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Gone",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// The step of a rollback that failed: its `reason` label and its log message.
#[derive(Debug, Clone, Copy)]
enum RollbackStep {
    /// Reading the host or the tenant failed: whether the write is there is unknown.
    Lookup,
    /// The host's delete of the mirror failed.
    Delete,
}

impl RollbackStep {
    fn reason(self) -> &'static str {
        match self {
            RollbackStep::Lookup => "host_lookup",
            RollbackStep::Delete => "host_delete",
        }
    }
}

/// What an accepted write left on the host.
struct Written {
    name: String,
    uid: String,
    resource_version: String,
    object: Value,
    created: bool,
}

impl Written {
    fn of(object: &DynamicObject, created: bool) -> Result<Written, HostError> {
        Ok(Written {
            name: object.metadata.name.clone().unwrap_or_default(),
            uid: object.metadata.uid.clone().unwrap_or_default(),
            resource_version: object.metadata.resource_version.clone().unwrap_or_default(),
            object: serde_json::to_value(object)
                .map_err(|e| HostError::Unparseable(e.to_string()))?,
            created,
        })
    }
}

/// One read-and-write of [`WriteThrough::write`].
enum Attempt {
    Written(Option<Written>),
    /// The replace lost to another host write since the read (409).
    ReplaceConflict(Box<kube::core::Status>),
}

/// How a host write failed.
enum HostError {
    /// The host answered with a Status.
    Rejected(Box<kube::core::Status>),
    /// The host's answer was not the object it should be.
    Unparseable(String),
    /// The host failed with a body that is not a Status (e.g. an aggregator's 503
    /// while the extension API server is down).
    NotStatus { code: u16, body: String },
    /// No answer (connection, TLS, ...).
    Transport(String),
    /// No answer before the review's deadline (waiting for the key included).
    TimedOut,
}

impl HostError {
    /// Whether the host may have stored a create or replace that failed so, so
    /// that the mirror it may have left must be looked for: when its answer is a
    /// 5xx (kube's 504 says it may still be processing it; a proxy in front
    /// answers 502 or 503 for a request it may have passed on), when the answer
    /// could not be read, and when none came (its connection failed, or the
    /// deadline passed); a 4xx is a refusal. Only asked of a write that went out.
    fn may_have_been_stored(&self) -> bool {
        match self {
            HostError::Rejected(status) => status.code >= 500,
            HostError::NotStatus { code, .. } => *code >= 500,
            HostError::Unparseable(_) | HostError::Transport(_) | HostError::TimedOut => true,
        }
    }
}

/// Whether a host's Status of `code` refuses the object itself (kube's
/// validation, an admission webhook or policy, a conflict), which an operator
/// can look into on the host: any 4xx but a timeout (408) or throttling (429).
/// A 5xx, or a code the answer does not name (0), is a failure on the way or
/// on the host, logged as `response_error`, as an unanswered write is.
fn rejects_the_object(code: u16) -> bool {
    (400..500).contains(&code) && !matches!(code, 408 | 429)
}

impl From<kube::Error> for HostError {
    fn from(e: kube::Error) -> HostError {
        match e {
            // kube-rs's marker for an error body that is not a Status.
            kube::Error::Api(s) if s.reason == "Failed to parse error data" => {
                HostError::NotStatus {
                    code: s.code,
                    body: s.message.trim().to_owned(),
                }
            }
            // kube-rs reads any JSON error body as a Status; one that names no
            // code is no Status (a gateway's), and the HTTP code is lost with it.
            // The host's side failed: a 502 (the tenant's API server would turn a
            // code below 400 into a 400, the caller's fault).
            kube::Error::Api(mut s) if s.code == 0 => {
                s.code = 502;
                // Whatever the body called a reason is not kube's.
                s.reason.clear();
                if s.message.is_empty() {
                    s.message = "the host answered with a JSON body that is no Status".into();
                }
                HostError::Rejected(s)
            }
            kube::Error::Api(s) => HostError::Rejected(s),
            kube::Error::SerdeError(e) => HostError::Unparseable(e.to_string()),
            other => HostError::Transport(other.to_string()),
        }
    }
}

/// Where a webhook server takes reviews: this prefix and a random token of its
/// own ([`WebhookServer::review_path`]). TLS tells the tenant API server who
/// answers, not the webhook who calls, and anything on the network path to the
/// listener (a Service in the tenant) could send a review made up to have
/// crproxy write host objects with its own credentials. Only a reader of the
/// registered configuration knows the path, and whoever may read webhook
/// configurations in the tenant may write the types themselves anyway.
pub const REVIEW_PATH_PREFIX: &str = "/validate/";

/// The `clientConfig` of the write-through webhooks: how the tenant's API server
/// reaches `endpoint` (the listener at `listening` for [`WebhookEndpoint::Listener`])
/// at `review_path`, and the CA it verifies the serving certificate with.
pub fn client_config(
    endpoint: &WebhookEndpoint,
    listening: SocketAddr,
    review_path: &str,
    ca_pem: &str,
) -> Value {
    use base64::Engine;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    match endpoint {
        WebhookEndpoint::Listener => json!({
            "url": format!("https://{listening}{review_path}"),
            "caBundle": ca_bundle,
        }),
        WebhookEndpoint::Url { url, .. } => json!({
            "url": format!("{url}{review_path}"),
            "caBundle": ca_bundle,
        }),
        WebhookEndpoint::Service {
            namespace,
            name,
            port,
        } => json!({
            "service": {"namespace": namespace, "name": name, "port": port, "path": review_path},
            "caBundle": ca_bundle,
        }),
    }
}

/// The ValidatingWebhookConfiguration that sends the tenant's creates and updates of
/// `types` (their main resource only) to the webhook at `client_config`.
pub fn webhook_configuration(tenant: &str, client_config: &Value, types: &[ResolvedType]) -> Value {
    let webhooks: Vec<Value> = types
        .iter()
        .map(|ty| {
            json!({
                // Unique per type (a plural can be served in several groups), and
                // fully qualified: groups of synced types have a dot.
                "name": format!("writethrough.{}.{}", ty.resource.plural, ty.resource.group),
                "clientConfig": client_config,
                "rules": [{
                    "apiGroups": [ty.resource.group],
                    "apiVersions": ["*"],
                    "resources": [ty.resource.plural],
                    "operations": ["CREATE", "UPDATE"],
                    "scope": "Namespaced",
                }],
                "matchPolicy": "Equivalent",
                "sideEffects": "NoneOnDryRun",
                "failurePolicy": "Fail",
                "timeoutSeconds": TIMEOUT.as_secs(),
                "admissionReviewVersions": ["v1"],
            })
        })
        .collect();
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": configuration_name(tenant)},
        "webhooks": webhooks,
    })
}

fn configurations(tenant: &kube::Client) -> Api<DynamicObject> {
    let api_resource = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
        ),
        "validatingwebhookconfigurations",
    );
    Api::all_with(tenant.clone(), &api_resource)
}

/// Creates the configuration in the tenant unless one of that name exists; one
/// that exists (a leader's) gains the webhooks of `configuration` it lacks, so
/// that a type newly written through is never used without one. Those point at
/// this replica, which answers reviews only once it leads: until the leader
/// registers its own, writes of the new type fail closed rather than skip the
/// host's validation. A concurrent replace is read again, three attempts in all.
pub async fn register_if_missing(
    tenant: &kube::Client,
    configuration: &Value,
) -> Result<(), kube::Error> {
    merge_registration(tenant, configuration, with_missing_webhooks).await
}

/// The leader's [`register_if_missing`]: besides the webhooks the configuration
/// lacks, it puts back each of its own that someone changed (an administrator's
/// edit of the address or the failure policy): until it did, the tenant's writes
/// of that type would fail closed, or skip the host's validation. Webhooks of
/// other names, and what the API server defaulted in its own, stay.
pub async fn keep_leaders_registration(
    tenant: &kube::Client,
    configuration: &Value,
) -> Result<(), kube::Error> {
    merge_registration(tenant, configuration, with_leaders_webhooks).await
}

/// Creates `configuration` in the tenant when it is missing, or replaces the one
/// there with what `merge` makes of it and `configuration` when `merge` names the
/// webhooks it changed. A concurrent replace is read again, three attempts in all.
async fn merge_registration(
    tenant: &kube::Client,
    configuration: &Value,
    merge: fn(&mut Value, &Value) -> Option<Vec<String>>,
) -> Result<(), kube::Error> {
    let api = &configurations(tenant);
    let name = meta(configuration, "name");
    let object = |value: Value| -> Result<DynamicObject, kube::Error> {
        serde_json::from_value(value).map_err(kube::Error::SerdeError)
    };
    let write = || async move {
        match api.get_opt(name).await? {
            None => {
                api.create(&PostParams::default(), &object(configuration.clone())?)
                    .await?;
            }
            Some(current) => {
                let mut current =
                    serde_json::to_value(&current).map_err(kube::Error::SerdeError)?;
                let Some(changed) = merge(&mut current, configuration) else {
                    return Ok(());
                };
                tracing::info!(configuration = %name, webhooks = ?changed, "putting write-through webhooks into the tenant's configuration");
                api.replace(name, &PostParams::default(), &object(current)?)
                    .await?;
            }
        }
        Ok(())
    };
    crate::to_host::again_on_conflict(write, |e| crate::to_host::is_code(e, 409)).await
}

/// Adds to the configuration `current` the webhooks of `wanted` it has none of
/// the name of; the names added, `None` when it lacked none.
fn with_missing_webhooks(current: &mut Value, wanted: &Value) -> Option<Vec<String>> {
    let has: HashSet<&str> = webhook_names(current).collect();
    let (added, missing): (Vec<String>, Vec<Value>) = wanted["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| {
            let name = w["name"].as_str().filter(|n| !has.contains(n))?;
            Some((name.to_owned(), w.clone()))
        })
        .unzip();
    if missing.is_empty() {
        return None;
    }
    match current["webhooks"].as_array_mut() {
        Some(webhooks) => webhooks.extend(missing),
        None => current["webhooks"] = Value::Array(missing),
    }
    Some(added)
}

/// [`with_missing_webhooks`], and each webhook of `current` named as one of
/// `wanted` that no longer holds everything `wanted`'s does is replaced by it;
/// the names added or replaced, `None` when none was.
fn with_leaders_webhooks(current: &mut Value, wanted: &Value) -> Option<Vec<String>> {
    let mut changed = Vec::new();
    if let Some(webhooks) = current["webhooks"].as_array_mut() {
        for webhook in webhooks.iter_mut() {
            let name = webhook["name"].as_str().unwrap_or_default();
            let leaders = wanted["webhooks"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|w| w["name"].as_str() == Some(name));
            if let Some(leaders) = leaders.filter(|w| !holds(webhook, w) || narrowed(webhook, w)) {
                changed.push(name.to_owned());
                *webhook = leaders.clone();
            }
        }
    }
    changed.extend(with_missing_webhooks(current, wanted).unwrap_or_default());
    (!changed.is_empty()).then_some(changed)
}

/// The members of a webhook that the leader leaves unset and the API server
/// defaults to "every request": a value there narrows what the webhook is sent
/// (an `objectSelector` no tenant object matches turns write-through off), so it
/// is an edit to undo like a changed URL, which [`holds`] alone would not see.
const NARROWING: [&str; 3] = ["namespaceSelector", "objectSelector", "matchConditions"];

/// Whether `have` sets one of [`NARROWING`]'s members that `want` leaves unset to
/// anything but what matches every request.
fn narrowed(have: &Value, want: &Value) -> bool {
    NARROWING
        .iter()
        .any(|key| want.get(key).is_none() && !matches_everything(&have[*key]))
}

/// Whether a selector or a list of match conditions excludes nothing: absent,
/// empty, or a selector whose every member is empty.
fn matches_everything(value: &Value) -> bool {
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Object(members) => members.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    };
    match value {
        Value::Object(members) => members.values().all(empty),
        other => empty(other),
    }
}

/// Whether `have` holds everything `want` says: every member of an object (with
/// others beside it, such as the API server's defaults), every item of a list of
/// the same length, and equal scalars.
fn holds(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(have), Value::Object(want)) => want
            .iter()
            .all(|(key, want)| have.get(key).is_some_and(|have| holds(have, want))),
        (Value::Array(have), Value::Array(want)) => {
            have.len() == want.len() && have.iter().zip(want).all(|(h, w)| holds(h, w))
        }
        (have, want) => have == want,
    }
}

/// The names of a webhook configuration's webhooks, in order.
pub fn webhook_names(configuration: &Value) -> impl Iterator<Item = &str> {
    configuration["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w["name"].as_str())
}

/// The tenant's write-through configuration (of tenant `tenant_name`), if any.
pub async fn registration(
    tenant: &kube::Client,
    tenant_name: &str,
) -> Result<Option<DynamicObject>, kube::Error> {
    configurations(tenant)
        .get_opt(&configuration_name(tenant_name))
        .await
}

/// Removes the tenant's write-through configuration `current`, as it was read: a
/// registration written since (by a leader elected meanwhile) is left. Its
/// webhooks fail closed: left behind once no type is written through, they point
/// at a listener that no longer answers and every tenant write of the types they
/// name is refused. `true` when it was deleted.
pub async fn retire_read(
    tenant: &kube::Client,
    current: &DynamicObject,
) -> Result<bool, kube::Error> {
    let api = configurations(tenant);
    let name = current.metadata.name.clone().unwrap_or_default();
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: current.metadata.uid.clone(),
            resource_version: current.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &params).await {
        Ok(_) => Ok(true),
        Err(e) if crate::to_host::is_code(&e, 404) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates or replaces the configuration in the tenant.
pub async fn register(tenant: &kube::Client, configuration: &Value) -> Result<(), kube::Error> {
    let api = configurations(tenant);
    let mut object: DynamicObject =
        serde_json::from_value(configuration.clone()).map_err(kube::Error::SerdeError)?;
    let name = meta(configuration, "name");
    match api.get_opt(name).await? {
        Some(current) => {
            object.metadata.resource_version = current.metadata.resource_version;
            api.replace(name, &PostParams::default(), &object).await?;
        }
        None => {
            api.create(&PostParams::default(), &object).await?;
        }
    }
    Ok(())
}

/// The `endpointslice.kubernetes.io/managed-by` value of the leader's EndpointSlice
/// (kube's EndpointSlice controller leaves slices of other managers alone).
pub const SLICE_MANAGER: &str = "crproxy.dev";

/// The EndpointSlice the leader keeps for the write-through Service `service`.
pub fn leader_slice_name(service: &str) -> String {
    format!("{service}-leader")
}

/// Why the leader could not point the write-through Service at itself.
#[derive(Debug, thiserror::Error)]
pub enum LeaderEndpointError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("service {namespace}/{name} has no port {port} (sync.writeThrough.service.port)")]
    NoPort {
        namespace: String,
        name: String,
        port: u16,
    },
}

/// Makes the selector-less Service `namespace/name` lead to this replica only: its
/// EndpointSlice lists `ip` with the webhook's `listen_port` under the name of the
/// Service's port `service_port`. One object that every new leader overwrites, so the
/// Service never sends a review to a standby (which would answer 503, and
/// `failurePolicy: Fail` would turn that into a failed tenant write).
pub async fn publish_leader_endpoint(
    tenant: &kube::Client,
    namespace: &str,
    name: &str,
    service_port: u16,
    ip: std::net::IpAddr,
    listen_port: u16,
) -> Result<(), LeaderEndpointError> {
    let service_resource = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("", "v1", "Service"),
        "services",
    );
    let services: Api<DynamicObject> =
        Api::namespaced_with(tenant.clone(), namespace, &service_resource);
    let service =
        serde_json::to_value(services.get(name).await?).map_err(kube::Error::SerdeError)?;
    let port_name = service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_u64() == Some(u64::from(service_port)))
        .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
        .ok_or_else(|| LeaderEndpointError::NoPort {
            namespace: namespace.into(),
            name: name.into(),
            port: service_port,
        })?;
    let slices = endpoint_slices(tenant, namespace);
    let slice_name = leader_slice_name(name);
    let mut slice = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name,
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER,
            },
        },
        "addressType": if ip.is_ipv4() { "IPv4" } else { "IPv6" },
        "endpoints": [{"addresses": [ip.to_string()], "conditions": {"ready": true}}],
        "ports": [{"name": port_name, "port": listen_port, "protocol": "TCP"}],
    });
    match slices.get_opt(&slice_name).await? {
        Some(current) => {
            slice["metadata"]["resourceVersion"] = json!(current.metadata.resource_version);
            let object: DynamicObject =
                serde_json::from_value(slice).map_err(kube::Error::SerdeError)?;
            slices
                .replace(&slice_name, &PostParams::default(), &object)
                .await?;
        }
        None => {
            let object: DynamicObject =
                serde_json::from_value(slice).map_err(kube::Error::SerdeError)?;
            slices.create(&PostParams::default(), &object).await?;
        }
    }
    Ok(())
}

/// The tenant's EndpointSlices in `namespace`, where the leader's slice lives.
fn endpoint_slices(tenant: &kube::Client, namespace: &str) -> Api<DynamicObject> {
    let resource = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("discovery.k8s.io", "v1", "EndpointSlice"),
        "endpointslices",
    );
    Api::namespaced_with(tenant.clone(), namespace, &resource)
}

/// Takes this replica out of the write-through Service's EndpointSlice when it stops
/// leading, so that reviews fail at once ("no endpoints") instead of waiting for a
/// connection to a replica that is gone. Only a slice that still leads to this very
/// replica (`ip` and `listen_port`) is emptied, and the write is pinned to the
/// resourceVersion read: a successor that already pointed the Service at itself keeps
/// it. Returns whether the slice was emptied.
pub async fn withdraw_leader_endpoint(
    tenant: &kube::Client,
    namespace: &str,
    name: &str,
    ip: std::net::IpAddr,
    listen_port: u16,
) -> Result<bool, kube::Error> {
    let slices = endpoint_slices(tenant, namespace);
    let slice_name = leader_slice_name(name);
    let Some(current) = slices.get_opt(&slice_name).await? else {
        return Ok(false);
    };
    let mut slice = serde_json::to_value(&current).map_err(kube::Error::SerdeError)?;
    let address = ip.to_string();
    let leads_here = slice["endpoints"]
        .as_array()
        .is_some_and(|e| e.len() == 1 && e[0]["addresses"] == json!([address]))
        && slice["ports"]
            .as_array()
            .is_some_and(|p| p.len() == 1 && p[0]["port"] == json!(listen_port));
    if !leads_here {
        return Ok(false);
    }
    slice["endpoints"] = json!([]);
    let object: DynamicObject = serde_json::from_value(slice).map_err(kube::Error::SerdeError)?;
    // The object carries the resourceVersion read: a successor's write in between
    // makes this a 409, and the successor's endpoint stays.
    match slices
        .replace(&slice_name, &PostParams::default(), &object)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if crate::to_host::is_code(&e, 409) || crate::to_host::is_code(&e, 404) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Why the webhook server could not start.
#[derive(Debug, thiserror::Error)]
pub enum WebhookServerError {
    #[error("write-through webhook certificate: {0}")]
    Pki(#[from] crproxy_core::pki::PkiError),
    #[error("write-through webhook TLS: {0}")]
    Tls(String),
    #[error("write-through webhook listener {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The running webhook server: TLS with its own CA, `POST /validate/<token>`.
pub struct WebhookServer {
    pub addr: SocketAddr,
    /// The CA of its serving certificate (the configuration's `caBundle`).
    pub ca_pem: String,
    /// The one path it takes reviews on: [`REVIEW_PATH_PREFIX`] and a token of
    /// 128 random bits.
    pub review_path: String,
    stop: watch::Sender<bool>,
}

impl WebhookServer {
    /// Listens on `bind` with a certificate for `hosts` (names or IP addresses), and
    /// 127.0.0.1 and localhost.
    pub async fn start(
        bind: SocketAddr,
        hosts: &[String],
        write_through: Arc<WriteThrough>,
    ) -> Result<WebhookServer, WebhookServerError> {
        let ca = CertificateAuthority::generate("crproxy-writethrough-ca")?;
        let mut names: Vec<&str> = vec!["localhost"];
        let mut ips = vec![std::net::IpAddr::from([127, 0, 0, 1])];
        for h in hosts {
            match h.parse() {
                Ok(ip) => ips.push(ip),
                Err(_) => names.push(h),
            }
        }
        let serving = ca.issue_server(&names, &ips)?;
        let tls = |e: &dyn std::fmt::Display| WebhookServerError::Tls(e.to_string());
        let chain = CertificateDer::pem_slice_iter(serving.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls(&e))?;
        let key = PrivateKeyDer::from_pem_slice(serving.key.as_bytes()).map_err(|e| tls(&e))?;
        let provider = Arc::new(crproxy_kube::crypto_provider());
        let mut token = [0u8; 16];
        provider
            .secure_random
            .fill(&mut token)
            .map_err(|e| tls(&format!("{e:?}")))?;
        let token: String = token.iter().map(|byte| format!("{byte:02x}")).collect();
        let review_path = format!("{REVIEW_PATH_PREFIX}{token}");
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls(&e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| tls(&e))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|source| WebhookServerError::Bind { addr: bind, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| WebhookServerError::Bind { addr: bind, source })?;
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(crproxy_serve::serve_tls(
            listener,
            acceptor,
            {
                let review_path = review_path.clone();
                move |request| {
                    let wt = Arc::clone(&write_through);
                    let review_path = review_path.clone();
                    async move { handle(&wt, &review_path, request).await }
                }
            },
            stopped,
        ));
        Ok(WebhookServer {
            addr,
            ca_pem: ca.pem().cert.clone(),
            review_path,
            stop,
        })
    }

    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether `path` is the server's review path. Compared in constant time: its
/// token is a secret, and how long the comparison of a guess takes must not tell
/// how many of its first characters were right.
fn is_review_path(path: &str, review_path: &str) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(path.as_bytes().ct_eq(review_path.as_bytes()))
}

/// The largest AdmissionReview accepted (kube's own request limit is 3 MiB; a review
/// carries the object twice).
const MAX_BODY: usize = 8 << 20;

async fn handle(
    wt: &Arc<WriteThrough>,
    review_path: &str,
    request: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let reply = |code: StatusCode, body: Value| {
        let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
        *r.status_mut() = code;
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        r
    };
    let status = |code: StatusCode, reason: &str, message: &str| {
        json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
               "code": code.as_u16(), "reason": reason, "message": message})
    };
    // Any other path, `/validate` itself included, is not this server's: a
    // review sent there was not sent by the tenant API server it registered with.
    if request.method() != Method::POST || !is_review_path(request.uri().path(), review_path) {
        return reply(
            StatusCode::NOT_FOUND,
            status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the write-through webhook serves POST at the path its configuration names",
            ),
        );
    }
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return reply(
                StatusCode::BAD_REQUEST,
                status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("reading the request body: {e}"),
                ),
            )
        }
    };
    let Ok(review) = serde_json::from_slice::<Value>(&body) else {
        return reply(
            StatusCode::BAD_REQUEST,
            status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "the body is not JSON",
            ),
        );
    };
    match wt.admit(review).await {
        Some(response) => reply(StatusCode::OK, response),
        None => reply(
            StatusCode::BAD_REQUEST,
            status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "the body is not an AdmissionReview request with a uid",
            ),
        ),
    }
}

#[cfg(test)]
mod tests;
