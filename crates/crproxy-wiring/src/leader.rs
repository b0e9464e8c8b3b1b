//! Leader election on a `coordination.k8s.io/v1` Lease in the client cluster.
//!
//! The algorithm is client-go's: read the Lease, and write it back (PUT carrying the
//! `resourceVersion` just read, so of two concurrent writers exactly one wins with the
//! other getting 409) when it is free, ours, or expired. Expiry is judged on this
//! process's monotonic clock: a Lease is expired when its record has not changed for
//! `leaseDurationSeconds` since *we first observed* that record, so clock skew between
//! replicas does not matter. `renewTime`/`acquireTime` are written for humans.
//!
//! Safety argument: a leader counts its term from the instant it *sent* the successful
//! write and steps down `lease_duration` (minus a small margin) later unless it
//! renewed; any other replica
//! timestamps a record when its GET *returns*, which is no earlier than the write, so
//! it cannot take over before the old leader has stepped down.

use crate::objects::Objects;
use chrono::{DateTime, Utc};
use crproxy_core::locks;
use crproxy_kube::Error;
use serde_json::{json, Value};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Where the Lease lives and how this replica uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's `holderIdentity`; unique per process (see [`default_identity`]).
    pub identity: String,
    /// How long a record stays valid without renewal (`leaseDurationSeconds`, whole
    /// seconds on the wire, at least 1).
    pub lease_duration: Duration,
    /// How often the leader renews. Capped at half of `lease_duration`.
    pub renew_interval: Duration,
    /// How often a non-leader (or a leader whose renewal failed) tries again.
    pub retry_interval: Duration,
}

impl LeaseConfig {
    /// Defaults as in client-go: 15 s lease, renew every 5 s, retry every 2 s.
    pub fn new(namespace: &str, name: &str, identity: &str) -> LeaseConfig {
        LeaseConfig {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
            retry_interval: Duration::from_secs(2),
        }
    }

    fn duration_seconds(&self) -> u64 {
        self.lease_duration.as_secs().max(1)
    }

    /// Upper bound for one read-modify-write, so a hanging API server cannot keep the
    /// loop from stepping down in time.
    fn attempt_timeout(&self) -> Duration {
        (self.lease_duration / 3).max(Duration::from_millis(100))
    }

    /// How long a leader may act on one successful write: the lease minus a margin
    /// (a tenth, at most 1 s) for timer lateness and clock-rate differences between
    /// replicas, so it stops strictly before anyone else may start.
    fn term(&self) -> Duration {
        self.lease_duration - (self.lease_duration / 10).min(Duration::from_secs(1))
    }
}

/// A unique holder identity: `$POD_NAME` (or `$HOSTNAME`) plus a random suffix, so a
/// restarted pod with the same name is a new holder.
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "crproxy".to_owned());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

/// Formats a time as a Kubernetes MicroTime: `2024-01-01T00:00:00.000000Z`.
pub fn micro_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// Read and write access to the one Lease object. The elector is written against this
/// so its state machine can be tested under paused time with an in-memory store.
pub(crate) trait LeaseStore: Send + Sync + 'static {
    /// The Lease, or `None` when it does not exist.
    fn get(&self) -> impl Future<Output = Result<Option<Value>, Error>> + Send;
    /// POST; `AlreadyExists` when another replica created it first.
    fn create(&self, lease: Value) -> impl Future<Output = Result<Value, Error>> + Send;
    /// PUT with the `resourceVersion` inside `lease`; `Conflict` when stale.
    fn replace(&self, lease: Value) -> impl Future<Output = Result<Value, Error>> + Send;
}

/// [`LeaseStore`] over the Kubernetes API.
struct KubeLeases {
    leases: Objects,
    name: String,
}

impl KubeLeases {
    fn new(client: kube::Client, cfg: &LeaseConfig) -> Self {
        KubeLeases {
            leases: Objects::new(
                client,
                "coordination.k8s.io",
                "v1",
                "Lease",
                "leases",
                Some(&cfg.namespace),
            ),
            name: cfg.name.clone(),
        }
    }
}

impl LeaseStore for KubeLeases {
    async fn get(&self) -> Result<Option<Value>, Error> {
        self.leases.get(&self.name).await
    }

    async fn create(&self, lease: Value) -> Result<Value, Error> {
        self.leases.create(&lease).await
    }

    async fn replace(&self, lease: Value) -> Result<Value, Error> {
        self.leases.replace(&self.name, &lease).await
    }
}

/// Starts leader election tasks.
pub struct LeaderElector;

impl LeaderElector {
    /// Spawns the election loop for `cfg` on the current tokio runtime. The replica
    /// starts as a follower; watch [`LeaderHandle::changes`] for the outcome.
    pub fn spawn(client: kube::Client, cfg: LeaseConfig) -> LeaderHandle {
        let store = KubeLeases::new(client, &cfg);
        Self::spawn_with(store, cfg)
    }

    pub(crate) fn spawn_with<S: LeaseStore>(store: S, mut cfg: LeaseConfig) -> LeaderHandle {
        // Renewing no more often than the lease lasts would lose the lease between
        // renewals; keep at least two renewals per lease duration.
        let max_renew = cfg.lease_duration / 2;
        if cfg.renew_interval > max_renew {
            tracing::warn!(renew_interval = ?cfg.renew_interval, lease_duration = ?cfg.lease_duration, "renew interval too long for the lease duration, using half the duration");
            cfg.renew_interval = max_renew;
        }
        let (leader_tx, leader_rx) = Leadership::channel(false);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let elector = Elector {
            store,
            cfg,
            observer: LeaseObserver::default(),
            last_renew: None,
            leader_tx,
        };
        let task = tokio::spawn(elector.run(shutdown_rx));
        LeaderHandle {
            shared: Arc::new(Shared {
                shutdown: shutdown_tx,
                leader: leader_rx,
                _fixed: None,
                task: Mutex::new(Some(task)),
            }),
        }
    }
}

/// The sending side of a leadership channel. Dropping it publishes `false` before
/// the channel closes, however its owner ends (released, aborted, or a panic), so a
/// closed channel always reads "not leading": a consumer that waits for leadership
/// to go sees it go, and one that waits for it to come gets the closed channel's
/// error instead of a stale "leading" to start over from.
pub struct Leadership(watch::Sender<bool>);

impl Leadership {
    /// A new channel whose value starts as `is_leader`.
    pub fn channel(is_leader: bool) -> (Leadership, LeadershipChanges) {
        let (tx, rx) = watch::channel(is_leader);
        (Leadership(tx), LeadershipChanges(rx))
    }

    /// Publishes `leader`, waking the receivers only when it changes.
    pub fn set(&self, leader: bool) {
        self.0.send_if_modified(|cur| {
            let changed = *cur != leader;
            *cur = leader;
            changed
        });
    }

    /// The value last published.
    pub fn get(&self) -> bool {
        *self.0.borrow()
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// The receiving side of a leadership channel, which only a [`Leadership`]
/// makes: once it is closed, it reads "not leading" (so waiting for leadership
/// to come ends in an error, never in a stale "leading").
#[derive(Clone)]
pub struct LeadershipChanges(watch::Receiver<bool>);

/// The election has ended: no more changes will come.
#[derive(Debug, thiserror::Error)]
#[error("the leader election has ended")]
pub struct ElectionEnded;

impl LeadershipChanges {
    /// Whether this replica leads now, leaving the value unseen.
    pub fn now(&self) -> bool {
        *self.0.borrow()
    }

    /// Whether this replica leads now; the value counts as seen for
    /// [`LeadershipChanges::changed`].
    pub fn leading(&mut self) -> bool {
        *self.0.borrow_and_update()
    }

    /// Waits for a value not seen yet.
    pub async fn changed(&mut self) -> Result<(), ElectionEnded> {
        self.0.changed().await.map_err(|_| ElectionEnded)
    }

    /// Waits until leadership is `leading` (at once when it is now).
    pub async fn wait_until(&mut self, leading: bool) -> Result<(), ElectionEnded> {
        self.0
            .wait_for(|l| *l == leading)
            .await
            .map(|_| ())
            .map_err(|_| ElectionEnded)
    }
}

/// Observes and ends one election loop. Clones share the loop; when the last clone is
/// dropped the loop releases the Lease and ends, as [`LeaderHandle::release`] does.
#[derive(Clone)]
pub struct LeaderHandle {
    shared: Arc<Shared>,
}

struct Shared {
    shutdown: watch::Sender<bool>,
    leader: LeadershipChanges,
    /// Keeps the sender of a [`LeaderHandle::fixed`] handle alive.
    _fixed: Option<Leadership>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for LeaderHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderHandle")
            .field("is_leader", &self.is_leader())
            .finish()
    }
}

impl LeaderHandle {
    /// A handle with fixed leadership and no election, for single-replica setups and
    /// tests: `fixed(true)` always leads.
    pub fn fixed(is_leader: bool) -> LeaderHandle {
        let (tx, rx) = Leadership::channel(is_leader);
        Self::without_election(rx, Some(tx))
    }

    /// A handle on `leader` with no election loop; `keep` holds the channel's
    /// sender when nobody else does.
    fn without_election(leader: LeadershipChanges, keep: Option<Leadership>) -> LeaderHandle {
        let (shutdown, _) = watch::channel(false);
        LeaderHandle {
            shared: Arc::new(Shared {
                shutdown,
                leader,
                _fixed: keep,
                task: Mutex::new(None),
            }),
        }
    }

    /// A handle whose leadership the test sets through the returned sender (no
    /// election).
    #[cfg(test)]
    pub(crate) fn manual(is_leader: bool) -> (LeaderHandle, Leadership) {
        let (tx, rx) = Leadership::channel(is_leader);
        (Self::without_election(rx, None), tx)
    }

    /// Whether this replica currently leads.
    pub fn is_leader(&self) -> bool {
        self.shared.leader.now()
    }

    /// Leadership as it changes. The channel closes when the election loop ends,
    /// at "not leading" (see [`Leadership`]).
    pub fn changes(&self) -> LeadershipChanges {
        self.shared.leader.clone()
    }

    /// Steps down and, if this replica held the Lease, clears its `holderIdentity` so
    /// another replica takes over at its next retry instead of waiting for expiry.
    /// Returns when the loop has ended.
    pub async fn release(self) {
        let _ = self.shared.shutdown.send(true);
        let task = locks::lock(&self.shared.task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// Stops the loop at once without touching the Lease, as a crashed process would:
    /// the others take over only once the Lease expires. For tests and emergencies.
    pub fn abort(self) {
        let task = locks::lock(&self.shared.task).take();
        if let Some(task) = task {
            task.abort();
        }
    }
}

/// What this process has seen of a Lease, to judge whether its holder is alive
/// as client-go's elector does: on this process's clock alone. A record that has
/// not changed for its own `leaseDurationSeconds` since we first read it as it
/// is has expired; `renewTime` is never compared with our clock, so skew between
/// nodes does not matter. The elector and a replica that only watches who leads
/// (see crproxy-sync) judge with the same observer.
#[derive(Debug, Default)]
pub struct LeaseObserver {
    /// The Lease's spec last read, and when it was first read as it is.
    observed: Option<(Value, Instant)>,
}

impl LeaseObserver {
    /// Records the Lease `lease` (`None`: there is none) as read at `at`. An
    /// unchanged spec keeps the time it was first read.
    pub fn observe(&mut self, lease: Option<&Value>, at: Instant) {
        let Some(lease) = lease else {
            self.observed = None;
            return;
        };
        let spec = lease.get("spec").unwrap_or(&Value::Null);
        match &self.observed {
            Some((seen, _)) if seen == spec => {}
            _ => self.observed = Some((spec.clone(), at)),
        }
    }

    /// The holder of the Lease last observed while its record still moves by
    /// `now`: `None` when there is no Lease, its holder is empty (released), or
    /// its record stood still for its duration (`fallback` when it names none).
    pub fn live_holder(&self, fallback: Duration, now: Instant) -> Option<&str> {
        let (spec, first_read) = self.observed.as_ref()?;
        let holder = spec
            .get("holderIdentity")
            .and_then(Value::as_str)
            .filter(|h| !h.is_empty())?;
        let duration = spec
            .get("leaseDurationSeconds")
            .and_then(Value::as_u64)
            .filter(|s| *s > 0)
            .map(Duration::from_secs)
            .unwrap_or(fallback);
        (now < *first_read + duration).then_some(holder)
    }
}

enum Attempt {
    /// We hold the Lease now.
    Holding,
    /// Another live holder has it.
    HeldByOther,
    /// Someone wrote between our read and our write.
    LostRace,
}

struct Elector<S> {
    store: S,
    cfg: LeaseConfig,
    observer: LeaseObserver,
    /// While leading: when the last successful write was sent.
    last_renew: Option<Instant>,
    leader_tx: Leadership,
}

impl<S: LeaseStore> Elector<S> {
    async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let lease = format!("{}/{}", self.cfg.namespace, self.cfg.name);
        loop {
            if *shutdown.borrow() {
                break;
            }
            if let Some(deadline) = self.deadline() {
                if Instant::now() >= deadline {
                    tracing::warn!(%lease, identity = %self.cfg.identity, "could not renew the leader lease in time, stepping down");
                    self.set_leader(false);
                }
            }
            let started = Instant::now();
            let mut limit = started + self.cfg.attempt_timeout();
            if let Some(deadline) = self.deadline() {
                limit = limit.min(deadline);
            }
            let outcome = tokio::select! {
                r = tokio::time::timeout_at(limit, self.attempt()) => r,
                _ = shutdown.changed() => break,
            };
            let healthy = match outcome {
                Ok(Ok(Attempt::Holding)) => {
                    self.last_renew = Some(started);
                    if !self.is_leader() {
                        tracing::info!(%lease, identity = %self.cfg.identity, "acquired the leader lease");
                    }
                    self.set_leader(true);
                    true
                }
                Ok(Ok(Attempt::HeldByOther)) => {
                    if self.is_leader() {
                        tracing::warn!(%lease, identity = %self.cfg.identity, "another replica holds the leader lease, stepping down");
                    }
                    self.set_leader(false);
                    true
                }
                Ok(Ok(Attempt::LostRace)) => {
                    tracing::debug!(%lease, "leader lease changed while writing it, retrying");
                    false
                }
                Ok(Err(e)) => {
                    tracing::warn!(%lease, error = %e, "leader lease request failed");
                    false
                }
                Err(_) => {
                    tracing::warn!(%lease, "leader lease request timed out");
                    false
                }
            };
            let wait = if self.is_leader() && healthy {
                self.cfg.renew_interval
            } else {
                self.cfg.retry_interval
            };
            let mut wake = Instant::now() + wait;
            if let Some(deadline) = self.deadline() {
                // Wake at the deadline at the latest, so a failing leader steps down on
                // time rather than up to one interval late.
                wake = wake.min(deadline);
            }
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => {}
                _ = shutdown.changed() => break,
            }
        }
        self.release().await;
    }

    fn is_leader(&self) -> bool {
        self.leader_tx.get()
    }

    fn set_leader(&mut self, leader: bool) {
        if !leader {
            self.last_renew = None;
        }
        self.leader_tx.set(leader);
    }

    fn deadline(&self) -> Option<Instant> {
        if !self.is_leader() {
            return None;
        }
        self.last_renew.map(|t| t + self.cfg.term())
    }

    async fn attempt(&mut self) -> Result<Attempt, Error> {
        let started = Instant::now();
        let now = micro_time(Utc::now());
        let Some(current) = self.store.get().await? else {
            let lease = json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.cfg.name, "namespace": self.cfg.namespace},
                "spec": {
                    "holderIdentity": self.cfg.identity,
                    "leaseDurationSeconds": self.cfg.duration_seconds(),
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            });
            return match self.store.create(lease).await {
                Ok(created) => {
                    self.observer.observe(Some(&created), started);
                    Ok(Attempt::Holding)
                }
                Err(e) if e.is_already_exists() || e.is_conflict() => Ok(Attempt::LostRace),
                Err(e) => Err(e),
            };
        };
        // Observed when the answer arrived, not when we asked: the record may have been
        // written after our request left, and counting from before that write would
        // let us take over before its writer's term ends.
        self.observer.observe(Some(&current), Instant::now());
        let mine = current["spec"]["holderIdentity"].as_str() == Some(&self.cfg.identity);
        let held_by_other = self
            .observer
            .live_holder(self.cfg.lease_duration, Instant::now())
            .is_some_and(|holder| holder != self.cfg.identity);
        if held_by_other {
            return Ok(Attempt::HeldByOther);
        }
        let transitions = current["spec"]
            .get("leaseTransitions")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let mut next = current;
        if !next.get("spec").is_some_and(Value::is_object) {
            next["spec"] = json!({});
        }
        let s = &mut next["spec"];
        s["holderIdentity"] = json!(self.cfg.identity);
        s["leaseDurationSeconds"] = json!(self.cfg.duration_seconds());
        s["renewTime"] = json!(now);
        if !mine {
            s["acquireTime"] = json!(now);
            s["leaseTransitions"] = json!(transitions + 1);
        }
        match self.store.replace(next).await {
            Ok(updated) => {
                self.observer.observe(Some(&updated), started);
                Ok(Attempt::Holding)
            }
            Err(e) if e.is_conflict() => Ok(Attempt::LostRace),
            Err(e) => Err(e),
        }
    }

    /// Steps down and gives the Lease back if we still hold it.
    async fn release(&mut self) {
        let was_leader = self.is_leader();
        self.set_leader(false);
        if !was_leader {
            return;
        }
        let lease = format!("{}/{}", self.cfg.namespace, self.cfg.name);
        let result = tokio::time::timeout(self.cfg.attempt_timeout(), async {
            let Some(mut current) = self.store.get().await? else {
                return Ok(false);
            };
            if current["spec"]["holderIdentity"].as_str() != Some(&self.cfg.identity) {
                return Ok(false);
            }
            let now = json!(micro_time(Utc::now()));
            let s = &mut current["spec"];
            // As client-go: an empty holder lets the next retry take over at once.
            s["holderIdentity"] = json!("");
            s["leaseDurationSeconds"] = json!(1);
            s["renewTime"] = now.clone();
            s["acquireTime"] = now;
            self.store.replace(current).await.map(|_| true)
        })
        .await;
        match result {
            Ok(Ok(true)) => {
                tracing::info!(%lease, identity = %self.cfg.identity, "released the leader lease")
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(%lease, error = %e, "could not release the leader lease; it expires on its own")
            }
            Err(_) => {
                tracing::warn!(%lease, "releasing the leader lease timed out; it expires on its own")
            }
        }
    }
}

#[cfg(test)]
mod tests;
